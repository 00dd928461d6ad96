/*
 * model.h — a decoder model: the architecture table turns a GGUF file's
 * metadata and tensor names into one description (hyperparameters, and per
 * layer the weights and the few named differences: norms, RoPE base, window)
 * that the forward pass reads. Weights stay in the file's map.
 */
#ifndef CELLM_MODEL_H
#define CELLM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"
#include "base/util.h"

typedef enum rope_kind {
    ROPE_NORM, /* rotate adjacent pairs (x[2i], x[2i+1]): llama */
    ROPE_NEOX  /* rotate halves (x[i], x[i + d/2]): gemma, qwen, ... */
} rope_kind;

typedef enum mlp_act {
    ACT_SILU,     /* SwiGLU: silu(gate) * up */
    ACT_GELU_TANH /* GeGLU with the tanh approximation */
} mlp_act;

/* A weight matrix or vector in the map. */
typedef struct weight {
    const void *data;
    uint32_t type;
    int64_t ne0, ne1; /* ne0: elements per row (input size), ne1: rows */
} weight;

typedef struct layer_desc {
    weight attn_norm, wq, wk, wv, wo;
    weight bq, bk, bv;     /* Q/K/V biases (qwen2); data NULL when absent */
    weight q_norm, k_norm; /* RMSNorm of Q and K, per head (or over all heads when
                            * qk_norm_full); data NULL when absent */
    bool qk_norm_full;     /* q_norm/k_norm span all heads at once (olmoe) */
    bool nope;             /* no RoPE in this layer (smollm3's every 4th) */
    weight post_attn_norm; /* norm of the attention output before the residual */
    weight ffn_norm, w_gate, w_up, w_down;
    weight post_ffn_norm; /* norm of the MLP output before the residual */
    /* Mixture of experts (data NULL for a dense MLP): the router, and each
     * expert's gate, up and down matrices stacked (expert e's rows are
     * [e * rows, (e + 1) * rows) of a matrix of n_expert * rows rows). */
    weight ffn_gate_inp, gate_exps, up_exps, down_exps;
    /* A short-convolution block in place of attention (lfm2): in_proj
     * gives B, C and x; C * conv(B * x) goes through out_proj. conv_k holds
     * each channel's conv_l weights (F32, [conv_l, n_embd]). */
    bool is_conv;
    int32_t conv_index; /* the layer's index among the conv layers */
    weight conv_in, conv_k, conv_out;
    float rope_base;  /* frequency base of this layer */
    float rope_scale; /* position scale of this layer (1 / linear scaling factor) */
    int32_t window;   /* sliding window in tokens; 0: full attention */
    int32_t kv_group; /* which KV block table the layer uses */
    int32_t kv_index; /* the layer's index within its KV group */
} layer_desc;

typedef struct model {
    gguf_file *file;
    char arch[32];
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v, n_ff;
    int32_t n_ctx_train;
    float norm_eps;
    rope_kind rope;
    int32_t rope_dim;        /* leading dimensions of each head that RoPE rotates */
    float rope_freq_scale;   /* 1 / linear scaling factor (of the global layers, for gemma3) */
    const float *rope_freqs; /* per-pair frequency divisors (llama 3.1, phi3 LongRoPE), or NULL */
    float rope_mscale;       /* multiplies RoPE's cos and sin (phi3 LongRoPE); 1 for none */
    float emb_scale;         /* multiplies the token embedding; 1 for none */
    float attn_scale;        /* multiplies Q·K */
    float residual_scale;    /* multiplies each block's output before the residual; 1 for none */
    float logit_scale;       /* multiplies the final logits; 1 for none */
    float attn_softcap;      /* tanh soft-capping of attention scores; 0: none */
    float logit_softcap;     /* tanh soft-capping of the final logits; 0: none */
    mlp_act act;
    int32_t n_expert, n_expert_used;   /* mixture of experts; 0 when dense */
    int32_t n_ff_exp;                  /* rows of each expert's gate and up */
    bool moe_norm_topk;                /* the chosen experts' weights renormalised to sum 1 */
    int32_t conv_l;                    /* short convolutions' width (lfm2); 0: none */
    int32_t n_conv_layers;             /* each keeps conv_l - 1 inputs per sequence */
    weight tok_embd, out_norm, output; /* output may be tok_embd (tied) */
    layer_desc *layers;
    int32_t n_kv_groups;        /* 1, or 2 when some layers use a window */
    int32_t kv_group_window[2]; /* window of each group (0: full) */
    int32_t kv_group_layers[2]; /* layers in each group */
} model;

/* Loads the model at `path` (maps the file). Unknown architectures, missing
 * or misshapen tensors and unsupported options are errors naming what is
 * wrong. Free with model_free(). */
cellm_status model_load(const char *path, model **out, cellm_error *err);

/* Expert e's rows of a stacked expert matrix, as a matrix of its own (a
 * view into the map). */
weight model_expert(const weight *stacked, int32_t n_expert, int32_t e);

/* The cos and sin of each of the rope_dim / 2 rotated pairs of a head at
 * position `pos`, for a layer of RoPE base `base` and position scale
 * `scale`, into cs[] and sn[]: computed as ggml computes them (theta
 * multiplied by base^(-2/d) pair after pair, in float), with xmath.h's pow,
 * sin and cos, so they are the same bits on every CPU, for every backend. */
void model_rope_angles(const model *m, int32_t pos, float base, float scale, float *cs, float *sn);
void model_free(model *m);

#endif /* CELLM_MODEL_H */
