#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
// matmul.comp — y[r][o] = sum_i W[o][i] * x[r][i] for a weight matrix W
// stored as in the GGUF file (rows of whole blocks of one type, chosen by
// -DW_<TYPE> at build time: cmake/vulkan.cmake builds one module per type),
// f32 activation rows x and f32 output rows y.
//
// Batch invariance (docs/gpu.md): a workgroup computes OUTS (times OPT)
// outputs for TR activation rows. Each output's dot product is split over
// K in chunks of 32 elements; lane l of LANES takes chunks l, l + LANES,
// l + 2 LANES, ..., sums each chunk with fma in an order fixed by the type
// (its 4 groups of 8 values, elem() below) and adds the chunk sums in
// chunk order; the LANES partial sums are then added through shared memory
// in a fixed tree. LANES comes from K alone (vk_matmul.c), and nothing of
// that depends on the number of rows, on which tile a row falls in or on
// the device's subgroup size; every row of a tile runs the same arithmetic
// (`precise` keeps the compiler from contracting or reordering it), so a
// row's outputs have the same bits in a batch of 1 (decode) as in a batch
// of thousands (prefill).
//
// Weights are read as 32-bit words and unpacked (blocks may start at any
// even byte: Q4_0's are 18 bytes), which every Vulkan 1.1 device runs.

//
// -DLANE_PER_OUTPUT builds the variant for
// devices that emulate a GPU on a CPU (Mesa's lavapipe), where a barrier
// costs a coroutine switch per invocation: one invocation per output adds
// its chunk sums in chunk order, with no shared memory and no barrier. Its
// bits differ from the cooperative variant's; a device uses one variant
// for every batch, so a row's result still does not depend on the batch.
//
// -DX_Q8 builds the variant that rounds the activations as the CPU's
// matmul rounds them for its integer dot products (below, before the
// kernels), $CELLM_VK_ACT=q8: its own modules, so that the f32 kernels'
// code is what it was without it.

#ifdef TILED
// The tiled form for prompts (-DTILED; main below): NT invocations (the
// workgroup's size, constant 0) as WO along the outputs (constant 2) by
// NT / WO along the rows, each 4 outputs by 4 rows.
layout(local_size_x_id = 0) in;
#else
layout(local_size_x = 128) in;
#endif

#ifdef TILED
layout(constant_id = 0) const uint NT = 256u;
layout(constant_id = 2) const uint WO = 16u;
#else
// Activation rows per workgroup: 8, or 1 for a single row (decode),
// which then does not compute 7 copies. Every value below is `precise`, so
// a row's bits are the same in either pipeline.
layout(constant_id = 0) const uint TR = 8u;
// Outputs per invocation in the cooperative variant (vk_matmul.c's
// matmul_opt): 1 for up to 8 rows, where more workgroups matter more; 2
// for several row tiles and 4 past 128 rows, so that each activation read
// from shared memory feeds two or four weights. An output's arithmetic is
// the same whatever OPT.
layout(constant_id = 2) const uint OPT = 1u;
#endif
// Partial sums per output, 1 to 16: as few as give each lane the same
// number of chunks in as many steps as 16 lanes take (K = 576, 18 chunks:
// 9 lanes of 2, not 16 lanes of which 14 idle in the second step). An
// output's bits depend on it, so a matrix takes the same LANES in every
// pipeline (vk_matmul.c). OUTS outputs of LANES invocations each; the
// invocations past LIVE (128 % LANES of them) only load tiles.
layout(constant_id = 3) const uint LANES = 16u;
const uint OUTS = 128u / LANES;
const uint LIVE = OUTS * LANES;
// The reduction tree's first stride: half the least power of two >= LANES.
const uint TOP = LANES > 8u ? 8u : LANES > 4u ? 4u : LANES > 2u ? 2u : 1u;

layout(std430, binding = 0) readonly buffer Wbuf { uint wd[]; };
layout(std430, binding = 1) readonly buffer Xbuf { float xd[]; };
layout(std430, binding = 2) writeonly buffer Ybuf { float yd[]; };

// -DX_GLU: the activation rows are act(g) * u of two buffers of the same
// layout, g in binding 1 and u in binding 3 (act.glsl; its kind is
// constant 1), computed as the tile is loaded: the down projection takes
// the gate and up products as they are, with no dispatch between.
#ifdef X_GLU
layout(std430, binding = 3) readonly buffer Ubuf { float ud[]; };
layout(constant_id = 1) const uint ACT = 0u;
#include "act.glsl"
float x_at(uint i) { return glu(ACT, xd[i], ud[i]); }
#else
float x_at(uint i) { return xd[i]; }
#endif

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

// The activation tile of one step: TR rows of the LANES * 32 columns the
// lanes work on, read once for all OUTS * OPT outputs. Then the partial
// sums' reduction (RED * TR floats). At most 16 KiB (TR 8, OPT <= 4):
// Vulkan's least limit.
#ifndef TILED
const uint SPAN = LANES * 32u;
const uint RED = OPT * OUTS * LANES; // partial sums of a tile's row
shared float sh[TR * (SPAN > RED ? SPAN : RED)];

// Where element e of lane l's chunk (row r of the tile) sits in sh: the
// lanes' chunks interleaved, element-major. The LANES lanes of an output
// read element e of their chunks at once, from neighbouring words (with
// chunks stored whole they were 32 floats apart, one shared-memory bank).
// The tile's loads, consecutive invocations reading consecutive columns
// (one chunk's elements), store words LANES apart: for an odd LANES those
// fall in 32 different banks; a power of two is swizzled by the element
// (l ^ e % LANES), which leaves at most two to a bank (16 lanes; without
// it, 16 to a bank); other even counts meet gcd(LANES, 32) to a bank.
const bool POW2 = (LANES & (LANES - 1u)) == 0u;
uint shx(uint r, uint l, uint e) {
    return r * SPAN + e * LANES + (POW2 ? l ^ (e % LANES) : l);
}
#endif

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

// Each type decodes a chunk of 32 elements in 4 groups of 8:
//   chunk_begin(row, c): the chunk's scales (kept in the globals below);
//   load8(g, v): the 8 values of group g;
//   elem(g, i): which element of the chunk v[i] is.
uint cb;      // byte offset of the chunk's block
float cd, cm; // the chunk's scale and offset (or second scale)
uint cg;      // the chunk's index within its super-block (K-quants)

#if defined(W_F32)
uint row_bytes(uint k) { return k * 4u; }
void chunk_begin(uint row, uint c) { cb = row + c * 128u; }
void load8(uint g, precise out float v[8]) {
    uint w0 = (cb >> 2) + 8u * g;
    for (uint i = 0u; i < 8u; i++) v[i] = uintBitsToFloat(wd[w0 + i]);
}
uint elem(uint g, uint i) { return 8u * g + i; }
#elif defined(W_F16)
uint row_bytes(uint k) { return k * 2u; }
void chunk_begin(uint row, uint c) { cb = row + c * 64u; }
void load8(uint g, precise out float v[8]) {
    for (uint i = 0u; i < 4u; i++) {
        vec2 h = unpackHalf2x16(u32_at(cb + 16u * g + 4u * i));
        v[2u * i] = h.x;
        v[2u * i + 1u] = h.y;
    }
}
uint elem(uint g, uint i) { return 8u * g + i; }
#elif defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0)
// Group g is byte 4g .. 4g + 3 of qs: 4 low nibbles (elements 4g + i) and
// 4 high nibbles (elements 16 + 4g + i).
uint elem(uint g, uint i) { return i < 4u ? 4u * g + i : 12u + 4u * g + i; }
#if defined(W_Q4_0)
// x = d * (q - 8)
uint row_bytes(uint k) { return k / 32u * 18u; }
void chunk_begin(uint row, uint c) { cb = row + c * 18u; cd = f16_at(cb); }
void load8(uint g, precise out float v[8]) {
    uint u = u32_at(cb + 2u + 4u * g);
    for (uint i = 0u; i < 4u; i++) {
        v[i] = cd * float(int((u >> (8u * i)) & 15u) - 8);
        v[i + 4u] = cd * float(int((u >> (8u * i + 4u)) & 15u) - 8);
    }
}
#elif defined(W_Q4_1)
// x = d * q + m
uint row_bytes(uint k) { return k / 32u * 20u; }
void chunk_begin(uint row, uint c) { cb = row + c * 20u; cd = f16_at(cb); cm = f16_at(cb + 2u); }
void load8(uint g, precise out float v[8]) {
    uint u = u32_at(cb + 4u + 4u * g);
    for (uint i = 0u; i < 4u; i++) {
        v[i] = cd * float((u >> (8u * i)) & 15u) + cm;
        v[i + 4u] = cd * float((u >> (8u * i + 4u)) & 15u) + cm;
    }
}
#else
// x = d * (q - 16); bit 4 of element j is bit j of qh.
uint row_bytes(uint k) { return k / 32u * 22u; }
uint qh;
void chunk_begin(uint row, uint c) { cb = row + c * 22u; cd = f16_at(cb); qh = u32_at(cb + 2u); }
void load8(uint g, precise out float v[8]) {
    uint u = u32_at(cb + 6u + 4u * g);
    for (uint i = 0u; i < 4u; i++) {
        uint j = 4u * g + i;
        uint q0 = ((u >> (8u * i)) & 15u) | (((qh >> j) & 1u) << 4);
        uint q1 = ((u >> (8u * i + 4u)) & 15u) | (((qh >> (j + 16u)) & 1u) << 4);
        v[i] = cd * float(int(q0) - 16);
        v[i + 4u] = cd * float(int(q1) - 16);
    }
}
#endif
#elif defined(W_Q8_0)
// x = d * q, q signed bytes.
uint row_bytes(uint k) { return k / 32u * 34u; }
void chunk_begin(uint row, uint c) { cb = row + c * 34u; cd = f16_at(cb); }
void load8(uint g, precise out float v[8]) {
    for (uint h = 0u; h < 2u; h++) {
        int u = int(u32_at(cb + 2u + 8u * g + 4u * h));
        for (uint i = 0u; i < 4u; i++) v[4u * h + i] = float(bitfieldExtract(u, int(8u * i), 8)) * cd;
    }
}
uint elem(uint g, uint i) { return 8u * g + i; }
#elif defined(W_Q4_K) || defined(W_Q5_K)
// 8 groups of 32 per super-block (a chunk is one): x = d * sc * q - dmin * m,
// the 6-bit scales and mins packed in 12 bytes (blocks.h, kq_scale_min).
#if defined(W_Q4_K)
uint row_bytes(uint k) { return k / 256u * 144u; }
const uint BLOCK = 144u, QS = 16u;
#else
uint row_bytes(uint k) { return k / 256u * 176u; }
const uint BLOCK = 176u, QS = 48u; // qh (32 bytes) at 16
#endif
void chunk_begin(uint row, uint c) {
    cb = row + (c >> 3) * BLOCK;
    cg = c & 7u;
    uint s = cb + 4u, sc, m;
    if (cg < 4u) {
        sc = byte_at(s + cg) & 63u;
        m = byte_at(s + cg + 4u) & 63u;
    } else {
        uint b4 = byte_at(s + cg + 4u);
        sc = (b4 & 15u) | ((byte_at(s + cg - 4u) >> 6) << 4);
        m = (b4 >> 4) | ((byte_at(s + cg) >> 6) << 4);
    }
    cd = f16_at(cb) * float(sc);
    cm = f16_at(cb + 2u) * float(m);
}
void load8(uint g, precise out float v[8]) {
    uint shift = 4u * (cg & 1u);
    for (uint h = 0u; h < 2u; h++) {
        uint u = u32_at(cb + QS + 32u * (cg >> 1) + 8u * g + 4u * h);
#if defined(W_Q5_K)
        uint hb = u32_at(cb + 16u + 8u * g + 4u * h);
#endif
        for (uint i = 0u; i < 4u; i++) {
            uint q = (u >> (8u * i + shift)) & 15u;
#if defined(W_Q5_K)
            q |= ((hb >> (8u * i + cg)) & 1u) << 4;
#endif
            v[4u * h + i] = cd * float(q) - cm;
        }
    }
}
uint elem(uint g, uint i) { return 8u * g + i; }
#elif defined(W_Q6_K)
// 16 groups of 16: x = d * scales[g] * (q - 32), q 6 bits: low 4 from ql,
// top 2 from qh (blocks.h). Chunk c is elements 32k .. 32k + 31 of half h
// of super-block c / 8 (k = c % 4, h = (c / 4) % 2); cd and cm are the
// scales of its two groups of 16.
uint row_bytes(uint k) { return k / 256u * 210u; }
void chunk_begin(uint row, uint c) {
    cb = row + (c >> 3) * 210u;
    cg = c & 7u;
    float d = f16_at(cb + 208u);
    cd = d * float(bitfieldExtract(int(byte_at(cb + 192u + 2u * cg)), 0, 8));
    cm = d * float(bitfieldExtract(int(byte_at(cb + 193u + 2u * cg)), 0, 8));
}
void load8(uint g, precise out float v[8]) {
    uint h = cg >> 2, k = cg & 3u;
    uint ql = cb + 64u * h + 32u * (k & 1u), qh = cb + 128u + 32u * h;
    uint lshift = k < 2u ? 0u : 4u;
    float dl = g < 2u ? cd : cm;
    for (uint p = 0u; p < 2u; p++) {
        uint u = u32_at(ql + 8u * g + 4u * p), hb = u32_at(qh + 8u * g + 4u * p);
        for (uint i = 0u; i < 4u; i++) {
            uint lo = (u >> (8u * i + lshift)) & 15u;
            uint hi = (hb >> (8u * i + 2u * k)) & 3u;
            v[4u * p + i] = dl * float(int(lo | (hi << 4)) - 32);
        }
    }
}
uint elem(uint g, uint i) { return 8u * g + i; }
#else
#error "matmul.comp: build with -DW_<TYPE>"
#endif

#ifdef X_Q8
// The CPU's rounding of the activations (src/format/quant.c's vec_dot_type
// of each weight type): the 32-element types meet A8 rows (a block of 32
// codes round(x / d), d = max |x| / 127 stored as F16), the K-quants Q8_K
// rows (blocks of 256, d kept in F32), F16 weights F16 activations. XBLK is
// the block (1: each value on its own, F16).
#if defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q8_0)
const uint XBLK = 32u;
const bool XD_F16 = true;
#elif defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K)
const uint XBLK = 256u;
const bool XD_F16 = false;
#elif defined(W_F16)
const uint XBLK = 1u;
const bool XD_F16 = false;
#else
#error "matmul.comp: -DX_Q8 for a type the CPU multiplies in f32"
#endif

// x >= 0 rounded to the nearest F16, ties to even (fp16.h's fp32_to_fp16;
// a device's packHalf2x16 may truncate).
float round_f16(float x) {
    if (x >= 65520.0) return uintBitsToFloat(0x7F800000u);
    if (x < 6.103515625e-05) return roundEven(x * 16777216.0) * 5.9604644775390625e-08;
    uint b = floatBitsToUint(x);
    b += 0xFFFu + ((b >> 13) & 1u);
    return uintBitsToFloat(b & ~0x1FFFu);
}

float signed_f16(float x) {
    return x < 0.0 ? -round_f16(-x) : round_f16(x);
}

// A block's scale from its largest magnitude: 1 / d, and what one code is
// worth (d, through F16 for A8).
void xq_scale(float amax, out float id, out float dq) {
    precise float d = amax / 127.0;
    id = d != 0.0 ? 1.0 / d : 0.0;
    dq = XD_F16 ? round_f16(d) : d;
}

// x as the CPU's code stands for it: clamp(x / d) to [-127, 127], rounded
// half away from zero (roundf), times the code's worth.
float xq_round(float x, float id, float dq) {
    precise float v = clamp(x * id, -127.0, 127.0);
    float a = abs(v), r = floor(a);
    if (a - r >= 0.5) r += 1.0;
    return (v < 0.0 ? -r : r) * dq;
}
#endif

#if defined(TILED)
// The tiled form: the same sums as the cooperative form below, for each
// (output, row), computed by one invocation instead of LANES of them.
//
// An output's value there is U(0, 1), where U(l, 16) is lane l's sum (0.0
// plus its chunk sums in chunk order, each chunk an fma chain over the
// type's element order from 0.0) and U(l, w) = U(l, 2w) + U(l + w, 2w) when
// lane l + w exists (l + w < LANES), else U(l, 2w): the tree of strides 8,
// 4, 2, 1 (a stride past TOP adds nothing, so 16 leaves serve every
// LANES). Evaluated depth first, the leaves come in bit-reversed order
// (lanes 0, 8, 4, 12, 2, ...) and each sum is a left subtree plus the right
// one just finished: a binary counter over the leaves, with one stored
// subtree per level (st0..st3) and a lane past LANES an empty subtree.
// Addition commutes bit for bit, so the tree's sums are the cooperative
// form's.
//
// The workgroup covers 4 WO outputs by 4 WR rows and walks K one chunk at
// a time, in the leaves' order: the chunk's weights, decoded once for the
// workgroup (tw, in the element order the sums take), and its 32 columns
// of the rows (tx) go to shared memory; each invocation then adds 16 fma
// chains from 2 vec4 reads an element. The next chunk's loads are issued
// before the sums and stored after them, into the other of two buffers:
// one barrier a chunk, and the loads' latency behind the arithmetic.
const uint WR = NT / WO;
const uint OW = 4u * WO, RW = 4u * WR;
// Loads an invocation makes per chunk: weight groups of 8 (at most 2, WR
// >= 8) and row quads of 4 columns (at most 8, WO >= 4).
const uint WT = 16u / WR, XT = 32u / WO;
// tw[buf][p * WO + q][a]: value p (8g + i: group g, value i) of the chunk
// of output 4q + a. tx[buf][e * WR + (q ^ (e / 4 % 8))][b]: column e of the
// chunk for row 4q + b, the row quads swizzled by the column so that the
// loads' stores (a row's 32 columns from 8 invocations, 4 rows of a quad)
// fall in 32 different banks; WR is a multiple of 8, so the swizzle stays
// in the tile.
shared vec4 tw[2u * 32u * WO];
shared vec4 tx[2u * 32u * WR];

uint bitrev4(uint j) {
    return ((j & 1u) << 3) | ((j & 2u) << 1) | ((j & 4u) >> 1) | ((j & 8u) >> 3);
}

// [4a + b]: output o0 + 4 oq + a, row r0 + 4 rq + b. cur: the subtree
// being finished; st0..st3 the stored ones, e0..e3 whether each is empty.
// Their sums are single additions, each into a `precise` temporary (a
// `precise` array here fails lavapipe's compiler).
float cur[16], st0[16], st1[16], st2[16], st3[16];
bool e0 = true, e1 = true, e2 = true, e3 = true;

// cur = a + cur, where either subtree may be empty (ea, ec).
void join(float a[16], bool ea, inout bool ec) {
    if (ec) {
        cur = a;
        ec = ea;
    } else if (!ea) {
        for (uint k = 0u; k < 16u; k++) {
            precise float t = a[k] + cur[k];
            cur[k] = t;
        }
    }
}

// Leaf j (lane bitrev4(j)) is cur, empty or not: store it or join it
// with the subtrees it completes (a binary counter). After leaf 15, cur
// is the whole tree.
void leaf(uint j, bool ev) {
    if ((j & 1u) == 0u) {
        st0 = cur;
        e0 = ev;
        return;
    }
    join(st0, e0, ev);
    if ((j & 2u) == 0u) {
        st1 = cur;
        e1 = ev;
        return;
    }
    join(st1, e1, ev);
    if ((j & 4u) == 0u) {
        st2 = cur;
        e2 = ev;
        return;
    }
    join(st2, e2, ev);
    if ((j & 8u) == 0u) {
        st3 = cur;
        e3 = ev;
        return;
    }
    join(st3, e3, ev);
}

// An invocation's loads of chunk c, held until they are stored: weight
// task t = o + OW g (group g of output o), row task t = 8 rr + e4 (columns
// 4 e4 .. 4 e4 + 3 of row rr). Past N or n_rows: copies of the last
// output or row, not written.
float pw[2][8], px[8][4];

void load_chunk(uint c, uint tid, uint o0, uint r0, uint rb) {
    for (uint n = 0u; n < WT; n++) {
        uint t = tid + n * NT, o = t % OW, g = t / OW;
        chunk_begin(pc.w_off + min(o0 + o, pc.N - 1u) * rb, c);
        load8(g, pw[n]);
    }
    for (uint n = 0u; n < XT; n++) {
        uint t = tid + n * NT, rr = t / 8u, e4 = t % 8u;
        uint x0 = pc.x_off + min(r0 + rr, pc.n_rows - 1u) * pc.x_stride + c * 32u + 4u * e4;
        for (uint i = 0u; i < 4u; i++) px[n][i] = x_at(x0 + i);
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    // 32 neighbouring invocations are 4 output quads by 8 row quads: a
    // step's element is 4 weight and 8 row vec4s among them.
    uint warp = tid / 32u, wl = tid % 32u;
    uint oq = wl % 4u + 4u * (warp % (WO / 4u));
    uint rq = wl / 4u + 8u * (warp / (WO / 4u));
    uint tile = gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint o0 = tile * OW, r0 = gl_WorkGroupID.y * RW;
    if (o0 >= pc.N) return; // the same for the whole workgroup
    uint nc = pc.K / 32u, rb = row_bytes(pc.K);

    uint j = 0u, c = 0u, buf = 0u; // lane 0 always has a chunk
    for (uint k = 0u; k < 16u; k++) cur[k] = 0.0;
    // The first chunk's loads; then each step issues the next one's
    // before its sums.
    load_chunk(c, tid, o0, r0, rb);
    for (;;) {
        // Store the loaded chunk into buffer buf.
        for (uint n = 0u; n < WT; n++) {
            uint t = tid + n * NT, o = t % OW, g = t / OW;
            for (uint i = 0u; i < 8u; i++)
                tw[buf * 32u * WO + (8u * g + i) * WO + o / 4u][o % 4u] = pw[n][i];
        }
        for (uint n = 0u; n < XT; n++) {
            uint t = tid + n * NT, rr = t / 8u, e4 = t % 8u;
            uint q = (rr / 4u) ^ e4;
            for (uint i = 0u; i < 4u; i++)
                tx[buf * 32u * WR + (4u * e4 + i) * WR + q][rr % 4u] = px[n][i];
        }
        barrier();
        // The next chunk: the lane's next, else the first of the next lane
        // with one.
        uint jn = j, cn = c + LANES;
        if (cn >= nc) {
            jn = 16u;
            for (uint jj = j + 1u; jj < 16u; jj++) {
                uint l = bitrev4(jj);
                if (l < LANES && l < nc) {
                    jn = jj;
                    break;
                }
            }
            cn = jn < 16u ? bitrev4(jn) : 0u;
        }
        if (jn < 16u) load_chunk(cn, tid, o0, r0, rb);
        precise float s[16];
        for (uint k = 0u; k < 16u; k++) s[k] = 0.0;
        [[unroll]] for (uint g = 0u; g < 4u; g++) {
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                uint e = elem(g, i);
                vec4 wv = tw[buf * 32u * WO + (8u * g + i) * WO + oq];
                vec4 xv = tx[buf * 32u * WR + e * WR + (rq ^ (e / 4u % 8u))];
                [[unroll]] for (uint a = 0u; a < 4u; a++)
                    [[unroll]] for (uint b = 0u; b < 4u; b++)
                        s[4u * a + b] = fma(wv[a], xv[b], s[4u * a + b]);
            }
        }
        for (uint k = 0u; k < 16u; k++) {
            precise float t = cur[k] + s[k];
            cur[k] = t;
        }
        if (jn != j) {
            // The lane is done: its leaf, then the leaves up to the next
            // lane with a chunk (or the tree's end).
            leaf(j, false);
            for (uint jj = j + 1u; jj < jn; jj++) {
                for (uint k = 0u; k < 16u; k++) cur[k] = 0.0;
                leaf(jj, bitrev4(jj) >= LANES);
            }
            if (jn == 16u) break;
            for (uint k = 0u; k < 16u; k++) cur[k] = 0.0;
        }
        j = jn;
        c = cn;
        buf ^= 1u;
    }
    for (uint a = 0u; a < 4u; a++)
        for (uint b = 0u; b < 4u; b++) {
            uint o = o0 + 4u * oq + a, r = r0 + 4u * rq + b;
            if (o < pc.N && r < pc.n_rows) yd[pc.y_off + r * pc.y_stride + o] = cur[4u * a + b];
        }
}
#elif defined(LANE_PER_OUTPUT)
void main() {
    uint tile = gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint o = tile * 128u + gl_LocalInvocationID.x;
    if (o >= pc.N) return;
    uint r0 = gl_WorkGroupID.y * TR;
    uint row = pc.w_off + o * row_bytes(pc.K);
    precise float acc[TR];
    for (uint r = 0u; r < TR; r++) acc[r] = 0.0;
    uint nc = pc.K / 32u;
#ifdef X_Q8
    float xid[TR], xdq[TR]; // each row's block scale
#endif
    for (uint c = 0u; c < nc; c++) {
        chunk_begin(row, c);
#ifdef X_Q8
        // A block's scale at its first chunk (a block is 1 or 8 chunks).
        if (XBLK > 1u && (c * 32u) % XBLK == 0u)
            for (uint r = 0u; r < TR; r++) {
                uint x0 = pc.x_off + min(r0 + r, pc.n_rows - 1u) * pc.x_stride + c * 32u;
                float amax = 0.0;
                for (uint i = 0u; i < XBLK; i++) amax = max(amax, abs(xd[x0 + i]));
                xq_scale(amax, xid[r], xdq[r]);
            }
#endif
        precise float s[TR];
        for (uint r = 0u; r < TR; r++) s[r] = 0.0;
        [[dont_unroll]] for (uint g = 0u; g < 4u; g++) {
            float v[8];
            load8(g, v);
            for (uint i = 0u; i < 8u; i++) {
                uint col = c * 32u + elem(g, i);
                for (uint r = 0u; r < TR; r++) {
                    uint xr = min(r0 + r, pc.n_rows - 1u); // past n_rows: not written
#ifdef X_Q8
                    float x = xd[pc.x_off + xr * pc.x_stride + col];
                    x = XBLK == 1u ? signed_f16(x) : xq_round(x, xid[r], xdq[r]);
                    s[r] = fma(v[i], x, s[r]);
#else
                    s[r] = fma(v[i], xd[pc.x_off + xr * pc.x_stride + col], s[r]);
#endif
                }
            }
        }
        for (uint r = 0u; r < TR; r++) acc[r] += s[r];
    }
    for (uint r = 0u; r < TR; r++)
        if (r0 + r < pc.n_rows) yd[pc.y_off + (r0 + r) * pc.y_stride + o] = acc[r];
}
#else
#ifdef X_Q8
// Each block's largest magnitude in the tile of a step (a tile's span is
// whole blocks: vk_matmul.c gives the K-quants 8 or 16 lanes; one unused
// word for F16, which rounds each value alone), and how many of the tile's
// values each invocation loads.
const uint XNB = XBLK > 1u ? TR * SPAN / XBLK : 1u;
const uint XPER = (TR * SPAN + 127u) / 128u;
shared uint xmax[XNB];
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint ol = tid / LANES, lane = tid % LANES;
    bool live = tid < LIVE;
    uint tile = gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (tile * OUTS * OPT >= pc.N) return; // the same for the whole workgroup
    // Output k of this invocation: o[k] = (tile OPT + k) OUTS + ol.
    uint o[OPT], row[OPT];
    for (uint k = 0u; k < OPT; k++) {
        o[k] = (tile * OPT + k) * OUTS + ol;
        uint oc = min(o[k], pc.N - 1u); // past N: computes a copy, writes nothing
        row[k] = pc.w_off + oc * row_bytes(pc.K);
    }
    uint r0 = gl_WorkGroupID.y * TR;

    precise float acc[OPT][TR];
    for (uint k = 0u; k < OPT; k++)
        for (uint r = 0u; r < TR; r++) acc[k][r] = 0.0;
    uint nc = pc.K / 32u;
    uint steps = (nc + LANES - 1u) / LANES;
#ifdef X_Q8
    if (XBLK > 1u) {
        for (uint b = tid; b < XNB; b += 128u) xmax[b] = 0u;
        barrier();
    }
#endif
    for (uint st = 0u; st < steps; st++) {
        // Past n_rows or K: copies of the last row or column, never used
        // (whole blocks of them under X_Q8: a tile's span is whole blocks).
        // Unrolled (TR is a constant), so that every load of the tile is in
        // flight at once: a loop of dependent waits cost microseconds a
        // step on the H200, most of a decode matmul's time.
#ifdef X_Q8
        if (XBLK > 1u) {
            // Each block's largest magnitude (the bits of a non-negative
            // float order as the float), then the values rounded.
            float xv[XPER];
            [[unroll]] for (uint i = 0u; i < XPER; i++) {
                uint t = tid + 128u * i;
                if (t < TR * SPAN) {
                    uint xr = min(r0 + t / SPAN, pc.n_rows - 1u);
                    uint col = min(st * SPAN + t % SPAN, pc.K - 1u);
                    xv[i] = x_at(pc.x_off + xr * pc.x_stride + col);
                    atomicMax(xmax[t / XBLK], floatBitsToUint(abs(xv[i])));
                }
            }
            barrier();
            [[unroll]] for (uint i = 0u; i < XPER; i++) {
                uint t = tid + 128u * i;
                if (t < TR * SPAN) {
                    float id, dq;
                    xq_scale(uintBitsToFloat(xmax[t / XBLK]), id, dq);
                    uint tc = t % SPAN;
                    sh[shx(t / SPAN, tc / 32u, tc % 32u)] = xq_round(xv[i], id, dq);
                }
            }
        } else {
            [[unroll]] for (uint t = tid; t < TR * SPAN; t += 128u) {
                uint xr = min(r0 + t / SPAN, pc.n_rows - 1u);
                uint tc = t % SPAN;
                uint col = min(st * SPAN + tc, pc.K - 1u);
                sh[shx(t / SPAN, tc / 32u, tc % 32u)] =
                    signed_f16(x_at(pc.x_off + xr * pc.x_stride + col));
            }
        }
        barrier();
        // The block maxima are read: clear them for the next step (the
        // barrier at the step's end comes first).
        if (XBLK > 1u)
            for (uint b = tid; b < XNB; b += 128u) xmax[b] = 0u;
#else
        [[unroll]] for (uint t = tid; t < TR * SPAN; t += 128u) {
            uint xr = min(r0 + t / SPAN, pc.n_rows - 1u);
            uint tc = t % SPAN;
            uint col = min(st * SPAN + tc, pc.K - 1u);
            sh[shx(t / SPAN, tc / 32u, tc % 32u)] = x_at(pc.x_off + xr * pc.x_stride + col);
        }
        barrier();
#endif
        uint c = st * LANES + lane;
        if (live && c < nc) {
            // Each output's chunk: its four weight loads first, then the
            // arithmetic (unrolled, the loads are in flight together;
            // lavapipe, which compiles an unrolled chunk for seconds, runs
            // the lane variant). The OPT outputs share each activation
            // read from shared memory, which bounds a batch's speed; each
            // output's sums are what they would be alone.
            precise float v[OPT][4][8];
            for (uint k = 0u; k < OPT; k++) {
                chunk_begin(row[k], c);
                [[unroll]] for (uint g = 0u; g < 4u; g++) load8(g, v[k][g]);
            }
            precise float s[OPT][TR];
            for (uint k = 0u; k < OPT; k++)
                for (uint r = 0u; r < TR; r++) s[k][r] = 0.0;
            [[unroll]] for (uint g = 0u; g < 4u; g++) {
                for (uint i = 0u; i < 8u; i++) {
                    uint e = elem(g, i);
                    for (uint r = 0u; r < TR; r++) {
                        float xv = sh[shx(r, lane, e)];
                        for (uint k = 0u; k < OPT; k++) s[k][r] = fma(v[k][g][i], xv, s[k][r]);
                    }
                }
            }
            for (uint k = 0u; k < OPT; k++)
                for (uint r = 0u; r < TR; r++) acc[k][r] += s[k][r];
        }
        barrier();
    }
    // The LANES lane sums of each (output, row), added in a fixed tree:
    // at stride w, lane l < w takes lane l + w's sum where there is one.
    if (live)
        for (uint k = 0u; k < OPT; k++) {
            uint me = ((k * OUTS + ol) * LANES + lane) * TR;
            for (uint r = 0u; r < TR; r++) sh[me + r] = acc[k][r];
        }
    barrier();
    for (uint w = TOP; w > 0u; w >>= 1) {
        if (live && lane < w && lane + w < LANES)
            for (uint k = 0u; k < OPT; k++) {
                uint me = ((k * OUTS + ol) * LANES + lane) * TR, other = me + w * TR;
                for (uint r = 0u; r < TR; r++) {
                    precise float t = sh[me + r] + sh[other + r];
                    sh[me + r] = t;
                }
            }
        barrier();
    }
    if (live)
        for (uint k = 0u; k < OPT; k++)
            for (uint r = lane; r < TR; r += LANES)
                if (o[k] < pc.N && r0 + r < pc.n_rows)
                    yd[pc.y_off + (r0 + r) * pc.y_stride + o[k]] =
                        sh[(k * OUTS + ol) * LANES * TR + r];
}
#endif
