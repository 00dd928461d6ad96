#version 450
#extension GL_GOOGLE_include_directive : require
// act.comp — g[i] = act(g[i]) * u[i] over n elements: SwiGLU (act 0:
// silu) or GeGLU (act 1), as act.glsl defines them. The decode path on a
// GPU folds this into the down projection's input (matmul.comp, X_GLU);
// this dispatch serves the devices that take matmul's lane variant.
layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) buffer G { float g[]; };
layout(std430, set = 0, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform P {
    uint n;
    uint act;
} p;

#include "act.glsl"

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= p.n) return;
    g[i] = glu(p.act, g[i], u[i]);
}
