/* Helpers shared by the op tests: a seeded random source, building dense
 * tensors from double values, reading/writing logical elements of any
 * layout, views. Tensors are built with lpx_tensor_new/lpx_tensor_view_of
 * and lpx_convert only, so tests of one op group do not depend on the
 * others. Everything is static inline: each test uses a subset. */
#ifndef LPX_TESTS_TENSOR_UTIL_H
#define LPX_TESTS_TENSOR_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "lpx/lpx.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

/* xorshift64: uniform in [0, 1) */
static inline double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

/* standard normal (Box-Muller) */
static inline double nrand(void)
{
    double u = urand(), v = urand();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static inline int64_t numel_of(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return n;
}

/* New contiguous tensor holding vals (rounded to dtype); NULL on failure. */
static inline lpx_tensor *mk(lpx_dtype dt, int nd, const int64_t *shape, const double *vals)
{
    lpx_tensor *t = NULL;
    if (lpx_tensor_new(dt, nd, shape, lpx_cpu(), &t)) return NULL;
    int64_t n = lpx_tensor_numel(t);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)vals[i];
    lpx_convert(lpx_tensor_data(t), dt, f, LPX_F32, (size_t)n, 0);
    free(f);
    return t;
}

/* Byte offset of logical element i (row-major order) of a dense tensor. */
static inline size_t elem_offset(const lpx_tensor *t, int64_t i)
{
    int nd = lpx_tensor_ndim(t);
    const int64_t *sh = lpx_tensor_shape(t), *st = lpx_tensor_strides(t);
    int64_t off = 0, p = i;
    for (int d = nd - 1; d >= 0; d--) {
        off += (p % sh[d]) * st[d];
        p /= sh[d];
    }
    return (size_t)off * (size_t)(lpx_dtype_get(lpx_tensor_dtype(t))->bits / 8);
}

/* All logical elements of a dense tensor (any layout) as doubles; the
 * caller frees. */
static inline double *rd(const lpx_tensor *t)
{
    int64_t n = lpx_tensor_numel(t);
    double *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
        float f;
        lpx_convert(&f, LPX_F32, (const char *)lpx_tensor_data(t) + elem_offset(t, i), lpx_tensor_dtype(t), 1, 0);
        out[i] = f;
    }
    return out;
}

/* Writes logical element i of a dense tensor (any layout). */
static inline void wr(lpx_tensor *t, int64_t i, double v)
{
    float f = (float)v;
    lpx_convert((char *)lpx_tensor_data(t) + elem_offset(t, i), lpx_tensor_dtype(t), &f, LPX_F32, 1, 0);
}

/* View of base's storage; prints the error and returns NULL on failure. */
static inline lpx_tensor *view(lpx_tensor *base, int nd, const int64_t *shape, const int64_t *strides, int64_t off)
{
    lpx_tensor *v = NULL;
    if (lpx_tensor_view_of(base, nd, shape, strides, off, &v)) fprintf(stderr, "view_of: %s\n", lpx_last_error());
    return v;
}

static inline bool shape_is(const lpx_tensor *t, int nd, const int64_t *shape)
{
    if (!t || lpx_tensor_ndim(t) != nd) return false;
    for (int i = 0; i < nd; i++)
        if (lpx_tensor_shape(t)[i] != shape[i]) return false;
    return true;
}

/* New tensor of normal values times scale, rounded to dt. */
static inline lpx_tensor *mk_randn(lpx_dtype dt, int nd, const int64_t *shape, double scale)
{
    int64_t n = numel_of(nd, shape);
    double *v = (double *)calloc((size_t)(n ? n : 1), sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = scale * nrand();
    lpx_tensor *t = mk(dt, nd, shape, v);
    free(v);
    return t;
}

/* The suite's one seeded random tensor: lpx_randn's normal values (in f32,
 * from `seed`) times `scale`, rounded once to dt; on the CPU (the GPU
 * suite moves it up). The same seed gives the same bits on every machine
 * and for every dtype (lpx_randn in dt equals its f32 values cast to dt).
 * NULL on failure, with the error printed. */
static inline lpx_tensor *rand_normal(int nd, const int64_t *shape, uint64_t seed, double scale, lpx_dtype dt)
{
    lpx_tensor *a = NULL, *b = NULL, *c = NULL;
    if (lpx_randn(nd, shape, seed, LPX_F32, lpx_cpu(), &a) ||
        (scale != 1.0 && lpx_mul_scalar(a, scale, &b)) || (dt != LPX_F32 && lpx_cast(b ? b : a, dt, false, &c))) {
        fprintf(stderr, "  rand_normal: %s\n", lpx_last_error());
        lpx_tensor_release(a);
        lpx_tensor_release(b);
        return NULL;
    }
    if (c) {
        lpx_tensor_release(a);
        lpx_tensor_release(b);
        return c;
    }
    if (b) {
        lpx_tensor_release(a);
        return b;
    }
    return a;
}

/* Compares n values: |got - ref| <= rel * |ref| + abs_tol; returns the
 * number of mismatches (the first three printed, named `what`). */
static inline int cmp_close(const char *what, const double *got, const double *ref, int64_t n, double rel,
                            double abs_tol)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= rel * fabs(ref[i]) + abs_tol)) {
            if (bad < 3) fprintf(stderr, "    %s[%lld] = %.9g, ref %.9g\n", what, (long long)i, got[i], ref[i]);
            bad++;
        }
    return bad;
}

#endif
