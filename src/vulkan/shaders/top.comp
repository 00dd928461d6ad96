#version 450
// top.comp — the K best logits of each row, for rows whose next token the
// host picks greedily (engine.c's top rows): instead of a whole row of
// n_vocab floats, the host reads K (logit, token) pairs. One workgroup per
// row.
//
// "Best" is one total order, the one the CPU's greedy pick follows
// (sampler.c's first_of over max_of): a larger logit first, a tie to the
// lower token, -0 equal to +0 and NaN below everything (a NaN never wins
// a comparison there). Each logit becomes an unsigned key that orders as
// the float does (NaN: key 0); a pair is better when its key is larger
// or, at the same key, its token smaller. The result is the first K of
// that order whatever the workgroup size or the device, so the host picks
// the token the CPU would from the whole row.
//
// Each lane keeps a sorted list of its K best (lane t reads elements t,
// t + 256, ...), then the lists merge pairwise through shared memory.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;

#define K 8

layout(std430, set = 0, binding = 0) readonly buffer L { float l[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { uint o[]; };

layout(push_constant) uniform P {
    uint n;     // logits per row
    uint shift; // floats from the binding's start to row 0
    uint out0;  // the output row of this dispatch's row 0
} p;

shared uint s_key[256 * K];
shared uint s_tok[256 * K];

uint key_of(float v) {
    if (isnan(v)) return 0u;
    uint u = v == 0.0 ? 0u : floatBitsToUint(v); // -0 as +0
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

bool better(uint ka, uint ta, uint kb, uint tb) {
    return ka > kb || (ka == kb && ta < tb);
}

uint key[K];
uint tok[K];

// Puts (k, t) in the sorted list when it beats the last entry.
void insert(uint k, uint t) {
    if (!better(k, t, key[K - 1], tok[K - 1])) return;
    key[K - 1] = k;
    tok[K - 1] = t;
    [[unroll]] for (int i = K - 1; i > 0; i--) {
        if (better(key[i], tok[i], key[i - 1], tok[i - 1])) {
            uint a = key[i], b = tok[i];
            key[i] = key[i - 1];
            tok[i] = tok[i - 1];
            key[i - 1] = a;
            tok[i - 1] = b;
        }
    }
}

void main() {
    uint r = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
    uint base = p.shift + r * p.n;
    [[unroll]] for (int i = 0; i < K; i++) {
        key[i] = 0u;
        tok[i] = 0xffffffffu; // below any token, NaN's included
    }
    for (uint i = t; i < p.n; i += 256u) insert(key_of(l[base + i]), i);
    [[unroll]] for (int i = 0; i < K; i++) {
        s_key[t * K + i] = key[i];
        s_tok[t * K + i] = tok[i];
    }
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h) {
            // The other list is sorted: once one of it loses, the rest do.
            for (uint i = 0u; i < K; i++) {
                uint k = s_key[(t + h) * K + i], tk = s_tok[(t + h) * K + i];
                if (!better(k, tk, key[K - 1], tok[K - 1])) break;
                insert(k, tk);
            }
        }
        barrier();
        if (t < h) {
            [[unroll]] for (int i = 0; i < K; i++) {
                s_key[t * K + i] = key[i];
                s_tok[t * K + i] = tok[i];
            }
        }
        barrier();
    }
    // Row r's output: K logits (their bits as read), then K tokens.
    if (t < uint(K)) {
        uint tk = s_tok[t];
        uint at = (p.out0 + r) * uint(2 * K);
        o[at + t] = tk < p.n ? floatBitsToUint(l[base + tk]) : 0xffc00000u;
        o[at + uint(K) + t] = tk;
    }
}
