/*
 * bench.c — `cellm bench [MODEL]`: aggregate decode speed of the engine
 * with 1, 2, 4, 8 and 16 sessions at once. Each session is one request of
 * its own prompt; all are submitted together, so the engine batches their
 * decode tokens into shared forward passes. A session's decode speed is
 * its completion tokens after the first over the time since its first
 * token; the aggregate is their sum (the sessions decode side by side).
 * Then the cost of sampling: one session decodes greedily and then with
 * top-p 0.9 at temperature 0.8, and the time the engine spent choosing each
 * token (cellm_stats.sample_seconds) is set against the decode step.
 * Memory: the KV cache the round made resident (cellm_stats, an estimate)
 * and the process's peak resident set so far (getrusage), which includes
 * the pages of the mapped weights that were read.
 * Uses only the public API (cellm.h), as an application would.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cellm.h"
#include "cli.h"
#include "store.h"

#define BENCH_DEFAULT_MODEL "smollm2-135m"
#define BENCH_MAX_SESSIONS 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: cellm bench [MODEL] [options]\n\n"
        "Aggregate decode tokens/s of MODEL (default %s) with several sessions at once.\n\n"
        "  -s, --sessions LIST   comma-separated session counts (default 1,2,4,8,16)\n"
        "  -n, --n-predict N     tokens per session (default 64)\n"
        "  -t, --threads N       compute threads (default: cores, at most 4)\n"
        "  -m, --mem SIZE        engine memory budget (default 512M)\n"
        "  -c, --ctx-size N      positions per session (default 1024)\n"
        "  -p, --prompt-tokens N each session's prompt padded to N tokens (default: a line)\n"
        "  --kv-type T           KV cache type: " CLI_KV_TYPES " (default f16)\n"
        "  --sampling            only the sampling cost (greedy; top-p 0.9 at temperature 0.8)\n",
        BENCH_DEFAULT_MODEL);
}

/* The process's peak resident set so far, in MiB. */
static double peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#if defined(__APPLE__)
    return (double)ru.ru_maxrss / (1 << 20); /* bytes */
#else
    return (double)ru.ru_maxrss / 1024; /* KiB */
#endif
}

/* Prompt tokens of session i: its opening line, then a filler paragraph
 * repeated, cut to n_tok tokens (*out, free() it); 0 if n_tok is 0. */
static cellm_status padded_prompt(const cellm_model *model, const char *line, int32_t n_tok,
                                  int32_t **out, int32_t *n) {
    static const char filler[] =
        " The lamp turned slowly above the rocks, and the keeper counted the ships that passed "
        "in the night, writing each name in a book that grew heavier every year.";
    *out = NULL;
    *n = 0;
    if (n_tok <= 0) return CELLM_OK;
    size_t reps = (size_t)n_tok / 8 + 1, len = strlen(line) + reps * strlen(filler) + 1;
    char *text = malloc(len);
    if (!text) return CELLM_ERR_NO_MEMORY;
    size_t at = strlen(line), fl = strlen(filler);
    memcpy(text, line, at);
    for (size_t i = 0; i < reps; i++, at += fl) memcpy(text + at, filler, fl);
    text[at] = '\0';
    cellm_status st = cellm_tokenize(model, text, out, n);
    free(text);
    if (st == CELLM_OK && *n > n_tok) *n = n_tok;
    return st;
}

/* One round of `n` sessions; prints a table row. */
static int bench_round(const cellm_model *model, const cellm_engine_params *ep, int n,
                       int32_t n_predict, int32_t prompt_tokens) {
    cellm_engine_params p = *ep;
    if (p.max_seqs < n) p.max_seqs = n;
    cellm_engine *e = NULL;
    if (cellm_engine_create(model, &p, &e) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    static const char *const topics[] = {
        "a lighthouse keeper", "a lost robot",    "a small dragon",     "an old sailor",
        "a clever fox",        "a city at night", "a mountain village", "a time traveller"};
    cellm_request *req[BENCH_MAX_SESSIONS];
    char prompt[256];
    double t0 = now_s();
    int rc = 0, submitted = 0;
    for (int i = 0; i < n; i++) {
        snprintf(prompt, sizeof prompt, "Story %d. Once upon a time there was %s who", i + 1,
                 topics[i % 8]);
        cellm_request_params rp = cellm_request_default_params();
        int32_t *ids = NULL, n_ids = 0;
        if (padded_prompt(model, prompt, prompt_tokens, &ids, &n_ids) != CELLM_OK) {
            cli_error("bench: cannot make a prompt of %d tokens", prompt_tokens);
            rc = 1;
            break;
        }
        if (ids) {
            rp.tokens = ids;
            rp.n_tokens = n_ids;
        } else
            rp.prompt = prompt;
        rp.max_tokens = n_predict;
        cellm_status st = cellm_submit(e, &rp, &req[i]);
        free(ids);
        if (st != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            rc = 1;
            break;
        }
        submitted++;
    }
    double decode_tps = 0, ttft = 0;
    long tokens = 0;
    for (int i = 0; i < submitted; i++) {
        cellm_result res;
        cellm_wait(req[i], &res);
        double dt = (res.total_ms - res.first_token_ms) / 1e3;
        if (res.n_completion_tokens > 1 && dt > 0) decode_tps += (res.n_completion_tokens - 1) / dt;
        tokens += res.n_completion_tokens;
        ttft += res.first_token_ms / submitted;
        cellm_request_free(req[i]);
    }
    double wall = now_s() - t0;
    cellm_stats st;
    cellm_engine_stats(e, &st);
    if (!rc)
        printf("%8d %14.1f %14.1f %12.0f %10llu %8.1f %8.1f %9.1f\n", n, decode_tps, tokens / wall,
               ttft, (unsigned long long)st.n_preemptions, (double)st.bytes_activations / (1 << 20),
               (double)st.bytes_kv_resident / (1 << 20), peak_rss_mib());
    fflush(stdout);
    cellm_engine_free(e);
    return rc;
}

/* One session of n_predict tokens sampled with `sp`; prints the sampler's
 * time per token against the decode step (the time per token after the
 * first, which includes the sampling). */
static int bench_sampling_round(const cellm_model *model, const cellm_engine_params *ep,
                                const char *name, const cellm_sampling *sp, int32_t n_predict) {
    cellm_engine *e = NULL;
    if (cellm_engine_create(model, ep, &e) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    cellm_request_params rp = cellm_request_default_params();
    rp.prompt = "Once upon a time there was a lighthouse keeper who";
    rp.max_tokens = n_predict;
    rp.sampling = *sp;
    cellm_request *r = NULL;
    cellm_result res;
    int rc = 0;
    if (cellm_submit(e, &rp, &r) != CELLM_OK || cellm_wait(r, &res) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        rc = 1;
    }
    cellm_request_free(r);
    cellm_stats st;
    cellm_engine_stats(e, &st);
    cellm_engine_free(e);
    if (rc) return rc;
    if (res.n_completion_tokens < 2 || st.n_sampled == 0) {
        cli_error("bench: the model stopped after %d tokens", res.n_completion_tokens);
        return 1;
    }
    double sample_ms = st.sample_seconds * 1e3 / (double)st.n_sampled;
    double step_ms = (res.total_ms - res.first_token_ms) / (res.n_completion_tokens - 1);
    printf("%-28s %10.3f %14.2f %8.1f%% %8d\n", name, sample_ms, step_ms, 100 * sample_ms / step_ms,
           res.n_completion_tokens);
    fflush(stdout);
    return 0;
}

static int bench_sampling(const cellm_model *model, const cellm_engine_params *ep,
                          int32_t n_predict) {
    cellm_engine_params p = *ep;
    p.max_seqs = 1;
    printf("\n%-28s %10s %14s %9s %8s\n", "sampling", "ms/token", "decode step ms", "share",
           "tokens");
    cellm_sampling sp = cellm_request_default_params().sampling;
    int rc = bench_sampling_round(model, &p, "greedy", &sp, n_predict);
    sp.temperature = 0.8f;
    sp.top_p = 0.9f;
    sp.seed = 1;
    if (!rc) rc = bench_sampling_round(model, &p, "top-p 0.9, temperature 0.8", &sp, n_predict);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *model_name = NULL, *sessions = "1,2,4,8,16";
    cellm_engine_params ep = cellm_engine_default_params();
    ep.mem_budget_bytes = (size_t)512 << 20;
    ep.max_ctx = 1024;
    int32_t n_predict = 64, prompt_tokens = 0;
    bool sampling_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long u;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-s") || !strcmp(a, "--sessions")) && v) {
            sessions = v;
            i++;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--n-predict")) && v &&
                   cli_parse_uint(v, 4096, &u) && u > 0) {
            n_predict = (int32_t)u;
            i++;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v &&
                   cli_parse_uint(v, 256, &u)) {
            ep.n_threads = (int)u;
            i++;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--mem")) && v &&
                   cli_parse_size(v, &ep.mem_budget_bytes)) {
            i++;
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) && v &&
                   cli_parse_uint(v, 1u << 24, &u) && u > 0) {
            ep.max_ctx = (int32_t)u;
            i++;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt-tokens")) && v &&
                   cli_parse_uint(v, 1u << 24, &u)) {
            prompt_tokens = (int32_t)u;
            i++;
        } else if (!strcmp(a, "--kv-type") && v && cli_parse_kv_type(v, &ep.kv_type)) {
            i++;
        } else if (!strcmp(a, "--sampling")) {
            sampling_only = true;
        } else if (a[0] == '-') {
            cli_error("bench: bad option or value '%s' (see `cellm bench --help`)", a);
            return 2;
        } else if (!model_name) {
            model_name = a;
        } else {
            cli_error("bench: more than one model given");
            return 2;
        }
    }
    char path[4096];
    cellm_error err;
    err_clear(&err);
    if (store_resolve(model_name ? model_name : BENCH_DEFAULT_MODEL, true, path, sizeof path,
                      &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        return 1;
    }
    cellm_model *model = NULL;
    if (cellm_model_load(path, NULL, &model) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    int rc = 0;
    if (!sampling_only)
        printf("%8s %14s %14s %12s %10s %8s %8s %9s\n", "sessions", "decode tok/s", "wall tok/s",
               "ttft ms", "preempted", "act MiB", "KV MiB", "peak RSS");
    for (const char *s = sessions; *s && !rc && !sampling_only;) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s || n < 1 || n > BENCH_MAX_SESSIONS || (*end && *end != ',')) {
            cli_error("bench: sessions must be a list of numbers 1..%d", BENCH_MAX_SESSIONS);
            rc = 2;
            break;
        }
        rc = bench_round(model, &ep, (int)n, n_predict, prompt_tokens);
        s = *end ? end + 1 : end;
    }
    if (!rc) rc = bench_sampling(model, &ep, n_predict);
    cellm_model_free(model);
    return rc;
}
