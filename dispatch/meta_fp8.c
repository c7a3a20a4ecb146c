/* Meta functions of the dense fp8 ops (ops_float8.def; include/lpx/meta.h):
 * the scaled GEMM's operands, scales, bias and result, written once for the
 * CPU reference and the cuBLASLt path. */
#include <math.h>
#include "../core/lpx_internal.h"
#include "lpx/meta.h"

static bool is_fp8(lpx_dtype d) { return d == LPX_F8E4M3FN || d == LPX_F8E5M2; }

lpx_status lpx_meta_fp8_dtype(const char *op, const char *arg, lpx_dtype d)
{
    if (!is_fp8(d))
        return lpx_error(LPX_EDTYPE, "%s: %s is %s; it must be f8e4m3fn or f8e5m2", op, arg, lpx_dtype_name(d));
    return LPX_OK;
}

static lpx_status float_tensor(const char *op, const char *arg, const lpx_tensor *t)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    if (!tr || !tr->is_float)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; %s takes floating-point tensors", op, arg,
                         lpx_dtype_name(t->dtype), op);
    return LPX_OK;
}

/* A 2-D operand stored row-major or column-major (size-1 dims have no
 * meaningful stride). */
static lpx_status layout(const char *op, const char *arg, const lpx_tensor *t)
{
    int64_t R = t->shape[0], C = t->shape[1], s0 = t->strides[0], s1 = t->strides[1];
    bool row = (C <= 1 || s1 == 1) && (R <= 1 || s0 >= C);
    bool col = (R <= 1 || s0 == 1) && (C <= 1 || s1 >= R);
    if (row || col) return LPX_OK;
    char s[160];
    return lpx_error(LPX_ESHAPE,
                     "%s: %s of shape %s has strides (%lld, %lld); the GEMM takes row-major (stride[1] == 1) or "
                     "column-major (stride[0] == 1) operands: make it contiguous first",
                     op, arg, lpx_tensor_shape_str(t, s, sizeof s), (long long)s0, (long long)s1);
}

/* A scale_inv: numel 1 (tensorwise) or n values as [n, 1] (rows) or
 * [1, n] (columns). */
static lpx_status scale(const char *op, const char *arg, const lpx_tensor *s, int64_t n, bool rows, bool *per)
{
    lpx_status st = float_tensor(op, arg, s);
    if (st) return st;
    if (s->numel == 1) {
        *per = false;
        return LPX_OK;
    }
    bool ok = s->ndim == 2 && (rows ? s->shape[0] == n && s->shape[1] == 1 : s->shape[0] == 1 && s->shape[1] == n);
    if (!ok) {
        char sh[160];
        return lpx_error(LPX_ESHAPE, "%s: %s has shape %s; expected numel 1 (tensorwise) or [%s%lld%s]", op, arg,
                         lpx_tensor_shape_str(s, sh, sizeof sh), rows ? "" : "1, ", (long long)n, rows ? ", 1" : "");
    }
    *per = true;
    return LPX_OK;
}

lpx_status lpx_meta_fp8_scaled_mm(const char *op, const lpx_tensor *a, const lpx_tensor *a_scale_inv,
                                  const lpx_tensor *b, const lpx_tensor *b_scale_inv, const lpx_tensor *bias,
                                  lpx_dtype out_dtype, lpx_fp8_mm_geom *g)
{
    if (!a || !b) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, a ? "b" : "a");
    lpx_status st;
    if ((st = lpx_meta_fp8_dtype(op, "a", a->dtype)) || (st = lpx_meta_fp8_dtype(op, "b", b->dtype))) return st;
    if (a->dtype == LPX_F8E5M2 && b->dtype == LPX_F8E5M2)
        return lpx_error(LPX_EDTYPE, "%s: a and b are both f8e5m2; e5m2 x e5m2 GEMMs are refused (cuBLASLt has no "
                                     "such kernel): quantize one operand as f8e4m3fn", op);
    char sa[160], sb[160];
    lpx_tensor_shape_str(a, sa, sizeof sa);
    lpx_tensor_shape_str(b, sb, sizeof sb);
    if (a->ndim != 2 || b->ndim != 2)
        return lpx_error(LPX_ESHAPE, "%s: a %s and b %s must be 2-D matrices [M, K] and [K, N]", op, sa, sb);
    int64_t M = a->shape[0], K = a->shape[1], N = b->shape[1];
    if (b->shape[0] != K)
        return lpx_error(LPX_ESHAPE, "%s: a %s and b %s: K mismatch (%lld vs %lld)", op, sa, sb, (long long)K,
                         (long long)b->shape[0]);
    if (out_dtype != LPX_F32 && out_dtype != LPX_BF16 && out_dtype != LPX_F16)
        return lpx_error(LPX_EDTYPE, "%s: out_dtype %s; the scaled GEMM writes f32, bf16 or f16", op,
                         lpx_dtype_name(out_dtype));
    if (bias) {
        if ((st = float_tensor(op, "bias", bias))) return st;
        if (bias->ndim != 1 || bias->shape[0] != N) {
            char s[160];
            return lpx_error(LPX_ESHAPE, "%s: bias %s must be [N] = [%lld]", op, lpx_tensor_shape_str(bias, s, sizeof s),
                             (long long)N);
        }
    }
    if ((st = layout(op, "a", a)) || (st = layout(op, "b", b))) return st;
    if ((st = scale(op, "a_scale_inv", a_scale_inv, M, true, &g->a_rowwise)) ||
        (st = scale(op, "b_scale_inv", b_scale_inv, N, false, &g->b_colwise)))
        return st;
    g->M = M;
    g->N = N;
    g->K = K;
    return LPX_OK;
}

lpx_status lpx_meta_fp8_scale_from_amax(const char *op, const lpx_tensor *amax, lpx_dtype fp8, double scale_max)
{
    lpx_status st;
    if ((st = float_tensor(op, "amax", amax)) || (st = lpx_meta_fp8_dtype(op, "fp8", fp8))) return st;
    if (isnan(scale_max) || scale_max < 0)
        return lpx_error(LPX_EINVAL, "%s: scale_max = %g; it must be >= 0 (0: no clamp)", op, scale_max);
    return LPX_OK;
}

lpx_status lpx_meta_fp8_quantize(const char *op, const lpx_tensor *x, const lpx_tensor *scale, lpx_dtype fp8,
                                 bool has_dim, int64_t dim, double scale_max, lpx_fp8_quant_geom *g)
{
    lpx_status st;
    if ((st = float_tensor(op, "x", x)) || (st = lpx_meta_fp8_dtype(op, "fp8", fp8))) return st;
    if (isnan(scale_max) || scale_max < 0)
        return lpx_error(LPX_EINVAL, "%s: scale_max = %g; it must be >= 0 (0: no clamp)", op, scale_max);
    g->outer = 1, g->D = x->numel, g->inner = 1;
    g->scale_ndim = 0;
    if (has_dim) {
        int d;
        if ((st = lpx_meta_dim(op, dim, x->ndim, &d))) return st;
        if (x->ndim == 0)
            return lpx_error(LPX_ESHAPE, "%s: dim %lld given for a 0-d x; axiswise scaling needs at least 1 dim", op,
                             (long long)dim);
        g->scale_ndim = x->ndim;
        for (int i = 0; i < x->ndim; i++) g->scale_shape[i] = i == d ? 1 : x->shape[i];
        for (int i = 0; i < d; i++) g->outer *= x->shape[i];
        for (int i = d + 1; i < x->ndim; i++) g->inner *= x->shape[i];
        g->D = x->shape[d];
    }
    g->groups = g->outer * g->inner;
    g->tensorwise = g->groups == 1 && g->D == x->numel;
    if (!scale) return LPX_OK;
    if ((st = float_tensor(op, "scale", scale))) return st;
    bool ok = g->tensorwise ? scale->numel == 1 : scale->ndim == g->scale_ndim;
    for (int i = 0; ok && !g->tensorwise && i < g->scale_ndim; i++) ok = scale->shape[i] == g->scale_shape[i];
    if (!ok) {
        char s1[160];
        int64_t ns = g->groups;
        return lpx_error(LPX_ESHAPE, "%s: static scale has shape %s; this quantization needs %lld scale value%s%s", op,
                         lpx_tensor_shape_str(scale, s1, sizeof s1), (long long)ns, ns == 1 ? "" : "s",
                         ns == 1 ? "" : " in the keepdim shape (x's shape with the reduced dim = 1)");
    }
    return LPX_OK;
}

lpx_status lpx_meta_fp8_dequantize(const char *op, const lpx_tensor *q, const lpx_tensor *scale_inv, lpx_dtype dtype)
{
    if (!q) return lpx_error(LPX_EINVAL, "%s: q is NULL", op);
    lpx_status st;
    if ((st = lpx_meta_fp8_dtype(op, "q", q->dtype)) || (st = float_tensor(op, "scale_inv", scale_inv))) return st;
    const lpx_dtype_traits *td = lpx_dtype_get(dtype);
    if (!td || !td->is_float || td->bits < 8 || td->block > 1)
        return lpx_error(LPX_EDTYPE, "%s: dtype %s is not a byte-sized floating-point dtype", op, lpx_dtype_name(dtype));
    /* numel 1, or q's ndim with each dim 1 or q's size */
    bool fits = scale_inv->numel == 1 || scale_inv->ndim == q->ndim;
    for (int i = 0; fits && scale_inv->numel != 1 && i < q->ndim; i++)
        fits = scale_inv->shape[i] == 1 || scale_inv->shape[i] == q->shape[i];
    if (!fits) {
        char s1[160], s2[160];
        return lpx_error(LPX_ESHAPE, "%s: scale_inv of shape %s does not fit q of shape %s (numel 1, or q's ndim with "
                                     "dims of 1 or q's size)", op, lpx_tensor_shape_str(scale_inv, s1, sizeof s1),
                         lpx_tensor_shape_str(q, s2, sizeof s2));
    }
    return LPX_OK;
}
