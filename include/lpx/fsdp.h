/* lpx — the sharding engine (FSDP2-style fully_shard).
 *
 * The engine moves bytes and never knows a dtype: every parameter keeps
 * its own kind and dtype, and the kind's all-gather hooks say what goes on
 * the wire and how to rebuild the full tensor. Flow (docs/SHARDING.md):
 *
 *   lpx_fsdp_new(mesh)                      one engine per rank
 *   lpx_fsdp_group_add / lpx_fsdp_param_add one group per layer + root
 *   lpx_fsdp_shard                          every param -> Shard(0) DTensor
 *   per step, per group:
 *     lpx_fsdp_unshard(g)     pre_all_gather of each param, ONE u8 buffer,
 *                             ONE all-gather, split, post_all_gather
 *     lpx_fsdp_prefetch(next) the next group, at most two unsharded
 *     ... forward/backward on lpx_fsdp_param_full(g, i) ...
 *     lpx_fsdp_set_grad(g, i, grad_full)
 *     lpx_fsdp_reshard(g)     frees the unsharded tensors
 *     lpx_fsdp_reduce_scatter_grads(g)  one reduce-scatter per grad dtype,
 *                             averaged (or fp8 with a shared scale)
 *     lpx_fsdp_adamw_step(g)  one fused pass over the group's local shards
 *     lpx_fsdp_group_precompute_scales(g)  one all-reduce of the statistics kinds agree
 *
 * CPU offload (lpx_fsdp_config.compute_device = a CUDA device, NCCL
 * comms): the same calls; shards, grad shards and AdamW state stay in
 * host memory, the unsharded params and the grads handed in live on the
 * device, with one host->device copy per unshard and one device->host
 * copy per grad dtype per reduce-scatter.
 *
 * Every function that runs collectives must be called by every rank in
 * the same order. A rank that fails before a collective aborts the comm,
 * so its peers return LPX_ECOMM instead of hanging; the engine is then
 * unusable (free it). All functions return lpx_status with a message in
 * lpx_last_error() and never abort on user error. Not thread-safe: one
 * thread drives one rank's engine. */
#ifndef LPX_FSDP_H
#define LPX_FSDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "tensor.h"
#include "comm.h"
#include "dtensor.h"

LPX_BEGIN_DECLS

typedef struct lpx_fsdp lpx_fsdp;
typedef struct lpx_fsdp_group lpx_fsdp_group;

/** Engine options. Zero-initialized = the defaults in brackets. */
typedef struct lpx_fsdp_config {
    size_t struct_size;          /* sizeof(lpx_fsdp_config); 0 accepted as this size */
    int max_unsharded;           /* groups unsharded at once [2]; unshard beyond it is refused */
    bool keep_storage;           /* reshard keeps the unsharded tensors so the next unshard
                                    refills them in place (post_all_gather `out`) [false:
                                    reshard frees them] */
    bool fp8_grad_reduce;        /* reduce-scatter grads as fp8 with one shared global scale
                                    (FP8-LM / MS-AMP) [false] */
    lpx_dtype fp8_grad_dtype;    /* format of fp8 grads [0 = LPX_F8E5M2]; read and validated by the
                                    "fp8lm" codec only (LPX_EDTYPE there) */
    lpx_dtype param_dtype;       /* mixed precision (FSDP2 MixedPrecisionPolicy.param_dtype): dense
                                    f32 params are cast to this dtype (bf16/f16) before the
                                    all-gather, so the wire and the unsharded tensor use it while
                                    the optimizer updates the f32 shard [0: as is] */
    /* fields after this line are read only when struct_size covers them (older callers get
       the defaults) */
    lpx_device compute_device;   /* where the unsharded params and the grads live [zero or lpx_cpu():
                                    the CPU, everything as above]. A CUDA device turns on CPU
                                    offload (docs/SHARDING.md, "CPU offload"): shards, grad shards
                                    and AdamW state stay in host memory and the optimizer steps
                                    on the CPU; each unshard copies the packed wire buffer to the
                                    device once, all-gathers there and rebuilds the params on the
                                    device (lpx_fsdp_param_full returns device tensors); grads are
                                    handed in on the device, reduce-scattered there and copied to
                                    the host once per grad dtype. Needs the device's backend and
                                    mesh comms whose lpx_comm_caps.device is that device (NCCL
                                    over it; LPX_EDEVICE otherwise); not with fp8_grad_reduce or
                                    another non-pass-through grad_codec (LPX_EINVAL).
                                    Params handed to lpx_fsdp_param_add ON that device make the
                                    engine device-resident instead (docs/SHARDING.md): shards,
                                    grad shards and AdamW state stay on the device, AdamW runs
                                    there; a mix of host and device params: LPX_EDEVICE at
                                    lpx_fsdp_shard */
    const char *grad_codec;      /* the gradient codec: the wire format of lpx_fsdp_reduce_scatter_grads,
                                    by its registered name (lpx_grad_codec_register; the string is
                                    read by lpx_fsdp_new only) [NULL or "": "fp8lm" with
                                    fp8_grad_reduce, else "plain"]. "plain": each grad dtype its own
                                    bucket, reduced as is with avg; "fp8lm": FP8-LM (fp8_grad_dtype,
                                    one shared scale). fp8_grad_reduce with another codec than
                                    "fp8lm": LPX_EINVAL; an unknown name: LPX_ENOTFOUND. An engine on
                                    a compute device takes pass-through codecs only
                                    (LPX_GRAD_CODEC_PASSTHROUGH; LPX_EINVAL otherwise) */
} lpx_fsdp_config;

/** Where an engine keeps what (lpx_fsdp_placement_get). */
typedef enum lpx_fsdp_placement {
    LPX_FSDP_HOST = 0,     /* compute_device the CPU: everything in host memory */
    LPX_FSDP_OFFLOAD = 1,  /* shards, grad shards and AdamW state on the host, unsharded params and
                              full grads on the compute device ("CPU offload") */
    LPX_FSDP_RESIDENT = 2  /* everything on the compute device (params handed in there) */
} lpx_fsdp_placement;

/** The context the engine passes to a kind's pre_all_gather as `ctx`
 *  (hooks that need no collective ignore it). A hook that runs a
 *  collective of its own (a wrapper whose scale was not agreed by
 *  lpx_fsdp_precompute_scales, e.g. a float8_weight) uses `comm` and bumps
 *  `amax_allreduces`. */
typedef struct lpx_fsdp_hook_ctx {
    size_t struct_size;          /* sizeof(lpx_fsdp_hook_ctx) */
    lpx_comm *comm;              /* the shard group's comm */
    uint64_t amax_allreduces;    /* incremented by hooks that all-reduce a statistic (an amax) */
    lpx_device device;           /* where `comm` wants collective buffers: the CPU (zero counts as
                                    the CPU) or, with an offloading engine, its compute device: a
                                    hook stages its collective's host values through device memory
                                    there (read only when struct_size covers it) */
} lpx_fsdp_hook_ctx;

/** Per-step statistics (since lpx_fsdp_stats_reset). Collective indices
 *  are lpx_coll; bytes count this rank's payload as lpx_comm_stats does
 *  (all-gather: this rank's contribution, padding included). */
typedef struct lpx_fsdp_stats {
    size_t struct_size;                  /* set by the caller */
    uint64_t calls[LPX_COLL_MAX];        /* collectives the engine ran, by kind */
    uint64_t bytes[LPX_COLL_MAX];
    uint64_t ns[LPX_COLL_MAX];           /* wall time inside those collectives */
    uint64_t amax_allreduces;            /* all-reduces of agreed statistics, e.g. fp8 amaxes
                                            (precompute: 1 per call and reduction; without: one
                                            per float8_weight per unshard) */
    uint64_t unshards, reshards;
    uint64_t unsharded_bytes;            /* bytes of unsharded tensors alive now */
    uint64_t peak_unsharded_bytes;       /* the most alive at once */
    int peak_unsharded_groups;           /* the most groups unsharded at once */
    uint64_t pack_ns, unpack_ns;         /* time copying into / out of wire buffers */
    /* CPU offload (compute_device not the CPU; all 0 otherwise); filled only when
       struct_size covers them */
    uint64_t h2d_copies, h2d_bytes;      /* host -> device copies the engine made (one per
                                            unshard, plus staged descriptors and amaxes) */
    uint64_t d2h_copies, d2h_bytes;      /* device -> host (one per grad dtype per reduce-scatter,
                                            plus staged descriptors and amaxes) */
    uint64_t copy_ns;                    /* wall time inside those copies */
    uint64_t pinned_bytes;               /* page-locked host staging held now (0: pageable) */
} lpx_fsdp_stats;

/** Creates an engine over `mesh` (retained): a 1-D mesh shards over its
 *  comm; a 2-D mesh (hybrid) shards over mesh dim 1 and averages grads
 *  over both. cfg may be NULL; cfg->struct_size may be that of an older
 *  lpx_fsdp_config (up to param_dtype): later fields take their defaults.
 *  Errors: LPX_EINVAL, LPX_EDTYPE, LPX_EDEVICE (a compute_device without
 *  a backend, or whose comms do not move its memory: lpx_comm_caps),
 *  LPX_ENOTFOUND (no such grad_codec), a codec's configure error,
 *  LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_new(lpx_mesh *mesh, const lpx_fsdp_config *cfg, lpx_fsdp **out);
/** Frees the engine, its groups, shards, unsharded tensors, grads and
 *  optimizer state; releases the mesh. NULL is ignored. */
LPX_API void lpx_fsdp_free(lpx_fsdp *f);
/** The engine's placement: LPX_FSDP_HOST or LPX_FSDP_OFFLOAD from
 *  lpx_fsdp_new (compute_device), LPX_FSDP_RESIDENT from lpx_fsdp_shard
 *  when the params were handed in on the compute device. NULL: HOST. */
LPX_API lpx_fsdp_placement lpx_fsdp_placement_get(const lpx_fsdp *f);
/** The name of the engine's gradient codec (borrowed, valid while the
 *  engine lives), or NULL for a NULL engine. */
LPX_API const char *lpx_fsdp_grad_codec(const lpx_fsdp *f);

/** Adds a group (a layer, or the root) named `name` (copied). The handle
 *  lives as long as the engine. Groups must be added before
 *  lpx_fsdp_shard. Errors: LPX_EINVAL (NULL, after shard), LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_group_add(lpx_fsdp *f, const char *name, lpx_fsdp_group **out);

/** Parameter flags. */
enum {
    LPX_FSDP_FROZEN = 1u,  /* no gradient, no optimizer state (an nf4 base weight) */
    LPX_FSDP_NO_DECAY = 2u /* lpx_fsdp_adamw_step applies no weight decay (norms, embeddings) */
};

/** Adds parameter `full` (any kind with all-gather hooks, or dense; every
 *  rank passes the same full tensor; retained until lpx_fsdp_shard cuts
 *  it) to group g; *index (may be NULL) receives its index in the group.
 *  Errors: LPX_EINVAL (NULL, a 0-D or DTensor param, after shard),
 *  LPX_ENOTIMPL (a kind without hooks), LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_param_add(lpx_fsdp_group *g, const char *name, lpx_tensor *full, unsigned flags,
                                      int *index);

/** fully_shard: every parameter becomes a Shard(0) DTensor (chunks of
 *  ceil(rows/world) rounded up to the kind's shard_unit), the full tensors
 *  are released, and the ranks agree on every parameter's wire layout
 *  with one all-gather of descriptors (so each unshard is one collective).
 *  Collective. Errors: those of the kinds' narrow/clone/pre_all_gather,
 *  LPX_ECOMM, LPX_ETIMEOUT, LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_shard(lpx_fsdp *f);

/** Name of parameter i of g as given to lpx_fsdp_param_add (borrowed,
 *  valid while the engine lives), or NULL when out of range. */
LPX_API const char *lpx_fsdp_param_name(const lpx_fsdp_group *g, int i);
/** The flags parameter i of g was added with (0 when out of range). */
LPX_API unsigned lpx_fsdp_param_flags(const lpx_fsdp_group *g, int i);
/** The dim-0 rows of parameter i this rank holds ([*start, *start +
 *  *len) of the global rows) and the kind's shard unit; any output may be
 *  NULL. Errors: LPX_EINVAL (NULL g, i out of range, before shard). */
LPX_API lpx_status lpx_fsdp_param_rows(const lpx_fsdp_group *g, int i, int64_t *start, int64_t *len, int64_t *unit);

/** Number of groups / the i-th group (NULL when out of range). */
LPX_API int lpx_fsdp_group_count(const lpx_fsdp *f);
LPX_API lpx_fsdp_group *lpx_fsdp_group_at(const lpx_fsdp *f, int i);
/** Group name (borrowed) and parameter count. */
LPX_API const char *lpx_fsdp_group_name(const lpx_fsdp_group *g);
LPX_API int lpx_fsdp_param_count(const lpx_fsdp_group *g);
/** True while g is unsharded. */
LPX_API bool lpx_fsdp_is_unsharded(const lpx_fsdp_group *g);

/** Unshards group g: pre_all_gather of each param (ctx: an
 *  lpx_fsdp_hook_ctx), every input packed into ONE u8 buffer (mixed
 *  dtypes), ONE all-gather, split per param and unpadded, post_all_gather
 *  (with the kept tensor as `out` when keep_storage). A no-op when g is
 *  unsharded already. Collective. Errors: LPX_EFULL (max_unsharded groups
 *  are unsharded: reshard one first; no collective ran, so this is only
 *  safe when every rank makes the same call), LPX_EINVAL (before shard),
 *  a hook's error, LPX_ECOMM, LPX_ETIMEOUT, LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_unshard(lpx_fsdp_group *g);
/** Unshards `next` if fewer than max_unsharded groups are unsharded, else
 *  does nothing (LPX_OK): prefetch while the current group computes.
 *  Collective when it unshards (every rank sees the same count). With CPU
 *  offload the gather is left in flight (docs/SHARDING.md, "Overlapped
 *  prefetch"): `next` counts as unsharded at once, its upload and
 *  all-gather run on the comm's stream beside the compute queued after
 *  this call, and the first lpx_fsdp_unshard(next) or
 *  lpx_fsdp_param_full(next, i) completes it (no collective; errors of
 *  the rebuild are reported there, and next is sharded again). */
LPX_API lpx_status lpx_fsdp_prefetch(lpx_fsdp_group *next);
/** Drops the unsharded tensors of g (or keeps them for reuse with
 *  keep_storage). A no-op when g is sharded. Local, no collective. */
LPX_API lpx_status lpx_fsdp_reshard(lpx_fsdp_group *g);

/** The unsharded parameter i of g (borrowed, valid until reshard), NULL
 *  when g is sharded or i out of range. Its kind is what the param's
 *  post_all_gather builds (float8_weight: a float8 tensor). */
LPX_API lpx_tensor *lpx_fsdp_param_full(const lpx_fsdp_group *g, int i);
/** The Shard(0) DTensor of parameter i (borrowed), or NULL. */
LPX_API lpx_tensor *lpx_fsdp_param_dtensor(const lpx_fsdp_group *g, int i);
/** The local shard of parameter i (borrowed; updated in place by the
 *  optimizer), or NULL. */
LPX_API lpx_tensor *lpx_fsdp_param_local(const lpx_fsdp_group *g, int i);

/** Hands the full (unsharded-shape, dense; the dtypes the grad codec
 *  takes: f32/bf16/f16 for the built-ins) gradient of
 *  parameter i to the engine (retained until the reduce-scatter). It must
 *  live on the engine's compute device (the CPU unless offloading).
 *  Errors: LPX_EINVAL (frozen param), LPX_EDTYPE (kind tensor or dtype),
 *  LPX_ESHAPE, LPX_EDEVICE (another device). */
LPX_API lpx_status lpx_fsdp_set_grad(lpx_fsdp_group *g, int i, lpx_tensor *grad);
/** Reduce-scatters the grads handed to g through the engine's gradient
 *  codec: grads of one codec bucket (plain: one dtype) are packed into
 *  one buffer (each rank's block padded to its chunk) and reduced in ONE
 *  reduce-scatter (plain: avg; fp8lm: one all-reduce(MAX) of the amax,
 *  fp8 encoding with the shared scale, 1/N folded into the unscale).
 *  Every trainable param must have a grad. Collective. Errors: LPX_EINVAL,
 *  a codec's error (the comm is aborted), LPX_ECOMM, LPX_ETIMEOUT,
 *  LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_reduce_scatter_grads(lpx_fsdp_group *g);
/** The local grad shard of parameter i after the reduce-scatter
 *  (borrowed; the codec's lpx_grad_wire.out: f32 for fp8lm, the grad's
 *  dtype for plain), or NULL. */
LPX_API lpx_tensor *lpx_fsdp_param_grad(const lpx_fsdp_group *g, int i);

/** AdamW hyper-parameters (decoupled weight decay, bias-corrected). */
typedef struct lpx_adamw_opts {
    double lr, beta1, beta2, eps, weight_decay;
} lpx_adamw_opts;
/** lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01. */
LPX_API lpx_adamw_opts lpx_adamw_opts_default(void);

/** One AdamW step over every trainable parameter's local shard of g, in
 *  one fused pass per parameter (decode, update m and v in f32, write the
 *  param in its dtype): p -= lr * wd * p; m = b1 m + (1-b1) g;
 *  v = b2 v + (1-b2) g^2; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),
 *  all in f32 (docs/SHARDING.md has the exact order). Dense f32/bf16/f16
 *  shards and the masters of wrapper kinds (lpx_kind_i.master: a
 *  float8_weight's, a plugin wrapper's) are updated; frozen ones skipped.
 *  Local, no collective. Errors: LPX_EINVAL (no grads), LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_adamw_step(lpx_fsdp_group *g, const lpx_adamw_opts *opts);

/** The AdamW state of trainable parameter i of g, for checkpoints: new
 *  f32 tensors (copies, the shape of the weight's local shard) of the
 *  first and second moments into *m and *v (zeros before the first step),
 *  and the number of steps taken into *step. Any output may be NULL.
 *  Local, no collective. Errors: LPX_EINVAL (NULL g, i out of range, a
 *  frozen param, before lpx_fsdp_shard), LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_param_adamw_state(const lpx_fsdp_group *g, int i, lpx_tensor **m, lpx_tensor **v,
                                              int64_t *step);
/** The same state without a copy, for writers that must not hold a second
 *  copy of it (sharded checkpoints): tensor handles on the engine's own
 *  moment arrays (f32, the local shard's shape) into *m and *v, or NULL
 *  before the first step. Borrowed memory: valid until the next
 *  lpx_fsdp_adamw_step, lpx_fsdp_param_set_adamw_state or lpx_fsdp_free;
 *  read it, never write through it; release the handles. Errors as
 *  lpx_fsdp_param_adamw_state. */
LPX_API lpx_status lpx_fsdp_param_adamw_view(const lpx_fsdp_group *g, int i, lpx_tensor **m, lpx_tensor **v,
                                             int64_t *step);
/** Restores that state (a checkpoint being resumed): m and v dense f32
 *  with the local shard's element count (copied; any shape), step >= 0.
 *  step 0 with m and v NULL drops the state (as before the first step).
 *  On error nothing changes. Local, no collective. Errors: LPX_EINVAL
 *  (NULL g, i out of range, frozen param, before shard, a count or dtype
 *  that does not match, negative step, only one of m and v), LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_param_set_adamw_state(lpx_fsdp_group *g, int i, const lpx_tensor *m,
                                                  const lpx_tensor *v, int64_t step);

/* ---- optimizer state and masters per group (issue 37) ----------------
 *
 * By default a group keeps f32 AdamW moments and updates its params in
 * their own dtype. lpx_fsdp_group_set_optim chooses low-precision moments
 * (block-quantized kind tensors, include/lpx/optim_state.h) and a bf16
 * master with stochastic rounding or FP8-LM's scaled f16 master. The moments live in the rank's shards
 * and are never gathered. Their quantization blocks are laid on the
 * GLOBAL flat index of each parameter: the engine asks the state's kind
 * for its shard unit (lpx_kind_i.shard_unit) and rounds the param's dim-0
 * shard unit up to a multiple of it, so no block straddles two ranks and
 * the concatenation of the shards' codes and scales is the unsharded
 * parameter's state (docs/SHARDING.md "Low-precision optimizer state"). */

/** The moments' format. */
typedef enum lpx_fsdp_state {
    LPX_FSDP_STATE_F32 = 0,  /* f32 m and v (8 bytes per parameter) */
    LPX_FSDP_STATE_8BIT = 1, /* kind os_8bit (torchao AdamW8bit): ~2.03 bytes per parameter */
    LPX_FSDP_STATE_4BIT = 2, /* kind os_4bit (torchao AdamW4bit): ~1.03 bytes per parameter */
    LPX_FSDP_STATE_FP8 = 3   /* kind os_fp8 (e4m3 m, scaled-f16 v; FP8-LM): ~3.03 bytes per parameter */
} lpx_fsdp_state;

/** What the optimizer updates. */
typedef enum lpx_fsdp_master {
    LPX_FSDP_MASTER_F32 = 0,     /* the param's own shard (f32 for f32 params), rounded to nearest */
    LPX_FSDP_MASTER_BF16_SR = 1, /* dense f32 params are kept as bf16 shards (2 bytes per parameter, no f32
                                    copy) and written with stochastic rounding; the gathered weight is
                                    that bf16 tensor */
    LPX_FSDP_MASTER_F16S = 2,    /* FP8-LM's scaled f16 master (MS-AMP O2): dense f32 params are kept as f16
                                    codes of p / s with one f32 scale s per block of the param's GLOBAL flat
                                    index (s = absmax * 2^-15; 2 + 4 / block bytes per parameter), written
                                    RNE with a fresh scale per block at each step. The local shard
                                    (lpx_fsdp_param_local) holds the codes, lpx_fsdp_param_master_scale the
                                    scales; the wire carries the dequantized weight (in cfg.param_dtype
                                    when set, else f32). Host engines only (not device-resident) */
    LPX_FSDP_MASTER_F16S_SR = 3  /* the same, the codes written with stochastic rounding keyed as bf16-sr */
} lpx_fsdp_master;

/** A group's optimizer choice. Zero-initialized (struct_size aside) = the
 *  defaults in brackets. */
typedef struct lpx_fsdp_optim {
    size_t struct_size;     /* sizeof(lpx_fsdp_optim); 0 accepted as this size */
    lpx_fsdp_state state;   /* [LPX_FSDP_STATE_F32] */
    int64_t block;          /* quantization block: 0 = the format's default (256); else a power of two
                               in 2..256 (ignored for f32 moments unless the master is scaled f16);
                               a scaled-f16 master uses the same block */
    lpx_fsdp_master master; /* [LPX_FSDP_MASTER_F32] */
    uint64_t seed;          /* the stochastic rounding's seed (bf16-sr). The draw of element j of a
                               param is keyed by (seed, the param's number in the engine, its step,
                               its GLOBAL flat index j): a run replays bit for bit at any world size */
} lpx_fsdp_optim;

/** Chooses the optimizer state and master of every trainable parameter of
 *  g. Must be called before lpx_fsdp_shard (the block decides the shard
 *  unit); *o is copied. NULL o restores the defaults. Errors: LPX_EINVAL
 *  (NULL g; after lpx_fsdp_shard; an unknown state or master, a block
 *  that is not a power of two in 2..256: one line naming the field and
 *  the value), LPX_ENOTFOUND (the state's kind is not registered). */
LPX_API lpx_status lpx_fsdp_group_set_optim(lpx_fsdp_group *g, const lpx_fsdp_optim *o);
/** g's choice into *o (block resolved to the format's default once
 *  sharded). Errors: LPX_EINVAL (NULL). */
LPX_API lpx_status lpx_fsdp_group_get_optim(const lpx_fsdp_group *g, lpx_fsdp_optim *o);

/** The low-precision moments of trainable parameter i of g (a group with
 *  a state other than f32): new references to the engine's own state
 *  tensors (kinds os_8bit / os_4bit / os_fp8, the local shard's shape;
 *  read them, never write through them; release them), NULL before the
 *  first step, and the steps taken. Any output may be NULL. Local.
 *  Errors: LPX_EINVAL (NULL g, i out of range, frozen, before shard, a
 *  group with f32 moments: use lpx_fsdp_param_adamw_view). */
LPX_API lpx_status lpx_fsdp_param_optim_state(const lpx_fsdp_group *g, int i, lpx_tensor **m, lpx_tensor **v,
                                              int64_t *step);
/** Restores low-precision moments (a checkpoint being resumed): m and v
 *  state tensors of the group's format and block, roles m and v, with the
 *  local shard's element count, on the weight's device (retained, not
 *  copied: the caller must not write them afterwards), step >= 0; m, v
 *  NULL with step 0 drops the state. Nothing changes on error. Local.
 *  Errors: LPX_EINVAL (as lpx_fsdp_param_set_adamw_state; a tensor of
 *  another kind, role, block or count). */
LPX_API lpx_status lpx_fsdp_param_set_optim_state(lpx_fsdp_group *g, int i, lpx_tensor *m, lpx_tensor *v,
                                                  int64_t step);

/** The scaled-f16 master's block scales of trainable parameter i of g (a
 *  group whose master is LPX_FSDP_MASTER_F16S / _F16S_SR): *scale a new
 *  reference to the engine's f32 [ceil(local numel / block)] tensor (read
 *  it, never write through it; release it); NULL for a param kept in
 *  another form (a wrapper kind's master, a param of another dtype) or a
 *  group with another master. The codes are the local shard. Local.
 *  Errors: LPX_EINVAL (NULL g or scale, i out of range, frozen, before
 *  shard). */
LPX_API lpx_status lpx_fsdp_param_master_scale(const lpx_fsdp_group *g, int i, lpx_tensor **scale);
/** Restores those scales (a checkpoint being resumed; the codes are
 *  restored into the local shard): a dense f32 tensor of the same count,
 *  copied. Nothing changes on error. Local. Errors: LPX_EINVAL (as
 *  lpx_fsdp_param_master_scale, a param with no scaled master, a count or
 *  dtype that does not match). */
LPX_API lpx_status lpx_fsdp_param_set_master_scale(lpx_fsdp_group *g, int i, const lpx_tensor *scale);
/** The dense value of trainable parameter i's local shard as f32 on the
 *  host: a scaled-f16 master dequantized (codes x scale), a wrapper kind's
 *  master, or the shard itself cast to f32. *out a new reference (it
 *  may share an f32 shard's storage: read it only). Local.
 *  Errors: LPX_EINVAL (NULL, i out of range, before shard), LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_param_master_dense(const lpx_fsdp_group *g, int i, lpx_tensor **out);

/** Bytes this rank's shards hold, measured on the tensors: *state the
 *  AdamW moments of every trainable param (m + v: codes and scales, or
 *  8 bytes per element for f32 moments; moments not made yet count as
 *  what the first step makes), *master the tensors the optimizer updates
 *  (the dense shards, or the wrappers' masters), *params their element
 *  count. Any output may be NULL. Local. Errors: LPX_EINVAL (NULL f,
 *  before shard). */
LPX_API lpx_status lpx_fsdp_optim_bytes(const lpx_fsdp *f, int64_t *state, int64_t *master, int64_t *params);

/** Agrees what the parameters of g need agreed before their next
 *  all-gather: each local tensor's kind says how many f32 values and which
 *  reduction (lpx_kind_i.sync_count; a tensorwise float8_weight: its amax,
 *  MAX), the engine packs every parameter's values into ONE all-reduce per
 *  reduction and hands them back (sync_apply: the weight keeps its scale),
 *  so the next unshard runs no collective besides the all-gather. Kinds of
 *  plugins take part like the built-in ones. Without it, a float8_weight
 *  all-reduces its own amax at each unshard. Collective. Errors:
 *  LPX_EINVAL (a kind's bad count or reduction, before shard), a kind's
 *  error, LPX_ECOMM, LPX_ETIMEOUT, LPX_ENOMEM. */
LPX_API lpx_status lpx_fsdp_group_precompute_scales(lpx_fsdp_group *g);
/** lpx_fsdp_group_precompute_scales over every group of the engine at
 *  once: ONE all-reduce per reduction for the model (one MAX for fp8
 *  scales; none when no parameter asks). Collective. Errors: as above. */
LPX_API lpx_status lpx_fsdp_precompute_scales(lpx_fsdp *f);

/* ---- gradient codecs ------------------------------------------------
 *
 * The wire format of lpx_fsdp_reduce_scatter_grads is a codec, chosen by
 * name (lpx_fsdp_config.grad_codec). Built in: "plain" (pass-through: the
 * grads' own bytes, one bucket per grad dtype, avg) and "fp8lm" (FP8-LM:
 * one all-reduce(MAX) of the amax, fp8 codes with a shared scale, sum,
 * the 1/N in the unscale; docs/SHARDING.md). A plugin (or a program)
 * registers more: MX blocks, stochastic rounding, error feedback.
 *
 * Per reduce-scatter of a group the engine asks `wire` for the format of
 * each grad's dtype, groups grads by bucket (increasing), and per bucket:
 * `prepare` (may run collectives on ctx->comm / ctx->rep, host memory),
 * for each grad and each rank's rows `encode` into the wire buffer (rows
 * padded with zero bytes), ONE reduce-scatter with wire.op over wire.wire,
 * the replicate group's average on a 2-D mesh, `decode` of this rank's
 * rows into the grad shard (dtype wire.out), `finish`. Every rank must
 * make the same choices (buckets, wire dtypes, counts). */

/** The wire format of one grad dtype. */
typedef struct lpx_grad_wire {
    size_t struct_size;          /* sizeof(lpx_grad_wire), set by the engine */
    int bucket;                  /* grads of one bucket share one buffer and ONE reduce-scatter;
                                    buckets run in increasing order (>= 0) */
    lpx_dtype wire;              /* the dtype on the wire (what the comm reduces) */
    lpx_reduce_op op;            /* the reduce-scatter's reduction */
    lpx_dtype out;               /* the local grad shard's dtype (a pass-through codec: the grad's) */
} lpx_grad_wire;

/** One bucket's reduce-scatter as a codec sees it. */
typedef struct lpx_grad_codec_ctx {
    size_t struct_size;          /* sizeof(lpx_grad_codec_ctx), set by the engine */
    lpx_comm *comm;              /* the shard group (a codec's collectives: host buffers) */
    lpx_comm *rep;               /* the replicate group of a 2-D mesh, or NULL */
    int world;                   /* ranks of comm (the N of the average) */
    lpx_grad_wire wire;          /* the bucket's format */
    lpx_tensor *const *grads;    /* the bucket's full grads in group order (borrowed; contiguous,
                                    host memory) */
    const char *const *names;    /* their params' names (borrowed) */
    int ngrads;
    uint64_t amax_allreduces;    /* a prepare that all-reduces a statistic adds one per all-reduce
                                    (lpx_fsdp_stats.amax_allreduces) */
    double scale, unscale;       /* per call, for the codec: prepare sets them, encode and decode
                                    read them [1, 1] */
    void *call;                  /* per call, for the codec: prepare sets it, finish releases it */
} lpx_grad_codec_ctx;

enum {
    /** The wire holds the grad's own bytes (wire.wire and wire.out are the
     *  grad's dtype; encode/decode may be NULL: a copy). Only such codecs
     *  run on an engine with a compute device (the grads never leave it
     *  before the reduce-scatter). */
    LPX_GRAD_CODEC_PASSTHROUGH = 1u
};

#define LPX_GRAD_CODEC_PLAIN "plain"
#define LPX_GRAD_CODEC_FP8LM "fp8lm"

/** A gradient codec. Every function gets a copy of the registered
 *  vtable as `self` (self->user is the registrant's) and the state its
 *  configure made (NULL without configure). Functions report failure with
 *  lpx_error; the engine prefixes the call and, for prepare/encode,
 *  aborts the comm so the peers fail too. */
typedef struct lpx_grad_codec_i {
    size_t struct_size;          /* sizeof(lpx_grad_codec_i) of the caller */
    const char *name;            /* lpx_fsdp_config.grad_codec; copied (at most 31 chars) */
    const char *description;     /* one line, may be NULL; not copied: must outlive the registration */
    unsigned flags;              /* LPX_GRAD_CODEC_* */
    /** lpx_fsdp_new: check the engine's configuration (with its defaults
     *  filled) and make the per-engine state into *state. May be NULL. */
    lpx_status (*configure)(const struct lpx_grad_codec_i *self, const lpx_fsdp_config *cfg, void **state);
    /** lpx_fsdp_free: frees what configure made. May be NULL. */
    void (*release)(const struct lpx_grad_codec_i *self, void *state);
    /** The format of grads of dtype `grad` into *out (its bucket, wire
     *  dtype, reduction, shard dtype). Also lpx_fsdp_set_grad's check: an
     *  error refuses the grad (reported as LPX_EDTYPE). Required. */
    lpx_status (*wire)(const struct lpx_grad_codec_i *self, void *state, lpx_dtype grad, lpx_grad_wire *out);
    /** Before a bucket's encode (ctx->scale, ctx->call...). May run
     *  collectives; every rank calls it. May be NULL. */
    lpx_status (*prepare)(const struct lpx_grad_codec_i *self, void *state, lpx_grad_codec_ctx *ctx);
    /** n elements of dtype `grad` at src into n wire elements at dst.
     *  Required unless PASSTHROUGH (NULL there: a copy). */
    lpx_status (*encode)(const struct lpx_grad_codec_i *self, void *state, const lpx_grad_codec_ctx *ctx,
                         const void *src, lpx_dtype grad, void *dst, size_t n);
    /** n reduced wire elements at src into n elements of wire.out at dst.
     *  Required unless PASSTHROUGH (NULL there: a copy). */
    lpx_status (*decode)(const struct lpx_grad_codec_i *self, void *state, const lpx_grad_codec_ctx *ctx,
                         const void *src, void *dst, size_t n);
    /** After the bucket (also after a failure; release ctx->call). May be NULL. */
    void (*finish)(const struct lpx_grad_codec_i *self, void *state, lpx_grad_codec_ctx *ctx);
    void *user;                  /* the registrant's */
} lpx_grad_codec_i;

/** Registers a codec under its name (the vtable is copied; every
 *  function then gets a copy of it as `self`). Engines made
 *  later find it by name; an engine keeps its own copy, so unregistering
 *  does not affect engines alive, but the functions must stay loaded while
 *  any such engine lives (a plugin unregisters before it is unloaded).
 *  Errors: LPX_EINVAL (NULL, no name or wire, a name over 31 chars, no
 *  encode/decode without PASSTHROUGH), LPX_EEXIST (name taken, the
 *  built-ins included), LPX_EFULL (32 codecs). Thread-safe. */
LPX_API lpx_status lpx_grad_codec_register(const lpx_grad_codec_i *codec);
/** Removes a registered codec (not a built-in). Errors: LPX_EINVAL (NULL,
 *  a built-in), LPX_ENOTFOUND. Thread-safe. */
LPX_API lpx_status lpx_grad_codec_unregister(const char *name);
/** The codec called `name` (the registry's copy, valid until it is
 *  unregistered) into *out. Errors: LPX_EINVAL, LPX_ENOTFOUND (the
 *  message lists the registered names). Thread-safe. */
LPX_API lpx_status lpx_grad_codec_find(const char *name, const lpx_grad_codec_i **out);

/** Copies the statistics into *out (struct_size set by the caller: the
 *  fields it covers are filled, the offload counters need the full size;
 *  at least up to unpack_ns). Errors: LPX_EINVAL. */
LPX_API lpx_status lpx_fsdp_stats_get(const lpx_fsdp *f, lpx_fsdp_stats *out);
/** Zeroes the counters (keeps unsharded_bytes; the peak restarts from it). */
LPX_API void lpx_fsdp_stats_reset(lpx_fsdp *f);

LPX_END_DECLS

#endif
