/* test_sampler.c — token selection: greedy, seeds, truncation, and that
 * draws follow the distribution; logit bias, repetition, presence and
 * frequency penalties over a window, the n-gram guard and typical-p. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

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

/* Logits that are -1e9 everywhere but at the listed tokens. */
static void sparse(float *l, int n, const int *tok, const float *val) {
    for (int i = 0; i < V; i++) l[i] = -1e9f;
    for (int i = 0; i < n; i++) l[tok[i]] = val[i];
}

static int32_t greedy_with(const sampler_params *p, const float *l, const int32_t *hist, int n) {
    sampler *s;
    assert_int_equal(sampler_create(p, V, &s, NULL), CELLM_OK);
    for (int i = 0; i < n; i++) assert_int_equal(sampler_accept(s, hist[i], NULL), CELLM_OK);
    int32_t t = sampler_sample(s, l);
    sampler_free(s);
    return t;
}

static void test_logit_bias(void **st) {
    (void)st;
    float l[V];
    fill(l);
    int32_t best = sampler_argmax(l, V);
    sampler_logit_bias b[2] = {{best, -INFINITY}, {7, 0.0f}};
    sampler_params p = sampler_default_params();
    p.logit_bias = b;
    p.n_logit_bias = 2;
    int32_t t = greedy_with(&p, l, NULL, 0);
    assert_true(t != best);
    assert_true(l[t] >= 4.97f);
    b[1].bias = 100.0f;
    assert_int_equal(greedy_with(&p, l, NULL, 0), 7);
    /* Every token banned: fall back to the raw argmax. */
    sampler_logit_bias all[V];
    for (int i = 0; i < V; i++) all[i] = (sampler_logit_bias){i, -INFINITY};
    p.logit_bias = all;
    p.n_logit_bias = V;
    p.temperature = 1.0f;
    assert_int_equal(greedy_with(&p, l, NULL, 0), best);
    b[0].token = V;
    p.logit_bias = b;
    p.n_logit_bias = 1;
    sampler *s;
    cellm_error err;
    assert_int_equal(sampler_create(&p, V, &s, &err), CELLM_ERR_INVALID_ARG);
}

static void test_penalties(void **st) {
    (void)st;
    float l[V];
    const int tok[2] = {10, 20};
    sampler_params p = sampler_default_params();
    const int32_t h1[] = {10};
    /* Repetition penalty divides a positive logit... */
    sparse(l, 2, tok, (float[]){1.0f, 0.9f});
    assert_int_equal(greedy_with(&p, l, h1, 1), 10);
    p.repeat_penalty = 1.5f;
    assert_int_equal(greedy_with(&p, l, h1, 1), 20);
    /* ...and multiplies a negative one. */
    sparse(l, 2, tok, (float[]){-1.0f, -1.2f});
    assert_int_equal(greedy_with(&p, l, h1, 1), 20);
    p.repeat_penalty = 1.1f;
    assert_int_equal(greedy_with(&p, l, h1, 1), 10);
    /* Frequency counts occurrences in the window, presence counts once. */
    p = sampler_default_params();
    sparse(l, 2, tok, (float[]){2.0f, 1.5f});
    const int32_t h2[] = {10, 3, 10};
    p.frequency_penalty = 0.3f;
    assert_int_equal(greedy_with(&p, l, h2, 3), 20);
    p.frequency_penalty = 0.2f;
    assert_int_equal(greedy_with(&p, l, h2, 3), 10);
    p.frequency_penalty = 0;
    p.presence_penalty = 0.6f;
    assert_int_equal(greedy_with(&p, l, h2, 3), 20);
    p.presence_penalty = 0.4f;
    assert_int_equal(greedy_with(&p, l, h2, 3), 10);
    /* Tokens that left the window are not penalised. */
    p.presence_penalty = 0.6f;
    p.penalty_last_n = 2;
    const int32_t h3[] = {10, 5, 6};
    assert_int_equal(greedy_with(&p, l, h3, 3), 10);
    const int32_t h4[] = {10, 5, 10, 6};
    assert_int_equal(greedy_with(&p, l, h4, 4), 20);
    /* reset_history forgets the window. */
    sampler *s;
    assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
    assert_int_equal(sampler_accept(s, 10, NULL), CELLM_OK);
    assert_int_equal(sampler_sample(s, l), 20);
    sampler_reset_history(s);
    assert_int_equal(sampler_sample(s, l), 10);
    cellm_error err;
    assert_int_equal(sampler_accept(s, V, &err), CELLM_ERR_INVALID_ARG);
    assert_int_equal(sampler_accept(s, -1, &err), CELLM_ERR_INVALID_ARG);
    sampler_free(s);
}

static void test_ngram_guard(void **st) {
    (void)st;
    float l[V];
    const int tok[3] = {1, 2, 3};
    sparse(l, 3, tok, (float[]){1.0f, 2.0f, 3.0f});
    sampler_params p = sampler_default_params();
    p.penalty_last_n = 16;
    const int32_t h[] = {1, 2, 3, 1, 2};
    assert_int_equal(greedy_with(&p, l, h, 5), 3);
    p.ngram_size = 3;
    p.ngram_max_repeats = 2; /* "1 2 3" seen once: still allowed */
    assert_int_equal(greedy_with(&p, l, h, 5), 3);
    p.ngram_max_repeats = 1;
    assert_int_equal(greedy_with(&p, l, h, 5), 2);
    /* Another context does not ban 3. */
    const int32_t h2[] = {1, 2, 3, 2, 2};
    assert_int_equal(greedy_with(&p, l, h2, 5), 3);
    /* The guard needs its n-gram to fit in the window. */
    p.penalty_last_n = 2;
    sampler *s;
    assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_ERR_INVALID_ARG);
}

/* Probabilities 0.6 / 0.3 / 0.1: the entropy is 0.898 nats, the
 * surprisals 0.51 / 1.20 / 2.30, so the most typical token is the 0.3 one,
 * then the 0.6 one. */
static void test_typical(void **st) {
    (void)st;
    float l[V];
    const int tok[3] = {10, 20, 30};
    sparse(l, 3, tok, (float[]){(float)log(0.6), (float)log(0.3), (float)log(0.1)});
    for (int k = 0; k < 2; k++) {
        sampler_params p = sampler_default_params();
        p.temperature = 1.0f;
        p.top_k = k ? 3 : 0;
        p.typical_p = 1e-6f;
        sampler *s;
        assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
        for (int i = 0; i < 200; i++) assert_int_equal(sampler_sample(s, l), 20);
        sampler_free(s);
        p.typical_p = 0.5f; /* keeps 20 then 10: 0.3 + 0.6 */
        assert_int_equal(sampler_create(&p, V, &s, NULL), CELLM_OK);
        int n10 = 0, n = 20000;
        for (int i = 0; i < n; i++) {
            int32_t t = sampler_sample(s, l);
            assert_true(t == 10 || t == 20);
            n10 += t == 10;
        }
        /* 2/3 +- 5 sigma (sigma = 0.0033) */
        assert_true(fabs((double)n10 / n - 2.0 / 3.0) < 0.017);
        sampler_free(s);
    }
}

/* Gemma's vocabulary size with everything on: works, and stays within the
 * candidates a bounded heap finds. */
static void test_large_vocab(void **st) {
    (void)st;
    const int32_t N = 262144;
    float *l = malloc(sizeof(float) * (size_t)N);
    assert_non_null(l);
    for (int32_t i = 0; i < N; i++) l[i] = (float)((i * 7919u) % 100003u) / 10000.0f;
    sampler_params p = sampler_default_params();
    p.temperature = 0.8f;
    p.typical_p = 0.9f;
    p.repeat_penalty = 1.2f;
    p.frequency_penalty = 0.1f;
    p.penalty_last_n = 256;
    p.ngram_size = 3;
    sampler *s;
    assert_int_equal(sampler_create(&p, N, &s, NULL), CELLM_OK);
    for (int i = 0; i < 20; i++) {
        int32_t t = sampler_sample(s, l);
        assert_true(t >= 0 && t < N);
        assert_int_equal(sampler_accept(s, t, NULL), CELLM_OK);
    }
    sampler_free(s);
    free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),      cmocka_unit_test(test_seed_repeats),
        cmocka_unit_test(test_truncation),  cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_logit_bias),  cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_ngram_guard), cmocka_unit_test(test_typical),
        cmocka_unit_test(test_large_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
