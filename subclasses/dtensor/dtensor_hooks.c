/* The dtensor kind's optional slots: from_dense / to_dense (how
 * frameworks and the conformance kit make and read instances), dim-0
 * narrow, shard_unit and the all-gather hooks, plus what `lpx
 * conformance` may expect of the kind.
 *
 * from_dense places a dense tensor on a new one-rank mesh that owns its
 * comm (dt_mesh_new_solo), Replicate: the DTensor is self-contained, needs
 * no caller comm, and every op handler with a Replicate rule applies (a
 * dense operand counts as Replicate, so the kit's GEMM recipes run).
 * to_dense is full_tensor, then the local's own to_dense.
 *
 * The all-gather hooks make a DTensor shardable along its dim 0 by a comm
 * outside its mesh: 2-D parallelism where FSDP shards parameters that are
 * already DTensors (tensor parallel over the mesh, FSDP over another
 * comm). They apply when no mesh dim of size > 1 shards tensor dim 0:
 * then the global rows are the local rows, a dim-0 slice of the DTensor
 * is the same slice of its local, and gathering the locals' rows rebuilds
 * the local of the unsharded DTensor. The hooks delegate to the local's
 * kind (a float8 or nf4 local keeps its own wire format), and carry the
 * mesh, the placements and the global trailing dims in their metadata. */
#include <string.h>
#include "dtensor_internal.h"

#define DT_AG_MAGIC 0x47415444u /* "DTAG" */

/* Metadata from pre_all_gather to post_all_gather. The mesh pointer is
 * borrowed: the engine and the kit run post_all_gather while the sharded
 * parameter (which holds a reference) is alive. */
typedef struct dt_ag_meta {
    uint32_t magic;
    int32_t nmesh;
    lpx_mesh *mesh;
    const lpx_kind *local_kind;   /* NULL: a dense local */
    lpx_placement pl[LPX_MESH_MAX_DIMS];
    int32_t ndim;
    uint32_t local_meta_size;
    int64_t gshape[LPX_MAX_DIMS]; /* global shape; dim 0 is rebuilt from the gathered rows */
} dt_ag_meta;

#define DT_AG_LOCAL_META_MAX (LPX_MAX_META - sizeof(dt_ag_meta))
_Static_assert(sizeof(dt_ag_meta) + 64 <= LPX_MAX_META, "a local kind needs room for its own metadata");

/* Why dim-0 slicing/gathering of dt does not map onto its local, or NULL. */
static const char *dim0_sharded(const lpx_tensor *dt, int dim)
{
    const dt_meta *m = dt_meta_of(dt);
    for (int i = 0; i < m->nmesh; i++)
        if (m->pl[i].type == LPX_PLACEMENT_SHARD && m->pl[i].dim == dim && lpx_mesh_size(m->mesh, i) > 1)
            return "a mesh dim of size > 1 shards that dim (redistribute to Replicate first)";
    return NULL;
}

/* ---- from_dense / to_dense ------------------------------------------ */

static lpx_status dt_from_dense(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out)
{
    (void)kind;
    const char *op = "dtensor from_dense";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s: x is a '%s' tensor; from_dense takes a dense one (wrap a kind local with "
                         "lpx_dtensor_from_local)", op, lpx_kind_name(lpx_tensor_kind(x)));
    lpx_mesh *mesh = NULL;
    lpx_tensor *local = NULL;
    /* the DTensor owns its values: later writes to x must not show through */
    lpx_status st = lpx_clone(x, &local);
    if (!st) st = dt_mesh_new_solo(op, &mesh);
    lpx_placement rep = lpx_replicate();
    if (!st) st = dt_make(local, mesh, &rep, lpx_tensor_ndim(x), lpx_tensor_shape(x), lpx_tensor_dtype(x), out);
    lpx_tensor_release(local);
    lpx_mesh_release(mesh);
    return st;
}

static lpx_status dt_to_dense(const lpx_tensor *t, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "dtensor to_dense: out is NULL");
    *out = NULL;
    if (!lpx_dtensor_is(t)) return lpx_error(LPX_EINVAL, "dtensor to_dense: t is not a DTensor");
    lpx_tensor *full = NULL, *d = NULL;
    /* collective unless the tensor is replicated (every rank calls it) */
    lpx_status st = lpx_dtensor_full_tensor((lpx_tensor *)t, &full);
    if (!st) st = lpx_kind_to_dense(full, &d);
    if (!st) st = lpx_contiguous(d, out);
    lpx_tensor_release(full);
    lpx_tensor_release(d);
    return st;
}

/* ---- narrow and shard_unit ---------------------------------------- */

/* narrow(t, dim, start, length) on the local: valid when no mesh dim of
 * size > 1 shards `dim` (global and local indices then agree). */
static lpx_status h_narrow(lpx_call *c)
{
    lpx_tensor *t = c->args[0].u.t;
    int nd = lpx_tensor_ndim(t);
    int64_t dim = c->args[1].u.i < 0 ? c->args[1].u.i + nd : c->args[1].u.i;
    if (dim < 0 || dim >= nd)
        return lpx_error(LPX_EINVAL, "narrow (dtensor): dim %lld out of range for a %d-D tensor",
                         (long long)c->args[1].u.i, nd);
    const char *why = dim0_sharded(t, (int)dim);
    if (why) return lpx_error(LPX_ENOTIMPL, "narrow (dtensor): cannot slice dim %lld: %s", (long long)dim, why);
    const dt_meta *m = dt_meta_of(t);
    for (int i = 0; i < m->nmesh; i++)
        if (m->pl[i].type == LPX_PLACEMENT_PARTIAL && lpx_tensor_kind(lpx_dtensor_local(t)))
            return lpx_error(LPX_ENOTIMPL, "narrow (dtensor): a Partial of a kind local");
    lpx_tensor *loc = NULL, *res = NULL;
    lpx_status st = lpx_narrow(lpx_dtensor_local(t), (int)dim, c->args[2].u.i, c->args[3].u.i, &loc);
    if (st) return st;
    int64_t g[LPX_MAX_DIMS];
    memcpy(g, lpx_tensor_shape(t), (size_t)nd * sizeof *g);
    g[dim] = lpx_tensor_shape(loc)[dim];
    st = dt_make(loc, m->mesh, m->pl, nd, g, lpx_tensor_dtype(t), &res);
    lpx_tensor_release(loc);
    if (st) return st;
    c->rets[0] = lpx_v_tensor(res);
    c->nrets = 1;
    return LPX_OK;
}

static int64_t dt_unit(const lpx_tensor *t) { return dt_shard_unit(lpx_dtensor_local(t), 0); }

/* ---- all-gather hooks ------------------------------------------------ */

static lpx_status dt_pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs, void *meta,
                                    size_t *meta_size)
{
    const char *op = "dtensor pre_all_gather";
    if (!lpx_dtensor_is(shard)) return lpx_error(LPX_EINVAL, "%s: the shard is not a DTensor", op);
    if (!inputs || !ninputs || !meta || !meta_size) return lpx_error(LPX_EINVAL, "%s: NULL argument", op);
    *ninputs = 0;
    const char *why = dim0_sharded(shard, 0);
    if (why) return lpx_error(LPX_ENOTIMPL, "%s: cannot gather dim 0: %s", op, why);
    const dt_meta *m = dt_meta_of(shard);
    lpx_tensor *loc = lpx_dtensor_local(shard);
    for (int i = 0; i < m->nmesh; i++)
        if (m->pl[i].type == LPX_PLACEMENT_PARTIAL)
            return lpx_error(LPX_ENOTIMPL, "%s: mesh dim %d is Partial; reduce it first", op, i);
    unsigned char lmeta[LPX_MAX_META];
    size_t lms = 0;
    dt_wire_desc desc;
    lpx_status st = dt_pre_gather(op, loc, ctx, inputs, ninputs, lmeta, &lms, &desc);
    if (st) return st;
    if (lms > DT_AG_LOCAL_META_MAX) {
        for (int i = 0; i < *ninputs; i++) lpx_tensor_release(inputs[i]);
        *ninputs = 0;
        return lpx_error(LPX_ENOTIMPL, "%s: the %s local needs %zu bytes of metadata, a DTensor can carry %zu", op,
                         lpx_kind_name(lpx_tensor_kind(loc)), lms, (size_t)DT_AG_LOCAL_META_MAX);
    }
    dt_ag_meta am;
    memset(&am, 0, sizeof am);
    am.magic = DT_AG_MAGIC;
    am.nmesh = m->nmesh;
    am.mesh = m->mesh;
    am.local_kind = lpx_tensor_kind(loc);
    memcpy(am.pl, m->pl, sizeof am.pl);
    am.ndim = lpx_tensor_ndim(shard);
    am.local_meta_size = (uint32_t)lms;
    memcpy(am.gshape, lpx_tensor_shape(shard), (size_t)am.ndim * sizeof *am.gshape);
    memcpy(meta, &am, sizeof am);
    if (lms) memcpy((unsigned char *)meta + sizeof am, lmeta, lms);
    *meta_size = sizeof am + lms;
    return LPX_OK;
}

static lpx_status dt_post_all_gather(const lpx_kind *kind, lpx_tensor *const *outputs, int noutputs, const void *meta,
                                     size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result)
{
    (void)kind;
    const char *op = "dtensor post_all_gather";
    if (!result) return lpx_error(LPX_EINVAL, "%s: result is NULL", op);
    *result = NULL;
    dt_ag_meta am;
    if (!meta || meta_size < sizeof am) return lpx_error(LPX_EINVAL, "%s: metadata of %zu bytes is not a DTensor's", op, meta_size);
    memcpy(&am, meta, sizeof am);
    if (am.magic != DT_AG_MAGIC || am.nmesh < 1 || am.nmesh > LPX_MESH_MAX_DIMS || !am.mesh || am.ndim < 1 ||
        am.ndim > LPX_MAX_DIMS || meta_size != sizeof am + am.local_meta_size)
        return lpx_error(LPX_EINVAL, "%s: metadata is not a DTensor's (magic, mesh or sizes)", op);
    if (!outputs || noutputs < 1 || noutputs > LPX_MAX_AG_INPUTS)
        return lpx_error(LPX_EINVAL, "%s: %d gathered tensors (1..%d expected)", op, noutputs, LPX_MAX_AG_INPUTS);
    if (out && (!lpx_dtensor_is(out) || lpx_tensor_kind(lpx_dtensor_local(out)) != am.local_kind))
        return lpx_error(LPX_EINVAL, "%s: out is not a DTensor with a %s local", op, lpx_kind_name(am.local_kind));
    lpx_tensor *loc = NULL;
    lpx_status st = dt_post_gather(op, am.local_kind, outputs, noutputs, (const unsigned char *)meta + sizeof am,
                                   am.local_meta_size, param_dtype, out ? lpx_dtensor_local(out) : NULL, &loc);
    if (st) return st;
    if (lpx_tensor_ndim(loc) != am.ndim) {
        lpx_tensor_release(loc);
        return lpx_error(LPX_ESHAPE, "%s: the local rebuilt has %d dims, the DTensor %d", op, lpx_tensor_ndim(loc),
                         (int)am.ndim);
    }
    if (out) {
        lpx_tensor *same = lpx_dtensor_local(out);
        lpx_tensor_release(loc);
        if (loc != same) return lpx_error(LPX_EINTERNAL, "%s: the local kind did not refill out in place", op);
        lpx_tensor_retain(out);
        *result = out;
        return LPX_OK;
    }
    am.gshape[0] = lpx_tensor_shape(loc)[0];
    st = dt_make(loc, am.mesh, am.pl, am.ndim, am.gshape, param_dtype, result);
    lpx_tensor_release(loc);
    return st;
}

/* ---- what the conformance kit may expect ---------------------------- */

static const lpx_conformance_na dt_not_applicable[] = {
    {"flatten_unflatten", "a DTensor's metadata holds a process-local mesh pointer, so unflatten refuses every "
                          "blob by design (save the local tensor, rebuild with lpx_dtensor_from_local)"},
    {NULL, NULL},
};

/* A DTensor holds its values unchanged (from_dense clones, to_dense
 * gathers): quantization is exact, and every op runs the dense op on the
 * local, so results agree bit for bit. The bounds are tiny but not zero
 * (zero means "the kit's default"). */
static const lpx_kind_conformance dt_conformance = {
    .struct_size = sizeof(lpx_kind_conformance),
    .ndim = 2,
    .shape = {64, 96},
    .max_err = 1e-12,
    .min_sqnr_db = 200,
    .op_rtol = 1e-6,
    .op_atol = 1e-12,
    .not_applicable = dt_not_applicable,
};

void dt_fill_vtable(lpx_kind_i *vt)
{
    vt->from_dense = dt_from_dense;
    vt->to_dense = dt_to_dense;
    vt->shard_unit = dt_unit;
    vt->pre_all_gather = dt_pre_all_gather;
    vt->post_all_gather = dt_post_all_gather;
    vt->conformance = &dt_conformance;
}

lpx_status dt_register_view_handlers(int key) { return lpx_kernel_register(LPX_OP_narrow, key, h_narrow, NULL); }
