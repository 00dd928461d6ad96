#!/usr/bin/env python3
"""Prompt and generation speed of llama.cpp's llama-server on one GGUF file,
from the server's own timings, for side-by-side runs with `cellm bench`
(docs/benchmarks.md, "Against llama.cpp's Vulkan backend").

    llama_server_speed.py SERVER MODEL TEXT [--pp 512,2048] [--tg 128]
                          [-r 5] [--ngl 99] [--port 8089] [-t THREADS]

SERVER is a llama-server binary (one built with its Vulkan backend, for
the GPU comparison); TEXT a file whose first tokens make the prompts. The
server runs one slot; each measurement is one request with the prompt cache
off: a prompt of N tokens and one token out (`timings.prompt_per_second`:
what `cellm bench --pp N` measures), then a one-token prompt and 128 tokens
out with EOS ignored (`timings.predicted_per_second`: `--tg 128`). One
warm-up request of each kind comes first; the median and the range of the
repetitions are printed as `cellm bench` prints them.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request


def post(port, path, body, timeout=600):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(port, proc, limit=300):
    end = time.time() + limit
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    sys.exit("llama-server did not become ready")


def completion(port, prompt, n_predict):
    out = post(
        port,
        "/completion",
        {
            "prompt": prompt,
            "n_predict": n_predict,
            "cache_prompt": False,
            "ignore_eos": True,
            "temperature": 0,
        },
    )
    return out["timings"]


def row(name, xs):
    med = statistics.median(xs)
    print(f"| {name} | {med:.1f} | {min(xs):.1f}-{max(xs):.1f} | {len(xs)} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--pp", default="512")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--ngl", default="99")
    ap.add_argument("--port", type=int, default=8089)
    ap.add_argument("-t", type=int, default=0)
    a = ap.parse_args()
    pps = [int(x) for x in a.pp.split(",") if x]
    cmd = [a.server, "-m", a.model, "-ngl", a.ngl, "-c", str(max(pps + [a.tg]) + 64)]
    cmd += ["-np", "1", "--host", "127.0.0.1", "--port", str(a.port)]
    if a.t:
        cmd += ["-t", str(a.t)]
    log = open("/tmp/llama-server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(a.port, proc)
        text = open(a.text, encoding="utf-8").read()
        toks = post(a.port, "/tokenize", {"content": text})["tokens"]
        while len(toks) < max(pps):
            toks += toks
        print("| test | tokens/s | range | runs |")
        print("| --- | ---: | ---: | ---: |")
        for n in pps:
            completion(a.port, toks[:n], 1)
            xs = []
            for _ in range(a.r):
                t = completion(a.port, toks[:n], 1)
                if t["prompt_n"] != n:
                    sys.exit(f"the server took {t['prompt_n']} prompt tokens, not {n}")
                xs.append(t["prompt_per_second"])
            row(f"pp{n}", xs)
        if a.tg:
            completion(a.port, toks[:1], a.tg)
            xs = []
            for _ in range(a.r):
                t = completion(a.port, toks[:1], a.tg)
                if t["predicted_n"] != a.tg:
                    sys.exit(f"the server made {t['predicted_n']} tokens, not {a.tg}")
                xs.append(t["predicted_per_second"])
            row(f"tg{a.tg}", xs)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
