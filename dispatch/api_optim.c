/* Typed API: optimizers. */
#include "api_util.h"

lpx_status lpx_adamw_(lpx_tensor *const *params, lpx_tensor *const *grads, lpx_tensor *const *exp_avg,
                      lpx_tensor *const *exp_avg_sq, int n, double lr, double beta1, double beta2, double eps,
                      double weight_decay, int64_t step)
{
    if (n < 0) return lpx_error(LPX_EINVAL, "adamw_: n = %d is negative", n);
    if (n == 0) return LPX_OK; /* nothing to dispatch on, nothing to do */
    if (!params || !grads || !exp_avg || !exp_avg_sq)
        return lpx_error(LPX_EINVAL, "adamw_: %s is NULL with n = %d",
                         !params ? "params" : !grads ? "grads" : !exp_avg ? "exp_avg" : "exp_avg_sq", n);
    uint32_t un = (uint32_t)n;
    lpx_value args[10] = {lpx_v_tensors(params, un), lpx_v_tensors(grads, un), lpx_v_tensors(exp_avg, un),
                          lpx_v_tensors(exp_avg_sq, un), lpx_v_f64(lr), lpx_v_f64(beta1), lpx_v_f64(beta2),
                          lpx_v_f64(eps), lpx_v_f64(weight_decay), lpx_v_i64(step)};
    return lpx__call_ret0(LPX_OP_adamw_, args, 10);
}
