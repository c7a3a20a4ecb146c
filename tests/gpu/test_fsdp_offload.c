/* GPU suite: CPU offload of the sharding engine (docs/SHARDING.md, "CPU
 * offload").
 *
 * Loads lpx-cuda.so (gpu_setup) and lpx-nccl.so; exits 77 when either
 * declines (no GPU). One group of four params — a dense f32 [13, 5], a
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
    gpu_setup();
    const char *path = getenv("LPX_TEST_NCCL_PLUGIN");
    if (!path || !*path) {
        printf("SKIP: LPX_TEST_NCCL_PLUGIN is not set (lpx-nccl.so was not built)\n");
        exit(GPU_SKIP);
    }
    if (lpx_plugin_load(path, &nccl)) {
        const char *why = lpx_last_error();
        if (strstr(why, "declined")) {
            printf("SKIP: %s\n", why);
            exit(GPU_SKIP);
        }
        printf("loading %s failed: %s\n", path, why);
        exit(1);
    }
    void *p = lpx_plugin_symbol(nccl, LPX_NCCL_SYM_COMM_CREATE_LOCAL);
    if (!p) {
        printf("lpx-nccl.so does not export %s\n", LPX_NCCL_SYM_COMM_CREATE_LOCAL);
        exit(1);
    }
    memcpy(&create_local, &p, sizeof p);
}

/* The four params, new tensors from fixed seeds (each engine gets its own). */
static void make_params(lpx_tensor **p)
{
    const int64_t s0[2] = {13, 5}, s1[1] = {7}, s2[2] = {19, 16}, s3[2] = {136, 64};
    p[0] = gpu_randn_cpu(LPX_F32, 2, s0, 1, 1.0);
    p[1] = gpu_randn_cpu(LPX_BF16, 1, s1, 2, 1.0);
    lpx_tensor *m = gpu_randn_cpu(LPX_F32, 2, s2, 3, 2.0), *w = gpu_randn_cpu(LPX_BF16, 2, s3, 4, 0.5);
    p[2] = p[3] = NULL;
    CHECK_OK(lpx_float8_weight_new(m, NULL, &p[2]));
    CHECK_OK(lpx_nf4_quantize(w, NULL, &p[3]));
    lpx_tensor_release(m);
    lpx_tensor_release(w);
}

/* An engine over a one-rank comm with one group holding the params. */
static lpx_fsdp *make_engine(lpx_comm *c, const lpx_fsdp_config *cfg, lpx_fsdp_group **g)
{
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_tensor *p[NP];
    make_params(p);
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

static void run_offload(bool keep)
{
    lpx_comm *lc = NULL, *nc = NULL;
    CHECK_OK(lpx_local_comm_group_create(1, &lc));
    CHECK_OK(create_local(1, NULL, 0, &nc));
    if (!lc || !nc) {
        lpx_comm_destroy(lc);
        lpx_comm_destroy(nc);
        return;
    }
    lpx_fsdp_config rcfg = {.struct_size = sizeof rcfg, .keep_storage = keep};
    lpx_fsdp_config gcfg = {.struct_size = sizeof gcfg, .keep_storage = keep, .compute_device = lpx_cuda_device(0)};
    lpx_fsdp_group *rg = NULL, *gg = NULL;
    lpx_fsdp *rf = make_engine(lc, &rcfg, &rg), *gf = make_engine(nc, &gcfg, &gg);
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 1e-2;
    for (int step = 0; rf && gf && step < 2; step++) {
        /* unshard: the same params, on the device, from ONE upload */
        lpx_fsdp_stats_reset(rf);
        lpx_fsdp_stats_reset(gf);
        CHECK_OK(lpx_fsdp_unshard(rg));
        CHECK_OK(lpx_fsdp_unshard(gg));
        for (int i = 0; i < NP; i++)
            CHECKF(same_tensor(names[i], lpx_fsdp_param_full(rg, i), lpx_fsdp_param_full(gg, i)),
                   "keep %d step %d: unsharded %s", keep, step, names[i]);
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
        for (int i = 0; i < 3; i++) {
            lpx_tensor *like = i == 2 ? lpx_float8_weight_master(lpx_fsdp_param_local(rg, i)) : lpx_fsdp_param_local(rg, i);
            lpx_tensor *gr = gpu_randn_cpu(i == 1 ? LPX_BF16 : LPX_F32, lpx_tensor_ndim(like), lpx_tensor_shape(like),
                                           100 + 10 * (uint64_t)step + (uint64_t)i, 0.1);
            lpx_tensor *gd = gr ? gpu_up(gr) : NULL;
            CHECK_OK(lpx_fsdp_set_grad(rg, i, gr));
            if (i == 0 && step == 0) CHECK_ERR(lpx_fsdp_set_grad(gg, i, gr), LPX_EDEVICE); /* a host grad */
            CHECK_OK(lpx_fsdp_set_grad(gg, i, gd));
            lpx_tensor_release(gr);
            lpx_tensor_release(gd);
        }
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
    lpx_fsdp_free(rf);
    lpx_fsdp_free(gf);
    lpx_comm_destroy(lc);
    lpx_comm_destroy(nc);
}

static void test_offload(void) { run_offload(false); }
static void test_offload_keep_storage(void) { run_offload(true); }

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
    RUN(test_offload_keep_storage);
    RUN(test_refusals);
    return CHECK_DONE();
}
