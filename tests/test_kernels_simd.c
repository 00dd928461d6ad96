/*
 * test_kernels_simd.c — every SIMD kernel against the scalar reference, on
 * random blocks and on edge cases (extreme codes and scales, saturating
 * products, rounding ties, zeros, NaN and infinity in activations).
 * Integer-exact kernels must match bit for bit; the rest within a stated
 * float-rounding bound. Kernels the CPU cannot run are skipped.
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

#include "kernels/blocks.h"
#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "quant.h"

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

static bool have_avx2(void) {
#if defined(__x86_64__)
    return avx2_cpu_supported();
#else
    return false;
#endif
}

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

/* |a - b| within (nb + 4) * FLT_EPSILON * sum |x_i y_i| of the dequantized
 * rows: both sum nb block terms of a few roundings each, in a different
 * order. */
static void assert_close(const char *what, float got, float want, const void *x, const void *y,
                         quant_to_float_fn xf, quant_to_float_fn yf, size_t n, size_t nb) {
    float *dx = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
    assert_non_null(dx);
    assert_non_null(dy);
    xf(x, dx, n);
    yf(y, dy, n);
    double mag = 0;
    for (size_t i = 0; i < n; i++) mag += fabs((double)dx[i] * dy[i]);
    free(dx);
    free(dy);
    const double tol = (double)(nb + 4) * FLT_EPSILON * mag;
    if (!(fabs((double)got - want) <= tol)) {
        fail_msg("%s: simd %.9g, ref %.9g, tolerance %.3g", what, got, want, tol);
    }
}

static void assert_same_float(const char *what, float got, float want) {
    if (fp32_bits(got) != fp32_bits(want)) {
        fail_msg("%s: simd %a, ref %a (must be identical)", what, got, want);
    }
}

#if defined(__x86_64__)

static void test_avx2_quantize_q8_0(void **state) {
    (void)state;
    if (!have_avx2()) skip();
    enum { NB = 256 };
    static float x[NB * QK8_0];
    static block_q8_0 a[NB], b[NB];
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < NB * QK8_0; i++) x[i] = rng_normal() * powf(10.0f, (float)(i % 7) - 3);
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
        ref_quantize_q8_0(x, a, NB * QK8_0);
        avx2_quantize_q8_0(x, b, NB * QK8_0);
        for (int ib = 0; ib < NB; ib++) {
            if (memcmp(&a[ib], &b[ib], sizeof a[ib]) != 0) {
                fail_msg("round %d block %d: AVX2 Q8_0 bytes differ from reference", round, ib);
            }
        }
    }
}

static void test_avx2_vec_dot_f16(void **state) {
    (void)state;
    if (!have_avx2()) skip();
    static uint16_t x[4099], y[4099];
    static const size_t sizes[] = {1, 7, 8, 15, 16, 17, 31, 33, 100, 4096, 4099};
    for (int round = 0; round < 20; round++) {
        for (size_t i = 0; i < 4099; i++) {
            x[i] = fp32_to_fp16(rng_normal() * (round == 0 ? 10000.0f : 1.0f));
            y[i] = fp32_to_fp16(rng_normal() * (round == 1 ? 1e-6f : 1.0f)); /* subnormals */
        }
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            const size_t n = sizes[s];
            const float want = ref_vec_dot_f16(n, x, y), got = avx2_vec_dot_f16(n, x, y);
            double mag = 0;
            for (size_t i = 0; i < n; i++)
                mag += fabs((double)fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
            /* 16 float lanes summed in order, then the tail: n/16 + 20
             * roundings at most, against the reference's exact sum. */
            const double tol = ((double)n / 16 + 20) * FLT_EPSILON * mag;
            if (!(fabs((double)got - want) <= tol)) {
                fail_msg("F16 n=%zu: simd %.9g, ref %.9g, tolerance %.3g", n, got, want, tol);
            }
        }
    }
}

typedef struct case32 {
    const char *name;
    size_t size;
    size_t f16_offs[2];
    int n_offs;
    quant_vec_dot_fn ref, simd;
    quant_to_float_fn to_float;
} case32;

static void test_avx2_vec_dot_32(void **state) {
    (void)state;
    if (!have_avx2()) skip();
    const case32 cases[] = {
        {"Q4_0",
         sizeof(block_q4_0),
         {0},
         1,
         ref_vec_dot_q4_0_q8_0,
         avx2_vec_dot_q4_0_q8_0,
         ref_dequantize_q4_0},
        {"Q4_1",
         sizeof(block_q4_1),
         {0, 2},
         2,
         ref_vec_dot_q4_1_q8_0,
         avx2_vec_dot_q4_1_q8_0,
         ref_dequantize_q4_1},
        /* Random bytes include -128 weights: the sign trick handles them. */
        {"Q8_0",
         sizeof(block_q8_0),
         {0},
         1,
         ref_vec_dot_q8_0_q8_0,
         avx2_vec_dot_q8_0_q8_0,
         ref_dequantize_q8_0},
    };
    static uint8_t x[NB32 * 40];
    static block_q8_0 y[NB32];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int round = 0; round < ROUNDS; round++) {
            make_blocks(x, NB32, cases[c].size, cases[c].f16_offs, cases[c].n_offs, round);
            make_q8_0(y, NB32, round % 3);
            const size_t n = NB32 * QK8_0;
            assert_close(cases[c].name, cases[c].simd(n, x, y), cases[c].ref(n, x, y), x, y,
                         cases[c].to_float, ref_dequantize_q8_0, n, NB32);
        }
    }
}

static void test_avx2_vec_dot_k(void **state) {
    (void)state;
    if (!have_avx2()) skip();
    const case32 cases[] = {
        {"Q4_K",
         sizeof(block_q4_K),
         {0, 2},
         2,
         ref_vec_dot_q4_k_q8_k,
         avx2_vec_dot_q4_k_q8_k,
         NULL},
        {"Q5_K",
         sizeof(block_q5_K),
         {0, 2},
         2,
         ref_vec_dot_q5_k_q8_k,
         avx2_vec_dot_q5_k_q8_k,
         NULL},
        {"Q6_K", sizeof(block_q6_K), {208}, 1, ref_vec_dot_q6_k_q8_k, avx2_vec_dot_q6_k_q8_k, NULL},
    };
    static uint8_t x[NBK * 210];
    static block_q8_K y[NBK];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int round = 0; round < ROUNDS; round++) {
            make_blocks(x, NBK, cases[c].size, cases[c].f16_offs, cases[c].n_offs, round);
            make_q8_k(y, NBK, round % 3);
            const size_t n = NBK * QK_K;
            assert_same_float(cases[c].name, cases[c].simd(n, x, y), cases[c].ref(n, x, y));
            /* Also a single super-block. */
            assert_same_float(cases[c].name, cases[c].simd(QK_K, x, y), cases[c].ref(QK_K, x, y));
        }
    }
}

/* The table holds the AVX2 kernels and they agree with the reference on
 * quantized real-looking data too (the matvec path end to end). */
static void test_avx2_matvec_path(void **state) {
    (void)state;
    if (!have_avx2()) skip();
    const uint32_t types[] = {QT_Q4_0, QT_Q4_1, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    const quant_vec_dot_fn refs[] = {ref_vec_dot_q4_0_q8_0, ref_vec_dot_q4_1_q8_0,
                                     ref_vec_dot_q8_0_q8_0, ref_vec_dot_q4_k_q8_k,
                                     ref_vec_dot_q5_k_q8_k, ref_vec_dot_q6_k_q8_k};
    enum { N = 2048, ROWS = 8 };
    static float w[ROWS][N], act[N];
    static uint8_t qw[ROWS][N * 2], qa[N * 2];
    for (int i = 0; i < N; i++) act[i] = rng_normal();
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < N; i++) w[r][i] = rng_normal() * 0.02f;
    }
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        const quant_type_info *info = quant_type_get(types[t]);
        const quant_type_info *yi = quant_type_get(info->vec_dot_type);
        assert_ptr_not_equal(info->vec_dot, refs[t]);
        yi->from_float(act, qa, N); /* once per activation row */
        for (int r = 0; r < ROWS; r++) {
            info->from_float(w[r], qw[r], N);
            const float got = info->vec_dot(N, qw[r], qa), want = refs[t](N, qw[r], qa);
            if (info->block_size == QK_K) {
                assert_same_float(info->name, got, want);
            } else {
                assert_close(info->name, got, want, qw[r], qa, info->to_float, yi->to_float, N,
                             N / info->block_size);
            }
        }
    }
}

#endif /* __x86_64__ */

int main(void) {
    const struct CMUnitTest tests[] = {
#if defined(__x86_64__)
        cmocka_unit_test(test_avx2_quantize_q8_0),
        cmocka_unit_test(test_avx2_vec_dot_f16),
        cmocka_unit_test(test_avx2_vec_dot_32),
        cmocka_unit_test(test_avx2_vec_dot_k),
        cmocka_unit_test(test_avx2_matvec_path),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
