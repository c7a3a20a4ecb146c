/* An fp8 codec written from the format definitions alone (OCP OFP8 1.0:
 * e4m3fn, e5m2), for tests: decoders from the bit fields in double, and an
 * encoder that searches every code for the nearest value (ties to the even
 * code). It shares nothing with core/numerics or lpx_convert, so a test
 * that computes its expected bytes here catches a broken production codec
 * (test_convert.c checks the two against each other exhaustively). */
#ifndef LPX_TESTS_FP8_REF_H
#define LPX_TESTS_FP8_REF_H

#include <math.h>
#include <stdint.h>
#include "lpx/lpx.h"

static inline double ref_signed(int neg, double v) { return neg ? -v : v; }

static inline double ref_e4m3fn(unsigned c)
{
    unsigned e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return ref_signed(c & 0x80, NAN);
    return ref_signed(c & 0x80, e ? ldexp(8 + m, (int)e - 7 - 3) : ldexp(m, -6 - 3));
}

static inline double ref_e5m2(unsigned c)
{
    unsigned e = (c >> 2) & 31, m = c & 3;
    if (e == 31) return ref_signed(c & 0x80, m ? NAN : INFINITY);
    return ref_signed(c & 0x80, e ? ldexp(4 + m, (int)e - 15 - 2) : ldexp(m, -14 - 2));
}

/* a format's grid for the search */
typedef struct ref_f8_grid {
    double (*dec)(unsigned);
    unsigned max_code;  /* largest finite magnitude code */
    double over;        /* value of the code after max_code on the unbounded grid */
    int has_inf;
    unsigned inf_code, canon_nan;
} ref_f8_grid;

static const ref_f8_grid REF_E4M3 = {ref_e4m3fn, 0x7E, 480.0, 0, 0, 0x7F};
static const ref_f8_grid REF_E5M2 = {ref_e5m2, 0x7B, 65536.0, 1, 0x7C, 0x7E};

/* Nearest code to x on the grid; ties to the even mantissa LSB (= even
 * code). Overflow is decided after rounding: landing on the point past max
 * (or beyond) overflows. Returns the code, or -1 for "a NaN with x's sign". */
static inline int ref_f8_encode_grid(const ref_f8_grid *f, double x, int sat)
{
    unsigned sign = signbit(x) ? 0x80u : 0u;
    if (isnan(x)) return -1;
    double a = fabs(x);
    unsigned best = 0;
    if (a >= f->over) {
        best = f->max_code + 1;
    } else {
        double bestd = a;
        for (unsigned c = 1; c <= f->max_code + 1; c++) {
            double v = c <= f->max_code ? f->dec(c) : f->over;
            double d = fabs(v - a);
            if (d < bestd || (d == bestd && (c & 1u) == 0)) {
                best = c;
                bestd = d;
            }
        }
    }
    if (best > f->max_code) {
        if (sat) best = f->max_code;
        else if (f->has_inf) best = f->inf_code;
        else return -1;
    }
    return (int)(sign | best);
}

/* the byte an f32 x encodes to in fp8 dtype dt (e4m3fn or e5m2), NaNs as
 * the documented canonical code with x's sign */
static inline uint8_t ref_fp8_code(lpx_dtype dt, float x, int sat)
{
    const ref_f8_grid *f = dt == LPX_F8E5M2 ? &REF_E5M2 : &REF_E4M3;
    int c = ref_f8_encode_grid(f, x, sat);
    return (uint8_t)(c >= 0 ? (unsigned)c : (signbit(x) ? 0x80u : 0u) | f->canon_nan);
}

/* ref_fp8_code over n values */
static inline void ref_fp8_encode(lpx_dtype dt, const float *src, uint8_t *dst, int64_t n, int sat)
{
    for (int64_t i = 0; i < n; i++) dst[i] = ref_fp8_code(dt, src[i], sat);
}

#endif
