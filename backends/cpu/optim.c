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
 * argument is checked before anything is written, so a refused call
 * leaves all tensors as they were. */
#include <math.h>
#include "cpu_internal.h"

#define TILE 1024

static lpx_status check_list_item(const lpx_call *c, const char *list, uint32_t i, const lpx_tensor *t, bool f32,
                                  bool written, int64_t numel)
{
    char arg[48];
    snprintf(arg, sizeof arg, "%s[%u]", list, i);
    lpx_status st = f32 ? cpu_check_dense(c, arg, t) : cpu_check_float(c, arg, t);
    if (st) return st;
    const char *op = cpu_op_name(c);
    if (f32 && t->dtype != LPX_F32)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; the optimizer state is f32", op, arg,
                         lpx_dtype_name(t->dtype));
    if (!lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_EINVAL, "%s: %s is not contiguous (the step runs over flat storage)", op, arg);
    if (written && t->storage->readonly)
        return lpx_error(LPX_EINVAL, "%s: %s is read-only (e.g. a read-only DLPack import)", op, arg);
    if (t->numel != numel)
        return lpx_error(LPX_ESHAPE, "%s: %s has %lld elements, params[%u] has %lld", op, arg, (long long)t->numel, i,
                         (long long)numel);
    return LPX_OK;
}

static lpx_status step_one(lpx_tensor *p, const lpx_tensor *g, float *m, float *v, float b1,
                           float omb1, float b2, float omb2, float lr, float eps, float decay, float bc1, float bc2)
{
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

static lpx_status k_adamw(lpx_call *c)
{
    const char *op = cpu_op_name(c);
    const lpx_value *a = c->args;
    static const char *const names[4] = {"params", "grads", "exp_avg", "exp_avg_sq"};
    uint32_t n = a[0].len;
    for (int k = 1; k < 4; k++)
        if (a[k].len != n)
            return lpx_error(LPX_EINVAL, "%s: params has %u tensors but %s has %u", op, n, names[k], a[k].len);
    double lr = a[4].u.f, beta1 = a[5].u.f, beta2 = a[6].u.f, eps = a[7].u.f, wd = a[8].u.f;
    int64_t step = a[9].u.i;
    if (!(lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0) || !(wd >= 0) || step < 1)
        return lpx_error(LPX_EINVAL, "%s: lr %g, betas (%g, %g), eps %g, weight_decay %g or step %lld out of range "
                         "(lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, step >= 1)", op, lr, beta1, beta2,
                         eps, wd, (long long)step);
    lpx_status st;
    for (uint32_t i = 0; i < n; i++) {
        const lpx_tensor *p = a[0].u.ts[i];
        if ((st = check_list_item(c, names[0], i, p, false, true, p->numel)) ||
            (st = check_list_item(c, names[1], i, a[1].u.ts[i], false, false, p->numel)) ||
            (st = check_list_item(c, names[2], i, a[2].u.ts[i], true, true, p->numel)) ||
            (st = check_list_item(c, names[3], i, a[3].u.ts[i], true, true, p->numel)))
            return st;
    }
    const float b1 = (float)beta1, b2 = (float)beta2, omb1 = (float)(1.0 - beta1), omb2 = (float)(1.0 - beta2),
                flr = (float)lr, feps = (float)eps, decay = (float)(1.0 - lr * wd),
                bc1 = (float)(1.0 - pow(beta1, (double)step)), bc2 = (float)(1.0 - pow(beta2, (double)step));
    for (uint32_t i = 0; i < n; i++) {
        st = step_one(a[0].u.ts[i], a[1].u.ts[i], lpx_tensor_data(a[2].u.ts[i]), lpx_tensor_data(a[3].u.ts[i]), b1,
                      omb1, b2, omb2, flr, feps, decay, bc1, bc2);
        if (st) return st;
    }
    return LPX_OK;
}

lpx_status lpx_cpu_register_optim(void) { return cpu_reg(LPX_OP_adamw_, k_adamw); }
