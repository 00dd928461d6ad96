/*
 * x86_avx512.c — AVX-512 (F, BW, VL) with VNNI versions of the 32-element
 * dot products (Q4_0, Q5_0, Q8_0 against A8; Q4_1 against A8S) and of Q4_K
 * and Q6_K against Q8_K: the single dot and the tiles of four and eight
 * activation rows (and, for the 32-element types, two weight rows by
 * eight) that batched matmul spends its time in. quant.c puts them in the
 * table over the AVX2 ones when the CPU and OS have all four extensions.
 *
 * They return bit for bit what the AVX2 kernels return
 * (tests/test_kernels_simd.c checks it), so a table can mix the two. One
 * 512-bit register holds two blocks: its low half is the AVX2 kernels'
 * even-block accumulator, its high half their odd-block one. VPDPBUSD
 * forms the same exact integer sums as VPMADDUBSW + VPMADDWD (no pair
 * saturates: see dot_i8x32), the scale of each block is the same float
 * product, and the end is the same: add the halves, sum eight lanes, add
 * the minimum term. What changes is the work per block: one instruction
 * for the integer dot, codes and scales of two blocks loaded at once from
 * the A8 rows. Q4_K and Q6_K keep dot_tile_k's arithmetic: exact integer
 * sums per super-block, then the reference's float expression.
 */
#if defined(__x86_64__)

#include <assert.h>
#include <stdbool.h>
#include <string.h>

#include "format/kernels/blocks.h"
#include "format/kernels/kernels.h"
#include "format/kernels/x86_common.h"

#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* libgcc's checks include the OS saving the ZMM and mask registers. */
bool avx512_cpu_supported(void) {
    __builtin_cpu_init();
    return avx2_cpu_supported() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}

/* ---- the activation quantizers ---- */

/* round_clamp(v, -127, 127) of ref.c, sixteen at a time: clamp (NaN to
 * -127: max returns its second operand), then truncate v + copysign(0.5 -
 * 2^-25, v). Adding the float just below one half rounds up exactly the
 * fractions of 0.5 and more, away from zero (0.5 + 0.49999997 is a tie
 * that rounds to 1; a fraction just below 0.5 sums to just below 1), for
 * every float of the range: checked against roundf(fminf(fmaxf(v, -127),
 * 127)) on every float that is not a NaN, and the quantizer's bytes
 * against ref.c's for every such float (bench/round_check.c). */
AVX512 static inline __m512i round_clamp_127_512(__m512 v) {
    v = _mm512_max_ps(v, _mm512_set1_ps(-127.0f));
    v = _mm512_min_ps(v, _mm512_set1_ps(127.0f));
    /* (v & sign) | 0.49999997: 0xEA is (a & b) | c */
    const __m512 h = _mm512_castsi512_ps(
        _mm512_ternarylogic_epi32(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u),
                                  _mm512_set1_epi32(0x3EFFFFFF), 0xEA));
    return _mm512_cvttps_epi32(_mm512_add_ps(v, h));
}

/* Sixteen vectors reduced lane-wise by op into one: lane b of the result
 * is op over the sixteen lanes of v[b]. The transposed tree of end_16:
 * halves, then quarters, then pairs within 128-bit lanes, leaving vector
 * o's result in lane 4 (o % 4) + o / 4, which the last permutation puts
 * in lane o. Exact for max and integer addition, in any order. */
#define REDUCE16_512(name, T, op, shuf128, shufps, perm)                                           \
    AVX512 static inline __attribute__((always_inline)) T name(const T v[16]) {                    \
        T a[8], b[4], c[2];                                                                        \
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) a[p] =                                 \
            op(shuf128(v[2 * p], v[2 * p + 1], 0x44), shuf128(v[2 * p], v[2 * p + 1], 0xEE));      \
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) b[q] =                                 \
            op(shuf128(a[2 * q], a[2 * q + 1], 0x88), shuf128(a[2 * q], a[2 * q + 1], 0xDD));      \
        _Pragma("GCC unroll 2") for (int r = 0; r < 2; r++) c[r] =                                 \
            op(shufps(b[2 * r], b[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),                            \
               shufps(b[2 * r], b[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));                           \
        const T d = op(shufps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),                                \
                       shufps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));                               \
        return perm(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), d);   \
    }

#define SHUFPS_I32(a, b, i)                                                                        \
    _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), i))
REDUCE16_512(reduce16_max_ps, __m512, _mm512_max_ps, _mm512_shuffle_f32x4, _mm512_shuffle_ps,
             _mm512_permutexvar_ps)
REDUCE16_512(reduce16_add_epi32, __m512i, _mm512_add_epi32, _mm512_shuffle_i32x4, SHUFPS_I32,
             _mm512_permutexvar_epi32)
#undef SHUFPS_I32
#undef REDUCE16_512

/* A8 or A8S rows (with_sum), ref.c's quantize_a8_row: each block's
 * largest |x| (NaN passed over, as fmaxf does: max keeps its second
 * operand), d = that / 127, the codes round_clamp(x / d) narrowed by
 * VPMOVSDB (within -127..127 already), and d and d times the codes' sum
 * rounded to F16 by F16C (f16_round). Sixteen blocks at a time: their
 * maxima and sums reduced together (reduce16_max_ps, reduce16_add_epi32),
 * their scales divided and rounded in one vector; the rest block by block
 * (a row of 576 in a third of the time it took block by block; 8 sessions
 * of SmolLM2 +1.2%, 19 of 30 rounds). The bytes of ref_quantize_a8 and ref_quantize_a8s
 * (test_kernels_simd). */
AVX512 static inline __attribute__((always_inline)) void
quantize_a8_row_512(const float *src, void *dst, size_t nb, bool with_sum) {
    float *ds = dst, *ss = (float *)dst + nb;
    int8_t *qs = (int8_t *)dst + (with_sum ? 8 : 4) * nb;
    size_t ib = 0;
    for (; ib + 16 <= nb; ib += 16) {
        const float *x = src + ib * QK8_0;
        __m512 m[16];
#pragma GCC unroll 16
        for (int b = 0; b < 16; b++)
            m[b] = _mm512_max_ps(
                _mm512_abs_ps(_mm512_loadu_ps(x + 32 * b + 16)),
                _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * b)), _mm512_setzero_ps()));
        const __m512 d = _mm512_div_ps(reduce16_max_ps(m), _mm512_set1_ps(127.0f));
        float id[16];
        _mm512_storeu_ps(
            id, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ),
                                    _mm512_set1_ps(1.0f), d));
        _mm512_storeu_ps(ds + ib, _mm512_cvtph_ps(_mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT)));
        __m512i sum[16];
#pragma GCC unroll 16
        for (int b = 0; b < 16; b++) {
            const __m512 vid = _mm512_set1_ps(id[b]);
            const __m512i i0 = round_clamp_127_512(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b), vid)),
                          i1 = round_clamp_127_512(
                              _mm512_mul_ps(_mm512_loadu_ps(x + 32 * b + 16), vid));
            _mm_storeu_si128((__m128i *)(qs + 32 * (ib + b)), _mm512_cvtsepi32_epi8(i0));
            _mm_storeu_si128((__m128i *)(qs + 32 * (ib + b) + 16), _mm512_cvtsepi32_epi8(i1));
            sum[b] = _mm512_add_epi32(i0, i1);
        }
        if (with_sum) {
            const __m512 t = _mm512_mul_ps(d, _mm512_cvtepi32_ps(reduce16_add_epi32(sum)));
            _mm512_storeu_ps(ss + ib,
                             _mm512_cvtph_ps(_mm512_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT)));
        }
    }
    for (src += ib * QK8_0; ib < nb; ib++, src += QK8_0) {
        const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);
        __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_abs_ps(v1), m);
        const float d = _mm512_reduce_max_ps(m) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i i0 = round_clamp_127_512(_mm512_mul_ps(v0, vid)),
                      i1 = round_clamp_127_512(_mm512_mul_ps(v1, vid));
        ds[ib] = f16_round(d);
        if (with_sum)
            ss[ib] = f16_round(d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1)));
        _mm_storeu_si128((__m128i *)(qs + 32 * ib), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qs + 32 * ib + 16), _mm512_cvtsepi32_epi8(i1));
    }
}

AVX512 void avx512_quantize_a8(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    quantize_a8_row_512(src, dst, n / QK8_0, false);
}

AVX512 void avx512_quantize_a8s(const float *src, void *dst, size_t n) {
    assert(n % QK8_0 == 0);
    quantize_a8_row_512(src, dst, n / QK8_0, true);
}

/* sum of x * y over each group of four bytes for the tail's one block:
 * x unsigned (q4_1) or, for the signed kinds, |x| against y negated where
 * x < 0 — the products of dot_i8x32, summed exactly. */
AVX512 static inline __attribute__((always_inline)) __m256i dot_pairs_256(int kind, __m256i qx,
                                                                          __m256i qy) {
    const __m256i zero = _mm256_setzero_si256();
    if (kind == W_Q4_1) return _mm256_dpbusd_epi32(zero, qx, qy);
    const __mmask32 neg = _mm256_movepi8_mask(qx);
    return _mm256_dpbusd_epi32(zero, _mm256_abs_epi8(qx), _mm256_mask_sub_epi8(qy, neg, zero, qy));
}

/* The codes of two consecutive blocks as 64 unsigned bytes, elements 0..31
 * of b0 then of b1 (the order of the A8 codes), and their scales (and Q4_1's
 * minimums) as two floats. Q4_0, Q5_0 and Q8_0 codes carry an offset (8, 16,
 * 128) that the caller takes off the integer sums. The 4-bit codes: the 16
 * bytes of each block broadcast to two 128-bit lanes, the second shifted
 * down four bits; Q5_0's fifth bit is added under a mask made from both
 * blocks' qh (bit j is element j's); Q8_0's signed codes flip their top
 * bit (q + 128). Prefetches the weight row ahead of the pair. */
AVX512 static inline __attribute__((always_inline)) __m512i
codes_pair_512(int kind, const uint8_t *b0, const uint8_t *b1, size_t ib, int ny, __m128 *dx2,
               __m128 *mx2) {
    const __m512i nib_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    /* One prefetch per line-sized step: a Q4_0/Q4_1 pair is 36-40 bytes
     * (one per two pairs: one per pair cost Q4_0 4% from memory, 0.60
     * against 0.575 ns a block, one thread), a Q5_0 pair 44, a Q8_0 pair
     * 68 (two per pair). */
    if (kind == W_Q5_0 || kind == W_Q8_0 || !(ib & 2)) prefetch_ahead(b0, 0, ny);
    if (kind == W_Q8_0) prefetch_ahead(b0, 64, ny);
    __m512i qx;
    if (kind == W_Q8_0) {
        const __m256i r0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
        const __m256i r1 = _mm256_loadu_si256((const __m256i *)(b1 + 2));
        qx = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1),
                              _mm512_set1_epi8((char)0x80));
    } else {
        /* the codes follow d (Q4_0), d and m (Q4_1), d and qh (Q5_0) */
        const size_t qs_at = kind == W_Q4_0 ? 2 : kind == W_Q4_1 ? 4 : 6;
        const __m256i r0 =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qs_at)));
        const __m256i r1 =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b1 + qs_at)));
        const __m512i raw = _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1);
        qx = _mm512_and_si512(_mm512_srlv_epi64(raw, nib_shift), _mm512_set1_epi8(0x0F));
        if (kind == W_Q5_0) {
            uint32_t qh0, qh1;
            memcpy(&qh0, b0 + 2, 4);
            memcpy(&qh1, b1 + 2, 4);
            qx = _mm512_mask_add_epi8(qx, (__mmask64)qh0 | (__mmask64)qh1 << 32, qx,
                                      _mm512_set1_epi8(16));
        }
    }
    if (kind != W_Q4_1) {
        uint16_t h0, h1;
        memcpy(&h0, b0, 2);
        memcpy(&h1, b1, 2);
        *dx2 = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(h0), h1, 1));
        *mx2 = _mm_setzero_ps();
    } else {
        /* d0, m0, d1, m1 converted at once, then d0, d1 and m0, m1. */
        int h0, h1;
        memcpy(&h0, b0, 4);
        memcpy(&h1, b1, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(h0), h1, 1));
        *dx2 = _mm_shuffle_ps(dm, dm, _MM_SHUFFLE(2, 0, 2, 0));
        *mx2 = _mm_shuffle_ps(dm, dm, _MM_SHUFFLE(3, 1, 3, 1));
    }
    return qx;
}

/* The end of a tile of two weight rows by eight activation rows without a
 * tail block: out[j * os + w] = hsum_f32x8(even + odd) of acc[w][j], plus
 * Q4_1's minimum terms, for all sixteen at once. The same additions of
 * the same operands as the one-output end, only transposed: the halves
 * (lanes i and i + 8), then lanes i and i + 4, then 0 + 2 and 1 + 3, then
 * those two; the minimums' even + odd, added last. Each activation row's
 * two results are stored as one pair (a 16-float store read back by the
 * caller stalled its loads). */
AVX512 static inline __attribute__((always_inline)) void
end_16(const __m512 acc[2][8], const __m128 mins[8], bool q4_1, float *out, size_t os) {
    __m512 v[8], s[4], t[2];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) { /* outputs 2p and 2p + 1 (o = 8w + j) */
        const __m512 a = acc[p / 4][2 * (p % 4)], b = acc[p / 4][2 * (p % 4) + 1];
        v[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) /* 128-bit lane t: output 4q + t's four sums */
        s[q] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * q], v[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(v[2 * q], v[2 * q + 1], 0xDD));
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++) /* lane t: (0 + 2, 1 + 3) of outputs 8r + t, 8r + 4 + t */
        t[r] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * r], s[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(s[2 * r], s[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* output o in lane 4 (o % 4) + o / 4 */
    __m512 sum = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* to activation row j's pair (outputs j and 8 + j) in lanes 2j, 2j + 1 */
    const __m512i to_pairs =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    sum = _mm512_permutexvar_ps(to_pairs, sum);
    if (q4_1) {
        /* hadd of rows j, j + 1: outputs j, 8 + j, j + 1, 9 + j: already pairs */
        __m512 m = _mm512_castps128_ps512(_mm_hadd_ps(mins[0], mins[1]));
        m = _mm512_insertf32x4(m, _mm_hadd_ps(mins[2], mins[3]), 1);
        m = _mm512_insertf32x4(m, _mm_hadd_ps(mins[4], mins[5]), 2);
        m = _mm512_insertf32x4(m, _mm_hadd_ps(mins[6], mins[7]), 3);
        sum = _mm512_add_ps(sum, m);
    }
    /* (the lane index must be a constant for clang) */
    const __m128 p[4] = {_mm512_extractf32x4_ps(sum, 0), _mm512_extractf32x4_ps(sum, 1),
                         _mm512_extractf32x4_ps(sum, 2), _mm512_extractf32x4_ps(sum, 3)};
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) {
        _mm_storel_pi((__m64 *)(out + (size_t)(2 * l) * os), p[l]);
        _mm_storeh_pi((__m64 *)(out + (size_t)(2 * l + 1) * os), p[l]);
    }
}

/* nw (1 or 2) weight rows of stride xs against ny (1, 4 or 8) activation
 * rows of stride ys, into out[j] (one weight row) or out[j * os + w] (two);
 * the arithmetic of dot_tile_32 in x86_avx2.c, two blocks at a time. Each
 * block's eight lane sums are the same exact integers: VPDPBUSD on the
 * unsigned codes, started from minus the offset times the lane's sum of y
 * (one VPDPBUSD on -y per activation row and block pair, shared by the
 * weight rows; |y| <= 127). Each lane then gets the same float product of
 * the two scales, the same FMA into its accumulator and the same end: add
 * the halves, sum eight lanes, add the minimum term. Two weight rows share
 * each activation row's loads, offset sums and scale spreading. */
AVX512 static inline __attribute__((always_inline)) void
dot_rows_512(int kind, size_t n, const uint8_t *x, size_t xs, int nw, const uint8_t *y, size_t ys,
             int ny, float *out, size_t os) {
    assert(n % QK8_0 == 0);
    const size_t xbytes = kind == W_Q4_0   ? sizeof(block_q4_0)
                          : kind == W_Q4_1 ? sizeof(block_q4_1)
                          : kind == W_Q5_0 ? sizeof(block_q5_0)
                                           : sizeof(block_q8_0);
    const size_t nb = n / QK8_0;
    const float *yd[8], *ysum[8];
    const int8_t *yq[8];
    __m512 acc[2][8];
    /* Q4_1's minimum terms of row j: weight row w's even blocks in lane
     * 2w, its odd blocks in lane 2w + 1 (one register for both rows). */
    __m128 mins[8];
#pragma GCC unroll 8
    for (int j = 0; j < ny; j++) {
        const uint8_t *row = y + j * ys;
        yd[j] = a8_scales(row);
        ysum[j] = a8s_sums(row, nb);
        yq[j] = kind == W_Q4_1 ? a8s_codes(row, nb) : a8_codes(row, nb);
        mins[j] = _mm_setzero_ps();
#pragma GCC unroll 2
        for (int w = 0; w < nw; w++) acc[w][j] = _mm512_setzero_ps();
    }
    /* Lanes 0..7 take the first scale of a pair, 8..15 the second. */
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i offset = _mm512_set1_epi8(kind == W_Q4_0 ? 8 : kind == W_Q5_0 ? 16 : (char)0x80);
    const __m512i zero = _mm512_setzero_si512();
    size_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        __m512i qx[2];
        __m128 dx2[2], mx2[2];
#pragma GCC unroll 2
        for (int w = 0; w < nw; w++) {
            const uint8_t *b0 = x + w * xs + ib * xbytes;
            qx[w] = codes_pair_512(kind, b0, b0 + xbytes, ib, ny, &dx2[w], &mx2[w]);
        }
        const __m128 mxw = nw == 2 ? _mm_movelh_ps(mx2[0], mx2[1]) : mx2[0];
        /* The scales spread over their blocks' lanes, the product formed
         * lane by lane: the same float as forming it first. */
        __m512 dxv[2];
#pragma GCC unroll 2
        for (int w = 0; w < nw; w++)
            dxv[w] = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(dx2[w]));
#pragma GCC unroll 8
        for (int j = 0; j < ny; j++) {
            const __m512i qy = _mm512_loadu_si512((const void *)(yq[j] + ib * QK8_0));
            const __m512i start =
                kind == W_Q4_1 ? zero
                               : _mm512_dpbusd_epi32(zero, offset, _mm512_sub_epi8(zero, qy));
            const __m128 d2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(yd[j] + ib)));
            const __m512 dyv = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(d2));
            if (kind == W_Q4_1) {
                const __m128 s2 =
                    _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(ysum[j] + ib)));
                mins[j] = _mm_fmadd_ps(mxw, _mm_movelh_ps(s2, s2), mins[j]);
            }
#pragma GCC unroll 2
            for (int w = 0; w < nw; w++) {
                const __m512i p = _mm512_dpbusd_epi32(start, qx[w], qy);
                acc[w][j] =
                    _mm512_fmadd_ps(_mm512_mul_ps(dxv[w], dyv), _mm512_cvtepi32_ps(p), acc[w][j]);
            }
        }
    }
    if (nw == 2 && ny == 8 && ib == nb) {
        end_16(acc, mins, kind == W_Q4_1, out, os);
        return;
    }
#pragma GCC unroll 2
    for (int w = 0; w < nw; w++) {
#pragma GCC unroll 8
        for (int j = 0; j < ny; j++) {
            __m256 even = _mm512_castps512_ps256(acc[w][j]);
            float lanes[4];
            _mm_storeu_ps(lanes, mins[j]);
            float min_even = lanes[2 * w], min_odd = lanes[2 * w + 1];
            const __m256 odd =
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[w][j]), 1));
            if (ib < nb) { /* an odd count: the last block is an even one */
                float dx, mx = 0.0f;
                const __m256i qx = load_w32(kind, x + w * xs + ib * xbytes, &dx, &mx);
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(yq[j] + ib * QK8_0));
                const __m256i p = dot_pairs_256(kind, qx, qy);
                even = _mm256_fmadd_ps(_mm256_set1_ps(dx * yd[j][ib]), _mm256_cvtepi32_ps(p), even);
                if (kind == W_Q4_1) min_even = __builtin_fmaf(mx, ysum[j][ib], min_even);
            }
            out[nw == 1 ? (size_t)j : j * os + (size_t)w] =
                hsum_f32x8(_mm256_add_ps(even, odd)) + (min_even + min_odd);
        }
    }
}

/* dot8_y_x2 loops over its pairs inside one call: at K = 576 (SmolLM2)
 * a pair's loop is nine block pairs, and a call for each pair spent a
 * fifth of the kernel's samples in its set-up and end; in one loop the
 * activation rows' pointers are set once and a pair's end overlaps the
 * next pair's loads (8 sessions +3.2%, 28 of 30 alternating rounds). */
#define DOT32_512(name, kind)                                                                      \
    AVX512 float avx512_vec_dot_##name(size_t n, const void *x, const void *y) {                   \
        float out[1];                                                                              \
        dot_rows_512(kind, n, x, 0, 1, y, 0, 1, out, 1);                                           \
        return out[0];                                                                             \
    }                                                                                              \
    AVX512 void avx512_dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys, \
                                     float out[4]) {                                               \
        (void)xs;                                                                                  \
        dot_rows_512(kind, n, x, 0, 1, y, ys, 4, out, 1);                                          \
    }                                                                                              \
    AVX512 void avx512_dot8_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys, \
                                     float out[8]) {                                               \
        (void)xs;                                                                                  \
        dot_rows_512(kind, n, x, 0, 1, y, ys, 8, out, 1);                                          \
    }                                                                                              \
    AVX512 void avx512_dot8_y_x2_##name(size_t n, const void *x, size_t xs, size_t pairs,          \
                                        const void *y, size_t ys, float *out, size_t os) {         \
        for (size_t p = 0; p < pairs; p++)                                                         \
            dot_rows_512(kind, n, (const uint8_t *)x + 2 * p * xs, xs, 2, y, ys, 8, out + 2 * p,   \
                         os);                                                                      \
    }

DOT32_512(q4_0_a8, W_Q4_0)
DOT32_512(q4_1_a8s, W_Q4_1)
DOT32_512(q5_0_a8, W_Q5_0)
DOT32_512(q8_0_a8, W_Q8_0)

/* The sums of the eight lanes of a[0..3], in lanes 0..3 (exact). */
AVX512 static inline __m128i hsum4_i32x8(const __m256i a[4]) {
    const __m256i h =
        _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The d of block ib of four Q8_K rows. */
AVX512 static inline __m128 q8k_d4(const uint8_t *y, size_t ys, size_t ib) {
    return _mm_setr_ps(((const block_q8_K *)y + ib)->d, ((const block_q8_K *)(y + ys) + ib)->d,
                       ((const block_q8_K *)(y + 2 * ys) + ib)->d,
                       ((const block_q8_K *)(y + 3 * ys) + ib)->d);
}

/* Q4_K against Q8_K, one weight row against ny (1, 4 or 8) activation rows:
 * the integer sums of each super-block exactly, then the reference's float
 * expression, as dot_tile_k in x86_avx2.c. Bytes 32c..32c+31 of the codes
 * hold groups 2c and 2c + 1 (low and high nibbles): broadcast to both
 * halves of a register and the high half shifted down four bits, they line
 * up with the 64 contiguous activation codes of those two groups, one load.
 * VPMADDUBSW forms the pairs (<= 2 * 15 * 127: no saturation), VPDPWSSD
 * multiplies them by the group's scale and adds them into 32-bit lanes. The
 * block's integer sum and its minimum sum are reduced together and both
 * products taken in two lanes: the same exact integers, the same float
 * products, the same order of the additions. */
AVX512 static inline __attribute__((always_inline)) void
dot_tile_q4k_512(size_t n, const uint8_t *x, const uint8_t *y, size_t ys, int ny, float *out) {
    assert(n % QK_K == 0);
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i nib_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    /* Words 0..15 take the scale of group 2c, 16..31 of group 2c + 1. */
    __m512i sidx[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        sidx[c] = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)),
                                     _mm256_set1_epi16((short)(2 * c + 1)), 1);
    float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    __m128 sum4[2] = {_mm_setzero_ps(), _mm_setzero_ps()}; /* rows 4g..4g+3, ny >= 4 */
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        const block_q4_K *xb = (const block_q4_K *)x + ib;
        for (size_t off = 0; off < sizeof *xb; off += 64) prefetch_ahead(xb, off, ny);
        uint8_t sc[8], m[8];
        k4_scales_mins(xb->scales, sc, m);
        uint64_t sc8;
        memcpy(&sc8, sc, 8);
        const __m512i s16 =
            _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        /* the mins as words, each twice: m0, m0, m1, m1, ... */
        const __m128i m8 = _mm_loadl_epi64((const __m128i *)m);
        const __m256i m2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m512i q[4], scale[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i raw =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xb->qs + 32 * c)));
            q[c] = _mm512_and_si512(_mm512_srlv_epi64(raw, nib_shift), low4);
            scale[c] = _mm512_permutexvar_epi16(sidx[c], s16);
        }
        /* d and dmin, adjacent F16 values, at once; both lanes times y's d. */
        uint32_t ddm;
        memcpy(&ddm, &xb->d, 4);
        const __m128 dxm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
        __m256i iv[4], mv[4]; /* ny >= 4: the lanes of four rows, reduced together */
#pragma GCC unroll 8
        for (int j = 0; j < ny; j++) {
            const block_q8_K *yb = (const block_q8_K *)(y + j * ys) + ib;
            __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m512i yc = _mm512_loadu_si512((const void *)(yb->qs + 64 * c));
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q[c], yc), scale[c]);
            }
            /* The minimum sum: m[g] times each of group g's two sums of 16. */
            const __m256i mp =
                _mm256_madd_epi16(m2, _mm256_loadu_si256((const __m256i *)yb->bsums));
            const __m256i i8 =
                _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
            if (ny >= 4) {
                /* Four rows' sums at once, then the same float operations
                 * lane by lane: (y's d * dx) * is - (y's d * dmin) * msum. */
                iv[j & 3] = i8;
                mv[j & 3] = mp;
                if ((j & 3) == 3) {
                    const __m128 yd4 = q8k_d4(y + (j - 3) * ys, ys, ib);
                    const __m128 a =
                        _mm_mul_ps(_mm_mul_ps(yd4, _mm_permute_ps(dxm, _MM_SHUFFLE(0, 0, 0, 0))),
                                   _mm_cvtepi32_ps(hsum4_i32x8(iv)));
                    const __m128 b =
                        _mm_mul_ps(_mm_mul_ps(yd4, _mm_permute_ps(dxm, _MM_SHUFFLE(1, 1, 1, 1))),
                                   _mm_cvtepi32_ps(hsum4_i32x8(mv)));
                    sum4[j >> 2] = _mm_add_ps(sum4[j >> 2], _mm_sub_ps(a, b));
                }
                continue;
            }
            const __m256i t = _mm256_hadd_epi32(i8, mp);
            const __m128i t4 =
                _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            /* lane 0: the integer sum, lane 1: the minimum sum (exact). */
            const __m128i both = _mm_hadd_epi32(t4, _mm_setzero_si128());
            const __m128 prod =
                _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(yb->d), dxm), _mm_cvtepi32_ps(both));
            /* yb->d * dx * is - yb->d * dmin * msum, as the reference. */
            sum[j] += _mm_cvtss_f32(prod) - _mm_cvtss_f32(_mm_movehdup_ps(prod));
        }
    }
    if (ny >= 4) {
        _mm_storeu_ps(sum, sum4[0]);
        _mm_storeu_ps(sum + 4, sum4[1]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < ny; j++) out[j] = sum[j];
}

/* The vec_dot, dot4_y and dot8_y of a K-quant tile function. */
#define DOTK_512(name, tile)                                                                       \
    AVX512 float avx512_vec_dot_##name(size_t n, const void *x, const void *y) {                   \
        float out[1];                                                                              \
        tile(n, x, y, 0, 1, out);                                                                  \
        return out[0];                                                                             \
    }                                                                                              \
    AVX512 void avx512_dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys, \
                                     float out[4]) {                                               \
        (void)xs;                                                                                  \
        tile(n, x, y, ys, 4, out);                                                                 \
    }                                                                                              \
    AVX512 void avx512_dot8_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys, \
                                     float out[8]) {                                               \
        (void)xs;                                                                                  \
        tile(n, x, y, ys, 8, out);                                                                 \
    }

DOTK_512(q4_k_q8_k, dot_tile_q4k_512)

/* Q6_K against Q8_K, one weight row against ny (1, 4 or 8) activation
 * rows: the block's exact integer sum, then the reference's float
 * expression (y's d times the block's d, times the sum), as dot_tile_k in
 * x86_avx2.c. Each half h of a block (128 elements) is two registers of 64
 * codes 0..63: elements 0..63 are the low nibbles of ql[64h..64h+63] with
 * bits 0-1 (elements 0..31) and 2-3 (32..63) of qh[32h..32h+31] on top;
 * elements 64..127 the high nibbles with bits 4-5 and 6-7. VPMADDUBSW forms
 * the pairs (<= 2 * 63 * 127: no saturation), VPDPWSSD multiplies them by
 * their group's scale into 32-bit lanes; the -32 offset comes off as 32
 * times the scales against y's group sums. */
AVX512 static inline __attribute__((always_inline)) void
dot_tile_q6k_512(size_t n, const uint8_t *x, const uint8_t *y, size_t ys, int ny, float *out) {
    assert(n % QK_K == 0);
    const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(3);
    /* the qh shifts of each 256-bit half: 0 | 2 (low codes), 4 | 6 (high) */
    const __m512i sh_lo = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    const __m512i sh_hi = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
    /* Register r (0..3) holds groups 4r..4r+3, one per 128-bit lane: the
     * eight words of lane l take scale 4r + l. */
    const __m512i lane =
        _mm512_setr_epi64(0, 0, 0x0001000100010001ll, 0x0001000100010001ll, 0x0002000200020002ll,
                          0x0002000200020002ll, 0x0003000300030003ll, 0x0003000300030003ll);
    __m512i sidx[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) sidx[r] = _mm512_add_epi16(lane, _mm512_set1_epi16((short)(4 * r)));
    float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    __m128 sum4[2] = {_mm_setzero_ps(), _mm_setzero_ps()}; /* rows 4g..4g+3, ny >= 4 */
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        const block_q6_K *xb = (const block_q6_K *)x + ib;
        for (size_t off = 0; off < sizeof *xb; off += 64) prefetch_ahead(xb, off, ny);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)xb->scales));
        const __m512i s16 = _mm512_castsi256_si512(sc16);
        __m512i q[4], scale[4];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(xb->ql + 64 * h));
            const __m512i qh =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xb->qh + 32 * h)));
            const __m512i top_lo = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_lo), low2);
            const __m512i top_hi = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_hi), low2);
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_slli_epi16(top_lo, 4));
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                           _mm512_slli_epi16(top_hi, 4));
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) scale[r] = _mm512_permutexvar_epi16(sidx[r], s16);
        const float dx = h2f(xb->d);
        __m256i iv[4]; /* ny >= 4: the lanes of four rows, reduced together */
#pragma GCC unroll 8
        for (int j = 0; j < ny; j++) {
            const block_q8_K *yb = (const block_q8_K *)(y + j * ys) + ib;
            __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512i yr = _mm512_loadu_si512((const void *)(yb->qs + 64 * r));
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q[r], yr), scale[r]);
            }
            /* sum of scales[g] * bsums[g]: eight lanes, each two groups */
            const __m256i off =
                _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)yb->bsums));
            const __m256i i8 = _mm256_sub_epi32(
                _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1)),
                _mm256_slli_epi32(off, 5));
            if (ny >= 4) {
                /* Four rows at once: (y's d * dx) * total, lane by lane. */
                iv[j & 3] = i8;
                if ((j & 3) == 3) {
                    const __m128 yd4 = q8k_d4(y + (j - 3) * ys, ys, ib);
                    sum4[j >> 2] =
                        _mm_add_ps(sum4[j >> 2], _mm_mul_ps(_mm_mul_ps(yd4, _mm_set1_ps(dx)),
                                                            _mm_cvtepi32_ps(hsum4_i32x8(iv))));
                }
                continue;
            }
            sum[j] += yb->d * dx * (float)hsum_i32x8(i8);
        }
    }
    if (ny >= 4) {
        _mm_storeu_ps(sum, sum4[0]);
        _mm_storeu_ps(sum + 4, sum4[1]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < ny; j++) out[j] = sum[j];
}

DOTK_512(q6_k_q8_k, dot_tile_q6k_512)

/* F16 against F16 rows, ny of them (1, 4 or 8) against one weight row:
 * avx2_vec_dot_f16's arithmetic for every pair (its sixteen lanes are one
 * zmm; a last chunk of eight goes into lanes 0..7 under a mask, leaving
 * 8..15 as they are), each weight chunk converted once for all the rows.
 * The product of two F16 values is exact in float, so one FMA is the
 * reference's multiply and add. */
AVX512 static inline __attribute__((always_inline)) void
dot_tile_f16_512(size_t n, const uint16_t *x, const uint16_t *y, size_t ys, int ny, float *out) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < ny; j++) acc[j] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch_ahead(x + i, 0, ny);
        const __m512 xv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
#pragma GCC unroll 8
        for (int j = 0; j < ny; j++) {
            const uint16_t *yr = (const uint16_t *)((const uint8_t *)y + (size_t)j * ys);
            acc[j] = _mm512_fmadd_ps(
                xv, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(yr + i))), acc[j]);
        }
    }
    const bool half = i + 8 <= n;
    const __m512 xh =
        half ? _mm512_cvtph_ps(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(x + i))))
             : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < ny; j++) {
        const uint16_t *yr = (const uint16_t *)((const uint8_t *)y + (size_t)j * ys);
        if (half)
            acc[j] = _mm512_mask3_fmadd_ps(
                xh,
                _mm512_cvtph_ps(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(yr + i)))),
                acc[j], 0x00ff);
        float sum = hsum_f32x8(
            _mm256_add_ps(_mm512_castps512_ps256(acc[j]),
                          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[j]), 1))));
        for (size_t t = i + (half ? 8 : 0); t < n; t++) sum += h2f(x[t]) * h2f(yr[t]);
        out[j] = sum;
    }
}

AVX512 void avx512_dot4_y_f16(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                              float out[4]) {
    (void)xs;
    dot_tile_f16_512(n, x, y, ys, 4, out);
}

AVX512 void avx512_dot8_y_f16(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                              float out[8]) {
    (void)xs;
    dot_tile_f16_512(n, x, y, ys, 8, out);
}

#endif /* __x86_64__ */
