/* lpx — kinds (tensor subclasses).
 *
 * A kind is a vtable registered with the dispatcher. A kind tensor carries
 * inner tensors + a metadata blob (lpx_tensor_new_kind); op handlers are
 * registered per (op, kind key) like any kernel (lpx_kernel_register with
 * lpx_kind_key(kind)). The sharding engine talks to kinds only through the
 * all-gather hooks below. */
#ifndef LPX_KIND_H
#define LPX_KIND_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "tensor.h"

LPX_BEGIN_DECLS

#define LPX_KIND_ABI_VERSION 1u

/* Priority bands: a call that mixes kinds runs the highest band's handler. */
typedef enum lpx_kind_priority {
    LPX_PRIORITY_PAYLOAD = 1,     /* float8, nf4, mx: hold quantized payloads */
    LPX_PRIORITY_WRAPPER = 2,     /* float8_weight: wrap another tensor */
    LPX_PRIORITY_DISTRIBUTED = 3  /* dtensor: wrap a local shard of any kind */
} lpx_kind_priority;

/** Most inputs one parameter may put on the all-gather wire. */
#define LPX_MAX_AG_INPUTS 8

typedef struct lpx_kind_i {
    size_t struct_size;      /* sizeof(lpx_kind_i) as the kind author saw it */
    uint32_t abi_version;    /* LPX_KIND_ABI_VERSION */
    const char *name;        /* unique; string must outlive the registration */
    int priority;            /* lpx_kind_priority */
    void *user;              /* passed back through lpx_kind_user() */

    /** Rebuilds a tensor of this kind from inner tensors + metadata (the
     *  inverse of reading lpx_tensor_inner/lpx_tensor_meta). Must validate
     *  everything (it is fed untrusted checkpoints) and return LPX_EINVAL
     *  with a message on bad input. NULL: lpx_tensor_new_kind unchecked. */
    lpx_status (*unflatten)(const lpx_kind *kind, lpx_dtype logical_dtype, int ndim,
                            const int64_t *shape, lpx_tensor *const *inner, int ninner,
                            const void *meta, size_t meta_size, lpx_tensor **out);

    /** What to put on the wire for this shard: up to LPX_MAX_AG_INPUTS dense
     *  tensors in inputs[] (new references; dim 0 of each is gathered) and
     *  up to LPX_MAX_META bytes of metadata for post_all_gather. `ctx` is
     *  the engine's per-call context. NULL: the kind cannot be sharded. */
    lpx_status (*pre_all_gather)(const lpx_tensor *shard, void *ctx,
                                 lpx_tensor **inputs, int *ninputs,
                                 void *meta, size_t *meta_size);

    /** Rebuilds the unsharded tensor from the gathered inputs (borrowed).
     *  When `out` is non-NULL (a tensor this hook returned before), fill it
     *  in place and return it retained, so no storage is reallocated. */
    lpx_status (*post_all_gather)(const lpx_kind *kind, lpx_tensor *const *outputs,
                                  int noutputs, const void *meta, size_t meta_size,
                                  lpx_dtype param_dtype, lpx_tensor *out,
                                  lpx_tensor **result);

    /** Rows a dim-0 shard boundary must be a multiple of (1 if NULL). */
    int64_t (*shard_unit)(const lpx_tensor *t);

    /** One line for `lpx info` and error messages; returns chars written. */
    int (*describe)(const lpx_tensor *t, char *buf, size_t len);

    /** Called when a tensor of this kind dies, before its inner tensors are
     *  released: frees what the metadata blob points to, if anything. */
    void (*meta_release)(void *meta, size_t meta_size);

    /* ---- appended slots: optional, read only when struct_size covers them
     * (a vtable compiled before they existed registers with them NULL). */

    /** Quantizes a dense tensor `x` (any float dtype; its dtype becomes the
     *  logical dtype) into a new tensor of this kind with the kind's default
     *  recipe. How frameworks and the conformance kit make instances. */
    lpx_status (*from_dense)(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out);

    /** Dequantizes `t` (a tensor of this kind) into a new dense,
     *  contiguous f32 CPU tensor of the same shape. */
    lpx_status (*to_dense)(const lpx_tensor *t, lpx_tensor **out);

    /** What the conformance kit may expect of this kind (NULL: the kit
     *  uses its defaults; see lpx_kind_conformance). */
    const struct lpx_kind_conformance *conformance;

    /* ---- appended: what a sharding engine asks a kind (read only when
     * struct_size covers them). The engine names no kind: these slots are
     * how a wrapper of any kind gets its master updated and its scales
     * agreed, built in or from a plugin. */

    /** The dense tensor an optimizer updates in place for a (local shard)
     *  tensor `t` of this kind, borrowed (a wrapper's master weight); NULL
     *  when t has none. NULL slot: tensors of this kind are not updated. */
    lpx_tensor *(*master)(const lpx_tensor *t);

    /** Statistics `t` needs agreed across the ranks holding its shards
     *  before its next all-gather (a replicated scale from a global amax):
     *  returns how many f32 values (0..LPX_MAX_SYNC_VALUES; 0: none) and
     *  stores their reduction (an lpx_reduce_op) in *reduce_op. The engine
     *  (lpx_fsdp_precompute_scales) packs every parameter's values, of
     *  every kind, into ONE all-reduce per reduction and hands each tensor
     *  its results. NULL: nothing to agree. */
    int (*sync_count)(const lpx_tensor *t, int *reduce_op);
    /** This rank's sync_count values for t into values[]. */
    lpx_status (*sync_local)(const lpx_tensor *t, float *values);
    /** The agreed values: t keeps what its next pre_all_gather needs. */
    lpx_status (*sync_apply)(lpx_tensor *t, const float *values);
} lpx_kind_i;

/** Most values one tensor may ask to agree (lpx_kind_i.sync_count). */
#define LPX_MAX_SYNC_VALUES 64

/** Declared properties the conformance kit (`lpx conformance`) checks a
 *  kind against. Zero fields take the kit's defaults (given in brackets). */
typedef struct lpx_kind_conformance {
    size_t struct_size;          /* sizeof(lpx_kind_conformance) */
    /** A shape from_dense accepts, used by every contract; dim 0 must be a
     *  multiple of shard_unit. [2-D {64, 96}] */
    int ndim;
    int64_t shape[4];
    /** Quantization bound: max|x - to_dense(from_dense(x))| <= max_err *
     *  max|x|, on every distribution the kit draws. [0.5] */
    double max_err;
    /** SQNR of to_dense(from_dense(x)) against x for x ~ N(0, 1), in dB;
     *  0 = not checked. */
    double min_sqnr_db;
    /** Ops the kind implements vs the same op on dequantized inputs:
     *  max|out - ref| <= op_atol + op_rtol * max|ref|. [1e-4, 1e-5] */
    double op_rtol, op_atol;
    /* ---- appended: read only when struct_size covers them */
    /** Name of the kind post_all_gather returns when it is not this kind: a
     *  wrapper whose wire format is another kind's (float8_weight gathers
     *  into float8). The all_gather contract then checks that the result is
     *  of that kind, equals bit for bit what gathering the unsharded tensor
     *  on one rank gives (cast-then-gather == gather-then-cast), and is
     *  within max_err of to_dense. [NULL: this kind, equal to to_dense] */
    const char *all_gather_kind;
    /** Contracts that do not apply to this kind, with why: an array ended
     *  by {NULL, NULL}. A case is waived when its name after "KIND/" equals
     *  `contract` or starts with `contract` + "/" ("all_gather" waives
     *  all_gather/world1..4); the kit reports it as skipped with the
     *  reason. [NULL: every contract applies] */
    const struct lpx_conformance_na *not_applicable;
    /** Other forms of the kind the kit checks too (granularities, recipes),
     *  each built by its own from_dense: an array ended by an entry whose
     *  name is NULL. Every contract runs again per variant, named
     *  "KIND[variant]/contract", with the variant's not_applicable list
     *  (the kind's does not carry over). [NULL: none] */
    const struct lpx_conformance_variant *variants;
} lpx_kind_conformance;

/** One waived contract of lpx_kind_conformance.not_applicable. */
typedef struct lpx_conformance_na {
    const char *contract;   /* "flatten_unflatten", "all_gather", "op/linear", ... */
    const char *reason;     /* one line, printed by the kit */
} lpx_conformance_na;

/** A form of a kind for the conformance kit (lpx_kind_conformance.variants):
 *  `from_dense` builds it from a dense tensor as the kind's from_dense slot
 *  would (same contract), e.g. float8 with one scale per row or per block. */
typedef struct lpx_conformance_variant {
    const char *name;
    lpx_status (*from_dense)(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out);
    const struct lpx_conformance_na *not_applicable;
    double max_err;   /* the quantization bound of this form (0: the kind's) */
} lpx_conformance_variant;

/** Registers a kind (vtable copied up to min(struct_size, ours)); the
 *  handle stays valid for the process. Errors: LPX_EINVAL (NULL, missing
 *  name, bad priority), LPX_EABI (abi_version), LPX_EEXIST (name taken),
 *  LPX_EFULL (no free key bit in the band). Thread-safe. */
LPX_API lpx_status lpx_kind_register(const lpx_kind_i *vtable, const lpx_kind **out);
/** Unregisters a kind and every kernel and fallback at its key. Fails with
 *  LPX_EINVAL while tensors of the kind are alive. */
LPX_API lpx_status lpx_kind_unregister(const lpx_kind *kind);
/** Quantizes dense `x` into kind `kind` through its from_dense slot.
 *  Errors: LPX_EINVAL (NULL, x not dense), LPX_ENOTIMPL (the kind has no
 *  from_dense), and whatever the kind reports. */
LPX_API lpx_status lpx_kind_from_dense(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out);
/** Rebuilds a tensor of kind `kind` from its inner tensors and metadata,
 *  the inverse of reading lpx_tensor_inner / lpx_tensor_meta (how
 *  checkpoints, DLPack flattening and bindings restore kind tensors),
 *  through the kind's unflatten slot, which validates the payload (without
 *  one: lpx_tensor_new_kind on inner[0]'s device). inner[] is borrowed:
 *  the result takes its own references. Errors: LPX_EINVAL (NULL, ndim,
 *  ninner or meta_size out of range), and whatever the kind reports. */
LPX_API lpx_status lpx_kind_unflatten(const lpx_kind *kind, lpx_dtype logical_dtype, int ndim, const int64_t *shape,
                                      lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                                      lpx_tensor **out);
/** Dense f32 copy of a kind tensor through its kind's to_dense slot (a
 *  dense `t` is returned retained if f32, else cast). Errors: LPX_EINVAL,
 *  LPX_ENOTIMPL (no to_dense), and whatever the kind reports. */
LPX_API lpx_status lpx_kind_to_dense(lpx_tensor *t, lpx_tensor **out);
/** Finds a kind by name. Errors: LPX_ENOTFOUND, LPX_EINVAL. */
LPX_API lpx_status lpx_kind_find(const char *name, const lpx_kind **out);
LPX_API const char *lpx_kind_name(const lpx_kind *kind);
/** The kind's key bit, to register handlers with. */
LPX_API int lpx_kind_key(const lpx_kind *kind);
LPX_API const lpx_kind_i *lpx_kind_vtable(const lpx_kind *kind);
LPX_API void *lpx_kind_user(const lpx_kind *kind);
/** Number of live tensors of this kind. */
LPX_API int64_t lpx_kind_live_tensors(const lpx_kind *kind);
LPX_API int lpx_kind_count(void);
/** Kind i (registration order), or NULL. */
LPX_API const lpx_kind *lpx_kind_at(int i);

LPX_END_DECLS

#endif
