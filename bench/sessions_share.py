#!/usr/bin/env python3
"""The share of the m = 8 roofline that 8 concurrent sessions reach,
alternating the two measurements round by round (the host's speed moves by
tens of percent between minutes, so a share taken from runs far apart
says little).

Each round runs `cellm bench-kernels --threads T --reps 5` (the matmul rate
with 8 activation rows, GF m8, of every weight type) and then `cellm bench
MODEL -s 8 -n N -t T --ignore-eos` (the aggregate decode rate of 8
sessions). The roofline of a round is the step of 8 tokens that the
model's weights would take at that round's GF m8 of their types (the
weights of each type from `cellm inspect`'s MiB per type); the share is the
sessions' tokens/s against 8 / that step. Prints each round and the median
and range of the shares.

Usage: python3 bench/sessions_share.py [--rounds 5] [--threads 2] [-n 64]
       [--cellm BIN]... [MODEL]   (a store name or a path; default
       smollm2-135m)
The cellm binary is $CELLM_BIN, else build/cellm. With --cellm given more
than once, each round runs the sessions with every binary in turn (the
roofline with the first), to compare two builds under the same host, in
turn first and last.
"""
import argparse
import os
import re
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLM = os.environ.get("CELLM_BIN") or os.path.join(ROOT, "build", "cellm")

# Bytes a block and weights a block of each type bench-kernels measures.
BLOCK = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q8_0": (34, 32),
         "Q4_K": (144, 256), "Q6_K": (210, 256)}


def model_path(name):
    if os.path.exists(name):
        return name
    home = os.environ.get("CELLM_HOME") or os.path.expanduser("~/.cache/cellm")
    return os.path.join(home, "models", name + ".gguf")


def run(binary, args):
    return subprocess.run([binary] + args, capture_output=True, text=True, check=True).stdout


def weights_by_type(binary, model):
    """Weights a decode step multiplies, by type, from inspect's MiB per type."""
    out, w = run(binary, ["inspect", model]), {}
    for m in re.finditer(r"^\s+(\w+)\s+\d+ tensors\s+([\d.]+) (KiB|MiB)", out, re.M):
        t, size, unit = m.group(1), float(m.group(2)), m.group(3)
        if t not in BLOCK:
            if t not in ("F32", "F16"):
                raise SystemExit(f"{t}: no m = 8 rate from bench-kernels")
            continue  # norms: not a matmul
        nbytes = size * (1024 if unit == "KiB" else 1024 * 1024)
        w[t] = nbytes / BLOCK[t][0] * BLOCK[t][1]
    return w


def gf_m8(binary, threads):
    out, gf = run(binary, ["bench-kernels", "--threads", str(threads), "--reps", "5"]), {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 11 and f[0] in BLOCK and f[1] == str(threads):
            gf[f[0]] = float(f[10])
    return gf


def sessions_rate(binary, model, threads, n):
    out = run(binary, ["bench", model, "-s", "8", "-n", str(n), "-t", str(threads),
                       "--ignore-eos"])
    for line in out.splitlines():
        f = line.split()
        if len(f) > 2 and f[0] == "8":
            return float(f[1])
    raise SystemExit("no 8-session row in cellm bench's output")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--cellm", action="append", help="a cellm binary (repeatable)")
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    a = ap.parse_args()
    bins = a.cellm or [CELLM]
    model = model_path(a.model)
    w = weights_by_type(bins[0], model)
    print("weights: " + ", ".join(f"{t} {v / 1e6:.1f} M" for t, v in w.items()))
    print("| round | cellm | GF m8 by type | roofline tok/s | 8 sessions tok/s | share |")
    print("| ---: | --- | --- | ---: | ---: | ---: |")
    shares = {b: [] for b in bins}
    rates = {b: [] for b in bins}
    roofs = []
    for i in range(a.rounds):
        gf = gf_m8(bins[0], a.threads)
        step_s = sum(2 * v * 8 / (gf[t] * 1e9) for t, v in w.items())
        roof = 8 / step_s
        roofs.append(roof)
        kinds = ", ".join(f"{t} {gf[t]:.1f}" for t in w)
        # the builds' order turned every round: the one run just after
        # bench-kernels is not always the same
        for b in bins if i % 2 == 0 else bins[::-1]:
            rate = sessions_rate(b, model, a.threads, a.n)
            rates[b].append(rate)
            shares[b].append(rate / roof)
            print(f"| {i + 1} | {b} | {kinds} | {roof:.0f} | {rate:.1f} | "
                  f"{100 * rate / roof:.1f}% |", flush=True)
    print(f"\nroofline median {statistics.median(roofs):.0f} tok/s "
          f"(range {min(roofs):.0f}-{max(roofs):.0f})")
    for b in bins:
        sh = shares[b]
        print(f"{b}: 8 sessions median {statistics.median(rates[b]):.1f} tok/s "
              f"(range {min(rates[b]):.1f}-{max(rates[b]):.1f}), median share "
              f"{100 * statistics.median(sh):.1f}% (range {100 * min(sh):.1f}-{100 * max(sh):.1f}%)")


if __name__ == "__main__":
    main()
