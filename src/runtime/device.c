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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/forward.h"
#include "vulkan/vk_device.h"
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
} lower_cpu;

static cellm_status lower_run(void *user, const fwd_row *rows, const float *const *embd, int32_t n,
                              const float **x, cellm_error *err) {
    lower_cpu *l = user;
    return forward_run_layers(l->f, rows, embd, n, l->layer0, x, err);
}

/* The CPU's n layers lead a block's layout (kv_cache.h): a prefix. */
static void lower_copy(void *user, int32_t group, int32_t dst, int32_t src, int32_t n) {
    lower_cpu *l = user;
    kv_group *g = &l->kv->groups[group];
    memcpy(g->mem + (size_t)dst * g->block_bytes, g->mem + (size_t)src * g->block_bytes,
           (size_t)n * g->layer_bytes);
}

static void lower_free(void *user) {
    lower_cpu *l = user;
    forward_free(l->f);
    free(l);
}

/* The device memory a backend may plan on: the device-local memory of the
 * GPU vk_device_open takes by default, less a tenth for the driver and
 * whatever else runs there ($CELLM_VK_MEMORY, in bytes, stands for the
 * device's memory: tests); 0 when there is no such device. The devices
 * are listed once per process. */
static pthread_once_t memory_once = PTHREAD_ONCE_INIT;
static uint64_t memory_found;
static size_t driver_resident; /* what listing the devices left resident (device_driver_bytes) */

/* The process's resident bytes (Linux and Android: /proc/self/statm); 0
 * where unknown. */
static size_t resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, rss = 0;
    int got = fscanf(f, "%lu %lu", &size, &rss);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return got == 2 && page > 0 ? (size_t)rss * (size_t)page : 0;
}

static void memory_find(void) {
    vk_device_info devs[16];
    uint32_t n = 0;
    cellm_error e;
    err_clear(&e);
    size_t before = resident_bytes();
    cellm_status st = vk_enumerate(devs, 16, &n, &e);
    size_t after = resident_bytes();
    /* The loader and drivers stay mapped after the instance goes (a
     * driver built on LLVM, as Mesa's lavapipe, leaves tens of MiB). */
    driver_resident = after > before ? after - before : 0;
    if (st != CELLM_OK) return;
    int best = vk_pick_best(devs, n < 16 ? n : 16);
    if (best >= 0) memory_found = devs[best].device_local_bytes;
}

size_t device_driver_bytes(int32_t device) {
    if (device == CELLM_DEVICE_CPU) return 0;
    (void)pthread_once(&memory_once, memory_find);
    return driver_resident;
}

static uint64_t device_memory(void) {
    const char *v = getenv("CELLM_VK_MEMORY");
    uint64_t bytes;
    if (v && *v) {
        bytes = strtoull(v, NULL, 10);
    } else {
        (void)pthread_once(&memory_once, memory_find);
        bytes = memory_found;
    }
    return bytes / 10 * 9;
}

int32_t device_fit_layers(const model *m, const kv_cache *kv, int32_t max_rows,
                          int32_t max_logit_rows, uint64_t budget) {
    for (int32_t layer0 = 0; layer0 < m->n_layer; layer0++)
        if (vk_backend_bytes(m, kv, layer0, max_rows, max_logit_rows) <= budget)
            return m->n_layer - layer0;
    return 0;
}

/* The Vulkan backend with the last gpu_layers layers (all: 0). With all
 * asked for, a model whose weights, KV and activations do not fit the
 * device's memory (device_memory) gets the most layers that do, as if
 * gpu_layers had said so; none: CELLM_ERR_UNSUPPORTED (AUTO then runs on
 * the CPU). */
static cellm_status vulkan(bool gpu_only, int32_t gpu_layers, const model *m, kv_cache *kv,
                           threadpool *tp, int32_t max_rows, int32_t max_logit_rows, backend *out,
                           cellm_error *err) {
    uint64_t mem = gpu_layers ? 0 : device_memory();
    uint64_t all = mem ? vk_backend_bytes(m, kv, 0, max_rows, max_logit_rows) : 0;
    if (all > mem) {
        gpu_layers = device_fit_layers(m, kv, max_rows, max_logit_rows, mem);
        if (!gpu_layers)
            return err_set(
                err, CELLM_ERR_UNSUPPORTED,
                "the GPU's memory (%.0f MiB to use) holds not even the last layer and "
                "the classifier (%.0f MiB)",
                (double)mem / 1048576.0,
                (double)vk_backend_bytes(m, kv, m->n_layer - 1, max_rows, max_logit_rows) /
                    1048576.0);
        cellm_log(
            CELLM_LOG_INFO,
            "vulkan: the model takes %.0f MiB on the GPU, which has %.0f MiB to use: the last "
            "%d of %d layers there (--gpu-layers)",
            (double)all / 1048576.0, (double)mem / 1048576.0, (int)gpu_layers, (int)m->n_layer);
    }
    if (!gpu_layers || gpu_layers >= m->n_layer)
        return vk_backend(gpu_only, m, kv, NULL, max_rows, max_logit_rows, out, err);
    lower_cpu *l = calloc(1, sizeof *l);
    if (!l) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    l->kv = kv;
    l->layer0 = m->n_layer - gpu_layers;
    /* Its layers never ask for logits: one row's worth. */
    cellm_status st = forward_create(m, kv, tp, max_rows, 1, &l->f, err);
    if (st) {
        free(l);
        return st;
    }
    vk_lower low = {l->layer0, l, lower_run, lower_copy, lower_free};
    st = vk_backend(gpu_only, m, kv, &low, max_rows, max_logit_rows, out, err);
    if (!st)
        cellm_log(CELLM_LOG_INFO,
                  "vulkan: layers %d-%d and the classifier on the GPU, the embedding and layers "
                  "0-%d on the CPU",
                  (int)l->layer0, (int)(m->n_layer - 1), (int)(l->layer0 - 1));
    return st;
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
        if (st == CELLM_OK) return CELLM_OK;
        if (device == CELLM_DEVICE_VULKAN || st != CELLM_ERR_UNSUPPORTED) {
            *err = verr;
            return st;
        }
        say_fallback(verr.msg);
    }
    return forward_backend(m, kv, tp, max_rows, max_logit_rows, out, err);
}
