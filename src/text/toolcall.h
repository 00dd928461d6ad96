/*
 * toolcall.h — OpenAI-style tool calls (docs/tools.md): the tools and the
 * tool-call turns of a conversation prepared for a chat template, the
 * grammar that forces a valid call in a model family's format, and the
 * parser that finds calls in a model's reply.
 *
 * Tools are OpenAI tool objects, {"type": "function", "function": {"name",
 * "description", "parameters"}}. A template that reads `tools` gets them
 * as they are, with the conversation's messages (assistant `tool_calls`
 * with their arguments as JSON objects, `role: "tool"` results). A
 * template that does not gets the generic rendering instead: a system
 * prompt listing the tools and asking for <tool_call> blocks, the calls
 * written as such blocks, and the results as user turns of
 * <tool_response> blocks.
 *
 * Everything here is pure: no engine, no model, only text in and out.
 */
#ifndef CELLM_TOOLCALL_H
#define CELLM_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/util.h"

#define TOOL_MAX_FUNCTIONS CELLM_MAX_TOOLS /* functions of one request */
#define TOOL_MAX_NAME 64                   /* bytes of a function's name */
#define TOOL_MAX_JSON (4 << 20)            /* bytes of tools or messages JSON */

/* The formats in which model families write calls. */
typedef enum tool_format {
    TOOL_FMT_HERMES,  /* <tool_call>{"name", "arguments"}</tool_call> (Hermes, Qwen 2.5/3) */
    TOOL_FMT_LLAMA3,  /* {"name", "parameters"}, maybe after <|python_tag|> (Llama 3.x) */
    TOOL_FMT_MISTRAL, /* [TOOL_CALLS][{"name", "arguments"}, ...] (Mistral) */
    TOOL_FMT_JSON,    /* a bare {"name", "arguments"} or an array of them */
} tool_format;

/* The format a chat template's model writes calls in, from the template's
 * text (NULL: a built-in format). *native: the template renders `tools`
 * itself; when not, the generic rendering is used and its format is
 * Hermes's. */
tool_format tool_format_of_template(const char *tpl, bool *native);

/* One message of a prepared conversation (owned strings). */
typedef struct tool_msg {
    char *role;
    char *content;
} tool_msg;

/* A conversation prepared for the template: `vars_json` for a template
 * that renders tools itself ({"messages": [...], "tools": [...]}, the
 * Jinja variables), else plain messages in the generic rendering. */
typedef struct tool_chat {
    char *vars_json; /* NULL when msgs is used */
    size_t vars_len;
    tool_msg *msgs;
    int n_msgs;
} tool_chat;

/* Prepares messages_json (an array of OpenAI chat messages: role,
 * content as a string or null, tool_calls, tool_call_id, name) and
 * tools_json (NULL or an array of tool objects). With short_ids (for
 * Mistral's templates, which refuse any other), the template gets every
 * tool call id as 9 letters and digits: an id that is so already stays,
 * others map to one made from their hash, the same for a call and its
 * result. CELLM_ERR_INVALID_ARG naming the message or tool that is
 * malformed. Free with tool_chat_free. */
cellm_status tool_chat_prepare(const char *messages_json, const char *tools_json, bool native,
                               bool short_ids, tool_chat *out, cellm_error *err);
void tool_chat_free(tool_chat *c);

/* The GBNF of a reply that is only tool calls in format `fmt`: calls of
 * the function `only` (NULL: any of tools_json's), each call's arguments
 * valid for the function's `parameters` schema; one call, or with
 * `parallel` one or more. *out is malloc'd. CELLM_ERR_INVALID_ARG for
 * malformed tools (naming the tool), an unknown `only`, a schema the
 * compiler refuses (its message). */
cellm_status tool_grammar_gbnf(const char *tools_json, const char *only, tool_format fmt,
                               bool parallel, char **out, size_t *out_len, cellm_error *err);

/* Finds the tool calls in a model's reply text[0..len), in any of the
 * formats above. *out gets a malloc'd JSON object {"content": text or
 * null, "tool_calls": [{"name": ..., "arguments": JSON text}, ...]}: the
 * calls, and the text outside them. A reply that holds no call, a
 * malformed one, or (when tools_json is given) a call of a function not
 * among its tools, has no calls and all its text as content. */
cellm_status tool_calls_parse(const char *text, size_t len, const char *tools_json, char **out,
                              cellm_error *err);

#endif /* CELLM_TOOLCALL_H */
