/*
 * devices.c — `cellm devices`: lists the Vulkan devices the loader finds
 * (src/vulkan/vk_device.h): index, name, type, driver, Vulkan version,
 * device-local memory, subgroup size and the optional features the
 * backend's shaders may use, and which device `--device vulkan` would pick.
 * Finding none (no loader, no driver, a build without Vulkan) is a normal
 * answer, printed with the reason, exit status 0.
 */
#include "devices.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vulkan/vk_device.h"

static void usage(FILE *out) {
    fprintf(out, "usage: cellm devices\n\n"
                 "Lists the Vulkan devices found (the loader, libvulkan.so.1, is opened at run\n"
                 "time; $CELLM_VULKAN_LOADER names another). Exit status 0 also when none is\n"
                 "found.\n");
}

static const char *yes(bool b) {
    return b ? "yes" : "no";
}

int cmd_devices(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        cli_error("devices: unknown argument '%s' (see `cellm devices --help`)", argv[i]);
        return 2;
    }
    if (!vk_built()) {
        printf("Vulkan: this build has no Vulkan backend (configure with -DCELLM_VULKAN=ON; "
               "needs libvulkan-dev and glslc)\nno Vulkan device\n");
        return 0;
    }
    enum { MAX = 16 };
    vk_device_info info[MAX];
    uint32_t n = 0;
    cellm_error err;
    err_clear(&err);
    if (vk_enumerate(info, MAX, &n, &err) != CELLM_OK) {
        printf("Vulkan: built in\nno Vulkan device: %s\n", err.msg);
        return 0;
    }
    if (n > MAX) n = MAX;
    printf("Vulkan: built in; %u device%s\n", n, n == 1 ? "" : "s");
    int best = vk_pick_best(info, n); /* what vk_device_open takes by default */
    for (uint32_t i = 0; i < n; i++) {
        const vk_device_info *d = &info[i];
        char ver[32];
        printf("\n[%u] %s (%s)%s\n", d->index, d->name, vk_device_type_name(d->type),
               (int)i == best ? "  <- default" : "");
        printf("    driver: %s\n", d->driver[0] ? d->driver : "(not told)");
        printf("    Vulkan %s, device-local memory %.1f GiB, subgroup size %u\n",
               vk_version_str(d->api_version, ver, sizeof ver),
               (double)d->device_local_bytes / (1024.0 * 1024 * 1024), d->subgroup_size);
        printf("    16-bit storage %s, 8-bit storage %s, shader int8 %s, shader float16 %s, "
               "integer dot product %s\n",
               yes(d->storage16), yes(d->storage8), yes(d->shader_int8), yes(d->shader_float16),
               yes(d->int_dot));
        printf("    push descriptors %s, timestamps %s, largest binding %.0f MiB\n",
               yes(d->push_descriptor), yes(d->timestamps),
               (double)d->max_storage_range / (1024.0 * 1024));
        if (!d->usable) printf("    not usable: cellm needs Vulkan 1.1 and a compute queue\n");
    }
    return 0;
}
