/*
 * attention.c — f16 K/V vector kernels for attention (see attention.h).
 * The scalar and AVX2 variants accumulate in 8 lanes the same way, so
 * they agree closely; each is deterministic on its own.
 */
#include "attention.h"

#include <pthread.h>

#include "kernels/fp16.h"
#include "kernels/kernels.h"

static float ref_dot_f16(const float *q, const uint16_t *k, size_t n) {
    float lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += q[i + j] * fp16_to_fp32(k[i + j]);
    for (; i < n; i++) lane[0] += q[i] * fp16_to_fp32(k[i]);
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
           ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

static void ref_axpy_f16(float *acc, float w, const uint16_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += w * fp16_to_fp32(v[i]);
}

static void ref_scale(float *acc, float s, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] *= s;
}

static const attn_kernels ref_kernels = {ref_dot_f16, ref_axpy_f16, ref_scale};

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2_ATTR __attribute__((target("avx2,fma,f16c")))

AVX2_ATTR static float avx2_dot_f16(const float *q, const uint16_t *k, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, acc);
    }
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (; i < n; i++) lane[0] += q[i] * fp16_to_fp32(k[i]);
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
           ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

AVX2_ATTR static void avx2_axpy_f16(float *acc, float w, const uint16_t *v, size_t n) {
    __m256 wv = _mm256_set1_ps(w);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, vv, _mm256_loadu_ps(acc + i)));
    }
    for (; i < n; i++) acc[i] += w * fp16_to_fp32(v[i]);
}

AVX2_ATTR static void avx2_scale(float *acc, float s, size_t n) {
    __m256 sv = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), sv));
    for (; i < n; i++) acc[i] *= s;
}

static const attn_kernels avx2_kernels = {avx2_dot_f16, avx2_axpy_f16, avx2_scale};
#endif

static const attn_kernels *chosen = &ref_kernels;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void) {
#if defined(__x86_64__)
    if (avx2_cpu_supported()) chosen = &avx2_kernels;
#endif
}

const attn_kernels *attn_kernels_get(void) {
    pthread_once(&choose_once, choose);
    return chosen;
}

const attn_kernels *attn_kernels_ref(void) {
    return &ref_kernels;
}
