/*
 * matmul.c — quantized matrix times a batch of activation rows (see
 * matmul.h).
 */
#include "cpu/matmul.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "format/quant.h"

#define TILE_ROWS 16 /* weight rows kept hot while every activation row passes */

typedef struct mm_task {
    const quant_type_info *wt, *xt;
    const uint8_t *w;
    size_t w_row, x_row; /* bytes per weight row, per quantized activation row */
    int64_t n, k, m;
    const float *x;
    float *y;
    uint8_t *xq;
} mm_task;

/* One or several weights on one input (matmul, matmul_multi): their rows
 * taken as one range, split across the threads in one task. */
typedef struct mm_multi {
    mm_task t[MATMUL_MAX_MULTI];
    int n_t;
    long tile0[MATMUL_MAX_MULTI + 1]; /* weight i's tiles: [tile0[i], tile0[i + 1]) */
    const matmul_prefetch *pf;
    int nth; /* the threads the spans are for (0: none, an even split) */
    tp_span span[TP_SPAN_MAX];
} mm_multi;

static void quantize_rows(void *arg, int ith, int nth) {
    mm_task *t = arg;
    long b, e;
    tp_split((long)t->m, ith, nth, &b, &e);
    for (long r = b; r < e; r++)
        t->xt->from_float(t->x + (size_t)r * (size_t)t->k, t->xq + (size_t)r * t->x_row,
                          (size_t)t->k);
}

/* The rows left after the whole groups of eight or four: at least this
 * many go through one more dot8_y or dot4_y, the tile filled up with
 * copies of the last row (pad_input) whose results are dropped. A tile's
 * rows share each weight block's unpacking, so a padded tile costs less
 * than that many vec_dots (docs/kernels.md, "Remainder rows"). */
#define PAD8_MIN 5
#define PAD4_MIN 2

int64_t matmul_padded_rows(bool eight, bool four, int64_t m) {
    int64_t r = eight ? m / 8 * 8 : 0, rem = m - r;
    if (eight && rem >= PAD8_MIN) return r + 8;
    if (!four) return m;
    r += rem / 4 * 4;
    rem = m - r;
    return rem >= PAD4_MIN ? r + 4 : m;
}

/* The rows dot_tile computes for m rows of a weight of type wt. */
static int64_t padded_rows(const quant_type_info *wt, int64_t m) {
    return matmul_padded_rows(wt->dot8_y != NULL, wt->dot4_y != NULL, m);
}

/* Rows [m, padded_rows) of the quantized input: copies of row m - 1, so a
 * padded tile reads rows that exist (their results are dropped). */
static void pad_input(const mm_task *t) {
    int64_t end = padded_rows(t->wt, t->m);
    for (int64_t r = t->m; r < end; r++)
        memcpy(t->xq + (size_t)r * t->x_row, t->xq + (size_t)(t->m - 1) * t->x_row, t->x_row);
}

/* One tile of weight rows [j0, j1) against every activation row: groups of
 * eight, then four activation rows through dot8_y and dot4_y (each weight
 * block unpacked once for all of them; two weight rows at a time through
 * dot8_y_x2 where there is one, sharing the activation rows' loads, all
 * of the tile's pairs in one call where the group's rows are live), a
 * last group filled up with pad rows where enough are left, then the rest
 * one at a time. Every (weight row, activation row) pair gets the same
 * arithmetic as vec_dot whichever path takes it, so results do not depend
 * on m, the tile or the thread split. */
static void dot_tile(const mm_task *t, long j0, long j1) {
    const quant_type_info *wt = t->wt;
    const size_t n = (size_t)t->n, k = (size_t)t->k;
    const int64_t mp = padded_rows(wt, t->m);
    float out[16];
    int64_t r = 0;
    if (wt->dot8_y) {
        for (; r + 8 <= mp; r += 8) {
            const uint8_t *xq = t->xq + (size_t)r * t->x_row;
            float *yr = t->y + (size_t)r * n;
            int64_t live = t->m - r < 8 ? t->m - r : 8;
            long j = j0;
            if (live == 8 && wt->dot8_y_x2 && j + 2 <= j1) {
                size_t pairs = (size_t)(j1 - j) / 2;
                wt->dot8_y_x2(k, t->w + (size_t)j * t->w_row, t->w_row, pairs, xq, t->x_row, yr + j,
                              n);
                j += 2 * (long)pairs;
            }
            for (; wt->dot8_y_x2 && j + 2 <= j1; j += 2) {
                wt->dot8_y_x2(k, t->w + (size_t)j * t->w_row, t->w_row, 1, xq, t->x_row, out, 2);
                for (int64_t i = 0; i < live; i++) {
                    yr[(size_t)i * n + (size_t)j] = out[2 * i];
                    yr[(size_t)i * n + (size_t)j + 1] = out[2 * i + 1];
                }
            }
            for (; j < j1; j++) {
                wt->dot8_y(k, t->w + (size_t)j * t->w_row, 0, xq, t->x_row, out);
                for (int64_t i = 0; i < live; i++) yr[(size_t)i * n + (size_t)j] = out[i];
            }
        }
    }
    if (wt->dot4_y) {
        for (; r + 4 <= mp; r += 4) {
            const uint8_t *xq = t->xq + (size_t)r * t->x_row;
            float *yr = t->y + (size_t)r * n;
            int64_t live = t->m - r < 4 ? t->m - r : 4;
            for (long j = j0; j < j1; j++) {
                wt->dot4_y(k, t->w + (size_t)j * t->w_row, 0, xq, t->x_row, out);
                for (int64_t i = 0; i < live; i++) yr[(size_t)i * n + (size_t)j] = out[i];
            }
        }
    }
    for (; r < t->m; r++) {
        const uint8_t *xq = t->xq + (size_t)r * t->x_row;
        float *yr = t->y + (size_t)r * n;
        /* One weight row at a time (the tile's rows stay in L1 for the
         * next activation row). A tile of four weight rows was tried and
         * taken out: four interleaved streams prefetch worse, a matvec
         * from memory ran at half speed and a step with 2 sessions lost
         * 40%; two rows (AVX-512 Q4_0) ran at a third of the speed from
         * memory (docs/kernels.md). */
        for (long j = j0; j < j1; j++) yr[j] = wt->vec_dot(k, t->w + (size_t)j * t->w_row, xq);
    }
}

/* A thread's share of the prefetch regions: regions [ri, re), `per` bytes
 * of them issued before each of its tiles, from byte `off` of region ri. */
typedef struct pf_state {
    long ri, re;
    size_t off, per;
} pf_state;

static void pf_start(const matmul_prefetch *pf, int ith, int nth, long tiles, pf_state *ps) {
    *ps = (pf_state){0};
    if (!pf || pf->n <= 0 || tiles <= 0) return;
    tp_split(pf->n, ith, nth, &ps->ri, &ps->re);
    size_t bytes = 0;
    for (long r = ps->ri; r < ps->re; r++) bytes += pf->len[r];
    ps->per = (bytes / (size_t)tiles + 63) & ~(size_t)63;
}

static inline void pf_issue(const matmul_prefetch *pf, pf_state *ps) {
    for (size_t done = 0; done < ps->per && ps->ri < ps->re; done += 64) {
        __builtin_prefetch(pf->base[ps->ri] + ps->off, 0, 2); /* to L2 */
        if ((ps->off += 64) >= pf->len[ps->ri]) {
            ps->off = 0;
            ps->ri++;
        }
    }
}

/* Tiles [lo, hi) of the task's numbering: weight after weight, TILE_ROWS
 * rows each (a weight's last may have fewer). */
static void dot_tiles(const mm_multi *mt, long lo, long hi, pf_state *ps) {
    for (int i = 0; i < mt->n_t && lo < hi; i++) {
        const mm_task *t = &mt->t[i];
        for (; lo < hi && lo < mt->tile0[i + 1]; lo++) {
            pf_issue(mt->pf, ps);
            long j0 = (lo - mt->tile0[i]) * TILE_ROWS;
            dot_tile(t, j0, j0 + TILE_ROWS < (long)t->n ? j0 + TILE_ROWS : (long)t->n);
        }
    }
}

/* This thread's tiles of every weight: its span (the even split), taken
 * half of what is left at a time from the front, then runs from the back
 * of the others' spans until none is left (tp_span), so the threads
 * finish together whichever ran slower (a worker woken late, a core the
 * host lent elsewhere for a while). Each run streams its weight rows in
 * ascending order for the hardware prefetcher; a thread's prefetch regions
 * go on with whatever tiles it takes. Every tile gets the same arithmetic
 * whichever thread takes it. With the attention's spans (forward.c), 8
 * sessions of SmolLM2 gained 1.7% (45 of 60 alternating rounds), the
 * threads' waiting fell from 6.6% of the samples to 2.9%. (Tried before:
 * ranges from one shared counter, guided self-scheduling, which moved the
 * waiting but not the tokens a second; the last 3/16 of the rows claimed
 * 16 at a time, which lost 1-3%: both interleave the threads' runs.) */
static void dot_rows_multi(void *arg, int ith, int nth) {
    mm_multi *mt = arg;
    pf_state ps;
    long lo, hi;
    tp_split(mt->tile0[mt->n_t], ith, nth, &lo, &hi);
    pf_start(mt->pf, ith, nth, hi - lo, &ps);
    if (mt->nth != nth) { /* no spans for this many threads: the even split */
        dot_tiles(mt, lo, hi, &ps);
        return;
    }
    for (int from = 0; tp_span_next(mt->span, ith, nth, true, true, &from, &lo, &hi);)
        dot_tiles(mt, lo, hi, &ps);
}

/* Quantized activation rows in the scratch: padded to whole cache lines,
 * and placed so that each row's int8 codes (A8, A8S: after the scales
 * and sums) start on a line, where the kernels load them 64 bytes at a
 * time; other formats' rows start on a line. A code load across two
 * lines cost a K = 576 matmul of 8 rows (SmolLM2's) 8% (dot8_y_x2 Q4_1,
 * 84.6 against 78.2 ns a call in L1). */
#define ROW_ALIGN 64

static size_t input_row_bytes(uint32_t vec_dot_type, int64_t k) {
    uint64_t row;
    if (!quant_nbytes(vec_dot_type, (uint64_t)k, &row)) return 0;
    return ((size_t)row + ROW_ALIGN - 1) & ~(size_t)(ROW_ALIGN - 1);
}

/* Row 0 of the quantized rows in `scratch`. */
static uint8_t *input_rows(uint32_t vec_dot_type, int64_t k, void *scratch) {
    size_t nb = (size_t)k / 32, codes = vec_dot_type == QT_A8    ? 4 * nb
                                        : vec_dot_type == QT_A8S ? 8 * nb
                                                                 : 0;
    size_t skip = (ROW_ALIGN - ((uintptr_t)scratch + codes) % ROW_ALIGN) % ROW_ALIGN;
    return (uint8_t *)scratch + skip;
}

size_t matmul_scratch_size(uint32_t type, int64_t k, int64_t m) {
    const quant_type_info *wt = quant_type_get(type);
    if (!wt || !wt->vec_dot) return 0;
    size_t row = input_row_bytes(wt->vec_dot_type, k);
    return row ? row * (size_t)(m + MATMUL_PAD_ROWS) + ROW_ALIGN : 0;
}

static mm_task make_task(const void *w, uint32_t type, int64_t n, int64_t k, const float *x,
                         int64_t m, float *y, void *scratch) {
    mm_task t = {.wt = quant_type_get(type), .w = w, .n = n, .k = k, .m = m, .x = x, .y = y};
    t.xt = quant_type_get(t.wt->vec_dot_type);
    uint64_t wr;
    quant_nbytes(type, (uint64_t)k, &wr);
    t.w_row = (size_t)wr;
    t.x_row = input_row_bytes(t.wt->vec_dot_type, k);
    t.xq = input_rows(t.wt->vec_dot_type, k, scratch);
    return t;
}

static void quantize_input(threadpool *tp, mm_task *t) {
    if (t->m < 4)
        quantize_rows(t, 0, 1); /* not worth a dispatch */
    else
        tp_run(tp, quantize_rows, t);
}

/* Tiles of a weight of n rows. */
static long weight_tiles(int64_t n) {
    return ((long)n + TILE_ROWS - 1) / TILE_ROWS;
}

/* The tile numbering of mt's weights, and each thread's span of it for
 * the pool's threads (the even split each starts from). */
static void plan_spans(mm_multi *mt, const threadpool *tp) {
    mt->tile0[0] = 0;
    for (int i = 0; i < mt->n_t; i++) mt->tile0[i + 1] = mt->tile0[i] + weight_tiles(mt->t[i].n);
    mt->nth = tp_spans_split(mt->span, mt->tile0[mt->n_t], tp_threads(tp));
}

void matmul(threadpool *tp, const void *w, uint32_t type, int64_t n, int64_t k, const float *x,
            int64_t m, float *y, void *scratch) {
    mm_multi mt = {.n_t = 1};
    mt.t[0] = make_task(w, type, n, k, x, m, y, scratch);
    quantize_input(tp, &mt.t[0]);
    pad_input(&mt.t[0]);
    plan_spans(&mt, tp);
    tp_run(tp, dot_rows_multi, &mt);
}

void matmul_prefetch_start(const matmul_job *jobs, int n_jobs, int64_t k, int ith, int nth,
                           size_t bytes) {
    long tiles = 0, lo, hi;
    for (int i = 0; i < n_jobs; i++) tiles += weight_tiles(jobs[i].n);
    tp_split(tiles, ith, nth, &lo, &hi); /* as plan_spans numbers and splits them */
    for (int i = 0; i < n_jobs && lo < hi; i++) {
        long t = weight_tiles(jobs[i].n);
        if (lo >= t) {
            lo -= t;
            continue;
        }
        uint64_t row;
        if (!quant_nbytes(jobs[i].type, (uint64_t)k, &row)) return;
        size_t len = ((size_t)jobs[i].n - (size_t)lo * TILE_ROWS) * (size_t)row;
        const char *p = (const char *)jobs[i].w + (size_t)lo * TILE_ROWS * (size_t)row;
        for (size_t o = 0; o < bytes && o < len; o += 64) __builtin_prefetch(p + o, 0, 2);
        return;
    }
}

bool matmul_shares_input(const matmul_job *jobs, int n_jobs) {
    bool shared = n_jobs <= MATMUL_MAX_MULTI;
    for (int i = 0; i < n_jobs && shared; i++)
        shared = quant_type_get(jobs[i].type)->vec_dot_type ==
                 quant_type_get(jobs[0].type)->vec_dot_type;
    return shared;
}

size_t matmul_input_row_bytes(uint32_t type, int64_t k) {
    const quant_type_info *wt = quant_type_get(type);
    return wt && wt->vec_dot ? input_row_bytes(wt->vec_dot_type, k) : 0;
}

void *matmul_input_row(uint32_t type, int64_t k, void *scratch, int64_t r) {
    uint32_t xt = quant_type_get(type)->vec_dot_type;
    return input_rows(xt, k, scratch) + (size_t)r * input_row_bytes(xt, k);
}

void matmul_quantize_row(uint32_t type, int64_t k, const float *x, void *xq) {
    quant_type_get(quant_type_get(type)->vec_dot_type)->from_float(x, xq, (size_t)k);
}

void matmul_multi(threadpool *tp, const matmul_job *jobs, int n_jobs, int64_t k, const float *x,
                  int64_t m, void *scratch, bool quantized, const matmul_prefetch *pf) {
    mm_multi mt = {.n_t = 0, .pf = pf};
    if (!matmul_shares_input(jobs, n_jobs)) { /* one input format per call: each on its own */
        for (int i = 0; i < n_jobs; i++)
            matmul(tp, jobs[i].w, jobs[i].type, jobs[i].n, k, x, m, jobs[i].y, scratch);
        return;
    }
    for (int i = 0; i < n_jobs; i++) {
        mt.t[i] = make_task(jobs[i].w, jobs[i].type, jobs[i].n, k, x, m, jobs[i].y, scratch);
    }
    mt.n_t = n_jobs;
    if (!quantized) quantize_input(tp, &mt.t[0]); /* the same rows serve every weight */
    /* The pad rows serve every weight too: the one with the most. */
    const mm_task *most = &mt.t[0];
    for (int i = 1; i < n_jobs; i++)
        if (padded_rows(mt.t[i].wt, m) > padded_rows(most->wt, m)) most = &mt.t[i];
    pad_input(most);
    plan_spans(&mt, tp);
    tp_run(tp, dot_rows_multi, &mt);
}

void matrix_get_row(const void *w, uint32_t type, int64_t k, int64_t row, float *out) {
    const quant_type_info *wt = quant_type_get(type);
    uint64_t rb;
    quant_nbytes(type, (uint64_t)k, &rb);
    wt->to_float((const uint8_t *)w + (size_t)rb * (size_t)row, out, (size_t)k);
}
