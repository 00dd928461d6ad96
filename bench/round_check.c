/*
 * round_check.c — the AVX-512 activation quantizer against the scalar
 * reference on every float: the check behind x86_avx512.c's rounding
 * (round half away from zero as a truncation of x + copysign(0.49999997,
 * x)), which test_kernels_simd samples near each tie.
 *
 * Every 32-bit pattern but the NaNs goes through ref_quantize_a8 and
 * avx512_quantize_a8 in rows of sixteen blocks (the quantizer's
 * sixteen-block path), each block led by 127 so that, while its values
 * are within ±127, the scale is 1 and each code is the rounding of the
 * value itself; larger values change the scale, and the bytes must still
 * agree. Prints the blocks whose bytes differ (none) and exits 1 if any
 * does. About a minute on one core.
 *
 * Not built by CMake; from the repository root after building ./build:
 *
 *   cc -O2 -Iinclude -Isrc bench/round_check.c build/libcellm.a -lm -lpthread \
 *      -o build/round_check && build/round_check
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/kernels/kernels.h"

enum { BLOCKS = 16, PER = 31, ROW = BLOCKS * 32, BYTES = BLOCKS * 36 };

static int check_row(const float *x, long *bad) {
    static uint8_t a[BYTES], b[BYTES];
    ref_quantize_a8(x, a, ROW);
    avx512_quantize_a8(x, b, ROW);
    if (!memcmp(a, b, BYTES)) return 0;
    if (++*bad <= 10) fprintf(stderr, "a row from %a differs\n", (double)x[1]);
    return 1;
}

int main(void) {
    if (!avx512_cpu_supported()) {
        fprintf(stderr, "round_check: this CPU has no AVX-512 VNNI\n");
        return 2;
    }
    static float x[ROW];
    long bad = 0, values = 0;
    int n = 0; /* values in the row so far */
    for (uint64_t u = 0; u <= UINT32_MAX; u++) {
        uint32_t bits = (uint32_t)u;
        float f;
        memcpy(&f, &bits, sizeof f);
        if (isnan(f)) continue;
        int blk = n / PER, at = n % PER;
        x[blk * 32] = 127.0f;
        x[blk * 32 + 1 + at] = f;
        values++;
        if (++n == BLOCKS * PER) {
            check_row(x, &bad);
            n = 0;
        }
    }
    if (n) { /* the last row: the rest of it zeros */
        for (int i = n; i < BLOCKS * PER; i++) x[i / PER * 32 + 1 + i % PER] = 0.0f;
        for (int blk = 0; blk < BLOCKS; blk++) x[blk * 32] = 127.0f;
        check_row(x, &bad);
    }
    printf("%ld values, %ld rows differ from the reference\n", values, bad);
    return bad ? 1 : 0;
}
