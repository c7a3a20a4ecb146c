/* matmul, linear, addmm against float64 references computed here, over
 * contiguous, transposed, sliced and expanded operands, batched shapes,
 * f32/bf16/f16 inputs, caller `out` tensors (aliasing included), and every
 * error path. Tensors are built with lpx_tensor_new / lpx_tensor_view_of
 * only, so this file does not depend on the creation or view ops. */
#include <stdint.h>
#include "check.h"
#include "tensor_util.h"

/* test hook of core/alloc.c: the next n allocations succeed, then fail */
LPX_API void lpx__fail_alloc_after(long n);

/* ---- helpers (random data, tensor building, element reads) ------------ */

static lpx_tensor *mk_rand(lpx_dtype dt, int nd, const int64_t *shape)
{
    int64_t n = numel_of(nd, shape);
    double *v = calloc((size_t)(n ? n : 1), sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = nrand();
    lpx_tensor *t = mk(dt, nd, shape, v);
    free(v);
    return t;
}

/* The message of the last error contains `s`. */
#define CHECK_MSG(s) CHECKF(strstr(lpx_last_error(), (s)) != NULL, "message '%s' lacks '%s'", lpx_last_error(), (s))

/* ---- operands with chosen layouts -------------------------------------- */

enum layout { L_CONTIG, L_TRANS, L_SLICE, L_STEP, L_EXPAND, L_NLAYOUTS };
static const char *layout_names[] = {"contig", "trans", "slice", "step", "expand"};

/* A [rows, cols] operand of dtype dt laid out as `l` over a larger storage:
 * L_TRANS is the transpose of a contiguous [cols, rows] tensor, L_SLICE a
 * column window of [rows, cols + 3], L_STEP every other row of
 * [2 * rows, cols], L_EXPAND one row broadcast (row stride 0). */
static lpx_tensor *operand(lpx_dtype dt, int64_t rows, int64_t cols, enum layout l)
{
    lpx_tensor *s = NULL, *v = NULL;
    switch (l) {
    case L_CONTIG: return mk_rand(dt, 2, (int64_t[]){rows, cols});
    case L_TRANS:
        s = mk_rand(dt, 2, (int64_t[]){cols, rows});
        v = view(s, 2, (int64_t[]){rows, cols}, (int64_t[]){1, rows}, 0);
        break;
    case L_SLICE:
        s = mk_rand(dt, 2, (int64_t[]){rows, cols + 3});
        v = view(s, 2, (int64_t[]){rows, cols}, (int64_t[]){cols + 3, 1}, 2);
        break;
    case L_STEP:
        s = mk_rand(dt, 2, (int64_t[]){2 * rows, cols});
        v = view(s, 2, (int64_t[]){rows, cols}, (int64_t[]){2 * cols, 1}, cols);
        break;
    case L_EXPAND:
        s = mk_rand(dt, 2, (int64_t[]){1, cols});
        v = view(s, 2, (int64_t[]){rows, cols}, (int64_t[]){0, 1}, 0);
        break;
    default: return NULL;
    }
    lpx_tensor_release(s);
    return v;
}

/* Relative rounding of the output dtype (half an ulp, doubled for margin). */
static double out_eps(lpx_dtype dt)
{
    return dt == LPX_BF16 ? 0x1p-8 : dt == LPX_F16 ? 0x1p-10 : 0.0;
}

/* Checks C [batch, M, N] (logical) against alpha * A @ B + beta * add
 * (add broadcast already, or NULL), from the f64 values of the inputs:
 * |c - ref| <= out_eps * |ref| + 1e-5 * sqrt(K) * (|alpha| sum |a||b| + |beta add|). */
static int check_gemm(const lpx_tensor *ct, const double *a, const double *b, const double *add, int64_t batch,
                      int64_t M, int64_t K, int64_t N, bool a_bcast, bool b_bcast, double alpha, double beta)
{
    double *c = rd(ct);
    double eo = out_eps(lpx_tensor_dtype(ct));
    int bad = 0;
    for (int64_t bi = 0; bi < batch; bi++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                const double *ab = a + (a_bcast ? 0 : bi * M * K), *bb = b + (b_bcast ? 0 : bi * K * N);
                double r = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    r += ab[i * K + k] * bb[k * N + j];
                    mag += fabs(ab[i * K + k] * bb[k * N + j]);
                }
                r *= alpha;
                mag *= fabs(alpha);
                if (add) {
                    r += beta * add[i * N + j];
                    mag += fabs(beta * add[i * N + j]);
                }
                double got = c[(bi * M + i) * N + j];
                double tol = eo * fabs(r) + 1e-5 * sqrt((double)(K ? K : 1)) * mag + 1e-30;
                if (!(fabs(got - r) <= tol)) {
                    if (bad < 3)
                        fprintf(stderr, "    c[%lld, %lld, %lld] = %.9g, ref %.9g (tol %.3g)\n", (long long)bi,
                                (long long)i, (long long)j, got, r, tol);
                    bad++;
                }
            }
    free(c);
    return bad;
}

/* ---- matmul -------------------------------------------------------------- */

static void matmul_case(lpx_dtype da, lpx_dtype db, int64_t M, int64_t K, int64_t N, enum layout la, enum layout lb)
{
    lpx_tensor *a = operand(da, M, K, la), *b = operand(db, K, N, lb), *c = NULL;
    CHECK(a && b);
    if (!a || !b) goto out;
    CHECK_OK(lpx_matmul(a, b, &c));
    if (!c) goto out;
    CHECK(shape_is(c, 2, (int64_t[]){M, N}));
    CHECK(lpx_tensor_dtype(c) == da);
    double *av = rd(a), *bv = rd(b);
    int bad = check_gemm(c, av, bv, NULL, 1, M, K, N, true, true, 1, 0);
    CHECKF(bad == 0, "%s x %s, [%lld,%lld]x[%lld,%lld], a %s b %s: %d bad elements", lpx_dtype_name(da),
           lpx_dtype_name(db), (long long)M, (long long)K, (long long)K, (long long)N, layout_names[la],
           layout_names[lb], bad);
    free(av);
    free(bv);
out:
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
}

static void test_matmul_f32_layouts(void)
{
    static const int64_t sizes[][3] = {{1, 1, 1}, {2, 3, 4}, {7, 13, 5}, {33, 1, 17}, {16, 64, 1}, {1, 9, 6}, {40, 31, 23}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int la = 0; la < L_NLAYOUTS; la++)
            for (int lb = 0; lb < L_NLAYOUTS; lb++)
                matmul_case(LPX_F32, LPX_F32, sizes[s][0], sizes[s][1], sizes[s][2], la, lb);
}

static void test_matmul_low_precision(void)
{
    static const lpx_dtype pairs[][2] = {{LPX_BF16, LPX_BF16}, {LPX_F16, LPX_F16}, {LPX_F32, LPX_BF16},
                                         {LPX_BF16, LPX_F32}, {LPX_F16, LPX_BF16}};
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++)
        for (int la = 0; la < L_NLAYOUTS; la++)
            for (int lb = 0; lb < L_NLAYOUTS; lb++) matmul_case(pairs[p][0], pairs[p][1], 19, 37, 11, la, lb);
}

/* Shapes that make the conversion and C paths tile: tiles hold 2^20 / max(K, N)
 * rows, so M = 600 with K = 4096 (A tiles) or N = 4096 (C tiles) crosses
 * tile boundaries. */
static void test_matmul_tiled(void)
{
    matmul_case(LPX_BF16, LPX_BF16, 600, 4096, 3, L_CONTIG, L_CONTIG);
    matmul_case(LPX_F32, LPX_F32, 600, 5, 4096, L_CONTIG, L_CONTIG);
    matmul_case(LPX_F32, LPX_BF16, 300, 2048, 7, L_TRANS, L_TRANS);
    matmul_case(LPX_F16, LPX_F32, 520, 3, 2100, L_STEP, L_CONTIG);
}

static void test_matmul_empty(void)
{
    static const int64_t sizes[][3] = {{0, 3, 4}, {3, 0, 4}, {3, 4, 0}, {0, 0, 0}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t M = sizes[s][0], K = sizes[s][1], N = sizes[s][2];
        for (int dt = 0; dt < 2; dt++) {
            lpx_dtype d = dt ? LPX_BF16 : LPX_F32;
            lpx_tensor *a = mk_rand(d, 2, (int64_t[]){M, K}), *b = mk_rand(d, 2, (int64_t[]){K, N}), *c = NULL;
            CHECK_OK(lpx_matmul(a, b, &c));
            CHECK(shape_is(c, 2, (int64_t[]){M, N}));
            if (c) {
                double *cv = rd(c);
                for (int64_t i = 0; i < M * N; i++) CHECK(cv[i] == 0.0);  /* K = 0: empty sums */
                free(cv);
            }
            lpx_tensor_release(a);
            lpx_tensor_release(b);
            lpx_tensor_release(c);
        }
    }
}

/* Batched: [B,M,K] x [B,K,N], [B,M,K] x [K,N], broadcast batch 1 on either
 * side, [M,K] x [B,K,N], and a batch of transposed matrices. */
static void batched_case(lpx_dtype dt, int64_t Ba, int64_t Bb, bool a3, bool b3, bool a_trans)
{
    int64_t M = 5, K = 7, N = 3;
    lpx_tensor *a = NULL, *b = NULL, *c = NULL, *s = NULL;
    if (a3 && a_trans) {
        s = mk_rand(dt, 3, (int64_t[]){Ba, K, M});
        a = view(s, 3, (int64_t[]){Ba, M, K}, (int64_t[]){K * M, 1, M}, 0);
        lpx_tensor_release(s);
    } else {
        a = a3 ? mk_rand(dt, 3, (int64_t[]){Ba, M, K}) : mk_rand(dt, 2, (int64_t[]){M, K});
    }
    b = b3 ? mk_rand(dt, 3, (int64_t[]){Bb, K, N}) : mk_rand(dt, 2, (int64_t[]){K, N});
    int64_t B = b3 ? (Ba == 1 || !a3 ? Bb : Ba) : Ba;
    CHECK_OK(lpx_matmul(a, b, &c));
    if (c) {
        if (a3 || b3) CHECK(shape_is(c, 3, (int64_t[]){B, M, N}));
        double *av = rd(a), *bv = rd(b);
        int bad = check_gemm(c, av, bv, NULL, B, M, K, N, !a3 || Ba == 1, !b3 || Bb == 1, 1, 0);
        CHECKF(bad == 0, "batched %s Ba=%lld Bb=%lld a3=%d b3=%d trans=%d: %d bad", lpx_dtype_name(dt),
               (long long)Ba, (long long)Bb, a3, b3, a_trans, bad);
        free(av);
        free(bv);
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
}

static void test_matmul_batched(void)
{
    for (int d = 0; d < 2; d++) {
        lpx_dtype dt = d ? LPX_BF16 : LPX_F32;
        for (int tr = 0; tr < 2; tr++) {
            batched_case(dt, 4, 4, true, true, tr);
            batched_case(dt, 4, 1, true, true, tr);
            batched_case(dt, 1, 4, true, true, tr);
            batched_case(dt, 4, 0, true, false, tr);
        }
        batched_case(dt, 1, 3, false, true, false);
    }
}

/* [B, M, K] x [K, N] with an a that cannot be folded into one row run
 * (a permuted view): the rows are read in logical order. Also a 4-D a. */
static void test_matmul_nonfoldable(void)
{
    int64_t B = 3, M = 4, K = 5, N = 6;
    lpx_tensor *s = mk_rand(LPX_F32, 3, (int64_t[]){M, B, K});
    lpx_tensor *a = view(s, 3, (int64_t[]){B, M, K}, (int64_t[]){K, B * K, 1}, 0);
    lpx_tensor *b = mk_rand(LPX_F32, 2, (int64_t[]){K, N}), *c = NULL;
    CHECK_OK(lpx_matmul(a, b, &c));
    CHECK(shape_is(c, 3, (int64_t[]){B, M, N}));
    if (c) {
        double *av = rd(a), *bv = rd(b);
        CHECK(check_gemm(c, av, bv, NULL, 1, B * M, K, N, true, true, 1, 0) == 0);
        free(av);
        free(bv);
    }
    lpx_tensor_release(c);
    c = NULL;
    lpx_tensor *a4 = mk_rand(LPX_F16, 4, (int64_t[]){2, 3, 4, K});
    CHECK_OK(lpx_matmul(a4, b, &c));
    CHECK(shape_is(c, 4, (int64_t[]){2, 3, 4, N}));
    if (c) {
        double *av = rd(a4), *bv = rd(b);
        CHECK(check_gemm(c, av, bv, NULL, 1, 24, K, N, true, true, 1, 0) == 0);
        free(av);
        free(bv);
    }
    lpx_tensor_release(s);
    lpx_tensor_release(a);
    lpx_tensor_release(a4);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
}

/* f32 operands BLAS can read in place (transposed contiguous views
 * included) need no buffer: the result tensor is the only allocation
 * (header + storage block). bf16 operands do need buffers. */
static void test_matmul_no_copy(void)
{
    lpx_tensor *a = operand(LPX_F32, 64, 48, L_TRANS), *b = operand(LPX_F32, 48, 32, L_TRANS), *c = NULL;
    lpx__fail_alloc_after(2);
    lpx_status st = lpx_matmul(a, b, &c);
    lpx__fail_alloc_after(-1);
    CHECKF(st == LPX_OK, "transposed f32 matmul allocated more than its result: %s", lpx_last_error());
    if (c) {
        double *av = rd(a), *bv = rd(b);
        CHECK(check_gemm(c, av, bv, NULL, 1, 64, 48, 32, true, true, 1, 0) == 0);
        free(av);
        free(bv);
    }
    lpx_tensor_release(c);
    c = NULL;
    lpx_tensor *ab = operand(LPX_BF16, 64, 48, L_CONTIG);
    lpx__fail_alloc_after(2);
    st = lpx_matmul(ab, b, &c);
    lpx__fail_alloc_after(-1);
    CHECK(st == LPX_ENOMEM && c == NULL);
    lpx_tensor_release(ab);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
}

/* Every allocation of the converting paths failing in turn: LPX_ENOMEM,
 * no leak (LSan), no crash. */
static void test_oom(void)
{
    lpx_tensor *a = operand(LPX_BF16, 9, 8, L_TRANS), *b = operand(LPX_F16, 8, 7, L_SLICE);
    lpx_tensor *w = operand(LPX_BF16, 7, 8, L_CONTIG), *bias = mk_rand(LPX_F32, 1, (int64_t[]){7});
    lpx_tensor *o = operand(LPX_BF16, 9, 7, L_TRANS);
    for (long n = 0; n < 12; n++) {
        lpx_tensor *c = NULL;
        lpx__fail_alloc_after(n);
        lpx_status s1 = lpx_matmul(a, b, &c);
        lpx__fail_alloc_after(-1);
        CHECK(s1 == LPX_OK || s1 == LPX_ENOMEM);
        CHECK((s1 == LPX_OK) == (c != NULL));
        lpx_tensor_release(c);
        c = NULL;
        lpx__fail_alloc_after(n);
        s1 = lpx_linear(a, w, bias, &c);
        lpx__fail_alloc_after(-1);
        CHECK(s1 == LPX_OK || s1 == LPX_ENOMEM);
        lpx_tensor_release(c);
        lpx__fail_alloc_after(n);
        s1 = lpx_matmul_out(a, b, o);
        lpx__fail_alloc_after(-1);
        CHECK(s1 == LPX_OK || s1 == LPX_ENOMEM);
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(w);
    lpx_tensor_release(bias);
    lpx_tensor_release(o);
}

/* ---- matmul_out --------------------------------------------------------- */

static void out_case(lpx_dtype odt, enum layout lo, lpx_dtype in_dt)
{
    int64_t M = 6, K = 9, N = 5;
    lpx_tensor *a = operand(in_dt, M, K, L_CONTIG), *b = operand(in_dt, K, N, L_TRANS);
    lpx_tensor *o = operand(odt, M, N, lo);
    int before = lpx_tensor_refcount(o);
    if (odt == in_dt) {
        CHECK_OK(lpx_matmul_out(a, b, o));
        CHECK(lpx_tensor_refcount(o) == before);
        double *av = rd(a), *bv = rd(b);
        int bad = check_gemm(o, av, bv, NULL, 1, M, K, N, true, true, 1, 0);
        CHECKF(bad == 0, "matmul_out into %s %s: %d bad", lpx_dtype_name(odt), layout_names[lo], bad);
        free(av);
        free(bv);
    } else {
        CHECK_ERR(lpx_matmul_out(a, b, o), LPX_EDTYPE);
        CHECK_MSG("out has dtype");
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(o);
}

static void test_matmul_out(void)
{
    out_case(LPX_F32, L_CONTIG, LPX_F32);
    out_case(LPX_F32, L_TRANS, LPX_F32);
    out_case(LPX_F32, L_SLICE, LPX_F32);
    out_case(LPX_BF16, L_CONTIG, LPX_BF16);
    out_case(LPX_BF16, L_STEP, LPX_BF16);
    out_case(LPX_BF16, L_CONTIG, LPX_F32);  /* dtype mismatch */

    /* out aliasing an input: a = a @ b with a square b, and out = b */
    int64_t M = 7, K = 7;
    for (int which = 0; which < 2; which++) {
        lpx_tensor *a = operand(LPX_F32, M, K, L_CONTIG), *b = operand(LPX_F32, K, K, L_CONTIG);
        double *av = rd(a), *bv = rd(b);
        CHECK_OK(lpx_matmul_out(a, b, which ? b : a));
        CHECK(check_gemm(which ? b : a, av, bv, NULL, 1, M, K, K, true, true, 1, 0) == 0);
        free(av);
        free(bv);
        lpx_tensor_release(a);
        lpx_tensor_release(b);
    }

    /* out of the wrong shape, NULL out */
    lpx_tensor *a = operand(LPX_F32, 2, 3, L_CONTIG), *b = operand(LPX_F32, 3, 4, L_CONTIG);
    lpx_tensor *o = operand(LPX_F32, 4, 2, L_CONTIG);
    CHECK_ERR(lpx_matmul_out(a, b, o), LPX_ESHAPE);
    CHECK_MSG("out has shape [4, 2]");
    CHECK_ERR(lpx_matmul_out(a, b, NULL), LPX_EINVAL);
    CHECK_MSG("out is NULL");
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(o);

    /* batched out */
    lpx_tensor *a3 = mk_rand(LPX_F32, 3, (int64_t[]){2, 3, 4}), *b3 = mk_rand(LPX_F32, 3, (int64_t[]){2, 4, 5});
    lpx_tensor *o3 = mk_rand(LPX_F32, 3, (int64_t[]){2, 3, 5});
    CHECK_OK(lpx_matmul_out(a3, b3, o3));
    double *av = rd(a3), *bv = rd(b3);
    CHECK(check_gemm(o3, av, bv, NULL, 2, 3, 4, 5, false, false, 1, 0) == 0);
    free(av);
    free(bv);
    lpx_tensor_release(a3);
    lpx_tensor_release(b3);
    lpx_tensor_release(o3);
}

/* ---- linear --------------------------------------------------------------- */

static void linear_case(lpx_dtype dx, lpx_dtype dw, enum layout lw, bool with_bias, int xnd)
{
    int64_t in = 11, nout = 6;
    int64_t xs3[3] = {2, 3, in}, xs1[1] = {in};
    lpx_tensor *x = xnd == 3 ? mk_rand(dx, 3, xs3) : xnd == 2 ? operand(dx, 5, in, L_TRANS) : mk_rand(dx, 1, xs1);
    lpx_tensor *w = operand(dw, nout, in, lw);
    lpx_tensor *bias = with_bias ? mk_rand(LPX_F32, 1, (int64_t[]){nout}) : NULL, *y = NULL;
    CHECK_OK(lpx_linear(x, w, bias, &y));
    if (!y) goto out;
    int64_t R = lpx_tensor_numel(x) / in;
    CHECK(lpx_tensor_dtype(y) == dx);
    CHECK(lpx_tensor_ndim(y) == xnd && lpx_tensor_shape(y)[xnd - 1] == nout);
    double *xv = rd(x), *wv = rd(w), *wt = malloc(sizeof(double) * (size_t)(in * nout));
    for (int64_t i = 0; i < in; i++)
        for (int64_t j = 0; j < nout; j++) wt[i * nout + j] = wv[j * in + i];
    double *bv = bias ? rd(bias) : NULL, *add = NULL;
    if (bv) {
        add = malloc(sizeof(double) * (size_t)(R * nout));
        for (int64_t r = 0; r < R; r++)
            for (int64_t j = 0; j < nout; j++) add[r * nout + j] = bv[j];
    }
    int bad = check_gemm(y, xv, wt, add, 1, R, in, nout, true, true, 1, 1);
    CHECKF(bad == 0, "linear x %s (%dd) w %s %s bias %d: %d bad", lpx_dtype_name(dx), xnd, lpx_dtype_name(dw),
           layout_names[lw], with_bias, bad);
    free(xv);
    free(wv);
    free(wt);
    free(bv);
    free(add);
out:
    lpx_tensor_release(x);
    lpx_tensor_release(w);
    lpx_tensor_release(bias);
    lpx_tensor_release(y);
}

static void test_linear(void)
{
    static const enum layout wl[] = {L_CONTIG, L_TRANS, L_SLICE, L_STEP};
    for (int bias = 0; bias < 2; bias++)
        for (size_t l = 0; l < sizeof wl / sizeof *wl; l++)
            for (int xnd = 1; xnd <= 3; xnd++) {
                linear_case(LPX_F32, LPX_F32, wl[l], bias, xnd);
                linear_case(LPX_BF16, LPX_BF16, wl[l], bias, xnd);
                linear_case(LPX_F32, LPX_BF16, wl[l], bias, xnd);
                linear_case(LPX_F16, LPX_F32, wl[l], bias, xnd);
            }
}

/* ---- addmm ---------------------------------------------------------------- */

static void addmm_case(lpx_dtype dt, int cnd, const int64_t *cshape, double beta, double alpha)
{
    int64_t M = 4, K = 6, N = 5;
    lpx_tensor *a = operand(dt, M, K, L_CONTIG), *b = operand(dt, K, N, L_TRANS);
    lpx_tensor *c = mk_rand(LPX_F32, cnd, cshape), *y = NULL;
    CHECK_OK(lpx_addmm(c, a, b, beta, alpha, &y));
    if (y) {
        CHECK(shape_is(y, 2, (int64_t[]){M, N}));
        double *av = rd(a), *bv = rd(b), *cv = rd(c), add[20];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                int64_t ci = cnd == 0 ? 0
                           : cnd == 1 ? (cshape[0] == 1 ? 0 : j)
                                      : (cshape[0] == 1 ? 0 : i) * cshape[1] + (cshape[1] == 1 ? 0 : j);
                add[i * N + j] = cv[ci];
            }
        int bad = check_gemm(y, av, bv, add, 1, M, K, N, true, true, alpha, beta);
        CHECKF(bad == 0, "addmm %s c %dd beta %g alpha %g: %d bad", lpx_dtype_name(dt), cnd, beta, alpha, bad);
        free(av);
        free(bv);
        free(cv);
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
    lpx_tensor_release(y);
}

static void test_addmm(void)
{
    for (int d = 0; d < 2; d++) {
        lpx_dtype dt = d ? LPX_BF16 : LPX_F32;
        addmm_case(dt, 2, (int64_t[]){4, 5}, 0.5, 2.0);
        addmm_case(dt, 2, (int64_t[]){4, 1}, 1.0, -1.0);
        addmm_case(dt, 2, (int64_t[]){1, 5}, -3.0, 0.25);
        addmm_case(dt, 1, (int64_t[]){5}, 1.0, 1.0);
        addmm_case(dt, 1, (int64_t[]){1}, 2.0, 1.0);
        addmm_case(dt, 0, NULL, 1.5, 1.0);
        addmm_case(dt, 2, (int64_t[]){4, 5}, 0.0, 1.0);
    }

    /* beta = 0 ignores c entirely: NaN in c does not leak into the result */
    lpx_tensor *a = operand(LPX_F32, 3, 4, L_CONTIG), *b = operand(LPX_F32, 4, 2, L_CONTIG);
    lpx_tensor *c = mk(LPX_F32, 2, (int64_t[]){3, 2}, (double[]){NAN, NAN, NAN, NAN, NAN, NAN}), *y = NULL;
    CHECK_OK(lpx_addmm(c, a, b, 0.0, 1.0, &y));
    if (y) {
        double *yv = rd(y);
        for (int i = 0; i < 6; i++) CHECK(!isnan(yv[i]));
        free(yv);
    }
    lpx_tensor_release(y);
    y = NULL;

    /* K = 0: beta * c */
    lpx_tensor *a0 = mk_rand(LPX_F32, 2, (int64_t[]){3, 0}), *b0 = mk_rand(LPX_F32, 2, (int64_t[]){0, 2});
    lpx_tensor *c1 = mk(LPX_F32, 2, (int64_t[]){3, 2}, (double[]){1, 2, 3, 4, 5, 6});
    CHECK_OK(lpx_addmm(c1, a0, b0, 2.0, 1.0, &y));
    if (y) {
        double *yv = rd(y);
        for (int i = 0; i < 6; i++) CHECK(yv[i] == 2.0 * (i + 1));
        free(yv);
    }
    lpx_tensor_release(y);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
    lpx_tensor_release(a0);
    lpx_tensor_release(b0);
    lpx_tensor_release(c1);
}

/* ---- errors ----------------------------------------------------------------- */

static lpx_status redispatch_fallback(lpx_call *c) { return lpx_redispatch(c); }

static void test_errors(void)
{
    lpx_tensor *a = operand(LPX_F32, 2, 3, L_CONTIG), *b = operand(LPX_F32, 4, 5, L_CONTIG), *y = NULL;
    CHECK_ERR(lpx_matmul(a, b, &y), LPX_ESHAPE);
    CHECK_MSG("matmul: a [2, 3] and b [4, 5]: K mismatch (3 vs 4)");
    CHECK(y == NULL);
    CHECK_ERR(lpx_matmul(NULL, b, &y), LPX_EINVAL);
    CHECK_ERR(lpx_matmul(a, NULL, &y), LPX_EINVAL);
    CHECK_ERR(lpx_matmul(a, b, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_linear(NULL, b, NULL, &y), LPX_EINVAL);
    CHECK_ERR(lpx_addmm(a, NULL, b, 1, 1, &y), LPX_EINVAL);

    /* integer dtypes */
    lpx_tensor *ai = NULL, *bi = NULL;
    lpx_tensor_new(LPX_I32, 2, (int64_t[]){2, 3}, lpx_cpu(), &ai);
    lpx_tensor_new(LPX_I64, 2, (int64_t[]){3, 2}, lpx_cpu(), &bi);
    memset(lpx_tensor_data(ai), 0, 24);
    memset(lpx_tensor_data(bi), 0, 48);
    lpx_tensor *a23 = operand(LPX_F32, 2, 3, L_CONTIG), *b32 = operand(LPX_F32, 3, 2, L_CONTIG);
    CHECK_ERR(lpx_matmul(ai, b32, &y), LPX_EDTYPE);
    CHECK_MSG("i32");
    CHECK_ERR(lpx_matmul(a23, bi, &y), LPX_EDTYPE);
    CHECK_MSG("i64");
    CHECK_ERR(lpx_linear(ai, a23, NULL, &y), LPX_EDTYPE);
    CHECK_ERR(lpx_addmm(ai, a23, b32, 1, 1, &y), LPX_EDTYPE);

    /* ranks */
    lpx_tensor *v3 = mk_rand(LPX_F32, 1, (int64_t[]){3});
    CHECK_ERR(lpx_matmul(v3, b32, &y), LPX_ESHAPE);
    CHECK_MSG("matmul: a [3] and b [3, 2]");
    CHECK_ERR(lpx_matmul(a23, v3, &y), LPX_ESHAPE);
    lpx_tensor *x4 = mk_rand(LPX_F32, 4, (int64_t[]){1, 2, 2, 3}), *b4 = mk_rand(LPX_F32, 4, (int64_t[]){1, 2, 3, 2});
    CHECK_ERR(lpx_matmul(a23, b4, &y), LPX_ESHAPE);
    lpx_tensor *s0 = mk_rand(LPX_F32, 0, NULL);
    CHECK_ERR(lpx_matmul(x4, s0, &y), LPX_ESHAPE);
    lpx_tensor *b3 = mk_rand(LPX_F32, 3, (int64_t[]){2, 3, 2}), *a3 = mk_rand(LPX_F32, 3, (int64_t[]){3, 2, 3});
    CHECK_ERR(lpx_matmul(a3, b3, &y), LPX_ESHAPE);
    CHECK_MSG("batch mismatch (3 vs 2)");
    CHECK_ERR(lpx_matmul(x4, b3, &y), LPX_ESHAPE);

    /* linear shapes */
    lpx_tensor *w = operand(LPX_F32, 4, 5, L_CONTIG), *bias = mk_rand(LPX_F32, 1, (int64_t[]){3});
    CHECK_ERR(lpx_linear(a23, w, NULL, &y), LPX_ESHAPE);
    CHECK_MSG("linear: x [2, 3] and w [4, 5]: in_features mismatch (3 vs 5)");
    lpx_tensor *x5 = operand(LPX_F32, 2, 5, L_CONTIG);
    CHECK_ERR(lpx_linear(x5, w, bias, &y), LPX_ESHAPE);
    CHECK_MSG("bias [3]");
    CHECK_ERR(lpx_linear(x5, v3, NULL, &y), LPX_ESHAPE);
    CHECK_ERR(lpx_linear(s0, w, NULL, &y), LPX_ESHAPE);

    /* addmm shapes */
    lpx_tensor *c33 = operand(LPX_F32, 3, 3, L_CONTIG);
    CHECK_ERR(lpx_addmm(c33, a23, b32, 1, 1, &y), LPX_ESHAPE);
    CHECK_MSG("c [3, 3] does not broadcast");
    CHECK_ERR(lpx_addmm(c33, a23, a23, 1, 1, &y), LPX_ESHAPE);
    CHECK_MSG("K mismatch (3 vs 2)");
    CHECK_ERR(lpx_addmm(c33, x4, b32, 1, 1, &y), LPX_ESHAPE);

    /* kind tensors: no handler -> ENOTIMPL; a fallback that redispatches
     * lands on the cpu kernel, which refuses kind tensors */
    static const lpx_kind_i kvt = {.struct_size = sizeof(lpx_kind_i), .abi_version = LPX_KIND_ABI_VERSION,
                                   .name = "test_linalg_kind", .priority = LPX_PRIORITY_PAYLOAD};
    const lpx_kind *kind = NULL;
    CHECK_OK(lpx_kind_register(&kvt, &kind));
    lpx_tensor *kt = NULL;
    CHECK_OK(lpx_tensor_new_kind(kind, LPX_F32, 2, (int64_t[]){3, 2}, lpx_cpu(), &b32, 1, NULL, 0, &kt));
    CHECK_ERR(lpx_matmul(a23, kt, &y), LPX_ENOTIMPL);
    CHECK_OK(lpx_fallback_register(lpx_kind_key(kind), redispatch_fallback, NULL));
    CHECK_ERR(lpx_matmul(a23, kt, &y), LPX_EINVAL);
    CHECK_MSG("test_linalg_kind");
    CHECK_ERR(lpx_linear(kt, a23, NULL, &y), LPX_EINVAL);
    CHECK_ERR(lpx_addmm(kt, a23, b32, 1, 1, &y), LPX_EINVAL);
    CHECK(y == NULL);
    lpx_tensor_release(kt);
    CHECK_OK(lpx_kind_unregister(kind));

    lpx_tensor *objs[] = {a, b, ai, bi, a23, b32, v3, x4, b4, b3, a3, w, bias, x5, s0, c33};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lpx_tensor_release(objs[i]);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_matmul_f32_layouts);
    RUN(test_matmul_low_precision);
    RUN(test_matmul_tiled);
    RUN(test_matmul_empty);
    RUN(test_matmul_batched);
    RUN(test_matmul_nonfoldable);
    RUN(test_matmul_no_copy);
    RUN(test_oom);
    RUN(test_matmul_out);
    RUN(test_linear);
    RUN(test_addmm);
    RUN(test_errors);
    return CHECK_DONE();
}
