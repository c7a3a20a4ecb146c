/* Typed API: reductions (sum, mean, max, amax, norm). */
#include "api_util.h"

static lpx_status reduce(lpx_op op, const char *name, lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim,
                         lpx_tensor **out)
{
    if (ndims < 0) {
        if (out) *out = NULL;
        return lpx_error(LPX_EINVAL, "%s: ndims %d is negative", name, ndims);
    }
    lpx_value args[3] = {lpx_v_tensor(x), ndims ? lpx_v_ints(dims, (uint32_t)ndims) : lpx_v_none(),
                         lpx_v_bool(keepdim)};
    return lpx__call_ret1(op, args, 3, out);
}

lpx_status lpx_sum(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out)
{
    return reduce(LPX_OP_sum, "sum", x, ndims, dims, keepdim, out);
}

lpx_status lpx_mean(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out)
{
    return reduce(LPX_OP_mean, "mean", x, ndims, dims, keepdim, out);
}

lpx_status lpx_max(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out)
{
    return reduce(LPX_OP_max, "max", x, ndims, dims, keepdim, out);
}

lpx_status lpx_amax(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out)
{
    return reduce(LPX_OP_amax, "amax", x, ndims, dims, keepdim, out);
}

lpx_status lpx_norm(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out)
{
    return reduce(LPX_OP_norm, "norm", x, ndims, dims, keepdim, out);
}
