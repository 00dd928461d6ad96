/*
 * x86_common.h — the AVX2 building blocks shared by x86_avx2.c and
 * x86_avx512.c: horizontal sums, F16 scales, unpacking the codes of the
 * 32-element weight types. Static inline, each with its own target
 * attribute, so including files need no compiler flags; only compiled on
 * x86-64 and only called after the CPU was checked.
 */
#ifndef CELLM_X86_COMMON_H
#define CELLM_X86_COMMON_H

#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "format/kernels/blocks.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* How far ahead of the block being read the kernels prefetch their
 * weight row (into the next rows: matmul's rows are contiguous). The
 * hardware prefetcher alone left a matvec from memory 20-50% slower than
 * from cache (docs/benchmarks.md); 4-16 KiB ahead all closed most of that
 * gap, 8 KiB was best for the matvec. With several activation rows a
 * weight row is read more slowly, and 6 KiB ahead was best: 8 sessions of
 * SmolLM2 2-4% faster than with 8 KiB in most runs, the same in a later
 * one (2, 4, 5, 7 and 16 KiB measured too: docs/benchmarks.md, "8
 * sessions, round eight"). A prefetch never faults past the end. */
#define PREFETCH_AHEAD 8192
#define PREFETCH_AHEAD_ROWS 6144

/* For a kernel of ny activation rows. The address is formed as an
 * integer: it may lie past the row's object. */
static inline void prefetch_ahead(const void *p, size_t extra, int ny) {
    const size_t ahead = ny > 1 ? PREFETCH_AHEAD_ROWS : PREFETCH_AHEAD;
    __builtin_prefetch((const void *)((uintptr_t)p + ahead + extra), 0, 3);
}

/* fp16_to_fp32(fp32_to_fp16(x)) by F16C, for what the quantizers round:
 * the same bits for every float but a signalling NaN (F16C quiets it),
 * which arithmetic does not make (d = max |x| / 127 is never a NaN; d *
 * sum is one only as inf * 0, a quiet NaN). */
AVX2 static inline float f16_round(float x) {
    return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

AVX2 static inline float hsum_f32x8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline int hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

AVX2 static inline float h2f(uint16_t h) {
    return _cvtsh_ss(h);
}

/* 16 packed bytes → 32 nibbles in element order: low nibbles (elements
 * 0..15) then high nibbles (16..31), as the 32-element blocks store them. */
AVX2 static inline __m256i unpack_nibbles_32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* Sum of x*y over 32 signed bytes, as 8 int32 lanes. |x| <= 128 as
 * unsigned after sign(), |y| <= 127: pairs stay inside int16. */
AVX2 static inline __m256i dot_i8x32(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

/* Sum of u*y for unsigned u (<= 63) and signed y, as 8 int32 lanes. */
AVX2 static inline __m256i dot_u8i8x32(__m256i u, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
}

/* 32 bits → 32 bytes, 0xFF where the bit is set: byte j tests bit j. */
AVX2 static inline __m256i bits_to_bytes_32(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    const __m256i mask = _mm256_set1_epi64x(0x8040201008040201ll);
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
}

/* The 32-element weight formats a tile body unpacks. */
enum { W_Q4_0, W_Q4_1, W_Q5_0, W_Q8_0 };

/* Codes of one 32-element weight block as 32 bytes: signed for Q4_0, Q5_0
 * and Q8_0 (minus their offset), unsigned 0..15 for Q4_1. */
AVX2 static inline __attribute__((always_inline)) __m256i codes_w32(int kind, const uint8_t *blk) {
    switch (kind) {
    case W_Q4_0:
        return _mm256_sub_epi8(unpack_nibbles_32(((const block_q4_0 *)blk)->qs),
                               _mm256_set1_epi8(8));
    case W_Q4_1: return unpack_nibbles_32(((const block_q4_1 *)blk)->qs);
    case W_Q5_0: {
        /* Codes 0..31 with the fifth bit from qh, minus 16. */
        const block_q5_0 *b = (const block_q5_0 *)blk;
        const __m256i hi = _mm256_and_si256(bits_to_bytes_32(b->qh), _mm256_set1_epi8(0x10));
        return _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles_32(b->qs), hi), _mm256_set1_epi8(16));
    }
    default: return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)blk)->qs);
    }
}

/* codes_w32, plus *d the block's scale and *m Q4_1's minimum (every one of
 * these blocks starts with its F16 scale; Q4_1's minimum follows it). */
AVX2 static inline __attribute__((always_inline)) __m256i load_w32(int kind, const uint8_t *blk,
                                                                   float *d, float *m) {
    uint16_t h[2];
    memcpy(h, blk, sizeof h);
    *d = h2f(h[0]);
    if (kind == W_Q4_1) *m = h2f(h[1]);
    return codes_w32(kind, blk);
}

/* The 12 bytes of packed 6-bit scales and mins of Q4_K and Q5_K as 8
 * scales and 8 mins (kq_scale_min for all eight groups at once): groups
 * 0..3 are the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); groups
 * 4..7 take their low 4 bits from the nibbles of bytes 8..11 and their top
 * 2 bits from the top bits of bytes 0..3 (scales) and 4..7 (mins). */
static inline void k4_scales_mins(const uint8_t *packed, uint8_t sc[8], uint8_t m[8]) {
    uint32_t a[3];
    memcpy(a, packed, 12);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
    const uint32_t s_lo = a[0] & low6, m_lo = a[1] & low6;
    const uint32_t s_hi = (a[2] & low4) | ((a[0] >> 6) & low2) << 4;
    const uint32_t m_hi = ((a[2] >> 4) & low4) | ((a[1] >> 6) & low2) << 4;
    memcpy(sc, &s_lo, 4);
    memcpy(sc + 4, &s_hi, 4);
    memcpy(m, &m_lo, 4);
    memcpy(m + 4, &m_hi, 4);
}

/* The min term of Q4_K and Q5_K, exact: sum of m[g] times the sum of y
 * over group g (the two 16-element sums of bsums). */
AVX2 static inline int q45k_block_msum(const uint8_t m[8], const int16_t *bsums) {
    const __m128i b0 = _mm_loadu_si128((const __m128i *)bsums);
    const __m128i b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    const __m128i g = _mm_hadd_epi16(b0, b1); /* |sum| <= 32 * 127: no overflow */
    uint64_t mb;
    memcpy(&mb, m, 8);
    __m128i p = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mb)), g);
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(1, 0, 3, 2)));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(p);
}

#endif /* __x86_64__ */
#endif /* CELLM_X86_COMMON_H */
