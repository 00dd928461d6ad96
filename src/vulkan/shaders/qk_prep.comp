#version 450
#extension GL_GOOGLE_include_directive : require
// qk_prep.comp — everything between the Q/K/V matmuls and attention, one
// workgroup per (row, head slot): slots [0, n_head) are query heads,
// [n_head, n_head + n_head_kv) key/value heads. Per head: the bias, the
// per-head RMSNorm (QK-norm), RoPE with the row's cos/sin (computed on the
// host as the CPU backend computes them), and for a key/value head the
// store of K and V into the row's KV block as f16, at the row's position,
// through its sequence's block table (qk_prep.glsl). The KV binding is this
// layer's slice of the pool: per block, K of 16 positions then V of 16
// (vk_forward.c). Batches where each sequence has one row (decode) skip this
// dispatch: attention.comp does the same there.
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 3) readonly buffer B { float bias[]; };   // bq | bk | bv
layout(std430, set = 0, binding = 4) readonly buffer N { float norm[]; };   // q_norm | k_norm
layout(std430, set = 0, binding = 5) readonly buffer R { float rope[]; };   // [row][cfg][pairs][cos, sin]
layout(std430, set = 0, binding = 6) readonly buffer RI { ivec4 rowinfo[]; }; // pos, table g0, table g1, 0
layout(std430, set = 0, binding = 7) readonly buffer T { int tables[]; };
layout(std430, set = 0, binding = 8) buffer KV { uint kv[]; };

layout(push_constant) uniform P {
    uint n_head, n_head_kv, hd, hdv;
    uint rope_pairs;     // rope_dim / 2; 0: no RoPE in this layer
    uint rope_neox;      // 1: rotate halves, 0: adjacent pairs
    uint rope_cfg;       // which of the row's cos/sin sets
    uint rope_cfgs;      // sets per row
    uint flags;          // 1: biases, 2: per-head QK-norm
    float eps;
    uint group;          // the layer's KV group: which table
    uint k_row_words;    // one position's K (all heads), in 32-bit words
    uint v_row_words;
    uint block_words;    // one block of this layer: 16 K rows then 16 V rows
} p;

shared float hs[512];
shared float part[64];
#define PREP_HS hs
#define PREP_PART part
#include "qk_prep.glsl"

void main() {
    uint r = gl_WorkGroupID.x, slot = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    bool is_q = slot < p.n_head;
    uint h = is_q ? slot : slot - p.n_head;
    prep_head(true, t, 0u, 0u, r, h, is_q);
    if (is_q) {
        uint base = r * p.n_head * p.hd + h * p.hd;
        for (uint i = t; i < p.hd; i += 64u) q[base + i] = hs[i];
        return;
    }
    ivec4 ri = rowinfo[r];
    int pos = ri.x;
    int blk = tables[(p.group == 0u ? ri.y : ri.z) + pos / 16];
    store_kv(true, t, 64u, 0u, r, h, blk, pos);
}
