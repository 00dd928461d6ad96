/*
 * ref.c — the scalar reference kernels: dequantize, quantize and dot
 * product for every type the table covers. These are the truth: the tests
 * check dequantization bit for bit against GGML's published layouts (via
 * fixtures made with the `gguf` Python package), and every SIMD kernel is
 * tested against these. Plain C11, no intrinsics, written for clarity
 * before speed.
 *
 * Quantizers: the legacy 32-element types (Q4_0 … Q8_0) follow GGML's
 * reference rounding exactly, so files we write match llama.cpp's byte for
 * byte. The K-quants and IQ4 quantizers are our own least-squares fits
 * (search a few scales per group, refit, then quantize the group scales);
 * they meet llama.cpp's round-trip error bounds but do not reproduce its
 * bytes. Q8_K is an activation format only and never leaves memory.
 *
 * Dot products sum exact integer products per block and scale them in
 * float. Where a SIMD variant exists, the reference fixes the order of every
 * float operation (see "Dot products" below) and each variant follows it
 * exactly, so a dot product returns the same bits on every CPU: x86-64
 * (scalar, AVX2, AVX-512) and AArch64 (NEON with or without SDOT).
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "format/kernels/blocks.h"
#include "format/kernels/fp16.h"
#include "format/kernels/kernels.h"

/* Clang contracts a*b+c into an FMA by default; the reference must round
 * every operation as written to match the fixtures. (GCC in ISO C mode
 * never contracts.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

static inline float clampf(float v, float lo, float hi) {
    return fminf(fmaxf(v, lo), hi); /* NaN becomes lo */
}

/* Round half away from zero to an int in [lo, hi] (C's roundf). */
static inline int round_clamp(float v, int lo, int hi) {
    return (int)roundf(clampf(v, (float)lo, (float)hi));
}

static inline uint32_t read_u32le(const uint8_t b[4]) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* The 16 signed scales (-32..31) of a Q3_K block. */
static void q3k_scales(const uint8_t *s, int out[16]) {
    for (int g = 0; g < 16; g++) {
        int lo = (s[g % 8] >> (4 * (g / 8))) & 0xF;
        int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        out[g] = (lo | hi << 4) - 32;
    }
}

/* ================================================================ */
/* Dequantize                                                        */
/* ================================================================ */

void ref_dequantize_f32(const void *src, float *dst, size_t n) {
    memcpy(dst, src, n * sizeof(float));
}

void ref_dequantize_f16(const void *src, float *dst, size_t n) {
    const uint16_t *x = src;
    for (size_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(x[i]);
}

void ref_dequantize_bf16(const void *src, float *dst, size_t n) {
    const uint16_t *x = src;
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(x[i]);
}

void ref_dequantize_q4_0(const void *src, float *dst, size_t n) {
    assert(n % QK4_0 == 0);
    const block_q4_0 *x = src;
    for (size_t ib = 0; ib < n / QK4_0; ib++, dst += QK4_0) {
        const float d = fp16_to_fp32(x[ib].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j] = d * (float)((x[ib].qs[j] & 0xF) - 8);
            dst[j + 16] = d * (float)((x[ib].qs[j] >> 4) - 8);
        }
    }
}

void ref_dequantize_q4_1(const void *src, float *dst, size_t n) {
    assert(n % QK4_1 == 0);
    const block_q4_1 *x = src;
    for (size_t ib = 0; ib < n / QK4_1; ib++, dst += QK4_1) {
        const float d = fp16_to_fp32(x[ib].d), m = fp16_to_fp32(x[ib].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j] = d * (float)(x[ib].qs[j] & 0xF) + m;
            dst[j + 16] = d * (float)(x[ib].qs[j] >> 4) + m;
        }
    }
}

void ref_dequantize_q5_0(const void *src, float *dst, size_t n) {
    assert(n % QK5_0 == 0);
    const block_q5_0 *x = src;
    for (size_t ib = 0; ib < n / QK5_0; ib++, dst += QK5_0) {
        const float d = fp16_to_fp32(x[ib].d);
        const uint32_t qh = read_u32le(x[ib].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            int q0 = (x[ib].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            int q1 = (x[ib].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = d * (float)(q0 - 16);
            dst[j + 16] = d * (float)(q1 - 16);
        }
    }
}

void ref_dequantize_q5_1(const void *src, float *dst, size_t n) {
    assert(n % QK5_1 == 0);
    const block_q5_1 *x = src;
    for (size_t ib = 0; ib < n / QK5_1; ib++, dst += QK5_1) {
        const float d = fp16_to_fp32(x[ib].d), m = fp16_to_fp32(x[ib].m);
        const uint32_t qh = read_u32le(x[ib].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            int q0 = (x[ib].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            int q1 = (x[ib].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = d * (float)q0 + m;
            dst[j + 16] = d * (float)q1 + m;
        }
    }
}

void ref_dequantize_q8_0(const void *src, float *dst, size_t n) {
    assert(n % QK8_0 == 0);
    const block_q8_0 *x = src;
    for (size_t ib = 0; ib < n / QK8_0; ib++, dst += QK8_0) {
        const float d = fp16_to_fp32(x[ib].d);
        for (int j = 0; j < QK8_0; j++) dst[j] = (float)x[ib].qs[j] * d;
    }
}

void ref_dequantize_q8_1(const void *src, float *dst, size_t n) {
    assert(n % QK8_0 == 0);
    const block_q8_1 *x = src;
    for (size_t ib = 0; ib < n / QK8_0; ib++, dst += QK8_0) {
        const float d = fp16_to_fp32(x[ib].d);
        for (int j = 0; j < QK8_0; j++) dst[j] = (float)x[ib].qs[j] * d;
    }
}

static void dequantize_a8_row(const float *d, const int8_t *q, float *dst, size_t nb) {
    for (size_t ib = 0; ib < nb; ib++, dst += QK8_0, q += QK8_0)
        for (int j = 0; j < QK8_0; j++) dst[j] = (float)q[j] * d[ib];
}

void ref_dequantize_a8(const void *src, float *dst, size_t n) {
    assert(n % QK8_0 == 0);
    dequantize_a8_row(a8_scales(src), a8_codes(src, n / QK8_0), dst, n / QK8_0);
}

void ref_dequantize_a8s(const void *src, float *dst, size_t n) {
    assert(n % QK8_0 == 0);
    dequantize_a8_row(a8_scales(src), a8s_codes(src, n / QK8_0), dst, n / QK8_0);
}

void ref_dequantize_q2_k(const void *src, float *dst, size_t n) {
    assert(n % QK_K == 0);
    const block_q2_K *x = src;
    for (size_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = fp16_to_fp32(x[ib].d), dmin = fp16_to_fp32(x[ib].dmin);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e / 32) % 4, l = e % 32, g = e / 16;
            const float dl = d * (float)(x[ib].scales[g] & 0xF);
            const float ml = dmin * (float)(x[ib].scales[g] >> 4);
            dst[e] = dl * (float)((x[ib].qs[32 * h + l] >> (2 * s)) & 3) - ml;
        }
    }
}

void ref_dequantize_q3_k(const void *src, float *dst, size_t n) {
    assert(n % QK_K == 0);
    const block_q3_K *x = src;
    for (size_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = fp16_to_fp32(x[ib].d);
        int sc[16];
        q3k_scales(x[ib].scales, sc);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e / 32) % 4, l = e % 32;
            const int lo = (x[ib].qs[32 * h + l] >> (2 * s)) & 3;
            const int hi = (x[ib].hmask[l] >> (e / 32)) & 1;
            const float dl = d * (float)sc[e / 16];
            dst[e] = dl * (float)(lo - (hi ? 0 : 4));
        }
    }
}

void ref_dequantize_q4_k(const void *src, float *dst, size_t n) {
    assert(n % QK_K == 0);
    const block_q4_K *x = src;
    for (size_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = fp16_to_fp32(x[ib].d), dmin = fp16_to_fp32(x[ib].dmin);
        for (int g = 0; g < 8; g++) {
            int sc, m;
            kq_scale_min(g, x[ib].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = x[ib].qs + 32 * (g / 2);
            const int shift = 4 * (g % 2);
            for (int l = 0; l < 32; l++) dst[32 * g + l] = dl * (float)((q[l] >> shift) & 0xF) - ml;
        }
    }
}

void ref_dequantize_q5_k(const void *src, float *dst, size_t n) {
    assert(n % QK_K == 0);
    const block_q5_K *x = src;
    for (size_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = fp16_to_fp32(x[ib].d), dmin = fp16_to_fp32(x[ib].dmin);
        for (int g = 0; g < 8; g++) {
            int sc, m;
            kq_scale_min(g, x[ib].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = x[ib].qs + 32 * (g / 2);
            const int shift = 4 * (g % 2);
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 0xF) | ((x[ib].qh[l] >> g) & 1) << 4;
                dst[32 * g + l] = dl * (float)v - ml;
            }
        }
    }
}

/* The 6-bit value (0..63) of element e of a Q6_K block. */
static inline int q6k_value(const block_q6_K *b, int e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t lo = b->ql[64 * h + l + 32 * (k & 1)];
    const int low = k < 2 ? (lo & 0xF) : (lo >> 4);
    const int high = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return low | high << 4;
}

void ref_dequantize_q6_k(const void *src, float *dst, size_t n) {
    assert(n % QK_K == 0);
    const block_q6_K *x = src;
    for (size_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = fp16_to_fp32(x[ib].d);
        for (int e = 0; e < QK_K; e++) {
            const float dl = d * (float)x[ib].scales[e / 16];
            dst[e] = dl * (float)(q6k_value(&x[ib], e) - 32);
        }
    }
}

void ref_dequantize_q8_k(const void *src, float *dst, size_t n) {
    assert(n % QK_K == 0);
    const block_q8_K *x = src;
    for (size_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        for (int j = 0; j < QK_K; j++) dst[j] = x[ib].d * (float)x[ib].qs[j];
    }
}

void ref_dequantize_iq4_nl(const void *src, float *dst, size_t n) {
    assert(n % QK4_NL == 0);
    const block_iq4_nl *x = src;
    for (size_t ib = 0; ib < n / QK4_NL; ib++, dst += QK4_NL) {
        const float d = fp16_to_fp32(x[ib].d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            dst[j] = d * (float)iq4nl_values[x[ib].qs[j] & 0xF];
            dst[j + 16] = d * (float)iq4nl_values[x[ib].qs[j] >> 4];
        }
    }
}

/* The 6-bit scale (0..63, 32 means zero) of group g of an IQ4_XS block. */
static inline int iq4xs_scale(const block_iq4_xs *b, int g) {
    const int lo = (b->scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
    const int hi = (b->scales_h >> (2 * g)) & 3;
    return lo | hi << 4;
}

void ref_dequantize_iq4_xs(const void *src, float *dst, size_t n) {
    assert(n % QK_K == 0);
    const block_iq4_xs *x = src;
    for (size_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = fp16_to_fp32(x[ib].d);
        for (int g = 0; g < 8; g++) {
            const float dl = d * (float)(iq4xs_scale(&x[ib], g) - 32);
            const uint8_t *q = x[ib].qs + 16 * g;
            for (int j = 0; j < 16; j++) {
                dst[32 * g + j] = dl * (float)iq4nl_values[q[j] & 0xF];
                dst[32 * g + j + 16] = dl * (float)iq4nl_values[q[j] >> 4];
            }
        }
    }
}

/* ================================================================ */
/* Quantize                                                          */
/* ================================================================ */

void ref_quantize_f32(const float *src, void *dst, size_t n) {
    memcpy(dst, src, n * sizeof(float));
}

void ref_quantize_f16(const float *src, void *dst, size_t n) {
    uint16_t *y = dst;
    for (size_t i = 0; i < n; i++) y[i] = fp32_to_fp16(src[i]);
}

void ref_quantize_bf16(const float *src, void *dst, size_t n) {
    uint16_t *y = dst;
    for (size_t i = 0; i < n; i++) y[i] = fp32_to_bf16(src[i]);
}

/* The element of largest magnitude (the first one on ties), with its sign. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *lo, float *hi) {
    *lo = *hi = x[0];
    for (int j = 1; j < n; j++) {
        *lo = fminf(*lo, x[j]);
        *hi = fmaxf(*hi, x[j]);
    }
}

/* GGML's rounding for the legacy types: the largest-magnitude element maps
 * to the most negative level; others truncate after adding half a level
 * plus the offset. The clamps keep NaN and stray values in range. */
void ref_quantize_q4_0(const float *src, void *dst, size_t n) {
    assert(n % QK4_0 == 0);
    block_q4_0 *y = dst;
    for (size_t ib = 0; ib < n / QK4_0; ib++, src += QK4_0) {
        const float d = signed_absmax(src, QK4_0) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            const int q0 = (int)clampf(src[j] * id + 8.5f, 0.0f, 15.0f);
            const int q1 = (int)clampf(src[j + 16] * id + 8.5f, 0.0f, 15.0f);
            y[ib].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void ref_quantize_q4_1(const float *src, void *dst, size_t n) {
    assert(n % QK4_1 == 0);
    block_q4_1 *y = dst;
    for (size_t ib = 0; ib < n / QK4_1; ib++, src += QK4_1) {
        float lo, hi;
        min_max(src, QK4_1, &lo, &hi);
        const float d = (hi - lo) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = fp32_to_fp16(d);
        y[ib].m = fp32_to_fp16(lo);
        for (int j = 0; j < 16; j++) {
            const int q0 = (int)clampf((src[j] - lo) * id + 0.5f, 0.0f, 15.0f);
            const int q1 = (int)clampf((src[j + 16] - lo) * id + 0.5f, 0.0f, 15.0f);
            y[ib].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void store_u32le(uint8_t b[4], uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}

void ref_quantize_q5_0(const float *src, void *dst, size_t n) {
    assert(n % QK5_0 == 0);
    block_q5_0 *y = dst;
    for (size_t ib = 0; ib < n / QK5_0; ib++, src += QK5_0) {
        const float d = signed_absmax(src, QK5_0) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = (int)clampf(src[j] * id + 16.5f, 0.0f, 31.0f);
            const int q1 = (int)clampf(src[j + 16] * id + 16.5f, 0.0f, 31.0f);
            y[ib].qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(y[ib].qh, qh);
    }
}

void ref_quantize_q3_0(const float *src, void *dst, size_t n) {
    assert(n % QK3_0 == 0);
    block_q3_0 *y = dst;
    for (size_t ib = 0; ib < n / QK3_0; ib++, src += QK3_0) {
        const float d = signed_absmax(src, QK3_0) / -4.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = fp32_to_fp16(d);
        uint32_t qh = 0;
        memset(y[ib].qs, 0, sizeof y[ib].qs);
        for (int j = 0; j < QK3_0; j++) {
            const int q = (int)clampf(src[j] * id + 4.5f, 0.0f, 7.0f);
            y[ib].qs[j % 8] |= (uint8_t)((q & 3) << (2 * (j / 8)));
            qh |= (uint32_t)(q >> 2) << j;
        }
        store_u32le(y[ib].qh, qh);
    }
}

void ref_quantize_q5_1(const float *src, void *dst, size_t n) {
    assert(n % QK5_1 == 0);
    block_q5_1 *y = dst;
    for (size_t ib = 0; ib < n / QK5_1; ib++, src += QK5_1) {
        float lo, hi;
        min_max(src, QK5_1, &lo, &hi);
        const float d = (hi - lo) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = fp32_to_fp16(d);
        y[ib].m = fp32_to_fp16(lo);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = (int)clampf((src[j] - lo) * id + 0.5f, 0.0f, 31.0f);
            const int q1 = (int)clampf((src[j + 16] - lo) * id + 0.5f, 0.0f, 31.0f);
            y[ib].qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(y[ib].qh, qh);
    }
}

void ref_quantize_q8_0(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    block_q8_0 *y = dst;
    for (size_t ib = 0; ib < n / QK8_0; ib++, src += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[ib].qs[j] = (int8_t)round_clamp(src[j] * id, -127, 127);
    }
}

/* Q8_0's codes and scale, plus the F16 s = d * sum(codes) with the F32 d. */
void ref_quantize_q8_1(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    block_q8_1 *y = dst;
    for (size_t ib = 0; ib < n / QK8_0; ib++, src += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) {
            y[ib].qs[j] = (int8_t)round_clamp(src[j] * id, -127, 127);
            sum += y[ib].qs[j];
        }
        y[ib].d = fp32_to_fp16(d);
        y[ib].s = fp32_to_fp16(d * (float)sum);
    }
}

/* A8 (sums NULL) and A8S rows: Q8_0's codes and scale (rounded through
 * F16, as GGML computes with it), and Q8_1's F16 block sum. */
static void quantize_a8_row(const float *src, float *d_out, float *s_out, int8_t *q, size_t nb) {
    for (size_t ib = 0; ib < nb; ib++, src += QK8_0, q += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) {
            q[j] = (int8_t)round_clamp(src[j] * id, -127, 127);
            sum += q[j];
        }
        d_out[ib] = fp16_to_fp32(fp32_to_fp16(d));
        if (s_out) s_out[ib] = fp16_to_fp32(fp32_to_fp16(d * (float)sum));
    }
}

void ref_quantize_a8(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    const size_t nb = n / QK8_0;
    quantize_a8_row(src, dst, NULL, (int8_t *)dst + 4 * nb, nb);
}

void ref_quantize_a8s(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    const size_t nb = n / QK8_0;
    quantize_a8_row(src, dst, (float *)dst + nb, (int8_t *)dst + 8 * nb, nb);
}

/* Same rounding as Q8_0 (so the activation quantizers agree), with a float
 * scale and the group sums the K-quant dot products need. */
void ref_quantize_q8_k(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_q8_K *y = dst;
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = d;
        for (int j = 0; j < QK_K; j++) y[ib].qs[j] = (int8_t)round_clamp(src[j] * id, -127, 127);
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[ib].qs[16 * g + l];
            y[ib].bsums[g] = (int16_t)sum;
        }
    }
}

/* ---- fitting helpers for the K-quants and IQ4 ---- */

/* Levels for x with the final (stored) scale and min, which differ from the
 * fitted ones after the group scales are quantized. */
static void levels_affine(const float *x, int n, int nmax, float d, float m, uint8_t *L) {
    for (int j = 0; j < n; j++)
        L[j] = d != 0.0f ? (uint8_t)round_clamp((x[j] + m) / d, 0, nmax) : 0;
}

static void levels_symmetric(const float *x, int n, int nmax, float d, uint8_t *L) {
    for (int j = 0; j < n; j++) {
        const int q = d != 0.0f ? round_clamp(x[j] / d, -nmax, nmax - 1) : 0;
        L[j] = (uint8_t)(q + nmax);
    }
}

/* Fits x[0..n) ≈ scale * L - min with L in 0..nmax and min >= 0, which is
 * how Q2_K, Q4_K and Q5_K store a group. Tries a range of scales around
 * the min-max one, refits scale and min by least squares for each
 * assignment of levels, and keeps the fit with the smallest squared error.
 * Writes the levels to L, returns the scale and sets *min. */
static float fit_affine(const float *x, int n, int nmax, uint8_t *L, float *min) {
    float lo, hi;
    min_max(x, n, &lo, &hi);
    if (lo > 0.0f) lo = 0.0f; /* the stored min is subtracted, so it is <= 0 in x */
    if (!(hi > lo)) {
        memset(L, 0, (size_t)n);
        *min = -lo;
        return 0.0f;
    }
    /* Start from the plain min-max fit; the search below only improves it. */
    float best_err = INFINITY, best_scale = (hi - lo) / (float)nmax, best_off = lo;
    levels_affine(x, n, nmax, best_scale, -lo, L);
    uint8_t Lt[32];
    assert(n <= 32);
    for (int step = -10; step <= 10; step++) {
        const float iscale = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        double sl = 0, sl2 = 0, sx = 0, slx = 0;
        for (int j = 0; j < n; j++) {
            Lt[j] = (uint8_t)round_clamp(iscale * (x[j] - lo), 0, nmax);
            sl += Lt[j];
            sl2 += (double)Lt[j] * Lt[j];
            sx += x[j];
            slx += (double)Lt[j] * x[j];
        }
        /* Least squares for x ≈ a*L + b, then force b <= 0. */
        double a, b;
        const double det = n * sl2 - sl * sl;
        if (det > 0) {
            a = (n * slx - sl * sx) / det;
            b = (sl2 * sx - sl * slx) / det;
        } else {
            a = 0;
            b = sx / n;
        }
        if (b > 0) {
            b = 0;
            a = sl2 > 0 ? slx / sl2 : 0;
        }
        if (a < 0) continue;
        double err = 0;
        for (int j = 0; j < n; j++) {
            const double e = a * Lt[j] + b - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = (float)err;
            best_scale = (float)a;
            best_off = (float)b;
            memcpy(L, Lt, (size_t)n);
        }
    }
    *min = -best_off;
    return best_scale;
}

/* Fits x[0..n) ≈ scale * L with L in -nmax..nmax-1 (the asymmetric range
 * of Q3_K and Q6_K): the largest-magnitude element maps near -nmax, a few
 * nearby scales are tried, each refit by least squares. Writes L + nmax
 * (0..2*nmax-1) to L when L is not NULL and returns the (signed) scale. */
static float fit_symmetric(const float *x, int n, int nmax, uint8_t *L) {
    const float max = signed_absmax(x, n);
    if (max == 0.0f) {
        if (L) memset(L, (uint8_t)nmax, (size_t)n);
        return 0.0f;
    }
    double best = -1, best_scale = 0;
    int Lt[32];
    assert(n <= 32);
    for (int step = -9; step <= 9; step++) {
        const float iscale = -((float)nmax + 0.1f * (float)step) / max;
        double sxl = 0, sl2 = 0;
        for (int j = 0; j < n; j++) {
            Lt[j] = round_clamp(iscale * x[j], -nmax, nmax - 1);
            sxl += (double)x[j] * Lt[j];
            sl2 += (double)Lt[j] * Lt[j];
        }
        /* Squared error is sum(x^2) - sxl^2/sl2: maximise the second term. */
        if (sl2 > 0 && sxl * sxl / sl2 > best) {
            best = sxl * sxl / sl2;
            best_scale = sxl / sl2;
            if (L) {
                for (int j = 0; j < n; j++) L[j] = (uint8_t)(Lt[j] + nmax);
            }
        }
    }
    return (float)best_scale;
}

/* Quantizes non-negative group values v[0..n) to 0..qmax with one scale;
 * returns the scale (as stored, F16-rounded) and writes the codes. */
static float quantize_group_scales(const float *v, int n, int qmax, uint16_t *d16, uint8_t *q) {
    float max = 0.0f;
    for (int j = 0; j < n; j++) max = fmaxf(max, v[j]);
    const float inv = max > 0.0f ? (float)qmax / max : 0.0f;
    for (int j = 0; j < n; j++) q[j] = (uint8_t)round_clamp(inv * v[j], 0, qmax);
    *d16 = fp32_to_fp16(max / (float)qmax);
    return fp16_to_fp32(*d16);
}

void ref_quantize_q2_k(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_q2_K *y = dst;
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        float scales[16], mins[16];
        uint8_t L[QK_K], ls[16], lm[16];
        for (int g = 0; g < 16; g++)
            scales[g] = fit_affine(src + 16 * g, 16, 3, L + 16 * g, &mins[g]);
        const float d = quantize_group_scales(scales, 16, 15, &y[ib].d, ls);
        const float dmin = quantize_group_scales(mins, 16, 15, &y[ib].dmin, lm);
        for (int g = 0; g < 16; g++) {
            y[ib].scales[g] = (uint8_t)(ls[g] | lm[g] << 4);
            levels_affine(src + 16 * g, 16, 3, d * (float)ls[g], dmin * (float)lm[g], L + 16 * g);
        }
        memset(y[ib].qs, 0, sizeof y[ib].qs);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e / 32) % 4, l = e % 32;
            y[ib].qs[32 * h + l] |= (uint8_t)(L[e] << (2 * s));
        }
    }
}

void ref_quantize_q3_k(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_q3_K *y = dst;
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        float scales[16];
        uint8_t L[QK_K], ls[16];
        for (int g = 0; g < 16; g++) scales[g] = fit_symmetric(src + 16 * g, 16, 4, NULL);
        /* The group scales themselves: 6-bit signed, -32..31. */
        y[ib].d = fp32_to_fp16(fit_symmetric(scales, 16, 32, ls));
        const float d = fp16_to_fp32(y[ib].d);
        memset(y[ib].scales, 0, sizeof y[ib].scales);
        for (int g = 0; g < 16; g++) {
            y[ib].scales[g % 8] |= (uint8_t)((ls[g] & 0xF) << (4 * (g / 8)));
            y[ib].scales[8 + g % 4] |= (uint8_t)((ls[g] >> 4) << (2 * (g / 4)));
            levels_symmetric(src + 16 * g, 16, 4, d * (float)(ls[g] - 32), L + 16 * g);
        }
        memset(y[ib].qs, 0, sizeof y[ib].qs);
        memset(y[ib].hmask, 0, sizeof y[ib].hmask);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e / 32) % 4, l = e % 32;
            y[ib].qs[32 * h + l] |= (uint8_t)((L[e] & 3) << (2 * s));
            y[ib].hmask[l] |= (uint8_t)((L[e] >> 2) << (e / 32));
        }
    }
}

/* Q4_K and Q5_K share everything but the level count and the bit layout. */
static void quantize_q45_k(const float *src, uint16_t *d16, uint16_t *dmin16, uint8_t *packed,
                           int nmax, uint8_t L[QK_K]) {
    float scales[8], mins[8];
    uint8_t ls[8], lm[8];
    for (int g = 0; g < 8; g++)
        scales[g] = fit_affine(src + 32 * g, 32, nmax, L + 32 * g, &mins[g]);
    const float d = quantize_group_scales(scales, 8, 63, d16, ls);
    const float dmin = quantize_group_scales(mins, 8, 63, dmin16, lm);
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        packed[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        packed[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | (lm[j + 4] & 0xF) << 4);
    }
    for (int g = 0; g < 8; g++) {
        levels_affine(src + 32 * g, 32, nmax, d * (float)ls[g], dmin * (float)lm[g], L + 32 * g);
    }
}

void ref_quantize_q4_k(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_q4_K *y = dst;
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        uint8_t L[QK_K];
        quantize_q45_k(src, &y[ib].d, &y[ib].dmin, y[ib].scales, 15, L);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                y[ib].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
            }
        }
    }
}

void ref_quantize_q5_k(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_q5_K *y = dst;
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        uint8_t L[QK_K];
        quantize_q45_k(src, &y[ib].d, &y[ib].dmin, y[ib].scales, 31, L);
        memset(y[ib].qh, 0, sizeof y[ib].qh);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const uint8_t a = L[64 * c + l], b = L[64 * c + 32 + l];
                y[ib].qs[32 * c + l] = (uint8_t)((a & 0xF) | (b & 0xF) << 4);
                y[ib].qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1));
            }
        }
    }
}

void ref_quantize_q6_k(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_q6_K *y = dst;
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        float scales[16], amax = 0.0f;
        uint8_t L[QK_K];
        for (int g = 0; g < 16; g++) {
            scales[g] = fit_symmetric(src + 16 * g, 16, 32, NULL);
            amax = fmaxf(amax, fabsf(scales[g]));
        }
        /* Group scales are int8: symmetric, -127..127. */
        y[ib].d = fp32_to_fp16(amax / 127.0f);
        const float d = fp16_to_fp32(y[ib].d);
        for (int g = 0; g < 16; g++) {
            const int ls = d != 0.0f ? round_clamp(scales[g] / d, -127, 127) : 0;
            y[ib].scales[g] = (int8_t)ls;
            levels_symmetric(src + 16 * g, 16, 32, d * (float)ls, L + 16 * g);
        }
        memset(y[ib].qh, 0, sizeof y[ib].qh);
        for (int h = 0; h < 2; h++) {
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
                y[ib].ql[64 * h + l] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
                y[ib].ql[64 * h + l + 32] = (uint8_t)((q2 & 0xF) | (q4 & 0xF) << 4);
                y[ib].qh[32 * h + l] =
                    (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}

/* Index of the IQ4 level nearest to v (v in units of the block scale). */
static int iq4_nearest(float v) {
    int best = 0;
    float best_err = fabsf(v - (float)iq4nl_values[0]);
    for (int k = 1; k < 16; k++) {
        const float err = fabsf(v - (float)iq4nl_values[k]);
        if (err < best_err) {
            best_err = err;
            best = k;
        }
    }
    return best;
}

/* Fits x[0..n) ≈ scale * iq4nl_values[L]: the largest-magnitude element
 * maps near the -127 end, nearby scales are tried, each refit by least
 * squares. Returns the signed scale. */
static float fit_iq4(const float *x, int n) {
    const float max = signed_absmax(x, n);
    if (max == 0.0f) return 0.0f;
    double best = -1, best_scale = 0;
    for (int step = -7; step <= 7; step++) {
        const float iscale = ((float)step + (float)iq4nl_values[0]) / max;
        double sxq = 0, sq2 = 0;
        for (int j = 0; j < n; j++) {
            const double q = iq4nl_values[iq4_nearest(iscale * x[j])];
            sxq += x[j] * q;
            sq2 += q * q;
        }
        if (sq2 > 0 && sxq * sxq / sq2 > best) {
            best = sxq * sxq / sq2;
            best_scale = sxq / sq2;
        }
    }
    return (float)best_scale;
}

/* Nibble-packs the IQ4 levels of 32 elements of x at scale d. */
static void iq4_pack(const float *x, float d, uint8_t qs[16]) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)(iq4_nearest(x[j] * id) | iq4_nearest(x[j + 16] * id) << 4);
    }
}

void ref_quantize_iq4_nl(const float *src, void *dst, size_t n) {
    assert(n % QK4_NL == 0);
    block_iq4_nl *y = dst;
    for (size_t ib = 0; ib < n / QK4_NL; ib++, src += QK4_NL) {
        y[ib].d = fp32_to_fp16(fit_iq4(src, QK4_NL));
        iq4_pack(src, fp16_to_fp32(y[ib].d), y[ib].qs);
    }
}

void ref_quantize_iq4_xs(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_iq4_xs *y = dst;
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        float scales[8];
        for (int g = 0; g < 8; g++) scales[g] = fit_iq4(src + 32 * g, 32);
        /* Group scales are 6-bit signed (-32..31): the largest maps to -32. */
        const float max = signed_absmax(scales, 8);
        y[ib].d = fp32_to_fp16(max / -32.0f);
        const float d = fp16_to_fp32(y[ib].d);
        y[ib].scales_h = 0;
        memset(y[ib].scales_l, 0, sizeof y[ib].scales_l);
        for (int g = 0; g < 8; g++) {
            const int ls = d != 0.0f ? round_clamp(scales[g] / d, -32, 31) : 0;
            const int u = ls + 32;
            y[ib].scales_l[g / 2] |= (uint8_t)((u & 0xF) << (4 * (g % 2)));
            y[ib].scales_h |= (uint16_t)((u >> 4) << (2 * g));
            iq4_pack(src + 32 * g, d * (float)ls, y[ib].qs + 16 * g);
        }
    }
}

/* ================================================================ */
/* Dot products                                                      */
/* ================================================================ */

/* F32 and BF16 accumulate in double: no SIMD variant, so the order is
 * simply this loop's. */
float ref_vec_dot_f32(size_t n, const void *x, const void *y) {
    const float *a = x, *b = y;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)a[i] * b[i];
    return (float)sum;
}

/* F16: the canonical order of every variant. The product of two F16
 * values is exact in float, so fused or not it is added with one rounding.
 * Elements i + l of each chunk of 16 go to lane l (0..15); a last chunk of
 * 8 goes to lanes 0..7; the lanes are folded v[l] = lane[l] + lane[l + 8]
 * and summed as ((v0+v4)+(v2+v6))+((v1+v5)+(v3+v7)) (fold8 below); the
 * remaining n % 8 products are then added one at a time. */
static float fold8(const float v[8]) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

float ref_vec_dot_f16(size_t n, const void *x, const void *y) {
    const uint16_t *a = x, *b = y;
    float lane[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lane[l] += fp16_to_fp32(a[i + l]) * fp16_to_fp32(b[i + l]);
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += fp16_to_fp32(a[i + l]) * fp16_to_fp32(b[i + l]);
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = lane[l] + lane[l + 8];
    float sum = fold8(v);
    for (; i < n; i++) sum += fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]);
    return sum;
}

float ref_vec_dot_bf16(size_t n, const void *x, const void *y) {
    const uint16_t *a = x, *b = y;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)(bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]));
    return (float)sum;
}

/* The 32-element types against A8 rows. Q4_1 and Q5_1 pair with A8S
 * (GGML pairs them with Q8_1) and add their min times the block sum s it
 * stores, so the sum is computed once per activation block, not once per
 * weight row.
 *
 * The canonical order of Q4_0, Q4_1, Q5_0 and Q8_0 (the types with SIMD
 * variants; Q5_1 and IQ4_NL have none and keep one float term per block):
 * - per block b, eight exact integer sums p[k] of the products of
 *   elements 4k..4k+3 (k = 0..7);
 * - s = d_x * d_y, one float multiply (d_x the weight's F16 scale);
 * - acc[b % 2][k] = fma(s, p[k], acc[b % 2][k]): fused, one rounding;
 * - Q4_1's min term: mins[b % 2] = fma(m_x, s_y, mins[b % 2]);
 * - the result: v[k] = acc[0][k] + acc[1][k], summed by fold8, plus
 *   (mins[0] + mins[1]) (zero for the types without a min).
 * Eight lanes is one AVX2 register, two NEON registers; even and odd
 * blocks keep separate accumulators so consecutive FMAs do not wait on
 * each other. fmaf is exact (correctly rounded) in every libm. */
typedef struct acc32 {
    float acc[2][8], mins[2];
} acc32;

static inline void acc32_add(acc32 *a, size_t ib, float s, const int p[8]) {
    for (int k = 0; k < 8; k++) a->acc[ib % 2][k] = fmaf(s, (float)p[k], a->acc[ib % 2][k]);
}

static inline float acc32_result(const acc32 *a) {
    float v[8];
    for (int k = 0; k < 8; k++) v[k] = a->acc[0][k] + a->acc[1][k];
    return fold8(v) + (a->mins[0] + a->mins[1]);
}

/* p[k] = sum over the 4 elements of lane k of wq[e] * yq[e]. */
static inline void lanes32(const int wq[32], const int8_t *yq, int p[8]) {
    for (int k = 0; k < 8; k++) {
        p[k] = 0;
        for (int e = 4 * k; e < 4 * k + 4; e++) p[k] += wq[e] * yq[e];
    }
}
float ref_vec_dot_q4_0_a8(size_t n, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q4_0 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy);
    const int8_t *yq = a8_codes(vy, nb);
    acc32 a = {0};
    for (size_t ib = 0; ib < nb; ib++, yq += QK8_0) {
        int wq[32], p[8];
        for (int j = 0; j < 16; j++) {
            wq[j] = (x[ib].qs[j] & 0xF) - 8;
            wq[j + 16] = (x[ib].qs[j] >> 4) - 8;
        }
        lanes32(wq, yq, p);
        acc32_add(&a, ib, fp16_to_fp32(x[ib].d) * yd[ib], p);
    }
    return acc32_result(&a);
}

float ref_vec_dot_q4_1_a8s(size_t n, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q4_1 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy), *ys = a8s_sums(vy, nb);
    const int8_t *yq = a8s_codes(vy, nb);
    acc32 a = {0};
    for (size_t ib = 0; ib < nb; ib++, yq += QK8_0) {
        int wq[32], p[8];
        for (int j = 0; j < 16; j++) {
            wq[j] = x[ib].qs[j] & 0xF;
            wq[j + 16] = x[ib].qs[j] >> 4;
        }
        lanes32(wq, yq, p);
        acc32_add(&a, ib, fp16_to_fp32(x[ib].d) * yd[ib], p);
        a.mins[ib % 2] = fmaf(fp16_to_fp32(x[ib].m), ys[ib], a.mins[ib % 2]);
    }
    return acc32_result(&a);
}

float ref_vec_dot_q5_0_a8(size_t n, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q5_0 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy);
    const int8_t *yq = a8_codes(vy, nb);
    acc32 a = {0};
    for (size_t ib = 0; ib < nb; ib++, yq += QK8_0) {
        const uint32_t qh = read_u32le(x[ib].qh);
        int wq[32], p[8];
        for (int j = 0; j < 16; j++) {
            wq[j] = ((x[ib].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4) - 16;
            wq[j + 16] = ((x[ib].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16;
        }
        lanes32(wq, yq, p);
        acc32_add(&a, ib, fp16_to_fp32(x[ib].d) * yd[ib], p);
    }
    return acc32_result(&a);
}

float ref_vec_dot_q5_1_a8s(size_t n, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q5_1 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy), *ys = a8s_sums(vy, nb);
    const int8_t *yq = a8s_codes(vy, nb);
    float sum = 0.0f;
    for (size_t ib = 0; ib < nb; ib++, yq += QK8_0) {
        const uint32_t qh = read_u32le(x[ib].qh);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = (x[ib].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            const int q1 = (x[ib].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            isum += q0 * yq[j] + q1 * yq[j + 16];
        }
        sum += fp16_to_fp32(x[ib].d) * yd[ib] * (float)isum + fp16_to_fp32(x[ib].m) * ys[ib];
    }
    return sum;
}

float ref_vec_dot_q8_0_a8(size_t n, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_q8_0 *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy);
    const int8_t *yq = a8_codes(vy, nb);
    acc32 a = {0};
    for (size_t ib = 0; ib < nb; ib++, yq += QK8_0) {
        int wq[32], p[8];
        for (int j = 0; j < QK8_0; j++) wq[j] = x[ib].qs[j];
        lanes32(wq, yq, p);
        acc32_add(&a, ib, fp16_to_fp32(x[ib].d) * yd[ib], p);
    }
    return acc32_result(&a);
}

float ref_vec_dot_iq4_nl_a8(size_t n, const void *vx, const void *vy) {
    assert(n % QK8_0 == 0);
    const block_iq4_nl *x = vx;
    const size_t nb = n / QK8_0;
    const float *yd = a8_scales(vy);
    const int8_t *yq = a8_codes(vy, nb);
    float sum = 0.0f;
    for (size_t ib = 0; ib < nb; ib++, yq += QK8_0) {
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += iq4nl_values[x[ib].qs[j] & 0xF] * yq[j];
            isum += iq4nl_values[x[ib].qs[j] >> 4] * yq[j + 16];
        }
        sum += fp16_to_fp32(x[ib].d) * yd[ib] * (float)isum;
    }
    return sum;
}

/* The K-quants against Q8_K: per super-block, the integer sum of
 * scale[g] * dot(q, y) over groups, and for types with mins the integer
 * sum of min[g] * bsums, each scaled once in float. The canonical order is
 * this code's: the float expression per super-block exactly as written
 * (no FMA), added to one running sum in block order. */
float ref_vec_dot_q2_k_q8_k(size_t n, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int isum = 0, msum = 0;
        for (int g = 0; g < 16; g++) {
            int gsum = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) {
                const int h = e / 128, s = (e / 32) % 4, l = e % 32;
                gsum += ((x[ib].qs[32 * h + l] >> (2 * s)) & 3) * y[ib].qs[e];
            }
            isum += (x[ib].scales[g] & 0xF) * gsum;
            msum += (x[ib].scales[g] >> 4) * y[ib].bsums[g];
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum -
               y[ib].d * fp16_to_fp32(x[ib].dmin) * (float)msum;
    }
    return sum;
}

float ref_vec_dot_q3_k_q8_k(size_t n, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int sc[16], isum = 0;
        q3k_scales(x[ib].scales, sc);
        for (int g = 0; g < 16; g++) {
            int gsum = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) {
                const int h = e / 128, s = (e / 32) % 4, l = e % 32;
                const int lo = (x[ib].qs[32 * h + l] >> (2 * s)) & 3;
                const int hi = (x[ib].hmask[l] >> (e / 32)) & 1;
                gsum += (lo - (hi ? 0 : 4)) * y[ib].qs[e];
            }
            isum += sc[g] * gsum;
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum;
    }
    return sum;
}

float ref_vec_dot_q4_k_q8_k(size_t n, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int isum = 0, msum = 0;
        for (int g = 0; g < 8; g++) {
            int sc, m, gsum = 0;
            kq_scale_min(g, x[ib].scales, &sc, &m);
            const uint8_t *q = x[ib].qs + 32 * (g / 2);
            const int shift = 4 * (g % 2);
            for (int l = 0; l < 32; l++) gsum += ((q[l] >> shift) & 0xF) * y[ib].qs[32 * g + l];
            isum += sc * gsum;
            msum += m * (y[ib].bsums[2 * g] + y[ib].bsums[2 * g + 1]);
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum -
               y[ib].d * fp16_to_fp32(x[ib].dmin) * (float)msum;
    }
    return sum;
}

float ref_vec_dot_q5_k_q8_k(size_t n, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int isum = 0, msum = 0;
        for (int g = 0; g < 8; g++) {
            int sc, m, gsum = 0;
            kq_scale_min(g, x[ib].scales, &sc, &m);
            const uint8_t *q = x[ib].qs + 32 * (g / 2);
            const int shift = 4 * (g % 2);
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 0xF) | ((x[ib].qh[l] >> g) & 1) << 4;
                gsum += v * y[ib].qs[32 * g + l];
            }
            isum += sc * gsum;
            msum += m * (y[ib].bsums[2 * g] + y[ib].bsums[2 * g + 1]);
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum -
               y[ib].d * fp16_to_fp32(x[ib].dmin) * (float)msum;
    }
    return sum;
}

float ref_vec_dot_q6_k_q8_k(size_t n, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int gsum = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) {
                gsum += (q6k_value(&x[ib], e) - 32) * y[ib].qs[e];
            }
            isum += x[ib].scales[g] * gsum;
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum;
    }
    return sum;
}

float ref_vec_dot_iq4_xs_q8_k(size_t n, const void *vx, const void *vy) {
    assert(n % QK_K == 0);
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int isum = 0;
        for (int g = 0; g < 8; g++) {
            const uint8_t *q = x[ib].qs + 16 * g;
            const int8_t *q8 = y[ib].qs + 32 * g;
            int gsum = 0;
            for (int j = 0; j < 16; j++) {
                gsum += iq4nl_values[q[j] & 0xF] * q8[j] + iq4nl_values[q[j] >> 4] * q8[j + 16];
            }
            isum += (iq4xs_scale(&x[ib], g) - 32) * gsum;
        }
        sum += y[ib].d * fp16_to_fp32(x[ib].d) * (float)isum;
    }
    return sum;
}
