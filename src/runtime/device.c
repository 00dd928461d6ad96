/*
 * device.c — the choice of backend (see device.h). The Vulkan backend is
 * tried first for AUTO and VULKAN; what it says when it cannot run (no
 * loader, no device, a model it does not cover yet) is the error for
 * VULKAN and the logged reason for AUTO's fall back to the CPU.
 *
 * Partial offload (gpu_layers): the Vulkan backend runs the last layers
 * and hands the ones below to the CPU backend's forward_run_layers (a
 * vk_lower), whose KV blocks stay in the cache's host memory: the first
 * layers of each group's blocks, copied here on a copy-on-write.
 */
#include "runtime/device.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/forward.h"
#include "vulkan/vk_forward.h"

static const char *const names[] = {
    [CELLM_DEVICE_AUTO] = "auto", [CELLM_DEVICE_CPU] = "cpu", [CELLM_DEVICE_VULKAN] = "vulkan"};

const char *device_name(int32_t device) {
    if (device < 0 || device >= (int32_t)(sizeof names / sizeof names[0])) return NULL;
    return names[device];
}

bool device_parse(const char *name, int32_t *device) {
    for (int32_t d = 0; name && d < (int32_t)(sizeof names / sizeof names[0]); d++)
        if (!strcmp(name, names[d])) {
            *device = d;
            return true;
        }
    return false;
}

/* Whether AUTO has said why it runs on the CPU (once per process: an app
 * that makes many engines hears it once). */
static pthread_mutex_t fallback_mu = PTHREAD_MUTEX_INITIALIZER;
static bool fallback_said;

static void say_fallback(const char *why) {
    pthread_mutex_lock(&fallback_mu);
    bool say = !fallback_said;
    fallback_said = true;
    pthread_mutex_unlock(&fallback_mu);
    if (say) cellm_log(CELLM_LOG_INFO, "device auto: running on the CPU (%s)", why);
}

/* The CPU's part of a partial offload (vk_lower). */
typedef struct lower_cpu {
    forward_ctx *f;
    kv_cache *kv;
    int32_t layer0;
    int32_t kv_first[2]; /* per KV group, its layers below layer0 */
} lower_cpu;

static cellm_status lower_run(void *user, const fwd_row *rows, const float *const *embd, int32_t n,
                              const float **x, cellm_error *err) {
    lower_cpu *l = user;
    return forward_run_layers(l->f, rows, embd, n, l->layer0, x, err);
}

/* A block's layers of the CPU lead its layout (kv_cache.h), so a prefix. */
static void lower_copy(void *user, int32_t group, int32_t dst, int32_t src) {
    lower_cpu *l = user;
    kv_group *g = &l->kv->groups[group];
    memcpy(g->mem + (size_t)dst * g->block_bytes, g->mem + (size_t)src * g->block_bytes,
           (size_t)l->kv_first[group] * g->layer_bytes);
}

static void lower_free(void *user) {
    lower_cpu *l = user;
    forward_free(l->f);
    free(l);
}

/* The Vulkan backend with the last gpu_layers layers (all: 0). */
static cellm_status vulkan(bool gpu_only, int32_t gpu_layers, const model *m, kv_cache *kv,
                           threadpool *tp, int32_t max_rows, int32_t max_logit_rows, backend *out,
                           cellm_error *err) {
    if (!gpu_layers || gpu_layers >= m->n_layer)
        return vk_backend(gpu_only, m, kv, NULL, max_rows, max_logit_rows, out, err);
    lower_cpu *l = calloc(1, sizeof *l);
    if (!l) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    l->kv = kv;
    l->layer0 = m->n_layer - gpu_layers;
    for (int32_t il = 0; il < l->layer0; il++) l->kv_first[m->layers[il].kv_group]++;
    /* Its layers never ask for logits: one row's worth. */
    cellm_status st = forward_create(m, kv, tp, max_rows, 1, &l->f, err);
    if (st) {
        free(l);
        return st;
    }
    vk_lower low = {l->layer0, l, lower_run, lower_copy, lower_free};
    return vk_backend(gpu_only, m, kv, &low, max_rows, max_logit_rows, out, err);
}

cellm_status device_backend(int32_t device, int32_t gpu_layers, const model *m, kv_cache *kv,
                            threadpool *tp, int32_t max_rows, int32_t max_logit_rows, backend *out,
                            cellm_error *err) {
    *out = (backend){0};
    if (gpu_layers < 0)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "%d GPU layers: give 0 (every layer) or a count of layers", (int)gpu_layers);
    if (!device_name(device))
        return err_set(err, CELLM_ERR_INVALID_ARG, "device %d is not auto, cpu or vulkan",
                       (int)device);
    if (device != CELLM_DEVICE_CPU) {
        cellm_error verr;
        err_clear(&verr);
        cellm_status st = vulkan(device == CELLM_DEVICE_AUTO, gpu_layers, m, kv, tp, max_rows,
                                 max_logit_rows, out, &verr);
        if (st == CELLM_OK) {
            if (gpu_layers && gpu_layers < m->n_layer)
                cellm_log(CELLM_LOG_INFO,
                          "vulkan: layers %d-%d and the classifier on the GPU, the embedding and "
                          "layers 0-%d on the CPU",
                          (int)(m->n_layer - gpu_layers), (int)(m->n_layer - 1),
                          (int)(m->n_layer - gpu_layers - 1));
            return CELLM_OK;
        }
        if (device == CELLM_DEVICE_VULKAN || st != CELLM_ERR_UNSUPPORTED) {
            *err = verr;
            return st;
        }
        say_fallback(verr.msg);
    }
    return forward_backend(m, kv, tp, max_rows, max_logit_rows, out, err);
}
