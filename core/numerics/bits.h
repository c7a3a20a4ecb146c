/* Bit casts between f32 and its IEEE-754 binary32 encoding.
 * memcpy is the portable, aliasing-safe cast (compiles to a register move);
 * on CUDA devices the intrinsics do the same. */
#ifndef LPX_NUMERICS_BITS_H
#define LPX_NUMERICS_BITS_H

#include <stdint.h>
#include <string.h>
#include "hd.h"

/** The binary32 encoding of `f`. */
static inline LPX_HD uint32_t lpx_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/** The f32 whose binary32 encoding is `u`. */
static inline LPX_HD float lpx_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

#endif
