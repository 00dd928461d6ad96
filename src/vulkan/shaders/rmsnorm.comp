#version 450
// rmsnorm.comp — out row = x row / rms(x row) * w (w optional), one
// workgroup per output row. The sum of squares is split over the
// workgroup's 128 lanes in a fixed way (lane t takes elements t, t + 128,
// ...) and reduced through shared memory in a fixed tree, so a row's result
// does not depend on the other rows of the batch. With `gather` set, output
// row r reads input row idx[r] (the rows that want logits).
layout(local_size_x = 128) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 2) writeonly buffer O { float o[]; };
layout(std430, set = 0, binding = 3) readonly buffer I { int idx[]; };

layout(push_constant) uniform P {
    uint n;          // elements per row
    uint x_stride;   // floats between input rows
    uint o_stride;   // floats between output rows
    uint has_weight; // 0: no weight (scale only)
    uint gather;     // 1: input row idx[r]
    float eps;
} p;

shared float part[128];

void main() {
    uint r = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
    uint src = (p.gather != 0u ? uint(idx[r]) : r) * p.x_stride;
    float s = 0.0;
    for (uint i = t; i < p.n; i += 128u) {
        float v = x[src + i];
        s += v * v;
    }
    part[t] = s;
    barrier();
    for (uint h = 64u; h > 0u; h >>= 1) {
        if (t < h) part[t] += part[t + h];
        barrier();
    }
    float scale = 1.0 / sqrt(part[0] / float(p.n) + p.eps);
    uint dst = r * p.o_stride;
    for (uint i = t; i < p.n; i += 128u) {
        float v = x[src + i] * scale;
        o[dst + i] = p.has_weight != 0u ? v * w[i] : v;
    }
}
