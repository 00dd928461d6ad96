#!/usr/bin/env python3
"""cellm's Vulkan backend against Hugging Face transformers (PyTorch, CUDA)
on one GPU, the same GGUF file and the same test shapes, alternating the two
in one run: the fallback reference of issue 20 where llama.cpp's Vulkan
backend cannot be built (bench/vk_vs_llama.py says why in docs/benchmarks.md).

transformers loads the GGUF file itself (`gguf_file=`; it dequantizes the
weights to float16) and runs eagerly with its dynamic KV cache, as a user of
`model(...)` gets it without compilation. The shapes are
bench/vk_vs_llama.py's: ppN is one forward pass over N prompt tokens (logits
of the last row); tgN is N single-token steps after a 16-token prompt; S
sessions is a batch of S sequences with a P-token prompt each (prefill not
timed), then N steps of one token each, S*N tokens over the steps' time.
Token ids are fixed pseudo-random ones (speed does not depend on which).

Usage: python3 bench/vk_vs_transformers.py MODEL.gguf [--reps 3]
       [--pp 512,2048] [--tg 128] [--sessions 1,8,64] [-n 64] [-p 32]
Needs torch with CUDA, transformers and the gguf package; the cellm binary is
$CELLM_BIN, else build/cellm.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vk_vs_llama import cellm_sessions, cellm_single, fmt  # noqa: E402


class Torch:
    def __init__(self, path):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
            dtype=torch.float16).cuda().eval()
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(100, self.model.config.vocab_size, (1, 4096), generator=g).cuda()

    def _sync(self):
        self.torch.cuda.synchronize()

    def pp(self, n):
        with self.torch.no_grad():
            self._sync()
            t0 = time.perf_counter()
            self.model(self.ids[:, :n], use_cache=True, logits_to_keep=1)
            self._sync()
            return n / (time.perf_counter() - t0)

    def _steps(self, batch, prompt, n):
        with self.torch.no_grad():
            ids = self.ids[:, :prompt].repeat(batch, 1)
            out = self.model(ids, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            nxt = self.ids[:, prompt:prompt + 1].repeat(batch, 1)
            self._sync()
            t0 = time.perf_counter()
            for _ in range(n):
                out = self.model(nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache = out.past_key_values
            self._sync()
            return batch * n / (time.perf_counter() - t0)

    def tg(self, n):
        return self._steps(1, 16, n)

    def sessions(self, s, n, p):
        return self._steps(s, p, n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", default="512,2048")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--sessions", default="1,8,64")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-p", type=int, default=32)
    a = ap.parse_args()
    sessions = [int(x) for x in a.sessions.split(",")]
    pps = [int(x) for x in a.pp.split(",")]
    ctx = a.p + a.n + 16
    ref = Torch(a.model)
    for pp in pps:  # warm-up: kernels, allocator
        ref.pp(pp)
    ref.tg(4)
    ref.sessions(max(sessions), 2, a.p)
    res = {k: ([], []) for k in [f"pp{pp}" for pp in pps] + ["tg"] + [f"s{s}" for s in sessions]}
    for _ in range(a.reps):
        pp, tg = cellm_single(a.model, pps, a.tg)
        for n, v in zip(pps, pp):
            res[f"pp{n}"][0].append(v)
        res["tg"][0].append(tg)
        for s, v in zip(sessions, cellm_sessions(a.model, sessions, a.n, a.p, ctx)):
            res[f"s{s}"][0].append(v)
        for n in pps:
            res[f"pp{n}"][1].append(ref.pp(n))
        res["tg"][1].append(ref.tg(a.tg))
        for s in sessions:
            res[f"s{s}"][1].append(ref.sessions(s, a.n, a.p))
    print("| test | cellm tokens/s | transformers tokens/s | cellm / transformers |")
    print("| --- | ---: | ---: | ---: |")
    names = {f"pp{n}": f"pp{n}" for n in pps}
    names["tg"] = f"tg{a.tg}"
    for s in sessions:
        names[f"s{s}"] = f"{s} session{'s' if s > 1 else ''}, {a.n} tokens each (decode)"
    for k, (c, t) in res.items():
        print(f"| {names[k]} | {fmt(c)} | {fmt(t)} | "
              f"{statistics.median(c) / statistics.median(t):.2f} |")
    if 1 in sessions:
        for side, i in (("cellm", 0), ("transformers", 1)):
            one = statistics.median(res["s1"][i])
            print(f"<!-- {side}: " + ", ".join(
                f"{s} sessions {statistics.median(res[f's{s}'][i]) / one:.1f}x one"
                for s in sessions if s > 1) + " -->")


if __name__ == "__main__":
    main()
