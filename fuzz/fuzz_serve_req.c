/*
 * fuzz_serve_req.c — libFuzzer target for the request parsers of `cellm
 * serve` (tools/serve_req.c, tools/serve_responses.c): any bytes as the
 * body of a chat, a text completion or a Responses API request. It must
 * accept or refuse with an HTTP status and a message, never crash or leak,
 * and what it accepts must hold the ranges it promises; an accepted
 * Responses request also renders its reply, whole and streamed. The first
 * byte picks the endpoint (bit 5: /v1/responses) and the limits. Seeds:
 * fuzz/corpus/serve_req/ (one byte, then a JSON body).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

/* An accepted Responses request: its reply, whole and as a stream of
 * three calls (opening, text, done), from the body's own bytes as text
 * (with tools, a call may have nothing to send yet: ""). */
static void render_responses(serve_req *r, const char *text, size_t n) {
    serve_out o = {text, n, true, {0}, NULL};
    o.res.finish_reason = n & 1 ? CELLM_FINISH_STOP : CELLM_FINISH_LENGTH;
    void *whole = r->api->whole(r->api_ctx, &o);
    if (!whole) abort();
    cJSON_Delete(whole);
    serve_out parts[3] = {{text, 0, false, {0}, NULL},
                          {text, n / 2, false, {0}, NULL},
                          {text + n / 2, n - n / 2, true, o.res, NULL}};
    for (int i = 0; i < 3; i++) {
        char *ev = r->api->stream(r->api_ctx, &parts[i]);
        if (!ev || (*ev && strncmp(ev, "event: response.", 16))) abort();
        free(ev);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    serve_kind kind = data[0] & 1 ? SERVE_COMPLETION : SERVE_CHAT;
    bool responses = data[0] & 32;
    serve_limits lim = {
        .n_vocab = data[0] & 2 ? 49152 : 16,
        .n_ctx = data[0] & 4 ? 4096 : 8,
        .max_n = data[0] & 8 ? 16 : 2,
        .n_predict = data[0] & 16 ? -1 : 4,
        .temperature = 1.0f,
    };
    serve_req r;
    serve_err e;
    memset(&e, 0, sizeof e);
    if (responses) kind = SERVE_CHAT;
    bool ok = responses ? responses_parse((const char *)data + 1, size - 1, &lim, "m", 7, &r, &e)
                        : serve_req_parse((const char *)data + 1, size - 1, kind, &lim, &r, &e);
    if (ok) {
        if (responses != (r.api != NULL)) abort();
        if (responses) render_responses(&r, (const char *)data + 1, size - 1);
        if (r.n < 1 || r.n > lim.max_n) abort();
        /* 0 only on completions: the prompt alone (echo + logprobs). */
        int32_t min_tokens = kind == SERVE_CHAT ? 1 : 0;
        if (r.max_tokens != lim.n_predict &&
            (r.max_tokens < min_tokens || r.max_tokens > lim.n_ctx))
            abort();
        if (r.top_logprobs < 0 || r.top_logprobs > CELLM_MAX_TOP_LOGPROBS ||
            (!r.logprobs && r.top_logprobs))
            abort();
        if (kind == SERVE_CHAT && (r.n_messages < 1 || !r.messages)) abort();
        if (kind == SERVE_COMPLETION && (r.n_prompts < 1 || (int64_t)r.n * r.n_prompts > lim.max_n))
            abort();
        for (int32_t i = 0; i < r.n_prompts; i++)
            for (int32_t k = 0; k < r.prompts[i].n_tokens; k++)
                if (r.prompts[i].tokens[k] < 0 || r.prompts[i].tokens[k] >= lim.n_vocab) abort();
        for (int i = 0; i < r.n_bias; i++)
            if (r.bias_tok[i] < 0 || r.bias_tok[i] >= lim.n_vocab) abort();
        for (int i = 0; i < r.n_stop; i++)
            if (!r.stop[i][0]) abort();
        serve_req_free(&r);
    } else if (e.status < 400 || e.status > 599 || !e.msg[0]) {
        abort();
    }
    return 0;
}
