/* Scalar codecs of the OCP Microscaling (MX) 1.0 formats this plugin adds:
 * E8M0 (the shared block scale) and FP4 E2M1 (the MXFP4 element).
 *
 * E8M0: 8 exponent bits, no sign, no mantissa, bias 127: code c is
 * 2^(c - 127) for c in 0..254 (2^-127 .. 2^127), 0xFF is NaN; there is no
 * zero and no infinity.
 *
 * E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit, no inf, no NaN:
 * ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; code = sign << 3 | exp << 1 | mant. */
#ifndef LPX_MX_CODEC_H
#define LPX_MX_CODEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MX_E8M0_NAN 0xFFu
#define MX_E8M0_BIAS 127
#define MX_E2M1_MAX 6.0f

static inline float mx_e8m0_to_f32(uint8_t c)
{
    return c == MX_E8M0_NAN ? NAN : ldexpf(1.0f, (int)c - MX_E8M0_BIAS);
}

/* Nearest power of two, ties (x = 1.5 * 2^e) to the even code, as RNE
 * does with zero mantissa bits. Below 2^-127 the nearest representable
 * value is 2^-127 (code 0), zero included: E8M0 has no zero. NaN and
 * negative values (no sign bit) give NaN. Above 2^127 (and +inf): NaN,
 * or 2^127 (0xFE) when saturating. */
static inline uint8_t mx_f32_to_e8m0(float x, int saturate)
{
    if (isnan(x) || x < 0.0f) return MX_E8M0_NAN;
    if (isinf(x)) return saturate ? 0xFE : MX_E8M0_NAN;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    int e = (int)(u >> 23);            /* biased f32 exponent: the e8m0 code of the power below */
    uint32_t m = u & 0x7FFFFFu;
    if (e == 0) {                      /* f32 subnormal (incl. zero): < 2^-126 */
        /* 2^-127 is m = 0x400000; the midpoint to 2^-126 is 0x600000 */
        return m > 0x600000u ? 1 : 0;  /* tie at 0x600000 -> even code 0 */
    }
    unsigned code = (unsigned)e;
    if (m > 0x400000u || (m == 0x400000u && (code & 1u))) code++;
    if (code > 0xFEu) return saturate ? 0xFE : MX_E8M0_NAN;
    return (uint8_t)code;
}

static inline float mx_e2m1_to_f32(uint8_t c)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[c & 7u];
    return (c & 8u) ? -v : v;
}

/* Round to nearest, ties to even mantissa; |x| > 6 and ±inf saturate to
 * ±6 whatever the mode (the format has no inf or NaN: MX 1.0 clamps);
 * NaN encodes as +0 (in MX a NaN block is carried by its NaN scale). */
static inline uint8_t mx_f32_to_e2m1(float x)
{
    if (isnan(x)) return 0;
    uint8_t s = signbit(x) ? 8u : 0u;
    float a = fabsf(x);
    uint8_t c;
    if (a <= 0.25f) c = 0;        /* tie 0.25 -> 0 (even) */
    else if (a < 0.75f) c = 1;    /* 0.5 */
    else if (a <= 1.25f) c = 2;   /* 1.0; 0.75 -> 1.0 and 1.25 -> 1.0 (even) */
    else if (a < 1.75f) c = 3;    /* 1.5 */
    else if (a <= 2.5f) c = 4;    /* 2.0; 1.75 -> 2 and 2.5 -> 2 (even) */
    else if (a < 3.5f) c = 5;     /* 3.0 */
    else if (a <= 5.0f) c = 6;    /* 4.0; 3.5 -> 4 and 5 -> 4 (even) */
    else c = 7;                   /* 6.0 */
    return (uint8_t)(s | c);
}

#endif
