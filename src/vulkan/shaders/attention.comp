#version 450
// attention.comp — one workgroup per (row, query head): attention of the
// row's query over its sequence's positions lo..pos (lo from the layer's
// window), read from the paged KV cache (f16) through the block table.
// Rounding follows the CPU backend (cpu/forward.c): Q rounded to f16 like
// the keys it meets, scores times attn_scale, soft-capped where the model
// has it, softmax in f32, the probabilities rounded to f16 before they
// weight V. Two passes over the keys: the first finds the maximum and the
// sum (each lane keeps a running pair, merged in a fixed tree), the second
// weights the values, a tile of 64 positions at a time, in position order.
// The work of a (row, head) is fixed by its inputs alone, so the result
// does not depend on the batch.
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer RI { ivec4 rowinfo[]; };
layout(std430, set = 0, binding = 2) readonly buffer T { int tables[]; };
layout(std430, set = 0, binding = 3) readonly buffer KV { uint kv[]; };
layout(std430, set = 0, binding = 4) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n_head, n_head_kv, hd, hdv;
    int window;        // 0: full attention
    float scale;       // attn_scale
    float softcap;     // 0: none
    uint group;        // which table of the row
    uint k_row_words;  // the KV binding is the layer's slice: per block,
    uint v_row_words;  // 16 K rows then 16 V rows, block_words in all
    uint block_words;
} p;

shared float qs[512];
shared float wm[64], wl[64];
shared float ws[64];

float f16(float v) {
    return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x;
}

int table_base;

uint block_at(int pos) {
    return uint(tables[table_base + pos / 16]) * p.block_words;
}

float score(int pos, uint kvh) {
    uint at = block_at(pos) + uint(pos % 16) * p.k_row_words + kvh * p.hd / 2u;
    float s = 0.0;
    for (uint i = 0u; i < p.hd / 2u; i++) {
        vec2 kk = unpackHalf2x16(kv[at + i]);
        s += qs[2u * i] * kk.x;
        s += qs[2u * i + 1u] * kk.y;
    }
    s *= p.scale;
    if (p.softcap > 0.0) s = p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0));
    return s;
}

void main() {
    uint r = gl_WorkGroupID.x, h = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    uint kvh = h / (p.n_head / p.n_head_kv);
    ivec4 ri = rowinfo[r];
    int pos = ri.x;
    table_base = p.group == 0u ? ri.y : ri.z;
    int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
    uint qb = (r * p.n_head + h) * p.hd;
    for (uint i = t; i < p.hd; i += 64u) qs[i] = f16(q[qb + i]);
    barrier();

    // Pass 1: the maximum and the sum of exp(score - maximum).
    float m = -1.0 / 0.0, l = 0.0;
    for (int j = lo + int(t); j <= pos; j += 64) {
        float s = score(j, kvh);
        if (s > m) {
            l = l * exp(m - s) + 1.0;
            m = s;
        } else {
            l += exp(s - m);
        }
    }
    wm[t] = m;
    wl[t] = l;
    barrier();
    for (uint w = 32u; w > 0u; w >>= 1) {
        if (t < w) {
            float m1 = wm[t], m2 = wm[t + w];
            float mx = max(m1, m2);
            float l1 = m1 == mx ? wl[t] : wl[t] * exp(m1 - mx);
            float l2 = m2 == mx ? wl[t + w] : wl[t + w] * exp(m2 - mx);
            wm[t] = mx;
            wl[t] = l1 + l2;
        }
        barrier();
    }
    float mx = wm[0], inv = 1.0 / wl[0];

    // Pass 2: the weighted values; lane t owns output dims t, t + 64, ...
    float acc[8];
    for (uint d = 0u; d < 8u; d++) acc[d] = 0.0;
    for (int j0 = lo; j0 <= pos; j0 += 64) {
        int j = j0 + int(t);
        barrier();
        ws[t] = j <= pos ? f16(exp(score(j, kvh) - mx) * inv) : 0.0;
        barrier();
        int cnt = min(64, pos - j0 + 1);
        for (int c = 0; c < cnt; c++) {
            int jp = j0 + c;
            uint at = block_at(jp) + 16u * p.k_row_words + uint(jp % 16) * p.v_row_words +
                      kvh * p.hdv / 2u;
            float wgt = ws[c];
            for (uint d = 0u; d < 8u; d++) {
                uint e = t + d * 64u;
                if (e >= p.hdv) break;
                vec2 vv = unpackHalf2x16(kv[at + e / 2u]);
                acc[d] += wgt * ((e & 1u) == 0u ? vv.x : vv.y);
            }
        }
    }
    uint ob = (r * p.n_head + h) * p.hdv;
    for (uint d = 0u; d < 8u; d++) {
        uint e = t + d * 64u;
        if (e < p.hdv) o[ob + e] = acc[d];
    }
}
