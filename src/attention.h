/*
 * attention.h — the small vector kernels attention runs over f16 K/V rows:
 * a dot product of an f32 query with an f16 key, and acc += w * v for an f16
 * value row. A scalar version and an AVX2/F16C version, chosen once. Both
 * reduce in a fixed order, so results depend only on their inputs.
 */
#ifndef CELLM_ATTENTION_H
#define CELLM_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

typedef struct attn_kernels {
    float (*dot_f16)(const float *q, const uint16_t *k, size_t n);
    void (*axpy_f16)(float *acc, float w, const uint16_t *v, size_t n);
    void (*scale)(float *acc, float s, size_t n);
} attn_kernels;

/* The best variant for this CPU. Thread-safe. */
const attn_kernels *attn_kernels_get(void);

/* The scalar variant (tests compare the fast one against it). */
const attn_kernels *attn_kernels_ref(void);

#endif /* CELLM_ATTENTION_H */
