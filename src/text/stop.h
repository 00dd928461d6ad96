/*
 * stop.h — stop strings over streamed text. The detokenizer hands decoded
 * pieces (whole UTF-8 characters) to a matcher as tokens are sampled; the
 * matcher passes on the text that can no longer be part of a stop string and
 * holds back any tail that could still be the start of one, so a stop string
 * that spans several tokens is found and none of its bytes is ever emitted.
 *
 * One matcher serves one request; it is not thread-safe. Memory: the held
 * tail is at most (longest stop string - 1) bytes plus the current piece.
 */
#ifndef CELLM_STOP_H
#define CELLM_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/util.h"

typedef struct stop_matcher stop_matcher;

/* A matcher for n stop strings (NUL-terminated, non-empty; copied). n may
 * be 0: then every piece passes straight through. */
cellm_status stop_create(const char *const *stops, size_t n, stop_matcher **out, cellm_error *err);
void stop_free(stop_matcher *m);

/* Sizes the matcher's buffers for pieces of up to max_piece bytes, so that
 * stop_feed never allocates afterwards (the engine calls it at submit). */
cellm_status stop_reserve(stop_matcher *m, size_t max_piece, cellm_error *err);

/* Forgets held text and any match, for a new generation. */
void stop_reset(stop_matcher *m);

/* Feeds one decoded piece. *emit / *emit_len get the text that is now safe
 * to show (owned by the matcher, valid until the next call on it; may be
 * empty). *stopped becomes true when a stop string has matched: the emitted
 * text then ends just before it, and later feeds emit nothing. */
cellm_status stop_feed(stop_matcher *m, const char *piece, size_t len, const char **emit,
                       size_t *emit_len, bool *stopped, cellm_error *err);

/* At the end of a generation that did not stop on a string (EOS, max
 * tokens): releases the held tail, which is then known not to be a stop
 * string. Emits nothing after a match. */
void stop_flush(stop_matcher *m, const char **emit, size_t *emit_len);

/* The index of the stop string that matched, or -1. */
int stop_matched(const stop_matcher *m);

#endif /* CELLM_STOP_H */
