#!/usr/bin/env python3
"""Cross-check `cellm convert` against llama.cpp: loads each converted file
of the architecture fixtures (tests/data/arch/NAME.txt, made by
scripts/gen_arch_fixtures.py) in llama.cpp through llama-cpp-python and
compares its greedy tokens with transformers' (the fixture's `gen` line),
and its logits on the fixture prompts. Shows that the files are GGUF as
llama.cpp reads it, not a private dialect.

Two things llama.cpp does differently, handled here:
- llama.cpp's `llama` architecture ignores llama.attention.sliding_window
  (Mistral's window), so for the mistral fixtures only what lies inside the
  window is compared (positions < window, greedy steps while the sequence
  fits the window); the rest is reported, not judged. The `mistral` fixture's
  toy window of 16 is shorter than its prompts, so there that is 12 of the
  32 greedy steps; `mistral-wide` has Mistral 7B's window of 4096, longer
  than every sequence, so all of it is compared (as real Mistral files are,
  up to 4096 tokens).
- llama.cpp sets token attributes by model name: a model whose
  general.name contains "phi3" must have a "</s>" token, which the
  fixtures' tiny tokenizer lacks. The folders are converted from copies
  named "tiny-N" so general.name does not trigger that.

Usage: python3 scripts/llama_arch_check.py CELLM_BIN [NAME ...]
Needs: llama-cpp-python (0.3.36 was used), numpy. Exit status 1 on a
greedy mismatch.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "arch")
NAMES = ["llama", "llama-rope3", "mistral", "mistral-wide", "qwen2", "qwen3", "phi3",
         "phi3-longrope", "granite", "gemma3", "gemma3-scaled", "smollm3", "qwen3moe", "olmoe", "granitemoe", "lfm2"]


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


def check(cellm, name, tmp, idx):
    src = os.path.join(tmp, f"tiny-{idx}")
    shutil.copytree(os.path.join(DATA, name), src)
    out = os.path.join(tmp, name + ".gguf")
    subprocess.run([cellm, "convert", src, out, "--type", "f16"], check=True,
                   capture_output=True)
    window = 0
    if name.startswith("mistral"):  # llama.cpp's llama architecture ignores the window
        window = json.load(open(os.path.join(src, "config.json")))["sliding_window"]
    fx = parse(os.path.join(DATA, name + ".txt"))
    llm = Llama(model_path=out, n_ctx=128, logits_all=True, n_threads=2, verbose=False)
    worst, worst_out, n_out = 0.0, 0.0, 0
    for case in fx["logits"]:
        llm.reset()
        llm.eval(case["tokens"])
        for pos, ref in case["rows"].items():
            d = float(np.abs(np.array(llm.scores[pos]) - ref).max())
            if window and pos >= window:
                worst_out = max(worst_out, d)
                n_out += 1
            else:
                worst = max(worst, d)
    llm.reset()
    llm.eval(fx["prompt"])
    gen = []
    for _ in range(len(fx["gen"])):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(t)
        llm.eval([t])
    n = len(gen)
    if window:  # the token of step i is predicted from len(prompt) + i positions
        n = max(0, min(n, window - len(fx["prompt"]) + 1))
    same = gen[:n] == fx["gen"][:n]
    first = next((i for i, (a, b) in enumerate(zip(gen, fx["gen"])) if a != b), None)
    msg = (f"{name:14s} greedy {'same' if same else 'DIFFERENT'} for {n} steps"
           f"{'' if first is None else f' (first difference at step {first})'}; "
           f"max |logit - transformers| {worst:.4f}")
    if n_out:
        msg += (f" inside the window of {window} (past it llama.cpp attends to everything: "
                f"{worst_out:.2f})")
    print(msg)
    return same


def main():
    cellm = sys.argv[1]
    names = sys.argv[2:] or NAMES
    with tempfile.TemporaryDirectory() as tmp:
        ok = [check(cellm, n, tmp, i) for i, n in enumerate(names)]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
