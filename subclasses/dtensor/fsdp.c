/* The sharding engine: groups, fully_shard, unshard / reshard, prefetch,
 * statistics. Gradients are in fsdp_grads.c, AdamW in fsdp_adamw.c, the
 * agreement of the kinds' statistics (scales) in fsdp_sync.c.
 *
 * The engine moves bytes: a param's kind says what goes on the wire
 * (pre_all_gather) and how to rebuild it (post_all_gather); dense params
 * put themselves on the wire. A group's inputs, whatever their dtypes, are
 * packed into ONE u8 buffer per rank and gathered by ONE all-gather. Each
 * rank's block has a fixed layout agreed on at lpx_fsdp_shard (one
 * all-gather of wire descriptors): param p's inputs sit at offset off_p,
 * padded to the largest rank's size (torch.chunk leaves trailing shards
 * smaller or empty), and are unpadded by the sender's descriptor. */
#include <stddef.h>
#include <string.h>
#include "fsdp_internal.h"

void fsdp_snap_begin(lpx_fsdp *f, fsdp_snap *s)
{
    memset(s, 0, sizeof *s);
    s->s[0].struct_size = s->s[1].struct_size = sizeof(lpx_comm_stats);
    lpx_comm_stats_get(f->comm, &s->s[0]);
    if (f->rep) lpx_comm_stats_get(f->rep, &s->s[1]);
}

void fsdp_snap_end(lpx_fsdp *f, const fsdp_snap *s)
{
    lpx_comm *c[2] = {f->comm, f->rep};
    for (int i = 0; i < 2; i++) {
        if (!c[i]) continue;
        lpx_comm_stats now;
        now.struct_size = sizeof now;
        if (lpx_comm_stats_get(c[i], &now)) continue;
        for (int k = 0; k < LPX_COLL_MAX; k++) {
            f->st.calls[k] += now.calls[k] - s->s[i].calls[k];
            f->st.bytes[k] += now.bytes[k] - s->s[i].bytes[k];
            f->st.ns[k] += now.ns[k] - s->s[i].ns[k];
        }
    }
}

lpx_status lpx_fsdp_new(lpx_mesh *mesh, const lpx_fsdp_config *cfg, lpx_fsdp **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_fsdp_new: out is NULL");
    *out = NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!mesh || lpx_mesh_ndim(mesh) < 1) return lpx_error(LPX_EINVAL, "lpx_fsdp_new: mesh is NULL");
    /* an older caller's struct ends at param_dtype: later fields keep their defaults */
    const size_t v1 = offsetof(lpx_fsdp_config, param_dtype) + sizeof(lpx_dtype);
    size_t known = sizeof *cfg;
    if (cfg && cfg->struct_size) {
        if (cfg->struct_size < v1)
            return lpx_error(LPX_EINVAL, "lpx_fsdp_new: cfg->struct_size %zu < %zu", cfg->struct_size, v1);
        if (cfg->struct_size < known) known = cfg->struct_size;
    }
    lpx_fsdp *f = lpx_calloc(1, sizeof *f);
    if (!f) return lpx_error(LPX_ENOMEM, "lpx_fsdp_new: cannot allocate the engine");
    if (cfg) memcpy(&f->cfg, cfg, known);
    f->cfg.struct_size = sizeof f->cfg;
    if (f->cfg.compute_device.type == 0) f->cfg.compute_device = lpx_cpu();
    if (f->cfg.max_unsharded <= 0) f->cfg.max_unsharded = 2;
    if (f->cfg.param_dtype && (st = dt_param_dtype_check(f->cfg.param_dtype))) {
        lpx_free(f);
        return dt_prefix(st, "lpx_fsdp_new");
    }
    if ((st = fsdp_codec_init(f))) {
        lpx_free(f);
        return st;
    }
    lpx_mesh_retain(mesh);
    f->mesh = mesh;
    int sd = lpx_mesh_ndim(mesh) - 1; /* the last mesh dim shards */
    f->comm = lpx_mesh_comm(mesh, sd);
    f->rep = sd > 0 ? lpx_mesh_comm(mesh, 0) : NULL;
    f->world = lpx_comm_size(f->comm);
    f->rank = lpx_comm_rank(f->comm);
    f->st.struct_size = sizeof f->st;
    f->place = LPX_FSDP_HOST;
    if (f->cfg.compute_device.type != LPX_DEVICE_CPU && (st = fsdp_offload_init(f))) {
        lpx_mesh_release(mesh);
        fsdp_codec_free(f);
        lpx_free(f);
        return st;
    }
    *out = f;
    return LPX_OK;
}

static void param_drop_unsharded(fsdp_param *p)
{
    lpx_tensor_release(p->full);
    p->full = NULL;
    for (int i = 0; i < LPX_MAX_AG_INPUTS; i++) {
        lpx_tensor_release(p->outputs[i]);
        p->outputs[i] = NULL;
    }
}

void lpx_fsdp_free(lpx_fsdp *f)
{
    if (!f) return;
    for (int gi = 0; gi < f->ng; gi++) {
        lpx_fsdp_group *g = f->g[gi];
        if (g->pending) { /* lpx-cuda frees the receive buffer after the all-gather */
            if (fsdp_gather_wait(g)) lpx_clear_error();
            fsdp_gather_drop(g);
        }
        for (int i = 0; i < g->n; i++) {
            fsdp_param *p = &g->p[i];
            lpx_free(p->name);
            lpx_tensor_release(p->full_in);
            lpx_tensor_release(p->dt);
            lpx_free(p->descs);
            param_drop_unsharded(p);
            lpx_tensor_release(p->grad_full);
            lpx_tensor_release(p->grad);
            lpx_free(p->m);
            lpx_free(p->v);
            lpx_tensor_release(p->mt);
            lpx_tensor_release(p->vt);
            lpx_tensor_release(p->ms);
            lpx_tensor_release(p->wsc);
            lpx_tensor_release(p->vs);
        }
        lpx_free(g->p);
        lpx_free(g->name);
        lpx_free(g);
    }
    lpx_free(f->g);
    fsdp_offload_free(f);
    fsdp_codec_free(f);
    lpx_mesh_release(f->mesh);
    lpx_free(f);
}

lpx_status lpx_fsdp_group_add(lpx_fsdp *f, const char *name, lpx_fsdp_group **out)
{
    if (out) *out = NULL;
    if (!f || !name || !out) return lpx_error(LPX_EINVAL, "lpx_fsdp_group_add: NULL argument");
    if (f->sharded) return lpx_error(LPX_EINVAL, "lpx_fsdp_group_add(%s): the engine is sharded already", name);
    if (f->ng == f->gcap) {
        int cap = f->gcap ? 2 * f->gcap : 8;
        lpx_fsdp_group **ng = lpx_realloc(f->g, (size_t)cap * sizeof *ng);
        if (!ng) return lpx_error(LPX_ENOMEM, "lpx_fsdp_group_add(%s): out of memory", name);
        f->g = ng;
        f->gcap = cap;
    }
    lpx_fsdp_group *g = lpx_calloc(1, sizeof *g);
    if (!g || !(g->name = lpx_strdup(name))) {
        lpx_free(g);
        return lpx_error(LPX_ENOMEM, "lpx_fsdp_group_add(%s): out of memory", name);
    }
    g->f = f;
    f->g[f->ng++] = g;
    *out = g;
    return LPX_OK;
}

lpx_status lpx_fsdp_param_add(lpx_fsdp_group *g, const char *name, lpx_tensor *full, unsigned flags, int *index)
{
    const char *op = "lpx_fsdp_param_add";
    if (!g || !name || !full) return lpx_error(LPX_EINVAL, "%s: NULL argument", op);
    if (g->f->sharded) return lpx_error(LPX_EINVAL, "%s(%s): the engine is sharded already", op, name);
    if (lpx_tensor_ndim(full) < 1 || lpx_dtensor_is(full))
        return lpx_error(LPX_EINVAL, "%s(%s): a parameter must be a >= 1-D tensor that is not a DTensor", op, name);
    const lpx_kind *k = lpx_tensor_kind(full);
    if (k && (!lpx_kind_vtable(k)->pre_all_gather || !lpx_kind_vtable(k)->post_all_gather))
        return lpx_error(LPX_ENOTIMPL, "%s(%s): kind '%s' has no all-gather hooks: it cannot be sharded", op, name,
                         lpx_kind_name(k));
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 8;
        fsdp_param *np = lpx_realloc(g->p, (size_t)cap * sizeof *np);
        if (!np) return lpx_error(LPX_ENOMEM, "%s(%s): out of memory", op, name);
        g->p = np;
        g->cap = cap;
    }
    fsdp_param *p = &g->p[g->n];
    memset(p, 0, sizeof *p);
    if (!(p->name = lpx_strdup(name))) return lpx_error(LPX_ENOMEM, "%s(%s): out of memory", op, name);
    p->flags = flags;
    lpx_tensor_retain(full);
    p->full_in = full;
    p->dtype = lpx_tensor_dtype(full);
    p->ndim = lpx_tensor_ndim(full);
    memcpy(p->shape, lpx_tensor_shape(full), (size_t)p->ndim * sizeof(int64_t));
    p->unit = dt_shard_unit(full, 0);
    if (index) *index = g->n;
    g->n++;
    return LPX_OK;
}

/* What goes to pre_all_gather: the local shard, or with param_dtype a
 * dense f32 shard cast to it (mixed precision). New reference. */
static lpx_status wire_src(const lpx_fsdp *f, const fsdp_param *p, lpx_tensor **out)
{
    lpx_tensor *l = fsdp_local(p);
    if (p->wsc) {
        /* a scaled-f16 master: the dequantized weight, in param_dtype */
        lpx_tensor *d = NULL;
        lpx_status st = fsdp_master_dequant(p->wblock, l, p->wsc, &d);
        if (st || !f->cfg.param_dtype || !dt_param_dtype_casts(lpx_tensor_dtype(d), f->cfg.param_dtype)) {
            *out = d;
            return st;
        }
        st = lpx_cast(d, f->cfg.param_dtype, false, out);
        lpx_tensor_release(d);
        return st;
    }
    if (!f->cfg.param_dtype || lpx_tensor_kind(l) || !dt_param_dtype_casts(lpx_tensor_dtype(l), f->cfg.param_dtype)) {
        lpx_tensor_retain(l);
        *out = l;
        return LPX_OK;
    }
    return lpx_cast(l, f->cfg.param_dtype, false, out);
}

/* Cuts every param, describes its wire inputs. Local (a kind's hook may
 * all-reduce, e.g. a float8_weight without an agreed scale: every rank does
 * it in the same order). */
static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static lpx_status shard_param(lpx_fsdp *f, const lpx_fsdp_group *g, fsdp_param *p, dt_wire_desc *mine)
{
    const char *op = "lpx_fsdp_shard";
    lpx_tensor *local = NULL;
    lpx_status st = LPX_OK;
    bool trainable = !(p->flags & LPX_FSDP_FROZEN);
    if (trainable && g->optim.state != LPX_FSDP_STATE_F32) {
        /* low-precision moments: a shard holds whole quantization blocks of
         * the param's global flat index (the state kind's shard unit) */
        int64_t su = 1;
        if ((st = fsdp_state_unit(&g->optim, p->ndim, p->shape, &su)))
            return dt_prefix(st, "%s: param '%s': optimizer state", op, p->name);
        if (su > 1) p->unit = p->unit / gcd64(p->unit, su) * su;
    }
    if (trainable && !lpx_tensor_kind(p->full_in) && fsdp_master_scaled_applies(&g->optim, lpx_tensor_dtype(p->full_in))) {
        /* a scaled-f16 master: its blocks whole in each shard too */
        int64_t re = 1;
        for (int d = 1; d < p->ndim; d++) re *= p->shape[d];
        int64_t su = fsdp_master_unit(&g->optim, re);
        if (su > 1) p->unit = p->unit / gcd64(p->unit, su) * su;
    }
    st = lpx_shard_range(p->shape[0], f->world, f->rank, p->unit, &p->chunk, &p->start, &p->len);
    if (!st) st = dt_chunk_unit(op, p->full_in, 0, f->world, f->rank, p->unit, &local);
    if (st) return dt_prefix(st, "%s: param '%s'", op, p->name);
    lpx_dtype mdt = fsdp_master_dtype(&g->optim);
    if (trainable && mdt && !lpx_tensor_kind(local) && dt_param_dtype_casts(lpx_tensor_dtype(local), mdt)) {
        /* a low-precision master: the shard itself is kept in it (no f32
         * copy); the gathered weight is that tensor */
        lpx_tensor *c = NULL;
        st = lpx_cast(local, mdt, false, &c);
        lpx_tensor_release(local);
        if (st) return dt_prefix(st, "%s: param '%s': master", op, p->name);
        local = c;
        p->dtype = mdt;
    } else if (trainable && !lpx_tensor_kind(local) && fsdp_master_scaled_applies(&g->optim, lpx_tensor_dtype(local))) {
        /* FP8-LM's scaled f16 master: the shard is kept as its codes (no
         * f32 copy), the block scales beside it; the wire carries the
         * dequantized weight (wire_src) */
        if (f->place == LPX_FSDP_RESIDENT) {
            lpx_tensor_release(local);
            return lpx_error(LPX_ENOTIMPL, "%s: param '%s': a scaled-f16 master on a device-resident engine (host "
                             "engines only: offload or CPU)", op, p->name);
        }
        lpx_tensor *c = NULL;
        st = fsdp_master_quantize(&g->optim, local, &c, &p->wsc);
        p->wblock = g->optim.block;
        lpx_tensor_release(local);
        if (st) return dt_prefix(st, "%s: param '%s': master", op, p->name);
        local = c;
    }
    lpx_placement pl[LPX_MESH_MAX_DIMS] = {lpx_replicate(), lpx_replicate()};
    pl[lpx_mesh_ndim(f->mesh) - 1] = lpx_shard(0);
    st = dt_make(local, f->mesh, pl, p->ndim, p->shape, p->dtype, &p->dt);
    lpx_tensor_release(local);
    if (st) return st;
    lpx_tensor_release(p->full_in);
    p->full_in = NULL;
    lpx_tensor *in[LPX_MAX_AG_INPUTS] = {0};
    unsigned char meta[LPX_MAX_META];
    size_t ms;
    int n = 0;
    lpx_fsdp_hook_ctx h = {sizeof h, f->comm, 0, f->cfg.compute_device};
    lpx_tensor *src = NULL;
    if ((st = wire_src(f, p, &src))) return st;
    st = dt_pre_gather(op, src, &h, in, &n, meta, &ms, mine);
    lpx_tensor_release(src);
    f->st.amax_allreduces += h.amax_allreduces;
    for (int i = 0; i < n; i++) lpx_tensor_release(in[i]);
    if (st) return dt_prefix(st, "%s: param '%s'", op, p->name);
    return LPX_OK;
}

lpx_status lpx_fsdp_shard(lpx_fsdp *f)
{
    const char *op = "lpx_fsdp_shard";
    if (!f) return lpx_error(LPX_EINVAL, "%s: f is NULL", op);
    if (f->sharded) return lpx_error(LPX_EINVAL, "%s: already sharded", op);
    /* where the shards live: the params' device (an argument error: every
     * rank sees the same, no abort needed) */
    lpx_status rst = fsdp_resident_check(f);
    if (rst) return rst;
    int total = 0;
    for (int gi = 0; gi < f->ng; gi++) total += f->g[gi]->n;
    dt_wire_desc *mine = lpx_calloc((size_t)(total ? total : 1), sizeof *mine);
    dt_wire_desc *all = lpx_calloc((size_t)(total ? total : 1) * (size_t)f->world, sizeof *all);
    fsdp_snap snap;
    fsdp_snap_begin(f, &snap);
    lpx_status st = LPX_OK;
    if (!mine || !all) st = dt_abort(f->comm, lpx_error(LPX_ENOMEM, "%s: cannot allocate wire descriptors", op));
    int k = 0;
    for (int gi = 0; gi < f->ng && !st; gi++)
        for (int i = 0; i < f->g[gi]->n && !st; i++, k++)
            if ((f->g[gi]->p[i].pid = (uint32_t)k), (st = shard_param(f, f->g[gi], &f->g[gi]->p[i], &mine[k])))
                st = dt_abort(f->comm, st);
    /* one all-gather: every rank learns every other rank's wire layout */
    if (!st) st = fsdp_all_gather_host(f, f->comm, mine, all, (size_t)total * sizeof *mine);
    k = 0;
    for (int gi = 0; gi < f->ng && !st; gi++) {
        lpx_fsdp_group *g = f->g[gi];
        size_t off = 0;
        for (int i = 0; i < g->n && !st; i++, k++) {
            fsdp_param *p = &g->p[i];
            if (!(p->descs = lpx_malloc((size_t)f->world * sizeof *p->descs))) {
                st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
                break;
            }
            size_t slot = 0;
            for (int r = 0; r < f->world; r++) {
                p->descs[r] = all[(size_t)r * (size_t)total + (size_t)k];
                size_t b = dt_wire_bytes(&p->descs[r]);
                slot = b > slot ? b : slot;
            }
            p->off = off;
            p->slot = slot;
            off += slot;
        }
        g->slot = off;
    }
    fsdp_snap_end(f, &snap);
    lpx_free(mine);
    lpx_free(all);
    if (!st) f->sharded = true;
    return st;
}

int lpx_fsdp_group_count(const lpx_fsdp *f) { return f ? f->ng : 0; }
lpx_fsdp_placement lpx_fsdp_placement_get(const lpx_fsdp *f) { return f ? f->place : LPX_FSDP_HOST; }
const char *lpx_fsdp_grad_codec(const lpx_fsdp *f) { return f ? f->codec.name : NULL; }
lpx_fsdp_group *lpx_fsdp_group_at(const lpx_fsdp *f, int i) { return f && i >= 0 && i < f->ng ? f->g[i] : NULL; }
const char *lpx_fsdp_group_name(const lpx_fsdp_group *g) { return g ? g->name : NULL; }
int lpx_fsdp_param_count(const lpx_fsdp_group *g) { return g ? g->n : 0; }

const char *lpx_fsdp_param_name(const lpx_fsdp_group *g, int i)
{
    return g && i >= 0 && i < g->n ? g->p[i].name : NULL;
}

unsigned lpx_fsdp_param_flags(const lpx_fsdp_group *g, int i) { return g && i >= 0 && i < g->n ? g->p[i].flags : 0u; }

lpx_status lpx_fsdp_param_rows(const lpx_fsdp_group *g, int i, int64_t *start, int64_t *len, int64_t *unit)
{
    if (!g || i < 0 || i >= g->n)
        return lpx_error(LPX_EINVAL, "lpx_fsdp_param_rows: %s", g ? "parameter index out of range" : "g is NULL");
    if (!g->f->sharded) return lpx_error(LPX_EINVAL, "lpx_fsdp_param_rows: call lpx_fsdp_shard first");
    const fsdp_param *p = &g->p[i];
    if (start) *start = p->start;
    if (len) *len = p->len;
    if (unit) *unit = p->unit;
    return LPX_OK;
}
bool lpx_fsdp_is_unsharded(const lpx_fsdp_group *g) { return g && g->unsharded; }

static lpx_status gather_finish(lpx_fsdp_group *g);

lpx_tensor *lpx_fsdp_param_full(const lpx_fsdp_group *g, int i)
{
    if (!g || !g->unsharded || i < 0 || i >= g->n) return NULL;
    /* the first use of a prefetched group completes its gather (the group
     * object is never const itself: the engine made it) */
    if (g->pending && gather_finish((lpx_fsdp_group *)g)) return NULL;
    return g->unsharded ? g->p[i].full : NULL;
}
lpx_tensor *lpx_fsdp_param_dtensor(const lpx_fsdp_group *g, int i) { return g && i >= 0 && i < g->n ? g->p[i].dt : NULL; }
lpx_tensor *lpx_fsdp_param_local(const lpx_fsdp_group *g, int i)
{
    return g && i >= 0 && i < g->n && g->p[i].dt ? fsdp_local(&g->p[i]) : NULL;
}

static uint64_t tensor_bytes(const lpx_tensor *t)
{
    return lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
}

static void note_unsharded(lpx_fsdp *f, int64_t delta)
{
    f->st.unsharded_bytes += (uint64_t)delta;
    if (f->st.unsharded_bytes > f->st.peak_unsharded_bytes) f->st.peak_unsharded_bytes = f->st.unsharded_bytes;
}

/* Splits the gathered buffer (memory of the compute device) and rebuilds
 * every param of g there. */
static lpx_status rebuild(lpx_fsdp_group *g, const unsigned char *recv, lpx_tensor **inputs, int *nin,
                          unsigned char *metas, size_t *msz, uint64_t *bytes)
{
    const char *op = "lpx_fsdp_unshard";
    lpx_fsdp *f = g->f;
    for (int i = 0; i < g->n; i++) {
        fsdp_param *p = &g->p[i];
        lpx_status st = dt_unpack_on(op, recv, g->slot, p->off, p->descs, f->world, f->cfg.compute_device,
                                     p->outputs);
        lpx_tensor *prev = g->kept ? p->full : NULL, *full = NULL;
        if (!st)
            st = dt_post_gather(op, lpx_tensor_kind(fsdp_local(p)), p->outputs, nin[i], metas + (size_t)i * LPX_MAX_META,
                                msz[i], p->dtype, prev, &full);
        if (st) return dt_prefix(st, "%s(%s): param '%s'", op, g->name, p->name);
        uint64_t b = 0;
        for (int k = 0; k < nin[i]; k++) b += tensor_bytes(p->outputs[k]);
        *bytes += b;
        p->full_bytes = b;
        lpx_tensor_release(p->full);
        p->full = full;
        if (!f->cfg.keep_storage) /* the result holds what it needs */
            for (int k = 0; k < LPX_MAX_AG_INPUTS; k++) {
                lpx_tensor_release(p->outputs[k]);
                p->outputs[k] = NULL;
            }
        (void)inputs;
    }
    return LPX_OK;
}

/* pre_all_gather of every param of g and the pack of its inputs into
 * send (g->slot bytes, zeroed); aborts the comm on failure. */
static lpx_status pack_group(lpx_fsdp_group *g, unsigned char *send, lpx_tensor **inputs, int *nin,
                             unsigned char *metas, size_t *msz)
{
    const char *op = "lpx_fsdp_unshard";
    lpx_fsdp *f = g->f;
    lpx_status st = LPX_OK;
    lpx_fsdp_hook_ctx h = {sizeof h, f->comm, 0, f->cfg.compute_device};
    uint64_t t0 = lpx_now_ns();
    for (int i = 0; i < g->n && !st; i++) {
        fsdp_param *p = &g->p[i];
        dt_wire_desc d;
        lpx_tensor *src = NULL;
        st = wire_src(f, p, &src);
        if (!st)
            st = dt_pre_gather(op, src, &h, inputs + (size_t)i * LPX_MAX_AG_INPUTS, &nin[i],
                               metas + (size_t)i * LPX_MAX_META, &msz[i], &d);
        lpx_tensor_release(src);
        if (!st && memcmp(&d, &p->descs[f->rank], sizeof d))
            st = lpx_error(LPX_EINVAL, "%s(%s): param '%s' now puts a different input list on the wire than at "
                           "lpx_fsdp_shard (its shard changed shape or format)", op, g->name, p->name);
        if (!st && f->place == LPX_FSDP_RESIDENT) {
            st = fsdp_pack_dev(f, &d, inputs + (size_t)i * LPX_MAX_AG_INPUTS, send + p->off);
        } else if (!st) {
            /* a host engine packs with memcpy: its kinds' wire inputs must
             * be host memory */
            for (int k = 0; k < nin[i] && !st; k++)
                if (lpx_tensor_device(inputs[(size_t)i * LPX_MAX_AG_INPUTS + k]).type != LPX_DEVICE_CPU)
                    st = lpx_error(LPX_EDEVICE, "%s(%s): param '%s': its kind put wire input %d on a device, but this "
                                   "engine keeps its shards on the host", op, g->name, p->name, k);
            if (!st) dt_pack(&d, inputs + (size_t)i * LPX_MAX_AG_INPUTS, send + p->off);
        }
        if (st) st = dt_abort(f->comm, dt_prefix(st, "%s(%s): param '%s'", op, g->name, p->name));
    }
    f->st.amax_allreduces += h.amax_allreduces;
    f->st.pack_ns += lpx_now_ns() - t0;
    return st;
}

/* The bookkeeping of a successful rebuild of g (`bytes` unsharded). */
static void mark_unsharded(lpx_fsdp_group *g, uint64_t bytes)
{
    lpx_fsdp *f = g->f;
    if (g->kept) note_unsharded(f, -(int64_t)g->bytes); /* the kept storage was refilled */
    g->kept = false;
    g->bytes = bytes;
    f->st.unshards++;
    note_unsharded(f, (int64_t)bytes);
}

/* Completes a prefetched group: lpx-cuda's stream waits for its
 * all-gather, then the split and post_all_gather on the device, as the
 * synchronous path. On failure g is sharded again. No collective. */
static lpx_status gather_finish(lpx_fsdp_group *g)
{
    const char *op = "lpx_fsdp_unshard";
    lpx_fsdp *f = g->f;
    fsdp_gather *pg = g->pending;
    lpx_status st = fsdp_gather_wait(g);
    if (st) st = dt_prefix(st, "%s(%s): waiting for the prefetched all-gather", op, g->name);
    uint64_t bytes = 0;
    if (!st) {
        uint64_t t0 = lpx_now_ns();
        st = rebuild(g, lpx_tensor_data(pg->drecv), NULL, pg->nin, pg->metas, pg->msz, &bytes);
        f->st.unpack_ns += lpx_now_ns() - t0;
        if (st) {
            for (int i = 0; i < g->n; i++) param_drop_unsharded(&g->p[i]);
            g->kept = false;
        }
    }
    fsdp_gather_drop(g);
    if (st) {
        g->unsharded = false;
        f->nunsharded--;
        return st;
    }
    mark_unsharded(g, bytes);
    return LPX_OK;
}

/* lpx_fsdp_prefetch in offload mode: pack into a pinned staging block,
 * enqueue its upload and the all-gather on the comm stream (lpx-cuda's
 * stream does not wait), and leave g unsharded with its gather pending. */
static lpx_status prefetch_async(lpx_fsdp_group *g)
{
    const char *op = "lpx_fsdp_unshard";
    lpx_fsdp *f = g->f;
    int b = -1;
    lpx_status st = fsdp_block_get(f, g->slot, &b);
    if (st) return dt_abort(f->comm, dt_prefix(st, "%s(%s): staging block", op, g->name));
    if (b < 0) return lpx_fsdp_unshard(g); /* not available: synchronous */
    int n = g->n;
    size_t nn = (size_t)(n ? n : 1);
    fsdp_gather *pg = lpx_calloc(1, sizeof *pg);
    lpx_tensor **inputs = lpx_calloc(nn * LPX_MAX_AG_INPUTS, sizeof *inputs);
    if (pg) {
        pg->blk = -1;
        pg->nin = lpx_calloc(nn, sizeof *pg->nin);
        pg->msz = lpx_calloc(nn, sizeof *pg->msz);
        pg->metas = lpx_malloc(nn * LPX_MAX_META);
    }
    fsdp_snap snap;
    fsdp_snap_begin(f, &snap);
    if (!pg || !inputs || !pg->nin || !pg->msz || !pg->metas)
        st = lpx_error(LPX_ENOMEM, "%s(%s): out of memory", op, g->name);
    else if (!(st = fsdp_dev_bytes(f, g->slot * (size_t)f->world, false, &pg->drecv)) && !pg->drecv)
        st = lpx_error(LPX_ENOMEM, "%s(%s): out of memory", op, g->name);
    if (st) st = dt_abort(f->comm, st);
    unsigned char *send = f->blk[b].p;
    if (!st) {
        memset(send, 0, g->slot);
        st = pack_group(g, send, inputs, pg->nin, pg->metas, pg->msz);
    }
    if (!st) {
        uint64_t t0 = lpx_now_ns();
        st = lpx_comm_all_gather_host(f->comm, send, lpx_tensor_data(pg->drecv), g->slot, &pg->ticket);
        f->st.copy_ns += lpx_now_ns() - t0;
        if (!st && g->slot) {
            f->st.h2d_copies++;
            f->st.h2d_bytes += g->slot;
        }
    }
    fsdp_snap_end(f, &snap);
    if (inputs)
        for (size_t i = 0; i < nn * LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(inputs[i]);
    lpx_free(inputs);
    if (pg && !st) {
        /* the block is read by the upload until the ticket completes */
        f->blk[b].ticket = pg->ticket;
        f->blk[b].busy = true;
        pg->blk = b;
        g->pending = pg;
        g->unsharded = true;
        f->nunsharded++;
        if (f->nunsharded > f->st.peak_unsharded_groups) f->st.peak_unsharded_groups = f->nunsharded;
        return LPX_OK;
    }
    if (pg) { /* nothing was enqueued (the all-gather is the last step): no wait */
        g->pending = pg;
        fsdp_gather_drop(g);
    }
    return st;
}

lpx_status lpx_fsdp_unshard(lpx_fsdp_group *g)
{
    const char *op = "lpx_fsdp_unshard";
    if (!g) return lpx_error(LPX_EINVAL, "%s: g is NULL", op);
    lpx_fsdp *f = g->f;
    if (!f->sharded) return lpx_error(LPX_EINVAL, "%s(%s): call lpx_fsdp_shard first", op, g->name);
    if (g->unsharded) return g->pending ? gather_finish(g) : LPX_OK;
    if (f->nunsharded >= f->cfg.max_unsharded)
        return lpx_error(LPX_EFULL, "%s(%s): %d groups are unsharded already (max_unsharded %d); reshard one first",
                         op, g->name, f->nunsharded, f->cfg.max_unsharded);
    fsdp_snap snap;
    fsdp_snap_begin(f, &snap);
    lpx_status st = LPX_OK;
    int n = g->n;
    lpx_tensor **inputs = lpx_calloc((size_t)(n ? n : 1) * LPX_MAX_AG_INPUTS, sizeof *inputs);
    int *nin = lpx_calloc((size_t)(n ? n : 1), sizeof *nin);
    size_t *msz = lpx_calloc((size_t)(n ? n : 1), sizeof *msz);
    unsigned char *metas = lpx_malloc((size_t)(n ? n : 1) * LPX_MAX_META);
    /* send/recv: host buffers; offloading: send is the engine's staging
     * buffer (not owned here) and recv the device tensor drecv;
     * device-resident: send is this rank's block inside drecv */
    unsigned char *send = NULL, *recv = NULL;
    lpx_tensor *drecv = NULL;
    switch (f->place) {
    case LPX_FSDP_RESIDENT:
        if (inputs && nin && msz && metas) st = fsdp_dev_bytes(f, g->slot * (size_t)f->world, true, &drecv);
        if (!st && !drecv) st = lpx_error(LPX_ENOMEM, "%s(%s): out of memory", op, g->name);
        if (!st) {
            recv = lpx_tensor_data(drecv);
            send = recv + (size_t)f->rank * g->slot;
        }
        break;
    case LPX_FSDP_OFFLOAD:
        if (inputs && nin && msz && metas && !(st = fsdp_stage(f, g->slot, &send)))
            st = fsdp_dev_bytes(f, g->slot * (size_t)f->world, false, &drecv);
        if (!st && !drecv) st = lpx_error(LPX_ENOMEM, "%s(%s): out of memory", op, g->name);
        if (!st) {
            memset(send, 0, g->slot);
            recv = lpx_tensor_data(drecv);
        }
        break;
    case LPX_FSDP_HOST:
        send = lpx_calloc(1, g->slot ? g->slot : 1);
        recv = lpx_malloc((g->slot ? g->slot : 1) * (size_t)f->world);
        break;
    }
    if (st || !inputs || !nin || !msz || !metas || !send || !recv) {
        if (!st)
            st = lpx_error(LPX_ENOMEM, "%s(%s): cannot allocate %zu wire bytes", op, g->name,
                           g->slot * (size_t)f->world);
        st = dt_abort(f->comm, st);
        goto done;
    }
    /* 1. each param says what goes on the wire; 2. pack into one buffer */
    uint64_t t0;
    if ((st = pack_group(g, send, inputs, nin, metas, msz))) goto done;
    /* 3. one all-gather for the whole group (offloading: ONE copy of this
     * rank's block to its place in the device buffer, then in place) */
    switch (f->place) {
    case LPX_FSDP_RESIDENT:
        /* packed in place: this rank's block already sits at its offset */
        if ((st = lpx_comm_all_gather_buf(f->comm, send, recv, g->slot))) goto done;
        send = NULL;
        break;
    case LPX_FSDP_OFFLOAD: {
        unsigned char *mine = recv + (size_t)f->rank * g->slot;
        if ((st = fsdp_h2d(f, mine, send, g->slot))) {
            st = dt_abort(f->comm, st);
            goto done;
        }
        if ((st = lpx_comm_all_gather_buf(f->comm, mine, recv, g->slot))) goto done;
        send = NULL;
        break;
    }
    case LPX_FSDP_HOST:
        if ((st = lpx_comm_all_gather_buf(f->comm, send, recv, g->slot))) goto done;
        lpx_free(send);
        send = NULL;
        break;
    }
    /* 4. split, unpad, post_all_gather */
    t0 = lpx_now_ns();
    uint64_t bytes = 0;
    st = rebuild(g, recv, inputs, nin, metas, msz, &bytes);
    f->st.unpack_ns += lpx_now_ns() - t0;
    if (st) {
        for (int i = 0; i < n; i++) param_drop_unsharded(&g->p[i]);
        g->kept = false;
        goto done;
    }
    mark_unsharded(g, bytes);
    g->unsharded = true;
    f->nunsharded++;
    if (f->nunsharded > f->st.peak_unsharded_groups) f->st.peak_unsharded_groups = f->nunsharded;
done:
    fsdp_snap_end(f, &snap);
    if (inputs)
        for (int i = 0; i < n * LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(inputs[i]);
    lpx_free(inputs);
    lpx_free(nin);
    lpx_free(msz);
    lpx_free(metas);
    if (f->place != LPX_FSDP_HOST) {
        lpx_tensor_release(drecv);
    } else {
        lpx_free(send);
        lpx_free(recv);
    }
    return st;
}

lpx_status lpx_fsdp_prefetch(lpx_fsdp_group *next)
{
    if (!next) return lpx_error(LPX_EINVAL, "lpx_fsdp_prefetch: next is NULL");
    lpx_fsdp *f = next->f;
    if (next->unsharded || f->nunsharded >= f->cfg.max_unsharded) return LPX_OK;
    /* offloading: upload and all-gather overlap the compute queued next */
    if (f->place == LPX_FSDP_OFFLOAD && f->sharded && f->overlap) return prefetch_async(next);
    return lpx_fsdp_unshard(next);
}

lpx_status lpx_fsdp_reshard(lpx_fsdp_group *g)
{
    if (!g) return lpx_error(LPX_EINVAL, "lpx_fsdp_reshard: g is NULL");
    if (!g->unsharded) return LPX_OK;
    lpx_fsdp *f = g->f;
    g->unsharded = false;
    f->nunsharded--;
    f->st.reshards++;
    if (g->pending) {
        /* prefetched, never used: nothing was rebuilt (kept storage, if
         * any, stays kept); the receive buffer goes after the all-gather */
        lpx_status st = fsdp_gather_wait(g);
        fsdp_gather_drop(g);
        return st;
    }
    if (f->cfg.keep_storage) {
        /* memory for speed: the storage stays (and stays counted) so the
         * next unshard refills it through post_all_gather's `out` */
        g->kept = true;
        return LPX_OK;
    }
    for (int i = 0; i < g->n; i++) param_drop_unsharded(&g->p[i]);
    note_unsharded(f, -(int64_t)g->bytes);
    g->bytes = 0;
    return LPX_OK;
}

lpx_status lpx_fsdp_stats_get(const lpx_fsdp *f, lpx_fsdp_stats *out)
{
    /* an older caller's struct ends at unpack_ns: copy what it covers */
    const size_t v1 = offsetof(lpx_fsdp_stats, unpack_ns) + sizeof(uint64_t);
    if (!f || !out || out->struct_size < v1)
        return lpx_error(LPX_EINVAL, "lpx_fsdp_stats_get: NULL argument or struct_size too small");
    size_t n = out->struct_size < sizeof *out ? out->struct_size : sizeof *out;
    memcpy(out, &f->st, n);
    out->struct_size = n;
    return LPX_OK;
}

void lpx_fsdp_stats_reset(lpx_fsdp *f)
{
    if (!f) return;
    uint64_t live = f->st.unsharded_bytes, pinned = f->st.pinned_bytes;
    memset(&f->st, 0, sizeof f->st);
    f->st.struct_size = sizeof f->st;
    f->st.unsharded_bytes = f->st.peak_unsharded_bytes = live;
    f->st.pinned_bytes = pinned;
    f->st.peak_unsharded_groups = f->nunsharded;
}
