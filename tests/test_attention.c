/* rope and grouped-query attention (forward and backward) against float64
 * references written here from the definitions (the full score matrix,
 * explicit softmax, k/v heads indexed by h / group), a finite-difference
 * check of the attention gradients through the forward op, block edges
 * (T > 64), bottom-right causal alignment (S > T), strided and bf16
 * inputs, and every argument error. */
#include <string.h>
#include "check.h"
#include "tensor_util.h"

#define CHECK_MSG(s) CHECKF(strstr(lpx_last_error(), (s)) != NULL, "message '%s' lacks '%s'", lpx_last_error(), (s))

/* ---- references (float64, from the definitions) ------------------------ */

typedef struct { int64_t B, T, S, H, KH, D; } geo;

static int64_t ix(int64_t b, int64_t t, int64_t h, int64_t d, int64_t L, int64_t H, int64_t D)
{
    return ((b * L + t) * H + h) * D + d;
}

/* P[b][h][t][j] (full matrix, masked entries 0), out and lse */
static void ref_forward(const geo *g, bool causal, double scale, const double *q, const double *k, const double *v,
                        double *P, double *out, double *lse)
{
    int64_t grp = g->H / g->KH;
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t h = 0; h < g->H; h++)
            for (int64_t t = 0; t < g->T; t++) {
                double *p = P + ((b * g->H + h) * g->T + t) * g->S, mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < g->S; j++) {
                    bool ok = !causal || j <= t + g->S - g->T;
                    double s = 0;
                    for (int64_t d = 0; d < g->D; d++)
                        s += q[ix(b, t, h, d, g->T, g->H, g->D)] * k[ix(b, j, h / grp, d, g->S, g->KH, g->D)];
                    p[j] = ok ? s * scale : -INFINITY;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < g->S; j++) sum += p[j] = exp(p[j] - mx);
                for (int64_t j = 0; j < g->S; j++) p[j] /= sum;
                lse[(b * g->H + h) * g->T + t] = mx + log(sum);
                for (int64_t d = 0; d < g->D; d++) {
                    double o = 0;
                    for (int64_t j = 0; j < g->S; j++) o += p[j] * v[ix(b, j, h / grp, d, g->S, g->KH, g->D)];
                    out[ix(b, t, h, d, g->T, g->H, g->D)] = o;
                }
            }
}

/* gradients of sum(out * G) from the full P (the chain rule through the
 * softmax written directly: dS_j = P_j (dP_j - sum_i P_i dP_i)) */
static void ref_backward(const geo *g, double scale, const double *q, const double *k, const double *v,
                         const double *P, const double *G, double *dq, double *dk, double *dv)
{
    int64_t grp = g->H / g->KH;
    memset(dq, 0, sizeof(double) * (size_t)(g->B * g->T * g->H * g->D));
    memset(dk, 0, sizeof(double) * (size_t)(g->B * g->S * g->KH * g->D));
    memset(dv, 0, sizeof(double) * (size_t)(g->B * g->S * g->KH * g->D));
    double *dp = malloc(sizeof(double) * (size_t)g->S);
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t h = 0; h < g->H; h++)
            for (int64_t t = 0; t < g->T; t++) {
                const double *p = P + ((b * g->H + h) * g->T + t) * g->S;
                double dot = 0;
                for (int64_t j = 0; j < g->S; j++) {
                    dp[j] = 0;
                    for (int64_t d = 0; d < g->D; d++) {
                        double gd = G[ix(b, t, h, d, g->T, g->H, g->D)];
                        dp[j] += gd * v[ix(b, j, h / grp, d, g->S, g->KH, g->D)];
                        dv[ix(b, j, h / grp, d, g->S, g->KH, g->D)] += p[j] * gd;
                    }
                    dot += p[j] * dp[j];
                }
                for (int64_t j = 0; j < g->S; j++) {
                    double ds = p[j] * (dp[j] - dot) * scale;
                    for (int64_t d = 0; d < g->D; d++) {
                        dq[ix(b, t, h, d, g->T, g->H, g->D)] += ds * k[ix(b, j, h / grp, d, g->S, g->KH, g->D)];
                        dk[ix(b, j, h / grp, d, g->S, g->KH, g->D)] += ds * q[ix(b, t, h, d, g->T, g->H, g->D)];
                    }
                }
            }
    free(dp);
}

/* One configuration: forward and backward against the references. */
static void check_case(const char *label, geo g, bool causal, lpx_dtype dt, bool strided_q)
{
    int64_t qs[4] = {g.B, g.T, g.H, g.D}, ks[4] = {g.B, g.S, g.KH, g.D}, ls[3] = {g.B, g.H, g.T};
    lpx_tensor *q = NULL, *qbase = NULL, *k = mk_randn(dt, 4, ks, 1.0), *v = mk_randn(dt, 4, ks, 1.0),
               *G = mk_randn(dt, 4, qs, 1.0), *out = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    if (strided_q) {
        /* q as a [B, H, T, D] buffer seen as [B, T, H, D] (the layout a
         * transpose of heads and positions gives) */
        int64_t bs[4] = {g.B, g.H, g.T, g.D}, st[4] = {g.H * g.T * g.D, g.D, g.T * g.D, 1};
        qbase = mk_randn(dt, 4, bs, 1.0);
        q = view(qbase, 4, qs, st, 0);
    } else {
        q = mk_randn(dt, 4, qs, 1.0);
    }
    double scale = 1.0 / sqrt((double)g.D);
    int64_t nq = g.B * g.T * g.H * g.D, nk = g.B * g.S * g.KH * g.D, nl = g.B * g.H * g.T;
    double *P = malloc(sizeof(double) * (size_t)(nl * g.S)), *ro = malloc(sizeof(double) * (size_t)nq),
           *rl = malloc(sizeof(double) * (size_t)nl), *rdq = malloc(sizeof(double) * (size_t)nq),
           *rdk = malloc(sizeof(double) * (size_t)nk), *rdv = malloc(sizeof(double) * (size_t)nk);
    double *qv = rd(q), *kv = rd(k), *vv = rd(v), *gv = rd(G);
    ref_forward(&g, causal, scale, qv, kv, vv, P, ro, rl);
    ref_backward(&g, scale, qv, kv, vv, P, gv, rdq, rdk, rdv);
    /* f32 inputs: f32 arithmetic over D and S terms; bf16: the result is
     * rounded to bf16 once (inputs are exact in both) */
    double rel = dt == LPX_BF16 ? 0x1p-7 : 2e-5, abs_tol = dt == LPX_BF16 ? 2e-2 : 2e-5;
    CHECK_OK(lpx_attention(q, k, v, causal, scale, &out, &lse));
    CHECKF(shape_is(out, 4, qs) && shape_is(lse, 3, ls), "%s: result shapes", label);
    if (out && lse) {
        CHECK(lpx_tensor_dtype(out) == dt && lpx_tensor_dtype(lse) == LPX_F32);
        double *o = rd(out), *l = rd(lse);
        CHECKF(cmp_close("out", o, ro, nq, rel, abs_tol) == 0, "%s: out", label);
        CHECKF(cmp_close("lse", l, rl, nl, 1e-5, 1e-5) == 0, "%s: lse", label);
        free(o);
        free(l);
        CHECK_OK(lpx_attention_backward(G, q, k, v, out, lse, causal, scale, &dq, &dk, &dv));
        if (dq && dk && dv) {
            double *a = rd(dq), *b = rd(dk), *c = rd(dv);
            /* bf16: out itself is rounded, so the backward's delta term
             * carries bf16 error; the bound scales with the grads' size */
            double grel = dt == LPX_BF16 ? 3e-2 : 1e-4, gabs = dt == LPX_BF16 ? 6e-2 : 1e-4;
            CHECKF(cmp_close("dq", a, rdq, nq, grel, gabs) == 0, "%s: dq", label);
            CHECKF(cmp_close("dk", b, rdk, nk, grel, gabs) == 0, "%s: dk", label);
            CHECKF(cmp_close("dv", c, rdv, nk, grel, gabs) == 0, "%s: dv", label);
            free(a);
            free(b);
            free(c);
        }
    }
    free(P), free(ro), free(rl), free(rdq), free(rdk), free(rdv), free(qv), free(kv), free(vv), free(gv);
    lpx_tensor *rel_[] = {q, qbase, k, v, G, out, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof rel_ / sizeof *rel_; i++) lpx_tensor_release(rel_[i]);
}

static void test_attention_gqa_causal(void) { check_case("gqa causal", (geo){2, 7, 7, 4, 2, 8}, true, LPX_F32, false); }
static void test_attention_mha_noncausal(void) { check_case("mha", (geo){1, 5, 9, 3, 3, 4}, false, LPX_F32, false); }
/* S > T: query t sees keys j <= t + S - T (a KV cache's alignment) */
static void test_attention_causal_bottom_right(void) { check_case("S>T", (geo){1, 5, 9, 2, 1, 4}, true, LPX_F32, false); }
/* T crosses the kernel's 64-row blocks; one k/v head for four queries (MQA) */
static void test_attention_blocks(void) { check_case("T=130", (geo){1, 130, 130, 4, 1, 6}, true, LPX_F32, false); }
static void test_attention_strided(void) { check_case("strided q", (geo){2, 9, 9, 4, 2, 4}, true, LPX_F32, true); }
static void test_attention_bf16(void) { check_case("bf16", (geo){1, 17, 17, 4, 2, 16}, true, LPX_BF16, false); }

/* The gradients against central differences of the forward op itself (in
 * f32, so the step is large and the bound loose; independent of the
 * backward's derivation). */
static void test_attention_finite_difference(void)
{
    geo g = {1, 4, 4, 2, 1, 3};
    int64_t qs[4] = {g.B, g.T, g.H, g.D}, ks[4] = {g.B, g.S, g.KH, g.D};
    lpx_tensor *q = mk_randn(LPX_F32, 4, qs, 1.0), *k = mk_randn(LPX_F32, 4, ks, 1.0), *v = mk_randn(LPX_F32, 4, ks, 1.0),
               *G = mk_randn(LPX_F32, 4, qs, 1.0), *out = NULL, *lse = NULL, *d[3] = {NULL, NULL, NULL};
    double scale = 0.7;
    CHECK_OK(lpx_attention(q, k, v, true, scale, &out, &lse));
    CHECK_OK(lpx_attention_backward(G, q, k, v, out, lse, true, scale, &d[0], &d[1], &d[2]));
    double *gv = rd(G);
    lpx_tensor *in[3] = {q, k, v};
    int bad = 0;
    for (int w = 0; w < 3 && d[w]; w++) {
        double *an = rd(d[w]);
        for (int64_t i = 0; i < lpx_tensor_numel(in[w]); i++) {
            float *x = (float *)lpx_tensor_data(in[w]) + i, x0 = *x;
            double f[2];
            for (int s = 0; s < 2; s++) {
                *x = x0 + (s ? -1e-2f : 1e-2f);
                lpx_tensor *o = NULL, *l = NULL;
                CHECK_OK(lpx_attention(q, k, v, true, scale, &o, &l));
                double *ov = o ? rd(o) : NULL, acc = 0;
                for (int64_t j = 0; ov && j < lpx_tensor_numel(o); j++) acc += ov[j] * gv[j];
                f[s] = acc;
                free(ov);
                lpx_tensor_release(o);
                lpx_tensor_release(l);
            }
            *x = x0;
            double fd = (f[0] - f[1]) / 2e-2;
            if (fabs(fd - an[i]) > 2e-3 + 2e-3 * fabs(fd)) {
                if (bad < 3) fprintf(stderr, "    input %d [%lld]: fd %.6g, backward %.6g\n", w, (long long)i, fd, an[i]);
                bad++;
            }
        }
        free(an);
    }
    CHECKF(bad == 0, "%d gradients differ from finite differences", bad);
    free(gv);
    lpx_tensor *rel_[] = {q, k, v, G, out, lse, d[0], d[1], d[2]};
    for (size_t i = 0; i < sizeof rel_ / sizeof *rel_; i++) lpx_tensor_release(rel_[i]);
}

/* ---- rope ---------------------------------------------------------------- */

static void test_rope_reference(void)
{
    int64_t B = 2, T = 5, H = 3, D = 8, half = D / 2, offset = 7;
    int64_t xs[4] = {B, T, H, D}, fs[1] = {half};
    double fv[4];
    for (int i = 0; i < half; i++) fv[i] = pow(500000.0, -2.0 * i / (double)D);
    lpx_tensor *fr = mk(LPX_F32, 1, fs, fv);
    const lpx_dtype dts[2] = {LPX_F32, LPX_BF16};
    for (int di = 0; di < 2; di++) {
        lpx_tensor *x = mk_randn(dts[di], 4, xs, 1.0), *y = NULL, *back = NULL;
        CHECK_OK(lpx_rope(x, fr, offset, &y));
        CHECK(shape_is(y, 4, xs) && lpx_tensor_dtype(y) == dts[di]);
        if (y) {
            double *xv = rd(x), *yv = rd(y), *fq = rd(fr);
            int bad = 0;
            for (int64_t r = 0; r < B * T * H; r++) {
                int64_t t = (r / H) % T;
                for (int64_t i = 0; i < half; i++) {
                    double a = (double)(float)((float)(offset + t) * (float)fq[i]);
                    double x1 = xv[r * D + i], x2 = xv[r * D + i + half];
                    double e1 = x1 * cos(a) - x2 * sin(a), e2 = x2 * cos(a) + x1 * sin(a);
                    double tol = dts[di] == LPX_BF16 ? 0x1p-8 * (fabs(e1) + fabs(e2)) + 1e-6 : 1e-6;
                    if (fabs(yv[r * D + i] - e1) > tol || fabs(yv[r * D + i + half] - e2) > tol) bad++;
                }
            }
            CHECKF(bad == 0, "%s: %d rotated pairs differ from the formula", lpx_dtype_name(dts[di]), bad);
            /* the backward is the transpose: <rope(x), g> == <x, rope_backward(g)> */
            lpx_tensor *gt = mk_randn(LPX_F32, 4, xs, 1.0), *y32 = NULL, *x32 = NULL;
            CHECK_OK(lpx_rope(x, fr, offset, &y32));
            CHECK_OK(lpx_rope_backward(gt, fr, offset, &back));
            if (back) {
                double *g = rd(gt), *bv = rd(back), l = 0, r = 0;
                for (int64_t i = 0; i < B * T * H * D; i++) {
                    l += yv[i] * g[i];
                    r += xv[i] * bv[i];
                }
                if (dts[di] == LPX_F32) CHECKF(fabs(l - r) <= 1e-4 * (fabs(l) + 1), "adjoint: %.9g vs %.9g", l, r);
                free(g);
                free(bv);
            }
            /* and its inverse (a rotation): rope_backward(rope(x)) == x */
            CHECK_OK(lpx_rope_backward(y, fr, offset, &x32));
            if (x32 && dts[di] == LPX_F32) {
                double *xr = rd(x32);
                int worse = 0;
                for (int64_t i = 0; i < B * T * H * D; i++) worse += fabs(xr[i] - xv[i]) > 1e-5;
                CHECKF(worse == 0, "rope_backward(rope(x)) != x at %d values", worse);
                free(xr);
            }
            lpx_tensor_release(gt);
            lpx_tensor_release(y32);
            lpx_tensor_release(x32);
            free(xv), free(yv), free(fq);
        }
        lpx_tensor_release(x);
        lpx_tensor_release(y);
        lpx_tensor_release(back);
    }
    lpx_tensor_release(fr);
}

/* ---- errors -------------------------------------------------------------- */

static void test_errors(void)
{
    int64_t q4[4] = {1, 4, 4, 8}, k4[4] = {1, 4, 2, 8}, k3[4] = {1, 4, 3, 8}, kshort[4] = {1, 3, 2, 8},
            f4[1] = {4}, f3[1] = {3}, odd[4] = {1, 4, 2, 7}, l3[3] = {1, 4, 4}, lbad[3] = {1, 2, 4}, r3[3] = {4, 4, 8};
    lpx_tensor *q = mk_randn(LPX_F32, 4, q4, 1), *k = mk_randn(LPX_F32, 4, k4, 1), *v = mk_randn(LPX_F32, 4, k4, 1),
               *k_3 = mk_randn(LPX_F32, 4, k3, 1), *ks = mk_randn(LPX_F32, 4, kshort, 1),
               *kb = mk_randn(LPX_BF16, 4, k4, 1), *fr = mk_randn(LPX_F32, 1, f4, 1), *fr3 = mk_randn(LPX_F32, 1, f3, 1),
               *xo = mk_randn(LPX_F32, 4, odd, 1), *lse = mk_randn(LPX_F32, 3, l3, 1),
               *lseb = mk_randn(LPX_F32, 3, lbad, 1), *q3 = mk_randn(LPX_F32, 3, r3, 1), *o = NULL, *l = NULL;
    CHECK_ERR(lpx_attention(q, k_3, k_3, true, 0.5, &o, &l), LPX_ESHAPE);
    CHECK_MSG("the query heads must be a positive multiple of the key/value heads");
    CHECK(o == NULL && l == NULL);
    CHECK_ERR(lpx_attention(q, ks, ks, true, 0.5, &o, &l), LPX_ESHAPE);
    CHECK_MSG("causal attention needs at least as many keys");
    CHECK_OK(lpx_attention(q, ks, ks, false, 0.5, &o, &l));   /* fine without causal */
    lpx_tensor_release(o), lpx_tensor_release(l), o = l = NULL;
    CHECK_ERR(lpx_attention(q, kb, v, true, 0.5, &o, &l), LPX_EDTYPE);
    CHECK_MSG("q, k and v must share a dtype");
    CHECK_ERR(lpx_attention(q, k, ks, false, 0.5, &o, &l), LPX_ESHAPE);
    CHECK_MSG("must have one shape");
    CHECK_ERR(lpx_attention(q, k, v, true, 0.0, &o, &l), LPX_EINVAL);
    CHECK_MSG("scale 0 must be finite and > 0");
    CHECK_ERR(lpx_attention(q, k, v, true, NAN, &o, &l), LPX_EINVAL);
    CHECK_ERR(lpx_attention(q3, k, v, true, 0.5, &o, &l), LPX_ESHAPE);
    CHECK_MSG("attention: q [4, 4, 8] must be 4-D [batch, seq, heads, head_dim]");
    CHECK_ERR(lpx_attention(q, k, v, true, 0.5, NULL, &l), LPX_EINVAL);
    CHECK_ERR(lpx_attention_backward(q, q, k, v, q, lseb, true, 0.5, &o, NULL, NULL), LPX_ESHAPE);
    CHECK_MSG("attention_backward: lse [1, 2, 4] must be [1, 4, 4]");
    CHECK_ERR(lpx_attention_backward(k, q, k, v, q, lse, true, 0.5, &o, NULL, NULL), LPX_ESHAPE);
    CHECK_MSG("attention_backward: grad [1, 4, 2, 8] must have q [1, 4, 4, 8]'s shape");
    CHECK(o == NULL);
    CHECK_ERR(lpx_rope(xo, fr, 0, &o), LPX_ESHAPE);
    CHECK_MSG("rope needs an even head_dim");
    CHECK_ERR(lpx_rope(k, fr3, 0, &o), LPX_ESHAPE);
    CHECK_MSG("rope: inv_freq [3] must be [4] (head_dim / 2)");
    CHECK_ERR(lpx_rope(k, fr, -1, &o), LPX_ERANGE);
    CHECK_ERR(lpx_rope_backward(q3, fr, 0, &o), LPX_ESHAPE);
    CHECK_MSG("rope_backward: x [4, 4, 8] must be 4-D");
    lpx_tensor *rel_[] = {q, k, v, k_3, ks, kb, fr, fr3, xo, lse, lseb, q3};
    for (size_t i = 0; i < sizeof rel_ / sizeof *rel_; i++) lpx_tensor_release(rel_[i]);
}

int main(void)
{
    RUN(test_attention_gqa_causal);
    RUN(test_attention_mha_noncausal);
    RUN(test_attention_causal_bottom_right);
    RUN(test_attention_blocks);
    RUN(test_attention_strided);
    RUN(test_attention_bf16);
    RUN(test_attention_finite_difference);
    RUN(test_rope_reference);
    RUN(test_errors);
    return CHECK_DONE();
}
