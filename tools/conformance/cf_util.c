/* Helpers of the conformance contracts. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cf_util.h"

void cf_params_of(const lpx_kind *k, cf_params *p)
{
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    lpx_kind_conformance c;
    memset(&c, 0, sizeof c);
    if (vt->conformance) {
        size_t n = vt->conformance->struct_size < sizeof c ? vt->conformance->struct_size : sizeof c;
        memcpy(&c, vt->conformance, n);
    }
    p->ndim = c.ndim >= 1 && c.ndim <= 4 ? c.ndim : 2;
    for (int i = 0; i < 4; i++) p->shape[i] = c.ndim >= 1 && c.ndim <= 4 ? c.shape[i] : (i == 0 ? 64 : 96);
    p->max_err = c.max_err > 0 ? c.max_err : 0.5;
    p->min_sqnr_db = c.min_sqnr_db;
    p->op_rtol = c.op_rtol > 0 ? c.op_rtol : 1e-4;
    p->op_atol = c.op_atol > 0 ? c.op_atol : 1e-5;
    p->all_gather_kind = c.all_gather_kind;
    p->not_applicable = c.not_applicable;
    p->variants = c.variants;
    /* a variant's own waivers replace the kind's */
    if (cf_variant) {
        p->not_applicable = cf_variant->not_applicable;
        if (cf_variant->max_err > 0) p->max_err = cf_variant->max_err;
    }
}

const lpx_conformance_variant *cf_variant;

lpx_status cf_from_dense(const lpx_kind *k, lpx_tensor *x, lpx_tensor **out)
{
    if (!cf_variant) return lpx_kind_from_dense(k, x, out);
    if (!out) return lpx_error(LPX_EINVAL, "%s[%s] from_dense: out is NULL", lpx_kind_name(k), cf_variant->name);
    *out = NULL;
    lpx_status st = cf_variant->from_dense(k, x, out);
    if (st && *out) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

static const char *const dist_names[CF_DIST_COUNT] = {
    "normal", "uniform", "heavy_tail", "outliers", "tiny", "large", "zeros", "constant",
};
const char *cf_dist_name(int d) { return d >= 0 && d < CF_DIST_COUNT ? dist_names[d] : "?"; }

lpx_status cf_data(const cf_params *p, int d, uint64_t seed, lpx_tensor **out)
{
    lpx_tensor *a = NULL, *b = NULL;
    *out = NULL;
    lpx_status st = lpx_randn(p->ndim, p->shape, seed, LPX_F32, lpx_cpu(), &a);
    if (!st) st = lpx_rand(p->ndim, p->shape, seed + 1, LPX_F32, lpx_cpu(), &b);
    if (st) goto done;
    float *x = lpx_tensor_data(a);
    const float *u = lpx_tensor_data(b);
    int64_t n = lpx_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        switch (d) {
        case CF_DIST_UNIFORM: x[i] = 2.0f * u[i] - 1.0f; break;
        case CF_DIST_HEAVY: x[i] = x[i] / (u[i] + 0.05f); break;      /* ratios: tails up to ~20 sigma */
        case CF_DIST_OUTLIERS: if (i % 97 == 13) x[i] *= 100.0f; break;
        case CF_DIST_TINY: x[i] *= 1e-6f; break;
        case CF_DIST_LARGE: x[i] *= 1e4f; break;
        case CF_DIST_ZEROS: x[i] = 0.0f; break;
        case CF_DIST_CONSTANT: x[i] = 0.375f; break;
        default: break;
        }
    }
    *out = a;
    a = NULL;
done:
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    return st;
}

cf_outcome cf_say(cf_outcome o, char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return o;
}

cf_outcome cf_lpx_fail(char *buf, size_t len, const char *what, lpx_status st)
{
    return cf_say(CF_FAIL, buf, len, "%s failed: %s: %s", what, lpx_status_string(st), lpx_last_error());
}

lpx_status cf_dense(lpx_tensor *t, lpx_tensor **out)
{
    lpx_tensor *d = NULL;
    *out = NULL;
    lpx_status st = lpx_kind_to_dense(t, &d);
    if (st) return st;
    if (lpx_tensor_kind(d) || lpx_tensor_dtype(d) != LPX_F32) {
        lpx_tensor_release(d);
        return lpx_error(LPX_EINVAL, "to_dense of kind '%s' returned a %s %s tensor, not dense f32",
                         lpx_kind_name(lpx_tensor_kind(t)), lpx_kind_name(lpx_tensor_kind(d)),
                         lpx_dtype_name(lpx_tensor_dtype(d)));
    }
    st = lpx_contiguous(d, out);
    lpx_tensor_release(d);
    return st;
}

bool cf_same_shape(const lpx_tensor *a, const lpx_tensor *b, char *sa, char *sb, size_t len)
{
    lpx_tensor_shape_str(a, sa, len);
    lpx_tensor_shape_str(b, sb, len);
    if (lpx_tensor_ndim(a) != lpx_tensor_ndim(b)) return false;
    for (int i = 0; i < lpx_tensor_ndim(a); i++)
        if (lpx_tensor_shape(a)[i] != lpx_tensor_shape(b)[i]) return false;
    return true;
}

double cf_max_diff(const lpx_tensor *a, const lpx_tensor *b, double *bmax)
{
    const float *x = lpx_tensor_data(a), *y = lpx_tensor_data(b);
    double m = 0, bm = 0;
    for (int64_t i = 0; i < lpx_tensor_numel(b); i++) {
        if (isnan(x[i]) && isnan(y[i])) continue;
        double d = fabs((double)x[i] - (double)y[i]);
        if (isnan(d) || (isinf(d) && x[i] != y[i])) d = INFINITY;
        else if (x[i] == y[i]) d = 0;
        if (d > m) m = d;
        if (fabs(y[i]) > bm) bm = fabs(y[i]);
    }
    if (bmax) *bmax = bm;
    return m;
}

double cf_sqnr_db(const lpx_tensor *x, const lpx_tensor *y)
{
    const float *a = lpx_tensor_data(x), *b = lpx_tensor_data(y);
    double s = 0, n = 0;
    for (int64_t i = 0; i < lpx_tensor_numel(x); i++) {
        s += (double)a[i] * a[i];
        n += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    }
    return n == 0 ? INFINITY : 10.0 * log10(s / n);
}

int64_t cf_shard_unit(const lpx_tensor *t)
{
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_tensor_kind(t));
    return vt && vt->shard_unit ? vt->shard_unit(t) : 1;
}
