#!/usr/bin/env python3
"""Writes the seed corpus of the session-file fuzzer (fuzz/corpus/session/):
session files of the small layout fuzz/fuzz_session.c restores against (two
KV groups of 2 and 1 layers, the second with a 40-token window, blocks of
512 and 256 bytes, context 256, vocabulary 100, identity bytes 0..31),
following the format in src/runtime/session_file.c, plus a few broken copies. Uses
only the standard library, so it is a writer independent of cellm's.

Usage: python3 scripts/gen_session_seeds.py [OUT_DIR]
"""
import hashlib
import os
import random
import struct
import sys

BLOCK = 16
GROUPS = [(2, 0, 512), (1, 40, 256)]  # layers, window, bytes per block


def first_block(window, n_pos):
    d = n_pos - window + 1
    return d // BLOCK if window > 0 and d > 0 else 0


def session(n_pos, msgs, rng):
    out = b"CELLMSES" + struct.pack("<II", 1, 0) + bytes(range(32))
    out += struct.pack("<III", 0, BLOCK, len(GROUPS))
    for layers, window, bb in GROUPS:
        out += struct.pack("<IiQ", layers, window, bb)
    out += struct.pack("<iI", n_pos, len(msgs))
    for role, text in msgs:
        b = text.encode()
        out += struct.pack("<BI", role, len(b)) + b
    out += b"".join(struct.pack("<i", rng.randrange(100)) for _ in range(n_pos))
    end = (n_pos + BLOCK - 1) // BLOCK
    for _, window, bb in GROUPS:
        first = first_block(window, n_pos) if n_pos else 0
        count = end - first
        out += struct.pack("<iI", first, count)
        out += bytes(rng.randrange(256) for _ in range(count * bb))
    return out + hashlib.sha256(out).digest()


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "fuzz", "corpus", "session")
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(7)
    chat = [(0, "You are brief."), (1, "Hi!"), (2, "Hello.")]
    files = {
        "empty": session(0, [], rng),
        "history_only": session(0, chat, rng),
        "one_block": session(16, chat, rng),
        "partial": session(21, chat[:2], rng),
        "windowed": session(100, chat, rng),
    }
    for name, data in list(files.items()):
        files[name + ".cut"] = data[: len(data) // 2]
        flipped = bytearray(data)
        flipped[60] ^= 1
        files[name + ".flip"] = bytes(flipped)
    for name, data in files.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
