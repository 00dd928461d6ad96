/*
 * attention.h — the small vector kernels attention runs over f16 K/V rows:
 * a dot product of an f32 query with an f16 key, and acc += w * v for an f16
 * value row, and their batched forms. A scalar version, an AVX2/F16C one
 * and a NEON one, chosen once. Each reduces in a fixed order, so results
 * depend only on their inputs, and each batched form returns exactly what
 * its single form returns.
 */
#ifndef CELLM_ATTENTION_H
#define CELLM_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

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
} attn_kernels;

/* The best variant for this CPU (the scalar one when $CELLM_KERNELS is
 * "ref"). Thread-safe. */
const attn_kernels *attn_kernels_get(void);

/* The scalar variant (tests compare the fast one against it). */
const attn_kernels *attn_kernels_ref(void);

#endif /* CELLM_ATTENTION_H */
