/*
 * sampler.c — token selection (see sampler.h).
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

struct sampler {
    sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    int32_t *idx; /* candidate heap: token ids */
    float *val;   /* their logits, then probabilities */
};

sampler_params sampler_default_params(void) {
    return (sampler_params){
        .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0x5eed};
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

void sampler_reseed(sampler *s, uint64_t seed) {
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
}

cellm_status sampler_create(const sampler_params *p, int32_t n_vocab, sampler **out,
                            cellm_error *err) {
    *out = NULL;
    if (n_vocab < 1) return err_set(err, CELLM_ERR_INVALID_ARG, "empty vocabulary");
    if (!(p->temperature == p->temperature) || !(p->top_p == p->top_p) || !(p->min_p == p->min_p) ||
        p->min_p > 1)
        return err_set(err, CELLM_ERR_INVALID_ARG, "sampling parameters must be numbers");
    sampler *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->idx = malloc(sizeof(int32_t) * (size_t)n_vocab);
    s->val = malloc(sizeof(float) * (size_t)n_vocab);
    if (!s->idx || !s->val) {
        sampler_free(s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    sampler_reseed(s, p->seed);
    *out = s;
    return CELLM_OK;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->val);
    free(s);
}

int32_t sampler_argmax(const float *logits, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[b]) b = i;
    return b;
}

/* Heap order: a is "smaller" (closer to the root of the min-heap) than b
 * when its logit is lower, or equal with a higher id — so the heap keeps the
 * best logits and, among ties, the lowest ids. */
static int worse(const sampler *s, int a, int b) {
    return s->val[a] < s->val[b] || (s->val[a] == s->val[b] && s->idx[a] > s->idx[b]);
}

static void swap(sampler *s, int a, int b) {
    int32_t ti = s->idx[a];
    float tv = s->val[a];
    s->idx[a] = s->idx[b];
    s->val[a] = s->val[b];
    s->idx[b] = ti;
    s->val[b] = tv;
}

static void sift_down(sampler *s, int i, int n) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(s, l, m)) m = l;
        if (r < n && worse(s, r, m)) m = r;
        if (m == i) return;
        swap(s, i, m);
        i = m;
    }
}

/* The k best logits into idx/val[0..k), best first. */
static int top_k(sampler *s, const float *logits, int k) {
    for (int i = 0; i < k; i++) {
        s->idx[i] = i;
        s->val[i] = logits[i];
    }
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(s, i, k);
    for (int32_t t = k; t < s->n_vocab; t++) {
        if (logits[t] > s->val[0]) {
            s->idx[0] = t;
            s->val[0] = logits[t];
            sift_down(s, 0, k);
        }
    }
    /* Heap sort: repeatedly move the worst to the end. */
    for (int n = k; n > 1; n--) {
        swap(s, 0, n - 1);
        sift_down(s, 0, n - 1);
    }
    return k;
}

static double uniform(sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 40) / (double)(1 << 24);
}

int32_t sampler_sample(sampler *s, const float *logits) {
    const sampler_params *p = &s->p;
    const int32_t V = s->n_vocab;
    const double T = p->temperature;
    if (T <= 0 || p->top_k == 1) return sampler_argmax(logits, V);
    double mx = logits[sampler_argmax(logits, V)];
    if (p->top_k <= 0 && p->top_p >= 1) {
        /* No ranking needed: draw from the whole vocabulary in one pass
         * (min-p compares with the best token, whose weight is 1). */
        double z = 0;
        for (int32_t t = 0; t < V; t++) {
            double w = exp((logits[t] - mx) / T);
            z += w >= p->min_p ? w : 0;
        }
        double u = uniform(s) * z, acc = 0;
        int32_t last = 0;
        for (int32_t t = 0; t < V; t++) {
            double w = exp((logits[t] - mx) / T);
            if (w < p->min_p) continue;
            acc += w;
            last = t;
            if (u < acc) return t;
        }
        return last;
    }
    /* Rank candidates: the top k, or, for top-p alone, a top set grown until
     * it holds top_p of the probability. */
    double total = 0;
    for (int32_t t = 0; t < V; t++) total += exp((logits[t] - mx) / T);
    int n;
    if (p->top_k > 0) {
        n = top_k(s, logits, p->top_k < V ? p->top_k : V);
    } else {
        int k = V < 256 ? V : 256;
        for (;;) {
            n = top_k(s, logits, k);
            double mass = 0;
            for (int i = 0; i < n; i++) mass += exp((s->val[i] - mx) / T);
            if (mass / total >= p->top_p || k == V) break;
            k = k > V / 8 ? V : k * 8;
        }
    }
    for (int i = 0; i < n; i++) s->val[i] = (float)exp((s->val[i] - mx) / T);
    int keep = n;
    if (p->min_p > 0)
        for (int i = 1; i < keep; i++)
            if (s->val[i] < p->min_p * s->val[0]) keep = i;
    if (p->top_p < 1) {
        double c = 0;
        for (int i = 0; i < keep; i++) {
            c += s->val[i] / total;
            if (c >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    double z = 0;
    for (int i = 0; i < keep; i++) z += s->val[i];
    double u = uniform(s) * z, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += s->val[i];
        if (u < acc) return s->idx[i];
    }
    return s->idx[keep - 1];
}
