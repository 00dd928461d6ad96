/*
 * vision.h — the vision side of a vision-language model, from a projector
 * GGUF file in llama.cpp's layout (`mmproj`, general.architecture "clip"):
 * a SigLIP ViT encoder (patch embedding, learned positions, pre-norm
 * transformer layers with GELU-tanh MLPs, a final LayerNorm) and
 * Idefics3's connector (pixel shuffle by clip.vision.projector.scale_factor,
 * then one bias-free projection to the text model's width). Frames come
 * from image.h; the output is one embedding row per image token.
 *
 * Weights stay in the file's map; matrices go through matmul() with the
 * types it supports. Every key, shape and type is checked at load, so a
 * projector that is malformed or of another kind is an error naming what
 * is wrong.
 */
#ifndef CELLM_VISION_H
#define CELLM_VISION_H

#include <stdint.h>

#include "format/gguf.h"
#include "format/image.h"
#include "base/threadpool.h"
#include "base/util.h"

typedef struct vision_layer {
    const gguf_tensor *q, *k, *v, *o, *up, *down;       /* matrices */
    const float *q_b, *k_b, *v_b, *o_b, *up_b, *down_b; /* biases */
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
} vision_layer;

typedef struct vision_model {
    gguf_file *f;
    int32_t image_size, patch_size, n_embd, n_ff, n_head, n_layer, proj_dim, scale;
    int32_t n_patches; /* per frame: (image_size / patch_size)^2 */
    int32_t n_tokens;  /* image tokens per frame: n_patches / scale^2 */
    float eps;
    image_params pre; /* how pictures become frames */
    const gguf_tensor *patch, *fc;
    const float *patch_b, *pos, *post_w, *post_b;
    vision_layer *layers;
    float *vecs;          /* the dequantized vectors above point into this */
    size_t scratch_bytes; /* matmul's scratch for the largest row count */
} vision_model;

/* Loads projector file `path`. Errors: CELLM_ERR_IO, CELLM_ERR_FORMAT (a
 * missing key or tensor, a wrong shape), CELLM_ERR_UNSUPPORTED (another
 * projector type, a tensor type matmul lacks). */
cellm_status vision_load(const char *path, vision_model **out, cellm_error *err);
void vision_free(vision_model *vm);

/* Runs `n_frames` frames (image_frames' layout, side image_size) through
 * the encoder and the connector: `out` gets n_frames * n_tokens rows of
 * proj_dim floats; `enc` (may be NULL) the encoder's output, n_frames *
 * n_patches rows of n_embd. Not reentrant on one threadpool. */
cellm_status vision_encode(const vision_model *vm, threadpool *tp, const float *pixels,
                           int32_t n_frames, float *enc, float *out, cellm_error *err);

#endif /* CELLM_VISION_H */
