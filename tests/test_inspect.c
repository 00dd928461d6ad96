/*
 * test_inspect.c — `cellm inspect` on both real models against the values
 * the `gguf` Python package reads from the same files (fixtures made by
 * scripts/gen_inspect_fixtures.py), through the real command and its --json
 * output; and its errors on bad input.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <math.h>

#include "model/kv_cache.h"
#include "test_common.h"

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        print_error("cannot read %s\n", path);
        fail();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Every key of `want` must be in `got` with an equal value. */
static void expect_subset(const cJSON *want, const cJSON *got, const char *where) {
    const cJSON *w;
    cJSON_ArrayForEach(w, want) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(got, w->string);
        if (!g) {
            print_error("%s.%s missing from cellm's output\n", where, w->string);
            fail();
        }
        char path[256];
        snprintf(path, sizeof path, "%s.%s", where, w->string);
        if (cJSON_IsObject(w)) {
            expect_subset(w, g, path);
        } else if (cJSON_IsNumber(w)) {
            double a = w->valuedouble, b = cJSON_IsNumber(g) ? g->valuedouble : NAN;
            if (!(fabs(a - b) <= 1e-9 * fmax(1.0, fabs(a)))) {
                print_error("%s: want %.17g, cellm says %.17g\n", path, a, b);
                fail();
            }
        } else if (cJSON_IsString(w)) {
            if (!cJSON_IsString(g) || strcmp(w->valuestring, g->valuestring)) {
                print_error("%s: want '%s', cellm says '%s'\n", path, w->valuestring,
                            cJSON_IsString(g) ? g->valuestring : "(not a string)");
                fail();
            }
        } else if (cJSON_IsBool(w)) {
            if (!cJSON_IsBool(g) || cJSON_IsTrue(w) != cJSON_IsTrue(g)) {
                print_error("%s: booleans differ\n", path);
                fail();
            }
        }
    }
}

static void check_model(const char *name) {
    char mpath[1024], fixture[1024], cmd[4096];
    test_model_path(name, mpath, sizeof mpath);
    snprintf(fixture, sizeof fixture, "%s/tests/data/inspect/%s.json", CELLM_SOURCE_DIR, name);
    char *text = read_file(fixture);
    cJSON *want = cJSON_Parse(text);
    assert_non_null(want);
    cJSON *mem = cJSON_DetachItemFromObject(want, "memory");
    const cJSON *per_kv;
    int n_kv = 0;
    cJSON_ArrayForEach(per_kv, mem) {
        snprintf(cmd, sizeof cmd,
                 "'%s' inspect '%s' --json --ctx 2048 --sessions 4 --kv-type %s --mem-budget 512M",
                 test_cellm_bin(), mpath, per_kv->string);
        char *out;
        assert_int_equal(test_run_cmd(cmd, &out), 0);
        cJSON *got = cJSON_Parse(out);
        if (!got) {
            print_error("not JSON: %s\n", out);
            fail();
        }
        expect_subset(want, got, name);
        const cJSON *gm = cJSON_GetObjectItemCaseSensitive(got, "memory");
        assert_non_null(gm);
        expect_subset(per_kv, gm, "memory");
        cJSON_Delete(got);
        free(out);
        n_kv++;
    }
    assert_int_equal(n_kv, 3);
    cJSON_Delete(mem);
    cJSON_Delete(want);
    free(text);
}

static void test_smollm2(void **state) {
    (void)state;
    check_model("smollm2-135m");
}

static void test_gemma3(void **state) {
    (void)state;
    check_model("gemma3-270m");
}

/* The text form says whether the model fits a budget. */
static void test_budget_text(void **state) {
    (void)state;
    char mpath[1024], cmd[4096];
    test_model_path("gemma3-270m", mpath, sizeof mpath);
    char *out;
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --mem-budget 100M", test_cellm_bin(), mpath);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "does NOT fit"));
    assert_non_null(strstr(out, "architecture  gemma3"));
    assert_non_null(strstr(out, "SentencePiece"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --mem-budget 512M", test_cellm_bin(), mpath);
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, ": fits"));
    free(out);
}

/* inspect's KV figures are what the paged cache really takes, for each
 * KV type. */
static void test_kv_matches_cache(void **state) {
    (void)state;
    static const char *const names[] = {"smollm2-135m", "gemma3-270m"};
    for (int i = 0; i < 2; i++) {
        char model_path[1024], fixture[1024];
        test_model_path(names[i], model_path, sizeof model_path);
        snprintf(fixture, sizeof fixture, "%s/tests/data/inspect/%s.json", CELLM_SOURCE_DIR,
                 names[i]);
        char *text = read_file(fixture);
        cJSON *j = cJSON_Parse(text);
        model *m;
        cellm_error e;
        assert_int_equal(model_load(model_path, &m, &e), CELLM_OK);
        /* inspect's estimate is the cache's own size, for each KV type. */
        static const struct {
            const char *name;
            cellm_kv_type type;
        } types[] = {{"f16", CELLM_KV_F16}, {"q8_0", CELLM_KV_Q8_0}, {"q4_0", CELLM_KV_Q4_0}};
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            const cJSON *kv = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "memory"),
                                                 types[t].name),
                "kv_bytes");
            assert_non_null(kv);
            assert_true(kv->valuedouble == (double)kv_cache_bytes(m, types[t].type, 2048, 4, 1));
        }
        /* The rotated types (K and V rows of their own sizes, k5v4h's
         * differing; the window types' f16 copies per session), through
         * the command. */
        static const struct {
            const char *name;
            cellm_kv_type type;
        } rot[] = {{"q4_0h", CELLM_KV_Q4_0H},    {"k5v4h", CELLM_KV_K5V4H},
                   {"q4_0hw", CELLM_KV_Q4_0HW},  {"k5v4hw", CELLM_KV_K5V4HW},
                   {"q3_0hw", CELLM_KV_Q3_0HW},  {"k4v3hw", CELLM_KV_K4V3HW},
                   {"k4cv4hw", CELLM_KV_K4CV4HW}};
        for (size_t t = 0; t < sizeof rot / sizeof rot[0]; t++) {
            char cmd[4096], *out;
            snprintf(cmd, sizeof cmd,
                     "'%s' inspect '%s' --json --ctx 2048 --sessions 4 --kv-type %s",
                     test_cellm_bin(), model_path, rot[t].name);
            assert_int_equal(test_run_cmd(cmd, &out), 0);
            cJSON *got = cJSON_Parse(out);
            assert_non_null(got);
            const cJSON *gm = cJSON_GetObjectItemCaseSensitive(got, "memory");
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(gm, "kv_type")->valuestring,
                                rot[t].name);
            assert_true(cJSON_GetObjectItemCaseSensitive(gm, "kv_bytes_per_token")->valuedouble ==
                        (double)kv_cache_token_bytes(m, rot[t].type));
            assert_true(cJSON_GetObjectItemCaseSensitive(gm, "kv_bytes")->valuedouble ==
                        (double)kv_cache_bytes(m, rot[t].type, 2048, 4, 1));
            print_message("%s %s: %zu bytes per token\n", names[i], rot[t].name,
                          kv_cache_token_bytes(m, rot[t].type));
            cJSON_Delete(got);
            free(out);
        }
        model_free(m);
        cJSON_Delete(j);
        free(text);
    }
}

static void test_errors(void **state) {
    (void)state;
    char cmd[4096], *out;
    /* Not a GGUF file: exit 1 and one line naming the problem. */
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s/CMakeLists.txt' 2>&1", test_cellm_bin(),
             CELLM_SOURCE_DIR);
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "cellm: "));
    assert_non_null(strstr(out, "not a GGUF file: magic at byte offset 0"));
    assert_null(strchr(strchr(out, '\n') + 1, '\n')); /* one line */
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect no-such-model 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "no-such-model"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect x --kv-type q9 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out, "--kv-type"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' inspect x --ctx -5 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 2);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2),     cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_budget_text), cmocka_unit_test(test_kv_matches_cache),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
