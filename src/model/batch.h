/*
 * batch.h — what every backend does around its forward pass, so the KV
 * cache's tables come out the same whatever runs (model/backend.h):
 * check a flat batch and reserve the KV blocks of its new positions before
 * computing, then advance each sequence and trim its windows after.
 */
#ifndef CELLM_BATCH_H
#define CELLM_BATCH_H

#include <stdint.h>

#include "model/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"

/* Checks rows[0..n) (a sequence per row, tokens in the vocabulary, each
 * sequence's rows continuing it in order, at most max_rows rows and
 * max_logit_rows asking for logits) and reserves the KV blocks of their
 * positions. CELLM_ERR_INVALID_ARG for a bad batch, CELLM_ERR_NO_MEMORY
 * when the blocks do not fit; then nothing may be computed, and the blocks
 * reserved for the rows before the one that failed stay with their
 * sequences (theirs to fill later). */
cellm_status batch_reserve(const model *m, kv_cache *kv, const fwd_row *rows, int32_t n,
                           int32_t max_rows, int32_t max_logit_rows, cellm_error *err);

/* After the pass: each sequence's length moves past its rows, and the
 * blocks that left a window are freed (kv_seq_trim). */
void batch_advance(kv_cache *kv, const fwd_row *rows, int32_t n);

#endif /* CELLM_BATCH_H */
