/*
 * test_attention.c — the attention kernels' batched forms return exactly
 * what their single forms return (dot4_f16 against dot_f16, axpy_rows_f16
 * against one axpy_f16 per row, scale_round_f16 against the scalar f16
 * conversion), for the scalar and the chosen variant, on
 * head sizes with and without a tail; and the chosen variant returns
 * the scalar one's bits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "attention.h"
#include "kernels/fp16.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / (float)0x1000000 * 2.0f - 1.0f;
}

static void check_variant(const attn_kernels *ak, const char *name) {
    static const size_t sizes[] = {1, 7, 8, 64, 72, 128, 200, 256};
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

static void test_batched_forms_exact(void **state) {
    (void)state;
    check_variant(attn_kernels_ref(), "ref");
    check_variant(attn_kernels_get(), "chosen");
}

/* The chosen variant against the scalar one, bit for bit: both follow the
 * reference's order of float operations (the same lanes, FMAs and tree),
 * which keeps attention, and so the logits, the same on every CPU. Sizes
 * with and without a tail. */
static void test_chosen_same_as_ref(void **state) {
    (void)state;
    const attn_kernels *a = attn_kernels_get(), *r = attn_kernels_ref();
    static const size_t sizes[] = {1, 5, 8, 13, 64, 67, 128, 256};
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
                fail_msg("dot_f16 n=%zu: chosen %a, ref %a", n, x, y);
            const uint16_t *k4[4] = {kv[1], kv[2], kv[3], kv[4]};
            float o1[4], o2[4];
            a->dot4_f16(q, k4, n, o1);
            r->dot4_f16(q, k4, n, o2);
            if (memcmp(o1, o2, sizeof o1) != 0) fail_msg("dot4_f16 n=%zu differs", n);
            const uint16_t *rows[ROWS];
            for (int j = 0; j < ROWS; j++) rows[j] = kv[j];
            for (size_t i = 0; i < n; i++) acc1[i] = acc2[i] = q[i];
            a->axpy_rows_f16(acc1, w, rows, ROWS, n);
            r->axpy_rows_f16(acc2, w, rows, ROWS, n);
            if (memcmp(acc1, acc2, n * sizeof(float)) != 0)
                fail_msg("axpy_rows_f16 n=%zu differs", n);
            a->axpy_f16(acc1, w[0], kv[0], n);
            r->axpy_f16(acc2, w[0], kv[0], n);
            a->scale(acc1, 0.37f, n);
            r->scale(acc2, 0.37f, n);
            if (memcmp(acc1, acc2, n * sizeof(float)) != 0)
                fail_msg("axpy_f16 or scale n=%zu differs", n);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_forms_exact),
        cmocka_unit_test(test_chosen_same_as_ref),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
