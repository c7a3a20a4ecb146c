/* Exact f32 -> small binary float encoding, parameterized by format.
 *
 * One routine serves f16, bf16, fp8 (e4m3fn, e5m2) and any plugin minifloat
 * (e2m1, ...): round to nearest, ties to even, on the destination's grid,
 * subnormals included, working on the f32 bits only (no FPU rounding mode,
 * no flush-to-zero can change the result). With constant format arguments
 * it inlines into straight-line integer code. */
#ifndef LPX_NUMERICS_MINIFLOAT_H
#define LPX_NUMERICS_MINIFLOAT_H

#include <stdint.h>
#include "hd.h"
#include "bits.h"

/** Rounds the finite non-negative f32 whose encoding is `a` (sign bit clear,
 *  a <= 0x7F800000; +inf gives a code above any finite one) to the grid of
 *  a binary format with `mant` mantissa bits and exponent bias `bias`
 *  (1 <= mant <= 22, bias <= 127), round-to-nearest-even, with the exponent
 *  range unbounded above. Returns the magnitude code
 *  `exponent_field << mant | mantissa`. Since the code is not clamped, the
 *  caller detects overflow AFTER rounding by comparing it with the format's
 *  largest finite code (e4m3fn: 464 rounds to 448 = 0x7E, 465 to 0x7F). */
static inline LPX_HD uint32_t lpx_minifloat_round(uint32_t a, int mant, int bias)
{
    int e32 = (int)(a >> 23);
    if (e32 >= 128 - bias) {
        /* Normal in the destination: round the f32 mantissa to `mant` bits;
         * a carry out of the mantissa bumps the exponent, as it should. */
        int sh = 23 - mant;
        uint32_t r = a + ((1u << (sh - 1)) - 1u) + ((a >> sh) & 1u);
        return (r >> sh) - ((uint32_t)(127 - bias) << mant);
    }
    /* Subnormal in the destination: |x| = m24 * 2^(ee - 150); the code is
     * |x| / 2^(1 - bias - mant) rounded to an integer. Rounding up to
     * 1 << mant gives the smallest normal, whose code is exactly that. */
    int ee = e32 ? e32 : 1;
    uint32_t m24 = (a & 0x7FFFFFu) | (e32 ? 0x800000u : 0u);
    int s = 151 - bias - mant - ee; /* >= 24 - mant >= 2 here */
    if (s > 25)
        return 0; /* m24 < 2^24, so |x| < a quarter of the smallest step */
    uint32_t q = m24 >> s;
    uint32_t rem = m24 & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
    return q;
}

/** Encodes f32 `x` into a sign-magnitude binary format of
 *  1 + exp_bits + mant bits: RNE via lpx_minifloat_round, then
 *  - NaN -> sign | nan_code (sign kept);
 *  - a rounded magnitude above max_code (finite overflow, or +-inf) ->
 *    sign | max_code when `saturate`, else sign | inf_code, or
 *    sign | nan_code for formats without infinities (inf_code == 0);
 *  - zero keeps its sign, values below half the smallest subnormal round
 *    to a signed zero. */
static inline LPX_HD uint32_t lpx_minifloat_encode(float x, int exp_bits, int mant, int bias,
                                                   uint32_t max_code, uint32_t inf_code,
                                                   uint32_t nan_code, int saturate)
{
    uint32_t u = lpx_f32_bits(x);
    uint32_t sign = (u >> 31) << (exp_bits + mant);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return sign | nan_code;
    uint32_t c = lpx_minifloat_round(a, mant, bias);
    if (c > max_code)
        c = saturate ? max_code : (inf_code ? inf_code : nan_code);
    return sign | c;
}

#endif
