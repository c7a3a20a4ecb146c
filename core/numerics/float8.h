/* OCP OFP8 1.0 formats <-> f32.
 *
 * f8e4m3fn: bias 7, max 448 (S.1111.110), min normal 2^-6, min subnormal
 *   2^-9, no infinities, one NaN per sign: S.1111.111.
 * f8e5m2: bias 15, max 57344 (S.11110.11), min normal 2^-14, min subnormal
 *   2^-16, inf = S.11111.00, NaN = S.11111.{01,10,11}.
 *
 * Decodes are exact. Encodes round to nearest, ties to even, on the
 * format's grid; overflow is decided after rounding. `saturate` != 0 clamps
 * finite overflow and +-inf to +-max. `saturate` = 0 is the cast of
 * ml_dtypes / PyTorch `.to()`: overflow and +-inf give NaN for e4m3fn and
 * +-inf for e5m2. NaN stays NaN with its sign: e4m3fn 0x7F | sign, e5m2
 * 0x7E | sign (the quiet NaN, mantissa MSB set, as ml_dtypes writes it).
 *
 * LPX_F8E4M3FN_F32BITS(c) / LPX_F8E5M2_F32BITS(c) are integer constant
 * expressions (the f32 encoding of code c) so decode tables can be built
 * at compile time; the scalar decoders use the same expressions. */
#ifndef LPX_NUMERICS_FLOAT8_H
#define LPX_NUMERICS_FLOAT8_H

#include <stdint.h>
#include "hd.h"
#include "bits.h"
#include "minifloat.h"

#define LPX_F8E4M3FN_MAX_CODE 0x7Eu  /* 448 */
#define LPX_F8E4M3FN_NAN 0x7Fu
#define LPX_F8E5M2_MAX_CODE 0x7Bu    /* 57344 */
#define LPX_F8E5M2_INF 0x7Cu
#define LPX_F8E5M2_NAN 0x7Eu

/* floor(log2(m)) for 1 <= m <= 7 (subnormal mantissas of <= 3 bits) */
#define LPX_F8_LOG2_(m) ((m) >= 4 ? 2 : (m) >= 2 ? 1 : 0)
/* f32 bits of the finite magnitude code c (sign bit clear) of a format
 * with M mantissa bits and bias B; a subnormal m * 2^(1-B-M) is renormalized
 * around its leading bit p. */
#define LPX_F8_MAG_F32BITS_(c, M, B)                                                     \
    (((c) >> (M)) != 0                                                                   \
         ? ((uint32_t)(((c) >> (M)) + 127 - (B)) << 23) |                                \
               ((uint32_t)((c) & ((1 << (M)) - 1)) << (23 - (M)))                        \
     : ((c) & ((1 << (M)) - 1)) != 0                                                     \
         ? ((uint32_t)(LPX_F8_LOG2_((c) & ((1 << (M)) - 1)) + 128 - (B) - (M)) << 23) |  \
               ((uint32_t)(((c) & ((1 << (M)) - 1)) -                                    \
                           (1 << LPX_F8_LOG2_((c) & ((1 << (M)) - 1))))                  \
                << (23 - LPX_F8_LOG2_((c) & ((1 << (M)) - 1))))                          \
         : 0u)

/** f32 encoding of e4m3fn code `c` (0..255); NaN codes give a quiet NaN. */
#define LPX_F8E4M3FN_F32BITS(c)                                                          \
    (((uint32_t)((c) & 0x80) << 24) |                                                    \
     (((c) & 0x7F) == 0x7F ? 0x7FC00000u : LPX_F8_MAG_F32BITS_((c) & 0x7F, 3, 7)))

/** f32 encoding of e5m2 code `c` (0..255); 0x7C is inf, above it NaN. */
#define LPX_F8E5M2_F32BITS(c)                                                            \
    (((uint32_t)((c) & 0x80) << 24) |                                                    \
     (((c) & 0x7F) > 0x7C    ? 0x7FC00000u                                               \
      : ((c) & 0x7F) == 0x7C ? 0x7F800000u                                               \
                             : LPX_F8_MAG_F32BITS_((c) & 0x7F, 2, 15)))

/** e4m3fn code -> f32, exact. */
static inline LPX_HD float lpx_f8e4m3fn_to_f32(uint8_t c)
{
    return lpx_f32_from_bits(LPX_F8E4M3FN_F32BITS((uint32_t)c));
}

/** f32 -> e4m3fn code, RNE; see the file comment for saturate and NaN. */
static inline LPX_HD uint8_t lpx_f32_to_f8e4m3fn(float x, int saturate)
{
    return (uint8_t)lpx_minifloat_encode(x, 4, 3, 7, LPX_F8E4M3FN_MAX_CODE, 0u,
                                         LPX_F8E4M3FN_NAN, saturate);
}

/** e5m2 code -> f32, exact. */
static inline LPX_HD float lpx_f8e5m2_to_f32(uint8_t c)
{
    return lpx_f32_from_bits(LPX_F8E5M2_F32BITS((uint32_t)c));
}

/** f32 -> e5m2 code, RNE; see the file comment for saturate and NaN. */
static inline LPX_HD uint8_t lpx_f32_to_f8e5m2(float x, int saturate)
{
    return (uint8_t)lpx_minifloat_encode(x, 5, 2, 15, LPX_F8E5M2_MAX_CODE, LPX_F8E5M2_INF,
                                         LPX_F8E5M2_NAN, saturate);
}

/* The dequantization of code value x (decoded) by scale s, whose product
 * (rounded, as the caller computes it) is y, written to a dtype whose
 * largest finite value is omax (<= FLT_MAX): a finite code with a finite
 * scale gives a finite value, y clamped to +-omax; a NaN or inf operand
 * passes through (y). A power-of-two scale floors fp8_max / amax, and
 * amax * scale may round up to the next fp8 code: for amax near omax its
 * dequantization (one ulp of the format above amax) would overflow to inf
 * (3.4e38 -> 256 * 2^120 = 2^128 in f32); docs/NUMERICS.md. */
static LPX_HD inline float lpx_f8_dequant_sat(float x, float s, float y, float omax)
{
    const float fmax = 3.40282346638528859812e+38f;
    if (!(x <= fmax && x >= -fmax) || !(s <= fmax && s >= -fmax)) return y;
    return y > omax ? omax : y < -omax ? -omax : y;
}

#endif
