/* Meta functions of the shape rules every elementwise and reducing op
 * shares (include/lpx/meta.h): numpy broadcasting and the contract of a
 * caller's `out` tensor. Written once; the CPU and CUDA kernels call them
 * and add only their own checks (device, dtypes they have code for). */
#include <stdio.h>
#include <string.h>
#include "../core/lpx_internal.h"
#include "lpx/meta.h"

lpx_status lpx_meta_broadcast(const char *op, const lpx_tensor *a, const lpx_tensor *b, int *ndim, int64_t *shape)
{
    if (!a || !b || !ndim || !shape) return lpx_error(LPX_EINVAL, "%s: lpx_meta_broadcast: NULL argument", op);
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = a->ndim - n + i, ib = b->ndim - n + i;
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            return lpx_error(LPX_ESHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                             lpx_tensor_shape_str(a, sa, sizeof sa), lpx_tensor_shape_str(b, sb, sizeof sb), i,
                             (long long)da, (long long)db);
        }
        shape[i] = da == 1 ? db : da;
    }
    *ndim = n;
    /* two shapes that fit can broadcast to one that does not */
    int64_t numel;
    return lpx_shape_numel(op, n, shape, &numel);
}

lpx_status lpx_meta_out(const char *op, const lpx_tensor *out, lpx_dtype dtype, int ndim, const int64_t *shape)
{
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    if (out->kind)
        return lpx_error(LPX_EINVAL, "%s: out is of kind '%s'; results are written to dense tensors", op,
                         out->kind->vt.name);
    if (out->storage->readonly)
        return lpx_error(LPX_EINVAL, "%s: out is read-only (e.g. a read-only DLPack import)", op);
    bool same = out->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = out->shape[i] == shape[i];
    if (!same) {
        char so[128], want[160];
        size_t n = (size_t)snprintf(want, sizeof want, "[");
        for (int i = 0; i < ndim && n < sizeof want; i++)
            n += (size_t)snprintf(want + n, sizeof want - n, i ? ", %lld" : "%lld", (long long)shape[i]);
        if (n < sizeof want) snprintf(want + n, sizeof want - n, "]");
        return lpx_error(LPX_ESHAPE, "%s: out has shape %s, the result needs %s", op,
                         lpx_tensor_shape_str(out, so, sizeof so), want);
    }
    if (out->dtype != dtype)
        return lpx_error(LPX_EDTYPE, "%s: out has dtype %s, the result is %s", op, lpx_dtype_name(out->dtype),
                         lpx_dtype_name(dtype));
    return LPX_OK;
}

lpx_status lpx_meta_dim(const char *op, int64_t dim, int ndim, int *out)
{
    int64_t d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= (ndim ? ndim : 1))
        return lpx_error(LPX_ERANGE, "%s: dim %lld out of range for %d dims", op, (long long)dim, ndim);
    *out = (int)d;
    return LPX_OK;
}

lpx_status lpx_meta_reduce(const char *op, const lpx_tensor *x, const int64_t *dims, int ndims, bool keepdim,
                           bool has_identity, lpx_reduce_geom *g)
{
    if (!x || !g || (ndims > 0 && !dims)) return lpx_error(LPX_EINVAL, "%s: lpx_meta_reduce: NULL argument", op);
    int nd = x->ndim;
    memset(g->reduced, 0, sizeof g->reduced);
    if (ndims > 0) {
        for (int j = 0; j < ndims; j++) {
            int d;
            /* a scalar accepts dim 0 and -1, as in PyTorch */
            lpx_status st = lpx_meta_dim(op, dims[j], nd ? nd : 1, &d);
            if (st) return st;
            if (g->reduced[d])
                return lpx_error(LPX_EINVAL, "%s: dims lists dim %d twice (dims[%u] = %lld)", op, d, (unsigned)j,
                                 (long long)dims[j]);
            g->reduced[d] = true;
        }
    } else {
        for (int d = 0; d < nd; d++) g->reduced[d] = true;
    }
    g->out_ndim = 0;
    g->count = 1;
    g->out_numel = 1;
    for (int d = 0; d < nd; d++) {
        if (g->reduced[d]) {
            g->count *= x->shape[d];
            if (keepdim) g->out_shape[g->out_ndim++] = 1;
        } else {
            g->out_shape[g->out_ndim++] = x->shape[d];
            g->out_numel *= x->shape[d];
        }
    }
    if (!has_identity && g->count == 0 && g->out_numel > 0) {
        char sx[128];
        return lpx_error(LPX_ESHAPE, "%s: x %s: cannot reduce over zero elements (no identity)", op,
                         lpx_tensor_shape_str(x, sx, sizeof sx));
    }
    return LPX_OK;
}

/* ---- copies (cast, copy_, fill_) ---------------------------------------- */

lpx_status lpx_meta_cast(const char *op, const lpx_tensor *x, lpx_dtype dtype)
{
    if (!lpx_dtype_get(dtype)) return lpx_error(LPX_EDTYPE, "%s: target dtype %d is not registered", op, (int)dtype);
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    return LPX_OK;
}

lpx_status lpx_meta_copy(const char *op, const lpx_tensor *dst, const lpx_tensor *src)
{
    if (!dst || !src) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, dst ? "src" : "dst");
    const lpx_tensor *ts[2] = {dst, src};
    const char *names[2] = {"dst", "src"};
    for (int i = 0; i < 2; i++)
        if (ts[i]->kind)
            return lpx_error(LPX_EINVAL, "%s: tensor '%s' is of kind '%s'; copy_ takes dense tensors", op, names[i],
                             ts[i]->kind->vt.name);
    if (dst->storage->readonly)
        return lpx_error(LPX_EINVAL, "%s: dst is read-only (e.g. a read-only DLPack import)", op);
    bool fits = src->ndim <= dst->ndim;
    for (int i = 0; fits && i < src->ndim; i++) {
        int64_t s = src->shape[i], d = dst->shape[dst->ndim - src->ndim + i];
        fits = s == d || s == 1;
    }
    if (!fits) {
        char s1[160], s2[160];
        return lpx_error(LPX_ESHAPE, "%s: src of shape %s does not broadcast to dst of shape %s", op,
                         lpx_tensor_shape_str(src, s1, sizeof s1), lpx_tensor_shape_str(dst, s2, sizeof s2));
    }
    return LPX_OK;
}

lpx_status lpx_meta_fill(const char *op, const lpx_tensor *dst)
{
    if (!dst) return lpx_error(LPX_EINVAL, "%s: dst is NULL", op);
    if (dst->kind)
        return lpx_error(LPX_EINVAL, "%s: dst is of kind '%s'; fill_ takes dense tensors", op, dst->kind->vt.name);
    if (dst->storage->readonly)
        return lpx_error(LPX_EINVAL, "%s: dst is read-only (e.g. a read-only DLPack import)", op);
    const lpx_dtype_traits *tr = lpx_dtype_get(dst->dtype);
    if (tr->block > 1)
        return lpx_error(LPX_EDTYPE, "%s: dst has dtype %s, encoded in groups of %d; fill_ writes single elements", op,
                         tr->name, tr->block);
    return LPX_OK;
}
