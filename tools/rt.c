/*
 * rt.c — model runtime, sampling flags and one sequence's speculative
 * decoding for the generating commands (see rt.h).
 */
#include "rt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "model/kv_calib.h"
#include "runtime/engine.h"
#include "store.h"

cellm_status rt_open(const char *name_or_path, const rt_opts *o, rt *r, cellm_error *err) {
    memset(r, 0, sizeof *r);
    char path[4096];
    cellm_status st = store_resolve(name_or_path, true, path, sizeof path, err);
    if (st) return st;
    if ((st = cellm_model_load(path, NULL, &r->cm)))
        return err_set(err, st, "%s", cellm_last_error());
    r->m = r->cm->m;
    r->tok = r->cm->tok;
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
    /* One sequence, fed in chunks of up to `batch` positions (rt_feed),
     * and windowed layers keep `slack` positions more for truncation. */
    int32_t chunk = r->batch + o->slack;
    size_t kv_bytes = kv_cache_bytes(r->m, o->kv_type, r->ctx, 1, chunk);
    if ((st = kv_cache_create(r->m, kv_bytes, r->ctx, 1, chunk, o->kv_type, &r->kv, err)))
        goto fail;
    r->kv->seq_slack = o->slack;
    r->own_tp = !o->tp;
    if (o->tp)
        r->tp = o->tp;
    else if ((st = tp_create(threads, &r->tp, err)))
        goto fail;
    if ((st = device_backend(o->device, o->gpu_layers, r->m, r->kv, r->tp, r->batch, logit_rows,
                             &r->fwd, err)) ||
        (st = kv_calibrate(r->kv, r->m, r->tok, &r->fwd, r->batch, err)))
        goto fail;
    return CELLM_OK;
fail:
    rt_close(r);
    return st;
}

void rt_close(rt *r) {
    backend_free(&r->fwd);
    if (r->own_tp) tp_destroy(r->tp);
    kv_cache_free(r->kv);
    cellm_model_free(r->cm);
    memset(r, 0, sizeof *r);
}

cellm_status rt_feed_last(rt *r, kv_seq *s, const int32_t *tok, int32_t n, const float **logits,
                          cellm_error *err) {
    fwd_row rows[512];
    int32_t chunk = r->batch < 512 ? r->batch : 512;
    for (int32_t i = 0; i < n; i += chunk) {
        int32_t c = n - i < chunk ? n - i : chunk;
        for (int32_t j = 0; j < c; j++)
            rows[j] = (fwd_row){s, tok[i + j], s->n_pos + j, logits && i + j == n - 1};
        const float *lg;
        cellm_status st = backend_run(&r->fwd, rows, c, &lg, err);
        if (st) return st;
        if (logits && i + c == n) *logits = lg;
    }
    return CELLM_OK;
}

cellm_status rt_feed(rt *r, kv_seq *s, const int32_t *tok, int32_t n, float *logits,
                     cellm_error *err) {
    const float *lg = NULL;
    cellm_status st = rt_feed_last(r, s, tok, n, logits ? &lg : NULL, err);
    if (!st && logits && lg) memcpy(logits, lg, sizeof(float) * (size_t)r->m->n_vocab);
    return st;
}

cellm_status rt_feed_image(rt *r, kv_seq *s, const int32_t *tok, int32_t n, int32_t image_token,
                           const float *embd, int32_t n_embd_rows, float *logits,
                           cellm_error *err) {
    int32_t n_img = 0;
    for (int32_t i = 0; i < n; i++) n_img += tok[i] == image_token;
    if (n_img != n_embd_rows)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "the prompt has %d image tokens, the picture %d rows", (int)n_img,
                       (int)n_embd_rows);
    fwd_row rows[512];
    const float *in[512];
    int32_t chunk = r->batch < 512 ? r->batch : 512, next = 0, d = r->m->n_embd;
    for (int32_t i = 0; i < n; i += chunk) {
        int32_t c = n - i < chunk ? n - i : chunk;
        for (int32_t j = 0; j < c; j++) {
            rows[j] = (fwd_row){s, tok[i + j], s->n_pos + j, logits && i + j == n - 1};
            in[j] = tok[i + j] == image_token ? embd + (size_t)next++ * (size_t)d : NULL;
        }
        const float *lg;
        cellm_status st = backend_run_embd(&r->fwd, rows, in, c, &lg, err);
        if (st) return st;
        if (logits && i + c == n) memcpy(logits, lg, sizeof(float) * (size_t)r->m->n_vocab);
    }
    return CELLM_OK;
}

cellm_status rt_feed_all(rt *r, kv_seq *s, const int32_t *tok, int32_t n, const float **logits,
                         cellm_error *err) {
    fwd_row rows[RT_SPEC_MAX + 1];
    if (n < 1 || n > RT_SPEC_MAX + 1 || n > r->batch)
        return err_set(err, CELLM_ERR_INVALID_ARG, "rt_feed_all: %d rows (1..%d)", (int)n,
                       RT_SPEC_MAX + 1);
    for (int32_t j = 0; j < n; j++) rows[j] = (fwd_row){s, tok[j], s->n_pos + j, true};
    return backend_run(&r->fwd, rows, n, logits, err);
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

/* The sampling flags: the numeric ones in the order of the RT_S_* fields,
 * then the two that take text. */
static const struct sampling_flag {
    const char *name, *alt;
    double lo, hi;
    bool whole;
} sampling_flags[] = {
    [RT_S_TEMP] = {"--temp", NULL, 0, 100, false},
    [RT_S_TOP_K] = {"--top-k", NULL, 0, 1 << 24, true},
    [RT_S_TOP_P] = {"--top-p", NULL, 0, 1, false},
    [RT_S_MIN_P] = {"--min-p", NULL, 0, 1, false},
    [RT_S_TYPICAL] = {"--typical", NULL, 0, 1, false},
    [RT_S_REPEAT_PENALTY] = {"--repeat-penalty", NULL, 0, 100, false}, /* 0 itself is refused */
    [RT_S_REPEAT_LAST_N] = {"--repeat-last-n", NULL, -1, 1 << 24, true},
    [RT_S_PRESENCE_PENALTY] = {"--presence-penalty", NULL, -100, 100, false},
    [RT_S_FREQUENCY_PENALTY] = {"--frequency-penalty", NULL, -100, 100, false},
    [RT_S_NGRAM_GUARD] = {"--ngram-guard", NULL, 0, 64, true},
    [RT_S_NGRAM_GUARD_REPEATS] = {"--ngram-guard-repeats", NULL, 1, 1 << 20, true},
    [RT_S_SEED] = {"--seed", "-s", -1, 18446744073709551615.0, true},
    [RT_S_COUNT] = {"--logit-bias", NULL, 0, 0, false},
    [RT_S_COUNT + 1] = {"--reverse-prompt", "-r", 0, 0, false},
};

/* True when d is a value flag k takes. */
static bool flag_value_ok(int k, double d) {
    const struct sampling_flag *f = &sampling_flags[k];
    return d >= f->lo && d <= f->hi && (!f->whole || d == floor(d)) &&
           !(k == RT_S_REPEAT_PENALTY && d == 0);
}

/* Sets numeric field k (not the seed) of `s` to d, a value it takes. */
static void set_field(cellm_sampling *s, int k, double d) {
    switch (k) {
    case RT_S_TEMP: s->temperature = (float)d; break;
    case RT_S_TOP_K: s->top_k = (int32_t)d; break;
    case RT_S_TOP_P: s->top_p = (float)d; break;
    case RT_S_MIN_P: s->min_p = (float)d; break;
    case RT_S_TYPICAL: s->typical_p = (float)d; break;
    case RT_S_REPEAT_PENALTY: s->repeat_penalty = (float)d; break;
    case RT_S_REPEAT_LAST_N: s->repeat_last_n = (int32_t)d; break;
    case RT_S_PRESENCE_PENALTY: s->presence_penalty = (float)d; break;
    case RT_S_FREQUENCY_PENALTY: s->frequency_penalty = (float)d; break;
    case RT_S_NGRAM_GUARD: s->ngram_guard = (int32_t)d; break;
    case RT_S_NGRAM_GUARD_REPEATS: s->ngram_guard_repeats = (int32_t)d; break;
    }
}

int rt_sampling_flag(rt_sampling *rs, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    int k = 0, n = (int)(sizeof sampling_flags / sizeof *sampling_flags);
    while (k < n && strcmp(a, sampling_flags[k].name) &&
           !(sampling_flags[k].alt && !strcmp(a, sampling_flags[k].alt)))
        k++;
    if (k == n) return 0;
    if (*i + 1 >= argc) {
        cli_error("%s: %s needs a value", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    cellm_sampling *s = &rs->s;
    if (k == RT_S_COUNT) { /* --logit-bias */
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
    if (k == RT_S_COUNT + 1) { /* --reverse-prompt */
        size_t len = strlen(v);
        if (rs->n_stop >= CELLM_MAX_STOP_STRINGS || len < 1 || len > CELLM_MAX_STOP_LEN) {
            cli_error("%s: %s takes 1..%d bytes, at most %d times", cmd, a, CELLM_MAX_STOP_LEN,
                      CELLM_MAX_STOP_STRINGS);
            return -1;
        }
        rs->stop[rs->n_stop++] = v;
        return 1;
    }
    if (k == RT_S_SEED && !strcmp(v, "-1")) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->seed =
            (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
        rs->given |= 1u << k;
        return 1;
    }
    if (k == RT_S_SEED) {
        unsigned long long u;
        if (!cli_parse_uint(v, ~0ull, &u)) {
            cli_error("%s: %s needs a whole number, or -1 for a random seed (got '%s')", cmd, a, v);
            return -1;
        }
        s->seed = u;
        rs->given |= 1u << k;
        return 1;
    }
    double d;
    if (!parse_num(v, sampling_flags[k].lo, sampling_flags[k].hi, &d) || !flag_value_ok(k, d)) {
        bool excl = k == RT_S_REPEAT_PENALTY;
        cli_error("%s: %s needs a %s from %.10g%s to %.10g (got '%s')", cmd, a,
                  sampling_flags[k].whole ? "whole number" : "number", sampling_flags[k].lo,
                  excl ? " (exclusive)" : "", sampling_flags[k].hi, v);
        return -1;
    }
    set_field(s, k, d);
    rs->given |= 1u << k;
    return 1;
}

/* llama.cpp's keys for a model's recommended sampling (gguf-py's
 * Keys.General.SAMPLING_*) that cellm's sampler has a field for; the
 * others (sequence, xtc_*, mirostat*) are not read. */
static const struct {
    const char *key;
    int field;
} model_keys[] = {
    {"general.sampling.temp", RT_S_TEMP},
    {"general.sampling.top_k", RT_S_TOP_K},
    {"general.sampling.top_p", RT_S_TOP_P},
    {"general.sampling.min_p", RT_S_MIN_P},
    {"general.sampling.penalty_last_n", RT_S_REPEAT_LAST_N},
    {"general.sampling.penalty_repeat", RT_S_REPEAT_PENALTY},
};

/* The number under a model key: an integer or a float of any width. */
static bool value_number(const gguf_value *v, double *out) {
    int64_t i;
    if (gguf_value_as_float(v, out)) return true;
    if (v->type == GGUF_TYPE_UINT64) {
        uint64_t u;
        if (!gguf_value_as_uint(v, &u)) return false;
        *out = (double)u;
        return true;
    }
    if (!gguf_value_as_int(v, &i)) return false;
    *out = (double)i;
    return true;
}

void rt_sampling_chat_defaults(rt_sampling *rs, const gguf_file *f, FILE *log) {
    cellm_sampling *s = &rs->s;
    const struct {
        int field;
        double value;
    } builtin[] = {
        {RT_S_TEMP, RT_CHAT_TEMP},
        {RT_S_TOP_K, RT_CHAT_TOP_K},
        {RT_S_TOP_P, RT_CHAT_TOP_P},
        {RT_S_MIN_P, RT_CHAT_MIN_P},
    };
    for (size_t i = 0; i < sizeof builtin / sizeof *builtin; i++)
        if (!(rs->given & 1u << builtin[i].field)) set_field(s, builtin[i].field, builtin[i].value);
    for (size_t i = 0; f && i < sizeof model_keys / sizeof *model_keys; i++) {
        int k = model_keys[i].field;
        const gguf_kv *kv = gguf_find_key(f, model_keys[i].key);
        if (!kv || rs->given & 1u << k) continue;
        double d = 0;
        bool number = value_number(&kv->value, &d);
        if (!number || !flag_value_ok(k, d)) {
            const struct sampling_flag *fl = &sampling_flags[k];
            if (log && number)
                fprintf(log,
                        "cellm: ignoring the model file's %s = %.10g: %s takes a %s from %.10g%s "
                        "to %.10g\n",
                        model_keys[i].key, d, fl->name, fl->whole ? "whole number" : "number",
                        fl->lo, k == RT_S_REPEAT_PENALTY ? " (exclusive)" : "", fl->hi);
            else if (log)
                fprintf(log, "cellm: ignoring the model file's %s: a %s, not a number\n",
                        model_keys[i].key, gguf_type_name(kv->value.type));
            continue;
        }
        set_field(s, k, d);
        rs->from_model |= 1u << k;
    }
}

void rt_sampling_print(const rt_sampling *rs, FILE *out) {
    const cellm_sampling *s = &rs->s;
    if (s->temperature <= 0 || s->top_k == 1)
        fprintf(out, "sampling: greedy");
    else
        fprintf(out, "sampling: temp %g, top-k %d, top-p %g, min-p %g", (double)s->temperature,
                (int)s->top_k, (double)s->top_p, (double)s->min_p);
    if (s->typical_p < 1) fprintf(out, ", typical %g", (double)s->typical_p);
    if (s->repeat_penalty != 1 || s->presence_penalty != 0 || s->frequency_penalty != 0)
        fprintf(out, ", repeat-penalty %g, presence-penalty %g, frequency-penalty %g",
                (double)s->repeat_penalty, (double)s->presence_penalty,
                (double)s->frequency_penalty);
    if (s->ngram_guard > 0)
        fprintf(out, ", ngram-guard %d (repeats %d)", (int)s->ngram_guard,
                (int)s->ngram_guard_repeats);
    if (s->ngram_guard > 0 || s->repeat_penalty != 1 || s->presence_penalty != 0 ||
        s->frequency_penalty != 0)
        fprintf(out, ", repeat-last-n %d", (int)s->repeat_last_n);
    fprintf(out, ", seed %llu", (unsigned long long)s->seed);
    const uint32_t sets[2] = {rs->from_model, rs->given};
    const char *const what[2] = {"from the model file", "from flags"};
    for (int j = 0; j < 2; j++) {
        if (!sets[j]) continue;
        fprintf(out, "; %s:", what[j]);
        for (int k = 0; k < RT_S_COUNT; k++)
            if (sets[j] & 1u << k) fprintf(out, " %s", sampling_flags[k].name + 2);
    }
    fputc('\n', out);
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

/* ---- speculative decoding for one sequence ---- */

void rt_spec_opts_init(rt_spec_opts *o) {
    cellm_engine_params p = cellm_engine_default_params();
    *o = (rt_spec_opts){NULL, 0, p.draft_max, p.draft_min, p.draft_p_min, p.spec_accept, false};
}

int rt_spec_flag(rt_spec_opts *o, int argc, char **argv, int *i, const char *cmd) {
    static const char *const names[] = {"--draft",     "--lookup",      "--draft-max",
                                        "--draft-min", "--draft-p-min", "--spec-accept"};
    const int n_names = (int)(sizeof names / sizeof *names);
    const char *a = argv[*i];
    if (!strcmp(a, "--draft-always")) {
        o->draft_always = true;
        return 1;
    }
    int k = 0;
    while (k < n_names && strcmp(a, names[k])) k++;
    if (k == n_names) return 0;
    if (*i + 1 >= argc) {
        cli_error("%s: %s needs a value", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    unsigned long long u;
    double d;
    switch (k) {
    case 0: o->draft = v; return 1;
    case 5:
        if (cli_parse_spec_accept(v, &o->accept)) return 1;
        cli_error("%s: %s takes exact or resample (not '%s')", cmd, a, v);
        return -1;
    case 4:
        if (!parse_num(v, 0, 1, &d)) {
            cli_error("%s: %s needs a number from 0 to 1 (got '%s')", cmd, a, v);
            return -1;
        }
        o->draft_p_min = (float)d;
        return 1;
    default: {
        const unsigned long long lo = k == 2 ? 1 : 0;
        if (!cli_parse_uint(v, RT_SPEC_MAX, &u) || u < lo) {
            cli_error("%s: %s needs a whole number from %llu to %d (got '%s')", cmd, a, lo,
                      RT_SPEC_MAX, v);
            return -1;
        }
        if (k == 1) o->lookup = (int32_t)u;
        if (k == 2) o->draft_max = (int32_t)u;
        if (k == 3) o->draft_min = (int32_t)u;
        return 1;
    }
    }
}

void rt_spec_target_opts(const rt_spec_opts *o, rt_opts *target) {
    if (!o->draft && o->lookup <= 0) return;
    /* A pass feeds the pending token and up to draft_max guesses, and
     * takes back those it rejects. */
    target->slack = o->draft_max + 1;
    target->logit_rows = o->draft_max + 1;
}

cellm_status rt_spec_open(rt_spec *s, const rt_spec_opts *o, rt *target, const rt_opts *to,
                          cellm_error *err) {
    memset(s, 0, sizeof *s);
    s->o = *o;
    s->on = o->draft || o->lookup > 0;
    if (!o->draft) return CELLM_OK;
    /* The draft holds the whole sequence too, in passes as long as the
     * target's, and takes back its guesses past what was kept. */
    rt_opts d = *to;
    d.ctx = target->ctx;
    d.batch = target->batch;
    d.logit_rows = 1;
    d.slack = o->draft_max + 1;
    d.tp = target->tp;
    cellm_status st = rt_open(o->draft, &d, &s->d, err);
    if (st) {
        char msg[CELLM_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return err_set(err, st, "--draft %s: %s", o->draft, msg);
    }
    cellm_engine_params p = cellm_engine_default_params();
    p.draft_model = s->d.cm;
    p.lookup_ngram = o->lookup;
    p.draft_max = o->draft_max;
    p.draft_min = o->draft_min;
    p.draft_p_min = o->draft_p_min;
    char msg[CELLM_ERR_MSG_MAX];
    const char *bad = spec_check(target->cm, &p, msg, sizeof msg);
    if (bad) {
        st = err_set(err, CELLM_ERR_INVALID_ARG, "--draft %s: %s", o->draft, bad);
        rt_close(&s->d);
        return st;
    }
    if ((st = kv_seq_init(s->d.kv, &s->dseq, err))) {
        rt_close(&s->d);
        return st;
    }
    s->has_draft = true;
    return CELLM_OK;
}

void rt_spec_close(rt_spec *s) {
    if (s->has_draft) kv_seq_free(s->d.kv, &s->dseq);
    rt_close(&s->d);
    s->has_draft = false;
}

/* The draft's greedy guesses: it first catches up with the tokens it has
 * not seen, then runs one pass per further guess. */
static int32_t draft_guess(rt_spec *s, const int32_t *tok, int32_t n_tok, int32_t k, int32_t *out) {
    cellm_error err;
    err_clear(&err);
    if (s->dseq.n_pos >= n_tok) rt_spec_rewind(s, n_tok - 1); /* a token to give logits */
    const float *lg;
    int32_t from = s->dseq.n_pos, n = 0;
    if (rt_feed_last(&s->d, &s->dseq, tok + from, n_tok - from, &lg, &err) != CELLM_OK) goto fail;
    s->n_draft_pass++;
    for (;;) {
        float p;
        int32_t g = s->sp ? spec_draft_guess(lg, s->d.m->n_vocab, s->sp, n_tok + n, &s->q[n], &p)
                          : spec_draft_pick(lg, s->d.m->n_vocab, s->o.draft_p_min, &p);
        if (p < s->o.draft_p_min) break;
        out[n++] = g;
        if (n == k) break; /* the last guess needs no pass of the draft */
        if (rt_feed_last(&s->d, &s->dseq, &g, 1, &lg, &err) != CELLM_OK) goto fail;
        s->n_draft_pass++;
    }
    return n;
fail:
    /* Its KV was sized for this, so this is a bug; guesses only save
     * time: go on without the draft, the text unchanged. */
    fprintf(stderr, "cellm: the draft model failed (%s); going on without it\n", err.msg);
    kv_seq_free(s->d.kv, &s->dseq);
    s->has_draft = false;
    return n;
}

/* The gate's account of the pass since the last rt_spec_propose: the
 * time to now (the draft's passes, the model's, the sampling of what it
 * gave) and the tokens it added. */
static void gate_account(rt_spec *s, int32_t n_tok) {
    double now = engine_now_s() * 1e3;
    if (s->t_last > 0 && s->asked) {
        double ms = now - s->t_last;
        spec_gate_note(&s->gate, s->drafted, ms, s->drafted && !s->guessed ? ms - s->draft_ms : -1,
                       n_tok - s->n_last);
    }
    s->t_last = now;
    s->n_last = n_tok;
    s->asked = s->drafted = s->guessed = false;
}

int32_t rt_spec_propose(rt_spec *s, const int32_t *tok, int32_t n_tok, int32_t room, int32_t *out) {
    if (s->has_draft) gate_account(s, n_tok);
    int32_t k = s->k > 0 ? s->k : s->o.draft_max;
    if (room < k) k = room;
    if (!s->on || k < 1 || k < s->o.draft_min) return 0;
    if (s->o.lookup > 0) {
        /* The engine's rule (spec.c): lookup fills its tile of rows. */
        int32_t cap = room < s->o.draft_max ? room : s->o.draft_max;
        int32_t n = spec_lookup(tok, n_tok, s->o.lookup, s->sp ? k : spec_fill_k(1, k, cap), out);
        /* Under the resample rule a guess from earlier text is drawn from
         * a distribution all on it. */
        for (int32_t j = 0; s->sp && j < n; j++) s->q[j] = (sampler_dist){1, {out[j]}, {1.0f}};
        if (n > 0 && n >= s->o.draft_min) return n;
    }
    if (!s->has_draft) return 0;
    /* Under the resample rule the guesses decide the text: the draft runs
     * whatever the gate, which goes by the clock, says. */
    if (!s->sp) {
        s->asked = true;
        if (!s->o.draft_always && !spec_gate_want(&s->gate)) return 0;
    }
    double t0 = engine_now_s();
    int32_t n = draft_guess(s, tok, n_tok, k, out);
    s->draft_ms = (engine_now_s() - t0) * 1e3;
    s->drafted = true;
    if (n < s->o.draft_min) n = 0;
    s->guessed = n > 0;
    return n;
}

void rt_spec_done(rt_spec *s, int32_t n_guess, int32_t kept, int32_t n_valid) {
    s->n_guess += (uint64_t)n_guess;
    s->n_kept += (uint64_t)kept;
    s->n_pass++;
    /* The engine's rule (engine.c, verify): grow while every guess is
     * kept, else try one more than were kept. */
    int32_t k = s->k > 0 ? s->k : s->o.draft_max;
    s->k = spec_next_k(k, n_guess, kept, s->o.draft_max);
    rt_spec_rewind(s, n_valid);
}

void rt_spec_pause(rt_spec *s) {
    s->t_last = 0;
}

void rt_spec_rewind(rt_spec *s, int32_t n) {
    if (!s->has_draft || s->dseq.n_pos <= n) return;
    if (!kv_seq_truncate(s->d.kv, &s->dseq, n)) kv_seq_reset(s->d.kv, &s->dseq);
}

void rt_spec_print(const rt_spec *s, FILE *out) {
    fprintf(out,
            "speculation: %llu guesses, %llu kept (%.1f%%); %.2f tokens per pass of the model "
            "over %llu passes with guesses; %llu draft passes\n",
            (unsigned long long)s->n_guess, (unsigned long long)s->n_kept,
            s->n_guess ? 100.0 * (double)s->n_kept / (double)s->n_guess : 0.0,
            s->n_pass ? (double)(s->n_kept + s->n_pass) / (double)s->n_pass : 0.0,
            (unsigned long long)s->n_pass, (unsigned long long)s->n_draft_pass);
}
