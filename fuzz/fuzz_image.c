/*
 * fuzz_image.c — libFuzzer target for pictures: the PNG/JPEG decoding of
 * `cellm run --image` (tools/image_file.c) and the library's
 * preprocessing (src/format/image.c). Input whose first byte is 'R' is instead a
 * raw RGB8 picture with its size and processor settings in the next four
 * bytes (sides up to 64, longest edge up to 256, tiles up to 64), which
 * drives the size arithmetic and the resampler through odd shapes. Any
 * input must decode and preprocess or fail with a message; a decoded
 * picture goes through a small processor.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/image.h"
#include "image_file.h"

static volatile float sink;

static void preprocess(const uint8_t *rgb, int32_t w, int32_t h, int32_t edge, int32_t tile) {
    image_params p = {.longest_edge = edge, .tile = tile, .split = true};
    for (int c = 0; c < 3; c++) {
        p.mean[c] = 0.5f;
        p.std[c] = 0.5f;
    }
    image_frames fr;
    cellm_error err;
    if (image_preprocess(rgb, w, h, &p, &fr, &err) != CELLM_OK) {
        if (!err.msg[0]) abort(); /* every failure says why */
        return;
    }
    if (fr.n_frames < 1 || fr.side != tile || fr.n_frames != fr.rows * fr.cols + 1) abort();
    size_t n = (size_t)fr.n_frames * 3 * (size_t)tile * (size_t)tile;
    sink += fr.pixels[0] + fr.pixels[n - 1];
    image_frames_free(&fr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 5 && data[0] == 'R') {
        int32_t w = data[1] % 64 + 1, h = data[2] % 64 + 1, edge = data[3] + 1,
                tile = data[4] % 64 + 1;
        if (size - 5 < (size_t)w * (size_t)h * 3) return 0;
        preprocess(data + 5, w, h, edge, tile);
        return 0;
    }
    uint8_t *rgb;
    int32_t w, h;
    cellm_error err;
    if (image_decode(data, size, &rgb, &w, &h, &err) != CELLM_OK) {
        if (!err.msg[0] || rgb) abort();
        return 0;
    }
    if (w < 1 || h < 1 || w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE) abort();
    sink += rgb[0] + rgb[(size_t)w * (size_t)h * 3 - 1];
    if ((size_t)w * (size_t)h <= 1u << 16) preprocess(rgb, w, h, 64, 32);
    free(rgb);
    return 0;
}
