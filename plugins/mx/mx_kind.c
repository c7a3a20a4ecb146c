/* The kinds mxfp8 and mxfp4: vtables (unflatten, all-gather hooks, shard
 * unit, describe, from/to dense) and what the conformance kit may expect. */
#include <stdio.h>
#include <string.h>
#include "mx.h"

const lpx_kind *mx_kind_fp8, *mx_kind_fp4;

static mx_format format_of_kind(const lpx_kind *k) { return k == mx_kind_fp8 ? MX_FP8 : MX_FP4; }

static lpx_status unflatten(const lpx_kind *k, lpx_dtype logical, int ndim, const int64_t *shape,
                            lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                            lpx_tensor **out)
{
    mx_format f = format_of_kind(k);
    const char *fmt = mx_format_name(f);
    *out = NULL;
    if (ninner != 2 || !inner)
        return lpx_error(LPX_EINVAL, "unflatten(%s): expected 2 inner tensors (elements, scales), got %d", fmt, ninner);
    mx_meta m;
    if (!meta || meta_size != sizeof m)
        return lpx_error(LPX_EINVAL, "unflatten(%s): meta_size %zu, expected %zu", fmt, meta_size, sizeof m);
    memcpy(&m, meta, sizeof m);
    if (m.magic != MX_MAGIC || m.format != (uint32_t)f || m.block != MX_BLOCK)
        return lpx_error(LPX_EINVAL, "unflatten(%s): metadata is not %s with blocks of %d (magic 0x%x, format %u, "
                         "block %u)", fmt, fmt, MX_BLOCK, m.magic, m.format, m.block);
    return mx_wrap("unflatten", f, logical, ndim, shape, inner[0], inner[1], out);
}

/* what travels beside the gathered bytes */
typedef struct ag_meta {
    uint32_t magic, format;
    int32_t logical;
    int32_t ndim;
    int64_t trailing[LPX_MAX_DIMS - 1];   /* shape[1:] */
} ag_meta;

static lpx_status pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs,
                                 void *meta, size_t *meta_size)
{
    (void)ctx;
    *ninputs = 0;
    mx_format f = mx_format_of(shard);
    if (!f) return lpx_error(LPX_EINVAL, "pre_all_gather(mx): shard is not an MX tensor");
    int ndim = lpx_tensor_ndim(shard);
    const int64_t *shape = lpx_tensor_shape(shard);
    /* a 1-D tensor is gathered along its block dim: without whole blocks the
     * padding of every shard would land inside the gathered tensor */
    if (ndim == 1 && shape[0] % MX_BLOCK)
        return lpx_error(LPX_ESHAPE, "pre_all_gather(%s): a 1-D shard of %lld elements is not whole blocks of %d",
                         mx_format_name(f), (long long)shape[0], MX_BLOCK);
    ag_meta m = {.magic = MX_MAGIC, .format = (uint32_t)f, .logical = lpx_tensor_dtype(shard), .ndim = ndim};
    for (int i = 1; i < ndim; i++) m.trailing[i - 1] = shape[i];
    for (int i = 0; i < 2; i++) {
        inputs[i] = lpx_tensor_inner(shard, i);   /* contiguous rows: ready for the wire */
        lpx_tensor_retain(inputs[i]);
    }
    *ninputs = 2;
    memcpy(meta, &m, sizeof m);
    *meta_size = sizeof m;
    return LPX_OK;
}

static lpx_status post_all_gather(const lpx_kind *k, lpx_tensor *const *outputs, int noutputs, const void *meta,
                                  size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result)
{
    mx_format f = format_of_kind(k);
    const char *fmt = mx_format_name(f);
    *result = NULL;
    ag_meta m;
    if (!meta || meta_size != sizeof m)
        return lpx_error(LPX_EINVAL, "post_all_gather(%s): meta_size %zu, expected %zu", fmt, meta_size, sizeof m);
    memcpy(&m, meta, sizeof m);
    if (m.magic != MX_MAGIC || m.format != (uint32_t)f || m.ndim < 1 || m.ndim > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "post_all_gather(%s): metadata does not come from %s pre_all_gather", fmt, fmt);
    if (noutputs != 2 || !outputs || !outputs[0] || !outputs[1] || lpx_tensor_ndim(outputs[0]) != m.ndim)
        return lpx_error(LPX_EINVAL, "post_all_gather(%s): expected 2 gathered tensors of %d dims, got %d", fmt,
                         m.ndim, noutputs);
    int64_t shape[LPX_MAX_DIMS];
    shape[0] = lpx_tensor_shape(outputs[0])[0];
    for (int i = 1; i < m.ndim; i++) shape[i] = m.trailing[i - 1];
    lpx_dtype logical = lpx_dtype_valid(param_dtype) ? param_dtype : m.logical;
    /* own storage: the engine may free or reuse its wire buffers */
    lpx_tensor *el = NULL, *sc = NULL, *fresh = NULL;
    lpx_status st = mx_copy_inner(outputs[0], &el);
    if (!st) st = mx_copy_inner(outputs[1], &sc);
    if (!st) st = mx_wrap("post_all_gather", f, logical, m.ndim, shape, el, sc, &fresh);
    lpx_tensor_release(el);
    lpx_tensor_release(sc);
    if (st || !out) {
        *result = fresh;
        return st;
    }
    /* in place: same format and shape, bytes copied into out's payload */
    bool same = mx_format_of(out) == f && lpx_tensor_ndim(out) == m.ndim;
    for (int i = 0; same && i < m.ndim; i++) same = lpx_tensor_shape(out)[i] == shape[i];
    if (!same) {
        char a[128], b[128];
        lpx_tensor_shape_str(out, a, sizeof a);
        lpx_tensor_shape_str(fresh, b, sizeof b);
        lpx_tensor_release(fresh);
        return lpx_error(LPX_ESHAPE, "post_all_gather(%s): out is %s %s, the gathered tensor is %s %s", fmt,
                         mx_format_of(out) ? mx_format_name(mx_format_of(out)) : "not MX", a, fmt, b);
    }
    for (int i = 0; i < 2 && !st; i++) st = mx_copy_bytes(lpx_tensor_inner(out, i), lpx_tensor_inner(fresh, i));
    lpx_tensor_release(fresh);
    if (st) return st;
    lpx_tensor_retain(out);
    *result = out;
    return LPX_OK;
}

static int64_t shard_unit(const lpx_tensor *t) { return lpx_tensor_ndim(t) == 1 ? MX_BLOCK : 1; }

static int describe(const lpx_tensor *t, char *buf, size_t len)
{
    mx_format f = mx_format_of(t);
    char s[128];
    int64_t n = lpx_tensor_numel(t), blocks = lpx_tensor_numel(lpx_tensor_inner(t, 1));
    double bits = n ? (double)(lpx_tensor_numel(lpx_tensor_inner(t, 0)) * f + blocks * 8) / (double)n : 0.0;
    return snprintf(buf, len, "%s %s (logical %s): %lld blocks of %d, e8m0 scales, %.2f bits/element",
                    mx_format_name(f), lpx_tensor_shape_str(t, s, sizeof s), lpx_dtype_name(lpx_tensor_dtype(t)),
                    (long long)blocks, MX_BLOCK, bits);
}

static lpx_status from_dense(const lpx_kind *k, lpx_tensor *x, lpx_tensor **out)
{
    return mx_quantize("from_dense", format_of_kind(k), x, out);
}

static lpx_status to_dense(const lpx_tensor *t, lpx_tensor **out) { return mx_to_dense(t, out); }

/* Bounds for the conformance kit (see mx_tensor.c for the error bounds:
 * relative to the block amax, hence to the tensor amax). SQNR floors are
 * a few dB under what N(0,1) data gives (mxfp8 ~31 dB, mxfp4 ~17 dB).
 * Ops compare a tiled dequantize + sgemm with one sgemm on the dequantized
 * weight: only the summation order differs. */
static const lpx_kind_conformance conf_fp8 = {
    .struct_size = sizeof conf_fp8, .ndim = 2, .shape = {64, 96},
    .max_err = 0.125, .min_sqnr_db = 28.0, .op_rtol = 1e-5, .op_atol = 1e-6,
};
static const lpx_kind_conformance conf_fp4 = {
    .struct_size = sizeof conf_fp4, .ndim = 2, .shape = {64, 96},
    .max_err = 0.25, .min_sqnr_db = 14.0, .op_rtol = 1e-5, .op_atol = 1e-6,
};

lpx_status mx_register_kinds(const lpx_host *host)
{
    lpx_kind_i vt = {
        .struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .priority = LPX_PRIORITY_PAYLOAD,
        .unflatten = unflatten, .pre_all_gather = pre_all_gather, .post_all_gather = post_all_gather,
        .shard_unit = shard_unit, .describe = describe, .from_dense = from_dense, .to_dense = to_dense,
    };
    vt.name = "mxfp8";
    vt.conformance = &conf_fp8;
    lpx_status st = host->kind_register(host, &vt, &mx_kind_fp8);
    if (st) return st;
    vt.name = "mxfp4";
    vt.conformance = &conf_fp4;
    return host->kind_register(host, &vt, &mx_kind_fp4);
}
