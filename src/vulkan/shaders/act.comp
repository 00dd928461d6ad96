#version 450
// act.comp — g[i] = act(g[i]) * u[i] over n elements: SwiGLU (act 0:
// silu) or GeGLU (act 1: GELU, tanh approximation, evaluated as the CPU
// backend does: the input rounded to f16, the result rounded to f16, and
// the tails cut off at |x| >= 10).
layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) buffer G { float g[]; };
layout(std430, set = 0, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform P {
    uint n;
    uint act;
} p;

float f16(float v) {
    return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x;
}

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= p.n) return;
    float v = g[i], a;
    if (p.act == 0u) {
        a = v / (1.0 + exp(-v));
    } else if (v <= -10.0) {
        a = 0.0;
    } else if (v >= 10.0) {
        a = v;
    } else {
        float h = f16(v);
        a = f16(0.5 * h * (1.0 + tanh(clamp(0.7978845608028654 * h * (1.0 + 0.044715 * h * h), -15.0, 15.0))));
    }
    g[i] = a * u[i];
}
