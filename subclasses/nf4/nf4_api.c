/* Public nf4 API (include/lpx/nf4.h): configs, sizes, quantize,
 * dequantize, info, and the NF4 linear and its input gradient. */
#include <string.h>
#include "nf4_internal.h"

lpx_nf4_config lpx_nf4_config_default(void)
{
    lpx_nf4_config c = {64, LPX_NF4_SCALER_BLOCK_AUTO, true};
    return c;
}

/* The config applied to a tensor of numel elements: an automatic
 * scaler_block becomes the largest one up to 256 that divides the block
 * count, so padding stops at the last whole block (a [32, 64] weight costs
 * 4.5 bits per parameter, not the 33 that padding to 256 blocks of 64
 * would). numel < 0 (no tensor yet): 256. */
static lpx_nf4_config resolve(const lpx_nf4_config *c, int64_t numel)
{
    lpx_nf4_config r = *c;
    if (r.scaler_block != LPX_NF4_SCALER_BLOCK_AUTO) return r;
    r.scaler_block = LPX_NF4_SCALER_BLOCK_AUTO_MAX;
    if (numel < 0 || r.block < LPX_NF4_BLOCK_MIN || r.block > LPX_NF4_BLOCK_MAX) return r;
    int64_t blocks = (numel + r.block - 1) / r.block;
    if (blocks < 1) blocks = 1;
    for (int64_t sb = LPX_NF4_SCALER_BLOCK_AUTO_MAX; sb >= 1; sb--)
        if (blocks % sb == 0) {
            r.scaler_block = sb;
            break;
        }
    return r;
}

/* Elements the codes cover for numel elements under a checked config. */
static int64_t padded_numel(int64_t numel, const lpx_nf4_config *c)
{
    int64_t unit = c->block * c->scaler_block;
    return (numel + unit - 1) / unit * unit;
}

lpx_status lpx_nf4_config_resolve(const lpx_nf4_config *config, int64_t numel, lpx_nf4_config *out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_nf4_config_resolve: out is NULL");
    lpx_nf4_config d = lpx_nf4_config_default();
    *out = resolve(config ? config : &d, numel);
    return LPX_OK;
}

static lpx_status config_check(const char *op, const lpx_nf4_config *given, int64_t numel)
{
    lpx_nf4_config rc = resolve(given, numel);
    const lpx_nf4_config *c = &rc;
    if (c->block < LPX_NF4_BLOCK_MIN || c->block > LPX_NF4_BLOCK_MAX || c->block % 2)
        return lpx_error(LPX_EINVAL, "%s: nf4 config.block = %lld must be even and in %d..%d", op,
                         (long long)c->block, LPX_NF4_BLOCK_MIN, LPX_NF4_BLOCK_MAX);
    if (c->scaler_block < 1 || c->scaler_block > LPX_NF4_SCALER_BLOCK_MAX)
        return lpx_error(LPX_EINVAL, "%s: nf4 config.scaler_block = %lld must be in 1..%d", op,
                         (long long)c->scaler_block, LPX_NF4_SCALER_BLOCK_MAX);
    if (numel < 0 || c->pad) return LPX_OK;
    if (numel % c->block)
        return lpx_error(LPX_EINVAL, "%s: nf4 config.pad = false but numel %lld is not a multiple of block %lld "
                         "(set pad = true to pad the tail)", op, (long long)numel, (long long)c->block);
    if ((numel / c->block) % c->scaler_block)
        return lpx_error(LPX_EINVAL, "%s: nf4 config.pad = false but scaler_block %lld does not divide the %lld "
                         "blocks of %lld elements (set pad = true to pad the tail)", op,
                         (long long)c->scaler_block, (long long)(numel / c->block), (long long)numel);
    return LPX_OK;
}

lpx_status lpx_nf4_config_check(const lpx_nf4_config *config, int64_t numel)
{
    lpx_nf4_config d = lpx_nf4_config_default();
    return config_check("lpx_nf4_config_check", config ? config : &d, numel);
}

lpx_status lpx_nf4_bytes(int ndim, const int64_t *shape, const lpx_nf4_config *config, int64_t *bytes)
{
    const char *op = "lpx_nf4_bytes";
    if (!bytes) return lpx_error(LPX_EINVAL, "%s: bytes is NULL", op);
    *bytes = 0;
    lpx_nf4_config d = lpx_nf4_config_default(), rc;
    const lpx_nf4_config *c = config ? config : &d;
    int64_t numel;
    lpx_status st = lpx_shape_numel(op, ndim, shape, &numel);
    rc = resolve(c, st ? -1 : numel);
    c = &rc;
    if (st || (st = config_check(op, c, numel))) return st;
    int64_t unit = c->block * c->scaler_block;
    if (numel > INT64_MAX - unit) return lpx_error(LPX_ERANGE, "%s: %lld elements overflow", op, (long long)numel);
    int64_t p = padded_numel(numel, c);
    /* codes (4 bits) + one i8 per block + one f32 per scaler block + the mean */
    *bytes = p / 2 + p / c->block + 4 * (p / unit) + 4;
    return LPX_OK;
}

const lpx_kind *lpx_nf4_kind(void)
{
    if (lpx_ensure_init()) return NULL;
    return lpx__nf4_kind;
}

bool lpx_nf4_is(const lpx_tensor *t)
{
    return t && lpx__nf4_kind && lpx_tensor_kind(t) == lpx__nf4_kind;
}

lpx_status lpx_nf4_quantize(lpx_tensor *x, const lpx_nf4_config *config, lpx_tensor **out)
{
    const char *op = "lpx_nf4_quantize";
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s: x is of kind %s; NF4 quantizes dense tensors (dequantize it first)", op,
                         lpx_kind_name(lpx_tensor_kind(x)));
    lpx_dtype dt = lpx_tensor_dtype(x);
    if (!nf4_logical_dtype_ok(dt))
        return lpx_error(LPX_EDTYPE, "%s: x has dtype %s; NF4 weights are f32, f16 or bf16", op, lpx_dtype_name(dt));
    lpx_nf4_config d = lpx_nf4_config_default();
    if ((st = config_check(op, config ? config : &d, lpx_tensor_numel(x)))) return st;
    lpx_nf4_config rc = resolve(config ? config : &d, lpx_tensor_numel(x));
    const lpx_nf4_config *c = &rc;
    lpx_tensor *inner[LPX_NF4_NINNER];
    if ((st = nf4_quantize_payload(x, c->block, c->scaler_block, inner))) return st;
    lpx_nf4_meta m = nf4_meta_init(c->block, c->scaler_block, lpx_tensor_numel(inner[0]) * 2, false, true);
    st = nf4_make(dt, lpx_tensor_ndim(x), lpx_tensor_shape(x), inner, &m, out);
    for (int i = 0; i < LPX_NF4_NINNER; i++) lpx_tensor_release(inner[i]);
    return st;
}

lpx_status lpx_nf4_dequantize(lpx_tensor *w, lpx_dtype dtype, lpx_tensor **out)
{
    const char *op = "lpx_nf4_dequantize";
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    nf4_parts p;
    if ((st = nf4_parts_of(op, "w", w, &p))) return st;
    if (dtype < 0) dtype = lpx_tensor_dtype(w);
    if (!nf4_logical_dtype_ok(dtype))
        return lpx_error(LPX_EDTYPE, "%s: dtype %s: NF4 dequantizes to f32, f16 or bf16", op, lpx_dtype_name(dtype));
    return nf4_to_dense(op, w, dtype, false, out);
}

lpx_status lpx_nf4_dequantize_rows(lpx_tensor *w, int64_t row_start, int64_t row_count, lpx_dtype dtype,
                                   lpx_tensor *out, lpx_tensor **result)
{
    const char *op = "lpx_nf4_dequantize_rows";
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!result) return lpx_error(LPX_EINVAL, "%s: result is NULL", op);
    *result = NULL;
    nf4_parts p;
    if ((st = nf4_parts_of(op, "w", w, &p))) return st;
    if (p.m.transposed || p.ndim == 0)
        return lpx_error(LPX_EINVAL, "%s: w is %s; row ranges need an untransposed tensor with a dim 0", op,
                         p.ndim ? "transposed" : "0-D");
    if (dtype < 0) dtype = lpx_tensor_dtype(w);
    if (!nf4_logical_dtype_ok(dtype))
        return lpx_error(LPX_EDTYPE, "%s: dtype %s: NF4 dequantizes to f32, f16 or bf16", op, lpx_dtype_name(dtype));
    if (row_start < 0 || row_count < 0 || row_start > p.srows || row_count > p.srows - row_start)
        return lpx_error(LPX_ERANGE, "%s: rows [%lld, %lld + %lld) outside the %lld rows of w", op,
                         (long long)row_start, (long long)row_start, (long long)row_count, (long long)p.srows);
    if (out) return nf4_dequantize_range(&p, row_start * p.row_elems, row_count * p.row_elems, dtype, out, result);
    lpx_tensor *flat = NULL;
    if ((st = nf4_dequantize_range(&p, row_start * p.row_elems, row_count * p.row_elems, dtype, NULL, &flat)))
        return st;
    int64_t shape[LPX_MAX_DIMS];
    memcpy(shape, p.sshape, (size_t)p.ndim * sizeof *shape);
    shape[0] = row_count;
    st = lpx_view(flat, p.ndim, shape, result);
    lpx_tensor_release(flat);
    return st;
}

lpx_status lpx_nf4_get_info(const lpx_tensor *t, lpx_nf4_info *info)
{
    const char *op = "lpx_nf4_get_info";
    if (!info) return lpx_error(LPX_EINVAL, "%s: info is NULL", op);
    nf4_parts p;
    lpx_status st = nf4_parts_of(op, "t", t, &p);
    if (st) return st;
    memset(info, 0, sizeof *info);
    info->block = p.m.block;
    info->scaler_block = p.m.scaler_block;
    info->numel = p.numel;
    info->padded = p.m.padded;
    for (int i = 0; i < LPX_NF4_NINNER; i++)
        info->bytes += (int64_t)lpx_dtype_nbytes(lpx_tensor_dtype(p.in[i]), lpx_tensor_numel(p.in[i]));
    info->bits_per_param = p.numel ? 8.0 * (double)info->bytes / (double)p.numel : 0.0;
    info->shard_unit_rows = p.m.transposed ? (p.sshape[1] > 0 ? p.sshape[1] : 1)
                                           : nf4_unit_rows(p.row_elems, p.m.block, p.m.scaler_block);
    info->transposed = p.m.transposed != 0;
    info->whole = p.m.whole != 0;
    return LPX_OK;
}

lpx_status lpx_nf4_linear(lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor **out)
{
    const char *op = "lpx_nf4_linear";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    if (!lpx_nf4_is(w))
        return lpx_error(LPX_EINVAL, "%s: w is %s, not an nf4 tensor (use lpx_linear for dense weights)", op,
                         w ? "dense or another kind" : "NULL");
    return lpx_linear(x, w, bias, out);
}

lpx_status lpx_nf4_linear_backward(lpx_tensor *grad, lpx_tensor *w, lpx_tensor **grad_x)
{
    const char *op = "lpx_nf4_linear_backward";
    if (!grad_x) return lpx_error(LPX_EINVAL, "%s: grad_x is NULL", op);
    *grad_x = NULL;
    if (!grad) return lpx_error(LPX_EINVAL, "%s: grad is NULL", op);
    if (!lpx_nf4_is(w)) return lpx_error(LPX_EINVAL, "%s: w is not an nf4 tensor", op);
    return lpx_matmul(grad, w, grad_x); /* the nf4 matmul handler: grad @ W, tiled */
}
