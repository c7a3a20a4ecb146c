/* nf4_mm on the GPU: W dequantized in tiles of rows into a bf16/f16/f32
 * buffer by cu_nf4_dequantize_into (cuda_nf4.cu), then the same cuBLASLt
 * GEMM as linear (cu_gemm_run); an untransposed W accumulates its tiles in
 * f32. Payload checks and semantics of the CPU kernel (backends/cpu/nf4.c).
 * Split from the former cuda_gemm.c: the GEMM whose weight is NF4 codes. */
#include <stdint.h>
#include <string.h>
#include "cuda_gemm_internal.h"
#include "cuda_nf4.h"

#define GM_NF4_TILE ((int64_t)1 << 24) /* elements of W dequantized at once */

/* ---- nf4_mm ----------------------------------------------------------------- */

/* The payload of an NF4 op (args first..first+5: codes, qscalers, factors,
 * mean, block, scaler_block), checked before cu_nf4_dequantize_into, which
 * trusts its caller. */
typedef struct gm_nf4 {
    const uint8_t *codes;
    const int8_t *qs;
    const float *f, *mean;
    int64_t block, sblock, padded;
} gm_nf4;

/* The payload tensors are dense CUDA tensors (here); their contract is
 * lpx_meta_nf4_payload's, shared with the CPU and the nf4_dequantize op. */
static lpx_status gm_nf4_payload(const lpx_call *c, int first, const lpx_tensor *x, gm_nf4 *p)
{
    const lpx_tensor *codes = cu_arg_tensor(c, first), *qs = cu_arg_tensor(c, first + 1),
                     *f = cu_arg_tensor(c, first + 2), *mean = cu_arg_tensor(c, first + 3);
    int64_t block = c->args[first + 4].u.i, sblock = c->args[first + 5].u.i;
    lpx_status st;
    (void)x; /* on x's device: the dispatcher refuses tensors on different devices */
    if ((st = cu_check_dense(c, "codes", codes)) || (st = cu_check_dense(c, "qscalers", qs)) ||
        (st = cu_check_dense(c, "factors", f)) || (st = cu_check_dense(c, "mean", mean)) ||
        (st = lpx_meta_nf4_payload(cu_op(c), codes, qs, f, mean, block, sblock, &p->padded)))
        return st;
    p->codes = lpx_tensor_data(codes);
    p->qs = lpx_tensor_data(qs);
    p->f = lpx_tensor_data(f);
    p->mean = lpx_tensor_data(mean);
    p->block = block;
    p->sblock = sblock;
    return LPX_OK;
}

static lpx_status k_nf4_mm(lpx_call *c)
{
    lpx_tensor *x = cu_arg_tensor(c, 0), *bias = cu_arg_tensor(c, 10);
    int64_t rows = c->args[7].u.i, cols = c->args[8].u.i;
    bool tw = c->args[9].u.b;
    const char *op = cu_op(c);
    lpx_status st;
    gm_nf4 pl;
    memset(&pl, 0, sizeof pl);
    if ((st = cu_check_float(c, "x", x)) || (st = gm_nf4_payload(c, 1, x, &pl))) return st;
    lpx_gemm_geom g;
    if ((bias && (st = cu_gemm_check_float_same(c, "x", x, "bias", bias))) ||
        (st = lpx_meta_nf4_mm(op, x, pl.padded, rows, cols, tw, bias, &g)))
        return st;
    int64_t K = g.K, N = g.N;
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
