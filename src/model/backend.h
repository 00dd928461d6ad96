/*
 * backend.h — the seam between the runtime and what runs a model's
 * forward pass (DESIGN.md, "Backends behind one seam"). A backend takes one
 * flat batch of rows, (sequence, position, token) that may mix prompt
 * chunks of several sequences with single decode tokens of others, runs
 * the whole pass over it and hands back the logits of the rows that ask
 * for them. Everything above the seam (the scheduler, the prefix cache,
 * sessions, the sampler, the API) sees only this: it never learns which
 * backend runs.
 *
 * The KV cache's bookkeeping (block tables, reference counts, the prefix
 * index: model/kv_cache.h) is shared; a backend keeps the blocks' contents
 * where it computes (host memory for the CPU, a device buffer for a GPU)
 * and reads them through the same block tables. A run reserves the blocks
 * its rows need (kv_seq_reserve, which may copy a shared block first:
 * kv_storage), writes each row's K and V at its position, advances each
 * sequence and trims the blocks that left a window (kv_seq_trim), exactly
 * as the CPU backend does, so the tables stay the same whatever runs.
 *
 * Backends: cpu/forward.h (forward_backend) and, where the build has it,
 * vulkan/. runtime/device.h picks one.
 */
#ifndef CELLM_BACKEND_H
#define CELLM_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"
#include "model/kv_cache.h"

typedef struct fwd_row {
    kv_seq *seq;
    int32_t token;
    int32_t pos; /* must be the sequence's next position(s), in order */
    bool logits; /* return logits for this row */
} fwd_row;

/* The best logits of a row, best first: a larger logit first, a tie to
 * the lower token, NaN last. What a backend may hand back instead of the
 * whole row for a row whose token is picked greedily (the engine's top
 * rows: sampler_pick_top), so that a GPU sends K pairs to the host, not
 * n_vocab floats. */
#define FWD_TOP_K 8
typedef struct fwd_top {
    float logit[FWD_TOP_K];
    int32_t token[FWD_TOP_K];
} fwd_top;

/* What a backend implements. run: the pass over rows[0..n), where row r's
 * input is the n_embd floats at embd[r] instead of its token's embedding
 * when embd (may be NULL) and embd[r] are not NULL (an image's rows); on
 * success *logits points to one row of n_vocab floats per row that asked,
 * in batch order, valid until the next run. Nothing is computed when the
 * KV blocks do not fit (CELLM_ERR_NO_MEMORY) or the batch is bad
 * (CELLM_ERR_INVALID_ARG); an error of the device is its status with a
 * message. free: everything the backend holds, on the host and the
 * device. */
typedef struct backend_ops {
    const char *name; /* "cpu", "vulkan" */
    cellm_status (*run)(void *impl, const fwd_row *rows, const float *const *embd, int32_t n,
                        const float **logits, cellm_error *err);
    void (*free)(void *impl);
    /* Optional (NULL: the backend has none): the pass as run, but on
     * success *top points to one fwd_top per row that asked for logits,
     * in batch order, valid until the next run, instead of the logits. */
    cellm_status (*run_top)(void *impl, const fwd_row *rows, const float *const *embd, int32_t n,
                            const fwd_top **top, cellm_error *err);
} backend_ops;

/* A backend made for one model, one KV cache and batch limits. A zeroed
 * backend is "none" (backend_free ignores it). */
typedef struct backend {
    const backend_ops *ops;
    void *impl;
} backend;

static inline cellm_status backend_run(backend *b, const fwd_row *rows, int32_t n,
                                       const float **logits, cellm_error *err) {
    return b->ops->run(b->impl, rows, NULL, n, logits, err);
}

static inline cellm_status backend_run_embd(backend *b, const fwd_row *rows,
                                            const float *const *embd, int32_t n,
                                            const float **logits, cellm_error *err) {
    return b->ops->run(b->impl, rows, embd, n, logits, err);
}

static inline bool backend_has_top(const backend *b) {
    return b->ops && b->ops->run_top;
}

static inline cellm_status backend_run_top(backend *b, const fwd_row *rows,
                                           const float *const *embd, int32_t n, const fwd_top **top,
                                           cellm_error *err) {
    return b->ops->run_top(b->impl, rows, embd, n, top, err);
}

static inline void backend_free(backend *b) {
    if (b->ops) b->ops->free(b->impl);
    b->ops = NULL;
    b->impl = NULL;
}

static inline const char *backend_name(const backend *b) {
    return b->ops ? b->ops->name : "none";
}

#endif /* CELLM_BACKEND_H */
