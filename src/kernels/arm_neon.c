/*
 * arm_neon.c — AArch64 NEON versions of the hot kernels: the A8
 * activation quantizer and the Q4_0, Q5_0, Q8_0 (against A8), Q4_1 (against
 * A8S), Q4_K
 * and Q6_K (against Q8_K) dot products. NEON is part of every AArch64 CPU; each dot
 * product also comes in a variant using the SDOT instruction (ARMv8.2
 * dotprod), compiled per function with a target attribute and chosen by
 * quant.c when neon_dotprod_supported() says the CPU has it.
 *
 * Agreement with the reference (ref.c), as for AVX2: the quantizer writes
 * the same bytes (FCVTAS rounds half away from zero, like roundf); the
 * K-quant dots sum each super-block exactly in integers and accumulate as
 * the reference does, so they return the same float; the 32-element dots
 * keep four float lanes and differ by float rounding only.
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <assert.h>
#include <stdbool.h>

#include "kernels/blocks.h"
#include "kernels/fp16.h"
#include "kernels/kernels.h"

#if defined(__linux__)
#include <sys/auxv.h>
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define DOTPROD __attribute__((target("dotprod")))
#else
#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

bool neon_dotprod_supported(void) {
#if defined(__ARM_FEATURE_DOTPROD)
    return true; /* the whole build already assumes it */
#elif defined(__linux__)
    /* HWCAP_ASIMDDP, bit 20 of AT_HWCAP on Linux and Android. */
    return (getauxval(AT_HWCAP) & (1ul << 20)) != 0;
#else
    return false; /* unknown OS: stay with plain NEON */
#endif
}

/* acc + the dot products of each group of four int8 lanes of a and b. */
static inline int32x4_t dot_plain(int32x4_t acc, int8x16_t a, int8x16_t b) {
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}

DOTPROD static inline int32x4_t dot_sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__clang__) && __clang_major__ < 16 && !defined(__ARM_FEATURE_DOTPROD)
    /* Older clang declares vdotq_s32 only when the whole build targets
     * dotprod; the instruction itself is fine in this function. */
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#else
    return vdotq_s32(acc, a, b);
#endif
}

typedef int32x4_t (*dot_fn)(int32x4_t, int8x16_t, int8x16_t);

/* An A8 row (kernels/blocks.h): the same bytes as ref_quantize_a8. */
void neon_quantize_a8(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    const size_t nb = n / QK8_0;
    float *ds = dst;
    int8_t *qs = (int8_t *)dst + 4 * nb;
    for (size_t ib = 0; ib < nb; ib++, src += QK8_0, qs += QK8_0) {
        float32x4_t v[8];
        float32x4_t amax = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(src + 4 * k);
            amax = vmaxnmq_f32(amax, vabsq_f32(v[k])); /* NaN ignored, as fmaxf */
        }
        const float d = vmaxnmvq_f32(amax) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        ds[ib] = fp16_to_fp32(fp32_to_fp16(d));
        int16x8_t h[4];
        for (int k = 0; k < 8; k += 2) {
            int32x4_t q[2];
            for (int i = 0; i < 2; i++) {
                float32x4_t s = vmulq_n_f32(v[k + i], id);
                s = vminnmq_f32(vmaxnmq_f32(s, vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f));
                q[i] = vcvtaq_s32_f32(s); /* round half away from zero */
            }
            h[k / 2] = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
        }
        vst1q_s8(qs, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
        vst1q_s8(qs + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
    }
}

/* Bodies shared by both variants; `dot` is a constant at every call, so
 * each wrapper gets its own inlined copy. */
static inline __attribute__((always_inline)) float q4_0_body(size_t n, const void *vx,
                                                             const void *vy, dot_fn dot) {
    assert(n % QK8_0 == 0);
    const block_q4_0 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy);
    const int8_t *yq = a8_codes(vy, nb);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (size_t ib = 0; ib < nb; ib++) {
        const uint8x16_t q = vld1q_u8(x[ib].qs);
        const int8x16_t lo =
            vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
        int32x4_t s = dot(vdupq_n_s32(0), lo, vld1q_s8(yq + 32 * ib));
        s = dot(s, hi, vld1q_s8(yq + 32 * ib + 16));
        const float d = fp16_to_fp32(x[ib].d) * yd[ib];
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), d);
    }
    return vaddvq_f32(acc);
}

/* Q4_1 against Q8_1: codes 0..15 are valid signed bytes; the min
 * multiplies the block sum s that Q8_1 stores. */
static inline __attribute__((always_inline)) float q4_1_body(size_t n, const void *vx,
                                                             const void *vy, dot_fn dot) {
    assert(n % QK8_0 == 0);
    const block_q4_1 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy), *ysum = a8s_sums(vy, nb);
    const int8_t *yq = a8s_codes(vy, nb);
    float32x4_t acc = vdupq_n_f32(0.0f);
    float mins = 0.0f;
    for (size_t ib = 0; ib < nb; ib++) {
        const uint8x16_t q = vld1q_u8(x[ib].qs);
        const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
        const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
        int32x4_t s = dot(vdupq_n_s32(0), lo, vld1q_s8(yq + 32 * ib));
        s = dot(s, hi, vld1q_s8(yq + 32 * ib + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), fp16_to_fp32(x[ib].d) * yd[ib]);
        mins = __builtin_fmaf(fp16_to_fp32(x[ib].m), ysum[ib], mins);
    }
    return vaddvq_f32(acc) + mins;
}

/* Q5_0: the fifth bit of element j is bit j of qh; test each byte of qh
 * against one bit per lane, then codes minus 16 are signed bytes. */
static inline __attribute__((always_inline)) float q5_0_body(size_t n, const void *vx,
                                                             const void *vy, dot_fn dot) {
    assert(n % QK8_0 == 0);
    const block_q5_0 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy);
    const int8_t *yq = a8_codes(vy, nb);
    static const uint8_t bit_of_lane[16] = {1, 2, 4, 8, 16, 32, 64, 128,
                                            1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t lane_bits = vld1q_u8(bit_of_lane);
    const uint8x16_t b4 = vdupq_n_u8(0x10);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (size_t ib = 0; ib < nb; ib++) {
        const uint8_t *qh = x[ib].qh;
        const uint8x16_t h0 = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
        const uint8x16_t h1 = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
        const uint8x16_t hb0 = vandq_u8(vtstq_u8(h0, lane_bits), b4);
        const uint8x16_t hb1 = vandq_u8(vtstq_u8(h1, lane_bits), b4);
        const uint8x16_t q = vld1q_u8(x[ib].qs);
        const int8x16_t lo = vsubq_s8(
            vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), hb0)), vdupq_n_s8(16));
        const int8x16_t hi =
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), hb1)), vdupq_n_s8(16));
        int32x4_t s = dot(vdupq_n_s32(0), lo, vld1q_s8(yq + 32 * ib));
        s = dot(s, hi, vld1q_s8(yq + 32 * ib + 16));
        const float d = fp16_to_fp32(x[ib].d) * yd[ib];
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), d);
    }
    return vaddvq_f32(acc);
}

static inline __attribute__((always_inline)) float q8_0_body(size_t n, const void *vx,
                                                             const void *vy, dot_fn dot) {
    assert(n % QK8_0 == 0);
    const block_q8_0 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy);
    const int8_t *yq = a8_codes(vy, nb);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (size_t ib = 0; ib < nb; ib++) {
        int32x4_t s = dot(vdupq_n_s32(0), vld1q_s8(x[ib].qs), vld1q_s8(yq + 32 * ib));
        s = dot(s, vld1q_s8(x[ib].qs + 16), vld1q_s8(yq + 32 * ib + 16));
        const float d = fp16_to_fp32(x[ib].d) * yd[ib];
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), d);
    }
    return vaddvq_f32(acc);
}

/* Q4_K: exact integer sum per super-block, then the reference's float
 * expression. Codes 0..15 are valid signed bytes, so no offset is needed. */
static inline __attribute__((always_inline)) float q4_k_body(size_t n, const void *vx,
                                                             const void *vy, dot_fn dot) {
    assert(n % QK_K == 0);
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int isum = 0, msum = 0;
        for (int c = 0; c < 4; c++) {
            const uint8x16_t q0 = vld1q_u8(x[ib].qs + 32 * c);
            const uint8x16_t q1 = vld1q_u8(x[ib].qs + 32 * c + 16);
            const int8_t *q8 = y[ib].qs + 64 * c;
            const int8x16_t m4 = vdupq_n_s8(0x0F);
            int32x4_t lo = dot(vdupq_n_s32(0), vandq_s8(vreinterpretq_s8_u8(q0), m4), vld1q_s8(q8));
            lo = dot(lo, vandq_s8(vreinterpretq_s8_u8(q1), m4), vld1q_s8(q8 + 16));
            int32x4_t hi =
                dot(vdupq_n_s32(0), vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vld1q_s8(q8 + 32));
            hi = dot(hi, vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), vld1q_s8(q8 + 48));
            int sc0, m0, sc1, m1;
            kq_scale_min(2 * c, x[ib].scales, &sc0, &m0);
            kq_scale_min(2 * c + 1, x[ib].scales, &sc1, &m1);
            isum += sc0 * vaddvq_s32(lo) + sc1 * vaddvq_s32(hi);
            msum += m0 * (y[ib].bsums[4 * c] + y[ib].bsums[4 * c + 1]) +
                    m1 * (y[ib].bsums[4 * c + 2] + y[ib].bsums[4 * c + 3]);
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum -
               y[ib].d * fp16_to_fp32(x[ib].dmin) * (float)msum;
    }
    return sum;
}

/* Q6_K: codes minus 32 fit a signed byte; groups of 16 are one vector. */
static inline __attribute__((always_inline)) float q6_k_body(size_t n, const void *vx,
                                                             const void *vy, dot_fn dot) {
    assert(n % QK_K == 0);
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int isum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[ib].ql + 64 * h, *qh = x[ib].qh + 32 * h;
            const int8_t *sc = x[ib].scales + 8 * h, *q8 = y[ib].qs + 128 * h;
            for (int j = 0; j < 2; j++) {
                const uint8x16_t qa = vld1q_u8(ql + 16 * j), qb = vld1q_u8(ql + 32 + 16 * j);
                const uint8x16_t hv = vld1q_u8(qh + 16 * j);
                uint8x16_t v[4];
                v[0] = vorrq_u8(vandq_u8(qa, m4), vshlq_n_u8(vandq_u8(hv, m2), 4));
                v[1] = vorrq_u8(vandq_u8(qb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hv, 2), m2), 4));
                v[2] = vorrq_u8(vshrq_n_u8(qa, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hv, 4), m2), 4));
                v[3] = vorrq_u8(vshrq_n_u8(qb, 4), vshlq_n_u8(vshrq_n_u8(hv, 6), 4));
                for (int k = 0; k < 4; k++) {
                    const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(v[k]), off);
                    const int32x4_t s = dot(vdupq_n_s32(0), q, vld1q_s8(q8 + 32 * k + 16 * j));
                    isum += sc[2 * k + j] * vaddvq_s32(s);
                }
            }
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum;
    }
    return sum;
}

float neon_vec_dot_q4_0_a8(size_t n, const void *x, const void *y) {
    return q4_0_body(n, x, y, dot_plain);
}
float neon_vec_dot_q4_1_a8s(size_t n, const void *x, const void *y) {
    return q4_1_body(n, x, y, dot_plain);
}
float neon_vec_dot_q5_0_a8(size_t n, const void *x, const void *y) {
    return q5_0_body(n, x, y, dot_plain);
}
float neon_vec_dot_q8_0_a8(size_t n, const void *x, const void *y) {
    return q8_0_body(n, x, y, dot_plain);
}
float neon_vec_dot_q4_k_q8_k(size_t n, const void *x, const void *y) {
    return q4_k_body(n, x, y, dot_plain);
}
float neon_vec_dot_q6_k_q8_k(size_t n, const void *x, const void *y) {
    return q6_k_body(n, x, y, dot_plain);
}

DOTPROD float neon_dotprod_vec_dot_q4_0_a8(size_t n, const void *x, const void *y) {
    return q4_0_body(n, x, y, dot_sdot);
}
DOTPROD float neon_dotprod_vec_dot_q4_1_a8s(size_t n, const void *x, const void *y) {
    return q4_1_body(n, x, y, dot_sdot);
}
DOTPROD float neon_dotprod_vec_dot_q5_0_a8(size_t n, const void *x, const void *y) {
    return q5_0_body(n, x, y, dot_sdot);
}
DOTPROD float neon_dotprod_vec_dot_q8_0_a8(size_t n, const void *x, const void *y) {
    return q8_0_body(n, x, y, dot_sdot);
}
DOTPROD float neon_dotprod_vec_dot_q4_k_q8_k(size_t n, const void *x, const void *y) {
    return q4_k_body(n, x, y, dot_sdot);
}
DOTPROD float neon_dotprod_vec_dot_q6_k_q8_k(size_t n, const void *x, const void *y) {
    return q6_k_body(n, x, y, dot_sdot);
}

#endif /* __aarch64__ */
