/* test_matmul.c — the batched matmul: against a float reference built from
 * the dequantized weights, and batch invariance: each row's output is
 * bit-identical for m = 1, 7 and 64 and for 1 and 2 threads, for every
 * weight type the real models use, and for every m from 2 to 17 (each
 * remainder after the tiles of eight and four, which the matmul fills up
 * with pad rows), without a write past row m. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "cpu/matmul.h"
#include "format/quant.h"

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
    for (int m = 2; m <= 17; m++) {
        int r0 = (m * 3) % (M - m);
        memset(y, 0x7f, sizeof(float) * M * N);
        matmul(tp2, w, type, N, K, x + r0 * K, m, y, scratch);
        assert_memory_equal(y, y64 + r0 * N, sizeof(float) * N * (size_t)m);
        for (size_t i = (size_t)m * N; i < (size_t)M * N; i++)
            assert_int_equal(((uint32_t *)y)[i], 0x7f7f7f7fu);
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

/* matmul_multi: three weights on one input give, bit for bit, what three
 * matmul() calls give, for m = 1, 5 and 64 and 1 and 2 threads, with row
 * counts that do not split evenly between the threads; sets sharing an
 * activation format (A8, A8S, Q8_K), also with the rows quantized by the
 * caller, and one mixing A8 and A8S, which runs as separate calls. */
static void check_multi(const uint32_t types[3]) {
    static const int64_t ns[3] = {40, 17, 33};
    uint8_t *w[3];
    float *yref[3], *y[3], *x = malloc(sizeof(float) * M * K);
    uint64_t seed = 99;
    for (int i = 0; i < M * K; i++) x[i] = frand(&seed);
    size_t scratch_bytes = 0;
    for (int i = 0; i < 3; i++) {
        const quant_type_info *qi = quant_type_get(types[i]);
        uint64_t rb;
        assert_true(quant_nbytes(types[i], K, &rb));
        w[i] = malloc((size_t)rb * (size_t)ns[i]);
        float row[K];
        for (int64_t j = 0; j < ns[i]; j++) {
            for (int e = 0; e < K; e++) row[e] = frand(&seed);
            qi->from_float(row, w[i] + (size_t)rb * (size_t)j, K);
        }
        yref[i] = malloc(sizeof(float) * M * (size_t)ns[i]);
        y[i] = malloc(sizeof(float) * M * (size_t)ns[i]);
        size_t sb = matmul_scratch_size(types[i], K, M);
        if (sb > scratch_bytes) scratch_bytes = sb;
    }
    void *scratch = malloc(scratch_bytes);
    threadpool *tp[2];
    assert_int_equal(tp_create(1, &tp[0], NULL), CELLM_OK);
    assert_int_equal(tp_create(2, &tp[1], NULL), CELLM_OK);
    static const int ms[] = {1, 5, M};
    for (int t = 0; t < 2; t++)
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
            matmul_job jobs[3];
            for (int i = 0; i < 3; i++) {
                matmul(tp[t], w[i], types[i], ns[i], K, x, ms[mi], yref[i], scratch);
                jobs[i] = (matmul_job){.w = w[i], .type = types[i], .n = ns[i], .y = y[i]};
                memset(y[i], 0xff, sizeof(float) * M * (size_t)ns[i]);
            }
            matmul_multi(tp[t], jobs, 3, K, x, ms[mi], scratch, false, NULL);
            for (int i = 0; i < 3; i++)
                assert_memory_equal(y[i], yref[i], sizeof(float) * (size_t)ms[mi] * (size_t)ns[i]);
            if (!matmul_shares_input(jobs, 3)) continue;
            /* The rows quantized by the caller, one at a time, and no x:
             * the same bits. */
            size_t rb = matmul_input_row_bytes(types[0], K);
            assert_int_equal(rb % 64, 0);
            memset(scratch, 0xa5, scratch_bytes);
            for (int r = 0; r < ms[mi]; r++) {
                uint8_t *row = matmul_input_row(types[0], K, scratch, r);
                assert_ptr_equal(row,
                                 (uint8_t *)matmul_input_row(types[0], K, scratch, 0) + r * rb);
                /* A8 and A8S codes (after 4 or 8 bytes a block) on a cache line */
                uint32_t xt = quant_type_get(types[0])->vec_dot_type;
                if (xt == QT_A8 || xt == QT_A8S)
                    assert_int_equal(((uintptr_t)row + (xt == QT_A8 ? 4 : 8) * (K / 32)) % 64, 0);
                matmul_quantize_row(types[0], K, x + (size_t)r * K, row);
            }
            for (int i = 0; i < 3; i++) memset(y[i], 0xff, sizeof(float) * M * (size_t)ns[i]);
            /* ... with memory to prefetch meanwhile (regions of odd
             * lengths, one of a byte): a hint, the same bits. */
            const char *pf_base[] = {(const char *)x, (const char *)w[0], (const char *)x + 4};
            const size_t pf_len[] = {sizeof(float) * M * K, 1, 99};
            const matmul_prefetch pf = {pf_base, pf_len, 3};
            /* ... and each thread's first weight rows prefetched before,
             * for more threads than tiles too, and more bytes than the
             * weights hold: a hint, the same bits. */
            for (int nth = 1; nth <= 9; nth += 4)
                for (int ith = 0; ith < nth; ith++)
                    matmul_prefetch_start(jobs, 3, K, ith, nth, ith % 2 ? 64 : 1 << 20);
            matmul_multi(tp[t], jobs, 3, K, NULL, ms[mi], scratch, true, &pf);
            for (int i = 0; i < 3; i++)
                assert_memory_equal(y[i], yref[i], sizeof(float) * (size_t)ms[mi] * (size_t)ns[i]);
        }
    tp_destroy(tp[0]);
    tp_destroy(tp[1]);
    for (int i = 0; i < 3; i++) {
        free(w[i]);
        free(yref[i]);
        free(y[i]);
    }
    free(scratch);
    free(x);
}

static void test_multi(void **st) {
    (void)st;
    check_multi((const uint32_t[3]){QT_Q4_0, QT_Q8_0, QT_Q4_0});
    check_multi((const uint32_t[3]){QT_Q4_1, QT_Q4_1, QT_Q4_1});
    check_multi((const uint32_t[3]){QT_Q4_K, QT_Q6_K, QT_Q4_K});
    check_multi((const uint32_t[3]){QT_Q4_0, QT_Q4_1, QT_Q8_0}); /* A8 and A8S: separate */
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_types), cmocka_unit_test(test_multi)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
