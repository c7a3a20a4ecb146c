/* The spec families of include/lpx/op_args_optim.h: their meta functions
 * (the conventions are spec.c's). */
#include <stdio.h>
#include "spec_internal.h"

/* A tensor of list argument i (entry j) that reached a backend: dense, of a
 * byte-sized dtype; the message names the entry as "name[j]"
 * (lpx__spec_dense_slow's wording). */
static lpx_status list_dense(const lpx_call *c, int i, uint32_t j, const lpx_tensor *t)
{
    if (LPX_LIKELY(!t->kind && (unsigned)t->dtype < LPX_DTYPE_BUILTIN_COUNT)) return LPX_OK;
    const char *op = op_name(c);
    char arg[64];
    snprintf(arg, sizeof arg, "%s[%u]", arg_name(c, i), j);
    if (t->kind)
        return lpx_error(LPX_EINVAL, "%s: tensor '%s' is of kind '%s'; the %s kernel takes dense tensors", op, arg,
                         lpx_kind_name(t->kind), lpx_key_name(c->key));
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    if (!tr || tr->bits < 8 || tr->bits % 8)
        return lpx_error(LPX_EDTYPE, "%s: tensor '%s' has dtype %s, which the %s kernels do not support", op, arg,
                         lpx_dtype_name(t->dtype), lpx_key_name(c->key));
    return LPX_OK;
}

/* ---- adamw: adamw_ ------------------------------------------------------ */

lpx_status lpx__spec_adamw(const lpx_call *c, void *p)
{
    lpx_adamw_args *a = p;
    const lpx_value *v = c->args;
    /* the contract (lists, hyperparameters, dtypes, contiguity, numel),
     * then what every family checks: each tensor dense (the order the CPU
     * kernel checked them in before the spec) */
    lpx_status st = lpx_meta_adamw(op_name(c), v, &a->k);
    if (st) return st;
    uint32_t n = v[0].len;
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < 4; j++)
            if ((st = list_dense(c, j, i, v[j].u.ts[i]))) return st;
    a->params = v[0].u.ts;
    a->grads = v[1].u.ts;
    a->exp_avg = v[2].u.ts;
    a->exp_avg_sq = v[3].u.ts;
    a->n = n;
    return LPX_OK;
}
