/*
 * stop.c — the stop-string matcher (see stop.h).
 *
 * The held text is searched again on every piece. Both are short (the tail
 * is shorter than the longest stop string), so a plain search is cheaper
 * than keeping automaton state and keeps the code easy to check.
 */
#include "text/stop.h"

#include <stdlib.h>
#include <string.h>

struct stop_matcher {
    char **stops;
    size_t *lens;
    size_t n;
    char *held; /* text not yet emitted */
    size_t held_len, held_cap;
    char *out; /* what the last call emitted */
    size_t out_cap;
    int matched;
};

cellm_status stop_create(const char *const *stops, size_t n, stop_matcher **out, cellm_error *err) {
    *out = NULL;
    stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    m->matched = -1;
    if (n) {
        m->stops = calloc(n, sizeof *m->stops);
        m->lens = calloc(n, sizeof *m->lens);
        if (!m->stops || !m->lens) {
            stop_free(m);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) {
            stop_free(m);
            return err_set(err, CELLM_ERR_INVALID_ARG, "stop string %zu is empty", i);
        }
        m->lens[i] = strlen(stops[i]);
        m->stops[i] = malloc(m->lens[i] + 1);
        if (!m->stops[i]) {
            stop_free(m);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        }
        memcpy(m->stops[i], stops[i], m->lens[i] + 1);
        m->n = i + 1;
    }
    *out = m;
    return CELLM_OK;
}

void stop_free(stop_matcher *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->held);
    free(m->out);
    free(m);
}

void stop_reset(stop_matcher *m) {
    m->held_len = 0;
    m->matched = -1;
}

int stop_matched(const stop_matcher *m) {
    return m->matched;
}

static bool reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    char *p = realloc(*buf, c);
    if (!p) return false;
    *buf = p;
    *cap = c;
    return true;
}

cellm_status stop_reserve(stop_matcher *m, size_t max_piece, cellm_error *err) {
    size_t longest = 0, need;
    for (size_t i = 0; i < m->n; i++)
        if (m->lens[i] > longest) longest = m->lens[i];
    if (!size_add(longest, max_piece, &need) || !reserve(&m->held, &m->held_cap, need) ||
        !reserve(&m->out, &m->out_cap, need))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    return CELLM_OK;
}

/* Moves held[0..n) to the output buffer and drops it from the held text. */
static bool emit_front(stop_matcher *m, size_t n, const char **emit, size_t *emit_len) {
    if (!reserve(&m->out, &m->out_cap, n ? n : 1)) return false;
    memcpy(m->out, m->held, n);
    memmove(m->held, m->held + n, m->held_len - n);
    m->held_len -= n;
    *emit = m->out;
    *emit_len = n;
    return true;
}

cellm_status stop_feed(stop_matcher *m, const char *piece, size_t len, const char **emit,
                       size_t *emit_len, bool *stopped, cellm_error *err) {
    *emit = "";
    *emit_len = 0;
    *stopped = m->matched >= 0;
    if (*stopped) return CELLM_OK;
    size_t need;
    if (!size_add(m->held_len, len, &need) || !reserve(&m->held, &m->held_cap, need))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    if (len) memcpy(m->held + m->held_len, piece, len);
    m->held_len = need;
    /* The earliest match wins; at one start, the longest stop string. */
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < m->n; i++) {
        const size_t L = m->lens[i];
        for (size_t at = 0; at + L <= m->held_len && at <= best; at++) {
            if (memcmp(m->held + at, m->stops[i], L) == 0) {
                if (at < best || m->lens[i] > m->lens[m->matched]) {
                    best = at;
                    m->matched = (int)i;
                }
                break;
            }
        }
    }
    if (m->matched >= 0) {
        m->held_len = best;
        *stopped = true;
        if (!emit_front(m, best, emit, emit_len))
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        return CELLM_OK;
    }
    /* Hold the longest tail that is a proper prefix of some stop string. */
    size_t hold = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t k = m->lens[i] - 1 < m->held_len ? m->lens[i] - 1 : m->held_len;
        for (; k > hold; k--) {
            if (memcmp(m->held + m->held_len - k, m->stops[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    if (!emit_front(m, m->held_len - hold, emit, emit_len))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    return CELLM_OK;
}

void stop_flush(stop_matcher *m, const char **emit, size_t *emit_len) {
    *emit = "";
    *emit_len = 0;
    if (m->matched >= 0 || m->held_len == 0) return;
    /* Swap the buffers instead of copying, so flushing cannot fail. */
    char *t = m->out;
    size_t tc = m->out_cap;
    m->out = m->held;
    m->out_cap = m->held_cap;
    m->held = t;
    m->held_cap = tc;
    *emit = m->out;
    *emit_len = m->held_len;
    m->held_len = 0;
}
