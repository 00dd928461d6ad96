/*
 * tok_internal.h — the inside of a tokenizer, shared by tokenizer.c (loading,
 * special tokens, decoding), tok_bpe.c (pre-tokenizers and BPE merges) and
 * tok_spm.c (SentencePiece merges). Nothing outside these files includes it.
 */
#ifndef CELLM_TOK_INTERNAL_H
#define CELLM_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "text/tokenizer.h"

typedef enum tok_kind { TOK_KIND_SPM, TOK_KIND_BPE } tok_kind;

/* Pre-tokenizers, as llama.cpp groups tokenizer.ggml.pre names. */
typedef enum tok_pre {
    TOK_PRE_NONE,    /* SentencePiece: no pre-tokenizer */
    TOK_PRE_DEFAULT, /* punctuation runs, GPT-2 rule, digit runs, digit triples */
    TOK_PRE_GPT2,    /* the GPT-2 rule */
    TOK_PRE_SMOLLM,  /* each digit alone, then the GPT-2 rule (also starcoder, refact) */
    TOK_PRE_LLAMA3,  /* the Llama 3 rule, digits in threes */
    TOK_PRE_QWEN2,   /* the Llama 3 rule, digits one by one */
} tok_pre;

/* Token attributes: how a token behaves, from its type plus the fix-ups
 * llama.cpp applies by name (see tokenizer.c). Bits, as llama.cpp's. */
enum {
    TOK_ATTR_NORMAL = 1u << 0,
    TOK_ATTR_UNKNOWN = 1u << 1,
    TOK_ATTR_CONTROL = 1u << 2,
    TOK_ATTR_USER = 1u << 3,
    TOK_ATTR_UNUSED = 1u << 4,
    TOK_ATTR_BYTE = 1u << 5,
    /* Not llama.cpp's: the token's decoded bytes are its text, so no copy
     * of them is kept in `piece`. */
    TOK_ATTR_PIECE_IS_TEXT = 1u << 7,
};

/* An open-addressing hash table from keys to indexes 0..n-1, one 32-bit
 * word a slot: the low `idx_bits` bits hold index + 1 (0 = empty), the rest
 * the top bits of the key's hash, to skip most compares. The keys live
 * elsewhere (token texts, merges): the table holds only their indexes. */
typedef struct tok_index {
    uint32_t *slot;
    uint32_t mask;     /* slot count - 1 */
    uint32_t idx_mask; /* (1 << idx_bits) - 1 */
} tok_index;

struct tokenizer {
    tok_kind kind;
    tok_pre pre;
    char pre_name[32];

    int32_t n_vocab;
    /* Token texts: the file's own strings (the gguf_file's array, pointing
     * into its memory) where none is empty; otherwise a copy (strs_own,
     * text_own) where an empty text becomes "[EMPTY_<id>]". */
    const gguf_str *strs;
    gguf_str *strs_own;
    char *text_own;
    /* Scores: the file's F32 array in place (score_f32, maybe unaligned),
     * or converted to score_own; neither when the file has none (all 0). */
    const uint8_t *score_f32;
    float *score_own;
    uint8_t *type; /* n_vocab tok_type values, as in the file */
    uint8_t *attr; /* n_vocab TOK_ATTR_* masks */
    /* Decoded bytes of the tokens whose bytes differ from their text
     * (TOK_ATTR_PIECE_IS_TEXT unset), back to back: token id's are
     * piece[piece_off[id] .. piece_off[id + 1]); the others take no room. */
    char *piece;
    uint32_t *piece_off;
    size_t max_piece;

    tok_index vocab; /* token text -> id */

    /* BPE merges: merge i joins merge_text[merge_off[i] ..][0..merge_split[i])
     * and the rest up to merge_off[i + 1]; its rank is i. */
    int32_t n_merges;
    char *merge_text;
    uint32_t *merge_off;
    uint32_t *merge_split;
    tok_index merges;

    /* Special tokens (control, user-defined, unknown) as a trie whose edges
     * are a hash table keyed by (node, byte), at most half full. */
    int32_t n_nodes;
    int32_t *node_tok;  /* n_nodes: the token ending at each node, or -1 */
    uint64_t *edge_key; /* (node << 8 | byte) + 1; 0 = empty */
    int32_t *edge_child;
    uint32_t edge_mask;
    size_t max_special; /* longest special token, in bytes */
    /* first[k][L]: bitmap of the bytes a special token of length L starts
     * with (L = 0: of any length); k = 0 counts the tokens recognised
     * without TOK_PARSE_SPECIAL (user-defined), k = 1 all of them. */
    uint8_t (*first[2])[32];
    bool has_special[2];

    int32_t bos, eos, unk;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t byte_tok[256]; /* token of each byte (<0xNN> or its BPE char), or -1 */
};

static inline const char *tok_text(const tokenizer *t, int32_t id) {
    return t->strs[id].ptr;
}

static inline size_t tok_text_len(const tokenizer *t, int32_t id) {
    return (size_t)t->strs[id].len;
}

static inline float tok_score(const tokenizer *t, int32_t id) {
    float f = 0.0f;
    if (t->score_f32)
        memcpy(&f, t->score_f32 + (size_t)id * sizeof f, sizeof f);
    else if (t->score_own)
        f = t->score_own[id];
    return f;
}

/* A 64-bit hash of n bytes. */
uint64_t tok_hash(const void *p, size_t n);

/* The id of the token whose text is s[0..n), or -1. */
int32_t tok_vocab_find(const tokenizer *t, const char *s, size_t n);

/* The rank of the merge joining s[0..n_left) and s[n_left..n_left+n_right),
 * or -1 when there is none. */
int32_t tok_merge_rank(const tokenizer *t, const char *s, size_t n_left, size_t n_right);

/* A linked symbol of a word being merged: bytes [off, off + n) of the word;
 * n == 0 once merged into its left neighbour. */
typedef struct tok_sym {
    uint32_t off, n;
    int32_t prev, next;
} tok_sym;

/* A candidate merge of symbols left and right, `size` bytes in all.
 * `key` orders the heap: the smallest pops first. */
typedef struct tok_bigram {
    uint64_t key;
    int32_t left, right;
    uint32_t size;
} tok_bigram;

/* Scratch memory one tokenizer_encode call reuses across words. */
typedef struct tok_scratch {
    tok_sym *syms;
    size_t syms_cap;
    tok_bigram *heap;
    size_t heap_n, heap_cap;
    uint8_t *buf; /* a word's bytes (BPE: byte-mapped; SPM: escaped) */
    size_t buf_cap;
    uint32_t *cps;
    uint8_t *cls;
    size_t cps_cap, cls_cap;
    size_t *segs, *segs2;
    size_t segs_cap, segs2_cap;
} tok_scratch;

void tok_scratch_free(tok_scratch *s);
bool tok_grow(void **p, size_t *cap, size_t need, size_t elem);
bool tok_heap_push(tok_scratch *s, tok_bigram b);
tok_bigram tok_heap_pop(tok_scratch *s);

/* Encodes one stretch of text free of special tokens. */
cellm_status tok_bpe_encode(const tokenizer *t, tok_scratch *s, const uint8_t *text, size_t n,
                            tok_ids *out, cellm_error *err);
cellm_status tok_spm_encode(const tokenizer *t, tok_scratch *s, const uint8_t *text, size_t n,
                            bool space_prefix, tok_ids *out, cellm_error *err);

#endif /* CELLM_TOK_INTERNAL_H */
