/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader. Any input must either
 * parse or fail with a message; a file that parses is walked completely
 * (every value, every tensor's first and last byte) and copied through the
 * writer, and the copy must parse back to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"

static volatile uint64_t sink;

static void walk_value(const gguf_value *v) {
    int64_t i;
    double d;
    if (v->type == GGUF_TYPE_STRING) {
        if (v->v.str.len) sink += (uint8_t)v->v.str.ptr[v->v.str.len - 1];
    } else if (v->type == GGUF_TYPE_ARRAY) {
        for (uint64_t k = 0; k < v->v.arr.n; k++) {
            if (v->v.arr.type == GGUF_TYPE_STRING) {
                if (v->v.arr.strs[k].len) sink += (uint8_t)v->v.arr.strs[k].ptr[0];
            } else if (v->v.arr.type == GGUF_TYPE_ARRAY) {
                walk_value(&v->v.arr.items[k]);
            } else if (gguf_arr_get_int(v, k, &i)) {
                sink += (uint64_t)i;
            } else if (gguf_arr_get_float(v, k, &d)) {
                sink += (uint64_t)(d == d);
            }
        }
    } else if (gguf_value_as_int(v, &i)) {
        sink += (uint64_t)i;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f;
    cellm_error err;
    if (gguf_open_memory(data, size, &f, &err) != CELLM_OK) {
        if (err.msg[0] == '\0') abort(); /* every failure must say why */
        return 0;
    }
    gguf_writer *w = gguf_writer_new();
    char name[GGUF_MAX_NAME_LEN + 1];
    int ok = w != NULL;
    for (uint64_t k = 0; k < f->n_kv; k++) {
        walk_value(&f->kv[k].value);
        memcpy(name, f->kv[k].key.ptr, (size_t)f->kv[k].key.len);
        name[f->kv[k].key.len] = '\0';
        /* Keys with an embedded NUL cannot be set by name; skip the copy. */
        if (strlen(name) != f->kv[k].key.len) ok = 0;
        if (ok && gguf_writer_set(w, name, &f->kv[k].value, &err) != CELLM_OK) abort();
    }
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        const gguf_tensor *t = &f->tensors[k];
        if (t->size)
            sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->size - 1];
        memcpy(name, t->name.ptr, (size_t)t->name.len);
        name[t->name.len] = '\0';
        if (strlen(name) != t->name.len) ok = 0;
        if (ok && gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, &err))
            abort();
    }
    uint8_t *out = NULL;
    size_t out_size = 0;
    /* Skip the rewrite for large outputs (sparse offsets) to keep runs fast. */
    uint64_t total = 0;
    for (uint64_t k = 0; k < f->n_tensors; k++) total += f->tensors[k].size;
    if (ok && total < (1u << 24)) {
        if (gguf_writer_write_mem(w, &out, &out_size, &err) != CELLM_OK) abort();
        gguf_file *g;
        if (gguf_open_memory(out, out_size, &g, &err) != CELLM_OK) abort();
        if (g->n_kv != f->n_kv || g->n_tensors != f->n_tensors) abort();
        for (uint64_t k = 0; k < g->n_tensors; k++)
            if (g->tensors[k].size != f->tensors[k].size ||
                memcmp(g->tensors[k].data, f->tensors[k].data, (size_t)f->tensors[k].size))
                abort();
        gguf_close(g);
        free(out);
    }
    gguf_writer_free(w);
    gguf_close(f);
    return 0;
}
