/*
 * rt.h — what the generating commands share: a model with its tokenizer,
 * KV cache, thread pool and forward context, opened from a path or store
 * name, and a helper that feeds one sequence in chunks (for run and
 * perplexity; serving many sequences goes through the engine,
 * src/engine.c); and the sampling and stop flags, with llama.cpp's names,
 * parsed into the public cellm_sampling so any command can take them. The
 * chat templates live in the library (src/chat.h).
 */
#ifndef CELLM_RT_H
#define CELLM_RT_H

#include <stdbool.h>
#include <stdint.h>

#include "cellm.h"
#include "chat.h"
#include "forward.h"
#include "sampler.h"
#include "tokenizer.h"

typedef struct rt {
    model *m;
    tokenizer *tok;
    kv_cache *kv;
    threadpool *tp;
    forward_ctx *fwd;
    int32_t batch; /* rows per forward call */
    int32_t ctx;
} rt;

typedef struct rt_opts {
    int threads; /* 0: all cores, at most 4 */
    int32_t ctx; /* 0: the model's, at most 4096 */
    int32_t batch;
    int32_t logit_rows;    /* rows that may want logits in one call */
    cellm_kv_type kv_type; /* 0: f16 */
} rt_opts;

/* Resolves `name_or_path` (fetching a known model if needed) and opens it. */
cellm_status rt_open(const char *name_or_path, const rt_opts *o, rt *r, cellm_error *err);
void rt_close(rt *r);

/* Feeds tok[0..n) to `s`; if `logits` is not NULL, copies the last token's
 * logits there (n_vocab floats). */
cellm_status rt_feed(rt *r, kv_seq *s, const int32_t *tok, int32_t n, float *logits,
                     cellm_error *err);

/* The sampling and stop flags of a command line. */
typedef struct rt_sampling {
    cellm_sampling s; /* s.logit_bias points into bias[] */
    cellm_logit_bias bias[CELLM_MAX_LOGIT_BIAS];
    const char *stop[CELLM_MAX_STOP_STRINGS]; /* argv strings */
    int32_t n_stop;
} rt_sampling;

/* The defaults (cellm_request_default_params's). */
void rt_sampling_init(rt_sampling *rs);

/* If argv[*i] is one of the flags in RT_SAMPLING_USAGE, takes it and its
 * value (advancing *i) and returns 1; returns 0 for any other argument,
 * and -1 after printing an error naming the flag for a bad value. `cmd`
 * prefixes the messages. */
int rt_sampling_flag(rt_sampling *rs, int argc, char **argv, int *i, const char *cmd);

/* The usage lines of those flags. */
#define RT_SAMPLING_USAGE                                                                          \
    "sampling (llama.cpp's names; the defaults are greedy, every penalty off):\n"                  \
    "  --temp T              temperature; 0: greedy (default 0)\n"                                 \
    "  --top-k K             keep the K most likely tokens (default 0: off)\n"                     \
    "  --top-p P             keep the fewest tokens holding P of the probability (default 1: "     \
    "off)\n"                                                                                       \
    "  --min-p P             drop tokens below P x the best one's probability (default 0: off)\n"  \
    "  --typical P           locally typical sampling (default 1: off)\n"                          \
    "  --repeat-penalty X    penalise tokens of the last --repeat-last-n (default 1: off)\n"       \
    "  --repeat-last-n N     the penalties' window, prompt included (default 64; -1: context)\n"   \
    "  --presence-penalty X  subtract X from tokens in the window (default 0)\n"                   \
    "  --frequency-penalty X subtract X per occurrence in the window (default 0)\n"                \
    "  --logit-bias ID(+|-)X add or subtract X from token ID's logit; -inf bans it "               \
    "(repeatable)\n"                                                                               \
    "  --ngram-guard N       ban a token that would complete an N-token run seen\n"                \
    "                        --ngram-guard-repeats times in the window (default 0: off; try 3)\n"  \
    "  --ngram-guard-repeats R   (default 2)\n"                                                    \
    "  -s, --seed N          sampling seed; -1: a random one (default a fixed seed)\n"             \
    "  -r, --reverse-prompt TEXT  stop when TEXT appears; it is not printed (repeatable)\n"

/* The library's sampler parameters for `rs` in a context of ctx tokens. */
sampler_params rt_sampler_params(const rt_sampling *rs, int32_t ctx);

#endif /* CELLM_RT_H */
