/*
 * grammar_mask.c — what a whole-vocabulary grammar mask costs, state by
 * state: a fixed valid reply to the 10-property schema of `cellm bench
 * --sampling` is tokenized by the model, and at every token the mask of
 * the state before it is computed (grammar_state_mask) and timed, as if
 * the engine masked every token instead of only those the grammar refuses
 * at first draw (docs/grammar.md). Prints the token trie's build time and
 * the masks' mean and maximum, twice (a fresh state each pass).
 * Not built by CMake; from the repository root after building ./build:
 *
 *   cc -O2 -Isrc -Iinclude bench/grammar_mask.c build/libcellm.a -lm -lpthread \
 *      -o build/grammar_mask
 *   ./build/grammar_mask ~/.cache/cellm/models/smollm2-135m.gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tools/bench_schema.h"
#include "runtime/engine.h"
#include "text/grammar.h"
#include "text/schema.h"
#include "text/tokenizer.h"

static const char REPLY[] =
    "{\"id\": 4021, \"name\": \"Trail Runner 2\", \"description\": \"A light running shoe for "
    "rough paths, with a grippy sole and a breathable upper.\", \"price\": 89.95, \"currency\": "
    "\"EUR\", \"in_stock\": true, \"quantity\": 37, \"tags\": [\"shoes\", \"running\", "
    "\"outdoor\"], \"category\": \"Footwear\", \"dimensions\": {\"width\": 11.5, \"height\": "
    "30}}";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: grammar_mask MODEL.gguf\n");
        return 2;
    }
    cellm_model *m = NULL;
    if (cellm_model_load(argv[1], NULL, &m) != CELLM_OK) {
        fprintf(stderr, "%s\n", cellm_last_error());
        return 1;
    }
    int32_t n = tokenizer_n_vocab(m->tok);
    const char **pieces = malloc(sizeof(char *) * (size_t)n);
    size_t *lens = malloc(sizeof(size_t) * (size_t)n);
    for (int32_t t = 0; t < n; t++) pieces[t] = tokenizer_piece(m->tok, t, 0, &lens[t]);
    cellm_error err;
    err_clear(&err);
    double t0 = now_s();
    grammar_vocab *v = NULL;
    char *gbnf = NULL;
    size_t gn = 0;
    grammar *g = NULL;
    tok_ids ids = {0};
    if (grammar_vocab_create(pieces, lens, n, &v, &err) ||
        (printf("token trie: %.1f ms\n", (now_s() - t0) * 1e3), 0) ||
        schema_to_gbnf(BENCH_SCHEMA, strlen(BENCH_SCHEMA), &gbnf, &gn, &err) ||
        grammar_parse(gbnf, gn, &g, &err) ||
        tokenizer_encode(m->tok, REPLY, strlen(REPLY), 0, &ids, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    for (int pass = 0; pass < 2; pass++) {
        grammar_state *s = NULL;
        if (grammar_state_create(g, v, &s, &err)) return 1;
        double total = 0, worst = 0;
        for (size_t i = 0; i < ids.n; i++) {
            double a = now_s();
            const uint32_t *bits = grammar_state_mask(s);
            double d = now_s() - a;
            total += d;
            if (d > worst) worst = d;
            int32_t t = ids.ids[i];
            if (!((bits[t >> 5] >> (t & 31)) & 1) || !grammar_state_accept(s, pieces[t], lens[t])) {
                fprintf(stderr, "token %zu of the reply is refused\n", i);
                return 1;
            }
        }
        printf("pass %d: %zu masks, mean %.3f ms, max %.3f ms, whole %d\n", pass + 1, ids.n,
               total * 1e3 / (double)ids.n, worst * 1e3, grammar_state_complete(s));
        grammar_state_free(s);
    }
    tok_ids_free(&ids);
    grammar_free(g);
    free(gbnf);
    grammar_vocab_free(v);
    free(pieces);
    free(lens);
    cellm_model_free(m);
    return 0;
}
