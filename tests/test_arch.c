/*
 * test_arch.c — the architecture rows against Hugging Face transformers.
 * For each family (llama, llama with Llama 3.1's RoPE scaling, mistral with
 * a sliding window shorter than the prompts and with Mistral 7B's 4096,
 * qwen2, qwen3 saved in bf16, phi3 plain and with LongRoPE, granite, gemma3
 * with its 5:1 windowed/global layers, and with Gemma 3 4B's linear RoPE
 * scaling of the global layers; smollm3 with no RoPE in every 4th layer;
 * the mixtures of experts qwen3moe, olmoe and granitemoe), a tiny
 * random-weight model saved by
 * transformers (tests/data/arch/NAME/, made by scripts/gen_arch_fixtures.py)
 * is converted by `cellm convert` to F16 and run: its logits must be within
 * LOGIT_TOL of transformers' float32 logits
 * (tests/data/arch/NAME.txt) at every recorded position, and its greedy
 * tokens identical for 32 steps. No Python is needed here.
 *
 * The tolerance: F16 weights, F16-rounded activations in the F16 matmuls
 * and the F16 KV cache put cellm's logits within a few hundredths of
 * float32's on these models (logits of magnitude up to ~30); LOGIT_TOL is
 * scaled by the largest |logit| of the row so families with larger logits
 * (tied embeddings) are held to the same relative bound. A real bug (a
 * missing bias, a wrong RoPE pairing, a wrong multiplier, the window off by
 * one) moves logits by whole units. The fixtures' greedy steps all have a
 * top-1 margin of at least 0.1 (the generator picks such a seed), so F16
 * rounding cannot flip them.
 *
 * test_convert_types converts the llama fixture to each kind of type. F32
 * and BF16 are held close; the quantized types on these toy random
 * weights (Gaussian, no outliers, rows of 64 so the K quants fall back to
 * Q5_0/Q8_0) move logits by up to ~2% (Q8_0) and ~15-30% (4-bit) of the
 * largest logit, measured: the bounds there are sanity checks (a wrong
 * block layout leaves top-1 agreement near chance, 0.3%).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "convert.h"
#include "cpu/forward.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "gguf_copy.h"
#include "test_common.h"

#define LOGIT_TOL 0.004 /* times max(1, the row's largest |logit|) */
#define MAX_TOK 64
#define MAX_ROWS 64

typedef struct fx_logits {
    int n_tok, first;
    int32_t tok[MAX_TOK];
    float *rows; /* [n_tok - first][vocab] */
} fx_logits;

typedef struct fixture {
    int vocab;
    int n_logits;
    fx_logits lg[4];
    int n_prompt, n_gen;
    int32_t prompt[MAX_TOK], gen[MAX_TOK];
} fixture;

static int read_ints(char *s, int32_t *out, int max) {
    int n = 0;
    for (char *p = strtok(s, " \n"); p; p = strtok(NULL, " \n")) {
        assert_true(n < max);
        out[n++] = (int32_t)strtol(p, NULL, 10);
    }
    return n;
}

static void load_fixture(const char *name, fixture *fx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/arch/%s.txt", CELLM_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    if (!f) {
        print_error("cannot open %s\n", path);
        fail();
    }
    memset(fx, 0, sizeof *fx);
    static char line[1 << 16];
    fx_logits *c = NULL;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "vocab ", 6)) {
            fx->vocab = atoi(line + 6);
        } else if (!strncmp(line, "logits ", 7)) {
            assert_true(fx->n_logits < 4);
            c = &fx->lg[fx->n_logits++];
            int i;
            assert_int_equal(sscanf(line, "logits %d %d %d", &i, &c->n_tok, &c->first), 3);
            assert_true(c->n_tok <= MAX_TOK && c->first < c->n_tok && fx->vocab > 0);
            c->rows = calloc((size_t)(c->n_tok - c->first) * (size_t)fx->vocab, sizeof(float));
            assert_non_null(c->rows);
        } else if (!strncmp(line, "tokens ", 7)) {
            assert_int_equal(read_ints(line + 7, c->tok, MAX_TOK), c->n_tok);
        } else if (!strncmp(line, "row ", 4)) {
            char *p = line + 4;
            int pos = (int)strtol(p, &p, 10);
            assert_true(pos >= c->first && pos < c->n_tok);
            float *r = c->rows + (size_t)(pos - c->first) * (size_t)fx->vocab;
            for (int v = 0; v < fx->vocab; v++) r[v] = strtof(p, &p);
        } else if (!strncmp(line, "greedy ", 7)) {
            assert_int_equal(sscanf(line, "greedy %d %d", &fx->n_prompt, &fx->n_gen), 2);
        } else if (!strncmp(line, "prompt ", 7)) {
            assert_int_equal(read_ints(line + 7, fx->prompt, MAX_TOK), fx->n_prompt);
        } else if (!strncmp(line, "gen ", 4)) {
            assert_int_equal(read_ints(line + 4, fx->gen, MAX_TOK), fx->n_gen);
        }
    }
    fclose(f);
    assert_true(fx->n_logits > 0 && fx->n_gen == 32);
}

static void fixture_free(fixture *fx) {
    for (int i = 0; i < fx->n_logits; i++) free(fx->lg[i].rows);
}

/* Converts tests/data/arch/NAME with `cellm convert` into `out`. */
static void convert(const char *name, const char *type, char *out, size_t cap) {
    char tmpl[] = "/tmp/cellm-arch-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    snprintf(out, cap, "%s/%s.gguf", tmpl, name);
    char cmd[4096], *log;
    snprintf(cmd, sizeof cmd, "'%s' convert '%s/tests/data/arch/%s' '%s' --type %s 2>&1",
             test_cellm_bin(), CELLM_SOURCE_DIR, name, out, type);
    int rc = test_run_cmd(cmd, &log);
    if (rc != 0) print_error("%s\n", log);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(log, "convert: ")); /* the progress line */
    free(log);
}

static void remove_converted(const char *path) {
    unlink(path);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    rmdir(dir);
}

typedef struct rig {
    model *m;
    kv_cache *kv;
    threadpool *tp;
    forward_ctx *f;
} rig;

static void rig_open(rig *r, const char *path, int threads) {
    cellm_error e;
    if (model_load(path, &r->m, &e) ||
        kv_cache_create(r->m, 16u << 20, 256, 1, MAX_ROWS, CELLM_KV_F16, &r->kv, &e) ||
        tp_create(threads, &r->tp, &e) ||
        forward_create(r->m, r->kv, r->tp, MAX_ROWS, MAX_ROWS, &r->f, &e)) {
        print_error("%s\n", e.msg);
        fail();
    }
}

static void rig_close(rig *r) {
    forward_free(r->f);
    tp_destroy(r->tp);
    kv_cache_free(r->kv);
    model_free(r->m);
}

/* Runs `n` tokens through `s` in one batch; every row wants logits. */
static const float *run(rig *r, kv_seq *s, const int32_t *tok, int n) {
    fwd_row rows[MAX_ROWS];
    assert_true(n <= MAX_ROWS);
    for (int j = 0; j < n; j++) rows[j] = (fwd_row){s, tok[j], s->n_pos + j, true};
    const float *lg;
    cellm_error e;
    if (forward_run(r->f, rows, n, &lg, &e)) {
        print_error("%s\n", e.msg);
        fail();
    }
    return lg;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Logits against transformers'; returns the worst |diff| / max(1, max|ref|). */
static double check_logits(rig *r, const fixture *fx, const char *name) {
    double worst = 0;
    for (int i = 0; i < fx->n_logits; i++) {
        const fx_logits *c = &fx->lg[i];
        kv_seq s;
        cellm_error e;
        assert_int_equal(kv_seq_init(r->kv, &s, &e), CELLM_OK);
        const float *lg = run(r, &s, c->tok, c->n_tok);
        for (int pos = c->first; pos < c->n_tok; pos++) {
            const float *got = lg + (size_t)pos * (size_t)fx->vocab;
            const float *ref = c->rows + (size_t)(pos - c->first) * (size_t)fx->vocab;
            double mx = 1, d = 0;
            for (int v = 0; v < fx->vocab; v++) {
                mx = fmax(mx, fabs(ref[v]));
                d = fmax(d, fabs((double)got[v] - ref[v]));
            }
            if (d / mx > worst) worst = d / mx;
            if (d / mx > LOGIT_TOL)
                print_error("%s: prompt %d position %d: max |logit diff| %.5f (scale %.2f)\n", name,
                            i, pos, d, mx);
            assert_true(d / mx <= LOGIT_TOL);
            assert_int_equal(argmax(got, fx->vocab), argmax(ref, fx->vocab));
        }
        kv_seq_free(r->kv, &s);
    }
    return worst;
}

/* For the quantized types: the worst relative logit difference and the
 * share of positions whose top-1 token is transformers'. */
static void compare_loose(rig *r, const fixture *fx, double *worst, double *top1) {
    int same = 0, n = 0;
    *worst = 0;
    for (int i = 0; i < fx->n_logits; i++) {
        const fx_logits *c = &fx->lg[i];
        kv_seq s;
        cellm_error e;
        assert_int_equal(kv_seq_init(r->kv, &s, &e), CELLM_OK);
        const float *lg = run(r, &s, c->tok, c->n_tok);
        for (int pos = c->first; pos < c->n_tok; pos++, n++) {
            const float *got = lg + (size_t)pos * (size_t)fx->vocab;
            const float *ref = c->rows + (size_t)(pos - c->first) * (size_t)fx->vocab;
            double mx = 1, d = 0;
            for (int v = 0; v < fx->vocab; v++) {
                mx = fmax(mx, fabs(ref[v]));
                d = fmax(d, fabs((double)got[v] - ref[v]));
            }
            *worst = fmax(*worst, d / mx);
            same += argmax(got, fx->vocab) == argmax(ref, fx->vocab);
        }
        kv_seq_free(r->kv, &s);
    }
    *top1 = (double)same / n;
}

/* 32 greedy steps, one token per forward pass, against transformers'. */
static void check_greedy(rig *r, const fixture *fx, const char *name) {
    kv_seq s;
    cellm_error e;
    assert_int_equal(kv_seq_init(r->kv, &s, &e), CELLM_OK);
    const float *lg = run(r, &s, fx->prompt, fx->n_prompt);
    int next = argmax(lg + (size_t)(fx->n_prompt - 1) * (size_t)fx->vocab, fx->vocab);
    for (int i = 0; i < fx->n_gen; i++) {
        if (next != fx->gen[i])
            print_error("%s: greedy step %d: %d, transformers %d\n", name, i, next, fx->gen[i]);
        assert_int_equal(next, fx->gen[i]);
        int32_t t = next;
        lg = run(r, &s, &t, 1);
        next = argmax(lg, fx->vocab);
    }
    kv_seq_free(r->kv, &s);
}

static void check_family(const char *name) {
    fixture fx;
    load_fixture(name, &fx);
    char path[1024];
    convert(name, "f16", path, sizeof path);
    rig r;
    rig_open(&r, path, 2);
    assert_int_equal(r.m->n_vocab, fx.vocab);
    double worst = check_logits(&r, &fx, name);
    check_greedy(&r, &fx, name);
    print_message("%s: logits within %.5f of transformers' (relative), greedy 32/32\n", name,
                  worst);
    rig_close(&r);
    remove_converted(path);
    fixture_free(&fx);
}

static void test_llama(void **state) {
    (void)state;
    check_family("llama");
}
static void test_llama_rope_llama3(void **state) {
    (void)state;
    check_family("llama-rope3");
}
static void test_mistral_window(void **state) {
    (void)state;
    check_family("mistral");
}
static void test_mistral_wide_window(void **state) {
    (void)state;
    check_family("mistral-wide");
}
static void test_qwen2_bias(void **state) {
    (void)state;
    check_family("qwen2");
}
static void test_qwen3_qknorm_bf16(void **state) {
    (void)state;
    check_family("qwen3");
}
static void test_phi3_fused(void **state) {
    (void)state;
    check_family("phi3");
}
static void test_phi3_longrope(void **state) {
    (void)state;
    check_family("phi3-longrope");
}
static void test_gemma3_pattern(void **state) {
    (void)state;
    check_family("gemma3");
}
static void test_gemma3_scaled_global(void **state) {
    (void)state;
    check_family("gemma3-scaled");
}
static void test_granite_scales(void **state) {
    (void)state;
    check_family("granite");
}
static void test_smollm3_nope(void **state) {
    (void)state;
    check_family("smollm3");
}
static void test_qwen3moe(void **state) {
    (void)state;
    check_family("qwen3moe");
}
static void test_olmoe(void **state) {
    (void)state;
    check_family("olmoe");
}
static void test_granitemoe(void **state) {
    (void)state;
    check_family("granitemoe");
}
static void test_lfm2_shortconv(void **state) {
    (void)state;
    check_family("lfm2");
}

/* Batch invariance of a converted family: the long prompt's logits are
 * the same bits run as one chunk, token by token, and in chunks of 7
 * beside another sequence's rows in the same batch (for a mixture of
 * experts, each batch groups other rows under each expert), with 1 and 2
 * threads. */
static void check_invariance(const char *name) {
    fixture fx;
    load_fixture(name, &fx);
    const fx_logits *c = &fx.lg[1];
    int n = c->n_tok, V = fx.vocab;
    char path[1024];
    convert(name, "f16", path, sizeof path);
    float *ref = malloc((size_t)n * V * sizeof(float)),
          *got = malloc((size_t)n * V * sizeof(float));
    assert_non_null(ref);
    assert_non_null(got);
    for (int threads = 1; threads <= 2; threads++) {
        rig r;
        rig_open(&r, path, threads);
        cellm_error e;
        kv_seq a, b;
        for (int mode = 0; mode < 3; mode++) {
            assert_int_equal(kv_seq_init(r.kv, &a, &e), CELLM_OK);
            assert_int_equal(kv_seq_init(r.kv, &b, &e), CELLM_OK);
            float *out = mode == 0 && threads == 1 ? ref : got;
            if (mode == 0) {
                memcpy(out, run(&r, &a, c->tok, n), (size_t)n * V * sizeof(float));
            } else if (mode == 1) {
                for (int i = 0; i < n; i++)
                    memcpy(out + (size_t)i * V, run(&r, &a, &c->tok[i], 1),
                           (size_t)V * sizeof(float));
            } else {
                /* Rows of `a` (7 at a time) after 5 of `b`, whose tokens
                 * are the prompt reversed. */
                for (int i = 0; i < n; i += 7) {
                    fwd_row rows[12];
                    int m = 0;
                    for (int j = 0; j < 5; j++, m++)
                        rows[m] = (fwd_row){&b, c->tok[n - 1 - (i + j) % n], b.n_pos + j, true};
                    int na = n - i < 7 ? n - i : 7;
                    for (int j = 0; j < na; j++, m++)
                        rows[m] = (fwd_row){&a, c->tok[i + j], a.n_pos + j, true};
                    const float *lg;
                    if (forward_run(r.f, rows, m, &lg, &e)) {
                        print_error("%s\n", e.msg);
                        fail();
                    }
                    memcpy(out + (size_t)i * V, lg + (size_t)5 * V, (size_t)na * V * sizeof(float));
                }
            }
            if (out == got && memcmp(ref, got, (size_t)n * V * sizeof(float)))
                print_error("%s: mode %d with %d threads differs\n", name, mode, threads);
            if (out == got) assert_memory_equal(ref, got, (size_t)n * V * sizeof(float));
            kv_seq_free(r.kv, &a);
            kv_seq_free(r.kv, &b);
        }
        rig_close(&r);
    }
    free(ref);
    free(got);
    remove_converted(path);
    fixture_free(&fx);
}

static void test_invariance_new_families(void **state) {
    (void)state;
    static const char *names[] = {"smollm3", "qwen3moe", "olmoe", "granitemoe", "lfm2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) check_invariance(names[i]);
}

/* The description each row yields: the named differences are set. */
static void test_arch_fields(void **state) {
    (void)state;
    static const struct {
        const char *name, *arch;
        rope_kind rope;
        bool bias, qk_norm;
        int window;
    } want[] = {
        {"llama", "llama", ROPE_NORM, false, false, 0},
        {"mistral", "llama", ROPE_NORM, false, false, 16},
        {"mistral-wide", "llama", ROPE_NORM, false, false, 4096},
        {"qwen2", "qwen2", ROPE_NEOX, true, false, 0},
        {"qwen3", "qwen3", ROPE_NEOX, false, true, 0},
        {"phi3", "phi3", ROPE_NEOX, false, false, 0},
        {"granite", "granite", ROPE_NORM, false, false, 0},
        {"gemma3", "gemma3", ROPE_NEOX, false, true, 16},
        {"smollm3", "smollm3", ROPE_NORM, false, false, 0},
        {"qwen3moe", "qwen3moe", ROPE_NEOX, false, true, 0},
        {"olmoe", "olmoe", ROPE_NEOX, false, true, 0},
        {"granitemoe", "granitemoe", ROPE_NORM, false, false, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[1024];
        convert(want[i].name, "f16", path, sizeof path);
        model *m;
        cellm_error e;
        assert_int_equal(model_load(path, &m, &e), CELLM_OK);
        assert_string_equal(m->arch, want[i].arch);
        assert_int_equal(m->rope, want[i].rope);
        assert_int_equal(m->layers[0].bq.data != NULL, want[i].bias);
        assert_int_equal(m->layers[0].q_norm.data != NULL, want[i].qk_norm);
        assert_int_equal(m->layers[0].window, want[i].window);
        if (!strcmp(want[i].name, "gemma3")) { /* the 6th layer is global */
            assert_int_equal(m->n_layer, 6);
            assert_int_equal(m->layers[5].window, 0);
            assert_non_null(m->layers[0].post_attn_norm.data);
            assert_non_null(m->layers[0].post_ffn_norm.data);
        }
        if (!strcmp(want[i].name, "smollm3")) /* no RoPE in the 4th layer only */
            for (int il = 0; il < m->n_layer; il++) assert_int_equal(m->layers[il].nope, il == 3);
        bool moe = strstr(want[i].name, "moe") != NULL;
        assert_int_equal(m->n_expert, moe ? 8 : 0);
        assert_int_equal(m->layers[0].ffn_gate_inp.data != NULL, moe);
        assert_int_equal(m->layers[0].w_down.data == NULL, moe);
        if (moe) {
            assert_int_equal(m->n_expert_used, 2);
            assert_int_equal(m->n_ff_exp, 32);
            assert_int_equal(m->moe_norm_topk, strcmp(want[i].name, "olmoe") != 0);
            assert_int_equal(m->layers[0].up_exps.ne1, 8 * 32);
        }
        /* OLMoE's QK-norm spans all heads. */
        assert_int_equal(m->layers[0].qk_norm_full, !strcmp(want[i].name, "olmoe"));
        if (!strncmp(want[i].name, "granite", 7)) {
            assert_true(fabsf(m->emb_scale - 12.0f) < 1e-6f);
            assert_true(fabsf(m->residual_scale - 0.22f) < 1e-6f);
            assert_true(fabsf(m->attn_scale - 0.0078125f) < 1e-9f);
            assert_true(fabsf(m->logit_scale - 0.125f) < 1e-9f);
        }
        model_free(m);
        remove_converted(path);
    }
}

/* ---- the engine on a hybrid (lfm2) and a mixture of experts (qwen3moe) */

#define N_ASK 4
static const char *const asks[N_ASK] = {"In the beginning God created the heaven",
                                        "def fib(n): return n", "The quick brown fox jumps over",
                                        "Prices: milk 1.19, eggs 2.89"};

typedef struct answer {
    int32_t tok[32], n;
    int32_t n_cached, n_preempted;
    float lp[32]; /* the completion tokens' log-probabilities (a session's turn) */
    int32_t n_lp;
} answer;

static void on_lp(const cellm_token_logprob *lp, void *user) {
    answer *a = user;
    if (!lp->is_prompt && a->n_lp < 32) a->lp[a->n_lp++] = lp->logprob;
}

static cellm_engine *engine_for(cellm_model *m, size_t budget) {
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.max_ctx = 256;
    ep.max_batch_tokens = 32;
    ep.prefix_cache = 1;
    if (budget) ep.mem_budget_bytes = budget;
    cellm_engine *e = NULL;
    if (cellm_engine_create(m, &ep, &e) != CELLM_OK) {
        print_error("engine: %s\n", cellm_last_error());
        fail();
    }
    return e;
}

static void take_answer(cellm_request *r, answer *a) {
    cellm_result res;
    assert_int_equal(cellm_wait(r, &res), CELLM_OK);
    assert_int_equal(res.status, CELLM_OK);
    const int32_t *t;
    assert_int_equal(cellm_request_tokens(r, &t, &a->n), CELLM_OK);
    assert_true(a->n <= 32);
    memcpy(a->tok, t, (size_t)a->n * sizeof *t);
    a->n_cached = res.n_cached_tokens;
    a->n_preempted = res.n_preemptions;
    cellm_request_free(r);
}

/* Greedy answers (the default) to asks[first..first + n) submitted at once. */
static void ask_all(cellm_engine *e, int first, int n, answer *out) {
    cellm_request *req[N_ASK];
    memset(out, 0, (size_t)n * sizeof *out);
    for (int i = 0; i < n; i++) {
        cellm_chat_message msg = {"user", asks[first + i]};
        cellm_request_params p = cellm_request_default_params();
        p.messages = &msg;
        p.n_messages = 1;
        p.max_tokens = 24;
        p.logprobs = 1;
        p.on_logprob = on_lp;
        p.user = &out[i];
        assert_int_equal(cellm_submit(e, &p, &req[i]), CELLM_OK);
    }
    for (int i = 0; i < n; i++) take_answer(req[i], &out[i]);
}

static void assert_answers(const answer *a, const answer *b, const char *what) {
    if (a->n != b->n || memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok))
        print_error("%s: the answers differ\n", what);
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
    assert_int_equal(a->n_lp, b->n_lp);
    assert_memory_equal(a->lp, b->lp, (size_t)a->n_lp * sizeof *a->lp);
}

/* A turn; with `eos`, the reply is the end-of-turn token alone (biased up),
 * so the session's kept tokens are a prefix of the next turn's prompt and
 * the next turn starts from them whatever the model (a reply of random
 * tokens may tokenize otherwise when the template renders it again, and a
 * short-convolution model cannot take back positions: it would recompute
 * everything). */
static void session_turn(cellm_session *s, const char *text, bool eos, answer *a) {
    cellm_request *r = NULL;
    cellm_request_params p = cellm_session_request_params(s);
    cellm_logit_bias bias = {2, 100.0f}; /* the fixtures' <|im_end|> */
    memset(a, 0, sizeof *a);
    if (eos) {
        p.sampling.logit_bias = &bias;
        p.sampling.n_logit_bias = 1;
    }
    p.logprobs = 1; /* their bits show any difference in the state a turn starts from */
    p.on_logprob = on_lp;
    p.user = a;
    if (cellm_session_send(s, text, &p, &r) != CELLM_OK) {
        print_error("send: %s\n", cellm_last_error());
        fail();
    }
    take_answer(r, a);
}

static cellm_session_params session_params(void) {
    cellm_session_params sp = cellm_session_default_params();
    sp.max_tokens = 12;
    return sp;
}

static cellm_session *session_new(cellm_engine *e) {
    cellm_session_params sp = session_params();
    cellm_session *s = NULL;
    assert_int_equal(cellm_session_create(e, &sp, &s), CELLM_OK);
    return s;
}

/* What the engine keeps per sequence must survive what the engine does to
 * sequences: the short-convolution state of lfm2 and the expert routing
 * of qwen3moe. (1) Four requests at once under a budget of a few KV
 * blocks, so some are preempted and recomputed, answer as each does alone.
 * (2) A chat session of three turns gives the same replies when it is
 * saved after two, and restored on a new engine for the third, which
 * starts from the kept KV (and, for lfm2, the saved state). */
static void check_engine(const char *name) {
    char path[1024], file[1100];
    convert(name, "f16", path, sizeof path);
    snprintf(file, sizeof file, "%s.session", path);
    cellm_model *m = NULL;
    assert_int_equal(cellm_model_load(path, NULL, &m), CELLM_OK);

    answer alone[N_ASK], squeezed[N_ASK];
    cellm_engine *e = engine_for(m, 0);
    for (int i = 0; i < N_ASK; i++) ask_all(e, i, 1, &alone[i]); /* one at a time */
    cellm_stats st;
    assert_int_equal(cellm_engine_stats(e, &st), CELLM_OK);
    cellm_engine_free(e);
    size_t block = st.bytes_kv_total / (size_t)st.blocks_total;
    e = engine_for(m, st.bytes_activations + 5 * block + block / 2);
    ask_all(e, 0, N_ASK, squeezed);
    assert_int_equal(cellm_engine_stats(e, &st), CELLM_OK);
    print_message("%s: %d blocks, %llu preemptions\n", name, st.blocks_total,
                  (unsigned long long)st.n_preemptions);
    assert_true(st.n_preemptions > 0);
    for (int i = 0; i < N_ASK; i++) assert_answers(&alone[i], &squeezed[i], "squeezed");
    cellm_engine_free(e);

    answer u[3], s[3];
    e = engine_for(m, 0);
    cellm_session *ses = session_new(e);
    for (int i = 0; i < 3; i++) session_turn(ses, asks[i], i < 2, &u[i]);
    cellm_session_free(ses);
    cellm_engine_free(e);
    e = engine_for(m, 0);
    ses = session_new(e);
    for (int i = 0; i < 2; i++) session_turn(ses, asks[i], true, &s[i]);
    assert_int_equal(cellm_session_save(ses, file), CELLM_OK);
    cellm_session_free(ses);
    cellm_engine_free(e);
    e = engine_for(m, 0);
    ses = NULL;
    cellm_session_params sp = session_params();
    if (cellm_session_restore(e, file, &sp, &ses) != CELLM_OK) {
        print_error("restore: %s\n", cellm_last_error());
        fail();
    }
    session_turn(ses, asks[2], false, &s[2]);
    print_message("%s: restored turn: %d prompt tokens from the saved KV\n", name, s[2].n_cached);
    assert_true(s[2].n_cached > 0);
    for (int i = 0; i < 3; i++) assert_answers(&u[i], &s[i], "session");
    cellm_session_free(ses);
    cellm_engine_free(e);
    cellm_model_free(m);
    unlink(file);
    remove_converted(path);
}

static void test_asan_engine_lfm2(void **state) {
    (void)state;
    check_engine("lfm2");
}
static void test_asan_engine_qwen3moe(void **state) {
    (void)state;
    check_engine("qwen3moe");
}

/* The number after "key": in `json`. */
static double json_num(const char *json, const char *key) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    assert_non_null(p);
    return strtod(p + strlen(pat), NULL);
}

/* `cellm inspect` on a mixture of experts: the active bytes per token are
 * the weights less the experts a token is not routed to (6 of 8 experts'
 * gate, up and down, 32 x 64 F16 values each, in both layers). */
static void test_inspect_moe_active(void **state) {
    (void)state;
    char path[1024], cmd[2048], *out;
    convert("qwen3moe", "f16", path, sizeof path);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --json", test_cellm_bin(), path);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    double total = json_num(out, "weights_bytes"), active = json_num(out, "active_bytes_per_token");
    assert_true(active == total - 2 * 3 * 6 * 32 * 64 * 2);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s'", test_cellm_bin(), path);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "active per token (2 of 8 experts)"));
    free(out);
    remove_converted(path);
}

/* Sets the string key arg[0] to arg[1]. */
static void set_str_key(gguf_writer *w, const void *arg) {
    const char *const *kv = arg;
    cellm_error e;
    assert_int_equal(gguf_writer_set_str(w, kv[0], kv[1], &e), CELLM_OK);
}

/* A copy of the GGUF file at `src` with string key `key` set to `val`. */
static void copy_with_key(const char *src, const char *dst, const char *key, const char *val) {
    const char *kv[2] = {key, val};
    test_gguf_copy(src, dst, set_str_key, kv);
}

static void test_rope_scaling_type_key(void **state) {
    (void)state;
    char path[1024], copy[1100];
    convert("phi3-longrope", "f16", path, sizeof path);
    snprintf(copy, sizeof copy, "%s.copy.gguf", path);
    model *m;
    cellm_error e;
    copy_with_key(path, copy, "phi3.rope.scaling.type", "longrope");
    assert_int_equal(model_load(copy, &m, &e), CELLM_OK);
    assert_non_null(m->rope_freqs);
    assert_true(m->rope_mscale > 1.0f);
    model_free(m);
    copy_with_key(path, copy, "phi3.rope.scaling.type", "yarn");
    assert_int_equal(model_load(copy, &m, &e), CELLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "'yarn'"));
    unlink(copy);
    remove_converted(path);
}

/* `cellm convert --type T`: the matrices take the type (or, for the K
 * quants, quantize's fallbacks for rows of 64), norms stay F32, and the
 * logits stay near transformers' by the type's precision. */
static void test_convert_types(void **state) {
    (void)state;
    static const struct {
        const char *type;
        uint32_t attn_type; /* of blk.0.attn_q.weight */
        double tol, min_top1;
    } want[] =
        {
            {"f32", QT_F32, 0.002, 1.0},   {"bf16", QT_BF16, 0.02, 0.9},
            {"q8_0", QT_Q8_0, 0.05, 0.9},  {"Q4_0", QT_Q4_0, 0.4, 0.5},
            {"q4_k_m", QT_Q5_0, 0.4, 0.5}, /* Q4_K's fallback for rows of 64 */
        };
    fixture fx;
    load_fixture("llama", &fx);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[1024];
        convert("llama", want[i].type, path, sizeof path);
        gguf_file *g;
        cellm_error e;
        assert_int_equal(gguf_open(path, &g, &e), CELLM_OK);
        assert_int_equal(gguf_find_tensor(g, "blk.0.attn_q.weight")->type, want[i].attn_type);
        assert_int_equal(gguf_find_tensor(g, "blk.0.attn_norm.weight")->type, QT_F32);
        gguf_close(g);
        rig r;
        rig_open(&r, path, 2);
        double worst, top1;
        compare_loose(&r, &fx, &worst, &top1);
        print_message("llama %s: logits within %.4f of transformers' (relative), top-1 %.0f%%\n",
                      want[i].type, worst, 100 * top1);
        assert_true(worst <= want[i].tol);
        assert_true(top1 >= want[i].min_top1);
        rig_close(&r);
        remove_converted(path);
    }
    fixture_free(&fx);
}

/* Bad arguments and folders fail with a message and leave no file. */
static void test_convert_errors(void **state) {
    (void)state;
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd,
             "'%s' convert '%s/tests/data/arch/llama' /tmp/cellm-x.gguf --type q3_x 2>&1",
             test_cellm_bin(), CELLM_SOURCE_DIR);
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "unknown type 'q3_x'"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' convert /nonexistent-dir /tmp/cellm-x.gguf 2>&1",
             test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "config.json"));
    free(out);
    assert_int_not_equal(access("/tmp/cellm-x.gguf", F_OK), 0);
}

/* Copies tests/data/arch/llama into a new folder, replaces `file` there
 * with `content` (NULL: removes it), converts, and expects a failure whose
 * message holds `want`, with no output left. */
static void bad_folder(const char *file, const char *content, const char *want) {
    char dir[] = "/tmp/cellm-badhf-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[4096], path[1024], *out;
    snprintf(cmd, sizeof cmd, "cp '%s/tests/data/arch/llama/'* '%s/'", CELLM_SOURCE_DIR, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (content) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(content, f);
        fclose(f);
    } else {
        assert_int_equal(unlink(path), 0);
    }
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s/out.gguf' 2>&1", test_cellm_bin(), dir, dir);
    int rc = test_run_cmd(cmd, &out);
    if (rc != 1 || !strstr(out, want)) print_error("%s: rc %d, '%s'\n", file, rc, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, want));
    free(out);
    snprintf(path, sizeof path, "%s/out.gguf", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(cmd, sizeof cmd, "rm -r '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* config.json, the index and tokenizer.json are untrusted too: each bad
 * one is an error naming it. */
static void test_convert_bad_folders(void **state) {
    (void)state;
    bad_folder("config.json", "{\"architectures\": [\"GPT2LMHeadModel\"]}",
               "'GPT2LMHeadModel' is not supported");
    bad_folder("config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": -64, "
               "\"num_hidden_layers\": 2, \"intermediate_size\": 128, "
               "\"num_attention_heads\": 4, \"vocab_size\": 352}",
               "hidden_size");
    bad_folder("config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
               "\"num_hidden_layers\": 2, \"intermediate_size\": 128, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 3, \"vocab_size\": 352}",
               "do not fit");
    bad_folder("config.json", "[1, 2", "config.json is not a JSON object");
    bad_folder("config.json", NULL, "config.json is missing");
    /* A layer count below the tensors': blk.1 has no place. */
    bad_folder("config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
               "\"num_hidden_layers\": 1, \"intermediate_size\": 128, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 352}",
               "model.layers.1.");
    /* Sizes that disagree with the tensors: the loaded-back check. */
    bad_folder("config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
               "\"num_hidden_layers\": 2, \"intermediate_size\": 96, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 352}",
               "does not load");
    bad_folder("model.safetensors.index.json",
               "{\"weight_map\": {\"lm_head.weight\": \"../../etc/passwd\"}}", "bad file");
    bad_folder("model.safetensors.index.json",
               "{\"weight_map\": {\"lm_head.weight\": \"missing.safetensors\"}}",
               "missing.safetensors");
    bad_folder("tokenizer.json", "{\"model\": {\"type\": \"WordPiece\"}}", "only BPE");
    bad_folder("tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 400}, \"merges\": []}, "
               "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
               "bad or repeated id");
    bad_folder("tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}, "
               "\"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
               "pre-tokenizer");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_llama_rope_llama3),
        cmocka_unit_test(test_mistral_window),
        cmocka_unit_test(test_mistral_wide_window),
        cmocka_unit_test(test_qwen2_bias),
        cmocka_unit_test(test_qwen3_qknorm_bf16),
        cmocka_unit_test(test_phi3_fused),
        cmocka_unit_test(test_phi3_longrope),
        cmocka_unit_test(test_granite_scales),
        cmocka_unit_test(test_gemma3_pattern),
        cmocka_unit_test(test_gemma3_scaled_global),
        cmocka_unit_test(test_smollm3_nope),
        cmocka_unit_test(test_qwen3moe),
        cmocka_unit_test(test_olmoe),
        cmocka_unit_test(test_granitemoe),
        cmocka_unit_test(test_lfm2_shortconv),
        cmocka_unit_test(test_invariance_new_families),
        cmocka_unit_test(test_inspect_moe_active),
        cmocka_unit_test(test_asan_engine_lfm2),
        cmocka_unit_test(test_asan_engine_qwen3moe),
        cmocka_unit_test(test_arch_fields),
        cmocka_unit_test(test_rope_scaling_type_key),
        cmocka_unit_test(test_convert_types),
        cmocka_unit_test(test_convert_bad_folders),
        cmocka_unit_test(test_convert_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
