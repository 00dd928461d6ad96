/*
 * prefill_chunks.c — what smaller steps cost a long prompt: time to the
 * first token of one prompt of N tokens with max_batch_tokens at each
 * size given, on the CPU, 2 threads, two rounds alternating. The phone
 * memory mode lowers max_batch_tokens (down to 64) where the sessions
 * would not fit otherwise; this says what that costs. Not built by CMake;
 * from the repository root after building ./build:
 *
 *   cc -O2 -Iinclude bench/prefill_chunks.c build/libcellm.a -lm -lpthread \
 *      -o build/prefill_chunks
 *   ./build/prefill_chunks ~/.cache/cellm/models/smollm2-135m.gguf 2000 q3_0hw 256 128 64
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cellm.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int kv_type_of(const char *name) {
    static const char *const names[] = {"f16",    "q8_0",   "q4_0",   "q4_0h", "k5v4h",
                                        "q4_0hw", "k5v4hw", "q3_0hw", "k4v3hw"};
    static const int types[] = {CELLM_KV_F16,    CELLM_KV_Q8_0,   CELLM_KV_Q4_0,
                                CELLM_KV_Q4_0H,  CELLM_KV_K5V4H,  CELLM_KV_Q4_0HW,
                                CELLM_KV_K5V4HW, CELLM_KV_Q3_0HW, CELLM_KV_K4V3HW};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return types[i];
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.gguf TOKENS KV_TYPE ROWS...\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[2]), kv = kv_type_of(argv[3]);
    if (n < 1 || kv < 0) {
        fprintf(stderr, "bad token count or KV type\n");
        return 2;
    }
    cellm_model *m;
    if (cellm_model_load(argv[1], NULL, &m) != CELLM_OK) {
        fprintf(stderr, "%s\n", cellm_last_error());
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) return 1;
    for (int i = 0; i < n; i++) ids[i] = 100 + (int32_t)((i * 7919) % 40000);
    for (int round = 0; round < 2; round++)
        for (int a = 4; a < argc; a++) {
            cellm_engine_params p = cellm_engine_default_params();
            p.n_threads = 2;
            p.max_batch_tokens = atoi(argv[a]);
            p.max_seqs = 1;
            p.max_ctx = n + 64;
            p.kv_type = (cellm_kv_type)kv;
            p.device = CELLM_DEVICE_CPU;
            p.prefix_cache = 0;
            cellm_engine *e;
            if (cellm_engine_create(m, &p, &e) != CELLM_OK) {
                fprintf(stderr, "%s\n", cellm_last_error());
                return 1;
            }
            cellm_request_params rp = cellm_request_default_params();
            rp.tokens = ids;
            rp.n_tokens = n;
            rp.max_tokens = 1;
            cellm_request *r;
            cellm_result res;
            double t0 = now_s();
            if (cellm_submit(e, &rp, &r) != CELLM_OK || cellm_wait(r, &res) != CELLM_OK) {
                fprintf(stderr, "%s\n", cellm_last_error());
                return 1;
            }
            printf("round %d, steps of %4s rows: %d tokens in %.0f ms, %.1f tokens/s (%.2f s in "
                   "all)\n",
                   round + 1, argv[a], n, res.first_token_ms, n / (res.first_token_ms / 1e3),
                   now_s() - t0);
            cellm_request_free(r);
            cellm_engine_free(e);
        }
    free(ids);
    cellm_model_free(m);
    return 0;
}
