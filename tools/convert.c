/*
 * convert.c — `cellm convert` (see convert.h).
 *
 * The steps: read config.json and pick the family's row (GGUF architecture,
 * whether Q and K rows are permuted for llama's RoPE pairing); open every
 * safetensors file; map each Hugging Face tensor name to its GGUF name and
 * convert its data (permuting Q/K where the row says; a mixture of experts'
 * per-expert matrices stacked into one tensor per layer); write the
 * hyperparameters as ARCH.* keys and the tokenizer as tokenizer.ggml.*
 * keys; write the file and load it back with model_load() as a check.
 */
#include "convert.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "format/gguf.h"
#include "model/model.h"
#include "format/quant.h"
#include "quantize.h"
#include "safetensors.h"
#include "text/tokenizer.h"

/* A family: Hugging Face class name -> GGUF architecture. */
typedef struct hf_family {
    const char *hf_class;
    const char *arch;
    bool permute_qk; /* llama's RoPE pairs adjacent dims; HF rotates halves */
    bool window;     /* config's sliding_window applies (every layer, or gemma3's pattern) */
    bool gemma;      /* norms stored as w for (1 + w); Gemma's norm names */
    bool moe;        /* a mixture of experts in every layer */
    bool idefics3;   /* a vision-language folder: text_config, and a projector file */
} hf_family;

static const hf_family families[] = {
    {"LlamaForCausalLM", "llama", true, false, false, false, false},
    {"MistralForCausalLM", "llama", true, true, false, false, false},
    {"Qwen2ForCausalLM", "qwen2", false, false, false, false, false},
    {"Qwen3ForCausalLM", "qwen3", false, false, false, false, false},
    {"Phi3ForCausalLM", "phi3", false, true, false, false, false},
    {"GraniteForCausalLM", "granite", true, false, false, false, false},
    {"Gemma3ForCausalLM", "gemma3", false, true, true, false, false},
    {"SmolLM3ForCausalLM", "smollm3", true, false, false, false, false},
    {"Qwen3MoeForCausalLM", "qwen3moe", false, false, false, true, false},
    {"OlmoeForCausalLM", "olmoe", false, false, false, true, false},
    {"GraniteMoeForCausalLM", "granitemoe", true, false, false, true, false},
    {"Lfm2ForCausalLM", "lfm2", false, false, false, false, false},
    {"Idefics3ForConditionalGeneration", "llama", true, false, false, false, true},
};

/* Gemma's names for its norms around attention and the MLP. */
static const struct {
    const char *hf, *gguf;
} gemma_names[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

/* Tensor names inside a layer: Hugging Face suffix -> GGUF suffix. */
static const struct {
    const char *hf, *gguf;
} layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},                      /* qwen3moe, olmoe */
    {"block_sparse_moe.router.layer.weight", "ffn_gate_inp.weight"}, /* granitemoe */
    /* lfm2 */
    {"operator_norm.weight", "attn_norm.weight"},
    {"ffn_norm.weight", "ffn_norm.weight"},
    {"feed_forward.w1.weight", "ffn_gate.weight"},
    {"feed_forward.w3.weight", "ffn_up.weight"},
    {"feed_forward.w2.weight", "ffn_down.weight"},
    {"conv.in_proj.weight", "shortconv.in_proj.weight"},
    {"conv.out_proj.weight", "shortconv.out_proj.weight"},
    {"conv.conv.weight", "shortconv.conv.weight"},
    {"self_attn.q_layernorm.weight", "attn_q_norm.weight"},
    {"self_attn.k_layernorm.weight", "attn_k_norm.weight"},
    {"self_attn.out_proj.weight", "attn_output.weight"},
};

/* The stacked expert tensors, in the order of a stage's kinds. */
static const char *const expert_names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};

#define MAX_JSON (512u << 20) /* config and tokenizer files */
#define MAX_SHARDS 4096

/* Everything a conversion allocates, freed in one place. */
typedef struct conv {
    const char *dir;
    const hf_family *fam;
    cJSON *cfg, *tok, *tok_cfg;
    cJSON *root_cfg; /* a vision-language config; cfg is then its text_config */
    char *template_file;
    safetensors_file **shards;
    size_t n_shards;
    gguf_writer *w;
    void **bufs; /* tensor data and strings the writer borrows until written */
    size_t n_bufs, cap_bufs;
    /* hyperparameters */
    int64_t n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_vocab, rope_dim;
    int64_t n_expert, n_expert_used, n_ff_exp; /* mixture of experts */
    bool tied;
    /* Per-expert matrices gathered per (layer, kind) until all are there:
     * stage[l * 3 + kind] holds n_expert matrices, have[] marks which. */
    float **stage;
    uint8_t *have;
    int64_t *n_have;
} conv;

static void conv_free(conv *c) {
    cJSON_Delete(c->cfg);
    cJSON_Delete(c->root_cfg);
    cJSON_Delete(c->tok);
    cJSON_Delete(c->tok_cfg);
    free(c->template_file);
    for (size_t i = 0; i < c->n_shards; i++) safetensors_close(c->shards[i]);
    free(c->shards);
    for (size_t i = 0; i < c->n_bufs; i++) free(c->bufs[i]);
    free(c->bufs);
    for (int64_t i = 0; c->stage && i < c->n_layer * 3; i++) free(c->stage[i]);
    free(c->stage);
    free(c->have);
    free(c->n_have);
    gguf_writer_free(c->w);
}

/* Keeps `p` (malloc'd) until the end; false (and frees it) when out of memory. */
static bool keep(conv *c, void *p) {
    if (!p) return false;
    if (c->n_bufs == c->cap_bufs) {
        size_t cap = c->cap_bufs ? c->cap_bufs * 2 : 64;
        void **nb = realloc(c->bufs, cap * sizeof *nb);
        if (!nb) {
            free(p);
            return false;
        }
        c->bufs = nb;
        c->cap_bufs = cap;
    }
    c->bufs[c->n_bufs++] = p;
    return true;
}

/* ---- files and JSON ---- */

/* Reads `dir/name` into a NUL-terminated buffer; NULL with errno ENOENT when
 * it does not exist. */
static char *read_text(const char *dir, const char *name, size_t *len, cellm_error *err,
                       cellm_status *st) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *st = CELLM_OK;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno != ENOENT) *st = err_set(err, CELLM_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || (unsigned long)size > MAX_JSON || fseek(f, 0, SEEK_SET) != 0) {
        *st = err_set(err, CELLM_ERR_FORMAT, "%s: unreadable or larger than %u MiB", path,
                      MAX_JSON >> 20);
    } else if (!(buf = malloc((size_t)size + 1))) {
        *st = err_set(err, CELLM_ERR_NO_MEMORY, "%s: out of memory", path);
    } else if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        *st = err_set(err, CELLM_ERR_IO, "%s: read failed", path);
        free(buf);
        buf = NULL;
    } else {
        buf[size] = '\0';
        if (len) *len = (size_t)size;
    }
    fclose(f);
    return buf;
}

/* Parses `dir/name` as a JSON object into *out (NULL when the file does
 * not exist and `optional`). */
static cellm_status read_json(const char *dir, const char *name, bool optional, cJSON **out,
                              cellm_error *err) {
    cellm_status st;
    size_t len = 0;
    char *text = read_text(dir, name, &len, err, &st);
    *out = NULL;
    if (!text) {
        if (st) return st;
        if (optional) return CELLM_OK;
        return err_set(err, CELLM_ERR_NOT_FOUND, "%s/%s is missing", dir, name);
    }
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return err_set(err, CELLM_ERR_FORMAT, "%s/%s is not a JSON object", dir, name);
    }
    return CELLM_OK;
}

static const cJSON *jget(const cJSON *o, const char *key) {
    return o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* A whole number in [lo, hi] under `key`. */
static bool jint(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *j = jget(o, key);
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

static bool jnum(const cJSON *o, const char *key, double *out) {
    const cJSON *j = jget(o, key);
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) return false;
    *out = j->valuedouble;
    return true;
}

/* ---- hyperparameters ---- */

static bool jbool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *j = jget(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

/* The experts: how many, how many per token, their size, and the routing
 * rule, which must be the one llama.cpp (and the model row) applies to the
 * family: renormalised top-k for qwen3moe and granitemoe, plain softmax
 * weights for olmoe. */
static cellm_status read_moe_config(conv *c, cellm_error *err) {
    const cJSON *g = c->cfg;
    const char *arch = c->fam->arch;
    if (!jint(g, "num_experts", 1, 1024, &c->n_expert) &&
        !jint(g, "num_local_experts", 1, 1024, &c->n_expert))
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s/config.json: num_experts (or num_local_experts) is missing or not "
                       "in 1..1024",
                       c->dir);
    if (!jint(g, "num_experts_per_tok", 1, c->n_expert, &c->n_expert_used))
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s/config.json: num_experts_per_tok is missing or not in 1..%lld", c->dir,
                       (long long)c->n_expert);
    c->n_ff_exp = c->n_ff;
    if (!strcmp(arch, "qwen3moe")) {
        if (!jint(g, "moe_intermediate_size", 1, 1 << 24, &c->n_ff_exp))
            return err_set(err, CELLM_ERR_FORMAT, "%s/config.json: moe_intermediate_size", c->dir);
        int64_t step = 1;
        jint(g, "decoder_sparse_step", 0, INT32_MAX, &step);
        const cJSON *dense = jget(g, "mlp_only_layers");
        if (step != 1 || (cJSON_IsArray(dense) && cJSON_GetArraySize(dense) > 0))
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "%s: dense layers among the experts (decoder_sparse_step, "
                           "mlp_only_layers) are not supported",
                           c->dir);
    }
    bool norm = jbool(g, "norm_topk_prob", strcmp(arch, "olmoe") != 0);
    if (norm != (strcmp(arch, "olmoe") != 0))
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "%s: norm_topk_prob %s is not what llama.cpp's %s does", c->dir,
                       norm ? "true" : "false", arch);
    return CELLM_OK;
}

static cellm_status read_config(conv *c, cellm_error *err) {
    const cJSON *archs = jget(c->cfg, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0))
        return err_set(err, CELLM_ERR_FORMAT, "%s/config.json: no \"architectures\" list", c->dir);
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].hf_class, a0->valuestring)) c->fam = &families[i];
    if (!c->fam) {
        char known[512] = "";
        for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
            strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
            strncat(known, families[i].hf_class, sizeof known - strlen(known) - 1);
        }
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "%s: model class '%.64s' is not supported (cellm converts: %s)", c->dir,
                       a0->valuestring, known);
    }
    if (c->fam->idefics3) {
        /* The text model's settings are its text_config's. */
        cJSON *text = cJSON_DetachItemFromObjectCaseSensitive(c->cfg, "text_config");
        if (!cJSON_IsObject(text)) {
            cJSON_Delete(text);
            return err_set(err, CELLM_ERR_FORMAT, "%s/config.json: no text_config", c->dir);
        }
        c->root_cfg = c->cfg;
        c->cfg = text;
        cJSON_AddItemReferenceToObject(c->root_cfg, "text_config", text);
    }
    const cJSON *g = c->cfg;
    if (!jint(g, "hidden_size", 1, 1 << 20, &c->n_embd) ||
        !jint(g, "num_hidden_layers", 1, 4096, &c->n_layer) ||
        !jint(g, "intermediate_size", 1, 1 << 24, &c->n_ff) ||
        !jint(g, "num_attention_heads", 1, 4096, &c->n_head) ||
        !jint(g, "vocab_size", 1, 1 << 24, &c->n_vocab))
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s/config.json: hidden_size, num_hidden_layers, intermediate_size, "
                       "num_attention_heads or vocab_size is missing or out of range",
                       c->dir);
    if (!jint(g, "num_key_value_heads", 1, c->n_head, &c->n_head_kv)) c->n_head_kv = c->n_head;
    if (!jint(g, "head_dim", 2, 1024, &c->head_dim)) c->head_dim = c->n_embd / c->n_head;
    if (c->n_head % c->n_head_kv || c->head_dim < 2 || c->head_dim % 2)
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s/config.json: %lld heads, %lld KV heads, head size %lld do not fit",
                       c->dir, (long long)c->n_head, (long long)c->n_head_kv,
                       (long long)c->head_dim);
    const cJSON *t = jget(g, "tie_word_embeddings");
    c->tied = cJSON_IsBool(t) ? cJSON_IsTrue(t) : false;
    if (!strcmp(c->fam->arch, "lfm2") && jbool(g, "block_auto_adjust_ff_dim", false)) {
        /* LFM2's own feed-forward size: 2/3, a multiplier, rounded up to a
         * multiple, as transformers computes it. */
        double mult = 1.0;
        int64_t of = 256;
        jnum(g, "block_ffn_dim_multiplier", &mult);
        jint(g, "block_multiple_of", 1, 1 << 20, &of);
        int64_t ff = (int64_t)(mult * (double)(int64_t)(2.0 * (double)c->n_ff / 3.0));
        c->n_ff = of * ((ff + of - 1) / of);
    }
    return c->fam->moe ? read_moe_config(c, err) : CELLM_OK;
}

static cellm_status set_u32(conv *c, const char *suffix, int64_t v, cellm_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c->fam->arch, suffix);
    return gguf_writer_set_u32(c->w, key, (uint32_t)v, err);
}

static cellm_status set_f32(conv *c, const char *suffix, double v, cellm_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c->fam->arch, suffix);
    return gguf_writer_set_f32(c->w, key, (float)v, err);
}

/* Adds an F32 tensor of `n` values (copied). */
static cellm_status add_f32(conv *c, const char *name, const float *v, uint64_t n,
                            cellm_error *err) {
    float *copy = malloc((size_t)n * sizeof *copy);
    if (!keep(c, copy)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    memcpy(copy, v, (size_t)n * sizeof *copy);
    return gguf_writer_add_tensor(c->w, name, QT_F32, 1, &n, copy, err);
}

/* RoPE: base, rotated dimensions, and scaling (linear; Phi-3's LongRoPE
 * factors as rope_factors_{short,long} tensors and an attention factor). */
static cellm_status write_rope(conv *c, cellm_error *err) {
    const cJSON *g = c->cfg, *rp = jget(g, "rope_parameters"); /* transformers 5 */
    if (!cJSON_IsObject(rp)) rp = NULL;
    if (c->fam->gemma) {
        /* Gemma 3: the global layers' RoPE here; the windowed layers' base
         * is the gemma3 row's 10000, which the folder must agree with. */
        const cJSON *local = jget(rp, "sliding_attention");
        double lb = 10000.0;
        if (!jnum(local, "rope_theta", &lb)) jnum(g, "rope_local_base_freq", &lb);
        if (lb != 10000.0)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "%s: a local RoPE base of %g (cellm's gemma3 uses 10000)", c->dir, lb);
        if (cJSON_IsObject(jget(rp, "full_attention"))) rp = jget(rp, "full_attention");
    }
    const cJSON *sc = jget(g, "rope_scaling");
    if (!cJSON_IsObject(sc)) sc = rp;
    double theta = 10000.0, prf = 1.0;
    if (!jnum(g, "rope_theta", &theta)) jnum(rp, "rope_theta", &theta);
    if (!jnum(g, "partial_rotary_factor", &prf)) jnum(rp, "partial_rotary_factor", &prf);
    c->rope_dim = (int64_t)(c->head_dim * prf);
    if (!(theta > 0) || c->rope_dim < 2 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        return err_set(err, CELLM_ERR_FORMAT, "%s/config.json: rope_theta %g or rotary size %lld",
                       c->dir, theta, (long long)c->rope_dim);
    cellm_status st;
    if ((st = set_f32(c, "rope.freq_base", theta, err)) ||
        (st = set_u32(c, "rope.dimension_count", c->rope_dim, err)))
        return st;
    const cJSON *ty = jget(sc, "rope_type");
    if (!cJSON_IsString(ty)) ty = jget(sc, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "default";
    if (!strcmp(type, "default")) return CELLM_OK;
    if (!strcmp(type, "linear")) {
        double factor;
        if (!jnum(sc, "factor", &factor) || !(factor > 0))
            return err_set(err, CELLM_ERR_FORMAT, "%s: linear RoPE scaling without a factor",
                           c->dir);
        char key[128];
        snprintf(key, sizeof key, "%s.rope.scaling.type", c->fam->arch);
        if ((st = gguf_writer_set_str(c->w, key, "linear", err))) return st;
        return set_f32(c, "rope.scaling.factor", factor, err);
    }
    if (!strcmp(type, "longrope") && !strcmp(c->fam->arch, "phi3")) {
        int64_t orig, max_pos;
        if (!jint(sc, "original_max_position_embeddings", 1, INT32_MAX, &orig) &&
            !jint(g, "original_max_position_embeddings", 1, INT32_MAX, &orig))
            return err_set(err, CELLM_ERR_FORMAT, "%s: LongRoPE without an original length",
                           c->dir);
        if (!jint(g, "max_position_embeddings", 1, INT32_MAX, &max_pos)) max_pos = orig;
        const char *names[2] = {"short_factor", "long_factor"};
        const char *tensors[2] = {"rope_factors_short.weight", "rope_factors_long.weight"};
        float fac[512];
        for (int k = 0; k < 2; k++) {
            const cJSON *arr = jget(sc, names[k]);
            if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != c->rope_dim / 2 ||
                c->rope_dim / 2 > 512)
                return err_set(err, CELLM_ERR_FORMAT, "%s: LongRoPE %s must have %lld values",
                               c->dir, names[k], (long long)c->rope_dim / 2);
            int i = 0;
            for (const cJSON *e = arr->child; e; e = e->next, i++) {
                if (!cJSON_IsNumber(e) || !(e->valuedouble > 0))
                    return err_set(err, CELLM_ERR_FORMAT, "%s: LongRoPE %s[%d] is not positive",
                                   c->dir, names[k], i);
                fac[i] = (float)e->valuedouble;
            }
            if ((st = add_f32(c, tensors[k], fac, (uint64_t)c->rope_dim / 2, err))) return st;
        }
        /* transformers' default attention factor for LongRoPE. */
        double attn = 1.0, scale = (double)max_pos / (double)orig;
        if (!jnum(sc, "attention_factor", &attn))
            attn = scale <= 1.0 || orig < 2 ? 1.0 : sqrt(1.0 + log(scale) / log((double)orig));
        if ((st = set_f32(c, "rope.scaling.attn_factor", attn, err))) return st;
        return set_u32(c, "rope.scaling.original_context_length", orig, err);
    }
    if (!strcmp(type, "llama3")) {
        /* Llama 3.1's scaling: long wavelengths divided by `factor`, short
         * ones kept, a smooth blend between; stored as per-pair divisors. */
        double factor, lo, hi;
        int64_t orig;
        if (!jnum(sc, "factor", &factor) || !jnum(sc, "low_freq_factor", &lo) ||
            !jnum(sc, "high_freq_factor", &hi) ||
            !jint(sc, "original_max_position_embeddings", 1, INT32_MAX, &orig) || !(factor > 0) ||
            !(lo > 0) || !(hi > lo) || c->rope_dim / 2 > 512)
            return err_set(err, CELLM_ERR_FORMAT,
                           "%s: llama3 RoPE scaling needs factor, low_freq_factor < "
                           "high_freq_factor and original_max_position_embeddings",
                           c->dir);
        float div[512];
        double lo_wave = (double)orig / lo, hi_wave = (double)orig / hi;
        for (int64_t i = 0; i < c->rope_dim / 2; i++) {
            double freq = pow(theta, -2.0 * (double)i / (double)c->rope_dim);
            double wave = 6.283185307179586 / freq; /* 2 pi / freq */
            if (wave < hi_wave)
                div[i] = 1.0f;
            else if (wave > lo_wave)
                div[i] = (float)factor;
            else {
                double smooth = ((double)orig / wave - lo) / (hi - lo);
                div[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
            }
        }
        return add_f32(c, "rope_freqs.weight", div, (uint64_t)c->rope_dim / 2, err);
    }
    return err_set(err, CELLM_ERR_UNSUPPORTED, "%s: RoPE scaling '%.32s' is not supported for %s",
                   c->dir, type, c->fam->hf_class);
}

/* lfm2: which layers are short convolutions (layer_types "conv", or not in
 * full_attn_idxs) as llama.cpp writes it, a KV head count of 0 in the
 * per-layer attention.head_count_kv; and their width. */
static cellm_status write_lfm2(conv *c, cellm_error *err) {
    const cJSON *g = c->cfg, *lt = jget(g, "layer_types"), *fa = jget(g, "full_attn_idxs");
    uint32_t *kv = calloc((size_t)c->n_layer, sizeof *kv);
    if (!keep(c, kv)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    for (int64_t i = 0; i < c->n_layer; i++) {
        const cJSON *t = cJSON_IsArray(lt) ? cJSON_GetArrayItem(lt, (int)i) : NULL;
        bool attn = false;
        if (cJSON_IsString(t))
            attn = strcmp(t->valuestring, "conv") != 0;
        else
            for (const cJSON *e = cJSON_IsArray(fa) ? fa->child : NULL; e; e = e->next)
                attn |= cJSON_IsNumber(e) && e->valuedouble == (double)i;
        kv[i] = attn ? (uint32_t)c->n_head_kv : 0;
    }
    int64_t lc;
    if (!jint(g, "conv_L_cache", 2, 64, &lc))
        return err_set(err, CELLM_ERR_FORMAT,
                       "%s/config.json: conv_L_cache is missing or not in 2..64", c->dir);
    if (jbool(g, "conv_bias", false))
        return err_set(err, CELLM_ERR_UNSUPPORTED, "%s: conv_bias (llama.cpp's lfm2 has none)",
                       c->dir);
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    v.v.arr.type = GGUF_TYPE_UINT32;
    v.v.arr.n = (uint64_t)c->n_layer;
    v.v.arr.data = kv;
    char key[128];
    snprintf(key, sizeof key, "lfm2.attention.head_count_kv");
    cellm_status st = gguf_writer_set(c->w, key, &v, err);
    if (!st) st = set_u32(c, "shortconv.l_cache", lc, err);
    return st;
}

static cellm_status write_hparams(conv *c, cellm_error *err) {
    const cJSON *g = c->cfg;
    cellm_status st;
    int64_t ctx = 2048;
    jint(g, "max_position_embeddings", 1, INT32_MAX, &ctx);
    double eps = 1e-5;
    if (!jnum(g, "rms_norm_eps", &eps)) jnum(g, "norm_eps", &eps);
    if ((st = gguf_writer_set_str(c->w, "general.architecture", c->fam->arch, err))) return st;
    const char *base = strrchr(c->dir, '/');
    base = base && base[1] ? base + 1 : c->dir;
    if ((st = gguf_writer_set_str(c->w, "general.name", base, err)) ||
        (st = set_u32(c, "context_length", ctx, err)) ||
        (st = set_u32(c, "embedding_length", c->n_embd, err)) ||
        (st = set_u32(c, "block_count", c->n_layer, err)) ||
        (st = set_u32(c, "feed_forward_length", c->n_ff, err)) ||
        (st = set_u32(c, "attention.head_count", c->n_head, err)) ||
        (!strcmp(c->fam->arch, "lfm2")
             ? (st = write_lfm2(c, err))
             : (st = set_u32(c, "attention.head_count_kv", c->n_head_kv, err))) ||
        (st = set_u32(c, "attention.key_length", c->head_dim, err)) ||
        (st = set_u32(c, "attention.value_length", c->head_dim, err)) ||
        (st = set_f32(c, "attention.layer_norm_rms_epsilon", eps, err)) ||
        (st = set_u32(c, "vocab_size", c->n_vocab, err)))
        return st;
    if ((st = write_rope(c, err))) return st;
    int64_t window;
    if (c->fam->window && jint(g, "sliding_window", 1, INT32_MAX, &window) &&
        (st = set_u32(c, "attention.sliding_window", window, err)))
        return st;
    if (c->fam->gemma) {
        /* Every 6th layer global, the others windowed: the gemma3 row's
         * pattern, which layer_types must follow. */
        const cJSON *lt = jget(g, "layer_types");
        int i = 0;
        for (const cJSON *e = cJSON_IsArray(lt) ? lt->child : NULL; e; e = e->next, i++) {
            const char *want = (i + 1) % 6 ? "sliding_attention" : "full_attention";
            if (!cJSON_IsString(e) || strcmp(e->valuestring, want))
                return err_set(err, CELLM_ERR_UNSUPPORTED,
                               "%s: layer %d is not %s (cellm's gemma3 has every 6th layer "
                               "global)",
                               c->dir, i, want);
        }
        double qs, cap;
        if (jnum(g, "query_pre_attn_scalar", &qs) && qs != (double)c->head_dim) {
            if (!(qs > 0))
                return err_set(err, CELLM_ERR_FORMAT, "%s: query_pre_attn_scalar %g", c->dir, qs);
            if ((st = set_f32(c, "attention.scale", 1.0 / sqrt(qs), err))) return st;
        }
        if (jnum(g, "attn_logit_softcapping", &cap) &&
            (st = set_f32(c, "attn_logit_softcapping", cap, err)))
            return st;
        if (jnum(g, "final_logit_softcapping", &cap) &&
            (st = set_f32(c, "final_logit_softcapping", cap, err)))
            return st;
    }
    if (c->fam->moe) {
        if ((st = set_u32(c, "expert_count", c->n_expert, err)) ||
            (st = set_u32(c, "expert_used_count", c->n_expert_used, err)))
            return st;
        if (!strcmp(c->fam->arch, "qwen3moe") &&
            (st = set_u32(c, "expert_feed_forward_length", c->n_ff_exp, err)))
            return st;
    }
    if (!strcmp(c->fam->arch, "smollm3")) {
        /* No RoPE in every 4th layer: the smollm3 row's (and llama.cpp's)
         * fixed pattern, which no_rope_layers must follow. */
        const cJSON *nr = jget(g, "no_rope_layers");
        int i = 0;
        for (const cJSON *e = cJSON_IsArray(nr) ? nr->child : NULL; e; e = e->next, i++) {
            int want = (i + 1) % 4 != 0;
            if (!cJSON_IsNumber(e) || e->valueint != want)
                return err_set(err, CELLM_ERR_UNSUPPORTED,
                               "%s: no_rope_layers[%d] is not %d (cellm's smollm3 leaves RoPE "
                               "out of every 4th layer)",
                               c->dir, i, want);
        }
    }
    if (!strncmp(c->fam->arch, "granite", 7)) {
        static const char *keys[4][2] = {{"embedding_multiplier", "embedding_scale"},
                                         {"residual_multiplier", "residual_scale"},
                                         {"attention_multiplier", "attention.scale"},
                                         {"logits_scaling", "logit_scale"}};
        for (int i = 0; i < 4; i++) {
            double v;
            if (jnum(g, keys[i][0], &v) && (st = set_f32(c, keys[i][1], v, err))) return st;
        }
    }
    return CELLM_OK;
}

/* ---- tensors ---- */

static cellm_status open_shards(conv *c, cellm_error *err) {
    cJSON *index = NULL;
    cellm_status st = read_json(c->dir, "model.safetensors.index.json", true, &index, err);
    if (st) return st;
    const char *single = "model.safetensors";
    size_t n = 1;
    const cJSON *map = jget(index, "weight_map");
    if (index) {
        if (!cJSON_IsObject(map)) {
            cJSON_Delete(index);
            return err_set(err, CELLM_ERR_FORMAT,
                           "%s/model.safetensors.index.json has no weight_map", c->dir);
        }
        n = (size_t)cJSON_GetArraySize(map);
    }
    c->shards = calloc(n ? n : 1, sizeof *c->shards);
    if (!c->shards) {
        cJSON_Delete(index);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    /* Each distinct file named by the index, once. */
    const char **names = calloc(n ? n : 1, sizeof *names);
    size_t n_names = 0;
    if (!names) st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    if (!st && !index) names[n_names++] = single;
    for (const cJSON *e = map ? map->child : NULL; e && !st; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
            st = err_set(err, CELLM_ERR_FORMAT, "%s: the index names a bad file for '%.200s'",
                         c->dir, e->string ? e->string : "?");
            break;
        }
        bool seen = false;
        for (size_t i = 0; i < n_names && !seen; i++) seen = !strcmp(names[i], e->valuestring);
        if (!seen) {
            if (n_names >= MAX_SHARDS)
                st = err_set(err, CELLM_ERR_FORMAT, "%s: more than %d shards", c->dir, MAX_SHARDS);
            else
                names[n_names++] = e->valuestring;
        }
    }
    for (size_t i = 0; i < n_names && !st; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", c->dir, names[i]);
        st = safetensors_open(path, &c->shards[c->n_shards], err);
        if (!st) c->n_shards++;
    }
    free(names);
    cJSON_Delete(index);
    return st;
}

/* The GGUF name of Hugging Face tensor `hf` into `out`; false when it has
 * none (and *skip when it is one to leave out). */
static bool gguf_name(const conv *c, const char *hf, char *out, size_t cap, bool *skip) {
    *skip = false;
    char text[512];
    if (c->fam->idefics3) {
        if (convert_is_vision_tensor(hf)) {
            *skip = true; /* the projector file's */
            return true;
        }
        if (!strncmp(hf, "model.text_model.", 17)) {
            snprintf(text, sizeof text, "model.%s", hf + 17);
            hf = text;
        }
    }
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, cap, "token_embd.weight");
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, cap, "output_norm.weight");
    if (!strcmp(hf, "model.embedding_norm.weight")) /* lfm2's final norm, llama.cpp's name */
        return snprintf(out, cap, "token_embd_norm.weight");
    if (!strcmp(hf, "lm_head.weight")) {
        *skip = c->tied;
        return snprintf(out, cap, "output.weight");
    }
    const char *p = "model.layers.";
    if (strncmp(hf, p, strlen(p))) return false;
    char *end;
    long il = strtol(hf + strlen(p), &end, 10);
    if (end == hf + strlen(p) || *end != '.' || il < 0 || il >= c->n_layer) return false;
    if (strstr(end, "rotary_emb.inv_freq")) {
        *skip = true;
        return true;
    }
    if (c->fam->moe && (!strncmp(end + 1, "mlp.experts.", 12) ||
                        !strncmp(end + 1, "block_sparse_moe.input_linear.", 30) ||
                        !strncmp(end + 1, "block_sparse_moe.output_linear.", 31))) {
        *skip = true; /* stacked by stage_expert() */
        return true;
    }
    for (size_t i = 0; c->fam->gemma && i < sizeof gemma_names / sizeof gemma_names[0]; i++)
        if (!strcmp(end + 1, gemma_names[i].hf))
            return snprintf(out, cap, "blk.%ld.%s", il, gemma_names[i].gguf) > 0;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
        if (!strcmp(end + 1, layer_names[i].hf))
            return snprintf(out, cap, "blk.%ld.%s", il, layer_names[i].gguf) > 0;
    return false;
}

/* Reorders the rows of each head from "halves" to "adjacent pairs" order:
 * row 2i of a head comes from row i, row 2i+1 from row i + head_dim/2. */
static void permute_rows(float *dst, const float *src, int64_t n_heads, int64_t hd, int64_t cols) {
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++)
                memcpy(dst + (h * hd + 2 * i + j) * cols, src + (h * hd + i + j * hd / 2) * cols,
                       (size_t)cols * sizeof *dst);
}

static void progress(const convert_params *p, size_t k, size_t n, const char *name,
                     const char *from, const char *to) {
    if (!p->progress) return;
    if (isatty(STDERR_FILENO)) {
        fprintf(stderr, "\rconvert: [%4zu/%4zu] %-36.36s %5s -> %-5s", k, n, name, from, to);
        if (k == n) fputc('\n', stderr);
    } else if (k == n || (k * 4 / n) != ((k - 1) * 4 / n)) {
        fprintf(stderr, "convert: %zu/%zu tensors\n", k, n);
    }
    fflush(stderr);
}

/* Adds tensor `name` from the F32 values `f` (malloc'd; taken over and freed
 * or kept): vectors stay F32 (llama.cpp's rule), matrices and stacks of
 * matrices take `type`, the router of a mixture of experts stays F32 as
 * llama.cpp keeps it. ne is innermost first. */
static cellm_status add_values(conv *c, const char *name, float *f, uint32_t n_dims,
                               const uint64_t *ne, uint32_t type, const char *from,
                               const convert_params *p, size_t k, size_t total, cellm_error *err) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++) n *= ne[i];
    uint32_t out_type =
        n_dims >= 2 && !strstr(name, "ffn_gate_inp") && !strstr(name, "shortconv.conv") ? type
                                                                                        : QT_F32;
    const quant_type_info *qi = quant_type_get(out_type);
    const void *data = f;
    if (out_type == QT_F32) {
        if (!keep(c, f)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    } else {
        uint64_t bytes;
        void *q = NULL;
        if (ne[0] % qi->block_size == 0 && quant_nbytes(out_type, n, &bytes))
            q = malloc(bytes ? (size_t)bytes : 1);
        if (q) qi->from_float(f, q, (size_t)n);
        free(f);
        if (!keep(c, q))
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "tensor '%.200s' cannot be %s (or out of memory)", name, qi->name);
        data = q;
    }
    progress(p, k, total, name, from, qi->name);
    return gguf_writer_add_tensor(c->w, name, out_type, n_dims, ne, data, err);
}

/* The float values of a safetensors tensor (malloc'd), or NULL with *st. */
static float *tensor_floats(const safetensors_tensor *t, cellm_status *st, cellm_error *err) {
    float *f = malloc((size_t)t->n_elems * sizeof *f);
    if (!f) {
        *st = err_set(err, CELLM_ERR_NO_MEMORY, "tensor '%.200s': out of memory", t->name);
        return NULL;
    }
    if (!safetensors_to_float(t, 0, t->n_elems, f)) {
        free(f);
        *st = err_set(err, CELLM_ERR_UNSUPPORTED,
                      "tensor '%.200s' is %s; cellm converts F32, F16 and BF16", t->name,
                      safetensors_dtype_name(t->dtype));
        return NULL;
    }
    return f;
}

/* Expert `e`'s matrix of a (layer, kind) stage: rows x cols floats from
 * `src` into its slot; when every expert of the stage is there, the stack
 * becomes tensor blk.L.ffn_{gate,up,down}_exps ([cols, rows, n_expert]). */
static cellm_status stage_put(conv *c, int64_t il, int kind, int64_t e, const float *src,
                              int64_t rows, int64_t cols, uint32_t type, const convert_params *p,
                              size_t k, size_t total, cellm_error *err) {
    int64_t want_rows = kind == 2 ? c->n_embd : c->n_ff_exp,
            want_cols = kind == 2 ? c->n_ff_exp : c->n_embd;
    if (e < 0 || e >= c->n_expert || rows != want_rows || cols != want_cols)
        return err_set(err, CELLM_ERR_FORMAT,
                       "layer %lld: expert %lld's %s is %lld x %lld, expected expert < %lld of "
                       "%lld x %lld",
                       (long long)il, (long long)e, expert_names[kind], (long long)rows,
                       (long long)cols, (long long)c->n_expert, (long long)want_rows,
                       (long long)want_cols);
    if (!c->stage) {
        c->stage = calloc((size_t)c->n_layer * 3, sizeof *c->stage);
        c->n_have = calloc((size_t)c->n_layer * 3, sizeof *c->n_have);
        c->have = calloc((size_t)(c->n_layer * 3 * c->n_expert), 1);
        if (!c->stage || !c->n_have || !c->have)
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    int64_t slot = il * 3 + kind;
    size_t per = (size_t)rows * (size_t)cols;
    uint8_t *have = c->have + slot * c->n_expert + e;
    if (*have || (!c->stage[slot] && c->n_have[slot]))
        return err_set(err, CELLM_ERR_FORMAT, "layer %lld: expert %lld's %s comes twice",
                       (long long)il, (long long)e, expert_names[kind]);
    if (!c->stage[slot] && !(c->stage[slot] = malloc(per * (size_t)c->n_expert * sizeof(float))))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    memcpy(c->stage[slot] + per * (size_t)e, src, per * sizeof(float));
    *have = 1;
    if (++c->n_have[slot] < c->n_expert) return CELLM_OK;
    char name[96];
    snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)il, expert_names[kind]);
    uint64_t ne[3] = {(uint64_t)cols, (uint64_t)rows, (uint64_t)c->n_expert};
    float *stack = c->stage[slot];
    c->stage[slot] = NULL; /* n_have stays: the slot is done */
    return add_values(c, name, stack, 3, ne, type, "F32", p, k, total, err);
}

/* A tensor of a layer's experts (`what`: its name after "model.layers.N."):
 * one expert's gate/up/down matrix (mlp.experts.E.gate_proj.weight, ...),
 * or all experts' at once ([n_expert, rows, cols]: granitemoe's
 * block_sparse_moe.input_linear (gate rows, then up rows, per expert) and
 * output_linear, transformers 5's mlp.experts.gate_up_proj and down_proj). */
static cellm_status stage_expert(conv *c, const safetensors_tensor *t, int64_t il, const char *what,
                                 uint32_t type, const convert_params *p, size_t k, size_t total,
                                 cellm_error *err) {
    static const char *const one[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    bool fused_in = !strcmp(what, "block_sparse_moe.input_linear.weight") ||
                    !strcmp(what, "mlp.experts.gate_up_proj"),
         fused_out = !strcmp(what, "block_sparse_moe.output_linear.weight") ||
                     !strcmp(what, "mlp.experts.down_proj");
    int kind = -1;
    long e = -1;
    if (!fused_in && !fused_out) {
        char *dot;
        e = strtol(what + 12, &dot, 10); /* after "mlp.experts." */
        for (int i = 0; i < 3 && *dot == '.' && dot > what + 12; i++)
            if (!strcmp(dot + 1, one[i])) kind = i;
        if (kind < 0 || t->n_dims != 2)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "tensor '%.200s' has no GGUF name for %s (cellm does not know what "
                           "it is for)",
                           t->name, c->fam->hf_class);
    } else if (t->n_dims != 3 || (int64_t)t->shape[0] != c->n_expert) {
        return err_set(err, CELLM_ERR_FORMAT, "tensor '%.200s' is not [%lld experts, rows, cols]",
                       t->name, (long long)c->n_expert);
    }
    cellm_status st = CELLM_OK;
    float *f = tensor_floats(t, &st, err);
    if (!f) return st;
    if (kind >= 0) {
        st = stage_put(c, il, kind, e, f, (int64_t)t->shape[0], (int64_t)t->shape[1], type, p, k,
                       total, err);
    } else {
        int64_t rows = (int64_t)t->shape[1], cols = (int64_t)t->shape[2];
        int64_t half = fused_in ? rows / 2 : rows;
        if (fused_in && rows % 2)
            st = err_set(err, CELLM_ERR_FORMAT, "tensor '%.200s': %lld rows are not gate + up",
                         t->name, (long long)rows);
        for (int64_t x = 0; x < c->n_expert && !st; x++) {
            const float *m = f + (size_t)x * (size_t)rows * (size_t)cols;
            if (fused_in) {
                st = stage_put(c, il, 0, x, m, half, cols, type, p, k, total, err);
                if (!st)
                    st = stage_put(c, il, 1, x, m + (size_t)half * (size_t)cols, half, cols, type,
                                   p, k, total, err);
            } else {
                st = stage_put(c, il, 2, x, m, rows, cols, type, p, k, total, err);
            }
        }
    }
    free(f);
    return st;
}

static cellm_status write_tensors(conv *c, uint32_t type, const convert_params *p,
                                  cellm_error *err) {
    size_t total = 0, k = 0;
    for (size_t s = 0; s < c->n_shards; s++) total += c->shards[s]->n;
    cellm_status st = CELLM_OK;
    for (size_t s = 0; s < c->n_shards; s++) {
        for (size_t i = 0; i < c->shards[s]->n; i++) {
            const safetensors_tensor *t = &c->shards[s]->tensors[i];
            char name[128];
            bool skip;
            k++;
            if (!gguf_name(c, t->name, name, sizeof name, &skip))
                return err_set(err, CELLM_ERR_UNSUPPORTED,
                               "tensor '%.200s' has no GGUF name for %s (cellm does not know "
                               "what it is for)",
                               t->name, c->fam->hf_class);
            if (skip && c->fam->moe) {
                /* Experts: gguf_name checked the layer number. */
                char *end;
                long il = strtol(t->name + 13, &end, 10); /* after "model.layers." */
                if (!strncmp(t->name, "model.layers.", 13) && *end == '.' &&
                    !strstr(end, "rotary_emb") &&
                    (st = stage_expert(c, t, il, end + 1, type, p, k, total, err)))
                    return st;
            }
            if (skip) continue;
            /* lfm2's depthwise convolution kernels, [channels, 1, width]. */
            bool conv_k = strstr(name, "shortconv.conv") && t->n_dims == 3 && t->shape[1] == 1;
            if ((t->n_dims < 1 || t->n_dims > 2 || t->n_elems == 0) && !conv_k)
                return err_set(err, CELLM_ERR_FORMAT, "tensor '%.200s' has %u dimensions", t->name,
                               t->n_dims);
            /* The float copy lives only while this tensor is converted;
             * what the writer borrows is kept until the file is written. */
            float *f = tensor_floats(t, &st, err);
            if (!f) return st;
            /* Hugging Face shapes are [rows, cols] or [n]; GGUF's ne is
             * innermost first. */
            uint64_t rows = t->shape[0], cols = t->n_dims == 2 ? t->shape[1] : 1;
            uint32_t n_dims = t->n_dims;
            if (conv_k) {
                cols = t->shape[2];
                n_dims = 2;
            }
            bool is_q = strstr(name, ".attn_q.") != NULL, is_k = strstr(name, ".attn_k.") != NULL;
            if (c->fam->permute_qk && (is_q || is_k)) {
                int64_t nh = is_q ? c->n_head : c->n_head_kv;
                float *perm = rows == (uint64_t)(nh * c->head_dim)
                                  ? malloc((size_t)t->n_elems * sizeof *perm)
                                  : NULL;
                if (!perm) {
                    free(f);
                    return err_set(err, CELLM_ERR_FORMAT,
                                   "tensor '%.200s' has %llu rows, expected %lld heads of %lld "
                                   "(or out of memory)",
                                   t->name, (unsigned long long)rows, (long long)nh,
                                   (long long)c->head_dim);
                }
                permute_rows(perm, f, nh, c->head_dim, (int64_t)cols);
                free(f);
                f = perm;
            }
            /* Gemma computes x * (1 + w); GGUF files store 1 + w. */
            size_t nl = strlen(name);
            if (c->fam->gemma && nl > 11 && !strcmp(name + nl - 11, "norm.weight"))
                for (uint64_t j = 0; j < t->n_elems; j++) f[j] += 1.0f;
            uint64_t ne[2] = {n_dims == 2 ? cols : rows, rows};
            if ((st = add_values(c, name, f, n_dims, ne, type, safetensors_dtype_name(t->dtype), p,
                                 k, total, err)))
                return st;
        }
    }
    for (int64_t i = 0; c->n_have && i < c->n_layer * 3; i++)
        if (c->n_have[i] && c->n_have[i] < c->n_expert)
            return err_set(err, CELLM_ERR_FORMAT,
                           "layer %lld: %lld of %lld experts' %s are missing", (long long)(i / 3),
                           (long long)(c->n_expert - c->n_have[i]), (long long)c->n_expert,
                           expert_names[i % 3]);
    return CELLM_OK;
}

/* ---- tokenizer ---- */

/* Bytes of the first UTF-8 character at p (1 for a stray byte). */
static size_t utf8_len(const char *p) {
    uint8_t b = (uint8_t)p[0];
    return b < 0x80 ? 1 : b >> 5 == 6 ? 2 : b >> 4 == 14 ? 3 : b >> 3 == 30 ? 4 : 1;
}

/* tokenizer.ggml.pre for the pre-tokenizer in tokenizer.json, by what it
 * does: NULL when cellm does not recognise it. */
static const char *detect_pre(const cJSON *pt) {
    const char *type = cJSON_IsString(jget(pt, "type")) ? jget(pt, "type")->valuestring : "";
    if (!strcmp(type, "ByteLevel")) return cJSON_IsFalse(jget(pt, "use_regex")) ? NULL : "gpt-2";
    if (strcmp(type, "Sequence")) return NULL;
    const cJSON *list = jget(pt, "pretokenizers");
    int n = cJSON_GetArraySize(list);
    const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
    const char *ta = cJSON_IsString(jget(a, "type")) ? jget(a, "type")->valuestring : "";
    const char *tb = cJSON_IsString(jget(b, "type")) ? jget(b, "type")->valuestring : "";
    if (n == 2 && !strcmp(ta, "Digits") && cJSON_IsTrue(jget(a, "individual_digits")) &&
        !strcmp(tb, "ByteLevel") && !cJSON_IsFalse(jget(b, "use_regex")))
        return "smollm";
    if (n == 2 && !strcmp(ta, "Split") && !strcmp(tb, "ByteLevel") &&
        cJSON_IsFalse(jget(b, "use_regex"))) {
        const cJSON *re = jget(jget(a, "pattern"), "Regex");
        if (!cJSON_IsString(re)) return NULL;
        if (strstr(re->valuestring, "\\p{N}{1,3}")) return "llama-bpe";
        if (strstr(re->valuestring, "\\p{N}")) return "qwen2";
    }
    return NULL;
}

/* The id of special token `key` in tokenizer_config.json (a string or an
 * object with "content"), else config.json's `key`_id; -1 when none. */
static int64_t special_id(const conv *c, const char *key, const gguf_str *tokens) {
    const cJSON *v = jget(c->tok_cfg, key);
    if (cJSON_IsObject(v)) v = jget(v, "content");
    if (cJSON_IsString(v)) {
        for (int64_t i = 0; i < c->n_vocab; i++)
            if (tokens[i].ptr && !strcmp(tokens[i].ptr, v->valuestring)) return i;
    }
    char idkey[64];
    snprintf(idkey, sizeof idkey, "%s_id", key);
    int64_t id;
    if (jint(c->cfg, idkey, 0, c->n_vocab - 1, &id)) return id;
    return -1;
}

static cellm_status set_value(conv *c, const char *key, gguf_value *v, cellm_error *err) {
    return gguf_writer_set(c->w, key, v, err);
}

static cellm_status write_bpe(conv *c, const cJSON *tmodel, gguf_str *tokens, int32_t *types,
                              size_t n, const char *pre, cellm_error *err);
static cellm_status write_spm(conv *c, const cJSON *tmodel, gguf_str *tokens, int32_t *types,
                              size_t n, cellm_error *err);
static cellm_status write_specials(conv *c, const gguf_str *tokens, cellm_error *err);

static cellm_status write_tokenizer(conv *c, cellm_error *err) {
    const cJSON *tmodel = jget(c->tok, "model");
    const cJSON *mtype = jget(tmodel, "type");
    if (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE"))
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "%s/tokenizer.json: only BPE tokenizers (byte-level, or SentencePiece's "
                       "with byte fallback) are converted so far",
                       c->dir);
    /* BPE with byte fallback is a SentencePiece model in tokenizers' form. */
    bool spm = cJSON_IsTrue(jget(tmodel, "byte_fallback"));
    const char *pre = spm ? "default" : detect_pre(jget(c->tok, "pre_tokenizer"));
    if (!pre)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "%s/tokenizer.json: the pre-tokenizer is not one cellm recognises "
                       "(GPT-2, SmolLM, Llama 3, Qwen 2)",
                       c->dir);
    size_t n = (size_t)c->n_vocab;
    gguf_str *tokens = calloc(n, sizeof *tokens);
    int32_t *types = calloc(n, sizeof *types);
    if (!keep(c, tokens) || !keep(c, types))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    const cJSON *vocab = jget(tmodel, "vocab");
    if (!cJSON_IsObject(vocab))
        return err_set(err, CELLM_ERR_FORMAT, "%s/tokenizer.json: no vocab", c->dir);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int64_t id;
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)n ||
            (id = (int64_t)e->valuedouble) != e->valuedouble || tokens[id].ptr)
            return err_set(err, CELLM_ERR_FORMAT,
                           "%s/tokenizer.json: token '%.64s' has a bad or repeated id, or one "
                           "past the model's %zu rows",
                           c->dir, e->string, n);
        tokens[id] = (gguf_str){e->string, strlen(e->string)};
        types[id] = 1; /* normal */
    }
    const cJSON *added = jget(c->tok, "added_tokens");
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next) {
        int64_t id;
        const cJSON *content = jget(e, "content");
        if (!jint(e, "id", 0, (int64_t)n - 1, &id) || !cJSON_IsString(content))
            return err_set(err, CELLM_ERR_FORMAT,
                           "%s/tokenizer.json: an added token has a bad id or no content", c->dir);
        tokens[id] = (gguf_str){content->valuestring, strlen(content->valuestring)};
        types[id] = cJSON_IsTrue(jget(e, "special")) ? 3 : 4; /* control : user-defined */
    }
    for (size_t i = 0; i < n; i++) {
        if (tokens[i].ptr) continue;
        char *pad = malloc(32);
        if (!keep(c, pad)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        snprintf(pad, 32, "[PAD%zu]", i);
        tokens[i] = (gguf_str){pad, strlen(pad)};
        types[i] = 5; /* unused */
    }
    cellm_status st;
    if (spm) {
        if ((st = write_spm(c, tmodel, tokens, types, n, err))) return st;
    } else {
        if ((st = write_bpe(c, tmodel, tokens, types, n, pre, err))) return st;
    }
    return write_specials(c, tokens, err);
}

/* Byte-level BPE: tokenizer.ggml.model "gpt2" with its merges. */
static cellm_status write_bpe(conv *c, const cJSON *tmodel, gguf_str *tokens, int32_t *types,
                              size_t n, const char *pre, cellm_error *err) {
    const cJSON *merges = jget(tmodel, "merges");
    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    gguf_str *ms = calloc(n_merges ? n_merges : 1, sizeof *ms);
    if (!keep(c, ms)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    size_t im = 0;
    for (const cJSON *e = cJSON_IsArray(merges) ? merges->child : NULL; e; e = e->next, im++) {
        if (cJSON_IsString(e)) {
            ms[im] = (gguf_str){e->valuestring, strlen(e->valuestring)};
            continue;
        }
        /* The newer form: a pair of strings, joined by a space here. */
        const cJSON *l = cJSON_GetArrayItem(e, 0), *r = cJSON_GetArrayItem(e, 1);
        if (cJSON_GetArraySize(e) != 2 || !cJSON_IsString(l) || !cJSON_IsString(r))
            return err_set(err, CELLM_ERR_FORMAT, "%s/tokenizer.json: merge %zu is malformed",
                           c->dir, im);
        size_t len = strlen(l->valuestring) + strlen(r->valuestring) + 1;
        char *j = malloc(len + 1);
        if (!keep(c, j)) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        snprintf(j, len + 1, "%s %s", l->valuestring, r->valuestring);
        ms[im] = (gguf_str){j, len};
    }
    cellm_status st;
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    if ((st = gguf_writer_set_str(c->w, "tokenizer.ggml.model", "gpt2", err)) ||
        (st = gguf_writer_set_str(c->w, "tokenizer.ggml.pre", pre, err)))
        return st;
    v.v.arr.type = GGUF_TYPE_STRING;
    v.v.arr.n = n;
    v.v.arr.strs = tokens;
    if ((st = set_value(c, "tokenizer.ggml.tokens", &v, err))) return st;
    v.v.arr.type = GGUF_TYPE_INT32;
    v.v.arr.strs = NULL;
    v.v.arr.data = types;
    if ((st = set_value(c, "tokenizer.ggml.token_type", &v, err))) return st;
    v.v.arr.type = GGUF_TYPE_STRING;
    v.v.arr.n = n_merges;
    v.v.arr.data = NULL;
    v.v.arr.strs = ms;
    return set_value(c, "tokenizer.ggml.merges", &v, err);
}

/* Token text -> id, open addressing (the vocabulary can have 256k entries
 * and SentencePiece's merges as many). */
typedef struct tok_index {
    int64_t *slot; /* id, or -1 */
    size_t mask;
    const gguf_str *tokens;
} tok_index;

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

static bool index_build(tok_index *x, const gguf_str *tokens, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    x->slot = malloc(cap * sizeof *x->slot);
    if (!x->slot) return false;
    memset(x->slot, 0xff, cap * sizeof *x->slot);
    x->mask = cap - 1;
    x->tokens = tokens;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)hash_bytes(tokens[i].ptr, (size_t)tokens[i].len) & x->mask;
        while (x->slot[h] >= 0) h = (h + 1) & x->mask;
        x->slot[h] = (int64_t)i;
    }
    return true;
}

/* The first id whose text is p[0, n); -1 when none. */
static int64_t index_find(const tok_index *x, const char *p, size_t n) {
    size_t h = (size_t)hash_bytes(p, n) & x->mask;
    for (; x->slot[h] >= 0; h = (h + 1) & x->mask) {
        const gguf_str *t = &x->tokens[x->slot[h]];
        if (t->len == n && !memcmp(t->ptr, p, n)) return x->slot[h];
    }
    return -1;
}

/* True when the tokenizer puts "▁" before the text (SentencePiece's
 * add_dummy_prefix): a Prepend normalizer, or a Metaspace pre-tokenizer
 * that prepends. */
static bool spm_space_prefix(const cJSON *tok) {
    const cJSON *norm = jget(tok, "normalizer");
    const cJSON *list = jget(norm, "normalizers");
    for (const cJSON *e = cJSON_IsArray(list) ? list->child : norm; e;
         e = cJSON_IsArray(list) ? e->next : NULL) {
        const cJSON *t = jget(e, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "Prepend")) return true;
    }
    const cJSON *pt = jget(tok, "pre_tokenizer");
    list = jget(pt, "pretokenizers");
    for (const cJSON *e = cJSON_IsArray(list) ? list->child : pt; e;
         e = cJSON_IsArray(list) ? e->next : NULL) {
        const cJSON *t = jget(e, "type"), *ps = jget(e, "prepend_scheme");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "Metaspace")) continue;
        if (cJSON_IsString(ps)) return strcmp(ps->valuestring, "never") != 0;
        return !cJSON_IsFalse(jget(e, "add_prefix_space"));
    }
    return false;
}

/* SentencePiece in tokenizers' form (BPE with byte fallback): the "llama"
 * tokenizer, with a score per token. SentencePiece merges the pair whose
 * result scores highest; tokenizers' merges list is in that order, so a
 * token scores minus the rank of the first merge that makes it, and tokens
 * no merge makes score below all of them. <0xNN> tokens are bytes. */
static cellm_status write_spm(conv *c, const cJSON *tmodel, gguf_str *tokens, int32_t *types,
                              size_t n, cellm_error *err) {
    const cJSON *merges = jget(tmodel, "merges");
    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    float *scores = malloc(n * sizeof *scores);
    char *buf = malloc(4096);
    tok_index x = {0};
    if (!keep(c, scores) || !keep(c, buf) || !index_build(&x, tokens, n)) {
        free(x.slot);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        scores[i] = -(float)n_merges - 1;
        const char *p = tokens[i].ptr;
        if (tokens[i].len == 6 && !strncmp(p, "<0x", 3) && p[5] == '>' && isxdigit(p[3]) &&
            isxdigit(p[4]) && types[i] == 1)
            types[i] = 6; /* byte */
    }
    size_t r = 0;
    for (const cJSON *e = cJSON_IsArray(merges) ? merges->child : NULL; e; e = e->next, r++) {
        const char *l, *rt;
        size_t ll, rl;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp) continue;
            l = e->valuestring, ll = (size_t)(sp - l), rt = sp + 1, rl = strlen(rt);
        } else {
            const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
            if (!cJSON_IsString(a) || !cJSON_IsString(b)) continue;
            l = a->valuestring, ll = strlen(l), rt = b->valuestring, rl = strlen(rt);
        }
        if (ll + rl > 4096) continue;
        memcpy(buf, l, ll);
        memcpy(buf + ll, rt, rl);
        int64_t id = index_find(&x, buf, ll + rl);
        if (id >= 0 && scores[id] < -(float)r) scores[id] = -(float)r;
    }
    free(x.slot);
    /* Single characters and bytes are where merging starts: above all. */
    for (size_t i = 0; i < n; i++)
        if (types[i] == 6 ||
            (types[i] == 1 && scores[i] == -(float)n_merges - 1 && tokens[i].len <= 4 &&
             (size_t)tokens[i].len == utf8_len(tokens[i].ptr)))
            scores[i] = 0;
    const cJSON *unk = jget(tmodel, "unk_token");
    if (cJSON_IsString(unk)) {
        int64_t id = -1;
        for (size_t i = 0; i < n && id < 0; i++)
            if (!strcmp(tokens[i].ptr, unk->valuestring)) id = (int64_t)i;
        if (id >= 0) types[id] = 2; /* unknown */
    }
    cellm_status st;
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    if ((st = gguf_writer_set_str(c->w, "tokenizer.ggml.model", "llama", err)) ||
        (st = gguf_writer_set_str(c->w, "tokenizer.ggml.pre", "default", err)))
        return st;
    v.v.arr.type = GGUF_TYPE_STRING;
    v.v.arr.n = n;
    v.v.arr.strs = tokens;
    if ((st = set_value(c, "tokenizer.ggml.tokens", &v, err))) return st;
    v.v.arr.strs = NULL;
    v.v.arr.type = GGUF_TYPE_FLOAT32;
    v.v.arr.data = scores;
    if ((st = set_value(c, "tokenizer.ggml.scores", &v, err))) return st;
    v.v.arr.type = GGUF_TYPE_INT32;
    v.v.arr.data = types;
    if ((st = set_value(c, "tokenizer.ggml.token_type", &v, err))) return st;
    gguf_value bv = {.type = GGUF_TYPE_BOOL, .v.b = spm_space_prefix(c->tok)};
    return set_value(c, "tokenizer.ggml.add_space_prefix", &bv, err);
}

/* The special token ids, BOS/EOS flags and the chat template. */
static cellm_status write_specials(conv *c, const gguf_str *tokens, cellm_error *err) {
    cellm_status st;
    static const char *specials[4][2] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                         {"eos_token", "tokenizer.ggml.eos_token_id"},
                                         {"unk_token", "tokenizer.ggml.unknown_token_id"},
                                         {"pad_token", "tokenizer.ggml.padding_token_id"}};
    for (int i = 0; i < 4; i++) {
        int64_t id = special_id(c, specials[i][0], tokens);
        if (id >= 0 && (st = gguf_writer_set_u32(c->w, specials[i][1], (uint32_t)id, err)))
            return st;
    }
    static const char *flags[2][2] = {{"add_bos_token", "tokenizer.ggml.add_bos_token"},
                                      {"add_eos_token", "tokenizer.ggml.add_eos_token"}};
    for (int i = 0; i < 2; i++) {
        const cJSON *b = jget(c->tok_cfg, flags[i][0]);
        if (!cJSON_IsBool(b)) continue;
        gguf_value bv = {.type = GGUF_TYPE_BOOL, .v.b = cJSON_IsTrue(b)};
        if ((st = set_value(c, flags[i][1], &bv, err))) return st;
    }
    /* The chat template: tokenizer_config.json's (a string, or a list of
     * named templates), else chat_template.jinja (transformers 5). */
    const cJSON *tpl = jget(c->tok_cfg, "chat_template");
    const char *text = cJSON_IsString(tpl) ? tpl->valuestring : NULL;
    for (const cJSON *e = cJSON_IsArray(tpl) ? tpl->child : NULL; e && !text; e = e->next)
        if (cJSON_IsString(jget(e, "name")) && !strcmp(jget(e, "name")->valuestring, "default") &&
            cJSON_IsString(jget(e, "template")))
            text = jget(e, "template")->valuestring;
    if (!text) {
        text = c->template_file = read_text(c->dir, "chat_template.jinja", NULL, err, &st);
        if (st) return st;
    }
    if (text && (st = gguf_writer_set_str(c->w, "tokenizer.chat_template", text, err))) return st;
    return CELLM_OK;
}

/* ---- the conversion ---- */

typedef struct out_type {
    const char *name;
    uint32_t type, file_type;
} out_type;

static const out_type direct_types[] = {
    {"f32", QT_F32, 0},
    {"f16", QT_F16, 1},
    {"bf16", QT_BF16, 32},
};

/* A vision-language folder's projector: p->mmproj, or mmproj-BASENAME
 * beside the output; F32 when the text model is F32, F16 otherwise. */
static cellm_status write_projector(conv *c, const char *out_path, const convert_params *p,
                                    cellm_error *err) {
    char path[4200];
    if (p->mmproj) {
        snprintf(path, sizeof path, "%s", p->mmproj);
    } else {
        const char *slash = strrchr(out_path, '/');
        int dir_len = slash ? (int)(slash - out_path + 1) : 0;
        snprintf(path, sizeof path, "%.*smmproj-%s", dir_len, out_path, out_path + dir_len);
    }
    cJSON *proc = NULL, *pre = NULL;
    cellm_status st = read_json(c->dir, "processor_config.json", true, &proc, err);
    const cJSON *ip = cJSON_GetObjectItemCaseSensitive(proc, "image_processor");
    if (!st && !cJSON_IsObject(ip)) {
        st = read_json(c->dir, "preprocessor_config.json", true, &pre, err);
        ip = pre;
    }
    if (!st)
        st = convert_mmproj(c->dir, c->root_cfg, ip, c->shards, c->n_shards, path,
                            !strcasecmp(p->type, "f32"), err);
    cJSON_Delete(proc);
    cJSON_Delete(pre);
    if (!st && p->progress) fprintf(stderr, "convert: wrote the projector %s\n", path);
    return st;
}

cellm_status convert_hf(const char *dir, const char *out_path, const convert_params *params,
                        cellm_error *err) {
    convert_params p = params ? *params : (convert_params){0};
    if (!p.type) p.type = "f16";
    const out_type *direct = NULL;
    for (size_t i = 0; i < sizeof direct_types / sizeof direct_types[0]; i++)
        if (!strcasecmp(p.type, direct_types[i].name)) direct = &direct_types[i];
    const quantize_ftype *qt = direct ? NULL : quantize_ftype_by_name(p.type);
    if (!direct && !qt)
        return err_set(err, CELLM_ERR_INVALID_ARG, "unknown type '%.32s' (f32 f16 bf16 %s)", p.type,
                       quantize_ftype_names());
    conv c = {.dir = dir};
    cellm_status st;
    if ((st = read_json(dir, "config.json", false, &c.cfg, err)) ||
        (st = read_json(dir, "tokenizer.json", true, &c.tok, err)) ||
        (st = read_json(dir, "tokenizer_config.json", true, &c.tok_cfg, err)) ||
        (st = read_config(&c, err)))
        goto done;
    if (!(c.w = gguf_writer_new())) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    /* Quantized types go through an F32 file that quantize_file reads. */
    uint32_t type = direct ? direct->type : QT_F32;
    if ((st = write_hparams(&c, err)) ||
        (st = gguf_writer_set_u32(c.w, "general.file_type", direct ? direct->file_type : 0, err)))
        goto done;
    if (c.tok && (st = write_tokenizer(&c, err))) goto done;
    if ((st = open_shards(&c, err)) || (st = write_tensors(&c, type, &p, err))) goto done;
    if (c.fam->idefics3 && (st = write_projector(&c, out_path, &p, err))) goto done;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.f32-tmp", out_path);
    const char *first = direct ? out_path : tmp;
    if ((st = gguf_writer_write(c.w, first, err))) goto done;
    conv_free(&c);
    memset(&c, 0, sizeof c);
    if (qt) {
        quantize_params qp = {.n_threads = p.n_threads, .progress = p.progress};
        st = quantize_file(tmp, out_path, qt, &qp, NULL, err);
        unlink(tmp);
        if (st) return st;
    }
    /* The check: cellm loads what it wrote, model and tokenizer. */
    model *m = NULL;
    tokenizer *tk = NULL;
    cellm_error lerr;
    if (model_load(out_path, &m, &lerr) != CELLM_OK ||
        (gguf_find_key(m->file, "tokenizer.ggml.model") &&
         tokenizer_load(m->file, &tk, &lerr) != CELLM_OK)) {
        model_free(m);
        unlink(out_path);
        return err_set(err, lerr.code, "the converted file does not load: %s", lerr.msg);
    }
    tokenizer_free(tk);
    model_free(m);
    return CELLM_OK;
done:
    conv_free(&c);
    return st;
}

/* ---- the command ---- */

static void usage(FILE *out) {
    fprintf(out,
            "usage: cellm convert HF_DIR OUT.gguf [--type TYPE] [--threads N] [--mmproj FILE]\n\n"
            "Converts a Hugging Face checkpoint folder (config.json, *.safetensors,\n"
            "tokenizer.json, tokenizer_config.json) into a GGUF file that cellm and\n"
            "llama.cpp run. Families: Llama, Mistral, Qwen 2/2.5, Qwen 3, Phi-3, Granite.\n"
            "  --type TYPE   f16 (default), f32, bf16, or a quantized type:\n"
            "                %s\n"
            "  --threads N   threads quantizing each tensor (default 2)\n"
            "  --mmproj FILE a vision-language folder's (SmolVLM / Idefics3) projector\n"
            "                file (default mmproj-OUT.gguf beside OUT.gguf)\n",
            quantize_ftype_names());
}

int cmd_convert(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0;
    convert_params p = {.type = "f16", .n_threads = 2, .progress = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--type")) {
            if (i + 1 >= argc) {
                cli_error("--type needs a type (see `cellm convert --help`)");
                return 2;
            }
            p.type = argv[++i];
        } else if (!strcmp(a, "--mmproj")) {
            if (i + 1 >= argc) {
                cli_error("--mmproj needs the projector file to write");
                return 2;
            }
            p.mmproj = argv[++i];
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (i + 1 >= argc || !cli_parse_uint(argv[++i], 64, &v) || v == 0) {
                cli_error("--threads needs a count from 1 to 64");
                return 2;
            }
            p.n_threads = (unsigned)v;
        } else if (a[0] == '-' && a[1] != '\0') {
            cli_error("convert: unknown option '%s' (see `cellm convert --help`)", a);
            return 2;
        } else if (n_pos < 2) {
            pos[n_pos++] = a;
        } else {
            cli_error("convert: too many arguments ('%s')", a);
            return 2;
        }
    }
    if (n_pos != 2) {
        usage(stderr);
        return 2;
    }
    cellm_error err;
    if (convert_hf(pos[0], pos[1], &p, &err) != CELLM_OK) {
        if (p.progress && isatty(STDERR_FILENO)) fputc('\n', stderr);
        cli_error("convert: %s", err.msg);
        return 1;
    }
    printf("wrote %s (%s)\n", pos[1], p.type);
    return 0;
}
