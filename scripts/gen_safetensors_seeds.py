#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors fuzzer
(fuzz/corpus/safetensors/): small valid files of each float dtype, with
metadata, several tensors and an empty one, and the malformed kinds the
reader must refuse (bad header length, offsets out of range or
overlapping, dtype/shape disagreeing with the byte count). No dependencies.
Usage: python3 scripts/gen_safetensors_seeds.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus",
                   "safetensors")


def st(header, data, hlen=None):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def main():
    os.makedirs(OUT, exist_ok=True)
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)
    seeds = {
        "f32": st({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, f32),
        "f16_bf16_meta": st({"__metadata__": {"format": "pt"},
                             "a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
                             "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]},
                             "e": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]}},
                            bytes(range(16))),
        "i64": st({"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}, bytes(16)),
        "bad_hlen": st({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(4),
                       hlen=1 << 40),
        "out_of_range": st({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                           bytes(8)),
        "overlap": st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
        "shape_mismatch": st({"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}},
                             bytes(8)),
        "bad_dtype": st({"w": {"dtype": "F8_E9", "shape": [1], "data_offsets": [0, 1]}},
                        bytes(1)),
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {OUT}")


if __name__ == "__main__":
    main()
