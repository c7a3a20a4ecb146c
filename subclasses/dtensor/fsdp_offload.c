/* CPU offload of the sharding engine (cfg.compute_device a device: the
 * placement LPX_FSDP_OFFLOAD; LPX_FSDP_RESIDENT shares the helpers below).
 *
 * What lives where: the local shards, the grad shards and the AdamW state
 * stay in host memory, so the optimizer steps on the CPU exactly as
 * without offload; the unsharded params and the full grads live on the
 * compute device. Per step and group (docs/SHARDING.md, "CPU offload"):
 *   unshard         pre_all_gather + pack on the host (into the staging
 *                   buffer), ONE host->device copy of this rank's block,
 *                   ONE all-gather on device memory, split on the device
 *                   (device-to-device copies), post_all_gather on device
 *                   tensors;
 *   reduce-scatter  per wire bucket of the gradient codec (a pass-through
 *                   codec: the grad's own bytes): pack on the device, ONE
 *                   reduce-scatter there, ONE device->host copy of this
 *                   rank's block, split into the host grad shards.
 * The comms must move memory of the compute device (lpx_comm_caps.device:
 * a device comm, e.g. NCCL's, refuses host memory), so the engine's small
 * host-side collectives (the wire descriptors at shard, the amaxes of the
 * float8 precompute) are staged through device memory as well, and hooks
 * learn the device from their lpx_fsdp_hook_ctx.
 *
 *   prefetch        (overlapped, when the comm has the host all-gather,
 *                   lpx_comm_caps.host_all_gather, and the device's
 *                   backend pinned memory, lpx_backend_i.host_alloc) the
 *                   same pack into a pinned staging block of its own, then
 *                   upload + all-gather enqueued on the comm's queue
 *                   without the compute queue waiting; the group's first
 *                   use waits device-side for that collective
 *                   (lpx_comm_wait_ticket) and rebuilds (fsdp.c,
 *                   prefetch_async and gather_finish). Blocks go in turn
 *                   and are rewritten only after a host wait
 *                   (lpx_comm_sync_ticket) for the upload that read them.
 * The staging buffer is the engine's, kept between calls and grown to the
 * largest group; it is page-locked when the backend has host_alloc, so
 * the copies run at DMA speed. Every copy that touches host memory
 * completes before it returns (the backend's copy slot waits), so the
 * buffer can be reused at once. */
#include <string.h>
#include "fsdp_internal.h"

static bool same_device(lpx_device a, lpx_device b) { return a.type == b.type && a.index == b.index; }

/* The comm must move memory of the compute device (its caps say whose:
 * lpx_comm_caps_get); *host_ag receives whether it has the overlapped
 * host all-gather. */
static lpx_status check_comm(const lpx_fsdp *f, lpx_comm *c, const char *which, bool *host_ag)
{
    const char *op = "lpx_fsdp_new";
    lpx_device d = f->cfg.compute_device;
    const char *be = lpx_comm_backend_name(c);
    lpx_comm_caps caps;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = sizeof caps;
    lpx_status st = lpx_comm_caps_get(c, &caps);
    if (st) return dt_prefix(st, "%s: the %s comm ('%s')", op, which, be ? be : "(unnamed)");
    if (caps.device.type != d.type)
        return lpx_error(LPX_EDEVICE, "%s: compute_device %d:%d runs the collectives on device memory, so the %s "
                         "comm must move memory of that device; it is a '%s' comm, which moves %s memory (device "
                         "type %d)", op, (int)d.type, (int)d.index, which, be ? be : "(unnamed)",
                         caps.device.type == LPX_DEVICE_CPU ? "host" : "another device's", (int)caps.device.type);
    if (!same_device(caps.device, d))
        return lpx_error(LPX_EDEVICE, "%s: compute_device is %d:%d but the %s comm ('%s') runs on %d:%d", op,
                         (int)d.type, (int)d.index, which, be ? be : "(unnamed)", (int)caps.device.type,
                         (int)caps.device.index);
    *host_ag = caps.host_all_gather;
    return LPX_OK;
}

lpx_status fsdp_offload_init(lpx_fsdp *f)
{
    const char *op = "lpx_fsdp_new";
    lpx_device d = f->cfg.compute_device;
    if (d.index < 0) return lpx_error(LPX_EDEVICE, "%s: compute_device %d:%d is not a device", op, (int)d.type,
                                      (int)d.index);
    if (!(f->codec.flags & LPX_GRAD_CODEC_PASSTHROUGH))
        return lpx_error(LPX_EINVAL, "%s: grad codec '%s' (fp8_grad_reduce, or another codec that encodes) is "
                         "not available with compute_device %d:%d: the grads are reduce-scattered as they are, in "
                         "device memory, by a comm that moves that memory (use a pass-through codec, '%s')", op,
                         f->codec.name, (int)d.type, (int)d.index, LPX_GRAD_CODEC_PLAIN);
    lpx_status st;
    bool ag = false, ag_rep = false;
    st = check_comm(f, f->comm, "shard", &ag);
    if (!st && f->rep) st = check_comm(f, f->rep, "replicate", &ag_rep);
    if (st) return st;
    f->dev_be = lpx_backend_for(d.type);
    if (!f->dev_be || !f->dev_be->copy)
        return lpx_error(LPX_EDEVICE, "%s: compute_device %d:%d has no backend with a copy slot (load the plugin "
                         "that serves that device type first)", op, (int)d.type, (int)d.index);
    /* the overlapped prefetch needs pinned blocks and the comm's host all-gather */
    f->pinned = f->dev_be->host_alloc && f->dev_be->host_free;
    f->overlap = f->pinned && ag;
    f->place = LPX_FSDP_OFFLOAD;
    return LPX_OK;
}

static lpx_status pinned_alloc(lpx_fsdp *f, size_t n, void **p)
{
    return f->dev_be->host_alloc(f->dev_be->self, n, p);
}

static void pinned_free(lpx_fsdp *f, void *p) { f->dev_be->host_free(f->dev_be->self, p); }

static void stage_drop(lpx_fsdp *f)
{
    if (!f->stage) return;
    if (f->stage_pinned) pinned_free(f, f->stage);
    else lpx_free(f->stage);
    if (f->stage_pinned) f->st.pinned_bytes -= f->stage_cap;
    f->stage = NULL;
    f->stage_cap = 0;
    f->stage_pinned = false;
}

/* Frees block b's memory once its last upload completed (host wait). A
 * failed comm gives no such guarantee: the block is then leaked rather
 * than freed under a copy that may still read it. */
static lpx_status block_drop(lpx_fsdp *f, fsdp_block *b)
{
    if (b->p && b->ticket) {
        lpx_status st = lpx_comm_sync_ticket(f->comm, b->ticket);
        if (st) return st;
    }
    b->ticket = 0;
    if (b->p) {
        pinned_free(f, b->p);
        f->st.pinned_bytes -= b->cap;
    }
    b->p = NULL;
    b->cap = 0;
    return LPX_OK;
}

void fsdp_offload_free(lpx_fsdp *f)
{
    for (int i = 0; i < f->nblk; i++)
        if (block_drop(f, &f->blk[i])) lpx_clear_error();
    lpx_free(f->blk);
    f->blk = NULL;
    f->nblk = 0;
    stage_drop(f);
}

lpx_status fsdp_block_get(lpx_fsdp *f, size_t n, int *out)
{
    *out = -1;
    if (!f->overlap) return LPX_OK;
    /* in turn, so that a block is reused two gathers later (its upload
     * long done) and never while its group's gather is pending */
    int pick = -1;
    if (f->nblk >= 2)
        for (int k = 0; k < f->nblk && pick < 0; k++) {
            int i = (f->blk_next + k) % f->nblk;
            if (!f->blk[i].busy) pick = i;
        }
    if (pick < 0) {
        fsdp_block *nb = lpx_realloc(f->blk, (size_t)(f->nblk + 1) * sizeof *nb);
        if (!nb) return lpx_error(LPX_ENOMEM, "sharding engine: cannot allocate a staging block");
        f->blk = nb;
        memset(&nb[f->nblk], 0, sizeof *nb);
        pick = f->nblk++;
    }
    fsdp_block *b = &f->blk[pick];
    lpx_status st;
    if (b->ticket && (st = lpx_comm_sync_ticket(f->comm, b->ticket))) return st;
    b->ticket = 0;
    if (!b->p || b->cap < n) {
        if ((st = block_drop(f, b))) return st;
        size_t cap = n ? n : 1;
        void *p = NULL;
        if (pinned_alloc(f, cap, &p) || !p) {
            lpx_clear_error(); /* no pinned memory left: the synchronous path */
            return LPX_OK;
        }
        b->p = p;
        b->cap = cap;
        f->st.pinned_bytes += cap;
    }
    f->blk_next = (pick + 1) % f->nblk;
    *out = pick;
    return LPX_OK;
}

lpx_status fsdp_gather_wait(lpx_fsdp_group *g)
{
    return g->pending ? lpx_comm_wait_ticket(g->f->comm, g->pending->ticket) : LPX_OK;
}

void fsdp_gather_drop(lpx_fsdp_group *g)
{
    fsdp_gather *pg = g->pending;
    if (!pg) return;
    if (pg->blk >= 0 && pg->blk < g->f->nblk) g->f->blk[pg->blk].busy = false;
    lpx_tensor_release(pg->drecv); /* freed on the device's queue, after the wait */
    lpx_free(pg->nin);
    lpx_free(pg->msz);
    lpx_free(pg->metas);
    lpx_free(pg);
    g->pending = NULL;
}

lpx_status fsdp_stage(lpx_fsdp *f, size_t n, unsigned char **out)
{
    *out = NULL;
    if (f->stage && n <= f->stage_cap) {
        *out = f->stage;
        return LPX_OK;
    }
    stage_drop(f);
    size_t cap = n ? n : 1;
    void *p = NULL;
    if (f->pinned && !pinned_alloc(f, cap, &p) && p) {
        f->stage_pinned = true;
        f->st.pinned_bytes += cap;
    } else {
        /* no pinned allocator, or no pinned memory left: pageable memory
         * works too, the copies are only slower */
        if (f->pinned) lpx_clear_error();
        if (!(p = lpx_malloc(cap)))
            return lpx_error(LPX_ENOMEM, "sharding engine: cannot allocate %zu bytes of host staging", cap);
    }
    f->stage = p;
    f->stage_cap = cap;
    *out = f->stage;
    return LPX_OK;
}

lpx_status fsdp_dev_bytes(lpx_fsdp *f, size_t n, bool zero, lpx_tensor **out)
{
    int64_t len = (int64_t)(n ? n : 1);
    return zero ? lpx_zeros(1, &len, fsdp_byte_dtype, f->cfg.compute_device, out)
                : lpx_tensor_new(fsdp_byte_dtype, 1, &len, f->cfg.compute_device, out);
}

static lpx_status copy(lpx_fsdp *f, void *dst, lpx_device dd, const void *src, lpx_device sd, size_t n)
{
    return f->dev_be->copy(f->dev_be->self, dst, dd, src, sd, n);
}

lpx_status fsdp_h2d(lpx_fsdp *f, void *dst, const void *src, size_t n)
{
    if (!n) return LPX_OK;
    uint64_t t0 = lpx_now_ns();
    lpx_status st = copy(f, dst, f->cfg.compute_device, src, lpx_cpu(), n);
    f->st.copy_ns += lpx_now_ns() - t0;
    if (st) return st;
    f->st.h2d_copies++;
    f->st.h2d_bytes += n;
    return LPX_OK;
}

lpx_status fsdp_d2h(lpx_fsdp *f, void *dst, const void *src, size_t n)
{
    if (!n) return LPX_OK;
    uint64_t t0 = lpx_now_ns();
    lpx_status st = copy(f, dst, lpx_cpu(), src, f->cfg.compute_device, n);
    f->st.copy_ns += lpx_now_ns() - t0;
    if (st) return st;
    f->st.d2h_copies++;
    f->st.d2h_bytes += n;
    return LPX_OK;
}

lpx_status fsdp_d2d(lpx_fsdp *f, void *dst, const void *src, size_t n)
{
    if (!n) return LPX_OK;
    return copy(f, dst, f->cfg.compute_device, src, f->cfg.compute_device, n);
}

lpx_status fsdp_all_gather_host(lpx_fsdp *f, lpx_comm *c, const void *send, void *recv, size_t nbytes)
{
    if (f->place == LPX_FSDP_HOST) return lpx_comm_all_gather_buf(c, send, recv, nbytes);
    int world = lpx_comm_size(c), rank = lpx_comm_rank(c);
    lpx_tensor *d = NULL;
    lpx_status st = fsdp_dev_bytes(f, nbytes * (size_t)world, false, &d);
    unsigned char *base = d ? lpx_tensor_data(d) : NULL, *mine = base ? base + (size_t)rank * nbytes : NULL;
    if (!st) st = fsdp_h2d(f, mine, send, nbytes);
    if (st) {
        lpx_tensor_release(d);
        return dt_abort(c, st);
    }
    /* in place: this rank's block already sits at its offset */
    st = lpx_comm_all_gather_buf(c, mine, base, nbytes);
    if (!st) st = fsdp_d2h(f, recv, base, nbytes * (size_t)world);
    lpx_tensor_release(d);
    return st;
}

lpx_status fsdp_all_reduce_host(lpx_fsdp *f, lpx_comm *c, void *buf, size_t count, lpx_dtype dtype,
                                lpx_reduce_op op)
{
    if (f->place == LPX_FSDP_HOST) return lpx_comm_all_reduce_buf(c, buf, buf, count, dtype, op);
    size_t nb = lpx_dtype_nbytes(dtype, (int64_t)count);
    lpx_tensor *d = NULL;
    lpx_status st = fsdp_dev_bytes(f, nb, false, &d);
    if (!st) st = fsdp_h2d(f, lpx_tensor_data(d), buf, nb);
    if (st) {
        lpx_tensor_release(d);
        return dt_abort(c, st);
    }
    st = lpx_comm_all_reduce_buf(c, lpx_tensor_data(d), lpx_tensor_data(d), count, dtype, op);
    if (!st) st = fsdp_d2h(f, buf, lpx_tensor_data(d), nb);
    lpx_tensor_release(d);
    return st;
}
