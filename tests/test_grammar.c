/*
 * test_grammar.c — structured output: the GBNF parser (what it accepts,
 * what it refuses and how it says so), matching text, the token mask
 * against a brute-force check on a small vocabulary (every token tried
 * from a fresh state), the JSON grammar and the JSON-Schema compiler; and
 * on SmolLM2, constrained generation whose every output is valid JSON.
 *
 * The unit cases are cheap and carry sanitizer names (test_tsan_*,
 * test_asan_*); the real-model case runs in release builds only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cellm.h"
#include "text/grammar.h"
#include "text/schema.h"
#include "grammar_rig.h"
#include "test_common.h"

static grammar *compile(const char *text) {
    grammar *g = NULL;
    cellm_error err;
    err_clear(&err);
    cellm_status st = grammar_parse(text, strlen(text), &g, &err);
    if (st != CELLM_OK) fail_msg("grammar refused: %s\n%s", err.msg, text);
    return g;
}

static void test_tsan_parse_and_match(void **state) {
    (void)state;
    grammar_vocab *v = byte_vocab();
    struct {
        const char *gbnf, *text;
        int want;
    } cases[] = {
        {"root ::= \"ab\" | \"c\"", "ab", 1},
        {"root ::= \"ab\" | \"c\"", "a", 0},
        {"root ::= \"ab\" | \"c\"", "ac", -1},
        {"root ::= [a-c]+ \"!\"", "abcab!", 1},
        {"root ::= [a-c]+ \"!\"", "!", -1},
        {"root ::= [^a-c]*", "xyz", 1},
        {"root ::= [^a-c]*", "xaz", -1},
        {"root ::= x{2,3}\nx ::= \"q\"", "qq", 1},
        {"root ::= x{2,3}\nx ::= \"q\"", "qqq", 1},
        {"root ::= x{2,3}\nx ::= \"q\"", "qqqq", -1},
        {"root ::= \"a\"{2,}", "aaaaa", 1},
        {"root ::= \"a\"{2,}", "a", 0},
        {"root ::= (\"x\" | \"y\")? \"z\"", "z", 1},
        {"root ::= (\"x\" | \"y\")? \"z\"", "yz", 1},
        {"root ::= . \"\\n\" [\\x41-\\x42]", "\x7f\nB", 1},
        {"# comment\nroot ::= a b # trailing\na ::= \"1\"\nb ::= \"2\"\n  | \"3\"", "13", 1},
        {"root ::= (\n  \"(\" root \")\"\n  | \"\"\n)", "((()))", 1},
        {"root ::= (\n  \"(\" root \")\"\n  | \"\"\n)", "(()", 0},
        {"root ::= \"\\u00e9\" [\\u0100-\\u017f]", "\xc3\xa9\xc5\x81", 1},
        {"root ::= \"\\\"\\\\\"", "\"\\", 1},
        /* No overlong forms: E0 81 AE would spell 'n'. */
        {"root ::= \"n\"", "\xe0\x81\xae", -1},
        {"root ::= \"n\"", "\xe0", -1},
        {"root ::= [^a]", "\xed\xa0\x80", -1},
        {"root ::= [^a]", "\xf4\x90", -1},
        {"root ::= [^a]", "\xf0\x9f\x98\x80", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        grammar *g = compile(cases[i].gbnf);
        int got = match(g, v, cases[i].text);
        if (got != cases[i].want)
            fail_msg("case %zu: '%s' on %s: got %d, want %d", i, cases[i].text, cases[i].gbnf, got,
                     cases[i].want);
        grammar_free(g);
    }
    grammar_vocab_free(v);
}

static void test_asan_refusals(void **state) {
    (void)state;
    struct {
        const char *gbnf, *says;
    } cases[] = {
        {"root ::= root \"a\" | \"b\"", "left-recursive"},
        {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left-recursive"},
        {"root ::= x? root \"a\" | \"b\"\nx ::= \"y\"", "left-recursive"},
        {"root ::= \"a\" loop\nloop ::= \"b\" loop", "never finish"},
        {"root ::= [^\\x00-\\U0010FFFF]", "never finish"},
        {"root ::= undefined", "'undefined' is used but not defined"},
        {"other ::= \"a\"", "no rule named 'root'"},
        {"root ::= \"abc", "unterminated string"},
        {"root ::= [abc", "unterminated character class"},
        {"root ::= [z-a]", "out of order"},
        {"root ::= \"a\"{3,1}", "n < m"},
        {"root ::= \"a\"{99999}", "too large"},
        {"root ::= * \"a\"", "nothing to repeat"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root = \"a\"", "expected '::='"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= \"\xff\"", "invalid UTF-8"},
        {"root ::= \"a\"{1000}{1000}", "too large"},
        {"", "no rule named 'root'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        grammar *g = NULL;
        cellm_error err;
        err_clear(&err);
        cellm_status st = grammar_parse(cases[i].gbnf, strlen(cases[i].gbnf), &g, &err);
        if (st != CELLM_ERR_FORMAT || g || !strstr(err.msg, cases[i].says))
            fail_msg("case %zu (%s): status %d, message '%s', want '%s'", i, cases[i].gbnf, st,
                     err.msg, cases[i].says);
    }
    /* Deep groups are refused, not a stack overflow. */
    char deep[4096] = "root ::= ";
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    grammar *g = NULL;
    assert_int_equal(grammar_parse(deep, strlen(deep), &g, NULL), CELLM_ERR_FORMAT);
    /* The error names the place. */
    cellm_error err;
    err_clear(&err);
    assert_int_equal(grammar_parse("root ::= \"a\"\nx ::= )", 20, &g, &err), CELLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "line 2"));
}

/* Deep nesting at run time stops at the stack bound: the state never
 * grows past it, and text deeper than it is simply not allowed. */
static void test_asan_depth_bound(void **state) {
    (void)state;
    grammar_vocab *v = byte_vocab();
    grammar *g = compile("root ::= \"(\" root \")\" | \"x\"");
    grammar_state *s = NULL;
    assert_int_equal(grammar_state_create(g, v, &s, NULL), CELLM_OK);
    int depth = 0;
    while (depth < 4 * GRAMMAR_MAX_DEPTH && grammar_state_accept(s, "(", 1)) depth++;
    assert_true(depth > 100);
    assert_true(depth < 2 * GRAMMAR_MAX_DEPTH);
    grammar_state_free(s);
    grammar_free(g);
    grammar_vocab_free(v);
}

/* ------------------------------------------------- mask vs brute force */

#define SV_MAX 400

typedef struct small_vocab {
    char text[SV_MAX][8];
    const char *pieces[SV_MAX];
    size_t lens[SV_MAX];
    int32_t n;
} small_vocab;

static void sv_add(small_vocab *sv, const char *s, size_t n) {
    if (sv->n >= SV_MAX) return;
    memcpy(sv->text[sv->n], s, n);
    sv->pieces[sv->n] = sv->text[sv->n];
    sv->lens[sv->n] = n;
    sv->n++;
}

/* Every string of 1 and 2 characters over a small alphabet, some of 3,
 * an empty token, a duplicate, and the bytes of 'é' and '€' alone and
 * split across tokens. */
static void sv_build(small_vocab *sv) {
    memset(sv, 0, sizeof *sv);
    const char *alpha = "ab1{}\":, [-.]e";
    size_t na = strlen(alpha);
    for (size_t i = 0; i < na; i++) sv_add(sv, alpha + i, 1);
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < na; j++) {
            char t[2] = {alpha[i], alpha[j]};
            sv_add(sv, t, 2);
        }
    const char *more[] = {"abc",      "\"a\"", "{\"",  "\":",          "111",          "aa",
                          "\xc3\xa9", "\xc3",  "\xa9", "\xe2\x82\xac", "\xe2",         "\x82\xac",
                          "\xe2\x82", "a\xc3", "\xe0", "\x81\xae",     "\xe0\x81\xae", "\xed\xa0"};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) sv_add(sv, more[i], strlen(more[i]));
    sv_add(sv, "", 0);
}

static bool brute_allows(const grammar *g, const grammar_vocab *v, const char *prefix, size_t np,
                         const char *tok, size_t nt) {
    if (nt == 0) return false;
    grammar_state *s = NULL;
    assert_int_equal(grammar_state_create(g, v, &s, NULL), CELLM_OK);
    assert_true(grammar_state_accept(s, prefix, np));
    bool ok = grammar_state_accept(s, tok, nt);
    grammar_state_free(s);
    return ok;
}

static void check_masks(const char *gbnf, uint32_t seed, int steps) {
    small_vocab *sv = malloc(sizeof *sv);
    sv_build(sv);
    grammar_vocab *v = NULL;
    assert_int_equal(grammar_vocab_create(sv->pieces, sv->lens, sv->n, &v, NULL), CELLM_OK);
    grammar *g = compile(gbnf);
    grammar_state *s = NULL;
    assert_int_equal(grammar_state_create(g, v, &s, NULL), CELLM_OK);
    char text[512];
    size_t nt = 0;
    for (int step = 0; step < steps; step++) {
        const uint32_t *bits = grammar_state_mask(s);
        int32_t allowed[SV_MAX], na = 0;
        for (int32_t t = 0; t < sv->n; t++) {
            bool m = (bits[t / 32] >> (t % 32)) & 1;
            bool b = brute_allows(g, v, text, nt, sv->pieces[t], sv->lens[t]);
            if (m != b)
                fail_msg("%s after '%.*s': token '%.*s' mask %d brute %d", gbnf, (int)nt, text,
                         (int)sv->lens[t], sv->pieces[t], m, b);
            if (m) allowed[na++] = t;
        }
        if (na == 0 || nt + 8 >= sizeof text) break;
        seed = seed * 1664525u + 1013904223u;
        int32_t t = allowed[(seed >> 8) % (uint32_t)na];
        assert_true(grammar_state_accept(s, sv->pieces[t], sv->lens[t]));
        memcpy(text + nt, sv->pieces[t], sv->lens[t]);
        nt += sv->lens[t];
    }
    grammar_state_free(s);
    grammar_free(g);
    grammar_vocab_free(v);
    free(sv);
}

static void test_tsan_mask_brute_force(void **state) {
    (void)state;
    const char *grammars[] = {
        "root ::= \"{\" ( pair ( \",\" pair )* )? \"}\"\npair ::= \"\\\"\" [ab]* \"\\\":\" "
        "[0-9]+",
        "root ::= ( [a-b] | \"1\" )+ ( \"\\u00e9\" | \"\\u20ac\" )* \"]\"",
        "root ::= [^{}]{1,6} \"}\"",
        "root ::= x+\nx ::= \"ab\" | \"a\" | \"b1\" | [\\u00e0-\\u00ff]",
        "root ::= \"[\" ( v ( \", \" v )* )? \"]\"\nv ::= \"1\" | \"\\\"a\\\"\" | root",
    };
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++)
        for (uint32_t seed = 1; seed <= 3; seed++) check_masks(grammars[i], seed * 77u + 5u, 30);
}

static void test_asan_json_object(void **state) {
    (void)state;
    grammar_vocab *v = byte_vocab();
    grammar *g = compile(grammar_json_object_gbnf);
    const char *good[] = {
        "{}",
        "{\"a\": 1}",
        "{\"a\":[1, -2.5e3, true, null, \"x\\n\\u00e9\"], \"b\": {\"c\": {}}}",
        "{ \"k\" : \"v\" }",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_int_equal(match(g, v, good[i]), 1);
    const char *bad[] = {"[]",       "{a:1}", "{\"a\":01}", "{\"a\":1,}", "{\"a\":\"\x01\"}",
                         "{\"a\" 1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(match(g, v, bad[i]), -1);
    assert_int_equal(match(g, v, "{\"a\": [1,"), 0);
    grammar_free(g);
    grammar_vocab_free(v);
}

/* ------------------------------------------------------------ schemas */

static grammar *from_schema(const char *schema) {
    char *gbnf = NULL;
    size_t n = 0;
    cellm_error err;
    err_clear(&err);
    if (schema_to_gbnf(schema, strlen(schema), &gbnf, &n, &err) != CELLM_OK)
        fail_msg("schema refused: %s\n%s", err.msg, schema);
    grammar *g = NULL;
    if (grammar_parse(gbnf, n, &g, &err) != CELLM_OK)
        fail_msg("schema grammar refused: %s\n%s", err.msg, gbnf);
    free(gbnf);
    return g;
}

static void test_asan_schema(void **state) {
    (void)state;
    grammar_vocab *v = byte_vocab();
    struct {
        const char *schema, *text;
        int want;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"a\"],\"additionalProperties\":false}",
         "{\"a\": 12, \"b\": \"x\"}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"a\"]}",
         "{\"a\":-3}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"a\"]}",
         "{\"b\":\"x\"}", -1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"b\"]}",
         "{\"b\":\"x\"}", 1},
        {"{\"enum\":[\"red\",\"green\",1,null]}", "\"green\"", 1},
        {"{\"enum\":[\"red\",\"green\",1,null]}", "\"blue\"", -1},
        {"{\"const\":{\"k\":[1,2]}}", "{\"k\":[1,2]}", 1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}",
         "[true, false]", 1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}",
         "[true]", -1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}",
         "[true,true,true,true]", -1},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"ab\"", 1},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"abcd\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}", "\"AB-12\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}", "\"Ab\"", -1},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":7}", "6", 1},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":7}", "8", -1},
        {"{\"type\":\"integer\",\"minimum\":0}", "-1", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.25", 1},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"string\"}]}", "null", 1},
        {"{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"string\"}]}", "3", -1},
        {"{\"type\":[\"integer\",\"null\"]}", "null", 1},
        {"{\"$ref\":\"#/$defs/n\",\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":{"
         "\"$ref\":\"#/$defs/n\"}}}}}",
         "{\"next\": {\"next\": {}}}", 1},
        {"{\"type\":\"object\"}", "{\"any\": [1, {\"x\": null}]}", 1},
        {"true", "[1]", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        grammar *g = from_schema(cases[i].schema);
        int got = match(g, v, cases[i].text);
        if (got != cases[i].want)
            fail_msg("case %zu: '%s' on %s: got %d, want %d", i, cases[i].text, cases[i].schema,
                     got, cases[i].want);
        grammar_free(g);
    }
    /* Integer bounds are exact: every integer near and between them. */
    const int bounds[][2] = {{-23, 1000}, {0, 9}, {7, 7}, {-120, -95}, {99, 1001}, {-5, 5}};
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        char schema[128], num[32];
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}",
                 bounds[i][0], bounds[i][1]);
        grammar *g = from_schema(schema);
        for (int x = bounds[i][0] - 30; x <= bounds[i][1] + 30; x++) {
            snprintf(num, sizeof num, "%d", x);
            int want = x >= bounds[i][0] && x <= bounds[i][1];
            if ((match(g, v, num) == 1) != want) fail_msg("%s: %d", schema, x);
        }
        grammar_free(g);
    }
    grammar_vocab_free(v);
    /* Refusals name the problem. */
    struct {
        const char *schema, *says;
    } bad[] = {
        {"{\"type\":\"object\"", "closing bracket at byte 16"},
        {"{\"type\":\"thing\"}", "unknown type 'thing'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}", "'x' is not in"},
        {"false", "matches nothing"},
        {"{\"type\":\"string\",\"pattern\":\"a\\\\1\"}", "not supported"},
        {"{\"type\":\"array\",\"minItems\":5,\"maxItems\":2}", "minItems"},
        {"{\"enum\":[]}", "enum"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *gbnf = NULL;
        size_t n = 0;
        cellm_error err;
        err_clear(&err);
        cellm_status st = schema_to_gbnf(bad[i].schema, strlen(bad[i].schema), &gbnf, &n, &err);
        if (st != CELLM_ERR_FORMAT || gbnf || !strstr(err.msg, bad[i].says))
            fail_msg("bad %zu (%s): status %d, '%s', want '%s'", i, bad[i].schema, st, err.msg,
                     bad[i].says);
    }
    /* A $ref that only refers to itself is left recursion: refused by the
     * grammar compiler through the public call. */
    cellm_grammar *h = NULL;
    const char *loop = "{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}}}";
    assert_int_equal(cellm_grammar_from_json_schema(loop, strlen(loop), &h), CELLM_ERR_FORMAT);
    assert_null(h);
    assert_non_null(strstr(cellm_last_error(), "left-recursive"));
}

/* ------------------------------------------------- a real model, JSON */

/* A JSON syntax check of its own (not the grammar's): 1 valid, 0 not. */
static const char *jv_value(const char *p, int depth);

static const char *jv_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    return p;
}

static const char *jv_string(const char *p) {
    if (*p++ != '"') return NULL;
    while (*p && *p != '"') {
        if ((unsigned char)*p < 0x20) return NULL;
        if (*p == '\\') {
            p++;
            if (!*p || !strchr("\"\\/bfnrtu", *p)) return NULL;
        }
        p++;
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *jv_value(const char *p, int depth) {
    if (depth > 100) return NULL;
    p = jv_ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        bool obj = *p == '{';
        p = jv_ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (obj) {
                p = jv_string(jv_ws(p));
                if (!p) return NULL;
                p = jv_ws(p);
                if (*p++ != ':') return NULL;
            }
            p = jv_value(p, depth + 1);
            if (!p) return NULL;
            p = jv_ws(p);
            if (*p == ',') {
                p++;
                continue;
            }
            return *p == close ? p + 1 : NULL;
        }
    }
    if (*p == '"') return jv_string(p);
    if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    const char *b = p;
    if (*p == '-') p++;
    while ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' ||
           *p == '-')
        p++;
    return p > b ? p : NULL;
}

static bool json_valid(const char *s) {
    const char *e = jv_value(s, 0);
    return e && *jv_ws(e) == '\0';
}

typedef struct gen_out {
    char text[4096];
    size_t n;
} gen_out;

static void on_piece(const char *piece, size_t len, void *user) {
    gen_out *o = user;
    if (o->n + len < sizeof o->text) {
        memcpy(o->text + o->n, piece, len);
        o->n += len;
        o->text[o->n] = '\0';
    }
}

#define PERSON_SCHEMA                                                                              \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"        \
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"city\":{\"enum\":[\"Paris\","  \
    "\"Oslo\",\"Lima\"]},\"pets\":{\"type\":\"array\",\"items\":{\"type\":\"string\","             \
    "\"maxLength\":12},\"maxItems\":3}},\"required\":[\"name\",\"age\",\"city\",\"pets\"],"        \
    "\"additionalProperties\":false}"

/* SmolLM2 under json_object mode and under a schema, three seeds each:
 * every reply that ends by itself is valid JSON with the schema's keys;
 * and the same request among others, or with speculation, gives the same
 * text. */
static void test_smollm2_json(void **state) {
    (void)state;
    char path[1024];
    test_model_path("smollm2-135m", path, sizeof path);
    cellm_model *m = NULL;
    assert_int_equal(cellm_model_load(path, NULL, &m), CELLM_OK);
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.max_seqs = 4;
    ep.max_ctx = 512;
    ep.mem_budget_bytes = (size_t)96 << 20;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(m, &ep, &e), CELLM_OK);
    cellm_grammar *gs[2] = {NULL, NULL};
    assert_int_equal(cellm_grammar_json_object(&gs[0]), CELLM_OK);
    assert_int_equal(cellm_grammar_from_json_schema(PERSON_SCHEMA, strlen(PERSON_SCHEMA), &gs[1]),
                     CELLM_OK);
    cellm_chat_message msg[1] = {
        {"user", "Describe a person as JSON with name, age, city and pets."}};
    /* Speculation (prompt lookup) checks its guesses with the grammar too:
     * the same text. */
    ep.lookup_ngram = 3;
    cellm_engine *spec = NULL;
    assert_int_equal(cellm_engine_create(m, &ep, &spec), CELLM_OK);
    gen_out *alone = calloc(6, sizeof(gen_out)), *together = calloc(6, sizeof(gen_out));
    gen_out *guessed = calloc(6, sizeof(gen_out));
    for (int pass = 0; pass < 3; pass++) {
        gen_out *outs = pass == 0 ? alone : pass == 1 ? together : guessed;
        cellm_request *rq[6] = {0};
        for (int k = 0; k < 6; k++) {
            if (pass == 2 && k % 3 != 0) continue; /* speculation: one seed of each */
            cellm_request_params rp = cellm_request_default_params();
            rp.messages = msg;
            rp.n_messages = 1;
            rp.max_tokens = 72;
            rp.sampling.temperature = 0.8f;
            rp.sampling.seed = (uint64_t)(k % 3) + 1;
            rp.grammar = gs[k / 3];
            rp.on_piece = on_piece;
            rp.user = &outs[k];
            assert_int_equal(cellm_submit(pass == 2 ? spec : e, &rp, &rq[k]), CELLM_OK);
            if (pass == 0) { /* alone: one at a time */
                assert_int_equal(cellm_wait(rq[k], NULL), CELLM_OK);
            }
        }
        for (int k = 0; k < 6; k++) {
            if (!rq[k]) continue;
            cellm_result res;
            assert_int_equal(cellm_wait(rq[k], &res), CELLM_OK);
            assert_int_equal(res.status, CELLM_OK);
            if (pass == 0)
                printf("  %s seed %d: %s\n", k < 3 ? "json_object" : "schema", k % 3 + 1,
                       outs[k].text);
            if (res.finish_reason == CELLM_FINISH_STOP) {
                if (!json_valid(outs[k].text)) fail_msg("not JSON: %s", outs[k].text);
                if (k >= 3)
                    for (int q = 0; q < 4; q++) {
                        const char *keys[] = {"\"name\"", "\"age\"", "\"city\"", "\"pets\""};
                        assert_non_null(strstr(outs[k].text, keys[q]));
                    }
            }
            cellm_request_free(rq[k]);
        }
    }
    for (int k = 0; k < 6; k++) {
        assert_string_equal(alone[k].text, together[k].text);
        if (k % 3 == 0) assert_string_equal(alone[k].text, guessed[k].text);
    }
    cellm_grammar_free(gs[0]);
    cellm_grammar_free(gs[1]);
    free(alone);
    free(together);
    free(guessed);
    cellm_engine_free(spec);
    cellm_engine_free(e);
    cellm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tsan_parse_and_match), cmocka_unit_test(test_asan_refusals),
        cmocka_unit_test(test_asan_depth_bound),     cmocka_unit_test(test_tsan_mask_brute_force),
        cmocka_unit_test(test_asan_json_object),     cmocka_unit_test(test_asan_schema),
        cmocka_unit_test(test_smollm2_json),
    };
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
