/*
 * vk_loader.c — the Vulkan loader opened at run time. The library links no
 * Vulkan library (DESIGN.md: libc, libm and pthreads only): the loader is
 * opened with dlopen, vkGetInstanceProcAddr found with dlsym, and every
 * other function fetched through it into a vk_fns table. Also here: VkResult
 * names, the mapping of a failed call to a cellm_status, and the count of
 * live device objects that the tests check after close.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vulkan/vk_internal.h"

static atomic_long live_objects;

void vk_live_add(long n) {
    atomic_fetch_add(&live_objects, n);
}

long vk_live_objects(void) {
    return atomic_load(&live_objects);
}

bool vk_built(void) {
    return true;
}

const char *vk_result_str(VkResult r) {
    switch (r) {
#define R(x)                                                                                       \
    case x: return #x;
        R(VK_SUCCESS)
        R(VK_NOT_READY)
        R(VK_TIMEOUT)
        R(VK_INCOMPLETE)
        R(VK_ERROR_OUT_OF_HOST_MEMORY)
        R(VK_ERROR_OUT_OF_DEVICE_MEMORY)
        R(VK_ERROR_INITIALIZATION_FAILED)
        R(VK_ERROR_DEVICE_LOST)
        R(VK_ERROR_MEMORY_MAP_FAILED)
        R(VK_ERROR_LAYER_NOT_PRESENT)
        R(VK_ERROR_EXTENSION_NOT_PRESENT)
        R(VK_ERROR_FEATURE_NOT_PRESENT)
        R(VK_ERROR_INCOMPATIBLE_DRIVER)
        R(VK_ERROR_TOO_MANY_OBJECTS)
        R(VK_ERROR_FORMAT_NOT_SUPPORTED)
        R(VK_ERROR_FRAGMENTED_POOL)
        R(VK_ERROR_UNKNOWN)
        R(VK_ERROR_OUT_OF_POOL_MEMORY)
        R(VK_ERROR_INVALID_EXTERNAL_HANDLE)
        R(VK_ERROR_FRAGMENTATION)
        R(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
#undef R
    default: return "VkResult (unknown)";
    }
}

cellm_status vk_fail(cellm_error *err, const char *call, VkResult r) {
    cellm_status code = CELLM_ERR_IO;
    if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY ||
        r == VK_ERROR_OUT_OF_POOL_MEMORY || r == VK_ERROR_TOO_MANY_OBJECTS ||
        r == VK_ERROR_FRAGMENTED_POOL || r == VK_ERROR_FRAGMENTATION)
        code = CELLM_ERR_NO_MEMORY;
    else if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_EXTENSION_NOT_PRESENT ||
             r == VK_ERROR_FEATURE_NOT_PRESENT || r == VK_ERROR_LAYER_NOT_PRESENT)
        code = CELLM_ERR_UNSUPPORTED;
    return err_set(err, code, "Vulkan: %s failed: %s (%d)", call, vk_result_str(r), (int)r);
}

/* The loader's names, most specific first. */
static const char *const loader_names[] = {
#if defined(__APPLE__)
    "libvulkan.1.dylib",
    "libvulkan.dylib",
    "libMoltenVK.dylib",
#else
    "libvulkan.so.1",
    "libvulkan.so",
#endif
};

static cellm_status open_loader(vk_fns *fn, cellm_error *err) {
    const char *env = getenv("CELLM_VULKAN_LOADER");
    char tried[256] = "";
    if (env && *env) {
        fn->lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        snprintf(tried, sizeof tried, "%s ($CELLM_VULKAN_LOADER)", env);
    } else {
        size_t n = sizeof loader_names / sizeof loader_names[0], len = 0;
        for (size_t i = 0; i < n && !fn->lib; i++) {
            fn->lib = dlopen(loader_names[i], RTLD_NOW | RTLD_LOCAL);
            int w =
                snprintf(tried + len, sizeof tried - len, "%s%s", i ? ", " : "", loader_names[i]);
            if (w > 0 && (size_t)w < sizeof tried - len) len += (size_t)w;
        }
    }
    if (!fn->lib)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "no Vulkan loader: could not open %s (install the Vulkan loader, Debian "
                       "libvulkan1, and a driver)",
                       tried);
    /* dlsym returns an object pointer; POSIX guarantees it converts to a
     * function pointer, C does not, hence the memcpy. */
    void *sym = dlsym(fn->lib, "vkGetInstanceProcAddr");
    if (!sym) {
        dlclose(fn->lib);
        fn->lib = NULL;
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "the Vulkan loader %s has no vkGetInstanceProcAddr", tried);
    }
    memcpy(&fn->vkGetInstanceProcAddr, &sym, sizeof sym);
    return CELLM_OK;
}

#define LOAD_GLOBAL(name) fn->name = (PFN_##name)fn->vkGetInstanceProcAddr(NULL, #name);
#define LOAD_INSTANCE(name)                                                                        \
    if (!(fn->name = (PFN_##name)fn->vkGetInstanceProcAddr(*inst, #name))) missing = #name;
#define LOAD_DEVICE(name)                                                                          \
    if (!(fn->name = (PFN_##name)fn->vkGetDeviceProcAddr(dev, #name))) missing = #name;

cellm_status vk_instance_open(vk_fns *fn, VkInstance *inst, cellm_error *err) {
    memset(fn, 0, sizeof *fn);
    *inst = VK_NULL_HANDLE;
    cellm_status st = open_loader(fn, err);
    if (st != CELLM_OK) return st;
    LOAD_GLOBAL(vkCreateInstance)
    LOAD_GLOBAL(vkEnumerateInstanceVersion)
    LOAD_GLOBAL(vkEnumerateInstanceExtensionProperties)
    uint32_t version = VK_API_VERSION_1_0;
    if (fn->vkEnumerateInstanceVersion) fn->vkEnumerateInstanceVersion(&version);
    if (!fn->vkCreateInstance || version < VK_API_VERSION_1_1) {
        vk_instance_close(fn, VK_NULL_HANDLE);
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "the Vulkan loader is Vulkan 1.0 only: cellm needs 1.1");
    }
    /* MoltenVK's devices are listed only to an instance that asks for
     * "portability" devices: ask where the loader knows the extension. */
    const char *exts[1];
    uint32_t n_exts = 0, n_props = 0;
    VkInstanceCreateFlags flags = 0;
    if (fn->vkEnumerateInstanceExtensionProperties &&
        fn->vkEnumerateInstanceExtensionProperties(NULL, &n_props, NULL) == VK_SUCCESS &&
        n_props > 0) {
        VkExtensionProperties *props = calloc(n_props, sizeof *props);
        if (props && fn->vkEnumerateInstanceExtensionProperties(NULL, &n_props, props) >= 0) {
            for (uint32_t i = 0; i < n_props; i++)
                if (!strcmp(props[i].extensionName, "VK_KHR_portability_enumeration")) {
                    exts[n_exts++] = "VK_KHR_portability_enumeration";
                    flags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
                }
        }
        free(props);
    }
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "cellm",
        .pEngineName = "cellm",
        .apiVersion = version >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : version,
    };
    VkInstanceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .flags = flags,
        .pApplicationInfo = &app,
        .enabledExtensionCount = n_exts,
        .ppEnabledExtensionNames = exts,
    };
    VkResult r = fn->vkCreateInstance(&ci, NULL, inst);
    if (r != VK_SUCCESS) {
        *inst = VK_NULL_HANDLE;
        vk_instance_close(fn, VK_NULL_HANDLE);
        st = vk_fail(err, "vkCreateInstance", r);
        /* No driver at all is "unsupported", not an I/O error. */
        if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED)
            st = err_set(err, CELLM_ERR_UNSUPPORTED,
                         "no Vulkan driver: vkCreateInstance failed: %s", vk_result_str(r));
        return st;
    }
    vk_live_add(1);
    const char *missing = NULL;
    VK_INSTANCE_FNS(LOAD_INSTANCE)
    if (missing) {
        vk_instance_close(fn, *inst);
        *inst = VK_NULL_HANDLE;
        return err_set(err, CELLM_ERR_UNSUPPORTED, "the Vulkan loader lacks %s", missing);
    }
    return CELLM_OK;
}

void vk_instance_close(vk_fns *fn, VkInstance inst) {
    if (inst && fn->vkDestroyInstance) {
        fn->vkDestroyInstance(inst, NULL);
        vk_live_add(-1);
    }
    if (fn->lib) dlclose(fn->lib);
    fn->lib = NULL;
}

cellm_status vk_load_device_fns(vk_fns *fn, VkDevice dev, bool push_descriptor, cellm_error *err) {
    const char *missing = NULL;
    VK_DEVICE_FNS(LOAD_DEVICE)
    if (missing) return err_set(err, CELLM_ERR_UNSUPPORTED, "the Vulkan driver lacks %s", missing);
    fn->vkCmdPushDescriptorSetKHR = NULL;
    if (push_descriptor) {
        fn->vkCmdPushDescriptorSetKHR = (PFN_vkCmdPushDescriptorSetKHR)fn->vkGetDeviceProcAddr(
            dev, "vkCmdPushDescriptorSetKHR");
        if (!fn->vkCmdPushDescriptorSetKHR)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "the Vulkan driver lacks vkCmdPushDescriptorSetKHR");
    }
    return CELLM_OK;
}
