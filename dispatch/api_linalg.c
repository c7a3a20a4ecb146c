/* Typed API: matmul, linear, addmm. */
#include "api_util.h"

lpx_status lpx_matmul(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out)
{
    lpx_value args[3] = {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_none()};
    return lpx__call_ret1(LPX_OP_matmul, args, 3, out);
}

lpx_status lpx_matmul_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out)
{
    /* without this check an absent out would mean "allocate", and the
     * result would be silently dropped */
    if (!out) return lpx_error(LPX_EINVAL, "matmul_out: out is NULL");
    lpx_value args[3] = {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_tensor(out)};
    return lpx__call_ret0(LPX_OP_matmul, args, 3);
}

lpx_status lpx_linear(lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor **out)
{
    lpx_value args[3] = {lpx_v_tensor(x), lpx_v_tensor(w), lpx_v_opt_tensor(bias)};
    return lpx__call_ret1(LPX_OP_linear, args, 3, out);
}

lpx_status lpx_addmm(lpx_tensor *c, lpx_tensor *a, lpx_tensor *b, double beta, double alpha, lpx_tensor **out)
{
    lpx_value args[5] = {lpx_v_tensor(c), lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_f64(beta), lpx_v_f64(alpha)};
    return lpx__call_ret1(LPX_OP_addmm, args, 5, out);
}
