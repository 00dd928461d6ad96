/* test_jinja.c — the chat-template interpreter: byte-for-byte parity with
 * transformers' apply_chat_template on real models' templates and
 * conversations (fixtures from scripts/gen_template_fixtures.py), SmolLM2's
 * template read from its GGUF file, the struct API, and errors: each names
 * the construct and byte offset, and every limit holds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/jinja.h"
#include "test_common.h"

#define TPL_DIR CELLM_SOURCE_DIR "/tests/data/templates"

static char *read_file(const char *path, size_t *len) {
    char *p = test_read_file(path, len);
    assert_non_null(p);
    return p;
}

static void test_parity(void **st) {
    (void)st;
    size_t n;
    char *index = read_file(TPL_DIR "/index.txt", &n);
    assert_non_null(index);
    int total = 0, same = 0, errors_ok = 0;
    char *save = NULL;
    for (char *line = strtok_r(index, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[64], cs[64], kind[8], path[512];
        assert_int_equal(sscanf(line, "%63s %63s %7s", name, cs, kind), 3);
        size_t tl, vl, el;
        snprintf(path, sizeof path, TPL_DIR "/%s.jinja", name);
        char *tpl = read_file(path, &tl);
        snprintf(path, sizeof path, TPL_DIR "/cases/%s.%s.json", name, cs);
        char *vars = read_file(path, &vl);
        snprintf(path, sizeof path, TPL_DIR "/cases/%s.%s.%s", name, cs, kind);
        char *want = read_file(path, &el);
        assert_true(tpl && vars && want);
        jinja_ctx ctx = {.vars_json = vars, .vars_json_len = vl};
        char *out;
        size_t out_len;
        cellm_error err;
        cellm_status s = jinja_render(tpl, tl, &ctx, &out, &out_len, &err);
        total++;
        if (!strcmp(kind, "out")) {
            if (s != CELLM_OK) {
                print_message("%s %s: error: %s\n", name, cs, err.msg);
            } else if (out_len != el || memcmp(out, want, el) != 0) {
                size_t d = 0;
                while (d < out_len && d < el && out[d] == want[d]) d++;
                print_message("%s %s: differs at byte %zu (got %zu bytes, want %zu)\n  got:  "
                              "%.60s\n  want: %.60s\n",
                              name, cs, d, out_len, el, out + (d > 20 ? d - 20 : 0),
                              want + (d > 20 ? d - 20 : 0));
            } else {
                same++;
            }
        } else if (!strcmp(kind, "err")) {
            /* raise_exception: its message reaches the caller. */
            if (s == CELLM_ERR_INVALID_ARG && strstr(err.msg, want))
                errors_ok++;
            else
                print_message("%s %s: want error '%s', got %d '%s'\n", name, cs, want, s,
                              s ? err.msg : "");
        } else {
            /* transformers failed otherwise (an undefined value used, a type
             * error): a run-time error here, with its own message. */
            if (s == CELLM_ERR_FORMAT)
                errors_ok++;
            else
                print_message("%s %s: want a run-time error (%s), got %d '%s'\n", name, cs, want, s,
                              s ? err.msg : "");
        }
        free(out);
        free(tpl);
        free(vars);
        free(want);
    }
    free(index);
    print_message("parity: %d of %d cases identical, %d expected errors raised\n", same, total,
                  errors_ok);
    assert_int_equal(same + errors_ok, total);
    assert_true(total >= 100);
}

/* The template in the real GGUF file is the one the fixtures were made from. */
static void test_smollm2_gguf(void **st) {
    (void)st;
    char path[1024];
    gguf_file *f;
    assert_int_equal(gguf_open(test_model_path("smollm2-135m", path, sizeof path), &f, NULL),
                     CELLM_OK);
    gguf_str tpl;
    assert_true(gguf_get_str(f, "tokenizer.chat_template", &tpl));
    size_t fl;
    char *fix = read_file(TPL_DIR "/smollm2.jinja", &fl);
    assert_non_null(fix);
    assert_int_equal(tpl.len, fl);
    assert_memory_equal(tpl.ptr, fix, fl);
    jinja_message msgs[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
    jinja_ctx ctx = {.messages = msgs, .n_messages = 3, .add_generation_prompt = true};
    char *out;
    size_t n;
    assert_int_equal(jinja_render(tpl.ptr, (size_t)tpl.len, &ctx, &out, &n, NULL), CELLM_OK);
    assert_string_equal(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                             "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?"
                             "<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    free(fix);
    gguf_close(f);
}

/* Renders `tpl` with two fixed messages; returns the status, output in out. */
static cellm_status render(const char *tpl, const jinja_limits *lim, char **out, cellm_error *err) {
    jinja_message msgs[] = {{"system", "S"}, {"user", "U"}};
    jinja_ctx ctx = {.messages = msgs, .n_messages = 2, .bos_token = "<s>"};
    if (lim) ctx.limits = *lim;
    size_t n;
    return jinja_render(tpl, strlen(tpl), &ctx, out, &n, err);
}

static void expect_ok(const char *tpl, const char *want) {
    char *out;
    cellm_error err = {0};
    cellm_status s = render(tpl, NULL, &out, &err);
    if (s != CELLM_OK) print_message("%s: %s\n", tpl, err.msg);
    assert_int_equal(s, CELLM_OK);
    assert_string_equal(out, want);
    free(out);
}

static void expect_err(const char *tpl, const jinja_limits *lim, cellm_status code,
                       const char *msg) {
    char *out = (char *)1;
    cellm_error err = {0};
    cellm_status s = render(tpl, lim, &out, &err);
    if (s != code || !strstr(err.msg, msg))
        print_message("%.60s: got %d '%s', want %d '%s'\n", tpl, s, err.msg, code, msg);
    assert_int_equal(s, code);
    assert_null(out);
    assert_non_null(strstr(err.msg, msg));
}

static void test_struct_api(void **st) {
    (void)st;
    expect_ok("{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m['content'] }}]{% endfor %}"
              "{{ eos_token is defined }}{{ add_generation_prompt }}",
              "<s>[system:S][user:U]FalseFalse");
    /* vars_json replaces a variable given in the struct. */
    jinja_message msgs[] = {{"user", NULL}};
    const char *vars =
        "{\"add_generation_prompt\": true, \"tools\": [{\"n\": \"\\u00e9\\ud83d\\ude00\"}]}";
    jinja_ctx ctx = {
        .messages = msgs, .n_messages = 1, .vars_json = vars, .vars_json_len = strlen(vars)};
    /* A NULL content is no content key (transformers drops None values). */
    const char *tpl = "{{ messages[0].content is defined }} {{ add_generation_prompt }} "
                      "{{ tools | tojson }}";
    char *out;
    size_t n;
    assert_int_equal(jinja_render(tpl, strlen(tpl), &ctx, &out, &n, NULL), CELLM_OK);
    assert_string_equal(out, "False True [{\"n\": \"\xc3\xa9\xf0\x9f\x98\x80\"}]");
    free(out);
    /* What apply_chat_template adds: tools and documents are none unless
     * given; None-valued keys of a message are dropped; its reasoning shows
     * as thinking and reasoning_content. */
    vars = "{\"messages\": [{\"role\": \"assistant\", \"content\": null, \"reasoning\": \"r\","
           " \"tool_calls\": null, \"thinking\": null}]}";
    ctx = (jinja_ctx){.vars_json = vars, .vars_json_len = strlen(vars)};
    tpl = "{{ tools }} {{ documents }} {{ messages[0] }}";
    assert_int_equal(jinja_render(tpl, strlen(tpl), &ctx, &out, &n, NULL), CELLM_OK);
    assert_string_equal(out, "None None {'thinking': 'r', 'role': 'assistant', 'reasoning': 'r', "
                             "'reasoning_content': 'r'}");
    free(out);
    /* Whitespace control and \r\n newlines. */
    expect_ok("a  \r\n  {%- if true -%}  \r\n b {%+ if 1 %}c{% endif %}\r\n{% endif %}\r\nz\r\n",
              "ab cz");
    expect_ok("x\n    {% if true %}\n  y\n    {% endif %}\nz", "x\n  y\nz");
}

static void test_errors(void **st) {
    (void)st;
    expect_err("abc {{ messages", NULL, CELLM_ERR_FORMAT, "unterminated '{{' tag (byte 4, line 1)");
    expect_err("ab\n{% if true %}x", NULL, CELLM_ERR_FORMAT, "'if' is never closed");
    expect_err("{% for m in messages %}{% endif %}", NULL, CELLM_ERR_FORMAT,
               "misplaced tag 'endif'");
    expect_err("{# open", NULL, CELLM_ERR_FORMAT, "unterminated comment");
    expect_err("{{ 'abc }}", NULL, CELLM_ERR_FORMAT, "unterminated string literal (byte 3");
    expect_err("{{ x | nope }}", NULL, CELLM_ERR_UNSUPPORTED, "unknown filter 'nope' (byte 7");
    expect_err("{{ x is nope }}", NULL, CELLM_ERR_UNSUPPORTED, "unknown test 'nope'");
    expect_err("{% include 'x' %}", NULL, CELLM_ERR_UNSUPPORTED, "'include' tag is not supported");
    expect_err("{% frobnicate %}", NULL, CELLM_ERR_FORMAT, "unknown or misplaced tag 'frobnicate'");
    expect_err("{{ 1 + }}", NULL, CELLM_ERR_FORMAT, "expected an expression, found '}}'");
    expect_err("{{ 'a' + 1 }}", NULL, CELLM_ERR_FORMAT,
               "unsupported operand types for +: str and int");
    expect_err("{{ x.y }}", NULL, CELLM_ERR_FORMAT, "undefined value has no attribute 'y'");
    expect_err("{{ messages[0].content.frob() }}", NULL, CELLM_ERR_FORMAT,
               "call of an undefined value");
    expect_err("{{ 1 / 0 }}", NULL, CELLM_ERR_FORMAT, "division by zero");
    expect_err("{% break %}", NULL, CELLM_ERR_FORMAT, "'break' outside a for loop");
    expect_err("{% set x.y = 1 %}", NULL, CELLM_ERR_FORMAT, "only of a namespace");
    expect_err("{{ messages | map(attribute='role') }}", NULL, CELLM_ERR_UNSUPPORTED,
               "printing a generator (what map, select, reverse... return) is not supported; "
               "add '| list' (byte 0, line 1)");
    expect_err("{{ [1] | select | length }}", NULL, CELLM_ERR_FORMAT,
               "a generator value has no length");
    expect_err("{{ [1] | select | last }}", NULL, CELLM_ERR_FORMAT, "generator is not reversible");
    expect_err("{{ '{:>8}'.format(1) }}", NULL, CELLM_ERR_UNSUPPORTED,
               "format specs ('{:>8}') are not supported");
    expect_err("{{ '{0.x}'.format(1) }}", NULL, CELLM_ERR_UNSUPPORTED, "field access ('{0.x}')");
    expect_err("{{ '{}{0}'.format(1) }}", NULL, CELLM_ERR_FORMAT, "cannot mix automatic");
    expect_err("{{ '{} {}'.format(1) }}", NULL, CELLM_ERR_FORMAT,
               "replacement index 1 out of range");
    expect_err("{{ '{a}'.format(1) }}", NULL, CELLM_ERR_FORMAT, "no argument named 'a'");
    expect_err("{{ 'a}'.format(1) }}", NULL, CELLM_ERR_FORMAT, "single '}'");
    /* raise_exception's message reaches the caller. */
    expect_err("\n\n   {{ raise_exception('Roles must alternate!') }}", NULL, CELLM_ERR_INVALID_ARG,
               "raise_exception: Roles must alternate! (byte 8, line 3)");
    /* Offsets are the caller's, even with \r\n newlines. */
    expect_err("\r\n\r\n{{ x | nope }}", NULL, CELLM_ERR_UNSUPPORTED, "(byte 11, line 3)");
    /* Bad JSON variables. */
    jinja_ctx ctx = {.vars_json = "{\"a\": [1, 2", .vars_json_len = 11};
    char *out;
    size_t n;
    cellm_error err;
    assert_int_equal(jinja_render("x", 1, &ctx, &out, &n, &err), CELLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "vars_json"));
    assert_int_equal(jinja_render(NULL, 1, &ctx, &out, &n, &err), CELLM_ERR_INVALID_ARG);
}

static char *repeat_str(const char *a, int n, const char *mid, const char *b) {
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid);
    char *s = malloc(la * (size_t)n + lm + lb * (size_t)n + 1), *p = s;
    for (int i = 0; i < n; i++, p += la) memcpy(p, a, la);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lb) memcpy(p, b, lb);
    *p = '\0';
    return s;
}

static void test_limits(void **st) {
    (void)st;
    /* Deep nesting of expressions and of statements is refused, not recursed. */
    char *deep = repeat_str("(", 100000, "1", ")");
    char *t = malloc(strlen(deep) + 8);
    sprintf(t, "{{ %s }}", deep);
    expect_err(t, NULL, CELLM_ERR_NO_MEMORY, "nested deeper than 128");
    free(t);
    free(deep);
    deep = repeat_str("{% if true %}", 50000, "x", "{% endif %}");
    expect_err(deep, NULL, CELLM_ERR_NO_MEMORY, "nested deeper than 128");
    free(deep);
    deep = repeat_str("[", 50000, "", "]");
    t = malloc(strlen(deep) + 8);
    sprintf(t, "{{ %s }}", deep);
    expect_err(t, NULL, CELLM_ERR_NO_MEMORY, "nested deeper");
    free(t);
    free(deep);
    /* Long left-nested chains are bounded too; long elif chains are fine. */
    deep = repeat_str("1 + ", 20000, "1", "");
    t = malloc(strlen(deep) + 8);
    sprintf(t, "{{ %s }}", deep);
    expect_err(t, NULL, CELLM_ERR_NO_MEMORY, "expression nested deeper than 512");
    free(t);
    free(deep);
    deep = repeat_str("{% elif false %}", 20000, "{% else %}E{% endif %}", "");
    t = malloc(strlen(deep) + 32);
    sprintf(t, "{%% if false %%}%s", deep);
    expect_ok(t, "E");
    free(t);
    free(deep);
    expect_err("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}"
               "{% endfor %}{{ ns.v | tojson }}",
               NULL, CELLM_ERR_NO_MEMORY, "value nested deeper than 128");
    /* Unbounded recursion through macros. */
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, CELLM_ERR_NO_MEMORY,
               "macro calls nested deeper than 32");
    /* Work, memory and output. */
    expect_err("{% set r = range(10000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}",
               NULL, CELLM_ERR_NO_MEMORY, "more than 10000000 steps");
    expect_err(
        "{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        NULL, CELLM_ERR_NO_MEMORY, "bytes of working memory");
    expect_err("{{ 'x' * 1000000000000 }}", NULL, CELLM_ERR_NO_MEMORY, "repetition too large");
    jinja_limits lim = {.max_output = 1000};
    expect_err("{% for i in range(1000) %}0123456789{% endfor %}", &lim, CELLM_ERR_NO_MEMORY,
               "exceeds 1000 bytes");
    expect_ok(
        "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
        "54321");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity),     cmocka_unit_test(test_smollm2_gguf),
        cmocka_unit_test(test_struct_api), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
