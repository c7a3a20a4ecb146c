/* GPU suite: CPU offload of the sharding engine (docs/SHARDING.md, "CPU
 * offload").
 *
 * Loads lpx-cuda.so (gpu_setup) and lpx-nccl.so; every case is skipped when
 * the machine has no GPU, and a plugin that declines beside a GPU fails. One group of four params — a dense f32 [13, 5], a
 * dense bf16 [7], a tensorwise float8_weight over an f32 master and a
 * frozen nf4 weight — goes to two engines fed the same tensors: the
 * reference on the CPU (a local comm of one rank) and an offloading one
 * (compute_device cuda:0, an NCCL comm of one rank). Over two steps (the
 * first with the float8_weight's own amax all-reduce staged through the
 * device, the second with precomputed scales), with and without
 * keep_storage:
 *   unshard        every full param lives on cuda:0 and equals the
 *                  reference's bit for bit (kinds: every inner tensor);
 *                  ONE all-gather and ONE host->device copy of exactly the
 *                  all-gathered bytes, no device->host copy;
 *   reduce-scatter the same grads (device copies for the offloading
 *                  engine) give host grad shards equal bit for bit; one
 *                  reduce-scatter and ONE device->host copy per grad dtype
 *                  (f32, bf16), no host->device copy;
 *   AdamW          the local shards (float8_weight: the master) stay equal
 *                  bit for bit, and so do the precomputed scales.
 * Plus the refusals: a local comm and fp8_grad_reduce with a CUDA compute
 * device, a CPU grad handed to the offloading engine. World size 1 is
 * exact on NCCL (avg and max of one value are the value). */
#include <stddef.h>
#ifdef LPX_TEST_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif
#include "gpu_util.h"
#include "backends/nccl/lpx_nccl.h"

#define NP 4
static const char *names[NP] = {"dense_f32", "bias_bf16", "f8w", "nf4_frozen"};

static const lpx_plugin *nccl;
static lpx_nccl_comm_create_local_fn create_local;

static void setup(void)
{
    const char *vars[] = {"LPX_RANK", "LPX_WORLD_SIZE", "LPX_LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "LPX_NCCL_ID", "LPX_NCCL_ID_FILE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    if (!gpu_setup()) return; /* no GPU: every case reports skipped */
    const char *path = getenv("LPX_TEST_NCCL_PLUGIN");
    if (!path || !*path) {
        printf("SKIP: LPX_TEST_NCCL_PLUGIN is not set (lpx-nccl.so was not built)\n");
        exit(GPU_SKIP);
    }
    if (lpx_plugin_load(path, &nccl)) {
        const char *why = lpx_last_error();
        /* lpx-cuda.so works here, so a declining lpx-nccl.so is broken */
        printf("FAIL: loading %s failed: %s\n", path, why);
        exit(1);
    }
    void *p = lpx_plugin_symbol(nccl, LPX_NCCL_SYM_COMM_CREATE_LOCAL);
    if (!p) {
        printf("lpx-nccl.so does not export %s\n", LPX_NCCL_SYM_COMM_CREATE_LOCAL);
        exit(1);
    }
    memcpy(&create_local, &p, sizeof p);
}

/* The four params, new tensors from fixed seeds (each engine gets its
 * own), on the CPU or (dev) made there and moved to cuda:0 before the
 * float8 master and the NF4 source are wrapped: the same values either way. */
static void make_params(lpx_tensor **p, bool dev)
{
    const int64_t s0[2] = {13, 5}, s1[1] = {7}, s2[2] = {19, 16}, s3[2] = {136, 64};
    lpx_tensor *h[4] = {rand_normal(2, s0, 1, 1.0, LPX_F32), rand_normal(1, s1, 2, 1.0, LPX_BF16),
                        rand_normal(2, s2, 3, 2.0, LPX_F32), rand_normal(2, s3, 4, 0.5, LPX_BF16)};
    for (int i = 0; dev && i < 4; i++) {
        lpx_tensor *d = h[i] ? gpu_up(h[i]) : NULL;
        lpx_tensor_release(h[i]);
        h[i] = d;
    }
    p[0] = h[0];
    p[1] = h[1];
    p[2] = p[3] = NULL;
    if (h[2]) CHECK_OK(lpx_float8_weight_new(h[2], NULL, &p[2]));
    if (h[3]) CHECK_OK(lpx_nf4_quantize(h[3], NULL, &p[3]));
    lpx_tensor_release(h[2]);
    lpx_tensor_release(h[3]);
}

/* An engine over a one-rank comm with one group holding the params
 * (handed in on cuda:0 with dev: a device-resident engine). */
static lpx_fsdp *make_engine(lpx_comm *c, const lpx_fsdp_config *cfg, lpx_fsdp_group **g, bool dev)
{
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_tensor *p[NP];
    make_params(p, dev);
    CHECK_OK(lpx_mesh_new(c, &mesh));
    if (mesh) CHECK_OK(lpx_fsdp_new(mesh, cfg, &f));
    lpx_mesh_release(mesh);
    if (f) {
        CHECK_OK(lpx_fsdp_group_add(f, "layer", g));
        for (int i = 0; i < NP; i++) CHECK_OK(lpx_fsdp_param_add(*g, names[i], p[i], i == 3 ? LPX_FSDP_FROZEN : 0, NULL));
        CHECK_OK(lpx_fsdp_shard(f));
    }
    for (int i = 0; i < NP; i++) lpx_tensor_release(p[i]);
    return f;
}

/* ref (CPU) and dev (cuda:0) hold the same tensor: kind, dtype, shape and
 * the bits of every dense tensor (the inner ones of a kind tensor). */
static bool same_tensor(const char *what, lpx_tensor *ref, lpx_tensor *dev)
{
    if (!ref || !dev) {
        printf("  %s: missing tensor\n", what);
        return false;
    }
    if (lpx_tensor_device(dev).type != LPX_DEVICE_CUDA || lpx_tensor_device(dev).index != 0) {
        printf("  %s: not on cuda:0\n", what);
        return false;
    }
    if (lpx_tensor_kind(ref) != lpx_tensor_kind(dev) || lpx_tensor_dtype(ref) != lpx_tensor_dtype(dev) ||
        lpx_tensor_ndim(ref) != lpx_tensor_ndim(dev) ||
        memcmp(lpx_tensor_shape(ref), lpx_tensor_shape(dev), (size_t)lpx_tensor_ndim(ref) * sizeof(int64_t))) {
        printf("  %s: kind, dtype or shape differs\n", what);
        return false;
    }
    if (!lpx_tensor_kind(ref)) return gpu_same_bits(what, ref, dev);
    bool ok = lpx_tensor_inner_count(ref) == lpx_tensor_inner_count(dev);
    for (int k = 0; ok && k < lpx_tensor_inner_count(ref); k++) ok = gpu_same_bits(what, lpx_tensor_inner(ref, k),
                                                                                  lpx_tensor_inner(dev, k));
    return ok;
}

static lpx_fsdp_stats stats(lpx_fsdp *f)
{
    lpx_fsdp_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_OK(lpx_fsdp_stats_get(f, &s));
    return s;
}

/* The offloading engine's group is unsharded now through the overlapped
 * prefetch (pre) or lpx_fsdp_unshard. The prefetch leaves the group
 * unsharded with its gather pending (no unshard counted yet); the first
 * use completes it: lpx_fsdp_unshard on even steps, lpx_fsdp_param_full
 * on odd ones. */
static void gpu_unshard(lpx_fsdp *f, lpx_fsdp_group *g, bool pre, int step)
{
    if (!pre) {
        CHECK_OK(lpx_fsdp_unshard(g));
        return;
    }
    CHECK_OK(lpx_fsdp_prefetch(g));
    CHECK(lpx_fsdp_is_unsharded(g));
    lpx_fsdp_stats s = stats(f);
    CHECKF(s.unshards == 0 && s.calls[LPX_COLL_ALL_GATHER] == 1 && s.h2d_copies == 1,
           "prefetch: %llu unshards (0: the gather is pending), %llu all-gathers, %llu h2d",
           (unsigned long long)s.unshards, (unsigned long long)s.calls[LPX_COLL_ALL_GATHER],
           (unsigned long long)s.h2d_copies);
    if (step % 2 == 0) CHECK_OK(lpx_fsdp_unshard(g));
    else CHECK(lpx_fsdp_param_full(g, 0) != NULL);
    CHECK(stats(f).unshards == 1);
}

/* The two engines the cases compare: the reference on the CPU (a local
 * comm of one rank) and one computing on cuda:0 (an NCCL comm of one rank),
 * both with keep_storage as given; dev: its params handed in on the GPU (a
 * device-resident engine), else on the host (offload). */
typedef struct engines {
    lpx_comm *lc, *nc;
    lpx_fsdp *rf, *gf;
    lpx_fsdp_group *rg, *gg;
} engines;

static void engines_free(engines *e)
{
    lpx_fsdp_free(e->rf);
    lpx_fsdp_free(e->gf);
    lpx_comm_destroy(e->lc);
    lpx_comm_destroy(e->nc);
}

/* false (nothing left to free) when a comm cannot be made; the engines
 * may still be NULL on true (the checks said why) */
static bool engines_make(engines *e, bool keep, bool dev)
{
    memset(e, 0, sizeof *e);
    CHECK_OK(lpx_local_comm_group_create(1, &e->lc));
    CHECK_OK(create_local(1, NULL, 0, &e->nc));
    if (!e->lc || !e->nc) {
        engines_free(e);
        return false;
    }
    lpx_fsdp_config rcfg = {.struct_size = sizeof rcfg, .keep_storage = keep};
    lpx_fsdp_config gcfg = {.struct_size = sizeof gcfg, .keep_storage = keep, .compute_device = lpx_cuda_device(0)};
    e->rf = make_engine(e->lc, &rcfg, &e->rg, false);
    e->gf = make_engine(e->nc, &gcfg, &e->gg, dev);
    return e->rf && e->gf;
}


/* The step's grads of the three trainable params: the same values to the
 * CPU engine (host tensors) and to the GPU one (on cuda:0); with
 * refuse_host, the GPU engine first refuses a host grad */
static void set_grads(lpx_fsdp_group *rg, lpx_fsdp_group *gg, int step, bool refuse_host)
{
    for (int i = 0; i < 3; i++) {
        lpx_tensor *like = i == 2 ? lpx_float8_weight_master(lpx_fsdp_param_local(rg, i)) : lpx_fsdp_param_local(rg, i);
        lpx_tensor *gr = rand_normal(lpx_tensor_ndim(like), lpx_tensor_shape(like), 100 + 10 * (uint64_t)step + (uint64_t)i, 0.1, i == 1 ? LPX_BF16 : LPX_F32);
        lpx_tensor *gd = gr ? gpu_up(gr) : NULL;
        CHECK_OK(lpx_fsdp_set_grad(rg, i, gr));
        if (refuse_host && i == 0) CHECK_ERR(lpx_fsdp_set_grad(gg, i, gr), LPX_EDEVICE); /* a host grad */
        CHECK_OK(lpx_fsdp_set_grad(gg, i, gd));
        lpx_tensor_release(gr);
        lpx_tensor_release(gd);
    }
}

static void run_offload(bool keep, bool pre)
{
    engines e;
    if (!engines_make(&e, keep, false)) return;
    lpx_fsdp *rf = e.rf, *gf = e.gf;
    lpx_fsdp_group *rg = e.rg, *gg = e.gg;
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 1e-2;
    for (int step = 0; rf && gf && step < 2; step++) {
        /* unshard: the same params, on the device, from ONE upload */
        lpx_fsdp_stats_reset(rf);
        lpx_fsdp_stats_reset(gf);
        CHECK_OK(lpx_fsdp_unshard(rg));
        gpu_unshard(gf, gg, pre, step);
        for (int i = 0; i < NP; i++)
            CHECKF(same_tensor(names[i], lpx_fsdp_param_full(rg, i), lpx_fsdp_param_full(gg, i)),
                   "keep %d pre %d step %d: unsharded %s", keep, pre, step, names[i]);
        lpx_fsdp_stats rs = stats(rf), gs = stats(gf);
        CHECK(gs.calls[LPX_COLL_ALL_GATHER] == 1 && rs.calls[LPX_COLL_ALL_GATHER] == 1);
        CHECKF(gs.h2d_copies == 1 && gs.h2d_bytes == gs.bytes[LPX_COLL_ALL_GATHER] && gs.h2d_bytes > 0,
               "h2d %llu copies of %llu bytes, all-gather %llu bytes", (unsigned long long)gs.h2d_copies,
               (unsigned long long)gs.h2d_bytes, (unsigned long long)gs.bytes[LPX_COLL_ALL_GATHER]);
        CHECK(gs.d2h_copies == 0);
        CHECK(rs.h2d_copies == 0 && rs.d2h_copies == 0 && rs.pinned_bytes == 0);
        CHECKF(gs.pinned_bytes >= gs.h2d_bytes, "pinned staging %llu bytes", (unsigned long long)gs.pinned_bytes);
        CHECK(gs.unsharded_bytes == rs.unsharded_bytes);
        /* grads: the same values, on the device for the offloading engine */
        set_grads(rg, gg, step, step == 0);
        CHECK_OK(lpx_fsdp_reshard(rg));
        CHECK_OK(lpx_fsdp_reshard(gg));
        lpx_fsdp_stats_reset(rf);
        lpx_fsdp_stats_reset(gf);
        CHECK_OK(lpx_fsdp_reduce_scatter_grads(rg));
        CHECK_OK(lpx_fsdp_reduce_scatter_grads(gg));
        gs = stats(gf);
        CHECK(gs.calls[LPX_COLL_REDUCE_SCATTER] == 2); /* f32 and bf16 */
        CHECKF(gs.d2h_copies == 2 && gs.h2d_copies == 0, "reduce-scatter: %llu d2h, %llu h2d copies",
               (unsigned long long)gs.d2h_copies, (unsigned long long)gs.h2d_copies);
        for (int i = 0; i < 3; i++) {
            lpx_tensor *a = lpx_fsdp_param_grad(rg, i), *b = lpx_fsdp_param_grad(gg, i);
            CHECK(b && lpx_tensor_device(b).type == LPX_DEVICE_CPU);
            CHECKF(a && b && gpu_same_bits(names[i], a, b), "keep %d step %d: grad shard of %s", keep, step, names[i]);
        }
        /* the optimizer on the CPU, then the scales for the next step */
        CHECK_OK(lpx_fsdp_adamw_step(rg, &o));
        CHECK_OK(lpx_fsdp_adamw_step(gg, &o));
        for (int i = 0; i < 3; i++) {
            lpx_tensor *a = lpx_fsdp_param_local(rg, i), *b = lpx_fsdp_param_local(gg, i);
            if (i == 2) a = lpx_float8_weight_master(a), b = lpx_float8_weight_master(b);
            CHECK(b && lpx_tensor_device(b).type == LPX_DEVICE_CPU);
            CHECKF(a && b && gpu_same_bits(names[i], a, b), "keep %d step %d: local shard of %s after AdamW", keep,
                   step, names[i]);
        }
        if (step == 0) {
            CHECK_OK(lpx_fsdp_precompute_scales(rf));
            CHECK_OK(lpx_fsdp_precompute_scales(gf));
            float a = lpx_float8_weight_scale(lpx_fsdp_param_local(rg, 2)),
                  b = lpx_float8_weight_scale(lpx_fsdp_param_local(gg, 2));
            CHECKF(a > 0 && memcmp(&a, &b, sizeof a) == 0, "precomputed scale %.9g vs %.9g", (double)a, (double)b);
        }
    }
    engines_free(&e);
}

/* ---- device-resident: the params handed in on cuda:0 ------------------ *
 * The same four params on the GPU (make_params), the same two steps: the
 * unsharded params, the grad shards and the local shards after AdamW equal
 * the CPU engine's bit for bit, all of them on cuda:0, and not one copy
 * crosses between host and device in unshard, reduce-scatter or AdamW. */
static bool on_gpu(lpx_tensor *t) { return t && lpx_tensor_device(t).type == LPX_DEVICE_CUDA; }

static void run_resident(bool keep)
{
    engines e;
    if (!engines_make(&e, keep, true)) return;
    lpx_fsdp *rf = e.rf, *gf = e.gf;
    lpx_fsdp_group *rg = e.rg, *gg = e.gg;
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 1e-2;
    for (int i = 0; gf && i < NP; i++) CHECKF(on_gpu(lpx_fsdp_param_local(gg, i)), "local shard of %s", names[i]);
    for (int step = 0; rf && gf && step < 2; step++) {
        lpx_fsdp_stats_reset(rf);
        lpx_fsdp_stats_reset(gf);
        CHECK_OK(lpx_fsdp_unshard(rg));
        CHECK_OK(lpx_fsdp_unshard(gg));
        for (int i = 0; i < NP; i++)
            CHECKF(same_tensor(names[i], lpx_fsdp_param_full(rg, i), lpx_fsdp_param_full(gg, i)),
                   "resident keep %d step %d: unsharded %s", keep, step, names[i]);
        lpx_fsdp_stats gs = stats(gf);
        CHECKF(gs.calls[LPX_COLL_ALL_GATHER] == 1 && gs.h2d_copies == 0 && gs.d2h_copies == 0,
               "resident unshard: %llu all-gathers, %llu h2d, %llu d2h copies",
               (unsigned long long)gs.calls[LPX_COLL_ALL_GATHER], (unsigned long long)gs.h2d_copies,
               (unsigned long long)gs.d2h_copies);
        set_grads(rg, gg, step, false);
        CHECK_OK(lpx_fsdp_reshard(rg));
        CHECK_OK(lpx_fsdp_reshard(gg));
        lpx_fsdp_stats_reset(gf);
        CHECK_OK(lpx_fsdp_reduce_scatter_grads(rg));
        CHECK_OK(lpx_fsdp_reduce_scatter_grads(gg));
        for (int i = 0; i < 3; i++) {
            lpx_tensor *a = lpx_fsdp_param_grad(rg, i), *b = lpx_fsdp_param_grad(gg, i);
            CHECKF(on_gpu(b) && a && gpu_same_bits(names[i], a, b), "resident keep %d step %d: grad shard of %s",
                   keep, step, names[i]);
        }
        CHECK_OK(lpx_fsdp_adamw_step(rg, &o));
        CHECK_OK(lpx_fsdp_adamw_step(gg, &o));
        gs = stats(gf);
        CHECKF(gs.h2d_copies == 0 && gs.d2h_copies == 0, "resident reduce-scatter + AdamW: %llu h2d, %llu d2h",
               (unsigned long long)gs.h2d_copies, (unsigned long long)gs.d2h_copies);
        for (int i = 0; i < 3; i++) {
            lpx_tensor *a = lpx_fsdp_param_local(rg, i), *b = lpx_fsdp_param_local(gg, i);
            if (i == 2) a = lpx_float8_weight_master(a), b = lpx_float8_weight_master(b);
            CHECKF(on_gpu(b) && a && gpu_same_bits(names[i], a, b), "resident keep %d step %d: local shard of %s "
                   "after AdamW", keep, step, names[i]);
        }
        /* the moments: a copy comes to the host, equal to the CPU engine's */
        lpx_tensor *rm = NULL, *rv = NULL, *gm = NULL, *gv = NULL;
        int64_t rs = 0, gsn = 0;
        CHECK_OK(lpx_fsdp_param_adamw_state(rg, 0, &rm, &rv, &rs));
        CHECK_OK(lpx_fsdp_param_adamw_state(gg, 0, &gm, &gv, &gsn));
        CHECK(rs == step + 1 && gsn == rs);
        CHECK(gm && lpx_tensor_device(gm).type == LPX_DEVICE_CPU && rm && gpu_same_bits("exp_avg", rm, gm));
        CHECK(gv && rv && gpu_same_bits("exp_avg_sq", rv, gv));
        lpx_tensor *rel[] = {rm, rv, gm, gv};
        for (int k = 0; k < 4; k++) lpx_tensor_release(rel[k]);
        if (step == 0) {
            CHECK_OK(lpx_fsdp_precompute_scales(rf));
            CHECK_OK(lpx_fsdp_precompute_scales(gf));
            float a = lpx_float8_weight_scale(lpx_fsdp_param_local(rg, 2)),
                  b = lpx_float8_weight_scale(lpx_fsdp_param_local(gg, 2));
            CHECKF(a > 0 && memcmp(&a, &b, sizeof a) == 0, "resident precomputed scale %.9g vs %.9g", (double)a,
                   (double)b);
        }
    }
    engines_free(&e);
}

static void test_resident(void) { run_resident(false); }
static void test_resident_keep_storage(void) { run_resident(true); }

/* params on the host and on the device in one engine: refused at shard */
static void test_resident_mixed_refused(void)
{
    lpx_comm *nc = NULL;
    CHECK_OK(create_local(1, NULL, 0, &nc));
    if (!nc) return;
    const int64_t s[1] = {8};
    lpx_tensor *h = rand_normal(1, s, 5, 1.0, LPX_F32), *d = h ? gpu_up(h) : NULL;
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .compute_device = lpx_cuda_device(0)};
    CHECK_OK(lpx_mesh_new(nc, &mesh));
    if (mesh) CHECK_OK(lpx_fsdp_new(mesh, &cfg, &f));
    if (f && h && d) {
        CHECK_OK(lpx_fsdp_group_add(f, "g", &g));
        CHECK_OK(lpx_fsdp_param_add(g, "on_device", d, 0, NULL));
        CHECK_OK(lpx_fsdp_param_add(g, "on_host", h, 0, NULL));
        CHECK_ERR(lpx_fsdp_shard(f), LPX_EDEVICE);
        CHECKF(strstr(lpx_last_error(), "'on_device'") && strstr(lpx_last_error(), "'on_host'"), "%s",
               lpx_last_error());
    }
    lpx_fsdp_free(f);
    lpx_mesh_release(mesh);
    lpx_tensor_release(h);
    lpx_tensor_release(d);
    lpx_comm_destroy(nc);
}

static void test_offload(void) { run_offload(false, false); }
static void test_offload_keep_storage(void) { run_offload(true, false); }
static void test_prefetch_overlapped(void) { run_offload(false, true); }
static void test_prefetch_overlapped_keep_storage(void) { run_offload(true, true); }

/* Four groups (the four params each, other seeds per group), driven the
 * way a training loop does over two passes: unshard(k), prefetch(k+1),
 * reshard(k); a prefetched group resharded unused in between. The
 * overlapped prefetch rotates its staging blocks (each reused only after
 * its upload completed); every gathered param equals the CPU engine's bit
 * for bit. */
#define NG 4
static void run_chain(bool keep)
{
    lpx_comm *lc = NULL, *nc = NULL;
    CHECK_OK(lpx_local_comm_group_create(1, &lc));
    CHECK_OK(create_local(1, NULL, 0, &nc));
    lpx_mesh *lm = NULL, *nm = NULL;
    if (lc) CHECK_OK(lpx_mesh_new(lc, &lm));
    if (nc) CHECK_OK(lpx_mesh_new(nc, &nm));
    lpx_fsdp_config rcfg = {.struct_size = sizeof rcfg, .keep_storage = keep};
    lpx_fsdp_config gcfg = {.struct_size = sizeof gcfg, .keep_storage = keep, .compute_device = lpx_cuda_device(0)};
    lpx_fsdp *rf = NULL, *gf = NULL;
    lpx_fsdp_group *rg[NG] = {0}, *gg[NG] = {0};
    if (lm) CHECK_OK(lpx_fsdp_new(lm, &rcfg, &rf));
    if (nm) CHECK_OK(lpx_fsdp_new(nm, &gcfg, &gf));
    for (int k = 0; rf && gf && k < NG; k++) {
        char nm_[16];
        snprintf(nm_, sizeof nm_, "g%d", k);
        CHECK_OK(lpx_fsdp_group_add(rf, nm_, &rg[k]));
        CHECK_OK(lpx_fsdp_group_add(gf, nm_, &gg[k]));
        for (int e = 0; e < 2; e++) {
            lpx_tensor *p[NP];
            make_params(p, false);
            for (int i = 0; i < NP; i++) {
                /* a different first param per group: its scale by k + 1 */
                lpx_tensor *q = p[i];
                if (i == 0) CHECK_OK(lpx_mul_scalar(p[0], (double)(k + 1), &q));
                CHECK_OK(lpx_fsdp_param_add(e ? gg[k] : rg[k], names[i], q, i == 3 ? LPX_FSDP_FROZEN : 0, NULL));
                if (q != p[i]) lpx_tensor_release(q);
                lpx_tensor_release(p[i]);
            }
        }
    }
    if (rf && gf) {
        CHECK_OK(lpx_fsdp_shard(rf));
        CHECK_OK(lpx_fsdp_shard(gf));
    }
    for (int pass = 0; rf && gf && pass < 2; pass++) {
        for (int k = 0; k < NG; k++) {
            CHECK_OK(lpx_fsdp_unshard(rg[k]));
            CHECK_OK(lpx_fsdp_unshard(gg[k])); /* completes the prefetch of k (k > 0) */
            if (k + 1 < NG) {
                CHECK_OK(lpx_fsdp_prefetch(rg[k + 1]));
                CHECK_OK(lpx_fsdp_prefetch(gg[k + 1]));
                CHECK(lpx_fsdp_is_unsharded(gg[k + 1]));
            }
            for (int i = 0; i < NP; i++)
                CHECKF(same_tensor(names[i], lpx_fsdp_param_full(rg[k], i), lpx_fsdp_param_full(gg[k], i)),
                       "chain keep %d pass %d group %d: %s", keep, pass, k, names[i]);
            CHECK_OK(lpx_fsdp_reshard(rg[k]));
            CHECK_OK(lpx_fsdp_reshard(gg[k]));
        }
        /* a prefetch resharded unused, then gathered again */
        CHECK_OK(lpx_fsdp_prefetch(gg[0]));
        CHECK_OK(lpx_fsdp_reshard(gg[0]));
        CHECK(!lpx_fsdp_is_unsharded(gg[0]) && lpx_fsdp_param_full(gg[0], 0) == NULL);
    }
    lpx_fsdp_stats gs = stats(gf ? gf : rf);
    CHECKF(!gf || gs.peak_unsharded_groups == 2, "peak unsharded groups %d", gs.peak_unsharded_groups);
    /* a prefetch left pending at free: the engine waits for it */
    if (gf) CHECK_OK(lpx_fsdp_prefetch(gg[1]));
    lpx_fsdp_free(rf);
    lpx_fsdp_free(gf);
    lpx_mesh_release(lm);
    lpx_mesh_release(nm);
    lpx_comm_destroy(lc);
    lpx_comm_destroy(nc);
}

static void test_prefetch_chain(void) { run_chain(false); }
static void test_prefetch_chain_keep_storage(void) { run_chain(true); }

#ifdef LPX_TEST_HAVE_CUDART
/* ---- overlap: the prefetch's upload + all-gather run beside compute --- *
 * One group of one dense f32 [8192, 8192] param (256 MiB on the wire) on a
 * one-rank NCCL comm, where the all-gather is in place and nearly free, so
 * the host->device copy of the staging block is the gather's cost. The
 * compute is a loop of bf16 4096^3 lpx_matmul on lpx-cuda's stream, sized
 * to last about as long. Timed with cudaEvents on lpx-cuda's stream, each
 * window opened after a "lead" of matmuls longer than the host's pack, so
 * that the window holds GPU work only (the host runs ahead, as in
 * training):
 *   t_gather   prefetch(g); unshard(g)
 *   t_compute  compute
 *   t_overlap  prefetch(g); compute; unshard(g)
 * median of 5 after a warm-up; t_overlap < 0.8 (t_gather + t_compute). */
static lpx_status mm_loop(lpx_tensor *a, int reps)
{
    for (int i = 0; i < reps; i++) {
        lpx_tensor *c = NULL;
        lpx_status st = lpx_matmul(a, a, &c);
        lpx_tensor_release(c);
        if (st) return st;
    }
    return LPX_OK;
}

static int cmp_f(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

enum { W_GATHER, W_COMPUTE, W_OVERLAP };

/* One timed window (ms) of kind w after `lead` matmuls. */
static float window(cudaStream_t s, lpx_fsdp_group *g, lpx_tensor *a, int lead, int reps, int w)
{
    cudaEvent_t e0, e1;
    float ms = -1;
    if (cudaEventCreate(&e0) != cudaSuccess) return -1;
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return -1;
    }
    lpx_status st = mm_loop(a, lead);
    if (!st && cudaEventRecord(e0, s) != cudaSuccess) st = LPX_EDEVICE;
    if (!st && w != W_COMPUTE) st = lpx_fsdp_prefetch(g);
    if (!st && w != W_GATHER) st = mm_loop(a, reps);
    if (!st && w != W_COMPUTE) st = lpx_fsdp_unshard(g);
    if (!st && cudaEventRecord(e1, s) != cudaSuccess) st = LPX_EDEVICE;
    if (!st && (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess))
        st = LPX_EDEVICE;
    if (st) {
        printf("  window %d failed: %s\n", w, lpx_last_error());
        ms = -1;
    }
    if (w != W_COMPUTE) lpx_fsdp_reshard(g);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms;
}

static float median5(cudaStream_t s, lpx_fsdp_group *g, lpx_tensor *a, int lead, int reps, int w)
{
    float t[5];
    (void)window(s, g, a, lead, reps, w); /* warm-up */
    for (int i = 0; i < 5; i++) t[i] = window(s, g, a, lead, reps, w);
    qsort(t, 5, sizeof *t, cmp_f);
    return t[0] < 0 ? -1 : t[2];
}

static void test_overlap(void)
{
    void *sym = lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_STREAM);
    lpx_cuda_stream_fn stream_of = NULL;
    CHECK(sym != NULL);
    if (!sym) return;
    memcpy(&stream_of, &sym, sizeof sym);
    cudaStream_t s = (cudaStream_t)stream_of(0);
    lpx_comm *nc = NULL;
    lpx_mesh *nm = NULL;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_tensor *w = NULL, *a = NULL;
    CHECK_OK(create_local(1, NULL, 0, &nc));
    if (nc) CHECK_OK(lpx_mesh_new(nc, &nm));
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .compute_device = lpx_cuda_device(0)};
    if (nm) CHECK_OK(lpx_fsdp_new(nm, &cfg, &f));
    const int64_t ws[2] = {8192, 8192}, as[2] = {4096, 4096};
    CHECK_OK(lpx_zeros(2, ws, LPX_F32, lpx_cpu(), &w));
    CHECK_OK(lpx_zeros(2, as, LPX_BF16, gpu_dev(), &a));
    if (f && w) {
        CHECK_OK(lpx_fsdp_group_add(f, "big", &g));
        if (g) CHECK_OK(lpx_fsdp_param_add(g, "w", w, 0, NULL));
        CHECK_OK(lpx_fsdp_shard(f));
    }
    if (!f || !g || !a) goto out;
    /* the host's share of a prefetch (pre_all_gather + pack): the lead
     * must outlast it so the windows hold GPU work only */
    uint64_t h0 = lpx_now_ns();
    CHECK_OK(lpx_fsdp_prefetch(g));
    uint64_t host_ns = lpx_now_ns() - h0;
    CHECK_OK(lpx_fsdp_unshard(g));
    CHECK_OK(lpx_fsdp_reshard(g));
    lpx_fsdp_stats st = stats(f);
    CHECKF(st.pinned_bytes >= (uint64_t)8192 * 8192 * 4, "pinned %llu bytes: no pinned staging block",
           (unsigned long long)st.pinned_bytes);
    float t_mm = median5(s, g, a, 0, 8, W_COMPUTE) / 8;
    h0 = lpx_now_ns();
    CHECK_OK(lpx_fsdp_prefetch(g));
    uint64_t h1 = lpx_now_ns() - h0;
    CHECK_OK(lpx_fsdp_unshard(g));
    CHECK_OK(lpx_fsdp_reshard(g));
    if (h1 > host_ns) host_ns = h1;
    if (t_mm <= 0) goto out;
    int lead = (int)(2.0 * (double)host_ns / 1e6 / t_mm) + 4;
    float t_gather = median5(s, g, a, lead, 0, W_GATHER);
    int reps = t_gather > 0 ? (int)(t_gather / t_mm + 0.5f) : 1;
    if (reps < 1) reps = 1;
    float t_compute = median5(s, g, a, lead, reps, W_COMPUTE);
    float t_overlap = median5(s, g, a, lead, reps, W_OVERLAP);
    printf("  overlap: host prefetch %.2f ms, matmul %.3f ms (lead %d, compute %d): t_gather %.3f ms, "
           "t_compute %.3f ms, t_overlap %.3f ms (%.2f of the sum)\n", (double)host_ns / 1e6, (double)t_mm, lead,
           reps, (double)t_gather, (double)t_compute, (double)t_overlap,
           (double)(t_overlap / (t_gather + t_compute)));
    CHECK(t_gather > 0 && t_compute > 0 && t_overlap > 0);
    CHECKF(t_gather >= 1.0f, "t_gather %.3f ms: too fast to measure an overlap", (double)t_gather);
    CHECKF(t_overlap < 0.8f * (t_gather + t_compute), "t_overlap %.3f ms >= 0.8 x (%.3f + %.3f) ms: no overlap",
           (double)t_overlap, (double)t_gather, (double)t_compute);
out:
    lpx_tensor_release(a);
    lpx_tensor_release(w);
    lpx_fsdp_free(f);
    lpx_mesh_release(nm);
    lpx_comm_destroy(nc);
}
#else
static void test_overlap(void) { printf("  (built without cudart: the overlap timing is skipped)\n"); }
#endif

static void test_refusals(void)
{
    lpx_comm *lc = NULL, *nc = NULL;
    lpx_mesh *lm = NULL, *nm = NULL;
    lpx_fsdp *f = NULL;
    CHECK_OK(lpx_local_comm_group_create(1, &lc));
    CHECK_OK(create_local(1, NULL, 0, &nc));
    if (lc) CHECK_OK(lpx_mesh_new(lc, &lm));
    if (nc) CHECK_OK(lpx_mesh_new(nc, &nm));
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .compute_device = lpx_cuda_device(0)};
    if (lm) {
        CHECK_ERR(lpx_fsdp_new(lm, &cfg, &f), LPX_EDEVICE); /* device memory needs NCCL */
        CHECK(strstr(lpx_last_error(), "'local'") != NULL);
        CHECK(f == NULL);
    }
    if (nm) {
        cfg.fp8_grad_reduce = true;
        CHECK_ERR(lpx_fsdp_new(nm, &cfg, &f), LPX_EINVAL); /* NCCL does not reduce fp8 */
        CHECK(f == NULL);
        cfg.fp8_grad_reduce = false;
        cfg.compute_device = lpx_cuda_device(1); /* the comm runs on cuda:0 */
        CHECK_ERR(lpx_fsdp_new(nm, &cfg, &f), LPX_EDEVICE);
        CHECK(f == NULL);
    }
    lpx_mesh_release(lm);
    lpx_mesh_release(nm);
    lpx_comm_destroy(lc);
    lpx_comm_destroy(nc);
}

int main(void)
{
    setup();
    RUN(test_offload);
    RUN(test_resident);
    RUN(test_resident_keep_storage);
    RUN(test_resident_mixed_refused);
    RUN(test_offload_keep_storage);
    RUN(test_prefetch_overlapped);
    RUN(test_prefetch_overlapped_keep_storage);
    RUN(test_prefetch_chain);
    RUN(test_prefetch_chain_keep_storage);
    RUN(test_overlap);
    RUN(test_refusals);
    return CHECK_DONE();
}
