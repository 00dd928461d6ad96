/*
 * model.c — the architecture table and model loading (see model.h).
 *
 * Each architecture is one row: its RoPE pairing, MLP activation, whether it
 * scales embeddings, and its fixed sliding-window pattern. Everything else
 * comes from the file's metadata (`ARCH.*` keys: windows, granite's
 * multipliers, LongRoPE's attention factor) and from which tensors are
 * present (Q/K/V biases, QK-norm, post-norms, a separate output matrix,
 * fused QKV or gate/up matrices, RoPE factors, experts), so one forward
 * pass serves every row. Tensor names and keys are those llama.cpp's
 * converter writes.
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/xmath.h"
#include "format/quant.h"

typedef struct arch_row {
    const char *name;
    rope_kind rope;
    mlp_act act;
    bool emb_scale_sqrt;   /* embeddings times sqrt(n_embd) */
    int32_t swa_period;    /* with a window: every period-th layer is global */
    float rope_base_local; /* RoPE base of windowed layers; 0: the global base */
    int32_t nope_period;   /* every period-th layer has no RoPE (smollm3); 0: none */
    bool moe;              /* a mixture of experts in every layer */
    bool moe_norm_topk;    /* the chosen experts' softmax weights renormalised */
} arch_row;

static const arch_row arch_table[] = {
    /* llama also covers Mistral (with ARCH.attention.sliding_window) */
    {"llama", ROPE_NORM, ACT_SILU, false, 0, 0, 0, false, false},
    {"gemma3", ROPE_NEOX, ACT_GELU_TANH, true, 6, 10000.0f, 0, false, false},
    {"qwen2", ROPE_NEOX, ACT_SILU, false, 0, 0, 0, false, false},   /* Q/K/V biases */
    {"qwen3", ROPE_NEOX, ACT_SILU, false, 0, 0, 0, false, false},   /* QK-norm */
    {"phi3", ROPE_NEOX, ACT_SILU, false, 0, 0, 0, false, false},    /* fused QKV and gate/up */
    {"granite", ROPE_NORM, ACT_SILU, false, 0, 0, 0, false, false}, /* the four scales */
    {"smollm3", ROPE_NORM, ACT_SILU, false, 0, 0, 4, false, false}, /* NoPE every 4th layer */
    /* Mixtures of experts: softmax over the router's logits, the top k;
     * llama.cpp renormalises them for qwen3moe and granitemoe, not olmoe. */
    {"qwen3moe", ROPE_NEOX, ACT_SILU, false, 0, 0, 0, true, true},   /* QK-norm per head */
    {"olmoe", ROPE_NEOX, ACT_SILU, false, 0, 0, 0, true, false},     /* QK-norm over all heads */
    {"granitemoe", ROPE_NORM, ACT_SILU, false, 0, 0, 0, true, true}, /* granite's scales */
    /* Short-convolution layers where attention.head_count_kv[il] is 0. */
    {"lfm2", ROPE_NEOX, ACT_SILU, false, 0, 0, 0, false, false},
};

#define ARCH_NAMES                                                                                 \
    "llama, gemma3, qwen2, qwen3, phi3, granite, smollm3, qwen3moe, olmoe, granitemoe"

static const arch_row *arch_find(const char *name) {
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (!strcmp(arch_table[i].name, name)) return &arch_table[i];
    return NULL;
}

static bool meta_u32(const gguf_file *f, const char *arch, const char *suffix, int32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t v;
    if (!gguf_get_uint(f, key, &v) || v > INT32_MAX) return false;
    *out = (int32_t)v;
    return true;
}

static bool meta_f32(const gguf_file *f, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    if (!gguf_get_float(f, key, &v)) return false;
    *out = (float)v;
    return true;
}

/* Finds tensor `name` and checks its shape is [ne0, ne1, ne2] (ne1 = 0: a
 * vector) and that it can be used as asked: a matrix needs a vec_dot and a
 * dequantizer, a vector must be F32. A stack of ne2 matrices (experts)
 * becomes one matrix of ne1 * ne2 rows. Missing and optional: data stays
 * NULL. */
static cellm_status get_stack(const gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                              int64_t ne2, bool optional, weight *w, cellm_error *err) {
    memset(w, 0, sizeof *w);
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) {
        if (optional) return CELLM_OK;
        return err_set(err, CELLM_ERR_FORMAT, "tensor '%s' is missing", name);
    }
    bool vec = ne1 == 0;
    uint64_t want1 = vec ? 1 : (uint64_t)ne1;
    if (t->ne[0] != (uint64_t)ne0 || t->ne[1] != want1 || t->ne[2] != (uint64_t)ne2 ||
        t->ne[3] != 1)
        return err_set(
            err, CELLM_ERR_FORMAT,
            "tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%lld, %lld, %lld]", name,
            (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
            (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], (long long)ne0,
            (long long)want1, (long long)ne2);
    const quant_type_info *qi = quant_type_get(t->type);
    if (vec) {
        if (t->type != QT_F32)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "tensor '%s' is %s; norm weights must be F32", name, qi->name);
    } else {
        if (!qi->vec_dot || !qi->to_float)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "tensor '%s' has type %s, which cellm cannot compute with yet", name,
                           qi->name);
        const quant_type_info *vt = quant_type_get(qi->vec_dot_type);
        if (ne0 % vt->block_size)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "tensor '%s': rows of %lld are not whole %s blocks", name,
                           (long long)ne0, vt->name);
    }
    w->data = t->data;
    w->type = t->type;
    w->ne0 = ne0;
    w->ne1 = vec ? 1 : ne1 * ne2;
    return CELLM_OK;
}

static cellm_status get_weight(const gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                               bool optional, weight *w, cellm_error *err) {
    return get_stack(f, name, ne0, ne1, 1, optional, w, err);
}

/* Rows [row0, row0 + n) of matrix `w`, as a matrix of its own. */
static weight row_view(const weight *w, int64_t row0, int64_t n) {
    const quant_type_info *qi = quant_type_get(w->type);
    size_t row_bytes = (size_t)(w->ne0 / qi->block_size) * qi->type_size;
    weight v = *w;
    v.data = (const uint8_t *)w->data + (size_t)row0 * row_bytes;
    v.ne1 = n;
    return v;
}

weight model_expert(const weight *stacked, int32_t n_expert, int32_t e) {
    int64_t rows = stacked->ne1 / n_expert;
    return row_view(stacked, (int64_t)e * rows, rows);
}

static cellm_status load_layer(const gguf_file *f, model *m, int il, cellm_error *err) {
    layer_desc *L = &m->layers[il];
    int64_t d = m->n_embd, qd = (int64_t)m->n_head * m->head_dim,
            kd = (int64_t)m->n_head_kv * m->head_dim, vd = (int64_t)m->n_head_kv * m->head_dim_v;
    char name[96];
    cellm_status st;
#define W(field, suffix, ne0, ne1, opt)                                                            \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d." suffix ".weight", il);                               \
        if ((st = get_weight(f, name, ne0, ne1, opt, &L->field, err))) return st;                  \
    } while (0)
    W(attn_norm, "attn_norm", d, 0, false);
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
    if (L->is_conv) {
        W(conv_in, "shortconv.in_proj", d, 3 * d, false);
        W(conv_out, "shortconv.out_proj", d, d, false);
        W(conv_k, "shortconv.conv", m->conv_l, d, false);
        if (L->conv_k.type != QT_F32)
            return err_set(err, CELLM_ERR_UNSUPPORTED, "tensor 'blk.%d.shortconv.conv' must be F32",
                           il);
    } else if (gguf_find_tensor(f, name)) {
        /* Fused QKV (phi3): Q, K and V are consecutive rows of one matrix. */
        weight qkv;
        if ((st = get_weight(f, name, d, qd + kd + vd, false, &qkv, err))) return st;
        L->wq = row_view(&qkv, 0, qd);
        L->wk = row_view(&qkv, qd, kd);
        L->wv = row_view(&qkv, qd + kd, vd);
    } else {
        W(wq, "attn_q", d, qd, false);
        W(wk, "attn_k", d, kd, false);
        W(wv, "attn_v", d, vd, false);
    }
    if (!L->is_conv) {
#define B(field, suffix, n)                                                                        \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d." suffix ".bias", il);                                 \
        if ((st = get_weight(f, name, n, 0, true, &L->field, err))) return st;                     \
    } while (0)
        B(bq, "attn_q", qd);
        B(bk, "attn_k", kd);
        B(bv, "attn_v", vd);
#undef B
        W(wo, "attn_output", qd, d, false);
        snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", il);
        const gguf_tensor *qn = gguf_find_tensor(f, name);
        /* OLMoE normalises Q and K across all heads at once. */
        L->qk_norm_full = qn && qn->ne[0] == (uint64_t)qd && qd != m->head_dim;
        W(q_norm, "attn_q_norm", L->qk_norm_full ? qd : m->head_dim, 0, true);
        W(k_norm, "attn_k_norm", L->qk_norm_full ? kd : m->head_dim, 0, true);
    }
    W(post_attn_norm, "post_attention_norm", d, 0, true);
    W(ffn_norm, "ffn_norm", d, 0, false);
    snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", il);
    if (m->n_expert) {
        int64_t ne = m->n_expert, ff = m->n_ff_exp;
#define X(field, suffix, ne0, ne1)                                                                 \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d." suffix ".weight", il);                               \
        if ((st = get_stack(f, name, ne0, ne1, ne, false, &L->field, err))) return st;             \
    } while (0)
        W(ffn_gate_inp, "ffn_gate_inp", d, ne, false);
        X(gate_exps, "ffn_gate_exps", d, ff);
        X(up_exps, "ffn_up_exps", d, ff);
        X(down_exps, "ffn_down_exps", ff, d);
#undef X
    } else if (gguf_find_tensor(f, name)) {
        W(w_gate, "ffn_gate", d, m->n_ff, false);
        W(w_up, "ffn_up", d, m->n_ff, false);
    } else {
        /* Fused gate/up (phi3): the gate's rows, then the up rows. */
        weight gu;
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", il);
        if ((st = get_weight(f, name, d, 2 * (int64_t)m->n_ff, false, &gu, err))) return st;
        L->w_gate = row_view(&gu, 0, m->n_ff);
        L->w_up = row_view(&gu, m->n_ff, m->n_ff);
    }
    if (!m->n_expert) W(w_down, "ffn_down", m->n_ff, d, false);
    W(post_ffn_norm, "post_ffw_norm", d, 0, true);
#undef W
    return CELLM_OK;
}

cellm_status model_load(const char *path, model **out, cellm_error *err) {
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    cellm_status st = gguf_open(path, &m->file, err);
    if (st) {
        free(m);
        return st;
    }
    const gguf_file *f = m->file;
    gguf_str s;
    if (!gguf_get_str(f, "general.architecture", &s) || s.len == 0 || s.len >= sizeof m->arch) {
        st =
            err_set(err, CELLM_ERR_FORMAT, "%s: general.architecture is missing or too long", path);
        goto fail;
    }
    memcpy(m->arch, s.ptr, (size_t)s.len);
    const arch_row *ar = arch_find(m->arch);
    if (!ar) {
        st = err_set(err, CELLM_ERR_UNSUPPORTED,
                     "%s: architecture '%s' is not supported (cellm knows: " ARCH_NAMES ")", path,
                     m->arch);
        goto fail;
    }
    const char *a = m->arch;
    if (!meta_u32(f, a, "embedding_length", &m->n_embd) ||
        !meta_u32(f, a, "block_count", &m->n_layer) ||
        !meta_u32(f, a, "feed_forward_length", &m->n_ff) ||
        !meta_u32(f, a, "attention.head_count", &m->n_head)) {
        st = err_set(err, CELLM_ERR_FORMAT,
                     "%s: %s.embedding_length, block_count, feed_forward_length or "
                     "attention.head_count is missing",
                     path, a);
        goto fail;
    }
    if (!meta_u32(f, a, "attention.head_count_kv", &m->n_head_kv)) m->n_head_kv = m->n_head;
    /* lfm2 gives KV heads per layer: 0 for its short-convolution layers. */
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
    const gguf_value *hkv = gguf_get_arr(f, key);
    if (hkv) {
        m->n_head_kv = 0;
        for (uint64_t i = 0; i < hkv->v.arr.n; i++) {
            int64_t v;
            if (!gguf_arr_get_int(hkv, i, &v) || v < 0 || v > 4096 ||
                (v && m->n_head_kv && v != m->n_head_kv)) {
                st = err_set(err, CELLM_ERR_FORMAT,
                             "%s: %s[%llu] is not a KV head count shared by every attention layer",
                             path, key, (unsigned long long)i);
                goto fail;
            }
            if (v) m->n_head_kv = (int32_t)v;
        }
        if (hkv->v.arr.n != (uint64_t)m->n_layer) {
            st = err_set(err, CELLM_ERR_FORMAT, "%s: %s has %llu values for %d layers", path, key,
                         (unsigned long long)hkv->v.arr.n, m->n_layer);
            goto fail;
        }
    }
    if (!meta_u32(f, a, "context_length", &m->n_ctx_train)) m->n_ctx_train = 2048;
    if (m->n_embd <= 0 || m->n_layer <= 0 || m->n_layer > 4096 || m->n_head <= 0 ||
        m->n_head_kv <= 0 || m->n_head % m->n_head_kv != 0 || m->n_ff <= 0) {
        st = err_set(err, CELLM_ERR_FORMAT,
                     "%s: inconsistent sizes (embedding %d, layers %d, heads %d/%d, ff %d)", path,
                     m->n_embd, m->n_layer, m->n_head, m->n_head_kv, m->n_ff);
        goto fail;
    }
    if (!meta_u32(f, a, "attention.key_length", &m->head_dim)) m->head_dim = m->n_embd / m->n_head;
    if (!meta_u32(f, a, "attention.value_length", &m->head_dim_v)) m->head_dim_v = m->head_dim;
    if (m->head_dim <= 0 || m->head_dim > 1024 || m->head_dim % 2 || m->head_dim_v <= 0 ||
        m->head_dim_v > 1024) {
        st = err_set(err, CELLM_ERR_FORMAT, "%s: head size %d/%d is not supported", path,
                     m->head_dim, m->head_dim_v);
        goto fail;
    }
    if (!meta_f32(f, a, "attention.layer_norm_rms_epsilon", &m->norm_eps)) m->norm_eps = 1e-5f;
    float base = 10000.0f;
    meta_f32(f, a, "rope.freq_base", &base);
    if (!meta_u32(f, a, "rope.dimension_count", &m->rope_dim)) m->rope_dim = m->head_dim;
    if (m->rope_dim <= 0 || m->rope_dim > m->head_dim || m->rope_dim % 2) {
        st = err_set(err, CELLM_ERR_FORMAT, "%s: rope.dimension_count %d does not fit head size %d",
                     path, m->rope_dim, m->head_dim);
        goto fail;
    }
    m->rope = ar->rope;
    m->rope_freq_scale = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    /* LongRoPE is its factor tensors and attention factor, read below. */
    if (gguf_get_str(f, key, &s) && !gguf_str_eq(s, "none") &&
        !(gguf_str_eq(s, "longrope") && gguf_find_tensor(f, "rope_factors_short.weight"))) {
        float factor = 1.0f;
        if (!gguf_str_eq(s, "linear") || !meta_f32(f, a, "rope.scaling.factor", &factor) ||
            !(factor > 0)) {
            st = err_set(err, CELLM_ERR_UNSUPPORTED,
                         "%s: RoPE scaling '%.*s' is not supported (linear, longrope)", path,
                         (int)(s.len < 32 ? s.len : 32), s.ptr);
            goto fail;
        }
        m->rope_freq_scale = 1.0f / factor;
    }
    /* Per-pair frequency divisors: llama 3.1's rope_freqs, or phi3's
     * LongRoPE factors. cellm uses the short factors, which transformers
     * and llama.cpp use up to the original context length; past it they
     * switch to the long ones (not done here). */
    const gguf_tensor *rf = gguf_find_tensor(f, "rope_freqs.weight");
    if (!rf) rf = gguf_find_tensor(f, "rope_factors_short.weight");
    if (rf) {
        if (rf->type != QT_F32 || rf->n_elems != (uint64_t)m->rope_dim / 2) {
            st = err_set(err, CELLM_ERR_FORMAT, "%s: %.*s must be %d F32 values", path,
                         (int)rf->name.len, rf->name.ptr, m->rope_dim / 2);
            goto fail;
        }
        m->rope_freqs = rf->data;
    }
    m->rope_mscale = 1.0f;
    if (meta_f32(f, a, "rope.scaling.attn_factor", &m->rope_mscale) &&
        !(m->rope_mscale > 0 && m->rope_mscale < 100)) {
        st = err_set(err, CELLM_ERR_FORMAT, "%s: %s.rope.scaling.attn_factor %g is out of range",
                     path, a, (double)m->rope_mscale);
        goto fail;
    }
    m->act = ar->act;
    if (ar->moe) {
        if (!meta_u32(f, a, "expert_count", &m->n_expert) ||
            !meta_u32(f, a, "expert_used_count", &m->n_expert_used) || m->n_expert < 1 ||
            m->n_expert > 1024 || m->n_expert_used < 1 || m->n_expert_used > m->n_expert) {
            st = err_set(err, CELLM_ERR_FORMAT,
                         "%s: %s.expert_count and expert_used_count are missing or out of range "
                         "(1 <= used <= count <= 1024)",
                         path, a);
            goto fail;
        }
        /* qwen3moe keeps the experts' size apart from feed_forward_length. */
        if (!meta_u32(f, a, "expert_feed_forward_length", &m->n_ff_exp)) m->n_ff_exp = m->n_ff;
        if (m->n_ff_exp <= 0) {
            st = err_set(err, CELLM_ERR_FORMAT, "%s: expert size %d", path, m->n_ff_exp);
            goto fail;
        }
        m->moe_norm_topk = ar->moe_norm_topk;
    }
    m->emb_scale = ar->emb_scale_sqrt ? sqrtf((float)m->n_embd) : 1.0f;
    m->attn_scale = 1.0f / sqrtf((float)m->head_dim);
    /* Granite's multipliers; llama.cpp stores the logit divisor. */
    float logit_div = 1.0f;
    m->residual_scale = 1.0f;
    meta_f32(f, a, "embedding_scale", &m->emb_scale);
    meta_f32(f, a, "attention.scale", &m->attn_scale);
    meta_f32(f, a, "residual_scale", &m->residual_scale);
    meta_f32(f, a, "logit_scale", &logit_div);
    if (!isfinite(m->emb_scale) || !isfinite(m->attn_scale) || !isfinite(m->residual_scale) ||
        !isfinite(logit_div) || logit_div == 0) {
        st = err_set(err, CELLM_ERR_FORMAT,
                     "%s: embedding_scale, attention.scale, residual_scale or logit_scale is not "
                     "a usable number",
                     path);
        goto fail;
    }
    m->logit_scale = 1.0f / logit_div;
    meta_f32(f, a, "attn_logit_softcapping", &m->attn_softcap);
    meta_f32(f, a, "final_logit_softcapping", &m->logit_softcap);

    const gguf_value *toks = gguf_get_arr(f, "tokenizer.ggml.tokens");
    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te) {
        st = err_set(err, CELLM_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", path);
        goto fail;
    }
    m->n_vocab = (int32_t)te->ne[1];
    if (toks && toks->v.arr.n != te->ne[1]) {
        st = err_set(err, CELLM_ERR_FORMAT,
                     "%s: the vocabulary has %llu tokens but token_embd.weight has %llu rows", path,
                     (unsigned long long)toks->v.arr.n, (unsigned long long)te->ne[1]);
        goto fail;
    }
    if ((st = get_weight(f, "token_embd.weight", m->n_embd, m->n_vocab, false, &m->tok_embd, err)))
        goto fail;
    /* lfm2's final norm has llama.cpp's name token_embd_norm. */
    const char *out_norm = gguf_find_tensor(f, "output_norm.weight") || strcmp(a, "lfm2")
                               ? "output_norm.weight"
                               : "token_embd_norm.weight";
    if ((st = get_weight(f, out_norm, m->n_embd, 0, false, &m->out_norm, err))) goto fail;
    if ((st = get_weight(f, "output.weight", m->n_embd, m->n_vocab, true, &m->output, err)))
        goto fail;
    if (!m->output.data) m->output = m->tok_embd; /* tied */

    int32_t window = 0;
    meta_u32(f, a, "attention.sliding_window", &window);
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    m->n_kv_groups = 1;
    for (int il = 0; il < m->n_layer; il++) {
        layer_desc *L = &m->layers[il];
        int64_t nkv = 1;
        L->is_conv = hkv && gguf_arr_get_int(hkv, (uint64_t)il, &nkv) && nkv == 0;
        if (L->is_conv && !m->conv_l &&
            (!meta_u32(f, a, "shortconv.l_cache", &m->conv_l) || m->conv_l < 2 || m->conv_l > 64)) {
            st = err_set(err, CELLM_ERR_FORMAT,
                         "%s: %s.shortconv.l_cache is missing or not in 2..64", path, a);
            goto fail;
        }
        if (L->is_conv) L->conv_index = m->n_conv_layers++;
        if ((st = load_layer(f, m, il, err))) goto fail;
        if (L->is_conv) continue; /* no RoPE, no KV */
        bool local = window > 0 && (ar->swa_period == 0 || (il + 1) % ar->swa_period != 0);
        L->window = local ? window : 0;
        L->rope_base = local && ar->rope_base_local > 0 ? ar->rope_base_local : base;
        L->nope = ar->nope_period && (il + 1) % ar->nope_period == 0;
        /* Gemma 3's windowed layers keep their own RoPE, unscaled. */
        L->rope_scale = local && ar->rope_base_local > 0 ? 1.0f : m->rope_freq_scale;
        /* Windowed layers keep their own block table, so blocks that left
         * the window can be freed for them alone. */
        L->kv_group = local && ar->swa_period ? 1 : 0;
        if (L->kv_group) m->n_kv_groups = 2;
        L->kv_index = m->kv_group_layers[L->kv_group]++;
        m->kv_group_window[L->kv_group] = L->window;
    }
    *out = m;
    return CELLM_OK;
fail:
    model_free(m);
    return st;
}

void model_free(model *m) {
    if (!m) return;
    free(m->layers);
    gguf_close(m->file);
    free(m);
}

/* Computed as ggml does, so rotations match llama.cpp's to the last bit of
 * theta. */
void model_rope_angles(const model *m, int32_t pos, float base, float scale, float *cs, float *sn) {
    float theta_scale = xm_powf(base, -2.0f / (float)m->rope_dim);
    float theta = (float)pos;
    for (int32_t i = 0; i < m->rope_dim / 2; i++) {
        float ff = m->rope_freqs ? m->rope_freqs[i] : 1.0f;
        float t = scale * (theta / ff);
        xm_sincosf(t, &sn[i], &cs[i]);
        cs[i] *= m->rope_mscale;
        sn[i] *= m->rope_mscale;
        theta *= theta_scale;
    }
}
