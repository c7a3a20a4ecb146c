/* Gradient reduce-scatter of a group.
 *
 * Grads of one dtype are packed into one buffer: rank q's block holds, for
 * each param of that dtype in group order, rows [start_q, start_q + len_q)
 * of its grad padded with zeros to `chunk` rows (torch.chunk shards, the
 * same ones the params use). ONE reduce-scatter(avg) per dtype gives each
 * rank its block; each param's local grad is the first len rows of its
 * piece. On a 2-D mesh the result is then averaged over the replicate
 * group (hybrid sharding).
 *
 * fp8 mode (FP8-LM / MS-AMP, docs/SHARDING.md): the local amax of every grad of
 * the group, ONE all-reduce(MAX) for the global amax, a shared scale
 * s = fp8_max / (amax * N) so that a sum of N values cannot overflow;
 * every grad is encoded to fp8 with s and reduced with SUM; the result is
 * multiplied by 1 / (s * N) = amax / fp8_max once: the 1/N of averaging
 * lives in the scale, not in a pass over the data. The fp8 codes go on the
 * wire as they are (1 byte per element): the comm layer's fp8 reduction
 * decodes every rank's codes exactly, sums them in f32 in rank order and
 * encodes the sum once to fp8 (RNE, saturating; with this scale the sum
 * never reaches fp8_max, so it never saturates). On a 2-D mesh the amax
 * is also MAX-reduced over the replicate comm, so every rank of the mesh
 * uses one scale, and the replica average runs on the fp8 codes too (a
 * second rounding, on the slow inter-replica link's 1 byte). */
#include <math.h>
#include <string.h>
#include "fsdp_internal.h"

lpx_status lpx_fsdp_set_grad(lpx_fsdp_group *g, int i, lpx_tensor *grad)
{
    const char *op = "lpx_fsdp_set_grad";
    if (!g || !grad || i < 0 || i >= g->n) return lpx_error(LPX_EINVAL, "%s: NULL argument or index %d", op, i);
    fsdp_param *p = &g->p[i];
    if (p->flags & LPX_FSDP_FROZEN) return lpx_error(LPX_EINVAL, "%s: param '%s' is frozen", op, p->name);
    lpx_dtype d = lpx_tensor_dtype(grad);
    if (lpx_tensor_kind(grad) || (d != LPX_F32 && d != LPX_BF16 && d != LPX_F16))
        return lpx_error(LPX_EDTYPE, "%s: grad of '%s' must be dense f32, bf16 or f16", op, p->name);
    if (lpx_tensor_ndim(grad) != p->ndim ||
        memcmp(lpx_tensor_shape(grad), p->shape, (size_t)p->ndim * sizeof(int64_t)))
        return lpx_error(LPX_ESHAPE, "%s: grad of '%s' does not have the parameter's full shape", op, p->name);
    lpx_device gd = lpx_tensor_device(grad), want = g->f->cfg.compute_device;
    if (gd.type != want.type || gd.index != want.index)
        return lpx_error(LPX_EDEVICE, "%s: grad of '%s' is on device %d:%d; this engine takes grads on its compute "
                         "device %d:%d (lpx_fsdp_config.compute_device)", op, p->name, (int)gd.type, (int)gd.index,
                         (int)want.type, (int)want.index);
    lpx_tensor *c = NULL;
    lpx_status st = lpx_contiguous(grad, &c);
    if (st) return st;
    lpx_tensor_release(p->grad_full);
    p->grad_full = c;
    return LPX_OK;
}

lpx_tensor *lpx_fsdp_param_grad(const lpx_fsdp_group *g, int i)
{
    return g && i >= 0 && i < g->n ? g->p[i].grad : NULL;
}

/* Packs rows of every grad of dtype d (wire dtype w, f32 staging through
 * `conv` when w != d or scale != 1) into send; returns block elements. */
static lpx_status pack(lpx_fsdp_group *g, lpx_dtype d, lpx_dtype w, float scale, lpx_dtype fp8, unsigned char *send,
                       int64_t block)
{
    lpx_fsdp *f = g->f;
    size_t es = lpx_dtype_nbytes(w, 1);
    int64_t at = 0;
    float *tmp = NULL;
    for (int i = 0; i < g->n; i++) {
        fsdp_param *p = &g->p[i];
        if (!p->grad_full || (d >= 0 && lpx_tensor_dtype(p->grad_full) != d)) continue;
        int64_t row = fsdp_row_elems(p);
        for (int q = 0; q < f->world; q++) {
            int64_t c, s, l;
            lpx_shard_range(p->shape[0], f->world, q, p->unit, &c, &s, &l);
            unsigned char *dst = send + ((size_t)q * (size_t)block + (size_t)at) * es;
            const unsigned char *src = (const unsigned char *)lpx_tensor_data(p->grad_full) +
                                       lpx_dtype_nbytes(lpx_tensor_dtype(p->grad_full), s * row);
            size_t n = (size_t)(l * row);
            if (!n) continue;
            if (fp8 < 0) { /* plain mode: the wire dtype is the grad's */
                memcpy(dst, src, n * es);
                continue;
            }
            /* fp8 mode: x * s -> fp8 (saturating), straight onto the wire */
            float *t2 = lpx_realloc(tmp, n * sizeof *t2);
            if (!t2) {
                lpx_free(tmp);
                return lpx_error(LPX_ENOMEM, "lpx_fsdp_reduce_scatter_grads: out of memory");
            }
            tmp = t2;
            fsdp_to_f32(lpx_tensor_dtype(p->grad_full), src, tmp, n);
            for (size_t k = 0; k < n; k++) tmp[k] *= scale;
            lpx_convert(dst, fp8, tmp, LPX_F32, n, LPX_CONVERT_SATURATE);
        }
        at += p->chunk * row;
    }
    lpx_free(tmp);
    return LPX_OK;
}

/* Local grad shards from this rank's reduced block (f32 in fp8 mode):
 * host tensors, or with on_dev (a device-resident engine, plain mode)
 * tensors on the compute device copied device to device from recv. */
static lpx_status unpack(lpx_fsdp_group *g, lpx_dtype d, lpx_dtype w, float unscale, const unsigned char *recv,
                         bool on_dev)
{
    lpx_fsdp *f = g->f;
    size_t es = lpx_dtype_nbytes(w, 1);
    int64_t at = 0;
    for (int i = 0; i < g->n; i++) {
        fsdp_param *p = &g->p[i];
        if (!p->grad_full || (d >= 0 && lpx_tensor_dtype(p->grad_full) != d)) continue;
        int64_t row = fsdp_row_elems(p), shape[LPX_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        shape[0] = p->len;
        lpx_dtype od = d < 0 ? LPX_F32 : w;
        lpx_tensor *t = NULL;
        lpx_status st = lpx_tensor_new(od, p->ndim, shape, on_dev ? f->cfg.compute_device : lpx_cpu(), &t);
        if (st) return st;
        size_t n = (size_t)(p->len * row);
        if (on_dev) {
            if ((st = fsdp_d2d(f, lpx_tensor_data(t), recv + (size_t)at * es, n * es))) {
                lpx_tensor_release(t);
                return st;
            }
        } else if (od == w) {
            if (n) memcpy(lpx_tensor_data(t), recv + (size_t)at * es, n * es);
        } else {
            float *o = lpx_tensor_data(t);
            fsdp_to_f32(w, recv + (size_t)at * es, o, n);
            for (size_t k = 0; k < n; k++) o[k] *= unscale;
        }
        lpx_tensor_release(p->grad);
        p->grad = t;
        lpx_tensor_release(p->grad_full);
        p->grad_full = NULL;
        at += p->chunk * row;
    }
    return LPX_OK;
}

/* Offload: rows of every grad of dtype d (on the device) into the device
 * send buffer, the same layout as pack's plain mode, device to device. */
static lpx_status pack_dev(lpx_fsdp_group *g, lpx_dtype d, unsigned char *send, int64_t block)
{
    lpx_fsdp *f = g->f;
    size_t es = lpx_dtype_nbytes(d, 1);
    int64_t at = 0;
    for (int i = 0; i < g->n; i++) {
        fsdp_param *p = &g->p[i];
        if (!p->grad_full || lpx_tensor_dtype(p->grad_full) != d) continue;
        int64_t row = fsdp_row_elems(p);
        for (int q = 0; q < f->world; q++) {
            int64_t c, s, l;
            lpx_shard_range(p->shape[0], f->world, q, p->unit, &c, &s, &l);
            unsigned char *dst = send + ((size_t)q * (size_t)block + (size_t)at) * es;
            const unsigned char *src = (const unsigned char *)lpx_tensor_data(p->grad_full) + lpx_dtype_nbytes(d, s * row);
            lpx_status st = fsdp_d2d(f, dst, src, (size_t)(l * row) * es);
            if (st) return st;
        }
        at += p->chunk * row;
    }
    return LPX_OK;
}

/* Offload: the reduce-scatter of dtype d on the device (zero padding, one
 * collective, the replicate average on a 2-D mesh), ONE copy of this
 * rank's block to the host staging buffer, then unpack into the host grad
 * shards as without offload; device-resident: split on the device. */
static lpx_status rs_dtype_dev(lpx_fsdp_group *g, lpx_dtype d, int64_t block)
{
    lpx_fsdp *f = g->f;
    size_t es = lpx_dtype_nbytes(d, 1), rb = (size_t)block * es;
    lpx_tensor *send = NULL, *recv = NULL;
    unsigned char *host = NULL;
    lpx_status st = fsdp_dev_bytes(f, rb * (size_t)f->world, true, &send);
    if (!st) st = fsdp_dev_bytes(f, rb, false, &recv);
    if (!st && !f->resident) st = fsdp_stage(f, rb, &host);
    if (!st) st = pack_dev(g, d, lpx_tensor_data(send), block);
    if (st) st = dt_abort(f->comm, st);
    if (!st)
        st = lpx_comm_reduce_scatter_buf(f->comm, lpx_tensor_data(send), lpx_tensor_data(recv), (size_t)block, d,
                                         LPX_REDUCE_AVG);
    if (!st && f->rep)
        st = lpx_comm_all_reduce_buf(f->rep, lpx_tensor_data(recv), lpx_tensor_data(recv), (size_t)block, d,
                                     LPX_REDUCE_AVG);
    lpx_tensor_release(send);
    if (f->resident) {
        /* the shards stay on the device: no copy to the host */
        if (!st) st = unpack(g, d, d, 1.0f, lpx_tensor_data(recv), true);
        lpx_tensor_release(recv);
        return st;
    }
    if (!st) st = fsdp_d2h(f, host, lpx_tensor_data(recv), rb);
    lpx_tensor_release(recv);
    if (!st) st = unpack(g, d, d, 1.0f, host, false);
    return st;
}

/* One reduce-scatter of every grad of dtype d (-1: all grads, fp8 mode). */
static lpx_status rs_dtype(lpx_fsdp_group *g, lpx_dtype d, lpx_dtype w, float scale, float unscale, lpx_reduce_op rop)
{
    lpx_fsdp *f = g->f;
    int64_t block = 0;
    for (int i = 0; i < g->n; i++)
        if (g->p[i].grad_full && (d < 0 || lpx_tensor_dtype(g->p[i].grad_full) == d))
            block += g->p[i].chunk * fsdp_row_elems(&g->p[i]);
    if (f->offload) return rs_dtype_dev(g, d, block); /* plain mode only: fp8 is refused at lpx_fsdp_new */
    size_t es = lpx_dtype_nbytes(w, 1);
    unsigned char *send = lpx_calloc((size_t)(block * f->world) + 1, es);
    unsigned char *recv = lpx_malloc(((size_t)block + 1) * es);
    lpx_status st;
    if (!send || !recv) st = dt_abort(f->comm, lpx_error(LPX_ENOMEM, "lpx_fsdp_reduce_scatter_grads: out of memory"));
    else if ((st = pack(g, d, w, scale, d < 0 ? f->cfg.fp8_grad_dtype : -1, send, block))) st = dt_abort(f->comm, st);
    if (!st) st = lpx_comm_reduce_scatter_buf(f->comm, send, recv, (size_t)block, w, rop);
    if (!st && f->rep) st = lpx_comm_all_reduce_buf(f->rep, recv, recv, (size_t)block, w, LPX_REDUCE_AVG);
    if (!st) st = unpack(g, d, w, unscale, recv, false);
    lpx_free(send);
    lpx_free(recv);
    return st;
}

/* fp8 mode: the shared scale from the global amax of all grads of g. */
static lpx_status fp8_scale(lpx_fsdp_group *g, float *scale, float *unscale)
{
    lpx_fsdp *f = g->f;
    float amax = 0.0f;
    for (int i = 0; i < g->n; i++) {
        lpx_tensor *t = g->p[i].grad_full;
        if (!t || !lpx_tensor_numel(t)) continue;
        lpx_tensor *a = NULL;
        double v;
        lpx_status st = lpx_amax(t, 0, NULL, false, &a);
        if (!st) st = lpx_item(a, 0, &v);
        lpx_tensor_release(a);
        if (st) return dt_abort(f->comm, st);
        if (!(v <= 3.4e38)) return dt_abort(f->comm, lpx_error(LPX_ENUMERIC, "lpx_fsdp_reduce_scatter_grads: grad "
                                                               "of '%s' holds NaN or inf", g->p[i].name));
        if ((float)v > amax) amax = (float)v;
    }
    lpx_status st = lpx_comm_all_reduce_buf(f->comm, &amax, &amax, 1, LPX_F32, LPX_REDUCE_MAX);
    if (st) return st;
    f->st.amax_allreduces++;
    /* hybrid: the replicas average codes too, so they must share the scale */
    if (f->rep) {
        if ((st = lpx_comm_all_reduce_buf(f->rep, &amax, &amax, 1, LPX_F32, LPX_REDUCE_MAX))) return st;
        f->st.amax_allreduces++;
    }
    double fmax = lpx_dtype_get(f->cfg.fp8_grad_dtype)->max;
    double a = amax > 1e-30f ? amax : 1e-30;
    *scale = (float)(fmax / (a * f->world));
    *unscale = (float)(1.0 / ((double)*scale * f->world));
    return LPX_OK;
}

lpx_status lpx_fsdp_reduce_scatter_grads(lpx_fsdp_group *g)
{
    const char *op = "lpx_fsdp_reduce_scatter_grads";
    if (!g) return lpx_error(LPX_EINVAL, "%s: g is NULL", op);
    lpx_fsdp *f = g->f;
    if (!f->sharded) return lpx_error(LPX_EINVAL, "%s(%s): call lpx_fsdp_shard first", op, g->name);
    /* the same check on every rank: an argument error needs no abort */
    for (int i = 0; i < g->n; i++)
        if (!(g->p[i].flags & LPX_FSDP_FROZEN) && !g->p[i].grad_full)
            return lpx_error(LPX_EINVAL, "%s(%s): param '%s' has no grad (lpx_fsdp_set_grad)", op, g->name,
                             g->p[i].name);
    fsdp_snap snap;
    fsdp_snap_begin(f, &snap);
    lpx_status st = LPX_OK;
    if (f->cfg.fp8_grad_reduce) {
        float s = 1, u = 1;
        if (!(st = fp8_scale(g, &s, &u))) st = rs_dtype(g, -1, f->cfg.fp8_grad_dtype, s, u, LPX_REDUCE_SUM);
    } else {
        static const lpx_dtype order[] = {LPX_F32, LPX_BF16, LPX_F16};
        for (int k = 0; k < 3 && !st; k++) {
            bool any = false;
            for (int i = 0; i < g->n; i++) any |= g->p[i].grad_full && lpx_tensor_dtype(g->p[i].grad_full) == order[k];
            if (any) st = rs_dtype(g, order[k], order[k], 1.0f, 1.0f, LPX_REDUCE_AVG);
        }
    }
    fsdp_snap_end(f, &snap);
    return st;
}
