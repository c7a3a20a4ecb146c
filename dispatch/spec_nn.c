/* The spec families of include/lpx/op_args_nn.h: their meta functions
 * (the conventions are spec.c's). Each checks in the order the CPU kernels
 * did before the spec, so every message is the one the CPU gave: some
 * ops checked their dtypes first (linear, rmsnorm, ...), others their
 * shapes first (rope, attention, swiglu_backward). Checks of data (a
 * target or an index out of range) are the kernels'. */
#include "spec_internal.h"

/* ---- linear, addmm ---------------------------------------------------- */

/* The trainer's hot op: the tensors are loaded once, the geometry goes
 * straight into the frame (no copy of it here or in the kernels). */
lpx_status lpx__spec_linear(const lpx_call *c, void *p)
{
    lpx_linear_args *a = p;
    lpx_tensor *x = c->args[0].u.t, *w = c->args[1].u.t, *bias = opt_tensor(c, 2);
    lpx_status st;
    if ((st = floating(c, 0, x)) || (st = floating(c, 1, w)) || (bias && (st = floating(c, 2, bias)))) return st;
    a->x = x;
    a->w = w;
    a->bias = bias;
    return lpx_meta_linear(op_name(c), x, w, bias, &a->g);
}

lpx_status lpx__spec_addmm(const lpx_call *c, void *p)
{
    lpx_addmm_args *a = p;
    lpx_tensor *ct = c->args[0].u.t, *x = c->args[1].u.t, *y = c->args[2].u.t;
    lpx_status st;
    if ((st = floating(c, 0, ct)) || (st = floating(c, 1, x)) || (st = floating(c, 2, y))) return st;
    a->c = ct;
    a->a = x;
    a->b = y;
    a->beta = c->args[3].u.f;
    a->alpha = c->args[4].u.f;
    return lpx_meta_addmm(op_name(c), ct, x, y, &a->g);
}

/* ---- rmsnorm, rmsnorm_backward ----------------------------------------- */

lpx_status lpx__spec_rmsnorm(const lpx_call *c, void *p)
{
    lpx_rmsnorm_args *a = p;
    lpx_tensor *x = c->args[0].u.t, *w = opt_tensor(c, 1);
    lpx_status st;
    /* the weight's shape before its dtype, as the CPU checked */
    if ((st = floating(c, 0, x)) || (st = lpx_meta_rmsnorm(op_name(c), x, w, &a->rows, &a->dim)) ||
        (w && (st = floating(c, 1, w))))
        return st;
    a->x = x;
    a->weight = w;
    a->eps = c->args[2].u.f;
    return LPX_OK;
}

lpx_status lpx__spec_rmsnorm_backward(const lpx_call *c, void *p)
{
    lpx_rmsnorm_backward_args *a = p;
    lpx_tensor *g = c->args[0].u.t, *x = c->args[1].u.t, *w = opt_tensor(c, 2), *rstd = c->args[3].u.t;
    lpx_status st;
    if ((st = floating(c, 0, g)) || (st = floating(c, 1, x)) || (st = floating(c, 3, rstd)) ||
        (st = lpx_meta_rmsnorm_backward(op_name(c), g, x, w, rstd, &a->rows, &a->dim)) ||
        (w && (st = floating(c, 2, w))))
        return st;
    a->grad = g;
    a->x = x;
    a->weight = w;
    a->rstd = rstd;
    a->grad_w_dtype = w ? w->dtype : x->dtype;
    return LPX_OK;
}

/* ---- cross_entropy(_backward), mse_loss(_backward) --------------------- */

/* Targets in range are data: the kernels check them (LPX_ERANGE). */
lpx_status lpx__spec_cross_entropy(const lpx_call *c, void *p)
{
    lpx_cross_entropy_args *a = p;
    lpx_tensor *logits = c->args[0].u.t, *target = c->args[1].u.t;
    lpx_status st;
    if ((st = floating(c, 0, logits)) || (st = dense(c, 1, target)) ||
        (st = lpx_meta_cross_entropy(op_name(c), logits, target, &a->n, &a->classes)))
        return st;
    bool backward = c->op == LPX_OP_cross_entropy_backward;
    a->logits = logits;
    a->target = target;
    a->ignore_index = c->args[2].u.i;
    a->grad = backward ? c->args[3].u.f : 0.0;
    a->dtype = backward ? logits->dtype : lpx_meta_cross_entropy_dtype(logits->dtype);
    return LPX_OK;
}

lpx_status lpx__spec_mse_loss(const lpx_call *c, void *p)
{
    lpx_mse_loss_args *a = p;
    lpx_tensor *x = c->args[0].u.t, *y = c->args[1].u.t;
    lpx_status st;
    if ((st = floating(c, 0, x)) || (st = floating(c, 1, y)) ||
        (st = lpx_meta_same_shape(op_name(c), arg_name(c, 0), x, arg_name(c, 1), y)))
        return st;
    a->a = x;
    a->b = y;
    a->grad = c->op == LPX_OP_mse_loss_backward ? c->args[2].u.f : 0.0;
    return LPX_OK;
}

/* ---- embedding, embedding_backward ------------------------------------- */

/* Indices in range are data: the kernels check them (LPX_ERANGE). */
lpx_status lpx__spec_embedding(const lpx_call *c, void *p)
{
    lpx_embedding_args *a = p;
    lpx_tensor *w = c->args[0].u.t, *idx = c->args[1].u.t;
    lpx_status st;
    if ((st = dense(c, 0, w)) || (st = dense(c, 1, idx)) ||
        (st = lpx_meta_embedding(op_name(c), w, idx, &a->out_ndim, a->out_shape)))
        return st;
    a->weight = w;
    a->indices = idx;
    a->num = w->shape[0];
    a->dim = w->shape[1];
    return LPX_OK;
}

lpx_status lpx__spec_embedding_backward(const lpx_call *c, void *p)
{
    lpx_embedding_backward_args *a = p;
    lpx_tensor *g = c->args[0].u.t, *idx = c->args[1].u.t;
    int64_t V = c->args[2].u.i;
    lpx_status st;
    if ((st = floating(c, 0, g)) || (st = dense(c, 1, idx)) ||
        (st = lpx_meta_embedding_backward(op_name(c), g, idx, V, &a->dim)))
        return st;
    a->grad = g;
    a->indices = idx;
    a->num_weights = V;
    return LPX_OK;
}

/* ---- rope(_backward), attention, attention_backward --------------------- */

/* shapes and the offset first, then the dtypes (the CPU's order) */
lpx_status lpx__spec_rope(const lpx_call *c, void *p)
{
    lpx_rope_args *a = p;
    lpx_tensor *x = c->args[0].u.t, *fr = c->args[1].u.t;
    int64_t offset = c->args[2].u.i;
    lpx_status st;
    if ((st = lpx_meta_rope(op_name(c), x, fr, offset, &a->half)) || (st = floating(c, 0, x)) ||
        (st = floating(c, 1, fr)))
        return st;
    a->x = x;
    a->inv_freq = fr;
    a->offset = offset;
    return LPX_OK;
}

lpx_status lpx__spec_attention(const lpx_call *c, void *p)
{
    lpx_attention_args *a = p;
    lpx_tensor *q = c->args[0].u.t, *k = c->args[1].u.t, *v = c->args[2].u.t;
    bool causal = c->args[3].u.b;
    double scale = c->args[4].u.f;
    lpx_status st;
    if ((st = lpx_meta_attention(op_name(c), q, k, v, causal, scale, &a->g)) || (st = floating(c, 0, q)) ||
        (st = floating(c, 1, k)) || (st = floating(c, 2, v)))
        return st;
    a->q = q;
    a->k = k;
    a->v = v;
    a->causal = causal;
    a->scale = scale;
    return LPX_OK;
}

lpx_status lpx__spec_attention_backward(const lpx_call *c, void *p)
{
    lpx_attention_backward_args *a = p;
    lpx_tensor *t[6];
    for (int i = 0; i < 6; i++) t[i] = c->args[i].u.t;
    bool causal = c->args[6].u.b;
    double scale = c->args[7].u.f;
    lpx_status st;
    if ((st = lpx_meta_attention_backward(op_name(c), t[0], t[1], t[2], t[3], t[4], t[5], causal, scale, &a->g)))
        return st;
    for (int i = 0; i < 6; i++)
        if ((st = floating(c, i, t[i]))) return st;
    a->grad = t[0];
    a->q = t[1];
    a->k = t[2];
    a->v = t[3];
    a->out = t[4];
    a->lse = t[5];
    a->causal = causal;
    a->scale = scale;
    return LPX_OK;
}

/* ---- swiglu_backward ---------------------------------------------------- */

/* shapes and dtypes first (lpx_meta_swiglu_backward), then dense */
lpx_status lpx__spec_swiglu_backward(const lpx_call *c, void *p)
{
    lpx_swiglu_backward_args *a = p;
    lpx_tensor *g = c->args[0].u.t, *gate = c->args[1].u.t, *up = c->args[2].u.t;
    lpx_status st;
    if ((st = lpx_meta_swiglu_backward(op_name(c), g, gate, up)) || (st = dense(c, 0, g)) ||
        (st = dense(c, 1, gate)) || (st = dense(c, 2, up)))
        return st;
    a->grad = g;
    a->gate = gate;
    a->up = up;
    return LPX_OK;
}
