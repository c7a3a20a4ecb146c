/* All-gather hooks of the float8 kind, for dim-0 sharding (FSDP).
 *
 * pre_all_gather puts the shard's fp8 bytes on the wire (1 byte per
 * element: the point of fp8 all-gather):
 *   tensorwise:          [data]; the scale travels in the metadata, so all
 *                        shards must share one scale (the engine's
 *                        precompute step agrees on it with an all-reduce
 *                        MAX of the amaxes before the gather);
 *   row scales (axiswise over the last dim, ndim >= 2):
 *                        [data, scale, scale_inv], all cut along dim 0
 *                        with their rows.
 * Other scalings (scales reduced over dim 0, i.e. one per column, differ
 * per shard) are refused with LPX_ENOTIMPL.
 *
 * post_all_gather wraps the gathered tensors (retained, not copied, like
 * torchao's Float8Tensor over the all-gather output) or, given `out`,
 * copies them into out's storage and returns it. Gathered fp8 data may
 * arrive as u8 bytes; it is reinterpreted without a copy. */
#include <string.h>
#include "float8_internal.h"

#define AG_MAGIC 0x47413846u  /* "F8AG" */

typedef struct f8_ag_meta {
    uint32_t magic;
    int32_t ninputs;
    int32_t logical;
    int32_t fp8;
    f8_meta m;
    float scale, scale_inv;   /* tensorwise */
} f8_ag_meta;

static bool row_scaled(const lpx_tensor *t)
{
    const f8_meta *m = f8_meta_of(t);
    return m->granularity == LPX_FLOAT8_AXISWISE && lpx_tensor_ndim(t) >= 2 && m->axis == lpx_tensor_ndim(t) - 1;
}

lpx_status f8_pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs, void *meta,
                             size_t *meta_size)
{
    (void)ctx;
    const char *what = "float8 pre_all_gather";
    if (!f8_is(shard) || !inputs || !ninputs || !meta || !meta_size)
        return lpx_error(LPX_EINVAL, "%s: NULL argument or a shard that is not float8", what);
    *ninputs = 0;
    const f8_meta *m = f8_meta_of(shard);
    f8_ag_meta am;
    memset(&am, 0, sizeof am);
    am.magic = AG_MAGIC;
    am.logical = lpx_tensor_dtype(shard);
    am.fp8 = lpx_tensor_dtype(f8_data(shard));
    am.m = *m;
    lpx_tensor *srcs[3] = {f8_data(shard), f8_scale(shard), f8_scale_inv(shard)};
    int n;
    if (m->granularity == LPX_FLOAT8_TENSORWISE) {
        double s, si;
        lpx_status st;
        /* the replicated scale rides in the metadata: read where it lives
         * (a resident float8_weight keeps it on the device; lpx_item
         * copies the one value through the device's backend) */
        if ((st = lpx_item(srcs[1], 0, &s)) || (st = lpx_item(srcs[2], 0, &si))) return st;
        am.scale = (float)s;
        am.scale_inv = (float)si;
        n = 1;
    } else if (row_scaled(shard) || m->granularity == LPX_FLOAT8_BLOCK) {
        /* row scales, or block scales whose grid rows follow the data's
         * (shards are cut at whole row blocks: the shard unit) */
        n = 3;
    } else {
        return lpx_error(LPX_ENOTIMPL,
                         "%s: scales reduced over dim %d differ per dim-0 shard; only tensorwise and row-scaled "
                         "(axiswise over the last dim) float8 tensors can be sharded",
                         what, (int)m->axis);
    }
    for (int i = 0; i < n; i++) {
        lpx_status st = lpx_contiguous(srcs[i], &inputs[i]);
        if (st) {
            f8_release_all(inputs, i);
            return st;
        }
    }
    am.ninputs = n;
    memcpy(meta, &am, sizeof am);
    *meta_size = sizeof am;
    *ninputs = n;
    return LPX_OK;
}

static void release_deleter(void *data, void *ctx)
{
    (void)data;
    lpx_tensor_release(ctx);
}

/* t as fp8 dtype `fp8`: retained if it already is, a no-copy
 * reinterpretation of u8 bytes, else an error. */
static lpx_status as_fp8(const char *what, lpx_tensor *t, lpx_dtype fp8, lpx_tensor **out)
{
    lpx_dtype d = lpx_tensor_dtype(t);
    if (d == fp8) {
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    if (d != LPX_U8 || lpx_tensor_kind(t))
        return lpx_error(LPX_EDTYPE, "%s: gathered data has dtype %s; expected %s (or u8 bytes)", what,
                         lpx_dtype_name(d), lpx_dtype_name(fp8));
    lpx_tensor_retain(t);
    lpx_status st = lpx_tensor_from_blob(lpx_tensor_data(t), fp8, lpx_tensor_ndim(t), lpx_tensor_shape(t),
                                         lpx_tensor_strides(t), lpx_tensor_device(t), release_deleter, t, out);
    if (st) lpx_tensor_release(t);
    return st;
}

lpx_status f8_post_all_gather(const lpx_kind *kind, lpx_tensor *const *outputs, int noutputs, const void *meta,
                              size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result)
{
    (void)kind;
    const char *what = "float8 post_all_gather";
    if (!result) return lpx_error(LPX_EINVAL, "%s: result is NULL", what);
    *result = NULL;
    f8_ag_meta am;
    if (!meta || meta_size != sizeof am) return lpx_error(LPX_EINVAL, "%s: metadata of %zu bytes", what, meta_size);
    memcpy(&am, meta, sizeof am);
    if (am.magic != AG_MAGIC || (am.ninputs != 1 && am.ninputs != 3) || !f8_is_fp8(am.fp8))
        return lpx_error(LPX_EINVAL, "%s: metadata is not from float8 pre_all_gather", what);
    if (noutputs != am.ninputs || !outputs)
        return lpx_error(LPX_EINVAL, "%s: %d gathered tensors, pre_all_gather sent %d", what, noutputs, am.ninputs);
    for (int i = 0; i < noutputs; i++)
        if (!outputs[i] || lpx_tensor_kind(outputs[i]))
            return lpx_error(LPX_EINVAL, "%s: gathered tensor %d is NULL or not dense", what, i);
    lpx_dtype logical = f8_logical_ok(param_dtype) ? param_dtype : am.logical;
    lpx_tensor *d = NULL, *s = NULL, *si = NULL;
    lpx_status st = as_fp8(what, outputs[0], am.fp8, &d);
    if (st) return st;
    if (am.ninputs == 1) {
        if (!(st = lpx_full(0, NULL, am.scale, LPX_F32, lpx_tensor_device(d), &s)))
            st = lpx_full(0, NULL, am.scale_inv, LPX_F32, lpx_tensor_device(d), &si);
    } else {
        s = outputs[1];
        si = outputs[2];
        lpx_tensor_retain(s);
        lpx_tensor_retain(si);
    }
    if (!st) {
        lpx_tensor *inner[F8_NINNER] = {d, s, si};
        st = f8_validate(what, logical, lpx_tensor_ndim(d), lpx_tensor_shape(d), inner, F8_NINNER, &am.m, sizeof am.m);
    }
    if (!st && out) {
        /* refill out in place: same geometry required */
        if (!f8_is(out) || lpx_tensor_ndim(out) != lpx_tensor_ndim(d) ||
            memcmp(lpx_tensor_shape(out), lpx_tensor_shape(d), (size_t)lpx_tensor_ndim(d) * sizeof(int64_t)) ||
            lpx_tensor_dtype(f8_data(out)) != am.fp8 || f8_meta_of(out)->granularity != am.m.granularity) {
            st = lpx_error(LPX_EINVAL, "%s: out is not a float8 tensor of the gathered shape, format and scaling", what);
        } else {
            if (!lpx_tensor_shares_storage(f8_data(out), d)) st = lpx_copy_(f8_data(out), d);
            if (!st) st = lpx_copy_(f8_scale(out), s);
            if (!st) st = lpx_copy_(f8_scale_inv(out), si);
            if (!st) {
                lpx_tensor_retain(out);
                *result = out;
            }
        }
    } else if (!st) {
        st = f8_make(d, s, si, logical, &am.m, result);
    }
    lpx_tensor *tmp[3] = {d, s, si};
    f8_release_all(tmp, 3);
    return st;
}
