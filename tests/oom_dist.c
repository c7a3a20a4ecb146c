/* OOM sweep cases (tests/oom.h): collectives over the local backend (two
 * ranks as two threads), comm backends, meshes, DTensor and the sharding
 * engine. Calls that run collectives go through oom_run_ranks: the hook
 * is armed on both ranks at once, a rank that runs out of memory aborts
 * the comm and its peer must fail with LPX_ECOMM, not hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "oom.h"

/* ---- comm groups and backends (no collective) ----------------------------- */

static lpx_status c_group_create(int attempt)
{
    (void)attempt;
    lpx_comm *comms[3] = {0};
    lpx_status st = OOM(lpx_local_comm_group_create(3, comms));
    for (int i = 0; i < 3; i++) {
        OOM_OUT_NULL(st, comms[i]);
        lpx_comm_destroy(comms[i]);
    }
    return st;
}

static lpx_status noop_rank(lpx_comm *c, void *ctx)
{
    (void)ctx;
    return lpx_comm_barrier(c);
}

static lpx_status c_local_run(int attempt)
{
    (void)attempt;
    lpx_status sts[2] = {99, 99};
    return OOM(lpx_local_run(2, noop_rank, NULL, 10000, sts));
}

static lpx_status c_comm_run(int attempt)
{
    (void)attempt;
    return OOM(lpx_comm_run("local", 2, 10000, noop_rank, NULL, NULL));
}

static int v_destroyed;
static int v_rank(void *s) { (void)s; return 0; }
static int v_size(void *s) { (void)s; return 1; }
static lpx_status v_coll(void *s, const lpx_comm_args *a) { (void)s, (void)a; return LPX_OK; }
static void v_abort(void *s, const char *r) { (void)s, (void)r; }
static void v_destroy(void *s) { (void)s; v_destroyed++; }

static lpx_status c_comm_new(int attempt)
{
    (void)attempt;
    static const lpx_comm_i vt = {.struct_size = sizeof vt, .abi_version = LPX_COMM_ABI_VERSION, .name = "oomvt",
                                  .rank = v_rank, .size = v_size, .all_gather = v_coll, .reduce_scatter = v_coll,
                                  .all_reduce = v_coll, .broadcast = v_coll, .barrier = v_coll, .abort = v_abort,
                                  .destroy = v_destroy};
    lpx_comm *c = NULL;
    v_destroyed = 0;
    lpx_status st = OOM(lpx_comm_new(&vt, &v_destroyed, &c));
    OOM_OUT_NULL(st, c);
    OOM_CHECKF(v_destroyed == 0, "a failed lpx_comm_new destroyed the caller's state");
    if (!st) {
        OOM_CHECK(lpx_comm_barrier(c) == LPX_OK);
        lpx_comm_destroy(c);
        OOM_CHECK(v_destroyed == 1);
    }
    return st;
}

static lpx_status fake_run(const lpx_comm_backend_i *self, int nranks, int64_t timeout_ms, lpx_comm_rank_fn fn,
                           void *ctx, lpx_status *statuses)
{
    (void)self, (void)timeout_ms;
    return lpx_local_run(nranks, fn, ctx, 10000, statuses);
}

static lpx_status c_comm_backend_register(int attempt)
{
    (void)attempt;
    static const lpx_comm_backend_i be = {.struct_size = sizeof be, .name = "oom_backend",
                                          .description = "the OOM test's", .run = fake_run};
    lpx_status st = OOM(lpx_comm_backend_register(&be));
    const lpx_comm_backend_i *f = NULL;
    OOM_CHECK((lpx_comm_backend_find("oom_backend", &f) == LPX_OK) == (st == LPX_OK));
    return st;
}

static lpx_status c_comm_backend_find(int attempt)
{
    (void)attempt;
    const lpx_comm_backend_i *b = NULL;
    lpx_status st = OOM(lpx_comm_backend_find("local", &b));
    OOM_CHECK(st || b);
    return st;
}

/* one rank-0 comm of a one-rank group, usable from this thread */
static lpx_status solo_op(int which)
{
    lpx_comm *c = NULL;
    OOM_SETUP(lpx_local_comm_group_create(1, &c));
    lpx_comm_stats s = {.struct_size = sizeof s};
    lpx_status st = which == 0 ? OOM(lpx_comm_set_timeout(c, 1234)) : OOM(lpx_comm_stats_get(c, &s));
    lpx_comm_destroy(c);
    return st;
}
static lpx_status c_comm_set_timeout(int a) { (void)a; return solo_op(0); }
static lpx_status c_comm_stats_get(int a) { (void)a; return solo_op(1); }

static lpx_status c_reduce_buffers(int attempt)
{
    (void)attempt;
    float a[9], b[9], out[9];
    for (int i = 0; i < 9; i++) a[i] = (float)i, b[i] = (float)(2 * i);
    const void *srcs[2] = {a, b};
    lpx_status st = OOM(lpx_comm_reduce_buffers(out, srcs, 2, 9, LPX_F32, LPX_REDUCE_AVG));
    OOM_CHECK(st || out[4] == 6.0f);
    return st;
}

/* ---- collectives, two ranks ------------------------------------------------- */

typedef struct coll_state {
    lpx_tensor *a, *b;
    float buf[2][16];
} coll_state;

static int coll_which;

static lpx_status coll_setup(lpx_comm *c, int rank, void *p)
{
    (void)c;
    coll_state *s = p;
    for (int i = 0; i < 16; i++) s->buf[0][i] = (float)(rank * 16 + i), s->buf[1][i] = 0;
    int64_t n8 = 8, n16 = 16;
    lpx_status st = lpx_tensor_new(LPX_BF16, 1, &n8, lpx_cpu(), &s->a);
    if (!st) st = lpx_tensor_new(LPX_BF16, 1, &n16, lpx_cpu(), &s->b);
    if (!st) st = lpx_fill_(s->a, rank + 1);
    if (!st) st = lpx_fill_(s->b, rank + 1);
    return st;
}

static lpx_status coll_call(lpx_comm *c, int rank, void *p)
{
    (void)rank;
    coll_state *s = p;
    switch (coll_which) {
    case 0: return lpx_comm_all_gather_buf(c, s->buf[0], s->buf[1], 8 * sizeof(float));
    case 1: return lpx_comm_all_gather(c, s->a, s->b);
    case 2: return lpx_comm_reduce_scatter_buf(c, s->buf[0], s->buf[1], 8, LPX_F32, LPX_REDUCE_SUM);
    case 3: return lpx_comm_reduce_scatter(c, s->b, s->a, LPX_REDUCE_AVG);
    case 4: return lpx_comm_all_reduce_buf(c, s->buf[0], s->buf[0], 16, LPX_F32, LPX_REDUCE_MAX);
    case 5: return lpx_comm_all_reduce(c, s->b, LPX_REDUCE_SUM);
    case 6: return lpx_comm_broadcast_buf(c, s->buf[0], sizeof s->buf[0], 1);
    case 7: return lpx_comm_broadcast(c, s->a, 0);
    default: return lpx_comm_barrier(c);
    }
}

static void coll_cleanup(lpx_comm *c, int rank, void *p, lpx_status st)
{
    (void)c, (void)rank, (void)st;
    coll_state *s = p;
    lpx_tensor_release(s->a);
    lpx_tensor_release(s->b);
}

static lpx_status coll(int which)
{
    coll_which = which;
    oom_ranks r = {.nranks = 2, .state_size = sizeof(coll_state), .setup = coll_setup, .call = coll_call,
                   .cleanup = coll_cleanup};
    return oom_run_ranks(&r);
}

static lpx_status c_all_gather_buf(int a) { (void)a; return coll(0); }
static lpx_status c_all_gather(int a) { (void)a; return coll(1); }
static lpx_status c_reduce_scatter_buf(int a) { (void)a; return coll(2); }
static lpx_status c_reduce_scatter(int a) { (void)a; return coll(3); }
static lpx_status c_all_reduce_buf(int a) { (void)a; return coll(4); }
static lpx_status c_all_reduce(int a) { (void)a; return coll(5); }
static lpx_status c_broadcast_buf(int a) { (void)a; return coll(6); }
static lpx_status c_broadcast(int a) { (void)a; return coll(7); }
static lpx_status c_barrier(int a) { (void)a; return coll(8); }

/* ---- meshes and DTensors without collectives ----------------------------------- */

static lpx_status c_mesh_new(int attempt)
{
    (void)attempt;
    lpx_comm *c = NULL;
    OOM_SETUP(lpx_local_comm_group_create(1, &c));
    lpx_mesh *m = NULL;
    lpx_status st = OOM(lpx_mesh_new(c, &m));
    OOM_OUT_NULL(st, m);
    lpx_mesh_release(m);
    lpx_comm_destroy(c);
    return st;
}

static lpx_status c_mesh_new_2d(int attempt)
{
    (void)attempt;
    lpx_comm *a = NULL, *b = NULL;
    OOM_SETUP(lpx_local_comm_group_create(1, &a));
    OOM_SETUP(lpx_local_comm_group_create(1, &b));
    lpx_mesh *m = NULL;
    lpx_status st = OOM(lpx_mesh_new_2d(a, b, &m));
    OOM_OUT_NULL(st, m);
    lpx_mesh_release(m);
    lpx_comm_destroy(a);
    lpx_comm_destroy(b);
    return st;
}

static lpx_status c_shard_range(int attempt)
{
    (void)attempt;
    int64_t chunk, start, len;
    lpx_status st = OOM(lpx_shard_range(10, 4, 3, 2, &chunk, &start, &len));
    OOM_CHECK(st || (chunk == 4 && start == 10 && len == 0));
    return st;
}

/* rank 0 of a two-rank group, driven from this thread (no collective) */
typedef struct pair {
    lpx_comm *comms[2];
    lpx_mesh *mesh;
} pair;

static lpx_status pair_open(pair *p)
{
    memset(p, 0, sizeof *p);
    lpx_status st = lpx_local_comm_group_create(2, p->comms);
    if (!st) st = lpx_mesh_new(p->comms[0], &p->mesh);
    return st;
}

static void pair_close(pair *p)
{
    lpx_mesh_release(p->mesh);
    lpx_comm_destroy(p->comms[0]);
    lpx_comm_destroy(p->comms[1]);
}

static lpx_status c_from_local(int attempt)
{
    (void)attempt;
    pair p;
    OOM_SETUP(pair_open(&p));
    lpx_tensor *local = oom_randn2(5, 6, 1, LPX_F32), *dt = NULL;
    lpx_placement pl = lpx_shard(0);
    int64_t shape[2] = {10, 6};
    lpx_status st = OOM(lpx_dtensor_from_local(local, p.mesh, &pl, 2, shape, &dt));
    OOM_OUT_NULL(st, dt);
    OOM_CHECK(lpx_mesh_refcount(p.mesh) == (st ? 1 : 2));
    lpx_tensor_release(dt);
    lpx_tensor_release(local);
    pair_close(&p);
    return st;
}

static lpx_status distribute(bool nf4, lpx_placement pl)
{
    pair p;
    OOM_SETUP(pair_open(&p));
    lpx_tensor *full = oom_randn2(128, 64, 2, LPX_BF16), *q = NULL, *dt = NULL;
    if (nf4) {
        lpx_nf4_config cfg = lpx_nf4_config_default();
        cfg.block = 32;
        cfg.scaler_block = 2;
        OOM_SETUP(lpx_nf4_quantize(full, &cfg, &q));
    }
    lpx_status st = OOM(lpx_dtensor_distribute(nf4 ? q : full, p.mesh, &pl, &dt));
    OOM_OUT_NULL(st, dt);
    if (!st) {
        lpx_placement got;
        OOM_CHECK(lpx_dtensor_placement(dt, 0, &got) == LPX_OK && got.type == pl.type);
    }
    lpx_tensor_release(dt);
    lpx_tensor_release(q);
    lpx_tensor_release(full);
    pair_close(&p);
    return st;
}
static lpx_status c_distribute(int a) { (void)a; return distribute(false, lpx_shard(1)); }
static lpx_status c_distribute_nf4(int a) { (void)a; return distribute(true, lpx_shard(0)); }
static lpx_status c_distribute_partial(int a) { (void)a; return distribute(false, lpx_partial(LPX_REDUCE_SUM)); }

static lpx_status c_placement(int attempt)
{
    (void)attempt;
    pair p;
    OOM_SETUP(pair_open(&p));
    lpx_tensor *full = oom_randn2(4, 4, 3, LPX_F32), *dt = NULL;
    lpx_placement pl = lpx_replicate(), got;
    OOM_SETUP(lpx_dtensor_distribute(full, p.mesh, &pl, &dt));
    lpx_status st = OOM(lpx_dtensor_placement(dt, 0, &got));
    lpx_tensor_release(dt);
    lpx_tensor_release(full);
    pair_close(&p);
    return st;
}

/* ---- DTensor collectives, two ranks ------------------------------------------------ */

typedef struct dt_state {
    lpx_mesh *mesh;
    lpx_tensor *full, *q, *dt, *out;
} dt_state;

static int dt_which;

static lpx_status dt_setup(lpx_comm *c, int rank, void *p)
{
    (void)rank;
    dt_state *s = p;
    lpx_status st = lpx_mesh_new(c, &s->mesh);
    if (st) return st;
    int64_t shape[2] = {9, 64};
    if ((st = lpx_randn(2, shape, 5, LPX_BF16, lpx_cpu(), &s->full))) return st;   /* the same on every rank */
    lpx_placement pl;
    switch (dt_which) {
    case 0: case 3: pl = lpx_shard(0); break;      /* -> Replicate: all-gather */
    case 1: pl = lpx_partial(LPX_REDUCE_SUM); break;   /* -> Shard: reduce-scatter */
    case 2: pl = lpx_shard(1); break;              /* -> Shard(0): gather, then chunk */
    default: { /* nf4 local */
        lpx_nf4_config cfg = lpx_nf4_config_default();
        cfg.block = 32;
        cfg.scaler_block = 2;
        if ((st = lpx_nf4_quantize(s->full, &cfg, &s->q))) return st;
        pl = lpx_shard(0);
    }
    }
    return lpx_dtensor_distribute(s->q ? s->q : s->full, s->mesh, &pl, &s->dt);
}

static lpx_status dt_call(lpx_comm *c, int rank, void *p)
{
    (void)c, (void)rank;
    dt_state *s = p;
    lpx_placement to;
    switch (dt_which) {
    case 0: to = lpx_replicate(); return lpx_dtensor_redistribute(s->dt, &to, &s->out);
    case 1: to = lpx_shard(0); return lpx_dtensor_redistribute(s->dt, &to, &s->out);
    case 2: to = lpx_shard(0); return lpx_dtensor_redistribute(s->dt, &to, &s->out);
    default: return lpx_dtensor_full_tensor(s->dt, &s->out);
    }
}

static void dt_cleanup(lpx_comm *c, int rank, void *p, lpx_status st)
{
    (void)c, (void)rank;
    dt_state *s = p;
    OOM_OUT_NULL(st, s->out);
    lpx_tensor_release(s->out);
    lpx_tensor_release(s->dt);
    lpx_tensor_release(s->q);
    lpx_tensor_release(s->full);
    lpx_mesh_release(s->mesh);
}

static lpx_status dt(int which)
{
    dt_which = which;
    oom_ranks r = {.nranks = 2, .state_size = sizeof(dt_state), .setup = dt_setup, .call = dt_call,
                   .cleanup = dt_cleanup};
    return oom_run_ranks(&r);
}
static lpx_status c_redistribute_gather(int a) { (void)a; return dt(0); }
static lpx_status c_redistribute_rs(int a) { (void)a; return dt(1); }
static lpx_status c_redistribute_dims(int a) { (void)a; return dt(2); }
static lpx_status c_full_tensor(int a) { (void)a; return dt(3); }
static lpx_status c_full_tensor_nf4(int a) { (void)a; return dt(4); }

/* ---- the sharding engine -------------------------------------------------------------- */

/* Four parameters in two groups: g0 = {dense f32 [10, 6] (uneven shards),
 * nf4 [12, 64] frozen}, g1 = {float8_weight over bf16 [16, 32], bf16 [7]
 * no decay}. A stage says how far the setup goes before the swept call. */
enum { ST_ENGINE, ST_GROUPS, ST_SHARDED, ST_UNSHARDED, ST_GRADS, ST_REDUCED };

typedef struct fsdp_state {
    lpx_mesh *mesh;
    lpx_fsdp *f;
    lpx_fsdp_group *g[2];
    lpx_tensor *p[4];
    lpx_tensor *grad;   /* a full-shape grad of the float8_weight param, for set_grad */
} fsdp_state;

typedef struct fsdp_plan {
    int stage;
    lpx_fsdp_config cfg;
    lpx_status (*call)(fsdp_state *s);
} fsdp_plan;

static const fsdp_plan *plan;

static lpx_status make_params(lpx_tensor **p)
{
    lpx_status st;
    int64_t s0[2] = {10, 6}, s1[2] = {12, 64}, s2[2] = {16, 32}, s3[1] = {7};
    lpx_tensor *w1 = NULL, *m2 = NULL;
    if ((st = lpx_randn(2, s0, 1, LPX_F32, lpx_cpu(), &p[0]))) return st;
    if ((st = lpx_randn(2, s1, 2, LPX_BF16, lpx_cpu(), &w1))) return st;
    lpx_nf4_config cfg = lpx_nf4_config_default();
    cfg.block = 32;
    cfg.scaler_block = 2;   /* one row of 64 per scaler block: shards cut anywhere */
    st = lpx_nf4_quantize(w1, &cfg, &p[1]);
    lpx_tensor_release(w1);
    if (st) return st;
    if ((st = lpx_randn(2, s2, 3, LPX_BF16, lpx_cpu(), &m2))) return st;
    st = lpx_float8_weight_new(m2, NULL, &p[2]);
    lpx_tensor_release(m2);
    if (st) return st;
    return lpx_randn(1, s3, 4, LPX_BF16, lpx_cpu(), &p[3]);
}

static lpx_status set_grads(fsdp_state *s)
{
    static const int gi[3][2] = {{0, 0}, {1, 0}, {1, 1}};   /* (group, index) of the trainable params */
    lpx_status st = LPX_OK;
    for (int k = 0; k < 3 && !st; k++) {
        lpx_tensor *grad = NULL;
        int64_t shapes[3][2] = {{10, 6}, {16, 32}, {7, 0}};
        lpx_dtype dts[3] = {LPX_F32, LPX_BF16, LPX_BF16};
        st = lpx_randn(k == 2 ? 1 : 2, shapes[k], 100 + (uint64_t)k, dts[k], lpx_cpu(), &grad);
        if (!st) st = lpx_fsdp_set_grad(s->g[gi[k][0]], gi[k][1], grad);
        lpx_tensor_release(grad);
    }
    return st;
}

static lpx_status fsdp_setup(lpx_comm *c, int rank, void *ps)
{
    (void)rank;
    fsdp_state *s = ps;
    lpx_status st = lpx_mesh_new(c, &s->mesh);
    if (!st) st = make_params(s->p);
    if (!st) st = lpx_fsdp_new(s->mesh, &plan->cfg, &s->f);
    int64_t gshape[2] = {16, 32};
    if (!st) st = lpx_randn(2, gshape, 77, LPX_BF16, lpx_cpu(), &s->grad);
    if (st || plan->stage < ST_GROUPS) return st;
    if ((st = lpx_fsdp_group_add(s->f, "g0", &s->g[0])) || (st = lpx_fsdp_group_add(s->f, "g1", &s->g[1])) ||
        (st = lpx_fsdp_param_add(s->g[0], "w0", s->p[0], 0, NULL)) ||
        (st = lpx_fsdp_param_add(s->g[0], "nf4", s->p[1], LPX_FSDP_FROZEN, NULL)) ||
        (st = lpx_fsdp_param_add(s->g[1], "f8w", s->p[2], 0, NULL)) ||
        (st = lpx_fsdp_param_add(s->g[1], "b", s->p[3], LPX_FSDP_NO_DECAY, NULL)))
        return st;
    if (plan->stage < ST_SHARDED || (st = lpx_fsdp_shard(s->f))) return st;
    if (plan->stage < ST_UNSHARDED || (st = lpx_fsdp_unshard(s->g[0]))) return st;
    if (plan->stage < ST_GRADS || (st = set_grads(s))) return st;
    if (plan->stage < ST_REDUCED || (st = lpx_fsdp_reduce_scatter_grads(s->g[0])) ||
        (st = lpx_fsdp_reduce_scatter_grads(s->g[1])))
        return st;
    return LPX_OK;
}

static lpx_status fsdp_call(lpx_comm *c, int rank, void *ps)
{
    (void)c, (void)rank;
    fsdp_state *s = ps;
    return plan->call(s);
}

static void fsdp_cleanup(lpx_comm *c, int rank, void *ps, lpx_status st)
{
    (void)c, (void)rank, (void)st;
    fsdp_state *s = ps;
    lpx_fsdp_free(s->f);
    lpx_mesh_release(s->mesh);
    for (int i = 0; i < 4; i++) lpx_tensor_release(s->p[i]);
    lpx_tensor_release(s->grad);
}

static lpx_status run_plan(const fsdp_plan *p)
{
    plan = p;
    oom_ranks r = {.nranks = 2, .state_size = sizeof(fsdp_state), .setup = fsdp_setup, .call = fsdp_call,
                   .cleanup = fsdp_cleanup};
    return oom_run_ranks(&r);
}

/* the calls (every rank makes the same one) */
static lpx_status call_shard(fsdp_state *s) { return lpx_fsdp_shard(s->f); }
static lpx_status call_unshard0(fsdp_state *s) { return lpx_fsdp_unshard(s->g[0]); }
static lpx_status call_unshard1(fsdp_state *s) { return lpx_fsdp_unshard(s->g[1]); }
/* keep_storage: the second unshard refills the kept tensors in place */
static lpx_status call_unshard_again(fsdp_state *s)
{
    lpx_status st = lpx_fsdp_reshard(s->g[0]);
    return st ? st : lpx_fsdp_unshard(s->g[0]);
}
static lpx_status call_prefetch(fsdp_state *s) { return lpx_fsdp_prefetch(s->g[1]); }
static lpx_status call_reshard(fsdp_state *s) { return lpx_fsdp_reshard(s->g[0]); }
static lpx_status call_set_grad(fsdp_state *s) { return lpx_fsdp_set_grad(s->g[1], 0, s->grad); }
static lpx_status call_rs0(fsdp_state *s) { return lpx_fsdp_reduce_scatter_grads(s->g[0]); }
static lpx_status call_rs1(fsdp_state *s) { return lpx_fsdp_reduce_scatter_grads(s->g[1]); }
static lpx_status call_adamw(fsdp_state *s)
{
    lpx_adamw_opts o = lpx_adamw_opts_default();
    lpx_status st = lpx_fsdp_adamw_step(s->g[0], &o);
    return st ? st : lpx_fsdp_adamw_step(s->g[1], &o);
}
static lpx_status call_pre_group(fsdp_state *s) { return lpx_fsdp_group_precompute_scales(s->g[1]); }
static lpx_status call_pre_all(fsdp_state *s) { return lpx_fsdp_precompute_scales(s->f); }

/* checkpoints: save, and save then load, under the sweep (a directory of
 * this process's own; the cleanup of the sweep's program removes it) */
static char ckpt_path[128];
static void ckpt_remove(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.tmp' '%s.old'", ckpt_path, ckpt_path, ckpt_path);
    if (system(cmd)) fprintf(stderr, "oom: could not remove %s\n", ckpt_path);
}
static const char *ckpt_dir(void)
{
    if (!ckpt_path[0]) {
        snprintf(ckpt_path, sizeof ckpt_path, "/tmp/lpx-oom-ckpt-%d", (int)getpid());
        atexit(ckpt_remove);
    }
    return ckpt_path;
}
static lpx_status call_save(fsdp_state *s) { return lpx_fsdp_save(s->f, ckpt_dir()); }
/* the check of a target that holds a checkpoint (its index is read) */
static lpx_status call_save_check(fsdp_state *s)
{
    lpx_status st = lpx_fsdp_save(s->f, ckpt_dir());
    return st ? st : lpx_fsdp_save_check(ckpt_dir());
}
static lpx_status call_load(fsdp_state *s)
{
    lpx_status st = lpx_fsdp_save(s->f, ckpt_dir());
    return st ? st : lpx_fsdp_load(s->f, ckpt_dir());
}

/* the same with a user object and an extra tensor per rank; the load
 * with and without checksums; the reader; the consolidated export */
static lpx_status save_ex(fsdp_state *s)
{
    int64_t n = 3;
    lpx_tensor *ex = NULL;
    lpx_status st = lpx_zeros(1, &n, LPX_U8, lpx_cpu(), &ex);
    if (st) return st;
    char name[32];
    snprintf(name, sizeof name, "loader/%d", lpx_comm_rank(lpx_mesh_comm(s->mesh, 0)));
    const char *names[1] = {name};
    lpx_fsdp_ckpt_opts o = {.struct_size = sizeof o, .user_json = "{\"step\": 3, \"note\": [1, 2]}", .nextra = 1,
                            .extra_names = names, .extra = &ex};
    st = lpx_fsdp_save_ex(s->f, ckpt_dir(), &o);
    lpx_tensor_release(ex);
    return st;
}
static lpx_status call_save_ex(fsdp_state *s) { return save_ex(s); }
static lpx_status call_load_ex(fsdp_state *s)
{
    lpx_status st = save_ex(s);
    lpx_fsdp_ckpt_opts o = {.struct_size = sizeof o, .flags = LPX_FSDP_CKPT_NO_VERIFY};
    if (!st) st = lpx_fsdp_load_ex(s->f, ckpt_dir(), NULL);
    return st ? st : lpx_fsdp_load_ex(s->f, ckpt_dir(), &o);
}
static lpx_status call_reader(fsdp_state *s)
{
    lpx_status st = save_ex(s);
    lpx_fsdp_ckpt *c = NULL;
    lpx_tensor *t = NULL;
    lpx_fsdp_ckpt_param_info pi;
    if (!st) st = lpx_fsdp_ckpt_open(ckpt_dir(), &c);
    for (int i = 0; !st && i < lpx_fsdp_ckpt_param_count(c); i++) st = lpx_fsdp_ckpt_param(c, i, &pi);
    if (!st && !lpx_fsdp_ckpt_user(c)) st = lpx_error(LPX_EINTERNAL, "oom: no user object");
    if (!st) st = lpx_fsdp_ckpt_extra(c, "loader/1", 0, &t);
    lpx_tensor_release(t);
    lpx_fsdp_ckpt_close(c);
    return st;
}
static bool export_name(void *ctx, lpx_fsdp_group *g, int i, char *buf, size_t len)
{
    (void)ctx;
    snprintf(buf, len, "m.%s.%d", lpx_fsdp_group_name(g), i);
    return true;
}
static bool import_name(void *ctx, lpx_fsdp_group *g, int i, char *buf, size_t len)
{
    if (lpx_tensor_kind(lpx_fsdp_param_local(g, i)) && !lpx_kind_vtable(lpx_tensor_kind(lpx_fsdp_param_local(g, i)))->master)
        return false;
    return export_name(ctx, g, i, buf, len);
}
static lpx_status call_export(fsdp_state *s)
{
    char path[200];
    snprintf(path, sizeof path, "%s.safetensors", ckpt_dir());
    lpx_safetensors_kv kv = {"format", "pt"};
    lpx_status st = lpx_fsdp_export(s->f, path, LPX_BF16, export_name, NULL, 1, &kv);
    if (lpx_comm_rank(lpx_mesh_comm(s->mesh, 0)) == 0) unlink(path);
    return st;
}

static lpx_status call_import(fsdp_state *s)
{
    char path[200];
    snprintf(path, sizeof path, "%s.safetensors", ckpt_dir());
    lpx_status st = lpx_fsdp_export(s->f, path, LPX_F32, export_name, NULL, 0, NULL);
    if (st) return st;   /* the same on every rank (collective) */
    lpx_safetensors *sf = NULL;
    st = lpx_safetensors_open(path, &sf);
    /* the open is local: every rank learns whether all opened before the
     * collective import (allocation-free), and before rank 0 unlinks */
    float bad = st ? 1.0f : 0.0f;
    lpx_status a = lpx_comm_all_reduce_buf(lpx_mesh_comm(s->mesh, 0), &bad, &bad, 1, LPX_F32, LPX_REDUCE_MAX);
    /* the NF4 base (no master) cannot be cut from rows: import the others */
    if (!st && !a && bad == 0.0f) st = lpx_fsdp_import(s->f, 1, &sf, import_name, NULL);
    else if (!st) st = a ? a : lpx_error(LPX_ENOMEM, "oom: another rank could not open the export");
    lpx_safetensors_close(sf);
    if (lpx_comm_rank(lpx_mesh_comm(s->mesh, 0)) == 0) unlink(path);
    return st;
}

#define PLAN_CASE(cname, stage_, call_, ...)                                              \
    static lpx_status cname(int attempt)                                                  \
    {                                                                                     \
        (void)attempt;                                                                    \
        static const fsdp_plan p = {stage_, {.struct_size = sizeof(lpx_fsdp_config), __VA_ARGS__}, call_}; \
        return run_plan(&p);                                                              \
    }

PLAN_CASE(c_fsdp_shard, ST_GROUPS, call_shard, .max_unsharded = 2)
PLAN_CASE(c_fsdp_unshard, ST_SHARDED, call_unshard0, .max_unsharded = 2)
PLAN_CASE(c_fsdp_unshard_f8, ST_SHARDED, call_unshard1, .max_unsharded = 2)
PLAN_CASE(c_fsdp_unshard_bf16, ST_SHARDED, call_unshard0, .param_dtype = LPX_BF16)
PLAN_CASE(c_fsdp_unshard_keep, ST_UNSHARDED, call_unshard_again, .keep_storage = true)
PLAN_CASE(c_fsdp_prefetch, ST_UNSHARDED, call_prefetch, .max_unsharded = 2)
PLAN_CASE(c_fsdp_reshard, ST_UNSHARDED, call_reshard, .max_unsharded = 2)
PLAN_CASE(c_fsdp_set_grad, ST_SHARDED, call_set_grad, .max_unsharded = 2)
PLAN_CASE(c_fsdp_rs, ST_GRADS, call_rs0, .max_unsharded = 2)
PLAN_CASE(c_fsdp_rs_mixed, ST_GRADS, call_rs1, .max_unsharded = 2)
PLAN_CASE(c_fsdp_rs_fp8, ST_GRADS, call_rs1, .fp8_grad_reduce = true)
PLAN_CASE(c_fsdp_adamw, ST_REDUCED, call_adamw, .max_unsharded = 2)
PLAN_CASE(c_fsdp_pre_group, ST_SHARDED, call_pre_group, .max_unsharded = 2)
PLAN_CASE(c_fsdp_pre_all, ST_SHARDED, call_pre_all, .max_unsharded = 2)
PLAN_CASE(c_fsdp_save, ST_SHARDED, call_save, .max_unsharded = 2)
PLAN_CASE(c_fsdp_load, ST_SHARDED, call_load, .max_unsharded = 2)
PLAN_CASE(c_fsdp_save_check, ST_SHARDED, call_save_check, .max_unsharded = 2)
PLAN_CASE(c_fsdp_save_ex, ST_SHARDED, call_save_ex, .max_unsharded = 2)
PLAN_CASE(c_fsdp_load_ex, ST_SHARDED, call_load_ex, .max_unsharded = 2)
PLAN_CASE(c_fsdp_reader, ST_SHARDED, call_reader, .max_unsharded = 2)
PLAN_CASE(c_fsdp_export, ST_SHARDED, call_export, .max_unsharded = 2)
PLAN_CASE(c_fsdp_import, ST_SHARDED, call_import, .max_unsharded = 2)

/* the engine's local calls, on rank 0 of a two-rank group from this thread */
static lpx_status c_fsdp_new(int attempt)
{
    (void)attempt;
    pair p;
    OOM_SETUP(pair_open(&p));
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .keep_storage = true};
    lpx_fsdp *f = NULL;
    lpx_status st = OOM(lpx_fsdp_new(p.mesh, &cfg, &f));
    OOM_OUT_NULL(st, f);
    OOM_CHECK(lpx_mesh_refcount(p.mesh) == (st ? 1 : 2));
    lpx_fsdp_free(f);
    pair_close(&p);
    return st;
}

static lpx_status fsdp_local(int which)
{
    pair p;
    OOM_SETUP(pair_open(&p));
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_tensor *params[4] = {0};
    OOM_SETUP(lpx_fsdp_new(p.mesh, NULL, &f));
    OOM_SETUP(make_params(params));
    lpx_status st;
    if (which == 0) {
        st = OOM(lpx_fsdp_group_add(f, "layer_with_a_name", &g));
        OOM_OUT_NULL(st, g);
        OOM_CHECK(lpx_fsdp_group_count(f) == (st ? 0 : 1));
    } else if (which == 3) {
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        st = OOM(lpx_fsdp_stats_get(f, &s));
    } else {
        OOM_SETUP(lpx_fsdp_group_add(f, "g", &g));
        int idx = -1;
        st = OOM(lpx_fsdp_param_add(g, which == 1 ? "nf4" : "f8w", params[which == 1 ? 1 : 2],
                                     which == 1 ? LPX_FSDP_FROZEN : 0, &idx));
        OOM_CHECK(lpx_fsdp_param_count(g) == (st ? 0 : 1));
    }
    lpx_fsdp_free(f);
    for (int i = 0; i < 4; i++) lpx_tensor_release(params[i]);
    pair_close(&p);
    return st;
}
static lpx_status c_fsdp_group_add(int a) { (void)a; return fsdp_local(0); }
static lpx_status c_fsdp_param_add_nf4(int a) { (void)a; return fsdp_local(1); }
static lpx_status c_fsdp_param_add_f8w(int a) { (void)a; return fsdp_local(2); }
static lpx_status c_fsdp_stats_get(int a) { (void)a; return fsdp_local(3); }

/* the AdamW state of a parameter after one step: a one-rank engine driven
 * from this thread (collectives of one rank need no peer thread) */
static lpx_status adamw_state(int mode /* 0: state, 1: set, 2: view */)
{
    bool set = mode == 1;
    lpx_comm *c = NULL;
    OOM_SETUP(lpx_local_comm_group_create(1, &c));
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_tensor *w = oom_randn2(6, 4, 1, LPX_BF16), *grad = oom_randn2(6, 4, 2, LPX_F32), *m = NULL, *v = NULL;
    OOM_SETUP(lpx_mesh_new(c, &mesh));
    OOM_SETUP(lpx_fsdp_new(mesh, NULL, &f));
    OOM_SETUP(lpx_fsdp_group_add(f, "g", &g));
    OOM_SETUP(lpx_fsdp_param_add(g, "w", w, 0, NULL));
    OOM_SETUP(lpx_fsdp_shard(f));
    OOM_SETUP(lpx_fsdp_set_grad(g, 0, grad));
    OOM_SETUP(lpx_fsdp_reduce_scatter_grads(g));
    lpx_adamw_opts o = lpx_adamw_opts_default();
    OOM_SETUP(lpx_fsdp_adamw_step(g, &o));
    int64_t step = -1;
    lpx_status st;
    if (mode == 2) {
        /* the borrowed view holds exactly the copy's values */
        lpx_tensor *mc = NULL;
        OOM_SETUP(lpx_fsdp_param_adamw_state(g, 0, &mc, NULL, NULL));
        st = OOM(lpx_fsdp_param_adamw_view(g, 0, &m, &v, &step));
        OOM_OUT_NULL(st, m);
        OOM_OUT_NULL(st, v);
        OOM_CHECK(st || (step == 1 && !memcmp(lpx_tensor_data(m), lpx_tensor_data(mc), 6 * 4 * sizeof(float))));
        lpx_tensor_release(mc);
    } else if (!set) {
        st = OOM(lpx_fsdp_param_adamw_state(g, 0, &m, &v, &step));
        OOM_OUT_NULL(st, m);
        OOM_OUT_NULL(st, v);
        OOM_CHECK(st || step == 1);
    } else {
        OOM_SETUP(lpx_fsdp_param_adamw_state(g, 0, &m, &v, &step));
        OOM_SETUP(lpx_fill_(m, 0.5));
        st = OOM(lpx_fsdp_param_set_adamw_state(g, 0, m, v, 7));
        lpx_tensor *m2 = NULL;
        int64_t step2 = -1;
        OOM_SETUP(lpx_fsdp_param_adamw_state(g, 0, &m2, NULL, &step2));
        double x = 0;
        OOM_CHECK(lpx_item(m2, 0, &x) == LPX_OK);
        OOM_CHECKF(st ? (step2 == 1 && x != 0.5) : (step2 == 7 && x == 0.5), "set_adamw_state: step %lld, m %g after %s",
                   (long long)step2, x, st ? "a failure (must change nothing)" : "success");
        lpx_tensor_release(m2);
    }
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    lpx_fsdp_free(f);
    lpx_mesh_release(mesh);
    lpx_tensor_release(w);
    lpx_tensor_release(grad);
    lpx_comm_destroy(c);
    return st;
}
static lpx_status c_adamw_state(int a) { (void)a; return adamw_state(0); }
static lpx_status c_set_adamw_state(int a) { (void)a; return adamw_state(1); }
static lpx_status c_adamw_view(int a) { (void)a; return adamw_state(2); }

static lpx_status c_f8w_new(int attempt)
{
    (void)attempt;
    lpx_tensor *m = oom_randn2(16, 32, 9, LPX_F32), *w = NULL;
    lpx_float8_weight_opts o = {.struct_size = sizeof o, .rowwise = true};
    lpx_status st = OOM(lpx_float8_weight_new(m, &o, &w));
    OOM_OUT_NULL(st, w);
    OOM_CHECK(lpx_tensor_refcount(m) == (st ? 1 : 2));
    lpx_tensor_release(w);
    lpx_tensor_release(m);
    return st;
}

static lpx_status c_f8w_set_scale(int attempt)
{
    (void)attempt;
    lpx_tensor *m = oom_randn2(16, 32, 9, LPX_F32), *w = NULL;
    OOM_SETUP(lpx_float8_weight_new(m, NULL, &w));
    lpx_status st = OOM(lpx_float8_weight_set_scale(w, 4.0f));
    OOM_CHECK(st || lpx_float8_weight_scale(w) == 4.0f);
    lpx_tensor_release(w);
    lpx_tensor_release(m);
    return st;
}

/* The low-precision optimizer state and scaled-f16 master of a one-rank
 * engine after one step (lpx_fsdp_group_set_optim): each call under the
 * sweep, the state as it was when a call fails. */
static lpx_status optim_engine(int mode)
{
    lpx_comm *c = NULL;
    OOM_SETUP(lpx_local_comm_group_create(1, &c));
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_tensor *w = oom_randn2(6, 64, 1, LPX_F32), *grad = oom_randn2(6, 64, 2, LPX_F32), *m = NULL, *v = NULL,
               *t = NULL;
    OOM_SETUP(lpx_mesh_new(c, &mesh));
    OOM_SETUP(lpx_fsdp_new(mesh, NULL, &f));
    OOM_SETUP(lpx_fsdp_group_add(f, "g", &g));
    OOM_SETUP(lpx_fsdp_param_add(g, "w", w, 0, NULL));
    lpx_fsdp_optim o = {sizeof o, LPX_FSDP_STATE_8BIT, 64, LPX_FSDP_MASTER_F16S, 5};
    lpx_status st = LPX_OK;
    if (mode == 0) st = OOM(lpx_fsdp_group_set_optim(g, &o));
    else OOM_SETUP(lpx_fsdp_group_set_optim(g, &o));
    if (mode == 0) goto done;
    OOM_SETUP(lpx_fsdp_shard(f));
    OOM_SETUP(lpx_fsdp_set_grad(g, 0, grad));
    OOM_SETUP(lpx_fsdp_reduce_scatter_grads(g));
    lpx_adamw_opts ao = lpx_adamw_opts_default();
    OOM_SETUP(lpx_fsdp_adamw_step(g, &ao));
    int64_t step = -1, sb = 0, mb = 0, np = 0;
    switch (mode) {
    case 1:
        st = OOM(lpx_fsdp_param_optim_state(g, 0, &m, &v, &step));
        OOM_OUT_NULL(st, m);
        OOM_CHECK(st || (m && v && step == 1));
        break;
    case 2:
        OOM_SETUP(lpx_fsdp_param_optim_state(g, 0, &m, &v, &step));
        st = OOM(lpx_fsdp_param_set_optim_state(g, 0, m, v, 3));
        break;
    case 3:
        st = OOM(lpx_fsdp_param_master_scale(g, 0, &t));
        OOM_OUT_NULL(st, t);
        break;
    case 4:
        OOM_SETUP(lpx_fsdp_param_master_scale(g, 0, &t));
        st = OOM(lpx_fsdp_param_set_master_scale(g, 0, t));
        break;
    case 5:
        st = OOM(lpx_fsdp_param_master_dense(g, 0, &t));
        OOM_OUT_NULL(st, t);
        break;
    case 6: {
        lpx_fsdp_optim back;
        st = OOM(lpx_fsdp_group_get_optim(g, &back));
        OOM_CHECK(st || (back.state == LPX_FSDP_STATE_8BIT && back.block == 64));
        st = st ? st : OOM(lpx_fsdp_optim_bytes(f, &sb, &mb, &np));
        OOM_CHECK(st || (np == 6 * 64 && sb > 0 && mb > 0));
        break;
    }
    default: {
        char path[200];
        snprintf(path, sizeof path, "%s-optim.safetensors", ckpt_dir());
        st = OOM(lpx_fsdp_export_ex(f, path, LPX_F32, NULL, NULL, 0, NULL, LPX_FSDP_EXPORT_OPTIM_STATE));
        unlink(path);
        break;
    }
    }
done:
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    lpx_tensor_release(t);
    lpx_fsdp_free(f);
    lpx_mesh_release(mesh);
    lpx_tensor_release(w);
    lpx_tensor_release(grad);
    lpx_comm_destroy(c);
    return st;
}
static lpx_status c_set_optim(int a) { (void)a; return optim_engine(0); }
static lpx_status c_optim_state(int a) { (void)a; return optim_engine(1); }
static lpx_status c_set_optim_state(int a) { (void)a; return optim_engine(2); }
static lpx_status c_master_scale(int a) { (void)a; return optim_engine(3); }
static lpx_status c_set_master_scale(int a) { (void)a; return optim_engine(4); }
static lpx_status c_master_dense(int a) { (void)a; return optim_engine(5); }
static lpx_status c_optim_get(int a) { (void)a; return optim_engine(6); }
static lpx_status c_export_optim(int a) { (void)a; return optim_engine(7); }

const oom_case oom_cases_dist[] = {
    {"lpx_local_comm_group_create", "3 ranks", c_group_create, 0},
    {"lpx_local_run", "2 ranks", c_local_run, 0},
    {"lpx_comm_run", "local, 2 ranks", c_comm_run, 0},
    {"lpx_comm_new", NULL, c_comm_new, 0},
    {"lpx_comm_backend_register", NULL, c_comm_backend_register, OOM_PERSISTENT},
    {"lpx_comm_backend_find", NULL, c_comm_backend_find, 0},
    {"lpx_comm_set_timeout", NULL, c_comm_set_timeout, 0},
    {"lpx_comm_stats_get", NULL, c_comm_stats_get, 0},
    {"lpx_comm_reduce_buffers", NULL, c_reduce_buffers, 0},
    {"lpx_comm_all_gather_buf", "2 ranks", c_all_gather_buf, 0},
    {"lpx_comm_all_gather", "2 ranks, bf16", c_all_gather, 0},
    {"lpx_comm_reduce_scatter_buf", "2 ranks", c_reduce_scatter_buf, 0},
    {"lpx_comm_reduce_scatter", "2 ranks, bf16", c_reduce_scatter, 0},
    {"lpx_comm_all_reduce_buf", "2 ranks, in place", c_all_reduce_buf, 0},
    {"lpx_comm_all_reduce", "2 ranks", c_all_reduce, 0},
    {"lpx_comm_broadcast_buf", "2 ranks", c_broadcast_buf, 0},
    {"lpx_comm_broadcast", "2 ranks", c_broadcast, 0},
    {"lpx_comm_barrier", "2 ranks", c_barrier, 0},
    {"lpx_mesh_new", NULL, c_mesh_new, 0},
    {"lpx_mesh_new_2d", NULL, c_mesh_new_2d, 0},
    {"lpx_shard_range", NULL, c_shard_range, 0},
    {"lpx_dtensor_from_local", NULL, c_from_local, 0},
    {"lpx_dtensor_distribute", "Shard(1)", c_distribute, 0},
    {"lpx_dtensor_distribute", "nf4, Shard(0)", c_distribute_nf4, 0},
    {"lpx_dtensor_distribute", "Partial(sum)", c_distribute_partial, 0},
    {"lpx_dtensor_placement", NULL, c_placement, 0},
    {"lpx_dtensor_redistribute", "2 ranks, Shard(0) -> Replicate", c_redistribute_gather, 0},
    {"lpx_dtensor_redistribute", "2 ranks, Partial -> Shard(0)", c_redistribute_rs, 0},
    {"lpx_dtensor_redistribute", "2 ranks, Shard(1) -> Shard(0)", c_redistribute_dims, 0},
    {"lpx_dtensor_full_tensor", "2 ranks", c_full_tensor, 0},
    {"lpx_dtensor_full_tensor", "2 ranks, nf4", c_full_tensor_nf4, 0},
    {"lpx_fsdp_new", NULL, c_fsdp_new, 0},
    {"lpx_fsdp_group_add", NULL, c_fsdp_group_add, 0},
    {"lpx_fsdp_param_add", "nf4 frozen", c_fsdp_param_add_nf4, 0},
    {"lpx_fsdp_param_add", "float8_weight", c_fsdp_param_add_f8w, 0},
    {"lpx_fsdp_stats_get", NULL, c_fsdp_stats_get, 0},
    {"lpx_fsdp_shard", "2 ranks, dense/nf4/float8_weight", c_fsdp_shard, 0},
    {"lpx_fsdp_unshard", "2 ranks, dense + nf4", c_fsdp_unshard, 0},
    {"lpx_fsdp_unshard", "2 ranks, float8_weight + bf16", c_fsdp_unshard_f8, 0},
    {"lpx_fsdp_unshard", "2 ranks, param_dtype bf16", c_fsdp_unshard_bf16, 0},
    {"lpx_fsdp_unshard", "2 ranks, keep_storage refill", c_fsdp_unshard_keep, 0},
    {"lpx_fsdp_prefetch", "2 ranks", c_fsdp_prefetch, 0},
    {"lpx_fsdp_reshard", "2 ranks", c_fsdp_reshard, 0},
    {"lpx_fsdp_set_grad", "2 ranks", c_fsdp_set_grad, 0},
    {"lpx_fsdp_reduce_scatter_grads", "2 ranks, f32", c_fsdp_rs, 0},
    {"lpx_fsdp_reduce_scatter_grads", "2 ranks, bf16", c_fsdp_rs_mixed, 0},
    {"lpx_fsdp_reduce_scatter_grads", "2 ranks, fp8 shared scale", c_fsdp_rs_fp8, 0},
    {"lpx_fsdp_adamw_step", "2 ranks", c_fsdp_adamw, 0},
    {"lpx_fsdp_param_adamw_state", "1 rank", c_adamw_state, 0},
    {"lpx_fsdp_param_set_adamw_state", "1 rank", c_set_adamw_state, 0},
    {"lpx_fsdp_param_adamw_view", "1 rank, equal to the copy", c_adamw_view, 0},
    {"lpx_fsdp_group_precompute_scales", "2 ranks", c_fsdp_pre_group, 0},
    {"lpx_fsdp_precompute_scales", "2 ranks", c_fsdp_pre_all, 0},
    {"lpx_fsdp_save", "2 ranks, dense/nf4/float8_weight", c_fsdp_save, 0},
    {"lpx_fsdp_load", "2 ranks, after a save", c_fsdp_load, 0},
    {"lpx_fsdp_save_check", "a directory holding a checkpoint", c_fsdp_save_check, 0},
    {"lpx_fsdp_save_ex", "2 ranks, a user object and extras", c_fsdp_save_ex, 0},
    {"lpx_fsdp_load_ex", "2 ranks, verified and sizes only", c_fsdp_load_ex, 0},
    {"lpx_fsdp_ckpt_open", "every parameter, the user object, another rank's extra", c_fsdp_reader, 0},
    {"lpx_fsdp_ckpt_param", "every parameter", c_fsdp_reader, 0},
    {"lpx_fsdp_ckpt_extra", "another rank's extra", c_fsdp_reader, 0},
    {"lpx_fsdp_export", "2 ranks, bf16, renamed", c_fsdp_export, 0},
    {"lpx_fsdp_import", "2 ranks, after an export", c_fsdp_import, 0},
    {"lpx_fsdp_group_set_optim", "8-bit moments, scaled-f16 master", c_set_optim, 0},
    {"lpx_fsdp_group_get_optim", "after a step", c_optim_get, 0},
    {"lpx_fsdp_optim_bytes", "after a step", c_optim_get, 0},
    {"lpx_fsdp_param_optim_state", "1 rank, 8-bit", c_optim_state, 0},
    {"lpx_fsdp_param_set_optim_state", "1 rank, 8-bit", c_set_optim_state, 0},
    {"lpx_fsdp_param_master_scale", "1 rank, scaled f16", c_master_scale, 0},
    {"lpx_fsdp_param_set_master_scale", "1 rank, scaled f16", c_set_master_scale, 0},
    {"lpx_fsdp_param_master_dense", "1 rank, scaled f16", c_master_dense, 0},
    {"lpx_fsdp_export_ex", "1 rank, with the optimizer state", c_export_optim, 0},
    {"lpx_float8_weight_new", "rowwise", c_f8w_new, 0},
    {"lpx_float8_weight_set_scale", NULL, c_f8w_set_scale, 0},
    {NULL, NULL, NULL, 0},
};
