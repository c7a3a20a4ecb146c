/* Fused AdamW over a group's local shards: one pass per parameter that
 * decodes a tile of the shard and its grad to f32, updates m, v and the
 * weight, and encodes the weight back (RNE) — instead of one dispatched
 * op per arithmetic step. The arithmetic, all in f32 (the exact order is
 * part of the contract: the tests replay it on the unsharded params):
 *   m = b1 * m + (1 - b1) * g
 *   v = b2 * v + (1 - b2) * g * g
 *   p = p * (1 - lr * wd) - lr * (m / bc1) / (sqrt(v / bc2) + eps)
 * with bc1 = 1 - b1^t, bc2 = 1 - b2^t computed in double and rounded to
 * f32, as are the other constants. */
#include <math.h>
#include <string.h>
#include "fsdp_internal.h"

#define TILE 1024

lpx_adamw_opts lpx_adamw_opts_default(void)
{
    lpx_adamw_opts o = {1e-3, 0.9, 0.999, 1e-8, 0.01};
    return o;
}

/* The dense tensor the optimizer updates in place for a local shard. */
static lpx_tensor *weight_of(lpx_tensor *local)
{
    if (!lpx_tensor_kind(local)) return local;
    if (lpx_float8_weight_is(local)) return lpx_float8_weight_master(local);
    return NULL;
}

static lpx_status step_param(fsdp_param *p, const lpx_adamw_opts *o_in)
{
    lpx_adamw_opts nd = *o_in;
    if (p->flags & LPX_FSDP_NO_DECAY) nd.weight_decay = 0;
    const lpx_adamw_opts *o = &nd;
    const char *op = "lpx_fsdp_adamw_step";
    lpx_tensor *w = weight_of(fsdp_local(p));
    if (!w || !lpx_tensor_is_contiguous(w))
        return lpx_error(LPX_EINVAL, "%s: param '%s' has no contiguous dense weight to update (kind %s)", op, p->name,
                         lpx_tensor_kind(fsdp_local(p)) ? lpx_kind_name(lpx_tensor_kind(fsdp_local(p))) : "dense");
    size_t n = (size_t)lpx_tensor_numel(w);
    if (!p->grad || (size_t)lpx_tensor_numel(p->grad) != n)
        return lpx_error(LPX_EINVAL, "%s: param '%s' has no reduced grad (lpx_fsdp_reduce_scatter_grads)", op, p->name);
    if (!p->m && n) {
        p->m = lpx_calloc(n, sizeof(float));
        p->v = lpx_calloc(n, sizeof(float));
        if (!p->m || !p->v) return lpx_error(LPX_ENOMEM, "%s: optimizer state of '%s'", op, p->name);
    }
    p->step++;
    const float b1 = (float)o->beta1, b2 = (float)o->beta2, omb1 = (float)(1.0 - o->beta1),
                omb2 = (float)(1.0 - o->beta2), lr = (float)o->lr, eps = (float)o->eps,
                decay = (float)(1.0 - o->lr * o->weight_decay), bc1 = (float)(1.0 - pow(o->beta1, (double)p->step)),
                bc2 = (float)(1.0 - pow(o->beta2, (double)p->step));
    lpx_dtype wd = lpx_tensor_dtype(w), gd = lpx_tensor_dtype(p->grad);
    unsigned char *wp = lpx_tensor_data(w);
    const unsigned char *gp = lpx_tensor_data(p->grad);
    float pw[TILE], pg[TILE];
    for (size_t at = 0; at < n; at += TILE) {
        size_t k = n - at < TILE ? n - at : TILE;
        float *x = wd == LPX_F32 ? (float *)wp + at : pw;
        const float *g = gd == LPX_F32 ? (const float *)gp + at : pg;
        if (wd != LPX_F32) fsdp_to_f32(wd, wp + lpx_dtype_nbytes(wd, (int64_t)at), pw, k);
        if (gd != LPX_F32) fsdp_to_f32(gd, gp + lpx_dtype_nbytes(gd, (int64_t)at), pg, k);
        float *m = p->m + at, *v = p->v + at;
        for (size_t i = 0; i < k; i++) {
            float gi = g[i];
            m[i] = b1 * m[i] + omb1 * gi;
            v[i] = b2 * v[i] + omb2 * gi * gi;
            float mh = m[i] / bc1, vh = v[i] / bc2;
            x[i] = x[i] * decay - lr * mh / (sqrtf(vh) + eps);
        }
        if (wd != LPX_F32) fsdp_from_f32(wd, pw, wp + lpx_dtype_nbytes(wd, (int64_t)at), k);
    }
    return LPX_OK;
}

lpx_status lpx_fsdp_adamw_step(lpx_fsdp_group *g, const lpx_adamw_opts *opts)
{
    if (!g) return lpx_error(LPX_EINVAL, "lpx_fsdp_adamw_step: g is NULL");
    lpx_adamw_opts o = opts ? *opts : lpx_adamw_opts_default();
    if (!(o.lr >= 0) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) || !(o.eps > 0) ||
        !(o.weight_decay >= 0))
        return lpx_error(LPX_EINVAL, "lpx_fsdp_adamw_step(%s): lr %g, betas (%g, %g), eps %g, weight_decay %g out of "
                         "range", g->name, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
    for (int i = 0; i < g->n; i++) {
        if (g->p[i].flags & LPX_FSDP_FROZEN) continue;
        lpx_status st = step_param(&g->p[i], &o);
        if (st) return dt_prefix(st, "lpx_fsdp_adamw_step(%s)", g->name);
    }
    return LPX_OK;
}
