/* The handlers of the optimizer-state kinds: narrow along dim 0 in whole
 * blocks (how a state is cut into shards), and adamw_ over state moments
 * (the fused op adamw_state_ on their inner tensors). Every other op on a
 * state tensor fails with LPX_ENOTIMPL naming the op and the kind. */
#include <stdio.h>
#include <string.h>
#include "os_internal.h"

static lpx_status ret(lpx_call *c, lpx_tensor *t)
{
    c->rets[c->nrets++] = lpx_v_tensor(t);
    return LPX_OK;
}

/* narrow(x, dim, start, length): dim 0 only, the rows [start, start +
 * length) a run of whole blocks (or ending at the tensor's end): a state
 * tensor over views of x's codes and scales. */
static lpx_status h_narrow(lpx_call *c)
{
    const char *op = lpx_op_name(c->op);
    lpx_tensor *x = c->args[0].u.t;
    os_parts p;
    lpx_status st = os_parts_of(op, "x", x, &p);
    if (st) return st;
    const char *kn = lpx__os_kind_names[p.m.format];
    int ndim = lpx_tensor_ndim(x);
    int64_t dim = c->args[1].u.i, start = c->args[2].u.i, len = c->args[3].u.i;
    if (ndim == 0 || (dim != 0 && dim != -ndim))
        return lpx_error(LPX_EINVAL, "%s: kind %s: dim %lld; an optimizer state narrows along dim 0 only", op, kn,
                         (long long)dim);
    int64_t rows = lpx_tensor_shape(x)[0];
    if (start < 0) start += rows;
    if (start < 0 || len < 0 || start > rows || len > rows - start)
        return lpx_error(LPX_ERANGE, "%s: kind %s: [%lld, %lld + %lld) outside dim 0 of size %lld", op, kn,
                         (long long)c->args[2].u.i, (long long)c->args[2].u.i, (long long)len, (long long)rows);
    int64_t row = rows ? p.numel / rows : 0, e0 = start * row, n = len * row, block = p.m.block;
    if (e0 % block || (n % block && start + len != rows))
        return lpx_error(LPX_EINVAL, "%s: kind %s: rows [%lld, %lld) split a block of %lld elements (rows of %lld; "
                         "a slice holds whole blocks)", op, kn, (long long)start, (long long)(start + len),
                         (long long)block, (long long)row);
    int64_t c0 = os_codes_len(p.m.format, e0, block), cn = os_codes_len(p.m.format, n, block);
    int64_t b0 = e0 / block, bn = os_nblocks(n, block);
    lpx_tensor *codes = NULL, *scales = NULL, *y = NULL;
    int64_t shape[LPX_MAX_DIMS];
    memcpy(shape, lpx_tensor_shape(x), (size_t)ndim * sizeof *shape);
    shape[0] = len;
    if (!(st = lpx_narrow(p.codes, 0, c0, cn, &codes)) && !(st = lpx_narrow(p.scales, 0, b0, bn, &scales)))
        st = os_make(p.m.format, p.m.role, block, ndim, shape, codes, scales, &y);
    lpx_tensor_release(codes);
    lpx_tensor_release(scales);
    return st ? st : ret(c, y);
}

lpx_status os_register_handlers(int key)
{
    lpx_status st = lpx_kernel_register(LPX_OP_narrow, key, h_narrow, NULL);
    return st ? st : os_register_adamw(key);
}
