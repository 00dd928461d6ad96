#version 450
// add_norm.comp — the step between two blocks of a layer, one workgroup
// per row: the block's output y, RMS-normed by the post-norm weight where
// the layer has one (Gemma 3), is added to the residual stream x (times the
// model's residual scale), and the next block's input is x's RMSNorm times
// its weight. Doing the three in one dispatch saves two barriers a block,
// which is most of what a small model's decode step waits on.
//
// Each sum of squares is rmsnorm.comp's: lane t takes elements t, t + 128,
// ..., reduced through shared memory in a fixed tree, so a row's result
// depends on that row alone, and the values are those of rmsnorm.comp and
// add.comp run one after the other. Each lane rereads only the elements it
// wrote itself, so x needs no barrier between the add and the norm.
layout(local_size_x = 128) in;

layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) readonly buffer PW { float post_w[]; };
layout(std430, set = 0, binding = 3) readonly buffer NW { float norm_w[]; };
layout(std430, set = 0, binding = 4) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n;        // elements per row (all three buffers' row stride)
    uint has_post; // 1: y is RMS-normed by post_w first
    uint has_norm; // 0: x only; 1: o = rmsnorm(x) * norm_w; 2: o = rmsnorm(x)
    float eps;
    float scale;   // the residual scale
} p;

shared float part[128];

// The rms scale of a row from each lane's share of its sum of squares.
float rms_scale(float s, uint t) {
    part[t] = s;
    barrier();
    for (uint h = 64u; h > 0u; h >>= 1) {
        if (t < h) part[t] += part[t + h];
        barrier();
    }
    float sc = 1.0 / sqrt(part[0] / float(p.n) + p.eps);
    barrier(); // part is reused by the next call
    return sc;
}

void main() {
    uint r = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
    uint b = r * p.n;
    float post = 1.0;
    if (p.has_post != 0u) {
        float s = 0.0;
        for (uint i = t; i < p.n; i += 128u) {
            float v = y[b + i];
            s += v * v;
        }
        post = rms_scale(s, t);
    }
    float s = 0.0;
    for (uint i = t; i < p.n; i += 128u) {
        float v = y[b + i];
        if (p.has_post != 0u) v = v * post * post_w[i];
        float nx = x[b + i] + (p.scale == 1.0 ? v : v * p.scale);
        x[b + i] = nx;
        s += nx * nx;
    }
    if (p.has_norm == 0u) return; // the same for the whole workgroup
    float sc = rms_scale(s, t);
    for (uint i = t; i < p.n; i += 128u) {
        float v = x[b + i] * sc;
        o[b + i] = p.has_norm == 1u ? v * norm_w[i] : v;
    }
}
