/* Internal interface of the cuBLASLt GEMM group (cuda_gemm_plan.c,
 * cuda_gemm_dense.c, cuda_gemm_fp8.c, cuda_gemm_nf4.c): the GEMM problem in
 * lpx's row-major terms, the engine that runs it through a cached cuBLASLt
 * plan (cu_gemm_run), per-call device scratch, and the float operand
 * helpers the dense ops share with nf4_mm. One header so that the ops file
 * by file describe their GEMMs the same way; the helper kernels are in
 * cuda_gemm.h (cuda_gemm_util.cu). Host C11 only (includes cublasLt.h). */
#ifndef LPX_CUDA_GEMM_INTERNAL_H
#define LPX_CUDA_GEMM_INTERNAL_H

#include <cublasLt.h>
#include "cuda_gemm.h"

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120900
#define GM_HAVE_OUTER_VEC 1
#else
#define GM_HAVE_OUTER_VEC 0
#endif

/* ---- the problem, in lpx's row-major terms ----------------------------- */

enum { GM_SCALE_NONE = 0, GM_SCALE_SCALAR = 1, GM_SCALE_OUTER = 2, GM_SCALE_BLOCK = 3 };
/* GM_SCALE_BLOCK: each operand's scales per 128 elements of K, one per row
 * of it (VEC128, cuBLASLt's 1 x 128) or one per 128 x 128 block (BLK128);
 * the scale buffers in cuBLASLt's layouts (cu_gemm_block_scales) */
enum { GM_BLOCK_VEC128 = 1, GM_BLOCK_BLK128 = 2 };

typedef struct gm_problem {
    int dev;
    int64_t M, N, K, batch;
    /* a [M, K]: element (m, k) of batch i at a + i*a_bs + m*a_rs + k*a_cs */
    const void *a;
    int64_t a_rs, a_cs, a_bs;
    /* b [K, N] likewise */
    const void *b;
    int64_t b_rs, b_cs, b_bs;
    lpx_dtype ab_dt, b_dt;   /* dtypes of a and b (equal except fp8 mixes) */
    /* d [M, N] row-major, rows ldd apart, batches d_bs apart */
    void *d;
    int64_t ldd, d_bs;
    lpx_dtype d_dt;          /* also C's */
    /* optional addend C (d's dtype, layout ldc/c_bs) with beta */
    const void *c;
    int64_t ldc, c_bs;
    float alpha, beta;
    /* optional bias [N] (contiguous, dtype bias_dt) */
    const void *bias;
    lpx_dtype bias_dt;
    /* fp8 scales: device f32 pointers (a side: 1 or M values, b side: 1 or
     * N values) */
    int scale_mode;
    const float *a_scale, *b_scale;
    bool fast_accum;         /* fp8: no periodic promotion of partial sums */
    int a_block, b_block;    /* GM_SCALE_BLOCK: GM_BLOCK_* of a and of b */
} gm_problem;

static inline bool cu_gemm_hp(lpx_dtype d) { return d == LPX_F32 || d == LPX_F16 || d == LPX_BF16; }

static inline size_t cu_gemm_es(lpx_dtype d) { return (size_t)lpx_dtype_get(d)->bits / 8; }

/* ---- cuda_gemm_plan.c ---------------------------------------------------- */

/* Can cuBLASLt read the [R, C] operand (element (r, c) at r*rs + c*cs) in
 * place? "row": unit column stride, rows rs >= C apart; "col": unit row
 * stride, columns cs >= R apart. Size-1 dims have no meaningful stride.
 * When both work, prefer_col decides. */
bool cu_gemm_orient(int64_t R, int64_t C, int64_t rs, int64_t cs, bool prefer_col, bool *col, int64_t *ld);

/* Runs one (batched) GEMM. The operands must be readable in place
 * (cu_gemm_orient), every dimension >= 1. LPX_ENOTIMPL when cuBLASLt has no
 * kernel for it. */
lpx_status cu_gemm_run(const char *op, const gm_problem *p);

/* Stream-ordered device scratch owned by one call (freed with cu_gemm_scratch_free). */
typedef struct gm_scratch {
    int dev;
    int n;
    void *p[8];          /* the block GEMM's self-check holds 7 */
    size_t bytes[8];
} gm_scratch;

void *cu_gemm_scratch_get(gm_scratch *s, size_t bytes);
void cu_gemm_scratch_free(gm_scratch *s);

/* ---- cuda_gemm_dense.c ----------------------------------------------------- */

/* A float operand as the GEMM reads it: t itself, or a contiguous copy in
 * dtype `want` when t has another dtype or a layout cuBLASLt cannot read.
 * rows/cols: its matrix shape; batched: the first dim is a batch dim (3-D)
 * and rows are the last-but-one dim; otherwise all leading dims collapse
 * into rows. `prefer_col` as in cu_gemm_orient. */
typedef struct gm_operand {
    lpx_tensor *own;   /* the copy, if one was made */
    const void *p;
    int64_t rs, cs, bs;
} gm_operand;

lpx_status cu_gemm_operand_of(lpx_call *c, lpx_tensor *t, lpx_dtype want, bool batched, int64_t rows,
                              int64_t cols, bool prefer_col, gm_operand *o);
void cu_gemm_operand_release(gm_operand *o);

/* A [n] vector of dtype dt with unit stride, as the bias pointer: t itself
 * or a converted copy (own). */
lpx_status cu_gemm_vector(lpx_call *c, lpx_tensor *t, lpx_dtype dt, int64_t n, lpx_tensor **own, const void **p);

/* ---- registration: one function per op file (cu_register_gemm, in
 * cuda_gemm_plan.c, calls them in this order) ------------------------------ */

lpx_status cu_gemm_register_dense(const lpx_host *h); /* matmul, linear, addmm */
lpx_status cu_gemm_register_fp8(const lpx_host *h);   /* fp8_scaled_mm */
lpx_status cu_gemm_register_nf4(const lpx_host *h);   /* nf4_mm */

#endif
