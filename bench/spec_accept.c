/*
 * spec_accept.c — what cellm's exact acceptance rule costs against the
 * standard speculative-sampling rule, measured on a target/draft pair.
 *
 * cellm keeps a draft token only while it equals the target's own draw at
 * that position (src/runtime/spec.c), with the draft guessing greedily: a guess is
 * kept with probability P(argmax Q), and the text is the plain run's. The
 * standard rule (Leviathan et al., Chen et al.) samples the guess from the
 * draft's distribution Q and keeps it with probability min(1, P/Q),
 * resampling from max(0, P - Q) otherwise: the target's distribution, but
 * not the plain run's text; a guess is kept with probability
 * sum_x min(P(x), Q(x)). Both P and Q here are the distributions the
 * sampler draws from (temperature, then top-k, top-p, min-p).
 *
 * The program runs the target's plain sampled generation from a few
 * prompts, feeds the same tokens to the draft, and averages both
 * acceptance probabilities (and, for greedy runs, how often the argmaxes
 * agree) over every generated position. Not built by CMake; from the
 * repository root after building ./build:
 *
 *   cc -O2 -Isrc -Iinclude -Itools bench/spec_accept.c build/libcellm_tool.a \
 *      build/libcellm.a -lm -lpthread -ledit -lmicrohttpd -lcjson -o build/spec_accept
 *   ./build/spec_accept TARGET.gguf DRAFT.gguf [TOKENS_PER_PROMPT]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

static const char *const prompts[] = {
    "Once upon a time, in a small village by the sea,", "The best way to learn a language is",
    "Photosynthesis is the process by which",           "Dear Sir or Madam,\n\nI am writing to",
    "The weather forecast for tomorrow says",           "Why is the sky blue? Because",
    "The history of the printing press begins",         "Here is a short story about a robot who",
};

#define TEMP 0.8
#define TOP_K 40
#define TOP_P 0.95
#define MIN_P 0.05

static const float *g_key;
static int by_key_desc(const void *a, const void *b) {
    float x = g_key[*(const int32_t *)a], y = g_key[*(const int32_t *)b];
    return x < y ? 1 : x > y ? -1 : *(const int32_t *)a - *(const int32_t *)b;
}

/* The distribution the sampler draws from for logits l: softmax(l / T)
 * truncated by top-k, top-p, min-p and renormalised, into p (zeros
 * outside the kept set). idx is scratch of n entries. */
static void kept_dist(const float *l, int32_t n, double *p, int32_t *idx) {
    for (int32_t i = 0; i < n; i++) idx[i] = i;
    g_key = l;
    qsort(idx, (size_t)n, sizeof *idx, by_key_desc);
    int32_t k = TOP_K < n ? TOP_K : n;
    double mx = l[idx[0]], z = 0;
    for (int32_t i = 0; i < n; i++) p[i] = 0;
    double w[TOP_K];
    for (int32_t i = 0; i < k; i++) z += w[i] = exp((l[idx[i]] - mx) / TEMP);
    int32_t m = 0;
    double acc = 0;
    while (m < k && (m == 0 || acc < TOP_P * z)) acc += w[m++];
    int32_t keep = 0;
    double zk = 0;
    for (int32_t i = 0; i < m; i++)
        if (w[i] >= MIN_P * w[0]) zk += w[i], keep = i + 1;
    for (int32_t i = 0; i < keep; i++) p[idx[i]] = w[i] / zk;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TARGET.gguf DRAFT.gguf [TOKENS_PER_PROMPT]\n", argv[0]);
        return 2;
    }
    int n_gen = argc > 3 ? atoi(argv[3]) : 64;
    cellm_error err;
    err_clear(&err);
    rt_opts o = {0};
    o.threads = 2;
    o.ctx = 512;
    o.batch = 64;
    o.logit_rows = 1;
    rt t, d;
    if (rt_open(argv[1], &o, &t, &err) || rt_open(argv[2], &o, &d, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t V = t.m->n_vocab;
    float *lt = malloc(sizeof(float) * (size_t)V), *ld = malloc(sizeof(float) * (size_t)V);
    double *p = malloc(sizeof(double) * (size_t)V), *q = malloc(sizeof(double) * (size_t)V);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)V);
    sampler_params sp = sampler_default_params();
    sp.temperature = (float)TEMP;
    sp.top_k = TOP_K;
    sp.top_p = (float)TOP_P;
    sp.min_p = (float)MIN_P;
    double sum_ours = 0, sum_std = 0, n_pos = 0, n_argmax = 0;
    for (size_t pi = 0; pi < sizeof prompts / sizeof prompts[0]; pi++) {
        tok_ids ids = {0};
        kv_seq st, sd;
        sampler *smp = NULL;
        sp.seed = 100 + pi;
        if (tokenizer_encode(t.tok, prompts[pi], strlen(prompts[pi]), TOK_ADD_SPECIAL, &ids,
                             &err) ||
            kv_seq_init(t.kv, &st, &err) || kv_seq_init(d.kv, &sd, &err) ||
            sampler_create(&sp, V, &smp, &err) ||
            rt_feed(&t, &st, ids.ids, (int32_t)ids.n, lt, &err) ||
            rt_feed(&d, &sd, ids.ids, (int32_t)ids.n, ld, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < n_gen; i++) {
            kept_dist(lt, V, p, idx);
            kept_dist(ld, V, q, idx);
            int32_t g = sampler_argmax(ld, V);
            sum_ours += p[g];
            double s = 0;
            for (int32_t x = 0; x < V; x++) s += p[x] < q[x] ? p[x] : q[x];
            sum_std += s;
            n_argmax += sampler_argmax(lt, V) == g;
            n_pos++;
            int32_t tok = sampler_sample(smp, lt);
            if (tok == tokenizer_eos(t.tok)) break;
            sampler_accept(smp, tok, NULL);
            if (rt_feed(&t, &st, &tok, 1, lt, &err) || rt_feed(&d, &sd, &tok, 1, ld, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        }
        sampler_free(smp);
        kv_seq_free(t.kv, &st);
        kv_seq_free(d.kv, &sd);
        tok_ids_free(&ids);
    }
    double a = sum_ours / n_pos, b = sum_std / n_pos;
    printf("positions: %.0f (T %.2f, top-k %d, top-p %.2f, min-p %.2f)\n", n_pos, TEMP, TOP_K,
           TOP_P, MIN_P);
    printf("greedy guess kept, sampled run (cellm's exact rule): %.3f\n", a);
    printf("sampled guess kept (the standard accept/resample rule): %.3f\n", b);
    printf("greedy run, argmaxes agree: %.3f\n", n_argmax / n_pos);
    for (int k = 2; k <= 8; k *= 2)
        printf("tokens per target pass with k = %d guesses (independent positions): exact %.2f, "
               "standard %.2f\n",
               k, (1 - pow(a, k + 1)) / (1 - a), (1 - pow(b, k + 1)) / (1 - b));
    free(lt);
    free(ld);
    free(p);
    free(q);
    free(idx);
    rt_close(&d);
    rt_close(&t);
    return 0;
}
