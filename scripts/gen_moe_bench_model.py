#!/usr/bin/env python3
"""A random-weight Qwen 3 MoE Hugging Face folder of 1.24 GB (F16: 6 layers,
32 experts of 1024, 2 per token, hidden 1024) for the mixture-of-experts
benchmark in docs/benchmarks.md. Writes OUT/model.safetensors and
OUT/config.json; copy a tokenizer.json (e.g. tests/data/arch/qwen3moe's)
beside them, then `cellm convert OUT moe.gguf`.

Usage: python3 scripts/gen_moe_bench_model.py OUT   (needs numpy)
"""
import json
import struct
import sys

import numpy as np
out = sys.argv[1]
d, L, E, K, ff, H, KV, hd, V = 1024, 6, 32, 2, 1024, 8, 2, 128, 352
rng = np.random.default_rng(1)
names = [("model.embed_tokens.weight", (V, d)), ("lm_head.weight", (V, d)), ("model.norm.weight", (d,))]
for l in range(L):
    p = f"model.layers.{l}."
    names += [(p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,)),
              (p + "self_attn.q_proj.weight", (H * hd, d)), (p + "self_attn.k_proj.weight", (KV * hd, d)),
              (p + "self_attn.v_proj.weight", (KV * hd, d)), (p + "self_attn.o_proj.weight", (d, H * hd)),
              (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
              (p + "mlp.gate.weight", (E, d))]
    for e in range(E):
        names += [(p + f"mlp.experts.{e}.gate_proj.weight", (ff, d)),
                  (p + f"mlp.experts.{e}.up_proj.weight", (ff, d)),
                  (p + f"mlp.experts.{e}.down_proj.weight", (d, ff))]
hdr, off = {}, 0
for n, s in names:
    nb = int(np.prod(s)) * 2
    hdr[n] = {"dtype": "F16", "shape": list(s), "data_offsets": [off, off + nb]}
    off += nb
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(out + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h)
    for n, s in names:
        if len(s) == 1:
            a = np.ones(s, np.float16)
        else:
            a = ((rng.random(s, dtype=np.float32) - 0.5) * (3.4 / np.sqrt(s[-1]))).astype(np.float16)
        f.write(a.tobytes())
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": d,
       "num_hidden_layers": L, "intermediate_size": ff, "moe_intermediate_size": ff,
       "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd, "vocab_size": V,
       "num_experts": E, "num_experts_per_tok": K, "norm_topk_prob": True, "rms_norm_eps": 1e-6,
       "rope_theta": 1000000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
       "decoder_sparse_step": 1, "mlp_only_layers": [], "bos_token_id": 1, "eos_token_id": 2}
json.dump(cfg, open(out + "/config.json", "w"))
print("bytes", off)
