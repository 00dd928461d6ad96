/*
 * quant.h — the table of tensor types. One row per GGML type id: its name,
 * how many elements make a block, how many bytes a block takes, and the
 * kernels that work on it: to_float, from_float and the dot product against
 * the activation type it pairs with. The GGUF reader uses the sizes; the
 * forward pass uses the kernels. Nothing else switches on the type.
 *
 * A matrix-vector product with a weight matrix of type T is: quantize the
 * activation row once with the from_float of T's vec_dot_type, then call
 * T's vec_dot once per weight row. The kernels in the table are the best
 * variant this CPU runs (AVX2 and so on), chosen once on first use of the
 * table; every variant is tested against the scalar reference
 * (src/format/kernels/ref.c). See docs/kernels.md.
 */
#ifndef CELLM_QUANT_H
#define CELLM_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GGML type ids as GGUF stores them (gaps are ids GGML retired). */
typedef enum quant_type {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q8_1 = 9,
    QT_Q2_K = 10,
    QT_Q3_K = 11,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_Q8_K = 15,
    QT_IQ2_XXS = 16,
    QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18,
    QT_IQ1_S = 19,
    QT_IQ4_NL = 20,
    QT_IQ3_S = 21,
    QT_IQ2_S = 22,
    QT_IQ4_XS = 23,
    QT_I8 = 24,
    QT_I16 = 25,
    QT_I32 = 26,
    QT_I64 = 27,
    QT_F64 = 28,
    QT_IQ1_M = 29,
    QT_BF16 = 30,
    QT_TQ1_0 = 34,
    QT_TQ2_0 = 35,
    QT_MXFP4 = 39,
    /* cellm's own activation formats (kernels/blocks.h), never in files:
     * ids past GGML's, refused by the GGUF reader. */
    QT_A8 = 40,
    QT_A8S = 41,
    QT_COUNT = 42 /* one past the largest id in the table */
} quant_type;

/* Kernel signatures. `n` counts elements and must be a whole number of the
 * type's blocks; blocks need only the alignment GGUF gives them. Kernels
 * keep no pointers, allocate nothing and are safe to call from any thread. */
typedef void (*quant_to_float_fn)(const void *src, float *dst, size_t n);
typedef void (*quant_from_float_fn)(const float *src, void *dst, size_t n);
/* Dot product of x (a row of this type) and y (a row of vec_dot_type). */
typedef float (*quant_vec_dot_fn)(size_t n, const void *x, const void *y);
/* Several dot products at once, for matmul: out[i] = vec_dot(n, x, y + i *
 * ys), one weight row against four (or eight) activation rows; xs is
 * the weight rows' stride, used by the tiles of two weight rows. Each
 * out[i] is bit-identical to what vec_dot returns for the same pair: the
 * tile only shares loads and unpacking between the four, never changes the
 * arithmetic of one. That keeps a row's result independent of the batch
 * (DESIGN.md: batch-invariant). */
typedef void (*quant_vec_dot4_fn)(size_t n, const void *x, size_t xs, const void *y, size_t ys,
                                  float *out);

/* Weight rows x + w * xs, w < 2 * pairs, by eight activation rows (y + i *
 * ys): out[i * os + w]. */
typedef void (*quant_dot8_x2_fn)(size_t n, const void *x, size_t xs, size_t pairs, const void *y,
                                 size_t ys, float *out, size_t os);

typedef struct quant_type_info {
    const char *name;    /* "Q4_K", as GGML names it */
    uint32_t block_size; /* elements per block */
    uint32_t type_size;  /* bytes per block */
    /* Kernels; NULL where the type has none (integer types, and quant
     * types cellm does not compute with yet: only their sizes are known). */
    quant_to_float_fn to_float;
    quant_from_float_fn from_float;
    quant_vec_dot_fn vec_dot;
    uint32_t vec_dot_type; /* type of vec_dot's y; meaningful when vec_dot is set */
    /* A tile of vec_dot (see quant_vec_dot4_fn) of four activation rows,
     * NULL where the variant has none. */
    quant_vec_dot4_fn dot4_y;
    /* dot4_y's tile of eight activation rows (out[8]), NULL where none. */
    quant_vec_dot4_fn dot8_y;
    /* dot8_y on `pairs` pairs of weight rows, x + w * xs for w < 2 *
     * pairs, written straight into a matmul's output: out[i * os + w] is
     * vec_dot(n, x + w * xs, y + i * ys). NULL where none. */
    quant_dot8_x2_fn dot8_y_x2;
    bool internal; /* an activation format of cellm's own: no file holds it */
} quant_type_info;

/* The row for a type id, or NULL when the id is not a known type. The row
 * is never modified after it is returned. Thread-safe; the first call picks
 * the kernels for this CPU. */
const quant_type_info *quant_type_get(uint32_t type);

/* The row for a name ("q4_k" or "Q4_K"), or NULL. Sets *type. */
const quant_type_info *quant_type_by_name(const char *name, uint32_t *type);

/* Bytes taken by `n` elements of `type`. False when the type is unknown,
 * `n` is not a whole number of blocks, or the size overflows. */
bool quant_nbytes(uint32_t type, uint64_t n, uint64_t *bytes);

/* Which kernel variant the table holds: "ref", "avx2", … (for logs and
 * benchmarks). Thread-safe. The best this CPU runs, unless $CELLM_KERNELS
 * asks for "ref" (scalar) or "avx2" (no AVX-512) when first used; every
 * variant computes the same bits. */
const char *quant_kernels_name(void);

#endif /* CELLM_QUANT_H */
