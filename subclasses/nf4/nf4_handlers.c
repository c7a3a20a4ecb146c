/* Op handlers at the nf4 key: GEMMs with an nf4 weight, the views an nf4
 * tensor can take without touching its payload (t, transpose, view,
 * reshape, dim-0 slices in whole scaler blocks, detach), and the ops that
 * produce or fill a payload (cast = dequantize, clone, copy_).
 *
 * Argument combinations a handler cannot serve go to the fallback rule
 * (nf4_fallback_run): a clear LPX_ENOTIMPL, or dequantize-and-redispatch
 * when the user switched it on. */
#include <stddef.h>
#include <string.h>
#include "nf4_internal.h"

static lpx_tensor *targ(const lpx_call *c, int i)
{
    return c->args[i].tag == LPX_TAG_TENSOR ? c->args[i].u.t : NULL;
}

static lpx_status ret(lpx_call *c, lpx_tensor *t)
{
    c->rets[c->nrets++] = lpx_v_tensor(t);
    return LPX_OK;
}

static const char *opname(const lpx_call *c) { return lpx_op_name(c->op); }

/* ---- GEMMs ------------------------------------------------------------- */

static lpx_status h_linear(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0), *w = targ(c, 1), *bias = targ(c, 2), *y = NULL;
    if (!lpx_nf4_is(w) || lpx_nf4_is(x) || lpx_nf4_is(bias))
        return nf4_fallback_run(c, "only the weight w of linear may be nf4");
    lpx_status st = nf4_apply(opname(c), x, w, true, bias, &y);
    return st ? st : ret(c, y);
}

static lpx_status h_matmul(lpx_call *c)
{
    lpx_tensor *a = targ(c, 0), *b = targ(c, 1), *out = targ(c, 2), *y = NULL;
    if (lpx_nf4_is(a) || !lpx_nf4_is(b) || lpx_nf4_is(out))
        return nf4_fallback_run(c, "only the right operand b of matmul may be nf4");
    lpx_status st = nf4_apply(opname(c), a, b, false, NULL, &y);
    if (st || !out) return st ? st : ret(c, y);
    st = lpx_copy_(out, y);
    lpx_tensor_release(y);
    if (st) return st;
    lpx_tensor_retain(out);
    return ret(c, out);
}

/* ---- views ---------------------------------------------------------------- */

/* A new handle over t's payload with another logical shape / flags. */
static lpx_status rewrap(lpx_call *c, lpx_tensor *t, int ndim, const int64_t *shape, bool flip_transposed)
{
    nf4_parts p;
    lpx_status st = nf4_parts_of(opname(c), "x", t, &p);
    if (st) return st;
    if (flip_transposed) p.m.transposed ^= 1u;
    lpx_tensor *y = NULL;
    if ((st = nf4_make(lpx_tensor_dtype(t), ndim, shape, p.in, &p.m, &y))) return st;
    return ret(c, y);
}

static lpx_status h_detach(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    return rewrap(c, x, lpx_tensor_ndim(x), lpx_tensor_shape(x), false);
}

static lpx_status transpose2d(lpx_call *c, lpx_tensor *x)
{
    const int64_t *s = lpx_tensor_shape(x);
    int64_t shape[2] = {s[1], s[0]};
    return rewrap(c, x, 2, shape, true);
}

static lpx_status h_t(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    int nd = lpx_tensor_ndim(x);
    if (nd < 2) return rewrap(c, x, nd, lpx_tensor_shape(x), false);
    if (nd > 2) {
        char s[128];
        return lpx_error(LPX_ESHAPE, "t: nf4 tensor %s has %d dims; t takes at most 2 (kind nf4)",
                         lpx_tensor_shape_str(x, s, sizeof s), nd);
    }
    return transpose2d(c, x);
}

static lpx_status h_transpose(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    int nd = lpx_tensor_ndim(x);
    int64_t d0 = c->args[1].u.i, d1 = c->args[2].u.i;
    int64_t n0 = d0 < 0 ? d0 + nd : d0, n1 = d1 < 0 ? d1 + nd : d1;
    if (n0 < 0 || n0 >= (nd ? nd : 1) || n1 < 0 || n1 >= (nd ? nd : 1))
        return lpx_error(LPX_ERANGE, "transpose: dims (%lld, %lld) out of range for %d dims (kind nf4)",
                         (long long)d0, (long long)d1, nd);
    if (n0 == n1) return rewrap(c, x, nd, lpx_tensor_shape(x), false);
    if (nd != 2)
        return lpx_error(LPX_ESHAPE, "transpose: nf4 tensors swap only the two dims of a 2-D tensor (x has %d dims; "
                         "kind nf4)", nd);
    return transpose2d(c, x);
}

/* view / reshape: same payload, another shape of the same numel. The
 * stored order is row-major over the logical shape unless transposed; a
 * transposed tensor keeps its shape (any other would reorder elements,
 * i.e. requantize). */
static lpx_status reshape_like(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    const char *op = opname(c);
    uint32_t nd = c->args[1].len;
    const int64_t *req = c->args[1].u.ints;
    if (nd > LPX_MAX_DIMS) return lpx_error(LPX_EINVAL, "%s: %u dims, at most %d (kind nf4)", op, nd, LPX_MAX_DIMS);
    int64_t shape[LPX_MAX_DIMS], known = 1, numel = lpx_tensor_numel(x);
    int infer = -1;
    for (uint32_t i = 0; i < nd; i++) {
        shape[i] = req[i];
        if (req[i] == -1 && infer < 0) { infer = (int)i; continue; }
        if (req[i] < 0) return lpx_error(LPX_ESHAPE, "%s: shape[%u] = %lld is invalid (kind nf4)", op, i, (long long)req[i]);
        if (req[i] && known > INT64_MAX / req[i])
            return lpx_error(LPX_ERANGE, "%s: shape overflows (kind nf4)", op);
        known *= req[i];
    }
    if (infer >= 0) {
        if (known == 0 || numel % known)
            return lpx_error(LPX_ESHAPE, "%s: cannot infer dim %d: %lld elements do not split by %lld (kind nf4)", op,
                             infer, (long long)numel, (long long)known);
        shape[infer] = numel / known;
        known = numel;
    }
    char s[128];
    lpx_tensor_shape_str(x, s, sizeof s);
    if (known != numel)
        return lpx_error(LPX_ESHAPE, "%s: nf4 tensor %s has %lld elements, the new shape %lld (kind nf4)", op, s,
                         (long long)numel, (long long)known);
    nf4_parts p;
    lpx_status st = nf4_parts_of(op, "x", x, &p);
    if (st) return st;
    if (p.m.transposed) {
        bool same = (int)nd == p.ndim;
        for (uint32_t i = 0; same && i < nd; i++) same = shape[i] == lpx_tensor_shape(x)[i];
        if (!same)
            return lpx_error(LPX_ESHAPE, "%s: nf4 tensor %s is transposed: its elements are stored in the other "
                             "order, so another shape would need requantization (dequantize first; kind nf4)",
                             op, s);
    }
    return rewrap(c, x, (int)nd, shape, false);
}

static lpx_status slice_common(lpx_call *c, int64_t dim, int64_t r0, int64_t r1)
{
    lpx_tensor *x = targ(c, 0), *y = NULL;
    int nd = lpx_tensor_ndim(x);
    int64_t d = dim < 0 ? dim + nd : dim;
    if (d != 0 || nd == 0)
        return lpx_error(LPX_ESHAPE, "%s: nf4 tensors slice along dim 0 only (dim %lld of a %d-D tensor; kind nf4)",
                         opname(c), (long long)dim, nd);
    lpx_status st = nf4_slice_rows(opname(c), x, r0, r1, &y);
    return st ? st : ret(c, y);
}

static lpx_status h_slice(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    int64_t dim = c->args[1].u.i, start = c->args[2].u.i, end = c->args[3].u.i, step = c->args[4].u.i;
    if (step != 1)
        return lpx_error(LPX_ESHAPE, "slice: step %lld on an nf4 tensor; only step 1 keeps whole scaler blocks "
                         "(kind nf4)", (long long)step);
    int64_t n = lpx_tensor_ndim(x) ? lpx_tensor_shape(x)[0] : 0;
    /* python semantics: negative counts from the end, then clamp */
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    return slice_common(c, dim, start, end);
}

static lpx_status h_narrow(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    int64_t dim = c->args[1].u.i, start = c->args[2].u.i, len = c->args[3].u.i;
    if (lpx_tensor_ndim(x) == 0) return slice_common(c, dim, 0, 0);   /* the 0-D refusal */
    int64_t n = lpx_tensor_shape(x)[0];
    if (start < 0) start += n;
    if (start < 0 || len < 0 || start > n || len > n - start)
        return lpx_error(LPX_ERANGE, "narrow: [%lld, %lld + %lld) outside dim 0 of size %lld (kind nf4)",
                         (long long)c->args[2].u.i, (long long)c->args[2].u.i, (long long)len, (long long)n);
    return slice_common(c, dim, start, start + len);
}

/* ---- payload producers -------------------------------------------------- */

static lpx_status h_cast(lpx_call *c)
{
    lpx_tensor *y = NULL;
    lpx_status st = nf4_to_dense(opname(c), targ(c, 0), c->args[1].u.d, c->args[2].u.b, &y);
    return st ? st : ret(c, y);
}

static lpx_status h_clone(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0), *inner[LPX_NF4_NINNER] = {NULL, NULL, NULL, NULL}, *y = NULL;
    nf4_parts p;
    lpx_status st = nf4_parts_of(opname(c), "x", x, &p);
    for (int i = 0; i < LPX_NF4_NINNER && !st; i++) st = lpx_clone(p.in[i], &inner[i]);
    if (!st) {
        p.m.whole = 1; /* the copy owns its mean */
        st = nf4_make(lpx_tensor_dtype(x), p.ndim, lpx_tensor_shape(x), inner, &p.m, &y);
    }
    for (int i = 0; i < LPX_NF4_NINNER; i++) lpx_tensor_release(inner[i]);
    return st ? st : ret(c, y);
}

static bool same_shape(const lpx_tensor *a, const lpx_tensor *b)
{
    if (lpx_tensor_ndim(a) != lpx_tensor_ndim(b)) return false;
    for (int i = 0; i < lpx_tensor_ndim(a); i++)
        if (lpx_tensor_shape(a)[i] != lpx_tensor_shape(b)[i]) return false;
    return true;
}

/* Copies payload src (4 tensors) into dst's inner tensors, the mean only
 * when asked. */
static lpx_status copy_payload(lpx_tensor *const *dst, lpx_tensor *const *src, bool mean)
{
    lpx_status st = LPX_OK;
    for (int i = 0; i < (mean ? 4 : 3) && !st; i++) st = lpx_copy_(dst[i], src[i]);
    return st;
}

/* dst (nf4) = quantize(src) with dst's layout. */
static lpx_status copy_into_nf4(const char *op, const nf4_parts *d, lpx_tensor *dst, lpx_tensor *src)
{
    char s1[128], s2[128];
    lpx_tensor_shape_str(dst, s1, sizeof s1);
    lpx_tensor_shape_str(src, s2, sizeof s2);
    nf4_parts sp;
    lpx_status st;
    if (lpx_nf4_is(src)) {
        if ((st = nf4_parts_of(op, "src", src, &sp))) return st;
        if (same_shape(dst, src) && !memcmp(&sp.m, &d->m, offsetof(lpx_nf4_meta, whole))) {
            /* same layout: a bit copy of the payload */
            double ms = 0.0, md = 0.0;
            if ((st = lpx_item(sp.in[3], 0, &ms)) || (st = lpx_item(d->in[3], 0, &md))) return st;
            if (!d->m.whole && ms != md)
                return lpx_error(LPX_EINVAL, "%s: dst %s is a slice of an nf4 tensor and src has another mean; "
                                 "writing it would change the parent's other rows (kind nf4)", op, s1);
            return copy_payload(d->in, sp.in, d->m.whole);
        }
    }
    if (!same_shape(dst, src))
        return lpx_error(LPX_ESHAPE, "%s: src %s does not match nf4 dst %s (kind nf4)", op, s2, s1);
    if (!d->m.whole)
        return lpx_error(LPX_EINVAL, "%s: dst %s is a dim-0 slice of an nf4 tensor (it shares its parent's mean); "
                         "quantizing into it would change the parent's other rows; clone it first (kind nf4)", op, s1);
    lpx_tensor *dense = NULL, *stored = NULL, *pay[4] = {NULL, NULL, NULL, NULL};
    if (lpx_nf4_is(src)) st = nf4_to_dense(op, src, LPX_F32, false, &dense);
    else {
        dense = src;
        lpx_tensor_retain(src);
        st = LPX_OK;
    }
    if (!st) {
        if (d->m.transposed) st = lpx_t(dense, &stored);   /* quantize in stored order */
        else {
            stored = dense;
            lpx_tensor_retain(dense);
        }
    }
    if (!st) st = nf4_quantize_payload(stored, d->m.block, d->m.scaler_block, pay);
    if (!st && lpx_tensor_numel(pay[0]) * 2 != d->m.padded)
        st = lpx_error(LPX_EINTERNAL, "%s: requantized payload has %lld codes, dst %lld (kind nf4)", op,
                       (long long)(lpx_tensor_numel(pay[0]) * 2), (long long)d->m.padded);
    if (!st) st = copy_payload(d->in, pay, true);
    for (int i = 0; i < 4; i++) lpx_tensor_release(pay[i]);
    lpx_tensor_release(stored);
    lpx_tensor_release(dense);
    return st;
}

static lpx_status h_copy_(lpx_call *c)
{
    lpx_tensor *dst = targ(c, 0), *src = targ(c, 1);
    const char *op = opname(c);
    lpx_status st;
    if (lpx_nf4_is(dst)) {
        nf4_parts d;
        if ((st = nf4_parts_of(op, "dst", dst, &d))) return st;
        if (lpx_tensor_kind(src) && !lpx_nf4_is(src))
            return nf4_fallback_run(c, "copy_ into nf4 takes a dense or nf4 src");
        st = copy_into_nf4(op, &d, dst, src);
    } else {
        /* dense dst: decode exactly to f32, the copy rounds once */
        lpx_tensor *dense = NULL;
        if ((st = nf4_to_dense(op, src, LPX_F32, false, &dense))) return st;
        st = lpx_copy_(dst, dense);
        lpx_tensor_release(dense);
    }
    if (st) return st;
    lpx_tensor_retain(dst);
    return ret(c, dst);
}

lpx_status nf4_register_handlers(int key)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
        {LPX_OP_linear, h_linear},     {LPX_OP_matmul, h_matmul}, {LPX_OP_t, h_t},
        {LPX_OP_transpose, h_transpose}, {LPX_OP_view, reshape_like}, {LPX_OP_reshape, reshape_like},
        {LPX_OP_slice, h_slice},       {LPX_OP_narrow, h_narrow}, {LPX_OP_cast, h_cast},
        {LPX_OP_clone, h_clone},       {LPX_OP_copy_, h_copy_},   {LPX_OP_detach, h_detach},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = lpx_kernel_register(table[i].op, key, table[i].fn, NULL);
        if (st) return st;
    }
    return LPX_OK;
}
