/* Meta function of the fused AdamW step (adamw_, include/lpx/meta.h): the
 * lists, the hyperparameters and the f32 constants of the update, written
 * once so every backend refuses the same calls and steps with the same
 * constants (the CPU and CUDA kernels are bit-equal). */
#include <math.h>
#include <stdio.h>
#include "../core/lpx_internal.h"
#include "lpx/meta.h"

static lpx_status item(const char *op, const char *list, uint32_t i, const lpx_tensor *t, bool state, bool written,
                       int64_t numel)
{
    char arg[48];
    snprintf(arg, sizeof arg, "%s[%u]", list, i);
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    if (state && t->dtype != LPX_F32)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; the optimizer state is f32", op, arg,
                         lpx_dtype_name(t->dtype));
    if (!state && !lpx_dtype_get(t->dtype)->is_float)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; %s takes floating-point tensors", op, arg,
                         lpx_dtype_name(t->dtype), op);
    if (!lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_EINVAL, "%s: %s is not contiguous (the step runs over flat storage)", op, arg);
    if (written && t->storage && t->storage->readonly)
        return lpx_error(LPX_EINVAL, "%s: %s is read-only (e.g. a read-only DLPack import)", op, arg);
    if (t->numel != numel)
        return lpx_error(LPX_ESHAPE, "%s: %s has %lld elements, params[%u] has %lld", op, arg, (long long)t->numel, i,
                         (long long)numel);
    return LPX_OK;
}

lpx_status lpx_meta_adamw(const char *op, const lpx_value *args, lpx_adamw_consts *k)
{
    static const char *const names[4] = {"params", "grads", "exp_avg", "exp_avg_sq"};
    if (!args) return lpx_error(LPX_EINVAL, "%s: lpx_meta_adamw: args is NULL", op);
    uint32_t n = args[0].len;
    for (int j = 1; j < 4; j++)
        if (args[j].len != n)
            return lpx_error(LPX_EINVAL, "%s: params has %u tensors but %s has %u", op, n, names[j], args[j].len);
    double lr = args[4].u.f, beta1 = args[5].u.f, beta2 = args[6].u.f, eps = args[7].u.f, wd = args[8].u.f;
    int64_t step = args[9].u.i;
    if (!(lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0) || !(wd >= 0) || step < 1)
        return lpx_error(LPX_EINVAL, "%s: lr %g, betas (%g, %g), eps %g, weight_decay %g or step %lld out of range "
                         "(lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, step >= 1)", op, lr, beta1, beta2,
                         eps, wd, (long long)step);
    for (uint32_t i = 0; i < n; i++) {
        const lpx_tensor *p = args[0].u.ts[i];
        int64_t numel = p ? p->numel : 0;
        lpx_status st;
        if ((st = item(op, names[0], i, p, false, true, numel)) ||
            (st = item(op, names[1], i, args[1].u.ts[i], false, false, numel)) ||
            (st = item(op, names[2], i, args[2].u.ts[i], true, true, numel)) ||
            (st = item(op, names[3], i, args[3].u.ts[i], true, true, numel)))
            return st;
    }
    if (k) {
        k->b1 = (float)beta1;
        k->omb1 = (float)(1.0 - beta1);
        k->b2 = (float)beta2;
        k->omb2 = (float)(1.0 - beta2);
        k->lr = (float)lr;
        k->eps = (float)eps;
        k->decay = (float)(1.0 - lr * wd);
        k->bc1 = (float)(1.0 - pow(beta1, (double)step));
        k->bc2 = (float)(1.0 - pow(beta2, (double)step));
    }
    return LPX_OK;
}
