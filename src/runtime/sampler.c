/*
 * sampler.c — token selection (see sampler.h).
 *
 * A step first builds the adjusted logits (a copy, only when a bias,
 * penalty or guard is on) and finds the best. Sampling then weighs every
 * token, 2^((logit - max) log2(e) / T), in one vectorised pass with an
 * exponential of our own (the same bits on every platform, about 1 ns a
 * token where libm's exp takes 3), which also collects top-p's first
 * candidates;
 * each truncation keeps a best-first prefix, found by heap selection over
 * a few hundred candidates, never a sort of the vocabulary; the draw walks
 * the kept prefix. The penalty window is a ring of recent tokens with a
 * count per vocabulary entry kept up to date as tokens enter and leave it, so
 * a step touches only the window's tokens, never a table of the vocabulary.
 */
#include "runtime/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/xmath.h"

/* GCC and Clang vector types, unless CELLM_NO_VECTOR_EXT asks for the
 * plain C path (which gives the same bits; the tests build both). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(CELLM_NO_VECTOR_EXT)
#define SAMPLER_VEC 1
#else
#define SAMPLER_VEC 0
#endif

/* On x86-64 the weights also have an AVX2 path, chosen at run time. */
#if SAMPLER_VEC && defined(__x86_64__)
#define SAMPLER_AVX2 1
#include "format/kernels/kernels.h" /* avx2_cpu_supported */
#else
#define SAMPLER_AVX2 0
#endif

/* The weights must round the same everywhere: no FMA contraction. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* What one draw works in: vocabulary-sized arrays, and a table of the
 * penalty window's tokens. Nothing in it outlives a call. */
struct sampler_scratch {
    int32_t *idx;    /* candidate heap: token ids */
    float *val;      /* their heap keys (logits, or typical-p scores) */
    float *w;        /* every token's weight e^((logit - max) / T) */
    float *work;     /* adjusted logits */
    float *key;      /* typical-p scores by token */
    int32_t *tab;    /* [2 * tab_cap]: a window's token (-1: an empty slot), then a count */
    int32_t tab_cap; /* a power of two, at least twice the longest window */
};

struct sampler {
    sampler_params p;
    int32_t n_vocab;
    bool avx2; /* weigh with AVX2 */
    uint64_t rng[4];
    sampler_scratch *scr; /* what sampler_bind bound, else own */
    sampler_scratch *own; /* made by sampler_create; NULL from sampler_create_shared */
    sampler_logit_bias *bias;
    int32_t n_bias;
    int32_t *hist; /* ring of the last hist_cap accepted tokens */
    int32_t hist_cap, hist_len, hist_head;
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

static bool finite_f(float x) {
    return x == x && x != INFINITY && x != -INFINITY;
}

/* Whether a sampler with params p draws (rather than takes the best
 * token), and whether it keeps a penalty window. */
static bool p_sampled(const sampler_params *p) {
    return p->temperature > 0 && p->top_k != 1;
}

static bool p_window(const sampler_params *p) {
    return p->penalty_last_n > 0 && (p->repeat_penalty != 1 || p->presence_penalty != 0 ||
                                     p->frequency_penalty != 0 || p->ngram_size > 0);
}

/* The window table's slots for windows of up to n tokens. */
static int32_t tab_slots(int64_t n) {
    int32_t c = 16;
    while (c < 2 * n && c < (1 << 28)) c *= 2;
    return c;
}

/* A scratch for n_vocab tokens and windows of up to max_window tokens;
 * p NULL: every array, else only what a sampler with params p uses. */
static sampler_scratch *scratch_new(int32_t n_vocab, int32_t max_window, const sampler_params *p) {
    sampler_scratch *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    const size_t V = (size_t)n_vocab;
    const bool sampled = !p || p_sampled(p), win = !p || p_window(p);
    bool ok =
        !sampled || ((x->idx = malloc(sizeof(int32_t) * V)) &&
                     (x->val = malloc(sizeof(float) * V)) && (x->w = calloc(V, sizeof(float))));
    if (ok && (win || p->n_logit_bias > 0)) ok = (x->work = malloc(sizeof(float) * V)) != NULL;
    if (ok && sampled && (!p || p->typical_p < 1))
        ok = (x->key = malloc(sizeof(float) * V)) != NULL;
    if (ok && win && max_window > 0) {
        x->tab_cap = tab_slots(max_window);
        ok = (x->tab = malloc(sizeof(int32_t) * 2 * (size_t)x->tab_cap)) != NULL;
    }
    if (!ok) {
        sampler_scratch_free(x);
        return NULL;
    }
    return x;
}

cellm_status sampler_scratch_create(int32_t n_vocab, int32_t max_window, sampler_scratch **out,
                                    cellm_error *err) {
    *out = NULL;
    if (n_vocab < 1 || max_window < 0)
        return err_set(err, CELLM_ERR_INVALID_ARG, "a sampler scratch of %d tokens, windows of %d",
                       (int)n_vocab, (int)max_window);
    if (!(*out = scratch_new(n_vocab, max_window, NULL)))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    return CELLM_OK;
}

void sampler_scratch_free(sampler_scratch *x) {
    if (!x) return;
    free(x->idx);
    free(x->val);
    free(x->w);
    free(x->work);
    free(x->key);
    free(x->tab);
    free(x);
}

size_t sampler_scratch_bytes(int32_t n_vocab, int32_t max_window) {
    return sizeof(sampler_scratch) + (size_t)n_vocab * (sizeof(int32_t) + 4 * sizeof(float)) +
           (max_window > 0 ? sizeof(int32_t) * 2 * (size_t)tab_slots(max_window) : 0);
}

void sampler_bind(sampler *s, sampler_scratch *x) {
    s->scr = x ? x : s->own;
}

static cellm_status create(const sampler_params *p, int32_t n_vocab, bool own, sampler **out,
                           cellm_error *err) {

    *out = NULL;
    if (n_vocab < 1) return err_set(err, CELLM_ERR_INVALID_ARG, "empty vocabulary");
    if (!(p->temperature == p->temperature) || !(p->top_p == p->top_p) || !(p->min_p == p->min_p) ||
        p->min_p > 1 || !(p->typical_p == p->typical_p))
        return err_set(err, CELLM_ERR_INVALID_ARG, "sampling parameters must be numbers");
    if (!finite_f(p->repeat_penalty) || p->repeat_penalty <= 0 || !finite_f(p->presence_penalty) ||
        !finite_f(p->frequency_penalty))
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
    bool ok = !own || (s->own = s->scr = scratch_new(n_vocab, p->penalty_last_n, p)) != NULL;
    if (ok && p->n_logit_bias > 0) {
        ok = (s->bias = malloc(sizeof *s->bias * (size_t)p->n_logit_bias)) != NULL;
        if (ok) memcpy(s->bias, p->logit_bias, sizeof *s->bias * (size_t)p->n_logit_bias);
        s->n_bias = p->n_logit_bias;
    }
    if (ok && p_window(p)) {
        s->hist_cap = p->penalty_last_n;
        ok = (s->hist = malloc(sizeof(int32_t) * (size_t)s->hist_cap)) != NULL;
    }
    if (!ok) {
        sampler_free(s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
#if SAMPLER_AVX2
    s->avx2 = avx2_cpu_supported();
#endif
    sampler_reseed(s, p->seed);
    *out = s;
    return CELLM_OK;
}

cellm_status sampler_create(const sampler_params *p, int32_t n_vocab, sampler **out,
                            cellm_error *err) {
    return create(p, n_vocab, true, out, err);
}

cellm_status sampler_create_shared(const sampler_params *p, int32_t n_vocab, sampler **out,
                                   cellm_error *err) {
    return create(p, n_vocab, false, out, err);
}

void sampler_free(sampler *s) {
    if (!s) return;
    sampler_scratch_free(s->own);
    free(s->bias);
    free(s->hist);
    free(s);
}

cellm_status sampler_accept(sampler *s, int32_t token, cellm_error *err) {
    if (token < 0 || token >= s->n_vocab)
        return err_set(err, CELLM_ERR_INVALID_ARG, "token %d outside the vocabulary", (int)token);
    if (!s->hist) return CELLM_OK;
    if (s->hist_len == s->hist_cap) {
        s->hist[s->hist_head] = token;
        s->hist_head = (s->hist_head + 1) % s->hist_cap;
    } else {
        s->hist[(s->hist_head + s->hist_len) % s->hist_cap] = token;
        s->hist_len++;
    }
    return CELLM_OK;
}

void sampler_reset_history(sampler *s) {
    s->hist_len = 0;
    s->hist_head = 0;
}

/* The i-th token of the window, oldest first. */
static int32_t hist_at(const sampler *s, int32_t i) {
    return s->hist[(s->hist_head + i) % s->hist_cap];
}

/* The window's table (sampler_scratch.tab): open addressing with linear
 * probing over at least twice as many slots as the window has tokens, so
 * it never fills; emptied for each use, and only as large as the window
 * needs. What comes out (a count per token) does not depend on where the
 * tokens landed. Returns the slots' mask. */
static uint32_t tab_empty(sampler *s) {
    const int32_t n = tab_slots(s->hist_len); /* <= tab_cap: hist_len <= the window */
    for (int32_t i = 0; i < n; i++) s->scr->tab[2 * i] = -1;
    return (uint32_t)n - 1;
}

/* Token t's count, entered at 0 when t is new. */
static int32_t *tab_count(sampler *s, uint32_t mask, int32_t t) {
    int32_t *tab = s->scr->tab;
    uint32_t i = ((uint32_t)t * 2654435761u) & mask;
    while (tab[2 * i] != t && tab[2 * i] >= 0) i = (i + 1) & mask;
    if (tab[2 * i] < 0) {
        tab[2 * i] = t;
        tab[2 * i + 1] = 0;
    }
    return &tab[2 * i + 1];
}

/* Bans every token that would complete an n-gram whose first n-1 tokens
 * are the window's last n-1 and that already occurs max_repeats times. */
static void ban_ngrams(sampler *s, float *l) {
    const int32_t n = s->p.ngram_size, L = s->hist_len;
    const int32_t max = s->p.ngram_max_repeats > 0 ? s->p.ngram_max_repeats : 1;
    if (L < n) return;
    const uint32_t mask = tab_empty(s);
    for (int32_t i = 0; i + n - 1 < L; i++) {
        int32_t j = 0;
        while (j < n - 1 && hist_at(s, i + j) == hist_at(s, L - (n - 1) + j)) j++;
        if (j < n - 1) continue;
        int32_t c = hist_at(s, i + n - 1);
        if (++*tab_count(s, mask, c) >= max) l[c] = -INFINITY;
    }
}

/* Whether any repetition penalty is set. */
static bool penalties_set(const sampler_params *p) {
    return p->repeat_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

/* Whether the penalties change this step's logits (one is set, and there
 * are tokens to penalise). */
static bool pen_on(const sampler *s) {
    return s->hist_len > 0 && penalties_set(&s->p);
}

static bool ngram_on(const sampler *s) {
    return s->hist && s->p.ngram_size > 0;
}

/* Whether the step is greedy: the best adjusted logit, no draw. */
static bool greedy(const sampler_params *p) {
    return p->temperature <= 0 || p->top_k == 1;
}

/* Whether every logit bias is a ban (-inf). */
static bool bias_bans_only(const sampler *s) {
    for (int32_t i = 0; i < s->n_bias; i++)
        if (s->bias[i].bias != -INFINITY) return false;
    return true;
}

/* Whether token t has a bias (a ban where bias_bans_only holds). */
static bool banned(const sampler *s, int32_t t) {
    for (int32_t i = 0; i < s->n_bias; i++)
        if (s->bias[i].token == t) return true;
    return false;
}

/* The logits after bias, penalties and the n-gram guard: `logits` itself
 * when none is on. */
static const float *adjust(sampler *s, const float *logits) {
    const sampler_params *p = &s->p;
    bool pen = pen_on(s), ng = ngram_on(s);
    if (!s->n_bias && !pen && !ng) return logits;
    float *l = s->scr->work;
    memcpy(l, logits, sizeof(float) * (size_t)s->n_vocab);
    for (int32_t i = 0; i < s->n_bias; i++) l[s->bias[i].token] += s->bias[i].bias;
    if (pen) {
        /* Each token of the window once, with its count: the counts, then
         * the window again, a token adjusted where it is first met (its
         * count then set to -1). */
        const uint32_t mask = tab_empty(s);
        for (int32_t i = 0; i < s->hist_len; i++) ++*tab_count(s, mask, hist_at(s, i));
        for (int32_t i = 0; i < s->hist_len; i++) {
            int32_t t = hist_at(s, i), *count = tab_count(s, mask, t);
            if (*count < 0) continue;
            float x = l[t];
            if (p->repeat_penalty != 1) x = x > 0 ? x / p->repeat_penalty : x * p->repeat_penalty;
            x -= (float)*count * p->frequency_penalty + p->presence_penalty;
            l[t] = x;
            *count = -1;
        }
    }
    if (ng) ban_ngrams(s, l);
    return l;
}

/* The largest of l[0..n) (NaN never wins; -INFINITY when there is none).
 * Eight independent maxima, so the compiler can keep them in one vector
 * register: the whole vocabulary in one streaming pass. */
static float max_of(const float *l, int32_t n) {
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = l[i + j] > m[j] ? l[i + j] : m[j];
    for (; i < n; i++) m[0] = l[i] > m[0] ? l[i] : m[0];
    float r = m[0];
    for (int j = 1; j < 8; j++) r = m[j] > r ? m[j] : r;
    return r;
}

/* The first token whose logit is mx; 0 when none is (all NaN). */
static int32_t first_of(const float *l, int32_t n, float mx) {
    for (int32_t i = 0; i < n; i++)
        if (l[i] == mx) return i;
    return 0;
}

int32_t sampler_argmax(const float *logits, int32_t n) {
    return first_of(logits, n, max_of(logits, n));
}

bool sampler_top_ok(const sampler *s, int32_t k) {
    const sampler_params *p = &s->p;
    if (!greedy(p) || s->n_vocab < k || s->n_bias >= k) return false;
    return !penalties_set(p) && !ngram_on(s) && bias_bans_only(s);
}

/* Among a row's k best, the first not banned is the best of the adjusted
 * row (a banned token's logit is -inf, or NaN from +inf, and loses): the
 * greedy pick (kept's first_of) when it is above -inf. Otherwise every
 * adjusted logit is -inf or NaN, and the pick is the raw argmax, the
 * first of the k. With fewer bans than k, one of the k is not banned. */
int32_t sampler_pick_top(const sampler *s, const float *logit, const int32_t *token, int32_t k) {
    for (int32_t i = 0; i < k; i++)
        if (!banned(s, token[i])) return logit[i] > -INFINITY ? token[i] : token[0];
    return token[0];
}

/* Weights 2^y for y = (logit - max) x log2(e) / T <= 0, in float, the
 * same bits on every platform: y = k + f with k an integer and |f| <= 1/2,
 * 2^f = e^(f ln 2) by its Taylor polynomial to degree 6 (relative error
 * below 2e-7), times 2^k put into the exponent. Below 2^-125 (and for NaN)
 * the weight is 0, so a banned token (-inf) weighs nothing. Each operation
 * is its own statement: no compiler may fuse two into an FMA, which would
 * round differently on ARM and x86. */
#define EXP2_MIN (-125.0f)
#define EXP2_STEPS(y, k, f, q)                                                                     \
    do {                                                                                           \
        k = y + 12582912.0f; /* 1.5 * 2^23: rounds to an integer */                                \
        k = k - 12582912.0f;                                                                       \
        f = y - k;                                                                                 \
        q = f * 1.5403530e-4f; /* ln2^6 / 6! */                                                    \
        q = q + 1.3333558e-3f; /* ln2^5 / 5! */                                                    \
        q = q * f;                                                                                 \
        q = q + 9.6181291e-3f; /* ln2^4 / 4! */                                                    \
        q = q * f;                                                                                 \
        q = q + 5.5504109e-2f; /* ln2^3 / 3! */                                                    \
        q = q * f;                                                                                 \
        q = q + 2.4022651e-1f; /* ln2^2 / 2 */                                                     \
        q = q * f;                                                                                 \
        q = q + 6.9314718e-1f; /* ln2 */                                                           \
        q = q * f;                                                                                 \
        q = q + 1.0f;                                                                              \
    } while (0)

static float exp2_neg(float y) {
    if (!(y >= EXP2_MIN)) return 0.0f;
    float k, f, q;
    EXP2_STEPS(y, k, f, q);
    uint32_t b;
    memcpy(&b, &q, sizeof b);
    b += (uint32_t)(int32_t)k << 23;
    memcpy(&q, &b, sizeof q);
    return q;
}

#if SAMPLER_VEC
/* Four lanes of exp2_neg with GCC/Clang vector types (SSE2, NEON), lane
 * for lane the same operations, so the same bits. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) v4f exp2_neg4(v4f y) {
    const v4f lo = {EXP2_MIN, EXP2_MIN, EXP2_MIN, EXP2_MIN};
    const v4i ok = y >= lo;
    y = (v4f)(((v4i)y & ok) | ((v4i)lo & ~ok));
    v4f k, f, q;
    EXP2_STEPS(y, k, f, q);
    v4u b = (v4u)q + ((v4u) __builtin_convertvector(k, v4i) << 23);
    return (v4f)(b & (v4u)ok);
}
#endif

#if SAMPLER_AVX2
/* The same eight lanes in one AVX2 register, on CPUs that have it (twice
 * the speed; the same operations, so the same bits). */
#define AVX2 __attribute__((target("avx2")))
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

AVX2 static inline __attribute__((always_inline)) v8f exp2_neg8(v8f y) {
    const v8f lo = {EXP2_MIN, EXP2_MIN, EXP2_MIN, EXP2_MIN, EXP2_MIN, EXP2_MIN, EXP2_MIN, EXP2_MIN};
    const v8i ok = y >= lo;
    y = (v8f)(((v8i)y & ok) | ((v8i)lo & ~ok));
    v8f k, f, q;
    EXP2_STEPS(y, k, f, q);
    v8u b = (v8u)q + ((v8u) __builtin_convertvector(k, v8i) << 23);
    return (v8f)(b & (v8u)ok);
}

/* weigh's loop over whole blocks of 8 (see there); returns where it
 * stopped, with the lane sums in a[] and the gathered count in *g. */
AVX2 static int32_t weigh_avx2(sampler *s, const float *l, float mx, float c, float gather,
                               double *z, int *g, float a[8]) {
    const int32_t n = s->n_vocab;
    float *w = s->scr->w;
    v8f acc = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f y;
        memcpy(&y, l + i, sizeof y);
        y = y - mx;
        y = y * c;
        const v8f e = exp2_neg8(y);
        memcpy(w + i, &e, sizeof e);
        acc += e;
        if ((i & 1023) == 1016) {
            for (int j = 0; j < 4; j++) *z += (double)acc[j] + (double)acc[4 + j];
            acc = (v8f){0};
        }
        if (gather > 0) {
            const v8i hit = e >= gather;
            if (hit[0] | hit[1] | hit[2] | hit[3] | hit[4] | hit[5] | hit[6] | hit[7])
                for (int j = 0; j < 8; j++)
                    if (w[i + j] >= gather) {
                        s->scr->idx[*g] = i + j;
                        s->scr->val[(*g)++] = l[i + j];
                    }
        }
    }
    for (int j = 0; j < 8; j++) a[j] = acc[j];
    return i;
}
#endif

/* w[t] = 2^((l[t] - mx) * c) for every token; returns their sum. The sum
 * runs in 8 float lanes folded into a double every 1,024 tokens, in a
 * fixed order, so it too is the same everywhere. With gather > 0 it also
 * collects the tokens of weight >= gather into idx/val (val = logit) and
 * sets *n_gathered: top-p's first candidates come free with this pass. */
static double weigh(sampler *s, const float *l, float mx, float c, float gather, int *n_gathered) {
    const int32_t n = s->n_vocab;
    float *w = s->scr->w;
    double z = 0;
    int32_t i = 0;
    int g = 0;
    float a[8] = {0};
#if SAMPLER_AVX2
    if (s->avx2) i = weigh_avx2(s, l, mx, c, gather, &z, &g, a);
#endif
#if SAMPLER_VEC
    v4f a0 = {a[0], a[1], a[2], a[3]}, a1 = {a[4], a[5], a[6], a[7]};
    const v4f gv = {gather, gather, gather, gather};
    for (; i + 8 <= n; i += 8) {
        v4f y0, y1;
        memcpy(&y0, l + i, sizeof y0);
        memcpy(&y1, l + i + 4, sizeof y1);
        y0 = y0 - mx;
        y1 = y1 - mx;
        y0 = y0 * c;
        y1 = y1 * c;
        const v4f e0 = exp2_neg4(y0), e1 = exp2_neg4(y1);
        memcpy(w + i, &e0, sizeof e0);
        memcpy(w + i + 4, &e1, sizeof e1);
        a0 += e0;
        a1 += e1;
        if ((i & 1023) == 1016) {
            for (int j = 0; j < 4; j++) z += (double)a0[j] + (double)a1[j];
            a0 = a1 = (v4f){0};
        }
        if (gather > 0) {
            const v4i hit = (e0 >= gv) | (e1 >= gv);
            if (hit[0] | hit[1] | hit[2] | hit[3])
                for (int j = 0; j < 8; j++)
                    if (w[i + j] >= gather) {
                        s->scr->idx[g] = i + j;
                        s->scr->val[g++] = l[i + j];
                    }
        }
    }
    for (int j = 0; j < 4; j++) {
        a[j] = a0[j];
        a[4 + j] = a1[j];
    }
#else
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) {
            float y = l[i + j] - mx;
            y = y * c;
            w[i + j] = exp2_neg(y);
            a[j] += w[i + j];
            if (gather > 0 && w[i + j] >= gather) {
                s->scr->idx[g] = i + j;
                s->scr->val[g++] = l[i + j];
            }
        }
        if ((i & 1023) == 1016) {
            for (int j = 0; j < 4; j++) z += (double)a[j] + (double)a[4 + j];
            for (int j = 0; j < 8; j++) a[j] = 0;
        }
    }
#endif
    for (; i < n; i++) {
        float y = l[i] - mx;
        y = y * c;
        w[i] = exp2_neg(y);
        a[i & 7] += w[i];
        if (gather > 0 && w[i] >= gather) {
            s->scr->idx[g] = i;
            s->scr->val[g++] = l[i];
        }
    }
    for (int j = 0; j < 4; j++) z += (double)a[j] + (double)a[4 + j];
    if (n_gathered) *n_gathered = g;
    return z;
}

/* Heap order: a is "worse" than b when its logit is lower, or equal with a
 * higher id; the best token is the highest logit, then the lowest id. */
static bool worse(const sampler *s, int a, int b) {
    return s->scr->val[a] < s->scr->val[b] ||
           (s->scr->val[a] == s->scr->val[b] && s->scr->idx[a] > s->scr->idx[b]);
}

static void swap(sampler *s, int a, int b) {
    int32_t ti = s->scr->idx[a];
    float tv = s->scr->val[a];
    s->scr->idx[a] = s->scr->idx[b];
    s->scr->val[a] = s->scr->val[b];
    s->scr->idx[b] = ti;
    s->scr->val[b] = tv;
}

/* Whether a belongs above b: in a heap with the worst at the root
 * (min_heap) or the best. */
static bool above(const sampler *s, int a, int b, bool min_heap) {
    return min_heap ? worse(s, a, b) : worse(s, b, a);
}

static void sift_down(sampler *s, int i, int n, bool min_heap) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && above(s, l, m, min_heap)) m = l;
        if (r < n && above(s, r, m, min_heap)) m = r;
        if (m == i) return;
        swap(s, i, m);
        i = m;
    }
}

/* Puts the best of idx/val[0..n) first, in order, stopping once the first
 * m >= 1 of them weigh at least `target` (by w[]); returns m. A target of
 * INFINITY orders all n and never reads w[], which the caller may not
 * have set for these candidates yet (order_by_logit): weights left from
 * an earlier step, or never written, must not decide how many come out.
 * Heap selection: O(n + m log n), never a sort of the candidates it does
 * not need. */
static int best_first(sampler *s, int n, double target) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(s, i, n, false);
    const bool all = target == INFINITY;
    double acc = 0;
    int m = 0;
    while (m < n && (all || m == 0 || acc < target)) {
        /* The heap is [0, n - m); the popped best go to the end. */
        if (!all) acc += s->scr->w[s->scr->idx[0]];
        swap(s, 0, n - m - 1);
        m++;
        sift_down(s, 0, n - m, false);
    }
    /* [n - m, n) holds the m best, best last: reverse them to the front. */
    for (int i = 0; i < m / 2; i++) swap(s, n - m + i, n - 1 - i);
    if (n - m > 0) {
        memmove(s->scr->idx, s->scr->idx + (n - m), sizeof(int32_t) * (size_t)m);
        memmove(s->scr->val, s->scr->val + (n - m), sizeof(float) * (size_t)m);
    }
    return m;
}

/* The k best of `key` (by value, then lowest id) into idx/val[0..k), in
 * heap order (worst first): a bounded heap, one pass over the vocabulary. */
static int top_k(sampler *s, const float *key, int k) {
    for (int i = 0; i < k; i++) {
        s->scr->idx[i] = i;
        s->scr->val[i] = key[i];
    }
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(s, i, k, true);
    for (int32_t t = k; t < s->n_vocab; t++) {
        if (key[t] > s->scr->val[0]) {
            s->scr->idx[0] = t;
            s->scr->val[0] = key[t];
            sift_down(s, 0, k, true);
        }
    }
    return k;
}

const sampler_params *sampler_get_params(const sampler *s) {
    return &s->p;
}

static double uniform(sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 40) / (double)(1 << 24);
}

/* The candidates in idx[0..n) with logits in val, re-keyed by logit and
 * ordered best first. */
static void order_by_logit(sampler *s, const float *l, int n) {
    for (int i = 0; i < n; i++) s->scr->val[i] = l[s->scr->idx[i]];
    best_first(s, n, INFINITY);
}

/* Locally typical sampling over the candidates idx[0..n) (all tokens when
 * n < 0) of weight zc: the most typical are those whose surprisal is
 * closest to the entropy. With p = w / zc and x = log w: -log p = log zc - x
 * and H = log zc - E[x], so the distance is |x - E[x]|: one pass for E[x],
 * no transcendental function per token. Keeps the closest until they hold
 * typical_p of the weight (growing a heap-selected set, 256 then x8),
 * leaves them in idx best first by logit and returns how many; *zc becomes
 * their weight. */
static int typical(sampler *s, const float *l, int n, double mx, double inv, double *zc) {
    const int32_t V = s->n_vocab;
    const bool all = n < 0;
    const int N = all ? V : n;
    double ex = 0;
    for (int i = 0; i < N; i++) {
        int32_t t = all ? i : s->scr->idx[i];
        if (s->scr->w[t] > 0) ex += s->scr->w[t] * ((l[t] - mx) * inv);
    }
    ex /= *zc;
    /* Scores go to key[] (indexed by token); banned tokens score -inf. */
    for (int i = 0; i < N; i++) {
        int32_t t = all ? i : s->scr->idx[i];
        s->scr->key[t] = s->scr->w[t] > 0 ? (float)-fabs((l[t] - mx) * inv - ex) : -INFINITY;
    }
    const double target = s->p.typical_p * *zc;
    int keep = 0;
    if (all) {
        for (int k = V < 256 ? V : 256;; k = k > V / 8 ? V : k * 8) {
            top_k(s, s->scr->key, k);
            for (int i = 0; i < k; i++) s->scr->val[i] = s->scr->key[s->scr->idx[i]];
            keep = best_first(s, k, target);
            double acc = 0;
            for (int i = 0; i < keep; i++) acc += s->scr->w[s->scr->idx[i]];
            if (acc >= target || k == V) break;
        }
    } else {
        for (int i = 0; i < n; i++) s->scr->val[i] = s->scr->key[s->scr->idx[i]];
        keep = best_first(s, n, target);
    }
    /* best_first ranked by score but summed weights: it stopped at the
     * first prefix of scores holding the target. */
    *zc = 0;
    for (int i = 0; i < keep; i++) *zc += s->scr->w[s->scr->idx[i]];
    order_by_logit(s, l, keep);
    return keep;
}

/* The first weight threshold of top-p, in weigh's pass: the tokens of
 * weight >= 2^-8 of the best (at most 256 x the total weight over the
 * best's, so a few hundred for a peaked distribution). */
#define TOP_P_GATHER (1.0f / 256)

/* Top-p over the whole vocabulary of weight z when the tokens of weight >=
 * TOP_P_GATHER did not hold top_p of it: gathers those of weight >= tau for
 * tau = TOP_P_GATHER / 16, / 256, ... until they do (at most z / tau of
 * them), then orders only as many as the cut needs. Tokens of weight >= tau
 * always lead the order, so the cut is the same as over the sorted
 * vocabulary. */
static int top_p_all(sampler *s, const float *l, double z) {
    const int32_t V = s->n_vocab;
    const double target = s->p.top_p * z;
    int n = 0;
    for (double tau = TOP_P_GATHER / 16.0;; tau /= 16) {
        const float ft = tau < 1e-37 ? 0.0f : (float)tau;
        double acc = 0;
        n = 0;
        for (int32_t t = 0; t < V; t++) {
            const float w = s->scr->w[t];
            if (w >= ft && w > 0) {
                s->scr->idx[n] = t;
                s->scr->val[n++] = l[t];
                acc += w;
            }
        }
        if (acc >= target || ft == 0) break;
    }
    return best_first(s, n, target);
}

/* A draw among idx[0..n) by weight at u in [0, 1); z is their total. */
static int32_t draw(sampler *s, int n, double z, double u01) {
    double u = u01 * z, acc = 0;
    int32_t last = s->scr->idx[0];
    for (int i = 0; i < n; i++) {
        const float w = s->scr->w[s->scr->idx[i]];
        if (w <= 0) continue;
        acc += w;
        last = s->scr->idx[i];
        if (u < acc) return last;
    }
    return last;
}

/* What a step draws from: when one token is certain (greedy, top-k 1,
 * every token banned, an infinite logit) that token, else -1 with the
 * candidates set up: idx[0..n) best first with weights w[] (n >= 0), or
 * every token of weight >= thr (n < 0; w[] written for all), z their
 * total weight and best the most likely. */
typedef struct kept_set {
    int n;
    float thr;
    double z;
    int32_t best;
} kept_set;

/* The greedy pick where the only adjustments are bans (biases of -inf:
 * `cellm bench --ignore-eos`, a request's banned tokens), without
 * adjust's copy of the row: the raw row's first best when it is finite
 * from below and not banned (a ban only lowers a token, so no token
 * before it reaches its logit in the adjusted row); else -1. */
static int32_t greedy_unbanned(const sampler *s, const float *raw) {
    if (!greedy(&s->p) || !s->n_bias || pen_on(s) || ngram_on(s) || !bias_bans_only(s)) return -1;
    int32_t t = sampler_argmax(raw, s->n_vocab);
    return raw[t] > -INFINITY && !banned(s, t) ? t : -1;
}

static int32_t kept(sampler *s, const float *raw, kept_set *k) {
    const sampler_params *p = &s->p;
    const int32_t V = s->n_vocab;
    const int32_t pick = greedy_unbanned(s, raw);
    if (pick >= 0) return pick;
    const float *l = adjust(s, raw);
    const float mx = max_of(l, V);
    /* Everything banned: the raw choice is the least surprising answer. */
    if (!(mx > -INFINITY)) return sampler_argmax(raw, V);
    if (greedy(p) || !(mx < INFINITY)) return first_of(l, V, mx);
    const float inv = 1.0f / p->temperature;
    const bool top_k_first = p->top_k > 0 && p->top_k < V;
    const bool ranked = top_k_first || p->typical_p < 1 || p->top_p < 1;
    /* Top-p alone gathers its first candidates while weighing. */
    const bool gather = p->top_p < 1 && !top_k_first && p->typical_p >= 1;
    const float c = inv * 1.44269504f; /* weights are 2^((logit - mx) * c) */
    int n_gathered = 0;
    double z_all = 0;
    /* After top-k only its candidates need weights. */
    if (!top_k_first)
        z_all = weigh(s, l, mx, c, gather ? TOP_P_GATHER : 0, &n_gathered); /* the best: 1 */
    if (!ranked) {
        /* Temperature and min-p need no order: one pass for the kept
         * weight (the best weighs 1), one for the draw. */
        double z = z_all;
        if (p->min_p > 0) {
            z = 0;
            for (int32_t t = 0; t < V; t++) z += s->scr->w[t] >= p->min_p ? s->scr->w[t] : 0;
        }
        *k = (kept_set){-1, p->min_p, z, first_of(l, V, mx)};
        return -1;
    }
    /* Each step keeps a best-first prefix of what the one before kept and
     * renormalises: top-k, typical-p, top-p, min-p (llama.cpp's order). */
    int n = -1; /* -1: every token, unordered (top-k off) */
    double z = z_all;
    if (top_k_first) {
        n = top_k(s, l, p->top_k);
        order_by_logit(s, l, n);
        for (int i = 0; i < n; i++) {
            float y = l[s->scr->idx[i]] - mx;
            y = y * c;
            s->scr->w[s->scr->idx[i]] = exp2_neg(y);
        }
        z = 0;
        for (int i = 0; i < n; i++) z += s->scr->w[s->scr->idx[i]];
    }
    if (p->typical_p < 1) n = typical(s, l, n, mx, inv, &z);
    if (gather) {
        double acc = 0;
        for (int i = 0; i < n_gathered; i++) acc += s->scr->w[s->scr->idx[i]];
        n = acc >= p->top_p * z ? best_first(s, n_gathered, p->top_p * z) : top_p_all(s, l, z);
    } else if (p->top_p < 1) {
        double acc = 0;
        for (int i = 0; i < n; i++)
            if ((acc += s->scr->w[s->scr->idx[i]]) >= p->top_p * z) {
                n = i + 1;
                break;
            }
    }
    z = 0;
    const float w0 = s->scr->w[s->scr->idx[0]];
    for (int i = 0; i < n; i++) {
        const float w = s->scr->w[s->scr->idx[i]];
        if (p->min_p > 0 && w < p->min_p * w0) {
            n = i;
            break;
        }
        z += w;
    }
    *k = (kept_set){n, 0, z, s->scr->idx[0]};
    return -1;
}

/* A draw from the kept set k at u in [0, 1). */
static int32_t draw_kept(sampler *s, const kept_set *k, double u) {
    if (k->n >= 0) return draw(s, k->n, k->z, u);
    double x = u * k->z, acc = 0;
    int32_t last = k->best;
    for (int32_t t = 0; t < s->n_vocab; t++) {
        const float w = s->scr->w[t];
        if (w < k->thr || w <= 0) continue;
        acc += w;
        last = t;
        if (x < acc) return t;
    }
    return last;
}

int32_t sampler_sample(sampler *s, const float *raw) {
    kept_set k;
    int32_t t = kept(s, raw, &k);
    return t >= 0 ? t : draw_kept(s, &k, uniform(s));
}

/* Whether token t is in the kept set (n >= 0: among idx[0..n)). */
static bool in_kept(const sampler *s, const kept_set *k, int32_t t) {
    if (k->n < 0) return s->scr->w[t] >= k->thr && s->scr->w[t] > 0;
    for (int i = 0; i < k->n; i++)
        if (s->scr->idx[i] == t) return true;
    return false;
}

int32_t sampler_sample_spec(sampler *s, const float *raw, int32_t guess, const int32_t *q_ids,
                            const float *q_p, int32_t q_n, double u_accept, double u_draw) {
    kept_set k;
    int32_t t = kept(s, raw, &k);
    if (t >= 0) return t; /* p is one token: the guess is kept exactly when it is that one */
    if (guess >= 0) {
        double q = 0, p = in_kept(s, &k, guess) ? s->scr->w[guess] / k.z : 0;
        for (int32_t i = 0; i < q_n; i++)
            if (q_ids[i] == guess) q = q_p[i];
        if (u_accept * q < p) return guess;
    }
    if (q_n == 0) return draw_kept(s, &k, u_draw);
    /* The residual max(0, p - q): the candidates listed in idx (those of
     * weight >= thr, in id order, when they were not), then the weight of
     * each q token among them lowered by q z. */
    if (k.n < 0) {
        int n = 0;
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (s->scr->w[i] >= k.thr && s->scr->w[i] > 0) s->scr->idx[n++] = i;
        k.n = n;
    }
    for (int32_t i = 0; i < q_n; i++) {
        int32_t y = q_ids[i];
        if (!in_kept(s, &k, y)) continue;
        float r = s->scr->w[y] - (float)(q_p[i] * k.z);
        s->scr->w[y] = r > 0 ? r : 0;
    }
    k.z = 0;
    for (int i = 0; i < k.n; i++) k.z += s->scr->w[s->scr->idx[i]];
    /* p <= q everywhere only when p = q, where the guess is always kept;
     * rounding may still get here. */
    if (!(k.z > 0)) return k.best;
    return draw(s, k.n, k.z, u_draw);
}

/* ---------------------------------------------------------- logprobs */

double sampler_log_norm(const float *logits, int32_t n) {
    const float mx = max_of(logits, n);
    if (!isfinite(mx)) return (double)mx;
    /* e^(x - mx) = 2^((x - mx) log2 e) with the sampler's exp2 (relative
     * error below 2e-7, the same bits on every platform), summed in four
     * double lanes by index mod 4 and folded in one order: the vector and
     * plain paths add the same numbers in the same order. The largest
     * term is 1, so the sum is in [1, n]. */
    const float c = 1.44269504f; /* log2(e) */
    double acc[4] = {0, 0, 0, 0};
    int32_t i = 0;
#if SAMPLER_VEC
    for (; i + 4 <= n; i += 4) {
        v4f y;
        memcpy(&y, logits + i, sizeof y);
        y = y - mx;
        y = y * c;
        const v4f e = exp2_neg4(y);
        for (int j = 0; j < 4; j++) acc[j] += (double)e[j];
    }
#endif
    for (; i < n; i++) {
        float y = logits[i] - mx;
        y = y * c;
        acc[i & 3] += (double)exp2_neg(y);
    }
    return (double)mx + xm_log((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

float sampler_token_logprob(const float *logits, double norm, int32_t token) {
    return (float)((double)logits[token] - norm);
}

int32_t sampler_top_logprobs(const float *logits, int32_t n, double norm, int32_t k,
                             sampler_logprob *out) {
    if (k > SAMPLER_MAX_TOP_LOGPROBS) k = SAMPLER_MAX_TOP_LOGPROBS;
    if (k <= 0) return 0;
    float v[SAMPLER_MAX_TOP_LOGPROBS];
    int32_t have = 0;
    float floor_v = -INFINITY; /* the list's last value once it is full */
    for (int32_t i = 0; i < n; i++) {
        const float x = logits[i];
        /* Strictly greater: on a tie the earlier (lower) id stays ahead;
         * NaN never enters. */
        if (have == k ? !(x > floor_v) : x != x) continue;
        int32_t j = have < k ? have++ : k - 1;
        while (j > 0 && x > v[j - 1]) {
            v[j] = v[j - 1];
            out[j].token = out[j - 1].token;
            j--;
        }
        v[j] = x;
        out[j].token = i;
        if (have == k) floor_v = v[k - 1];
    }
    for (int32_t j = 0; j < have; j++)
        out[j].logprob = sampler_token_logprob(logits, norm, out[j].token);
    return have;
}
