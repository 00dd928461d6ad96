// qk_prep.glsl — one head of a row's Q or K made ready for attention: the
// bias, the per-head RMSNorm (QK-norm), RoPE with the row's cos/sin. Used
// by qk_prep.comp and by attention.comp's decode form, which does it itself
// to save a dispatch; one definition, so both give the same bits (a row's
// result must not depend on which form its batch took).
//
// The including shader declares buffers q, k (f32 rows), bias (bq | bk |
// bv), norm (q_norm | k_norm), rope ([row][cfg][pairs][cos, sin]), a push
// block p with n_head, n_head_kv, hd, rope_pairs, rope_neox, rope_cfg,
// rope_cfgs, flags (1: biases, 2: QK-norm) and eps, and defines PREP_HS
// (a shared float array, the head's values) and PREP_PART (a shared float
// array of at least 64 from PREP_PART_AT). Lanes tl < 64 with `on` do the
// work; every invocation of the workgroup must call it (it has barriers).

void prep_head(bool on, uint tl, uint hs0, uint part0, uint r, uint h, bool is_q) {
    uint hd = p.hd, qd = p.n_head * hd, kd = p.n_head_kv * hd;
    uint base = is_q ? r * qd + h * hd : r * kd + h * hd;
    if (on)
        for (uint i = tl; i < hd; i += 64u) {
            float x = is_q ? q[base + i] : k[base + i];
            if ((p.flags & 1u) != 0u) x += bias[(is_q ? 0u : qd) + h * hd + i];
            PREP_HS[hs0 + i] = x;
        }
    barrier();
    if ((p.flags & 2u) != 0u) {
        precise float s = 0.0;
        if (on)
            for (uint i = tl; i < hd; i += 64u) s += PREP_HS[hs0 + i] * PREP_HS[hs0 + i];
        if (on) PREP_PART[part0 + tl] = s;
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) {
            if (on && tl < w) {
                precise float a = PREP_PART[part0 + tl] + PREP_PART[part0 + tl + w];
                PREP_PART[part0 + tl] = a;
            }
            barrier();
        }
        float scale = 1.0 / sqrt(PREP_PART[part0] / float(hd) + p.eps);
        if (on)
            for (uint i = tl; i < hd; i += 64u)
                PREP_HS[hs0 + i] = PREP_HS[hs0 + i] * scale * norm[(is_q ? 0u : hd) + i];
        barrier();
    }
    if (p.rope_pairs > 0u) {
        uint rb = (r * p.rope_cfgs + p.rope_cfg) * p.rope_pairs * 2u;
        if (on)
            for (uint i = tl; i < p.rope_pairs; i += 64u) {
                uint a = p.rope_neox != 0u ? i : 2u * i;
                uint b = p.rope_neox != 0u ? i + p.rope_pairs : 2u * i + 1u;
                float c = rope[rb + 2u * i], sn = rope[rb + 2u * i + 1u];
                float x0 = PREP_HS[hs0 + a], x1 = PREP_HS[hs0 + b];
                precise float y0 = x0 * c - x1 * sn, y1 = x0 * sn + x1 * c;
                PREP_HS[hs0 + a] = y0;
                PREP_HS[hs0 + b] = y1;
            }
        barrier();
    }
}

// K head h of row r (prepared in PREP_HS[hs0 ..]) and its V (with the
// bias) into the row's KV block as f16, at the row's position: lanes tl of
// nl with `on`.
void store_kv(bool on, uint tl, uint nl, uint hs0, uint r, uint h, int blk, int pos) {
    if (!on) return;
    uint qd = p.n_head * p.hd, kd = p.n_head_kv * p.hd, vd = p.n_head_kv * p.hdv;
    uint at = uint(blk) * p.block_words;
    uint kat = at + uint(pos % 16) * p.k_row_words + h * p.hd / 2u;
    for (uint i = tl; i < p.hd / 2u; i += nl)
        kv[kat + i] = packHalf2x16(vec2(PREP_HS[hs0 + 2u * i], PREP_HS[hs0 + 2u * i + 1u]));
    uint vb = r * vd + h * p.hdv;
    uint vat = at + 16u * p.k_row_words + uint(pos % 16) * p.v_row_words + h * p.hdv / 2u;
    for (uint i = tl; i < p.hdv / 2u; i += nl) {
        float v0 = v[vb + 2u * i], v1 = v[vb + 2u * i + 1u];
        if ((p.flags & 1u) != 0u) {
            v0 += bias[qd + kd + h * p.hdv + 2u * i];
            v1 += bias[qd + kd + h * p.hdv + 2u * i + 1u];
        }
        kv[vat + i] = packHalf2x16(vec2(v0, v1));
    }
}
