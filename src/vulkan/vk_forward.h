/*
 * vk_forward.h — the Vulkan backend behind the seam (model/backend.h): a
 * model's forward pass recorded as one command buffer per step on a Vulkan
 * device (vk_forward.c; docs/gpu.md).
 */
#ifndef CELLM_VK_FORWARD_H
#define CELLM_VK_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"

/* Partial offload: the layers below the device's, run elsewhere (the
 * CPU: runtime/device.c). The device runs layers [layer0, n_layer) and the
 * classifier. After the pass has reserved a batch's KV blocks, run(user,
 * rows, embd, n, &x, err) runs layers [0, layer0) on the rows' inputs
 * (as backend_ops.run takes them) and points x at the residual stream
 * after them, n_embd floats a row, which becomes the device's input; it
 * keeps those layers' K and V in the cache's host memory, where copy(user,
 * group, dst, src, n) makes a copy-on-write of them when the cache asks:
 * block src's first n layer slices of KV group `group` (those layers'
 * share of it) to block dst.
 * free(user) is called when the backend goes (or is not made). */
typedef struct vk_lower {
    int32_t layer0;
    void *user;
    cellm_status (*run)(void *user, const fwd_row *rows, const float *const *embd, int32_t n,
                        const float **x, cellm_error *err);
    void (*copy)(void *user, int32_t group, int32_t dst, int32_t src, int32_t n);
    void (*free)(void *user);
} vk_lower;

/* Makes the Vulkan backend for model m and its KV cache kv (whose blocks'
 * contents then live on the device: kv_storage), for batches of up to
 * max_rows rows of which max_logit_rows ask for logits; uploads the
 * weights. lower NULL (or its layer0 0): every layer on the device; else
 * the layers from lower->layer0 on, the others run by lower (partial
 * offload, for a model the device's memory does not hold: it then owns
 * lower->user, freed even when this fails). CELLM_ERR_UNSUPPORTED with the
 * reason when the build has no Vulkan, no loader or device is found, the
 * device is a CPU emulation and gpu_only is set, or the model needs what
 * the backend lacks; a device error is its status with the failing call
 * named. */
cellm_status vk_backend(bool gpu_only, const model *m, kv_cache *kv, const vk_lower *lower,
                        int32_t max_rows, int32_t max_logit_rows, backend *out, cellm_error *err);

/* About the device memory vk_backend takes for these limits with layers
 * [layer0, n_layer) on the device (0: all): their weights and the
 * classifier's, their slices of the KV pool, the activations. For fitting
 * a model to a device (runtime/device.c); 0 in a build without Vulkan. */
uint64_t vk_backend_bytes(const model *m, const kv_cache *kv, int32_t layer0, int32_t max_rows,
                          int32_t max_logit_rows);

#endif /* CELLM_VK_FORWARD_H */
