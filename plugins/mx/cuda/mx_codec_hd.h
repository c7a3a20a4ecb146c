/* The MX scalar numerics of lpx-mx.so (plugins/mx/mx_codec.h and the
 * block formulas of mx_tensor.c) as LPX_HD functions: plain C11 (and C++)
 * on the host, __host__ __device__ under nvcc, so lpx-mx-cuda.so decodes
 * and encodes with the CPU kernels' bits. tests/test_mx_codec_hd.c
 * compiles this header on the host and compares it with mx_codec.h and
 * lpx_convert over every code.
 *
 * Powers of two are built from their bits and applied by one multiply:
 * x * 2^n is one correctly rounded operation, the same value (and rounding
 * into the subnormals) as the CPU's ldexpf(x, n) for n in -127..127, where
 * 2^n is a float. A NaN input comes back quieted with its sign and
 * payload, as x86 ldexpf returns it (a GPU multiply would give the
 * canonical NaN), and a NaN scale gives 0x7FC00000 (the CPU's NAN). */
#ifndef LPX_MX_CODEC_HD_H
#define LPX_MX_CODEC_HD_H

#include <stdint.h>
#include "bits.h"
#include "float8.h"
#include "hd.h"

#define MXD_BLOCK 32
#define MXD_E8M0_NAN 0xFFu
#define MXD_E8M0_BIAS 127
#define MXD_QNAN_BITS 0x7FC00000u

/* 2^n as a float, n in -127..127 (2^-127 is the subnormal 0x00400000). */
static inline LPX_HD float mxd_pow2(int n)
{
    return lpx_f32_from_bits(n >= -126 ? (uint32_t)(n + 127) << 23 : 0x00400000u);
}

/* ldexpf(x, n) for n in -127..127 (see the file comment). */
static inline LPX_HD float mxd_scale(float x, int n)
{
    uint32_t u = lpx_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return lpx_f32_from_bits(u | 0x00400000u);   /* NaN: quieted */
    return x * mxd_pow2(n);
}

/* e8m0 code -> f32 (mx_e8m0_to_f32). */
static inline LPX_HD float mxd_e8m0_to_f32(uint8_t c)
{
    return c == MXD_E8M0_NAN ? lpx_f32_from_bits(MXD_QNAN_BITS) : mxd_pow2((int)c - MXD_E8M0_BIAS);
}

/* e2m1 code (low 4 bits) -> f32 (mx_e2m1_to_f32), without a table. */
static inline LPX_HD float mxd_e2m1_to_f32(uint8_t c)
{
    /* magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as f32 bit patterns */
    unsigned m = c & 7u;
    uint32_t bits = m == 0 ? 0u : m == 1 ? 0x3F000000u : (uint32_t)(126u + (m >> 1)) << 23 | (uint32_t)(m & 1u) << 22;
    return lpx_f32_from_bits(bits | (uint32_t)(c & 8u) << 28);
}

/* One dequantized element: mxfp8 (e4m3fn code) and mxfp4 (e2m1 code)
 * under scale code s (dequantize_block of mx_tensor.c). */
static inline LPX_HD float mxd_dec_fp8(uint8_t s, uint8_t code)
{
    if (s == MXD_E8M0_NAN) return lpx_f32_from_bits(MXD_QNAN_BITS);
    return mxd_scale(lpx_f8e4m3fn_to_f32(code), (int)s - MXD_E8M0_BIAS);
}

static inline LPX_HD float mxd_dec_fp4(uint8_t s, uint8_t code)
{
    if (s == MXD_E8M0_NAN) return lpx_f32_from_bits(MXD_QNAN_BITS);
    return mxd_scale(mxd_e2m1_to_f32(code), (int)s - MXD_E8M0_BIAS);
}

/* f32 -> e2m1 code (mx_f32_to_e2m1): RNE, saturating, NaN -> +0. */
static inline LPX_HD uint8_t mxd_f32_to_e2m1(float x)
{
    uint32_t u = lpx_f32_bits(x), a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0;
    uint8_t s = (u >> 31) ? 8u : 0u;
    float v = lpx_f32_from_bits(a);
    uint8_t c;
    if (v <= 0.25f) c = 0;
    else if (v < 0.75f) c = 1;
    else if (v <= 1.25f) c = 2;
    else if (v < 1.75f) c = 3;
    else if (v <= 2.5f) c = 4;
    else if (v < 3.5f) c = 5;
    else if (v <= 5.0f) c = 6;
    else c = 7;
    return (uint8_t)(s | c);
}

/* The block scale of quantize_block (mx_tensor.c) for a finite amax >= 0:
 * shared = floor(log2(amax)) - emax_elem clamped to -127..127 (amax = 0
 * and every amax below 2^-126 give -127), returned as the e8m0 code
 * shared + 127. */
static inline LPX_HD uint8_t mxd_block_scale(float amax, int emax_elem)
{
    int biased = (int)(lpx_f32_bits(amax) >> 23 & 0xFFu);
    int shared = biased == 0 ? -MXD_E8M0_BIAS : biased - 127 - emax_elem;
    if (shared < -MXD_E8M0_BIAS) shared = -MXD_E8M0_BIAS;
    if (shared > MXD_E8M0_BIAS) shared = MXD_E8M0_BIAS;
    return (uint8_t)(shared + MXD_E8M0_BIAS);
}

#endif
