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

/* The dense tensor the optimizer updates in place for a local shard: the
 * shard itself, or what its kind names (lpx_kind_i.master: a wrapper's
 * master weight, built in or from a plugin). */
static lpx_tensor *weight_of(lpx_tensor *local)
{
    const lpx_kind *k = lpx_tensor_kind(local);
    if (!k) return local;
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    return vt->master ? vt->master(local) : NULL;
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
    /* a device-resident engine: the same update by lpx_adamw_ on the device */
    if (lpx_tensor_device(w).type != LPX_DEVICE_CPU) return fsdp_adamw_dev(p, w, o);
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
        float *x = wd == fsdp_math_dtype ? (float *)wp + at : pw;
        const float *g = gd == fsdp_math_dtype ? (const float *)gp + at : pg;
        if (wd != fsdp_math_dtype) fsdp_to_f32(wd, wp + lpx_dtype_nbytes(wd, (int64_t)at), pw, k);
        if (gd != fsdp_math_dtype) fsdp_to_f32(gd, gp + lpx_dtype_nbytes(gd, (int64_t)at), pg, k);
        float *m = p->m + at, *v = p->v + at;
        for (size_t i = 0; i < k; i++) {
            float gi = g[i];
            m[i] = b1 * m[i] + omb1 * gi;
            v[i] = b2 * v[i] + omb2 * gi * gi;
            float mh = m[i] / bc1, vh = v[i] / bc2;
            x[i] = x[i] * decay - lr * mh / (sqrtf(vh) + eps);
        }
        if (wd != fsdp_math_dtype) fsdp_from_f32(wd, pw, wp + lpx_dtype_nbytes(wd, (int64_t)at), k);
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

/* The trainable parameter i of g whose AdamW state a checkpoint reads or
 * writes, with its dense weight (the local shard, or a wrapper kind's
 * master). */
static lpx_status state_param(const lpx_fsdp_group *g, int i, const char *op, fsdp_param **p, lpx_tensor **w)
{
    if (!g) return lpx_error(LPX_EINVAL, "%s: g is NULL", op);
    if (i < 0 || i >= g->n) return lpx_error(LPX_EINVAL, "%s(%s): param %d out of range (0..%d)", op, g->name, i, g->n - 1);
    if (!g->f->sharded) return lpx_error(LPX_EINVAL, "%s(%s): before lpx_fsdp_shard", op, g->name);
    *p = &g->p[i];
    if ((*p)->flags & LPX_FSDP_FROZEN)
        return lpx_error(LPX_EINVAL, "%s(%s): param '%s' is frozen (no optimizer state)", op, g->name, (*p)->name);
    *w = weight_of(fsdp_local(*p));
    if (!*w)
        return lpx_error(LPX_EINVAL, "%s(%s): param '%s' has no dense weight (kind %s)", op, g->name, (*p)->name,
                         lpx_kind_name(lpx_tensor_kind(fsdp_local(*p))));
    return LPX_OK;
}

/* The AdamW moments of param i as tensors shaped like its weight: copies
 * (zeros before the first step) or, with `view`, borrowed handles on the
 * engine's arrays (NULL before the first step). */
static lpx_status adamw_tensors(const lpx_fsdp_group *g, int i, const char *op, bool view, lpx_tensor **m,
                                lpx_tensor **v, int64_t *step)
{
    fsdp_param *p = NULL;
    lpx_tensor *w = NULL, *t[2] = {NULL, NULL};
    if (m) *m = NULL;
    if (v) *v = NULL;
    lpx_status st = state_param(g, i, op, &p, &w);
    if (st) return st;
    lpx_tensor **outs[2] = {m, v};
    if (lpx_tensor_device(w).type != LPX_DEVICE_CPU) {
        /* device-resident: the moments are device tensors; a view is a
         * handle on them, a copy comes to the host */
        lpx_tensor *dev[2] = {p->mt, p->vt};
        for (int k = 0; k < 2; k++) {
            if (!outs[k] || (view && !dev[k])) continue;
            if (view) {
                lpx_tensor_retain(dev[k]);
                t[k] = dev[k];
            } else {
                st = dev[k] ? lpx_tensor_to(dev[k], lpx_cpu(), &t[k])
                            : lpx_zeros(lpx_tensor_ndim(w), lpx_tensor_shape(w), fsdp_math_dtype, lpx_cpu(), &t[k]);
            }
            if (st) {
                lpx_tensor_release(t[0]);
                return dt_prefix(st, "%s(%s)", op, g->name);
            }
        }
        if (m) *m = t[0];
        if (v) *v = t[1];
        if (step) *step = p->step;
        return LPX_OK;
    }
    float *src[2] = {p->m, p->v};
    size_t n = (size_t)lpx_tensor_numel(w);
    for (int k = 0; k < 2; k++) {
        if (!outs[k] || (view && !src[k])) continue;
        if (view) /* a handle on the engine's array: no copy, no deleter */
            st = lpx_tensor_from_blob(src[k], fsdp_math_dtype, lpx_tensor_ndim(w), lpx_tensor_shape(w), NULL, lpx_cpu(), NULL,
                                      NULL, &t[k]);
        else
            st = lpx_zeros(lpx_tensor_ndim(w), lpx_tensor_shape(w), fsdp_math_dtype, lpx_cpu(), &t[k]);
        if (st) {
            lpx_tensor_release(t[0]);
            return dt_prefix(st, "%s(%s)", op, g->name);
        }
        if (!view && src[k] && n) memcpy(lpx_tensor_data(t[k]), src[k], n * sizeof(float));
    }
    if (m) *m = t[0];
    if (v) *v = t[1];
    if (step) *step = p->step;
    return LPX_OK;
}

lpx_status lpx_fsdp_param_adamw_state(const lpx_fsdp_group *g, int i, lpx_tensor **m, lpx_tensor **v, int64_t *step)
{
    return adamw_tensors(g, i, "lpx_fsdp_param_adamw_state", false, m, v, step);
}

lpx_status lpx_fsdp_param_adamw_view(const lpx_fsdp_group *g, int i, lpx_tensor **m, lpx_tensor **v, int64_t *step)
{
    return adamw_tensors(g, i, "lpx_fsdp_param_adamw_view", true, m, v, step);
}

lpx_status lpx_fsdp_param_set_adamw_state(lpx_fsdp_group *g, int i, const lpx_tensor *m, const lpx_tensor *v,
                                          int64_t step)
{
    const char *op = "lpx_fsdp_param_set_adamw_state";
    fsdp_param *p = NULL;
    lpx_tensor *w = NULL;
    lpx_status st = state_param(g, i, op, &p, &w);
    if (st) return st;
    if (step < 0) return lpx_error(LPX_EINVAL, "%s(%s): param '%s': step %lld is negative", op, g->name, p->name, (long long)step);
    if (!m != !v) return lpx_error(LPX_EINVAL, "%s(%s): param '%s': give both m and v, or neither", op, g->name, p->name);
    if (!m) {
        if (step) return lpx_error(LPX_EINVAL, "%s(%s): param '%s': step %lld without m and v", op, g->name, p->name,
                                   (long long)step);
        lpx_free(p->m);
        lpx_free(p->v);
        p->m = p->v = NULL;
        lpx_tensor_release(p->mt);
        lpx_tensor_release(p->vt);
        p->mt = p->vt = NULL;
        p->step = 0;
        return LPX_OK;
    }
    size_t n = (size_t)lpx_tensor_numel(w);
    const lpx_tensor *in[2] = {m, v};
    /* host tensors; a device-resident engine also takes them on its device
     * (what lpx_fsdp_param_adamw_view hands out there) */
    bool dev_ok = lpx_tensor_device(w).type != LPX_DEVICE_CPU;
    for (int k = 0; k < 2; k++) {
        lpx_device d = lpx_tensor_device(in[k]);
        bool where = d.type == LPX_DEVICE_CPU ||
                     (dev_ok && d.type == lpx_tensor_device(w).type && d.index == lpx_tensor_device(w).index);
        if (lpx_tensor_kind(in[k]) || lpx_tensor_dtype(in[k]) != fsdp_math_dtype || !lpx_tensor_is_contiguous(in[k]) ||
            (size_t)lpx_tensor_numel(in[k]) != n || !where)
            return lpx_error(LPX_EINVAL, "%s(%s): param '%s': %s must be a contiguous f32 tensor of %zu elements "
                             "(the local shard) on the CPU%s, got %lld elements of %s on device type %d", op, g->name,
                             p->name, k ? "v" : "m", n, dev_ok ? " or the weight's device" : "",
                             (long long)lpx_tensor_numel(in[k]), lpx_dtype_name(lpx_tensor_dtype(in[k])), (int)d.type);
    }
    if (lpx_tensor_device(w).type != LPX_DEVICE_CPU) {
        /* device-resident: uploaded next to the weight, shaped like it */
        lpx_tensor *up[2] = {NULL, NULL}, *sh[2] = {NULL, NULL};
        for (int k = 0; k < 2 && !st; k++) {
            st = lpx_tensor_to((lpx_tensor *)in[k], lpx_tensor_device(w), &up[k]);
            if (!st) st = lpx_view(up[k], lpx_tensor_ndim(w), lpx_tensor_shape(w), &sh[k]);
        }
        lpx_tensor_release(up[0]);
        lpx_tensor_release(up[1]);
        if (st) {
            lpx_tensor_release(sh[0]);
            lpx_tensor_release(sh[1]);
            return dt_prefix(st, "%s(%s): param '%s'", op, g->name, p->name);
        }
        lpx_tensor_release(p->mt);
        lpx_tensor_release(p->vt);
        p->mt = sh[0];
        p->vt = sh[1];
        p->step = step;
        return LPX_OK;
    }
    float *nm = n ? lpx_calloc(n, sizeof(float)) : NULL, *nv = n ? lpx_calloc(n, sizeof(float)) : NULL;
    if (n && (!nm || !nv)) {
        lpx_free(nm);
        lpx_free(nv);
        return lpx_error(LPX_ENOMEM, "%s(%s): optimizer state of '%s'", op, g->name, p->name);
    }
    if (n) {
        memcpy(nm, lpx_tensor_data(m), n * sizeof(float));
        memcpy(nv, lpx_tensor_data(v), n * sizeof(float));
    }
    lpx_free(p->m);
    lpx_free(p->v);
    p->m = nm;
    p->v = nv;
    p->step = step;
    return LPX_OK;
}
