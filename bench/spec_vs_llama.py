#!/usr/bin/env python3
"""Speculative decoding by prompt lookup: cellm and llama.cpp side by side
on the same GGUF file, thread count and chat prompts, in one run.

Four rows per task, each a generation rate (tokens after the first over the
time after the first, greedy, one session):
  - llama.cpp plain, through llama-cpp-python;
  - llama.cpp with LlamaPromptLookupDecoding(max_ngram_size=N,
    num_pred_tokens=K) as its draft_model (llama-cpp-python's prompt lookup);
  - cellm plain and cellm --lookup N --draft-max K, from
    `cellm bench --lookup N --draft-max K -s 1 --json` (which alternates its
    own plain and speculative engines round by round).
Each round runs llama.cpp's two (plain and lookup alternating prompt by
prompt) and then one round of `cellm bench`, so a change in the machine's
load falls on all four; the table gives the median and the range over the
rounds and each engine's speed-up over its own plain run.

The prompts are cellm's own (`cellm bench --spec-prompts`): the user
message of each chat request, rendered for llama.cpp with the model's chat
template by llama-cpp-python's Jinja2 formatter, and generation stops at
end of turn as cellm's does.

llama-cpp-python has no speculative decoding with a second GGUF as the
draft (its LlamaDraftModel interface is for Python-side guessers such as
prompt lookup), so `cellm bench --draft` has no llama.cpp counterpart
here. Nothing of llama.cpp is committed; llama-cpp-python comes from the
package registry (scripts/setup.sh --test installs it).

Usage: python3 bench/spec_vs_llama.py [--model smollm2-135m-q8_0] [--tasks edit,summary]
       [--threads 2] [-n 64] [--reps 3] [--lookup 2] [--draft-max 8]
The cellm binary is $CELLM_BIN, else build/cellm.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLM = os.environ.get("CELLM_BIN") or os.path.join(ROOT, "build", "cellm")


def model_path(name):
    if os.path.exists(name):
        return name
    home = os.environ.get("CELLM_HOME") or os.path.expanduser("~/.cache/cellm")
    for p in (os.path.join(home, "models", name), os.path.join(home, "models", name + ".gguf")):
        if os.path.exists(p):
            return p
    sys.exit(f"spec_vs_llama: no model {name} (a path or a file in {home}/models)")


def cellm_prompts(tasks):
    out = subprocess.run([CELLM, "bench", "--spec-prompts", "--spec-task", tasks],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


class LlamaSide:
    """One llama.cpp context plain and one with prompt lookup, same file."""

    def __init__(self, path, threads, ctx, lookup, draft_max):
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        self.llama_cpp = llama_cpp
        kw = dict(model_path=path, n_ctx=ctx, n_batch=512, n_threads=threads,
                  n_threads_batch=threads, verbose=False)
        self.plain = Llama(**kw)
        # logits_all=True by hand: 0.3.36 turns it on for a draft_model but
        # sizes its logits array by the argument, and a prompt past n_batch
        # rows then fails to fit.
        self.lookup = Llama(draft_model=LlamaPromptLookupDecoding(
            max_ngram_size=lookup, num_pred_tokens=draft_max), logits_all=True, **kw)
        m = self.plain
        tmpl = m.metadata.get("tokenizer.chat_template")
        if not tmpl:
            sys.exit("spec_vs_llama: the model has no chat template")
        eos, bos = m.token_eos(), m.token_bos()
        self.fmt = Jinja2ChatFormatter(
            template=tmpl,
            eos_token=m._model.token_get_text(eos) if eos != -1 else "",
            bos_token=m._model.token_get_text(bos) if bos != -1 else "")
        self.version = llama_cpp.__version__

    def tokens(self, user):
        text = self.fmt(messages=[{"role": "user", "content": user}]).prompt
        return self.plain.tokenize(text.encode(), add_bos=False, special=True)

    def generate(self, llm, toks, n):
        """Greedy generation of up to n tokens, until end of turn; returns
        (tokens, tokens after the first, seconds after the first)."""
        out, t_first = [], None
        for tok in llm.generate(toks, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            if self.llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok):
                break
            out.append(tok)
            if t_first is None:
                t_first = time.perf_counter()
            if len(out) >= n:
                break
        t_end = time.perf_counter()
        return out, max(len(out) - 1, 0), (t_end - t_first) if t_first else 0.0


def llama_round(side, prompts, n, order):
    """All prompts on both contexts; returns tokens/s (plain, lookup) and
    how many completions differed between the two."""
    tot = {"plain": [0, 0.0], "lookup": [0, 0.0]}
    differ = 0
    for i, toks in enumerate(prompts):
        outs = {}
        modes = ("plain", "lookup") if (i + order) % 2 == 0 else ("lookup", "plain")
        for mode in modes:
            llm = side.plain if mode == "plain" else side.lookup
            ids, k, dt = side.generate(llm, toks, n)
            outs[mode] = ids
            tot[mode][0] += k
            tot[mode][1] += dt
        differ += outs["plain"] != outs["lookup"]
    rate = {m: (v[0] / v[1] if v[1] > 0 else 0.0) for m, v in tot.items()}
    return rate["plain"], rate["lookup"], differ


def cellm_round(path, task, a):
    out = subprocess.run([CELLM, "bench", path, "--lookup", str(a.lookup), "--draft-max",
                          str(a.draft_max), "--spec-task", task, "-s", "1", "-n", str(a.n),
                          "-r", "1", "-t", str(a.threads), "-c", str(a.ctx), "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"spec_vs_llama: cellm bench failed: {out.stderr.strip()}")
    r = json.loads(out.stdout)["results"][0]
    return (r["plain_tokens_per_s"]["median"], r["spec_tokens_per_s"]["median"],
            r["acceptance"], r["tokens_per_pass"])


def fmt(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-q8_0")
    ap.add_argument("--tasks", default="edit,summary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=64, help="tokens a completion at most")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lookup", type=int, default=2, help="n-gram size of the lookup")
    ap.add_argument("--draft-max", type=int, default=8, help="guesses a step at most")
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("spec_vs_llama: llama-cpp-python is missing: pip install llama-cpp-python "
                 "(scripts/setup.sh --test installs it)")
    path = model_path(a.model)
    prompts = cellm_prompts(a.tasks)
    side = LlamaSide(path, a.threads, a.ctx, a.lookup, a.draft_max)
    load0 = os.getloadavg()
    t0 = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    # An untimed generation on each context first: llama.cpp's first decode
    # after load runs several times slower (seen as a first round at a tenth
    # of the speed of the next).
    warm = side.tokens("Say hello.")
    side.generate(side.plain, warm, 8)
    side.generate(side.lookup, warm, 8)
    rows = []
    for task in a.tasks.split(","):
        toks = [side.tokens(u) for u in prompts[task]]
        lp, ll, cp, cs, acc, tpp = [], [], [], [], [], []
        differ = 0
        for r in range(a.reps):
            p, l, d = llama_round(side, toks, a.n, r)
            lp.append(p), ll.append(l)
            differ += d
            c = cellm_round(path, task, a)
            cp.append(c[0]), cs.append(c[1]), acc.append(c[2]), tpp.append(c[3])
            print(f"# {task} round {r + 1}: llama.cpp {p:.1f} / {l:.1f}, cellm {c[0]:.1f} / "
                  f"{c[1]:.1f} tokens/s (plain / lookup)", file=sys.stderr, flush=True)
        rows.append((task, lp, ll, cp, cs, acc, tpp, differ))
    load1 = os.getloadavg()
    print(f"{os.path.basename(path)}, {a.threads} threads, greedy, up to {a.n} tokens a "
          f"completion, {len(next(iter(prompts.values())))} chat prompts a task, {a.reps} rounds; "
          f"lookup n-grams up to {a.lookup}, at most {a.draft_max} guesses a step; llama.cpp "
          f"through llama-cpp-python {side.version}; started {t0}, load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after.\n")
    print("| task | engine | plain tok/s | prompt lookup tok/s | speed-up | lookup: cellm / "
          "llama.cpp |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for task, lp, ll, cp, cs, acc, tpp, differ in rows:
        lx = [b / a_ for a_, b in zip(lp, ll)]
        cx = [b / a_ for a_, b in zip(cp, cs)]
        rel = [c / l_ for c, l_ in zip(cs, ll)]
        print(f"| {task} | llama.cpp | {fmt(lp)} | {fmt(ll)} | {statistics.median(lx):.2f}x | |")
        print(f"| {task} | cellm | {fmt(cp)} | {fmt(cs)} | {statistics.median(cx):.2f}x | "
              f"{statistics.median(rel):.2f} |")
        print(f"<!-- {task}: cellm acceptance {statistics.median(acc):.0%}, "
              f"{statistics.median(tpp):.2f} tokens a checking pass; llama.cpp lookup text "
              f"differed from its plain text in {differ} of {a.reps * len(toks)} completions -->")
    print("\nllama-cpp-python cannot draft with a second GGUF model (its draft_model takes "
          "Python guessers such as prompt lookup), so cellm's --draft has no llama.cpp row.")


if __name__ == "__main__":
    main()
