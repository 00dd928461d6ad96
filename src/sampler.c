/*
 * sampler.c — token selection (see sampler.h).
 *
 * A step first builds the adjusted logits (a copy, only when a bias,
 * penalty or guard is on), then picks candidates with a bounded heap and
 * draws among them. The penalty window is a ring of recent tokens with a
 * count per vocabulary entry kept up to date as tokens enter and leave it, so
 * a step touches only the window's tokens, never a table of the vocabulary.
 */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct sampler {
    sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    int32_t *idx; /* candidate heap: token ids */
    float *val;   /* their logits, then probabilities */
    float *work;  /* adjusted logits; NULL when nothing adjusts them */
    float *key;   /* typical-p scores; NULL when typical-p is off */
    sampler_logit_bias *bias;
    int32_t n_bias;
    int32_t *hist; /* ring of the last hist_cap accepted tokens */
    int32_t hist_cap, hist_len, hist_head;
    int32_t *count; /* occurrences of each token in the ring */
    uint32_t *mark; /* mark[t] == gen: token t already handled this step */
    int32_t *tally; /* n-gram guard: continuations seen, valid where marked */
    uint32_t gen;
};

sampler_params sampler_default_params(void) {
    return (sampler_params){.temperature = 0.0f,
                            .top_k = 0,
                            .top_p = 1.0f,
                            .min_p = 0.0f,
                            .typical_p = 1.0f,
                            .seed = 0x5eed,
                            .penalty_last_n = 64,
                            .repeat_penalty = 1.0f,
                            .presence_penalty = 0.0f,
                            .frequency_penalty = 0.0f,
                            .ngram_size = 0,
                            .ngram_max_repeats = 2,
                            .logit_bias = NULL,
                            .n_logit_bias = 0};
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

static bool finite(float x) {
    return x == x && x != INFINITY && x != -INFINITY;
}

cellm_status sampler_create(const sampler_params *p, int32_t n_vocab, sampler **out,
                            cellm_error *err) {
    *out = NULL;
    if (n_vocab < 1) return err_set(err, CELLM_ERR_INVALID_ARG, "empty vocabulary");
    if (!(p->temperature == p->temperature) || !(p->top_p == p->top_p) || !(p->min_p == p->min_p) ||
        p->min_p > 1 || !(p->typical_p == p->typical_p))
        return err_set(err, CELLM_ERR_INVALID_ARG, "sampling parameters must be numbers");
    if (!finite(p->repeat_penalty) || p->repeat_penalty <= 0 || !finite(p->presence_penalty) ||
        !finite(p->frequency_penalty))
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "penalties must be finite and the repetition penalty positive");
    if (p->penalty_last_n < 0 || p->ngram_size < 0 || p->n_logit_bias < 0 ||
        (p->n_logit_bias > 0 && !p->logit_bias))
        return err_set(err, CELLM_ERR_INVALID_ARG, "negative penalty window, n-gram or bias count");
    if (p->ngram_size > 0 && p->ngram_size > p->penalty_last_n)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "the n-gram guard of %d tokens needs a penalty window (repeat_last_n) of "
                       "at least %d tokens",
                       (int)p->ngram_size, (int)p->ngram_size);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const sampler_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return err_set(err, CELLM_ERR_INVALID_ARG, "logit bias for token %d outside 0..%d",
                           (int)b->token, (int)n_vocab - 1);
        if (b->bias != b->bias || b->bias == INFINITY)
            return err_set(err, CELLM_ERR_INVALID_ARG, "logit bias for token %d is not a number",
                           (int)b->token);
    }
    sampler *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    s->p = *p;
    s->p.logit_bias = NULL;
    s->n_vocab = n_vocab;
    const size_t V = (size_t)n_vocab;
    bool ok = (s->idx = malloc(sizeof(int32_t) * V)) && (s->val = malloc(sizeof(float) * V));
    bool pen = p->penalty_last_n > 0 && (p->repeat_penalty != 1 || p->presence_penalty != 0 ||
                                         p->frequency_penalty != 0 || p->ngram_size > 0);
    if (ok && (pen || p->n_logit_bias > 0)) ok = (s->work = malloc(sizeof(float) * V)) != NULL;
    if (ok && p->typical_p < 1) ok = (s->key = malloc(sizeof(float) * V)) != NULL;
    if (ok && p->n_logit_bias > 0) {
        ok = (s->bias = malloc(sizeof *s->bias * (size_t)p->n_logit_bias)) != NULL;
        if (ok) memcpy(s->bias, p->logit_bias, sizeof *s->bias * (size_t)p->n_logit_bias);
        s->n_bias = p->n_logit_bias;
    }
    if (ok && pen) {
        s->hist_cap = p->penalty_last_n;
        ok = (s->hist = malloc(sizeof(int32_t) * (size_t)s->hist_cap)) &&
             (s->count = calloc(V, sizeof(int32_t))) && (s->mark = calloc(V, sizeof(uint32_t))) &&
             (s->tally = calloc(V, sizeof(int32_t)));
    }
    if (!ok) {
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
    free(s->work);
    free(s->key);
    free(s->bias);
    free(s->hist);
    free(s->count);
    free(s->mark);
    free(s->tally);
    free(s);
}

cellm_status sampler_accept(sampler *s, int32_t token, cellm_error *err) {
    if (token < 0 || token >= s->n_vocab)
        return err_set(err, CELLM_ERR_INVALID_ARG, "token %d outside the vocabulary", (int)token);
    if (!s->hist) return CELLM_OK;
    if (s->hist_len == s->hist_cap) {
        s->count[s->hist[s->hist_head]]--;
        s->hist[s->hist_head] = token;
        s->hist_head = (s->hist_head + 1) % s->hist_cap;
    } else {
        s->hist[(s->hist_head + s->hist_len) % s->hist_cap] = token;
        s->hist_len++;
    }
    s->count[token]++;
    return CELLM_OK;
}

void sampler_reset_history(sampler *s) {
    for (int32_t i = 0; i < s->hist_len; i++) s->count[s->hist[(s->hist_head + i) % s->hist_cap]]--;
    s->hist_len = 0;
    s->hist_head = 0;
}

/* The i-th token of the window, oldest first. */
static int32_t hist_at(const sampler *s, int32_t i) {
    return s->hist[(s->hist_head + i) % s->hist_cap];
}

/* A fresh generation for mark[]: tokens marked before are unmarked. */
static uint32_t next_gen(sampler *s) {
    if (++s->gen == 0) {
        memset(s->mark, 0, sizeof(uint32_t) * (size_t)s->n_vocab);
        s->gen = 1;
    }
    return s->gen;
}

/* Bans every token that would complete an n-gram whose first n-1 tokens
 * are the window's last n-1 and that already occurs max_repeats times. */
static void ban_ngrams(sampler *s, float *l) {
    const int32_t n = s->p.ngram_size, L = s->hist_len;
    const int32_t max = s->p.ngram_max_repeats > 0 ? s->p.ngram_max_repeats : 1;
    if (L < n) return;
    uint32_t g = next_gen(s);
    for (int32_t i = 0; i + n - 1 < L; i++) {
        int32_t j = 0;
        while (j < n - 1 && hist_at(s, i + j) == hist_at(s, L - (n - 1) + j)) j++;
        if (j < n - 1) continue;
        int32_t c = hist_at(s, i + n - 1);
        s->tally[c] = s->mark[c] == g ? s->tally[c] + 1 : 1;
        s->mark[c] = g;
        if (s->tally[c] >= max) l[c] = -INFINITY;
    }
}

/* The logits after bias, penalties and the n-gram guard: `logits` itself
 * when none is on. */
static const float *adjust(sampler *s, const float *logits) {
    const sampler_params *p = &s->p;
    bool pen = s->hist_len > 0 &&
               (p->repeat_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0);
    bool ng = s->hist && p->ngram_size > 0;
    if (!s->n_bias && !pen && !ng) return logits;
    float *l = s->work;
    memcpy(l, logits, sizeof(float) * (size_t)s->n_vocab);
    for (int32_t i = 0; i < s->n_bias; i++) l[s->bias[i].token] += s->bias[i].bias;
    if (pen) {
        uint32_t g = next_gen(s);
        for (int32_t i = 0; i < s->hist_len; i++) {
            int32_t t = hist_at(s, i);
            if (s->mark[t] == g) continue;
            s->mark[t] = g;
            float x = l[t];
            if (p->repeat_penalty != 1) x = x > 0 ? x / p->repeat_penalty : x * p->repeat_penalty;
            x -= (float)s->count[t] * p->frequency_penalty + p->presence_penalty;
            l[t] = x;
        }
    }
    if (ng) ban_ngrams(s, l);
    return l;
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

/* Sorts idx/val[0..n) best first (highest val, then lowest id). */
static void sort_best_first(sampler *s, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(s, i, n);
    /* Heap sort: repeatedly move the worst to the end. */
    for (int m = n; m > 1; m--) {
        swap(s, 0, m - 1);
        sift_down(s, 0, m - 1);
    }
}

/* The k best of `logits` into idx/val[0..k), best first. */
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
    sort_best_first(s, k);
    return k;
}

static double uniform(sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 40) / (double)(1 << 24);
}

/* Locally typical sampling among the n candidates in idx[0..n): ranks them
 * by how far their surprisal is from the entropy of the candidates'
 * renormalised distribution and keeps the closest ones up to typical_p of
 * the mass. Leaves the kept ones in idx/val (val = logits) best first and
 * their total weight in *z; returns how many. */
static int typical_in_set(sampler *s, const float *logits, int n, double mx, double T, double *z) {
    double Z = 0, H = 0;
    for (int i = 0; i < n; i++) Z += exp((logits[s->idx[i]] - mx) / T);
    for (int i = 0; i < n; i++) {
        double q = exp((logits[s->idx[i]] - mx) / T) / Z;
        if (q > 0) H -= q * log(q);
    }
    for (int i = 0; i < n; i++) {
        double q = exp((logits[s->idx[i]] - mx) / T) / Z;
        s->val[i] = q > 0 ? (float)-fabs(-log(q) - H) : -INFINITY;
    }
    sort_best_first(s, n);
    double c = 0;
    int keep = n;
    for (int i = 0; i < n; i++) {
        c += exp((logits[s->idx[i]] - mx) / T) / Z;
        if (c >= s->p.typical_p) {
            keep = i + 1;
            break;
        }
    }
    *z = 0;
    for (int i = 0; i < keep; i++) {
        s->val[i] = logits[s->idx[i]];
        *z += exp((s->val[i] - mx) / T);
    }
    sort_best_first(s, keep);
    return keep;
}

/* Typical sampling over the whole vocabulary (total = sum of all weights):
 * the scores go to key[], and a top set by score grows until it holds
 * typical_p of the mass, as top-p does, so nothing sorts the vocabulary. */
static int typical_full(sampler *s, const float *logits, double mx, double T, double total,
                        double *z) {
    const int32_t V = s->n_vocab;
    /* With x = (logit - mx) / T and p = e^x / total: -log p = log(total) - x
     * and H = log(total) - sum(p x), so one pass of exp gives the entropy and
     * the scores need no transcendental function at all. */
    double px = 0;
    for (int32_t t = 0; t < V; t++) {
        double x = (logits[t] - mx) / T, w = exp(x);
        if (w > 0) px += w * x;
    }
    const double logz = log(total), H = logz - px / total;
    for (int32_t t = 0; t < V; t++) {
        /* a banned token (x = -inf) gets key -inf */
        s->key[t] = (float)-fabs(logz - (logits[t] - mx) / T - H);
    }
    int k = V < 256 ? V : 256, keep;
    for (;;) {
        int n = top_k(s, s->key, k);
        double c = 0;
        keep = 0;
        for (int i = 0; i < n && !keep; i++) {
            c += exp((logits[s->idx[i]] - mx) / T) / total;
            if (c >= s->p.typical_p) keep = i + 1;
        }
        if (keep || k == V) {
            if (!keep) keep = n;
            break;
        }
        k = k > V / 8 ? V : k * 8;
    }
    *z = 0;
    for (int i = 0; i < keep; i++) {
        s->val[i] = logits[s->idx[i]];
        *z += exp((s->val[i] - mx) / T);
    }
    sort_best_first(s, keep);
    return keep;
}

int32_t sampler_sample(sampler *s, const float *raw) {
    const sampler_params *p = &s->p;
    const int32_t V = s->n_vocab;
    const double T = p->temperature;
    const float *logits = adjust(s, raw);
    const int32_t best = sampler_argmax(logits, V);
    /* Everything banned: the raw choice is the least surprising answer. */
    if (logits[best] == -INFINITY) return sampler_argmax(raw, V);
    if (T <= 0 || p->top_k == 1) return best;
    double mx = logits[best];
    const bool typical = p->typical_p < 1;
    if (p->top_k <= 0 && p->top_p >= 1 && !typical) {
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
            if (w < p->min_p || w == 0) continue; /* never a banned token */
            acc += w;
            last = t;
            if (u < acc) return t;
        }
        return last;
    }
    /* Rank candidates: the top k, the typical set, or, for top-p alone, a
     * top set grown until it holds top_p of the probability. */
    double total = 0;
    for (int32_t t = 0; t < V; t++) total += exp((logits[t] - mx) / T);
    int n;
    if (p->top_k > 0) {
        n = top_k(s, logits, p->top_k < V ? p->top_k : V);
        if (typical) n = typical_in_set(s, logits, n, mx, T, &total);
    } else if (typical) {
        n = typical_full(s, logits, mx, T, total, &total);
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
