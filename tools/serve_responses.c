/*
 * serve_responses.c — OpenAI's Responses API, POST /v1/responses, on the
 * chat machinery. The body (`input` as a string or a list of message,
 * function_call and function_call_output items, `instructions`,
 * `max_output_tokens`, `text.format`, function `tools`, `tool_choice`,
 * sampling options) is checked here and rewritten as a chat completions
 * body, which serve_req.c then parses like any other, so sampling,
 * structured output and tool calls behave exactly as on
 * /v1/chat/completions. The job (serve_job.c) runs it, and this file's
 * serve_api shapes the reply: the response object whole (a message item,
 * and function_call items for the calls serve_tool_calls finds), or
 * streamed as typed server-sent events (response.created,
 * response.output_text.delta, response.function_call_arguments.delta,
 * ..., response.completed), each with its sequence_number. The endpoint itself (oai_responses,
 * serve_oai.c) only hands the parsed request to a job: nothing here needs the engine or HTTP, so
 * the fuzz target (fuzz/fuzz_serve_req.c) drives it alone.
 *
 * cellm stores no responses: options that would change what a response
 * means and that it cannot honour (previous_response_id, conversation,
 * background, built-in tools, prompt templates, logprobs) are refused with a 400
 * that says so; options that change nothing here (store, include,
 * reasoning, service_tier, ...) are accepted and ignored (docs/serve.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "serve.h"
#include "serve_json.h"

/* One response being made: what the response object repeats of the
 * request, and while streaming, the text so far and the next event's
 * sequence number. */
typedef struct resp_state {
    char id[40];     /* resp_... */
    char msg_id[40]; /* msg_...: the one output item */
    char model[256];
    long created;
    uint64_t n;       /* the random number of the ids; seeds the call ids */
    cJSON *echo;      /* instructions, max_output_tokens, temperature, text, tools, ... */
    char *tools_json; /* chat's tools when the model may call them (tool_choice not none) */
    bool opened;      /* stream: the opening events are sent */
    bool msg_open;    /* stream: the message item is open (it is output 0) */
    long seq;         /* stream: the next sequence_number */
    char *text;       /* stream: the text so far */
    size_t len, cap;
    size_t sent; /* stream: bytes of text sent as output_text deltas */
} resp_state;

/* ------------------------------------------------------------ the request */

/* A message item's content as chat's: a string, or its input_text and
 * output_text parts as chat's text parts (joined by serve_req.c). */
static cJSON *chat_content(const cJSON *c, int i, serve_err *e) {
    char param[64];
    snprintf(param, sizeof param, "input[%d].content", i);
    if (!c) {
        serr(e, 400, "missing_required_parameter", param, "'%s' is missing", param);
        return NULL;
    }
    if (cJSON_IsString(c)) return cJSON_CreateString(c->valuestring);
    if (!cJSON_IsArray(c)) {
        serr(e, 400, "invalid_type", param, "'%s' must be a string or an array of content parts",
             param);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    const cJSON *p;
    int k = 0;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = serve_field(p, "type"), *text = serve_field(p, "text");
        bool is_text = cJSON_IsString(type) && (!strcmp(type->valuestring, "input_text") ||
                                                !strcmp(type->valuestring, "output_text"));
        if (!cJSON_IsObject(p) || !is_text || !cJSON_IsString(text)) {
            snprintf(param, sizeof param, "input[%d].content[%d]", i, k);
            serr(e, 400, "invalid_value", param,
                 "'%s' must be {\"type\": \"input_text\" or \"output_text\", \"text\": string}%s",
                 param,
                 cJSON_IsString(type) && !is_text ? "; cellm reads text only, no images or files"
                                                  : "");
            cJSON_Delete(parts);
            return NULL;
        }
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "type", "text");
        cJSON_AddStringToObject(q, "text", text->valuestring);
        cJSON_AddItemToArray(parts, q);
        k++;
    }
    return parts;
}

/* Adds {"role", "content"} to chat's messages. */
static void add_message(cJSON *msgs, const char *role, cJSON *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddItemToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* Item i's string field `name` (required), or NULL with *e set. */
static const char *item_string(const cJSON *it, int i, const char *name, serve_err *e) {
    const cJSON *v = serve_field(it, name);
    if (cJSON_IsString(v)) return v->valuestring;
    char param[64];
    snprintf(param, sizeof param, "input[%d].%s", i, name);
    serr(e, 400, v ? "invalid_type" : "missing_required_parameter", param, "'%s' must be a string",
         param);
    return NULL;
}

/* A function_call item as a call of chat's assistant turn (joined to the
 * assistant message before it, as a reply's message and calls were one
 * turn), or a function_call_output item as chat's tool message. */
static bool tool_item(const cJSON *it, int i, cJSON *msgs, serve_err *e) {
    const char *call_id = item_string(it, i, "call_id", e);
    if (!call_id) return false;
    if (!strcmp(serve_field(it, "type")->valuestring, "function_call_output")) {
        const char *out = item_string(it, i, "output", e);
        if (!out) return false;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", call_id);
        cJSON_AddStringToObject(m, "content", out);
        cJSON_AddItemToArray(msgs, m);
        return true;
    }
    const char *name = item_string(it, i, "name", e);
    const char *args = name ? item_string(it, i, "arguments", e) : NULL;
    if (!args) return false;
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *role = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant")) {
        last = cJSON_CreateObject();
        cJSON_AddStringToObject(last, "role", "assistant");
        cJSON_AddNullToObject(last, "content");
        cJSON_AddItemToArray(msgs, last);
    }
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (!calls) calls = cJSON_AddArrayToObject(last, "tool_calls");
    cJSON *c = cJSON_CreateObject(), *f;
    cJSON_AddStringToObject(c, "id", call_id);
    cJSON_AddStringToObject(c, "type", "function");
    f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddItemToArray(calls, c);
    return true;
}

/* `tools` (Responses' flat function tools), `tool_choice` and
 * `parallel_tool_calls` as chat's, and as the response repeats them. */
static bool tools_to_chat(const cJSON *root, cJSON *chat, cJSON *echo, serve_err *e) {
    const cJSON *tools = serve_field(root, "tools"), *t;
    if (tools && !cJSON_IsArray(tools))
        return serr(e, 400, "invalid_type", "tools", "'tools' must be an array of tool objects");
    cJSON *ct = cJSON_AddArrayToObject(chat, "tools"), *et = cJSON_AddArrayToObject(echo, "tools");
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        char param[48];
        snprintf(param, sizeof param, "tools[%d]", i);
        const cJSON *type = cJSON_IsObject(t) ? serve_field(t, "type") : NULL;
        if (!cJSON_IsString(type))
            return serr(e, 400, "invalid_value", param,
                        "'%s' must be an object with a string 'type'", param);
        if (strcmp(type->valuestring, "function"))
            return serr(e, 400, "unsupported_value", param,
                        "'%s' is a '%s' tool; cellm calls only function tools (no built-in "
                        "tools such as web_search or file_search)",
                        param, type->valuestring);
        const cJSON *name = serve_field(t, "name"), *desc = serve_field(t, "description"),
                    *params = serve_field(t, "parameters"), *strict = serve_field(t, "strict");
        const char *bad = !cJSON_IsString(name) || !name->valuestring[0] ? "name"
                          : desc && !cJSON_IsString(desc)                ? "description"
                          : params && !cJSON_IsObject(params)            ? "parameters"
                          : strict && !cJSON_IsBool(strict)              ? "strict"
                                                                         : NULL;
        if (bad) {
            snprintf(param, sizeof param, "tools[%d].%s", i, bad);
            return serr(
                e, 400, name || strcmp(bad, "name") ? "invalid_type" : "missing_required_parameter",
                param, "'%s' must be %s%s", param,
                !strcmp(bad, "name")         ? "a non-empty string"
                : !strcmp(bad, "strict")     ? "a boolean"
                : !strcmp(bad, "parameters") ? "a JSON Schema object"
                                             : "a string",
                serve_field(t, "function") ? " (Responses tools are flat: {\"type\": \"function\", "
                                             "\"name\", \"parameters\"}, not chat's {\"function\": "
                                             "{...}})"
                                           : "");
        }
        cJSON *c = cJSON_CreateObject(), *f, *o = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(o, "name", name->valuestring);
        if (desc) cJSON_AddStringToObject(f, "description", desc->valuestring);
        cJSON_AddItemToObject(o, "description",
                              desc ? cJSON_CreateString(desc->valuestring) : cJSON_CreateNull());
        if (params) cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(params, true));
        cJSON_AddItemToObject(o, "parameters",
                              params ? cJSON_Duplicate(params, true) : cJSON_CreateNull());
        if (strict) cJSON_AddBoolToObject(f, "strict", cJSON_IsTrue(strict));
        cJSON_AddItemToObject(o, "strict",
                              strict ? cJSON_CreateBool(cJSON_IsTrue(strict)) : cJSON_CreateNull());
        cJSON_AddItemToArray(ct, c);
        cJSON_AddItemToArray(et, o);
        i++;
    }
    const cJSON *tc = serve_field(root, "tool_choice");
    if (cJSON_IsString(tc)) {
        cJSON_AddStringToObject(chat, "tool_choice", tc->valuestring); /* chat checks it */
        cJSON_AddStringToObject(echo, "tool_choice", tc->valuestring);
    } else if (tc) {
        const cJSON *type = cJSON_IsObject(tc) ? serve_field(tc, "type") : NULL,
                    *name = serve_field(tc, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
            return serr(e, 400, "invalid_value", "tool_choice",
                        "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                        "\"name\": string}; cellm calls only function tools");
        cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
        c = cJSON_AddObjectToObject(echo, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(c, "name", name->valuestring);
    } else {
        cJSON_AddStringToObject(echo, "tool_choice", "auto");
    }
    const cJSON *par = serve_field(root, "parallel_tool_calls");
    if (par) cJSON_AddItemToObject(chat, "parallel_tool_calls", cJSON_Duplicate(par, true));
    cJSON_AddBoolToObject(echo, "parallel_tool_calls", !par || cJSON_IsTrue(par));
    return true;
}

/* `input` (a string, or a list of items) into chat's messages. */
static bool input_messages(const cJSON *input, cJSON *msgs, serve_err *e) {
    if (!input) return serr(e, 400, "missing_required_parameter", "input", "'input' is missing");
    if (cJSON_IsString(input)) {
        add_message(msgs, "user", cJSON_CreateString(input->valuestring));
        return true;
    }
    if (!cJSON_IsArray(input))
        return serr(e, 400, "invalid_type", "input",
                    "'input' must be a string or an array of message items");
    if (!cJSON_GetArraySize(input))
        return serr(e, 400, "invalid_value", "input", "'input' must not be empty");
    static const char *const roles[] = {"user", "assistant", "system", "developer"};
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, input) {
        char param[64];
        snprintf(param, sizeof param, "input[%d]", i);
        if (!cJSON_IsObject(it))
            return serr(e, 400, "invalid_type", param, "'%s' must be an object (a message item)",
                        param);
        const cJSON *type = serve_field(it, "type"), *role = serve_field(it, "role");
        if (type && !cJSON_IsString(type))
            return serr(e, 400, "invalid_type", param, "'%s.type' must be a string", param);
        if (type && (!strcmp(type->valuestring, "function_call") ||
                     !strcmp(type->valuestring, "function_call_output"))) {
            if (!tool_item(it, i, msgs, e)) return false;
            i++;
            continue;
        }
        if (type && strcmp(type->valuestring, "message"))
            return serr(e, 400, "invalid_value", param,
                        "'%s' is an item of type '%s'; cellm's /v1/responses takes message, "
                        "function_call and function_call_output items (no reasoning or item "
                        "references)",
                        param, type->valuestring);
        const char *rl = NULL;
        for (size_t k = 0; cJSON_IsString(role) && k < sizeof roles / sizeof *roles; k++)
            if (!strcmp(role->valuestring, roles[k])) rl = roles[k];
        if (!rl) {
            snprintf(param, sizeof param, "input[%d].role", i);
            return serr(e, 400, role ? "invalid_value" : "missing_required_parameter", param,
                        "'%s' must be user, assistant, system or developer", param);
        }
        cJSON *content = chat_content(serve_field(it, "content"), i, e);
        if (!content) return false;
        add_message(msgs, rl, content);
        i++;
    }
    return true;
}

/* `text.format` as chat's response_format (also kept for the echo). */
static bool text_format(const cJSON *text, cJSON *chat, cJSON *echo, serve_err *e) {
    const cJSON *f = text ? serve_field(text, "format") : NULL;
    if (text && !cJSON_IsObject(text))
        return serr(e, 400, "invalid_type", "text", "'text' must be an object");
    cJSON *out = cJSON_AddObjectToObject(echo, "text");
    if (!f) {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(out, "format"), "type", "text");
        return true;
    }
    const cJSON *type = cJSON_IsObject(f) ? serve_field(f, "type") : NULL;
    if (!cJSON_IsString(type))
        return serr(e, 400, "invalid_type", "text.format",
                    "'text.format' must be an object with a string 'type'");
    const char *t = type->valuestring;
    cJSON *rf = cJSON_CreateObject();
    cJSON_AddStringToObject(rf, "type", t);
    cJSON_AddItemToObject(chat, "response_format", rf);
    cJSON_AddItemToObject(out, "format", cJSON_Duplicate(f, true));
    if (!strcmp(t, "text") || !strcmp(t, "json_object")) return true;
    if (strcmp(t, "json_schema"))
        return serr(e, 400, "invalid_value", "text.format.type",
                    "'text.format.type' must be text, json_object or json_schema, not '%s'", t);
    const cJSON *name = serve_field(f, "name"), *schema = serve_field(f, "schema"),
                *strict = serve_field(f, "strict");
    if (name && !cJSON_IsString(name))
        return serr(e, 400, "invalid_type", "text.format.name",
                    "'text.format.name' must be a string");
    if (!cJSON_IsObject(schema))
        return serr(e, 400, schema ? "invalid_type" : "missing_required_parameter",
                    "text.format.schema", "'text.format.schema' must be a JSON Schema object");
    if (strict && !cJSON_IsBool(strict))
        return serr(e, 400, "invalid_type", "text.format.strict",
                    "'text.format.strict' must be a boolean");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", name ? name->valuestring : "response");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(schema, true));
    cJSON_AddBoolToObject(js, "strict", strict && cJSON_IsTrue(strict));
    return true;
}

/* Refuses what cellm cannot honour and would change the response's
 * meaning; the rest of the Responses API's options are ignored. */
static bool refuse_unsupported(const cJSON *root, serve_err *e) {
    static const char *const stored[] = {"previous_response_id", "conversation", "prompt"};
    for (size_t k = 0; k < sizeof stored / sizeof *stored; k++)
        if (serve_field(root, stored[k]))
            return serr(e, 400, "unsupported_parameter", stored[k],
                        "cellm stores no responses, conversations or prompts: '%s' cannot be "
                        "used; send the whole conversation in 'input'",
                        stored[k]);
    const cJSON *v = serve_field(root, "background");
    if (v && !cJSON_IsFalse(v))
        return serr(e, 400, "unsupported_parameter", "background",
                    "cellm does not run responses in the background");
    v = serve_field(root, "top_logprobs");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return serr(e, 400, "unsupported_parameter", "top_logprobs",
                    "cellm's /v1/responses has no log-probabilities yet (chat completions has)");
    v = serve_field(root, "truncation");
    if (v && !(cJSON_IsString(v) && !strcmp(v->valuestring, "disabled")))
        return serr(e, 400, "unsupported_parameter", "truncation",
                    "'truncation' can only be \"disabled\": cellm never drops input; an input "
                    "longer than the context is refused");
    v = serve_field(root, "metadata");
    if (v && !cJSON_IsObject(v))
        return serr(e, 400, "invalid_type", "metadata", "'metadata' must be an object");
    const cJSON *kv;
    if (v) cJSON_ArrayForEach(kv, v) {
            if (!cJSON_IsString(kv))
                return serr(e, 400, "invalid_type", "metadata",
                            "the values of 'metadata' must be strings");
        }
    v = serve_field(root, "store");
    if (v && !cJSON_IsBool(v))
        return serr(e, 400, "invalid_type", "store", "'store' must be a boolean");
    return true;
}

/* Copies root's field `name` to `dst` when it is there (checked later). */
static void copy_field(const cJSON *root, const char *name, cJSON *dst, const char *as) {
    const cJSON *v = serve_field(root, name);
    if (v) cJSON_AddItemToObject(dst, as ? as : name, cJSON_Duplicate(v, true));
}

/* The Responses body `root` as a chat completions body *chat (a new
 * cJSON object), with what the response repeats in *echo. */
static bool to_chat(const cJSON *root, const serve_limits *lim, cJSON *chat, cJSON *echo,
                    serve_err *e) {
    if (!refuse_unsupported(root, e)) return false;
    const cJSON *instr = serve_field(root, "instructions");
    if (instr && !cJSON_IsString(instr))
        return serr(e, 400, "invalid_type", "instructions", "'instructions' must be a string");
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    if (instr) add_message(msgs, "system", cJSON_CreateString(instr->valuestring));
    if (!input_messages(serve_field(root, "input"), msgs, e)) return false;
    const cJSON *mt = serve_field(root, "max_output_tokens");
    if (mt && !(cJSON_IsNumber(mt) && mt->valuedouble >= 1 && mt->valuedouble <= lim->n_ctx &&
                mt->valuedouble == floor(mt->valuedouble)))
        return serr(e, 400, "invalid_value", "max_output_tokens",
                    "'max_output_tokens' must be an integer from 1 to %d (the context)",
                    lim->n_ctx);
    copy_field(root, "max_output_tokens", chat, "max_completion_tokens");
    static const char *const same[] = {"model", "temperature", "top_p", "seed", "stream", "user"};
    for (size_t k = 0; k < sizeof same / sizeof *same; k++) copy_field(root, same[k], chat, NULL);
    if (!text_format(serve_field(root, "text"), chat, echo, e)) return false;
    if (!tools_to_chat(root, chat, echo, e)) return false;

    /* What the response object repeats (sampling values once parsed). */
    if (instr)
        cJSON_AddStringToObject(echo, "instructions", instr->valuestring);
    else
        cJSON_AddNullToObject(echo, "instructions");
    if (mt)
        cJSON_AddNumberToObject(echo, "max_output_tokens", mt->valuedouble);
    else
        cJSON_AddNullToObject(echo, "max_output_tokens");
    const cJSON *md = serve_field(root, "metadata");
    cJSON_AddItemToObject(echo, "metadata", md ? cJSON_Duplicate(md, true) : cJSON_CreateObject());
    copy_field(root, "user", echo, NULL);
    return true;
}

void responses_err_param(serve_err *e) {
    if (!strncmp(e->param, "messages", 8))
        snprintf(e->param, sizeof e->param, "input");
    else if (!strcmp(e->param, "response_format"))
        snprintf(e->param, sizeof e->param, "text.format");
}

static void state_free(void *ctx) {
    resp_state *x = ctx;
    if (!x) return;
    cJSON_Delete(x->echo);
    free(x->tools_json);
    free(x->text);
    free(x);
}

static void *resp_whole(void *ctx, const serve_out *o);
static char *resp_stream(void *ctx, const serve_out *o);
static const serve_api responses_api = {resp_whole, resp_stream, state_free};

bool responses_parse(const char *body, size_t len, const serve_limits *lim, const char *model_id,
                     uint64_t id, serve_req *r, serve_err *e) {
    memset(r, 0, sizeof *r);
    if (!len || memchr(body, '\0', len) || !serve_utf8_valid(body, len))
        return serr(e, 400, "invalid_json", NULL, "the request body must be a UTF-8 JSON object");
    size_t at = 0;
    cJSON *root = serve_json_parse(body, len, &at);
    if (!root)
        return serr(e, 400, "invalid_json", NULL,
                    "the request body is not valid JSON (error near byte %zu)", at);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return serr(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
    }
    resp_state *x = calloc(1, sizeof *x);
    cJSON *chat = cJSON_CreateObject(), *echo = cJSON_CreateObject();
    bool ok = x && chat && echo && to_chat(root, lim, chat, echo, e);
    if (!ok && (!x || !chat || !echo)) serr(e, 500, NULL, NULL, "out of memory");
    cJSON_Delete(root);
    char *text = ok ? cJSON_PrintUnformatted(chat) : NULL;
    cJSON_Delete(chat);
    if (ok && !text) ok = serr(e, 500, NULL, NULL, "out of memory");
    ok = ok && serve_req_parse(text, strlen(text), SERVE_CHAT, lim, r, e);
    cJSON_free(text);
    if (!ok) {
        cJSON_Delete(echo);
        free(x);
        responses_err_param(e);
        return false;
    }
    /* The sampling values the request got, defaults included (floats:
     * rounded, so that 0.7 reads 0.7 and not 0.699999988). */
    cJSON_AddNumberToObject(echo, "temperature", round(r->temperature * 1e6) / 1e6);
    cJSON_AddNumberToObject(echo, "top_p", round(r->top_p * 1e6) / 1e6);
    snprintf(x->id, sizeof x->id, "resp_%016llx", (unsigned long long)id);
    snprintf(x->msg_id, sizeof x->msg_id, "msg_%016llx", (unsigned long long)id);
    snprintf(x->model, sizeof x->model, "%s", model_id);
    x->created = (long)time(NULL);
    x->n = id;
    if (r->tools_json && r->tool_choice != SERVE_TOOLS_NONE &&
        !(x->tools_json = strdup(r->tools_json))) {
        cJSON_Delete(echo);
        free(x);
        serve_req_free(r);
        return serr(e, 500, NULL, NULL, "out of memory");
    }
    x->echo = echo;
    r->api = &responses_api;
    r->api_ctx = x;
    return true;
}

/* ------------------------------------------------------------ the reply */

/* {"type": "output_text", "text", "annotations": [], "logprobs": []} */
static cJSON *text_part(const char *text, size_t len) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    serve_json_add_text(p, "text", text, len);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

/* The output message item; its content is one text part (text[0..len),
 * text may be NULL when len is 0), or none yet (!part). */
static cJSON *message_item(const resp_state *x, const char *status, bool part, const char *text,
                           size_t len) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", x->msg_id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "status", status);
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *c = cJSON_AddArrayToObject(m, "content");
    if (part) cJSON_AddItemToArray(c, text_part(text, len));
    return m;
}

/* A function_call item of one of chat's tool calls (serve_tool_calls):
 * its arguments, or "" while they stream (!args). Its id is fc_ and the
 * call id's digits. */
static cJSON *call_item(const cJSON *call, const char *status, bool args) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
    const char *call_id = cJSON_GetObjectItemCaseSensitive(call, "id")->valuestring;
    char id[48];
    snprintf(id, sizeof id, "fc_%s", call_id + strcspn(call_id, "_") + 1);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "function_call");
    cJSON_AddStringToObject(m, "status", status);
    cJSON_AddStringToObject(
        m, "arguments", args ? cJSON_GetObjectItemCaseSensitive(f, "arguments")->valuestring : "");
    cJSON_AddStringToObject(m, "call_id", call_id);
    cJSON_AddStringToObject(m, "name", cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring);
    return m;
}

/* The tool calls in a finished reply text[0..len) (chat's tool_calls, a
 * cJSON array), or NULL when tools cannot be called or it holds none;
 * *content gets the text outside them (or NULL). */
static cJSON *reply_calls(const resp_state *x, const char *text, size_t len, char **content) {
    *content = NULL;
    return x->tools_json ? serve_tool_calls(text ? text : "", len, x->tools_json, x->n, content)
                         : NULL;
}

/* True when s[0..n) is only white space. */
static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return false;
    return true;
}

/* "completed", or "incomplete" when the output was cut at its limit. */
static const char *final_status(const serve_out *o) {
    return o->res.finish_reason == CELLM_FINISH_STOP ? "completed" : "incomplete";
}

/* The response object, its output the items `output` (a cJSON array it
 * takes; NULL: none). `o` NULL: in progress (no usage); with o->err:
 * failed. */
static cJSON *response_json(const resp_state *x, const serve_out *o, cJSON *output) {
    const char *status = !o ? "in_progress" : o->err ? "failed" : final_status(o);
    bool ended = o && !o->err;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", x->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)x->created);
    cJSON_AddStringToObject(r, "status", status);
    cJSON_AddFalseToObject(r, "background");
    if (o && o->err) {
        cJSON *err = cJSON_AddObjectToObject(r, "error");
        cJSON_AddStringToObject(err, "code", o->err->code ? o->err->code : "server_error");
        cJSON_AddStringToObject(err, "message", o->err->msg);
    } else {
        cJSON_AddNullToObject(r, "error");
    }
    if (ended && !strcmp(status, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "incomplete_details"), "reason",
                                "max_output_tokens");
    else
        cJSON_AddNullToObject(r, "incomplete_details");
    cJSON_AddStringToObject(r, "model", x->model);
    cJSON_AddItemToObject(r, "output", output ? output : cJSON_CreateArray());
    cJSON_AddNullToObject(r, "previous_response_id");
    cJSON *reasoning = cJSON_AddObjectToObject(r, "reasoning");
    cJSON_AddNullToObject(reasoning, "effort");
    cJSON_AddNullToObject(reasoning, "summary");
    cJSON_AddFalseToObject(r, "store"); /* nothing is kept */
    cJSON_AddNumberToObject(r, "top_logprobs", 0);
    cJSON_AddStringToObject(r, "truncation", "disabled");
    const cJSON *v;
    cJSON_ArrayForEach(v, x->echo) cJSON_AddItemToObject(r, v->string, cJSON_Duplicate(v, true));
    if (!cJSON_GetObjectItemCaseSensitive(r, "user")) cJSON_AddNullToObject(r, "user");
    if (!ended) {
        cJSON_AddNullToObject(r, "usage");
        return r;
    }
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", o->res.n_prompt_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                            o->res.n_cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", o->res.n_completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens",
                            0);
    cJSON_AddNumberToObject(u, "total_tokens",
                            (double)o->res.n_prompt_tokens + o->res.n_completion_tokens);
    return r;
}

/* The whole reply: a message of the text, or with tool calls, a message
 * of the text outside them (none when blank) and a function_call item
 * per call. */
static void *resp_whole(void *ctx, const serve_out *o) {
    resp_state *x = ctx;
    const char *status = final_status(o);
    cJSON *out = cJSON_CreateArray(), *call;
    char *content = NULL;
    cJSON *calls = reply_calls(x, o->text, o->len, &content);
    if (!calls)
        cJSON_AddItemToArray(out, message_item(x, status, true, o->text, o->len));
    else if (content && !blank(content, strlen(content)))
        cJSON_AddItemToArray(out, message_item(x, "completed", true, content, strlen(content)));
    cJSON_ArrayForEach(call, calls) cJSON_AddItemToArray(out, call_item(call, "completed", true));
    cJSON_Delete(calls);
    free(content);
    return response_json(x, o, out);
}

/* A stream's text, growing: events for one call of resp_stream. */
typedef struct sse_buf {
    char *p;
    size_t len, cap;
    bool oom;
} sse_buf;

static void buf_put(sse_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (!serve_grow(&b->p, &b->cap, b->len + n + 1)) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* A new event object {"type", "sequence_number"}. */
static cJSON *event_new(resp_state *x, const char *type) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddNumberToObject(ev, "sequence_number", (double)x->seq++);
    return ev;
}

/* The events of an output item's parts: item_id and output_index, and
 * with content_index >= 0, content_index. */
static cJSON *item_event(resp_state *x, const char *type, const char *item_id, int output_index,
                         int content_index) {
    cJSON *ev = event_new(x, type);
    cJSON_AddStringToObject(ev, "item_id", item_id);
    cJSON_AddNumberToObject(ev, "output_index", output_index);
    if (content_index >= 0) cJSON_AddNumberToObject(ev, "content_index", content_index);
    return ev;
}

/* The message's text part events: output 0, part 0. */
static cJSON *part_event(resp_state *x, const char *type) {
    return item_event(x, type, x->msg_id, 0, 0);
}

/* Appends "event: TYPE\ndata: JSON\n\n" and frees ev. */
static void event_put(sse_buf *b, cJSON *ev) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
    char *t = cJSON_PrintUnformatted(ev);
    if (!t || !cJSON_IsString(type)) {
        b->oom = true;
    } else {
        buf_put(b, "event: ", 7);
        buf_put(b, type->valuestring, strlen(type->valuestring));
        buf_put(b, "\ndata: ", 7);
        buf_put(b, t, strlen(t));
        buf_put(b, "\n\n", 2);
    }
    cJSON_free(t);
    cJSON_Delete(ev);
}

/* An event carrying the response object (output: as response_json). */
static void response_event(sse_buf *b, resp_state *x, const char *type, const serve_out *o,
                           cJSON *output) {
    cJSON *ev = event_new(x, type);
    cJSON_AddItemToObject(ev, "response", response_json(x, o, output));
    event_put(b, ev);
}

/* output_item.added or .done: `item` (which it takes) at output_index. */
static void item_put(sse_buf *b, resp_state *x, const char *type, int output_index, cJSON *item) {
    cJSON *ev = event_new(x, type);
    cJSON_AddNumberToObject(ev, "output_index", output_index);
    cJSON_AddItemToObject(ev, "item", item);
    event_put(b, ev);
}

/* Opens the message item (output 0) and its text part. */
static void message_open(sse_buf *b, resp_state *x) {
    x->msg_open = true;
    item_put(b, x, "response.output_item.added", 0, message_item(x, "in_progress", false, NULL, 0));
    cJSON *ev = part_event(x, "response.content_part.added");
    cJSON_AddItemToObject(ev, "part", text_part("", 0));
    event_put(b, ev);
}

/* Sends x->text[x->sent..upto) as an output_text delta, opening the
 * message first if need be. */
static void text_put(sse_buf *b, resp_state *x, size_t upto) {
    if (!x->msg_open) message_open(b, x);
    if (upto <= x->sent) return;
    cJSON *ev = part_event(x, "response.output_text.delta");
    serve_json_add_text(ev, "delta", x->text + x->sent, upto - x->sent);
    cJSON_AddArrayToObject(ev, "logprobs");
    event_put(b, ev);
    x->sent = upto;
}

/* Closes the message item (its text: what was sent) and adds it to the
 * final output. */
static void message_close(sse_buf *b, resp_state *x, const char *status, cJSON *output) {
    cJSON *ev = part_event(x, "response.output_text.done");
    serve_json_add_text(ev, "text", x->text, x->sent);
    cJSON_AddArrayToObject(ev, "logprobs");
    event_put(b, ev);
    ev = part_event(x, "response.content_part.done");
    cJSON_AddItemToObject(ev, "part", text_part(x->text, x->sent));
    event_put(b, ev);
    item_put(b, x, "response.output_item.done", 0, message_item(x, status, true, x->text, x->sent));
    cJSON_AddItemToArray(output, message_item(x, status, true, x->text, x->sent));
}

/* A function_call item's events at output_index k: added (no arguments
 * yet), the arguments in pieces, their end, done. */
static void call_put(sse_buf *b, resp_state *x, const cJSON *call, int k, cJSON *output) {
    cJSON *item = call_item(call, "completed", true);
    const char *id = cJSON_GetObjectItemCaseSensitive(item, "id")->valuestring;
    const char *args = cJSON_GetObjectItemCaseSensitive(item, "arguments")->valuestring;
    item_put(b, x, "response.output_item.added", k, call_item(call, "in_progress", false));
    size_t n = strlen(args);
    for (size_t at = 0, len; at < n; at += len) {
        len = serve_tool_args_piece(args, n, at);
        cJSON *ev = item_event(x, "response.function_call_arguments.delta", id, k, -1);
        serve_json_add_text(ev, "delta", args + at, len);
        event_put(b, ev);
    }
    cJSON *ev = item_event(x, "response.function_call_arguments.done", id, k, -1);
    cJSON_AddStringToObject(ev, "name",
                            cJSON_GetObjectItemCaseSensitive(item, "name")->valuestring);
    cJSON_AddStringToObject(ev, "arguments", args);
    event_put(b, ev);
    cJSON_AddItemToArray(output, cJSON_Duplicate(item, true));
    item_put(b, x, "response.output_item.done", k, item);
}

/* The stream's events. Without tools the message opens at once and every
 * piece of text goes out as it comes. With tools, text goes out only up
 * to where a call may begin (serve_tool_hold), and the message opens
 * with the first text that is not blank; at the end the rest is parsed:
 * its calls go out as function_call items after the message (if any), or
 * when it holds none, it goes out as text. */
static char *resp_stream(void *ctx, const serve_out *o) {
    resp_state *x = ctx;
    sse_buf b = {NULL, 0, 0, false};
    if (!x->opened) {
        x->opened = true;
        response_event(&b, x, "response.created", NULL, NULL);
        response_event(&b, x, "response.in_progress", NULL, NULL);
        if (!x->tools_json) message_open(&b, x);
    }
    if (o->len) {
        if (!serve_grow(&x->text, &x->cap, x->len + o->len + 1)) {
            free(b.p);
            return NULL;
        }
        memcpy(x->text + x->len, o->text, o->len);
        x->len += o->len;
        x->text[x->len] = '\0';
    }
    size_t ready = x->len;
    if (x->tools_json) {
        ready = serve_tool_hold(x->text ? x->text : "", x->len);
        if (!x->msg_open && blank(x->text, ready)) ready = 0;
    }
    if (ready > x->sent) text_put(&b, x, ready);
    if (o->done && o->err) {
        response_event(&b, x, "response.failed", o, NULL);
    } else if (o->done) {
        const char *status = final_status(o);
        char *content = NULL;
        cJSON *calls = reply_calls(x, x->text, x->len, &content), *call;
        free(content); /* the text before the calls went out already */
        if (!calls) text_put(&b, x, x->len);
        cJSON *output = cJSON_CreateArray();
        if (x->msg_open) message_close(&b, x, calls ? "completed" : status, output);
        int k = x->msg_open;
        cJSON_ArrayForEach(call, calls) call_put(&b, x, call, k++, output);
        cJSON_Delete(calls);
        response_event(&b, x,
                       strcmp(status, "completed") ? "response.incomplete" : "response.completed",
                       o, output);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p ? b.p : strdup(""); /* text held back: nothing to send yet */
}
