/*
 * device.c — the choice of backend (see device.h). The Vulkan backend is
 * tried first for AUTO and VULKAN; what it says when it cannot run (no
 * loader, no device, a model it does not cover yet) is the error for
 * VULKAN and the logged reason for AUTO's fall back to the CPU.
 */
#include "runtime/device.h"

#include <pthread.h>
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

cellm_status device_backend(int32_t device, const model *m, kv_cache *kv, threadpool *tp,
                            int32_t max_rows, int32_t max_logit_rows, backend *out,
                            cellm_error *err) {
    *out = (backend){0};
    if (!device_name(device))
        return err_set(err, CELLM_ERR_INVALID_ARG, "device %d is not auto, cpu or vulkan",
                       (int)device);
    if (device != CELLM_DEVICE_CPU) {
        cellm_error verr;
        err_clear(&verr);
        cellm_status st =
            vk_backend(device == CELLM_DEVICE_AUTO, m, kv, max_rows, max_logit_rows, out, &verr);
        if (st == CELLM_OK) return CELLM_OK;
        if (device == CELLM_DEVICE_VULKAN || st != CELLM_ERR_UNSUPPORTED) {
            *err = verr;
            return st;
        }
        say_fallback(verr.msg);
    }
    return forward_backend(m, kv, tp, max_rows, max_logit_rows, out, err);
}
