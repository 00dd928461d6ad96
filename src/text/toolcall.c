/*
 * toolcall.c — tool calls: reading OpenAI tool definitions, preparing a
 * tool conversation for the chat template (or for the generic rendering),
 * the grammar of a forced call, and the parser of a model's calls (see
 * toolcall.h and docs/serve.md).
 */
#include "text/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/json.h"
#include "text/schema.h"

#define TOOL_MAX_DEPTH 64 /* nesting of tools and messages JSON */

static const char generic_intro[] =
    "You can call functions to help with the user's request. The functions are "
    "listed as JSON objects within <tools></tools> tags:\n<tools>";
static const char generic_outro[] =
    "\n</tools>\nTo call a function, reply with one <tool_call></tool_call> block per call, "
    "each holding a JSON object with the function's name and its arguments:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <arguments-object>}\n</tool_call>";

tool_format tool_format_of_template(const char *tpl, bool *native) {
    *native = tpl && strstr(tpl, "tools") != NULL;
    if (!tpl || !*native) return TOOL_FMT_HERMES; /* the generic rendering asks for it */
    if (strstr(tpl, "<tool_call>")) return TOOL_FMT_HERMES;
    if (strstr(tpl, "[TOOL_CALLS]")) return TOOL_FMT_MISTRAL;
    if (strstr(tpl, "<|python_tag|>") || strstr(tpl, "<|start_header_id|>")) return TOOL_FMT_LLAMA3;
    return TOOL_FMT_JSON;
}

/* ------------------------------------------------------------ tools */

typedef struct tool_fn {
    const char *name;
    const json_node *params; /* NULL: none given */
} tool_fn;

typedef struct tool_set {
    json_node *root;
    tool_fn fn[TOOL_MAX_FUNCTIONS];
    int n;
} tool_set;

static bool name_ok(const char *s, size_t n) {
    if (n == 0 || n > TOOL_MAX_NAME) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* Reads and checks tools_json into *ts (free ts->root with json_free). */
static cellm_status read_tools(const char *tools_json, tool_set *ts, cellm_error *err) {
    memset(ts, 0, sizeof *ts);
    size_t len = strlen(tools_json), end = 0;
    if (len > TOOL_MAX_JSON) return err_set(err, CELLM_ERR_INVALID_ARG, "tools: too large");
    cellm_error perr;
    err_clear(&perr);
    ts->root = json_parse(tools_json, len, &end, TOOL_MAX_DEPTH, "tools", &perr);
    if (!ts->root) return err_set(err, CELLM_ERR_INVALID_ARG, "%s", perr.msg);
    const json_node *r = ts->root;
    const char *why = NULL;
    if (end != len)
        why = "text after the JSON";
    else if (r->type != JSON_ARR)
        why = "must be an array of tool objects";
    else if (r->n > TOOL_MAX_FUNCTIONS)
        why = "too many functions";
    if (why) {
        err_set(err, CELLM_ERR_INVALID_ARG, "tools: %s (at most %d functions)", why,
                TOOL_MAX_FUNCTIONS);
        goto fail;
    }
    for (size_t k = 0; k < r->n; k++) {
        const json_node *t = r->kids[k], *type = json_get(t, "type"), *f = json_get(t, "function");
        const json_node *name = json_get(f, "name"), *params = json_get(f, "parameters");
        if (t->type != JSON_OBJ)
            why = "must be an object";
        else if (type && (type->type != JSON_STR || strcmp(type->str, "function")))
            why = "has a 'type' other than \"function\"";
        else if (!f || f->type != JSON_OBJ)
            why = "needs a 'function' object";
        else if (!name || name->type != JSON_STR)
            why = "needs 'function.name', a string";
        else if (!name_ok(name->str, name->str_len))
            why = "has a name that is not 1..64 of a-z, A-Z, 0-9, '_', '-', '.'";
        else if (params && params->type != JSON_OBJ && params->type != JSON_NULL)
            why = "has 'function.parameters' that is not a JSON Schema object";
        for (int i = 0; !why && i < ts->n; i++)
            if (!strcmp(ts->fn[i].name, name->str)) why = "repeats the name of an earlier tool";
        if (why) {
            err_set(err, CELLM_ERR_INVALID_ARG, "tools[%zu] %s", k, why);
            goto fail;
        }
        ts->fn[ts->n++] = (tool_fn){name->str, params && params->type == JSON_OBJ ? params : NULL};
    }
    return CELLM_OK;
fail:
    json_free(ts->root);
    ts->root = NULL;
    return CELLM_ERR_INVALID_ARG;
}

/* ------------------------------------------------------------ messages */

/* Writes a call's arguments as a JSON value: a string that holds JSON
 * (OpenAI sends arguments so) is written as that JSON, so templates get
 * the object they expect; anything else as it is. */
static void write_arguments(json_buf *b, const json_node *a) {
    if (a->type == JSON_STR) {
        size_t end = 0;
        json_node *v = json_parse(a->str, a->str_len, &end, TOOL_MAX_DEPTH, "arguments", NULL);
        if (v && end == a->str_len) {
            json_write(b, v);
            json_free(v);
            return;
        }
        json_free(v);
    }
    json_write(b, a);
}

/* Writes a tool call id as Mistral's templates require one: 9 letters and
 * digits. An id that is so already stays; any other becomes 9 base-62
 * digits of its FNV-1a hash, the same for the call and for its result, so
 * a client's ids (cellm's own are call_ and 16 hex digits) still pair. */
static void write_short_id(json_buf *b, const json_node *v) {
    bool ok = v->str_len == 9;
    for (size_t i = 0; ok && i < 9; i++)
        ok = (v->str[i] >= '0' && v->str[i] <= '9') || (v->str[i] >= 'a' && v->str[i] <= 'z') ||
             (v->str[i] >= 'A' && v->str[i] <= 'Z');
    if (ok) {
        json_write(b, v);
        return;
    }
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < v->str_len; i++) h = (h ^ (unsigned char)v->str[i]) * 0x100000001b3ull;
    char id[9];
    for (int i = 0; i < 9; i++, h /= 62) id[i] = digits[h % 62];
    json_buf_quote(b, id, sizeof id);
}

/* An object written member by member, `arguments` members of `function`
 * objects of `tool_calls` through write_arguments, and with short_ids the
 * ids of calls and results through write_short_id. level: 0 a message, 1
 * a tool call, 2 a function. */
static void write_message(json_buf *b, const json_node *o, int level, bool short_ids) {
    json_buf_str(b, "{");
    for (size_t k = 0; k < o->n; k++) {
        const json_node *v = o->kids[k];
        const char *key = o->keys[k];
        if (k) json_buf_str(b, ",");
        json_buf_quote(b, key, strlen(key));
        json_buf_str(b, ":");
        if (level == 0 && !strcmp(key, "tool_calls") && v->type == JSON_ARR) {
            json_buf_str(b, "[");
            for (size_t i = 0; i < v->n; i++) {
                if (i) json_buf_str(b, ",");
                if (v->kids[i]->type == JSON_OBJ)
                    write_message(b, v->kids[i], 1, short_ids);
                else
                    json_write(b, v->kids[i]);
            }
            json_buf_str(b, "]");
        } else if (level == 1 && !strcmp(key, "function") && v->type == JSON_OBJ) {
            write_message(b, v, 2, short_ids);
        } else if (short_ids && v->type == JSON_STR &&
                   ((level == 1 && !strcmp(key, "id")) ||
                    (level == 0 && !strcmp(key, "tool_call_id")))) {
            write_short_id(b, v);
        } else if (level == 2 && !strcmp(key, "arguments")) {
            write_arguments(b, v);
        } else {
            json_write(b, v);
        }
    }
    json_buf_str(b, "}");
}

/* Appends a message (role, the text of *text, which it takes). */
static bool push_msg(tool_chat *c, const char *role, json_buf *text) {
    tool_msg *m = realloc(c->msgs, (size_t)(c->n_msgs + 1) * sizeof *m);
    if (!m) return false;
    c->msgs = m;
    m[c->n_msgs].role = str_dup_n(role, strlen(role));
    m[c->n_msgs].content = text->s ? text->s : str_dup_n("", 0);
    text->s = NULL;
    if (!m[c->n_msgs].role || !m[c->n_msgs].content) {
        free(m[c->n_msgs].role);
        free(m[c->n_msgs].content);
        return false;
    }
    c->n_msgs++;
    return true;
}

/* The generic rendering: the system prompt listing the tools, calls as
 * <tool_call> blocks, results as user turns of <tool_response> blocks. */
static bool generic_messages(const json_node *msgs, const json_node *tools, tool_chat *c) {
    json_buf sys = {0};
    if (tools && tools->n) {
        json_buf_str(&sys, generic_intro);
        for (size_t k = 0; k < tools->n; k++) {
            json_buf_str(&sys, "\n");
            json_write(&sys, tools->kids[k]);
        }
        json_buf_str(&sys, generic_outro);
    }
    size_t first = 0;
    const json_node *m0 = msgs->kids[0], *c0 = json_get(m0, "content");
    const json_node *r0 = json_get(m0, "role");
    if (sys.s && r0 && !strcmp(r0->str, "system")) {
        json_buf t = {0};
        if (c0 && c0->type == JSON_STR && c0->str_len) {
            json_buf_add(&t, c0->str, c0->str_len);
            json_buf_str(&t, "\n\n");
        }
        json_buf_add(&t, sys.s, sys.n);
        free(sys.s);
        sys = t;
        first = 1;
    }
    bool ok = !sys.full && (!sys.s || push_msg(c, "system", &sys));
    free(sys.s);
    for (size_t k = first; ok && k < msgs->n; k++) {
        const json_node *m = msgs->kids[k], *content = json_get(m, "content");
        const char *role = json_get(m, "role")->str;
        json_buf t = {0};
        bool tool = !strcmp(role, "tool");
        if (tool) json_buf_str(&t, "<tool_response>\n");
        if (content && content->type == JSON_STR) json_buf_add(&t, content->str, content->str_len);
        if (tool) json_buf_str(&t, "\n</tool_response>");
        const json_node *calls = json_get(m, "tool_calls");
        for (size_t i = 0; calls && calls->type == JSON_ARR && i < calls->n; i++) {
            const json_node *f = json_get(calls->kids[i], "function");
            const json_node *name = json_get(f, "name"), *args = json_get(f, "arguments");
            if (t.n) json_buf_str(&t, "\n");
            json_buf_str(&t, "<tool_call>\n{\"name\": ");
            if (name) json_write(&t, name);
            json_buf_str(&t, ", \"arguments\": ");
            if (args)
                write_arguments(&t, args);
            else
                json_buf_str(&t, "{}");
            json_buf_str(&t, "}\n</tool_call>");
        }
        /* Results that follow one another make one user turn. */
        if (tool && c->n_msgs && k > first &&
            !strcmp(json_get(msgs->kids[k - 1], "role")->str, "tool")) {
            tool_msg *last = &c->msgs[c->n_msgs - 1];
            size_t a = strlen(last->content);
            char *joined = t.full ? NULL : realloc(last->content, a + t.n + 2);
            if (joined) {
                joined[a] = '\n';
                memcpy(joined + a + 1, t.s ? t.s : "", t.n + 1);
                last->content = joined;
            }
            ok = joined != NULL;
        } else {
            ok = !t.full && push_msg(c, tool ? "user" : role, &t);
        }
        free(t.s);
    }
    return ok;
}

void tool_chat_free(tool_chat *c) {
    free(c->vars_json);
    for (int i = 0; i < c->n_msgs; i++) {
        free(c->msgs[i].role);
        free(c->msgs[i].content);
    }
    free(c->msgs);
    memset(c, 0, sizeof *c);
}

/* Checks one message: an object with a string role, content a string or
 * null, tool_calls an array of {"function": {"name": string}}. */
static const char *message_problem(const json_node *m) {
    if (m->type != JSON_OBJ) return "is not an object";
    const json_node *role = json_get(m, "role"), *content = json_get(m, "content");
    if (!role || role->type != JSON_STR || !role->str_len) return "needs a string 'role'";
    if (content && content->type != JSON_STR && content->type != JSON_NULL)
        return "has 'content' that is not a string or null";
    const json_node *calls = json_get(m, "tool_calls");
    if (calls && calls->type != JSON_ARR && calls->type != JSON_NULL)
        return "has 'tool_calls' that is not an array";
    for (size_t i = 0; calls && calls->type == JSON_ARR && i < calls->n; i++) {
        const json_node *name = json_get(json_get(calls->kids[i], "function"), "name");
        if (!name || name->type != JSON_STR) return "has a tool call without 'function.name'";
    }
    return NULL;
}

cellm_status tool_chat_prepare(const char *messages_json, const char *tools_json, bool native,
                               bool short_ids, tool_chat *out, cellm_error *err) {
    memset(out, 0, sizeof *out);
    size_t len = strlen(messages_json), end = 0;
    if (len > TOOL_MAX_JSON) return err_set(err, CELLM_ERR_INVALID_ARG, "messages: too large");
    tool_set ts = {0};
    if (tools_json && read_tools(tools_json, &ts, err)) return CELLM_ERR_INVALID_ARG;
    cellm_error perr;
    err_clear(&perr);
    json_node *msgs = json_parse(messages_json, len, &end, TOOL_MAX_DEPTH, "messages", &perr);
    cellm_status st = CELLM_OK;
    if (!msgs) {
        st = err_set(err, CELLM_ERR_INVALID_ARG, "%s", perr.msg);
    } else if (end != len || msgs->type != JSON_ARR || msgs->n == 0) {
        st = err_set(err, CELLM_ERR_INVALID_ARG, "messages: must be a non-empty JSON array");
    } else {
        for (size_t k = 0; k < msgs->n && !st; k++) {
            const char *why = message_problem(msgs->kids[k]);
            if (why) st = err_set(err, CELLM_ERR_INVALID_ARG, "messages[%zu] %s", k, why);
        }
    }
    if (!st && native) {
        json_buf b = {.max = 2 * (size_t)TOOL_MAX_JSON + 64};
        json_buf_str(&b, "{\"messages\":[");
        for (size_t k = 0; k < msgs->n; k++) {
            if (k) json_buf_str(&b, ",");
            write_message(&b, msgs->kids[k], 0, short_ids);
        }
        json_buf_str(&b, "]");
        if (ts.root) {
            json_buf_str(&b, ",\"tools\":");
            json_write(&b, ts.root);
        }
        json_buf_str(&b, "}");
        if (b.full) {
            free(b.s);
            st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        } else {
            out->vars_json = b.s;
            out->vars_len = b.n;
        }
    } else if (!st && !generic_messages(msgs, ts.root, out)) {
        tool_chat_free(out);
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    json_free(msgs);
    json_free(ts.root);
    return st;
}

/* ------------------------------------------------------------ grammar */

cellm_status tool_grammar_gbnf(const char *tools_json, const char *only, tool_format fmt,
                               bool parallel, char **out, size_t *out_len, cellm_error *err) {
    *out = NULL;
    *out_len = 0;
    tool_set ts;
    if (read_tools(tools_json, &ts, err)) return CELLM_ERR_INVALID_ARG;
    cellm_status st = CELLM_OK;
    const char *schemas[TOOL_MAX_FUNCTIONS];
    size_t lens[TOOL_MAX_FUNCTIONS];
    int which[TOOL_MAX_FUNCTIONS], tops[TOOL_MAX_FUNCTIONS], n = 0;
    json_buf texts[TOOL_MAX_FUNCTIONS];
    for (int i = 0; i < ts.n; i++) {
        if (only && strcmp(only, ts.fn[i].name)) continue;
        memset(&texts[n], 0, sizeof texts[n]);
        if (ts.fn[i].params)
            json_write(&texts[n], ts.fn[i].params);
        else
            json_buf_str(&texts[n], "{\"type\":\"object\"}");
        schemas[n] = texts[n].s ? texts[n].s : "";
        lens[n] = texts[n].n;
        which[n++] = i;
    }
    if (n == 0) {
        json_free(ts.root);
        return only ? err_set(err, CELLM_ERR_INVALID_ARG,
                              "tool_choice names '%s', which is not among the tools", only)
                    : err_set(err, CELLM_ERR_INVALID_ARG, "no tools to call");
    }
    char *rules = NULL;
    size_t n_rules = 0;
    cellm_error serr;
    err_clear(&serr);
    if (schema_to_gbnf_rules(schemas, lens, n, tops, &rules, &n_rules, &serr)) {
        /* Say which tool: compile them one by one to find it. */
        int bad = 0;
        for (int k = 0; k < n; k++) {
            int top;
            char *one = NULL;
            size_t nn;
            cellm_error e1;
            err_clear(&e1);
            if (schema_to_gbnf_rules(&schemas[k], &lens[k], 1, &top, &one, &nn, &e1)) {
                bad = k;
                serr = e1;
                break;
            }
            free(one);
        }
        st = err_set(err, CELLM_ERR_INVALID_ARG, "tools[%d] (%s) parameters: %s", which[bad],
                     ts.fn[which[bad]].name, serr.msg);
    }
    json_buf g = {0};
    if (!st) {
        const char *key = fmt == TOOL_FMT_LLAMA3 ? "parameters" : "arguments";
        switch (fmt) {
        case TOOL_FMT_HERMES:
            json_buf_str(&g, parallel ? "root ::= toolblock ( \"\\n\" toolblock )*\n"
                                      : "root ::= toolblock\n");
            json_buf_str(&g, "toolblock ::= \"<tool_call>\\n\" toolcall \"\\n</tool_call>\"\n");
            break;
        case TOOL_FMT_MISTRAL:
            json_buf_str(&g, parallel ? "root ::= \"[TOOL_CALLS] [\" toolcall ( \", \" toolcall )* "
                                        "\"]\"\n"
                                      : "root ::= \"[TOOL_CALLS] [\" toolcall \"]\"\n");
            break;
        case TOOL_FMT_LLAMA3:
            json_buf_str(&g, parallel ? "root ::= toolcall ( \"; \" toolcall )*\n"
                                      : "root ::= toolcall\n");
            break;
        case TOOL_FMT_JSON:
            json_buf_str(&g, parallel ? "root ::= \"[\" toolcall ( \", \" toolcall )* \"]\"\n"
                                      : "root ::= toolcall\n");
            break;
        }
        /* The wrapper is fixed text, as the families write it: white
         * space there would only let a weak model wander. */
        json_buf_str(&g, "toolcall ::= \"{\\\"name\\\": \" (");
        for (int k = 0; k < n; k++) {
            char line[64];
            snprintf(line, sizeof line, "%s toolfn%d", k ? " |" : "", k);
            json_buf_str(&g, line);
        }
        json_buf_str(&g, " ) \"}\"\n");
        for (int k = 0; k < n; k++) {
            char line[256];
            /* Names are checked to hold no character GBNF or JSON escapes. */
            snprintf(line, sizeof line, "toolfn%d ::= \"\\\"%s\\\", \\\"%s\\\": \" r%d\n", k,
                     ts.fn[which[k]].name, key, tops[k]);
            json_buf_str(&g, line);
        }
        json_buf_add(&g, rules, n_rules);
        if (g.full) {
            free(g.s);
            g.s = NULL;
            st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        }
    }
    free(rules);
    for (int k = 0; k < n; k++) free(texts[k].s);
    json_free(ts.root);
    if (!st) {
        *out = g.s;
        *out_len = g.n;
    }
    return st;
}

/* ------------------------------------------------------------ parsing */

typedef struct call_list {
    json_buf calls; /* the tool_calls array's items, comma-separated */
    int n;
    bool bad;       /* a call was malformed: the whole reply is content */
    bool named_bad; /* a call named no known function */
    const tool_set *tools;
} call_list;

static bool known(const call_list *cl, const char *name) {
    if (!cl->tools) return true;
    for (int i = 0; i < cl->tools->n; i++)
        if (!strcmp(cl->tools->fn[i].name, name)) return true;
    return false;
}

/* Adds one call: an object with "name" and "arguments" (or Llama's
 * "parameters"), maybe wrapped as OpenAI's {"function": {...}}. */
static void add_call(call_list *cl, const json_node *o) {
    const json_node *f = json_get(o, "function");
    if (f && f->type == JSON_OBJ) o = f;
    const json_node *name = json_get(o, "name"), *args = json_get(o, "arguments");
    if (!args) args = json_get(o, "parameters");
    if (!name || name->type != JSON_STR || !name->str_len || !known(cl, name->str)) {
        cl->bad = cl->named_bad = true;
        return;
    }
    json_buf a = {0};
    if (!args) {
        json_buf_str(&a, "{}");
    } else if (args->type == JSON_OBJ) {
        json_write(&a, args);
    } else if (args->type == JSON_STR) {
        size_t end = 0;
        json_node *v = json_parse(args->str, args->str_len, &end, TOOL_MAX_DEPTH, "", NULL);
        if (v && end == args->str_len && v->type == JSON_OBJ)
            json_write(&a, v);
        else
            cl->bad = true;
        json_free(v);
    } else {
        cl->bad = true;
    }
    if (!cl->bad) {
        if (cl->n++) json_buf_str(&cl->calls, ",");
        json_buf_str(&cl->calls, "{\"name\":");
        json_write(&cl->calls, name);
        json_buf_str(&cl->calls, ",\"arguments\":");
        json_buf_quote(&cl->calls, a.s ? a.s : "{}", a.s ? a.n : 2);
        json_buf_str(&cl->calls, "}");
    }
    free(a.s);
}

/* Calls from one JSON value: an object, or an array of objects. */
static void add_value(call_list *cl, const json_node *v) {
    if (v->type == JSON_OBJ) {
        add_call(cl, v);
    } else if (v->type == JSON_ARR && v->n > 0) {
        for (size_t k = 0; k < v->n && !cl->bad; k++) {
            if (v->kids[k]->type != JSON_OBJ)
                cl->bad = true;
            else
                add_call(cl, v->kids[k]);
        }
    } else {
        cl->bad = true;
    }
}

static bool space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* Parses JSON values from s[*i..n), separated by white space or ';', up
 * to the end or to `stop` (not consumed). */
static void add_values(call_list *cl, const char *s, size_t n, size_t *i, const char *stop) {
    size_t stop_len = stop ? strlen(stop) : 0;
    int got = 0;
    while (!cl->bad) {
        while (*i < n && (space(s[*i]) || (got && s[*i] == ';'))) (*i)++;
        if (*i == n || (stop && n - *i >= stop_len && !memcmp(s + *i, stop, stop_len))) break;
        size_t used = 0;
        json_node *v = json_parse(s + *i, n - *i, &used, TOOL_MAX_DEPTH, "", NULL);
        if (!v) {
            cl->bad = true;
            break;
        }
        add_value(cl, v);
        json_free(v);
        *i += used;
        got++;
    }
    if (!got) cl->bad = true;
}

static const char *find(const char *s, size_t n, const char *what) {
    size_t w = strlen(what);
    for (size_t i = 0; i + w <= n; i++)
        if (s[i] == what[0] && !memcmp(s + i, what, w)) return s + i;
    return NULL;
}

/* Text outside the calls, trimmed. */
static void add_content(json_buf *b, const char *s, size_t n) {
    while (n && space(*s)) s++, n--;
    while (n && space(s[n - 1])) n--;
    if (!n) return;
    if (b->n) json_buf_str(b, "\n");
    json_buf_add(b, s, n);
}

/* The calls of a reply, trying the formats in turn. */
static void find_calls(call_list *cl, const char *s, size_t n, json_buf *content) {
    const char *tag = find(s, n, "<tool_call>");
    if (tag) {
        size_t i = (size_t)(tag - s);
        add_content(content, s, i);
        while (!cl->bad && i < n) {
            const char *next = find(s + i, n - i, "<tool_call>");
            if (!next) {
                add_content(content, s + i, n - i);
                break;
            }
            add_content(content, s + i, (size_t)(next - (s + i)));
            i = (size_t)(next - s) + strlen("<tool_call>");
            /* A last block cut short (the reply ran out of tokens) after
             * whole calls is dropped; the whole calls stand. */
            bool last = !find(s + i, n - i, "</tool_call>") && !find(s + i, n - i, "<tool_call>");
            add_values(cl, s, n, &i, "</tool_call>");
            if (cl->bad && last && cl->n > 0 && !cl->named_bad) {
                cl->bad = false;
                break;
            }
            while (i < n && space(s[i])) i++;
            if (n - i >= 12 && !memcmp(s + i, "</tool_call>", 12)) i += 12;
        }
        return;
    }
    static const char *const marks[] = {"[TOOL_CALLS]", "<|python_tag|>"};
    for (int m = 0; m < 2; m++) {
        const char *at = find(s, n, marks[m]);
        if (!at) continue;
        add_content(content, s, (size_t)(at - s));
        size_t i = (size_t)(at - s) + strlen(marks[m]);
        add_values(cl, s, n, &i, NULL);
        return;
    }
    /* A bare JSON reply, maybe in a ``` fence. */
    size_t a = 0, b = n;
    while (a < b && space(s[a])) a++;
    while (b > a && space(s[b - 1])) b--;
    if (b - a >= 6 && !memcmp(s + a, "```", 3) && !memcmp(s + b - 3, "```", 3)) {
        const char *nl = memchr(s + a, '\n', b - a);
        if (!nl) {
            cl->bad = true;
            return;
        }
        a = (size_t)(nl - s) + 1;
        b -= 3;
    }
    if (a == b || (s[a] != '{' && s[a] != '[')) {
        cl->bad = true;
        return;
    }
    add_values(cl, s, b, &a, NULL);
}

cellm_status tool_calls_parse(const char *text, size_t len, const char *tools_json, char **out,
                              cellm_error *err) {
    *out = NULL;
    tool_set ts = {0};
    if (tools_json && read_tools(tools_json, &ts, err)) return CELLM_ERR_INVALID_ARG;
    call_list cl = {.tools = tools_json ? &ts : NULL};
    json_buf content = {0};
    find_calls(&cl, text, len, &content);
    json_buf o = {0};
    json_buf_str(&o, "{\"content\":");
    if (cl.bad || cl.n == 0)
        json_buf_quote(&o, text, len);
    else if (content.n)
        json_buf_quote(&o, content.s, content.n);
    else
        json_buf_str(&o, "null");
    json_buf_str(&o, ",\"tool_calls\":[");
    if (!cl.bad && cl.n) json_buf_add(&o, cl.calls.s, cl.calls.n);
    json_buf_str(&o, "]}");
    free(cl.calls.s);
    free(content.s);
    json_free(ts.root);
    if (o.full || cl.calls.full || content.full) {
        free(o.s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    *out = o.s;
    return CELLM_OK;
}
