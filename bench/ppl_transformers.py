#!/usr/bin/env python3
"""Perplexity of a GGUF model in Hugging Face transformers, computed the way
`cellm perplexity` (and llama.cpp's perplexity tool) does: the token ids in
chunks of C, the model's BOS in place of a chunk's first token when it adds
one, the second half of each chunk scored. transformers dequantizes the GGUF
weights and runs in float32 (TF32 off): the reference for what the weights
give with unrounded activations, against which the CPU backend's 8-bit
activations and the Vulkan backend's f32 ones are compared
(docs/benchmarks.md; scripts/gen_f32_ppl_fixtures.py makes the tests'
fixture with it).

    cellm tokenize MODEL -f TEXT --ids --no-bos > ids.txt
    python3 bench/ppl_transformers.py MODEL.gguf ids.txt 512 1024 [--bos ID]
"""
import argparse
import math
import os


def load(gguf):
    """The model in float32 on the GPU where there is one."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    path = os.path.abspath(gguf)
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                gguf_file=os.path.basename(path),
                                                dtype=torch.float32).to(dev).eval()


def perplexity(model, ids, ctx, chunks=0, bos=-1):
    """(perplexity, tokens scored, the running value after each chunk)."""
    import torch
    dev = next(model.parameters()).device
    n = len(ids) // ctx if not chunks else min(chunks, len(ids) // ctx)
    nll, count, per = 0.0, 0, []
    for k in range(n):
        chunk = ids[k * ctx:(k + 1) * ctx]
        if bos >= 0:
            chunk[0] = bos
        with torch.no_grad():
            out = model(torch.tensor([chunk], device=dev)).logits[0].float()
        lp = torch.log_softmax(out, dim=-1).double()
        for j in range(ctx // 2, ctx - 1):
            nll -= lp[j, ids[k * ctx + j + 1]].item()
            count += 1
        per.append(math.exp(nll / count))
    return math.exp(nll / count), count, per


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("ids", help="token ids, whitespace-separated (cellm tokenize --ids --no-bos)")
    ap.add_argument("ctx", type=int, nargs="+")
    ap.add_argument("--bos", type=int, default=-1, help="BOS id to put first in each chunk")
    a = ap.parse_args()
    model = load(a.gguf)
    with open(a.ids) as f:
        ids = [int(t) for t in f.read().split()]
    for c in a.ctx:
        ppl, count, per = perplexity(model, ids, c, bos=a.bos)
        print("ctx %d: %s" % (c, ",".join("[%d]%.4f" % (i + 1, v) for i, v in enumerate(per))))
        print("ctx %d: PPL = %.4f over %d tokens" % (c, ppl, count))


if __name__ == "__main__":
    main()
