/* Shared state of the sharding engine's source files (not installed). */
#ifndef LPX_FSDP_INTERNAL_H
#define LPX_FSDP_INTERNAL_H

#include "dtensor_internal.h"

typedef struct fsdp_param {
    char *name;
    unsigned flags;
    lpx_tensor *full_in;       /* the full tensor until lpx_fsdp_shard */
    lpx_tensor *dt;            /* Shard(0) DTensor over the local shard */
    lpx_dtype dtype;           /* logical dtype */
    int ndim;
    int64_t shape[LPX_MAX_DIMS];   /* global */
    int64_t unit;              /* dim-0 shard unit of the kind */
    int64_t chunk, start, len; /* this rank's rows (torch.chunk, in units) */
    dt_wire_desc *descs;       /* [world]: every rank's wire inputs (from shard) */
    size_t off, slot;          /* offset / bytes of this param in a rank's slot */
    /* unsharded state */
    lpx_tensor *outputs[LPX_MAX_AG_INPUTS]; /* gathered inputs (kept with keep_storage) */
    lpx_tensor *full;          /* the unsharded tensor */
    uint64_t full_bytes;
    /* gradients and optimizer */
    lpx_tensor *grad_full;     /* handed in by lpx_fsdp_set_grad */
    lpx_tensor *grad;          /* local grad shard after reduce-scatter */
    float *m, *v;              /* AdamW moments over the local shard (f32, host) */
    lpx_tensor *mt, *vt;       /* device-resident engine: the moments on the device instead */
    lpx_tensor *wsc;           /* scaled-f16 master: f32 block scales of the local shard's f16 codes */
    int64_t wblock;            /* ... their block */
    lpx_tensor *ms, *vs;       /* low-precision moments (group optim.state not f32): state-kind tensors
                                  over the local shard, on the weight's device */
    uint32_t pid;              /* the param's number in the engine (the stochastic rounding's key) */
    int64_t step;
} fsdp_param;

/* An overlapped prefetch's all-gather in flight (offload; fsdp_offload.c):
 * what the rebuild needs once it is waited for. */
typedef struct fsdp_gather {
    lpx_tensor *drecv;         /* the device receive buffer (world * slot bytes) */
    int *nin;                  /* per param: inputs on the wire */
    size_t *msz;               /* per param: metadata bytes */
    unsigned char *metas;      /* per param: LPX_MAX_META bytes of metadata */
    uint64_t ticket;           /* the all-gather's number on the comm (lpx_comm_all_gather_host) */
    int blk;                   /* the staging block it was uploaded from */
} fsdp_gather;

/* A pinned staging block of the overlapped prefetch. */
typedef struct fsdp_block {
    unsigned char *p;
    size_t cap;
    uint64_t ticket;           /* the last all-gather whose upload read it (0: none) */
    bool busy;                 /* its group's gather is still pending */
} fsdp_block;

struct lpx_fsdp_group {
    lpx_fsdp *f;
    char *name;
    fsdp_param *p;
    int n, cap;
    bool unsharded;
    bool kept;                 /* keep_storage: unsharded tensors held while resharded */
    size_t slot;               /* bytes of one rank's block of the group's all-gather */
    uint64_t bytes;            /* unsharded bytes while unsharded */
    lpx_fsdp_optim optim;      /* lpx_fsdp_group_set_optim (block resolved) */
    fsdp_gather *pending;      /* offload: prefetched, all-gather in flight (unsharded is
                                  true; the params are rebuilt at the first use) */
};

struct lpx_fsdp {
    lpx_mesh *mesh;
    lpx_comm *comm;            /* shard group */
    lpx_comm *rep;             /* 2-D mesh: replicate group (grads averaged over it) */
    int world, rank;
    lpx_fsdp_config cfg;
    lpx_fsdp_group **g;
    int ng, gcap;
    bool sharded;
    int nunsharded;
    lpx_fsdp_stats st;
    lpx_fsdp_placement place;  /* (lpx_fsdp_placement_get) */
    /* the gradient codec (lpx_fsdp_config.grad_codec; fsdp_grads.c) and its state */
    lpx_grad_codec_i codec;    /* a copy: the registry may drop its own */
    char codec_name[32];       /* codec.name points here */
    void *codec_state;
    /* a compute device (OFFLOAD or RESIDENT; fsdp_offload.c) */
    const lpx_backend_i *dev_be;        /* the compute device's backend: copy, host_alloc slots */
    bool pinned;                        /* dev_be has host_alloc/host_free */
    unsigned char *stage;               /* host staging buffer (pinned when host_alloc gave it) */
    size_t stage_cap;
    bool stage_pinned;
    /* overlapped prefetch (OFFLOAD, a comm with the host all-gather and
     * pinned memory): staging blocks used in turn, one per gather in flight */
    bool overlap;
    fsdp_block *blk;
    int nblk, blk_next;
};

/* The engine's comm statistics around a collective: fsdp_snap_begin records
 * the comm counters in *s, fsdp_snap_end adds what accumulated since *s to
 * the engine's. */
typedef struct fsdp_snap {
    lpx_comm_stats s[2];
} fsdp_snap;
void fsdp_snap_begin(lpx_fsdp *f, fsdp_snap *s);
void fsdp_snap_end(lpx_fsdp *f, const fsdp_snap *s);

/* Element count of one dim-0 row of a param. */
static inline int64_t fsdp_row_elems(const fsdp_param *p)
{
    int64_t e = 1;
    for (int d = 1; d < p->ndim; d++) e *= p->shape[d];
    return e;
}

/* The local shard of a param (borrowed). */
static inline lpx_tensor *fsdp_local(const fsdp_param *p) { return lpx_dtensor_local(p->dt); }

/* ---- CPU offload (fsdp_offload.c) ----------------------------------- *
 * With cfg.compute_device a CUDA device the shards, grad shards and AdamW
 * state stay on the host; collectives run on device buffers (the comm is
 * NCCL, which refuses host memory). In CPU mode none of these copy: the
 * host helpers call the comm directly. */

/* ---- device-resident engine (fsdp_resident.c) ------------------------ *
 * With a compute device, params handed in on that device keep everything
 * there: the wire buffer is packed device to device, gathered in place,
 * grads are split into device shards and AdamW runs as lpx_adamw_ on the
 * device (bit-identical to the host loop). */

/* At lpx_fsdp_shard: every param on the CPU (offload, or a CPU engine) or
 * every param on the compute device (sets f->resident); anything else is
 * refused naming the param and both devices. */
lpx_status fsdp_resident_check(lpx_fsdp *f);
/* dt_pack into device memory: each wire input copied device to device to
 * its offset at dst */
lpx_status fsdp_pack_dev(lpx_fsdp *f, const dt_wire_desc *d, lpx_tensor *const *inputs, unsigned char *dst);
/* One AdamW step of p on the device (its moments p->mt, p->vt made at the
 * first step); p->step is the step taken. */
lpx_status fsdp_adamw_dev(fsdp_param *p, lpx_tensor *w, const lpx_adamw_opts *o);

/* Checks an offloading configuration (comms, backend, fp8) and looks up
 * lpx-cuda's pinned allocator. Called by lpx_fsdp_new; nothing to undo. */
lpx_status fsdp_offload_init(lpx_fsdp *f);
/* Frees the staging buffer. */
void fsdp_offload_free(lpx_fsdp *f);
/* The engine's host staging buffer, at least n bytes (grown; pinned when
 * lpx-cuda exports its allocator, else lpx_malloc). Valid until the next
 * call. */
lpx_status fsdp_stage(lpx_fsdp *f, size_t n, unsigned char **out);
/* New u8 tensor of n bytes (at least 1) on the compute device, zeroed when
 * asked. */
lpx_status fsdp_dev_bytes(lpx_fsdp *f, size_t n, bool zero, lpx_tensor **out);
/* Counted copies between host memory and the compute device (complete on
 * return: the backend waits for copies that touch the host), and an
 * uncounted device-to-device copy (queued on the device's stream). n == 0
 * copies nothing. */
lpx_status fsdp_h2d(lpx_fsdp *f, void *dst, const void *src, size_t n);
lpx_status fsdp_d2h(lpx_fsdp *f, void *dst, const void *src, size_t n);
lpx_status fsdp_d2d(lpx_fsdp *f, void *dst, const void *src, size_t n);
/* Collectives over host buffers: the comm directly on the CPU, staged
 * through a device buffer when offloading (h2d, in-place collective, d2h).
 * A staging failure before the collective aborts the comm. */
lpx_status fsdp_all_gather_host(lpx_fsdp *f, lpx_comm *c, const void *send, void *recv, size_t nbytes);
lpx_status fsdp_all_reduce_host(lpx_fsdp *f, lpx_comm *c, void *buf, size_t count, lpx_dtype dtype,
                                lpx_reduce_op op);

/* Overlapped prefetch (fsdp_offload.c). fsdp_block_get picks a staging
 * block of at least n bytes whose last upload completed (host wait) and
 * sets *out to its index, or to -1 (LPX_OK) when the overlapped path is
 * not available (no host all-gather export, no pinned memory): then the
 * caller unshards synchronously. fsdp_gather_wait orders lpx-cuda's
 * stream after g's pending all-gather; fsdp_gather_drop releases it
 * (after that wait) and clears g->pending. */
lpx_status fsdp_block_get(lpx_fsdp *f, size_t n, int *out);
lpx_status fsdp_gather_wait(lpx_fsdp_group *g);
void fsdp_gather_drop(lpx_fsdp_group *g);

/* The engine's own formats (precision.c): f32 arithmetic (optimizer
 * state, agreed statistics) and wire bytes; decodes / encodes n elements
 * between dtype d and f32. */
extern const lpx_dtype fsdp_math_dtype;
extern const lpx_dtype fsdp_byte_dtype;
lpx_status fsdp_to_f32(lpx_dtype d, const void *src, float *dst, size_t n);
lpx_status fsdp_from_f32(lpx_dtype d, const float *src, void *dst, size_t n);
/* Mixed precision (precision.c): param_dtype's allowed values (LPX_EDTYPE
 * with the reason otherwise), and whether a dense shard of dtype `from` is
 * cast to param_dtype `to` before the all-gather. */
lpx_status dt_param_dtype_check(lpx_dtype d);
bool dt_param_dtype_casts(lpx_dtype from, lpx_dtype to);

/* The optimizer-state formats (optim_formats.c): the kinds of the
 * lpx_fsdp_state values found by name, their zero states, the step as the
 * op adamw_state_, the bf16 master. */
const char *fsdp_state_name(int state);
/* validates *o (one line naming the field) and resolves its block */
lpx_status fsdp_optim_check(const char *op, lpx_fsdp_optim *o);
/* a zero state of role (0 m, 1 v) over a tensor of shape [ndim] */
lpx_status fsdp_state_new(const lpx_fsdp_optim *o, int role, int ndim, const int64_t *shape, lpx_device dev,
                          lpx_tensor **out);
/* the state kind's dim-0 shard unit for a param of shape [ndim] */
lpx_status fsdp_state_unit(const lpx_fsdp_optim *o, int ndim, const int64_t *shape, int64_t *unit);
/* whether t is a state of o's kind, role and block with numel elements
 * (LPX_EINVAL and *why, what it must be, otherwise; no message set) */
lpx_status fsdp_state_check(const lpx_fsdp_optim *o, const lpx_tensor *t, int role, int64_t numel, const char **why);
/* the dtype dense params are kept in (0: their own) */
lpx_dtype fsdp_master_dtype(const lpx_fsdp_optim *o);
/* FP8-LM's scaled f16 master (LPX_FSDP_MASTER_F16S / _F16S_SR): whether o
 * chooses it; whether a param of dtype d takes it (dense f32); whether
 * local is its codes (with scale); the dim-0 unit (rows) that keeps its
 * blocks (o->block) whole; the codes and scales of a dense CPU shard (RNE)
 * and back to f32; decode / encode n elements from a block start (encode:
 * fresh scales, stochastic rounding keyed (seed, pid, step, index0 + j)
 * for _F16S_SR) */
bool fsdp_master_scaled(const lpx_fsdp_optim *o);
bool fsdp_master_scaled_applies(const lpx_fsdp_optim *o, lpx_dtype d);
bool fsdp_master_scaled_codes(const lpx_fsdp_optim *o, const lpx_tensor *local, const lpx_tensor *scale);
int64_t fsdp_master_unit(const lpx_fsdp_optim *o, int64_t row_elems);
lpx_status fsdp_master_quantize(const lpx_fsdp_optim *o, lpx_tensor *x, lpx_tensor **codes, lpx_tensor **scale);
lpx_status fsdp_master_dequant(int64_t block, lpx_tensor *codes, lpx_tensor *scale, lpx_tensor **out);
void fsdp_master_decode(const lpx_fsdp_optim *o, const void *codes, const float *scale, float *x, size_t n);
void fsdp_master_encode(const lpx_fsdp_optim *o, const float *x, void *codes, float *scale, size_t n, uint32_t pid,
                        int64_t step, int64_t index0);
/* whether a weight of dtype w is written with stochastic rounding */
bool fsdp_master_is_sr(const lpx_fsdp_optim *o, lpx_dtype w);
/* n f32 values into the master's dtype with stochastic rounding, element
 * i keyed by (seed, pid, step, index0 + i) */
void fsdp_store_sr(const float *x, void *dst, size_t n, uint64_t seed, uint32_t pid, int64_t step, int64_t index0);
/* one step of the low-precision moments m, v of weight w */
lpx_status fsdp_state_step(const lpx_fsdp_optim *o, lpx_tensor *w, lpx_tensor *wscale, lpx_tensor *g, lpx_tensor *m,
                           lpx_tensor *v, const lpx_adamw_opts *h, int64_t step, uint32_t pid, int64_t index0);

/* a new CPU state of role over a shape [ndim], quantized from the dense
 * contiguous f32 CPU tensor x of as many elements */
lpx_status fsdp_state_quantize(const lpx_fsdp_optim *o, int role, const lpx_tensor *x, int ndim, const int64_t *shape,
                               lpx_tensor **out);

/* The gradient codec (fsdp_grads.c): lpx_fsdp_new looks it up
 * (grad_codec, or fp8_grad_reduce) and configures it; free releases its
 * state. */
lpx_status fsdp_codec_init(lpx_fsdp *f);
void fsdp_codec_free(lpx_fsdp *f);

#endif
