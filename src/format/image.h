/*
 * image.h — an RGB8 picture into the frames a vision encoder reads, as
 * Idefics3's image processor (SmolVLM) makes them: the longest edge
 * resized to `longest_edge`, then both sides rounded up to whole tiles,
 * cut into tiles of `tile` x `tile` (row by row) followed by the whole
 * picture resized to one tile (the "global image"); every frame rescaled
 * to [0, 1] and normalised with a per-channel mean and deviation. Resizing
 * is PIL's LANCZOS (Pillow's fixed-point two-pass resampler, reproduced bit
 * for bit), which transformers' processor calls.
 *
 * The picture is untrusted input: its size is checked before anything is
 * allocated, and every buffer is bounded by the sizes below.
 */
#ifndef CELLM_IMAGE_H
#define CELLM_IMAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"

#define IMAGE_MAX_SIDE 8192  /* pixels per side of an input picture */
#define IMAGE_MAX_EDGE 4096  /* transformers' MAX_IMAGE_SIZE: the resize target's bound */
#define IMAGE_MAX_FRAMES 257 /* 16 x 16 tiles and the global image */

typedef struct image_params {
    int32_t longest_edge; /* the processor's size.longest_edge (1..IMAGE_MAX_EDGE) */
    int32_t tile;         /* max_image_size.longest_edge: the encoder's image size */
    float mean[3], std[3];
    bool split; /* do_image_splitting */
} image_params;

typedef struct image_frames {
    int32_t n_frames;   /* rows * cols tiles (none when unsplit) + the global image */
    int32_t rows, cols; /* the tile grid; 0 x 0 for a picture of one tile */
    int32_t side;       /* each frame is side x side */
    float *pixels;      /* n_frames x 3 x side x side, channel planes (malloc'd) */
} image_frames;

/* Resizes RGB8 `src` (w x h) to `dst` (ow x oh) as Pillow's
 * Image.resize(..., LANCZOS) does, bit for bit. Sizes 1..IMAGE_MAX_SIDE
 * (the output up to IMAGE_MAX_SIDE too). */
cellm_status image_resize_lanczos(const uint8_t *src, int32_t w, int32_t h, uint8_t *dst,
                                  int32_t ow, int32_t oh, cellm_error *err);

/* The frames of picture `rgb` (w x h, rows of 3 * w bytes) under `p`.
 * Errors: CELLM_ERR_INVALID_ARG for a size outside 1..IMAGE_MAX_SIDE or
 * parameters out of range, CELLM_ERR_NO_MEMORY. Free with
 * image_frames_free(). */
cellm_status image_preprocess(const uint8_t *rgb, int32_t w, int32_t h, const image_params *p,
                              image_frames *out, cellm_error *err);

void image_frames_free(image_frames *f);

#endif /* CELLM_IMAGE_H */
