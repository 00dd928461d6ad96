/*
 * vision_encode.c — how long cellm_image_encode() takes for one 512x512
 * picture on a projector of SmolVLM-256M's vision size (SigLIP base:
 * width 768, 12 layers, MLP 3072, 12 heads, 512-pixel tiles of 16-pixel
 * patches, pixel shuffle by 4 into 576-wide tokens; F16 matrices), with
 * seeded random weights written here (no real weights can be fetched;
 * the time does not depend on the values).
 *
 * Two processor settings: `preproc_image_size` 512 (the picture is one
 * frame of 1,024 patches, 64 tokens) and SmolVLM's 2048 (the picture is
 * resized to 2048x2048: 4x4 tiles and the global image, 17 frames, 1,088
 * tokens). Build from the repository root after building ./build:
 *
 *   cc -O2 -Isrc -Iinclude -Itools bench/vision_encode.c build/libcellm.a -lm -lpthread \
 *      -o build/vision_encode
 *   ./build/vision_encode [THREADS] [ROUNDS] [--one-frame]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cellm.h"
#include "format/gguf.h"
#include "format/quant.h"

enum { D = 768, F = 3072, L = 12, H = 12, IMG = 512, PS = 16, SCALE = 4, PROJ = 576 };

static uint64_t rng = 0x9e3779b97f4a7c15u;

static float rnd(float scale) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return scale * ((float)(rng >> 40) / (float)(1u << 24) - 0.5f);
}

static void *block(uint32_t type, size_t n, float scale) {
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = scale ? rnd(scale) : 1.0f;
    if (type == QT_F32) return f;
    void *q = malloc(n * 2);
    quant_type_get(type)->from_float(f, q, n);
    free(f);
    return q;
}

static void add(gguf_writer *w, const char *name, uint32_t type, uint32_t nd, uint64_t a,
                uint64_t b, uint64_t c, uint64_t d, float scale, void **keep, int *nk) {
    uint64_t ne[4] = {a, b, c, d};
    keep[*nk] = block(type, (size_t)(a * b * c * d), scale);
    gguf_writer_add_tensor(w, name, type, nd, ne, keep[(*nk)++], NULL);
}

static void write_projector(const char *path, uint32_t preproc) {
    gguf_writer *w = gguf_writer_new();
    static void *keep[512];
    int nk = 0;
    gguf_value yes = {.type = GGUF_TYPE_BOOL, .v.b = true};
    gguf_writer_set_str(w, "general.architecture", "clip", NULL);
    gguf_writer_set(w, "clip.has_vision_encoder", &yes, NULL);
    gguf_writer_set_str(w, "clip.projector_type", "idefics3", NULL);
    gguf_writer_set_u32(w, "clip.vision.image_size", IMG, NULL);
    gguf_writer_set_u32(w, "clip.vision.patch_size", PS, NULL);
    gguf_writer_set_u32(w, "clip.vision.embedding_length", D, NULL);
    gguf_writer_set_u32(w, "clip.vision.feed_forward_length", F, NULL);
    gguf_writer_set_u32(w, "clip.vision.block_count", L, NULL);
    gguf_writer_set_u32(w, "clip.vision.attention.head_count", H, NULL);
    gguf_writer_set_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-6f, NULL);
    gguf_writer_set_u32(w, "clip.vision.projection_dim", PROJ, NULL);
    gguf_writer_set_u32(w, "clip.vision.projector.scale_factor", SCALE, NULL);
    gguf_writer_set_u32(w, "clip.vision.preproc_image_size", preproc, NULL);
    int64_t N = (IMG / PS) * (IMG / PS);
    add(w, "v.patch_embd.weight", QT_F16, 4, PS, PS, 3, D, 0.05f, keep, &nk);
    add(w, "v.patch_embd.bias", QT_F32, 1, D, 1, 1, 1, 0.1f, keep, &nk);
    add(w, "v.position_embd.weight", QT_F32, 2, D, (uint64_t)N, 1, 1, 0.5f, keep, &nk);
    add(w, "v.post_ln.weight", QT_F32, 1, D, 1, 1, 1, 0, keep, &nk);
    add(w, "v.post_ln.bias", QT_F32, 1, D, 1, 1, 1, 0.1f, keep, &nk);
    add(w, "mm.model.fc.weight", QT_F16, 2, (uint64_t)D * SCALE * SCALE, PROJ, 1, 1, 0.02f, keep,
        &nk);
    static const char *mats[6] = {"attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down"};
    for (int l = 0; l < L; l++) {
        char n[64];
        for (int m = 0; m < 6; m++) {
            uint64_t rows = m == 4 ? F : D, cols = m == 5 ? F : D;
            snprintf(n, sizeof n, "v.blk.%d.%s.weight", l, mats[m]);
            add(w, n, QT_F16, 2, cols, rows, 1, 1, 0.06f, keep, &nk);
            snprintf(n, sizeof n, "v.blk.%d.%s.bias", l, mats[m]);
            add(w, n, QT_F32, 1, rows, 1, 1, 1, 0.1f, keep, &nk);
        }
        const char *ln[2] = {"ln1", "ln2"};
        for (int k = 0; k < 2; k++) {
            snprintf(n, sizeof n, "v.blk.%d.%s.weight", l, ln[k]);
            add(w, n, QT_F32, 1, D, 1, 1, 1, 0, keep, &nk);
            snprintf(n, sizeof n, "v.blk.%d.%s.bias", l, ln[k]);
            add(w, n, QT_F32, 1, D, 1, 1, 1, 0.1f, keep, &nk);
        }
    }
    if (gguf_writer_write(w, path, NULL) != CELLM_OK) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    gguf_writer_free(w);
    for (int i = 0; i < nk; i++) free(keep[i]);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 3;
    int configs = argc > 3 && !strcmp(argv[3], "--one-frame") ? 1 : 2;
    if (rounds < 1 || rounds > 64) rounds = 3;
    uint8_t *px = malloc(IMG * IMG * 3);
    for (int i = 0; i < IMG * IMG * 3; i++) px[i] = (uint8_t)(i * 7 + i / 1536);
    const uint32_t pre[2] = {512, 2048};
    for (int k = 0; k < configs; k++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/vision_encode_%d.gguf", (int)getpid());
        write_projector(path, pre[k]);
        cellm_mmproj_params mp = cellm_mmproj_default_params();
        mp.n_threads = threads;
        cellm_mmproj *mm;
        if (cellm_mmproj_load(path, NULL, &mp, &mm) != CELLM_OK) {
            fprintf(stderr, "%s\n", cellm_last_error());
            return 1;
        }
        double t[64];
        cellm_image_embed *e = NULL;
        int n = k ? 1 : rounds; /* 17 frames: one round */
        for (int r = 0; r < n; r++) {
            cellm_image_embed_free(e);
            double t0 = now();
            if (cellm_image_encode(mm, px, IMG, IMG, &e) != CELLM_OK) {
                fprintf(stderr, "%s\n", cellm_last_error());
                return 1;
            }
            t[r] = now() - t0;
        }
        qsort(t, (size_t)n, sizeof t[0], cmp);
        printf("preproc %4u: %2d frames, %4d tokens, %d threads: median %.2f s (min %.2f, max "
               "%.2f, %d rounds), %.2f s per frame\n",
               pre[k], e->n_frames, e->n_tokens, threads, t[n / 2], t[0], t[n - 1], n,
               t[n / 2] / e->n_frames);
        cellm_image_embed_free(e);
        cellm_mmproj_free(mm);
        unlink(path);
    }
    free(px);
    return 0;
}
