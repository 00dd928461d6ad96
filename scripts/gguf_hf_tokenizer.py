#!/usr/bin/env python3
"""A Hugging Face tokenizer directory built from a GGUF file's own
vocabulary, for tools that want `AutoTokenizer.from_pretrained(DIR)` with
no network (lm-evaluation-harness's `local-completions` needs one to count
context tokens). transformers' own GGUF loader imports torch; this needs
only the `gguf` and `tokenizers` packages (and transformers to save the
directory).

Two vocabularies, the kinds cellm's real models use:
- `gpt2` (byte-level BPE with merges; SmolLM2, Llama 3, Qwen): the GGUF's
  merges; pre-tokenizer digits one by one then GPT-2's split (llama.cpp's
  `smollm` / `gpt2` regexes), byte-level decoding.
- `llama` (SentencePiece BPE with scores; Gemma, Llama 2, Mistral): merges
  rebuilt from the scores (a pair's rank is its merged piece's score, best
  first, as SentencePiece merges), spaces as U+2581, byte fallback.
Control tokens become special added tokens; user-defined ones (Gemma's
runs of spaces and newlines, its HTML tags) added tokens matched before
the model, as llama.cpp matches them.

The result is checked, not trusted: scripts/lmeval_compare.py compares its
token ids with the servers' own /tokenize on every string it scores.

Usage: python3 scripts/gguf_hf_tokenizer.py MODEL.gguf OUTDIR
"""
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's pre-tokenizer names whose first step splits every digit alone.
DIGIT_PRES = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER, TOKEN_BYTE = 1, 3, 4, 6


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def _spm_merges(tokens, scores, types):
    """SentencePiece BPE merges from piece scores: every split of a normal
    piece into two pieces of the vocabulary is a merge, ranked by the whole
    piece's score (higher first; ties by id)."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] == TOKEN_NORMAL}
    ranked = []
    for t, i in ids.items():
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in ids and b in ids:
                ranked.append((-scores[i], i, ids[a], ids[b], a, b))
    ranked.sort()
    return [(a, b) for _, _, _, _, a, b in ranked]


def build(gguf_path):
    """(tokenizers.Tokenizer, bos text or None, eos text or None, add_bos)."""
    r = gguf.GGUFReader(gguf_path)
    kind = _field(r, "tokenizer.ggml.model")
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    bos_id = _field(r, "tokenizer.ggml.bos_token_id")
    eos_id = _field(r, "tokenizer.ggml.eos_token_id")
    add_bos = bool(_field(r, "tokenizer.ggml.add_bos_token", kind == "llama"))
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges")]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        split = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if _field(r, "tokenizer.ggml.pre", "default") in DIGIT_PRES:
            split.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(split)
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        if _field(r, "tokenizer.ggml.add_space_prefix", True):
            sys.exit(f"{gguf_path}: add_space_prefix SentencePiece vocabularies are not handled")
        scores = _field(r, "tokenizer.ggml.scores")
        merges = _spm_merges(tokens, scores, types)
        unk = _field(r, "tokenizer.ggml.unknown_token_id")
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                   unk_token=tokens[unk] if unk is not None else None))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    else:
        sys.exit(f"{gguf_path}: tokenizer model {kind!r} is not handled")
    added = []
    for i, t in enumerate(tokens):
        if types[i] == TOKEN_CONTROL:
            added.append(AddedToken(t, special=True, normalized=False))
        elif types[i] == TOKEN_USER:
            added.append(AddedToken(t, special=False, normalized=False))
    tok.add_tokens(added)
    bos = tokens[bos_id] if bos_id is not None and bos_id >= 0 else None
    eos = tokens[eos_id] if eos_id is not None and eos_id >= 0 else None
    return tok, bos, eos, add_bos


def write_dir(gguf_path, out_dir):
    """Writes tokenizer.json and tokenizer_config.json into out_dir (made
    if missing) for AutoTokenizer.from_pretrained; returns out_dir."""
    tok, bos, eos, add_bos = build(gguf_path)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
           "add_bos_token": add_bos, "clean_up_tokenization_spaces": False,
           "model_max_length": 1 << 20}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(write_dir(sys.argv[1], sys.argv[2]))
