/*
 * test_xmath.c — the forward pass's own exp, tanh, sin/cos and pow
 * (src/base/xmath.h) against libm's double functions: within one float ulp of
 * the true value on a dense sweep of the ranges the forward pass uses
 * (softmax and SiLU arguments, GELU's tanh, RoPE angles up to long
 * contexts, RoPE's base^(-2/d)), and the edge values (NaN, infinities,
 * overflow, underflow, signed zero). Bit-identity across CPUs is what
 * test_forward's test_logits_fixture_bits_* checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "base/xmath.h"

/* |got - want| in units of the float ulp at want (want as a double). */
static double ulps(float got, double want) {
    if (fabs(want) > 0x1.ffffffp+127) want = want > 0 ? INFINITY : -INFINITY; /* float overflow */
    if (isinf(want) || isinf(got)) return (double)got == want ? 0.0 : INFINITY;
    double a = fabs(want);
    int e;
    frexp(a < 0x1p-126 ? 0x1p-126 : a, &e);
    const double ulp = ldexp(1.0, e - 24);
    return fabs((double)got - want) / ulp;
}

static void check(const char *what, float x, float got, double want, double max_ulps) {
    const double u = ulps(got, want);
    if (!(u <= max_ulps))
        fail_msg("%s(%a): %a, true %.17g (%.3f ulp)", what, (double)x, (double)got, want, u);
}

static void test_expf(void **st) {
    (void)st;
    for (float x = -110.0f; x < 95.0f; x += 0.00731f) check("exp", x, xm_expf(x), exp(x), 1.0);
    for (float x = -1e-3f; x < 1e-3f; x += 1.7e-7f) check("exp", x, xm_expf(x), exp(x), 1.0);
    assert_true(xm_expf(0.0f) == 1.0f);
    assert_true(xm_expf(-INFINITY) == 0.0f);
    assert_true(isinf(xm_expf(INFINITY)) && xm_expf(INFINITY) > 0);
    assert_true(isinf(xm_expf(100.0f)));
    assert_true(xm_expf(-200.0f) == 0.0f);
    assert_true(isnan(xm_expf(NAN)));
}

static void test_tanhf(void **st) {
    (void)st;
    for (float x = -12.0f; x < 12.0f; x += 0.000913f) check("tanh", x, xm_tanhf(x), tanh(x), 1.0);
    for (float x = -0.01f; x < 0.01f; x += 1.3e-6f) check("tanh", x, xm_tanhf(x), tanh(x), 1.0);
    assert_true(xm_tanhf(1e-30f) == 1e-30f);
    const float z = xm_tanhf(-0.0f);
    assert_true(z == 0.0f && signbit(z));
    assert_true(xm_tanhf(INFINITY) == 1.0f && xm_tanhf(-INFINITY) == -1.0f);
    assert_true(isnan(xm_tanhf(NAN)));
}

static void test_sincosf(void **st) {
    (void)st;
    float s, c;
    /* RoPE angles: position times frequency, up to 128k positions. */
    for (float x = -20.0f; x < 20.0f; x += 0.000377f) {
        xm_sincosf(x, &s, &c);
        check("sin", x, s, sin(x), 1.0);
        check("cos", x, c, cos(x), 1.0);
    }
    for (float x = 20.0f; x < 131072.0f; x = x * 1.0007f + 0.37f) {
        xm_sincosf(x, &s, &c);
        check("sin", x, s, sin(x), 1.0);
        check("cos", x, c, cos(x), 1.0);
        xm_sincosf(-x, &s, &c);
        check("sin", -x, s, sin(-x), 1.0);
    }
    xm_sincosf(0.0f, &s, &c);
    assert_true(s == 0.0f && c == 1.0f);
    xm_sincosf(INFINITY, &s, &c);
    assert_true(isnan(s) && isnan(c));
    xm_sincosf(NAN, &s, &c);
    assert_true(isnan(s) && isnan(c));
}

static void test_powf(void **st) {
    (void)st;
    static const float bases[] = {10000.0f, 500000.0f, 1000000.0f, 1e-3f, 0.5f, 2.0f, 1.0f};
    for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++) {
        for (int d = 2; d <= 512; d += 2) {
            const float e = -2.0f / (float)d;
            check("pow", bases[b], xm_powf(bases[b], e), pow(bases[b], e), 1.0);
        }
        for (float e = -3.0f; e < 3.0f; e += 0.0137f)
            check("pow", bases[b], xm_powf(bases[b], e), pow(bases[b], e), 1.0);
    }
    assert_true(xm_powf(2.0f, 10.0f) == 1024.0f);
    assert_true(isinf(xm_powf(10.0f, 40.0f)));
    assert_true(xm_powf(10.0f, -60.0f) == 0.0f);
    assert_true(isnan(xm_powf(-2.0f, 0.5f)) && isnan(xm_powf(0.0f, 1.0f)));
    assert_true(isnan(xm_powf(NAN, 1.0f)) && isnan(xm_powf(INFINITY, 1.0f)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf),
        cmocka_unit_test(test_tanhf),
        cmocka_unit_test(test_sincosf),
        cmocka_unit_test(test_powf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
