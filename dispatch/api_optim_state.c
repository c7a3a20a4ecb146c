/* Typed API of the optimizer-state op adamw_state_ (include/lpx/
 * optim_state.h): builds the call and dispatches it; the checks are the
 * op's spec family (dispatch/spec_optim.c). */
#include "api_util.h"
#include "lpx/optim_state.h"

lpx_status lpx_adamw_state_(lpx_tensor *const *params, lpx_tensor *const *grads, lpx_tensor *const *m,
                            lpx_tensor *const *m_scale, lpx_tensor *const *v, lpx_tensor *const *v_scale, int n,
                            lpx_optim_state_format format, int64_t block, double lr, double beta1, double beta2,
                            double eps, double weight_decay, int64_t step, lpx_optim_master master, uint64_t seed,
                            uint32_t rank, int64_t index0, lpx_tensor *const *master_scale)
{
    if (n < 0) return lpx_error(LPX_EINVAL, "adamw_state_: n = %d is negative", n);
    if (n == 0) return LPX_OK; /* nothing to dispatch on, nothing to do */
    if (!params || !grads || !m || !m_scale || !v || !v_scale)
        return lpx_error(LPX_EINVAL, "adamw_state_: %s is NULL with n = %d",
                         !params ? "params" : !grads ? "grads" : !m ? "m" : !m_scale ? "m_scale" : !v ? "v" : "v_scale",
                         n);
    bool f16s = master == LPX_OPTIM_MASTER_F16S || master == LPX_OPTIM_MASTER_F16S_SR;
    if (f16s && !master_scale)
        return lpx_error(LPX_EINVAL, "adamw_state_: master_scale is NULL with master mode %d", (int)master);
    uint32_t un = (uint32_t)n;
    int64_t ms[4] = {(int64_t)master, (int64_t)seed, (int64_t)rank, index0};
    lpx_value args[16] = {lpx_v_tensors(params, un), lpx_v_tensors(grads, un), lpx_v_tensors(m, un),
                          lpx_v_tensors(m_scale, un), lpx_v_tensors(v, un), lpx_v_tensors(v_scale, un),
                          lpx_v_i64((int64_t)format), lpx_v_i64(block), lpx_v_f64(lr), lpx_v_f64(beta1),
                          lpx_v_f64(beta2), lpx_v_f64(eps), lpx_v_f64(weight_decay), lpx_v_i64(step),
                          lpx_v_ints(ms, 4), lpx_v_tensors(f16s ? master_scale : NULL, f16s ? un : 0)};
    return lpx__call_ret0(LPX_OP_adamw_state_, args, 16);
}
