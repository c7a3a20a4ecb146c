/* Helpers for the typed convenience API (dispatch/api_*.c): build the
 * argument array on the stack, dispatch, hand back the results. */
#ifndef LPX_API_UTIL_H
#define LPX_API_UTIL_H

#include "../core/lpx_internal.h"

/* lpx_dispatch for a call that already sits in an lpx_op_frame (op_args.h,
 * dispatch.c): an op with a spec family gets its checked arguments
 * straight into f->args and the kernel runs on &f->call itself, with no
 * copy of the call in or of the rets out. The helpers below use it. */
lpx_status lpx__dispatch_frame(lpx_op_frame *f);

/* Dispatches op over args and stores its first result in *out (NULL on
 * failure). */
static inline lpx_status lpx__call_ret1(lpx_op op, const lpx_value *args, int nargs, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", lpx_op_name(op));
    *out = NULL;
    lpx_op_frame f;
    lpx_call *const c = &f.call;
    lpx_call_init(c, op, args, nargs);
    lpx_status st = lpx__dispatch_frame(&f);
    if (st) return st;
    if (c->nrets < 1 || c->rets[0].tag != LPX_TAG_TENSOR) {
        lpx_call_release_rets(c);
        return lpx_error(LPX_EINTERNAL, "%s: kernel for key '%s' returned no tensor", lpx_op_name(op), lpx_key_name(c->key));
    }
    for (int i = 1; i < c->nrets; i++) lpx_tensor_release(c->rets[i].u.t);
    *out = c->rets[0].u.t;
    return LPX_OK;
}

/* Dispatches op, whose kernels return exactly n tensors, and stores
 * result i in *outs[i] (outs[i] NULL: dropped); LPX_EINTERNAL when a
 * kernel returns another count. */
static inline lpx_status lpx__call_retn(lpx_op op, const lpx_value *args, int nargs, int n, lpx_tensor **const *outs)
{
    lpx_op_frame f;
    lpx_call *const c = &f.call;
    lpx_call_init(c, op, args, nargs);
    lpx_status st = lpx__dispatch_frame(&f);
    if (st) return st;
    if (c->nrets != n) {
        lpx_call_release_rets(c);
        return lpx_error(LPX_EINTERNAL, "%s: kernel for key '%s' returned %d results, not %d", lpx_op_name(op),
                         lpx_key_name(c->key), c->nrets, n);
    }
    for (int i = 0; i < n; i++) {
        if (outs[i]) *outs[i] = c->rets[i].u.t;
        else lpx_tensor_release(c->rets[i].u.t);
    }
    return LPX_OK;
}

/* Dispatches op and drops its results (in-place and _out variants). */
static inline lpx_status lpx__call_ret0(lpx_op op, const lpx_value *args, int nargs)
{
    lpx_op_frame f;
    lpx_call *const c = &f.call;
    lpx_call_init(c, op, args, nargs);
    lpx_status st = lpx__dispatch_frame(&f);
    if (!st) lpx_call_release_rets(c);
    return st;
}

/* Dispatches op and stores up to two results (either pointer may be NULL
 * to drop that result). */
static inline lpx_status lpx__call_ret2(lpx_op op, const lpx_value *args, int nargs, lpx_tensor **o0, lpx_tensor **o1)
{
    if (o0) *o0 = NULL;
    if (o1) *o1 = NULL;
    lpx_op_frame f;
    lpx_call *const c = &f.call;
    lpx_call_init(c, op, args, nargs);
    lpx_status st = lpx__dispatch_frame(&f);
    if (st) return st;
    lpx_tensor *r[2] = {c->nrets > 0 ? c->rets[0].u.t : NULL, c->nrets > 1 ? c->rets[1].u.t : NULL};
    for (int i = 2; i < c->nrets; i++) lpx_tensor_release(c->rets[i].u.t);
    if (o0) *o0 = r[0]; else lpx_tensor_release(r[0]);
    if (o1) *o1 = r[1]; else lpx_tensor_release(r[1]);
    return LPX_OK;
}

#endif
