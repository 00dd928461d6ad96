// act.glsl — the gated activation of act.comp and of matmul.comp's GLU
// input (-DX_GLU): act(g) * u with act SiLU (kind 0) or GELU (kind 1, tanh
// approximation, evaluated as the CPU backend does: the input rounded to
// f16, the result rounded to f16, and the tails cut off at |x| >= 10).
// One definition, so the fused and the separate forms give the same bits.

float act_f16(float v) {
    return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x;
}

float glu(uint kind, float v, float u) {
    float a;
    if (kind == 0u) {
        a = v / (1.0 + exp(-v));
    } else if (v <= -10.0) {
        a = 0.0;
    } else if (v >= 10.0) {
        a = v;
    } else {
        float h = act_f16(v);
        a = act_f16(0.5 * h * (1.0 + tanh(clamp(0.7978845608028654 * h * (1.0 + 0.044715 * h * h), -15.0, 15.0))));
    }
    return a * u;
}
