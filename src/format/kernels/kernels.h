/*
 * kernels.h — every conversion and dot-product kernel, by instruction set.
 * The type table (quant.c) is the only caller on the inference path: it
 * holds one of these per type and slot, chosen once at start-up. Tests call
 * them directly to compare a SIMD kernel with its reference.
 *
 * Signatures (the same for every variant, see quant.h):
 *   dequantize: (const void *src, float *dst, size_t n)
 *   quantize:   (const float *src, void *dst, size_t n)
 *   vec_dot:    float (size_t n, const void *x, const void *y)
 * `n` counts elements and must be a whole number of the type's blocks (any
 * n for F32/F16/BF16). vec_dot's x is a row of the weight type, y a row of
 * the activation type it pairs with (the name says both). None allocates,
 * none keeps a pointer, all are thread-safe.
 *
 * ref_*: plain C, the truth every other variant is tested against.
 * avx2_*: x86-64 with AVX2, FMA and F16C; call only when the CPU has them.
 * neon_*: any AArch64; neon_dotprod_*: AArch64 with SDOT (ARMv8.2 dotprod).
 */
#ifndef CELLM_KERNELS_H
#define CELLM_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The 16 levels of IQ4_NL and IQ4_XS (a fixed non-linear grid). */
extern const int8_t iq4nl_values[16];

/* ---- scalar reference (ref.c) ---- */
void ref_dequantize_f32(const void *src, float *dst, size_t n);
void ref_dequantize_f16(const void *src, float *dst, size_t n);
void ref_dequantize_bf16(const void *src, float *dst, size_t n);
void ref_dequantize_q4_0(const void *src, float *dst, size_t n);
void ref_dequantize_q4_1(const void *src, float *dst, size_t n);
void ref_dequantize_q5_0(const void *src, float *dst, size_t n);
void ref_dequantize_q5_1(const void *src, float *dst, size_t n);
void ref_dequantize_q8_0(const void *src, float *dst, size_t n);
void ref_dequantize_q8_1(const void *src, float *dst, size_t n);
void ref_dequantize_a8(const void *src, float *dst, size_t n);
void ref_dequantize_a8s(const void *src, float *dst, size_t n);
void ref_dequantize_q2_k(const void *src, float *dst, size_t n);
void ref_dequantize_q3_k(const void *src, float *dst, size_t n);
void ref_dequantize_q4_k(const void *src, float *dst, size_t n);
void ref_dequantize_q5_k(const void *src, float *dst, size_t n);
void ref_dequantize_q6_k(const void *src, float *dst, size_t n);
void ref_dequantize_q8_k(const void *src, float *dst, size_t n);
void ref_dequantize_iq4_nl(const void *src, float *dst, size_t n);
void ref_dequantize_iq4_xs(const void *src, float *dst, size_t n);

void ref_quantize_f32(const float *src, void *dst, size_t n);
void ref_quantize_f16(const float *src, void *dst, size_t n);
void ref_quantize_bf16(const float *src, void *dst, size_t n);
void ref_quantize_q4_0(const float *src, void *dst, size_t n);
void ref_quantize_q4_1(const float *src, void *dst, size_t n);
void ref_quantize_q5_0(const float *src, void *dst, size_t n);
/* The KV cache's 3-bit rows (block_q3_0): as Q4_0 with 8 levels. */
void ref_quantize_q3_0(const float *src, void *dst, size_t n);
void ref_quantize_q5_1(const float *src, void *dst, size_t n);
void ref_quantize_q8_0(const float *src, void *dst, size_t n);
void ref_quantize_q8_1(const float *src, void *dst, size_t n);
void ref_quantize_a8(const float *src, void *dst, size_t n);
void ref_quantize_a8s(const float *src, void *dst, size_t n);
void ref_quantize_q2_k(const float *src, void *dst, size_t n);
void ref_quantize_q3_k(const float *src, void *dst, size_t n);
void ref_quantize_q4_k(const float *src, void *dst, size_t n);
void ref_quantize_q5_k(const float *src, void *dst, size_t n);
void ref_quantize_q6_k(const float *src, void *dst, size_t n);
void ref_quantize_q8_k(const float *src, void *dst, size_t n);
void ref_quantize_iq4_nl(const float *src, void *dst, size_t n);
void ref_quantize_iq4_xs(const float *src, void *dst, size_t n);

float ref_vec_dot_f32(size_t n, const void *x, const void *y);
float ref_vec_dot_f16(size_t n, const void *x, const void *y);
float ref_vec_dot_bf16(size_t n, const void *x, const void *y);
float ref_vec_dot_q4_0_a8(size_t n, const void *x, const void *y);
float ref_vec_dot_q4_1_a8s(size_t n, const void *x, const void *y);
float ref_vec_dot_q5_0_a8(size_t n, const void *x, const void *y);
float ref_vec_dot_q5_1_a8s(size_t n, const void *x, const void *y);
float ref_vec_dot_q8_0_a8(size_t n, const void *x, const void *y);
float ref_vec_dot_q2_k_q8_k(size_t n, const void *x, const void *y);
float ref_vec_dot_q3_k_q8_k(size_t n, const void *x, const void *y);
float ref_vec_dot_q4_k_q8_k(size_t n, const void *x, const void *y);
float ref_vec_dot_q5_k_q8_k(size_t n, const void *x, const void *y);
float ref_vec_dot_q6_k_q8_k(size_t n, const void *x, const void *y);
float ref_vec_dot_iq4_nl_a8(size_t n, const void *x, const void *y);
float ref_vec_dot_iq4_xs_q8_k(size_t n, const void *x, const void *y);

/* ---- x86-64 AVX2 + FMA + F16C (x86_avx2.c) ---- */
#if defined(__x86_64__)
/* True when this CPU (and OS) runs the avx2_* kernels. */
bool avx2_cpu_supported(void);
void avx2_quantize_a8(const float *src, void *dst, size_t n);
void avx2_quantize_a8s(const float *src, void *dst, size_t n);
void avx2_quantize_q8_k(const float *src, void *dst, size_t n);
float avx2_vec_dot_f16(size_t n, const void *x, const void *y);
/* One F16 weight row against four F16 rows, each pair's bits avx2_vec_dot_f16's. */
void avx2_dot4_y_f16(size_t n, const void *x, size_t xs, const void *y, size_t ys, float out[4]);
float avx2_vec_dot_q4_0_a8(size_t n, const void *x, const void *y);
float avx2_vec_dot_q4_1_a8s(size_t n, const void *x, const void *y);
float avx2_vec_dot_q5_0_a8(size_t n, const void *x, const void *y);
float avx2_vec_dot_q8_0_a8(size_t n, const void *x, const void *y);
/* Tiles of four activation rows (quant_vec_dot4_fn); each result
 * bit-identical to the vec_dot above. */
#define CELLM_AVX2_DOT4(name)                                                                      \
    void avx2_dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,          \
                            float out[4]);
CELLM_AVX2_DOT4(q4_0_a8)
CELLM_AVX2_DOT4(q4_1_a8s)
CELLM_AVX2_DOT4(q5_0_a8)
CELLM_AVX2_DOT4(q8_0_a8)
void avx2_dot4_y_q4_k_q8_k(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                           float out[4]);
void avx2_dot4_y_q5_k_q8_k(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                           float out[4]);
void avx2_dot4_y_q6_k_q8_k(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                           float out[4]);

/* ---- x86-64 AVX-512 F/BW/VL + VNNI (x86_avx512.c) ---- */
/* True when this CPU (and OS) runs the avx512_* kernels; implies AVX2. */
bool avx512_cpu_supported(void);
void avx512_quantize_a8(const float *src, void *dst, size_t n);
void avx512_quantize_a8s(const float *src, void *dst, size_t n);
/* Bit-identical to the avx2_ kernels of the same name; dot8_y_x2 is
 * dot8_y on pairs of weight rows (x + w * xs, w < 2 * pairs), out[i * os +
 * w]. */
#define CELLM_AVX512_DOT(name)                                                                     \
    float avx512_vec_dot_##name(size_t n, const void *x, const void *y);                           \
    void avx512_dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,        \
                              float out[4]);                                                       \
    void avx512_dot8_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,        \
                              float out[8]);                                                       \
    void avx512_dot8_y_x2_##name(size_t n, const void *x, size_t xs, size_t pairs, const void *y,  \
                                 size_t ys, float *out, size_t os);
CELLM_AVX512_DOT(q4_0_a8)
CELLM_AVX512_DOT(q4_1_a8s)
CELLM_AVX512_DOT(q5_0_a8)
CELLM_AVX512_DOT(q8_0_a8)
/* Q4_K: vec_dot and dot4_y, bit-identical to the avx2_ and ref_ ones. */
float avx512_vec_dot_q4_k_q8_k(size_t n, const void *x, const void *y);
void avx512_dot4_y_q4_k_q8_k(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                             float out[4]);
void avx512_dot8_y_q4_k_q8_k(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                             float out[8]);
/* Q6_K: the same for its vec_dot, dot4_y and dot8_y. */
float avx512_vec_dot_q6_k_q8_k(size_t n, const void *x, const void *y);
void avx512_dot4_y_q6_k_q8_k(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                             float out[4]);
void avx512_dot8_y_q6_k_q8_k(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                             float out[8]);
/* F16: tiles of four and eight activation rows, bit-identical to
 * avx2_vec_dot_f16 (and so to ref_vec_dot_f16). */
void avx512_dot4_y_f16(size_t n, const void *x, size_t xs, const void *y, size_t ys, float out[4]);
void avx512_dot8_y_f16(size_t n, const void *x, size_t xs, const void *y, size_t ys, float out[8]);
float avx2_vec_dot_q4_k_q8_k(size_t n, const void *x, const void *y);
float avx2_vec_dot_q5_k_q8_k(size_t n, const void *x, const void *y);
float avx2_vec_dot_q6_k_q8_k(size_t n, const void *x, const void *y);
#endif

/* ---- AArch64 NEON, with SDOT variants (arm_neon.c) ---- */
#if defined(__aarch64__)
/* True when this CPU runs the neon_dotprod_* kernels (plain neon_* run on
 * every AArch64 CPU). */
bool neon_dotprod_supported(void);
void neon_quantize_a8(const float *src, void *dst, size_t n);
void neon_quantize_a8s(const float *src, void *dst, size_t n);
float neon_vec_dot_f16(size_t n, const void *x, const void *y);
/* One F16 weight row against four F16 rows, each pair's bits neon_vec_dot_f16's. */
void neon_dot4_y_f16(size_t n, const void *x, size_t xs, const void *y, size_t ys, float out[4]);
/* The 32-element types: vec_dot and its tile of four activation rows
 * (quant_vec_dot4_fn), each result bit-identical to the vec_dot of the
 * same variant. */
#define CELLM_NEON_DOT32(prefix, name)                                                             \
    float prefix##vec_dot_##name(size_t n, const void *x, const void *y);                          \
    void prefix##dot4_y_##name(size_t n, const void *x, size_t xs, const void *y, size_t ys,       \
                               float out[4]);
CELLM_NEON_DOT32(neon_, q4_0_a8)
CELLM_NEON_DOT32(neon_, q4_1_a8s)
CELLM_NEON_DOT32(neon_, q5_0_a8)
CELLM_NEON_DOT32(neon_, q8_0_a8)
CELLM_NEON_DOT32(neon_dotprod_, q4_0_a8)
CELLM_NEON_DOT32(neon_dotprod_, q4_1_a8s)
CELLM_NEON_DOT32(neon_dotprod_, q5_0_a8)
CELLM_NEON_DOT32(neon_dotprod_, q8_0_a8)
/* The K-quants against Q8_K, and their tiles of four: the reference's
 * float, exactly. */
CELLM_NEON_DOT32(neon_, q4_k_q8_k)
CELLM_NEON_DOT32(neon_, q5_k_q8_k)
CELLM_NEON_DOT32(neon_, q6_k_q8_k)
CELLM_NEON_DOT32(neon_dotprod_, q4_k_q8_k)
CELLM_NEON_DOT32(neon_dotprod_, q5_k_q8_k)
CELLM_NEON_DOT32(neon_dotprod_, q6_k_q8_k)
#endif

#endif /* CELLM_KERNELS_H */
