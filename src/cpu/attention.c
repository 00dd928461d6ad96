/*
 * attention.c — K/V vector kernels for attention (see attention.h).
 * The scalar, AVX2 and NEON variants follow one order of float operations
 * (the reference's below: 8 lanes with fused multiply-add, a fixed tree to
 * sum them, the tail into lane 0), so they return the same bits on every
 * CPU; the kernels of quantized rows do too (fmaf in the scalar version).
 */
#include "cpu/attention.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/xmath.h"
#include "format/kernels/blocks.h"
#include "format/kernels/fp16.h"
#include "format/kernels/kernels.h"

/* The signed codes of block ib of a Q5_0 row (x = d * c), the
 * reference's unpacking (exact integers: the SIMD variants' own unpacking,
 * avx2_block_i8 and neon_block_i8, gives the same ones); returns d. */
static inline float q5_0_codes(const void *row, size_t ib, int8_t c[32]) {
    const block_q5_0 *b = (const block_q5_0 *)row + ib;
    const uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 |
                        (uint32_t)b->qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        c[j] = (int8_t)(((b->qs[j] & 15) | ((qh >> j) & 1) << 4) - 16);
        c[j + 16] = (int8_t)(((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
    return fp16_to_fp32(b->d);
}

/* The signed codes of block ib of a 3-bit row (block_q3_0), as
 * q5_0_codes; returns d. */
static inline float q3_0_codes(const void *row, size_t ib, int8_t c[32]) {
    const block_q3_0 *b = (const block_q3_0 *)row + ib;
    const uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 |
                        (uint32_t)b->qh[3] << 24;
    for (int j = 0; j < 32; j++)
        c[j] = (int8_t)((((b->qs[j % 8] >> (2 * (j / 8))) & 3) | ((qh >> j) & 1) << 2) - 4);
    return fp16_to_fp32(b->d);
}

static float ref_dot_f16(const float *q, const uint16_t *k, size_t n) {
    float lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] = fmaf(q[i + j], fp16_to_fp32(k[i + j]), lane[j]);
    for (; i < n; i++) lane[0] = fmaf(q[i], fp16_to_fp32(k[i]), lane[0]);
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
           ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

static void ref_axpy_f16(float *acc, float w, const uint16_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] = fmaf(w, fp16_to_fp32(v[i]), acc[i]);
}

static void ref_scale(float *acc, float s, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] *= s;
}

static void ref_dot4_f16(const float *q, const uint16_t *const k[4], size_t n, float out[4]) {
    for (int j = 0; j < 4; j++) out[j] = ref_dot_f16(q, k[j], n);
}

static void ref_axpy_rows_f16(float *acc, const float *w, const uint16_t *const *v, size_t nk,
                              size_t n) {
    for (size_t j = 0; j < nk; j++) ref_axpy_f16(acc, w[j], v[j], n);
}

static void ref_scale_round_f16(float *out, const float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = fp16_to_fp32(fp32_to_fp16(x[i] * s));
}

/* The kv[] entries of the f16 format: the f16 kernels behind the
 * format-neutral signatures. Value rows go in chunks of pointers copied to
 * their own type (axpy_rows_f16 gives the same bits for any split). */
#define KV_F16_WRAPPERS(pfx)                                                                       \
    static float pfx##_kv_dot_f16(const float *q, const void *k, size_t n) {                       \
        return pfx##_dot_f16(q, (const uint16_t *)k, n);                                           \
    }                                                                                              \
    static void pfx##_kv_dot4_f16(const float *q, const void *const k[4], size_t n,                \
                                  float out[4]) {                                                  \
        const uint16_t *const kk[4] = {k[0], k[1], k[2], k[3]};                                    \
        pfx##_dot4_f16(q, kk, n, out);                                                             \
    }                                                                                              \
    static void pfx##_kv_axpy_rows_f16(float *acc, const float *w, const void *const *v,           \
                                       size_t nk, size_t n) {                                      \
        const uint16_t *vr[32];                                                                    \
        for (size_t j = 0; j < nk; j += 32) {                                                      \
            size_t c = nk - j < 32 ? nk - j : 32;                                                  \
            for (size_t i = 0; i < c; i++) vr[i] = v[j + i];                                       \
            pfx##_axpy_rows_f16(acc, w + j, vr, c, n);                                             \
        }                                                                                          \
    }

KV_F16_WRAPPERS(ref)

static void store_f16(void *dst, const float *x, size_t n) {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = fp32_to_fp16(x[i]);
}
#define ref_store_f16 store_f16
#define neon_store_f16 store_f16 /* (vcvt_f16_f32 would need the same NaN care) */
static void store_q8_0(void *dst, const float *x, size_t n) {
    ref_quantize_q8_0(x, dst, n);
}
static void store_q4_0(void *dst, const float *x, size_t n) {
    ref_quantize_q4_0(x, dst, n);
}
static void store_q5_0(void *dst, const float *x, size_t n) {
    ref_quantize_q5_0(x, dst, n);
}
static void store_q3_0(void *dst, const float *x, size_t n) {
    ref_quantize_q3_0(x, dst, n);
}
/* A row of scale-less codes: each x rounded to the nearest of -8..7 (the
 * per-channel keys are written a block at a time, attn_kc4_quantize; this
 * is the row form, for tests). */
static void store_c4(void *dst, const float *x, size_t n) {
    uint8_t *o = dst;
    for (size_t ib = 0; ib < n / 32; ib++, x += 32, o += 16)
        for (int j = 0; j < 16; j++) {
            int c[2];
            for (int h = 0; h < 2; h++) {
                const float v = floorf(x[j + 16 * h] + 8.5f);
                c[h] = v >= 15.0f ? 15 : v >= 0.0f ? (int)v : 0;
            }
            o[j] = (uint8_t)(c[0] | c[1] << 4);
        }
}
/* The scale and the 32 codes (as floats, in element order) of block ib of
 * a quantized row. */
static inline float block_codes(kv_format f, const void *row, size_t ib, float c[32]) {
    if (f == KV_FMT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + ib;
        for (int i = 0; i < 32; i++) c[i] = (float)b->qs[i];
        return fp16_to_fp32(b->d);
    }
    if (f == KV_FMT_Q5_0 || f == KV_FMT_Q3_0) {
        int8_t ci[32];
        const float d = f == KV_FMT_Q5_0 ? q5_0_codes(row, ib, ci) : q3_0_codes(row, ib, ci);
        for (int i = 0; i < 32; i++) c[i] = (float)ci[i];
        return d;
    }
    const bool c4 = f == KV_FMT_C4;
    const uint8_t *qs = c4 ? (const uint8_t *)row + 16 * ib : ((const block_q4_0 *)row + ib)->qs;
    for (int i = 0; i < 16; i++) {
        c[i] = (float)((qs[i] & 15) - 8);
        c[i + 16] = (float)((qs[i] >> 4) - 8);
    }
    return c4 ? 1.0f : fp16_to_fp32(((const block_q4_0 *)row + ib)->d);
}

void attn_kv_dequantize(kv_format format, const void *row, float *out, size_t n) {
    if (format == KV_FMT_F16) {
        for (size_t i = 0; i < n; i++) out[i] = fp16_to_fp32(((const uint16_t *)row)[i]);
        return;
    }
    for (size_t ib = 0; ib < n / 32; ib++) {
        float c[32];
        const float d = block_codes(format, row, ib, c);
        for (int i = 0; i < 32; i++) out[32 * ib + i] = d * c[i];
    }
}

static inline float lanes_sum(const float l[8]) {
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* A block's 32 products go into 8 lanes (element i into lane i % 8, in
 * element order, each a fused multiply-add from zero); the block's scale
 * then multiplies the lanes into the running ones (fused too); the lanes
 * are summed in pairs at the end. */
static float ref_dot_q(kv_format f, const float *q, const void *k, size_t n) {
    assert(n % 32 == 0);
    float lane[8] = {0};
    for (size_t ib = 0; ib < n / 32; ib++, q += 32) {
        float c[32], part[8] = {0};
        const float d = block_codes(f, k, ib, c);
        for (int i = 0; i < 32; i += 8)
            for (int j = 0; j < 8; j++) part[j] = fmaf(q[i + j], c[i + j], part[j]);
        for (int j = 0; j < 8; j++) lane[j] = fmaf(d, part[j], lane[j]);
    }
    return lanes_sum(lane);
}

/* acc[i] = fma(w * d, code, acc[i]) per element, row after row. */
static void ref_axpy_rows_q(kv_format f, float *acc, const float *w, const void *const *v,
                            size_t nk, size_t n) {
    assert(n % 32 == 0);
    for (size_t j = 0; j < nk; j++)
        for (size_t ib = 0; ib < n / 32; ib++) {
            float c[32];
            const float wd = w[j] * block_codes(f, v[j], ib, c);
            for (int i = 0; i < 32; i++) acc[32 * ib + i] = fmaf(wd, c[i], acc[32 * ib + i]);
        }
}

#define REF_Q_KERNELS(fmt, sfx)                                                                    \
    static float ref_dot_##sfx(const float *q, const void *k, size_t n) {                          \
        return ref_dot_q(fmt, q, k, n);                                                            \
    }                                                                                              \
    static void ref_dot4_##sfx(const float *q, const void *const k[4], size_t n, float out[4]) {   \
        for (int j = 0; j < 4; j++) out[j] = ref_dot_q(fmt, q, k[j], n);                           \
    }                                                                                              \
    static void ref_axpy_rows_##sfx(float *acc, const float *w, const void *const *v, size_t nk,   \
                                    size_t n) {                                                    \
        ref_axpy_rows_q(fmt, acc, w, v, nk, n);                                                    \
    }

REF_Q_KERNELS(KV_FMT_Q8_0, q8_0)
REF_Q_KERNELS(KV_FMT_Q4_0, q4_0)
REF_Q_KERNELS(KV_FMT_Q5_0, q5_0)
REF_Q_KERNELS(KV_FMT_Q3_0, q3_0)
REF_Q_KERNELS(KV_FMT_C4, c4)

/* Calls F(g) with g a constant 1..N for a count g of 1..N (N 4, 8, 12
 * or 16): the SIMD tile kernels keep a constant number of accumulators, so
 * they live in registers. */
#define TILE_CASES4(F)                                                                             \
    case 1: F(1); break;                                                                           \
    case 2: F(2); break;                                                                           \
    case 3: F(3); break;                                                                           \
    case 4:                                                                                        \
        F(4);                                                                                      \
        break
#define TILE_CASES8(F)                                                                             \
    TILE_CASES4(F);                                                                                \
    case 5: F(5); break;                                                                           \
    case 6: F(6); break;                                                                           \
    case 7: F(7); break;                                                                           \
    case 8:                                                                                        \
        F(8);                                                                                      \
        break
#define TILE_CASES12(F)                                                                            \
    TILE_CASES8(F);                                                                                \
    case 9: F(9); break;                                                                           \
    case 10: F(10); break;                                                                         \
    case 11: F(11); break;                                                                         \
    case 12:                                                                                       \
        F(12);                                                                                     \
        break
#define TILE_CASES16(F)                                                                            \
    TILE_CASES12(F);                                                                               \
    case 13: F(13); break;                                                                         \
    case 14: F(14); break;                                                                         \
    case 15: F(15); break;                                                                         \
    case 16: F(16); break

/* dot_tile and axpy_tile of a format from its dot, dot4 and axpy_rows:
 * query by query (the bits are theirs by construction; the SIMD variants
 * replace the ones that pay). */
#define GENERIC_TILES(pfx, sfx, dotf, dot4f, axpyf)                                                \
    static void pfx##_dot_tile_##sfx(const float *q, size_t nq, const void *const *k, size_t nk,   \
                                     size_t n, float *out, size_t ostride) {                       \
        for (size_t i = 0; i < nq; i++, q += n, out += ostride) {                                  \
            size_t j = 0;                                                                          \
            for (; j + 4 <= nk; j += 4) dot4f(q, k + j, n, out + j);                               \
            for (; j < nk; j++) out[j] = dotf(q, k[j], n);                                         \
        }                                                                                          \
    }                                                                                              \
    static void pfx##_axpy_tile_##sfx(float *const *acc, const float *const *w, size_t nq,         \
                                      const void *const *v, size_t nk, size_t n) {                 \
        for (size_t i = 0; i < nq; i++) axpyf(acc[i], w[i], v, nk, n);                             \
    }

/* A variant's dot_tile and axpy_tile of the four quantized formats, from
 * its pfx##_dot_tile_q and pfx##_axpy_tile_q (ATTR its target, or none). */
#define Q_TILE_PAIR(ATTR, pfx, fmt, sfx)                                                           \
    ATTR static void pfx##_dot_tile_##sfx(const float *q, size_t nq, const void *const *k,         \
                                          size_t nk, size_t n, float *out, size_t ostride) {       \
        pfx##_dot_tile_q(fmt, q, nq, k, nk, n, out, ostride);                                      \
    }                                                                                              \
    ATTR static void pfx##_axpy_tile_##sfx(float *const *acc, const float *const *w, size_t nq,    \
                                           const void *const *v, size_t nk, size_t n) {            \
        pfx##_axpy_tile_q(fmt, acc, w, nq, v, nk, n);                                              \
    }
#define Q_TILES(ATTR, pfx)                                                                         \
    Q_TILE_PAIR(ATTR, pfx, KV_FMT_Q8_0, q8_0)                                                      \
    Q_TILE_PAIR(ATTR, pfx, KV_FMT_Q4_0, q4_0)                                                      \
    Q_TILE_PAIR(ATTR, pfx, KV_FMT_Q5_0, q5_0)                                                      \
    Q_TILE_PAIR(ATTR, pfx, KV_FMT_Q3_0, q3_0)                                                      \
    Q_TILE_PAIR(ATTR, pfx, KV_FMT_C4, c4)

GENERIC_TILES(ref, f16, ref_kv_dot_f16, ref_kv_dot4_f16, ref_kv_axpy_rows_f16)
GENERIC_TILES(ref, q8_0, ref_dot_q8_0, ref_dot4_q8_0, ref_axpy_rows_q8_0)
GENERIC_TILES(ref, q4_0, ref_dot_q4_0, ref_dot4_q4_0, ref_axpy_rows_q4_0)
GENERIC_TILES(ref, q5_0, ref_dot_q5_0, ref_dot4_q5_0, ref_axpy_rows_q5_0)
GENERIC_TILES(ref, q3_0, ref_dot_q3_0, ref_dot4_q3_0, ref_axpy_rows_q3_0)
GENERIC_TILES(ref, c4, ref_dot_c4, ref_dot4_c4, ref_axpy_rows_c4)

/* sum[i] += s[i][p] for p < common, each query's sum in index order, the
 * G sums side by side. */
static inline __attribute__((always_inline)) void softmax_sums(float *const *s, int32_t common,
                                                               const int G, double *sum) {
    double a[8];
    const float *r[8];
#pragma GCC unroll 8
    for (int i = 0; i < G; i++) a[i] = sum[i], r[i] = s[i];
    for (int32_t p = 0; p < common; p++)
#pragma GCC unroll 8
        for (int i = 0; i < G; i++) a[i] += r[i][p];
#pragma GCC unroll 8
    for (int i = 0; i < G; i++) sum[i] = a[i];
}

/* The softmax of attn_kernels, with a variant's exp (expn: x[i] =
 * xm_expf(x[i] - mx), bit for bit), max (scale_max: x[i] *= scale, and the
 * largest x[i], -inf when none is larger) and f16 rounding. The double sums
 * run for up to eight queries at once, each in its own index order, so
 * their additions overlap. */
static inline __attribute__((always_inline)) void
softmax_with(float *const *s, const int32_t *n, size_t nq, float scale, float softcap,
             float (*scale_max)(float *x, size_t n, float scale),
             void (*expn)(float *x, size_t n, float mx),
             void (*round_f16)(float *out, const float *x, float s, size_t n)) {
    for (size_t i = 0; i < nq; i++) {
        float *x = s[i], mx = -INFINITY;
        if (softcap > 0) {
            for (int32_t p = 0; p < n[i]; p++) {
                const float v = softcap * xm_tanhf(x[p] * scale / softcap);
                x[p] = v;
                if (v > mx) mx = v;
            }
        } else {
            mx = scale_max(x, (size_t)n[i], scale);
        }
        expn(x, (size_t)n[i], mx);
    }
    for (size_t i0 = 0; i0 < nq; i0 += 8) {
        const size_t g = nq - i0 < 8 ? nq - i0 : 8;
        double sum[8] = {0};
        int32_t common = n[i0];
        for (size_t i = 1; i < g; i++)
            if (n[i0 + i] < common) common = n[i0 + i];
        switch (g) { /* a count known here, so the sums stay in registers */
#define SOFTMAX_SUMS(G)                                                                            \
    case G: softmax_sums(s + i0, common, G, sum); break;
            SOFTMAX_SUMS(1)
            SOFTMAX_SUMS(2)
            SOFTMAX_SUMS(3)
            SOFTMAX_SUMS(4)
            SOFTMAX_SUMS(5)
            SOFTMAX_SUMS(6)
            SOFTMAX_SUMS(7)
            SOFTMAX_SUMS(8)
#undef SOFTMAX_SUMS
        }
        for (size_t i = 0; i < g; i++) {
            for (int32_t p = common; p < n[i0 + i]; p++) sum[i] += s[i0 + i][p];
            round_f16(s[i0 + i], s[i0 + i], (float)(1.0 / sum[i]), (size_t)n[i0 + i]);
        }
    }
}

static float ref_scale_max(float *x, size_t n, float scale) {
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        x[i] *= scale;
        if (x[i] > mx) mx = x[i];
    }
    return mx;
}

static void ref_expn(float *x, size_t n, float mx) {
    for (size_t i = 0; i < n; i++) x[i] = xm_expf(x[i] - mx);
}

static void ref_softmax(float *const *s, const int32_t *n, size_t nq, float scale, float softcap) {
    softmax_with(s, n, nq, scale, softcap, ref_scale_max, ref_expn, ref_scale_round_f16);
}

/* GELU through its f16 table, times u (see attn_kernels.gelu_mul). */
static void ref_gelu_mul(float *g, const float *u, const uint16_t *table, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float x = g[i];
        const float r = x <= -10.0f ? 0.0f : x >= 10.0f ? x : fp16_to_fp32(table[fp32_to_fp16(x)]);
        g[i] = r * u[i];
    }
}

/* SiLU through xm_expf, times u (see attn_kernels.silu_mul). */
static void ref_silu_mul(float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + xm_expf(-g[i])) * u[i];
}

#define KV_OPS_F16(pfx)                                                                            \
    {                                                                                              \
        pfx##_kv_dot_f16, pfx##_kv_dot4_f16, pfx##_kv_axpy_rows_f16, pfx##_store_f16,              \
            pfx##_dot_tile_f16, pfx##_axpy_tile_f16                                                \
    }
#define KV_OPS_Q8_0(pfx)                                                                           \
    {                                                                                              \
        pfx##_dot_q8_0, pfx##_dot4_q8_0, pfx##_axpy_rows_q8_0, store_q8_0, pfx##_dot_tile_q8_0,    \
            pfx##_axpy_tile_q8_0                                                                   \
    }
#define KV_OPS_Q4_0(pfx)                                                                           \
    {                                                                                              \
        pfx##_dot_q4_0, pfx##_dot4_q4_0, pfx##_axpy_rows_q4_0, store_q4_0, pfx##_dot_tile_q4_0,    \
            pfx##_axpy_tile_q4_0                                                                   \
    }
#define KV_OPS_Q5_0(pfx)                                                                           \
    {                                                                                              \
        pfx##_dot_q5_0, pfx##_dot4_q5_0, pfx##_axpy_rows_q5_0, store_q5_0, pfx##_dot_tile_q5_0,    \
            pfx##_axpy_tile_q5_0                                                                   \
    }
#define KV_OPS_Q3_0(pfx)                                                                           \
    {                                                                                              \
        pfx##_dot_q3_0, pfx##_dot4_q3_0, pfx##_axpy_rows_q3_0, store_q3_0, pfx##_dot_tile_q3_0,    \
            pfx##_axpy_tile_q3_0                                                                   \
    }
#define KV_OPS_C4(pfx)                                                                             \
    {                                                                                              \
        pfx##_dot_c4, pfx##_dot4_c4, pfx##_axpy_rows_c4, store_c4, pfx##_dot_tile_c4,              \
            pfx##_axpy_tile_c4                                                                     \
    }

static void ref_kc4_fold(const float *q, size_t nq, const float *step, const float *centre,
                         size_t n, float *qs, float *base) {
    for (size_t i = 0; i < nq; i++) base[i] = attn_kc4_fold(q + i * n, step, centre, n, qs + i * n);
}

/* A quantized format's row kernels of one variant and tiles of another. */
#define KV_OPS_Q_TILES(pfx, tpfx, sfx)                                                             \
    {                                                                                              \
        pfx##_dot_##sfx, pfx##_dot4_##sfx, pfx##_axpy_rows_##sfx, store_##sfx,                     \
            tpfx##_dot_tile_##sfx, tpfx##_axpy_tile_##sfx                                          \
    }

static const attn_kernels ref_kernels = {
    .dot_f16 = ref_dot_f16,
    .axpy_f16 = ref_axpy_f16,
    .scale = ref_scale,
    .dot4_f16 = ref_dot4_f16,
    .axpy_rows_f16 = ref_axpy_rows_f16,
    .scale_round_f16 = ref_scale_round_f16,
    .softmax = ref_softmax,
    .gelu_mul = ref_gelu_mul,
    .silu_mul = ref_silu_mul,
    .kc4_fold = ref_kc4_fold,
    .kc4_channels = attn_kc4_channels,
    .kv = {KV_OPS_F16(ref), KV_OPS_Q8_0(ref), KV_OPS_Q4_0(ref), KV_OPS_Q5_0(ref), KV_OPS_Q3_0(ref),
           KV_OPS_C4(ref)},
};

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2_ATTR __attribute__((target("avx2,fma,f16c")))

/* The end of a dot: the tail elements into lane 0, then the lanes summed
 * in the reference's order. */
AVX2_ATTR static inline float dot_finish(__m256 acc, const float *q, const uint16_t *k, size_t i,
                                         size_t n) {
    if (i == n) { /* no tail: the same sums in registers */
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        s = _mm_add_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
        return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(s, s)));
    }
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (; i < n; i++) lane[0] = __builtin_fmaf(q[i], fp16_to_fp32(k[i]), lane[0]);
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
           ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

/* store_f16 through F16C, eight at a time: its rounding (to nearest, ties
 * to even, subnormals kept) is the scalar conversion's; eight holding a
 * NaN go through the scalar one, which keeps the payload as it is. */
AVX2_ATTR static void avx2_store_f16(void *dst, const float *x, size_t n) {
    uint16_t *d = dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            for (size_t j = i; j < i + 8; j++) d[j] = fp32_to_fp16(x[j]);
            continue;
        }
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; i++) d[i] = fp32_to_fp16(x[i]);
}
#define avx512_store_f16 avx2_store_f16

AVX2_ATTR static float avx2_dot_f16(const float *q, const uint16_t *k, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, acc);
    }
    return dot_finish(acc, q, k, i, n);
}

AVX2_ATTR static void avx2_dot4_f16(const float *q, const uint16_t *const k[4], size_t n,
                                    float out[4]) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 4; j++) {
            __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[j] + i)));
            acc[j] = _mm256_fmadd_ps(qv, kv, acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) out[j] = dot_finish(acc[j], q, k[j], i, n);
}

AVX2_ATTR static void avx2_axpy_f16(float *acc, float w, const uint16_t *v, size_t n) {
    __m256 wv = _mm256_set1_ps(w);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, vv, _mm256_loadu_ps(acc + i)));
    }
    for (; i < n; i++) acc[i] = __builtin_fmaf(w, fp16_to_fp32(v[i]), acc[i]);
}

/* axpy over many rows with 64 columns of acc in registers at a time; the
 * same fused multiply-add per element and row, in row order, as
 * avx2_axpy_f16. */
AVX2_ATTR static void avx2_axpy_rows_f16(float *acc, const float *w, const uint16_t *const *v,
                                         size_t nk, size_t n) {
    size_t c = 0;
    for (; c + 64 <= n; c += 64) {
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_loadu_ps(acc + c + 8 * u);
        for (size_t j = 0; j < nk; j++) {
            const __m256 wv = _mm256_set1_ps(w[j]);
            const uint16_t *vr = v[j] + c;
            for (int u = 0; u < 8; u++) {
                const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8 * u)));
                a[u] = _mm256_fmadd_ps(wv, vv, a[u]);
            }
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(acc + c + 8 * u, a[u]);
    }
    if (c < n)
        for (size_t j = 0; j < nk; j++) avx2_axpy_f16(acc + c, w[j], v[j] + c, n - c);
}

AVX2_ATTR static void avx2_scale(float *acc, float s, size_t n) {
    __m256 sv = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), sv));
    for (; i < n; i++) acc[i] *= s;
}

/* F16C rounds to nearest even, as fp32_to_fp16 does. */
AVX2_ATTR static void avx2_scale_round_f16(float *out, const float *x, float s, size_t n) {
    const __m256 sv = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)));
    }
    for (; i < n; i++) out[i] = fp16_to_fp32(fp32_to_fp16(x[i] * s));
}

KV_F16_WRAPPERS(avx2)

/* The 32 codes of block ib of a quantized row as signed bytes, elements
 * 0..15 in lo and 16..31 in hi (exact integers, the reference's values);
 * returns the scale. */
AVX2_ATTR static inline __attribute__((always_inline)) float
avx2_block_i8(kv_format f, const void *row, size_t ib, __m128i *lo, __m128i *hi) {
    if (f == KV_FMT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + ib;
        *lo = _mm_loadu_si128((const __m128i *)b->qs);
        *hi = _mm_loadu_si128((const __m128i *)(b->qs + 16));
        return fp16_to_fp32(b->d);
    }
    const __m128i m15 = _mm_set1_epi8(15);
    if (f == KV_FMT_Q4_0 || f == KV_FMT_C4) {
        const bool c4 = f == KV_FMT_C4;
        const uint8_t *qs =
            c4 ? (const uint8_t *)row + 16 * ib : ((const block_q4_0 *)row + ib)->qs;
        const __m128i raw = _mm_loadu_si128((const __m128i *)qs), eight = _mm_set1_epi8(8);
        *lo = _mm_sub_epi8(_mm_and_si128(raw, m15), eight);
        *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m15), eight);
        return c4 ? 1.0f : fp16_to_fp32(((const block_q4_0 *)row + ib)->d);
    }
    /* Q5_0 and the 3-bit rows: bit j of qh is element j's top bit. Byte j
     * of set_lo (set_hi) is all ones where element j (j + 16) has it:
     * byte j / 8 of qh, picked by sel_lo (sel_hi), tested against bit
     * j % 8. */
    uint32_t qh;
    memcpy(&qh,
           f == KV_FMT_Q5_0 ? ((const block_q5_0 *)row + ib)->qh
                            : ((const block_q3_0 *)row + ib)->qh,
           4); /* little-endian, as the formats */
    const __m128i bit = _mm_set1_epi64x((long long)0x8040201008040201ull),
                  h = _mm_set1_epi32((int)qh);
    const __m128i sel_lo = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i sel_hi = _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m128i set_lo = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(h, sel_lo), bit), bit);
    const __m128i set_hi = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(h, sel_hi), bit), bit);
    if (f == KV_FMT_Q5_0) {
        /* q5_0_codes: the nibbles as Q4_0's, plus 16 where the top bit is
         * set, minus 16. */
        const block_q5_0 *b = (const block_q5_0 *)row + ib;
        const __m128i raw = _mm_loadu_si128((const __m128i *)b->qs), s16 = _mm_set1_epi8(16);
        *lo = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(raw, m15), _mm_and_si128(set_lo, s16)), s16);
        *hi = _mm_sub_epi8(
            _mm_or_si128(_mm_and_si128(_mm_srli_epi16(raw, 4), m15), _mm_and_si128(set_hi, s16)),
            s16);
        return fp16_to_fp32(b->d);
    }
    /* q3_0_codes: element j's low two bits are bits 2 (j / 8) of qs[j % 8]
     * (shifts of the eight bytes as one word: the bits that cross into a
     * byte are masked off), plus 4 where the top bit is set, minus 4. */
    const block_q3_0 *b = (const block_q3_0 *)row + ib;
    uint64_t qs;
    memcpy(&qs, b->qs, 8);
    const __m128i x = _mm_set1_epi64x((long long)qs), m3 = _mm_set1_epi8(3), s4 = _mm_set1_epi8(4);
    const __m128i l2 = _mm_and_si128(_mm_srlv_epi64(x, _mm_set_epi64x(2, 0)), m3);
    const __m128i h2 = _mm_and_si128(_mm_srlv_epi64(x, _mm_set_epi64x(6, 4)), m3);
    *lo = _mm_sub_epi8(_mm_or_si128(l2, _mm_and_si128(set_lo, s4)), s4);
    *hi = _mm_sub_epi8(_mm_or_si128(h2, _mm_and_si128(set_hi, s4)), s4);
    return fp16_to_fp32(b->d);
}

/* The 32 codes of block ib of a quantized row as four vectors of 8
 * floats (elements 0..7, 8..15, 16..23, 24..31); returns the scale. */
AVX2_ATTR static inline __attribute__((always_inline)) float
avx2_block_codes(kv_format f, const void *row, size_t ib, __m256 c[4]) {
    __m128i lo, hi;
    const float d = avx2_block_i8(f, row, ib, &lo, &hi);
    c[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    c[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    c[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    c[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    return d;
}

/* The eight lanes summed in the reference's order. */
AVX2_ATTR static inline float avx2_lanes_sum(__m256 acc) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_shuffle_ps(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(s, s)));
}

/* ref_dot_q's operations, lane for lane. */
AVX2_ATTR static inline __attribute__((always_inline)) float avx2_dot_q(kv_format f, const float *q,
                                                                        const void *k, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / 32; ib++, q += 32) {
        __m256 c[4], part = _mm256_setzero_ps();
        const float d = avx2_block_codes(f, k, ib, c);
        for (int u = 0; u < 4; u++) part = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * u), c[u], part);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), part, acc);
    }
    return avx2_lanes_sum(acc);
}

/* Four keys, the query loaded once per block. */
AVX2_ATTR static inline __attribute__((always_inline)) void
avx2_dot4_q(kv_format f, const float *q, const void *const k[4], size_t n, float out[4]) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (size_t ib = 0; ib < n / 32; ib++, q += 32) {
        const __m256 qv[4] = {_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8), _mm256_loadu_ps(q + 16),
                              _mm256_loadu_ps(q + 24)};
        for (int j = 0; j < 4; j++) {
            __m256 c[4], part = _mm256_setzero_ps();
            const float d = avx2_block_codes(f, k[j], ib, c);
            for (int u = 0; u < 4; u++) part = _mm256_fmadd_ps(qv[u], c[u], part);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d), part, acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) out[j] = avx2_lanes_sum(acc[j]);
}

/* ref_axpy_rows_q's fused multiply-adds, with a block's 32 columns of acc
 * in registers across the rows. */
AVX2_ATTR static inline __attribute__((always_inline)) void
avx2_axpy_rows_q(kv_format f, float *acc, const float *w, const void *const *v, size_t nk,
                 size_t n) {
    for (size_t ib = 0; ib < n / 32; ib++) {
        float *ac = acc + 32 * ib;
        __m256 a[4];
        for (int u = 0; u < 4; u++) a[u] = _mm256_loadu_ps(ac + 8 * u);
        for (size_t j = 0; j < nk; j++) {
            __m256 c[4];
            const __m256 wd = _mm256_set1_ps(w[j] * avx2_block_codes(f, v[j], ib, c));
            for (int u = 0; u < 4; u++) a[u] = _mm256_fmadd_ps(wd, c[u], a[u]);
        }
        for (int u = 0; u < 4; u++) _mm256_storeu_ps(ac + 8 * u, a[u]);
    }
}

#define AVX2_Q_KERNELS(fmt, sfx)                                                                   \
    AVX2_ATTR static float avx2_dot_##sfx(const float *q, const void *k, size_t n) {               \
        return avx2_dot_q(fmt, q, k, n);                                                           \
    }                                                                                              \
    AVX2_ATTR static void avx2_dot4_##sfx(const float *q, const void *const k[4], size_t n,        \
                                          float out[4]) {                                          \
        avx2_dot4_q(fmt, q, k, n, out);                                                            \
    }                                                                                              \
    AVX2_ATTR static void avx2_axpy_rows_##sfx(float *acc, const float *w, const void *const *v,   \
                                               size_t nk, size_t n) {                              \
        avx2_axpy_rows_q(fmt, acc, w, v, nk, n);                                                   \
    }

AVX2_Q_KERNELS(KV_FMT_Q8_0, q8_0)
AVX2_Q_KERNELS(KV_FMT_Q4_0, q4_0)
AVX2_Q_KERNELS(KV_FMT_Q5_0, q5_0)
AVX2_Q_KERNELS(KV_FMT_Q3_0, q3_0)
AVX2_Q_KERNELS(KV_FMT_C4, c4)

/* dot_tile of a quantized format: each block of a key unpacked once for
 * all the queries, which then do avx2_dot_q's operations (a block's part
 * from zero, FMA'd into the query's lanes times the scale, the same sum
 * of lanes at the end), so every (query, key) gets dot's bits. */
AVX2_ATTR static inline __attribute__((always_inline)) void
avx2_dot_tile_q(kv_format f, const float *q, size_t nq, const void *const *k, size_t nk, size_t n,
                float *out, size_t ostride) {
    enum { MAXQ = 16 };
    for (size_t i0 = 0; i0 < nq; i0 += MAXQ) {
        const size_t m = nq - i0 < MAXQ ? nq - i0 : MAXQ;
        for (size_t j = 0; j < nk; j++) {
            __m256 acc[MAXQ];
            for (size_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
            for (size_t ib = 0; ib < n / 32; ib++) {
                __m256 c[4];
                const __m256 d = _mm256_set1_ps(avx2_block_codes(f, k[j], ib, c));
                for (size_t i = 0; i < m; i++) {
                    const float *qi = q + (i0 + i) * n + 32 * ib;
                    __m256 part = _mm256_setzero_ps();
                    for (int u = 0; u < 4; u++)
                        part = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 8 * u), c[u], part);
                    acc[i] = _mm256_fmadd_ps(d, part, acc[i]);
                }
            }
            for (size_t i = 0; i < m; i++) out[(i0 + i) * ostride + j] = avx2_lanes_sum(acc[i]);
        }
    }
}

/* axpy_tile of a quantized format: each block of a value row unpacked once
 * for all the queries; each query's accumulator gets avx2_axpy_rows_q's
 * FMAs (w times the scale, times the codes) row after row, so its bits. */
AVX2_ATTR static inline __attribute__((always_inline)) void
avx2_axpy_tile_q(kv_format f, float *const *acc, const float *const *w, size_t nq,
                 const void *const *v, size_t nk, size_t n) {
    for (size_t j = 0; j < nk; j++)
        for (size_t ib = 0; ib < n / 32; ib++) {
            __m256 c[4];
            const float d = avx2_block_codes(f, v[j], ib, c);
            for (size_t i = 0; i < nq; i++) {
                float *ac = acc[i] + 32 * ib;
                const __m256 wd = _mm256_set1_ps(w[i][j] * d);
                for (int u = 0; u < 4; u++)
                    _mm256_storeu_ps(ac + 8 * u,
                                     _mm256_fmadd_ps(wd, c[u], _mm256_loadu_ps(ac + 8 * u)));
            }
        }
}

Q_TILES(AVX2_ATTR, avx2)

/* f16 keys for several queries: avx2_dot_f16's lanes per (query, key), two
 * keys and up to six queries at a time (twelve independent sums in
 * registers), each key converted once per group of queries. n a multiple
 * of 8, else query by query. */
AVX2_ATTR static inline __attribute__((always_inline)) void
avx2_dot_group_f16(const float *q, size_t n, const uint16_t *k0, const uint16_t *k1, float *out,
                   size_t ostride, const int G) {
    __m256 a0[6], a1[6];
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) a0[i] = a1[i] = _mm256_setzero_ps();
    for (size_t e = 0; e < n; e += 8) {
        const __m256 c0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k0 + e)));
        const __m256 c1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k1 + e)));
#pragma GCC unroll 16
        for (int i = 0; i < G; i++) {
            const __m256 qv = _mm256_loadu_ps(q + (size_t)i * n + e);
            a0[i] = _mm256_fmadd_ps(qv, c0, a0[i]);
            a1[i] = _mm256_fmadd_ps(qv, c1, a1[i]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) {
        out[(size_t)i * ostride] = avx2_lanes_sum(a0[i]);
        out[(size_t)i * ostride + 1] = avx2_lanes_sum(a1[i]);
    }
}

AVX2_ATTR static void avx2_dot_tile_f16(const float *q, size_t nq, const void *const *k, size_t nk,
                                        size_t n, float *out, size_t ostride) {
    size_t j = 0;
    if (n % 8 == 0)
        for (; j + 2 <= nk; j += 2)
            for (size_t i0 = 0; i0 < nq; i0 += 6) {
                const float *qi = q + i0 * n;
                float *o = out + i0 * ostride + j;
#define AVX2_DOT_G(G) avx2_dot_group_f16(qi, n, k[j], k[j + 1], o, ostride, G)
                switch (nq - i0 < 6 ? nq - i0 : 6) {
                    TILE_CASES4(AVX2_DOT_G);
                case 5: AVX2_DOT_G(5); break;
                case 6: AVX2_DOT_G(6); break;
                }
#undef AVX2_DOT_G
            }
    for (; j < nk; j++)
        for (size_t i = 0; i < nq; i++) out[i * ostride + j] = avx2_dot_f16(q + i * n, k[j], n);
}

/* f16 value rows for several queries: 8 columns of up to twelve queries'
 * accumulators in registers, each row converted once per group: the fused
 * multiply-adds of avx2_axpy_f16, row after row. n a multiple of 8, else
 * query by query. */
AVX2_ATTR static inline __attribute__((always_inline)) void
avx2_axpy_group_f16(float *const *acc, const float *const *w, const void *const *v, size_t nk,
                    size_t c, const int G) {
    __m256 a[12];
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) a[i] = _mm256_loadu_ps(acc[i] + c);
    for (size_t j = 0; j < nk; j++) {
        const __m256 vv =
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)v[j] + c)));
#pragma GCC unroll 16
        for (int i = 0; i < G; i++) a[i] = _mm256_fmadd_ps(_mm256_set1_ps(w[i][j]), vv, a[i]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) _mm256_storeu_ps(acc[i] + c, a[i]);
}

AVX2_ATTR static void avx2_axpy_tile_f16(float *const *acc, const float *const *w, size_t nq,
                                         const void *const *v, size_t nk, size_t n) {
    if (n % 8) {
        for (size_t i = 0; i < nq; i++)
            for (size_t j = 0; j < nk; j++) avx2_axpy_f16(acc[i], w[i][j], v[j], n);
        return;
    }
    for (size_t i0 = 0; i0 < nq; i0 += 12)
        for (size_t c = 0; c < n; c += 8) {
#define AVX2_AXPY_G(G) avx2_axpy_group_f16(acc + i0, w + i0, v, nk, c, G)
            switch (nq - i0 < 12 ? nq - i0 : 12) { TILE_CASES12(AVX2_AXPY_G); }
#undef AVX2_AXPY_G
        }
}

/* x *= scale and the largest x (MAXPS keeps its second operand when the
 * first is NaN or both are zeros, as `if (x > mx) mx = x` does). */
AVX2_ATTR static float avx2_scale_max(float *x, size_t n, float scale) {
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 m = _mm256_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        _mm256_storeu_ps(x + i, v);
        m = _mm256_max_ps(v, m);
    }
    float l[8], mx = -INFINITY;
    _mm256_storeu_ps(l, m);
    for (int j = 0; j < 8; j++)
        if (l[j] > mx) mx = l[j];
    for (; i < n; i++) {
        x[i] *= scale;
        if (x[i] > mx) mx = x[i];
    }
    return mx;
}

/* xm_expf of four floats, in xmath.h's operations on four doubles. */
AVX2_ATTR static inline __m128 avx2_exp4(__m128 xf) {
    const __m256d x = _mm256_cvtps_pd(xf), shifter = _mm256_set1_pd(0x1.8p52);
    const __m256d kd = _mm256_sub_pd(
        _mm256_add_pd(_mm256_mul_pd(x, _mm256_set1_pd(32.0 * XM_INV_LN2)), shifter), shifter);
    const __m256d r =
        _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(kd, _mm256_set1_pd(XM_LN2_HI / 32.0))),
                      _mm256_mul_pd(kd, _mm256_set1_pd(XM_LN2_LO / 32.0)));
    __m256d p = _mm256_mul_pd(r, _mm256_set1_pd(1.0 / 120.0));
    p = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(1.0 / 24.0), p));
    p = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(1.0 / 6.0), p));
    p = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(1.0 / 2.0), p));
    p = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(1.0), p));
    p = _mm256_add_pd(_mm256_set1_pd(1.0), p);
    /* |kd| < 2^13 in range: int32 holds k exactly. */
    const __m128i k = _mm256_cvttpd_epi32(kd), j = _mm_and_si128(k, _mm_set1_epi32(31));
    const __m128i m = _mm_srai_epi32(_mm_sub_epi32(k, j), 5);
    const __m256d t = _mm256_i32gather_pd(xm_exp2_j32, j, 8);
    const __m256i tb =
        _mm256_add_epi64(_mm256_castpd_si256(t), _mm256_slli_epi64(_mm256_cvtepi32_epi64(m), 52));
    __m128 e = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_castsi256_pd(tb), p));
    e = _mm_and_ps(e, _mm_cmp_ps(xf, _mm_set1_ps(-104.0f), _CMP_GT_OQ));
    e = _mm_blendv_ps(e, _mm_set1_ps(INFINITY),
                      _mm_cmp_ps(xf, _mm_set1_ps(XM_EXP_MAX), _CMP_GT_OQ));
    return _mm_blendv_ps(e, xf, _mm_cmp_ps(xf, xf, _CMP_UNORD_Q));
}

AVX2_ATTR static void avx2_expn(float *x, size_t n, float mx) {
    const __m128 mv = _mm_set1_ps(mx);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, avx2_exp4(_mm_sub_ps(_mm_loadu_ps(x + i), mv)));
    for (; i < n; i++) x[i] = xm_expf(x[i] - mx);
}

/* Four at a time: the same float operations around avx2_exp4. */
AVX2_ATTR static void avx2_silu_mul(float *g, const float *u, size_t n) {
    const __m128 one = _mm_set1_ps(1.0f), sign = _mm_set1_ps(-0.0f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128 x = _mm_loadu_ps(g + i);
        const __m128 d = _mm_add_ps(one, avx2_exp4(_mm_xor_ps(x, sign)));
        _mm_storeu_ps(g + i, _mm_mul_ps(_mm_div_ps(x, d), _mm_loadu_ps(u + i)));
    }
    ref_silu_mul(g + i, u + i, n - i);
}

AVX2_ATTR static void avx2_softmax(float *const *s, const int32_t *n, size_t nq, float scale,
                                   float softcap) {
    softmax_with(s, n, nq, scale, softcap, avx2_scale_max, avx2_expn, avx2_scale_round_f16);
}

/* Eight at a time: F16C's conversion (round to nearest even, as
 * fp32_to_fp16 on every non-NaN value), the entries gathered as 32-bit
 * words at 2-byte steps (the table's padding entry covers the last) and
 * their low halves converted back. */
AVX2_ATTR static void avx2_gelu_mul(float *g, const float *u, const uint16_t *table, size_t n) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256i idx = _mm256_cvtepu16_epi32(
            _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i t =
            _mm256_and_si256(_mm256_i32gather_epi32((const int *)table, idx, 2), low16);
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(t, t), 0x08);
        __m256 r = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
        r = _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
        r = _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
    }
    ref_gelu_mul(g + i, u + i, table, n - i);
}

/* attn_kc4_fold's lanes in one register for G queries (1 or 2) at once:
 * their chains of fused multiply-adds interleave, each step and centre
 * loaded once for them. */
AVX2_ATTR static inline __attribute__((always_inline)) void
avx2_kc4_fold_group(const float *q, const float *step, const float *centre, size_t n, float *qs,
                    float *base, const int G) {
    __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (size_t c = 0; c < n; c += 8) {
        const __m256 st = _mm256_loadu_ps(step + c), ce = _mm256_loadu_ps(centre + c);
        for (int i = 0; i < G; i++) {
            const __m256 x = _mm256_loadu_ps(q + (size_t)i * n + c);
            _mm256_storeu_ps(qs + (size_t)i * n + c, _mm256_mul_ps(x, st));
            a[i] = _mm256_fmadd_ps(x, ce, a[i]);
        }
    }
    for (int i = 0; i < G; i++) base[i] = avx2_lanes_sum(a[i]);
}

AVX2_ATTR static void avx2_kc4_fold(const float *q, size_t nq, const float *step,
                                    const float *centre, size_t n, float *qs, float *base) {
    size_t i = 0;
    for (; i + 2 <= nq; i += 2)
        avx2_kc4_fold_group(q + i * n, step, centre, n, qs + i * n, base + i, 2);
    if (i < nq) avx2_kc4_fold_group(q + i * n, step, centre, n, qs + i * n, base + i, 1);
}

/* attn_kc4_channels eight channels at a time: their step codes are the
 * four bytes from sc + c / 2 (a nibble each), their minimum codes the
 * three bytes from mc + 3 c / 8 (3 bits each); the same products and sum
 * as the scalar form (x / 16 and x * 0.0625 are the same float). */
AVX2_ATTR static void avx2_kc4_channels(const uint8_t *meta, size_t hd, float *step,
                                        float *centre) {
    uint16_t mh, dh;
    memcpy(&mh, meta, 2);
    memcpy(&dh, meta + 2, 2);
    const __m256 mref = _mm256_set1_ps(fp16_to_fp32(mh)), dref = _mm256_set1_ps(fp16_to_fp32(dh));
    const uint8_t *sc = meta + 4, *mc = sc + hd / 2;
    const __m256i s4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                  s3 = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    for (size_t c = 0; c < hd; c += 8) {
        uint32_t ws, wm = 0;
        memcpy(&ws, sc + c / 2, 4);
        memcpy(&wm, mc + 3 * c / 8, 3);
        const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)ws), s4),
                                           _mm256_set1_epi32(15));
        const __m256i m = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)wm), s3),
                                           _mm256_set1_epi32(7));
        const __m256 st = _mm256_mul_ps(
            _mm256_mul_ps(dref, _mm256_cvtepi32_ps(_mm256_add_epi32(s, _mm256_set1_epi32(1)))),
            _mm256_set1_ps(0.0625f));
        const __m256 mn =
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(m, _mm256_set1_epi32(4))), mref);
        _mm256_storeu_ps(step + c, st);
        _mm256_storeu_ps(centre + c, _mm256_add_ps(mn, _mm256_mul_ps(_mm256_set1_ps(8.0f), st)));
    }
}

static const attn_kernels avx2_kernels = {
    .dot_f16 = avx2_dot_f16,
    .axpy_f16 = avx2_axpy_f16,
    .scale = avx2_scale,
    .dot4_f16 = avx2_dot4_f16,
    .axpy_rows_f16 = avx2_axpy_rows_f16,
    .scale_round_f16 = avx2_scale_round_f16,
    .softmax = avx2_softmax,
    .gelu_mul = avx2_gelu_mul,
    .silu_mul = avx2_silu_mul,
    .kc4_fold = avx2_kc4_fold,
    .kc4_channels = avx2_kc4_channels,
    .kv = {KV_OPS_F16(avx2), KV_OPS_Q8_0(avx2), KV_OPS_Q4_0(avx2), KV_OPS_Q5_0(avx2),
           KV_OPS_Q3_0(avx2), KV_OPS_C4(avx2)},
};

/* AVX-512: the same lanes and order as above, two keys' 8-lane chunks in
 * one zmm (key a in the low 256 bits, key b in the high), so one VCVTPH2PS
 * converts 16 values and one FMA advances two keys; value rows go 16
 * columns per register. Each lane takes exactly the operations it takes in
 * the AVX2 kernels, so the bits are the same. */
#define AVX512_ATTR __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c")))

/* Halfs a[0..7] in the low 128 bits, b[0..7] in the high. */
AVX512_ATTR static inline __m256i avx512_load_f16_pair(const uint16_t *a, const uint16_t *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}

/* dot_finish's tree (no tail) for four keys at once, keys 0 and 1 in the
 * halves of a01, 2 and 3 in a23; key j goes to the 128-bit lane j: lanes
 * 0..3 plus 4..7, then (0+4)+(1+5) and (2+6)+(3+7), then their sum. */
AVX512_ATTR static inline void avx512_finish4(__m512 a01, __m512 a23, float out[4]) {
    const __m512 lo = _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)),
                 hi = _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(3, 1, 3, 1));
    __m512 s = _mm512_add_ps(lo, hi);
    s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(2, 3, 0, 1)));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(
                           _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s)));
}

AVX512_ATTR static void avx512_dot4_f16(const float *q, const uint16_t *const k[4], size_t n,
                                        float out[4]) {
    __m512 a01 = _mm512_setzero_ps(), a23 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + i));
        const __m512 k01 = _mm512_cvtph_ps(avx512_load_f16_pair(k[0] + i, k[1] + i));
        const __m512 k23 = _mm512_cvtph_ps(avx512_load_f16_pair(k[2] + i, k[3] + i));
        a01 = _mm512_fmadd_ps(qv, k01, a01);
        a23 = _mm512_fmadd_ps(qv, k23, a23);
    }
    if (i < n) {
        out[0] = dot_finish(_mm512_castps512_ps256(a01), q, k[0], i, n);
        out[1] = dot_finish(_mm512_extractf32x8_ps(a01, 1), q, k[1], i, n);
        out[2] = dot_finish(_mm512_castps512_ps256(a23), q, k[2], i, n);
        out[3] = dot_finish(_mm512_extractf32x8_ps(a23, 1), q, k[3], i, n);
        return;
    }
    avx512_finish4(a01, a23, out);
}

/* Columns c..c+16*U-1 of acc in U registers across all the rows. */
AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_axpy_cols(float *acc, const float *w, const uint16_t *const *v, size_t nk, size_t c, int U) {
    __m512 a[8];
    for (int u = 0; u < U; u++) a[u] = _mm512_loadu_ps(acc + c + 16 * u);
    for (size_t j = 0; j < nk; j++) {
        const __m512 wv = _mm512_set1_ps(w[j]);
        const uint16_t *vr = v[j] + c;
        for (int u = 0; u < U; u++) {
            const __m512 vv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * u)));
            a[u] = _mm512_fmadd_ps(wv, vv, a[u]);
        }
    }
    for (int u = 0; u < U; u++) _mm512_storeu_ps(acc + c + 16 * u, a[u]);
}

AVX512_ATTR static void avx512_axpy_rows_f16(float *acc, const float *w, const uint16_t *const *v,
                                             size_t nk, size_t n) {
    size_t c = 0;
    for (; c + 128 <= n; c += 128) avx512_axpy_cols(acc, w, v, nk, c, 8);
    if (c + 64 <= n) {
        avx512_axpy_cols(acc, w, v, nk, c, 4);
        c += 64;
    }
    for (; c + 16 <= n; c += 16) avx512_axpy_cols(acc, w, v, nk, c, 1);
    if (c < n)
        for (size_t j = 0; j < nk; j++) avx2_axpy_f16(acc + c, w[j], v[j] + c, n - c);
}

/* VCVTPS2PH rounds to nearest even, as fp32_to_fp16 does. */
AVX512_ATTR static void avx512_scale_round_f16(float *out, const float *x, float s, size_t n) {
    const __m512 sv = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), sv);
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)));
    }
    if (i < n) { /* the rest under a mask */
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv);
        _mm512_mask_storeu_ps(out + i, k,
                              _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)));
    }
}

AVX512_ATTR static float avx512_dot_f16(const float *q, const uint16_t *k, size_t n) {
    return avx2_dot_f16(q, k, n);
}

KV_F16_WRAPPERS(avx512)

/* f16 keys for several queries: avx512_dot4_f16's registers (two keys per
 * zmm) for four keys and up to eight queries at a time, sixteen independent
 * sums in registers, each key converted once per group of queries. n a
 * multiple of 8, else the AVX2 kernel. */
AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_dot_group_f16(const float *q, size_t n, const void *const *k, float *out, size_t ostride,
                     const int G) {
    const uint16_t *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    __m512 a01[8], a23[8];
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) a01[i] = a23[i] = _mm512_setzero_ps();
    for (size_t e = 0; e < n; e += 8) {
        const __m512 c01 = _mm512_cvtph_ps(avx512_load_f16_pair(k0 + e, k1 + e));
        const __m512 c23 = _mm512_cvtph_ps(avx512_load_f16_pair(k2 + e, k3 + e));
#pragma GCC unroll 16
        for (int i = 0; i < G; i++) {
            const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + (size_t)i * n + e));
            a01[i] = _mm512_fmadd_ps(qv, c01, a01[i]);
            a23[i] = _mm512_fmadd_ps(qv, c23, a23[i]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) avx512_finish4(a01[i], a23[i], out + (size_t)i * ostride);
}

AVX512_ATTR static void avx512_dot_tile_f16(const float *q, size_t nq, const void *const *k,
                                            size_t nk, size_t n, float *out, size_t ostride) {
    if (n % 8) {
        avx2_dot_tile_f16(q, nq, k, nk, n, out, ostride);
        return;
    }
    size_t j = 0;
    for (; j + 4 <= nk; j += 4)
        for (size_t i0 = 0; i0 < nq; i0 += 8) {
            const float *qi = q + i0 * n;
            float *o = out + i0 * ostride + j;
#define AVX512_DOT_G(G) avx512_dot_group_f16(qi, n, k + j, o, ostride, G)
            switch (nq - i0 < 8 ? nq - i0 : 8) { TILE_CASES8(AVX512_DOT_G); }
#undef AVX512_DOT_G
        }
    if (j < nk) avx2_dot_tile_f16(q, nq, k + j, nk - j, n, out + j, ostride);
}

/* f16 value rows for several queries: U groups of 16 columns of up to
 * sixteen queries' accumulators in registers (G * U <= 16), each row
 * converted once per group: the fused multiply-adds of avx512_axpy_cols,
 * row after row. With few queries (decoding: one row's heads of a KV
 * group) several column groups at once give the chains of dependent
 * multiply-adds company; each accumulator's order is the same. n a
 * multiple of 16, else the AVX2 kernel. */
AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_axpy_group_f16(float *const *acc, const float *const *w, const void *const *v, size_t nk,
                      size_t c, const int G, const int U) {
    __m512 a[16];
#pragma GCC unroll 16
    for (int i = 0; i < G; i++)
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) a[i * U + u] = _mm512_loadu_ps(acc[i] + c + 16 * u);
    for (size_t j = 0; j < nk; j++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int u = 0; u < U; u++)
            vv[u] = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)((const uint16_t *)v[j] + c + 16 * u)));
#pragma GCC unroll 16
        for (int i = 0; i < G; i++) {
            const __m512 wi = _mm512_set1_ps(w[i][j]);
#pragma GCC unroll 4
            for (int u = 0; u < U; u++) a[i * U + u] = _mm512_fmadd_ps(wi, vv[u], a[i * U + u]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < G; i++)
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) _mm512_storeu_ps(acc[i] + c + 16 * u, a[i * U + u]);
}

AVX512_ATTR static void avx512_axpy_tile_f16(float *const *acc, const float *const *w, size_t nq,
                                             const void *const *v, size_t nk, size_t n) {
    if (n % 16) {
        avx2_axpy_tile_f16(acc, w, nq, v, nk, n);
        return;
    }
    if (nq <= 4 && n % 64 == 0) { /* four column groups at once */
        for (size_t c = 0; c < n; c += 64) {
#define AVX512_AXPY_G4(G) avx512_axpy_group_f16(acc, w, v, nk, c, G, 4)
            switch (nq) { TILE_CASES4(AVX512_AXPY_G4); }
#undef AVX512_AXPY_G4
        }
        return;
    }
    for (size_t i0 = 0; i0 < nq; i0 += 16)
        for (size_t c = 0; c < n; c += 16) {
#define AVX512_AXPY_G(G) avx512_axpy_group_f16(acc + i0, w + i0, v, nk, c, G, 1)
            switch (nq - i0 < 16 ? nq - i0 : 16) { TILE_CASES16(AVX512_AXPY_G); }
#undef AVX512_AXPY_G
        }
}

/* Block ib of two quantized keys as avx2_block_codes' four vectors, key a
 * in the low 256 bits and key b in the high ones, and the scales da | db
 * the same way. */
AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_block_codes_pair(kv_format f, const void *a, const void *b, size_t ib, __m512 c[4],
                        __m512 *d) {
    __m128i la, ha, lb, hb;
    const float da = avx2_block_i8(f, a, ib, &la, &ha), db = avx2_block_i8(f, b, ib, &lb, &hb);
    const __m128i e[4] = {_mm_unpacklo_epi64(la, lb), _mm_unpackhi_epi64(la, lb),
                          _mm_unpacklo_epi64(ha, hb), _mm_unpackhi_epi64(ha, hb)};
    for (int u = 0; u < 4; u++) c[u] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e[u]));
    *d = _mm512_insertf32x8(_mm512_set1_ps(da), _mm256_set1_ps(db), 1);
}

/* Quantized keys for several queries: avx2_dot_q's lanes per (query, key)
 * (a block's part from zero, FMA'd into the lanes times the scale), two
 * keys per zmm, four keys and up to eight queries at a time, each block
 * of a key unpacked once for the group; avx512_finish4 sums the lanes as
 * avx2_lanes_sum does. */
AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_dot_group_q(kv_format f, const float *q, size_t n, const void *const *k, float *out,
                   size_t ostride, const int G) {
    __m512 a01[8], a23[8];
#pragma GCC unroll 8
    for (int i = 0; i < G; i++) a01[i] = a23[i] = _mm512_setzero_ps();
    for (size_t ib = 0; ib < n / 32; ib++) {
        __m512 c01[4], c23[4], d01, d23;
        avx512_block_codes_pair(f, k[0], k[1], ib, c01, &d01);
        avx512_block_codes_pair(f, k[2], k[3], ib, c23, &d23);
#pragma GCC unroll 8
        for (int i = 0; i < G; i++) {
            const float *qi = q + (size_t)i * n + 32 * ib;
            __m512 p01 = _mm512_setzero_ps(), p23 = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(qi + 8 * u));
                p01 = _mm512_fmadd_ps(qv, c01[u], p01);
                p23 = _mm512_fmadd_ps(qv, c23[u], p23);
            }
            a01[i] = _mm512_fmadd_ps(d01, p01, a01[i]);
            a23[i] = _mm512_fmadd_ps(d23, p23, a23[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < G; i++) avx512_finish4(a01[i], a23[i], out + (size_t)i * ostride);
}

AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_dot_tile_q(kv_format f, const float *q, size_t nq, const void *const *k, size_t nk, size_t n,
                  float *out, size_t ostride) {
    size_t j = 0;
    for (; j + 4 <= nk; j += 4)
        for (size_t i0 = 0; i0 < nq; i0 += 8) {
            const float *qi = q + i0 * n;
            float *o = out + i0 * ostride + j;
#define AVX512_DOT_Q(G) avx512_dot_group_q(f, qi, n, k + j, o, ostride, G)
            switch (nq - i0 < 8 ? nq - i0 : 8) { TILE_CASES8(AVX512_DOT_Q); }
#undef AVX512_DOT_Q
        }
    if (j < nk) avx2_dot_tile_q(f, q, nq, k + j, nk - j, n, out + j, ostride);
}

/* Quantized value rows for several queries: NB blocks (32 columns each,
 * two zmm) of up to G queries' accumulators in registers across the
 * rows, each block of a row unpacked once for the group: avx2_axpy_tile_q's
 * FMAs (w times the scale, times the codes), row after row. */
AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_axpy_group_q(kv_format f, float *const *acc, const float *const *w, const void *const *v,
                    size_t nk, size_t ib0, const int G, const int NB) {
    __m512 a[16];
#pragma GCC unroll 8
    for (int i = 0; i < G; i++)
#pragma GCC unroll 4
        for (int u = 0; u < 2 * NB; u++)
            a[i * 2 * NB + u] = _mm512_loadu_ps(acc[i] + 32 * ib0 + 16 * u);
    for (size_t j = 0; j < nk; j++)
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++) {
            __m128i lo, hi;
            const float d = avx2_block_i8(f, v[j], ib0 + (size_t)b, &lo, &hi);
            const __m512 c0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)),
                         c1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
#pragma GCC unroll 8
            for (int i = 0; i < G; i++) {
                const __m512 wd = _mm512_set1_ps(w[i][j] * d);
                a[i * 2 * NB + 2 * b] = _mm512_fmadd_ps(wd, c0, a[i * 2 * NB + 2 * b]);
                a[i * 2 * NB + 2 * b + 1] = _mm512_fmadd_ps(wd, c1, a[i * 2 * NB + 2 * b + 1]);
            }
        }
#pragma GCC unroll 8
    for (int i = 0; i < G; i++)
#pragma GCC unroll 4
        for (int u = 0; u < 2 * NB; u++)
            _mm512_storeu_ps(acc[i] + 32 * ib0 + 16 * u, a[i * 2 * NB + u]);
}

AVX512_ATTR static inline __attribute__((always_inline)) void
avx512_axpy_tile_q(kv_format f, float *const *acc, const float *const *w, size_t nq,
                   const void *const *v, size_t nk, size_t n) {
    const size_t nb = n / 32;
    if (nq <= 4 && nb % 2 == 0) { /* decoding: two blocks at once */
        for (size_t ib = 0; ib < nb; ib += 2) {
#define AVX512_AXPY_Q2(G) avx512_axpy_group_q(f, acc, w, v, nk, ib, G, 2)
            switch (nq) { TILE_CASES4(AVX512_AXPY_Q2); }
#undef AVX512_AXPY_Q2
        }
        return;
    }
    for (size_t i0 = 0; i0 < nq; i0 += 8)
        for (size_t ib = 0; ib < nb; ib++) {
#define AVX512_AXPY_Q1(G) avx512_axpy_group_q(f, acc + i0, w + i0, v, nk, ib, G, 1)
            switch (nq - i0 < 8 ? nq - i0 : 8) { TILE_CASES8(AVX512_AXPY_Q1); }
#undef AVX512_AXPY_Q1
        }
}

Q_TILES(AVX512_ATTR, avx512)

AVX512_ATTR static float avx512_scale_max(float *x, size_t n, float scale) {
    const __m512 sv = _mm512_set1_ps(scale);
    __m512 m = _mm512_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), sv);
        _mm512_storeu_ps(x + i, v);
        m = _mm512_max_ps(v, m);
    }
    if (i < n) { /* the rest under a mask (the maximum of a set: any order) */
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv);
        _mm512_mask_storeu_ps(x + i, k, v);
        m = _mm512_mask_max_ps(m, k, v, m);
    }
    return _mm512_reduce_max_ps(m);
}

/* xm_expf of eight floats, in xmath.h's operations on eight doubles. */
AVX512_ATTR static inline __m256 avx512_exp8(__m256 xf) {
    const __m512d x = _mm512_cvtps_pd(xf), shifter = _mm512_set1_pd(0x1.8p52);
    const __m512d kd = _mm512_sub_pd(
        _mm512_add_pd(_mm512_mul_pd(x, _mm512_set1_pd(32.0 * XM_INV_LN2)), shifter), shifter);
    const __m512d r =
        _mm512_sub_pd(_mm512_sub_pd(x, _mm512_mul_pd(kd, _mm512_set1_pd(XM_LN2_HI / 32.0))),
                      _mm512_mul_pd(kd, _mm512_set1_pd(XM_LN2_LO / 32.0)));
    __m512d p = _mm512_mul_pd(r, _mm512_set1_pd(1.0 / 120.0));
    p = _mm512_mul_pd(r, _mm512_add_pd(_mm512_set1_pd(1.0 / 24.0), p));
    p = _mm512_mul_pd(r, _mm512_add_pd(_mm512_set1_pd(1.0 / 6.0), p));
    p = _mm512_mul_pd(r, _mm512_add_pd(_mm512_set1_pd(1.0 / 2.0), p));
    p = _mm512_mul_pd(r, _mm512_add_pd(_mm512_set1_pd(1.0), p));
    p = _mm512_add_pd(_mm512_set1_pd(1.0), p);
    const __m512i k = _mm512_cvttpd_epi64(kd), j = _mm512_and_si512(k, _mm512_set1_epi64(31));
    const __m512i m = _mm512_srai_epi64(_mm512_sub_epi64(k, j), 5);
    /* The table in four registers: entries j & 15 of the first or the
     * second half, picked by bit 4 of j. */
    const __m512d t0 = _mm512_loadu_pd(xm_exp2_j32), t1 = _mm512_loadu_pd(xm_exp2_j32 + 8),
                  t2 = _mm512_loadu_pd(xm_exp2_j32 + 16), t3 = _mm512_loadu_pd(xm_exp2_j32 + 24);
    const __m512d t =
        _mm512_mask_blend_pd(_mm512_test_epi64_mask(j, _mm512_set1_epi64(16)),
                             _mm512_permutex2var_pd(t0, j, t1), _mm512_permutex2var_pd(t2, j, t3));
    const __m512i tb = _mm512_add_epi64(_mm512_castpd_si512(t), _mm512_slli_epi64(m, 52));
    __m256 e = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_castsi512_pd(tb), p));
    e = _mm256_maskz_mov_ps(_mm256_cmp_ps_mask(xf, _mm256_set1_ps(-104.0f), _CMP_GT_OQ), e);
    e = _mm256_mask_mov_ps(e, _mm256_cmp_ps_mask(xf, _mm256_set1_ps(XM_EXP_MAX), _CMP_GT_OQ),
                           _mm256_set1_ps(INFINITY));
    return _mm256_mask_mov_ps(e, _mm256_cmp_ps_mask(xf, xf, _CMP_UNORD_Q), xf);
}

AVX512_ATTR static void avx512_expn(float *x, size_t n, float mx) {
    const __m256 mv = _mm256_set1_ps(mx);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, avx512_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
    if (i < n) { /* the rest under a mask: each lane is xm_expf of its own */
        const __mmask8 k = (__mmask8)((1u << (n - i)) - 1);
        _mm256_mask_storeu_ps(x + i, k,
                              avx512_exp8(_mm256_sub_ps(_mm256_maskz_loadu_ps(k, x + i), mv)));
    }
}

/* Eight at a time around avx512_exp8. */
AVX512_ATTR static void avx512_silu_mul(float *g, const float *u, size_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 d = _mm256_add_ps(one, avx512_exp8(_mm256_xor_ps(x, sign)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, d), _mm256_loadu_ps(u + i)));
    }
    avx2_silu_mul(g + i, u + i, n - i);
}

AVX512_ATTR static void avx512_softmax(float *const *s, const int32_t *n, size_t nq, float scale,
                                       float softcap) {
    softmax_with(s, n, nq, scale, softcap, avx512_scale_max, avx512_expn, avx512_scale_round_f16);
}

/* avx2_gelu_mul sixteen at a time. */
AVX512_ATTR static void avx512_gelu_mul(float *g, const float *u, const uint16_t *table, size_t n) {
    const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512i idx = _mm512_cvtepu16_epi32(
            _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m512i t = _mm512_i32gather_epi32(idx, (const void *)table, 2);
        __m512 r = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(t));
        r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), x);
        r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, lo, _CMP_LE_OQ), _mm512_setzero_ps());
        _mm512_storeu_ps(g + i, _mm512_mul_ps(r, _mm512_loadu_ps(u + i)));
    }
    avx2_gelu_mul(g + i, u + i, table, n - i);
}

static const attn_kernels avx512_kernels = {
    .dot_f16 = avx2_dot_f16,
    .axpy_f16 = avx2_axpy_f16,
    .scale = avx2_scale,
    .dot4_f16 = avx512_dot4_f16,
    .axpy_rows_f16 = avx512_axpy_rows_f16,
    .scale_round_f16 = avx512_scale_round_f16,
    .softmax = avx512_softmax,
    .gelu_mul = avx512_gelu_mul,
    .silu_mul = avx512_silu_mul,
    .kc4_fold = avx2_kc4_fold, /* attn_kc4_fold's 8 lanes */
    .kc4_channels = avx2_kc4_channels,
    .kv = {KV_OPS_F16(avx512), KV_OPS_Q_TILES(avx2, avx512, q8_0),
           KV_OPS_Q_TILES(avx2, avx512, q4_0), KV_OPS_Q_TILES(avx2, avx512, q5_0),
           KV_OPS_Q_TILES(avx2, avx512, q3_0), KV_OPS_Q_TILES(avx2, avx512, c4)},
};
#endif

#if defined(__aarch64__)
#include <arm_neon.h>

/* Four f16 values as floats (FCVTL: exact, as fp16_to_fp32). */
static inline float32x4_t neon_load_f16x4(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

/* The end of a dot whose eight lanes are the reference's: lanes 0..3 in
 * lo, 4..7 in hi. The tail goes into lane 0 with FMA like the lanes, then
 * the lanes are summed in the reference's order. */
static inline float neon_dot_finish(float32x4_t lo, float32x4_t hi, const float *q,
                                    const uint16_t *k, size_t i, size_t n) {
    if (i < n) {
        float l0 = vgetq_lane_f32(lo, 0);
        for (; i < n; i++) l0 = __builtin_fmaf(q[i], fp16_to_fp32(k[i]), l0);
        lo = vsetq_lane_f32(l0, lo, 0);
    }
    const float32x4_t s = vaddq_f32(lo, hi); /* l0+l4, l1+l5, l2+l6, l3+l7 */
    const float32x4_t p = vpaddq_f32(s, s);  /* (l0+l4)+(l1+l5), (l2+l6)+(l3+l7) */
    return vgetq_lane_f32(p, 0) + vgetq_lane_f32(p, 1);
}

static float neon_dot_f16(const float *q, const uint16_t *k, size_t n) {
    float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        lo = vfmaq_f32(lo, vld1q_f32(q + i), neon_load_f16x4(k + i));
        hi = vfmaq_f32(hi, vld1q_f32(q + i + 4), neon_load_f16x4(k + i + 4));
    }
    return neon_dot_finish(lo, hi, q, k, i, n);
}

/* Four keys with the query loaded once; each key's lanes take the same
 * operations as in neon_dot_f16. */
static void neon_dot4_f16(const float *q, const uint16_t *const k[4], size_t n, float out[4]) {
    float32x4_t lo[4], hi[4];
    for (int j = 0; j < 4; j++) lo[j] = hi[j] = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t q0 = vld1q_f32(q + i), q1 = vld1q_f32(q + i + 4);
        for (int j = 0; j < 4; j++) {
            lo[j] = vfmaq_f32(lo[j], q0, neon_load_f16x4(k[j] + i));
            hi[j] = vfmaq_f32(hi[j], q1, neon_load_f16x4(k[j] + i + 4));
        }
    }
    for (int j = 0; j < 4; j++) out[j] = neon_dot_finish(lo[j], hi[j], q, k[j], i, n);
}

/* acc[i] = fma(w, v[i], acc[i]) for every i, vector or tail alike. */
static void neon_axpy_f16(float *acc, float w, const uint16_t *v, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(acc + i, vfmaq_n_f32(vld1q_f32(acc + i), neon_load_f16x4(v + i), w));
        vst1q_f32(acc + i + 4, vfmaq_n_f32(vld1q_f32(acc + i + 4), neon_load_f16x4(v + i + 4), w));
    }
    for (; i < n; i++) acc[i] = __builtin_fmaf(w, fp16_to_fp32(v[i]), acc[i]);
}

/* axpy over many rows with 64 columns of acc in registers at a time: the
 * same fused multiply-add per element and row, in row order, as
 * neon_axpy_f16. */
static void neon_axpy_rows_f16(float *acc, const float *w, const uint16_t *const *v, size_t nk,
                               size_t n) {
    size_t c = 0;
    for (; c + 64 <= n; c += 64) {
        float32x4_t a[16];
        for (int u = 0; u < 16; u++) a[u] = vld1q_f32(acc + c + 4 * u);
        for (size_t j = 0; j < nk; j++) {
            const float wj = w[j];
            const uint16_t *vr = v[j] + c;
            for (int u = 0; u < 16; u++) a[u] = vfmaq_n_f32(a[u], neon_load_f16x4(vr + 4 * u), wj);
        }
        for (int u = 0; u < 16; u++) vst1q_f32(acc + c + 4 * u, a[u]);
    }
    if (c < n)
        for (size_t j = 0; j < nk; j++) neon_axpy_f16(acc + c, w[j], v[j] + c, n - c);
}

static void neon_scale(float *acc, float s, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(acc + i, vmulq_n_f32(vld1q_f32(acc + i), s));
    for (; i < n; i++) acc[i] *= s;
}

/* FCVTN rounds to nearest even (the FPCR's default mode), subnormals
 * kept, as fp32_to_fp16 does; FCVTL back is exact. */
static void neon_scale_round_f16(float *out, const float *x, float s, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), s);
        vst1q_f32(out + i, vcvt_f32_f16(vcvt_f16_f32(v)));
    }
    for (; i < n; i++) out[i] = fp16_to_fp32(fp32_to_fp16(x[i] * s));
}

KV_F16_WRAPPERS(neon)

/* The 32 codes of block ib of a quantized row as signed bytes, elements
 * 0..15 in *a and 16..31 in *b; returns the scale. Exact integers, the
 * reference's: Q5_0 and Q3_0 are unpacked here by q5_0_codes' and
 * q3_0_codes' formulas, lane by lane. */
static inline __attribute__((always_inline)) float
neon_block_i8(kv_format f, const void *row, size_t ib, int8x16_t *a, int8x16_t *b) {
    if (f == KV_FMT_Q8_0) {
        const block_q8_0 *bl = (const block_q8_0 *)row + ib;
        *a = vld1q_s8(bl->qs);
        *b = vld1q_s8(bl->qs + 16);
        return fp16_to_fp32(bl->d);
    }
    if (f == KV_FMT_Q4_0 || f == KV_FMT_C4) {
        const bool c4 = f == KV_FMT_C4;
        const uint8_t *qs =
            c4 ? (const uint8_t *)row + 16 * ib : ((const block_q4_0 *)row + ib)->qs;
        const uint8x16_t raw = vld1q_u8(qs);
        *a = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), vdupq_n_s8(8));
        *b = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vdupq_n_s8(8));
        return c4 ? 1.0f : fp16_to_fp32(((const block_q4_0 *)row + ib)->d);
    }
    /* Bit j of qh (element j's top bit): byte j / 8 of qh in eight lanes,
     * tested against bit j % 8; all ones where it is set. */
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8_t *qh =
        f == KV_FMT_Q5_0 ? ((const block_q5_0 *)row + ib)->qh : ((const block_q3_0 *)row + ib)->qh;
    const uint8x16_t bit = vld1q_u8(bits);
    const uint8x16_t h_lo = vtstq_u8(vcombine_u8(vld1_dup_u8(qh), vld1_dup_u8(qh + 1)), bit);
    const uint8x16_t h_hi = vtstq_u8(vcombine_u8(vld1_dup_u8(qh + 2), vld1_dup_u8(qh + 3)), bit);
    if (f == KV_FMT_Q5_0) {
        /* q5_0_codes: the low nibble of qs[j] (element j) or its high one
         * (element j + 16), plus 16 where the bit of qh is set, minus 16
         * (in bytes: 0..31 minus 16 is -16..15 as int8). */
        const block_q5_0 *bl = (const block_q5_0 *)row + ib;
        const uint8x16_t raw = vld1q_u8(bl->qs), s16 = vdupq_n_u8(16);
        const uint8x16_t lo = vorrq_u8(vandq_u8(raw, vdupq_n_u8(15)), vandq_u8(h_lo, s16));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(raw, 4), vandq_u8(h_hi, s16));
        *a = vreinterpretq_s8_u8(vsubq_u8(lo, s16));
        *b = vreinterpretq_s8_u8(vsubq_u8(hi, s16));
        return fp16_to_fp32(bl->d);
    }
    /* q3_0_codes: element j's low two bits are bits 2 (j / 8) of
     * qs[j % 8], its third bit is bit j of qh, minus 4. */
    const block_q3_0 *bl = (const block_q3_0 *)row + ib;
    const uint8x8_t x = vld1_u8(bl->qs), m3 = vdup_n_u8(3);
    const uint8x16_t l2 = vcombine_u8(vand_u8(x, m3), vand_u8(vshr_n_u8(x, 2), m3));
    const uint8x16_t h2 = vcombine_u8(vand_u8(vshr_n_u8(x, 4), m3), vshr_n_u8(x, 6));
    const uint8x16_t s4 = vdupq_n_u8(4);
    *a = vreinterpretq_s8_u8(vsubq_u8(vorrq_u8(l2, vandq_u8(h_lo, s4)), s4));
    *b = vreinterpretq_s8_u8(vsubq_u8(vorrq_u8(h2, vandq_u8(h_hi, s4)), s4));
    return fp16_to_fp32(bl->d);
}

/* Sixteen signed bytes as four vectors of four floats, in order (exact). */
static inline void neon_i8_f32(int8x16_t x, float32x4_t c[4]) {
    const int16x8_t l = vmovl_s8(vget_low_s8(x)), h = vmovl_s8(vget_high_s8(x));
    c[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(l)));
    c[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(l)));
    c[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
    c[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(h)));
}

/* The 32 codes of block ib of a quantized row as eight vectors of four
 * floats, in element order; returns the scale. */
static inline __attribute__((always_inline)) float neon_block_codes(kv_format f, const void *row,
                                                                    size_t ib, float32x4_t c[8]) {
    int8x16_t a, b;
    const float d = neon_block_i8(f, row, ib, &a, &b);
    neon_i8_f32(a, c);
    neon_i8_f32(b, c + 4);
    return d;
}

/* ref_dot_q's lanes for one block (0..3 in lo, 4..7 in hi): the part from
 * zero, element i into lane i % 8 in element order, then lane =
 * fma(d, part, lane). */
static inline __attribute__((always_inline)) void
neon_dot_codes(const float *q, const float32x4_t c[8], float d, float32x4_t *lo, float32x4_t *hi) {
    float32x4_t plo = vdupq_n_f32(0.0f), phi = vdupq_n_f32(0.0f);
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
        plo = vfmaq_f32(plo, vld1q_f32(q + 8 * u), c[2 * u]);
        phi = vfmaq_f32(phi, vld1q_f32(q + 8 * u + 4), c[2 * u + 1]);
    }
    *lo = vfmaq_n_f32(*lo, plo, d);
    *hi = vfmaq_n_f32(*hi, phi, d);
}

static inline __attribute__((always_inline)) void neon_dot_block(kv_format f, const float *q,
                                                                 const void *k, size_t ib,
                                                                 float32x4_t *lo, float32x4_t *hi) {
    float32x4_t c[8];
    const float d = neon_block_codes(f, k, ib, c);
    neon_dot_codes(q, c, d, lo, hi);
}

static inline __attribute__((always_inline)) float neon_dot_q(kv_format f, const float *q,
                                                              const void *k, size_t n) {
    float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f);
    for (size_t ib = 0; ib < n / 32; ib++) neon_dot_block(f, q + 32 * ib, k, ib, &lo, &hi);
    return neon_dot_finish(lo, hi, q, NULL, n, n);
}

static inline __attribute__((always_inline)) void
neon_dot4_q(kv_format f, const float *q, const void *const k[4], size_t n, float out[4]) {
    float32x4_t lo[4], hi[4];
    for (int j = 0; j < 4; j++) lo[j] = hi[j] = vdupq_n_f32(0.0f);
    for (size_t ib = 0; ib < n / 32; ib++)
        for (int j = 0; j < 4; j++) neon_dot_block(f, q + 32 * ib, k[j], ib, &lo[j], &hi[j]);
    for (int j = 0; j < 4; j++) out[j] = neon_dot_finish(lo[j], hi[j], q, NULL, n, n);
}

/* ref_axpy_rows_q's fused multiply-adds, a block's 32 columns of acc in
 * registers across the rows. */
static inline __attribute__((always_inline)) void neon_axpy_rows_q(kv_format f, float *acc,
                                                                   const float *w,
                                                                   const void *const *v, size_t nk,
                                                                   size_t n) {
    for (size_t ib = 0; ib < n / 32; ib++) {
        float *ac = acc + 32 * ib;
        float32x4_t a[8];
        for (int u = 0; u < 8; u++) a[u] = vld1q_f32(ac + 4 * u);
        for (size_t j = 0; j < nk; j++) {
            float32x4_t c[8];
            const float wd = w[j] * neon_block_codes(f, v[j], ib, c);
            for (int u = 0; u < 8; u++) a[u] = vfmaq_n_f32(a[u], c[u], wd);
        }
        for (int u = 0; u < 8; u++) vst1q_f32(ac + 4 * u, a[u]);
    }
}

#define NEON_Q_KERNELS(fmt, sfx)                                                                   \
    static float neon_dot_##sfx(const float *q, const void *k, size_t n) {                         \
        return neon_dot_q(fmt, q, k, n);                                                           \
    }                                                                                              \
    static void neon_dot4_##sfx(const float *q, const void *const k[4], size_t n, float out[4]) {  \
        neon_dot4_q(fmt, q, k, n, out);                                                            \
    }                                                                                              \
    static void neon_axpy_rows_##sfx(float *acc, const float *w, const void *const *v, size_t nk,  \
                                     size_t n) {                                                   \
        neon_axpy_rows_q(fmt, acc, w, v, nk, n);                                                   \
    }

NEON_Q_KERNELS(KV_FMT_Q8_0, q8_0)
NEON_Q_KERNELS(KV_FMT_Q4_0, q4_0)
NEON_Q_KERNELS(KV_FMT_Q5_0, q5_0)
NEON_Q_KERNELS(KV_FMT_Q3_0, q3_0)
NEON_Q_KERNELS(KV_FMT_C4, c4)

/* Quantized keys for several queries: neon_dot_q's operations per (query,
 * key), through the same neon_dot_codes (a block's part from zero, FMA'd
 * into the query's lanes times the scale; neon_dot_finish's sum at the
 * end), so dot's bits. One key and up to eight queries at a time, each
 * block of the key unpacked once for the group (past four queries GCC
 * spills a few of the sixteen sums, still fewer instructions a query). */
static inline __attribute__((always_inline)) void neon_dot_group_q(kv_format f, const float *q,
                                                                   size_t n, const void *k,
                                                                   float *out, size_t ostride,
                                                                   const int G) {
    float32x4_t lo[8], hi[8];
#pragma GCC unroll 8
    for (int i = 0; i < G; i++) lo[i] = hi[i] = vdupq_n_f32(0.0f);
    for (size_t ib = 0; ib < n / 32; ib++) {
        float32x4_t c[8];
        const float d = neon_block_codes(f, k, ib, c);
#pragma GCC unroll 8
        for (int i = 0; i < G; i++)
            neon_dot_codes(q + (size_t)i * n + 32 * ib, c, d, &lo[i], &hi[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < G; i++)
        out[(size_t)i * ostride] = neon_dot_finish(lo[i], hi[i], q, NULL, n, n);
}

static inline __attribute__((always_inline)) void neon_dot_tile_q(kv_format f, const float *q,
                                                                  size_t nq, const void *const *k,
                                                                  size_t nk, size_t n, float *out,
                                                                  size_t ostride) {
    for (size_t j = 0; j < nk; j++)
        for (size_t i0 = 0; i0 < nq; i0 += 8) {
            const float *qi = q + i0 * n;
            float *o = out + i0 * ostride + j;
#define NEON_DOT_Q(G) neon_dot_group_q(f, qi, n, k[j], o, ostride, G)
            switch (nq - i0 < 8 ? nq - i0 : 8) { TILE_CASES8(NEON_DOT_Q); }
#undef NEON_DOT_Q
        }
}

/* Quantized value rows for several queries: NH halves (16 columns each,
 * from half h0) of block ib of up to G queries' accumulators in registers
 * across the rows (at most sixteen vectors), those codes of a row unpacked
 * once for the group: acc = fma(w * d, code, acc) per element, w * d
 * rounded first, row after row, as ref_axpy_rows_q and neon_axpy_rows_q,
 * so axpy_rows' bits. */
static inline __attribute__((always_inline)) void
neon_axpy_group_q(kv_format f, float *const *acc, const float *const *w, const void *const *v,
                  size_t nk, size_t ib, const int h0, const int NH, const int G) {
    const size_t c0 = 32 * ib + 16 * (size_t)h0;
    float32x4_t a[16];
#pragma GCC unroll 4
    for (int i = 0; i < G; i++)
#pragma GCC unroll 8
        for (int u = 0; u < 4 * NH; u++) a[i * 4 * NH + u] = vld1q_f32(acc[i] + c0 + 4 * u);
    for (size_t j = 0; j < nk; j++) {
        int8x16_t lo, hi;
        const float d = neon_block_i8(f, v[j], ib, &lo, &hi);
        float wd[4];
#pragma GCC unroll 4
        for (int i = 0; i < G; i++) wd[i] = w[i][j] * d;
#pragma GCC unroll 2
        for (int h = 0; h < NH; h++) {
            float32x4_t c[4];
            neon_i8_f32((h0 + h) ? hi : lo, c);
#pragma GCC unroll 4
            for (int i = 0; i < G; i++)
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    a[i * 4 * NH + 4 * h + u] = vfmaq_n_f32(a[i * 4 * NH + 4 * h + u], c[u], wd[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < G; i++)
#pragma GCC unroll 8
        for (int u = 0; u < 4 * NH; u++) vst1q_f32(acc[i] + c0 + 4 * u, a[i * 4 * NH + u]);
}

/* Block ib for G (1..4) queries: the whole block for one or two, a half at
 * a time (its codes unpacked again, shared by more queries) for more. */
static inline __attribute__((always_inline)) void neon_axpy_block_q(kv_format f, float *const *acc,
                                                                    const float *const *w,
                                                                    const void *const *v, size_t nk,
                                                                    size_t ib, const int G) {
    if (G <= 2) {
        neon_axpy_group_q(f, acc, w, v, nk, ib, 0, 2, G);
    } else {
        neon_axpy_group_q(f, acc, w, v, nk, ib, 0, 1, G);
        neon_axpy_group_q(f, acc, w, v, nk, ib, 1, 1, G);
    }
}

static inline __attribute__((always_inline)) void neon_axpy_tile_q(kv_format f, float *const *acc,
                                                                   const float *const *w, size_t nq,
                                                                   const void *const *v, size_t nk,
                                                                   size_t n) {
    for (size_t i0 = 0; i0 < nq; i0 += 4)
        for (size_t ib = 0; ib < n / 32; ib++) {
#define NEON_AXPY_Q(G) neon_axpy_block_q(f, acc + i0, w + i0, v, nk, ib, G)
            switch (nq - i0 < 4 ? nq - i0 : 4) { TILE_CASES4(NEON_AXPY_Q); }
#undef NEON_AXPY_Q
        }
}

Q_TILES(, neon)

/* f16 keys for several queries: neon_dot_f16's lanes per (query, key),
 * two keys and up to four queries at a time (sixteen sums in registers),
 * each key converted once per group. n a multiple of 8, else query by
 * query. */
static inline __attribute__((always_inline)) void neon_dot_group_f16(const float *q, size_t n,
                                                                     const uint16_t *k0,
                                                                     const uint16_t *k1, float *out,
                                                                     size_t ostride, const int G) {
    float32x4_t lo0[4], hi0[4], lo1[4], hi1[4];
    for (int i = 0; i < G; i++) lo0[i] = hi0[i] = lo1[i] = hi1[i] = vdupq_n_f32(0.0f);
    for (size_t e = 0; e < n; e += 8) {
        const float32x4_t l0 = neon_load_f16x4(k0 + e), h0 = neon_load_f16x4(k0 + e + 4);
        const float32x4_t l1 = neon_load_f16x4(k1 + e), h1 = neon_load_f16x4(k1 + e + 4);
        for (int i = 0; i < G; i++) {
            const float32x4_t q0 = vld1q_f32(q + (size_t)i * n + e),
                              q1 = vld1q_f32(q + (size_t)i * n + e + 4);
            lo0[i] = vfmaq_f32(lo0[i], q0, l0);
            hi0[i] = vfmaq_f32(hi0[i], q1, h0);
            lo1[i] = vfmaq_f32(lo1[i], q0, l1);
            hi1[i] = vfmaq_f32(hi1[i], q1, h1);
        }
    }
    for (int i = 0; i < G; i++) {
        out[(size_t)i * ostride] = neon_dot_finish(lo0[i], hi0[i], q, k0, n, n);
        out[(size_t)i * ostride + 1] = neon_dot_finish(lo1[i], hi1[i], q, k1, n, n);
    }
}

static void neon_dot_tile_f16(const float *q, size_t nq, const void *const *k, size_t nk, size_t n,
                              float *out, size_t ostride) {
    size_t j = 0;
    if (n % 8 == 0)
        for (; j + 2 <= nk; j += 2)
            for (size_t i0 = 0; i0 < nq; i0 += 4) {
                const float *qi = q + i0 * n;
                float *o = out + i0 * ostride + j;
#define NEON_DOT_G(G) neon_dot_group_f16(qi, n, k[j], k[j + 1], o, ostride, G)
                switch (nq - i0 < 4 ? nq - i0 : 4) { TILE_CASES4(NEON_DOT_G); }
#undef NEON_DOT_G
            }
    for (; j < nk; j++)
        for (size_t i = 0; i < nq; i++) out[i * ostride + j] = neon_dot_f16(q + i * n, k[j], n);
}

/* f16 value rows for several queries: 4 columns of up to sixteen queries'
 * accumulators in registers, each row converted once per group: the fused
 * multiply-adds of neon_axpy_f16, row after row. n a multiple of 4, else
 * query by query. */
static inline __attribute__((always_inline)) void
neon_axpy_group_f16(float *const *acc, const float *const *w, const void *const *v, size_t nk,
                    size_t c, const int G) {
    float32x4_t a[16];
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) a[i] = vld1q_f32(acc[i] + c);
    for (size_t j = 0; j < nk; j++) {
        const float32x4_t vv = neon_load_f16x4((const uint16_t *)v[j] + c);
#pragma GCC unroll 16
        for (int i = 0; i < G; i++) a[i] = vfmaq_n_f32(a[i], vv, w[i][j]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < G; i++) vst1q_f32(acc[i] + c, a[i]);
}

static void neon_axpy_tile_f16(float *const *acc, const float *const *w, size_t nq,
                               const void *const *v, size_t nk, size_t n) {
    if (n % 4) {
        for (size_t i = 0; i < nq; i++)
            for (size_t j = 0; j < nk; j++) neon_axpy_f16(acc[i], w[i][j], v[j], n);
        return;
    }
    for (size_t i0 = 0; i0 < nq; i0 += 16)
        for (size_t c = 0; c < n; c += 4) {
#define NEON_AXPY_G(G) neon_axpy_group_f16(acc + i0, w + i0, v, nk, c, G)
            switch (nq - i0 < 16 ? nq - i0 : 16) { TILE_CASES16(NEON_AXPY_G); }
#undef NEON_AXPY_G
        }
}

/* e^x for two doubles (floats widened exactly) by xmath.h's operations:
 * the table entry and the polynomial as the other variants form them, each
 * an IEEE double operation (no FMA: the library is built with
 * -ffp-contract=off and these are separate intrinsics). */
static inline float64x2_t neon_exp_d2(float64x2_t x) {
    const float64x2_t shifter = vdupq_n_f64(0x1.8p52);
    const float64x2_t kd =
        vsubq_f64(vaddq_f64(vmulq_f64(x, vdupq_n_f64(32.0 * XM_INV_LN2)), shifter), shifter);
    const float64x2_t r = vsubq_f64(vsubq_f64(x, vmulq_f64(kd, vdupq_n_f64(XM_LN2_HI / 32.0))),
                                    vmulq_f64(kd, vdupq_n_f64(XM_LN2_LO / 32.0)));
    float64x2_t p = vmulq_f64(r, vdupq_n_f64(1.0 / 120.0));
    p = vmulq_f64(r, vaddq_f64(vdupq_n_f64(1.0 / 24.0), p));
    p = vmulq_f64(r, vaddq_f64(vdupq_n_f64(1.0 / 6.0), p));
    p = vmulq_f64(r, vaddq_f64(vdupq_n_f64(1.0 / 2.0), p));
    p = vmulq_f64(r, vaddq_f64(vdupq_n_f64(1.0), p));
    p = vaddq_f64(vdupq_n_f64(1.0), p);
    /* |kd| < 2^13 in range: the conversion is exact. */
    const int64x2_t k = vcvtq_s64_f64(kd), j = vandq_s64(k, vdupq_n_s64(31));
    const int64x2_t m = vshrq_n_s64(vsubq_s64(k, j), 5);
    const float64x2_t t = vcombine_f64(vld1_f64(&xm_exp2_j32[vgetq_lane_s64(j, 0)]),
                                       vld1_f64(&xm_exp2_j32[vgetq_lane_s64(j, 1)]));
    const int64x2_t tb = vaddq_s64(vreinterpretq_s64_f64(t), vshlq_n_s64(m, 52));
    return vmulq_f64(vreinterpretq_f64_s64(tb), p);
}

/* xm_expf of four floats: the double operations on two pairs, the
 * results rounded to float once, then its range ends and NaN. */
static inline float32x4_t neon_exp4(float32x4_t xf) {
    const float64x2_t lo = neon_exp_d2(vcvt_f64_f32(vget_low_f32(xf)));
    const float64x2_t hi = neon_exp_d2(vcvt_high_f64_f32(xf));
    float32x4_t e = vcvt_high_f32_f64(vcvt_f32_f64(lo), hi);
    e = vbslq_f32(vcgtq_f32(xf, vdupq_n_f32(-104.0f)), e, vdupq_n_f32(0.0f));
    e = vbslq_f32(vcgtq_f32(xf, vdupq_n_f32(XM_EXP_MAX)), vdupq_n_f32(INFINITY), e);
    return vbslq_f32(vceqq_f32(xf, xf), e, xf);
}

static void neon_expn(float *x, size_t n, float mx) {
    const float32x4_t mv = vdupq_n_f32(mx);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, neon_exp4(vsubq_f32(vld1q_f32(x + i), mv)));
    for (; i < n; i++) x[i] = xm_expf(x[i] - mx);
}

static void neon_softmax(float *const *s, const int32_t *n, size_t nq, float scale, float softcap) {
    softmax_with(s, n, nq, scale, softcap, ref_scale_max, neon_expn, neon_scale_round_f16);
}

/* Four at a time around neon_exp4. */
static void neon_silu_mul(float *g, const float *u, size_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t d = vaddq_f32(one, neon_exp4(vnegq_f32(x)));
        vst1q_f32(g + i, vmulq_f32(vdivq_f32(x, d), vld1q_f32(u + i)));
    }
    ref_silu_mul(g + i, u + i, n - i);
}

/* attn_kc4_fold's lanes 0..3 in lo, 4..7 in hi, summed by
 * neon_dot_finish. */
static void neon_kc4_fold(const float *q, size_t nq, const float *step, const float *centre,
                          size_t n, float *qs, float *base) {
    for (size_t i = 0; i < nq; i++, q += n, qs += n) {
        float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f);
        for (size_t c = 0; c < n; c += 8) {
            const float32x4_t x0 = vld1q_f32(q + c), x1 = vld1q_f32(q + c + 4);
            vst1q_f32(qs + c, vmulq_f32(x0, vld1q_f32(step + c)));
            vst1q_f32(qs + c + 4, vmulq_f32(x1, vld1q_f32(step + c + 4)));
            lo = vfmaq_f32(lo, x0, vld1q_f32(centre + c));
            hi = vfmaq_f32(hi, x1, vld1q_f32(centre + c + 4));
        }
        base[i] = neon_dot_finish(lo, hi, NULL, NULL, n, n); /* no tail: n % 8 == 0 */
    }
}

/* attn_kc4_channels four channels at a time (as avx2_kc4_channels: two
 * bytes of step codes, and the minimum codes of eight channels as three
 * bytes, shifted per lane). */
static void neon_kc4_channels(const uint8_t *meta, size_t hd, float *step, float *centre) {
    uint16_t mh, dh;
    memcpy(&mh, meta, 2);
    memcpy(&dh, meta + 2, 2);
    const float32x4_t mref = vdupq_n_f32(fp16_to_fp32(mh)), dref = vdupq_n_f32(fp16_to_fp32(dh));
    const uint8_t *sc = meta + 4, *mc = sc + hd / 2;
    static const int32_t sh_s[8] = {0, -4, -8, -12, -16, -20, -24, -28},
                         sh_m[8] = {0, -3, -6, -9, -12, -15, -18, -21};
    for (size_t c = 0; c < hd; c += 8) {
        uint32_t ws, wm = 0;
        memcpy(&ws, sc + c / 2, 4);
        memcpy(&wm, mc + 3 * c / 8, 3);
        for (int h = 0; h < 2; h++) {
            const uint32x4_t s =
                vandq_u32(vshlq_u32(vdupq_n_u32(ws), vld1q_s32(sh_s + 4 * h)), vdupq_n_u32(15));
            const uint32x4_t m =
                vandq_u32(vshlq_u32(vdupq_n_u32(wm), vld1q_s32(sh_m + 4 * h)), vdupq_n_u32(7));
            const float32x4_t st = vmulq_f32(
                vmulq_f32(dref, vcvtq_f32_u32(vaddq_u32(s, vdupq_n_u32(1)))), vdupq_n_f32(0.0625f));
            const float32x4_t mn =
                vmulq_f32(vcvtq_f32_s32(vsubq_s32(vreinterpretq_s32_u32(m), vdupq_n_s32(4))), mref);
            vst1q_f32(step + c + 4 * h, st);
            vst1q_f32(centre + c + 4 * h, vaddq_f32(mn, vmulq_f32(vdupq_n_f32(8.0f), st)));
        }
    }
}

static const attn_kernels neon_kernels = {
    .dot_f16 = neon_dot_f16,
    .axpy_f16 = neon_axpy_f16,
    .scale = neon_scale,
    .dot4_f16 = neon_dot4_f16,
    .axpy_rows_f16 = neon_axpy_rows_f16,
    .scale_round_f16 = neon_scale_round_f16,
    .softmax = neon_softmax,
    .gelu_mul = ref_gelu_mul,
    .silu_mul = neon_silu_mul,
    .kc4_fold = neon_kc4_fold,
    .kc4_channels = neon_kc4_channels,
    .kv = {KV_OPS_F16(neon), KV_OPS_Q8_0(neon), KV_OPS_Q4_0(neon), KV_OPS_Q5_0(neon),
           KV_OPS_Q3_0(neon), KV_OPS_C4(neon)},
};
#endif

static const attn_kernels *chosen = &ref_kernels;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    const char *want = getenv("CELLM_KERNELS"); /* "ref": the scalar kernels, as quant.c */
    if (want && !strcmp(want, "ref")) return;
#if defined(__x86_64__)
    if (avx512_cpu_supported() && !(want && !strcmp(want, "avx2")))
        chosen = &avx512_kernels; /* "avx2": the AVX2 kernels, as quant.c */
    else if (avx2_cpu_supported())
        chosen = &avx2_kernels;
#elif defined(__aarch64__)
    chosen = &neon_kernels; /* NEON is baseline on AArch64 */
#endif
}

const attn_kernels *attn_kernels_get(void) {
    pthread_once(&choose_once, choose);
    return chosen;
}

const attn_kernels *attn_kernels_ref(void) {
    return &ref_kernels;
}

const attn_kernels *attn_kernels_variant(const char *name) {
    if (!strcmp(name, "ref")) return &ref_kernels;
#if defined(__x86_64__)
    if (!strcmp(name, "avx2") && avx2_cpu_supported()) return &avx2_kernels;
    if (!strcmp(name, "avx512") && avx512_cpu_supported()) return &avx512_kernels;
#elif defined(__aarch64__)
    if (!strcmp(name, "neon")) return &neon_kernels;
#endif
    return NULL;
}

/* ------------------------------------------------------------ rotation */

#define ROT_MAX 1024

static float rot_signs[ROT_MAX];
static pthread_once_t rot_once = PTHREAD_ONCE_INIT;

/* The signs of S: the low bit of a splitmix64 sequence from a fixed seed. */
static void rot_fill(void) {
    uint64_t st = 0x7C3A5E1F0B9D2468ull;
    for (int i = 0; i < ROT_MAX; i++) {
        uint64_t z = (st += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        rot_signs[i] = z & 1 ? -1.0f : 1.0f;
    }
}

/* x = W x (unnormalised Walsh-Hadamard, butterflies of growing span). */
static void fwht(float *x, size_t n) {
    for (size_t h = 1; h < n; h *= 2)
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void attn_rotate(float *x, size_t n) {
    assert(n >= 1 && n <= ROT_MAX && (n & (n - 1)) == 0);
    (void)pthread_once(&rot_once, rot_fill);
    for (size_t i = 0; i < n; i++) x[i] *= rot_signs[i];
    fwht(x, n);
    const float s = 1.0f / sqrtf((float)n);
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void attn_unrotate(float *x, size_t n) {
    assert(n >= 1 && n <= ROT_MAX && (n & (n - 1)) == 0);
    (void)pthread_once(&rot_once, rot_fill);
    fwht(x, n);
    const float s = 1.0f / sqrtf((float)n);
    for (size_t i = 0; i < n; i++) x[i] *= rot_signs[i] * s;
}

/* An f16 of x rounded up (x >= 0 finite, below f16's largest): the
 * smallest f16 not below x. */
static uint16_t f16_up(float x) {
    uint16_t h = fp32_to_fp16(x);
    if (fp16_to_fp32(h) < x) h++;
    return h;
}

/* Float to a code in lo..hi (NaN: lo), from a value already floored. */
static int clamp_code(float v, int lo, int hi) {
    return v >= (float)hi ? hi : v >= (float)lo ? (int)v : lo;
}

void attn_kc4_quantize(const uint16_t *const k[KV_BLOCK_POSITIONS], size_t hd,
                       uint8_t *const codes[KV_BLOCK_POSITIONS], uint8_t *meta) {
    enum { P = KV_BLOCK_POSITIONS };
    float lo[1024], hi[1024], mn[1024], st[1024];
    float mabs = 0.0f;
    for (size_t c = 0; c < hd; c++) {
        float a = fp16_to_fp32(k[0][c]), b = a;
        for (int p = 1; p < P; p++) {
            const float x = fp16_to_fp32(k[p][c]);
            if (x < a) a = x;
            if (x > b) b = x;
        }
        lo[c] = a;
        hi[c] = b;
        if (fabsf(a) > mabs) mabs = fabsf(a);
    }
    /* The minimums: multiples -4..3 of mref, at or below the channel's
     * lowest key (mref a quarter of the largest |lowest|, rounded up). */
    const uint16_t mh = f16_up(mabs / 4.0f);
    const float mref = fp16_to_fp32(mh);
    float dmax = 0.0f;
    uint8_t *sc = meta + 4, *mc = sc + hd / 2;
    memset(sc, 0, hd / 2 + 3 * hd / 8);
    for (size_t c = 0; c < hd; c++) {
        const int m = mref > 0.0f ? clamp_code(floorf(lo[c] / mref), -4, 3) : 0;
        mn[c] = (float)m * mref;
        const size_t bit = 3 * c;
        const unsigned v = (unsigned)(m + 4) << (bit % 8);
        mc[bit / 8] |= (uint8_t)v;
        if (bit % 8 > 5) mc[bit / 8 + 1] |= (uint8_t)(v >> 8);
        st[c] = (hi[c] - mn[c]) / 15.0f;
        if (st[c] > dmax) dmax = st[c];
    }
    /* The steps: (s + 1) / 16 of dref (the largest, rounded up), the
     * smallest at or above the channel's range / 15. */
    const uint16_t dh = f16_up(dmax);
    const float dref = fp16_to_fp32(dh);
    for (size_t c = 0; c < hd; c++) {
        const int s = dref > 0.0f ? clamp_code(ceilf(st[c] / dref * 16.0f) - 1.0f, 0, 15) : 0;
        sc[c / 2] |= (uint8_t)(s << (4 * (c % 2)));
        st[c] = dref * (float)(s + 1) / 16.0f;
    }
    memcpy(meta, &mh, 2);
    memcpy(meta + 2, &dh, 2);
    for (int p = 0; p < P; p++) {
        memset(codes[p], 0, hd / 2);
        for (size_t c = 0; c < hd; c++) {
            const float x = fp16_to_fp32(k[p][c]);
            const int q = st[c] > 0.0f ? clamp_code(floorf((x - mn[c]) / st[c] + 0.5f), 0, 15) : 0;
            /* Q4_0's order within each 32: element j low, j + 16 high */
            const size_t ib = c / 32, j = c % 32;
            codes[p][16 * ib + j % 16] |= (uint8_t)(q << (4 * (j / 16)));
        }
    }
}

void attn_kc4_channels(const uint8_t *meta, size_t hd, float *step, float *centre) {
    uint16_t mh, dh;
    memcpy(&mh, meta, 2);
    memcpy(&dh, meta + 2, 2);
    const float mref = fp16_to_fp32(mh), dref = fp16_to_fp32(dh);
    const uint8_t *sc = meta + 4, *mc = sc + hd / 2;
    for (size_t c = 0; c < hd; c++) {
        const int s = (sc[c / 2] >> (4 * (c % 2))) & 15;
        const size_t bit = 3 * c;
        unsigned v = mc[bit / 8] >> (bit % 8);
        if (bit % 8 > 5) v |= (unsigned)mc[bit / 8 + 1] << (8 - bit % 8);
        const int m = (int)(v & 7) - 4;
        step[c] = dref * (float)(s + 1) / 16.0f;
        /* x = mn + step * q = (mn + 8 step) + step * (q - 8): the rows'
         * codes are read as q - 8 (KV_FMT_C4) */
        centre[c] = (float)m * mref + 8.0f * step[c];
    }
}

float attn_kc4_fold(const float *q, const float *step, const float *centre, size_t hd, float *qs) {
    float lane[8] = {0};
    for (size_t c = 0; c < hd; c++) {
        qs[c] = q[c] * step[c];
        lane[c % 8] = fmaf(q[c], centre[c], lane[c % 8]);
    }
    return lanes_sum(lane);
}
