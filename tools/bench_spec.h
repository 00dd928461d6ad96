/*
 * bench_spec.h — `cellm bench --draft MODEL` / `--lookup N`: what
 * speculative decoding gains on this machine. The plain engine and the
 * speculative one run the same chat prompts side by side in one process,
 * round after round in alternating order, so a change in the machine's
 * load falls on both; each round's speed-up is the ratio of the two, and
 * the table gives the medians and ranges over the rounds.
 */
#ifndef CELLM_BENCH_SPEC_H
#define CELLM_BENCH_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "cellm.h"

typedef struct bench_spec_opts {
    const char *draft_path; /* the draft model's file; NULL: none */
    int32_t lookup;         /* prompt lookup's n-gram size; 0: off */
    int32_t draft_max;      /* < 0: the engine's default; so for the two below */
    int32_t draft_min;
    float draft_p_min;
    bool draft_always; /* --draft-always */
    int32_t accept;    /* cellm_spec_accept */
    float temp;        /* > 0: sampled rounds (top-k 40, top-p 0.95, min-p 0.05, a seed a prompt) */
    const char *tasks; /* comma-separated: prose, edit, summary */
    const char *sessions; /* comma-separated session counts */
    int32_t n_predict;    /* completion tokens a request at most */
    int reps;             /* measured rounds */
    bool json;
    bool dump; /* only print the tasks' prompts as JSON (bench/spec_vs_llama.py) */
} bench_spec_opts;

/* Runs the benchmark of the model at `path` (`name` in the report) with
 * the engine parameters `ep` (threads, budget, context) and prints the
 * table, or JSON with o->json. Returns the exit status: 1 when a model or
 * engine cannot be made or a speculative run's text differs from the
 * plain run's (which would be a bug: they must be identical), or with the
 * resample rule, from the first round's (a seed's text must repeat). */
int bench_spec(const char *path, const char *name, const cellm_engine_params *ep,
               const bench_spec_opts *o);

#endif /* CELLM_BENCH_SPEC_H */
