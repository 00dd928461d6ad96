#version 450
// logits.comp — the classifier's last touches, in place over n elements:
// y *= scale, then soft-capping c * tanh(y / c) when cap > 0.
layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) buffer Y { float y[]; };

layout(push_constant) uniform P {
    uint n;
    float scale;
    float cap;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= p.n) return;
    float v = y[i] * p.scale;
    if (p.cap > 0.0) v = p.cap * tanh(clamp(v / p.cap, -15.0, 15.0)); // clamped: some drivers make tanh from exp, and NaN past +-44
    y[i] = v;
}
