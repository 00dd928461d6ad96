/*
 * forward.c — the decoder forward pass over a flat batch (see forward.h).
 *
 * For every layer, top to bottom:
 *   norm → Q, K, V (+ biases) → (QK-norm) → RoPE → store K, V in the paged cache →
 *   attention through the block table → output → (post-norm) → (× scale) →
 *   residual → norm → gate, up → activation → down (or, in a mixture of
 *   experts, the router's top k experts' MLPs, weighted) → (post-norm) →
 *   (× scale) → residual
 * then the final norm and the classifier, for the rows that want logits.
 * Architecture differences are fields of the model and layer descriptions.
 *
 * Every step treats each row alone with a fixed order of operations, so a
 * row's result does not depend on the other rows of the batch or on the
 * number of threads (DESIGN.md: batch-invariant).
 */
#include "cpu/forward.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention.h"
#include "format/kernels/fp16.h"
#include "cpu/matmul.h"
#include "model/batch.h"
#include "format/quant.h"
#include "base/xmath.h"

/* Attention's unit of work: rows r0..r0+nr-1 of the batch (one sequence)
 * with query heads h0..h0+nh-1 (of one KV head), whose keys and values are
 * read once for all of them. */
typedef struct att_tile {
    int32_t r0, nr, h0, nh;
} att_tile;

struct forward_ctx {
    const model *m;
    kv_cache *kv;
    threadpool *tp;
    const attn_kernels *ak;
    int32_t max_rows, max_logit_rows;
    float *x;      /* [rows][n_embd] the residual stream */
    float *xb;     /* [rows][max(n_embd, q_dim)] normed input / attention output */
    float *q;      /* [rows][n_head * head_dim] */
    float *k;      /* [rows][n_head_kv * head_dim] */
    float *v;      /* [rows][n_head_kv * head_dim_v] */
    float *att;    /* [rows][n_head * head_dim_v] */
    float *hb;     /* [rows][max(n_ff, n_embd)] */
    float *hb2;    /* [rows][n_ff] */
    float *logits; /* [max_logit_rows][n_vocab] */
    /* Mixture of experts (NULL when dense): */
    float *router;  /* [rows][n_expert] router logits, then probabilities */
    int32_t *sel;   /* [rows][n_expert_used] the chosen experts, ascending */
    float *sel_w;   /* [rows][n_expert_used] their weights */
    int32_t *grp;   /* [rows] the batch rows routed to one expert */
    float *grp_w;   /* [rows] their weights for that expert */
    float *xg;      /* [rows][n_embd] those rows' normed inputs, gathered */
    float *og;      /* [rows][n_embd] the expert's outputs for them */
    float *moe_out; /* [rows][n_embd] the weighted sum over each row's experts */
    float *bcx;     /* [rows][3 * n_embd] a short-convolution layer's B, C, x (lfm2) */
    float *acc;     /* [threads][acc_per_thread] attention scratch */
    size_t acc_stride;
    int32_t tile_q;  /* queries per attention tile, at most */
    att_tile *tiles; /* [max_rows * n_head] one layer's attention tiles */
    int32_t n_tiles;
    void *scratch; /* quantized activations for matmul */
    /* Each row's RoPE cos and sin for up to two (base, scale) pairs of one
     * step (a model's local and global layers), so the layers after the
     * first of a pair reuse them: [2][rows][rope_dim / 2] each. */
    float *rope_cs, *rope_sn;
    float rope_key[2][2]; /* base and scale of each slot */
    bool rope_valid[2];
    int rope_next; /* the slot the next new pair takes */
    /* A window KV type (kv_cache.recent): each row's K and V of the layer
     * in f16, [rows][tail_row], which queries of the pass read for
     * positions of the pass; and where each sequence's rows are, so a
     * position finds its row: run_row[run_base[r] + pos - n_pos] is the
     * row of the sequence of row r at pos (n_pos its length before the
     * pass). NULL for the other types. */
    uint16_t *kv16;
    int32_t *run_row, *run_base;
    int32_t *run_tmp;       /* [rows] scratch: rows, then first slot, per sequence */
    const kv_seq **run_seq; /* [rows] scratch: the pass's sequences */
    /* The next tile a thread claims (task_attention), last and after a
     * cache line of padding: the threads' claims do not evict the fields
     * above from each other's caches. */
    char pad[64];
    _Atomic int32_t tile_next;
    /* Decoding with the K/V prefetched: each row's first prefetch region
     * ([rows], kv_prefetch_regions). */
    int32_t *pf_row;
    /* The threads' spans of the task running now, in span_mem aligned to
     * a cache line: the attention's tiles (att_spans; att_nth the threads
     * they are for, 0 while the tiles are claimed by tile_next), or a row
     * task's rows (run_rows; row_nth, 0 for the even split as it is). */
    int att_nth, row_nth;
    tp_span *span;
    char span_mem[(TP_SPAN_MAX + 1) * sizeof(tp_span)];
};

static int32_t max_i32(int32_t a, int32_t b) {
    return a > b ? a : b;
}

/* Sizes of each buffer in floats, shared by forward_bytes and create. */
typedef struct fwd_sizes {
    size_t x, xb, q, k, v, att, hb, hb2, logits, acc, scratch;
    size_t router, sel, xg; /* mixture of experts: sel and sel_w, xg and og and moe_out */
    size_t bcx;
    size_t rope; /* each of rope_cs and rope_sn */
} fwd_sizes;

static size_t scratch_for(const weight *w, int32_t rows) {
    return matmul_scratch_size(w->type, w->ne0, rows);
}

/* Queries per attention tile: 16, fewer where their score rows and
 * accumulators would pass 4 MiB per thread (very long contexts). */
static int32_t tile_queries(const model *m, int32_t max_ctx) {
    size_t per = (size_t)m->head_dim_v + (size_t)m->head_dim + (size_t)max_ctx;
    int32_t q = 16;
    while (q > 1 && (size_t)q * per * sizeof(float) > ((size_t)4 << 20)) q /= 2;
    return q;
}

/* Keys per channel (k4cv4hw): a block's channel steps and centres, and
 * each query of a tile folded with them (and its base), at the end of a
 * thread's attention scratch. */
static size_t kc4_floats(const model *m, int32_t tile_q) {
    return 2 * (size_t)m->head_dim + (size_t)tile_q * ((size_t)m->head_dim + 1);
}

static size_t acc_per_thread(const model *m, int32_t max_ctx) {
    int32_t tq = tile_queries(m, max_ctx);
    return (size_t)tq * ((size_t)m->head_dim_v + (size_t)m->head_dim + (size_t)max_ctx) +
           kc4_floats(m, tq);
}

static fwd_sizes sizes_for(const model *m, int32_t rows, int32_t logit_rows, int n_threads,
                           int32_t max_ctx) {
    fwd_sizes s;
    size_t r = (size_t)rows;
    int32_t qd = m->n_head * m->head_dim, vd = m->n_head * m->head_dim_v;
    s.x = r * (size_t)m->n_embd;
    s.xb = r * (size_t)max_i32(max_i32(m->n_embd, qd), vd);
    s.q = r * (size_t)qd;
    s.k = r * (size_t)(m->n_head_kv * m->head_dim);
    s.v = r * (size_t)(m->n_head_kv * m->head_dim_v);
    s.att = r * (size_t)vd;
    int32_t ff = max_i32(m->n_ff, m->n_ff_exp);
    s.hb = r * (size_t)max_i32(ff, m->n_embd);
    s.hb2 = r * (size_t)ff;
    s.router = r * (size_t)m->n_expert;
    s.sel = r * (size_t)m->n_expert_used;
    s.xg = m->n_expert ? r * (size_t)m->n_embd : 0;
    s.bcx = m->n_conv_layers ? r * 3 * (size_t)m->n_embd : 0;
    s.rope = 2 * r * (size_t)(m->rope_dim / 2); /* rope_dim > 0 and even (model_load) */
    s.logits = (size_t)logit_rows * (size_t)m->n_vocab;
    s.acc = (size_t)n_threads * acc_per_thread(m, max_ctx);
    /* The largest quantized activation buffer any matmul needs. */
    size_t sc = scratch_for(&m->output, logit_rows);
    for (int32_t il = 0; il < m->n_layer; il++) {
        const layer_desc *L = &m->layers[il];
        const weight *ws[] = {&L->wq,      &L->wk,        &L->wv,      &L->wo,
                              &L->w_gate,  &L->w_up,      &L->w_down,  &L->ffn_gate_inp,
                              &L->up_exps, &L->down_exps, &L->conv_in, &L->conv_out};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            if (!ws[i]->data) continue;
            size_t b = scratch_for(ws[i], rows);
            if (b > sc) sc = b;
        }
    }
    s.scratch = sc;
    return s;
}

/* A window KV type's scratch (forward_ctx.kv16, run_row, run_base,
 * run_tmp, run_seq), counted whatever the type. */
static size_t recent_bytes(const model *m, int32_t max_rows) {
    size_t row = kv_f16_position_row(m);
    return (size_t)max_rows * (row * sizeof(uint16_t) + 3 * sizeof(int32_t) + sizeof(void *));
}

size_t forward_bytes(const model *m, int32_t max_rows, int32_t max_logit_rows, int n_threads,
                     int32_t max_ctx) {
    fwd_sizes s = sizes_for(m, max_rows, max_logit_rows, n_threads, max_ctx);
    return (s.x + s.xb + s.q + s.k + s.v + s.att + s.hb + s.hb2 + s.logits + s.acc + s.router +
            2 * s.sel + 3 * s.xg + s.bcx + 2 * s.rope) *
               sizeof(float) +
           s.scratch + (size_t)max_rows * sizeof(int32_t) +
           (size_t)max_rows * (size_t)m->n_head * (sizeof(att_tile) + sizeof(int64_t)) +
           (m->n_expert ? (size_t)max_rows * (sizeof(int32_t) + sizeof(float)) : 0) +
           recent_bytes(m, max_rows);
}

void forward_free(forward_ctx *f) {
    if (!f) return;
    free(f->x);
    free(f->xb);
    free(f->q);
    free(f->k);
    free(f->v);
    free(f->att);
    free(f->hb);
    free(f->hb2);
    free(f->logits);
    free(f->acc);
    free(f->tiles);
    free(f->scratch);
    free(f->pf_row);
    free(f->router);
    free(f->sel);
    free(f->sel_w);
    free(f->grp);
    free(f->grp_w);
    free(f->xg);
    free(f->og);
    free(f->moe_out);
    free(f->bcx);
    free(f->rope_cs);
    free(f->rope_sn);
    free(f->kv16);
    free(f->run_row);
    free(f->run_base);
    free(f->run_tmp);
    free(f->run_seq);
    free(f);
}

cellm_status forward_create(const model *m, kv_cache *kv, threadpool *tp, int32_t max_rows,
                            int32_t max_logit_rows, forward_ctx **out, cellm_error *err) {
    *out = NULL;
    if (max_rows < 1 || max_rows > 65536 || max_logit_rows < 1 || max_logit_rows > max_rows)
        return err_set(err, CELLM_ERR_INVALID_ARG, "batch limits %d rows / %d logit rows are bad",
                       max_rows, max_logit_rows);
    forward_ctx *f = calloc(1, sizeof *f);
    if (!f) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    f->m = m;
    f->kv = kv;
    f->tp = tp;
    f->ak = attn_kernels_get();
    f->max_rows = max_rows;
    f->max_logit_rows = max_logit_rows;
    f->span = (tp_span *)(((uintptr_t)f->span_mem + sizeof(tp_span) - 1) &
                          ~(uintptr_t)(sizeof(tp_span) - 1));
    fwd_sizes s = sizes_for(m, max_rows, max_logit_rows, tp_size(tp), kv->max_ctx);
    f->acc_stride = acc_per_thread(m, kv->max_ctx);
    f->x = malloc(s.x * sizeof(float));
    f->xb = malloc(s.xb * sizeof(float));
    f->q = malloc(s.q * sizeof(float));
    f->k = malloc(s.k * sizeof(float));
    f->v = malloc(s.v * sizeof(float));
    f->att = malloc(s.att * sizeof(float));
    f->hb = malloc(s.hb * sizeof(float));
    f->hb2 = malloc(s.hb2 * sizeof(float));
    f->logits = malloc(s.logits * sizeof(float));
    f->acc = malloc(s.acc * sizeof(float));
    f->tile_q = tile_queries(m, kv->max_ctx);
    f->tiles = malloc((size_t)max_rows * (size_t)m->n_head * sizeof(att_tile));
    f->scratch = malloc(s.scratch ? s.scratch : 1);
    f->pf_row = malloc((size_t)max_rows * sizeof(int32_t));
    f->rope_cs = malloc(s.rope * sizeof(float));
    f->rope_sn = malloc(s.rope * sizeof(float));
    bool moe_ok = true;
    if (m->n_expert) {
        f->router = malloc(s.router * sizeof(float));
        f->sel = malloc(s.sel * sizeof(int32_t));
        f->sel_w = malloc(s.sel * sizeof(float));
        f->grp = malloc((size_t)max_rows * sizeof(int32_t));
        f->grp_w = malloc((size_t)max_rows * sizeof(float));
        f->xg = malloc(s.xg * sizeof(float));
        f->og = malloc(s.xg * sizeof(float));
        f->moe_out = malloc(s.xg * sizeof(float));
        moe_ok =
            f->router && f->sel && f->sel_w && f->grp && f->grp_w && f->xg && f->og && f->moe_out;
    }
    if (m->n_conv_layers && !(f->bcx = malloc(s.bcx * sizeof(float)))) moe_ok = false;
    if (kv->recent) {
        f->kv16 = malloc((size_t)max_rows * kv->tail_row * sizeof(uint16_t));
        f->run_row = malloc((size_t)max_rows * sizeof(int32_t));
        f->run_base = malloc((size_t)max_rows * sizeof(int32_t));
        f->run_tmp = malloc((size_t)max_rows * sizeof(int32_t));
        f->run_seq = malloc((size_t)max_rows * sizeof *f->run_seq);
        if (!f->kv16 || !f->run_row || !f->run_base || !f->run_tmp || !f->run_seq) moe_ok = false;
    }
    if (!f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2 || !f->logits ||
        !f->acc || !f->tiles || !f->scratch || !f->pf_row || !f->rope_cs || !f->rope_sn ||
        !moe_ok) {
        forward_free(f);
        return err_set(err, CELLM_ERR_NO_MEMORY, "cannot allocate %zu bytes of activations",
                       forward_bytes(m, max_rows, max_logit_rows, tp_size(tp), kv->max_ctx));
    }
    *out = f;
    return CELLM_OK;
}

/* ------------------------------------------------------------ row kernels */

/* Four floats as one vector (GCC's vector extension): +, -, * on it are
 * the same operations, lane by lane, as on each float. */
typedef float fv4 __attribute__((vector_size(16)));

/* Two floats, two doubles as vectors (a double vector of SSE2's and
 * NEON's width: GCC kept wider ones in memory between a loop's
 * iterations for a target without AVX). */
typedef float fv2 __attribute__((vector_size(8)));
typedef double dv2 __attribute__((vector_size(16)));

/* The squares of two floats as two doubles. */
static inline dv2 squares2(const float *x) {
    fv2 v;
    memcpy(&v, x, sizeof v);
    const dv2 d = __builtin_convertvector(v, dv2);
    return d * d;
}

/* The sum of x[i]^2 over a row, in double: each square is exact (a
 * float's 24 bits squared fit a double's 53), added into eight lanes
 * (element i into lane i % 8, in order), the lanes then summed as
 * ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)). The same operations
 * on every CPU; eight chains of additions instead of one (a row of 576
 * was 576 dependent additions, about 1,700 cycles; decoding 8 sessions
 * of SmolLM2 spent 1.7% of its samples there). */
static double sum_squares(const float *x, int32_t n) {
    dv2 a0 = {0, 0}, a1 = {0, 0}, a2 = {0, 0}, a3 = {0, 0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += squares2(x + i);
        a1 += squares2(x + i + 2);
        a2 += squares2(x + i + 4);
        a3 += squares2(x + i + 6);
    }
    double l[8] = {a0[0], a0[1], a1[0], a1[1], a2[0], a2[1], a3[0], a3[1]};
    for (int j = 0; i < n; i++, j++) l[j] += (double)x[i] * x[i];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* out = x / rms(x) * w over n elements (out may be x). */
static void rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps) {
    float scale = 1.0f / sqrtf((float)(sum_squares(x, n) / n) + eps);
    int32_t i = 0;
    /* (x * scale) * w, four at a time (out may be x: each group is read
     * before it is written) */
    const fv4 sv = {scale, scale, scale, scale};
    for (; i + 4 <= n; i += 4) {
        fv4 xv, wv;
        memcpy(&xv, x + i, sizeof xv);
        memcpy(&wv, w + i, sizeof wv);
        xv = xv * sv * wv;
        memcpy(out + i, &xv, sizeof xv);
    }
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* Rotates the first rope_dim dimensions of one head: pairs (h[a], h[b])
 * turned by (cs[i], sn[i]), a = i, b = i + half (NEOX) or a = 2i, b =
 * 2i + 1. Four pairs at a time as vectors (NEOX: fv4; the adjacent pairs:
 * written four at a time for -O2's SLP vectorizer), each element through
 * the same multiplies and add or subtract as one at a time. */
static void rope_head(const model *m, float *restrict h, const float *restrict cs,
                      const float *restrict sn) {
    int32_t half = m->rope_dim / 2, i = 0;
    if (m->rope == ROPE_NEOX) {
        for (; i + 4 <= half; i += 4) {
            fv4 x0, x1, c, s;
            memcpy(&x0, h + i, sizeof x0);
            memcpy(&x1, h + half + i, sizeof x1);
            memcpy(&c, cs + i, sizeof c);
            memcpy(&s, sn + i, sizeof s);
            const fv4 a = x0 * c - x1 * s, b = x0 * s + x1 * c;
            memcpy(h + i, &a, sizeof a);
            memcpy(h + half + i, &b, sizeof b);
        }
        for (; i < half; i++) {
            float x0 = h[i], x1 = h[half + i];
            h[i] = x0 * cs[i] - x1 * sn[i];
            h[half + i] = x0 * sn[i] + x1 * cs[i];
        }
        return;
    }
    for (; i + 4 <= half; i += 4)
        for (int32_t j = i; j < i + 4; j++) {
            float x0 = h[2 * j], x1 = h[2 * j + 1];
            h[2 * j] = x0 * cs[j] - x1 * sn[j];
            h[2 * j + 1] = x0 * sn[j] + x1 * cs[j];
        }
    for (; i < half; i++) {
        float x0 = h[2 * i], x1 = h[2 * i + 1];
        h[2 * i] = x0 * cs[i] - x1 * sn[i];
        h[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
    }
}

/* GELU with the tanh approximation, evaluated as llama.cpp's CPU backend
 * does (its GGML_GELU_FP16 table): the input rounded to f16, the result
 * rounded to f16, and the tails cut off at |x| >= 10. Matching this keeps
 * cellm within llama.cpp's own noise on GELU models. */
static float gelu_tanh_f16(float h) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * h * (1.0f + xm_tanhf(k * h * (1.0f + 0.044715f * h * h)));
}

/* The result depends only on the f16 of x, so it is a table of all 65536
 * f16 inputs, filled once (128 KiB): a lookup instead of tanhf per
 * element, same values. */
static uint16_t gelu_table[(1 << 16) + 1]; /* the last entry: gelu_mul's padding */
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;
static void gelu_table_fill(void) {
    for (uint32_t i = 0; i < (1u << 16); i++)
        gelu_table[i] = fp32_to_fp16(gelu_tanh_f16(fp16_to_fp32((uint16_t)i)));
}

/* ------------------------------------------------------------ the steps */

typedef struct step {
    forward_ctx *f;
    const fwd_row *rows;
    int32_t n;
    const layer_desc *L;
    int32_t il;
    int32_t ff; /* width of the MLP's hidden rows (n_ff, or an expert's) */
    /* task_rows' work on each row, in this order: the residual x += hb
     * (after the post-norm `res_post` where it has data) where res_post is
     * set; xb = norm(x) with `norm` where set; xb's row quantized into the
     * matmul scratch as the input of `quant` where set. task_act quantizes
     * its hb2 rows for `quant` where set. */
    const weight *res_post, *norm, *quant;
    /* The matmul after the task: its weights, whose first rows each
     * thread prefetches (prefetch_next), or n_next 0. */
    const weight *next[3];
    int n_next;
    int rope_slot;  /* task_qk's slot of the RoPE tables */
    bool rope_fill; /* ... which it fills first (a new base and scale) */
} step;

/* The start of each thread's share of the next matmul's weights,
 * prefetched into L2 at the start of the task before it (the norms, the
 * activation, the attention), so the weight stream does not begin with
 * misses: decoding 8 sessions of SmolLM2, a thread's first tile of a
 * matmul took 3.2 times as long as its tenth, its second 1.6 times (the
 * kernels prefetch 8 KiB ahead of the rows they read, so the first 8 KiB
 * come from memory on demand). 8 KiB: +2.0% (32 of 40 alternating
 * rounds); 4 and 16 KiB did no better (0.993, 0.996 against it); 32-256
 * KiB at the end of the tasks had lost 1% (docs/benchmarks.md). Only
 * where the task runs on the pool's threads, which split the matmul the
 * same way. */
#define NEXT_PREFETCH_BYTES (8 * 1024)

/* The matmul jobs of weights w (outputs y). */
static int mm_jobs(const weight *const *w, float *const *y, int nw, matmul_job jobs[3]) {
    for (int i = 0; i < nw; i++)
        jobs[i] = (matmul_job){.w = w[i]->data, .type = w[i]->type, .n = w[i]->ne1, .y = y[i]};
    return nw;
}

static void prefetch_next(const step *s, int ith, int nth) {
    if (s->n_next == 0 || nth != tp_threads(s->f->tp)) return;
    matmul_job jobs[3];
    mm_jobs(s->next, (float *const[]){NULL, NULL, NULL}, s->n_next, jobs);
    matmul_prefetch_start(jobs, s->n_next, s->next[0]->ne0, ith, nth, NEXT_PREFETCH_BYTES);
}

static void add_bias(float *x, const float *b, int32_t n) {
    for (int32_t i = 0; i < n; i++) x[i] += b[i];
}

/* The next rows [*lo, *hi) of a row task for thread ith of nth (*from
 * starts at 0): its own span's, half of what is left at a time, then the
 * others' from their backs one at a time, so a thread that starts late or
 * runs slow leaves its last rows to the others (decoding 8 sessions, the
 * worker began a row task 300-1,800 cycles after the step thread, which
 * then waited for it). Without spans for nth threads, its even split at
 * once. Every row gets the same arithmetic whichever thread takes it. */
static bool rows_take(const step *s, int ith, int nth, int *from, long *lo, long *hi) {
    forward_ctx *f = s->f;
    if (f->row_nth != nth) {
        if ((*from)++) return false;
        tp_split(s->n, ith, nth, lo, hi);
        return *lo < *hi;
    }
    return tp_span_next(f->span, ith, nth, true, false, from, lo, hi);
}

/* Q/K/V biases, QK-norm, RoPE, and K/V into the cache, of row r. */
static void qk_row(const step *s, long r) {
    forward_ctx *f = s->f;
    const model *m = f->m;
    const layer_desc *L = s->L;
    int32_t hd = m->head_dim, hdv = m->head_dim_v, qd = m->n_head * hd, kd = m->n_head_kv * hd,
            vd = m->n_head_kv * hdv;
    float *q = f->q + r * qd, *k = f->k + r * kd, *v = f->v + r * vd;
    int32_t pos = s->rows[r].pos;
    if (L->bq.data) add_bias(q, L->bq.data, qd);
    if (L->bk.data) add_bias(k, L->bk.data, kd);
    if (L->bv.data) add_bias(v, L->bv.data, vd);
    size_t half = (size_t)(m->rope_dim / 2);
    float *cs = f->rope_cs + ((size_t)s->rope_slot * (size_t)f->max_rows + (size_t)r) * half,
          *sn = f->rope_sn + ((size_t)s->rope_slot * (size_t)f->max_rows + (size_t)r) * half;
    if (!L->nope && s->rope_fill) model_rope_angles(m, pos, L->rope_base, L->rope_scale, cs, sn);
    if (L->qk_norm_full) { /* across all heads at once (olmoe) */
        rmsnorm(q, q, L->q_norm.data, qd, m->norm_eps);
        rmsnorm(k, k, L->k_norm.data, kd, m->norm_eps);
    }
    bool per_head = L->q_norm.data && !L->qk_norm_full;
    for (int32_t h = 0; h < m->n_head; h++) {
        if (per_head) rmsnorm(q + h * hd, q + h * hd, L->q_norm.data, hd, m->norm_eps);
        if (!L->nope) rope_head(m, q + h * hd, cs, sn);
    }
    for (int32_t h = 0; h < m->n_head_kv; h++) {
        if (per_head) rmsnorm(k + h * hd, k + h * hd, L->k_norm.data, hd, m->norm_eps);
        if (!L->nope) rope_head(m, k + h * hd, cs, sn);
    }
    /* Into the cache in its KV type, each head on its own (rotated
     * first for the rotated type: k and v are not read again). */
    const kv_cache *kv = f->kv;
    const attn_kv_ops *kops = &f->ak->kv[kv->kformat], *vops = &f->ak->kv[kv->vformat];
    uint8_t *kc = kv_k(kv, s->rows[r].seq, L->kv_group, L->kv_index, pos);
    uint8_t *vc = kv_v(kv, s->rows[r].seq, L->kv_group, L->kv_index, pos);
    size_t kb = kv_row_bytes(kv->kformat, (size_t)hd), vb = kv_row_bytes(kv->vformat, (size_t)hdv);
    if (kv->kscale) { /* centred and balanced keys (kv_cache.kmean) */
        const float *mu = kv->kmean + (size_t)s->il * kd, *a = kv->kscale + (size_t)s->il * kd;
        for (int32_t c = 0; c < kd; c++) k[c] = (k[c] - mu[c]) * a[c];
    }
    for (int32_t h = 0; h < m->n_head_kv; h++) {
        if (kv->rotated) {
            attn_rotate(k + h * hd, (size_t)hd);
            attn_rotate(v + h * hdv, (size_t)hdv);
        }
        /* keys per channel: the block's rows at once, task_kblocks */
        if (kv->kformat != KV_FMT_C4) kops->store(kc + h * kb, k + h * hd, (size_t)hd);
        vops->store(vc + h * vb, v + h * hdv, (size_t)hdv);
    }
    if (kv->recent) { /* the pass's own f16 rows (rotated like the cache's) */
        const attn_kv_ops *h16 = &f->ak->kv[KV_FMT_F16];
        uint16_t *o = f->kv16 + (size_t)r * kv->tail_row;
        h16->store(o, k, (size_t)kd);
        h16->store(o + kd, v, (size_t)vd);
    }
}

static void task_qk(void *arg, int ith, int nth) {
    const step *s = arg;
    long b, e;
    for (int from = 0; rows_take(s, ith, nth, &from, &b, &e);)
        for (long r = b; r < e; r++) qk_row(s, r);
}

/* The first position row r of the step sees in layer L (its window's
 * start, or 0). */
static int32_t row_lo(const step *s, long r) {
    int32_t pos = s->rows[r].pos, w = s->L->window;
    return w > 0 && pos - w + 1 > 0 ? pos - w + 1 : 0;
}

/* Rows r0.. of the step that one tile takes, at most rows_per: one
 * sequence at consecutive positions (every position in the tile's span is
 * then in the cache), inside one block for a window type (its queries then
 * read the same positions in f16). */
static int32_t tile_rows(const step *s, int32_t r0, int32_t rows_per) {
    int32_t nr = 1;
    while (nr < rows_per && r0 + nr < s->n && s->rows[r0 + nr].seq == s->rows[r0].seq &&
           s->rows[r0 + nr].pos == s->rows[r0 + nr - 1].pos + 1 &&
           !(s->f->kv->recent && s->rows[r0 + nr].pos % KV_BLOCK_TOKENS == 0))
        nr++;
    return nr;
}

/* The longest thread's work when the threads claim these tiles costliest
 * first: `units` runs of a KV head's `group` query heads, cut into tiles
 * of nh heads; a tile costs its heads plus one for reading and
 * converting its keys and values (a guess; the same for every split). */
static int32_t tiles_span(int32_t units, int32_t group, int32_t nh, int nth) {
    int32_t load[64] = {0}, sizes[2] = {nh, group % nh}, counts[2] = {group / nh, 1};
    int32_t most = 0;
    for (int k = 0; k < 2; k++)
        for (int32_t t = 0; sizes[k] > 0 && t < units * counts[k]; t++) {
            int least = 0;
            for (int i = 1; i < nth; i++)
                if (load[i] < load[least]) least = i;
            load[least] += sizes[k] + 1;
            if (load[least] > most) most = load[least];
        }
    return most;
}

/* Query heads per tile: a KV head's group (up to tile_q). Where the step
 * has too few tiles to keep the threads busy (decoding one row or a few,
 * or a model with one KV head), the group is cut into tiles of fewer
 * heads when that shortens the longest thread's work: the keys and values
 * are then read once per tile, by the threads at the same time. Which
 * tile a query is in does not change its bits. */
static int32_t tile_heads(const step *s) {
    const forward_ctx *f = s->f;
    const model *m = f->m;
    int32_t group = m->n_head / m->n_head_kv, nh = group < f->tile_q ? group : f->tile_q;
    int nth = tp_threads(f->tp);
    if (nth < 2 || nth > 64) return nh;
    /* the runs of rows, counted until there are enough for the threads */
    int32_t units = 0, rows_per = f->tile_q / nh;
    for (int32_t r0 = 0; r0 < s->n && units < 2 * nth; units += m->n_head_kv)
        r0 += tile_rows(s, r0, rows_per);
    if (units >= 2 * nth) return nh;
    int32_t best = nh, span = tiles_span(units, group, nh, nth);
    for (int32_t h = nh - 1; h >= 1; h--) {
        int32_t sp = tiles_span(units, group, h, nth);
        if (sp < span) {
            span = sp;
            best = h;
        }
    }
    return best;
}

/* Cuts the step's attention into tiles: runs of rows (tile_rows), times
 * each KV head's query heads, nh of them at a time (tile_heads). */
static void plan_tiles(step *s) {
    forward_ctx *f = s->f;
    const model *m = f->m;
    int32_t group = m->n_head / m->n_head_kv, nh = tile_heads(s);
    int32_t rows_per = f->tile_q / nh;
    f->n_tiles = 0;
    for (int32_t r0 = 0; r0 < s->n;) {
        int32_t nr = tile_rows(s, r0, rows_per);
        for (int32_t kvh = 0; kvh < m->n_head_kv; kvh++)
            for (int32_t h = kvh * group; h < (kvh + 1) * group; h += nh) {
                int32_t k = (kvh + 1) * group - h < nh ? (kvh + 1) * group - h : nh;
                f->tiles[f->n_tiles++] = (att_tile){r0, nr, h, k};
            }
        r0 += nr;
    }
}

/* A window type's f16 copy of position p's K of layer s->L (V: kd
 * values on) for the sequence of row r: from the pass's rows when the
 * pass wrote it, else from the sequence's tail. */
static const uint16_t *recent_row(const step *s, long r, int32_t p) {
    const forward_ctx *f = s->f;
    const kv_seq *seq = s->rows[r].seq;
    if (p >= seq->n_pos)
        return f->kv16 + (size_t)f->run_row[f->run_base[r] + p - seq->n_pos] * f->kv->tail_row;
    return kv_tail(f->kv, seq, s->L->kv_group, s->L->kv_index, p);
}

/* Keys per channel (k4cv4hw): each block whose last position the pass
 * wrote is rounded, head by head, from the f16 keys of its 16 positions
 * (the pass's rows and the sequence's tail), before the layer's attention
 * reads it; its queries read a block in f16 until it has left their window
 * (kv_recent), so no query sees a block half written. The work is the
 * (block, head) pairs in batch order, split over the threads. */
static void task_kblocks(void *arg, int ith, int nth) {
    step *s = arg;
    const forward_ctx *f = s->f;
    const model *m = f->m;
    const kv_cache *kv = f->kv;
    const layer_desc *L = s->L;
    int32_t hd = m->head_dim, nkv = m->n_head_kv;
    long n = 0;
    for (int32_t r = 0; r < s->n; r++) n += s->rows[r].pos % KV_BLOCK_TOKENS == KV_BLOCK_TOKENS - 1;
    long b, e, at = 0;
    tp_split(n * nkv, ith, nth, &b, &e);
    size_t kb = kv_row_bytes(KV_FMT_C4, (size_t)hd), mb = kv_kc4_meta_bytes((size_t)hd);
    for (int32_t r = 0; r < s->n && at < e; r++) {
        int32_t last = s->rows[r].pos;
        if (last % KV_BLOCK_TOKENS != KV_BLOCK_TOKENS - 1) continue;
        int32_t p0 = last - (KV_BLOCK_TOKENS - 1);
        const kv_seq *seq = s->rows[r].seq;
        for (int32_t h = 0; h < nkv; h++, at++) {
            if (at < b || at >= e) continue;
            const uint16_t *k[KV_BLOCK_TOKENS];
            uint8_t *codes[KV_BLOCK_TOKENS];
            for (int32_t j = 0; j < KV_BLOCK_TOKENS; j++) {
                k[j] = recent_row(s, r, p0 + j) + (size_t)h * hd;
                codes[j] = (uint8_t *)kv_k(kv, seq, L->kv_group, L->kv_index, p0 + j) + h * kb;
            }
            attn_kc4_quantize(k, (size_t)hd, codes,
                              kv_kmeta(kv, seq, L->kv_group, L->kv_index, p0) + h * mb);
        }
    }
}

/* Keys per channel: the scores of the tile's nq queries (q16, rotated and
 * balanced) for the positions p.. of p's block up to thi, into out (query
 * i's at out + i * span): each query folded with the block's steps and
 * centres (attn_kernels.kc4_fold), then dot_c4 with the codes, plus its base.
 * Returns the next position. */
static int32_t kc4_scores(const step *s, const att_tile *T, const float *q16, int32_t nq, int32_t p,
                          int32_t thi, float *out, size_t span, float *kcs) {
    const forward_ctx *f = s->f;
    const kv_cache *kv = f->kv;
    const model *m = f->m;
    const kv_seq *seq = s->rows[T->r0].seq;
    int32_t hd = m->head_dim, kvh = T->h0 / (m->n_head / m->n_head_kv);
    int32_t end = (p / KV_BLOCK_TOKENS + 1) * KV_BLOCK_TOKENS - 1;
    if (end > thi) end = thi;
    float *st = kcs, *centre = st + hd, *qs = centre + hd, *base = qs + (size_t)nq * hd;
    f->ak->kc4_channels(kv_kmeta(kv, seq, s->L->kv_group, s->L->kv_index, p) +
                            (size_t)kvh * kv_kc4_meta_bytes((size_t)hd),
                        (size_t)hd, st, centre);
    f->ak->kc4_fold(q16, (size_t)nq, st, centre, (size_t)hd, qs, base);
    const void *kr[KV_BLOCK_TOKENS];
    int32_t cnt = end - p + 1;
    size_t kb = kv_row_bytes(KV_FMT_C4, (size_t)hd);
    for (int32_t j = 0; j < cnt; j++)
        kr[j] = (const uint8_t *)kv_k(kv, seq, s->L->kv_group, s->L->kv_index, p + j) + kvh * kb;
    if (end + KV_BLOCK_TOKENS <= thi) { /* the next block's codes and metadata, ahead: blocks
                                         * are far apart in the pool, too short a run for the
                                         * hardware's prefetch (a decode's loads missed) */
        const uint8_t *nk = (const uint8_t *)kv_k(kv, seq, s->L->kv_group, s->L->kv_index, end + 1);
        const size_t row = kv->groups[s->L->kv_group].k_row;
        for (int32_t j = 0; j < KV_BLOCK_TOKENS; j++) {
            __builtin_prefetch(nk + (size_t)j * row + kvh * kb);
            __builtin_prefetch(nk + (size_t)j * row + kvh * kb + kb - 1);
        }
        __builtin_prefetch(kv_kmeta(kv, seq, s->L->kv_group, s->L->kv_index, end + 1) +
                           (size_t)kvh * kv_kc4_meta_bytes((size_t)hd));
    }
    f->ak->kv[KV_FMT_C4].dot_tile(qs, (size_t)nq, kr, (size_t)cnt, (size_t)hd, out, span);
    for (int32_t i = 0; i < nq; i++)
        for (int32_t j = 0; j < cnt; j++) out[(size_t)i * span + j] += base[i];
    return end + 1;
}

/* Where each sequence's rows of the pass are (forward_ctx.run_row), for a
 * window type. */
static void map_runs(forward_ctx *f, const fwd_row *rows, int32_t n) {
    int32_t nd = 0, *count = f->run_tmp;
    for (int32_t r = 0; r < n; r++) {
        int32_t d = r > 0 && rows[r].seq == rows[r - 1].seq ? f->run_base[r - 1] : -1;
        for (int32_t i = 0; d < 0 && i < nd; i++)
            if (f->run_seq[i] == rows[r].seq) d = i;
        if (d < 0) {
            d = nd++;
            f->run_seq[d] = rows[r].seq;
            count[d] = 0;
        }
        count[d]++;
        f->run_base[r] = d; /* the sequence's index, for now */
    }
    /* Each sequence's first slot (in place of its count). */
    for (int32_t d = 0, at = 0; d < nd; d++) {
        int32_t c = count[d];
        count[d] = at;
        at += c;
    }
    for (int32_t r = 0; r < n; r++) f->run_base[r] = count[f->run_base[r]];
    for (int32_t r = 0; r < n; r++)
        f->run_row[f->run_base[r] + rows[r].pos - rows[r].seq->n_pos] = r;
}

/* Attention of one tile's queries (row by row, head by head) over each
 * row's visible positions, read through the block table in position order
 * from rows of the cache's format (the kernels read quantized rows
 * directly). Each key and value row is read once for all the queries, and
 * each query gets the bits it would get alone: its own scores, its own
 * softmax, its own sum of the values it sees, in position order. The
 * rounding follows llama.cpp's (non-flash) attention: with f16 K, Q is
 * rounded to f16 like the K it meets (quantized K meets the f32 Q); the
 * softmax is taken in f32 with a double sum, and the probabilities are
 * rounded to f16 before they weight V. With the rotated type, Q is rotated
 * like the keys were, and the weighted sum of rotated values is un-rotated
 * once. */
static void attend_tile(const step *s, const att_tile *T, float *scr) {
    forward_ctx *f = s->f;
    const model *m = f->m;
    const layer_desc *L = s->L;
    const attn_kernels *ak = f->ak;
    const kv_cache *kv = f->kv;
    const attn_kv_ops *kops = &ak->kv[kv->kformat], *vops = &ak->kv[kv->vformat];
    int32_t hd = m->head_dim, hdv = m->head_dim_v, kvh = T->h0 / (m->n_head / m->n_head_kv);
    size_t kb = kv_row_bytes(kv->kformat, (size_t)hd), vb = kv_row_bytes(kv->vformat, (size_t)hdv);
    int32_t nq = T->nr * T->nh;
    const kv_seq *seq = s->rows[T->r0].seq;
    int32_t lo[16], hi[16], tlo = INT32_MAX, thi = -1;
    for (int32_t i = 0; i < T->nr; i++) {
        lo[i] = row_lo(s, T->r0 + i);
        hi[i] = s->rows[T->r0 + i].pos;
        if (lo[i] < tlo) tlo = lo[i];
        if (hi[i] > thi) thi = hi[i];
    }
    int32_t span = thi - tlo + 1;
    float *q16 = scr, *acc = q16 + (size_t)nq * hd, *sc = acc + (size_t)nq * hdv;
    /* query i = row i / nh, head h0 + i % nh */
    for (int32_t i = 0; i < nq; i++) {
        long r = T->r0 + i / T->nh;
        const float *q = f->q + r * (long)m->n_head * hd + (long)(T->h0 + i % T->nh) * hd;
        if (kv->kformat == KV_FMT_F16)
            ak->scale_round_f16(q16 + (size_t)i * hd, q, 1.0f, (size_t)hd);
        else
            memcpy(q16 + (size_t)i * hd, q, (size_t)hd * sizeof(float));
        if (kv->kscale) { /* the balance's inverse (kv_cache.kscale) */
            const float *a = kv->kscale + ((size_t)s->il * m->n_head_kv + (size_t)kvh) * hd;
            for (int32_t c = 0; c < hd; c++) q16[(size_t)i * hd + c] /= a[c];
        }
        if (kv->rotated) attn_rotate(q16 + (size_t)i * hd, (size_t)hd);
    }
    /* Every query's score for every key of the tile's span (those a row
     * does not see are computed and left unused). */
    /* A window type reads the positions kv_recent names in f16 (the same
     * for every query of the tile: plan_tiles keeps it in one block), in
     * runs of one kind. */
    enum { CHUNK = 64 };
    const attn_kv_ops *h16 = &ak->kv[KV_FMT_F16];
    const int32_t q0 = hi[0], kd = m->n_head_kv * hd;
    const bool recent = kv->recent;
    const void *kr[CHUNK];
    float *kcs = scr + f->acc_stride - kc4_floats(m, f->tile_q);
    for (int32_t p = tlo; p <= thi;) {
        int32_t p0 = p, cnt = 0;
        bool f16 = recent && kv_recent(q0, p);
        if (!f16 && kv->kformat == KV_FMT_C4) { /* a block of keys per channel */
            p = kc4_scores(s, T, q16, nq, p, thi, sc + (p0 - tlo), (size_t)span, kcs);
            continue;
        }
        if (!recent) { /* the cache's rows: a whole chunk */
            cnt = thi - p + 1 < CHUNK ? thi - p + 1 : CHUNK;
            kv_rows(kv, seq, L->kv_group, L->kv_index, false, p, cnt, (size_t)kvh * kb, kr);
            p += cnt;
        }
        for (; cnt < CHUNK && p <= thi && (recent && kv_recent(q0, p)) == f16; cnt++, p++)
            kr[cnt] = f16 ? (const void *)(recent_row(s, T->r0, p) + (size_t)kvh * hd)
                          : (const uint8_t *)kv_k(kv, seq, L->kv_group, L->kv_index, p) + kvh * kb;
        (f16 ? h16 : kops)
            ->dot_tile(q16, (size_t)nq, kr, (size_t)cnt, (size_t)hd, sc + (p0 - tlo), (size_t)span);
    }
    float *wrow[16];
    int32_t wn[16];
    for (int32_t i = 0; i < nq; i++) {
        int32_t ri = i / T->nh;
        wrow[i] = sc + (size_t)i * span + (lo[ri] - tlo);
        wn[i] = hi[ri] - lo[ri] + 1;
    }
    ak->softmax(wrow, wn, (size_t)nq, m->attn_scale, m->attn_softcap);
    /* The weighted values over segments of the span where the set of rows
     * that see a position does not change, in position order. */
    memset(acc, 0, (size_t)nq * hdv * sizeof(float));
    int32_t cut[33], ncut = 0;
    for (int32_t i = 0; i < T->nr; i++) {
        cut[ncut++] = lo[i];
        cut[ncut++] = hi[i] + 1;
    }
    for (int32_t i = 1; i < ncut; i++) /* insertion sort: at most 32 */
        for (int32_t j = i; j > 0 && cut[j - 1] > cut[j]; j--) {
            int32_t t = cut[j];
            cut[j] = cut[j - 1];
            cut[j - 1] = t;
        }
    for (int32_t c = 0; c + 1 < ncut; c++) {
        int32_t a = cut[c], b = cut[c + 1];
        if (a == b) continue;
        float *accp[16];
        const float *wp[16];
        size_t na = 0;
        for (int32_t i = 0; i < nq; i++) {
            int32_t ri = i / T->nh;
            if (lo[ri] > a || hi[ri] < b - 1) continue;
            accp[na] = acc + (size_t)i * hdv;
            wp[na++] = sc + (size_t)i * span + (a - tlo);
        }
        if (!na) continue;
        for (int32_t p = a; p < b;) {
            const void *vr[CHUNK];
            int32_t cnt = 0;
            bool f16 = recent && kv_recent(q0, p);
            if (!recent) { /* the cache's rows: a whole chunk */
                cnt = b - p < CHUNK ? b - p : CHUNK;
                kv_rows(kv, seq, L->kv_group, L->kv_index, true, p, cnt, (size_t)kvh * vb, vr);
                p += cnt;
            }
            for (; cnt < CHUNK && p < b && (recent && kv_recent(q0, p)) == f16; cnt++, p++)
                vr[cnt] =
                    f16 ? (const void *)(recent_row(s, T->r0, p) + kd + (size_t)kvh * hdv)
                        : (const uint8_t *)kv_v(kv, seq, L->kv_group, L->kv_index, p) + kvh * vb;
            (f16 ? h16 : vops)->axpy_tile(accp, wp, na, vr, (size_t)cnt, (size_t)hdv);
            for (size_t i = 0; i < na; i++) wp[i] += cnt;
        }
    }
    for (int32_t i = 0; i < nq; i++) {
        long r = T->r0 + i / T->nh;
        float *o = acc + (size_t)i * hdv;
        if (kv->rotated) attn_unrotate(o, (size_t)hdv);
        memcpy(f->att + r * (long)m->n_head * hdv + (long)(T->h0 + i % T->nh) * hdv, o,
               (size_t)hdv * sizeof(float));
    }
}

/* kv_calibrate's statistics of the layer's rows (kv_cache.calib), in
 * batch order: keys as they were before the rotation (task_qk rotated
 * them in place; no centring is set yet), queries after RoPE. Not the
 * sink's: queries read those in f16, and the first position's key is far
 * from the others (it would pull the means and spreads its way). */
static void calib_rows(const step *s) {
    const forward_ctx *f = s->f;
    const model *m = f->m;
    kv_calib *cb = f->kv->calib;
    int32_t hd = m->head_dim, kd = m->n_head_kv * hd, group = m->n_head / m->n_head_kv;
    double *sk = cb->sk + (size_t)s->il * kd, *sk2 = cb->sk2 + (size_t)s->il * kd,
           *sq2 = cb->sq2 + (size_t)s->il * kd;
    float kh[1024];
    for (int32_t r = 0; r < s->n; r++) {
        if (s->rows[r].pos < KV_BLOCK_TOKENS) continue; /* the sink: read in f16 */
        const float *q = f->q + (size_t)r * m->n_head * hd, *k = f->k + (size_t)r * kd;
        for (int32_t h = 0; h < m->n_head_kv; h++) {
            memcpy(kh, k + h * hd, (size_t)hd * sizeof(float));
            if (f->kv->rotated) attn_unrotate(kh, (size_t)hd);
            for (int32_t c = 0; c < hd; c++) {
                sk[h * hd + c] += kh[c];
                sk2[h * hd + c] += (double)kh[c] * kh[c];
            }
        }
        for (int32_t h = 0; h < m->n_head; h++)
            for (int32_t c = 0; c < hd; c++)
                sq2[(h / group) * hd + c] += (double)q[h * hd + c] * q[h * hd + c] / group;
        cb->n[s->il] += 1;
    }
}

/* A window type: the layer's f16 rows of the pass into their sequences'
 * tails, in batch order (so where a sequence's rows pass the ring's
 * length, the last ones stay), once the layer's attention has read what
 * the tails held before. */
static void save_recent(const step *s) {
    const kv_cache *kv = s->f->kv;
    for (int32_t r = 0; r < s->n; r++)
        memcpy(kv_tail(kv, s->rows[r].seq, s->L->kv_group, s->L->kv_index, s->rows[r].pos),
               s->f->kv16 + (size_t)r * kv->tail_row, kv->tail_row * sizeof(uint16_t));
}

/* Each thread claims the next tile until none is left, the costliest
 * first (plan_tiles' order backwards: a sequence's later rows see more
 * keys), so a thread that gets through its tiles faster takes more of
 * them; a tile's result does not depend on the thread that computes it. */
static void task_attention(void *arg, int ith, int nth) {
    step *s = arg;
    forward_ctx *f = s->f;
    float *acc = f->acc + (size_t)ith * f->acc_stride;
    prefetch_next(s, ith, nth);
    if (f->att_nth == nth) { /* spans (att_spans) */
        long t, end;
        for (int from = 0; tp_span_next(f->span, ith, nth, false, false, &from, &t, &end);)
            attend_tile(s, &f->tiles[t], acc);
        return;
    }
    for (;;) {
        int32_t t = atomic_fetch_add_explicit(&f->tile_next, 1, memory_order_relaxed);
        if (t >= f->n_tiles) break;
        attend_tile(s, &f->tiles[f->n_tiles - 1 - t], acc);
    }
}

/* x[i] += y[i] * scale (scale 1: x[i] += y[i]), the same operations one
 * element at a time; eight at a time in the source so that -O2 makes
 * vector adds of them (x and y do not overlap). */
static void add_scaled(float *restrict x, const float *restrict y, float scale, int32_t n) {
    int32_t i = 0;
    if (scale != 1.0f) {
        for (; i + 8 <= n; i += 8)
            for (int32_t j = 0; j < 8; j++) x[i + j] += y[i + j] * scale;
        for (; i < n; i++) x[i] += y[i] * scale;
    } else {
        for (; i + 8 <= n; i += 8)
            for (int32_t j = 0; j < 8; j++) x[i + j] += y[i + j];
        for (; i < n; i++) x[i] += y[i];
    }
}

/* The residual of row r: x += y, after the layer's post-norm of y where it
 * has one. */
static void residual_row(const step *s, long r, float *y, const weight *post) {
    const model *m = s->f->m;
    float *x = s->f->x + r * m->n_embd;
    float *yr = y + r * m->n_embd;
    if (post->data) rmsnorm(yr, yr, post->data, m->n_embd, m->norm_eps); /* in place */
    add_scaled(x, yr, m->residual_scale, m->n_embd);
}

/* Row r of `x` (k wide) into the matmul scratch as the input of s->quant. */
static void quantize_row(const step *s, long r, const float *x, int32_t k) {
    const weight *w = s->quant;
    matmul_quantize_row(w->type, k, x + r * k, matmul_input_row(w->type, k, s->f->scratch, r));
}

/* The steps between two matmuls that work row by row (see step): one
 * hand-off between the threads for all of them. */
static void task_rows(void *arg, int ith, int nth) {
    step *s = arg;
    prefetch_next(s, ith, nth);
    const model *m = s->f->m;
    int32_t d = m->n_embd;
    long b, e;
    for (int from = 0; rows_take(s, ith, nth, &from, &b, &e);)
        for (long r = b; r < e; r++) {
            if (s->res_post) residual_row(s, r, s->f->hb, s->res_post);
            if (s->norm) rmsnorm(s->f->xb + r * d, s->f->x + r * d, s->norm->data, d, m->norm_eps);
            if (s->quant) quantize_row(s, r, s->f->xb, d);
        }
}

/* hb2 = act(gate) * up, with gate in hb2 and up in hb, rows of s->ff. */
static void task_act(void *arg, int ith, int nth) {
    step *s = arg;
    prefetch_next(s, ith, nth);
    const model *m = s->f->m;
    int32_t ff = s->ff;
    long b, e;
    for (int from = 0; rows_take(s, ith, nth, &from, &b, &e);)
        for (long r = b; r < e; r++) {
            float *g = s->f->hb2 + r * ff;
            const float *u = s->f->hb + r * ff;
            if (m->act == ACT_GELU_TANH) {
                (void)pthread_once(&gelu_once, gelu_table_fill);
                s->f->ak->gelu_mul(g, u, gelu_table, (size_t)ff);
            } else
                s->f->ak->silu_mul(g, u, (size_t)ff);
            if (s->quant) quantize_row(s, r, s->f->hb2, ff);
        }
}

/* The RoPE tables' slot for layer s->L's base and scale: one this step
 * filled already, else the next, to be filled by task_qk. */
static void rope_slot(forward_ctx *f, step *s) {
    const float key[2] = {s->L->rope_base, s->L->rope_scale};
    for (int i = 0; i < 2; i++)
        if (f->rope_valid[i] && !memcmp(f->rope_key[i], key, sizeof key)) {
            s->rope_slot = i;
            s->rope_fill = false;
            return;
        }
    s->rope_slot = f->rope_next;
    s->rope_fill = true;
    f->rope_next ^= 1;
    memcpy(f->rope_key[s->rope_slot], key, sizeof key);
    f->rope_valid[s->rope_slot] = !s->L->nope;
}

/* A task over the batch's rows (norms, Q/K prep, residuals, activation):
 * with fewer rows than ROWS_INLINE (decoding), the calling thread does them
 * all, as one thread would inside the pool anyway, and the hand-off to the
 * others is skipped. The same code runs per row either way. */
#define ROWS_INLINE 4
/* task_kblocks where the step ends a block: on the threads when it ends
 * several, else on this one. */
static void kblocks(forward_ctx *f, step *s) {
    int32_t n = 0;
    for (int32_t r = 0; r < s->n; r++) n += s->rows[r].pos % KV_BLOCK_TOKENS == KV_BLOCK_TOKENS - 1;
    if (n * f->m->n_head_kv >= 4)
        tp_run(f->tp, task_kblocks, s);
    else if (n > 0)
        task_kblocks(s, 0, 1);
}

static void run_rows(forward_ctx *f, void (*fn)(void *, int, int), step *s) {
    if (s->n < ROWS_INLINE) {
        fn(s, 0, 1);
        return;
    }
    f->row_nth = tp_spans_split(f->span, s->n, tp_threads(f->tp)); /* tp_run publishes */
    tp_run(f->tp, fn, s);
}

static void mm(forward_ctx *f, const weight *w, const float *x, int32_t rows, float *y) {
    matmul(f->tp, w->data, w->type, w->ne1, w->ne0, x, rows, y, f->scratch);
}

/* One to three weights on the same input (mm() on each gives the same
 * bits): one quantization of x, one parallel task for all their rows;
 * with `quantized`, x's rows are in the scratch already (a row task did
 * it, where mm_fusable said it could). */
static void mm_shared(forward_ctx *f, const weight *const *w, float *const *y, int nw,
                      const float *x, int32_t rows, bool quantized, const matmul_prefetch *pf) {
    matmul_job jobs[3];
    matmul_multi(f->tp, jobs, mm_jobs(w, y, nw, jobs), w[0]->ne0, x, rows, f->scratch, quantized,
                 pf);
}

/* The K/V of layer s->L that the step's attention will read from the
 * cache, as prefetch regions for the Q/K/V matmul before it: each
 * sequence's blocks from its first row's window start up to that row's
 * position (the layer's K rows, block metadata and V rows of a block are
 * one run of layer_bytes). Only where the matmul has rows enough (4 or
 * more) to compute more than it reads (a matrix-vector product is bound by
 * memory already, and the prefetches would take its bandwidth), and the
 * step decodes (at most 4 rows a sequence: a prefill's attention computes
 * more than it reads, and its matmul's L2 is better left alone). At most
 * KV_PREFETCH_BYTES a thread, about half an L2 (a long context's blocks
 * beyond it are left to the attention). Decoding 8 sessions of SmolLM2,
 * the attention's K/V loads were its largest stall (docs/benchmarks.md).
 * Each row's first region (the count before its blocks, for those past
 * the budget the count of all) goes to f->pf_row, for att_spans. */
#define KV_PREFETCH_BYTES (512 * 1024)
#define KV_PREFETCH_REGIONS 128
static int kv_prefetch_regions(const step *s, const char **base, size_t *len, int max) {
    const forward_ctx *f = s->f;
    const kv_cache *kv = f->kv;
    if (s->n < 4) return 0;
    int32_t runs = 1;
    for (int32_t r = 1; r < s->n; r++) runs += s->rows[r].seq != s->rows[r - 1].seq;
    if (s->n > 4 * runs) return 0; /* a prefill: its attention computes more */
    size_t layer_bytes = kv->groups[s->L->kv_group].layer_bytes,
           budget = KV_PREFETCH_BYTES * (size_t)tp_threads(f->tp);
    int nr = 0;
    for (int32_t r = 0; r < s->n; r++) {
        bool later = r > 0 && s->rows[r].seq == s->rows[r - 1].seq; /* in a run: its first's */
        f->pf_row[r] = later ? f->pf_row[r - 1] : nr;
        if (later) continue;
        for (int32_t p = row_lo(s, r) / KV_BLOCK_TOKENS * KV_BLOCK_TOKENS;
             p < s->rows[r].pos && nr < max && budget >= layer_bytes; p += KV_BLOCK_TOKENS) {
            base[nr] = kv_k(kv, s->rows[r].seq, s->L->kv_group, s->L->kv_index, p);
            len[nr++] = layer_bytes;
            budget -= layer_bytes;
        }
    }
    return nr;
}

/* The threads' spans of the layer's tiles where its Q/K/V matmul
 * prefetched the K/V (n_regions of kv_prefetch_regions, split over the
 * threads as matmul splits them): a thread's span is the tiles of the
 * rows whose first region it prefetched, so its attention reads what its
 * own L2 holds (the rows past the prefetch budget go to the last thread);
 * the others take from its back once out of their own. (One counter for
 * all the tiles gave each thread half of its tiles' K/V from the other
 * core's cache.) Else att_nth 0: task_attention's shared counter. */
static void att_spans(step *s, int n_regions) {
    forward_ctx *f = s->f;
    int nth = tp_threads(f->tp);
    f->att_nth = n_regions > 0 && nth > 1 && nth <= TP_SPAN_MAX ? nth : 0;
    for (int i = 0, t = 0; i < f->att_nth; i++) {
        long rb, re;
        tp_split(n_regions, i, nth, &rb, &re);
        int t0 = t;
        while (t < f->n_tiles && (i == nth - 1 || f->pf_row[f->tiles[t].r0] < re)) t++;
        tp_span_set(&f->span[i], t0, t);
    }
}

/* Whether the row task before a matmul of these weights may quantize its
 * input (one input format for all of them): the weight to quantize for,
 * or NULL. */
static const weight *mm_fusable(const weight *const *w, int nw) {
    matmul_job jobs[3];
    return matmul_shares_input(jobs, mm_jobs(w, (float *const[]){NULL, NULL, NULL}, nw, jobs))
               ? w[0]
               : NULL;
}

/* The router of one row: softmax over the experts' logits (in place), the
 * n_used most probable (ties to the lower id), listed in ascending expert
 * order with their probabilities, renormalised to sum 1 where the family
 * does so. */
static void route_row(const model *m, float *p, int32_t *sel, float *w) {
    int32_t ne = m->n_expert, k = m->n_expert_used;
    float mx = -INFINITY;
    for (int32_t e = 0; e < ne; e++)
        if (p[e] > mx) mx = p[e];
    double sum = 0;
    for (int32_t e = 0; e < ne; e++) {
        p[e] = xm_expf(p[e] - mx);
        sum += p[e];
    }
    float inv = (float)(1.0 / sum);
    for (int32_t e = 0; e < ne; e++) p[e] *= inv;
    /* k passes of "the best not yet chosen": k and the expert count are small. */
    uint8_t chosen[1024] = {0}; /* n_expert <= 1024 (model_load checks) */
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < ne; e++)
            if (!chosen[e] && (best < 0 || p[e] > p[best])) best = e;
        chosen[best] = 1;
    }
    int32_t n = 0;
    float tot = 0;
    for (int32_t e = 0; e < ne; e++)
        if (chosen[e]) {
            sel[n] = e;
            w[n++] = p[e];
            tot += p[e];
        }
    if (m->moe_norm_topk)
        for (int32_t j = 0; j < k; j++) w[j] /= tot;
}

/* The mixture of experts on the normed rows in xb, into hb: the router
 * picks each row's experts; then, expert by expert, the rows routed to it
 * are gathered and go through its gate, up and down matrices as one batch
 * (one read of the expert's weights for all of them), and each row adds
 * its weighted result. A row's sum runs over its experts in ascending
 * order and every matmul treats a row alone, so the result does not depend
 * on the other rows of the batch. Experts no row picked are not read. */
static void moe(forward_ctx *f, step *s) {
    const model *m = f->m;
    const layer_desc *L = s->L;
    int32_t n = s->n, d = m->n_embd, k = m->n_expert_used, ne = m->n_expert;
    mm(f, &L->ffn_gate_inp, f->xb, n, f->router);
    for (int32_t r = 0; r < n; r++)
        route_row(m, f->router + (size_t)r * ne, f->sel + (size_t)r * k, f->sel_w + (size_t)r * k);
    memset(f->moe_out, 0, (size_t)n * (size_t)d * sizeof(float));
    for (int32_t e = 0; e < ne; e++) {
        int32_t cnt = 0;
        for (int32_t r = 0; r < n; r++)
            for (int32_t j = 0; j < k; j++)
                if (f->sel[(size_t)r * k + j] == e) {
                    f->grp[cnt] = r;
                    f->grp_w[cnt++] = f->sel_w[(size_t)r * k + j];
                }
        if (!cnt) continue;
        for (int32_t i = 0; i < cnt; i++)
            memcpy(f->xg + (size_t)i * d, f->xb + (size_t)f->grp[i] * d, (size_t)d * sizeof(float));
        weight g = model_expert(&L->gate_exps, ne, e), u = model_expert(&L->up_exps, ne, e),
               dn = model_expert(&L->down_exps, ne, e);
        mm_shared(f, (const weight *const[]){&g, &u}, (float *const[]){f->hb2, f->hb}, 2, f->xg,
                  cnt, false, NULL);
        step se = *s;
        se.n = cnt;
        se.ff = m->n_ff_exp;
        run_rows(f, task_act, &se);
        mm(f, &dn, f->hb2, cnt, f->og);
        for (int32_t i = 0; i < cnt; i++) {
            float *o = f->moe_out + (size_t)f->grp[i] * d;
            const float *y = f->og + (size_t)i * d;
            float w = f->grp_w[i];
            for (int32_t c = 0; c < d; c++) o[c] += w * y[c];
        }
    }
    memcpy(f->hb, f->moe_out, (size_t)n * (size_t)d * sizeof(float));
}

/* A short-convolution block (lfm2) on the normed rows in xb, into hb:
 * in_proj gives B, C and x; each channel's causal convolution of width
 * conv_l runs over B * x of the sequence's last conv_l - 1 rows (its state)
 * and this row's; C times that goes through out_proj. The state advances
 * row by row in batch order, which is each sequence's position order, so
 * a row sees the same inputs whether its sequence comes in one chunk, in
 * pieces or token by token. */
static void conv_block(forward_ctx *f, step *s) {
    const model *m = f->m;
    const layer_desc *L = s->L;
    int32_t n = s->n, d = m->n_embd, w = m->conv_l;
    mm(f, &L->conv_in, f->xb, n, f->bcx);
    const float *k = L->conv_k.data; /* [d][w] */
    for (int32_t r = 0; r < n; r++) {
        const float *b = f->bcx + (size_t)r * 3 * (size_t)d, *c = b + d, *x = b + 2 * d;
        float *st = s->rows[r].seq->conv + (size_t)L->conv_index * (size_t)(w - 1) * (size_t)d;
        float *y = f->xb + (size_t)r * d;
        for (int32_t ch = 0; ch < d; ch++) {
            const float *kc = k + (size_t)ch * w;
            float bx = b[ch] * x[ch], acc = 0;
            for (int32_t i = 0; i < w - 1; i++) acc += kc[i] * st[(size_t)i * d + ch];
            acc += kc[w - 1] * bx;
            for (int32_t i = 0; i + 1 < w - 1; i++)
                st[(size_t)i * d + ch] = st[(size_t)(i + 1) * d + ch];
            st[(size_t)(w - 2) * d + ch] = bx;
            y[ch] = c[ch] * acc;
        }
    }
    mm(f, &L->conv_out, f->xb, n, f->hb);
}

cellm_status forward_run(forward_ctx *f, const fwd_row *rows, int32_t n, const float **logits,
                         cellm_error *err) {
    return forward_run_embd(f, rows, NULL, n, logits, err);
}

/* The embedding and layers [0, end) of the batch, whose blocks are
 * reserved: the residual stream after layer end - 1 in f->x. */
static void run_layers(forward_ctx *f, const fwd_row *rows, const float *const *embd, int32_t n,
                       int32_t end) {
    const model *m = f->m;
    int32_t d = m->n_embd;
    for (int32_t r = 0; r < n; r++) {
        if (embd && embd[r]) {
            /* An image's row: its embedding as it is (no embedding scale). */
            memcpy(f->x + (size_t)r * d, embd[r], (size_t)d * sizeof(float));
            continue;
        }
        matrix_get_row(m->tok_embd.data, m->tok_embd.type, d, rows[r].token, f->x + (size_t)r * d);
        if (m->emb_scale != 1.0f)
            for (int32_t i = 0; i < d; i++) f->x[(size_t)r * d + i] *= m->emb_scale;
    }
    step s = {.f = f, .rows = rows, .n = n, .ff = m->n_ff};
    f->rope_valid[0] = f->rope_valid[1] = false;
    if (f->kv->recent) map_runs(f, rows, n);
    for (int32_t il = 0; il < end; il++) {
        const layer_desc *L = &m->layers[il];
        const weight *qkv[] = {&L->wq, &L->wk, &L->wv}, *gu[] = {&L->w_gate, &L->w_up};
        /* the previous layer's MLP residual, this one's norm, Q/K/V's input */
        s.res_post = il > 0 ? &m->layers[il - 1].post_ffn_norm : NULL;
        s.norm = &L->attn_norm;
        s.quant = L->is_conv ? NULL : mm_fusable(qkv, 3);
        s.L = L;
        s.il = il;
        s.n_next = L->is_conv ? 0 : 3;
        memcpy(s.next, qkv, sizeof qkv);
        run_rows(f, task_rows, &s);
        if (L->is_conv) {
            conv_block(f, &s);
        } else {
            const char *pf_base[KV_PREFETCH_REGIONS];
            size_t pf_len[KV_PREFETCH_REGIONS];
            matmul_prefetch pf = {pf_base, pf_len,
                                  kv_prefetch_regions(&s, pf_base, pf_len, KV_PREFETCH_REGIONS)};
            mm_shared(f, qkv, (float *const[]){f->q, f->k, f->v}, 3, f->xb, n, s.quant, &pf);
            rope_slot(f, &s);
            run_rows(f, task_qk, &s);
            if (f->kv->calib) calib_rows(&s);
            if (f->kv->kformat == KV_FMT_C4) kblocks(f, &s);
            plan_tiles(&s);
            att_spans(&s, pf.n);
            s.next[0] = &L->wo;
            s.n_next = 1;
            atomic_store_explicit(&f->tile_next, 0, memory_order_relaxed); /* tp_run publishes */
            tp_run(f->tp, task_attention, &s);
            if (f->kv->recent) save_recent(&s);
            mm(f, &L->wo, f->att, n, f->hb);
        }
        /* the attention's residual, the MLP's norm and its input */
        s.res_post = &L->post_attn_norm;
        s.norm = &L->ffn_norm;
        s.quant = L->ffn_gate_inp.data ? NULL : mm_fusable(gu, 2);
        s.n_next = L->ffn_gate_inp.data ? 0 : 2;
        memcpy(s.next, gu, sizeof gu);
        run_rows(f, task_rows, &s);
        if (L->ffn_gate_inp.data) {
            moe(f, &s);
        } else {
            mm_shared(f, gu, (float *const[]){f->hb2, f->hb}, 2, f->xb, n, s.quant, NULL);
            s.quant = &L->w_down;
            s.next[0] = &L->w_down;
            s.n_next = 1;
            run_rows(f, task_act, &s);
            mm_shared(f, (const weight *const[]){&L->w_down}, (float *const[]){f->hb}, 1, f->hb2, n,
                      true, NULL);
        }
    }
    if (end > 0) { /* the last MLP residual */
        s.res_post = &m->layers[end - 1].post_ffn_norm;
        s.norm = s.quant = NULL;
        s.n_next = 0;
        run_rows(f, task_rows, &s);
    }
}

cellm_status forward_run_layers(forward_ctx *f, const fwd_row *rows, const float *const *embd,
                                int32_t n, int32_t end, const float **x, cellm_error *err) {
    if (n < 1 || n > f->max_rows || end < 0 || end > f->m->n_layer)
        return err_set(err, CELLM_ERR_INVALID_ARG, "%d rows through %d layers (limits %d, %d)", n,
                       end, f->max_rows, f->m->n_layer);
    run_layers(f, rows, embd, n, end);
    *x = f->x;
    return CELLM_OK;
}

cellm_status forward_run_embd(forward_ctx *f, const fwd_row *rows, const float *const *embd,
                              int32_t n, const float **logits, cellm_error *err) {
    cellm_status st = batch_reserve(f->m, f->kv, rows, n, f->max_rows, f->max_logit_rows, err);
    if (st) return st;
    const model *m = f->m;
    int32_t d = m->n_embd;
    run_layers(f, rows, embd, n, m->n_layer);
    /* The classifier, only for rows that want logits: gather their normed
     * states into xb, in batch order. */
    int32_t nl = 0;
    for (int32_t r = 0; r < n; r++) {
        if (!rows[r].logits) continue;
        rmsnorm(f->xb + (size_t)nl * d, f->x + (size_t)r * d, m->out_norm.data, d, m->norm_eps);
        nl++;
    }
    if (nl) {
        mm(f, &m->output, f->xb, nl, f->logits);
        if (m->logit_scale != 1.0f)
            for (size_t i = 0; i < (size_t)nl * (size_t)m->n_vocab; i++)
                f->logits[i] *= m->logit_scale;
        if (m->logit_softcap > 0) {
            float c = m->logit_softcap;
            for (size_t i = 0; i < (size_t)nl * (size_t)m->n_vocab; i++)
                f->logits[i] = c * xm_tanhf(f->logits[i] / c);
        }
    }
    batch_advance(f->kv, rows, n);
    *logits = f->logits;
    return CELLM_OK;
}

/* ------------------------------------------------------------ the seam */

static cellm_status cpu_run(void *impl, const fwd_row *rows, const float *const *embd, int32_t n,
                            const float **logits, cellm_error *err) {
    return forward_run_embd(impl, rows, embd, n, logits, err);
}

static void cpu_free(void *impl) {
    forward_free(impl);
}

static const backend_ops cpu_ops = {"cpu", cpu_run, cpu_free, NULL};

cellm_status forward_backend(const model *m, kv_cache *kv, threadpool *tp, int32_t max_rows,
                             int32_t max_logit_rows, backend *out, cellm_error *err) {
    forward_ctx *f;
    *out = (backend){0};
    cellm_status st = forward_create(m, kv, tp, max_rows, max_logit_rows, &f, err);
    if (st) return st;
    *out = (backend){&cpu_ops, f};
    return CELLM_OK;
}
