#!/usr/bin/env python3
"""Reference data for the forward-pass tests, from llama.cpp (through
llama-cpp-python) on the same GGUF files cellm runs. Writes
tests/data/forward/NAME.txt for each model:

  logits: 5 prompts x 128 positions; per position llama.cpp's 20 most likely
          tokens and their log-softmax values, and the prompt's token ids.
  greedy: 10 prompts; llama.cpp's 64 greedy tokens, and at each step the gap
          between its two best logits (to recognise near-ties).
  ppl:    llama.cpp-style perplexity (non-overlapping chunks of N_CTX tokens,
          BOS first where the model adds one, the second half of each chunk
          scored) over the first chunks of the evaluation text, with the
          token ids, so the test needs no tokenizer.

Token ids come from llama.cpp's tokenizer, so these tests depend only on the
forward pass. Needs: pip install llama-cpp-python==0.3.36 numpy
Usage: python3 scripts/gen_forward_fixtures.py NAME=MODEL.gguf ... [--text FILE]
"""
import argparse
import os
import subprocess

import numpy as np
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "forward")

LOGIT_PROMPTS = [
    # prose
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the "
    "face of the waters. And God said, Let there be light: and there was light. And God saw the "
    "light, that it was good: and God divided the light from the darkness. And God called the "
    "light Day, and the darkness he called Night. And the evening and the morning were the first "
    "day. And God said, Let there be a firmament in the midst of the waters, and let it divide "
    "the waters from the waters.",
    # code
    "#include <stdio.h>\n\n/* Returns the n-th Fibonacci number. */\nstatic long fib(int n) {\n"
    "    long a = 0, b = 1;\n    for (int i = 0; i < n; i++) {\n        long t = a + b;\n"
    "        a = b;\n        b = t;\n    }\n    return a;\n}\n\nint main(void) {\n"
    "    for (int i = 0; i < 20; i++)\n        printf(\"fib(%d) = %ld\\n\", i, fib(i));\n"
    "    return 0;\n}\n\n/* Sorts an array of integers in place with insertion sort. */\n"
    "static void sort(int *v, int n) {\n    for (int i = 1; i < n; i++) {\n",
    # a chat-shaped exchange
    "User: What is the tallest mountain in the world?\nAssistant: Mount Everest, at about 8,849 "
    "metres above sea level, is the tallest mountain on Earth.\nUser: And the longest river?\n"
    "Assistant: The Nile is usually named the longest river, at about 6,650 kilometres, although "
    "some measurements give the Amazon a greater length.\nUser: Which ocean is the largest?\n"
    "Assistant: The Pacific Ocean is the largest and deepest of the world's oceans.\nUser: How "
    "many continents are there?\nAssistant: Seven, by the most common count: Africa, Antarctica, "
    "Asia, Australia, Europe, North America and South America.\nUser: And the smallest one?\n"
    "Assistant:",
    # numbers and lists
    "Shopping list for the week:\n1. Two litres of milk\n2. A dozen eggs\n3. 500 g of flour\n"
    "4. Three apples, four pears and 1.5 kg of potatoes\n5. Coffee beans (250 g)\n\nPrices: "
    "milk 1.19, eggs 2.89, flour 0.79, apples 2.10, pears 2.45, potatoes 1.99, coffee 6.49. "
    "Total: 17.90 euros. Next week: rice, 2 onions, garlic, olive oil, 12 tomatoes and 3 cans "
    "of beans; budget 25 euros, spent so far 9.40, left 15.60.",
    # dialogue-free narrative with punctuation
    "The Lord is my shepherd; I shall not want. He maketh me to lie down in green pastures: he "
    "leadeth me beside the still waters. He restoreth my soul: he leadeth me in the paths of "
    "righteousness for his name's sake. Yea, though I walk through the valley of the shadow of "
    "death, I will fear no evil: for thou art with me; thy rod and thy staff they comfort me. "
    "Thou preparest a table before me in the presence of mine enemies: thou anointest my head "
    "with oil; my cup runneth over. Surely goodness and mercy shall follow me all the days of "
    "my life: and I will dwell in the house of the Lord for ever.",
]

GREEDY_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, the first humans",
    "The quick brown fox",
    "To make a cup of tea, first",
    "The largest planet in our solar system is",
    "Machine learning is a field of",
]

N_POS, N_TOP, N_GEN, N_LONG = 128, 20, 64, 700
PPL_CTX, PPL_CHUNKS = 512, 4


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def eval_text(path):
    """The evaluation text: Genesis from the KJV (public domain), as shipped
    by Debian's bible-kjv package, made by scripts/make_eval_text.sh."""
    with open(path, encoding="utf-8") as f:
        return f.read()


def gen(name, path, text):
    llm = Llama(model_path=path, n_ctx=1024, logits_all=True, n_threads=2, n_batch=512,
                verbose=False, seed=0)
    lines = [f"# llama.cpp reference for {name} ({os.path.basename(path)}); "
             f"made by scripts/gen_forward_fixtures.py"]
    for i, p in enumerate(LOGIT_PROMPTS):
        toks = llm.tokenize(p.encode(), add_bos=True, special=False)
        assert len(toks) >= N_POS, (name, i, len(toks))
        toks = toks[:N_POS]
        llm.reset()
        llm.eval(toks)
        lines.append(f"logits {i} {N_POS}")
        lines.append("tokens " + " ".join(map(str, toks)))
        for pos in range(N_POS):
            lsm = log_softmax(np.array(llm.scores[pos]))
            top = np.argsort(-lsm, kind="stable")[:N_TOP]
            lines.append(f"pos {pos} " + " ".join(f"{t}:{lsm[t]:.6f}" for t in top))
    for i, p in enumerate(GREEDY_PROMPTS):
        toks = llm.tokenize(p.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(toks)
        out, gaps = [], []
        for _ in range(N_GEN):
            lg = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            order = np.argsort(-lg, kind="stable")
            out.append(int(order[0]))
            gaps.append(lg[order[0]] - lg[order[1]])
            llm.eval([int(order[0])])
        lines.append(f"greedy {i} {len(toks)} {N_GEN}")
        lines.append("prompt " + " ".join(map(str, toks)))
        lines.append("gen " + " ".join(map(str, out)))
        lines.append("gap " + " ".join(f"{g:.5f}" for g in gaps))
    # A long prompt (past Gemma 3's 512-token window): the last 64 positions.
    toks = llm.tokenize(text.encode(), add_bos=True, special=False)[:N_LONG]
    llm.reset()
    llm.eval(toks)
    lines.append(f"long {N_LONG} {N_LONG - 64}")
    lines.append("tokens " + " ".join(map(str, toks)))
    for pos in range(N_LONG - 64, N_LONG):
        lsm = log_softmax(np.array(llm.scores[pos]))
        top = np.argsort(-lsm, kind="stable")[:N_TOP]
        lines.append(f"pos {pos} " + " ".join(f"{t}:{lsm[t]:.6f}" for t in top))
    # Perplexity as llama.cpp's perplexity tool computes it.
    toks = llm.tokenize(text.encode(), add_bos=False, special=False)
    need = PPL_CTX * PPL_CHUNKS
    assert len(toks) >= need, len(toks)
    toks = toks[:need]
    add_bos = llm.tokenize(b"", add_bos=True, special=False) != []
    nll, count = 0.0, 0
    for c in range(PPL_CHUNKS):
        chunk = list(toks[c * PPL_CTX:(c + 1) * PPL_CTX])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        for j in range(PPL_CTX // 2, PPL_CTX - 1):
            nll -= log_softmax(np.array(llm.scores[j]))[toks[c * PPL_CTX + j + 1]]
            count += 1
    lines.append(f"ppl {PPL_CTX} {PPL_CHUNKS} {int(add_bos)} {np.exp(nll / count):.6f}")
    lines.append("tokens " + " ".join(map(str, toks)))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{name}: wrote {len(lines)} lines, perplexity {np.exp(nll / count):.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", help="NAME=PATH")
    ap.add_argument("--text", default=None, help="evaluation text (default: make it)")
    a = ap.parse_args()
    text_path = a.text
    if not text_path:
        text_path = "/tmp/cellm-eval.txt"
        subprocess.run([os.path.join(HERE, "make_eval_text.sh"), text_path], check=True)
    text = eval_text(text_path)
    for spec in a.models:
        name, path = spec.split("=", 1)
        gen(name, path, text)


if __name__ == "__main__":
    main()
