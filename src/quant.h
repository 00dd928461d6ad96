/*
 * quant.h — the table of tensor types. One row per GGML type id: its name,
 * how many elements make a block and how many bytes a block takes. The GGUF
 * reader uses it to size tensors; the kernels add conversion and dot-product
 * functions to the same rows. Nothing else switches on the type.
 */
#ifndef CELLM_QUANT_H
#define CELLM_QUANT_H

#include <stdbool.h>
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
    QT_COUNT = 40 /* one past the largest id in the table */
} quant_type;

typedef struct quant_type_info {
    const char *name;    /* "Q4_K", as GGML names it */
    uint32_t block_size; /* elements per block */
    uint32_t type_size;  /* bytes per block */
} quant_type_info;

/* The row for a type id, or NULL when the id is not a known type. */
const quant_type_info *quant_type_get(uint32_t type);

/* The row for a name ("q4_k" or "Q4_K"), or NULL. Sets *type. */
const quant_type_info *quant_type_by_name(const char *name, uint32_t *type);

/* Bytes taken by `n` elements of `type`. False when the type is unknown,
 * `n` is not a whole number of blocks, or the size overflows. */
bool quant_nbytes(uint32_t type, uint64_t n, uint64_t *bytes);

#endif /* CELLM_QUANT_H */
