/* The simulated device (lpx-simdev.so; docs/ARCHITECTURE.md, "A backend
 * plugin, worked through"): device paths run in CI without a GPU.
 *   - the device is not the host: a host read of device memory faults
 *     (in a child process); copies go through the backend's copy slot;
 *   - ops on sim:0 equal the CPU's bit for bit (elementwise, matmul,
 *     softmax, views, in-place, casts, the float8 and nf4 kinds);
 *   - lpx_item on a device tensor; DLPack export of a device tensor;
 *   - comm "sim" refuses host buffers (NCCL's rule) on every rank;
 *   - the device-resident sharding engine on 1 and 2 ranks (params on
 *     sim:r, comm "sim") against the CPU engine: unsharded params, grad
 *     shards, local shards after AdamW and the float8_weight's scale equal
 *     bit for bit over two steps, with no host<->device copy in a step
 *     (the desk check's bugs 1 and 2: DTensor's pre-gather and float8's
 *     hooks refused device inputs);
 *   - delayed scaling with device-side statistics (bug 3: the history took
 *     NaN and the scale never moved).
 * LPX_TEST_SIMDEV: the plugin's path. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "tensor_util.h"
#include "dt_util.h"
#include "backends/simdev/lpx_simdev.h"

static lpx_simdev_stats_fn get_stats;

static lpx_simdev_stats sim_stats(void)
{
    lpx_simdev_stats s;
    memset(&s, 0, sizeof s);
    if (get_stats) get_stats(&s);
    return s;
}

static lpx_tensor *up(lpx_tensor *h, int dev)
{
    lpx_tensor *d = NULL;
    if (h && lpx_tensor_to(h, lpx_sim_device(dev), &d)) return NULL;
    return d;
}

static lpx_tensor *down(lpx_tensor *d)
{
    lpx_tensor *h = NULL;
    if (d && lpx_tensor_to(d, lpx_cpu(), &h)) return NULL;
    return h;
}

/* a (host) and b (anywhere) hold the same bits: kind, dtype, shape, and
 * every dense tensor (a kind's inner ones), b brought to the host first */
static bool same_on_host(lpx_tensor *a, lpx_tensor *b)
{
    if (!a || !b || lpx_tensor_kind(a) != lpx_tensor_kind(b) || lpx_tensor_dtype(a) != lpx_tensor_dtype(b) ||
        lpx_tensor_ndim(a) != lpx_tensor_ndim(b) ||
        memcmp(lpx_tensor_shape(a), lpx_tensor_shape(b), (size_t)lpx_tensor_ndim(a) * sizeof(int64_t)))
        return false;
    if (lpx_tensor_kind(a)) {
        if (lpx_tensor_inner_count(a) != lpx_tensor_inner_count(b)) return false;
        for (int i = 0; i < lpx_tensor_inner_count(a); i++)
            if (!same_on_host(lpx_tensor_inner(a, i), lpx_tensor_inner(b, i))) return false;
        return true;
    }
    lpx_tensor *hb = down(b);
    bool ok = hb && same_bits(a, hb);
    lpx_tensor_release(hb);
    return ok;
}

static bool on_sim(lpx_tensor *t, int dev)
{
    if (!t) return false;
    if (lpx_tensor_kind(t)) {
        for (int i = 0; i < lpx_tensor_inner_count(t); i++)
            if (!on_sim(lpx_tensor_inner(t, i), dev)) return false;
        return true;
    }
    return lpx_tensor_device(t).type == LPX_DEVICE_SIM && lpx_tensor_device(t).index == dev;
}

static void on_segv(int sig)
{
    (void)sig;
    _exit(77);
}

static void test_host_read_faults(void)
{
    int64_t s[1] = {1024};
    lpx_tensor *h = rand_normal(1, s, 1, 1.0, LPX_F32), *d = up(h, 0);
    CHECK(d != NULL);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* the fault ends the child with 77 (a handler of its own, so a
         * sanitizer's SEGV report does not stand in for it) */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_segv;
        sigaction(SIGSEGV, &sa, NULL);
        volatile float x = ((const float *)lpx_tensor_data(d))[3];   /* host code reading device memory */
        (void)x;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF((WIFEXITED(status) && WEXITSTATUS(status) == 77) || (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV),
           "a host read of sim memory did not fault (status %d)", status);
    /* the copy slot is the way across, and it is counted */
    lpx_simdev_stats a = sim_stats();
    lpx_tensor *back = down(d);
    lpx_simdev_stats b = sim_stats();
    CHECK(back && same_bits(h, back));
    CHECKF(b.d2h == a.d2h + 1 && b.d2h_bytes == a.d2h_bytes + 4096, "d2h %llu -> %llu",
           (unsigned long long)a.d2h, (unsigned long long)b.d2h);
    lpx_tensor_release(h);
    lpx_tensor_release(d);
    lpx_tensor_release(back);
}

typedef lpx_status (*unary_fn)(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out);

static lpx_status op_add(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o) { return lpx_add(a, b, o); }
static lpx_status op_mul(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o) { return lpx_mul(a, b, o); }
static lpx_status op_matmul(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o)
{
    lpx_tensor *bt = NULL;
    lpx_status st = lpx_transpose(b, 0, 1, &bt);   /* a strided view as an operand */
    if (!st) st = lpx_matmul(a, bt, o);
    lpx_tensor_release(bt);
    return st;
}
static lpx_status op_softmax(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o)
{
    (void)b;
    return lpx_softmax(a, -1, o);
}
static lpx_status op_cast(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o)
{
    (void)b;
    return lpx_cast(a, LPX_BF16, false, o);
}
static lpx_status op_inplace(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o)
{
    lpx_tensor *c = NULL, *row = NULL;
    lpx_status st = lpx_clone(a, &c);
    if (!st) st = lpx_narrow(c, 0, 2, 3, &row);   /* in place on a view: the write lands in c */
    lpx_tensor *brow = NULL;
    if (!st) st = lpx_narrow(b, 0, 2, 3, &brow);
    if (!st) st = lpx_copy_(row, brow);   /* (copy_: the in-place op) */
    lpx_tensor_release(row);
    lpx_tensor_release(brow);
    if (st) lpx_tensor_release(c);
    else *o = c;
    return st;
}
static lpx_status op_f8(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o)
{
    (void)b;
    return lpx_float8_quantize(a, NULL, o, NULL);
}
static lpx_status op_nf4(lpx_tensor *a, lpx_tensor *b, lpx_tensor **o)
{
    (void)b;
    return lpx_nf4_quantize(a, NULL, o);
}

static void test_ops_equal_cpu(void)
{
    int64_t s[2] = {16, 64};
    lpx_tensor *a = rand_normal(2, s, 7, 1.0, LPX_F32), *b = rand_normal(2, s, 8, 1.0, LPX_F32);
    lpx_tensor *da = up(a, 0), *db = up(b, 0);
    struct {
        const char *name;
        unary_fn fn;
    } ops[] = {{"add", op_add}, {"mul", op_mul}, {"matmul of a transposed view", op_matmul}, {"softmax", op_softmax},
               {"cast bf16", op_cast}, {"copy_ into a narrowed view", op_inplace}, {"float8 quantize", op_f8},
               {"nf4 quantize", op_nf4}};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        lpx_tensor *ref = NULL, *got = NULL;
        lpx_status sr = ops[i].fn(a, b, &ref), sg = ops[i].fn(da, db, &got);
        CHECKF(!sr && !sg, "%s: cpu %s, sim %s (%s)", ops[i].name, lpx_status_string(sr), lpx_status_string(sg),
               lpx_last_error());
        CHECKF(!sg && on_sim(got, 0), "%s: the result is not on sim:0", ops[i].name);
        CHECKF(!sr && !sg && same_on_host(ref, got), "%s: sim differs from the CPU", ops[i].name);
        lpx_tensor_release(ref);
        lpx_tensor_release(got);
    }
    /* lpx_item reads a device scalar through the backend */
    double v = 0, w = 0;
    CHECK_OK(lpx_item(a, 5, &v));
    CHECK_OK(lpx_item(da, 5, &w));
    CHECKF(v == w, "lpx_item on sim: %g vs %g", w, v);
    lpx_tensor *rel[] = {a, b, da, db};
    for (int i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
}

/* the stream: an op's device writes are queued and land at the next use of
 * the device or a sync (a read behind the backend's back in between sees
 * the old bytes); results stay right through every ordering point */
static lpx_simdev_pending_fn pending;

static void test_stream_defers_writes(void)
{
    int64_t s[1] = {256};
    lpx_tensor *h = rand_normal(1, s, 21, 1.0, LPX_F32), *d = up(h, 0), *row = NULL;
    CHECK(d && pending);
    if (!d || !pending) return;
    lpx_device dev = lpx_sim_device(0);
    const lpx_backend_i *be = lpx_backend_for(LPX_DEVICE_SIM);
    CHECK_OK(be->sync(be->self, dev));
    CHECK(pending(0) == 0);
    CHECK_OK(lpx_narrow(d, 0, 10, 5, &row));
    CHECK_OK(lpx_fill_(row, 7.0));   /* in place on the device: queued */
    CHECKF(pending(0) == 1, "%zu writes queued after fill_ (1 expected)", pending(0));
    CHECK_OK(be->sync(be->self, dev));   /* the sync point runs it */
    CHECK(pending(0) == 0);
    lpx_tensor *back = down(d);
    double v = 0;
    CHECK(back && !lpx_item(back, 12, &v) && v == 7.0);
    /* a later op on the device orders after it without a sync */
    CHECK_OK(lpx_fill_(row, 3.0));
    lpx_tensor *sum = NULL;
    CHECK_OK(lpx_sum(row, 0, NULL, false, &sum));
    double t = 0;
    CHECK(sum && !lpx_item(sum, 0, &t) && t == 15.0);
    lpx_tensor *rel[] = {h, d, row, back, sum};
    for (int i = 0; i < 5; i++) lpx_tensor_release(rel[i]);
}

/* DLPack: a device tensor leaves as kDLExtDev (DLPack's extension device)
 * sharing its memory, and comes back as a sim:0 tensor over it */
static void test_dlpack_device_tensor(void)
{
    int64_t s[2] = {4, 6};
    lpx_tensor *h = rand_normal(2, s, 11, 1.0, LPX_F32), *d = up(h, 0), *back = NULL;
    DLManagedTensorVersioned *m = NULL;
    CHECK_OK(lpx_to_dlpack(d, &m));
    CHECK(m && m->dl_tensor.device.device_type == kDLExtDev && m->dl_tensor.device.device_id == 0);
    CHECK(m && m->dl_tensor.data == lpx_tensor_data(d));
    if (m) CHECK_OK(lpx_from_dlpack(m, &back));
    CHECK(on_sim(back, 0) && lpx_tensor_data(back) == lpx_tensor_data(d));
    CHECK(back && same_on_host(h, back));
    lpx_tensor_release(back);
    lpx_tensor_release(d);
    lpx_tensor_release(h);
}

/* ---- comm "sim": NCCL's rules ---------------------------------------- */

static lpx_status host_buffer_rank(lpx_comm *comm, void *arg)
{
    (void)arg;
    float x[4] = {1, 2, 3, 4};
    lpx_status st = lpx_comm_all_reduce_buf(comm, x, x, 4, LPX_F32, LPX_REDUCE_SUM);
    int r = lpx_comm_rank(comm);
    RCHECK(r, st != LPX_OK);
    RCHECK(r, strstr(lpx_last_error(), "host memory") || strstr(lpx_last_error(), "failed"));
    return LPX_OK;
}

static void test_comm_refuses_host_buffers(void)
{
    memset(results, 0, sizeof results);
    lpx_status sts[2];
    lpx_status st = lpx_comm_run("sim", 2, 5000, host_buffer_rank, NULL, sts);
    CHECKF(st == LPX_OK, "comm sim: %s", lpx_last_error());
    for (int r = 0; r < 2; r++) CHECKF(results[r].fails == 0, "rank %d: %s", r, results[r].msg);
}

/* ---- the device-resident engine -------------------------------------- */

#define NP 4
static const char *names[NP] = {"dense_f32", "bias_bf16", "f8w", "nf4_frozen"};

/* the four params from fixed seeds, on the host or on sim:dev */
static void make_params(lpx_tensor **p, int dev)
{
    const int64_t s0[2] = {13, 5}, s1[1] = {7}, s2[2] = {19, 16}, s3[2] = {136, 64};
    lpx_tensor *h[4] = {rand_normal(2, s0, 1, 1.0, LPX_F32), rand_normal(1, s1, 2, 1.0, LPX_BF16),
                        rand_normal(2, s2, 3, 2.0, LPX_F32), rand_normal(2, s3, 4, 0.5, LPX_BF16)};
    for (int i = 0; dev >= 0 && i < 4; i++) {
        lpx_tensor *d = up(h[i], dev);
        lpx_tensor_release(h[i]);
        h[i] = d;
    }
    p[0] = h[0];
    p[1] = h[1];
    p[2] = p[3] = NULL;
    if (h[2]) lpx_float8_weight_new(h[2], NULL, &p[2]);
    if (h[3]) lpx_nf4_quantize(h[3], NULL, &p[3]);
    lpx_tensor_release(h[2]);
    lpx_tensor_release(h[3]);
}

static lpx_status make_engine(lpx_comm *c, lpx_device cd, int dev, lpx_fsdp **f, lpx_fsdp_group **g)
{
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .compute_device = cd};
    lpx_tensor *p[NP];
    make_params(p, dev);
    lpx_status st = new_engine(c, &cfg, f);
    if (!st) st = lpx_fsdp_group_add(*f, "layer", g);
    for (int i = 0; i < NP && !st; i++)
        st = p[i] ? lpx_fsdp_param_add(*g, names[i], p[i], i == 3 ? LPX_FSDP_FROZEN : 0, NULL) : LPX_EINVAL;
    if (!st) st = lpx_fsdp_shard(*f);
    for (int i = 0; i < NP; i++) lpx_tensor_release(p[i]);
    return st;
}

typedef struct res_ctx {
    lpx_comm *ref[MAXR];   /* the CPU engines' local comms, one per rank */
} res_ctx;

static lpx_fsdp_stats stats_of(lpx_fsdp *f)
{
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    lpx_fsdp_stats_get(f, &s);
    return s;
}

static lpx_status resident_rank(lpx_comm *comm, void *arg)
{
    res_ctx *c = arg;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *rf = NULL, *sf = NULL;
    lpx_fsdp_group *rg = NULL, *sg = NULL;
    RCHECK_OK(r, make_engine(c->ref[r], lpx_cpu(), -1, &rf, &rg));
    RCHECK_OK(r, make_engine(comm, lpx_sim_device(r), r, &sf, &sg));
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 1e-2;
    for (int i = 0; sf && sg && i < NP; i++) RCHECK(r, on_sim(lpx_fsdp_param_local(sg, i), r));
    for (int step = 0; rf && sf && rg && sg && step < 2; step++) {
        lpx_fsdp_stats_reset(sf);
        RCHECK_OK(r, lpx_fsdp_unshard(rg));
        RCHECK_OK(r, lpx_fsdp_unshard(sg));
        for (int i = 0; i < NP; i++) {
            lpx_tensor *a = lpx_fsdp_param_full(rg, i), *b = lpx_fsdp_param_full(sg, i);
            if (!on_sim(b, r) || !same_on_host(a, b)) rfail(r, "step %d: unsharded %s differs or is off sim:%d", step,
                                                            names[i], r);
        }
        lpx_fsdp_stats s = stats_of(sf);
        if (s.calls[LPX_COLL_ALL_GATHER] != 1 || s.h2d_copies || s.d2h_copies)
            rfail(r, "step %d unshard: %llu all-gathers, %llu h2d, %llu d2h", step,
                  (unsigned long long)s.calls[LPX_COLL_ALL_GATHER], (unsigned long long)s.h2d_copies,
                  (unsigned long long)s.d2h_copies);
        for (int i = 0; i < 3; i++) {
            lpx_tensor *like = lpx_fsdp_param_dtensor(rg, i);   /* the global shape */
            lpx_tensor *gr = rand_normal(lpx_tensor_ndim(like), lpx_tensor_shape(like),
                                         100 + 10 * (uint64_t)step + (uint64_t)i, 0.1, i == 1 ? LPX_BF16 : LPX_F32);
            lpx_tensor *gd = up(gr, r);
            RCHECK_OK(r, lpx_fsdp_set_grad(rg, i, gr));
            RCHECK_OK(r, lpx_fsdp_set_grad(sg, i, gd));
            lpx_tensor_release(gr);
            lpx_tensor_release(gd);
        }
        RCHECK_OK(r, lpx_fsdp_reshard(rg));
        RCHECK_OK(r, lpx_fsdp_reshard(sg));
        lpx_fsdp_stats_reset(sf);
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(rg));
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(sg));
        for (int i = 0; i < 3; i++) {
            lpx_tensor *a = lpx_fsdp_param_grad(rg, i), *b = lpx_fsdp_param_grad(sg, i);
            if (!on_sim(b, r) || !same_on_host(a, b)) rfail(r, "step %d: grad shard of %s", step, names[i]);
        }
        RCHECK_OK(r, lpx_fsdp_adamw_step(rg, &o));
        RCHECK_OK(r, lpx_fsdp_adamw_step(sg, &o));
        s = stats_of(sf);
        if (s.h2d_copies || s.d2h_copies)
            rfail(r, "step %d reduce-scatter + AdamW: %llu h2d, %llu d2h", step, (unsigned long long)s.h2d_copies,
                  (unsigned long long)s.d2h_copies);
        for (int i = 0; i < 3; i++) {
            lpx_tensor *a = lpx_fsdp_param_local(rg, i), *b = lpx_fsdp_param_local(sg, i);
            if (i == 2) a = lpx_float8_weight_master(a), b = lpx_float8_weight_master(b);
            if (!on_sim(b, r) || !same_on_host(a, b)) rfail(r, "step %d: local shard of %s after AdamW", step, names[i]);
        }
        RCHECK_OK(r, lpx_fsdp_precompute_scales(rf));
        RCHECK_OK(r, lpx_fsdp_precompute_scales(sf));
        float a = lpx_float8_weight_scale(lpx_fsdp_param_local(rg, 2)),
              b = lpx_float8_weight_scale(lpx_fsdp_param_local(sg, 2));
        if (!(a > 0) || memcmp(&a, &b, sizeof a)) rfail(r, "step %d: precomputed scale %.9g vs %.9g", step, (double)a,
                                                         (double)b);
    }
    lpx_fsdp_free(rf);
    lpx_fsdp_free(sf);
    return LPX_OK;
}

static void resident(int world)
{
    res_ctx c;
    memset(&c, 0, sizeof c);
    CHECK_OK(lpx_local_comm_group_create(world, c.ref));
    memset(results, 0, sizeof results);
    lpx_status sts[MAXR];
    lpx_status st = lpx_comm_run("sim", world, 20000, resident_rank, &c, sts);
    CHECKF(st == LPX_OK, "world %d: %s", world, lpx_last_error());
    for (int r = 0; r < world; r++) CHECKF(results[r].fails == 0, "world %d rank %d: %s", world, r, results[r].msg);
    for (int r = 0; r < world; r++) lpx_comm_destroy(c.ref[r]);
}

/* params on the host and on the device in one engine, a host grad handed
 * to a resident engine, a param on another rank's device: refused by name */
static lpx_status mixed_rank(lpx_comm *comm, void *arg)
{
    (void)arg;
    int r = lpx_comm_rank(comm);
    const int64_t s[2] = {8, 4};
    lpx_tensor *h = rand_normal(2, s, 5, 1.0, LPX_F32), *d = up(h, r), *other = up(h, (r + 1) % 2);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .compute_device = lpx_sim_device(r)};
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, new_engine(comm, &cfg, &f));
    if (f) {
        RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "on_dev", d, 0, NULL));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "on_host", h, 0, NULL));
        lpx_status st = lpx_fsdp_shard(f);
        RCHECK(r, st == LPX_EDEVICE && strstr(lpx_last_error(), "all on the device, or all on the host"));
        lpx_fsdp_free(f);
        f = NULL;
    }
    RCHECK_OK(r, new_engine(comm, &cfg, &f));
    if (f) {
        RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "elsewhere", other, 0, NULL));
        lpx_status st = lpx_fsdp_shard(f);
        RCHECK(r, st == LPX_EDEVICE && strstr(lpx_last_error(), "lives on device"));
        lpx_fsdp_free(f);
        f = NULL;
    }
    RCHECK_OK(r, new_engine(comm, &cfg, &f));
    if (f) {
        RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "w", d, 0, NULL));
        RCHECK_OK(r, lpx_fsdp_shard(f));
        RCHECK(r, lpx_fsdp_set_grad(g, 0, h) == LPX_EDEVICE);   /* a host grad */
        lpx_fsdp_free(f);
    }
    lpx_tensor_release(h);
    lpx_tensor_release(d);
    lpx_tensor_release(other);
    return LPX_OK;
}

static void test_mixed_devices_refused(void)
{
    memset(results, 0, sizeof results);
    lpx_status sts[2];
    lpx_status st = lpx_comm_run("sim", 2, 20000, mixed_rank, NULL, sts);
    CHECKF(st == LPX_OK, "mixed: %s", lpx_last_error());
    for (int r = 0; r < 2; r++) CHECKF(results[r].fails == 0, "rank %d: %s", r, results[r].msg);
}

static void test_resident_engine_one_rank(void) { resident(1); }
static void test_resident_engine_two_ranks(void) { resident(2); }

/* ---- delayed scaling with the statistics on the device --------------- */

static void test_delayed_scaling_on_device(void)
{
    int64_t s[2] = {8, 32};
    lpx_float8_delayed_config cfg = {.history_len = 4};
    lpx_float8_delayed *hd = NULL, *dd = NULL;
    CHECK_OK(lpx_float8_delayed_new(&cfg, &hd));
    CHECK_OK(lpx_float8_delayed_new(&cfg, &dd));
    for (int step = 0; hd && dd && step < 3; step++) {
        lpx_tensor *x = rand_normal(2, s, 50 + (uint64_t)step, 1.0 + step, LPX_F32), *dx = up(x, 0);
        lpx_tensor *qh = NULL, *qd = NULL;
        lpx_float8_quant_opts oh = {.struct_size = sizeof oh, .delayed = hd}, od = {.struct_size = sizeof od,
                                                                                   .delayed = dd};
        lpx_float8_stats sh_st, sd_st;
        memset(&sh_st, 0, sizeof sh_st);
        memset(&sd_st, 0, sizeof sd_st);
        CHECK_OK(lpx_float8_quantize(x, &oh, &qh, &sh_st));
        CHECK_OK(lpx_float8_quantize(dx, &od, &qd, &sd_st));
        CHECKF(qh && qd && same_on_host(qh, qd), "step %d: the delayed cast on sim differs from the CPU's", step);
        float sh = lpx_float8_delayed_scale(hd), sd = lpx_float8_delayed_scale(dd);
        CHECKF(sh == sd && sd == sd, "step %d: scale on sim %.9g, CPU %.9g (NaN: the device amax never reached the "
               "history)", step, (double)sd, (double)sh);
        float h1[4] = {0}, h2[4] = {0};
        int n1 = lpx_float8_delayed_history(hd, h1, 4), n2 = lpx_float8_delayed_history(dd, h2, 4);
        CHECKF(n1 == n2 && !memcmp(h1, h2, sizeof h1), "step %d: amax history on sim %g, CPU %g", step, (double)h2[0],
               (double)h1[0]);
        CHECKF(!memcmp(&sh_st, &sd_st, sizeof sh_st), "step %d: the cast's statistics differ on sim", step);
        lpx_tensor *rel[] = {x, dx, qh, qd};
        for (int i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
    }
    lpx_float8_delayed_free(hd);
    lpx_float8_delayed_free(dd);
}

int main(void)
{
    const char *path = getenv("LPX_TEST_SIMDEV");
    if (!path) {
        printf("LPX_TEST_SIMDEV is not set: skipping\n");
        return 77;
    }
    CHECK_OK(lpx_init());
    const lpx_plugin *p = NULL;
    CHECK_OK(lpx_plugin_load(path, &p));
    if (!p) return CHECK_DONE();
    void *sym = lpx_plugin_symbol(p, LPX_SIMDEV_SYM_STATS);
    memcpy(&get_stats, &sym, sizeof sym);
    sym = lpx_plugin_symbol(p, LPX_SIMDEV_SYM_PENDING);
    memcpy(&pending, &sym, sizeof sym);
    RUN(test_host_read_faults);
    RUN(test_ops_equal_cpu);
    RUN(test_stream_defers_writes);
    RUN(test_dlpack_device_tensor);
    RUN(test_comm_refuses_host_buffers);
    RUN(test_mixed_devices_refused);
    RUN(test_resident_engine_one_rank);
    RUN(test_resident_engine_two_ranks);
    RUN(test_delayed_scaling_on_device);
    return CHECK_DONE();
}
