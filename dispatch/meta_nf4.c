/* Meta functions of the NF4 payload ops (ops_nf4.def; include/lpx/meta.h):
 * the payload's sizes and consistency, and a dequantized range. These are
 * the contract of dense ops on four plain tensors, not of the nf4 kind, so
 * they live with the other meta functions; the CPU and CUDA kernels call
 * them after their own device checks. */
#include "../core/lpx_internal.h"
#include "lpx/meta.h"
#include "lpx/nf4.h"

lpx_status lpx_meta_nf4_blocks(const char *op, int64_t block, int64_t scaler_block)
{
    if (block < LPX_NF4_BLOCK_MIN || block > LPX_NF4_BLOCK_MAX || block % 2)
        return lpx_error(LPX_EINVAL, "%s: block = %lld must be even and in %d..%d", op, (long long)block,
                         LPX_NF4_BLOCK_MIN, LPX_NF4_BLOCK_MAX);
    if (scaler_block < 1 || scaler_block > LPX_NF4_SCALER_BLOCK_MAX)
        return lpx_error(LPX_EINVAL, "%s: scaler_block = %lld must be in 1..%d", op, (long long)scaler_block,
                         LPX_NF4_SCALER_BLOCK_MAX);
    return LPX_OK;
}

static lpx_status vec(const char *op, const char *arg, const lpx_tensor *t, lpx_dtype dtype)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    if (t->dtype != dtype)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s, expected %s", op, arg, lpx_dtype_name(t->dtype),
                         lpx_dtype_name(dtype));
    if (t->ndim != 1 || !lpx_tensor_is_contiguous(t)) {
        char s[128];
        return lpx_error(LPX_ESHAPE, "%s: %s %s must be a contiguous 1-D tensor", op, arg,
                         lpx_tensor_shape_str(t, s, sizeof s));
    }
    return LPX_OK;
}

lpx_status lpx_meta_nf4_payload(const char *op, const lpx_tensor *codes, const lpx_tensor *qscalers,
                                const lpx_tensor *factors, const lpx_tensor *mean, int64_t block,
                                int64_t scaler_block, int64_t *padded)
{
    lpx_status st;
    if ((st = lpx_meta_nf4_blocks(op, block, scaler_block))) return st;
    if ((st = vec(op, "codes", codes, LPX_U8)) || (st = vec(op, "qscalers", qscalers, LPX_I8)) ||
        (st = vec(op, "factors", factors, LPX_F32)) || (st = vec(op, "mean", mean, LPX_F32)))
        return st;
    int64_t n = codes->shape[0] * 2, unit = block * scaler_block;
    if (mean->shape[0] != 1)
        return lpx_error(LPX_ESHAPE, "%s: mean has %lld elements, expected 1", op, (long long)mean->shape[0]);
    if (n % unit)
        return lpx_error(LPX_ESHAPE, "%s: codes cover %lld elements, not a whole number of scaler blocks of "
                         "%lld x %lld", op, (long long)n, (long long)block, (long long)scaler_block);
    if (qscalers->shape[0] != n / block || factors->shape[0] != n / unit)
        return lpx_error(LPX_ESHAPE, "%s: %lld codes need %lld qscalers and %lld factors, got %lld and %lld", op,
                         (long long)n, (long long)(n / block), (long long)(n / unit),
                         (long long)qscalers->shape[0], (long long)factors->shape[0]);
    if (padded) *padded = n;
    return LPX_OK;
}

lpx_status lpx_meta_nf4_range(const char *op, int64_t padded, int64_t start, int64_t count, lpx_dtype dtype,
                              const lpx_tensor *out)
{
    if (dtype != LPX_F32 && dtype != LPX_F16 && dtype != LPX_BF16)
        return lpx_error(LPX_EDTYPE, "%s: dtype %s: NF4 dequantizes to f32, f16 or bf16", op, lpx_dtype_name(dtype));
    if (start < 0 || count < 0 || start > padded || count > padded - start)
        return lpx_error(LPX_ERANGE, "%s: elements [%lld, %lld + %lld) outside the %lld the payload holds", op,
                         (long long)start, (long long)start, (long long)count, (long long)padded);
    if (out && (out->kind || out->dtype != dtype || out->numel != count || !lpx_tensor_is_contiguous(out)))
        return lpx_error(LPX_ESHAPE, "%s: out must be a contiguous %s tensor of %lld elements (is %s, %lld, %s)", op,
                         lpx_dtype_name(dtype), (long long)count, lpx_dtype_name(out->dtype), (long long)out->numel,
                         lpx_tensor_is_contiguous(out) ? "contiguous" : "strided");
    return LPX_OK;
}

lpx_status lpx_meta_nf4_quantize(const char *op, const lpx_tensor *x, int64_t block, int64_t scaler_block,
                                 lpx_nf4_sizes *sz)
{
    lpx_status st = lpx_meta_nf4_blocks(op, block, scaler_block);
    if (st) return st;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    if (!lpx_dtype_get(x->dtype)->is_float)
        return lpx_error(LPX_EDTYPE, "%s: x has dtype %s; NF4 quantizes floating-point tensors", op,
                         lpx_dtype_name(x->dtype));
    int64_t unit = block * scaler_block;
    if (x->numel > INT64_MAX - unit)
        return lpx_error(LPX_ERANGE, "%s: %lld elements cannot be padded to scaler blocks", op, (long long)x->numel);
    sz->padded = (x->numel + unit - 1) / unit * unit;
    sz->blocks = sz->padded / block;
    sz->scaler_blocks = sz->padded / unit;
    return LPX_OK;
}

lpx_status lpx_meta_nf4_mm(const char *op, const lpx_tensor *x, int64_t padded, int64_t rows, int64_t cols,
                           bool transposed, const lpx_tensor *bias, lpx_gemm_geom *g)
{
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    const lpx_dtype_traits *tr = lpx_dtype_get(x->dtype);
    if (!tr || !tr->is_float)
        return lpx_error(LPX_EDTYPE, "%s: x has dtype %s, expected a floating-point dtype", op, lpx_dtype_name(x->dtype));
    if (rows < 0 || cols < 0 || (cols && rows > padded / cols))
        return lpx_error(LPX_ESHAPE, "%s: W [%lld, %lld] needs more elements than the %lld the payload holds", op,
                         (long long)rows, (long long)cols, (long long)padded);
    int64_t K = transposed ? cols : rows, N = transposed ? rows : cols;
    char sx[128];
    if (x->ndim < 1 || x->shape[x->ndim - 1] != K)
        return lpx_error(LPX_ESHAPE, "%s: x %s must end in %lld (W is [%lld, %lld]%s)", op,
                         lpx_tensor_shape_str(x, sx, sizeof sx), (long long)K, (long long)rows, (long long)cols,
                         transposed ? ", used transposed" : "");
    if (bias && (bias->ndim != 1 || bias->shape[0] != N)) {
        char sb[128];
        return lpx_error(LPX_ESHAPE, "%s: bias %s must be [%lld]", op, lpx_tensor_shape_str(bias, sb, sizeof sb),
                         (long long)N);
    }
    g->batch = g->a_batch = g->b_batch = 1;
    g->K = K;
    g->N = N;
    g->M = 1;
    for (int d = 0; d < x->ndim - 1; d++) g->M *= x->shape[d];
    g->out_ndim = x->ndim;
    for (int d = 0; d < x->ndim - 1; d++) g->out_shape[d] = x->shape[d];
    g->out_shape[x->ndim - 1] = N;
    return LPX_OK;
}

lpx_status lpx_meta_qlora_dropout(const char *op, const lpx_tensor *x, double p, lpx_dtype dtype)
{
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is NULL", op);
    if (!(p >= 0.0 && p < 1.0)) return lpx_error(LPX_EINVAL, "%s: p = %g must be in [0, 1)", op, p);
    const lpx_dtype_traits *tr = lpx_dtype_get(dtype);
    if (!tr || !tr->is_float || tr->bits < 8)
        return lpx_error(LPX_EDTYPE, "%s: dtype %s is not a floating-point dtype the kernels store", op,
                         lpx_dtype_name(dtype));
    return LPX_OK;
}
