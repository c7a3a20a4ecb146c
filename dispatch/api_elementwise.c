/* Typed API: elementwise ops. `_out` variants pass the caller's tensor as
 * the optional `out` argument and drop the (retained) result. */
#include "api_util.h"

static lpx_status binary(lpx_op op, lpx_tensor *a, lpx_tensor *b, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_none()};
    return lpx__call_ret1(op, v, 3, out);
}

/* `out` is required here: lpx_v_tensor(NULL) makes the dispatcher report
 * "argument 'out' is a NULL tensor". */
static lpx_status binary_out(lpx_op op, lpx_tensor *a, lpx_tensor *b, lpx_tensor *out)
{
    lpx_value v[] = {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_tensor(out)};
    return lpx__call_ret0(op, v, 3);
}

static lpx_status unary(lpx_op op, lpx_tensor *x, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(x), lpx_v_none()};
    return lpx__call_ret1(op, v, 2, out);
}

static lpx_status scalar(lpx_op op, lpx_tensor *a, double s, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(a), lpx_v_f64(s), lpx_v_none()};
    return lpx__call_ret1(op, v, 3, out);
}

static lpx_status backward(lpx_op op, lpx_tensor *grad, lpx_tensor *x, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(grad), lpx_v_tensor(x)};
    return lpx__call_ret1(op, v, 2, out);
}

lpx_status lpx_add(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out) { return binary(LPX_OP_add, a, b, out); }
lpx_status lpx_sub(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out) { return binary(LPX_OP_sub, a, b, out); }
lpx_status lpx_mul(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out) { return binary(LPX_OP_mul, a, b, out); }
lpx_status lpx_div(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out) { return binary(LPX_OP_div, a, b, out); }
lpx_status lpx_add_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out) { return binary_out(LPX_OP_add, a, b, out); }
lpx_status lpx_sub_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out) { return binary_out(LPX_OP_sub, a, b, out); }
lpx_status lpx_mul_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out) { return binary_out(LPX_OP_mul, a, b, out); }
lpx_status lpx_div_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out) { return binary_out(LPX_OP_div, a, b, out); }
lpx_status lpx_add_scalar(lpx_tensor *a, double s, lpx_tensor **out) { return scalar(LPX_OP_add_scalar, a, s, out); }
lpx_status lpx_mul_scalar(lpx_tensor *a, double s, lpx_tensor **out) { return scalar(LPX_OP_mul_scalar, a, s, out); }
lpx_status lpx_neg(lpx_tensor *x, lpx_tensor **out) { return unary(LPX_OP_neg, x, out); }
lpx_status lpx_abs(lpx_tensor *x, lpx_tensor **out) { return unary(LPX_OP_abs, x, out); }
lpx_status lpx_sqrt(lpx_tensor *x, lpx_tensor **out) { return unary(LPX_OP_sqrt, x, out); }
lpx_status lpx_exp(lpx_tensor *x, lpx_tensor **out) { return unary(LPX_OP_exp, x, out); }
lpx_status lpx_relu(lpx_tensor *x, lpx_tensor **out) { return unary(LPX_OP_relu, x, out); }
lpx_status lpx_silu(lpx_tensor *x, lpx_tensor **out) { return unary(LPX_OP_silu, x, out); }
lpx_status lpx_gelu(lpx_tensor *x, lpx_tensor **out) { return unary(LPX_OP_gelu, x, out); }

lpx_status lpx_relu_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor **out)
{
    return backward(LPX_OP_relu_backward, grad, x, out);
}

lpx_status lpx_silu_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor **out)
{
    return backward(LPX_OP_silu_backward, grad, x, out);
}

lpx_status lpx_gelu_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor **out)
{
    return backward(LPX_OP_gelu_backward, grad, x, out);
}

lpx_status lpx_swiglu(lpx_tensor *gate, lpx_tensor *up, lpx_tensor **out) { return binary(LPX_OP_swiglu, gate, up, out); }

lpx_status lpx_swiglu_out(lpx_tensor *gate, lpx_tensor *up, lpx_tensor *out)
{
    return binary_out(LPX_OP_swiglu, gate, up, out);
}

lpx_status lpx_swiglu_backward(lpx_tensor *grad, lpx_tensor *gate, lpx_tensor *up, lpx_tensor **grad_gate,
                               lpx_tensor **grad_up)
{
    lpx_tensor **outs[2] = {grad_gate, grad_up};
    for (int i = 0; i < 2; i++)
        if (outs[i]) *outs[i] = NULL;
    if (!grad_gate && !grad_up) return lpx_error(LPX_EINVAL, "swiglu_backward: grad_gate and grad_up are both NULL");
    lpx_value v[] = {lpx_v_tensor(grad), lpx_v_tensor(gate), lpx_v_tensor(up)};
    return lpx__call_retn(LPX_OP_swiglu_backward, v, 3, 2, outs);
}

lpx_status lpx_cast(lpx_tensor *x, lpx_dtype dtype, bool saturate, lpx_tensor **out)
{
    lpx_value v[] = {lpx_v_tensor(x), lpx_v_dtype(dtype), lpx_v_bool(saturate)};
    return lpx__call_ret1(LPX_OP_cast, v, 3, out);
}

lpx_status lpx_copy_(lpx_tensor *dst, lpx_tensor *src)
{
    lpx_value v[] = {lpx_v_tensor(dst), lpx_v_tensor(src)};
    return lpx__call_ret0(LPX_OP_copy_, v, 2);
}

lpx_status lpx_fill_(lpx_tensor *dst, double value)
{
    lpx_value v[] = {lpx_v_tensor(dst), lpx_v_f64(value)};
    return lpx__call_ret0(LPX_OP_fill_, v, 2);
}
