/* Every op on the simulated device: the fallback of its key. It moves the
 * device arguments to host copies (the bytes a view spans, the view's
 * strides kept, so in-place ops and views behave as on a device), runs
 * the op again on the host (the CPU backend's kernels: results equal the
 * CPU's bit for bit), writes back the arguments the op changed, and moves
 * the results onto the device of the first device argument. Only this
 * file and the copy slot touch device memory, and only while it is open
 * (simdev_mem.c).
 *
 * What an op writes into its device arguments is queued on the device's
 * stream (simdev_stream.c) and lands at the next use of the device or a
 * sync. Not modelled: aliasing between two device arguments of one op
 * (each gets its own host copy). */
#include <stdlib.h>
#include <string.h>
#include "simdev_internal.h"

/* the bytes a dense view reaches from its data pointer (strides >= 0) */
static size_t span_bytes(const lpx_tensor *t)
{
    int64_t n = lpx_tensor_numel(t);
    if (n == 0) return 0;
    int64_t last = 0;
    const int64_t *sh = lpx_tensor_shape(t), *st = lpx_tensor_strides(t);
    for (int d = 0; d < lpx_tensor_ndim(t); d++) last += (sh[d] - 1) * (st[d] < 0 ? -st[d] : st[d]);
    return lpx_dtype_nbytes(lpx_tensor_dtype(t), last + 1);
}

typedef struct moved {
    lpx_tensor *dev;     /* the device tensor (borrowed) */
    lpx_tensor *host;    /* its host copy (owned) */
    void *before;        /* the bytes before the op, to see what it wrote */
    size_t nbytes;
} moved;

static void free_buf(void *data, void *ctx)
{
    (void)ctx;
    free(data);
}

/* host copy of device tensor t, the same view over a copy of its span */
static lpx_status to_host(lpx_tensor *t, moved *m)
{
    sim_flush(lpx_tensor_device(t).index);   /* stream order: what earlier ops wrote lands first */
    m->dev = t;
    m->nbytes = span_bytes(t);
    void *buf = malloc(m->nbytes ? m->nbytes : 1);
    m->before = malloc(m->nbytes ? m->nbytes : 1);
    if (!buf || !m->before) {
        free(buf);
        return lpx_error(LPX_ENOMEM, "sim: out of host memory for a %zu-byte argument", m->nbytes);
    }
    const void *src = lpx_tensor_data(t);
    if (m->nbytes) {
        sim_open(src, m->nbytes);
        memcpy(buf, src, m->nbytes);
        sim_close(src, m->nbytes);
        memcpy(m->before, buf, m->nbytes);
    }
    lpx_status st = lpx_tensor_from_blob(buf, lpx_tensor_dtype(t), lpx_tensor_ndim(t), lpx_tensor_shape(t),
                                         lpx_tensor_strides(t), lpx_cpu(), free_buf, NULL, &m->host);
    if (st) {
        free(buf);
        return st;
    }
    if (lpx_tensor_is_readonly(t)) lpx_tensor_mark_readonly(m->host);
    return LPX_OK;
}

/* the op wrote into m's host copy: the same bytes into the device, queued
 * on its stream (simdev_stream.c) */
static lpx_status write_back(moved *m)
{
    void *now = lpx_tensor_data(m->host);
    if (!m->nbytes || !memcmp(now, m->before, m->nbytes)) return LPX_OK;
    return sim_enqueue_write(lpx_tensor_device(m->dev).index, lpx_tensor_data(m->dev), now, m->nbytes);
}

/* A host result on the device: a view of a device argument's host copy
 * (an in-place op returns its destination; a view op its input) is the
 * same view of the device argument, so aliasing holds as on a device;
 * anything else is copied up. */
static lpx_status device_result(lpx_tensor *t, moved *mv, int nmv, lpx_device dev, lpx_tensor **out)
{
    for (int k = 0; k < nmv; k++) {
        if (!lpx_tensor_shares_storage(t, mv[k].host) || lpx_tensor_dtype(t) != lpx_tensor_dtype(mv[k].dev)) continue;
        if (t == mv[k].host) {
            lpx_tensor_retain(mv[k].dev);
            *out = mv[k].dev;
            return LPX_OK;
        }
        return lpx_tensor_view_of(mv[k].dev, lpx_tensor_ndim(t), lpx_tensor_shape(t), lpx_tensor_strides(t),
                                  lpx_tensor_offset(mv[k].dev) + lpx_tensor_offset(t), out);
    }
    return lpx_tensor_to(t, dev, out);
}

static bool on_sim(const lpx_tensor *t)
{
    return t && !lpx_tensor_kind(t) && lpx_tensor_device(t).type == LPX_DEVICE_SIM;
}

lpx_status sim_fallback(lpx_call *c)
{
    lpx_value args[LPX_MAX_ARGS];
    moved mv[LPX_MAX_ARGS * 4];
    lpx_tensor **lists[LPX_MAX_ARGS] = {0};
    int nmv = 0, n = c->nargs;
    bool have_dev = false;
    lpx_device dev = lpx_cpu();
    lpx_status st = LPX_OK;
    if (n > LPX_MAX_ARGS) return lpx_error(LPX_EINVAL, "sim: %s: %d arguments", lpx_op_name(c->op), n);
    memcpy(args, c->args, (size_t)n * sizeof *args);
    for (int i = 0; i < n && !st; i++) {
        lpx_value *v = &args[i];
        if (v->tag == LPX_TAG_TENSOR && on_sim(v->u.t)) {
            if (!have_dev) dev = lpx_tensor_device(v->u.t), have_dev = true;
            if (nmv == (int)(sizeof mv / sizeof *mv)) {
                st = lpx_error(LPX_EINVAL, "sim: %s: too many device tensors", lpx_op_name(c->op));
                break;
            }
            if (!(st = to_host(v->u.t, &mv[nmv]))) v->u.t = mv[nmv++].host;
        } else if (v->tag == LPX_TAG_TENSORS && v->len) {
            lists[i] = calloc(v->len, sizeof *lists[i]);
            if (!lists[i]) {
                st = lpx_error(LPX_ENOMEM, "sim: out of host memory");
                break;
            }
            for (uint32_t k = 0; k < v->len && !st; k++) {
                lpx_tensor *t = v->u.ts[k];
                lists[i][k] = t;
                if (!on_sim(t)) continue;
                if (!have_dev) dev = lpx_tensor_device(t), have_dev = true;
                if (nmv == (int)(sizeof mv / sizeof *mv)) {
                    st = lpx_error(LPX_EINVAL, "sim: %s: too many device tensors", lpx_op_name(c->op));
                    break;
                }
                if (!(st = to_host(t, &mv[nmv]))) lists[i][k] = mv[nmv++].host;
            }
            v->u.ts = lists[i];
        } else if (v->tag == LPX_TAG_DEVICE && v->u.dev.type == LPX_DEVICE_SIM) {
            if (!have_dev) dev = v->u.dev, have_dev = true;
            v->u.dev = lpx_cpu();
        }
    }
    lpx_call h;
    lpx_call_init(&h, c->op, args, n);
    if (!st) st = lpx_dispatch(&h);
    if (!st) {
        atomic_fetch_add_explicit(&sim_count.kernels, 1, memory_order_relaxed);
        for (int k = 0; k < nmv && !st; k++) st = write_back(&mv[k]);
        /* results onto the device (a host result of an op on device
         * arguments is where a GPU backend would put it) */
        c->nrets = 0;
        for (int r = 0; r < h.nrets; r++) {
            c->rets[r] = h.rets[r];
            lpx_tensor *t = h.rets[r].tag == LPX_TAG_TENSOR ? h.rets[r].u.t : NULL;
            if (have_dev && t && !lpx_tensor_kind(t) && lpx_tensor_device(t).type == LPX_DEVICE_CPU && !st) {
                lpx_tensor *d = NULL;
                st = device_result(t, mv, nmv, dev, &d);
                lpx_tensor_release(t);
                c->rets[r].u.t = d;
            }
            c->nrets = r + 1;
        }
        if (st) {
            for (int r = 0; r < c->nrets; r++)
                if (c->rets[r].tag == LPX_TAG_TENSOR) lpx_tensor_release(c->rets[r].u.t);
            for (int r = c->nrets; r < h.nrets; r++)
                if (h.rets[r].tag == LPX_TAG_TENSOR) lpx_tensor_release(h.rets[r].u.t);
            c->nrets = 0;
        }
    }
    for (int k = 0; k < nmv; k++) {
        lpx_tensor_release(mv[k].host);
        free(mv[k].before);
    }
    for (int i = 0; i < n; i++) free(lists[i]);
    return st;
}
