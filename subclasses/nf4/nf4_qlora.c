/* The QLoRA linear: out = x @ W^T + bias + s * (drop(x) @ A^T) @ B^T with
 * W nf4 (frozen), s = alpha / r, A [r, in] and B [out, r] trainable, and
 * its backward for x, A and B.
 *
 * Composed from dispatched ops only: the base GEMM is lpx_linear /
 * lpx_matmul on the nf4 weight (the tiled nf4_mm), the adapter GEMMs are
 * dense, and the dropout is the counter-based qlora_dropout op, so the
 * backward regenerates the forward's mask from (seed, element index)
 * instead of storing it. The adapter path computes in the adapters' dtype
 * (x and the gradient are converted once), so f32 adapters get f32
 * gradients even for bf16 activations. */
#include <math.h>
#include <string.h>
#include "nf4_internal.h"

lpx_qlora_opts lpx_qlora_opts_default(void)
{
    lpx_qlora_opts o = {16.0, 0.0, 0};
    return o;
}

/* Checked shapes of one QLoRA call. */
typedef struct qlora_dims {
    int64_t M, in, out, r;
    lpx_dtype ad;      /* adapter dtype */
    double scale;      /* alpha / r */
    lpx_qlora_opts o;
} qlora_dims;

static lpx_status check_dense_float(const char *op, const char *arg, const lpx_tensor *t)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    if (lpx_tensor_kind(t))
        return lpx_error(LPX_EINVAL, "%s: %s is of kind %s; QLoRA takes a dense %s", op, arg,
                         lpx_kind_name(lpx_tensor_kind(t)), arg);
    if (!nf4_logical_dtype_ok(lpx_tensor_dtype(t)))
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; expected f32, f16 or bf16", op, arg,
                         lpx_dtype_name(lpx_tensor_dtype(t)));
    return LPX_OK;
}

static lpx_status check_args(const char *op, lpx_tensor *x, lpx_tensor *w, lpx_tensor *a, lpx_tensor *b,
                             const lpx_qlora_opts *opts, qlora_dims *d)
{
    lpx_status st;
    if ((st = check_dense_float(op, "x", x)) || (st = check_dense_float(op, "A", a)) ||
        (st = check_dense_float(op, "B", b)))
        return st;
    nf4_parts p;
    if ((st = nf4_parts_of(op, "w", w, &p))) return st;
    d->o = opts ? *opts : lpx_qlora_opts_default();
    if (!isfinite(d->o.alpha)) return lpx_error(LPX_EINVAL, "%s: opts.alpha = %g must be finite", op, d->o.alpha);
    if (!(d->o.dropout >= 0.0 && d->o.dropout < 1.0))
        return lpx_error(LPX_EINVAL, "%s: opts.dropout = %g must be in [0, 1)", op, d->o.dropout);
    char sx[128], sw[128], sa[128], sb[128];
    lpx_tensor_shape_str(x, sx, sizeof sx);
    lpx_tensor_shape_str(w, sw, sizeof sw);
    lpx_tensor_shape_str(a, sa, sizeof sa);
    lpx_tensor_shape_str(b, sb, sizeof sb);
    if (p.ndim != 2) return lpx_error(LPX_ESHAPE, "%s: nf4 weight %s must be 2-D [out, in]", op, sw);
    const int64_t *ws = lpx_tensor_shape(w), *as = lpx_tensor_shape(a), *bs = lpx_tensor_shape(b);
    d->out = ws[0];
    d->in = ws[1];
    int xd = lpx_tensor_ndim(x);
    if (xd < 1 || lpx_tensor_shape(x)[xd - 1] != d->in)
        return lpx_error(LPX_ESHAPE, "%s: x %s must be [..., %lld] for the nf4 weight %s", op, sx, (long long)d->in, sw);
    if (lpx_tensor_ndim(a) != 2 || as[1] != d->in || as[0] < 1)
        return lpx_error(LPX_ESHAPE, "%s: A %s must be [r, %lld] with r >= 1", op, sa, (long long)d->in);
    d->r = as[0];
    if (lpx_tensor_ndim(b) != 2 || bs[0] != d->out || bs[1] != d->r)
        return lpx_error(LPX_ESHAPE, "%s: B %s must be [%lld, %lld] (out, r)", op, sb, (long long)d->out,
                         (long long)d->r);
    d->ad = lpx_tensor_dtype(a);
    if (lpx_tensor_dtype(b) != d->ad)
        return lpx_error(LPX_EDTYPE, "%s: A is %s and B is %s; the adapters must share a dtype", op,
                         lpx_dtype_name(d->ad), lpx_dtype_name(lpx_tensor_dtype(b)));
    d->M = 1;
    for (int i = 0; i < xd - 1; i++) d->M *= lpx_tensor_shape(x)[i];
    d->scale = d->o.alpha / (double)d->r;
    return LPX_OK;
}

/* t as [rows, cols] (a view when possible). */
static lpx_status as2d(lpx_tensor *t, int64_t rows, int64_t cols, lpx_tensor **out)
{
    int64_t s[2] = {rows, cols};
    return lpx_reshape(t, 2, s, out);
}

/* t converted to dtype (a new reference to t itself when it already is). */
static lpx_status to_dtype(lpx_tensor *t, lpx_dtype dtype, lpx_tensor **out)
{
    if (lpx_tensor_dtype(t) == dtype) {
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    return lpx_cast(t, dtype, false, out);
}

/* drop(v) in dtype: the seeded inverted dropout, or a plain conversion
 * when p is 0. v is [M, in] in x's element order, so the same (seed, p)
 * gives the same mask on x and on its gradient. */
static lpx_status dropout(lpx_tensor *v, const qlora_dims *d, lpx_dtype dtype, lpx_tensor **out)
{
    if (d->o.dropout == 0.0) return to_dtype(v, dtype, out);
    lpx_value args[4] = {lpx_v_tensor(v), lpx_v_f64(d->o.dropout), lpx_v_i64((int64_t)d->o.seed), lpx_v_dtype(dtype)};
    return nf4_call(LPX_OP_qlora_dropout, args, 4, out, 1);
}

/* Reshapes a 2-D result [M, n] back to lead-dims-of-x + [n]. */
static lpx_status unflatten_rows(lpx_tensor *y2, const lpx_tensor *x, int64_t n, lpx_tensor **out)
{
    int64_t shape[LPX_MAX_DIMS];
    int xd = lpx_tensor_ndim(x);
    memcpy(shape, lpx_tensor_shape(x), (size_t)xd * sizeof *shape);
    shape[xd - 1] = n;
    return lpx_reshape(y2, xd, shape, out);
}

lpx_status lpx_qlora_linear(lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor *a, lpx_tensor *b,
                            const lpx_qlora_opts *opts, lpx_tensor **out, lpx_tensor **saved_xa)
{
    const char *op = "lpx_qlora_linear";
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (saved_xa) *saved_xa = NULL;
    qlora_dims d;
    if ((st = check_args(op, x, w, a, b, opts, &d))) return st;
    lpx_tensor *base = NULL, *base2 = NULL, *x2 = NULL, *xd = NULL, *xa = NULL, *bt = NULL, *y2 = NULL, *yx = NULL;
    if ((st = lpx_linear(x, w, bias, &base))) goto done;           /* nf4 handler: tiled nf4_mm */
    if ((st = as2d(base, d.M, d.out, &base2))) goto done;
    if ((st = as2d(x, d.M, d.in, &x2))) goto done;
    if ((st = dropout(x2, &d, d.ad, &xd))) goto done;
    if ((st = lpx_linear(xd, a, NULL, &xa))) goto done;           /* [M, r] */
    if ((st = lpx_t(b, &bt))) goto done;
    if ((st = lpx_addmm(base2, xa, bt, 1.0, d.scale, &y2))) goto done; /* base + s * xa @ B^T */
    if ((st = to_dtype(y2, lpx_tensor_dtype(x), &yx))) goto done;
    if ((st = unflatten_rows(yx, x, d.out, out))) goto done;
    if (saved_xa) {
        lpx_tensor_retain(xa);
        *saved_xa = xa;
    }
done:
    lpx_tensor_release(base);
    lpx_tensor_release(base2);
    lpx_tensor_release(x2);
    lpx_tensor_release(xd);
    lpx_tensor_release(xa);
    lpx_tensor_release(bt);
    lpx_tensor_release(y2);
    lpx_tensor_release(yx);
    return st;
}

lpx_status lpx_qlora_linear_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor *w, lpx_tensor *a, lpx_tensor *b,
                                     lpx_tensor *xa, const lpx_qlora_opts *opts, lpx_tensor **grad_x,
                                     lpx_tensor **grad_a, lpx_tensor **grad_b)
{
    const char *op = "lpx_qlora_linear_backward";
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (grad_x) *grad_x = NULL;
    if (grad_a) *grad_a = NULL;
    if (grad_b) *grad_b = NULL;
    qlora_dims d;
    if ((st = check_args(op, x, w, a, b, opts, &d))) return st;
    if ((st = check_dense_float(op, "grad", grad))) return st;
    int64_t gn = lpx_tensor_numel(grad), gd = lpx_tensor_ndim(grad);
    if (gn != d.M * d.out || gd < 1 || lpx_tensor_shape(grad)[gd - 1] != d.out) {
        char sg[128];
        return lpx_error(LPX_ESHAPE, "%s: grad %s must be [..., %lld] with %lld rows like x", op,
                         lpx_tensor_shape_str(grad, sg, sizeof sg), (long long)d.out, (long long)d.M);
    }
    if (xa && (lpx_tensor_kind(xa) || lpx_tensor_numel(xa) != d.M * d.r))
        return lpx_error(LPX_ESHAPE, "%s: saved xa must be the forward's dense [%lld, %lld]", op, (long long)d.M,
                         (long long)d.r);
    lpx_tensor *g2 = NULL, *gad = NULL, *x2 = NULL, *xd = NULL, *xa2 = NULL, *gxa0 = NULL, *gxa = NULL, *gt = NULL,
               *gb0 = NULL, *gxat = NULL, *ga0 = NULL, *bgx = NULL, *lgx = NULL, *lgxd = NULL, *gx2 = NULL,
               *gxx = NULL;
    if ((st = as2d(grad, d.M, d.out, &g2))) goto done;
    if ((st = to_dtype(g2, d.ad, &gad))) goto done;
    if ((st = as2d(x, d.M, d.in, &x2))) goto done;
    if ((st = dropout(x2, &d, d.ad, &xd))) goto done;
    /* gxa = s * grad @ B: the gradient at the adapter bottleneck [M, r] */
    if ((st = lpx_matmul(gad, b, &gxa0))) goto done;
    if ((st = lpx_mul_scalar(gxa0, d.scale, &gxa))) goto done;
    if (grad_b) {
        if (xa) st = as2d(xa, d.M, d.r, &xa2);
        else st = lpx_linear(xd, a, NULL, &xa2);
        if (st) goto done;
        if ((st = lpx_t(gad, &gt)) || (st = lpx_matmul(gt, xa2, &gb0))) goto done;
        if ((st = lpx_mul_scalar(gb0, d.scale, grad_b))) goto done;   /* s * grad^T @ xa */
    }
    if (grad_a) {
        if ((st = lpx_t(gxa, &gxat)) || (st = lpx_matmul(gxat, xd, &ga0))) goto done;
        if ((st = to_dtype(ga0, d.ad, grad_a))) goto done;
    }
    if (grad_x) {
        if ((st = lpx_matmul(g2, w, &bgx))) goto done;                /* grad @ W, tiled nf4 */
        if ((st = lpx_matmul(gxa, a, &lgx))) goto done;               /* adapter path, [M, in] */
        if ((st = dropout(lgx, &d, lpx_tensor_dtype(lgx), &lgxd))) goto done; /* same mask */
        if ((st = lpx_add(bgx, lgxd, &gx2))) goto done;
        if ((st = to_dtype(gx2, lpx_tensor_dtype(x), &gxx))) goto done;
        if ((st = unflatten_rows(gxx, x, d.in, grad_x))) goto done;
    }
done:
    if (st) {
        if (grad_x) { lpx_tensor_release(*grad_x); *grad_x = NULL; }
        if (grad_a) { lpx_tensor_release(*grad_a); *grad_a = NULL; }
        if (grad_b) { lpx_tensor_release(*grad_b); *grad_b = NULL; }
    }
    lpx_tensor *tmp[] = {g2, gad, x2, xd, xa2, gxa0, gxa, gt, gb0, gxat, ga0, bgx, lgx, lgxd, gx2, gxx};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
    return st;
}
