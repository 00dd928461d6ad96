/*
 * attention.h — the small vector kernels attention runs over K/V rows as
 * the KV cache stores them: a dot product of an f32 query with a key, and
 * acc += w * v for value rows, and their batched forms. Rows are f16, or
 * Q8_0 / Q5_0 / Q4_0 blocks of 32 (kernels/blocks.h) read directly,
 * without dequantizing them first. A scalar version, an AVX2/F16C one, an AVX-512
 * one (f16 rows) and a NEON one, chosen once. Each reduces in a fixed order, so results depend only
 * on their inputs, and each batched form returns exactly what its single
 * form returns.
 *
 * Also the fixed rotation of the rotated 4-bit KV type: a randomized
 * Hadamard transform over a head.
 */
#ifndef CELLM_ATTENTION_H
#define CELLM_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "model/kv_format.h"

/* The kernels of one row format. Quantized rows need n a multiple of 32,
 * and hold each head's 32-element blocks in order, so a head of a row
 * starts kv_row_bytes(format, head_dim) bytes after the previous one.
 * In every format:
 *   dot(q, k, n): sum of q[i] * k[i];
 *   dot4: dot for four keys, bit for bit;
 *   axpy_rows(acc, w, v, nk, n): acc[i] += w[j] * v[j][i] for rows j in
 *     order, bit for bit the same whatever nk (one row at a time or many);
 *   store(dst, x, n): x rounded into the format (the same bits in every
 *     variant: the scalar f16 conversion or the scalar quantizers);
 *   dot_tile(q, nq, k, nk, n, out, ostride): for nq queries one after the
 *     other (query i at q + i * n) and nk keys, out[i * ostride + j] =
 *     dot(q + i * n, k[j], n), bit for bit: each key is read (and
 *     converted) once for all the queries;
 *   axpy_tile(acc, w, nq, v, nk, n): axpy_rows(acc[i], w[i], v, nk, n) for
 *     each of nq queries, bit for bit, each value row read once for all. */
typedef struct attn_kv_ops {
    float (*dot)(const float *q, const void *k, size_t n);
    void (*dot4)(const float *q, const void *const k[4], size_t n, float out[4]);
    void (*axpy_rows)(float *acc, const float *w, const void *const *v, size_t nk, size_t n);
    void (*store)(void *dst, const float *x, size_t n);
    void (*dot_tile)(const float *q, size_t nq, const void *const *k, size_t nk, size_t n,
                     float *out, size_t ostride);
    void (*axpy_tile)(float *const *acc, const float *const *w, size_t nq, const void *const *v,
                      size_t nk, size_t n);
} attn_kv_ops;

/* The n values a row of `format` holds (scalar; for tests and tools). */
void attn_kv_dequantize(kv_format format, const void *row, float *out, size_t n);

typedef struct attn_kernels {
    float (*dot_f16)(const float *q, const uint16_t *k, size_t n);
    void (*axpy_f16)(float *acc, float w, const uint16_t *v, size_t n);
    void (*scale)(float *acc, float s, size_t n);
    /* out[j] = dot_f16(q, k[j], n) for four keys, bit for bit: four
     * independent sums instead of one at a time. */
    void (*dot4_f16)(const float *q, const uint16_t *const k[4], size_t n, float out[4]);
    /* for j in 0..nk-1, in order: axpy_f16(acc, w[j], v[j], n), bit for
     * bit, with acc held in registers across the rows. */
    void (*axpy_rows_f16)(float *acc, const float *w, const uint16_t *const *v, size_t nk,
                          size_t n);
    /* out[i] = x[i] * s rounded to the nearest f16 (ties to even) and back
     * to f32: the values of fp16_to_fp32(fp32_to_fp16(x[i] * s)) for every
     * finite x[i] * s. out may be x. */
    void (*scale_round_f16)(float *out, const float *x, float s, size_t n);
    /* The attention weights of nq queries, in place: query i's n[i] scores
     * s[i][0..n[i]) become x = s * scale (then softcap * xm_tanhf(x /
     * softcap) where softcap > 0), w = xm_expf(x - max x), and w * (float)(1
     * / sum) rounded to f16 (scale_round_f16), sum being the double sum of
     * the w in index order. The same bits in every variant. */
    void (*softmax)(float *const *s, const int32_t *n, size_t nq, float scale, float softcap);
    /* g[i] = gelu(g[i]) * u[i] for the tanh GELU kept as a table of f16
     * results indexed by the f16 of the input (65,537 entries, the last
     * one padding for gathers): gelu(x) is 0 for x <= -10, x for x >= 10,
     * else fp16_to_fp32(table[fp32_to_fp16(x)]). The same bits in every
     * variant for every non-NaN input. */
    void (*gelu_mul)(float *g, const float *u, const uint16_t *table, size_t n);
    /* g[i] = g[i] / (1 + xm_expf(-g[i])) * u[i] (SiLU), the same bits in
     * every variant. */
    void (*silu_mul)(float *g, const float *u, size_t n);
    /* Keys per channel (KV_FMT_C4): nq queries (query i at q + i * n)
     * folded with a block's channel steps and centres (attn_kc4_channels):
     * attn_kc4_fold for each, bit for bit, into qs + i * n and base[i]. */
    void (*kc4_fold)(const float *q, size_t nq, const float *step, const float *centre, size_t n,
                     float *qs, float *base);
    /* attn_kc4_channels, bit for bit. */
    void (*kc4_channels)(const uint8_t *meta, size_t n, float *step, float *centre);
    /* The row kernels of each format; kv[KV_FMT_F16] are the f16 ones
     * above. */
    attn_kv_ops kv[KV_FMT_COUNT];
} attn_kernels;

/* The best variant for this CPU: AVX-512 where the CPU runs the avx512
 * matmul kernels, else AVX2/F16C, NEON on AArch64; the scalar one when
 * $CELLM_KERNELS is "ref", AVX2 when it is "avx2". Thread-safe. */
const attn_kernels *attn_kernels_get(void);

/* The scalar variant (tests compare the fast one against it). */
const attn_kernels *attn_kernels_ref(void);

/* The variant named "ref", "avx2", "avx512" (x86-64) or "neon" (AArch64);
 * NULL when this build or CPU cannot run it. For tests. */
const attn_kernels *attn_kernels_variant(const char *name);

/* The rotation of the rotated 4-bit KV type, over one head of n elements
 * (n a power of two, 1..1024): x = H x with H = W S / sqrt(n), S a fixed
 * diagonal of random signs (from a fixed seed, the same for every head,
 * layer and model), W the n x n Walsh-Hadamard matrix. H is orthogonal, so
 * (H q) . (H k) = q . k and sum w_j H v_j = H (sum w_j v_j): attention runs
 * in the rotated space and un-rotates its output once per head.
 * attn_unrotate applies H^T = S W / sqrt(n). In place, scalar, a fixed
 * order of operations. */
void attn_rotate(float *x, size_t n);
void attn_unrotate(float *x, size_t n);

/* Keys rounded per channel (kv_format.h's KV_KC4): one head of one block.
 * attn_kc4_quantize rounds the head's f16 keys of the block's 16 positions
 * (k[p], hd values each) into 16 rows of codes (codes[p], hd / 2 bytes
 * each, KV_FMT_C4) and the head's metadata (meta, kv_kc4_meta_bytes(hd)).
 * attn_kc4_channels reads the metadata back as each channel's step and
 * centre (a key is centre + step * (code - 8)); attn_kc4_fold folds them
 * into a query: qs[c] = q[c] * step[c], and returns sum q[c] * centre[c]
 * (channel c fused into lane c % 8 in channel order, the lanes summed as
 * dot's), so that q . key = base + dot_c4(qs, codes). Scalar, one order of
 * operations: the same bits on every CPU (attn_kernels.kc4_fold is the
 * fast form). hd a multiple of 32 up to 1024. */
void attn_kc4_quantize(const uint16_t *const k[KV_BLOCK_POSITIONS], size_t hd,
                       uint8_t *const codes[KV_BLOCK_POSITIONS], uint8_t *meta);
void attn_kc4_channels(const uint8_t *meta, size_t hd, float *step, float *centre);
float attn_kc4_fold(const float *q, const float *step, const float *centre, size_t hd, float *qs);

#endif /* CELLM_ATTENTION_H */
