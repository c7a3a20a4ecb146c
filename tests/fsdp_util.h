/* Shared by the fsdp test programs (tests/test_fsdp_*.c): the
 * helpers and fixtures their cases use. Static inline: each program
 * compiles only what it calls. */
#ifndef LPX_TESTS_FSDP_UTIL_H
#define LPX_TESTS_FSDP_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "tensor_util.h"
#include "dt_util.h"
#include "fp8_ref.h"

static inline uint64_t ag_calls(lpx_fsdp *f)
{
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    lpx_fsdp_stats_get(f, &s);
    return s.calls[LPX_COLL_ALL_GATHER];
}

/* ---- mixed group: every kind in one all-gather --------------------- */

typedef struct mixed_ctx {
    lpx_tensor *full[6];      /* as given to the engine */
    lpx_tensor *expect[6];    /* what unshard must rebuild */
    bool keep;
} mixed_ctx;

static inline lpx_status mixed_rank(lpx_comm *comm, void *vctx)
{
    mixed_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .keep_storage = c->keep};
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "layer0", &g));
    static const char *names[6] = {"dense_f32", "bias_bf16", "tiny", "nf4_base", "lora_a", "f8w"};
    for (int i = 0; i < 6; i++)
        RCHECK_OK(r, lpx_fsdp_param_add(g, names[i], c->full[i], i == 3 ? LPX_FSDP_FROZEN : 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    lpx_tensor *first[6] = {0};
    for (int step = 0; step < 2; step++) {
        RCHECK_OK(r, lpx_fsdp_unshard(g));
        RCHECK(r, ag_calls(f) == (uint64_t)step + 1); /* ONE all-gather per unshard */
        for (int i = 0; i < 6; i++) {
            lpx_tensor *full = lpx_fsdp_param_full(g, i);
            RCHECK(r, full != NULL);
            if (!full) continue;
            if (!same_bits(full, c->expect[i])) rfail(r, "step %d: param %s differs from the full tensor", step, names[i]);
            if (step == 0) first[i] = full, lpx_tensor_retain(full);
            else if (c->keep && first[i] != full) rfail(r, "keep_storage: param %s was reallocated", names[i]);
        }
        RCHECK_OK(r, lpx_fsdp_reshard(g));
    }
    for (int i = 0; i < 6; i++) lpx_tensor_release(first[i]);
    lpx_fsdp_free(f);
    return LPX_OK;
}

/* ---- float8 counting ---------------------------------------------- */

typedef struct f8_ctx {
    lpx_tensor *masters[3];
    uint64_t with_pre, without_pre, ar_with, ar_without;
} f8_ctx;

static inline lpx_status f8_count_rank(lpx_comm *comm, void *vctx)
{
    f8_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    for (int pre = 0; pre < 2; pre++) {
        lpx_fsdp *f = NULL;
        lpx_status st = new_engine(comm, NULL, &f);
        if (st) return st;
        lpx_fsdp_group *g = NULL;
        RCHECK_OK(r, lpx_fsdp_group_add(f, "layer", &g));
        for (int i = 0; i < 3; i++) {
            lpx_tensor *w = NULL;
            RCHECK_OK(r, lpx_float8_weight_new(c->masters[i], NULL, &w));
            RCHECK_OK(r, lpx_fsdp_param_add(g, "w", w, 0, NULL));
            lpx_tensor_release(w);
        }
        RCHECK_OK(r, lpx_fsdp_shard(f));
        lpx_fsdp_stats_reset(f);
        /* one step: (precompute), unshard forward, reshard, unshard backward */
        if (pre) RCHECK_OK(r, lpx_fsdp_group_precompute_scales(g));
        for (int k = 0; k < 2; k++) {
            RCHECK_OK(r, lpx_fsdp_unshard(g));
            RCHECK_OK(r, lpx_fsdp_reshard(g));
        }
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
        if (r == 0) {
            if (pre) c->with_pre = s.amax_allreduces, c->ar_with = s.calls[LPX_COLL_ALL_REDUCE];
            else c->without_pre = s.amax_allreduces, c->ar_without = s.calls[LPX_COLL_ALL_REDUCE];
        }
        lpx_fsdp_free(f);
    }
    return LPX_OK;
}

/* ---- fp8 vs bf16 all-gather bytes for a 4096 x 4096 weight --------- */

typedef struct bytes_ctx {
    lpx_tensor *master;
    uint64_t bytes[2];
} bytes_ctx;

static inline lpx_status bytes_rank(lpx_comm *comm, void *vctx)
{
    bytes_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    for (int fp8 = 0; fp8 < 2; fp8++) {
        lpx_fsdp *f = NULL;
        lpx_status st = new_engine(comm, NULL, &f);
        if (st) return st;
        lpx_fsdp_group *g = NULL;
        lpx_tensor *p = c->master;
        lpx_tensor_retain(p);
        if (fp8) {
            lpx_tensor_release(p);
            RCHECK_OK(r, lpx_float8_weight_new(c->master, NULL, &p));
        }
        RCHECK_OK(r, lpx_fsdp_group_add(f, "w", &g));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "w", p, 0, NULL));
        lpx_tensor_release(p);
        RCHECK_OK(r, lpx_fsdp_shard(f));
        RCHECK_OK(r, lpx_fsdp_group_precompute_scales(g));
        lpx_fsdp_stats_reset(f);
        RCHECK_OK(r, lpx_fsdp_unshard(g));
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
        if (r == 0) c->bytes[fp8] = s.bytes[LPX_COLL_ALL_GATHER];
        lpx_fsdp_free(f);
    }
    return LPX_OK;
}

/* ---- at most two groups unsharded ---------------------------------- */

static inline lpx_status peak_rank(lpx_comm *comm, void *vctx)
{
    (void)vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g[4];
    uint64_t gb[4];
    for (int i = 0; i < 4; i++) {
        RCHECK_OK(r, lpx_fsdp_group_add(f, "layer", &g[i]));
        const int64_t s[2] = {9 + i, 4 + i};
        lpx_tensor *p = rand_normal(2, s, (uint64_t)i, 1.0, LPX_F32);
        RCHECK_OK(r, lpx_fsdp_param_add(g[i], "w", p, 0, NULL));
        gb[i] = (uint64_t)(9 + i) * (uint64_t)(4 + i) * 4;
        lpx_tensor_release(p);
    }
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    /* forward with prefetch, then backward in reverse */
    for (int i = 0; i < 4; i++) {
        RCHECK_OK(r, lpx_fsdp_unshard(g[i]));
        if (i + 1 < 4) RCHECK_OK(r, lpx_fsdp_prefetch(g[i + 1]));
        RCHECK(r, lpx_fsdp_param_full(g[i], 0) != NULL);
        if (i + 2 < 4) RCHECK(r, lpx_fsdp_unshard(g[i + 2]) == LPX_EFULL); /* a third is refused */
        RCHECK_OK(r, lpx_fsdp_reshard(g[i]));
    }
    for (int i = 3; i >= 0; i--) {
        RCHECK_OK(r, lpx_fsdp_unshard(g[i]));
        if (i > 0) RCHECK_OK(r, lpx_fsdp_prefetch(g[i - 1]));
        RCHECK_OK(r, lpx_fsdp_reshard(g[i]));
    }
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    RCHECK(r, s.peak_unsharded_groups == 2 || (s.peak_unsharded_groups == 2));
    RCHECK(r, s.peak_unsharded_bytes <= gb[3] + gb[2] && s.peak_unsharded_bytes > 0);
    RCHECK(r, s.unsharded_bytes == 0);
    RCHECK(r, s.calls[LPX_COLL_ALL_GATHER] == 8 && s.unshards == 8);
    lpx_fsdp_free(f);
    return LPX_OK;
}

/* ---- a 2-layer model: engine == unsharded, bit for bit ------------- */

#define IN 8
#define HID 11
#define OUT 4
#define BATCH 5

__attribute__((unused)) static const int64_t shp_w1[2] = {HID, IN}, shp_b1[1] = {HID}, shp_w2[2] = {OUT, HID}, shp_b2[1] = {OUT};

typedef struct model_ctx {
    lpx_tensor *params[4];         /* w1, b1, w2, b2 (full, step 0) */
    lpx_tensor *ref_grad[4];       /* averaged over ranks, f32 rank order */
    lpx_tensor *ref_param[4];      /* after one AdamW step */
    float ref_loss[MAXR][2];       /* per rank: before and after the step */
} model_ctx;

/* loss and grads of one rank's batch with the given full params */
static inline lpx_status fwd_bwd(int rank, lpx_tensor *const *p, float *loss, lpx_tensor **grads)
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
static inline void adamw_ref(float *p, const float *g, size_t n, const lpx_adamw_opts *o)
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

static inline lpx_status model_rank(lpx_comm *comm, void *vctx)
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

/* ---- fp8 gradient reduce-scatter ------------------------------------ */

typedef struct fp8g_ctx {
    lpx_tensor *grads[MAXR];
    lpx_tensor *avg;
    lpx_tensor *got[MAXR];   /* each rank's reduced grad shard */
    double err[MAXR], amax;
    uint64_t amax_ar[MAXR], rs_bytes[MAXR];
} fp8g_ctx;

static inline lpx_status fp8g_rank(lpx_comm *comm, void *vctx)
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

/* ---- hybrid sharding (2-D mesh): grads averaged over both mesh dims ---- */

typedef struct hyb_ctx {
    lpx_comm *outer[MAXR], *inner[MAXR];
    lpx_tensor *grads[MAXR], *avg;
    lpx_tensor *got[MAXR];
    bool fp8;
    uint64_t amax_ar[MAXR];
} hyb_ctx;

static inline lpx_status hyb_rank(lpx_comm *world, void *vctx)
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

static inline void adamw_ref_t(float *p, float *m, float *v, const float *g, size_t n, const lpx_adamw_opts *o, int t)
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
static inline float *to_f32_array(lpx_tensor *t)
{
    size_t n = (size_t)lpx_tensor_numel(t);
    float *a = malloc((n ? n : 1) * sizeof *a);
    lpx_tensor *c = NULL;
    if (a && !lpx_contiguous(t, &c) && n) lpx_convert(a, LPX_F32, lpx_tensor_data(c), lpx_tensor_dtype(t), n, 0);
    lpx_tensor_release(c);
    return a;
}

/* ---- mixed precision: param_dtype = bf16 ---------------------------- */

#define MP_N 4

typedef struct mp_ctx {
    lpx_tensor *full[MP_N];     /* f32 (0..2) and bf16 (3) params */
    lpx_tensor *expect[MP_N];   /* full cast to bf16 (3: itself) */
    bool keep;
} mp_ctx;

static inline lpx_status mp_rank(lpx_comm *comm, void *vctx)
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

/* ---- LPX_FSDP_NO_DECAY ---------------------------------------------- */

typedef struct nd_ctx {
    lpx_tensor *p;              /* initial value of every param */
} nd_ctx;

/* group "dec" (wd 0.1): params d (decayed) and n (NO_DECAY); group "ref"
 * (wd 0): param z. Same init, same grads, two steps. */
static inline lpx_status nd_rank(lpx_comm *comm, void *vctx)
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

/* ---- AdamW state out and in (checkpoints) ---------------------------- */

typedef struct as_ctx {
    lpx_tensor *p;
} as_ctx;

/* engine A steps twice; engine B gets A's weights and AdamW state through
 * lpx_fsdp_param_adamw_state / set_adamw_state; one more step with the
 * same grad gives the same bits on both */
static inline lpx_status as_rank(lpx_comm *comm, void *vctx)
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

/* ---- lpx_fsdp_precompute_scales: one all-reduce for the model ------- */

#define PS_G 4
#define PS_P 3

typedef struct ps_ctx {
    lpx_tensor *masters[PS_G][PS_P];  /* NULL: no param */
    lpx_float8_weight_opts opts[PS_G][PS_P];
    bool dense[PS_G][PS_P];           /* a plain dense param */
    lpx_tensor *expect[PS_G][PS_P];   /* gather-then-cast where checked */
} ps_ctx;

static inline lpx_status ps_build(ps_ctx *c, lpx_comm *comm, int r, lpx_fsdp **f, lpx_fsdp_group **g)
{
    lpx_status st = new_engine(comm, NULL, f);
    if (st) return st;
    for (int j = 0; j < PS_G; j++) {
        RCHECK_OK(r, lpx_fsdp_group_add(*f, "layer", &g[j]));
        for (int i = 0; i < PS_P; i++) {
            if (!c->masters[j][i]) continue;
            lpx_tensor *p = c->masters[j][i];
            lpx_tensor_retain(p);
            if (!c->dense[j][i]) {
                lpx_tensor_release(p);
                p = NULL;
                RCHECK_OK(r, lpx_float8_weight_new(c->masters[j][i], &c->opts[j][i], &p));
            }
            RCHECK_OK(r, lpx_fsdp_param_add(g[j], "w", p, 0, NULL));
            lpx_tensor_release(p);
        }
    }
    RCHECK_OK(r, lpx_fsdp_shard(*f));
    lpx_fsdp_stats_reset(*f);
    return LPX_OK;
}

static inline lpx_status ps_rank(lpx_comm *comm, void *vctx)
{
    ps_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *fa = NULL, *fb = NULL;
    lpx_fsdp_group *ga[PS_G] = {0}, *gb[PS_G] = {0};
    lpx_status st = ps_build(c, comm, r, &fa, ga);
    if (!st) st = ps_build(c, comm, r, &fb, gb);
    if (st) {
        lpx_fsdp_free(fa);
        return st;
    }
    lpx_comm_stats c0 = {.struct_size = sizeof c0}, c1 = {.struct_size = sizeof c1};
    /* A: model-wide, twice (one all-reduce per call) */
    for (int call = 1; call <= 2; call++) {
        lpx_comm_stats_get(comm, &c0);
        RCHECK_OK(r, lpx_fsdp_precompute_scales(fa));
        lpx_comm_stats_get(comm, &c1);
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        RCHECK_OK(r, lpx_fsdp_stats_get(fa, &s));
        if (s.amax_allreduces != (uint64_t)call || s.calls[LPX_COLL_ALL_REDUCE] != (uint64_t)call)
            rfail(r, "call %d: %llu amax all-reduces, %llu all-reduces (want %d)", call,
                  (unsigned long long)s.amax_allreduces, (unsigned long long)s.calls[LPX_COLL_ALL_REDUCE], call);
        uint64_t total = 0;
        for (int k = 0; k < LPX_COLL_MAX; k++) total += c1.calls[k] - c0.calls[k];
        if (c1.calls[LPX_COLL_ALL_REDUCE] - c0.calls[LPX_COLL_ALL_REDUCE] != 1 || total != 1)
            rfail(r, "call %d: the comm ran %llu collectives", call, (unsigned long long)total);
    }
    /* B: the per-group path */
    int groups_f8 = 0;
    for (int j = 0; j < PS_G; j++) {
        bool any = false;
        for (int i = 0; i < PS_P; i++) any |= c->masters[j][i] && !c->dense[j][i] && !c->opts[j][i].rowwise;
        groups_f8 += any;
        RCHECK_OK(r, lpx_fsdp_group_precompute_scales(gb[j]));
    }
    lpx_fsdp_stats sb = {.struct_size = sizeof sb};
    RCHECK_OK(r, lpx_fsdp_stats_get(fb, &sb));
    if (sb.amax_allreduces != (uint64_t)groups_f8)
        rfail(r, "per-group path: %llu amax all-reduces, want %d", (unsigned long long)sb.amax_allreduces, groups_f8);
    /* same scales bit for bit; tensorwise ones set, rowwise ones not */
    for (int j = 0; j < PS_G; j++)
        for (int i = 0; i < PS_P; i++) {
            if (!c->masters[j][i] || c->dense[j][i]) continue;
            float sa = lpx_float8_weight_scale(lpx_fsdp_param_local(ga[j], i)),
                  sbv = lpx_float8_weight_scale(lpx_fsdp_param_local(gb[j], i));
            if (memcmp(&sa, &sbv, sizeof sa)) rfail(r, "group %d param %d: scale %a, per-group %a", j, i, (double)sa, (double)sbv);
            if (c->opts[j][i].rowwise ? sa != 0 : !(sa > 0))
                rfail(r, "group %d param %d: scale %g", j, i, (double)sa);
        }
    /* unsharding every group after the precompute runs no all-reduce, and
     * gathers the same bits as the per-group path (and as gather-then-cast) */
    lpx_fsdp_stats_reset(fa);
    for (int j = 0; j < PS_G; j++) {
        RCHECK_OK(r, lpx_fsdp_unshard(ga[j]));
        RCHECK_OK(r, lpx_fsdp_unshard(gb[j]));
        for (int i = 0; i < PS_P; i++) {
            if (!c->masters[j][i]) continue;
            lpx_tensor *a = lpx_fsdp_param_full(ga[j], i), *b = lpx_fsdp_param_full(gb[j], i);
            if (!same_bits(a, b)) rfail(r, "group %d param %d: unsharded tensors differ", j, i);
            if (c->expect[j][i] && !same_bits(a, c->expect[j][i]))
                rfail(r, "group %d param %d: != gather-then-cast", j, i);
        }
        RCHECK_OK(r, lpx_fsdp_reshard(ga[j]));
        RCHECK_OK(r, lpx_fsdp_reshard(gb[j]));
    }
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(fa, &s));
    RCHECK(r, s.amax_allreduces == 0 && s.calls[LPX_COLL_ALL_REDUCE] == 0 && s.calls[LPX_COLL_ALL_GATHER] == PS_G);
    lpx_fsdp_free(fa);
    lpx_fsdp_free(fb);
    /* a model without tensorwise float8 weights: no collective at all */
    lpx_fsdp *fc = NULL;
    lpx_fsdp_group *gc = NULL;
    if ((st = new_engine(comm, NULL, &fc))) return st;
    RCHECK_OK(r, lpx_fsdp_group_add(fc, "dense", &gc));
    RCHECK_OK(r, lpx_fsdp_param_add(gc, "w", c->masters[0][0], 0, NULL));
    lpx_tensor *rw = NULL;
    RCHECK_OK(r, lpx_float8_weight_new(c->masters[1][0], &c->opts[1][0], &rw)); /* rowwise */
    RCHECK_OK(r, lpx_fsdp_param_add(gc, "rw", rw, 0, NULL));
    lpx_tensor_release(rw);
    RCHECK_OK(r, lpx_fsdp_shard(fc));
    lpx_fsdp_stats_reset(fc);
    RCHECK_OK(r, lpx_fsdp_precompute_scales(fc));
    RCHECK_OK(r, lpx_fsdp_stats_get(fc, &s));
    RCHECK(r, s.amax_allreduces == 0 && s.calls[LPX_COLL_ALL_REDUCE] == 0);
    lpx_fsdp_free(fc);
    return LPX_OK;
}

/* ---- rowwise float8 all-gather (issue 5) ---------------------------- */

/* Rowwise float8_weight params (uneven rows; rows that leave trailing
 * ranks empty at world 8; an all-zero row; f32/bf16/f16 masters; e4m3
 * and e5m2) in one group: unshard == rowwise quantize of the full master
 * (codes and per-row scales), no amax all-reduce anywhere, 1 wire byte
 * per element plus the row scales, and a rowwise Float8Linear step on the
 * gathered weight == the unsharded one. */
#define RW_N 5

typedef struct rw_ctx {
    lpx_tensor *masters[RW_N];
    lpx_float8_weight_opts opts[RW_N];
    lpx_tensor *expect[RW_N];   /* lpx_float8_quantize(full master, rowwise) */
    bool keep;
    /* Float8Linear with param 0 as W */
    lpx_tensor *x, *gout;
    lpx_tensor *ref[4];         /* out, grad_x, grad_W, grad_b with W = expect[0] (unsharded) */
    lpx_tensor *hp[3];          /* out, grad_x, grad_W in high precision with the master */
} rw_ctx;

static inline size_t rw_round16(size_t n) { return (n + 15) / 16 * 16; }

/* SQNR (dB) of x against ref, both dense */
static inline double rw_sqnr(lpx_tensor *ref, lpx_tensor *x)
{
    size_t n = (size_t)lpx_tensor_numel(ref);
    if (!x || (size_t)lpx_tensor_numel(x) != n) return -1e30;
    float *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
    lpx_tensor *ca = NULL, *cb = NULL;
    double s = 0, e = 0;
    if (a && b && !lpx_contiguous(ref, &ca) && !lpx_contiguous(x, &cb) &&
        !lpx_convert(a, LPX_F32, lpx_tensor_data(ca), lpx_tensor_dtype(ca), n, 0) &&
        !lpx_convert(b, LPX_F32, lpx_tensor_data(cb), lpx_tensor_dtype(cb), n, 0)) {
        for (size_t i = 0; i < n; i++) {
            s += (double)a[i] * a[i];
            e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        }
    } else {
        e = s = -1;
    }
    lpx_tensor_release(ca);
    lpx_tensor_release(cb);
    free(a);
    free(b);
    if (s < 0) return -1e30;
    return e == 0 ? 1e30 : 10.0 * log10(s / e);
}

/* the float8 metadata and the three inner tensors, bit for bit */
static inline bool rw_same_f8(lpx_tensor *a, lpx_tensor *b)
{
    lpx_float8_info ia, ib;
    if (lpx_float8_get_info(a, &ia) || lpx_float8_get_info(b, &ib)) return false;
    return ia.fp8 == ib.fp8 && ia.logical == ib.logical && ia.role == ib.role && ia.granularity == ib.granularity &&
           ia.axis == ib.axis && same_bits(a, b) && same_bits(lpx_float8_data(a), lpx_float8_data(b)) &&
           same_bits(lpx_float8_scale(a), lpx_float8_scale(b)) &&
           same_bits(lpx_float8_scale_inv(a), lpx_float8_scale_inv(b));
}

static inline lpx_status rw_rank(lpx_comm *comm, void *vctx)
{
    rw_ctx *c = vctx;
    int r = lpx_comm_rank(comm), world = lpx_comm_size(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .keep_storage = c->keep};
    lpx_comm_stats c0 = {.struct_size = sizeof c0}, c1 = {.struct_size = sizeof c1};
    lpx_comm_stats_get(comm, &c0);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "rowwise", &g));
    for (int i = 0; i < RW_N; i++) {
        lpx_tensor *w = NULL;
        RCHECK_OK(r, lpx_float8_weight_new(c->masters[i], &c->opts[i], &w));
        RCHECK(r, lpx_float8_weight_rowwise(w));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "w", w, 0, NULL));
        lpx_tensor_release(w);
    }
    RCHECK_OK(r, lpx_fsdp_shard(f));
    /* (b) the precompute finds nothing to agree on */
    RCHECK_OK(r, lpx_fsdp_group_precompute_scales(g));
    RCHECK_OK(r, lpx_fsdp_precompute_scales(f));
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    if (s.amax_allreduces || s.calls[LPX_COLL_ALL_REDUCE])
        rfail(r, "shard + precompute: %llu amax all-reduces, %llu all-reduces", (unsigned long long)s.amax_allreduces,
              (unsigned long long)s.calls[LPX_COLL_ALL_REDUCE]);
    for (int i = 0; i < RW_N; i++)
        if (lpx_float8_weight_scale(lpx_fsdp_param_local(g, i)) != 0.0f) rfail(r, "param %d got a replicated scale", i);
    /* (c) the wire: per rank, each param's block is its largest shard's
     * fp8 codes (1 byte per element) plus its f32 scale and scale_inv per
     * row, each piece 16-byte aligned */
    uint64_t wire = 0, codes = 0;
    for (int i = 0; i < RW_N; i++) {
        int64_t rows = lpx_tensor_shape(c->masters[i])[0], chunk = 0, start = 0, len = 0;
        int64_t cols = lpx_tensor_numel(c->masters[i]) / (rows ? rows : 1);
        RCHECK_OK(r, lpx_shard_range(rows, world, r, 1, &chunk, &start, &len));
        wire += rw_round16((size_t)(chunk * cols)) + 2 * rw_round16((size_t)chunk * 4);
        codes += (uint64_t)(chunk * cols);
    }
    lpx_fsdp_stats_reset(f);
    for (int step = 0; step < 2; step++) {
        lpx_comm_stats a0 = {.struct_size = sizeof a0}, a1 = {.struct_size = sizeof a1};
        lpx_comm_stats_get(comm, &a0);
        RCHECK_OK(r, lpx_fsdp_unshard(g));
        lpx_comm_stats_get(comm, &a1);
        uint64_t total = 0;
        for (int k = 0; k < LPX_COLL_MAX; k++) total += a1.calls[k] - a0.calls[k];
        if (total != 1 || a1.calls[LPX_COLL_ALL_GATHER] - a0.calls[LPX_COLL_ALL_GATHER] != 1)
            rfail(r, "step %d: the unshard ran %llu collectives, want one all-gather", step, (unsigned long long)total);
        if (a1.bytes[LPX_COLL_ALL_GATHER] - a0.bytes[LPX_COLL_ALL_GATHER] != wire)
            rfail(r, "step %d: %llu all-gather bytes, want %llu (%llu fp8 codes + row scales)", step,
                  (unsigned long long)(a1.bytes[LPX_COLL_ALL_GATHER] - a0.bytes[LPX_COLL_ALL_GATHER]),
                  (unsigned long long)wire, (unsigned long long)codes);
        /* (a) gather-then-nothing == rowwise quantize of the full master */
        for (int i = 0; i < RW_N; i++) {
            lpx_tensor *full = lpx_fsdp_param_full(g, i);
            if (!full || !lpx_float8_is(full)) {
                rfail(r, "step %d: param %d is not a float8 tensor after unshard", step, i);
                continue;
            }
            if (!rw_same_f8(full, c->expect[i]))
                rfail(r, "step %d: param %d differs from the rowwise quantized full master", step, i);
        }
        /* (d) Float8Linear, rowwise preset, on the gathered weight */
        lpx_float8_linear_recipe rc;
        RCHECK_OK(r, lpx_float8_linear_recipe_preset("rowwise", &rc));
        lpx_tensor *out = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
        lpx_float8_linear_ctx *lc = NULL;
        lpx_float8_linear_report rep;
        memset(&rep, 0, sizeof rep);
        RCHECK_OK(r, lpx_float8_linear_forward(&rc, NULL, c->x, lpx_fsdp_param_full(g, 0), NULL, &out, &lc, &rep));
        if (lc) RCHECK_OK(r, lpx_float8_linear_backward(lc, c->gout, &gx, &gw, &gb, &rep));
        lpx_float8_linear_ctx_free(lc);
        /* fprop uses the gathered rows as they are (per-row scales are
         * per-column scales of W^T); dgrad wants W scaled per column,
         * which the recipe makes from it (e4m3, power-of-2 scales) */
        RCHECK(r, rep.fprop.b.given_fp8 && !rep.fprop.b.quantized);
        RCHECK(r, rep.dgrad.b.quantized && !rep.dgrad.b.given_fp8 && rep.dgrad.b.dtype == rc.dgrad.b.dtype);
        if (rep.dgrad.b.quantized) {
            int e;
            RCHECK(r, frexp(rep.dgrad.b.stats.scale, &e) == 0.5);
        }
        lpx_tensor *got[4] = {out, gx, gw, gb};
        static const char *what[4] = {"out", "grad_x", "grad_W", "grad_b"};
        for (int k = 0; k < 4; k++)
            if (!same_bits(got[k], c->ref[k])) rfail(r, "step %d: Float8Linear %s != unsharded", step, what[k]);
        for (int k = 0; k < 3; k++) {
            double db = rw_sqnr(c->hp[k], got[k]);
            if (db < (k ? 17.0 : 18.0)) rfail(r, "step %d: Float8Linear %s SQNR %.2f dB", step, what[k], db);
        }
        for (int k = 0; k < 4; k++) lpx_tensor_release(got[k]);
        RCHECK_OK(r, lpx_fsdp_reshard(g));
    }
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    if (s.amax_allreduces || s.calls[LPX_COLL_ALL_REDUCE] || s.calls[LPX_COLL_ALL_GATHER] != 2 ||
        s.bytes[LPX_COLL_ALL_GATHER] != 2 * wire)
        rfail(r, "two unshards: %llu amax all-reduces, %llu all-reduces, %llu all-gathers of %llu bytes (want 0, 0, 2, "
                 "%llu)", (unsigned long long)s.amax_allreduces, (unsigned long long)s.calls[LPX_COLL_ALL_REDUCE],
              (unsigned long long)s.calls[LPX_COLL_ALL_GATHER], (unsigned long long)s.bytes[LPX_COLL_ALL_GATHER],
              (unsigned long long)(2 * wire));
    lpx_fsdp_free(f);
    /* the whole life of the engine, as the comm saw it: no all-reduce */
    lpx_comm_stats_get(comm, &c1);
    if (c1.calls[LPX_COLL_ALL_REDUCE] != c0.calls[LPX_COLL_ALL_REDUCE])
        rfail(r, "the comm ran %llu all-reduces",
              (unsigned long long)(c1.calls[LPX_COLL_ALL_REDUCE] - c0.calls[LPX_COLL_ALL_REDUCE]));
    return LPX_OK;
}

/* ---- faults -------------------------------------------------------- */

typedef struct fault_ctx {
    int mode;
    lpx_tensor *full;
    lpx_status st[MAXR];
    double secs[MAXR];
} fault_ctx;

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline lpx_status fault_rank(lpx_comm *comm, void *vctx)
{
    fault_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    lpx_fsdp_group_add(f, "l", &g);
    lpx_fsdp_param_add(g, "w", c->full, 0, NULL);
    st = lpx_fsdp_shard(f);
    double t0 = now_s();
    if (!st) {
        if (r == 2 && c->mode == 0) st = lpx_error(LPX_EINVAL, "rank 2 gives up before the unshard");
        else if (r == 2 && c->mode == 1) {
            usleep(600 * 1000); /* the others are mid-collective past their timeout */
            st = lpx_fsdp_unshard(g);
        } else if (r == 2 && c->mode == 2) {
            lpx_comm_abort(comm, "rank 2 stops mid-step");
            st = LPX_ECOMM;
        } else {
            st = lpx_fsdp_unshard(g);
            if (!st) st = lpx_fsdp_reshard(g);
            if (!st) st = lpx_fsdp_unshard(g);
        }
    }
    c->st[r] = st;
    c->secs[r] = now_s() - t0;
    lpx_fsdp_free(f);
    return st;
}

#endif
