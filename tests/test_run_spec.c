/*
 * test_run_spec.c — speculative decoding in `cellm run`, through the real
 * binary. With a draft model (the Q4_0 requantization of the same model),
 * with prompt lookup, and with both, the text is byte for byte the plain
 * run's, greedy and sampled from a seed, on SmolLM2 and on Gemma 3 (with a
 * prompt past Gemma's 512-token sliding window, so rejected guesses are
 * taken back across its windowed layers), and -v says guesses were made
 * and kept; a chat whose turns outgrow the context (dropping old turns,
 * rewinding the draft with the model) gives the plain chat's answers; a
 * draft of another family is refused, naming the families.
 *
 * The draft files are made by scripts/test.sh's models suite (cellm
 * quantize MODEL MODEL-q4_0.gguf Q4_0) into the model store.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "test_common.h"

/* A draft file in the model store (where test_model_path looks); fails
 * saying how to make it when it is missing. */
static const char *draft_path(const char *model, char *buf, size_t cap) {
    const char *home = getenv("CELLM_HOME");
    char store[900];
    if (home && *home)
        snprintf(store, sizeof store, "%s/models", home);
    else
        snprintf(store, sizeof store, "%s/.cache/cellm/models",
                 getenv("HOME") ? getenv("HOME") : "");
    snprintf(buf, cap, "%s/%s-q4_0.gguf", store, model);
    if (access(buf, R_OK) != 0) {
        print_error("draft model %s not found: scripts/test.sh's models suite makes it (cellm "
                    "quantize %s/%s.gguf %s Q4_0)\n",
                    buf, store, model, buf);
        fail();
    }
    return buf;
}

/* What `cellm run MODEL ARGS -v` did: its exit status, stdout, stderr,
 * and the guesses made and kept that -v reported last (0 without the
 * line; in a chat each answer's line counts all so far). */
typedef struct run_out {
    int rc;
    char *out, *err;
    unsigned long long guesses, kept;
} run_out;

static void run_out_free(run_out *r) {
    free(r->out);
    free(r->err);
}

/* `input`: what printf gives its stdin (NULL: nothing). */
static run_out run_v(const char *input, const char *model, const char *args) {
    char errf[1100], cmd[8192];
    snprintf(errf, sizeof errf, "%s/test_run_spec-%d.err", CELLM_BINARY_DIR, (int)getpid());
    snprintf(cmd, sizeof cmd, "printf '%s' | '%s' run '%s' %s -v 2>'%s'", input ? input : "",
             test_cellm_bin(), model, args, errf);
    run_out r = {0};
    r.rc = test_run_cmd(cmd, &r.out);
    snprintf(cmd, sizeof cmd, "cat '%s'", errf);
    assert_int_equal(test_run_cmd(cmd, &r.err), 0);
    unlink(errf);
    const char *s = NULL;
    for (const char *p = r.err; (p = strstr(p, "speculation: ")); p++) s = p;
    if (s)
        assert_int_equal(sscanf(s, "speculation: %llu guesses, %llu kept", &r.guesses, &r.kept), 2);
    return r;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* `cellm run MODEL ARGS` prints the same with --draft, with --lookup 3 and
 * with both as without, and each reports guesses made and kept. */
static void check_same(const char *model, const char *draft, const char *args) {
    double t0 = now_s();
    run_out plain = run_v(NULL, model, args);
    if (plain.rc) print_error("%s", plain.err);
    assert_int_equal(plain.rc, 0);
    assert_null(strstr(plain.err, "speculation: "));
    assert_true(strlen(plain.out) > 20);
    char more[8192], with_draft[1100];
    snprintf(with_draft, sizeof with_draft, "--draft '%s'", draft);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* Sanitizer builds (several times slower): both sources in one run,
     * which takes both paths (lookup first, the draft where it misses). */
    const char *const modes[][2] = {{with_draft, "--lookup 3"}};
#else
    const char *const modes[][2] = {
        {with_draft, ""}, {"", "--lookup 3"}, {with_draft, "--lookup 3"}};
#endif
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        snprintf(more, sizeof more, "%s %s %s", modes[i][0], modes[i][1], args);
        run_out spec = run_v(NULL, model, more);
        if (spec.rc) print_error("%s", spec.err);
        assert_int_equal(spec.rc, 0);
        if (strcmp(spec.out, plain.out))
            print_error("cellm run %s\nprinted:\n%s\nand without guesses:\n%s\n", more, spec.out,
                        plain.out);
        assert_string_equal(spec.out, plain.out);
        print_message("%-8s %-10s %llu guesses, %llu kept\n", modes[i][0][0] ? "--draft" : "",
                      modes[i][1], spec.guesses, spec.kept);
        assert_true(spec.guesses > 0);
        assert_true(spec.kept > 0);
        run_out_free(&spec);
    }
    print_message("%.1f s for the runs\n", now_s() - t0);
    run_out_free(&plain);
}

#define COLORS "-p 'The three primary colors are red, green and blue. The three primary colors are'"
#define ROSES                                                                                      \
    "-p 'Roses are red, violets are blue. Roses are red, violets are blue. Roses are red,'"

/* check_same for each of args[0..n) on a model and its Q4_0 draft. */
static void check_prompts(const char *name, const char *const *args, size_t n) {
    char model[1024], draft[1024];
    test_model_path(name, model, sizeof model);
    draft_path(name, draft, sizeof draft);
    for (size_t i = 0; i < n; i++) check_same(model, draft, args[i]);
}

static void test_asan_run_spec_smollm2(void **st) {
    (void)st;
    static const char *const args[] = {
        "--raw " COLORS " -n 48 --temp 0",
        "--raw " ROSES " -n 48 --temp 0.8 -s 42",
    };
    check_prompts("smollm2-135m", args, sizeof args / sizeof *args);
}

static void test_run_spec_gemma3(void **st) {
    (void)st;
    static const char *const args[] = {
        /* About 620 tokens of Genesis: past the 512-token window. */
        "--raw -c 1088 -p \"$(head -c 2500 '" CELLM_SOURCE_DIR
        "/tests/data/genesis-kjv-start.txt')\" -n 48 --temp 0",
        "--raw " ROSES " -n 48 --temp 0.8 -s 42",
    };
    check_prompts("gemma3-270m", args, sizeof args / sizeof *args);
}

/* A chat from a pipe in a context too small for it: the answers stop at
 * the full context, later turns drop the oldest exchange, /reset starts
 * over; the draft's KV follows every rewind of the model's (it never runs
 * out of room, and keeps guessing right). */
static void test_run_spec_chat(void **st) {
    (void)st;
    char model[1024], draft[1024], args[2048];
    test_model_path("smollm2-135m", model, sizeof model);
    draft_path("smollm2-135m", draft, sizeof draft);
    const char *lines = "What is 2+2?\\nName three colors.\\nTell me about the sea.\\n/reset\\n"
                        "Count from 1 to 20.\\n";
    run_out plain = run_v(lines, model, "-c 128 -n 48");
    assert_int_equal(plain.rc, 0);
    assert_true(strlen(plain.out) > 100);
    snprintf(args, sizeof args, "-c 128 -n 48 --draft '%s' --lookup 2", draft);
    run_out spec = run_v(lines, model, args);
    assert_int_equal(spec.rc, 0);
    assert_string_equal(spec.out, plain.out);
    assert_null(strstr(spec.err, "failed"));
    print_message("chat: %llu guesses, %llu kept\n", spec.guesses, spec.kept);
    assert_true(spec.kept > 0);
    run_out_free(&plain);
    run_out_free(&spec);
}

/* A draft of another family, and flags out of range, are refused with a
 * message that names them. */
static void test_asan_run_spec_errors(void **st) {
    (void)st;
    char model[1024], other[1024], cmd[4096], *out;
    test_model_path("gemma3-270m", model, sizeof model);
    test_model_path("smollm2-135m", other, sizeof other);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --raw -p hi -n 4 --draft '%s' 2>&1", test_cellm_bin(),
             model, other);
    int rc = test_run_cmd(cmd, &out);
    print_message("%s", out);
    assert_true(rc != 0);
    assert_non_null(strstr(out, "family is llama and the model's is gemma3"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --raw -p hi -n 4 --draft /nonexistent.gguf 2>&1",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "--draft /nonexistent.gguf"));
    free(out);
    static const char *const bad[][2] = {
        {"--draft-max 0", "--draft-max"},
        {"--draft-max 65", "--draft-max"},
        {"--lookup x", "--lookup"},
        {"--draft-p-min 1.5", "--draft-p-min"},
        {"--draft-min 9", "--draft-min"},
        {"--draft", "--draft"},
        {"--spec-accept maybe", "--spec-accept"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "'%s' run %s 2>&1", test_cellm_bin(), bad[i][0]);
        assert_int_equal(test_run_cmd(cmd, &out), 2);
        assert_non_null(strstr(out, bad[i][1]));
        free(out);
    }
}

/* --spec-accept resample on a sampled run: the same text on 1 thread and
 * on 2 (its random numbers are keyed by seed and position), guesses made
 * and kept; and with --temp 0 the plain run's text (greedy keeps the
 * exact rule). */
static void test_run_resample(void **st) {
    (void)st;
    char model[1024], draft[1024], args[4096];
    test_model_path("smollm2-135m", model, sizeof model);
    draft_path("smollm2-135m", draft, sizeof draft);
    const char *p = "-p 'Write a short story about a cat.' -n 24 -s 5 --draft-p-min 0.2";
    snprintf(args, sizeof args, "%s --draft '%s' --spec-accept resample -t 1", p, draft);
    run_out one = run_v(NULL, model, args);
    snprintf(args, sizeof args, "%s --draft '%s' --spec-accept resample -t 2", p, draft);
    run_out two = run_v(NULL, model, args);
    if (one.rc || two.rc) print_error("%s%s", one.err, two.err);
    assert_int_equal(one.rc, 0);
    assert_int_equal(two.rc, 0);
    assert_true(strlen(one.out) > 20);
    assert_string_equal(one.out, two.out);
    print_message("resample: %llu guesses, %llu kept\n", one.guesses, one.kept);
    assert_true(one.kept > 0);
    run_out_free(&one);
    run_out_free(&two);
    snprintf(args, sizeof args, "%s --temp 0", p);
    run_out plain = run_v(NULL, model, args);
    snprintf(args, sizeof args, "%s --temp 0 --draft '%s' --spec-accept resample", p, draft);
    run_out greedy = run_v(NULL, model, args);
    assert_int_equal(plain.rc, 0);
    assert_int_equal(greedy.rc, 0);
    assert_string_equal(plain.out, greedy.out);
    assert_true(greedy.kept > 0);
    run_out_free(&plain);
    run_out_free(&greedy);
}

/* `cellm bench --draft/--lookup`, tiny (8 prose prompts of 4 tokens, one
 * round): it exits 0 only when each speculative completion equals the
 * plain one, and reports guesses; a bad --spec-accept refused. */
static void test_bench_spec(void **st) {
    (void)st;
    char model[1024], draft[1024], cmd[4096], *out;
    test_model_path("smollm2-135m", model, sizeof model);
    draft_path("smollm2-135m", draft, sizeof draft);
    double t0 = now_s();
    snprintf(cmd, sizeof cmd,
             "'%s' bench '%s' --draft '%s' --lookup 2 --spec-task prose -s 1 -r 1 -n 4 -t 2 "
             "--json 2>&1",
             test_cellm_bin(), model, draft);
    int rc = test_run_cmd(cmd, &out);
    if (rc) print_error("%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "\"identical\": true"));
    assert_null(strstr(out, "\"identical\": false"));
    const char *d = strstr(out, "\"draft_tokens\": ");
    assert_non_null(d);
    assert_true(strtoull(d + strlen("\"draft_tokens\": "), NULL, 10) > 0);
    print_message("bench --draft --lookup 2: %.1f s\n", now_s() - t0);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' bench '%s' --draft '%s' --spec-accept sometimes 2>&1",
             test_cellm_bin(), model, draft);
    assert_int_equal(test_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out, "--spec-accept"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_resample),         cmocka_unit_test(test_bench_spec),
        cmocka_unit_test(test_asan_run_spec_errors), cmocka_unit_test(test_asan_run_spec_smollm2),
        cmocka_unit_test(test_run_spec_gemma3),      cmocka_unit_test(test_run_spec_chat),
    };
    /* test.sh's TSan and aarch64 runs set CELLM_TEST_FILTER=test_tsan_*:
     * none of these, which run the models through the command many times. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
