/*
 * tok_spm.c — SentencePiece-style encoding (tokenizer.ggml.model = "llama"),
 * as llama.cpp's llm_tokenizer_spm does it.
 *
 * Spaces are written as U+2581 "▁" (with one added in front when the
 * vocabulary asks for a space prefix), the text is cut into characters by
 * their UTF-8 lead bytes, and adjacent pieces are merged while their
 * concatenation is a token: the pair whose token has the highest score
 * first (leftmost among equals), from a heap. A piece left over that is
 * not a token is written as byte tokens <0xNN>, so every byte string has
 * an encoding and decodes back to itself.
 */
#include "text/tok_internal.h"

#include <string.h>

#include "text/unicode.h"

/* Maps a score to an unsigned key that sorts high scores first. */
static uint32_t score_key(float f) {
    if (f == 0.0f) f = 0.0f; /* -0 and +0 tie, as they compare equal */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending with f */
    return ~u;
}

static bool push_pair(const tokenizer *t, tok_scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const tok_sym *a = &s->syms[l], *b = &s->syms[r];
    int32_t id = tok_vocab_find(t, (const char *)s->buf + a->off, a->n + b->n);
    if (id < 0) return true;
    tok_bigram bg = {((uint64_t)score_key(tok_score(t, id)) << 32) | (uint32_t)l, l, r,
                     a->n + b->n};
    return tok_heap_push(s, bg);
}

cellm_status tok_spm_encode(const tokenizer *t, tok_scratch *s, const uint8_t *text, size_t n,
                            bool space_prefix, tok_ids *out, cellm_error *err) {
    /* Escape: each ' ' becomes the three bytes of "▁". */
    size_t need;
    if (!size_mul(n + 1, 3, &need) || !tok_grow((void **)&s->buf, &s->buf_cap, need, 1)) goto oom;
    size_t w = 0;
    static const uint8_t lower_block[3] = {0xE2, 0x96, 0x81};
    if (space_prefix) {
        memcpy(s->buf, lower_block, 3);
        w = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + w, lower_block, 3);
            w += 3;
        } else {
            s->buf[w++] = text[i];
        }
    }
    if (w > INT32_MAX) goto oom;

    if (!tok_grow((void **)&s->syms, &s->syms_cap, w, sizeof *s->syms)) goto oom;
    int32_t ns = 0;
    for (size_t off = 0; off < w;) {
        size_t len = utf8_seq_len(s->buf[off]);
        if (len > w - off) len = w - off;
        s->syms[ns] = (tok_sym){(uint32_t)off, (uint32_t)len, ns - 1, off + len == w ? -1 : ns + 1};
        ns++;
        off += len;
    }
    if (!ns) return CELLM_OK;
    s->heap_n = 0;
    for (int32_t i = 1; i < ns; i++)
        if (!push_pair(t, s, i - 1, i)) goto oom;
    while (s->heap_n) {
        tok_bigram bg = tok_heap_pop(s);
        tok_sym *l = &s->syms[bg.left], *r = &s->syms[bg.right];
        if (!l->n || !r->n || l->n + r->n != bg.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = bg.left;
        if (!push_pair(t, s, l->prev, bg.left) || !push_pair(t, s, bg.left, l->next)) goto oom;
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const tok_sym *sy = &s->syms[i];
        /* Merged pieces are tokens by construction; a single character
         * may not be, and then falls back to its bytes. */
        int32_t id = tok_vocab_find(t, (const char *)s->buf + sy->off, sy->n);
        if (id >= 0) {
            if (!tok_ids_push(out, id)) goto oom;
            continue;
        }
        for (uint32_t k = 0; k < sy->n; k++) {
            int32_t b = t->byte_tok[s->buf[sy->off + k]];
            if (b < 0) b = t->unk;
            if (b >= 0 && !tok_ids_push(out, b)) goto oom;
        }
    }
    return CELLM_OK;
oom:
    return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer: out of memory (SentencePiece, %zu bytes)",
                   n);
}
