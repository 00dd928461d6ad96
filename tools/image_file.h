/*
 * image_file.h — PNG and JPEG pictures into RGB8 pixels for the library's
 * cellm_image_encode(), with Debian's libpng and libjpeg-turbo (the command
 * decodes files; the library takes pixels). Files are untrusted input: the
 * size in the header is checked (each side 1..IMAGE_MAX_SIDE) before the
 * pixels are allocated, a truncated or corrupt file is an error (libjpeg's
 * warnings count as errors), and every failure has a message.
 */
#ifndef CELLM_IMAGE_FILE_H
#define CELLM_IMAGE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define IMAGE_FILE_MAX_BYTES (64u << 20)

/* Decodes data[0..n) (PNG or JPEG, told apart by their signatures) into a
 * new RGB8 buffer *rgb (free() it) of *w x *h pixels. Transparency is
 * composited onto white and 16-bit or grey or palette PNGs become RGB8,
 * as transformers' convert_rgb does; CMYK JPEGs are refused. */
cellm_status image_decode(const uint8_t *data, size_t n, uint8_t **rgb, int32_t *w, int32_t *h,
                          cellm_error *err);

/* image_decode() that also refuses pictures of more than max_pixels
 * pixels (0: no such limit), from the header, before any pixel is
 * allocated (the server's bound on untrusted pictures). */
cellm_status image_decode_max(const uint8_t *data, size_t n, uint64_t max_pixels, uint8_t **rgb,
                              int32_t *w, int32_t *h, cellm_error *err);

/* image_decode() of the file at `path` (at most IMAGE_FILE_MAX_BYTES). */
cellm_status image_file_read(const char *path, uint8_t **rgb, int32_t *w, int32_t *h,
                             cellm_error *err);

#endif /* CELLM_IMAGE_FILE_H */
