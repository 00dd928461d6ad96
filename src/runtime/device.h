/*
 * device.h — picks the backend that runs an engine's forward pass
 * (model/backend.h) from cellm_engine_params.device: the CPU, or a Vulkan
 * GPU where the build has the Vulkan backend and finds one. The engine, the
 * draft model of speculative decoding and the command's own runs
 * (tools/rt.c) all make their backend here.
 */
#ifndef CELLM_DEVICE_H
#define CELLM_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "model/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"

/* The name of a cellm_device ("auto", "cpu", "vulkan"); NULL when it is
 * none. */
const char *device_name(int32_t device);

/* The cellm_device named `name`; false when it names none. */
bool device_parse(const char *name, int32_t *device);

/* Makes the backend for `device` over model m and its KV cache kv, for
 * batches of up to max_rows rows of which max_logit_rows ask for logits.
 * gpu_layers (cellm_engine_params.gpu_layers): on a GPU, 0 runs every
 * layer there (or the most the device's memory holds: device_fit_layers),
 * N the last N (the rest on the CPU: vk_backend).
 * AUTO takes a usable Vulkan GPU and otherwise the CPU, logging once per
 * process why it did not take the GPU; VULKAN fails with
 * CELLM_ERR_UNSUPPORTED and the reason when it cannot run there. */
cellm_status device_backend(int32_t device, int32_t gpu_layers, const model *m, kv_cache *kv,
                            threadpool *tp, int32_t max_rows, int32_t max_logit_rows, backend *out,
                            cellm_error *err);

/* The most layers, counted from the last, that a Vulkan backend for these
 * limits holds in `budget` bytes of device memory (vk_backend_bytes), or
 * 0 when not even one layer and the classifier fit. device_backend uses
 * it when every layer is asked for and the model does not fit. */
int32_t device_fit_layers(const model *m, const kv_cache *kv, int32_t max_rows,
                          int32_t max_logit_rows, uint64_t budget);

/* What the GPU's loader and drivers leave resident in the process once
 * listed (the resident size's growth across the first listing of the
 * devices; 0 where the OS does not tell, and for CELLM_DEVICE_CPU, which
 * lists none). The devices are listed once per process; the phone memory
 * mode counts this. */
size_t device_driver_bytes(int32_t device);

#endif /* CELLM_DEVICE_H */
