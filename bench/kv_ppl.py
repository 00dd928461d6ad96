#!/usr/bin/env python3
"""kv_ppl.py — issue 27's quality check of the KV types: perplexity with
each --kv-type against f16 KV, on three texts (prose, code, non-English),
at 4 x 512 and 1 x 2,048 positions, with `cellm perplexity`.

Texts: Genesis (tests/data/genesis-kjv-start.txt), C code
(src/cpu/attention.c, or --text-code), German (/usr/share/gnupg/help.de.txt, from Debian's
gnupg-l10n package; --text-de to name another). Prints a markdown table,
one row per model and KV type, each cell the perplexity's change against
f16 KV on the same text and context.

  python3 bench/kv_ppl.py smollm2-135m gemma3-270m --kv-types q8_0,q4_0h,k5v4h
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTEXTS = [("4x512", ["-c", "512", "--chunks", "4"]), ("1x2048", ["-c", "2048", "--chunks", "1"])]


def ppl(cellm, model, text, ctx_args, kv, threads):
    cmd = [cellm, "perplexity", model, text, *ctx_args, "-t", str(threads), "--kv-type", kv]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    m = re.search(r"PPL = ([0-9.]+)", r.stdout + r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"kv_ppl: {' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()[-400:]}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="GGUF paths or model store names")
    ap.add_argument("--cellm", default=os.path.join(ROOT, "build", "cellm"))
    ap.add_argument("--kv-types", default="q8_0,q4_0h,k5v4h")
    ap.add_argument("--text-de", default="/usr/share/gnupg/help.de.txt")
    ap.add_argument("--text-code", default=os.path.join(ROOT, "src/cpu/attention.c"),
                    help="the code text (the file changes with the code: name a fixed copy, "
                    "e.g. `git show af503c3:src/cpu/attention.c`, to compare runs)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    texts = [("prose", os.path.join(ROOT, "tests/data/genesis-kjv-start.txt")),
             ("code", a.text_code), ("German", a.text_de)]
    for _, path in texts:
        if not os.path.exists(path):
            sys.exit(f"kv_ppl: no {path}")
    cols = [(t, c) for c, _ in CONTEXTS for t, _ in texts]
    head = "| model | KV type | " + " | ".join(f"{t} {c}" for t, c in cols) + " |"
    lines = [head, "| --- | --- |" + " ---: |" * len(cols)]
    for model in a.models:
        name = os.path.basename(model).removesuffix(".gguf")
        base = {}
        for kv in ["f16"] + a.kv_types.split(","):
            cells = []
            for cname, cargs in CONTEXTS:
                for tname, path in texts:
                    v = ppl(a.cellm, model, path, cargs, kv, a.threads)
                    if kv == "f16":
                        base[(tname, cname)] = v
                        cells.append(f"{v:.4f}")
                    else:
                        cells.append(f"{(v / base[(tname, cname)] - 1) * 100:+.2f}%")
            lines.append(f"| {name} | `{kv}` | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
