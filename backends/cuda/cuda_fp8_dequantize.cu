/* fp8_dequantize and fp8_scale_from_amax on the GPU (ops_float8.def):
 * decode(q) * scale_inv to a float dtype (k_deq, a 256-entry table of the
 * decoded codes per block) and the dynamic scale formula applied to given
 * amaxes (k_scale_from_amax, in double like the CPU). Split from the former
 * cuda_float8.cu: these ops read fp8 rather than write it and share only
 * the scale formula and NaN handling (cuda_fp8.cuh) with the quantize.
 * Same output shapes and bits as backends/cpu/float8.c; the argument
 * checks are the dispatcher's (spec families of op_args_lowp.h). */
#include <math.h>
#include <string.h>
#include "cuda_fp8.cuh"

using namespace cu_f8;

namespace {

/* ---- fp8_dequantize ---------------------------------------------------- */

/* decode(q) * s, encoded to dtype `dt` non-saturating, as the CPU does. */
struct DeqArgs {
    const uint8_t *q;
    cu_geom qg;
    int qcontig;
    int64_t n, nvec;          /* elements; 16-byte output vectors written vectorized */
    lpx_dtype qdt, dt;
    float omax;               /* f8_deq: the largest finite value of dt */
    /* scale_inv: by value (smode 0), numel-1 device tensor (1), or
     * broadcast to q's shape (2) */
    int smode;
    float sval;
    const void *sp;
    lpx_dtype sdt;
    int sesz;
    cu_geom sg;
    void *y;
};

__device__ __forceinline__ float deq_scale(const DeqArgs &a, int64_t i)
{
    if (a.smode == 0) return a.sval;
    if (a.smode == 1) return cu_dec(a.sdt, a.sp);
    return cu_dec(a.sdt, (const char *)a.sp + cu_offset(a.sg, i) * a.sesz);
}

/* Table of the 256 decoded codes, built by the block from the codec. */
__device__ __forceinline__ void deq_table(float *tab, lpx_dtype qdt)
{
    for (int k = threadIdx.x; k < 256; k += blockDim.x)
        tab[k] = qdt == LPX_F8E4M3FN ? lpx_f8e4m3fn_to_f32((uint8_t)k) : lpx_f8e5m2_to_f32((uint8_t)k);
    __syncthreads();
}

/* OUT: 0 f32, 1 bf16, 2 f16 (vector stores), 3 any dtype (cu_enc). */
template <int OUT> __device__ __forceinline__ void deq_store1(const DeqArgs &a, int64_t i, float v)
{
    if (OUT == 0) ((float *)a.y)[i] = v;
    else if (OUT == 1) ((uint16_t *)a.y)[i] = lpx_f32_to_bf16(v, 0);
    else if (OUT == 2) ((uint16_t *)a.y)[i] = lpx_f32_to_f16(v, 0);
    else cu_enc(a.dt, (char *)a.y + i * cu_esize(a.dt), v, 0);
}

template <int OUT> __global__ void __launch_bounds__(256) k_deq(DeqArgs a)
{
    __shared__ float tab[256];
    deq_table(tab, a.qdt);
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    if constexpr (OUT < 3) {
        /* contiguous q, one scale: a thread writes 16 contiguous bytes per
         * vector (4 codes to f32, 8 to bf16/f16), so a warp's stores are
         * whole lines; U vectors per step, loads first */
        constexpr int CPV = OUT == 0 ? 4 : 8, U = 4;
        float s = a.smode == 0 ? a.sval : deq_scale(a, 0);
        for (int64_t v0 = tid; v0 < a.nvec; v0 += U * stride) {
            uint32_t w[U][CPV / 4];
#pragma unroll
            for (int j = 0; j < U; j++) {
                int64_t v = v0 + j * stride;
                if (v >= a.nvec) break;
                if (CPV == 4) {
                    w[j][0] = reinterpret_cast<const uint32_t *>(a.q)[v];
                } else {
                    uint2 r = reinterpret_cast<const uint2 *>(a.q)[v];
                    w[j][0] = r.x;
                    w[j][CPV / 4 - 1] = r.y;
                }
            }
#pragma unroll
            for (int j = 0; j < U; j++) {
                int64_t v = v0 + j * stride;
                if (v >= a.nvec) break;
                float o[CPV];
#pragma unroll
                for (int k = 0; k < CPV; k++) o[k] = f8_deq(tab[(w[j][k >> 2] >> (8 * (k & 3))) & 0xFFu], s, a.omax);
                if (OUT == 0) {
                    reinterpret_cast<float4 *>(a.y)[v] = make_float4(o[0], o[1], o[2], o[3 % CPV]);
                } else {
                    uint32_t h[4];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        uint32_t lo = OUT == 1 ? lpx_f32_to_bf16(o[(2 * k) % CPV], 0) : lpx_f32_to_f16(o[(2 * k) % CPV], 0);
                        uint32_t hi = OUT == 1 ? lpx_f32_to_bf16(o[(2 * k + 1) % CPV], 0)
                                               : lpx_f32_to_f16(o[(2 * k + 1) % CPV], 0);
                        h[k] = lo | hi << 16;
                    }
                    reinterpret_cast<uint4 *>(a.y)[v] = make_uint4(h[0], h[1], h[2], h[3]);
                }
            }
        }
        for (int64_t i = a.nvec * CPV + tid; i < a.n; i += stride) deq_store1<OUT>(a, i, f8_deq(tab[a.q[i]], s, a.omax));
    } else {
        for (int64_t i = tid; i < a.n; i += stride) {
            uint8_t code = a.q[a.qcontig ? i : cu_offset(a.qg, i)];
            deq_store1<3>(a, i, f8_deq(tab[code], deq_scale(a, i), a.omax));
        }
    }
}

lpx_status k_fp8_dequantize(lpx_call *c)
{
    /* the contract is the dispatcher's (spec family `fp8_dequantize`) */
    const lpx_fp8_dequantize_args *args = (const lpx_fp8_dequantize_args *)lpx_op_args_of(c);
    lpx_tensor *q = args->q, *si = args->scale_inv;
    lpx_dtype dt = args->dtype;
    const char *op = cu_op(c);
    lpx_status st;
    /* a numel-1 scale_inv may stay on the host (Tensor(host)): read there.
     * A larger one on the host is what this backend has no code for (its
     * kernels read scale_inv on the device) */
    bool on_host = lpx_tensor_device(si).type == LPX_DEVICE_CPU;
    bool si_host = on_host && lpx_tensor_numel(si) == 1;
    if (on_host && !si_host)
        return lpx_error(LPX_EDEVICE, "%s: tensor 'scale_inv' is on device type %d, not a CUDA device (move it with "
                         "lpx_tensor_to)", op, (int)LPX_DEVICE_CPU);
    if (!si_host && (st = cu_builtin_dtype(c, "scale_inv", si))) return st;
    if (dt >= LPX_DTYPE_BUILTIN_COUNT)   /* the dtypes this backend writes */
        return lpx_error(LPX_EDTYPE, "%s: dtype %s: the cuda kernels write built-in dtypes only (dequantize to f32 "
                                     "and cast on the CPU)", op, lpx_dtype_name(dt));
    int ndim = lpx_tensor_ndim(q);
    const int64_t *shape = lpx_tensor_shape(q);
    lpx_device dev = lpx_tensor_device(q);
    lpx_tensor *y;
    if ((st = cu_new(c, dt, ndim, shape, dev, &y))) return st;
    if ((st = cu_use(op, dev))) {
        lpx_tensor_release(y);
        return st;
    }
    DeqArgs a;
    memset(&a, 0, sizeof a);
    a.q = (const uint8_t *)lpx_tensor_data(q);
    cu_geom_of(&a.qg, q);
    a.qcontig = cu_geom_contiguous(&a.qg);
    a.n = lpx_tensor_numel(q);
    a.qdt = lpx_tensor_dtype(q);
    a.dt = dt;
    a.omax = f8_out_max(dt);
    a.y = lpx_tensor_data(y);
    if (si_host) {
        double v = 0;
        if ((st = lpx_item(si, 0, &v))) {
            lpx_tensor_release(y);
            return st;
        }
        a.smode = 0;
        a.sval = (float)v;
    } else {
        a.sp = lpx_tensor_data(si);
        a.sdt = lpx_tensor_dtype(si);
        a.sesz = cu_esize(a.sdt);
        if (lpx_tensor_numel(si) == 1) a.smode = 1;
        else {
            a.smode = 2;
            cu_geom_broadcast(&a.sg, si, ndim, shape);
        }
    }
    int out = dt == LPX_F32 ? 0 : dt == LPX_BF16 ? 1 : dt == LPX_F16 ? 2 : 3;
    if (!a.qcontig || a.smode == 2) out = 3;
    int cpv = out == 0 ? 4 : 8; /* codes per 16-byte output vector */
    a.nvec = out < 3 && ((uintptr_t)a.q % cpv) == 0 ? a.n / cpv : 0;
    int di = dev.index;
    cudaStream_t stream = cu_stream(di);
    int64_t want = ((out < 3 ? (a.nvec + 3) / 4 + a.n % cpv : a.n) + 255) / 256;
    switch (out) {
    case 0: k_deq<0><<<grid_for<k_deq<0>>(di, want), 256, 0, stream>>>(a); break;
    case 1: k_deq<1><<<grid_for<k_deq<1>>(di, want), 256, 0, stream>>>(a); break;
    case 2: k_deq<2><<<grid_for<k_deq<2>>(di, want), 256, 0, stream>>>(a); break;
    default: k_deq<3><<<grid_for<k_deq<3>>(di, want), 256, 0, stream>>>(a); break;
    }
    if ((st = cu_launched(op, "k_deq"))) {
        lpx_tensor_release(y);
        return st;
    }
    cu_ret(c, y);
    return LPX_OK;
}

/* ---- fp8_scale_from_amax --------------------------------------------- */

struct SfaArgs {
    const char *amax;
    lpx_dtype adt;
    int aesz, contig;
    cu_geom g;
    int64_t n;
    float *s, *si;
    double fp8_max, scale_max;
    bool pow2;
};

__global__ void __launch_bounds__(256) k_scale_from_amax(SfaArgs a)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = cu_dec(a.adt, a.amax + (a.contig ? i : cu_offset(a.g, i)) * a.aesz);
        uint32_t ab = __float_as_uint(v) & 0x7FFFFFFFu;
        if (ab >= F32_INF) {
            a.s[i] = a.si[i] = __int_as_float(0x7FC00000);
            continue;
        }
        f8_dynamic_scale(fabs((double)v), a.fp8_max, a.pow2, a.scale_max, &a.s[i], &a.si[i]);
    }
}

lpx_status k_fp8_scale_from_amax(lpx_call *c)
{
    /* the contract is the dispatcher's (spec family `fp8_scale_from_amax`);
     * a non-finite amax poisons its scale (the CPU refuses it: a check
     * that reads data) */
    const lpx_fp8_scale_from_amax_args *args = (const lpx_fp8_scale_from_amax_args *)lpx_op_args_of(c);
    lpx_tensor *am = args->amax;
    lpx_dtype fp8 = args->fp8;
    bool pow2 = args->pow2;
    double smax = args->scale_max;
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_builtin_dtype(c, "amax", am))) return st;
    lpx_device dev = lpx_tensor_device(am);
    lpx_tensor *s = NULL, *si = NULL;
    int nd = lpx_tensor_ndim(am);
    const int64_t *shape = lpx_tensor_shape(am);
    if ((st = cu_new(c, LPX_F32, nd, shape, dev, &s)) || (st = cu_new(c, LPX_F32, nd, shape, dev, &si)) ||
        (st = cu_use(op, dev)))
        goto fail;
    {
        SfaArgs a;
        memset(&a, 0, sizeof a);
        a.amax = (const char *)lpx_tensor_data(am);
        a.adt = lpx_tensor_dtype(am);
        a.aesz = cu_esize(a.adt);
        cu_geom_of(&a.g, am);
        a.contig = cu_geom_contiguous(&a.g);
        a.n = lpx_tensor_numel(am);
        a.s = (float *)lpx_tensor_data(s);
        a.si = (float *)lpx_tensor_data(si);
        a.fp8_max = lpx_dtype_get(fp8)->max;
        a.scale_max = smax;
        a.pow2 = pow2;
        if (a.n > 0) {
            k_scale_from_amax<<<cu_blocks(dev.index, a.n, 256), 256, 0, cu_stream(dev.index)>>>(a);
            if ((st = cu_launched(op, "k_scale_from_amax"))) goto fail;
        }
    }
    cu_ret(c, s);
    cu_ret(c, si);
    return LPX_OK;
fail:
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    return st;
}

} // namespace

lpx_status cu_f8_register_dequantize(const lpx_host *h)
{
    lpx_status st;
    if ((st = cu_reg(h, LPX_OP_fp8_dequantize, k_fp8_dequantize))) return st;
    return cu_reg(h, LPX_OP_fp8_scale_from_amax, k_fp8_scale_from_amax);
}
