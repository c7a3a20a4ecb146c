/* Handlers of the layout ops for float8 tensors: transpose, t, view,
 * reshape, slice, narrow (and so split/chunk), contiguous, clone, detach,
 * cast (= dequantize) and copy_.
 *
 * A view op runs on the fp8 data; the scale and scale_inv follow it: a
 * tensorwise scale ([]) is shared unchanged, an axiswise scale (size 1
 * along the reduced axis) gets the same op, so row scales are sliced with
 * their rows and transposed with their axis. Results share storage with
 * the source like dense views do. */
#include <stdio.h>
#include <string.h>
#include "float8_internal.h"

static lpx_tensor *targ(const lpx_call *c, int i) { return c->args[i].tag == LPX_TAG_TENSOR ? c->args[i].u.t : NULL; }

static lpx_status ret_new(lpx_call *c, lpx_tensor *t)
{
    c->rets[c->nrets++] = lpx_v_tensor(t);
    return LPX_OK;
}

static bool axiswise(const lpx_tensor *t) { return f8_meta_of(t)->granularity == LPX_FLOAT8_AXISWISE; }

static lpx_status norm_dim(const char *op, int64_t d, int nd, int *out)
{
    *out = 0;
    int64_t r = d < 0 ? d + nd : d;
    if (r < 0 || r >= (nd ? nd : 1))
        return lpx_error(LPX_ERANGE, "%s (float8): dim %lld out of range for %d dims", op, (long long)d, nd);
    *out = (int)r;
    return LPX_OK;
}

/* Builds the result from new data and scales (all three consumed, any of
 * them may be NULL). A failed `st` from building them is passed through
 * after the release, so every handler ends in this one call. */
static lpx_status rewrap_ret(lpx_call *c, lpx_status st, const lpx_tensor *x, lpx_tensor *d, lpx_tensor *s,
                             lpx_tensor *si, int axis)
{
    lpx_tensor *r = NULL;
    if (!st) st = f8_rewrap(x, d, s, si, axis, &r);
    lpx_tensor *tmp[3] = {d, s, si};
    f8_release_all(tmp, 3);
    return st ? st : ret_new(c, r);
}

static void share_scales(const lpx_tensor *x, lpx_tensor **s, lpx_tensor **si)
{
    *s = f8_scale(x);
    *si = f8_scale_inv(x);
    lpx_tensor_retain(*s);
    lpx_tensor_retain(*si);
}

/* ---- transpose / t --------------------------------------------------- */

/* A blockwise tensor transposed: data and the block grids of both scales
 * transposed, the block sides swapped. */
static lpx_status block_transpose(lpx_call *c, lpx_tensor *x)
{
    lpx_tensor *d = NULL, *s = NULL, *si = NULL, *r = NULL;
    const f8_meta *m = f8_meta_of(x);
    lpx_status st = lpx_transpose(f8_data(x), 0, 1, &d);
    if (!st) st = lpx_transpose(f8_scale(x), 0, 1, &s);
    if (!st) st = lpx_transpose(f8_scale_inv(x), 0, 1, &si);
    if (!st) {
        f8_meta mt = f8_meta_block(m->role, f8_block_cols(m), f8_block_rows(m));
        st = f8_make(d, s, si, lpx_tensor_dtype(x), &mt, &r);
    }
    lpx_tensor *tmp[3] = {d, s, si};
    f8_release_all(tmp, 3);
    return st ? st : ret_new(c, r);
}

/* Views that would cut or regroup blocks are refused for blockwise
 * tensors (their scales cover whole blocks). */
static lpx_status block_refused(const char *op, const lpx_tensor *x)
{
    const f8_meta *m = f8_meta_of(x);
    char s[160];
    return lpx_error(LPX_ENOTIMPL, "%s (float8): x %s is blockwise (%lld x %lld blocks): only transpose, t, "
                                   "narrow along whole blocks, contiguous, clone, detach and cast apply; dequantize "
                                   "it for other views",
                     op, lpx_tensor_shape_str(x, s, sizeof s), (long long)f8_block_rows(m), (long long)f8_block_cols(m));
}

/* narrow(dim, start, length) of a blockwise tensor along whole blocks:
 * start a multiple of the block side, the end one too or the dim's end
 * (how the sharding engine cuts rows: its shard unit is the block rows;
 * empty cuts, its ranks past the last rows, anywhere).
 * The scale grids are narrowed to the blocks kept. */
static lpx_status block_narrow(lpx_call *c, lpx_tensor *x, int d, int64_t start, int64_t len)
{
    const f8_meta *m = f8_meta_of(x);
    int64_t side = d == 0 ? f8_block_rows(m) : f8_block_cols(m), size = lpx_tensor_shape(x)[d];
    if (start < 0 || len < 0 || start > size || len > size - start)
        return lpx_error(LPX_ERANGE, "narrow (float8): [%lld, +%lld) out of range for dim %d of size %lld",
                         (long long)start, (long long)len, d, (long long)size);
    if (len && (start % side || (len % side && start + len != size))) {
        char s[160];
        return lpx_error(LPX_ESHAPE, "narrow (float8): x %s is blockwise (%lld x %lld blocks); dim %d can be cut at "
                         "multiples of %lld only (asked [%lld, +%lld))", lpx_tensor_shape_str(x, s, sizeof s),
                         (long long)f8_block_rows(m), (long long)f8_block_cols(m), d, (long long)side,
                         (long long)start, (long long)len);
    }
    /* (an empty cut may start anywhere: its grid is empty too) */
    int64_t g0 = start / side + (start % side != 0), gn = len / side + (len % side != 0);
    lpx_tensor *nd = NULL, *s = NULL, *si = NULL, *r = NULL;
    lpx_status st = lpx_narrow(f8_data(x), d, start, len, &nd);
    if (!st) st = lpx_narrow(f8_scale(x), d, g0, gn, &s);
    if (!st) st = lpx_narrow(f8_scale_inv(x), d, g0, gn, &si);
    if (!st) st = f8_make(nd, s, si, lpx_tensor_dtype(x), m, &r);
    lpx_tensor *tmp[3] = {nd, s, si};
    f8_release_all(tmp, 3);
    return st ? st : ret_new(c, r);
}

static lpx_status do_transpose(lpx_call *c, lpx_tensor *x, int d0, int d1)
{
    if (f8_is_block(x)) return block_transpose(c, x);
    lpx_tensor *d = NULL, *s = NULL, *si = NULL;
    int axis = f8_meta_of(x)->axis;
    lpx_status st = lpx_transpose(f8_data(x), d0, d1, &d);
    if (!st && axiswise(x)) {
        if (!(st = lpx_transpose(f8_scale(x), d0, d1, &s))) st = lpx_transpose(f8_scale_inv(x), d0, d1, &si);
        axis = axis == d0 ? d1 : axis == d1 ? d0 : axis;
    } else if (!st) {
        share_scales(x, &s, &si);
    }
    return rewrap_ret(c, st, x, d, s, si, axis);
}

static lpx_status h_transpose(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    int nd = lpx_tensor_ndim(x), d0 = 0, d1 = 0;
    lpx_status st;
    if ((st = norm_dim("transpose", c->args[1].u.i, nd, &d0)) || (st = norm_dim("transpose", c->args[2].u.i, nd, &d1)))
        return st;
    if (nd == 0) d0 = d1 = 0;
    if (nd == 0 || d0 == d1) {
        lpx_tensor *s, *si, *d = f8_data(x);
        lpx_tensor_retain(d);
        share_scales(x, &s, &si);
        return rewrap_ret(c, LPX_OK, x, d, s, si, f8_meta_of(x)->axis);
    }
    return do_transpose(c, x, d0, d1);
}

static lpx_status h_t(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    int nd = lpx_tensor_ndim(x);
    if (nd > 2) {
        char s[160];
        return lpx_error(LPX_ESHAPE, "t (float8): x has shape %s; t takes tensors of at most 2 dims (use transpose)",
                         lpx_tensor_shape_str(x, s, sizeof s));
    }
    if (nd < 2) {
        lpx_tensor *s, *si, *d = f8_data(x);
        lpx_tensor_retain(d);
        share_scales(x, &s, &si);
        return rewrap_ret(c, LPX_OK, x, d, s, si, f8_meta_of(x)->axis);
    }
    return do_transpose(c, x, 0, 1);
}

/* ---- slice / narrow --------------------------------------------------- */

/* Applies narrow (a, b: start, length) or slice (a, b, step) along dim
 * to t. (Not step == 0 for narrow: a slice's step 0 is slice's to refuse.) */
static lpx_status cut(lpx_tensor *t, bool narrow, int64_t dim, int64_t a, int64_t b, int64_t step, lpx_tensor **out)
{
    return narrow ? lpx_narrow(t, dim, a, b, out) : lpx_slice(t, dim, a, b, step, out);
}

static lpx_status slice_like(lpx_call *c, bool narrow)
{
    lpx_tensor *x = targ(c, 0);
    const char *op = narrow ? "narrow" : "slice";
    int64_t a = c->args[2].u.i, b = c->args[3].u.i, step = narrow ? 0 : c->args[4].u.i;
    int d = 0;
    lpx_status st = norm_dim(op, c->args[1].u.i, lpx_tensor_ndim(x), &d);
    if (st) return st;
    if (f8_is_block(x)) return narrow ? block_narrow(c, x, d, a, b) : block_refused(op, x);
    lpx_tensor *nd = NULL, *s = NULL, *si = NULL;
    st = cut(f8_data(x), narrow, d, a, b, step, &nd);
    /* scales with a full-size dim d follow the cut; size-1 ones broadcast */
    if (!st && axiswise(x) && lpx_tensor_shape(f8_scale(x))[d] != 1) {
        if (!(st = cut(f8_scale(x), narrow, d, a, b, step, &s)))
            st = cut(f8_scale_inv(x), narrow, d, a, b, step, &si);
    } else if (!st) {
        share_scales(x, &s, &si);
    }
    return rewrap_ret(c, st, x, nd, s, si, f8_meta_of(x)->axis);
}

static lpx_status h_slice(lpx_call *c) { return slice_like(c, false); }
static lpx_status h_narrow(lpx_call *c) { return slice_like(c, true); }

/* ---- view / reshape --------------------------------------------------- */

/* Resolves a requested shape (one -1 allowed) against numel. */
static lpx_status resolve_shape(const char *op, const lpx_tensor *x, const lpx_value *v, int *nd, int64_t *shape)
{
    if (v->len > LPX_MAX_DIMS) return lpx_error(LPX_EINVAL, "%s (float8): %u dims exceed %d", op, v->len, LPX_MAX_DIMS);
    int n = (int)v->len, infer = -1;
    int64_t prod = 1;
    for (int i = 0; i < n; i++) {
        shape[i] = v->u.ints[i];
        if (shape[i] == -1) {
            if (infer >= 0) return lpx_error(LPX_EINVAL, "%s (float8): more than one -1 in the shape", op);
            infer = i;
        } else if (shape[i] < 0) {
            return lpx_error(LPX_EINVAL, "%s (float8): negative size %lld", op, (long long)shape[i]);
        } else if (shape[i] && prod > INT64_MAX / shape[i]) {
            return lpx_error(LPX_ERANGE, "%s (float8): the element count of the shape overflows int64", op);
        } else {
            prod *= shape[i];
        }
    }
    int64_t numel = lpx_tensor_numel(x);
    if (infer >= 0) {
        if (prod == 0 || numel % prod)
            return lpx_error(LPX_ESHAPE, "%s (float8): cannot infer -1 for %lld elements", op, (long long)numel);
        shape[infer] = numel / prod;
        prod *= shape[infer];
    }
    if (prod != numel)
        return lpx_error(LPX_ESHAPE, "%s (float8): shape with %lld elements for a tensor of %lld", op, (long long)prod,
                         (long long)numel);
    *nd = n;
    return LPX_OK;
}

static lpx_status view_like(lpx_call *c, bool reshape)
{
    lpx_tensor *x = targ(c, 0);
    const char *op = reshape ? "reshape" : "view";
    int nd = 0;
    int64_t shape[LPX_MAX_DIMS];
    lpx_status st = resolve_shape(op, x, &c->args[1], &nd, shape);
    if (st) return st;
    int xnd = lpx_tensor_ndim(x), axis = f8_meta_of(x)->axis;
    const int64_t *xs = lpx_tensor_shape(x);
    int64_t sshape[LPX_MAX_DIMS];
    bool scales_follow = false;
    if (f8_is_block(x)) {
        bool same = nd == xnd;
        for (int i = 0; same && i < nd; i++) same = shape[i] == xs[i];
        if (!same) return block_refused(op, x);
    }
    if (axiswise(x)) {
        bool same = nd == xnd;
        for (int i = 0; same && i < nd; i++) same = shape[i] == xs[i];
        if (same) {
            /* identity: scales unchanged */
        } else if (axis == xnd - 1 && nd >= 1 && shape[nd - 1] == xs[xnd - 1]) {
            /* row scales: leading dims regroup, the scaled last dim stays */
            memcpy(sshape, shape, (size_t)nd * sizeof *shape);
            sshape[nd - 1] = 1;
            scales_follow = true;
            axis = nd - 1;
        } else if (axis == 0 && nd >= 1 && shape[0] == xs[0]) {
            /* column scales: trailing dims regroup, dim 0 stays */
            memcpy(sshape, shape, (size_t)nd * sizeof *shape);
            sshape[0] = 1;
            scales_follow = true;
        } else {
            char s1[160];
            return lpx_error(LPX_ESHAPE,
                             "%s (float8): x %s has scales reduced over dim %d; a new shape must keep that dim's "
                             "neighbourhood: the last dim (row scales) or dim 0 (column scales) unchanged",
                             op, lpx_tensor_shape_str(x, s1, sizeof s1), axis);
        }
    }
    lpx_tensor *d = NULL, *s = NULL, *si = NULL;
    st = reshape ? lpx_reshape(f8_data(x), nd, shape, &d) : lpx_view(f8_data(x), nd, shape, &d);
    if (!st && scales_follow) {
        if (!(st = lpx_reshape(f8_scale(x), nd, sshape, &s))) st = lpx_reshape(f8_scale_inv(x), nd, sshape, &si);
    } else if (!st) {
        share_scales(x, &s, &si);
    }
    return rewrap_ret(c, st, x, d, s, si, axis);
}

static lpx_status h_view(lpx_call *c) { return view_like(c, false); }
static lpx_status h_reshape(lpx_call *c) { return view_like(c, true); }

/* ---- contiguous, clone, detach --------------------------------------- */

static lpx_status h_contiguous(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    if (lpx_tensor_is_contiguous(f8_data(x))) {
        lpx_tensor_retain(x);
        return ret_new(c, x);
    }
    lpx_tensor *d = NULL, *s, *si;
    lpx_status st = lpx_contiguous(f8_data(x), &d);
    if (st) return st;
    share_scales(x, &s, &si);
    return rewrap_ret(c, LPX_OK, x, d, s, si, f8_meta_of(x)->axis);
}

static lpx_status h_clone(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0);
    lpx_tensor *d = NULL, *s = NULL, *si = NULL;
    lpx_status st = lpx_clone(f8_data(x), &d);
    if (!st) st = lpx_clone(f8_scale(x), &s);
    if (!st) st = lpx_clone(f8_scale_inv(x), &si);
    return rewrap_ret(c, st, x, d, s, si, f8_meta_of(x)->axis);
}

static lpx_status h_detach(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0), *d = f8_data(x), *s, *si;
    lpx_tensor_retain(d);
    share_scales(x, &s, &si);
    return rewrap_ret(c, LPX_OK, x, d, s, si, f8_meta_of(x)->axis);
}

/* ---- cast (= dequantize) and copy_ ------------------------------------ */

static lpx_status h_cast(lpx_call *c)
{
    lpx_tensor *x = targ(c, 0), *r = NULL;
    lpx_dtype dt = c->args[1].u.d;
    bool sat = c->args[2].u.b;
    const lpx_dtype_traits *tr = lpx_dtype_get(dt);
    if (!tr) return lpx_error(LPX_EDTYPE, "cast (float8): target dtype %d is not registered", (int)dt);
    lpx_status st;
    if (tr->is_float && tr->bits >= 16 && tr->block == 1) {
        st = f8_dequantize(x, dt, &r);
    } else {
        /* to fp8 or integers: dequantize exactly to f32, then the dense
         * cast applies the saturate flag */
        lpx_tensor *tmp = NULL;
        st = f8_dequantize(x, LPX_F32, &tmp);
        if (!st) st = lpx_cast(tmp, dt, sat, &r);
        lpx_tensor_release(tmp);
    }
    return st ? st : ret_new(c, r);
}

/* copy_ into a float8 dst re-quantizes src with dst's own scales (dst may
 * be a view sharing them); a dense dst receives the dequantized src. */
static lpx_status h_copy_(lpx_call *c)
{
    lpx_tensor *dst = targ(c, 0), *src = targ(c, 1);
    lpx_tensor *hs = NULL, *ex = NULL, *q = NULL;
    lpx_status st;
    if (!f8_is(dst)) {
        if (!(st = f8_dequantize(src, LPX_F32, &hs))) st = lpx_copy_(dst, hs);
        lpx_tensor_release(hs);
        if (st) return st;
        lpx_tensor_retain(dst);
        return ret_new(c, dst);
    }
    if (f8_is_block(dst)) return block_refused("copy_ into", dst);
    if ((st = f8_hp(src, &hs))) return st;
    int nd = lpx_tensor_ndim(dst);
    if (!(st = lpx_expand(hs, nd, lpx_tensor_shape(dst), &ex))) {
        const f8_meta *m = f8_meta_of(dst);
        int64_t dim = m->axis;
        st = lpx_fp8_quantize(ex, f8_scale(dst), lpx_tensor_dtype(f8_data(dst)),
                              m->granularity == LPX_FLOAT8_AXISWISE ? &dim : NULL, false, 0.0, true, &q, NULL, NULL,
                              NULL);
    }
    if (!st) st = lpx_copy_(f8_data(dst), q);
    lpx_tensor *tmp[3] = {hs, ex, q};
    f8_release_all(tmp, 3);
    if (st) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        return lpx_error(st, "copy_ (float8 dst): %s", msg);
    }
    lpx_tensor_retain(dst);
    return ret_new(c, dst);
}

lpx_status f8_register_view_handlers(int key)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
        {LPX_OP_transpose, h_transpose}, {LPX_OP_t, h_t},           {LPX_OP_view, h_view},
        {LPX_OP_reshape, h_reshape},     {LPX_OP_slice, h_slice},   {LPX_OP_narrow, h_narrow},
        {LPX_OP_contiguous, h_contiguous}, {LPX_OP_clone, h_clone}, {LPX_OP_detach, h_detach},
        {LPX_OP_cast, h_cast},           {LPX_OP_copy_, h_copy_},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = lpx_kernel_register(table[i].op, key, table[i].fn, NULL);
        if (st) return st;
    }
    return LPX_OK;
}
