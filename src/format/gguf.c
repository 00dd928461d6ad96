/*
 * gguf.c — reading and writing the GGUF container (see gguf.h).
 *
 * The reader walks the header with a cursor that knows how many bytes are
 * left; every read goes through it, so a count or length that runs past the
 * end is caught where it is read, and the error names the field and the byte
 * offset. Counts are checked against the bytes that remain before anything is
 * allocated for them, which bounds every allocation by the file's size.
 */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/quant.h"

/* ---------------------------------------------------------------- types */

size_t gguf_type_size(gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gguf_type_name(gguf_type t) {
    static const char *const names[GGUF_TYPE_COUNT] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64"};
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "?";
}

bool gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* --------------------------------------------------------------- cursor */

typedef struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
    cellm_error *err;
} cursor;

static bool host_is_little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static size_t cur_left(const cursor *c) {
    return c->size - c->pos;
}

/* Reads `n` raw bytes into `dst` (NULL: skip) or fails naming `what`. */
static cellm_status cur_read(cursor *c, void *dst, size_t n, const char *what) {
    if (n > cur_left(c))
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "truncated file: %s at byte offset %zu needs %zu bytes, %zu left", what,
                       c->pos, n, cur_left(c));
    if (dst) memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return CELLM_OK;
}

static cellm_status cur_u32(cursor *c, uint32_t *v, const char *what) {
    return cur_read(c, v, 4, what);
}

static cellm_status cur_u64(cursor *c, uint64_t *v, const char *what) {
    return cur_read(c, v, 8, what);
}

/* A length-prefixed string, as a view into the file. `max` bounds its
 * length (0: only the bytes left bound it). */
static cellm_status cur_str(cursor *c, gguf_str *s, uint64_t max, const char *what) {
    size_t at = c->pos;
    uint64_t len = 0;
    cellm_status st = cur_u64(c, &len, what);
    if (st) return st;
    if (max && len > max)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "%s at byte offset %zu is %llu bytes long (limit %llu)", what, at,
                       (unsigned long long)len, (unsigned long long)max);
    if (len > cur_left(c))
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "%s at byte offset %zu has length %llu but only %zu bytes are left", what,
                       at, (unsigned long long)len, cur_left(c));
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return CELLM_OK;
}

/* ------------------------------------------------------------- values */

static void value_free(gguf_value *v);

static void array_free(gguf_value *v) {
    if (v->v.arr.items) {
        for (uint64_t i = 0; i < v->v.arr.n; i++) value_free(&v->v.arr.items[i]);
    }
    free(v->v.arr.items);
    free(v->v.arr.strs);
    v->v.arr.items = NULL;
    v->v.arr.strs = NULL;
}

/* Frees what the reader allocated for a value (arrays only). */
static void value_free(gguf_value *v) {
    if (v->type == GGUF_TYPE_ARRAY) array_free(v);
}

static cellm_status read_value(cursor *c, gguf_type type, gguf_value *out, int depth,
                               const char *key_desc);

/* Smallest number of bytes one element of `t` takes in the file, so that an
 * element count can be checked against the bytes left before allocating. */
static size_t min_elem_size(gguf_type t) {
    if (t == GGUF_TYPE_STRING) return 8;    /* the length */
    if (t == GGUF_TYPE_ARRAY) return 4 + 8; /* element type and count */
    return gguf_type_size(t);
}

static cellm_status read_array(cursor *c, gguf_value *out, int depth, const char *key_desc) {
    size_t at = c->pos;
    uint32_t et = 0; /* set on success; zeroed for GCC -O3's flow analysis */
    uint64_t n = 0;
    cellm_status st = cur_u32(c, &et, "array element type");
    if (st) return st;
    if (et >= GGUF_TYPE_COUNT)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "%s: array element type %u at byte offset %zu is not a GGUF type", key_desc,
                       et, at);
    if (et == GGUF_TYPE_ARRAY && depth + 1 >= GGUF_MAX_ARRAY_DEPTH)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "%s: arrays nest deeper than %d levels at byte offset %zu", key_desc,
                       GGUF_MAX_ARRAY_DEPTH, at);
    size_t n_at = c->pos;
    if ((st = cur_u64(c, &n, "array length"))) return st;
    size_t esz = min_elem_size((gguf_type)et);
    if (n > cur_left(c) / esz)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "%s: array length %llu at byte offset %zu exceeds the %zu bytes left",
                       key_desc, (unsigned long long)n, n_at, cur_left(c));
    out->type = GGUF_TYPE_ARRAY;
    out->v.arr.type = (gguf_type)et;
    out->v.arr.n = n;
    out->v.arr.data = NULL;
    out->v.arr.strs = NULL;
    out->v.arr.items = NULL;
    if (et == GGUF_TYPE_STRING) {
        if (n && !(out->v.arr.strs = calloc((size_t)n, sizeof(gguf_str))))
            return err_set(c->err, CELLM_ERR_NO_MEMORY, "%s: out of memory for %llu strings",
                           key_desc, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++)
            if ((st = cur_str(c, &out->v.arr.strs[i], 0, "array string"))) return st;
    } else if (et == GGUF_TYPE_ARRAY) {
        if (n && !(out->v.arr.items = calloc((size_t)n, sizeof(gguf_value))))
            return err_set(c->err, CELLM_ERR_NO_MEMORY, "%s: out of memory for %llu arrays",
                           key_desc, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            /* Mark unread items as empty arrays so a failure frees cleanly. */
            out->v.arr.items[i].type = GGUF_TYPE_ARRAY;
        }
        for (uint64_t i = 0; i < n; i++)
            if ((st = read_value(c, GGUF_TYPE_ARRAY, &out->v.arr.items[i], depth + 1, key_desc)))
                return st;
    } else {
        out->v.arr.data = c->base + c->pos;
        if ((st = cur_read(c, NULL, (size_t)n * esz, "array data"))) return st;
        if (et == GGUF_TYPE_BOOL) {
            for (uint64_t i = 0; i < n; i++) {
                uint8_t b = ((const uint8_t *)out->v.arr.data)[i];
                if (b > 1)
                    return err_set(c->err, CELLM_ERR_FORMAT,
                                   "%s: bool array element %llu at byte offset %zu is %u, not 0 "
                                   "or 1",
                                   key_desc, (unsigned long long)i, c->pos - (size_t)n + (size_t)i,
                                   b);
            }
        }
    }
    return CELLM_OK;
}

static cellm_status read_value(cursor *c, gguf_type type, gguf_value *out, int depth,
                               const char *key_desc) {
    out->type = type;
    size_t at = c->pos;
    switch (type) {
    case GGUF_TYPE_STRING: return cur_str(c, &out->v.str, 0, "string value");
    case GGUF_TYPE_ARRAY: return read_array(c, out, depth, key_desc);
    case GGUF_TYPE_BOOL: {
        uint8_t b;
        cellm_status st = cur_read(c, &b, 1, "bool value");
        if (st) return st;
        if (b > 1)
            return err_set(c->err, CELLM_ERR_FORMAT,
                           "%s: bool value at byte offset %zu is %u, not 0 or 1", key_desc, at, b);
        out->v.b = b != 0;
        return CELLM_OK;
    }
    default: {
        size_t sz = gguf_type_size(type);
        if (!sz)
            return err_set(c->err, CELLM_ERR_FORMAT, "%s: value type %u is not a GGUF type",
                           key_desc, (unsigned)type);
        /* All scalar union members start at the union's first byte, and the
         * file and host are both little-endian. */
        return cur_read(c, &out->v, sz, "scalar value");
    }
    }
}

/* --------------------------------------------------------------- reader */

static int cmp_tensor_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static bool str_eq(gguf_str a, gguf_str b) {
    return a.len == b.len && memcmp(a.ptr, b.ptr, (size_t)a.len) == 0;
}

/* A short printable rendering of a name from the file, for messages. */
static const char *name_for_msg(gguf_str s, char *buf, size_t cap) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[i] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    buf[n] = '\0';
    return buf;
}

static cellm_status read_kvs(cursor *c, gguf_file *f) {
    cellm_status st;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        kv->offset = c->pos;
        if ((st = cur_str(c, &kv->key, GGUF_MAX_NAME_LEN, "metadata key"))) return st;
        char name[96];
        name_for_msg(kv->key, name, sizeof name);
        if (kv->key.len == 0)
            return err_set(c->err, CELLM_ERR_FORMAT,
                           "metadata key %llu at byte offset %llu is empty", (unsigned long long)i,
                           (unsigned long long)kv->offset);
        for (uint64_t j = 0; j < i; j++)
            if (str_eq(f->kv[j].key, kv->key))
                return err_set(c->err, CELLM_ERR_FORMAT,
                               "duplicate metadata key '%s' at byte offset %llu", name,
                               (unsigned long long)kv->offset);
        size_t type_at = c->pos;
        uint32_t type = 0;
        if ((st = cur_u32(c, &type, "metadata value type"))) return st;
        if (type >= GGUF_TYPE_COUNT)
            return err_set(c->err, CELLM_ERR_FORMAT,
                           "metadata key '%s': value type %u at byte offset %zu is not a GGUF type",
                           name, type, type_at);
        char desc[128];
        snprintf(desc, sizeof desc, "metadata key '%s'", name);
        if ((st = read_value(c, (gguf_type)type, &kv->value, 0, desc))) return st;
    }
    return CELLM_OK;
}

static cellm_status read_alignment(cursor *c, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_key(f, "general.alignment");
    if (!kv) return CELLM_OK;
    if (kv->value.type != GGUF_TYPE_UINT32)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "general.alignment at byte offset %llu has type %s, expected uint32",
                       (unsigned long long)kv->offset, gguf_type_name(kv->value.type));
    uint32_t a = kv->value.v.u32;
    if (a == 0 || (a & (a - 1)) != 0)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "general.alignment at byte offset %llu is %u, not a power of two",
                       (unsigned long long)kv->offset, a);
    f->alignment = a;
    return CELLM_OK;
}

static cellm_status read_tensor_info(cursor *c, gguf_file *f, uint64_t i) {
    gguf_tensor *t = &f->tensors[i];
    size_t at = c->pos;
    cellm_status st;
    if ((st = cur_str(c, &t->name, GGUF_MAX_NAME_LEN, "tensor name"))) return st;
    char name[96];
    name_for_msg(t->name, name, sizeof name);
    if (t->name.len == 0)
        return err_set(c->err, CELLM_ERR_FORMAT, "tensor %llu at byte offset %zu has an empty name",
                       (unsigned long long)i, at);
    for (uint64_t j = 0; j < i; j++)
        if (str_eq(f->tensors[j].name, t->name))
            return err_set(c->err, CELLM_ERR_FORMAT,
                           "duplicate tensor name '%s' at byte offset %zu", name, at);
    size_t dims_at = c->pos;
    if ((st = cur_u32(c, &t->n_dims, "tensor dimension count"))) return st;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "tensor '%s': dimension count %u at byte offset %zu is not 1..%d", name,
                       t->n_dims, dims_at, GGUF_MAX_DIMS);
    t->n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        size_t ne_at = c->pos;
        if ((st = cur_u64(c, &t->ne[d], "tensor dimension"))) return st;
        if (t->ne[d] > (uint64_t)INT64_MAX)
            return err_set(c->err, CELLM_ERR_FORMAT,
                           "tensor '%s': dimension %u at byte offset %zu is negative", name, d,
                           ne_at);
        if (!u64_mul(t->n_elems, t->ne[d], &t->n_elems) || t->n_elems > (uint64_t)INT64_MAX)
            return err_set(c->err, CELLM_ERR_FORMAT,
                           "tensor '%s': element count overflows at dimension %u (byte offset %zu)",
                           name, d, ne_at);
    }
    size_t type_at = c->pos;
    if ((st = cur_u32(c, &t->type, "tensor type"))) return st;
    const quant_type_info *qi = quant_type_get(t->type);
    if (!qi || qi->internal)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "tensor '%s': type id %u at byte offset %zu is not a known tensor type",
                       name, t->type, type_at);
    if (t->ne[0] % qi->block_size != 0)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "tensor '%s': row length %llu is not a multiple of the %s block size %u "
                       "(byte offset %zu)",
                       name, (unsigned long long)t->ne[0], qi->name, qi->block_size, dims_at);
    if (!quant_nbytes(t->type, t->n_elems, &t->size))
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "tensor '%s': byte size overflows (byte offset %zu)", name, dims_at);
    size_t off_at = c->pos;
    if ((st = cur_u64(c, &t->offset, "tensor data offset"))) return st;
    if (t->offset % f->alignment != 0)
        return err_set(c->err, CELLM_ERR_FORMAT,
                       "tensor '%s': data offset %llu at byte offset %zu is not a multiple of "
                       "the alignment %u",
                       name, (unsigned long long)t->offset, off_at, f->alignment);
    return CELLM_OK;
}

/* Checks every tensor lies inside the data section and none overlap. */
static cellm_status check_tensor_layout(gguf_file *f, cellm_error *err) {
    uint64_t data_size = f->size - f->data_offset;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t end;
        if (!u64_add(t->offset, t->size, &end) || end > data_size) {
            char name[96];
            return err_set(err, CELLM_ERR_FORMAT,
                           "tensor '%s': data [%llu, +%llu) runs past the end of the file "
                           "(data section starts at byte offset %llu and holds %llu bytes)",
                           name_for_msg(t->name, name, sizeof name), (unsigned long long)t->offset,
                           (unsigned long long)t->size, (unsigned long long)f->data_offset,
                           (unsigned long long)data_size);
        }
        t->data = f->base + f->data_offset + t->offset;
    }
    if (f->n_tensors < 2) return CELLM_OK;
    gguf_tensor **order = malloc((size_t)f->n_tensors * sizeof *order);
    if (!order) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory sorting tensors");
    for (uint64_t i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_tensor_offset);
    cellm_status st = CELLM_OK;
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        const gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->size > b->offset) {
            char na[96], nb[96];
            st = err_set(err, CELLM_ERR_FORMAT,
                         "tensors '%s' (data offset %llu, %llu bytes) and '%s' (data offset "
                         "%llu) overlap",
                         name_for_msg(a->name, na, sizeof na), (unsigned long long)a->offset,
                         (unsigned long long)a->size, name_for_msg(b->name, nb, sizeof nb),
                         (unsigned long long)b->offset);
            break;
        }
    }
    free(order);
    return st;
}

static cellm_status parse(gguf_file *f, cellm_error *err) {
    cursor c = {f->base, f->size, 0, err};
    cellm_status st;
    if (!host_is_little_endian())
        return err_set(err, CELLM_ERR_UNSUPPORTED, "GGUF reading needs a little-endian host");
    uint32_t magic;
    if (f->size < 4)
        return err_set(err, CELLM_ERR_FORMAT,
                       "not a GGUF file: %zu bytes is too short for the magic at byte offset 0",
                       f->size);
    if ((st = cur_u32(&c, &magic, "magic"))) return st;
    if (magic != GGUF_MAGIC)
        return err_set(err, CELLM_ERR_FORMAT,
                       "not a GGUF file: magic at byte offset 0 is %02x %02x %02x %02x, expected "
                       "\"GGUF\"",
                       f->base[0], f->base[1], f->base[2], f->base[3]);
    if ((st = cur_u32(&c, &f->version, "version"))) return st;
    if (f->version == 1)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "GGUF version 1 (byte offset 4) is not supported; convert the file to v3");
    if (f->version != 2 && f->version != 3) {
        uint32_t swapped = __builtin_bswap32(f->version);
        if (swapped == 2 || swapped == 3)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "big-endian GGUF files are not supported (version at byte offset 4)");
        return err_set(err, CELLM_ERR_FORMAT, "GGUF version %u at byte offset 4 is not 2 or 3",
                       f->version);
    }
    if ((st = cur_u64(&c, &f->n_tensors, "tensor count"))) return st;
    if ((st = cur_u64(&c, &f->n_kv, "metadata count"))) return st;
    /* Every key-value pair takes at least 8 (key length) + 1 (key) + 4
     * (type) + 1 (value) bytes and every tensor info at least 8 + 1 + 4 +
     * 8 + 4 + 8; a count that cannot fit in what is left is an error
     * before any memory is allocated for it. */
    if (f->n_kv > cur_left(&c) / 14)
        return err_set(err, CELLM_ERR_FORMAT,
                       "metadata count %llu at byte offset 16 cannot fit in the %zu bytes left",
                       (unsigned long long)f->n_kv, cur_left(&c));
    if (f->n_tensors > cur_left(&c) / 33)
        return err_set(err, CELLM_ERR_FORMAT,
                       "tensor count %llu at byte offset 8 cannot fit in the %zu bytes left",
                       (unsigned long long)f->n_tensors, cur_left(&c));
    if (f->n_kv && !(f->kv = calloc((size_t)f->n_kv, sizeof *f->kv)))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for %llu metadata entries",
                       (unsigned long long)f->n_kv);
    if ((st = read_kvs(&c, f))) return st;
    if ((st = read_alignment(&c, f))) return st;
    if (f->n_tensors && !(f->tensors = calloc((size_t)f->n_tensors, sizeof *f->tensors)))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for %llu tensors",
                       (unsigned long long)f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((st = read_tensor_info(&c, f, i))) return st;
    /* The data section starts at the next multiple of the alignment. */
    uint64_t data = c.pos, rem = data % f->alignment;
    if (rem) data += f->alignment - rem;
    if (f->n_tensors == 0) {
        f->data_offset = data < f->size ? data : f->size;
        return CELLM_OK;
    }
    if (data > f->size)
        return err_set(err, CELLM_ERR_FORMAT,
                       "truncated file: the tensor data section should start at byte offset "
                       "%llu but the file has %zu bytes",
                       (unsigned long long)data, f->size);
    f->data_offset = data;
    return check_tensor_layout(f, err);
}

static void file_free(gguf_file *f) {
    if (!f) return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) value_free(&f->kv[i].value);
    free(f->kv);
    free(f->tensors);
    if (f->mapped && f->base) munmap((void *)f->base, f->size);
    free(f);
}

void gguf_close(gguf_file *f) {
    file_free(f);
}

cellm_status gguf_open_memory(const void *buf, size_t size, gguf_file **out, cellm_error *err) {
    if (!out || (!buf && size))
        return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_open_memory: NULL argument");
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    f->base = buf;
    f->size = size;
    cellm_status st = parse(f, err);
    if (st) {
        file_free(f);
        return st;
    }
    *out = f;
    return CELLM_OK;
}

cellm_status gguf_open(const char *path, gguf_file **out, cellm_error *err) {
    if (!path || !out) return err_set(err, CELLM_ERR_INVALID_ARG, "gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, CELLM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return err_set(err, CELLM_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return err_set(err, CELLM_ERR_IO, "'%s' is not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return err_set(err, CELLM_ERR_FORMAT, "'%s' is empty (0 bytes), not a GGUF file", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return err_set(err, CELLM_ERR_UNSUPPORTED, "'%s' is too large to map", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return err_set(err, CELLM_ERR_IO, "cannot map '%s': %s", path, strerror(e));
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(map, size);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    f->base = map;
    f->size = size;
    f->mapped = true;
    cellm_status st = parse(f, err);
    if (st) {
        /* Say which file it was; the parser's message names the field. */
        if (err) {
            char msg[CELLM_ERR_MSG_MAX];
            memcpy(msg, err->msg, sizeof msg);
            err_set(err, st, "%s: %.400s", path, msg);
        }
        file_free(f);
        return st;
    }
    *out = f;
    return CELLM_OK;
}

/* -------------------------------------------------------------- lookups */

const gguf_kv *gguf_find_key(const gguf_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

bool gguf_value_as_int(const gguf_value *v, int64_t *out) {
    switch (v->type) {
    case GGUF_TYPE_UINT8: *out = v->v.u8; return true;
    case GGUF_TYPE_INT8: *out = v->v.i8; return true;
    case GGUF_TYPE_UINT16: *out = v->v.u16; return true;
    case GGUF_TYPE_INT16: *out = v->v.i16; return true;
    case GGUF_TYPE_UINT32: *out = v->v.u32; return true;
    case GGUF_TYPE_INT32: *out = v->v.i32; return true;
    case GGUF_TYPE_INT64: *out = v->v.i64; return true;
    case GGUF_TYPE_UINT64:
        if (v->v.u64 > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v->v.u64;
        return true;
    default: return false;
    }
}

bool gguf_value_as_uint(const gguf_value *v, uint64_t *out) {
    if (v->type == GGUF_TYPE_UINT64) {
        *out = v->v.u64;
        return true;
    }
    int64_t i;
    if (!gguf_value_as_int(v, &i) || i < 0) return false;
    *out = (uint64_t)i;
    return true;
}

bool gguf_value_as_float(const gguf_value *v, double *out) {
    if (v->type == GGUF_TYPE_FLOAT32) {
        *out = v->v.f32;
        return true;
    }
    if (v->type == GGUF_TYPE_FLOAT64) {
        *out = v->v.f64;
        return true;
    }
    return false;
}

bool gguf_get_uint(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = gguf_find_key(f, key);
    return kv && gguf_value_as_uint(&kv->value, out);
}

bool gguf_get_int(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find_key(f, key);
    return kv && gguf_value_as_int(&kv->value, out);
}

bool gguf_get_float(const gguf_file *f, const char *key, double *out) {
    const gguf_kv *kv = gguf_find_key(f, key);
    return kv && gguf_value_as_float(&kv->value, out);
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
    const gguf_kv *kv = gguf_find_key(f, key);
    if (!kv || kv->value.type != GGUF_TYPE_BOOL) return false;
    *out = kv->value.v.b;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find_key(f, key);
    if (!kv || kv->value.type != GGUF_TYPE_STRING) return false;
    *out = kv->value.v.str;
    return true;
}

const gguf_value *gguf_get_arr(const gguf_file *f, const char *key) {
    const gguf_kv *kv = gguf_find_key(f, key);
    return kv && kv->value.type == GGUF_TYPE_ARRAY ? &kv->value : NULL;
}

/* Element i of a fixed-size array as a standalone scalar value. */
static bool arr_elem(const gguf_value *arr, uint64_t i, gguf_value *out) {
    if (arr->type != GGUF_TYPE_ARRAY || i >= arr->v.arr.n) return false;
    size_t sz = gguf_type_size(arr->v.arr.type);
    if (!sz || !arr->v.arr.data) return false;
    out->type = arr->v.arr.type;
    memset(&out->v, 0, sizeof out->v);
    memcpy(&out->v, (const uint8_t *)arr->v.arr.data + i * sz, sz);
    return true;
}

bool gguf_arr_get_int(const gguf_value *arr, uint64_t i, int64_t *out) {
    gguf_value v;
    return arr_elem(arr, i, &v) && gguf_value_as_int(&v, out);
}

bool gguf_arr_get_float(const gguf_value *arr, uint64_t i, double *out) {
    gguf_value v;
    return arr_elem(arr, i, &v) && gguf_value_as_float(&v, out);
}
