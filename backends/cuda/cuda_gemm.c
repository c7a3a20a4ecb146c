/* CUDA GEMMs through cuBLASLt: matmul, linear, addmm (f32, f16, bf16),
 * fp8_scaled_mm (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3; tensorwise or
 * rowwise scales) and nf4_mm (W dequantized in tiles of rows into a bf16/
 * f16/f32 buffer by cu_nf4_dequantize_into, then the same GEMM; an
 * untransposed W accumulates its tiles in f32). Semantics are those of the CPU kernels (backends/cpu/
 * linalg.c, float8.c, nf4.c).
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
 * applies scales and bias in the CPU's order.
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
#include <cublasLt.h>
#include <uthash.h>
#include "cuda_gemm.h"
#include "cuda_nf4.h"

#define GM_WORKSPACE ((size_t)32 << 20)
#define GM_CACHE_MAX 512
#define GM_NF4_TILE ((int64_t)1 << 24) /* elements of W dequantized at once */

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120900
#define GM_HAVE_OUTER_VEC 1
#else
#define GM_HAVE_OUTER_VEC 0
#endif

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

/* ---- the problem, in lpx's row-major terms ----------------------------- */

enum { GM_SCALE_NONE = 0, GM_SCALE_SCALAR = 1, GM_SCALE_OUTER = 2 };

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
} gm_problem;

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

static bool gm_hp(lpx_dtype d) { return d == LPX_F32 || d == LPX_F16 || d == LPX_BF16; }

static size_t gm_es(lpx_dtype d) { return (size_t)lpx_dtype_get(d)->bits / 8; }

/* Can cuBLASLt read the [R, C] operand (element (r, c) at r*rs + c*cs) in
 * place? "row": unit column stride, rows rs >= C apart; "col": unit row
 * stride, columns cs >= R apart. Size-1 dims have no meaningful stride.
 * When both work, prefer_col decides. */
static bool gm_orient(int64_t R, int64_t C, int64_t rs, int64_t cs, bool prefer_col, bool *col, int64_t *ld)
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
    int32_t bias, bias_type, scale_mode;
    int32_t align_a, align_b, align_c, align_d, align_bias, align_scale;
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
 * (gm_orient), every dimension >= 1. LPX_ENOTIMPL when cuBLASLt has no
 * kernel for it. */
static lpx_status gm_run(const char *op, const gm_problem *p)
{
    bool bcol, acol;
    int64_t ldb_, lda_;
    if (!gm_orient(p->K, p->N, p->b_rs, p->b_cs, true, &bcol, &ldb_) ||
        !gm_orient(p->M, p->K, p->a_rs, p->a_cs, false, &acol, &lda_))
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
    k.align_a = gm_align(p->b, p->batch, p->b_bs * (int64_t)gm_es(p->b_dt));
    k.align_b = gm_align(p->a, p->batch, p->a_bs * (int64_t)gm_es(p->ab_dt));
    k.align_c = gm_align(cptr, p->batch, k.sc * (int64_t)gm_es(p->d_dt));
    k.align_d = gm_align(p->d, p->batch, p->d_bs * (int64_t)gm_es(p->d_dt));
    k.align_bias = p->bias ? gm_align(p->bias, 1, 0) : 0;
    k.align_scale = p->scale_mode == GM_SCALE_OUTER ? gm_align(p->a_scale, 1, 0) | gm_align(p->b_scale, 1, 0) << 16 : 0;
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

/* ---- helpers of the ops --------------------------------------------------- */

/* Stream-ordered device scratch owned by one call (freed with gm_scratch_free). */
typedef struct gm_scratch {
    int dev;
    int n;
    void *p[6];
    size_t bytes[6];
} gm_scratch;

static void *gm_scratch_get(gm_scratch *s, size_t bytes)
{
    if (s->n == (int)(sizeof s->p / sizeof *s->p)) return NULL;
    void *p = cu_scratch_alloc(s->dev, bytes ? bytes : 1);
    if (!p) return NULL;
    s->p[s->n] = p;
    s->bytes[s->n++] = bytes ? bytes : 1;
    return p;
}

static void gm_scratch_free(gm_scratch *s)
{
    for (int i = 0; i < s->n; i++) cu_scratch_free(s->dev, s->p[i], s->bytes[i]);
    s->n = 0;
}

/* New contiguous tensor of `shape` and dtype dt holding x (broadcast,
 * converted once). */
static lpx_status gm_copy_as(lpx_call *c, const lpx_tensor *x, lpx_dtype dt, int ndim, const int64_t *shape,
                             lpx_tensor **out)
{
    lpx_status st = cu_new(c, dt, ndim, shape, lpx_tensor_device(x), out);
    if (st) return st;
    if ((st = cu_copy_convert(c, *out, x, false))) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* The leading dims of t (all but the last) as one run of rows with a
 * single stride, if its strides allow (the CPU's collapse_rows). */
static bool gm_collapse_rows(const lpx_tensor *t, int64_t *rs)
{
    int nd = lpx_tensor_ndim(t);
    const int64_t *sh = lpx_tensor_shape(t), *str = lpx_tensor_strides(t);
    bool have = false;
    int64_t s = 0, span = 1;
    for (int d = nd - 2; d >= 0; d--) {
        if (sh[d] == 1) continue;
        if (!have) {
            s = str[d];
            span = sh[d];
            have = true;
        } else {
            if (str[d] != s * span) return false;
            span *= sh[d];
        }
    }
    *rs = s;
    return true;
}

/* A float operand as the GEMM reads it: t itself, or a contiguous copy in
 * dtype `want` when t has another dtype or a layout cuBLASLt cannot read.
 * rows/cols: its matrix shape; batched: the first dim is a batch dim (3-D)
 * and rows are the last-but-one dim; otherwise all leading dims collapse
 * into rows. `prefer_col` as in gm_orient. */
typedef struct gm_operand {
    lpx_tensor *own;   /* the copy, if one was made */
    const void *p;
    int64_t rs, cs, bs;
} gm_operand;

static lpx_status gm_operand_of(lpx_call *c, lpx_tensor *t, lpx_dtype want, bool batched, int64_t rows, int64_t cols,
                                bool prefer_col, gm_operand *o)
{
    memset(o, 0, sizeof *o);
    int nd = lpx_tensor_ndim(t);
    const int64_t *str = lpx_tensor_strides(t);
    bool ok = lpx_tensor_dtype(t) == want;
    if (ok) {
        o->cs = str[nd - 1];
        if (batched) {
            o->rs = str[nd - 2];
            o->bs = nd == 3 ? str[0] : 0;
        } else {
            ok = gm_collapse_rows(t, &o->rs);
        }
    }
    bool col;
    int64_t ld;
    if (ok && gm_orient(rows, cols, o->rs, o->cs, prefer_col, &col, &ld)) {
        o->p = lpx_tensor_data(t);
        return LPX_OK;
    }
    lpx_status st = gm_copy_as(c, t, want, nd, lpx_tensor_shape(t), &o->own);
    if (st) return st;
    o->p = lpx_tensor_data(o->own);
    o->cs = 1;
    o->rs = cols;
    o->bs = batched && nd == 3 ? rows * cols : 0;
    return LPX_OK;
}

static void gm_operand_release(gm_operand *o)
{
    lpx_tensor_release(o->own);
    o->own = NULL;
}

static lpx_status gm_check_float_same(const lpx_call *c, const char *an, const lpx_tensor *a, const char *bn,
                                      const lpx_tensor *b)
{
    lpx_status st;
    if ((st = cu_check_float(c, bn, b))) return st;
    return cu_check_same_device(c, an, a, bn, b);
}

/* Zero-fills n elements of dtype dt at p (0 bits are +0 in every float
 * dtype). */
static lpx_status gm_zero(const char *op, int dev, void *p, size_t bytes)
{
    if (!bytes) return LPX_OK;
    CU_CHECK(op, cudaMemsetAsync(p, 0, bytes, cu_stream(dev)));
    return LPX_OK;
}

/* K = 0 with an addend or a bias: the GEMM runs with K = 1 over zero
 * operands, so D = beta * C (+ bias) exactly as cuBLASLt writes it. */
static lpx_status gm_zero_k(gm_problem *p, gm_scratch *s, const char *op)
{
    int64_t n = p->M > p->N ? p->M : p->N;
    size_t bytes = (size_t)n * gm_es(p->ab_dt);
    void *z = gm_scratch_get(s, bytes);
    if (!z) return lpx_error(LPX_ENOMEM, "%s: cannot allocate %zu bytes of device scratch", op, bytes);
    lpx_status st = gm_zero(op, p->dev, z, bytes);
    if (st) return st;
    p->K = 1;
    p->a = p->b = z;
    p->a_rs = p->a_cs = p->b_rs = p->b_cs = 1;
    p->a_bs = p->b_bs = 0;
    p->b_dt = p->ab_dt;
    return LPX_OK;
}

/* ---- matmul ---------------------------------------------------------------- */

static lpx_status k_matmul(lpx_call *c)
{
    lpx_tensor *a = cu_arg_tensor(c, 0), *b = cu_arg_tensor(c, 1), *out = cu_arg_tensor(c, 2);
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_check_float(c, "a", a)) || (st = gm_check_float_same(c, "a", a, "b", b))) return st;
    int and_ = lpx_tensor_ndim(a), bnd = lpx_tensor_ndim(b);
    const int64_t *ash = lpx_tensor_shape(a), *bsh = lpx_tensor_shape(b);
    char sa[128], sb[128];
    lpx_tensor_shape_str(a, sa, sizeof sa);
    lpx_tensor_shape_str(b, sb, sizeof sb);
    if (and_ < 2 || bnd < 2 || bnd > 3 || (bnd == 3 && and_ > 3))
        return lpx_error(LPX_ESHAPE,
                         "matmul: a %s and b %s: expected a [..., M, K] with b [K, N], or a [B, M, K] / [M, K] "
                         "with b [B, K, N]", sa, sb);
    int64_t K = ash[and_ - 1], Kb = bsh[bnd - 2], N = bsh[bnd - 1];
    if (K != Kb)
        return lpx_error(LPX_ESHAPE, "matmul: a %s and b %s: K mismatch (%lld vs %lld)", sa, sb, (long long)K,
                         (long long)Kb);
    int64_t oshape[LPX_MAX_DIMS], M, batch, Ba = 1, Bb = 1;
    int ond;
    bool batched = bnd == 3;
    if (!batched) {
        batch = 1;
        M = 1;
        for (int d = 0; d < and_ - 1; d++) M *= ash[d];
        ond = and_;
        memcpy(oshape, ash, (size_t)(and_ - 1) * sizeof *oshape);
        oshape[ond - 1] = N;
    } else {
        Ba = and_ == 3 ? ash[0] : 1;
        Bb = bsh[0];
        if (Ba != Bb && Ba != 1 && Bb != 1)
            return lpx_error(LPX_ESHAPE, "matmul: a %s and b %s: batch mismatch (%lld vs %lld)", sa, sb,
                             (long long)Ba, (long long)Bb);
        batch = Ba == 1 ? Bb : Ba;
        M = ash[and_ - 2];
        ond = 3;
        oshape[0] = batch;
        oshape[1] = M;
        oshape[2] = N;
    }
    lpx_dtype T = lpx_tensor_dtype(a) == lpx_tensor_dtype(b) && gm_hp(lpx_tensor_dtype(a)) ? lpx_tensor_dtype(a)
                                                                                          : LPX_F32;
    lpx_dtype R = lpx_tensor_dtype(a);
    lpx_device dev = lpx_tensor_device(a);
    bool direct = false;
    if (out) {
        if ((st = cu_check_dense(c, "out", out)) || (st = cu_check_same_device(c, "a", a, "out", out))) return st;
        if (lpx_tensor_is_readonly(out))
            return lpx_error(LPX_EINVAL, "%s: out is read-only (e.g. a read-only DLPack import)", op);
        bool same = lpx_tensor_ndim(out) == ond;
        for (int i = 0; same && i < ond; i++) same = lpx_tensor_shape(out)[i] == oshape[i];
        if (!same) {
            char so[128];
            return lpx_error(LPX_ESHAPE, "%s: out has shape %s, the result of a %s @ b %s differs", op,
                             lpx_tensor_shape_str(out, so, sizeof so), sa, sb);
        }
        if (lpx_tensor_dtype(out) != R)
            return lpx_error(LPX_EDTYPE, "%s: out has dtype %s, the result is %s", op,
                             lpx_dtype_name(lpx_tensor_dtype(out)), lpx_dtype_name(R));
        direct = R == T && lpx_tensor_is_contiguous(out) && !lpx_tensor_shares_storage(out, a) &&
                 !lpx_tensor_shares_storage(out, b);
    }
    if ((st = cu_use(op, dev))) return st;
    /* the result (and D, when it can take cuBLASLt's output) */
    lpx_tensor *res = NULL, *dt = NULL;
    if (!out && (st = cu_new(c, R, ond, oshape, dev, &res))) return st;
    if (direct) dt = out;
    else if (!out && R == T) dt = res;
    else if ((st = cu_new(c, T, ond, oshape, dev, &dt))) goto done_early;
    if (batch == 0 || M == 0 || N == 0) goto empty;
    if (K == 0) {
        if ((st = gm_zero(op, dev.index, lpx_tensor_data(dt), (size_t)(batch * M * N) * gm_es(T)))) goto done_early;
        goto finish;
    }
    {
        gm_operand oa, ob;
        if ((st = gm_operand_of(c, a, T, batched, M, K, false, &oa))) goto done_early;
        if ((st = gm_operand_of(c, b, T, batched, K, N, true, &ob))) {
            gm_operand_release(&oa);
            goto done_early;
        }
        if (batched && and_ < 3) oa.bs = 0;
        gm_problem p;
        memset(&p, 0, sizeof p);
        p.dev = dev.index;
        p.M = M;
        p.N = N;
        p.K = K;
        p.ab_dt = p.b_dt = p.d_dt = T;
        p.a_rs = oa.rs;
        p.a_cs = oa.cs;
        p.b_rs = ob.rs;
        p.b_cs = ob.cs;
        p.ldd = N;
        p.alpha = 1.0f;
        size_t es = gm_es(T);
        /* strided batches when both operands have their own (a zero batch
         * stride, e.g. from expand, goes through the loop too) */
        if (batch == 1 || (Ba == Bb && oa.bs != 0 && ob.bs != 0)) {
            p.batch = batch;
            p.a = oa.p;
            p.b = ob.p;
            p.a_bs = oa.bs;
            p.b_bs = ob.bs;
            p.d = lpx_tensor_data(dt);
            p.d_bs = M * N;
            st = gm_run(op, &p);
        } else {
            /* one operand shared by the batch: one GEMM per batch */
            p.batch = 1;
            for (int64_t i = 0; i < batch && !st; i++) {
                p.a = (const char *)oa.p + (size_t)(Ba == 1 ? 0 : i * oa.bs) * es;
                p.b = (const char *)ob.p + (size_t)(Bb == 1 ? 0 : i * ob.bs) * es;
                /* (a negative batch stride never comes from lpx views) */
                p.d = (char *)lpx_tensor_data(dt) + (size_t)(i * M * N) * es;
                st = gm_run(op, &p);
            }
        }
        gm_operand_release(&oa);
        gm_operand_release(&ob);
        if (st) goto done_early;
    }
finish:
    if (dt != res && dt != out) {
        /* into the result dtype / the caller's out (which may alias a or b) */
        st = cu_copy_convert(c, out ? out : res, dt, false);
        lpx_tensor_release(dt);
        dt = NULL;
        if (st) goto done_early;
    }
empty:
    if (dt != res && dt != out) lpx_tensor_release(dt);
    if (out) {
        lpx_tensor_retain(out);
        cu_ret(c, out);
    } else {
        cu_ret(c, res);
    }
    return LPX_OK;
done_early:
    if (dt && dt != res && dt != out) lpx_tensor_release(dt);
    lpx_tensor_release(res);
    return st;
}

/* ---- linear, addmm ------------------------------------------------------------ */

/* A [n] vector of dtype dt with unit stride, as the bias pointer: t itself
 * or a converted copy (own). */
static lpx_status gm_vector(lpx_call *c, lpx_tensor *t, lpx_dtype dt, int64_t n, lpx_tensor **own, const void **p)
{
    *own = NULL;
    int nd = lpx_tensor_ndim(t);
    if (lpx_tensor_dtype(t) == dt && (n <= 1 || lpx_tensor_strides(t)[nd - 1] == 1)) {
        *p = lpx_tensor_data(t);
        return LPX_OK;
    }
    lpx_status st = gm_copy_as(c, t, dt, 1, &n, own);
    if (st) return st;
    *p = lpx_tensor_data(*own);
    return LPX_OK;
}

/* Shared tail of linear and addmm: runs p (D = a new [.., N] tensor in
 * dtype T, then converted to R if they differ) and returns the result. */
static lpx_status gm_finish_2d(lpx_call *c, gm_problem *p, lpx_dtype R, int ond, const int64_t *oshape)
{
    const char *op = cu_op(c);
    lpx_device dev = lpx_cuda_device(p->dev);
    lpx_tensor *res = NULL, *dt = NULL;
    gm_scratch s = {.dev = p->dev};
    lpx_status st = cu_new(c, R, ond, oshape, dev, &res);
    if (st) return st;
    if (p->d_dt != R && (st = cu_new(c, p->d_dt, ond, oshape, dev, &dt))) goto done;
    if (p->M == 0 || p->N == 0) goto done;
    p->d = lpx_tensor_data(dt ? dt : res);
    p->ldd = p->N;
    if (p->K == 0) {
        if (!p->c && !p->bias) {
            st = gm_zero(op, p->dev, p->d, (size_t)(p->M * p->N) * gm_es(p->d_dt));
            goto convert;
        }
        if ((st = gm_zero_k(p, &s, op))) goto done;
    }
    if ((st = gm_run(op, p))) goto done;
convert:
    if (!st && dt) st = cu_copy_convert(c, res, dt, false);
done:
    gm_scratch_free(&s);
    lpx_tensor_release(dt);
    if (st) {
        lpx_tensor_release(res);
        return st;
    }
    cu_ret(c, res);
    return LPX_OK;
}

static lpx_status k_linear(lpx_call *c)
{
    lpx_tensor *x = cu_arg_tensor(c, 0), *w = cu_arg_tensor(c, 1), *bias = cu_arg_tensor(c, 2);
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_check_float(c, "x", x)) || (st = gm_check_float_same(c, "x", x, "w", w))) return st;
    if (bias && (st = gm_check_float_same(c, "x", x, "bias", bias))) return st;
    char sx[128], sw[128];
    lpx_tensor_shape_str(x, sx, sizeof sx);
    lpx_tensor_shape_str(w, sw, sizeof sw);
    int xnd = lpx_tensor_ndim(x);
    if (xnd < 1 || lpx_tensor_ndim(w) != 2)
        return lpx_error(LPX_ESHAPE, "linear: x %s and w %s: expected x [..., in] and w [out, in]", sx, sw);
    const int64_t *xs = lpx_tensor_shape(x), *wsh = lpx_tensor_shape(w);
    int64_t in = xs[xnd - 1], nout = wsh[0];
    if (wsh[1] != in)
        return lpx_error(LPX_ESHAPE, "linear: x %s and w %s: in_features mismatch (%lld vs %lld)", sx, sw,
                         (long long)in, (long long)wsh[1]);
    if (bias && (lpx_tensor_ndim(bias) != 1 || lpx_tensor_shape(bias)[0] != nout)) {
        char sbias[128];
        return lpx_error(LPX_ESHAPE, "linear: bias %s does not match out_features %lld of w %s",
                         lpx_tensor_shape_str(bias, sbias, sizeof sbias), (long long)nout, sw);
    }
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(op, dev))) return st;
    lpx_dtype R = lpx_tensor_dtype(x);
    lpx_dtype T = R == lpx_tensor_dtype(w) && gm_hp(R) ? R : LPX_F32;
    int64_t M = 1;
    for (int d = 0; d < xnd - 1; d++) M *= xs[d];
    int64_t oshape[LPX_MAX_DIMS];
    memcpy(oshape, xs, (size_t)(xnd - 1) * sizeof *oshape);
    oshape[xnd - 1] = nout;
    gm_operand ox = {0}, ow = {0};
    lpx_tensor *wt = NULL, *bown = NULL;
    gm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = dev.index;
    p.M = M;
    p.N = nout;
    p.K = in;
    p.batch = 1;
    p.ab_dt = p.b_dt = p.d_dt = T;
    p.alpha = 1.0f;
    if (M > 0 && nout > 0 && in > 0) {
        /* b = w^T [in, out]: w's strides swapped (a transposed view) */
        if ((st = gm_operand_of(c, x, T, false, M, in, false, &ox))) goto done;
        if ((st = lpx_t(w, &wt))) goto done;
        if ((st = gm_operand_of(c, wt, T, false, in, nout, true, &ow))) goto done;
        p.a = ox.p;
        p.a_rs = ox.rs;
        p.a_cs = ox.cs;
        p.b = ow.p;
        p.b_rs = ow.rs;
        p.b_cs = ow.cs;
    }
    if (bias && M > 0 && nout > 0) {
        if ((st = gm_vector(c, bias, T, nout, &bown, &p.bias))) goto done;
        p.bias_dt = T;
    }
    st = gm_finish_2d(c, &p, R, xnd, oshape);
done:
    gm_operand_release(&ox);
    gm_operand_release(&ow);
    lpx_tensor_release(wt);
    lpx_tensor_release(bown);
    return st;
}

static lpx_status k_addmm(lpx_call *c)
{
    lpx_tensor *ct = cu_arg_tensor(c, 0), *a = cu_arg_tensor(c, 1), *b = cu_arg_tensor(c, 2);
    double beta = c->args[3].u.f, alpha = c->args[4].u.f;
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_check_float(c, "c", ct)) || (st = gm_check_float_same(c, "c", ct, "a", a)) ||
        (st = gm_check_float_same(c, "c", ct, "b", b)))
        return st;
    char sa[128], sb[128], sc[128];
    lpx_tensor_shape_str(a, sa, sizeof sa);
    lpx_tensor_shape_str(b, sb, sizeof sb);
    lpx_tensor_shape_str(ct, sc, sizeof sc);
    if (lpx_tensor_ndim(a) != 2 || lpx_tensor_ndim(b) != 2)
        return lpx_error(LPX_ESHAPE, "addmm: a %s and b %s: expected 2-D matrices", sa, sb);
    int64_t M = lpx_tensor_shape(a)[0], K = lpx_tensor_shape(a)[1], N = lpx_tensor_shape(b)[1];
    if (lpx_tensor_shape(b)[0] != K)
        return lpx_error(LPX_ESHAPE, "addmm: a %s and b %s: K mismatch (%lld vs %lld)", sa, sb, (long long)K,
                         (long long)lpx_tensor_shape(b)[0]);
    int cnd = lpx_tensor_ndim(ct);
    const int64_t *cs = lpx_tensor_shape(ct);
    bool bc = cnd <= 2;
    int64_t mn[2] = {M, N};
    for (int i = 0; bc && i < cnd; i++) {
        int64_t d = cs[i], want = mn[2 - cnd + i];
        bc = d == want || d == 1;
    }
    if (!bc)
        return lpx_error(LPX_ESHAPE, "addmm: c %s does not broadcast to the product's shape [%lld, %lld]", sc,
                         (long long)M, (long long)N);
    lpx_device dev = lpx_tensor_device(a);
    if ((st = cu_use(op, dev))) return st;
    lpx_dtype R = lpx_tensor_dtype(a);
    lpx_dtype T = R == lpx_tensor_dtype(b) && gm_hp(R) ? R : LPX_F32;
    gm_operand oa = {0}, ob = {0};
    lpx_tensor *cown = NULL;
    gm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = dev.index;
    p.M = M;
    p.N = N;
    p.K = K;
    p.batch = 1;
    p.ab_dt = p.b_dt = p.d_dt = T;
    p.alpha = (float)alpha;
    if (M > 0 && N > 0 && K > 0) {
        if ((st = gm_operand_of(c, a, T, true, M, K, false, &oa)) || (st = gm_operand_of(c, b, T, true, K, N, true, &ob)))
            goto done;
        p.a = oa.p;
        p.a_rs = oa.rs;
        p.a_cs = oa.cs;
        p.b = ob.p;
        p.b_rs = ob.rs;
        p.b_cs = ob.cs;
    }
    if (beta != 0.0 && M > 0 && N > 0) {
        const int64_t *cst = lpx_tensor_strides(ct);
        bool row_vec = cnd >= 1 && cs[cnd - 1] == N && lpx_tensor_numel(ct) == N;
        if ((float)beta == 1.0f && row_vec) {
            /* c is one row broadcast down: cuBLASLt's bias vector */
            if ((st = gm_vector(c, ct, T, N, &cown, &p.bias))) goto done;
            p.bias_dt = T;
        } else {
            bool full = cnd == 2 && cs[0] == M && cs[1] == N && lpx_tensor_dtype(ct) == T &&
                        (N <= 1 || cst[1] == 1) && (M <= 1 || cst[0] == N);
            if (full) {
                p.c = lpx_tensor_data(ct);
            } else {
                if ((st = gm_copy_as(c, ct, T, 2, mn, &cown))) goto done;
                p.c = lpx_tensor_data(cown);
            }
            p.ldc = N;
            p.beta = (float)beta;
        }
    }
    st = gm_finish_2d(c, &p, R, 2, mn);
done:
    gm_operand_release(&oa);
    gm_operand_release(&ob);
    lpx_tensor_release(cown);
    return st;
}

/* ---- fp8_scaled_mm ---------------------------------------------------------- */

static bool gm_is_fp8(lpx_dtype d) { return d == LPX_F8E4M3FN || d == LPX_F8E5M2; }

static int64_t gm_round16(int64_t v) { return (v + 15) / 16 * 16; }

/* A scale_inv: numel 1 (tensorwise) or n values in the given orientation
 * ([n, 1] for rows, [1, n] for columns); *per tells which, *stride is the
 * element stride between the n values. */
static lpx_status gm_scale_arg(const lpx_call *c, const char *arg, const lpx_tensor *s, const lpx_tensor *a,
                               int64_t n, bool rows, bool *per, int64_t *stride)
{
    lpx_status st = cu_check_float(c, arg, s);
    if (st || (st = cu_check_same_device(c, "a", a, arg, s))) return st;
    *stride = 0;
    if (lpx_tensor_numel(s) == 1) {
        *per = false;
        return LPX_OK;
    }
    const int64_t *sh = lpx_tensor_shape(s);
    bool ok = lpx_tensor_ndim(s) == 2 && (rows ? sh[0] == n && sh[1] == 1 : sh[0] == 1 && sh[1] == n);
    if (!ok) {
        char ss[160];
        return lpx_error(LPX_ESHAPE, "%s: %s has shape %s; expected numel 1 (tensorwise) or [%s%lld%s]", cu_op(c),
                         arg, lpx_tensor_shape_str(s, ss, sizeof ss), rows ? "" : "1, ", (long long)n,
                         rows ? ", 1" : "");
    }
    *per = true;
    *stride = lpx_tensor_strides(s)[rows ? 0 : 1];
    return LPX_OK;
}

/* The fp8 operand layout the CPU accepts: row-major or column-major. */
static lpx_status gm_fp8_layout(const lpx_call *c, const char *arg, const lpx_tensor *t)
{
    const int64_t *sh = lpx_tensor_shape(t), *str = lpx_tensor_strides(t);
    int64_t R = sh[0], C = sh[1], s0 = str[0], s1 = str[1];
    bool row = (C <= 1 || s1 == 1) && (R <= 1 || s0 >= C);
    bool col = (R <= 1 || s0 == 1) && (C <= 1 || s1 >= R);
    if (row || col) return LPX_OK;
    char s[160];
    return lpx_error(LPX_ESHAPE,
                     "%s: %s of shape %s has strides (%lld, %lld); the GEMM takes row-major (stride[1] == 1) or "
                     "column-major (stride[0] == 1) operands: make it contiguous first",
                     cu_op(c), arg, lpx_tensor_shape_str(t, s, sizeof s), (long long)s0, (long long)s1);
}

static lpx_status k_fp8_scaled_mm(lpx_call *c)
{
    lpx_tensor *a = cu_arg_tensor(c, 0), *as = cu_arg_tensor(c, 1), *b = cu_arg_tensor(c, 2);
    lpx_tensor *bs = cu_arg_tensor(c, 3), *bias = cu_arg_tensor(c, 4);
    lpx_dtype odt = c->args[5].u.d;
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_check_dense(c, "a", a)) || (st = cu_check_dense(c, "b", b)) ||
        (st = cu_check_same_device(c, "a", a, "b", b)))
        return st;
    lpx_dtype adt = lpx_tensor_dtype(a), bdt = lpx_tensor_dtype(b);
    if (!gm_is_fp8(adt) || !gm_is_fp8(bdt))
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; expected f8e4m3fn or f8e5m2", op, !gm_is_fp8(adt) ? "a" : "b",
                         lpx_dtype_name(!gm_is_fp8(adt) ? adt : bdt));
    if (adt == LPX_F8E5M2 && bdt == LPX_F8E5M2)
        return lpx_error(LPX_EDTYPE, "%s: a and b are both f8e5m2; e5m2 x e5m2 GEMMs are refused (cuBLASLt has no "
                                     "such kernel): quantize one operand as f8e4m3fn", op);
    char sa[160], sb[160];
    lpx_tensor_shape_str(a, sa, sizeof sa);
    lpx_tensor_shape_str(b, sb, sizeof sb);
    if (lpx_tensor_ndim(a) != 2 || lpx_tensor_ndim(b) != 2)
        return lpx_error(LPX_ESHAPE, "%s: a %s and b %s must be 2-D matrices [M, K] and [K, N]", op, sa, sb);
    int64_t M = lpx_tensor_shape(a)[0], K = lpx_tensor_shape(a)[1], N = lpx_tensor_shape(b)[1];
    if (lpx_tensor_shape(b)[0] != K)
        return lpx_error(LPX_ESHAPE, "%s: a %s and b %s: K mismatch (%lld vs %lld)", op, sa, sb, (long long)K,
                         (long long)lpx_tensor_shape(b)[0]);
    if (odt != LPX_F32 && odt != LPX_BF16 && odt != LPX_F16)
        return lpx_error(LPX_EDTYPE, "%s: out_dtype %s; the scaled GEMM writes f32, bf16 or f16", op,
                         lpx_dtype_name(odt));
    if (bias) {
        if ((st = gm_check_float_same(c, "a", a, "bias", bias))) return st;
        if (lpx_tensor_ndim(bias) != 1 || lpx_tensor_shape(bias)[0] != N) {
            char s[160];
            return lpx_error(LPX_ESHAPE, "%s: bias %s must be [N] = [%lld]", op,
                             lpx_tensor_shape_str(bias, s, sizeof s), (long long)N);
        }
    }
    if ((st = gm_fp8_layout(c, "a", a)) || (st = gm_fp8_layout(c, "b", b))) return st;
    bool a_per, b_per;
    int64_t a_ss, b_ss;
    if ((st = gm_scale_arg(c, "a_scale_inv", as, a, M, true, &a_per, &a_ss)) ||
        (st = gm_scale_arg(c, "b_scale_inv", bs, a, N, false, &b_per, &b_ss)))
        return st;
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
        void *buf = gm_scratch_get(&s, (size_t)(M * Kp));
        if (!buf) goto nomem;
        if ((st = cu_gemm_pack8(op, di, ap, M, K, ast[0], ast[1], buf, M, Kp))) goto done;
        pa = buf;
        lda = Kp;
    }
    if (!b_ok) {
        void *buf = gm_scratch_get(&s, (size_t)(Np * Kp));
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

    /* scales: device f32 (tensorwise f32 tensors are used in place) */
    const float *sa_v = NULL, *sb_v = NULL;
    bool per = a_per || b_per;
    if (!per && lpx_tensor_dtype(as) == LPX_F32) sa_v = lpx_tensor_data(as);
    if (!per && lpx_tensor_dtype(bs) == LPX_F32) sb_v = lpx_tensor_data(bs);
    if (!sa_v) {
        int64_t n = per ? M : 1;
        float *v = gm_scratch_get(&s, (size_t)n * sizeof(float));
        if (!v) goto nomem;
        if ((st = cu_gemm_gather_f32(op, di, lpx_tensor_data(as), lpx_tensor_dtype(as), a_ss, a_per, n, v, n)))
            goto done;
        sa_v = v;
    }
    if (!sb_v) {
        int64_t n = per ? N : 1, np = per ? Np : 1;
        float *v = gm_scratch_get(&s, (size_t)np * sizeof(float));
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
            } else if (!(p.d = gm_scratch_get(&s, (size_t)(M * Np) * sizeof(float)))) {
                goto nomem;
            }
        } else {
            p.d_dt = odt;
            if (Np == N) p.d = lpx_tensor_data(out);
            else if (!(p.d = gm_scratch_get(&s, (size_t)(M * Np) * gm_es(odt)))) goto nomem;
        }
        p.ldd = Np;
        st = gm_run(op, &p);
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
            size_t es = gm_es(odt);
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
    gm_scratch_free(&s);
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    cu_ret(c, out);
    return LPX_OK;
}

/* ---- nf4_mm ----------------------------------------------------------------- */

/* The payload of an NF4 op (args first..first+5: codes, qscalers, factors,
 * mean, block, scaler_block), checked like the CPU's payload_arg, since
 * cu_nf4_dequantize_into trusts its caller. */
typedef struct gm_nf4 {
    const uint8_t *codes;
    const int8_t *qs;
    const float *f, *mean;
    int64_t block, sblock, padded;
} gm_nf4;

static lpx_status gm_nf4_vec(const lpx_call *c, const char *arg, const lpx_tensor *t, lpx_dtype dt,
                             const lpx_tensor *x)
{
    lpx_status st = cu_check_dense(c, arg, t);
    if (st || (st = cu_check_same_device(c, "x", x, arg, t))) return st;
    if (lpx_tensor_dtype(t) != dt)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s, expected %s", cu_op(c), arg,
                         lpx_dtype_name(lpx_tensor_dtype(t)), lpx_dtype_name(dt));
    if (lpx_tensor_ndim(t) != 1 || !lpx_tensor_is_contiguous(t)) {
        char sh[128];
        return lpx_error(LPX_ESHAPE, "%s: %s %s must be a contiguous 1-D tensor", cu_op(c), arg,
                         lpx_tensor_shape_str(t, sh, sizeof sh));
    }
    return LPX_OK;
}

static lpx_status gm_nf4_payload(const lpx_call *c, int first, const lpx_tensor *x, gm_nf4 *p)
{
    const char *op = cu_op(c);
    const lpx_tensor *codes = cu_arg_tensor(c, first), *qs = cu_arg_tensor(c, first + 1),
                     *f = cu_arg_tensor(c, first + 2), *mean = cu_arg_tensor(c, first + 3);
    int64_t block = c->args[first + 4].u.i, sblock = c->args[first + 5].u.i;
    if (block < LPX_NF4_BLOCK_MIN || block > LPX_NF4_BLOCK_MAX || block % 2)
        return lpx_error(LPX_EINVAL, "%s: block = %lld must be even and in %d..%d", op, (long long)block,
                         LPX_NF4_BLOCK_MIN, LPX_NF4_BLOCK_MAX);
    if (sblock < 1 || sblock > LPX_NF4_SCALER_BLOCK_MAX)
        return lpx_error(LPX_EINVAL, "%s: scaler_block = %lld must be in 1..%d", op, (long long)sblock,
                         LPX_NF4_SCALER_BLOCK_MAX);
    lpx_status st;
    if ((st = gm_nf4_vec(c, "codes", codes, LPX_U8, x)) || (st = gm_nf4_vec(c, "qscalers", qs, LPX_I8, x)) ||
        (st = gm_nf4_vec(c, "factors", f, LPX_F32, x)) || (st = gm_nf4_vec(c, "mean", mean, LPX_F32, x)))
        return st;
    int64_t padded = lpx_tensor_numel(codes) * 2, unit = block * sblock;
    if (lpx_tensor_numel(mean) != 1)
        return lpx_error(LPX_ESHAPE, "%s: mean has %lld elements, expected 1", op, (long long)lpx_tensor_numel(mean));
    if (padded % unit)
        return lpx_error(LPX_ESHAPE, "%s: codes cover %lld elements, not a whole number of scaler blocks of "
                         "%lld x %lld", op, (long long)padded, (long long)block, (long long)sblock);
    if (lpx_tensor_numel(qs) != padded / block || lpx_tensor_numel(f) != padded / unit)
        return lpx_error(LPX_ESHAPE, "%s: %lld codes need %lld qscalers and %lld factors, got %lld and %lld", op,
                         (long long)padded, (long long)(padded / block), (long long)(padded / unit),
                         (long long)lpx_tensor_numel(qs), (long long)lpx_tensor_numel(f));
    p->codes = lpx_tensor_data(codes);
    p->qs = lpx_tensor_data(qs);
    p->f = lpx_tensor_data(f);
    p->mean = lpx_tensor_data(mean);
    p->block = block;
    p->sblock = sblock;
    p->padded = padded;
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
    int64_t padded = pl.padded;
    if (rows < 0 || cols < 0 || (cols && rows > padded / cols))
        return lpx_error(LPX_ESHAPE, "%s: W [%lld, %lld] needs more elements than the %lld the payload holds", op,
                         (long long)rows, (long long)cols, (long long)padded);
    int64_t K = tw ? cols : rows, N = tw ? rows : cols;
    int xnd = lpx_tensor_ndim(x);
    const int64_t *xs = lpx_tensor_shape(x);
    char sx[128];
    if (xnd < 1 || xs[xnd - 1] != K)
        return lpx_error(LPX_ESHAPE, "%s: x %s must end in %lld (W is [%lld, %lld]%s)", op,
                         lpx_tensor_shape_str(x, sx, sizeof sx), (long long)K, (long long)rows, (long long)cols,
                         tw ? ", used transposed" : "");
    if (bias) {
        if ((st = gm_check_float_same(c, "x", x, "bias", bias))) return st;
        if (lpx_tensor_ndim(bias) != 1 || lpx_tensor_shape(bias)[0] != N) {
            char sb[128];
            return lpx_error(LPX_ESHAPE, "%s: bias %s must be [%lld]", op, lpx_tensor_shape_str(bias, sb, sizeof sb),
                             (long long)N);
        }
    }
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(op, dev))) return st;
    lpx_dtype R = lpx_tensor_dtype(x), T = gm_hp(R) ? R : LPX_F32;
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
    if ((st = gm_operand_of(c, x, T, false, M, K, false, &ox))) goto fail;
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
    if (bias && (st = gm_vector(c, bias, Ddt, N, &bown, &bptr))) goto fail;
    int64_t tshape[1] = {tile_rows * cols};
    if ((st = cu_new(c, T, 1, tshape, dev, &tile))) goto fail;
    size_t tes = gm_es(T), des = gm_es(Ddt);
    for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
        int64_t n = rows - r0 < tile_rows ? rows - r0 : tile_rows;
        /* rows [r0, r0 + n) of W, queued before the GEMM that reads them
         * (one stream: the next tile's dequantization waits for it) */
        if ((st = cu_nf4_dequantize_into(op, dev.index, pl.codes, pl.qs, pl.f, pl.mean, pl.block, pl.sblock,
                                         r0 * cols, n * cols, T, lpx_tensor_data(tile))))
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
        if ((st = gm_run(op, &p))) goto fail;
    }
convert:
    if (dt && (st = cu_copy_convert(c, res, dt, false))) goto fail;
ok:
    gm_operand_release(&ox);
    lpx_tensor_release(dt);
    lpx_tensor_release(tile);
    lpx_tensor_release(bown);
    cu_ret(c, res);
    return LPX_OK;
fail:
    gm_operand_release(&ox);
    lpx_tensor_release(dt);
    lpx_tensor_release(tile);
    lpx_tensor_release(bown);
    lpx_tensor_release(res);
    return st;
}

lpx_status cu_register_gemm(const lpx_host *h)
{
    lpx_status st;
    if ((st = cu_reg(h, LPX_OP_matmul, k_matmul)) || (st = cu_reg(h, LPX_OP_linear, k_linear)) ||
        (st = cu_reg(h, LPX_OP_addmm, k_addmm)) || (st = cu_reg(h, LPX_OP_fp8_scaled_mm, k_fp8_scaled_mm)) ||
        (st = cu_reg(h, LPX_OP_nf4_mm, k_nf4_mm)))
        return st;
    return LPX_OK;
}
