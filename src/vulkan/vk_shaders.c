/*
 * vk_shaders.c — the shader table: for each vk_shader_id, the embedded
 * SPIR-V module it is built from, its storage bindings, its push constant
 * block and its specialization constants. Adding a shader: its .comp in
 * src/vulkan/shaders, a line in cmake/vulkan.cmake, an id in vk_device.h
 * and a row here (docs/gpu.md).
 */
#include <string.h>

#include "vulkan/vk_shaders.h"

/* matmul.comp: W (weights as stored in the file), X (f32 rows), Y (f32
 * rows); push constants: vk_matmul.c's matmul_push (8 words). */
/* Specialization constants of matmul.comp: 0, activation rows per
 * workgroup (8; vk_matmul asks for 1 for a single row); 1, the GLU form's
 * activation; 2, outputs per invocation (vk_matmul: 1, 2 or 4 by the
 * batch's rows); 3, partial sums per output (vk_matmul: from K). */
#define MATMUL(name)                                                                               \
    {                                                                                              \
        name, 3, 32, 4, {                                                                          \
            8, 0, 1, 16                                                                            \
        }                                                                                          \
    }

/* The GLU-input form (-DX_GLU): a fourth binding (u) and constant 1, the
 * activation's kind (act.glsl). */
#define MATMULG(name)                                                                              \
    {                                                                                              \
        name, 4, 32, 4, {                                                                          \
            8, 0, 1, 16                                                                            \
        }                                                                                          \
    }

/* The tiled forms (-DTILED, and with the GLU input): constants 0 and 2
 * are the workgroup's size and the invocations along the outputs, as
 * matmul.comp's defaults (vk_matmul.c always gives its own). */
#define MATMULT_N(name, bindings)                                                                  \
    {                                                                                              \
        name, bindings, 32, 4, {                                                                   \
            256, 0, 16, 16                                                                         \
        }                                                                                          \
    }
#define MATMULT(name) MATMULT_N(name, 3)
#define MATMULTG(name) MATMULT_N(name, 4)

static const vk_shader_desc shaders[VK_SHADER_COUNT] = {
    [VK_SHADER_MATMUL_F32] = MATMUL("matmul_f32"),
    [VK_SHADER_MATMUL_F16] = MATMUL("matmul_f16"),
    [VK_SHADER_MATMUL_Q4_0] = MATMUL("matmul_q4_0"),
    [VK_SHADER_MATMUL_Q4_1] = MATMUL("matmul_q4_1"),
    [VK_SHADER_MATMUL_Q5_0] = MATMUL("matmul_q5_0"),
    [VK_SHADER_MATMUL_Q8_0] = MATMUL("matmul_q8_0"),
    [VK_SHADER_MATMUL_Q4_K] = MATMUL("matmul_q4_k"),
    [VK_SHADER_MATMUL_Q5_K] = MATMUL("matmul_q5_k"),
    [VK_SHADER_MATMUL_Q6_K] = MATMUL("matmul_q6_k"),
    [VK_SHADER_MATMULL_F32] = MATMUL("matmulL_f32"),
    [VK_SHADER_MATMULL_F16] = MATMUL("matmulL_f16"),
    [VK_SHADER_MATMULL_Q4_0] = MATMUL("matmulL_q4_0"),
    [VK_SHADER_MATMULL_Q4_1] = MATMUL("matmulL_q4_1"),
    [VK_SHADER_MATMULL_Q5_0] = MATMUL("matmulL_q5_0"),
    [VK_SHADER_MATMULL_Q8_0] = MATMUL("matmulL_q8_0"),
    [VK_SHADER_MATMULL_Q4_K] = MATMUL("matmulL_q4_k"),
    [VK_SHADER_MATMULL_Q5_K] = MATMUL("matmulL_q5_k"),
    [VK_SHADER_MATMULL_Q6_K] = MATMUL("matmulL_q6_k"),
    [VK_SHADER_MATMULG_F32] = MATMULG("matmulG_f32"),
    [VK_SHADER_MATMULG_F16] = MATMULG("matmulG_f16"),
    [VK_SHADER_MATMULG_Q4_0] = MATMULG("matmulG_q4_0"),
    [VK_SHADER_MATMULG_Q4_1] = MATMULG("matmulG_q4_1"),
    [VK_SHADER_MATMULG_Q5_0] = MATMULG("matmulG_q5_0"),
    [VK_SHADER_MATMULG_Q8_0] = MATMULG("matmulG_q8_0"),
    [VK_SHADER_MATMULG_Q4_K] = MATMULG("matmulG_q4_k"),
    [VK_SHADER_MATMULG_Q5_K] = MATMULG("matmulG_q5_k"),
    [VK_SHADER_MATMULG_Q6_K] = MATMULG("matmulG_q6_k"),
    /* The forms that round the activations as the CPU does (-DX_Q8,
     * $CELLM_VK_ACT=q8); F32 weights meet f32 activations there too, so
     * their entries are the plain modules. */
    [VK_SHADER_MATMULQ_F32] = MATMUL("matmul_f32"),
    [VK_SHADER_MATMULQ_F16] = MATMUL("matmulQ_f16"),
    [VK_SHADER_MATMULQ_Q4_0] = MATMUL("matmulQ_q4_0"),
    [VK_SHADER_MATMULQ_Q4_1] = MATMUL("matmulQ_q4_1"),
    [VK_SHADER_MATMULQ_Q5_0] = MATMUL("matmulQ_q5_0"),
    [VK_SHADER_MATMULQ_Q8_0] = MATMUL("matmulQ_q8_0"),
    [VK_SHADER_MATMULQ_Q4_K] = MATMUL("matmulQ_q4_k"),
    [VK_SHADER_MATMULQ_Q5_K] = MATMUL("matmulQ_q5_k"),
    [VK_SHADER_MATMULQ_Q6_K] = MATMUL("matmulQ_q6_k"),
    [VK_SHADER_MATMULLQ_F32] = MATMUL("matmulL_f32"),
    [VK_SHADER_MATMULLQ_F16] = MATMUL("matmulLQ_f16"),
    [VK_SHADER_MATMULLQ_Q4_0] = MATMUL("matmulLQ_q4_0"),
    [VK_SHADER_MATMULLQ_Q4_1] = MATMUL("matmulLQ_q4_1"),
    [VK_SHADER_MATMULLQ_Q5_0] = MATMUL("matmulLQ_q5_0"),
    [VK_SHADER_MATMULLQ_Q8_0] = MATMUL("matmulLQ_q8_0"),
    [VK_SHADER_MATMULLQ_Q4_K] = MATMUL("matmulLQ_q4_k"),
    [VK_SHADER_MATMULLQ_Q5_K] = MATMUL("matmulLQ_q5_k"),
    [VK_SHADER_MATMULLQ_Q6_K] = MATMUL("matmulLQ_q6_k"),
    [VK_SHADER_MATMULGQ_F32] = MATMULG("matmulG_f32"),
    [VK_SHADER_MATMULGQ_F16] = MATMULG("matmulGQ_f16"),
    [VK_SHADER_MATMULGQ_Q4_0] = MATMULG("matmulGQ_q4_0"),
    [VK_SHADER_MATMULGQ_Q4_1] = MATMULG("matmulGQ_q4_1"),
    [VK_SHADER_MATMULGQ_Q5_0] = MATMULG("matmulGQ_q5_0"),
    [VK_SHADER_MATMULGQ_Q8_0] = MATMULG("matmulGQ_q8_0"),
    [VK_SHADER_MATMULGQ_Q4_K] = MATMULG("matmulGQ_q4_k"),
    [VK_SHADER_MATMULGQ_Q5_K] = MATMULG("matmulGQ_q5_k"),
    [VK_SHADER_MATMULGQ_Q6_K] = MATMULG("matmulGQ_q6_k"),
    /* The tiled forms for prompts (-DTILED): constant 0 is the workgroup's
     * size, 2 the invocations along the outputs (vk_matmul.c). */
    [VK_SHADER_MATMULT_F32] = MATMULT("matmulT_f32"),
    [VK_SHADER_MATMULT_F16] = MATMULT("matmulT_f16"),
    [VK_SHADER_MATMULT_Q4_0] = MATMULT("matmulT_q4_0"),
    [VK_SHADER_MATMULT_Q4_1] = MATMULT("matmulT_q4_1"),
    [VK_SHADER_MATMULT_Q5_0] = MATMULT("matmulT_q5_0"),
    [VK_SHADER_MATMULT_Q8_0] = MATMULT("matmulT_q8_0"),
    [VK_SHADER_MATMULT_Q4_K] = MATMULT("matmulT_q4_k"),
    [VK_SHADER_MATMULT_Q5_K] = MATMULT("matmulT_q5_k"),
    [VK_SHADER_MATMULT_Q6_K] = MATMULT("matmulT_q6_k"),
    [VK_SHADER_MATMULTG_F32] = MATMULTG("matmulTG_f32"),
    [VK_SHADER_MATMULTG_F16] = MATMULTG("matmulTG_f16"),
    [VK_SHADER_MATMULTG_Q4_0] = MATMULTG("matmulTG_q4_0"),
    [VK_SHADER_MATMULTG_Q4_1] = MATMULTG("matmulTG_q4_1"),
    [VK_SHADER_MATMULTG_Q5_0] = MATMULTG("matmulTG_q5_0"),
    [VK_SHADER_MATMULTG_Q8_0] = MATMULTG("matmulTG_q8_0"),
    [VK_SHADER_MATMULTG_Q4_K] = MATMULTG("matmulTG_q4_k"),
    [VK_SHADER_MATMULTG_Q5_K] = MATMULTG("matmulTG_q5_k"),
    [VK_SHADER_MATMULTG_Q6_K] = MATMULTG("matmulTG_q6_k"),
    /* The forward pass's other shaders: bindings and push constants as
     * each .comp declares them. */
    [VK_SHADER_RMSNORM] = {"rmsnorm", 4, 24, 0, {0}},
    [VK_SHADER_QK_PREP] = {"qk_prep", 9, 56, 0, {0}},
    [VK_SHADER_ATTENTION] = {"attention", 10, 72, 0, {0}},
    [VK_SHADER_ATTENTION_PREFILL] = {"attention_prefill", 10, 72, 0, {0}},
    [VK_SHADER_ACT] = {"act", 2, 8, 0, {0}},
    [VK_SHADER_ADD_NORM] = {"add_norm", 5, 20, 0, {0}},
    [VK_SHADER_LOGITS] = {"logits", 1, 12, 0, {0}},
    [VK_SHADER_TOP] = {"top", 2, 20, 0, {0}},
};

const vk_shader_desc *vk_shader_get(vk_shader_id id) {
    if ((unsigned)id >= VK_SHADER_COUNT || !shaders[id].spirv) return NULL;
    return &shaders[id];
}

const vk_spirv *vk_spirv_find(const char *name) {
    for (unsigned i = 0; i < vk_spirv_count; i++)
        if (!strcmp(vk_spirv_table[i].name, name)) return &vk_spirv_table[i];
    return NULL;
}
