/* Moving dense tensors between devices through the backends' copy slots:
 * above dispatch, since a strided source is first made contiguous by the
 * dispatched lpx_contiguous. */
#include <stdio.h>
#include "../core/lpx_internal.h"

/* The backend that can reach both sides: the non-CPU one (a device backend
 * copies to and from host memory); NULL if the two sides are two different
 * non-CPU device types. */
static const lpx_backend_i *copy_backend(lpx_device a, lpx_device b)
{
    if (a.type != LPX_DEVICE_CPU && b.type != LPX_DEVICE_CPU && a.type != b.type) return NULL;
    return lpx_backend_for(a.type != LPX_DEVICE_CPU ? a.type : b.type);
}

lpx_status lpx_tensor_to(lpx_tensor *x, lpx_device device, lpx_tensor **out)
{
    const char *op = "lpx_tensor_to";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    if (x->kind)
        return lpx_error(LPX_EINVAL, "%s: x is of kind '%s'; move its inner tensors (lpx_tensor_inner) instead", op,
                         lpx_kind_name(x->kind));
    if (!lpx_backend_for(device.type))
        return lpx_error(LPX_EDEVICE, "%s: no backend for device type %d (is the plugin loaded?)", op, (int)device.type);
    if (x->device.type == device.type && x->device.index == device.index) {
        lpx_tensor_retain(x);
        *out = x;
        return LPX_OK;
    }
    const lpx_backend_i *be = copy_backend(x->device, device);
    if (!be || !be->copy)
        return lpx_error(LPX_EDEVICE, "%s: no backend copies from device type %d to %d", op, (int)x->device.type,
                         (int)device.type);
    lpx_tensor *src = x, *y = NULL;
    lpx_status st = LPX_OK;
    if (!lpx_tensor_is_contiguous(x) && (st = lpx_contiguous(x, &src))) return st;
    if (!(st = lpx_tensor_new(x->dtype, x->ndim, x->shape, device, &y))) {
        size_t nbytes = lpx_dtype_nbytes(x->dtype, x->numel);
        if (nbytes && (st = be->copy(be->self, lpx_tensor_data(y), device, lpx_tensor_data(src), src->device, nbytes))) {
            lpx_tensor_release(y);
            y = NULL;
        }
    } else {
        /* name this entry point, not only lpx_tensor_new (e.g. a device
         * out of memory) */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        st = lpx_error(st, "%s: %s", op, msg);
    }
    if (src != x) lpx_tensor_release(src);
    *out = y;
    return st;
}
