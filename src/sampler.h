/*
 * sampler.h — picks the next token from a row of logits: greedy, or
 * temperature with top-k, top-p and min-p truncation, drawn with a
 * per-sampler PRNG so a seed gives the same tokens on every platform.
 *
 * The PRNG is xoshiro256** seeded through splitmix64 of the 64-bit seed; a
 * draw takes the top 24 bits of one output as a float in [0, 1). Candidates
 * are found with a bounded heap, never a full sort of the vocabulary.
 */
#ifndef CELLM_SAMPLER_H
#define CELLM_SAMPLER_H

#include <stdint.h>

#include "util.h"

typedef struct sampler_params {
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* keep the k most likely; <= 0: no limit */
    float top_p;       /* keep the smallest set with this much probability; >= 1: off */
    float min_p;       /* drop tokens below min_p x the best one's probability; <= 0: off */
    uint64_t seed;
} sampler_params;

sampler_params sampler_default_params(void);

typedef struct sampler sampler;

/* A sampler for a vocabulary of n_vocab tokens; its scratch is allocated
 * here, once. */
cellm_status sampler_create(const sampler_params *p, int32_t n_vocab, sampler **out,
                            cellm_error *err);
void sampler_free(sampler *s);

/* Restarts the PRNG from `seed`. */
void sampler_reseed(sampler *s, uint64_t seed);

/* The next token for `logits` (n_vocab floats; not modified). */
int32_t sampler_sample(sampler *s, const float *logits);

/* The most likely token; ties go to the lowest id. */
int32_t sampler_argmax(const float *logits, int32_t n);

#endif /* CELLM_SAMPLER_H */
