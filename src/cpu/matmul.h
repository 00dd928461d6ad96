/*
 * matmul.h — y = x·Wᵀ for a quantized weight matrix W (n rows of k
 * elements, any type with a vec_dot in the type table) and m activation
 * rows x (f32). The activation rows are quantized once to W's vec_dot_type,
 * then each thread takes a contiguous range of W's rows (its tp_span of
 * 16-row tiles; a thread out of its own takes runs from the back of
 * another's) and, for each tile, runs every activation row over it while
 * it is in cache, so one read of the weights serves the whole batch.
 *
 * Every y[r][j] is one vec_dot call on row r alone: a row's result is
 * bit-identical whatever m is and however many threads run.
 */
#ifndef CELLM_MATMUL_H
#define CELLM_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"

/* Rows of scratch beyond m that matmul may fill with copies of the last
 * row, to run a remainder of fewer than 8 or 4 rows through a whole tile. */
#define MATMUL_PAD_ROWS 7

/* The rows matmul computes for m activation rows of a weight whose type
 * has tiles of eight (`eight`) and of four (`four`) rows: m, or m rounded
 * up to the end of the tile that a remainder of 5-7 rows past the eights
 * or 2-3 past the fours is filled into (the pad rows' results are
 * dropped). Speculative decoding sizes prompt lookup's guesses by it. */
int64_t matmul_padded_rows(bool eight, bool four, int64_t m);

/* Bytes of scratch matmul needs to quantize `m` rows of `k` elements for a
 * weight of `type`, MATMUL_PAD_ROWS more rows included (0 if the type has
 * no vec_dot). */
size_t matmul_scratch_size(uint32_t type, int64_t k, int64_t m);

/* y[m][n] = x[m][k] · W[n][k]ᵀ. `scratch` holds matmul_scratch_size()
 * bytes. `type` must have a vec_dot; k must be whole blocks of it and of its
 * vec_dot_type (the model loader checks both). */
void matmul(threadpool *tp, const void *w, uint32_t type, int64_t n, int64_t k, const float *x,
            int64_t m, float *y, void *scratch);

/* One weight of matmul_multi: y[m][n] = x · Wᵀ. */
typedef struct matmul_job {
    const void *w;
    uint32_t type;
    int64_t n;
    float *y;
} matmul_job;

#define MATMUL_MAX_MULTI 4

/* Memory that the task after a matmul will read (the attention's K and V),
 * in n regions: each thread prefetches its share of the regions (split as
 * tp_split splits them) into its L2, a slice before each tile of weight
 * rows it takes, so that the loads ride on a matmul that computes more
 * than it reads (several activation rows) instead of stalling the task
 * after it. A hint only: the results do not change. */
typedef struct matmul_prefetch {
    const char *const *base;
    const size_t *len;
    int n;
} matmul_prefetch;

/* matmul() of up to MATMUL_MAX_MULTI weights on the same input x[m][k]
 * (Q, K and V; gate and up): x is quantized once and all their rows are
 * one parallel task, so two hand-offs between threads instead of two per
 * weight. Each y[r][j] is the same vec_dot as matmul() gives. Weights
 * whose vec_dot_type differs from the first's run as separate matmuls.
 * `scratch` as for matmul() with the first weight's type. With
 * `quantized`, the caller has already put x's rows into scratch in the
 * weights' input format (matmul_quantize_row, rows matmul_input_row_bytes
 * apart), which it may do only where matmul_shares_input holds; x is read
 * only where it does not. `pf` (or NULL): memory to prefetch meanwhile. */
void matmul_multi(threadpool *tp, const matmul_job *jobs, int n_jobs, int64_t k, const float *x,
                  int64_t m, void *scratch, bool quantized, const matmul_prefetch *pf);

/* Prefetches into L2 the first `bytes` (at most the rest of that weight)
 * of the weight rows that thread ith of nth starts a matmul_multi of
 * `jobs` (k columns) with, or a matmul of one: the front of its span,
 * where its weight stream starts and the kernels' own prefetching ahead
 * has not begun. For the task before the matmul; a hint only. */
void matmul_prefetch_start(const matmul_job *jobs, int n_jobs, int64_t k, int ith, int nth,
                           size_t bytes);

/* Whether matmul_multi quantizes its input once for all of `jobs`. */
bool matmul_shares_input(const matmul_job *jobs, int n_jobs);

/* Where matmul keeps activation row r of k elements, quantized to the
 * input format of a weight of `type`, in `scratch`: matmul_input_row(...,
 * 0) plus r times matmul_input_row_bytes (rows padded to whole cache
 * lines, placed so that each row's int8 codes start on one); and that row
 * quantized: what matmul does with each row of x, so a caller that
 * produces the rows one by one (a norm, an activation) can quantize each
 * as it is made and save matmul a pass and a hand-off between threads. */
size_t matmul_input_row_bytes(uint32_t type, int64_t k);
void *matmul_input_row(uint32_t type, int64_t k, void *scratch, int64_t r);
void matmul_quantize_row(uint32_t type, int64_t k, const float *x, void *xq);

/* Dequantizes row `row` of a matrix of `type` with `k` elements per row. */
void matrix_get_row(const void *w, uint32_t type, int64_t k, int64_t row, float *out);

#endif /* CELLM_MATMUL_H */
