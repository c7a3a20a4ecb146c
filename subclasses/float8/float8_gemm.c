/* GEMMs of float8 tensors: the scaled fp8 GEMM on two float8 operands
 * (f8_gemm, lpx_float8_mm) and the matmul / linear / addmm handlers.
 *
 * A float8 operand is used as it is: its data (any strides the dense
 * fp8_scaled_mm accepts: row- or column-major), and its scale_inv, which
 * must be constant along the contracted dim K: tensorwise, per row of A
 * ([M, 1]) or per column of B ([1, N]). Transposing a float8 tensor moves
 * its scales with the axis (float8_views.c), so W [N, K] scaled per row
 * becomes W^T [K, N] scaled per column, as the forward of a linear layer
 * needs. Operand mixes the handlers do not serve (a dense operand, batched
 * B) go to the dequantize fallback when it is on, else fail naming op and
 * kind. */
#include <stdio.h>
#include <string.h>
#include "float8_internal.h"

/* Re-raises the last error with an op/kind prefix. */
static lpx_status prefixed(const char *op, lpx_status st)
{
    char msg[768];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    return lpx_error(st, "%s (float8): %s", op, msg);
}

/* Fails unless float8 t can be GEMM operand `arg` (A: scales constant
 * along dim 1; B: along dim 0). */
static lpx_status check_operand(const char *op, const char *arg, const lpx_tensor *t, int kdim)
{
    char sh[160];
    if (lpx_tensor_ndim(t) != 2)
        return lpx_error(LPX_ESHAPE, "%s (float8): %s has shape %s; the scaled GEMM takes 2-D operands", op, arg,
                         lpx_tensor_shape_str(t, sh, sizeof sh));
    const f8_meta *m = f8_meta_of(t);
    if (m->granularity == LPX_FLOAT8_AXISWISE && m->axis != kdim)
        return lpx_error(LPX_ESHAPE,
                         "%s (float8): %s %s has one scale per %s (axis %d reduced); a GEMM needs its scales constant "
                         "along K (tensorwise, or per %s): quantize it along dim %d",
                         op, arg, lpx_tensor_shape_str(t, sh, sizeof sh), kdim == 1 ? "column" : "row", (int)m->axis,
                         kdim == 1 ? "row [M, 1]" : "column [1, N]", kdim);
    return LPX_OK;
}

/* Both operands blockwise: the block-scaled GEMM (fp8_mm_block). A mix
 * of blockwise and other scalings is refused: requantize one side. */
static lpx_status block_gemm(const char *op, lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_dtype out_dtype,
                             lpx_tensor **out)
{
    if (!f8_is_block(a) || !f8_is_block(b))
        return lpx_error(LPX_EINVAL, "%s (float8): %s is blockwise and %s is not; a block-scaled GEMM takes two "
                                     "blockwise operands", op, f8_is_block(a) ? "a" : "b", f8_is_block(a) ? "b" : "a");
    const f8_meta *ma = f8_meta_of(a), *mb = f8_meta_of(b);
    if (out_dtype == LPX_FLOAT8_LOGICAL) out_dtype = lpx_tensor_dtype(a);
    lpx_tensor *hb = NULL;
    lpx_status st;
    if (bias && (st = f8_hp(bias, &hb))) return st;
    st = lpx_fp8_mm_block(f8_data(a), f8_scale_inv(a), f8_block_rows(ma), f8_block_cols(ma), f8_data(b),
                          f8_scale_inv(b), f8_block_rows(mb), f8_block_cols(mb), hb, out_dtype, out);
    lpx_tensor_release(hb);
    return st ? prefixed(op, st) : LPX_OK;
}

lpx_status f8_gemm(const char *op, lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_dtype out_dtype,
                   unsigned flags, lpx_tensor **out)
{
    *out = NULL;
    lpx_status st;
    if (f8_is_block(a) || f8_is_block(b)) return block_gemm(op, a, b, bias, out_dtype, out);
    if ((st = check_operand(op, "a", a, 1)) || (st = check_operand(op, "b", b, 0))) return st;
    int64_t K = lpx_tensor_shape(a)[1], Kb = lpx_tensor_shape(b)[0];
    if (K != Kb) {
        char s1[160], s2[160];
        return lpx_error(LPX_ESHAPE, "%s (float8): a %s and b %s: K mismatch (%lld vs %lld)", op,
                         lpx_tensor_shape_str(a, s1, sizeof s1), lpx_tensor_shape_str(b, s2, sizeof s2), (long long)K,
                         (long long)Kb);
    }
    if (out_dtype == LPX_FLOAT8_LOGICAL) out_dtype = lpx_tensor_dtype(a);
    lpx_tensor *hb = NULL;
    if (bias && (st = f8_hp(bias, &hb))) return st;
    st = lpx_fp8_scaled_mm_ex(f8_data(a), f8_scale_inv(a), f8_data(b), f8_scale_inv(b), hb, out_dtype, flags, out);
    lpx_tensor_release(hb);
    return st ? prefixed(op, st) : LPX_OK;
}

lpx_status lpx_float8_mm(lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_dtype out_dtype, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_float8_mm: out is NULL");
    *out = NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!f8_is(a) || !f8_is(b))
        return lpx_error(LPX_EINVAL, "lpx_float8_mm: %s is not a float8 tensor (quantize it with lpx_float8_quantize)",
                         f8_is(a) ? "b" : "a");
    return f8_gemm("lpx_float8_mm", a, b, bias, out_dtype, 0, out);
}

/* ---- handlers ------------------------------------------------------- */

static lpx_tensor *targ(const lpx_call *c, int i) { return c->args[i].tag == LPX_TAG_TENSOR ? c->args[i].u.t : NULL; }

/* An unsupported operand mix: the fallback when on, else a clear error. */
static lpx_status defer(lpx_call *c, const char *why)
{
    if (lpx_float8_fallback_enabled()) {
        uint64_t t0 = lpx_now_ns();
        lpx_status st = f8_fallback(c);
        char name[96];
        snprintf(name, sizeof name, "float8 fallback: %s", lpx_op_name(c->op));
        lpx_trace_span(name, "fallback", t0, lpx_now_ns());
        return st;
    }
    return lpx_error(LPX_ENOTIMPL, "%s (float8): %s; quantize the dense operand, dequantize the float8 one, or "
                                   "enable the dequantize fallback (lpx_float8_set_fallback)", lpx_op_name(c->op), why);
}

static const char *dense_name(const lpx_tensor *t) { return lpx_tensor_kind(t) ? lpx_kind_name(lpx_tensor_kind(t)) : "dense"; }

/* Flattens x [..., K] to [R, K] (views when possible; float8 through its
 * reshape handler). */
static lpx_status as_2d(lpx_tensor *x, lpx_tensor **out)
{
    int nd = lpx_tensor_ndim(x);
    if (nd == 2) {
        lpx_tensor_retain(x);
        *out = x;
        return LPX_OK;
    }
    int64_t shape[2] = {-1, nd ? lpx_tensor_shape(x)[nd - 1] : 1};
    if (lpx_tensor_numel(x) == 0) {
        shape[0] = 1;
        for (int i = 0; i < nd - 1; i++) shape[0] *= lpx_tensor_shape(x)[i];
    }
    return lpx_reshape(x, 2, shape, out);
}

/* Reshapes a [R, N] result back to lead_shape[0..nd-1) + [N]. */
static lpx_status unflatten_rows(lpx_tensor *r, const lpx_tensor *like, lpx_tensor **out)
{
    int nd = lpx_tensor_ndim(like);
    if (nd == 2) {
        lpx_tensor_retain(r);
        *out = r;
        return LPX_OK;
    }
    int64_t shape[LPX_MAX_DIMS];
    memcpy(shape, lpx_tensor_shape(like), (size_t)(nd - 1) * sizeof *shape);
    shape[nd - 1] = lpx_tensor_shape(r)[1];
    return lpx_reshape(r, nd, shape, out);
}

/* Shared tail: result in *res -> (copied into out if given) -> ret. */
static lpx_status finish(lpx_call *c, lpx_tensor *res, lpx_tensor *out)
{
    if (out) {
        lpx_status st = lpx_copy_(out, res);
        lpx_tensor_release(res);
        if (st) return st;
        lpx_tensor_retain(out);
        res = out;
    }
    c->rets[c->nrets++] = lpx_v_tensor(res);
    return LPX_OK;
}

/* a [..., M, K] @ b [K, N] -> flatten a's rows, scaled GEMM, unflatten. */
static lpx_status rows_gemm(const char *op, lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_tensor **out)
{
    lpx_tensor *a2 = NULL, *r = NULL;
    lpx_status st = as_2d(a, &a2);
    if (!st) st = f8_gemm(op, a2, b, bias, lpx_tensor_dtype(a), 0, &r);
    if (!st) st = unflatten_rows(r, a, out);
    lpx_tensor_release(a2);
    lpx_tensor_release(r);
    return st;
}

static lpx_status h_matmul(lpx_call *c)
{
    lpx_tensor *a = targ(c, 0), *b = targ(c, 1), *out = targ(c, 2);
    char why[160];
    if (!f8_is(a) || !f8_is(b)) {
        snprintf(why, sizeof why, "a is %s and b is %s; the scaled GEMM takes two float8 operands",
                 f8_is(a) ? "float8" : dense_name(a), f8_is(b) ? "float8" : dense_name(b));
        return defer(c, why);
    }
    if (lpx_tensor_ndim(b) != 2 || lpx_tensor_ndim(a) < 2) {
        snprintf(why, sizeof why, "a is %d-d and b %d-d; float8 matmul takes a [..., M, K] and b [K, N]",
                 lpx_tensor_ndim(a), lpx_tensor_ndim(b));
        return defer(c, why);
    }
    lpx_tensor *r = NULL;
    lpx_status st = rows_gemm("matmul", a, b, NULL, &r);
    return st ? st : finish(c, r, out);
}

static lpx_status h_linear(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0), *w = targ(c, 1), *bias = targ(c, 2);
    char why[160];
    if (!f8_is(x) || !f8_is(w)) {
        snprintf(why, sizeof why, "x is %s and w is %s; the scaled GEMM takes two float8 operands",
                 f8_is(x) ? "float8" : dense_name(x), f8_is(w) ? "float8" : dense_name(w));
        return defer(c, why);
    }
    if (lpx_tensor_ndim(w) != 2 || lpx_tensor_ndim(x) < 1) {
        char s1[160], s2[160];
        return lpx_error(LPX_ESHAPE, "linear (float8): x %s and w %s: expected x [..., in] and w [out, in]",
                         lpx_tensor_shape_str(x, s1, sizeof s1), lpx_tensor_shape_str(w, s2, sizeof s2));
    }
    lpx_tensor *wt = NULL, *r = NULL;
    lpx_status st = lpx_t(w, &wt);
    if (!st) st = rows_gemm("linear", x, wt, bias, &r);
    lpx_tensor_release(wt);
    return st ? st : finish(c, r, NULL);
}

static lpx_status h_addmm(lpx_call *c)
{
    lpx_tensor *ct = targ(c, 0), *a = targ(c, 1), *b = targ(c, 2);
    double beta = c->args[3].u.f, alpha = c->args[4].u.f;
    if (!f8_is(a) || !f8_is(b)) {
        char why[160];
        snprintf(why, sizeof why, "a is %s and b is %s; the scaled GEMM takes two float8 operands",
                 f8_is(a) ? "float8" : dense_name(a), f8_is(b) ? "float8" : dense_name(b));
        return defer(c, why);
    }
    if (lpx_tensor_ndim(a) == 2 && lpx_tensor_ndim(b) == 2) {
        int64_t mn[2] = {lpx_tensor_shape(a)[0], lpx_tensor_shape(b)[1]};
        int cn = lpx_tensor_ndim(ct);
        bool ok = cn <= 2;
        for (int i = 0; ok && i < cn; i++) {
            int64_t d = lpx_tensor_shape(ct)[i];
            ok = d == 1 || d == mn[2 - cn + i];
        }
        if (!ok) {
            char s1[160];
            return lpx_error(LPX_ESHAPE, "addmm (float8): c %s does not broadcast to the product's shape [%lld, %lld]",
                             lpx_tensor_shape_str(ct, s1, sizeof s1), (long long)mn[0], (long long)mn[1]);
        }
    }
    lpx_tensor *r = NULL, *ra = NULL, *hc = NULL, *cb = NULL, *res = NULL;
    lpx_status st = f8_gemm("addmm", a, b, NULL, lpx_tensor_dtype(a), 0, &r);
    if (!st) st = alpha == 1.0 ? (lpx_tensor_retain(r), ra = r, LPX_OK) : lpx_mul_scalar(r, alpha, &ra);
    /* beta == 0 ignores c entirely (NaN in c does not leak), as BLAS does */
    if (!st && beta != 0.0) {
        if (!(st = f8_hp(ct, &hc))) st = lpx_mul_scalar(hc, beta, &cb);
        if (!st) st = lpx_add(ra, cb, &res);
    } else if (!st) {
        lpx_tensor_retain(ra);
        res = ra;
    }
    lpx_tensor *tmp[4] = {r, ra, hc, cb};
    f8_release_all(tmp, 4);
    return st ? st : finish(c, res, NULL);
}

lpx_status f8_register_gemm_handlers(int key)
{
    lpx_status st;
    if ((st = lpx_kernel_register(LPX_OP_matmul, key, h_matmul, NULL))) return st;
    if ((st = lpx_kernel_register(LPX_OP_linear, key, h_linear, NULL))) return st;
    return lpx_kernel_register(LPX_OP_addmm, key, h_addmm, NULL);
}
