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

static const attn_kernels ref_kernels = {ref_dot_f16,  ref_axpy_f16,      ref_scale,
                                         ref_dot4_f16, ref_axpy_rows_f16, ref_scale_round_f16};

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
    for (; i < n; i++) lane[0] += q[i] * fp16_to_fp32(k[i]);
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
           ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

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
    for (; i < n; i++) acc[i] += w * fp16_to_fp32(v[i]);
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

static const attn_kernels avx2_kernels = {avx2_dot_f16,  avx2_axpy_f16,      avx2_scale,
                                          avx2_dot4_f16, avx2_axpy_rows_f16, avx2_scale_round_f16};
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
