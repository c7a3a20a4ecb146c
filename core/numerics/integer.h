/* Integer and bool <-> f32.
 *
 * Encodes (f32 -> integer) round half to even, clamp to the destination's
 * range (+-inf included), and send NaN to 0. They always clamp: there is no
 * non-saturating integer cast (in C it would be undefined behaviour).
 * bool is x != 0, so NaN -> true and -0.0 -> false, as C and PyTorch do.
 * All work on the f32 bits, independent of the FPU rounding mode.
 *
 * Decodes: u8/i8/bool are exact; i32/i64 round to nearest even (the C
 * conversion). lpx_i64_to_f32_odd gives the round-to-odd f32 instead, an
 * intermediate that makes a following RNE encode to a format of at most
 * 22 significant bits round exactly once. */
#ifndef LPX_NUMERICS_INTEGER_H
#define LPX_NUMERICS_INTEGER_H

#include <stdint.h>
#include "hd.h"
#include "bits.h"

/** Round half to even of a finite f32 with |x| < 2^63, as an int64. */
static inline LPX_HD int64_t lpx_f32_rint_i64(float x)
{
    uint32_t u = lpx_f32_bits(x);
    uint32_t e = (u >> 23) & 0xFFu;
    uint64_t mag;
    if (e < 126)
        return 0; /* |x| < 0.5 */
    uint64_t m = (u & 0x7FFFFFu) | 0x800000u;
    if (e >= 150) {
        mag = m << (e - 150); /* already an integer; e <= 189 by contract */
    } else {
        uint32_t s = 150 - e; /* 1..24 fraction bits */
        uint64_t q = m >> s, rem = m & ((1ull << s) - 1u), half = 1ull << (s - 1);
        mag = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    }
    return (u >> 31) ? -(int64_t)mag : (int64_t)mag;
}

/** f32 -> integer in [lo, hi] (|lo|, |hi| <= 2^24 so both are exact
 *  f32s): NaN -> 0, clamp, then round half to even. */
static inline LPX_HD int64_t lpx_f32_to_int_clamped(float x, int64_t lo, int64_t hi)
{
    if (x != x)
        return 0;
    /* compare before rounding: both bounds +-0.5 round into range anyway,
     * and this keeps |x| < 2^63 for the rounding */
    if (x <= (float)lo)
        return lo;
    if (x >= (float)hi)
        return hi;
    return lpx_f32_rint_i64(x);
}

/** f32 -> u8, RNE, clamped to [0, 255], NaN -> 0. */
static inline LPX_HD uint8_t lpx_f32_to_u8(float x)
{
    return (uint8_t)lpx_f32_to_int_clamped(x, 0, 255);
}

/** f32 -> i8, RNE, clamped to [-128, 127], NaN -> 0. */
static inline LPX_HD int8_t lpx_f32_to_i8(float x)
{
    return (int8_t)lpx_f32_to_int_clamped(x, -128, 127);
}

/** f32 -> i32, RNE, clamped to [-2^31, 2^31 - 1], NaN -> 0. */
static inline LPX_HD int32_t lpx_f32_to_i32(float x)
{
    if (x != x)
        return 0;
    if (x >= 2147483648.0f) /* 2^31 - 1 is not an f32; the next f32 down fits */
        return INT32_MAX;
    if (x <= -2147483648.0f)
        return INT32_MIN;
    return (int32_t)lpx_f32_rint_i64(x);
}

/** f32 -> i64, RNE, clamped to [-2^63, 2^63 - 1], NaN -> 0. */
static inline LPX_HD int64_t lpx_f32_to_i64(float x)
{
    if (x != x)
        return 0;
    if (x >= 9223372036854775808.0f)
        return INT64_MAX;
    if (x <= -9223372036854775808.0f)
        return INT64_MIN;
    return lpx_f32_rint_i64(x);
}

/** f32 -> bool byte: 1 if x != 0 (NaN included), else 0. */
static inline LPX_HD uint8_t lpx_f32_to_bool(float x)
{
    return x != 0.0f ? 1u : 0u;
}

/** Integer (as int64) -> the nearest f32 with round-to-odd: the truncated
 *  value, with the last mantissa bit set if anything was cut off. Exact for
 *  |v| <= 2^24. */
static inline LPX_HD float lpx_i64_to_f32_odd(int64_t v)
{
    uint64_t mag = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    int sh = 0;
    while ((mag >> sh) >= (1ull << 24)) /* at most 40 steps, only for |v| > 2^24 */
        sh++;
    uint64_t q = mag >> sh;
    if (sh && (mag & ((1ull << sh) - 1u)))
        q |= 1u;
    /* q < 2^24 converts exactly; scaling by 2^sh (sh <= 40) is exact */
    float f = (float)q * lpx_f32_from_bits((uint32_t)(127 + sh) << 23);
    return v < 0 ? -f : f;
}

/** Greatest common divisor of a, b >= 0 (gcd(a, 0) = a). */
static inline LPX_HD int64_t lpx_gcd_i64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/** The fewest whole rows of row_elems (> 0) elements that hold whole
 *  blocks of `block` (> 0) elements laid on the flat index: block /
 *  gcd(row_elems, block), 1 when a row is a multiple of the block. What a
 *  shard unit must be a multiple of so that no block straddles two ranks
 *  (the NF4 and optimizer-state kinds, and lpx plan's count of them). */
static inline LPX_HD int64_t lpx_rows_for_whole_blocks(int64_t row_elems, int64_t block)
{
    return block / lpx_gcd_i64(row_elems, block);
}

#endif
