/*
 * kv_calib.h — a window KV type's centred and balanced keys. Most of
 * 4-bit keys' remaining loss on some models (Gemma 3) is a fixed offset
 * and an uneven spread over the channels: the statistics of the model's
 * own keys and queries on a short built-in text, taken once when the
 * cache is made, say what to take off each channel and how to weigh it
 * (kv_cache.kmean, kscale). The pass runs one sequence through the
 * backend, and sums in batch order, so the statistics (and every result
 * after) are the same bits whatever the threads, the batch or the CPU.
 */
#ifndef CELLM_KV_CALIB_H
#define CELLM_KV_CALIB_H

#include "model/backend.h"
#include "model/kv_cache.h"
#include "text/tokenizer.h"

/* The built-in text (English prose, instructions, numbers, a little
 * code): its first KV_CALIB_TOKENS tokens (in `tok`, with its special
 * tokens) are the sample. */
extern const char kv_calib_text[];
#define KV_CALIB_TOKENS 512

/* Runs the sample (capped by the context) through `fwd` on a sequence of
 * its own in passes of max_rows, gathers the statistics and sets kv's
 * kmean and kscale; a pool too small for the whole sample uses the
 * passes that fit. Nothing for a type that is not a window type. The
 * sequence's blocks go back to the pool. */
cellm_status kv_calibrate(kv_cache *kv, const model *m, const tokenizer *tok, backend *fwd,
                          int32_t max_rows, cellm_error *err);

#endif /* CELLM_KV_CALIB_H */
