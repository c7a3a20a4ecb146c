/* CPU linear algebra: matmul, linear, addmm, all through cblas_sgemm.
 *
 * Every op becomes one "GEMM job": C[b] = alpha * A[b] @ B[b] (+ beta *
 * addend) over a batch, where each operand is described by its strides.
 *
 * - An f32 operand whose 2-D layout BLAS can read (unit column stride, or a
 *   transposed contiguous view: unit row stride) is passed as is, with
 *   CblasTrans in the second case. Nothing is copied.
 * - Any other operand (bf16/f16/fp8, gaps BLAS cannot express, expanded
 *   dims) is converted to f32: B once per distinct matrix (once in all
 *   when it is shared by the batch), A in tiles of rows, so a large
 *   activation is never materialized in f32 at once. B keeps its
 *   orientation when converted (a transposed weight is decoded in its
 *   storage order and passed with CblasTrans), so the decode streams.
 * - C is written in place when the result is contiguous f32 and aliases no
 *   input; otherwise each tile goes through an f32 buffer and is stored
 *   (converted) into the result.
 *
 * Result dtype: a's dtype for matmul and addmm, x's for linear. a and b
 * may differ in (float) dtype; integer dtypes are refused. */
#include <limits.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "cpu_internal.h"

/* f32 elements per conversion tile of A (and of the C buffer) */
#define TILE_ELEMS ((int64_t)1 << 20)

/* One GEMM operand: batch count 1 or the job's batch, per-batch matrices of
 * rows x cols. `strided`: element (b, r, k) sits at b*bs + r*rs + k*cs from
 * the tensor's data pointer. Otherwise (A only) the rows are the tensor's
 * logical rows: element (b, r, k) is logical element (b*rows + r)*cols + k. */
typedef struct gmat {
    const lpx_tensor *t;
    int64_t rows, cols;
    bool bcast;          /* one matrix shared by every batch */
    bool strided;
    int64_t bs, rs, cs;
} gmat;

/* How BLAS reads an operand in place: whether it can, transposed or not, ld. */
typedef struct blas_layout {
    bool ok;
    CBLAS_TRANSPOSE trans;
    int ld;
} blas_layout;

typedef struct gemm_job {
    int64_t batch, M, N, K;
    gmat a, b;
    float alpha, beta;
    const lpx_tensor *addend;   /* broadcast to [M, N] (batch 1 only); NULL: none */
    lpx_tensor *out;            /* logical order [batch, M, N] */
    bool out_direct;            /* out is contiguous f32 and aliases no input */
} gemm_job;

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* Can BLAS read this f32 matrix in place? Row-major (unit column stride,
 * rows at least a row apart) or its transpose (unit row stride). */
static blas_layout layout_of(const gmat *m)
{
    blas_layout l = {false, CblasNoTrans, 0};
    if (m->t->dtype != LPX_F32 || !m->strided) return l;
    int64_t r = m->rows, k = m->cols;
    if ((k <= 1 || m->cs == 1) && (r <= 1 || m->rs >= k)) {
        int64_t ld = r <= 1 ? (k > 1 ? k : 1) : m->rs;
        if (ld < k) ld = k;
        if (ld < 1) ld = 1;
        if (fits_int(ld)) { l.ok = true; l.trans = CblasNoTrans; l.ld = (int)ld; }
    } else if ((r <= 1 || m->rs == 1) && (k <= 1 || m->cs >= r)) {
        int64_t ld = k <= 1 ? (r > 1 ? r : 1) : m->cs;
        if (ld < r) ld = r;
        if (ld < 1) ld = 1;
        if (fits_int(ld)) { l.ok = true; l.trans = CblasTrans; l.ld = (int)ld; }
    }
    return l;
}

/* A 2-D strided view into t's storage starting elem_off elements after
 * t's first element (for tile loads). */
static void view2d(cpu_view *v, const lpx_tensor *t, int64_t elem_off, int64_t rows, int64_t cols, int64_t rs,
                   int64_t cs)
{
    v->ndim = 2;
    v->dtype = t->dtype;
    v->elem_size = lpx_dtype_get(t->dtype)->bits / 8;
    v->base = (char *)lpx_tensor_data(t) + elem_off * v->elem_size;
    v->shape[0] = rows;
    v->shape[1] = cols;
    v->strides[0] = rs;
    v->strides[1] = cs;
    v->numel = rows * cols;
    v->contiguous = (cols <= 1 || cs == 1) && (rows <= 1 || rs == cols);
}

static const float *f32_at(const lpx_tensor *t, int64_t elem_off)
{
    return (const float *)lpx_tensor_data(t) + elem_off;
}

/* Loads rows [r0, r0+n) of batch b of m as contiguous f32 (n x cols). */
static void load_rows(const gmat *m, int64_t b, int64_t r0, int64_t n, float *dst)
{
    cpu_view v;
    if (m->strided) {
        view2d(&v, m->t, m->bcast ? 0 : b * m->bs, m->rows, m->cols, m->rs, m->cs);
        cpu_load_f32(&v, r0 * m->cols, n * m->cols, dst);
    } else {
        cpu_view_of(&v, m->t);
        cpu_load_f32(&v, ((m->bcast ? 0 : b) * m->rows + r0) * m->cols, n * m->cols, dst);
    }
}

/* Converts batch b of B (K x N, strided) to f32 in bbuf, keeping its
 * orientation: a unit row stride (transposed storage, e.g. a [out, in]
 * weight seen as [in, out]) is decoded as the N x K matrix it is in memory
 * and handed to BLAS transposed, so the decode reads memory in order. */
static blas_layout load_b(const gmat *m, int64_t b, float *bbuf)
{
    blas_layout l = {true, CblasNoTrans, 0};
    cpu_view v;
    int64_t off = m->bcast ? 0 : b * m->bs;
    if (m->rows > 1 && m->cols > 1 && m->rs == 1 && m->cs != 1) {
        view2d(&v, m->t, off, m->cols, m->rows, m->cs, m->rs);
        l.trans = CblasTrans;
        l.ld = (int)m->rows;
    } else {
        view2d(&v, m->t, off, m->rows, m->cols, m->rs, m->cs);
        l.ld = (int)(m->cols > 1 ? m->cols : 1);
    }
    cpu_load_f32(&v, 0, v.numel, bbuf);
    return l;
}

/* Prepares C rows [r0, r0+n): the addend when beta applies (BLAS scales
 * it), zeros when K = 0 (BLAS is not called then; beta * addend is done
 * here), otherwise left for BLAS to overwrite (beta 0). */
static void init_c(const gemm_job *j, int64_t r0, int64_t n, float *c)
{
    bool use_addend = j->addend && j->beta != 0.0f;
    if (!use_addend) {
        if (j->K == 0) memset(c, 0, (size_t)(n * j->N) * sizeof *c);
        return;
    }
    cpu_view v;
    int64_t shape[2] = {j->M, j->N};
    cpu_view_init(&v, j->addend, 2, shape);
    cpu_load_f32(&v, r0 * j->N, n * j->N, c);
    if (j->K == 0)
        for (int64_t i = 0; i < n * j->N; i++) c[i] *= j->beta;
}

static lpx_status run_gemm(const lpx_call *c, const gemm_job *j)
{
    const char *op = cpu_op_name(c);
    int64_t M = j->M, N = j->N, K = j->K;
    if (j->batch == 0 || M == 0 || N == 0) return LPX_OK;
    /* a limit of this backend's code (BLAS takes int sizes), not of the op */
    if (!fits_int(N) || !fits_int(K))
        return lpx_error(LPX_ERANGE, "%s: N = %lld or K = %lld exceeds the BLAS int range", op, (long long)N,
                         (long long)K);
    blas_layout la = layout_of(&j->a), lb = layout_of(&j->b);
    int64_t wide = K > N ? K : N;
    int64_t tile = TILE_ELEMS / wide;
    if (tile < 1) tile = 1;
    if (tile > INT_MAX) tile = INT_MAX;
    /* one sgemm per batch when neither A nor C needs a buffer */
    int64_t tm = la.ok && j->out_direct && M <= INT_MAX ? M : (tile < M ? tile : M);
    float *abuf = NULL, *bbuf = NULL, *cbuf = NULL;
    bool need_a = !la.ok && K > 0, need_b = !lb.ok && K > 0;
    if (need_a) abuf = lpx_malloc((size_t)(tm * K) * sizeof(float));
    if (need_b) bbuf = lpx_malloc((size_t)(K * N) * sizeof(float));
    if (!j->out_direct) cbuf = lpx_malloc((size_t)(tm * N) * sizeof(float));
    if ((need_a && !abuf) || (need_b && !bbuf) || (!j->out_direct && !cbuf)) {
        lpx_free(abuf);
        lpx_free(bbuf);
        lpx_free(cbuf);
        return lpx_error(LPX_ENOMEM, "%s: cannot allocate f32 conversion buffers (tiles of %lld x %lld)", op,
                         (long long)tm, (long long)wide);
    }
    cpu_view ov;
    cpu_view_of(&ov, j->out);
    float beta = j->addend ? j->beta : 0.0f;
    blas_layout bl = lb;
    const float *bp = NULL;
    for (int64_t b = 0; b < j->batch; b++) {
        if (lb.ok) {
            bp = f32_at(j->b.t, j->b.bcast ? 0 : b * j->b.bs);
        } else if (need_b && (b == 0 || !j->b.bcast)) {
            bl = load_b(&j->b, b, bbuf);   /* a shared B is converted once */
            bp = bbuf;
        }
        for (int64_t r0 = 0; r0 < M; r0 += tm) {
            int64_t n = M - r0 < tm ? M - r0 : tm;
            const float *ap = NULL;
            CBLAS_TRANSPOSE ta = CblasNoTrans;
            int lda = (int)(K > 1 ? K : 1);
            if (la.ok) {
                ap = f32_at(j->a.t, (j->a.bcast ? 0 : b * j->a.bs) + r0 * j->a.rs);
                ta = la.trans;
                lda = la.ld;
            } else if (need_a) {
                load_rows(&j->a, b, r0, n, abuf);
                ap = abuf;
            }
            float *cp = j->out_direct ? (float *)lpx_tensor_data(j->out) + (b * M + r0) * N : cbuf;
            init_c(j, r0, n, cp);
            if (K > 0)
                cblas_sgemm(CblasRowMajor, ta, bl.trans, (int)n, (int)N, (int)K, j->alpha, ap, lda, bp, bl.ld,
                            beta, cp, (int)N);
            if (!j->out_direct) cpu_store_f32(&ov, (b * M + r0) * N, n * N, cbuf, 0);
        }
    }
    lpx_free(abuf);
    lpx_free(bbuf);
    lpx_free(cbuf);
    return LPX_OK;
}

/* ---- job construction ------------------------------------------------ */

/* Describes the leading dims of t (all but the last) as one run of rows
 * with a single stride, if its strides allow (a contiguous or row-sliced
 * [..., M, K] does; some permuted views do not). */
static bool collapse_rows(const lpx_tensor *t, int64_t *rs)
{
    bool have = false;
    int64_t s = 0, span = 1;
    for (int d = t->ndim - 2; d >= 0; d--) {
        if (t->shape[d] == 1) continue;
        if (!have) {
            s = t->strides[d];
            span = t->shape[d];
            have = true;
        } else {
            if (t->strides[d] != s * span) return false;
            span *= t->shape[d];
        }
    }
    *rs = s;
    return true;
}

/* The A operand of a single-batch job: t's logical rows [R, K]. */
static void gmat_rows(gmat *m, const lpx_tensor *t)
{
    int64_t K = t->shape[t->ndim - 1];
    m->t = t;
    m->cols = K;
    m->rows = 1;
    for (int d = 0; d < t->ndim - 1; d++) m->rows *= t->shape[d];
    m->bcast = true;
    m->bs = 0;
    m->cs = t->strides[t->ndim - 1];
    m->strided = collapse_rows(t, &m->rs);
}

/* A matrix (batch dim optional) described by its last two dims' strides. */
static void gmat_strided(gmat *m, const lpx_tensor *t, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                         bool bcast, int64_t bs)
{
    m->t = t;
    m->rows = rows;
    m->cols = cols;
    m->rs = rs;
    m->cs = cs;
    m->bcast = bcast;
    m->bs = bs;
    m->strided = true;
}

/* Result handling shared by the ops: the result is written straight into
 * a caller `out` when BLAS can target it, else into a fresh tensor that is
 * then copied into `out` (which may alias an input). */
static lpx_status run_into(lpx_call *c, gemm_job *j, lpx_tensor *user_out, lpx_dtype dtype, int ndim,
                           const int64_t *shape, const lpx_tensor *const *inputs, int ninputs)
{
    lpx_status st;
    bool alias = false;
    for (int i = 0; i < ninputs; i++) alias = alias || (inputs[i] && lpx_tensor_shares_storage(user_out, inputs[i]));
    if (user_out && !alias) {
        j->out = user_out;
        j->out_direct = user_out->dtype == LPX_F32 && lpx_tensor_is_contiguous(user_out);
        if ((st = run_gemm(c, j))) return st;
        lpx_tensor_retain(user_out);
        cpu_ret(c, user_out);
        return LPX_OK;
    }
    lpx_tensor *res;
    if ((st = cpu_new(c, dtype, ndim, shape, &res))) return st;
    j->out = res;
    j->out_direct = dtype == LPX_F32;
    if ((st = run_gemm(c, j))) {
        lpx_tensor_release(res);
        return st;
    }
    if (!user_out) {
        cpu_ret(c, res);
        return LPX_OK;
    }
    /* aliasing out: copy the finished result over */
    cpu_view src, dst;
    cpu_view_of(&src, res);
    cpu_view_of(&dst, user_out);
    float buf[CPU_CHUNK];
    for (int64_t p = 0; p < src.numel; p += CPU_CHUNK) {
        int64_t n = src.numel - p < CPU_CHUNK ? src.numel - p : CPU_CHUNK;
        cpu_load_f32(&src, p, n, buf);
        cpu_store_f32(&dst, p, n, buf, 0);
    }
    lpx_tensor_release(res);
    lpx_tensor_retain(user_out);
    cpu_ret(c, user_out);
    return LPX_OK;
}

/* The contract of each op (dtypes, shapes: lpx_meta_matmul,
 * lpx_meta_linear, lpx_meta_addmm) is the dispatcher's (spec families
 * `matmul`, `linear`, `addmm`); what is the CPU's own is how the operands
 * are laid out for BLAS, and BLAS's int range (run_gemm: a limit of this
 * backend's code, not of the op). */
static lpx_status k_matmul(lpx_call *c)
{
    /* matmul's whole contract is the dispatcher's (spec family `matmul`) */
    const lpx_matmul_args *m = lpx_op_args_of(c);
    lpx_tensor *a = m->a, *b = m->b, *out = m->out;
    const lpx_gemm_geom g = m->g;
    gemm_job j = {.batch = g.batch, .M = g.M, .K = g.K, .N = g.N, .alpha = 1.0f, .beta = 0.0f, .addend = NULL};
    if (b->ndim == 2) {
        gmat_rows(&j.a, a);
        gmat_strided(&j.b, b, g.K, g.N, b->strides[0], b->strides[1], true, 0);
    } else {
        int ar = a->ndim - 2;
        gmat_strided(&j.a, a, g.M, g.K, a->strides[ar], a->strides[ar + 1], g.a_batch == 1,
                     a->ndim == 3 ? a->strides[0] : 0);
        gmat_strided(&j.b, b, g.K, g.N, b->strides[1], b->strides[2], g.b_batch == 1, b->strides[0]);
    }
    const lpx_tensor *inputs[2] = {a, b};
    return run_into(c, &j, out, a->dtype, g.out_ndim, g.out_shape, inputs, 2);
}

/* linear's contract is the dispatcher's (spec family `linear`); the
 * geometry is read in place from the frame */
static lpx_status k_linear(lpx_call *c)
{
    const lpx_linear_args *m = lpx_op_args_of(c);
    lpx_tensor *x = m->x, *w = m->w;
    const lpx_gemm_geom *g = &m->g;
    gemm_job j = {.batch = 1, .K = g->K, .N = g->N, .alpha = 1.0f, .beta = 1.0f, .addend = m->bias};
    gmat_rows(&j.a, x);
    j.M = j.a.rows;
    /* B = w^T: [in, out] with w's strides swapped (a contiguous w is the
     * transposed layout BLAS takes with CblasTrans) */
    gmat_strided(&j.b, w, g->K, g->N, w->strides[1], w->strides[0], true, 0);
    return run_into(c, &j, NULL, x->dtype, g->out_ndim, g->out_shape, NULL, 0);
}

/* addmm's contract is the dispatcher's (spec family `addmm`) */
static lpx_status k_addmm(lpx_call *c)
{
    const lpx_addmm_args *m = lpx_op_args_of(c);
    lpx_tensor *a = m->a, *b = m->b;
    const lpx_gemm_geom *g = &m->g;
    gemm_job j = {.batch = 1, .M = g->M, .N = g->N, .K = g->K, .alpha = (float)m->alpha, .beta = (float)m->beta,
                  .addend = m->c};
    gmat_strided(&j.a, a, g->M, g->K, a->strides[0], a->strides[1], true, 0);
    gmat_strided(&j.b, b, g->K, g->N, b->strides[0], b->strides[1], true, 0);
    return run_into(c, &j, NULL, a->dtype, 2, g->out_shape, NULL, 0);
}

lpx_status lpx_cpu_register_linalg(void)
{
    lpx_status st;
    if ((st = cpu_reg(LPX_OP_matmul, k_matmul))) return st;
    if ((st = cpu_reg(LPX_OP_linear, k_linear))) return st;
    return cpu_reg(LPX_OP_addmm, k_addmm);
}
