/*
 * test_run_sampling.c — the sampling defaults of `cellm run`
 * (tools/rt.c): a chat gets the built-in chat defaults, a model file's
 * recommended sampling (llama.cpp's general.sampling.* keys) replaces
 * them field by field, flags win over both, and a recommendation of the
 * wrong type or out of range is ignored with a warning naming the key.
 * The model files are written by the project's GGUF writer in memory.
 */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "format/gguf.h"
#include "rt.h"

/* A model file with only metadata, built by set() calls and opened by
 * open_file(). */
typedef struct fake {
    gguf_writer *w;
    uint8_t *buf;
    gguf_file *f;
} fake;

static void fake_init(fake *k) {
    memset(k, 0, sizeof *k);
    k->w = gguf_writer_new();
    assert_non_null(k->w);
    cellm_error e;
    assert_int_equal(gguf_writer_set_str(k->w, "general.architecture", "llama", &e), CELLM_OK);
}

static void set(fake *k, const char *key, gguf_value v) {
    cellm_error e;
    assert_int_equal(gguf_writer_set(k->w, key, &v, &e), CELLM_OK);
}

static const gguf_file *open_file(fake *k) {
    cellm_error e;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(k->w, &k->buf, &size, &e), CELLM_OK);
    assert_int_equal(gguf_open_memory(k->buf, size, &k->f, &e), CELLM_OK);
    return k->f;
}

static void fake_free(fake *k) {
    gguf_close(k->f);
    free(k->buf);
    gguf_writer_free(k->w);
}

static gguf_value f32(float x) {
    return (gguf_value){.type = GGUF_TYPE_FLOAT32, .v.f32 = x};
}
static gguf_value f64(double x) {
    return (gguf_value){.type = GGUF_TYPE_FLOAT64, .v.f64 = x};
}
static gguf_value i32(int32_t x) {
    return (gguf_value){.type = GGUF_TYPE_INT32, .v.i32 = x};
}
static gguf_value u32(uint32_t x) {
    return (gguf_value){.type = GGUF_TYPE_UINT32, .v.u32 = x};
}

/* Parses a flag list ("--temp 0.3 --top-k 5") as cellm run does. */
static void parse_flags(rt_sampling *rs, const char *list) {
    char buf[256], *argv[32];
    int argc = 0;
    snprintf(buf, sizeof buf, "run %s", list);
    for (char *t = strtok(buf, " "); t && argc < 32; t = strtok(NULL, " ")) argv[argc++] = t;
    for (int i = 1; i < argc; i++) assert_int_equal(rt_sampling_flag(rs, argc, argv, &i, "run"), 1);
}

/* What rt_sampling_chat_defaults writes to its log, in a buffer. */
static char *chat_defaults_log(rt_sampling *rs, const gguf_file *f) {
    char *text = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&text, &len);
    assert_non_null(log);
    rt_sampling_chat_defaults(rs, f, log);
    fclose(log);
    return text;
}

static rt_sampling rs; /* the bias table is 8 KiB */

/* No flags, no recommendation: the built-in chat defaults, the library's
 * fixed seed, every penalty off; --raw (no chat defaults) stays greedy. */
static void test_builtin_defaults(void **st) {
    (void)st;
    rt_sampling_init(&rs);
    assert_true(rs.s.temperature <= 0); /* what --raw keeps */
    const uint64_t seed = rs.s.seed;
    char *log = chat_defaults_log(&rs, NULL);
    assert_string_equal(log, "");
    free(log);
    assert_true(rs.s.temperature == 0.8f);
    assert_int_equal(rs.s.top_k, 40);
    assert_true(rs.s.top_p == 0.95f);
    assert_true(rs.s.min_p == 0.05f);
    assert_true(rs.s.typical_p == 1.0f);
    assert_true(rs.s.repeat_penalty == 1.0f);
    assert_true(rs.s.presence_penalty == 0 && rs.s.frequency_penalty == 0);
    assert_int_equal(rs.s.ngram_guard, 0); /* off: docs/sampling.md says why */
    assert_int_equal(rs.s.seed, seed);
    assert_int_equal(rs.s.seed, cellm_request_default_params().sampling.seed);
    assert_int_equal(rs.given, 0);
    assert_int_equal(rs.from_model, 0);
    /* A file without recommendations changes nothing either. */
    fake k;
    fake_init(&k);
    rt_sampling_init(&rs);
    free(chat_defaults_log(&rs, open_file(&k)));
    assert_true(rs.s.temperature == 0.8f);
    assert_int_equal(rs.from_model, 0);
    fake_free(&k);
}

/* Every key a file may recommend replaces its built-in default, whatever
 * numeric type it was written with. */
static void test_model_recommendation(void **st) {
    (void)st;
    fake k;
    fake_init(&k);
    set(&k, "general.sampling.temp", f32(0.6f));
    set(&k, "general.sampling.top_k", i32(20));
    set(&k, "general.sampling.top_p", f64(0.9));
    set(&k, "general.sampling.min_p", f32(0));
    set(&k, "general.sampling.penalty_last_n", i32(-1));
    set(&k, "general.sampling.penalty_repeat", f32(1.05f));
    set(&k, "general.sampling.mirostat", u32(2)); /* no such sampler here: not read */
    rt_sampling_init(&rs);
    char *log = chat_defaults_log(&rs, open_file(&k));
    assert_string_equal(log, "");
    free(log);
    assert_true(rs.s.temperature == 0.6f);
    assert_int_equal(rs.s.top_k, 20);
    assert_true(rs.s.top_p == 0.9f);
    assert_true(rs.s.min_p == 0); /* a recommended 0 is a value, not "absent" */
    assert_int_equal(rs.s.repeat_last_n, -1);
    assert_true(rs.s.repeat_penalty == 1.05f);
    assert_int_equal(rs.from_model, 1u << RT_S_TEMP | 1u << RT_S_TOP_K | 1u << RT_S_TOP_P |
                                        1u << RT_S_MIN_P | 1u << RT_S_REPEAT_LAST_N |
                                        1u << RT_S_REPEAT_PENALTY);
    /* -v names where each came from. */
    char *line = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&line, &len);
    rt_sampling_print(&rs, out);
    fclose(out);
    assert_non_null(strstr(line, "temp 0.6, top-k 20, top-p 0.9, min-p 0"));
    assert_non_null(strstr(line, "repeat-penalty 1.05"));
    assert_non_null(
        strstr(line, "from the model file: temp top-k top-p min-p repeat-penalty repeat-last-n"));
    free(line);
    fake_free(&k);
    /* An integer temperature and a whole float top-k are numbers too. */
    fake_init(&k);
    set(&k, "general.sampling.temp", u32(1));
    set(&k, "general.sampling.top_k", f32(30));
    rt_sampling_init(&rs);
    free(chat_defaults_log(&rs, open_file(&k)));
    assert_true(rs.s.temperature == 1.0f);
    assert_int_equal(rs.s.top_k, 30);
    fake_free(&k);
}

/* Flags win over the file, which wins over the built-ins, field by
 * field; --temp 0 is greedy whatever the file says. */
static void test_flags_win(void **st) {
    (void)st;
    fake k;
    fake_init(&k);
    set(&k, "general.sampling.temp", f32(0.6f));
    set(&k, "general.sampling.top_k", i32(20));
    set(&k, "general.sampling.penalty_repeat", f32(1.3f));
    const gguf_file *f = open_file(&k);
    rt_sampling_init(&rs);
    parse_flags(&rs, "--temp 0.3 --repeat-penalty 1.1 -s 7");
    free(chat_defaults_log(&rs, f));
    assert_true(rs.s.temperature == 0.3f);    /* flag */
    assert_int_equal(rs.s.top_k, 20);         /* file */
    assert_true(rs.s.top_p == 0.95f);         /* built-in */
    assert_true(rs.s.repeat_penalty == 1.1f); /* flag */
    assert_int_equal(rs.s.seed, 7);
    assert_int_equal(rs.given, 1u << RT_S_TEMP | 1u << RT_S_REPEAT_PENALTY | 1u << RT_S_SEED);
    assert_int_equal(rs.from_model, 1u << RT_S_TOP_K);
    rt_sampling_init(&rs);
    parse_flags(&rs, "--temp 0");
    free(chat_defaults_log(&rs, f));
    assert_true(rs.s.temperature == 0);
    sampler_params p = rt_sampler_params(&rs, 4096);
    assert_true(p.temperature == 0); /* the sampler's greedy path */
    char *line = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&line, &len);
    rt_sampling_print(&rs, out);
    fclose(out);
    assert_non_null(strstr(line, "sampling: greedy"));
    assert_non_null(strstr(line, "from flags: temp"));
    free(line);
    fake_free(&k);
}

/* A recommendation the sampler cannot take is ignored, saying which key
 * and why; the other keys still apply. */
static void test_bad_recommendation(void **st) {
    (void)st;
    static const struct {
        const char *key;
        gguf_value v;
        const char *says;
    } bad[] = {
        {"general.sampling.temp", {.type = GGUF_TYPE_FLOAT32, .v.f32 = -1}, "--temp takes a"},
        {"general.sampling.top_k", {.type = GGUF_TYPE_INT32, .v.i32 = -3}, "whole number"},
        {"general.sampling.top_p", {.type = GGUF_TYPE_FLOAT64, .v.f64 = 1.5}, "= 1.5"},
        {"general.sampling.min_p", {.type = GGUF_TYPE_FLOAT32, .v.f32 = NAN}, "--min-p"},
        {"general.sampling.penalty_last_n", {.type = GGUF_TYPE_FLOAT32, .v.f32 = 2.5f}, "whole"},
        {"general.sampling.penalty_repeat", {.type = GGUF_TYPE_FLOAT32, .v.f32 = 0}, "exclusive"},
        {"general.sampling.top_k", {.type = GGUF_TYPE_BOOL, .v.b = true}, "a bool, not a number"},
        {"general.sampling.temp", {.type = GGUF_TYPE_UINT64, .v.u64 = UINT64_MAX}, "--temp"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fake k;
        fake_init(&k);
        set(&k, bad[i].key, bad[i].v);
        /* A good key beside it. */
        bool bad_min_p = !strcmp(bad[i].key, "general.sampling.min_p");
        if (bad_min_p)
            set(&k, "general.sampling.top_p", f32(0.5f));
        else
            set(&k, "general.sampling.min_p", f32(0.1f));
        rt_sampling_init(&rs);
        char *log = chat_defaults_log(&rs, open_file(&k));
        assert_non_null(strstr(log, bad[i].key));
        assert_non_null(strstr(log, bad[i].says));
        assert_non_null(strstr(log, "ignoring"));
        free(log);
        /* The built-in value stands; the good key applied. */
        assert_true(rs.s.temperature == 0.8f);
        assert_int_equal(rs.s.top_k, 40);
        assert_int_equal(rs.s.repeat_last_n, 64);
        assert_true(rs.s.repeat_penalty == 1.0f);
        if (bad_min_p) {
            assert_true(rs.s.min_p == 0.05f);
            assert_true(rs.s.top_p == 0.5f);
        } else {
            assert_true(rs.s.min_p == 0.1f);
            assert_true(rs.s.top_p == 0.95f);
        }
        fake_free(&k);
    }
    /* A string is not a number either, and a NULL log says nothing. */
    fake k;
    fake_init(&k);
    cellm_error e;
    assert_int_equal(gguf_writer_set_str(k.w, "general.sampling.temp", "0.7", &e), CELLM_OK);
    rt_sampling_init(&rs);
    char *log = chat_defaults_log(&rs, open_file(&k));
    assert_non_null(strstr(log, "general.sampling.temp: a string, not a number"));
    free(log);
    assert_true(rs.s.temperature == 0.8f);
    rt_sampling_init(&rs);
    rt_sampling_chat_defaults(&rs, k.f, NULL);
    assert_true(rs.s.temperature == 0.8f);
    fake_free(&k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_defaults),
        cmocka_unit_test(test_model_recommendation),
        cmocka_unit_test(test_flags_win),
        cmocka_unit_test(test_bad_recommendation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
