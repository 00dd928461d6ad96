#!/usr/bin/env python3
"""Writes the expected `cellm inspect --json` values for the real models,
read with the `gguf` Python package (an independent GGUF reader), to
tests/data/inspect/NAME.json. The memory figures are computed here from the
metadata with the paged cache's rule (docs/forward.md), independently of cellm's code.

Usage: pip install gguf==0.19.0
       python3 scripts/gen_inspect_fixtures.py SMOLLM2.gguf GEMMA3.gguf
"""
import json
import os
import sys

import gguf  # the registry's reference reader

# The case the test runs: `cellm inspect MODEL --json --ctx 2048 --sessions 4
# --kv-type KV --mem-budget 512M` for each KV type below.
CTX, SESSIONS, BUDGET = 2048, 4, 512 << 20
KV_TYPES = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}  # block, bytes
SWA_PERIOD = {"gemma3": 6}  # every 6th layer is global (not stored in the file)


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        return len(f.data)
    return f.parts[f.data[0]].tolist()[0]


def describe(path):
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    a = lambda k: field(r, f"{arch}.{k}")
    heads, kv_heads = a("attention.head_count"), a("attention.head_count_kv") or a("attention.head_count")
    key_len = a("attention.key_length") or a("embedding_length") // heads
    val_len = a("attention.value_length") or key_len
    by_type = {}
    for t in r.tensors:
        e = by_type.setdefault(t.tensor_type.name, {"count": 0, "bytes": 0})
        e["count"] += 1
        e["bytes"] += int(t.n_bytes)
    weights = sum(int(t.n_bytes) for t in r.tensors)
    out = {
        "file_size": os.path.getsize(path),
        "gguf_version": int(r.fields["GGUF.version"].parts[-1][0]),
        "architecture": arch,
        "parameters": sum(int(t.n_elements) for t in r.tensors),
        "hparams": {
            "context_length": a("context_length"),
            "embedding_length": a("embedding_length"),
            "block_count": a("block_count"),
            "feed_forward_length": a("feed_forward_length"),
            "head_count": heads,
            "head_count_kv": kv_heads,
            "key_length": key_len,
            "value_length": val_len,
            "sliding_window": a("attention.sliding_window") or 0,
            "rope_freq_base": a("rope.freq_base"),
            "rms_norm_eps": a("attention.layer_norm_rms_epsilon"),
        },
        "tokenizer": {
            "model": field(r, "tokenizer.ggml.model"),
            "pre": field(r, "tokenizer.ggml.pre"),
            "vocab_size": field(r, "tokenizer.ggml.tokens"),
            "bos_id": field(r, "tokenizer.ggml.bos_token_id"),
            "eos_id": field(r, "tokenizer.ggml.eos_token_id"),
            "chat_template": "tokenizer.chat_template" in r.fields,
        },
        "tensors": {"count": len(r.tensors), "bytes": weights, "by_type": by_type},
        "memory": {},
    }
    n_layers, window = a("block_count"), a("attention.sliding_window") or 0
    period = SWA_PERIOD.get(arch, 0)
    ctx = -(-CTX // 16) * 16
    for kv, (blk, nbytes) in KV_TYPES.items():
        row = lambda n: n // blk * nbytes
        per_tok = row(kv_heads * key_len) + row(kv_heads * val_len)
        kv_bytes = 0
        for layer in range(n_layers):
            local = window and (period == 0 or (layer + 1) % period != 0)
            # the window plus the 16-token block being filled
            held = min(ctx, -(-window // 16) * 16 + 16) if local else ctx
            kv_bytes += held * per_tok
        kv_bytes *= SESSIONS
        out["memory"][kv] = {
            "ctx": CTX, "sessions": SESSIONS, "weights_bytes": weights,
            "kv_bytes_per_token": n_layers * per_tok, "kv_bytes": kv_bytes,
            "total_bytes": weights + kv_bytes, "budget_bytes": BUDGET,
            "fits": weights + kv_bytes <= BUDGET,
        }
    return out


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "inspect")
    os.makedirs(out_dir, exist_ok=True)
    for path, name in zip(sys.argv[1:], ["smollm2-135m", "gemma3-270m"]):
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(describe(path), f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", name)


if __name__ == "__main__":
    main()
