#!/usr/bin/env python3
"""Writes the seed corpus of the GGUF fuzzer (fuzz/corpus/gguf/): small valid
GGUF files covering every metadata type, nested arrays and a few tensor
types, plus truncated and corrupted copies of them. Uses only the standard
library (struct), so it is an independent writer from cellm's own.

Usage: python3 scripts/gen_fuzz_seeds.py [OUT_DIR]
"""
import os
import random
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
       BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(value(et, x) for x in items)
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors, align=32, version=3):
    """kvs: [(key, type, value)]; tensors: [(name, dims, type, nbytes)]."""
    out = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += s(key) + struct.pack("<I", t) + value(t, v)
    offset, blobs = 0, []
    for name, dims, ttype, nbytes in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        blob = bytes((i * 7 + 3) & 0xFF for i in range(nbytes))
        blob += b"\0" * ((-nbytes) % align)
        blobs.append(blob)
        offset += len(blob)
    out += b"\0" * ((-len(out)) % align)
    return out + b"".join(blobs)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "fuzz", "corpus", "gguf")
    os.makedirs(out_dir, exist_ok=True)
    every = [("t.u8", U8, 7), ("t.i8", I8, -7), ("t.u16", U16, 700), ("t.i16", I16, -700),
             ("t.u32", U32, 70000), ("t.i32", I32, -70000), ("t.f32", F32, 1.5),
             ("t.bool", BOOL, True), ("t.str", STR, "hello"), ("t.u64", U64, 1 << 40),
             ("t.i64", I64, -(1 << 40)), ("t.f64", F64, 2.5),
             ("t.arr", ARR, (I32, [1, -2, 3])), ("t.strs", ARR, (STR, ["a", "", "bc"])),
             ("t.nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x"])]))]
    model = [("general.architecture", STR, "llama"), ("llama.block_count", U32, 1),
             ("llama.context_length", U32, 128), ("llama.embedding_length", U32, 32),
             ("tokenizer.ggml.model", STR, "gpt2"),
             ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b", "ab"])),
             ("tokenizer.ggml.merges", ARR, (STR, ["a b"]))]
    seeds = {
        "every_type.gguf": gguf(every, []),
        "tensors.gguf": gguf(every[:3], [("a", [32], 0, 128), ("b", [32, 2], 2, 36),
                                         ("c", [256], 12, 144), ("d", [4], 1, 8)]),
        "model_like.gguf": gguf(model, [("token_embd.weight", [32, 3], 8, 102)]),
        "align64.gguf": gguf([("general.alignment", U32, 64)], [("a", [16], 0, 64)], align=64),
        "v2.gguf": gguf(every[:4], [("a", [8], 0, 32)], version=2),
        "empty.gguf": gguf([], []),
    }
    rnd = random.Random(1234)
    for name, data in list(seeds.items()):
        for cut in (len(data) // 3, len(data) // 2, len(data) - 1):
            seeds[f"{name}.cut{cut}"] = data[:cut]
        for k in range(2):
            b = bytearray(data)
            pos = rnd.randrange(min(len(b), 200))
            b[pos] ^= 0xFF
            seeds[f"{name}.flip{k}"] = bytes(b)
    for name, data in seeds.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {out_dir}")


if __name__ == "__main__":
    main()
