/* Error mapping, argument checks, geometry and registration helpers shared
 * by the kernel groups. */
#include <stdio.h>
#include <string.h>
#include "cuda_internal.h"

lpx_status cu_fail(cudaError_t e, const char *op, const char *call)
{
    lpx_status code = e == cudaErrorMemoryAllocation ? LPX_ENOMEM : LPX_EDEVICE;
    return lpx_error(code, "%s: %s failed: %s (%s)", op, call, cudaGetErrorName(e), cudaGetErrorString(e));
}

lpx_status cu_launched(const char *op, const char *kernel)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return LPX_OK;
    return lpx_error(LPX_EDEVICE, "%s: launch of kernel %s failed: %s (%s)", op, kernel, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

lpx_status cu_new(const lpx_call *c, lpx_dtype dtype, int ndim, const int64_t *shape, lpx_device dev,
                  lpx_tensor **out)
{
    lpx_status st = lpx_tensor_new(dtype, ndim, shape, dev, out);
    if (st) {
        char msg[512]; /* lpx_error formats into the buffer lpx_last_error returns */
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        return lpx_error(st, "%s: %s", cu_op(c), msg);
    }
    return LPX_OK;
}

lpx_status cu_reg(const lpx_host *h, lpx_op op, lpx_kernel_fn fn)
{
    return h->kernel_register(h, op, cu_key, fn, NULL);
}

void cu_geom_of(cu_geom *g, const lpx_tensor *t)
{
    cu_geom_broadcast(g, t, lpx_tensor_ndim(t), lpx_tensor_shape(t));
}

void cu_geom_broadcast(cu_geom *g, const lpx_tensor *t, int ndim, const int64_t *shape)
{
    int tn = lpx_tensor_ndim(t);
    const int64_t *ts = lpx_tensor_shape(t), *tst = lpx_tensor_strides(t);
    memset(g, 0, sizeof *g);
    g->ndim = ndim;
    g->numel = 1;
    for (int i = 0; i < ndim; i++) {
        int j = i - (ndim - tn); /* right-aligned dim of t, or < 0 */
        g->shape[i] = shape[i];
        g->strides[i] = (j >= 0 && ts[j] != 1) ? tst[j] : 0;
        g->numel *= shape[i];
    }
}

bool cu_geom_contiguous(const cu_geom *g)
{
    int64_t expect = 1;
    for (int i = g->ndim - 1; i >= 0; i--) {
        if (g->shape[i] != 1 && g->strides[i] != expect) return false;
        expect *= g->shape[i];
    }
    return true;
}
