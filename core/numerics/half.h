/* IEEE binary16 (f16) and bfloat16 (bf16) <-> f32.
 *
 * Decodes are exact (every f16 and bf16 value is an f32). Encodes round to
 * nearest, ties to even. `saturate` = 0 is the IEEE cast (overflow -> inf);
 * `saturate` != 0 clamps finite overflow and +-inf to +-max. NaN encodes to
 * the canonical quiet NaN with the input's sign: f16 0x7E00 | sign,
 * bf16 0x7FC0 | sign. */
#ifndef LPX_NUMERICS_HALF_H
#define LPX_NUMERICS_HALF_H

#include <stdint.h>
#include "hd.h"
#include "bits.h"
#include "minifloat.h"

#define LPX_F16_MAX_CODE 0x7BFFu   /* 65504 */
#define LPX_F16_INF 0x7C00u
#define LPX_F16_NAN 0x7E00u
#define LPX_BF16_MAX_CODE 0x7F7Fu  /* 3.38953139e38 */
#define LPX_BF16_INF 0x7F80u
#define LPX_BF16_NAN 0x7FC0u

/** f16 bits -> f32, exact. NaNs come back quiet, payload and sign kept.
 *  Written as selects, not branches, so bulk loops vectorize. */
static inline LPX_HD float lpx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t normal = ((e + 112u) << 23) | (m << 13);
    /* inf/NaN; a NaN gets the quiet bit */
    uint32_t special = 0x7F800000u | (m << 13) | ((0u - (uint32_t)(m != 0)) & 0x400000u);
    /* subnormal: m * 2^-24 is a normal f32, so the product is exact and
     * immune to flush-to-zero */
    uint32_t sub = lpx_f32_bits((float)m * 5.9604644775390625e-8f);
    uint32_t is_special = 0u - (uint32_t)(e == 0x1Fu), is_sub = 0u - (uint32_t)(e == 0);
    return lpx_f32_from_bits(sign | (special & is_special) | (sub & is_sub) |
                             (normal & ~(is_special | is_sub)));
}

/** f32 -> f16 bits, RNE; see the file comment for saturate and NaN. */
static inline LPX_HD uint16_t lpx_f32_to_f16(float x, int saturate)
{
    return (uint16_t)lpx_minifloat_encode(x, 5, 10, 15, LPX_F16_MAX_CODE, LPX_F16_INF,
                                          LPX_F16_NAN, saturate);
}

/** bf16 bits -> f32, exact (bf16 is the upper half of an f32). */
static inline LPX_HD float lpx_bf16_to_f32(uint16_t b)
{
    return lpx_f32_from_bits((uint32_t)b << 16);
}

/** f32 -> bf16 bits, RNE; see the file comment for saturate and NaN.
 *  Same result as lpx_minifloat_encode(x, 8, 7, 127, ...), written as the
 *  classic add-and-truncate so bulk loops vectorize. */
static inline LPX_HD uint16_t lpx_f32_to_bf16(float x, int saturate)
{
    uint32_t u = lpx_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)(sign | LPX_BF16_NAN);
    /* the carry of the rounding add walks into the exponent, and from the
     * largest finite value into inf, exactly as RNE demands */
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    if (saturate && (r & 0x7FFFu) > LPX_BF16_MAX_CODE)
        r = sign | LPX_BF16_MAX_CODE;
    return (uint16_t)r;
}

#endif
