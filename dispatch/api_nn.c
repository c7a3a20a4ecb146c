/* Typed API: neural-network ops. */
#include "api_util.h"

lpx_status lpx_rmsnorm(lpx_tensor *x, lpx_tensor *weight, double eps, lpx_tensor **y, lpx_tensor **rstd)
{
    if (!y) {
        if (rstd) *rstd = NULL;
        return lpx_error(LPX_EINVAL, "rmsnorm: y is NULL");
    }
    lpx_value args[3] = {lpx_v_tensor(x), lpx_v_opt_tensor(weight), lpx_v_f64(eps)};
    return lpx__call_ret2(LPX_OP_rmsnorm, args, 3, y, rstd);
}

lpx_status lpx_rmsnorm_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor *weight, lpx_tensor *rstd,
                                lpx_tensor **grad_x, lpx_tensor **grad_w)
{
    if (grad_w) *grad_w = NULL;
    if (!grad_x) return lpx_error(LPX_EINVAL, "rmsnorm_backward: grad_x is NULL");
    lpx_value args[4] = {lpx_v_tensor(grad), lpx_v_tensor(x), lpx_v_opt_tensor(weight), lpx_v_tensor(rstd)};
    /* the op always computes grad_w; this API hands it out only when there
     * is a weight to apply it to (see ops.h) */
    return lpx__call_ret2(LPX_OP_rmsnorm_backward, args, 4, grad_x, weight ? grad_w : NULL);
}

lpx_status lpx_softmax(lpx_tensor *x, int64_t dim, lpx_tensor **out)
{
    lpx_value args[2] = {lpx_v_tensor(x), lpx_v_i64(dim)};
    return lpx__call_ret1(LPX_OP_softmax, args, 2, out);
}

lpx_status lpx_softmax_backward(lpx_tensor *grad, lpx_tensor *y, int64_t dim, lpx_tensor **out)
{
    lpx_value args[3] = {lpx_v_tensor(grad), lpx_v_tensor(y), lpx_v_i64(dim)};
    return lpx__call_ret1(LPX_OP_softmax_backward, args, 3, out);
}

lpx_status lpx_cross_entropy(lpx_tensor *logits, lpx_tensor *target, int64_t ignore_index, lpx_tensor **loss)
{
    lpx_value args[3] = {lpx_v_tensor(logits), lpx_v_tensor(target), lpx_v_i64(ignore_index)};
    return lpx__call_ret1(LPX_OP_cross_entropy, args, 3, loss);
}

lpx_status lpx_cross_entropy_backward(lpx_tensor *logits, lpx_tensor *target, int64_t ignore_index, double grad,
                                      lpx_tensor **grad_logits)
{
    lpx_value args[4] = {lpx_v_tensor(logits), lpx_v_tensor(target), lpx_v_i64(ignore_index), lpx_v_f64(grad)};
    return lpx__call_ret1(LPX_OP_cross_entropy_backward, args, 4, grad_logits);
}

lpx_status lpx_mse_loss(lpx_tensor *a, lpx_tensor *b, lpx_tensor **loss)
{
    lpx_value args[2] = {lpx_v_tensor(a), lpx_v_tensor(b)};
    return lpx__call_ret1(LPX_OP_mse_loss, args, 2, loss);
}

lpx_status lpx_mse_loss_backward(lpx_tensor *a, lpx_tensor *b, double grad, lpx_tensor **grad_a)
{
    lpx_value args[3] = {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_f64(grad)};
    return lpx__call_ret1(LPX_OP_mse_loss_backward, args, 3, grad_a);
}

lpx_status lpx_embedding(lpx_tensor *weight, lpx_tensor *indices, lpx_tensor **out)
{
    lpx_value args[2] = {lpx_v_tensor(weight), lpx_v_tensor(indices)};
    return lpx__call_ret1(LPX_OP_embedding, args, 2, out);
}

lpx_status lpx_embedding_backward(lpx_tensor *grad, lpx_tensor *indices, int64_t num_weights, lpx_tensor **out)
{
    lpx_value args[3] = {lpx_v_tensor(grad), lpx_v_tensor(indices), lpx_v_i64(num_weights)};
    return lpx__call_ret1(LPX_OP_embedding_backward, args, 3, out);
}

lpx_status lpx_rope(lpx_tensor *x, lpx_tensor *inv_freq, int64_t offset, lpx_tensor **out)
{
    lpx_value args[3] = {lpx_v_tensor(x), lpx_v_tensor(inv_freq), lpx_v_i64(offset)};
    return lpx__call_ret1(LPX_OP_rope, args, 3, out);
}

lpx_status lpx_rope_backward(lpx_tensor *grad, lpx_tensor *inv_freq, int64_t offset, lpx_tensor **grad_x)
{
    lpx_value args[3] = {lpx_v_tensor(grad), lpx_v_tensor(inv_freq), lpx_v_i64(offset)};
    return lpx__call_ret1(LPX_OP_rope_backward, args, 3, grad_x);
}

lpx_status lpx_attention(lpx_tensor *q, lpx_tensor *k, lpx_tensor *v, bool causal, double scale, lpx_tensor **out,
                         lpx_tensor **lse)
{
    if (lse) *lse = NULL;
    if (!out) return lpx_error(LPX_EINVAL, "attention: out is NULL");
    *out = NULL;
    lpx_value args[5] = {lpx_v_tensor(q), lpx_v_tensor(k), lpx_v_tensor(v), lpx_v_bool(causal), lpx_v_f64(scale)};
    lpx_tensor **outs[2] = {out, lse};
    return lpx__call_retn(LPX_OP_attention, args, 5, 2, outs);
}

lpx_status lpx_attention_backward(lpx_tensor *grad, lpx_tensor *q, lpx_tensor *k, lpx_tensor *v, lpx_tensor *out,
                                  lpx_tensor *lse, bool causal, double scale, lpx_tensor **dq, lpx_tensor **dk,
                                  lpx_tensor **dv)
{
    lpx_tensor **outs[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++)
        if (outs[i]) *outs[i] = NULL;
    lpx_value args[8] = {lpx_v_tensor(grad), lpx_v_tensor(q),   lpx_v_tensor(k),    lpx_v_tensor(v),
                         lpx_v_tensor(out),  lpx_v_tensor(lse), lpx_v_bool(causal), lpx_v_f64(scale)};
    return lpx__call_retn(LPX_OP_attention_backward, args, 8, 3, outs);
}
