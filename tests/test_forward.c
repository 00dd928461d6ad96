/*
 * test_forward.c — the forward pass on both real models against llama.cpp
 * (fixtures from scripts/gen_forward_fixtures.py; token ids come from
 * llama.cpp's tokenizer, so this tests the forward pass alone), and batch
 * invariance.
 *
 * Tolerances. On these small quantized models llama.cpp does not agree
 * with itself closely. The fixture prompts run through llama.cpp with its
 * default batch of 512 (how the fixtures were made) and one token at a
 * time, which differ only in float summation order and kernel choice, give
 * (scripts/llama_self_consistency.py, docs/forward.md):
 *
 *                      top-1 agree  top-20 max / mean  greedy same  perplexity
 *   SmolLM2 135M Q4_1     97.3%       1.28 / 0.119        5 of 10     -0.17%
 *   Gemma 3 270M Q4_K_M   97.0%       3.42 / 0.253        7 of 10     +1.58%
 *
 * Rounding of 8-bit activations around outlier features amplifies any
 * ulp-level difference. So the bounds below are llama.cpp's own spread with
 * some room, and the greedy check asks what can be asked of two engines
 * that differ at that level: every divergence from llama.cpp's greedy text
 * happens where llama.cpp's own two best logits are within NEAR_TIE (the
 * logit noise above); a divergence at a clear choice fails. A real bug (a
 * wrong RoPE pairing, a missing norm, an off-by-one window) drops top-1
 * agreement far below 90%, diverges at clear choices and moves perplexity by
 * far more than 2%.
 *
 * Under ThreadSanitizer, where the models run 10-20x slower, test.sh runs
 * only test_tsan_* (CELLM_TEST_FILTER): the SmolLM2 invariance test, which
 * drives the thread pool with 1 and 2 threads; release and ASan run all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "forward.h"
#include "sampler.h"
#include "test_common.h"

#define TOP1_MIN 0.94       /* llama.cpp vs itself: 0.973 / 0.970 */
#define TOP20_MAX_TOL 5.0   /* llama.cpp vs itself: 1.28 / 3.42 */
#define TOP20_MEAN_TOL 0.35 /* llama.cpp vs itself: 0.119 / 0.253 */
#define NEAR_TIE 0.5        /* logits: the noise level above */
#define PPL_TOL 0.02        /* llama.cpp vs itself: 0.2% / 1.6% */
#define MAX_TOK 2048

typedef struct fx_case {
    char kind[16]; /* logits, long, greedy, ppl */
    int n_tok;
    int32_t tok[MAX_TOK];
    int first_pos; /* logits/long: first position with a top-20 line */
    int n_pos;
    int32_t top_id[128][20];
    float top_lsm[128][20];
    int n_gen; /* greedy */
    int32_t gen[64];
    float gap[64];
    int ppl_ctx, ppl_chunks, ppl_bos;
    double ppl;
} fx_case;

typedef struct fixture {
    int n;
    fx_case *c;
} fixture;

static int32_t *read_ints(char *line, const char *tag, int32_t *out, int max) {
    assert_true(!strncmp(line, tag, strlen(tag)));
    int n = 0;
    for (char *p = strtok(line + strlen(tag), " \n"); p; p = strtok(NULL, " \n")) {
        assert_true(n < max);
        out[n++] = (int32_t)strtol(p, NULL, 10);
    }
    out[max - 1] = n; /* caller reads the count from its own header */
    return out;
}

static void load_fixture(const char *name, fixture *fx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/forward/%s.txt", CELLM_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    if (!f) {
        print_error("cannot open %s\n", path);
        fail();
    }
    fx->n = 0;
    fx->c = calloc(32, sizeof(fx_case));
    static char line[1 << 16];
    fx_case *c = NULL;
    int posi = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "logits ", 7) || !strncmp(line, "long ", 5)) {
            c = &fx->c[fx->n++];
            int a, b;
            if (line[1] == 'o' && line[2] == 'g') {
                sscanf(line, "logits %d %d", &a, &b);
                c->n_tok = b;
                c->first_pos = 0;
                c->n_pos = b;
                strcpy(c->kind, "logits");
            } else {
                sscanf(line, "long %d %d", &a, &b);
                c->n_tok = a;
                c->first_pos = b;
                c->n_pos = a - b;
                strcpy(c->kind, "long");
            }
            posi = 0;
        } else if (!strncmp(line, "greedy ", 7)) {
            c = &fx->c[fx->n++];
            int i, np, ng;
            sscanf(line, "greedy %d %d %d", &i, &np, &ng);
            c->n_tok = np;
            c->n_gen = ng;
            strcpy(c->kind, "greedy");
        } else if (!strncmp(line, "ppl ", 4)) {
            c = &fx->c[fx->n++];
            sscanf(line, "ppl %d %d %d %lf", &c->ppl_ctx, &c->ppl_chunks, &c->ppl_bos, &c->ppl);
            c->n_tok = c->ppl_ctx * c->ppl_chunks;
            strcpy(c->kind, "ppl");
        } else if (!strncmp(line, "tokens ", 7) || !strncmp(line, "prompt ", 7)) {
            static int32_t tmp[MAX_TOK + 1];
            read_ints(line, line[0] == 't' ? "tokens " : "prompt ", tmp, MAX_TOK + 1);
            assert_int_equal(tmp[MAX_TOK], c->n_tok);
            memcpy(c->tok, tmp, sizeof(int32_t) * (size_t)c->n_tok);
        } else if (!strncmp(line, "gen ", 4)) {
            static int32_t tmp[65];
            read_ints(line, "gen ", tmp, 65);
            assert_int_equal(tmp[64], c->n_gen);
            memcpy(c->gen, tmp, sizeof(int32_t) * (size_t)c->n_gen);
        } else if (!strncmp(line, "gap ", 4)) {
            int k = 0;
            for (char *p = strtok(line + 4, " \n"); p && k < 64; p = strtok(NULL, " \n"))
                c->gap[k++] = strtof(p, NULL);
            assert_int_equal(k, c->n_gen);
        } else if (!strncmp(line, "pos ", 4)) {
            int k = 0;
            char *save;
            strtok_r(line + 4, " \n", &save); /* the position */
            for (char *p = strtok_r(NULL, " \n", &save); p && k < 20;
                 p = strtok_r(NULL, " \n", &save)) {
                c->top_id[posi][k] = (int32_t)strtol(p, &p, 10);
                c->top_lsm[posi][k] = strtof(p + 1, NULL);
                k++;
            }
            assert_int_equal(k, 20);
            posi++;
        }
    }
    fclose(f);
    assert_true(fx->n >= 17);
}

/* An engine in miniature: model, KV cache, thread pool, forward context. */
typedef struct rig {
    model *m;
    kv_cache *kv;
    threadpool *tp;
    forward_ctx *f;
} rig;

/* With the KV cache in type `kv_type`. */
static void rig_open_kv(rig *r, const char *name, int threads, int32_t max_rows, int32_t max_logits,
                        cellm_kv_type kv_type) {
    char path[1024];
    test_model_path(name, path, sizeof path);
    cellm_error e;
    if (model_load(path, &r->m, &e) ||
        kv_cache_create(r->m, 256u << 20, 4096, kv_type, &r->kv, &e) ||
        tp_create(threads, &r->tp, &e) ||
        forward_create(r->m, r->kv, r->tp, max_rows, max_logits, &r->f, &e)) {
        print_error("%s\n", e.msg);
        fail();
    }
}

static void rig_open(rig *r, const char *name, int threads, int32_t max_rows, int32_t max_logits) {
    rig_open_kv(r, name, threads, max_rows, max_logits, CELLM_KV_F16);
}

static void rig_close(rig *r) {
    forward_free(r->f);
    tp_destroy(r->tp);
    kv_cache_free(r->kv);
    model_free(r->m);
}

/* Feeds tokens [0, n) of `tok` to `s` in chunks of `chunk`, copying the
 * logits of positions >= first_logit into out[(pos - first_logit)][vocab]. */
static void feed(rig *r, kv_seq *s, const int32_t *tok, int n, int chunk, int first_logit,
                 float *out) {
    static fwd_row rows[512];
    cellm_error e;
    for (int i = 0; i < n; i += chunk) {
        int c = n - i < chunk ? n - i : chunk;
        for (int j = 0; j < c; j++)
            rows[j] = (fwd_row){s, tok[i + j], s->n_pos + j, out && i + j >= first_logit};
        const float *lg;
        if (forward_run(r->f, rows, c, &lg, &e)) {
            print_error("%s\n", e.msg);
            fail();
        }
        int k = 0;
        for (int j = 0; j < c; j++)
            if (rows[j].logits)
                memcpy(out + (size_t)(i + j - first_logit) * r->m->n_vocab,
                       lg + (size_t)(k++) * r->m->n_vocab, sizeof(float) * (size_t)r->m->n_vocab);
    }
}

static void log_softmax(const float *x, int n, double *out) {
    double mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp(x[i] - mx);
    double l = log(sum);
    for (int i = 0; i < n; i++) out[i] = x[i] - mx - l;
}

static void check_logits(const char *name) {
    fixture fx;
    load_fixture(name, &fx);
    rig r;
    rig_open(&r, name, 2, 128, 64);
    int V = r.m->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V * 128);
    double *lsm = malloc(sizeof(double) * (size_t)V);
    int positions = 0, agree = 0, cases = 0;
    double worst = 0, sum = 0;
    long n_diff = 0;
    for (int ci = 0; ci < fx.n; ci++) {
        fx_case *c = &fx.c[ci];
        if (strcmp(c->kind, "logits") && strcmp(c->kind, "long")) continue;
        cases++;
        kv_seq s;
        cellm_error e;
        assert_int_equal(kv_seq_init(r.kv, &s, &e), CELLM_OK);
        feed(&r, &s, c->tok, c->n_tok, 64, c->first_pos, lg);
        for (int p = 0; p < c->n_pos; p++) {
            const float *row = lg + (size_t)p * V;
            log_softmax(row, V, lsm);
            positions++;
            agree += sampler_argmax(row, V) == c->top_id[p][0];
            for (int k = 0; k < 20; k++) {
                double d = fabs(lsm[c->top_id[p][k]] - c->top_lsm[p][k]);
                if (d > worst) worst = d;
                sum += d;
                n_diff++;
            }
        }
        kv_seq_free(r.kv, &s);
    }
    print_message("%s: top-1 agrees at %d of %d positions (%.2f%%); top-20 log-softmax "
                  "difference max %.3f, mean %.4f\n",
                  name, agree, positions, 100.0 * agree / positions, worst, sum / n_diff);
    assert_true(agree >= TOP1_MIN * positions);
    assert_true(worst <= TOP20_MAX_TOL);
    assert_true(sum / n_diff <= TOP20_MEAN_TOL);
    free(lsm);
    free(lg);
    rig_close(&r);
    free(fx.c);
}

static void check_greedy(const char *name) {
    fixture fx;
    load_fixture(name, &fx);
    rig r;
    rig_open(&r, name, 2, 128, 1);
    int V = r.m->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int n = 0, same = 0;
    float worst_gap = 0;
    for (int ci = 0; ci < fx.n; ci++) {
        fx_case *c = &fx.c[ci];
        if (strcmp(c->kind, "greedy")) continue;
        n++;
        kv_seq s;
        cellm_error e;
        assert_int_equal(kv_seq_init(r.kv, &s, &e), CELLM_OK);
        feed(&r, &s, c->tok, c->n_tok, 128, c->n_tok - 1, lg);
        int diverged = -1;
        for (int g = 0; g < c->n_gen; g++) {
            int32_t t = sampler_argmax(lg, V);
            if (t != c->gen[g]) {
                diverged = g;
                break;
            }
            feed(&r, &s, &t, 1, 1, 0, lg);
        }
        if (diverged < 0) {
            same++;
        } else {
            /* A divergence must be at a near-tie in llama.cpp's own logits:
             * closer than the logit noise between the two engines (and
             * between llama.cpp's own batch modes), NEAR_TIE. */
            print_message("%s: greedy prompt %d diverges at token %d, where llama.cpp's two best "
                          "logits are %.4f apart\n",
                          name, n - 1, diverged, c->gap[diverged]);
            if (c->gap[diverged] > worst_gap) worst_gap = c->gap[diverged];
        }
        kv_seq_free(r.kv, &s);
    }
    print_message("%s: %d of %d greedy generations match llama.cpp token for token\n", name, same,
                  n);
    assert_true(worst_gap <= NEAR_TIE);
    free(lg);
    rig_close(&r);
    free(fx.c);
}

/* Perplexity over the fixture's text as llama.cpp's tool computes it,
 * with the KV cache in type `kv_type`; *ref: llama.cpp's value (f16 KV). */
static double perplexity_of(const char *name, cellm_kv_type kv_type, double *ref) {
    fixture fx;
    load_fixture(name, &fx);
    fx_case *c = NULL;
    for (int ci = 0; ci < fx.n; ci++)
        if (!strcmp(fx.c[ci].kind, "ppl")) c = &fx.c[ci];
    assert_non_null(c);
    rig r;
    rig_open_kv(&r, name, 2, 256, 64, kv_type);
    int V = r.m->n_vocab, ctx = c->ppl_ctx, chunks = c->ppl_chunks;
    float *lg = malloc(sizeof(float) * (size_t)V * 64);
    double *lsm = malloc(sizeof(double) * (size_t)V);
    int32_t bos = 0;
    uint64_t b = 0;
    if (c->ppl_bos) assert_true(gguf_get_uint(r.m->file, "tokenizer.ggml.bos_token_id", &b));
    bos = (int32_t)b;
    double nll = 0;
    int count = 0;
    for (int k = 0; k < chunks; k++) {
        int32_t chunk[2048];
        memcpy(chunk, c->tok + k * ctx, sizeof(int32_t) * (size_t)ctx);
        if (c->ppl_bos) chunk[0] = bos;
        kv_seq s;
        cellm_error e;
        assert_int_equal(kv_seq_init(r.kv, &s, &e), CELLM_OK);
        feed(&r, &s, chunk, ctx / 2, 256, ctx, NULL);
        for (int j = ctx / 2; j < ctx - 1; j += 64) {
            int n = ctx - 1 - j < 64 ? ctx - 1 - j : 64;
            feed(&r, &s, chunk + j, n, 64, 0, lg);
            for (int i = 0; i < n; i++) {
                log_softmax(lg + (size_t)i * V, V, lsm);
                nll -= lsm[c->tok[k * ctx + j + i + 1]];
                count++;
            }
        }
        /* Position ctx - 1 is fed but not scored, as llama.cpp does. */
        kv_seq_free(r.kv, &s);
    }
    double ppl = exp(nll / count);
    print_message("%s: perplexity %.4f over %d chunks of %d (KV type %d), llama.cpp %.4f "
                  "(%.2f%%)\n",
                  name, ppl, chunks, ctx, (int)kv_type, c->ppl, 100.0 * (ppl / c->ppl - 1));
    *ref = c->ppl;
    free(lsm);
    free(lg);
    rig_close(&r);
    free(fx.c);
    return ppl;
}

/* f16-KV perplexity per model, kept from test_ppl_* for test_kv_ppl_*. */
static double f16_ppl[2];
static double *f16_ppl_of(const char *name) {
    return &f16_ppl[strcmp(name, "smollm2-135m") != 0];
}

static void check_perplexity(const char *name) {
    double ref, ppl = perplexity_of(name, CELLM_KV_F16, &ref);
    *f16_ppl_of(name) = ppl;
    assert_true(fabs(ppl / ref - 1) <= PPL_TOL);
}

/* The compressed KV types against f16 KV on the same text and context:
 * q8_0 within 1%; the rotated 4-bit type better than plain q4_0, and
 * neither 4-bit type broken (under twice f16's). The bound for
 * q8_0 is 0.5%, met on 8,192 scored tokens of Genesis (docs/benchmarks.md:
 * -0.15% and +0.06%); the fixture scores only 1,024, where Gemma 3 gives
 * +0.50%, and merely rounding the codes against the f16 scale instead of
 * the f32 one gave +0.65%: on so few tokens a few tenths are sampling
 * noise, so the test leaves that room. A real fault (a wrong scale or
 * block offset) moves it by far more. */
static void check_kv_perplexity(const char *name) {
    double ref, f16 = *f16_ppl_of(name);
    if (f16 == 0) f16 = perplexity_of(name, CELLM_KV_F16, &ref);
    double q8 = perplexity_of(name, CELLM_KV_Q8_0, &ref);
    double q4 = perplexity_of(name, CELLM_KV_Q4_0, &ref);
    double q4h = perplexity_of(name, CELLM_KV_Q4_0H, &ref);
    print_message("%s: KV f16 %.4f, q8_0 %.4f (%+.3f%%), q4_0 %.4f (%+.2f%%), q4_0h %.4f "
                  "(%+.2f%%)\n",
                  name, f16, q8, 100 * (q8 / f16 - 1), q4, 100 * (q4 / f16 - 1), q4h,
                  100 * (q4h / f16 - 1));
    assert_true(fabs(q8 / f16 - 1) <= 0.01);
    assert_true(q4h < q4);
    assert_true(q4 < 2 * f16 && q4h < 2 * f16);
}

/* One prompt as one chunk, as uneven chunks and token by token, with 1 and
 * 2 threads, and beside another sequence: bit-identical logits. */
static void check_invariance(const char *name, cellm_kv_type kv_type) {
    fixture fx;
    load_fixture(name, &fx);
    const fx_case *c = &fx.c[0];
    int n = 48;
    rig r1, r2;
    rig_open_kv(&r1, name, 1, 128, 128, kv_type);
    rig_open_kv(&r2, name, 2, 128, 128, kv_type);
    int V = r1.m->n_vocab;
    size_t bytes = sizeof(float) * (size_t)V * (size_t)n;
    float *a = malloc(bytes), *b = malloc(bytes);
    kv_seq s;
    cellm_error e;
    assert_int_equal(kv_seq_init(r2.kv, &s, &e), CELLM_OK);
    feed(&r2, &s, c->tok, n, 128, 0, a);
    kv_seq_free(r2.kv, &s);
    static const int chunks[] = {1, 5, 17};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        rig *r = k == 1 ? &r1 : &r2;
        assert_int_equal(kv_seq_init(r->kv, &s, &e), CELLM_OK);
        feed(r, &s, c->tok, n, chunks[k], 0, b);
        assert_memory_equal(a, b, bytes);
        kv_seq_free(r->kv, &s);
    }
    /* Two sequences interleaved in one batch: row i of each prompt. */
    kv_seq s1, s2;
    assert_int_equal(kv_seq_init(r2.kv, &s1, &e), CELLM_OK);
    assert_int_equal(kv_seq_init(r2.kv, &s2, &e), CELLM_OK);
    const int32_t *t2 = fx.c[1].tok;
    float *c2 = malloc(bytes), *alone2 = malloc(bytes);
    fwd_row rows[96];
    for (int i = 0; i < n; i++) {
        rows[2 * i] = (fwd_row){&s1, c->tok[i], i, true};
        rows[2 * i + 1] = (fwd_row){&s2, t2[i], i, true};
    }
    /* Rows of one sequence must come in position order, which they do. */
    const float *lg;
    assert_int_equal(forward_run(r2.f, rows, 96, &lg, &e), CELLM_OK);
    for (int i = 0; i < n; i++) {
        memcpy(b + (size_t)i * V, lg + (size_t)(2 * i) * V, sizeof(float) * (size_t)V);
        memcpy(c2 + (size_t)i * V, lg + (size_t)(2 * i + 1) * V, sizeof(float) * (size_t)V);
    }
    assert_memory_equal(a, b, bytes);
    kv_seq_free(r2.kv, &s1);
    kv_seq_free(r2.kv, &s2);
    assert_int_equal(kv_seq_init(r2.kv, &s, &e), CELLM_OK);
    feed(&r2, &s, t2, n, 7, 0, alone2);
    assert_memory_equal(c2, alone2, bytes);
    kv_seq_free(r2.kv, &s);
    /* Every block went back to the pool. */
    for (int g = 0; g < r2.kv->n_groups; g++) assert_int_equal(kv_cache_used_blocks(r2.kv, g), 0);
    free(a);
    free(b);
    free(c2);
    free(alone2);
    rig_close(&r1);
    rig_close(&r2);
    free(fx.c);
}

static void test_logits_smollm2(void **st) {
    (void)st;
    check_logits("smollm2-135m");
}
static void test_logits_gemma3(void **st) {
    (void)st;
    check_logits("gemma3-270m");
}
static void test_greedy_smollm2(void **st) {
    (void)st;
    check_greedy("smollm2-135m");
}
static void test_greedy_gemma3(void **st) {
    (void)st;
    check_greedy("gemma3-270m");
}
static void test_ppl_smollm2(void **st) {
    (void)st;
    check_perplexity("smollm2-135m");
}
static void test_ppl_gemma3(void **st) {
    (void)st;
    check_perplexity("gemma3-270m");
}
static void test_kv_ppl_smollm2(void **st) {
    (void)st;
    check_kv_perplexity("smollm2-135m");
}
static void test_kv_ppl_gemma3(void **st) {
    (void)st;
    check_kv_perplexity("gemma3-270m");
}
static void test_tsan_invariance_smollm2(void **st) {
    (void)st;
    check_invariance("smollm2-135m", CELLM_KV_F16);
}
static void test_invariance_gemma3(void **st) {
    (void)st;
    check_invariance("gemma3-270m", CELLM_KV_F16);
}
/* Every compressed type keeps a row's result independent of the batch and
 * the threads (SmolLM2: 64-wide heads; Gemma 3: 256-wide, sliding window). */
static void test_tsan_invariance_kv_smollm2(void **st) {
    (void)st;
    check_invariance("smollm2-135m", CELLM_KV_Q8_0);
    check_invariance("smollm2-135m", CELLM_KV_Q4_0);
    check_invariance("smollm2-135m", CELLM_KV_Q4_0H);
}
static void test_invariance_kv_gemma3(void **st) {
    (void)st;
    check_invariance("gemma3-270m", CELLM_KV_Q8_0);
    check_invariance("gemma3-270m", CELLM_KV_Q4_0H);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tsan_invariance_smollm2),
        cmocka_unit_test(test_invariance_gemma3),
        cmocka_unit_test(test_tsan_invariance_kv_smollm2),
        cmocka_unit_test(test_invariance_kv_gemma3),
        cmocka_unit_test(test_logits_smollm2),
        cmocka_unit_test(test_logits_gemma3),
        cmocka_unit_test(test_greedy_smollm2),
        cmocka_unit_test(test_greedy_gemma3),
        cmocka_unit_test(test_ppl_smollm2),
        cmocka_unit_test(test_ppl_gemma3),
        cmocka_unit_test(test_kv_ppl_smollm2),
        cmocka_unit_test(test_kv_ppl_gemma3),
    };
    /* CELLM_TEST_FILTER=test_logits* runs a subset while developing. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
