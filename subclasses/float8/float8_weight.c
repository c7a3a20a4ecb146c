/* The float8_weight wrapper kind (priority WRAPPER): a high-precision
 * master weight whose all-gather travels as fp8 (torchao's
 * WeightWithDynamicFloat8CastTensor).
 *
 * Payload: inner[0] = the dense master (f32/bf16/f16, updated in place by
 * the optimizer); metadata = format, granularity and a pointer to a small
 * heap state holding the precomputed scale (freed by meta_release; each
 * tensor owns its own state, views copy the value).
 *
 * pre_all_gather(shard, ctx) casts the local master shard to fp8 and hands
 * the float8 kind's pre_all_gather the result, so the wire is exactly the
 * float8 kind's (1 byte per element):
 *   tensorwise: the scale is replicated: the precomputed one
 *               (lpx_fsdp_group_precompute_scales: one all-reduce MAX for all
 *               weights), else this weight's own all-reduce MAX of its
 *               amax over ctx->comm (counted in ctx->amax_allreduces);
 *               scale = fp8_max / max(amax, 1e-12) (fp8_scale_from_amax),
 *               the dynamic formula, so gathering then casting and
 *               casting then gathering give the same bits;
 *   rowwise:    each row's scale comes from its own amax, which lives on
 *               the rank that owns the row: no collective at all;
 *   blockwise:  128 x 128 blocks (DeepSeek-V3's weights): shards are cut
 *               at whole row blocks (the shard unit), so each block's
 *               amax lives on one rank: no collective either; the wire
 *               carries the fp8 codes and the block scales.
 * post_all_gather is the float8 kind's: a float8 tensor (role WEIGHT)
 * ready for the scaled GEMM.
 *
 * Ops: narrow/slice/clone/detach/contiguous rewrap the master's result;
 * any other op runs on the master (a fallback that unwraps and
 * redispatches), so a float8_weight behaves as its master elsewhere. */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include "float8_internal.h"
#include "lpx/comm.h"
#include "lpx/fsdp.h"

#define F8W_MAGIC 0x57384657u /* "WF8W" */

/* f8w_meta.rowwise values (the field predates blocks; 0 and 1 keep their
 * meaning in saved checkpoints) */
enum { F8W_TENSORWISE = 0, F8W_ROWWISE = 1, F8W_BLOCKWISE = 2 };

typedef struct f8w_state {
    float scale;   /* precomputed replicated scale, 0: none */
} f8w_state;

typedef struct f8w_meta {
    uint32_t magic;
    int32_t fp8;
    int32_t rowwise;       /* the scaling: F8W_TENSORWISE, F8W_ROWWISE or F8W_BLOCKWISE */
    int32_t reserved;
    f8w_state *state;
} f8w_meta;

static const lpx_kind *f8w__kind;

const lpx_kind *lpx_float8_weight_kind(void)
{
    if (lpx_ensure_init()) return NULL;
    return f8w__kind;
}

bool lpx_float8_weight_is(const lpx_tensor *t) { return t && f8w__kind && lpx_tensor_kind(t) == f8w__kind; }

static const f8w_meta *meta_of(const lpx_tensor *t) { return (const f8w_meta *)lpx_tensor_meta(t, NULL); }

lpx_tensor *lpx_float8_weight_master(const lpx_tensor *w) { return lpx_float8_weight_is(w) ? lpx_tensor_inner(w, 0) : NULL; }

lpx_dtype lpx_float8_weight_fp8(const lpx_tensor *w) { return lpx_float8_weight_is(w) ? meta_of(w)->fp8 : -1; }

bool lpx_float8_weight_rowwise(const lpx_tensor *w)
{
    return lpx_float8_weight_is(w) && meta_of(w)->rowwise == F8W_ROWWISE;
}

bool lpx_float8_weight_blockwise(const lpx_tensor *w)
{
    return lpx_float8_weight_is(w) && meta_of(w)->rowwise == F8W_BLOCKWISE;
}

float lpx_float8_weight_scale(const lpx_tensor *w) { return lpx_float8_weight_is(w) ? meta_of(w)->state->scale : 0.0f; }

lpx_status lpx_float8_weight_set_scale(lpx_tensor *w, float scale)
{
    if (!lpx_float8_weight_is(w)) return lpx_error(LPX_EINVAL, "lpx_float8_weight_set_scale: w is not a float8_weight");
    if (!(scale >= 0.0f) || !isfinite(scale))
        return lpx_error(LPX_EINVAL, "lpx_float8_weight_set_scale: scale %g is not finite and >= 0", (double)scale);
    meta_of(w)->state->scale = scale;
    return LPX_OK;
}

/* New float8_weight over master (retained) with format and scale. */
static lpx_status make(lpx_tensor *master, lpx_dtype fp8, int rowwise, float scale, lpx_tensor **out)
{
    f8w_meta m;
    memset(&m, 0, sizeof m);
    m.magic = F8W_MAGIC;
    m.fp8 = fp8;
    m.rowwise = rowwise;
    m.state = lpx_calloc(1, sizeof *m.state);
    if (!m.state) return lpx_error(LPX_ENOMEM, "float8_weight: cannot allocate its state");
    m.state->scale = scale;
    lpx_status st = lpx_tensor_new_kind(f8w__kind, lpx_tensor_dtype(master), lpx_tensor_ndim(master),
                                        lpx_tensor_shape(master), lpx_tensor_device(master), &master, 1, &m, sizeof m,
                                        out);
    if (st) lpx_free(m.state); /* no tensor: meta_release will not run */
    return st;
}

lpx_status lpx_float8_weight_new(lpx_tensor *master, const lpx_float8_weight_opts *opts, lpx_tensor **out)
{
    const char *op = "lpx_float8_weight_new";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!master || lpx_tensor_kind(master) || lpx_tensor_ndim(master) < 1)
        return lpx_error(LPX_EINVAL, "%s: master must be a dense tensor with at least one dim", op);
    if (!f8_logical_ok(lpx_tensor_dtype(master)))
        return lpx_error(LPX_EDTYPE, "%s: master dtype %s; expected f32, bf16 or f16", op,
                         lpx_dtype_name(lpx_tensor_dtype(master)));
    lpx_dtype fp8 = opts && opts->fp8 ? opts->fp8 : LPX_F8E4M3FN;
    if (!f8_is_fp8(fp8)) return lpx_error(LPX_EDTYPE, "%s: fp8 %s is not an fp8 dtype", op, lpx_dtype_name(fp8));
    bool rowwise = opts && opts->rowwise;
    /* `blockwise` was appended: read only when the caller's struct has it */
    bool blockwise = opts && (opts->struct_size == 0 || opts->struct_size >= offsetof(lpx_float8_weight_opts, blockwise) +
                                                                                  sizeof opts->blockwise) &&
                     opts->blockwise;
    if (rowwise && blockwise) return lpx_error(LPX_EINVAL, "%s: rowwise and blockwise both set; pick one", op);
    if (rowwise && lpx_tensor_ndim(master) < 2)
        return lpx_error(LPX_EINVAL, "%s: rowwise scaling needs a 2-D or higher master", op);
    if (blockwise && lpx_tensor_ndim(master) != 2)
        return lpx_error(LPX_EINVAL, "%s: blockwise scaling needs a 2-D master", op);
    return make(master, fp8, blockwise ? F8W_BLOCKWISE : rowwise ? F8W_ROWWISE : F8W_TENSORWISE, 0.0f, out);
}

/* ---- all-gather hooks -------------------------------------------- */

/* All-reduce MAX of one amax over comm. `dev` is where the comm wants
 * its buffers (lpx_fsdp_hook_ctx.device): host memory for the CPU (or
 * zero), else the value makes a round trip through a one-element tensor
 * on that device (an NCCL comm refuses host memory). */
/* this rank's amax of a master shard (0 when empty) */
static lpx_status master_amax(const lpx_tensor *master, float *out)
{
    *out = 0.0f;
    if (lpx_tensor_numel(master) == 0) return LPX_OK;
    lpx_tensor *a = NULL;
    double v = 0;
    lpx_status st = lpx_amax((lpx_tensor *)master, 0, NULL, false, &a);
    if (!st) st = lpx_item(a, 0, &v);
    lpx_tensor_release(a);
    *out = (float)v;
    return st;
}

static lpx_status amax_all_reduce(lpx_comm *comm, lpx_device dev, float *amax)
{
    if (dev.type == 0 || dev.type == LPX_DEVICE_CPU)
        return lpx_comm_all_reduce_buf(comm, amax, amax, 1, LPX_F32, LPX_REDUCE_MAX);
    lpx_tensor *h = NULL, *d = NULL, *back = NULL;
    lpx_status st = lpx_full(0, NULL, *amax, LPX_F32, lpx_cpu(), &h);
    if (!st) st = lpx_tensor_to(h, dev, &d);
    if (!st) st = lpx_comm_all_reduce_buf(comm, lpx_tensor_data(d), lpx_tensor_data(d), 1, LPX_F32, LPX_REDUCE_MAX);
    if (!st) st = lpx_tensor_to(d, lpx_cpu(), &back);
    if (!st) *amax = *(const float *)lpx_tensor_data(back);
    lpx_tensor_release(h);
    lpx_tensor_release(d);
    lpx_tensor_release(back);
    return st;
}

/* scale = fp8_max / max(amax, 1e-12) (the dynamic formula), as a scalar
 * tensor, clamped to what the master's dtype can hold (docs/NUMERICS.md) */
static lpx_status scale_of_amax(float amax, lpx_dtype fp8, lpx_dtype master, lpx_tensor **scale)
{
    lpx_tensor *at = NULL;
    lpx_status st = lpx_full(0, NULL, amax, LPX_F32, lpx_cpu(), &at);
    if (!st) st = lpx_fp8_scale_from_amax(at, fp8, false, f8_scale_limit(master), scale, NULL);
    lpx_tensor_release(at);
    return st;
}

/* The replicated tensorwise scale of this shard (precomputed, or one
 * all-reduce MAX of the amax over ctx's comm). */
static lpx_status shard_scale(const lpx_tensor *shard, void *ctx, lpx_tensor **scale)
{
    const f8w_meta *m = meta_of(shard);
    lpx_tensor *master = lpx_tensor_inner(shard, 0);
    if (m->state->scale > 0) return lpx_full(0, NULL, m->state->scale, LPX_F32, lpx_cpu(), scale);
    float amax = 0.0f;
    lpx_status st = master_amax(master, &amax);
    if (st) return st;
    lpx_fsdp_hook_ctx *h = ctx;
    /* the fields a caller's struct_size covers: comm and the counter since
     * the first version, the device since offload */
    if (h && h->struct_size >= offsetof(lpx_fsdp_hook_ctx, amax_allreduces) + sizeof h->amax_allreduces && h->comm) {
        lpx_device dev = lpx_cpu();
        if (h->struct_size >= offsetof(lpx_fsdp_hook_ctx, device) + sizeof h->device) dev = h->device;
        if ((st = amax_all_reduce(h->comm, dev, &amax))) return st;
        h->amax_allreduces++;
    }
    return scale_of_amax(amax, m->fp8, lpx_tensor_dtype(master), scale);
}

/* Casts a master shard to float8 the way the all-gather sends it. */
static lpx_status cast_shard(const lpx_tensor *shard, void *ctx, lpx_tensor **f8)
{
    const f8w_meta *m = meta_of(shard);
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.fp8 = m->fp8;
    o.role = LPX_FLOAT8_ROLE_WEIGHT;
    lpx_tensor *scale = NULL;
    lpx_status st;
    if (m->rowwise == F8W_BLOCKWISE) {
        o.granularity = LPX_FLOAT8_BLOCK;   /* 128 x 128 for a weight */
        o.pow2_scale = true;
    } else if (m->rowwise == F8W_ROWWISE) {
        o.granularity = LPX_FLOAT8_AXISWISE;
        o.axis = -1;
    } else {
        if ((st = shard_scale(shard, ctx, &scale))) return st;
        /* the scale is made on the host; a master on a device (a
         * device-resident engine) casts with it there */
        lpx_device md = lpx_tensor_device(lpx_tensor_inner(shard, 0));
        if (md.type != LPX_DEVICE_CPU) {
            lpx_tensor *d = NULL;
            st = lpx_tensor_to(scale, md, &d);
            lpx_tensor_release(scale);
            scale = d;
            if (st) return st;
        }
        o.scale = scale;
    }
    st = lpx_float8_quantize(lpx_tensor_inner(shard, 0), &o, f8, NULL);
    lpx_tensor_release(scale);
    return st;
}

static lpx_status f8w_pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs,
                                     void *meta, size_t *meta_size)
{
    const char *op = "float8_weight pre_all_gather";
    if (!lpx_float8_weight_is(shard)) return lpx_error(LPX_EINVAL, "%s: shard is not a float8_weight", op);
    lpx_tensor *f8 = NULL;
    lpx_status st = cast_shard(shard, ctx, &f8);
    if (st) return st;
    st = f8_pre_all_gather(f8, ctx, inputs, ninputs, meta, meta_size);
    lpx_tensor_release(f8);
    return st;
}

static lpx_status f8w_post_all_gather(const lpx_kind *kind, lpx_tensor *const *outputs, int noutputs,
                                      const void *meta, size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out,
                                      lpx_tensor **result)
{
    (void)kind;
    return f8_post_all_gather(f8__kind, outputs, noutputs, meta, meta_size, param_dtype, out, result);
}

static void f8w_meta_release(void *meta, size_t size)
{
    if (size == sizeof(f8w_meta)) lpx_free(((f8w_meta *)meta)->state);
}

static lpx_status f8w_to_dense(const lpx_tensor *t, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "float8_weight to_dense: out is NULL");
    *out = NULL;
    if (!lpx_float8_weight_is(t)) return lpx_error(LPX_EINVAL, "float8_weight to_dense: t is not a float8_weight");
    lpx_tensor *f = NULL;
    lpx_status st = lpx_cast(lpx_tensor_inner(t, 0), LPX_F32, false, &f);
    if (!st) st = lpx_contiguous(f, out);
    lpx_tensor_release(f);
    return st;
}

/* from_dense: a copy of x as the master, tensorwise e4m3fn, with the scale
 * of the whole tensor precomputed (what lpx_fsdp_group_precompute_scales sets
 * on one rank). Precomputing is what makes every dim-0 shard cast with the
 * same replicated scale without a comm, so sharding such a tensor is
 * self-contained. A caller that then updates the master re-runs
 * lpx_fsdp_group_precompute_scales (or sets the scale to 0 for the per-gather
 * all-reduce) as with any float8_weight. */
static lpx_status f8w_from_dense(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out)
{
    (void)kind;
    const char *op = "float8_weight from_dense";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s: x is a '%s' tensor, not dense", op, lpx_kind_name(lpx_tensor_kind(x)));
    lpx_tensor *master = NULL, *w = NULL, *scale = NULL;
    lpx_status st = lpx_contiguous(x, &master);
    /* contiguous returns x itself when it already is: the master must be
     * the weight's own storage, updated in place by the optimizer */
    if (!st && master == x) {
        lpx_tensor_release(master);
        master = NULL;
        st = lpx_clone(x, &master);
    }
    if (!st) st = lpx_float8_weight_new(master, NULL, &w);
    if (!st) st = shard_scale(w, NULL, &scale);
    double v = 0;
    if (!st) st = lpx_item(scale, 0, &v);
    if (!st) st = lpx_float8_weight_set_scale(w, (float)v);
    if (st) lpx_tensor_release(w);
    else *out = w;
    lpx_tensor_release(master);
    lpx_tensor_release(scale);
    return st;
}

/* Untrusted: checks everything. The precomputed scale lives behind a
 * pointer in the blob, which is never followed here: the rebuilt tensor
 * has no precomputed scale (it is per-step state, recomputed after each
 * optimizer step). */
static lpx_status f8w_unflatten(const lpx_kind *kind, lpx_dtype logical, int ndim, const int64_t *shape,
                                lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                                lpx_tensor **out)
{
    (void)kind;
    const char *op = "float8_weight unflatten";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    f8w_meta m;
    if (!meta || meta_size != sizeof m)
        return lpx_error(LPX_EINVAL, "%s: metadata of %zu bytes, expected %zu", op, meta_size, sizeof m);
    memcpy(&m, meta, sizeof m);
    if (m.magic != F8W_MAGIC || !f8_is_fp8(m.fp8) || m.rowwise < F8W_TENSORWISE || m.rowwise > F8W_BLOCKWISE)
        return lpx_error(LPX_EINVAL, "%s: metadata is not a float8_weight's (magic, fp8 dtype or rowwise flag)", op);
    if (!inner || ninner != 1 || !inner[0])
        return lpx_error(LPX_EINVAL, "%s: needs exactly 1 inner tensor (the master), got %d", op, inner ? ninner : 0);
    lpx_tensor *master = inner[0];
    if (lpx_tensor_kind(master) || !f8_logical_ok(lpx_tensor_dtype(master)) || lpx_tensor_dtype(master) != logical)
        return lpx_error(LPX_EDTYPE, "%s: the master must be a dense f32/bf16/f16 tensor of the logical dtype %s", op,
                         lpx_dtype_name(logical));
    if (!shape || ndim != lpx_tensor_ndim(master) || ndim < (m.rowwise ? 2 : 1) ||
        (m.rowwise == F8W_BLOCKWISE && ndim != 2) ||
        memcmp(shape, lpx_tensor_shape(master), (size_t)ndim * sizeof *shape))
        return lpx_error(LPX_ESHAPE, "%s: the shape does not match the master's", op);
    return make(master, m.fp8, m.rowwise, 0.0f, out);
}

/* The value of a float8_weight is its master, so from_dense/to_dense are
 * exact; max_err bounds the fp8 wire: the all-gather gives a float8
 * tensor (e4m3 tensorwise: within 16/448 of the amax, as float8's). */
static const lpx_kind_conformance f8w_conformance = {
    .struct_size = sizeof(lpx_kind_conformance),
    .max_err = 0.04,
    .min_sqnr_db = 200,
    .op_rtol = 1e-6,
    .op_atol = 1e-12,
    .all_gather_kind = "float8",
};

static int f8w_describe(const lpx_tensor *t, char *buf, size_t len)
{
    if (!buf || !len) return 0;
    char sh[128];
    const f8w_meta *m = meta_of(t);
    int n = snprintf(buf, len, "float8_weight %s %s -> %s %s scale=%g", lpx_tensor_shape_str(t, sh, sizeof sh),
                     lpx_dtype_name(lpx_tensor_dtype(t)), lpx_dtype_name(m->fp8),
                     m->rowwise == F8W_BLOCKWISE ? "blockwise" : m->rowwise ? "rowwise" : "tensorwise",
                     (double)m->state->scale);
    return n < 0 ? 0 : n;
}

/* ---- op handlers --------------------------------------------------- */

/* Replaces float8_weight tensor arguments by their masters and dispatches
 * again: the op runs on the high-precision weight. */
static lpx_status run_on_masters(lpx_call *c, lpx_call *inner, lpx_value *args)
{
    for (int i = 0; i < c->nargs; i++) {
        args[i] = c->args[i];
        if (args[i].tag == LPX_TAG_TENSOR && lpx_float8_weight_is(args[i].u.t))
            args[i].u.t = lpx_tensor_inner(args[i].u.t, 0);
    }
    lpx_call_init(inner, c->op, args, c->nargs);
    return lpx_dispatch(inner);
}

static lpx_status f8w_fallback(lpx_call *c)
{
    for (int i = 0; i < c->nargs; i++)
        if (c->args[i].tag == LPX_TAG_TENSORS)
            return lpx_error(LPX_ENOTIMPL, "%s (float8_weight): tensor-list arguments are not unwrapped",
                             lpx_op_name(c->op));
    lpx_value args[LPX_MAX_ARGS];
    lpx_call inner;
    lpx_status st = run_on_masters(c, &inner, args);
    if (st) return st;
    c->nrets = inner.nrets;
    for (int i = 0; i < inner.nrets; i++) c->rets[i] = inner.rets[i];
    return LPX_OK;
}

/* view-like ops: the result wraps the master's result again */
static lpx_status f8w_rewrap(lpx_call *c)
{
    const f8w_meta *m = meta_of(c->args[0].u.t);
    lpx_value args[LPX_MAX_ARGS];
    lpx_call inner;
    lpx_status st = run_on_masters(c, &inner, args);
    if (st) return st;
    lpx_tensor *r = inner.rets[0].u.t, *w = NULL;
    st = make(r, m->fp8, m->rowwise, m->state->scale, &w);
    lpx_call_release_rets(&inner);
    if (st) return st;
    c->rets[0] = lpx_v_tensor(w);
    c->nrets = 1;
    return LPX_OK;
}

/* ---- what the sharding engine asks (lpx_kind_i.master, sync_*) ------ */

static lpx_tensor *f8w_master(const lpx_tensor *t) { return lpx_float8_weight_master(t); }

/* Blockwise weights are cut at whole 128-row blocks, so that each
 * block's amax (and the cast's block grid) lives on one rank. */
static int64_t f8w_shard_unit(const lpx_tensor *t)
{
    return lpx_float8_weight_blockwise(t) ? LPX_FLOAT8_BLOCK_SIZE : 1;
}

/* tensorwise: one value, the amax, agreed by MAX into the replicated
 * scale; rowwise and block scales are each row's or block's own: nothing
 * to agree */
static int f8w_sync_count(const lpx_tensor *t, int *reduce_op)
{
    *reduce_op = LPX_REDUCE_MAX;
    return lpx_float8_weight_is(t) && !meta_of(t)->rowwise ? 1 : 0;
}

static lpx_status f8w_sync_local(const lpx_tensor *t, float *values)
{
    return master_amax(lpx_tensor_inner(t, 0), values);
}

static lpx_status f8w_sync_apply(lpx_tensor *t, const float *values)
{
    lpx_tensor *s = NULL;
    double sv = 0;
    lpx_status st = scale_of_amax(values[0], meta_of(t)->fp8, lpx_tensor_dtype(lpx_tensor_inner(t, 0)), &s);
    if (!st) st = lpx_item(s, 0, &sv);
    if (!st) st = lpx_float8_weight_set_scale(t, (float)sv);
    lpx_tensor_release(s);
    return st;
}

lpx_status lpx_float8_weight_register_kind(void)
{
    lpx_kind_i vt;
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.abi_version = LPX_KIND_ABI_VERSION;
    vt.name = "float8_weight";
    vt.priority = LPX_PRIORITY_WRAPPER;
    vt.pre_all_gather = f8w_pre_all_gather;
    vt.post_all_gather = f8w_post_all_gather;
    vt.describe = f8w_describe;
    vt.meta_release = f8w_meta_release;
    vt.to_dense = f8w_to_dense;
    vt.from_dense = f8w_from_dense;
    vt.unflatten = f8w_unflatten;
    vt.conformance = &f8w_conformance;
    vt.master = f8w_master;
    vt.sync_count = f8w_sync_count;
    vt.sync_local = f8w_sync_local;
    vt.sync_apply = f8w_sync_apply;
    vt.shard_unit = f8w_shard_unit;
    const lpx_kind *k = NULL;
    lpx_status st = lpx_kind_register(&vt, &k);
    if (st) return st;
    f8w__kind = k;
    int key = lpx_kind_key(k);
    static const lpx_op views[] = {LPX_OP_narrow, LPX_OP_slice, LPX_OP_clone, LPX_OP_detach, LPX_OP_contiguous};
    for (size_t i = 0; i < sizeof views / sizeof *views && !st; i++)
        st = lpx_kernel_register(views[i], key, f8w_rewrap, NULL);
    if (!st) st = lpx_fallback_register(key, f8w_fallback, NULL);
    return st;
}
