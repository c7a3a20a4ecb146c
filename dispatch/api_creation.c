/* Typed API: creation ops (empty, zeros, full, arange, randn, rand). Each
 * builds its argument array on the stack and dispatches on the device. */
#include "api_util.h"

/* A negative ndim cannot travel in the uint32 length of an int[] value. */
static lpx_status check_ndim(lpx_op op, int ndim, lpx_tensor **out)
{
    if (out) *out = NULL;
    if (ndim < 0) return lpx_error(LPX_EINVAL, "%s: ndim %d is negative", lpx_op_name(op), ndim);
    return LPX_OK;
}

lpx_status lpx_empty(int ndim, const int64_t *shape, lpx_dtype dtype, lpx_device dev, lpx_tensor **out)
{
    lpx_status st = check_ndim(LPX_OP_empty, ndim, out);
    if (st) return st;
    lpx_value a[] = {lpx_v_ints(shape, (uint32_t)ndim), lpx_v_dtype(dtype), lpx_v_device(dev)};
    return lpx__call_ret1(LPX_OP_empty, a, 3, out);
}

lpx_status lpx_zeros(int ndim, const int64_t *shape, lpx_dtype dtype, lpx_device dev, lpx_tensor **out)
{
    lpx_status st = check_ndim(LPX_OP_zeros, ndim, out);
    if (st) return st;
    lpx_value a[] = {lpx_v_ints(shape, (uint32_t)ndim), lpx_v_dtype(dtype), lpx_v_device(dev)};
    return lpx__call_ret1(LPX_OP_zeros, a, 3, out);
}

lpx_status lpx_full(int ndim, const int64_t *shape, double value, lpx_dtype dtype, lpx_device dev, lpx_tensor **out)
{
    lpx_status st = check_ndim(LPX_OP_full, ndim, out);
    if (st) return st;
    lpx_value a[] = {lpx_v_ints(shape, (uint32_t)ndim), lpx_v_f64(value), lpx_v_dtype(dtype), lpx_v_device(dev)};
    return lpx__call_ret1(LPX_OP_full, a, 4, out);
}

lpx_status lpx_arange(double start, double end, double step, lpx_dtype dtype, lpx_device dev, lpx_tensor **out)
{
    lpx_value a[] = {lpx_v_f64(start), lpx_v_f64(end), lpx_v_f64(step), lpx_v_dtype(dtype), lpx_v_device(dev)};
    return lpx__call_ret1(LPX_OP_arange, a, 5, out);
}

lpx_status lpx_randn(int ndim, const int64_t *shape, uint64_t seed, lpx_dtype dtype, lpx_device dev, lpx_tensor **out)
{
    lpx_status st = check_ndim(LPX_OP_randn, ndim, out);
    if (st) return st;
    lpx_value a[] = {lpx_v_ints(shape, (uint32_t)ndim), lpx_v_i64((int64_t)seed), lpx_v_dtype(dtype),
                     lpx_v_device(dev)};
    return lpx__call_ret1(LPX_OP_randn, a, 4, out);
}

lpx_status lpx_rand(int ndim, const int64_t *shape, uint64_t seed, lpx_dtype dtype, lpx_device dev, lpx_tensor **out)
{
    lpx_status st = check_ndim(LPX_OP_rand, ndim, out);
    if (st) return st;
    lpx_value a[] = {lpx_v_ints(shape, (uint32_t)ndim), lpx_v_i64((int64_t)seed), lpx_v_dtype(dtype),
                     lpx_v_device(dev)};
    return lpx__call_ret1(LPX_OP_rand, a, 4, out);
}
