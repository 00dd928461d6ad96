/*
 * fuzz_toolcall.c — libFuzzer target for tool calls (src/text/toolcall.c): the
 * parser of a model's reply, the preparation of a tool conversation for a
 * template, and the grammar of a forced call. The first byte picks what
 * the rest is: 0 a reply parsed with and without a tools list, 1 a
 * messages array prepared for a template that renders tools and for the
 * generic rendering, 2 a tools array (its grammar in each family's
 * format, then the parser on text after a NUL byte, if any). Every call
 * must succeed or fail with a message; what the parser returns must be a
 * JSON object. Seeds: fuzz/corpus/toolcall/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/json.h"
#include "text/toolcall.h"

static const char TOOLS[] = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                            "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
                            "{\"type\":\"string\"}}}}},{\"type\":\"function\",\"function\":"
                            "{\"name\":\"noop\"}}]";

static void parse(const char *text, size_t n, const char *tools) {
    char *out = NULL;
    cellm_error err;
    err.msg[0] = '\0';
    if (tool_calls_parse(text, n, tools, &out, &err) != CELLM_OK) {
        if (!err.msg[0] || out) abort();
        return;
    }
    json_node *v = json_parse(out, strlen(out), NULL, 64, "out", NULL);
    if (!v || v->type != JSON_OBJ || !json_get(v, "tool_calls")) abort();
    json_free(v);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t n = size - 1;
    char *in = malloc(n + 1); /* NUL-terminated: the JSON inputs are C strings */
    if (!in) return 0;
    memcpy(in, data + 1, n);
    in[n] = '\0';
    cellm_error err;
    err.msg[0] = '\0';
    switch (data[0] % 3) {
    case 0:
        parse(in, n, NULL);
        parse(in, n, TOOLS);
        break;
    case 1:
        for (int native = 0; native < 2; native++) {
            tool_chat c;
            err.msg[0] = '\0';
            if (tool_chat_prepare(in, TOOLS, native, native, &c, &err) == CELLM_OK)
                tool_chat_free(&c);
            else if (!err.msg[0])
                abort();
        }
        break;
    default:
        for (int fmt = TOOL_FMT_HERMES; fmt <= TOOL_FMT_JSON; fmt++) {
            char *gbnf = NULL;
            size_t gn = 0;
            err.msg[0] = '\0';
            if (tool_grammar_gbnf(in, NULL, (tool_format)fmt, fmt & 1, &gbnf, &gn, &err) ==
                CELLM_OK)
                free(gbnf);
            else if (!err.msg[0] || gbnf)
                abort();
        }
        size_t tl = strlen(in);
        if (tl < n) parse(in + tl + 1, n - tl - 1, in);
        break;
    }
    free(in);
    return 0;
}
