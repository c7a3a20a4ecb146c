/* OOM cases of the optimizer-state kinds and their fused AdamW
 * (include/lpx/optim_state.h). */
#include "oom.h"

static lpx_status c_os_new(int attempt)
{
    (void)attempt;
    const int64_t shape[2] = {37, 29};
    lpx_tensor *s = NULL;
    lpx_status st = OOM(lpx_optim_state_new(LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_V, 2, shape, 64, lpx_cpu(), &s));
    OOM_OUT_NULL(st, s);
    lpx_tensor_release(s);
    return st;
}

static lpx_status c_os_quantize(int attempt)
{
    (void)attempt;
    lpx_tensor *x = oom_randn2(37, 29, 5, LPX_BF16), *s = NULL;
    lpx_status st = OOM(lpx_optim_state_quantize(x, LPX_OPTIM_STATE_FP8, LPX_OPTIM_STATE_V, 0, &s));
    OOM_OUT_NULL(st, s);
    lpx_tensor_release(s);
    lpx_tensor_release(x);
    return st;
}

/* lpx_optim_adamw_ over 8-bit states: a failure leaves the parameter
 * as it was (the lists are allocated before anything is written) */
static lpx_status c_optim_adamw(int attempt)
{
    (void)attempt;
    const int64_t shape[2] = {37, 29};
    lpx_tensor *p = oom_randn2(37, 29, 7, LPX_F32), *g = oom_randn2(37, 29, 8, LPX_F32), *m = NULL, *v = NULL;
    OOM_SETUP(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_M, 2, shape, 0, lpx_cpu(), &m));
    OOM_SETUP(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_V, 2, shape, 0, lpx_cpu(), &v));
    float p0 = ((const float *)lpx_tensor_data(p))[5];
    lpx_optim_adamw_opts o = lpx_optim_adamw_opts_default();
    lpx_status st = OOM(lpx_optim_adamw_(&p, &g, &m, &v, NULL, 1, &o, 1));
    float p1 = ((const float *)lpx_tensor_data(p))[5];
    OOM_CHECKF(st ? p1 == p0 : p1 != p0, "status %d, p[5] %g -> %g", (int)st, (double)p0, (double)p1);
    lpx_tensor_release(p);
    lpx_tensor_release(g);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    return st;
}

/* the dense op on the inner tensors */
static lpx_status c_adamw_state(int attempt)
{
    (void)attempt;
    const int64_t shape[1] = {300};
    lpx_tensor *p = oom_randn2(3, 100, 9, LPX_BF16), *g = oom_randn2(3, 100, 10, LPX_F32), *m = NULL, *v = NULL;
    OOM_SETUP(lpx_optim_state_new(LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_M, 1, shape, 64, lpx_cpu(), &m));
    OOM_SETUP(lpx_optim_state_new(LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_V, 1, shape, 64, lpx_cpu(), &v));
    lpx_tensor *mc = lpx_tensor_inner(m, 0), *ms = lpx_tensor_inner(m, 1), *vc = lpx_tensor_inner(v, 0),
               *vs = lpx_tensor_inner(v, 1);
    lpx_status st = OOM(lpx_adamw_state_(&p, &g, &mc, &ms, &vc, &vs, 1, LPX_OPTIM_STATE_4BIT, 64, 1e-3, 0.9, 0.999,
                                         1e-8, 0.0, 3, LPX_OPTIM_MASTER_BF16_SR, 11, 0, 0, NULL));
    lpx_tensor_release(p);
    lpx_tensor_release(g);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    return st;
}

const oom_case oom_cases_optim[] = {
    {"lpx_optim_adamw_", "8-bit states", c_optim_adamw, 0},
    {"lpx_adamw_state_", "4-bit, bf16-SR master", c_adamw_state, 0},
    {"lpx_optim_state_new", "4-bit v, block 64", c_os_new, 0},
    {"lpx_optim_state_quantize", "fp8 v from bf16", c_os_quantize, 0},
    {NULL, NULL, NULL, 0},
};
