/*
 * fp16.h — scalar conversions between float and the two 16-bit float
 * formats GGUF stores: IEEE binary16 ("F16", also the scale of most quant
 * blocks) and bfloat16 ("BF16"). Plain integer code, no compiler half type,
 * so it builds the same everywhere. Every quant kernel reads its block
 * scales through these; SIMD kernels may use hardware conversions, which
 * agree with these on every non-NaN value.
 *
 * Conventions (they match NumPy, which makes our test fixtures):
 * float → F16 rounds to nearest, ties to even, overflows to infinity and
 * keeps subnormals; NaN keeps its sign and the top bits of its payload
 * (forced non-zero) and is not quietened. F16 → float is exact.
 * float → BF16 rounds to nearest even and quietens NaN; BF16 → float is exact.
 */
#ifndef CELLM_KERNELS_FP16_H
#define CELLM_KERNELS_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fp32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float fp32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return fp32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return fp32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* Zero or subnormal: man * 2^-24 is exact in float. */
    return fp32_from_bits(sign | fp32_bits((float)man * 0x1p-24f));
}

static inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = fp32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) { /* NaN */
        uint16_t payload = (uint16_t)((ax >> 13) & 0x3ffu);
        return (uint16_t)(sign | 0x7c00u | (payload ? payload : 1u));
    }
    /* 65520 is halfway between 65504 (largest F16) and 65536; the tie goes
     * to the even neighbour, which is infinity. */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal F16: rebias the exponent, round at bit 13 */
        uint32_t m = ax - (112u << 23);
        m += 0xfffu + ((m >> 13) & 1u);
        return (uint16_t)(sign | (m >> 13));
    }
    /* Subnormal F16 (or zero): the result counts units of 2^-24. Below
     * 2^-25 everything rounds to zero; 2^-25 itself ties to zero. */
    const uint32_t e = ax >> 23;
    if (e < 102) return sign;
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e; /* 14..24 */
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++; /* may carry into the smallest normal */
    return (uint16_t)(sign | r);
}

static inline float bf16_to_fp32(uint16_t h) {
    return fp32_from_bits((uint32_t)h << 16);
}

static inline uint16_t fp32_to_bf16(float f) {
    const uint32_t x = fp32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif /* CELLM_KERNELS_FP16_H */
