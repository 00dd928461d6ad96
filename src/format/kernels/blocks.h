/*
 * blocks.h — the byte layout of one block of each quantized type, as GGUF
 * stores it (GGML's public layouts). Scales are F16 bit patterns (read them
 * with fp16_to_fp32), except Q8_K's, which is a float. Every struct is
 * checked against the block size in the type table. Only kernels include
 * this; the rest of the library sees blocks as bytes.
 */
#ifndef CELLM_KERNELS_BLOCKS_H
#define CELLM_KERNELS_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK4_NL 32
#define QK_K 256        /* elements per K-quant super-block */
#define K_SCALE_SIZE 12 /* packed 6-bit scales and mins of Q4_K and Q5_K */

/* x = d * (q - 8), q in 0..15; element j < 16 in the low nibble of qs[j],
 * element j + 16 in its high nibble. */
typedef struct {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0;

/* x = d * q + m, q in 0..15, nibbles as in Q4_0. */
typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1;

/* x = d * (q - 16), q in 0..31: low 4 bits as in Q4_0, bit 4 of element j
 * is bit j of qh (little-endian). */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;

/* A KV cache row format (not a GGUF type): x = d * (q - 4), q in 0..7;
 * the low 2 bits of element j are bits 2 * (j / 8) of qs[j % 8], bit 2 of
 * element j is bit j of qh (little-endian). 14 bytes, 3.5 bits a value. */
#define QK3_0 32
typedef struct {
    uint16_t d;
    uint8_t qs[8];
    uint8_t qh[4];
} block_q3_0;

/* x = d * q + m, q in 0..31, bits as in Q5_0. */
typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;

/* x = d * q. Also the activation format the 32-element types pair with. */
typedef struct {
    uint16_t d;
    int8_t qs[QK8_0];
} block_q8_0;

/* Q8_0 plus s = d * sum(qs) (F16, computed with the F32 d), as GGML's Q8_1
 * (its current 36-byte layout; old GGML used F32 d and s). */
typedef struct {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK8_0];
} block_q8_1;

/* A8 and A8S: the activation rows the 32-element weight types pair with,
 * made by matmul and never stored in files. Whole rows, not blocks: a row
 * of nb blocks of 32 is nb F32 scales d, then for A8S nb F32 sums s, then
 * the nb * 32 int8 codes, so the kernels load scales and codes of
 * consecutive blocks without converting or gathering. The values are
 * GGML's: the codes and F16-rounded scale of Q8_0 (A8), plus the
 * F16-rounded s of Q8_1 (A8S, for Q4_1 and Q5_1, whose minimum multiplies
 * the block sum). 36 and 40 bytes per block; rows must start 4-byte
 * aligned. */
static inline const float *a8_scales(const void *row) {
    return (const float *)row;
}
static inline const float *a8s_sums(const void *row, size_t nb) {
    return (const float *)row + nb;
}
static inline const int8_t *a8_codes(const void *row, size_t nb) {
    return (const int8_t *)row + 4 * nb;
}
static inline const int8_t *a8s_codes(const void *row, size_t nb) {
    return (const int8_t *)row + 8 * nb;
}

/* 16 groups of 16: x = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4),
 * q in 0..3. Element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]. */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} block_q2_K;

/* 16 groups of 16: x = d * (scale[g] - 32) * q, q in -4..3. Low 2 bits as
 * in Q2_K; element e subtracts 4 unless bit e/32 of hmask[e%32] is set.
 * The 16 six-bit scales are packed into 12 bytes: low nibbles in bytes
 * 0..7 (scale g in byte g%8, high nibble when g >= 8), top 2 bits in bytes
 * 8..11 (scale g in byte 8 + g%4, bits 2*(g/4)). */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} block_q3_K;

/* 8 groups of 32: x = d * sc[g] * q - dmin * m[g], q in 0..15, sc and m
 * 6-bit (see kq_scale_min below). Bytes 32c..32c+31 of qs hold group
 * 2c in the low nibbles and group 2c+1 in the high nibbles. */
typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;

/* As Q4_K with q in 0..31: bit 4 of element 32g + l is bit g of qh[l]. */
typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;

/* 16 groups of 16: x = d * scales[g] * (q - 32), q in 0..63. In each half
 * h (128 elements, ql + 64h, qh + 32h), element 32k + l (k 0..3, l 0..31)
 * takes its low 4 bits from ql[l + 32(k&1)] (high nibble when k >= 2) and
 * its top 2 bits from bits 2k..2k+1 of qh[l]. */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
} block_q6_K;

/* Activation format of the K-quants and IQ4_XS: x = d * q; bsums[g] is
 * the sum of qs over group g of 16, so a kernel can apply mins and
 * offsets per group without touching qs again. Never stored in files. */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

/* x = d * iq4nl_values[q], q in 0..15, nibbles as in Q4_0. */
typedef struct {
    uint16_t d;
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;

/* 8 groups of 32: x = d * (ls[g] - 32) * iq4nl_values[q]; ls is 6-bit, low
 * 4 bits in nibble g%2 of scales_l[g/2], top 2 bits at bit 2g of scales_h.
 * Group g's nibbles are bytes 16g..16g+15 of qs, laid out as in Q4_0. */
typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;

/* Scale and min of group j (0..7) from the 12 packed bytes of Q4_K/Q5_K:
 * groups 0..3 keep 6 bits in bytes j and j+4; groups 4..7 keep their low 4
 * bits in byte j+4 (scale low nibble, min high nibble) and their top 2 bits
 * in the spare top bits of bytes j-4 and j. */
static inline void kq_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
_Static_assert(sizeof(block_q3_0) == 14, "block_q3_0 size");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");

#endif /* CELLM_KERNELS_BLOCKS_H */
