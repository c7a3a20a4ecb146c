/* The spec families of include/lpx/op_args_views.h: their meta functions
 * (the conventions are spec.c's). Each check is the one the CPU kernels
 * (backends/cpu/creation.c, views.c) made before the spec, in their order
 * and with their message; what the kernels then did with the arguments
 * (the result's geometry, the tensor they allocated) is computed here,
 * once, for every backend. */
#include <stdio.h>
#include <string.h>
#include "spec_internal.h"

/* ---- helpers --------------------------------------------------------- */

/* "[2, 3]" for an int array (messages only). */
static const char *fmt_ints(char *buf, size_t len, int n, const int64_t *v)
{
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ", %lld" : "%lld", (long long)v[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

/* lpx_shape_numel's check, its message under "<op>: <what>" (the kernels
 * met it in lpx_tensor_new or lpx_tensor_view_of and prefixed the op). */
static lpx_status shape_fits(const lpx_call *c, const char *what, int ndim, const int64_t *shape, int64_t *numel)
{
    char name[LPX_MAX_NAME + 32];
    snprintf(name, sizeof name, "%s: %s", op_name(c), what);
    return lpx_shape_numel(name, ndim, shape, numel);
}

/* What lpx_tensor_new refuses of (dtype, ndim, shape), with its message
 * prefixed by the op, as the kernels' lpx_tensor_new calls gave it. */
static lpx_status new_fits(const lpx_call *c, lpx_dtype dtype, int ndim, const int64_t *shape, int64_t *numel)
{
    lpx_status st = shape_fits(c, "lpx_tensor_new", ndim, shape, numel);
    if (st) return st;
    if (!lpx_dtype_valid(dtype))
        return lpx_error(LPX_EDTYPE, "%s: lpx_tensor_new: unknown dtype %d", op_name(c), (int)dtype);
    const lpx_dtype_traits *tr = lpx_dtype_get(dtype);
    if (*numel > (INT64_MAX - 64) / tr->bits)
        return lpx_error(LPX_ERANGE, "%s: lpx_tensor_new: %lld elements of %s overflow the byte count", op_name(c),
                         (long long)*numel, tr->name);
    return LPX_OK;
}

/* ---- create: empty, zeros, full, arange, randn, rand ------------------ */

lpx_status lpx__spec_create(const lpx_call *c, void *p)
{
    lpx_create_args *a = p;
    const char *op = op_name(c);
    /* every schema ends (..., dtype dtype, device device) */
    a->dtype = c->args[c->nargs - 2].u.d;
    a->device = c->args[c->nargs - 1].u.dev;
    a->value = 0;
    a->start = a->step = 0;
    a->seed = 0;
    a->bits = 0;
    lpx_status st;
    if (c->op == LPX_OP_arange) {
        a->start = c->args[0].u.f;
        a->step = c->args[2].u.f;
        a->ndim = 1;
        if ((st = lpx_meta_arange(op, a->start, c->args[1].u.f, a->step, &a->shape[0]))) return st;
        return new_fits(c, a->dtype, 1, a->shape, &a->numel);
    }
    const lpx_value *sv = &c->args[0];
    if ((st = lpx_meta_shape_arg(op, sv->u.ints, sv->len, &a->ndim))) return st;
    if (a->ndim) memcpy(a->shape, sv->u.ints, (size_t)a->ndim * sizeof *a->shape);
    if (c->op == LPX_OP_full) a->value = c->args[1].u.f;
    if (c->op == LPX_OP_randn || c->op == LPX_OP_rand) {
        a->seed = (uint64_t)c->args[1].u.i;
        if ((st = lpx_meta_random(op, a->dtype, &a->bits))) return st;
    }
    return new_fits(c, a->dtype, a->ndim, a->shape, &a->numel);
}

/* ---- view: the view and layout ops ----------------------------------- */

/* Resolves a view/reshape target shape against x->numel: at most one -1
 * (inferred), no other negative sizes, same element count. */
static lpx_status infer_shape(const lpx_call *c, const lpx_tensor *x, int ndim, const int64_t *in, int64_t *out)
{
    const char *op = op_name(c);
    char s1[160], s2[160];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        out[i] = in[i];
        if (in[i] == -1) {
            if (infer >= 0)
                return lpx_error(LPX_EINVAL, "%s: shape %s has more than one -1 (dims %d and %d)", op,
                                 fmt_ints(s1, sizeof s1, ndim, in), infer, i);
            infer = i;
            continue;
        }
        if (in[i] < 0)
            return lpx_error(LPX_EINVAL, "%s: shape %s has a negative size %lld at dim %d", op,
                             fmt_ints(s1, sizeof s1, ndim, in), (long long)in[i], i);
        if (in[i] && known > INT64_MAX / in[i])
            return lpx_error(LPX_ERANGE, "%s: the element count of shape %s overflows int64", op,
                             fmt_ints(s1, sizeof s1, ndim, in));
        known *= in[i];
    }
    if (infer >= 0) {
        if (known == 0 || x->numel % known)
            return lpx_error(LPX_ESHAPE, "%s: cannot infer the -1 of shape %s for a tensor of shape %s (%lld elements)",
                             op, fmt_ints(s1, sizeof s1, ndim, in), lpx_tensor_shape_str(x, s2, sizeof s2),
                             (long long)x->numel);
        out[infer] = x->numel / known;
        known = x->numel;
    }
    if (known != x->numel)
        return lpx_error(LPX_ESHAPE, "%s: shape %s (%lld elements) is invalid for a tensor of shape %s (%lld elements)",
                         op, fmt_ints(s1, sizeof s1, ndim, in), (long long)known,
                         lpx_tensor_shape_str(x, s2, sizeof s2), (long long)x->numel);
    return LPX_OK;
}

/* Strides that let x's memory be read as `shape` without a copy, or false
 * when none exist. This is PyTorch's computeStride: split x into chunks of
 * dims that are mutually contiguous, and require every new dim to fall
 * inside one chunk. */
static bool view_strides(const lpx_tensor *x, int ndim, const int64_t *shape, int64_t *strides)
{
    if (x->ndim == 0 || x->numel == 0) {
        lpx_contiguous_strides(ndim, shape, strides);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base = x->strides[x->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = x->ndim - 1; td >= 0; td--) {
        tensor_numel *= x->shape[td];
        if (td == 0 || (x->shape[td - 1] != 1 && x->strides[td - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                strides[view_d] = view_numel * chunk_base;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base = x->strides[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

/* The shape argument (int[] at i): at most LPX_MAX_DIMS entries. */
static lpx_status shape_arg(const lpx_call *c, int i, int *ndim, const int64_t **shape)
{
    *shape = c->args[i].u.ints;
    return lpx_meta_shape_arg(op_name(c), c->args[i].u.ints, c->args[i].len, ndim);
}

/* view and reshape: the same shape rules; only reshape may copy when the
 * strides cannot express the new shape. */
static lpx_status view_or_reshape(const lpx_call *c, lpx_view_args *a, bool may_copy)
{
    const lpx_tensor *x = a->x;
    const int64_t *req;
    int64_t numel;
    lpx_status st;
    if ((st = shape_arg(c, 1, &a->ndim, &req)) || (st = infer_shape(c, x, a->ndim, req, a->shape))) return st;
    /* what lpx_tensor_view_of refuses of the result: only a shape with a 0
     * (x has no element) can hold other dims whose product overflows */
    if (x->numel == 0 && (st = shape_fits(c, "lpx_tensor_view_of", a->ndim, a->shape, &numel))) return st;
    if (view_strides(x, a->ndim, a->shape, a->strides)) return LPX_OK;
    if (!may_copy) {
        char s1[160], s2[160], s3[160];
        return lpx_error(LPX_ESHAPE,
                         "view: a tensor of shape %s and strides %s cannot be viewed as %s without a copy (use reshape)",
                         lpx_tensor_shape_str(x, s1, sizeof s1), fmt_ints(s2, sizeof s2, x->ndim, x->strides),
                         fmt_ints(s3, sizeof s3, a->ndim, a->shape));
    }
    a->result = LPX_VIEW_COPY;
    return LPX_OK;
}

static lpx_status transpose(const lpx_call *c, lpx_view_args *a)
{
    const lpx_tensor *x = a->x;
    int d0, d1;
    lpx_status st;
    if ((st = lpx_meta_dim("transpose", c->args[1].u.i, x->ndim, &d0)) ||
        (st = lpx_meta_dim("transpose", c->args[2].u.i, x->ndim, &d1)))
        return st;
    if (x->ndim > 0) {
        a->shape[d0] = x->shape[d1], a->shape[d1] = x->shape[d0];
        a->strides[d0] = x->strides[d1], a->strides[d1] = x->strides[d0];
    }
    return LPX_OK;
}

static lpx_status t(lpx_view_args *a)
{
    const lpx_tensor *x = a->x;
    if (x->ndim > 2) {
        char s[160];
        return lpx_error(LPX_ESHAPE, "t: x has shape %s; t takes tensors of at most 2 dims (use transpose)",
                         lpx_tensor_shape_str(x, s, sizeof s));
    }
    for (int i = 0; i < x->ndim; i++) {
        a->shape[i] = x->shape[x->ndim - 1 - i];
        a->strides[i] = x->strides[x->ndim - 1 - i];
    }
    return LPX_OK;
}

static lpx_status permute(const lpx_call *c, lpx_view_args *a)
{
    const lpx_tensor *x = a->x;
    const lpx_value *dv = &c->args[1];
    if ((int64_t)dv->len != x->ndim) {
        char s[160];
        return lpx_error(LPX_ESHAPE, "permute: got %u dims for x of shape %s (%d dims)", (unsigned)dv->len,
                         lpx_tensor_shape_str(x, s, sizeof s), x->ndim);
    }
    bool seen[LPX_MAX_DIMS] = {false};
    for (int i = 0; i < x->ndim; i++) {
        int d;
        lpx_status st = lpx_meta_dim("permute", dv->u.ints[i], x->ndim, &d);
        if (st) return st;
        if (seen[d])
            return lpx_error(LPX_EINVAL, "permute: dim %lld appears more than once (dims[%d])",
                             (long long)dv->u.ints[i], i);
        seen[d] = true;
        a->shape[i] = x->shape[d];
        a->strides[i] = x->strides[d];
    }
    return LPX_OK;
}

/* Normalises dim for ops that need a real dim (0-d tensors have none). */
static lpx_status real_dim(const lpx_call *c, const lpx_tensor *x, int64_t dim, int *d)
{
    if (x->ndim == 0)
        return lpx_error(LPX_ERANGE, "%s: x is 0-d, there is no dim %lld", op_name(c), (long long)dim);
    return lpx_meta_dim(op_name(c), dim, x->ndim, d);
}

static lpx_status slice(const lpx_call *c, lpx_view_args *a)
{
    const lpx_tensor *x = a->x;
    int d;
    lpx_status st = real_dim(c, x, c->args[1].u.i, &d);
    if (st) return st;
    int64_t start = c->args[2].u.i, end = c->args[3].u.i, step = c->args[4].u.i;
    if (step < 1) return lpx_error(LPX_EINVAL, "slice: step %lld must be >= 1", (long long)step);
    int64_t size = x->shape[d];
    /* python semantics: negative counts from the end, then clamp */
    if (start < 0) start = start + size < 0 ? 0 : start + size;
    if (end < 0) end = end + size < 0 ? 0 : end + size;
    if (start > size) start = size;
    if (end > size) end = size;
    int64_t len = end > start ? 1 + (end - start - 1) / step : 0;
    a->shape[d] = len;
    if (len > 1) a->strides[d] = x->strides[d] * step; /* len > 1 implies step < size: no overflow */
    a->offset = x->offset + (len ? start * x->strides[d] : 0);
    return LPX_OK;
}

static lpx_status narrow(const lpx_call *c, lpx_view_args *a)
{
    const lpx_tensor *x = a->x;
    int d;
    lpx_status st = real_dim(c, x, c->args[1].u.i, &d);
    if (st) return st;
    int64_t start = c->args[2].u.i, length = c->args[3].u.i, size = x->shape[d];
    int64_t s = start < 0 ? start + size : start;
    if (s < 0 || s > size || length < 0 || length > size - s)
        return lpx_error(LPX_ERANGE, "narrow: start %lld, length %lld is out of range for dim %d of size %lld",
                         (long long)start, (long long)length, d, (long long)size);
    a->shape[d] = length;
    a->offset = x->offset + (length ? s * x->strides[d] : 0);
    return LPX_OK;
}

static lpx_status expand(const lpx_call *c, lpx_view_args *a)
{
    const lpx_tensor *x = a->x;
    int ndim = 0;
    const int64_t *req = NULL;
    lpx_status st = shape_arg(c, 1, &ndim, &req);
    if (st) return st;
    char s1[160], s2[160];
    if (ndim < x->ndim)
        return lpx_error(LPX_ESHAPE, "expand: shape %s has fewer dims than x of shape %s",
                         fmt_ints(s1, sizeof s1, ndim, req), lpx_tensor_shape_str(x, s2, sizeof s2));
    int64_t numel = 1;
    int lead = ndim - x->ndim;
    for (int i = 0; i < ndim; i++) {
        int64_t want = req[i];
        if (i < lead) {
            if (want < 0)
                return lpx_error(LPX_EINVAL, "expand: shape %s has size %lld at new leading dim %d (-1 only keeps an existing dim)",
                                 fmt_ints(s1, sizeof s1, ndim, req), (long long)want, i);
            a->shape[i] = want;
            a->strides[i] = 0;
        } else {
            int64_t have = x->shape[i - lead];
            if (want == -1) want = have;
            if (want < 0)
                return lpx_error(LPX_EINVAL, "expand: shape %s has a negative size %lld at dim %d",
                                 fmt_ints(s1, sizeof s1, ndim, req), (long long)want, i);
            if (want != have && have != 1)
                return lpx_error(LPX_ESHAPE, "expand: x of shape %s cannot expand to %s (dim %d: %lld vs %lld)",
                                 lpx_tensor_shape_str(x, s2, sizeof s2), fmt_ints(s1, sizeof s1, ndim, req), i,
                                 (long long)have, (long long)want);
            a->shape[i] = want;
            a->strides[i] = want == have ? x->strides[i - lead] : 0;
        }
        if (a->shape[i] && numel > INT64_MAX / a->shape[i])
            return lpx_error(LPX_ERANGE, "expand: the element count of shape %s overflows int64",
                             fmt_ints(s1, sizeof s1, ndim, req));
        numel *= a->shape[i];
    }
    a->ndim = ndim;
    /* what lpx_tensor_view_of refuses of the result: with a 0 among the
     * sizes, the product of the others may still overflow */
    return numel ? LPX_OK : shape_fits(c, "lpx_tensor_view_of", ndim, a->shape, &numel);
}

lpx_status lpx__spec_view(const lpx_call *c, void *p)
{
    lpx_view_args *a = p;
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st;
    if ((st = dense(c, 0, x))) return st;
    /* x's own geometry, the start of every rule below */
    a->x = x;
    a->result = LPX_VIEW_SHARE;
    a->ndim = x->ndim;
    a->offset = x->offset;
    memcpy(a->shape, x->shape, sizeof a->shape);
    memcpy(a->strides, x->strides, sizeof a->strides);
    switch (c->op) {
    case LPX_OP_view: return view_or_reshape(c, a, false);
    case LPX_OP_reshape: return view_or_reshape(c, a, true);
    case LPX_OP_transpose: return transpose(c, a);
    case LPX_OP_t: return t(a);
    case LPX_OP_permute: return permute(c, a);
    case LPX_OP_slice: return slice(c, a);
    case LPX_OP_narrow: return narrow(c, a);
    case LPX_OP_expand: return expand(c, a);
    case LPX_OP_contiguous: a->result = lpx_tensor_is_contiguous(x) ? LPX_VIEW_SAME : LPX_VIEW_COPY; return LPX_OK;
    case LPX_OP_clone: a->result = LPX_VIEW_COPY; return LPX_OK;
    case LPX_OP_detach: return LPX_OK;
    default: return lpx_error(LPX_EINTERNAL, "%s: the view family has no rule for this op", op_name(c));
    }
}

/* ---- cat ------------------------------------------------------------- */

/* A list element that reached a backend: dense, of a byte-sized dtype (the
 * checks and messages of dense(), naming it "xs[i]"). */
static lpx_status dense_elem(const lpx_call *c, int i, const lpx_tensor *t)
{
    if (LPX_LIKELY(!t->kind && (unsigned)t->dtype < LPX_DTYPE_BUILTIN_COUNT)) return LPX_OK;
    const char *op = op_name(c);
    if (t->kind)
        return lpx_error(LPX_EINVAL, "%s: tensor 'xs[%d]' is of kind '%s'; the %s kernel takes dense tensors", op, i,
                         lpx_kind_name(t->kind), lpx_key_name(c->key));
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    if (!tr || tr->bits < 8 || tr->bits % 8)
        return lpx_error(LPX_EDTYPE, "%s: tensor 'xs[%d]' has dtype %s, which the %s kernels do not support", op, i,
                         lpx_dtype_name(t->dtype), lpx_key_name(c->key));
    return LPX_OK;
}

/* PyTorch still accepts 1-D empty tensors in cat whatever the other
 * shapes (legacy behaviour frameworks rely on): they are skipped. */
static bool cat_skipped(const lpx_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

lpx_status lpx__spec_cat(const lpx_call *c, void *p)
{
    lpx_cat_args *a = p;
    const lpx_value *xv = &c->args[0];
    int n = (int)xv->len;
    lpx_tensor *const *xs = xv->u.ts;
    lpx_status st;
    if (n == 0) return lpx_error(LPX_EINVAL, "cat: xs is empty");
    const lpx_tensor *ref = NULL;
    for (int i = 0; i < n; i++) {
        if ((st = dense_elem(c, i, xs[i]))) return st;
        if (xs[i]->dtype != xs[0]->dtype)
            return lpx_error(LPX_EDTYPE, "cat: xs[%d] has dtype %s, xs[0] has %s", i, lpx_dtype_name(xs[i]->dtype),
                             lpx_dtype_name(xs[0]->dtype));
        if (!ref && !cat_skipped(xs[i])) ref = xs[i];
    }
    if (!ref) ref = xs[0];
    if (ref->ndim == 0) return lpx_error(LPX_ESHAPE, "cat: xs holds a 0-d tensor; 0-d tensors cannot be concatenated");
    int d;
    if ((st = lpx_meta_dim("cat", c->args[1].u.i, ref->ndim, &d))) return st;
    memcpy(a->shape, ref->shape, sizeof a->shape);
    a->shape[d] = 0;
    for (int i = 0; i < n; i++) {
        const lpx_tensor *x = xs[i];
        if (x != ref && cat_skipped(x)) continue;
        bool ok = x->ndim == ref->ndim;
        int bad = -1;
        for (int k = 0; ok && k < ref->ndim; k++)
            if (k != d && x->shape[k] != ref->shape[k]) ok = false, bad = k;
        if (!ok) {
            char s1[160], s2[160], why[64] = "the dim counts differ";
            if (bad >= 0)
                snprintf(why, sizeof why, "dim %d: %lld vs %lld", bad, (long long)x->shape[bad],
                         (long long)ref->shape[bad]);
            return lpx_error(LPX_ESHAPE, "cat: xs[%d] has shape %s, which does not match %s outside dim %d (%s)", i,
                             lpx_tensor_shape_str(x, s1, sizeof s1), lpx_tensor_shape_str(ref, s2, sizeof s2), d, why);
        }
        if (x->shape[d] > INT64_MAX - a->shape[d])
            return lpx_error(LPX_ERANGE, "cat: the concatenated size of dim %d overflows int64", d);
        a->shape[d] += x->shape[d];
    }
    a->xs = xs;
    a->n = n;
    a->ref = ref;
    a->dim = d;
    a->dtype = ref->dtype;
    a->ndim = ref->ndim;
    int64_t numel;
    return new_fits(c, a->dtype, a->ndim, a->shape, &numel);
}
