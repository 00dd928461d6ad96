/*
 * tokenizer.c — building a tokenizer from GGUF metadata, its lookup tables
 * (token text -> id, merge pair -> rank, the special-token trie), and the
 * top of encoding: cutting the text at special tokens and handing each
 * stretch between them to the SentencePiece or BPE encoder (tok_spm.c,
 * tok_bpe.c). Decoding lives in tok_decode.c.
 *
 * Behaviour follows llama.cpp's llama-vocab.cpp so that ids match it on the
 * same file; where that matters the comment says so.
 */
#include "text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"

/* ---- small shared helpers ---- */

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        h = (h ^ mix64(load_le64(s))) * 0x9fb21c651e98df25ull;
        s += 8;
        n -= 8;
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < n; i++) tail |= (uint64_t)s[i] << (8 * i);
    return mix64(h ^ tail ^ (n << 59));
}

bool tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    size_t bytes;
    if (!size_mul(c, elem, &bytes)) return false;
    void *q = realloc(*p, bytes);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

bool tok_ids_push(tok_ids *v, int32_t id) {
    if (v->n == v->cap && !tok_grow((void **)&v->ids, &v->cap, v->n + 1, sizeof *v->ids))
        return false;
    v->ids[v->n++] = id;
    return true;
}

void tok_ids_free(tok_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

void tok_scratch_free(tok_scratch *s) {
    free(s->syms);
    free(s->heap);
    free(s->buf);
    free(s->cps);
    free(s->cls);
    free(s->segs);
    free(s->segs2);
    memset(s, 0, sizeof *s);
}

/* A binary min-heap on bigram keys. */
bool tok_heap_push(tok_scratch *s, tok_bigram b) {
    if (!tok_grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap)) return false;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (s->heap[up].key <= b.key) break;
        s->heap[i] = s->heap[up];
        i = up;
    }
    s->heap[i] = b;
    return true;
}

tok_bigram tok_heap_pop(tok_scratch *s) {
    tok_bigram top = s->heap[0];
    tok_bigram last = s->heap[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s->heap[c + 1].key < s->heap[c].key) c++;
        if (last.key <= s->heap[c].key) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* ---- lookups ---- */

static inline uint32_t index_tag(const tok_index *x, uint64_t h) {
    return (uint32_t)(h >> 32) & ~x->idx_mask;
}

/* The index in slot v of x, or -1 for an empty slot or another key's tag. */
static inline int32_t index_at(const tok_index *x, uint32_t v, uint32_t tag) {
    return (v & ~x->idx_mask) == tag ? (int32_t)(v & x->idx_mask) - 1 : -1;
}

static inline uint32_t index_value(uint32_t tag, int32_t idx) {
    return tag | (uint32_t)(idx + 1);
}

int32_t tok_vocab_find(const tokenizer *t, const char *s, size_t n) {
    const tok_index *x = &t->vocab;
    uint64_t h = tok_hash(s, n);
    uint32_t tag = index_tag(x, h);
    for (uint32_t i = (uint32_t)h & x->mask;; i = (i + 1) & x->mask) {
        uint32_t v = x->slot[i];
        if (!v) return -1;
        int32_t id = index_at(x, v, tag);
        if (id < 0) continue;
        if (tok_text_len(t, id) == n && !memcmp(tok_text(t, id), s, n)) return id;
    }
}

static uint64_t merge_hash(const char *s, size_t n_left, size_t n_right) {
    return tok_hash(s, n_left + n_right) ^ mix64(n_left + 1);
}

int32_t tok_merge_rank(const tokenizer *t, const char *s, size_t n_left, size_t n_right) {
    if (!t->n_merges) return -1;
    const tok_index *x = &t->merges;
    uint64_t h = merge_hash(s, n_left, n_right);
    uint32_t tag = index_tag(x, h);
    size_t n = n_left + n_right;
    for (uint32_t i = (uint32_t)h & x->mask;; i = (i + 1) & x->mask) {
        uint32_t v = x->slot[i];
        if (!v) return -1;
        int32_t r = index_at(x, v, tag);
        if (r < 0) continue;
        uint32_t off = t->merge_off[r], len = t->merge_off[r + 1] - off;
        if (len == n && t->merge_split[r] == n_left && !memcmp(t->merge_text + off, s, n)) return r;
    }
}

/* An empty index for n keys (n <= INT32_MAX), at most half full. */
static bool index_alloc(size_t n, tok_index *x) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    if (cap > ((size_t)1 << 31)) return false;
    x->slot = calloc(cap, sizeof *x->slot);
    if (!x->slot) return false;
    x->mask = (uint32_t)(cap - 1);
    x->idx_mask = 1;
    while (x->idx_mask < n) x->idx_mask = x->idx_mask << 1 | 1;
    return true;
}

/* ---- special-token trie ---- */

static int32_t trie_child(const tokenizer *t, int32_t node, uint8_t byte) {
    uint64_t key = (((uint64_t)node << 8) | byte) + 1;
    for (uint32_t i = (uint32_t)mix64(key) & t->edge_mask;; i = (i + 1) & t->edge_mask) {
        if (t->edge_key[i] == key) return t->edge_child[i];
        if (!t->edge_key[i]) return -1;
    }
}

static bool is_special(uint8_t attr) {
    return (attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN)) != 0;
}

/* Adds the edge node --byte--> child, first doubling the edge table when
 * it would be more than half full. False when out of memory. */
static bool trie_add(tokenizer *t, int32_t node, uint8_t byte, int32_t child) {
    size_t cap = (size_t)t->edge_mask + 1;
    if (2 * (size_t)t->n_nodes > cap) {
        size_t ncap = 2 * cap;
        if (ncap > ((size_t)1 << 31)) return false;
        uint64_t *key = calloc(ncap, sizeof *key);
        int32_t *child_of = malloc(ncap * sizeof *child_of);
        if (!key || !child_of) {
            free(key);
            free(child_of);
            return false;
        }
        for (size_t i = 0; i < cap; i++) {
            if (!t->edge_key[i]) continue;
            size_t j = (size_t)mix64(t->edge_key[i]) & (ncap - 1);
            while (key[j]) j = (j + 1) & (ncap - 1);
            key[j] = t->edge_key[i];
            child_of[j] = t->edge_child[i];
        }
        free(t->edge_key);
        free(t->edge_child);
        t->edge_key = key;
        t->edge_child = child_of;
        t->edge_mask = (uint32_t)(ncap - 1);
    }
    uint64_t key = (((uint64_t)node << 8) | byte) + 1;
    uint32_t i = (uint32_t)mix64(key) & t->edge_mask;
    while (t->edge_key[i]) i = (i + 1) & t->edge_mask;
    t->edge_key[i] = key;
    t->edge_child[i] = child;
    return true;
}

/* Builds the trie over every control, user-defined and unknown token and
 * the per-length first-byte bitmaps. Its tables grow with the trie: a big
 * vocabulary's specials share most of their bytes (Gemma 3's 6,414 take
 * 12,900 nodes). */
static cellm_status build_specials(tokenizer *t, cellm_error *err) {
    size_t n_spec = 0, maxlen = 0, node_cap = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!is_special(t->attr[id])) continue;
        size_t len = tok_text_len(t, id);
        n_spec++;
        if (len > maxlen) maxlen = len;
    }
    t->max_special = maxlen;
    t->edge_key = calloc(16, sizeof *t->edge_key);
    t->edge_child = malloc(16 * sizeof *t->edge_child);
    t->first[0] = calloc(maxlen + 1, sizeof *t->first[0]);
    t->first[1] = calloc(maxlen + 1, sizeof *t->first[1]);
    if (!t->edge_key || !t->edge_child || !t->first[0] || !t->first[1] ||
        !tok_grow((void **)&t->node_tok, &node_cap, 1, sizeof *t->node_tok))
        goto oom;
    t->edge_mask = 15;
    t->n_nodes = 1;
    t->node_tok[0] = -1;
    if (!n_spec) return CELLM_OK;

    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!is_special(t->attr[id])) continue;
        const uint8_t *s = (const uint8_t *)tok_text(t, id);
        size_t len = tok_text_len(t, id);
        int32_t node = 0;
        for (size_t k = 0; k < len; k++) {
            int32_t child = trie_child(t, node, s[k]);
            if (child < 0) {
                /* At most one node per byte of token text, which is under
                 * UINT32_MAX / 3 bytes: n_nodes stays an int32_t. */
                if (!tok_grow((void **)&t->node_tok, &node_cap, (size_t)t->n_nodes + 1,
                              sizeof *t->node_tok))
                    goto oom;
                child = t->n_nodes++;
                t->node_tok[child] = -1;
                if (!trie_add(t, node, s[k], child)) goto oom;
            }
            node = child;
        }
        /* The lowest id keeps a text that several tokens share. */
        if (t->node_tok[node] < 0) t->node_tok[node] = id;
        /* Control and unknown tokens only count with TOK_PARSE_SPECIAL. */
        bool user = !(t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN));
        for (int k = user ? 0 : 1; k < 2; k++) {
            t->first[k][len][s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
            t->first[k][0][s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
            t->has_special[k] = true;
        }
    }
    return CELLM_OK;
oom:
    return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory for special tokens");
}

/* A special token found in the text. */
typedef struct tok_match {
    size_t off, len;
    int32_t id;
} tok_match;

static int match_cmp(const void *a, const void *b) {
    const tok_match *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Where an allowed special token may start: its position and the length
 * of the longest one that matches there. */
typedef struct tok_cand {
    size_t off, longest;
} tok_cand;

static bool special_allowed(const tokenizer *t, int32_t id, bool all) {
    return id >= 0 && (all || !(t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)));
}

/* Finds the special tokens in text[0..n) the way llama.cpp's
 * tokenizer_st_partition does: longer tokens first, each taking its
 * leftmost non-overlapping occurrences in what is still plain text.
 * One trie walk per position finds the candidates; then one pass per
 * token length over the candidates only. Returns the matches sorted by
 * offset in *out (malloc'd, maybe NULL). */
static cellm_status find_specials(const tokenizer *t, const uint8_t *text, size_t n, bool all,
                                  tok_match **out, size_t *n_out, cellm_error *err) {
    *out = NULL;
    *n_out = 0;
    int k = all ? 1 : 0;
    if (!t->has_special[k] || n == 0) return CELLM_OK;
    uint8_t *claimed = NULL;
    tok_match *m = NULL;
    tok_cand *cand = NULL;
    size_t nm = 0, cap = 0, nc = 0, ccap = 0;
    const uint8_t *first = t->first[k][0]; /* any length */
    for (size_t i = 0; i < n; i++) {
        uint8_t c = text[i];
        if (!(first[c >> 3] & (1u << (c & 7)))) continue;
        int32_t node = 0;
        size_t longest = 0;
        for (size_t d = 0; i + d < n && (node = trie_child(t, node, text[i + d])) >= 0; d++)
            if (special_allowed(t, t->node_tok[node], all)) longest = d + 1;
        if (!longest) continue;
        if (nc == ccap && !tok_grow((void **)&cand, &ccap, nc + 1, sizeof *cand)) goto oom;
        cand[nc++] = (tok_cand){i, longest};
    }
    if (!nc) return CELLM_OK;
    if (!(claimed = calloc(n, 1))) goto oom;
    size_t maxlen = t->max_special < n ? t->max_special : n;
    for (size_t len = maxlen; len >= 1; len--) {
        const uint8_t *fl = t->first[k][len];
        bool any = false;
        for (int b = 0; b < 32; b++) any |= fl[b] != 0;
        if (!any) continue;
        for (size_t j = 0; j < nc; j++) {
            size_t i = cand[j].off;
            if (cand[j].longest < len) continue;
            /* Claimed stretches are at least `len` long, so one that
             * overlaps [i, i + len) covers one of its ends. */
            if (claimed[i] || claimed[i + len - 1]) continue;
            int32_t node = 0;
            size_t d = 0;
            while (d < len && (node = trie_child(t, node, text[i + d])) >= 0) d++;
            if (d < len || !special_allowed(t, t->node_tok[node], all)) continue;
            if (nm == cap && !tok_grow((void **)&m, &cap, nm + 1, sizeof *m)) goto oom;
            m[nm++] = (tok_match){i, len, t->node_tok[node]};
            memset(claimed + i, 1, len);
        }
    }
    free(claimed);
    free(cand);
    if (nm > 1) qsort(m, nm, sizeof *m, match_cmp);
    *out = m;
    *n_out = nm;
    return CELLM_OK;
oom:
    free(claimed);
    free(cand);
    free(m);
    return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory finding special tokens");
}

/* ---- encoding ---- */

cellm_status tokenizer_encode(const tokenizer *t, const char *text, size_t len, unsigned flags,
                              tok_ids *out, cellm_error *err) {
    if (!t || !out || (!text && len))
        return err_set(err, CELLM_ERR_INVALID_ARG, "tokenizer_encode: NULL argument");
    if (len > TOKENIZER_MAX_INPUT)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "tokenizer_encode: input of %zu bytes is over the %zu byte limit", len,
                       (size_t)TOKENIZER_MAX_INPUT);
    const uint8_t *s = (const uint8_t *)text;
    size_t n0 = out->n;
    bool add = (flags & TOK_ADD_SPECIAL) != 0;
    tok_match *m = NULL;
    size_t nm = 0;
    tok_scratch sc = {0};
    cellm_status st = find_specials(t, s, len, (flags & TOK_PARSE_SPECIAL) != 0, &m, &nm, err);
    if (st != CELLM_OK) return st;

    if (add && t->add_bos && t->bos >= 0 && !tok_ids_push(out, t->bos)) goto oom;
    /* SentencePiece puts a space before text that starts the input or
     * follows a special token (when add_space_prefix is set). */
    bool prev_special = true;
    size_t pos = 0;
    for (size_t i = 0; i <= nm; i++) {
        size_t end = i < nm ? m[i].off : len;
        if (end > pos) {
            if (t->kind == TOK_KIND_SPM)
                st = tok_spm_encode(t, &sc, s + pos, end - pos, t->add_space_prefix && prev_special,
                                    out, err);
            else
                st = tok_bpe_encode(t, &sc, s + pos, end - pos, out, err);
            if (st != CELLM_OK) goto fail;
            prev_special = false;
        }
        if (i < nm) {
            if (!tok_ids_push(out, m[i].id)) goto oom;
            prev_special = true;
            pos = m[i].off + m[i].len;
        }
    }
    if (add && t->add_eos && t->eos >= 0 && !tok_ids_push(out, t->eos)) goto oom;
    free(m);
    tok_scratch_free(&sc);
    return CELLM_OK;
oom:
    st = err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer_encode: out of memory");
fail:
    out->n = n0;
    free(m);
    tok_scratch_free(&sc);
    return st;
}

/* ---- loading ---- */

#define KEY_MODEL "tokenizer.ggml.model"
#define KEY_PRE "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_SCORES "tokenizer.ggml.scores"
#define KEY_TYPES "tokenizer.ggml.token_type"
#define KEY_MERGES "tokenizer.ggml.merges"

typedef struct pre_name {
    const char *name;
    tok_pre pre;
} pre_name;

/* tokenizer.ggml.pre values and the rule each uses (llama.cpp's grouping). */
static const pre_name pre_names[] = {
    {"default", TOK_PRE_DEFAULT}, {"gpt-2", TOK_PRE_GPT2},       {"gpt2", TOK_PRE_GPT2},
    {"phi-2", TOK_PRE_GPT2},      {"mpt", TOK_PRE_GPT2},         {"olmo", TOK_PRE_GPT2},
    {"smollm", TOK_PRE_SMOLLM},   {"starcoder", TOK_PRE_SMOLLM}, {"refact", TOK_PRE_SMOLLM},
    {"llama3", TOK_PRE_LLAMA3},   {"llama-v3", TOK_PRE_LLAMA3},  {"llama-bpe", TOK_PRE_LLAMA3},
    {"qwen2", TOK_PRE_QWEN2},
};

static bool str_is(gguf_str s, const char *c) {
    return gguf_str_eq(s, c);
}

/* Reads a special token id key; -1 when absent or out of range. */
static int32_t read_id(const gguf_file *f, const char *key, int32_t dflt, int32_t n_vocab) {
    uint64_t v;
    if (!gguf_get_uint(f, key, &v)) return dflt < n_vocab ? dflt : -1;
    return v < (uint64_t)n_vocab ? (int32_t)v : -1;
}

static bool read_flag(const gguf_file *f, const char *key, bool dflt) {
    bool b;
    return gguf_get_bool(f, key, &b) ? b : dflt;
}

/* Parses "<0xNN>"; -1 when the text is not of that form. */
static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Writes the decoded bytes of token `id` to out (room for 3x the text
 * length, though no token decodes to more bytes than its text); returns
 * the byte count. */
static size_t decode_token(const tokenizer *t, int32_t id, char *out) {
    const char *s = tok_text(t, id);
    size_t n = tok_text_len(t, id), w = 0;
    uint8_t attr = t->attr[id];
    if (attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) return 0; /* text only on request */
    if (attr & TOK_ATTR_USER) {
        memcpy(out, s, n);
        return n;
    }
    if (t->kind == TOK_KIND_SPM) {
        if (attr & TOK_ATTR_NORMAL) {
            /* "▁" (E2 96 81) stands for a space. */
            for (size_t i = 0; i < n; i++) {
                if (i + 2 < n && (uint8_t)s[i] == 0xE2 && (uint8_t)s[i + 1] == 0x96 &&
                    (uint8_t)s[i + 2] == 0x81) {
                    out[w++] = ' ';
                    i += 2;
                } else {
                    out[w++] = s[i];
                }
            }
            return w;
        }
        if (attr & TOK_ATTR_BYTE) {
            int b = parse_byte_token(s, n);
            if (b >= 0) {
                out[0] = (char)b;
                return 1;
            }
            memcpy(out, s, n);
            return n;
        }
        return 0;
    }
    if (!(attr & (TOK_ATTR_NORMAL | TOK_ATTR_BYTE))) return 0;
    /* Byte-level BPE: each character stands for one byte; a character
     * outside the map (a broken vocabulary) is kept as it is. */
    for (size_t i = 0; i < n;) {
        size_t used;
        uint32_t cp = utf8_decode_lenient((const uint8_t *)s + i, n - i, &used);
        int b = unicode_cp_to_byte(cp);
        if (b >= 0) {
            out[w++] = (char)b;
        } else {
            memcpy(out + w, s + i, used);
            w += used;
        }
        i += used;
    }
    return w;
}

/* Token texts llama.cpp treats as control tokens whatever their type says
 * (end-of-turn, end-of-generation and fill-in-the-middle markers), so
 * they are parsed only with TOK_PARSE_SPECIAL and decode to nothing
 * without TOK_DECODE_SPECIAL. One of llama.cpp's is left out: "</s>"
 * (added there for PaddleOCR). Where "</s>" is the end of a sequence
 * (Llama 2, Mistral, Phi-3) the file already types it control; where it
 * does not (Gemma 3's id 212 is user-defined), the model's own
 * SentencePiece tokenizer and transformers match it in plain text like
 * any user-defined token, and so does cellm (docs/tokenizer.md). */
static const char *const control_names[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<｜fim▁begin｜>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<｜fim▁hole｜>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<｜fim▁end｜>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<fim-repo>",
    "<REPO>",
    "<|repo_name|>",
    "<reponame>",
    "<|file_sep|>",
};

/* And texts it always treats as user-defined (gpt-oss's). */
static const char *const user_names[] = {"<|channel|>", "<|message|>", "<|start|>",
                                         "<|constrain|>"};

static void fix_attrs(tokenizer *t) {
    for (size_t i = 0; i < sizeof control_names / sizeof control_names[0]; i++) {
        int32_t id = tok_vocab_find(t, control_names[i], strlen(control_names[i]));
        if (id >= 0) t->attr[id] |= TOK_ATTR_CONTROL;
    }
    for (size_t i = 0; i < sizeof user_names / sizeof user_names[0]; i++) {
        int32_t id = tok_vocab_find(t, user_names[i], strlen(user_names[i]));
        if (id >= 0) t->attr[id] = TOK_ATTR_USER;
    }
}

static cellm_status load_vocab(tokenizer *t, const gguf_file *f, cellm_error *err) {
    const gguf_value *toks = gguf_get_arr(f, KEY_TOKENS);
    if (!toks) return err_set(err, CELLM_ERR_NOT_FOUND, "tokenizer: no %s array", KEY_TOKENS);
    if (toks->v.arr.type != GGUF_TYPE_STRING)
        return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %s holds %s, not strings", KEY_TOKENS,
                       gguf_type_name(toks->v.arr.type));
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > INT32_MAX)
        return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %s has %llu entries", KEY_TOKENS,
                       (unsigned long long)n);
    t->n_vocab = (int32_t)n;

    const gguf_value *scores = gguf_get_arr(f, KEY_SCORES);
    if (scores && (scores->v.arr.n < n || !gguf_type_size(scores->v.arr.type)))
        return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %s has %llu numbers for %llu tokens",
                       KEY_SCORES, (unsigned long long)scores->v.arr.n, (unsigned long long)n);
    const gguf_value *types = gguf_get_arr(f, KEY_TYPES);
    if (types && (types->v.arr.n < n || !gguf_type_size(types->v.arr.type)))
        return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %s has %llu numbers for %llu tokens",
                       KEY_TYPES, (unsigned long long)types->v.arr.n, (unsigned long long)n);

    /* Texts: the file's own strings, unless one is empty: llama.cpp makes
     * that "[EMPTY_<id>]", so then they are copied. */
    const gguf_str *strs = toks->v.arr.strs;
    uint64_t total = 0;
    bool in_place = true;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = strs[i].len;
        total += len ? len : 24;
        if (!len) in_place = false;
    }
    if (total >= UINT32_MAX / 3)
        return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %llu bytes of token text is too much",
                       (unsigned long long)total);
    t->type = malloc(n);
    t->attr = malloc(n);
    if (!in_place) {
        t->text_own = malloc(total + 1);
        t->strs_own = malloc(n * sizeof *t->strs_own);
    }
    if (scores && scores->v.arr.type != GGUF_TYPE_FLOAT32)
        t->score_own = malloc(n * sizeof *t->score_own);
    if (!t->type || !t->attr || (!in_place && (!t->text_own || !t->strs_own)) ||
        (scores && scores->v.arr.type != GGUF_TYPE_FLOAT32 && !t->score_own))
        return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory for the vocabulary");
    if (scores && !t->score_own) t->score_f32 = scores->v.arr.data;
    t->strs = strs;
    if (!in_place) {
        size_t w = 0;
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s = strs[i];
            if (s.len) {
                memcpy(t->text_own + w, s.ptr, s.len);
            } else {
                char tmp[32];
                int k = snprintf(tmp, sizeof tmp, "[EMPTY_%llu]", (unsigned long long)i);
                memcpy(t->text_own + w, tmp, (size_t)k);
                s.len = (uint64_t)k;
            }
            t->strs_own[i] = (gguf_str){t->text_own + w, s.len};
            w += s.len;
        }
        t->strs = t->strs_own;
    }
    for (uint64_t i = 0; i < n; i++) {
        double sc = 0;
        if (t->score_own && !gguf_arr_get_float(scores, i, &sc))
            return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %s[%llu] is not a number", KEY_SCORES,
                           (unsigned long long)i);
        if (t->score_own) t->score_own[i] = (float)sc;
        int64_t ty = TOK_TYPE_NORMAL;
        if (types && !gguf_arr_get_int(types, i, &ty))
            return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %s[%llu] is not an integer",
                           KEY_TYPES, (unsigned long long)i);
        t->type[i] =
            ty >= TOK_TYPE_NORMAL && ty <= TOK_TYPE_BYTE ? (uint8_t)ty : TOK_TYPE_UNDEFINED;
        t->attr[i] = t->type[i] ? (uint8_t)(1u << (t->type[i] - 1)) : 0;
    }

    /* text -> id; a later duplicate wins, as in llama.cpp's map. */
    tok_index *x = &t->vocab;
    if (!index_alloc(n, x))
        return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory for the vocabulary");
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = tok_text(t, id);
        size_t len = tok_text_len(t, id);
        uint64_t h = tok_hash(s, len);
        uint32_t tag = index_tag(x, h), i = (uint32_t)h & x->mask;
        for (; x->slot[i]; i = (i + 1) & x->mask) {
            int32_t old = index_at(x, x->slot[i], tag);
            if (old < 0) continue;
            if (tok_text_len(t, old) == len && !memcmp(tok_text(t, old), s, len)) break;
        }
        x->slot[i] = index_value(tag, id);
    }
    fix_attrs(t);
    return CELLM_OK;
}

static cellm_status load_merges(tokenizer *t, const gguf_file *f, cellm_error *err) {
    const gguf_value *mg = gguf_get_arr(f, KEY_MERGES);
    if (!mg)
        return err_set(err, CELLM_ERR_NOT_FOUND, "tokenizer: BPE model without %s", KEY_MERGES);
    if (mg->v.arr.type != GGUF_TYPE_STRING)
        return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %s holds %s, not strings", KEY_MERGES,
                       gguf_type_name(mg->v.arr.type));
    uint64_t n = mg->v.arr.n, total = 0;
    if (n > INT32_MAX)
        return err_set(err, CELLM_ERR_FORMAT, "tokenizer: %llu merges is too many",
                       (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) total += mg->v.arr.strs[i].len;
    if (total >= UINT32_MAX) return err_set(err, CELLM_ERR_FORMAT, "tokenizer: merges too large");
    t->merge_text = malloc(total + 1);
    t->merge_off = malloc((n + 1) * sizeof *t->merge_off);
    t->merge_split = malloc((n ? n : 1) * sizeof *t->merge_split);
    tok_index *x = &t->merges;
    if (!t->merge_text || !t->merge_off || !t->merge_split || !index_alloc(n, x))
        return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory for merges");
    uint32_t w = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = mg->v.arr.strs[i];
        /* "left right": split at the first space after the first byte. A
         * merge without one can never apply (llama.cpp keeps it as an
         * empty pair); it still takes its rank. */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        size_t nl = sp ? (size_t)(sp - s.ptr) : 0, nr = sp ? s.len - nl - 1 : 0;
        t->merge_off[i] = w;
        t->merge_split[i] = (uint32_t)nl;
        memcpy(t->merge_text + w, s.ptr, nl);
        memcpy(t->merge_text + w + nl, s.ptr + nl + (sp ? 1 : 0), nr);
        w += (uint32_t)(nl + nr);
        if (!sp || nr == 0) continue;
        /* The first of duplicate merges keeps its rank. */
        uint64_t h = merge_hash(t->merge_text + t->merge_off[i], nl, nr);
        uint32_t tag = index_tag(x, h), k = (uint32_t)h & x->mask;
        bool dup = false;
        for (; x->slot[k]; k = (k + 1) & x->mask) {
            int32_t r = index_at(x, x->slot[k], tag);
            if (r < 0) continue;
            uint32_t o = t->merge_off[r];
            /* merge_off[r + 1] is set: r < i. */
            if (t->merge_split[r] == nl && t->merge_off[r + 1] - o == nl + nr &&
                !memcmp(t->merge_text + o, t->merge_text + t->merge_off[i], nl + nr)) {
                dup = true;
                break;
            }
        }
        if (!dup) x->slot[k] = index_value(tag, (int32_t)i);
    }
    t->merge_off[n] = w;
    t->n_merges = (int32_t)n;
    return CELLM_OK;
}

/* Decodes every token once. Only the pieces that differ from their token's
 * text are stored (SentencePiece's "▁the" -> " the", byte tokens, BPE's
 * mapped bytes); the rest, TOK_ATTR_PIECE_IS_TEXT, are read from `text`. */
static cellm_status build_pieces(tokenizer *t, cellm_error *err) {
    size_t maxlen = 0, cap = 0, maxp = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t tl = tok_text_len(t, id);
        if (tl > maxlen) maxlen = tl;
    }
    char *tmp = malloc(3 * maxlen + 1); /* the text is under UINT32_MAX / 3 bytes */
    t->piece_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
    if (!tmp || !t->piece_off || !tok_grow((void **)&t->piece, &cap, 1, 1)) goto oom;
    uint32_t w = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = w;
        const char *s = tok_text(t, id);
        size_t k = decode_token(t, id, tmp), tl = tok_text_len(t, id);
        if (k > maxp) maxp = k;
        if (tl > maxp) maxp = tl; /* the text itself, with TOK_DECODE_SPECIAL */
        if (k == tl && !memcmp(tmp, s, k)) {
            t->attr[id] |= TOK_ATTR_PIECE_IS_TEXT;
            continue;
        }
        if (!tok_grow((void **)&t->piece, &cap, (size_t)w + k, 1)) goto oom;
        memcpy(t->piece + w, tmp, k);
        w += (uint32_t)k;
    }
    t->piece_off[t->n_vocab] = w;
    t->max_piece = maxp;
    free(tmp);
    /* Give back what the doubling left over. */
    char *fit = realloc(t->piece, (size_t)w + 1);
    if (fit) t->piece = fit;
    return CELLM_OK;
oom:
    free(tmp);
    return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory for pieces");
}

/* The token each byte falls back to: SentencePiece's <0xNN> (or, failing
 * that, the byte as a one-byte token); BPE's one-character token. */
static void build_byte_tokens(tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        int32_t id = -1;
        if (t->kind == TOK_KIND_SPM) {
            char hex[7];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            id = tok_vocab_find(t, hex, 6);
            if (id < 0) {
                char c = (char)b;
                id = tok_vocab_find(t, &c, 1);
            }
        } else {
            uint8_t u[4];
            size_t k = utf8_encode(unicode_byte_to_cp((uint8_t)b), u);
            id = tok_vocab_find(t, (const char *)u, k);
        }
        t->byte_tok[b] = id;
    }
}

cellm_status tokenizer_load(const gguf_file *f, tokenizer **out, cellm_error *err) {
    if (!out) return err_set(err, CELLM_ERR_INVALID_ARG, "tokenizer_load: NULL out");
    *out = NULL;
    if (!f) return err_set(err, CELLM_ERR_INVALID_ARG, "tokenizer_load: NULL file");
    gguf_str model;
    if (!gguf_get_str(f, KEY_MODEL, &model))
        return err_set(err, CELLM_ERR_NOT_FOUND, "tokenizer: no %s string", KEY_MODEL);
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory");
    cellm_status st;
    if (str_is(model, "llama")) {
        t->kind = TOK_KIND_SPM;
        t->pre = TOK_PRE_NONE;
    } else if (str_is(model, "gpt2")) {
        t->kind = TOK_KIND_BPE;
        gguf_str pre = {"default", 7};
        gguf_get_str(f, KEY_PRE, &pre);
        if (pre.len == 0) pre = (gguf_str){"default", 7};
        t->pre = TOK_PRE_NONE;
        for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
            if (str_is(pre, pre_names[i].name)) t->pre = pre_names[i].pre;
        if (t->pre == TOK_PRE_NONE) {
            st = err_set(err, CELLM_ERR_UNSUPPORTED, "tokenizer: unknown pre-tokenizer '%.*s' (%s)",
                         (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, KEY_PRE);
            goto fail;
        }
        snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)pre.len, pre.ptr);
    } else {
        st = err_set(err, CELLM_ERR_UNSUPPORTED, "tokenizer: unsupported model '%.*s' (%s)",
                     (int)(model.len > 64 ? 64 : model.len), model.ptr, KEY_MODEL);
        goto fail;
    }
    if ((st = load_vocab(t, f, err)) != CELLM_OK) goto fail;
    if (t->kind == TOK_KIND_BPE && (st = load_merges(t, f, err)) != CELLM_OK) goto fail;
    if ((st = build_pieces(t, err)) != CELLM_OK) goto fail;
    if ((st = build_specials(t, err)) != CELLM_OK) goto fail;
    build_byte_tokens(t);

    /* Defaults as llama.cpp's, then the file's keys. */
    bool spm = t->kind == TOK_KIND_SPM;
    t->bos = read_id(f, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, t->n_vocab);
    t->eos = read_id(f, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, t->n_vocab);
    t->unk = read_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, t->n_vocab);
    bool bos_default = spm || t->pre == TOK_PRE_LLAMA3 || t->pre == TOK_PRE_QWEN2;
    t->add_bos = read_flag(f, "tokenizer.ggml.add_bos_token", bos_default);
    t->add_eos = read_flag(f, "tokenizer.ggml.add_eos_token", false);
    t->add_space_prefix = read_flag(f, "tokenizer.ggml.add_space_prefix", spm);
    t->ignore_merges = t->pre == TOK_PRE_LLAMA3 || t->pre == TOK_PRE_QWEN2;
    *out = t;
    return CELLM_OK;
fail:
    tokenizer_free(t);
    return st;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->text_own);
    free(t->strs_own);
    free(t->score_own);
    free(t->type);
    free(t->attr);
    free(t->piece);
    free(t->piece_off);
    free(t->vocab.slot);
    free(t->merge_text);
    free(t->merge_off);
    free(t->merge_split);
    free(t->merges.slot);
    free(t->node_tok);
    free(t->edge_key);
    free(t->edge_child);
    free(t->first[0]);
    free(t->first[1]);
    free(t);
}

/* ---- facts ---- */

int32_t tokenizer_n_vocab(const tokenizer *t) {
    return t->n_vocab;
}
int32_t tokenizer_bos(const tokenizer *t) {
    return t->bos;
}
int32_t tokenizer_eos(const tokenizer *t) {
    return t->eos;
}
bool tokenizer_adds_bos(const tokenizer *t) {
    return t->add_bos && t->bos >= 0;
}
tok_type tokenizer_token_type(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? (tok_type)t->type[id] : TOK_TYPE_UNDEFINED;
}
const char *tokenizer_model_name(const tokenizer *t) {
    return t->kind == TOK_KIND_SPM ? "llama" : "gpt2";
}
const char *tokenizer_pre_name(const tokenizer *t) {
    return t->pre_name;
}

const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = tok_text_len(t, id);
    return tok_text(t, id);
}

const char *tokenizer_piece(const tokenizer *t, int32_t id, unsigned flags, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) {
        if (flags & TOK_DECODE_SPECIAL) return tokenizer_token_text(t, id, len);
        *len = 0;
        return t->piece;
    }
    if (t->attr[id] & TOK_ATTR_PIECE_IS_TEXT) return tokenizer_token_text(t, id, len);
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->piece + t->piece_off[id];
}

size_t tokenizer_max_piece_len(const tokenizer *t) {
    return t->max_piece;
}
