/* The nf4 kind's bridge to the dense ops of ops_nf4.def: quantize,
 * dequantize (ranges and whole tensors), the NF4 GEMM, and dim-0 slicing of
 * a payload in whole scaler blocks. Everything here dispatches on the inner
 * tensors, so it runs on whatever backend holds them. */
#include <string.h>
#include "nf4_internal.h"

lpx_status nf4_call(lpx_op op, const lpx_value *args, int nargs, lpx_tensor **rets, int nrets)
{
    for (int i = 0; i < nrets; i++) rets[i] = NULL;
    lpx_call c;
    lpx_call_init(&c, op, args, nargs);
    lpx_status st = lpx_dispatch(&c);
    if (st) return st;
    if (c.nrets < nrets) {
        lpx_call_release_rets(&c);
        return lpx_error(LPX_EINTERNAL, "%s: kernel returned %d results, expected %d", lpx_op_name(op), c.nrets, nrets);
    }
    for (int i = 0; i < c.nrets && i < LPX_MAX_RETS; i++) {
        if (i < nrets) rets[i] = c.rets[i].u.t;
        else lpx_tensor_release(c.rets[i].u.t);
    }
    return LPX_OK;
}

lpx_status nf4_quantize_payload(lpx_tensor *x, int64_t block, int64_t sblock, lpx_tensor **res4)
{
    lpx_value args[3] = {lpx_v_tensor(x), lpx_v_i64(block), lpx_v_i64(sblock)};
    return nf4_call(LPX_OP_nf4_quantize, args, 3, res4, 4);
}

lpx_status nf4_dequantize_range(const nf4_parts *p, int64_t start, int64_t count, lpx_dtype dtype, lpx_tensor *out,
                                lpx_tensor **res)
{
    lpx_value args[10] = {lpx_v_tensor(p->in[0]), lpx_v_tensor(p->in[1]), lpx_v_tensor(p->in[2]),
                          lpx_v_tensor(p->in[3]), lpx_v_i64(p->m.block), lpx_v_i64(p->m.scaler_block),
                          lpx_v_i64(start), lpx_v_i64(count), lpx_v_dtype(dtype), lpx_v_opt_tensor(out)};
    return nf4_call(LPX_OP_nf4_dequantize, args, 10, res, 1);
}

lpx_status nf4_to_dense(const char *op, lpx_tensor *t, lpx_dtype dtype, bool saturate, lpx_tensor **out)
{
    *out = NULL;
    nf4_parts p;
    lpx_status st = nf4_parts_of(op, "x", t, &p);
    if (st) return st;
    if (!lpx_dtype_valid(dtype)) return lpx_error(LPX_EDTYPE, "%s: unknown dtype %d for an nf4 tensor", op, (int)dtype);
    /* decode straight into the target when the op can; otherwise through f32 */
    lpx_dtype dq = nf4_logical_dtype_ok(dtype) ? dtype : LPX_F32;
    lpx_tensor *flat = NULL, *stored = NULL, *res = NULL;
    if ((st = nf4_dequantize_range(&p, 0, p.numel, dq, NULL, &flat))) return st;
    st = lpx_view(flat, p.ndim, p.sshape, &stored);
    lpx_tensor_release(flat);
    if (st) return st;
    if (p.m.transposed) {
        lpx_tensor *tv = NULL;
        st = lpx_t(stored, &tv);
        if (!st) st = lpx_contiguous(tv, &res);
        lpx_tensor_release(tv);
        lpx_tensor_release(stored);
    } else {
        res = stored;
    }
    if (st) return st;
    if (dq != dtype) {
        lpx_tensor *cast = NULL;
        st = lpx_cast(res, dtype, saturate, &cast);
        lpx_tensor_release(res);
        res = cast;
        if (st) return st;
    }
    *out = res;
    return LPX_OK;
}

lpx_status nf4_apply(const char *op, lpx_tensor *x, const lpx_tensor *w, bool transpose, lpx_tensor *bias,
                     lpx_tensor **out)
{
    *out = NULL;
    nf4_parts p;
    lpx_status st = nf4_parts_of(op, "w", w, &p);
    if (st) return st;
    char sw[128], sx[128];
    lpx_tensor_shape_str(w, sw, sizeof sw);
    if (p.ndim != 2)
        return lpx_error(LPX_ESHAPE, "%s: nf4 weight %s must be 2-D", op, sw);
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s: x is of kind %s; with an nf4 weight x must be dense", op,
                         lpx_kind_name(lpx_tensor_kind(x)));
    if (bias && lpx_tensor_kind(bias))
        return lpx_error(LPX_EINVAL, "%s: bias is of kind %s; with an nf4 weight the bias must be dense", op,
                         lpx_kind_name(lpx_tensor_kind(bias)));
    /* logical W = stored^T when transposed: x @ W^T is x @ S^T exactly when
     * W is not transposed, and x @ S when it is */
    bool tw = transpose != (p.m.transposed != 0);
    const int64_t *ls = lpx_tensor_shape(w);
    int64_t K = transpose ? ls[1] : ls[0];
    int xd = lpx_tensor_ndim(x);
    if (xd < 1 || lpx_tensor_shape(x)[xd - 1] != K)
        return lpx_error(LPX_ESHAPE, "%s: x %s does not match the nf4 weight %s%s (inner size %lld)", op,
                         lpx_tensor_shape_str(x, sx, sizeof sx), sw, transpose ? " used as W^T" : "", (long long)K);
    lpx_value args[11] = {lpx_v_tensor(x), lpx_v_tensor(p.in[0]), lpx_v_tensor(p.in[1]), lpx_v_tensor(p.in[2]),
                          lpx_v_tensor(p.in[3]), lpx_v_i64(p.m.block), lpx_v_i64(p.m.scaler_block),
                          lpx_v_i64(p.sshape[0]), lpx_v_i64(p.sshape[1]), lpx_v_bool(tw), lpx_v_opt_tensor(bias)};
    return nf4_call(LPX_OP_nf4_mm, args, 11, out, 1);
}

lpx_status nf4_slice_rows(const char *op, lpx_tensor *t, int64_t r0, int64_t r1, lpx_tensor **out)
{
    *out = NULL;
    nf4_parts p;
    lpx_status st = nf4_parts_of(op, "x", t, &p);
    if (st) return st;
    char s[128];
    lpx_tensor_shape_str(t, s, sizeof s);
    if (p.m.transposed || p.ndim == 0)
        return lpx_error(LPX_ESHAPE, "%s: nf4 tensor %s is %s; slicing needs an untransposed tensor with a dim 0", op,
                         s, p.ndim ? "transposed (its dim 0 is stored as columns)" : "0-D");
    int64_t rows = p.srows, unit = nf4_unit_rows(p.row_elems, p.m.block, p.m.scaler_block);
    if (r0 < 0 || r1 < r0 || r1 > rows)
        return lpx_error(LPX_ERANGE, "%s: rows [%lld, %lld) outside the %lld rows of nf4 tensor %s", op,
                         (long long)r0, (long long)r1, (long long)rows, s);
    bool empty = r0 == r1;
    if (!empty && (r0 % unit || (r1 % unit && r1 != rows)))
        return lpx_error(LPX_ESHAPE,
                         "%s: nf4 tensor %s slices along dim 0 in whole scaler blocks: rows [%lld, %lld) must start "
                         "and end on multiples of %lld rows (%lld x %lld elements; the end may be the last row)",
                         op, s, (long long)r0, (long long)r1, (long long)unit, (long long)p.m.block,
                         (long long)p.m.scaler_block);
    int64_t e0 = empty ? 0 : r0 * p.row_elems, e1 = empty ? 0 : r1 == rows ? p.m.padded : r1 * p.row_elems;
    int64_t B = p.m.block, U = p.m.block * p.m.scaler_block;
    int64_t starts[3] = {e0 / 2, e0 / B, e0 / U}, lens[3] = {(e1 - e0) / 2, (e1 - e0) / B, (e1 - e0) / U};
    lpx_tensor *inner[LPX_NF4_NINNER] = {NULL, NULL, NULL, p.in[3]};
    for (int i = 0; i < 3 && !st; i++) st = lpx_narrow(p.in[i], 0, starts[i], lens[i], &inner[i]);
    if (!st) {
        int64_t shape[LPX_MAX_DIMS];
        memcpy(shape, p.sshape, (size_t)p.ndim * sizeof *shape);
        shape[0] = r1 - r0;
        lpx_nf4_meta m = nf4_meta_init(B, p.m.scaler_block, e1 - e0, false,
                                       p.m.whole && r0 == 0 && r1 == rows);
        st = nf4_make(lpx_tensor_dtype(t), p.ndim, shape, inner, &m, out);
    }
    for (int i = 0; i < 3; i++) lpx_tensor_release(inner[i]);
    return st;
}
