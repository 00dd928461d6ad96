/* test_matmul.c — the batched matmul: against a float reference built from
 * the dequantized weights, and batch invariance: each row's output is
 * bit-identical for m = 1, 7 and 64 and for 1 and 2 threads, for every
 * weight type the real models use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "matmul.h"
#include "quant.h"

enum { N = 48, K = 512, M = 64 };

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static void check_type(uint32_t type) {
    const quant_type_info *qi = quant_type_get(type);
    assert_non_null(qi->vec_dot);
    uint64_t row_bytes;
    assert_true(quant_nbytes(type, K, &row_bytes));
    uint8_t *w = malloc((size_t)row_bytes * N);
    float *wf = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    uint64_t seed = 1234 + type;
    for (int i = 0; i < N * K; i++) wf[i] = frand(&seed);
    for (int i = 0; i < M * K; i++) x[i] = frand(&seed) * (i % 97 == 0 ? 8.0f : 1.0f);
    for (int j = 0; j < N; j++) qi->from_float(wf + j * K, w + (size_t)j * row_bytes, K);
    size_t scratch_bytes = matmul_scratch_size(type, K, M);
    void *scratch = malloc(scratch_bytes);
    float *y64 = malloc(sizeof(float) * M * N), *y = malloc(sizeof(float) * M * N);
    threadpool *tp1, *tp2;
    assert_int_equal(tp_create(1, &tp1, NULL), CELLM_OK);
    assert_int_equal(tp_create(2, &tp2, NULL), CELLM_OK);
    matmul(tp2, w, type, N, K, x, M, y64, scratch);
    /* Against float math on the dequantized weights: the only differences
     * are the activation quantization's (8 bits) and summation order. */
    float deq[K];
    for (int j = 0; j < N; j++) {
        matrix_get_row(w, type, K, j, deq);
        for (int r = 0; r < M; r += 9) {
            double ref = 0, mag = 0;
            for (int i = 0; i < K; i++) {
                ref += (double)deq[i] * x[r * K + i];
                mag += fabs((double)deq[i] * x[r * K + i]);
            }
            assert_true(fabs(y64[r * N + j] - ref) <= 0.02 * mag + 1e-4);
        }
    }
    /* Batch invariance: m = 1, 7 (rows 0..6 and 7..13) and 1 thread. */
    for (int r = 0; r < M; r++) {
        matmul(tp1, w, type, N, K, x + r * K, 1, y, scratch);
        assert_memory_equal(y, y64 + r * N, sizeof(float) * N);
    }
    for (int r0 = 0; r0 + 7 <= M; r0 += 7) {
        matmul(tp2, w, type, N, K, x + r0 * K, 7, y, scratch);
        assert_memory_equal(y, y64 + r0 * N, sizeof(float) * N * 7);
    }
    matmul(tp1, w, type, N, K, x, M, y, scratch);
    assert_memory_equal(y, y64, sizeof(float) * N * M);
    tp_destroy(tp1);
    tp_destroy(tp2);
    free(y);
    free(y64);
    free(scratch);
    free(x);
    free(wf);
    free(w);
}

static void test_types(void **st) {
    (void)st;
    static const uint32_t types[] = {QT_F32,  QT_F16,  QT_Q4_0, QT_Q4_1, QT_Q5_0,
                                     QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) check_type(types[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_types)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
