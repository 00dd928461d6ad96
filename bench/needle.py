#!/usr/bin/env python3
"""Needle in a haystack: does a fact placed at 10 depths of a long prompt
come back, for each KV type? (issue 27's long-context retrieval check)

The haystack is the repository's own text (Genesis, then docs/forward.md),
cut to about --lengths tokens; one sentence, "The secret code of the vault
is NNNN.", goes in after a sentence's full stop at each of 10 depths (0%, 11%,
..., 100% of the text), a different number at each depth. The prompt ends
with the question and the start of the answer, and the model continues it
greedily (`cellm run --raw`, 8 tokens): a trial passes when the number is
in what it writes. Every KV type meets the same prompts.

  python3 bench/needle.py smollm2-135m gemma3-270m --kv-types f16,q8_0,q4_0h,k5v4h

prints, per model, length and KV type, the passes out of 10 and which
depths failed, then a markdown table for docs/benchmarks.md.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD = "Read the document and answer the question after it.\n\n"
TAIL = "\n\nQuestion: What is the secret code of the vault?\nAnswer: The secret code of the vault is"
CHARS_PER_TOKEN = 4.2  # both models' tokenizers on this text, about


def haystack_text():
    parts = []
    for rel in ("tests/data/genesis-kjv-start.txt", "docs/forward.md"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            parts.append(f.read())
    # the needle's words must not occur in the filler
    text = "\n\n".join(parts)
    assert "secret code" not in text
    return text


def prompt_for(hay, n_chars, depth, code):
    body = hay[:n_chars]
    body = body[: max(body.rfind(". "), body.rfind(".\n")) + 1]
    at = int(len(body) * depth)
    if at < len(body):
        cut = max(body.rfind(". ", 0, at), body.rfind(".\n", 0, at))
        at = 0 if cut < 0 else cut + 2
    needle = f"The secret code of the vault is {code}. "
    if at >= len(body):
        needle = " " + needle.strip()
    return HEAD + body[:at] + needle + body[at:] + TAIL


def run_one(cellm, model, prompt, kv, ctx, threads):
    cmd = [cellm, "run", model, "-p", prompt, "--raw", "-n", "8", "-c", str(ctx), "-t",
           str(threads), "--kv-type", kv, "-v"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"needle: {' '.join(cmd[:4])} ... failed: {r.stderr.strip()[-400:]}")
    m = re.search(r"prompt: (\d+) tokens", r.stderr + r.stdout)
    return r.stdout, int(m.group(1)) if m else -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="GGUF paths or model store names")
    ap.add_argument("--cellm", default=os.path.join(ROOT, "build", "cellm"))
    ap.add_argument("--kv-types", default="f16,q8_0,q4_0h,k5v4h")
    ap.add_argument("--lengths", default="2048,4096", help="prompt lengths, tokens (about)")
    ap.add_argument("--depths", type=int, default=10)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    hay = haystack_text()
    lengths = [int(x) for x in a.lengths.split(",")]
    kvs = a.kv_types.split(",")
    rows = []
    for model in a.models:
        for n in lengths:
            n_chars = int((n - 40) * CHARS_PER_TOKEN)
            if n_chars > len(hay):
                sys.exit(f"needle: the haystack holds about {int(len(hay) / CHARS_PER_TOKEN)} tokens")
            for kv in kvs:
                ok, fails, toks = 0, [], []
                for i in range(a.depths):
                    depth = i / (a.depths - 1) if a.depths > 1 else 0.5
                    code = 1000 + (7919 * (i + 1) + 104729 * n) % 9000
                    out, nt = run_one(a.cellm, model, prompt_for(hay, n_chars, depth, code), kv,
                                      n + 256, a.threads)
                    toks.append(nt)
                    if str(code) in out:
                        ok += 1
                    else:
                        fails.append(f"{round(depth * 100)}%")
                name = os.path.basename(model).removesuffix(".gguf")
                print(f"{name} ~{n} ({min(toks)}-{max(toks)} tokens) {kv}: {ok}/{a.depths}"
                      + (f", missed at {' '.join(fails)}" if fails else ""), flush=True)
                rows.append((name, n, min(toks), max(toks), kv, ok, fails))
    print("\n| model | prompt tokens | KV type | found | missed at depth |")
    print("| --- | --- | --- | ---: | --- |")
    for name, n, lo, hi, kv, ok, fails in rows:
        print(f"| {name} | {lo}-{hi} | `{kv}` | {ok} / {a.depths} | {' '.join(fails) or '-'} |")


if __name__ == "__main__":
    main()
