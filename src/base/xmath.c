/*
 * xmath.c — deterministic exp, tanh, sin/cos and pow (see xmath.h). Each
 * is a range reduction to a small interval followed by a Taylor series in
 * double, evaluated by Horner's rule; every operation is a plain IEEE
 * double operation, and the build passes -ffp-contract=off so no compiler
 * fuses them. The series are cut where the next term is below 3e-15 of the
 * result on the reduced interval (exp, the hot one, is short: a table of
 * 2^(j/32) and degree 5), far below a float's 6e-8.
 */
#include "base/xmath.h"

#include <float.h>
#include <math.h> /* INFINITY and NAN only: no libm function is called */
#include <stdint.h>
#include <string.h>

/* ln 2 and pi/2 split into a head with trailing zero bits (so k * head is
 * exact for the k used here) and the rest. */
static const double LN2_HI = XM_LN2_HI;
static const double LN2_LO = XM_LN2_LO;
static const double INV_LN2 = XM_INV_LN2;
static const double PIO2_1 = 1.57079632673412561417e+00;
static const double PIO2_2 = 6.07710050650619224932e-11;
static const double PIO2_3 = 2.02226624879595063154e-21;
static const double INV_PIO2 = 6.36619772367581382433e-01;

/* v rounded to float; beyond FLT_MAX (where the conversion itself is
 * undefined in C) infinity. */
static float to_float(double v) {
    if (v > (double)FLT_MAX) return INFINITY;
    if (v < -(double)FLT_MAX) return -INFINITY;
    return (float)v;
}

/* The nearest integer to v (halves away from zero), |v| < 2^30. */
static long nearest(double v) {
    return (long)(v >= 0 ? v + 0.5 : v - 0.5);
}

/* 2^(j/32), j = 0..31, each the double nearest the true value. */
const double xm_exp2_j32[32] = {1.0,
                                1.0218971486541166,
                                1.0442737824274138,
                                1.0671404006768237,
                                1.0905077326652577,
                                1.1143867425958924,
                                1.1387886347566916,
                                1.1637248587775775,
                                1.189207115002721,
                                1.215247359980469,
                                1.241857812073484,
                                1.2690509571917332,
                                1.2968395546510096,
                                1.3252366431597413,
                                1.3542555469368927,
                                1.383909881963832,
                                1.4142135623730951,
                                1.4451808069770467,
                                1.4768261459394993,
                                1.5091644275934228,
                                1.5422108254079407,
                                1.5759808451078865,
                                1.6104903319492543,
                                1.645755478153965,
                                1.681792830507429,
                                1.718619298122478,
                                1.7562521603732995,
                                1.7947090750031072,
                                1.8340080864093424,
                                1.8741676341103,
                                1.9152065613971474,
                                1.9571441241754002};

/* e^x in double for -110 < x < 90: x = (32m + j) ln2/32 + r with |r| <=
 * ln2/64, e^x = 2^m * 2^(j/32) * e^r, e^r by Taylor to degree 5 (the next
 * term is below 3e-15 relative). k = 32m + j is rounded to nearest (ties
 * to even) by adding and subtracting 1.5 * 2^52: no branch. 2^m goes
 * straight into the exponent bits of 2^(j/32), which stays normal for
 * these x. */
static inline __attribute__((always_inline)) double exp_d(double x) {
    const double shifter = 0x1.8p52;
    const double kd = (x * (32.0 * INV_LN2) + shifter) - shifter;
    const double r = (x - kd * (LN2_HI / 32.0)) - kd * (LN2_LO / 32.0);
    const double p =
        1.0 + r * (1.0 + r * (1.0 / 2.0 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0)))));
    const int64_t k = (int64_t)kd, j = k & 31, m = (k - j) / 32;
    uint64_t tb;
    memcpy(&tb, &xm_exp2_j32[j], sizeof tb);
    tb += (uint64_t)m << 52;
    double t;
    memcpy(&t, &tb, sizeof t);
    return t * p;
}

float xm_expf(float x) {
    if (!(x > -104.0f)) return x != x ? x : 0.0f;
    /* The largest float whose e^x is below FLT_MAX. */
    if (x > XM_EXP_MAX) return INFINITY;
    return (float)exp_d((double)x);
}

float xm_tanhf(float x) {
    if (x != x) return x;
    const double a = x < 0 ? -(double)x : (double)x;
    double t;
    if (a >= 10.0) {
        t = 1.0; /* tanh(10) = 1 - 4e-9 rounds to 1.0f */
    } else if (a < 0.004) {
        const double a2 = a * a; /* the next term, 17/315 a^7, is < 1e-17 a */
        t = a * (1.0 - a2 * (1.0 / 3.0 - a2 * (2.0 / 15.0)));
    } else {
        const double e = exp_d(2.0 * a);
        t = (e - 1.0) / (e + 1.0);
    }
    return (float)(x < 0 ? -t : t);
}

/* sin(r) and cos(r) for |r| <= pi/4 (plus a hair): Taylor to r^21 and
 * r^20; the coefficients are +-1/n!, folded by the compiler. */
static const double SIN_C[10] = {-1.0 / 6.0,
                                 1.0 / 120.0,
                                 -1.0 / 5040.0,
                                 1.0 / 362880.0,
                                 -1.0 / 39916800.0,
                                 1.0 / 6227020800.0,
                                 -1.0 / 1307674368000.0,
                                 1.0 / 355687428096000.0,
                                 -1.0 / 121645100408832000.0,
                                 1.0 / 51090942171709440000.0};
static const double COS_C[10] = {-1.0 / 2.0,
                                 1.0 / 24.0,
                                 -1.0 / 720.0,
                                 1.0 / 40320.0,
                                 -1.0 / 3628800.0,
                                 1.0 / 479001600.0,
                                 -1.0 / 87178291200.0,
                                 1.0 / 20922789888000.0,
                                 -1.0 / 6402373705728000.0,
                                 1.0 / 2432902008176640000.0};

static double sin_poly(double r) {
    const double r2 = r * r;
    double p = 0.0;
    for (int i = 9; i >= 0; i--) p = (p + SIN_C[i]) * r2;
    return r + r * p;
}

static double cos_poly(double r) {
    const double r2 = r * r;
    double p = 0.0;
    for (int i = 9; i >= 0; i--) p = (p + COS_C[i]) * r2;
    return 1.0 + p;
}

void xm_sincosf(float x, float *s, float *c) {
    if (x != x || x - x != 0.0f) { /* NaN or infinity */
        *s = *c = x - x;
        return;
    }
    double v = (double)x;
    long k = 0;
    if (v > 0.78 || v < -0.78) {
        /* k * PIO2_1 is exact for |k| < 2^20 (|x| < 1.6e6); beyond, the
         * reduction loses accuracy but stays deterministic. */
        k = nearest(v * INV_PIO2);
        v = ((v - (double)k * PIO2_1) - (double)k * PIO2_2) - (double)k * PIO2_3;
    }
    const double sr = sin_poly(v), cr = cos_poly(v);
    switch ((unsigned long)k & 3u) {
    case 0: *s = (float)sr, *c = (float)cr; break;
    case 1: *s = (float)cr, *c = (float)-sr; break;
    case 2: *s = (float)-sr, *c = (float)-cr; break;
    default: *s = (float)-cr, *c = (float)sr; break;
    }
}

/* ln(x) for finite x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, as a series to
 * s^25. */
static double log_d(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff);
    if (e == 0) { /* subnormal: scale up first */
        x *= 0x1p54;
        memcpy(&bits, &x, sizeof bits);
        e = (int)((bits >> 52) & 0x7ff) - 54;
    }
    e -= 1023;
    bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 0.0;
    for (int n = 25; n >= 3; n -= 2) p = (p + 1.0 / (double)n) * s2;
    const double lnm = 2.0 * (s + s * p);
    return ((double)e * LN2_HI + lnm) + (double)e * LN2_LO;
}

double xm_log(double x) {
    if (!(x > 0.0) || x == INFINITY) return NAN;
    return log_d(x);
}

float xm_powf(float base, float e) {
    if (!(base > 0.0f) || base == INFINITY) return NAN;
    const double y = (double)e * log_d((double)base);
    if (y != y) return NAN;
    if (y > 89.0) return INFINITY;
    if (y < -110.0) return 0.0f;
    return to_float(exp_d(y));
}
