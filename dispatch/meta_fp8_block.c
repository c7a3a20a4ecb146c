/* Meta functions of the blockwise fp8 ops (ops.def, "blockwise fp8";
 * include/lpx/meta.h): the block grid of a 2-D tensor, and each op's
 * arguments, written once for every backend. */
#include <math.h>
#include "../core/lpx_internal.h"
#include "lpx/meta.h"

/* Block sides are at most this (a 2^16 block is already one scale for a
 * whole layer; larger sides only invite overflowing products). */
#define BLOCK_MAX 65536

static lpx_status two_d(const char *op, const char *arg, const lpx_tensor *t)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    if (t->ndim != 2) {
        char s[160];
        return lpx_error(LPX_ESHAPE, "%s: %s has shape %s; blockwise fp8 takes 2-D tensors [rows, cols]", op, arg,
                         lpx_tensor_shape_str(t, s, sizeof s));
    }
    return LPX_OK;
}

static lpx_status float_dtype(const char *op, const char *arg, lpx_dtype d)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(d);
    if (!tr || !tr->is_float || tr->bits < 8 || tr->block > 1)
        return lpx_error(LPX_EDTYPE, "%s: %s is %s; it must be a byte-sized floating-point dtype", op, arg,
                         lpx_dtype_name(d));
    return LPX_OK;
}

lpx_status lpx_meta_fp8_block_grid(const char *op, int64_t rows, int64_t cols, int64_t block_rows,
                                   int64_t block_cols, lpx_fp8_block_geom *g)
{
    if (block_rows < 1 || block_rows > BLOCK_MAX || block_cols < 1 || block_cols > BLOCK_MAX)
        return lpx_error(LPX_EINVAL, "%s: blocks of %lld x %lld; each side must be in 1..%d", op, (long long)block_rows,
                         (long long)block_cols, BLOCK_MAX);
    if (rows < 0 || cols < 0)
        return lpx_error(LPX_ESHAPE, "%s: negative shape [%lld, %lld]", op, (long long)rows, (long long)cols);
    g->rows = rows, g->cols = cols, g->block_rows = block_rows, g->block_cols = block_cols;
    /* no overflow: rows, cols < 2^63 and the sides >= 1 */
    g->grid_rows = rows / block_rows + (rows % block_rows != 0);
    g->grid_cols = cols / block_cols + (cols % block_cols != 0);
    return LPX_OK;
}

lpx_status lpx_meta_fp8_quantize_block(const char *op, const lpx_tensor *x, lpx_dtype fp8, int64_t block_rows,
                                       int64_t block_cols, lpx_fp8_block_geom *g)
{
    lpx_status st;
    if ((st = two_d(op, "x", x)) || (st = float_dtype(op, "x", x->dtype)) ||
        (st = lpx_meta_fp8_dtype(op, "fp8", fp8)))
        return st;
    return lpx_meta_fp8_block_grid(op, x->shape[0], x->shape[1], block_rows, block_cols, g);
}

/* scale_inv: floating-point, exactly the grid's shape. */
static lpx_status grid_scale(const char *op, const char *arg, const lpx_tensor *s, const lpx_fp8_block_geom *g)
{
    if (!s) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    lpx_status st = float_dtype(op, arg, s->dtype);
    if (st) return st;
    if (s->ndim != 2 || s->shape[0] != g->grid_rows || s->shape[1] != g->grid_cols) {
        char sh[160];
        return lpx_error(LPX_ESHAPE, "%s: %s has shape %s; blocks of %lld x %lld over [%lld, %lld] need [%lld, %lld]",
                         op, arg, lpx_tensor_shape_str(s, sh, sizeof sh), (long long)g->block_rows,
                         (long long)g->block_cols, (long long)g->rows, (long long)g->cols, (long long)g->grid_rows,
                         (long long)g->grid_cols);
    }
    return LPX_OK;
}

lpx_status lpx_meta_fp8_dequantize_block(const char *op, const lpx_tensor *q, const lpx_tensor *scale_inv,
                                         int64_t block_rows, int64_t block_cols, lpx_dtype dtype,
                                         lpx_fp8_block_geom *g)
{
    lpx_status st;
    if ((st = two_d(op, "q", q)) || (st = lpx_meta_fp8_dtype(op, "q", q->dtype)) ||
        (st = float_dtype(op, "dtype", dtype)) ||
        (st = lpx_meta_fp8_block_grid(op, q->shape[0], q->shape[1], block_rows, block_cols, g)))
        return st;
    return grid_scale(op, "scale_inv", scale_inv, g);
}

lpx_status lpx_meta_fp8_mm_block(const char *op, const lpx_tensor *a, const lpx_tensor *a_scale_inv,
                                 int64_t a_block_rows, int64_t a_block_cols, const lpx_tensor *b,
                                 const lpx_tensor *b_scale_inv, int64_t b_block_rows, int64_t b_block_cols,
                                 const lpx_tensor *bias, lpx_dtype out_dtype, lpx_fp8_block_mm_geom *g)
{
    lpx_status st;
    if ((st = two_d(op, "a", a)) || (st = two_d(op, "b", b)) || (st = lpx_meta_fp8_dtype(op, "a", a->dtype)) ||
        (st = lpx_meta_fp8_dtype(op, "b", b->dtype)))
        return st;
    if (a->dtype == LPX_F8E5M2 && b->dtype == LPX_F8E5M2)
        return lpx_error(LPX_EDTYPE, "%s: a and b are both f8e5m2; e5m2 x e5m2 GEMMs are refused (as cuBLASLt does)",
                         op);
    if (a->shape[1] != b->shape[0]) {
        char sa[160], sb[160];
        return lpx_error(LPX_ESHAPE, "%s: a %s @ b %s: inner dims differ", op, lpx_tensor_shape_str(a, sa, sizeof sa),
                         lpx_tensor_shape_str(b, sb, sizeof sb));
    }
    if (a_block_cols != b_block_rows)
        return lpx_error(LPX_EINVAL, "%s: a's blocks span %lld columns of K but b's span %lld rows; the K blocks must "
                         "be the same (kb x kb promotion)", op, (long long)a_block_cols, (long long)b_block_rows);
    if ((st = lpx_meta_fp8_block_grid(op, a->shape[0], a->shape[1], a_block_rows, a_block_cols, &g->a)) ||
        (st = lpx_meta_fp8_block_grid(op, b->shape[0], b->shape[1], b_block_rows, b_block_cols, &g->b)) ||
        (st = grid_scale(op, "a_scale_inv", a_scale_inv, &g->a)) ||
        (st = grid_scale(op, "b_scale_inv", b_scale_inv, &g->b)))
        return st;
    if (out_dtype != LPX_F32 && out_dtype != LPX_BF16 && out_dtype != LPX_F16)
        return lpx_error(LPX_EDTYPE, "%s: out_dtype %s; it must be f32, bf16 or f16", op, lpx_dtype_name(out_dtype));
    g->M = a->shape[0], g->K = a->shape[1], g->N = b->shape[1];
    if (bias) {
        if ((st = float_dtype(op, "bias", bias->dtype))) return st;
        if (bias->numel != g->N || bias->ndim != 1) {
            char s[160];
            return lpx_error(LPX_ESHAPE, "%s: bias has shape %s; expected [%lld]", op,
                             lpx_tensor_shape_str(bias, s, sizeof s), (long long)g->N);
        }
    }
    return LPX_OK;
}
