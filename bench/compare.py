#!/usr/bin/env python3
"""Side-by-side speed of cellm and llama.cpp on the same GGUF files, thread
count and prompt/generation lengths, alternating the two in one run.

For each model and repetition: prompt processing of a PP-token prompt and
generation of TG tokens (greedy, past end-of-text), with cellm through
`cellm run --raw -v` and llama.cpp through llama-cpp-python (its own
eval calls, timed the same way: wall time around prompt and decode). Prints
a markdown table with the median and the spread (min-max) of each figure
and the ratio cellm / llama.cpp, and each generation rate as weight bytes
streamed per second against the read bandwidth (both from `cellm bench
--json`, measured after the model's runs; the share divides by the probe's
median pass, and the comment line under each model gives that median, the
passes' range and the buffer size). Nothing of llama.cpp is committed; it
comes from the package registry (pip install llama-cpp-python).

Usage: python3 bench/compare.py [--reps 5] [--threads 2] [--pp 512[,2048,...]]
       [--tg 128] [MODEL ...]   (store names or paths; default smollm2-135m
       gemma3-270m). With several prompt lengths, each is a run of its own
       (both engines sized to it), and generation is reported after the
       first.
The cellm binary is $CELLM_BIN, else build/cellm (e.g. CELLM_BIN=build-rel/cellm
for a release build).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLM = os.environ.get("CELLM_BIN") or os.path.join(ROOT, "build", "cellm")


def model_path(name):
    if os.path.exists(name):
        return name
    home = os.environ.get("CELLM_HOME") or os.path.expanduser("~/.cache/cellm")
    return os.path.join(home, "models", name + ".gguf")


def prompt_text(n_words):
    """The first n_words words of Genesis, starting over where it ends."""
    base = open(os.path.join(ROOT, "tests", "data", "genesis-kjv-start.txt")).read().split()
    return " ".join(base[i % len(base)] for i in range(n_words))


def cellm_run(model, text, tg, threads, ctx):
    out = subprocess.run([CELLM, "run", model, "--raw", "-p", text, "-n", str(tg), "--ignore-eos",
                          "-t", str(threads), "-c", str(ctx), "-v"],
                         capture_output=True, text=True, check=True).stderr
    m = re.search(r"prompt: (\d+) tokens, ([\d.]+) tokens/s; generation: (\d+) tokens, ([\d.]+)",
                  out)
    return int(m.group(1)), float(m.group(2)), int(m.group(3)), float(m.group(4))


def llama_run(llm, toks, tg):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks)
    t1 = time.perf_counter()
    tok = 198  # any token: decode speed does not depend on which
    t2 = time.perf_counter()
    for _ in range(tg):
        llm.eval([tok])
    t3 = time.perf_counter()
    return len(toks) / (t1 - t0), tg / (t3 - t2)


def weights_and_bandwidth(path, threads):
    """Bytes of weights a decode step reads and the read bandwidth probe of
    `threads` threads (median, min, max GB/s, passes, buffer MiB), from
    `cellm bench --json` (measured now)."""
    out = subprocess.run([CELLM, "bench", path, "--tg", "4", "-r", "1", "-t", str(threads),
                          "--json"], capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    bw = tuple(j[k] for k in ("read_bandwidth_gbs", "read_bandwidth_min_gbs",
                              "read_bandwidth_max_gbs", "read_bandwidth_samples",
                              "read_bandwidth_buffer_mib"))
    return j["weight_bytes_per_token"], bw


def fmt(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", default="512", help="prompt lengths, comma-separated")
    ap.add_argument("--tg", type=int, default=128)
    a = ap.parse_args()
    from llama_cpp import Llama

    print("| model | test | cellm tokens/s | llama.cpp tokens/s | cellm / llama.cpp "
          "| cellm, % of read bandwidth (median) | llama.cpp, % of read bandwidth (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    pps = [int(x) for x in a.pp.split(",")]
    for name in a.models:
        path = model_path(name)
        for pi, pp_len in enumerate(pps):
            ctx = max(2048, pp_len + a.tg + 16)
            llm = Llama(model_path=path, n_ctx=ctx, n_threads=a.threads,
                        n_threads_batch=a.threads, n_batch=512, n_ubatch=512, verbose=False)
            # A prompt of exactly PP tokens by cellm's (= llama.cpp's) tokenizer.
            words = pp_len
            while True:
                text = prompt_text(words)
                toks = llm.tokenize(text.encode(), add_bos=True, special=False)
                if len(toks) <= pp_len:
                    break
                words -= max(1, (len(toks) - pp_len) // 2)
            cp, ct, lp, lt = [], [], [], []
            for _ in range(a.reps):
                n_pp, pp, n_tg, tg = cellm_run(path, text, a.tg, a.threads, ctx)
                cp.append(pp)
                ct.append(tg)
                p, t = llama_run(llm, toks, a.tg)
                lp.append(p)
                lt.append(t)
            del llm
            print(f"| {name} | pp{len(toks)} | {fmt(cp)} | {fmt(lp)} | "
                  f"{statistics.median(cp) / statistics.median(lp):.2f} | | |", flush=True)
            if pi:
                continue
            wbytes, (bw, bw_lo, bw_hi, bw_n, bw_mib) = weights_and_bandwidth(path, a.threads)
            share = [f"{100 * wbytes * statistics.median(x) / 1e9 / bw:.1f}%" for x in (ct, lt)]
            print(f"| {name} | tg{a.tg} | {fmt(ct)} | {fmt(lt)} | "
                  f"{statistics.median(ct) / statistics.median(lt):.2f} | {share[0]} | {share[1]} |")
            print(f"<!-- {name}: {wbytes / 2**20:.1f} MiB of weights per token; read bandwidth "
                  f"with {a.threads} threads: median {bw:.2f} GB/s (range {bw_lo:.2f}-{bw_hi:.2f}, "
                  f"{bw_n} passes over {bw_mib} MiB), which the shares divide by -->", flush=True)

if __name__ == "__main__":
    main()
