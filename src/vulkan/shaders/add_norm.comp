#version 450
#extension GL_EXT_control_flow_attributes : require
// add_norm.comp — the step between two blocks of a layer, one workgroup
// per row: the block's output y, RMS-normed by the post-norm weight where
// the layer has one (Gemma 3), is added to the residual stream x (times the
// model's residual scale), and the next block's input is x's RMSNorm times
// its weight. Doing the three in one dispatch saves two barriers a block,
// which is most of what a small model's decode step waits on.
//
// Lane t owns elements t, t + 128, ... (at most E of them: rows up to
// 128 E wide) and loads all it needs (y, x and both weights) at once into
// registers, so the row
// costs one round trip to memory, not one per phase. Each sum of squares
// adds a lane's elements in order, then the 128 lane sums in two fixed
// levels (16 lanes add 8 each, then every lane adds those 16 in order):
// two barriers, not a tree's seven. The order depends on the row's width
// alone, so a row's result does not depend on the batch. The loops over
// a lane's elements are unrolled to E with a guard, so the arrays stay in
// registers.
layout(local_size_x = 128) in;

const uint E = 32u; // elements per lane: rows up to 4096 wide

layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer PW { float post_w[]; };
layout(std430, set = 0, binding = 3) readonly buffer NW { float norm_w[]; };
layout(std430, set = 0, binding = 4) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n;        // elements per row (all three buffers' row stride), <= 128 E
    uint has_post; // 1: y is RMS-normed by post_w first
    uint has_norm; // 0: x only; 1: o = rmsnorm(x) * norm_w; 2: o = rmsnorm(x)
    float eps;
    float scale;   // the residual scale
} p;

shared float part[128];
shared float part16[16];

// The rms scale of a row from each lane's share of its sum of squares.
float rms_scale(float s, uint t) {
    part[t] = s;
    barrier();
    if (t < 16u) {
        precise float a = 0.0;
        for (uint i = 0u; i < 8u; i++) a += part[8u * t + i];
        part16[t] = a;
    }
    barrier();
    precise float tot = 0.0;
    for (uint i = 0u; i < 16u; i++) tot += part16[i];
    float sc = 1.0 / sqrt(tot / float(p.n) + p.eps);
    barrier(); // part and part16 are reused by the next call
    return sc;
}

void main() {
    uint r = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
    uint b = r * p.n;
    uint m = t < p.n ? (p.n - t + 127u) / 128u : 0u; // this lane's elements
    float yv[E], xv[E], pw[E], nw[E];
    [[unroll]] for (uint k = 0u; k < E; k++) {
        if (k >= m) break;
        uint i = t + 128u * k;
        yv[k] = y[b + i];
        xv[k] = x[b + i];
        pw[k] = p.has_post != 0u ? post_w[i] : 1.0;
        nw[k] = p.has_norm == 1u ? norm_w[i] : 1.0;
    }
    float post = 1.0;
    if (p.has_post != 0u) {
        precise float s = 0.0;
        [[unroll]] for (uint k = 0u; k < E; k++) {
            if (k >= m) break;
            s += yv[k] * yv[k];
        }
        post = rms_scale(s, t);
    }
    precise float s = 0.0;
    [[unroll]] for (uint k = 0u; k < E; k++) {
        if (k >= m) break;
        uint i = t + 128u * k;
        float v = yv[k];
        if (p.has_post != 0u) v = v * post * pw[k];
        float nx = xv[k] + (p.scale == 1.0 ? v : v * p.scale);
        x[b + i] = nx;
        xv[k] = nx;
        s += nx * nx;
    }
    if (p.has_norm == 0u) return; // the same for the whole workgroup
    float sc = rms_scale(s, t);
    [[unroll]] for (uint k = 0u; k < E; k++) {
        if (k >= m) break;
        uint i = t + 128u * k;
        float v = xv[k] * sc;
        o[b + i] = p.has_norm == 1u ? v * nw[k] : v;
    }
}
