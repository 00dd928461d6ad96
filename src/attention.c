/*
 * attention.c — f16 K/V vector kernels for attention (see attention.h).
 * The scalar, AVX2 and NEON variants follow one order of float operations
 * (the reference's below: 8 lanes with fused multiply-add, a fixed tree to
 * sum them, the tail into lane 0), so they return the same bits on every
 * CPU.
 */
#include "attention.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fp16.h"
#include "kernels/kernels.h"

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
    for (; i < n; i++) lane[0] = __builtin_fmaf(q[i], fp16_to_fp32(k[i]), lane[0]);
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

static const attn_kernels avx2_kernels = {avx2_dot_f16,  avx2_axpy_f16,      avx2_scale,
                                          avx2_dot4_f16, avx2_axpy_rows_f16, avx2_scale_round_f16};
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

static const attn_kernels neon_kernels = {neon_dot_f16,  neon_axpy_f16,      neon_scale,
                                          neon_dot4_f16, neon_axpy_rows_f16, neon_scale_round_f16};
#endif

static const attn_kernels *chosen = &ref_kernels;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    const char *want = getenv("CELLM_KERNELS"); /* "ref": the scalar kernels, as quant.c */
    if (want && !strcmp(want, "ref")) return;
#if defined(__x86_64__)
    if (avx2_cpu_supported()) chosen = &avx2_kernels;
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
