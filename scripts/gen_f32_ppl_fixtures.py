#!/usr/bin/env python3
"""The f32 reference perplexity for test_vk_forward: transformers' (the GGUF
weights dequantized, float32 activations: bench/ppl_transformers.py) over
the tokens of the "ppl" case of tests/data/forward/NAME.txt (llama.cpp's
tokens, BOS first where that case says so), for chunk sizes from 64 up.
The Vulkan backend multiplies f32 activations, so its perplexity is checked
against this within 0.5%; the CPU's 8-bit activations come out about 0.7%
higher (docs/benchmarks.md). Needs transformers, torch and gguf (run on the
device tool's GPU). Writes tests/data/forward/f32-ppl.txt (the rows of
the models named; those of others stay):

  NAME CTX CHUNKS PERPLEXITY

Usage: python3 scripts/gen_f32_ppl_fixtures.py NAME=MODEL.gguf ...
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from ppl_transformers import load, perplexity  # noqa: E402

OUT = os.path.join(HERE, "..", "tests", "data", "forward")


def ppl_case(name):
    """(ctx, chunks, bos, tokens) of the fixture's ppl case."""
    with open(os.path.join(OUT, name + ".txt")) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if line.startswith("ppl "):
            ctx, chunks, bos = (int(x) for x in line.split()[1:4])
            return ctx, chunks, bos, [int(t) for t in lines[i + 1].split()[1:]]
    raise SystemExit("%s.txt has no ppl case" % name)


def main():
    rows = []
    for arg in sys.argv[1:]:
        name, gguf = arg.split("=", 1)
        ctx, chunks, bos, tok = ppl_case(name)
        bos_id = -1
        if bos:
            import gguf as g
            r = g.GGUFReader(gguf)
            f = r.fields["tokenizer.ggml.bos_token_id"]
            bos_id = int(f.parts[f.data[0]][0])
        model = load(gguf)
        for c in (64, 128, 256, 512):
            for n in (1, chunks):
                if c * n > len(tok) or (n == chunks and c != ctx):
                    continue
                ppl, count, _ = perplexity(model, tok, c, n, bos_id)
                rows.append("%s %d %d %.6f" % (name, c, n, ppl))
                print(rows[-1], "(%d tokens scored)" % count)
    # The rows of models not named this time stay.
    path = os.path.join(OUT, "f32-ppl.txt")
    named = {a.split("=", 1)[0] for a in sys.argv[1:]}
    if os.path.exists(path):
        with open(path) as f:
            keep = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")
                    and ln.split()[0] not in named]
        rows = keep + rows
    with open(path, "w") as f:
        f.write("# transformers float32 perplexity over the ppl case's tokens; "
                "made by scripts/gen_f32_ppl_fixtures.py\n")
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
