/* The device-resident engine: cfg.compute_device a CUDA device and every
 * param handed to lpx_fsdp_param_add already on that device.
 *
 * What lives where: everything on the device. The local shards (cut from
 * the device params), the unsharded params, the grad shards and the AdamW
 * moments; the host holds only the wire descriptors. Per step and group
 * (docs/SHARDING.md, "Device-resident"):
 *   unshard         pre_all_gather on the device shards, pack device to
 *                   device into this rank's block of the receive buffer,
 *                   ONE in-place all-gather, split on the device,
 *                   post_all_gather (as the offload path from there on)
 *   reduce-scatter  per grad dtype: pack on the device, ONE
 *                   reduce-scatter, split into device grad shards
 *   adamw           lpx_adamw_ on the device (one launch per param; the
 *                   arithmetic of the host loop, bit for bit)
 * No host<->device copy happens in a step. The small host-side
 * collectives (wire descriptors, amaxes) are staged as in offload mode.
 * The choice is made at lpx_fsdp_shard from where the params are: all on
 * the host (offload, or the CPU engine) or all on the compute device. */
#include <string.h>
#include "fsdp_internal.h"

static bool same_device(lpx_device a, lpx_device b) { return a.type == b.type && a.index == b.index; }

lpx_status fsdp_resident_check(lpx_fsdp *f)
{
    const char *op = "lpx_fsdp_shard";
    lpx_device cd = f->cfg.compute_device;
    int on_dev = 0, on_host = 0;
    const fsdp_param *first_dev = NULL, *first_host = NULL;
    for (int gi = 0; gi < f->ng; gi++)
        for (int i = 0; i < f->g[gi]->n; i++) {
            const fsdp_param *p = &f->g[gi]->p[i];
            lpx_device d = lpx_tensor_device(p->full_in);
            if (d.type == LPX_DEVICE_CPU) {
                on_host++;
                if (!first_host) first_host = p;
            } else if (cd.type != LPX_DEVICE_CPU && same_device(d, cd)) {
                on_dev++;
                if (!first_dev) first_dev = p;
            } else {
                return lpx_error(LPX_EDEVICE, "%s: param '%s' lives on device %d:%d; this engine computes on %d:%d "
                                 "(lpx_fsdp_config.compute_device): hand params in on the host or on that device",
                                 op, p->name, (int)d.type, (int)d.index, (int)cd.type, (int)cd.index);
            }
        }
    if (on_dev && on_host)
        return lpx_error(LPX_EDEVICE, "%s: param '%s' is on the compute device %d:%d but '%s' on the host: the "
                         "engine keeps all shards in one place (all on the device, or all on the host to offload)",
                         op, first_dev->name, (int)cd.type, (int)cd.index, first_host->name);
    if (on_dev) f->place = LPX_FSDP_RESIDENT;   /* (a pass-through grad codec: checked at lpx_fsdp_new) */
    return LPX_OK;
}

lpx_status fsdp_pack_dev(lpx_fsdp *f, const dt_wire_desc *d, lpx_tensor *const *inputs, unsigned char *dst)
{
    size_t off = 0;
    for (int i = 0; i < d->ninputs; i++) {
        lpx_tensor *t = inputs[i];
        size_t nb = lpx_dtype_nbytes(d->dtype[i], lpx_tensor_numel(t));
        if (nb) {
            if (!same_device(lpx_tensor_device(t), f->cfg.compute_device) || !lpx_tensor_is_contiguous(t))
                return lpx_error(LPX_EDEVICE, "lpx_fsdp_unshard: wire input %d of a device-resident param is not a "
                                 "contiguous tensor on the compute device (its kind's pre_all_gather made it on "
                                 "device %d:%d)", i, (int)lpx_tensor_device(t).type, (int)lpx_tensor_device(t).index);
            lpx_status st = fsdp_d2d(f, dst + off, lpx_tensor_data(t), nb);
            if (st) return st;
        }
        off += dt_wire_input_bytes(d, i);
    }
    return LPX_OK;
}

lpx_status fsdp_adamw_dev(fsdp_param *p, lpx_tensor *w, const lpx_adamw_opts *o)
{
    const char *op = "lpx_fsdp_adamw_step";
    if (!same_device(lpx_tensor_device(p->grad), lpx_tensor_device(w)))
        return lpx_error(LPX_EDEVICE, "%s: the grad shard of '%s' is not on its weight's device", op, p->name);
    if (!p->mt) {
        lpx_status st = lpx_zeros(lpx_tensor_ndim(w), lpx_tensor_shape(w), fsdp_math_dtype, lpx_tensor_device(w), &p->mt);
        if (!st) st = lpx_zeros(lpx_tensor_ndim(w), lpx_tensor_shape(w), fsdp_math_dtype, lpx_tensor_device(w), &p->vt);
        if (st) {
            lpx_tensor_release(p->mt);
            p->mt = NULL;
            return dt_prefix(st, "%s: optimizer state of '%s'", op, p->name);
        }
    }
    /* the grad shard may have another shape than w (a kind's master): the
     * same elements in the same order, viewed as w */
    lpx_tensor *g = NULL;
    int64_t n = lpx_tensor_numel(w);
    lpx_status st = lpx_view(p->grad, lpx_tensor_ndim(w), lpx_tensor_shape(w), &g);
    if (st) return dt_prefix(st, "%s: grad of '%s' (%lld elements)", op, p->name, (long long)n);
    lpx_tensor *ws[1] = {w}, *gs[1] = {g}, *ms[1] = {p->mt}, *vs[1] = {p->vt};
    st = lpx_adamw_(ws, gs, ms, vs, 1, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, p->step + 1);
    lpx_tensor_release(g);
    if (st) return dt_prefix(st, "%s: param '%s'", op, p->name);
    p->step++;
    return LPX_OK;
}
