/* test_sampler.c — token selection: greedy, seeds, truncation, and that
 * draws follow the distribution. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>

#include "sampler.h"

#define V 1000

static void fill(float *l) {
    for (int i = 0; i < V; i++) l[i] = (float)((i * 7919) % 1000) / 100.0f - 5.0f;
}

static void test_greedy(void **st) {
    (void)st;
    float l[V];
    fill(l);
    sampler_params p = sampler_default_params();
    sampler *s;
    assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
    int32_t best = sampler_argmax(l, V);
    assert_true(l[best] >= 4.98f);
    assert_int_equal(sampler_sample(s, l), best);
    l[3] = l[best]; /* a tie goes to the lowest id */
    assert_int_equal(sampler_argmax(l, V), best < 3 ? best : 3);
    sampler_free(s);
}

static void test_seed_repeats(void **st) {
    (void)st;
    float l[V];
    fill(l);
    sampler_params p = sampler_default_params();
    p.temperature = 1.0f;
    p.seed = 42;
    sampler *a, *b;
    assert_int_equal(sampler_create(&p, V, &a, NULL), CELLM_OK);
    assert_int_equal(sampler_create(&p, V, &b, NULL), CELLM_OK);
    int differ = 0;
    int32_t first[64];
    for (int i = 0; i < 64; i++) {
        first[i] = sampler_sample(a, l);
        assert_int_equal(first[i], sampler_sample(b, l));
    }
    sampler_reseed(a, 43);
    for (int i = 0; i < 64; i++) differ += sampler_sample(a, l) != first[i];
    assert_true(differ > 32);
    sampler_free(a);
    sampler_free(b);
}

static void test_truncation(void **st) {
    (void)st;
    float l[V];
    fill(l);
    sampler_params p = sampler_default_params();
    p.temperature = 2.0f;
    p.top_k = 3;
    sampler *s;
    assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
    /* The three best logits are the three largest values of fill(). */
    for (int i = 0; i < 500; i++) assert_true(l[sampler_sample(s, l)] >= 4.97f);
    sampler_free(s);
    p.top_k = 0;
    p.top_p = 1e-6f; /* only the best survives */
    assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
    for (int i = 0; i < 100; i++) assert_int_equal(sampler_sample(s, l), sampler_argmax(l, V));
    sampler_free(s);
    p.top_p = 1.0f;
    p.min_p = 0.9f; /* weight >= 0.9 of the best: within T*ln(1/0.9) = 0.21 */
    assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
    for (int i = 0; i < 500; i++) assert_true(l[sampler_sample(s, l)] >= 4.99f - 0.22f);
    sampler_free(s);
}

/* Two tokens with probabilities 0.75 / 0.25 (logits differ by ln 3). */
static void test_distribution(void **st) {
    (void)st;
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -1e9f;
    l[10] = (float)log(3.0);
    l[20] = 0.0f;
    static const int modes[][2] = {{0, 100}, {2, 100}, {0, 0}}; /* top_k, top_p% */
    for (int m = 0; m < 3; m++) {
        sampler_params p = sampler_default_params();
        p.temperature = 1.0f;
        p.top_k = modes[m][0];
        p.top_p = modes[m][1] ? modes[m][1] / 100.0f : 0.99f;
        sampler *s;
        assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
        int n10 = 0, n = 20000;
        for (int i = 0; i < n; i++) {
            int32_t t = sampler_sample(s, l);
            assert_true(t == 10 || t == 20);
            n10 += t == 10;
        }
        /* 0.75 +- 5 sigma (sigma = sqrt(.75 * .25 / n) = 0.003) */
        assert_true(fabs((double)n10 / n - 0.75) < 0.016);
        sampler_free(s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seed_repeats),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
