#!/usr/bin/env python3
"""Reference data for `cellm convert` and the architecture rows: for each
model family, Hugging Face transformers builds a tiny model from a config
with random weights (no hub access), saves it as a Hugging Face folder
(config.json, sharded *.safetensors, tokenizer.json, tokenizer_config.json)
under tests/data/arch/NAME/, and records its own logits and greedy tokens in
tests/data/arch/NAME.txt:

  vocab N
  logits I N_TOK FIRST     prompt I; rows for positions FIRST..N_TOK-1
  tokens ...               the prompt's ids
  row POS v0 v1 ...        transformers' logits (float32) at POS
  greedy N_PROMPT N_GEN
  prompt ...
  gen ...                  transformers' greedy tokens (full recompute)
  gap ...                  its top-1 minus top-2 logit at each step

The weights are drawn so activations and logits have a useful spread
(matrices ~ N(0, 1/fan_in), norm weights near 1, biases nonzero), which
keeps greedy choices well separated. For mixture-of-experts families the
seed must also keep every router decision clear (the k-th and (k+1)-th
expert's router logits at least MIN_ROUTE_GAP apart), or F16 weights could
send a token to another expert. One family (qwen3) is saved in
bfloat16 to exercise that input type; its reference runs in float32 on the
bfloat16 values. The tokenizer is a small byte-level BPE trained here on a
fixed text, so the folders stay small; the real tokenizers are tested
elsewhere (scripts/tok_roundtrip_check.py).

Needs: torch, transformers, tokenizers, safetensors.
Usage: python3 scripts/gen_arch_fixtures.py [OUT_DIR [NAME ...]]  (default tests/data/arch, all)
"""
import json
import math
import os
import sys

import importlib

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. def fib(n): return n if n < 2 else "
    "fib(n - 1) + fib(n - 2)  # 0 1 1 2 3 5 8 13 21 34 55 89 144. The quick brown fox jumps "
    "over the lazy dog! Prices: milk 1.19, eggs 2.89, flour 0.79; total 4.87 euros. "
) * 8
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
VOCAB = 352  # the tokenizer has fewer: the rest are padding rows, as real models have
N_GEN = 32


def make_tokenizer(out_dir):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", unk_token=None,
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return tok.get_vocab_size()


def randomize(model, gen):
    """Weights with a spread: see the module comment. The fan-in is the last
    dimension (also of stacked expert matrices and of depthwise convolution
    kernels)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "lm_head" in name:
                p.copy_(4.0 * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))


def is_router(name):
    return name.endswith("mlp.gate.weight") or "router" in name


COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def hf(name):
    """A transformers class by name, or None when this version lacks it."""
    return getattr(transformers, name, None)


MOE = dict(COMMON, intermediate_size=32)


def families():
    """NAME -> (config, model class, saved dtype)."""
    f = {}
    # SmolLM3: no RoPE in every 4th layer (its default no_rope_layers).
    if hf("SmolLM3Config"):
        f["smollm3"] = (hf("SmolLM3Config")(**dict(COMMON, num_hidden_layers=4), rope_theta=10000.0,
                                            tie_word_embeddings=True, use_sliding_window=False,
                                            no_rope_layer_interval=4),
                        hf("SmolLM3ForCausalLM"), torch.float32)
    # Mixture-of-experts: 8 experts of 32, 2 routed per token.
    if hf("Qwen3MoeConfig"):
        f["qwen3moe"] = (hf("Qwen3MoeConfig")(**MOE, head_dim=32, rope_theta=1000000.0,
                                              tie_word_embeddings=False, attention_bias=False,
                                              num_experts=8, num_experts_per_tok=2,
                                              moe_intermediate_size=32, norm_topk_prob=True,
                                              decoder_sparse_step=1, mlp_only_layers=[]),
                         hf("Qwen3MoeForCausalLM"), torch.float32)
    if hf("OlmoeConfig"):
        # As many KV heads as heads, as real OLMoE has (llama.cpp's olmoe
        # takes no grouped-query attention).
        f["olmoe"] = (hf("OlmoeConfig")(**dict(MOE, num_key_value_heads=4), rope_theta=10000.0,
                                        tie_word_embeddings=False,
                                        num_experts=8, num_experts_per_tok=2,
                                        norm_topk_prob=False, clip_qkv=None),
                      hf("OlmoeForCausalLM"), torch.float32)
    if hf("GraniteMoeConfig"):
        f["granitemoe"] = (hf("GraniteMoeConfig")(**MOE, rope_theta=10000.0,
                                                  tie_word_embeddings=True,
                                                  num_local_experts=8, num_experts_per_tok=2,
                                                  embedding_multiplier=12.0,
                                                  residual_multiplier=0.22,
                                                  attention_multiplier=0.0078125,
                                                  logits_scaling=8.0),
                           hf("GraniteMoeForCausalLM"), torch.float32)
    # LFM2: short-convolution blocks (kernel 3) and attention blocks.
    if hf("Lfm2Config"):
        f["lfm2"] = (hf("Lfm2Config")(**dict(COMMON, num_hidden_layers=4), rope_theta=1000000.0,
                                      tie_word_embeddings=True, conv_L_cache=3, conv_bias=False,
                                      block_auto_adjust_ff_dim=False, norm_eps=1e-5,
                                      layer_types=["conv", "full_attention", "conv",
                                                   "full_attention"],
                                      full_attn_idxs=[1, 3]),
                     hf("Lfm2ForCausalLM"), torch.float32)
    f["llama"] = (LlamaConfig(**COMMON, rope_theta=10000.0, tie_word_embeddings=False),
                  LlamaForCausalLM, torch.float32)
    # Llama 3.1's RoPE scaling, with an original length small enough that
    # the pairs fall in all three bands (kept, blended, divided).
    f["llama-rope3"] = (LlamaConfig(**COMMON, rope_theta=10000.0, tie_word_embeddings=False,
                                    rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 64}),
                        LlamaForCausalLM, torch.float32)
    # Mistral with a sliding window shorter than the long prompt.
    f["mistral"] = (MistralConfig(**COMMON, rope_theta=10000.0, sliding_window=16,
                                  tie_word_embeddings=False), MistralForCausalLM, torch.float32)
    # Mistral 7B v0.1's window of 4096, longer than any sequence here: what
    # real Mistral files are at the lengths llama.cpp (which has no window
    # for the llama architecture) can be compared at.
    f["mistral-wide"] = (MistralConfig(**COMMON, rope_theta=10000.0, sliding_window=4096,
                                       tie_word_embeddings=False), MistralForCausalLM,
                         torch.float32)
    f["qwen2"] = (Qwen2Config(**COMMON, rope_theta=1000000.0, tie_word_embeddings=True,
                              use_sliding_window=False), Qwen2ForCausalLM, torch.float32)
    f["qwen3"] = (Qwen3Config(**COMMON, head_dim=32, rope_theta=1000000.0,
                              tie_word_embeddings=True, attention_bias=False),
                  Qwen3ForCausalLM, torch.bfloat16)
    f["phi3"] = (Phi3Config(**COMMON, rope_theta=10000.0, tie_word_embeddings=False,
                            sliding_window=None, rope_scaling=None), Phi3ForCausalLM,
                 torch.float32)
    # Phi-3 with LongRoPE factors (sequences here stay under the original
    # context length, so the short factors apply; 512 is above the 256
    # llama.cpp rounds its context up to, so it picks the short ones too).
    hd2 = 64 // 4 // 2
    f["phi3-longrope"] = (Phi3Config(**dict(COMMON, max_position_embeddings=4096),
                                     original_max_position_embeddings=512, rope_theta=10000.0,
                                     tie_word_embeddings=False, sliding_window=None,
                                     rope_scaling={"type": "longrope",
                                                   "short_factor": [1.0 + 0.25 * i for i in range(hd2)],
                                                   "long_factor": [2.0 + 0.5 * i for i in range(hd2)]}),
                          Phi3ForCausalLM, torch.float32)
    f["granite"] = (GraniteConfig(**COMMON, rope_theta=10000.0, tie_word_embeddings=True,
                                  embedding_multiplier=12.0, residual_multiplier=0.22,
                                  attention_multiplier=0.0078125, logits_scaling=8.0),
                    GraniteForCausalLM, torch.float32)
    # Gemma 3 (text): six layers so the pattern has its global layer
    # (every 6th), a window shorter than the long prompt, (1 + w) norms.
    g = dict(COMMON, num_hidden_layers=6, head_dim=16)
    f["gemma3"] = (Gemma3TextConfig(**g, sliding_window=16, query_pre_attn_scalar=16,
                                    rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                    tie_word_embeddings=True, final_logit_softcapping=None,
                                    attn_logit_softcapping=None),
                   Gemma3ForCausalLM, torch.float32)
    # Gemma 3 4B's linear RoPE scaling, which applies to the global layers
    # only (every 6th).
    f["gemma3-scaled"] = (Gemma3TextConfig(**g, sliding_window=16, query_pre_attn_scalar=16,
                                           rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                           rope_scaling={"rope_type": "linear", "factor": 8.0},
                                           tie_word_embeddings=True,
                                           final_logit_softcapping=None,
                                           attn_logit_softcapping=None),
                          Gemma3ForCausalLM, torch.float32)
    return f


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def gen_family(name, cfg, cls, dtype, root, n_tok):
    """Tries seeds until every greedy step is separated by MIN_GAP (so f16
    weights cannot flip a choice: what the test checks is the forward pass,
    not coin tosses between near-equal logits)."""
    for seed in range(sum(map(ord, name)), sum(map(ord, name)) + SEEDS):
        if gen_seed(name, cfg, cls, dtype, root, n_tok, seed):
            return
    raise SystemExit(f"{name}: no seed of {SEEDS} gave greedy gaps of {MIN_GAP} and router gaps "
                     f"of {MIN_ROUTE_GAP}")


MIN_GAP = 0.1
SEEDS = 3000  # tried per family; a mixture's routers need many to clear every choice
MIN_ROUTE_GAP = 0.01  # routers: k-th minus (k+1)-th logit, every token and layer


class RouteWatch:
    """Records the smallest margin between the last chosen and the first
    left-out expert's router logit over every router call, so a seed whose
    expert choice F16 rounding could flip is refused like a greedy near-tie."""

    def __init__(self, model, cfg):
        self.k = getattr(cfg, "num_experts_per_tok", 0)
        self.gap = math.inf
        self.hooks = []
        for name, mod in model.named_modules():
            w = getattr(mod, "weight", None)
            if (self.k and isinstance(w, torch.Tensor) and w.dim() == 2
                    and is_router(name + ".weight")):
                self.hooks.append(mod.register_forward_hook(self.hook))

    def hook(self, mod, inp, out):
        x = inp[0].reshape(-1, inp[0].shape[-1]).float()
        lg = x @ mod.weight.float().t()
        top = torch.topk(lg, self.k + 1, dim=-1).values
        self.gap = min(self.gap, float((top[:, self.k - 1] - top[:, self.k]).min()))


def gen_seed(name, cfg, cls, dtype, root, n_tok, seed):
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(out):
        os.remove(os.path.join(out, fn))
    gen = torch.Generator().manual_seed(seed)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    randomize(model, gen)
    if dtype != torch.float32:
        model = model.to(dtype)
    # Small shards, so the converter meets an index and several files.
    model.save_pretrained(out, safe_serialization=True, max_shard_size="200KB")
    make_tokenizer(out)
    model = model.float()  # the reference runs in float32 on the saved values
    watch = RouteWatch(model, cfg)
    lines = [f"# transformers reference for a random {name} model (seed {seed}); "
             f"made by scripts/gen_arch_fixtures.py", f"vocab {VOCAB}"]
    prompts = [(torch.randint(0, n_tok, (7,), generator=gen).tolist(), 0),
               (torch.randint(0, n_tok, (40,), generator=gen).tolist(), 24)]
    for i, (ids, first) in enumerate(prompts):
        lg = logits_of(model, ids)
        lines.append(f"logits {i} {len(ids)} {first}")
        lines.append("tokens " + " ".join(map(str, ids)))
        for pos in range(first, len(ids)):
            lines.append(f"row {pos} " + " ".join(f"{v:.5f}" for v in lg[pos].tolist()))
    ids = torch.randint(0, n_tok, (5,), generator=gen).tolist()
    seq, gaps = list(ids), []
    for _ in range(N_GEN):
        last = logits_of(model, seq)[-1]
        top = torch.topk(last, 2)
        seq.append(int(top.indices[0]))
        gaps.append(float(top.values[0] - top.values[1]))
    if min(gaps) < MIN_GAP or watch.gap < MIN_ROUTE_GAP:
        return False
    lines.append(f"greedy {len(ids)} {N_GEN}")
    lines.append("prompt " + " ".join(map(str, ids)))
    lines.append("gen " + " ".join(map(str, seq[len(ids):])))
    lines.append("gap " + " ".join(f"{g:.4f}" for g in gaps))
    with open(os.path.join(root, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    size = sum(os.path.getsize(os.path.join(out, fn)) for fn in os.listdir(out))
    print(f"{name}: seed {seed}, {len(os.listdir(out))} files, {size} bytes; "
          f"min greedy gap {min(gaps):.4f}" +
          (f", min router gap {watch.gap:.4f}" if watch.hooks else ""))
    return True


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "data", "arch")
    os.makedirs(root, exist_ok=True)
    torch.manual_seed(0)
    n_tok = make_tokenizer(os.path.join(root, ".tok"))
    only = sys.argv[2:]  # family names to make (default: all)
    fams = families()
    missing = [n for n in only if n not in fams]
    if missing:
        print("not in this transformers:", " ".join(missing))
    for name, (cfg, cls, dtype) in fams.items():
        if not only or name in only:
            try:
                gen_family(name, cfg, cls, dtype, root, n_tok)
            except (SystemExit, Exception) as e:  # report it, make the others
                print(f"{name}: FAILED: {e!r}")
    for fn in os.listdir(os.path.join(root, ".tok")):
        os.remove(os.path.join(root, ".tok", fn))
    os.rmdir(os.path.join(root, ".tok"))
    with open(os.path.join(root, "VERSIONS"), "w") as f:
        import transformers
        f.write(json.dumps({"torch": torch.__version__,
                            "transformers": transformers.__version__}) + "\n")


if __name__ == "__main__":
    main()
