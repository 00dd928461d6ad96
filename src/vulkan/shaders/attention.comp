#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
// attention.comp — one workgroup per (row, query head): attention of the
// row's query over its sequence's positions lo..pos (lo from the layer's
// window), read from the paged KV cache (f16) through the block table.
// Rounding follows the CPU backend (cpu/forward.c): Q rounded to f16 like
// the keys it meets, scores times attn_scale, soft-capped where the model
// has it, softmax in f32 with the maximum and sum over all positions, the
// probabilities rounded to f16 before they weight V.
//
// The scheme (T = 256 invocations; n = pos - lo + 1 positions):
//  1. Q (as f16) into shared memory; when the n probabilities fit in
//     shared memory (n <= S_MAX) the block table's entries for lo..pos too,
//     so that no later load waits on a table load.
//  2. Scores: invocation t takes positions lo + t, lo + t + T, ..., a whole
//     dot product each (16-byte loads of the key, eight at a time; four
//     partial sums added in a fixed order), keeps a running (maximum, sum
//     of exp) pair and, if n <= S_MAX, the score in shared memory. The T
//     pairs are merged in two fixed levels: 16 invocations merge 16 pairs
//     each, then every invocation merges those 16, in index order.
//  3. Probabilities: each score's invocation turns it into
//     f16(exp(s - max) * (1 / sum)) in place.
//  4. Weighted values: the workgroup is G groups of L = hdv / 8 invocations
//     (rounded up); invocation c of a group owns output dims 8c..8c+7 and
//     reads them as one 16-byte load, so a group reads a V row whole.
//     Position i goes to group i % G; a group adds its positions in
//     increasing order, eight rows loaded before any is added. The G
//     partial outputs go to shared memory and are added in group order.
//  Longer contexts (n > S_MAX) keep step 2's pairs but not the scores;
//  steps 3-4 then run over tiles of S_MAX positions (the tile's scores
//  recomputed, the same bits), position i of a tile going to group i % G.
//
// Every order of additions above depends only on n, lo and the head
// dimensions: not on the batch, the row's place in the grid or the
// device's subgroup size (no subgroup operations; `precise` keeps the
// compiler from reassociating or contracting), so a row's output has the
// same bits in a batch of 1 (decode) as in a batch of thousands (prefill).
// Barriers are few and none is per position: lavapipe (a CPU emulation
// used by CI) pays a coroutine switch per invocation at each.
//
// -DPREFILL builds the module for batches that are not all decode rows
// (the fused form is off there): without the decode form's code, whose
// registers every invocation would hold, and with the KV binding not
// coherent (no row reads what this dispatch writes), so its loads may be
// cached and reordered; it is built with INFLIGHT 2 (below: fewer
// registers, more workgroups at once). The arithmetic is the same code:
// the same bits.
layout(local_size_x = 256) in;

const uint T = 256u;
// Positions whose scores fit in shared memory at once, a multiple of 16.
// Every shared array together stays within 16 KiB (Vulkan's least limit):
// 2 KiB of Q, 2 KiB of merge pairs, S_MAX floats and S_MAX / 16 + 1 table
// entries. A build may set it lower to test the tiled path.
#ifndef S_MAX
#define S_MAX 2880
#endif
const int SMAX = S_MAX;
const int TAB_N = SMAX / 16 + 1;
const uint R1 = 16u; // first merge level: 16 invocations of T / R1 pairs each

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer RI { ivec4 rowinfo[]; };
layout(std430, set = 0, binding = 2) readonly buffer TB { int tables[]; };
#ifdef PREFILL
layout(std430, set = 0, binding = 3) readonly buffer KV { uint kv[]; };
layout(std430, set = 0, binding = 3) readonly buffer KV4 { uvec4 kv4[]; };
#else
// Coherent: the decode form writes the row's own K and V here and then
// reads them back with the rest (through kv4 too).
layout(std430, set = 0, binding = 3) coherent buffer KV { uint kv[]; };
// The same binding as 16-byte words, for rows that start at a multiple of
// 4 words (any head dim that is a multiple of 8; the slice is 256-aligned).
layout(std430, set = 0, binding = 3) coherent readonly buffer KV4 { uvec4 kv4[]; };
#endif
layout(std430, set = 0, binding = 4) writeonly buffer O { float o[]; };
// The decode form's inputs (qk_prep.comp's): K and V rows, biases, QK-norm
// weights, RoPE angles.
layout(std430, set = 0, binding = 5) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 6) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 7) readonly buffer B { float bias[]; };
layout(std430, set = 0, binding = 8) readonly buffer N { float norm[]; };
layout(std430, set = 0, binding = 9) readonly buffer R { float rope[]; };

layout(push_constant) uniform P {
    uint n_head, n_head_kv, hd, hdv;
    int window;        // 0: full attention
    float scale;       // attn_scale
    float softcap;     // 0: none
    uint group;        // which table of the row
    uint k_row_words;  // the KV binding is the layer's slice: per block,
    uint v_row_words;  // 16 K rows then 16 V rows, block_words in all
    uint block_words;
    // The decode form (fused 1: every row of the batch is its sequence's
    // only one, so no row reads another's K/V): qk_prep.comp's settings.
    uint rope_pairs, rope_neox, rope_cfg, rope_cfgs, flags;
    float eps;
    uint fused;
} p;

shared vec4 qs[128];            // Q as f16 values, zero past hd
shared float pm[T], pl[T];      // the invocations' (maximum, sum) pairs
shared int tab[TAB_N];          // block table entries of the positions at hand
// Scores, then probabilities; at the end the groups' partial outputs,
// G * hdv <= 8 T floats (S_MAX is larger unless a test build lowers it).
shared float sc[SMAX > 8 * int(T) ? SMAX : 8 * int(T)];

#ifndef PREFILL
#define PREP_HS sc
#define PREP_PART pm
#include "qk_prep.glsl"
#endif

float f16(float v) {
    return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x;
}

bool wide; // rows start at multiples of 4 words: kv4 may be used

// Four words from word `at`, of which the first nw (>= 1) belong to the
// row; the others read as zero (and are not read).
uvec4 load4(uint at, uint nw) {
    if (wide) return kv4[at >> 2];
    uvec4 w = uvec4(kv[at], 0u, 0u, 0u);
    if (nw > 1u) w.y = kv[at + 1u];
    if (nw > 2u) w.z = kv[at + 2u];
    if (nw > 3u) w.w = kv[at + 3u];
    return w;
}

// Loads a score or a weighted sum requests before it uses any: more keep
// more memory requests in flight, fewer hold fewer registers. The sums'
// order is the same whatever it is.
#ifndef INFLIGHT
#define INFLIGHT 8
#endif
const uint NF = INFLIGHT;

// The score of the key row whose head starts at word `at`.
float score(uint at) {
    uint nw = p.hd / 2u;
    precise vec4 a = vec4(0.0);
    for (uint c0 = 0u; 4u * c0 < nw; c0 += NF) {
        // Up to NF * 8 dims (NF loads of 16 bytes) requested before any is
        // used.
        uvec4 w[NF];
        [[unroll]] for (uint u = 0u; u < NF; u++) {
            uint c = c0 + u;
            w[u] = uvec4(0u);
            if (4u * c < nw) w[u] = load4(at + 4u * c, nw - 4u * c);
        }
        [[unroll]] for (uint u = 0u; u < NF; u++) {
            uint c = c0 + u;
            if (4u * c < nw) {
                a = fma(qs[2u * c], vec4(unpackHalf2x16(w[u].x), unpackHalf2x16(w[u].y)), a);
                a = fma(qs[2u * c + 1u], vec4(unpackHalf2x16(w[u].z), unpackHalf2x16(w[u].w)), a);
            }
        }
    }
    precise float s = ((a.x + a.y) + (a.z + a.w)) * p.scale;
    if (p.softcap > 0.0) s = p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0));
    return s;
}

// Merges the pairs pm/pl[at + k * stride], k < cnt, into (m, l), in index
// order. The exps do not depend on one another, so they overlap; only the
// sum is a chain.
void merge(uint at, uint stride, uint cnt, out float m, out float l) {
    m = -1.0 / 0.0;
    for (uint k = 0u; k < cnt; k++) m = max(m, pm[at + k * stride]);
    precise float sum = 0.0;
    for (uint k = 0u; k < cnt; k++) {
        float mk = pm[at + k * stride], lk = pl[at + k * stride];
        // Equal maxima (-inf included, whose difference is NaN) need no scale.
        sum += mk == m ? lk : lk * exp(mk - m);
    }
    l = sum;
}

void main() {
    uint r = gl_WorkGroupID.x, h = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    uint kvh = h / (p.n_head / p.n_head_kv);
    ivec4 ri = rowinfo[r];
    int pos = ri.x;
    int table_base = p.group == 0u ? ri.y : ri.z;
    int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
    int n = pos - lo + 1;
    bool fits = n <= SMAX;
    wide = p.hd % 8u == 0u && p.hdv % 8u == 0u && p.k_row_words % 4u == 0u &&
           p.v_row_words % 4u == 0u && p.block_words % 4u == 0u;
    uint kq = kvh * (p.hd / 2u);                           // the head's key words
    uint vq = 16u * p.k_row_words + kvh * (p.hdv / 2u);    // the head's value words

    // 0. The decode form: qk_prep.comp's work for this head's Q (lanes
    // 0-63, into sc[0 ..]) and its KV head's K (lanes 64-127, into
    // sc[512 ..]), then K and V stored at the row's position (lanes
    // 128-255). Every query head of the KV head stores the same bits there;
    // each reads back only after its own store.
#ifdef PREFILL
    const bool fused = false;
#else
    bool fused = p.fused != 0u;
    if (fused) {
        bool kl = t >= 64u;
        prep_head(t < 128u, t % 64u, kl ? 512u : 0u, kl ? 64u : 0u, r, kl ? kvh : h, !kl);
        store_kv(t >= 128u, t - 128u, 128u, 512u, r, kvh, tables[table_base + pos / 16], pos);
        memoryBarrierBuffer();
    }
#endif

    // 1. Q, and the block table of lo..pos when all fits.
    if (t < 128u) {
        uint qb = (r * p.n_head + h) * p.hd;
        vec4 qv = vec4(0.0);
        for (uint e = 0u; e < 4u; e++)
            if (4u * t + e < p.hd) qv[e] = f16(fused ? sc[4u * t + e] : q[qb + 4u * t + e]);
        qs[t] = qv;
    }
    int tb0 = lo / 16;
    if (fits)
        for (int b = int(t); b <= pos / 16 - tb0; b += int(T))
            tab[b] = tables[table_base + tb0 + b];
    barrier(); // also: the decode form's stores are visible, sc's Q is read

    // 2. Scores, and each invocation's running maximum and sum of exp.
    float m = -1.0 / 0.0;
    precise float l = 0.0;
    for (int j = lo + int(t); j <= pos; j += int(T)) {
        // A branch, not a select: the table in global memory is not read
        // when its entries are at hand.
        int blk;
        if (fits) {
            blk = tab[j / 16 - tb0];
        } else {
            blk = tables[table_base + j / 16];
        }
        float s = score(uint(blk) * p.block_words + uint(j % 16) * p.k_row_words + kq);
        if (fits) sc[j - lo] = s;
        if (s > m) {
            l = l * exp(m - s) + 1.0;
            m = s;
        } else {
            l += exp(s - m);
        }
    }
    pm[t] = m;
    pl[t] = l;
    barrier();
    const uint per = T / R1;
    if (t < R1) {
        float m1, l1;
        merge(t * per, 1u, per, m1, l1);
        pm[t * per] = m1; // only this invocation reads t * per .. t * per + per - 1
        pl[t * per] = l1;
    }
    barrier();
    float mx, sum;
    merge(0u, per, R1, mx, sum); // every invocation, the same bits
    float inv = 1.0 / sum;

    // 3-4. Per tile (one when n <= S_MAX): probabilities, weighted values.
    uint L = (p.hdv + 7u) / 8u;          // invocations per group
    int G = int(T / L);                  // groups
    int g = int(t / L);                  // this invocation's group (none if >= G)
    uint c = t % L;                      // its output dims 8c..8c+7
    uint vnw = p.hdv / 2u - 4u * c;      // the words of its chunk in the row
    uint voff = vq + 4u * c;
    precise vec4 acc0 = vec4(0.0), acc1 = vec4(0.0);
    for (int t0 = lo; t0 <= pos; t0 += SMAX) {
        int cnt = min(SMAX, pos - t0 + 1);
        int tb = t0 / 16;
        if (!fits) {
            barrier(); // the last tile's weighted sum is done with sc and tab
            for (int b = int(t); b <= (t0 + cnt - 1) / 16 - tb; b += int(T))
                tab[b] = tables[table_base + tb + b];
        }
        for (int i = int(t); i < cnt; i += int(T)) {
            float s;
            if (fits) {
                s = sc[i];
            } else {
                int j = t0 + i;
                uint bw = uint(tables[table_base + j / 16]) * p.block_words;
                s = score(bw + uint(j % 16) * p.k_row_words + kq);
            }
            sc[i] = f16(exp(s - mx) * inv);
        }
        barrier();
        if (g < G) {
            for (int i = g; i < cnt; i += int(NF) * G) {
                // NF rows requested before any is added: loads in flight.
                float w[NF];
                uvec4 vr[NF];
                [[unroll]] for (int u = 0; u < int(NF); u++) {
                    int ii = i + u * G;
                    w[u] = 0.0;
                    vr[u] = uvec4(0u);
                    if (ii < cnt) {
                        int j = t0 + ii;
                        uint at = uint(tab[j / 16 - tb]) * p.block_words +
                                  uint(j % 16) * p.v_row_words + voff;
                        w[u] = sc[ii];
                        vr[u] = load4(at, vnw);
                    }
                }
                // An absent row adds 0 * 0: the sums are unchanged.
                [[unroll]] for (int u = 0; u < int(NF); u++) {
                    vec4 x0 = vec4(unpackHalf2x16(vr[u].x), unpackHalf2x16(vr[u].y));
                    vec4 x1 = vec4(unpackHalf2x16(vr[u].z), unpackHalf2x16(vr[u].w));
                    acc0 = fma(vec4(w[u]), x0, acc0);
                    acc1 = fma(vec4(w[u]), x1, acc1);
                }
            }
        }
    }

    // The groups' partial outputs, added in group order. Groups past the
    // n-th had no position and are left out.
    barrier(); // every group is done reading sc
    if (g < G) {
        uint at = uint(g) * p.hdv + 8u * c;
        for (uint e = 0u; e < 4u; e++) {
            if (8u * c + e < p.hdv) sc[at + e] = acc0[e];
            if (8u * c + 4u + e < p.hdv) sc[at + 4u + e] = acc1[e];
        }
    }
    barrier();
    int gu = min(G, n);
    uint ob = (r * p.n_head + h) * p.hdv;
    for (uint d = t; d < p.hdv; d += T) {
        precise float s = 0.0;
        for (int k = 0; k < gu; k++) s += sc[uint(k) * p.hdv + d];
        o[ob + d] = s;
    }
}
