/*
 * vision_api.c — cellm.h's image entry points: a projector file beside a
 * text model, and pictures (RGB8) into the embeddings of their image
 * tokens, through image.c (frames) and vision.c (encoder and connector).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "format/image.h"
#include "model/model.h"
#include "base/threadpool.h"
#include "cpu/vision.h"

struct cellm_mmproj {
    vision_model *vm;
    threadpool *tp;
    pthread_mutex_t mu; /* one encode at a time on tp */
};

cellm_mmproj_params cellm_mmproj_default_params(void) {
    return (cellm_mmproj_params){.n_threads = 2};
}

static cellm_status fail(const cellm_error *err) {
    return engine_fail(err->code, err->msg);
}

cellm_status cellm_mmproj_load(const char *path, const cellm_model *cm,
                               const cellm_mmproj_params *params, cellm_mmproj **out) {
    if (!out) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_mmproj_load: out is NULL");
    *out = NULL;
    if (!path) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_mmproj_load: path is NULL");
    cellm_mmproj_params p = params ? *params : cellm_mmproj_default_params();
    if (p.n_threads < 0 || p.n_threads > 256)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_mmproj_load: n_threads out of range");
    cellm_error err;
    err_clear(&err);
    cellm_mmproj *mm = calloc(1, sizeof *mm);
    if (!mm) return engine_fail(CELLM_ERR_NO_MEMORY, "out of memory");
    if (vision_load(path, &mm->vm, &err) ||
        tp_create(p.n_threads ? p.n_threads : 2, &mm->tp, &err)) {
        vision_free(mm->vm);
        free(mm);
        return fail(&err);
    }
    if (cm && mm->vm->proj_dim != cm->m->n_embd) {
        err_set(&err, CELLM_ERR_INVALID_ARG,
                "projector %s makes embeddings of width %d, but the model's are %d wide: it "
                "belongs to another model",
                path, mm->vm->proj_dim, cm->m->n_embd);
        tp_destroy(mm->tp);
        vision_free(mm->vm);
        free(mm);
        return fail(&err);
    }
    pthread_mutex_init(&mm->mu, NULL);
    *out = mm;
    return CELLM_OK;
}

void cellm_mmproj_free(cellm_mmproj *mm) {
    if (!mm) return;
    pthread_mutex_destroy(&mm->mu);
    tp_destroy(mm->tp);
    vision_free(mm->vm);
    free(mm);
}

void cellm_image_embed_free(cellm_image_embed *e) {
    if (!e) return;
    free(e->embd);
    free(e);
}

cellm_status cellm_image_encode(cellm_mmproj *mm, const uint8_t *pixels, int32_t width,
                                int32_t height, cellm_image_embed **out) {
    if (!out) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_image_encode: out is NULL");
    *out = NULL;
    if (!mm || !pixels)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_image_encode: a NULL argument");
    cellm_error err;
    err_clear(&err);
    image_frames fr;
    if (image_preprocess(pixels, width, height, &mm->vm->pre, &fr, &err)) return fail(&err);
    const vision_model *vm = mm->vm;
    cellm_image_embed *e = calloc(1, sizeof *e);
    size_t n_tokens = (size_t)fr.n_frames * (size_t)vm->n_tokens;
    if (e) e->embd = malloc(n_tokens * (size_t)vm->proj_dim * sizeof *e->embd);
    if (!e || !e->embd) {
        cellm_image_embed_free(e);
        image_frames_free(&fr);
        return engine_fail(CELLM_ERR_NO_MEMORY, "cellm_image_encode: out of memory");
    }
    pthread_mutex_lock(&mm->mu);
    cellm_status st = vision_encode(vm, mm->tp, fr.pixels, fr.n_frames, NULL, e->embd, &err);
    pthread_mutex_unlock(&mm->mu);
    e->n_frames = fr.n_frames;
    e->rows = fr.rows;
    e->cols = fr.cols;
    e->tokens_per_frame = vm->n_tokens;
    e->n_tokens = (int32_t)n_tokens;
    e->n_embd = vm->proj_dim;
    image_frames_free(&fr);
    if (st) {
        cellm_image_embed_free(e);
        return fail(&err);
    }
    *out = e;
    return CELLM_OK;
}

/* Appends `s` to the buffer at *p (room checked by the caller's sizing). */
static char *put(char *p, const char *s) {
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

cellm_status cellm_image_prompt(const cellm_image_embed *e, char **text) {
    if (!text) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_image_prompt: text is NULL");
    *text = NULL;
    if (!e || e->rows < 0 || e->cols < 0 || e->tokens_per_frame < 1 ||
        e->n_frames != e->rows * e->cols + 1)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_image_prompt: not an encoded image");
    static const char fake[] = "<fake_token_around_image>", img[] = "<image>",
                      glob[] = "<global-img>";
    /* Per frame: the wrapper, a tag of at most 32 bytes, the image tokens,
     * a newline; then the global image's closing wrapper. */
    size_t per = sizeof fake + 32 + (size_t)e->tokens_per_frame * (sizeof img - 1) + 2;
    char *out = malloc((size_t)e->n_frames * per + sizeof fake + 1);
    if (!out) return engine_fail(CELLM_ERR_NO_MEMORY, "cellm_image_prompt: out of memory");
    char *p = out, tag[40];
    for (int32_t r = 0; r < e->rows; r++) {
        for (int32_t c = 0; c < e->cols; c++) {
            snprintf(tag, sizeof tag, "<row_%d_col_%d>", (int)r + 1, (int)c + 1);
            p = put(put(p, fake), tag);
            for (int32_t t = 0; t < e->tokens_per_frame; t++) p = put(p, img);
        }
        p = put(p, "\n");
    }
    if (e->rows) p = put(p, "\n");
    p = put(put(p, fake), glob);
    for (int32_t t = 0; t < e->tokens_per_frame; t++) p = put(p, img);
    p = put(p, fake);
    *p = '\0';
    *text = out;
    return CELLM_OK;
}
