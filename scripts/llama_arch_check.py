#!/usr/bin/env python3
"""Cross-check `cellm convert` against llama.cpp: loads each converted file
of the architecture fixtures (tests/data/arch/NAME.txt, made by
scripts/gen_arch_fixtures.py) in llama.cpp through llama-cpp-python and
compares its greedy tokens with transformers' (the fixture's `gen` line),
and its logits on the fixture prompts. Shows that the files are GGUF as
llama.cpp reads it, not a private dialect.

Usage: python3 scripts/llama_arch_check.py CELLM_BIN [NAME ...]
Needs: llama-cpp-python (0.3.36 was used), numpy. Exit status 1 on a
greedy mismatch.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "arch")
NAMES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "phi3-longrope", "granite"]


def parse(path):
    fx = {"logits": []}
    cur = None
    for line in open(path):
        w = line.split()
        if not w or w[0].startswith("#"):
            continue
        if w[0] == "logits":
            cur = {"first": int(w[3]), "rows": {}}
            fx["logits"].append(cur)
        elif w[0] == "tokens":
            cur["tokens"] = list(map(int, w[1:]))
        elif w[0] == "row":
            cur["rows"][int(w[1])] = np.array(list(map(float, w[2:])))
        elif w[0] in ("prompt", "gen"):
            fx[w[0]] = list(map(int, w[1:]))
    return fx


def check(cellm, name, tmp):
    out = os.path.join(tmp, name + ".gguf")
    subprocess.run([cellm, "convert", os.path.join(DATA, name), out, "--type", "f16"],
                   check=True, capture_output=True)
    fx = parse(os.path.join(DATA, name + ".txt"))
    llm = Llama(model_path=out, n_ctx=128, logits_all=True, n_threads=2, verbose=False)
    worst = 0.0
    for case in fx["logits"]:
        llm.reset()
        llm.eval(case["tokens"])
        for pos, ref in case["rows"].items():
            worst = max(worst, float(np.abs(np.array(llm.scores[pos]) - ref).max()))
    llm.reset()
    llm.eval(fx["prompt"])
    gen = []
    for _ in range(len(fx["gen"])):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(t)
        llm.eval([t])
    same = gen == fx["gen"]
    first = next((i for i, (a, b) in enumerate(zip(gen, fx["gen"])) if a != b), None)
    print(f"{name:14s} greedy {'same' if same else f'differs at step {first}'} "
          f"({len(gen)} steps); max |logit - transformers| {worst:.4f}")
    return same


def main():
    cellm = sys.argv[1]
    names = sys.argv[2:] or NAMES
    with tempfile.TemporaryDirectory() as tmp:
        ok = [check(cellm, n, tmp) for n in names]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
