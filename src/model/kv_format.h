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
    /* n / 2 bytes of 4-bit codes with no scale, each 32 in Q4_0's order
     * (byte j: element j low, j + 16 high): x = q - 8. The rows of keys
     * rounded per channel (KV_KC4_*): the channels' steps and minimums are
     * in the block's metadata, and the attention folds them into the query. */
    KV_FMT_C4,
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
    case KV_FMT_C4: return n / 2;
    default: return n * sizeof(uint16_t);
    }
}

/* Keys rounded per channel (KIVI's keys), for the type k4cv4hw: once a
 * block's 16 positions are written, each channel c of each head is rounded
 * over them, asymmetric: x = mn[c] + st[c] * q, q in 0..15, and the 16
 * rows of codes (KV_FMT_C4, as q - 8 with the +8 in the minimum) go where
 * the block's K rows are. Each head's metadata follows the 16 rows of
 * every head:
 *   u16 mref, dref (f16): the head's steps of the channel's minimum and step
 *   u8 st[hd / 2]: channel c's step code s (0..15) in byte c / 2, low
 *                  nibble for even c: st[c] = dref * (s + 1) / 16
 *   u8 mn[3 * hd / 8]: channel c's minimum code m (-4..3) as m + 4 in bits
 *                  3c..3c+2 of the little-endian bit string: mn[c] = mref * m
 * 4 + 7 hd / 8 bytes; with the codes 4.47 bits a key value at hd 64 and
 * 4.45 at hd 256. */
#define KV_BLOCK_POSITIONS 16 /* a cache block's positions (kv_cache.h's KV_BLOCK_TOKENS) */
static inline size_t kv_kc4_meta_bytes(size_t hd) {
    return 4 + 7 * hd / 8;
}

#endif /* CELLM_KV_FORMAT_H */
