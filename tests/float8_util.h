/* Shared by the float8 test programs (tests/test_float8_*.c): the
 * helpers and fixtures their cases use. Static inline: each program
 * compiles only what it calls. */
#ifndef LPX_TESTS_FLOAT8_UTIL_H
#define LPX_TESTS_FLOAT8_UTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "check.h"
#include "tensor_util.h"
#include "fp8_ref.h"

/* ---- helpers ------------------------------------------------------- */

/* All elements of t (dense or float8) as doubles, logical order. */
static inline double *values(lpx_tensor *t)
{
    lpx_tensor *f = NULL, *c = NULL;
    if (lpx_float8_is(t)) CHECK_OK(lpx_float8_dequantize(t, LPX_F32, &f));
    else CHECK_OK(lpx_cast(t, LPX_F32, false, &f));
    CHECK_OK(lpx_contiguous(f, &c));
    int64_t n = lpx_tensor_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    const float *p = c ? lpx_tensor_data(c) : NULL;
    for (int64_t i = 0; i < n; i++) v[i] = p ? p[i] : NAN;
    lpx_tensor_release(f);
    lpx_tensor_release(c);
    return v;
}

static inline double sqnr_db(const double *ref, const double *x, int64_t n)
{
    double s = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        s += ref[i] * ref[i];
        e += (ref[i] - x[i]) * (ref[i] - x[i]);
    }
    return e == 0 ? INFINITY : 10.0 * log10(s / e);
}

static inline double item(const lpx_tensor *t, int64_t i)
{
    double v = NAN;
    CHECK_OK(lpx_item(t, i, &v));
    return v;
}

/* C[M,N] = op(A) @ op(B) in f64 (row-major; ta/tb transpose A/B). */
static inline void dgemm(int M, int N, int K, const double *A, bool ta, const double *B, bool tb, double *C)
{
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0, A,
                ta ? M : K, B, tb ? K : N, 0.0, C, N);
}

static inline float f32(double d) { return (float)d; }

static inline int64_t kind_live(void) { return lpx_kind_live_tensors(lpx_float8_kind()); }

static inline lpx_tensor *quant(lpx_tensor *x, lpx_dtype fp8, int gran, int axis, bool pow2, lpx_float8_stats *st)
{
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.fp8 = fp8;
    o.granularity = gran;
    o.axis = axis;
    o.pow2_scale = pow2;
    lpx_tensor *q = NULL;
    CHECK_OK(lpx_float8_quantize(x, &o, &q, st));
    return q;
}

/* ---- scaled GEMM --------------------------------------------------- */

/* Compares out (dense) with an f64 emulation on the same fp8 inputs:
 * ref = sa[m] * sb[n] * sum_k decode(a) decode(b) (+ bias). */
static inline void check_mm(lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_tensor *out, double tol, const char *what)
{
    int64_t M = lpx_tensor_shape(a)[0], K = lpx_tensor_shape(a)[1], N = lpx_tensor_shape(b)[1];
    /* raw codes decoded exactly (scale_inv = 1 dequantize), then scales */
    lpx_tensor *one = NULL, *ra = NULL, *rb = NULL;
    CHECK_OK(lpx_full(0, NULL, 1.0, LPX_F32, lpx_cpu(), &one));
    CHECK_OK(lpx_fp8_dequantize(lpx_float8_data(a), one, LPX_F32, &ra));
    CHECK_OK(lpx_fp8_dequantize(lpx_float8_data(b), one, LPX_F32, &rb));
    double *A = values(ra), *B = values(rb), *O = values(out), *C = malloc((size_t)(M * N) * sizeof *C);
    double *bv = bias ? values(bias) : NULL;
    dgemm((int)M, (int)N, (int)K, A, false, B, false, C);
    lpx_tensor *sa = lpx_float8_scale_inv(a), *sb = lpx_float8_scale_inv(b);
    double maxref = 0, maxerr = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double f = item(sa, lpx_tensor_numel(sa) == 1 ? 0 : m) * item(sb, lpx_tensor_numel(sb) == 1 ? 0 : n);
            C[m * N + n] = C[m * N + n] * f + (bv ? bv[n] : 0);
            maxref = fmax(maxref, fabs(C[m * N + n]));
        }
    for (int64_t i = 0; i < M * N; i++) {
        /* relative to the element, with a floor of 1% of the largest for
         * near-cancelled sums */
        double e = fabs(O[i] - C[i]) / fmax(fabs(C[i]), 1e-2 * maxref);
        maxerr = fmax(maxerr, e);
    }
    CHECKF(maxerr <= tol, "%s: max relative error %.3g > %.3g", what, maxerr, tol);
    free(A);
    free(B);
    free(O);
    free(C);
    free(bv);
    lpx_tensor_release(one);
    lpx_tensor_release(ra);
    lpx_tensor_release(rb);
}

/* ---- delayed scaling ------------------------------------------------ */

static inline lpx_float8_delayed *delayed(int len, int algo, int margin, int interval)
{
    lpx_float8_delayed_config c = {len, algo, margin, interval, LPX_F8E4M3FN};
    lpx_float8_delayed *d = NULL;
    CHECK_OK(lpx_float8_delayed_new(&c, &d));
    return d;
}

/* ---- Float8Linear ---------------------------------------------------- */

typedef struct lin_ref {
    int64_t M, K, N;
    lpx_tensor *x, *w, *b, *g;
    double *out, *gx, *gw;   /* f64 references */
} lin_ref;

static inline void lin_ref_init(lin_ref *r, int64_t M, int64_t K, int64_t N, lpx_dtype dt, uint64_t seed)
{
    r->M = M, r->K = K, r->N = N;
    int64_t sx[2] = {M, K}, sw[2] = {N, K}, sb[1] = {N}, sg[2] = {M, N};
    r->x = rand_normal(2, sx, seed, 1.0, dt);
    r->w = rand_normal(2, sw, seed + 1, 1.0 / sqrt((double)K), dt);
    r->b = rand_normal(1, sb, seed + 2, 0.1, dt);
    r->g = rand_normal(2, sg, seed + 3, 1e-3, dt);
    double *X = values(r->x), *W = values(r->w), *B = values(r->b), *G = values(r->g);
    r->out = malloc((size_t)(M * N) * sizeof(double));
    r->gx = malloc((size_t)(M * K) * sizeof(double));
    r->gw = malloc((size_t)(N * K) * sizeof(double));
    dgemm((int)M, (int)N, (int)K, X, false, W, true, r->out);
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < N; n++) r->out[i * N + n] += B[n];
    dgemm((int)M, (int)K, (int)N, G, false, W, false, r->gx);
    dgemm((int)N, (int)K, (int)M, G, true, X, false, r->gw);
    free(X);
    free(W);
    free(B);
    free(G);
}

static inline void lin_ref_free(lin_ref *r)
{
    lpx_tensor_release(r->x);
    lpx_tensor_release(r->w);
    lpx_tensor_release(r->b);
    lpx_tensor_release(r->g);
    free(r->out);
    free(r->gx);
    free(r->gw);
}

typedef struct lin_sqnr { double out, gx, gw; } lin_sqnr;

/* One forward + backward with recipe r; SQNRs against the f64 reference,
 * and (when given) the outputs. */
static inline lin_sqnr run_linear(const lin_ref *ref, const lpx_float8_linear_recipe *r, lpx_float8_linear_report *rep,
                           double **outv)
{
    lin_sqnr s = {0, 0, 0};
    lpx_float8_linear_state st;
    CHECK_OK(lpx_float8_linear_state_init(&st, r));
    lpx_tensor *out = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    lpx_float8_linear_ctx *ctx = NULL;
    lpx_float8_linear_report local;
    if (!rep) rep = &local;
    CHECK_OK(lpx_float8_linear_forward(r, &st, ref->x, ref->w, ref->b, &out, &ctx, rep));
    lpx_float8_gemm_report fprop = rep->fprop;
    CHECK_OK(lpx_float8_linear_backward(ctx, ref->g, &gx, &gw, &gb, rep));
    CHECK(rep->fprop.mode == fprop.mode);
    if (out && gx && gw && gb) {
        CHECK(lpx_tensor_dtype(out) == lpx_tensor_dtype(ref->x) && lpx_tensor_dtype(gw) == lpx_tensor_dtype(ref->w));
        double *o = values(out), *x = values(gx), *w = values(gw);
        s.out = sqnr_db(ref->out, o, ref->M * ref->N);
        s.gx = sqnr_db(ref->gx, x, ref->M * ref->K);
        s.gw = sqnr_db(ref->gw, w, ref->N * ref->K);
        /* grad_b = column sums of g, exact up to f32 rounding */
        double *G = values(ref->g), *B = values(gb);
        for (int64_t n = 0; n < ref->N; n++) {
            double sum = 0;
            for (int64_t i = 0; i < ref->M; i++) sum += G[i * ref->N + n];
            CHECK_NEAR(B[n], sum, 1e-6 + 1e-2 * fabs(sum));
        }
        free(G);
        free(B);
        free(x);
        free(w);
        if (outv) *outv = o;
        else free(o);
    }
    lpx_float8_linear_ctx_free(ctx);
    lpx_tensor *rel[] = {out, gx, gw, gb};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    lpx_float8_linear_state_destroy(&st);
    return s;
}

/* ---- views, handlers -------------------------------------------------- */

static inline bool same_values(lpx_tensor *a, lpx_tensor *b)
{
    if (lpx_tensor_numel(a) != lpx_tensor_numel(b)) return false;
    double *x = values(a), *y = values(b);
    bool same = !memcmp(x, y, (size_t)lpx_tensor_numel(a) * sizeof *x);
    free(x);
    free(y);
    return same;
}

/* Two dim-0 shards through pre_all_gather, a simulated gather (cat along
 * dim 0), post_all_gather: the result equals the unsharded tensor. */
static inline void gather_roundtrip(lpx_tensor *full, bool expect_ok)
{
    const lpx_kind *k = lpx_float8_kind();
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    CHECK(vt->shard_unit(full) == 1);
    lpx_tensor *sh[2] = {0};
    int n = 0;
    CHECK_OK(lpx_chunk(full, 2, 0, sh, 2, &n));
    lpx_tensor *in[2][LPX_MAX_AG_INPUTS] = {{0}};
    int nin[2] = {0, 0};
    unsigned char meta[2][LPX_MAX_META];
    size_t msz[2] = {0, 0};
    lpx_status st = vt->pre_all_gather(sh[0], NULL, in[0], &nin[0], meta[0], &msz[0]);
    if (!expect_ok) {
        CHECK_ERR(st, LPX_ENOTIMPL);
        lpx_tensor_release(sh[0]);
        lpx_tensor_release(sh[1]);
        return;
    }
    CHECK_OK(st);
    CHECK_OK(vt->pre_all_gather(sh[1], NULL, in[1], &nin[1], meta[1], &msz[1]));
    CHECK(nin[0] == nin[1] && nin[0] >= 1);
    lpx_tensor *gathered[LPX_MAX_AG_INPUTS] = {0};
    for (int i = 0; i < nin[0]; i++) {
        lpx_tensor *pair[2] = {in[0][i], in[1][i]};
        CHECK_OK(lpx_cat(pair, 2, 0, &gathered[i]));
    }
    lpx_tensor *r = NULL, *r2 = NULL;
    CHECK_OK(vt->post_all_gather(k, gathered, nin[0], meta[0], msz[0], LPX_BF16, NULL, &r));
    CHECK(r && lpx_tensor_dtype(r) == LPX_BF16);
    lpx_tensor *df = NULL, *dr = NULL;
    CHECK_OK(lpx_float8_dequantize(full, LPX_F32, &df));
    if (r) {
        CHECK_OK(lpx_float8_dequantize(r, LPX_F32, &dr));
        CHECK(same_values(df, dr));
        /* second step: refill r in place */
        CHECK_OK(vt->post_all_gather(k, gathered, nin[0], meta[0], msz[0], LPX_BF16, r, &r2));
        CHECK(r2 == r);
    }
    /* gathered bytes arriving as u8 are reinterpreted */
    lpx_tensor *u8 = NULL, *r3 = NULL;
    CHECK_OK(lpx_zeros(lpx_tensor_ndim(gathered[0]), lpx_tensor_shape(gathered[0]), LPX_U8, lpx_cpu(), &u8));
    memcpy(lpx_tensor_data(u8), lpx_tensor_data(gathered[0]), (size_t)lpx_tensor_numel(u8));
    lpx_tensor *g2[LPX_MAX_AG_INPUTS];
    memcpy(g2, gathered, sizeof g2);
    g2[0] = u8;
    CHECK_OK(vt->post_all_gather(k, g2, nin[0], meta[0], msz[0], 0, NULL, &r3));
    if (r3) {
        lpx_tensor *d3 = NULL;
        CHECK_OK(lpx_float8_dequantize(r3, LPX_F32, &d3));
        CHECK(same_values(df, d3));
        lpx_tensor_release(d3);
    }
    lpx_tensor_release(r3);
    CHECK_ERR(vt->post_all_gather(k, gathered, nin[0] + 1, meta[0], msz[0], 0, NULL, &r3), LPX_EINVAL);
    CHECK(r3 == NULL);
    lpx_tensor_release(u8);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < nin[s]; i++) lpx_tensor_release(in[s][i]);
    for (int i = 0; i < nin[0]; i++) lpx_tensor_release(gathered[i]);
    lpx_tensor *rel[] = {sh[0], sh[1], r, r2, df, dr};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

/* Every float8 tensor of the program is gone: no leaked payloads (the last
 * case of each float8 test program). */
static inline void test_no_live_tensors(void) { CHECK(kind_live() == 0); }

#endif
