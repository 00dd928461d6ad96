/*
 * safetensors.h — read a Hugging Face safetensors file (what `cellm
 * convert` reads weights from). The format: an 8-byte little-endian header
 * length N, N bytes of JSON mapping each tensor name to its dtype, shape
 * and [begin, end) byte offsets into the data that follows, then the data.
 *
 * Nothing in the file is trusted, as with GGUF: the header length, the
 * JSON, every dtype, shape and offset is checked (offsets in range, sizes
 * agreeing with dtype and shape, no two tensors overlapping) before a
 * tensor is handed out, and a bad file is an error naming the tensor and
 * the field. Allocation is bounded by the header's size.
 */
#ifndef CELLM_SAFETENSORS_H
#define CELLM_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_MAX_HEADER (100u << 20) /* the reference reader's limit */

typedef enum safetensors_dtype {
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U8,
    ST_BOOL,
    ST_DTYPE_COUNT
} safetensors_dtype;

typedef struct safetensors_tensor {
    char *name;
    safetensors_dtype dtype;
    uint32_t n_dims;
    uint64_t shape[SAFETENSORS_MAX_DIMS]; /* outermost first, as in the file */
    uint64_t n_elems;
    uint64_t size;       /* bytes */
    const uint8_t *data; /* into the map */
} safetensors_tensor;

typedef struct safetensors_file {
    size_t n;
    safetensors_tensor *tensors;
    const uint8_t *base;
    size_t size;
    bool mapped;
} safetensors_file;

/* Maps and parses the file at `path`; free with safetensors_close(). */
cellm_status safetensors_open(const char *path, safetensors_file **out, cellm_error *err);
/* Parses a file already in memory (borrowed: it must outlive the result). */
cellm_status safetensors_open_memory(const void *buf, size_t size, safetensors_file **out,
                                     cellm_error *err);
void safetensors_close(safetensors_file *f);

/* The tensor called `name`, or NULL. */
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);

/* "F32", "BF16", ... */
const char *safetensors_dtype_name(safetensors_dtype t);

/* Converts element range [i0, i0 + n) of a F32, F16 or BF16 tensor to
 * float. False for other dtypes. */
bool safetensors_to_float(const safetensors_tensor *t, uint64_t i0, uint64_t n, float *out);

#endif /* CELLM_SAFETENSORS_H */
