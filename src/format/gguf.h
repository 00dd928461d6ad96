/*
 * gguf.h — the GGUF container: read (v2 and v3, little-endian) and write.
 *
 * A file is mapped read-only; metadata values, key names, tensor names and
 * tensor data are views into the map and live as long as the gguf_file.
 * Nothing in the file is trusted: every count, length, type id, shape, offset
 * and size is checked before use, and a bad file is an error whose message
 * names the field and its byte offset. Allocation is bounded by the file's
 * size, so no input can make the reader allocate without bound.
 */
#ifndef CELLM_GGUF_H
#define CELLM_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_ARRAY_DEPTH 8   /* arrays of arrays nest at most this deep */
#define GGUF_MAX_NAME_LEN 65535u /* longest key or tensor name accepted */

/* Metadata value types, with GGUF's ids. */
typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

/* A string: `len` bytes at `ptr`, not NUL-terminated. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

/* A metadata value. Arrays keep their elements in one of three forms,
 * chosen by the element type: fixed-size scalars as raw little-endian bytes
 * at `data` (read them with the gguf_arr_get_* functions; they may be
 * unaligned), strings in `strs`, nested arrays in `items`. */
typedef struct gguf_value {
    gguf_type type;
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        bool b;
        uint64_t u64;
        int64_t i64;
        double f64;
        gguf_str str;
        struct {
            gguf_type type; /* element type */
            uint64_t n;     /* element count */
            const void *data;
            gguf_str *strs;
            struct gguf_value *items;
        } arr;
    } v;
} gguf_value;

typedef struct gguf_kv {
    gguf_str key;
    gguf_value value;
    uint64_t offset; /* byte offset of the key in the file */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t type;              /* a quant_type id */
    uint32_t n_dims;            /* 1..GGUF_MAX_DIMS */
    uint64_t ne[GGUF_MAX_DIMS]; /* elements per dimension, ne[0] innermost; unused = 1 */
    uint64_t n_elems;
    uint64_t offset;  /* from the start of the data section */
    uint64_t size;    /* bytes */
    const void *data; /* into the map */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    uint64_t data_offset; /* start of the tensor data section */
    const uint8_t *base;  /* the whole file */
    size_t size;
    bool mapped; /* base came from mmap and is unmapped on close */
} gguf_file;

/* Maps and parses the file at `path`. On success *out owns the map; free it
 * with gguf_close(). On failure *out is NULL and `err` says why. */
cellm_status gguf_open(const char *path, gguf_file **out, cellm_error *err);

/* Parses a file already in memory. The buffer is borrowed: it must outlive
 * the returned gguf_file. */
cellm_status gguf_open_memory(const void *buf, size_t size, gguf_file **out, cellm_error *err);

/* Frees everything gguf_open allocated and unmaps the file. NULL is fine. */
void gguf_close(gguf_file *f);

/* Lookups. Return NULL when absent. */
const gguf_kv *gguf_find_key(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters over metadata. Integers of any width and signedness convert
 * when the value fits; floats of either width convert to double. They return
 * false when the key is absent or the value has another type. */
bool gguf_get_uint(const gguf_file *f, const char *key, uint64_t *out);
bool gguf_get_int(const gguf_file *f, const char *key, int64_t *out);
bool gguf_get_float(const gguf_file *f, const char *key, double *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* The array value under `key` (any element type), or NULL. */
const gguf_value *gguf_get_arr(const gguf_file *f, const char *key);

/* Scalar value conversions, as the getters above. */
bool gguf_value_as_int(const gguf_value *v, int64_t *out);
bool gguf_value_as_uint(const gguf_value *v, uint64_t *out);
bool gguf_value_as_float(const gguf_value *v, double *out);

/* Element i of an array of fixed-size scalars, converted as above. */
bool gguf_arr_get_int(const gguf_value *arr, uint64_t i, int64_t *out);
bool gguf_arr_get_float(const gguf_value *arr, uint64_t i, double *out);

/* Bytes one element of a fixed-size type takes; 0 for string and array. */
size_t gguf_type_size(gguf_type t);
/* "uint32", "string", ...; "?" for an unknown id. */
const char *gguf_type_name(gguf_type t);

/* True when `s` equals the C string `c`. */
bool gguf_str_eq(gguf_str s, const char *c);

/* ---- writing ---- */

typedef struct gguf_writer gguf_writer;

/* A new, empty writer (GGUF v3, alignment 32 unless general.alignment is
 * set as a uint32). NULL when out of memory. */
gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);

/* Sets `key` to a deep copy of `v` (replacing an earlier value of the same
 * key, keeping its position). Views into a reader's map are fine. */
cellm_status gguf_writer_set(gguf_writer *w, const char *key, const gguf_value *v,
                             cellm_error *err);
cellm_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t x, cellm_error *err);
cellm_status gguf_writer_set_f32(gguf_writer *w, const char *key, float x, cellm_error *err);
cellm_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s, cellm_error *err);

/* Adds a tensor. `data` is borrowed, not copied: it must stay valid until
 * gguf_writer_write*() returns. Its size follows from type and shape. */
cellm_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *ne, const void *data,
                                    cellm_error *err);

/* Writes the file: to `path` through a temporary file renamed into place,
 * so a failed write never leaves a file that looks complete. */
cellm_status gguf_writer_write(gguf_writer *w, const char *path, cellm_error *err);
/* Writes into a new malloc'd buffer the caller frees. */
cellm_status gguf_writer_write_mem(gguf_writer *w, uint8_t **buf, size_t *size, cellm_error *err);

#endif /* CELLM_GGUF_H */
