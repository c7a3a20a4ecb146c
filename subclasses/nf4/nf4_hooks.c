/* All-gather hooks of the nf4 kind (the sharding engine's only view of it).
 *
 * Dim-0 shards of an nf4 weight are lpx_narrow/lpx_chunk slices cut at
 * scaler-block boundaries (the kind's shard_unit), so each shard's codes,
 * qscalers and factors are exact pieces of the full tensor's, and the mean
 * is the full tensor's (shared, not recomputed). Gathering the pieces in
 * rank order therefore rebuilds the full payload bit for bit, for any
 * world size: the last non-empty shard carries the zero-padded tail, and
 * empty trailing shards contribute nothing.
 *
 * On the wire, per shard (all 1-D, dim 0 gathered):
 *   0 codes u8, 1 qscalers i8, 2 factors f32  - the shard's payload
 *   3 rows i64 [1]                              - the shard's dim-0 size
 *   4 mean f32 [1]                              - the shared mean
 * The row counts give the full shape without the shard knowing it, and
 * the means let post_all_gather refuse shards that were quantized
 * separately (they would not form one tensor). The metadata carries the
 * block sizes, the logical dtype and the trailing dims.
 *
 * Contract with the engine: outputs[i] is the concatenation along dim 0 of
 * every rank's inputs[i] in rank order (wire padding removed). The result
 * copies the outputs into its own storage, so the engine may reuse its
 * buffers; with `out` the copy goes into out's payload in place. */
#include <string.h>
#include "nf4_internal.h"

#define NF4_AG_MAGIC 0x4734464Eu /* "NF4G" */
#define NF4_AG_VERSION 1u
#define NF4_AG_INPUTS 5

typedef struct nf4_ag_meta {
    uint32_t magic, version;
    int64_t block, scaler_block;
    int32_t dtype, ndim;
    int64_t trailing[LPX_MAX_DIMS];   /* shape[1..ndim) */
} nf4_ag_meta;

_Static_assert(sizeof(nf4_ag_meta) <= LPX_MAX_META, "nf4 all-gather metadata must fit the engine's blob");

lpx_status nf4_pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs, void *meta,
                              size_t *meta_size)
{
    (void)ctx;
    const char *op = "nf4 pre_all_gather";
    if (!inputs || !ninputs || !meta || !meta_size)
        return lpx_error(LPX_EINVAL, "%s: NULL output argument", op);
    *ninputs = 0;
    nf4_parts p;
    lpx_status st = nf4_parts_of(op, "shard", shard, &p);
    if (st) return st;
    if (p.m.transposed || p.ndim == 0)
        return lpx_error(LPX_EINVAL, "%s: an nf4 shard must be untransposed with a dim 0 (dim-0 sharding)", op);
    lpx_tensor *rows = NULL;
    int64_t one = 1;
    if ((st = lpx_full(1, &one, (double)p.srows, LPX_I64, lpx_tensor_device(p.in[0]), &rows))) return st;
    for (int i = 0; i < 3; i++) {
        lpx_tensor_retain(p.in[i]);
        inputs[i] = p.in[i];
    }
    inputs[3] = rows;
    lpx_tensor_retain(p.in[3]);
    inputs[4] = p.in[3];
    *ninputs = NF4_AG_INPUTS;
    nf4_ag_meta m;
    memset(&m, 0, sizeof m);
    m.magic = NF4_AG_MAGIC;
    m.version = NF4_AG_VERSION;
    m.block = p.m.block;
    m.scaler_block = p.m.scaler_block;
    m.dtype = lpx_tensor_dtype(shard);
    m.ndim = p.ndim;
    for (int d = 1; d < p.ndim; d++) m.trailing[d - 1] = p.sshape[d];
    memcpy(meta, &m, sizeof m);
    *meta_size = sizeof m;
    return LPX_OK;
}

static lpx_status check_wire(const char *op, lpx_tensor *const *out, int i, lpx_dtype dtype)
{
    const lpx_tensor *t = out[i];
    if (!t || lpx_tensor_kind(t) || lpx_tensor_dtype(t) != dtype || lpx_tensor_ndim(t) != 1)
        return lpx_error(LPX_EINVAL, "%s: gathered input %d must be a dense 1-D %s tensor", op, i,
                         lpx_dtype_name(dtype));
    return LPX_OK;
}

lpx_status nf4_post_all_gather(const lpx_kind *kind, lpx_tensor *const *outputs, int noutputs, const void *meta,
                               size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result)
{
    (void)kind;
    const char *op = "nf4 post_all_gather";
    if (!result) return lpx_error(LPX_EINVAL, "%s: result is NULL", op);
    *result = NULL;
    nf4_ag_meta m;
    if (!meta || meta_size != sizeof m)
        return lpx_error(LPX_EINVAL, "%s: metadata is %zu bytes, expected %zu", op, meta_size, sizeof m);
    memcpy(&m, meta, sizeof m);
    if (m.magic != NF4_AG_MAGIC || m.version != NF4_AG_VERSION || m.ndim < 1 || m.ndim > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "%s: malformed metadata (magic 0x%08x, version %u, ndim %d)", op,
                         (unsigned)m.magic, (unsigned)m.version, (int)m.ndim);
    if (noutputs != NF4_AG_INPUTS || !outputs)
        return lpx_error(LPX_EINVAL, "%s: expected %d gathered inputs, got %d", op, NF4_AG_INPUTS, noutputs);
    static const lpx_dtype wire[NF4_AG_INPUTS] = {LPX_U8, LPX_I8, LPX_F32, LPX_I64, LPX_F32};
    lpx_status st;
    for (int i = 0; i < NF4_AG_INPUTS; i++)
        if ((st = check_wire(op, outputs, i, wire[i]))) return st;
    int64_t world = lpx_tensor_shape(outputs[3])[0];
    if (world < 1 || lpx_tensor_shape(outputs[4])[0] != world)
        return lpx_error(LPX_EINVAL, "%s: %lld row counts and %lld means gathered; expected one of each per rank", op,
                         (long long)world, (long long)lpx_tensor_shape(outputs[4])[0]);
    /* the row counts and means are read on the host: gathered on a device
     * (the engine's offload), they are copied down first (a few bytes;
     * on the CPU lpx_tensor_to just retains them) */
    lpx_tensor *hrows = NULL, *hmeans = NULL;
    if ((st = lpx_tensor_to(outputs[3], lpx_cpu(), &hrows)) || (st = lpx_tensor_to(outputs[4], lpx_cpu(), &hmeans))) {
        lpx_tensor_release(hrows);
        return st;
    }
    int64_t rows = 0;
    double mean0 = 0.0;
    for (int64_t r = 0; r < world && !st; r++) {
        double v, mv;
        if ((st = lpx_item(hrows, r, &v)) || (st = lpx_item(hmeans, r, &mv))) break;
        if (!(v >= 0 && v <= 0x1p62) || (int64_t)v > INT64_MAX / 2 - rows) {
            st = lpx_error(LPX_EINVAL, "%s: rank %lld sent %g rows", op, (long long)r, v);
            break;
        }
        rows += (int64_t)v;
        if (r == 0) mean0 = mv;
        else if (mv != mean0)
            st = lpx_error(LPX_EINVAL, "%s: rank %lld has mean %.9g, rank 0 %.9g: the shards were quantized "
                           "separately; all-gather needs dim-0 slices of one nf4 tensor", op, (long long)r, mv, mean0);
    }
    lpx_tensor_release(hrows);
    lpx_tensor_release(hmeans);
    if (st) return st;
    lpx_dtype dtype = param_dtype >= 0 ? param_dtype : m.dtype;
    if (!nf4_logical_dtype_ok(dtype))
        return lpx_error(LPX_EDTYPE, "%s: param dtype %s: nf4 tensors are f32, f16 or bf16", op, lpx_dtype_name(dtype));
    int64_t shape[LPX_MAX_DIMS];
    shape[0] = rows;
    for (int d = 1; d < m.ndim; d++) shape[d] = m.trailing[d - 1];
    lpx_tensor *mean = NULL;
    if ((st = lpx_narrow(outputs[4], 0, 0, 1, &mean))) return st;
    lpx_tensor *inner[LPX_NF4_NINNER] = {outputs[0], outputs[1], outputs[2], mean};
    lpx_nf4_meta nm = nf4_meta_init(m.block, m.scaler_block, lpx_tensor_shape(outputs[0])[0] * 2, false, true);
    /* the gathered pieces must form one valid payload for this shape */
    st = nf4_validate(op, dtype, m.ndim, shape, inner, LPX_NF4_NINNER, &nm, sizeof nm);
    if (!st && out) {
        nf4_parts p;
        if ((st = nf4_parts_of(op, "out", out, &p))) goto done;
        bool same = p.ndim == m.ndim && !p.m.transposed && p.m.whole && p.m.block == nm.block &&
                    p.m.scaler_block == nm.scaler_block && p.m.padded == nm.padded && lpx_tensor_dtype(out) == dtype;
        for (int d = 0; same && d < m.ndim; d++) same = lpx_tensor_shape(out)[d] == shape[d];
        if (!same) {
            st = lpx_error(LPX_EINVAL, "%s: out does not have the gathered layout (shape, dtype, block sizes)", op);
            goto done;
        }
        for (int i = 0; i < LPX_NF4_NINNER && !st; i++) st = lpx_copy_(p.in[i], inner[i]);
        if (!st) {
            lpx_tensor_retain(out);
            *result = out;
        }
    } else if (!st) {
        lpx_tensor *own[LPX_NF4_NINNER] = {NULL, NULL, NULL, NULL};
        for (int i = 0; i < LPX_NF4_NINNER && !st; i++) st = lpx_clone(inner[i], &own[i]);
        if (!st) st = nf4_make(dtype, m.ndim, shape, own, &nm, result);
        for (int i = 0; i < LPX_NF4_NINNER; i++) lpx_tensor_release(own[i]);
    }
done:
    lpx_tensor_release(mean);
    return st;
}
