/*
 * chat.h — the built-in chat formats of the models cellm knows (ChatML,
 * Gemma, Llama 3): which one a model uses (from its template, or its
 * architecture when it has none), rendering a list of messages into prompt
 * text, and the end-of-turn tokens that stop a reply. The engine uses it for
 * chat-message requests; `cellm run` uses it for its REPL.
 *
 * A chat_tpl is plain data, detected once per model and then read by any
 * number of threads.
 */
#ifndef CELLM_CHAT_H
#define CELLM_CHAT_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "tokenizer.h"

typedef enum chat_format { CHAT_CHATML, CHAT_GEMMA, CHAT_LLAMA3 } chat_format;

typedef struct chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} chat_msg;

#define CHAT_MAX_STOP 4

typedef struct chat_tpl {
    chat_format format;
    char default_system[512];    /* used when there is no system message */
    int32_t stop[CHAT_MAX_STOP]; /* end-of-turn token ids besides EOS, -1 padded */
} chat_tpl;

/* The chat format of model `m` with tokenizer `tok` (from its template, or
 * its architecture when it has none); `name` ("chatml", "gemma", "llama3")
 * overrides. CELLM_ERR_UNSUPPORTED for a template cellm does not know. */
cellm_status chat_tpl_detect(const model *m, const tokenizer *tok, const char *name, chat_tpl *t,
                             cellm_error *err);

/* Renders messages (and the assistant's opening when `add_generation`)
 * into a new string the caller frees; NULL when out of memory. */
char *chat_render(const chat_tpl *t, const chat_msg *msgs, int n, bool add_generation);

/* True for EOS and the format's end-of-turn tokens. */
bool chat_is_stop(const chat_tpl *t, const tokenizer *tok, int32_t id);

#endif /* CELLM_CHAT_H */
