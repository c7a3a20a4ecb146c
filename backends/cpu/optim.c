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
#include <string.h>
#include "cpu_internal.h"
#include "core/numerics/optim_state.h"

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

/* ---- adamw_state_: AdamW over block-quantized moments -------------------
 * Per block of a->block elements (the last may be shorter): the parameter
 * decoded to f32 (its dtype, or the scaled-f16 master), the grad to f32,
 * then the numerics header's fused block step (dequantize m and v, lpx's
 * f32 AdamW per element, requantize with fresh scales: the arithmetic the
 * CUDA kernel shares, core/numerics/optim_state.h), then the parameter
 * written back: RNE, bf16 stochastic rounding, or scaled f16 (RNE or
 * stochastic), the random bits of flat element j being
 * lpx_os_rand32(seed, rank, step, index0 + j). */

static lpx_status state_step_one(const lpx_adamw_state_args *a, uint32_t i, const lpx_os_adamw *k, const float *qm,
                                 const float *qv, int64_t idx)
{
    lpx_tensor *pt = a->params[i], *gt = a->grads[i];
    const int64_t N = pt->numel, block = a->block;
    const lpx_dtype pd = pt->dtype, gd = gt->dtype;
    unsigned char *pp = lpx_tensor_data(pt);
    const unsigned char *gp = lpx_tensor_data(gt);
    uint8_t *mc = lpx_tensor_data(a->m[i]), *vc = lpx_tensor_data(a->v[i]);
    float *ms = lpx_tensor_data(a->m_scale[i]), *vs = lpx_tensor_data(a->v_scale[i]);
    float *xs = a->master_scale ? lpx_tensor_data(a->master_scale[i]) : NULL;
    float pw[LPX_OS_BLOCK_MAX], gw[LPX_OS_BLOCK_MAX];
    lpx_status st;
    for (int64_t b = 0, at = 0; at < N; b++, at += block) {
        int n = (int)(N - at < block ? N - at : block);
        if (a->master >= 2) lpx_os_dequant_f16s((const uint16_t *)pp + at, xs[b], n, pw);
        else if (pd == LPX_F32) memcpy(pw, (const float *)pp + at, (size_t)n * sizeof(float));
        else if ((st = lpx_convert(pw, LPX_F32, pp + lpx_dtype_nbytes(pd, at), pd, (size_t)n, 0))) return st;
        if (gd == LPX_F32) memcpy(gw, (const float *)gp + at, (size_t)n * sizeof(float));
        else if ((st = lpx_convert(gw, LPX_F32, gp + lpx_dtype_nbytes(gd, at), gd, (size_t)n, 0))) return st;
        switch (a->format) {
        case LPX_OS_STATE_8BIT: lpx_os_adamw8_block(k, qm, qv, n, pw, gw, mc + at, &ms[b], vc + at, &vs[b]); break;
        case LPX_OS_STATE_4BIT:
            lpx_os_adamw4_block(k, qm, qv, n, pw, gw, mc + at / 2, &ms[b], vc + at / 2, &vs[b]);
            break;
        default: lpx_os_adamwfp8_block(k, n, pw, gw, mc + at, &ms[b], (uint16_t *)vc + at, &vs[b]); break;
        }
        uint64_t j0 = (uint64_t)(idx + at);
        switch (a->master) {
        case 0:
            if (pd == LPX_F32) memcpy((float *)pp + at, pw, (size_t)n * sizeof(float));
            else if ((st = lpx_convert(pp + lpx_dtype_nbytes(pd, at), pd, pw, LPX_F32, (size_t)n, 0))) return st;
            break;
        case 1: lpx_os_bf16_sr_store(pw, n, (uint16_t *)pp + at, a->seed, a->rank, (uint64_t)a->step, j0); break;
        default:
            xs[b] = lpx_os_f16s_store(pw, n, (uint16_t *)pp + at, a->master == 3, a->seed, a->rank,
                                      (uint64_t)a->step, j0);
            break;
        }
    }
    return LPX_OK;
}

/* adamw_state_: the arguments are checked by the dispatcher (family
 * `adamw_state`, include/lpx/op_args_optim.h). */
static lpx_status k_adamw_state(lpx_call *c)
{
    const lpx_adamw_state_args *a = lpx_op_args_of(c);
    const lpx_adamw_consts *mk = &a->k;
    const lpx_os_adamw k = {mk->b1, mk->omb1, mk->b2, mk->omb2, mk->lr, mk->eps, mk->decay, mk->bc1, mk->bc2};
    float qm[256], qv[256];
    if (a->format == LPX_OS_STATE_8BIT) {
        lpx_os_map_fill(LPX_OS_MAP8_SIGNED, qm);
        lpx_os_map_fill(LPX_OS_MAP8_UNSIGNED, qv);
    } else if (a->format == LPX_OS_STATE_4BIT) {
        lpx_os_map_fill(LPX_OS_MAP4_SIGNED, qm);
        lpx_os_map_fill(LPX_OS_MAP4_UNSIGNED, qv);
    }
    int64_t idx = a->index0;
    for (uint32_t i = 0; i < a->n; i++) {
        lpx_status st = state_step_one(a, i, &k, qm, qv, idx);
        if (st) return st;
        idx += a->params[i]->numel;
    }
    return LPX_OK;
}

lpx_status lpx_cpu_register_optim(void)
{
    lpx_status st = cpu_reg(LPX_OP_adamw_, k_adamw);
    return st ? st : cpu_reg(LPX_OP_adamw_state_, k_adamw_state);
}
