/*
 * sampler.h — picks the next token from a row of logits: greedy, or
 * temperature with top-k, top-p and min-p truncation, drawn with a
 * per-sampler PRNG so a seed gives the same tokens on every platform.
 *
 * Before truncation the logits may be adjusted from the recent tokens the
 * caller records with sampler_accept(): a logit bias per token id, a
 * repetition penalty (CTRL style: positive logits divided, negative ones
 * multiplied), presence and frequency penalties (OpenAI style), and a guard
 * that bans a token completing an n-gram already repeated too often in the
 * window. Locally typical sampling (typical-p) is one more truncation.
 *
 * The PRNG is xoshiro256** seeded through splitmix64 of the 64-bit seed; a
 * draw takes the top 24 bits of one output as a float in [0, 1). Candidates
 * are found with a bounded heap, never a full sort of the vocabulary; the
 * penalties touch only the tokens in the window, so a step costs a few
 * passes over the logits whatever the vocabulary size.
 */
#ifndef CELLM_SAMPLER_H
#define CELLM_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"

typedef struct sampler_logit_bias {
    int32_t token;
    float bias;
} sampler_logit_bias;

typedef struct sampler_params {
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* keep the k most likely; <= 0: no limit */
    float top_p;       /* keep the smallest set with this much probability; >= 1: off */
    float min_p;       /* drop tokens below min_p x the best one's probability; <= 0: off */
    float typical_p;   /* keep the most typical tokens up to this much probability; >= 1: off */
    uint64_t seed;
    /* Penalties over the last `penalty_last_n` accepted tokens. */
    int32_t penalty_last_n;  /* window length; 0: no history kept */
    float repeat_penalty;    /* 1: off; > 1 discourages tokens in the window */
    float presence_penalty;  /* subtracted once from each token in the window; 0: off */
    float frequency_penalty; /* subtracted per occurrence in the window; 0: off */
    /* Repetition guard: when > 0, a token that would complete an n-gram of
     * `ngram_size` tokens already seen `ngram_max_repeats` times in the
     * window is banned. Typical values 4 and 2; 0: off. */
    int32_t ngram_size;
    int32_t ngram_max_repeats;
    /* Added to the logits of the given tokens (-INFINITY bans a token);
     * copied by sampler_create. */
    const sampler_logit_bias *logit_bias;
    int32_t n_logit_bias;
} sampler_params;

sampler_params sampler_default_params(void);

typedef struct sampler sampler;

/* Where a draw works: arrays of the vocabulary's size and a table of the
 * penalty window, nothing kept between draws. A sampler made by
 * sampler_create has its own; samplers made by sampler_create_shared
 * have none and draw in one they are bound to (sampler_bind), so an
 * engine keeps one a thread, not one a request (one request's sampler
 * holds only its window and parameters). */
typedef struct sampler_scratch sampler_scratch;
/* A scratch for samplers of n_vocab tokens whose penalty windows
 * (penalty_last_n) are at most max_window. */
cellm_status sampler_scratch_create(int32_t n_vocab, int32_t max_window, sampler_scratch **out,
                                    cellm_error *err);
void sampler_scratch_free(sampler_scratch *x);
/* What sampler_scratch_create allocates. */
size_t sampler_scratch_bytes(int32_t n_vocab, int32_t max_window);

/* A sampler for a vocabulary of n_vocab tokens, with its own scratch,
 * allocated here, once. */
cellm_status sampler_create(const sampler_params *p, int32_t n_vocab, sampler **out,
                            cellm_error *err);
void sampler_free(sampler *s);
/* A sampler with no scratch of its own: every call that draws
 * (sampler_sample, sampler_sample_spec) needs one bound first, made for
 * windows at least as long as p->penalty_last_n, and used by one thread
 * at a time. */
cellm_status sampler_create_shared(const sampler_params *p, int32_t n_vocab, sampler **out,
                                   cellm_error *err);
/* The scratch s's next draws work in (NULL: its own, if it has one). */
void sampler_bind(sampler *s, sampler_scratch *x);

/* Restarts the PRNG from `seed`. */
void sampler_reseed(sampler *s, uint64_t seed);

/* Records a token of the sequence (a prompt token or a sampled one) in the
 * penalty window. The caller feeds every token it wants penalised, in
 * order; sampler_sample does not record its own choice. */
cellm_status sampler_accept(sampler *s, int32_t token, cellm_error *err);

/* Empties the penalty window (a new sequence). */
void sampler_reset_history(sampler *s);

/* The next token for `logits` (n_vocab floats; not modified). When every
 * token is banned (all adjusted logits -inf) it falls back to the argmax of
 * the raw logits. */
int32_t sampler_sample(sampler *s, const float *logits);

/* A small distribution: n tokens and their probabilities (a draft's,
 * for sampler_sample_spec). */
#define SAMPLER_DIST_MAX 64
typedef struct sampler_dist {
    int32_t n;
    int32_t ids[SAMPLER_DIST_MAX];
    float p[SAMPLER_DIST_MAX];
} sampler_dist;

/* Speculative sampling, the standard rule (Leviathan et al. 2023, Chen et
 * al. 2023): the token at a position where a draft proposed `guess` drawn
 * from its distribution q (q_n entries q_ids/q_p summing to 1, the guess
 * among them; guess -1 and q_n 0: no proposal). The guess stands when
 * u_accept x q(guess) < p(guess), with p what sampler_sample draws from;
 * otherwise the token is drawn at u_draw from max(0, p - q) renormalised
 * (from p itself without a proposal). Over u_accept and u_draw uniform in
 * [0, 1) the result is distributed as p whatever q is. The caller gives
 * the uniforms: this does not touch the sampler's PRNG. */
int32_t sampler_sample_spec(sampler *s, const float *logits, int32_t guess, const int32_t *q_ids,
                            const float *q_p, int32_t q_n, double u_accept, double u_draw);

/* The parameters the sampler was made with (logit_bias not kept). */
const sampler_params *sampler_get_params(const sampler *s);

/* The most likely token; ties go to the lowest id. */
int32_t sampler_argmax(const float *logits, int32_t n);

/* Whether sampler_sample's next token is decided by a row's k best raw
 * logits: greedy, no penalty or n-gram guard, and no logit bias but bans
 * (-INFINITY), fewer than k of them. Then a backend may hand back those k
 * instead of the row (model/backend.h's fwd_top). */
bool sampler_top_ok(const sampler *s, int32_t k);

/* The token sampler_sample would return for a row whose k best raw
 * logits are logit[0..k), tokens token[0..k), in the order fwd_top gives
 * (a larger logit first, a tie to the lower token, NaN last), given
 * sampler_top_ok(s, k). It does not touch the sampler. */
int32_t sampler_pick_top(const sampler *s, const float *logit, const int32_t *token, int32_t k);

/* Log-probabilities: the log-softmax of a row of raw logits (no bias,
 * penalty or temperature), computed in one fixed order with the sampler's
 * own exp2 and xm_log, so the bits are the same on every CPU and in the
 * plain (CELLM_NO_VECTOR_EXT) build. */
#define SAMPLER_MAX_TOP_LOGPROBS 20

typedef struct sampler_logprob {
    int32_t token;
    float logprob;
} sampler_logprob;

/* log(sum_i e^logits[i]) of logits[0..n), in double: logits[t] minus it is
 * token t's log-probability. One pass of exp over the row. */
double sampler_log_norm(const float *logits, int32_t n);

/* Token t's log-probability, given the row's sampler_log_norm. */
float sampler_token_logprob(const float *logits, double norm, int32_t token);

/* The k (at most SAMPLER_MAX_TOP_LOGPROBS) most likely tokens of the row
 * into out[], most likely first, ties to the lower id, with their
 * log-probabilities (the same bits as sampler_token_logprob). Returns how many
 * (k, unless the row has fewer non-NaN logits). */
int32_t sampler_top_logprobs(const float *logits, int32_t n, double norm, int32_t k,
                             sampler_logprob *out);

#endif /* CELLM_SAMPLER_H */
