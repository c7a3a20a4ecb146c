/* Helper kernels of the cuBLASLt GEMMs (see cuda_gemm.h): all are
 * memory-bound grid-stride loops. */
#include "cuda_dtype.cuh"
#include "cuda_gemm.h"

#define GU_THREADS 256

__global__ void gu_pack8(const uint8_t *src, int64_t R, int64_t C, int64_t rs, int64_t cs, uint8_t *dst, int64_t Rp,
                         int64_t Cp)
{
    int64_t total = Rp * Cp;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / Cp, k = e - r * Cp;
        dst[e] = r < R && k < C ? src[r * rs + k * cs] : (uint8_t)0;
    }
}

__global__ void gu_gather(const void *src, int dt, int64_t stride, bool per, int64_t n, float *dst, int64_t np)
{
    int es = cu_esize((lpx_dtype)dt);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < np; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = i < n ? cu_dec((lpx_dtype)dt, (const char *)src + (per ? i * stride : 0) * es) : 0.0f;
}

__global__ void gu_gather2d(const void *src, int dt, int64_t R, int64_t C, int64_t rs, int64_t cs, float *dst,
                            int64_t Rp, int64_t Cp)
{
    int es = cu_esize((lpx_dtype)dt);
    int64_t total = Rp * Cp;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / Cp, k = e - r * Cp;
        dst[e] = r < R && k < C ? cu_dec((lpx_dtype)dt, (const char *)src + (r * rs + k * cs) * es) : 0.0f;
    }
}

__global__ void gu_epilogue(const float *acc, int64_t lda, int64_t M, int64_t N, const float *sa, bool a_per,
                            const float *sb, bool b_per, const void *bias, int bias_dt, int64_t bias_stride, void *out,
                            int out_dt, int64_t ldo)
{
    int bes = cu_esize((lpx_dtype)bias_dt), oes = cu_esize((lpx_dtype)out_dt);
    int64_t total = M * N;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = e / N, n = e - m * N;
        float v = acc ? acc[m * lda + n] : 0.0f;
        if (sa && sb) v *= sa[a_per ? m : 0] * sb[b_per ? n : 0];
        if (bias) v += cu_dec((lpx_dtype)bias_dt, (const char *)bias + n * bias_stride * bes);
        cu_enc((lpx_dtype)out_dt, (char *)out + (m * ldo + n) * oes, v, 0);
    }
}

extern "C" lpx_status cu_gemm_pack8(const char *op, int dev, const void *src, int64_t R, int64_t C, int64_t rs,
                                    int64_t cs, void *dst, int64_t Rp, int64_t Cp)
{
    if (Rp * Cp == 0) return LPX_OK;
    gu_pack8<<<cu_blocks(dev, Rp * Cp, GU_THREADS), GU_THREADS, 0, cu_stream(dev)>>>(
        (const uint8_t *)src, R, C, rs, cs, (uint8_t *)dst, Rp, Cp);
    return cu_launched(op, "gu_pack8");
}

extern "C" lpx_status cu_gemm_gather_f32(const char *op, int dev, const void *src, lpx_dtype dt, int64_t stride,
                                         bool per, int64_t n, float *dst, int64_t np)
{
    if (np == 0) return LPX_OK;
    gu_gather<<<cu_blocks(dev, np, GU_THREADS), GU_THREADS, 0, cu_stream(dev)>>>(src, (int)dt, stride, per, n, dst,
                                                                                 np);
    return cu_launched(op, "gu_gather");
}

extern "C" lpx_status cu_gemm_gather2d_f32(const char *op, int dev, const void *src, lpx_dtype dt, int64_t R,
                                           int64_t C, int64_t rs, int64_t cs, float *dst, int64_t Rp, int64_t Cp)
{
    if (Rp * Cp == 0) return LPX_OK;
    gu_gather2d<<<cu_blocks(dev, Rp * Cp, GU_THREADS), GU_THREADS, 0, cu_stream(dev)>>>(src, (int)dt, R, C, rs, cs,
                                                                                      dst, Rp, Cp);
    return cu_launched(op, "gu_gather2d");
}

extern "C" lpx_status cu_gemm_epilogue(const char *op, int dev, const float *acc, int64_t lda, int64_t M, int64_t N,
                                       const float *sa, bool a_per, const float *sb, bool b_per, const void *bias,
                                       lpx_dtype bias_dt, int64_t bias_stride, void *out, lpx_dtype out_dt,
                                       int64_t ldo)
{
    if (M * N == 0) return LPX_OK;
    gu_epilogue<<<cu_blocks(dev, M * N, GU_THREADS), GU_THREADS, 0, cu_stream(dev)>>>(
        acc, lda, M, N, sa, a_per, sb, b_per, bias, (int)bias_dt, bias_stride, out, (int)out_dt, ldo);
    return cu_launched(op, "gu_epilogue");
}
