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
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vk_vs_llama import compare, parse_args  # noqa: E402


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
    a = parse_args()
    compare(a, Torch(a.model), "transformers")


if __name__ == "__main__":
    main()
