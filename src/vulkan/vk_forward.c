/*
 * vk_forward.c — the Vulkan backend's forward pass (model/backend.h): the
 * same pass as cpu/forward.c, recorded as one command buffer per step.
 *
 * At creation the weights the pass reads are uploaded once, each tensor
 * into a device buffer of its own, straight from the GGUF map. The KV pool
 * gets one device buffer per KV group, holding the blocks of the cache's
 * tables (same ids, the same rows as f16) but laid out layer by layer: a
 * slice per layer of the group, holding every block's part of that layer
 * (16 K rows then 16 V rows: the CPU's layer_bytes). A dispatch binds one
 * layer's slice, so no binding spans the pool (devices bind as little as
 * 128 MiB at once: lavapipe, many phones). The cache's copy-on-write comes
 * here (kv_storage) and is done on the device, slice by slice. Activation
 * buffers are sized for the largest batch.
 *
 * A step: the host checks the batch and reserves its blocks (batch.h),
 * then writes what only it knows into mapped upload buffers: each row's
 * input (its token's embedding, dequantized on the host, or an image's
 * row), its position and where its sequence's block table starts, the
 * block tables themselves, and the RoPE angles of each row
 * (model_rope_angles, the CPU's bits). One recording then holds the block
 * copies and every layer:
 *   rmsnorm → Q, K, V matmuls → qk_prep (bias, QK-norm, RoPE, K/V into
 *   the cache) → attention → output matmul → (post-norm) → residual →
 *   rmsnorm → gate, up matmuls → act → down matmul → (post-norm) → residual
 * then the final norm of the rows that want logits, the classifier and
 * its scale and soft-cap, and a copy of the logits into a readback buffer
 * (or, for run_top, top.comp's 8 best of each row and a copy of those).
 * It is submitted once and waited on once; only the logits come back.
 *
 * What it does not run yet (creation says so, and AUTO falls back to the
 * CPU): mixtures of experts, short-convolution layers, QK-norm across all
 * heads, KV types other than f16, and weight types vk_matmul lacks.
 */
#include "vulkan/vk_forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/quant.h"
#include "model/batch.h"
#include "vulkan/vk_matmul.h"
#include "vulkan/vk_shaders.h"

/* A weight on the device (buf NULL: the model has none there). */
typedef struct vweight {
    vk_buffer *buf;
    uint32_t type;
    uint32_t rows, cols;
} vweight;

typedef struct vlayer {
    vweight attn_norm, wq, wk, wv, wo, post_attn_norm;
    vweight ffn_norm, w_gate, w_up, w_down, post_ffn_norm;
    vk_buffer *bias;    /* bq | bk | bv, or NULL */
    vk_buffer *qk_norm; /* q_norm | k_norm (per head), or NULL */
    uint32_t rope_cfg;  /* which of a row's RoPE angle sets */
} vlayer;

/* A copy-on-write the cache asked for, done at the start of the next
 * recording. */
typedef struct blk_copy {
    int32_t group, dst, src;
} blk_copy;

/* What a profiled step's stages are (CELLM_VK_PROFILE=1): each barrier
 * marks the end of one, and the GPU time since the mark before goes to
 * its kind. */
enum {
    P_INPUT,
    P_NORM,
    P_QKV,
    P_QK_PREP,
    P_ATTENTION,
    P_WO,
    P_RESIDUAL,
    P_GATE_UP,
    P_ACT,
    P_DOWN,
    P_HEAD,
    P_KINDS
};
static const char *const P_NAMES[P_KINDS] = {"copies, input", "rmsnorm",     "Q, K, V matmuls",
                                             "qk_prep",       "attention",   "output matmul",
                                             "residual",      "gate, up",    "act",
                                             "down matmul",   "head, logits"};

typedef struct vk_profile {
    bool on;
    long steps, rows;
    double gpu_ns[P_KINDS], gpu_total_ns;
    long stages[P_KINDS];
    double host_fill_ns, host_record_ns, host_submit_ns;
    /* The engine's own time from one pass's end to the next's start
     * (sampling, scheduling), over the gaps of under 50 ms (longer ones are
     * idle time), and the gaps counted. */
    double between_ns, last_end_ns;
    long gaps;
} vk_profile;

/* The RoPE settings the layers use (gemma3: its local and global layers). */
#define MAX_ROPE_CFG 4

typedef struct vkf {
    const model *m;
    kv_cache *kv;
    /* Partial offload: layers [0, layer0) run elsewhere (lower), which
     * hands the residual stream to the device's first layer and keeps
     * their KV, the first kv_first[g] layers of each group's blocks.
     * layer0 0: every layer is on the device. */
    vk_lower lower;
    int32_t layer0;
    int32_t kv_first[2];
    const float **lower_rows; /* [max_rows]: row r's input, lower's residual stream */
    vk_device *dev;
    vk_recorder *rec;
    int32_t max_rows, max_logit_rows;
    vlayer *layers;
    vweight out_norm, output;
    /* Every weight buffer, to free. */
    vk_buffer **owned;
    int32_t n_owned, cap_owned;
    vk_buffer *kvbuf[2];
    size_t kv_slice[2]; /* bytes of a layer's slice of each group, 256-aligned */
    /* Activations. */
    vk_buffer *x, *xb, *q, *k, *v, *att, *hb, *hb2, *mo, *logits;
    bool lane_mm; /* the device takes matmul's lane variant: act is a dispatch */
    /* Written by the host each step (mapped). */
    vk_buffer *in_x, *rowinfo, *tables, *rope, *lidx;
    vk_buffer *readback;
    /* The top rows' K best logits (top.comp: its partial lists, its
     * output) and their readback. */
    vk_buffer *top_part, *top, *top_rb;
    float *host_x;      /* [max_rows][n_embd], staging for in_x */
    int32_t *host_info; /* [max_rows][4] */
    int32_t *host_tab;  /* block table words */
    float *host_rope;   /* [max_rows][n_rope_cfg][pairs][2] */
    /* Each position's row of host_rope as computed once (rope_at): the
     * first rope_cap positions, rope_cached of them so far. */
    float *rope_cache;
    int32_t rope_cap, rope_cached;
    int32_t *host_lidx;
    size_t tab_cap; /* ints in `tables` */
    float rope_base[MAX_ROPE_CFG], rope_scale[MAX_ROPE_CFG];
    int32_t n_rope_cfg;
    blk_copy *copies;
    int32_t n_copies, cap_copies;
    bool copy_overflow;
    cellm_error copy_err;
    vk_profile prof;
    /* The recorder holds a step of replay_n rows, replay_nl of them with
     * logits, and no block copies: a step of that shape submits it again
     * (CELLM_VK_REPLAY=0: record every step). */
    bool replay_ok, replay_off;
    int32_t replay_n, replay_nl;
    uint32_t replay_fused;
    bool replay_top;
    /* 1: every row of this step is its sequence's only one (decode):
     * attention does qk_prep's work itself. */
    uint32_t step_fused;
    bool fuse_off; /* CELLM_VK_FUSED=0: qk_prep always a dispatch (comparison) */
} vkf;

/* ------------------------------------------------------------ creation */

static cellm_status own(vkf *f, vk_buffer *b, cellm_error *err) {
    if (f->n_owned == f->cap_owned) {
        int32_t cap = f->cap_owned ? 2 * f->cap_owned : 64;
        vk_buffer **n = realloc(f->owned, (size_t)cap * sizeof *n);
        if (!n) {
            vk_buffer_free(b);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        }
        f->owned = n;
        f->cap_owned = cap;
    }
    f->owned[f->n_owned++] = b;
    return CELLM_OK;
}

/* Bytes of a weight as the file stores it. */
static size_t weight_bytes(const weight *w) {
    uint64_t n = 0;
    quant_nbytes(w->type, (uint64_t)w->ne0 * (uint64_t)w->ne1, &n);
    return (size_t)n;
}

/* A device buffer holding `bytes` from host memory. */
static cellm_status upload_new(vkf *f, const void *src, size_t bytes, vk_buffer **out,
                               cellm_error *err) {
    vk_buffer *b;
    cellm_status st = vk_buffer_create(f->dev, bytes, VK_BUF_DEVICE, &b, err);
    if (st) return st;
    if ((st = own(f, b, err))) return st;
    if ((st = vk_buffer_upload(b, 0, src, bytes, err))) return st;
    *out = b;
    return CELLM_OK;
}

/* Uploads a weight (none when w has no data). The token embedding itself
 * stays on the host (fill_inputs dequantizes rows there), so a classifier
 * tied to it is uploaded once, as the classifier. */
static cellm_status upload_weight(vkf *f, const weight *w, vweight *out, cellm_error *err) {
    memset(out, 0, sizeof *out);
    if (!w->data) return CELLM_OK;
    out->type = w->type;
    out->rows = (uint32_t)w->ne1;
    out->cols = (uint32_t)w->ne0;
    return upload_new(f, w->data, weight_bytes(w), &out->buf, err);
}

/* Two or three small f32 tensors side by side in one buffer (biases,
 * norms); NULL when the first has no data. */
static cellm_status upload_concat(vkf *f, const weight *const *w, int n, vk_buffer **out,
                                  cellm_error *err) {
    *out = NULL;
    if (!w[0]->data) return CELLM_OK;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += weight_bytes(w[i]);
    uint8_t *tmp = malloc(total);
    if (!tmp) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        memcpy(tmp + at, w[i]->data, weight_bytes(w[i]));
        at += weight_bytes(w[i]);
    }
    cellm_status st = upload_new(f, tmp, total, out, err);
    free(tmp);
    return st;
}

/* Why the backend cannot run `m` with this cache; NULL when it can. */
static const char *cannot_run(const model *m, const kv_cache *kv, int32_t layer0, char *msg,
                              size_t cap) {
    if (m->n_expert) return "mixture-of-experts layers are not in the Vulkan backend yet";
    if (m->n_conv_layers) return "short-convolution layers are not in the Vulkan backend yet";
    if (kv->type != CELLM_KV_F16) return "the Vulkan backend keeps its KV cache as f16 only";
    if (m->head_dim > 512 || m->head_dim_v > 512 || m->head_dim % 2 || m->head_dim_v % 2)
        return "head sizes past 512, or odd, are not in the Vulkan backend";
    if (m->n_head % m->n_head_kv) return "query heads must be a multiple of the KV heads";
    if (m->n_embd > 4096) return "models wider than 4096 are not in the Vulkan backend yet";
    if (!vk_matmul_supports(m->output.type)) {
        snprintf(msg, cap, "the Vulkan backend has no matmul for %s weights (the classifier)",
                 quant_type_get(m->output.type)->name);
        return msg;
    }
    for (int32_t il = layer0; il < m->n_layer; il++) {
        const layer_desc *L = &m->layers[il];
        if (L->qk_norm_full) return "QK-norm across all heads is not in the Vulkan backend yet";
        const weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (!vk_matmul_supports(ws[i]->type)) {
                snprintf(msg, cap, "the Vulkan backend has no matmul for %s weights (layer %d)",
                         quant_type_get(ws[i]->type)->name, (int)il);
                return msg;
            }
        const weight *f32s[] = {&L->attn_norm,     &L->ffn_norm, &L->post_attn_norm,
                                &L->post_ffn_norm, &L->bq,       &L->q_norm};
        for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++)
            if (f32s[i]->data && f32s[i]->type != QT_F32) return "norms and biases must be F32";
    }
    if (m->out_norm.type != QT_F32) return "norms and biases must be F32";
    return NULL;
}

/* kv_storage.copy: a copy-on-write, done at the start of the next
 * recording (before anything the pass writes); the layers below the
 * device's are lower's to copy, now. */
static void kv_copy(void *user, int32_t group, int32_t dst, int32_t src) {
    vkf *f = user;
    if (f->kv_first[group]) f->lower.copy(f->lower.user, group, dst, src, f->kv_first[group]);
    if (f->kv_first[group] == f->kv->groups[group].n_layers) return;
    if (f->n_copies == f->cap_copies) {
        f->copy_overflow = true; /* cannot happen: the cap covers a batch's */
        return;
    }
    f->copies[f->n_copies++] = (blk_copy){group, dst, src};
}

/* Prints the profile of every step so far to stderr, per step. */
static void profile_print(const vkf *f) {
    const vk_profile *p = &f->prof;
    if (!p->on || !p->steps) return;
    double st = (double)p->steps;
    fprintf(stderr,
            "vulkan profile: %ld steps, %.1f rows a step; per step: GPU %.1f us, host: inputs "
            "%.1f us, recording %.1f us, submit and wait %.1f us\n",
            p->steps, (double)p->rows / st, p->gpu_total_ns / st / 1e3, p->host_fill_ns / st / 1e3,
            p->host_record_ns / st / 1e3, p->host_submit_ns / st / 1e3);
    if (p->gaps)
        fprintf(stderr, "  the engine between passes (sampling, scheduling): %.1f us a step\n",
                p->between_ns / (double)p->gaps / 1e3);
    for (int k = 0; k < P_KINDS; k++)
        if (p->stages[k])
            fprintf(stderr, "  %-16s %8.1f us  %5.1f%%  %5.1f stages, %.2f us each\n", P_NAMES[k],
                    p->gpu_ns[k] / st / 1e3,
                    p->gpu_total_ns > 0 ? 100.0 * p->gpu_ns[k] / p->gpu_total_ns : 0.0,
                    (double)p->stages[k] / st, p->gpu_ns[k] / (double)p->stages[k] / 1e3);
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Adds a finished step to the profile: host times from t0 (start), t1
 * (inputs written), t2 (recorded) to now, GPU times from the marks; what
 * follows the last mark (the logits' copy) goes to the head. */
static void profile_step(vkf *f, int32_t n, double t0, double t1, double t2) {
    vk_profile *p = &f->prof;
    double t3 = now_ns(), gpu = vk_recorder_gpu_ns(f->rec);
    p->steps++;
    p->rows += n;
    p->host_fill_ns += t1 - t0;
    p->host_record_ns += t2 - t1;
    p->host_submit_ns += t3 - t2;
    if (p->last_end_ns > 0 && t0 - p->last_end_ns < 50e6) {
        p->between_ns += t0 - p->last_end_ns;
        p->gaps++;
    }
    p->last_end_ns = t3;
    const uint32_t *tags;
    const double *ns;
    uint32_t nm = vk_recorder_marks(f->rec, &tags, &ns);
    if (gpu < 0 || nm == 0) return;
    p->gpu_total_ns += gpu;
    double prev = 0;
    for (uint32_t i = 0; i < nm; i++) {
        if (tags[i] >= P_KINDS) continue;
        p->gpu_ns[tags[i]] += ns[i] - prev;
        p->stages[tags[i]]++;
        prev = ns[i];
    }
    if (gpu > prev) p->gpu_ns[P_HEAD] += gpu - prev;
}

static void vkf_free(void *impl) {
    vkf *f = impl;
    if (!f) return;
    profile_print(f);
    if (f->kv && f->kv->ext.user == f) f->kv->ext = (kv_storage){0};
    vk_device_close(f->dev); /* frees every buffer, the recorder, the pipelines */
    if (f->lower.free) f->lower.free(f->lower.user);
    free(f->lower_rows);
    free(f->owned);
    free(f->layers);
    free(f->host_x);
    free(f->host_info);
    free(f->host_tab);
    free(f->host_rope);
    free(f->rope_cache);
    free(f->host_lidx);
    free(f->copies);
    free(f);
}

static cellm_status make_buf(vkf *f, size_t bytes, vk_buffer_kind kind, vk_buffer **out,
                             cellm_error *err) {
    cellm_status st = vk_buffer_create(f->dev, bytes ? bytes : 4, kind, out, err);
    if (st) return st;
    return own(f, *out, err);
}

static int32_t max_i32(int32_t a, int32_t b) {
    return a > b ? a : b;
}

static cellm_status vkf_run(void *impl, const fwd_row *rows, const float *const *embd, int32_t n,
                            const float **logits, cellm_error *err);
static cellm_status vkf_run_top(void *impl, const fwd_row *rows, const float *const *embd,
                                int32_t n, const fwd_top **top, cellm_error *err);

/* Makes the pipelines a pass uses now rather than on first use, where the
 * driver's compiler would add tens of milliseconds to a first request's
 * time to first token (and to the first batch of a new size). A CPU
 * emulation compiles each for a second, and the tests open many engines:
 * it keeps compiling on first use. */
static cellm_status prepare_pipelines(vkf *f, cellm_error *err) {
    if (vk_device_get_info(f->dev)->type == VK_TYPE_CPU) return CELLM_OK;
    const model *m = f->m;
    uint32_t act = m->act == ACT_GELU_TANH;
    cellm_status st = vk_matmul_prepare(f->dev, f->output.type, f->output.cols, false, 0, err);
    for (int32_t il = f->layer0; il < m->n_layer && !st; il++) {
        const vlayer *V = &f->layers[il];
        const vweight *ws[] = {&V->wq, &V->wk, &V->wv, &V->wo, &V->w_gate, &V->w_up, &V->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0] && !st; i++)
            st = vk_matmul_prepare(f->dev, ws[i]->type, ws[i]->cols, false, 0, err); /* once each */
        if (!st) st = vk_matmul_prepare(f->dev, V->w_down.type, V->w_down.cols, true, act, err);
    }
    const vk_shader_id others[] = {
        VK_SHADER_RMSNORM,           VK_SHADER_ADD_NORM, VK_SHADER_QK_PREP, VK_SHADER_ATTENTION,
        VK_SHADER_ATTENTION_PREFILL, VK_SHADER_LOGITS,   VK_SHADER_TOP};
    for (size_t i = 0; i < sizeof others / sizeof others[0] && !st; i++) {
        const vk_pipeline *pipe;
        st = vk_pipeline_get(f->dev, others[i], &pipe, err);
    }
    return st;
}

static const backend_ops vk_ops = {"vulkan", vkf_run, vkf_free, vkf_run_top};

/* Per KV group, how many of its layers lie below layer0 (a block's first
 * slices: kv_cache.h lays a block out layer by layer). */
static void kv_layers_below(const model *m, int32_t layer0, int32_t first[2]) {
    first[0] = first[1] = 0;
    for (int32_t il = 0; il < layer0; il++) first[m->layers[il].kv_group]++;
}

/* The bytes of a weight when it has data. */
static size_t data_bytes(const weight *w) {
    return w->data ? weight_bytes(w) : 0;
}

uint64_t vk_backend_bytes(const model *m, const kv_cache *kv, int32_t layer0, int32_t max_rows,
                          int32_t max_logit_rows) {
    if (layer0 < 0) layer0 = 0;
    uint64_t n = data_bytes(&m->out_norm) + data_bytes(&m->output);
    for (int32_t il = layer0; il < m->n_layer; il++) {
        const layer_desc *L = &m->layers[il];
        const weight *ws[] = {&L->attn_norm,      &L->wq,       &L->wk,     &L->wv,   &L->wo,
                              &L->post_attn_norm, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down,
                              &L->post_ffn_norm,  &L->bq,       &L->bk,     &L->bv,   &L->q_norm,
                              &L->k_norm};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) n += data_bytes(ws[i]);
    }
    int32_t first[2];
    kv_layers_below(m, layer0, first);
    for (int32_t g = 0; g < kv->n_groups; g++) {
        const kv_group *kg = &kv->groups[g];
        uint64_t slice = ((uint64_t)kg->n_blocks * kg->layer_bytes + 255) / 256 * 256;
        n += slice * (uint64_t)(kg->n_layers - first[g]);
    }
    /* Activations (as vk_backend makes them, rounded up): about a dozen
     * rows of the widest vector per batch row, and the logits twice. */
    uint64_t wide = (uint64_t)max_i32(max_i32(m->n_embd, m->n_ff),
                                      max_i32(m->n_head * m->head_dim, m->n_head * m->head_dim_v));
    n += (uint64_t)max_rows * wide * 12 * sizeof(float);
    n += (uint64_t)max_logit_rows * (uint64_t)m->n_vocab * 2 * sizeof(float);
    return n;
}

cellm_status vk_backend(bool gpu_only, const model *m, kv_cache *kv, const vk_lower *lower,
                        int32_t max_rows, int32_t max_logit_rows, backend *out, cellm_error *err) {
    *out = (backend){0};
    vk_lower low = lower ? *lower : (vk_lower){0};
    int32_t layer0 = low.layer0;
    char msg[CELLM_ERR_MSG_MAX];
    const char *why = NULL;
    cellm_status st = CELLM_OK;
    if (layer0 < 0 || layer0 >= m->n_layer || (layer0 && (!low.run || !low.copy)))
        st = err_set(err, CELLM_ERR_UNSUPPORTED, "the layers below the device's are bad");
    else if ((why = cannot_run(m, kv, layer0, msg, sizeof msg)))
        st = err_set(err, CELLM_ERR_UNSUPPORTED, "%s", why);
    else if (max_rows < 1 || max_logit_rows < 1 || max_logit_rows > max_rows)
        st = err_set(err, CELLM_ERR_INVALID_ARG, "batch limits %d rows / %d logit rows are bad",
                     max_rows, max_logit_rows);
    vkf *f = st ? NULL : calloc(1, sizeof *f);
    if (!st && !f) st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    if (st) {
        if (low.free) low.free(low.user); /* ours, made or not */
        return st;
    }
    f->m = m;
    f->max_rows = max_rows;
    f->max_logit_rows = max_logit_rows;
    f->lower = low;
    f->layer0 = layer0;
    kv_layers_below(m, layer0, f->kv_first);
    vk_open_params op = vk_open_default_params();
    if ((st = vk_device_open(&op, &f->dev, err))) goto fail;
    if (layer0 && !(f->lower_rows = malloc((size_t)max_rows * sizeof *f->lower_rows))) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    if (gpu_only && vk_device_get_info(f->dev)->type == VK_TYPE_CPU) {
        st = err_set(err, CELLM_ERR_UNSUPPORTED, "the only Vulkan device is a CPU emulation (%s)",
                     vk_device_get_info(f->dev)->name);
        goto fail;
    }
    if ((st = vk_recorder_create(f->dev, &f->rec, err))) goto fail;
    f->lane_mm = vk_matmul_lane_variant(f->dev);
    const char *prof = getenv("CELLM_VK_PROFILE");
    f->prof.on = prof && *prof && strcmp(prof, "0");
    vk_recorder_set_marks(f->rec, f->prof.on);
    const char *rp = getenv("CELLM_VK_REPLAY");
    f->replay_off = rp && !strcmp(rp, "0");
    const char *fu = getenv("CELLM_VK_FUSED");
    f->fuse_off = fu && !strcmp(fu, "0");

    /* Weights. */
    f->layers = calloc((size_t)m->n_layer, sizeof *f->layers);
    if (!f->layers) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    if ((st = upload_weight(f, &m->out_norm, &f->out_norm, err))) goto fail;
    if ((st = upload_weight(f, &m->output, &f->output, err))) goto fail;
    for (int32_t il = layer0; il < m->n_layer; il++) {
        const layer_desc *L = &m->layers[il];
        vlayer *V = &f->layers[il];
        if ((st = upload_weight(f, &L->attn_norm, &V->attn_norm, err)) ||
            (st = upload_weight(f, &L->wq, &V->wq, err)) ||
            (st = upload_weight(f, &L->wk, &V->wk, err)) ||
            (st = upload_weight(f, &L->wv, &V->wv, err)) ||
            (st = upload_weight(f, &L->wo, &V->wo, err)) ||
            (st = upload_weight(f, &L->post_attn_norm, &V->post_attn_norm, err)) ||
            (st = upload_weight(f, &L->ffn_norm, &V->ffn_norm, err)) ||
            (st = upload_weight(f, &L->w_gate, &V->w_gate, err)) ||
            (st = upload_weight(f, &L->w_up, &V->w_up, err)) ||
            (st = upload_weight(f, &L->w_down, &V->w_down, err)) ||
            (st = upload_weight(f, &L->post_ffn_norm, &V->post_ffn_norm, err)) ||
            (st = upload_concat(f, (const weight *const[]){&L->bq, &L->bk, &L->bv}, 3, &V->bias,
                                err)) ||
            (st = upload_concat(f, (const weight *const[]){&L->q_norm, &L->k_norm}, 2, &V->qk_norm,
                                err)))
            goto fail;
        /* The layer's RoPE setting among the distinct ones. */
        int32_t c = 0;
        while (c < f->n_rope_cfg &&
               !(f->rope_base[c] == L->rope_base && f->rope_scale[c] == L->rope_scale))
            c++;
        if (c == f->n_rope_cfg) {
            if (c == MAX_ROPE_CFG) {
                st =
                    err_set(err, CELLM_ERR_UNSUPPORTED, "more than %d RoPE settings", MAX_ROPE_CFG);
                goto fail;
            }
            f->rope_base[c] = L->rope_base;
            f->rope_scale[c] = L->rope_scale;
            f->n_rope_cfg++;
        }
        V->rope_cfg = (uint32_t)c;
    }

    /* The KV pool, as the cache lays it out: the layers on the device. */
    uint64_t range = vk_device_get_info(f->dev)->max_storage_range;
    for (int32_t g = 0; g < kv->n_groups; g++) {
        const kv_group *kg = &kv->groups[g];
        if (f->kv_first[g] == kg->n_layers) continue;
        size_t slice = ((size_t)kg->n_blocks * kg->layer_bytes + 255) / 256 * 256;
        if (slice > range) {
            st = err_set(err, CELLM_ERR_UNSUPPORTED,
                         "a layer's KV slice of %zu bytes passes the device's binding limit of "
                         "%llu; lower the memory budget",
                         slice, (unsigned long long)range);
            goto fail;
        }
        f->kv_slice[g] = slice;
        if ((st = make_buf(f, slice * (size_t)(kg->n_layers - f->kv_first[g]), VK_BUF_DEVICE,
                           &f->kvbuf[g], err)))
            goto fail;
    }

    /* Activations for max_rows rows. */
    size_t r = (size_t)max_rows, fl = sizeof(float);
    int32_t qd = m->n_head * m->head_dim, kd = m->n_head_kv * m->head_dim,
            vd = m->n_head_kv * m->head_dim_v, ad = m->n_head * m->head_dim_v;
    if ((st = make_buf(f, r * (size_t)m->n_embd * fl, VK_BUF_DEVICE, &f->x, err)) ||
        (st = make_buf(f, r * (size_t)max_i32(m->n_embd, max_i32(qd, ad)) * fl, VK_BUF_DEVICE,
                       &f->xb, err)) ||
        (st = make_buf(f, r * (size_t)qd * fl, VK_BUF_DEVICE, &f->q, err)) ||
        (st = make_buf(f, r * (size_t)kd * fl, VK_BUF_DEVICE, &f->k, err)) ||
        (st = make_buf(f, r * (size_t)vd * fl, VK_BUF_DEVICE, &f->v, err)) ||
        (st = make_buf(f, r * (size_t)ad * fl, VK_BUF_DEVICE, &f->att, err)) ||
        (st = make_buf(f, r * (size_t)max_i32(m->n_ff, m->n_embd) * fl, VK_BUF_DEVICE, &f->hb,
                       err)) ||
        (st = make_buf(f, r * (size_t)m->n_ff * fl, VK_BUF_DEVICE, &f->hb2, err)) ||
        (st = make_buf(f, r * (size_t)m->n_embd * fl, VK_BUF_DEVICE, &f->mo, err)) ||
        (st = make_buf(f, (size_t)max_logit_rows * (size_t)m->n_vocab * fl, VK_BUF_DEVICE,
                       &f->logits, err)) ||
        (st = make_buf(f, (size_t)max_logit_rows * (size_t)m->n_vocab * fl, VK_BUF_READBACK,
                       &f->readback, err)) ||
        (st = make_buf(f, (size_t)max_logit_rows * vk_top_slices(m->n_vocab) * sizeof(fwd_top),
                       VK_BUF_DEVICE, &f->top_part, err)) ||
        (st = make_buf(f, (size_t)max_logit_rows * sizeof(fwd_top), VK_BUF_DEVICE, &f->top, err)) ||
        (st = make_buf(f, (size_t)max_logit_rows * sizeof(fwd_top), VK_BUF_READBACK, &f->top_rb,
                       err)))
        goto fail;

    /* What the host writes each step. Block tables: each row's sequence
     * appears once per step with up to max_ctx / 16 blocks per group. */
    size_t pairs = (size_t)m->rope_dim / 2;
    f->tab_cap = (size_t)max_rows * (size_t)kv->n_groups * (size_t)kv->max_blocks_per_seq;
    if ((st = make_buf(f, r * (size_t)m->n_embd * fl, VK_BUF_UPLOAD, &f->in_x, err)) ||
        (st = make_buf(f, r * 4 * sizeof(int32_t), VK_BUF_UPLOAD, &f->rowinfo, err)) ||
        (st = make_buf(f, f->tab_cap * sizeof(int32_t), VK_BUF_UPLOAD, &f->tables, err)) ||
        (st = make_buf(f, r * (size_t)f->n_rope_cfg * pairs * 2 * fl, VK_BUF_UPLOAD, &f->rope,
                       err)) ||
        (st = make_buf(f, (size_t)max_logit_rows * sizeof(int32_t), VK_BUF_UPLOAD, &f->lidx, err)))
        goto fail;
    f->host_x = malloc(r * (size_t)m->n_embd * fl);
    f->host_info = malloc(r * 4 * sizeof(int32_t));
    f->host_tab = malloc(f->tab_cap * sizeof(int32_t));
    f->host_rope = malloc((r * (size_t)f->n_rope_cfg * pairs * 2 + 1) * fl);
    /* Up to 4 MiB of positions' angles (SmolLM2: 16,384 positions, Gemma 3
     * with its two RoPE settings 2,048); pages are touched as they fill. */
    size_t rope_row = (size_t)f->n_rope_cfg * pairs * 2 * fl;
    f->rope_cap = rope_row ? (int32_t)((4u << 20) / rope_row) : 0;
    f->rope_cached = 0;
    f->rope_cache = f->rope_cap ? malloc((size_t)f->rope_cap * rope_row) : NULL;
    if (!f->rope_cache) f->rope_cap = 0;
    f->host_lidx = malloc((size_t)max_logit_rows * sizeof(int32_t));
    f->cap_copies = 2 * max_rows;
    f->copies = malloc((size_t)f->cap_copies * sizeof *f->copies);
    if (!f->host_x || !f->host_info || !f->host_tab || !f->host_rope || !f->host_lidx ||
        !f->copies) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    if ((st = prepare_pipelines(f, err))) goto fail;
    f->kv = kv;
    kv->ext = (kv_storage){f, kv_copy};
    *out = (backend){&vk_ops, f};
    return CELLM_OK;
fail:
    vkf_free(f);
    if (st == CELLM_ERR_NO_MEMORY) {
        /* The device's memory is short: say what would fit it. */
        char hint[160];
        snprintf(hint, sizeof hint,
                 "; fewer layers on the GPU (--gpu-layers N, cellm_engine_params.gpu_layers: "
                 "%d of %d now) need less",
                 (int)(m->n_layer - layer0), (int)m->n_layer);
        if (err && strlen(err->msg) + strlen(hint) < sizeof err->msg) strcat(err->msg, hint);
    }
    return st;
}

/* ------------------------------------------------------------ one step */

/* Group counts for `n` elements at 256 per group, spread over y past the
 * device's x limit. */
static void groups_1d(const vkf *f, size_t n, uint32_t g[3]) {
    size_t wg = (n + 255) / 256, lim = vk_device_get_info(f->dev)->max_workgroups[0];
    if (lim > 65535) lim = 65535;
    g[0] = (uint32_t)(wg < lim ? wg : lim);
    g[1] = (uint32_t)((wg + g[0] - 1) / g[0]);
    g[2] = 1;
}

typedef struct rec_ctx {
    vkf *f;
    cellm_error *err;
    cellm_status st;
} rec_ctx;

static void dispatch(rec_ctx *c, vk_shader_id id, const vk_binding *b, uint32_t nb,
                     const void *push, size_t push_bytes, const uint32_t g[3]) {
    if (c->st) return;
    const vk_pipeline *pipe;
    if ((c->st = vk_pipeline_get(c->f->dev, id, &pipe, c->err))) return;
    c->st = vk_recorder_dispatch(c->f->rec, pipe, b, nb, push, push_bytes, g, c->err);
}

/* y = x W^T for n rows; with u, the activation rows are act(x) * u
 * (vk_matmul_args.u). A matrix larger than one binding may span (Gemma 3's
 * 262144-row classifier on a device that binds 128 MiB) goes as several
 * products over ranges of its rows. */
static void mm_glu(rec_ctx *c, const vweight *w, const vk_buffer *x, const vk_buffer *u, int32_t n,
                   const vk_buffer *y) {
    if (c->st) return;
    uint64_t row_bytes = 0;
    quant_nbytes(w->type, w->cols, &row_bytes);
    uint64_t range = vk_device_get_info(c->f->dev)->max_storage_range;
    uint32_t per = (uint32_t)((range - 256) / row_bytes) / 128 * 128;
    if (per == 0) per = w->rows; /* rows this wide fail in vk_matmul with a message */
    for (uint32_t r0 = 0; r0 < w->rows && !c->st; r0 += per) {
        uint32_t cnt = w->rows - r0 < per ? w->rows - r0 : per;
        vk_matmul_args a = {.type = w->type,
                            .w = w->buf,
                            .w_off = (size_t)r0 * row_bytes,
                            .rows = cnt,
                            .cols = w->cols,
                            .x = x,
                            .x_off = 0,
                            .x_stride = w->cols,
                            .y = y,
                            .y_off = (size_t)r0 * sizeof(float),
                            .y_stride = w->rows,
                            .n_rows = (uint32_t)n,
                            .u = u,
                            .act = c->f->m->act == ACT_GELU_TANH};
        c->st = vk_matmul_record(c->f->rec, &a, c->err);
    }
}

static void mm(rec_ctx *c, const vweight *w, const vk_buffer *x, int32_t n, const vk_buffer *y) {
    mm_glu(c, w, x, NULL, n, y);
}

/* The end of a stage of kind `tag` (P_*): the next stage sees its writes. */
static void barrier(rec_ctx *c, int tag) {
    if (c->st) return;
    vk_recorder_barrier(c->f->rec);
    vk_recorder_mark(c->f->rec, (uint32_t)tag);
}

typedef struct rms_push {
    uint32_t n, x_stride, o_stride, has_weight, gather;
    float eps;
} rms_push;

/* out rows = rmsnorm(x rows) (* w); n_rows rows of the model's width. */
static void rmsnorm(rec_ctx *c, const vk_buffer *x, const vweight *w, const vk_buffer *out,
                    int32_t n_rows, uint32_t width, bool gather) {
    vkf *f = c->f;
    rms_push p = {width, width, width, w && w->buf ? 1u : 0u, gather ? 1u : 0u, f->m->norm_eps};
    vk_binding b[4] = {{x, 0, 0}, {w && w->buf ? w->buf : x, 0, 0}, {out, 0, 0}, {f->lidx, 0, 0}};
    uint32_t g[3] = {(uint32_t)n_rows, 1, 1};
    dispatch(c, VK_SHADER_RMSNORM, b, 4, &p, sizeof p, g);
}

/* x += y * scale over n_rows rows of n_embd, after y's post-norm when the
 * layer has one; then, with `next` (a norm weight), xb = rmsnorm(x) * next:
 * the input of the block that follows, in the same dispatch (add_norm.comp). */
static void add_norm(rec_ctx *c, const vk_buffer *y, const vweight *post, const vweight *next,
                     int32_t n_rows) {
    vkf *f = c->f;
    struct {
        uint32_t n, has_post, has_norm;
        float eps, scale;
    } p = {(uint32_t)f->m->n_embd, post->buf ? 1u : 0u, next ? (next->buf ? 1u : 2u) : 0u,
           f->m->norm_eps, f->m->residual_scale};
    vk_binding b[5] = {{f->x, 0, 0},
                       {y, 0, 0},
                       {post->buf ? post->buf : y, 0, 0},
                       {next && next->buf ? next->buf : y, 0, 0},
                       {f->xb, 0, 0}};
    uint32_t g[3] = {(uint32_t)n_rows, 1, 1};
    dispatch(c, VK_SHADER_ADD_NORM, b, 5, &p, sizeof p, g);
}

typedef struct qk_push {
    uint32_t n_head, n_head_kv, hd, hdv, rope_pairs, rope_neox, rope_cfg, rope_cfgs, flags;
    float eps;
    uint32_t group, k_row_words, v_row_words, block_words;
} qk_push;

typedef struct attn_push {
    uint32_t n_head, n_head_kv, hd, hdv;
    int32_t window;
    float scale, softcap;
    uint32_t group, k_row_words, v_row_words, block_words;
    /* The decode form (fused): qk_prep's settings. */
    uint32_t rope_pairs, rope_neox, rope_cfg, rope_cfgs, flags;
    float eps;
    uint32_t fused;
} attn_push;

static void attention_layer(rec_ctx *c, int32_t il, int32_t n) {
    vkf *f = c->f;
    const model *m = f->m;
    const layer_desc *L = &m->layers[il];
    const vlayer *V = &f->layers[il];
    const kv_group *kg = &f->kv->groups[L->kv_group];
    vk_binding kvb = {f->kvbuf[L->kv_group],
                      (size_t)(L->kv_index - f->kv_first[L->kv_group]) * f->kv_slice[L->kv_group],
                      f->kv_slice[L->kv_group]};
    mm(c, &V->wq, f->xb, n, f->q);
    mm(c, &V->wk, f->xb, n, f->k);
    mm(c, &V->wv, f->xb, n, f->v);
    barrier(c, P_QKV);
    qk_push qp = {(uint32_t)m->n_head,
                  (uint32_t)m->n_head_kv,
                  (uint32_t)m->head_dim,
                  (uint32_t)m->head_dim_v,
                  L->nope ? 0u : (uint32_t)m->rope_dim / 2,
                  m->rope == ROPE_NEOX,
                  V->rope_cfg,
                  (uint32_t)f->n_rope_cfg,
                  (V->bias ? 1u : 0u) | (V->qk_norm ? 2u : 0u),
                  m->norm_eps,
                  (uint32_t)L->kv_group,
                  (uint32_t)(kg->k_row / 4),
                  (uint32_t)(kg->v_row / 4),
                  (uint32_t)(kg->layer_bytes / 4)};
    vk_binding qb[9] = {{f->q, 0, 0},
                        {f->k, 0, 0},
                        {f->v, 0, 0},
                        {V->bias ? V->bias : f->q, 0, 0},
                        {V->qk_norm ? V->qk_norm : f->q, 0, 0},
                        {f->rope, 0, 0},
                        {f->rowinfo, 0, 0},
                        {f->tables, 0, 0},
                        kvb};
    /* A batch where each sequence has one row (decode) leaves this to
     * attention (its decode form); a row that reads K/V another row of the
     * batch writes needs the stores done first. */
    if (!f->step_fused) {
        uint32_t g[3] = {(uint32_t)n, (uint32_t)(m->n_head + m->n_head_kv), 1};
        dispatch(c, VK_SHADER_QK_PREP, qb, 9, &qp, sizeof qp, g);
        barrier(c, P_QK_PREP);
    }
    attn_push ap = {(uint32_t)m->n_head,
                    (uint32_t)m->n_head_kv,
                    (uint32_t)m->head_dim,
                    (uint32_t)m->head_dim_v,
                    L->window,
                    m->attn_scale,
                    m->attn_softcap,
                    (uint32_t)L->kv_group,
                    (uint32_t)(kg->k_row / 4),
                    (uint32_t)(kg->v_row / 4),
                    (uint32_t)(kg->layer_bytes / 4),
                    qp.rope_pairs,
                    qp.rope_neox,
                    qp.rope_cfg,
                    qp.rope_cfgs,
                    qp.flags,
                    qp.eps,
                    f->step_fused};
    vk_binding ab[10] = {{f->q, 0, 0},
                         {f->rowinfo, 0, 0},
                         {f->tables, 0, 0},
                         kvb,
                         {f->att, 0, 0},
                         qb[1],
                         qb[2],
                         qb[3],
                         qb[4],
                         qb[5]};
    uint32_t ga[3] = {(uint32_t)n, (uint32_t)m->n_head, 1};
    /* Batches with prompt rows take the module without the decode form
     * (attention.comp's PREFILL): the same arithmetic, the same bits. */
    dispatch(c, f->step_fused ? VK_SHADER_ATTENTION : VK_SHADER_ATTENTION_PREFILL, ab, 10, &ap,
             sizeof ap, ga);
    barrier(c, P_ATTENTION);
    mm(c, &V->wo, f->att, n, f->hb);
    barrier(c, P_WO);
}

/* The MLP block of layer il; returns the buffer holding its output. */
static const vk_buffer *mlp_layer(rec_ctx *c, int32_t il, int32_t n) {
    vkf *f = c->f;
    const vlayer *V = &f->layers[il];
    mm(c, &V->w_gate, f->xb, n, f->hb2);
    mm(c, &V->w_up, f->xb, n, f->hb);
    barrier(c, P_GATE_UP);
    if (!f->lane_mm && !vk_matmul_tiled(f->dev, (uint32_t)n)) {
        /* The activation as the down projection loads its input (the
         * tiled form of a prompt would compute each activation once per
         * tile of outputs: there it is computed once, below). */
        mm_glu(c, &V->w_down, f->hb2, f->hb, n, f->mo);
        barrier(c, P_DOWN);
        return f->mo;
    }
    struct {
        uint32_t n, act;
    } p = {(uint32_t)n * (uint32_t)f->m->n_ff, f->m->act == ACT_GELU_TANH};
    vk_binding b[2] = {{f->hb2, 0, 0}, {f->hb, 0, 0}};
    uint32_t g[3];
    groups_1d(f, p.n, g);
    dispatch(c, VK_SHADER_ACT, b, 2, &p, sizeof p, g);
    barrier(c, P_ACT);
    mm(c, &V->w_down, f->hb2, n, f->hb);
    barrier(c, P_DOWN);
    return f->hb;
}

/* Position pos's RoPE angles for each setting ([n_rope_cfg][pairs][2], cos
 * and sin) into out: from the cache where it reaches (filled up to pos the
 * first time), else computed. The same values either way. */
static void rope_at(vkf *f, int32_t pos, float *out) {
    const model *m = f->m;
    int32_t pairs = m->rope_dim / 2;
    size_t row = (size_t)f->n_rope_cfg * pairs * 2;
    if (pos < f->rope_cap && pos < f->rope_cached) {
        memcpy(out, f->rope_cache + (size_t)pos * row, row * sizeof(float));
        return;
    }
    for (int32_t p = pos < f->rope_cap ? f->rope_cached : pos; p <= pos; p++) {
        float *o = p < f->rope_cap ? f->rope_cache + (size_t)p * row : out;
        for (int32_t c = 0; c < f->n_rope_cfg; c++) {
            float cs[512], sn[512];
            model_rope_angles(m, p, f->rope_base[c], f->rope_scale[c], cs, sn);
            for (int32_t i = 0; i < pairs; i++) {
                o[((size_t)c * pairs + i) * 2] = cs[i];
                o[((size_t)c * pairs + i) * 2 + 1] = sn[i];
            }
        }
    }
    if (pos < f->rope_cap) {
        f->rope_cached = pos + 1;
        memcpy(out, f->rope_cache + (size_t)pos * row, row * sizeof(float));
    }
}

/* Fills the upload buffers for the batch: inputs, row info, block tables,
 * RoPE angles, the rows that want logits. Returns how many do. */
static cellm_status fill_inputs(vkf *f, const fwd_row *rows, const float *const *embd, int32_t n,
                                int32_t *n_logits, cellm_error *err) {
    const model *m = f->m;
    const kv_cache *kv = f->kv;
    int32_t d = m->n_embd, pairs = m->rope_dim / 2;
    const quant_type_info *et = quant_type_get(m->tok_embd.type);
    uint64_t rb = 0;
    quant_nbytes(m->tok_embd.type, (uint64_t)d, &rb);
    size_t nt = 0;
    int32_t nl = 0;
    f->step_fused = 1;
    for (int32_t r = 0; r < n; r++) {
        float *x = f->host_x + (size_t)r * d;
        if (embd && embd[r]) {
            memcpy(x, embd[r], (size_t)d * sizeof(float));
        } else {
            et->to_float((const uint8_t *)m->tok_embd.data + (size_t)rb * (size_t)rows[r].token, x,
                         (size_t)d);
            if (m->emb_scale != 1.0f)
                for (int32_t i = 0; i < d; i++) x[i] *= m->emb_scale;
        }
        /* The row's sequence's tables: shared with an earlier row of the
         * same sequence in this batch. */
        int32_t same = r > 0 && rows[r - 1].seq == rows[r].seq ? r - 1 : -1;
        for (int32_t e = r - 2; e >= 0 && same < 0; e--)
            if (rows[e].seq == rows[r].seq) same = e;
        if (same >= 0 || f->fuse_off) f->step_fused = 0;
        int32_t *info = f->host_info + (size_t)r * 4;
        info[0] = rows[r].pos;
        info[3] = 0;
        if (same >= 0) {
            info[1] = f->host_info[(size_t)same * 4 + 1];
            info[2] = f->host_info[(size_t)same * 4 + 2];
        } else {
            /* Blocks up to the one of the sequence's last row this step. */
            int32_t last = rows[r].pos;
            for (int32_t e = r + 1; e < n; e++)
                if (rows[e].seq == rows[r].seq) last = rows[e].pos;
            size_t nb = (size_t)last / KV_BLOCK_TOKENS + 1;
            for (int32_t g = 0; g < 2; g++) {
                info[1 + g] = (int32_t)nt;
                if (g >= kv->n_groups) continue;
                if (nt + nb > f->tab_cap)
                    return err_set(err, CELLM_ERR_INTERNAL, "block tables overflow");
                memcpy(f->host_tab + nt, rows[r].seq->table[g], nb * sizeof(int32_t));
                nt += nb;
            }
        }
        if (f->n_rope_cfg && pairs)
            rope_at(f, rows[r].pos, f->host_rope + (size_t)r * f->n_rope_cfg * pairs * 2);
        if (rows[r].logits) f->host_lidx[nl++] = r;
    }
    cellm_status st;
    if ((st = vk_buffer_upload(f->in_x, 0, f->host_x, (size_t)n * d * sizeof(float), err)) ||
        (st =
             vk_buffer_upload(f->rowinfo, 0, f->host_info, (size_t)n * 4 * sizeof(int32_t), err)) ||
        (nt && (st = vk_buffer_upload(f->tables, 0, f->host_tab, nt * sizeof(int32_t), err))) ||
        (f->n_rope_cfg && pairs &&
         (st = vk_buffer_upload(f->rope, 0, f->host_rope,
                                (size_t)n * f->n_rope_cfg * pairs * 2 * sizeof(float), err))) ||
        (nl &&
         (st = vk_buffer_upload(f->lidx, 0, f->host_lidx, (size_t)nl * sizeof(int32_t), err))))
        return st;
    *n_logits = nl;
    return CELLM_OK;
}

/* Records the pending copies-on-write (rc->st keeps the first error). */
static void record_copies(rec_ctx *c) {
    vkf *f = c->f;
    for (int32_t i = 0; i < f->n_copies; i++) {
        const blk_copy *bc = &f->copies[i];
        const kv_group *kg = &f->kv->groups[bc->group];
        const vk_buffer *kb = f->kvbuf[bc->group];
        for (int32_t l = f->kv_first[bc->group]; l < kg->n_layers && !c->st; l++) {
            size_t at = (size_t)(l - f->kv_first[bc->group]) * f->kv_slice[bc->group];
            c->st =
                vk_recorder_copy(f->rec, kb, at + (size_t)bc->src * kg->layer_bytes, kb,
                                 at + (size_t)bc->dst * kg->layer_bytes, kg->layer_bytes, c->err);
        }
    }
}

/* The copies alone, submitted now (a pass that failed before recording).
 * A failure here leaves the device's error for the next pass to meet. */
static void flush_copies(vkf *f) {
    f->replay_ok = false;
    cellm_error e;
    err_clear(&e);
    rec_ctx c = {f, &e, vk_recorder_begin(f->rec, &e)};
    record_copies(&c);
    if (!c.st) (void)vk_recorder_submit(f->rec, &e);
    f->n_copies = 0;
}

static cellm_status record_step(vkf *f, int32_t n, int32_t nl, bool top, cellm_error *err);

/* The pass; *out: the logit rows, or with `top` their fwd_top each. */
static cellm_status vkf_pass(vkf *f, const fwd_row *rows, const float *const *embd, int32_t n,
                             bool top, const void **out, cellm_error *err) {
    const model *m = f->m;
    f->n_copies = 0;
    f->copy_overflow = false;
    double t0 = f->prof.on ? now_ns() : 0, t1 = 0, t2 = 0;
    cellm_status st = batch_reserve(m, f->kv, rows, n, f->max_rows, f->max_logit_rows, err);
    if (f->copy_overflow)
        return err_set(err, CELLM_ERR_INTERNAL, "more block copies than a batch can ask for");
    int32_t nl = 0;
    if (!st && f->layer0) {
        /* Partial offload: the layers below first; their output is the
         * device's input, every row of it. */
        const float *x = NULL;
        st = f->lower.run(f->lower.user, rows, embd, n, &x, err);
        for (int32_t r = 0; !st && r < n; r++) f->lower_rows[r] = x + (size_t)r * (size_t)m->n_embd;
        embd = f->lower_rows;
    }
    if (!st) st = fill_inputs(f, rows, embd, n, &nl, err);
    if (st) {
        /* The blocks reserved before the failure stay with their
         * sequences, so their copies-on-write must still happen. */
        if (f->n_copies) flush_copies(f);
        return st;
    }
    if (f->prof.on) t1 = now_ns();
    if (f->replay_ok && !f->n_copies && n == f->replay_n && nl == f->replay_nl &&
        f->step_fused == f->replay_fused && top == f->replay_top) {
        if (f->prof.on) t2 = now_ns();
        st = vk_recorder_resubmit(f->rec, err);
    } else {
        st = record_step(f, n, nl, top, err);
        if (f->prof.on) t2 = now_ns();
        if (!st) st = vk_recorder_submit(f->rec, err);
        f->replay_ok = !st && !f->n_copies && !f->replay_off;
        f->replay_n = n;
        f->replay_nl = nl;
        f->replay_fused = f->step_fused;
        f->replay_top = top;
    }
    if (st) {
        f->replay_ok = false;
        return st;
    }
    /* The logits are read where the device wrote them (host-visible,
     * cached memory), which stays as it is until the next step: at 64 rows
     * of a 49,152-token vocabulary a copy would be 12 MiB a step. */
    const void *lg = NULL;
    if (nl && (st = vk_buffer_read_mapped(top ? f->top_rb : f->readback, &lg, err))) return st;
    if (f->prof.on) profile_step(f, n, t0, t1, t2);
    batch_advance(f->kv, rows, n);
    *out = lg;
    return CELLM_OK;
}

static cellm_status vkf_run(void *impl, const fwd_row *rows, const float *const *embd, int32_t n,
                            const float **logits, cellm_error *err) {
    const void *out = NULL;
    cellm_status st = vkf_pass(impl, rows, embd, n, false, &out, err);
    if (!st) *logits = out;
    return st;
}

static cellm_status vkf_run_top(void *impl, const fwd_row *rows, const float *const *embd,
                                int32_t n, const fwd_top **top, cellm_error *err) {
    const void *out = NULL;
    cellm_status st = vkf_pass(impl, rows, embd, n, true, &out, err);
    if (!st) *top = out;
    return st;
}

/* The K best logits of each of the nl rows in f->logits into f->top
 * (top.comp): the slices' lists, a dispatch per as many rows as one
 * binding spans, then their merge. */
static void record_top(rec_ctx *c, int32_t nl) {
    vkf *f = c->f;
    uint32_t n = (uint32_t)f->m->n_vocab, slices = vk_top_slices(n);
    size_t row_bytes = (size_t)n * sizeof(float);
    uint64_t range = vk_device_get_info(f->dev)->max_storage_range;
    int32_t per = (int32_t)((range - 256) / row_bytes);
    if (per < 1) per = 1; /* a row past the binding limit fails in the recorder, with a message */
    for (int32_t r0 = 0; r0 < nl && !c->st; r0 += per) {
        int32_t cnt = nl - r0 < per ? nl - r0 : per;
        size_t at = (size_t)r0 * row_bytes;
        vk_top_push p = {n, (uint32_t)(vk_binding_shift(f->dev, at) / sizeof(float)), (uint32_t)r0,
                         0, slices};
        vk_binding b[2] = {{f->logits, at, (size_t)cnt * row_bytes}, {f->top_part, 0, 0}};
        uint32_t g[3] = {slices, (uint32_t)cnt, 1};
        dispatch(c, VK_SHADER_TOP, b, 2, &p, sizeof p, g);
    }
    barrier(c, P_HEAD);
    vk_top_push p = {n, 0, 0, 1, slices};
    vk_binding b[2] = {{f->top_part, 0, 0}, {f->top, 0, 0}};
    uint32_t g[3] = {(uint32_t)nl, 1, 1};
    dispatch(c, VK_SHADER_TOP, b, 2, &p, sizeof p, g);
}

/* Records a step of n rows, nl of them with logits, after the pending
 * copies-on-write. Everything else a step needs is in the buffers
 * fill_inputs wrote, so the recording may be submitted again for the next
 * step of the same shape. */
static cellm_status record_step(vkf *f, int32_t n, int32_t nl, bool top, cellm_error *err) {
    const model *m = f->m;
    cellm_status st;
    if ((st = vk_recorder_begin(f->rec, err))) return st;
    rec_ctx c = {f, err, CELLM_OK};
    /* Copies-on-write first: nothing this pass writes may land before. */
    record_copies(&c);
    if (!c.st)
        c.st = vk_recorder_copy(f->rec, f->in_x, 0, f->x, 0,
                                (size_t)n * (size_t)m->n_embd * sizeof(float), err);
    barrier(&c, P_INPUT);
    uint32_t d = (uint32_t)m->n_embd;
    /* Each block's input norm comes with the residual add before it
     * (add_norm), but the first's; the last layer's add brings the final
     * norm when every row wants logits. */
    rmsnorm(&c, f->x, &f->layers[f->layer0].attn_norm, f->xb, n, d, false);
    barrier(&c, P_NORM);
    for (int32_t il = f->layer0; il < m->n_layer && !c.st; il++) {
        const vlayer *V = &f->layers[il];
        attention_layer(&c, il, n);
        add_norm(&c, f->hb, &V->post_attn_norm, &V->ffn_norm, n);
        barrier(&c, P_RESIDUAL);
        /* After the last layer: the final norm, here when every row wants
         * logits (decode; the logit rows are then rows 0..n-1 in order),
         * else of the logit rows alone, gathered, below. */
        const vk_buffer *out = mlp_layer(&c, il, n);
        const vweight *next = il + 1 < m->n_layer ? &f->layers[il + 1].attn_norm
                              : nl == n           ? &f->out_norm
                                                  : NULL;
        add_norm(&c, out, &V->post_ffn_norm, next, n);
        barrier(&c, P_RESIDUAL);
    }
    if (nl) {
        if (nl < n) {
            rmsnorm(&c, f->x, &f->out_norm, f->xb, nl, d, true);
            barrier(&c, P_NORM);
        }
        mm(&c, &f->output, f->xb, nl, f->logits);
        if (m->logit_scale != 1.0f || m->logit_softcap > 0) {
            barrier(&c, P_HEAD);
            struct {
                uint32_t n;
                float scale, cap;
            } p = {(uint32_t)nl * (uint32_t)m->n_vocab, m->logit_scale, m->logit_softcap};
            vk_binding b[1] = {{f->logits, 0, 0}};
            uint32_t g[3];
            groups_1d(f, p.n, g);
            dispatch(&c, VK_SHADER_LOGITS, b, 1, &p, sizeof p, g);
        }
        barrier(&c, P_HEAD);
        if (top) {
            record_top(&c, nl);
            barrier(&c, P_HEAD);
            if (!c.st)
                c.st = vk_recorder_copy(f->rec, f->top, 0, f->top_rb, 0,
                                        (size_t)nl * sizeof(fwd_top), err);
        } else if (!c.st) {
            c.st = vk_recorder_copy(f->rec, f->logits, 0, f->readback, 0,
                                    (size_t)nl * (size_t)m->n_vocab * sizeof(float), err);
        }
    }
    /* A recording that went wrong is not submitted (the next begin
     * resets it). */
    return c.st;
}
