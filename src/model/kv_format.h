/*
 * kv_format.h — how the KV cache stores one row of K or V: f16, or the
 * 32-element Q8_0 / Q4_0 / Q5_0 blocks of format/kernels/blocks.h, each
 * head's blocks in order. The cache (kv_cache.h) sizes its blocks with it;
 * each backend's attention kernels read and write rows in it (the CPU's in
 * cpu/attention.h).
 */
#ifndef CELLM_KV_FORMAT_H
#define CELLM_KV_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "format/kernels/blocks.h"

typedef enum kv_format {
    KV_FMT_F16,  /* n f16 values */
    KV_FMT_Q8_0, /* n / 32 Q8_0 blocks: x = d * q, q in -127..127 */
    KV_FMT_Q4_0, /* n / 32 Q4_0 blocks: x = d * (q - 8), q in 0..15 */
    KV_FMT_Q5_0, /* n / 32 Q5_0 blocks: x = d * (q - 16), q in 0..31 */
    KV_FMT_Q3_0, /* n / 32 3-bit blocks (block_q3_0): x = d * (q - 4), q in 0..7 */
    KV_FMT_COUNT
} kv_format;

/* Bytes of n elements in `format` (n a multiple of 32 for the quantized
 * formats). A head of a row starts kv_row_bytes(format, head_dim) bytes
 * after the previous one. */
static inline size_t kv_row_bytes(kv_format format, size_t n) {
    switch (format) {
    case KV_FMT_Q8_0: return n / QK8_0 * sizeof(block_q8_0);
    case KV_FMT_Q4_0: return n / QK4_0 * sizeof(block_q4_0);
    case KV_FMT_Q5_0: return n / QK5_0 * sizeof(block_q5_0);
    case KV_FMT_Q3_0: return n / QK3_0 * sizeof(block_q3_0);
    default: return n * sizeof(uint16_t);
    }
}

#endif /* CELLM_KV_FORMAT_H */
