/* Meta functions of the creation ops (empty, zeros, full, arange, randn,
 * rand; include/lpx/meta.h): written once for every backend. Element
 * counts and negative sizes are the tensor constructor's to refuse. */
#include <math.h>
#include "../core/lpx_internal.h"
#include "lpx/meta.h"

lpx_status lpx_meta_shape_arg(const char *op, const int64_t *dims, uint32_t ndims, int *ndim)
{
    if (ndims > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "%s: shape has %u dims, at most %d are supported", op, (unsigned)ndims,
                         LPX_MAX_DIMS);
    if (ndims && !dims) return lpx_error(LPX_EINVAL, "%s: shape is NULL", op);
    *ndim = (int)ndims;
    return LPX_OK;
}

lpx_status lpx_meta_arange(const char *op, double start, double end, double step, int64_t *n)
{
    if (!isfinite(start) || !isfinite(end) || !isfinite(step))
        return lpx_error(LPX_EINVAL, "%s: start %g, end %g and step %g must be finite", op, start, end, step);
    if (step == 0) return lpx_error(LPX_EINVAL, "%s: step must be nonzero", op);
    double q = (end - start) / step;
    if (q < 0) return lpx_error(LPX_EINVAL, "%s: step %g points away from end (start %g, end %g)", op, step, start, end);
    double count = ceil(q);
    if (!(count < 0x1p62))
        return lpx_error(LPX_ERANGE, "%s: [%g, %g) by %g has %g elements, too many", op, start, end, step, count);
    *n = (int64_t)count;
    return LPX_OK;
}

lpx_status lpx_meta_random(const char *op, lpx_dtype dtype, int *bits)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(dtype);
    if (!tr) return lpx_error(LPX_EDTYPE, "%s: dtype %d is not registered", op, (int)dtype);
    if (!tr->is_float) return lpx_error(LPX_EDTYPE, "%s: dtype %s is not a floating-point dtype", op, tr->name);
    if (bits) {
        /* rand draws mant_bits + 1 bits: every value of the dtype's grid in
         * [0, 1) is equally likely, none rounds up to 1 */
        int b = tr->mant_bits + 1;
        *bits = b > 24 ? 24 : b < 1 ? 1 : b;
    }
    return LPX_OK;
}
