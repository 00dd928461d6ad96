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
 * `cellm bench --prefix` measures the prefix cache instead: the time to
 * first token of a request with a system prompt of about 1,000 tokens on
 * a cold engine, then of a second request with the same system prompt and
 * another question (its prefix cached), with the second reply checked
 * token for token against an engine without the cache; and a chat
 * session saved to a file and restored on a freshly loaded model and
 * engine, against recomputing its conversation, with the next turn
 * checked against the session that was never interrupted. Times are
 * wall-clock and process CPU (all threads).
 * `cellm bench --pp LIST --tg LIST` measures single-request speed the way
 * llama-bench does instead: prompt processing of N tokens (N over the time
 * to the first token, one request at a time on an engine without the
 * prefix cache) and generation of N tokens after a one-token prompt (N
 * over the time after the first token), each repeated, with the median and
 * the range; generation also as weight bytes streamed per second against
 * the read bandwidth of as many threads measured in the same run after
 * the tests (bench_read_bandwidth: the median of --bw-samples passes over
 * a buffer of 8 times the last-level cache; the share divides by the
 * median, and the passes' range is printed beside it). `--json` prints the
 * same as JSON.
 * `cellm bench --draft MODEL` / `--lookup N` measures speculative decoding
 * against plain decoding side by side instead (bench_spec.c).
 * Uses the public API (cellm.h), as an application would; the weight bytes
 * come from the file's tensor table (gguf.h).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench_kernels.h"
#include "bench_schema.h"
#include "bench_spec.h"
#include "cellm.h"
#include "cli.h"
#include "format/gguf.h"
#include "store.h"

#define BENCH_DEFAULT_MODEL "smollm2-135m"
#define BENCH_MAX_SESSIONS 256

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
        "  -m, --mem SIZE        engine memory budget: KV + activations (default 512M)\n"
        "  --mem-budget SIZE     cap on the whole process instead (the phone memory mode);\n"
        "                        the largest session count must fit at -c positions each\n"
        "  -c, --ctx-size N      positions per session (default 1024)\n"
        "  -p, --prompt-tokens N each session's prompt padded to N tokens (default: a line)\n"
        "  --kv-type T           KV cache type: " CLI_KV_TYPES " (default f16)\n" CLI_DEVICE_USAGE
        "  --ignore-eos          EOS banned: every session generates -n tokens\n"
        "  --sampling            only the sampling cost (greedy; top-p 0.9 at temperature 0.8)\n"
        "  --load                only model load to the first token of a 16-token prompt\n"
        "  --prefix              only the prefix cache: time to first token cold and with a\n"
        "                        cached 1,000-token system prompt; session restore vs recompute\n"
        "  --pp LIST             only single-request speed, as llama-bench: prompt processing\n"
        "                        of each comma-separated token count (e.g. 128,512)\n"
        "  --tg LIST             ... and generation of each count of tokens (e.g. 128); with\n"
        "                        either, the other defaults to none\n"
        "  -r, --reps N          repetitions of each --pp/--tg test (default 5), after one\n"
        "                        unmeasured warm-up\n"
        "  --bw-samples N        timed passes of the read-bandwidth probe after --pp/--tg\n"
        "                        (default %d); generation's share divides by their median\n"
        "  --json                --pp/--tg or --draft/--lookup results as JSON\n\n"
        "Speculative decoding, plain and speculative side by side (either flag):\n"
        "  --draft MODEL         with this draft model (same family and vocabulary)\n"
        "  --lookup N            with prompt lookup of n-grams up to N tokens\n"
        "  --draft-max K         guesses per step at most (default 8); also --draft-min K,\n"
        "                        --draft-p-min P (defaults 1, 0.5)\n"
        "  --draft-always        the draft in every step, not only while it pays\n"
        "  --spec-temp T         sampled rounds at temperature T (0..1; top-k 40, top-p 0.95,\n"
        "                        min-p 0.05, a seed per prompt; default 0: greedy)\n"
        "  --spec-accept RULE    exact (default) or resample (the standard rule; with\n"
        "                        --spec-temp: each round's text must equal the first's)\n"
        "  --spec-task LIST      workloads: prose, edit (rename a ~40-line function), summary\n"
        "                        (of a ~400-token document) (default prose,edit,summary);\n"
        "                        -s defaults to 1,8, -n to 64, -r to 3, -c to 2048\n"
        "  --spec-prompts        only print the tasks' chat prompts as JSON\n",
        BENCH_DEFAULT_MODEL, BENCH_BW_SAMPLES);
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

/* Bytes of weights a decode step reads (and, in *elems, the weights: a
 * multiply and an add each per token): every tensor, except the token
 * embedding when a separate output matrix exists (decoding reads one row
 * of it); with tied embeddings it is the output matrix and read whole. */
static uint64_t weight_bytes_per_token(const char *path, uint64_t *elems) {
    gguf_file *g = NULL;
    cellm_error e;
    *elems = 0;
    if (gguf_open(path, &g, &e) != CELLM_OK) return 0;
    uint64_t total = 0, embd = 0, n = 0, embd_n = 0;
    bool output = false;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        total += t->size;
        n += t->n_elems;
        if (t->name.len == 17 && !memcmp(t->name.ptr, "token_embd.weight", 17)) {
            embd = t->size;
            embd_n = t->n_elems;
        }
        if (t->name.len == 13 && !memcmp(t->name.ptr, "output.weight", 13)) output = true;
    }
    gguf_close(g);
    *elems = output ? n - embd_n : n;
    return output ? total - embd : total;
}

static uint64_t g_weight_elems; /* per token, for the GFLOP/s column */
static bool g_ignore_eos;       /* --ignore-eos */

/* One round of `n` sessions; prints a table row. */
static int bench_round(const cellm_model *model, const cellm_engine_params *ep, int n,
                       int32_t n_predict, int32_t prompt_tokens) {
    cellm_engine_params p = *ep;
    /* An engine for exactly n sessions: its activations hold n logit rows,
     * and under a process cap n sequences must fit at full context. */
    p.max_seqs = n;
    /* --ignore-eos: EOS banned, so every session generates n_predict. */
    cellm_model_info info;
    cellm_logit_bias ban = {.token = -1, .bias = -INFINITY};
    if (g_ignore_eos && cellm_model_get_info(model, &info) == CELLM_OK) ban.token = info.eos;
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
        if (ban.token >= 0) {
            rp.sampling.logit_bias = &ban;
            rp.sampling.n_logit_bias = 1;
        }
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
        printf("%8d %14.1f %14.1f %12.0f %10llu %8.1f %8.1f %9.1f %10.1f\n", n, decode_tps,
               tokens / wall, ttft, (unsigned long long)st.n_preemptions,
               (double)st.bytes_activations / (1 << 20), (double)st.bytes_kv_resident / (1 << 20),
               peak_rss_mib(), 2.0 * (double)g_weight_elems * decode_tps / 1e9);
    fflush(stdout);
    cellm_engine_free(e);
    return rc;
}

/* One session of n_predict tokens sampled with `sp`; prints the sampler's
 * time per token against the decode step (the time per token after the
 * first, which includes the sampling). */
static int bench_sampling_round(const cellm_model *model, const cellm_engine_params *ep,
                                const char *name, const cellm_sampling *sp, int32_t n_predict,
                                const cellm_grammar *grammar) {
    cellm_engine *e = NULL;
    if (cellm_engine_create(model, ep, &e) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    cellm_request_params rp = cellm_request_default_params();
    rp.prompt = "Once upon a time there was a lighthouse keeper who";
    rp.max_tokens = n_predict;
    rp.sampling = *sp;
    rp.grammar = grammar;
    cellm_chat_message msg = {"user", "Describe a product of our shop as JSON."};
    if (grammar) { /* a chat turn, so the model writes JSON willingly */
        rp.prompt = NULL;
        rp.messages = &msg;
        rp.n_messages = 1;
    }
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
    if (grammar && st.n_grammar_tokens > 0) {
        /* The grammar's part: the mask before each token and the advance
         * after it, over the tokens it constrained. */
        double g_ms = st.grammar_seconds * 1e3 / (double)st.n_sampled;
        printf("%-28s %10.3f %14.2f %8.1f%% %8d\n", "  of which the grammar", g_ms, step_ms,
               100 * g_ms / step_ms, res.n_completion_tokens);
        if (st.n_grammar_masks > 0) {
            double m_ms = st.grammar_mask_seconds * 1e3 / (double)st.n_grammar_masks;
            printf("%-28s %10.3f %14.2f %8.1f%% %8d\n", "  a whole-vocabulary mask", m_ms, step_ms,
                   100 * m_ms / step_ms, (int)st.n_grammar_masks);
        }
    }
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
    int rc = bench_sampling_round(model, &p, "greedy", &sp, n_predict, NULL);
    sp.temperature = 0.8f;
    sp.top_p = 0.9f;
    sp.seed = 1;
    if (!rc)
        rc = bench_sampling_round(model, &p, "top-p 0.9, temperature 0.8", &sp, n_predict, NULL);
    /* Structured output: a 10-property JSON schema (docs/benchmarks.md). */
    cellm_grammar *g = NULL;
    if (!rc && cellm_grammar_from_json_schema(BENCH_SCHEMA, strlen(BENCH_SCHEMA), &g) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        rc = 1;
    }
    if (!rc) rc = bench_sampling_round(model, &p, "json schema, 10 properties", &sp, n_predict, g);
    cellm_grammar_free(g);
    return rc;
}

/* ------------------------------------------------------------ --prefix */

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct timed {
    double wall_ms, cpu_s;
    cellm_result res;
    int32_t tok[256];
    int32_t n;
} timed;

/* Runs one request to the end (wall and CPU time) and keeps its tokens. */
static int run_timed(cellm_engine *e, cellm_request_params *rp, cellm_session *s, const char *user,
                     timed *out) {
    cellm_request *r = NULL;
    double w0 = now_s(), c0 = cpu_s();
    cellm_status st = s ? cellm_session_send(s, user, rp, &r) : cellm_submit(e, rp, &r);
    if (st != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    cellm_wait(r, &out->res);
    out->wall_ms = (now_s() - w0) * 1e3;
    out->cpu_s = cpu_s() - c0;
    const int32_t *t;
    int32_t n;
    cellm_request_tokens(r, &t, &n);
    out->n = n < 256 ? n : 256;
    memcpy(out->tok, t, (size_t)out->n * sizeof *t);
    cellm_request_free(r);
    return 0;
}

static int ask_timed(cellm_engine *e, const char *sys, const char *user, int32_t max_tokens,
                     timed *out) {
    cellm_chat_message msgs[2] = {{"system", sys}, {"user", user}};
    cellm_request_params rp = cellm_request_default_params();
    rp.messages = msgs;
    rp.n_messages = 2;
    rp.max_tokens = max_tokens;
    return run_timed(e, &rp, NULL, NULL, out);
}

static bool same_tokens(const timed *a, const timed *b) {
    return a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
}

static int bench_prefix(const char *path, const cellm_engine_params *ep, int32_t n_predict) {
    cellm_model *model = NULL;
    if (cellm_model_load(path, NULL, &model) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    /* A system prompt of at least 1,000 tokens. */
    static char sys[65536];
    size_t len = 0;
    int32_t n_sys = 0;
    for (int i = 0; n_sys < 1000 && len + 256 < sizeof sys; i++) {
        len += (size_t)snprintf(sys + len, sizeof sys - len,
                                "Rule %d: answer the user in plain words, be kind and precise, and "
                                "keep every answer short. ",
                                i + 1);
        int32_t *ids = NULL;
        if (cellm_tokenize_ex(model, sys, len, 0, &ids, &n_sys) != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            cellm_model_free(model);
            return 1;
        }
        free(ids);
    }
    cellm_engine_params p = *ep;
    if (p.max_ctx < 2048) p.max_ctx = 2048;
    p.prefix_cache = 1;
    cellm_engine_params pc = p;
    pc.prefix_cache = 0;
    cellm_engine *e = NULL, *cold = NULL;
    int rc = 0;
    if (cellm_engine_create(model, &p, &e) != CELLM_OK ||
        cellm_engine_create(model, &pc, &cold) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        cellm_engine_free(e);
        cellm_model_free(model);
        return 1;
    }
    const char *q1 = "What is the capital of France?", *q2 = "Name three colours of the rainbow.";
    timed c1, w2, w2full, ref2;
    /* Time to first token: requests of one token. */
    rc = ask_timed(e, sys, q1, 1, &c1);
    if (!rc) rc = ask_timed(e, sys, q2, 1, &w2);
    /* The warm reply in full against the engine without the cache. */
    if (!rc) rc = ask_timed(e, sys, q2, n_predict, &w2full);
    if (!rc) rc = ask_timed(cold, sys, q2, n_predict, &ref2);
    if (!rc) {
        printf("prefix cache: system prompt of %d tokens, prompts of %d and %d tokens\n", n_sys,
               c1.res.n_prompt_tokens, w2.res.n_prompt_tokens);
        printf("  cold request:  first token %8.1f ms  (CPU %6.3f s)\n", c1.wall_ms, c1.cpu_s);
        printf("  second request: first token %8.1f ms  (CPU %6.3f s), %d prompt tokens cached\n",
               w2.wall_ms, w2.cpu_s, w2.res.n_cached_tokens);
        printf("  speed-up: %.1fx wall, %.1fx CPU; %d-token reply identical to a cold engine: %s\n",
               c1.wall_ms / w2.wall_ms, c1.cpu_s / w2.cpu_s, w2full.n,
               same_tokens(&w2full, &ref2) ? "yes" : "NO");
        if (!same_tokens(&w2full, &ref2)) rc = 1;
    }
    cellm_engine_free(cold);
    cellm_engine_free(e);
    e = NULL;

    /* A session of four turns; the fifth after a save and restore on a
     * freshly loaded model and engine, against the session that goes on. */
    static const char *const turns[] = {
        "Tell me about the history of Paris.", "And what about Rome?", "Which of the two is older?",
        "Name a famous building in each.", "Which one would you visit first?"};
    char file[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(file, sizeof file, "%s/cellm-bench-session-%d.bin", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    cellm_session *s = NULL;
    cellm_session_params sp = cellm_session_default_params();
    sp.system = sys;
    sp.max_tokens = n_predict;
    timed t, next_ref, next_restored, recompute;
    double save_ms = 0, restore_ms = 0, restore_cpu = 0;
    long file_bytes = 0;
    if (!rc && (cellm_engine_create(model, &p, &e) != CELLM_OK ||
                cellm_session_create(e, &sp, &s) != CELLM_OK)) {
        cli_error("%s", cellm_last_error());
        rc = 1;
    }
    for (int i = 0; i < 4 && !rc; i++) rc = run_timed(e, NULL, s, turns[i], &t);
    if (!rc) {
        double w0 = now_s();
        if (cellm_session_save(s, file) != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            rc = 1;
        }
        save_ms = (now_s() - w0) * 1e3;
        FILE *f = fopen(file, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            file_bytes = ftell(f);
            fclose(f);
        }
    }
    /* Recomputing the conversation: its messages as one cold request. */
    if (!rc) {
        const cellm_chat_message *msgs;
        int32_t n;
        cellm_session_messages(s, &msgs, &n);
        if (cellm_engine_create(model, &pc, &cold) != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            rc = 1;
        } else {
            cellm_request_params rp = cellm_request_default_params();
            rp.messages = msgs;
            rp.n_messages = n;
            rp.max_tokens = 1;
            rc = run_timed(cold, &rp, NULL, NULL, &recompute);
            cellm_engine_free(cold);
        }
    }
    if (!rc) rc = run_timed(e, NULL, s, turns[4], &next_ref);
    cellm_session_free(s);
    s = NULL;
    cellm_engine_free(e);
    e = NULL;
    cellm_model_free(model);
    model = NULL;
    /* "Restarted": a new model, a new engine, the session from its file. */
    if (!rc) {
        if (cellm_model_load(path, NULL, &model) != CELLM_OK ||
            cellm_engine_create(model, &p, &e) != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            rc = 1;
        }
        double w1 = now_s(), c1s = cpu_s();
        if (!rc && cellm_session_restore(e, file, &sp, &s) != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            rc = 1;
        }
        restore_ms = (now_s() - w1) * 1e3;
        restore_cpu = cpu_s() - c1s;
    }
    if (!rc) rc = run_timed(e, NULL, s, turns[4], &next_restored);
    if (!rc) {
        printf("session file: %.1f MiB for a conversation of %d tokens; save %.1f ms\n",
               (double)file_bytes / (1 << 20), recompute.res.n_prompt_tokens, save_ms);
        printf("  restore %8.1f ms (CPU %6.3f s) vs recompute %8.1f ms (CPU %6.3f s): %.1f%% wall, "
               "%.1f%% CPU\n",
               restore_ms, restore_cpu, recompute.wall_ms, recompute.cpu_s,
               100 * restore_ms / recompute.wall_ms, 100 * restore_cpu / recompute.cpu_s);
        printf("  next turn after restore: %d of %d prompt tokens cached; identical to the "
               "uninterrupted session: %s\n",
               next_restored.res.n_cached_tokens, next_restored.res.n_prompt_tokens,
               same_tokens(&next_restored, &next_ref) ? "yes" : "NO");
        if (!same_tokens(&next_restored, &next_ref)) rc = 1;
    }
    remove(file);
    cellm_session_free(s);
    cellm_engine_free(e);
    cellm_model_free(model);
    return rc;
}

/* --load: model load to the first token of a 16-token prompt, the way an
 * app starts (file in the page cache): load, create an engine, submit,
 * first piece. Five runs; each phase's median in ms. */
static int bench_load(const char *path, const cellm_engine_params *ep) {
    enum { RUNS = 5 };
    double ph[4][RUNS];
    /* 16 tokens with SmolLM2's tokenizer (17 with Gemma 3's BOS). */
    const char *prompt = "The quick brown fox jumps over the lazy dog, and then it runs far away";
    int32_t n_prompt = 0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_s();
        cellm_model *m = NULL;
        if (cellm_model_load(path, NULL, &m) != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            return 1;
        }
        double t1 = now_s();
        cellm_engine *e = NULL;
        if (cellm_engine_create(m, ep, &e) != CELLM_OK) {
            cli_error("%s", cellm_last_error());
            cellm_model_free(m);
            return 1;
        }
        double t2 = now_s();
        cellm_request_params rp = cellm_request_default_params();
        rp.prompt = prompt;
        rp.max_tokens = 1;
        cellm_request *req = NULL;
        cellm_result res;
        int rc =
            cellm_submit(e, &rp, &req) == CELLM_OK && cellm_wait(req, &res) == CELLM_OK ? 0 : 1;
        double t3 = now_s();
        if (rc) cli_error("%s", cellm_last_error());
        n_prompt = rc ? 0 : res.n_prompt_tokens;
        cellm_request_free(req);
        cellm_engine_free(e);
        cellm_model_free(m);
        if (rc) return 1;
        ph[0][r] = (t1 - t0) * 1e3;
        ph[1][r] = (t2 - t1) * 1e3;
        ph[2][r] = (t3 - t2) * 1e3;
        ph[3][r] = (t3 - t0) * 1e3;
    }
    double med[4];
    for (int k = 0; k < 4; k++) {
        for (int i = 1; i < RUNS; i++) /* insertion sort */
            for (int j = i; j > 0 && ph[k][j] < ph[k][j - 1]; j--) {
                double t = ph[k][j];
                ph[k][j] = ph[k][j - 1];
                ph[k][j - 1] = t;
            }
        med[k] = ph[k][RUNS / 2];
    }
    printf("load to first token (%d-token prompt, median of %d): %.1f ms = model load %.1f + "
           "engine %.1f + first token %.1f (total range %.1f..%.1f)\n",
           n_prompt, RUNS, med[3], med[0], med[1], med[2], ph[3][0], ph[3][RUNS - 1]);
    return 0;
}

/* ---- --pp / --tg: single-request speed, as llama-bench measures it ---- */

#define SPEED_MAX_TESTS 16
#define SPEED_MAX_REPS 100

typedef struct speed_test {
    bool gen;  /* tg (generation) or pp (prompt processing) */
    int32_t n; /* tokens */
    double tps[SPEED_MAX_REPS];
    int reps;
    double med, lo, hi;
} speed_test;

static int cmp_tps(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One request of `n_prompt` tokens generating `n_gen`; tokens/s of the
 * prompt (to the first token) or of the generation (after it) in *tps. */
static int speed_once(cellm_engine *e, const cellm_model *model, int32_t n_prompt, int32_t n_gen,
                      int32_t eos, bool gen, double *tps) {
    int32_t *ids = NULL, n_ids = 0;
    if (padded_prompt(model, "Once upon a time", n_prompt, &ids, &n_ids) != CELLM_OK ||
        n_ids != n_prompt) {
        free(ids);
        cli_error("bench: cannot make a prompt of %d tokens", n_prompt);
        return 1;
    }
    cellm_request_params rp = cellm_request_default_params();
    rp.tokens = ids;
    rp.n_tokens = n_ids;
    rp.max_tokens = n_gen;
    cellm_logit_bias ban = {.token = eos, .bias = -INFINITY};
    if (eos >= 0) { /* every request generates n_gen tokens */
        rp.sampling.logit_bias = &ban;
        rp.sampling.n_logit_bias = 1;
    }
    cellm_request *r = NULL;
    cellm_result res;
    int rc = cellm_submit(e, &rp, &r) == CELLM_OK && cellm_wait(r, &res) == CELLM_OK &&
                     res.status == CELLM_OK
                 ? 0
                 : 1;
    free(ids);
    if (rc) {
        cli_error("bench: %s", r ? cellm_request_error(r) : cellm_last_error());
    } else if (gen) {
        double dt = (res.total_ms - res.first_token_ms) / 1e3;
        *tps = res.n_completion_tokens > 1 && dt > 0 ? (res.n_completion_tokens - 1) / dt : 0;
    } else {
        double dt = (res.first_token_ms - res.queue_ms) / 1e3;
        *tps = dt > 0 ? n_prompt / dt : 0;
    }
    cellm_request_free(r);
    return rc;
}

static int bench_speed(const char *path, const char *name, const cellm_engine_params *ep,
                       speed_test *tests, int n_tests, int reps, int bw_samples, bool json) {
    cellm_model *model = NULL;
    if (cellm_model_load(path, NULL, &model) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    cellm_model_info info;
    cellm_model_get_info(model, &info);
    int32_t longest = 1;
    for (int i = 0; i < n_tests; i++)
        if (tests[i].n + 2 > longest) longest = tests[i].n + 2;
    cellm_engine_params p = *ep;
    p.prefix_cache = 0; /* every prompt computed */
    p.max_seqs = 1;
    if (p.max_ctx < longest) p.max_ctx = longest;
    /* Prompts in chunks of up to 512 rows, as llama-bench's default batch. */
    const int32_t chunk = longest < 512 ? longest : 512;
    if (p.max_batch_tokens < chunk) p.max_batch_tokens = chunk;
    cellm_engine *e = NULL;
    if (cellm_engine_create(model, &p, &e) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        cellm_model_free(model);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < n_tests && !rc; i++) {
        speed_test *t = &tests[i];
        const int32_t n_prompt = t->gen ? 1 : t->n, n_gen = t->gen ? t->n + 1 : 1;
        double warm;
        rc = speed_once(e, model, n_prompt, n_gen, info.eos, t->gen, &warm);
        for (t->reps = 0; t->reps < reps && !rc; t->reps++)
            rc = speed_once(e, model, n_prompt, n_gen, info.eos, t->gen, &t->tps[t->reps]);
        if (rc) break;
        double s[SPEED_MAX_REPS];
        memcpy(s, t->tps, sizeof(double) * (size_t)t->reps);
        qsort(s, (size_t)t->reps, sizeof *s, cmp_tps);
        t->lo = s[0];
        t->hi = s[t->reps - 1];
        t->med = t->reps % 2 ? s[t->reps / 2] : (s[t->reps / 2 - 1] + s[t->reps / 2]) / 2;
    }
    cellm_engine_free(e);
    cellm_model_free(model);
    if (rc) return rc;

    const double rss = peak_rss_mib(); /* before the bandwidth buffer */
    uint64_t elems;
    const uint64_t wbytes = weight_bytes_per_token(path, &elems);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int threads = ep->n_threads > 0 ? ep->n_threads
                        : cores < 1       ? 1
                        : cores > 4       ? 4
                                          : (int)cores;
    bench_bandwidth bw;
    if (!bench_read_bandwidth((unsigned)threads, bw_samples, &bw))
        cli_error("bench: cannot measure the read bandwidth (no %zu MiB buffer)",
                  bench_bandwidth_buffer_bytes(bench_llc_bytes()) >> 20);
    const double bw_gbs = bw.median_gbs; /* what every share divides by */
    if (json) {
        printf("{\"model\": \"%s\", \"threads\": %d, \"weight_bytes_per_token\": %llu, "
               "\"read_bandwidth_gbs\": %.2f, \"read_bandwidth_min_gbs\": %.2f, "
               "\"read_bandwidth_max_gbs\": %.2f, \"read_bandwidth_samples\": %d, "
               "\"read_bandwidth_buffer_mib\": %zu, \"last_level_cache_mib\": %.1f, "
               "\"peak_rss_mib\": %.1f, \"tests\": [",
               name, threads, (unsigned long long)wbytes, bw_gbs, bw.min_gbs, bw.max_gbs,
               bw.samples, bw.buffer_bytes >> 20, (double)bw.llc_bytes / (1 << 20), rss);
        for (int i = 0; i < n_tests; i++) {
            const speed_test *t = &tests[i];
            printf("%s\n  {\"test\": \"%s%d\", \"tokens_per_s\": {\"median\": %.2f, \"min\": %.2f, "
                   "\"max\": %.2f}, \"samples\": [",
                   i ? "," : "", t->gen ? "tg" : "pp", t->n, t->med, t->lo, t->hi);
            for (int r = 0; r < t->reps; r++) printf("%s%.2f", r ? ", " : "", t->tps[r]);
            printf("]");
            if (t->gen && bw_gbs > 0)
                printf(", \"bandwidth_fraction\": %.4f", (double)wbytes * t->med / 1e9 / bw_gbs);
            printf("}");
        }
        printf("\n]}\n");
        return 0;
    }
    printf("model %s, %d threads, %.1f MiB of weights per token\n", name, threads,
           (double)wbytes / (1 << 20));
    if (bw_gbs > 0) {
        printf("read bandwidth (%u thread%s): median %.2f GB/s, range %.2f-%.2f, of %d passes "
               "over ",
               bw.threads, bw.threads > 1 ? "s" : "", bw_gbs, bw.min_gbs, bw.max_gbs, bw.samples);
        bench_print_buffer_rule(bw.buffer_bytes, bw.llc_bytes);
        printf("; %% of bandwidth divides by the median\n");
    }
    printf("\n| test | tokens/s (median of %d) | range | ms/token | weights GB/s | %% of bandwidth "
           "|\n",
           reps);
    printf("| --- | ---: | --- | ---: | ---: | ---: |\n");
    for (int i = 0; i < n_tests; i++) {
        const speed_test *t = &tests[i];
        printf("| %s%d | %.1f | %.1f-%.1f | %.2f |", t->gen ? "tg" : "pp", t->n, t->med, t->lo,
               t->hi, 1e3 / t->med);
        if (t->gen && bw_gbs > 0)
            printf(" %.1f | %.1f%% |\n", (double)wbytes * t->med / 1e9,
                   100 * (double)wbytes * t->med / 1e9 / bw_gbs);
        else
            printf(" | |\n");
    }
    printf("\npeak RSS %.1f MiB\n", rss);
    return 0;
}

/* Appends a --pp or --tg list to tests; false on a bad list. */
static bool parse_speed_list(const char *s, bool gen, speed_test *tests, int *n_tests) {
    while (*s) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s || n < 1 || n > 65536 || (*end && *end != ',') || *n_tests >= SPEED_MAX_TESTS)
            return false;
        tests[(*n_tests)++] = (speed_test){.gen = gen, .n = (int32_t)n};
        s = *end ? end + 1 : end;
    }
    return true;
}

/* A number 0..1 (--draft-p-min). */
static bool parse_unit(const char *s, float *out) {
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !(d >= 0 && d <= 1)) return false;
    *out = (float)d;
    return true;
}

int cmd_bench(int argc, char **argv) {
    const char *model_name = NULL, *sessions = "1,2,4,8,16";
    cellm_engine_params ep = cellm_engine_default_params();
    ep.mem_budget_bytes = (size_t)512 << 20;
    ep.max_ctx = 1024;
    int32_t n_predict = 64, prompt_tokens = 0;
    bool sampling_only = false, prefix_only = false, load_only = false, json = false;
    speed_test tests[SPEED_MAX_TESTS];
    int n_tests = 0, reps = 5, bw_samples = BENCH_BW_SAMPLES;
    /* Speculative decoding (bench_spec.c); its own defaults for what the
     * command line leaves alone. */
    bench_spec_opts so = {
        .draft_max = -1, .draft_min = -1, .draft_p_min = -1, .tasks = "prose,edit,summary"};
    const char *draft_name = NULL;
    long gpu_layers = -1;
    bool spec = false, set_sessions = false, set_n = false, set_reps = false, set_ctx = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long u;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-s") || !strcmp(a, "--sessions")) && v) {
            sessions = v;
            set_sessions = true;
            i++;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--n-predict")) && v &&
                   cli_parse_uint(v, 1u << 20, &u) && u > 0) {
            n_predict = (int32_t)u;
            set_n = true;
            i++;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && v &&
                   cli_parse_uint(v, 256, &u)) {
            ep.n_threads = (int)u;
            i++;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--mem")) && v &&
                   cli_parse_size(v, &ep.mem_budget_bytes)) {
            i++;
        } else if (!strcmp(a, "--mem-budget") && v && cli_parse_size(v, &ep.process_budget_bytes) &&
                   ep.process_budget_bytes > 0) {
            i++;
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) && v &&
                   cli_parse_uint(v, 1u << 20, &u) && u >= 64) {
            ep.max_ctx = (int32_t)u;
            set_ctx = true;
            i++;
        } else if (!strcmp(a, "--ignore-eos")) {
            g_ignore_eos = true;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt-tokens")) && v &&
                   cli_parse_uint(v, 1u << 24, &u)) {
            prompt_tokens = (int32_t)u;
            i++;
        } else if (!strcmp(a, "--kv-type") && v && cli_parse_kv_type(v, &ep.kv_type)) {
            i++;
        } else if (!strcmp(a, "--device") && v && cli_parse_device(v, &ep.device)) {
            i++;
        } else if (cli_is_gpu_layers(a) && cli_parse_gpu_layers(v, &gpu_layers)) {
            i++;
        } else if (!strcmp(a, "--sampling")) {
            sampling_only = true;
        } else if (!strcmp(a, "--prefix")) {
            prefix_only = true;
        } else if (!strcmp(a, "--load")) {
            load_only = true;
        } else if ((!strcmp(a, "--pp") || !strcmp(a, "--tg")) && v &&
                   parse_speed_list(v, a[2] == 't', tests, &n_tests)) {
            i++;
        } else if ((!strcmp(a, "-r") || !strcmp(a, "--reps")) && v &&
                   cli_parse_uint(v, SPEED_MAX_REPS, &u) && u > 0) {
            reps = (int)u;
            set_reps = true;
            i++;
        } else if (!strcmp(a, "--bw-samples") && v && cli_parse_uint(v, 10000, &u) && u > 0) {
            bw_samples = (int)u;
            i++;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--draft") && v) {
            draft_name = v;
            spec = true;
            i++;
        } else if (!strcmp(a, "--lookup") && v && cli_parse_uint(v, 64, &u) && u > 0) {
            so.lookup = (int32_t)u;
            spec = true;
            i++;
        } else if (!strcmp(a, "--draft-max") && v && cli_parse_uint(v, 64, &u) && u > 0) {
            so.draft_max = (int32_t)u;
            i++;
        } else if (!strcmp(a, "--draft-min") && v && cli_parse_uint(v, 64, &u)) {
            so.draft_min = (int32_t)u;
            i++;
        } else if (!strcmp(a, "--draft-p-min") && v && parse_unit(v, &so.draft_p_min)) {
            i++;
        } else if (!strcmp(a, "--draft-always")) {
            so.draft_always = true;
        } else if (!strcmp(a, "--spec-accept") && v && cli_parse_spec_accept(v, &so.accept)) {
            i++;
        } else if (!strcmp(a, "--spec-temp") && v && parse_unit(v, &so.temp)) {
            i++;
        } else if (!strcmp(a, "--spec-task") && v) {
            so.tasks = v;
            i++;
        } else if (!strcmp(a, "--spec-prompts")) {
            so.dump = spec = true;
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
    cli_apply_gpu_layers(gpu_layers, &ep.device, &ep.gpu_layers);
    char path[4096];
    cellm_error err;
    err_clear(&err);
    if (cli_resolve_model(model_name ? model_name : BENCH_DEFAULT_MODEL, path, sizeof path, &err) !=
        CELLM_OK) {
        cli_error("%s", err.msg);
        return 1;
    }
    if (spec) {
        char dpath[4096];
        if (draft_name && cli_resolve_model(draft_name, dpath, sizeof dpath, &err) != CELLM_OK) {
            cli_error("bench: draft model: %s", err.msg);
            return 1;
        }
        so.draft_path = draft_name ? dpath : NULL;
        so.sessions = set_sessions ? sessions : "1,8";
        so.n_predict = set_n ? n_predict : 64;
        so.reps = set_reps ? reps : 3;
        so.json = json;
        if (!set_ctx) ep.max_ctx = 2048; /* a long prompt and its answer */
        return bench_spec(path, model_name ? model_name : BENCH_DEFAULT_MODEL, &ep, &so);
    }
    if (prefix_only) return bench_prefix(path, &ep, n_predict < 32 ? n_predict : 32);
    if (load_only) return bench_load(path, &ep);
    if (n_tests)
        return bench_speed(path, model_name ? model_name : BENCH_DEFAULT_MODEL, &ep, tests, n_tests,
                           reps, bw_samples, json);
    cellm_model *model = NULL;
    if (cellm_model_load(path, NULL, &model) != CELLM_OK) {
        cli_error("%s", cellm_last_error());
        return 1;
    }
    int rc = 0;
    weight_bytes_per_token(path, &g_weight_elems);
    if (!sampling_only)
        printf("%8s %14s %14s %12s %10s %8s %8s %9s %10s\n", "sessions", "decode tok/s",
               "wall tok/s", "ttft ms", "preempted", "act MiB", "KV MiB", "peak RSS",
               "weight GF/s");
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
