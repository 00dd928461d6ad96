/*
 * vk_device.c — finding and opening a Vulkan device, and its buffers
 * (vk_device.h). A device is a VkInstance of its own, one VkDevice with one
 * compute queue, the buffers made on it, and two staging buffers (one for
 * uploads, one for downloads) of a bounded size through which large
 * transfers go in chunks: weights of hundreds of MB come from the mmap
 * without a copy of their size on the host side.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vulkan/vk_internal.h"

const char *vk_device_type_name(vk_device_type type) {
    switch (type) {
    case VK_TYPE_INTEGRATED: return "integrated";
    case VK_TYPE_DISCRETE: return "discrete";
    case VK_TYPE_VIRTUAL: return "virtual";
    case VK_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

const char *vk_version_str(uint32_t v, char *buf, size_t cap) {
    snprintf(buf, cap, "%u.%u.%u", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v),
             VK_API_VERSION_PATCH(v));
    return buf;
}

vk_open_params vk_open_default_params(void) {
    vk_open_params p = {.index = -1, .timeout_ms = 60000, .staging_bytes = (size_t)64 << 20};
    return p;
}

/* What a physical device offers beyond Vulkan 1.0: its extensions and the
 * feature structs cellm asks about, chained for vkGetPhysicalDeviceFeatures2
 * (and, enabled as found, for vkCreateDevice). The chain points into the
 * struct itself: do not copy one after caps_query. */
typedef struct dev_caps {
    uint32_t api;
    bool ext_push, ext_driver, ext_8bit, ext_f16i8, ext_dot;
    bool in_8bit, in_f16i8, in_dot; /* which structs are in the chain */
    VkPhysicalDeviceFeatures2 f2;
    VkPhysicalDevice16BitStorageFeatures s16;
    VkPhysicalDevice8BitStorageFeatures s8;
    VkPhysicalDeviceShaderFloat16Int8Features f16i8;
    VkPhysicalDeviceShaderIntegerDotProductFeatures dot;
} dev_caps;

static void caps_query(const vk_fns *fn, VkPhysicalDevice phys, dev_caps *c) {
    memset(c, 0, sizeof *c);
    VkPhysicalDeviceProperties p;
    fn->vkGetPhysicalDeviceProperties(phys, &p);
    c->api = p.apiVersion;
    uint32_t n = 0;
    if (fn->vkEnumerateDeviceExtensionProperties(phys, NULL, &n, NULL) == VK_SUCCESS && n) {
        VkExtensionProperties *e = calloc(n, sizeof *e);
        if (e && fn->vkEnumerateDeviceExtensionProperties(phys, NULL, &n, e) >= 0) {
            for (uint32_t i = 0; i < n; i++) {
                const char *s = e[i].extensionName;
                c->ext_push |= !strcmp(s, "VK_KHR_push_descriptor");
                c->ext_driver |= !strcmp(s, "VK_KHR_driver_properties");
                c->ext_8bit |= !strcmp(s, "VK_KHR_8bit_storage");
                c->ext_f16i8 |= !strcmp(s, "VK_KHR_shader_float16_int8");
                c->ext_dot |= !strcmp(s, "VK_KHR_shader_integer_dot_product");
            }
        }
        free(e);
    }
    if (c->api < VK_API_VERSION_1_1) return; /* no Features2 to ask */
    c->f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    c->s16.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES;
    c->f2.pNext = &c->s16;
    void **tail = &c->s16.pNext;
    if (c->ext_8bit || c->api >= VK_API_VERSION_1_2) {
        c->s8.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES;
        *tail = &c->s8;
        tail = &c->s8.pNext;
        c->in_8bit = true;
    }
    if (c->ext_f16i8 || c->api >= VK_API_VERSION_1_2) {
        c->f16i8.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES;
        *tail = &c->f16i8;
        tail = &c->f16i8.pNext;
        c->in_f16i8 = true;
    }
    if (c->ext_dot || c->api >= VK_API_VERSION_1_3) {
        c->dot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES;
        *tail = &c->dot;
        c->in_dot = true;
    }
    fn->vkGetPhysicalDeviceFeatures2(phys, &c->f2);
}

/* The first queue family that computes, or UINT32_MAX. */
static uint32_t compute_family(const vk_fns *fn, VkPhysicalDevice phys, uint32_t *ts_bits) {
    uint32_t n = 0, found = UINT32_MAX;
    fn->vkGetPhysicalDeviceQueueFamilyProperties(phys, &n, NULL);
    VkQueueFamilyProperties *q = calloc(n ? n : 1, sizeof *q);
    if (!q) return UINT32_MAX;
    fn->vkGetPhysicalDeviceQueueFamilyProperties(phys, &n, q);
    /* A family with compute but no graphics is the device's async compute
     * queue where it has one; any compute family will do otherwise. */
    for (int pass = 0; pass < 2 && found == UINT32_MAX; pass++)
        for (uint32_t i = 0; i < n; i++) {
            bool compute = q[i].queueFlags & VK_QUEUE_COMPUTE_BIT;
            bool graphics = q[i].queueFlags & VK_QUEUE_GRAPHICS_BIT;
            if (compute && (pass == 1 || !graphics)) {
                found = i;
                *ts_bits = q[i].timestampValidBits;
                break;
            }
        }
    free(q);
    return found;
}

void vk_describe(const vk_fns *fn, VkPhysicalDevice phys, uint32_t index, vk_device_info *info) {
    memset(info, 0, sizeof *info);
    info->index = index;
    dev_caps c;
    caps_query(fn, phys, &c);
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    VkPhysicalDeviceSubgroupProperties sub = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceDriverProperties drv = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    bool has_driver = c.ext_driver || c.api >= VK_API_VERSION_1_2;
    if (c.api >= VK_API_VERSION_1_1) {
        p2.pNext = &sub;
        if (has_driver) sub.pNext = &drv;
        fn->vkGetPhysicalDeviceProperties2(phys, &p2);
    } else {
        fn->vkGetPhysicalDeviceProperties(phys, &p2.properties);
    }
    const VkPhysicalDeviceProperties *p = &p2.properties;
    snprintf(info->name, sizeof info->name, "%s", p->deviceName);
    switch (p->deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: info->type = VK_TYPE_INTEGRATED; break;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: info->type = VK_TYPE_DISCRETE; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: info->type = VK_TYPE_VIRTUAL; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: info->type = VK_TYPE_CPU; break;
    default: info->type = VK_TYPE_OTHER;
    }
    if (has_driver && c.api >= VK_API_VERSION_1_1)
        snprintf(info->driver, sizeof info->driver, "%.120s%s%.120s", drv.driverName,
                 drv.driverInfo[0] ? " " : "", drv.driverInfo);
    info->api_version = p->apiVersion;
    VkPhysicalDeviceMemoryProperties mem;
    fn->vkGetPhysicalDeviceMemoryProperties(phys, &mem);
    for (uint32_t i = 0; i < mem.memoryHeapCount; i++)
        if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT &&
            mem.memoryHeaps[i].size > info->device_local_bytes)
            info->device_local_bytes = mem.memoryHeaps[i].size;
    info->subgroup_size = sub.subgroupSize;
    info->storage16 = c.s16.storageBuffer16BitAccess;
    info->storage8 = c.in_8bit && c.s8.storageBuffer8BitAccess;
    info->shader_int8 = c.in_f16i8 && c.f16i8.shaderInt8;
    info->shader_float16 = c.in_f16i8 && c.f16i8.shaderFloat16;
    info->int_dot = c.in_dot && c.dot.shaderIntegerDotProduct;
    info->push_descriptor = c.ext_push;
    uint32_t ts_bits = 0;
    uint32_t fam = compute_family(fn, phys, &ts_bits);
    info->timestamps = fam != UINT32_MAX && ts_bits > 0 && p->limits.timestampPeriod > 0;
    info->usable = c.api >= VK_API_VERSION_1_1 && fam != UINT32_MAX;
    for (int i = 0; i < 3; i++) info->max_workgroups[i] = p->limits.maxComputeWorkGroupCount[i];
    info->max_shared = p->limits.maxComputeSharedMemorySize;
    info->max_invocations = p->limits.maxComputeWorkGroupInvocations;
    if (p->limits.maxComputeWorkGroupSize[0] < info->max_invocations)
        info->max_invocations = p->limits.maxComputeWorkGroupSize[0];
    info->max_storage_range = p->limits.maxStorageBufferRange;
}

/* The physical devices of an open instance into a new array (*n of them). */
static cellm_status list_physical(const vk_fns *fn, VkInstance inst, VkPhysicalDevice **out,
                                  uint32_t *n, cellm_error *err) {
    *out = NULL;
    *n = 0;
    VkResult r = fn->vkEnumeratePhysicalDevices(inst, n, NULL);
    if (r != VK_SUCCESS) return vk_fail(err, "vkEnumeratePhysicalDevices", r);
    if (*n == 0)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "the Vulkan loader found no device (no driver installed: for a CPU one, "
                       "Debian mesa-vulkan-drivers)");
    *out = calloc(*n, sizeof **out);
    if (!*out) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    r = fn->vkEnumeratePhysicalDevices(inst, n, *out);
    if (r < 0) {
        free(*out);
        *out = NULL;
        return vk_fail(err, "vkEnumeratePhysicalDevices", r);
    }
    return CELLM_OK;
}

cellm_status vk_enumerate(vk_device_info *out, uint32_t cap, uint32_t *n, cellm_error *err) {
    *n = 0;
    vk_fns fn;
    VkInstance inst;
    cellm_status st = vk_instance_open(&fn, &inst, err);
    if (st != CELLM_OK) return st;
    VkPhysicalDevice *phys;
    st = list_physical(&fn, inst, &phys, n, err);
    if (st == CELLM_OK) {
        for (uint32_t i = 0; i < *n && i < cap; i++) vk_describe(&fn, phys[i], i, &out[i]);
        free(phys);
    }
    vk_instance_close(&fn, inst);
    return st;
}

/* Higher is preferred by vk_pick_best. */
static int type_rank(vk_device_type t) {
    switch (t) {
    case VK_TYPE_DISCRETE: return 4;
    case VK_TYPE_INTEGRATED: return 3;
    case VK_TYPE_VIRTUAL: return 2;
    case VK_TYPE_CPU: return 1;
    default: return 0;
    }
}

int vk_pick_best(const vk_device_info *infos, uint32_t n) {
    int pick = -1;
    for (uint32_t i = 0; i < n; i++)
        if (infos[i].usable && (pick < 0 || type_rank(infos[i].type) > type_rank(infos[pick].type)))
            pick = (int)i;
    return pick;
}

static cellm_status create_device(vk_device *d, bool no_push, cellm_error *err) {
    dev_caps c;
    caps_query(&d->fn, d->phys, &c);
    uint32_t ts_bits = 0;
    d->queue_family = compute_family(&d->fn, d->phys, &ts_bits);
    const char *exts[4];
    uint32_t n_exts = 0;
    d->use_push = c.ext_push && !no_push;
    if (d->use_push) exts[n_exts++] = "VK_KHR_push_descriptor";
    if (c.ext_8bit && c.api < VK_API_VERSION_1_2) exts[n_exts++] = "VK_KHR_8bit_storage";
    if (c.ext_f16i8 && c.api < VK_API_VERSION_1_2) exts[n_exts++] = "VK_KHR_shader_float16_int8";
    if (c.ext_dot && c.api < VK_API_VERSION_1_3)
        exts[n_exts++] = "VK_KHR_shader_integer_dot_product";
    /* The optional features as the device has them; of the 1.0 features
     * only the 16-bit integers the 16-bit storage goes with. */
    VkBool32 int16 = c.f2.features.shaderInt16;
    memset(&c.f2.features, 0, sizeof c.f2.features);
    c.f2.features.shaderInt16 = int16;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo q = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = d->queue_family,
        .queueCount = 1,
        .pQueuePriorities = &prio,
    };
    VkDeviceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .pNext = &c.f2,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &q,
        .enabledExtensionCount = n_exts,
        .ppEnabledExtensionNames = exts,
    };
    VkResult r = d->fn.vkCreateDevice(d->phys, &ci, NULL, &d->dev);
    if (r != VK_SUCCESS) {
        d->dev = VK_NULL_HANDLE;
        return vk_fail(err, "vkCreateDevice", r);
    }
    vk_live_add(1);
    cellm_status st = vk_load_device_fns(&d->fn, d->dev, d->use_push, err);
    if (st != CELLM_OK) return st;
    d->fn.vkGetDeviceQueue(d->dev, d->queue_family, 0, &d->queue);
    VkPhysicalDeviceProperties p;
    d->fn.vkGetPhysicalDeviceProperties(d->phys, &p);
    d->storage_align = p.limits.minStorageBufferOffsetAlignment;
    if (d->storage_align == 0) d->storage_align = 1;
    d->timestamp_period = p.limits.timestampPeriod;
    d->fn.vkGetPhysicalDeviceMemoryProperties(d->phys, &d->mem);
    return CELLM_OK;
}

cellm_status vk_device_open(const vk_open_params *params, vk_device **out, cellm_error *err) {
    *out = NULL;
    vk_open_params p = params ? *params : vk_open_default_params();
    if (p.timeout_ms == 0) p.timeout_ms = 60000;
    if (p.staging_bytes < 4096) p.staging_bytes = 4096;
    p.staging_bytes &= ~(size_t)3;
    vk_device *d = calloc(1, sizeof *d);
    if (!d) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    d->timeout_ms = p.timeout_ms;
    d->staging_bytes = p.staging_bytes;
    cellm_status st = vk_instance_open(&d->fn, &d->inst, err);
    if (st != CELLM_OK) {
        free(d);
        return st;
    }
    VkPhysicalDevice *phys = NULL;
    uint32_t n = 0;
    st = list_physical(&d->fn, d->inst, &phys, &n, err);
    if (st == CELLM_OK) {
        int pick = -1;
        if (p.index >= 0) {
            if ((uint32_t)p.index >= n) {
                st = err_set(err, CELLM_ERR_INVALID_ARG,
                             "no Vulkan device %d: there are %u (see `cellm devices`)", p.index, n);
            } else {
                vk_describe(&d->fn, phys[p.index], (uint32_t)p.index, &d->info);
                if (d->info.usable)
                    pick = p.index;
                else
                    st = err_set(err, CELLM_ERR_UNSUPPORTED,
                                 "Vulkan device %d (%s) is not usable: cellm needs Vulkan 1.1 "
                                 "and a compute queue",
                                 p.index, d->info.name);
            }
        } else {
            vk_device_info *infos = calloc(n, sizeof *infos);
            if (!infos) {
                free(phys);
                vk_device_close(d);
                return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
            }
            for (uint32_t i = 0; i < n; i++) vk_describe(&d->fn, phys[i], i, &infos[i]);
            pick = vk_pick_best(infos, n);
            free(infos);
            if (pick < 0)
                st = err_set(err, CELLM_ERR_UNSUPPORTED,
                             "none of the %u Vulkan devices is usable: cellm needs Vulkan 1.1 "
                             "and a compute queue",
                             n);
        }
        if (pick >= 0) {
            d->phys = phys[pick];
            vk_describe(&d->fn, d->phys, (uint32_t)pick, &d->info);
            st = create_device(d, p.no_push_descriptor, err);
            d->info.push_descriptor = d->use_push;
            /* A CPU emulating a GPU (lavapipe) runs a step of a real
             * model for tens of seconds on a small, busy machine: the
             * default timeout, there to turn a GPU hang into an error,
             * gives it ten minutes. */
            if (d->info.type == VK_TYPE_CPU && p.timeout_ms == 60000) d->timeout_ms = 600000;
            /* A discrete GPU finishes a decode step in about a millisecond,
             * and a sleeping wait wakes tens of microseconds late: the
             * host polls the fence for up to 2 ms first (a core busy while
             * the GPU works; phones' integrated GPUs and CPU emulations
             * sleep at once). CELLM_VK_SPIN_US sets it (0: never poll). */
            d->spin_ns = d->info.type == VK_TYPE_DISCRETE ? 2e6 : 0;
            const char *spin = getenv("CELLM_VK_SPIN_US");
            if (spin && *spin) d->spin_ns = 1e3 * atof(spin);
        }
    }
    free(phys);
    if (st == CELLM_OK) st = vk_recorder_create(d, &d->xfer, err);
    if (st != CELLM_OK) {
        vk_device_close(d);
        return st;
    }
    *out = d;
    return CELLM_OK;
}

void vk_device_close(vk_device *d) {
    if (!d) return;
    if (d->dev) {
        d->fn.vkDeviceWaitIdle(d->dev);
        while (d->recorders) vk_recorder_free(d->recorders);
        while (d->buffers) vk_buffer_free(d->buffers);
        while (d->pipes) {
            vk_pipeline *p = d->pipes;
            d->pipes = p->next;
            vk_pipeline_destroy(d, p);
        }
        d->fn.vkDestroyDevice(d->dev, NULL);
        vk_live_add(-1);
    }
    vk_instance_close(&d->fn, d->inst);
    free(d);
}

const vk_device_info *vk_device_get_info(const vk_device *dev) {
    return &dev->info;
}

/* ---- buffers ---- */

/* A memory type allowed by `bits` that has every flag of `need`, the one
 * with the most flags of `want` first; -1 when none. */
static int memory_type(const vk_device *d, uint32_t bits, VkMemoryPropertyFlags need,
                       VkMemoryPropertyFlags want) {
    int pick = -1, score = -1;
    for (uint32_t i = 0; i < d->mem.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = d->mem.memoryTypes[i].propertyFlags;
        if (!(bits & (1u << i)) || (f & need) != need) continue;
        int s = __builtin_popcount(f & want);
        if (s > score) {
            score = s;
            pick = (int)i;
        }
    }
    return pick;
}

cellm_status vk_buffer_create(vk_device *d, size_t bytes, vk_buffer_kind kind, vk_buffer **out,
                              cellm_error *err) {
    *out = NULL;
    if (bytes == 0) return err_set(err, CELLM_ERR_INVALID_ARG, "a Vulkan buffer of 0 bytes");
    vk_buffer *b = calloc(1, sizeof *b);
    if (!b) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    b->dev = d;
    b->size = bytes;
    b->vk_bytes = (bytes + 3) & ~(size_t)3;
    b->kind = kind;
    if (b->vk_bytes < bytes) {
        free(b);
        return err_set(err, CELLM_ERR_INVALID_ARG, "a Vulkan buffer of %zu bytes", bytes);
    }
    VkBufferCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = b->vk_bytes,
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = d->fn.vkCreateBuffer(d->dev, &ci, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        free(b);
        return vk_fail(err, "vkCreateBuffer", r);
    }
    vk_live_add(1);
    /* In the device's list from here on, so that vk_buffer_free undoes
     * whatever was made. */
    b->next = d->buffers;
    if (d->buffers) d->buffers->prev = b;
    d->buffers = b;
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->dev, b->buf, &req);
    const VkMemoryPropertyFlags local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                visible = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                coherent = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                cached = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    int type = -1;
    if (kind == VK_BUF_DEVICE) {
        type = memory_type(d, req.memoryTypeBits, local, 0);
        if (type < 0) type = memory_type(d, req.memoryTypeBits, 0, 0);
    } else if (kind == VK_BUF_UPLOAD) {
        type = memory_type(d, req.memoryTypeBits, visible | coherent, 0);
        if (type < 0) type = memory_type(d, req.memoryTypeBits, visible, 0);
    } else {
        type = memory_type(d, req.memoryTypeBits, visible | cached, coherent);
        if (type < 0) type = memory_type(d, req.memoryTypeBits, visible, coherent);
    }
    if (type < 0) {
        vk_buffer_free(b);
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "the Vulkan device has no memory type for a %s buffer",
                       kind == VK_BUF_DEVICE ? "device" : "host-visible");
    }
    VkMemoryAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = req.size,
        .memoryTypeIndex = (uint32_t)type,
    };
    r = d->fn.vkAllocateMemory(d->dev, &ai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        b->mem = VK_NULL_HANDLE;
        vk_buffer_free(b);
        cellm_status st = vk_fail(err, "vkAllocateMemory", r);
        char size[64];
        snprintf(size, sizeof size, " (%zu bytes)", bytes);
        if (err && strlen(err->msg) + strlen(size) < sizeof err->msg) strcat(err->msg, size);
        return st;
    }
    vk_live_add(1);
    b->coherent = d->mem.memoryTypes[type].propertyFlags & coherent;
    r = d->fn.vkBindBufferMemory(d->dev, b->buf, b->mem, 0);
    if (r == VK_SUCCESS && kind != VK_BUF_DEVICE)
        r = d->fn.vkMapMemory(d->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map);
    if (r != VK_SUCCESS) {
        b->map = NULL;
        vk_buffer_free(b);
        return vk_fail(err, kind != VK_BUF_DEVICE ? "vkMapMemory" : "vkBindBufferMemory", r);
    }
    *out = b;
    return CELLM_OK;
}

void vk_buffer_free(vk_buffer *b) {
    if (!b) return;
    vk_device *d = b->dev;
    if (b->map) d->fn.vkUnmapMemory(d->dev, b->mem);
    if (b->buf) {
        d->fn.vkDestroyBuffer(d->dev, b->buf, NULL);
        vk_live_add(-1);
    }
    if (b->mem) {
        d->fn.vkFreeMemory(d->dev, b->mem, NULL);
        vk_live_add(-1);
    }
    if (b->prev)
        b->prev->next = b->next;
    else
        d->buffers = b->next;
    if (b->next) b->next->prev = b->prev;
    if (d->staging == b) d->staging = NULL;
    if (d->readback == b) d->readback = NULL;
    free(b);
}

size_t vk_buffer_size(const vk_buffer *b) {
    return b->size;
}

static cellm_status check_range(const vk_buffer *b, size_t offset, size_t bytes, const char *what,
                                cellm_error *err) {
    if (offset > b->size || bytes > b->size - offset)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "Vulkan %s of %zu bytes at %zu: the buffer has %zu", what, bytes, offset,
                       b->size);
    return CELLM_OK;
}

/* Makes the host's writes to a mapped buffer visible to the device, or the
 * device's to the host (invalidate). Whole memory: the atom size does not
 * matter then. */
static cellm_status sync_mapped(const vk_buffer *b, bool invalidate, cellm_error *err) {
    if (b->coherent) return CELLM_OK;
    VkMappedMemoryRange range = {
        .sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = b->mem, .size = VK_WHOLE_SIZE};
    const vk_device *d = b->dev;
    VkResult r = invalidate ? d->fn.vkInvalidateMappedMemoryRanges(d->dev, 1, &range)
                            : d->fn.vkFlushMappedMemoryRanges(d->dev, 1, &range);
    if (r != VK_SUCCESS)
        return vk_fail(
            err, invalidate ? "vkInvalidateMappedMemoryRanges" : "vkFlushMappedMemoryRanges", r);
    return CELLM_OK;
}

/* One staged copy between a device buffer and a staging buffer, waited on. */
static cellm_status staged_copy(vk_device *d, const vk_buffer *src, size_t src_off,
                                const vk_buffer *dst, size_t dst_off, size_t n, cellm_error *err) {
    cellm_status st = vk_recorder_begin(d->xfer, err);
    if (st == CELLM_OK) st = vk_recorder_copy(d->xfer, src, src_off, dst, dst_off, n, err);
    if (st == CELLM_OK) st = vk_recorder_submit(d->xfer, err);
    return st;
}

static cellm_status ensure_staging(vk_device *d, vk_buffer **slot, vk_buffer_kind kind,
                                   cellm_error *err) {
    if (*slot) return CELLM_OK;
    return vk_buffer_create(d, d->staging_bytes, kind, slot, err);
}

cellm_status vk_buffer_upload(vk_buffer *dst, size_t offset, const void *src, size_t bytes,
                              cellm_error *err) {
    cellm_status st = check_range(dst, offset, bytes, "upload", err);
    if (st != CELLM_OK || bytes == 0) return st;
    if (dst->map) {
        memcpy((char *)dst->map + offset, src, bytes);
        return sync_mapped(dst, false, err);
    }
    vk_device *d = dst->dev;
    if ((st = ensure_staging(d, &d->staging, VK_BUF_UPLOAD, err)) != CELLM_OK) return st;
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < d->staging_bytes ? bytes - done : d->staging_bytes;
        memcpy(d->staging->map, (const char *)src + done, n);
        if ((st = sync_mapped(d->staging, false, err)) != CELLM_OK) return st;
        if ((st = staged_copy(d, d->staging, 0, dst, offset + done, n, err)) != CELLM_OK) return st;
        done += n;
    }
    return CELLM_OK;
}

cellm_status vk_buffer_read_mapped(const vk_buffer *buf, const void **out, cellm_error *err) {
    *out = NULL;
    if (!buf || !buf->map)
        return err_set(err, CELLM_ERR_INVALID_ARG, "Vulkan: reading an unmapped buffer in place");
    cellm_status st = sync_mapped(buf, true, err);
    if (st == CELLM_OK) *out = buf->map;
    return st;
}

cellm_status vk_buffer_download(const vk_buffer *src, size_t offset, void *dst, size_t bytes,
                                cellm_error *err) {
    cellm_status st = check_range(src, offset, bytes, "download", err);
    if (st != CELLM_OK || bytes == 0) return st;
    if (src->map) {
        if ((st = sync_mapped(src, true, err)) != CELLM_OK) return st;
        memcpy(dst, (const char *)src->map + offset, bytes);
        return CELLM_OK;
    }
    vk_device *d = src->dev;
    if ((st = ensure_staging(d, &d->readback, VK_BUF_READBACK, err)) != CELLM_OK) return st;
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < d->staging_bytes ? bytes - done : d->staging_bytes;
        if ((st = staged_copy(d, src, offset + done, d->readback, 0, n, err)) != CELLM_OK)
            return st;
        if ((st = sync_mapped(d->readback, true, err)) != CELLM_OK) return st;
        memcpy((char *)dst + done, d->readback->map, n);
        done += n;
    }
    return CELLM_OK;
}
