/* Quantize and dequantize: lpx_float8_quantize (dynamic, static and
 * delayed scaling onto the fused fp8_quantize op), dequantization, and the
 * typed calls of the dense float8 ops. */
#include <math.h>
#include <string.h>
#include "float8_internal.h"

/* ---- typed calls of the dense ops ---------------------------------- */

lpx_status lpx_fp8_quantize(lpx_tensor *x, lpx_tensor *scale, lpx_dtype fp8, const int64_t *dim, bool pow2,
                            double scale_max, bool saturate, lpx_tensor **q, lpx_tensor **scale_out,
                            lpx_tensor **scale_inv, lpx_tensor **stats)
{
    lpx_tensor **outs[4] = {q, scale_out, scale_inv, stats};
    for (int i = 0; i < 4; i++)
        if (outs[i]) *outs[i] = NULL;
    if (!q) return lpx_error(LPX_EINVAL, "fp8_quantize: q is NULL");
    lpx_value args[7] = {lpx_v_tensor(x), lpx_v_opt_tensor(scale), lpx_v_dtype(fp8),
                         dim ? lpx_v_i64(*dim) : lpx_v_none(), lpx_v_bool(pow2), lpx_v_f64(scale_max),
                         lpx_v_bool(saturate)};
    return lpx__call_retn(LPX_OP_fp8_quantize, args, 7, 4, outs);
}

lpx_status lpx_fp8_quantize_t(lpx_tensor *x, lpx_tensor *scale, lpx_dtype fp8, bool axiswise, bool pow2,
                              double scale_max, bool saturate, lpx_tensor **q, lpx_tensor **scale_out,
                              lpx_tensor **scale_inv, lpx_tensor **stats, lpx_tensor **qt, lpx_tensor **scale_t,
                              lpx_tensor **scale_inv_t)
{
    lpx_tensor **outs[7] = {q, scale_out, scale_inv, stats, qt, scale_t, scale_inv_t};
    for (int i = 0; i < 7; i++)
        if (outs[i]) *outs[i] = NULL;
    if (!q || !qt) return lpx_error(LPX_EINVAL, "fp8_quantize_t: %s is NULL", q ? "qt" : "q");
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!x) return lpx_error(LPX_EINVAL, "fp8_quantize_t: x is NULL");
    if (lpx_tensor_ndim(x) != 2) {
        char sx[160];
        return lpx_error(LPX_ESHAPE, "fp8_quantize_t: x has shape %s; the transposed quantize takes a 2-D x [R, C]",
                         lpx_tensor_shape_str(x, sx, sizeof sx));
    }
    /* the transposed outputs, allocated here on x's device (the op fills
     * them in place; its own results are q's) */
    int64_t R = lpx_tensor_shape(x)[0], C = lpx_tensor_shape(x)[1];
    int64_t tshape[2] = {C, R}, sshape[2] = {C, 1};
    lpx_device dev = lpx_tensor_device(x);
    lpx_tensor *t[3] = {NULL, NULL, NULL};
    if ((st = lpx_empty(2, tshape, f8_is_fp8(fp8) ? fp8 : LPX_U8, dev, &t[0])) ||
        (st = lpx_empty(axiswise ? 2 : 0, sshape, LPX_F32, dev, &t[1])) ||
        (st = lpx_empty(axiswise ? 2 : 0, sshape, LPX_F32, dev, &t[2]))) {
        f8_release_all(t, 3);
        return st;
    }
    lpx_value args[10] = {lpx_v_tensor(x), lpx_v_opt_tensor(scale), lpx_v_dtype(fp8), lpx_v_bool(axiswise),
                          lpx_v_bool(pow2), lpx_v_f64(scale_max), lpx_v_bool(saturate), lpx_v_tensor(t[0]),
                          lpx_v_tensor(t[1]), lpx_v_tensor(t[2])};
    if ((st = lpx__call_retn(LPX_OP_fp8_quantize_t, args, 10, 4, outs))) {
        f8_release_all(t, 3);
        return st;
    }
    for (int i = 0; i < 3; i++) {
        if (outs[4 + i]) *outs[4 + i] = t[i];
        else lpx_tensor_release(t[i]);
    }
    return LPX_OK;
}

lpx_status lpx_fp8_quantize_block(lpx_tensor *x, lpx_dtype fp8, int64_t block_rows, int64_t block_cols, bool pow2,
                                  bool saturate, lpx_tensor **q, lpx_tensor **scale, lpx_tensor **scale_inv,
                                  lpx_tensor **stats)
{
    lpx_tensor **outs[4] = {q, scale, scale_inv, stats};
    for (int i = 0; i < 4; i++)
        if (outs[i]) *outs[i] = NULL;
    if (!q) return lpx_error(LPX_EINVAL, "fp8_quantize_block: q is NULL");
    lpx_value args[6] = {lpx_v_tensor(x), lpx_v_dtype(fp8), lpx_v_i64(block_rows), lpx_v_i64(block_cols),
                         lpx_v_bool(pow2), lpx_v_bool(saturate)};
    return lpx__call_retn(LPX_OP_fp8_quantize_block, args, 6, 4, outs);
}

lpx_status lpx_fp8_dequantize_block(lpx_tensor *q, lpx_tensor *scale_inv, int64_t block_rows, int64_t block_cols,
                                    lpx_dtype dtype, lpx_tensor **out)
{
    lpx_value args[5] = {lpx_v_tensor(q), lpx_v_tensor(scale_inv), lpx_v_i64(block_rows), lpx_v_i64(block_cols),
                         lpx_v_dtype(dtype)};
    return lpx__call_ret1(LPX_OP_fp8_dequantize_block, args, 5, out);
}

lpx_status lpx_fp8_mm_block(lpx_tensor *a, lpx_tensor *a_scale_inv, int64_t a_block_rows, int64_t a_block_cols,
                            lpx_tensor *b, lpx_tensor *b_scale_inv, int64_t b_block_rows, int64_t b_block_cols,
                            lpx_tensor *bias, lpx_dtype out_dtype, lpx_tensor **out)
{
    lpx_value args[10] = {lpx_v_tensor(a), lpx_v_tensor(a_scale_inv), lpx_v_i64(a_block_rows),
                          lpx_v_i64(a_block_cols), lpx_v_tensor(b), lpx_v_tensor(b_scale_inv),
                          lpx_v_i64(b_block_rows), lpx_v_i64(b_block_cols), lpx_v_opt_tensor(bias),
                          lpx_v_dtype(out_dtype)};
    return lpx__call_ret1(LPX_OP_fp8_mm_block, args, 10, out);
}

lpx_status lpx_fp8_dequantize(lpx_tensor *q, lpx_tensor *scale_inv, lpx_dtype dtype, lpx_tensor **out)
{
    lpx_value args[3] = {lpx_v_tensor(q), lpx_v_tensor(scale_inv), lpx_v_dtype(dtype)};
    return lpx__call_ret1(LPX_OP_fp8_dequantize, args, 3, out);
}

lpx_status lpx_fp8_scaled_mm_ex(lpx_tensor *a, lpx_tensor *a_scale_inv, lpx_tensor *b, lpx_tensor *b_scale_inv,
                                lpx_tensor *bias, lpx_dtype out_dtype, unsigned flags, lpx_tensor **out)
{
    if (flags & ~(unsigned)LPX_FP8_MM_FAST_ACCUM) {
        if (out) *out = NULL;
        return lpx_error(LPX_EINVAL, "fp8_scaled_mm: unknown flags 0x%x (LPX_FP8_MM_FAST_ACCUM = 1)", flags);
    }
    lpx_value args[7] = {lpx_v_tensor(a), lpx_v_tensor(a_scale_inv), lpx_v_tensor(b), lpx_v_tensor(b_scale_inv),
                         lpx_v_opt_tensor(bias), lpx_v_dtype(out_dtype), lpx_v_bool(flags & LPX_FP8_MM_FAST_ACCUM)};
    return lpx__call_ret1(LPX_OP_fp8_scaled_mm, args, 7, out);
}

lpx_status lpx_fp8_scaled_mm(lpx_tensor *a, lpx_tensor *a_scale_inv, lpx_tensor *b, lpx_tensor *b_scale_inv,
                             lpx_tensor *bias, lpx_dtype out_dtype, lpx_tensor **out)
{
    return lpx_fp8_scaled_mm_ex(a, a_scale_inv, b, b_scale_inv, bias, out_dtype, 0, out);
}

lpx_status lpx_fp8_scale_from_amax(lpx_tensor *amax, lpx_dtype fp8, bool pow2, double scale_max, lpx_tensor **scale,
                                   lpx_tensor **scale_inv)
{
    if (!scale) return lpx_error(LPX_EINVAL, "fp8_scale_from_amax: scale is NULL");
    lpx_value args[4] = {lpx_v_tensor(amax), lpx_v_dtype(fp8), lpx_v_bool(pow2), lpx_v_f64(scale_max)};
    return lpx__call_ret2(LPX_OP_fp8_scale_from_amax, args, 4, scale, scale_inv);
}

/* ---- quantize ------------------------------------------------------- */

/* t itself (retained) on the host, or its copy there: the statistics and
 * scales a device cast leaves on its device are read through the
 * backend's copy, once, not skipped (a delayed state fed NaN never moves) */
static lpx_status on_host(lpx_tensor *t, lpx_tensor **out)
{
    if (lpx_tensor_device(t).type == LPX_DEVICE_CPU) {
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    return lpx_tensor_to(t, lpx_cpu(), out);
}

/* the first n values of a small f32 tensor (NaN where unreadable) */
static void read_values(lpx_tensor *t, double *v, int n)
{
    for (int i = 0; i < n; i++) v[i] = NAN;
    lpx_tensor *h = NULL;
    if (on_host(t, &h)) {
        lpx_clear_error();
        return;
    }
    for (int i = 0; i < n && i < lpx_tensor_numel(h); i++) lpx_item(h, i, &v[i]);
    lpx_tensor_release(h);
}

/* Reads min and max of a (small) f32 scale tensor. */
static void scale_range(lpx_tensor *s, double *lo, double *hi)
{
    *lo = *hi = NAN;
    lpx_tensor *h = NULL;
    if (on_host(s, &h)) {
        lpx_clear_error();
        return;
    }
    for (int64_t i = 0; i < lpx_tensor_numel(h); i++) {
        double v;
        if (lpx_item(h, i, &v)) break;
        if (i == 0 || v < *lo) *lo = v;
        if (i == 0 || v > *hi) *hi = v;
    }
    lpx_tensor_release(h);
}

lpx_status f8_quantize(const char *op, lpx_tensor *x, const lpx_float8_quant_opts *opts, lpx_tensor **out,
                       lpx_float8_stats *stats)
{
    return f8_quantize2(op, x, opts, out, NULL, stats);
}

/* The float8 view [R, C] of x^T's quantization qt [C, R] (scales per row
 * of qt when axiswise): qt transposed, data column-major, scales [1, C]. */
static lpx_status transposed_view(lpx_tensor *qt, lpx_tensor *s, lpx_tensor *si, lpx_dtype logical,
                                  const lpx_float8_quant_opts *o, lpx_tensor **out)
{
    f8_meta m = f8_meta_make(o->role, o->granularity, 1);
    lpx_tensor *f = NULL;
    lpx_status st = f8_make(qt, s, si, logical, &m, &f);
    if (!st) st = lpx_t(f, out);
    lpx_tensor_release(f);
    return st;
}

/* BLOCK granularity (o resolved by f8_quantize2): 2-D x, dynamic scaling
 * only, blocks by role unless given. */
static lpx_status block_quantize(const char *op, lpx_tensor *x, const lpx_float8_quant_opts *o, lpx_tensor **out,
                                 lpx_tensor **out_t, lpx_float8_stats *stats)
{
    if (o->scale || o->delayed)
        return lpx_error(LPX_EINVAL, "%s: blockwise scaling is dynamic; a %s was given", op,
                         o->scale ? "static scale" : "delayed state");
    if (out_t)
        return lpx_error(LPX_EINTERNAL, "%s: no transposed copy for blockwise casts (cast x^T on its own)", op);
    if (lpx_tensor_ndim(x) != 2) {
        char sx[160];
        return lpx_error(LPX_ESHAPE, "%s: x has shape %s; blockwise scaling takes 2-D tensors (flatten the leading "
                                     "dims)", op, lpx_tensor_shape_str(x, sx, sizeof sx));
    }
    int64_t br = o->block_rows, bc = o->block_cols;
    if (br == 0 && bc == 0) {
        br = o->role == LPX_FLOAT8_ROLE_WEIGHT ? LPX_FLOAT8_BLOCK_SIZE : 1;
        bc = LPX_FLOAT8_BLOCK_SIZE;
    }
    /* the metadata keeps the sides in 32 bits; the op's own check (1..65536) names them */
    lpx_tensor *q = NULL, *s = NULL, *si = NULL, *tstats = NULL;
    lpx_status st = lpx_fp8_quantize_block(x, o->fp8, br, bc, o->pow2_scale, !o->nonsaturating, &q, &s, &si, &tstats);
    if (!st) {
        f8_meta m = f8_meta_block(o->role, br, bc);
        st = f8_make(q, s, si, lpx_tensor_dtype(x), &m, out);
    }
    if (!st && stats) {
        double v[4];
        read_values(tstats, v, 4);
        stats->amax = v[0];
        stats->underflow = v[1];
        stats->saturation = v[2];
        stats->nan = v[3];
        stats->numel = lpx_tensor_numel(x);
        scale_range(s, &stats->scale, &stats->scale_max);
    }
    lpx_tensor *tmp[4] = {q, s, si, tstats};
    f8_release_all(tmp, 4);
    return st;
}

lpx_status f8_quantize2(const char *op, lpx_tensor *x, const lpx_float8_quant_opts *opts, lpx_tensor **out,
                        lpx_tensor **out_t, lpx_float8_stats *stats)
{
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (out_t) *out_t = NULL;
    if (stats) memset(stats, 0, sizeof *stats);
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    if (opts) {
        size_t n = opts->struct_size == 0 || opts->struct_size > sizeof o ? sizeof o : opts->struct_size;
        memcpy(&o, opts, n);
    }
    if (f8_is(x))
        return lpx_error(LPX_EINVAL, "%s: x is already float8; use it as is, or dequantize it first (lpx_cast)", op);
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s: x is of kind '%s'; float8 quantizes dense tensors", op,
                         lpx_kind_name(lpx_tensor_kind(x)));
    lpx_dtype logical = lpx_tensor_dtype(x);
    if (!f8_logical_ok(logical))
        return lpx_error(LPX_EDTYPE, "%s: x has dtype %s; float8 quantizes f32, bf16 or f16 tensors", op,
                         lpx_dtype_name(logical));
    if (o.delayed && o.fp8 == 0) {
        lpx_float8_delayed_config dc;
        lpx_float8_delayed_get_config(o.delayed, &dc);
        o.fp8 = dc.fp8;
    }
    if (o.fp8 == 0) o.fp8 = LPX_F8E4M3FN;
    if (!f8_is_fp8(o.fp8))
        return lpx_error(LPX_EDTYPE, "%s: fp8 is %s; float8 data is f8e4m3fn or f8e5m2", op, lpx_dtype_name(o.fp8));
    if (o.role < 0 || o.role > LPX_FLOAT8_ROLE_GRAD_OUTPUT)
        return lpx_error(LPX_EINVAL, "%s: role %d is not a lpx_float8_role", op, o.role);
    int nd = lpx_tensor_ndim(x);
    int axis = -1;
    if (o.granularity == LPX_FLOAT8_BLOCK) /* (block sides a shorter struct_size lacks read 0: by role) */
        return block_quantize(op, x, &o, out, out_t, stats);
    if (o.granularity == LPX_FLOAT8_AXISWISE) {
        axis = o.axis < 0 ? o.axis + nd : o.axis;
        if (axis < 0 || axis >= nd)
            return lpx_error(LPX_ERANGE, "%s: axis %d out of range for a %d-d x", op, o.axis, nd);
    } else if (o.granularity != LPX_FLOAT8_TENSORWISE) {
        return lpx_error(LPX_EINVAL, "%s: granularity %d is not tensorwise (0), axiswise (1) or block (2)", op,
                         o.granularity);
    }
    if (o.scale && o.delayed)
        return lpx_error(LPX_EINVAL, "%s: both a static scale and a delayed state given; pick one scaling", op);
    if (o.delayed) {
        lpx_float8_delayed_config dc;
        lpx_float8_delayed_get_config(o.delayed, &dc);
        if (axis >= 0)
            return lpx_error(LPX_EINVAL, "%s: delayed scaling is tensorwise; axiswise granularity was requested", op);
        if (dc.fp8 != o.fp8)
            return lpx_error(LPX_EDTYPE, "%s: the delayed state holds a scale for %s, the cast is to %s", op,
                             lpx_dtype_name(dc.fp8), lpx_dtype_name(o.fp8));
    }
    /* f16 models: keep scale and scale_inv f16-representable */
    double smax = f8_scale_limit(logical);
    lpx_tensor *given = NULL;
    if (o.delayed) {
        double s = lpx_float8_delayed_scale(o.delayed);
        if (smax > 0 && s > smax) s = smax;
        if ((st = lpx_full(0, NULL, s, LPX_F32, lpx_tensor_device(x), &given))) return st;
    } else if (o.scale) {
        given = (lpx_tensor *)o.scale;
        lpx_tensor_retain(given);
    }
    if (out_t && (nd != 2 || (axis >= 0 && axis != 1))) {
        lpx_tensor_release(given);
        return lpx_error(LPX_EINTERNAL, "%s: the transposed copy is made for 2-D x scaled per row or tensorwise", op);
    }
    int64_t dim = axis;
    lpx_tensor *q = NULL, *s = NULL, *si = NULL, *tstats = NULL, *qt = NULL, *s_t = NULL, *si_t = NULL;
    if (out_t)
        st = lpx_fp8_quantize_t(x, given, o.fp8, axis >= 0, o.pow2_scale, smax, !o.nonsaturating, &q, &s, &si, &tstats,
                                &qt, &s_t, &si_t);
    else
        st = lpx_fp8_quantize(x, given, o.fp8, axis >= 0 ? &dim : NULL, o.pow2_scale, smax, !o.nonsaturating, &q, &s,
                              &si, &tstats);
    lpx_tensor_release(given);
    if (st) return st;
    f8_meta m = f8_meta_make(o.role, o.granularity, axis);
    st = f8_make(q, s, si, logical, &m, out);
    if (!st && out_t) st = transposed_view(qt, s_t, si_t, logical, &o, out_t);
    lpx_tensor_release(qt);
    lpx_tensor_release(s_t);
    lpx_tensor_release(si_t);
    double v[4] = {NAN, NAN, NAN, NAN};
    if (!st && (stats || o.delayed)) read_values(tstats, v, 4);
    if (!st && stats) {
        stats->amax = v[0];
        stats->underflow = v[1];
        stats->saturation = v[2];
        stats->nan = v[3];
        stats->numel = lpx_tensor_numel(x);
        scale_range(s, &stats->scale, &stats->scale_max);
    }
    if (!st && o.delayed) st = lpx_float8_delayed_update(o.delayed, isnan(v[0]) ? NAN : fabs(v[0]));
    lpx_tensor_release(q);
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    lpx_tensor_release(tstats);
    if (st) {
        lpx_tensor_release(*out);
        *out = NULL;
        if (out_t) {
            lpx_tensor_release(*out_t);
            *out_t = NULL;
        }
    }
    return st;
}

lpx_status lpx_float8_quantize(lpx_tensor *x, const lpx_float8_quant_opts *opts, lpx_tensor **out,
                               lpx_float8_stats *stats)
{
    return f8_quantize("lpx_float8_quantize", x, opts, out, stats);
}

/* ---- dequantize ------------------------------------------------------ */

lpx_status f8_dequantize(lpx_tensor *t, lpx_dtype dtype, lpx_tensor **out)
{
    if (!f8_is(t)) return lpx_cast(t, dtype == LPX_FLOAT8_LOGICAL ? lpx_tensor_dtype(t) : dtype, false, out);
    if (dtype == LPX_FLOAT8_LOGICAL) dtype = lpx_tensor_dtype(t);
    const lpx_dtype_traits *tr = lpx_dtype_get(dtype);
    if (!tr) return lpx_error(LPX_EDTYPE, "float8 dequantize: dtype %d is not registered", (int)dtype);
    const f8_meta *m = f8_meta_of(t);
    bool block = m->granularity == LPX_FLOAT8_BLOCK;
    bool direct = tr->is_float && tr->bits >= 8 && tr->block == 1;
    lpx_dtype to = direct ? dtype : LPX_F32;
    lpx_tensor *tmp = NULL;
    lpx_status st = block ? lpx_fp8_dequantize_block(f8_data(t), f8_scale_inv(t), f8_block_rows(m), f8_block_cols(m),
                                                     to, direct ? out : &tmp)
                          : lpx_fp8_dequantize(f8_data(t), f8_scale_inv(t), to, direct ? out : &tmp);
    if (direct) return st;
    if (!st) st = lpx_cast(tmp, dtype, false, out);
    lpx_tensor_release(tmp);
    return st;
}

lpx_status f8_hp(lpx_tensor *t, lpx_tensor **out)
{
    if (f8_is(t)) return f8_dequantize(t, LPX_FLOAT8_LOGICAL, out);
    lpx_tensor_retain(t);
    *out = t;
    return LPX_OK;
}

lpx_status lpx_float8_dequantize(lpx_tensor *t, lpx_dtype dtype, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_float8_dequantize: out is NULL");
    *out = NULL;
    if (!t) return lpx_error(LPX_EINVAL, "lpx_float8_dequantize: t is NULL");
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    return f8_dequantize(t, dtype, out);
}
