/* The dtensor kind: registration, construction, inspection.
 *
 * A DTensor is a kind tensor with the GLOBAL shape and dtype, one inner
 * tensor (this rank's local tensor, of any kind) and a dt_meta blob that
 * holds a retained mesh pointer. The kind's meta_release drops that
 * reference, so meshes are freed with the last tensor placed on them. */
#include <string.h>
#include "dtensor_internal.h"

const lpx_kind *dt__kind;

const lpx_kind *lpx_dtensor_kind(void)
{
    if (lpx_ensure_init()) return NULL;
    return dt__kind;
}

bool lpx_dtensor_is(const lpx_tensor *t) { return t && dt__kind && lpx_tensor_kind(t) == dt__kind; }

lpx_tensor *lpx_dtensor_local(const lpx_tensor *dt) { return lpx_dtensor_is(dt) ? lpx_tensor_inner(dt, 0) : NULL; }

lpx_mesh *lpx_dtensor_mesh(const lpx_tensor *dt) { return lpx_dtensor_is(dt) ? dt_meta_of(dt)->mesh : NULL; }

lpx_status lpx_dtensor_placement(const lpx_tensor *dt, int mesh_dim, lpx_placement *out)
{
    if (!lpx_dtensor_is(dt) || !out) return lpx_error(LPX_EINVAL, "lpx_dtensor_placement: not a DTensor or out NULL");
    const dt_meta *m = dt_meta_of(dt);
    if (mesh_dim < 0 || mesh_dim >= m->nmesh)
        return lpx_error(LPX_EINVAL, "lpx_dtensor_placement: mesh dim %d out of range 0..%d", mesh_dim, m->nmesh - 1);
    *out = m->pl[mesh_dim];
    return LPX_OK;
}

int64_t dt_shard_unit(const lpx_tensor *t, int dim)
{
    const lpx_kind *k = lpx_tensor_kind(t);
    if (dim != 0 || !k) return 1;
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    int64_t u = vt->shard_unit ? vt->shard_unit(t) : 1;
    return u > 0 ? u : 1;
}

lpx_status dt_check_placements(const char *op, const lpx_mesh *mesh, const lpx_placement *pl, int ndim)
{
    if (!mesh || !pl) return lpx_error(LPX_EINVAL, "%s: mesh or placements is NULL", op);
    int nm = lpx_mesh_ndim(mesh);
    for (int i = 0; i < nm; i++) {
        switch (pl[i].type) {
        case LPX_PLACEMENT_REPLICATE: break;
        case LPX_PLACEMENT_SHARD:
            if (pl[i].dim < 0 || pl[i].dim >= ndim)
                return lpx_error(LPX_EINVAL, "%s: placement %d is Shard(%d) of a %d-D tensor", op, i, (int)pl[i].dim,
                                 ndim);
            for (int j = 0; j < i; j++)
                if (pl[j].type == LPX_PLACEMENT_SHARD && pl[j].dim == pl[i].dim)
                    return lpx_error(LPX_ENOTIMPL, "%s: mesh dims %d and %d both shard tensor dim %d (nested "
                                     "sharding is not supported)", op, j, i, (int)pl[i].dim);
            break;
        case LPX_PLACEMENT_PARTIAL:
            if (pl[i].op < 0 || pl[i].op >= LPX_REDUCE_OP_COUNT)
                return lpx_error(LPX_EINVAL, "%s: placement %d is Partial(%d), not an lpx_reduce_op", op, i,
                                 (int)pl[i].op);
            break;
        default: return lpx_error(LPX_EINVAL, "%s: placement %d has unknown type %d", op, i, (int)pl[i].type);
        }
    }
    return LPX_OK;
}

void dt_local_shape(const lpx_mesh *mesh, const lpx_placement *pl, int ndim, const int64_t *shape, int64_t unit,
                    int64_t *local)
{
    memcpy(local, shape, (size_t)ndim * sizeof *local);
    for (int i = 0; i < lpx_mesh_ndim(mesh); i++) {
        if (pl[i].type != LPX_PLACEMENT_SHARD) continue;
        int d = pl[i].dim;
        int64_t c, s, l;
        lpx_shard_range(local[d], lpx_mesh_size(mesh, i), lpx_mesh_rank(mesh, i), d == 0 ? unit : 1, &c, &s, &l);
        local[d] = l;
    }
}

lpx_status dt_make(lpx_tensor *local, lpx_mesh *mesh, const lpx_placement *pl, int ndim, const int64_t *shape,
                   lpx_dtype dtype, lpx_tensor **out)
{
    dt_meta m;
    memset(&m, 0, sizeof m);
    m.magic = DT_META_MAGIC;
    m.nmesh = lpx_mesh_ndim(mesh);
    m.mesh = mesh;
    for (int i = 0; i < m.nmesh; i++) m.pl[i] = pl[i];
    lpx_mesh_retain(mesh);
    lpx_status st = lpx_tensor_new_kind(dt__kind, dtype, ndim, shape, lpx_tensor_device(local), &local, 1, &m,
                                        sizeof m, out);
    if (st) lpx_mesh_release(mesh); /* no tensor: meta_release will not run */
    return st;
}

lpx_status lpx_dtensor_from_local(lpx_tensor *local, lpx_mesh *mesh, const lpx_placement *placements, int ndim,
                                  const int64_t *shape, lpx_tensor **out)
{
    const char *op = "lpx_dtensor_from_local";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!local) return lpx_error(LPX_EINVAL, "%s: local is NULL", op);
    if (lpx_dtensor_is(local)) return lpx_error(LPX_EINVAL, "%s: local is already a DTensor", op);
    if (!shape) {
        ndim = lpx_tensor_ndim(local);
        shape = lpx_tensor_shape(local);
        for (int i = 0; i < lpx_mesh_ndim(mesh); i++)
            if (placements && placements[i].type == LPX_PLACEMENT_SHARD)
                return lpx_error(LPX_EINVAL, "%s: a Shard placement needs the global shape", op);
    }
    if (ndim != lpx_tensor_ndim(local))
        return lpx_error(LPX_ESHAPE, "%s: global shape has %d dims, local %d", op, ndim, lpx_tensor_ndim(local));
    if ((st = dt_check_placements(op, mesh, placements, ndim))) return st;
    int64_t want[LPX_MAX_DIMS];
    /* the unit is the local's (a shard of an nf4 tensor has the same row
     * blocks as the whole) */
    dt_local_shape(mesh, placements, ndim, shape, dt_shard_unit(local, 0), want);
    for (int d = 0; d < ndim; d++)
        if (want[d] != lpx_tensor_shape(local)[d]) {
            char b[128];
            return lpx_error(LPX_ESHAPE, "%s: local shape %s, but the placements give this rank %lld along dim %d", op,
                             lpx_tensor_shape_str(local, b, sizeof b), (long long)want[d], d);
        }
    return dt_make(local, mesh, placements, ndim, shape, lpx_tensor_dtype(local), out);
}

lpx_status dt_chunk(const char *op, lpx_tensor *full, int dim, int world, int rank, lpx_tensor **out)
{
    return dt_chunk_unit(op, full, dim, world, rank, dt_shard_unit(full, dim), out);
}

lpx_status dt_chunk_unit(const char *op, lpx_tensor *full, int dim, int world, int rank, int64_t unit,
                         lpx_tensor **out)
{
    int64_t c, s, l;
    lpx_status st = lpx_shard_range(lpx_tensor_shape(full)[dim], world, rank, unit, &c, &s, &l);
    if (st) return st;
    lpx_tensor *v = NULL;
    if (!lpx_tensor_kind(full) && (l == 0 || lpx_tensor_numel(full) == 0)) {
        /* an empty dense shard: a fresh tensor (a view at an offset into
         * an empty storage is refused by the bounds check) */
        int64_t sh[LPX_MAX_DIMS];
        memcpy(sh, lpx_tensor_shape(full), (size_t)lpx_tensor_ndim(full) * sizeof *sh);
        sh[dim] = l;
        return lpx_empty(lpx_tensor_ndim(full), sh, lpx_tensor_dtype(full), lpx_tensor_device(full), out);
    }
    if ((st = lpx_narrow(full, dim, s, l, &v)))
    {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        return lpx_error(st, "%s: narrow of dim %d [%lld, +%lld) of a %s tensor: %s", op, dim, (long long)s,
                         (long long)l, lpx_tensor_kind(full) ? lpx_kind_name(lpx_tensor_kind(full)) : "dense", msg);
    }
    /* a shard owns its storage, so the full tensor can be freed */
    st = lpx_clone(v, out);
    if (st == LPX_ENOTIMPL) {
        lpx_clear_error();
        *out = v;
        return LPX_OK;
    }
    lpx_tensor_release(v);
    return st;
}

lpx_status lpx_dtensor_distribute(lpx_tensor *full, lpx_mesh *mesh, const lpx_placement *placements, lpx_tensor **out)
{
    const char *op = "lpx_dtensor_distribute";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!full || lpx_dtensor_is(full)) return lpx_error(LPX_EINVAL, "%s: full is NULL or a DTensor", op);
    int ndim = lpx_tensor_ndim(full);
    if ((st = dt_check_placements(op, mesh, placements, ndim))) return st;
    lpx_tensor *cur = full;
    lpx_tensor_retain(cur);
    for (int i = 0; i < lpx_mesh_ndim(mesh) && !st; i++) {
        lpx_tensor *next = NULL;
        const lpx_placement *p = &placements[i];
        if (p->type == LPX_PLACEMENT_SHARD) {
            st = dt_chunk(op, cur, p->dim, lpx_mesh_size(mesh, i), lpx_mesh_rank(mesh, i), &next);
        } else if (p->type == LPX_PLACEMENT_PARTIAL && p->op == LPX_REDUCE_SUM && lpx_mesh_rank(mesh, i) != 0) {
            if (lpx_tensor_kind(cur))
                st = lpx_error(LPX_ENOTIMPL, "%s: Partial(sum) of a %s tensor (partials must be dense)", op,
                               lpx_kind_name(lpx_tensor_kind(cur)));
            else
                st = lpx_zeros(ndim, lpx_tensor_shape(cur), lpx_tensor_dtype(cur), lpx_tensor_device(cur), &next);
        } else {
            next = cur;
            lpx_tensor_retain(next);
        }
        lpx_tensor_release(cur);
        cur = next;
    }
    if (!st) st = dt_make(cur, mesh, placements, ndim, lpx_tensor_shape(full), lpx_tensor_dtype(full), out);
    lpx_tensor_release(cur);
    return st;
}

lpx_status lpx_dtensor_full_tensor(lpx_tensor *dt, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_dtensor_full_tensor: out is NULL");
    *out = NULL;
    if (!lpx_dtensor_is(dt)) return lpx_error(LPX_EINVAL, "lpx_dtensor_full_tensor: dt is not a DTensor");
    lpx_placement rep[LPX_MESH_MAX_DIMS] = {lpx_replicate(), lpx_replicate()};
    lpx_tensor *r = NULL;
    lpx_status st = lpx_dtensor_redistribute(dt, rep, &r);
    if (st) return st;
    *out = lpx_dtensor_local(r);
    lpx_tensor_retain(*out);
    lpx_tensor_release(r);
    return LPX_OK;
}

/* ---- vtable ------------------------------------------------------- */

static void dt_meta_release(void *meta, size_t size)
{
    if (size == sizeof(dt_meta)) lpx_mesh_release(((dt_meta *)meta)->mesh);
}

static lpx_status dt_unflatten(const lpx_kind *kind, lpx_dtype dtype, int ndim, const int64_t *shape,
                               lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                               lpx_tensor **out)
{
    (void)kind; (void)dtype; (void)ndim; (void)shape; (void)inner; (void)ninner; (void)meta; (void)meta_size;
    if (out) *out = NULL;
    /* the blob holds a process-local mesh pointer: never trust one */
    return lpx_error(LPX_ENOTIMPL, "dtensor unflatten: a DTensor's mesh cannot be serialized; save its local "
                     "tensor and rebuild with lpx_dtensor_from_local");
}

static const char *pl_str(const lpx_placement *p, char *b, size_t n)
{
    if (p->type == LPX_PLACEMENT_SHARD) snprintf(b, n, "S(%d)", (int)p->dim);
    else if (p->type == LPX_PLACEMENT_PARTIAL) snprintf(b, n, "P(%s)", lpx_reduce_op_name((lpx_reduce_op)p->op));
    else snprintf(b, n, "R");
    return b;
}

static int dt_describe(const lpx_tensor *t, char *buf, size_t len)
{
    if (!buf || !len) return 0;
    const dt_meta *m = dt_meta_of(t);
    char sh[128], a[32], b[32], lsh[128];
    lpx_tensor *loc = lpx_tensor_inner(t, 0);
    int n = snprintf(buf, len, "dtensor %s %s mesh=%dx%d [%s%s%s] local=%s %s", lpx_tensor_shape_str(t, sh, sizeof sh),
                     lpx_dtype_name(lpx_tensor_dtype(t)), lpx_mesh_size(m->mesh, 0),
                     m->nmesh > 1 ? lpx_mesh_size(m->mesh, 1) : 1, pl_str(&m->pl[0], a, sizeof a),
                     m->nmesh > 1 ? "," : "", m->nmesh > 1 ? pl_str(&m->pl[1], b, sizeof b) : "",
                     lpx_tensor_kind(loc) ? lpx_kind_name(lpx_tensor_kind(loc)) : "dense",
                     lpx_tensor_shape_str(loc, lsh, sizeof lsh));
    return n < 0 ? 0 : n;
}

lpx_status dt_register_handlers(int key);
void dt_fill_vtable(lpx_kind_i *vt);
lpx_status dt_register_view_handlers(int key);

lpx_status lpx_dtensor_register_kind(void)
{
    lpx_kind_i vt;
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.abi_version = LPX_KIND_ABI_VERSION;
    vt.name = "dtensor";
    vt.priority = LPX_PRIORITY_DISTRIBUTED;
    vt.unflatten = dt_unflatten;
    vt.describe = dt_describe;
    vt.meta_release = dt_meta_release;
    dt_fill_vtable(&vt); /* from/to_dense, shard_unit, all-gather hooks (dtensor_hooks.c) */
    const lpx_kind *k = NULL;
    lpx_status st = lpx_kind_register(&vt, &k);
    if (st) return st;
    dt__kind = k;
    st = dt_register_handlers(lpx_kind_key(k));
    if (!st) st = dt_register_view_handlers(lpx_kind_key(k));
    return st;
}
