/* The typed API functions that are not generated from include/lpx/ops.def
 * (scripts/gen-ops.py writes the others into the build directory; its HAND
 * table lists these and why, docs/ARCHITECTURE.md "The op spec"): two ops
 * whose C API is not the schema's rule (rmsnorm_backward, adamw_) and three
 * functions that are not ops (lpx_split, lpx_chunk, lpx_item). The build
 * checks their prototypes in ops.h against the schemas all the same. */
#include <stdio.h>
#include "api_util.h"
#include "../core/dtype_internal.h"

/* ---- ops whose typed API is not the rule's ---------------------------- */

lpx_status lpx_rmsnorm_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor *weight, lpx_tensor *rstd,
                                lpx_tensor **grad_x, lpx_tensor **grad_w)
{
    if (grad_w) *grad_w = NULL;
    if (!grad_x) return lpx_error(LPX_EINVAL, "rmsnorm_backward: grad_x is NULL");
    lpx_value args[4] = {lpx_v_tensor(grad), lpx_v_tensor(x), lpx_v_opt_tensor(weight), lpx_v_tensor(rstd)};
    /* the op always computes grad_w; this API hands it out only when there
     * is a weight to apply it to (see ops.h) */
    return lpx__call_ret2(LPX_OP_rmsnorm_backward, args, 4, grad_x, weight ? grad_w : NULL);
}

/* adamw_: the four lists share one count n, n == 0 returns before any
 * dispatch (nothing to dispatch on), and a NULL list is refused by name. */
lpx_status lpx_adamw_(lpx_tensor *const *params, lpx_tensor *const *grads, lpx_tensor *const *exp_avg,
                      lpx_tensor *const *exp_avg_sq, int n, double lr, double beta1, double beta2, double eps,
                      double weight_decay, int64_t step)
{
    if (n < 0) return lpx_error(LPX_EINVAL, "adamw_: n = %d is negative", n);
    if (n == 0) return LPX_OK; /* nothing to dispatch on, nothing to do */
    if (!params || !grads || !exp_avg || !exp_avg_sq)
        return lpx_error(LPX_EINVAL, "adamw_: %s is NULL with n = %d",
                         !params ? "params" : !grads ? "grads" : !exp_avg ? "exp_avg" : "exp_avg_sq", n);
    uint32_t un = (uint32_t)n;
    lpx_value args[10] = {lpx_v_tensors(params, un), lpx_v_tensors(grads, un), lpx_v_tensors(exp_avg, un),
                          lpx_v_tensors(exp_avg_sq, un), lpx_v_f64(lr), lpx_v_f64(beta1), lpx_v_f64(beta2),
                          lpx_v_f64(eps), lpx_v_f64(weight_decay), lpx_v_i64(step)};
    return lpx__call_ret0(LPX_OP_adamw_, args, 10);
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
