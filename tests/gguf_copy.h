/*
 * gguf_copy.h — for tests: a copy of a real GGUF file with keys added or
 * changed, written with the project's own writer (gguf.h).
 */
#ifndef CELLM_TEST_GGUF_COPY_H
#define CELLM_TEST_GGUF_COPY_H

#include <stdio.h>

#include "format/gguf.h"

/* Writes to `dst` every key and tensor of the GGUF file at `src`, then
 * lets `add(w, arg)` set more keys (a key set again takes the new value)
 * before the tensors; fails the test on any error. */
static inline void test_gguf_copy(const char *src, const char *dst,
                                  void (*add)(gguf_writer *w, const void *arg), const void *arg) {
    gguf_file *g;
    cellm_error e;
    assert_int_equal(gguf_open(src, &g, &e), CELLM_OK);
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        char k[256];
        snprintf(k, sizeof k, "%.*s", (int)g->kv[i].key.len, g->kv[i].key.ptr);
        assert_int_equal(gguf_writer_set(w, k, &g->kv[i].value, &e), CELLM_OK);
    }
    add(w, arg);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char n[256];
        snprintf(n, sizeof n, "%.*s", (int)t->name.len, t->name.ptr);
        assert_int_equal(gguf_writer_add_tensor(w, n, t->type, t->n_dims, t->ne, t->data, &e),
                         CELLM_OK);
    }
    assert_int_equal(gguf_writer_write(w, dst, &e), CELLM_OK);
    gguf_writer_free(w);
    gguf_close(g);
}

#endif /* CELLM_TEST_GGUF_COPY_H */
