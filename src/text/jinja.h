/*
 * jinja.h — renders a model's chat template (GGUF `tokenizer.chat_template`)
 * into the prompt text the tokenizer then encodes.
 *
 * Chat templates are Jinja2 programs run by Hugging Face transformers in a
 * sandboxed environment with trim_blocks and lstrip_blocks on, the loop
 * controls extension, a JSON `tojson` filter (ensure_ascii off, keys in
 * insertion order) and the globals raise_exception() and strftime_now().
 * This interpreter covers the subset real templates use and renders it the
 * same way, byte for byte: statements for/if/set (with namespace())/macro/
 * filter/break/continue/raw/generation, the expression language with
 * Python's value semantics, the common filters and tests, and the string
 * and dict methods templates call. docs/templates.md lists what is in.
 *
 * A template is untrusted input. Anything it cannot render (a syntax error,
 * a construct outside the subset, a type error at run time, a call to
 * raise_exception) is an error whose message names the construct and the
 * byte offset in the template. Nesting, loop iterations, evaluation steps,
 * memory and output are bounded by jinja_limits, so no template can crash
 * the process, recurse without bound or allocate without bound.
 *
 * jinja_render is reentrant: it keeps no global state.
 */
#ifndef CELLM_JINJA_H
#define CELLM_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

/* One chat message. Strings are NUL-terminated UTF-8; content may be NULL
 * (then the message has no `content`, as transformers drops None values). */
typedef struct jinja_message {
    const char *role;
    const char *content;
} jinja_message;

/* Bounds on one render; a zero field takes the default in brackets. */
typedef struct jinja_limits {
    size_t max_output;  /* bytes of rendered text [4 MiB] */
    size_t max_memory;  /* bytes of working memory (values, parse tree) [64 MiB] */
    uint64_t max_steps; /* expressions evaluated plus loop iterations [10 million] */
    int max_depth;      /* nesting of the template's syntax and of data [128] */
    int max_calls;      /* nesting of macro calls [32] */
} jinja_limits;

/* What the template sees, prepared as transformers' apply_chat_template
 * prepares it: `tools` and `documents` are none unless set; a message's keys
 * whose value is null are dropped; a message's reasoning (the first of
 * `reasoning_content`, `thinking`, `reasoning` that is set) shows under both
 * `reasoning_content` and `thinking`. Other variables the template reads and
 * nobody set are undefined, as in Jinja2 (they print as nothing, test false
 * and fail when used). */
typedef struct jinja_ctx {
    const jinja_message *messages; /* `messages`, a list of {role, content} */
    size_t n_messages;
    bool add_generation_prompt;
    const char *bos_token; /* NULL: undefined */
    const char *eos_token; /* NULL: undefined */
    /* Optional JSON object (UTF-8, vars_json_len bytes) whose members become
     * variables, replacing the ones above: how callers pass `tools`,
     * `documents`, messages with `tool_calls` or list-of-parts content, and
     * template switches such as `enable_thinking`. NULL: none. */
    const char *vars_json;
    size_t vars_json_len;
    jinja_limits limits;
} jinja_ctx;

/* Renders template tpl[0..len) with ctx. On success *out is a NUL-terminated
 * malloc'd string of *out_len bytes that the caller frees with free(). On
 * failure *out is NULL and err says why and where:
 *   CELLM_ERR_FORMAT       a syntax or run-time error in the template, or
 *                          malformed vars_json
 *   CELLM_ERR_UNSUPPORTED  a tag, filter, test or method this subset lacks
 *   CELLM_ERR_INVALID_ARG  the template called raise_exception(msg) (msg is
 *                          in the message: the conversation broke a rule of
 *                          the template), or a NULL argument
 *   CELLM_ERR_NO_MEMORY    a limit was reached or an allocation failed */
cellm_status jinja_render(const char *tpl, size_t len, const jinja_ctx *ctx, char **out,
                          size_t *out_len, cellm_error *err);

#endif /* CELLM_JINJA_H */
