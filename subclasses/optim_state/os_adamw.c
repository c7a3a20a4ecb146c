/* AdamW over optimizer-state tensors: the adamw_ handler of the state
 * kinds and lpx_optim_adamw_ (include/lpx/optim_state.h). Both check the
 * states (one kind, roles m and v, one block, the parameters' numel) and
 * run the dense op adamw_state_ on their inner tensors; the dispatcher
 * checks the rest (the op's spec family) and the backend kernel computes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "os_internal.h"

lpx_optim_adamw_opts lpx_optim_adamw_opts_default(void)
{
    lpx_optim_adamw_opts o;
    memset(&o, 0, sizeof o);
    o.lr = 1e-3;
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.eps = 1e-8;
    o.weight_decay = 1e-2;
    o.master = LPX_OPTIM_MASTER_PLAIN;
    return o;
}

/* the parts of state `t` (list `list`, entry i) of role `role` */
static lpx_status state_of(const char *op, const char *list, int i, const lpx_tensor *t, int role, os_parts *p)
{
    char arg[48];
    snprintf(arg, sizeof arg, "%s[%d]", list, i);
    lpx_status st = os_parts_of(op, arg, t, p);
    if (st) return st;
    if (p->m.role != role)
        return lpx_error(LPX_EINVAL, "%s: %s (kind %s) holds the %s moment; %s takes the %s one", op, arg,
                         lpx__os_kind_names[p->m.format], p->m.role ? "v" : "m", list, role ? "v" : "m");
    return LPX_OK;
}

static lpx_status os_adamw(const char *op, lpx_tensor *const *params, lpx_tensor *const *grads,
                           lpx_tensor *const *exp_avg, lpx_tensor *const *exp_avg_sq, lpx_tensor *const *master_scale,
                           int n, const lpx_optim_adamw_opts *o, int64_t step)
{
    if (n <= 0) return LPX_OK;
    lpx_tensor **in = lpx_calloc((size_t)n * 4, sizeof *in);
    if (!in) return lpx_error(LPX_ENOMEM, "%s: cannot allocate the lists of %d states", op, n);
    lpx_tensor **mc = in, **msc = in + n, **vc = in + 2 * (size_t)n, **vsc = in + 3 * (size_t)n;
    lpx_status st = LPX_OK;
    os_parts first = {0};
    for (int i = 0; i < n && !st; i++) {
        os_parts pm, pv;
        if ((st = state_of(op, "exp_avg", i, exp_avg[i], LPX_OPTIM_STATE_M, &pm)) ||
            (st = state_of(op, "exp_avg_sq", i, exp_avg_sq[i], LPX_OPTIM_STATE_V, &pv)))
            break;
        if (i == 0) first = pm;
        const os_parts *bad = pm.m.format != first.m.format ? &pm : pv.m.format != first.m.format ? &pv : NULL;
        if (bad) {
            st = lpx_error(LPX_EINVAL, "%s: %s[%d] is of kind %s, exp_avg[0] of kind %s: one state kind per call", op,
                           bad == &pm ? "exp_avg" : "exp_avg_sq", i, lpx__os_kind_names[bad->m.format],
                           lpx__os_kind_names[first.m.format]);
            break;
        }
        bad = pm.m.block != first.m.block ? &pm : pv.m.block != first.m.block ? &pv : NULL;
        if (bad) {
            st = lpx_error(LPX_EINVAL, "%s: %s[%d] (kind %s) has block %lld, exp_avg[0] %lld: one block per call", op,
                           bad == &pm ? "exp_avg" : "exp_avg_sq", i, lpx__os_kind_names[bad->m.format],
                           (long long)bad->m.block, (long long)first.m.block);
            break;
        }
        int64_t pn = params[i] ? lpx_tensor_numel(params[i]) : -1;
        bad = pm.numel != pn ? &pm : pv.numel != pn ? &pv : NULL;
        if (bad) {
            st = lpx_error(LPX_ESHAPE, "%s: %s[%d] (kind %s) has %lld elements, params[%d] has %lld", op,
                           bad == &pm ? "exp_avg" : "exp_avg_sq", i, lpx__os_kind_names[bad->m.format],
                           (long long)bad->numel, i, (long long)pn);
            break;
        }
        mc[i] = pm.codes, msc[i] = pm.scales, vc[i] = pv.codes, vsc[i] = pv.scales;
    }
    if (!st)
        st = lpx_adamw_state_(params, grads, mc, msc, vc, vsc, n, (lpx_optim_state_format)first.m.format,
                              first.m.block, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, step, o->master,
                              o->seed, o->rank, o->index0, master_scale);
    lpx_free(in);
    return st;
}

/* adamw_ with state moments (the kind key of exp_avg / exp_avg_sq) */
static lpx_status h_adamw(lpx_call *c)
{
    static const char *const names[4] = {"params", "grads", "exp_avg", "exp_avg_sq"};
    const lpx_value *a = c->args;
    const char *op = lpx_op_name(c->op);
    uint32_t n = a[0].len;
    for (int j = 1; j < 4; j++)
        if (a[j].len != n)
            return lpx_error(LPX_EINVAL, "%s: params has %u tensors but %s has %u", op, n, names[j], a[j].len);
    if (n > INT32_MAX) return lpx_error(LPX_EINVAL, "%s: %u tensors are more than one call takes", op, n);
    lpx_optim_adamw_opts o = lpx_optim_adamw_opts_default();
    o.lr = a[4].u.f, o.beta1 = a[5].u.f, o.beta2 = a[6].u.f, o.eps = a[7].u.f, o.weight_decay = a[8].u.f;
    return os_adamw(op, a[0].u.ts, a[1].u.ts, a[2].u.ts, a[3].u.ts, NULL, (int)n, &o, a[9].u.i);
}

lpx_status os_register_adamw(int key) { return lpx_kernel_register(LPX_OP_adamw_, key, h_adamw, NULL); }

lpx_status lpx_optim_adamw_(lpx_tensor *const *params, lpx_tensor *const *grads, lpx_tensor *const *exp_avg,
                            lpx_tensor *const *exp_avg_sq, lpx_tensor *const *master_scale, int n,
                            const lpx_optim_adamw_opts *opts, int64_t step)
{
    static const char op[] = "lpx_optim_adamw_";
    if (n < 0) return lpx_error(LPX_EINVAL, "%s: n = %d is negative", op, n);
    if (n == 0) return LPX_OK;
    if (!params || !grads || !exp_avg || !exp_avg_sq || !opts)
        return lpx_error(LPX_EINVAL, "%s: %s is NULL with n = %d", op,
                         !params ? "params" : !grads ? "grads" : !exp_avg ? "exp_avg" : !exp_avg_sq ? "exp_avg_sq" : "opts",
                         n);
    for (int i = 0; i < n; i++)
        if (!params[i] || !grads[i])
            return lpx_error(LPX_EINVAL, "%s: %s[%d] is NULL", op, !params[i] ? "params" : "grads", i);
    return os_adamw(op, params, grads, exp_avg, exp_avg_sq, master_scale, n, opts, step);
}
