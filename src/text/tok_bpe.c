/*
 * tok_bpe.c — byte-level BPE (tokenizer.ggml.model = "gpt2"): the
 * pre-tokenizers that cut text into words, and the merging of each word.
 *
 * Text is first decoded into code points the lenient way llama.cpp does
 * (a malformed byte becomes U+FFFD). A pre-tokenizer is a list of stages;
 * each cuts every segment the previous stage left into smaller ones. The
 * stages are hand-written matchers for the regular expressions the models
 * were trained with, written to cut exactly where llama.cpp's do (its
 * custom GPT-2 and Llama 3 matchers and, for the simple character-class
 * expressions, what its std::regex fallback finds).
 *
 * Each word is then written as UTF-8, its bytes shown through GPT-2's
 * byte-to-unicode map, and merged: the adjacent pair with the lowest merge
 * rank first (leftmost among equals), from a heap, until no pair has a
 * merge. Linear memory, O(n log n) time per word.
 */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"

#define OUT_OF_RANGE 0xFFFFFFFFu

/* The code points and classes of one stretch of text. */
typedef struct cps_view {
    const uint32_t *cp;
    const uint8_t *cls;
} cps_view;

/* Code point and classes at p, or OUT_OF_RANGE and no class past `end`. */
static inline uint32_t cp_at(cps_view v, size_t p, size_t end) {
    return p < end ? v.cp[p] : OUT_OF_RANGE;
}
static inline unsigned cls_at(cps_view v, size_t p, size_t end) {
    return p < end ? v.cls[p] : 0u;
}

/* Segment lengths (in code points) a stage appends to. */
typedef struct seg_out {
    size_t **len;
    size_t *n, *cap;
    bool oom;
} seg_out;

static void seg_add(seg_out *o, size_t len) {
    if (!len || o->oom) return;
    if (!tok_grow((void **)o->len, o->cap, *o->n + 1, sizeof **o->len)) {
        o->oom = true;
        return;
    }
    (*o->len)[(*o->n)++] = len;
}

/* Cuts [ini, end) as GPT-2's expression
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * does, step for step as llama.cpp's unicode_regex_split_custom_gpt2. */
static void split_gpt2(cps_view v, size_t ini, size_t end, seg_out *o) {
#define CPT(p) cp_at(v, (p), end)
#define FL(p) cls_at(v, (p), end)
    size_t prev = ini;
#define ADD(e) (seg_add(o, (e)-prev), prev = (e))
    for (size_t pos = ini; pos < end;) {
        uint32_t c = v.cp[pos];
        unsigned f = v.cls[pos];
        if (c == '\'' && pos + 1 < end) {
            uint32_t c1 = v.cp[pos + 1];
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                ADD(pos);
                continue;
            }
            if (pos + 2 < end) {
                uint32_t c2 = v.cp[pos + 2];
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
                    (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    ADD(pos);
                    continue;
                }
            }
        }
        unsigned f2 = c == ' ' ? FL(pos + 1) : f;
        if (f2 & UCLASS_LETTER) {
            pos += c == ' ';
            while (f2 & UCLASS_LETTER) f2 = FL(++pos);
            ADD(pos);
            continue;
        }
        if (f2 & UCLASS_NUMBER) {
            pos += c == ' ';
            while (f2 & UCLASS_NUMBER) f2 = FL(++pos);
            ADD(pos);
            continue;
        }
        if (!(f2 & (UCLASS_SPACE | UCLASS_LETTER | UCLASS_NUMBER)) && f2) {
            pos += c == ' ';
            while (!(f2 & (UCLASS_SPACE | UCLASS_LETTER | UCLASS_NUMBER)) && f2) f2 = FL(++pos);
            ADD(pos);
            continue;
        }
        size_t nws = 0;
        while (FL(pos + nws) & UCLASS_SPACE) nws++;
        if (nws > 1 && CPT(pos + nws) != OUT_OF_RANGE) { /* \s+(?!\S) */
            pos += nws - 1;
            ADD(pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            ADD(pos);
            continue;
        }
        ++pos;
        ADD(pos);
    }
}

static uint32_t ascii_lower(uint32_t c) {
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* Cuts [ini, end) as the Llama 3 expression
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * step for step as llama.cpp's unicode_regex_split_custom_llama3, with
 * digits grouped `group` at a time (3 for Llama 3, 1 for Qwen 2). */
static void split_llama3(cps_view v, size_t ini, size_t end, size_t group, seg_out *o) {
    size_t prev = ini;
    for (size_t pos = ini; pos < end;) {
        uint32_t c = v.cp[pos];
        unsigned f = v.cls[pos];
        if (c == '\'' && pos + 1 < end) {
            uint32_t c1 = ascii_lower(v.cp[pos + 1]);
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                ADD(pos);
                continue;
            }
            if (pos + 2 < end) {
                uint32_t c2 = ascii_lower(v.cp[pos + 2]);
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
                    (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    ADD(pos);
                    continue;
                }
            }
        }
        if (!(c == '\r' || c == '\n' || (f & UCLASS_NUMBER))) {
            if ((f & UCLASS_LETTER) || (FL(pos + 1) & UCLASS_LETTER)) {
                pos++;
                while (FL(pos) & UCLASS_LETTER) pos++;
                ADD(pos);
                continue;
            }
        }
        if (f & UCLASS_NUMBER) {
            size_t start = pos;
            while (FL(pos) & UCLASS_NUMBER) {
                if (++pos - start >= group) {
                    ADD(pos);
                    start = pos;
                }
            }
            ADD(pos);
            continue;
        }
        unsigned f2 = c == ' ' ? FL(pos + 1) : f;
        /* llama.cpp tests the first code point's flags (always set) here,
         * not f2's; kept for identical cuts. */
        if (!(f2 & (UCLASS_SPACE | UCLASS_LETTER | UCLASS_NUMBER)) && f) {
            pos += c == ' ';
            while (!(f2 & (UCLASS_SPACE | UCLASS_LETTER | UCLASS_NUMBER)) && f2) f2 = FL(++pos);
            uint32_t c2 = CPT(pos);
            while (c2 == '\r' || c2 == '\n') c2 = CPT(++pos);
            ADD(pos);
            continue;
        }
        size_t nws = 0, last_nl = 0;
        while (FL(pos + nws) & UCLASS_SPACE) {
            uint32_t c2 = CPT(pos + nws);
            if (c2 == '\r' || c2 == '\n') last_nl = pos + nws + 1;
            nws++;
        }
        if (last_nl > 0) { /* \s*[\r\n]+ */
            pos = last_nl;
            ADD(pos);
            continue;
        }
        if (nws > 1 && CPT(pos + nws) != OUT_OF_RANGE) { /* \s+(?!\S) */
            pos += nws - 1;
            ADD(pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            ADD(pos);
            continue;
        }
        ++pos;
        ADD(pos);
    }
#undef ADD
#undef FL
#undef CPT
}

/* Simple character-class expressions, matched as llama.cpp's std::regex
 * fallback matches them; text between matches becomes segments too. */
typedef enum class_rule {
    RULE_NUMBER_EACH,  /* \p{N} */
    RULE_NUMBER_RUNS,  /* \p{N}+ */
    RULE_PUNCT_RUNS,   /* [\p{P}\$\+<=>\^~\|]+ */
    RULE_DIGIT_TRIPLE, /* [0-9][0-9][0-9] */
} class_rule;

static bool rule_char(class_rule r, uint32_t c, unsigned cls) {
    switch (r) {
    case RULE_NUMBER_EACH:
    case RULE_NUMBER_RUNS: return (cls & UCLASS_NUMBER) != 0;
    case RULE_PUNCT_RUNS:
        return (cls & UCLASS_PUNCT) || (c < 0x80 && c && strchr("$+<=>^~|", (int)c));
    case RULE_DIGIT_TRIPLE: return c >= '0' && c <= '9';
    }
    return false;
}

static void split_class(cps_view v, size_t ini, size_t end, class_rule r, seg_out *o) {
    size_t prev = ini;
    for (size_t pos = ini; pos < end;) {
        if (!rule_char(r, v.cp[pos], v.cls[pos])) {
            pos++;
            continue;
        }
        size_t e = pos + 1;
        if (r == RULE_NUMBER_RUNS || r == RULE_PUNCT_RUNS) {
            while (e < end && rule_char(r, v.cp[e], v.cls[e])) e++;
        } else if (r == RULE_DIGIT_TRIPLE) {
            if (!(pos + 2 < end && rule_char(r, v.cp[pos + 1], 0) &&
                  rule_char(r, v.cp[pos + 2], 0))) {
                pos++;
                continue;
            }
            e = pos + 3;
        }
        seg_add(o, pos - prev);
        seg_add(o, e - pos);
        prev = pos = e;
    }
    seg_add(o, end - prev);
}

typedef enum stage {
    STAGE_GPT2,
    STAGE_LLAMA3,
    STAGE_QWEN2,
    STAGE_NUMBER_EACH,
    STAGE_NUMBER_RUNS,
    STAGE_PUNCT_RUNS,
    STAGE_DIGIT_TRIPLE,
    STAGE_END
} stage;

/* The stages of each pre-tokenizer, as llama.cpp's regex lists. */
static const stage *pre_stages(tok_pre pre) {
    static const stage def[] = {STAGE_PUNCT_RUNS, STAGE_GPT2, STAGE_NUMBER_RUNS, STAGE_DIGIT_TRIPLE,
                                STAGE_END};
    static const stage gpt2[] = {STAGE_GPT2, STAGE_END};
    static const stage smollm[] = {STAGE_NUMBER_EACH, STAGE_GPT2, STAGE_END};
    static const stage llama3[] = {STAGE_LLAMA3, STAGE_END};
    static const stage qwen2[] = {STAGE_QWEN2, STAGE_END};
    switch (pre) {
    case TOK_PRE_GPT2: return gpt2;
    case TOK_PRE_SMOLLM: return smollm;
    case TOK_PRE_LLAMA3: return llama3;
    case TOK_PRE_QWEN2: return qwen2;
    case TOK_PRE_DEFAULT:
    case TOK_PRE_NONE: break;
    }
    return def;
}

/* Cuts the m code points in s->cps into words; their lengths end up in
 * s->segs[0..*n_segs). */
static bool pre_tokenize(const tokenizer *t, tok_scratch *s, size_t m, size_t *n_segs) {
    cps_view v = {s->cps, s->cls};
    size_t n_in = 0;
    if (!tok_grow((void **)&s->segs, &s->segs_cap, 1, sizeof *s->segs)) return false;
    s->segs[n_in++] = m;
    for (const stage *st = pre_stages(t->pre); *st != STAGE_END; st++) {
        size_t n_out = 0;
        seg_out o = {&s->segs2, &n_out, &s->segs2_cap, false};
        size_t ini = 0;
        for (size_t i = 0; i < n_in; i++) {
            size_t end = ini + s->segs[i];
            switch (*st) {
            case STAGE_GPT2: split_gpt2(v, ini, end, &o); break;
            case STAGE_LLAMA3: split_llama3(v, ini, end, 3, &o); break;
            case STAGE_QWEN2: split_llama3(v, ini, end, 1, &o); break;
            case STAGE_NUMBER_EACH: split_class(v, ini, end, RULE_NUMBER_EACH, &o); break;
            case STAGE_NUMBER_RUNS: split_class(v, ini, end, RULE_NUMBER_RUNS, &o); break;
            case STAGE_PUNCT_RUNS: split_class(v, ini, end, RULE_PUNCT_RUNS, &o); break;
            case STAGE_DIGIT_TRIPLE: split_class(v, ini, end, RULE_DIGIT_TRIPLE, &o); break;
            case STAGE_END: break;
            }
            ini = end;
        }
        if (o.oom) return false;
        size_t *tmp = s->segs, tcap = s->segs_cap;
        s->segs = s->segs2;
        s->segs_cap = s->segs2_cap;
        s->segs2 = tmp;
        s->segs2_cap = tcap;
        n_in = n_out;
    }
    *n_segs = n_in;
    return true;
}

static bool push_pair(const tokenizer *t, tok_scratch *s, const uint8_t *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const tok_sym *a = &s->syms[l], *b = &s->syms[r];
    int32_t rank = tok_merge_rank(t, (const char *)w + a->off, a->n, b->n);
    if (rank < 0) return true;
    tok_bigram bg = {((uint64_t)(uint32_t)rank << 32) | (uint32_t)l, l, r, a->n + b->n};
    return tok_heap_push(s, bg);
}

/* Merges one byte-mapped word w[0..n) and appends its ids. */
static bool bpe_word(const tokenizer *t, tok_scratch *s, const uint8_t *w, size_t n, tok_ids *out) {
    if (t->ignore_merges) {
        int32_t id = tok_vocab_find(t, (const char *)w, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    if (!tok_grow((void **)&s->syms, &s->syms_cap, n, sizeof *s->syms)) return false;
    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t len = utf8_seq_len(w[off]);
        if (len > n - off) len = n - off;
        s->syms[ns] = (tok_sym){(uint32_t)off, (uint32_t)len, ns - 1, off + len == n ? -1 : ns + 1};
        ns++;
        off += len;
    }
    s->heap_n = 0;
    for (int32_t i = 1; i < ns; i++)
        if (!push_pair(t, s, w, i - 1, i)) return false;
    while (s->heap_n) {
        tok_bigram bg = tok_heap_pop(s);
        tok_sym *l = &s->syms[bg.left], *r = &s->syms[bg.right];
        /* Stale when either side has changed since the pair was queued. */
        if (!l->n || !r->n || l->n + r->n != bg.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = bg.left;
        if (!push_pair(t, s, w, l->prev, bg.left) || !push_pair(t, s, w, bg.left, l->next))
            return false;
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const tok_sym *sy = &s->syms[i];
        int32_t id = tok_vocab_find(t, (const char *)w + sy->off, sy->n);
        if (id >= 0) {
            if (!tok_ids_push(out, id)) return false;
            continue;
        }
        /* No token: each byte of the symbol alone, where one exists. */
        for (uint32_t k = 0; k < sy->n; k++) {
            id = tok_vocab_find(t, (const char *)w + sy->off + k, 1);
            if (id >= 0 && !tok_ids_push(out, id)) return false;
        }
    }
    return true;
}

cellm_status tok_bpe_encode(const tokenizer *t, tok_scratch *s, const uint8_t *text, size_t n,
                            tok_ids *out, cellm_error *err) {
    /* Code points and their classes. */
    if (!tok_grow((void **)&s->cps, &s->cps_cap, n, sizeof *s->cps) ||
        !tok_grow((void **)&s->cls, &s->cls_cap, n, 1))
        goto oom;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        size_t used;
        uint32_t cp = utf8_decode_lenient(text + i, n - i, &used);
        s->cps[m] = cp;
        s->cls[m] = (uint8_t)unicode_class(cp);
        m++;
        i += used;
    }
    size_t n_segs;
    if (!pre_tokenize(t, s, m, &n_segs)) goto oom;

    /* GPT-2's byte map, each byte's character as UTF-8. */
    uint8_t map[256][2], map_len[256];
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        map_len[b] = (uint8_t)utf8_encode(unicode_byte_to_cp((uint8_t)b), u);
        memcpy(map[b], u, 2);
    }
    size_t start = 0;
    for (size_t g = 0; g < n_segs; g++) {
        size_t len = s->segs[g];
        /* At most 4 bytes per code point, 2 mapped bytes per byte. */
        if (!tok_grow((void **)&s->buf, &s->buf_cap, len * 8, 1)) goto oom;
        size_t w = 0;
        for (size_t i = start; i < start + len; i++) {
            uint8_t u[4];
            size_t k = utf8_encode(s->cps[i], u);
            for (size_t j = 0; j < k; j++) {
                memcpy(s->buf + w, map[u[j]], map_len[u[j]]);
                w += map_len[u[j]];
            }
        }
        if (!bpe_word(t, s, s->buf, w, out)) goto oom;
        start += len;
    }
    return CELLM_OK;
oom:
    return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory (BPE, %zu bytes)", n);
}
