/* NF4 dequantization on raw device pointers, for the kernels of other
 * groups (the NF4 GEMM of cuda_gemm_nf4.c dequantizes a weight, or a band of
 * its rows, into a bf16 buffer and hands it to cuBLASLt). Valid C11 and
 * CUDA C++. */
#ifndef LPX_CUDA_NF4_H
#define LPX_CUDA_NF4_H

#include "cuda_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Queues on cu_stream(device) the dequantization of the logical elements
 * [start, start + count) of an NF4 payload into `out`: `count` contiguous
 * elements of `dtype` (LPX_F32, LPX_F16 or LPX_BF16) in device memory.
 * Same bits as the nf4_dequantize op (and the CPU kernel):
 *   out[i] = dtype(codebook[code(start + i)] * (qs[b] / factors[b / scaler_block] + mean[0])),
 *   b = (start + i) / block.
 * codes (u8, two codes per byte, first element in the high nibble),
 * qscalers (i8), factors (f32) and mean (f32 [1], read on the device) are
 * device pointers of one payload as ops_nf4.def describes it. The caller
 * has checked the payload (block even in 32..4096, 1 <= scaler_block,
 * sizes consistent, 0 <= start, start + count <= the padded element count)
 * and made `device` current (cu_use). Asynchronous: nothing waits for the
 * device. stream_out: write with evict-first stores, for a result not read
 * again soon (the nf4_dequantize op); false leaves the lines in L2 for a
 * kernel that reads them next (the GEMM's tiles). Errors: LPX_EINVAL
 * (dtype), LPX_EDEVICE (launch), naming `op`. */
lpx_status cu_nf4_dequantize_into(const char *op, int device, const uint8_t *codes, const int8_t *qscalers,
                                  const float *factors, const float *mean, int64_t block, int64_t scaler_block,
                                  int64_t start, int64_t count, lpx_dtype dtype, void *out, bool stream_out);

#ifdef __cplusplus
}
#endif

#endif
