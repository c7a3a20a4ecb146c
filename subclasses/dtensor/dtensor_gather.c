/* Gathering one tensor of any kind along dim 0: the pre_all_gather /
 * pack / all-gather / unpack / post_all_gather pipeline shared by
 * lpx_dtensor_redistribute (one tensor) and the sharding engine (a group
 * of parameters packed into one buffer).
 *
 * Shards of one tensor may put different amounts on the wire (torch.chunk
 * leaves trailing shards smaller or empty; an NF4 tail shard is padded to
 * whole scaler blocks). Each rank therefore describes its inputs in a
 * fixed-size dt_wire_desc; the ranks exchange descriptors once, size every
 * rank's slot to the largest, and unpad by the sender's descriptor. */
#include <stdarg.h>
#include <string.h>
#include "dtensor_internal.h"

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

size_t dt_wire_input_bytes(const dt_wire_desc *d, int i)
{
    int64_t n = 1;
    for (int k = 0; k < d->ndim[i]; k++) n *= d->shape[i][k];
    return align16(lpx_dtype_nbytes(d->dtype[i], n));
}

size_t dt_wire_bytes(const dt_wire_desc *d)
{
    size_t s = 0;
    for (int i = 0; i < d->ninputs; i++) s += dt_wire_input_bytes(d, i);
    return s;
}

lpx_status dt_pre_gather(const char *op, const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *n,
                         unsigned char *meta, size_t *meta_size, dt_wire_desc *desc)
{
    *n = 0;
    *meta_size = 0;
    memset(desc, 0, sizeof *desc);
    const lpx_kind *k = lpx_tensor_kind(shard);
    lpx_status st;
    if (!k) {
        if ((st = lpx_contiguous((lpx_tensor *)shard, &inputs[0]))) return st;
        *n = 1;
    } else {
        const lpx_kind_i *vt = lpx_kind_vtable(k);
        if (!vt->pre_all_gather || !vt->post_all_gather)
            return lpx_error(LPX_ENOTIMPL, "%s: kind '%s' has no all-gather hooks: it cannot be sharded", op,
                             lpx_kind_name(k));
        size_t ms = LPX_MAX_META;
        if ((st = vt->pre_all_gather(shard, ctx, inputs, n, meta, &ms))) return st;
        *meta_size = ms;
        if (*n < 1 || *n > LPX_MAX_AG_INPUTS || ms > LPX_MAX_META) {
            for (int i = 0; i < *n && i < LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(inputs[i]);
            int bad = *n;
            *n = 0;
            return lpx_error(LPX_EINTERNAL, "%s: %s pre_all_gather gave %d inputs and %zu meta bytes", op,
                             lpx_kind_name(k), bad, ms);
        }
    }
    desc->ninputs = *n;
    /* the inputs live where the shard computes: on the host, or all on one
     * device (the device-resident engine packs them device to device);
     * where they may be packed from is the caller's to check (dt_pack:
     * the host) */
    lpx_device where = *n > 0 && inputs[0] ? lpx_tensor_device(inputs[0]) : lpx_cpu();
    for (int i = 0; i < *n; i++) {
        lpx_tensor *t = inputs[i];
        lpx_device d = t ? lpx_tensor_device(t) : where;
        if (!t || lpx_tensor_kind(t) || !lpx_tensor_is_contiguous(t) || lpx_tensor_ndim(t) < 1 || d.type != where.type ||
            d.index != where.index) {
            for (int j = 0; j < *n; j++) lpx_tensor_release(inputs[j]);
            *n = 0;
            return lpx_error(LPX_EINVAL, "%s: all-gather input %d of a %s shard is not a dense contiguous tensor with "
                             "a dim 0 on the device of input 0", op, i, k ? lpx_kind_name(k) : "dense");
        }
        desc->ndim[i] = lpx_tensor_ndim(t);
        desc->dtype[i] = lpx_tensor_dtype(t);
        memcpy(desc->shape[i], lpx_tensor_shape(t), (size_t)desc->ndim[i] * sizeof(int64_t));
    }
    return LPX_OK;
}

void dt_pack(const dt_wire_desc *desc, lpx_tensor *const *inputs, unsigned char *dst)
{
    size_t off = 0;
    for (int i = 0; i < desc->ninputs; i++) {
        size_t nb = lpx_dtype_nbytes(desc->dtype[i], lpx_tensor_numel(inputs[i]));
        if (nb) memcpy(dst + off, lpx_tensor_data(inputs[i]), nb);
        off += dt_wire_input_bytes(desc, i);
    }
}

lpx_status dt_unpack(const char *op, const unsigned char *recv, size_t stride, size_t offset,
                     const dt_wire_desc *descs, int world, lpx_tensor **outputs)
{
    return dt_unpack_on(op, recv, stride, offset, descs, world, lpx_cpu(), outputs);
}

lpx_status dt_unpack_on(const char *op, const unsigned char *recv, size_t stride, size_t offset,
                        const dt_wire_desc *descs, int world, lpx_device dev, lpx_tensor **outputs)
{
    /* host memory: memcpy; a device: its backend's copy (device to device,
     * queued on the device's stream, so no host round trip) */
    const lpx_backend_i *be = NULL;
    if (dev.type != LPX_DEVICE_CPU) {
        be = lpx_backend_for(dev.type);
        if (!be || !be->copy)
            return lpx_error(LPX_EDEVICE, "%s: no backend copies on device type %d", op, (int)dev.type);
    }
    const dt_wire_desc *d0 = &descs[0];
    for (int r = 1; r < world; r++) {
        const dt_wire_desc *d = &descs[r];
        if (d->ninputs != d0->ninputs) goto mismatch;
        for (int i = 0; i < d0->ninputs; i++) {
            if (d->dtype[i] != d0->dtype[i] || d->ndim[i] != d0->ndim[i]) goto mismatch;
            for (int k = 1; k < d0->ndim[i]; k++)
                if (d->shape[i][k] != d0->shape[i][k]) goto mismatch;
        }
    }
    for (int i = 0; i < d0->ninputs; i++) {
        int64_t shape[LPX_MAX_DIMS];
        memcpy(shape, d0->shape[i], sizeof shape);
        shape[0] = 0;
        for (int r = 0; r < world; r++) shape[0] += descs[r].shape[i][0];
        lpx_tensor *o = outputs[i];
        bool reuse = o && lpx_tensor_dtype(o) == d0->dtype[i] && lpx_tensor_ndim(o) == d0->ndim[i] &&
                     lpx_tensor_is_contiguous(o) && lpx_tensor_device(o).type == dev.type &&
                     lpx_tensor_device(o).index == dev.index &&
                     !memcmp(lpx_tensor_shape(o), shape, (size_t)d0->ndim[i] * sizeof(int64_t));
        if (!reuse) {
            lpx_tensor_release(o);
            outputs[i] = NULL;
            lpx_status st = lpx_tensor_new(d0->dtype[i], d0->ndim[i], shape, dev, &outputs[i]);
            if (st) return st;
        }
        unsigned char *dst = lpx_tensor_data(outputs[i]);
        for (int r = 0; r < world; r++) {
            size_t in_off = 0;
            for (int j = 0; j < i; j++) in_off += dt_wire_input_bytes(&descs[r], j);
            int64_t n = 1;
            for (int k = 0; k < descs[r].ndim[i]; k++) n *= descs[r].shape[i][k];
            size_t nb = lpx_dtype_nbytes(d0->dtype[i], n);
            const unsigned char *src = recv + (size_t)r * stride + offset + in_off;
            if (nb && !be) memcpy(dst, src, nb);
            if (nb && be) {
                lpx_status st = be->copy(be->self, dst, dev, src, dev, nb);
                if (st) return st;
            }
            dst += nb;
        }
    }
    return LPX_OK;
mismatch:
    return lpx_error(LPX_EINVAL, "%s: ranks put different input lists on the wire (count, dtype or trailing dims "
                     "differ): the shards are not pieces of one tensor", op);
}

lpx_status dt_post_gather(const char *op, const lpx_kind *kind, lpx_tensor *const *outputs, int n,
                          const unsigned char *meta, size_t meta_size, lpx_dtype dtype, lpx_tensor *prev,
                          lpx_tensor **result)
{
    *result = NULL;
    if (!kind) {
        if (n != 1) return lpx_error(LPX_EINTERNAL, "%s: a dense shard gathered %d inputs", op, n);
        if (prev && !lpx_tensor_shares_storage(prev, outputs[0])) {
            lpx_status st = lpx_copy_(prev, outputs[0]);
            if (st) return st;
            lpx_tensor_retain(prev);
            *result = prev;
            return LPX_OK;
        }
        lpx_tensor_retain(outputs[0]);
        *result = outputs[0];
        return LPX_OK;
    }
    return lpx_kind_vtable(kind)->post_all_gather(kind, outputs, n, meta, meta_size, dtype, prev, result);
}

/* Aborts comm with this thread's current message so that peers waiting in
 * a collective this rank will not reach fail at once instead of timing
 * out; keeps the message. */
lpx_status dt_abort(lpx_comm *comm, lpx_status st)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    lpx_comm_abort(comm, msg);
    return lpx_error(st, "%s", msg);
}

lpx_status dt_gather_dim0(const char *op, lpx_comm *comm, const lpx_tensor *shard, lpx_tensor **out)
{
    *out = NULL;
    int world = lpx_comm_size(comm);
    lpx_tensor *inputs[LPX_MAX_AG_INPUTS] = {0}, *outputs[LPX_MAX_AG_INPUTS] = {0};
    unsigned char meta[LPX_MAX_META];
    size_t meta_size = 0;
    int n = 0;
    dt_wire_desc mine, *descs = NULL;
    unsigned char *send = NULL, *recv = NULL;
    /* hooks that need a collective of their own (a wrapper without an agreed
     * precomputed scale) find the comm here */
    lpx_fsdp_hook_ctx hctx = {sizeof hctx, comm, 0, lpx_cpu()};
    lpx_status st = dt_pre_gather(op, shard, &hctx, inputs, &n, meta, &meta_size, &mine);
    if (st) return dt_abort(comm, st);
    for (int i = 0; i < n; i++)
        if (lpx_tensor_device(inputs[i]).type != LPX_DEVICE_CPU) {
            /* this path packs on the host (the sharding engine has the
             * device-resident one) */
            st = dt_abort(comm, lpx_error(LPX_EDEVICE, "%s: the %s shard's all-gather input %d is on device %d:%d; "
                                          "redistribute moves host shards (move the local tensor to the CPU first)",
                                          op, lpx_tensor_kind(shard) ? lpx_kind_name(lpx_tensor_kind(shard)) : "dense",
                                          i, (int)lpx_tensor_device(inputs[i]).type,
                                          (int)lpx_tensor_device(inputs[i]).index));
            for (int j = 0; j < n; j++) lpx_tensor_release(inputs[j]);
            return st;
        }
    descs = lpx_malloc((size_t)world * sizeof *descs);
    if (!descs) {
        st = dt_abort(comm, lpx_error(LPX_ENOMEM, "%s: cannot allocate %d wire descriptors", op, world));
        goto done;
    }
    if ((st = lpx_comm_all_gather_buf(comm, &mine, descs, sizeof mine))) goto done;
    size_t slot = 16;
    for (int r = 0; r < world; r++) slot = dt_wire_bytes(&descs[r]) > slot ? dt_wire_bytes(&descs[r]) : slot;
    send = lpx_calloc(1, slot);
    recv = lpx_malloc(slot * (size_t)world);
    if (!send || !recv) {
        st = dt_abort(comm, lpx_error(LPX_ENOMEM, "%s: cannot allocate %zu wire bytes", op, slot * (size_t)world));
        goto done;
    }
    dt_pack(&mine, inputs, send);
    if ((st = lpx_comm_all_gather_buf(comm, send, recv, slot))) goto done;
    if ((st = dt_unpack(op, recv, slot, 0, descs, world, outputs))) goto done;
    st = dt_post_gather(op, lpx_tensor_kind(shard), outputs, n, meta, meta_size, lpx_tensor_dtype(shard), NULL, out);
done:
    for (int i = 0; i < LPX_MAX_AG_INPUTS; i++) {
        lpx_tensor_release(inputs[i]);
        lpx_tensor_release(outputs[i]);
    }
    lpx_free(descs);
    lpx_free(send);
    lpx_free(recv);
    return st;
}

lpx_status dt_prefix(lpx_status st, const char *fmt, ...)
{
    char msg[512], pre[256];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    return lpx_error(st, "%s: %s", pre, msg);
}
