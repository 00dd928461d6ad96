/*
 * fuzz_jinja.c — libFuzzer target for the chat-template interpreter. The
 * input is template text, rendered against a fixed conversation (with a
 * tool call, a tool list and unicode) under tight limits; it must render or
 * fail with a message, never crash, and stay within its time and memory
 * bounds. Seeds: the parity fixtures' templates (fuzz/corpus/jinja/).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

static const char VARS[] =
    "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    " \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9\\ud83d\\ude00 {{ x }}\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call12345\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"sunny\"},"
    " {\"role\": \"user\", \"content\": \"  and tomorrow?\\n\"}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    jinja_ctx ctx = {
        .add_generation_prompt = size > 0 && (data[0] & 1),
        .bos_token = "<s>",
        .eos_token = "</s>",
        .vars_json = VARS,
        .vars_json_len = sizeof VARS - 1,
        .limits = {.max_output = 1 << 20,
                   .max_memory = 16 << 20,
                   .max_steps = 200000,
                   .max_depth = 64,
                   .max_calls = 16},
    };
    char *out;
    size_t n;
    cellm_error err;
    err.msg[0] = '\0';
    if (jinja_render((const char *)data, size, &ctx, &out, &n, &err) != CELLM_OK) {
        if (err.msg[0] == '\0' || out != NULL) abort(); /* every failure says why */
        return 0;
    }
    if (strlen(out) > n) abort();
    free(out);
    return 0;
}
