/*
 * image_file.c — PNG (libpng's simplified API) and JPEG (libjpeg-turbo)
 * decoding for `cellm run --image` (see image_file.h).
 */
#include "image_file.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#include "format/image.h"

/* Each side 1..IMAGE_MAX_SIDE, and at most max_pixels pixels (0: no
 * limit beyond the sides'). */
static cellm_status check_size(const char *kind, uint64_t w, uint64_t h, uint64_t max_pixels,
                               cellm_error *err) {
    if (w < 1 || h < 1 || w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "%s picture of %llux%llu pixels: each side must be 1..%d", kind,
                       (unsigned long long)w, (unsigned long long)h, IMAGE_MAX_SIDE);
    if (max_pixels && w * h > max_pixels)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "%s picture of %llux%llu pixels: at most %llu pixels are taken", kind,
                       (unsigned long long)w, (unsigned long long)h,
                       (unsigned long long)max_pixels);
    return CELLM_OK;
}

static cellm_status decode_png(const uint8_t *data, size_t n, uint64_t max_pixels, uint8_t **rgb,
                               int32_t *w, int32_t *h, cellm_error *err) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&im, data, n))
        return err_set(err, CELLM_ERR_FORMAT, "PNG: %s", im.message);
    cellm_status st = check_size("PNG", im.width, im.height, max_pixels, err);
    if (st) {
        png_image_free(&im);
        return st;
    }
    im.format = PNG_FORMAT_RGB;
    size_t bytes = (size_t)im.width * im.height * 3;
    uint8_t *buf = malloc(bytes);
    if (!buf) {
        png_image_free(&im);
        return err_set(err, CELLM_ERR_NO_MEMORY, "PNG: out of memory");
    }
    png_color white = {255, 255, 255};
    if (!png_image_finish_read(&im, &white, buf, 0, NULL)) {
        free(buf);
        st = err_set(err, CELLM_ERR_FORMAT, "PNG: %s", im.message);
        png_image_free(&im);
        return st;
    }
    if (im.warning_or_error) {
        free(buf);
        st = err_set(err, CELLM_ERR_FORMAT, "PNG: %s", im.message);
        png_image_free(&im);
        return st;
    }
    *rgb = buf;
    *w = (int32_t)im.width;
    *h = (int32_t)im.height;
    return CELLM_OK;
}

/* libjpeg reports errors by calling error_exit, which must not return. */
typedef struct jpeg_err {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warnings;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_fail(j_common_ptr cinfo) {
    jpeg_err *e = (jpeg_err *)cinfo->err;
    e->pub.format_message(cinfo, e->msg);
    longjmp(e->jump, 1);
}

static void jpeg_note(j_common_ptr cinfo, int level) {
    jpeg_err *e = (jpeg_err *)cinfo->err;
    if (level < 0 && !e->warnings++) e->pub.format_message(cinfo, e->msg); /* the first warning */
}

static cellm_status decode_jpeg(const uint8_t *data, size_t n, uint64_t max_pixels, uint8_t **rgb,
                                int32_t *w, int32_t *h, cellm_error *err) {
    struct jpeg_decompress_struct ci;
    jpeg_err je;
    memset(&je, 0, sizeof je);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpeg_fail;
    je.pub.emit_message = jpeg_note;
    uint8_t *volatile buf = NULL;
    if (setjmp(je.jump)) {
        jpeg_destroy_decompress(&ci);
        free(buf);
        return err_set(err, CELLM_ERR_FORMAT, "JPEG: %s", je.msg);
    }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, data, (unsigned long)n);
    jpeg_read_header(&ci, TRUE);
    cellm_status st = check_size("JPEG", ci.image_width, ci.image_height, max_pixels, err);
    if (!st && (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK))
        st = err_set(err, CELLM_ERR_UNSUPPORTED, "JPEG: a CMYK picture (convert it to RGB first)");
    if (st) {
        jpeg_destroy_decompress(&ci);
        return st;
    }
    ci.out_color_space = JCS_RGB;
    jpeg_start_decompress(&ci);
    size_t stride = (size_t)ci.output_width * 3;
    buf = malloc(stride * ci.output_height);
    if (!buf) {
        jpeg_destroy_decompress(&ci);
        return err_set(err, CELLM_ERR_NO_MEMORY, "JPEG: out of memory");
    }
    while (ci.output_scanline < ci.output_height) {
        JSAMPROW row = buf + stride * ci.output_scanline;
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_finish_decompress(&ci);
    *w = (int32_t)ci.output_width;
    *h = (int32_t)ci.output_height;
    jpeg_destroy_decompress(&ci);
    if (je.warnings) { /* truncated or corrupt data that libjpeg patched over */
        free(buf);
        return err_set(err, CELLM_ERR_FORMAT, "JPEG: %s", je.msg);
    }
    *rgb = buf;
    return CELLM_OK;
}

cellm_status image_decode(const uint8_t *data, size_t n, uint8_t **rgb, int32_t *w, int32_t *h,
                          cellm_error *err) {
    return image_decode_max(data, n, 0, rgb, w, h, err);
}

cellm_status image_decode_max(const uint8_t *data, size_t n, uint64_t max_pixels, uint8_t **rgb,
                              int32_t *w, int32_t *h, cellm_error *err) {
    *rgb = NULL;
    *w = *h = 0;
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && !memcmp(data, png_sig, 8)) return decode_png(data, n, max_pixels, rgb, w, h, err);
    if (n >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
        return decode_jpeg(data, n, max_pixels, rgb, w, h, err);
    return err_set(err, CELLM_ERR_UNSUPPORTED, "not a PNG or JPEG picture");
}

cellm_status image_file_read(const char *path, uint8_t **rgb, int32_t *w, int32_t *h,
                             cellm_error *err) {
    *rgb = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, CELLM_ERR_IO, "cannot open picture '%s'", path);
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return err_set(err, CELLM_ERR_IO, "cannot read picture '%s'", path);
    }
    if ((unsigned long)size > IMAGE_FILE_MAX_BYTES) {
        fclose(f);
        return err_set(err, CELLM_ERR_INVALID_ARG, "picture '%s' is over %u MiB", path,
                       IMAGE_FILE_MAX_BYTES >> 20);
    }
    uint8_t *data = malloc(size ? (size_t)size : 1);
    size_t n = data ? fread(data, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!data) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    if (n != (size_t)size) {
        free(data);
        return err_set(err, CELLM_ERR_IO, "cannot read picture '%s'", path);
    }
    cellm_error derr;
    cellm_status st = image_decode(data, n, rgb, w, h, &derr);
    free(data);
    return st ? err_set(err, st, "%s: %s", path, derr.msg) : CELLM_OK;
}
