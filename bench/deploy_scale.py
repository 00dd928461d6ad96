#!/usr/bin/env python3
"""Throughput of 1, 2 and 3 `cellm serve` instances behind HAProxy
(deploy/haproxy.cfg, affinity on), and of one instance alone, under the
chat load of tests/deploy_e2e.py: CLIENTS concurrent clients having 3-turn
chats over 8 shared system prompts, max_tokens 4, for SECONDS.

Prints requests/s, completion tokens/s and prompt tokens computed/s for
each, and the projection for N instances on N times the cores (N x the
single instance's figure: with affinity each instance keeps its own hit
rate, and the instances share nothing). On a machine with fewer cores than
instances x threads the measured figures are bounded by the cores, not by
the balancer; say so when quoting them.

Usage: python3 bench/deploy_scale.py [--seconds 20] [--clients 32] [--threads 1]
The cellm binary is $CELLM_BIN, else build/cellm.
"""
import argparse
import os
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("CELLM_BIN", os.path.join(ROOT, "build", "cellm"))
import deploy_e2e as de  # noqa: E402


def engine_prompt_tokens(insts):
    return sum(de.metrics(i.port)["cellm_engine_prompt_tokens_total"] for i in insts)


def run_load(port, insts, tag, seconds, clients):
    p0, cpu0, t0 = engine_prompt_tokens(insts), de.cpu_seconds(insts), time.time()
    load = de.Load(port, tag, seconds, clients=clients).start().join()
    dt = time.time() - t0
    p1 = engine_prompt_tokens(insts)
    return {"req_s": load.ok / dt, "tok_s": load.completion_tokens / dt,
            "prompt_s": (p1 - p0) / dt, "cpu": de.cpu_seconds(insts) - cpu0, "s": dt,
            "lost": load.lost}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    de.INSTANCE_ARGS[de.INSTANCE_ARGS.index("-t") + 1] = str(a.threads)
    tmp = tempfile.mkdtemp(prefix="cellm-scale-")
    with open(os.path.join(ROOT, "deploy", "haproxy.cfg")) as f:
        base_cfg = f.read()
    rows = []
    single = None
    for n in (0, 1, 2, 3):  # 0: one instance alone, no balancer
        insts = [de.Instance(f"n{n}-cellm{i + 1}", tmp) for i in range(max(n, 1))]
        hap = None
        try:
            for inst in insts:
                inst.start()
            port = insts[0].port
            if n:
                cfg = os.path.join(tmp, f"haproxy{n}.cfg")
                with open(cfg, "w") as f:  # only the first n server lines
                    f.write(re.sub(r"\n    server cellm([0-9]+) [^\n]*",
                                   lambda m: m.group(0) if int(m.group(1)) <= n else "",
                                   base_cfg))
                port, rr = de.free_port(), de.free_port()
                hap = de.start_haproxy(tmp, insts, port, rr, cfg=cfg)
                de.wait_up(port, "HAProxy")
                time.sleep(2.5)
            r = run_load(port, insts, f"scale{n}", a.seconds, a.clients)
            if n == 0:
                single = r
            rows.append((n, r))
        finally:
            if hap:
                hap.kill()
                hap.wait()
            for inst in insts:
                inst.kill()
    print(f"| instances | requests/s | completion tok/s | prompt tok/s computed | "
          f"CPU-s / s | lost | projected requests/s ({a.threads} thread(s) each, own cores) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, r in rows:
        label = "1, no balancer" if n == 0 else str(n)
        proj = f"{max(n, 1) * single['req_s']:.1f}"
        print(f"| {label} | {r['req_s']:.1f} | {r['tok_s']:.1f} | {r['prompt_s']:.0f} | "
              f"{r['cpu'] / r['s']:.2f} | {r['lost']} | {proj} |")
    print(f"\n{os.cpu_count()} cores, {a.clients} clients, {a.seconds:.0f} s a run; "
          f"logs in {tmp}")


if __name__ == "__main__":
    main()
