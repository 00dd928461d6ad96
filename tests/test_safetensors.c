/*
 * test_safetensors.c — the safetensors reader of `cellm convert` on valid
 * files and on each kind of malformed one: every bad file is refused with a
 * message naming what is wrong, never a crash (the fuzzer, fuzz_safetensors,
 * covers the rest). Also `cellm convert` on a folder with a bad shard.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "safetensors.h"
#include "test_common.h"

/* A file: the 8-byte length of `json` (or `hlen` when nonzero), the JSON,
 * then `n_data` bytes counting up from 0. */
static uint8_t *make(const char *json, uint64_t hlen, size_t n_data, size_t *size) {
    size_t jl = strlen(json);
    *size = 8 + jl + n_data;
    uint8_t *b = malloc(*size);
    assert_non_null(b);
    uint64_t l = hlen ? hlen : jl;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(l >> (8 * i));
    memcpy(b + 8, json, jl);
    for (size_t i = 0; i < n_data; i++) b[8 + jl + i] = (uint8_t)i;
    return b;
}

/* Expects `json` + data to be refused with `code` and a message holding `want`. */
static void refused(const char *json, uint64_t hlen, size_t n_data, cellm_status code,
                    const char *want) {
    size_t size;
    uint8_t *b = make(json, hlen, n_data, &size);
    safetensors_file *f = (safetensors_file *)1;
    cellm_error e = {0};
    cellm_status st = safetensors_open_memory(b, size, &f, &e);
    if (st != code || !strstr(e.msg, want))
        print_error("got %d '%s', want %d '%s'\n", st, e.msg, code, want);
    assert_int_equal(st, code);
    assert_null(f);
    assert_non_null(strstr(e.msg, want));
    free(b);
}

static void test_valid(void **state) {
    (void)state;
    const char *j = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                    "\"e\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[20,20]}}";
    size_t size;
    uint8_t *b = make(j, 0, 20, &size);
    float one = 1.0f, m2 = -2.5f;
    memcpy(b + size - 20, &one, 4);
    memcpy(b + size - 16, &m2, 4);
    b[size - 4] = 0x80, b[size - 3] = 0x3f; /* bf16 1.0 */
    b[size - 2] = 0x20, b[size - 1] = 0xc0; /* bf16 -2.5 */
    safetensors_file *f;
    cellm_error e;
    assert_int_equal(safetensors_open_memory(b, size, &f, &e), CELLM_OK);
    assert_int_equal(f->n, 3);
    const safetensors_tensor *a = safetensors_find(f, "a"), *bt = safetensors_find(f, "b");
    assert_non_null(a);
    assert_non_null(bt);
    assert_null(safetensors_find(f, "__metadata__"));
    assert_null(safetensors_find(f, "c"));
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->n_elems, 4);
    float v[4];
    assert_true(safetensors_to_float(a, 0, 2, v));
    assert_true(v[0] == 1.0f && v[1] == -2.5f);
    assert_true(safetensors_to_float(bt, 0, 2, v));
    assert_true(v[0] == 1.0f && v[1] == -2.5f);
    assert_false(safetensors_to_float(bt, 1, 2, v)); /* past the end */
    assert_int_equal(safetensors_find(f, "e")->n_elems, 0);
    safetensors_close(f);
    free(b);
}

static void test_bad_header_length(void **state) {
    (void)state;
    const char *j = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    refused(j, 1ull << 40, 4, CELLM_ERR_FORMAT, "header length");
    refused(j, strlen(j) + 5, 4, CELLM_ERR_FORMAT, "header length"); /* past the end */
    refused(j, UINT64_MAX, 4, CELLM_ERR_FORMAT, "header length");
    refused("", 0, 0, CELLM_ERR_FORMAT, "header length"); /* an empty header */
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    safetensors_file *f;
    cellm_error e;
    assert_int_equal(safetensors_open_memory(tiny, sizeof tiny, &f, &e), CELLM_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "file of 5 bytes"));
    refused(j, strlen(j) - 3, 4, CELLM_ERR_FORMAT, "not a JSON object"); /* cut JSON */
    refused("[1,2]", 0, 0, CELLM_ERR_FORMAT, "not a JSON object");
}

static void test_offsets_out_of_range(void **state) {
    (void)state;
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 8,
            CELLM_ERR_FORMAT, "outside");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 0, 8,
            CELLM_ERR_FORMAT, "outside");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 0, 8,
            CELLM_ERR_FORMAT, "data_offsets");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 0, 8,
            CELLM_ERR_FORMAT, "data_offsets");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 0, 8,
            CELLM_ERR_FORMAT, "data_offsets");
}

static void test_overlap(void **state) {
    (void)state;
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
            0, 12, CELLM_ERR_FORMAT, "overlap");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
            0, 8, CELLM_ERR_FORMAT, "overlap");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
            0, 8, CELLM_ERR_FORMAT, "twice");
}

static void test_dtype_shape_mismatch(void **state) {
    (void)state;
    refused("{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8,
            CELLM_ERR_FORMAT, "bytes of data for 3 F16");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 0, 16,
            CELLM_ERR_FORMAT, "bytes of data for 6 F32");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
            "\"data_offsets\":[0,16]}}",
            0, 16, CELLM_ERR_FORMAT, "overflows");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 0, 4,
            CELLM_ERR_FORMAT, "shape[0]");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 0,
            4, CELLM_ERR_FORMAT, "dimensions");
    refused("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1,
            CELLM_ERR_UNSUPPORTED, "dtype 'Q4'");
    refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1, CELLM_ERR_FORMAT,
            "needs dtype");
    refused("{\"a\":7}", 0, 0, CELLM_ERR_FORMAT, "not an object");
}

/* `cellm convert` on a folder whose shard is malformed: a clear error, no
 * output file. */
static void test_convert_bad_shard(void **state) {
    (void)state;
    char dir[] = "/tmp/cellm-st-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[1024], cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "cp '%s/tests/data/arch/llama/config.json' '%s/'", CELLM_SOURCE_DIR,
             dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t size;
    uint8_t *b = make("{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64],"
                      "\"data_offsets\":[0,512]}}",
                      0, 16, &size);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, size, f), size);
    fclose(f);
    free(b);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s/out.gguf' 2>&1", test_cellm_bin(), dir, dir);
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "model.safetensors"));
    assert_non_null(strstr(out, "outside"));
    free(out);
    snprintf(path, sizeof path, "%s/out.gguf", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(cmd, sizeof cmd, "rm -r '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_bad_header_length),
        cmocka_unit_test(test_offsets_out_of_range),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_dtype_shape_mismatch),
        cmocka_unit_test(test_convert_bad_shard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
