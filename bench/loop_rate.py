#!/usr/bin/env python3
"""How often a first question sends `cellm run` into a loop, under each
candidate chat default: greedy, greedy with the n-gram guard, sampling
(temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) and sampling with the
guard. docs/sampling.md has the table this prints and the default it chose.

Each of 20 varied first questions (facts, how-to, code, maths, a greeting,
a list, a translation, ...) is asked once per setting and seed, alone, as
`cellm run MODEL -p QUESTION -n N -v` with every sampling flag given, so
the result does not depend on the defaults being measured.

An answer LOOPS when, mechanically, either
  (a) some 8 consecutive words occur 3 or more times in it (occurrences
      may overlap; words are split at white space, lower-cased, with
      punctuation at their ends removed), or
  (b) a piece of 1 to 50 characters repeats back to back 5 or more times,
      covering at least 50 characters (a loop without spaces).
It RUNS ON when it ends at the -n limit instead of at end-of-turn. For
a setting with the guard, the last column counts the answers the guard
changed (any byte) among those that did not loop without it: its cost to
good answers.

Usage: python3 bench/loop_rate.py [--model smollm2-135m] [-n 256] [--threads 2]
       [--seeds 24301,1,2] [--guards 3,4] [--answers FILE.json]
The first seed is cellm's default one (0x5eed); greedy settings run once.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLM = os.environ.get("CELLM_BIN") or os.path.join(ROOT, "build", "cellm")

QUESTIONS = [
    "What is the capital of France?",
    "Hello! How are you today?",
    "What is 2+2?",
    "How do I boil an egg?",
    "Write a Python function that reverses a string.",
    "What is 15 times 4?",
    "List three fruits that are red.",
    'Translate "Good morning, my friend" into Spanish.',
    "Why is the sky blue?",
    "Write a short poem about the sea.",
    "Who wrote Romeo and Juliet?",
    "What is photosynthesis?",
    "Can you recommend a good book for someone learning to program?",
    "Explain what a computer virus is in one sentence.",
    "What should I pack for a weekend camping trip?",
    "Write a haiku about autumn.",
    "What is the difference between weather and climate?",
    "How do I make a cup of tea?",
    "Summarize the story of Cinderella in two sentences.",
    "What is the boiling point of water in Celsius?",
]

SAMPLING = ["--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"]


def words(text):
    out = []
    for w in text.lower().split():
        w = w.strip(".,;:!?\"'()[]{}*-_`")
        if w:
            out.append(w)
    return out


def loops(text):
    """The rule in the module's docstring: (a) or (b)."""
    w = words(text)
    seen = {}
    for i in range(len(w) - 7):
        g = tuple(w[i:i + 8])
        seen[g] = seen.get(g, 0) + 1
        if seen[g] >= 3:
            return True
    for m in re.finditer(r"(.{1,50}?)\1{4,}", text, re.S):
        if len(m.group(0)) >= 50:
            return True
    return False


def ask(model, question, flags, n, threads):
    cmd = [CELLM, "run", model, "-p", question, "-n", str(n), "-t", str(threads), "-v", *flags]
    p = subprocess.run(cmd, capture_output=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"loop_rate: {' '.join(cmd)} failed: {p.stderr.decode(errors='replace')}")
    m = re.search(r"generation: (\d+) tokens", p.stderr.decode())
    return p.stdout.decode("utf-8", errors="replace").rstrip("\n"), int(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seeds", default="24301,1,2")
    ap.add_argument("--guards", default="3,4", help="n-gram guard sizes to try (repeats 2)")
    ap.add_argument("--answers", help="write every answer to this JSON file")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    guards = [int(g) for g in a.guards.split(",")]
    off = ["--ngram-guard", "0"]
    settings = []  # (name, flags, seeds, the setting it adds a guard to)
    for base, flags, ss in (("greedy", ["--temp", "0"], seeds[:1]), ("sampling", SAMPLING, seeds)):
        settings.append((base, flags + off, ss, None))
        for g in guards:
            guard = ["--ngram-guard", str(g), "--ngram-guard-repeats", "2"]
            settings.append((f"{base} + guard {g}", flags + guard, ss, base))
    answers = []
    got = {}  # (setting, seed, question) -> (text, loops)
    nq = len(QUESTIONS)
    print(f"{a.model}, {nq} questions, -n {a.n}; seeds {a.seeds} (the first is cellm's "
          f"default); `python3 bench/loop_rate.py {' '.join(sys.argv[1:])}`\n")
    print("| setting | loops (default seed) | runs on (default seed) | loops (all seeds) "
          "| runs on (all seeds) | guard changed a non-looping answer |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, flags, ss, base in settings:
        n_loop = n_on = n_loop0 = n_on0 = total = changed = clean = 0
        for s in ss:
            for q in QUESTIONS:
                text, n_gen = ask(a.model, q, flags + ["-s", str(s)], a.n, a.threads)
                lp, on = loops(text), n_gen >= a.n
                got[(name, s, q)] = (text, lp)
                answers.append({"setting": name, "seed": s, "question": q, "answer": text,
                                "tokens": n_gen, "loops": lp, "runs_on": on})
                total += 1
                n_loop += lp
                n_on += on
                if s == seeds[0]:
                    n_loop0 += lp
                    n_on0 += on
                if base and not got[(base, s, q)][1]:
                    clean += 1
                    changed += text != got[(base, s, q)][0]
        ch = f"{changed}/{clean}" if base else "-"
        print(f"| {name} | {n_loop0}/{nq} | {n_on0}/{nq} | {n_loop}/{total} | {n_on}/{total} "
              f"| {ch} |", flush=True)
    if a.answers:
        with open(a.answers, "w") as f:
            json.dump(answers, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
