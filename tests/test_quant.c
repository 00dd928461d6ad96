/*
 * test_quant.c — the type table's kernels against independent references:
 * dequantization bit for bit against fixtures made with the `gguf` Python
 * package (scripts/gen_quant_fixtures.py), the legacy quantizers byte for
 * byte against the same, F16/BF16 conversions over every bit pattern,
 * quantize→dequantize error and dot-product error within llama.cpp's
 * bounds, and each vec_dot against a double-precision dot product of the
 * dequantized rows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>

#include <cmocka.h>

#include "format/kernels/fp16.h"
#include "format/kernels/kernels.h"
#include "format/quant.h"

#define FIXTURE_DIR CELLM_SOURCE_DIR "/tests/data/quant/"

/* One fixture file: header, then two arrays (see the generator). */
typedef struct fixture {
    uint32_t kind, type, n;
    uint8_t *blocks; /* n elements of `type` */
    float *values;   /* n floats */
    size_t nbytes;   /* bytes in blocks */
} fixture;

static uint32_t get_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void fixture_load(const char *name, fixture *fx) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", FIXTURE_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    uint8_t hdr[16];
    assert_int_equal(fread(hdr, 1, 16, f), 16);
    assert_memory_equal(hdr, "CQFX", 4);
    fx->kind = get_u32le(hdr + 4);
    fx->type = get_u32le(hdr + 8);
    fx->n = get_u32le(hdr + 12);
    uint64_t nbytes;
    assert_true(quant_nbytes(fx->type, fx->n, &nbytes));
    fx->nbytes = (size_t)nbytes;
    fx->blocks = malloc(fx->nbytes);
    fx->values = malloc(fx->n * sizeof(float));
    assert_non_null(fx->blocks);
    assert_non_null(fx->values);
    if (fx->kind == 0) {
        assert_int_equal(fread(fx->blocks, 1, fx->nbytes, f), fx->nbytes);
        assert_int_equal(fread(fx->values, sizeof(float), fx->n, f), fx->n);
    } else {
        assert_int_equal(fread(fx->values, sizeof(float), fx->n, f), fx->n);
        assert_int_equal(fread(fx->blocks, 1, fx->nbytes, f), fx->nbytes);
    }
    assert_int_equal(fgetc(f), EOF);
    fclose(f);
}

static void fixture_free(fixture *fx) {
    free(fx->blocks);
    free(fx->values);
}

/* Bitwise comparison that names the first differing element. */
static void assert_floats_identical(const char *what, const float *got, const float *want,
                                    size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (fp32_bits(got[i]) != fp32_bits(want[i])) {
            fail_msg("%s: element %zu is %a (0x%08x), expected %a (0x%08x)", what, i, got[i],
                     fp32_bits(got[i]), want[i], fp32_bits(want[i]));
        }
    }
}

static const char *const deq_fixtures[] = {
    "F32.deq.bin",  "F16.deq.bin",  "BF16.deq.bin",   "Q4_0.deq.bin",
    "Q4_1.deq.bin", "Q5_0.deq.bin", "Q5_1.deq.bin",   "Q8_0.deq.bin",
    "Q2_K.deq.bin", "Q3_K.deq.bin", "Q4_K.deq.bin",   "Q5_K.deq.bin",
    "Q6_K.deq.bin", "Q8_K.deq.bin", "IQ4_NL.deq.bin", "IQ4_XS.deq.bin",
};

static void test_dequantize_matches_gguf(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof deq_fixtures / sizeof *deq_fixtures; i++) {
        fixture fx;
        fixture_load(deq_fixtures[i], &fx);
        assert_int_equal(fx.kind, 0);
        const quant_type_info *info = quant_type_get(fx.type);
        assert_non_null(info);
        assert_non_null(info->to_float);
        float *out = malloc(fx.n * sizeof(float));
        assert_non_null(out);
        info->to_float(fx.blocks, out, fx.n);
        assert_floats_identical(deq_fixtures[i], out, fx.values, fx.n);
        free(out);
        fixture_free(&fx);
    }
}

static const char *const q_fixtures[] = {
    "F16.q.bin", "BF16.q.bin", "Q4_0.q.bin", "Q4_1.q.bin", "Q5_0.q.bin", "Q5_1.q.bin", "Q8_0.q.bin",
};

/* Our quantizers of the types gguf implements (exactly as GGML does) write
 * the same bytes. Checks both the table's variant and the reference. */
static void test_quantize_matches_gguf(void **state) {
    (void)state;
    static const quant_from_float_fn refs[] = {
        ref_quantize_f16,  ref_quantize_bf16, ref_quantize_q4_0, ref_quantize_q4_1,
        ref_quantize_q5_0, ref_quantize_q5_1, ref_quantize_q8_0};
    for (size_t i = 0; i < sizeof q_fixtures / sizeof *q_fixtures; i++) {
        fixture fx;
        fixture_load(q_fixtures[i], &fx);
        assert_int_equal(fx.kind, 1);
        const quant_type_info *info = quant_type_get(fx.type);
        assert_non_null(info);
        uint8_t *out = malloc(fx.nbytes);
        assert_non_null(out);
        for (int variant = 0; variant < 2; variant++) {
            memset(out, 0xAA, fx.nbytes);
            (variant ? refs[i] : info->from_float)(fx.values, out, fx.n);
            for (size_t b = 0; b < fx.nbytes; b++) {
                if (out[b] != fx.blocks[b]) {
                    fail_msg("%s (%s): byte %zu is 0x%02x, expected 0x%02x", q_fixtures[i],
                             variant ? "ref" : "table", b, out[b], fx.blocks[b]);
                }
            }
        }
        free(out);
        fixture_free(&fx);
    }
}

/* Every F16 and BF16 value converts to float and back unchanged (NaNs stay
 * NaN with the same sign); float→F16 rounds to nearest even, checked
 * against the neighbours of every F16 value. */
static void test_half_conversions_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fp16_to_fp32((uint16_t)h);
        const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0;
        assert_int_equal(isnan(f) != 0, nan);
        if (nan) {
            assert_true(isnan(fp16_to_fp32(fp32_to_fp16(f))));
        } else {
            assert_int_equal(fp32_to_fp16(f), h);
        }
        const float b = bf16_to_fp32((uint16_t)h);
        if (!isnan(b)) assert_int_equal(fp32_to_bf16(b), h);
        if (isnan(b)) assert_true(isnan(bf16_to_fp32(fp32_to_bf16(b))));

        /* Midpoints to the next F16 up (positive finite, below the largest):
         * ties go to the even code, a hair either side to the nearer one. */
        if (h < 0x7bff) {
            const double lo = fp16_to_fp32((uint16_t)h), hi = fp16_to_fp32((uint16_t)(h + 1));
            const float mid = (float)((lo + hi) / 2); /* exact: F16 needs few bits */
            const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            assert_int_equal(fp32_to_fp16(mid), even);
            assert_int_equal(fp32_to_fp16(nextafterf(mid, 0.0f)), h);
            assert_int_equal(fp32_to_fp16(nextafterf(mid, INFINITY)), h + 1);
            assert_int_equal(fp32_to_fp16(-mid), even | 0x8000);
        }
    }
    assert_int_equal(fp32_to_fp16(65520.0f), 0x7c00); /* ties to even: infinity */
    assert_int_equal(fp32_to_fp16(65519.99f), 0x7bff);
    assert_int_equal(fp32_to_fp16(1e-8f), 0x0000);
    assert_int_equal(fp32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(fp32_to_bf16(fp32_from_bits(0x7f7fffff)), 0x7f80); /* rounds to inf */
}

/* ---- llama.cpp's error bounds (tests/test-quantize-fns.cpp) ----
 * Data: 0.1 + 2 cos(i + offset), 4096 elements. "Error" is that file's
 * sqrt(sum of squared differences) / n, not an RMS. Its bounds:
 *   MAX_QUANTIZATION_TOTAL_ERROR       0.002   (default)
 *   MAX_QUANTIZATION_TOTAL_ERROR_2BITS 0.0075  (Q2_K)
 *   MAX_QUANTIZATION_TOTAL_ERROR_3BITS 0.0040  (Q3_K)
 *   MAX_DOT_PRODUCT_ERROR              0.02    (default)
 *   MAX_DOT_PRODUCT_ERROR_LOWBIT       0.04    (Q2_K)
 *   MAX_QUANTIZATION_REFERENCE_ERROR   0.0001  (F32 vec_dot for odd n) */
#define TEST_SIZE (32 * 128)

static void generate_data(float offset, size_t n, float *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = 0.1f + 2.0f * cosf((float)i + offset);
}

static float array_error(const float *a, const float *b, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        sum += d * d;
    }
    return (float)(sqrt(sum) / (double)n);
}

static const uint32_t computed_types[] = {QT_F32,  QT_F16,  QT_BF16,   QT_Q4_0,  QT_Q4_1, QT_Q5_0,
                                          QT_Q5_1, QT_Q8_0, QT_Q2_K,   QT_Q3_K,  QT_Q4_K, QT_Q5_K,
                                          QT_Q6_K, QT_Q8_K, QT_IQ4_NL, QT_IQ4_XS};
#define N_COMPUTED (sizeof computed_types / sizeof *computed_types)

static void test_roundtrip_error(void **state) {
    (void)state;
    static float data[TEST_SIZE], out[TEST_SIZE];
    static uint8_t q[TEST_SIZE * 4];
    generate_data(0.0f, TEST_SIZE, data);
    for (size_t i = 0; i < N_COMPUTED; i++) {
        const quant_type_info *info = quant_type_get(computed_types[i]);
        info->from_float(data, q, TEST_SIZE);
        info->to_float(q, out, TEST_SIZE);
        const float err = array_error(data, out, TEST_SIZE);
        const float bound = computed_types[i] == QT_Q2_K   ? 0.0075f
                            : computed_types[i] == QT_Q3_K ? 0.0040f
                                                           : 0.002f;
        print_message("%-7s round-trip error %.6f (bound %.4f)\n", info->name, err, bound);
        assert_true(err < bound);
    }
}

/* vec_dot on quantized rows, two ways: against the float dot product of
 * the original data (llama.cpp's bound), and against a double-precision
 * dot product of the dequantized rows, which it must match to within
 * float rounding: a sum of nb block terms, each a few roundings, so
 * (nb + 4) * FLT_EPSILON * sum |x_i y_i|. */
static void test_vec_dot(void **state) {
    (void)state;
    static float a[TEST_SIZE], b[TEST_SIZE], da[TEST_SIZE], db[TEST_SIZE];
    static uint8_t qa[TEST_SIZE * 4], qb[TEST_SIZE * 4];
    generate_data(0.0f, TEST_SIZE, a);
    generate_data(1.0f, TEST_SIZE, b);
    double exact = 0;
    for (size_t i = 0; i < TEST_SIZE; i++) exact += (double)a[i] * b[i];
    for (size_t i = 0; i < N_COMPUTED; i++) {
        const quant_type_info *info = quant_type_get(computed_types[i]);
        if (!info->vec_dot) continue;
        const quant_type_info *yinfo = quant_type_get(info->vec_dot_type);
        assert_non_null(yinfo);
        assert_non_null(yinfo->from_float);
        info->from_float(a, qa, TEST_SIZE);
        yinfo->from_float(b, qb, TEST_SIZE);
        const float got = info->vec_dot(TEST_SIZE, qa, qb);

        const float err = fabsf(got - (float)exact) / TEST_SIZE;
        const float bound = computed_types[i] == QT_Q2_K ? 0.04f : 0.02f;
        print_message("%-7s dot error %.6f (bound %.2f)\n", info->name, err, bound);
        assert_true(err < bound);

        info->to_float(qa, da, TEST_SIZE);
        yinfo->to_float(qb, db, TEST_SIZE);
        double dq = 0, mag = 0;
        for (size_t k = 0; k < TEST_SIZE; k++) {
            dq += (double)da[k] * db[k];
            mag += fabs((double)da[k] * db[k]);
        }
        const double nb = TEST_SIZE / info->block_size;
        const double tol = (nb + 4) * FLT_EPSILON * mag;
        if (fabs(got - dq) > tol) {
            fail_msg("%s: vec_dot %.9g, dequantized dot %.9g, tolerance %.3g", info->name, got, dq,
                     tol);
        }
    }
}

/* llama.cpp's F32 check for lengths that are not a multiple of anything. */
static void test_vec_dot_f32_odd_lengths(void **state) {
    (void)state;
    static const int sizes[] = {1,  2,  3,  5,  7,   8,   15,  16,  17,
                                31, 33, 63, 67, 127, 129, 193, 255, 1023};
    float a[1023], b[1023];
    uint16_t ha[1023], hb[1023];
    const quant_type_info *f32 = quant_type_get(QT_F32), *f16 = quant_type_get(QT_F16);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int n = sizes[s];
        generate_data(0.0f, (size_t)n, a);
        generate_data(1.0f, (size_t)n, b);
        double ref = 0;
        for (int i = 0; i < n; i++) ref += (double)a[i] * b[i];
        assert_true(fabs(f32->vec_dot((size_t)n, a, b) - ref) / n < 0.0001);
        /* F16 rows: exact against the dequantized values up to rounding. */
        f16->from_float(a, ha, (size_t)n);
        f16->from_float(b, hb, (size_t)n);
        double href = 0, mag = 0;
        for (int i = 0; i < n; i++) {
            const double p = (double)fp16_to_fp32(ha[i]) * fp16_to_fp32(hb[i]);
            href += p;
            mag += fabs(p);
        }
        assert_true(fabs(f16->vec_dot((size_t)n, ha, hb) - href) <= (n + 4) * FLT_EPSILON * mag);
    }
}

/* The table's shape: every computed type has all three kernels (Q8_K has
 * no vec_dot by design), pairs with a type whose from_float exists and
 * whose blocks tile its own. */
static void test_table_rows(void **state) {
    (void)state;
    for (size_t i = 0; i < N_COMPUTED; i++) {
        const quant_type_info *info = quant_type_get(computed_types[i]);
        assert_non_null(info);
        assert_non_null(info->to_float);
        assert_non_null(info->from_float);
        if (computed_types[i] == QT_Q8_K) {
            assert_null(info->vec_dot);
            continue;
        }
        assert_non_null(info->vec_dot);
        const quant_type_info *y = quant_type_get(info->vec_dot_type);
        assert_non_null(y);
        assert_non_null(y->from_float);
        assert_int_equal(info->block_size % y->block_size, 0);
    }
    const char *name = quant_kernels_name();
    assert_non_null(name);
    print_message("kernels: %s\n", name);
#if defined(__x86_64__)
    if (avx512_cpu_supported())
        assert_string_equal(name, "avx512-vnni");
    else if (avx2_cpu_supported())
        assert_string_equal(name, "avx2");
#endif
}

/* Zero rows stay zero; quantizers never write past n elements. */
static void test_zero_and_bounds(void **state) {
    (void)state;
    for (size_t i = 0; i < N_COMPUTED; i++) {
        const quant_type_info *info = quant_type_get(computed_types[i]);
        const size_t n = 2 * 256, bytes = n / info->block_size * info->type_size;
        float zero[512] = {0}, out[512];
        uint8_t q[2048];
        memset(q, 0x5A, sizeof q);
        info->from_float(zero, q, n);
        for (size_t b = bytes; b < sizeof q; b++) assert_int_equal(q[b], 0x5A);
        info->to_float(q, out, n);
        for (size_t k = 0; k < n; k++) assert_true(out[k] == 0.0f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_rows),
        cmocka_unit_test(test_dequantize_matches_gguf),
        cmocka_unit_test(test_quantize_matches_gguf),
        cmocka_unit_test(test_half_conversions_exhaustive),
        cmocka_unit_test(test_roundtrip_error),
        cmocka_unit_test(test_vec_dot),
        cmocka_unit_test(test_vec_dot_f32_odd_lengths),
        cmocka_unit_test(test_zero_and_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
