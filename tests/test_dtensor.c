/* The DTensor kind over the local backend: torch.chunk geometry,
 * all_gather(shards) == full tensor, redistribute round trips through
 * every transition, reduce-scatter == sum-then-shard, float8 and nf4
 * locals (bit for bit), op handlers, mesh refcounting, and the failure
 * model (a failing or stalling rank makes the others fail, no hang). */
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dt_util.h"

static const int64_t shapes[][2] = {{5, 3}, {1, 7}, {8, 2}, {13, 4}, {0, 3}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static void test_shard_range(void)
{
    int64_t c, s, l;
    /* torch.chunk(5 rows, 4): 2, 2, 1, 0 */
    const int64_t want[4][2] = {{0, 2}, {2, 2}, {4, 1}, {5, 0}};
    for (int r = 0; r < 4; r++) {
        CHECK_OK(lpx_shard_range(5, 4, r, 1, &c, &s, &l));
        CHECK(c == 2 && s == want[r][0] && l == want[r][1]);
    }
    /* units: 10 rows over 3 ranks in units of 4: chunk 4 -> 4, 4, 2 */
    CHECK_OK(lpx_shard_range(10, 3, 2, 4, &c, &s, &l));
    CHECK(c == 4 && s == 8 && l == 2);
    CHECK_ERR(lpx_shard_range(10, 0, 0, 1, &c, &s, &l), LPX_EINVAL);
    CHECK_ERR(lpx_shard_range(10, 2, 2, 1, &c, &s, &l), LPX_EINVAL);
}

/* ---- dense round trips ------------------------------------------------ */

static lpx_tensor *make_full(int which, uint64_t seed)
{
    lpx_tensor *t = NULL;
    lpx_randn(2, shapes[which], seed, LPX_F32, lpx_cpu(), &t);
    return t;
}

static lpx_status rt_rank(lpx_comm *comm, void *ctx)
{
    (void)ctx;
    int r = lpx_comm_rank(comm), w = lpx_comm_size(comm);
    lpx_mesh *mesh = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (st) return st;
    for (int s = 0; s < NSHAPES; s++) {
        lpx_tensor *full = make_full(s, 7 + (uint64_t)s), *dt = NULL, *got = NULL, *x = NULL, *y = NULL, *z = NULL;
        for (int d = 0; d < 2; d++) {
            lpx_placement p = lpx_shard(d);
            RCHECK_OK(r, lpx_dtensor_distribute(full, mesh, &p, &dt));
            /* the local is this rank's torch.chunk piece */
            int64_t c, st0, len;
            lpx_shard_range(shapes[s][d], w, r, 1, &c, &st0, &len);
            RCHECK(r, dt && lpx_tensor_shape(lpx_dtensor_local(dt))[d] == len);
            RCHECK_OK(r, lpx_dtensor_full_tensor(dt, &got));
            RCHECK(r, same_bits(got, full));
            lpx_tensor_release(got);
            got = NULL;
            /* S(d) -> S(1-d) -> R -> S(d) */
            lpx_placement o = lpx_shard(1 - d), rep = lpx_replicate();
            RCHECK_OK(r, lpx_dtensor_redistribute(dt, &o, &x));
            RCHECK_OK(r, lpx_dtensor_redistribute(x, &rep, &y));
            RCHECK(r, y && same_bits(lpx_dtensor_local(y), full));
            RCHECK_OK(r, lpx_dtensor_redistribute(y, &p, &z));
            RCHECK(r, z && same_bits(lpx_dtensor_local(z), lpx_dtensor_local(dt)));
            lpx_tensor_release(dt);
            lpx_tensor_release(x);
            lpx_tensor_release(y);
            lpx_tensor_release(z);
            dt = x = y = z = NULL;
        }
        /* Partial(sum): rank r holds full * (r + 1); R == the rank-order f32 sum */
        lpx_tensor *mine = NULL, *ref = NULL, *sum = NULL, *sh = NULL;
        RCHECK_OK(r, lpx_mul_scalar(full, r + 1, &mine));
        RCHECK_OK(r, lpx_zeros(2, shapes[s], LPX_F32, lpx_cpu(), &ref));
        for (int q = 0; q < w; q++) {
            lpx_tensor *t = NULL;
            RCHECK_OK(r, lpx_mul_scalar(full, q + 1, &t));
            RCHECK_OK(r, lpx_add_out(ref, t, ref));
            lpx_tensor_release(t);
        }
        lpx_placement ps = lpx_partial(LPX_REDUCE_SUM), rep = lpx_replicate(), s0 = lpx_shard(0), s1 = lpx_shard(1);
        RCHECK_OK(r, lpx_dtensor_from_local(mine, mesh, &ps, 2, shapes[s], &dt));
        RCHECK_OK(r, lpx_dtensor_redistribute(dt, &rep, &sum));
        RCHECK(r, sum && same_bits(lpx_dtensor_local(sum), ref));
        /* reduce-scatter == sum then shard, along both dims */
        for (int d = 0; d < 2; d++) {
            lpx_tensor *refd = NULL;
            RCHECK_OK(r, lpx_dtensor_redistribute(dt, d ? &s1 : &s0, &sh));
            RCHECK_OK(r, lpx_dtensor_distribute(ref, mesh, d ? &s1 : &s0, &refd));
            RCHECK(r, sh && refd && same_bits(lpx_dtensor_local(sh), lpx_dtensor_local(refd)));
            lpx_tensor_release(sh);
            lpx_tensor_release(refd);
            sh = NULL;
        }
        /* Replicate -> Partial(sum) -> Replicate is the identity */
        lpx_tensor *rp = NULL, *back = NULL;
        RCHECK_OK(r, lpx_dtensor_redistribute(sum, &ps, &rp));
        RCHECK_OK(r, lpx_dtensor_redistribute(rp, &rep, &back));
        RCHECK(r, back && same_bits(lpx_dtensor_local(back), ref));
        /* Partial(max) -> Replicate: max over ranks = full * w where full > 0 */
        lpx_tensor *pm = NULL, *mx = NULL;
        lpx_placement pmax = lpx_partial(LPX_REDUCE_MAX);
        RCHECK_OK(r, lpx_dtensor_from_local(mine, mesh, &pmax, 2, shapes[s], &pm));
        RCHECK_OK(r, lpx_dtensor_redistribute(pm, &rep, &mx));
        lpx_tensor_release(pm);
        lpx_tensor_release(mx);
        lpx_tensor_release(rp);
        lpx_tensor_release(back);
        lpx_tensor_release(mine);
        lpx_tensor_release(ref);
        lpx_tensor_release(sum);
        lpx_tensor_release(dt);
        lpx_tensor_release(full);
    }
    RCHECK(r, lpx_mesh_refcount(mesh) == 1);
    lpx_mesh_release(mesh);
    return LPX_OK;
}

static void test_dense_round_trips(void)
{
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], rt_rank, NULL);
}

/* ---- float8 and nf4 locals -------------------------------------------- */

static lpx_status f8_rank(lpx_comm *comm, void *ctx)
{
    (void)ctx;
    int r = lpx_comm_rank(comm);
    lpx_mesh *mesh = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (st) return st;
    const int64_t shape[2] = {37, 24};
    lpx_tensor *w = NULL, *q = NULL, *dt = NULL, *got = NULL, *fw = NULL, *dw = NULL, *gw = NULL;
    lpx_placement s0 = lpx_shard(0);
    RCHECK_OK(r, lpx_randn(2, shape, 11, LPX_F32, lpx_cpu(), &w));
    /* a float8 local (one tensor's shards share its scale) */
    RCHECK_OK(r, lpx_float8_quantize(w, NULL, &q, NULL));
    RCHECK_OK(r, lpx_dtensor_distribute(q, mesh, &s0, &dt));
    RCHECK_OK(r, lpx_dtensor_full_tensor(dt, &got));
    RCHECK(r, got && lpx_float8_is(got) && same_bits(got, q));
    /* float8_weight: cast each shard with the all-reduced scale, gather;
     * == quantize the full master (dynamic tensorwise), bit for bit */
    RCHECK_OK(r, lpx_float8_weight_new(w, NULL, &fw));
    RCHECK_OK(r, lpx_dtensor_distribute(fw, mesh, &s0, &dw));
    RCHECK_OK(r, lpx_dtensor_full_tensor(dw, &gw));
    RCHECK(r, gw && lpx_float8_is(gw));
    RCHECK(r, gw && same_bits(lpx_float8_data(gw), lpx_float8_data(q)) &&
                  same_bits(lpx_float8_scale(gw), lpx_float8_scale(q)));
    lpx_tensor *ts[] = {w, q, dt, got, fw, dw, gw};
    for (int i = 0; i < 7; i++) lpx_tensor_release(ts[i]);
    lpx_mesh_release(mesh);
    return LPX_OK;
}

static void test_float8_local(void)
{
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], f8_rank, NULL);
}

static lpx_status nf4_rank(lpx_comm *comm, void *ctx)
{
    (void)ctx;
    int r = lpx_comm_rank(comm);
    lpx_mesh *mesh = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (st) return st;
    /* 64 cols: a scaler block is 256 rows; 5 units + a 100-row tail */
    const int64_t shape[2] = {256 * 5 + 100, 64};
    lpx_tensor *w = NULL, *q = NULL, *dt = NULL, *got = NULL;
    lpx_placement s0 = lpx_shard(0);
    RCHECK_OK(r, lpx_randn(2, shape, 5, LPX_BF16, lpx_cpu(), &w));
    RCHECK_OK(r, lpx_nf4_quantize(w, NULL, &q));
    RCHECK_OK(r, lpx_dtensor_distribute(q, mesh, &s0, &dt));
    RCHECK_OK(r, lpx_dtensor_full_tensor(dt, &got));
    RCHECK(r, got && lpx_nf4_is(got));
    /* the unsharded payload == quantizing the full tensor, bit for bit */
    RCHECK(r, got && lpx_tensor_inner_count(got) == 4);
    for (int i = 0; got && i < 4; i++) RCHECK(r, same_bits(lpx_tensor_inner(got, i), lpx_tensor_inner(q, i)));
    lpx_tensor *ts[] = {w, q, dt, got};
    for (int i = 0; i < 4; i++) lpx_tensor_release(ts[i]);
    lpx_mesh_release(mesh);
    return LPX_OK;
}

static void test_nf4_local(void)
{
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], nf4_rank, NULL);
    /* worlds 5, 6, 7 as well: torchtune's NF4 sharding failed at 6 */
    for (int w = 5; w <= 7; w++) run_ranks(w, nf4_rank, NULL);
}

/* ---- ops --------------------------------------------------------------- */

static lpx_status ops_rank(lpx_comm *comm, void *ctx)
{
    (void)ctx;
    int r = lpx_comm_rank(comm);
    lpx_mesh *mesh = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (st) return st;
    const int64_t xs[2] = {6, 10}, ws[2] = {9, 10}, bs[1] = {9};
    lpx_tensor *x = NULL, *w = NULL, *b = NULL;
    RCHECK_OK(r, lpx_randn(2, xs, 1, LPX_F32, lpx_cpu(), &x));
    RCHECK_OK(r, lpx_randn(2, ws, 2, LPX_F32, lpx_cpu(), &w));
    RCHECK_OK(r, lpx_randn(1, bs, 3, LPX_F32, lpx_cpu(), &b));
    lpx_placement s0 = lpx_shard(0), s1 = lpx_shard(1), rep = lpx_replicate();
    lpx_tensor *xr = NULL, *xs0 = NULL, *xs1 = NULL, *ws0 = NULL, *ws1 = NULL, *bs0 = NULL;
    RCHECK_OK(r, lpx_dtensor_distribute(x, mesh, &rep, &xr));
    RCHECK_OK(r, lpx_dtensor_distribute(x, mesh, &s0, &xs0));
    RCHECK_OK(r, lpx_dtensor_distribute(x, mesh, &s1, &xs1));
    RCHECK_OK(r, lpx_dtensor_distribute(w, mesh, &s0, &ws0));
    RCHECK_OK(r, lpx_dtensor_distribute(w, mesh, &s1, &ws1));
    RCHECK_OK(r, lpx_dtensor_distribute(b, mesh, &s0, &bs0));
    lpx_tensor *ref = NULL, *o = NULL, *full = NULL;
    /* elementwise: S(0) + dense (Replicate), relu, mul_scalar */
    lpx_tensor *e = NULL, *e2 = NULL, *eref = NULL, *eref2 = NULL;
    RCHECK_OK(r, lpx_add(xs0, x, &e));
    RCHECK_OK(r, lpx_relu(e, &e2));
    RCHECK_OK(r, lpx_add(x, x, &eref));
    RCHECK_OK(r, lpx_relu(eref, &eref2));
    RCHECK(r, e2 && lpx_dtensor_is(e2));
    RCHECK_OK(r, lpx_dtensor_full_tensor(e2, &full));
    RCHECK(r, same_bits(full, eref2));
    lpx_tensor_release(full);
    full = NULL;
    /* column parallel: x R @ w S(0)^T + b S(0) -> S(-1), exact */
    RCHECK_OK(r, lpx_linear(x, w, b, &ref));
    RCHECK_OK(r, lpx_linear(xr, ws0, bs0, &o));
    lpx_placement pl;
    RCHECK(r, o && !lpx_dtensor_placement(o, 0, &pl) && pl.type == LPX_PLACEMENT_SHARD && pl.dim == 1);
    RCHECK_OK(r, lpx_dtensor_full_tensor(o, &full));
    RCHECK(r, full && max_abs_diff(full, ref) < 1e-5);
    lpx_tensor_release(o);
    lpx_tensor_release(full);
    o = full = NULL;
    /* data parallel: x S(0) @ dense w -> S(0) */
    RCHECK_OK(r, lpx_linear(xs0, w, b, &o));
    RCHECK_OK(r, lpx_dtensor_full_tensor(o, &full));
    RCHECK(r, full && max_abs_diff(full, ref) < 1e-5);
    lpx_tensor_release(o);
    lpx_tensor_release(full);
    o = full = NULL;
    /* row parallel: x S(1) @ w S(1)^T -> Partial(sum) -> R */
    lpx_tensor *ref2 = NULL, *rr = NULL;
    RCHECK_OK(r, lpx_linear(x, w, NULL, &ref2));
    RCHECK_OK(r, lpx_linear(xs1, ws1, NULL, &o));
    RCHECK(r, o && !lpx_dtensor_placement(o, 0, &pl) && pl.type == LPX_PLACEMENT_PARTIAL);
    RCHECK_OK(r, lpx_dtensor_redistribute(o, &rep, &rr));
    RCHECK(r, rr && max_abs_diff(lpx_dtensor_local(rr), ref2) < 1e-4);
    /* an unsupported combination names op and placements */
    lpx_tensor *bad = NULL;
    st = lpx_linear(xs0, ws0, NULL, &bad);
    RCHECK(r, st == LPX_ENOTIMPL && strstr(lpx_last_error(), "linear"));
    lpx_tensor *ts[] = {x, w, b, xr, xs0, xs1, ws0, ws1, bs0, ref, o, e, e2, eref, eref2, ref2, rr};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) lpx_tensor_release(ts[i]);
    RCHECK(r, lpx_mesh_refcount(mesh) == 1);
    lpx_mesh_release(mesh);
    return LPX_OK;
}

static void test_ops(void)
{
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], ops_rank, NULL);
}

/* ---- 2-D meshes (hybrid sharding) ------------------------------------- */

/* A rows x cols mesh of local ranks built from per-dimension groups: rank
 * g = i * cols + j is at (i, j); mesh dim 0 runs over the `cols` groups of
 * `rows` ranks with the same j (the replicas), mesh dim 1 over the `rows`
 * groups of `cols` ranks with the same i (the shard group). Each rank
 * thread gets its two comms by its rank in the world comm and destroys
 * them. */
typedef struct mesh2d_ctx {
    int rows, cols;
    lpx_comm *outer[MAXR], *inner[MAXR];
} mesh2d_ctx;

static const int64_t shapes2d[][2] = {{7, 5}, {5, 6}, {1, 3}, {0, 4}, {4, 0}};
#define NSHAPES2D (int)(sizeof shapes2d / sizeof shapes2d[0])

/* placement pairs (mesh dim 0, mesh dim 1): Shard on one mesh dim with
 * Replicate on the other, both sharded (different tensor dims), Partial */
enum { P_R = LPX_PLACEMENT_REPLICATE, P_S = LPX_PLACEMENT_SHARD, P_P = LPX_PLACEMENT_PARTIAL };
static const int pl2d[][4] = {  /* type0, dim0, type1, dim1 */
    {P_R, 0, P_S, 0}, {P_R, 0, P_S, 1}, {P_S, 0, P_R, 0}, {P_S, 1, P_R, 0}, {P_S, 0, P_S, 1},
    {P_S, 1, P_S, 0}, {P_R, 0, P_R, 0}, {P_P, 0, P_S, 0}, {P_S, 1, P_P, 0},
};
#define NPL2D (int)(sizeof pl2d / sizeof pl2d[0])

static void pl_of(int k, lpx_placement *p)
{
    for (int m = 0; m < 2; m++) {
        int t = pl2d[k][2 * m], d = pl2d[k][2 * m + 1];
        p[m] = t == P_S ? lpx_shard(d) : t == P_P ? lpx_partial(LPX_REDUCE_SUM) : lpx_replicate();
    }
}

/* What rank (i, j) holds of `full` under p, computed here from
 * lpx_shard_range (the reference; distribute must agree). */
static lpx_status expected_local(lpx_tensor *full, const lpx_placement *p, const int *coord, const int *size,
                                 lpx_tensor **out)
{
    lpx_tensor *cur = NULL, *next = NULL;
    lpx_status st = lpx_clone(full, &cur);
    for (int m = 0; m < 2 && !st; m++) {
        if (p[m].type == LPX_PLACEMENT_SHARD) {
            int64_t c, s, l, sh[2];
            lpx_shard_range(lpx_tensor_shape(cur)[p[m].dim], size[m], coord[m], 1, &c, &s, &l);
            memcpy(sh, lpx_tensor_shape(cur), sizeof sh);
            sh[p[m].dim] = l;
            lpx_tensor *v = NULL;
            if (l == 0 || lpx_tensor_numel(cur) == 0) st = lpx_zeros(2, sh, LPX_F32, lpx_cpu(), &next);
            else if (!(st = lpx_narrow(cur, p[m].dim, s, l, &v))) st = lpx_contiguous(v, &next);
            lpx_tensor_release(v);
        } else if (p[m].type == LPX_PLACEMENT_PARTIAL && coord[m] != 0) {
            st = lpx_zeros(2, lpx_tensor_shape(cur), LPX_F32, lpx_cpu(), &next);
        } else {
            next = cur;
            lpx_tensor_retain(next);
        }
        lpx_tensor_release(cur);
        cur = next;
        next = NULL;
    }
    if (st) lpx_tensor_release(cur);
    else *out = cur;
    return st;
}

static lpx_status mesh2d_rank(lpx_comm *world, void *vctx)
{
    mesh2d_ctx *c = vctx;
    int g = lpx_comm_rank(world), i = g / c->cols, j = g % c->cols;
    int coord[2] = {i, j}, size[2] = {c->rows, c->cols};
    lpx_mesh *mesh = NULL;
    RCHECK_OK(g, lpx_mesh_new_2d(c->outer[g], c->inner[g], &mesh));
    RCHECK(g, lpx_mesh_ndim(mesh) == 2 && lpx_mesh_rank(mesh, 0) == i && lpx_mesh_rank(mesh, 1) == j &&
                  lpx_mesh_size(mesh, 0) == c->rows && lpx_mesh_size(mesh, 1) == c->cols);
    for (int s = 0; mesh && s < NSHAPES2D && !results[g].fails; s++) {
        lpx_tensor *full = NULL;
        RCHECK_OK(g, lpx_randn(2, shapes2d[s], 40 + (uint64_t)s, LPX_F32, lpx_cpu(), &full));
        for (int a = 0; full && a < NPL2D && !results[g].fails; a++) {
            lpx_placement pa[2];
            pl_of(a, pa);
            lpx_tensor *dt = NULL, *want = NULL, *got = NULL, *fl = NULL;
            RCHECK_OK(g, lpx_dtensor_distribute(full, mesh, pa, &dt));
            RCHECK_OK(g, expected_local(full, pa, coord, size, &want));
            RCHECK(g, dt && want && same_bits(lpx_dtensor_local(dt), want));
            /* from_local of the same piece is the same DTensor */
            RCHECK_OK(g, lpx_dtensor_from_local(want, mesh, pa, 2, shapes2d[s], &fl));
            /* all_gather == the full tensor */
            RCHECK_OK(g, lpx_dtensor_full_tensor(dt, &got));
            RCHECK(g, got && same_bits(got, full));
            /* an op keeps the placements: dt + dt gathers to full + full
             * (on Partial(sum) too: add of two Partial(sum) stays Partial) */
            lpx_tensor *two = NULL, *two_full = NULL, *ref2 = NULL;
            RCHECK_OK(g, lpx_add(dt, fl, &two));
            RCHECK_OK(g, lpx_dtensor_full_tensor(two, &two_full));
            RCHECK_OK(g, lpx_add(full, full, &ref2));
            RCHECK(g, two_full && same_bits(two_full, ref2));
            lpx_tensor_release(two);
            lpx_tensor_release(two_full);
            lpx_tensor_release(ref2);
            /* to every other placement and back */
            for (int b = 0; dt && b < NPL2D && !results[g].fails; b++) {
                lpx_placement pb[2];
                pl_of(b, pb);
                lpx_tensor *x = NULL, *wb = NULL, *back = NULL;
                RCHECK_OK(g, lpx_dtensor_redistribute(dt, pb, &x));
                RCHECK_OK(g, expected_local(full, pb, coord, size, &wb));
                if (x && wb && !same_bits(lpx_dtensor_local(x), wb))
                    rfail(g, "shape %d: redistribute (%d,%d)/(%d,%d) -> (%d,%d)/(%d,%d) on a %dx%d mesh: wrong local",
                          s, pl2d[a][0], pl2d[a][1], pl2d[a][2], pl2d[a][3], pl2d[b][0], pl2d[b][1], pl2d[b][2],
                          pl2d[b][3], c->rows, c->cols);
                RCHECK_OK(g, lpx_dtensor_redistribute(x, pa, &back));
                if (!back || !same_bits(lpx_dtensor_local(back), lpx_dtensor_local(dt)))
                    rfail(g, "shape %d: (%d,%d)/(%d,%d) -> (%d,%d)/(%d,%d) -> back on a %dx%d mesh: not the start", s,
                          pl2d[a][0], pl2d[a][1], pl2d[a][2], pl2d[a][3], pl2d[b][0], pl2d[b][1], pl2d[b][2],
                          pl2d[b][3], c->rows, c->cols);
                lpx_tensor_release(x);
                lpx_tensor_release(wb);
                lpx_tensor_release(back);
            }
            lpx_tensor_release(dt);
            lpx_tensor_release(want);
            lpx_tensor_release(got);
            lpx_tensor_release(fl);
        }
        lpx_tensor_release(full);
    }
    RCHECK(g, lpx_mesh_refcount(mesh) == 1);
    lpx_mesh_release(mesh);
    lpx_comm_destroy(c->outer[g]);
    lpx_comm_destroy(c->inner[g]);
    return LPX_OK;
}

static void test_mesh_2d(void)
{
    static const int meshes[][2] = {{2, 2}, {2, 3}, {1, 4}, {4, 1}, {3, 2}};
    for (size_t m = 0; m < sizeof meshes / sizeof *meshes; m++) {
        mesh2d_ctx c;
        memset(&c, 0, sizeof c);
        c.rows = meshes[m][0];
        c.cols = meshes[m][1];
        lpx_comm *tmp[MAXR];
        for (int j = 0; j < c.cols; j++) {
            CHECK_OK(lpx_local_comm_group_create(c.rows, tmp));
            for (int i = 0; i < c.rows; i++) c.outer[i * c.cols + j] = tmp[i];
        }
        for (int i = 0; i < c.rows; i++) {
            CHECK_OK(lpx_local_comm_group_create(c.cols, tmp));
            for (int j = 0; j < c.cols; j++) c.inner[i * c.cols + j] = tmp[j];
        }
        run_ranks(c.rows * c.cols, mesh2d_rank, &c);
    }
}

static void test_errors(void)
{
    lpx_tensor *x = NULL, *dt = NULL;
    const int64_t s[2] = {4, 4};
    CHECK_OK(lpx_zeros(2, s, LPX_F32, lpx_cpu(), &x));
    lpx_comm *comms[1];
    CHECK_OK(lpx_local_comm_group_create(1, comms));
    lpx_mesh *mesh = NULL;
    CHECK_OK(lpx_mesh_new(comms[0], &mesh));
    lpx_placement bad = lpx_shard(5), p = lpx_shard(0);
    CHECK_ERR(lpx_dtensor_distribute(x, mesh, &bad, &dt), LPX_EINVAL);
    CHECK(dt == NULL);
    const int64_t wrong[2] = {9, 4};
    CHECK_ERR(lpx_dtensor_from_local(x, mesh, &p, 2, wrong, &dt), LPX_ESHAPE);
    CHECK_ERR(lpx_dtensor_redistribute(x, &p, &dt), LPX_EINVAL);
    lpx_mesh *m2 = NULL;
    CHECK_ERR(lpx_mesh_new(NULL, &m2), LPX_EINVAL);
    CHECK(lpx_mesh_refcount(mesh) == 1);
    lpx_mesh_release(mesh);
    lpx_comm_destroy(comms[0]);
    lpx_tensor_release(x);
}

/* ---- faults ------------------------------------------------------------ */

typedef struct fault_ctx {
    int mode;             /* 0: rank 2 returns an error; 1: rank 2 stalls past the timeout */
    lpx_status st[MAXR];
    double secs[MAXR];
} fault_ctx;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static lpx_status fault_rank(lpx_comm *comm, void *ctx)
{
    fault_ctx *fc = ctx;
    int r = lpx_comm_rank(comm);
    double t0 = now_s();
    lpx_mesh *mesh = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (st) return st;
    const int64_t shape[2] = {13, 5};
    lpx_tensor *full = NULL, *dt = NULL, *got = NULL;
    lpx_placement s0 = lpx_shard(0);
    lpx_randn(2, shape, 3, LPX_F32, lpx_cpu(), &full);
    lpx_dtensor_distribute(full, mesh, &s0, &dt);
    if (r == 2 && fc->mode == 0) {
        st = lpx_error(LPX_EINVAL, "rank 2 gives up");
    } else if (r == 2 && fc->mode == 1) {
        usleep(600 * 1000);  /* past the 200 ms timeout: mid-collective for the others */
        st = lpx_dtensor_full_tensor(dt, &got);
    } else {
        st = lpx_dtensor_full_tensor(dt, &got);
    }
    fc->st[r] = st;
    fc->secs[r] = now_s() - t0;
    lpx_tensor_release(full);
    lpx_tensor_release(dt);
    lpx_tensor_release(got);
    lpx_mesh_release(mesh);
    return st;
}

static void test_faults(void)
{
    for (int mode = 0; mode < 2; mode++) {
        fault_ctx fc;
        memset(&fc, 0, sizeof fc);
        lpx_status st = lpx_local_run(4, fault_rank, &fc, 200, NULL);
        CHECK(st != LPX_OK);
        for (int r = 0; r < 4; r++) {
            CHECKF(fc.st[r] == LPX_ECOMM || fc.st[r] == LPX_ETIMEOUT || (r == 2 && fc.st[r] != LPX_OK),
                   "mode %d rank %d: %s", mode, r, lpx_status_string(fc.st[r]));
            CHECKF(fc.secs[r] < 3.0, "mode %d rank %d took %.2f s", mode, r, fc.secs[r]);
        }
    }
}

int main(void)
{
    RUN(test_shard_range);
    RUN(test_dense_round_trips);
    RUN(test_float8_local);
    RUN(test_nf4_local);
    RUN(test_ops);
    RUN(test_mesh_2d);
    RUN(test_errors);
    RUN(test_faults);
    return CHECK_DONE();
}
