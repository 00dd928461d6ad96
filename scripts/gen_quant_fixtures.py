#!/usr/bin/env python3
"""Writes the quant-format fixtures under tests/data/quant/.

tests/test_quant.c checks cellm's kernels against these, bit for bit, so
the tests need no Python. The expected values come from the `gguf` Python
package (gguf.quants), an implementation of GGML's block layouts that is
independent of ours:

  <TYPE>.deq.bin  random blocks (random bytes, scale fields set to finite
                  F16 values) and what gguf.quants.dequantize makes of them
  <TYPE>.q.bin    random floats (with edge cases) and the bytes
                  gguf.quants.quantize makes of them, for the types whose
                  reference quantizer gguf implements exactly as GGML does

File layout (little-endian): b"CQFX", u32 kind (0 = dequantize, 1 =
quantize), u32 GGML type id, u32 element count n; then for kind 0 the
blocks followed by n float32, for kind 1 n float32 followed by the blocks.

Q8_K has no dequantizer in gguf (it is an activation format, never in
files); its expected values are computed here as d * q.

Run from the repository root: python3 scripts/gen_quant_fixtures.py
The seed is fixed, so the output only changes when this script does.
"""

import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240611
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")

# Byte offsets of the F16 scale fields in each block, so random blocks get
# finite scales (NaN arithmetic is not what these tests are about).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0],
}
N_BLOCKS = {256: 6, 32: 24}  # keeps every file a few KiB


def write(name, kind, qtype, n, first, second):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(b"CQFX" + struct.pack("<III", kind, int(qtype), n))
        f.write(np.ascontiguousarray(first).tobytes())
        f.write(np.ascontiguousarray(second).tobytes())
    return os.path.getsize(path)


def random_scales(rng, count):
    """Finite F16 scales: mostly ordinary, some tiny (subnormal) or large."""
    v = rng.normal(0.0, 0.05, count).astype(np.float32)
    v[rng.random(count) < 0.1] *= 1e-4
    v[rng.random(count) < 0.05] *= 1e4
    return v.astype(np.float16)


def dequant_fixture(rng, qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    nb = N_BLOCKS[block_size]
    blocks = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        blocks[:, off:off + 2] = random_scales(rng, nb).view(np.uint8).reshape(nb, 2)
    if qtype == T.Q8_K:
        d = rng.normal(0.0, 0.01, nb).astype(np.float32)
        blocks[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
        qs = blocks[:, 4:4 + 256].view(np.int8).astype(np.float32)
        expect = (d.reshape(nb, 1) * qs).astype(np.float32)
    else:
        expect = quants.dequantize(blocks, qtype)
    return blocks, expect.astype(np.float32).reshape(-1)


def half_patterns(rng):
    """Every interesting F16/BF16 bit pattern, then random ones."""
    special = [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x0401,
               0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7c01, 0xfc01,
               0x7e00, 0xfe00, 0x7dff, 0x7fff, 0xffff, 0x3555, 0x0200, 0x7f80,
               0xff80, 0x7f81, 0x7fc0, 0x0080, 0x007f]
    rand = rng.integers(0, 65536, size=1024 - len(special), dtype=np.uint16)
    return np.concatenate([np.array(special, dtype=np.uint16), rand])


def float_edge_values(rng):
    """Floats that probe F16/BF16 rounding: halfway points, overflow,
    subnormal boundaries, NaN payloads."""
    bits = [0x00000000, 0x80000000, 0x3f800000, 0x477fe000, 0x477fefff, 0x477ff000,
            0x477ff001, 0x47800000, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7f800001,
            0x7fc00000, 0xffa00001, 0x7fbfffff, 0x38800000, 0x387fffff, 0x387fc000,
            0x38000000, 0x33800000, 0x33000000, 0x33000001, 0x32ffffff, 0x33c00000,
            0x3f801000, 0x3f803000, 0x3f802fff, 0x3f808000, 0x3f818000, 0x3f817fff,
            0x00000001, 0x007fffff, 0x00800000, 0x35000000, 0x34800001]
    edge = np.array(bits, dtype=np.uint32).view(np.float32)
    # Random bit patterns cover every exponent; NaNs among them are fine.
    rand = rng.integers(0, 2**32, size=512, dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = rng.normal(0.0, 3.0, 1024 - len(edge) - len(rand)).astype(np.float32)
    return np.concatenate([edge, rand, normal]).astype(np.float32)


def block_inputs(rng, block_size):
    """Rows of floats for the block quantizers, with awkward blocks: all
    zero, constant, one outlier, tiny (scale underflows F16), huge (scale
    overflows F16), exact ties on the rounding grid."""
    nb = N_BLOCKS[block_size] * 2
    x = rng.normal(0.0, 1.0, (nb, block_size)).astype(np.float32)
    x[0] = 0.0
    x[1] = 0.75
    x[2, 5] = 40.0
    x[3] *= 1e-7
    x[4] *= 3e5
    x[5] = np.arange(block_size, dtype=np.float32) - block_size / 2  # ties
    x[6] = -x[6] ** 2
    x[7] = np.abs(x[7]) + 2.0
    return x.reshape(-1)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    total = 0

    for qtype in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K,
                  T.Q5_K, T.Q6_K, T.Q8_K, T.IQ4_NL, T.IQ4_XS]:
        blocks, expect = dequant_fixture(rng, qtype)
        total += write(f"{qtype.name}.deq.bin", 0, qtype, expect.size, blocks, expect)

    halves = half_patterns(rng)
    with np.errstate(invalid="ignore"):
        total += write("F16.deq.bin", 0, T.F16, halves.size, halves,
                       quants.dequantize(halves.view(np.uint8), T.F16))
        total += write("BF16.deq.bin", 0, T.BF16, halves.size, halves,
                       quants.dequantize(halves.view(np.uint8), T.BF16))
    f32 = float_edge_values(rng)
    total += write("F32.deq.bin", 0, T.F32, f32.size, f32, f32)

    with np.errstate(over="ignore", invalid="ignore"):
        total += write("F16.q.bin", 1, T.F16, f32.size, f32, f32.astype(np.float16))
        total += write("BF16.q.bin", 1, T.BF16, f32.size, f32, quants.quantize(f32, T.BF16))
    for qtype in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        x = block_inputs(rng, 32)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            q = quants.quantize(x.reshape(-1, 32), qtype)
        total += write(f"{qtype.name}.q.bin", 1, qtype, x.size, x, q)

    print(f"wrote {total} bytes to {os.path.relpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
