/* Comm backend "sim": the local backend's collectives (N ranks as N
 * threads) under NCCL's rules, so the device code paths that would meet
 * NCCL on a GPU meet the same refusals in CI:
 *   - one rank per device: rank r computes on sim:r;
 *   - buffers must be memory of the rank's own device (the _buf forms are
 *     handed raw pointers: the memory registry says whose they are); a
 *     host buffer, or another device's, fails the comm for every rank,
 *     as lpx-nccl.so does;
 *   - collectives run in the order they are called, on the device (the
 *     buffers are opened for the backend only for the call).
 * Each rank's comm wraps its local comm; the collective itself is the
 * local backend's (the same bits as the host reference). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "simdev_internal.h"

typedef struct sim_rank {
    lpx_comm *inner;   /* the local backend's comm of this rank (owned by lpx_local_run) */
    int rank, size, dev;
} sim_rank;

static int s_rank(void *self) { return ((sim_rank *)self)->rank; }
static int s_size(void *self) { return ((sim_rank *)self)->size; }

/* the buffers of a are memory of this rank's device, else the comm fails */
static lpx_status check_bufs(sim_rank *r, const lpx_comm_args *a)
{
    const void *ptrs[2] = {a->send, a->recv};
    for (int i = 0; i < 2; i++) {
        if (!ptrs[i]) continue;
        int owner = sim_owner(ptrs[i], 0);
        if (owner == r->dev) continue;
        char where[32];
        if (owner < 0) snprintf(where, sizeof where, "host");
        else snprintf(where, sizeof where, "sim:%d", owner);
        char why[256];
        snprintf(why, sizeof why, "rank %d passed %s memory as the %s buffer of %s (comm 'sim' moves memory of sim:%d "
                 "only, as NCCL moves its GPU's)", r->rank, where, i ? "receive" : "send", lpx_coll_name(a->kind),
                 r->dev);
        lpx_comm_abort(r->inner, why);
        return lpx_error(LPX_EDEVICE, "%s; the comm is now failed", why);
    }
    return LPX_OK;
}

static lpx_status run(sim_rank *r, const lpx_comm_args *a)
{
    lpx_status st = check_bufs(r, a);
    if (st) return st;
    sim_flush(r->dev);   /* ordered on the device's stream: earlier ops' writes land first */
    sim_open(a->send, 0);
    sim_open(a->recv, 0);
    switch (a->kind) {
    case LPX_COLL_ALL_GATHER: st = lpx_comm_all_gather_buf(r->inner, a->send, a->recv, a->nbytes); break;
    case LPX_COLL_REDUCE_SCATTER:
        st = lpx_comm_reduce_scatter_buf(r->inner, a->send, a->recv, a->count, a->dtype, a->op);
        break;
    case LPX_COLL_ALL_REDUCE: st = lpx_comm_all_reduce_buf(r->inner, a->send, a->recv, a->count, a->dtype, a->op); break;
    case LPX_COLL_BROADCAST: st = lpx_comm_broadcast_buf(r->inner, a->recv ? a->recv : (void *)a->send, a->nbytes,
                                                         a->root);
        break;
    default: st = lpx_comm_barrier(r->inner); break;
    }
    sim_close(a->recv, 0);
    sim_close(a->send, 0);
    if (!st) atomic_fetch_add_explicit(&sim_count.collectives, 1, memory_order_relaxed);
    return st;
}

static lpx_status s_all_gather(void *self, const lpx_comm_args *a) { return run(self, a); }
static lpx_status s_reduce_scatter(void *self, const lpx_comm_args *a) { return run(self, a); }
static lpx_status s_all_reduce(void *self, const lpx_comm_args *a) { return run(self, a); }
static lpx_status s_broadcast(void *self, const lpx_comm_args *a) { return run(self, a); }
static lpx_status s_barrier(void *self, const lpx_comm_args *a)
{
    (void)a;
    return lpx_comm_barrier(((sim_rank *)self)->inner);
}
static void s_abort(void *self, const char *reason) { lpx_comm_abort(((sim_rank *)self)->inner, reason); }
static void s_destroy(void *self) { free(self); }

/* the comm moves memory of this rank's device only (no host all-gather) */
static lpx_status s_caps(void *self, lpx_comm_caps *out)
{
    out->device.type = LPX_DEVICE_SIM;
    out->device.index = ((sim_rank *)self)->dev;
    return LPX_OK;
}

static const lpx_comm_i sim_comm_vt = {
    .struct_size = sizeof(lpx_comm_i),
    .abi_version = LPX_COMM_ABI_VERSION,
    .name = "sim",
    .rank = s_rank,
    .size = s_size,
    .all_gather = s_all_gather,
    .reduce_scatter = s_reduce_scatter,
    .all_reduce = s_all_reduce,
    .broadcast = s_broadcast,
    .barrier = s_barrier,
    .abort = s_abort,
    .destroy = s_destroy,    .caps = s_caps,
};

typedef struct sim_run_ctx {
    lpx_comm_rank_fn fn;
    void *ctx;
    int64_t timeout_ms;
} sim_run_ctx;

static lpx_status rank_main(lpx_comm *inner, void *arg)
{
    sim_run_ctx *c = arg;
    sim_rank *r = calloc(1, sizeof *r);
    if (!r) return lpx_error(LPX_ENOMEM, "sim comm: out of memory");
    r->inner = inner;
    r->rank = lpx_comm_rank(inner);
    r->size = lpx_comm_size(inner);
    r->dev = r->rank;
    lpx_comm *outer = NULL;
    lpx_status st = lpx_comm_new(&sim_comm_vt, r, &outer);
    if (st) {
        free(r);
        return st;
    }
    if (c->timeout_ms > 0) (void)lpx_comm_set_timeout(outer, c->timeout_ms);
    st = c->fn(outer, c->ctx);
    lpx_comm_destroy(outer);
    return st;
}

static lpx_status sim_run(const lpx_comm_backend_i *self, int nranks, int64_t timeout_ms, lpx_comm_rank_fn fn,
                          void *ctx, lpx_status *statuses)
{
    (void)self;
    if (nranks < 1 || nranks > sim_ndevices)
        return lpx_error(LPX_EINVAL, "comm 'sim': %d ranks; there are %d simulated devices (one rank per device; "
                         "LPX_SIMDEV_DEVICES sets how many)", nranks, sim_ndevices);
    sim_run_ctx c = {fn, ctx, timeout_ms};
    return lpx_local_run(nranks, rank_main, &c, timeout_ms, statuses);
}

const lpx_comm_backend_i sim_comm_backend = {
    .struct_size = sizeof(lpx_comm_backend_i),
    .name = "sim",
    .description = "the local backend's collectives on simulated devices, under NCCL's rules (lpx-simdev.so)",
    .run = sim_run,
};
