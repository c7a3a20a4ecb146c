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

const oom_case oom_cases_optim[] = {
    {"lpx_optim_state_new", "4-bit v, block 64", c_os_new, 0},
    {"lpx_optim_state_quantize", "fp8 v from bf16", c_os_quantize, 0},
    {NULL, NULL, NULL, 0},
};
