#version 450
// matmul.comp — y[r][o] = sum_i W[o][i] * x[r][i] for a weight matrix W
// stored as in the GGUF file (rows of whole blocks of one type, chosen by
// -DW_<TYPE> at build time: cmake/vulkan.cmake builds one module per type),
// f32 activation rows x and f32 output rows y.
//
// Batch invariance (docs/gpu.md): a workgroup computes OUTS outputs for TR
// activation rows. Each output's dot product is split over K in chunks of
// 32 elements; lane l of LANES takes chunks l, l + LANES, l + 2 LANES, ...,
// sums each chunk in element order with fma and adds the chunk sums in
// chunk order; the LANES partial sums are then added through shared
// memory in a fixed tree. Nothing of that depends on the number of rows,
// on which tile a row falls in or on the device's subgroup size, and every
// row of a tile runs the same arithmetic (`precise` keeps the compiler from
// contracting or reordering it), so a row's outputs have the same bits in
// a batch of 1 (decode) as in a batch of thousands (prefill).
//
// Weights are read as 32-bit words and unpacked (blocks may start at any
// even byte: Q4_0's are 18 bytes), which every Vulkan 1.1 device runs.

layout(local_size_x = 128) in;

const uint LANES = 16u; // partial sums per output
const uint OUTS = 8u;   // outputs per workgroup: LANES * OUTS = 128 invocations
const uint TR = 8u;     // activation rows per workgroup

layout(std430, binding = 0) readonly buffer Wbuf { uint wd[]; };
layout(std430, binding = 1) readonly buffer Xbuf { float xd[]; };
layout(std430, binding = 2) writeonly buffer Ybuf { float yd[]; };

layout(push_constant) uniform Push {
    uint K;        // columns of W (input size), a whole number of blocks
    uint N;        // rows of W (outputs)
    uint n_rows;   // activation rows
    uint w_off;    // bytes from the start of binding 0 to W
    uint x_off;    // floats from the start of binding 1 to x[0][0]
    uint y_off;    // floats from the start of binding 2 to y[0][0]
    uint x_stride; // floats from x[r] to x[r + 1]
    uint y_stride; // floats from y[r] to y[r + 1]
} pc;

shared float red[OUTS * LANES * TR];

uint byte_at(uint off) {
    return (wd[off >> 2] >> ((off & 3u) * 8u)) & 0xFFu;
}

// 16 bits at an even byte offset.
uint u16_at(uint off) {
    return (wd[off >> 2] >> ((off & 2u) * 8u)) & 0xFFFFu;
}

// 32 bits at an even byte offset.
uint u32_at(uint off) {
    uint i = off >> 2;
    if ((off & 2u) == 0u) return wd[i];
    return (wd[i] >> 16) | (wd[i + 1u] << 16);
}

float f16_at(uint off) {
    return unpackHalf2x16(u16_at(off)).x;
}

#if defined(W_F32)
uint row_bytes(uint k) { return k * 4u; }
void load_chunk(uint row, uint c, out float w[32]) {
    uint base = (row >> 2) + c * 32u;
    for (uint j = 0u; j < 32u; j++) w[j] = uintBitsToFloat(wd[base + j]);
}
#elif defined(W_F16)
uint row_bytes(uint k) { return k * 2u; }
void load_chunk(uint row, uint c, out float w[32]) {
    uint base = row + c * 64u;
    for (uint j = 0u; j < 16u; j++) {
        vec2 v = unpackHalf2x16(u32_at(base + 4u * j));
        w[2u * j] = v.x;
        w[2u * j + 1u] = v.y;
    }
}
#elif defined(W_Q4_0)
// x = d * (q - 8); element j < 16 in the low nibble of qs[j], j + 16 in its high nibble.
uint row_bytes(uint k) { return k / 32u * 18u; }
void load_chunk(uint row, uint c, out float w[32]) {
    uint b = row + c * 18u;
    float d = f16_at(b);
    for (uint q = 0u; q < 4u; q++) {
        uint u = u32_at(b + 2u + 4u * q);
        for (uint i = 0u; i < 4u; i++) {
            uint v = (u >> (8u * i)) & 0xFFu;
            w[4u * q + i] = d * float(int(v & 15u) - 8);
            w[4u * q + i + 16u] = d * float(int(v >> 4) - 8);
        }
    }
}
#elif defined(W_Q4_1)
// x = d * q + m, nibbles as Q4_0.
uint row_bytes(uint k) { return k / 32u * 20u; }
void load_chunk(uint row, uint c, out float w[32]) {
    uint b = row + c * 20u;
    float d = f16_at(b), m = f16_at(b + 2u);
    for (uint q = 0u; q < 4u; q++) {
        uint u = u32_at(b + 4u + 4u * q);
        for (uint i = 0u; i < 4u; i++) {
            uint v = (u >> (8u * i)) & 0xFFu;
            w[4u * q + i] = d * float(v & 15u) + m;
            w[4u * q + i + 16u] = d * float(v >> 4) + m;
        }
    }
}
#elif defined(W_Q5_0)
// x = d * (q - 16); bit 4 of element j is bit j of qh.
uint row_bytes(uint k) { return k / 32u * 22u; }
void load_chunk(uint row, uint c, out float w[32]) {
    uint b = row + c * 22u;
    float d = f16_at(b);
    uint qh = u32_at(b + 2u);
    for (uint q = 0u; q < 4u; q++) {
        uint u = u32_at(b + 6u + 4u * q);
        for (uint i = 0u; i < 4u; i++) {
            uint j = 4u * q + i;
            uint v = (u >> (8u * i)) & 0xFFu;
            uint q0 = (v & 15u) | (((qh >> j) & 1u) << 4);
            uint q1 = (v >> 4) | (((qh >> (j + 16u)) & 1u) << 4);
            w[j] = d * float(int(q0) - 16);
            w[j + 16u] = d * float(int(q1) - 16);
        }
    }
}
#elif defined(W_Q8_0)
// x = d * q, q signed bytes.
uint row_bytes(uint k) { return k / 32u * 34u; }
void load_chunk(uint row, uint c, out float w[32]) {
    uint b = row + c * 34u;
    float d = f16_at(b);
    for (uint q = 0u; q < 8u; q++) {
        int u = int(u32_at(b + 2u + 4u * q));
        for (uint i = 0u; i < 4u; i++) w[4u * q + i] = float(bitfieldExtract(u, int(8u * i), 8)) * d;
    }
}
#elif defined(W_Q4_K) || defined(W_Q5_K)
// 8 groups of 32 per super-block: x = d * sc[g] * q - dmin * m[g], the
// 6-bit scales and mins packed in 12 bytes (blocks.h, kq_scale_min).
void scale_min(uint s, uint g, out uint sc, out uint m) {
    if (g < 4u) {
        sc = byte_at(s + g) & 63u;
        m = byte_at(s + g + 4u) & 63u;
    } else {
        uint b4 = byte_at(s + g + 4u);
        sc = (b4 & 15u) | ((byte_at(s + g - 4u) >> 6) << 4);
        m = (b4 >> 4) | ((byte_at(s + g) >> 6) << 4);
    }
}
#if defined(W_Q4_K)
uint row_bytes(uint k) { return k / 256u * 144u; }
#else
uint row_bytes(uint k) { return k / 256u * 176u; }
#endif
void load_chunk(uint row, uint c, out float w[32]) {
    uint g = c & 7u;
#if defined(W_Q4_K)
    uint b = row + (c >> 3) * 144u;
    uint qs = b + 16u;
#else
    uint b = row + (c >> 3) * 176u;
    uint qh = b + 16u, qs = b + 48u;
#endif
    float d = f16_at(b), dmin = f16_at(b + 2u);
    uint sc, m;
    scale_min(b + 4u, g, sc, m);
    float dl = d * float(sc), ml = dmin * float(m);
    uint shift = 4u * (g & 1u);
    for (uint q = 0u; q < 8u; q++) {
        uint u = u32_at(qs + 32u * (g >> 1) + 4u * q);
#if defined(W_Q5_K)
        uint h = u32_at(qh + 4u * q);
#endif
        for (uint i = 0u; i < 4u; i++) {
            uint v = (u >> (8u * i + shift)) & 15u;
#if defined(W_Q5_K)
            v |= ((h >> (8u * i + g)) & 1u) << 4;
#endif
            w[4u * q + i] = dl * float(v) - ml;
        }
    }
}
#elif defined(W_Q6_K)
// 16 groups of 16: x = d * scales[g] * (q - 32), q 6 bits: low 4 from ql,
// top 2 from qh (blocks.h). Chunk c is elements 32k .. 32k + 31 of half h
// of super-block c / 8 (k = c % 4, h = (c / 4) % 2).
uint row_bytes(uint k) { return k / 256u * 210u; }
void load_chunk(uint row, uint c, out float w[32]) {
    uint b = row + (c >> 3) * 210u;
    uint g = c & 7u, h = g >> 2, k = g & 3u;
    float d = f16_at(b + 208u);
    int s0 = bitfieldExtract(int(byte_at(b + 192u + 2u * g)), 0, 8);
    int s1 = bitfieldExtract(int(byte_at(b + 193u + 2u * g)), 0, 8);
    float dl0 = d * float(s0), dl1 = d * float(s1);
    uint ql = b + 64u * h + 32u * (k & 1u), qh = b + 128u + 32u * h;
    uint lshift = k < 2u ? 0u : 4u;
    for (uint q = 0u; q < 8u; q++) {
        uint u = u32_at(ql + 4u * q), hb = u32_at(qh + 4u * q);
        for (uint i = 0u; i < 4u; i++) {
            uint lo = (u >> (8u * i + lshift)) & 15u;
            uint hi = (hb >> (8u * i + 2u * k)) & 3u;
            uint l = 4u * q + i;
            w[l] = (l < 16u ? dl0 : dl1) * float(int(lo | (hi << 4)) - 32);
        }
    }
}
#else
#error "matmul.comp: build with -DW_<TYPE>"
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint ol = tid / LANES, lane = tid % LANES;
    uint tile = gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (tile * OUTS >= pc.N) return; // the same for the whole workgroup
    uint o = tile * OUTS + ol;
    uint oc = min(o, pc.N - 1u); // past N: computes a copy, writes nothing
    uint r0 = gl_WorkGroupID.y * TR;
    uint row = pc.w_off + oc * row_bytes(pc.K);

    precise float acc[TR];
    for (uint r = 0u; r < TR; r++) acc[r] = 0.0;
    uint nc = pc.K / 32u;
    for (uint c = lane; c < nc; c += LANES) {
        float w[32];
        load_chunk(row, c, w);
        for (uint r = 0u; r < TR; r++) {
            uint xr = min(r0 + r, pc.n_rows - 1u); // past n_rows: a copy, not written
            uint xb = pc.x_off + xr * pc.x_stride + c * 32u;
            precise float s = 0.0;
            for (uint j = 0u; j < 32u; j++) s = fma(w[j], xd[xb + j], s);
            acc[r] += s;
        }
    }
    uint me = (ol * LANES + lane) * TR;
    for (uint r = 0u; r < TR; r++) red[me + r] = acc[r];
    barrier();
    for (uint st = LANES / 2u; st > 0u; st >>= 1) {
        if (lane < st) {
            uint other = me + st * TR;
            for (uint r = 0u; r < TR; r++) {
                precise float v = red[me + r] + red[other + r];
                red[me + r] = v;
            }
        }
        barrier();
    }
    if (lane < TR && o < pc.N && r0 + lane < pc.n_rows)
        yd[pc.y_off + (r0 + lane) * pc.y_stride + o] = red[ol * LANES * TR + lane];
}
