/*
 * perplexity.c — `cellm perplexity MODEL FILE`: perplexity over a text file,
 * computed as llama.cpp's perplexity tool does, so the two can be compared:
 * the text is cut into non-overlapping chunks of N tokens, each chunk starts
 * with BOS where the model adds one, and only the second half of each chunk
 * is scored (every scored token has at least N/2 tokens of context). Prints
 * the running value after each chunk and the final estimate with its
 * standard error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "rt.h"
#include "run.h"

#define LOGIT_ROWS 64

static void usage(FILE *out) {
    fprintf(out, "usage: cellm perplexity MODEL FILE [-c N] [--chunks K] [-t THREADS]\n"
                 "                        [--kv-type T] [--device D] [--gpu-layers N]\n\n"
                 "Perplexity of MODEL over the text in FILE, in chunks of N tokens (default 512),\n"
                 "scoring the second half of each chunk as llama.cpp's perplexity tool does.\n"
                 "--chunks limits how many chunks are used (default: all). --kv-type stores\n"
                 "the KV cache as " CLI_KV_TYPES " (default f16). --device runs it on\n" CLI_DEVICES
                 " (default auto);\n"
                 "--gpu-layers N runs only the last N layers there, the rest on the CPU.\n");
}

static void log_softmax_at(const float *x, int32_t n, double *lse) {
    double mx = x[0];
    for (int32_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < n; i++) s += exp(x[i] - mx);
    *lse = mx + log(s);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model_name = NULL, *file = NULL, *kv_name = "f16";
    rt_opts o = {.ctx = 512, .logit_rows = LOGIT_ROWS, .batch = 256};
    unsigned long long max_chunks = 0, u;
    long gpu_layers = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) && i + 1 < argc) {
            if (!cli_parse_uint(argv[++i], 1u << 16, &u) || u < 8) {
                cli_error("perplexity: -c needs a chunk size from 8 to 65536");
                return 2;
            }
            o.ctx = (int32_t)u;
        } else if (!strcmp(a, "--kv-type") && i + 1 < argc) {
            kv_name = argv[i + 1];
            if (!cli_parse_kv_type(argv[++i], &o.kv_type)) {
                cli_error("perplexity: --kv-type needs one of " CLI_KV_TYPES);
                return 2;
            }
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            if (!cli_parse_device(argv[++i], &o.device)) {
                cli_error("perplexity: --device needs one of " CLI_DEVICES);
                return 2;
            }
        } else if (cli_is_gpu_layers(a) && i + 1 < argc) {
            if (!cli_parse_gpu_layers(argv[++i], &gpu_layers)) {
                cli_error("perplexity: %s needs a count of layers", a);
                return 2;
            }
        } else if (!strcmp(a, "--chunks") && i + 1 < argc) {
            if (!cli_parse_uint(argv[++i], 1u << 30, &max_chunks)) {
                cli_error("perplexity: --chunks needs a count");
                return 2;
            }
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && i + 1 < argc) {
            if (!cli_parse_uint(argv[++i], 256, &u) || u == 0) {
                cli_error("perplexity: -t needs a thread count");
                return 2;
            }
            o.threads = (int)u;
        } else if (a[0] == '-') {
            cli_error("perplexity: unknown or incomplete option '%s'", a);
            return 2;
        } else if (!model_name) {
            model_name = a;
        } else if (!file) {
            file = a;
        } else {
            cli_error("perplexity: too many arguments");
            return 2;
        }
    }
    if (!model_name || !file) {
        usage(stderr);
        return 2;
    }
    cellm_error err;
    err_clear(&err);
    size_t len;
    char *text = cli_read_file(file, &len);
    if (!text) {
        cli_error("perplexity: cannot read '%s'", file);
        return 1;
    }
    rt r;
    cli_apply_gpu_layers(gpu_layers, &o.device, &o.gpu_layers);
    if (rt_open(model_name, &o, &r, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        free(text);
        return 1;
    }
    tok_ids ids = {0};
    int rc = 1;
    float *lg = NULL;
    kv_seq s = {0};
    if (tokenizer_encode(r.tok, text, len, 0, &ids, &err) != CELLM_OK ||
        kv_seq_init(r.kv, &s, &err) != CELLM_OK)
        goto done;
    int32_t n_ctx = o.ctx, V = r.m->n_vocab;
    size_t n_chunks = ids.n / (size_t)n_ctx;
    if (max_chunks && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_chunks == 0) {
        err_set(&err, CELLM_ERR_INVALID_ARG, "%s has %zu tokens, fewer than one chunk of %d", file,
                ids.n, n_ctx);
        goto done;
    }
    /* The model adds BOS if encoding the empty text with specials gives one. */
    tok_ids probe = {0};
    bool add_bos =
        tokenizer_encode(r.tok, "", 0, TOK_ADD_SPECIAL, &probe, NULL) == CELLM_OK && probe.n == 1;
    tok_ids_free(&probe);
    lg = malloc(sizeof(float) * (size_t)V * LOGIT_ROWS);
    int32_t *chunk = malloc(sizeof(int32_t) * (size_t)n_ctx);
    if (!lg || !chunk) {
        free(chunk);
        err_set(&err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    fprintf(stderr, "perplexity: %zu tokens, %zu chunks of %d, KV type %s (%zu bytes per token)\n",
            ids.n, n_chunks, n_ctx, kv_name, kv_cache_token_bytes(r.m, o.kv_type));
    double nll = 0, nll2 = 0;
    long count = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fwd_row rows[LOGIT_ROWS];
    for (size_t k = 0; k < n_chunks; k++) {
        memcpy(chunk, ids.ids + k * (size_t)n_ctx, sizeof(int32_t) * (size_t)n_ctx);
        if (add_bos) chunk[0] = tokenizer_bos(r.tok);
        kv_seq_reset(r.kv, &s);
        int32_t half = n_ctx / 2;
        if (rt_feed(&r, &s, chunk, half, NULL, &err) != CELLM_OK) goto done_chunk;
        for (int32_t j = half; j < n_ctx - 1; j += LOGIT_ROWS) {
            int32_t n = n_ctx - 1 - j < LOGIT_ROWS ? n_ctx - 1 - j : LOGIT_ROWS;
            for (int32_t i = 0; i < n; i++) rows[i] = (fwd_row){&s, chunk[j + i], j + i, true};
            const float *out;
            if (backend_run(&r.fwd, rows, n, &out, &err) != CELLM_OK) goto done_chunk;
            for (int32_t i = 0; i < n; i++) {
                double lse;
                log_softmax_at(out + (size_t)i * V, V, &lse);
                double v = lse - out[(size_t)i * V + ids.ids[k * (size_t)n_ctx + j + i + 1]];
                nll += v;
                nll2 += v * v;
                count++;
            }
        }
        printf("[%zu]%.4f,", k + 1, exp(nll / count));
        fflush(stdout);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    {
        double mean = nll / count, var = nll2 / count - mean * mean;
        double unc = count > 1 && var > 0 ? sqrt(var / (count - 1)) : 0;
        printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", exp(mean), unc * exp(mean));
        fprintf(stderr, "perplexity: %ld tokens scored in %.1f s\n", count,
                (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
        rc = 0;
    }
done_chunk:
    free(chunk);
done:
    if (rc) cli_error("%s", err.msg);
    free(lg);
    if (s.table[0]) kv_seq_free(r.kv, &s);
    tok_ids_free(&ids);
    rt_close(&r);
    free(text);
    return rc;
}
