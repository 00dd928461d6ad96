/*
 * gguf_write.c — writing GGUF v3 files (see gguf.h). `cellm quantize` and
 * `cellm convert` build a file with a gguf_writer: metadata values are deep
 * copied in, tensor data is borrowed until the write. The layout written is
 * the one the reader expects: header, key-value pairs, tensor infos, padding
 * to the alignment, then each tensor's data padded to the alignment.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/quant.h"

typedef struct wtensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t size;
    uint64_t offset;
    const void *data;
} wtensor;

typedef struct wkv {
    char *key;
    gguf_value value; /* owns its strings and arrays */
} wkv;

struct gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
};

gguf_writer *gguf_writer_new(void) {
    return calloc(1, sizeof(gguf_writer));
}

/* Frees a value the writer owns (deep). */
static void owned_value_free(gguf_value *v) {
    if (v->type == GGUF_TYPE_STRING) {
        free((void *)v->v.str.ptr);
    } else if (v->type == GGUF_TYPE_ARRAY) {
        if (v->v.arr.strs)
            for (uint64_t i = 0; i < v->v.arr.n; i++) free((void *)v->v.arr.strs[i].ptr);
        if (v->v.arr.items)
            for (uint64_t i = 0; i < v->v.arr.n; i++) owned_value_free(&v->v.arr.items[i]);
        free(v->v.arr.strs);
        free(v->v.arr.items);
        free((void *)v->v.arr.data);
    }
    memset(v, 0, sizeof *v);
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        owned_value_free(&w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->kv);
    free(w->tensors);
    free(w);
}

static bool str_copy(gguf_str src, gguf_str *dst) {
    if (src.len > SIZE_MAX - 1) return false;
    char *p = malloc((size_t)src.len + 1);
    if (!p) return false;
    if (src.len) memcpy(p, src.ptr, (size_t)src.len);
    p[src.len] = '\0';
    dst->ptr = p;
    dst->len = src.len;
    return true;
}

/* Deep copy of `src` into `dst`; on failure `dst` holds what was copied so
 * far and owned_value_free() releases it. */
static bool value_copy(const gguf_value *src, gguf_value *dst, int depth) {
    memset(dst, 0, sizeof *dst);
    dst->type = src->type;
    if ((unsigned)src->type >= GGUF_TYPE_COUNT) return false;
    if (src->type == GGUF_TYPE_STRING) return str_copy(src->v.str, &dst->v.str);
    if (src->type != GGUF_TYPE_ARRAY) {
        dst->v = src->v;
        return true;
    }
    if (depth >= GGUF_MAX_ARRAY_DEPTH || (unsigned)src->v.arr.type >= GGUF_TYPE_COUNT) return false;
    uint64_t n = src->v.arr.n;
    dst->v.arr.type = src->v.arr.type;
    if (src->v.arr.type == GGUF_TYPE_STRING) {
        if (n && !src->v.arr.strs) return false;
        if (n && !(dst->v.arr.strs = calloc((size_t)n, sizeof(gguf_str)))) return false;
        dst->v.arr.n = n;
        for (uint64_t i = 0; i < n; i++)
            if (!str_copy(src->v.arr.strs[i], &dst->v.arr.strs[i])) return false;
    } else if (src->v.arr.type == GGUF_TYPE_ARRAY) {
        if (n && !src->v.arr.items) return false;
        if (n && !(dst->v.arr.items = calloc((size_t)n, sizeof(gguf_value)))) return false;
        dst->v.arr.n = n;
        for (uint64_t i = 0; i < n; i++)
            if (!value_copy(&src->v.arr.items[i], &dst->v.arr.items[i], depth + 1)) return false;
    } else {
        size_t bytes;
        if (!size_mul((size_t)n, gguf_type_size(src->v.arr.type), &bytes)) return false;
        if (n && !src->v.arr.data) return false;
        void *p = malloc(bytes ? bytes : 1);
        if (!p) return false;
        if (bytes) memcpy(p, src->v.arr.data, bytes);
        dst->v.arr.data = p;
        dst->v.arr.n = n;
    }
    return true;
}

cellm_status gguf_writer_set(gguf_writer *w, const char *key, const gguf_value *v,
                             cellm_error *err) {
    if (!w || !key || !v)
        return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_writer_set: NULL argument");
    if (!*key || strlen(key) > GGUF_MAX_NAME_LEN)
        return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_writer_set: bad key length");
    gguf_value copy;
    if (!value_copy(v, &copy, 0)) {
        owned_value_free(&copy);
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "gguf_writer_set: cannot copy the value of '%s' (bad type or out of memory)",
                       key);
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            owned_value_free(&w->kv[i].value);
            w->kv[i].value = copy;
            return CELLM_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *p = realloc(w->kv, cap * sizeof *p);
        if (!p) {
            owned_value_free(&copy);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        }
        w->kv = p;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        owned_value_free(&copy);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].value = copy;
    w->n_kv++;
    return CELLM_OK;
}

cellm_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t x, cellm_error *err) {
    gguf_value v = {.type = GGUF_TYPE_UINT32, .v.u32 = x};
    return gguf_writer_set(w, key, &v, err);
}

cellm_status gguf_writer_set_f32(gguf_writer *w, const char *key, float x, cellm_error *err) {
    gguf_value v = {.type = GGUF_TYPE_FLOAT32, .v.f32 = x};
    return gguf_writer_set(w, key, &v, err);
}

cellm_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s, cellm_error *err) {
    if (!s) return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_writer_set_str: NULL string");
    gguf_value v = {.type = GGUF_TYPE_STRING, .v.str = {s, strlen(s)}};
    return gguf_writer_set(w, key, &v, err);
}

cellm_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *ne, const void *data,
                                    cellm_error *err) {
    if (!w || !name || !ne)
        return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_writer_add_tensor: NULL argument");
    if (!*name || strlen(name) > GGUF_MAX_NAME_LEN)
        return err_set(err, CELLM_ERR_INVALID_ARG, "tensor name has a bad length");
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return err_set(err, CELLM_ERR_INVALID_ARG, "tensor '%s': %u dimensions", name, n_dims);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return err_set(err, CELLM_ERR_INVALID_ARG, "duplicate tensor name '%s'", name);
    wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t.ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        t.ne[d] = ne[d];
        if (ne[d] > (uint64_t)INT64_MAX || !u64_mul(n, ne[d], &n))
            return err_set(err, CELLM_ERR_INVALID_ARG, "tensor '%s': shape overflows", name);
    }
    const quant_type_info *qi = quant_type_get(type);
    if (!qi) return err_set(err, CELLM_ERR_INVALID_ARG, "tensor '%s': unknown type %u", name, type);
    if (t.ne[0] % qi->block_size || !quant_nbytes(type, n, &t.size))
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "tensor '%s': row length %llu is not a multiple of the %s block size %u",
                       name, (unsigned long long)t.ne[0], qi->name, qi->block_size);
    if (t.size && !data) return err_set(err, CELLM_ERR_INVALID_ARG, "tensor '%s': NULL data", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        wtensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        w->tensors = p;
        w->cap_tensors = cap;
    }
    if (!(t.name = strdup(name))) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    w->tensors[w->n_tensors++] = t;
    return CELLM_OK;
}

/* ------------------------------------------------------------- output */

/* Where bytes go: a FILE or a growing memory buffer. */
typedef struct sink {
    FILE *fp;
    uint8_t *buf;
    size_t len, cap;
    uint64_t written;
    bool failed;
} sink;

static void put(sink *s, const void *p, size_t n) {
    if (s->failed || n == 0) return;
    if (s->fp) {
        if (fwrite(p, 1, n, s->fp) != n) s->failed = true;
    } else {
        if (s->len + n > s->cap) {
            size_t cap = s->cap ? s->cap : 4096;
            while (cap < s->len + n) {
                if (cap > SIZE_MAX / 2) {
                    s->failed = true;
                    return;
                }
                cap *= 2;
            }
            uint8_t *b = realloc(s->buf, cap);
            if (!b) {
                s->failed = true;
                return;
            }
            s->buf = b;
            s->cap = cap;
        }
        memcpy(s->buf + s->len, p, n);
        s->len += n;
    }
    s->written += n;
}

static void put_u32(sink *s, uint32_t v) {
    put(s, &v, 4);
}
static void put_u64(sink *s, uint64_t v) {
    put(s, &v, 8);
}
static void put_str(sink *s, gguf_str str) {
    put_u64(s, str.len);
    put(s, str.ptr, (size_t)str.len);
}

static void pad_to(sink *s, uint32_t alignment) {
    static const uint8_t zeros[256];
    uint64_t rem = s->written % alignment;
    if (!rem) return;
    uint64_t pad = alignment - rem;
    while (pad) {
        size_t n = pad > sizeof zeros ? sizeof zeros : (size_t)pad;
        put(s, zeros, n);
        pad -= n;
    }
}

static void put_value(sink *s, const gguf_value *v) {
    switch (v->type) {
    case GGUF_TYPE_STRING: put_str(s, v->v.str); break;
    case GGUF_TYPE_BOOL: {
        uint8_t b = v->v.b ? 1 : 0;
        put(s, &b, 1);
        break;
    }
    case GGUF_TYPE_ARRAY:
        put_u32(s, v->v.arr.type);
        put_u64(s, v->v.arr.n);
        if (v->v.arr.type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < v->v.arr.n; i++) put_str(s, v->v.arr.strs[i]);
        } else if (v->v.arr.type == GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < v->v.arr.n; i++) put_value(s, &v->v.arr.items[i]);
        } else {
            put(s, v->v.arr.data, (size_t)v->v.arr.n * gguf_type_size(v->v.arr.type));
        }
        break;
    default: put(s, &v->v, gguf_type_size(v->type)); break;
    }
}

static uint32_t writer_alignment(const gguf_writer *w) {
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, "general.alignment") && w->kv[i].value.type == GGUF_TYPE_UINT32) {
            uint32_t a = w->kv[i].value.v.u32;
            if (a && !(a & (a - 1))) return a;
        }
    }
    return GGUF_DEFAULT_ALIGNMENT;
}

static cellm_status emit(gguf_writer *w, sink *s, cellm_error *err) {
    uint32_t align = writer_alignment(w);
    /* Lay out the data section first so tensor infos carry final offsets. */
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = off;
        uint64_t padded = w->tensors[i].size + (align - w->tensors[i].size % align) % align;
        if (!u64_add(off, padded, &off))
            return err_set(err, CELLM_ERR_INVALID_ARG, "tensor data too large");
    }
    put_u32(s, GGUF_MAGIC);
    put_u32(s, 3);
    put_u64(s, w->n_tensors);
    put_u64(s, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(s, (gguf_str){w->kv[i].key, strlen(w->kv[i].key)});
        put_u32(s, w->kv[i].value.type);
        put_value(s, &w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        put_str(s, (gguf_str){t->name, strlen(t->name)});
        put_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(s, t->ne[d]);
        put_u32(s, t->type);
        put_u64(s, t->offset);
    }
    pad_to(s, align);
    for (size_t i = 0; i < w->n_tensors; i++) {
        put(s, w->tensors[i].data, (size_t)w->tensors[i].size);
        pad_to(s, align);
    }
    return s->failed ? err_set(err, CELLM_ERR_IO, "write failed: %s", strerror(errno)) : CELLM_OK;
}

cellm_status gguf_writer_write_mem(gguf_writer *w, uint8_t **buf, size_t *size, cellm_error *err) {
    if (!w || !buf || !size)
        return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_writer_write_mem: NULL argument");
    sink s = {0};
    cellm_status st = emit(w, &s, err);
    if (st) {
        free(s.buf);
        return st;
    }
    *buf = s.buf;
    *size = s.len;
    return CELLM_OK;
}

cellm_status gguf_writer_write(gguf_writer *w, const char *path, cellm_error *err) {
    if (!w || !path) return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_writer_write: NULL argument");
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    snprintf(tmp, n, "%s.part", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        cellm_status st =
            err_set(err, CELLM_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    sink s = {.fp = fp};
    cellm_status st = emit(w, &s, err);
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
        if (!st) st = err_set(err, CELLM_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    }
    if (fclose(fp) != 0 && !st)
        st = err_set(err, CELLM_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = err_set(err, CELLM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path,
                     strerror(errno));
    if (st) unlink(tmp);
    free(tmp);
    return st;
}
