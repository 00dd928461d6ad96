/*
 * x86_avx2.c — AVX2 + FMA + F16C versions of the hot kernels: the Q8_0 and
 * Q8_K activation quantizers and the dot products the common model files
 * need (Q4_0, Q4_1, Q5_0, Q8_0 against Q8_0; Q4_K, Q5_K, Q6_K against
 * Q8_K; F16).
 * Same signatures and results as the reference (ref.c); quant.c puts them
 * in the type table when the CPU has all three extensions. Each function
 * carries its own target attribute, so the file needs no compiler flags
 * and the rest of the library stays baseline x86-64.
 *
 * How they compare with the reference (tests/test_kernels_simd.c):
 * - the Q8_0 and Q8_K quantizers write the same bytes (same scale, same
 *   rounding: half away from zero, done with truncate-and-compare);
 * - the K-quant dots sum each super-block exactly in integers and add the
 *   blocks in the same order and with the same float operations as the
 *   reference, so they return the same float;
 * - the 32-element and F16 dots keep eight float partial sums with FMA, so
 *   they differ from the reference by float rounding only.
 */
#if defined(__x86_64__)

#include <assert.h>
#include <cpuid.h>
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "format/kernels/blocks.h"
#include "format/kernels/fp16.h"
#include "format/kernels/kernels.h"
#include "format/kernels/x86_common.h"

/* The K-quant dots must round exactly as the reference, which clang would
 * otherwise contract into FMAs. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* __builtin_cpu_supports checks that the OS saves the YMM registers along
 * with the CPUID bits; clang's does not know "f16c", so that bit comes
 * from CPUID leaf 1 directly. */
bool avx2_cpu_supported(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

/* round_clamp(v, -127, 127) of ref.c, eight at a time: clamp (NaN goes to
 * -127 as there), then round half away from zero. Truncate and compare the
 * fraction: adding 0.5 first would round 0.49999997 up. */
AVX2 static inline __m256i round_clamp_127(__m256 v) {
    v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f)); /* max(NaN, lo) = lo */
    v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
    __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    t = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
    return _mm256_cvtps_epi32(_mm256_or_ps(t, sign));
}

/* A8 or A8S rows (with_sum): each block's codes and F16-rounded scale
 * (and sum); same bytes as the reference. */
AVX2 static inline __attribute__((always_inline)) void quantize_a8_row(const float *src, void *dst,
                                                                       size_t nb, bool with_sum) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    float *ds = dst, *ss = (float *)dst + nb;
    int8_t *qs = (int8_t *)dst + (with_sum ? 8 : 4) * nb;
    for (size_t ib = 0; ib < nb; ib++, src += QK8_0, qs += QK8_0) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(src + 8 * k);
            /* max(|x|, acc) keeps acc when |x| is NaN, like fmaxf. */
            amax = _mm256_max_ps(_mm256_and_ps(v[k], abs_mask), amax);
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = round_clamp_127(_mm256_mul_ps(v[0], vid));
        __m256i i1 = round_clamp_127(_mm256_mul_ps(v[1], vid));
        __m256i i2 = round_clamp_127(_mm256_mul_ps(v[2], vid));
        __m256i i3 = round_clamp_127(_mm256_mul_ps(v[3], vid));
        ds[ib] = f16_round(d);
        if (with_sum) {
            const int sum =
                hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
            ss[ib] = f16_round(d * (float)sum);
        }
        /* Packing works per 128-bit lane; the permute restores order. */
        i0 = _mm256_packs_epi32(i0, i1);
        i2 = _mm256_packs_epi32(i2, i3);
        i0 = _mm256_packs_epi16(i0, i2);
        i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)qs, i0);
    }
}

AVX2 void avx2_quantize_a8(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    quantize_a8_row(src, dst, n / QK8_0, false);
}

AVX2 void avx2_quantize_a8s(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    quantize_a8_row(src, dst, n / QK8_0, true);
}

/* Eight floats, already scaled, to eight int32 codes of the reference. */
AVX2 static inline __m256i scale_round_127(const float *src, __m256 vid) {
    return round_clamp_127(_mm256_mul_ps(_mm256_loadu_ps(src), vid));
}

/* Largest |x| over 8k floats; NaN ignored as fmaxf does. */
AVX2 static inline float absmax_f32(const float *src, size_t n) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 amax = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(src + i), abs_mask), amax);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Q8_K: as Q8_0 over 256 elements with a float scale, plus the sums of
 * each group of 16 codes, taken from the packed bytes. */
AVX2 void avx2_quantize_q8_k(const float *src, void *dst, size_t n) {
    assert(n % QK_K == 0);
    block_q8_K *y = dst;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (size_t ib = 0; ib < n / QK_K; ib++, src += QK_K) {
        const float d = absmax_f32(src, QK_K) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = d;
        const __m256 vid = _mm256_set1_ps(id);
        for (int c = 0; c < QK_K / 32; c++) {
            const float *s = src + 32 * c;
            __m256i i0 = scale_round_127(s, vid), i1 = scale_round_127(s + 8, vid);
            __m256i i2 = scale_round_127(s + 16, vid), i3 = scale_round_127(s + 24, vid);
            i0 = _mm256_packs_epi32(i0, i1);
            i2 = _mm256_packs_epi32(i2, i3);
            i0 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i0, i2), order);
            _mm256_storeu_si256((__m256i *)(y[ib].qs + 32 * c), i0);
            /* Group 2c is the low 128 bits, group 2c+1 the high: sum pairs
             * (maddubs with 1 as the unsigned side), then quads, then the
             * four quads of each half. */
            const __m256i pairs = _mm256_maddubs_epi16(ones8, i0);
            __m256i q = _mm256_madd_epi16(pairs, ones16);
            q = _mm256_hadd_epi32(q, q);
            q = _mm256_hadd_epi32(q, q);
            y[ib].bsums[2 * c] = (int16_t)_mm256_extract_epi32(q, 0);
            y[ib].bsums[2 * c + 1] = (int16_t)_mm256_extract_epi32(q, 4);
        }
    }
}

/* One F16 weight row against ny (1 or 4) F16 rows (stride ys bytes), the
 * same for every pair: two accumulators of eight lanes over chunks of 16,
 * a last chunk of eight into the first, their horizontal sum, then the
 * tail one product at a time (the product of two F16 values is exact in
 * float, so each FMA rounds as the reference's add does). */
AVX2 static inline __attribute__((always_inline)) void
dot_f16_rows(size_t n, const uint16_t *x, const void *vy, size_t ys, int ny, float *out) {
    const uint16_t *yr[4];
    __m256 acc0[4], acc1[4];
#pragma GCC unroll 4
    for (int j = 0; j < ny; j++) {
        yr[j] = (const uint16_t *)((const uint8_t *)vy + (size_t)j * ys);
        acc0[j] = _mm256_setzero_ps();
        acc1[j] = _mm256_setzero_ps();
    }
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (ny > 1) prefetch_ahead(x + i, 0, ny);
        const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8)));
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++) {
            acc0[j] = _mm256_fmadd_ps(
                x0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(yr[j] + i))), acc0[j]);
            acc1[j] = _mm256_fmadd_ps(
                x1, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(yr[j] + i + 8))), acc1[j]);
        }
    }
    const bool half = i + 8 <= n;
    const __m256 xh =
        half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < ny; j++) {
        if (half)
            acc0[j] = _mm256_fmadd_ps(
                xh, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(yr[j] + i))), acc0[j]);
        float sum = hsum_f32x8(_mm256_add_ps(acc0[j], acc1[j]));
        for (size_t t = i + (half ? 8 : 0); t < n; t++) sum += h2f(x[t]) * h2f(yr[j][t]);
        out[j] = sum;
    }
}

AVX2 float avx2_vec_dot_f16(size_t n, const void *vx, const void *vy) {
    float out[1];
    dot_f16_rows(n, vx, vy, 0, 1, out);
    return out[0];
}

/* The same for four activation rows (stride ys bytes), each weight chunk
 * converted once for the four. */
AVX2 void avx2_dot4_y_f16(size_t n, const void *vx, size_t xs, const void *vy, size_t ys,
                          float out[4]) {
    (void)xs;
    dot_f16_rows(n, vx, vy, ys, 4, out);
}

/* nx weight rows (stride xs bytes) times ny activation rows (stride ys),
 * nx * ny <= 4, into out[i * ny + j]. Every pair keeps two accumulators of
 * eight float lanes (even and odd blocks, so consecutive blocks do not wait
 * on each other's FMA; Q4_1's minimum term likewise, in two floats), adds one block at a time with
 * the same operations whatever nx and ny are, and ends with the same horizontal sum: so a pair's
 * result does not depend on the tile it was computed in. kind, nx and ny are constants at every
 * call, so each wrapper gets its own unrolled copy with the accumulators in registers. */
AVX2 static inline __attribute__((always_inline)) void dot_tile_32(int kind, size_t n,
                                                                   const uint8_t *x, size_t xs,
                                                                   int nx, const uint8_t *y,
                                                                   size_t ys, int ny, float *out) {
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
    __m256 acc[2][4][4];
    float mins[2][4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++) {
            acc[0][i][j] = acc[1][i][j] = _mm256_setzero_ps();
            mins[0][i][j] = mins[1][i][j] = 0.0f;
        }
    }
    for (size_t ib0 = 0; ib0 < nb; ib0 += 2) {
        /* About a line of each weight row per step, as in x86_avx512.c. */
#pragma GCC unroll 4
        for (int i = 0; i < nx; i++) {
            const uint8_t *b0 = x + i * xs + ib0 * xbytes;
            if (kind == W_Q5_0 || kind == W_Q8_0 || !(ib0 & 2)) prefetch_ahead(b0, 0, ny);
            if (kind == W_Q8_0) prefetch_ahead(b0, 64, ny);
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const size_t ib = ib0 + (size_t)h;
            if (h == 1 && ib == nb) break;
            __m256i qx[4];
            float dx[4], mx[4] = {0};
#pragma GCC unroll 4
            for (int i = 0; i < nx; i++)
                qx[i] = load_w32(kind, x + i * xs + ib * xbytes, &dx[i], &mx[i]);
#pragma GCC unroll 4
            for (int j = 0; j < ny; j++) {
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(yq[j] + ib * QK8_0));
                const float dy = yd[j][ib], sy = kind == W_Q4_1 ? ysum[j][ib] : 0.0f;
#pragma GCC unroll 4
                for (int i = 0; i < nx; i++) {
                    __m256i p;
                    if (kind == W_Q4_1) {
                        p = dot_u8i8x32(qx[i], qy);
                        mins[h][i][j] = __builtin_fmaf(mx[i], sy, mins[h][i][j]);
                    } else {
                        p = dot_i8x32(qx[i], qy);
                    }
                    acc[h][i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dx[i] * dy),
                                                   _mm256_cvtepi32_ps(p), acc[h][i][j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nx; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++)
            out[i * ny + j] = hsum_f32x8(_mm256_add_ps(acc[0][i][j], acc[1][i][j])) +
                              (mins[0][i][j] + mins[1][i][j]);
    }
}

/* The single dot product and its tile of four activation rows, for each
 * 32-element type. */
#define DOT32_VARIANTS(name, kind)                                                                 \
    AVX2 float avx2_vec_dot_##name(size_t n, const void *x, const void *y) {                       \
        float out[1];                                                                              \
        dot_tile_32(kind, n, x, 0, 1, y, 0, 1, out);                                               \
        return out[0];                                                                             \
    }                                                                                              \
    AVX2 void avx2_dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,     \
                                 float out[4]) {                                                   \
        (void)xs;                                                                                  \
        dot_tile_32(kind, n, x, 0, 1, y, ys, 4, out);                                              \
    }

DOT32_VARIANTS(q4_0_a8, W_Q4_0)
DOT32_VARIANTS(q4_1_a8s, W_Q4_1)
DOT32_VARIANTS(q5_0_a8, W_Q5_0)
DOT32_VARIANTS(q8_0_a8, W_Q8_0)

/* The K-quant dots, one weight row against ny (1 or 4) activation rows:
 * each super-block's integer sums exactly, then per pair the reference's
 * float operations in its order, so every result is the reference's float
 * whatever the tile. The weight codes and scales are unpacked once for all
 * ny rows. */
enum { K_Q4, K_Q5, K_Q6 };

AVX2 static inline __attribute__((always_inline)) void
dot_tile_k(int kind, size_t n, const uint8_t *x, const uint8_t *y, size_t ys, int ny, float *out) {
    assert(n % QK_K == 0);
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3),
                  bit = _mm256_set1_epi8(1);
    const size_t xbytes = kind == K_Q4   ? sizeof(block_q4_K)
                          : kind == K_Q5 ? sizeof(block_q5_K)
                                         : sizeof(block_q6_K);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        for (size_t off = 0; off < xbytes; off += 64) prefetch_ahead(x + ib * xbytes, off, ny);
        const block_q8_K *yb[4];
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++) yb[j] = (const block_q8_K *)(y + j * ys) + ib;
        __m256i isum[4];
#pragma GCC unroll 4
        for (int j = 0; j < ny; j++) isum[j] = _mm256_setzero_si256();
        if (kind == K_Q6) {
            const block_q6_K *xb = (const block_q6_K *)(x + ib * xbytes);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = xb->ql + 64 * h, *qh = xb->qh + 32 * h;
                const int8_t *sc = xb->scales + 8 * h;
                const __m256i qa = _mm256_loadu_si256((const __m256i *)ql);
                const __m256i qb = _mm256_loadu_si256((const __m256i *)(ql + 32));
                const __m256i hv = _mm256_loadu_si256((const __m256i *)qh);
                __m256i v[4];
                v[0] = _mm256_and_si256(qa, low4);
                v[1] = _mm256_and_si256(qb, low4);
                v[2] = _mm256_and_si256(_mm256_srli_epi16(qa, 4), low4);
                v[3] = _mm256_and_si256(_mm256_srli_epi16(qb, 4), low4);
                v[0] = _mm256_or_si256(v[0], _mm256_slli_epi16(_mm256_and_si256(hv, low2), 4));
                v[1] = _mm256_or_si256(
                    v[1], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2), low2), 4));
                v[2] = _mm256_or_si256(
                    v[2], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 4), low2), 4));
                v[3] = _mm256_or_si256(
                    v[3], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 6), low2), 4));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    /* Elements 32k..32k+31 span groups 2k (low 128 bits of
                     * the maddubs result) and 2k+1 (high 128 bits). */
                    const __m256i scales =
                        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(sc[2 * k])),
                                                _mm_set1_epi16(sc[2 * k + 1]), 1);
#pragma GCC unroll 4
                    for (int j = 0; j < ny; j++) {
                        const __m256i yk =
                            _mm256_loadu_si256((const __m256i *)(yb[j]->qs + 128 * h + 32 * k));
                        isum[j] = _mm256_add_epi32(
                            isum[j], _mm256_madd_epi16(_mm256_maddubs_epi16(v[k], yk), scales));
                    }
                }
            }
            const float dx = h2f(xb->d);
#pragma GCC unroll 4
            for (int j = 0; j < ny; j++) {
                int offset = 0;
                for (int g = 0; g < 16; g++) offset += xb->scales[g] * yb[j]->bsums[g];
                const int total = hsum_i32x8(isum[j]) - 32 * offset;
                sum[j] += yb[j]->d * dx * (float)total;
            }
        } else {
            /* Q4_K and Q5_K: same scales layout, Q5_K's fifth bits in qh. */
            const uint8_t *packed, *qs, *qh = NULL;
            uint16_t dh, dminh;
            if (kind == K_Q4) {
                const block_q4_K *xb = (const block_q4_K *)(x + ib * xbytes);
                packed = xb->scales, qs = xb->qs, dh = xb->d, dminh = xb->dmin;
            } else {
                const block_q5_K *xb = (const block_q5_K *)(x + ib * xbytes);
                packed = xb->scales, qs = xb->qs, qh = xb->qh, dh = xb->d, dminh = xb->dmin;
            }
            uint8_t sc[8], m[8];
            k4_scales_mins(packed, sc, m);
            __m256i hb = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m256i lo = _mm256_and_si256(q, low4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                if (kind == K_Q5) {
                    /* Bit 0 of each byte is this group's bit; the 16-bit
                     * shifts only move neighbouring bytes' bits into
                     * positions >= 1. */
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, bit), 4));
                    hi = _mm256_or_si256(
                        hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), bit), 4));
                    hb = _mm256_srli_epi16(hb, 2);
                }
                const __m256i s0 = _mm256_set1_epi16((int16_t)sc[2 * c]);
                const __m256i s1 = _mm256_set1_epi16((int16_t)sc[2 * c + 1]);
#pragma GCC unroll 4
                for (int j = 0; j < ny; j++) {
                    const int8_t *q8 = yb[j]->qs + 64 * c;
                    const __m256i y0 = _mm256_loadu_si256((const __m256i *)q8);
                    const __m256i y1 = _mm256_loadu_si256((const __m256i *)(q8 + 32));
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s0);
                    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s1);
                    isum[j] = _mm256_add_epi32(isum[j], _mm256_add_epi32(p0, p1));
                }
            }
            const float dx = h2f(dh), dmin = h2f(dminh);
#pragma GCC unroll 4
            for (int j = 0; j < ny; j++) {
                const int is = hsum_i32x8(isum[j]);
                const int msum = q45k_block_msum(m, yb[j]->bsums);
                sum[j] += yb[j]->d * dx * (float)is - yb[j]->d * dmin * (float)msum;
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < ny; j++) out[j] = sum[j];
}

#define DOTK_VARIANTS(name, kind)                                                                  \
    AVX2 float avx2_vec_dot_##name(size_t n, const void *x, const void *y) {                       \
        float out[1];                                                                              \
        dot_tile_k(kind, n, x, y, 0, 1, out);                                                      \
        return out[0];                                                                             \
    }                                                                                              \
    AVX2 void avx2_dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,     \
                                 float out[4]) {                                                   \
        (void)xs;                                                                                  \
        dot_tile_k(kind, n, x, y, ys, 4, out);                                                     \
    }

DOTK_VARIANTS(q4_k_q8_k, K_Q4)
DOTK_VARIANTS(q5_k_q8_k, K_Q5)
DOTK_VARIANTS(q6_k_q8_k, K_Q6)

#endif /* __x86_64__ */
