/*
 * vk_shaders.h — the SPIR-V modules embedded in the library and what the
 * recorder must know about each shader: its storage bindings, the size of
 * its push constants and its specialization constants. The modules are
 * compiled from the .comp files of src/vulkan/shaders by glslc at build time and turned
 * into a C file by cmake/spv2c.cmake (cmake/vulkan.cmake lists them).
 */
#ifndef CELLM_VK_SHADERS_H
#define CELLM_VK_SHADERS_H

#include <stddef.h>
#include <stdint.h>

#include "vulkan/vk_device.h"

/* One embedded module (generated: vk_spirv.c in the build folder). */
typedef struct vk_spirv {
    const char *name;          /* as cmake/vulkan.cmake names it: "matmul_q4_0" */
    const unsigned char *code; /* 4-byte aligned */
    size_t bytes;
} vk_spirv;

extern const vk_spirv vk_spirv_table[];
extern const unsigned vk_spirv_count;

/* A specialization constant's value, or where the device supplies it. */
enum { VK_SPEC_SUBGROUP_SIZE = 0xFFFFFFFFu };

typedef struct vk_shader_desc {
    const char *spirv;   /* module name in vk_spirv_table */
    uint32_t n_bindings; /* storage buffers at bindings 0..n-1 of set 0 */
    uint32_t push_bytes; /* push constant block size (multiple of 4, <= 128) */
    uint32_t n_spec;     /* specialization constants 0..n_spec-1 */
    uint32_t spec[4];    /* their values; VK_SPEC_SUBGROUP_SIZE: the device's */
} vk_shader_desc;

/* The description of a shader id (vk_shaders.c). */
const vk_shader_desc *vk_shader_get(vk_shader_id id);

/* top.comp's push constants (its header says what each stage does), and
 * its lists per row: one per 4,096 logits. */
typedef struct vk_top_push {
    uint32_t n, shift, out0, stage, slices;
} vk_top_push;

static inline uint32_t vk_top_slices(uint32_t n_vocab) {
    return (n_vocab + 4095) / 4096;
}

/* The module called `name`, or NULL. */
const vk_spirv *vk_spirv_find(const char *name);

#endif /* CELLM_VK_SHADERS_H */
