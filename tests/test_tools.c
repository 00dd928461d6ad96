/*
 * test_tools.c — tool calls in the library (src/text/toolcall.c): the parser
 * of every call format and of malformed replies, tool conversations
 * rendered by real chat templates exactly as transformers renders them
 * (tests/data/templates/cases), the generic rendering for a template
 * without tool support, and the grammar of a forced call. No model: fast.
 */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"
#include "text/json.h"
#include "text/toolcall.h"
#include "grammar_rig.h"
#include "test_common.h"

#define TPL_DIR CELLM_SOURCE_DIR "/tests/data/templates"

static const char *const TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}]";

/* The parser's JSON for a reply. */
static char *parse(const char *text, const char *tools) {
    char *out = NULL;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(tool_calls_parse(text, strlen(text), tools, &out, &err), CELLM_OK);
    return out;
}

static void expect(const char *text, const char *tools, const char *want) {
    char *got = parse(text, tools);
    if (strcmp(got, want)) fail_msg("reply %.80s\n got:  %s\n want: %s", text, got, want);
    free(got);
}

#define WEATHER_PARIS "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}"

static void test_asan_parse_formats(void **st) {
    (void)st;
    /* Hermes / Qwen. */
    expect("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
           "</tool_call>",
           TOOLS, "{\"content\":null,\"tool_calls\":[" WEATHER_PARIS "]}");
    /* Two calls, text before and after, no closing tag on the last. */
    expect("Let me look.\n<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}"
           "</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n",
           TOOLS,
           "{\"content\":\"Let me look.\",\"tool_calls\":[" WEATHER_PARIS
           ",{\"name\":\"noop\",\"arguments\":\"{}\"}]}");
    /* Llama 3.x: after <|python_tag|>, "parameters", or alone. */
    expect("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
           TOOLS, "{\"content\":null,\"tool_calls\":[" WEATHER_PARIS "]}");
    expect("  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n", TOOLS,
           "{\"content\":null,\"tool_calls\":[" WEATHER_PARIS "]}");
    expect(
        "<|python_tag|>{\"name\": \"noop\", \"parameters\": {}}; {\"name\": \"get_weather\", "
        "\"parameters\": {\"city\": \"Paris\"}}",
        TOOLS,
        "{\"content\":null,\"tool_calls\":[{\"name\":\"noop\",\"arguments\":\"{}\"}," WEATHER_PARIS
        "]}");
    /* Mistral. */
    expect("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
           "{\"name\": \"noop\", \"arguments\": {}, \"id\": \"abc123def\"}]",
           TOOLS,
           "{\"content\":null,\"tool_calls\":[" WEATHER_PARIS
           ",{\"name\":\"noop\",\"arguments\":\"{}\"}]}");
    /* Generic JSON: a fenced array, OpenAI's wrapping, string arguments,
     * no arguments at all. */
    expect("```json\n[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
           "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}, {\"name\": \"noop\"}]\n```",
           TOOLS,
           "{\"content\":null,\"tool_calls\":[" WEATHER_PARIS
           ",{\"name\":\"noop\",\"arguments\":\"{}\"}]}");
    /* Without a tools list any name counts. */
    expect("{\"name\": \"anything\", \"arguments\": {\"a\": [1, 2.5, null, true]}}", NULL,
           "{\"content\":null,\"tool_calls\":[{\"name\":\"anything\",\"arguments\":"
           "\"{\\\"a\\\":[1,2.5,null,true]}\"}]}");
    /* A last block cut short after whole calls is dropped. */
    expect("<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
           "{\"name\": \"get_wea",
           TOOLS, "{\"content\":null,\"tool_calls\":[{\"name\":\"noop\",\"arguments\":\"{}\"}]}");
}

static void test_asan_parse_malformed(void **st) {
    (void)st;
    /* Each stays plain content, all of it, with no calls. */
    static const char *const replies[] = {
        "",
        "Hello! The weather is fine.",
        "I think {this} is not JSON",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}",
        "<tool_call>\n</tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"unknown_tool\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"noop\", \"arguments\": {}}</tool_call><tool_call>{\"name\": "
        "\"nope\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"noop\", \"arguments\": \"not json\"}</tool_call>",
        "<tool_call>{\"name\": \"noop\", \"arguments\": [1, 2]}</tool_call>",
        "[TOOL_CALLS]",
        "[TOOL_CALLS] nope",
        "[TOOL_CALLS] [1, 2]",
        "[TOOL_CALLS] []",
        "<|python_tag|>print('hi')",
        "{\"name\": \"get_weather\"} trailing words",
        "[{\"name\": \"noop\"}, 3]",
        "```json\n{\"name\": \"noop\"}",
        "```\n```",
        "{\"name\": \"noop\", \"arguments\": {}, \"x\": \"\\ud800\"",
        "\xff\xfe<tool_call>\xc3",
    };
    for (size_t i = 0; i < sizeof replies / sizeof *replies; i++) {
        char *got = parse(replies[i], TOOLS);
        json_node *v = json_parse(got, strlen(got), NULL, 64, "out", NULL);
        assert_non_null(v);
        const json_node *calls = json_get(v, "tool_calls"), *content = json_get(v, "content");
        if (!calls || calls->type != JSON_ARR || calls->n != 0 || !content ||
            content->type != JSON_STR || strcmp(content->str, replies[i]))
            fail_msg("reply %zu (%s) gave %s", i, replies[i], got);
        json_free(v);
        free(got);
    }
    /* Nesting far past the bound: no call, no crash. */
    size_t deep = 100000;
    char *d = malloc(2 * deep + 1);
    assert_non_null(d);
    memset(d, '[', deep);
    memset(d + deep, ']', deep);
    d[2 * deep] = '\0';
    char *got = parse(d, NULL);
    assert_non_null(strstr(got, "\"tool_calls\":[]"));
    free(got);
    free(d);
    /* Malformed tools are an error of the call, not of the reply. */
    char *out = NULL;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(tool_calls_parse("x", 1, "{\"not\": \"a list\"}", &out, &err),
                     CELLM_ERR_INVALID_ARG);
    assert_null(out);
    assert_non_null(strstr(err.msg, "tools"));
}

/* ---------------------------------------------------------- templates */

/* The case's variables with every tool call's arguments turned into a
 * JSON string, as the OpenAI API sends them, into `b`: messages into
 * *msgs, tools into *tools, the other variables into *rest (members
 * without the braces). */
static void wire_form(const json_node *o, json_buf *msgs, json_buf *tools, json_buf *rest) {
    for (size_t k = 0; k < o->n; k++) {
        const char *key = o->keys[k];
        const json_node *v = o->kids[k];
        if (!strcmp(key, "tools")) {
            json_write(tools, v);
        } else if (!strcmp(key, "messages")) {
            json_buf_str(msgs, "[");
            for (size_t i = 0; i < v->n; i++) {
                const json_node *m = v->kids[i];
                json_buf_str(msgs, i ? ",{" : "{");
                for (size_t f = 0; f < m->n; f++) {
                    json_buf_str(msgs, f ? "," : "");
                    json_buf_quote(msgs, m->keys[f], strlen(m->keys[f]));
                    json_buf_str(msgs, ":");
                    if (strcmp(m->keys[f], "tool_calls") || m->kids[f]->type != JSON_ARR) {
                        json_write(msgs, m->kids[f]);
                        continue;
                    }
                    json_buf_str(msgs, "[");
                    for (size_t c = 0; c < m->kids[f]->n; c++) {
                        const json_node *call = m->kids[f]->kids[c];
                        const json_node *fn = json_get(call, "function");
                        const json_node *args = json_get(fn, "arguments");
                        json_buf_str(msgs, c ? ",{\"id\":" : "{\"id\":");
                        json_write(msgs, json_get(call, "id"));
                        json_buf_str(msgs, ",\"type\":\"function\",\"function\":{\"name\":");
                        json_write(msgs, json_get(fn, "name"));
                        json_buf_str(msgs, ",\"arguments\":");
                        json_buf a = {0};
                        json_write(&a, args);
                        json_buf_quote(msgs, a.s, a.n);
                        free(a.s);
                        json_buf_str(msgs, "}}");
                    }
                    json_buf_str(msgs, "]");
                }
                json_buf_str(msgs, "}");
            }
            json_buf_str(msgs, "]");
        } else {
            if (rest->n) json_buf_str(rest, ",");
            json_buf_quote(rest, key, strlen(key));
            json_buf_str(rest, ":");
            json_write(rest, v);
        }
    }
}

/* A tool conversation of tests/data/templates/cases, sent in the wire
 * form, renders exactly as transformers rendered the case. */
static void check_case(const char *name, const char *cs, tool_format want_fmt) {
    char path[512];
    size_t tl = 0, vl = 0, el = 0;
    snprintf(path, sizeof path, TPL_DIR "/%s.jinja", name);
    char *tpl = test_read_file(path, &tl);
    snprintf(path, sizeof path, TPL_DIR "/cases/%s.%s.json", name, cs);
    char *vars = test_read_file(path, &vl);
    snprintf(path, sizeof path, TPL_DIR "/cases/%s.%s.out", name, cs);
    char *want = test_read_file(path, &el);
    assert_true(tpl && vars && want);
    bool native = false;
    assert_int_equal(tool_format_of_template(tpl, &native), want_fmt);
    assert_true(native);

    json_node *o = json_parse(vars, vl, NULL, 64, "case", NULL);
    assert_non_null(o);
    json_buf msgs = {0}, tools = {0}, rest = {0};
    wire_form(o, &msgs, &tools, &rest);
    tool_chat tc;
    cellm_error err;
    err_clear(&err);
    if (tool_chat_prepare(msgs.s, tools.s, true, want_fmt == TOOL_FMT_MISTRAL, &tc, &err))
        fail_msg("%s %s: %s", name, cs, err.msg);
    assert_non_null(tc.vars_json);
    json_buf all = {0};
    json_buf_str(&all, "{");
    json_buf_add(&all, rest.s, rest.n);
    json_buf_str(&all, ",");
    json_buf_add(&all, tc.vars_json + 1, tc.vars_len - 1);
    jinja_ctx ctx = {.vars_json = all.s, .vars_json_len = all.n};
    char *out = NULL;
    size_t out_len = 0;
    if (jinja_render(tpl, tl, &ctx, &out, &out_len, &err))
        fail_msg("%s %s: render: %s", name, cs, err.msg);
    if (out_len != el || memcmp(out, want, el)) {
        size_t d = 0;
        while (d < out_len && d < el && out[d] == want[d]) d++;
        fail_msg("%s %s: differs at byte %zu\n got:  %.80s\n want: %.80s", name, cs, d, out + d,
                 want + d);
    }
    free(out);
    free(all.s);
    tool_chat_free(&tc);
    free(msgs.s);
    free(tools.s);
    free(rest.s);
    json_free(o);
    free(tpl);
    free(vars);
    free(want);
}

static void test_asan_templates(void **st) {
    (void)st;
    check_case("qwen25", "tool_calls_gen", TOOL_FMT_HERMES);
    check_case("qwen25", "tool_calls_parallel_gen", TOOL_FMT_HERMES);
    check_case("qwen3", "tool_calls_gen", TOOL_FMT_HERMES);
    check_case("llama31", "tool_calls_gen", TOOL_FMT_LLAMA3);
    check_case("llama32", "tool_calls_gen", TOOL_FMT_LLAMA3);
    check_case("mistral", "tool_calls_gen", TOOL_FMT_MISTRAL);
    check_case("qwen25", "tools_gen", TOOL_FMT_HERMES);
}

/* Renders messages_json with tools by the template file `name` (the
 * library's preparation, then Jinja); the text, or NULL with *err set. */
static char *render_tools(const char *name, const char *msgs, bool short_ids, cellm_error *err) {
    char path[512];
    size_t tl = 0;
    snprintf(path, sizeof path, TPL_DIR "/%s.jinja", name);
    char *tpl = test_read_file(path, &tl);
    assert_non_null(tpl);
    tool_chat tc;
    err_clear(err);
    assert_int_equal(tool_chat_prepare(msgs, TOOLS, true, short_ids, &tc, err), CELLM_OK);
    jinja_ctx ctx = {.bos_token = "<s>",
                     .eos_token = "</s>",
                     .vars_json = tc.vars_json,
                     .vars_json_len = tc.vars_len};
    char *out = NULL;
    size_t out_len = 0;
    if (jinja_render(tpl, tl, &ctx, &out, &out_len, err)) out = NULL;
    tool_chat_free(&tc);
    free(tpl);
    return out;
}

/* Mistral's template takes only 9-character alphanumeric tool call ids;
 * the server's are call_ and 16 hex digits. With short_ids (what chat.c
 * asks for a Mistral template) a round trip with such ids renders, the
 * call and its result carry the same 9-character id, two calls keep
 * distinct ids, and an id that is 9 alphanumerics already is kept. */
static void test_asan_mistral_ids(void **st) {
    (void)st;
    const char *msgs =
        "[{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"id\":\"call_0123456789abcdef\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
        "{\"id\":\"Ab3456789\",\"type\":\"function\",\"function\":{\"name\":\"noop\","
        "\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_0123456789abcdef\",\"content\":\"18 C\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"Ab3456789\",\"content\":\"ok\"}]";
    cellm_error err;
    char *bad = render_tools("mistral", msgs, false, &err);
    assert_null(bad); /* the template's own rule, as the server met it */
    assert_non_null(strstr(err.msg, "length 9"));
    char *out = render_tools("mistral", msgs, true, &err);
    if (!out) fail_msg("render: %s", err.msg);
    const char *at = strstr(out, "\"id\": \"");
    assert_non_null(at);
    char id[10];
    memcpy(id, at + 7, 9);
    id[9] = '\0';
    assert_int_equal(at[16], '"');
    for (int i = 0; i < 9; i++) assert_true(isalnum((unsigned char)id[i]));
    assert_string_not_equal(id, "Ab3456789");
    char want[64];
    snprintf(want, sizeof want, "\"call_id\": \"%s\"", id);
    assert_non_null(strstr(out, want)); /* the result pairs with its call */
    assert_non_null(strstr(out, "\"id\": \"Ab3456789\""));
    assert_non_null(strstr(out, "\"call_id\": \"Ab3456789\""));
    assert_null(strstr(out, "call_0123456789abcdef"));
    free(out);
}

/* SmolLM2's template reads no tools: the generic rendering. */
static void test_asan_generic(void **st) {
    (void)st;
    size_t tl = 0;
    char *tpl = test_read_file(TPL_DIR "/smollm2.jinja", &tl);
    assert_non_null(tpl);
    bool native = true;
    assert_int_equal(tool_format_of_template(tpl, &native), TOOL_FMT_HERMES);
    assert_false(native);
    const char *msgs =
        "[{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
        "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": "
        "\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"18 C\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"sunny\"}]";
    tool_chat tc;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(tool_chat_prepare(msgs, TOOLS, false, false, &tc, &err), CELLM_OK);
    assert_null(tc.vars_json);
    assert_int_equal(tc.n_msgs, 4); /* system, user, assistant, one user turn of results */
    assert_string_equal(tc.msgs[0].role, "system");
    assert_non_null(strstr(tc.msgs[0].content, "<tools>\n{\"type\":\"function\",\"function\":"
                                               "{\"name\":\"get_weather\""));
    assert_non_null(strstr(tc.msgs[0].content, "<tool_call>"));
    assert_string_equal(tc.msgs[2].role, "assistant");
    assert_string_equal(tc.msgs[2].content, "<tool_call>\n{\"name\": \"get_weather\", "
                                            "\"arguments\": {\"city\":\"Paris\"}}\n</tool_call>");
    assert_string_equal(tc.msgs[3].role, "user");
    assert_string_equal(tc.msgs[3].content, "<tool_response>\n18 C\n</tool_response>\n"
                                            "<tool_response>\nsunny\n</tool_response>");
    tool_chat_free(&tc);
    /* A system message of the caller's keeps its text first. */
    assert_int_equal(tool_chat_prepare("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                       "{\"role\":\"user\",\"content\":\"hi\"}]",
                                       TOOLS, false, false, &tc, &err),
                     CELLM_OK);
    assert_int_equal(tc.n_msgs, 2);
    assert_true(!strncmp(tc.msgs[0].content, "Be brief.\n\nYou can call functions", 33));
    tool_chat_free(&tc);
    /* Malformed conversations name the message. */
    static const char *const bad[] = {
        "[]",
        "{}",
        "[{\"content\":\"x\"}]",
        "[{\"role\":\"user\",\"content\":5}]",
        "[{\"role\":\"assistant\",\"tool_calls\":{}}]",
        "[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}]",
        "[{\"role\":\"user\",\"content\":\"x\"}] trailing",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err_clear(&err);
        assert_int_equal(tool_chat_prepare(bad[i], NULL, true, false, &tc, &err),
                         CELLM_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "messages"));
    }
    free(tpl);
}

/* ---------------------------------------------------------- grammar */

/* 1: a whole sentence of the tool grammar; 0: a prefix; -1: neither. */
static int match_tools(const char *tools, const char *only, tool_format fmt, bool parallel,
                       const char *text) {
    char *gbnf = NULL;
    size_t n = 0;
    cellm_error err;
    err_clear(&err);
    if (tool_grammar_gbnf(tools, only, fmt, parallel, &gbnf, &n, &err))
        fail_msg("tool grammar: %s", err.msg);
    grammar *g = NULL;
    if (grammar_parse(gbnf, n, &g, &err)) fail_msg("grammar: %s\n%s", err.msg, gbnf);
    grammar_vocab *v = byte_vocab();
    int r = match(g, v, text);
    grammar_vocab_free(v);
    grammar_free(g);
    free(gbnf);
    return r;
}

static void test_asan_grammar(void **st) {
    (void)st;
    const char *call = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
    char text[512];
    snprintf(text, sizeof text, "<tool_call>\n%s\n</tool_call>", call);
    assert_int_equal(match_tools(TOOLS, NULL, TOOL_FMT_HERMES, false, text), 1);
    assert_int_equal(match_tools(TOOLS, "get_weather", TOOL_FMT_HERMES, false, text), 1);
    assert_int_equal(match_tools(TOOLS, "noop", TOOL_FMT_HERMES, false, text), -1);
    /* One call only, unless parallel. */
    snprintf(text, sizeof text, "<tool_call>\n%s\n</tool_call>\n<tool_call>\n%s\n</tool_call>",
             call, "{\"name\": \"noop\", \"arguments\": {}}");
    assert_int_equal(match_tools(TOOLS, NULL, TOOL_FMT_HERMES, false, text), -1);
    assert_int_equal(match_tools(TOOLS, NULL, TOOL_FMT_HERMES, true, text), 1);
    /* The arguments follow the schema: city is required, a string. */
    assert_int_equal(match_tools(TOOLS, NULL, TOOL_FMT_HERMES, false,
                                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}"),
                     -1);
    assert_int_equal(
        match_tools(TOOLS, NULL, TOOL_FMT_HERMES, false,
                    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3"),
        -1);
    assert_int_equal(
        match_tools(TOOLS, NULL, TOOL_FMT_HERMES, false, "<tool_call>\n{\"name\": \"get_"), 0);
    /* The other families' formats. */
    assert_int_equal(
        match_tools(TOOLS, NULL, TOOL_FMT_LLAMA3, false,
                    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
        1);
    snprintf(text, sizeof text, "[TOOL_CALLS] [%s, {\"name\": \"noop\", \"arguments\": {}}]", call);
    assert_int_equal(match_tools(TOOLS, NULL, TOOL_FMT_MISTRAL, true, text), 1);
    snprintf(text, sizeof text, "[%s]", call);
    assert_int_equal(match_tools(TOOLS, NULL, TOOL_FMT_JSON, true, text), 1);
    assert_int_equal(match_tools(TOOLS, NULL, TOOL_FMT_JSON, false, call), 1);
    /* What the grammar makes, the parser reads back. */
    expect(call, TOOLS, "{\"content\":null,\"tool_calls\":[" WEATHER_PARIS "]}");

    /* Hostile tool lists: refused with a message, never a crash. */
    json_buf many = {0};
    json_buf_str(&many, "[");
    for (int i = 0; i < 1000; i++) {
        char one[128];
        snprintf(one, sizeof one, "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
                 i ? "," : "", i);
        json_buf_str(&many, one);
    }
    json_buf_str(&many, "]");
    static const struct {
        const char *tools, *only, *word;
    } bad[] = {
        {NULL, NULL, "at most 128"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"nope\"}}}"
         "]",
         NULL, "tools[0] (f) parameters"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"$ref\":\"#/"
         "x\"}}}]",
         NULL, "$ref"},
        {"[{\"type\":\"function\",\"function\":{\"parameters\":{}}}]", NULL, "name"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"a\\\"b\"}}]", NULL, "name"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":5}}]", NULL,
         "parameters"},
        {"[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]", NULL, "type"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\","
         "\"function\":{\"name\":\"f\"}}]",
         NULL, "repeats"},
        {"[]", NULL, "no tools"},
        {TOOLS, "missing", "missing"},
        {"[", NULL, "tools"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *gbnf = NULL;
        size_t n = 0;
        cellm_error err;
        err_clear(&err);
        cellm_status s = tool_grammar_gbnf(bad[i].tools ? bad[i].tools : many.s, bad[i].only,
                                           TOOL_FMT_HERMES, true, &gbnf, &n, &err);
        assert_int_equal(s, CELLM_ERR_INVALID_ARG);
        assert_null(gbnf);
        if (!strstr(err.msg, bad[i].word))
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, bad[i].word);
    }
    free(many.s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asan_parse_formats), cmocka_unit_test(test_asan_parse_malformed),
        cmocka_unit_test(test_asan_templates),     cmocka_unit_test(test_asan_generic),
        cmocka_unit_test(test_asan_grammar),       cmocka_unit_test(test_asan_mistral_ids),
    };
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
