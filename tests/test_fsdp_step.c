/* The fsdp tests, a 2-layer model whose loss, grads and AdamW step equal the
 * unsharded computation bit for bit, the fp8 gradient reduce-scatter, hybrid
 * sharding, mixed precision, LPX_FSDP_NO_DECAY and the AdamW state out and
 * in. */
#include "fsdp_util.h"

static const int64_t shp_w1[2] = {HID, IN}, shp_b1[1] = {HID}, shp_w2[2] = {OUT, HID}, shp_b2[1] = {OUT};

/* loss and grads of one rank's batch with the given full params */
static lpx_status fwd_bwd(int rank, lpx_tensor *const *p, float *loss, lpx_tensor **grads)
{
    const int64_t xs[2] = {BATCH, IN}, ys[2] = {BATCH, OUT};
    lpx_tensor *x = rand_normal(2, xs, 100 + (uint64_t)rank, 1.0, LPX_F32), *y = rand_normal(2, ys, 200 + (uint64_t)rank, 1.0, LPX_F32);
    lpx_tensor *pre = NULL, *h = NULL, *o = NULL, *l = NULL, *go = NULL, *got = NULL, *gh = NULL, *gp = NULL,
               *gpt = NULL;
    lpx_status st;
    int64_t d0 = 0;
    double v = 0;
    if ((st = lpx_linear(x, p[0], p[1], &pre)) || (st = lpx_relu(pre, &h)) || (st = lpx_linear(h, p[2], p[3], &o)) ||
        (st = lpx_mse_loss(o, y, &l)) || (st = lpx_item(l, 0, &v)))
        goto done;
    *loss = (float)v;
    if (grads) {
        if ((st = lpx_mse_loss_backward(o, y, 1.0, &go)) || (st = lpx_t(go, &got)) ||
            (st = lpx_matmul(got, h, &grads[2])) || (st = lpx_sum(go, 1, &d0, false, &grads[3])) ||
            (st = lpx_matmul(go, p[2], &gh)) || (st = lpx_relu_backward(gh, pre, &gp)) || (st = lpx_t(gp, &gpt)) ||
            (st = lpx_matmul(gpt, x, &grads[0])) || (st = lpx_sum(gp, 1, &d0, false, &grads[1])))
            goto done;
    }
done:;
    lpx_tensor *ts[] = {x, y, pre, h, o, l, go, got, gh, gp, gpt};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) lpx_tensor_release(ts[i]);
    return st;
}

/* the AdamW arithmetic of fsdp.h, on a whole f32 tensor */
static void adamw_ref(float *p, const float *g, size_t n, const lpx_adamw_opts *o)
{
    const float b1 = (float)o->beta1, b2 = (float)o->beta2, omb1 = (float)(1.0 - o->beta1),
                omb2 = (float)(1.0 - o->beta2), lr = (float)o->lr, eps = (float)o->eps,
                decay = (float)(1.0 - o->lr * o->weight_decay), bc1 = (float)(1.0 - o->beta1),
                bc2 = (float)(1.0 - o->beta2);
    for (size_t i = 0; i < n; i++) {
        float m = b1 * 0.0f + omb1 * g[i];
        float v = b2 * 0.0f + omb2 * g[i] * g[i];
        float mh = m / bc1, vh = v / bc2;
        p[i] = p[i] * decay - lr * mh / (sqrtf(vh) + eps);
    }
}

static lpx_status model_rank(lpx_comm *comm, void *vctx)
{
    model_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g[2];
    RCHECK_OK(r, lpx_fsdp_group_add(f, "layer1", &g[0]));
    RCHECK_OK(r, lpx_fsdp_group_add(f, "layer2", &g[1]));
    RCHECK_OK(r, lpx_fsdp_param_add(g[0], "w1", c->params[0], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(g[0], "b1", c->params[1], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(g[1], "w2", c->params[2], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(g[1], "b2", c->params[3], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 0.01;
    for (int step = 0; step < 2; step++) {
        RCHECK_OK(r, lpx_fsdp_unshard(g[0]));
        RCHECK_OK(r, lpx_fsdp_prefetch(g[1]));
        lpx_tensor *full[4] = {lpx_fsdp_param_full(g[0], 0), lpx_fsdp_param_full(g[0], 1),
                               lpx_fsdp_param_full(g[1], 0), lpx_fsdp_param_full(g[1], 1)};
        float loss = 0;
        lpx_tensor *grads[4] = {0};
        RCHECK_OK(r, fwd_bwd(r, full, &loss, step == 0 ? grads : NULL));
        if (loss != c->ref_loss[r][step]) rfail(r, "step %d: loss %.9g, unsharded %.9g", step, loss, c->ref_loss[r][step]);
        RCHECK_OK(r, lpx_fsdp_reshard(g[0]));
        RCHECK_OK(r, lpx_fsdp_reshard(g[1]));
        if (step) break;
        for (int i = 0; i < 4; i++) {
            RCHECK_OK(r, lpx_fsdp_set_grad(g[i / 2], i % 2, grads[i]));
            lpx_tensor_release(grads[i]);
        }
        for (int k = 1; k >= 0; k--) {
            RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g[k]));
            RCHECK_OK(r, lpx_fsdp_adamw_step(g[k], &o));
        }
        /* local grads and params == the matching rows of the reference */
        for (int i = 0; i < 4; i++) {
            lpx_tensor *rg = NULL, *rp = NULL;
            lpx_placement s0 = lpx_shard(0);
            lpx_mesh *mesh = lpx_dtensor_mesh(lpx_fsdp_param_dtensor(g[i / 2], i % 2));
            RCHECK_OK(r, lpx_dtensor_distribute(c->ref_grad[i], mesh, &s0, &rg));
            RCHECK_OK(r, lpx_dtensor_distribute(c->ref_param[i], mesh, &s0, &rp));
            if (rg && !same_bits(lpx_fsdp_param_grad(g[i / 2], i % 2), lpx_dtensor_local(rg)))
                rfail(r, "grad %d differs from the unsharded average", i);
            if (rp && !same_bits(lpx_fsdp_param_local(g[i / 2], i % 2), lpx_dtensor_local(rp)))
                rfail(r, "param %d after AdamW differs from the unsharded step", i);
            lpx_tensor_release(rg);
            lpx_tensor_release(rp);
        }
    }
    lpx_fsdp_free(f);
    return LPX_OK;
}

static lpx_status fp8g_rank(lpx_comm *comm, void *vctx)
{
    fp8g_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .fp8_grad_reduce = true};
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "l", &g));
    RCHECK_OK(r, lpx_fsdp_param_add(g, "w", c->avg, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    RCHECK_OK(r, lpx_fsdp_set_grad(g, 0, c->grads[r]));
    RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g));
    lpx_tensor *ref = NULL;
    lpx_placement s0 = lpx_shard(0);
    RCHECK_OK(r, lpx_dtensor_distribute(c->avg, lpx_dtensor_mesh(lpx_fsdp_param_dtensor(g, 0)), &s0, &ref));
    c->err[r] = ref ? max_abs_diff(lpx_fsdp_param_grad(g, 0), lpx_dtensor_local(ref)) : 1e30;
    c->got[r] = lpx_fsdp_param_grad(g, 0);
    lpx_tensor_retain(c->got[r]);
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    lpx_fsdp_stats_get(f, &s);
    c->amax_ar[r] = s.amax_allreduces;
    c->rs_bytes[r] = s.bytes[LPX_COLL_REDUCE_SCATTER];
    lpx_tensor_release(ref);
    lpx_fsdp_free(f);
    return LPX_OK;
}

static lpx_status hyb_rank(lpx_comm *world, void *vctx)
{
    hyb_ctx *c = vctx;
    int g = lpx_comm_rank(world);
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *grp = NULL;
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .fp8_grad_reduce = c->fp8};
    RCHECK_OK(g, lpx_mesh_new_2d(c->outer[g], c->inner[g], &mesh));
    RCHECK_OK(g, lpx_fsdp_new(mesh, &cfg, &f));
    lpx_mesh_release(mesh);
    if (f) {
        RCHECK_OK(g, lpx_fsdp_group_add(f, "l", &grp));
        RCHECK_OK(g, lpx_fsdp_param_add(grp, "w", c->avg, 0, NULL));
        RCHECK_OK(g, lpx_fsdp_shard(f));
        RCHECK_OK(g, lpx_fsdp_set_grad(grp, 0, c->grads[g]));
        RCHECK_OK(g, lpx_fsdp_reduce_scatter_grads(grp));
        c->got[g] = lpx_fsdp_param_grad(grp, 0);
        lpx_tensor_retain(c->got[g]);
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        lpx_fsdp_stats_get(f, &s);
        c->amax_ar[g] = s.amax_allreduces;
        lpx_fsdp_free(f);
    }
    lpx_comm_destroy(c->outer[g]);
    lpx_comm_destroy(c->inner[g]);
    return LPX_OK;
}

/* ---- AdamW reference at step t (the fsdp.h formulas, f32) ----------- */

static void adamw_ref_t(float *p, float *m, float *v, const float *g, size_t n, const lpx_adamw_opts *o, int t)
{
    const float b1 = (float)o->beta1, b2 = (float)o->beta2, omb1 = (float)(1.0 - o->beta1),
                omb2 = (float)(1.0 - o->beta2), lr = (float)o->lr, eps = (float)o->eps,
                decay = (float)(1.0 - o->lr * o->weight_decay), bc1 = (float)(1.0 - pow(o->beta1, (double)t)),
                bc2 = (float)(1.0 - pow(o->beta2, (double)t));
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + omb1 * g[i];
        v[i] = b2 * v[i] + omb2 * g[i] * g[i];
        float mh = m[i] / bc1, vh = v[i] / bc2;
        p[i] = p[i] * decay - lr * mh / (sqrtf(vh) + eps);
    }
}

/* a dense tensor's elements as a new f32 array (caller frees) */
static float *to_f32_array(lpx_tensor *t)
{
    size_t n = (size_t)lpx_tensor_numel(t);
    float *a = malloc((n ? n : 1) * sizeof *a);
    lpx_tensor *c = NULL;
    if (a && !lpx_contiguous(t, &c) && n) lpx_convert(a, LPX_F32, lpx_tensor_data(c), lpx_tensor_dtype(t), n, 0);
    lpx_tensor_release(c);
    return a;
}

static lpx_status mp_rank(lpx_comm *comm, void *vctx)
{
    mp_ctx *c = vctx;
    int r = lpx_comm_rank(comm), w = lpx_comm_size(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .param_dtype = LPX_BF16, .keep_storage = c->keep};
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "mp", &g));
    for (int i = 0; i < MP_N; i++) RCHECK_OK(r, lpx_fsdp_param_add(g, "p", c->full[i], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    /* 1. the gathered tensor == cast(full f32 -> bf16), bit for bit */
    RCHECK_OK(r, lpx_fsdp_unshard(g));
    uint64_t want_bytes = 0;
    for (int i = 0; i < MP_N; i++) {
        lpx_tensor *full = lpx_fsdp_param_full(g, i), *loc = lpx_fsdp_param_local(g, i);
        want_bytes += (uint64_t)lpx_tensor_numel(c->expect[i]) * 2;
        if (!full || lpx_tensor_dtype(full) != LPX_BF16) rfail(r, "param %d: unsharded tensor is not bf16", i);
        else if (!same_bits(full, c->expect[i])) rfail(r, "param %d: gathered bf16 != cast of the full f32", i);
        if (!loc || lpx_tensor_dtype(loc) != lpx_tensor_dtype(c->full[i]))
            rfail(r, "param %d: local shard lost its master dtype", i);
    }
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    RCHECK(r, s.calls[LPX_COLL_ALL_GATHER] == 1);
    if (s.unsharded_bytes != want_bytes)
        rfail(r, "unsharded bytes %llu, bf16 size %llu", (unsigned long long)s.unsharded_bytes,
              (unsigned long long)want_bytes);
    RCHECK_OK(r, lpx_fsdp_reshard(g));
    /* 2. AdamW updates the f32 master shard (bf16 grads, as FSDP2 makes them) */
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 0.01;
    float *ref[MP_N] = {0};
    for (int i = 0; i < MP_N; i++) {
        lpx_tensor *gr = NULL;
        RCHECK_OK(r, lpx_randn(lpx_tensor_ndim(c->full[i]), lpx_tensor_shape(c->full[i]), 40 + (uint64_t)(r * 8 + i),
                               LPX_BF16, lpx_cpu(), &gr));
        RCHECK_OK(r, lpx_fsdp_set_grad(g, i, gr));
        lpx_tensor_release(gr);
        ref[i] = to_f32_array(lpx_fsdp_param_local(g, i));
    }
    RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g));
    RCHECK_OK(r, lpx_fsdp_adamw_step(g, &o));
    for (int i = 0; i < MP_N; i++) {
        lpx_tensor *loc = lpx_fsdp_param_local(g, i), *gd = lpx_fsdp_param_grad(g, i);
        size_t n = (size_t)lpx_tensor_numel(loc);
        float *gv = gd ? to_f32_array(gd) : NULL, *m = calloc(n + 1, sizeof *m), *v = calloc(n + 1, sizeof *v);
        if (!gv || !m || !v || !ref[i] || (size_t)lpx_tensor_numel(gd) != n) {
            rfail(r, "param %d: no grad or out of memory", i);
        } else {
            adamw_ref_t(ref[i], m, v, gv, n, &o, 1);
            if (i < 3) {
                /* the f32 master got the f32 update (not a bf16-rounded one) */
                if (lpx_tensor_dtype(loc) != LPX_F32 || (n && memcmp(lpx_tensor_data(loc), ref[i], n * 4)))
                    rfail(r, "param %d: f32 master after AdamW != the f32 reference", i);
                bool low = false;
                for (size_t k = 0; k < n; k++) {
                    uint32_t u;
                    memcpy(&u, &ref[i][k], 4);
                    low |= (u & 0xffffu) != 0;
                }
                if (n > 4 && !low) rfail(r, "param %d: the master holds only bf16 values", i);
            } else {
                uint16_t *enc = malloc((n + 1) * 2);
                if (enc) lpx_convert(enc, LPX_BF16, ref[i], LPX_F32, n, 0);
                if (!enc || (n && memcmp(lpx_tensor_data(loc), enc, n * 2)))
                    rfail(r, "param %d: bf16 param after AdamW != the reference", i);
                free(enc);
            }
        }
        free(gv);
        free(m);
        free(v);
        free(ref[i]);
    }
    /* 3. the next unshard gathers cast(updated master): this rank's rows */
    RCHECK_OK(r, lpx_fsdp_unshard(g));
    for (int i = 0; i < MP_N; i++) {
        lpx_tensor *full = lpx_fsdp_param_full(g, i), *rows = NULL, *cast = NULL;
        int64_t ch, s0, len;
        lpx_shard_range(lpx_tensor_shape(c->full[i])[0], w, r, 1, &ch, &s0, &len);
        if (!full) {
            rfail(r, "param %d: not unsharded after the step", i);
            continue;
        }
        RCHECK_OK(r, lpx_narrow(full, 0, s0, len, &rows));
        RCHECK_OK(r, lpx_cast(lpx_fsdp_param_local(g, i), LPX_BF16, false, &cast));
        if (!same_bits(rows, cast)) rfail(r, "param %d: gathered rows != bf16 cast of the updated master", i);
        lpx_tensor_release(rows);
        lpx_tensor_release(cast);
    }
    RCHECK_OK(r, lpx_fsdp_reshard(g));
    lpx_fsdp_free(f);
    return LPX_OK;
}

/* group "dec" (wd 0.1): params d (decayed) and n (NO_DECAY); group "ref"
 * (wd 0): param z. Same init, same grads, two steps. */
static lpx_status nd_rank(lpx_comm *comm, void *vctx)
{
    nd_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *gd = NULL, *gz = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "dec", &gd));
    RCHECK_OK(r, lpx_fsdp_group_add(f, "ref", &gz));
    RCHECK_OK(r, lpx_fsdp_param_add(gd, "d", c->p, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(gd, "n", c->p, LPX_FSDP_NO_DECAY, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(gz, "z", c->p, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_adamw_opts od = lpx_adamw_opts_default(), oz;
    od.lr = 0.01;
    od.weight_decay = 0.1;
    oz = od;
    oz.weight_decay = 0;
    float *ref_d = to_f32_array(lpx_fsdp_param_local(gd, 0)), *ref_n = to_f32_array(lpx_fsdp_param_local(gd, 0));
    size_t n = (size_t)lpx_tensor_numel(lpx_fsdp_param_local(gd, 0));
    float *md = calloc(n + 1, 4), *vd = calloc(n + 1, 4), *mn = calloc(n + 1, 4), *vn = calloc(n + 1, 4);
    if (!ref_d || !ref_n || !md || !vd || !mn || !vn) rfail(r, "out of memory");
    for (int t = 1; t <= 2 && ref_d && ref_n && md && vd && mn && vn; t++) {
        lpx_tensor *gr = rand_normal(lpx_tensor_ndim(c->p), lpx_tensor_shape(c->p), 70 + (uint64_t)(r * 4 + t), 1.0, LPX_F32);
        RCHECK_OK(r, lpx_fsdp_set_grad(gd, 0, gr));
        RCHECK_OK(r, lpx_fsdp_set_grad(gd, 1, gr));
        RCHECK_OK(r, lpx_fsdp_set_grad(gz, 0, gr));
        lpx_tensor_release(gr);
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(gd));
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(gz));
        RCHECK_OK(r, lpx_fsdp_adamw_step(gd, &od));
        RCHECK_OK(r, lpx_fsdp_adamw_step(gz, &oz));
        lpx_tensor *gl = lpx_fsdp_param_grad(gd, 0);
        if (!gl || (size_t)lpx_tensor_numel(gl) != n || lpx_tensor_dtype(gl) != LPX_F32) {
            rfail(r, "step %d: no f32 grad shard", t);
            break;
        }
        const float *gv = lpx_tensor_data(gl);
        adamw_ref_t(ref_d, md, vd, gv, n, &od, t);
        adamw_ref_t(ref_n, mn, vn, gv, n, &oz, t);
        const void *pd = lpx_tensor_data(lpx_fsdp_param_local(gd, 0)), *pn = lpx_tensor_data(lpx_fsdp_param_local(gd, 1)),
                   *pz = lpx_tensor_data(lpx_fsdp_param_local(gz, 0));
        if (n && memcmp(pn, ref_n, n * 4)) rfail(r, "step %d: NO_DECAY param != AdamW without decay", t);
        if (n && memcmp(pn, pz, n * 4)) rfail(r, "step %d: NO_DECAY param != the engine's wd=0 step", t);
        if (n && memcmp(pd, ref_d, n * 4)) rfail(r, "step %d: decayed param != AdamW with decay", t);
        /* decay is real: p*(1 - lr*wd) moves every element that is not tiny */
        size_t diff = 0;
        for (size_t k = 0; k < n; k++) diff += ((const float *)pd)[k] != ((const float *)pn)[k];
        if (n && diff < n / 2) rfail(r, "step %d: decay changed only %zu of %zu elements", t, diff, n);
    }
    free(ref_d);
    free(ref_n);
    free(md);
    free(vd);
    free(mn);
    free(vn);
    lpx_fsdp_free(f);
    return LPX_OK;
}

/* engine A steps twice; engine B gets A's weights and AdamW state through
 * lpx_fsdp_param_adamw_state / set_adamw_state; one more step with the
 * same grad gives the same bits on both */
static lpx_status as_rank(lpx_comm *comm, void *vctx)
{
    as_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *fa = NULL, *fb = NULL;
    lpx_fsdp_group *ga = NULL, *gb = NULL;
    lpx_status st = new_engine(comm, NULL, &fa);
    if (!st) st = new_engine(comm, NULL, &fb);
    if (st) {
        lpx_fsdp_free(fa);
        return st;
    }
    RCHECK_OK(r, lpx_fsdp_group_add(fa, "a", &ga));
    RCHECK_OK(r, lpx_fsdp_group_add(fb, "b", &gb));
    RCHECK_OK(r, lpx_fsdp_param_add(ga, "w", c->p, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(ga, "frozen", c->p, LPX_FSDP_FROZEN, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(gb, "w", c->p, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(gb, "frozen", c->p, LPX_FSDP_FROZEN, NULL));
    lpx_tensor *m = NULL, *v = NULL;
    int64_t step = -1;
    /* before shard: refused */
    RCHECK(r, lpx_fsdp_param_adamw_state(ga, 0, &m, &v, &step) == LPX_EINVAL);
    RCHECK_OK(r, lpx_fsdp_shard(fa));
    RCHECK_OK(r, lpx_fsdp_shard(fb));
    /* before the first step: zeros, step 0 */
    RCHECK_OK(r, lpx_fsdp_param_adamw_state(ga, 0, &m, &v, &step));
    size_t n = (size_t)lpx_tensor_numel(lpx_fsdp_param_local(ga, 0));
    RCHECK(r, step == 0 && m && v && (size_t)lpx_tensor_numel(m) == n && lpx_tensor_dtype(v) == LPX_F32);
    for (size_t k = 0; m && k < n; k++) RCHECK(r, ((const float *)lpx_tensor_data(m))[k] == 0.0f);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    m = v = NULL;
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 0.01;
    for (int t = 1; t <= 3; t++) {
        lpx_tensor *gr = rand_normal(lpx_tensor_ndim(c->p), lpx_tensor_shape(c->p), 90 + (uint64_t)(r * 4 + t), 1.0, LPX_F32);
        RCHECK_OK(r, lpx_fsdp_set_grad(ga, 0, gr));
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(ga));
        RCHECK_OK(r, lpx_fsdp_adamw_step(ga, &o));
        if (t == 3) {
            RCHECK_OK(r, lpx_fsdp_set_grad(gb, 0, gr));
            RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(gb));
            RCHECK_OK(r, lpx_fsdp_adamw_step(gb, &o));
        }
        lpx_tensor_release(gr);
        if (t == 2) {
            /* B = A: the weights (a checkpoint's model) and the state */
            RCHECK_OK(r, lpx_fsdp_param_adamw_state(ga, 0, &m, &v, &step));
            RCHECK(r, step == 2);
            if (n) memcpy(lpx_tensor_data(lpx_fsdp_param_local(gb, 0)), lpx_tensor_data(lpx_fsdp_param_local(ga, 0)), n * 4);
            RCHECK_OK(r, lpx_fsdp_param_set_adamw_state(gb, 0, m, v, step));
            /* refusals change nothing */
            RCHECK(r, lpx_fsdp_param_set_adamw_state(gb, 1, m, v, step) == LPX_EINVAL);  /* frozen */
            RCHECK(r, lpx_fsdp_param_set_adamw_state(gb, 0, m, NULL, step) == LPX_EINVAL);
            RCHECK(r, lpx_fsdp_param_set_adamw_state(gb, 0, m, v, -1) == LPX_EINVAL);
            RCHECK(r, lpx_fsdp_param_set_adamw_state(gb, 0, NULL, NULL, 3) == LPX_EINVAL);
            RCHECK(r, lpx_fsdp_param_set_adamw_state(gb, 2, m, v, step) == LPX_EINVAL);
            RCHECK(r, lpx_fsdp_param_adamw_state(gb, 1, NULL, NULL, &step) == LPX_EINVAL);
            lpx_tensor *wrong = NULL;
            int64_t ws[1] = {(int64_t)n + 1};
            RCHECK_OK(r, lpx_zeros(1, ws, LPX_F32, lpx_cpu(), &wrong));
            RCHECK(r, lpx_fsdp_param_set_adamw_state(gb, 0, wrong, wrong, step) == LPX_EINVAL);
            lpx_tensor_release(wrong);
            lpx_tensor_release(m);
            lpx_tensor_release(v);
            m = v = NULL;
        }
    }
    const void *pa = lpx_tensor_data(lpx_fsdp_param_local(ga, 0)), *pb = lpx_tensor_data(lpx_fsdp_param_local(gb, 0));
    if (n && memcmp(pa, pb, n * 4)) rfail(r, "the step after restoring the AdamW state differs");
    int64_t sa = 0, sb = 0;
    lpx_tensor *ma = NULL, *mb = NULL;
    RCHECK_OK(r, lpx_fsdp_param_adamw_state(ga, 0, &ma, NULL, &sa));
    RCHECK_OK(r, lpx_fsdp_param_adamw_state(gb, 0, &mb, NULL, &sb));
    RCHECK(r, sa == 3 && sb == 3 && ma && mb && (!n || !memcmp(lpx_tensor_data(ma), lpx_tensor_data(mb), n * 4)));
    lpx_tensor_release(ma);
    lpx_tensor_release(mb);
    /* no m and v with step 0: back to no state */
    RCHECK_OK(r, lpx_fsdp_param_set_adamw_state(gb, 0, NULL, NULL, 0));
    RCHECK_OK(r, lpx_fsdp_param_adamw_state(gb, 0, NULL, NULL, &sb));
    RCHECK(r, sb == 0);
    lpx_fsdp_free(fa);
    lpx_fsdp_free(fb);
    return LPX_OK;
}

static void test_two_layer_step(void)
{
    for (int wi = 0; wi < NWORLDS; wi++) {
        int w = worlds[wi];
        model_ctx c;
        memset(&c, 0, sizeof c);
        c.params[0] = rand_normal(2, shp_w1, 1, 1.0, LPX_F32);
        c.params[1] = rand_normal(1, shp_b1, 2, 1.0, LPX_F32);
        c.params[2] = rand_normal(2, shp_w2, 3, 1.0, LPX_F32);
        c.params[3] = rand_normal(1, shp_b2, 4, 1.0, LPX_F32);
        /* the unsharded computation: per-rank grads, f32 sum in rank order / N */
        for (int r = 0; r < w; r++) {
            lpx_tensor *gr[4] = {0};
            CHECK_OK(fwd_bwd(r, c.params, &c.ref_loss[r][0], gr));
            for (int i = 0; i < 4; i++) {
                if (!r) CHECK_OK(lpx_clone(gr[i], &c.ref_grad[i]));
                else {
                    float *a = lpx_tensor_data(c.ref_grad[i]);
                    const float *b = lpx_tensor_data(gr[i]);
                    for (int64_t k = 0; k < lpx_tensor_numel(gr[i]); k++) a[k] += b[k];
                }
                lpx_tensor_release(gr[i]);
            }
        }
        lpx_adamw_opts o = lpx_adamw_opts_default();
        o.lr = 0.01;
        for (int i = 0; i < 4; i++) {
            float *a = lpx_tensor_data(c.ref_grad[i]);
            for (int64_t k = 0; k < lpx_tensor_numel(c.ref_grad[i]); k++) a[k] /= (float)w;
            CHECK_OK(lpx_clone(c.params[i], &c.ref_param[i]));
            adamw_ref(lpx_tensor_data(c.ref_param[i]), a, (size_t)lpx_tensor_numel(c.ref_grad[i]), &o);
        }
        for (int r = 0; r < w; r++) CHECK_OK(fwd_bwd(r, c.ref_param, &c.ref_loss[r][1], NULL));
        run_ranks(w, model_rank, &c);
        for (int i = 0; i < 4; i++) {
            lpx_tensor_release(c.params[i]);
            lpx_tensor_release(c.ref_grad[i]);
            lpx_tensor_release(c.ref_param[i]);
        }
    }
}

static void test_fp8_grad_reduce(void)
{
    const int w = 4;
    const int64_t s[2] = {50, 16};
    fp8g_ctx c;
    memset(&c, 0, sizeof c);
    CHECK_OK(lpx_zeros(2, s, LPX_F32, lpx_cpu(), &c.avg));
    for (int r = 0; r < w; r++) {
        c.grads[r] = rand_normal(2, s, 300 + (uint64_t)r, 1.0, LPX_F32);
        CHECK_OK(lpx_add_out(c.avg, c.grads[r], c.avg));
        lpx_tensor *a = NULL;
        double v;
        CHECK_OK(lpx_amax(c.grads[r], 0, NULL, false, &a));
        CHECK_OK(lpx_item(a, 0, &v));
        c.amax = v > c.amax ? v : c.amax;
        lpx_tensor_release(a);
    }
    float *a = lpx_tensor_data(c.avg);
    for (int k = 0; k < 50 * 16; k++) a[k] /= (float)w;
    run_ranks(w, fp8g_rank, &c);
    /* bit-exact against the recipe: shared scale s = e5m2_max / (amax * N),
     * each rank's x * s encoded saturating, the codes decoded and summed
     * in rank order in f32, the sum encoded once (the comm layer's fp8
     * reduction), times 1 / (s * N) */
    float s8 = (float)(57344.0 / (c.amax * w)), unscale = (float)(1.0 / ((double)s8 * w));
    for (int r = 0; r < w; r++) {
        int64_t rows = r * 13 + 13 <= 50 ? 13 : (r * 13 < 50 ? 50 - r * 13 : 0);
        CHECK(c.got[r] && lpx_tensor_numel(c.got[r]) == rows * 16 && lpx_tensor_dtype(c.got[r]) == LPX_F32);
        if (!c.got[r] || lpx_tensor_numel(c.got[r]) != rows * 16) {
            lpx_tensor_release(c.got[r]);
            continue;
        }
        int bad = 0;
        for (int64_t k = 0; k < rows * 16; k++) {
            float sum = 0, v, dec;
            uint8_t code;
            for (int q = 0; q < w; q++) {
                v = ((const float *)lpx_tensor_data(c.grads[q]))[r * 13 * 16 + k] * s8;
                /* the recipe through the independent codec (tests/fp8_ref.h) */
                code = ref_fp8_code(LPX_F8E5M2, v, 1);
                dec = (float)ref_e5m2(code);
                sum = q ? sum + dec : dec;
            }
            code = ref_fp8_code(LPX_F8E5M2, sum, 1);
            dec = (float)ref_e5m2(code);
            float want = dec * unscale, have = ((const float *)lpx_tensor_data(c.got[r]))[k];
            if (memcmp(&want, &have, sizeof want) && !bad++)
                CHECKF(0, "rank %d element %lld: fp8 reduce-scatter gave %a, the recipe %a", r, (long long)k,
                       (double)have, (double)want);
        }
        lpx_tensor_release(c.got[r]);
    }
    for (int r = 0; r < w; r++) {
        /* e5m2 (2 mantissa bits) per rank, and once more for the sum:
         * each rounding is within 1/8 of its value, so the worst case is
         * (1/8 + 9/64) of the amax; with these normal grads the error stays
         * within 1/8 of it (the bf16 wire's bound; measured ~0.05) */
        CHECKF(c.err[r] <= 0.125 * c.amax, "rank %d: fp8 grad error %g (amax %g)", r, c.err[r], c.amax);
        CHECK(c.err[r] > 0); /* it really went through fp8 */
        CHECK(c.amax_ar[r] == 1);
        /* the fp8 codes are the wire: chunk 13 rows x 16 x 4 ranks, 1 byte per element (bf16: 2) */
        CHECKF(c.rs_bytes[r] == (uint64_t)13 * 16 * 4 * 1, "rank %d: %llu reduce-scatter bytes, expected %d", r,
               (unsigned long long)c.rs_bytes[r], 13 * 16 * 4);
        lpx_tensor_release(c.grads[r]);
    }
    lpx_tensor_release(c.avg);
}

/* 2 replicas x 2 shards: every rank's grad shard is the average over all
 * four ranks (plain: to f32 rounding; fp8: within the fp8 bound), and the
 * two replicas of a shard hold the same bits (fp8: one scale over the
 * whole mesh, its amax MAX-reduced over both comms). */
static void test_hybrid_grad_reduce(void)
{
    const int rows = 2, cols = 2, n = rows * cols;
    const int64_t s[2] = {9, 8};
    for (int fp8 = 0; fp8 < 2; fp8++) {
        hyb_ctx c;
        memset(&c, 0, sizeof c);
        c.fp8 = fp8;
        lpx_comm *tmp[MAXR];
        for (int j = 0; j < cols; j++) {
            CHECK_OK(lpx_local_comm_group_create(rows, tmp));
            for (int i = 0; i < rows; i++) c.outer[i * cols + j] = tmp[i];
        }
        for (int i = 0; i < rows; i++) {
            CHECK_OK(lpx_local_comm_group_create(cols, tmp));
            for (int j = 0; j < cols; j++) c.inner[i * cols + j] = tmp[j];
        }
        double amax = 0;
        CHECK_OK(lpx_zeros(2, s, LPX_F32, lpx_cpu(), &c.avg));
        for (int r = 0; r < n; r++) {
            /* replica 1's grads are 8x larger: a per-replica scale would differ */
            c.grads[r] = rand_normal(2, s, 500 + (uint64_t)r, 1.0, LPX_F32);
            float *gv = lpx_tensor_data(c.grads[r]);
            for (int k = 0; r >= cols && k < 9 * 8; k++) gv[k] *= 8.0f;
            CHECK_OK(lpx_add_out(c.avg, c.grads[r], c.avg));
            for (int k = 0; k < 9 * 8; k++) {
                double v = fabs(((const float *)lpx_tensor_data(c.grads[r]))[k]);
                amax = v > amax ? v : amax;
            }
        }
        float *av = lpx_tensor_data(c.avg);
        for (int k = 0; k < 9 * 8; k++) av[k] /= (float)n;
        run_ranks(n, hyb_rank, &c);
        for (int g = 0; g < n; g++) {
            int j = g % cols;
            int64_t chunk = 5, start = j * chunk, len = j ? 4 : 5;
            lpx_tensor *ref = NULL;
            CHECK_OK(lpx_narrow(c.avg, 0, start, len, &ref));
            CHECK(c.got[g] && lpx_tensor_shape(c.got[g])[0] == len);
            if (c.got[g] && ref) {
                double err = max_abs_diff(c.got[g], ref);
                /* fp8: measured 0.524 and 0.703 (amax 20.12; the inputs
                 * are seeded and the arithmetic is exact-order, so every
                 * machine measures the same); bound 0.05 amax = 1.006,
                 * 1.43x the worst measured. A replica SUM in place of the
                 * average errs by 5.55, a 1.5x scale by > 2: both fail.
                 * (The worst-case analysis, three e4m3 roundings of 1/16
                 * on sums up to 2 amax, allows 0.25 amax: too loose to
                 * catch either.) Plain f32: a few ulps. */
                CHECKF(err <= (fp8 ? 0.05 * amax : 1e-5 * amax), "%s rank %d: error %g (amax %g)",
                       fp8 ? "fp8" : "plain", g, err, amax);
                if (g >= cols) CHECKF(same_bits(c.got[g], c.got[g - cols]), "%s: replicas of shard %d differ",
                                      fp8 ? "fp8" : "plain", j);
            }
            if (fp8) CHECK(c.amax_ar[g] == 2);   /* shard comm, then replicate comm */
            lpx_tensor_release(ref);
        }
        for (int r = 0; r < n; r++) {
            lpx_tensor_release(c.grads[r]);
            lpx_tensor_release(c.got[r]);
        }
        lpx_tensor_release(c.avg);
    }
}

static void test_mixed_precision(void)
{
    mp_ctx c;
    memset(&c, 0, sizeof c);
    /* uneven rows; 3 rows leaves ranks of larger worlds empty */
    const int64_t s0[2] = {13, 5}, s1[1] = {7}, s2[2] = {3, 4}, s3[2] = {5, 3};
    const int64_t *shp[MP_N] = {s0, s1, s2, s3};
    const int nd[MP_N] = {2, 1, 2, 2};
    for (int i = 0; i < MP_N; i++) {
        c.full[i] = rand_normal(nd[i], shp[i], 60 + (uint64_t)i, 1.0, i == 3 ? LPX_BF16 : LPX_F32);
        if (i == 3) {
            c.expect[i] = c.full[i];
            lpx_tensor_retain(c.expect[i]);
        } else {
            CHECK_OK(lpx_cast(c.full[i], LPX_BF16, false, &c.expect[i]));
        }
    }
    /* the cast is a real rounding: not every f32 element is a bf16 value */
    CHECK(!same_bits(c.full[0], c.expect[0]));
    for (int keep = 0; keep < 2; keep++) {
        c.keep = keep;
        for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], mp_rank, &c);
    }
    for (int i = 0; i < MP_N; i++) {
        lpx_tensor_release(c.full[i]);
        lpx_tensor_release(c.expect[i]);
    }
}

static void test_no_decay(void)
{
    nd_ctx c;
    const int64_t s[2] = {13, 6};
    c.p = rand_normal(2, s, 80, 1.0, LPX_F32);
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], nd_rank, &c);
    lpx_tensor_release(c.p);
}

static void test_adamw_state(void)
{
    as_ctx c;
    const int64_t s[2] = {13, 6};
    c.p = rand_normal(2, s, 81, 1.0, LPX_F32);
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], as_rank, &c);
    lpx_tensor_release(c.p);
}

int main(void)
{
    RUN(test_two_layer_step);
    RUN(test_fp8_grad_reduce);
    RUN(test_hybrid_grad_reduce);
    RUN(test_mixed_precision);
    RUN(test_no_decay);
    RUN(test_adamw_state);
    return CHECK_DONE();
}
