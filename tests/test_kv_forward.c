/*
 * test_kv_forward.c — the compressed KV cache types (q8_0, q4_0, q4_0h,
 * k5v4h, and the window types q4_0hw, k5v4hw, q3_0hw, k4v3hw, k4cv4hw) on
 * both real models: batch invariance (a row's logits bit-identical as one
 * chunk, in pieces, token by token, beside another sequence, with 1 and 2
 * threads), and SmolLM2's perplexity over the forward fixture's text with
 * each type against f16 KV (Gemma 3's: test_kv_gemma3). Kept apart from
 * test_forward so that each runs within ctest's time limit under the
 * sanitizers. Under ThreadSanitizer test.sh runs only test_tsan_*.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "forward_rig.h"

static void test_ppl_smollm2(void **st) {
    (void)st;
    check_kv_perplexity("smollm2-135m");
}
/* Every compressed type keeps a row's result independent of the batch and
 * the threads (SmolLM2: 64-wide heads; Gemma 3: 256-wide, sliding window).
 * The test_tsan_ case (also what the aarch64 build runs under qemu) takes
 * the rotated window type, whose path has the most steps (rotation,
 * compressed rows, f16 copies from the pass and from the sequence). */
static void test_tsan_invariance_kv_smollm2(void **st) {
    (void)st;
    check_invariance("smollm2-135m", CELLM_KV_Q4_0HW);
}
static void test_invariance_kv_smollm2(void **st) {
    (void)st;
    check_invariance("smollm2-135m", CELLM_KV_Q8_0);
    check_invariance("smollm2-135m", CELLM_KV_Q4_0);
    check_invariance("smollm2-135m", CELLM_KV_Q4_0H);
    check_invariance("smollm2-135m", CELLM_KV_K4V3HW);  /* 4-bit keys, 3-bit values */
    check_invariance("smollm2-135m", CELLM_KV_K4CV4HW); /* keys per channel */
}
/* The 5-bit keys beside 4-bit values (K and V rows of two formats), also
 * under ASan. */
static void test_asan_invariance_k5v4h(void **st) {
    (void)st;
    check_invariance("smollm2-135m", CELLM_KV_K5V4H);
    check_invariance("smollm2-135m", CELLM_KV_K5V4HW);
}
static void test_invariance_kv_gemma3(void **st) {
    (void)st;
    check_invariance("gemma3-270m", CELLM_KV_Q8_0);
    check_invariance("gemma3-270m", CELLM_KV_Q4_0H);
    check_invariance("gemma3-270m", CELLM_KV_K5V4HW);
    check_invariance("gemma3-270m", CELLM_KV_Q3_0HW);
    check_invariance("gemma3-270m", CELLM_KV_K4CV4HW);
}

/* A window type's statistics (kv_calibrate): the same bits with 1 and 2
 * threads (one sequence, sums in batch order), finite, each head's
 * balance of mean square 1; Gemma 3's keys (QK-norm) have a mean to take
 * off. */
static void check_calibration(const char *name) {
    rig r1, r2;
    rig_open_kv(&r1, name, 1, 64, 1, CELLM_KV_Q4_0HW);
    rig_open_kv(&r2, name, 2, 128, 1, CELLM_KV_Q4_0HW);
    const model *m = r1.m;
    size_t cells = (size_t)m->n_layer * (size_t)(m->n_head_kv * m->head_dim);
    assert_non_null(r1.kv->kmean);
    assert_non_null(r2.kv->kscale);
    assert_memory_equal(r1.kv->kmean, r2.kv->kmean, cells * sizeof(float));
    assert_memory_equal(r1.kv->kscale, r2.kv->kscale, cells * sizeof(float));
    double mean_abs = 0;
    for (size_t i = 0; i < cells; i++) {
        assert_true(isfinite(r1.kv->kmean[i]) && isfinite(r1.kv->kscale[i]));
        assert_true(r1.kv->kscale[i] > 0);
        mean_abs += fabs(r1.kv->kmean[i]) / (double)cells;
    }
    for (size_t h = 0; h < cells / (size_t)m->head_dim; h++) {
        double ss = 0;
        for (int32_t c = 0; c < m->head_dim; c++) {
            double a = r1.kv->kscale[h * (size_t)m->head_dim + (size_t)c];
            ss += a * a;
        }
        assert_true(fabs(ss / m->head_dim - 1) < 1e-4);
    }
    print_message("%s: mean |key mean| %.4f\n", name, mean_abs);
    assert_true(mean_abs > 0);
    rig_close(&r1);
    rig_close(&r2);
}
static void test_calibration(void **st) {
    (void)st;
    check_calibration("smollm2-135m");
    check_calibration("gemma3-270m");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tsan_invariance_kv_smollm2),
        cmocka_unit_test(test_invariance_kv_smollm2),
        cmocka_unit_test(test_asan_invariance_k5v4h),
        cmocka_unit_test(test_invariance_kv_gemma3),
        cmocka_unit_test(test_ppl_smollm2),
        cmocka_unit_test(test_calibration),
    };
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
