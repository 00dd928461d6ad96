#!/usr/bin/env python3
"""Reference prompt-token log-probabilities from llama.cpp (through
llama-cpp-python, logits_all=True) on the same GGUF file cellm runs, for
tests/test_logprobs.c. Writes tests/data/logprobs/NAME.txt:

  prompt I N          a prompt of N tokens (llama.cpp's tokenizer, BOS where
                      the model adds one), then three lines:
  tokens t0 .. tN-1   its token ids
  lp nan l1 .. lN-1   log P(t_i | t_0 .. t_i-1), log-softmax of llama.cpp's
                      logits at position i-1 in float64 (the first has none)
  top t'1 .. t'N-1    llama.cpp's most likely token at each of those positions

These are what an evaluation harness scores (echo + logprobs on
/v1/completions). Token ids come from llama.cpp, so the test depends only on
the forward pass and cellm's log-softmax. Needs: pip install
llama-cpp-python==0.3.36 numpy
Usage: python3 scripts/gen_logprob_fixtures.py NAME=MODEL.gguf ...
  e.g. smollm2-135m=$HOME/.cache/cellm/models/smollm2-135m.gguf
"""
import argparse
import os

import numpy as np
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "logprobs")

# Short prompts of the kinds harnesses score: a question and its answer, a
# sentence completion, a fact, code, a number series.
PROMPTS = [
    "Question: What is the capital of France?\nAnswer: Paris",
    "The cat sat on the mat because it was tired.",
    "Water freezes at zero degrees Celsius and boils at one hundred.",
    "def add(a, b):\n    return a + b\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
    "Once upon a time there was a little girl who lived in a village near the forest.",
]


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def gen(name, path):
    llm = Llama(model_path=path, n_ctx=256, logits_all=True, n_threads=2, n_batch=256,
                verbose=False, seed=0)
    lines = [f"# llama.cpp prompt log-probabilities for {name} ({os.path.basename(path)}); "
             f"made by scripts/gen_logprob_fixtures.py"]
    for i, p in enumerate(PROMPTS):
        toks = llm.tokenize(p.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(toks)
        lps, tops = ["nan"], []
        for pos in range(len(toks) - 1):
            lsm = log_softmax(np.array(llm.scores[pos]))
            lps.append(f"{lsm[toks[pos + 1]]:.6f}")
            tops.append(str(int(np.argmax(lsm))))
        lines.append(f"prompt {i} {len(toks)}")
        lines.append("tokens " + " ".join(map(str, toks)))
        lines.append("lp " + " ".join(lps))
        lines.append("top " + " ".join(tops))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{name}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", help="NAME=PATH.gguf")
    a = ap.parse_args()
    for m in a.models:
        name, path = m.split("=", 1)
        gen(name, path)


if __name__ == "__main__":
    main()
