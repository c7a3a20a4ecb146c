/* Gradient reduce-scatter of a group, through the engine's gradient codec
 * (include/lpx/fsdp.h, "gradient codecs"; the built-ins in grad_codec.c).
 *
 * The codec puts each grad's dtype in a bucket with a wire format. Grads
 * of one bucket are packed into one buffer: rank q's block holds, for
 * each param of the bucket in group order, rows [start_q, start_q + len_q)
 * of its grad encoded to the wire dtype and padded with zeros to `chunk`
 * rows (torch.chunk shards, the same ones the params use). ONE
 * reduce-scatter per bucket (the codec's reduction) gives each rank its
 * block; each param's local grad is the decode of the first len rows of
 * its piece. On a 2-D mesh the result is then averaged over the
 * replicate group (hybrid sharding) on the wire, before the decode.
 *
 * "plain" puts each grad dtype in its own bucket as it is (avg); "fp8lm"
 * (FP8-LM) agrees one scale in its prepare and sends fp8 codes (sum). On
 * a compute device the engine takes pass-through codecs only and moves
 * the bytes in device memory (rs_bucket_dev). */
#include <string.h>
#include "fsdp_internal.h"

lpx_status fsdp_codec_init(lpx_fsdp *f)
{
    const char *op = "lpx_fsdp_new";
    const char *name = f->cfg.grad_codec;
    if (!name || !*name) name = f->cfg.fp8_grad_reduce ? LPX_GRAD_CODEC_FP8LM : LPX_GRAD_CODEC_PLAIN;
    else if (f->cfg.fp8_grad_reduce && strcmp(name, LPX_GRAD_CODEC_FP8LM))
        return lpx_error(LPX_EINVAL, "%s: fp8_grad_reduce selects grad codec '%s' but grad_codec is '%s'", op,
                         LPX_GRAD_CODEC_FP8LM, name);
    const lpx_grad_codec_i *c = NULL;
    lpx_status st = lpx_grad_codec_find(name, &c);
    if (st) return dt_prefix(st, "%s", op);
    memset(&f->codec, 0, sizeof f->codec);
    memcpy(&f->codec, c, c->struct_size < sizeof f->codec ? c->struct_size : sizeof f->codec);
    snprintf(f->codec_name, sizeof f->codec_name, "%s", c->name);
    f->codec.name = f->codec_name;
    f->cfg.grad_codec = f->codec_name;
    f->codec_state = NULL;
    if (f->codec.configure && (st = f->codec.configure(&f->codec, &f->cfg, &f->codec_state)))
        return dt_prefix(st, "%s: grad codec '%s'", op, f->codec_name);
    return LPX_OK;
}

void fsdp_codec_free(lpx_fsdp *f)
{
    if (f->codec.release && f->codec_state) f->codec.release(&f->codec, f->codec_state);
    f->codec_state = NULL;
}

/* The codec's wire format of grad dtype d, checked. */
static lpx_status grad_wire(lpx_fsdp *f, lpx_dtype d, lpx_grad_wire *w)
{
    memset(w, 0, sizeof *w);
    w->struct_size = sizeof *w;
    lpx_status st = f->codec.wire(&f->codec, f->codec_state, d, w);
    if (st) return st;
    if (w->bucket < 0) return lpx_error(LPX_EINVAL, "codec '%s' gave bucket %d (>= 0)", f->codec.name, w->bucket);
    if ((f->codec.flags & LPX_GRAD_CODEC_PASSTHROUGH) && (w->wire != d || w->out != d))
        return lpx_error(LPX_EINVAL, "pass-through codec '%s' puts %s grads on the wire as %s (out %s)", f->codec.name,
                         lpx_dtype_name(d), lpx_dtype_name(w->wire), lpx_dtype_name(w->out));
    return LPX_OK;
}

lpx_status lpx_fsdp_set_grad(lpx_fsdp_group *g, int i, lpx_tensor *grad)
{
    const char *op = "lpx_fsdp_set_grad";
    if (!g || !grad || i < 0 || i >= g->n) return lpx_error(LPX_EINVAL, "%s: NULL argument or index %d", op, i);
    fsdp_param *p = &g->p[i];
    if (p->flags & LPX_FSDP_FROZEN) return lpx_error(LPX_EINVAL, "%s: param '%s' is frozen", op, p->name);
    if (lpx_tensor_kind(grad))
        return lpx_error(LPX_EDTYPE, "%s: grad of '%s' must be a dense tensor, not a '%s' tensor", op, p->name,
                         lpx_kind_name(lpx_tensor_kind(grad)));
    lpx_grad_wire w;
    if (grad_wire(g->f, lpx_tensor_dtype(grad), &w))
        return dt_prefix(LPX_EDTYPE, "%s: grad of '%s' (%s)", op, p->name, lpx_dtype_name(lpx_tensor_dtype(grad)));
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

/* One bucket of a group's reduce-scatter: sel[i] says whether param i's
 * grad is in it; block is the elements of one rank's block. */
typedef struct rs_bucket_t {
    const bool *sel;
    lpx_grad_wire w;
    int64_t block;
} rs_bucket_t;

/* Encodes the rows of every grad of the bucket into send (host). */
static lpx_status pack(lpx_fsdp_group *g, const rs_bucket_t *b, const lpx_grad_codec_ctx *ctx, unsigned char *send)
{
    lpx_fsdp *f = g->f;
    size_t es = lpx_dtype_nbytes(b->w.wire, 1);
    int64_t at = 0;
    for (int i = 0; i < g->n; i++) {
        fsdp_param *p = &g->p[i];
        if (!b->sel[i]) continue;
        int64_t row = fsdp_row_elems(p);
        lpx_dtype gd = lpx_tensor_dtype(p->grad_full);
        for (int q = 0; q < f->world; q++) {
            int64_t c, s, l;
            lpx_shard_range(p->shape[0], f->world, q, p->unit, &c, &s, &l);
            unsigned char *dst = send + ((size_t)q * (size_t)b->block + (size_t)at) * es;
            const unsigned char *src = (const unsigned char *)lpx_tensor_data(p->grad_full) + lpx_dtype_nbytes(gd, s * row);
            size_t n = (size_t)(l * row);
            if (!n) continue;
            if (!f->codec.encode) { /* pass-through: the grad's bytes */
                memcpy(dst, src, n * es);
                continue;
            }
            lpx_status st = f->codec.encode(&f->codec, f->codec_state, ctx, src, gd, dst, n);
            if (st) return dt_prefix(st, "grad codec '%s': encode of '%s'", f->codec.name, p->name);
        }
        at += p->chunk * row;
    }
    return LPX_OK;
}

/* Local grad shards (dtype w.out) from this rank's reduced block: host
 * tensors decoded from recv, or with on_dev (a device-resident engine,
 * pass-through) tensors on the compute device copied from recv there. */
static lpx_status unpack(lpx_fsdp_group *g, const rs_bucket_t *b, const lpx_grad_codec_ctx *ctx,
                         const unsigned char *recv, bool on_dev)
{
    lpx_fsdp *f = g->f;
    size_t es = lpx_dtype_nbytes(b->w.wire, 1);
    int64_t at = 0;
    for (int i = 0; i < g->n; i++) {
        fsdp_param *p = &g->p[i];
        if (!b->sel[i]) continue;
        int64_t row = fsdp_row_elems(p), shape[LPX_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        shape[0] = p->len;
        lpx_tensor *t = NULL;
        lpx_status st = lpx_tensor_new(b->w.out, p->ndim, shape, on_dev ? f->cfg.compute_device : lpx_cpu(), &t);
        if (st) return st;
        size_t n = (size_t)(p->len * row);
        if (on_dev) {
            st = fsdp_d2d(f, lpx_tensor_data(t), recv + (size_t)at * es, n * es);
        } else if (!f->codec.decode) {
            if (n) memcpy(lpx_tensor_data(t), recv + (size_t)at * es, n * es);
        } else if (n) {
            st = f->codec.decode(&f->codec, f->codec_state, ctx, recv + (size_t)at * es, lpx_tensor_data(t), n);
            if (st) st = dt_prefix(st, "grad codec '%s': decode of '%s'", f->codec.name, p->name);
        }
        if (st) {
            lpx_tensor_release(t);
            return st;
        }
        lpx_tensor_release(p->grad);
        p->grad = t;
        lpx_tensor_release(p->grad_full);
        p->grad_full = NULL;
        at += p->chunk * row;
    }
    return LPX_OK;
}

/* A compute device (pass-through codec): rows of every grad of the bucket
 * into the device send buffer, the layout of pack, device to device. */
static lpx_status pack_dev(lpx_fsdp_group *g, const rs_bucket_t *b, unsigned char *send)
{
    lpx_fsdp *f = g->f;
    lpx_dtype d = b->w.wire;
    size_t es = lpx_dtype_nbytes(d, 1);
    int64_t at = 0;
    for (int i = 0; i < g->n; i++) {
        fsdp_param *p = &g->p[i];
        if (!b->sel[i]) continue;
        int64_t row = fsdp_row_elems(p);
        for (int q = 0; q < f->world; q++) {
            int64_t c, s, l;
            lpx_shard_range(p->shape[0], f->world, q, p->unit, &c, &s, &l);
            unsigned char *dst = send + ((size_t)q * (size_t)b->block + (size_t)at) * es;
            const unsigned char *src = (const unsigned char *)lpx_tensor_data(p->grad_full) + lpx_dtype_nbytes(d, s * row);
            lpx_status st = fsdp_d2d(f, dst, src, (size_t)(l * row) * es);
            if (st) return st;
        }
        at += p->chunk * row;
    }
    return LPX_OK;
}

/* A compute device: the bucket's reduce-scatter on the device (zero
 * padding, one collective, the replicate average on a 2-D mesh); offload:
 * ONE copy of this rank's block to the host staging buffer, then the host
 * grad shards as on a host engine; resident: split on the device. */
static lpx_status rs_bucket_dev(lpx_fsdp_group *g, const rs_bucket_t *b)
{
    lpx_fsdp *f = g->f;
    bool resident = f->place == LPX_FSDP_RESIDENT;
    size_t es = lpx_dtype_nbytes(b->w.wire, 1), rb = (size_t)b->block * es;
    lpx_tensor *send = NULL, *recv = NULL;
    unsigned char *host = NULL;
    lpx_status st = fsdp_dev_bytes(f, rb * (size_t)f->world, true, &send);
    if (!st) st = fsdp_dev_bytes(f, rb, false, &recv);
    if (!st && !resident) st = fsdp_stage(f, rb, &host);
    if (!st) st = pack_dev(g, b, lpx_tensor_data(send));
    if (st) st = dt_abort(f->comm, st);
    if (!st)
        st = lpx_comm_reduce_scatter_buf(f->comm, lpx_tensor_data(send), lpx_tensor_data(recv), (size_t)b->block,
                                         b->w.wire, b->w.op);
    if (!st && f->rep)
        st = lpx_comm_all_reduce_buf(f->rep, lpx_tensor_data(recv), lpx_tensor_data(recv), (size_t)b->block,
                                     b->w.wire, LPX_REDUCE_AVG);
    lpx_tensor_release(send);
    if (resident) {
        /* the shards stay on the device: no copy to the host */
        if (!st) st = unpack(g, b, NULL, lpx_tensor_data(recv), true);
        lpx_tensor_release(recv);
        return st;
    }
    if (!st) st = fsdp_d2h(f, host, lpx_tensor_data(recv), rb);
    lpx_tensor_release(recv);
    if (!st) st = unpack(g, b, NULL, host, false);
    return st;
}

/* One bucket's reduce-scatter on a host engine: prepare, encode, ONE
 * reduce-scatter, the replicate average, decode, finish. */
static lpx_status rs_bucket(lpx_fsdp_group *g, const rs_bucket_t *b)
{
    const char *op = "lpx_fsdp_reduce_scatter_grads";
    lpx_fsdp *f = g->f;
    if (f->place != LPX_FSDP_HOST) return rs_bucket_dev(g, b); /* pass-through: checked at lpx_fsdp_new */
    int n = g->n ? g->n : 1;
    lpx_tensor **grads = lpx_calloc((size_t)n, sizeof *grads);
    const char **names = lpx_calloc((size_t)n, sizeof *names);
    size_t es = lpx_dtype_nbytes(b->w.wire, 1);
    unsigned char *send = lpx_calloc((size_t)(b->block * f->world) + 1, es);
    unsigned char *recv = lpx_malloc(((size_t)b->block + 1) * es);
    lpx_grad_codec_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.struct_size = sizeof ctx;
    ctx.comm = f->comm;
    ctx.rep = f->rep;
    ctx.world = f->world;
    ctx.wire = b->w;
    ctx.scale = ctx.unscale = 1.0;
    ctx.grads = grads;
    ctx.names = names;
    lpx_status st = LPX_OK;
    bool prepared = false;
    if (!grads || !names || !send || !recv) {
        st = dt_abort(f->comm, lpx_error(LPX_ENOMEM, "%s: out of memory", op));
    } else {
        for (int i = 0; i < g->n; i++)
            if (b->sel[i]) {
                grads[ctx.ngrads] = g->p[i].grad_full;
                names[ctx.ngrads++] = g->p[i].name;
            }
        if (f->codec.prepare) {
            st = f->codec.prepare(&f->codec, f->codec_state, &ctx);
            f->st.amax_allreduces += ctx.amax_allreduces;
            /* a peer may wait in the codec's collective: tell it */
            if (st) st = dt_abort(f->comm, dt_prefix(st, "%s(%s): grad codec '%s'", op, g->name, f->codec.name));
        }
        prepared = true;
    }
    if (!st && (st = pack(g, b, &ctx, send))) st = dt_abort(f->comm, dt_prefix(st, "%s(%s)", op, g->name));
    if (!st) st = lpx_comm_reduce_scatter_buf(f->comm, send, recv, (size_t)b->block, b->w.wire, b->w.op);
    if (!st && f->rep) st = lpx_comm_all_reduce_buf(f->rep, recv, recv, (size_t)b->block, b->w.wire, LPX_REDUCE_AVG);
    if (!st) st = unpack(g, b, &ctx, recv, false);
    if (prepared && f->codec.finish) f->codec.finish(&f->codec, f->codec_state, &ctx);
    lpx_free(send);
    lpx_free(recv);
    lpx_free(grads);
    lpx_free(names);
    return st;
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
    int n = g->n ? g->n : 1;
    lpx_grad_wire *ws = lpx_calloc((size_t)n, sizeof *ws);
    bool *sel = lpx_calloc((size_t)n, sizeof *sel);
    lpx_status st = LPX_OK;
    if (!ws || !sel) st = lpx_error(LPX_ENOMEM, "%s(%s): out of memory", op, g->name);
    /* every grad's wire format (set_grad checked it: the same answer now) */
    for (int i = 0; i < g->n && !st; i++)
        if (g->p[i].grad_full && (st = grad_wire(f, lpx_tensor_dtype(g->p[i].grad_full), &ws[i])))
            st = dt_prefix(st, "%s(%s): grad of '%s'", op, g->name, g->p[i].name);
    if (st) {
        lpx_free(ws);
        lpx_free(sel);
        return dt_abort(f->comm, st);
    }
    fsdp_snap snap;
    fsdp_snap_begin(f, &snap);
    /* the buckets in increasing order, each one reduce-scatter */
    int last = -1;
    for (;;) {
        int next = -1;
        for (int i = 0; i < g->n; i++)
            if (g->p[i].grad_full && ws[i].bucket > last && (next < 0 || ws[i].bucket < next)) next = ws[i].bucket;
        if (next < 0) break;
        rs_bucket_t b = {sel, {0}, 0};
        bool first = true;
        for (int i = 0; i < g->n; i++) {
            sel[i] = g->p[i].grad_full && ws[i].bucket == next;
            if (!sel[i]) continue;
            if (first) b.w = ws[i];
            else if (ws[i].wire != b.w.wire || ws[i].op != b.w.op || ws[i].out != b.w.out)
                st = lpx_error(LPX_EINVAL, "%s(%s): grad codec '%s' puts '%s' in bucket %d with another wire format "
                               "than the bucket's first grad", op, g->name, f->codec.name, g->p[i].name, next);
            first = false;
            b.block += g->p[i].chunk * fsdp_row_elems(&g->p[i]);
        }
        if (st) {
            st = dt_abort(f->comm, st);
            break;
        }
        if ((st = rs_bucket(g, &b))) break;
        last = next;
    }
    fsdp_snap_end(f, &snap);
    lpx_free(ws);
    lpx_free(sel);
    return st;
}
