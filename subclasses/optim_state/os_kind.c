/* The optimizer-state kinds os_8bit, os_4bit, os_fp8 (include/lpx/
 * optim_state.h): registration, validation of payloads, the vtable slots
 * (unflatten, shard_unit, describe, from_dense, to_dense) and the public
 * constructors. The numerics are core/numerics/optim_state.h's. */
#include <stdio.h>
#include <string.h>
#include "os_internal.h"
#include "../../core/numerics/integer.h"

const lpx_kind *lpx__os_kinds[LPX_OPTIM_STATE_FORMATS];

const char *const lpx__os_kind_names[LPX_OPTIM_STATE_FORMATS] = {"os_8bit", "os_4bit", "os_fp8"};
#define kind_names lpx__os_kind_names
static const char *const role_names[2] = {"m", "v"};

/* torchao's defaults, except 4-bit: 256 instead of torchao's 128 meets the
 * issue's 1.05 bytes per parameter (1.03125 against 1.0625); torchao's
 * AdamW4bit(block_size=256) is the same layout (docs/NUMERICS.md). */
int64_t lpx_optim_state_default_block(lpx_optim_state_format format)
{
    if ((unsigned)format >= LPX_OPTIM_STATE_FORMATS) return 0;
    return format == LPX_OPTIM_STATE_4BIT ? 256 : lpx_os_state_block((int)format);
}

const lpx_kind *lpx_optim_state_kind(lpx_optim_state_format format)
{
    return (unsigned)format < LPX_OPTIM_STATE_FORMATS ? lpx__os_kinds[format] : NULL;
}

int os_format_of_kind(const lpx_kind *k)
{
    for (int f = 0; f < LPX_OPTIM_STATE_FORMATS; f++)
        if (k && k == lpx__os_kinds[f]) return f;
    return -1;
}

bool lpx_is_optim_state(const lpx_tensor *t) { return t && os_format_of_kind(lpx_tensor_kind(t)) >= 0; }

static bool block_ok(int64_t b) { return b >= 2 && b <= LPX_OPTIM_STATE_BLOCK_MAX && !(b & (b - 1)); }

static lpx_status check_block(const char *op, int format, int64_t block)
{
    if (!block_ok(block))
        return lpx_error(LPX_EINVAL, "%s: kind %s: block %lld is not a power of two in 2..%d", op,
                         kind_names[format], (long long)block, LPX_OPTIM_STATE_BLOCK_MAX);
    return LPX_OK;
}

/* ---- validation of untrusted payloads ---------------------------------- */

static lpx_status check_inner(const char *op, const char *kname, lpx_tensor *const *inner, int i, const char *name,
                              lpx_dtype dtype, int64_t len, lpx_device dev)
{
    const lpx_tensor *t = inner[i];
    if (!t) return lpx_error(LPX_EINVAL, "%s: kind %s: inner tensor %d (%s) is NULL", op, kname, i, name);
    if (lpx_tensor_kind(t))
        return lpx_error(LPX_EINVAL, "%s: kind %s: inner tensor %d (%s) is of kind %s, expected dense", op, kname, i,
                         name, lpx_kind_name(lpx_tensor_kind(t)));
    if (lpx_tensor_dtype(t) != dtype)
        return lpx_error(LPX_EDTYPE, "%s: kind %s: inner tensor %d (%s) has dtype %s, expected %s", op, kname, i, name,
                         lpx_dtype_name(lpx_tensor_dtype(t)), lpx_dtype_name(dtype));
    char s[128];
    if (lpx_tensor_ndim(t) != 1 || lpx_tensor_shape(t)[0] != len || !lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_ESHAPE, "%s: kind %s: inner tensor %d (%s) is %s%s, expected contiguous [%lld]", op,
                         kname, i, name, lpx_tensor_shape_str(t, s, sizeof s),
                         lpx_tensor_is_contiguous(t) ? "" : " strided", (long long)len);
    lpx_device d = lpx_tensor_device(t);
    if (d.type != dev.type || d.index != dev.index)
        return lpx_error(LPX_EDEVICE, "%s: kind %s: inner tensor %d (%s) is on device %d:%d, the codes on %d:%d", op,
                         kname, i, name, (int)d.type, (int)d.index, (int)dev.type, (int)dev.index);
    return LPX_OK;
}

static lpx_status validate(const char *op, int format, lpx_dtype dtype, int ndim, const int64_t *shape,
                           lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size)
{
    const char *kn = kind_names[format];
    lpx_optim_state_meta m;
    if (!meta || meta_size != sizeof m)
        return lpx_error(LPX_EINVAL, "%s: kind %s: metadata is %zu bytes, expected %zu", op, kn, meta ? meta_size : 0,
                         sizeof m);
    memcpy(&m, meta, sizeof m);
    if (m.magic != LPX_OPTIM_STATE_META_MAGIC || m.version != LPX_OPTIM_STATE_META_VERSION)
        return lpx_error(LPX_EINVAL, "%s: kind %s: metadata has magic 0x%08x version %u, expected 0x%08x version %u",
                         op, kn, (unsigned)m.magic, (unsigned)m.version, LPX_OPTIM_STATE_META_MAGIC,
                         LPX_OPTIM_STATE_META_VERSION);
    if (m.format != format)
        return lpx_error(LPX_EINVAL, "%s: kind %s: metadata format %d is not the kind's (%d)", op, kn, (int)m.format,
                         format);
    if (m.role != LPX_OPTIM_STATE_M && m.role != LPX_OPTIM_STATE_V)
        return lpx_error(LPX_EINVAL, "%s: kind %s: metadata role %d is neither m (0) nor v (1)", op, kn, (int)m.role);
    lpx_status st = check_block(op, format, m.block);
    if (st) return st;
    if (dtype != LPX_F32)
        return lpx_error(LPX_EDTYPE, "%s: kind %s: logical dtype %s, an optimizer state is f32", op, kn,
                         lpx_dtype_name(dtype));
    int64_t numel;
    if ((st = lpx_shape_numel(op, ndim, shape, &numel))) return st;
    if (ninner != OS_NINNER || !inner)
        return lpx_error(LPX_EINVAL, "%s: kind %s: needs %d inner tensors (codes, scales), got %d", op, kn, OS_NINNER,
                         inner ? ninner : 0);
    if (!inner[0]) return lpx_error(LPX_EINVAL, "%s: kind %s: inner tensor 0 (codes) is NULL", op, kn);
    lpx_device dev = lpx_tensor_device(inner[0]);
    if ((st = check_inner(op, kn, inner, OS_CODES, "codes", os_codes_dtype(format, m.role),
                          os_codes_len(format, numel, m.block), dev)) ||
        (st = check_inner(op, kn, inner, OS_SCALES, "scales", LPX_F32, os_nblocks(numel, m.block), dev)))
        return st;
    return LPX_OK;
}

lpx_status os_parts_of(const char *op, const char *arg, const lpx_tensor *t, os_parts *p)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    int f = os_format_of_kind(lpx_tensor_kind(t));
    if (f < 0)
        return lpx_error(LPX_EINVAL, "%s: %s is %s%s, not an optimizer state (os_8bit, os_4bit, os_fp8)", op, arg,
                         lpx_tensor_kind(t) ? "of kind " : "a dense tensor",
                         lpx_tensor_kind(t) ? lpx_kind_name(lpx_tensor_kind(t)) : "");
    size_t ms = 0;
    const void *meta = lpx_tensor_meta(t, &ms);
    if (ms != sizeof p->m || lpx_tensor_inner_count(t) != OS_NINNER)
        return lpx_error(LPX_EINTERNAL, "%s: %s is an %s tensor with a malformed payload", op, arg, kind_names[f]);
    memcpy(&p->m, meta, sizeof p->m);
    p->codes = lpx_tensor_inner(t, OS_CODES);
    p->scales = lpx_tensor_inner(t, OS_SCALES);
    p->numel = lpx_tensor_numel(t);
    p->nblocks = os_nblocks(p->numel, p->m.block);
    return LPX_OK;
}

static lpx_optim_state_meta meta_init(int format, int role, int64_t block)
{
    lpx_optim_state_meta m;
    memset(&m, 0, sizeof m);
    m.magic = LPX_OPTIM_STATE_META_MAGIC;
    m.version = LPX_OPTIM_STATE_META_VERSION;
    m.format = format;
    m.role = role;
    m.block = block;
    return m;
}

/* ---- constructors ------------------------------------------------------- */

static lpx_status check_new(const char *op, int format, int role, int64_t *block)
{
    if ((unsigned)format >= LPX_OPTIM_STATE_FORMATS)
        return lpx_error(LPX_EINVAL, "%s: format %d is not a state format (0 8-bit, 1 4-bit, 2 fp8)", op, format);
    if (role != LPX_OPTIM_STATE_M && role != LPX_OPTIM_STATE_V)
        return lpx_error(LPX_EINVAL, "%s: kind %s: role %d is neither m (0) nor v (1)", op, kind_names[format], role);
    if (!lpx__os_kinds[format])
        return lpx_error(LPX_EINVAL, "%s: kind %s is not registered (call lpx_init first)", op, kind_names[format]);
    if (*block == 0) *block = lpx_optim_state_default_block((lpx_optim_state_format)format);
    return check_block(op, format, *block);
}

lpx_status os_make(int format, int role, int64_t block, int ndim, const int64_t *shape, lpx_tensor *codes,
                       lpx_tensor *scales, lpx_tensor **out)
{
    lpx_optim_state_meta m = meta_init(format, role, block);
    lpx_tensor *inner[OS_NINNER] = {codes, scales};
    return lpx_tensor_new_kind(lpx__os_kinds[format], LPX_F32, ndim, shape, lpx_tensor_device(codes), inner,
                               OS_NINNER, &m, sizeof m, out);
}

lpx_status lpx_optim_state_new(lpx_optim_state_format format, lpx_optim_state_role role, int ndim,
                               const int64_t *shape, int64_t block, lpx_device dev, lpx_tensor **out)
{
    static const char op[] = "lpx_optim_state_new";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    lpx_status st = check_new(op, (int)format, (int)role, &block);
    if (st) return st;
    int64_t numel;
    if (ndim < 0 || ndim > LPX_MAX_DIMS || (ndim && !shape))
        return lpx_error(LPX_ESHAPE, "%s: kind %s: ndim %d (shape %s) out of range 0..%d", op, kind_names[format],
                         ndim, shape ? "given" : "NULL", LPX_MAX_DIMS);
    if ((st = lpx_shape_numel(op, ndim, shape, &numel))) return st;
    int64_t cl = os_codes_len((int)format, numel, block), nb = os_nblocks(numel, block);
    lpx_tensor *codes = NULL, *scales = NULL;
    if (!(st = lpx_zeros(1, &cl, os_codes_dtype((int)format, (int)role), dev, &codes)) &&
        !(st = lpx_zeros(1, &nb, LPX_F32, dev, &scales)))
        st = os_make((int)format, (int)role, block, ndim, shape, codes, scales, out);
    lpx_tensor_release(codes);
    lpx_tensor_release(scales);
    return st;
}

/* quantizes the f32 values x[0..numel) into codes / scales (CPU memory) */
static void quantize_into(int format, int role, int64_t block, const float *x, int64_t numel, void *codes,
                          float *scales)
{
    float q[256];
    if (format != LPX_OPTIM_STATE_FP8) {
        int map = format == LPX_OPTIM_STATE_8BIT ? (role == LPX_OPTIM_STATE_M ? LPX_OS_MAP8_SIGNED : LPX_OS_MAP8_UNSIGNED)
                                                 : (role == LPX_OPTIM_STATE_M ? LPX_OS_MAP4_SIGNED : LPX_OS_MAP4_UNSIGNED);
        lpx_os_map_fill(map, q);
    }
    for (int64_t b = 0, at = 0; at < numel; b++, at += block) {
        int n = (int)(numel - at < block ? numel - at : block);
        if (format == LPX_OPTIM_STATE_8BIT) scales[b] = lpx_os_quant8(q, x + at, n, (uint8_t *)codes + at);
        else if (format == LPX_OPTIM_STATE_4BIT) scales[b] = lpx_os_quant4(q, x + at, n, (uint8_t *)codes + at / 2);
        else if (role == LPX_OPTIM_STATE_M) scales[b] = lpx_os_quant_e4m3(x + at, n, (uint8_t *)codes + at);
        else scales[b] = lpx_os_quant_f16s(x + at, n, (uint16_t *)codes + at);
    }
}

lpx_status lpx_optim_state_quantize(lpx_tensor *x, lpx_optim_state_format format, lpx_optim_state_role role,
                                    int64_t block, lpx_tensor **out)
{
    static const char op[] = "lpx_optim_state_quantize";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    lpx_status st = check_new(op, (int)format, (int)role, &block);
    if (st) return st;
    if (!x) return lpx_error(LPX_EINVAL, "%s: kind %s: x is NULL", op, kind_names[format]);
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s: kind %s: x is of kind %s, expected a dense tensor", op, kind_names[format],
                         lpx_kind_name(lpx_tensor_kind(x)));
    if (lpx_tensor_device(x).type != LPX_DEVICE_CPU)
        return lpx_error(LPX_EDEVICE, "%s: kind %s: x is on device type %d, not the CPU", op, kind_names[format],
                         (int)lpx_tensor_device(x).type);
    if (!lpx_dtype_get(lpx_tensor_dtype(x))->is_float)
        return lpx_error(LPX_EDTYPE, "%s: kind %s: x has dtype %s, expected a floating-point dtype", op,
                         kind_names[format], lpx_dtype_name(lpx_tensor_dtype(x)));
    lpx_tensor *xf = NULL, *xc = NULL, *codes = NULL, *scales = NULL;
    int64_t numel = lpx_tensor_numel(x);
    int64_t cl = os_codes_len((int)format, numel, block), nb = os_nblocks(numel, block);
    if ((st = lpx_cast(x, LPX_F32, false, &xf)) || (st = lpx_contiguous(xf, &xc)) ||
        (st = lpx_zeros(1, &cl, os_codes_dtype((int)format, (int)role), lpx_cpu(), &codes)) ||
        (st = lpx_zeros(1, &nb, LPX_F32, lpx_cpu(), &scales)))
        goto done;
    quantize_into((int)format, (int)role, block, lpx_tensor_data(xc), numel, lpx_tensor_data(codes),
                  lpx_tensor_data(scales));
    st = os_make((int)format, (int)role, block, lpx_tensor_ndim(x), lpx_tensor_shape(x), codes, scales, out);
done:
    lpx_tensor_release(xf);
    lpx_tensor_release(xc);
    lpx_tensor_release(codes);
    lpx_tensor_release(scales);
    return st;
}

lpx_status lpx_optim_state_get_info(const lpx_tensor *t, lpx_optim_state_info *info)
{
    os_parts p;
    if (!info) return lpx_error(LPX_EINVAL, "lpx_optim_state_get_info: info is NULL");
    lpx_status st = os_parts_of("lpx_optim_state_get_info", "t", t, &p);
    if (st) return st;
    info->format = (lpx_optim_state_format)p.m.format;
    info->role = (lpx_optim_state_role)p.m.role;
    info->block = p.m.block;
    info->numel = p.numel;
    info->bytes = lpx_dtype_nbytes(lpx_tensor_dtype(p.codes), lpx_tensor_numel(p.codes)) + 4 * p.nblocks;
    return LPX_OK;
}

/* ---- vtable slots ------------------------------------------------------- */

static lpx_status os_unflatten(const lpx_kind *kind, lpx_dtype dtype, int ndim, const int64_t *shape,
                               lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                               lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "optimizer state unflatten: out is NULL");
    *out = NULL;
    int f = os_format_of_kind(kind);
    if (f < 0) return lpx_error(LPX_EINVAL, "optimizer state unflatten: not an optimizer-state kind");
    char op[48];
    snprintf(op, sizeof op, "%s unflatten", kind_names[f]);
    lpx_status st = validate(op, f, dtype, ndim, shape, inner, ninner, meta, meta_size);
    if (st) return st;
    return lpx_tensor_new_kind(kind, dtype, ndim, shape, lpx_tensor_device(inner[0]), inner, ninner, meta, meta_size,
                               out);
}

/* a dim-0 shard holds whole blocks: rows * row_elems a multiple of block */
static int64_t os_shard_unit(const lpx_tensor *t)
{
    os_parts p;
    if (os_parts_of("optimizer state shard_unit", "t", t, &p)) return 1;
    int64_t row = 1;
    for (int d = 1; d < lpx_tensor_ndim(t); d++) row *= lpx_tensor_shape(t)[d];
    return row > 0 ? lpx_rows_for_whole_blocks(row, p.m.block) : 1;
}

static int os_describe(const lpx_tensor *t, char *buf, size_t len)
{
    lpx_optim_state_info info;
    char shape[160];
    if (!buf || !len) return 0;
    if (lpx_optim_state_get_info(t, &info)) return snprintf(buf, len, "optimizer state (malformed)");
    int n = snprintf(buf, len, "%s %s (%s), block %lld, %.4f bytes/param", kind_names[info.format],
                     lpx_tensor_shape_str(t, shape, sizeof shape), role_names[info.role], (long long)info.block,
                     info.numel ? (double)info.bytes / (double)info.numel : 0.0);
    return n < 0 ? 0 : (size_t)n >= len ? (int)len - 1 : n;
}

static lpx_status os_from_dense(const lpx_kind *kind, lpx_tensor *x, lpx_tensor **out)
{
    int f = os_format_of_kind(kind);
    if (out) *out = NULL;
    if (f < 0 || !out) return lpx_error(LPX_EINVAL, "optimizer state from_dense: %s", out ? "not a state kind" : "out is NULL");
    /* a signed map takes any data: the m role */
    return lpx_optim_state_quantize(x, (lpx_optim_state_format)f, LPX_OPTIM_STATE_M, 0, out);
}

/* a CPU copy of an inner tensor (retained when already there) */
static lpx_status on_cpu(lpx_tensor *t, lpx_tensor **out)
{
    *out = NULL;
    if (lpx_tensor_device(t).type == LPX_DEVICE_CPU) {
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    int64_t n = lpx_tensor_numel(t);
    lpx_status st = lpx_tensor_new(lpx_tensor_dtype(t), 1, &n, lpx_cpu(), out);
    if (!st) st = lpx_copy_(*out, t);
    if (st) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

static lpx_status os_to_dense(const lpx_tensor *t, lpx_tensor **out)
{
    static const char op[] = "optimizer state to_dense";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    os_parts p;
    lpx_status st = os_parts_of(op, "t", t, &p);
    if (st) return st;
    lpx_tensor *codes = NULL, *scales = NULL, *x = NULL;
    if ((st = on_cpu(p.codes, &codes)) || (st = on_cpu(p.scales, &scales)) ||
        (st = lpx_tensor_new(LPX_F32, lpx_tensor_ndim(t), lpx_tensor_shape(t), lpx_cpu(), &x)))
        goto done;
    int f = p.m.format, role = p.m.role;
    float q[256];
    if (f != LPX_OPTIM_STATE_FP8) {
        int map = f == LPX_OPTIM_STATE_8BIT ? (role == LPX_OPTIM_STATE_M ? LPX_OS_MAP8_SIGNED : LPX_OS_MAP8_UNSIGNED)
                                            : (role == LPX_OPTIM_STATE_M ? LPX_OS_MAP4_SIGNED : LPX_OS_MAP4_UNSIGNED);
        lpx_os_map_fill(map, q);
    }
    const uint8_t *c8 = lpx_tensor_data(codes);
    const uint16_t *c16 = lpx_tensor_data(codes);
    const float *s = lpx_tensor_data(scales);
    float *y = lpx_tensor_data(x);
    int64_t block = p.m.block;
    for (int64_t b = 0, at = 0; at < p.numel; b++, at += block) {
        int n = (int)(p.numel - at < block ? p.numel - at : block);
        if (f == LPX_OPTIM_STATE_8BIT) lpx_os_dequant8(q, c8 + at, s[b], n, y + at);
        else if (f == LPX_OPTIM_STATE_4BIT) lpx_os_dequant4(q, c8 + at / 2, s[b], n, y + at);
        else if (role == LPX_OPTIM_STATE_M) lpx_os_dequant_e4m3(c8 + at, s[b], n, y + at);
        else lpx_os_dequant_f16s(c16 + at, s[b], n, y + at);
    }
    *out = x;
    x = NULL;
done:
    lpx_tensor_release(codes);
    lpx_tensor_release(scales);
    lpx_tensor_release(x);
    return st;
}

/* What the conformance kit may expect: [64, 96] holds whole blocks of
 * every default size; the bounds are the round-trip bounds of the m maps
 * (docs/NUMERICS.md): 0.00703 (8-bit), 0.1125 (4-bit), 2^-4 (e4m3). */
static const lpx_conformance_na os_na[] = {
    {"logical_dtype", "an optimizer state's logical dtype is f32 (its moments are updated in f32)"},
    {NULL, NULL},
};
static const lpx_kind_conformance os_conf[LPX_OPTIM_STATE_FORMATS] = {
    {.struct_size = sizeof(lpx_kind_conformance), .ndim = 2, .shape = {64, 96}, .max_err = 0.0071,
     .not_applicable = os_na},
    {.struct_size = sizeof(lpx_kind_conformance), .ndim = 2, .shape = {64, 96}, .max_err = 0.1126,
     .not_applicable = os_na},
    {.struct_size = sizeof(lpx_kind_conformance), .ndim = 2, .shape = {64, 96}, .max_err = 0.0626,
     .not_applicable = os_na},
};

lpx_status lpx_optim_state_register_kinds(void)
{
    for (int f = 0; f < LPX_OPTIM_STATE_FORMATS; f++) {
        lpx_kind_i vt = {
            .struct_size = sizeof vt,
            .abi_version = LPX_KIND_ABI_VERSION,
            .name = kind_names[f],
            .priority = LPX_PRIORITY_PAYLOAD,
            .unflatten = os_unflatten,
            .shard_unit = os_shard_unit,
            .describe = os_describe,
            .from_dense = os_from_dense,
            .to_dense = os_to_dense,
            .conformance = &os_conf[f],
        };
        const lpx_kind *k = NULL;
        lpx_status st = lpx_kind_register(&vt, &k);
        if (st) return st;
        lpx__os_kinds[f] = k;
        if ((st = os_register_handlers(lpx_kind_key(k)))) return st;
    }
    return LPX_OK;
}
