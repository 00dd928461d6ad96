/*
 * arm_neon.c — AArch64 NEON versions of the hot kernels: the A8 and A8S
 * activation quantizers; the dot products of Q4_0, Q5_0, Q8_0 (against
 * A8) and Q4_1 (against A8S), each with its tile of four activation rows
 * (dot4_y: see quant.h); Q4_K, Q5_K and Q6_K (against Q8_K); F16. NEON is part of
 * every AArch64 CPU; each integer dot product also comes in a variant
 * using the SDOT instruction (ARMv8.2 dotprod), compiled per function with
 * a target attribute and chosen by quant.c when neon_dotprod_supported()
 * says the CPU has it.
 *
 * Agreement with the reference (ref.c), as for AVX2: the quantizers write
 * the same bytes (FCVTAS rounds half away from zero, like roundf); every
 * dot product follows the reference's canonical order of float operations
 * (exact integer sums, the same lanes, FMAs and final tree), so it returns
 * the reference's float bit for bit, as the x86 kernels do.
 * A tile returns for each pair exactly what vec_dot of the same variant
 * returns (vec_dot is the tile body with one pair).
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <assert.h>
#include <stdbool.h>
#include <string.h>

#include "format/kernels/blocks.h"
#include "format/kernels/fp16.h"
#include "format/kernels/kernels.h"

#if defined(__linux__)
#include <sys/auxv.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
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
#elif defined(__APPLE__)
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, NULL, 0) == 0 && v != 0;
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

/* round_clamp(v * id, -127, 127) of ref.c for four lanes: clamp first
 * (FMAXNM turns NaN into -127, as fmaxf), then FCVTAS, which rounds half
 * away from zero like roundf. */
static inline int32x4_t round_clamp_127(float32x4_t v, float id) {
    const float32x4_t s = vmulq_n_f32(v, id);
    return vcvtaq_s32_f32(vminnmq_f32(vmaxnmq_f32(s, vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f)));
}

/* A8 or A8S rows (with_sum, kernels/blocks.h): the same bytes as
 * ref_quantize_a8 and ref_quantize_a8s. */
static inline __attribute__((always_inline)) void quantize_a8_row(const float *src, void *dst,
                                                                  size_t nb, bool with_sum) {
    float *ds = dst, *ss = (float *)dst + nb;
    int8_t *qs = (int8_t *)dst + (with_sum ? 8 : 4) * nb;
    for (size_t ib = 0; ib < nb; ib++, src += QK8_0, qs += QK8_0) {
        float32x4_t v[8];
        float32x4_t amax = vdupq_n_f32(0.0f);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(src + 4 * k);
            amax = vmaxnmq_f32(amax, vabsq_f32(v[k])); /* NaN ignored, as fmaxf */
        }
        const float d = vmaxnmvq_f32(amax) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int32x4_t q[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) q[k] = round_clamp_127(v[k], id);
        ds[ib] = fp16_to_fp32(fp32_to_fp16(d));
        if (with_sum) {
            /* |sum| <= 32 * 127: exact in any order. */
            const int32x4_t s = vaddq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])),
                                          vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7])));
            ss[ib] = fp16_to_fp32(fp32_to_fp16(d * (float)vaddvq_s32(s)));
        }
        int16x8_t h[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            h[k] = vcombine_s16(vmovn_s32(q[2 * k]), vmovn_s32(q[2 * k + 1]));
        vst1q_s8(qs, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
        vst1q_s8(qs + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
    }
}

void neon_quantize_a8(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    quantize_a8_row(src, dst, n / QK8_0, false);
}

void neon_quantize_a8s(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    quantize_a8_row(src, dst, n / QK8_0, true);
}

/* Four F16 values (FCVTL: exact, as fp16_to_fp32 for every non-NaN). */
static inline float32x4_t f16x4_to_f32(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline float h2f(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* The lanes of ref.c's fold8 ((v0+v4)+(v2+v6))+((v1+v5)+(v3+v7)), with
 * v0..v3 in lo and v4..v7 in hi. */
static inline float fold8(float32x4_t lo, float32x4_t hi) {
    const float32x4_t s = vaddq_f32(lo, hi); /* v0+v4, v1+v5, v2+v6, v3+v7 */
    const float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s)); /* pairs 0,2 and 1,3 */
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* F16 against ny (1 or 4) F16 rows (stride ys bytes), each pair in ref.c's
 * order: 16 lanes (four registers) over chunks of 16, a chunk of 8 into
 * lanes 0..7, lanes l and l + 8 added, fold8, then the tail one product at
 * a time. Products of two F16 values are exact in float, so the FMA rounds
 * as the reference's add does. */
static inline __attribute__((always_inline)) void
dot_f16_rows(size_t n, const uint16_t *x, const void *vy, size_t ys, int ny, float *out) {
    const uint16_t *yr[4];
    float32x4_t acc[4][4];
    for (int j = 0; j < ny; j++) {
        yr[j] = (const uint16_t *)((const uint8_t *)vy + (size_t)j * ys);
        for (int k = 0; k < 4; k++) acc[j][k] = vdupq_n_f32(0.0f);
    }
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float32x4_t xv[4];
        for (int k = 0; k < 4; k++) xv[k] = f16x4_to_f32(x + i + 4 * k);
        for (int j = 0; j < ny; j++)
            for (int k = 0; k < 4; k++)
                acc[j][k] = vfmaq_f32(acc[j][k], xv[k], f16x4_to_f32(yr[j] + i + 4 * k));
    }
    if (i + 8 <= n) {
        const float32x4_t x0 = f16x4_to_f32(x + i), x1 = f16x4_to_f32(x + i + 4);
        for (int j = 0; j < ny; j++) {
            acc[j][0] = vfmaq_f32(acc[j][0], x0, f16x4_to_f32(yr[j] + i));
            acc[j][1] = vfmaq_f32(acc[j][1], x1, f16x4_to_f32(yr[j] + i + 4));
        }
        i += 8;
    }
    for (int j = 0; j < ny; j++) {
        float sum = fold8(vaddq_f32(acc[j][0], acc[j][2]), vaddq_f32(acc[j][1], acc[j][3]));
        for (size_t t = i; t < n; t++) sum += h2f(x[t]) * h2f(yr[j][t]);
        out[j] = sum;
    }
}

float neon_vec_dot_f16(size_t n, const void *vx, const void *vy) {
    float out[1];
    dot_f16_rows(n, vx, vy, 0, 1, out);
    return out[0];
}

/* The same for four rows (stride ys bytes), each weight chunk converted
 * once for the four. */
void neon_dot4_y_f16(size_t n, const void *vx, size_t xs, const void *vy, size_t ys, float out[4]) {
    (void)xs;
    dot_f16_rows(n, vx, vy, ys, 4, out);
}

/* The eight lane sums of ref.c's canonical order for 32 signed bytes (a0,
 * a1 against b0, b1): lane k of *lo (k = 0..3) sums the products of
 * elements 4k..4k+3, lane k of *hi those of 16+4k..16+4k+3. Exact in any
 * grouping. Plain NEON widens each product to 16 bits and adds neighbours
 * pairwise twice: |a| <= 128 and |b| <= 127, so a pair of products
 * (<= 32512) still fits 16 bits. SDOT sums each group of four at once. */
static inline int32x4_t quads16(int8x16_t a, int8x16_t b) {
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t p1 = vmull_high_s8(a, b);
    return vpaddlq_s16(vpaddq_s16(p0, p1));
}

static inline void dot32_plain(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1,
                               int32x4_t *lo, int32x4_t *hi) {
    *lo = quads16(a0, b0);
    *hi = quads16(a1, b1);
}

DOTPROD static inline void dot32_sdot(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1,
                                      int32x4_t *lo, int32x4_t *hi) {
    *lo = dot_sdot(vdupq_n_s32(0), a0, b0);
    *hi = dot_sdot(vdupq_n_s32(0), a1, b1);
}

typedef void (*dot32_fn)(int8x16_t, int8x16_t, int8x16_t, int8x16_t, int32x4_t *, int32x4_t *);

/* The 32-element weight formats a tile body unpacks. */
enum { W_Q4_0, W_Q4_1, W_Q5_0, W_Q8_0 };

/* One weight block: its 32 codes as signed bytes (elements 0..15, then
 * 16..31; minus the offset for Q4_0 and Q5_0, 0..15 for Q4_1), its scale
 * *d and Q4_1's minimum *m (each block starts with its F16 scale, Q4_1's
 * minimum follows). */
static inline __attribute__((always_inline)) void load_w32(int kind, const uint8_t *blk,
                                                           int8x16_t q[2], float *d, float *m) {
    uint16_t h[2];
    memcpy(h, blk, sizeof h);
    *d = h2f(h[0]);
    switch (kind) {
    case W_Q4_0: {
        const uint8x16_t v = vld1q_u8(((const block_q4_0 *)blk)->qs);
        q[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
        q[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
        break;
    }
    case W_Q4_1: {
        const uint8x16_t v = vld1q_u8(((const block_q4_1 *)blk)->qs);
        *m = h2f(h[1]);
        q[0] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
        q[1] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        break;
    }
    case W_Q5_0: {
        /* The fifth bit of element j is bit j of qh: spread each byte of
         * qh over eight lanes and test one bit per lane. */
        const block_q5_0 *b = (const block_q5_0 *)blk;
        const uint8x16_t lane_bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
        const uint8x16_t h0 = vcombine_u8(vdup_n_u8(b->qh[0]), vdup_n_u8(b->qh[1]));
        const uint8x16_t h1 = vcombine_u8(vdup_n_u8(b->qh[2]), vdup_n_u8(b->qh[3]));
        const uint8x16_t b4 = vdupq_n_u8(0x10);
        const uint8x16_t v = vld1q_u8(b->qs);
        const uint8x16_t lo =
            vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0F)), vandq_u8(vtstq_u8(h0, lane_bit), b4));
        const uint8x16_t hi = vorrq_u8(vshrq_n_u8(v, 4), vandq_u8(vtstq_u8(h1, lane_bit), b4));
        q[0] = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(16));
        q[1] = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(16));
        break;
    }
    default: {
        const block_q8_0 *b = (const block_q8_0 *)blk;
        q[0] = vld1q_s8(b->qs);
        q[1] = vld1q_s8(b->qs + 16);
        break;
    }
    }
}

/* nx weight rows (stride xs bytes) times ny activation rows (stride ys),
 * nx * ny <= 4, into out[i * ny + j], each pair in ref.c's canonical order:
 * two accumulators of eight float lanes (lo and hi registers) for even and
 * odd blocks, FMA of the block's scale times each lane's exact sum, Q4_1's
 * min term in two floats likewise, fold8 at the end. The operations per
 * pair do not depend on nx and ny, so a pair's result does not depend on
 * the tile that computed it. kind, nx, ny and dot are constants at every
 * call: each wrapper gets its own unrolled copy with the accumulators in
 * registers. */
static inline __attribute__((always_inline)) void dot_tile_32(int kind, size_t n, const uint8_t *x,
                                                              size_t xs, int nx, const uint8_t *y,
                                                              size_t ys, int ny, float *out,
                                                              dot32_fn dot) {
    assert(n % QK8_0 == 0);
    const size_t xbytes = kind == W_Q4_0   ? sizeof(block_q4_0)
                          : kind == W_Q4_1 ? sizeof(block_q4_1)
                          : kind == W_Q5_0 ? sizeof(block_q5_0)
                                           : sizeof(block_q8_0);
    const size_t nb = n / QK8_0;
    const float *yd[4], *ysum[4];
    const int8_t *yq[4];
#pragma GCC unroll 4
    for (int j = 0; j < ny; j++) {
        const uint8_t *row = y + j * ys;
        yd[j] = a8_scales(row);
        ysum[j] = a8s_sums(row, nb);
        yq[j] = kind == W_Q4_1 ? a8s_codes(row, nb) : a8_codes(row, nb);
    }
    float32x4_t acc[2][4][4][2];
    float mins[2][4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++) {
            acc[0][i][j][0] = acc[0][i][j][1] = vdupq_n_f32(0.0f);
            acc[1][i][j][0] = acc[1][i][j][1] = vdupq_n_f32(0.0f);
            mins[0][i][j] = mins[1][i][j] = 0.0f;
        }
    }
    for (size_t ib0 = 0; ib0 < nb; ib0 += 2) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const size_t ib = ib0 + (size_t)h;
            if (h == 1 && ib == nb) break;
            int8x16_t qx[4][2];
            float dx[4], mx[4] = {0};
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                load_w32(kind, x + i * xs + ib * xbytes, qx[i], &dx[i], &mx[i]);
#pragma GCC unroll 4
            for (int j = 0; j < ny; j++) {
                const int8x16_t y0 = vld1q_s8(yq[j] + ib * QK8_0);
                const int8x16_t y1 = vld1q_s8(yq[j] + ib * QK8_0 + 16);
                const float dy = yd[j][ib];
#pragma GCC unroll 4
                for (int i = 0; i < nx; i++) {
                    int32x4_t lo, hi;
                    dot(qx[i][0], qx[i][1], y0, y1, &lo, &hi);
                    const float s = dx[i] * dy;
                    acc[h][i][j][0] = vfmaq_n_f32(acc[h][i][j][0], vcvtq_f32_s32(lo), s);
                    acc[h][i][j][1] = vfmaq_n_f32(acc[h][i][j][1], vcvtq_f32_s32(hi), s);
                    if (kind == W_Q4_1)
                        mins[h][i][j] = __builtin_fmaf(mx[i], ysum[j][ib], mins[h][i][j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++)
            out[i * ny + j] = fold8(vaddq_f32(acc[0][i][j][0], acc[1][i][j][0]),
                                    vaddq_f32(acc[0][i][j][1], acc[1][i][j][1])) +
                              (mins[0][i][j] + mins[1][i][j]);
    }
}

/* One Q4_K or Q5_K super-block's codes (w: for each pair of groups c, its
 * low codes 0..15 and 16..31, then its high ones) against one Q8_K block:
 * the exact integer sums, then the reference's float expression. */
static inline __attribute__((always_inline)) float kq45_term(const int8x16_t w[16], const int sc[8],
                                                             const int mn[8], float d, float dmin,
                                                             const block_q8_K *y, dot_fn dot) {
    int isum = 0, msum = 0;
    for (int c = 0; c < 4; c++) {
        const int8_t *q8 = y->qs + 64 * c;
        int32x4_t lo = dot(vdupq_n_s32(0), w[4 * c], vld1q_s8(q8));
        lo = dot(lo, w[4 * c + 1], vld1q_s8(q8 + 16));
        int32x4_t hi = dot(vdupq_n_s32(0), w[4 * c + 2], vld1q_s8(q8 + 32));
        hi = dot(hi, w[4 * c + 3], vld1q_s8(q8 + 48));
        isum += sc[2 * c] * vaddvq_s32(lo) + sc[2 * c + 1] * vaddvq_s32(hi);
        msum += mn[2 * c] * (y->bsums[4 * c] + y->bsums[4 * c + 1]) +
                mn[2 * c + 1] * (y->bsums[4 * c + 2] + y->bsums[4 * c + 3]);
    }
    return y->d * d * (float)isum - y->d * dmin * (float)msum;
}

/* The Q8_K block ib of activation row j (rows ys bytes apart). */
static inline const block_q8_K *q8k_row(const void *y, size_t ys, int j, size_t ib) {
    return (const block_q8_K *)((const uint8_t *)y + (size_t)j * ys) + ib;
}

/* Q4_K (five 0) or Q5_K (five 1) against ny (1 or 4) Q8_K rows: each
 * super-block's codes, scales and minimums unpacked once for the rows,
 * each pair's sum in block order. Q5_K's fifth bit of element 32g + l is
 * bit g of qh[l]: qh shifts right by two per pair of groups, and bits 0
 * and 1 move to bit 4. Codes 0..15 (0..31) are valid signed bytes, so no
 * offset is needed. */
static inline __attribute__((always_inline)) void kq45_tile(int five, size_t n, const void *vx,
                                                            const void *vy, size_t ys, int ny,
                                                            float *out, dot_fn dot) {
    assert(n % QK_K == 0);
    const uint8x16_t m4 = vdupq_n_u8(0x0F), b4 = vdupq_n_u8(0x10);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        const block_q4_K *x4 = five ? NULL : (const block_q4_K *)vx + ib;
        const block_q5_K *x5 = five ? (const block_q5_K *)vx + ib : NULL;
        const uint8_t *qs = five ? x5->qs : x4->qs, *scales = five ? x5->scales : x4->scales;
        uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
        if (five) {
            h0 = vld1q_u8(x5->qh);
            h1 = vld1q_u8(x5->qh + 16);
        }
        int8x16_t w[16];
        int sc[8], mn[8];
        for (int c = 0; c < 4; c++) {
            const uint8x16_t q0 = vld1q_u8(qs + 32 * c), q1 = vld1q_u8(qs + 32 * c + 16);
            uint8x16_t v[4] = {vandq_u8(q0, m4), vandq_u8(q1, m4), vshrq_n_u8(q0, 4),
                               vshrq_n_u8(q1, 4)};
            if (five) {
                v[0] = vorrq_u8(v[0], vandq_u8(vshlq_n_u8(h0, 4), b4));
                v[1] = vorrq_u8(v[1], vandq_u8(vshlq_n_u8(h1, 4), b4));
                v[2] = vorrq_u8(v[2], vandq_u8(vshlq_n_u8(h0, 3), b4));
                v[3] = vorrq_u8(v[3], vandq_u8(vshlq_n_u8(h1, 3), b4));
                h0 = vshrq_n_u8(h0, 2);
                h1 = vshrq_n_u8(h1, 2);
            }
            for (int k = 0; k < 4; k++) w[4 * c + k] = vreinterpretq_s8_u8(v[k]);
            kq_scale_min(2 * c, scales, &sc[2 * c], &mn[2 * c]);
            kq_scale_min(2 * c + 1, scales, &sc[2 * c + 1], &mn[2 * c + 1]);
        }
        const uint16_t d16 = five ? x5->d : x4->d, dmin16 = five ? x5->dmin : x4->dmin;
        const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++)
            sum[j] += kq45_term(w, sc, mn, d, dmin, q8k_row(vy, ys, j, ib), dot);
    }
#pragma GCC unroll 4
    for (int j = 0; j < ny; j++) out[j] = sum[j];
}

static inline __attribute__((always_inline)) void
q4_k_tile(size_t n, const void *vx, const void *vy, size_t ys, int ny, float *out, dot_fn dot) {
    kq45_tile(0, n, vx, vy, ys, ny, out, dot);
}

static inline __attribute__((always_inline)) void
q5_k_tile(size_t n, const void *vx, const void *vy, size_t ys, int ny, float *out, dot_fn dot) {
    kq45_tile(1, n, vx, vy, ys, ny, out, dot);
}

/* Q6_K: codes minus 32 fit a signed byte; groups of 16 are one vector
 * (w[8h + 4j + k]: half h, sixteen j, quarter k), unpacked once for the
 * rows. */
static inline __attribute__((always_inline)) void
q6_k_tile(size_t n, const void *vx, const void *vy, size_t ys, int ny, float *out, dot_fn dot) {
    assert(n % QK_K == 0);
    const block_q6_K *x = vx;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int8x16_t w[16];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[ib].ql + 64 * h, *qh = x[ib].qh + 32 * h;
            for (int j = 0; j < 2; j++) {
                const uint8x16_t qa = vld1q_u8(ql + 16 * j), qb = vld1q_u8(ql + 32 + 16 * j);
                const uint8x16_t hv = vld1q_u8(qh + 16 * j);
                uint8x16_t v[4];
                v[0] = vorrq_u8(vandq_u8(qa, m4), vshlq_n_u8(vandq_u8(hv, m2), 4));
                v[1] = vorrq_u8(vandq_u8(qb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hv, 2), m2), 4));
                v[2] = vorrq_u8(vshrq_n_u8(qa, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hv, 4), m2), 4));
                v[3] = vorrq_u8(vshrq_n_u8(qb, 4), vshlq_n_u8(vshrq_n_u8(hv, 6), 4));
                for (int k = 0; k < 4; k++)
                    w[8 * h + 4 * j + k] = vsubq_s8(vreinterpretq_s8_u8(v[k]), off);
            }
        }
        const float d = fp16_to_fp32(x[ib].d);
#pragma GCC unroll 4
        for (int r = 0; r < ny; r++) {
            const block_q8_K *y = q8k_row(vy, ys, r, ib);
            int isum = 0;
            for (int h = 0; h < 2; h++) {
                const int8_t *sc = x[ib].scales + 8 * h, *q8 = y->qs + 128 * h;
                for (int j = 0; j < 2; j++)
                    for (int k = 0; k < 4; k++) {
                        const int32x4_t s = dot(vdupq_n_s32(0), w[8 * h + 4 * j + k],
                                                vld1q_s8(q8 + 32 * k + 16 * j));
                        isum += sc[2 * k + j] * vaddvq_s32(s);
                    }
            }
            sum[r] += y->d * d * (float)isum;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < ny; r++) out[r] = sum[r];
}

/* The K-quant dot products and their tiles of four, plain NEON and SDOT. */
#define DOTK_VARIANTS(attr, prefix, dot, name, tile)                                               \
    attr float prefix##vec_dot_##name(size_t n, const void *x, const void *y) {                    \
        float out[1];                                                                              \
        tile(n, x, y, 0, 1, out, dot);                                                             \
        return out[0];                                                                             \
    }                                                                                              \
    attr void prefix##dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,  \
                                    float out[4]) {                                                \
        (void)xs;                                                                                  \
        tile(n, x, y, ys, 4, out, dot);                                                            \
    }

/* The single dot product and its tiles, for each 32-element type, plain
 * NEON and SDOT. */
#define DOT32_VARIANTS(attr, prefix, dot, name, kind)                                              \
    attr float prefix##vec_dot_##name(size_t n, const void *x, const void *y) {                    \
        float out[1];                                                                              \
        dot_tile_32(kind, n, x, 0, 1, y, 0, 1, out, dot);                                          \
        return out[0];                                                                             \
    }                                                                                              \
    attr void prefix##dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,  \
                                    float out[4]) {                                                \
        (void)xs;                                                                                  \
        dot_tile_32(kind, n, x, 0, 1, y, ys, 4, out, dot);                                         \
    }

#define PLAIN /* no attribute: baseline NEON */
DOT32_VARIANTS(PLAIN, neon_, dot32_plain, q4_0_a8, W_Q4_0)
DOT32_VARIANTS(PLAIN, neon_, dot32_plain, q4_1_a8s, W_Q4_1)
DOT32_VARIANTS(PLAIN, neon_, dot32_plain, q5_0_a8, W_Q5_0)
DOT32_VARIANTS(PLAIN, neon_, dot32_plain, q8_0_a8, W_Q8_0)
DOT32_VARIANTS(DOTPROD, neon_dotprod_, dot32_sdot, q4_0_a8, W_Q4_0)
DOT32_VARIANTS(DOTPROD, neon_dotprod_, dot32_sdot, q4_1_a8s, W_Q4_1)
DOT32_VARIANTS(DOTPROD, neon_dotprod_, dot32_sdot, q5_0_a8, W_Q5_0)
DOT32_VARIANTS(DOTPROD, neon_dotprod_, dot32_sdot, q8_0_a8, W_Q8_0)

DOTK_VARIANTS(PLAIN, neon_, dot_plain, q4_k_q8_k, q4_k_tile)
DOTK_VARIANTS(PLAIN, neon_, dot_plain, q5_k_q8_k, q5_k_tile)
DOTK_VARIANTS(PLAIN, neon_, dot_plain, q6_k_q8_k, q6_k_tile)
DOTK_VARIANTS(DOTPROD, neon_dotprod_, dot_sdot, q4_k_q8_k, q4_k_tile)
DOTK_VARIANTS(DOTPROD, neon_dotprod_, dot_sdot, q5_k_q8_k, q5_k_tile)
DOTK_VARIANTS(DOTPROD, neon_dotprod_, dot_sdot, q6_k_q8_k, q6_k_tile)

#endif /* __aarch64__ */
