/*
 * forward.h — one forward pass over a flat batch. A batch is a list of rows
 * (sequence, position, token) that may mix prompt chunks of several
 * sequences with single decode tokens of others; logits come back only for
 * the rows that ask for them. All activation memory is allocated once, in
 * forward_create(), for the largest batch the caller will run.
 */
#ifndef CELLM_FORWARD_H
#define CELLM_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "model/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"

typedef struct forward_ctx forward_ctx;

/* Buffers for batches of up to `max_rows` rows, of which up to
 * `max_logit_rows` ask for logits. */
cellm_status forward_create(const model *m, kv_cache *kv, threadpool *tp, int32_t max_rows,
                            int32_t max_logit_rows, forward_ctx **out, cellm_error *err);
void forward_free(forward_ctx *f);

/* Bytes forward_create() allocates for these limits (for budgeting). */
size_t forward_bytes(const model *m, int32_t max_rows, int32_t max_logit_rows, int n_threads,
                     int32_t max_ctx);

/* Runs the batch. Reserves KV blocks for the new positions first (nothing
 * is computed if they do not fit: CELLM_ERR_NO_MEMORY), writes K/V, and
 * advances each sequence. On success *logits points to one row of n_vocab
 * floats per row that asked, in batch order, valid until the next call. */
cellm_status forward_run(forward_ctx *f, const fwd_row *rows, int32_t n_rows, const float **logits,
                         cellm_error *err);

/* forward_run() where row r's input is the n_embd floats at embd[r]
 * instead of its token's embedding when embd[r] is not NULL (an image's
 * rows, from vision.h; its token stays the image token, for the prefix
 * cache). `embd` may be NULL: every row is a token. */
cellm_status forward_run_embd(forward_ctx *f, const fwd_row *rows, const float *const *embd,
                              int32_t n, const float **logits, cellm_error *err);

/* The first layers of a pass, for a backend that runs the rest (a GPU
 * that holds only the last layers: vulkan/vk_forward.h): the rows' inputs
 * (as forward_run_embd) through layers [0, end), whose K and V rows it
 * writes; *x then points to the residual stream after layer end - 1, n_embd
 * floats per row, valid until the next call. The caller reserved the
 * rows' KV blocks (batch_reserve) and advances the sequences after the
 * rest of the pass (batch_advance); the rows are as forward_run's. */
cellm_status forward_run_layers(forward_ctx *f, const fwd_row *rows, const float *const *embd,
                                int32_t n, int32_t end, const float **x, cellm_error *err);

/* The CPU backend (model/backend.h): forward_create()'s context behind the
 * seam; the backend owns it (backend_free frees it). */
cellm_status forward_backend(const model *m, kv_cache *kv, threadpool *tp, int32_t max_rows,
                             int32_t max_logit_rows, backend *out, cellm_error *err);

#endif /* CELLM_FORWARD_H */
