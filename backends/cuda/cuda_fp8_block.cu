/* Blockwise fp8 on the GPU (ops.def, "blockwise fp8"): fp8_quantize_block,
 * fp8_dequantize_block, fp8_mm_block. Reference kernels, written for
 * clarity and bit-equality with the CPU (backends/cpu/float8_block.c), not
 * speed: one CTA per block for the cast (amax by a block reduction, TE's
 * scale formula, the scalar codec shared with the CPU), one thread per
 * element for the dequantize, and one thread per output element for the
 * GEMM, summing each K block in f32 and promoting it with the two blocks'
 * scales. The GEMM takes cuBLASLt's block-scaled fp8 GEMM first (Hopper,
 * cuBLASLt 12.9+, cuda_gemm_block.c) when the blocks fit it; this kernel
 * runs the rest (docs/NUMERICS.md, "Blockwise"). The cast reads
 * back one flag to refuse a block holding NaN or inf as the CPU does, so
 * it waits for its own kernel (a check that reads data: the kernel's).
 * Argument checks: the dispatcher's (spec families of op_args_lowp.h). */
#include <float.h>
#include <math.h>
#include <string.h>
#include "cuda_fp8.cuh"
#include "cuda_gemm_block.h"

using namespace cu_f8;

namespace {

__device__ __forceinline__ float blk_scale(float amax, float fmax, bool pow2)
{
    if (amax == 0.0f) return 1.0f;
    float s = __fdiv_rn(fmax, amax);
    if (isinf(s)) s = FLT_MAX;
    return pow2 ? __uint_as_float(__float_as_uint(s) & 0xFF800000u) : s;
}

__device__ __forceinline__ uint8_t blk_enc(bool e5, float y, int sat)
{
    return e5 ? lpx_f32_to_f8e5m2(y, sat) : lpx_f32_to_f8e4m3fn(y, sat);
}

/* Counters of one cast (zeroed by the host before the kernel). */
struct QbWork {
    unsigned long long nonzero, under, saturated;
    unsigned int amax;               /* bits of max |x| */
    unsigned int bad;                /* 1 + index of a block holding NaN/inf, 0: none */
};

struct QbArgs {
    Src x;
    int64_t R, C, br, bc, gc;
    uint8_t *q;
    float *scale, *scale_inv;
    bool e5, pow2;
    int sat;
    float fmax;
    unsigned max_code;
    QbWork *w;
};

constexpr int QB_THREADS = 256;

__global__ void __launch_bounds__(QB_THREADS) k_qblock(QbArgs a)
{
    int64_t b = blockIdx.x, bi = b / a.gc, bj = b % a.gc;
    int64_t r0 = bi * a.br, c0 = bj * a.bc;
    int64_t rn = a.R - r0 < a.br ? a.R - r0 : a.br, cn = a.C - c0 < a.bc ? a.C - c0 : a.bc;
    int64_t n = rn * cn;
    float m = 0.0f;
    int bad = 0;
    for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
        float v = src_ld(a.x, (r0 + t / cn) * a.C + c0 + t % cn);
        float av = fabsf(v);
        if (!(av <= FLT_MAX)) bad = 1;
        else m = fmaxf(m, av);
    }
    __shared__ float smax[QB_THREADS];
    __shared__ int sbad[QB_THREADS];
    smax[threadIdx.x] = m;
    sbad[threadIdx.x] = bad;
    __syncthreads();
    for (int s = QB_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            smax[threadIdx.x] = fmaxf(smax[threadIdx.x], smax[threadIdx.x + s]);
            sbad[threadIdx.x] |= sbad[threadIdx.x + s];
        }
        __syncthreads();
    }
    float amax = smax[0];
    if (sbad[0]) {
        if (threadIdx.x == 0) atomicCAS(&a.w->bad, 0u, (unsigned)(b + 1));
        return;
    }
    float s = blk_scale(amax, a.fmax, a.pow2);
    if (threadIdx.x == 0) {
        a.scale[b] = s;
        a.scale_inv[b] = __fdiv_rn(1.0f, s);
        atomicMax(&a.w->amax, __float_as_uint(amax));
    }
    unsigned long long nz = 0, un = 0, sa = 0;
    for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
        int64_t i = (r0 + t / cn) * a.C + c0 + t % cn;
        float v = src_ld(a.x, i);
        float y = __fmul_rn(v, s);
        uint8_t code = blk_enc(a.e5, y, 0);
        if ((code & 0x7Fu) > a.max_code) {
            sa++;
            if (a.sat) code = blk_enc(a.e5, y, 1);
        }
        if (v != 0.0f) {
            nz++;
            un += (code & 0x7Fu) == 0;
        }
        a.q[i] = code;
    }
    if (nz) atomicAdd(&a.w->nonzero, nz);
    if (un) atomicAdd(&a.w->under, un);
    if (sa) atomicAdd(&a.w->saturated, sa);
}

lpx_status k_fp8_quantize_block(lpx_call *c)
{
    /* the contract is the dispatcher's (spec family `fp8_quantize_block`) */
    const lpx_fp8_quantize_block_args *args = (const lpx_fp8_quantize_block_args *)lpx_op_args_of(c);
    lpx_tensor *x = args->x;
    lpx_dtype fp8 = args->fp8;
    const char *op = cu_op(c);
    const lpx_fp8_block_geom g = args->g;
    lpx_status st;
    if ((st = cu_builtin_dtype(c, "x", x))) return st;
    lpx_device dev = lpx_tensor_device(x);
    int64_t gshape[2] = {g.grid_rows, g.grid_cols}, four = 4;
    lpx_tensor *q = NULL, *ts = NULL, *tsi = NULL, *tstats = NULL;
    QbWork *w = NULL;
    int di = dev.index;
    cudaStream_t stream = cu_stream(di);
    if ((st = cu_new(c, fp8, 2, lpx_tensor_shape(x), dev, &q)) || (st = cu_new(c, LPX_F32, 2, gshape, dev, &ts)) ||
        (st = cu_new(c, LPX_F32, 2, gshape, dev, &tsi)) || (st = cu_new(c, LPX_F32, 1, &four, dev, &tstats)) ||
        (st = cu_use(op, dev)))
        goto fail;
    w = (QbWork *)cu_scratch_alloc(di, sizeof *w);
    if (!w) {
        st = lpx_error(LPX_ENOMEM, "%s: out of device memory for the cast's counters", op);
        goto fail;
    }
    if (g.grid_rows * g.grid_cols > 0) {
        QbArgs a;
        memset(&a, 0, sizeof a);
        a.x.base = (const char *)lpx_tensor_data(x);
        a.x.dt = lpx_tensor_dtype(x);
        a.x.esz = cu_esize(a.x.dt);
        cu_geom_of(&a.x.g, x);
        a.x.contig = cu_geom_contiguous(&a.x.g);
        a.R = g.rows, a.C = g.cols, a.br = g.block_rows, a.bc = g.block_cols, a.gc = g.grid_cols;
        a.q = (uint8_t *)lpx_tensor_data(q);
        a.scale = (float *)lpx_tensor_data(ts);
        a.scale_inv = (float *)lpx_tensor_data(tsi);
        a.e5 = fp8 == LPX_F8E5M2;
        a.pow2 = args->pow2;
        a.sat = args->saturate ? 1 : 0;
        a.fmax = (float)lpx_dtype_get(fp8)->max;
        a.max_code = a.e5 ? LPX_F8E5M2_MAX_CODE : LPX_F8E4M3FN_MAX_CODE;
        a.w = w;
        cudaError_t e = cudaMemsetAsync(w, 0, sizeof *w, stream);
        if (e != cudaSuccess) {
            st = cu_fail(e, op, "cudaMemsetAsync");
            goto fail;
        }
        k_qblock<<<(unsigned)(g.grid_rows * g.grid_cols), QB_THREADS, 0, stream>>>(a);
        if ((st = cu_launched(op, "k_qblock"))) goto fail;
    }
    {
        QbWork h;
        memset(&h, 0, sizeof h);
        cudaError_t e = g.grid_rows * g.grid_cols > 0 ? cudaMemcpyAsync(&h, w, sizeof h, cudaMemcpyDeviceToHost, stream)
                                                      : cudaSuccess;
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) {
            st = cu_fail(e, op, "cudaMemcpyAsync");
            goto fail;
        }
        if (h.bad) {
            long long b = (long long)h.bad - 1;
            st = lpx_error(LPX_ENUMERIC, "%s: block (%lld, %lld) of %lld x %lld holds NaN or +-inf; dynamic scaling "
                           "needs finite values", op, b / g.grid_cols, b % g.grid_cols, (long long)g.block_rows,
                           (long long)g.block_cols);
            goto fail;
        }
        double n = (double)(g.rows * g.cols);
        float amax_f;
        memcpy(&amax_f, &h.amax, sizeof amax_f);
        float stats[4] = {amax_f, h.nonzero ? (float)((double)h.under / (double)h.nonzero) : 0.0f,
                          n > 0 ? (float)((double)h.saturated / n) : 0.0f, 0.0f};
        e = cudaMemcpyAsync(lpx_tensor_data(tstats), stats, sizeof stats, cudaMemcpyHostToDevice, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);   /* `stats` is on this stack */
        if (e != cudaSuccess) {
            st = cu_fail(e, op, "cudaMemcpyAsync");
            goto fail;
        }
    }
    cu_scratch_free(di, w, sizeof *w);
    cu_ret(c, q);
    cu_ret(c, ts);
    cu_ret(c, tsi);
    cu_ret(c, tstats);
    return LPX_OK;
fail:
    if (w) cu_scratch_free(di, w, sizeof *w);
    lpx_tensor_release(q);
    lpx_tensor_release(ts);
    lpx_tensor_release(tsi);
    lpx_tensor_release(tstats);
    return st;
}

/* ---- dequantize ------------------------------------------------------ */

struct DqbArgs {
    const uint8_t *q;
    cu_geom qg;
    Src s;
    int64_t C, br, bc, gc, n;
    bool e5;
    lpx_dtype dt;
    float omax;               /* f8_deq: the largest finite value of dt */
    void *y;
};

__global__ void k_dqblock(DqbArgs a)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
        int64_t r = i / a.C, k = i % a.C;
        uint8_t code = a.q[cu_offset(a.qg, i)];
        float v = a.e5 ? lpx_f8e5m2_to_f32(code) : lpx_f8e4m3fn_to_f32(code);
        float si = src_ld(a.s, (r / a.br) * a.gc + k / a.bc);
        cu_enc(a.dt, (char *)a.y + i * cu_esize(a.dt), f8_deq(v, si, a.omax), 0);
    }
}

lpx_status k_fp8_dequantize_block(lpx_call *c)
{
    /* the contract is the dispatcher's (spec family `fp8_dequantize_block`) */
    const lpx_fp8_dequantize_block_args *args = (const lpx_fp8_dequantize_block_args *)lpx_op_args_of(c);
    lpx_tensor *q = args->q, *si = args->scale_inv;
    lpx_dtype dt = args->dtype;
    const char *op = cu_op(c);
    const lpx_fp8_block_geom g = args->g;
    lpx_status st;
    if ((st = cu_builtin_dtype(c, "scale_inv", si))) return st;
    if (dt >= LPX_DTYPE_BUILTIN_COUNT)   /* the dtypes this backend writes */
        return lpx_error(LPX_EDTYPE, "%s: dtype %s: the cuda kernels write built-in dtypes only", op,
                         lpx_dtype_name(dt));
    lpx_device dev = lpx_tensor_device(q);
    lpx_tensor *y = NULL;
    if ((st = cu_new(c, dt, 2, lpx_tensor_shape(q), dev, &y))) return st;
    if ((st = cu_use(op, dev))) {
        lpx_tensor_release(y);
        return st;
    }
    DqbArgs a;
    memset(&a, 0, sizeof a);
    a.q = (const uint8_t *)lpx_tensor_data(q);
    cu_geom_of(&a.qg, q);
    a.s.base = (const char *)lpx_tensor_data(si);
    a.s.dt = lpx_tensor_dtype(si);
    a.s.esz = cu_esize(a.s.dt);
    cu_geom_of(&a.s.g, si);
    a.s.contig = cu_geom_contiguous(&a.s.g);
    a.C = g.cols, a.br = g.block_rows, a.bc = g.block_cols, a.gc = g.grid_cols, a.n = g.rows * g.cols;
    a.e5 = lpx_tensor_dtype(q) == LPX_F8E5M2;
    a.dt = dt;
    a.omax = f8_out_max(dt);
    a.y = lpx_tensor_data(y);
    if (a.n > 0) {
        int64_t blocks = (a.n + 255) / 256;
        k_dqblock<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, cu_stream(dev.index)>>>(a);
        if ((st = cu_launched(op, "k_dqblock"))) {
            lpx_tensor_release(y);
            return st;
        }
    }
    cu_ret(c, y);
    return LPX_OK;
}

/* ---- the GEMM ----------------------------------------------------------- */

struct MmbArgs {
    const uint8_t *a, *b;
    cu_geom ag, bg;
    bool ae5, be5;
    Src sa, sb, bias;
    bool has_bias;
    int64_t M, N, K, kb, abr, agc, bbc, bgc;
    lpx_dtype dt;
    void *y;
};

__global__ void k_mmblock(MmbArgs p)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < p.M * p.N; o += stride) {
        int64_t m = o / p.N, n = o % p.N;
        float acc = 0.0f;
        for (int64_t k0 = 0, j = 0; k0 < p.K; k0 += p.kb, j++) {
            float part = 0.0f;
            int64_t kend = k0 + p.kb < p.K ? k0 + p.kb : p.K;
            for (int64_t k = k0; k < kend; k++) {
                uint8_t ca = p.a[cu_offset(p.ag, m * p.K + k)], cb = p.b[cu_offset(p.bg, k * p.N + n)];
                float va = p.ae5 ? lpx_f8e5m2_to_f32(ca) : lpx_f8e4m3fn_to_f32(ca);
                float vb = p.be5 ? lpx_f8e5m2_to_f32(cb) : lpx_f8e4m3fn_to_f32(cb);
                part = __fadd_rn(part, __fmul_rn(va, vb));
            }
            float s = __fmul_rn(src_ld(p.sa, (m / p.abr) * p.agc + j), src_ld(p.sb, j * p.bgc + n / p.bbc));
            acc = __fadd_rn(acc, __fmul_rn(part, s));
        }
        if (p.has_bias) acc = __fadd_rn(acc, src_ld(p.bias, n));
        cu_enc(p.dt, (char *)p.y + o * cu_esize(p.dt), acc, 0);
    }
}

void src_of(Src *s, const lpx_tensor *t)
{
    s->base = (const char *)lpx_tensor_data(t);
    s->dt = lpx_tensor_dtype(t);
    s->esz = cu_esize(s->dt);
    cu_geom_of(&s->g, t);
    s->contig = cu_geom_contiguous(&s->g);
}

lpx_status k_fp8_mm_block(lpx_call *c)
{
    /* the contract is the dispatcher's (spec family `fp8_mm_block`) */
    const lpx_fp8_mm_block_args *args = (const lpx_fp8_mm_block_args *)lpx_op_args_of(c);
    lpx_tensor *a = args->a, *asi = args->a_scale_inv, *b = args->b, *bsi = args->b_scale_inv, *bias = args->bias;
    lpx_dtype odt = args->out_dtype;
    const char *op = cu_op(c);
    const lpx_fp8_block_mm_geom g = args->g;
    lpx_status st;
    if ((st = cu_builtin_dtype(c, "a_scale_inv", asi)) || (st = cu_builtin_dtype(c, "b_scale_inv", bsi)) ||
        (st = cu_builtin_dtype(c, "bias", bias)))
        return st;
    lpx_device dev = lpx_tensor_device(a);
    int64_t oshape[2] = {g.M, g.N};
    lpx_tensor *y = NULL;
    if ((st = cu_new(c, odt, 2, oshape, dev, &y))) return st;
    if ((st = cu_use(op, dev))) {
        lpx_tensor_release(y);
        return st;
    }
    /* cuBLASLt's block-scaled GEMM first (cuda_gemm_block.c), when the
     * blocks are ones it has */
    if (g.M * g.N > 0 && g.K > 0) {
        cu_block_mm x;
        memset(&x, 0, sizeof x);
        x.dev = dev.index;
        x.M = g.M, x.N = g.N, x.K = g.K, x.k_block = g.a.block_cols;
        x.a_block_rows = g.a.block_rows, x.b_block_cols = g.b.block_cols;
        x.a = lpx_tensor_data(a), x.a_rs = lpx_tensor_strides(a)[0], x.a_cs = lpx_tensor_strides(a)[1];
        x.adt = lpx_tensor_dtype(a);
        x.b = lpx_tensor_data(b), x.b_rs = lpx_tensor_strides(b)[0], x.b_cs = lpx_tensor_strides(b)[1];
        x.bdt = lpx_tensor_dtype(b);
        x.as = lpx_tensor_data(asi), x.as_rs = lpx_tensor_strides(asi)[0], x.as_cs = lpx_tensor_strides(asi)[1];
        x.as_dt = lpx_tensor_dtype(asi);
        x.bs = lpx_tensor_data(bsi), x.bs_rs = lpx_tensor_strides(bsi)[0], x.bs_cs = lpx_tensor_strides(bsi)[1];
        x.bs_dt = lpx_tensor_dtype(bsi);
        x.bias = bias ? lpx_tensor_data(bias) : NULL;
        x.y = lpx_tensor_data(y);
        x.odt = odt;
        bool ran = false;
        if ((st = cu_gemm_fp8_block(op, &x, &ran))) {
            lpx_tensor_release(y);
            return st;
        }
        if (ran) {
            cu_ret(c, y);
            return LPX_OK;
        }
    }
    MmbArgs p;
    memset(&p, 0, sizeof p);
    p.a = (const uint8_t *)lpx_tensor_data(a);
    p.b = (const uint8_t *)lpx_tensor_data(b);
    cu_geom_of(&p.ag, a);
    cu_geom_of(&p.bg, b);
    p.ae5 = lpx_tensor_dtype(a) == LPX_F8E5M2;
    p.be5 = lpx_tensor_dtype(b) == LPX_F8E5M2;
    src_of(&p.sa, asi);
    src_of(&p.sb, bsi);
    if (bias) {
        src_of(&p.bias, bias);
        p.has_bias = true;
    }
    p.M = g.M, p.N = g.N, p.K = g.K, p.kb = g.a.block_cols;
    p.abr = g.a.block_rows, p.agc = g.a.grid_cols, p.bbc = g.b.block_cols, p.bgc = g.b.grid_cols;
    p.dt = odt;
    p.y = lpx_tensor_data(y);
    if (g.M * g.N > 0) {
        int64_t blocks = (g.M * g.N + 255) / 256;
        k_mmblock<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, cu_stream(dev.index)>>>(p);
        if ((st = cu_launched(op, "k_mmblock"))) {
            lpx_tensor_release(y);
            return st;
        }
    }
    cu_ret(c, y);
    return LPX_OK;
}

} // namespace

lpx_status cu_f8_register_block(const lpx_host *h)
{
    lpx_status st;
    if ((st = cu_reg(h, LPX_OP_fp8_quantize_block, k_fp8_quantize_block)) ||
        (st = cu_reg(h, LPX_OP_fp8_dequantize_block, k_fp8_dequantize_block)))
        return st;
    return cu_reg(h, LPX_OP_fp8_mm_block, k_fp8_mm_block);
}
