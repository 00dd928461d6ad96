/*
 * quant.c — the table of tensor types (see quant.h). Block sizes and block
 * byte counts are GGUF's public layouts. The kernel columns start as the
 * scalar reference; on first use, select_kernels() swaps in the SIMD
 * variants this CPU supports, once, under pthread_once, so every reader
 * sees one finished table.
 */
#include "format/quant.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "format/kernels/kernels.h"
#include "base/util.h"

/* Rows with kernels: name, elements per block, bytes per block, to_float,
 * from_float, vec_dot, vec_dot_type. SIZES_ONLY rows carry no kernels. */
#define SIZES_ONLY(n, bs, ts)                                                                      \
    { .name = n, .block_size = bs, .type_size = ts }
#define ROW(n, bs, ts, tf, ff, vd, vdt)                                                            \
    {                                                                                              \
        .name = n, .block_size = bs, .type_size = ts, .to_float = tf, .from_float = ff,            \
        .vec_dot = vd, .vec_dot_type = vdt                                                         \
    }

static quant_type_info type_table[QT_COUNT] = {
    [QT_F32] = ROW("F32", 1, 4, ref_dequantize_f32, ref_quantize_f32, ref_vec_dot_f32, QT_F32),
    [QT_F16] = ROW("F16", 1, 2, ref_dequantize_f16, ref_quantize_f16, ref_vec_dot_f16, QT_F16),
    [QT_BF16] =
        ROW("BF16", 1, 2, ref_dequantize_bf16, ref_quantize_bf16, ref_vec_dot_bf16, QT_BF16),
    [QT_Q4_0] =
        ROW("Q4_0", 32, 18, ref_dequantize_q4_0, ref_quantize_q4_0, ref_vec_dot_q4_0_a8, QT_A8),
    [QT_Q4_1] =
        ROW("Q4_1", 32, 20, ref_dequantize_q4_1, ref_quantize_q4_1, ref_vec_dot_q4_1_a8s, QT_A8S),
    [QT_Q5_0] =
        ROW("Q5_0", 32, 22, ref_dequantize_q5_0, ref_quantize_q5_0, ref_vec_dot_q5_0_a8, QT_A8),
    [QT_Q5_1] =
        ROW("Q5_1", 32, 24, ref_dequantize_q5_1, ref_quantize_q5_1, ref_vec_dot_q5_1_a8s, QT_A8S),
    [QT_Q8_0] =
        ROW("Q8_0", 32, 34, ref_dequantize_q8_0, ref_quantize_q8_0, ref_vec_dot_q8_0_a8, QT_A8),
    [QT_Q2_K] = ROW("Q2_K", 256, 84, ref_dequantize_q2_k, ref_quantize_q2_k, ref_vec_dot_q2_k_q8_k,
                    QT_Q8_K),
    [QT_Q3_K] = ROW("Q3_K", 256, 110, ref_dequantize_q3_k, ref_quantize_q3_k, ref_vec_dot_q3_k_q8_k,
                    QT_Q8_K),
    [QT_Q4_K] = ROW("Q4_K", 256, 144, ref_dequantize_q4_k, ref_quantize_q4_k, ref_vec_dot_q4_k_q8_k,
                    QT_Q8_K),
    [QT_Q5_K] = ROW("Q5_K", 256, 176, ref_dequantize_q5_k, ref_quantize_q5_k, ref_vec_dot_q5_k_q8_k,
                    QT_Q8_K),
    [QT_Q6_K] = ROW("Q6_K", 256, 210, ref_dequantize_q6_k, ref_quantize_q6_k, ref_vec_dot_q6_k_q8_k,
                    QT_Q8_K),
    /* Q8_1 and Q8_K are only ever the y of a dot product: no vec_dot of
     * their own. Q8_1 is GGML's current 36-byte block (the gguf Python
     * package still lists the old 40-byte one). cellm's kernels pair the
     * 32-element types with its own row formats A8 and A8S instead. */
    [QT_Q8_1] = ROW("Q8_1", 32, 36, ref_dequantize_q8_1, ref_quantize_q8_1, NULL, QT_Q8_1),
    [QT_Q8_K] = ROW("Q8_K", 256, 292, ref_dequantize_q8_k, ref_quantize_q8_k, NULL, QT_Q8_K),
    [QT_IQ4_NL] = ROW("IQ4_NL", 32, 18, ref_dequantize_iq4_nl, ref_quantize_iq4_nl,
                      ref_vec_dot_iq4_nl_a8, QT_A8),
    [QT_IQ4_XS] = ROW("IQ4_XS", 256, 136, ref_dequantize_iq4_xs, ref_quantize_iq4_xs,
                      ref_vec_dot_iq4_xs_q8_k, QT_Q8_K),

    [QT_A8] = {.name = "A8",
               .block_size = 32,
               .type_size = 36,
               .to_float = ref_dequantize_a8,
               .from_float = ref_quantize_a8,
               .vec_dot_type = QT_A8,
               .internal = true},
    [QT_A8S] = {.name = "A8S",
                .block_size = 32,
                .type_size = 40,
                .to_float = ref_dequantize_a8s,
                .from_float = ref_quantize_a8s,
                .vec_dot_type = QT_A8S,
                .internal = true},

    /* Sizes only: no kernels yet. */
    [QT_IQ2_XXS] = SIZES_ONLY("IQ2_XXS", 256, 66),
    [QT_IQ2_XS] = SIZES_ONLY("IQ2_XS", 256, 74),
    [QT_IQ3_XXS] = SIZES_ONLY("IQ3_XXS", 256, 98),
    [QT_IQ1_S] = SIZES_ONLY("IQ1_S", 256, 50),
    [QT_IQ3_S] = SIZES_ONLY("IQ3_S", 256, 110),
    [QT_IQ2_S] = SIZES_ONLY("IQ2_S", 256, 82),
    [QT_I8] = SIZES_ONLY("I8", 1, 1),
    [QT_I16] = SIZES_ONLY("I16", 1, 2),
    [QT_I32] = SIZES_ONLY("I32", 1, 4),
    [QT_I64] = SIZES_ONLY("I64", 1, 8),
    [QT_F64] = SIZES_ONLY("F64", 1, 8),
    [QT_IQ1_M] = SIZES_ONLY("IQ1_M", 256, 56),
    [QT_TQ1_0] = SIZES_ONLY("TQ1_0", 256, 54),
    [QT_TQ2_0] = SIZES_ONLY("TQ2_0", 256, 66),
    [QT_MXFP4] = SIZES_ONLY("MXFP4", 32, 17),
};

static pthread_once_t select_once = PTHREAD_ONCE_INIT;
static const char *kernels_name = "ref";

/* Runs once, before any row is handed out. $CELLM_KERNELS=ref keeps the
 * scalar reference, =avx2 stops short of AVX-512 (for tests and for
 * checking that every variant computes the same bits); anything else, or
 * unset, takes the best this CPU runs. */
static void select_kernels(void) {
    const char *want = getenv("CELLM_KERNELS");
    if (want && !strcmp(want, "ref")) return;
#if defined(__x86_64__)
    if (avx2_cpu_supported()) {
        quant_type_info *t = type_table;
        t[QT_A8].from_float = avx2_quantize_a8;
        t[QT_A8S].from_float = avx2_quantize_a8s;
        t[QT_Q8_K].from_float = avx2_quantize_q8_k;
        t[QT_F16].vec_dot = avx2_vec_dot_f16;
        t[QT_F16].dot4_y = avx2_dot4_y_f16;
#define SET_DOT32(T, name) (t[T].vec_dot = avx2_vec_dot_##name, t[T].dot4_y = avx2_dot4_y_##name)
        SET_DOT32(QT_Q4_0, q4_0_a8);
        SET_DOT32(QT_Q4_1, q4_1_a8s);
        SET_DOT32(QT_Q5_0, q5_0_a8);
        SET_DOT32(QT_Q8_0, q8_0_a8);
#undef SET_DOT32
        t[QT_Q4_K].vec_dot = avx2_vec_dot_q4_k_q8_k;
        t[QT_Q5_K].vec_dot = avx2_vec_dot_q5_k_q8_k;
        t[QT_Q6_K].vec_dot = avx2_vec_dot_q6_k_q8_k;
        t[QT_Q4_K].dot4_y = avx2_dot4_y_q4_k_q8_k;
        t[QT_Q5_K].dot4_y = avx2_dot4_y_q5_k_q8_k;
        t[QT_Q6_K].dot4_y = avx2_dot4_y_q6_k_q8_k;
        kernels_name = "avx2";
        if (avx512_cpu_supported() && !(want && !strcmp(want, "avx2"))) {
            /* Same results as the AVX2 kernels. */
#define SET_DOT512(T, name)                                                                        \
    (t[T].vec_dot = avx512_vec_dot_##name, t[T].dot4_y = avx512_dot4_y_##name,                     \
     t[T].dot8_y = avx512_dot8_y_##name, t[T].dot8_y_x2 = avx512_dot8_y_x2_##name)
            t[QT_A8].from_float = avx512_quantize_a8;
            t[QT_A8S].from_float = avx512_quantize_a8s;
            SET_DOT512(QT_Q4_0, q4_0_a8);
            SET_DOT512(QT_Q4_1, q4_1_a8s);
            SET_DOT512(QT_Q5_0, q5_0_a8);
            SET_DOT512(QT_Q8_0, q8_0_a8);
#undef SET_DOT512
            t[QT_Q4_K].vec_dot = avx512_vec_dot_q4_k_q8_k;
            t[QT_Q4_K].dot4_y = avx512_dot4_y_q4_k_q8_k;
            t[QT_Q4_K].dot8_y = avx512_dot8_y_q4_k_q8_k;
            t[QT_Q6_K].vec_dot = avx512_vec_dot_q6_k_q8_k;
            t[QT_Q6_K].dot4_y = avx512_dot4_y_q6_k_q8_k;
            t[QT_Q6_K].dot8_y = avx512_dot8_y_q6_k_q8_k;
            t[QT_F16].dot4_y = avx512_dot4_y_f16;
            t[QT_F16].dot8_y = avx512_dot8_y_f16;
            kernels_name = "avx512-vnni";
        }
    }
#elif defined(__aarch64__)
    quant_type_info *t = type_table;
    const bool dp = neon_dotprod_supported();
    t[QT_A8].from_float = neon_quantize_a8;
    t[QT_A8S].from_float = neon_quantize_a8s;
    t[QT_F16].vec_dot = neon_vec_dot_f16;
    t[QT_F16].dot4_y = neon_dot4_y_f16;
#define SET_DOT32(T, name)                                                                         \
    (t[T].vec_dot = dp ? neon_dotprod_vec_dot_##name : neon_vec_dot_##name,                        \
     t[T].dot4_y = dp ? neon_dotprod_dot4_y_##name : neon_dot4_y_##name)
    SET_DOT32(QT_Q4_0, q4_0_a8);
    SET_DOT32(QT_Q4_1, q4_1_a8s);
    SET_DOT32(QT_Q5_0, q5_0_a8);
    SET_DOT32(QT_Q8_0, q8_0_a8);
    SET_DOT32(QT_Q4_K, q4_k_q8_k);
    SET_DOT32(QT_Q5_K, q5_k_q8_k);
    SET_DOT32(QT_Q6_K, q6_k_q8_k);
#undef SET_DOT32
    kernels_name = dp ? "neon-dotprod" : "neon";
#endif
}

static void ensure_selected(void) {
    /* pthread_once cannot fail with a valid once object and routine. */
    (void)pthread_once(&select_once, select_kernels);
}

const quant_type_info *quant_type_get(uint32_t type) {
    ensure_selected();
    if (type >= QT_COUNT || type_table[type].name == NULL) return NULL;
    return &type_table[type];
}

const quant_type_info *quant_type_by_name(const char *name, uint32_t *type) {
    if (!name) return NULL;
    ensure_selected();
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        if (type_table[t].name && !type_table[t].internal &&
            strcasecmp(type_table[t].name, name) == 0) {
            if (type) *type = t;
            return &type_table[t];
        }
    }
    return NULL;
}

bool quant_nbytes(uint32_t type, uint64_t n, uint64_t *bytes) {
    const quant_type_info *info = quant_type_get(type);
    if (!info || n % info->block_size != 0) return false;
    return u64_mul(n / info->block_size, info->type_size, bytes);
}

const char *quant_kernels_name(void) {
    ensure_selected();
    return kernels_name;
}
