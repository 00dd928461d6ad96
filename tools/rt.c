/*
 * rt.c — model runtime and sampling flags for the generating commands (see
 * rt.h).
 */
#include "rt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "store.h"

cellm_status rt_open(const char *name_or_path, const rt_opts *o, rt *r, cellm_error *err) {
    memset(r, 0, sizeof *r);
    char path[4096];
    cellm_status st = store_resolve(name_or_path, true, path, sizeof path, err);
    if (st) return st;
    if ((st = model_load(path, &r->m, err))) return st;
    if ((st = tokenizer_load(r->m->file, &r->tok, err))) goto fail;
    int threads = o->threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : n > 4 ? 4 : (int)n;
    }
    r->ctx = o->ctx > 0 ? o->ctx : (r->m->n_ctx_train < 4096 ? r->m->n_ctx_train : 4096);
    r->batch = o->batch > 0 ? o->batch : 256;
    int32_t logit_rows = o->logit_rows > 0 ? o->logit_rows : 1;
    if (logit_rows > r->batch) logit_rows = r->batch;
    if ((st = kv_type_check(r->m, o->kv_type, err))) goto fail;
    /* One sequence, fed in chunks of up to `batch` positions (rt_feed). */
    size_t kv_bytes = kv_cache_bytes(r->m, o->kv_type, r->ctx, 1, r->batch);
    if ((st = kv_cache_create(r->m, kv_bytes, r->ctx, 1, r->batch, o->kv_type, &r->kv, err)))
        goto fail;
    if ((st = tp_create(threads, &r->tp, err))) goto fail;
    if ((st = forward_create(r->m, r->kv, r->tp, r->batch, logit_rows, &r->fwd, err))) goto fail;
    return CELLM_OK;
fail:
    rt_close(r);
    return st;
}

void rt_close(rt *r) {
    forward_free(r->fwd);
    tp_destroy(r->tp);
    kv_cache_free(r->kv);
    tokenizer_free(r->tok);
    model_free(r->m);
    memset(r, 0, sizeof *r);
}

cellm_status rt_feed(rt *r, kv_seq *s, const int32_t *tok, int32_t n, float *logits,
                     cellm_error *err) {
    fwd_row rows[512];
    int32_t chunk = r->batch < 512 ? r->batch : 512;
    for (int32_t i = 0; i < n; i += chunk) {
        int32_t c = n - i < chunk ? n - i : chunk;
        for (int32_t j = 0; j < c; j++)
            rows[j] = (fwd_row){s, tok[i + j], s->n_pos + j, logits && i + j == n - 1};
        const float *lg;
        cellm_status st = forward_run(r->fwd, rows, c, &lg, err);
        if (st) return st;
        if (logits && i + c == n) memcpy(logits, lg, sizeof(float) * (size_t)r->m->n_vocab);
    }
    return CELLM_OK;
}

void rt_sampling_init(rt_sampling *rs) {
    memset(rs, 0, sizeof *rs);
    rs->s = cellm_request_default_params().sampling;
    rs->s.logit_bias = rs->bias;
}

/* A number in [lo, hi] ("inf" and "-inf" only where the range has them). */
static bool parse_num(const char *v, double lo, double hi, double *out) {
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end || !(d >= lo && d <= hi)) return false;
    *out = d;
    return true;
}

/* "ID+X" or "ID-X" (X may be "inf"). */
static bool parse_bias(const char *v, cellm_logit_bias *b) {
    char *end;
    long id = strtol(v, &end, 10);
    if (end == v || id < 0 || id > INT32_MAX || (*end != '+' && *end != '-')) return false;
    double x;
    if (!parse_num(end + 1, 0, INFINITY, &x)) return false;
    b->token = (int32_t)id;
    b->bias = (float)(*end == '-' ? -x : x);
    return true;
}

int rt_sampling_flag(rt_sampling *rs, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    /* In the order of the switch at the end. */
    static const struct {
        const char *name, *alt;
        double lo, hi;
    } nums[] = {
        {"--temp", NULL, 0, 100},
        {"--top-k", NULL, 0, 1 << 24},
        {"--top-p", NULL, 0, 1},
        {"--min-p", NULL, 0, 1},
        {"--typical", NULL, 0, 1},
        {"--repeat-penalty", NULL, 0, 100}, /* 0 itself is refused below */
        {"--repeat-last-n", NULL, -1, 1 << 24},
        {"--presence-penalty", NULL, -100, 100},
        {"--frequency-penalty", NULL, -100, 100},
        {"--ngram-guard", NULL, 0, 64},
        {"--ngram-guard-repeats", NULL, 1, 1 << 20},
        {"--seed", "-s", -1, 18446744073709551615.0},
        {"--logit-bias", NULL, 0, 0},
        {"--reverse-prompt", "-r", 0, 0},
    };
    int k = 0, n = (int)(sizeof nums / sizeof *nums);
    while (k < n && strcmp(a, nums[k].name) && !(nums[k].alt && !strcmp(a, nums[k].alt))) k++;
    if (k == n) return 0;
    if (*i + 1 >= argc) {
        cli_error("%s: %s needs a value", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    cellm_sampling *s = &rs->s;
    if (!strcmp(nums[k].name, "--logit-bias")) {
        if (rs->s.n_logit_bias >= CELLM_MAX_LOGIT_BIAS) {
            cli_error("%s: at most %d --logit-bias", cmd, CELLM_MAX_LOGIT_BIAS);
            return -1;
        }
        if (!parse_bias(v, &rs->bias[rs->s.n_logit_bias])) {
            cli_error("%s: --logit-bias needs TOKEN_ID+BIAS or TOKEN_ID-BIAS, such as 15043+1 or "
                      "15043-inf (got '%s')",
                      cmd, v);
            return -1;
        }
        s->n_logit_bias++;
        s->logit_bias = rs->bias;
        return 1;
    }
    if (!strcmp(nums[k].name, "--reverse-prompt")) {
        size_t len = strlen(v);
        if (rs->n_stop >= CELLM_MAX_STOP_STRINGS || len < 1 || len > CELLM_MAX_STOP_LEN) {
            cli_error("%s: %s takes 1..%d bytes, at most %d times", cmd, a, CELLM_MAX_STOP_LEN,
                      CELLM_MAX_STOP_STRINGS);
            return -1;
        }
        rs->stop[rs->n_stop++] = v;
        return 1;
    }
    if (!strcmp(nums[k].name, "--seed") && !strcmp(v, "-1")) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->seed =
            (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
        return 1;
    }
    if (!strcmp(nums[k].name, "--seed")) {
        unsigned long long u;
        if (!cli_parse_uint(v, ~0ull, &u)) {
            cli_error("%s: %s needs a whole number, or -1 for a random seed (got '%s')", cmd, a, v);
            return -1;
        }
        s->seed = u;
        return 1;
    }
    double d;
    bool whole =
        !strcmp(a, "--top-k") || !strcmp(a, "--repeat-last-n") || !strncmp(a, "--ngram", 7);
    if (!parse_num(v, nums[k].lo, nums[k].hi, &d) || (whole && d != floor(d)) ||
        (k == 5 && d == 0)) {
        cli_error("%s: %s needs a %s from %.10g%s to %.10g (got '%s')", cmd, a,
                  whole ? "whole number" : "number", nums[k].lo, k == 5 ? " (exclusive)" : "",
                  nums[k].hi, v);
        return -1;
    }
    switch (k) {
    case 0: s->temperature = (float)d; break;
    case 1: s->top_k = (int32_t)d; break;
    case 2: s->top_p = (float)d; break;
    case 3: s->min_p = (float)d; break;
    case 4: s->typical_p = (float)d; break;
    case 5: s->repeat_penalty = (float)d; break;
    case 6: s->repeat_last_n = (int32_t)d; break;
    case 7: s->presence_penalty = (float)d; break;
    case 8: s->frequency_penalty = (float)d; break;
    case 9: s->ngram_guard = (int32_t)d; break;
    case 10: s->ngram_guard_repeats = (int32_t)d; break;
    }
    return 1;
}

sampler_params rt_sampler_params(const rt_sampling *rs, int32_t ctx) {
    const cellm_sampling *s = &rs->s;
    sampler_params p = sampler_default_params();
    p.temperature = s->temperature;
    p.top_k = s->top_k;
    p.top_p = s->top_p;
    p.min_p = s->min_p;
    p.typical_p = s->typical_p;
    p.seed = s->seed;
    p.repeat_penalty = s->repeat_penalty;
    p.penalty_last_n = s->repeat_last_n < 0 || s->repeat_last_n > ctx ? ctx : s->repeat_last_n;
    p.presence_penalty = s->presence_penalty;
    p.frequency_penalty = s->frequency_penalty;
    p.ngram_size = s->ngram_guard;
    p.ngram_max_repeats = s->ngram_guard_repeats;
    p.logit_bias = (const sampler_logit_bias *)rs->bias;
    p.n_logit_bias = s->n_logit_bias;
    return p;
}
