/*
 * vk_matmul.c — records matmul.comp (vk_matmul.h): picks the module of the
 * weight type, binds the three operands from their offsets rounded down to
 * the device's alignment (the remainders go to the shader as push
 * constants), and covers the outputs with workgroups of 128 / LANES
 * times OPT outputs by MM_ROWS activation rows (matmul_pipeline). Output
 * tiles past the device's first workgroup-count limit continue in the
 * third dimension (Gemma 3's 262144 vocabulary rows are 32768 tiles; some
 * devices stop at 65535).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "vulkan/vk_internal.h"
#include "vulkan/vk_matmul.h"

/* matmul.comp's TR for batches, and the batches past which OPT is 4. */
enum { MM_ROWS = 8, MM_OPT4_ROWS = 128 };

/* The push constants of matmul.comp, in its order. */
typedef struct matmul_push {
    uint32_t K, N, n_rows, w_off, x_off, y_off, x_stride, y_stride;
} matmul_push;

static int shader_of(uint32_t type) {
    switch (type) {
    case QT_F32: return VK_SHADER_MATMUL_F32;
    case QT_F16: return VK_SHADER_MATMUL_F16;
    case QT_Q4_0: return VK_SHADER_MATMUL_Q4_0;
    case QT_Q4_1: return VK_SHADER_MATMUL_Q4_1;
    case QT_Q5_0: return VK_SHADER_MATMUL_Q5_0;
    case QT_Q8_0: return VK_SHADER_MATMUL_Q8_0;
    case QT_Q4_K: return VK_SHADER_MATMUL_Q4_K;
    case QT_Q5_K: return VK_SHADER_MATMUL_Q5_K;
    case QT_Q6_K: return VK_SHADER_MATMUL_Q6_K;
    default: return -1;
    }
}

bool vk_matmul_lane_variant(const vk_device *d) {
    const char *v = getenv("CELLM_VK_MATMUL");
    if (v && !strcmp(v, "lane")) return true;
    if (v && !strcmp(v, "coop")) return false;
    return vk_device_get_info(d)->type == VK_TYPE_CPU;
}

bool vk_matmul_supports(uint32_t type) {
    return shader_of(type) >= 0;
}

/* matmul.comp's LANES for K columns: as few lanes as give each the same
 * number of 32-column chunks in as many steps as 16 lanes would take
 * (576 columns, 18 chunks: 9 lanes of 2, where 16 lanes left 14 idle in
 * the second step). It depends on K alone, so every pipeline gives an
 * output the same bits. CELLM_VK_MM_LANES=16 takes 16 for every K (the
 * arithmetic before; for comparisons). */
static uint32_t matmul_lanes(uint32_t K) {
    const char *v = getenv("CELLM_VK_MM_LANES");
    if (v && atoi(v) == 16) return 16;
    uint32_t nc = K / 32, steps = (nc + 15) / 16;
    return steps ? (nc + steps - 1) / steps : 16;
}

bool vk_matmul_rounds_activations(void) {
    const char *v = getenv("CELLM_VK_ACT");
    return v && !strcmp(v, "q8");
}

/* Whether `type` weights take the form that rounds the activations as the
 * CPU does (matmul.comp's -DX_Q8), and its lanes: a tile of the K-quants'
 * 256-element blocks spans whole blocks (8 or 16 lanes: 768 columns take
 * 16, in steps of 16 and 8 chunks). The cooperative kernel keeps each
 * block's largest magnitude in shared memory beside its tile: 512 bytes
 * more than the 16 KiB of its largest pipeline (8 rows, 4 outputs an
 * invocation, 16 lanes) for the 32-element types. A device that cannot
 * give them (Vulkan promises 16 KiB) multiplies that matrix's activations
 * as they are, in every pipeline, so a row's bits still do not depend on
 * its batch. */
static bool matmul_rounds(const vk_device *d, uint32_t type, uint32_t *lanes) {
    if (type == QT_F32 || !vk_matmul_rounds_activations()) return false;
    uint32_t blk = quant_type_get(quant_type_get(type)->vec_dot_type)->block_size;
    uint32_t l = blk == 256 ? (*lanes <= 8 ? 8 : 16) : *lanes;
    uint32_t span = l * 32, red = 4 * 128;
    uint32_t bytes =
        MM_ROWS * (span > red ? span : red) * 4 + (blk > 1 ? MM_ROWS * span / blk * 4 : 0);
    if (!vk_matmul_lane_variant(d) && bytes > vk_device_get_info(d)->max_shared) return false;
    *lanes = l;
    return true;
}

/* Outputs per invocation for n_rows activation rows: 1 up to one row tile
 * (8 rows; there more workgroups matter more than the shared reads each
 * saves), 2 for a few tiles (64 sessions: 72 rows), 4 for a prompt's
 * hundreds. An output's arithmetic is the same for each. CELLM_VK_MM_OPT
 * (1, 2 or 4) sets it for every batch of more than 8 rows. */
static uint32_t matmul_opt(uint32_t n_rows) {
    if (n_rows <= MM_ROWS) return 1;
    const char *v = getenv("CELLM_VK_MM_OPT");
    if (v && (atoi(v) == 1 || atoi(v) == 2 || atoi(v) == 4)) return (uint32_t)atoi(v);
    return n_rows > MM_OPT4_ROWS ? 4 : 2;
}

/* Whether a workgroup of nt invocations, wo of them along the outputs,
 * is a shape matmul.comp's tiled form takes on d: 32 neighbouring
 * invocations are 4 output quads by 8 row quads, and its shared memory is
 * two buffers of 32 weights and 32 columns per quad (16 bytes each). */
static bool tile_fits(const vk_device *d, uint32_t nt, uint32_t wo) {
    const vk_device_info *info = vk_device_get_info(d);
    if (nt % 32 || !wo || wo % 4 || nt % wo || (nt / wo) % 8) return false;
    return nt <= info->max_invocations && 1024 * (wo + nt / wo) <= info->max_shared;
}

bool vk_matmul_tiled(const vk_device *d, uint32_t n_rows) {
    const char *v = getenv("CELLM_VK_MM_TILED");
    bool every = v && !strcmp(v, "1");
    if (n_rows <= (every ? MM_ROWS : MM_OPT4_ROWS) || (v && !strcmp(v, "0"))) return false;
    return !vk_matmul_lane_variant(d) && !vk_matmul_rounds_activations();
}

/* The tiled form's workgroup: nt invocations, wo of them along the
 * outputs, covering 4 wo outputs by 4 nt / wo rows. 64 invocations, 32 by
 * 32: on the H100 the smallest tiles were the fastest (more workgroups to
 * hide the loads; docs/benchmarks.md), and they need 16 KiB of shared
 * memory, Vulkan's least. $CELLM_VK_MM_TILE=NTxWO takes another shape. */
static bool matmul_tile(const vk_device *d, uint32_t *nt, uint32_t *wo) {
    unsigned a, b;
    const char *v = getenv("CELLM_VK_MM_TILE");
    if (v && sscanf(v, "%ux%u", &a, &b) == 2 && tile_fits(d, a, b)) {
        *nt = a;
        *wo = b;
        return true;
    }
    *nt = 64;
    *wo = 8;
    return tile_fits(d, *nt, *wo);
}

/* The pipeline vk_matmul_record takes for `type` weights of K columns
 * against n_rows activation rows, with the GLU input (activation
 * `act`) or without, and how many outputs and rows (outs, tr) one of its
 * workgroups covers. */
static cellm_status matmul_pipeline(vk_device *d, uint32_t type, bool glu, uint32_t act, uint32_t K,
                                    uint32_t n_rows, const vk_pipeline **pipe, uint32_t *outs,
                                    uint32_t *tr, cellm_error *err) {
    int shader = shader_of(type);
    /* A single row (decode) gets the pipeline of one row per workgroup;
     * its arithmetic per row is the same (matmul.comp), so the row's bits
     * are those it has in any batch. */
    *tr = n_rows == 1 ? 1 : MM_ROWS;
    uint32_t lanes = matmul_lanes(K);
    /* The forms that round the activations follow the plain ones in
     * vk_shader_id, in the same order. */
    if (matmul_rounds(d, type, &lanes)) shader += VK_SHADER_MATMULQ_F32 - VK_SHADER_MATMUL_F32;
    uint32_t nt, wo;
    /* The tiled form takes the activations as they are (not the forms
     * that round them: shader moved past the plain ones); a device that
     * fits none of its tiles (below Vulkan's limits) takes the cooperative
     * form, with the same bits. */
    if (shader == shader_of(type) && vk_matmul_tiled(d, n_rows) && matmul_tile(d, &nt, &wo)) {
        if (glu && act > 1)
            return err_set(err, CELLM_ERR_INVALID_ARG, "Vulkan matmul: activation %u", act);
        uint32_t spec[4] = {nt, glu ? act : 0, wo, lanes};
        *outs = 4 * wo;
        *tr = 4 * (nt / wo);
        shader += (glu ? VK_SHADER_MATMULTG_F32 : VK_SHADER_MATMULT_F32) - VK_SHADER_MATMUL_F32;
        return vk_pipeline_get_spec(d, (vk_shader_id)shader, spec, pipe, err);
    }
    uint32_t spec[4] = {*tr, glu ? act : 0, matmul_opt(n_rows), lanes};
    *outs = 128 / lanes * spec[2]; /* matmul.comp's OUTS times OPT */
    /* A CPU emulating a GPU (lavapipe) pays a coroutine switch per
     * invocation at each barrier: it takes the variant without any, one
     * invocation per output, 128 outputs per workgroup (matmul.comp). */
    if (vk_matmul_lane_variant(d)) {
        if (glu)
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "Vulkan matmul: no GLU input in the lane variant");
        spec[2] = 1; /* the lane variant has neither constant: one pipeline */
        spec[3] = 16;
        shader += VK_SHADER_MATMULL_F32 - VK_SHADER_MATMUL_F32; /* MATMULQ to MATMULLQ too */
        *outs = 128;
    } else if (glu) {
        if (act > 1)
            return err_set(err, CELLM_ERR_INVALID_ARG, "Vulkan matmul: activation %u", act);
        shader += VK_SHADER_MATMULG_F32 - VK_SHADER_MATMUL_F32;
    }
    return vk_pipeline_get_spec(d, (vk_shader_id)shader, spec, pipe, err);
}

cellm_status vk_matmul_record(vk_recorder *rec, const vk_matmul_args *a, cellm_error *err) {
    vk_device *d = vk_recorder_device(rec);
    const quant_type_info *qi = quant_type_get(a->type);
    if (shader_of(a->type) < 0 || !qi)
        return err_set(err, CELLM_ERR_UNSUPPORTED, "Vulkan matmul: no kernel for weight type %s",
                       qi ? qi->name : "(unknown)");
    uint64_t row_bytes;
    if (a->rows == 0 || a->n_rows == 0 || a->cols == 0 || a->cols % 32 ||
        !quant_nbytes(a->type, a->cols, &row_bytes))
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "Vulkan matmul: %u x %u %s weights against %u rows (columns must be whole "
                       "blocks)",
                       a->rows, a->cols, qi->name, a->n_rows);
    uint32_t xs = a->x_stride ? a->x_stride : a->cols, ys = a->y_stride ? a->y_stride : a->rows;
    size_t w_shift = vk_binding_shift(d, a->w_off), x_shift = vk_binding_shift(d, a->x_off),
           y_shift = vk_binding_shift(d, a->y_off);
    /* F32 rows are read as words; other blocks are read from even bytes. */
    if (a->w_off % (a->type == QT_F32 ? 4 : 2) || a->x_off % 4 || a->y_off % 4 || xs < a->cols ||
        ys < a->rows)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "Vulkan matmul: misaligned offsets or short strides (w %zu, x %zu, y %zu, "
                       "strides %u, %u)",
                       a->w_off, a->x_off, a->y_off, xs, ys);
    uint64_t w_bytes = row_bytes * a->rows;
    uint64_t x_bytes = ((uint64_t)(a->n_rows - 1) * xs + a->cols) * 4;
    uint64_t y_bytes = ((uint64_t)(a->n_rows - 1) * ys + a->rows) * 4;
    if (w_shift + w_bytes > UINT32_MAX || (x_shift + x_bytes) / 4 > UINT32_MAX ||
        (y_shift + y_bytes) / 4 > UINT32_MAX)
        return err_set(err, CELLM_ERR_UNSUPPORTED, "Vulkan matmul: operands past 4 GiB");
    const vk_pipeline *pipe;
    uint32_t outs, tr;
    cellm_status st = matmul_pipeline(d, a->type, a->u != NULL, a->act, a->cols, a->n_rows, &pipe,
                                      &outs, &tr, err);
    if (st != CELLM_OK) return st;
    vk_binding b[4] = {
        {a->w, a->w_off, (size_t)w_bytes},
        {a->x, a->x_off, (size_t)x_bytes},
        {a->y, a->y_off, (size_t)y_bytes},
        {a->u, a->x_off, (size_t)x_bytes},
    };
    /* The bindings start at the offsets rounded down: the shader adds the
     * remainders (binding 0 in bytes, 1 and 2 in floats). The ranges above
     * run from the unrounded offsets; the recorder extends them back. */
    matmul_push pc = {
        .K = a->cols,
        .N = a->rows,
        .n_rows = a->n_rows,
        .w_off = (uint32_t)w_shift,
        .x_off = (uint32_t)(x_shift / 4),
        .y_off = (uint32_t)(y_shift / 4),
        .x_stride = xs,
        .y_stride = ys,
    };
    const vk_device_info *info = vk_device_get_info(d);
    uint32_t tiles = (a->rows + outs - 1) / outs;
    uint32_t gx = tiles < info->max_workgroups[0] ? tiles : info->max_workgroups[0];
    uint32_t groups[3] = {gx, (a->n_rows + tr - 1) / tr, (tiles + gx - 1) / gx};
    return vk_recorder_dispatch(rec, pipe, b, a->u ? 4 : 3, &pc, sizeof pc, groups, err);
}

cellm_status vk_matmul_prepare(vk_device *d, uint32_t type, uint32_t cols, bool glu, uint32_t act,
                               cellm_error *err) {
    if (shader_of(type) < 0) return err_set(err, CELLM_ERR_UNSUPPORTED, "Vulkan matmul: no kernel");
    if (glu && vk_matmul_lane_variant(d)) return CELLM_OK; /* no GLU form there */
    /* One row, one row tile, several row tiles, a prompt: each pipeline a
     * batch may take (the lane variant's last three are the same). */
    const uint32_t n_rows[4] = {1, MM_ROWS, MM_ROWS + 1, MM_OPT4_ROWS + 1};
    for (int i = 0; i < 4; i++) {
        const vk_pipeline *pipe;
        uint32_t outs, tr;
        cellm_status st =
            matmul_pipeline(d, type, glu, act, cols, n_rows[i], &pipe, &outs, &tr, err);
        if (st != CELLM_OK) return st;
    }
    return CELLM_OK;
}

cellm_status vk_matmul(vk_recorder *rec, uint32_t type, const vk_buffer *w, size_t w_off,
                       uint32_t rows, uint32_t cols, const vk_buffer *x, size_t x_off,
                       const vk_buffer *y, size_t y_off, uint32_t n_rows, cellm_error *err) {
    vk_matmul_args a = {.type = type,
                        .w = w,
                        .w_off = w_off,
                        .rows = rows,
                        .cols = cols,
                        .x = x,
                        .x_off = x_off,
                        .y = y,
                        .y_off = y_off,
                        .n_rows = n_rows};
    return vk_matmul_record(rec, &a, err);
}
