/*
 * image.c — picture preprocessing for the vision encoder (see image.h):
 * Pillow's LANCZOS resampler and Idefics3's resize / tile / normalise
 * steps, with the sizes computed as transformers computes them (Python
 * floats are doubles; int() truncates).
 */
#include "format/image.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Pillow's resampler (Resample.c): coefficients in double, rounded to
 * 22-bit fixed point, a horizontal pass then a vertical pass, each
 * rounding to 8 bits. ---- */

#define PRECISION_BITS (32 - 8 - 2)
#define LANCZOS_SUPPORT 3.0

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= 3.14159265358979323846;
    return sin(x) / x;
}

static double lanczos(double x) {
    return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0;
}

/* Fixed-point weights of each output position over its input window:
 * bounds[2i] first input index, bounds[2i+1] count; kk[i * ksize + j]. */
typedef struct coeffs {
    int ksize;
    int *bounds;
    int32_t *kk;
} coeffs;

static void coeffs_free(coeffs *c) {
    free(c->bounds);
    free(c->kk);
}

static bool coeffs_make(int in_size, int out_size, coeffs *c) {
    double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = LANCZOS_SUPPORT * filterscale;
    c->ksize = (int)ceil(support) * 2 + 1;
    c->bounds = malloc((size_t)out_size * 2 * sizeof *c->bounds);
    c->kk = malloc((size_t)out_size * (size_t)c->ksize * sizeof *c->kk);
    double *k = malloc((size_t)c->ksize * sizeof *k);
    if (!c->bounds || !c->kk || !k) {
        free(k);
        coeffs_free(c);
        return false;
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            k[x] = lanczos((x + xmin - center + 0.5) * ss);
            ww += k[x];
        }
        int32_t *kf = c->kk + (size_t)xx * (size_t)c->ksize;
        for (int x = 0; x < c->ksize; x++) {
            double v = x < xmax ? (ww != 0.0 ? k[x] / ww : k[x]) : 0.0;
            kf[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PRECISION_BITS)
                                    : 0.5 + v * (1 << PRECISION_BITS));
        }
        c->bounds[xx * 2] = xmin;
        c->bounds[xx * 2 + 1] = xmax;
    }
    free(k);
    return true;
}

static uint8_t clip8(int32_t v) {
    if (v >= (1 << PRECISION_BITS << 8)) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PRECISION_BITS);
}

/* One pass: out[o] = sum over the window of in[i] * k, along x (stride 3
 * between pixels, rows of `in_row` / `out_row` bytes) or along y. */
static void pass_h(const uint8_t *in, int in_w, int rows, uint8_t *out, int out_w,
                   const coeffs *c) {
    for (int y = 0; y < rows; y++) {
        const uint8_t *ir = in + (size_t)y * (size_t)in_w * 3;
        uint8_t *orow = out + (size_t)y * (size_t)out_w * 3;
        for (int xx = 0; xx < out_w; xx++) {
            int xmin = c->bounds[xx * 2], xmax = c->bounds[xx * 2 + 1];
            const int32_t *k = c->kk + (size_t)xx * (size_t)c->ksize;
            for (int ch = 0; ch < 3; ch++) {
                int32_t ss = 1 << (PRECISION_BITS - 1);
                for (int x = 0; x < xmax; x++) ss += ir[(size_t)(x + xmin) * 3 + ch] * k[x];
                orow[(size_t)xx * 3 + ch] = clip8(ss);
            }
        }
    }
}

static void pass_v(const uint8_t *in, int w, uint8_t *out, int out_h, const coeffs *c) {
    size_t stride = (size_t)w * 3;
    for (int yy = 0; yy < out_h; yy++) {
        int ymin = c->bounds[yy * 2], ymax = c->bounds[yy * 2 + 1];
        const int32_t *k = c->kk + (size_t)yy * (size_t)c->ksize;
        for (size_t i = 0; i < stride; i++) {
            int32_t ss = 1 << (PRECISION_BITS - 1);
            for (int y = 0; y < ymax; y++) ss += in[(size_t)(y + ymin) * stride + i] * k[y];
            out[(size_t)yy * stride + i] = clip8(ss);
        }
    }
}

cellm_status image_resize_lanczos(const uint8_t *src, int32_t w, int32_t h, uint8_t *dst,
                                  int32_t ow, int32_t oh, cellm_error *err) {
    if (w < 1 || h < 1 || ow < 1 || oh < 1 || w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE ||
        ow > IMAGE_MAX_SIDE || oh > IMAGE_MAX_SIDE)
        return err_set(err, CELLM_ERR_INVALID_ARG, "resize %dx%d -> %dx%d: sides must be 1..%d", w,
                       h, ow, oh, IMAGE_MAX_SIDE);
    if (ow == w && oh == h) {
        memcpy(dst, src, (size_t)w * (size_t)h * 3);
        return CELLM_OK;
    }
    coeffs ch = {0}, cv = {0};
    uint8_t *tmp = NULL;
    bool ok = true;
    if (ow != w) ok = coeffs_make(w, ow, &ch);
    if (ok && oh != h) ok = coeffs_make(h, oh, &cv);
    if (!ok) goto oom;
    if (ow == w) {
        pass_v(src, w, dst, oh, &cv);
    } else if (oh == h) {
        pass_h(src, w, h, dst, ow, &ch);
    } else {
        /* Only the input rows the vertical pass reads go through the
         * horizontal one, as Pillow does. */
        int first = cv.bounds[0], last = cv.bounds[(oh - 1) * 2] + cv.bounds[(oh - 1) * 2 + 1];
        tmp = malloc((size_t)ow * (size_t)(last - first) * 3);
        if (!tmp) goto oom;
        pass_h(src + (size_t)first * (size_t)w * 3, w, last - first, tmp, ow, &ch);
        for (int i = 0; i < oh; i++) cv.bounds[i * 2] -= first;
        pass_v(tmp, ow, dst, oh, &cv);
    }
    free(tmp);
    coeffs_free(&ch);
    coeffs_free(&cv);
    return CELLM_OK;
oom:
    coeffs_free(&ch);
    coeffs_free(&cv);
    return err_set(err, CELLM_ERR_NO_MEMORY, "resize %dx%d -> %dx%d: out of memory", w, h, ow, oh);
}

/* ---- Idefics3's sizes ---- */

/* The longest edge scaled to `max_len`, the other by the aspect ratio
 * (rounded up to even), then both kept under IMAGE_MAX_EDGE. */
static void size_longest_edge(int32_t *w, int32_t *h, int32_t max_len) {
    double ar = (double)*w / (double)*h;
    int64_t nw, nh;
    if (*w >= *h) {
        nw = max_len;
        nh = (int64_t)(nw / ar);
        if (nh % 2) nh++;
    } else {
        nh = max_len;
        nw = (int64_t)(nh * ar);
        if (nw % 2) nw++;
    }
    if (nh < 1) nh = 1;
    if (nw < 1) nw = 1;
    ar = (double)nw / (double)nh;
    if (nw >= nh && nw > IMAGE_MAX_EDGE) {
        nw = IMAGE_MAX_EDGE;
        nh = (int64_t)(nw / ar);
    } else if (nh > nw && nh > IMAGE_MAX_EDGE) {
        nh = IMAGE_MAX_EDGE;
        nw = (int64_t)(nh * ar);
    }
    *w = (int32_t)(nw < 1 ? 1 : nw);
    *h = (int32_t)(nh < 1 ? 1 : nh);
}

/* Both sides up to whole tiles, the shorter one through the aspect ratio
 * (resize_for_vision_encoder). */
static void size_whole_tiles(int32_t *w, int32_t *h, int32_t tile) {
    double ar = (double)*w / (double)*h;
    int64_t nw, nh;
    if (*w >= *h) {
        nw = (int64_t)ceil((double)*w / tile) * tile;
        nh = (int64_t)(nw / ar);
        nh = (int64_t)ceil((double)nh / tile) * tile;
    } else {
        nh = (int64_t)ceil((double)*h / tile) * tile;
        nw = (int64_t)(nh * ar);
        nw = (int64_t)ceil((double)nw / tile) * tile;
    }
    *w = (int32_t)(nw < tile ? tile : nw);
    *h = (int32_t)(nh < tile ? tile : nh);
}

/* Frame `f` from a side x side RGB8 block with row stride `stride` bytes:
 * rescaled by 1/255 (in double, stored as float, as transformers' rescale)
 * then (v - mean) / std in float. */
static void put_frame(const image_params *p, const uint8_t *px, size_t stride, int32_t side,
                      float *f) {
    size_t plane = (size_t)side * (size_t)side;
    for (int32_t y = 0; y < side; y++)
        for (int32_t x = 0; x < side; x++)
            for (int c = 0; c < 3; c++) {
                float v = (float)((double)px[(size_t)y * stride + (size_t)x * 3 + (size_t)c] *
                                  (1.0 / 255.0));
                f[(size_t)c * plane + (size_t)y * (size_t)side + (size_t)x] =
                    (v - p->mean[c]) / p->std[c];
            }
}

void image_frames_free(image_frames *f) {
    if (!f) return;
    free(f->pixels);
    memset(f, 0, sizeof *f);
}

cellm_status image_preprocess(const uint8_t *rgb, int32_t w, int32_t h, const image_params *p,
                              image_frames *out, cellm_error *err) {
    memset(out, 0, sizeof *out);
    if (!rgb || w < 1 || h < 1 || w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE)
        return err_set(err, CELLM_ERR_INVALID_ARG, "image of %dx%d pixels: each side must be 1..%d",
                       (int)w, (int)h, IMAGE_MAX_SIDE);
    if (p->longest_edge < 1 || p->longest_edge > IMAGE_MAX_EDGE || p->tile < 1 ||
        p->tile > IMAGE_MAX_EDGE)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "image processor: longest edge %d and tile %d must be 1..%d",
                       (int)p->longest_edge, (int)p->tile, IMAGE_MAX_EDGE);
    for (int c = 0; c < 3; c++)
        if (!(p->std[c] > 0) || !isfinite(p->mean[c]))
            return err_set(err, CELLM_ERR_INVALID_ARG, "image processor: mean/std of channel %d",
                           c);
    int32_t rw = w, rh = h, tw, th;
    size_longest_edge(&rw, &rh, p->longest_edge);
    tw = rw, th = rh;
    if (p->split) {
        size_whole_tiles(&tw, &th, p->tile);
    } else {
        tw = th = p->tile;
    }
    int32_t rows = 0, cols = 0;
    if (p->split && (tw > p->tile || th > p->tile)) {
        rows = th / p->tile; /* whole tiles: size_whole_tiles rounded up */
        cols = tw / p->tile;
    }
    int64_t n_frames = (int64_t)rows * cols + 1;
    if (n_frames > IMAGE_MAX_FRAMES || tw > IMAGE_MAX_SIDE || th > IMAGE_MAX_SIDE)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "image processor: %dx%d tiles of %d are more than %d frames", (int)cols,
                       (int)rows, (int)p->tile, IMAGE_MAX_FRAMES - 1);
    size_t side = (size_t)p->tile, frame = 3 * side * side;
    uint8_t *a = malloc((size_t)rw * (size_t)rh * 3);
    uint8_t *b = malloc((size_t)tw * (size_t)th * 3);
    uint8_t *g = rows ? malloc(frame) : NULL;
    float *px = malloc((size_t)n_frames * frame * sizeof *px);
    cellm_status st = CELLM_OK;
    if (!a || !b || (rows && !g) || !px) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "image of %dx%d pixels: out of memory", (int)w,
                     (int)h);
        goto done;
    }
    if ((st = image_resize_lanczos(rgb, w, h, a, rw, rh, err)) ||
        (st = image_resize_lanczos(a, rw, rh, b, tw, th, err)))
        goto done;
    if (rows) {
        size_t stride = (size_t)tw * 3;
        for (int32_t r = 0; r < rows; r++)
            for (int32_t c = 0; c < cols; c++)
                put_frame(p, b + (size_t)r * side * stride + (size_t)c * side * 3, stride, p->tile,
                          px + (size_t)(r * cols + c) * frame);
        if ((st = image_resize_lanczos(b, tw, th, g, p->tile, p->tile, err))) goto done;
        put_frame(p, g, side * 3, p->tile, px + (size_t)(n_frames - 1) * frame);
    } else {
        put_frame(p, b, side * 3, p->tile, px);
    }
    out->n_frames = (int32_t)n_frames;
    out->rows = rows;
    out->cols = cols;
    out->side = p->tile;
    out->pixels = px;
    px = NULL;
done:
    free(a);
    free(b);
    free(g);
    free(px);
    return st;
}
