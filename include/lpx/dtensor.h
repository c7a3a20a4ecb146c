/* lpx — the DTensor kind: a tensor distributed over a device mesh.
 *
 * A DTensor is a kind tensor (priority LPX_PRIORITY_DISTRIBUTED) whose
 * shape and dtype are the GLOBAL (logical) ones and whose single inner
 * tensor is this rank's LOCAL tensor, of any kind (dense, float8, nf4, a
 * plugin kind). Its metadata names the mesh (retained, released through
 * the kind's meta_release hook) and one placement per mesh dimension:
 *
 *   Shard(d)      the tensor is cut along dim d with torch.chunk semantics:
 *                 chunk = ceil(n / world) rounded up to the local kind's
 *                 shard_unit (dim 0), rank r holds rows
 *                 [min(r*chunk, n), min((r+1)*chunk, n)): trailing shards
 *                 are smaller or empty. Collectives pad every shard to
 *                 `chunk` on the wire and unpad after.
 *   Replicate     every rank holds the whole tensor.
 *   Partial(op)   every rank holds a full-shape partial value; the logical
 *                 tensor is op over ranks (sum, avg, max, min).
 *
 * Meshes are 1-D (one comm) or 2-D (hybrid sharding: mesh dim 0 replicates
 * over one comm, mesh dim 1 shards over another; two mesh dims may not
 * shard the same tensor dim). docs/SHARDING.md has the long form.
 *
 * All functions return an lpx_status with a message in lpx_last_error()
 * naming the op and argument, hand out new references through `out`
 * pointers (NULL on failure) and never abort on user error. A function
 * that runs collectives must be called by every rank of the mesh, in the
 * same order; a failing peer makes it return LPX_ECOMM/LPX_ETIMEOUT. */
#ifndef LPX_DTENSOR_H
#define LPX_DTENSOR_H

#include <stdbool.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "tensor.h"
#include "kind.h"
#include "comm.h"

LPX_BEGIN_DECLS

#define LPX_MESH_MAX_DIMS 2

/* ---- device mesh --------------------------------------------------- */

typedef struct lpx_mesh lpx_mesh;

/** Creates a 1-D mesh over `comm` (borrowed: the caller keeps the comm
 *  alive and destroys it after the last mesh reference is gone). The mesh
 *  is refcounted: *out holds one reference. Errors: LPX_EINVAL (NULL),
 *  LPX_ENOMEM. */
LPX_API lpx_status lpx_mesh_new(lpx_comm *comm, lpx_mesh **out);
/** Creates a 2-D mesh: mesh dim 0 over `outer` (e.g. the replicas of
 *  hybrid sharding), mesh dim 1 over `inner` (the shard group). Both comms
 *  are borrowed as in lpx_mesh_new. Errors: LPX_EINVAL, LPX_ENOMEM. */
LPX_API lpx_status lpx_mesh_new_2d(lpx_comm *outer, lpx_comm *inner, lpx_mesh **out);
/** Adds one reference; NULL is ignored. Thread-safe. */
LPX_API void lpx_mesh_retain(lpx_mesh *m);
/** Drops one reference; the last frees the mesh (not its comms). */
LPX_API void lpx_mesh_release(lpx_mesh *m);
/** Number of mesh dims (1 or 2; 0 for NULL). */
LPX_API int lpx_mesh_ndim(const lpx_mesh *m);
/** Comm of mesh dim `dim` (borrowed), or NULL when out of range. */
LPX_API lpx_comm *lpx_mesh_comm(const lpx_mesh *m, int dim);
/** Size / this rank's coordinate along mesh dim `dim` (0 / -1 when out of range). */
LPX_API int lpx_mesh_size(const lpx_mesh *m, int dim);
LPX_API int lpx_mesh_rank(const lpx_mesh *m, int dim);
/** Current reference count (tests). */
LPX_API int lpx_mesh_refcount(const lpx_mesh *m);

/* ---- placements ---------------------------------------------------- */

typedef enum lpx_placement_type {
    LPX_PLACEMENT_REPLICATE = 0,
    LPX_PLACEMENT_SHARD = 1,
    LPX_PLACEMENT_PARTIAL = 2
} lpx_placement_type;

typedef struct lpx_placement {
    int32_t type;    /* lpx_placement_type */
    int32_t dim;     /* SHARD: the tensor dim (>= 0) */
    int32_t op;      /* PARTIAL: lpx_reduce_op */
} lpx_placement;

static inline lpx_placement lpx_shard(int dim) { lpx_placement p = {LPX_PLACEMENT_SHARD, dim, 0}; return p; }
static inline lpx_placement lpx_replicate(void) { lpx_placement p = {LPX_PLACEMENT_REPLICATE, 0, 0}; return p; }
static inline lpx_placement lpx_partial(lpx_reduce_op op) { lpx_placement p = {LPX_PLACEMENT_PARTIAL, 0, (int32_t)op}; return p; }

/** torch.chunk geometry of dim size `n` over `world` ranks with shard
 *  boundaries rounded up to multiples of `unit` (>= 1): *chunk = the padded
 *  shard size, rank `rank`'s shard is [*start, *start + *len). Errors:
 *  LPX_EINVAL (world < 1, rank out of range, n < 0, unit < 1). */
LPX_API lpx_status lpx_shard_range(int64_t n, int world, int rank, int64_t unit, int64_t *chunk, int64_t *start,
                                   int64_t *len);

/* ---- DTensor --------------------------------------------------------- */

/** The dtensor kind (registered by lpx_init), or NULL before init. */
LPX_API const lpx_kind *lpx_dtensor_kind(void);
/** True if t is a DTensor. */
LPX_API bool lpx_dtensor_is(const lpx_tensor *t);

/** Wraps this rank's `local` tensor (any kind; retained) into a DTensor
 *  with `placements` (one per mesh dim) and global shape `shape` (ndim
 *  dims). `shape` NULL infers it for Replicate/Partial only (= local's).
 *  The local must have exactly the shard shape the placements give this
 *  rank. No collective. Errors: LPX_EINVAL (NULL, bad placement, nested
 *  DTensor), LPX_ESHAPE (local shape != expected shard shape), LPX_ENOMEM. */
LPX_API lpx_status lpx_dtensor_from_local(lpx_tensor *local, lpx_mesh *mesh, const lpx_placement *placements,
                                          int ndim, const int64_t *shape, lpx_tensor **out);

/** Distributes a tensor that every rank holds in full: Shard(d) keeps this
 *  rank's chunk (lpx_narrow + lpx_clone: the kind's own slicing, NF4 at
 *  whole scaler blocks), Replicate keeps it, Partial(sum) keeps it on
 *  mesh rank 0 and zeros elsewhere, Partial(avg/max/min) keeps it
 *  everywhere. No collective. Errors as lpx_dtensor_from_local, and
 *  those of the kind's narrow/clone. */
LPX_API lpx_status lpx_dtensor_distribute(lpx_tensor *full, lpx_mesh *mesh, const lpx_placement *placements,
                                          lpx_tensor **out);

/** Moves a DTensor to new placements (a new DTensor in *out):
 *  Shard->Replicate all-gather (any local kind with all-gather hooks,
 *  dim 0; dense for other dims), Partial->Replicate all-reduce,
 *  Partial->Shard reduce-scatter, Replicate->Shard local chunk,
 *  Shard(i)->Shard(j) (gather then chunk), Replicate->Partial (no
 *  collective), Partial(a)->Partial(b) through Replicate. Reductions need
 *  dense f32/bf16/f16 locals. Collective: every rank calls it.
 *  Errors: LPX_EINVAL, LPX_ENOTIMPL (a transition the local kind cannot
 *  do, named), LPX_EDTYPE, LPX_ECOMM, LPX_ETIMEOUT, LPX_ENOMEM. */
LPX_API lpx_status lpx_dtensor_redistribute(lpx_tensor *dt, const lpx_placement *placements, lpx_tensor **out);

/** The global tensor on every rank (redistribute to Replicate and unwrap):
 *  of the local's kind (an nf4 local gives an nf4 tensor). Collective. */
LPX_API lpx_status lpx_dtensor_full_tensor(lpx_tensor *dt, lpx_tensor **out);

/** This rank's local tensor (borrowed, valid while dt lives), or NULL. */
LPX_API lpx_tensor *lpx_dtensor_local(const lpx_tensor *dt);
/** The mesh (borrowed), or NULL. */
LPX_API lpx_mesh *lpx_dtensor_mesh(const lpx_tensor *dt);
/** Placement of mesh dim `mesh_dim` into *out. Errors: LPX_EINVAL. */
LPX_API lpx_status lpx_dtensor_placement(const lpx_tensor *dt, int mesh_dim, lpx_placement *out);

LPX_END_DECLS

#endif
