/* The engine of the cuBLASLt GEMM group: the cublasLt handle, the plan
 * cache, the per-device workspace, cuBLAS error mapping and cu_gemm_run,
 * which the op files (cuda_gemm_dense.c: matmul, linear, addmm;
 * cuda_gemm_fp8.c: fp8_scaled_mm; cuda_gemm_nf4.c: nf4_mm) call with a
 * gm_problem (cuda_gemm_internal.h); also per-call device scratch and the
 * group's registration (cu_register_gemm). Split from the former
 * cuda_gemm.c so that the ops and the cuBLASLt machinery each have their
 * own file. Semantics are those of the CPU kernels (backends/cpu/linalg.c,
 * float8.c, nf4.c).
 *
 * Layout mapping. lpx matrices are row-major views with arbitrary
 * strides; cuBLASLt is column-major. We compute D^T = B^T A^T: for
 * D = A @ B with A [M, K], B [K, N], D [M, N] row-major (rows ldd apart),
 * D^T is the column-major [N, M] matrix with ld = ldd, so cuBLASLt gets
 *   m = N, n = M, k = K, its "A" = lpx b, its "B" = lpx a,
 *   cuBLASLt A: b with a unit row stride (b is a transposed view, e.g. the
 *               w^T of linear) is column-major [K, N]: TRANSA = T, ld = b's
 *               column stride; b row-major: TRANSA = N, ld = b's row stride;
 *   cuBLASLt B: a row-major: TRANSB = N, ld = a's row stride; a with a unit
 *               row stride: TRANSB = T, ld = a's column stride.
 * So the common x @ w^T (x row-major, w [N, K] contiguous) is cuBLASLt's
 * "TN", the layout its fp8 kernels require; nothing is copied for views
 * cuBLASLt can read (transposes included). Other layouts (gaps in both
 * directions, non-collapsible batch dims) and mixed dtypes are copied
 * once to a contiguous tensor (cu_copy_convert). A bias [N] is cuBLASLt's
 * bias vector (one per row of D^T, CUBLASLT_EPILOGUE_BIAS); addmm's c is
 * its C matrix with beta.
 *
 * Numerics: compute type CUBLAS_COMPUTE_32F for every dtype (f32
 * accumulation, never TF32), alpha/beta f32, one rounding to the result
 * dtype. Mixed float dtypes (or fp8 operands of matmul) compute in f32
 * like the CPU and are rounded once to the result dtype.
 *
 * Plans (matmul descriptor, four layouts, heuristic's algorithm) are
 * cached per (device, shape, dtypes, transposes, lds, batch, epilogue,
 * scale mode, pointer alignments) in a hash table; one cublasLt handle
 * per process; one 32 MiB workspace per device from the stream-ordered
 * pool. Everything runs on the device's stream; a mutex serializes plan
 * lookup, the per-call attributes and the enqueue. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include "cuda_gemm_internal.h"

#define GM_WORKSPACE ((size_t)32 << 20)
#define GM_CACHE_MAX 512

/* ---- errors ------------------------------------------------------------ */

/* LPX_EDEVICE (LPX_ENOMEM for CUBLAS_STATUS_ALLOC_FAILED, LPX_ENOTIMPL for
 * CUBLAS_STATUS_NOT_SUPPORTED) naming the call and the cuBLAS status. */
static lpx_status cu_blas_fail(cublasStatus_t s, const char *op, const char *call)
{
    lpx_status code = s == CUBLAS_STATUS_ALLOC_FAILED    ? LPX_ENOMEM
                      : s == CUBLAS_STATUS_NOT_SUPPORTED ? LPX_ENOTIMPL
                                                         : LPX_EDEVICE;
    return lpx_error(code, "%s: %s failed: %s (%s)", op, call, cublasLtGetStatusName(s), cublasLtGetStatusString(s));
}

#define BL_TRY(call)                                                \
    do {                                                            \
        cublasStatus_t bl_s_ = (call);                              \
        if (bl_s_ != CUBLAS_STATUS_SUCCESS) {                       \
            st = cu_blas_fail(bl_s_, op, #call);                    \
            goto fail;                                              \
        }                                                           \
    } while (0)

static bool gm_cuda_type(lpx_dtype d, cudaDataType_t *t)
{
    switch (d) {
    case LPX_F32: *t = CUDA_R_32F; return true;
    case LPX_F16: *t = CUDA_R_16F; return true;
    case LPX_BF16: *t = CUDA_R_16BF; return true;
    case LPX_F8E4M3FN: *t = CUDA_R_8F_E4M3; return true;
    case LPX_F8E5M2: *t = CUDA_R_8F_E5M2; return true;
    default: return false;
    }
}

/* Can cuBLASLt read the [R, C] operand (element (r, c) at r*rs + c*cs) in
 * place? "row": unit column stride, rows rs >= C apart; "col": unit row
 * stride, columns cs >= R apart. Size-1 dims have no meaningful stride.
 * When both work, prefer_col decides. */
bool cu_gemm_orient(int64_t R, int64_t C, int64_t rs, int64_t cs, bool prefer_col, bool *col, int64_t *ld)
{
    bool row_ok = (C <= 1 || cs == 1) && (R <= 1 || rs >= C);
    bool col_ok = (R <= 1 || rs == 1) && (C <= 1 || cs >= R);
    if (col_ok && (prefer_col || !row_ok)) {
        *col = true;
        *ld = C <= 1 ? (R > 1 ? R : 1) : cs;
        return true;
    }
    if (row_ok) {
        *col = false;
        *ld = R <= 1 ? (C > 1 ? C : 1) : rs;
        return true;
    }
    return false;
}

/* Largest power of two <= 256 dividing the address and (for batches) the
 * byte stride between batches: the alignment cuBLASLt may assume. */
static int32_t gm_align(const void *p, int64_t batch, int64_t stride_bytes)
{
    uintptr_t v = (uintptr_t)p | (uintptr_t)256;
    if (batch > 1) v |= (uintptr_t)stride_bytes;
    return (int32_t)(v & (~v + 1));
}

/* ---- plan cache ---------------------------------------------------------- */

typedef struct gm_key {
    int64_t m, n, k;              /* cuBLASLt's: m = N, n = M */
    int64_t lda, ldb, ldc, ldd;   /* cuBLASLt's A = lpx b, B = lpx a */
    int64_t batch, sa, sb, sc, sd;
    int32_t dev, atype, btype, ctype, dtype, opa, opb;
    int32_t bias, bias_type, scale_mode, fast_accum;
    int32_t align_a, align_b, align_c, align_d, align_bias, align_scale;
    int32_t a_block, b_block;     /* GM_SCALE_BLOCK: cuBLASLt A's (lpx b's) and B's (lpx a's) GM_BLOCK_* */
} gm_key;

typedef struct gm_plan {
    gm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
    UT_hash_handle hh;
} gm_plan;

static pthread_mutex_t gm_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t gm_handle;
static gm_plan *gm_plans;
static void *gm_ws[CU_MAX_DEVICES];

static void gm_plan_free(gm_plan *p)
{
    if (!p) return;
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    free(p);
}

static void gm_plans_clear(void)
{
    gm_plan *p, *tmp;
    HASH_ITER(hh, gm_plans, p, tmp) {
        HASH_DEL(gm_plans, p);
        gm_plan_free(p);
    }
}

/* A layout (type, rows x cols column-major, ld; batched when batch > 1). */
static lpx_status gm_layout(const char *op, const char *which, cublasLtMatrixLayout_t *l, int32_t type, int64_t rows,
                            int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    char call[96];
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, (cudaDataType_t)type, (uint64_t)rows, (uint64_t)cols, ld);
    if (s != CUBLAS_STATUS_SUCCESS) {
        *l = NULL;
        snprintf(call, sizeof call, "cublasLtMatrixLayoutCreate(%s)", which);
        return cu_blas_fail(s, op, call);
    }
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof stride);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(call, sizeof call, "cublasLtMatrixLayoutSetAttribute(%s, batch)", which);
            return cu_blas_fail(s, op, call);
        }
    }
    return LPX_OK;
}

/* Per-call pointers of the descriptor (bias, scales). */
static lpx_status gm_set_pointers(const char *op, cublasLtMatmulDesc_t desc, const gm_problem *p)
{
    lpx_status st = LPX_OK;
    if (p->bias) BL_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias,
                                                        sizeof p->bias));
    if (p->scale_mode != GM_SCALE_NONE) {
        /* cuBLASLt's A is lpx b, its B is lpx a */
        BL_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p->b_scale,
                                              sizeof p->b_scale));
        BL_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p->a_scale,
                                              sizeof p->a_scale));
    }
fail:
    return st;
}

/* Builds the plan of key k (the problem supplies the pointers whose
 * alignment the heuristic looks at). Called with gm_lock held. */
static lpx_status gm_plan_make(const char *op, const gm_key *k, const gm_problem *p, gm_plan **out)
{
    lpx_status st = LPX_OK;
    cublasLtMatmulPreference_t pref = NULL;
    gm_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return lpx_error(LPX_ENOMEM, "%s: cannot allocate a GEMM plan", op);
    pl->key = *k;
    BL_TRY(cublasLtMatmulDescCreate(&pl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = (cublasOperation_t)k->opa, tb = (cublasOperation_t)k->opb;
    BL_TRY(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BL_TRY(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (k->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = k->bias_type;
        BL_TRY(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        BL_TRY(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    /* fp8 without cuBLASLt's periodic promotion of partial sums to f32 */
    if (k->fast_accum) {
        int8_t fa = 1;
        BL_TRY(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
    }
#if GM_HAVE_OUTER_VEC
    if (k->scale_mode == GM_SCALE_OUTER) {
        /* a runtime library older than the header refuses the attribute:
         * "no kernel" too */
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublasStatus_t ms = cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                                           sizeof mode);
        if (ms == CUBLAS_STATUS_SUCCESS)
            ms = cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
        if (ms != CUBLAS_STATUS_SUCCESS) {
            cu_blas_fail(ms, op, "cublasLtMatmulDescSetAttribute(A/B_SCALE_MODE = OUTER_VEC_32F)");
            st = LPX_ENOTIMPL;
            goto fail;
        }
    }
    if (k->scale_mode == GM_SCALE_BLOCK) {
        /* Hopper's block-scaled fp8 (cuBLASLt 12.9+): A (= lpx b) and B
         * (= lpx a) each VEC128 or BLK128x128; a library or GPU without
         * them refuses the attribute or finds no kernel: "no kernel" */
        int32_t ma = k->a_block == GM_BLOCK_BLK128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                    : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        int32_t mb = k->b_block == GM_BLOCK_BLK128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                    : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        cublasStatus_t ms = cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
        if (ms == CUBLAS_STATUS_SUCCESS)
            ms = cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
        if (ms != CUBLAS_STATUS_SUCCESS) {
            cu_blas_fail(ms, op, "cublasLtMatmulDescSetAttribute(A/B_SCALE_MODE = VEC128/BLK128x128)");
            st = LPX_ENOTIMPL;
            goto fail;
        }
    }
#else
    if (k->scale_mode == GM_SCALE_BLOCK) {
        st = lpx_error(LPX_ENOTIMPL, "%s: lpx-cuda was built with cuBLASLt older than 12.9 (no block scaling)", op);
        goto fail;
    }
#endif
    if ((st = gm_set_pointers(op, pl->desc, p))) goto fail;
    /* cuBLASLt A = lpx b: op(A) is N x K; B = lpx a: op(B) is K x M */
    bool at = k->opa == CUBLAS_OP_T, bt = k->opb == CUBLAS_OP_T;
    if ((st = gm_layout(op, "A", &pl->la, k->atype, at ? k->k : k->m, at ? k->m : k->k, k->lda, k->batch, k->sa)) ||
        (st = gm_layout(op, "B", &pl->lb, k->btype, bt ? k->n : k->k, bt ? k->k : k->n, k->ldb, k->batch, k->sb)) ||
        (st = gm_layout(op, "C", &pl->lc, k->ctype, k->m, k->n, k->ldc, k->batch, k->sc)) ||
        (st = gm_layout(op, "D", &pl->ld, k->dtype, k->m, k->n, k->ldd, k->batch, k->sd)))
        goto fail;
    BL_TRY(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = GM_WORKSPACE;
    uint32_t al[4] = {(uint32_t)k->align_a, (uint32_t)k->align_b, (uint32_t)k->align_c, (uint32_t)k->align_d};
    BL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    BL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
    BL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
    BL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
    BL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof al[3]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    memset(&res, 0, sizeof res);
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(gm_handle, pl->desc, pl->la, pl->lb, pl->lc, pl->ld, pref, 1,
                                                       &res, &found);
    if (hs == CUBLAS_STATUS_SUCCESS && found < 1) hs = CUBLAS_STATUS_NOT_SUPPORTED;
    if (hs != CUBLAS_STATUS_SUCCESS) {
        /* whatever the status (NOT_SUPPORTED, or INVALID_VALUE for a
         * combination this library or GPU lacks): LPX_ENOTIMPL, "no kernel",
         * so a caller may take another route; the message names the status */
        cu_blas_fail(hs, op, "cublasLtMatmulAlgoGetHeuristic");
        st = LPX_ENOTIMPL;
        goto fail;
    }
    pl->algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    *out = pl;
    return LPX_OK;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    gm_plan_free(pl);
    return st;
}

/* Runs one (batched) GEMM. The operands must be readable in place
 * (cu_gemm_orient), every dimension >= 1. LPX_ENOTIMPL when cuBLASLt has no
 * kernel for it. */

lpx_status cu_gemm_run(const char *op, const gm_problem *p)
{
    bool bcol, acol;
    int64_t ldb_, lda_;
    if (!cu_gemm_orient(p->K, p->N, p->b_rs, p->b_cs, true, &bcol, &ldb_) ||
        !cu_gemm_orient(p->M, p->K, p->a_rs, p->a_cs, false, &acol, &lda_))
        return lpx_error(LPX_EINTERNAL, "%s: internal error: a GEMM operand layout cuBLASLt cannot read", op);
    if (p->M > INT32_MAX || p->N > INT32_MAX || p->K > INT32_MAX || p->batch > INT32_MAX)
        return lpx_error(LPX_ERANGE, "%s: M = %lld, N = %lld, K = %lld or batch %lld exceeds cuBLASLt's int range",
                         op, (long long)p->M, (long long)p->N, (long long)p->K, (long long)p->batch);
    cudaDataType_t at, bt, dt, biast = CUDA_R_32F;
    if (!gm_cuda_type(p->b_dt, &at) || !gm_cuda_type(p->ab_dt, &bt) || !gm_cuda_type(p->d_dt, &dt) ||
        (p->bias && !gm_cuda_type(p->bias_dt, &biast)))
        return lpx_error(LPX_EINTERNAL, "%s: internal error: a dtype cuBLASLt does not take", op);
    gm_key k;
    memset(&k, 0, sizeof k);
    k.m = p->N;
    k.n = p->M;
    k.k = p->K;
    k.lda = ldb_;
    k.ldb = lda_;
    const void *cptr = p->c ? p->c : p->d;
    k.ldc = p->c ? p->ldc : p->ldd;
    k.ldd = p->ldd;
    k.batch = p->batch;
    if (p->batch > 1) {
        k.sa = p->b_bs;
        k.sb = p->a_bs;
        k.sc = p->c ? p->c_bs : p->d_bs;
        k.sd = p->d_bs;
    }
    k.dev = p->dev;
    k.atype = (int32_t)at;
    k.btype = (int32_t)bt;
    k.ctype = k.dtype = (int32_t)dt;
    k.opa = bcol ? CUBLAS_OP_T : CUBLAS_OP_N;
    k.opb = acol ? CUBLAS_OP_T : CUBLAS_OP_N;
    k.bias = p->bias != NULL;
    k.bias_type = p->bias ? (int32_t)biast : 0;
    k.scale_mode = p->scale_mode;
    k.fast_accum = p->fast_accum && (p->ab_dt == LPX_F8E4M3FN || p->ab_dt == LPX_F8E5M2);
    k.align_a = gm_align(p->b, p->batch, p->b_bs * (int64_t)cu_gemm_es(p->b_dt));
    k.align_b = gm_align(p->a, p->batch, p->a_bs * (int64_t)cu_gemm_es(p->ab_dt));
    k.align_c = gm_align(cptr, p->batch, k.sc * (int64_t)cu_gemm_es(p->d_dt));
    k.align_d = gm_align(p->d, p->batch, p->d_bs * (int64_t)cu_gemm_es(p->d_dt));
    k.align_bias = p->bias ? gm_align(p->bias, 1, 0) : 0;
    k.align_scale = p->scale_mode == GM_SCALE_OUTER ? gm_align(p->a_scale, 1, 0) | gm_align(p->b_scale, 1, 0) << 16 : 0;
    if (p->scale_mode == GM_SCALE_BLOCK) {
        k.a_block = p->b_block;   /* cuBLASLt's A is lpx b */
        k.b_block = p->a_block;
    }
    float beta = p->c ? p->beta : 0.0f;
    cudaStream_t s = cu_stream(p->dev);
    lpx_status st = LPX_OK;
    pthread_mutex_lock(&gm_lock);
    if (!gm_handle) BL_TRY(cublasLtCreate(&gm_handle));
    if (!gm_ws[p->dev]) {
        gm_ws[p->dev] = cu_scratch_alloc(p->dev, GM_WORKSPACE);
        if (!gm_ws[p->dev]) {
            st = lpx_error(LPX_ENOMEM, "%s: cannot allocate the %zu MiB cuBLASLt workspace on cuda:%d", op,
                           GM_WORKSPACE >> 20, p->dev);
            goto fail;
        }
    }
    gm_plan *pl = NULL;
    HASH_FIND(hh, gm_plans, &k, sizeof k, pl);
    if (!pl) {
        if (HASH_COUNT(gm_plans) >= GM_CACHE_MAX) gm_plans_clear();
        if ((st = gm_plan_make(op, &k, p, &pl))) goto fail;
        HASH_ADD(hh, gm_plans, key, sizeof k, pl);
    } else if ((st = gm_set_pointers(op, pl->desc, p))) {
        goto fail;
    }
    BL_TRY(cublasLtMatmul(gm_handle, pl->desc, &p->alpha, p->b, pl->la, p->a, pl->lb, &beta, cptr, pl->lc, p->d,
                          pl->ld, &pl->algo, gm_ws[p->dev], GM_WORKSPACE, s));
fail:
    pthread_mutex_unlock(&gm_lock);
    return st;
}

void cu_gemm_shutdown(void)
{
    pthread_mutex_lock(&gm_lock);
    gm_plans_clear();
    for (int i = 0; i < CU_MAX_DEVICES; i++)
        if (gm_ws[i]) {
            cu_scratch_free(i, gm_ws[i], GM_WORKSPACE);
            gm_ws[i] = NULL;
        }
    if (gm_handle) cublasLtDestroy(gm_handle);
    gm_handle = NULL;
    pthread_mutex_unlock(&gm_lock);
}

/* ---- per-call device scratch ---------------------------------------------- */

void *cu_gemm_scratch_get(gm_scratch *s, size_t bytes)
{
    if (s->n == (int)(sizeof s->p / sizeof *s->p)) return NULL;
    void *p = cu_scratch_alloc(s->dev, bytes ? bytes : 1);
    if (!p) return NULL;
    s->p[s->n] = p;
    s->bytes[s->n++] = bytes ? bytes : 1;
    return p;
}

void cu_gemm_scratch_free(gm_scratch *s)
{
    for (int i = 0; i < s->n; i++) cu_scratch_free(s->dev, s->p[i], s->bytes[i]);
    s->n = 0;
}

lpx_status cu_register_gemm(const lpx_host *h)
{
    lpx_status st;
    if ((st = cu_gemm_register_dense(h)) || (st = cu_gemm_register_fp8(h)) || (st = cu_gemm_register_nf4(h)))
        return st;
    return LPX_OK;
}
