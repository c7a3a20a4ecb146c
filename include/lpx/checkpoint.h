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
 * Both are collective over the engine's mesh and return the same status
 * on every rank. On a 2-D (hybrid) mesh the replicas hold the same
 * shards: replica 0 writes (one file per shard rank), every replica
 * reads; a checkpoint moves between 1-D and 2-D meshes of any sizes.
 *
 * A framework checkpoints its own state with the model's: lpx_fsdp_save_ex
 * takes a JSON object (rank 0's, kept in the index as "user") and named
 * extra tensors of each rank (its data loader, its recipe's histories),
 * committed atomically with the shards; lpx_fsdp_ckpt_open reads them back
 * on any rank, before or after an engine exists. lpx_fsdp_export writes the
 * consolidated model (one safetensors file, names of the caller's choosing)
 * with every rank writing its own rows: no rank gathers the model. */
#ifndef LPX_CHECKPOINT_H
#define LPX_CHECKPOINT_H

#include "export.h"
#include "status.h"
#include "fsdp.h"
#include "safetensors.h"

LPX_BEGIN_DECLS

/** Saves engine f (after lpx_fsdp_shard, no group unsharded) to directory
 *  `dir` ("ck/" and "ck" are one), replacing a previous checkpoint there
 *  atomically. It replaces only what lpx_fsdp_save_check accepts (a
 *  directory whose index names every file in it), works in "<dir>.tmp",
 *  removes only files it writes and never follows a symbolic link.
 *  Readers of the previous checkpoint (lpx_fsdp_load, an open
 *  lpx_fsdp_ckpt) are waited for, up to 60 s, before it is replaced.
 *  Collective. Errors: LPX_EINVAL (NULL, not sharded, a group unsharded,
 *  dir refused by lpx_fsdp_save_check), LPX_EIO (naming the file and
 *  errno; another save into dir running; readers past the wait),
 *  LPX_ECOMM, LPX_ENOMEM; every rank returns an error if one rank failed. */
LPX_API lpx_status lpx_fsdp_save(lpx_fsdp *f, const char *dir);

/** Checks, touching nothing, that lpx_fsdp_save may write `dir`: its
 *  parent a writable directory; dir absent, empty or a whole lpx
 *  checkpoint (a valid index that names every file in it, each a regular
 *  file), not a symbolic link; "<dir>.tmp" and "<dir>.old" absent or
 *  holding only files a save writes. Call it before a long run so a bad
 *  output path fails first, not last. Errors: LPX_EINVAL naming the path
 *  and the file that is not the save's, LPX_EIO. */
LPX_API lpx_status lpx_fsdp_save_check(const char *dir);

/** Loads the checkpoint in `dir` into engine f (after lpx_fsdp_shard, with
 *  the same groups and parameters as the saved one; any world size):
 *  parameters in place, AdamW state replaced. Collective. Errors:
 *  LPX_EINVAL (NULL, not sharded, a malformed index, a
 *  parameter missing or of another shape, dtype or kind: the message names
 *  it), LPX_EIO (a missing file, one of another size), LPX_ENOTIMPL (a kind
 *  tensor without a master or all-gather hooks whose shards changed),
 *  LPX_ECOMM, LPX_ENOMEM; LPX_EIO when a save is committing to dir for
 *  over 60 s, or when the ranks read two different checkpoints (a save
 *  committed between their reads: nothing is loaded from a mix). The
 *  directory is share-locked while it is read, so a save waits. On
 *  error the engine's state is unspecified (reload or rebuild it). */
LPX_API lpx_status lpx_fsdp_load(lpx_fsdp *f, const char *dir);

/** lpx_fsdp_load verifies the checksum of every file it opens (one read of
 *  the file); with this flag it checks sizes only. */
#define LPX_FSDP_CKPT_NO_VERIFY 1u

/** What a save adds to the engine's state, and how a load reads. Zero
 *  fields are defaults; struct_size = sizeof the struct (appended fields
 *  keep older callers working). */
typedef struct lpx_fsdp_ckpt_opts {
    size_t struct_size;
    /** rank 0's: the text of a JSON object (at most 64 MiB) kept in the
     *  index as "user"; other ranks' are ignored. NULL: none. */
    const char *user_json;
    /** this rank's extra tensors (dense or of any kind, any device) under
     *  names unique across all ranks (at most 255 bytes; a name two ranks
     *  use is refused naming both ranks); borrowed for the call. On a 2-D
     *  mesh only replica 0's ranks may give them (the others' are refused). */
    int nextra;
    const char *const *extra_names;
    lpx_tensor *const *extra;
    /** LPX_FSDP_CKPT_* flags */
    unsigned flags;
} lpx_fsdp_ckpt_opts;

/** lpx_fsdp_save with a user object and extra tensors (opts may be NULL).
 *  Errors as lpx_fsdp_save, and LPX_EINVAL for a user text that is not a
 *  JSON object, a bad or duplicated extra name. */
LPX_API lpx_status lpx_fsdp_save_ex(lpx_fsdp *f, const char *dir, const lpx_fsdp_ckpt_opts *opts);

/** lpx_fsdp_load with flags (opts may be NULL; its user and extra fields
 *  are ignored: read them with lpx_fsdp_ckpt_open). A file whose checksum
 *  differs from the index is refused (LPX_EIO naming it) unless
 *  LPX_FSDP_CKPT_NO_VERIFY. A dense parameter and a wrapper kind's master
 *  (a float8_weight) load into each other: a checkpoint of one recipe
 *  resumes under another that keeps f32 masters. */
LPX_API lpx_status lpx_fsdp_load_ex(lpx_fsdp *f, const char *dir, const lpx_fsdp_ckpt_opts *opts);

/** A checkpoint directory opened for reading its index, user object and
 *  extra tensors; needs no engine and no comm (any rank, any process). */
typedef struct lpx_fsdp_ckpt lpx_fsdp_ckpt;

/** Opens the checkpoint in `dir` (reading "<dir>.old" where an interrupted
 *  commit left only that). *out is owned by the caller (lpx_fsdp_ckpt_close).
 *  Errors: LPX_EINVAL (NULL, a malformed index), LPX_EIO (no index: not a
 *  checkpoint), LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_ckpt_open(const char *dir, lpx_fsdp_ckpt **out);

/** The world size the checkpoint was saved with. */
LPX_API int lpx_fsdp_ckpt_world(const lpx_fsdp_ckpt *c);

/** The user object's JSON text (owned by c), or NULL if the save had none. */
LPX_API const char *lpx_fsdp_ckpt_user(const lpx_fsdp_ckpt *c);

/** The extra tensor saved under `name` (a new reference, on the CPU; a
 *  view of the mapped file: writable, the file never changes). The file
 *  holding it is verified as lpx_fsdp_load does (size, checksum unless
 *  `flags` has LPX_FSDP_CKPT_NO_VERIFY). Errors: LPX_ENOTFOUND (no such
 *  extra), LPX_EIO (its file missing, of another size or checksum),
 *  LPX_EINVAL, LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_ckpt_extra(lpx_fsdp_ckpt *c, const char *name, unsigned flags, lpx_tensor **out);

/** What the checkpoint records of one parameter (strings owned by c). */
typedef struct lpx_fsdp_ckpt_param_info {
    const char *key;      /* "<group>/<i>/<name>" */
    const char *name;     /* the parameter's name (the key's last part) */
    int ndim;
    int64_t shape[8];     /* global shape */
    lpx_dtype dtype;      /* logical dtype */
    const char *kind;     /* "" for a dense parameter */
    int64_t unit;         /* shard unit (rows) */
    bool frozen;          /* saved without AdamW state */
} lpx_fsdp_ckpt_param_info;

/** The number of parameters the checkpoint holds. */
LPX_API int lpx_fsdp_ckpt_param_count(const lpx_fsdp_ckpt *c);

/** Parameter i (0 <= i < lpx_fsdp_ckpt_param_count) into *out, so a
 *  framework can check a checkpoint against the model it is about to
 *  build. Errors: LPX_EINVAL (NULL, i out of range, a malformed entry:
 *  the message names it). */
LPX_API lpx_status lpx_fsdp_ckpt_param(const lpx_fsdp_ckpt *c, int i, lpx_fsdp_ckpt_param_info *out);

/** Closes c (NULL is fine); tensors read from it stay valid. */
LPX_API void lpx_fsdp_ckpt_close(lpx_fsdp_ckpt *c);

/** Names a parameter in an export: writes the output name of parameter i
 *  of group g (whose engine key is "<group>/<i>/<name>") into buf (len
 *  bytes) and returns true, or returns false to leave it out. */
typedef bool (*lpx_fsdp_export_name_fn)(void *ctx, lpx_fsdp_group *g, int i, char *buf, size_t len);

/** Writes the consolidated model to the safetensors file `path`: every
 *  parameter name() keeps (NULL: all, under their engine keys) at its
 *  global shape in `dtype` (LPX_F32 or LPX_BF16; round to nearest even),
 *  dense values (a wrapper kind's master, other kinds dequantized), with
 *  `nmeta` metadata pairs. Rank 0 sizes the file and writes its header;
 *  every rank then writes the bytes of its own rows at their offsets
 *  (pwrite) and syncs them; rank 0 renames the finished file over `path`
 *  (atomic: `path` is the old file or the whole new one). No rank holds
 *  more than one shard at a time. Collective. Errors: LPX_EINVAL (NULL,
 *  dtype, two parameters given one name, not sharded), LPX_EIO (naming
 *  the file), LPX_ECOMM, LPX_ENOMEM; the same on every rank. */
LPX_API lpx_status lpx_fsdp_export(lpx_fsdp *f, const char *path, lpx_dtype dtype, lpx_fsdp_export_name_fn name,
                                   void *ctx, int nmeta, const lpx_safetensors_kv *meta);

/** lpx_fsdp_export_ex flag: also write AdamW's moments of every exported
 *  trainable parameter, dequantized to f32 (then cast to `dtype`) at the
 *  parameter's global shape, as "<name>.exp_avg" and "<name>.exp_avg_sq"
 *  after it (zeros before the first step; low-precision states of
 *  lpx_fsdp_group_set_optim through lpx_fsdp_param_adamw_state). */
#define LPX_FSDP_EXPORT_OPTIM_STATE 1u

/** lpx_fsdp_export with flags (LPX_FSDP_EXPORT_*; 0: lpx_fsdp_export).
 *  Errors as lpx_fsdp_export, and LPX_EINVAL for unknown flag bits. */
LPX_API lpx_status lpx_fsdp_export_ex(lpx_fsdp *f, const char *path, lpx_dtype dtype, lpx_fsdp_export_name_fn name,
                                      void *ctx, int nmeta, const lpx_safetensors_kv *meta, unsigned flags);

/** The inverse of lpx_fsdp_export: every rank reads only its own rows of
 *  each parameter name() keeps (NULL: all, under their engine keys) from
 *  the consolidated safetensors files `files` (opened by the caller:
 *  memory-mapped, so a rank touches only the pages of its rows), casts them
 *  to the shard's dtype (round to nearest even) and copies them into its
 *  local shard, or a wrapper kind's master. Needs each tensor at the
 *  parameter's global shape, dense f32, bf16 or f16, in one of the files.
 *  A kind without a dense master (NF4) cannot be cut from rows: refused
 *  (quantize the whole tensor instead). AdamW state is left alone.
 *  Collective (the same status on every rank). Errors: LPX_EINVAL (NULL,
 *  a missing tensor or another shape or dtype: the message names it),
 *  LPX_ENOTIMPL (a kind without a master), LPX_ECOMM, LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_import(lpx_fsdp *f, int nfiles, lpx_safetensors *const *files,
                                   lpx_fsdp_export_name_fn name, void *ctx);

LPX_END_DECLS

#endif
