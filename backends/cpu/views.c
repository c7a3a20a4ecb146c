/* CPU kernels: views and layout (view, reshape, transpose, t, permute,
 * slice, narrow, expand, contiguous, cat, clone, detach), and
 * cpu_view_copy, the strided copy with dtype conversion that they share
 * with copy_/cast/fill_.
 *
 * Views never copy: they build a new handle over the same storage with
 * lpx_tensor_view_of, which checks the geometry against the storage. The
 * copying ops (reshape when a view is impossible, contiguous, cat, clone)
 * allocate a contiguous result and fill it with cpu_view_copy. */
#include <stdio.h>
#include <string.h>
#include "cpu_internal.h"

/* ---- strided copy ---------------------------------------------------- */

/* Copies `len` elements of `esz` bytes between a strided run (stride in
 * elements) and a packed buffer. Typed loops for the common sizes so the
 * compiler emits plain loads/stores instead of memcpy calls. */
static void copy_run(unsigned char *run, int64_t stride, unsigned char *buf, int64_t len, size_t esz,
                     bool to_run)
{
    if (stride == 1) {
        if (to_run) memcpy(run, buf, (size_t)len * esz);
        else memcpy(buf, run, (size_t)len * esz);
        return;
    }
#define RUN_LOOP(T)                                                                      \
    do {                                                                                 \
        T *r_ = (T *)(void *)run, *b_ = (T *)(void *)buf;                                \
        if (to_run) for (int64_t j = 0; j < len; j++) r_[j * stride] = b_[j];            \
        else for (int64_t j = 0; j < len; j++) b_[j] = r_[j * stride];                   \
    } while (0)
    switch (esz) {
    case 1: RUN_LOOP(uint8_t); break;
    case 2: RUN_LOOP(uint16_t); break;
    case 4: RUN_LOOP(uint32_t); break;
    case 8: RUN_LOOP(uint64_t); break;
    default:
        for (int64_t j = 0; j < len; j++) {
            unsigned char *r = run + j * stride * (int64_t)esz, *b = buf + j * (int64_t)esz;
            if (to_run) memcpy(r, b, esz);
            else memcpy(b, r, esz);
        }
    }
#undef RUN_LOOP
}

/* Moves logical elements [start, start+n) of v to (to_view = false) or
 * from (to_view = true) the packed buffer buf, in runs along the last dim. */
static void walk(const cpu_view *v, int64_t start, int64_t n, unsigned char *buf, bool to_view)
{
    size_t esz = (size_t)v->elem_size;
    if (v->contiguous) {
        unsigned char *p = (unsigned char *)v->base + start * (int64_t)esz;
        if (to_view) memcpy(p, buf, (size_t)n * esz);
        else memcpy(buf, p, (size_t)n * esz);
        return;
    }
    /* not contiguous implies ndim >= 1 */
    int last = v->ndim - 1;
    int64_t idx[LPX_MAX_DIMS], rem = start;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % v->shape[d];
        rem /= v->shape[d];
    }
    for (int64_t k = 0; k < n;) {
        int64_t off = 0;
        for (int d = 0; d <= last; d++) off += idx[d] * v->strides[d];
        int64_t len = v->shape[last] - idx[last];
        if (len > n - k) len = n - k;
        copy_run((unsigned char *)v->base + off * (int64_t)esz, v->strides[last], buf + k * (int64_t)esz, len,
                 esz, to_view);
        k += len;
        idx[last] += len;
        for (int d = last; d > 0 && idx[d] >= v->shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

lpx_status cpu_view_copy(const cpu_view *dst, const cpu_view *src, unsigned flags)
{
    int64_t n = dst->numel;
    if (n == 0) return LPX_OK;
    bool same = dst->dtype == src->dtype;
    if (same && src->contiguous) {
        walk(dst, 0, n, (unsigned char *)src->base, true);
        return LPX_OK;
    }
    if (same && dst->contiguous) {
        walk(src, 0, n, (unsigned char *)dst->base, false);
        return LPX_OK;
    }
    if (dst->contiguous && src->contiguous)
        return lpx_convert(dst->base, dst->dtype, src->base, src->dtype, (size_t)n, flags);
    /* chunks through stack buffers: gather, convert, scatter */
    _Alignas(16) unsigned char ts[CPU_CHUNK * 8], td[CPU_CHUNK * 8];
    for (int64_t start = 0; start < n; start += CPU_CHUNK) {
        int64_t m = n - start < CPU_CHUNK ? n - start : CPU_CHUNK;
        unsigned char *s = ts;
        if (src->contiguous) s = (unsigned char *)src->base + start * src->elem_size;
        else walk(src, start, m, ts, false);
        if (same) {
            walk(dst, start, m, s, true);
            continue;
        }
        unsigned char *d = dst->contiguous ? (unsigned char *)dst->base + start * dst->elem_size : td;
        lpx_status st = lpx_convert(d, dst->dtype, s, src->dtype, (size_t)m, flags);
        if (st) return st;
        if (!dst->contiguous) walk(dst, start, m, td, true);
    }
    return LPX_OK;
}

/* ---- helpers --------------------------------------------------------- */

/* "[2, 3]" for an int array (error messages only). */
static const char *fmt_ints(char *buf, size_t len, int n, const int64_t *v)
{
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ", %lld" : "%lld", (long long)v[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

/* The error just set, prefixed with `op` (the message is copied first:
 * lpx_error writes into the buffer lpx_last_error returns). */
static lpx_status prefixed(lpx_status st, const char *op)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    return lpx_error(st, "%s: %s", op, msg);
}

/* Returns a view of x with the given geometry as the call's result. */
static lpx_status ret_view(lpx_call *c, const lpx_tensor *x, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset)
{
    lpx_tensor *v;
    lpx_status st = lpx_tensor_view_of(x, ndim, shape, strides, offset, &v);
    if (st) return prefixed(st, cpu_op_name(c));
    cpu_ret(c, v);
    return LPX_OK;
}

/* Copies src into the same-shaped dst: on the CPU directly, elsewhere
 * through the copy_ kernel of the tensors' device (these kernels serve
 * every backend that adopts them). */
static lpx_status copy_into(const lpx_tensor *dst, const lpx_tensor *src)
{
    if (dst->device.type != LPX_DEVICE_CPU) return lpx_copy_((lpx_tensor *)dst, (lpx_tensor *)src);
    cpu_view vd, vs;
    cpu_view_of(&vd, dst);
    cpu_view_of(&vs, src);
    return cpu_view_copy(&vd, &vs, 0);
}

/* New contiguous tensor of (ndim, shape) holding x's elements in row-major
 * order (x->numel must equal the shape's), on x's device. */
static lpx_status copy_as(lpx_call *c, const lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out)
{
    *out = NULL;
    lpx_tensor *y, *v;
    lpx_status st = lpx_tensor_new(x->dtype, x->ndim, x->shape, x->device, &y);
    if (st) return prefixed(st, cpu_op_name(c));
    if ((st = copy_into(y, x))) {
        lpx_tensor_release(y);
        return st;
    }
    if (ndim == x->ndim && !memcmp(shape, x->shape, (size_t)ndim * sizeof *shape)) {
        *out = y;
        return LPX_OK;
    }
    int64_t strides[LPX_MAX_DIMS];
    lpx_contiguous_strides(ndim, shape, strides);
    st = lpx_tensor_view_of(y, ndim, shape, strides, 0, &v);
    lpx_tensor_release(y);
    if (st) return prefixed(st, cpu_op_name(c));
    *out = v;
    return LPX_OK;
}

/* Reads an int[] argument as a shape: at most LPX_MAX_DIMS entries. */
static lpx_status shape_arg(const lpx_call *c, int i, const char *what, int *ndim, const int64_t **shape)
{
    const lpx_value *v = &c->args[i];
    if (v->len > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "%s: %s has %u dims, at most %d are supported", cpu_op_name(c), what,
                         (unsigned)v->len, LPX_MAX_DIMS);
    *ndim = (int)v->len;
    *shape = v->u.ints;
    return LPX_OK;
}

/* Resolves a view/reshape target shape against x->numel: at most one -1
 * (inferred), no other negative sizes, same element count. */
static lpx_status infer_shape(const lpx_call *c, const lpx_tensor *x, int ndim, const int64_t *in, int64_t *out)
{
    const char *op = cpu_op_name(c);
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

/* ---- kernels --------------------------------------------------------- */

/* view and reshape: the same shape rules; only reshape may copy when the
 * strides cannot express the new shape. */
static lpx_status view_or_reshape(lpx_call *c, bool may_copy)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    int ndim = 0;
    const int64_t *req = NULL;
    if (st || (st = shape_arg(c, 1, "shape", &ndim, &req))) return st;
    int64_t shape[LPX_MAX_DIMS], strides[LPX_MAX_DIMS];
    if ((st = infer_shape(c, x, ndim, req, shape))) return st;
    if (view_strides(x, ndim, shape, strides)) return ret_view(c, x, ndim, shape, strides, x->offset);
    if (!may_copy) {
        char s1[160], s2[160], s3[160];
        return lpx_error(LPX_ESHAPE,
                         "view: a tensor of shape %s and strides %s cannot be viewed as %s without a copy (use reshape)",
                         lpx_tensor_shape_str(x, s1, sizeof s1), fmt_ints(s2, sizeof s2, x->ndim, x->strides),
                         fmt_ints(s3, sizeof s3, ndim, shape));
    }
    lpx_tensor *y;
    if ((st = copy_as(c, x, ndim, shape, &y))) return st;
    cpu_ret(c, y);
    return LPX_OK;
}

static lpx_status k_view(lpx_call *c) { return view_or_reshape(c, false); }
static lpx_status k_reshape(lpx_call *c) { return view_or_reshape(c, true); }

static lpx_status k_transpose(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    int d0, d1;
    if (st || (st = lpx_meta_dim("transpose", c->args[1].u.i, x->ndim, &d0)) ||
        (st = lpx_meta_dim("transpose", c->args[2].u.i, x->ndim, &d1)))
        return st;
    int64_t shape[LPX_MAX_DIMS], strides[LPX_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    memcpy(strides, x->strides, sizeof strides);
    if (x->ndim > 0) {
        shape[d0] = x->shape[d1], shape[d1] = x->shape[d0];
        strides[d0] = x->strides[d1], strides[d1] = x->strides[d0];
    }
    return ret_view(c, x, x->ndim, shape, strides, x->offset);
}

static lpx_status k_t(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    if (st) return st;
    if (x->ndim > 2) {
        char s[160];
        return lpx_error(LPX_ESHAPE, "t: x has shape %s; t takes tensors of at most 2 dims (use transpose)",
                         lpx_tensor_shape_str(x, s, sizeof s));
    }
    int64_t shape[2] = {0, 0}, strides[2] = {0, 0};
    for (int i = 0; i < x->ndim; i++) {
        shape[i] = x->shape[x->ndim - 1 - i];
        strides[i] = x->strides[x->ndim - 1 - i];
    }
    return ret_view(c, x, x->ndim, shape, strides, x->offset);
}

static lpx_status k_permute(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    if (st) return st;
    const lpx_value *dv = &c->args[1];
    if ((int64_t)dv->len != x->ndim) {
        char s[160];
        return lpx_error(LPX_ESHAPE, "permute: got %u dims for x of shape %s (%d dims)", (unsigned)dv->len,
                         lpx_tensor_shape_str(x, s, sizeof s), x->ndim);
    }
    int64_t shape[LPX_MAX_DIMS], strides[LPX_MAX_DIMS];
    bool seen[LPX_MAX_DIMS] = {false};
    for (int i = 0; i < x->ndim; i++) {
        int d;
        if ((st = lpx_meta_dim("permute", dv->u.ints[i], x->ndim, &d))) return st;
        if (seen[d])
            return lpx_error(LPX_EINVAL, "permute: dim %lld appears more than once (dims[%d])",
                             (long long)dv->u.ints[i], i);
        seen[d] = true;
        shape[i] = x->shape[d];
        strides[i] = x->strides[d];
    }
    return ret_view(c, x, x->ndim, shape, strides, x->offset);
}

/* Normalises dim for ops that need a real dim (0-d tensors have none). */
static lpx_status real_dim(const lpx_call *c, const lpx_tensor *x, int64_t dim, int *d)
{
    if (x->ndim == 0)
        return lpx_error(LPX_ERANGE, "%s: x is 0-d, there is no dim %lld", cpu_op_name(c), (long long)dim);
    return lpx_meta_dim(cpu_op_name(c), dim, x->ndim, d);
}

static lpx_status k_slice(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    int d;
    if (st || (st = real_dim(c, x, c->args[1].u.i, &d))) return st;
    int64_t start = c->args[2].u.i, end = c->args[3].u.i, step = c->args[4].u.i;
    if (step < 1) return lpx_error(LPX_EINVAL, "slice: step %lld must be >= 1", (long long)step);
    int64_t size = x->shape[d];
    /* python semantics: negative counts from the end, then clamp */
    if (start < 0) start = start + size < 0 ? 0 : start + size;
    if (end < 0) end = end + size < 0 ? 0 : end + size;
    if (start > size) start = size;
    if (end > size) end = size;
    int64_t len = end > start ? 1 + (end - start - 1) / step : 0;
    int64_t shape[LPX_MAX_DIMS], strides[LPX_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    memcpy(strides, x->strides, sizeof strides);
    shape[d] = len;
    if (len > 1) strides[d] = x->strides[d] * step; /* len > 1 implies step < size: no overflow */
    int64_t offset = x->offset + (len ? start * x->strides[d] : 0);
    return ret_view(c, x, x->ndim, shape, strides, offset);
}

static lpx_status k_narrow(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    int d;
    if (st || (st = real_dim(c, x, c->args[1].u.i, &d))) return st;
    int64_t start = c->args[2].u.i, length = c->args[3].u.i, size = x->shape[d];
    int64_t s = start < 0 ? start + size : start;
    if (s < 0 || s > size || length < 0 || length > size - s)
        return lpx_error(LPX_ERANGE, "narrow: start %lld, length %lld is out of range for dim %d of size %lld",
                         (long long)start, (long long)length, d, (long long)size);
    int64_t shape[LPX_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[d] = length;
    int64_t offset = x->offset + (length ? s * x->strides[d] : 0);
    return ret_view(c, x, x->ndim, shape, x->strides, offset);
}

static lpx_status k_expand(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    int ndim = 0;
    const int64_t *req = NULL;
    if (st || (st = shape_arg(c, 1, "shape", &ndim, &req))) return st;
    char s1[160], s2[160];
    if (ndim < x->ndim)
        return lpx_error(LPX_ESHAPE, "expand: shape %s has fewer dims than x of shape %s",
                         fmt_ints(s1, sizeof s1, ndim, req), lpx_tensor_shape_str(x, s2, sizeof s2));
    int64_t shape[LPX_MAX_DIMS], strides[LPX_MAX_DIMS], numel = 1;
    int lead = ndim - x->ndim;
    for (int i = 0; i < ndim; i++) {
        int64_t want = req[i];
        if (i < lead) {
            if (want < 0)
                return lpx_error(LPX_EINVAL, "expand: shape %s has size %lld at new leading dim %d (-1 only keeps an existing dim)",
                                 fmt_ints(s1, sizeof s1, ndim, req), (long long)want, i);
            shape[i] = want;
            strides[i] = 0;
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
            shape[i] = want;
            strides[i] = want == have ? x->strides[i - lead] : 0;
        }
        if (shape[i] && numel > INT64_MAX / shape[i])
            return lpx_error(LPX_ERANGE, "expand: the element count of shape %s overflows int64",
                             fmt_ints(s1, sizeof s1, ndim, req));
        numel *= shape[i];
    }
    return ret_view(c, x, ndim, shape, strides, x->offset);
}

static lpx_status k_contiguous(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    if (st) return st;
    if (lpx_tensor_is_contiguous(x)) {
        lpx_tensor_retain(x);
        cpu_ret(c, x);
        return LPX_OK;
    }
    lpx_tensor *y;
    if ((st = copy_as(c, x, x->ndim, x->shape, &y))) return st;
    cpu_ret(c, y);
    return LPX_OK;
}

static lpx_status k_clone(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    lpx_tensor *y;
    if (st || (st = copy_as(c, x, x->ndim, x->shape, &y))) return st;
    cpu_ret(c, y);
    return LPX_OK;
}

static lpx_status k_detach(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st = cpu_check_dense_any_device(c, "x", x);
    if (st) return st;
    return ret_view(c, x, x->ndim, x->shape, x->strides, x->offset);
}

/* PyTorch still accepts 1-D empty tensors in cat whatever the other
 * shapes (legacy behaviour frameworks rely on): they are skipped. */
static bool cat_skipped(const lpx_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

static lpx_status k_cat(lpx_call *c)
{
    const lpx_value *xv = &c->args[0];
    int n = (int)xv->len;
    lpx_tensor *const *xs = xv->u.ts;
    lpx_status st;
    if (n == 0) return lpx_error(LPX_EINVAL, "cat: xs is empty");
    const lpx_tensor *ref = NULL;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "xs[%d]", i);
        if ((st = cpu_check_dense_any_device(c, name, xs[i]))) return st;
        if (xs[i]->dtype != xs[0]->dtype)
            return lpx_error(LPX_EDTYPE, "cat: xs[%d] has dtype %s, xs[0] has %s", i, lpx_dtype_name(xs[i]->dtype),
                             lpx_dtype_name(xs[0]->dtype));
        if (!ref && !cat_skipped(xs[i])) ref = xs[i];
    }
    if (!ref) ref = xs[0];
    if (ref->ndim == 0) return lpx_error(LPX_ESHAPE, "cat: xs holds a 0-d tensor; 0-d tensors cannot be concatenated");
    int d;
    if ((st = lpx_meta_dim("cat", c->args[1].u.i, ref->ndim, &d))) return st;
    int64_t shape[LPX_MAX_DIMS];
    memcpy(shape, ref->shape, sizeof shape);
    shape[d] = 0;
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
        if (x->shape[d] > INT64_MAX - shape[d])
            return lpx_error(LPX_ERANGE, "cat: the concatenated size of dim %d overflows int64", d);
        shape[d] += x->shape[d];
    }
    lpx_tensor *out;
    if ((st = lpx_tensor_new(ref->dtype, ref->ndim, shape, ref->device, &out)))
        return prefixed(st, "cat");
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const lpx_tensor *x = xs[i];
        if (x != ref && cat_skipped(x)) continue;
        if (x->numel == 0) continue; /* adds nothing along d either: shape[d] or another dim is 0 */
        if (x->device.type != out->device.type || x->device.index != out->device.index) {
            lpx_tensor_release(out);
            return lpx_error(LPX_EDEVICE, "cat: xs[%d] is on device %d:%d, the others on %d:%d", i, (int)x->device.type,
                             (int)x->device.index, (int)out->device.type, (int)out->device.index);
        }
        /* the slab of out that x fills: out narrowed to [at, at + len) */
        lpx_tensor *slab;
        int64_t sshape[LPX_MAX_DIMS];
        memcpy(sshape, out->shape, sizeof sshape);
        sshape[d] = x->shape[d];
        if (!(st = lpx_tensor_view_of(out, out->ndim, sshape, out->strides, at * out->strides[d], &slab))) {
            st = copy_into(slab, x);
            lpx_tensor_release(slab);
        }
        if (st) {
            lpx_tensor_release(out);
            return st;
        }
        at += x->shape[d];
    }
    cpu_ret(c, out);
    return LPX_OK;
}

lpx_status lpx_cpu_register_views(void)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
        {LPX_OP_view, k_view}, {LPX_OP_reshape, k_reshape}, {LPX_OP_transpose, k_transpose},
        {LPX_OP_t, k_t}, {LPX_OP_permute, k_permute}, {LPX_OP_slice, k_slice}, {LPX_OP_narrow, k_narrow},
        {LPX_OP_expand, k_expand}, {LPX_OP_contiguous, k_contiguous}, {LPX_OP_cat, k_cat},
        {LPX_OP_clone, k_clone}, {LPX_OP_detach, k_detach},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = cpu_reg(table[i].op, table[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
