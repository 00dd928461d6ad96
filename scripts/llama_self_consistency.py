#!/usr/bin/env python3
"""How closely llama.cpp agrees with itself: the same fixture prompts run
through llama.cpp (llama-cpp-python) with its default batch of 512 (which is
how tests/data/forward was made) and one token at a time (n_batch = 1), and
compared with the same metrics tests/test_forward.c applies to cellm. The
two llama.cpp runs differ only in float summation order and kernel choice,
so their disagreement is the noise floor of any comparison with llama.cpp
on these quantized models; the forward tests' tolerances are set from it
(docs/forward.md).

Usage: python3 scripts/llama_self_consistency.py NAME=MODEL.gguf ...
"""
import os
import sys

import numpy as np
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def parse(path):
    lines = open(path).read().split("\n")
    out = {"logits": [], "greedy": [], "ppl": None}
    for i, l in enumerate(lines):
        if l.startswith("logits "):
            out["logits"].append(list(map(int, lines[i + 1].split()[1:])))
        elif l.startswith("greedy "):
            prompt = list(map(int, lines[i + 1].split()[1:]))
            gen = list(map(int, lines[i + 2].split()[1:]))
            out["greedy"].append((prompt, gen))
        elif l.startswith("ppl "):
            ctx, chunks, bos, ref = l.split()[1:]
            toks = list(map(int, lines[i + 1].split()[1:]))
            out["ppl"] = (int(ctx), int(chunks), int(bos), float(ref), toks)
    return out


def run(name, path):
    fx = parse(os.path.join(HERE, "..", "tests", "data", "forward", name + ".txt"))
    big = Llama(model_path=path, n_ctx=1024, logits_all=True, n_threads=2, n_batch=512,
                verbose=False)
    one = Llama(model_path=path, n_ctx=1024, logits_all=True, n_threads=2, n_batch=1,
                n_ubatch=1, verbose=False)
    a, b = [], []
    for t in fx["logits"]:
        for llm, acc in ((big, a), (one, b)):
            llm.reset()
            llm.eval(t)
            acc.append(np.array(llm.scores[:len(t)]))
    a, b = np.concatenate(a), np.concatenate(b)
    la, lb = log_softmax(a), log_softmax(b)
    top = np.argsort(-la, -1)[:, :20]
    d = np.abs(np.take_along_axis(la, top, -1) - np.take_along_axis(lb, top, -1))
    print(f"{name}: logits, n_batch 1 vs 512: top-1 agrees at {(a.argmax(-1) == b.argmax(-1)).mean():.2%}"
          f" of {len(a)} positions; top-20 log-softmax difference max {d.max():.3f}, mean {d.mean():.4f}")
    same, gaps = 0, []
    for prompt, gen in fx["greedy"]:
        one.reset()
        one.eval(prompt)
        out = []
        for g in range(len(gen)):
            lg = np.array(one.scores[one.n_tokens - 1], dtype=np.float64)
            t = int(lg.argmax())
            if t != gen[g]:
                order = np.sort(lg)[::-1]
                gaps.append(order[0] - order[1])
                break
            out.append(t)
            one.eval([t])
        else:
            same += 1
    print(f"{name}: greedy, n_batch 1 vs 512: {same} of {len(fx['greedy'])} identical; gaps at "
          f"divergence (n_batch 1's own logits): {[round(g, 4) for g in gaps]}")
    ctx, chunks, bos, ref, toks = fx["ppl"]
    nll, n = 0.0, 0
    for c in range(chunks):
        ch = list(toks[c * ctx:(c + 1) * ctx])
        if bos:
            ch[0] = one.token_bos()
        one.reset()
        one.eval(ch)
        for j in range(ctx // 2, ctx - 1):
            nll -= log_softmax(one.scores[j])[toks[c * ctx + j + 1]]
            n += 1
    ppl = float(np.exp(nll / n))
    print(f"{name}: perplexity, n_batch 1: {ppl:.4f}, n_batch 512: {ref:.4f} ({100 * (ppl / ref - 1):+.2f}%)")


def main():
    for spec in sys.argv[1:]:
        name, path = spec.split("=", 1)
        run(name, path)


if __name__ == "__main__":
    main()
