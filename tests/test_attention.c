/*
 * test_attention.c — the attention kernels' batched forms return exactly
 * what their single forms return (dot4_f16 against dot_f16, axpy_rows_f16
 * against one axpy_f16 per row, scale_round_f16 against the scalar f16
 * conversion), for the scalar, the chosen and every SIMD variant this CPU
 * runs (avx2, avx512, neon), on head sizes with and without a tail; and
 * each of those returns the scalar one's bits. The kernels of quantized K/V
 * rows (Q8_0, Q4_0, and Q5_0 of k5v4h's keys): the same for every
 * variant, stored rows within the format's step of their input, and the
 * scalar one against a double-precision sum over the dequantized rows.
 * The rotation of the rotated types: orthogonal, undone by attn_unrotate,
 * and it spreads a single outlier over the whole head. The tile forms
 * (many queries at once: dot_tile, axpy_tile) give each query the scalar
 * single forms' bits, and softmax gives the bits of its definition
 * (xm_expf, a double sum in order, f16 rounding) in every variant.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "base/xmath.h"
#include "cpu/attention.h"
#include "format/kernels/fp16.h"
#include "format/kernels/kernels.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / (float)0x1000000 * 2.0f - 1.0f;
}

/* Every SIMD variant this CPU runs is checked, not only the chosen one. */
static const char *const variants[] = {"avx2", "avx512", "neon"};

static void check_variant(const attn_kernels *ak, const char *name) {
    static const size_t sizes[] = {1, 7, 8, 16, 64, 72, 99, 128, 200, 216, 256};
    enum { MAXN = 256, ROWS = 37 };
    static float q[MAXN], acc1[MAXN], acc2[MAXN], w[ROWS];
    static uint16_t kv[ROWS][MAXN];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s];
        for (int round = 0; round < 20; round++) {
            for (size_t i = 0; i < n; i++) q[i] = rnd() * (round % 3 ? 1.0f : 300.0f);
            for (int r = 0; r < ROWS; r++) {
                for (size_t i = 0; i < n; i++) kv[r][i] = fp32_to_fp16(rnd());
                w[r] = rnd();
            }
            const uint16_t *k4[4] = {kv[0], kv[5], kv[9], kv[36]};
            float out[4];
            ak->dot4_f16(q, k4, n, out);
            for (int j = 0; j < 4; j++) {
                const float want = ak->dot_f16(q, k4[j], n);
                if (memcmp(&out[j], &want, sizeof want) != 0)
                    fail_msg("%s dot4_f16 n=%zu key %d: %a, dot_f16 %a", name, n, j, out[j], want);
            }
            const uint16_t *rows[ROWS];
            for (int r = 0; r < ROWS; r++) rows[r] = kv[r];
            for (size_t i = 0; i < n; i++) acc1[i] = acc2[i] = q[i];
            ak->axpy_rows_f16(acc1, w, rows, ROWS, n);
            for (int r = 0; r < ROWS; r++) ak->axpy_f16(acc2, w[r], kv[r], n);
            if (memcmp(acc1, acc2, n * sizeof(float)) != 0)
                fail_msg("%s axpy_rows_f16 n=%zu differs from axpy_f16 per row", name, n);
            /* Rounding to f16 as fp32_to_fp16 does, subnormals included. */
            for (size_t i = 0; i < n; i++) acc2[i] = rnd() * (i % 5 ? 1.0f : 1e-6f);
            ak->scale_round_f16(acc1, acc2, 0.37f, n);
            for (size_t i = 0; i < n; i++) {
                const float want = fp16_to_fp32(fp32_to_fp16(acc2[i] * 0.37f));
                if (memcmp(&acc1[i], &want, sizeof want) != 0)
                    fail_msg("%s scale_round_f16: %a, want %a", name, acc1[i], want);
            }
        }
    }
}

/* check(ak, name) for the scalar variant and every SIMD variant this CPU
 * runs. */
static void check_each_variant(void (*check)(const attn_kernels *, const char *)) {
    check(attn_kernels_ref(), "ref");
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const attn_kernels *ak = attn_kernels_variant(variants[v]);
        if (ak) check(ak, variants[v]);
    }
}

static void test_batched_forms_exact(void **state) {
    (void)state;
    check_variant(attn_kernels_get(), "chosen");
    check_each_variant(check_variant);
}

/* The chosen variant against the scalar one, bit for bit: both follow the
 * reference's order of float operations (the same lanes, FMAs and tree),
 * which keeps attention, and so the logits, the same on every CPU. Sizes
 * with and without a tail. */
static void check_same_as_ref(const attn_kernels *a, const char *name) {
    const attn_kernels *r = attn_kernels_ref();
    static const size_t sizes[] = {1, 5, 8, 13, 16, 48, 64, 67, 99, 128, 200, 216, 256};
    enum { MAXN = 256, ROWS = 9 };
    static float q[MAXN], acc1[MAXN], acc2[MAXN], w[ROWS];
    static uint16_t kv[ROWS][MAXN];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s];
        for (int round = 0; round < 50; round++) {
            for (size_t i = 0; i < n; i++) q[i] = rnd() * (round % 3 ? 1.0f : 300.0f);
            for (int j = 0; j < ROWS; j++) {
                for (size_t i = 0; i < n; i++) kv[j][i] = fp32_to_fp16(rnd());
                w[j] = rnd();
            }
            const float x = a->dot_f16(q, kv[0], n), y = r->dot_f16(q, kv[0], n);
            if (memcmp(&x, &y, sizeof x) != 0)
                fail_msg("%s dot_f16 n=%zu: %a, ref %a", name, n, x, y);
            const uint16_t *k4[4] = {kv[1], kv[2], kv[3], kv[4]};
            float o1[4], o2[4];
            a->dot4_f16(q, k4, n, o1);
            r->dot4_f16(q, k4, n, o2);
            if (memcmp(o1, o2, sizeof o1) != 0) fail_msg("%s dot4_f16 n=%zu differs", name, n);
            const uint16_t *rows[ROWS];
            for (int j = 0; j < ROWS; j++) rows[j] = kv[j];
            for (size_t i = 0; i < n; i++) acc1[i] = acc2[i] = q[i];
            a->axpy_rows_f16(acc1, w, rows, ROWS, n);
            r->axpy_rows_f16(acc2, w, rows, ROWS, n);
            if (memcmp(acc1, acc2, n * sizeof(float)) != 0)
                fail_msg("%s axpy_rows_f16 n=%zu differs", name, n);
            a->axpy_f16(acc1, w[0], kv[0], n);
            r->axpy_f16(acc2, w[0], kv[0], n);
            a->scale(acc1, 0.37f, n);
            r->scale(acc2, 0.37f, n);
            if (memcmp(acc1, acc2, n * sizeof(float)) != 0)
                fail_msg("%s axpy_f16 or scale n=%zu differs", name, n);
        }
    }
}

static void test_chosen_same_as_ref(void **state) {
    (void)state;
    check_same_as_ref(attn_kernels_get(), "chosen");
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const attn_kernels *ak = attn_kernels_variant(variants[v]);
        if (!ak) continue;
        print_message("same bits as ref: %s\n", variants[v]);
        check_same_as_ref(ak, variants[v]);
    }
}

/* Bytes per block of 32 of each quantized format. */
static size_t block_bytes(kv_format f) {
    switch (f) {
    case KV_FMT_Q8_0: return 34;
    case KV_FMT_Q5_0: return 22;
    case KV_FMT_Q3_0: return 14;
    case KV_FMT_C4: return 16;
    default: return 18;
    }
}

/* Quantized rows: store (the scalar quantizers), then every kernel of
 * every variant this CPU runs gives the scalar variant's bits, dot4 gives
 * dot's, axpy_rows over many rows gives one row at a time; the scalar dot
 * and axpy agree with double-precision sums over the dequantized rows
 * (deq: the format's own dequantizer where GGML has one, else
 * attn_kv_dequantize, which must agree with it). */
static void check_quantized_variant(kv_format f, void (*deq)(const void *, float *, size_t),
                                    const char *name, const attn_kernels *a) {
    const attn_kernels *r = attn_kernels_ref();
    static const size_t sizes[] = {32, 64, 96, 256};
    enum { MAXN = 256, ROWS = 37, ROWB = MAXN / 32 * 34 };
    static float q[MAXN], x[MAXN], deqv[ROWS][MAXN], acc1[MAXN], acc2[MAXN], acc3[MAXN], w[ROWS];
    static uint8_t rows[ROWS][ROWB];
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        assert_true(kv_row_bytes(f, n) <= ROWB);
        assert_int_equal(kv_row_bytes(f, n), n / 32 * block_bytes(f));
        for (int round = 0; round < 20; round++) {
            const float qs = round % 3 ? 1.0f : 300.0f;
            for (size_t i = 0; i < n; i++) q[i] = rnd() * qs;
            for (int j = 0; j < ROWS; j++) {
                /* Rows with an outlier now and then, as real keys have. */
                for (size_t i = 0; i < n; i++) x[i] = rnd() * (i % 29 == 3 ? 20.0f : 1.0f);
                if (f == KV_FMT_C4) /* codes with no scale: the range they hold */
                    for (size_t i = 0; i < n; i++) x[i] = x[i] * 0.35f - 0.5f;
                r->kv[f].store(rows[j], x, n);
                uint8_t again[ROWB];
                a->kv[f].store(again, x, n);
                assert_memory_equal(again, rows[j], kv_row_bytes(f, n));
                if (deq)
                    deq(rows[j], deqv[j], n);
                else
                    attn_kv_dequantize(f, rows[j], deqv[j], n);
                float generic[MAXN];
                attn_kv_dequantize(f, rows[j], generic, n);
                assert_memory_equal(generic, deqv[j], n * sizeof(float));
                /* The stored row is the input to within the format's step. */
                float amax = 0;
                for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
                /* (Q4_0's clamped end, 7 * d against an x of the other sign
                 * near amax = 8 * |d|, is amax / 8 off plus 7 times the f16
                 * rounding of d: 7 * 2^-11 of amax / 8 at most, under
                 * 1/256.) */
                const float step = f == KV_FMT_C4     ? 0.5f * (1 + 1.0f / 65536)
                                   : f == KV_FMT_Q8_0 ? amax / 127
                                   : f == KV_FMT_Q5_0 ? amax / 16 * (1 + 1.0f / 256)
                                   : f == KV_FMT_Q3_0 ? amax / 4 * (1 + 1.0f / 256)
                                                      : amax / 8 * (1 + 1.0f / 256);
                for (size_t i = 0; i < n; i++)
                    if (!(fabsf(deqv[j][i] - x[i]) <= step))
                        fail_msg("%s n=%zu: stored %a, input %a, step %a", name, n, deqv[j][i],
                                 x[i], step);
                w[j] = rnd();
            }
            const void *k4[4] = {rows[0], rows[5], rows[9], rows[36]};
            const void *vr[ROWS];
            for (int j = 0; j < ROWS; j++) vr[j] = rows[j];
            float o1[4], o2[4];
            r->kv[f].dot4(q, k4, n, o1);
            a->kv[f].dot4(q, k4, n, o2);
            for (int j = 0; j < 4; j++) {
                const float d1 = r->kv[f].dot(q, k4[j], n), d2 = a->kv[f].dot(q, k4[j], n);
                if (memcmp(&o1[j], &d1, 4) || memcmp(&o2[j], &d1, 4) || memcmp(&d2, &d1, 4))
                    fail_msg("%s n=%zu key %d: ref dot4 %a, chosen dot4 %a, chosen dot %a, ref "
                             "dot %a",
                             name, n, j, o1[j], o2[j], d2, d1);
                double want = 0, mag = 0;
                const int kj = j == 0 ? 0 : j == 1 ? 5 : j == 2 ? 9 : 36;
                for (size_t i = 0; i < n; i++) {
                    want += (double)q[i] * deqv[kj][i];
                    mag += fabs((double)q[i] * deqv[kj][i]);
                }
                if (fabs(d1 - want) > 1e-5 * mag + 1e-30)
                    fail_msg("%s n=%zu dot %g, double sum %g", name, n, d1, want);
            }
            for (size_t i = 0; i < n; i++) acc1[i] = acc2[i] = acc3[i] = q[i];
            r->kv[f].axpy_rows(acc1, w, vr, ROWS, n);
            a->kv[f].axpy_rows(acc2, w, vr, ROWS, n);
            for (int j = 0; j < ROWS; j++) a->kv[f].axpy_rows(acc3, w + j, vr + j, 1, n);
            if (memcmp(acc1, acc2, n * 4) || memcmp(acc1, acc3, n * 4))
                fail_msg("%s n=%zu axpy_rows: variants or row splits differ", name, n);
            for (size_t i = 0; i < n; i++) {
                double want = q[i], mag = fabs(q[i]);
                for (int j = 0; j < ROWS; j++) {
                    want += (double)w[j] * deqv[j][i];
                    mag += fabs((double)w[j] * deqv[j][i]);
                }
                if (fabs(acc1[i] - want) > 1e-5 * mag)
                    fail_msg("%s n=%zu axpy_rows[%zu] %g, double sum %g", name, n, i, acc1[i],
                             want);
            }
        }
    }
}

static void check_quantized(kv_format f, void (*deq)(const void *, float *, size_t),
                            const char *name) {
    check_quantized_variant(f, deq, name, attn_kernels_get());
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const attn_kernels *a = attn_kernels_variant(variants[v]);
        if (a) check_quantized_variant(f, deq, name, a);
    }
}

static void test_quantized_rows(void **state) {
    (void)state;
    check_quantized(KV_FMT_Q8_0, ref_dequantize_q8_0, "q8_0");
    check_quantized(KV_FMT_Q4_0, ref_dequantize_q4_0, "q4_0");
    check_quantized(KV_FMT_Q5_0, ref_dequantize_q5_0, "q5_0");
    /* The KV cache's own 3-bit rows: no GGML dequantizer, so the generic
     * one, checked against the input and the double sums. */
    check_quantized(KV_FMT_Q3_0, NULL, "q3_0");
    /* The per-channel keys' rows: 4-bit codes with no scale. */
    check_quantized(KV_FMT_C4, NULL, "c4");
}

/* Keys per channel (attn_kc4_*): a block of 16 positions rounded channel
 * by channel comes back within half its channel's step (each channel's
 * step within 1/16 of the head's largest, plus the f16 rounding), codes in
 * range whatever the keys (infinities and NaN included), the same bytes
 * from the same keys; and a query's score, base + dot_c4 of the folded
 * query in every variant, is the dot with the rounded keys. */
static void test_kc4_blocks(void **state) {
    (void)state;
    enum { P = KV_BLOCK_POSITIONS, MAXD = 256 };
    static const size_t dims[] = {32, 64, 256};
    static uint16_t keys[P][MAXD];
    static uint8_t codes[P][MAXD / 2], again[P][MAXD / 2], meta[4 + 7 * MAXD / 8],
        meta2[4 + 7 * MAXD / 8];
    static float st[MAXD], centre[MAXD], q[MAXD], qs[MAXD], rec[P][MAXD];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const size_t hd = dims[di];
        assert_int_equal(kv_kc4_meta_bytes(hd), 4 + 7 * hd / 8);
        for (int round = 0; round < 30; round++) {
            const uint16_t *k[P];
            uint8_t *cp[P], *cp2[P];
            /* channels of their own offset and spread, a few outliers */
            for (size_t c = 0; c < hd; c++) {
                const float off = rnd() * (c % 7 == 2 ? 30.0f : 2.0f),
                            spread = (c % 11 == 5 ? 10.0f : 1.0f) * (round % 4 ? 1.0f : 0.01f);
                for (int p = 0; p < P; p++) keys[p][c] = fp32_to_fp16(off + rnd() * spread);
            }
            if (round == 7) /* one channel the same at every position */
                for (int p = 0; p < P; p++) keys[p][3] = keys[0][3];
            if (round == 9) keys[4][1] = 0x7c00;  /* inf */
            if (round == 10) keys[2][5] = 0x7e00; /* NaN */
            for (int p = 0; p < P; p++) {
                k[p] = keys[p];
                cp[p] = codes[p];
                cp2[p] = again[p];
            }
            attn_kc4_quantize(k, hd, cp, meta);
            attn_kc4_quantize(k, hd, cp2, meta2);
            assert_memory_equal(codes, again, sizeof codes);
            assert_memory_equal(meta, meta2, kv_kc4_meta_bytes(hd));
            attn_kc4_channels(meta, hd, st, centre);
            float smax = 0;
            for (size_t c = 0; c < hd; c++) smax = fmaxf(smax, st[c]);
            for (int p = 0; p < P; p++) attn_kv_dequantize(KV_FMT_C4, codes[p], rec[p], hd);
            for (size_t c = 0; c < hd; c++) {
                assert_true(st[c] >= 0 && st[c] <= smax);
                for (int p = 0; p < P; p++) {
                    rec[p][c] = centre[c] + st[c] * rec[p][c];
                    if (round == 9 || round == 10) continue; /* no bound for those */
                    const float x = fp16_to_fp32(keys[p][c]);
                    const float tol = st[c] * 0.5f * (1 + 1e-5f) + 1e-6f * fabsf(x) + 1e-30f;
                    if (!(fabsf(rec[p][c] - x) <= tol))
                        fail_msg("hd %zu round %d channel %zu position %d: key %a, back %a, "
                                 "step %a",
                                 hd, round, c, p, x, rec[p][c], st[c]);
                }
            }
            if (round == 9 || round == 10) continue;
            for (size_t c = 0; c < hd; c++) q[c] = rnd() * (c % 5 ? 1.0f : 8.0f);
            const float base = attn_kc4_fold(q, st, centre, hd, qs);
            const void *kr[P];
            for (int p = 0; p < P; p++) kr[p] = codes[p];
            float want_bits[P];
            attn_kernels_ref()->kv[KV_FMT_C4].dot_tile(qs, 1, kr, P, hd, want_bits, P);
            for (int p = 0; p < P; p++) {
                double want = 0, mag = 0;
                for (size_t c = 0; c < hd; c++) {
                    want += (double)q[c] * rec[p][c];
                    mag += fabs((double)q[c] * centre[c]) + fabs((double)q[c] * rec[p][c]);
                }
                const float got = base + want_bits[p];
                if (fabs(got - want) > 1e-5 * mag + 1e-30)
                    fail_msg("hd %zu: score %g, double sum %g", hd, got, want);
            }
            /* three queries (a pair and one alone in the AVX2 fold), the
             * middle one q: each folded as attn_kc4_fold folds it */
            static float q3[3 * MAXD], qs3[3 * MAXD], want3[3 * MAXD];
            float wbase3[3];
            for (size_t c = 0; c < 3 * hd; c++) q3[c] = rnd() * 4.0f;
            memcpy(q3 + hd, q, hd * sizeof(float));
            for (int i = 0; i < 3; i++)
                wbase3[i] = attn_kc4_fold(q3 + i * hd, st, centre, hd, want3 + i * hd);
            assert_memory_equal(&wbase3[1], &base, sizeof base);
            for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
                const attn_kernels *a = attn_kernels_variant(variants[v]);
                if (!a) continue;
                float out[P], base3[3];
                a->kv[KV_FMT_C4].dot_tile(qs, 1, kr, P, hd, out, P);
                assert_memory_equal(out, want_bits, sizeof out);
                static float st2[MAXD], centre2[MAXD];
                a->kc4_channels(meta, hd, st2, centre2);
                assert_memory_equal(st2, st, hd * sizeof(float));
                assert_memory_equal(centre2, centre, hd * sizeof(float));
                for (size_t nq = 1; nq <= 3; nq++) {
                    a->kc4_fold(q3, nq, st, centre, hd, qs3, base3);
                    assert_memory_equal(qs3, want3, nq * hd * sizeof(float));
                    assert_memory_equal(base3, wbase3, nq * sizeof(float));
                }
            }
        }
    }
}

/* The f16 entries of kv[] are the f16 kernels. */
static void test_f16_rows(void **state) {
    (void)state;
    const attn_kernels *a = attn_kernels_get();
    enum { N = 64, ROWS = 40 };
    static float q[N], x[N], acc1[N], acc2[N], w[ROWS];
    static uint16_t rows[ROWS][N];
    const void *vr[ROWS];
    const uint16_t *vr16[ROWS];
    for (int j = 0; j < ROWS; j++) {
        for (int i = 0; i < N; i++) x[i] = rnd();
        a->kv[KV_FMT_F16].store(rows[j], x, N);
        for (int i = 0; i < N; i++) assert_int_equal(rows[j][i], fp32_to_fp16(x[i]));
        vr[j] = vr16[j] = rows[j];
        w[j] = rnd();
    }
    for (int i = 0; i < N; i++) q[i] = acc1[i] = acc2[i] = rnd();
    const float d1 = a->kv[KV_FMT_F16].dot(q, rows[3], N), d2 = a->dot_f16(q, rows[3], N);
    assert_memory_equal(&d1, &d2, 4);
    a->kv[KV_FMT_F16].axpy_rows(acc1, w, vr, ROWS, N);
    a->axpy_rows_f16(acc2, w, vr16, ROWS, N);
    assert_memory_equal(acc1, acc2, sizeof acc1);
    /* Every variant's f16 store is the scalar conversion, bit for bit: ties
     * to even, overflow to infinity at 65520, subnormals, tiny values to
     * zero, NaN payloads (quiet and signalling), in blocks of eight and a
     * tail. */
    static const uint32_t edges[] = {
        0x00000000u, 0x80000000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u,
        0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u, 0x7f800001u, 0x7fa00000u,
        0x7f7fffffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u, 0x33c00000u,
        0x337fffffu, 0x34000000u, 0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f801001u,
        0x00000001u, 0x807fffffu, 0x38000000u, 0x37800000u, 0xb7c00000u, 0x3a7ff000u};
    enum { NE = sizeof edges / sizeof edges[0] };
    float ex[N];
    for (int i = 0; i < N; i++) {
        uint32_t b = edges[i % NE] ^ (i >= NE ? 0x80000000u : 0u);
        memcpy(&ex[i], &b, 4);
    }
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const attn_kernels *av = attn_kernels_variant(variants[v]);
        if (!av) continue;
        for (int round = 0; round < 3; round++) {
            const size_t n = round == 2 ? 13 : N;
            uint16_t got[N];
            for (int i = 0; i < N && round == 1; i++) ex[i] = rnd() * 70000.0f * rnd();
            av->kv[KV_FMT_F16].store(got, ex, n);
            for (size_t i = 0; i < n; i++)
                if (got[i] != fp32_to_fp16(ex[i]))
                    fail_msg("%s store_f16(%a) = %#x, not %#x", variants[v], (double)ex[i], got[i],
                             fp32_to_fp16(ex[i]));
        }
    }
}

/* H is orthogonal (norms and dot products kept), H^T undoes it, and a
 * single spike becomes a flat vector: every element +-1/sqrt(n). */
static void test_rotation(void **state) {
    (void)state;
    static const size_t sizes[] = {1, 2, 64, 128, 256, 1024};
    static float x[1024], y[1024], x0[1024];
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        double dot0 = 0, nx = 0;
        for (size_t i = 0; i < n; i++) {
            x0[i] = x[i] = rnd();
            y[i] = rnd();
            dot0 += (double)x[i] * y[i];
            nx += (double)x[i] * x[i];
        }
        attn_rotate(x, n);
        attn_rotate(y, n);
        double dot1 = 0, nx1 = 0;
        bool moved = n == 1;
        for (size_t i = 0; i < n; i++) {
            dot1 += (double)x[i] * y[i];
            nx1 += (double)x[i] * x[i];
            moved |= x[i] != x0[i];
        }
        assert_true(moved);
        assert_true(fabs(dot1 - dot0) <= 1e-5 * (nx + 1));
        assert_true(fabs(nx1 - nx) <= 1e-5 * nx);
        attn_unrotate(x, n);
        for (size_t i = 0; i < n; i++) assert_true(fabsf(x[i] - x0[i]) <= 1e-5f);
        /* An outlier spreads over the head. */
        for (size_t i = 0; i < n; i++) x[i] = i == n / 3 ? 5.0f : 0.0f;
        attn_rotate(x, n);
        for (size_t i = 0; i < n; i++)
            assert_true(fabsf(fabsf(x[i]) - 5.0f / sqrtf((float)n)) <= 1e-5f);
        /* Fixed: the same rotation every time. */
        for (size_t i = 0; i < n; i++) y[i] = i == n / 3 ? 5.0f : 0.0f;
        attn_rotate(y, n);
        assert_memory_equal(x, y, n * sizeof(float));
    }
}

/* The tile kernels of every format and variant against the scalar single
 * forms, query by query, bit for bit: odd query and key counts, head sizes
 * with and without a SIMD tail. */
static void check_tiles(const attn_kernels *a, const char *name) {
    const attn_kernels *r = attn_kernels_ref();
    static const size_t nqs[] = {1, 3, 7, 12, 16}, nks[] = {1, 3, 4, 9, 37};
    static const size_t sizes[] = {8, 32, 64, 72, 96, 99, 128};
    enum { MAXN = 128, MAXQ = 16, ROWS = 37, ROWB = MAXN * 2 };
    static float q[MAXQ * MAXN], x[MAXN], out[MAXQ * ROWS], acc[MAXQ][MAXN], want[MAXN];
    static float w[MAXQ][ROWS];
    static uint8_t rows[ROWS][ROWB];
    for (int f = 0; f < KV_FMT_COUNT; f++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            const size_t n = sizes[si];
            if (f != KV_FMT_F16 && n % 32) continue;
            for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++)
                for (size_t ki = 0; ki < sizeof nks / sizeof nks[0]; ki++) {
                    const size_t nq = nqs[qi], nk = nks[ki];
                    for (size_t i = 0; i < nq * n; i++) q[i] = rnd() * (i % 5 ? 1.0f : 40.0f);
                    const void *kr[ROWS];
                    for (size_t j = 0; j < nk; j++) {
                        for (size_t i = 0; i < n; i++) x[i] = rnd() * (i % 29 == 3 ? 20.0f : 1.0f);
                        r->kv[f].store(rows[j], x, n);
                        kr[j] = rows[j];
                    }
                    a->kv[f].dot_tile(q, nq, kr, nk, n, out, ROWS);
                    for (size_t i = 0; i < nq; i++)
                        for (size_t j = 0; j < nk; j++) {
                            const float d = r->kv[f].dot(q + i * n, kr[j], n);
                            if (memcmp(&d, &out[i * ROWS + j], sizeof d) != 0)
                                fail_msg("%s format %d n=%zu nq=%zu nk=%zu: dot_tile[%zu][%zu] %a, "
                                         "dot %a",
                                         name, f, n, nq, nk, i, j, out[i * ROWS + j], d);
                        }
                    float *accp[MAXQ];
                    const float *wp[MAXQ];
                    for (size_t i = 0; i < nq; i++) {
                        for (size_t c = 0; c < n; c++) acc[i][c] = rnd();
                        for (size_t j = 0; j < nk; j++) w[i][j] = rnd();
                        accp[i] = acc[i];
                        wp[i] = w[i];
                    }
                    static float before[MAXQ][MAXN];
                    memcpy(before, acc, sizeof acc);
                    a->kv[f].axpy_tile(accp, wp, nq, kr, nk, n);
                    for (size_t i = 0; i < nq; i++) {
                        memcpy(want, before[i], n * sizeof(float));
                        r->kv[f].axpy_rows(want, w[i], kr, nk, n);
                        if (memcmp(want, acc[i], n * sizeof(float)) != 0)
                            fail_msg(
                                "%s format %d n=%zu nq=%zu nk=%zu: axpy_tile query %zu differs",
                                name, f, n, nq, nk, i);
                    }
                }
        }
}

/* softmax as attention.h defines it, one query at a time. */
static void softmax_spec(float *x, int32_t n, float scale, float softcap) {
    float mx = -INFINITY;
    for (int32_t p = 0; p < n; p++) {
        float v = x[p] * scale;
        if (softcap > 0) v = softcap * xm_tanhf(v / softcap);
        x[p] = v;
        if (v > mx) mx = v;
    }
    double sum = 0;
    for (int32_t p = 0; p < n; p++) {
        x[p] = xm_expf(x[p] - mx);
        sum += x[p];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t p = 0; p < n; p++) x[p] = fp16_to_fp32(fp32_to_fp16(x[p] * inv));
}

static void check_softmax(const attn_kernels *a, const char *name) {
    enum { MAXQ = 16, MAXP = 300 };
    static float s[MAXQ][MAXP], want[MAXQ][MAXP];
    static const size_t nqs[] = {1, 5, 9, 16};
    for (int round = 0; round < 40; round++)
        for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++) {
            const size_t nq = nqs[qi];
            /* Spreads from narrow to past exp's underflow at -104, and a
             * few infinite or huge scores. */
            const float spread = round % 4 == 0 ? 0.5f : round % 4 == 1 ? 30.0f : 400.0f;
            const float softcap = round % 5 == 4 ? 50.0f : 0.0f;
            float *sp[MAXQ];
            int32_t n[MAXQ];
            for (size_t i = 0; i < nq; i++) {
                n[i] = 1 + (int32_t)((rnd() + 1.0f) * 0.5f * (MAXP - 1));
                for (int32_t p = 0; p < n[i]; p++) s[i][p] = rnd() * spread;
                if (round % 7 == 3) s[i][n[i] / 2] = -INFINITY;
                if (round % 11 == 5) s[i][n[i] - 1] = 1e30f;
                memcpy(want[i], s[i], (size_t)n[i] * sizeof(float));
                softmax_spec(want[i], n[i], 0.125f, softcap);
                sp[i] = s[i];
            }
            a->softmax(sp, n, nq, 0.125f, softcap);
            for (size_t i = 0; i < nq; i++)
                if (memcmp(s[i], want[i], (size_t)n[i] * sizeof(float)) != 0)
                    fail_msg("%s softmax round %d query %zu of %zu (n %d) differs", name, round, i,
                             nq, n[i]);
        }
}

/* gelu_mul against its definition (attention.h) on a table of arbitrary
 * finite entries, with inputs across the cut-offs at +-10, f16's
 * subnormals and overflow, and lengths that leave every tail size. */
static void check_gelu(const attn_kernels *a, const char *name) {
    static uint16_t table[(1 << 16) + 1];
    enum { N = 300 };
    float g[N], u[N], x[N];
    for (uint32_t i = 0; i < (1u << 16); i++) {
        const float v = rnd() * 100.0f;
        table[i] = fp32_to_fp16(v);
    }
    table[1 << 16] = 0x7e00; /* padding: never a result */
    static const float edges[] = {-10.0f,   10.0f,  -9.999f, 9.999f,   -10.001f, 10.001f,
                                  0.0f,     -0.0f,  1e-7f,   -3e-6f,   6.1e-5f,  65519.0f,
                                  65520.0f, -1e30f, 1e30f,   INFINITY, -INFINITY};
    for (int round = 0; round < 20; round++) {
        const size_t n = (size_t)(round * 37 % N) + 1;
        for (size_t i = 0; i < n; i++) {
            const float sc = i % 7 == 0 ? 1e-5f : i % 11 == 0 ? 1e5f : 12.0f;
            x[i] = i % 13 == 5 ? edges[(i / 13 + (size_t)round) % (sizeof edges / sizeof edges[0])]
                               : rnd() * sc;
            u[i] = rnd() * 3.0f;
            g[i] = x[i];
        }
        a->gelu_mul(g, u, table, n);
        for (size_t i = 0; i < n; i++) {
            const float r = x[i] <= -10.0f  ? 0.0f
                            : x[i] >= 10.0f ? x[i]
                                            : fp16_to_fp32(table[fp32_to_fp16(x[i])]);
            const float want = r * u[i];
            if (memcmp(&g[i], &want, sizeof want) != 0)
                fail_msg("%s gelu_mul x %a: %a, want %a", name, x[i], g[i], want);
        }
    }
}

/* silu_mul against its definition, from exp's underflow to its overflow,
 * at every tail length. */
static void check_silu(const attn_kernels *a, const char *name) {
    enum { N = 300 };
    float g[N], u[N], x[N];
    static const float edges[] = {0.0f,  -0.0f,  88.7f,    -88.8f,    104.0f, -104.0f,
                                  1e30f, -1e30f, INFINITY, -INFINITY, 1e-30f};
    for (int round = 0; round < 20; round++) {
        const size_t n = (size_t)(round * 37 % N) + 1;
        for (size_t i = 0; i < n; i++) {
            x[i] = i % 13 == 5 ? edges[(i / 13 + (size_t)round) % (sizeof edges / sizeof edges[0])]
                               : rnd() * (i % 3 ? 8.0f : 150.0f);
            u[i] = rnd() * 3.0f;
            g[i] = x[i];
        }
        a->silu_mul(g, u, n);
        for (size_t i = 0; i < n; i++) {
            const float want = x[i] / (1.0f + xm_expf(-x[i])) * u[i];
            if (memcmp(&g[i], &want, sizeof want) != 0 && !(isnan(g[i]) && isnan(want)))
                fail_msg("%s silu_mul x %a: %a, want %a", name, x[i], g[i], want);
        }
    }
}

static void test_tiles_exact(void **state) {
    (void)state;
    check_each_variant(check_tiles);
    check_each_variant(check_softmax);
    check_each_variant(check_gelu);
    check_each_variant(check_silu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_forms_exact),
        cmocka_unit_test(test_chosen_same_as_ref),
        cmocka_unit_test(test_quantized_rows),
        cmocka_unit_test(test_kc4_blocks),
        cmocka_unit_test(test_f16_rows),
        cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_tiles_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
