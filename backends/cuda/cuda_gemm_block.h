/* fp8_mm_block through cuBLASLt's block scaling (cuda_gemm_block.c), for
 * the op's kernel in cuda_fp8_block.cu: it tries this first and runs its
 * reference kernel when the call is not taken. Valid C11 and CUDA C++. */
#ifndef LPX_CUDA_GEMM_BLOCK_H
#define LPX_CUDA_GEMM_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "lpx/lpx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y [M, N] (contiguous, odt) = a [M, K] @ b [K, N], fp8 operands read
 * through element strides, each with its scale_inv grid: a's [ceil(M /
 * a_block_rows), ceil(K / k_block)], b's [ceil(K / k_block), ceil(N /
 * b_block_cols)], read through their strides and dtypes. */
typedef struct cu_block_mm {
    int dev;
    int64_t M, N, K, k_block, a_block_rows, b_block_cols;
    const void *a;
    int64_t a_rs, a_cs;
    lpx_dtype adt;
    const void *b;
    int64_t b_rs, b_cs;
    lpx_dtype bdt;
    const void *as;
    int64_t as_rs, as_cs;
    lpx_dtype as_dt;
    const void *bs;
    int64_t bs_rs, bs_cs;
    lpx_dtype bs_dt;
    const void *bias;    /* not taken here: the reference adds it */
    void *y;
    lpx_dtype odt;
} cu_block_mm;

/* Runs x through cuBLASLt when its blocks fit (K blocks of 128; a's rows
 * in blocks of 1 or 128, b's columns likewise, not both 128; no bias; M
 * (resp. N) a multiple of 4 for 1-row (1-column) blocks) and the
 * combination passed its one-time self-check on this device: *ran true.
 * Otherwise LPX_OK with *ran false (run the reference). Errors: a failed
 * launch or allocation (LPX_EDEVICE, LPX_ENOMEM). */
lpx_status cu_gemm_fp8_block(const char *op, const cu_block_mm *x, bool *ran);
/* The blockwise GEMM path of this process in words; returns how many
 * (device, block kinds, output dtype) combinations run on cuBLASLt. */
int cu_gemm_fp8_block_describe(char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
