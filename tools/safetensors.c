/*
 * safetensors.c — the safetensors reader (see safetensors.h). The header is
 * parsed with cJSON; each entry is checked and the entries are sorted by
 * offset so overlaps show up as neighbours.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "format/kernels/fp16.h"

static const struct {
    const char *name;
    uint32_t bytes;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2},   [ST_BF16] = {"BF16", 2}, [ST_F64] = {"F64", 8},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4},   [ST_I16] = {"I16", 2},   [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},
};

const char *safetensors_dtype_name(safetensors_dtype t) {
    return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].name : "?";
}

void safetensors_close(safetensors_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->mapped && f->base) munmap((void *)f->base, f->size);
    free(f);
}

/* A JSON number that is a whole number in [0, max]. */
static bool json_u64(const cJSON *j, uint64_t max, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d > (double)max || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static int by_offset(const void *a, const void *b) {
    const safetensors_tensor *x = a, *y = b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->size < y->size ? -1 : x->size > y->size;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const safetensors_tensor *)a)->name, ((const safetensors_tensor *)b)->name);
}

/* Parses one header entry into `t`. */
static cellm_status parse_entry(const cJSON *e, const uint8_t *data, uint64_t data_size,
                                safetensors_tensor *t, cellm_error *err) {
    const char *nm = e->string;
    if (!cJSON_IsObject(e))
        return err_set(err, CELLM_ERR_FORMAT, "safetensors: entry '%.200s' is not an object", nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
        return err_set(err, CELLM_ERR_FORMAT,
                       "safetensors: tensor '%.200s' needs dtype, shape and data_offsets", nm);
    int d = 0;
    for (; d < ST_DTYPE_COUNT; d++)
        if (!strcmp(dt->valuestring, dtypes[d].name)) break;
    if (d == ST_DTYPE_COUNT)
        return err_set(err, CELLM_ERR_UNSUPPORTED, "safetensors: tensor '%.200s' has dtype '%.32s'",
                       nm, dt->valuestring);
    t->dtype = (safetensors_dtype)d;
    int nd = cJSON_GetArraySize(sh);
    if (nd > SAFETENSORS_MAX_DIMS)
        return err_set(err, CELLM_ERR_FORMAT, "safetensors: tensor '%.200s' has %d dimensions", nm,
                       nd);
    t->n_dims = (uint32_t)nd;
    uint64_t n = 1;
    for (int i = 0; i < nd; i++) {
        if (!json_u64(cJSON_GetArrayItem(sh, i), (uint64_t)1 << 53, &t->shape[i]) ||
            !u64_mul(n, t->shape[i], &n))
            return err_set(err, CELLM_ERR_FORMAT,
                           "safetensors: tensor '%.200s': shape[%d] is not a size, or the "
                           "shape's product overflows",
                           nm, i);
    }
    t->n_elems = n;
    uint64_t b, en, bytes;
    if (cJSON_GetArraySize(off) != 2 || !json_u64(cJSON_GetArrayItem(off, 0), UINT64_MAX, &b) ||
        !json_u64(cJSON_GetArrayItem(off, 1), UINT64_MAX, &en))
        return err_set(err, CELLM_ERR_FORMAT,
                       "safetensors: tensor '%.200s': data_offsets is not [begin, end]", nm);
    if (b > en || en > data_size)
        return err_set(err, CELLM_ERR_FORMAT,
                       "safetensors: tensor '%.200s': data_offsets [%llu, %llu] are outside the "
                       "%llu bytes of data",
                       nm, (unsigned long long)b, (unsigned long long)en,
                       (unsigned long long)data_size);
    if (!u64_mul(n, dtypes[d].bytes, &bytes) || bytes != en - b)
        return err_set(err, CELLM_ERR_FORMAT,
                       "safetensors: tensor '%.200s': %llu bytes of data for %llu %s elements", nm,
                       (unsigned long long)(en - b), (unsigned long long)n, dtypes[d].name);
    t->size = bytes;
    t->data = data + b;
    return CELLM_OK;
}

cellm_status safetensors_open_memory(const void *buf, size_t size, safetensors_file **out,
                                     cellm_error *err) {
    *out = NULL;
    const uint8_t *p = buf;
    if (size < 8) return err_set(err, CELLM_ERR_FORMAT, "safetensors: file of %zu bytes", size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | p[i];
    if (hl < 2 || hl > SAFETENSORS_MAX_HEADER || hl > size - 8)
        return err_set(err, CELLM_ERR_FORMAT,
                       "safetensors: header length %llu does not fit the file (%zu bytes, "
                       "limit %u)",
                       (unsigned long long)hl, size, SAFETENSORS_MAX_HEADER);
    safetensors_file *f = calloc(1, sizeof *f);
    if (!f) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    f->base = p;
    f->size = size;
    cellm_status st = CELLM_OK;
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hl);
    if (!cJSON_IsObject(root)) {
        st = err_set(err, CELLM_ERR_FORMAT, "safetensors: the header is not a JSON object");
        goto done;
    }
    const uint8_t *data = p + 8 + hl;
    uint64_t data_size = size - 8 - hl;
    int count = cJSON_GetArraySize(root);
    f->tensors = calloc(count > 0 ? (size_t)count : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!e->string) continue;
        if (!strcmp(e->string, "__metadata__")) continue;
        safetensors_tensor *t = &f->tensors[f->n];
        if ((st = parse_entry(e, data, data_size, t, err))) goto done;
        if (!(t->name = strdup(e->string))) {
            st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        f->n++;
    }
    /* No two tensors may share bytes (empty tensors take none). */
    safetensors_tensor *sorted = malloc((f->n ? f->n : 1) * sizeof *sorted);
    if (!sorted) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    memcpy(sorted, f->tensors, f->n * sizeof *sorted);
    qsort(sorted, f->n, sizeof *sorted, by_offset);
    const safetensors_tensor *prev = NULL;
    for (size_t i = 0; i < f->n && !st; i++) {
        if (!sorted[i].size) continue;
        if (prev && sorted[i].data < prev->data + prev->size)
            st = err_set(err, CELLM_ERR_FORMAT,
                         "safetensors: tensors '%.200s' and '%.200s' overlap in the data",
                         prev->name, sorted[i].name);
        prev = &sorted[i];
    }
    free(sorted);
    /* Sorted by name for lookups; a name twice makes the file ambiguous. */
    qsort(f->tensors, f->n, sizeof *f->tensors, by_name);
    for (size_t i = 1; i < f->n && !st; i++)
        if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name))
            st = err_set(err, CELLM_ERR_FORMAT, "safetensors: tensor '%.200s' appears twice",
                         f->tensors[i].name);
done:
    cJSON_Delete(root);
    if (st) {
        safetensors_close(f);
        return st;
    }
    *out = f;
    return CELLM_OK;
}

cellm_status safetensors_open(const char *path, safetensors_file **out, cellm_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return err_set(err, CELLM_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 8) {
        close(fd);
        return err_set(err, CELLM_ERR_FORMAT, "%s: not a safetensors file (too short)", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return err_set(err, CELLM_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    cellm_status st = safetensors_open_memory(map, size, out, err);
    if (st) {
        munmap(map, size);
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return err_set(err, st, "%s: %s", path, msg);
    }
    (*out)->mapped = true;
    return CELLM_OK;
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    safetensors_tensor key = {.name = (char *)name};
    return f->n ? bsearch(&key, f->tensors, f->n, sizeof key, by_name) : NULL;
}

bool safetensors_to_float(const safetensors_tensor *t, uint64_t i0, uint64_t n, float *out) {
    if (i0 > t->n_elems || n > t->n_elems - i0) return false;
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32: memcpy(out, p + i0 * 4, (size_t)n * 4); return true;
    case ST_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + (i0 + i) * 2, 2);
            out[i] = fp16_to_fp32(h);
        }
        return true;
    case ST_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + (i0 + i) * 2, 2);
            out[i] = bf16_to_fp32(h);
        }
        return true;
    default: return false;
    }
}
