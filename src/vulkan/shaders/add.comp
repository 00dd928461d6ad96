#version 450
// add.comp — x[i] += y[i] * scale over n elements: the residual.
layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };

layout(push_constant) uniform P {
    uint n;
    float scale;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i < p.n) x[i] += p.scale == 1.0 ? y[i] : y[i] * p.scale;
}
