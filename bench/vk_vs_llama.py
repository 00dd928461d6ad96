#!/usr/bin/env python3
"""cellm's Vulkan backend against llama.cpp's, side by side on one GPU, the
same GGUF file and the same test shapes, alternating the two in one run.

Each repetition runs, for cellm, `cellm bench MODEL --device vulkan --pp PP
--tg TG -r 1 --json` and `cellm bench MODEL --device vulkan -s LIST -n N -p P
-c CTX --ignore-eos` (a fresh process each: load, one warm-up, the tests),
and for llama.cpp the same shapes through llama-cpp-python's low-level API
on a context with every layer on the GPU (one load for the whole run, a
warm-up pass first):
  - ppPP: one batch of PP prompt tokens into an empty cache (logits of the
    last row), timed around llama_decode;
  - tgTG: TG single-token decodes after a 16-token prompt;
  - S sessions: S sequences with a P-token prompt each (one prefill, not
    timed), then N steps of one token per sequence in one batch: S*N tokens
    over the steps' time, as cellm's "decode tok/s".
Tokens fed after the prompt are a fixed id (speed does not depend on which).
Prints markdown tables: the median and range (min-max) of each figure and
the ratio cellm / llama.cpp.

llama-cpp-python built with Vulkan must be importable (nothing of it is
committed): here, after `apt-get install libvulkan-dev glslc spirv-headers`,
  CMAKE_ARGS="-DGGML_VULKAN=on -DGGML_NATIVE=OFF" pip wheel --no-deps \
      llama_cpp_python-0.3.36.tar.gz
and the wheel carried to the GPU machine with Debian's libvulkan.so.1.
Usage: python3 bench/vk_vs_llama.py MODEL.gguf [--reps 3] [--pp 512,2048]
       [--tg 128] [--sessions 1,8,64] [-n 64] [-p 32]
The cellm binary is $CELLM_BIN, else build/cellm.
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


def fmt(xs):
    return f"{statistics.median(xs):,.1f} ({min(xs):,.1f}-{max(xs):,.1f})"


def run_cellm(args):
    r = subprocess.run([CELLM] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"cellm {' '.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r.stdout


def cellm_single(model, pps, tg):
    out = run_cellm(["bench", model, "--device", "vulkan", "--pp", ",".join(map(str, pps)), "--tg",
                     str(tg), "-r", "1", "--bw-samples", "1", "--json"])
    tests = {t["test"]: t["tokens_per_s"]["median"] for t in json.loads(out)["tests"]}
    return [tests[f"pp{pp}"] for pp in pps], tests[f"tg{tg}"]


def cellm_sessions(model, sessions, n, p, ctx):
    out = run_cellm(["bench", model, "--device", "vulkan", "-s", ",".join(map(str, sessions)), "-n",
                     str(n), "-p", str(p), "-c", str(ctx), "-m", "4G", "--ignore-eos"])
    got = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s", line)
        if m:
            got[int(m.group(1))] = float(m.group(2))
    return [got[s] for s in sessions]


class Llama:
    """A llama.cpp model and context with every layer offloaded."""

    def __init__(self, path, n_ctx, n_seq):
        import llama_cpp as L
        self.L = L
        self._quiet = L.llama_log_callback(lambda level, text, user: None)  # kept alive
        L.llama_log_set(self._quiet, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 999
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.kv_unified = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp could not make a context")
        self.n_batch = 512
        self.batch = L.llama_batch_init(max(512, n_seq), 0, n_seq)
        vocab = L.llama_model_get_vocab(self.model)
        text = open(os.path.join(ROOT, "tests", "data", "genesis-kjv-start.txt"), "rb").read()
        buf = (L.llama_token * 8192)()
        n = L.llama_tokenize(vocab, text, len(text), buf, 8192, True, False)
        self.text = list(buf[:n])

    def clear(self):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, rows):
        """rows: (token, pos, seq, logits) tuples, fed in batches of n_batch."""
        for k in range(0, len(rows), self.n_batch):
            part = rows[k:k + self.n_batch]
            b = self.batch
            for i, (tok, pos, seq, want) in enumerate(part):
                b.token[i] = tok
                b.pos[i] = pos
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = 1 if want else 0
            b.n_tokens = len(part)
            if self.L.llama_decode(self.ctx, b) != 0:
                raise SystemExit("llama_decode failed")
        self.L.llama_synchronize(self.ctx)

    def pp(self, n):
        self.clear()
        rows = [(t, i, 0, i == n - 1) for i, t in enumerate(self.text[:n])]
        t0 = time.perf_counter()
        self.decode(rows)
        return n / (time.perf_counter() - t0)

    def tg(self, n, prompt=16):
        self.clear()
        self.decode([(t, i, 0, i == prompt - 1) for i, t in enumerate(self.text[:prompt])])
        t0 = time.perf_counter()
        for k in range(n):
            self.decode([(198, prompt + k, 0, True)])
        return n / (time.perf_counter() - t0)

    def sessions(self, s, n, p):
        self.clear()
        self.decode([(t, i, q, i == p - 1) for q in range(s) for i, t in enumerate(self.text[:p])])
        t0 = time.perf_counter()
        for k in range(n):
            self.decode([(198, p + k, q, True) for q in range(s)])
        return s * n / (time.perf_counter() - t0)


def parse_args():
    """The options both comparisons take (see the usage above)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", default="512,2048")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--sessions", default="1,8,64")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-p", type=int, default=32)
    a = ap.parse_args()
    a.sessions = [int(x) for x in a.sessions.split(",")]
    a.pp = [int(x) for x in a.pp.split(",")]
    a.ctx = a.p + a.n + 16  # a session's positions, both sides
    return a


def compare(a, ref, label):
    """Warms `ref` up (pp, tg and sessions methods, tokens/s each), then
    alternates cellm and it a.reps times and prints the markdown table."""
    for pp in a.pp:  # warm-up: pipelines, kernels, allocations
        ref.pp(pp)
    ref.tg(4)
    ref.sessions(max(a.sessions), 2, a.p)
    res = {k: ([], []) for k in [f"pp{n}" for n in a.pp] + ["tg"] + [f"s{s}" for s in a.sessions]}
    for _ in range(a.reps):
        pp, tg = cellm_single(a.model, a.pp, a.tg)
        for n, v in zip(a.pp, pp):
            res[f"pp{n}"][0].append(v)
        res["tg"][0].append(tg)
        for s, v in zip(a.sessions, cellm_sessions(a.model, a.sessions, a.n, a.p, a.ctx)):
            res[f"s{s}"][0].append(v)
        for n in a.pp:
            res[f"pp{n}"][1].append(ref.pp(n))
        res["tg"][1].append(ref.tg(a.tg))
        for s in a.sessions:
            res[f"s{s}"][1].append(ref.sessions(s, a.n, a.p))
    print(f"| test | cellm tokens/s | {label} tokens/s | cellm / {label} |")
    print("| --- | ---: | ---: | ---: |")
    names = {f"pp{n}": f"pp{n}" for n in a.pp}
    names["tg"] = f"tg{a.tg}"
    for s in a.sessions:
        names[f"s{s}"] = f"{s} session{'s' if s > 1 else ''}, {a.n} tokens each (decode)"
    for k, (c, r) in res.items():
        print(f"| {names[k]} | {fmt(c)} | {fmt(r)} | "
              f"{statistics.median(c) / statistics.median(r):.2f} |")
    if 1 in a.sessions:
        for side, i in (("cellm", 0), (label, 1)):
            one = statistics.median(res["s1"][i])
            print(f"<!-- {side}: " + ", ".join(
                f"{s} sessions {statistics.median(res[f's{s}'][i]) / one:.1f}x one"
                for s in a.sessions if s > 1) + " -->")


def main():
    a = parse_args()
    llm = Llama(a.model, max(a.ctx * max(a.sessions), max(a.pp) + 64, a.tg + 64),
                max(a.sessions))
    if len(llm.text) < max(a.pp + [a.p, 16]):
        raise SystemExit("the text is too short for the prompt")
    compare(a, llm, "llama.cpp")


if __name__ == "__main__":
    main()
