/* The float8 kind: registration, the vtable (unflatten, describe,
 * shard_unit, all-gather hooks), construction and inspection of float8
 * tensors, and the fallback switch. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "float8_internal.h"

const lpx_kind *f8__kind;
static atomic_bool f8_fallback_on;

static const char *role_name(int r)
{
    static const char *const names[] = {"none", "input", "weight", "grad_output"};
    return r >= 0 && r <= 3 ? names[r] : "?";
}

/* ---- construction and validation --------------------------------- */

lpx_status f8_make(lpx_tensor *data, lpx_tensor *scale, lpx_tensor *scale_inv, lpx_dtype logical, const f8_meta *m,
                   lpx_tensor **out)
{
    lpx_tensor *inner[F8_NINNER] = {data, scale, scale_inv};
    return lpx_tensor_new_kind(f8__kind, logical, lpx_tensor_ndim(data), lpx_tensor_shape(data),
                               lpx_tensor_device(data), inner, F8_NINNER, m, sizeof *m, out);
}

lpx_status f8_rewrap(const lpx_tensor *t, lpx_tensor *data, lpx_tensor *scale, lpx_tensor *scale_inv, int axis,
                     lpx_tensor **out)
{
    f8_meta m = *f8_meta_of(t);
    if (m.granularity == LPX_FLOAT8_AXISWISE) m.axis = axis;
    return f8_make(data, scale, scale_inv, lpx_tensor_dtype(t), &m, out);
}

static bool same_device(lpx_device a, lpx_device b) { return a.type == b.type && a.index == b.index; }

/* Checks one scale tensor (scale or scale_inv) against the data. */
static lpx_status check_scale_tensor(const char *what, const char *name, const lpx_tensor *s, const lpx_tensor *data,
                                     const f8_meta *m)
{
    char sh[160], dsh[160];
    if (lpx_tensor_kind(s))
        return lpx_error(LPX_EINVAL, "%s: %s is of kind '%s'; it must be a dense f32 tensor", what, name,
                         lpx_kind_name(lpx_tensor_kind(s)));
    if (lpx_tensor_dtype(s) != LPX_F32)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; float8 scales are f32", what, name,
                         lpx_dtype_name(lpx_tensor_dtype(s)));
    if (!same_device(lpx_tensor_device(s), lpx_tensor_device(data)))
        return lpx_error(LPX_EDEVICE, "%s: %s is on another device than the data", what, name);
    int nd = lpx_tensor_ndim(data);
    const int64_t *ds = lpx_tensor_shape(data), *ss = lpx_tensor_shape(s);
    bool ok;
    if (m->granularity == LPX_FLOAT8_BLOCK) {
        int64_t br = f8_block_rows(m), bc = f8_block_cols(m);
        int64_t gr = nd == 2 ? ds[0] / br + (ds[0] % br != 0) : 0, gc = nd == 2 ? ds[1] / bc + (ds[1] % bc != 0) : 0;
        if (nd == 2 && lpx_tensor_ndim(s) == 2 && ss[0] == gr && ss[1] == gc) return LPX_OK;
        return lpx_error(LPX_ESHAPE, "%s: %s has shape %s; blocks of %lld x %lld over data %s need [%lld, %lld]", what,
                         name, lpx_tensor_shape_str(s, sh, sizeof sh), (long long)br, (long long)bc,
                         lpx_tensor_shape_str(data, dsh, sizeof dsh), (long long)gr, (long long)gc);
    }
    if (m->granularity == LPX_FLOAT8_TENSORWISE) {
        ok = lpx_tensor_ndim(s) == 0;
    } else {
        ok = lpx_tensor_ndim(s) == nd;
        for (int i = 0; ok && i < nd; i++) ok = ss[i] == (i == m->axis ? 1 : ds[i]);
    }
    if (!ok)
        return lpx_error(LPX_ESHAPE, "%s: %s has shape %s; for data %s with %s scaling it must be %s", what, name,
                         lpx_tensor_shape_str(s, sh, sizeof sh), lpx_tensor_shape_str(data, dsh, sizeof dsh),
                         m->granularity == LPX_FLOAT8_TENSORWISE ? "tensorwise" : "axiswise",
                         m->granularity == LPX_FLOAT8_TENSORWISE ? "[] (0-d)" : "data's shape with the axis set to 1");
    return LPX_OK;
}

lpx_status f8_validate(const char *what, lpx_dtype logical, int ndim, const int64_t *shape, lpx_tensor *const *inner,
                       int ninner, const void *meta, size_t meta_size)
{
    if (ninner != F8_NINNER || !inner)
        return lpx_error(LPX_EINVAL, "%s: float8 takes %d inner tensors (data, scale, scale_inv), got %d", what,
                         F8_NINNER, ninner);
    for (int i = 0; i < F8_NINNER; i++)
        if (!inner[i]) return lpx_error(LPX_EINVAL, "%s: inner[%d] is NULL", what, i);
    if (!meta || meta_size != sizeof(f8_meta))
        return lpx_error(LPX_EINVAL, "%s: float8 metadata must be %zu bytes, got %zu", what, sizeof(f8_meta),
                         meta ? meta_size : 0);
    f8_meta m;
    memcpy(&m, meta, sizeof m);
    bool block = m.granularity == LPX_FLOAT8_BLOCK;
    if (m.magic != F8_META_MAGIC || m.version != F8_META_VERSION || (!block && m.reserved != 0))
        return lpx_error(LPX_EINVAL, "%s: float8 metadata has magic 0x%08x version %u reserved %u (expected 0x%08x, %u, 0)",
                         what, m.magic, (unsigned)m.version, m.reserved, F8_META_MAGIC, F8_META_VERSION);
    if (m.role > LPX_FLOAT8_ROLE_GRAD_OUTPUT)
        return lpx_error(LPX_EINVAL, "%s: float8 metadata role %u is not a lpx_float8_role", what, (unsigned)m.role);
    if (m.granularity > LPX_FLOAT8_BLOCK)
        return lpx_error(LPX_EINVAL, "%s: float8 metadata granularity %u is not tensorwise (0), axiswise (1) or block "
                         "(2)", what, (unsigned)m.granularity);
    if (block && (ndim != 2 || m.axis < 1 || m.axis > 65536 || m.reserved < 1 || m.reserved > 65536))
        return lpx_error(LPX_EINVAL, "%s: float8 metadata blocks %d x %u for a %d-d tensor (blockwise tensors are 2-D, "
                         "block sides 1..65536)", what, (int)m.axis, m.reserved, ndim);
    if (!block && (m.granularity == LPX_FLOAT8_TENSORWISE ? m.axis != -1 : (m.axis < 0 || m.axis >= ndim)))
        return lpx_error(LPX_EINVAL, "%s: float8 metadata axis %d is invalid for %s scaling of a %d-d tensor", what,
                         (int)m.axis, m.granularity ? "axiswise" : "tensorwise", ndim);
    if (!f8_logical_ok(logical))
        return lpx_error(LPX_EDTYPE, "%s: logical dtype %s; a float8 tensor dequantizes to f32, bf16 or f16", what,
                         lpx_dtype_name(logical));
    const lpx_tensor *data = inner[F8_INNER_DATA];
    if (lpx_tensor_kind(data))
        return lpx_error(LPX_EINVAL, "%s: data is of kind '%s'; it must be a dense fp8 tensor", what,
                         lpx_kind_name(lpx_tensor_kind(data)));
    if (!f8_is_fp8(lpx_tensor_dtype(data)))
        return lpx_error(LPX_EDTYPE, "%s: data has dtype %s; float8 data is f8e4m3fn or f8e5m2", what,
                         lpx_dtype_name(lpx_tensor_dtype(data)));
    bool same = lpx_tensor_ndim(data) == ndim;
    for (int i = 0; same && i < ndim; i++) same = lpx_tensor_shape(data)[i] == shape[i];
    if (!same) {
        char s1[160];
        return lpx_error(LPX_ESHAPE, "%s: data has shape %s, not the tensor's %d-d shape", what,
                         lpx_tensor_shape_str(data, s1, sizeof s1), ndim);
    }
    lpx_status st;
    if ((st = check_scale_tensor(what, "scale", inner[F8_INNER_SCALE], data, &m)) ||
        (st = check_scale_tensor(what, "scale_inv", inner[F8_INNER_SCALE_INV], data, &m)))
        return st;
    if (lpx_tensor_device(data).type != LPX_DEVICE_CPU) return LPX_OK; /* values unreadable here */
    const lpx_tensor *s = inner[F8_INNER_SCALE], *si = inner[F8_INNER_SCALE_INV];
    for (int64_t i = 0; i < lpx_tensor_numel(s); i++) {
        double a, b;
        if ((st = lpx_item(s, i, &a)) || (st = lpx_item(si, i, &b))) return st;
        if (!(a > 0) || !isfinite(a) || !(b > 0) || !isfinite(b))
            return lpx_error(LPX_EINVAL, "%s: scale[%lld] = %g, scale_inv = %g; both must be finite and > 0", what,
                             (long long)i, a, b);
        if (fabs(a * b - 1.0) > 1e-6)
            return lpx_error(LPX_EINVAL, "%s: scale[%lld] = %g and scale_inv = %g are not reciprocals", what,
                             (long long)i, a, b);
    }
    return LPX_OK;
}

static lpx_status f8_unflatten(const lpx_kind *kind, lpx_dtype logical, int ndim, const int64_t *shape,
                               lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                               lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "float8 unflatten: out is NULL");
    *out = NULL;
    if (ndim < 0 || ndim > LPX_MAX_DIMS || (ndim && !shape))
        return lpx_error(LPX_EINVAL, "float8 unflatten: bad ndim %d or NULL shape", ndim);
    lpx_status st = f8_validate("float8 unflatten", logical, ndim, shape, inner, ninner, meta, meta_size);
    if (st) return st;
    return lpx_tensor_new_kind(kind, logical, ndim, shape, lpx_tensor_device(inner[0]), inner, ninner, meta,
                               meta_size, out);
}

static int f8_describe(const lpx_tensor *t, char *buf, size_t len)
{
    const f8_meta *m = f8_meta_of(t);
    char sh[160];
    double s = 0;
    lpx_tensor *sc = f8_scale(t);
    bool one = lpx_tensor_numel(sc) == 1 && lpx_tensor_device(sc).type == LPX_DEVICE_CPU && !lpx_item(sc, 0, &s);
    char gran[64];
    if (m->granularity == LPX_FLOAT8_TENSORWISE) {
        if (one) snprintf(gran, sizeof gran, "tensorwise scale=%g", s);
        else snprintf(gran, sizeof gran, "tensorwise");
    } else if (m->granularity == LPX_FLOAT8_BLOCK) {
        snprintf(gran, sizeof gran, "block(%lldx%lld)", (long long)f8_block_rows(m), (long long)f8_block_cols(m));
    } else {
        snprintf(gran, sizeof gran, "axiswise(axis=%d)", (int)m->axis);
    }
    int n = snprintf(buf, len, "float8 %s %s %s role=%s logical=%s", lpx_dtype_name(lpx_tensor_dtype(f8_data(t))),
                     lpx_tensor_shape_str(t, sh, sizeof sh), gran, role_name(m->role),
                     lpx_dtype_name(lpx_tensor_dtype(t)));
    return n < 0 ? 0 : n;
}

/* fp8 data has no row blocks: any dim-0 boundary works; a blockwise
 * tensor's scales cover block_rows rows each. */
static int64_t f8_shard_unit(const lpx_tensor *t)
{
    return f8_is_block(t) ? f8_block_rows(f8_meta_of(t)) : 1;
}

/* from_dense / to_dense slots: the default recipe (dynamic tensorwise
 * e4m3fn) and dequantization to f32. */
static lpx_status f8_from_dense(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out)
{
    (void)kind;
    return f8_quantize("float8 from_dense", x, NULL, out, NULL);
}

static lpx_status f8_to_dense(const lpx_tensor *t, lpx_tensor **out)
{
    return f8_dequantize((lpx_tensor *)t, LPX_F32, out);
}

/* The other granularities, for `lpx conformance` (lpx_kind_conformance.
 * variants): one scale per row, and one per 1 x 128 block (an activation's
 * DeepSeek-V3 cast). */
static lpx_status f8_from_dense_rows(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out)
{
    (void)kind;
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .granularity = LPX_FLOAT8_AXISWISE, .axis = -1};
    return f8_quantize("float8[axiswise] from_dense", x, &o, out, NULL);
}

static lpx_status f8_from_dense_block(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out)
{
    (void)kind;
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .granularity = LPX_FLOAT8_BLOCK,
                               .role = LPX_FLOAT8_ROLE_INPUT, .pow2_scale = true};
    return f8_quantize("float8[block] from_dense", x, &o, out, NULL);
}

/* The kit builds both GEMM operands with the same cast, scaled along each
 * operand's rows; a GEMM wants B's scales constant along K (per column,
 * or kb-row blocks). Float8Linear casts each operand for its role. */
#define F8_NA_GEMM(why)                                                                        \
    {"op/matmul", "the kit casts b like a, along its rows; " why " (Float8Linear casts per role)"}, \
    {"op/addmm", "the kit casts b like a, along its rows; " why " (Float8Linear casts per role)"}

static const lpx_conformance_na f8_rows_na[] = {
    {"op/view", "a view that moves the scaled dim changes what a row is: refused by design"},
    {"op/reshape", "a reshape that moves the scaled dim changes what a row is: refused by design"},
    F8_NA_GEMM("a GEMM wants b scaled per column"),
    {NULL, NULL},
};

static const lpx_conformance_na f8_block_na[] = {
    {"op/view", "a view that regroups elements would cut blocks: refused by design (dequantize first)"},
    {"op/reshape", "a reshape that regroups elements would cut blocks: refused by design (dequantize first)"},
    {"op/slice", "a strided slice would cut blocks: refused by design (narrow cuts whole blocks)"},
    F8_NA_GEMM("a block-scaled GEMM wants b in kb-row blocks"),
    {NULL, NULL},
};

/* block: power-of-two scales put a block's amax anywhere in (fp8_max / 2,
 * fp8_max], so the top binade's half ulp is up to 1/16 of it */
static const lpx_conformance_variant f8_variants[] = {
    {"axiswise", f8_from_dense_rows, f8_rows_na, 0.0},
    {"block", f8_from_dense_block, f8_block_na, 0.0625},
    {NULL, NULL, NULL, 0.0},
};

/* ---- public: inspection ------------------------------------------- */

const lpx_kind *lpx_float8_kind(void) { return lpx_ensure_init() ? NULL : f8__kind; }
bool lpx_float8_is(const lpx_tensor *t) { return f8_is(t); }
lpx_tensor *lpx_float8_data(const lpx_tensor *t) { return f8_is(t) ? f8_data(t) : NULL; }
lpx_tensor *lpx_float8_scale(const lpx_tensor *t) { return f8_is(t) ? f8_scale(t) : NULL; }
lpx_tensor *lpx_float8_scale_inv(const lpx_tensor *t) { return f8_is(t) ? f8_scale_inv(t) : NULL; }

lpx_status lpx_float8_get_info(const lpx_tensor *t, lpx_float8_info *info)
{
    if (!info) return lpx_error(LPX_EINVAL, "lpx_float8_get_info: info is NULL");
    if (!f8_is(t))
        return lpx_error(LPX_EINVAL, "lpx_float8_get_info: tensor is %s, not float8",
                         t ? (lpx_tensor_kind(t) ? lpx_kind_name(lpx_tensor_kind(t)) : "dense") : "NULL");
    const f8_meta *m = f8_meta_of(t);
    info->fp8 = lpx_tensor_dtype(f8_data(t));
    info->logical = lpx_tensor_dtype(t);
    info->role = m->role;
    info->granularity = m->granularity;
    info->axis = m->granularity == LPX_FLOAT8_BLOCK ? -1 : m->axis;
    return LPX_OK;
}

lpx_status lpx_float8_block_shape(const lpx_tensor *t, int64_t *block_rows, int64_t *block_cols)
{
    if (!f8_is(t))
        return lpx_error(LPX_EINVAL, "lpx_float8_block_shape: tensor is %s, not float8",
                         t ? (lpx_tensor_kind(t) ? lpx_kind_name(lpx_tensor_kind(t)) : "dense") : "NULL");
    const f8_meta *m = f8_meta_of(t);
    if (m->granularity != LPX_FLOAT8_BLOCK)
        return lpx_error(LPX_EINVAL, "lpx_float8_block_shape: the float8 tensor is %s, not blockwise",
                         m->granularity == LPX_FLOAT8_TENSORWISE ? "tensorwise" : "axiswise");
    if (block_rows) *block_rows = f8_block_rows(m);
    if (block_cols) *block_cols = f8_block_cols(m);
    return LPX_OK;
}

lpx_status lpx_float8_from_data(lpx_tensor *data, lpx_tensor *scale, lpx_dtype logical_dtype, int role,
                                int granularity, int axis, lpx_tensor **out)
{
    const char *what = "lpx_float8_from_data";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", what);
    *out = NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!data || !scale) return lpx_error(LPX_EINVAL, "%s: %s is NULL", what, data ? "scale" : "data");
    if (role < 0 || role > LPX_FLOAT8_ROLE_GRAD_OUTPUT)
        return lpx_error(LPX_EINVAL, "%s: role %d is not a lpx_float8_role", what, role);
    if (granularity != LPX_FLOAT8_TENSORWISE && granularity != LPX_FLOAT8_AXISWISE)
        return lpx_error(LPX_EINVAL, "%s: granularity %d is not tensorwise (0) or axiswise (1)", what, granularity);
    int nd = lpx_tensor_ndim(data);
    if (granularity == LPX_FLOAT8_AXISWISE) {
        int a = axis < 0 ? axis + nd : axis;
        if (a < 0 || a >= nd)
            return lpx_error(LPX_ERANGE, "%s: axis %d out of range for %d-d data", what, axis, nd);
        axis = a;
    }
    f8_meta m = f8_meta_make(role, granularity, axis);
    lpx_tensor *s = NULL, *si = NULL;
    /* tensorwise: accept any numel-1 scale, stored as 0-d */
    if (granularity == LPX_FLOAT8_TENSORWISE && lpx_tensor_numel(scale) == 1 && !lpx_tensor_kind(scale) &&
        lpx_tensor_ndim(scale) != 0) {
        if ((st = lpx_reshape(scale, 0, NULL, &s))) return st;
    } else {
        lpx_tensor_retain(scale);
        s = scale;
    }
    if (!lpx_tensor_kind(s) && lpx_tensor_dtype(s) == LPX_F32) {
        lpx_tensor *one = NULL;
        if (!(st = lpx_full(0, NULL, 1.0, LPX_F32, lpx_tensor_device(s), &one))) st = lpx_div(one, s, &si);
        lpx_tensor_release(one);
        if (!st && lpx_tensor_ndim(si) != lpx_tensor_ndim(s)) st = lpx_error(LPX_EINTERNAL, "%s: scale_inv shape", what);
    } else {
        /* let validation name the problem */
        lpx_tensor_retain(s);
        si = s;
    }
    if (!st) {
        lpx_tensor *inner[F8_NINNER] = {data, s, si};
        st = f8_validate(what, logical_dtype, nd, lpx_tensor_shape(data), inner, F8_NINNER, &m, sizeof m);
    }
    if (!st) st = f8_make(data, s, si, logical_dtype, &m, out);
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    return st;
}

/* ---- fallback switch --------------------------------------------- */

lpx_status lpx_float8_set_fallback(bool enable)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    int key = lpx_kind_key(f8__kind);
    if (enable) {
        st = lpx_fallback_register(key, f8_fallback, NULL);
        if (st == LPX_EEXIST) st = LPX_OK; /* already on */
    } else {
        st = lpx_fallback_unregister(key);
        if (st == LPX_ENOTFOUND) st = LPX_OK;
    }
    if (!st) {
        atomic_store(&f8_fallback_on, enable);
        lpx_clear_error();
    }
    return st;
}

bool lpx_float8_fallback_enabled(void) { return atomic_load(&f8_fallback_on); }

/* ---- registration ------------------------------------------------ */

lpx_status lpx_float8_register_kind(void)
{
    lpx_kind_i vt;
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.abi_version = LPX_KIND_ABI_VERSION;
    vt.name = "float8";
    vt.priority = LPX_PRIORITY_PAYLOAD;
    vt.unflatten = f8_unflatten;
    vt.pre_all_gather = f8_pre_all_gather;
    vt.post_all_gather = f8_post_all_gather;
    vt.shard_unit = f8_shard_unit;
    vt.describe = f8_describe;
    vt.from_dense = f8_from_dense;
    vt.to_dense = f8_to_dense;
    /* what `lpx conformance` may expect: e4m3 tensorwise rounds to within
     * half a step of the top binade, 16/448 = 0.036 of the amax */
    static const lpx_kind_conformance conf = {
        .struct_size = sizeof conf, .max_err = 0.04, .min_sqnr_db = 25.0, .variants = f8_variants,
    };
    vt.conformance = &conf;
    const lpx_kind *k = NULL;
    lpx_status st = lpx_kind_register(&vt, &k);
    if (st) return st;
    f8__kind = k;
    int key = lpx_kind_key(k);
    if ((st = f8_register_view_handlers(key))) return st;
    return f8_register_gemm_handlers(key);
}
