/* The spec families of include/lpx/op_args_elementwise.h: their meta functions
 * (the conventions are spec.c's). Each checks in the order the CPU kernels
 * did (backends/cpu/elementwise.c, reduce.c), so every message is the one
 * the CPU gave. */
#include "spec_internal.h"

/* ---- unary: neg ... gelu (x, out?), add_scalar, mul_scalar (a, s, out?) */

/* The general path: the checks one by one, in the CPU kernels' order,
 * with their messages (x dense; then out dense and lpx_meta_out's: the
 * binary family's out rule). */
static __attribute__((noinline)) lpx_status unary_slow(const lpx_call *c, lpx_unary_args *a)
{
    bool scalar = c->nargs == 3;   /* (a, float s, out?): the tags are checked */
    int oi = scalar ? 2 : 1;
    lpx_tensor *x = c->args[0].u.t, *o = opt_tensor(c, oi);
    lpx_status st;
    if ((st = dense(c, 0, x))) return st;
    if (o && ((st = dense(c, oi, o)) || (st = lpx_meta_out(op_name(c), o, x->dtype, x->ndim, x->shape)))) return st;
    const lpx_tensor *r = o ? o : x;
    bool flat = true;
    int64_t s = 1;
    for (int i = x->ndim - 1; i >= 0; i--) {
        int64_t d = x->shape[i];
        if (d != 1) flat &= x->strides[i] == s && r->strides[i] == s;
        s *= d;
    }
    a->x = x;
    a->out = o;
    a->s = scalar ? (float)c->args[1].u.f : 0.0f;
    a->flat = flat;
    return LPX_OK;
}

/* The common case in one pass, no call but the tail call to unary_slow
 * (the dispatcher runs this before every unary op's kernel): x dense of a
 * built-in dtype; out (when given) dense, writable, of x's dtype and
 * shape. Anything else is unary_slow's, which fills the same fields. */
lpx_status lpx__spec_unary(const lpx_call *c, void *p)
{
    lpx_unary_args *a = p;
    const lpx_value *v = c->args;
    bool scalar = c->nargs == 3;
    int oi = scalar ? 2 : 1;
    lpx_tensor *x = v[0].u.t, *o = v[oi].tag == LPX_TAG_TENSOR ? v[oi].u.t : NULL;
    const lpx_tensor *r = o ? o : x;   /* out's checks, or x's again */
    int n = x->ndim;
    lpx_dtype dt = x->dtype;
    uint64_t bad = (uint64_t)(uintptr_t)x->kind | (uint64_t)(uintptr_t)r->kind |
                   (uint64_t)((unsigned)dt >= LPX_DTYPE_BUILTIN_COUNT) | (uint64_t)(uint32_t)(n ^ r->ndim) |
                   (uint64_t)(uint32_t)(dt ^ r->dtype);
    /* (a kind tensor has no storage: read-only is asked of a dense out only) */
    if (LPX_UNLIKELY(bad) || (o && LPX_UNLIKELY(o->storage->readonly))) return unary_slow(c, a);
    uint64_t strided = 0;
    int64_t s = 1;
#pragma GCC unroll 1
    for (int i = n - 1; i >= 0; i--) {
        int64_t d = x->shape[i];
        bad |= (uint64_t)(d ^ r->shape[i]);
        uint64_t sd = (uint64_t)(x->strides[i] ^ s) | (uint64_t)(r->strides[i] ^ s);
        strided |= d == 1 ? 0 : sd;
        s *= d;
    }
    if (LPX_UNLIKELY(bad)) return unary_slow(c, a);
    /* one scalar store per field: the kernel loads them back at once, and
     * a load out of the middle of a wider (vector) store is not forwarded
     * on every core (as lpx__binary_fill) */
    __asm__("" : "+r"(x), "+r"(o));
    a->x = x;
    a->out = o;
    a->s = scalar ? (float)v[1].u.f : 0.0f;
    a->flat = !strided;
    return LPX_OK;
}

/* ---- cast, copy_, fill_ ------------------------------------------------ */

lpx_status lpx__spec_cast(const lpx_call *c, void *p)
{
    lpx_cast_args *a = p;
    lpx_tensor *x = c->args[0].u.t;
    lpx_dtype dt = c->args[1].u.d;
    lpx_status st = lpx_meta_cast(op_name(c), x, dt);
    if (st) return st;
    /* any registered dtype, packed ones too: only a kind is refused (the
     * dense check's message) */
    if (LPX_UNLIKELY(x->kind)) return lpx__spec_dense_slow(c, 0, x);
    a->x = x;
    a->dtype = dt;
    a->saturate = c->args[2].u.b;
    return LPX_OK;
}

lpx_status lpx__spec_copy(const lpx_call *c, void *p)
{
    lpx_copy_args *a = p;
    lpx_tensor *dst = c->args[0].u.t, *src = c->args[1].u.t;
    lpx_status st;
    if ((st = dense(c, 0, dst)) || (st = dense(c, 1, src)) || (st = lpx_meta_copy(op_name(c), dst, src))) return st;
    a->dst = dst;
    a->src = src;
    return LPX_OK;
}

lpx_status lpx__spec_fill(const lpx_call *c, void *p)
{
    lpx_fill_args *a = p;
    lpx_tensor *dst = c->args[0].u.t;
    lpx_status st;
    if ((st = dense(c, 0, dst)) || (st = lpx_meta_fill(op_name(c), dst))) return st;
    a->dst = dst;
    a->value = (float)c->args[1].u.f;
    return LPX_OK;
}

/* ---- reduce: sum, mean, max, amax, norm ------------------------------- */

lpx_status lpx__spec_reduce(const lpx_call *c, void *p)
{
    lpx_reduce_args *a = p;
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st;
    if ((st = dense(c, 0, x))) return st;
    const lpx_value *dv = &c->args[1];
    bool some = dv->tag == LPX_TAG_INTS && dv->len > 0;   /* absent or empty: every dim */
    bool keepdim = c->args[2].u.b;
    /* max and amax have no identity to return for zero elements */
    bool has_identity = !(c->op == LPX_OP_max || c->op == LPX_OP_amax);
    if ((st = lpx_meta_reduce(op_name(c), x, some ? dv->u.ints : NULL, some ? (int)dv->len : 0, keepdim,
                              has_identity, &a->g)))
        return st;
    a->x = x;
    a->keepdim = keepdim;
    int64_t s = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        a->out_stride[d] = a->g.reduced[d] ? 0 : s;
        if (!a->g.reduced[d]) s *= x->shape[d];
    }
    return LPX_OK;
}
