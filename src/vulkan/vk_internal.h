/*
 * vk_internal.h — what the files of the Vulkan backend share and nothing
 * above it sees: the Vulkan headers (without prototypes: every function
 * comes through the loader opened at run time, vk_loader.c), the table of
 * those functions, and the structs behind vk_device.h's handles.
 */
#ifndef CELLM_VK_INTERNAL_H
#define CELLM_VK_INTERNAL_H

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>

#include "vulkan/vk_device.h"
#include "vulkan/vk_shaders.h"

/* The functions cellm calls: X(name) for each, loaded through
 * vkGetInstanceProcAddr (instance level) or vkGetDeviceProcAddr. */
#define VK_INSTANCE_FNS(X)                                                                         \
    X(vkDestroyInstance)                                                                           \
    X(vkEnumeratePhysicalDevices)                                                                  \
    X(vkGetPhysicalDeviceProperties)                                                               \
    X(vkGetPhysicalDeviceProperties2)                                                              \
    X(vkGetPhysicalDeviceFeatures2)                                                                \
    X(vkGetPhysicalDeviceMemoryProperties)                                                         \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                                    \
    X(vkEnumerateDeviceExtensionProperties)                                                        \
    X(vkCreateDevice)                                                                              \
    X(vkGetDeviceProcAddr)

#define VK_DEVICE_FNS(X)                                                                           \
    X(vkDestroyDevice)                                                                             \
    X(vkGetDeviceQueue)                                                                            \
    X(vkDeviceWaitIdle)                                                                            \
    X(vkCreateBuffer)                                                                              \
    X(vkDestroyBuffer)                                                                             \
    X(vkGetBufferMemoryRequirements)                                                               \
    X(vkAllocateMemory)                                                                            \
    X(vkFreeMemory)                                                                                \
    X(vkBindBufferMemory)                                                                          \
    X(vkMapMemory)                                                                                 \
    X(vkUnmapMemory)                                                                               \
    X(vkFlushMappedMemoryRanges)                                                                   \
    X(vkInvalidateMappedMemoryRanges)                                                              \
    X(vkCreateShaderModule)                                                                        \
    X(vkDestroyShaderModule)                                                                       \
    X(vkCreateDescriptorSetLayout)                                                                 \
    X(vkDestroyDescriptorSetLayout)                                                                \
    X(vkCreatePipelineLayout)                                                                      \
    X(vkDestroyPipelineLayout)                                                                     \
    X(vkCreateComputePipelines)                                                                    \
    X(vkDestroyPipeline)                                                                           \
    X(vkCreateDescriptorPool)                                                                      \
    X(vkDestroyDescriptorPool)                                                                     \
    X(vkResetDescriptorPool)                                                                       \
    X(vkAllocateDescriptorSets)                                                                    \
    X(vkUpdateDescriptorSets)                                                                      \
    X(vkCreateCommandPool)                                                                         \
    X(vkDestroyCommandPool)                                                                        \
    X(vkAllocateCommandBuffers)                                                                    \
    X(vkBeginCommandBuffer)                                                                        \
    X(vkEndCommandBuffer)                                                                          \
    X(vkResetCommandBuffer)                                                                        \
    X(vkCmdBindPipeline)                                                                           \
    X(vkCmdBindDescriptorSets)                                                                     \
    X(vkCmdPushConstants)                                                                          \
    X(vkCmdDispatch)                                                                               \
    X(vkCmdPipelineBarrier)                                                                        \
    X(vkCmdCopyBuffer)                                                                             \
    X(vkCmdFillBuffer)                                                                             \
    X(vkCmdResetQueryPool)                                                                         \
    X(vkCmdWriteTimestamp)                                                                         \
    X(vkCreateQueryPool)                                                                           \
    X(vkDestroyQueryPool)                                                                          \
    X(vkGetQueryPoolResults)                                                                       \
    X(vkCreateFence)                                                                               \
    X(vkDestroyFence)                                                                              \
    X(vkResetFences)                                                                               \
    X(vkWaitForFences)                                                                             \
    X(vkGetFenceStatus)                                                                            \
    X(vkQueueSubmit)

#define VK_FN_FIELD(name) PFN_##name name;

/* The loader library and the functions got through it. */
typedef struct vk_fns {
    void *lib; /* dlopen handle */
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
    PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion; /* NULL: a 1.0 loader */
    PFN_vkEnumerateInstanceExtensionProperties vkEnumerateInstanceExtensionProperties;
    VK_INSTANCE_FNS(VK_FN_FIELD)
    VK_DEVICE_FNS(VK_FN_FIELD)
    PFN_vkCmdPushDescriptorSetKHR vkCmdPushDescriptorSetKHR; /* NULL without the extension */
} vk_fns;

/* ---- vk_loader.c ---- */

/* Opens the loader ($CELLM_VULKAN_LOADER, else the platform's names) and
 * creates an instance (Vulkan 1.1) with its instance-level functions. */
cellm_status vk_instance_open(vk_fns *fn, VkInstance *inst, cellm_error *err);
/* Destroys the instance and closes the loader. */
void vk_instance_close(vk_fns *fn, VkInstance inst);
/* Loads the device-level functions of `dev`. */
cellm_status vk_load_device_fns(vk_fns *fn, VkDevice dev, bool push_descriptor, cellm_error *err);

/* "VK_ERROR_OUT_OF_DEVICE_MEMORY" and so on. */
const char *vk_result_str(VkResult r);
/* Records a failed Vulkan call: "vkAllocateMemory failed: VK_ERROR_..." with
 * the status the result maps to; returns it. */
cellm_status vk_fail(cellm_error *err, const char *call, VkResult r);
/* Counts device objects (vk_live_objects). */
void vk_live_add(long n);

/* ---- the handles ---- */

struct vk_buffer {
    vk_device *dev;
    VkBuffer buf;
    VkDeviceMemory mem;
    size_t size;     /* as asked for: what uploads, copies and bindings may touch */
    size_t vk_bytes; /* the VkBuffer's size: size rounded up to 4, so that a
                      * shader reading 32-bit words can read the last bytes */
    vk_buffer_kind kind;
    void *map;              /* mapped for the host kinds */
    bool coherent;          /* host writes and reads need no flush or invalidate */
    vk_buffer *prev, *next; /* the device's list */
};

struct vk_pipeline {
    vk_shader_id id;
    uint32_t spec[4];  /* the specialization constants it was made with */
    vk_pipeline *next; /* the device's list */
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout layout;
    VkPipeline pipe;
    const vk_shader_desc *desc;
};

/* Descriptor pools of a recorder that has no push descriptors: one per
 * `VK_POOL_SETS` dispatches, made as a recording needs them and reset by
 * vk_recorder_begin. */
enum { VK_POOL_SETS = 512, VK_POOL_MAX = 64 };

struct vk_recorder {
    vk_device *dev;
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkQueryPool queries; /* 2 + VK_MARKS_MAX timestamps, or VK_NULL_HANDLE */
    VkDescriptorPool pools[VK_POOL_MAX];
    uint32_t n_pools;             /* pools made */
    uint32_t pool_cur, pool_used; /* the pool in use and the sets taken from it */
    const vk_pipeline *bound;     /* the pipeline bound last in this recording */
    bool recording, pending, timed;
    bool replayable; /* the last recording ended well: vk_recorder_resubmit may run it */
    double gpu_ns;
    bool marks_on;
    uint32_t n_marks; /* marks recorded, then read back */
    uint32_t *mark_tags;
    double *mark_ns;
    cellm_error error; /* the first error while recording */
    vk_recorder *prev, *next;
};

struct vk_device {
    vk_fns fn;
    VkInstance inst;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    vk_device_info info;
    VkPhysicalDeviceMemoryProperties mem;
    uint64_t storage_align; /* minStorageBufferOffsetAlignment */
    float timestamp_period; /* ns per tick */
    uint32_t timeout_ms;
    double spin_ns; /* how long a wait polls the fence before it sleeps */
    size_t staging_bytes;
    bool use_push;
    vk_pipeline *pipes;     /* every pipeline made, by shader and constants */
    vk_buffer *buffers;     /* every live buffer, for vk_device_close */
    vk_recorder *recorders; /* every live recorder */
    vk_buffer *staging;     /* VK_BUF_UPLOAD, made on first upload */
    vk_buffer *readback;    /* VK_BUF_READBACK, made on first download */
    vk_recorder *xfer;      /* for the staging copies */
};

/* ---- vk_device.c ---- */

/* Gathers the properties of a physical device into `info`. */
void vk_describe(const vk_fns *fn, VkPhysicalDevice phys, uint32_t index, vk_device_info *info);

/* ---- vk_record.c ---- */

/* Frees a pipeline's objects (vk_device_close). */
void vk_pipeline_destroy(vk_device *dev, vk_pipeline *p);

#endif /* CELLM_VK_INTERNAL_H */
