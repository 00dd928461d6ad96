/*
 * vk_stub.c — the Vulkan backend's entry points in a build without it
 * (CMake CELLM_VULKAN=OFF, or AUTO without the Vulkan headers or glslc):
 * each one that can fail says so with CELLM_ERR_UNSUPPORTED, so callers
 * need no #ifdef. cmake/vulkan.cmake compiles this file instead of the
 * backend's others.
 */
#include <stdio.h>

#include "vulkan/vk_device.h"
#include "vulkan/vk_forward.h"
#include "vulkan/vk_matmul.h"

static cellm_status unsupported(cellm_error *err) {
    return err_set(err, CELLM_ERR_UNSUPPORTED,
                   "built without Vulkan (configure with -DCELLM_VULKAN=ON: needs libvulkan-dev "
                   "and glslc)");
}

bool vk_built(void) {
    return false;
}

long vk_live_objects(void) {
    return 0;
}

const char *vk_device_type_name(vk_device_type type) {
    static const char *const names[] = {"other", "integrated", "discrete", "virtual", "cpu"};
    return (unsigned)type < 5 ? names[type] : "other";
}

const char *vk_version_str(uint32_t v, char *buf, size_t cap) {
    snprintf(buf, cap, "%u.%u.%u", (v >> 22) & 0x7Fu, (v >> 12) & 0x3FFu, v & 0xFFFu);
    return buf;
}

cellm_status vk_enumerate(vk_device_info *out, uint32_t cap, uint32_t *n, cellm_error *err) {
    (void)out;
    (void)cap;
    *n = 0;
    return unsupported(err);
}

int vk_pick_best(const vk_device_info *infos, uint32_t n) {
    (void)infos;
    (void)n;
    return -1;
}

vk_open_params vk_open_default_params(void) {
    vk_open_params p = {.index = -1, .timeout_ms = 60000, .staging_bytes = (size_t)64 << 20};
    return p;
}

cellm_status vk_device_open(const vk_open_params *params, vk_device **out, cellm_error *err) {
    (void)params;
    *out = NULL;
    return unsupported(err);
}

void vk_device_close(vk_device *dev) {
    (void)dev;
}

const vk_device_info *vk_device_get_info(const vk_device *dev) {
    (void)dev;
    return NULL;
}

cellm_status vk_buffer_create(vk_device *dev, size_t bytes, vk_buffer_kind kind, vk_buffer **out,
                              cellm_error *err) {
    (void)dev;
    (void)bytes;
    (void)kind;
    *out = NULL;
    return unsupported(err);
}

void vk_buffer_free(vk_buffer *buf) {
    (void)buf;
}

size_t vk_buffer_size(const vk_buffer *buf) {
    (void)buf;
    return 0;
}

cellm_status vk_buffer_upload(vk_buffer *dst, size_t offset, const void *src, size_t bytes,
                              cellm_error *err) {
    (void)dst;
    (void)offset;
    (void)src;
    (void)bytes;
    return unsupported(err);
}

cellm_status vk_buffer_read_mapped(const vk_buffer *buf, const void **out, cellm_error *err) {
    (void)buf;
    *out = NULL;
    return unsupported(err);
}

cellm_status vk_buffer_download(const vk_buffer *src, size_t offset, void *dst, size_t bytes,
                                cellm_error *err) {
    (void)src;
    (void)offset;
    (void)dst;
    (void)bytes;
    return unsupported(err);
}

cellm_status vk_pipeline_get(vk_device *dev, vk_shader_id id, const vk_pipeline **out,
                             cellm_error *err) {
    (void)dev;
    (void)id;
    *out = NULL;
    return unsupported(err);
}

cellm_status vk_pipeline_get_spec(vk_device *dev, vk_shader_id id, const uint32_t spec[4],
                                  const vk_pipeline **out, cellm_error *err) {
    (void)dev;
    (void)id;
    (void)spec;
    *out = NULL;
    return unsupported(err);
}

size_t vk_binding_shift(const vk_device *dev, size_t offset) {
    (void)dev;
    (void)offset;
    return 0;
}

cellm_status vk_recorder_create(vk_device *dev, vk_recorder **out, cellm_error *err) {
    (void)dev;
    *out = NULL;
    return unsupported(err);
}

void vk_recorder_free(vk_recorder *rec) {
    (void)rec;
}

vk_device *vk_recorder_device(vk_recorder *rec) {
    (void)rec;
    return NULL;
}

cellm_status vk_recorder_begin(vk_recorder *rec, cellm_error *err) {
    (void)rec;
    return unsupported(err);
}

cellm_status vk_recorder_dispatch(vk_recorder *rec, const vk_pipeline *pipe, const vk_binding *b,
                                  uint32_t n_bindings, const void *push, size_t push_bytes,
                                  const uint32_t groups[3], cellm_error *err) {
    (void)rec;
    (void)pipe;
    (void)b;
    (void)n_bindings;
    (void)push;
    (void)push_bytes;
    (void)groups;
    return unsupported(err);
}

void vk_recorder_barrier(vk_recorder *rec) {
    (void)rec;
}

cellm_status vk_recorder_copy(vk_recorder *rec, const vk_buffer *src, size_t src_off,
                              const vk_buffer *dst, size_t dst_off, size_t bytes,
                              cellm_error *err) {
    (void)rec;
    (void)src;
    (void)src_off;
    (void)dst;
    (void)dst_off;
    (void)bytes;
    return unsupported(err);
}

cellm_status vk_recorder_fill(vk_recorder *rec, const vk_buffer *dst, size_t offset, size_t bytes,
                              uint32_t value, cellm_error *err) {
    (void)rec;
    (void)dst;
    (void)offset;
    (void)bytes;
    (void)value;
    return unsupported(err);
}

cellm_status vk_recorder_submit(vk_recorder *rec, cellm_error *err) {
    (void)rec;
    return unsupported(err);
}

cellm_status vk_recorder_resubmit(vk_recorder *rec, cellm_error *err) {
    (void)rec;
    return unsupported(err);
}

double vk_recorder_gpu_ns(const vk_recorder *rec) {
    (void)rec;
    return -1;
}

void vk_recorder_set_marks(vk_recorder *rec, bool on) {
    (void)rec;
    (void)on;
}

void vk_recorder_mark(vk_recorder *rec, uint32_t tag) {
    (void)rec;
    (void)tag;
}

uint32_t vk_recorder_marks(const vk_recorder *rec, const uint32_t **tags, const double **ns) {
    (void)rec;
    *tags = NULL;
    *ns = NULL;
    return 0;
}

bool vk_matmul_lane_variant(const vk_device *d) {
    (void)d;
    return false;
}

bool vk_matmul_rounds_activations(void) {
    return false;
}

bool vk_matmul_tiled(const vk_device *d, uint32_t n_rows) {
    (void)d;
    (void)n_rows;
    return false;
}

bool vk_matmul_supports(uint32_t type) {
    (void)type;
    return false;
}

cellm_status vk_matmul_record(vk_recorder *rec, const vk_matmul_args *a, cellm_error *err) {
    (void)rec;
    (void)a;
    return unsupported(err);
}

cellm_status vk_matmul_prepare(vk_device *d, uint32_t type, uint32_t cols, bool glu, uint32_t act,
                               cellm_error *err) {
    (void)d;
    (void)type;
    (void)cols;
    (void)glu;
    (void)act;
    return unsupported(err);
}

cellm_status vk_matmul(vk_recorder *rec, uint32_t type, const vk_buffer *w, size_t w_off,
                       uint32_t rows, uint32_t cols, const vk_buffer *x, size_t x_off,
                       const vk_buffer *y, size_t y_off, uint32_t n_rows, cellm_error *err) {
    (void)rec;
    (void)type;
    (void)w;
    (void)w_off;
    (void)rows;
    (void)cols;
    (void)x;
    (void)x_off;
    (void)y;
    (void)y_off;
    (void)n_rows;
    return unsupported(err);
}

cellm_status vk_backend(bool gpu_only, const model *m, kv_cache *kv, const vk_lower *lower,
                        int32_t max_rows, int32_t max_logit_rows, backend *out, cellm_error *err) {
    (void)gpu_only, (void)m, (void)kv, (void)max_rows, (void)max_logit_rows;
    if (lower && lower->free) lower->free(lower->user);
    *out = (backend){0};
    return unsupported(err);
}

uint64_t vk_backend_bytes(const model *m, const kv_cache *kv, int32_t layer0, int32_t max_rows,
                          int32_t max_logit_rows) {
    (void)m, (void)kv, (void)layer0, (void)max_rows, (void)max_logit_rows;
    return 0;
}
