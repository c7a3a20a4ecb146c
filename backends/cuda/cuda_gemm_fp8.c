/* fp8_scaled_mm on the GPU (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3;
 * tensorwise or rowwise scales; the arguments are checked by the
 * dispatcher, spec family `fp8_scaled_mm`): operand packing, scale vectors, and the
 * fallback to an f32 GEMM plus epilogue kernel when cuBLASLt has no fp8
 * kernel for the case. Split from the former cuda_gemm.c: the one GEMM op
 * with fp8 operands and scales; the engine is cuda_gemm_plan.c, the helper
 * kernels cuda_gemm_util.cu.
 *
 * fp8: cuBLASLt needs both operands K-major with 16-byte aligned pointers
 * and leading dimensions, K % 16 == 0 and (we also pad) N % 16 == 0. An
 * operand that is not already so is packed by a small kernel into a
 * zero-padded K-major copy (zeros add nothing to the sums), so any shape
 * the CPU accepts works (17 x 33 x 65 included). Tensorwise scale_invs
 * are cuBLASLt's A/B scale pointers (device memory, no sync); rowwise ones
 * use CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F (cuBLAS 12.9+). When the
 * library has no such kernel for the problem (older cuBLAS, other GPUs),
 * or the bias/out combination is one cuBLASLt lacks (f32 out with bias:
 * its fp8 bias is bf16), the GEMM writes f32 and a small epilogue kernel
 * applies scales and bias in the CPU's order. */
#include <stdint.h>
#include <string.h>
#include "cuda_gemm_internal.h"

/* ---- fp8_scaled_mm ---------------------------------------------------------- */

static int64_t gm_round16(int64_t v) { return (v + 15) / 16 * 16; }

/* Element stride between the n values of a per-row / per-column scale. */
static int64_t gm_scale_stride(const lpx_tensor *s, bool per, bool rows)
{
    return per ? lpx_tensor_strides(s)[rows ? 0 : 1] : 0;
}

static lpx_status k_fp8_scaled_mm(lpx_call *c)
{
    /* the contract is lpx_meta_fp8_scaled_mm's, checked by the dispatcher
     * (spec family `fp8_scaled_mm`) */
    const lpx_fp8_scaled_mm_args *args = (const lpx_fp8_scaled_mm_args *)lpx_op_args_of(c);
    lpx_tensor *a = args->a, *as = args->a_scale_inv, *b = args->b, *bs = args->b_scale_inv, *bias = args->bias;
    lpx_dtype odt = args->out_dtype;
    bool fast_accum = args->fast_accum;
    const char *op = cu_op(c);
    lpx_status st;
    const lpx_fp8_mm_geom g = args->g;
    if ((st = cu_builtin_dtype(c, "a_scale_inv", as)) || (st = cu_builtin_dtype(c, "b_scale_inv", bs)) ||
        (st = cu_builtin_dtype(c, "bias", bias)))
        return st;
    int64_t M = g.M, K = g.K, N = g.N;
    bool a_per = g.a_rowwise, b_per = g.b_colwise;
    lpx_dtype adt = lpx_tensor_dtype(a), bdt = lpx_tensor_dtype(b);
    int64_t a_ss = gm_scale_stride(as, a_per, true), b_ss = gm_scale_stride(bs, b_per, false);
    lpx_device dev = lpx_tensor_device(a);
    if ((st = cu_use(op, dev))) return st;
    int64_t oshape[2] = {M, N};
    lpx_tensor *out;
    if ((st = cu_new(c, odt, 2, oshape, dev, &out))) return st;
    if (M == 0 || N == 0) {
        cu_ret(c, out);
        return LPX_OK;
    }
    int di = dev.index;
    gm_scratch s = {.dev = di};
    int64_t Kp = K < 16 ? 16 : gm_round16(K), Np = gm_round16(N);
    const int64_t *ast = lpx_tensor_strides(a), *bst = lpx_tensor_strides(b);
    const char *ap = lpx_tensor_data(a), *bp = lpx_tensor_data(b);

    /* a: row-major [M, Kp], 16-byte aligned rows */
    int64_t lda = M <= 1 ? K : ast[0];
    bool a_ok = Kp == K && (K <= 1 || ast[1] == 1) && lda >= K && lda % 16 == 0 && ((uintptr_t)ap & 15) == 0;
    /* b: column-major [Kp, Np] (each of its N columns K-contiguous) */
    int64_t ldb = N <= 1 ? K : bst[1];
    bool b_ok = Kp == K && Np == N && (K <= 1 || bst[0] == 1) && ldb >= K && ldb % 16 == 0 &&
                ((uintptr_t)bp & 15) == 0;
    const void *pa = ap, *pb = bp;
    if (!a_ok) {
        void *buf = cu_gemm_scratch_get(&s, (size_t)(M * Kp));
        if (!buf) goto nomem;
        if ((st = cu_gemm_pack8(op, di, ap, M, K, ast[0], ast[1], buf, M, Kp))) goto done;
        pa = buf;
        lda = Kp;
    }
    if (!b_ok) {
        void *buf = cu_gemm_scratch_get(&s, (size_t)(Np * Kp));
        if (!buf) goto nomem;
        /* row n of the packed copy is column n of b */
        if ((st = cu_gemm_pack8(op, di, bp, N, K, bst[1], bst[0], buf, Np, Kp))) goto done;
        pb = buf;
        ldb = Kp;
    }

    gm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = di;
    p.M = M;
    p.N = Np;
    p.K = Kp;
    p.batch = 1;
    p.a = pa;
    p.a_rs = lda;
    p.a_cs = 1;
    p.b = pb;
    p.b_rs = 1;
    p.b_cs = ldb;
    p.ab_dt = adt;
    p.b_dt = bdt;
    p.alpha = 1.0f;
    p.fast_accum = fast_accum;

    /* scales: device f32 (tensorwise f32 tensors are used in place) */
    const float *sa_v = NULL, *sb_v = NULL;
    bool per = a_per || b_per;
    if (!per && lpx_tensor_dtype(as) == LPX_F32) sa_v = lpx_tensor_data(as);
    if (!per && lpx_tensor_dtype(bs) == LPX_F32) sb_v = lpx_tensor_data(bs);
    if (!sa_v) {
        int64_t n = per ? M : 1;
        float *v = cu_gemm_scratch_get(&s, (size_t)n * sizeof(float));
        if (!v) goto nomem;
        if ((st = cu_gemm_gather_f32(op, di, lpx_tensor_data(as), lpx_tensor_dtype(as), a_ss, a_per, n, v, n)))
            goto done;
        sa_v = v;
    }
    if (!sb_v) {
        int64_t n = per ? N : 1, np = per ? Np : 1;
        float *v = cu_gemm_scratch_get(&s, (size_t)np * sizeof(float));
        if (!v) goto nomem;
        if ((st = cu_gemm_gather_f32(op, di, lpx_tensor_data(bs), lpx_tensor_dtype(bs), b_ss, b_per, n, v, np)))
            goto done;
        sb_v = v;
    }
    p.a_scale = sa_v;
    p.b_scale = sb_v;
    p.scale_mode = per ? GM_SCALE_OUTER : GM_SCALE_SCALAR;
    if (per && !GM_HAVE_OUTER_VEC) p.scale_mode = GM_SCALE_NONE;

    /* bias through cuBLASLt only where its fp8 kernels take it as is */
    bool bias_blas = bias && odt != LPX_F32 && lpx_tensor_dtype(bias) == odt && Np == N &&
                     (N <= 1 || lpx_tensor_strides(bias)[0] == 1);
    for (int attempt = 0; attempt < 2; attempt++) {
        bool scales_here = p.scale_mode == GM_SCALE_NONE;
        bool epi = scales_here || (bias && !bias_blas);
        p.bias = epi || !bias ? NULL : lpx_tensor_data(bias);
        p.bias_dt = odt;
        if (epi) {
            /* f32 accumulator: out itself when it is f32 and unpadded */
            p.d_dt = LPX_F32;
            if (odt == LPX_F32 && Np == N) {
                p.d = lpx_tensor_data(out);
            } else if (!(p.d = cu_gemm_scratch_get(&s, (size_t)(M * Np) * sizeof(float)))) {
                goto nomem;
            }
        } else {
            p.d_dt = odt;
            if (Np == N) p.d = lpx_tensor_data(out);
            else if (!(p.d = cu_gemm_scratch_get(&s, (size_t)(M * Np) * cu_gemm_es(odt)))) goto nomem;
        }
        p.ldd = Np;
        st = cu_gemm_run(op, &p);
        if (st == LPX_ENOTIMPL && p.scale_mode != GM_SCALE_NONE) {
            /* no cuBLASLt kernel with these scales: unit scales, f32 out,
             * scales and bias in the epilogue kernel */
            p.scale_mode = GM_SCALE_NONE;
            st = LPX_OK;
            continue;
        }
        if (st) goto done;
        if (epi) {
            st = cu_gemm_epilogue(op, di, p.d, Np, M, N, scales_here ? sa_v : NULL, a_per, scales_here ? sb_v : NULL,
                                  b_per, bias ? lpx_tensor_data(bias) : NULL,
                                  bias ? lpx_tensor_dtype(bias) : LPX_F32, bias ? lpx_tensor_strides(bias)[0] : 0,
                                  lpx_tensor_data(out), odt, N);
        } else if (Np != N) {
            size_t es = cu_gemm_es(odt);
            cudaError_t e = cudaMemcpy2DAsync(lpx_tensor_data(out), (size_t)N * es, p.d, (size_t)Np * es,
                                              (size_t)N * es, (size_t)M, cudaMemcpyDeviceToDevice, cu_stream(di));
            if (e != cudaSuccess) st = cu_fail(e, op, "cudaMemcpy2DAsync(unpad result)");
        }
        goto done;
    }
    goto done;
nomem:
    st = lpx_error(LPX_ENOMEM, "%s: cannot allocate device scratch for the packed operands, scales or result", op);
done:
    cu_gemm_scratch_free(&s);
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    cu_ret(c, out);
    return LPX_OK;
}

lpx_status cu_gemm_register_fp8(const lpx_host *h)
{
    return cu_reg(h, LPX_OP_fp8_scaled_mm, k_fp8_scaled_mm);
}
