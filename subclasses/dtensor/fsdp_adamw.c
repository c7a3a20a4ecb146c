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

/* low-precision moments: one adamw_state_ over the local shard, blocks on
 * the param's global flat index (index0 = the shard's first element) */
static lpx_status step_state(const lpx_fsdp_group *g, fsdp_param *p, lpx_tensor *w, const lpx_adamw_opts *o)
{
    const char *op = "lpx_fsdp_adamw_step";
    lpx_status st = LPX_OK;
    if (!p->ms) {
        lpx_tensor *m = NULL, *v = NULL;
        if ((st = fsdp_state_new(&g->optim, 0, lpx_tensor_ndim(w), lpx_tensor_shape(w), lpx_tensor_device(w), &m)) ||
            (st = fsdp_state_new(&g->optim, 1, lpx_tensor_ndim(w), lpx_tensor_shape(w), lpx_tensor_device(w), &v))) {
            lpx_tensor_release(m);
            return dt_prefix(st, "%s: param '%s': %s optimizer state", op, p->name, fsdp_state_name(g->optim.state));
        }
        p->ms = m;
        p->vs = v;
    }
    int64_t index0 = p->start * fsdp_row_elems(p);
    st = fsdp_state_step(&g->optim, w, w == fsdp_local(p) ? p->wsc : NULL, p->grad, p->ms, p->vs, o, p->step + 1,
                         p->pid, index0);
    if (st) return dt_prefix(st, "%s: param '%s'", op, p->name);
    p->step++;
    return LPX_OK;
}

static lpx_status step_param(const lpx_fsdp_group *grp, fsdp_param *p, const lpx_adamw_opts *o_in)
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
    if (grp->optim.state != LPX_FSDP_STATE_F32) return step_state(grp, p, w, o);
    bool sr = fsdp_master_is_sr(&grp->optim, lpx_tensor_dtype(w));
    /* a scaled-f16 master: the codes decoded per block, written back with
     * fresh scales (blocks start at multiples of the block: TILE is one) */
    float *wsc = w == fsdp_local(p) && p->wsc ? lpx_tensor_data(p->wsc) : NULL;
    /* a device-resident engine: the same update by lpx_adamw_ on the device */
    if (lpx_tensor_device(w).type != LPX_DEVICE_CPU) {
        if (sr)
            return lpx_error(LPX_ENOTIMPL, "%s: param '%s': a bf16-sr master with f32 moments on a device-resident "
                             "engine (choose low-precision moments, which step there)", op, p->name);
        return fsdp_adamw_dev(p, w, o);
    }
    const int64_t index0 = p->start * fsdp_row_elems(p);
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
        if (wsc) fsdp_master_decode(&grp->optim, wp + lpx_dtype_nbytes(wd, (int64_t)at), wsc + at / (size_t)p->wblock,
                                    pw, k);
        else if (wd != fsdp_math_dtype) fsdp_to_f32(wd, wp + lpx_dtype_nbytes(wd, (int64_t)at), pw, k);
        if (gd != fsdp_math_dtype) fsdp_to_f32(gd, gp + lpx_dtype_nbytes(gd, (int64_t)at), pg, k);
        float *m = p->m + at, *v = p->v + at;
        for (size_t i = 0; i < k; i++) {
            float gi = g[i];
            m[i] = b1 * m[i] + omb1 * gi;
            v[i] = b2 * v[i] + omb2 * gi * gi;
            float mh = m[i] / bc1, vh = v[i] / bc2;
            x[i] = x[i] * decay - lr * mh / (sqrtf(vh) + eps);
        }
        if (wsc) fsdp_master_encode(&grp->optim, pw, wp + lpx_dtype_nbytes(wd, (int64_t)at), wsc + at / (size_t)p->wblock,
                                    k, p->pid, p->step, index0 + (int64_t)at);
        else if (sr) fsdp_store_sr(pw, wp + lpx_dtype_nbytes(wd, (int64_t)at), k, grp->optim.seed, p->pid, p->step,
                              index0 + (int64_t)at);
        else if (wd != fsdp_math_dtype) fsdp_from_f32(wd, pw, wp + lpx_dtype_nbytes(wd, (int64_t)at), k);
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
        lpx_status st = step_param(g, &g->p[i], &o);
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
    if (g->optim.state != LPX_FSDP_STATE_F32) {
        /* low-precision moments: no f32 array to view; a copy dequantizes */
        if (view)
            return lpx_error(LPX_EINVAL, "%s(%s): param '%s' has %s moments (state tensors): read them with "
                             "lpx_fsdp_param_optim_state", op, g->name, p->name, fsdp_state_name(g->optim.state));
        lpx_tensor *src[2] = {p->ms, p->vs};
        for (int k = 0; k < 2; k++) {
            if (!outs[k]) continue;
            lpx_tensor *d = NULL;
            st = src[k] ? lpx_kind_to_dense(src[k], &d)
                        : lpx_zeros(lpx_tensor_ndim(w), lpx_tensor_shape(w), fsdp_math_dtype, lpx_cpu(), &d);
            if (st) {
                lpx_tensor_release(t[0]);
                return dt_prefix(st, "%s(%s): param '%s'", op, g->name, p->name);
            }
            t[k] = d;
        }
        if (m) *m = t[0];
        if (v) *v = t[1];
        if (step) *step = p->step;
        return LPX_OK;
    }
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
        lpx_tensor_release(p->ms);
        lpx_tensor_release(p->vs);
        p->mt = p->vt = p->ms = p->vs = NULL;
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
    if (g->optim.state != LPX_FSDP_STATE_F32) {
        /* low-precision moments: f32 values are quantized (a checkpoint
         * resharded across block boundaries, a conversion from f32) */
        lpx_tensor *q[2] = {NULL, NULL}, *c[2] = {NULL, NULL};
        for (int k = 0; k < 2 && !st; k++) {
            if (!(st = lpx_contiguous((lpx_tensor *)in[k], &c[k])))
                st = fsdp_state_quantize(&g->optim, k, c[k], lpx_tensor_ndim(w), lpx_tensor_shape(w), &q[k]);
            if (!st && lpx_tensor_device(w).type != LPX_DEVICE_CPU) {
                lpx_tensor *d = NULL;
                st = lpx_tensor_to(q[k], lpx_tensor_device(w), &d);
                lpx_tensor_release(q[k]);
                q[k] = d;
            }
        }
        lpx_tensor_release(c[0]);
        lpx_tensor_release(c[1]);
        if (st) {
            lpx_tensor_release(q[0]);
            lpx_tensor_release(q[1]);
            return dt_prefix(st, "%s(%s): param '%s': quantizing the moments", op, g->name, p->name);
        }
        lpx_tensor_release(p->ms);
        lpx_tensor_release(p->vs);
        p->ms = q[0];
        p->vs = q[1];
        p->step = step;
        return LPX_OK;
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

/* ---- the group's optimizer choice (issue 37) ---------------------------- */

lpx_status lpx_fsdp_group_set_optim(lpx_fsdp_group *g, const lpx_fsdp_optim *o)
{
    const char *op = "lpx_fsdp_group_set_optim";
    if (!g) return lpx_error(LPX_EINVAL, "%s: g is NULL", op);
    if (g->f->sharded)
        return lpx_error(LPX_EINVAL, "%s(%s): after lpx_fsdp_shard (the block decides the shards: choose before)", op,
                         g->name);
    lpx_fsdp_optim c;
    memset(&c, 0, sizeof c);
    if (o) {
        size_t n = o->struct_size && o->struct_size < sizeof c ? o->struct_size : sizeof c;
        memcpy(&c, o, n);
    }
    c.struct_size = sizeof c;
    char what[96];
    snprintf(what, sizeof what, "%s(%s)", op, g->name);
    lpx_status st = fsdp_optim_check(what, &c);
    if (st) return st;
    g->optim = c;
    return LPX_OK;
}

lpx_status lpx_fsdp_group_get_optim(const lpx_fsdp_group *g, lpx_fsdp_optim *o)
{
    if (!g || !o) return lpx_error(LPX_EINVAL, "lpx_fsdp_group_get_optim: %s is NULL", g ? "o" : "g");
    *o = g->optim;
    o->struct_size = sizeof *o;
    return LPX_OK;
}

lpx_status lpx_fsdp_param_optim_state(const lpx_fsdp_group *g, int i, lpx_tensor **m, lpx_tensor **v, int64_t *step)
{
    const char *op = "lpx_fsdp_param_optim_state";
    fsdp_param *p = NULL;
    lpx_tensor *w = NULL;
    if (m) *m = NULL;
    if (v) *v = NULL;
    lpx_status st = state_param(g, i, op, &p, &w);
    if (st) return st;
    if (g->optim.state == LPX_FSDP_STATE_F32)
        return lpx_error(LPX_EINVAL, "%s(%s): param '%s' has f32 moments: read them with lpx_fsdp_param_adamw_view", op,
                         g->name, p->name);
    if (m && p->ms) lpx_tensor_retain(*m = p->ms);
    if (v && p->vs) lpx_tensor_retain(*v = p->vs);
    if (step) *step = p->step;
    return LPX_OK;
}

lpx_status lpx_fsdp_param_set_optim_state(lpx_fsdp_group *g, int i, lpx_tensor *m, lpx_tensor *v, int64_t step)
{
    const char *op = "lpx_fsdp_param_set_optim_state";
    fsdp_param *p = NULL;
    lpx_tensor *w = NULL;
    lpx_status st = state_param(g, i, op, &p, &w);
    if (st) return st;
    if (g->optim.state == LPX_FSDP_STATE_F32)
        return lpx_error(LPX_EINVAL, "%s(%s): param '%s' has f32 moments: restore them with "
                         "lpx_fsdp_param_set_adamw_state", op, g->name, p->name);
    if (step < 0) return lpx_error(LPX_EINVAL, "%s(%s): param '%s': step %lld is negative", op, g->name, p->name, (long long)step);
    if (!m != !v) return lpx_error(LPX_EINVAL, "%s(%s): param '%s': give both m and v, or neither", op, g->name, p->name);
    if (!m && step)
        return lpx_error(LPX_EINVAL, "%s(%s): param '%s': step %lld without m and v", op, g->name, p->name, (long long)step);
    lpx_tensor *in[2] = {m, v};
    for (int k = 0; k < 2 && m; k++) {
        const char *why = NULL;
        lpx_device d = lpx_tensor_device(in[k]), wd = lpx_tensor_device(w);
        if (fsdp_state_check(&g->optim, in[k], k, lpx_tensor_numel(w), &why) == LPX_OK && (d.type != wd.type || d.index != wd.index))
            why = "on the weight's device";
        if (why)
            return lpx_error(LPX_EINVAL, "%s(%s): param '%s': %s must be %s (%s, block %lld, %lld elements)", op, g->name,
                             p->name, k ? "v" : "m", why, fsdp_state_name(g->optim.state), (long long)g->optim.block,
                             (long long)lpx_tensor_numel(w));
    }
    if (m) {
        lpx_tensor_retain(m);
        lpx_tensor_retain(v);
    }
    lpx_tensor_release(p->ms);
    lpx_tensor_release(p->vs);
    p->ms = m;
    p->vs = v;
    p->step = step;
    return LPX_OK;
}

/* bytes a tensor holds: its storage, or its inner tensors' */
static int64_t held_bytes(const lpx_tensor *t)
{
    int n = lpx_tensor_inner_count(t);
    if (!lpx_tensor_kind(t) || n <= 0) return lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
    int64_t b = 0;
    for (int i = 0; i < n; i++) b += held_bytes(lpx_tensor_inner(t, i));
    return b;
}

lpx_status lpx_fsdp_optim_bytes(const lpx_fsdp *f, int64_t *state, int64_t *master, int64_t *params)
{
    const char *op = "lpx_fsdp_optim_bytes";
    if (!f) return lpx_error(LPX_EINVAL, "%s: f is NULL", op);
    if (!f->sharded) return lpx_error(LPX_EINVAL, "%s: before lpx_fsdp_shard", op);
    int64_t sb = 0, mb = 0, np = 0;
    for (int gi = 0; gi < f->ng; gi++) {
        const lpx_fsdp_group *g = f->g[gi];
        for (int i = 0; i < g->n; i++) {
            const fsdp_param *p = &g->p[i];
            if (p->flags & LPX_FSDP_FROZEN) continue;
            lpx_tensor *w = weight_of(fsdp_local(p));
            if (!w) continue;
            int64_t n = lpx_tensor_numel(w);
            np += n;
            mb += held_bytes(w) + (w == fsdp_local(p) && p->wsc ? held_bytes(p->wsc) : 0);
            if (g->optim.state == LPX_FSDP_STATE_F32) {
                sb += 2 * lpx_dtype_nbytes(fsdp_math_dtype, n);
            } else if (p->ms) {
                sb += held_bytes(p->ms) + held_bytes(p->vs);
            } else {
                /* what the first step makes: measured on zero states */
                lpx_tensor *t[2] = {NULL, NULL};
                lpx_status st = fsdp_state_new(&g->optim, 0, lpx_tensor_ndim(w), lpx_tensor_shape(w), lpx_cpu(), &t[0]);
                if (!st) st = fsdp_state_new(&g->optim, 1, lpx_tensor_ndim(w), lpx_tensor_shape(w), lpx_cpu(), &t[1]);
                if (!st) sb += held_bytes(t[0]) + held_bytes(t[1]);
                lpx_tensor_release(t[0]);
                lpx_tensor_release(t[1]);
                if (st) return dt_prefix(st, "%s(%s): param '%s'", op, g->name, p->name);
            }
        }
    }
    if (state) *state = sb;
    if (master) *master = mb;
    if (params) *params = np;
    return LPX_OK;
}

/* ---- the scaled-f16 master's scales -------------------------------------- */

lpx_status lpx_fsdp_param_master_scale(const lpx_fsdp_group *g, int i, lpx_tensor **scale)
{
    const char *op = "lpx_fsdp_param_master_scale";
    fsdp_param *p = NULL;
    lpx_tensor *w = NULL;
    if (!scale) return lpx_error(LPX_EINVAL, "%s: scale is NULL", op);
    *scale = NULL;
    lpx_status st = state_param(g, i, op, &p, &w);
    if (st) return st;
    if (p->wsc) lpx_tensor_retain(p->wsc);
    *scale = p->wsc;
    return LPX_OK;
}

lpx_status lpx_fsdp_param_set_master_scale(lpx_fsdp_group *g, int i, const lpx_tensor *scale)
{
    const char *op = "lpx_fsdp_param_set_master_scale";
    fsdp_param *p = NULL;
    lpx_tensor *w = NULL;
    if (!scale) return lpx_error(LPX_EINVAL, "%s: scale is NULL", op);
    lpx_status st = state_param(g, i, op, &p, &w);
    if (st) return st;
    if (!p->wsc)
        return lpx_error(LPX_EINVAL, "%s(%s): param '%s' has no scaled-f16 master", op, g->name, p->name);
    if (lpx_tensor_kind(scale) || lpx_tensor_dtype(scale) != lpx_tensor_dtype(p->wsc) ||
        lpx_tensor_numel(scale) != lpx_tensor_numel(p->wsc))
        return lpx_error(LPX_EINVAL, "%s(%s): param '%s': the scales must be %lld dense values of the engine's dtype",
                         op, g->name, p->name, (long long)lpx_tensor_numel(p->wsc));
    lpx_tensor *h = NULL, *flat = NULL;
    int64_t all = -1;
    if (!(st = lpx_reshape((lpx_tensor *)scale, 1, &all, &flat))) st = lpx_copy_(p->wsc, flat);
    lpx_tensor_release(flat);
    lpx_tensor_release(h);
    return st;
}

lpx_status lpx_fsdp_param_master_dense(const lpx_fsdp_group *g, int i, lpx_tensor **out)
{
    const char *op = "lpx_fsdp_param_master_dense";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!g) return lpx_error(LPX_EINVAL, "%s: g is NULL", op);
    if (i < 0 || i >= g->n) return lpx_error(LPX_EINVAL, "%s(%s): param %d out of range (0..%d)", op, g->name, i, g->n - 1);
    if (!g->f->sharded) return lpx_error(LPX_EINVAL, "%s(%s): before lpx_fsdp_shard", op, g->name);
    const fsdp_param *p = &g->p[i];
    lpx_tensor *loc = fsdp_local(p), *w = weight_of(loc), *h = NULL;
    if (p->wsc) return fsdp_master_dequant(p->wblock, loc, p->wsc, out);
    if (!w) return lpx_kind_to_dense(loc, out);
    lpx_status st = lpx_tensor_to(w, lpx_cpu(), &h);
    if (!st) st = lpx_cast(h, fsdp_math_dtype, false, out);
    lpx_tensor_release(h);
    return st;
}
