/*
 * test_commands.c — the generating commands end to end, through the real
 * `cellm` binary: `cellm perplexity` on the start of Genesis (KJV, public
 * domain; tests/data/genesis-kjv-start.txt) against llama.cpp's perplexity
 * of the same tokens (tests/data/forward fixtures), and `cellm run` giving a
 * sensible one-shot answer, chatting over several turns from a pipe,
 * stopping at a reverse prompt without printing it, giving the same sampled
 * text for a seed with 1 or 2 threads, sampling a chat with its defaults
 * (the same text each run, the engine's for those settings) while --temp 0
 * and --raw stay greedy, taking a model file's recommended sampling under
 * the flags, and refusing bad arguments with a message that names the
 * flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <math.h>

#include "cellm.h"
#include "format/gguf.h"
#include "gguf_copy.h"
#include "test_common.h"

/* llama.cpp's perplexity from the forward fixture of `name`. */
static double fixture_ppl(const char *name) {
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s/tests/data/forward/%s.txt", CELLM_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double ppl = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "ppl ", 4)) {
            int a, b, c;
            assert_int_equal(sscanf(line, "ppl %d %d %d %lf", &a, &b, &c, &ppl), 4);
        }
    fclose(f);
    return ppl;
}

static void check_perplexity(const char *name) {
    char model[1024], cmd[4096], *out;
    test_model_path(name, model, sizeof model);
    snprintf(cmd, sizeof cmd,
             "'%s' perplexity '%s' '%s/tests/data/genesis-kjv-start.txt' -c 512 "
             "--chunks 4 2>/dev/null",
             test_cellm_bin(), model, CELLM_SOURCE_DIR);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    const char *fin = strstr(out, "Final estimate: PPL = ");
    assert_non_null(fin);
    assert_non_null(strstr(out, "[1]"));
    assert_non_null(strstr(out, "[4]"));
    double ppl = strtod(fin + strlen("Final estimate: PPL = "), NULL), want = fixture_ppl(name);
    print_message("%s: cellm perplexity %.4f, llama.cpp %.4f\n", name, ppl, want);
    assert_true(fabs(ppl / want - 1) <= 0.02); /* the bound of test_forward */
    free(out);
}

static void test_perplexity_smollm2(void **st) {
    (void)st;
    check_perplexity("smollm2-135m");
}

static void test_perplexity_gemma3(void **st) {
    (void)st;
    check_perplexity("gemma3-270m");
}

static void test_asan_run_answers(void **st) {
    (void)st;
    char model[1024], cmd[4096], *out;
    test_model_path("smollm2-135m", model, sizeof model);
    /* Greedy: the model's most likely answer (a 135M model's sampled
     * answers wander). */
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p 'What is 2+2?' -n 32 --temp 0 2>/dev/null",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "4"));
    free(out);
    /* Two turns from a pipe: the second refers to the first. */
    snprintf(cmd, sizeof cmd,
             "printf 'What is 2+2?\\nAnd what is that times 3?\\n' | '%s' run '%s' -n 32 "
             "--temp 0 2>/dev/null",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "4"));
    assert_non_null(strstr(out, "6") ? strstr(out, "6") : strstr(out, "12"));
    free(out);
}

static void test_asan_run_flags(void **st) {
    (void)st;
    char model[1024], cmd[4096], *out, *again;
    test_model_path("smollm2-135m", model, sizeof model);
    /* Greedy counting; then the same stopped at "5." (spanning tokens or
     * not, it is never printed). */
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p 'Count from 1 to 10.' -n 48 --temp 0 2>/dev/null",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    const char *five = strstr(out, "5.");
    assert_non_null(five);
    size_t before = (size_t)(five - out);
    snprintf(cmd, sizeof cmd,
             "'%s' run '%s' -p 'Count from 1 to 10.' -n 48 --temp 0 -r 5. -r zzz 2>/dev/null",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &again), 0);
    assert_null(strstr(again, "5."));
    assert_int_equal(strlen(again), before + 1); /* the text before it and a newline */
    assert_memory_equal(again, out, before);
    free(out);
    free(again);
    /* Every sampling flag; the same seed gives the same text with 1 and 2
     * threads. */
    const char *flags = "--temp 0.9 --top-k 50 --top-p 0.95 --min-p 0.02 --typical 0.98 "
                        "--repeat-penalty 1.1 --repeat-last-n 32 --presence-penalty 0.1 "
                        "--frequency-penalty 0.1 --ngram-guard 3 --logit-bias 28+0.5 -s 77";
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p 'Tell me a story.' -n 32 %s -t 1 2>/dev/null",
             test_cellm_bin(), model, flags);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p 'Tell me a story.' -n 32 %s -t 2 2>/dev/null",
             test_cellm_bin(), model, flags);
    assert_int_equal(test_run_cmd(cmd, &again), 0);
    assert_string_equal(out, again);
    assert_true(strlen(out) > 20);
    free(out);
    free(again);
}

/* The text the engine API gives for `text` (a user message when `chat`,
 * else a prompt continued as is) with sampling `s`, at most n tokens: what
 * `cellm run` must print for the same settings. */
typedef struct text_sink {
    char buf[8192];
    size_t n;
} text_sink;

static void on_piece(const char *piece, size_t len, void *user) {
    text_sink *t = user;
    if (t->n + len < sizeof t->buf) {
        memcpy(t->buf + t->n, piece, len);
        t->n += len;
        t->buf[t->n] = '\0';
    }
}

static void engine_text(const char *model_path, const char *text, bool chat,
                        const cellm_sampling *s, int32_t n, text_sink *out) {
    cellm_model *m = NULL;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_model_load(model_path, NULL, &m), CELLM_OK);
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    assert_int_equal(cellm_engine_create(m, &ep, &e), CELLM_OK);
    cellm_request_params p = cellm_request_default_params();
    const cellm_chat_message msg = {"user", text};
    if (chat) {
        p.messages = &msg;
        p.n_messages = 1;
    } else {
        p.prompt = text;
    }
    if (s) p.sampling = *s;
    p.max_tokens = n;
    memset(out, 0, sizeof *out);
    p.on_piece = on_piece;
    p.user = out;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    assert_int_equal(cellm_wait(r, NULL), CELLM_OK);
    cellm_request_free(r);
    cellm_engine_free(e);
    cellm_model_free(m);
    out->buf[out->n++] = '\n'; /* cellm run ends the answer with one */
    out->buf[out->n] = '\0';
}

/* The chat defaults of `cellm run`: it samples at temperature 0.8, top-k
 * 40, top-p 0.95, min-p 0.05 from a fixed seed (the same text twice, the
 * engine's text for those settings); --temp 0 is the engine's greedy
 * text; --raw stays greedy; a model file's recommended sampling replaces
 * the built-in values and flags replace both. */
/* The keys of a model file that recommends temperature 0.5 and top-k 10. */
static void recommend_sampling(gguf_writer *w, const void *arg) {
    (void)arg;
    cellm_error e;
    assert_int_equal(gguf_writer_set_f32(w, "general.sampling.temp", 0.5f, &e), CELLM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "general.sampling.top_k", 10, &e), CELLM_OK);
}

static void test_run_defaults(void **st) {
    (void)st;
    char model[1024], cmd[4096], *out, *again;
    text_sink want;
    test_model_path("smollm2-135m", model, sizeof model);
    const char *q = "What is the capital of France?";
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p '%s' -n 48 2>/dev/null", test_cellm_bin(), model,
             q);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_int_equal(test_run_cmd(cmd, &again), 0);
    assert_string_equal(out, again);
    cellm_sampling chat = cellm_request_default_params().sampling;
    chat.temperature = 0.8f;
    chat.top_k = 40;
    chat.top_p = 0.95f;
    chat.min_p = 0.05f;
    engine_text(model, q, true, &chat, 48, &want);
    assert_string_equal(out, want.buf);
    free(out);
    free(again);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p '%s' -n 4 -v 2>&1 >/dev/null", test_cellm_bin(),
             model, q);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "sampling: temp 0.8, top-k 40, top-p 0.95, min-p 0.05"));
    free(out);
    /* Greedy: --temp 0 in a chat, and --raw without flags. */
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p '%s' -n 32 --temp 0 2>/dev/null", test_cellm_bin(),
             model, q);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    engine_text(model, q, true, NULL, 32, &want);
    assert_string_equal(out, want.buf);
    free(out);
    const char *prompt = "The three primary colors are";
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --raw -p '%s' -n 24 2>/dev/null", test_cellm_bin(),
             model, prompt);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    engine_text(model, prompt, false, NULL, 24, &want);
    assert_string_equal(out, want.buf);
    free(out);
    /* A copy of the model that recommends temperature 0.5 and top-k 10;
     * --top-k 5 wins over the file. */
    char copy[1200];
    snprintf(copy, sizeof copy, "%s/test_commands-sampling.gguf", CELLM_BINARY_DIR);
    test_gguf_copy(model, copy, recommend_sampling, NULL);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' -p '%s' -n 32 --top-k 5 -v 2>&1", test_cellm_bin(),
             copy, q);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "sampling: temp 0.5, top-k 5, top-p 0.95, min-p 0.05"));
    assert_non_null(strstr(out, "from the model file: temp; from flags: top-k"));
    chat.temperature = 0.5f;
    chat.top_k = 5;
    engine_text(copy, q, true, &chat, 32, &want);
    assert_non_null(strstr(out, want.buf));
    free(out);
    /* --raw ignores the recommendation. */
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --raw -p '%s' -n 8 -v 2>&1 >/dev/null",
             test_cellm_bin(), copy, prompt);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "sampling: greedy"));
    free(out);
    unlink(copy);
}

static void test_asan_run_errors(void **st) {
    (void)st;
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "'%s' run --temp abc 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out, "--temp"));
    free(out);
    static const char *const bad[][2] = {
        {"--top-p 1.5", "--top-p"},
        {"--typical x", "--typical"},
        {"--repeat-penalty 0", "--repeat-penalty"},
        {"--logit-bias 12", "--logit-bias"},
        {"-s abc", "-s"},
        {"--ngram-guard 99", "--ngram-guard"},
        {"-r ''", "-r"},
        {"--repeat-last-n -2", "--repeat-last-n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "'%s' run %s 2>&1", test_cellm_bin(), bad[i][0]);
        assert_int_equal(test_run_cmd(cmd, &out), 2);
        assert_non_null(strstr(out, bad[i][1]));
        free(out);
    }
    snprintf(cmd, sizeof cmd, "'%s' run smollm2-135m -p hi --chat-template '{{ x | nope }}' 2>&1",
             test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "nope"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' run no-such-model -p hi 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "no-such-model"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' perplexity smollm2-135m /nonexistent 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "/nonexistent"));
    free(out);
}

/* --kv-type on every generating command: a bad name is refused naming the
 * flag; perplexity with q8_0 KV says its bytes per token and stays within
 * 0.5% of f16 KV's; run answers with the rotated 4-bit type. */
static void test_asan_kv_type_refused(void **st) {
    (void)st;
    char cmd[4096], *out;
    static const char *const cmds[] = {"run smollm2-135m -p hi", "perplexity smollm2-135m x",
                                       "bench smollm2-135m", "serve smollm2-135m"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --kv-type q9 2>&1", test_cellm_bin(), cmds[i]);
        assert_int_equal(test_run_cmd(cmd, &out), 2);
        assert_non_null(strstr(out, "kv-type"));
        free(out);
    }
}

static void test_kv_type_flag(void **st) {
    (void)st;
    char cmd[4096], model[1024], *out;
    test_model_path("smollm2-135m", model, sizeof model);
    double ppl[2];
    static const char *const types[] = {"f16", "q8_0"};
    static const char *const bytes[] = {"(23040 bytes per token)", "(12240 bytes per token)"};
    for (int t = 0; t < 2; t++) {
        snprintf(cmd, sizeof cmd,
                 "'%s' perplexity '%s' '%s/tests/data/genesis-kjv-start.txt' -c 512 --chunks 2 "
                 "--kv-type %s 2>&1",
                 test_cellm_bin(), model, CELLM_SOURCE_DIR, types[t]);
        assert_int_equal(test_run_cmd(cmd, &out), 0);
        assert_non_null(strstr(out, bytes[t]));
        const char *fin = strstr(out, "Final estimate: PPL = ");
        assert_non_null(fin);
        ppl[t] = strtod(fin + strlen("Final estimate: PPL = "), NULL);
        free(out);
    }
    print_message("perplexity with f16 KV %.4f, q8_0 KV %.4f\n", ppl[0], ppl[1]);
    assert_true(fabs(ppl[1] / ppl[0] - 1) <= 0.005);
    snprintf(cmd, sizeof cmd,
             "'%s' run '%s' -p 'What is the capital of France?' -n 16 --kv-type q4_0h 2>/dev/null",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_true(strlen(out) > 5);
    free(out);
}

/* The largest data or unified cache of cpu0 at the highest level sysfs
 * lists, in MiB; 0 when sysfs has none. Read here, apart from the tool's
 * own reading, to check the probe's buffer against. */
static double sysfs_llc_mib(void) {
    double mib = 0;
    int top = 0;
    for (int i = 0; i < 32; i++) {
        char path[96], line[64] = "";
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        const bool has_level = fscanf(f, "%d", &level) == 1;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if ((f = fopen(path, "r"))) {
            if (!fgets(line, sizeof line, f)) line[0] = '\0';
            fclose(f);
        }
        if (!has_level || !strncmp(line, "Instruction", 11)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        double size = 0;
        char unit = 0;
        if (!(f = fopen(path, "r"))) continue;
        const int got = fscanf(f, "%lf%c", &size, &unit);
        fclose(f);
        if (got < 1) continue;
        size *= unit == 'K' ? 1.0 / 1024 : unit == 'M' ? 1 : unit == 'G' ? 1024 : 1.0 / (1 << 20);
        if (level > top || (level == top && size > mib)) {
            top = level;
            mib = size;
        }
    }
    return mib;
}

/* Reads `"key": number` from JSON text; fails the test when it is absent. */
static double json_number(const char *json, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(json, pat);
    if (!p) print_error("no %s in the output\n", pat);
    assert_non_null(p);
    return strtod(p + strlen(pat), NULL);
}

/* `cellm bench --pp/--tg`: each test's samples (as many as -r), a median
 * within their range, the weight bytes a decode step reads (no more than
 * the file, more than 90% of it for SmolLM2), a bandwidth share for tg
 * only, which divides by the probe's median; the probe's median within its
 * range, as many passes as --bw-samples, a buffer of at least 256 MiB and
 * 8 times the last-level cache; the text output saying what the share
 * divides by; bad lists and counts refused naming the flag. Not the speed:
 * nothing here depends on how fast or busy the machine is. */
static void test_bench_speed(void **st) {
    (void)st;
    char cmd[4096], model[1024], *out;
    test_model_path("smollm2-135m", model, sizeof model);
    snprintf(cmd, sizeof cmd,
             "'%s' bench '%s' --pp 16,40 --tg 8 -r 3 -t 2 --bw-samples 5 --json 2>&1",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    static const char *const names[] = {"\"pp16\"", "\"pp40\"", "\"tg8\""};
    for (int i = 0; i < 3; i++) {
        const char *t = strstr(out, names[i]);
        assert_non_null(t);
        double med, lo, hi, x[3];
        const char *m = strstr(t, "\"median\": ");
        assert_non_null(m);
        assert_int_equal(sscanf(m, "\"median\": %lf, \"min\": %lf, \"max\": %lf", &med, &lo, &hi),
                         3);
        const char *sm = strstr(t, "\"samples\": [");
        assert_non_null(sm);
        assert_int_equal(sscanf(sm, "\"samples\": [%lf, %lf, %lf]", &x[0], &x[1], &x[2]), 3);
        assert_true(lo > 0 && lo <= med && med <= hi);
        for (int k = 0; k < 3; k++) assert_true(x[k] >= lo && x[k] <= hi);
        const char *end = strchr(t, '}');
        end = strchr(end + 1, '}'); /* past tokens_per_s's */
        const char *bw = strstr(t, "bandwidth_fraction");
        assert_int_equal(bw != NULL && bw < end, i == 2);
    }
    const double bw = json_number(out, "read_bandwidth_gbs"),
                 bw_lo = json_number(out, "read_bandwidth_min_gbs"),
                 bw_hi = json_number(out, "read_bandwidth_max_gbs"),
                 buffer_mib = json_number(out, "read_bandwidth_buffer_mib"),
                 llc_mib = json_number(out, "last_level_cache_mib"), sys_llc = sysfs_llc_mib();
    print_message("bench: read bandwidth %.2f (%.2f-%.2f) GB/s, buffer %.0f MiB, LLC %.1f MiB "
                  "(sysfs %.1f)\n",
                  bw, bw_lo, bw_hi, buffer_mib, llc_mib, sys_llc);
    assert_true(bw_lo > 0 && bw_lo <= bw && bw <= bw_hi);
    assert_int_equal((int)json_number(out, "read_bandwidth_samples"), 5);
    assert_true(buffer_mib >= 256 && buffer_mib >= 8 * llc_mib);
    if (sys_llc > 0) assert_true(fabs(llc_mib - sys_llc) < 0.05);
    const double tg_med = json_number(strstr(out, "\"tg8\""), "median"),
                 fraction = json_number(out, "bandwidth_fraction");
    unsigned long long wb;
    const char *w = strstr(out, "\"weight_bytes_per_token\": ");
    assert_non_null(w);
    assert_int_equal(sscanf(w, "\"weight_bytes_per_token\": %llu", &wb), 1);
    FILE *f = fopen(model, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const double size = (double)ftell(f);
    fclose(f);
    print_message("bench: %llu weight bytes per token, file %.0f bytes\n", wb, size);
    assert_true(wb <= size && wb > 0.9 * size);
    /* The share is of the median (both printed rounded). */
    assert_true(fabs((double)wb * tg_med / 1e9 / bw - fraction) <= 1e-4 + 2e-3 * fraction);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' bench '%s' --tg 4 -r 1 -t 2 --bw-samples 3 2>&1",
             test_cellm_bin(), model);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    const char *line = strstr(out, "read bandwidth (2 threads): median ");
    assert_non_null(line);
    double med, lo, hi;
    int passes;
    assert_int_equal(sscanf(line,
                            "read bandwidth (2 threads): median %lf GB/s, range %lf-%lf, of %d",
                            &med, &lo, &hi, &passes),
                     4);
    assert_true(lo <= med && med <= hi);
    assert_int_equal(passes, 3);
    assert_non_null(strstr(line, "% of bandwidth divides by the median"));
    free(out);
    static const char *const bad[][2] = {{"--pp 0", "'--pp'"},
                                         {"--tg 8,x", "'--tg'"},
                                         {"--pp 16 -r 0", "'-r'"},
                                         {"--tg", "'--tg'"},
                                         {"--tg 4 --bw-samples 0", "'--bw-samples'"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "'%s' bench '%s' %s 2>&1", test_cellm_bin(), model, bad[i][0]);
        assert_int_equal(test_run_cmd(cmd, &out), 2);
        assert_non_null(strstr(out, bad[i][1]));
        free(out);
    }
}

/* `cellm bench-kernels` on matrices smaller than its GFLOP/s matrix (it
 * read past them once): a row for each type and thread count, and the
 * probe's median within its range for each thread count, of as many passes
 * as asked, with what % of bw divides by said. Not the speed. */
static void test_asan_bench_kernels(void **st) {
    (void)st;
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd,
             "'%s' bench-kernels --threads 2 --reps 1 --mib 1 --cols 256 --bw-samples 3 2>&1",
             test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    const char *line = strstr(out, "read bandwidth, median (min-max) of 3 passes over ");
    assert_non_null(line);
    const char *n1 = strstr(line, "1 thread "), *n2 = strstr(line, "2 threads ");
    assert_non_null(n1);
    assert_non_null(n2);
    double med, lo, hi;
    assert_int_equal(sscanf(n1, "1 thread %lf (%lf-%lf) GB/s", &med, &lo, &hi), 3);
    assert_true(lo > 0 && lo <= med && med <= hi);
    assert_int_equal(sscanf(n2, "2 threads %lf (%lf-%lf) GB/s", &med, &lo, &hi), 3);
    assert_true(lo > 0 && lo <= med && med <= hi);
    static const char *const types[] = {"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        for (int n = 1; n <= 2; n++) {
            char row[32];
            snprintf(row, sizeof row, "\n%-6s %7d ", types[i], n);
            assert_non_null(strstr(out, row));
        }
    assert_non_null(strstr(out, "% of bw divides it by the median read bandwidth"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asan_run_errors),      cmocka_unit_test(test_asan_run_answers),
        cmocka_unit_test(test_asan_run_flags),       cmocka_unit_test(test_run_defaults),
        cmocka_unit_test(test_perplexity_smollm2),   cmocka_unit_test(test_perplexity_gemma3),
        cmocka_unit_test(test_asan_kv_type_refused), cmocka_unit_test(test_kv_type_flag),
        cmocka_unit_test(test_bench_speed),          cmocka_unit_test(test_asan_bench_kernels),
    };
    /* ASan runs test_asan_* (test.sh: CELLM_TEST_FILTER=test_?san_*); TSan
     * and the aarch64 build leave the program out. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
