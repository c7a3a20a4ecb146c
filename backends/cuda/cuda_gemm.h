/* Helper kernels of the cuBLASLt GEMMs (cuda_gemm_util.cu, used by
 * cuda_gemm_fp8.c and cuda_gemm_nf4.c): operand packing for the fp8 GEMMs, scale vectors and the
 * epilogue cuBLASLt cannot do. Each queues one kernel on the stream of
 * device `dev` and names `op` if the launch fails. Valid C11 and CUDA C++. */
#ifndef LPX_CUDA_GEMM_H
#define LPX_CUDA_GEMM_H

#include "cuda_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Byte matrix copy with zero padding: dst[r * Cp + k] = src[r * rs + k * cs]
 * for r < R, k < C (strides in bytes = elements of one byte), 0 for the
 * rest of the Rp x Cp destination (Rp >= R, Cp >= C). Packs fp8 operands
 * into the K-major, 16-aligned layout the fp8 GEMMs need. */
lpx_status cu_gemm_pack8(const char *op, int dev, const void *src, int64_t R, int64_t C, int64_t rs, int64_t cs,
                         void *dst, int64_t Rp, int64_t Cp);

/* dst[i] = decode(src[per ? i * stride : 0]) for i < n, 0 for n <= i < np:
 * a scale (or bias) vector of any float dtype as np f32 values. */
lpx_status cu_gemm_gather_f32(const char *op, int dev, const void *src, lpx_dtype dt, int64_t stride, bool per,
                              int64_t n, float *dst, int64_t np);

/* dst[r * Cp + k] = decode(src[r * rs + k * cs]) (element strides) for
 * r < R, k < C, 0 for the rest of Rp x Cp: a scale grid of any float dtype
 * and layout as the f32 matrix a block-scaled GEMM reads. */
lpx_status cu_gemm_gather2d_f32(const char *op, int dev, const void *src, lpx_dtype dt, int64_t R, int64_t C,
                                int64_t rs, int64_t cs, float *dst, int64_t Rp, int64_t Cp);

/* out[m * ldo + n] = encode(v) for m < M, n < N, with
 *   v = acc ? acc[m * lda + n] : 0
 *   v *= sa[a_per ? m : 0] * sb[b_per ? n : 0]      (when sa and sb)
 *   v += decode(bias[n * bias_stride])              (when bias)
 * (the order of the CPU's fp8_scaled_mm epilogue). out may be acc itself
 * (same ld, out_dt f32): each element is read before it is written. */
lpx_status cu_gemm_epilogue(const char *op, int dev, const float *acc, int64_t lda, int64_t M, int64_t N,
                            const float *sa, bool a_per, const float *sb, bool b_per, const void *bias,
                            lpx_dtype bias_dt, int64_t bias_stride, void *out, lpx_dtype out_dt, int64_t ldo);

#ifdef __cplusplus
}
#endif

#endif
