#!/usr/bin/env python3
"""Where prompt processing spends its time: `perf record` of `cellm bench
MODEL --pp N` for each prompt length, reported as each function's share of
the samples of the forward pass (user-space samples, less the bandwidth
probe that `cellm bench` runs after its tests), the largest first, with the
attention kernels' total.

Usage: python3 bench/profile_pp.py [--threads 2] [--top 8] MODEL 512,2048,4096
The cellm binary is $CELLM_BIN, else build/cellm. Needs `perf` (linux-perf).
"""
import argparse
import os
import re
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLM = os.environ.get("CELLM_BIN") or os.path.join(ROOT, "build", "cellm")

# The bandwidth probe, not the forward pass.
PROBE = {"bench_read_bandwidth", "sum_part"}
# Attention: the tile kernels and softmax, and the per-query kernels and
# loop of the builds before them.
ATTENTION = re.compile(r"(dot_tile|axpy_tile|softmax|attend_tile|task_attention|dot4_f16|"
                       r"axpy_rows_f16|kv_dot|kv_axpy|_dot_f16$|scale_round_f16)")


def profile(model, pp, threads):
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "perf.data")
        out = subprocess.run(["perf", "record", "-o", data, "--", CELLM, "bench", model, "--pp",
                              str(pp), "-r", "1", "-t", str(threads), "-c", str(max(pp, 1024)),
                              "--bw-samples", "1"], capture_output=True, text=True, check=True)
        m = re.search(r"\| pp%d \| ([\d.]+)" % pp, out.stdout)
        rate = float(m.group(1)) if m else float("nan")
        rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol",
                              "-g", "none", "--percent-limit", "0.05"],
                             capture_output=True, text=True, check=True).stdout
    rows = []
    for line in rep.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+\[(.)\]\s+(\S+)", line)
        if m and m.group(2) == "." and m.group(3) not in PROBE:
            rows.append((float(m.group(1)), m.group(3)))
    total = sum(p for p, _ in rows)
    return rate, [(100 * p / total, s) for p, s in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("lengths")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    for pp in [int(x) for x in a.lengths.split(",")]:
        rate, rows = profile(a.model, pp, a.threads)
        att = sum(p for p, s in rows if ATTENTION.search(s))
        top = ", ".join(f"{s} {p:.1f}%" for p, s in rows[:a.top])
        print(f"| {a.model} | pp{pp} | {rate:.1f} | {att:.1f}% | {top} |", flush=True)


if __name__ == "__main__":
    main()
