/*
 * serve_affinity.c — the affinity key of a completion request: what a load
 * balancer in front of several `cellm serve` instances may hash so that
 * requests sharing a prefix (a conversation, a system prompt) land on the
 * instance whose prefix cache holds it (docs/deploy.md).
 *
 * In order: the client's X-Session-Id header ("session:ID"), the body's
 * `user` field ("user:NAME"), else a hash of the first --affinity-tokens
 * tokens of the prompt's text ("prefix:HEX"). The server sends the key back
 * in X-Cellm-Affinity and logs it; it does not route anything itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "serve.h"

#define BYTES_PER_TOKEN 16 /* text read per token wanted: tokens are shorter */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define FNV_BASIS 0xcbf29ce484222325ull

bool serve_plain_id(const char *v) {
    size_t n = strlen(v);
    bool plain = n > 0 && n <= SERVE_ID_MAX;
    for (size_t i = 0; plain && i < n; i++) plain = v[i] > 0x20 && v[i] < 0x7f;
    return plain;
}

/* "kind:VALUE" when the value is short printable ASCII (safe in a header
 * and a log line), else "kind:h" and a hash of it. */
static void put_id(char out[SERVE_AFFINITY_MAX], const char *kind, const char *v) {
    if (serve_plain_id(v))
        snprintf(out, SERVE_AFFINITY_MAX, "%s:%s", kind, v);
    else
        snprintf(out, SERVE_AFFINITY_MAX, "%s:h%016llx", kind,
                 (unsigned long long)fnv1a(FNV_BASIS, v, strlen(v)));
}

/* Appends s to the buffer *b (*n bytes of *cap) up to `limit` bytes. */
static bool add_text(char **b, size_t *n, size_t *cap, size_t limit, const char *s) {
    size_t k = strlen(s);
    if (*n >= limit) return true;
    if (k > limit - *n) k = limit - *n;
    if (!serve_grow(b, cap, *n + k + 1)) return false;
    memcpy(*b + *n, s, k);
    *n += k;
    (*b)[*n] = '\0';
    return true;
}

/* The length of b[0..n) without a UTF-8 character cut short at its end. */
static size_t whole_chars(const char *b, size_t n) {
    size_t i = n;
    while (i > 0 && ((unsigned char)b[i - 1] & 0xC0) == 0x80) i--;
    if (i == 0) return n;
    unsigned char lead = (unsigned char)b[i - 1];
    size_t need = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return n - (i - 1) < need ? i - 1 : n;
}

/* The start of the prompt's text (at most `limit` bytes, cut on a whole
 * UTF-8 character): a chat's messages as "role\ncontent\n" (or its tools and
 * messages as JSON when tools are in play), a completion's first prompt. A
 * new string (NULL when out of memory or for a prompt of token ids). */
static char *prompt_text(const serve_req *rq, size_t limit, size_t *len) {
    char *b = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    if (rq->kind == SERVE_CHAT && rq->messages_json) {
        if (rq->tools_json) ok = add_text(&b, &n, &cap, limit, rq->tools_json);
        ok = ok && add_text(&b, &n, &cap, limit, rq->messages_json);
    } else if (rq->kind == SERVE_CHAT) {
        for (int32_t i = 0; ok && i < rq->n_messages && n < limit; i++)
            ok = add_text(&b, &n, &cap, limit, rq->messages[i].role) &&
                 add_text(&b, &n, &cap, limit, "\n") &&
                 add_text(&b, &n, &cap, limit, rq->messages[i].content) &&
                 add_text(&b, &n, &cap, limit, "\n");
    } else if (rq->n_prompts > 0 && rq->prompts[0].text) {
        ok = add_text(&b, &n, &cap, limit, rq->prompts[0].text);
    } else {
        return NULL;
    }
    if (!ok || !b) {
        free(b);
        return NULL;
    }
    *len = whole_chars(b, n);
    return b;
}

void serve_affinity(server *s, struct MHD_Connection *conn, const serve_req *rq,
                    char out[SERVE_AFFINITY_MAX]) {
    const char *sid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Session-Id");
    if (sid && *sid) {
        put_id(out, "session", sid);
        return;
    }
    if (rq->user && *rq->user) {
        put_id(out, "user", rq->user);
        return;
    }
    int32_t want = s->o.affinity_tokens;
    uint64_t h = FNV_BASIS;
    if (rq->kind == SERVE_COMPLETION && rq->n_prompts > 0 && !rq->prompts[0].text) {
        const serve_prompt *p = &rq->prompts[0];
        int32_t k = p->n_tokens < want ? p->n_tokens : want;
        for (int32_t i = 0; i < k; i++) h = fnv1a(h, &p->tokens[i], sizeof p->tokens[i]);
    } else {
        size_t len = 0;
        char *text = prompt_text(rq, (size_t)want * BYTES_PER_TOKEN, &len);
        int32_t *ids = NULL, n = 0;
        if (text && cellm_tokenize_ex(s->model, text, len, 0, &ids, &n) == CELLM_OK) {
            int32_t k = n < want ? n : want;
            for (int32_t i = 0; i < k; i++) h = fnv1a(h, &ids[i], sizeof ids[i]);
        } else if (text) {
            h = fnv1a(h, text, len); /* text the tokenizer refused: its bytes */
        }
        free(ids);
        free(text);
    }
    snprintf(out, SERVE_AFFINITY_MAX, "prefix:%016llx", (unsigned long long)h);
}
