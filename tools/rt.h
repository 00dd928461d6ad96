/*
 * rt.h — what the generating commands share: a model with its tokenizer,
 * KV cache, thread pool and forward context, opened from a path or store
 * name, and a helper that feeds one sequence in chunks (for run and
 * perplexity; serving many sequences goes through the engine,
 * src/runtime/engine.c); and the sampling and stop flags, with llama.cpp's names,
 * parsed into the public cellm_sampling so any command can take them. The
 * chat templates live in the library (src/model/chat.h).
 */
#ifndef CELLM_RT_H
#define CELLM_RT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cellm.h"
#include "model/chat.h"
#include "cpu/forward.h"
#include "format/gguf.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "text/tokenizer.h"

typedef struct rt {
    cellm_model *cm; /* owns m and tok (a handle, so spec_check can compare two) */
    model *m;
    tokenizer *tok;
    kv_cache *kv;
    threadpool *tp;
    bool own_tp;   /* false: tp is another rt's (a draft model shares its target's) */
    backend fwd;   /* runs the forward pass on rt_opts.device */
    int32_t batch; /* rows per forward call */
    int32_t ctx;
} rt;

typedef struct rt_opts {
    int threads; /* 0: all cores, at most 4 */
    int32_t ctx; /* 0: the model's, at most 4096 */
    int32_t batch;
    int32_t logit_rows;    /* rows that may want logits in one call */
    cellm_kv_type kv_type; /* 0: f16 */
    /* Positions a sequence may be truncated by (kv_seq.slack, for the
     * guesses speculative decoding takes back); the KV cache is sized for
     * passes that much longer. */
    int32_t slack;
    threadpool *tp;     /* a pool to share, not owned; NULL: its own of `threads` */
    int32_t device;     /* cellm_device: 0 (auto) */
    int32_t gpu_layers; /* cellm_engine_params.gpu_layers: 0 (all) */
} rt_opts;

/* Resolves `name_or_path` (fetching a known model if needed) and opens it. */
cellm_status rt_open(const char *name_or_path, const rt_opts *o, rt *r, cellm_error *err);
void rt_close(rt *r);

/* Feeds tok[0..n) to `s`; if `logits` is not NULL, copies the last token's
 * logits there (n_vocab floats). */
cellm_status rt_feed(rt *r, kv_seq *s, const int32_t *tok, int32_t n, float *logits,
                     cellm_error *err);

/* rt_feed where the rows whose token is `image_token` take, in order, the
 * n_embd rows of embd[0..n_embd_rows) as their input (a picture's rows,
 * cellm_image_encode); the count must match. */
cellm_status rt_feed_image(rt *r, kv_seq *s, const int32_t *tok, int32_t n, int32_t image_token,
                           const float *embd, int32_t n_embd_rows, float *logits, cellm_error *err);

/* rt_feed (n >= 1), pointing *logits at the last token's logits instead of
 * copying them: valid until r's next pass. */
cellm_status rt_feed_last(rt *r, kv_seq *s, const int32_t *tok, int32_t n, const float **logits,
                          cellm_error *err);

/* Feeds tok[0..n) to `s` in one pass (n up to rt_opts.logit_rows) with the
 * logits of every token: *logits points to n rows of n_vocab floats,
 * valid until r's next pass. */
cellm_status rt_feed_all(rt *r, kv_seq *s, const int32_t *tok, int32_t n, const float **logits,
                         cellm_error *err);

/* The fields the sampling flags set, in the order of RT_SAMPLING_USAGE;
 * bit (1u << RT_S_...) of rt_sampling.given says a flag set the field. */
enum {
    RT_S_TEMP,
    RT_S_TOP_K,
    RT_S_TOP_P,
    RT_S_MIN_P,
    RT_S_TYPICAL,
    RT_S_REPEAT_PENALTY,
    RT_S_REPEAT_LAST_N,
    RT_S_PRESENCE_PENALTY,
    RT_S_FREQUENCY_PENALTY,
    RT_S_NGRAM_GUARD,
    RT_S_NGRAM_GUARD_REPEATS,
    RT_S_SEED,
    RT_S_COUNT
};

/* The sampling and stop flags of a command line. */
typedef struct rt_sampling {
    cellm_sampling s; /* s.logit_bias points into bias[] */
    cellm_logit_bias bias[CELLM_MAX_LOGIT_BIAS];
    const char *stop[CELLM_MAX_STOP_STRINGS]; /* argv strings */
    int32_t n_stop;
    uint32_t given;      /* fields a flag set (RT_S_* bits) */
    uint32_t from_model; /* fields the model file's recommendation set */
} rt_sampling;

/* The defaults (cellm_request_default_params's): greedy, penalties off,
 * a fixed seed. */
void rt_sampling_init(rt_sampling *rs);

/* If argv[*i] is one of the flags in RT_SAMPLING_USAGE, takes it and its
 * value (advancing *i) and returns 1; returns 0 for any other argument,
 * and -1 after printing an error naming the flag for a bad value. `cmd`
 * prefixes the messages. */
int rt_sampling_flag(rt_sampling *rs, int argc, char **argv, int *i, const char *cmd);

/* The chat defaults of `cellm run`, those llama.cpp and Ollama use, with
 * the seed fixed so a run repeats itself (docs/sampling.md). */
#define RT_CHAT_TEMP 0.8f
#define RT_CHAT_TOP_K 40
#define RT_CHAT_TOP_P 0.95f
#define RT_CHAT_MIN_P 0.05f

/* Sets each field no flag gave to its chat default: the model file's
 * recommendation (llama.cpp's general.sampling.temp, .top_k, .top_p,
 * .min_p, .penalty_last_n, .penalty_repeat) where `f` has a valid one,
 * else the built-in RT_CHAT_* value. A recommended value of the wrong
 * type or out of the flag's range is ignored, with a line on `log` (NULL:
 * silently). Call after the flags are parsed; `f` may be NULL. */
void rt_sampling_chat_defaults(rt_sampling *rs, const gguf_file *f, FILE *log);

/* One line on `out` with the sampling settings and which came from flags
 * or from the model file (for --verbose). */
void rt_sampling_print(const rt_sampling *rs, FILE *out);

/* The usage lines of those flags. */
#define RT_SAMPLING_USAGE                                                                          \
    "sampling (llama.cpp's names). A chat samples at temperature 0.8, top-k 40, top-p 0.95\n"      \
    "and min-p 0.05 from a fixed seed, or as the model file recommends (general.sampling.*);\n"    \
    "--raw is greedy. Penalties (unless the file sets one) and the n-gram guard are off.\n"        \
    "Flags win over both:\n"                                                                       \
    "  --temp T              temperature; 0: greedy\n"                                             \
    "  --top-k K             keep the K most likely tokens (0: off)\n"                             \
    "  --top-p P             keep the fewest tokens holding P of the probability (1: off)\n"       \
    "  --min-p P             drop tokens below P x the best one's probability (0: off)\n"          \
    "  --typical P           locally typical sampling (default 1: off)\n"                          \
    "  --repeat-penalty X    penalise tokens of the last --repeat-last-n (default 1: off)\n"       \
    "  --repeat-last-n N     the penalties' window, prompt included (default 64; -1: context)\n"   \
    "  --presence-penalty X  subtract X from tokens in the window (default 0)\n"                   \
    "  --frequency-penalty X subtract X per occurrence in the window (default 0)\n"                \
    "  --logit-bias ID(+|-)X add or subtract X from token ID's logit; -inf bans it "               \
    "(repeatable)\n"                                                                               \
    "  --ngram-guard N       ban a token that would complete an N-token run seen\n"                \
    "                        --ngram-guard-repeats times in the window (default 0: off; try 4)\n"  \
    "  --ngram-guard-repeats R   (default 2)\n"                                                    \
    "  -s, --seed N          sampling seed; -1: a random one (default a fixed seed)\n"             \
    "  -r, --reverse-prompt TEXT  stop when TEXT appears; it is not printed (repeatable)\n"

/* The library's sampler parameters for `rs` in a context of ctx tokens. */
sampler_params rt_sampler_params(const rt_sampling *rs, int32_t ctx);

/* ---- speculative decoding for one sequence (cellm run) ----
 *
 * Before each pass of the model the caller asks for guesses of the tokens
 * that follow its sequence, feeds them after its pending token in one pass
 * (rt_feed_all), samples row by row exactly as a plain run would, keeps
 * guesses while they equal what it drew, and takes the rest back
 * (kv_seq_truncate): the text is the plain run's (src/runtime/spec.c says why).
 * Guesses come from prompt lookup (spec_lookup) and, where it finds
 * nothing, from a draft model run greedily on its own KV. */

#define RT_SPEC_MAX 64 /* the most guesses in one pass (--draft-max) */

typedef struct rt_spec_opts {
    const char *draft; /* a draft model's path or store name; NULL: none */
    int32_t lookup;    /* prompt lookup with n-grams of lookup .. 1; 0: off */
    int32_t draft_max; /* guesses in one pass, 1..RT_SPEC_MAX */
    int32_t draft_min; /* fewer guesses than this are not fed */
    float draft_p_min; /* the draft stops at a token it gives less probability */
    int32_t accept;    /* cellm_spec_accept: the exact rule or the resample rule */
    bool draft_always; /* the draft every pass, not only while it pays (spec_gate) */
} rt_spec_opts;

typedef struct rt_spec {
    rt_spec_opts o;
    bool on;        /* a draft or lookup */
    bool has_draft; /* d and dseq are open */
    rt d;           /* the draft model, sharing its target's threads */
    kv_seq dseq;    /* the draft's KV of the target's first dseq.n_pos tokens */
    int32_t k;      /* guesses to try next: adapts to how many were kept */
    uint64_t n_guess, n_kept, n_pass, n_draft_pass;
    /* The draft's gate, and the last pass since rt_spec_propose: when it
     * began, the tokens then, whether the draft ran, for how long, and
     * whether it guessed (t_last 0: no pass to account for). */
    spec_gate gate;
    double t_last, draft_ms;
    int32_t n_last;
    bool asked, drafted, guessed;
    /* The resample rule (accept CELLM_SPEC_ACCEPT_RESAMPLE on a sampled
     * run without a grammar): the sampler's parameters, set by the caller
     * (NULL: the exact rule), and the distribution of each guess. */
    const sampler_params *sp;
    sampler_dist q[RT_SPEC_MAX];
} rt_spec;

/* The engine's defaults: no draft, no lookup, 8 .. 1 guesses, p-min 0.5. */
void rt_spec_opts_init(rt_spec_opts *o);

/* As rt_sampling_flag, for the flags of RT_SPEC_USAGE. */
int rt_spec_flag(rt_spec_opts *o, int argc, char **argv, int *i, const char *cmd);

/* The target's rt_opts for speculation: a truncation slack and logit rows
 * for the pending token and every guess (nothing without a draft or
 * lookup). */
void rt_spec_target_opts(const rt_spec_opts *o, rt_opts *target);

/* Opens the draft model (if any) for `target`, opened with `to` as set by
 * rt_spec_target_opts: its KV is sized like the target's, for the same
 * context; a draft of another family or vocabulary is refused
 * (spec_check). CELLM_OK with nothing to open when speculation is off. */
cellm_status rt_spec_open(rt_spec *s, const rt_spec_opts *o, rt *target, const rt_opts *to,
                          cellm_error *err);
void rt_spec_close(rt_spec *s);

/* Up to min(k, room) guesses of what follows tok[0..n_tok) written to out
 * (RT_SPEC_MAX ints): lookup's, else the draft's; 0 when fewer than
 * draft_min. The draft must hold no more than tok[0 .. n_tok - 1). */
int32_t rt_spec_propose(rt_spec *s, const int32_t *tok, int32_t n_tok, int32_t room, int32_t *out);

/* After a pass that checked n_guess guesses and kept `kept`: counts them,
 * adapts k as the engine does, and takes the draft's KV back to the
 * sequence's first n_valid tokens. */
void rt_spec_done(rt_spec *s, int32_t n_guess, int32_t kept, int32_t n_valid);

/* The caller stops passes for a while (a reply ends): the time until the
 * next rt_spec_propose is not a pass's. */
void rt_spec_pause(rt_spec *s);

/* The target's sequence now holds only its first n tokens: the draft
 * forgets what lies past them. */
void rt_spec_rewind(rt_spec *s, int32_t n);

/* One line on `out`: guesses, kept, acceptance and tokens per pass. */
void rt_spec_print(const rt_spec *s, FILE *out);

#define RT_SPEC_USAGE                                                                              \
    "speculative decoding (the same text, sooner when the guesses are good):\n"                    \
    "  --draft MODEL         guess with MODEL, a smaller one of the same family and vocabulary\n"  \
    "                        (a GGUF path or a model store name), run greedily\n"                  \
    "  --lookup N            guess what followed the last N .. 2 tokens earlier in the text\n"     \
    "                        (0: off, the default; with --draft, the draft guesses where it\n"     \
    "                        finds nothing)\n"                                                     \
    "  --draft-max K         at most K guesses a pass, 1..64 (default 8)\n"                        \
    "  --draft-min K         feed no fewer than K guesses (default 1)\n"                           \
    "  --draft-p-min P       the draft stops at a token it gives under P probability (default "    \
    "0.5)\n"                                                                                       \
    "  --draft-always        run the draft every pass (default: only while it has paid lately,\n"  \
    "                        measured, and tried again now and then)\n"                            \
    "  --spec-accept RULE    exact (default: the plain run's text) or resample (sampled runs:\n"   \
    "                        the draft samples, guesses kept with probability min(1, p/q))\n"

#endif /* CELLM_RT_H */
