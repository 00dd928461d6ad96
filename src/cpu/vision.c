/*
 * vision.c — the projector file (llama.cpp's mmproj layout) and the SigLIP
 * encoder plus Idefics3 connector that run it (see vision.h). One frame at
 * a time: its patches are the rows of one batch through every layer.
 */
#include "cpu/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/matmul.h"
#include "format/quant.h"
#include "base/xmath.h"

#define MAX_VISION_LAYERS 256
#define MAX_VISION_WIDTH 16384

void vision_free(vision_model *vm) {
    if (!vm) return;
    free(vm->layers);
    free(vm->vecs);
    gguf_close(vm->f);
    free(vm);
}

static bool get_u32(const gguf_file *f, const char *key, int64_t lo, int64_t hi, int32_t *out) {
    int64_t v;
    if (!gguf_get_int(f, key, &v) || v < lo || v > hi) return false;
    *out = (int32_t)v;
    return true;
}

/* Loading state: where the next dequantized vector goes. */
typedef struct loader {
    vision_model *vm;
    size_t used, cap;
    cellm_error *err;
} loader;

/* Tensor `name` with exactly the shape ne[0..n_dims) (innermost first). */
static const gguf_tensor *need(loader *l, const char *name, uint32_t n_dims, const int64_t *ne) {
    const gguf_tensor *t = gguf_find_tensor(l->vm->f, name);
    if (!t) {
        err_set(l->err, CELLM_ERR_FORMAT, "projector: tensor '%s' is missing", name);
        return NULL;
    }
    uint64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++) n *= (uint64_t)ne[i];
    bool ok = t->n_elems == n && t->ne[0] == (uint64_t)ne[0];
    for (uint32_t i = 1; ok && i < n_dims; i++) ok = t->ne[i] == (uint64_t)ne[i];
    if (!ok) {
        char want[96] = "", got[96] = "";
        for (uint32_t i = 0; i < n_dims; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? " x " : "",
                     (long long)ne[i]);
        for (uint32_t i = 0; i < t->n_dims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? " x " : "",
                     (unsigned long long)t->ne[i]);
        err_set(l->err, CELLM_ERR_FORMAT, "projector: tensor '%s' is %s, expected %s", name, got,
                want);
        return NULL;
    }
    const quant_type_info *qi = quant_type_get(t->type);
    if (!qi || !qi->to_float) {
        err_set(l->err, CELLM_ERR_UNSUPPORTED, "projector: tensor '%s' has type %u", name, t->type);
        return NULL;
    }
    return t;
}

/* A matrix of `rows` x `cols` that matmul() can run. */
static const gguf_tensor *need_matrix(loader *l, const char *name, int64_t rows, int64_t cols) {
    int64_t ne[2] = {cols, rows};
    const gguf_tensor *t = need(l, name, 2, ne);
    if (!t) return NULL;
    const quant_type_info *qi = quant_type_get(t->type);
    const quant_type_info *vi = qi->vec_dot ? quant_type_get(qi->vec_dot_type) : NULL;
    if (!vi || cols % qi->block_size || cols % vi->block_size) {
        err_set(l->err, CELLM_ERR_UNSUPPORTED,
                "projector: tensor '%s' of type %s cannot be multiplied (%lld columns)", name,
                qi->name, (long long)cols);
        return NULL;
    }
    return t;
}

/* Vector `name` of n floats, dequantized into the model's vector buffer. */
static const float *need_vec(loader *l, const char *name, int64_t n) {
    const gguf_tensor *t = need(l, name, 1, &n);
    if (!t) return NULL;
    if (l->used + (size_t)n > l->cap) {
        err_set(l->err, CELLM_ERR_INTERNAL, "projector: vector buffer too small");
        return NULL;
    }
    float *dst = l->vm->vecs + l->used;
    quant_type_get(t->type)->to_float(t->data, dst, (size_t)n);
    l->used += (size_t)n;
    return dst;
}

static cellm_status read_hparams(vision_model *vm, cellm_error *err) {
    const gguf_file *f = vm->f;
    gguf_str s;
    if (!gguf_get_str(f, "general.architecture", &s) || !gguf_str_eq(s, "clip"))
        return err_set(err, CELLM_ERR_FORMAT,
                       "projector: general.architecture is not \"clip\" (is this a text model? "
                       "the projector is the mmproj file)");
    if (!gguf_get_str(f, "clip.projector_type", &s))
        return err_set(err, CELLM_ERR_FORMAT, "projector: clip.projector_type is missing");
    if (!gguf_str_eq(s, "idefics3"))
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "projector type '%.*s' is not supported (cellm runs idefics3: SmolVLM)",
                       (int)(s.len > 64 ? 64 : s.len), s.ptr);
    bool has = true;
    gguf_get_bool(f, "clip.has_vision_encoder", &has);
    if (!has) return err_set(err, CELLM_ERR_FORMAT, "projector: no vision encoder");
    if (!get_u32(f, "clip.vision.image_size", 1, IMAGE_MAX_EDGE, &vm->image_size) ||
        !get_u32(f, "clip.vision.patch_size", 1, IMAGE_MAX_EDGE, &vm->patch_size) ||
        !get_u32(f, "clip.vision.embedding_length", 1, MAX_VISION_WIDTH, &vm->n_embd) ||
        !get_u32(f, "clip.vision.feed_forward_length", 1, 4 * MAX_VISION_WIDTH, &vm->n_ff) ||
        !get_u32(f, "clip.vision.attention.head_count", 1, 1024, &vm->n_head) ||
        !get_u32(f, "clip.vision.block_count", 1, MAX_VISION_LAYERS, &vm->n_layer) ||
        !get_u32(f, "clip.vision.projection_dim", 1, 1 << 20, &vm->proj_dim) ||
        !get_u32(f, "clip.vision.projector.scale_factor", 1, 64, &vm->scale))
        return err_set(err, CELLM_ERR_FORMAT,
                       "projector: a clip.vision size (image_size, patch_size, embedding_length, "
                       "feed_forward_length, attention.head_count, block_count, projection_dim, "
                       "projector.scale_factor) is missing or out of range");
    int32_t side = vm->image_size / vm->patch_size;
    if (vm->image_size % vm->patch_size || side % vm->scale || vm->n_embd % vm->n_head)
        return err_set(err, CELLM_ERR_FORMAT,
                       "projector: image size %d, patch size %d, scale factor %d and %d heads of "
                       "width %d do not fit",
                       vm->image_size, vm->patch_size, vm->scale, vm->n_head, vm->n_embd);
    vm->n_patches = side * side;
    vm->n_tokens = vm->n_patches / (vm->scale * vm->scale);
    double eps = 1e-6;
    gguf_get_float(f, "clip.vision.attention.layer_norm_epsilon", &eps);
    if (!(eps > 0 && eps < 1)) return err_set(err, CELLM_ERR_FORMAT, "projector: epsilon %g", eps);
    vm->eps = (float)eps;
    image_params *p = &vm->pre;
    p->tile = vm->image_size;
    p->split = true;
    /* SmolVLM's processors resize the longest edge to 4 tiles when the
     * file does not say. */
    int32_t edge = 4 * vm->image_size;
    if (gguf_find_key(f, "clip.vision.preproc_image_size") &&
        !get_u32(f, "clip.vision.preproc_image_size", 1, IMAGE_MAX_EDGE, &edge))
        return err_set(err, CELLM_ERR_FORMAT, "projector: clip.vision.preproc_image_size");
    p->longest_edge = edge > IMAGE_MAX_EDGE ? IMAGE_MAX_EDGE : edge;
    const char *keys[2] = {"clip.vision.image_mean", "clip.vision.image_std"};
    for (int k = 0; k < 2; k++) {
        const gguf_value *a = gguf_get_arr(f, keys[k]);
        for (int c = 0; c < 3; c++) {
            double v = 0.5;
            if (a && (a->v.arr.n != 3 || !gguf_arr_get_float(a, (uint64_t)c, &v)))
                return err_set(err, CELLM_ERR_FORMAT, "projector: %s is not 3 numbers", keys[k]);
            if (!isfinite(v) || (k == 1 && !(v > 0)))
                return err_set(err, CELLM_ERR_FORMAT, "projector: %s[%d] = %g", keys[k], c, v);
            (k ? p->std : p->mean)[c] = (float)v;
        }
    }
    return CELLM_OK;
}

cellm_status vision_load(const char *path, vision_model **out, cellm_error *err) {
    *out = NULL;
    vision_model *vm = calloc(1, sizeof *vm);
    if (!vm) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    cellm_status st;
    if ((st = gguf_open(path, &vm->f, err)) || (st = read_hparams(vm, err))) goto fail;
    int64_t D = vm->n_embd, F = vm->n_ff, ps = vm->patch_size, N = vm->n_patches;
    loader l = {.vm = vm, .err = err};
    l.cap = (size_t)(N * D + 3 * D + (size_t)vm->n_layer * (9 * D + F));
    vm->vecs = malloc(l.cap * sizeof *vm->vecs);
    vm->layers = calloc((size_t)vm->n_layer, sizeof *vm->layers);
    if (!vm->vecs || !vm->layers) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    int64_t pne[4] = {ps, ps, 3, D}, posne[2] = {D, N};
    st = CELLM_ERR_FORMAT;
    const gguf_tensor *pos;
    if (!(vm->patch = need(&l, "v.patch_embd.weight", 4, pne)) ||
        !(vm->patch_b = need_vec(&l, "v.patch_embd.bias", D)) ||
        !(pos = need(&l, "v.position_embd.weight", 2, posne)) ||
        !(vm->post_w = need_vec(&l, "v.post_ln.weight", D)) ||
        !(vm->post_b = need_vec(&l, "v.post_ln.bias", D)) ||
        !(vm->fc = need_matrix(&l, "mm.model.fc.weight", vm->proj_dim, D * vm->scale * vm->scale)))
        goto fail_code;
    /* The patch embedding runs as a matrix of D rows of 3 * ps * ps. */
    const quant_type_info *pq = quant_type_get(vm->patch->type);
    if (!pq->vec_dot || (3 * ps * ps) % pq->block_size) {
        st = err_set(err, CELLM_ERR_UNSUPPORTED, "projector: v.patch_embd.weight of type %s",
                     pq->name);
        goto fail;
    }
    vm->pos = vm->vecs + l.used;
    pq = quant_type_get(pos->type);
    pq->to_float(pos->data, vm->vecs + l.used, (size_t)(N * D));
    l.used += (size_t)(N * D);
    for (int32_t i = 0; i < vm->n_layer; i++) {
        vision_layer *ly = &vm->layers[i];
        char n[64];
#define M(field, what, rows, cols)                                                                 \
    (snprintf(n, sizeof n, "v.blk.%d.%s.weight", i, what),                                         \
     (ly->field = need_matrix(&l, n, rows, cols)) != NULL)
#define V(field, what, suffix, len)                                                                \
    (snprintf(n, sizeof n, "v.blk.%d.%s.%s", i, what, suffix),                                     \
     (ly->field = need_vec(&l, n, len)) != NULL)
        if (!M(q, "attn_q", D, D) || !V(q_b, "attn_q", "bias", D) || !M(k, "attn_k", D, D) ||
            !V(k_b, "attn_k", "bias", D) || !M(v, "attn_v", D, D) || !V(v_b, "attn_v", "bias", D) ||
            !M(o, "attn_out", D, D) || !V(o_b, "attn_out", "bias", D) ||
            !V(ln1_w, "ln1", "weight", D) || !V(ln1_b, "ln1", "bias", D) ||
            !V(ln2_w, "ln2", "weight", D) || !V(ln2_b, "ln2", "bias", D) ||
            !M(up, "ffn_up", F, D) || !V(up_b, "ffn_up", "bias", F) || !M(down, "ffn_down", D, F) ||
            !V(down_b, "ffn_down", "bias", D))
            goto fail_code;
#undef M
#undef V
    }
    /* matmul's scratch for the largest input: N rows of max(D, F, 3 ps^2),
     * and the connector's N / s^2 rows of D s^2. */
    size_t sc = 0, s;
    for (int32_t i = 0; i < vm->n_layer; i++) {
        const vision_layer *ly = &vm->layers[i];
        const gguf_tensor *all[6] = {ly->q, ly->k, ly->v, ly->o, ly->up, ly->down};
        for (int j = 0; j < 6; j++) {
            int64_t k = all[j] == ly->down ? F : D;
            if ((s = matmul_scratch_size(all[j]->type, k, N)) > sc) sc = s;
        }
    }
    if ((s = matmul_scratch_size(vm->patch->type, 3 * ps * ps, N)) > sc) sc = s;
    if ((s = matmul_scratch_size(vm->fc->type, D * vm->scale * vm->scale, vm->n_tokens)) > sc)
        sc = s;
    vm->scratch_bytes = sc;
    *out = vm;
    return CELLM_OK;
fail_code:
    st = err ? err->code : CELLM_ERR_FORMAT;
fail:
    vision_free(vm);
    return st;
}

/* ---- the encoder ---- */

static void layer_norm(float *x, int64_t rows, int64_t d, const float *w, const float *b, float eps,
                       float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *o = out + r * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++) mean += xr[i];
        mean /= (double)d;
        for (int64_t i = 0; i < d; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        var /= (double)d;
        float inv = (float)(1.0 / sqrt(var + (double)eps));
        for (int64_t i = 0; i < d; i++) o[i] = ((float)(xr[i] - mean) * inv) * w[i] + b[i];
    }
}

static void add_bias(float *x, int64_t rows, int64_t d, const float *b) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < d; i++) x[r * d + i] += b[i];
}

static float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + xm_tanhf(c * (x + 0.044715f * x * x * x)));
}

/* The per-row steps, split by rows across the pool: LayerNorm of x into
 * out (w, b), or GELU in place (w NULL). */
typedef struct rows_task {
    float *x, *out;
    const float *w, *b;
    int64_t rows, d;
    float eps;
} rows_task;

static void rows_run(void *arg, int ith, int nth) {
    const rows_task *t = arg;
    long begin, end;
    tp_split((long)t->rows, ith, nth, &begin, &end);
    if (t->w) {
        layer_norm(t->x + begin * t->d, end - begin, t->d, t->w, t->b, t->eps,
                   t->out + begin * t->d);
        return;
    }
    for (size_t i = (size_t)(begin * t->d); i < (size_t)(end * t->d); i++)
        t->x[i] = gelu_tanh(t->x[i]);
}

static void norm_rows(threadpool *tp, float *x, int64_t rows, int64_t d, const float *w,
                      const float *b, float eps, float *out) {
    rows_task t = {x, out, w, b, rows, d, eps};
    tp_run(tp, rows_run, &t);
}

/* Full (unmasked) multi-head attention of one frame's patches. */
typedef struct attn_task {
    const float *q, *kt, *v; /* kt: K transposed, d rows of n (head h: rows h * hd ...) */
    float *out, *scores;     /* scores: a row of N per thread */
    int64_t n, d, n_head, hd;
} attn_task;

static void attn_run(void *arg, int ith, int nth) {
    const attn_task *a = arg;
    long begin, end;
    tp_split((long)(a->n * a->n_head), ith, nth, &begin, &end);
    float *sc = a->scores + (size_t)ith * (size_t)a->n;
    float scale = 1.0f / sqrtf((float)a->hd);
    for (long job = begin; job < end; job++) {
        int64_t i = job / a->n_head, h = job % a->n_head;
        const float *qi = a->q + i * a->d + h * a->hd;
        /* Every key's score at once, one dimension at a time: each sum
         * still adds its products in dimension order, and the inner loop
         * runs along the keys, which the compiler vectorises. */
        memset(sc, 0, (size_t)a->n * sizeof *sc);
        for (int64_t t = 0; t < a->hd; t++) {
            const float *kt = a->kt + (h * a->hd + t) * a->n;
            float qt = qi[t];
            for (int64_t j = 0; j < a->n; j++) sc[j] += qt * kt[j];
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < a->n; j++) {
            sc[j] *= scale;
            if (sc[j] > mx) mx = sc[j];
        }
        double sum = 0;
        for (int64_t j = 0; j < a->n; j++) sum += (sc[j] = xm_expf(sc[j] - mx));
        float inv = (float)(1.0 / sum);
        float *o = a->out + i * a->d + h * a->hd;
        memset(o, 0, (size_t)a->hd * sizeof *o);
        for (int64_t j = 0; j < a->n; j++) {
            const float *vj = a->v + j * a->d + h * a->hd;
            float p = sc[j] * inv;
            for (int64_t t = 0; t < a->hd; t++) o[t] += p * vj[t];
        }
    }
}

cellm_status vision_encode(const vision_model *vm, threadpool *tp, const float *pixels,
                           int32_t n_frames, float *enc, float *out, cellm_error *err) {
    int64_t D = vm->n_embd, F = vm->n_ff, N = vm->n_patches, ps = vm->patch_size,
            side = vm->image_size / ps, K = 3 * ps * ps, s = vm->scale, T = vm->n_tokens;
    int nth = tp_threads(tp);
    size_t nd = (size_t)(N * D);
    size_t total = nd * 6 + (size_t)(N * (F > K ? F : K)) + (size_t)nth * (size_t)N;
    float *buf = malloc(total * sizeof *buf);
    void *scratch = malloc(vm->scratch_bytes ? vm->scratch_bytes : 1);
    if (!buf || !scratch) {
        free(buf);
        free(scratch);
        return err_set(err, CELLM_ERR_NO_MEMORY, "image encoder: out of memory (%zu floats)",
                       total);
    }
    float *x = buf, *h = x + nd, *q = h + nd, *k = q + nd, *v = k + nd, *a = v + nd, *wide = a + nd,
          *scores = wide + (size_t)(N * (F > K ? F : K));
    size_t plane = (size_t)(vm->image_size * vm->image_size);
    for (int32_t fr = 0; fr < n_frames; fr++) {
        const float *px = pixels + (size_t)fr * 3 * plane;
        /* Patches as rows of (channel, y, x), the convolution's order. */
        for (int64_t p = 0; p < N; p++) {
            int64_t py = p / side, pxx = p % side;
            float *row = wide + p * K;
            for (int64_t c = 0; c < 3; c++)
                for (int64_t ky = 0; ky < ps; ky++)
                    memcpy(row + (c * ps + ky) * ps,
                           px + c * plane + (size_t)((py * ps + ky) * vm->image_size + pxx * ps),
                           (size_t)ps * sizeof *row);
        }
        matmul(tp, vm->patch->data, vm->patch->type, D, K, wide, N, x, scratch);
        add_bias(x, N, D, vm->patch_b);
        for (size_t i = 0; i < nd; i++) x[i] += vm->pos[i];
        for (int32_t il = 0; il < vm->n_layer; il++) {
            const vision_layer *ly = &vm->layers[il];
            norm_rows(tp, x, N, D, ly->ln1_w, ly->ln1_b, vm->eps, h);
            matmul_job jobs[3] = {{ly->q->data, ly->q->type, D, q},
                                  {ly->k->data, ly->k->type, D, k},
                                  {ly->v->data, ly->v->type, D, v}};
            matmul_multi(tp, jobs, 3, D, h, N, scratch, false, NULL);
            add_bias(q, N, D, ly->q_b);
            add_bias(k, N, D, ly->k_b);
            add_bias(v, N, D, ly->v_b);
            /* K transposed into h (free until the output projection). */
            for (int64_t j = 0; j < N; j++)
                for (int64_t c = 0; c < D; c++) h[c * N + j] = k[j * D + c];
            attn_task at = {q, h, v, a, scores, N, D, vm->n_head, D / vm->n_head};
            tp_run(tp, attn_run, &at);
            matmul(tp, ly->o->data, ly->o->type, D, D, a, N, h, scratch);
            add_bias(h, N, D, ly->o_b);
            for (size_t i = 0; i < nd; i++) x[i] += h[i];
            norm_rows(tp, x, N, D, ly->ln2_w, ly->ln2_b, vm->eps, h);
            matmul(tp, ly->up->data, ly->up->type, F, D, h, N, wide, scratch);
            add_bias(wide, N, F, ly->up_b);
            norm_rows(tp, wide, N, F, NULL, NULL, 0, NULL); /* GELU */
            matmul(tp, ly->down->data, ly->down->type, D, F, wide, N, h, scratch);
            add_bias(h, N, D, ly->down_b);
            for (size_t i = 0; i < nd; i++) x[i] += h[i];
        }
        norm_rows(tp, x, N, D, vm->post_w, vm->post_b, vm->eps, h);
        if (enc) memcpy(enc + (size_t)fr * nd, h, nd * sizeof *h);
        /* Pixel shuffle: token (ty, tx) joins the s x s patches below and
         * right of (ty s, tx s), row by row, each D wide. */
        int64_t ts = side / s;
        for (int64_t ty = 0; ty < ts; ty++)
            for (int64_t tx = 0; tx < ts; tx++)
                for (int64_t i = 0; i < s; i++)
                    for (int64_t j = 0; j < s; j++)
                        memcpy(q + ((ty * ts + tx) * s * s + i * s + j) * D,
                               h + ((ty * s + i) * side + tx * s + j) * D, (size_t)D * sizeof *q);
        matmul(tp, vm->fc->data, vm->fc->type, vm->proj_dim, D * s * s, q, T,
               out + (size_t)fr * (size_t)(T * vm->proj_dim), scratch);
    }
    free(buf);
    free(scratch);
    return CELLM_OK;
}
