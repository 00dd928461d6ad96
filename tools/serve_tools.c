/*
 * serve_tools.c — OpenAI tool calls in `cellm serve`: the request's
 * `tools`, `tool_choice` and `parallel_tool_calls` checked, the
 * conversation's tool-call turns and tool results kept as JSON for the
 * library (cellm_request_params.messages_json), and the model's reply
 * turned into `tool_calls` (whole, or as the pieces a stream sends).
 *
 * Nothing here touches the engine or the server, so the request fuzzer
 * runs it with serve_req.c, and any endpoint (chat completions, the
 * Responses API) can use the reply side. The library does the real work:
 * the chat template renders the tools (cellm_request_params.tools_json),
 * cellm_grammar_tool_calls forces a call, cellm_tool_calls_parse finds one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"
#include "serve_json.h"

static char *print(const cJSON *v, serve_err *e) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) serr(e, 500, NULL, NULL, "out of memory");
    return t;
}

/* The tools: an array of {"type": "function", "function": {"name", ...}}
 * (the library checks names and schemas in depth; here the shape and the
 * count, so a huge list is refused before anything renders it). */
static bool parse_tool_list(const cJSON *tools, serve_req *r, serve_err *e) {
    if (!cJSON_IsArray(tools))
        return serr(e, 400, "invalid_type", "tools", "'tools' must be an array of tool objects");
    int n = cJSON_GetArraySize(tools);
    if (n == 0) return true;
    if (n > CELLM_MAX_TOOLS)
        return serr(e, 400, "invalid_value", "tools",
                    "'tools' has %d functions; cellm takes at most %d", n, CELLM_MAX_TOOLS);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = serve_field(t, "type"), *f = serve_field(t, "function");
        const cJSON *name = f ? serve_field(f, "name") : NULL;
        char param[48];
        snprintf(param, sizeof param, "tools[%d]", i++);
        if (!cJSON_IsObject(t) ||
            (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))))
            return serr(e, 400, "invalid_value", param,
                        "'%s' must be an object with \"type\": \"function\"", param);
        if (!cJSON_IsObject(f) || !cJSON_IsString(name) || !name->valuestring[0])
            return serr(e, 400, "missing_required_parameter", param,
                        "'%s' needs a 'function' object with a non-empty string 'name'", param);
    }
    r->tools_json = print(tools, e);
    return r->tools_json != NULL;
}

static bool parse_choice(const cJSON *tc, serve_req *r, serve_err *e) {
    r->tool_choice = r->tools_json ? SERVE_TOOLS_AUTO : SERVE_TOOLS_NONE;
    if (!tc) return true;
    if (cJSON_IsString(tc)) {
        const char *v = tc->valuestring;
        if (!strcmp(v, "none"))
            r->tool_choice = SERVE_TOOLS_NONE;
        else if (!strcmp(v, "auto"))
            r->tool_choice = r->tools_json ? SERVE_TOOLS_AUTO : SERVE_TOOLS_NONE;
        else if (!strcmp(v, "required"))
            r->tool_choice = SERVE_TOOLS_REQUIRED;
        else
            return serr(e, 400, "invalid_value", "tool_choice",
                        "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}, not '%s'",
                        v);
    } else {
        const cJSON *type = serve_field(tc, "type"), *f = serve_field(tc, "function");
        const cJSON *name = f ? serve_field(f, "name") : NULL;
        if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsString(name))
            return serr(e, 400, "invalid_value", "tool_choice",
                        "'tool_choice' as an object must be {\"type\": \"function\", "
                        "\"function\": {\"name\": string}}");
        if (!(r->tool_name = strdup(name->valuestring)))
            return serr(e, 500, NULL, NULL, "out of memory");
        r->tool_choice = SERVE_TOOLS_NAMED;
    }
    if (r->tool_choice != SERVE_TOOLS_NONE && !r->tools_json)
        return serr(e, 400, "invalid_value", "tool_choice",
                    "'tool_choice' asks for a tool call but 'tools' is empty or missing");
    return true;
}

/* A message's tool calls, checked and normalised into `out` (a new array):
 * {"id", "type": "function", "function": {"name", "arguments": string}}. */
static bool copy_calls(const cJSON *calls, int i, cJSON *out, serve_err *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!cJSON_IsArray(calls))
        return serr(e, 400, "invalid_type", param, "'%s' must be an array", param);
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *id = serve_field(c, "id"), *f = serve_field(c, "function");
        const cJSON *name = f ? serve_field(f, "name") : NULL,
                    *args = f ? serve_field(f, "arguments") : NULL;
        if (!cJSON_IsObject(c) || !cJSON_IsString(name) ||
            (args && !cJSON_IsString(args) && !cJSON_IsObject(args)) || (id && !cJSON_IsString(id)))
            return serr(e, 400, "invalid_value", param,
                        "the items of '%s' must be {\"id\": string, \"type\": \"function\", "
                        "\"function\": {\"name\": string, \"arguments\": string}}",
                        param);
        cJSON *o = cJSON_CreateObject(), *fo = NULL;
        cJSON_AddItemToArray(out, o);
        if (id) cJSON_AddStringToObject(o, "id", id->valuestring);
        cJSON_AddStringToObject(o, "type", "function");
        fo = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(fo, "name", name->valuestring);
        if (cJSON_IsString(args)) {
            cJSON_AddStringToObject(fo, "arguments", args->valuestring);
        } else {
            char *t = args ? cJSON_PrintUnformatted(args) : NULL;
            cJSON_AddStringToObject(fo, "arguments", t ? t : "{}");
            cJSON_free(t);
        }
    }
    return true;
}

/* The conversation as JSON for the library: role, content (the text
 * serve_req.c joined; null for a tool-call turn without text), and the
 * tool fields. */
static bool messages_json(const cJSON *msgs, serve_req *r, serve_err *e) {
    cJSON *out = cJSON_CreateArray();
    const cJSON *m;
    int i = 0;
    bool ok = out != NULL;
    cJSON_ArrayForEach(m, msgs) {
        if (!ok) break;
        const cJSON *calls = serve_field(m, "tool_calls"), *id = serve_field(m, "tool_call_id"),
                    *name = serve_field(m, "name");
        const char *role = r->messages[i].role;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(out, o);
        cJSON_AddStringToObject(o, "role", role);
        if (!serve_field(m, "content") && calls)
            cJSON_AddNullToObject(o, "content");
        else
            cJSON_AddStringToObject(o, "content", r->messages[i].content);
        if (calls) {
            if (strcmp(role, "assistant")) {
                char param[64];
                snprintf(param, sizeof param, "messages[%d].tool_calls", i);
                ok = serr(e, 400, "invalid_value", param, "only assistant messages have '%s'",
                          param);
                break;
            }
            ok = copy_calls(calls, i, cJSON_AddArrayToObject(o, "tool_calls"), e);
        }
        if (ok && id) {
            if (!cJSON_IsString(id)) {
                ok =
                    serr(e, 400, "invalid_type", "tool_call_id", "'tool_call_id' must be a string");
                break;
            }
            cJSON_AddStringToObject(o, "tool_call_id", id->valuestring);
        }
        if (ok && cJSON_IsString(name)) cJSON_AddStringToObject(o, "name", name->valuestring);
        i++;
    }
    if (ok) {
        r->messages_json = print(out, e);
        ok = r->messages_json != NULL;
    }
    cJSON_Delete(out);
    return ok;
}

bool serve_tools_parse(const void *json, serve_req *r, serve_err *e) {
    const cJSON *root = json;
    const cJSON *tools = serve_field(root, "tools");
    if (tools && !parse_tool_list(tools, r, e)) return false;
    if (!parse_choice(serve_field(root, "tool_choice"), r, e)) return false;
    r->parallel_tool_calls = true;
    const cJSON *par = serve_field(root, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par))
        return serr(e, 400, "invalid_type", "parallel_tool_calls",
                    "'parallel_tool_calls' must be a boolean");
    if (par) r->parallel_tool_calls = cJSON_IsTrue(par);
    /* The JSON form is needed for tools and for tool turns. */
    bool turns = false;
    const cJSON *m;
    cJSON_ArrayForEach(m, serve_field(root, "messages")) turns |=
        serve_field(m, "tool_calls") != NULL;
    for (int32_t i = 0; i < r->n_messages; i++) turns |= !strcmp(r->messages[i].role, "tool");
    if (!turns && !r->tools_json) return true;
    return messages_json(serve_field(root, "messages"), r, e);
}

void serve_tools_free(serve_req *r) {
    free(r->tools_json);
    free(r->messages_json);
    free(r->tool_name);
    r->tools_json = r->messages_json = r->tool_name = NULL;
}

/* ------------------------------------------------------------ replies */

void *serve_tool_calls(const char *text, size_t len, const char *tools_json, uint64_t id_seed,
                       char **content) {
    *content = NULL;
    char *parsed = NULL;
    if (cellm_tool_calls_parse(text, len, tools_json, &parsed) != CELLM_OK) return NULL;
    cJSON *p = serve_json_parse(parsed, strlen(parsed), NULL);
    free(parsed);
    const cJSON *calls = p ? serve_field(p, "tool_calls") : NULL;
    if (!cJSON_IsArray(calls) || cJSON_GetArraySize(calls) == 0) {
        cJSON_Delete(p);
        return NULL;
    }
    const cJSON *c = serve_field(p, "content");
    if (cJSON_IsString(c)) *content = strdup(c->valuestring);
    cJSON *out = cJSON_CreateArray();
    const cJSON *it;
    uint64_t k = 0;
    cJSON_ArrayForEach(it, calls) {
        char id[40];
        /* splitmix64, so that ids of one reply differ in every digit */
        uint64_t z = id_seed + 0x9E3779B97F4A7C15ull * ++k;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        snprintf(id, sizeof id, "call_%016llx", (unsigned long long)(z ^ (z >> 31)));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(f, "name", serve_field(it, "name")->valuestring);
        cJSON_AddStringToObject(f, "arguments", serve_field(it, "arguments")->valuestring);
        cJSON_AddItemToArray(out, o);
    }
    cJSON_Delete(p);
    return out;
}

size_t serve_tool_hold(const char *text, size_t len) {
    static const char *const marks[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", text[i])) i++;
    /* A reply that opens like JSON may be a bare call: keep all of it. */
    if (i < len && (text[i] == '{' || text[i] == '[' || text[i] == '`')) return 0;
    for (; i < len; i++) {
        if (text[i] != '<' && text[i] != '[') continue;
        for (int m = 0; m < 3; m++) {
            size_t ml = strlen(marks[m]), n = len - i < ml ? len - i : ml;
            if (!memcmp(text + i, marks[m], n)) return i; /* a mark, or the start of one */
        }
    }
    return len;
}

size_t serve_tool_args_piece(const char *args, size_t n, size_t at) {
    size_t k = n - at < SERVE_ARGS_PIECE ? n - at : SERVE_ARGS_PIECE;
    while (at + k < n && ((unsigned char)args[at + k] & 0xC0) == 0x80) k++;
    return k;
}
