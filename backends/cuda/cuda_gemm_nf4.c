/* nf4_mm on the GPU: W dequantized in tiles of rows into a bf16/f16/f32
 * buffer by cu_nf4_dequantize_into (cuda_nf4.cu), then the same cuBLASLt
 * GEMM as linear (cu_gemm_run); an untransposed W accumulates its tiles in
 * f32. Semantics of the CPU kernel (backends/cpu/nf4.c); the arguments are
 * checked by the dispatcher (spec family `nf4_mm`).
 * Split from the former cuda_gemm.c: the GEMM whose weight is NF4 codes. */
#include <stdint.h>
#include <string.h>
#include "cuda_gemm_internal.h"
#include "cuda_nf4.h"

#define GM_NF4_TILE ((int64_t)1 << 24) /* elements of W dequantized at once */

/* ---- nf4_mm ----------------------------------------------------------------- */

/* The payload of an NF4 op as the dispatcher checked it
 * (lpx_nf4_payload_args: lpx_meta_nf4_payload's contract), before
 * cu_nf4_dequantize_into, which trusts its caller. */
typedef struct gm_nf4 {
    const uint8_t *codes;
    const int8_t *qs;
    const float *f, *mean;
    int64_t block, sblock, padded;
} gm_nf4;

static void gm_nf4_payload(const lpx_nf4_payload_args *a, gm_nf4 *p)
{
    p->codes = lpx_tensor_data(a->codes);
    p->qs = lpx_tensor_data(a->qscalers);
    p->f = lpx_tensor_data(a->factors);
    p->mean = lpx_tensor_data(a->mean);
    p->block = a->block;
    p->sblock = a->scaler_block;
    p->padded = a->padded;
}

static lpx_status k_nf4_mm(lpx_call *c)
{
    /* the contract is the dispatcher's (spec family `nf4_mm`) */
    const lpx_nf4_mm_args *args = (const lpx_nf4_mm_args *)lpx_op_args_of(c);
    lpx_tensor *x = args->x, *bias = args->bias;
    int64_t rows = args->rows, cols = args->cols;
    bool tw = args->transpose_w;
    const char *op = cu_op(c);
    lpx_status st;
    gm_nf4 pl;
    memset(&pl, 0, sizeof pl);
    gm_nf4_payload(&args->p, &pl);
    /* what this backend has no code for: plugin dtypes, and a bias that is
     * not floating-point (the GEMM's epilogue reads a float vector; the CPU
     * converts any dtype) */
    if ((st = cu_builtin_dtype(c, "x", x)) || (st = cu_builtin_dtype(c, "bias", bias))) return st;
    if (bias && !lpx_dtype_get(lpx_tensor_dtype(bias))->is_float)
        return lpx_error(LPX_EDTYPE, "%s: bias has dtype %s; %s takes floating-point tensors", op,
                         lpx_dtype_name(lpx_tensor_dtype(bias)), op);
    int64_t K = args->g.K, N = args->g.N;
    int xnd = lpx_tensor_ndim(x);
    const int64_t *xs = lpx_tensor_shape(x);
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(op, dev))) return st;
    lpx_dtype R = lpx_tensor_dtype(x), T = cu_gemm_hp(R) ? R : LPX_F32;
    int64_t M = 1;
    for (int d = 0; d < xnd - 1; d++) M *= xs[d];
    int64_t oshape[LPX_MAX_DIMS];
    memcpy(oshape, xs, (size_t)(xnd - 1) * sizeof *oshape);
    oshape[xnd - 1] = N;
    int64_t tile_rows = cols ? GM_NF4_TILE / cols : rows;
    if (tile_rows < 1) tile_rows = 1;
    if (tile_rows > rows) tile_rows = rows;
    int64_t ntiles = tile_rows ? (rows + tile_rows - 1) / tile_rows : 0;
    /* D: the result, or f32 when the tiles of an untransposed W accumulate
     * (one rounding at the end) or R is not a GEMM dtype */
    lpx_dtype Ddt = (!tw && ntiles > 1) ? LPX_F32 : T;
    lpx_tensor *res = NULL, *dt = NULL, *tile = NULL, *bown = NULL;
    gm_operand ox = {0};
    if ((st = cu_new(c, R, xnd, oshape, dev, &res))) return st;
    if (M == 0 || N == 0) goto ok;
    if (Ddt != R && (st = cu_new(c, Ddt, xnd, oshape, dev, &dt))) goto fail;
    void *D = lpx_tensor_data(dt ? dt : res);
    if (K == 0) {
        /* y = bias (or 0) */
        st = cu_gemm_epilogue(op, dev.index, NULL, 0, M, N, NULL, false, NULL, false,
                              bias ? lpx_tensor_data(bias) : NULL, bias ? lpx_tensor_dtype(bias) : LPX_F32,
                              bias ? lpx_tensor_strides(bias)[0] : 0, D, Ddt, N);
        if (st) goto fail;
        goto convert;
    }
    if ((st = cu_gemm_operand_of(c, x, T, false, M, K, false, &ox))) goto fail;
    gm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = dev.index;
    p.M = M;
    p.batch = 1;
    p.ab_dt = p.b_dt = T;
    p.d_dt = Ddt;
    p.ldd = N;
    p.alpha = 1.0f;
    p.a_rs = ox.rs;
    p.a_cs = ox.cs;
    const void *bptr = NULL;
    if (bias && (st = cu_gemm_vector(c, bias, Ddt, N, &bown, &bptr))) goto fail;
    int64_t tshape[1] = {tile_rows * cols};
    if ((st = cu_new(c, T, 1, tshape, dev, &tile))) goto fail;
    size_t tes = cu_gemm_es(T), des = cu_gemm_es(Ddt);
    for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
        int64_t n = rows - r0 < tile_rows ? rows - r0 : tile_rows;
        /* rows [r0, r0 + n) of W, queued before the GEMM that reads them
         * (one stream: the next tile's dequantization waits for it) */
        if ((st = cu_nf4_dequantize_into(op, dev.index, pl.codes, pl.qs, pl.f, pl.mean, pl.block, pl.sblock,
                                         r0 * cols, n * cols, T, lpx_tensor_data(tile), false)))
            goto fail;
        if (tw) {
            /* y[:, r0:r0+n] = x @ Wt^T (+ bias[r0:r0+n]); Wt^T [cols, n] is
             * column-major (the TN case) */
            p.N = n;
            p.K = cols;
            p.a = ox.p;
            p.b = lpx_tensor_data(tile);
            p.b_rs = 1;
            p.b_cs = cols;
            p.d = (char *)D + (size_t)r0 * des;
            p.bias = bptr ? (const char *)bptr + (size_t)r0 * des : NULL;
            p.bias_dt = Ddt;
        } else {
            /* y (+)= x[:, r0:r0+n] @ Wt, bias with the first tile */
            p.N = cols;
            p.K = n;
            p.a = (const char *)ox.p + (size_t)(r0 * ox.cs) * tes;
            p.b = lpx_tensor_data(tile);
            p.b_rs = cols;
            p.b_cs = 1;
            p.d = D;
            p.bias = r0 == 0 ? bptr : NULL;
            p.bias_dt = Ddt;
            p.c = r0 == 0 ? NULL : D;
            p.ldc = N;
            p.beta = 1.0f;
        }
        if ((st = cu_gemm_run(op, &p))) goto fail;
    }
convert:
    if (dt && (st = cu_copy_convert(c, res, dt, false))) goto fail;
ok:
    cu_gemm_operand_release(&ox);
    lpx_tensor_release(dt);
    lpx_tensor_release(tile);
    lpx_tensor_release(bown);
    cu_ret(c, res);
    return LPX_OK;
fail:
    cu_gemm_operand_release(&ox);
    lpx_tensor_release(dt);
    lpx_tensor_release(tile);
    lpx_tensor_release(bown);
    lpx_tensor_release(res);
    return st;
}

lpx_status cu_gemm_register_nf4(const lpx_host *h)
{
    return cu_reg(h, LPX_OP_nf4_mm, k_nf4_mm);
}
