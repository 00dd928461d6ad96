/*
 * vk_device.h — the Vulkan compute device: what the Vulkan backend stands on
 * (docs/gpu.md). It finds the GPUs (`cellm devices`), opens one with one
 * compute queue, owns buffers on it (weights uploaded once from the mmap,
 * activations, the KV pool), the compute pipelines built from the shaders
 * embedded in the library, and recorders: one engine step is recorded into
 * one command buffer (hundreds of dispatches, with barriers between the
 * ones that depend on each other), submitted once and waited on once.
 *
 * The library links no Vulkan library: the loader (libvulkan.so.1) is
 * opened with dlopen when a device is first asked for. Nothing here names a
 * Vulkan type, so the layers above include this header whether or not the
 * build has the backend; without it (CMake CELLM_VULKAN=OFF) every function
 * that can fail returns CELLM_ERR_UNSUPPORTED, "built without Vulkan".
 *
 * Errors: a missing loader, no usable device, or a feature the device lacks
 * is CELLM_ERR_UNSUPPORTED; a Vulkan call that fails is CELLM_ERR_IO (device
 * memory exhausted: CELLM_ERR_NO_MEMORY), with a message naming the call and
 * its VkResult. Nothing here prints.
 *
 * Threads: a device and everything made from it belong to one thread at a
 * time (the engine's step thread); vk_enumerate, vk_built and
 * vk_live_objects may be called from any thread.
 */
#ifndef CELLM_VK_DEVICE_H
#define CELLM_VK_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

/* True when the library was built with the Vulkan backend. */
bool vk_built(void);

/* Device objects alive in this process: instances, devices, buffers and
 * their memory, pipelines, recorders. 0 once every device is closed (the
 * tests check it). Thread-safe. */
long vk_live_objects(void);

typedef enum vk_device_type {
    VK_TYPE_OTHER = 0,
    VK_TYPE_INTEGRATED,
    VK_TYPE_DISCRETE,
    VK_TYPE_VIRTUAL,
    VK_TYPE_CPU,
} vk_device_type;

/* "discrete", "integrated", "virtual", "cpu" or "other". */
const char *vk_device_type_name(vk_device_type type);

/* What a physical device offers, as `cellm devices` lists it. */
typedef struct vk_device_info {
    uint32_t index; /* position in the loader's list: vk_device_open's index */
    char name[256];
    vk_device_type type;
    char driver[256];     /* driver name and version string, "" when not told */
    uint32_t api_version; /* VK_MAKE_API_VERSION packing: major << 22 | minor << 12 | patch */
    uint64_t device_local_bytes; /* the largest device-local memory heap */
    uint32_t subgroup_size;
    bool storage16;      /* 16-bit values in storage buffers */
    bool storage8;       /* 8-bit values in storage buffers */
    bool shader_int8;    /* int8 arithmetic in shaders */
    bool shader_float16; /* float16 arithmetic in shaders */
    bool int_dot;        /* VK_KHR_shader_integer_dot_product */
    bool push_descriptor;
    bool timestamps; /* the compute queue can time a recording */
    bool usable;     /* Vulkan 1.1 and a compute queue: vk_device_open takes it */
    uint32_t max_workgroups[3];
    uint64_t max_storage_range; /* the most bytes one buffer binding may span */
    uint32_t max_shared;        /* bytes of shared memory a workgroup may use */
    uint32_t max_invocations;   /* invocations of a one-dimensional workgroup */
} vk_device_info;

/* Lists the physical devices into out[0..cap) and sets *n to how many there
 * are (which may be more than cap). A missing loader or a loader without a
 * device: CELLM_ERR_UNSUPPORTED and a message saying which. */
cellm_status vk_enumerate(vk_device_info *out, uint32_t cap, uint32_t *n, cellm_error *err);

/* The index in infos[0..n) of the device vk_device_open takes by default:
 * the first usable one of the best type (discrete > integrated > virtual >
 * cpu > other), or -1 when none is usable. */
int vk_pick_best(const vk_device_info *infos, uint32_t n);

/* "1.3.230" from an api_version, into buf (at least 16 bytes). */
const char *vk_version_str(uint32_t api_version, char *buf, size_t cap);

typedef struct vk_device vk_device;

typedef struct vk_open_params {
    int index;               /* a device index from vk_enumerate, or -1 for the best */
    bool no_push_descriptor; /* use descriptor pools even where push descriptors exist */
    uint32_t timeout_ms;     /* how long a submission may run before it is an error (the
                              * default, 60 s, is 10 min on a CPU-emulated device) */
    size_t staging_bytes;    /* upload/download staging buffer (rounded to 4 bytes) */
} vk_open_params;

/* index -1, push descriptors where present, a 60 s timeout, 64 MiB staging. */
vk_open_params vk_open_default_params(void);

/* Opens a device: the given index, or the best usable one (discrete >
 * integrated > virtual > cpu; the first of a kind). The device owns
 * everything made from it until vk_device_close. $CELLM_VULKAN_LOADER, when
 * set, names the loader library to open instead of libvulkan.so.1 (a loader
 * carried with a build; the tests point it at a name that does not exist). */
cellm_status vk_device_open(const vk_open_params *params, vk_device **out, cellm_error *err);

/* Waits for the device to finish and frees everything made from it that
 * is still alive (buffers, recorders, pipelines), then the device. NULL is
 * a no-op. */
void vk_device_close(vk_device *dev);

const vk_device_info *vk_device_get_info(const vk_device *dev);

/* ---- buffers ---- */

typedef enum vk_buffer_kind {
    VK_BUF_DEVICE = 0, /* device-local: weights, activations, the KV pool */
    VK_BUF_UPLOAD,     /* host-visible, mapped, written by the host */
    VK_BUF_READBACK,   /* host-visible and cached where the device has it, read by the host */
} vk_buffer_kind;

typedef struct vk_buffer vk_buffer;

/* A buffer of `bytes` (> 0) usable as a storage buffer and as the source and
 * destination of copies. Freed by vk_buffer_free or vk_device_close. */
cellm_status vk_buffer_create(vk_device *dev, size_t bytes, vk_buffer_kind kind, vk_buffer **out,
                              cellm_error *err);
void vk_buffer_free(vk_buffer *buf); /* NULL is a no-op; the device must be idle for it */
size_t vk_buffer_size(const vk_buffer *buf);

/* Copies host memory into a buffer of any kind: through the device's
 * staging buffer in chunks of at most its size for a device-local buffer
 * (each chunk submitted and waited on), directly for a mapped one. Weights
 * come straight from the GGUF mmap this way. Not while a recording is
 * pending on the device. */
cellm_status vk_buffer_upload(vk_buffer *dst, size_t offset, const void *src, size_t bytes,
                              cellm_error *err);

/* Copies a buffer's bytes into host memory, the same way back. */
cellm_status vk_buffer_download(const vk_buffer *src, size_t offset, void *dst, size_t bytes,
                                cellm_error *err);

/* A mapped buffer's (VK_BUF_UPLOAD, VK_BUF_READBACK) memory, made current
 * for the host to read what the device wrote: the same bytes as a
 * download without copying them. NULL with an error for a device buffer. */
cellm_status vk_buffer_read_mapped(const vk_buffer *buf, const void **out, cellm_error *err);

/* ---- pipelines ---- */

/* The shaders the library carries (src/vulkan/vk_shaders.c lists each one's
 * bindings and push constants). */
typedef enum vk_shader_id {
    VK_SHADER_MATMUL_F32 = 0,
    VK_SHADER_MATMUL_F16,
    VK_SHADER_MATMUL_Q4_0,
    VK_SHADER_MATMUL_Q4_1,
    VK_SHADER_MATMUL_Q5_0,
    VK_SHADER_MATMUL_Q8_0,
    VK_SHADER_MATMUL_Q4_K,
    VK_SHADER_MATMUL_Q5_K,
    VK_SHADER_MATMUL_Q6_K,
    /* One invocation per output, for CPU-emulated devices (vk_matmul.h). */
    VK_SHADER_MATMULL_F32,
    VK_SHADER_MATMULL_F16,
    VK_SHADER_MATMULL_Q4_0,
    VK_SHADER_MATMULL_Q4_1,
    VK_SHADER_MATMULL_Q5_0,
    VK_SHADER_MATMULL_Q8_0,
    VK_SHADER_MATMULL_Q4_K,
    VK_SHADER_MATMULL_Q5_K,
    VK_SHADER_MATMULL_Q6_K,
    VK_SHADER_MATMULG_F32,
    VK_SHADER_MATMULG_F16,
    VK_SHADER_MATMULG_Q4_0,
    VK_SHADER_MATMULG_Q4_1,
    VK_SHADER_MATMULG_Q5_0,
    VK_SHADER_MATMULG_Q8_0,
    VK_SHADER_MATMULG_Q4_K,
    VK_SHADER_MATMULG_Q5_K,
    VK_SHADER_MATMULG_Q6_K,
    VK_SHADER_MATMULQ_F32,
    VK_SHADER_MATMULQ_F16,
    VK_SHADER_MATMULQ_Q4_0,
    VK_SHADER_MATMULQ_Q4_1,
    VK_SHADER_MATMULQ_Q5_0,
    VK_SHADER_MATMULQ_Q8_0,
    VK_SHADER_MATMULQ_Q4_K,
    VK_SHADER_MATMULQ_Q5_K,
    VK_SHADER_MATMULQ_Q6_K,
    VK_SHADER_MATMULLQ_F32,
    VK_SHADER_MATMULLQ_F16,
    VK_SHADER_MATMULLQ_Q4_0,
    VK_SHADER_MATMULLQ_Q4_1,
    VK_SHADER_MATMULLQ_Q5_0,
    VK_SHADER_MATMULLQ_Q8_0,
    VK_SHADER_MATMULLQ_Q4_K,
    VK_SHADER_MATMULLQ_Q5_K,
    VK_SHADER_MATMULLQ_Q6_K,
    VK_SHADER_MATMULGQ_F32,
    VK_SHADER_MATMULGQ_F16,
    VK_SHADER_MATMULGQ_Q4_0,
    VK_SHADER_MATMULGQ_Q4_1,
    VK_SHADER_MATMULGQ_Q5_0,
    VK_SHADER_MATMULGQ_Q8_0,
    VK_SHADER_MATMULGQ_Q4_K,
    VK_SHADER_MATMULGQ_Q5_K,
    VK_SHADER_MATMULGQ_Q6_K,
    VK_SHADER_MATMULT_F32, /* matmul.comp -DTILED: prompts (vk_matmul.c) */
    VK_SHADER_MATMULT_F16,
    VK_SHADER_MATMULT_Q4_0,
    VK_SHADER_MATMULT_Q4_1,
    VK_SHADER_MATMULT_Q5_0,
    VK_SHADER_MATMULT_Q8_0,
    VK_SHADER_MATMULT_Q4_K,
    VK_SHADER_MATMULT_Q5_K,
    VK_SHADER_MATMULT_Q6_K,
    VK_SHADER_MATMULTG_F32,
    VK_SHADER_MATMULTG_F16,
    VK_SHADER_MATMULTG_Q4_0,
    VK_SHADER_MATMULTG_Q4_1,
    VK_SHADER_MATMULTG_Q5_0,
    VK_SHADER_MATMULTG_Q8_0,
    VK_SHADER_MATMULTG_Q4_K,
    VK_SHADER_MATMULTG_Q5_K,
    VK_SHADER_MATMULTG_Q6_K,
    VK_SHADER_RMSNORM,
    VK_SHADER_QK_PREP,
    VK_SHADER_ATTENTION,
    VK_SHADER_ATTENTION_PREFILL, /* attention.comp -DPREFILL: batches not all decode */
    VK_SHADER_ACT,
    VK_SHADER_ADD_NORM,
    VK_SHADER_LOGITS,
    VK_SHADER_TOP,
    VK_SHADER_COUNT
} vk_shader_id;

typedef struct vk_pipeline vk_pipeline;

/* The compute pipeline of a shader, created on first use (its
 * specialization constants filled from the device: vk_shaders.c) and kept
 * until vk_device_close. */
cellm_status vk_pipeline_get(vk_device *dev, vk_shader_id id, const vk_pipeline **out,
                             cellm_error *err);

/* The pipeline of a shader with its specialization constants 0..3 set to
 * spec[0..3] instead of the table's (as many as the shader declares are
 * used), made on first use of that combination and kept until close. */
cellm_status vk_pipeline_get_spec(vk_device *dev, vk_shader_id id, const uint32_t spec[4],
                                  const vk_pipeline **out, cellm_error *err);

/* ---- recording ---- */

typedef struct vk_recorder vk_recorder;

/* A part of a buffer bound to a shader's storage binding. The recorder
 * binds from `offset` rounded down to the device's alignment and tells the
 * shader nothing: shaders that take offsets get them in push constants
 * (vk_binding_shift says by how much the binding starts early).
 * range 0 means to the end of the buffer. */
typedef struct vk_binding {
    const vk_buffer *buf;
    size_t offset;
    size_t range;
} vk_binding;

/* Bytes from the start of the binding the recorder makes for `offset` to
 * `offset` itself (offset modulo the device's storage offset alignment). */
size_t vk_binding_shift(const vk_device *dev, size_t offset);

/* A command buffer with its fence (and timestamp queries where the queue
 * has them). Several may exist; each is recorded and submitted on its own. */
cellm_status vk_recorder_create(vk_device *dev, vk_recorder **out, cellm_error *err);
void vk_recorder_free(vk_recorder *rec); /* NULL is a no-op; waits for its submission */
vk_device *vk_recorder_device(vk_recorder *rec);

/* Starts a recording (after the previous one's submission has finished):
 * resets the command buffer and the descriptors of the last recording. */
cellm_status vk_recorder_begin(vk_recorder *rec, cellm_error *err);

/* Records one dispatch of `pipe` over groups[0..2] workgroups, its storage
 * bindings b[0..n_bindings) (as many as the shader declares) and its push
 * constants (as many bytes as the shader declares). An error here (a
 * binding out of range, descriptors exhausted) is also kept by the recorder
 * and returned again by vk_recorder_submit, so a long recording may check
 * only there. */
cellm_status vk_recorder_dispatch(vk_recorder *rec, const vk_pipeline *pipe, const vk_binding *b,
                                  uint32_t n_bindings, const void *push, size_t push_bytes,
                                  const uint32_t groups[3], cellm_error *err);

/* Makes every write recorded so far (dispatches, copies, fills) visible to
 * every dispatch and copy recorded after it. Put one between dependent
 * dispatches; independent ones may share a stage without it. */
void vk_recorder_barrier(vk_recorder *rec);

/* Records a copy of `bytes` from src+src_off to dst+dst_off (offsets and
 * size multiples of 4 where a fill follows; any for a copy). */
cellm_status vk_recorder_copy(vk_recorder *rec, const vk_buffer *src, size_t src_off,
                              const vk_buffer *dst, size_t dst_off, size_t bytes, cellm_error *err);

/* Records filling `bytes` (a multiple of 4) at dst+offset (a multiple of 4)
 * with the 32-bit word `value`. */
cellm_status vk_recorder_fill(vk_recorder *rec, const vk_buffer *dst, size_t offset, size_t bytes,
                              uint32_t value, cellm_error *err);

/* Ends the recording, submits it, and waits for it: a submission running
 * past the device's timeout is CELLM_ERR_IO ("timed out"). Returns the
 * first error kept while recording, if any (then nothing is submitted). */
cellm_status vk_recorder_submit(vk_recorder *rec, cellm_error *err);

/* Submits the last recording again, as it was, and waits for it (after
 * vk_recorder_submit ended it well; nothing recorded since). What it reads
 * from host-written buffers is read anew, so a step whose shape has not
 * changed can skip recording: its data lives in buffers, not in the
 * commands. */
cellm_status vk_recorder_resubmit(vk_recorder *rec, cellm_error *err);

/* GPU time in nanoseconds of the last submitted recording, from timestamps
 * written at its start and end; -1 where the queue cannot time it. */
double vk_recorder_gpu_ns(const vk_recorder *rec);

/* Profiling marks (off by default). With marks on, each
 * vk_recorder_mark writes a timestamp once every command recorded before
 * it has finished, tagged with `tag` (the caller's meaning), up to
 * VK_MARKS_MAX a recording (more are dropped). After the submission,
 * vk_recorder_marks gives the count, the tags and each mark's time in ns
 * from the recording's start; 0 marks where the queue has no timestamps. */
enum { VK_MARKS_MAX = 2048 };
void vk_recorder_set_marks(vk_recorder *rec, bool on);
void vk_recorder_mark(vk_recorder *rec, uint32_t tag);
uint32_t vk_recorder_marks(const vk_recorder *rec, const uint32_t **tags, const double **ns);

#endif /* CELLM_VK_DEVICE_H */
