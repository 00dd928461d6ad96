/*
 * rt.h — what the single-sequence commands (run, perplexity) share: a model
 * with its tokenizer, KV cache, thread pool and forward context, opened from
 * a path or store name, and a helper that feeds one sequence in chunks.
 * (Serving many sequences goes through the engine, src/engine.c.) The chat formats live in the
 * library (src/chat.h).
 */
#ifndef CELLM_RT_H
#define CELLM_RT_H

#include <stdbool.h>
#include <stdint.h>

#include "chat.h"
#include "forward.h"
#include "tokenizer.h"

typedef struct rt {
    model *m;
    tokenizer *tok;
    kv_cache *kv;
    threadpool *tp;
    forward_ctx *fwd;
    int32_t batch; /* rows per forward call */
    int32_t ctx;
} rt;

typedef struct rt_opts {
    int threads; /* 0: all cores, at most 4 */
    int32_t ctx; /* 0: the model's, at most 4096 */
    int32_t batch;
    int32_t logit_rows; /* rows that may want logits in one call */
} rt_opts;

/* Resolves `name_or_path` (fetching a known model if needed) and opens it. */
cellm_status rt_open(const char *name_or_path, const rt_opts *o, rt *r, cellm_error *err);
void rt_close(rt *r);

/* Feeds tok[0..n) to `s`; if `logits` is not NULL, copies the last token's
 * logits there (n_vocab floats). */
cellm_status rt_feed(rt *r, kv_seq *s, const int32_t *tok, int32_t n, float *logits,
                     cellm_error *err);

#endif /* CELLM_RT_H */
