/*
 * vk_matmul.h — the matrix products of the Vulkan backend: weights as the
 * GGUF file stores them (uploaded once), f32 activation rows in and f32
 * output rows out, recorded into a step's command buffer (vk_device.h).
 * Batch-invariant like the CPU's matmul: a row's outputs have the same bits
 * whatever other rows share the dispatch (docs/gpu.md).
 */
#ifndef CELLM_VK_MATMUL_H
#define CELLM_VK_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "vulkan/vk_device.h"

/* True when vk_matmul takes weights of this GGML type id (F32, F16, Q4_0,
 * Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K). */
bool vk_matmul_supports(uint32_t type);

/* Whether matmuls on d take the variant with one invocation per output
 * (no barriers): on a CPU-emulated device, or as $CELLM_VK_MATMUL says
 * ("lane" or "coop": tests run both on one device). */
bool vk_matmul_lane_variant(const vk_device *d);

/* Whether matmuls round their activations as the CPU's matmul does before
 * its integer dot products (8-bit blocks of 32 against the 32-element
 * types, of 256 against the K-quants, F16 against F16 weights), the CPU's
 * arithmetic: with $CELLM_VK_ACT=q8. By default they multiply the f32
 * activations as they are (transformers' arithmetic, and the nearer to
 * it: docs/gpu.md). Read at each pipeline's choice. */
bool vk_matmul_rounds_activations(void);

/* Whether matmuls of n_rows activation rows on d take the tiled form
 * (matmul.comp -DTILED; the same bits as any other batch): prompts, past
 * 128 rows ($CELLM_VK_MM_TILED: 0 never, 1 past 8 rows), on devices that
 * take the cooperative form, with the activations as they are (not with
 * $CELLM_VK_ACT=q8). Its GLU input would compute each activation once per
 * tile of outputs: for such batches the forward pass computes it first. */
bool vk_matmul_tiled(const vk_device *d, uint32_t n_rows);

/* One matrix product, its operands given as buffer + byte offset:
 *   y[r * y_stride + o] = sum_i W[o][i] * x[r * x_stride + i]
 * for r < n_rows and o < rows, where W is `rows` rows of `cols` elements of
 * `type` (cols a whole number of the type's blocks) starting at w_off, and
 * x and y are f32 (x_off, y_off multiples of 4). The shader's pipeline is
 * made on first use. Records nothing else: put a vk_recorder_barrier
 * between it and what reads y. */
typedef struct vk_matmul_args {
    uint32_t type;
    const vk_buffer *w;
    size_t w_off;
    uint32_t rows, cols;
    const vk_buffer *x;
    size_t x_off;
    uint32_t x_stride; /* floats between activation rows; 0: cols */
    const vk_buffer *y;
    size_t y_off;
    uint32_t y_stride; /* floats between output rows; 0: rows */
    uint32_t n_rows;
    /* With u: the activation rows are act(x) * u, u laid out as x (same
     * offset and stride), act SiLU (act 0) or GELU (1) as act.glsl
     * computes them; not on devices that take the lane variant. */
    const vk_buffer *u;
    uint32_t act;
} vk_matmul_args;

cellm_status vk_matmul_record(vk_recorder *rec, const vk_matmul_args *a, cellm_error *err);

/* Makes now the pipelines vk_matmul_record would make on first use for
 * `type` weights of `cols` columns on this device (one row and a batch;
 * with `glu`, the GLU input form with activation `act` instead), so that a
 * first request does not wait for the driver's compiler. */
cellm_status vk_matmul_prepare(vk_device *d, uint32_t type, uint32_t cols, bool glu, uint32_t act,
                               cellm_error *err);

/* vk_matmul_record with packed rows (strides cols and rows). */
cellm_status vk_matmul(vk_recorder *rec, uint32_t type, const vk_buffer *w, size_t w_off,
                       uint32_t rows, uint32_t cols, const vk_buffer *x, size_t x_off,
                       const vk_buffer *y, size_t y_off, uint32_t n_rows, cellm_error *err);

#endif /* CELLM_VK_MATMUL_H */
