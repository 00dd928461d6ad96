#version 450
// qk_prep.comp — everything between the Q/K/V matmuls and attention, one
// workgroup per (row, head slot): slots [0, n_head) are query heads,
// [n_head, n_head + n_head_kv) key/value heads. Per head: the bias, the
// per-head RMSNorm (QK-norm), RoPE with the row's cos/sin (computed on the
// host as the CPU backend computes them), and for a key/value head the
// store of K and V into the row's KV block as f16, at the row's position,
// through its sequence's block table. The KV binding is this layer's slice
// of the pool: per block, K of 16 positions then V of 16 (vk_forward.c).
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) buffer K { float k[]; };
layout(std430, set = 0, binding = 2) buffer V { float v[]; };
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

shared float hs[1024];
shared float part[64];

void main() {
    uint r = gl_WorkGroupID.x, slot = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    bool is_q = slot < p.n_head;
    uint h = is_q ? slot : slot - p.n_head;
    uint hd = p.hd;
    uint qd = p.n_head * hd, kd = p.n_head_kv * hd, vd = p.n_head_kv * p.hdv;
    uint base = is_q ? r * qd + h * hd : r * kd + h * hd;
    for (uint i = t; i < hd; i += 64u) {
        float x = is_q ? q[base + i] : k[base + i];
        if ((p.flags & 1u) != 0u) x += bias[(is_q ? 0u : qd) + h * hd + i];
        hs[i] = x;
    }
    barrier();
    if ((p.flags & 2u) != 0u) {
        float s = 0.0;
        for (uint i = t; i < hd; i += 64u) s += hs[i] * hs[i];
        part[t] = s;
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) {
            if (t < w) part[t] += part[t + w];
            barrier();
        }
        float scale = 1.0 / sqrt(part[0] / float(hd) + p.eps);
        for (uint i = t; i < hd; i += 64u) hs[i] = hs[i] * scale * norm[(is_q ? 0u : hd) + i];
        barrier();
    }
    if (p.rope_pairs > 0u) {
        uint rb = (r * p.rope_cfgs + p.rope_cfg) * p.rope_pairs * 2u;
        for (uint i = t; i < p.rope_pairs; i += 64u) {
            uint a = p.rope_neox != 0u ? i : 2u * i;
            uint b = p.rope_neox != 0u ? i + p.rope_pairs : 2u * i + 1u;
            float c = rope[rb + 2u * i], s = rope[rb + 2u * i + 1u];
            float x0 = hs[a], x1 = hs[b];
            hs[a] = x0 * c - x1 * s;
            hs[b] = x0 * s + x1 * c;
        }
        barrier();
    }
    if (is_q) {
        for (uint i = t; i < hd; i += 64u) q[base + i] = hs[i];
        return;
    }
    ivec4 ri = rowinfo[r];
    int pos = ri.x;
    int blk = tables[(p.group == 0u ? ri.y : ri.z) + pos / 16];
    uint at = uint(blk) * p.block_words;
    uint kat = at + uint(pos % 16) * p.k_row_words + h * hd / 2u;
    for (uint i = t; i < hd / 2u; i += 64u)
        kv[kat + i] = packHalf2x16(vec2(hs[2u * i], hs[2u * i + 1u]));
    uint vb = r * vd + h * p.hdv;
    uint vat = at + 16u * p.k_row_words + uint(pos % 16) * p.v_row_words + h * p.hdv / 2u;
    for (uint i = t; i < p.hdv / 2u; i += 64u) {
        float v0 = v[vb + 2u * i], v1 = v[vb + 2u * i + 1u];
        if ((p.flags & 1u) != 0u) {
            v0 += bias[qd + kd + h * p.hdv + 2u * i];
            v1 += bias[qd + kd + h * p.hdv + 2u * i + 1u];
        }
        kv[vat + i] = packHalf2x16(vec2(v0, v1));
    }
}
