/*
 * xmath.h — the transcendental functions of the forward pass (exp, tanh,
 * sin/cos, pow, log), computed the same way on every CPU. libm's expf, tanhf,
 * sinf, cosf and powf are accurate but not bit-identical across platforms:
 * x86-64 glibc picks FMA variants at run time, AArch64 glibc is compiled
 * differently, other libcs use other algorithms. A near-tie in greedy
 * decoding turns a last-bit difference into a different token, so the
 * forward pass uses these instead: a fixed sequence of IEEE double
 * additions, multiplications and divisions (never fused), rounded once to
 * float at the end. Errors are below 1e-14 relative before that rounding,
 * so each result is the correctly rounded float except, rarely, a value
 * within 1e-15 of a rounding boundary. Thread-safe, no state.
 */
#ifndef CELLM_XMATH_H
#define CELLM_XMATH_H

/* e^x; 0 below -104, +inf above 89, NaN for NaN. */
float xm_expf(float x);

/* What xm_expf computes, for SIMD versions that must give its bits
 * (cpu/attention.c): for -104 < x <= XM_EXP_MAX, with d = (double)x,
 *   kd = (d * (32 * XM_INV_LN2) + 1.5 * 2^52) - 1.5 * 2^52,
 *   r  = (d - kd * (XM_LN2_HI / 32)) - kd * (XM_LN2_LO / 32),
 *   p  = 1 + r * (1 + r * (1/2 + r * (1/6 + r * (1/24 + r * (1/120))))),
 *   k  = (int64)kd, j = k & 31, m = (k - j) / 32,
 *   e^x = (float)(t * p), t the bits of xm_exp2_j32[j] plus m << 52;
 * each a plain IEEE double operation, in that order. Above XM_EXP_MAX it is
 * +inf; at or below -104, 0. */
#define XM_LN2_HI 6.93147180369123816490e-01
#define XM_LN2_LO 1.90821492927058770002e-10
#define XM_INV_LN2 1.44269504088896338700e+00
#define XM_EXP_MAX 0x1.62e42ep+6f
extern const double xm_exp2_j32[32];
/* tanh(x); +-1 for |x| >= 10, NaN for NaN. */
float xm_tanhf(float x);
/* sin(x) and cos(x) for finite x (accurate for |x| < 1.6e6, deterministic
 * beyond); NaN for NaN or infinity. */
void xm_sincosf(float x, float *s, float *c);
/* base^e for finite base > 0 and finite e (what RoPE needs); NaN for any
 * other base. */
float xm_powf(float base, float e);

/* ln x in double for finite x > 0 (log-softmax's normaliser needs it);
 * NaN for any other x. */
double xm_log(double x);

#endif /* CELLM_XMATH_H */
