/* CPU optimizer kernels: the fused AdamW step (adamw_).
 *
 * The arithmetic is that of lpx_fsdp_adamw_step (subclasses/dtensor/
 * fsdp_adamw.c), all in f32 and in this order:
 *   m = b1 * m + (1 - b1) * g
 *   v = b2 * v + (1 - b2) * g * g
 *   p = p * (1 - lr * wd) - lr * (m / bc1) / (sqrt(v / bc2) + eps)
 * with bc1 = 1 - b1^t, bc2 = 1 - b2^t and the other constants computed in
 * double and rounded to f32. Parameters and grads are decoded to f32 in
 * tiles and the parameters encoded back with one RNE rounding; the CUDA
 * kernel (backends/cuda/cuda_adamw.cu) repeats this bit for bit. Every
 * argument is checked by the dispatcher before the kernel runs (family
 * `adamw`), so a refused call leaves all tensors as they were. */
#include <math.h>
#include "cpu_internal.h"

#define TILE 1024

static lpx_status step_one(lpx_tensor *p, const lpx_tensor *g, float *m, float *v, const lpx_adamw_consts *k)
{
    const float b1 = k->b1, omb1 = k->omb1, b2 = k->b2, omb2 = k->omb2, lr = k->lr, eps = k->eps, decay = k->decay,
                bc1 = k->bc1, bc2 = k->bc2;
    size_t n = (size_t)p->numel;
    lpx_dtype pd = p->dtype, gd = g->dtype;
    unsigned char *pp = lpx_tensor_data(p);
    const unsigned char *gp = lpx_tensor_data(g);
    float pw[TILE], pg[TILE];
    for (size_t at = 0; at < n; at += TILE) {
        size_t k = n - at < TILE ? n - at : TILE;
        float *x = pd == LPX_F32 ? (float *)pp + at : pw;
        const float *gr = gd == LPX_F32 ? (const float *)gp + at : pg;
        lpx_status st = LPX_OK;
        if (pd != LPX_F32) st = lpx_convert(pw, LPX_F32, pp + lpx_dtype_nbytes(pd, (int64_t)at), pd, k, 0);
        if (!st && gd != LPX_F32) st = lpx_convert(pg, LPX_F32, gp + lpx_dtype_nbytes(gd, (int64_t)at), gd, k, 0);
        if (st) return st; /* lpx_convert named the dtype */
        float *mm = m + at, *vv = v + at;
        for (size_t i = 0; i < k; i++) {
            float gi = gr[i];
            mm[i] = b1 * mm[i] + omb1 * gi;
            vv[i] = b2 * vv[i] + omb2 * gi * gi;
            float mh = mm[i] / bc1, vh = vv[i] / bc2;
            x[i] = x[i] * decay - lr * mh / (sqrtf(vh) + eps);
        }
        if (pd != LPX_F32 && (st = lpx_convert(pp + lpx_dtype_nbytes(pd, (int64_t)at), pd, pw, LPX_F32, k, 0)))
            return st;
    }
    return LPX_OK;
}

/* adamw_: the arguments are checked by the dispatcher (family `adamw`,
 * include/lpx/op_args_optim.h); every tensor is a dense CPU tensor. */
static lpx_status k_adamw(lpx_call *c)
{
    const lpx_adamw_args *a = lpx_op_args_of(c);
    for (uint32_t i = 0; i < a->n; i++) {
        lpx_status st = step_one(a->params[i], a->grads[i], lpx_tensor_data(a->exp_avg[i]),
                                 lpx_tensor_data(a->exp_avg_sq[i]), &a->k);
        if (st) return st;
    }
    return LPX_OK;
}

lpx_status lpx_cpu_register_optim(void) { return cpu_reg(LPX_OP_adamw_, k_adamw); }
