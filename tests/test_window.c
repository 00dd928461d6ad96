/*
 * test_window.c — Gemma 3 past its sliding window (512 positions on five
 * layers of six). Prompts of window - 1, window, window + 1, 2 x window,
 * ctx - 17 and ctx - 1 tokens are each followed by generation:
 *  - through `cellm run --raw` (whose KV cache holds exactly one sequence);
 *  - through the engine with one sequence and with four at once, each
 *    under the smallest process budget (cellm_engine_params.
 *    process_budget_bytes) that it accepts, so the KV pool is what the
 *    engine's own sizing says these sequences need;
 * in every KV type: f16 with every length on each path, the compressed
 * types with fewer (their blocks differ in bytes, not in positions; of
 * them `cellm run` takes q4_0 only, the engine every type), so that the
 * whole test stays within a minute or so.
 * A windowed layer must hold a whole prompt chunk beside its window;
 * sizing it for the window alone failed every prompt from about 520
 * tokens up with "KV cache full" (issue 19).
 *
 * Every prompt generates 16 tokens (end-of-text banned), except the one of
 * ctx - 1, which fills the context with its first token and stops there
 * (CELLM_FINISH_LENGTH), as a request at the context's end does.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "cellm.h"
#include "test_common.h"

#define WINDOW 512
#define CTX 1088 /* 2 x WINDOW + room for 16 tokens, in whole blocks */
#define GEN 16

enum {
    W1 = WINDOW - 1,
    W = WINDOW,
    W2 = WINDOW + 1,
    WW = 2 * WINDOW,
    C17 = CTX - 1 - GEN,
    C1 = CTX - 1
};

/* The prompt lengths each path runs, per KV type; 0 ends a list. */
static const struct {
    const char *name;
    cellm_kv_type type;
    int32_t run[7];  /* `cellm run`, one prompt after another */
    int32_t one[7];  /* an engine of one sequence, one after another */
    int32_t four[5]; /* an engine of four, all at once */
} cases[] = {
    {"f16", CELLM_KV_F16, {W1, W, W2, WW, C17, C1}, {W1, W, W2, WW, C17, C1}, {W1, W2, WW, C17}},
    {"q8_0", CELLM_KV_Q8_0, {0}, {W, C17}, {0}},
    {"q4_0", CELLM_KV_Q4_0, {W2, C1}, {W, C17}, {W1, W2, WW, C17}},
    {"q4_0h", CELLM_KV_Q4_0H, {0}, {W, C17}, {0}},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static cellm_model *g_model;
static int32_t *g_text; /* the test text's tokens, BOS first */
static int32_t g_n_text;

static int setup(void **state) {
    (void)state;
    char path[1024];
    test_model_path("gemma3-270m", path, sizeof path);
    assert_int_equal(cellm_model_load(path, NULL, &g_model), CELLM_OK);
    size_t len;
    char *text = NULL;
    FILE *f = fopen(CELLM_SOURCE_DIR "/tests/data/genesis-kjv-start.txt", "rb");
    assert_non_null(f);
    text = calloc(1, 1 << 16);
    assert_non_null(text);
    len = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    assert_true(len > 0);
    assert_int_equal(cellm_tokenize(g_model, text, &g_text, &g_n_text), CELLM_OK);
    free(text);
    /* Room for four different prompts of up to 2 x WINDOW, and for ctx. */
    assert_true(g_n_text >= CTX + 3 * 64);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(g_text);
    cellm_model_free(g_model);
    return 0;
}

/* Text that tokenizes (BOS added) to exactly n tokens: the test text's
 * first tokens decoded, as many as that takes (new string). */
static char *text_of(int32_t n) {
    int32_t k = n - 1;
    for (int tries = 0; tries < 16; tries++) {
        char *s;
        size_t len;
        int32_t *ids, got;
        assert_int_equal(cellm_detokenize(g_model, g_text + 1, k, 0, &s, &len), CELLM_OK);
        assert_int_equal(cellm_tokenize(g_model, s, &ids, &got), CELLM_OK);
        free(ids);
        if (got == n) return s;
        free(s);
        k += n - got;
    }
    fail_msg("no text of %d tokens", n);
    return NULL;
}

/* ------------------------------------------------------------- cellm run */

static void run_cli(const char *kv_name, int32_t n) {
    char *prompt = text_of(n);
    char ctx_arg[32], path[1024];
    snprintf(ctx_arg, sizeof ctx_arg, "%d", CTX);
    test_model_path("gemma3-270m", path, sizeof path);
    /* The prompt goes through a file: no quoting of the text. */
    char tmpl[] = "/tmp/cellm-window-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, prompt, strlen(prompt)), (ssize_t)strlen(prompt));
    close(fd);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' run '%s' --raw -p \"$(cat '%s')\" -n %d --ignore-eos --temp 0 -c %s "
             "--kv-type %s -t 2 -v 2>&1",
             test_cellm_bin(), path, tmpl, GEN, ctx_arg, kv_name);
    char *out;
    int rc = test_run_cmd(cmd, &out);
    unlink(tmpl);
    free(prompt);
    const char *line = strstr(out, "prompt: ");
    long n_prompt = -1, n_gen = -1;
    if (line)
        sscanf(line, "prompt: %ld tokens, %*f tokens/s; generation: %ld tokens", &n_prompt, &n_gen);
    long want = n < CTX - GEN ? GEN : CTX - n;
    if (rc != 0 || n_prompt != n || n_gen != want) {
        print_error("cellm run, KV %s, prompt of %d tokens (exit %d; wanted %ld tokens):\n%s\n",
                    kv_name, n, rc, want, out);
        free(out);
        fail();
    }
    free(out);
}

static void test_run(void **state) {
    (void)state;
    for (int c = 0; c < N_CASES; c++)
        for (int i = 0; cases[c].run[i]; i++) run_cli(cases[c].name, cases[c].run[i]);
}

/* --------------------------------------------------------------- engine */

/* An engine of max_seqs sequences of CTX under the smallest process
 * budget it takes (to the MiB): its KV pool is what its own sizing says
 * they need, no more. Manual steps: cellm_wait runs them. */
static cellm_engine *tight_engine(cellm_kv_type kv, int32_t max_seqs) {
    cellm_engine_params p = cellm_engine_default_params();
    p.n_threads = 2;
    p.max_seqs = max_seqs;
    p.max_ctx = CTX;
    p.kv_type = kv;
    p.prefix_cache = 0;
    p.manual_steps = 1;
    size_t lo = 1, hi = 4096; /* MiB: lo fails, hi holds */
    cellm_engine *e = NULL;
    p.process_budget_bytes = hi << 20;
    assert_int_equal(cellm_engine_create(g_model, &p, &e), CELLM_OK);
    cellm_engine_free(e);
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        p.process_budget_bytes = mid << 20;
        if (cellm_engine_create(g_model, &p, &e) == CELLM_OK) {
            cellm_engine_free(e);
            hi = mid;
        } else {
            lo = mid;
        }
    }
    p.process_budget_bytes = hi << 20;
    assert_int_equal(cellm_engine_create(g_model, &p, &e), CELLM_OK);
    return e;
}

/* Submits the n-token prompt that starts `offset` tokens into the text
 * (after BOS), greedy, end-of-text banned. */
static cellm_request *submit(cellm_engine *e, int32_t offset, int32_t n, int32_t *buf) {
    cellm_model_info info;
    assert_int_equal(cellm_model_get_info(g_model, &info), CELLM_OK);
    buf[0] = g_text[0];
    memcpy(buf + 1, g_text + 1 + offset, sizeof *buf * (size_t)(n - 1));
    static cellm_logit_bias ban;
    ban = (cellm_logit_bias){info.eos, -INFINITY};
    cellm_request_params rp = cellm_request_default_params();
    rp.tokens = buf;
    rp.n_tokens = n;
    rp.max_tokens = GEN;
    rp.sampling.logit_bias = &ban;
    rp.sampling.n_logit_bias = 1;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &rp, &r), CELLM_OK);
    return r;
}

static void expect_done(cellm_request *r, const char *kv_name, int32_t seqs, int32_t n) {
    cellm_result res;
    assert_int_equal(cellm_wait(r, &res), CELLM_OK);
    int32_t want = n < CTX - GEN ? GEN : CTX - n;
    if (res.finish_reason != CELLM_FINISH_LENGTH || res.n_completion_tokens != want ||
        res.n_preemptions != 0) {
        print_error("engine of %d, KV %s, prompt of %d tokens: finish %d, %d tokens (wanted %d), "
                    "%d preemptions; %s\n",
                    seqs, kv_name, n, (int)res.finish_reason, res.n_completion_tokens, want,
                    res.n_preemptions, cellm_request_error(r));
        fail();
    }
    cellm_request_free(r);
}

static void test_engine_one(void **state) {
    (void)state;
    static int32_t buf[CTX];
    for (int c = 0; c < N_CASES; c++) {
        cellm_engine *e = tight_engine(cases[c].type, 1);
        for (int i = 0; cases[c].one[i]; i++)
            expect_done(submit(e, 0, cases[c].one[i], buf), cases[c].name, 1, cases[c].one[i]);
        cellm_engine_free(e);
    }
}

/* Four sequences at once, each from its own place in the text (no shared
 * prefix). */
static void test_engine_four(void **state) {
    (void)state;
    static int32_t buf[4][CTX];
    for (int c = 0; c < N_CASES; c++) {
        if (!cases[c].four[0]) continue;
        cellm_engine *e = tight_engine(cases[c].type, 4);
        cellm_request *r[4];
        for (int i = 0; i < 4; i++) r[i] = submit(e, 64 * i, cases[c].four[i], buf[i]);
        for (int i = 0; i < 4; i++) expect_done(r[i], cases[c].name, 4, cases[c].four[i]);
        cellm_engine_free(e);
    }
}

/* The sample ASan runs (test.sh gives it only test_?san_*: the whole test
 * takes over half an hour there): one sequence just past the window in f16
 * and one that ends at the context's end in the rotated 4-bit type, through
 * the engine under its least budget. */
static void test_asan_window(void **state) {
    (void)state;
    static int32_t buf[CTX];
    static const struct {
        const char *name;
        cellm_kv_type type;
        int32_t n;
    } sample[] = {{"f16", CELLM_KV_F16, W2}, {"q4_0h", CELLM_KV_Q4_0H, C17}};
    for (size_t i = 0; i < sizeof sample / sizeof sample[0]; i++) {
        cellm_engine *e = tight_engine(sample[i].type, 1);
        expect_done(submit(e, 0, sample[i].n, buf), sample[i].name, 1, sample[i].n);
        cellm_engine_free(e);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run),
        cmocka_unit_test(test_engine_one),
        cmocka_unit_test(test_engine_four),
        cmocka_unit_test(test_asan_window),
    };
    /* test.sh's TSan and aarch64 runs set CELLM_TEST_FILTER=test_tsan_*,
     * which leaves these real-model runs out there; ASan's (test_?san_*)
     * runs test_asan_window alone. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
