/*
 * tok_decode.c — token ids back to text: whole sequences (tokenizer_decode)
 * and the streaming detokenizer (tok_stream) that hands out text as ids
 * arrive without ever splitting a UTF-8 character.
 *
 * Pieces are precomputed at load (tokenizer.c), so decoding is a lookup and
 * a copy; the stream allocates nothing.
 */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"

cellm_status tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                              char **out, size_t *out_len, cellm_error *err) {
    if (!t || !out || !out_len || (!ids && n))
        return err_set(err, CELLM_ERR_INVALID_ARG, "tokenizer_decode: NULL argument");
    *out = NULL;
    *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (!tokenizer_piece(t, ids[i], flags, &len))
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "tokenizer_decode: id %d at %zu is not in the vocabulary (0..%d)",
                           ids[i], i, t->n_vocab - 1);
        if (!size_add(total, len, &total))
            return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer_decode: text too long");
    }
    char *s = malloc(total + 1);
    if (!s) return err_set(err, CELLM_ERR_NO_MEMORY, "tokenizer_decode: out of memory");
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = tokenizer_piece(t, ids[i], flags, &len);
        memcpy(s + w, p, len);
        w += len;
    }
    s[w] = '\0';
    *out = s;
    *out_len = w;
    return CELLM_OK;
}

void tok_stream_init(tok_stream *s, const tokenizer *t, unsigned flags) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
}

size_t tok_stream_bound(const tokenizer *t) {
    /* Every byte may turn into a 3-byte U+FFFD; 3 held bytes come first. */
    return 3 * (t->max_piece + 4);
}

static const uint8_t replacement[3] = {0xEF, 0xBF, 0xBD};

/* Moves the whole characters of in[0..n) to out (malformed starts as
 * U+FFFD); returns how many trailing bytes are an unfinished character
 * (they are not consumed). */
static size_t emit_complete(const uint8_t *in, size_t n, uint8_t *out, size_t *w) {
    size_t i = 0;
    while (i < n) {
        size_t len;
        utf8_status st = utf8_check(in + i, n - i, &len);
        if (st == UTF8_INCOMPLETE) return n - i;
        if (st == UTF8_VALID) {
            memcpy(out + *w, in + i, len);
        } else {
            memcpy(out + *w, replacement, 3);
        }
        *w += st == UTF8_VALID ? len : 3;
        i += len;
    }
    return 0;
}

cellm_status tok_stream_push(tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out,
                             cellm_error *err) {
    *n_out = 0;
    size_t len;
    const char *p = tokenizer_piece(s->t, id, s->flags, &len);
    if (!p)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "tok_stream_push: id %d is not in the vocabulary", id);
    if (cap < tok_stream_bound(s->t))
        return err_set(err, CELLM_ERR_INVALID_ARG, "tok_stream_push: %zu bytes of room, need %zu",
                       cap, tok_stream_bound(s->t));
    const uint8_t *piece = (const uint8_t *)p;
    uint8_t *o = (uint8_t *)out;
    size_t w = 0, used = 0;
    /* First finish (or give up on) the character held from before: join
     * the held bytes with the next few of this piece. */
    while (s->n_held && used < len) {
        uint8_t tmp[8];
        size_t take = len - used < 4 ? len - used : 4;
        memcpy(tmp, s->held, s->n_held);
        memcpy(tmp + s->n_held, piece + used, take);
        size_t k = s->n_held + take, clen;
        utf8_status st = utf8_check(tmp, k, &clen);
        if (st == UTF8_INCOMPLETE) { /* the piece ended inside it */
            memcpy(s->held, tmp, k);
            s->n_held = k;
            used = len;
            break;
        }
        if (st == UTF8_VALID)
            memcpy(o + w, tmp, clen);
        else
            memcpy(o + w, replacement, 3);
        w += st == UTF8_VALID ? clen : 3;
        if (clen >= s->n_held) {
            used += clen - s->n_held;
            s->n_held = 0;
        } else { /* the malformed start was shorter than what was held */
            memmove(s->held, s->held + clen, s->n_held - clen);
            s->n_held -= clen;
        }
    }
    if (!s->n_held && used < len) {
        size_t rest = emit_complete(piece + used, len - used, o, &w);
        memcpy(s->held, piece + len - rest, rest);
        s->n_held = rest;
    }
    *n_out = w;
    return CELLM_OK;
}

cellm_status tok_stream_flush(tok_stream *s, char *out, size_t cap, size_t *n_out,
                              cellm_error *err) {
    *n_out = 0;
    if (s->n_held) {
        if (cap < 3)
            return err_set(err, CELLM_ERR_INVALID_ARG, "tok_stream_flush: %zu bytes of room", cap);
        memcpy(out, replacement, 3);
        *n_out = 3;
    }
    tok_stream_init(s, s->t, s->flags);
    return CELLM_OK;
}
