/* Shared definitions of the dtensor kind and the sharding engine (not
 * installed). The code talks to tensors through the public API and to
 * other kinds only through their vtables; liblpx internals are used for
 * allocation only. */
#ifndef LPX_DTENSOR_INTERNAL_H
#define LPX_DTENSOR_INTERNAL_H

#include "../kind_author.h"
#include "lpx/dtensor.h"
#include "lpx/fsdp.h"

#define DT_META_MAGIC 0x4E535444u /* "DTSN" */

/* Metadata blob of a DTensor: a retained mesh pointer (released by the
 * kind's meta_release) and one placement per mesh dim. The pointer makes
 * the blob unserializable, so the kind's unflatten refuses. */
typedef struct dt_meta {
    uint32_t magic;
    int32_t nmesh;
    lpx_mesh *mesh;
    lpx_placement pl[LPX_MESH_MAX_DIMS];
} dt_meta;

extern const lpx_kind *dt__kind;

static inline const dt_meta *dt_meta_of(const lpx_tensor *t)
{
    return (const dt_meta *)lpx_tensor_meta(t, NULL);
}

/* Builds a DTensor (local retained, mesh retained) without checking the
 * local's shape against the placements (callers computed it). */
lpx_status dt_make(lpx_tensor *local, lpx_mesh *mesh, const lpx_placement *pl, int ndim, const int64_t *shape,
                   lpx_dtype dtype, lpx_tensor **out);

/* A 1-D mesh over a new one-rank local comm that the mesh owns (destroyed
 * with the last reference): what from_dense places a dense tensor on, so
 * a DTensor made without any comm is self-contained. A one-rank comm has
 * no peer to wait for, so any thread may drive it. */
lpx_status dt_mesh_new_solo(const char *op, lpx_mesh **out);

/* Checks placements against a mesh and a tensor rank; `op` names the caller. */
lpx_status dt_check_placements(const char *op, const lpx_mesh *mesh, const lpx_placement *pl, int ndim);

/* Shard unit of a tensor's dim 0 through its kind's shard_unit (1: dense). */
int64_t dt_shard_unit(const lpx_tensor *t, int dim);

/* The shape this rank holds of `shape` under `pl` over `mesh`; unit is
 * the dim-0 shard unit. */
void dt_local_shape(const lpx_mesh *mesh, const lpx_placement *pl, int ndim, const int64_t *shape, int64_t unit,
                    int64_t *local);

/* This rank's chunk of `full` along `dim` over a world of `world` ranks
 * at position `rank` (lpx_narrow, then lpx_clone so the shard owns its
 * storage; the view is kept when the kind has no clone). */
lpx_status dt_chunk(const char *op, lpx_tensor *full, int dim, int world, int rank, lpx_tensor **out);
/* dt_chunk with an explicit unit (a multiple of the kind's: the engine's
 * shards of params with low-precision optimizer state) */
lpx_status dt_chunk_unit(const char *op, lpx_tensor *full, int dim, int world, int rank, int64_t unit,
                         lpx_tensor **out);

/* ---- gathering kind tensors along dim 0 (dtensor_gather.c) ----------- */

/* What one rank puts on the wire for one tensor: the hook's inputs'
 * dtypes and shapes. Fixed-size so a table of them can be all-gathered. */
typedef struct dt_wire_desc {
    int32_t ninputs;
    int32_t ndim[LPX_MAX_AG_INPUTS];
    int32_t dtype[LPX_MAX_AG_INPUTS];
    int64_t shape[LPX_MAX_AG_INPUTS][LPX_MAX_DIMS];
} dt_wire_desc;

/* Bytes of input i of a descriptor / of all its inputs, each rounded up
 * to 16 so every input starts aligned. */
size_t dt_wire_input_bytes(const dt_wire_desc *d, int i);
size_t dt_wire_bytes(const dt_wire_desc *d);

/* The pre_all_gather step of one tensor: dense tensors put themselves on
 * the wire (contiguous), kind tensors call their hook with `ctx`. Fills
 * inputs (new references), *n, meta and the descriptor. */
lpx_status dt_pre_gather(const char *op, const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *n,
                         unsigned char *meta, size_t *meta_size, dt_wire_desc *desc);

/* Copies inputs into dst (desc's layout, 16-byte aligned pieces). */
void dt_pack(const dt_wire_desc *desc, lpx_tensor *const *inputs, unsigned char *dst);

/* Builds outputs[i] = concat over ranks r of the piece of input i found
 * at recv + r * stride + offset with descs[r]'s shape. When outs_prev[i]
 * is given and has the right size it is refilled instead of allocated. */
lpx_status dt_unpack(const char *op, const unsigned char *recv, size_t stride, size_t offset,
                     const dt_wire_desc *descs, int world, lpx_tensor **outputs);
/* dt_unpack with recv in the memory of `dev` and the outputs made there
 * (a device: the pieces move with its backend's device-to-device copy). */
lpx_status dt_unpack_on(const char *op, const unsigned char *recv, size_t stride, size_t offset,
                        const dt_wire_desc *descs, int world, lpx_device dev, lpx_tensor **outputs);

/* The post_all_gather step: dense params take outputs[0] as the result
 * (retained); kind tensors call their hook (with `prev` as out when
 * given). */
lpx_status dt_post_gather(const char *op, const lpx_kind *kind, lpx_tensor *const *outputs, int n,
                          const unsigned char *meta, size_t meta_size, lpx_dtype dtype, lpx_tensor *prev,
                          lpx_tensor **result);

/* All-gathers `shard` (any kind with hooks, or dense) along dim 0 over
 * comm: one small all-gather of the wire descriptors, one of the payload. */
lpx_status dt_gather_dim0(const char *op, lpx_comm *comm, const lpx_tensor *shard, lpx_tensor **out);

/* Aborts comm with this thread's current message (so peers waiting for a
 * collective this rank will not reach fail at once) and returns st with
 * the message kept. */
lpx_status dt_abort(lpx_comm *comm, lpx_status st);

/* Returns st with "<prefix>: <current message>" as the message (the
 * current message is copied first: lpx_error's buffer is the one
 * lpx_last_error() points to). */
lpx_status dt_prefix(lpx_status st, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
