/* The core spec families' meta functions (include/lpx/op_args.h): what
 * the dispatcher runs, once, before a backend kernel of an op whose ops.def
 * row names a family (each group's are in spec_<group>.c). Each checks the call's arguments against the op's
 * contract, in the order the CPU kernels checked them before (so every
 * message is the one the CPU gave), and fills the family's struct. The
 * contract pieces themselves are the public meta functions
 * (dispatch/meta_*.c); this file only binds them to the schema's
 * arguments. The tags are already checked (dispatch.c). */
#include <string.h>
#include "spec_internal.h"

/* ---- the checks every family starts with (spec_internal.h) ---------- */

/* A tensor that reached a backend: dense, of a byte-sized dtype. */
__attribute__((noinline)) lpx_status lpx__spec_dense_slow(const lpx_call *c, int i, const lpx_tensor *t)
{
    return lpx__spec_dense_named(c, arg_name(c, i), t);
}

lpx_status lpx__spec_dense_named(const lpx_call *c, const char *arg, const lpx_tensor *t)
{
    const char *op = op_name(c);
    if (t->kind)
        return lpx_error(LPX_EINVAL, "%s: tensor '%s' is of kind '%s'; the %s kernel takes dense tensors", op, arg,
                         lpx_kind_name(t->kind), lpx_key_name(c->key));
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    if (!tr || tr->bits < 8 || tr->bits % 8)
        return lpx_error(LPX_EDTYPE, "%s: tensor '%s' has dtype %s, which the %s kernels do not support", op, arg,
                         lpx_dtype_name(t->dtype), lpx_key_name(c->key));
    return LPX_OK;
}

__attribute__((noinline)) lpx_status lpx__spec_floating_slow(const lpx_call *c, int i, const lpx_tensor *t)
{
    lpx_status st = lpx__spec_dense_slow(c, i, t);
    if (st) return st;
    if (!lpx_dtype_get(t->dtype)->is_float) {
        const char *op = op_name(c);
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; %s takes floating-point tensors", op, arg_name(c, i),
                         lpx_dtype_name(t->dtype), op);
    }
    return LPX_OK;
}

/* ---- binary: add, sub, mul, div, swiglu, relu/silu/gelu_backward ------ */

static __attribute__((noinline)) lpx_status out_slow(const lpx_call *c, const lpx_binary_args *a)
{
    lpx_status st = dense(c, 2, a->out);
    return st ? st : lpx_meta_out(op_name(c), a->out, a->dtype, a->ndim, a->shape);
}

lpx_status lpx__spec_binary(const lpx_call *c, void *p)
{
    lpx_binary_args *a = p;
    lpx_tensor *x = c->args[0].u.t, *y = c->args[1].u.t, *o = opt_tensor(c, 2);
    lpx_status st;
    if ((st = dense(c, 0, x)) || (st = dense(c, 1, y))) return st;
    a->a = x;
    a->b = y;
    a->out = o;
    a->dtype = x->dtype;
    /* one shape (the common case) needs no broadcasting rule and no
     * overflow check: it is x's own */
    int n = x->ndim;
    bool same = n == y->ndim;
    if (LPX_LIKELY(same))
        for (int i = 0; i < n; i++) {
            int64_t d = x->shape[i];
            a->shape[i] = d;
            same &= d == y->shape[i];
        }
    a->ndim = n;
    if (LPX_UNLIKELY(!same) && (st = lpx_meta_broadcast(op_name(c), x, y, &a->ndim, a->shape))) return st;
    if (o) {
        /* lpx_meta_out's contract, tested inline; its messages on failure */
        bool ok = !o->kind && (unsigned)o->dtype < LPX_DTYPE_BUILTIN_COUNT && !o->storage->readonly &&
                  o->ndim == a->ndim && o->dtype == a->dtype;
        for (int i = 0; ok && i < a->ndim; i++) ok = o->shape[i] == a->shape[i];
        if (LPX_UNLIKELY(!ok) && (st = out_slow(c, a))) return st;
    }
    a->flat = lpx__binary_flat(a);
    return LPX_OK;
}

/* ---- softmax, softmax_backward --------------------------------------- */

lpx_status lpx__spec_softmax(const lpx_call *c, void *p)
{
    lpx_softmax_args *a = p;
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st;
    if ((st = floating(c, 0, x))) return st;
    a->x = x;
    return lpx_meta_lines(op_name(c), x, c->args[1].u.i, &a->dim, &a->len, &a->count);
}

lpx_status lpx__spec_softmax_backward(const lpx_call *c, void *p)
{
    lpx_softmax_backward_args *a = p;
    lpx_tensor *g = c->args[0].u.t, *y = c->args[1].u.t;
    const char *op = op_name(c);
    lpx_status st;
    if ((st = floating(c, 0, g)) || (st = floating(c, 1, y)) ||
        (st = lpx_meta_same_shape(op, arg_name(c, 0), g, arg_name(c, 1), y)))
        return st;
    a->grad = g;
    a->y = y;
    return lpx_meta_lines(op, y, c->args[2].u.i, &a->dim, &a->len, &a->count);
}

/* ---- matmul ---------------------------------------------------------- */

lpx_status lpx__spec_matmul(const lpx_call *c, void *p)
{
    lpx_matmul_args *a = p;
    lpx_tensor *x = c->args[0].u.t, *w = c->args[1].u.t, *o = opt_tensor(c, 2);
    lpx_status st;
    if ((st = floating(c, 0, x)) || (st = floating(c, 1, w)) || (o && (st = dense(c, 2, o)))) return st;
    a->a = x;
    a->b = w;
    a->out = o;
    return lpx_meta_matmul(op_name(c), x, w, o, &a->g);
}
