/*
 * test_vision.c — the vision path (SmolVLM / Idefics3) against Hugging
 * Face transformers, from the fixtures of scripts/gen_vision_fixtures.py
 * (tests/data/vision/): a tiny random-weight Idefics3 folder with its
 * processor files, two pictures of different aspect ratios (96x60: 2x2
 * tiles; 20x70: 2x1 tiles; each plus the global image), and what
 * transformers computed on them. `cellm convert` writes the text model
 * and the projector from the folder; then:
 *  - Pillow's LANCZOS resizes of a picture, up and down, byte for byte;
 *  - the processor's frames (tile grid and pixel values, within 1e-6);
 *  - the encoder's and the connector's outputs on transformers' pixel
 *    values, with an F32 projector (within VIS_TOL_F32 of the largest
 *    value) and with the default F16 one (within VIS_TOL_F16);
 *  - cellm_image_encode() end to end from the RGB8 picture;
 *  - cellm_image_prompt()'s image tokens: the prompt's ids equal the
 *    processor's; with the picture's rows in place of its image tokens
 *    (forward_run_embd), the text model's logits over 3 greedy steps are
 *    transformers' (within LOGIT_TOL of the largest) and so are its tokens;
 *  - `cellm run --mmproj --image` on the picture as a PNG file: the
 *    greedy text is transformers' tokens;
 *  - hostile sizes, NULL arguments, a text model given as the projector,
 *    a truncated projector and a projector of another model's width are
 *    refused with a message; PNG and JPEG files: truncated, 30000x30000,
 *    16-bit, grey, CMYK, not a picture (test_asan_*, also under the
 *    sanitizers).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <math.h>

#include "cellm.h"
#include "convert.h"
#include "cpu/forward.h"
#include "format/image.h"
#include "image_file.h"
#include "test_common.h"
#include "text/tokenizer.h"

#include <jpeglib.h>
#include "base/threadpool.h"
#include "cpu/vision.h"

#define VIS_TOL_F32 2e-5 /* times max(1, the largest |value|) */
#define VIS_TOL_F16 2e-3
#define LOGIT_TOL 5e-4 /* F32 files, F16 KV: times max(1, the row's largest |logit|) */
#define N_IMAGES 2
#define MAX_LANCZOS 8
#define MAX_IDS 160
#define N_GEN 3
#define VOCAB 384
#define IMAGE_TOKEN 4 /* config.json's image_token_id */

typedef struct fx_image {
    int w, h, rows, cols, frames, side;
    uint8_t *rgb;
    float *pixels, *enc, *conn;
    int n_ids;
    int32_t ids[MAX_IDS], gen[N_GEN];
    float logits[N_GEN][VOCAB];
} fx_image;

typedef struct fixture {
    fx_image img[N_IMAGES];
    int n_lanczos, lw[MAX_LANCZOS], lh[MAX_LANCZOS];
    uint8_t *lanczos;
    char dir[256]; /* converted files */
    char text_f32[300], mm_f32[300], text_f16[300], mm_f16[300];
} fixture;

static fixture fx;

/* n numbers from s into ints or floats. */
static void read_values(const char *s, int n, int32_t *ints, float *floats) {
    for (int k = 0; k < n; k++) {
        char *end;
        double v = strtod(s, &end);
        assert_true(end != s);
        if (ints) ints[k] = (int32_t)v;
        if (floats) floats[k] = (float)v;
        s = end;
    }
}

static void *read_data(const char *name, size_t want) {
    char path[1024];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/tests/data/vision/%s", CELLM_SOURCE_DIR, name);
    char *p = test_read_file(path, &len);
    if (!p || len != want) {
        print_error("%s: missing or %zu bytes, expected %zu\n", path, p ? len : 0, want);
        fail();
    }
    return p;
}

static void convert_to(const char *type, const char *text, const char *mm) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/vision/idefics3", CELLM_SOURCE_DIR);
    convert_params p = {.type = type, .n_threads = 1, .mmproj = mm};
    cellm_error err;
    if (convert_hf(dir, text, &p, &err) != CELLM_OK) {
        print_error("convert %s: %s\n", type, err.msg);
        fail();
    }
}

static int setup(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/vision/idefics3.txt", CELLM_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char line[16384];
    while (fgets(line, sizeof line, f)) {
        int i, w, h, r, c, n, fh, fw;
        if (sscanf(line, "lanczos %d %d", &w, &h) == 2 && fx.n_lanczos < MAX_LANCZOS) {
            fx.lw[fx.n_lanczos] = w;
            fx.lh[fx.n_lanczos++] = h;
        } else if (sscanf(line, "image %d %d %d %d %d %d %d %d", &i, &w, &h, &r, &c, &n, &fh,
                          &fw) == 8 &&
                   i >= 0 && i < N_IMAGES) {
            fx_image *im = &fx.img[i];
            *im = (fx_image){.w = w, .h = h, .rows = r, .cols = c, .frames = n, .side = fh};
            assert_int_equal(fh, fw);
        } else if (sscanf(line, "ids %d %d%n", &i, &n, &r) == 2 && i >= 0 && i < N_IMAGES) {
            assert_true(n <= MAX_IDS);
            fx.img[i].n_ids = n;
            read_values(line + r, n, fx.img[i].ids, NULL);
        } else if (sscanf(line, "gen %d %d%n", &i, &n, &r) == 2 && i >= 0 && i < N_IMAGES) {
            assert_int_equal(n, N_GEN);
            read_values(line + r, n, fx.img[i].gen, NULL);
        } else if (sscanf(line, "logits %d %d%n", &i, &n, &r) == 2 && i >= 0 && i < N_IMAGES &&
                   n >= 0 && n < N_GEN) {
            read_values(line + r, VOCAB, NULL, fx.img[i].logits[n]);
        }
    }
    fclose(f);
    size_t total = 0;
    for (int k = 0; k < fx.n_lanczos; k++) total += (size_t)fx.lw[k] * (size_t)fx.lh[k] * 3;
    fx.lanczos = read_data("idefics3-lanczos.u8", total);
    for (int i = 0; i < N_IMAGES; i++) {
        fx_image *im = &fx.img[i];
        char name[64];
        assert_true(im->frames > 0);
        snprintf(name, sizeof name, "idefics3-img%d.rgb", i);
        im->rgb = read_data(name, (size_t)im->w * (size_t)im->h * 3);
        size_t plane = (size_t)im->side * (size_t)im->side;
        snprintf(name, sizeof name, "idefics3-%d-pixels.f32", i);
        im->pixels = read_data(name, (size_t)im->frames * 3 * plane * 4);
        /* 4 x 4 patches of 32, 4 tokens of 64 per frame (the fixture's config). */
        snprintf(name, sizeof name, "idefics3-%d-enc.f32", i);
        im->enc = read_data(name, (size_t)im->frames * 16 * 32 * 4);
        snprintf(name, sizeof name, "idefics3-%d-conn.f32", i);
        im->conn = read_data(name, (size_t)im->frames * 4 * 64 * 4);
    }
    snprintf(fx.dir, sizeof fx.dir, "/tmp/cellm-test-vision-%d", (int)getpid());
    assert_int_equal(mkdir(fx.dir, 0700), 0);
    snprintf(fx.text_f32, sizeof fx.text_f32, "%s/text-f32.gguf", fx.dir);
    snprintf(fx.mm_f32, sizeof fx.mm_f32, "%s/mmproj-f32.gguf", fx.dir);
    snprintf(fx.text_f16, sizeof fx.text_f16, "%s/text-f16.gguf", fx.dir);
    snprintf(fx.mm_f16, sizeof fx.mm_f16, "%s/mmproj-text-f16.gguf", fx.dir);
    convert_to("f32", fx.text_f32, fx.mm_f32);
    convert_to("f16", fx.text_f16, NULL); /* the default name, beside it */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < N_IMAGES; i++) {
        free(fx.img[i].rgb);
        free(fx.img[i].pixels);
        free(fx.img[i].enc);
        free(fx.img[i].conn);
    }
    free(fx.lanczos);
    unlink(fx.text_f32);
    unlink(fx.mm_f32);
    unlink(fx.text_f16);
    unlink(fx.mm_f16);
    rmdir(fx.dir);
    return 0;
}

/* Largest |a - b| over n values, and the largest |b|. */
static double max_diff(const float *a, const float *b, size_t n, double *scale) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e; /* NaN counts */
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    *scale = s;
    return d;
}

static void test_lanczos_as_pillow(void **state) {
    (void)state;
    const fx_image *im = &fx.img[0];
    size_t off = 0;
    for (int k = 0; k < fx.n_lanczos; k++) {
        size_t n = (size_t)fx.lw[k] * (size_t)fx.lh[k] * 3;
        uint8_t *out = malloc(n);
        assert_non_null(out);
        cellm_error err;
        assert_int_equal(image_resize_lanczos(im->rgb, im->w, im->h, out, fx.lw[k], fx.lh[k], &err),
                         CELLM_OK);
        size_t bad = 0;
        for (size_t j = 0; j < n; j++) bad += out[j] != fx.lanczos[off + j];
        if (bad)
            print_error("%dx%d -> %dx%d: %zu of %zu bytes differ\n", im->w, im->h, fx.lw[k],
                        fx.lh[k], bad, n);
        assert_int_equal(bad, 0);
        off += n;
        free(out);
    }
}

static void test_pixels_as_processor(void **state) {
    (void)state;
    vision_model *vm;
    cellm_error err;
    assert_int_equal(vision_load(fx.mm_f32, &vm, &err), CELLM_OK);
    assert_int_equal(vm->pre.longest_edge, 64);
    assert_int_equal(vm->pre.tile, 32);
    for (int i = 0; i < N_IMAGES; i++) {
        const fx_image *im = &fx.img[i];
        image_frames fr;
        assert_int_equal(image_preprocess(im->rgb, im->w, im->h, &vm->pre, &fr, &err), CELLM_OK);
        assert_int_equal(fr.n_frames, im->frames);
        assert_int_equal(fr.rows, im->rows);
        assert_int_equal(fr.cols, im->cols);
        assert_int_equal(fr.side, im->side);
        double scale,
            d = max_diff(fr.pixels, im->pixels,
                         (size_t)fr.n_frames * 3 * (size_t)fr.side * (size_t)fr.side, &scale);
        print_message("image %d (%dx%d): %d frames, pixels max diff %.3g\n", i, im->w, im->h,
                      fr.n_frames, d);
        assert_true(d <= 1e-6);
        image_frames_free(&fr);
    }
    vision_free(vm);
}

static void check_encoder(const char *mm, double tol) {
    vision_model *vm;
    threadpool *tp;
    cellm_error err;
    assert_int_equal(vision_load(mm, &vm, &err), CELLM_OK);
    assert_int_equal(tp_create(2, &tp, &err), CELLM_OK);
    assert_int_equal(vm->n_patches, 16);
    assert_int_equal(vm->n_tokens, 4);
    assert_int_equal(vm->proj_dim, 64);
    for (int i = 0; i < N_IMAGES; i++) {
        const fx_image *im = &fx.img[i];
        size_t ne = (size_t)im->frames * 16 * 32, nc = (size_t)im->frames * 4 * 64;
        float *enc = malloc(ne * sizeof *enc), *conn = malloc(nc * sizeof *conn);
        assert_int_equal(vision_encode(vm, tp, im->pixels, im->frames, enc, conn, &err), CELLM_OK);
        double se, sc, de = max_diff(enc, im->enc, ne, &se), dc = max_diff(conn, im->conn, nc, &sc);
        print_message("%s image %d: encoder max diff %.3g (values to %.3g), connector %.3g (to "
                      "%.3g)\n",
                      strrchr(mm, '/') + 1, i, de, se, dc, sc);
        assert_true(de <= tol * fmax(1.0, se));
        assert_true(dc <= tol * fmax(1.0, sc));
        free(enc);
        free(conn);
    }
    tp_destroy(tp);
    vision_free(vm);
}

static void test_encoder_connector_f32(void **state) {
    (void)state;
    check_encoder(fx.mm_f32, VIS_TOL_F32);
}

static void test_encoder_connector_f16(void **state) {
    (void)state;
    check_encoder(fx.mm_f16, VIS_TOL_F16);
}

static void check_prompt_ids(const cellm_model *m, const cellm_image_embed *e, const fx_image *im);
static double check_logits(const char *text, const cellm_image_embed *e, const fx_image *im);

/* The public API from RGB8 pixels to the first generated tokens: the
 * frames and the same embeddings; the prompt's ids; the image rows in the
 * flat batch and the logits of 3 greedy steps. */
static void test_image_encode_api(void **state) {
    (void)state;
    cellm_model *m;
    cellm_mmproj *mm;
    assert_int_equal(cellm_model_load(fx.text_f32, NULL, &m), CELLM_OK);
    assert_int_equal(cellm_mmproj_load(fx.mm_f32, m, NULL, &mm), CELLM_OK);
    for (int i = 0; i < N_IMAGES; i++) {
        const fx_image *im = &fx.img[i];
        cellm_image_embed *e;
        assert_int_equal(cellm_image_encode(mm, im->rgb, im->w, im->h, &e), CELLM_OK);
        assert_int_equal(e->n_frames, im->frames);
        assert_int_equal(e->rows, im->rows);
        assert_int_equal(e->cols, im->cols);
        assert_int_equal(e->tokens_per_frame, 4);
        assert_int_equal(e->n_tokens, im->frames * 4);
        assert_int_equal(e->n_embd, 64);
        double s, d = max_diff(e->embd, im->conn, (size_t)e->n_tokens * 64, &s);
        print_message("cellm_image_encode image %d: max diff %.3g (values to %.3g)\n", i, d, s);
        assert_true(d <= VIS_TOL_F32 * fmax(1.0, s));
        check_prompt_ids(m, e, im);
        d = check_logits(fx.text_f32, e, im);
        print_message("image %d: %d prompt ids, logits of 3 greedy steps within %.3g (relative)\n",
                      i, im->n_ids, d);
        assert_true(d <= LOGIT_TOL);
        cellm_image_embed_free(e);
    }
    cellm_mmproj_free(mm);
    cellm_model_free(m);
}

/* The prompt with the picture's tokens, as the processor writes it. */
static void check_prompt_ids(const cellm_model *m, const cellm_image_embed *e, const fx_image *im) {
    char *img, text[8192];
    assert_int_equal(cellm_image_prompt(e, &img), CELLM_OK);
    snprintf(text, sizeof text,
             "<|im_start|>User:%sDescribe this image.<end_of_utterance>\nAssistant:", img);
    free(img);
    int32_t *ids, n;
    assert_int_equal(
        cellm_tokenize_ex(m, text, strlen(text), CELLM_TOKENIZE_PARSE_SPECIAL, &ids, &n), CELLM_OK);
    assert_int_equal(n, im->n_ids);
    assert_memory_equal(ids, im->ids, (size_t)n * sizeof *ids);
    int n_img = 0;
    for (int32_t k = 0; k < n; k++) n_img += ids[k] == IMAGE_TOKEN;
    assert_int_equal(n_img, e->n_tokens);
    free(ids);
}

/* The text model with the picture's rows in place of its image tokens
 * (forward_run_embd, as `cellm run` feeds them): the next-token logits of
 * N_GEN greedy steps into lg_out, their tokens into gen. */
static void rt_greedy(const char *text, const int32_t *ids, int n, const cellm_image_embed *e,
                      float lg_out[N_GEN][VOCAB], int32_t gen[N_GEN]) {
    model *m;
    kv_cache *kv;
    threadpool *tp;
    forward_ctx *f;
    cellm_error err;
    if (model_load(text, &m, &err) ||
        kv_cache_create(m, 16u << 20, 256, 1, MAX_IDS, CELLM_KV_F16, &kv, &err) ||
        tp_create(2, &tp, &err) || forward_create(m, kv, tp, MAX_IDS, 1, &f, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    kv_seq s;
    assert_int_equal(kv_seq_init(kv, &s, &err), CELLM_OK);
    fwd_row rows[MAX_IDS];
    const float *embd[MAX_IDS];
    int next_img = 0;
    assert_true(n <= MAX_IDS);
    for (int k = 0; k < n; k++) {
        rows[k] = (fwd_row){.seq = &s, .token = ids[k], .pos = k, .logits = k == n - 1};
        embd[k] = ids[k] == IMAGE_TOKEN ? e->embd + (size_t)next_img++ * 64 : NULL;
    }
    assert_int_equal(next_img, e->n_tokens);
    for (int step = 0; step < N_GEN; step++) {
        const float *lg;
        if (forward_run_embd(f, step ? rows + n - 1 : rows, step ? NULL : embd, step ? 1 : n, &lg,
                             &err)) {
            print_error("%s\n", err.msg);
            fail();
        }
        memcpy(lg_out[step], lg, sizeof lg_out[step]);
        int best = 0;
        for (int v = 1; v < VOCAB; v++)
            if (lg[v] > lg[best]) best = v;
        gen[step] = best;
        rows[n - 1] = (fwd_row){.seq = &s, .token = best, .pos = n + step, .logits = true};
    }
    kv_seq_free(kv, &s);
    forward_free(f);
    tp_destroy(tp);
    kv_cache_free(kv);
    model_free(m);
}

/* The rt path on the fixture's prompt: the next-token logits and greedy
 * tokens of transformers, 3 steps; returns the largest relative
 * difference. */
static double check_logits(const char *text, const cellm_image_embed *e, const fx_image *im) {
    static float lg[N_GEN][VOCAB];
    int32_t gen[N_GEN];
    rt_greedy(text, im->ids, im->n_ids, e, lg, gen);
    double worst = 0;
    for (int step = 0; step < N_GEN; step++) {
        double sc, d = max_diff(lg[step], im->logits[step], VOCAB, &sc) / fmax(1.0, sc);
        if (d > worst) worst = d;
        assert_int_equal(gen[step], im->gen[step]);
    }
    return worst;
}

/* ---- picture files made here: PNG with stored (uncompressed) deflate
 * blocks, JPEG through libjpeg ---- */

typedef struct pbuf {
    uint8_t *p;
    size_t n, cap;
} pbuf;

static void put_bytes(pbuf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void put_be32(pbuf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    put_bytes(b, x, 4);
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void put_chunk(pbuf *b, const char *type, const uint8_t *data, size_t n) {
    put_be32(b, (uint32_t)n);
    size_t at = b->n;
    put_bytes(b, type, 4);
    if (n) put_bytes(b, data, n);
    put_be32(b, crc32_of(b->p + at, n + 4));
}

/* A PNG of w x h with `depth` bits and colour type `ctype` whose rows
 * (filter byte 0 each) are `raw` (row_bytes per row). */
static pbuf make_png(uint32_t w, uint32_t h, int depth, int ctype, const uint8_t *raw,
                     size_t row_bytes) {
    pbuf b = {0}, z = {0};
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    put_bytes(&b, sig, 8);
    uint8_t ihdr[13];
    for (int i = 0; i < 4; i++) {
        ihdr[i] = (uint8_t)(w >> (24 - 8 * i));
        ihdr[4 + i] = (uint8_t)(h >> (24 - 8 * i));
    }
    ihdr[8] = (uint8_t)depth;
    ihdr[9] = (uint8_t)ctype;
    ihdr[10] = ihdr[11] = ihdr[12] = 0;
    put_chunk(&b, "IHDR", ihdr, 13);
    /* zlib: header, one stored block per row, adler32. */
    put_bytes(&z, "\x78\x01", 2);
    uint32_t a = 1, bsum = 0;
    for (uint32_t y = 0; raw && y < h; y++) {
        uint8_t hd[5], zero = 0;
        uint16_t len = (uint16_t)(row_bytes + 1);
        hd[0] = y + 1 == h;
        hd[1] = (uint8_t)len;
        hd[2] = (uint8_t)(len >> 8);
        hd[3] = (uint8_t)~len;
        hd[4] = (uint8_t)(~len >> 8);
        put_bytes(&z, hd, 5);
        put_bytes(&z, &zero, 1);
        put_bytes(&z, raw + y * row_bytes, row_bytes);
        const uint8_t *row = z.p + z.n - row_bytes - 1;
        for (size_t i = 0; i <= row_bytes; i++) {
            a = (a + row[i]) % 65521;
            bsum = (bsum + a) % 65521;
        }
    }
    put_be32(&z, bsum << 16 | a);
    put_chunk(&b, "IDAT", z.p, z.n); /* without rows: a header-only zlib stream */
    put_chunk(&b, "IEND", NULL, 0);
    free(z.p);
    return b;
}

/* A JPEG of w x h from `px` (3 or 4 components: RGB or CMYK). */
static pbuf make_jpeg(int w, int h, int comps, const uint8_t *px) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *out = NULL;
    unsigned long n = 0;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &out, &n);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = comps;
    c.in_color_space = comps == 4 ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)c.next_scanline * (size_t)w * (size_t)comps);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    pbuf b = {0};
    put_bytes(&b, out, n);
    free(out);
    return b;
}

static void expect_bad_file(const pbuf *b, size_t n, cellm_status want, const char *needle) {
    uint8_t *rgb = (uint8_t *)&rgb;
    int32_t w = -1, h = -1;
    cellm_error err;
    cellm_status st = image_decode(b->p, n, &rgb, &w, &h, &err);
    if (st == CELLM_OK || (want && st != want) || (needle && !strstr(err.msg, needle))) {
        print_error("%zu bytes: status %d, message '%s' (wanted %d, '%s')\n", n, st,
                    st ? err.msg : "", want, needle ? needle : "");
        fail();
    }
    assert_null(rgb);
}

static void test_png_file(void **state) {
    (void)state;
    for (int i = 0; i < N_IMAGES; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/data/vision/idefics3-img%d.png", CELLM_SOURCE_DIR, i);
        uint8_t *rgb;
        int32_t w, h;
        cellm_error err;
        assert_int_equal(image_file_read(path, &rgb, &w, &h, &err), CELLM_OK);
        assert_int_equal(w, fx.img[i].w);
        assert_int_equal(h, fx.img[i].h);
        assert_memory_equal(rgb, fx.img[i].rgb, (size_t)w * (size_t)h * 3);
        free(rgb);
    }
}

static void test_asan_hostile_files(void **state) {
    (void)state;
    const fx_image *im = &fx.img[1];
    pbuf png = make_png((uint32_t)im->w, (uint32_t)im->h, 8, 2, im->rgb, (size_t)im->w * 3);
    uint8_t *rgb;
    int32_t w, h;
    cellm_error err;
    assert_int_equal(image_decode(png.p, png.n, &rgb, &w, &h, &err), CELLM_OK);
    assert_memory_equal(rgb, im->rgb, (size_t)w * (size_t)h * 3);
    free(rgb);
    for (size_t n = 0; n < png.n; n += png.n / 23 + 1) expect_bad_file(&png, n, 0, NULL);
    free(png.p);
    /* The header's size is refused before anything is allocated. */
    pbuf huge = make_png(30000, 30000, 8, 2, NULL, 0);
    expect_bad_file(&huge, huge.n, CELLM_ERR_INVALID_ARG, "30000x30000");
    free(huge.p);
    /* 16-bit RGB and 16-bit grey: white and black stay white and black. */
    uint8_t raw16[4 * 6] = {0};
    memset(raw16, 0xff, 12); /* first row: 2 white pixels */
    pbuf p16 = make_png(2, 2, 16, 2, raw16, 12);
    assert_int_equal(image_decode(p16.p, p16.n, &rgb, &w, &h, &err), CELLM_OK);
    assert_int_equal(rgb[0], 255);
    assert_int_equal(rgb[5], 255);
    assert_int_equal(rgb[6], 0);
    assert_int_equal(rgb[11], 0);
    free(rgb);
    free(p16.p);
    uint8_t grey[2] = {0xff, 0xff};
    pbuf g16 = make_png(1, 1, 16, 0, grey, 2);
    assert_int_equal(image_decode(g16.p, g16.n, &rgb, &w, &h, &err), CELLM_OK);
    assert_int_equal(rgb[0], 255);
    assert_int_equal(rgb[2], 255);
    free(rgb);
    free(g16.p);
    /* JPEG: RGB decodes; CMYK is refused; truncations are errors. */
    pbuf jpg = make_jpeg(im->w, im->h, 3, im->rgb);
    assert_int_equal(image_decode(jpg.p, jpg.n, &rgb, &w, &h, &err), CELLM_OK);
    assert_int_equal(w, im->w);
    assert_int_equal(h, im->h);
    free(rgb);
    for (size_t n = 0; n < jpg.n; n += jpg.n / 23 + 1) expect_bad_file(&jpg, n, 0, NULL);
    free(jpg.p);
    uint8_t *cmyk = calloc((size_t)im->w * (size_t)im->h * 4, 1);
    pbuf cj = make_jpeg(im->w, im->h, 4, cmyk);
    expect_bad_file(&cj, cj.n, CELLM_ERR_UNSUPPORTED, "CMYK");
    free(cj.p);
    free(cmyk);
    pbuf junk = {0};
    put_bytes(&junk, "GIF89a not a picture", 20);
    expect_bad_file(&junk, junk.n, CELLM_ERR_UNSUPPORTED, "not a PNG or JPEG");
    free(junk.p);
}

/* `cellm run --mmproj --image` feeds the processor's prompt (its length)
 * and answers with transformers' greedy tokens, as its stream decoder
 * prints them (these random tokens are mostly lone bytes, printed as
 * U+FFFD: the token-exact check is test_image_prompt_logits). */
static void test_run_image_command(void **state) {
    (void)state;
    model *m;
    tokenizer *tk;
    cellm_error err;
    assert_int_equal(model_load(fx.text_f32, &m, &err), CELLM_OK);
    assert_int_equal(tokenizer_load(m->file, &tk, &err), CELLM_OK);
    for (int i = 0; i < N_IMAGES; i++) {
        char want[256], cmd[4096], *out, need[64];
        size_t len = 0, k;
        tok_stream ts;
        tok_stream_init(&ts, tk, 0);
        for (int j = 0; j < N_GEN; j++) {
            assert_int_equal(
                tok_stream_push(&ts, fx.img[i].gen[j], want + len, sizeof want - len, &k, &err),
                CELLM_OK);
            len += k;
        }
        assert_int_equal(tok_stream_flush(&ts, want + len, sizeof want - len, &k, &err), CELLM_OK);
        len += k;
        snprintf(cmd, sizeof cmd,
                 "'%s' run '%s' --mmproj '%s' --image '%s/tests/data/vision/idefics3-img%d.png' "
                 "-p 'Describe this image.' -n %d --temp 0 --ignore-eos -t 2 -v 2>&1",
                 test_cellm_bin(), fx.text_f32, fx.mm_f32, CELLM_SOURCE_DIR, i, N_GEN);
        assert_int_equal(test_run_cmd(cmd, &out), 0);
        char *nl = strstr(out, "ms\n"); /* after the "image: ..." line */
        assert_non_null(nl);
        if (memcmp(nl + 3, want, len) || nl[3 + len] != '\n') {
            print_error("image %d: cellm run printed '%s', transformers' tokens are '%.*s'\n", i,
                        out, (int)len, want);
            fail();
        }
        snprintf(need, sizeof need, "prompt: %d tokens", fx.img[i].n_ids);
        assert_non_null(strstr(out, need));
        free(out);
    }
    tokenizer_free(tk);
    model_free(m);
    /* Refusals: no projector, and a projector of another model. */
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --image x.png -p hi 2>&1", test_cellm_bin(),
             fx.text_f32);
    assert_int_equal(test_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out, "--mmproj"));
    free(out);
    char real[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' run '%s' --mmproj '%s' --image '%s/tests/data/vision/idefics3-img0.png' -p hi "
             "2>&1",
             test_cellm_bin(), test_model_path("smollm2-135m", real, sizeof real), fx.mm_f16,
             CELLM_SOURCE_DIR);
    assert_int_equal(test_run_cmd(cmd, &out), 1);
    assert_non_null(strstr(out, "another model"));
    free(out);
}

static void expect_refused(cellm_mmproj *mm, const uint8_t *px, int32_t w, int32_t h,
                           const char *needle) {
    cellm_image_embed *e = (cellm_image_embed *)&e;
    assert_int_equal(cellm_image_encode(mm, px, w, h, &e), CELLM_ERR_INVALID_ARG);
    assert_null(e);
    if (!strstr(cellm_last_error(), needle)) {
        print_error("%dx%d: message '%s' lacks '%s'\n", w, h, cellm_last_error(), needle);
        fail();
    }
}

static void test_asan_hostile_images(void **state) {
    (void)state;
    cellm_mmproj *mm;
    assert_int_equal(cellm_mmproj_load(fx.mm_f16, NULL, NULL, &mm), CELLM_OK);
    uint8_t small[12] = {0};
    /* Sizes are checked before the pixels are read or anything allocated. */
    expect_refused(mm, small, 30000, 30000, "30000x30000");
    expect_refused(mm, small, 0, 4, "0x4");
    expect_refused(mm, small, -5, 4, "-5x4");
    expect_refused(mm, small, 8193, 1, "8193x1");
    expect_refused(mm, NULL, 2, 2, "NULL");
    cellm_image_embed *e;
    /* The smallest and the thinnest pictures are fine. */
    assert_int_equal(cellm_image_encode(mm, small, 1, 1, &e), CELLM_OK);
    assert_int_equal(e->n_frames, 5); /* 1x1 -> 64x64: 2x2 tiles + global */
    cellm_image_embed_free(e);
    uint8_t *thin = calloc(8192 * 3, 1);
    assert_int_equal(cellm_image_encode(mm, thin, 1, 8192, &e), CELLM_OK);
    assert_int_equal(e->rows, 2);
    assert_int_equal(e->cols, 1);
    for (size_t i = 0; i < (size_t)e->n_tokens * (size_t)e->n_embd; i++)
        assert_true(isfinite(e->embd[i]));
    cellm_image_embed_free(e);
    free(thin);
    cellm_mmproj_free(mm);
}

static void test_asan_bad_projectors(void **state) {
    (void)state;
    cellm_mmproj *mm = (cellm_mmproj *)&mm;
    /* The text model's file given as the projector. */
    assert_int_equal(cellm_mmproj_load(fx.text_f16, NULL, NULL, &mm), CELLM_ERR_FORMAT);
    assert_null(mm);
    assert_non_null(strstr(cellm_last_error(), "clip"));
    /* A projector for a model of another width (SmolLM2's 576). */
    char real[1024];
    cellm_model *m;
    assert_int_equal(cellm_model_load(test_model_path("smollm2-135m", real, sizeof real), NULL, &m),
                     CELLM_OK);
    assert_int_equal(cellm_mmproj_load(fx.mm_f16, m, NULL, &mm), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "another model"));
    cellm_model_free(m);
    /* Truncated projectors: every cut is refused, never a crash. */
    size_t len = 0;
    char *file = test_read_file(fx.mm_f16, &len);
    assert_non_null(file);
    char cut[1100];
    snprintf(cut, sizeof cut, "%s/cut.gguf", fx.dir);
    size_t step = len / 97 + 1;
    for (size_t n = 0; n < len; n += step) {
        FILE *f = fopen(cut, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(file, 1, n, f), n);
        fclose(f);
        assert_int_not_equal(cellm_mmproj_load(cut, NULL, NULL, &mm), CELLM_OK);
        assert_null(mm);
        assert_true(strlen(cellm_last_error()) > 0);
    }
    unlink(cut);
    free(file);
    assert_int_equal(cellm_mmproj_load(NULL, NULL, NULL, &mm), CELLM_ERR_INVALID_ARG);
    cellm_mmproj_params p = cellm_mmproj_default_params();
    p.n_threads = -1;
    assert_int_equal(cellm_mmproj_load(fx.mm_f16, NULL, &p, &mm), CELLM_ERR_INVALID_ARG);
}

/* ---- pictures through the engine (cellm_request_params.images) ---- */

typedef struct lp_log {
    int n;
    int32_t tok[8];
    float lp[8];
} lp_log;

static void on_lp(const cellm_token_logprob *lp, void *user) {
    lp_log *l = user;
    if (!lp->is_prompt && l->n < 8) {
        l->tok[l->n] = lp->token;
        l->lp[l->n++] = lp->logprob;
    }
}

/* Submits ids with one picture (greedy, N_GEN tokens, their logprobs);
 * frees the caller's picture right after submit when `give`. */
static cellm_result engine_greedy(cellm_engine *en, const int32_t *ids, int32_t n,
                                  cellm_image_embed *e, bool give, lp_log *log) {
    cellm_request_params p = cellm_request_default_params();
    const cellm_image_embed *imgs[1] = {e};
    p.tokens = ids;
    p.n_tokens = n;
    p.images = imgs;
    p.n_images = 1;
    p.max_tokens = N_GEN;
    p.logprobs = 1;
    p.on_logprob = on_lp;
    p.user = log;
    *log = (lp_log){0};
    cellm_request *r;
    assert_int_equal(cellm_submit(en, &p, &r), CELLM_OK);
    if (give) cellm_image_embed_free(e);
    cellm_result res;
    assert_int_equal(cellm_wait(r, &res), CELLM_OK);
    assert_int_equal(res.status, CELLM_OK);
    const int32_t *out;
    int32_t n_out;
    assert_int_equal(cellm_request_tokens(r, &out, &n_out), CELLM_OK);
    assert_int_equal(n_out, log->n);
    assert_memory_equal(out, log->tok, (size_t)n_out * sizeof *out);
    cellm_request_free(r);
    return res;
}

/* The engine's tokens and their log-probabilities are the rt path's
 * (cellm run's way of feeding the rows) greedy steps. */
static void expect_as_rt(const cellm_result *res, const lp_log *got, float lg[N_GEN][VOCAB],
                         const int32_t gen[N_GEN]) {
    for (int k = 0; k < got->n; k++) {
        assert_int_equal(got->tok[k], gen[k]);
        /* Not fmax: gcc 12 for aarch64 dies on that reduction (an internal
         * compiler error in the vectorizer at -O2). */
        double mx = lg[k][0], sum = 0;
        for (int v = 1; v < VOCAB; v++) mx = lg[k][v] > mx ? lg[k][v] : mx;
        for (int v = 0; v < VOCAB; v++) sum += exp((double)lg[k][v] - mx);
        double want = (double)lg[k][gen[k]] - mx - log(sum);
        assert_true(fabs((double)got->lp[k] - want) <= 1e-4);
    }
    if (got->n < N_GEN) { /* the rt path's next token is the stop token */
        assert_int_equal(res->finish_reason, CELLM_FINISH_STOP);
        assert_int_equal(res->stop_token, gen[got->n]);
    }
}

static void expect_submit_refused(cellm_engine *en, const int32_t *ids, int32_t n,
                                  const cellm_image_embed *const *imgs, int32_t n_images,
                                  const char *needle) {
    cellm_request_params p = cellm_request_default_params();
    p.tokens = ids;
    p.n_tokens = n;
    p.images = imgs;
    p.n_images = n_images;
    cellm_request *r = (cellm_request *)&p;
    assert_int_equal(cellm_submit(en, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_null(r);
    if (!strstr(cellm_last_error(), needle)) {
        print_error("expected \"%s\" in: %s\n", needle, cellm_last_error());
        fail();
    }
}

/* A picture through cellm_submit: the rt path's tokens and logits; the
 * same picture again (the caller's copy freed at submit) found in the
 * prefix cache with the same tokens; a different picture of the same size
 * (the first one mirrored) shares only the text before it; a request
 * preempted mid-prompt recomputes the same rows; bad pictures and counts
 * refused with a message. */
static void test_asan_engine_images(void **state) {
    (void)state;
    const fx_image *im = &fx.img[0];
    cellm_model *m;
    cellm_mmproj *mm;
    assert_int_equal(cellm_model_load(fx.text_f32, NULL, &m), CELLM_OK);
    assert_int_equal(cellm_mmproj_load(fx.mm_f32, m, NULL, &mm), CELLM_OK);
    cellm_image_embed *ea, *eb, *ef;
    uint8_t *flip = malloc((size_t)im->w * (size_t)im->h * 3);
    assert_non_null(flip);
    for (int y = 0; y < im->h; y++)
        for (int x = 0; x < im->w; x++)
            memcpy(flip + ((size_t)y * (size_t)im->w + (size_t)x) * 3,
                   im->rgb + ((size_t)y * (size_t)im->w + (size_t)(im->w - 1 - x)) * 3, 3);
    assert_int_equal(cellm_image_encode(mm, im->rgb, im->w, im->h, &ea), CELLM_OK);
    assert_int_equal(cellm_image_encode(mm, im->rgb, im->w, im->h, &eb), CELLM_OK);
    assert_int_equal(cellm_image_encode(mm, flip, im->w, im->h, &ef), CELLM_OK);
    free(flip);

    /* A system turn long enough to fill whole KV blocks before the picture. */
    char *img, text[8192];
    assert_int_equal(cellm_image_prompt(ea, &img), CELLM_OK);
    snprintf(text, sizeof text,
             "<|im_start|>System: look well at the picture.<end_of_utterance>\n"
             "<|im_start|>User:%sDescribe this image.<end_of_utterance>\nAssistant:",
             img);
    free(img);
    int32_t *ids, n;
    assert_int_equal(
        cellm_tokenize_ex(m, text, strlen(text), CELLM_TOKENIZE_PARSE_SPECIAL, &ids, &n), CELLM_OK);
    int32_t first = 0;
    while (ids[first] != IMAGE_TOKEN) first++;
    print_message("engine prompt: %d ids, the picture's from %d\n", (int)n, (int)first);
    assert_true(n <= MAX_IDS && first >= 16);

    static float lg_a[N_GEN][VOCAB], lg_f[N_GEN][VOCAB];
    int32_t gen_a[N_GEN], gen_f[N_GEN];
    rt_greedy(fx.text_f32, ids, n, ea, lg_a, gen_a);
    rt_greedy(fx.text_f32, ids, n, ef, lg_f, gen_f);

    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.max_ctx = 256;
    ep.max_seqs = 2;
    ep.max_batch_tokens = 64; /* the prompt takes several steps */
    ep.mem_budget_bytes = 32u << 20;
    cellm_engine *en;
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_OK);
    lp_log log;
    cellm_result res = engine_greedy(en, ids, n, ea, false, &log);
    assert_int_equal(res.n_cached_tokens, 0);
    expect_as_rt(&res, &log, lg_a, gen_a);

    res = engine_greedy(en, ids, n, eb, true, &log); /* eb freed at submit */
    print_message("same picture again: %d of %d prompt tokens cached\n", (int)res.n_cached_tokens,
                  (int)n);
    assert_true(res.n_cached_tokens > first);
    expect_as_rt(&res, &log, lg_a, gen_a);

    res = engine_greedy(en, ids, n, ef, false, &log);
    print_message("another picture: %d cached (the text before it: %d)\n", (int)res.n_cached_tokens,
                  (int)first);
    assert_true(res.n_cached_tokens > 0 && res.n_cached_tokens <= first);
    expect_as_rt(&res, &log, lg_f, gen_f);

    /* Refused at submit. */
    const cellm_image_embed *one[1] = {ea}, *two[2] = {ea, ef}, *none[1] = {NULL};
    expect_submit_refused(en, ids, first, one, 1, "image tokens"); /* the text alone */
    expect_submit_refused(en, ids, n, two, 2, "image tokens");     /* one picture too many */
    expect_submit_refused(en, ids, n, none, 1, "not an encoded picture");
    expect_submit_refused(en, ids, n, NULL, 1, "n_images");
    expect_submit_refused(en, ids, n, one, CELLM_MAX_IMAGES + 1, "n_images");
    cellm_image_embed narrow = *ea;
    narrow.n_embd = 32;
    const cellm_image_embed *bad[1] = {&narrow};
    expect_submit_refused(en, ids, n, bad, 1, "another model");

    /* Chat messages with "<image>" where the picture goes: the template
     * lays it out as the processor does (the fixture's prompt ids), and
     * the answer is transformers'. */
    cellm_chat_message msg = {"user", "<image>Describe this image."};
    cellm_request_params p = cellm_request_default_params();
    p.messages = &msg;
    p.n_messages = 1;
    p.images = one;
    p.n_images = 1;
    p.max_tokens = N_GEN;
    cellm_request *r;
    assert_int_equal(cellm_submit(en, &p, &r), CELLM_OK);
    assert_int_equal(cellm_wait(r, &res), CELLM_OK);
    assert_int_equal(res.n_prompt_tokens, im->n_ids);
    const int32_t *out;
    int32_t n_out;
    assert_int_equal(cellm_request_tokens(r, &out, &n_out), CELLM_OK);
    assert_true(n_out >= 1);
    assert_memory_equal(out, im->gen, (size_t)n_out * sizeof *out);
    cellm_request_free(r);
    msg.content = "<image><image>Describe both.";
    assert_int_equal(cellm_submit(en, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "mark 2 pictures"));

    cellm_engine_free(en);

    /* Preempted after its first chunk (a critical trim), without the
     * prefix cache: it recomputes the picture's rows from its own copy. */
    ep.prefix_cache = 0;
    ep.manual_steps = 1;
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_OK);
    const cellm_image_embed *imgs[1] = {ef};
    p = cellm_request_default_params();
    p.tokens = ids;
    p.n_tokens = n;
    p.images = imgs;
    p.n_images = 1;
    p.max_tokens = N_GEN;
    assert_int_equal(cellm_submit(en, &p, &r), CELLM_OK);
    int more;
    assert_int_equal(cellm_engine_step(en, &more), CELLM_OK);
    assert_int_equal(cellm_engine_trim(en, CELLM_TRIM_CRITICAL, NULL), CELLM_OK);
    assert_int_equal(cellm_wait(r, &res), CELLM_OK);
    assert_true(res.n_preemptions >= 1);
    assert_int_equal(cellm_request_tokens(r, &out, &n_out), CELLM_OK);
    assert_true(n_out >= 1);
    assert_memory_equal(out, gen_f, (size_t)n_out * sizeof *out);
    cellm_request_free(r);
    cellm_engine_free(en);

    free(ids);
    cellm_image_embed_free(ea);
    cellm_image_embed_free(ef);
    cellm_mmproj_free(mm);
    cellm_model_free(m);
}

/* Pictures count against the engine's budget: the room kept for them
 * (image_budget_bytes, 16 MiB by default) comes out of the KV cache's
 * share; a request holds its rows from submit to its end; one whose
 * pictures do not fit beside the others' is refused until they end, one
 * over the room alone always. */
static void test_asan_image_budget(void **state) {
    (void)state;
    const fx_image *im = &fx.img[0];
    cellm_model *m;
    cellm_mmproj *mm;
    assert_int_equal(cellm_model_load(fx.text_f32, NULL, &m), CELLM_OK);
    assert_int_equal(cellm_mmproj_load(fx.mm_f32, m, NULL, &mm), CELLM_OK);
    cellm_image_embed *ea;
    assert_int_equal(cellm_image_encode(mm, im->rgb, im->w, im->h, &ea), CELLM_OK);
    const size_t bytes = (size_t)ea->n_tokens * (size_t)ea->n_embd * sizeof(float);

    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 1;
    ep.max_ctx = 256;
    ep.max_seqs = 2;
    ep.mem_budget_bytes = 32u << 20;
    ep.manual_steps = 1;
    cellm_engine *en;
    cellm_stats st;
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_OK);
    assert_int_equal(cellm_engine_stats(en, &st), CELLM_OK);
    assert_int_equal(st.bytes_images_total, 16u << 20); /* the default */
    size_t kv_default = st.bytes_kv_total;
    cellm_engine_free(en);

    ep.image_budget_bytes = bytes + bytes / 2; /* one picture, not two */
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_OK);
    assert_int_equal(cellm_engine_stats(en, &st), CELLM_OK);
    assert_int_equal(st.bytes_images_total, ep.image_budget_bytes);
    assert_int_equal(st.bytes_images_in_use, 0);
    assert_true(st.bytes_kv_total > kv_default); /* the 16 MiB went to the KV cache */
    assert_true(st.bytes_activations + st.bytes_images_total + st.bytes_kv_total <=
                ep.mem_budget_bytes);

    const cellm_image_embed *one[1] = {ea};
    cellm_chat_message msg = {"user", "<image>Describe this image."};
    cellm_request_params p = cellm_request_default_params();
    p.messages = &msg;
    p.n_messages = 1;
    p.images = one;
    p.n_images = 1;
    p.max_tokens = 2;
    cellm_request *r1, *r2, *r3;
    assert_int_equal(cellm_submit(en, &p, &r1), CELLM_OK);
    assert_int_equal(cellm_engine_stats(en, &st), CELLM_OK);
    assert_int_equal(st.bytes_images_in_use, bytes);
    assert_true(st.bytes_in_use >= st.bytes_activations + bytes);
    /* A second picture while the first is held: refused, the text alone is not. */
    assert_int_equal(cellm_submit(en, &p, &r2), CELLM_ERR_NO_MEMORY);
    assert_null(r2);
    assert_non_null(strstr(cellm_last_error(), "other requests' pictures"));
    p.n_images = 0;
    msg.content = "Describe nothing.";
    assert_int_equal(cellm_submit(en, &p, &r3), CELLM_OK);
    cellm_result res;
    assert_int_equal(cellm_wait(r1, &res), CELLM_OK);
    assert_int_equal(res.status, CELLM_OK);
    assert_int_equal(cellm_engine_stats(en, &st), CELLM_OK);
    assert_int_equal(st.bytes_images_in_use, 0); /* given back at the end, before the free */
    p.n_images = 1;
    msg.content = "<image>Describe this image.";
    assert_int_equal(cellm_submit(en, &p, &r2), CELLM_OK); /* room again */
    assert_int_equal(cellm_wait(r2, &res), CELLM_OK);
    assert_int_equal(cellm_wait(r3, &res), CELLM_OK);
    cellm_request_free(r1);
    cellm_request_free(r2);
    cellm_request_free(r3);
    cellm_engine_free(en);

    /* Less room than one picture needs. */
    ep.image_budget_bytes = bytes - 1;
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_OK);
    assert_int_equal(cellm_submit(en, &p, &r1), CELLM_ERR_NO_MEMORY);
    assert_non_null(strstr(cellm_last_error(), "more than the engine keeps for pictures"));
    cellm_engine_free(en);

    /* More room than the budget has. */
    ep.image_budget_bytes = ep.mem_budget_bytes;
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_ERR_NO_MEMORY);
    assert_non_null(strstr(cellm_last_error(), "image_budget_bytes"));

    /* The phone mode counts it with everything else (on the CPU device:
     * listing a GPU would count its driver too, tens of MiB with Mesa's
     * lavapipe, which this cap does not hold). */
    ep.image_budget_bytes = 0;
    ep.device = CELLM_DEVICE_CPU;
    ep.process_budget_bytes = (size_t)64 << 20;
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_OK);
    assert_int_equal(cellm_engine_stats(en, &st), CELLM_OK);
    assert_int_equal(st.bytes_images_total, 16u << 20);
    cellm_engine_free(en);
    ep.process_budget_bytes = (size_t)16 << 20; /* not even the pictures' room */
    assert_int_equal(cellm_engine_create(m, &ep, &en), CELLM_ERR_NO_MEMORY);
    assert_non_null(strstr(cellm_last_error(), "pictures 16 MiB"));

    cellm_image_embed_free(ea);
    cellm_mmproj_free(mm);
    cellm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lanczos_as_pillow),     cmocka_unit_test(test_pixels_as_processor),
        cmocka_unit_test(test_encoder_connector_f32), cmocka_unit_test(test_encoder_connector_f16),
        cmocka_unit_test(test_image_encode_api),      cmocka_unit_test(test_png_file),
        cmocka_unit_test(test_run_image_command),     cmocka_unit_test(test_asan_hostile_files),
        cmocka_unit_test(test_asan_hostile_images),   cmocka_unit_test(test_asan_bad_projectors),
        cmocka_unit_test(test_asan_engine_images),    cmocka_unit_test(test_asan_image_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
