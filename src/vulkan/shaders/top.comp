#version 450
// top.comp — the K best logits of each row, for rows whose next token the
// host picks greedily (engine.c's top rows): instead of a whole row of
// n_vocab floats, the host reads K (logit, token) pairs.
//
// "Best" is one total order, the one the CPU's greedy pick follows
// (sampler.c's first_of over max_of): a larger logit first, a tie to the
// lower token, -0 equal to +0 and NaN below everything (a NaN never wins
// a comparison there). Each logit becomes an unsigned key that orders as
// the float does (NaN: key 0); a pair is better when its key is larger
// or, at the same key, its token smaller. The result is the first K of
// that order whatever the split of the work or the device, so the host
// picks the token the CPU would from the whole row.
//
// Two stages, so that one row is read by many workgroups:
//   stage 0: workgroup (s, r) takes slice s of row r (CH logits) and
//            writes its K best as a list of the partial buffer;
//   stage 1: workgroup r merges row r's `slices` lists into its output.
// A list is 2K words: the K logits (their bits as read), then the K
// tokens. Within a workgroup, each lane keeps a sorted list of its K best
// (lane t reads elements t, t + 256, ...), then the lists merge pairwise
// through shared memory.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;

#define K 8

#define CH 4096 // logits a workgroup of stage 0 reads: 16 a lane
#define PER (CH / 256)

// Stage 0: the logits; stage 1: the partial lists.
layout(std430, set = 0, binding = 0) readonly buffer L { float l[]; };
// Stage 0: the partial lists; stage 1: the output lists.
layout(std430, set = 0, binding = 1) writeonly buffer O { uint o[]; };

layout(push_constant) uniform P {
    uint n;      // logits per row
    uint shift;  // stage 0: floats from the binding's start to row 0
    uint out0;   // stage 0: the row of the partial buffer of this dispatch's row 0
    uint stage;  // 0 or 1
    uint slices; // lists per row: (n + CH - 1) / CH
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
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (int i = 0; i < K; i++) {
        key[i] = 0u;
        tok[i] = 0xffffffffu; // below any token, NaN's included
    }
    uint r, at;
    if (p.stage == 0u) {
        uint sl = gl_WorkGroupID.x;
        r = gl_WorkGroupID.y;
        uint base = p.shift + r * p.n, i0 = sl * uint(CH);
        // All of a lane's loads first, so that they are in flight at once.
        float v[PER];
        [[unroll]] for (int j = 0; j < PER; j++) {
            uint i = i0 + t + uint(j) * 256u;
            v[j] = i < p.n ? l[base + i] : 0.0;
        }
        [[unroll]] for (int j = 0; j < PER; j++) {
            uint i = i0 + t + uint(j) * 256u;
            if (i < p.n) insert(key_of(v[j]), i);
        }
        at = ((p.out0 + r) * p.slices + sl) * uint(2 * K);
    } else {
        r = gl_WorkGroupID.x;
        uint base = r * p.slices * uint(2 * K);
        for (uint j = t; j < p.slices * uint(K); j += 256u) {
            uint w = base + (j / uint(K)) * uint(2 * K) + j % uint(K);
            insert(key_of(l[w]), floatBitsToUint(l[w + uint(K)]));
        }
        at = r * uint(2 * K);
    }
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
    // The list: K logits (their bits), then K tokens. A place no logit
    // reached (a slice shorter than K) holds NaN and token 0xffffffff,
    // which loses to every logit in stage 1.
    if (t < uint(K)) {
        uint tk = s_tok[t];
        uint bits = 0xffc00000u;
        if (tk != 0xffffffffu) {
            if (p.stage == 0u) {
                bits = floatBitsToUint(l[p.shift + r * p.n + tk]);
            } else {
                // the bits of the partial list that brought tk
                uint base = r * p.slices * uint(2 * K) + (tk / uint(CH)) * uint(2 * K);
                for (uint i = 0u; i < uint(K); i++)
                    if (floatBitsToUint(l[base + uint(K) + i]) == tk) bits = floatBitsToUint(l[base + i]);
            }
        }
        o[at + t] = bits;
        o[at + uint(K) + t] = tk;
    }
}
