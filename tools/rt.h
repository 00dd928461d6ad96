/*
 * rt.h — what the generating commands (run, perplexity) share until the
 * engine API exists: a model with its tokenizer, KV cache, thread pool and
 * forward context, opened from a path or store name; one sequence helper
 * that feeds tokens in chunks; and the built-in chat formats of the models
 * cellm knows.
 */
#ifndef CELLM_RT_H
#define CELLM_RT_H

#include <stdbool.h>
#include <stdint.h>

#include "forward.h"
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
    int32_t logit_rows; /* rows that may want logits in one call */
} rt_opts;

/* Resolves `name_or_path` (fetching a known model if needed) and opens it. */
cellm_status rt_open(const char *name_or_path, const rt_opts *o, rt *r, cellm_error *err);
void rt_close(rt *r);

/* Feeds tok[0..n) to `s`; if `logits` is not NULL, copies the last token's
 * logits there (n_vocab floats). */
cellm_status rt_feed(rt *r, kv_seq *s, const int32_t *tok, int32_t n, float *logits,
                     cellm_error *err);

/* ---- chat formats ---- */

typedef enum chat_format { CHAT_CHATML, CHAT_GEMMA, CHAT_LLAMA3 } chat_format;

typedef struct chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} chat_msg;

typedef struct chat_tpl {
    chat_format format;
    char default_system[512]; /* used when there is no system message */
    int32_t stop[4];          /* end-of-turn token ids besides EOS, -1 padded */
} chat_tpl;

/* The chat format of the model (from its template, or its architecture
 * when it has none); `name` ("chatml", "gemma", "llama3") overrides. */
cellm_status chat_tpl_detect(const rt *r, const char *name, chat_tpl *t, cellm_error *err);

/* Renders messages (and the assistant's opening when `add_generation`)
 * into a new string the caller frees. */
char *chat_render(const chat_tpl *t, const chat_msg *msgs, int n, bool add_generation);

/* True for EOS and the format's end-of-turn tokens. */
bool chat_is_stop(const chat_tpl *t, const rt *r, int32_t tok);

#endif /* CELLM_RT_H */
