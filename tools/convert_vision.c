/*
 * convert_vision.c — the projector half of `cellm convert` for a vision-
 * language folder (Idefics3 / SmolVLM): the vision encoder and the
 * connector become llama.cpp's `mmproj` GGUF (general.architecture
 * "clip", clip.* keys, v.* and mm.* tensors), beside the text model that
 * convert.c writes from the same folder. The image processor's settings
 * (processor_config.json or preprocessor_config.json) go in as keys too.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "convert.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "safetensors.h"
#include "cpu/vision.h"

/* Hugging Face suffix inside a vision layer -> GGUF name inside v.blk.N. */
static const struct {
    const char *hf, *gguf;
} vision_layer_names[] = {
    {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"}, {"self_attn.out_proj", "attn_out"},
    {"layer_norm1", "ln1"},         {"layer_norm2", "ln2"},
    {"mlp.fc1", "ffn_up"},          {"mlp.fc2", "ffn_down"},
};

/* Tensors outside the layers. */
static const struct {
    const char *hf, *gguf;
} vision_names[] = {
    {"model.vision_model.embeddings.patch_embedding.weight", "v.patch_embd.weight"},
    {"model.vision_model.embeddings.patch_embedding.bias", "v.patch_embd.bias"},
    {"model.vision_model.embeddings.position_embedding.weight", "v.position_embd.weight"},
    {"model.vision_model.post_layernorm.weight", "v.post_ln.weight"},
    {"model.vision_model.post_layernorm.bias", "v.post_ln.bias"},
    {"model.connector.modality_projection.proj.weight", "mm.model.fc.weight"},
};

bool convert_is_vision_tensor(const char *hf) {
    return !strncmp(hf, "model.vision_model.", 19) || !strncmp(hf, "model.connector.", 16);
}

/* The GGUF name of vision tensor `hf`; false when cellm does not know it. */
static bool vision_gguf_name(const char *hf, int64_t n_layer, char *out, size_t cap) {
    for (size_t i = 0; i < sizeof vision_names / sizeof vision_names[0]; i++)
        if (!strcmp(hf, vision_names[i].hf)) return snprintf(out, cap, "%s", vision_names[i].gguf);
    const char *p = "model.vision_model.encoder.layers.";
    if (strncmp(hf, p, strlen(p))) return false;
    char *end;
    long il = strtol(hf + strlen(p), &end, 10);
    if (end == hf + strlen(p) || *end != '.' || il < 0 || il >= n_layer) return false;
    const char *rest = end + 1, *dot = strrchr(rest, '.');
    if (!dot || (strcmp(dot, ".weight") && strcmp(dot, ".bias"))) return false;
    for (size_t i = 0; i < sizeof vision_layer_names / sizeof vision_layer_names[0]; i++) {
        size_t n = strlen(vision_layer_names[i].hf);
        if ((size_t)(dot - rest) == n && !strncmp(rest, vision_layer_names[i].hf, n))
            return snprintf(out, cap, "v.blk.%ld.%s%s", il, vision_layer_names[i].gguf, dot) > 0;
    }
    return false;
}

static bool int_at(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return false;
    *out = (int64_t)v->valuedouble;
    return true;
}

/* The image processor's longest_edge under `key` ({"longest_edge": N}). */
static bool edge_at(const cJSON *proc, const char *key, int64_t *out) {
    return int_at(cJSON_GetObjectItemCaseSensitive(proc, key), "longest_edge", 1, IMAGE_MAX_EDGE,
                  out);
}

typedef struct vconv {
    gguf_writer *w;
    void **bufs;
    size_t n_bufs;
} vconv;

static bool keep_buf(vconv *v, void *p) {
    void **nb = p ? realloc(v->bufs, (v->n_bufs + 1) * sizeof *nb) : NULL;
    if (!nb) {
        free(p);
        return false;
    }
    v->bufs = nb;
    v->bufs[v->n_bufs++] = p;
    return true;
}

static cellm_status set_floats(vconv *v, const char *key, const float *x, cellm_error *err) {
    gguf_value val = {.type = GGUF_TYPE_ARRAY};
    val.v.arr.type = GGUF_TYPE_FLOAT32;
    val.v.arr.n = 3;
    val.v.arr.data = x;
    return gguf_writer_set(v->w, key, &val, err);
}

static cellm_status write_keys(vconv *v, const char *dir, const cJSON *cfg, const cJSON *proc,
                               uint32_t file_type, int64_t *n_layer, cellm_error *err) {
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"),
                *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    int64_t D, F, L, H, img, ps, scale = 2, proj, edge, tile;
    if (!int_at(vc, "hidden_size", 1, 1 << 16, &D) ||
        !int_at(vc, "intermediate_size", 1, 1 << 18, &F) ||
        !int_at(vc, "num_hidden_layers", 1, 256, &L) ||
        !int_at(vc, "num_attention_heads", 1, 1024, &H) ||
        !int_at(vc, "image_size", 1, IMAGE_MAX_EDGE, &img) ||
        !int_at(vc, "patch_size", 1, IMAGE_MAX_EDGE, &ps) ||
        !int_at(tc, "hidden_size", 1, 1 << 20, &proj))
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s/config.json: vision_config (hidden_size, intermediate_size, "
                       "num_hidden_layers, num_attention_heads, image_size, patch_size) or "
                       "text_config.hidden_size is missing or out of range",
                       dir);
    if (cJSON_GetObjectItemCaseSensitive(cfg, "scale_factor") &&
        !int_at(cfg, "scale_factor", 1, 64, &scale))
        return err_set(err, CELLM_ERR_FORMAT, "%s/config.json: scale_factor", dir);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu_pytorch_tanh")))
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "%s: vision hidden_act is not gelu_pytorch_tanh (SigLIP's)", dir);
    if (img % ps || (img / ps) % scale || D % H)
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s: image size %lld, patch size %lld, scale factor %lld do not fit", dir,
                       (long long)img, (long long)ps, (long long)scale);
    if (!proc || !edge_at(proc, "size", &edge) || !edge_at(proc, "max_image_size", &tile))
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s: no image processor settings (size.longest_edge, "
                       "max_image_size.longest_edge in processor_config.json or "
                       "preprocessor_config.json)",
                       dir);
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(proc, "do_image_splitting");
    int64_t resample = 1;
    if (tile != img || cJSON_IsFalse(split) ||
        (cJSON_GetObjectItemCaseSensitive(proc, "resample") &&
         (!int_at(proc, "resample", 0, 5, &resample) || resample != 1)))
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "%s: cellm runs Idefics3's processor with tiles of the encoder's size "
                       "(max_image_size %lld, image_size %lld), splitting on and LANCZOS",
                       dir, (long long)tile, (long long)img);
    float mean[3] = {0.5f, 0.5f, 0.5f}, std[3] = {0.5f, 0.5f, 0.5f};
    const char *mk[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(proc, mk[k]);
        if (!a) continue;
        if (cJSON_GetArraySize(a) != 3)
            return err_set(err, CELLM_ERR_FORMAT, "%s: %s is not 3 numbers", dir, mk[k]);
        for (int c = 0; c < 3; c++) {
            const cJSON *e = cJSON_GetArrayItem(a, c);
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || (k && !(e->valuedouble > 0)))
                return err_set(err, CELLM_ERR_FORMAT, "%s: %s[%d]", dir, mk[k], c);
            (k ? std : mean)[c] = (float)e->valuedouble;
        }
    }
    double eps = 1e-6;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(vc, "layer_norm_eps");
    if (cJSON_IsNumber(e)) eps = e->valuedouble;
    gguf_value yes = {.type = GGUF_TYPE_BOOL, .v.b = true};
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    cellm_status st;
    if ((st = gguf_writer_set_str(v->w, "general.architecture", "clip", err)) ||
        (st = gguf_writer_set_str(v->w, "general.name", base, err)) ||
        (st = gguf_writer_set_u32(v->w, "general.file_type", file_type, err)) ||
        (st = gguf_writer_set(v->w, "clip.has_vision_encoder", &yes, err)) ||
        (st = gguf_writer_set(v->w, "clip.use_gelu", &yes, err)) ||
        (st = gguf_writer_set_str(v->w, "clip.projector_type", "idefics3", err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.image_size", (uint32_t)img, err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.patch_size", (uint32_t)ps, err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.embedding_length", (uint32_t)D, err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.feed_forward_length", (uint32_t)F, err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.block_count", (uint32_t)L, err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.attention.head_count", (uint32_t)H, err)) ||
        (st = gguf_writer_set_f32(v->w, "clip.vision.attention.layer_norm_epsilon", (float)eps,
                                  err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.projection_dim", (uint32_t)proj, err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.projector.scale_factor", (uint32_t)scale,
                                  err)) ||
        (st = gguf_writer_set_u32(v->w, "clip.vision.preproc_image_size", (uint32_t)edge, err)) ||
        (st = set_floats(v, "clip.vision.image_mean", mean, err)) ||
        (st = set_floats(v, "clip.vision.image_std", std, err)))
        return st;
    *n_layer = L;
    return CELLM_OK;
}

static cellm_status write_tensor(vconv *v, const safetensors_tensor *t, const char *name,
                                 uint32_t type, cellm_error *err) {
    if (t->n_dims < 1 || t->n_dims > 4 || t->n_elems == 0)
        return err_set(err, CELLM_ERR_FORMAT, "tensor '%.200s' has %u dimensions", t->name,
                       t->n_dims);
    float *f = malloc((size_t)t->n_elems * sizeof *f);
    if (!keep_buf(v, f)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    if (!safetensors_to_float(t, 0, t->n_elems, f))
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "tensor '%.200s' is %s; cellm converts F32, F16 and BF16", t->name,
                       safetensors_dtype_name(t->dtype));
    uint64_t ne[4];
    for (uint32_t i = 0; i < t->n_dims; i++) ne[i] = t->shape[t->n_dims - 1 - i];
    /* Vectors and the position table stay F32; matrices and the patch
     * kernel take `type` (F16 or F32). */
    uint32_t out = t->n_dims >= 2 && strcmp(name, "v.position_embd.weight") ? type : QT_F32;
    const void *data = f;
    if (out != QT_F32) {
        uint64_t bytes;
        void *q = NULL;
        if (quant_nbytes(out, t->n_elems, &bytes)) q = malloc(bytes ? (size_t)bytes : 1);
        if (!keep_buf(v, q)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        quant_type_get(out)->from_float(f, q, (size_t)t->n_elems);
        data = q;
    }
    return gguf_writer_add_tensor(v->w, name, out, t->n_dims, ne, data, err);
}

cellm_status convert_mmproj(const char *dir, const cJSON *cfg, const cJSON *proc,
                            safetensors_file *const *shards, size_t n_shards, const char *out_path,
                            bool f32, cellm_error *err) {
    vconv v = {.w = gguf_writer_new()};
    if (!v.w) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    int64_t n_layer = 0;
    size_t n = 0;
    cellm_status st = write_keys(&v, dir, cfg, proc, f32 ? 0 : 1, &n_layer, err);
    for (size_t s = 0; s < n_shards && !st; s++)
        for (size_t i = 0; i < shards[s]->n && !st; i++) {
            const safetensors_tensor *t = &shards[s]->tensors[i];
            char name[128];
            if (!convert_is_vision_tensor(t->name)) continue;
            if (!vision_gguf_name(t->name, n_layer, name, sizeof name)) {
                st = err_set(err, CELLM_ERR_UNSUPPORTED,
                             "tensor '%.200s' has no projector name (cellm does not know what "
                             "it is for)",
                             t->name);
                break;
            }
            st = write_tensor(&v, t, name, f32 ? QT_F32 : QT_F16, err);
            n++;
        }
    if (!st && n == 0)
        st = err_set(err, CELLM_ERR_FORMAT, "%s: no vision tensors (model.vision_model.*)", dir);
    if (!st) st = gguf_writer_write(v.w, out_path, err);
    gguf_writer_free(v.w);
    for (size_t i = 0; i < v.n_bufs; i++) free(v.bufs[i]);
    free(v.bufs);
    if (st) return st;
    /* The check: the runtime loads what was written. */
    vision_model *vm = NULL;
    cellm_error lerr;
    if (vision_load(out_path, &vm, &lerr)) {
        remove(out_path);
        return err_set(err, lerr.code, "the converted projector does not load: %s", lerr.msg);
    }
    vision_free(vm);
    return CELLM_OK;
}
