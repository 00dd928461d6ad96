/*
 * test_kernels_simd.c — every SIMD kernel against the scalar reference, on
 * random blocks and on edge cases (extreme codes and scales, saturating
 * products, rounding ties, zeros, NaN and infinity in activations).
 * Every kernel must match the reference bit for bit (memcmp of bytes,
 * float bits of dot products): each follows the reference's canonical
 * order of float operations, which is what makes the forward pass compute
 * the same logits on every CPU. Kernels the CPU cannot run are skipped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>

#include <cmocka.h>

#include "format/kernels/blocks.h"
#include "format/kernels/fp16.h"
#include "format/kernels/kernels.h"
#include "format/quant.h"

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static float rng_uniform(void) { /* [0, 1) */
    return (float)(rng_next() >> 40) * 0x1p-24f;
}
static float rng_normal(void) {
    float s = 0;
    for (int i = 0; i < 12; i++) s += rng_uniform();
    return s - 6.0f;
}
static void rng_bytes(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rng_next() >> 56);
}
/* A finite F16 scale, sometimes tiny or large. */
static uint16_t rng_scale(void) {
    float v = rng_normal() * 0.05f;
    const float r = rng_uniform();
    if (r < 0.05f)
        v *= 1e-4f;
    else if (r < 0.1f)
        v *= 100.0f;
    return fp32_to_fp16(v);
}

#if defined(__aarch64__)
static bool have_neon(void) {
    return true;
}
#endif

#define NB32 64 /* 32-element blocks per row */
#define NBK 8   /* 256-element super-blocks per row */
#define ROUNDS 200

/* Random Q8_0 activation blocks: codes in -127..127 (what the quantizer
 * makes); round 0 and 1 use the extremes. */
static void make_q8_0(block_q8_0 *y, int nb, int round) {
    for (int ib = 0; ib < nb; ib++) {
        y[ib].d = rng_scale();
        for (int j = 0; j < QK8_0; j++) {
            int v = (int)(rng_next() % 255) - 127;
            if (round == 0) v = 127;
            if (round == 1) v = (j & 1) ? -127 : 127;
            y[ib].qs[j] = (int8_t)v;
        }
    }
}

/* An A8 or A8S activation row (kernels/blocks.h) of nb blocks: codes and
 * F16-representable scales as make_q8_0 makes them, and for A8S the block
 * sums s = d * sum(q) rounded through F16. *one gets the same row cut to
 * its first block. */
static void make_a8(uint8_t *row, uint8_t *one, int nb, bool sums, int round) {
    float *d = (float *)(void *)row, *s = d + nb;
    int8_t *q = (int8_t *)row + (sums ? 8 : 4) * nb;
    for (int ib = 0; ib < nb; ib++) {
        block_q8_0 b;
        make_q8_0(&b, 1, round);
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) sum += b.qs[j];
        d[ib] = fp16_to_fp32(b.d);
        if (sums) s[ib] = fp16_to_fp32(fp32_to_fp16(d[ib] * (float)sum));
        memcpy(q + QK8_0 * ib, b.qs, QK8_0);
    }
    float *d1 = (float *)(void *)one;
    d1[0] = d[0];
    if (sums) d1[1] = s[0];
    memcpy(one + (sums ? 8 : 4), q, QK8_0);
}

static void make_q8_k(block_q8_K *y, int nb, int round) {
    for (int ib = 0; ib < nb; ib++) {
        y[ib].d = rng_normal() * 0.01f;
        for (int j = 0; j < QK_K; j++) {
            int v = (int)(rng_next() % 255) - 127;
            if (round == 0) v = 127;
            if (round == 1) v = -127;
            y[ib].qs[j] = (int8_t)v;
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[ib].qs[16 * g + l];
            y[ib].bsums[g] = (int16_t)s;
        }
    }
}

/* Random weight blocks: random bytes with finite scales at the given F16
 * offsets. Round 0: every byte 0xFF (largest codes and scales); round 1:
 * every byte 0x00. */
static void make_blocks(uint8_t *x, int nb, size_t size, const size_t *f16_offs, int n_offs,
                        int round) {
    for (int ib = 0; ib < nb; ib++) {
        uint8_t *b = x + (size_t)ib * size;
        if (round == 0)
            memset(b, 0xFF, size);
        else if (round == 1)
            memset(b, 0x00, size);
        else
            rng_bytes(b, size);
        for (int k = 0; k < n_offs; k++) {
            uint16_t d = rng_scale();
            memcpy(b + f16_offs[k], &d, 2);
        }
    }
}

static void assert_same_float(const char *what, float got, float want) {
    if (fp32_bits(got) != fp32_bits(want)) {
        fail_msg("%s: simd %a, ref %a (must be identical)", what, got, want);
    }
}

/* ---- the kernels under test, per instruction set ---- */

typedef struct quant_case {
    const char *name;
    uint32_t type; /* the type written */
    quant_from_float_fn ref, simd;
    bool (*supported)(void);
} quant_case;

typedef struct dot_case {
    const char *name;
    uint32_t type; /* weight type; y is its vec_dot_type */
    quant_vec_dot_fn ref, simd;
    bool (*supported)(void);
} dot_case;

static const quant_case quant_cases[] = {
#if defined(__x86_64__)
    {"avx2 A8", QT_A8, ref_quantize_a8, avx2_quantize_a8, avx2_cpu_supported},
    {"avx2 A8S", QT_A8S, ref_quantize_a8s, avx2_quantize_a8s, avx2_cpu_supported},
    {"avx2 Q8_K", QT_Q8_K, ref_quantize_q8_k, avx2_quantize_q8_k, avx2_cpu_supported},
    {"avx512 A8", QT_A8, ref_quantize_a8, avx512_quantize_a8, avx512_cpu_supported},
    {"avx512 A8S", QT_A8S, ref_quantize_a8s, avx512_quantize_a8s, avx512_cpu_supported},
#endif
#if defined(__aarch64__)
    {"neon A8", QT_A8, ref_quantize_a8, neon_quantize_a8, have_neon},
    {"neon A8S", QT_A8S, ref_quantize_a8s, neon_quantize_a8s, have_neon},
#endif
    {NULL, 0, NULL, NULL, NULL},
};

static const dot_case dot_cases[] = {
#if defined(__x86_64__)
    {"avx2 Q4_0", QT_Q4_0, ref_vec_dot_q4_0_a8, avx2_vec_dot_q4_0_a8, avx2_cpu_supported},
    {"avx2 Q4_1", QT_Q4_1, ref_vec_dot_q4_1_a8s, avx2_vec_dot_q4_1_a8s, avx2_cpu_supported},
    {"avx2 Q5_0", QT_Q5_0, ref_vec_dot_q5_0_a8, avx2_vec_dot_q5_0_a8, avx2_cpu_supported},
    {"avx2 Q8_0", QT_Q8_0, ref_vec_dot_q8_0_a8, avx2_vec_dot_q8_0_a8, avx2_cpu_supported},
    {"avx512 Q4_0", QT_Q4_0, ref_vec_dot_q4_0_a8, avx512_vec_dot_q4_0_a8, avx512_cpu_supported},
    {"avx512 Q4_1", QT_Q4_1, ref_vec_dot_q4_1_a8s, avx512_vec_dot_q4_1_a8s, avx512_cpu_supported},
    {"avx512 Q5_0", QT_Q5_0, ref_vec_dot_q5_0_a8, avx512_vec_dot_q5_0_a8, avx512_cpu_supported},
    {"avx512 Q8_0", QT_Q8_0, ref_vec_dot_q8_0_a8, avx512_vec_dot_q8_0_a8, avx512_cpu_supported},
    {"avx2 Q4_K", QT_Q4_K, ref_vec_dot_q4_k_q8_k, avx2_vec_dot_q4_k_q8_k, avx2_cpu_supported},
    {"avx2 Q5_K", QT_Q5_K, ref_vec_dot_q5_k_q8_k, avx2_vec_dot_q5_k_q8_k, avx2_cpu_supported},
    {"avx2 Q6_K", QT_Q6_K, ref_vec_dot_q6_k_q8_k, avx2_vec_dot_q6_k_q8_k, avx2_cpu_supported},
    {"avx512 Q4_K", QT_Q4_K, ref_vec_dot_q4_k_q8_k, avx512_vec_dot_q4_k_q8_k, avx512_cpu_supported},
#endif
#if defined(__aarch64__)
    {"neon Q4_0", QT_Q4_0, ref_vec_dot_q4_0_a8, neon_vec_dot_q4_0_a8, have_neon},
    {"neon Q4_1", QT_Q4_1, ref_vec_dot_q4_1_a8s, neon_vec_dot_q4_1_a8s, have_neon},
    {"neon Q5_0", QT_Q5_0, ref_vec_dot_q5_0_a8, neon_vec_dot_q5_0_a8, have_neon},
    {"neon Q8_0", QT_Q8_0, ref_vec_dot_q8_0_a8, neon_vec_dot_q8_0_a8, have_neon},
    {"neon Q4_K", QT_Q4_K, ref_vec_dot_q4_k_q8_k, neon_vec_dot_q4_k_q8_k, have_neon},
    {"neon Q5_K", QT_Q5_K, ref_vec_dot_q5_k_q8_k, neon_vec_dot_q5_k_q8_k, have_neon},
    {"neon Q6_K", QT_Q6_K, ref_vec_dot_q6_k_q8_k, neon_vec_dot_q6_k_q8_k, have_neon},
    {"neon-dotprod Q4_0", QT_Q4_0, ref_vec_dot_q4_0_a8, neon_dotprod_vec_dot_q4_0_a8,
     neon_dotprod_supported},
    {"neon-dotprod Q4_1", QT_Q4_1, ref_vec_dot_q4_1_a8s, neon_dotprod_vec_dot_q4_1_a8s,
     neon_dotprod_supported},
    {"neon-dotprod Q5_0", QT_Q5_0, ref_vec_dot_q5_0_a8, neon_dotprod_vec_dot_q5_0_a8,
     neon_dotprod_supported},
    {"neon-dotprod Q8_0", QT_Q8_0, ref_vec_dot_q8_0_a8, neon_dotprod_vec_dot_q8_0_a8,
     neon_dotprod_supported},
    {"neon-dotprod Q4_K", QT_Q4_K, ref_vec_dot_q4_k_q8_k, neon_dotprod_vec_dot_q4_k_q8_k,
     neon_dotprod_supported},
    {"neon-dotprod Q5_K", QT_Q5_K, ref_vec_dot_q5_k_q8_k, neon_dotprod_vec_dot_q5_k_q8_k,
     neon_dotprod_supported},
    {"neon-dotprod Q6_K", QT_Q6_K, ref_vec_dot_q6_k_q8_k, neon_dotprod_vec_dot_q6_k_q8_k,
     neon_dotprod_supported},
#endif
    {NULL, 0, NULL, NULL, NULL},
};

/* Where each weight type keeps its F16 scales. */
static int f16_fields(uint32_t type, size_t offs[2]) {
    switch (type) {
    case QT_Q4_1: offs[0] = 0, offs[1] = 2; return 2;
    case QT_Q4_K:
    case QT_Q5_K: offs[0] = 0, offs[1] = 2; return 2;
    case QT_Q6_K: offs[0] = 208; return 1;
    default: offs[0] = 0; return 1; /* Q4_0, Q8_0 */
    }
}

static void test_quantizers(void **state) {
    (void)state;
    enum { NB = 256 }; /* in 32-element blocks: 32 Q8_K blocks */
    static float x[NB * QK8_0];
    /* Room for the largest output: A8S (40 bytes per 32) and Q8_K take more
     * bytes per element than the others. */
    static _Alignas(32) uint8_t a[NB * 40 + NB * QK8_0 / QK_K * sizeof(block_q8_K)];
    static _Alignas(32) uint8_t b[sizeof a];
    int ran = 0;
    for (const quant_case *c = quant_cases; c->name; c++) {
        if (!c->supported()) continue;
        ran++;
        for (int round = 0; round < 20; round++) {
            for (int i = 0; i < NB * QK8_0; i++) {
                x[i] = rng_normal() * powf(10.0f, (float)(i % 7) - 3);
            }
            /* Edge blocks: zeros, exact ties (k + 0.5 after scaling), the
             * largest float below 0.5 after scaling, subnormals, -0, NaN,
             * infinity, huge values that overflow the F16 scale. */
            for (int j = 0; j < QK8_0; j++) {
                x[0 * 32 + j] = 0.0f;
                x[1 * 32 + j] = (j == 0) ? 127.0f : (float)j - 15.5f;
                x[2 * 32 + j] = (j == 0) ? 127.0f : nextafterf(0.5f, 0.0f) * (float)(j % 3);
                x[3 * 32 + j] = 1e-40f * (float)(j - 16);
                x[4 * 32 + j] = (j % 2) ? -0.0f : 1e-3f;
                x[5 * 32 + j] = (j == 7) ? NAN : (float)j;
                x[6 * 32 + j] = (j == 3) ? INFINITY : (float)j;
                x[7 * 32 + j] = 1e30f * (float)(j - 10);
                x[8 * 32 + j] = -(float)j * 1.0000001f;
            }
            const quant_type_info *info = quant_type_get(c->type);
            const size_t nb = (size_t)NB * QK8_0 / info->block_size;
            c->ref(x, a, NB * QK8_0);
            c->simd(x, b, NB * QK8_0);
            for (size_t ib = 0; ib < nb; ib++) {
                const size_t off = ib * info->type_size;
                if (memcmp(a + off, b + off, info->type_size) != 0) {
                    fail_msg("%s: round %d block %zu differs from the reference", c->name, round,
                             ib);
                }
            }
            /* Short rows (a kernel may take several blocks at a time and
             * the rest one by one), starting at the edge blocks. */
            static const size_t short_rows[] = {1, 7, 9, 18};
            for (size_t k = 0; info->block_size == QK8_0 && k < 4; k++) {
                size_t n = short_rows[k] * QK8_0, bytes = n / QK8_0 * info->type_size;
                memset(a, 0, bytes);
                memset(b, 0xff, bytes);
                c->ref(x, a, n);
                c->simd(x, b, n);
                if (memcmp(a, b, bytes) != 0)
                    fail_msg("%s: round %d, a row of %zu blocks differs from the reference",
                             c->name, round, short_rows[k]);
            }
        }
    }
    print_message("%d quantizer variant(s) checked\n", ran);
}

/* The activation quantizers' rounding near every tie: blocks led by 127
 * or -127 (so the scale is 1 and each code is round_clamp of its x, but
 * in the blocks that hold ±127.5), filled with the floats a few ulps
 * either side of k + 0.5 for every k in -128..127 and of 127 and -127
 * themselves; the SIMD bytes are the reference's. */
static void test_quantizer_ties(void **state) {
    (void)state;
    enum { ULPS = 6, PER = 2 * ULPS + 1, VALUES = 258 * PER, NB = (VALUES + 30) / 31 };
    static float x[NB * QK8_0];
    static _Alignas(32) uint8_t a[NB * 40], b[NB * 40];
    size_t v = 0;
    for (int i = 0; i < NB * QK8_0; i++) {
        if (i % QK8_0 == 0) {
            x[i] = (i / QK8_0) % 2 ? -127.0f : 127.0f;
            continue;
        }
        int t = (int)(v / PER), u = (int)(v % PER) - ULPS;
        float c = t < 256 ? (float)(t - 128) + 0.5f : t == 256 ? 127.0f : -127.0f;
        for (; u < 0; u++) c = nextafterf(c, -INFINITY);
        for (; u > 0; u--) c = nextafterf(c, INFINITY);
        x[i] = v < VALUES ? c : 0.0f;
        v++;
    }
    int ran = 0;
    for (const quant_case *c = quant_cases; c->name; c++) {
        if (!c->supported() || quant_type_get(c->type)->block_size != QK8_0) continue;
        ran++;
        const size_t bytes = NB * quant_type_get(c->type)->type_size;
        memset(a, 0, bytes);
        memset(b, 0xff, bytes);
        c->ref(x, a, NB * QK8_0);
        c->simd(x, b, NB * QK8_0);
        if (memcmp(a, b, bytes) != 0) fail_msg("%s: a tie rounds unlike the reference", c->name);
    }
    print_message("%d quantizer variant(s) checked at the ties\n", ran);
}

/* Random and edge weight blocks against random and extreme activations.
 * Random bytes include -128 Q8_0 weights, which the kernels must handle. */
static void test_vec_dots(void **state) {
    (void)state;
    static uint8_t x[NB32 * 40 + NBK * 210];
    static float a8_row[NB32 * 40 / 4], a8_one[40 / 4]; /* float: 4-byte aligned */
    static block_q8_K yk[NBK];
    int ran = 0;
    for (const dot_case *c = dot_cases; c->name; c++) {
        if (!c->supported()) continue;
        ran++;
        const quant_type_info *info = quant_type_get(c->type);
        const bool k = info->block_size == QK_K;
        const int nb = k ? NBK : NB32;
        const size_t n = (size_t)nb * info->block_size;
        size_t offs[2];
        const int n_offs = f16_fields(c->type, offs);
        for (int round = 0; round < ROUNDS; round++) {
            make_blocks(x, nb, info->type_size, offs, n_offs, round);
            const void *y = yk, *y_one = yk;
            if (k) {
                make_q8_k(yk, nb, round % 3);
            } else {
                make_a8((uint8_t *)a8_row, (uint8_t *)a8_one, nb, info->vec_dot_type == QT_A8S,
                        round % 3);
                y = a8_row;
                y_one = a8_one;
            }
            for (int whole = 0; whole < 2; whole++) {
                const size_t len = whole ? n : info->block_size; /* one block, then all */
                const void *yl = whole ? y : y_one; /* A8 rows are laid out for their length */
                const float got = c->simd(len, x, yl), want = c->ref(len, x, yl);
                assert_same_float(c->name, got, want);
            }
        }
    }
    print_message("%d vec_dot variant(s) checked\n", ran);
}

/* The table's tiles (dot4_y and dot8_y: four and eight activation rows;
 * dot8_y_x2: pairs of weight rows by eight activation rows) return exactly what
 * its vec_dot returns for each pair: the batch invariance of matmul rests
 * on this. */
static void test_dot4_tiles(void **state) {
    (void)state;
    enum { ROWS = 8, NB = 24 };
    static float f[ROWS * NB * QK_K];
    static _Alignas(32) uint8_t w[ROWS * NB * 210], a[ROWS * NB * sizeof(block_q8_K)];
    int ran = 0;
    for (uint32_t type = 0; type < QT_COUNT; type++) {
        const quant_type_info *info = quant_type_get(type);
        if (!info || !info->vec_dot || !info->dot4_y) continue;
        const quant_type_info *yinfo = quant_type_get(info->vec_dot_type);
        ran++;
        for (int round = 0; round < 50; round++) {
            const size_t n = (size_t)(1 + round % NB) * info->block_size;
            uint64_t wrow, arow;
            assert_true(quant_nbytes(type, n, &wrow) && quant_nbytes(info->vec_dot_type, n, &arow));
            for (size_t i = 0; i < ROWS * n; i++) f[i] = rng_normal();
            for (int r = 0; r < ROWS; r++) {
                info->from_float(f + (size_t)r * n, w + (size_t)r * wrow, n);
                for (size_t i = 0; i < n; i++) f[i] = rng_normal() * (round % 2 ? 100.0f : 1.0f);
                yinfo->from_float(f, a + (size_t)r * arow, n);
            }
            float out[16];
            if (info->dot8_y_x2) {
                /* one pair, then two, at an output stride one wider: the
                 * column past them untouched */
                for (size_t pairs = 1; pairs <= 2; pairs++) {
                    const size_t os = 2 * pairs + 1;
                    float wide[8 * 5];
                    for (size_t i = 0; i < 8 * os; i++) wide[i] = -7.0f;
                    info->dot8_y_x2(n, w, (size_t)wrow, pairs, a, (size_t)arow, wide, os);
                    for (size_t i = 0; i < 8; i++) {
                        for (size_t v = 0; v < 2 * pairs; v++)
                            assert_same_float(info->name, wide[os * i + v],
                                              info->vec_dot(n, w + v * wrow, a + i * arow));
                        assert_same_float(info->name, wide[os * i + 2 * pairs], -7.0f);
                    }
                }
            }
            if (info->dot8_y) {
                info->dot8_y(n, w, 0, a, (size_t)arow, out);
                for (int i = 0; i < 8; i++)
                    assert_same_float(info->name, out[i], info->vec_dot(n, w, a + i * arow));
            }
            info->dot4_y(n, w, 0, a, (size_t)arow, out);
            for (int i = 0; i < 4; i++)
                assert_same_float(info->name, out[i], info->vec_dot(n, w, a + i * arow));
        }
    }
    print_message("%d type(s) with tiles checked (%s)\n", ran, quant_kernels_name());
}

#if defined(__x86_64__)
/* The AVX-512 kernels return exactly what the AVX2 ones return, single
 * dots and tiles, on random rows of every length from 1 to 24 blocks (odd
 * counts take the 256-bit tail; Q4_K's blocks are super-blocks). */
static void test_avx512_same_as_avx2(void **state) {
    (void)state;
    if (!avx512_cpu_supported()) skip();
    static const struct {
        uint32_t type;
        quant_vec_dot_fn a2, a5;
        quant_vec_dot4_fn t2, t5;
    } pairs[] = {
        {QT_Q4_0, avx2_vec_dot_q4_0_a8, avx512_vec_dot_q4_0_a8, avx2_dot4_y_q4_0_a8,
         avx512_dot4_y_q4_0_a8},
        {QT_Q4_1, avx2_vec_dot_q4_1_a8s, avx512_vec_dot_q4_1_a8s, avx2_dot4_y_q4_1_a8s,
         avx512_dot4_y_q4_1_a8s},
        {QT_Q5_0, avx2_vec_dot_q5_0_a8, avx512_vec_dot_q5_0_a8, avx2_dot4_y_q5_0_a8,
         avx512_dot4_y_q5_0_a8},
        {QT_Q8_0, avx2_vec_dot_q8_0_a8, avx512_vec_dot_q8_0_a8, avx2_dot4_y_q8_0_a8,
         avx512_dot4_y_q8_0_a8},
        {QT_Q4_K, avx2_vec_dot_q4_k_q8_k, avx512_vec_dot_q4_k_q8_k, avx2_dot4_y_q4_k_q8_k,
         avx512_dot4_y_q4_k_q8_k},
        {QT_Q6_K, avx2_vec_dot_q6_k_q8_k, avx512_vec_dot_q6_k_q8_k, avx2_dot4_y_q6_k_q8_k,
         avx512_dot4_y_q6_k_q8_k},
    };
    enum { NB = 24 };
    static _Alignas(32) uint8_t w[NB * sizeof(block_q8_K)], a[4][NB * sizeof(block_q8_K) + 64];
    static float f[NB * QK_K];
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        const quant_type_info *info = quant_type_get(pairs[p].type);
        const quant_type_info *yi = quant_type_get(info->vec_dot_type);
        for (int round = 0; round < 200; round++) {
            const size_t n = (size_t)(1 + round % NB) * info->block_size;
            size_t offs[2];
            make_blocks(w, (int)(n / info->block_size), info->type_size, offs,
                        f16_fields(pairs[p].type, offs), round);
            uint64_t arow;
            assert_true(quant_nbytes(info->vec_dot_type, n, &arow));
            for (int r = 0; r < 4; r++) {
                for (size_t i = 0; i < n; i++) f[i] = rng_normal() * (round % 3 ? 1.0f : 1e4f);
                yi->from_float(f, a[r], n);
            }
            assert_same_float(info->name, pairs[p].a5(n, w, a[0]), pairs[p].a2(n, w, a[0]));
            float o2[4], o5[4];
            pairs[p].t2(n, w, 0, a[0], sizeof a[0], o2);
            pairs[p].t5(n, w, 0, a[0], sizeof a[0], o5);
            for (int r = 0; r < 4; r++) assert_same_float(info->name, o5[r], o2[r]);
        }
    }
}

#endif

/* The F16 dot products against the reference, bit for bit. */
static const struct {
    const char *name;
    quant_vec_dot_fn simd;
    bool (*supported)(void);
} f16_cases[] = {
#if defined(__x86_64__)
    {"avx2 F16", avx2_vec_dot_f16, avx2_cpu_supported},
#endif
#if defined(__aarch64__)
    {"neon F16", neon_vec_dot_f16, have_neon},
#endif
    {NULL, NULL, NULL},
};

static void test_vec_dot_f16(void **state) {
    (void)state;
    static uint16_t x[4099], y[4099];
    static const size_t sizes[] = {1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 100, 4096, 4099};
    int ran = 0;
    for (int c = 0; f16_cases[c].name; c++) {
        if (!f16_cases[c].supported()) continue;
        ran++;
        for (int round = 0; round < 20; round++) {
            for (size_t i = 0; i < 4099; i++) {
                x[i] = fp32_to_fp16(rng_normal() * (round == 0 ? 10000.0f : 1.0f));
                y[i] = fp32_to_fp16(rng_normal() * (round == 1 ? 1e-6f : 1.0f)); /* subnormals */
            }
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                const size_t n = sizes[s];
                const float want = ref_vec_dot_f16(n, x, y), got = f16_cases[c].simd(n, x, y);
                if (fp32_bits(got) != fp32_bits(want)) {
                    fail_msg("%s n=%zu: simd %a, ref %a (must be identical)", f16_cases[c].name, n,
                             got, want);
                }
            }
        }
    }
    print_message("%d F16 variant(s) checked\n", ran);
}

/* The F16 tiles (one weight row against four or eight rows) against the
 * reference for each pair, bit for bit, called directly so that every
 * variant this CPU runs is checked, not only the table's. */
static const struct {
    const char *name;
    void (*tile)(size_t n, const void *x, size_t xs, const void *y, size_t ys, float *out);
    int rows;
    bool (*supported)(void);
} f16_tiles[] = {
#if defined(__x86_64__)
    {"avx2 F16 dot4_y", avx2_dot4_y_f16, 4, avx2_cpu_supported},
    {"avx512 F16 dot4_y", avx512_dot4_y_f16, 4, avx512_cpu_supported},
    {"avx512 F16 dot8_y", avx512_dot8_y_f16, 8, avx512_cpu_supported},
#endif
#if defined(__aarch64__)
    {"neon F16 dot4_y", neon_dot4_y_f16, 4, have_neon},
#endif
    {NULL, NULL, 0, NULL},
};

static void test_f16_tiles(void **state) {
    (void)state;
    enum { N = 4099 };
    static uint16_t x[N], y[8][N];
    static const size_t sizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 100, 576, 4099};
    int ran = 0;
    for (int c = 0; f16_tiles[c].name; c++) {
        if (!f16_tiles[c].supported()) continue;
        ran++;
        for (int round = 0; round < 10; round++) {
            for (size_t i = 0; i < N; i++) {
                x[i] = fp32_to_fp16(rng_normal() * (round == 0 ? 10000.0f : 1.0f));
                for (int r = 0; r < 8; r++)
                    y[r][i] = fp32_to_fp16(rng_normal() * (round == 1 ? 1e-6f : 1.0f));
            }
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                const size_t n = sizes[s];
                float out[8];
                f16_tiles[c].tile(n, x, 0, y[0], sizeof y[0], out);
                for (int r = 0; r < f16_tiles[c].rows; r++) {
                    const float want = ref_vec_dot_f16(n, x, y[r]);
                    if (fp32_bits(out[r]) != fp32_bits(want))
                        fail_msg("%s n=%zu row %d: %a, ref %a (must be identical)",
                                 f16_tiles[c].name, n, r, out[r], want);
                }
            }
        }
    }
    print_message("%d F16 tile variant(s) checked\n", ran);
}

/* The table holds a SIMD kernel where this CPU has one, and the matvec
 * path (quantize the activation once, vec_dot per row) agrees with the
 * reference on realistic rows. */
static void test_matvec_path(void **state) {
    (void)state;
    enum { N = 2048, ROWS = 8 };
    static float w[ROWS][N], act[N];
    static _Alignas(32) uint8_t qw[ROWS][N * 2], qa[N * 2];
    for (int i = 0; i < N; i++) act[i] = rng_normal();
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < N; i++) w[r][i] = rng_normal() * 0.02f;
    }
    print_message("table kernels: %s\n", quant_kernels_name());
    for (const dot_case *c = dot_cases; c->name; c++) {
        if (!c->supported()) continue;
        const quant_type_info *info = quant_type_get(c->type);
        const quant_type_info *yi = quant_type_get(info->vec_dot_type);
        assert_ptr_not_equal(info->vec_dot, c->ref);
        yi->from_float(act, qa, N);
        for (int r = 0; r < ROWS; r++) {
            info->from_float(w[r], qw[r], N);
            const float got = c->simd(N, qw[r], qa), want = c->ref(N, qw[r], qa);
            assert_same_float(c->name, got, want);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantizers),
        cmocka_unit_test(test_quantizer_ties),
        cmocka_unit_test(test_vec_dots),
        cmocka_unit_test(test_dot4_tiles),
#if defined(__x86_64__)
        cmocka_unit_test(test_avx512_same_as_avx2),
#endif
        cmocka_unit_test(test_vec_dot_f16),
        cmocka_unit_test(test_f16_tiles),
        cmocka_unit_test(test_matvec_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
