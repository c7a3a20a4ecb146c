/* Shared by the float8 test programs (tests/test_float8_*.c): the
 * helpers and fixtures their cases use. Static inline: each program
 * compiles only what it calls. */
#ifndef LPX_TESTS_FLOAT8_UTIL_H
#define LPX_TESTS_FLOAT8_UTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "check.h"
#include "tensor_util.h"
#include "fp8_ref.h"

/* ---- helpers ------------------------------------------------------- */

/* All elements of t (dense or float8) as doubles, logical order. */
static inline double *values(lpx_tensor *t)
{
    lpx_tensor *f = NULL, *c = NULL;
    if (lpx_float8_is(t)) CHECK_OK(lpx_float8_dequantize(t, LPX_F32, &f));
    else CHECK_OK(lpx_cast(t, LPX_F32, false, &f));
    CHECK_OK(lpx_contiguous(f, &c));
    int64_t n = lpx_tensor_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    const float *p = c ? lpx_tensor_data(c) : NULL;
    for (int64_t i = 0; i < n; i++) v[i] = p ? p[i] : NAN;
    lpx_tensor_release(f);
    lpx_tensor_release(c);
    return v;
}

static inline double sqnr_db(const double *ref, const double *x, int64_t n)
{
    double s = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        s += ref[i] * ref[i];
        e += (ref[i] - x[i]) * (ref[i] - x[i]);
    }
    return e == 0 ? INFINITY : 10.0 * log10(s / e);
}

static inline double item(const lpx_tensor *t, int64_t i)
{
    double v = NAN;
    CHECK_OK(lpx_item(t, i, &v));
    return v;
}

static inline float f32(double d) { return (float)d; }

static inline int64_t kind_live(void) { return lpx_kind_live_tensors(lpx_float8_kind()); }

static inline lpx_tensor *quant(lpx_tensor *x, lpx_dtype fp8, int gran, int axis, bool pow2, lpx_float8_stats *st)
{
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.fp8 = fp8;
    o.granularity = gran;
    o.axis = axis;
    o.pow2_scale = pow2;
    lpx_tensor *q = NULL;
    CHECK_OK(lpx_float8_quantize(x, &o, &q, st));
    return q;
}

/* ---- delayed scaling ------------------------------------------------ */

static inline lpx_float8_delayed *delayed(int len, int algo, int margin, int interval)
{
    lpx_float8_delayed_config c = {len, algo, margin, interval, LPX_F8E4M3FN};
    lpx_float8_delayed *d = NULL;
    CHECK_OK(lpx_float8_delayed_new(&c, &d));
    return d;
}

/* ---- Float8Linear ---------------------------------------------------- */

typedef struct lin_ref {
    int64_t M, K, N;
    lpx_tensor *x, *w, *b, *g;
    double *out, *gx, *gw;   /* f64 references */
} lin_ref;

typedef struct lin_sqnr { double out, gx, gw; } lin_sqnr;

/* Every float8 tensor of the program is gone: no leaked payloads (the last
 * case of each float8 test program). */
static inline void test_no_live_tensors(void) { CHECK(kind_live() == 0); }
#endif
