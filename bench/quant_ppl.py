#!/ usr / bin / env python3
"""quant_ppl.py — perplexity of GGUF models with llama.cpp (llama-cpp-python),
to measure what `cellm quantize` loses.

Computed as llama.cpp's `llama-perplexity` does: the text is tokenized once,
cut into chunks of CTX tokens (the first token of each chunk replaced by BOS
when the model adds one), each chunk evaluated on its own, and only the
second half of each chunk scored (every scored token sees at least CTX/2
tokens of context). Prints one line per model and, with several models,
each one's change relative to the first.

The default text is the GNU GPL v3 from Debian's base-files package
(/usr/share/common-licenses/GPL-3): present on every Debian system, English
prose, ~8k tokens. It is read in place, not copied into the repository.

  python3 bench/quant_ppl.py [--ctx 512] [--threads 2] [--text FILE] MODEL.gguf...
"""
import argparse
import math
import os
import sys
import time

import numpy as np
from llama_cpp import Llama


def perplexity(path, text, ctx, threads):
    llm = Llama(model_path=path, n_ctx=ctx, n_batch=ctx, n_threads=threads,
                logits_all=True, verbose=False)
    toks = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    add_bos = len(llm.tokenize(b"a", add_bos=True)) > len(llm.tokenize(b"a", add_bos=False))
    n_chunks = len(toks) // ctx
    if n_chunks == 0:
        sys.exit(f"quant_ppl.py: text has {len(toks)} tokens, fewer than one chunk of {ctx}")
    nll, count = 0.0, 0
    first = ctx // 2
    for c in range(n_chunks):
        chunk = list(toks[c * ctx:(c + 1) * ctx])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:ctx], dtype=np.float64)
#log - softmax of the logits at positions first - 1..ctx - 2, each
#predicting the next token of the chunk.
        rows = logits[first - 1:ctx - 1]
        m = rows.max(axis=1, keepdims=True)
        logz = (m[:, 0] + np.log(np.exp(rows - m).sum(axis=1)))
        target = np.asarray(chunk[first:ctx])
        nll += float((logz - rows[np.arange(len(target)), target]).sum())
        count += len(target)
    return math.exp(nll / count), n_chunks, count, len(toks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    a = ap.parse_args()
    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    print(f"text: {a.text}, context {a.ctx}, llama-cpp-python", end=" ")
    import llama_cpp
    print(llama_cpp.__version__)
    base = None
    for path in a.models:
        t0 = time.time()
        ppl, n_chunks, scored, n_toks = perplexity(path, text, a.ctx, a.threads)
        rel = "" if base is None else f"  {100.0 * (ppl / base - 1.0):+.2f}% vs first"
        base = ppl if base is None else base
        print(f"{os.path.basename(path):32s} {os.path.getsize(path) / 2**20:8.1f} MiB  "
              f"PPL {ppl:9.4f}  ({n_chunks} chunks, {scored} tokens scored of {n_toks}, "
              f"{time.time() - t0:.0f} s){rel}", flush=True)


if __name__ == "__main__":
    main()
