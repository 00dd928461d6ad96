/*
 * test_gguf.c — the GGUF container: an exact write/read round trip of every
 * metadata type, both real model files, and malformed files, each of which
 * must fail with its own specific message (and never crash: CI also runs
 * this under ASan/UBSan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "format/gguf.h"
#include "format/quant.h"
#include "test_common.h"

/* ------------------------------------------------------------ round trip */

static gguf_writer *make_full_writer(float *f32data, uint8_t *q4data, uint16_t *f16data) {
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    cellm_error e;
    gguf_value v;
#define SETV(key, field, T, val)                                                                   \
    do {                                                                                           \
        memset(&v, 0, sizeof v);                                                                   \
        v.type = T;                                                                                \
        v.v.field = val;                                                                           \
        assert_int_equal(gguf_writer_set(w, key, &v, &e), CELLM_OK);                               \
    } while (0)
    SETV("t.u8", u8, GGUF_TYPE_UINT8, 250);
    SETV("t.i8", i8, GGUF_TYPE_INT8, -100);
    SETV("t.u16", u16, GGUF_TYPE_UINT16, 65000);
    SETV("t.i16", i16, GGUF_TYPE_INT16, -32000);
    SETV("t.u32", u32, GGUF_TYPE_UINT32, 4000000000u);
    SETV("t.i32", i32, GGUF_TYPE_INT32, -2000000000);
    SETV("t.f32", f32, GGUF_TYPE_FLOAT32, 3.25f);
    SETV("t.bool", b, GGUF_TYPE_BOOL, true);
    SETV("t.u64", u64, GGUF_TYPE_UINT64, UINT64_MAX - 5);
    SETV("t.i64", i64, GGUF_TYPE_INT64, INT64_MIN + 7);
    SETV("t.f64", f64, GGUF_TYPE_FLOAT64, -1.0e300);
#undef SETV
    assert_int_equal(gguf_writer_set_str(w, "t.str", "héllo, wörld", &e), CELLM_OK);
    assert_int_equal(gguf_writer_set_str(w, "t.empty_str", "", &e), CELLM_OK);
    /* An array of every fixed-size type. */
    static const uint8_t raw[64] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1};
    static const gguf_type fixed[] = {
        GGUF_TYPE_UINT8, GGUF_TYPE_INT8,    GGUF_TYPE_UINT16, GGUF_TYPE_INT16, GGUF_TYPE_UINT32,
        GGUF_TYPE_INT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_UINT64, GGUF_TYPE_INT64, GGUF_TYPE_FLOAT64};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "arr.%s", gguf_type_name(fixed[i]));
        memset(&v, 0, sizeof v);
        v.type = GGUF_TYPE_ARRAY;
        v.v.arr.type = fixed[i];
        v.v.arr.n = 64 / gguf_type_size(fixed[i]);
        v.v.arr.data = raw;
        assert_int_equal(gguf_writer_set(w, key, &v, &e), CELLM_OK);
    }
    static const uint8_t bools[3] = {1, 0, 1};
    memset(&v, 0, sizeof v);
    v.type = GGUF_TYPE_ARRAY;
    v.v.arr.type = GGUF_TYPE_BOOL;
    v.v.arr.n = 3;
    v.v.arr.data = bools;
    assert_int_equal(gguf_writer_set(w, "arr.bool", &v, &e), CELLM_OK);
    gguf_str strs[3] = {{"a", 1}, {"", 0}, {"▁token", strlen("▁token")}};
    memset(&v, 0, sizeof v);
    v.type = GGUF_TYPE_ARRAY;
    v.v.arr.type = GGUF_TYPE_STRING;
    v.v.arr.n = 3;
    v.v.arr.strs = strs;
    assert_int_equal(gguf_writer_set(w, "arr.string", &v, &e), CELLM_OK);
    /* Nested: [[1,2,3], [], [["x","y"]]]. */
    static const uint32_t inner_u32[3] = {1, 2, 3};
    gguf_str xy[2] = {{"x", 1}, {"y", 1}};
    gguf_value deepest = {.type = GGUF_TYPE_ARRAY};
    deepest.v.arr.type = GGUF_TYPE_STRING;
    deepest.v.arr.n = 2;
    deepest.v.arr.strs = xy;
    gguf_value items[3];
    memset(items, 0, sizeof items);
    items[0].type = GGUF_TYPE_ARRAY;
    items[0].v.arr.type = GGUF_TYPE_UINT32;
    items[0].v.arr.n = 3;
    items[0].v.arr.data = inner_u32;
    items[1].type = GGUF_TYPE_ARRAY;
    items[1].v.arr.type = GGUF_TYPE_INT16;
    items[2].type = GGUF_TYPE_ARRAY;
    items[2].v.arr.type = GGUF_TYPE_ARRAY;
    items[2].v.arr.n = 1;
    items[2].v.arr.items = &deepest;
    memset(&v, 0, sizeof v);
    v.type = GGUF_TYPE_ARRAY;
    v.v.arr.type = GGUF_TYPE_ARRAY;
    v.v.arr.n = 3;
    v.v.arr.items = items;
    assert_int_equal(gguf_writer_set(w, "arr.nested", &v, &e), CELLM_OK);
    memset(&v, 0, sizeof v);
    v.type = GGUF_TYPE_ARRAY;
    v.v.arr.type = GGUF_TYPE_FLOAT32;
    assert_int_equal(gguf_writer_set(w, "arr.empty", &v, &e), CELLM_OK);

    for (int i = 0; i < 64; i++) f32data[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 2 * 18; i++) q4data[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < 6; i++) f16data[i] = (uint16_t)(0x3c00 + i);
    uint64_t ne_a[2] = {16, 4}, ne_b[1] = {64}, ne_c[3] = {1, 2, 3};
    assert_int_equal(gguf_writer_add_tensor(w, "a.weight", QT_F32, 2, ne_a, f32data, &e), CELLM_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "b.weight", QT_Q4_0, 1, ne_b, q4data, &e), CELLM_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "c.weight", QT_F16, 3, ne_c, f16data, &e), CELLM_OK);
    return w;
}

static void check_values_equal(const gguf_value *a, const gguf_value *b) {
    assert_int_equal(a->type, b->type);
    switch (a->type) {
    case GGUF_TYPE_STRING:
        assert_int_equal(a->v.str.len, b->v.str.len);
        assert_memory_equal(a->v.str.ptr, b->v.str.ptr, a->v.str.len ? a->v.str.len : 0);
        break;
    case GGUF_TYPE_ARRAY:
        assert_int_equal(a->v.arr.type, b->v.arr.type);
        assert_int_equal(a->v.arr.n, b->v.arr.n);
        for (uint64_t i = 0; i < a->v.arr.n; i++) {
            if (a->v.arr.type == GGUF_TYPE_STRING) {
                assert_int_equal(a->v.arr.strs[i].len, b->v.arr.strs[i].len);
                if (a->v.arr.strs[i].len)
                    assert_memory_equal(a->v.arr.strs[i].ptr, b->v.arr.strs[i].ptr,
                                        a->v.arr.strs[i].len);
            } else if (a->v.arr.type == GGUF_TYPE_ARRAY) {
                check_values_equal(&a->v.arr.items[i], &b->v.arr.items[i]);
            }
        }
        if (gguf_type_size(a->v.arr.type) && a->v.arr.n)
            assert_memory_equal(a->v.arr.data, b->v.arr.data,
                                a->v.arr.n * gguf_type_size(a->v.arr.type));
        break;
    default: assert_memory_equal(&a->v, &b->v, gguf_type_size(a->type));
    }
}

static void test_round_trip(void **state) {
    (void)state;
    float f32data[64];
    uint8_t q4data[36];
    uint16_t f16data[6];
    gguf_writer *w = make_full_writer(f32data, q4data, f16data);
    cellm_error e;
    uint8_t *buf;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, &buf, &size, &e), CELLM_OK);

    gguf_file *f;
    assert_int_equal(gguf_open_memory(buf, size, &f, &e), CELLM_OK);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_kv, 27);
    assert_int_equal(f->n_tensors, 3);
    assert_int_equal(f->data_offset % 32, 0);

    uint64_t u;
    int64_t i;
    double d;
    bool b;
    gguf_str s;
    assert_true(gguf_get_uint(f, "t.u8", &u) && u == 250);
    assert_true(gguf_get_int(f, "t.i8", &i) && i == -100);
    assert_true(gguf_get_uint(f, "t.u16", &u) && u == 65000);
    assert_true(gguf_get_int(f, "t.i16", &i) && i == -32000);
    assert_true(gguf_get_uint(f, "t.u32", &u) && u == 4000000000u);
    assert_true(gguf_get_int(f, "t.i32", &i) && i == -2000000000);
    assert_true(gguf_get_float(f, "t.f32", &d) && d == 3.25);
    assert_true(gguf_get_bool(f, "t.bool", &b) && b);
    assert_true(gguf_get_uint(f, "t.u64", &u) && u == UINT64_MAX - 5);
    assert_false(gguf_get_int(f, "t.u64", &i)); /* does not fit int64 */
    assert_true(gguf_get_int(f, "t.i64", &i) && i == INT64_MIN + 7);
    assert_false(gguf_get_uint(f, "t.i64", &u)); /* negative */
    assert_true(gguf_get_float(f, "t.f64", &d) && d == -1.0e300);
    assert_true(gguf_get_str(f, "t.str", &s) && gguf_str_eq(s, "héllo, wörld"));
    assert_true(gguf_get_str(f, "t.empty_str", &s) && s.len == 0);
    assert_false(gguf_get_str(f, "t.u8", &s)); /* wrong type */
    assert_null(gguf_find_key(f, "missing"));

    const gguf_value *a = gguf_get_arr(f, "arr.int16");
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, 32);
    assert_true(gguf_arr_get_int(a, 0, &i) && i == 0x0201);
    assert_false(gguf_arr_get_int(a, 32, &i)); /* out of range */
    a = gguf_get_arr(f, "arr.string");
    assert_non_null(a);
    assert_true(gguf_str_eq(a->v.arr.strs[2], "▁token"));
    a = gguf_get_arr(f, "arr.nested");
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, 3);
    assert_true(gguf_arr_get_int(&a->v.arr.items[0], 2, &i) && i == 3);
    assert_int_equal(a->v.arr.items[1].v.arr.n, 0);
    assert_true(gguf_str_eq(a->v.arr.items[2].v.arr.items[0].v.arr.strs[1], "y"));

    const gguf_tensor *t = gguf_find_tensor(f, "a.weight");
    assert_non_null(t);
    assert_int_equal(t->type, QT_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 16);
    assert_int_equal(t->ne[1], 4);
    assert_int_equal(t->size, 256);
    assert_memory_equal(t->data, f32data, 256);
    t = gguf_find_tensor(f, "b.weight");
    assert_int_equal(t->size, 36);
    assert_memory_equal(t->data, q4data, 36);
    assert_int_equal(((uintptr_t)t->data - (uintptr_t)buf) % 32, 0);
    t = gguf_find_tensor(f, "c.weight");
    assert_int_equal(t->n_elems, 6);
    assert_memory_equal(t->data, f16data, 12);

    /* Copying every key and tensor from the reader (views into its map)
     * into a new writer gives byte-identical output. */
    gguf_writer *w2 = gguf_writer_new();
    for (uint64_t k = 0; k < f->n_kv; k++) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)f->kv[k].key.len, f->kv[k].key.ptr);
        assert_int_equal(gguf_writer_set(w2, key, &f->kv[k].value, &e), CELLM_OK);
    }
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        const gguf_tensor *x = &f->tensors[k];
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)x->name.len, x->name.ptr);
        assert_int_equal(gguf_writer_add_tensor(w2, name, x->type, x->n_dims, x->ne, x->data, &e),
                         CELLM_OK);
    }
    uint8_t *buf2;
    size_t size2;
    assert_int_equal(gguf_writer_write_mem(w2, &buf2, &size2, &e), CELLM_OK);
    assert_int_equal(size2, size);
    assert_memory_equal(buf2, buf, size);

    /* And through a real file. */
    char path[] = "/tmp/cellm_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_writer_write(w2, path, &e), CELLM_OK);
    gguf_file *f2;
    assert_int_equal(gguf_open(path, &f2, &e), CELLM_OK);
    assert_int_equal(f2->size, size);
    assert_memory_equal(f2->base, buf, size);
    assert_int_equal(f2->n_kv, f->n_kv);
    for (uint64_t k = 0; k < f->n_kv; k++) {
        assert_int_equal(f2->kv[k].key.len, f->kv[k].key.len);
        assert_memory_equal(f2->kv[k].key.ptr, f->kv[k].key.ptr, f->kv[k].key.len);
        check_values_equal(&f2->kv[k].value, &f->kv[k].value);
    }
    gguf_close(f2);
    unlink(path);

    gguf_close(f);
    gguf_writer_free(w2);
    gguf_writer_free(w);
    free(buf2);
    free(buf);
}

static void test_writer_rejects(void **state) {
    (void)state;
    gguf_writer *w = gguf_writer_new();
    cellm_error e;
    uint8_t data[64] = {0};
    uint64_t ne[1] = {33};
    assert_int_equal(gguf_writer_add_tensor(w, "x", QT_Q4_0, 1, ne, data, &e),
                     CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(e.msg, "block size"));
    ne[0] = 32;
    assert_int_equal(gguf_writer_add_tensor(w, "x", QT_Q4_0, 1, ne, data, &e), CELLM_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "x", QT_Q4_0, 1, ne, data, &e),
                     CELLM_ERR_INVALID_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "y", 4, 1, ne, data, &e), CELLM_ERR_INVALID_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "z", QT_F32, 5, ne, data, &e),
                     CELLM_ERR_INVALID_ARG);
    gguf_value bad = {.type = (gguf_type)42};
    assert_int_equal(gguf_writer_set(w, "k", &bad, &e), CELLM_ERR_INVALID_ARG);
    /* Setting a key twice replaces it in place. */
    assert_int_equal(gguf_writer_set_u32(w, "k", 1, &e), CELLM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "k", 2, &e), CELLM_OK);
    uint8_t *buf;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, &buf, &size, &e), CELLM_OK);
    gguf_file *f;
    assert_int_equal(gguf_open_memory(buf, size, &f, &e), CELLM_OK);
    uint64_t u;
    assert_int_equal(f->n_kv, 1);
    assert_true(gguf_get_uint(f, "k", &u) && u == 2);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
}

/* -------------------------------------------------------- malformed files */

/* Parses `b` and checks it fails with `code` and a message containing
 * `needle`. */
static void expect_fail(tbuf *b, cellm_status code, const char *needle) {
    gguf_file *f = (gguf_file *)1;
    cellm_error e;
    err_clear(&e);
    cellm_status st = gguf_open_memory(b->p, b->len, &f, &e);
    if (st != code || !strstr(e.msg, needle)) {
        print_error("expected status %d with '%s', got %d: '%s'\n", code, needle, st, e.msg);
        fail();
    }
    assert_null(f);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void header(tbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    tb_u32(b, GGUF_MAGIC);
    tb_u32(b, version);
    tb_u64(b, n_tensors);
    tb_u64(b, n_kv);
}

/* A header with one tensor info named `name` and given fields, then padding
 * and `data_bytes` of data. */
static void one_tensor(tbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset, size_t data_bytes) {
    header(b, 3, 1, 0);
    tb_str(b, name);
    tb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) tb_u64(b, ne[d]);
    tb_u32(b, type);
    tb_u64(b, offset);
    tb_pad(b, 32);
    for (size_t i = 0; i < data_bytes; i++) tb_u8(b, 0);
}

static void test_malformed_header(void **state) {
    (void)state;
    tbuf b = {0};
    /* 1: shorter than the magic */
    tb_u8(&b, 'G');
    tb_u8(&b, 'G');
    expect_fail(&b, CELLM_ERR_FORMAT, "too short for the magic");
    /* 2: wrong magic */
    tb_u32(&b, 0x46554746);
    tb_u32(&b, 3);
    expect_fail(&b, CELLM_ERR_FORMAT, "magic at byte offset 0");
    /* 3: version 1 */
    header(&b, 1, 0, 0);
    expect_fail(&b, CELLM_ERR_UNSUPPORTED, "version 1");
    /* 4: unknown version */
    header(&b, 9, 0, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "version 9 at byte offset 4");
    /* 5: big-endian file */
    header(&b, 0x03000000, 0, 0);
    expect_fail(&b, CELLM_ERR_UNSUPPORTED, "big-endian");
    /* 6: header cut after the version */
    tb_u32(&b, GGUF_MAGIC);
    tb_u32(&b, 3);
    tb_u32(&b, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "tensor count at byte offset 8");
    /* 7: metadata count larger than the file could hold */
    header(&b, 3, 0, UINT64_MAX);
    expect_fail(&b, CELLM_ERR_FORMAT, "metadata count 18446744073709551615");
    /* 8: tensor count larger than the file could hold */
    header(&b, 2, 1u << 30, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "tensor count 1073741824");
}

static void test_malformed_metadata(void **state) {
    (void)state;
    tbuf b = {0};
    /* 9: key length past the end */
    header(&b, 3, 0, 1);
    tb_u64(&b, 1000);
    tb_put(&b, "abcdefghijklmnop", 16);
    expect_fail(&b, CELLM_ERR_FORMAT, "metadata key at byte offset 24 has length 1000");
    /* 10: key longer than the limit */
    header(&b, 3, 0, 1);
    tb_u64(&b, 70000);
    for (int i = 0; i < 70010; i++) tb_u8(&b, 'k');
    expect_fail(&b, CELLM_ERR_FORMAT, "(limit 65535)");
    /* 11: empty key */
    header(&b, 3, 0, 1);
    tb_str(&b, "");
    tb_u32(&b, GGUF_TYPE_UINT32);
    tb_u32(&b, 1);
    expect_fail(&b, CELLM_ERR_FORMAT, "is empty");
    /* 12: duplicate key */
    header(&b, 3, 0, 2);
    for (int k = 0; k < 2; k++) {
        tb_str(&b, "dup.key");
        tb_u32(&b, GGUF_TYPE_UINT8);
        tb_u8(&b, 1);
    }
    expect_fail(&b, CELLM_ERR_FORMAT, "duplicate metadata key 'dup.key' at byte offset 44");
    /* 13: value type out of range */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, 13);
    tb_u64(&b, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "value type 13 at byte offset 33");
    /* 14: array element type out of range */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, GGUF_TYPE_ARRAY);
    tb_u32(&b, 99);
    tb_u64(&b, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "array element type 99");
    /* 15: array length past the end */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, GGUF_TYPE_ARRAY);
    tb_u32(&b, GGUF_TYPE_UINT32);
    tb_u64(&b, 1ull << 40);
    tb_u32(&b, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "array length 1099511627776");
    /* 16: arrays nested too deep */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, GGUF_TYPE_ARRAY);
    for (int d = 0; d < 20; d++) {
        tb_u32(&b, GGUF_TYPE_ARRAY);
        tb_u64(&b, 1);
    }
    expect_fail(&b, CELLM_ERR_FORMAT, "nest deeper than 8 levels");
    /* 17: string value past the end */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, GGUF_TYPE_STRING);
    tb_u64(&b, 50);
    tb_put(&b, "short", 5);
    expect_fail(&b, CELLM_ERR_FORMAT, "string value at byte offset 37 has length 50");
    /* 18: bool that is not 0 or 1 */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, GGUF_TYPE_BOOL);
    tb_u8(&b, 2);
    expect_fail(&b, CELLM_ERR_FORMAT, "bool value at byte offset 37 is 2");
    /* 19: bool array element that is not 0 or 1 */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, GGUF_TYPE_ARRAY);
    tb_u32(&b, GGUF_TYPE_BOOL);
    tb_u64(&b, 3);
    tb_u8(&b, 1);
    tb_u8(&b, 0);
    tb_u8(&b, 7);
    expect_fail(&b, CELLM_ERR_FORMAT, "bool array element 2 at byte offset 51 is 7");
    /* 20: scalar cut short */
    header(&b, 3, 0, 1);
    tb_str(&b, "k");
    tb_u32(&b, GGUF_TYPE_UINT64);
    tb_u32(&b, 5);
    expect_fail(&b, CELLM_ERR_FORMAT, "truncated file: scalar value at byte offset 37");
    /* 21: general.alignment of the wrong type */
    header(&b, 3, 0, 1);
    tb_str(&b, "general.alignment");
    tb_u32(&b, GGUF_TYPE_UINT64);
    tb_u64(&b, 32);
    expect_fail(&b, CELLM_ERR_FORMAT, "general.alignment at byte offset 24 has type uint64");
    /* 22: general.alignment not a power of two */
    header(&b, 3, 0, 1);
    tb_str(&b, "general.alignment");
    tb_u32(&b, GGUF_TYPE_UINT32);
    tb_u32(&b, 48);
    expect_fail(&b, CELLM_ERR_FORMAT, "is 48, not a power of two");
    /* 23: general.alignment of zero */
    header(&b, 3, 0, 1);
    tb_str(&b, "general.alignment");
    tb_u32(&b, GGUF_TYPE_UINT32);
    tb_u32(&b, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "is 0, not a power of two");
}

static void test_malformed_tensors(void **state) {
    (void)state;
    tbuf b = {0};
    uint64_t ne1[1] = {32}, ne2[2] = {32, 2};
    /* 24: empty tensor name */
    one_tensor(&b, "", 1, ne1, QT_F32, 0, 128);
    expect_fail(&b, CELLM_ERR_FORMAT, "has an empty name");
    /* 25: no dimensions */
    one_tensor(&b, "t", 0, ne1, QT_F32, 0, 128);
    expect_fail(&b, CELLM_ERR_FORMAT, "dimension count 0 at byte offset 33");
    /* 26: too many dimensions */
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    one_tensor(&b, "t", 5, ne5, QT_F32, 0, 128);
    expect_fail(&b, CELLM_ERR_FORMAT, "dimension count 5");
    /* 27: a negative dimension */
    uint64_t neg[2] = {32, (uint64_t)-4};
    one_tensor(&b, "t", 2, neg, QT_F32, 0, 128);
    expect_fail(&b, CELLM_ERR_FORMAT, "dimension 1 at byte offset 45 is negative");
    /* 28: element count overflow */
    uint64_t big[3] = {1ull << 32, 1ull << 32, 4};
    one_tensor(&b, "t", 3, big, QT_F32, 0, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "element count overflows at dimension 1");
    /* 29: byte size overflow (element count fits, bytes do not) */
    uint64_t huge[2] = {1ull << 31, 1ull << 31};
    one_tensor(&b, "t", 2, huge, QT_F32, 0, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "tensor 't': byte size overflows");
    /* 30: unknown tensor type */
    one_tensor(&b, "t", 1, ne1, 4, 0, 128);
    expect_fail(&b, CELLM_ERR_FORMAT, "type id 4 at byte offset 45");
    /* 31: row length not a whole number of blocks */
    uint64_t ne33[1] = {33};
    one_tensor(&b, "t", 1, ne33, QT_Q4_0, 0, 64);
    expect_fail(&b, CELLM_ERR_FORMAT, "row length 33 is not a multiple of the Q4_0 block size 32");
    /* 32: misaligned data offset */
    one_tensor(&b, "t", 1, ne1, QT_F32, 8, 256);
    expect_fail(&b, CELLM_ERR_FORMAT, "data offset 8 at byte offset 49 is not a multiple");
    /* 33: data past the end of the file */
    one_tensor(&b, "t", 2, ne2, QT_F32, 0, 100);
    expect_fail(&b, CELLM_ERR_FORMAT, "tensor 't': data [0, +256) runs past the end");
    /* 34: tensor info cut short */
    header(&b, 3, 1, 0);
    tb_str(&b, "tensor_with_a_long_name");
    tb_u32(&b, 2);
    tb_u64(&b, 32);
    expect_fail(&b, CELLM_ERR_FORMAT, "truncated file: tensor dimension at byte offset 67");
    /* 35: overlapping tensors */
    header(&b, 3, 2, 0);
    tb_str(&b, "a");
    tb_u32(&b, 1);
    tb_u64(&b, 32);
    tb_u32(&b, QT_F32);
    tb_u64(&b, 0);
    tb_str(&b, "b");
    tb_u32(&b, 1);
    tb_u64(&b, 32);
    tb_u32(&b, QT_F32);
    tb_u64(&b, 64);
    tb_pad(&b, 32);
    for (int i = 0; i < 256; i++) tb_u8(&b, 0);
    expect_fail(&b, CELLM_ERR_FORMAT,
                "tensors 'a' (data offset 0, 128 bytes) and 'b' (data offset 64) overlap");
    /* 36: duplicate tensor name */
    header(&b, 3, 2, 0);
    for (int k = 0; k < 2; k++) {
        tb_str(&b, "same");
        tb_u32(&b, 1);
        tb_u64(&b, 32);
        tb_u32(&b, QT_F32);
        tb_u64(&b, (uint64_t)k * 128);
    }
    tb_pad(&b, 32);
    for (int i = 0; i < 256; i++) tb_u8(&b, 0);
    expect_fail(&b, CELLM_ERR_FORMAT, "duplicate tensor name 'same'");
    /* 37: the data section would start past the end of the file */
    header(&b, 3, 1, 0);
    tb_str(&b, "t");
    tb_u32(&b, 1);
    tb_u64(&b, 32);
    tb_u32(&b, QT_F32);
    tb_u64(&b, 0); /* ends at byte 57: the data section would start at 64 */
    expect_fail(&b, CELLM_ERR_FORMAT, "data section should start at byte offset 64");
    /* 38: a tensor name longer than the limit */
    header(&b, 3, 1, 0);
    tb_u64(&b, 1ull << 20);
    for (int i = 0; i < 64; i++) tb_u8(&b, 'n');
    expect_fail(&b, CELLM_ERR_FORMAT, "tensor name at byte offset 24 is 1048576 bytes long");
}

static void test_open_errors(void **state) {
    (void)state;
    gguf_file *f;
    cellm_error e;
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f, &e), CELLM_ERR_IO);
    assert_non_null(strstr(e.msg, "cannot open '/nonexistent/x.gguf'"));
    assert_int_equal(gguf_open("/tmp", &f, &e), CELLM_ERR_IO);
    assert_non_null(strstr(e.msg, "not a regular file"));
    char path[] = "/tmp/cellm_test_empty_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_open(path, &f, &e), CELLM_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "is empty (0 bytes)"));
    unlink(path);
    assert_int_equal(gguf_open(NULL, &f, &e), CELLM_ERR_INVALID_ARG);
}

/* Every prefix of a valid file, and every single-byte corruption of its
 * header, either parses or fails cleanly: never a crash or a leak. */
static void test_truncations_and_corruptions(void **state) {
    (void)state;
    float f32data[64];
    uint8_t q4data[36];
    uint16_t f16data[6];
    gguf_writer *w = make_full_writer(f32data, q4data, f16data);
    cellm_error e;
    uint8_t *buf;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, &buf, &size, &e), CELLM_OK);
    gguf_file *f;
    size_t ok_prefixes = 0;
    for (size_t n = 0; n < size; n++) {
        /* A copy of exactly n bytes, so ASan sees any read past it. */
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, buf, n);
        if (gguf_open_memory(p, n, &f, &e) == CELLM_OK) {
            ok_prefixes++;
            gguf_close(f);
        } else {
            assert_true(e.msg[0] != '\0');
        }
        free(p);
    }
    gguf_file *full;
    assert_int_equal(gguf_open_memory(buf, size, &full, &e), CELLM_OK);
    size_t header_end = (size_t)full->data_offset;
    const gguf_tensor *last = gguf_find_tensor(full, "c.weight");
    /* Only prefixes that keep all tensor data (cutting the final padding)
     * may parse. */
    assert_int_equal(ok_prefixes, size - (header_end + last->offset + last->size));
    gguf_close(full);
    uint8_t *p = malloc(size);
    static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    for (size_t i = 0; i < header_end; i++) {
        for (size_t k = 0; k < sizeof vals; k++) {
            memcpy(p, buf, size);
            p[i] = vals[k];
            if (gguf_open_memory(p, size, &f, &e) == CELLM_OK) gguf_close(f);
        }
    }
    free(p);
    free(buf);
    gguf_writer_free(w);
}

/* Files written by an independent writer (scripts/gen_fuzz_seeds.py, the
 * fuzzer's seeds) parse with the values that script put in them. */
static void test_independent_files(void **state) {
    (void)state;
    static const char *const valid[] = {"every_type.gguf", "tensors.gguf", "model_like.gguf",
                                        "align64.gguf",    "v2.gguf",      "empty.gguf"};
    for (size_t k = 0; k < sizeof valid / sizeof valid[0]; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/fuzz/corpus/gguf/%s", CELLM_SOURCE_DIR, valid[k]);
        gguf_file *f;
        cellm_error e;
        if (gguf_open(path, &f, &e) != CELLM_OK) {
            print_error("%s\n", e.msg);
            fail();
        }
        int64_t i;
        if (!strcmp(valid[k], "every_type.gguf")) {
            assert_int_equal(f->n_kv, 15);
            assert_true(gguf_get_int(f, "t.i64", &i) && i == -(1ll << 40));
            const gguf_value *n = gguf_get_arr(f, "t.nested");
            assert_non_null(n);
            assert_true(gguf_str_eq(n->v.arr.items[1].v.arr.strs[0], "x"));
        }
        if (!strcmp(valid[k], "tensors.gguf")) {
            const gguf_tensor *t = gguf_find_tensor(f, "c");
            assert_non_null(t);
            assert_int_equal(t->type, QT_Q4_K);
            assert_int_equal(t->size, 144);
            assert_int_equal(((const uint8_t *)t->data)[1], 10);
        }
        if (!strcmp(valid[k], "align64.gguf")) assert_int_equal(f->alignment, 64);
        if (!strcmp(valid[k], "v2.gguf")) assert_int_equal(f->version, 2);
        gguf_close(f);
    }
}

/* ----------------------------------------------------------- real models */

static void check_real_model(const char *name, const char *arch, uint64_t n_tensors,
                             uint64_t n_vocab) {
    char path[1024];
    test_model_path(name, path, sizeof path);
    gguf_file *f;
    cellm_error e;
    if (gguf_open(path, &f, &e) != CELLM_OK) {
        print_error("%s\n", e.msg);
        fail();
    }
    gguf_str s;
    assert_true(gguf_get_str(f, "general.architecture", &s));
    assert_true(gguf_str_eq(s, arch));
    assert_int_equal(f->n_tensors, n_tensors);
    const gguf_value *tokens = gguf_get_arr(f, "tokenizer.ggml.tokens");
    assert_non_null(tokens);
    assert_int_equal(tokens->v.arr.type, GGUF_TYPE_STRING);
    assert_int_equal(tokens->v.arr.n, n_vocab);
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    assert_non_null(emb);
    assert_int_equal(emb->ne[1], n_vocab);
    uint64_t total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) total += f->tensors[i].size;
    assert_true(total <= f->size - f->data_offset);
    assert_true(total > f->size / 2);
    gguf_close(f);
}

static void test_real_smollm2(void **state) {
    (void)state;
    check_real_model("smollm2-135m", "llama", 272, 49152);
}

static void test_real_gemma3(void **state) {
    (void)state;
    check_real_model("gemma3-270m", "gemma3", 236, 262144);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_malformed_header),
        cmocka_unit_test(test_malformed_metadata),
        cmocka_unit_test(test_malformed_tensors),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_truncations_and_corruptions),
        cmocka_unit_test(test_independent_files),
        cmocka_unit_test(test_real_smollm2),
        cmocka_unit_test(test_real_gemma3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
