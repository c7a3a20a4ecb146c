/* The fsdp tests, faults, bad arguments and config versions. */
#include "fsdp_util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static lpx_status fault_rank(lpx_comm *comm, void *vctx)
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

static void test_faults(void)
{
    const int64_t s[2] = {21, 6};
    for (int mode = 0; mode < 3; mode++) {
        fault_ctx c;
        memset(&c, 0, sizeof c);
        c.mode = mode;
        c.full = rand_normal(2, s, 1, 1.0, LPX_F32);
        lpx_status st = lpx_local_run(4, fault_rank, &c, 200, NULL);
        CHECK(st != LPX_OK);
        for (int r = 0; r < 4; r++) {
            CHECKF(c.st[r] != LPX_OK, "mode %d rank %d succeeded", mode, r);
            CHECKF(c.secs[r] < 3.0, "mode %d rank %d took %.2f s", mode, r, c.secs[r]);
        }
        lpx_tensor_release(c.full);
    }
}

static void test_errors(void)
{
    lpx_comm *comms[1];
    CHECK_OK(lpx_local_comm_group_create(1, comms));
    lpx_fsdp *f = NULL;
    CHECK_OK(new_engine(comms[0], NULL, &f));
    lpx_fsdp_group *g = NULL;
    CHECK_OK(lpx_fsdp_group_add(f, "g", &g));
    lpx_tensor *scalar = NULL, *t = NULL;
    CHECK_OK(lpx_zeros(0, NULL, LPX_F32, lpx_cpu(), &scalar));
    CHECK_ERR(lpx_fsdp_param_add(g, "s", scalar, 0, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_fsdp_unshard(g), LPX_EINVAL); /* before shard */
    const int64_t sh[2] = {3, 3};
    t = rand_normal(2, sh, 1, 1.0, LPX_F32);
    CHECK_OK(lpx_fsdp_param_add(g, "t", t, 0, NULL));
    CHECK_OK(lpx_fsdp_shard(f));
    CHECK_ERR(lpx_fsdp_reduce_scatter_grads(g), LPX_EINVAL); /* no grad */
    const int64_t bad[2] = {2, 3};
    lpx_tensor *bg = rand_normal(2, bad, 2, 1.0, LPX_F32);
    CHECK_ERR(lpx_fsdp_set_grad(g, 0, bg), LPX_ESHAPE);
    CHECK_ERR(lpx_fsdp_adamw_step(g, NULL), LPX_EINVAL);
    lpx_tensor_release(bg);
    lpx_tensor_release(scalar);
    lpx_tensor_release(t);
    lpx_fsdp_free(f);
    lpx_comm_destroy(comms[0]);
}

/* lpx_fsdp_config and lpx_fsdp_stats grow at their end: a caller built
 * against the older layouts (up to param_dtype / unpack_ns) still works
 * and gets the defaults / the fields it knows; CPU offload is refused
 * without an NCCL comm, naming the comm's backend (this machine may have
 * no CUDA backend either: the comm is checked first). */
static void test_config_versions(void)
{
    lpx_comm *comms[1];
    CHECK_OK(lpx_local_comm_group_create(1, comms));
    lpx_fsdp *f = NULL;
    lpx_fsdp_config cfg;
    memset(&cfg, 0xff, sizeof cfg); /* what an old caller's stack holds past its struct */
    cfg.struct_size = offsetof(lpx_fsdp_config, param_dtype) + sizeof(lpx_dtype);
    cfg.max_unsharded = 1;
    cfg.keep_storage = false;
    cfg.fp8_grad_reduce = false;
    cfg.fp8_grad_dtype = 0;
    cfg.param_dtype = 0;
    CHECK_OK(new_engine(comms[0], &cfg, &f)); /* compute_device not read: the CPU */
    lpx_fsdp_group *g = NULL;
    const int64_t sh[2] = {5, 3};
    lpx_tensor *t = rand_normal(2, sh, 1, 1.0, LPX_F32), *gr = rand_normal(2, sh, 2, 1.0, LPX_F32);
    CHECK_OK(lpx_fsdp_group_add(f, "g", &g));
    CHECK_OK(lpx_fsdp_param_add(g, "t", t, 0, NULL));
    CHECK_OK(lpx_fsdp_shard(f));
    CHECK_OK(lpx_fsdp_unshard(g));
    CHECK(same_bits(lpx_fsdp_param_full(g, 0), t));
    CHECK_OK(lpx_fsdp_set_grad(g, 0, gr));
    CHECK_OK(lpx_fsdp_reduce_scatter_grads(g));
    CHECK(same_bits(lpx_fsdp_param_grad(g, 0), gr));
    /* old stats layout: filled up to unpack_ns, nothing past it */
    unsigned char buf[sizeof(lpx_fsdp_stats) + 8];
    memset(buf, 0xab, sizeof buf);
    lpx_fsdp_stats *s = (lpx_fsdp_stats *)(void *)buf;
    size_t v1 = offsetof(lpx_fsdp_stats, unpack_ns) + sizeof(uint64_t);
    s->struct_size = v1;
    CHECK_OK(lpx_fsdp_stats_get(f, s));
    CHECK(s->struct_size == v1 && s->calls[LPX_COLL_ALL_GATHER] == 2 && s->unshards == 1); /* shard + unshard */
    CHECK(buf[v1] == 0xab && buf[sizeof buf - 1] == 0xab);
    lpx_fsdp_stats full = {.struct_size = sizeof full};
    CHECK_OK(lpx_fsdp_stats_get(f, &full));
    CHECK(full.h2d_copies == 0 && full.d2h_copies == 0 && full.pinned_bytes == 0 && full.copy_ns == 0);
    s->struct_size = v1 - 1;
    CHECK_ERR(lpx_fsdp_stats_get(f, s), LPX_EINVAL);
    lpx_fsdp_free(f);
    f = NULL;
    cfg.struct_size = offsetof(lpx_fsdp_config, param_dtype); /* older than any layout */
    CHECK_ERR(new_engine(comms[0], &cfg, &f), LPX_EINVAL);
    /* offload needs device buffers: a local comm is refused by name */
    lpx_fsdp_config oc = {.struct_size = sizeof oc, .compute_device = {LPX_DEVICE_CUDA, 0}};
    CHECK_ERR(new_engine(comms[0], &oc, &f), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "'local'") != NULL && f == NULL);
    oc.compute_device.type = 99;
    CHECK_ERR(new_engine(comms[0], &oc, &f), LPX_EDEVICE);
    lpx_tensor_release(t);
    lpx_tensor_release(gr);
    lpx_comm_destroy(comms[0]);
}

int main(void)
{
    RUN(test_faults);
    RUN(test_errors);
    RUN(test_config_versions);
    return CHECK_DONE();
}
