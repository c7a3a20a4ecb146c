/* The nf4 kind: registration, the vtable slots that describe a tensor
 * (unflatten, shard_unit, describe), and the layout helpers every other
 * nf4 file uses. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "nf4_internal.h"
#include "../../core/numerics/integer.h"

const lpx_kind *lpx__nf4_kind;

lpx_nf4_meta nf4_meta_init(int64_t block, int64_t sblock, int64_t padded, bool transposed, bool whole)
{
    lpx_nf4_meta m;
    memset(&m, 0, sizeof m);
    m.magic = LPX_NF4_META_MAGIC;
    m.version = LPX_NF4_META_VERSION;
    m.block = block;
    m.scaler_block = sblock;
    m.padded = padded;
    m.transposed = transposed ? 1 : 0;
    m.whole = whole ? 1 : 0;
    return m;
}

int64_t nf4_unit_rows(int64_t row_elems, int64_t block, int64_t sblock)
{
    int64_t unit = block * sblock;
    if (row_elems <= 0) return 1;
    return lpx_rows_for_whole_blocks(row_elems, unit);
}

lpx_status nf4_parts_of(const char *op, const char *arg, const lpx_tensor *t, nf4_parts *p)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    if (!lpx__nf4_kind || lpx_tensor_kind(t) != lpx__nf4_kind)
        return lpx_error(LPX_EINVAL, "%s: %s is %s%s, not an nf4 tensor", op, arg,
                         lpx_tensor_kind(t) ? "of kind " : "a dense tensor",
                         lpx_tensor_kind(t) ? lpx_kind_name(lpx_tensor_kind(t)) : "");
    size_t ms = 0;
    const void *meta = lpx_tensor_meta(t, &ms);
    if (ms != sizeof p->m || lpx_tensor_inner_count(t) != LPX_NF4_NINNER)
        return lpx_error(LPX_EINTERNAL, "%s: %s is an nf4 tensor with a malformed payload", op, arg);
    memcpy(&p->m, meta, sizeof p->m);
    for (int i = 0; i < LPX_NF4_NINNER; i++) p->in[i] = lpx_tensor_inner(t, i);
    p->ndim = lpx_tensor_ndim(t);
    memcpy(p->sshape, lpx_tensor_shape(t), (size_t)p->ndim * sizeof *p->sshape);
    if (p->m.transposed) {
        int64_t s0 = p->sshape[0];
        p->sshape[0] = p->sshape[1];
        p->sshape[1] = s0;
    }
    p->numel = lpx_tensor_numel(t);
    p->srows = p->ndim ? p->sshape[0] : 1;
    p->row_elems = 1;
    for (int d = 1; d < p->ndim; d++) p->row_elems *= p->sshape[d];
    return LPX_OK;
}

lpx_status nf4_make(lpx_dtype dtype, int ndim, const int64_t *shape, lpx_tensor *const *inner,
                    const lpx_nf4_meta *m, lpx_tensor **out)
{
    return lpx_tensor_new_kind(lpx__nf4_kind, dtype, ndim, shape, lpx_tensor_device(inner[0]), inner,
                               LPX_NF4_NINNER, m, sizeof *m, out);
}

/* ---- validation of untrusted payloads ---------------------------------- */

static lpx_status check_inner(const char *op, lpx_tensor *const *inner, int i, const char *name, lpx_dtype dtype,
                              int64_t len, lpx_device dev)
{
    const lpx_tensor *t = inner[i];
    if (!t) return lpx_error(LPX_EINVAL, "%s: nf4 inner tensor %d (%s) is NULL", op, i, name);
    if (lpx_tensor_kind(t))
        return lpx_error(LPX_EINVAL, "%s: nf4 inner tensor %d (%s) is of kind %s, expected dense", op, i, name,
                         lpx_kind_name(lpx_tensor_kind(t)));
    if (lpx_tensor_dtype(t) != dtype)
        return lpx_error(LPX_EDTYPE, "%s: nf4 inner tensor %d (%s) has dtype %s, expected %s", op, i, name,
                         lpx_dtype_name(lpx_tensor_dtype(t)), lpx_dtype_name(dtype));
    char s[128];
    if (lpx_tensor_ndim(t) != 1 || lpx_tensor_shape(t)[0] != len || !lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_ESHAPE, "%s: nf4 inner tensor %d (%s) is %s%s, expected contiguous [%lld]", op, i, name,
                         lpx_tensor_shape_str(t, s, sizeof s), lpx_tensor_is_contiguous(t) ? "" : " strided",
                         (long long)len);
    lpx_device d = lpx_tensor_device(t);
    if (d.type != dev.type || d.index != dev.index)
        return lpx_error(LPX_EDEVICE, "%s: nf4 inner tensor %d (%s) is on device %d:%d, the codes on %d:%d", op, i,
                         name, (int)d.type, (int)d.index, (int)dev.type, (int)dev.index);
    return LPX_OK;
}

lpx_status nf4_validate(const char *op, lpx_dtype dtype, int ndim, const int64_t *shape,
                        lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size)
{
    lpx_nf4_meta m;
    if (meta_size != sizeof m || !meta)
        return lpx_error(LPX_EINVAL, "%s: nf4 metadata is %zu bytes, expected %zu", op, meta_size, sizeof m);
    memcpy(&m, meta, sizeof m);
    if (m.magic != LPX_NF4_META_MAGIC || m.version != LPX_NF4_META_VERSION)
        return lpx_error(LPX_EINVAL, "%s: nf4 metadata has magic 0x%08x version %u, expected 0x%08x version %u", op,
                         (unsigned)m.magic, (unsigned)m.version, (unsigned)LPX_NF4_META_MAGIC, LPX_NF4_META_VERSION);
    if (m.block < LPX_NF4_BLOCK_MIN || m.block > LPX_NF4_BLOCK_MAX || m.block % 2)
        return lpx_error(LPX_EINVAL, "%s: nf4 metadata block = %lld must be even and in %d..%d", op,
                         (long long)m.block, LPX_NF4_BLOCK_MIN, LPX_NF4_BLOCK_MAX);
    if (m.scaler_block < 1 || m.scaler_block > LPX_NF4_SCALER_BLOCK_MAX)
        return lpx_error(LPX_EINVAL, "%s: nf4 metadata scaler_block = %lld must be in 1..%d", op,
                         (long long)m.scaler_block, LPX_NF4_SCALER_BLOCK_MAX);
    if (m.transposed > 1 || m.whole > 1 || (m.transposed && ndim != 2))
        return lpx_error(LPX_EINVAL, "%s: nf4 metadata flags transposed = %u, whole = %u invalid for %d dims", op,
                         (unsigned)m.transposed, (unsigned)m.whole, ndim);
    for (size_t i = 0; i < sizeof m.reserved; i++)
        if (m.reserved[i]) return lpx_error(LPX_EINVAL, "%s: nf4 metadata reserved byte %zu is not zero", op, i);
    if (!nf4_logical_dtype_ok(dtype))
        return lpx_error(LPX_EDTYPE, "%s: nf4 logical dtype %s must be f32, f16 or bf16", op, lpx_dtype_name(dtype));
    int64_t numel;
    lpx_status st = lpx_shape_numel(op, ndim, shape, &numel);
    if (st) return st;
    int64_t unit = m.block * m.scaler_block;
    if (m.padded < numel || m.padded % unit || m.padded - numel >= (numel ? unit : 1))
        return lpx_error(LPX_EINVAL, "%s: nf4 metadata padded = %lld does not fit %lld elements in scaler blocks of "
                         "%lld", op, (long long)m.padded, (long long)numel, (long long)unit);
    if (ninner != LPX_NF4_NINNER || !inner)
        return lpx_error(LPX_EINVAL, "%s: nf4 needs %d inner tensors (codes, qscalers, factors, mean), got %d", op,
                         LPX_NF4_NINNER, ninner);
    if (!inner[0]) return lpx_error(LPX_EINVAL, "%s: nf4 inner tensor 0 (codes) is NULL", op);
    lpx_device dev = lpx_tensor_device(inner[0]);
    if ((st = check_inner(op, inner, 0, "codes", LPX_U8, m.padded / 2, dev)) ||
        (st = check_inner(op, inner, 1, "qscalers", LPX_I8, m.padded / m.block, dev)) ||
        (st = check_inner(op, inner, 2, "factors", LPX_F32, m.padded / unit, dev)) ||
        (st = check_inner(op, inner, 3, "mean", LPX_F32, 1, dev)))
        return st;
    if (dev.type == LPX_DEVICE_CPU) {
        /* values the dequantization divides by or adds must be sane */
        const float *f = lpx_tensor_data(inner[2]), *mean = lpx_tensor_data(inner[3]);
        for (int64_t g = 0; g < m.padded / unit; g++)
            if (!(f[g] > 0.0f && isfinite(f[g])))
                return lpx_error(LPX_EINVAL, "%s: nf4 factor %lld is %g, expected finite and > 0", op, (long long)g,
                                 (double)f[g]);
        if (!isfinite(mean[0])) return lpx_error(LPX_EINVAL, "%s: nf4 mean is %g, expected finite", op, (double)mean[0]);
    }
    return LPX_OK;
}

/* ---- vtable slots -------------------------------------------------------- */

static lpx_status nf4_unflatten(const lpx_kind *kind, lpx_dtype dtype, int ndim, const int64_t *shape,
                                lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                                lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "nf4 unflatten: out is NULL");
    *out = NULL;
    lpx_status st = nf4_validate("nf4 unflatten", dtype, ndim, shape, inner, ninner, meta, meta_size);
    if (st) return st;
    return lpx_tensor_new_kind(kind, dtype, ndim, shape, lpx_tensor_device(inner[0]), inner, ninner, meta, meta_size,
                               out);
}

static int64_t nf4_shard_unit(const lpx_tensor *t)
{
    nf4_parts p;
    if (nf4_parts_of("nf4 shard_unit", "t", t, &p)) return 1;
    /* a transposed tensor stores its dim 0 as columns: only whole */
    if (p.m.transposed) return p.sshape[1] > 0 ? p.sshape[1] : 1;
    return nf4_unit_rows(p.row_elems, p.m.block, p.m.scaler_block);
}

static int nf4_describe(const lpx_tensor *t, char *buf, size_t len)
{
    lpx_nf4_info info;
    char shape[160];
    if (!buf || !len) return 0;
    if (lpx_nf4_get_info(t, &info)) return snprintf(buf, len, "nf4 (malformed)");
    int n = snprintf(buf, len, "nf4 %s %s, block %lld, scaler_block %lld, %.3f bits/param, padding %lld%s%s",
                     lpx_tensor_shape_str(t, shape, sizeof shape), lpx_dtype_name(lpx_tensor_dtype(t)),
                     (long long)info.block, (long long)info.scaler_block, info.bits_per_param,
                     (long long)(info.padded - info.numel), info.transposed ? ", transposed" : "",
                     info.whole ? "" : ", slice");
    return n < 0 ? 0 : (size_t)n >= len ? (int)len - 1 : n;
}

/* from_dense / to_dense: the conformance kit's and frameworks' generic way
 * to make and read instances. NF4 has no fp8 logical dtype: other float
 * inputs are quantized from their f32 values with an f32 logical dtype. */
static lpx_status nf4_from_dense(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out)
{
    (void)kind;
    if (!out) return lpx_error(LPX_EINVAL, "nf4 from_dense: out is NULL");
    *out = NULL;
    if (!x) return lpx_error(LPX_EINVAL, "nf4 from_dense: x is NULL");
    if (nf4_logical_dtype_ok(lpx_tensor_dtype(x)) || lpx_tensor_kind(x)) return lpx_nf4_quantize(x, NULL, out);
    lpx_tensor *f = NULL;
    lpx_status st = lpx_cast(x, LPX_F32, false, &f);
    if (!st) st = lpx_nf4_quantize(f, NULL, out);
    lpx_tensor_release(f);
    return st;
}

static lpx_status nf4_to_dense_slot(const lpx_tensor *t, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "nf4 to_dense: out is NULL");
    return nf4_to_dense("nf4 to_dense", (lpx_tensor *)t, LPX_F32, false, out);
}

/* What the conformance kit may expect: [256, 128] is two shard units
 * (128 rows of 128 = one scaler block of 256 x 64); every element is
 * within 0.14 (half the widest codebook gap) of its block absmax plus the
 * i8 scaler step, well under 0.2 of max|x|; N(0,1) SQNR is 20.7 dB. */
static const lpx_kind_conformance nf4_conformance = {
    .struct_size = sizeof(lpx_kind_conformance),
    .ndim = 2,
    .shape = {256, 128},
    .max_err = 0.2,
    .min_sqnr_db = 19.0,
};

lpx_status lpx_nf4_register_kind(void)
{
    lpx_kind_i vt = {
        .struct_size = sizeof vt,
        .abi_version = LPX_KIND_ABI_VERSION,
        .name = "nf4",
        .priority = LPX_PRIORITY_PAYLOAD,
        .unflatten = nf4_unflatten,
        .pre_all_gather = nf4_pre_all_gather,
        .post_all_gather = nf4_post_all_gather,
        .shard_unit = nf4_shard_unit,
        .describe = nf4_describe,
        .from_dense = nf4_from_dense,
        .to_dense = nf4_to_dense_slot,
        .conformance = &nf4_conformance,
    };
    const lpx_kind *k = NULL;
    lpx_status st = lpx_kind_register(&vt, &k);
    if (st) return st;
    lpx__nf4_kind = k;
    int key = lpx_kind_key(k);
    if ((st = nf4_register_handlers(key)) || (st = nf4_register_fallback(key))) return st;
    return LPX_OK;
}
