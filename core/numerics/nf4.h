/* NF4 (QLoRA 4-bit NormalFloat) scalar numerics: the codebook, nearest-code
 * selection and decode. Shared by the CPU kernels, future CUDA kernels and
 * the tests.
 *
 * Codebook (QLoRA / torchao NF4Tensor, ascending): code c in 0..15 stands for
 * LPX_NF4_CODEBOOK[c]; code 7 is exactly 0.
 *
 * Nearest code: for v = x / s (f32 division, |v| <= 1) the code is
 *   argmin_c |v - codebook[c]|   (each difference and |.| in f32,
 *                                 exact ties resolved to the lower index)
 * which is what torchao computes. Because f32 rounding is monotone, the
 * argmin between neighbours c and c+1 switches at one f32 threshold, so
 *   code(v) = number of thresholds t_i with v >= t_i
 * gives the same result with 15 branch-free compares (vectorizable, no
 * table gathers). The thresholds below are the smallest f32 v whose argmin
 * is i+1; they were derived from the argmin and checked against it for
 * every one of the 2^31 f32 values in [-1, 1] (tests/test_nf4_numerics.c re-checks
 * a window of ulps around each one). They are near, but not always equal
 * to, the f32 midpoints (c_i + c_{i+1}) / 2. */
#ifndef LPX_NUMERICS_NF4_H
#define LPX_NUMERICS_NF4_H

#include <stdint.h>
#include "hd.h"

/* The 16 NF4 values, lowest first (docs/NF4.md "The format"). */
#define LPX_NF4_CODEBOOK_VALUES                                                          \
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,            \
        -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,       \
        0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,                \
        0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,                 \
        0.7229568362236023f, 1.0f

/* Decision thresholds: code(v) = #{i : v >= t_i}. Hex floats are exact. */
#define LPX_NF4_THRESHOLD_VALUES                                                         \
    -0x1.b239bp-1f, -0x1.38a4ep-1f, -0x1.d708fep-2f, -0x1.5bd4ecp-2f, -0x1.e079d8p-3f,   \
        -0x1.1a7176p-3f, -0x1.74f0ep-5f, 0x1.45f6p-5f, 0x1.ec90c6p-4f, 0x1.a0cfc2p-3f,   \
        0x1.2b05aap-2f, 0x1.8ea7f4p-2f, 0x1.00da08p-1f, 0x1.491b6p-1f, 0x1.b913b4p-1f

/* The code of exact zero (also used for blocks whose absmax is 0). */
#define LPX_NF4_ZERO_CODE 7u

/* Range of the i8 scaler quantization: f = LPX_NF4_SCALER_RANGE / (2 absmax). */
#define LPX_NF4_SCALER_RANGE 256.0f

/** Value of NF4 code c (only the low 4 bits are used). */
static inline LPX_HD float lpx_nf4_value(unsigned c)
{
    const float cb[16] = {LPX_NF4_CODEBOOK_VALUES};
    return cb[c & 15u];
}

/** Nearest NF4 code of v (v = x / s in f32, so |v| <= 1), ties to the lower
 *  index; see the file comment. NaN gives code 0 (callers refuse NaN). */
static inline LPX_HD unsigned lpx_nf4_encode(float v)
{
    const float t[15] = {LPX_NF4_THRESHOLD_VALUES};
    unsigned c = 0;
    for (int i = 0; i < 15; i++) c += (unsigned)(v >= t[i]);
    return c;
}

/** Code of element x of a block whose absmax is s (s >= 0, finite): the
 *  nearest code of x / s, and the zero code when s is 0 (an all-zero
 *  block; x / s would be NaN). */
static inline LPX_HD unsigned lpx_nf4_encode_scaled(float x, float s)
{
    return s > 0.0f ? lpx_nf4_encode(x / s) : LPX_NF4_ZERO_CODE;
}

/** Quantization factor of one scaler block from the absmax of its
 *  mean-subtracted scales: 256 / (2 * absmax) in f32. Computed as
 *  128 / absmax, which is the same correctly rounded quotient whenever
 *  2 * absmax is finite, and stays finite for absmax near FLT_MAX (where
 *  2 * absmax would overflow to inf and f to 0). A quotient that overflows
 *  (denormal absmax) saturates to FLT_MAX, so f is always finite and > 0.
 *  An all-equal scaler block (absmax 0) gets factor 1: every s' is 0 and
 *  quantizes to 0, and the dequantized scale qs / f + m is exactly m. */
static inline LPX_HD float lpx_nf4_factor(float absmax)
{
    const float flt_max = 3.40282346638528859812e+38f;
    if (!(absmax > 0.0f)) return 1.0f;
    float f = (LPX_NF4_SCALER_RANGE / 2.0f) / absmax;
    return f > flt_max ? flt_max : f;
}

/** Round half to even of an f32 (the rounding of torch.round), as f32. */
static inline LPX_HD float lpx_nf4_rint(float v)
{
    /* adding and subtracting 2^23 rounds to an integer in the current
     * (round-to-nearest-even) mode; |v| >= 2^23 is already an integer */
    const float big = 8388608.0f;
    if (!(v < big && v > -big)) return v;
    return v >= 0.0f ? (v + big) - big : (v - big) + big;
}

/** i8 scaler of a mean-subtracted block scale sp with factor f:
 *  clamp(round_half_even(sp * f), -128, 127). */
static inline LPX_HD int8_t lpx_nf4_quantize_scaler(float sp, float f)
{
    float q = lpx_nf4_rint(sp * f);
    q = q < -128.0f ? -128.0f : q > 127.0f ? 127.0f : q;
    return (int8_t)q;
}

/** Dequantized block scale: qs / f + m (f32 division then addition). */
static inline LPX_HD float lpx_nf4_scale(int8_t qs, float f, float m)
{
    return (float)qs / f + m;
}

/** High (first element) and low (second element) nibble of a code byte. */
static inline LPX_HD unsigned lpx_nf4_hi(uint8_t byte) { return (unsigned)byte >> 4; }
static inline LPX_HD unsigned lpx_nf4_lo(uint8_t byte) { return (unsigned)byte & 15u; }

/** Packs two codes, the first element in the high nibble. */
static inline LPX_HD uint8_t lpx_nf4_pack(unsigned first, unsigned second)
{
    return (uint8_t)(((first & 15u) << 4) | (second & 15u));
}

#endif
