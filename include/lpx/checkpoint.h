/* lpx — sharded checkpoints of the sharding engine (docs/CHECKPOINT.md).
 *
 * lpx_fsdp_save: every rank writes the shards it owns (its local shard of
 * every parameter, dense or of any kind through the kind's flattening,
 * and AdamW's moments and step) to its own safetensors file; rank 0 then
 * writes index.json (the model's parameters with global shape, dtype,
 * kind and shard unit, and every file's size and checksum) and the
 * directory is committed atomically: a crash of any rank at any moment
 * leaves the previous checkpoint complete.
 *
 * lpx_fsdp_load: any world size reads it. Each rank opens only the files
 * that hold rows of its new shards (memory-mapped: it touches only those
 * rows) and copies them in: dense parameters, wrapper kinds (their
 * master), AdamW state; kind tensors without a master (NF4, blockwise
 * float8) are re-cut at their shard unit through the kind's own
 * all-gather hooks (a kind without hooks loads only where its shards did
 * not move: LPX_ENOTIMPL naming the parameter otherwise).
 *
 * Both are collective over the engine's shard comm (1-D meshes; a 2-D
 * mesh is refused for now) and return the same status on every rank. */
#ifndef LPX_CHECKPOINT_H
#define LPX_CHECKPOINT_H

#include "export.h"
#include "status.h"
#include "fsdp.h"

LPX_BEGIN_DECLS

/** Saves engine f (after lpx_fsdp_shard, no group unsharded) to directory
 *  `dir`, replacing a previous checkpoint there atomically (a directory
 *  that is neither empty nor an lpx checkpoint is refused). Collective.
 *  Errors: LPX_EINVAL (NULL, not sharded, a group unsharded, a 2-D mesh,
 *  dir not a checkpoint), LPX_EIO (naming the file and errno), LPX_ECOMM,
 *  LPX_ENOMEM; every rank returns an error if one rank failed. */
LPX_API lpx_status lpx_fsdp_save(lpx_fsdp *f, const char *dir);

/** Loads the checkpoint in `dir` into engine f (after lpx_fsdp_shard, with
 *  the same groups and parameters as the saved one; any world size):
 *  parameters in place, AdamW state replaced. Collective. Errors:
 *  LPX_EINVAL (NULL, not sharded, a 2-D mesh, a malformed index, a
 *  parameter missing or of another shape, dtype or kind: the message names
 *  it), LPX_EIO (a missing file, one of another size), LPX_ENOTIMPL (a kind
 *  tensor without a master or all-gather hooks whose shards changed),
 *  LPX_ECOMM, LPX_ENOMEM. On
 *  error the engine's state is unspecified (reload or rebuild it). */
LPX_API lpx_status lpx_fsdp_load(lpx_fsdp *f, const char *dir);

LPX_END_DECLS

#endif
