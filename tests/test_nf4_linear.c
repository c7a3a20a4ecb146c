/* The nf4 tests, the NF4 linear and the QLoRA linear against f64 references,
 * and the adapter dropout op. */
#include "nf4_util.h"

static double rel_err(const float *a, const double *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- linear ------------------------------------------------------------------ */

/* y[m, n] = sum_k x[m, k] * w[n, k] + b[n], doubles */
static double *ref_linear(const float *x, const float *w, const float *b, int64_t M, int64_t N, int64_t K)
{
    double *y = malloc((size_t)(M * N + 1) * sizeof(double));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = b ? b[n] : 0.0;
            for (int64_t k = 0; k < K; k++) s += (double)x[m * K + k] * w[n * K + k];
            y[m * N + n] = s;
        }
    return y;
}

static void check_linear_case(int64_t M, int64_t N, int64_t K, lpx_dtype xdt, bool with_bias)
{
    int64_t xs[2] = {M, K}, ws[2] = {N, K}, bs[1] = {N};
    lpx_tensor *x = rand_normal(2, xs, 50, 1.0, xdt), *wd = rand_normal(2, ws, 51, 1.0, LPX_BF16), *b = rand_normal(1, bs, 52, 1.0, LPX_F32);
    lpx_tensor *w = NULL, *y = NULL, *wdq = NULL;
    CHECK_OK(lpx_nf4_quantize(wd, NULL, &w));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &wdq));
    CHECK_OK(lpx_linear(x, w, with_bias ? b : NULL, &y));
    if (y && wdq) {
        CHECK(lpx_tensor_dtype(y) == xdt && lpx_tensor_shape(y)[0] == M && lpx_tensor_shape(y)[1] == N);
        float *xv = values_f32(x), *yv = values_f32(y), *bv = values_f32(b);
        double *ref = ref_linear(xv, lpx_tensor_data(wdq), with_bias ? bv : NULL, M, N, K);
        double e = rel_err(yv, ref, M * N);
        CHECKF(e < (xdt == LPX_F32 ? 1e-5 : 1e-2), "linear [%lld,%lld]x[%lld,%lld]^T rel err %g", (long long)M,
               (long long)K, (long long)N, (long long)K, e);
        free(xv);
        free(yv);
        free(bv);
        free(ref);
    }
    lpx_tensor_release(y);
    lpx_tensor_release(wdq);
    lpx_tensor_release(w);
    lpx_tensor_release(x);
    lpx_tensor_release(wd);
    lpx_tensor_release(b);
}

static void test_linear(void)
{
    check_linear_case(5, 96, 200, LPX_F32, true);
    check_linear_case(3, 33, 70, LPX_BF16, false);
    check_linear_case(17, 300, 4000, LPX_F32, true);  /* W dequantized in two tiles of rows */
    check_linear_case(0, 16, 64, LPX_F32, true);
    /* matmul with a transposed nf4 weight = linear; grad_x = g @ W */
    int64_t xs[3] = {2, 3, 130}, ws[2] = {70, 130}, gs[3] = {2, 3, 70};
    lpx_tensor *x = rand_normal(3, xs, 60, 1.0, LPX_F32), *wd = rand_normal(2, ws, 61, 1.0, LPX_F32), *g = rand_normal(3, gs, 62, 1.0, LPX_F32);
    lpx_tensor *w = NULL, *wt = NULL, *y1 = NULL, *y2 = NULL, *gx = NULL, *gx2 = NULL, *wdq = NULL;
    CHECK_OK(lpx_nf4_quantize(wd, NULL, &w));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &wdq));
    CHECK_OK(lpx_nf4_linear(x, w, NULL, &y1));
    CHECK_OK(lpx_t(w, &wt));
    CHECK_OK(lpx_matmul(x, wt, &y2));
    if (y1 && y2) {
        CHECK(lpx_tensor_ndim(y1) == 3 && lpx_tensor_shape(y1)[2] == 70);
        CHECK(memcmp(lpx_tensor_data(y1), lpx_tensor_data(y2), 2 * 3 * 70 * sizeof(float)) == 0);
    }
    CHECK_OK(lpx_nf4_linear_backward(g, w, &gx));
    CHECK_OK(lpx_matmul(g, w, &gx2));
    if (gx && gx2 && wdq) {
        CHECK(lpx_tensor_shape(gx)[2] == 130);
        /* reference: g @ Wdq = linear with Wdq^T */
        const float *wv = lpx_tensor_data(wdq), *gv = lpx_tensor_data(g);
        double *ref = malloc(6 * 130 * sizeof(double));
        for (int m = 0; m < 6; m++)
            for (int k = 0; k < 130; k++) {
                double s = 0;
                for (int n = 0; n < 70; n++) s += (double)gv[m * 70 + n] * wv[n * 130 + k];
                ref[m * 130 + k] = s;
            }
        CHECK(rel_err(lpx_tensor_data(gx), ref, 6 * 130) < 1e-5);
        CHECK(memcmp(lpx_tensor_data(gx), lpx_tensor_data(gx2), 6 * 130 * sizeof(float)) == 0);
        free(ref);
    }
    /* errors name the op and the shapes */
    lpx_tensor *bad = NULL;
    CHECK_ERR(lpx_linear(g, w, NULL, &bad), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "linear") != NULL);
    CHECK_ERR(lpx_nf4_linear(x, wd, NULL, &bad), LPX_EINVAL);
    CHECK_ERR(lpx_linear(w, wd, NULL, &bad), LPX_ENOTIMPL);   /* nf4 as the input */
    CHECK(strstr(lpx_last_error(), "nf4") && strstr(lpx_last_error(), "linear"));
    lpx_tensor *outb = NULL;
    int64_t os[3] = {2, 3, 70};
    CHECK_OK(lpx_zeros(3, os, LPX_F32, lpx_cpu(), &outb));
    CHECK_OK(lpx_matmul_out(x, wt, outb));
    if (outb && y1) CHECK(memcmp(lpx_tensor_data(outb), lpx_tensor_data(y1), 6 * 70 * sizeof(float)) == 0);
    lpx_tensor *tmp[] = {x, wd, g, w, wt, y1, y2, gx, gx2, wdq, outb};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

/* ---- QLoRA ------------------------------------------------------------------- */

static void test_qlora(void)
{
    const int64_t M = 12, IN = 96, OUT = 40, R = 8;
    int64_t xs[3] = {3, 4, IN}, ws[2] = {OUT, IN}, as[2] = {R, IN}, bs[2] = {OUT, R}, bis[1] = {OUT};
    lpx_tensor *x = rand_normal(3, xs, 70, 1.0, LPX_F32), *wd = rand_normal(2, ws, 71, 1.0, LPX_F32), *a = rand_normal(2, as, 72, 1.0, LPX_F32);
    lpx_tensor *b = rand_normal(2, bs, 73, 1.0, LPX_F32), *bias = rand_normal(1, bis, 74, 1.0, LPX_F32), *g = NULL, *w = NULL, *wdq = NULL;
    int64_t gs[3] = {3, 4, OUT};
    g = rand_normal(3, gs, 75, 1.0, LPX_F32);
    CHECK_OK(lpx_nf4_quantize(wd, NULL, &w));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &wdq));
    for (int pass = 0; pass < 2 && wdq; pass++) {
        lpx_qlora_opts o = lpx_qlora_opts_default();
        o.alpha = 16.0;
        o.dropout = pass ? 0.25 : 0.0;
        o.seed = 1234;
        double s = o.alpha / (double)R;
        /* the mask: the dropout op applied to ones */
        double *mask = malloc((size_t)(M * IN) * sizeof(double));
        lpx_tensor *ones = NULL, *mk = NULL;
        int64_t xs2[2] = {M, IN};
        CHECK_OK(lpx_full(2, xs2, 1.0, LPX_F32, lpx_cpu(), &ones));
        lpx_value args[4] = {lpx_v_tensor(ones), lpx_v_f64(o.dropout), lpx_v_i64((int64_t)o.seed), lpx_v_dtype(LPX_F32)};
        lpx_call c;
        lpx_call_init(&c, LPX_OP_qlora_dropout, args, 4);
        CHECK_OK(lpx_dispatch(&c));
        mk = c.nrets ? c.rets[0].u.t : NULL;
        int dropped = 0;
        for (int64_t i = 0; i < M * IN; i++) {
            mask[i] = mk ? ((const float *)lpx_tensor_data(mk))[i] : 1.0;
            dropped += mask[i] == 0.0;
            CHECK(mask[i] == 0.0 || fabs(mask[i] - 1.0 / (1.0 - o.dropout)) < 1e-6);
        }
        if (pass) CHECKF(dropped > 0.15 * M * IN && dropped < 0.35 * M * IN, "dropped %d of %lld", dropped, (long long)(M * IN));
        else CHECK(dropped == 0);
        lpx_tensor_release(mk);
        lpx_tensor_release(ones);

        /* f64 reference */
        const float *xv = lpx_tensor_data(x), *wv = lpx_tensor_data(wdq), *av = lpx_tensor_data(a),
                    *bv = lpx_tensor_data(b), *biv = lpx_tensor_data(bias), *gv = lpx_tensor_data(g);
        double *xd = malloc((size_t)(M * IN) * sizeof(double)), *xa = calloc((size_t)(M * R), sizeof(double));
        double *y = calloc((size_t)(M * OUT), sizeof(double)), *gxa = calloc((size_t)(M * R), sizeof(double));
        double *gb = calloc((size_t)(OUT * R), sizeof(double)), *ga = calloc((size_t)(R * IN), sizeof(double));
        double *gx = calloc((size_t)(M * IN), sizeof(double));
        for (int64_t i = 0; i < M * IN; i++) xd[i] = xv[i] * mask[i];
        for (int64_t m = 0; m < M; m++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t k = 0; k < IN; k++) xa[m * R + r] += xd[m * IN + k] * av[r * IN + k];
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < OUT; n++) {
                double acc = biv[n];
                for (int64_t k = 0; k < IN; k++) acc += (double)xv[m * IN + k] * wv[n * IN + k];
                for (int64_t r = 0; r < R; r++) acc += s * xa[m * R + r] * bv[n * R + r];
                y[m * OUT + n] = acc;
            }
        for (int64_t m = 0; m < M; m++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t n = 0; n < OUT; n++) gxa[m * R + r] += s * gv[m * OUT + n] * bv[n * R + r];
        for (int64_t n = 0; n < OUT; n++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t m = 0; m < M; m++) gb[n * R + r] += s * gv[m * OUT + n] * xa[m * R + r];
        for (int64_t r = 0; r < R; r++)
            for (int64_t k = 0; k < IN; k++)
                for (int64_t m = 0; m < M; m++) ga[r * IN + k] += gxa[m * R + r] * xd[m * IN + k];
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < IN; k++) {
                double acc = 0, lora = 0;
                for (int64_t n = 0; n < OUT; n++) acc += (double)gv[m * OUT + n] * wv[n * IN + k];
                for (int64_t r = 0; r < R; r++) lora += gxa[m * R + r] * av[r * IN + k];
                gx[m * IN + k] = acc + lora * mask[m * IN + k];
            }

        lpx_tensor *out = NULL, *saved = NULL, *tgx = NULL, *tga = NULL, *tgb = NULL, *tga2 = NULL, *tgb2 = NULL;
        CHECK_OK(lpx_qlora_linear(x, w, bias, a, b, &o, &out, &saved));
        CHECK_OK(lpx_qlora_linear_backward(g, x, w, a, b, saved, &o, &tgx, &tga, &tgb));
        CHECK_OK(lpx_qlora_linear_backward(g, x, w, a, b, NULL, &o, NULL, &tga2, &tgb2));
        if (out && tgx && tga && tgb) {
            CHECK(lpx_tensor_ndim(out) == 3 && lpx_tensor_shape(out)[2] == OUT);
            CHECK(lpx_tensor_ndim(tgx) == 3 && lpx_tensor_shape(tgx)[2] == IN);
            double eo = rel_err(lpx_tensor_data(out), y, M * OUT), ex = rel_err(lpx_tensor_data(tgx), gx, M * IN);
            double ea = rel_err(lpx_tensor_data(tga), ga, R * IN), eb = rel_err(lpx_tensor_data(tgb), gb, OUT * R);
            printf("     QLoRA (dropout %.2f) vs f64: out %.2e, grad_x %.2e, grad_A %.2e, grad_B %.2e\n", o.dropout, eo,
                   ex, ea, eb);
            CHECK(eo < 1e-5 && ex < 1e-5);
            CHECK(ea < 1e-4 && eb < 1e-4);
        }
        if (tga && tga2 && tgb && tgb2) {
            CHECK(rel_err(lpx_tensor_data(tga2), ga, R * IN) < 1e-4);
            CHECK(rel_err(lpx_tensor_data(tgb2), gb, OUT * R) < 1e-4);
        }
        lpx_tensor *tmp[] = {out, saved, tgx, tga, tgb, tga2, tgb2};
        for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
        free(mask);
        free(xd);
        free(xa);
        free(y);
        free(gxa);
        free(gb);
        free(ga);
        free(gx);
    }
    /* bf16 activations with f32 adapters: adapter grads stay f32 */
    lpx_tensor *xb = NULL, *outb = NULL, *gab = NULL;
    CHECK_OK(lpx_cast(x, LPX_BF16, false, &xb));
    CHECK_OK(lpx_qlora_linear(xb, w, NULL, a, b, NULL, &outb, NULL));
    CHECK(outb && lpx_tensor_dtype(outb) == LPX_BF16);
    CHECK_OK(lpx_qlora_linear_backward(g, xb, w, a, b, NULL, NULL, NULL, &gab, NULL));
    CHECK(gab && lpx_tensor_dtype(gab) == LPX_F32);
    /* bad arguments */
    lpx_tensor *bad = NULL;
    lpx_qlora_opts o = lpx_qlora_opts_default();
    o.dropout = 1.0;
    CHECK_ERR(lpx_qlora_linear(x, w, NULL, a, b, &o, &bad, NULL), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "dropout") != NULL);
    CHECK_ERR(lpx_qlora_linear(x, w, NULL, b, a, NULL, &bad, NULL), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "A") != NULL);
    CHECK_ERR(lpx_qlora_linear(x, wd, NULL, a, b, NULL, &bad, NULL), LPX_EINVAL);
    lpx_tensor *tmp[] = {x, wd, a, b, bias, g, w, wdq, xb, outb, gab};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_dropout_op(void)
{
    int64_t s[1] = {100000};
    lpx_tensor *ones = NULL;
    CHECK_OK(lpx_full(1, s, 1.0, LPX_BF16, lpx_cpu(), &ones));
    lpx_tensor *m[3] = {NULL, NULL, NULL};
    uint64_t seeds[3] = {5, 5, 6};
    for (int k = 0; k < 3; k++) {
        lpx_value args[4] = {lpx_v_tensor(ones), lpx_v_f64(0.1), lpx_v_i64((int64_t)seeds[k]), lpx_v_dtype(LPX_F32)};
        lpx_call c;
        lpx_call_init(&c, LPX_OP_qlora_dropout, args, 4);
        CHECK_OK(lpx_dispatch(&c));
        m[k] = c.nrets ? c.rets[0].u.t : NULL;
    }
    if (m[0] && m[1] && m[2]) {
        const float *a = lpx_tensor_data(m[0]), *b = lpx_tensor_data(m[1]), *c = lpx_tensor_data(m[2]);
        int drop = 0, diff = 0;
        for (int i = 0; i < 100000; i++) {
            drop += a[i] == 0.0f;
            diff += (a[i] == 0.0f) != (c[i] == 0.0f);
        }
        CHECK(memcmp(a, b, 100000 * sizeof(float)) == 0);   /* same seed, same mask */
        CHECKF(drop > 9400 && drop < 10600, "dropped %d of 100000 at p = 0.1", drop);
        CHECK(diff > 1000);                                   /* another seed, another mask */
    }
    lpx_value bad[4] = {lpx_v_tensor(ones), lpx_v_f64(1.5), lpx_v_i64(0), lpx_v_dtype(LPX_F32)};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_qlora_dropout, bad, 4);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
    for (int k = 0; k < 3; k++) lpx_tensor_release(m[k]);
    lpx_tensor_release(ones);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_linear);
    RUN(test_qlora);
    RUN(test_dropout_op);
    RUN(test_no_leaks);
    return CHECK_DONE();
}
