/* Device meshes: a refcounted list of 1 or 2 borrowed comms. DTensors
 * retain their mesh through their metadata blob, so a mesh lives as long
 * as any tensor placed on it; the comms stay the caller's. */
#include <stdatomic.h>
#include "dtensor_internal.h"

struct lpx_mesh {
    atomic_int refcount;
    int ndim;
    bool owns_comms;   /* dt_mesh_new_solo: the mesh destroys its comm */
    lpx_comm *comm[LPX_MESH_MAX_DIMS];
};

static lpx_status mesh_make(int ndim, lpx_comm *const *comms, lpx_mesh **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_mesh_new: out is NULL");
    *out = NULL;
    for (int d = 0; d < ndim; d++)
        if (!comms[d]) return lpx_error(LPX_EINVAL, "lpx_mesh_new: comm of mesh dim %d is NULL", d);
    lpx_mesh *m = lpx_calloc(1, sizeof *m);
    if (!m) return lpx_error(LPX_ENOMEM, "lpx_mesh_new: cannot allocate the mesh");
    atomic_init(&m->refcount, 1);
    m->ndim = ndim;
    for (int d = 0; d < ndim; d++) m->comm[d] = comms[d];
    *out = m;
    return LPX_OK;
}

lpx_status lpx_mesh_new(lpx_comm *comm, lpx_mesh **out)
{
    return mesh_make(1, &comm, out);
}

lpx_status lpx_mesh_new_2d(lpx_comm *outer, lpx_comm *inner, lpx_mesh **out)
{
    lpx_comm *c[2] = {outer, inner};
    return mesh_make(2, c, out);
}

lpx_status dt_mesh_new_solo(const char *op, lpx_mesh **out)
{
    *out = NULL;
    lpx_comm *c = NULL;
    lpx_status st = lpx_local_comm_group_create(1, &c);
    if (st) return dt_prefix(st, "%s: creating a one-rank comm", op);
    if ((st = mesh_make(1, &c, out))) {
        lpx_comm_destroy(c);
        return st;
    }
    (*out)->owns_comms = true;
    return LPX_OK;
}

void lpx_mesh_retain(lpx_mesh *m)
{
    if (m) atomic_fetch_add_explicit(&m->refcount, 1, memory_order_relaxed);
}

void lpx_mesh_release(lpx_mesh *m)
{
    if (!m || atomic_fetch_sub_explicit(&m->refcount, 1, memory_order_acq_rel) != 1) return;
    if (m->owns_comms)
        for (int d = 0; d < m->ndim; d++) lpx_comm_destroy(m->comm[d]);
    lpx_free(m);
}

int lpx_mesh_ndim(const lpx_mesh *m) { return m ? m->ndim : 0; }
lpx_comm *lpx_mesh_comm(const lpx_mesh *m, int dim) { return m && dim >= 0 && dim < m->ndim ? m->comm[dim] : NULL; }
int lpx_mesh_size(const lpx_mesh *m, int dim) { return m && dim >= 0 && dim < m->ndim ? lpx_comm_size(m->comm[dim]) : 0; }
int lpx_mesh_rank(const lpx_mesh *m, int dim) { return m && dim >= 0 && dim < m->ndim ? lpx_comm_rank(m->comm[dim]) : -1; }
int lpx_mesh_refcount(const lpx_mesh *m) { return m ? atomic_load(&m->refcount) : 0; }

lpx_status lpx_shard_range(int64_t n, int world, int rank, int64_t unit, int64_t *chunk, int64_t *start, int64_t *len)
{
    if (world < 1 || rank < 0 || rank >= world || n < 0 || unit < 1 || !chunk || !start || !len)
        return lpx_error(LPX_EINVAL, "lpx_shard_range: n %lld, world %d, rank %d, unit %lld out of range",
                         (long long)n, world, rank, (long long)unit);
    /* torch.chunk: ceil(n / world), then whole units so a kind's blocks
     * never straddle two ranks */
    int64_t c = (n + world - 1) / world;
    c = (c + unit - 1) / unit * unit;
    int64_t s = c * rank < n ? c * rank : n;
    int64_t e = c * (rank + 1) < n ? c * (rank + 1) : n;
    *chunk = c;
    *start = s;
    *len = e - s;
    return LPX_OK;
}
