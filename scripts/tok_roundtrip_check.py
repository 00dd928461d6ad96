#!/usr/bin/env python3
"""Tokenizers survive `cellm convert`: for each real model (SmolLM2's
byte-level BPE, Gemma 3's SentencePiece),

 1. transformers builds the tokenizer from the model's GGUF file and saves
    it as tokenizer.json (+ tokenizer_config.json);
 2. a tiny random llama model with that vocabulary is written next to it
    (numpy + safetensors) and converted by `cellm convert`;
 3. every valid-UTF-8 string of the tokenizer tests' corpus
    (scripts/gen_tok_fixtures.py: corpus()) is tokenized by `cellm
    tokenize` on the converted file and by transformers from the same
    tokenizer.json, and the ids must be identical.

Special-token text is parsed by both when the case asks for it (cellm
--special; transformers' default) and left as text otherwise (transformers'
split_special_tokens=True); neither adds BOS/EOS. Strings that are not
valid UTF-8 are skipped (transformers takes str).

Usage: python3 scripts/tok_roundtrip_check.py CELLM_BIN NAME=MODEL.gguf ...
Needs: transformers (with torch: its GGUF reader imports it), tokenizers,
safetensors, numpy, gguf. Exit status 1 on any difference.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import save_file
from transformers import AutoTokenizer, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))


def corpus():
    spec = importlib.util.spec_from_file_location("gtf", os.path.join(HERE, "gen_tok_fixtures.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.corpus()


def tiny_model(folder, n_vocab):
    """A one-layer llama with random weights and this vocabulary size."""
    rng = np.random.default_rng(0)
    d, ff = 64, 128
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
           "intermediate_size": ff, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 4, "vocab_size": n_vocab, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 2048, "rope_theta": 10000.0, "tie_word_embeddings": True}
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float16)
    t = {"model.embed_tokens.weight": w(n_vocab, d), "model.norm.weight": np.ones(d, np.float16),
         "model.layers.0.input_layernorm.weight": np.ones(d, np.float16),
         "model.layers.0.post_attention_layernorm.weight": np.ones(d, np.float16)}
    for p in ("q", "k", "v", "o"):
        t[f"model.layers.0.self_attn.{p}_proj.weight"] = w(d, d)
    t["model.layers.0.mlp.gate_proj.weight"] = w(ff, d)
    t["model.layers.0.mlp.up_proj.weight"] = w(ff, d)
    t["model.layers.0.mlp.down_proj.weight"] = w(d, ff)
    save_file(t, os.path.join(folder, "model.safetensors"))


def cellm_ids(cellm, model, text_path, special):
    cmd = [cellm, "tokenize", model, "-f", text_path, "--ids", "--no-bos"]
    if special:
        cmd.append("--special")
    out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    return [int(x) for x in out.split()]


def check(cellm, name, gguf_path, tmp):
    folder = os.path.join(tmp, name)
    os.makedirs(folder)
    os.symlink(os.path.abspath(gguf_path), os.path.join(tmp, name + ".gguf"))
    tok = AutoTokenizer.from_pretrained(tmp, gguf_file=name + ".gguf")
    tok.save_pretrained(folder)
    assert os.path.exists(os.path.join(folder, "tokenizer.json"))
    ref = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    n_vocab = max(json.load(open(os.path.join(folder, "tokenizer.json")))["model"]["vocab"]
                  .values()) + 1
    n_vocab = max([n_vocab] + [a["id"] + 1 for a in
                               json.load(open(os.path.join(folder, "tokenizer.json")))
                               ["added_tokens"]])
    tiny_model(folder, n_vocab)
    out = os.path.join(tmp, name + "-converted.gguf")
    subprocess.run([cellm, "convert", folder, out, "--type", "f16"], check=True,
                   capture_output=True)
    cases = corpus()
    text_path = os.path.join(tmp, "case.txt")
    n, bad, skipped = 0, 0, 0
    for b, flags in cases:
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        special = bool(flags & 2)
        with open(text_path, "wb") as f:
            f.write(b)
        got = cellm_ids(cellm, out, text_path, special)
        want = ref(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"]
        n += 1
        if got != want:
            bad += 1
            if bad <= 5:
                print(f"  {name}: {text[:60]!r} (special {special}): cellm {got[:12]} "
                      f"transformers {want[:12]}")
    print(f"{name}: {type(tok).__name__} from GGUF, vocabulary {n_vocab}; {n - bad} of {n} "
          f"corpus strings tokenized identically ({skipped} invalid UTF-8 skipped)")
    return bad == 0


def main():
    cellm = sys.argv[1]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for spec in sys.argv[2:]:
            name, path = spec.split("=", 1)
            ok &= check(cellm, name, path, tmp)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
