/*
 * chat.h — how a list of chat messages becomes prompt tokens. By default
 * through the model's own Jinja template (GGUF `tokenizer.chat_template`,
 * rendered by src/text/jinja.h as transformers would); else through one of the
 * built-in formats (ChatML, Gemma, Llama 3), used when the caller names one
 * or when the file has no template. Also the end-of-turn tokens that stop a
 * reply. The engine uses it for chat-message requests, `cellm run` for its
 * REPL.
 *
 * A chat_tpl is made once per model and then only read: any number of
 * threads may render with one at once.
 */
#ifndef CELLM_CHAT_H
#define CELLM_CHAT_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "text/tokenizer.h"

typedef enum chat_format { CHAT_JINJA, CHAT_CHATML, CHAT_GEMMA, CHAT_LLAMA3 } chat_format;

typedef struct chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} chat_msg;

#define CHAT_MAX_STOP 8

typedef struct chat_tpl {
    chat_format format;
    char *jinja; /* CHAT_JINJA: the template text (owned), jinja_len bytes */
    size_t jinja_len;
    bool from_model;             /* the template is the model file's own */
    char *bos, *eos;             /* texts of the BOS/EOS tokens (owned), NULL if none */
    int32_t bos_id;              /* prepended to the prompt when the model adds BOS; -1: no */
    char default_system[512];    /* built-in ChatML: used when there is no system message */
    int32_t stop[CHAT_MAX_STOP]; /* end-of-turn token ids besides EOS, -1 padded */
    bool tools_native;           /* the Jinja template renders `tools` itself */
    int tool_fmt;                /* the tool_format (toolcall.h) the model writes calls in */
} chat_tpl;

/* Chooses how model `m` (tokenizer `tok`) lays out chats. `name` is NULL
 * for the model's own template (a built-in format picked by architecture
 * when the file has none), a built-in format's name ("chatml", "gemma",
 * "llama3"), or a Jinja template text (it contains "{{" or "{%"). A
 * template is tried once on a one-message conversation here, so a
 * template that cannot be parsed fails now. On success *t owns memory:
 * free it with chat_tpl_free. Errors: CELLM_ERR_INVALID_ARG (an unknown
 * name, or a given template that fails), CELLM_ERR_UNSUPPORTED (the model
 * has no template cellm can use; the message says why and names
 * --chat-template), CELLM_ERR_NO_MEMORY. */
cellm_status chat_tpl_init(const model *m, const tokenizer *tok, const char *name, chat_tpl *t,
                           cellm_error *err);
void chat_tpl_free(chat_tpl *t);

/* Renders messages (and the assistant's opening when `add_generation`)
 * into a new NUL-terminated string *out the caller frees. Errors: the
 * template's own (see jinja_render; the message names the construct and
 * its byte offset, and the --chat-template fallback), CELLM_ERR_NO_MEMORY. */
cellm_status chat_render(const chat_tpl *t, const chat_msg *msgs, int n, bool add_generation,
                         char **out, cellm_error *err);

/* Renders and tokenizes: appends the prompt's ids to `ids` (special tokens
 * in the text recognised; BOS put first where the model wants it and the
 * text does not already start with it). */
cellm_status chat_encode(const chat_tpl *t, const tokenizer *tok, const chat_msg *msgs, int n,
                         bool add_generation, tok_ids *ids, cellm_error *err);

/* Renders (and tokenizes) a conversation given as JSON: messages_json an
 * array of OpenAI chat messages (with tool_calls and role "tool"),
 * tools_json NULL or an array of OpenAI tools. A template that renders
 * tools gets both as its variables; any other gets the generic rendering
 * of toolcall.h. Errors: CELLM_ERR_INVALID_ARG for malformed JSON (the
 * message names the message or tool), and chat_render's. */
cellm_status chat_render_json(const chat_tpl *t, const char *messages_json, const char *tools_json,
                              bool add_generation, char **out, cellm_error *err);
cellm_status chat_encode_json(const chat_tpl *t, const tokenizer *tok, const char *messages_json,
                              const char *tools_json, bool add_generation, tok_ids *ids,
                              cellm_error *err);

/* A user turn of one picture and `text` (after the system message
 * `system`, or none when NULL), as a vision-language template lays it
 * out: the messages go to the template with list-of-parts content
 * ({"type": "image"}, {"type": "text"}), and the "<image>" the template
 * writes for the picture is replaced by `image_text` (cellm_image_prompt's
 * expansion) before tokenizing. CELLM_ERR_UNSUPPORTED when the template
 * writes no "<image>". */
cellm_status chat_encode_image(const chat_tpl *t, const tokenizer *tok, const char *system,
                               const char *text, const char *image_text, tok_ids *ids,
                               cellm_error *err);

/* Renders and tokenizes a conversation with pictures: each "<image>" in
 * a message's content marks a picture, in order. The messages go to the
 * template with list-of-parts content (text parts between the markers,
 * {"type": "image"} at each), and the k-th "<image>" the template writes
 * is replaced by image_text[k] (cellm_image_prompt's expansion) before
 * tokenizing. CELLM_ERR_INVALID_ARG when the markers or the template's
 * pictures are not n_images; CELLM_ERR_UNSUPPORTED when the template
 * writes none (not a vision model's) or is a built-in format. */
cellm_status chat_encode_images(const chat_tpl *t, const tokenizer *tok, const chat_msg *msgs,
                                int n, bool add_generation, const char *const *image_text,
                                int n_images, tok_ids *ids, cellm_error *err);

/* True for EOS and the end-of-turn tokens. */
bool chat_is_stop(const chat_tpl *t, const tokenizer *tok, int32_t id);

#endif /* CELLM_CHAT_H */
