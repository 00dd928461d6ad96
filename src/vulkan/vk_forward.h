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

/* Makes the Vulkan backend for model m and its KV cache kv (whose blocks'
 * contents then live on the device: kv_storage), for batches of up to
 * max_rows rows of which max_logit_rows ask for logits; uploads the
 * weights. CELLM_ERR_UNSUPPORTED with the reason when the build has no
 * Vulkan, no loader or device is found, the device is a CPU emulation and
 * gpu_only is set, or the model needs what the backend lacks; a device
 * error is its status with the failing call named. */
cellm_status vk_backend(bool gpu_only, const model *m, kv_cache *kv, int32_t max_rows,
                        int32_t max_logit_rows, backend *out, cellm_error *err);

#endif /* CELLM_VK_FORWARD_H */
