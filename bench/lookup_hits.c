/*
 * lookup_hits.c — how often prompt lookup's first guess is right, by the
 * length of the n-gram it matched: the measurement behind lookup's
 * two-token minimum (src/runtime/spec.c, spec_lookup).
 *
 * For each of `cellm bench`'s speculative tasks (their chat prompts, read
 * as JSON from stdin), the program generates the model's greedy
 * completion, then replays it token by token: before each completion
 * token it finds, as spec_lookup does, the latest earlier occurrence of
 * the longest suffix of 4 down to 1 tokens in the text so far (the user
 * message's tokens, then the completion's), and counts whether the token
 * that followed it there is the one the model wrote. The counts go by
 * the match's length and by where it was found (the prompt or the
 * completion). The text the lookup sees is the message without the chat
 * template's few tokens around it.
 *
 * Not built by CMake; from the repository root after building ./build:
 *
 *   cc -O2 -Iinclude bench/lookup_hits.c build/libcellm.a -lm -lpthread -lcjson \
 *      -o build/lookup_hits
 *   ./build/cellm bench MODEL --lookup 4 --spec-prompts | ./build/lookup_hits MODEL.gguf [N]
 *
 * N: completion tokens a prompt (default 64, as the bench's).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cellm.h"

#define NGRAM 4

typedef struct tally {
    long tries[NGRAM + 1][2], hits[NGRAM + 1][2]; /* [n][0: prompt, 1: completion] */
} tally;

/* The first guess after tok[0..n_tok): the token after the latest earlier
 * occurrence of the longest suffix of NGRAM .. 1 tokens; its n-gram length
 * in *len (0: none) and where the occurrence starts in *at. */
static int32_t first_guess(const int32_t *tok, int32_t n_tok, int32_t *len, int32_t *at) {
    for (int32_t n = NGRAM < n_tok ? NGRAM : n_tok - 1; n >= 1; n--) {
        const int32_t *pat = tok + n_tok - n;
        for (int32_t i = n_tok - n - 1; i >= 0; i--) {
            if (memcmp(tok + i, pat, (size_t)n * sizeof *tok) != 0) continue;
            *len = n;
            *at = i;
            return tok[i + n];
        }
    }
    *len = 0;
    return -1;
}

static int replay(const cellm_model *m, cellm_engine *e, const char *text, int32_t n_predict,
                  tally *t) {
    int32_t *p = NULL, np = 0;
    if (cellm_tokenize(m, text, &p, &np) != CELLM_OK) return 1;
    cellm_chat_message msg = {.role = "user", .content = text};
    cellm_request_params rp = cellm_request_default_params();
    rp.messages = &msg;
    rp.n_messages = 1;
    rp.max_tokens = n_predict;
    cellm_request *r;
    cellm_result res;
    const int32_t *c;
    int32_t nc = 0;
    if (cellm_submit(e, &rp, &r) != CELLM_OK) {
        free(p);
        return 1;
    }
    int rc = cellm_wait(r, &res) != CELLM_OK || res.status != CELLM_OK ||
             cellm_request_tokens(r, &c, &nc) != CELLM_OK;
    int32_t *seq = rc ? NULL : malloc(((size_t)np + (size_t)nc) * sizeof *seq);
    if (seq) {
        memcpy(seq, p, (size_t)np * sizeof *seq);
        memcpy(seq + np, c, (size_t)nc * sizeof *seq);
        for (int32_t o = 1; o < nc; o++) {
            int32_t len, at;
            int32_t g = first_guess(seq, np + o, &len, &at);
            if (len == 0) continue;
            int src = at >= np;
            t->tries[len][src]++;
            t->hits[len][src] += g == c[o];
        }
    }
    rc |= seq == NULL;
    free(seq);
    cellm_request_free(r);
    free(p);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cellm bench MODEL --spec-prompts | %s MODEL.gguf [N]\n", argv[0]);
        return 2;
    }
    int32_t n_predict = argc > 2 ? atoi(argv[2]) : 64;
    size_t cap = 1 << 20, len = 0;
    char *in = malloc(cap);
    size_t got;
    while (in && (got = fread(in + len, 1, cap - 1 - len, stdin)) > 0) len += got;
    if (!in) return 1;
    in[len] = 0;
    cJSON *tasks = cJSON_Parse(in);
    free(in);
    cellm_model *m;
    cellm_engine *e;
    cellm_engine_params ep = cellm_engine_default_params();
    if (!cJSON_IsObject(tasks) || cellm_model_load(argv[1], NULL, &m) != CELLM_OK) {
        fprintf(stderr, "lookup_hits: %s\n", tasks ? cellm_last_error() : "bad JSON on stdin");
        return 1;
    }
    if (cellm_engine_create(m, &ep, &e) != CELLM_OK) {
        fprintf(stderr, "lookup_hits: %s\n", cellm_last_error());
        return 1;
    }
    printf("| task | found in |");
    for (int n = 1; n <= NGRAM; n++) printf(" %d token%s |", n, n > 1 ? "s" : "");
    printf("\n| --- | --- |");
    for (int n = 1; n <= NGRAM; n++) printf(" ---: |");
    printf("\n");
    int rc = 0;
    const cJSON *task;
    cJSON_ArrayForEach(task, tasks) {
        tally t = {0};
        const cJSON *prompt;
        cJSON_ArrayForEach(prompt, task) {
            if (cJSON_IsString(prompt) && replay(m, e, prompt->valuestring, n_predict, &t)) {
                fprintf(stderr, "lookup_hits: %s\n", cellm_last_error());
                rc = 1;
            }
        }
        for (int src = 0; src < 2; src++) {
            printf("| %s | %s |", task->string, src ? "completion" : "prompt");
            for (int n = 1; n <= NGRAM; n++) {
                long a = t.hits[n][src], b = t.tries[n][src];
                if (b)
                    printf(" %ld/%ld (%.0f%%) |", a, b, 100.0 * (double)a / (double)b);
                else
                    printf(" - |");
            }
            printf("\n");
        }
    }
    cJSON_Delete(tasks);
    cellm_engine_free(e);
    cellm_model_free(m);
    return rc;
}
