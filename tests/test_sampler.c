/* test_sampler.c — token selection: greedy, seeds, truncation, and that
 * draws follow the distribution; logit bias, repetition, presence and
 * frequency penalties over a window, the n-gram guard and typical-p.
 *
 * The statistical tests (test_stat_*) draw 10,000 tokens with a fixed seed
 * from 1,000 Gaussian logits and check two things against a reference
 * computed here in double precision from the definitions in
 * docs/sampling.md: no draw ever falls outside the set the sampler must
 * keep (top-k, top-p, min-p, typical-p and their chain), and the counts
 * match the renormalised softmax(logits / T) over that set by Pearson's
 * chi-square test at significance 0.001 (cells expecting fewer than 5
 * draws pooled; the critical value from the Wilson-Hilferty
 * approximation). With the seed fixed the outcome is fixed; the
 * significance says how unlikely a failure would be for a correct sampler
 * over random seeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sampler.h"
#include "top_ref.h"

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

/* A small deterministic generator for the tests below. */
static uint32_t lcg(uint32_t *x) {
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

/* Greedy with bans only takes the raw row's best without adjusting a
 * copy (sampler.c, greedy_unbanned) where that best is not banned: the
 * pick must still be the first best of the adjusted row, else the raw
 * argmax when every adjusted logit is -inf or NaN. Ties, an infinite or
 * NaN logit, the best banned, and random rows with few best values
 * against that rule computed here on a copy. */
static int32_t banned_pick(const float *l, const sampler_logit_bias *b, int nb) {
    float a[V];
    memcpy(a, l, sizeof a);
    for (int i = 0; i < nb; i++) a[b[i].token] += b[i].bias;
    int32_t best = -1;
    for (int32_t i = 0; i < V; i++)
        if (a[i] > -INFINITY && (best < 0 || a[i] > a[best])) best = i;
    return best >= 0 ? best : sampler_argmax(l, V);
}

static void test_greedy_bans(void **st) {
    (void)st;
    float l[V];
    sampler_params p = sampler_default_params();
    p.temperature = 0;
    sampler_logit_bias b[3] = {{3, -INFINITY}, {20, -INFINITY}, {500, -INFINITY}};
    p.logit_bias = b;
    const int tok[3] = {3, 9, 20};
    sparse(l, 3, tok, (const float[]){2.0f, 2.0f, 1.0f});
    p.n_logit_bias = 1; /* ties: the first best banned, the second wins */
    assert_int_equal(greedy_with(&p, l, NULL, 0), 9);
    b[0].token = 9;
    assert_int_equal(greedy_with(&p, l, NULL, 0), 3);
    b[0].token = 500;
    assert_int_equal(greedy_with(&p, l, NULL, 0), 3);
    b[0].token = 3;
    l[3] = INFINITY; /* banned +inf is NaN in the adjusted row: loses */
    assert_int_equal(greedy_with(&p, l, NULL, 0), 9);
    l[3] = NAN;
    assert_int_equal(greedy_with(&p, l, NULL, 0), 9);
    for (int i = 0; i < V; i++) l[i] = -INFINITY; /* only banned tokens finite */
    l[3] = 1.0f;
    l[20] = 2.0f;
    p.n_logit_bias = 2;
    assert_int_equal(greedy_with(&p, l, NULL, 0), 20);
    uint32_t x = 12345;
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < V; i++) l[i] = (float)(lcg(&x) % 8); /* many ties */
        if (round % 4 == 0) l[lcg(&x) % V] = INFINITY;
        if (round % 5 == 0) l[lcg(&x) % V] = NAN;
        int nb = 1 + (int)(lcg(&x) % 3);
        for (int i = 0; i < nb; i++)
            b[i].token = i == 0 ? sampler_argmax(l, V) : (int32_t)(lcg(&x) % V);
        if (round % 2) b[0].token = (int32_t)(lcg(&x) % V); /* the best not always banned */
        p.n_logit_bias = nb;
        assert_int_equal(greedy_with(&p, l, NULL, 0), banned_pick(l, b, nb));
    }
}

/* Penalties over a long window of many distinct tokens (the window's
 * table with collisions and long probes): the greedy token is the argmax
 * of the logits adjusted as docs/sampling.md says, computed here from the
 * window directly. */
static void test_penalties_long(void **st) {
    (void)st;
    uint32_t x = 7;
    float l[V], adj[V];
    int32_t hist[600];
    for (int trial = 0; trial < 200; trial++) {
        sampler_params p = sampler_default_params();
        p.penalty_last_n = 1 + (int32_t)(lcg(&x) % 400);
        p.repeat_penalty = 1.0f + (float)(lcg(&x) % 100) / 100.0f;
        p.frequency_penalty = (float)(lcg(&x) % 50) / 100.0f;
        p.presence_penalty = (float)(lcg(&x) % 50) / 100.0f;
        for (int i = 0; i < V; i++) l[i] = (float)(lcg(&x) % 2000) / 500.0f - 2.0f;
        /* Few distinct tokens or many, so counts run from 1 to hundreds. */
        const int32_t spread = trial % 2 ? V : 8;
        const int32_t n = (int32_t)(lcg(&x) % 600);
        for (int32_t i = 0; i < n; i++)
            hist[i] = (int32_t)(lcg(&x) % (uint32_t)spread) * (V / spread);
        const int32_t from = n > p.penalty_last_n ? n - p.penalty_last_n : 0;
        memcpy(adj, l, sizeof l);
        for (int32_t t = 0; t < V; t++) {
            int32_t c = 0;
            for (int32_t i = from; i < n; i++) c += hist[i] == t;
            if (!c) continue;
            float y = adj[t];
            y = y > 0 ? y / p.repeat_penalty : y * p.repeat_penalty;
            adj[t] = y - ((float)c * p.frequency_penalty + p.presence_penalty);
        }
        int32_t best = 0;
        for (int32_t t = 1; t < V; t++)
            if (adj[t] > adj[best]) best = t;
        /* (Up to rounding: the test may contract the multiply-add.) */
        const int32_t got = greedy_with(&p, l, hist, n);
        assert_true(got == best || fabsf(adj[got] - adj[best]) < 1e-5f);
    }
}

/* Samplers made with sampler_create_shared and bound to one scratch draw,
 * interleaved, exactly what samplers with their own draw: every
 * truncation, the penalties, the n-gram guard and a bias on. */
static void test_shared_scratch(void **st) {
    (void)st;
    enum { N = 3, STEPS = 300 };
    sampler_scratch *x;
    assert_int_equal(sampler_scratch_create(V, 256, &x, NULL), CELLM_OK);
    sampler *own[N], *shared[N];
    const sampler_logit_bias bias[] = {{5, 2.0f}, {6, -INFINITY}};
    for (int i = 0; i < N; i++) {
        sampler_params p = sampler_default_params();
        p.seed = 100 + (uint64_t)i;
        p.temperature = 0.7f + 0.2f * (float)i;
        p.top_k = i == 0 ? 0 : 50 * i;
        p.top_p = 0.9f;
        p.min_p = i == 2 ? 0.05f : 0;
        p.typical_p = i == 1 ? 0.8f : 1.0f;
        p.penalty_last_n = 64 * (i + 1);
        p.repeat_penalty = 1.3f;
        p.frequency_penalty = 0.1f;
        p.presence_penalty = 0.2f;
        p.ngram_size = 3;
        p.ngram_max_repeats = 1;
        p.logit_bias = bias;
        p.n_logit_bias = 2;
        assert_int_equal(sampler_create(&p, V, &own[i], NULL), CELLM_OK);
        assert_int_equal(sampler_create_shared(&p, V, &shared[i], NULL), CELLM_OK);
        sampler_bind(shared[i], x);
    }
    float l[V];
    uint32_t g = 1;
    for (int step = 0; step < STEPS; step++)
        for (int i = 0; i < N; i++) {
            for (int t = 0; t < V; t++) l[t] = (float)(lcg(&g) % 1000) / 200.0f;
            int32_t a = sampler_sample(own[i], l), b = sampler_sample(shared[i], l);
            assert_int_equal(a, b);
            if (step % 7 == 3) {
                /* The speculative rule as well. */
                const int32_t ids[2] = {a, (a + 1) % V};
                const float q[2] = {0.5f, 0.5f};
                a = sampler_sample_spec(own[i], l, ids[1], ids, q, 2, 0.3, 0.6);
                b = sampler_sample_spec(shared[i], l, ids[1], ids, q, 2, 0.3, 0.6);
                assert_int_equal(a, b);
            }
            assert_int_equal(sampler_accept(own[i], a, NULL), CELLM_OK);
            assert_int_equal(sampler_accept(shared[i], a, NULL), CELLM_OK);
        }
    for (int i = 0; i < N; i++) {
        sampler_free(own[i]);
        sampler_free(shared[i]);
    }
    sampler_scratch_free(x);
    /* What it allocates, at least the arrays. */
    assert_true(sampler_scratch_bytes(V, 256) >= (size_t)V * 20);
    assert_int_equal(sampler_scratch_create(0, 16, &x, NULL), CELLM_ERR_INVALID_ARG);
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

/* ---- statistical tests ---- */

#define SV 1000
#define DRAWS 10000

/* 1,000 logits ~ N(0, 2^2) from a fixed generator. */
static void gauss_logits(float *l, uint64_t seed) {
    for (int i = 0; i < SV; i++) {
        double u = 0;
        for (int k = 0; k < 12; k++) { /* Irwin-Hall: sum of 12 uniforms - 6 ~ N(0, 1) */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            u += (double)(seed >> 11) / 9007199254740992.0;
        }
        l[i] = (float)(2.0 * (u - 6.0));
    }
}

static const float *g_rank_logits;
static int by_logit(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_rank_logits[i], y = g_rank_logits[j];
    return x > y ? -1 : x < y ? 1 : i - j;
}

/* A candidate set: ids (best first) and their probabilities, renormalised. */
typedef struct cset {
    int id[SV];
    double p[SV];
    int n;
} cset;

/* Every token, best first, with softmax(l / T). */
static void cs_all(cset *c, const float *l, double T) {
    for (int i = 0; i < SV; i++) c->id[i] = i;
    g_rank_logits = l;
    qsort(c->id, SV, sizeof(int), by_logit);
    c->n = SV;
    double mx = l[c->id[0]], z = 0;
    for (int i = 0; i < SV; i++) z += c->p[i] = exp((l[c->id[i]] - mx) / T);
    for (int i = 0; i < SV; i++) c->p[i] /= z;
}

static void cs_renorm(cset *c) {
    double z = 0;
    for (int i = 0; i < c->n; i++) z += c->p[i];
    for (int i = 0; i < c->n; i++) c->p[i] /= z;
}

static void cs_top_k(cset *c, int k) {
    if (k < c->n) c->n = k;
    cs_renorm(c);
}

static void cs_top_p(cset *c, double p) {
    double cum = 0;
    for (int i = 0; i < c->n; i++)
        if ((cum += c->p[i]) >= p) {
            c->n = i + 1;
            break;
        }
    cs_renorm(c);
}

static void cs_min_p(cset *c, double p) {
    int n = 1;
    while (n < c->n && c->p[n] >= p * c->p[0]) n++;
    c->n = n;
    cs_renorm(c);
}

/* Keeps the tokens whose surprisal is closest to the entropy until they
 * hold p; the kept ones stay in order of probability. */
static void cs_typical(cset *c, double p) {
    double H = 0;
    for (int i = 0; i < c->n; i++) H -= c->p[i] * log(c->p[i]);
    static int ord[SV];
    static double score[SV];
    for (int i = 0; i < c->n; i++) {
        ord[i] = i;
        score[i] = fabs(-log(c->p[i]) - H);
    }
    for (int i = 1; i < c->n; i++) /* insertion sort by score */
        for (int j = i; j > 0 && score[ord[j]] < score[ord[j - 1]]; j--) {
            int t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
    double cum = 0;
    int keep = c->n;
    for (int i = 0; i < c->n; i++)
        if ((cum += c->p[ord[i]]) >= p) {
            keep = i + 1;
            break;
        }
    static bool in[SV];
    memset(in, 0, sizeof in);
    for (int i = 0; i < keep; i++) in[ord[i]] = true;
    int n = 0;
    for (int i = 0; i < c->n; i++)
        if (in[i]) {
            c->id[n] = c->id[i];
            c->p[n++] = c->p[i];
        }
    c->n = n;
    cs_renorm(c);
}

/* The chi-square critical value for df degrees of freedom at
 * significance 0.001 (z = 3.0902), Wilson-Hilferty. */
static double chi2_crit(int df) {
    double a = 2.0 / (9.0 * df), t = 1 - a + 3.0902 * sqrt(a);
    return df * t * t * t;
}

/* Pearson's chi-square of DRAWS draws counted in count[] (by token)
 * against c's probabilities: whether it stays under the critical value
 * (any draw outside c fails). */
static bool counts_fit(const int *count, const cset *c, const char *what) {
    static bool in[SV];
    memset(in, 0, sizeof in);
    int n_in = 0;
    for (int i = 0; i < c->n; i++) in[c->id[i]] = true;
    for (int t = 0; t < SV; t++) n_in += in[t] ? count[t] : 0;
    if (n_in != DRAWS) {
        print_message("%s: %d draws outside the %d kept\n", what, DRAWS - n_in, c->n);
        return false;
    }
    /* Cells: each token expecting >= 5 draws, the rest pooled. */
    double stat = 0, pool_e = 0;
    int pool_o = 0, cells = 0;
    for (int i = 0; i < c->n; i++) {
        double e = c->p[i] * DRAWS;
        int o = count[c->id[i]];
        if (e >= 5) {
            stat += (o - e) * (o - e) / e;
            cells++;
        } else {
            pool_e += e;
            pool_o += o;
        }
    }
    if (pool_e > 0) {
        if (pool_e >= 5 || cells == 0) {
            stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
            cells++;
        } else if (pool_o > 5 + 5 * pool_e) { /* a handful at most */
            print_message("%s: %d draws in cells expecting %.1f\n", what, pool_o, pool_e);
            return false;
        }
    }
    int df = cells - 1;
    if (df < 1) { /* one cell: every draw is in it */
        print_message("%s: 1 token kept\n", what);
        return true;
    }
    double crit = chi2_crit(df);
    print_message("%s: %d kept, chi2 = %.1f, df = %d, critical %.1f\n", what, c->n, stat, df, crit);
    return stat < crit;
}

/* Draws DRAWS tokens; fails on any outside `c`; chi-square against c's
 * probabilities. */
static void check_draws(sampler *s, const float *l, const cset *c, const char *what) {
    static int count[SV];
    memset(count, 0, sizeof count);
    for (int d = 0; d < DRAWS; d++) {
        int32_t t = sampler_sample(s, l);
        assert_true(t >= 0 && t < SV);
        count[t]++;
    }
    assert_true(counts_fit(count, c, what));
}

static sampler *mk(const sampler_params *p) {
    sampler *s = NULL;
    cellm_error err;
    if (sampler_create(p, SV, &s, &err) != CELLM_OK) {
        print_error("sampler_create: %s\n", err.msg);
        fail();
    }
    return s;
}

static void test_stat_temperature(void **st) {
    (void)st;
    static float l[SV];
    static cset c;
    gauss_logits(l, 1);
    const double temps[] = {0.5, 1.0, 2.0};
    for (int i = 0; i < 3; i++) {
        sampler_params p = sampler_default_params();
        p.temperature = (float)temps[i];
        p.seed = 100 + (uint64_t)i;
        sampler *s = mk(&p);
        cs_all(&c, l, temps[i]);
        char what[64];
        snprintf(what, sizeof what, "temperature %.1f", temps[i]);
        check_draws(s, l, &c, what);
        sampler_free(s);
    }
}

static void test_stat_top_k(void **st) {
    (void)st;
    static float l[SV];
    static cset c;
    gauss_logits(l, 2);
    const int ks[] = {1, 5, 40};
    for (int i = 0; i < 3; i++) {
        sampler_params p = sampler_default_params();
        p.temperature = 1.5f;
        p.top_k = ks[i];
        p.seed = 7;
        sampler *s = mk(&p);
        cs_all(&c, l, 1.5);
        cs_top_k(&c, ks[i]);
        char what[64];
        snprintf(what, sizeof what, "top-k %d", ks[i]);
        check_draws(s, l, &c, what);
        sampler_free(s);
    }
}

static void test_stat_top_p(void **st) {
    (void)st;
    static float l[SV];
    static cset c;
    gauss_logits(l, 3);
    const double ps[] = {0.1, 0.5, 0.9};
    for (int i = 0; i < 3; i++) {
        sampler_params p = sampler_default_params();
        p.temperature = 0.8f;
        p.top_p = (float)ps[i];
        p.seed = 8;
        sampler *s = mk(&p);
        cs_all(&c, l, 0.8);
        cs_top_p(&c, p.top_p);
        char what[64];
        snprintf(what, sizeof what, "top-p %.1f", ps[i]);
        check_draws(s, l, &c, what);
        sampler_free(s);
    }
}

static void test_stat_min_p(void **st) {
    (void)st;
    static float l[SV];
    static cset c;
    gauss_logits(l, 4);
    const double ps[] = {0.02, 0.1, 0.5};
    for (int i = 0; i < 3; i++) {
        sampler_params p = sampler_default_params();
        p.temperature = 1.0f;
        p.min_p = (float)ps[i];
        p.seed = 1;
        sampler *s = mk(&p);
        cs_all(&c, l, 1.0);
        cs_min_p(&c, p.min_p);
        char what[64];
        snprintf(what, sizeof what, "min-p %.2f", ps[i]);
        check_draws(s, l, &c, what);
        sampler_free(s);
    }
}

static void test_stat_typical(void **st) {
    (void)st;
    static float l[SV];
    static cset c;
    gauss_logits(l, 5);
    const double ps[] = {0.2, 0.5, 0.9};
    for (int i = 0; i < 3; i++) {
        sampler_params p = sampler_default_params();
        p.temperature = 1.0f;
        p.typical_p = (float)ps[i];
        p.seed = 10;
        sampler *s = mk(&p);
        cs_all(&c, l, 1.0);
        cs_typical(&c, p.typical_p);
        char what[64];
        snprintf(what, sizeof what, "typical %.1f", ps[i]);
        check_draws(s, l, &c, what);
        sampler_free(s);
    }
}

/* The chain in its order: top-k, typical-p, top-p, min-p, each on what the
 * one before kept, renormalised. */
static void test_stat_chain(void **st) {
    (void)st;
    static float l[SV];
    static cset c;
    gauss_logits(l, 6);
    sampler_params p = sampler_default_params();
    p.temperature = 1.2f;
    p.top_k = 100;
    p.typical_p = 0.95f;
    p.top_p = 0.8f;
    p.min_p = 0.05f;
    p.seed = 11;
    sampler *s = mk(&p);
    cs_all(&c, l, 1.2);
    cs_top_k(&c, 100);
    cs_typical(&c, 0.95);
    cs_top_p(&c, 0.8);
    cs_min_p(&c, 0.05);
    check_draws(s, l, &c, "top-k 100, typical 0.95, top-p 0.8, min-p 0.05");
    sampler_free(s);
    /* top-p and min-p without top-k */
    p.top_k = 0;
    p.typical_p = 1;
    p.top_p = 0.9f;
    p.min_p = 0.1f;
    s = mk(&p);
    cs_all(&c, l, 1.2);
    cs_top_p(&c, 0.9);
    cs_min_p(&c, 0.1);
    check_draws(s, l, &c, "top-p 0.9, min-p 0.1");
    sampler_free(s);
}

/* A uniform number in [0, 1) from a test generator. */
static double test_u(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*x >> 11) / 9007199254740992.0;
}

/* A draft's distribution for speculative sampling: softmax(d / T) over
 * its best SAMPLER_DIST_MAX tokens (some outside what the target keeps). */
static void draft_dist(const float *d, double T, sampler_dist *q) {
    static cset c;
    cs_all(&c, d, T);
    cs_top_k(&c, SAMPLER_DIST_MAX);
    q->n = c.n;
    for (int i = 0; i < c.n; i++) {
        q->ids[i] = c.id[i];
        q->p[i] = (float)c.p[i];
    }
}

static int32_t draw_dist(const sampler_dist *q, double u) {
    double acc = 0;
    for (int i = 0; i < q->n; i++)
        if (u < (acc += q->p[i])) return q->ids[i];
    return q->ids[q->n - 1];
}

/* The standard speculative-sampling rule (sampler_sample_spec): a guess
 * drawn from a draft's q, kept with min(1, p / q), else a draw from
 * max(0, p - q), must follow p, the target's kept distribution, whatever
 * q is: DRAWS positions each with its own guess pass the chi-square test
 * against p. Two wrong rules must fail the same test (its power): the
 * guess always kept (q's distribution), and a rejected guess redrawn from
 * p instead of the residual. A guess that is certain (q all on one token,
 * as prompt lookup's) follows p too. */
static void spec_case(const sampler_params *p, const cset *c, const float *l, const sampler_dist *q,
                      const char *what) {
    static int right[SV], keep_all[SV], from_p[SV];
    memset(right, 0, sizeof right);
    memset(keep_all, 0, sizeof keep_all);
    memset(from_p, 0, sizeof from_p);
    sampler *s = mk(p);
    uint64_t x = 12345;
    int kept = 0;
    for (int d = 0; d < DRAWS; d++) {
        int32_t g = draw_dist(q, test_u(&x));
        double ua = test_u(&x), ud = test_u(&x);
        int32_t t = sampler_sample_spec(s, l, g, q->ids, q->p, q->n, ua, ud);
        assert_true(t >= 0 && t < SV);
        /* The same numbers give the same token. */
        assert_int_equal(sampler_sample_spec(s, l, g, q->ids, q->p, q->n, ua, ud), t);
        right[t]++;
        kept += t == g;
        keep_all[g]++;
        /* Wrong: a rejected guess redrawn from p itself. */
        int32_t w = t == g ? g : sampler_sample_spec(s, l, -1, NULL, NULL, 0, 0, ud);
        from_p[w]++;
    }
    sampler_free(s);
    char buf[160];
    snprintf(buf, sizeof buf, "%s: the standard rule (%.0f%% of guesses kept)", what,
             100.0 * kept / DRAWS);
    assert_true(counts_fit(right, c, buf));
    if (q->n > 1) {
        snprintf(buf, sizeof buf, "%s: every guess kept (wrong)", what);
        assert_false(counts_fit(keep_all, c, buf));
        snprintf(buf, sizeof buf, "%s: rejected guesses redrawn from p (wrong)", what);
        assert_false(counts_fit(from_p, c, buf));
    }
}

static void test_stat_spec(void **st) {
    (void)st;
    static float l[SV], d[SV], noise[SV];
    static cset c;
    sampler_dist q;
    gauss_logits(l, 21);
    gauss_logits(noise, 22);
    /* The draft: the target's logits plus noise, a little sharper. */
    for (int i = 0; i < SV; i++) d[i] = 1.2f * l[i] + 0.6f * noise[i];
    sampler_params p = sampler_default_params();
    p.temperature = 0.9f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    cs_all(&c, l, 0.9);
    cs_top_k(&c, 40);
    cs_top_p(&c, 0.95);
    cs_min_p(&c, 0.05);
    draft_dist(d, 0.9, &q);
    spec_case(&p, &c, l, &q, "top-k 40, top-p 0.95, min-p 0.05");
    /* Temperature and min-p alone: the kept set is not ranked. */
    p = sampler_default_params();
    p.temperature = 1.5f;
    p.min_p = 0.02f;
    cs_all(&c, l, 1.5);
    cs_min_p(&c, 0.02);
    draft_dist(d, 1.5, &q);
    spec_case(&p, &c, l, &q, "T 1.5, min-p 0.02");
    /* A certain guess (prompt lookup's), the target's third choice. */
    q = (sampler_dist){1, {c.id[2]}, {1.0f}};
    spec_case(&p, &c, l, &q, "T 1.5, min-p 0.02, a certain guess");
}

/* Penalties and bias shift the logits as docs/sampling.md says; the draws
 * follow softmax of the shifted logits. */
static void test_stat_penalties(void **st) {
    (void)st;
    static float l[SV], adj[SV];
    static cset c;
    gauss_logits(l, 7);
    /* The window: the 6 best tokens, some of them repeated. */
    g_rank_logits = l;
    int order[SV];
    for (int i = 0; i < SV; i++) order[i] = i;
    qsort(order, SV, sizeof(int), by_logit);
    const int32_t hist[] = {order[0], order[1], order[0], order[2],
                            order[3], order[0], order[4], order[5]};
    const int n_hist = 8;
    sampler_logit_bias bias[] = {{order[6], 1.5f}, {order[7], -2.0f}, {order[8], -INFINITY}};
    sampler_params p = sampler_default_params();
    p.temperature = 1.0f;
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.3f;
    p.penalty_last_n = 6; /* the first two of hist have left the window */
    p.logit_bias = bias;
    p.n_logit_bias = 3;
    p.seed = 12;
    sampler *s = mk(&p);
    for (int i = 0; i < n_hist; i++) assert_int_equal(sampler_accept(s, hist[i], NULL), CELLM_OK);
    memcpy(adj, l, sizeof adj);
    for (int i = 0; i < 3; i++) adj[bias[i].token] += bias[i].bias;
    int cnt[SV] = {0};
    for (int i = n_hist - 6; i < n_hist; i++) cnt[hist[i]]++;
    for (int t = 0; t < SV; t++) {
        if (!cnt[t]) continue;
        float x = adj[t];
        x = x > 0 ? x / 1.3f : x * 1.3f;
        adj[t] = x - (float)cnt[t] * 0.3f - 0.5f;
    }
    cs_all(&c, adj, 1.0);
    while (c.n > 0 && c.p[c.n - 1] == 0) c.n--; /* the banned token */
    check_draws(s, l, &c, "penalties and bias");
    sampler_free(s);
}

/* Limits of each parameter: top_p or typical_p 0 keep one token, top_k at
 * or past the vocabulary is off, and a flat distribution over Gemma's
 * vocabulary (top-p's worst case: half of it kept, ties to the lowest
 * ids) works. */
static void test_edges(void **st) {
    (void)st;
    static float l[SV];
    gauss_logits(l, 8);
    int32_t best = sampler_argmax(l, SV);
    sampler_params p = sampler_default_params();
    p.temperature = 1.0f;
    p.top_p = 0.0f;
    sampler *s = mk(&p);
    for (int i = 0; i < 100; i++) assert_int_equal(sampler_sample(s, l), best);
    sampler_free(s);
    p.top_p = 1.0f;
    p.typical_p = 0.0f;
    s = mk(&p);
    int32_t first = sampler_sample(s, l);
    for (int i = 0; i < 100; i++) assert_int_equal(sampler_sample(s, l), first);
    sampler_free(s);
    p.typical_p = 1.0f;
    p.top_k = SV + 5;
    s = mk(&p);
    static cset c;
    cs_all(&c, l, 1.0);
    check_draws(s, l, &c, "top-k past the vocabulary");
    sampler_free(s);

    const int32_t N = 262144;
    float *flat = calloc((size_t)N, sizeof(float));
    assert_non_null(flat);
    p = sampler_default_params();
    p.temperature = 1.0f;
    p.top_p = 0.5f;
    sampler *big = NULL;
    assert_int_equal(sampler_create(&p, N, &big, NULL), CELLM_OK);
    for (int i = 0; i < 200; i++) assert_true(sampler_sample(big, flat) < N / 2);
    sampler_free(big);
    free(flat);
}

/* The same seed gives the same tokens on every platform: the PRNG and the
 * exponential are exact operations, so these draws are fixed. (Recorded on
 * x86-64; a change here changes every seeded text.) */
static void test_golden_draws(void **st) {
    (void)st;
    static float l[SV];
    gauss_logits(l, 9);
    static const struct {
        float t, top_p, min_p;
        int32_t top_k;
    } modes[] = {{0.7f, 0.9f, 0, 0}, {1.0f, 1, 0.05f, 0}, {1.3f, 0.95f, 0, 50}};
    static const int32_t want[3][12] = {
        {156, 77, 177, 268, 410, 733, 622, 224, 481, 802, 177, 156},
        {77, 156, 570, 802, 907, 622, 615, 733, 622, 385, 570, 156},
        {156, 570, 752, 344, 807, 226, 627, 465, 226, 733, 752, 802}};
    for (int m = 0; m < 3; m++) {
        sampler_params p = sampler_default_params();
        p.temperature = modes[m].t;
        p.top_p = modes[m].top_p;
        p.min_p = modes[m].min_p;
        p.top_k = modes[m].top_k;
        p.seed = 42;
        sampler *s = mk(&p);
        char got[256];
        size_t o = 0;
        for (int i = 0; i < 12; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%d, ", (int)sampler_sample(s, l));
        sampler_free(s);
        sampler *r = mk(&p);
        for (int i = 0; i < 12; i++) {
            if (sampler_sample(r, l) != want[m][i]) {
                print_error("mode %d: got {%s}\n", m, got);
                fail();
            }
        }
        sampler_free(r);
    }
}

/* Log-probabilities (sampler_log_norm, sampler_top_logprobs) are the same
 * bits on every platform and in the plain build: fixed values for fixed
 * logits, over a length that leaves a tail past the vector lanes. (Recorded
 * on x86-64.) */
static void test_golden_logprobs(void **st) {
    (void)st;
    static float l[SV];
    gauss_logits(l, 11);
    const int32_t n = SV - 3;
    double norm = sampler_log_norm(l, n);
    sampler_logprob top[5];
    assert_int_equal(sampler_top_logprobs(l, n, norm, 5, top), 5);
    uint64_t nb;
    memcpy(&nb, &norm, sizeof nb);
    char got[512];
    int o = snprintf(got, sizeof got, "0x%016llx", (unsigned long long)nb);
    for (int k = 0; k < 5; k++) {
        uint32_t b;
        memcpy(&b, &top[k].logprob, sizeof b);
        o +=
            snprintf(got + o, sizeof got - (size_t)o, " %d:0x%08x", (int)top[k].token, (unsigned)b);
    }
    const char *want = "0x4021cfb1ed24be82 394:0xc0059a5c 759:0xc018d394 553:0xc02a5cea "
                       "156:0xc0720858 952:0xc07ce562";
    if (strcmp(got, want)) fail_msg("log-probabilities: got \"%s\"", got);
}

/* Fills the heap with freed blocks of `x`, which glibc then hands to the
 * next allocations of that size (a sampler's arrays). */
static void dirty_heap(float x) {
    enum { N_JUNK = 32 };
    void *junk[N_JUNK];
    for (int i = 0; i < N_JUNK; i++) {
        float *b = malloc(sizeof(float) * V);
        assert_non_null(b);
        for (int j = 0; j < V; j++) b[j] = x;
        junk[i] = b;
    }
    for (int i = 0; i < N_JUNK; i++) free(junk[i]);
}

/* A step's draws depend on its logits and the PRNG only, never on what
 * the sampler's buffers held before: a sampler made in memory full of NaN
 * draws what one made in zeroed memory does. (One that read weights it
 * had not written yet ordered its top-k candidates wrongly there, and
 * drew other tokens for the same seed.) */
static void test_stale_memory(void **st) {
    (void)st;
    float l[V];
    fill(l);
    sampler_params p = sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.seed = 7;
    sampler *a, *b;
    dirty_heap(0.0f);
    assert_int_equal(sampler_create(&p, V, &a, NULL), CELLM_OK);
    dirty_heap(NAN);
    assert_int_equal(sampler_create(&p, V, &b, NULL), CELLM_OK);
    int distinct = 0;
    bool seen[V] = {false};
    for (int i = 0; i < 200; i++) {
        int32_t t = sampler_sample(a, l);
        assert_int_equal(sampler_sample(b, l), t);
        distinct += !seen[t];
        seen[t] = true;
    }
    assert_true(distinct > 5); /* it really sampled */
    sampler_free(a);
    sampler_free(b);
}

/* A greedy request's token from a row's 8 best logits (what a GPU hands
 * back: sampler_pick_top) is the one sampler_sample picks from the whole
 * row, with up to 7 tokens banned, over rows of ties, signed zeros,
 * infinities and NaN (the all-banned fallback to the raw argmax
 * included); and sampler_top_ok says which samplers that holds for. */
static void test_pick_top(void **st) {
    (void)st;
    enum { N = 48, K = 8 };
    const float pool[] = {0.5f, 1.0f, -0.0f, 0.0f, -INFINITY, NAN, INFINITY, -2.0f, 3.0f};
    uint64_t x = 99;
    int fallbacks = 0;
    for (int trial = 0; trial < 3000; trial++) {
        float l[N];
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int kinds = 1 + (int)((x >> 40) % 9); /* values drawn from the pool's first `kinds` */
        for (int i = 0; i < N; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = trial % 5 == 0 ? pool[4 + (x >> 33) % 2] : pool[(x >> 33) % (uint64_t)kinds];
        }
        sampler_logit_bias ban[K - 1];
        int n_ban = (int)((x >> 20) % K);
        int top[K];
        top_select(l, N, K, top);
        for (int i = 0; i < n_ban; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* mostly the best tokens, so that the pick moves down the list */
            ban[i] = (sampler_logit_bias){(x >> 33) % 3 ? top[(x >> 40) % K] : (int)((x >> 40) % N),
                                          -INFINITY};
        }
        sampler_params p = sampler_default_params();
        p.logit_bias = ban;
        p.n_logit_bias = n_ban;
        sampler *s;
        assert_int_equal(sampler_create(&p, N, &s, NULL), CELLM_OK);
        assert_true(sampler_top_ok(s, K));
        float tl[K];
        int32_t tt[K];
        for (int k = 0; k < K; k++) {
            tl[k] = l[top[k]];
            tt[k] = top[k];
        }
        int32_t want = sampler_sample(s, l), got = sampler_pick_top(s, tl, tt, K);
        if (got != want)
            fail_msg("trial %d: picked %d from the top, %d from the row", trial, got, want);
        fallbacks += want == top[0] && n_ban > 0 && !(l[top[0]] > -INFINITY);
        sampler_free(s);
    }
    assert_true(fallbacks > 10); /* the all-banned and all-NaN rows were met */

    /* Which samplers the top decides. */
    sampler_params p = sampler_default_params();
    sampler_logit_bias ban8[K], half = {3, -0.5f};
    for (int i = 0; i < K; i++) ban8[i] = (sampler_logit_bias){i, -INFINITY};
    struct {
        float temp;
        int top_k;
        float rep;
        const sampler_logit_bias *bias;
        int n_bias;
        bool ok;
    } cases[] = {
        {0, 0, 1, NULL, 0, true},     {0.8f, 1, 1, NULL, 0, true}, {0.8f, 0, 1, NULL, 0, false},
        {0, 0, 1.1f, NULL, 0, false}, {0, 0, 1, &half, 1, false},  {0, 0, 1, ban8, K - 1, true},
        {0, 0, 1, ban8, K, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p.temperature = cases[i].temp;
        p.top_k = cases[i].top_k;
        p.repeat_penalty = cases[i].rep;
        p.logit_bias = cases[i].bias;
        p.n_logit_bias = cases[i].n_bias;
        sampler *s;
        assert_int_equal(sampler_create(&p, N, &s, NULL), CELLM_OK);
        if (sampler_top_ok(s, K) != cases[i].ok) fail_msg("case %zu", i);
        sampler_free(s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),           cmocka_unit_test(test_seed_repeats),
        cmocka_unit_test(test_truncation),       cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_logit_bias),       cmocka_unit_test(test_greedy_bans),
        cmocka_unit_test(test_penalties),        cmocka_unit_test(test_ngram_guard),
        cmocka_unit_test(test_typical),          cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_stat_temperature), cmocka_unit_test(test_stat_top_k),
        cmocka_unit_test(test_stat_top_p),       cmocka_unit_test(test_stat_min_p),
        cmocka_unit_test(test_stat_typical),     cmocka_unit_test(test_stat_chain),
        cmocka_unit_test(test_stat_penalties),   cmocka_unit_test(test_edges),
        cmocka_unit_test(test_golden_draws),     cmocka_unit_test(test_stale_memory),
        cmocka_unit_test(test_golden_logprobs),  cmocka_unit_test(test_stat_spec),
        cmocka_unit_test(test_pick_top),         cmocka_unit_test(test_penalties_long),
        cmocka_unit_test(test_shared_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
