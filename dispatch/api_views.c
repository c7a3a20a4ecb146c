/* Typed API: views and layout ops, plus lpx_split / lpx_chunk (built on
 * lpx_narrow, so every kind that implements narrow gets them) and
 * lpx_item. */
#include <stdio.h>
#include "api_util.h"
#include "../core/dtype_internal.h"

/* A negative count cannot travel in the uint32 length of a list value. */
static lpx_status check_count(lpx_op op, const char *what, int n, lpx_tensor **out)
{
    if (out) *out = NULL;
    if (n < 0) return lpx_error(LPX_EINVAL, "%s: %s %d is negative", lpx_op_name(op), what, n);
    return LPX_OK;
}

static lpx_status shape_op(lpx_op op, lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out)
{
    lpx_status st = check_count(op, "ndim", ndim, out);
    if (st) return st;
    lpx_value v[] = {lpx_v_tensor(x), lpx_v_ints(shape, (uint32_t)ndim)};
    return lpx__call_ret1(op, v, 2, out);
}

static lpx_status tensor_op(lpx_op op, lpx_tensor *x, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(x)};
    return lpx__call_ret1(op, v, 1, out);
}

lpx_status lpx_view(lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out)
{
    return shape_op(LPX_OP_view, x, ndim, shape, out);
}

lpx_status lpx_reshape(lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out)
{
    return shape_op(LPX_OP_reshape, x, ndim, shape, out);
}

lpx_status lpx_expand(lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out)
{
    return shape_op(LPX_OP_expand, x, ndim, shape, out);
}

lpx_status lpx_permute(lpx_tensor *x, int ndim, const int64_t *dims, lpx_tensor **out)
{
    return shape_op(LPX_OP_permute, x, ndim, dims, out);
}

lpx_status lpx_transpose(lpx_tensor *x, int64_t dim0, int64_t dim1, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(x), lpx_v_i64(dim0), lpx_v_i64(dim1)};
    return lpx__call_ret1(LPX_OP_transpose, v, 3, out);
}

lpx_status lpx_t(lpx_tensor *x, lpx_tensor **out) { return tensor_op(LPX_OP_t, x, out); }
lpx_status lpx_contiguous(lpx_tensor *x, lpx_tensor **out) { return tensor_op(LPX_OP_contiguous, x, out); }
lpx_status lpx_clone(lpx_tensor *x, lpx_tensor **out) { return tensor_op(LPX_OP_clone, x, out); }
lpx_status lpx_detach(lpx_tensor *x, lpx_tensor **out) { return tensor_op(LPX_OP_detach, x, out); }

lpx_status lpx_slice(lpx_tensor *x, int64_t dim, int64_t start, int64_t end, int64_t step, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(x), lpx_v_i64(dim), lpx_v_i64(start), lpx_v_i64(end), lpx_v_i64(step)};
    return lpx__call_ret1(LPX_OP_slice, v, 5, out);
}

lpx_status lpx_narrow(lpx_tensor *x, int64_t dim, int64_t start, int64_t length, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(x), lpx_v_i64(dim), lpx_v_i64(start), lpx_v_i64(length)};
    return lpx__call_ret1(LPX_OP_narrow, v, 4, out);
}

lpx_status lpx_cat(lpx_tensor *const *xs, int n, int64_t dim, lpx_tensor **out)
{
    lpx_status st = check_count(LPX_OP_cat, "n", n, out);
    if (st) return st;
    lpx_value v[] = {lpx_v_tensors(xs, (uint32_t)n), lpx_v_i64(dim)};
    return lpx__call_ret1(LPX_OP_cat, v, 2, out);
}

/* ---- split / chunk ---------------------------------------------------- */

/* Common checks of split/chunk; *d = normalised dim. */
static lpx_status pieces_args(const char *fn, const lpx_tensor *x, int64_t dim, lpx_tensor **outs, int cap,
                              int *n, int *d)
{
    if (n) *n = 0;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", fn);
    if (!n) return lpx_error(LPX_EINVAL, "%s: n is NULL", fn);
    if (cap < 0) return lpx_error(LPX_EINVAL, "%s: cap %d is negative", fn, cap);
    if (cap > 0 && !outs) return lpx_error(LPX_EINVAL, "%s: outs is NULL with cap %d", fn, cap);
    int nd = lpx_tensor_ndim(x);
    int64_t dd = dim < 0 ? dim + nd : dim;
    if (nd == 0 || dd < 0 || dd >= nd)
        return lpx_error(LPX_ERANGE, "%s: dim %lld out of range for %d dims", fn, (long long)dim, nd);
    *d = (int)dd;
    return LPX_OK;
}

/* outs[i] = x.narrow(d, i*size, min(size, len - i*size)) for i < pieces;
 * on failure releases the pieces already made. */
static lpx_status make_pieces(const char *fn, lpx_tensor *x, int d, int64_t len, int64_t size, int64_t pieces,
                              lpx_tensor **outs, int cap, int *n)
{
    if (pieces > cap)
        return lpx_error(LPX_ERANGE, "%s: %lld pieces are needed, outs holds %d", fn, (long long)pieces, cap);
    for (int64_t i = 0; i < pieces; i++) {
        int64_t start = i * size, l = len - start < size ? len - start : size;
        lpx_status st = lpx_narrow(x, d, start, l, &outs[i]);
        if (st) {
            for (int64_t j = 0; j < i; j++) {
                lpx_tensor_release(outs[j]);
                outs[j] = NULL;
            }
            return st;
        }
    }
    *n = (int)pieces;
    return LPX_OK;
}

lpx_status lpx_split(lpx_tensor *x, int64_t size, int64_t dim, lpx_tensor **outs, int cap, int *n)
{
    int d = 0;
    lpx_status st = pieces_args("lpx_split", x, dim, outs, cap, n, &d);
    if (st) return st;
    if (size < 1) return lpx_error(LPX_EINVAL, "lpx_split: size %lld must be >= 1", (long long)size);
    int64_t len = lpx_tensor_shape(x)[d];
    /* torch.split of an empty dim gives one empty piece */
    int64_t pieces = len == 0 ? 1 : len / size + (len % size != 0);
    return make_pieces("lpx_split", x, d, len, size, pieces, outs, cap, n);
}

lpx_status lpx_chunk(lpx_tensor *x, int chunks, int64_t dim, lpx_tensor **outs, int cap, int *n)
{
    int d = 0;
    lpx_status st = pieces_args("lpx_chunk", x, dim, outs, cap, n, &d);
    if (st) return st;
    if (chunks < 1) return lpx_error(LPX_EINVAL, "lpx_chunk: chunks %d must be >= 1", chunks);
    int64_t len = lpx_tensor_shape(x)[d];
    if (len == 0) /* torch.chunk keeps the chunk count for an empty dim */
        return make_pieces("lpx_chunk", x, d, 0, 0, chunks, outs, cap, n);
    int64_t size = len / chunks + (len % chunks != 0);
    int64_t pieces = len / size + (len % size != 0);
    return make_pieces("lpx_chunk", x, d, len, size, pieces, outs, cap, n);
}

/* ---- item ------------------------------------------------------------- */

lpx_status lpx_item(const lpx_tensor *x, int64_t index, double *value)
{
    if (!value) return lpx_error(LPX_EINVAL, "lpx_item: value is NULL");
    *value = 0.0;
    if (!x) return lpx_error(LPX_EINVAL, "lpx_item: x is NULL");
    if (x->kind)
        return lpx_error(LPX_EINVAL, "lpx_item: x is of kind '%s'; only dense tensors can be read element-wise",
                         lpx_kind_name(x->kind));
    if (index < 0 || index >= x->numel)
        return lpx_error(LPX_ERANGE, "lpx_item: index %lld out of range for %lld elements", (long long)index,
                         (long long)x->numel);
    int64_t off = x->offset, rem = index;
    for (int d = x->ndim - 1; d >= 0; d--) {
        off += (rem % x->shape[d]) * x->strides[d];
        rem /= x->shape[d];
    }
    const void *base = x->storage->data;
    /* a device tensor: the one element comes down through its backend's
     * copy slot (which waits for the work queued before it), then decodes
     * as on the CPU */
    unsigned char elem[16];
    if (x->device.type != LPX_DEVICE_CPU) {
        const lpx_backend_i *be = lpx_backend_for(x->device.type);
        int bits = lpx_dtype_get(x->dtype)->bits;
        if (!be || !be->copy)
            return lpx_error(LPX_EDEVICE, "lpx_item: no backend copies from device type %d", (int)x->device.type);
        if (bits % 8 || bits / 8 > (int)sizeof elem)
            return lpx_error(LPX_EDTYPE, "lpx_item: %s elements on a device are not byte-addressable; move x "
                             "to the CPU first (lpx_tensor_to)", lpx_dtype_name(x->dtype));
        size_t es = (size_t)bits / 8;
        lpx_status st = be->copy(be->self, elem, lpx_cpu(), (const unsigned char *)base + (size_t)off * es, x->device,
                                 es);
        if (st) return st;
        base = elem;
        off = 0;
    }
    /* wide integers directly: through f32 they would lose bits */
    switch (x->dtype) {
    case LPX_I64: *value = (double)((const int64_t *)base)[off]; break;
    case LPX_I32: *value = (double)((const int32_t *)base)[off]; break;
    default: *value = (double)lpx_load_f32(x->dtype, base, off); break;
    }
    return LPX_OK;
}
