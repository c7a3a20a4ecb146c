/* rmsnorm, softmax, cross-entropy, MSE loss, embedding and their backward
 * ops against float64 references computed here (forward values, analytic
 * gradients), finite-difference checks of the gradients through the
 * forward ops, non-contiguous and bf16/f16 inputs, and the error paths.
 * Tensors are built with lpx_tensor_new / lpx_tensor_view_of only. */
#include <stdint.h>
#include "lpx/meta.h"
#include "check.h"
#include "tensor_util.h"

LPX_API void lpx__fail_alloc_after(long n);

/* ---- helpers ------------------------------------------------------------ */

static lpx_tensor *mk_idx(lpx_dtype dt, int nd, const int64_t *shape, const int64_t *vals)
{
    lpx_tensor *t = NULL;
    if (lpx_tensor_new(dt, nd, shape, lpx_cpu(), &t)) return NULL;
    for (int64_t i = 0; i < lpx_tensor_numel(t); i++) {
        if (dt == LPX_I32) ((int32_t *)lpx_tensor_data(t))[i] = (int32_t)vals[i];
        else ((int64_t *)lpx_tensor_data(t))[i] = vals[i];
    }
    return t;
}

/* Relative tolerance of a result stored in dt (half an ulp, with margin). */
static double rel_of(lpx_dtype dt) { return dt == LPX_BF16 ? 0x1p-7 : dt == LPX_F16 ? 0x1p-9 : 1e-5; }

#define CHECK_MSG(s) CHECKF(strstr(lpx_last_error(), (s)) != NULL, "message '%s' lacks '%s'", lpx_last_error(), (s))

/* sum(a * b) over n values, in double */
static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- rmsnorm ------------------------------------------------------------ */

static void rms_ref(const double *x, const double *w, int64_t R, int64_t D, double eps, double *y, double *r)
{
    for (int64_t i = 0; i < R; i++) {
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += x[i * D + j] * x[i * D + j];
        r[i] = 1.0 / sqrt(ss / (double)D + eps);
        for (int64_t j = 0; j < D; j++) y[i * D + j] = x[i * D + j] * r[i] * (w ? w[j] : 1.0);
    }
}

static void rmsnorm_case(lpx_dtype dt, bool with_w, bool transposed)
{
    int64_t R1 = 3, R2 = 4, D = 8;
    double eps = 1e-5;
    lpx_tensor *x, *s = NULL;
    if (transposed) {
        /* [R1, R2, D] view of a [D, R2, R1] tensor: the last dim is strided */
        s = mk_randn(dt, 3, (int64_t[]){D, R2, R1}, 1.5);
        x = view(s, 3, (int64_t[]){R1, R2, D}, (int64_t[]){1, R1, R1 * R2}, 0);
    } else {
        x = mk_randn(dt, 3, (int64_t[]){R1, R2, D}, 1.5);
    }
    lpx_tensor *w = with_w ? mk_randn(dt, 1, (int64_t[]){D}, 1.0) : NULL, *y = NULL, *rstd = NULL;
    CHECK_OK(lpx_rmsnorm(x, w, eps, &y, &rstd));
    if (!y || !rstd) goto out;
    CHECK(shape_is(y, 3, (int64_t[]){R1, R2, D}) && lpx_tensor_dtype(y) == dt);
    CHECK(shape_is(rstd, 3, (int64_t[]){R1, R2, 1}) && lpx_tensor_dtype(rstd) == LPX_F32);
    int64_t R = R1 * R2;
    double *xv = rd(x), *wv = w ? rd(w) : NULL, *yv = rd(y), *rv = rd(rstd);
    double yr[96], rr[12];
    rms_ref(xv, wv, R, D, eps, yr, rr);
    CHECKF(cmp_close("y", yv, yr, R * D, rel_of(dt), 1e-6) == 0, "rmsnorm %s w=%d trans=%d", lpx_dtype_name(dt), with_w,
           transposed);
    CHECK(cmp_close("rstd", rv, rr, R, 1e-6, 0) == 0);

    /* backward against the analytic gradient */
    lpx_tensor *g = mk_randn(dt, 3, (int64_t[]){R1, R2, D}, 1.0), *gx = NULL, *gw = NULL;
    CHECK_OK(lpx_rmsnorm_backward(g, x, w, rstd, &gx, &gw));
    CHECK(with_w ? gw != NULL : gw == NULL);
    if (gx) {
        double *gv = rd(g), *gxv = rd(gx), gxr[96], gwr[8] = {0}, gxm[96];
        for (int64_t i = 0; i < R; i++) {
            double sgwx = 0, mag = 0;
            for (int64_t j = 0; j < D; j++) {
                double wj = wv ? wv[j] : 1.0;
                sgwx += gv[i * D + j] * wj * xv[i * D + j];
                mag += fabs(gv[i * D + j] * wj * xv[i * D + j]);
                gwr[j] += gv[i * D + j] * xv[i * D + j] * rv[i];
            }
            double r = rv[i];
            for (int64_t j = 0; j < D; j++) {
                double wj = wv ? wv[j] : 1.0;
                gxr[i * D + j] = r * gv[i * D + j] * wj - xv[i * D + j] * r * r * r * sgwx / (double)D;
                gxm[i * D + j] = fabs(r * gv[i * D + j] * wj) + fabs(xv[i * D + j] * r * r * r * mag / (double)D);
            }
        }
        int bad = 0;
        for (int64_t i = 0; i < R * D; i++)
            if (!(fabs(gxv[i] - gxr[i]) <= rel_of(dt) * gxm[i] + 1e-6)) bad++;
        CHECKF(bad == 0, "rmsnorm_backward grad_x %s w=%d trans=%d: %d bad", lpx_dtype_name(dt), with_w, transposed,
               bad);
        if (gw) {
            double *gwv = rd(gw);
            CHECK(lpx_tensor_dtype(gw) == dt && shape_is(gw, 1, (int64_t[]){D}));
            CHECK(cmp_close("grad_w", gwv, gwr, D, rel_of(dt), 1e-5) == 0);
            free(gwv);
        }
        free(gv);
        free(gxv);
    }
    lpx_tensor_release(g);
    lpx_tensor_release(gx);
    lpx_tensor_release(gw);
    free(xv);
    free(wv);
    free(yv);
    free(rv);
out:
    lpx_tensor_release(s);
    lpx_tensor_release(x);
    lpx_tensor_release(w);
    lpx_tensor_release(y);
    lpx_tensor_release(rstd);
}

static void test_rmsnorm(void)
{
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16, LPX_F16};
    for (int d = 0; d < 3; d++)
        for (int w = 0; w < 2; w++)
            for (int t = 0; t < 2; t++) rmsnorm_case(dts[d], w, t);
}

/* L(x, w) = sum(rmsnorm(x, w) * g): central differences through the
 * forward op agree with rmsnorm_backward for x and w. */
static double rms_loss(lpx_tensor *x, lpx_tensor *w, const double *g)
{
    lpx_tensor *y = NULL, *r = NULL;
    if (lpx_rmsnorm(x, w, 1e-6, &y, &r)) return NAN;
    double *yv = rd(y), l = dot(yv, g, lpx_tensor_numel(y));
    free(yv);
    lpx_tensor_release(y);
    lpx_tensor_release(r);
    return l;
}

static void test_rmsnorm_finite_difference(void)
{
    int64_t shape[2] = {3, 6};
    lpx_tensor *x = mk_randn(LPX_F32, 2, shape, 1.0), *w = mk_randn(LPX_F32, 1, (int64_t[]){6}, 1.0);
    lpx_tensor *g = mk_randn(LPX_F32, 2, shape, 1.0), *y = NULL, *rstd = NULL, *gx = NULL, *gw = NULL;
    double *gv = rd(g);
    CHECK_OK(lpx_rmsnorm(x, w, 1e-6, &y, &rstd));
    CHECK_OK(lpx_rmsnorm_backward(g, x, w, rstd, &gx, &gw));
    if (gx && gw) {
        double *gxv = rd(gx), *gwv = rd(gw), h = 1e-2;
        for (int64_t i = 0; i < 18; i++) {
            double *xv = rd(x), x0 = xv[i];
            wr(x, i, x0 + h);
            double lp = rms_loss(x, w, gv);
            wr(x, i, x0 - h);
            double lm = rms_loss(x, w, gv);
            wr(x, i, x0);
            double fd = (lp - lm) / (2 * h);
            CHECKF(fabs(fd - gxv[i]) <= 2e-2 * fabs(gxv[i]) + 2e-3, "d/dx[%lld]: fd %.6g vs %.6g", (long long)i, fd,
                   gxv[i]);
            free(xv);
        }
        for (int64_t j = 0; j < 6; j++) {
            double *wv = rd(w), w0 = wv[j];
            wr(w, j, w0 + h);
            double lp = rms_loss(x, w, gv);
            wr(w, j, w0 - h);
            double lm = rms_loss(x, w, gv);
            wr(w, j, w0);
            double fd = (lp - lm) / (2 * h);
            CHECKF(fabs(fd - gwv[j]) <= 1e-3 * fabs(gwv[j]) + 1e-3, "d/dw[%lld]: fd %.6g vs %.6g", (long long)j, fd,
                   gwv[j]);
            free(wv);
        }
        free(gxv);
        free(gwv);
    }
    free(gv);
    lpx_tensor *objs[] = {x, w, g, y, rstd, gx, gw};
    for (size_t i = 0; i < 7; i++) lpx_tensor_release(objs[i]);
}

/* The boxed op always returns grad_w (sum of grad * x * rstd over rows),
 * even without a weight; the typed API hands it out only with a weight. */
static void test_rmsnorm_backward_boxed(void)
{
    int64_t shape[2] = {2, 3};
    lpx_tensor *x = mk_randn(LPX_F32, 2, shape, 1.0), *g = mk_randn(LPX_F32, 2, shape, 1.0), *y = NULL, *rstd = NULL;
    CHECK_OK(lpx_rmsnorm(x, NULL, 1e-6, &y, &rstd));
    lpx_value args[4] = {lpx_v_tensor(g), lpx_v_tensor(x), lpx_v_none(), lpx_v_tensor(rstd)};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_rmsnorm_backward, args, 4);
    CHECK_OK(lpx_dispatch(&c));
    CHECK(c.nrets == 2);
    if (c.nrets == 2) {
        double *gv = rd(g), *xv = rd(x), *rv = rd(rstd), *gwv = rd(c.rets[1].u.t), ref[3] = {0};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) ref[j] += gv[i * 3 + j] * xv[i * 3 + j] * rv[i];
        CHECK(cmp_close("grad_w", gwv, ref, 3, 1e-5, 1e-6) == 0);
        free(gv);
        free(xv);
        free(rv);
        free(gwv);
    }
    lpx_call_release_rets(&c);
    /* rstd may be dropped by passing NULL */
    lpx_tensor *y2 = NULL;
    CHECK_OK(lpx_rmsnorm(x, NULL, 1e-6, &y2, NULL));
    lpx_tensor_release(y2);
    lpx_tensor_release(x);
    lpx_tensor_release(g);
    lpx_tensor_release(y);
    lpx_tensor_release(rstd);
}

/* ---- softmax ------------------------------------------------------------ */

static void softmax_ref(const double *x, int nd, const int64_t *shape, int dim, double *y)
{
    int64_t n = numel_of(nd, shape), L = shape[dim], inner = 1;
    for (int d = dim + 1; d < nd; d++) inner *= shape[d];
    for (int64_t q = 0; q < n / L; q++) {
        int64_t base = (q / inner) * L * inner + q % inner;
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < L; i++) m = fmax(m, x[base + i * inner]);
        for (int64_t i = 0; i < L; i++) s += exp(x[base + i * inner] - m);
        for (int64_t i = 0; i < L; i++) y[base + i * inner] = exp(x[base + i * inner] - m) / s;
    }
}

static void softmax_case(lpx_dtype dt, int dim, bool transposed, double scale)
{
    int64_t shape[3] = {3, 4, 5};
    lpx_tensor *s = NULL, *x;
    if (transposed) {
        s = mk_randn(dt, 3, (int64_t[]){5, 4, 3}, scale);
        x = view(s, 3, shape, (int64_t[]){1, 3, 12}, 0);
    } else {
        x = mk_randn(dt, 3, shape, scale);
    }
    int d = dim < 0 ? dim + 3 : dim;
    lpx_tensor *y = NULL, *g = mk_randn(dt, 3, shape, 1.0), *gx = NULL;
    CHECK_OK(lpx_softmax(x, dim, &y));
    if (!y) goto out;
    CHECK(shape_is(y, 3, shape) && lpx_tensor_dtype(y) == dt);
    double *xv = rd(x), *yv = rd(y), yr[60];
    softmax_ref(xv, 3, shape, d, yr);
    CHECKF(cmp_close("softmax", yv, yr, 60, rel_of(dt), 1e-7) == 0, "softmax %s dim %d trans %d scale %g",
           lpx_dtype_name(dt), dim, transposed, scale);
    /* backward: y * (g - sum(g * y)) along dim, from the op's own y */
    CHECK_OK(lpx_softmax_backward(g, y, dim, &gx));
    if (gx) {
        double *gv = rd(g), *gxv = rd(gx), gr[60], yy[60];
        memcpy(yy, yv, sizeof yy);
        int64_t L = shape[d], inner = 1;
        for (int k = d + 1; k < 3; k++) inner *= shape[k];
        for (int64_t q = 0; q < 60 / L; q++) {
            int64_t base = (q / inner) * L * inner + q % inner;
            double sgy = 0;
            for (int64_t i = 0; i < L; i++) sgy += gv[base + i * inner] * yy[base + i * inner];
            for (int64_t i = 0; i < L; i++) gr[base + i * inner] = yy[base + i * inner] * (gv[base + i * inner] - sgy);
        }
        CHECK(cmp_close("softmax_backward", gxv, gr, 60, rel_of(dt), rel_of(dt) * 0.1) == 0);
        free(gv);
        free(gxv);
    }
    free(xv);
    free(yv);
out:
    lpx_tensor_release(s);
    lpx_tensor_release(x);
    lpx_tensor_release(y);
    lpx_tensor_release(g);
    lpx_tensor_release(gx);
}

static void test_softmax(void)
{
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16, LPX_F16};
    for (int k = 0; k < 3; k++)
        for (int dim = -1; dim < 3; dim++)
            for (int t = 0; t < 2; t++) softmax_case(dts[k], dim, t, 2.0);
    /* logits in the thousands: max subtraction keeps exp finite */
    softmax_case(LPX_F32, 1, false, 1000.0);
    softmax_case(LPX_F32, -1, true, 3000.0);

    /* a scalar: softmax over its only element is 1 */
    lpx_tensor *s = mk(LPX_F32, 0, NULL, (double[]){42.0}), *y = NULL;
    CHECK_OK(lpx_softmax(s, -1, &y));
    if (y) CHECK(*(float *)lpx_tensor_data(y) == 1.0f);
    lpx_tensor_release(y);
    lpx_tensor_release(s);
}

static double softmax_loss(lpx_tensor *x, int dim, const double *g)
{
    lpx_tensor *y = NULL;
    if (lpx_softmax(x, dim, &y)) return NAN;
    double *yv = rd(y), l = dot(yv, g, lpx_tensor_numel(y));
    free(yv);
    lpx_tensor_release(y);
    return l;
}

static void test_softmax_finite_difference(void)
{
    int64_t shape[2] = {3, 5};
    lpx_tensor *x = mk_randn(LPX_F32, 2, shape, 1.0), *g = mk_randn(LPX_F32, 2, shape, 1.0), *y = NULL, *gx = NULL;
    double *gv = rd(g);
    for (int dim = 0; dim < 2; dim++) {
        CHECK_OK(lpx_softmax(x, dim, &y));
        CHECK_OK(lpx_softmax_backward(g, y, dim, &gx));
        if (gx) {
            double *gxv = rd(gx), h = 1e-2;
            for (int64_t i = 0; i < 15; i++) {
                double *xv = rd(x), x0 = xv[i];
                wr(x, i, x0 + h);
                double lp = softmax_loss(x, dim, gv);
                wr(x, i, x0 - h);
                double lm = softmax_loss(x, dim, gv);
                wr(x, i, x0);
                double fd = (lp - lm) / (2 * h);
                CHECKF(fabs(fd - gxv[i]) <= 1e-2 * fabs(gxv[i]) + 1e-3, "dim %d d/dx[%lld]: fd %.6g vs %.6g", dim,
                       (long long)i, fd, gxv[i]);
                free(xv);
            }
            free(gxv);
        }
        lpx_tensor_release(y);
        lpx_tensor_release(gx);
        y = gx = NULL;
    }
    free(gv);
    lpx_tensor_release(x);
    lpx_tensor_release(g);
}

/* ---- cross-entropy ------------------------------------------------------ */

static double ce_ref(const double *l, const int64_t *t, int64_t N, int64_t C, int64_t ignore, double grad,
                     double *gl)
{
    double total = 0;
    int64_t count = 0;
    for (int64_t n = 0; n < N; n++)
        if (t[n] != ignore) count++;
    for (int64_t n = 0; n < N; n++) {
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < C; c++) m = fmax(m, l[n * C + c]);
        for (int64_t c = 0; c < C; c++) s += exp(l[n * C + c] - m);
        double lse = m + log(s);
        for (int64_t c = 0; c < C; c++)
            gl[n * C + c] = t[n] == ignore || !count
                                ? 0.0
                                : grad / (double)count * (exp(l[n * C + c] - lse) - (c == t[n] ? 1.0 : 0.0));
        if (t[n] != ignore) total += lse - l[n * C + t[n]];
    }
    return count ? total / (double)count : 0.0;
}

static void ce_case(lpx_dtype dt, lpx_dtype tdt, bool strided, double scale, const int64_t *tv)
{
    int64_t N = 6, C = 5, ignore = -100;
    lpx_tensor *s = NULL, *logits, *ts = NULL, *target;
    if (strided) {
        s = mk_randn(dt, 2, (int64_t[]){C, N}, scale);
        logits = view(s, 2, (int64_t[]){N, C}, (int64_t[]){1, N}, 0);
        int64_t t2[12];
        for (int i = 0; i < 12; i++) t2[i] = i % 2 ? 99 : tv[i / 2];
        ts = mk_idx(tdt, 1, (int64_t[]){12}, t2);
        target = view(ts, 1, (int64_t[]){N}, (int64_t[]){2}, 0);
    } else {
        logits = mk_randn(dt, 2, (int64_t[]){N, C}, scale);
        target = mk_idx(tdt, 1, (int64_t[]){N}, tv);
    }
    lpx_tensor *loss = NULL, *gl = NULL;
    CHECK_OK(lpx_cross_entropy(logits, target, ignore, &loss));
    CHECK_OK(lpx_cross_entropy_backward(logits, target, ignore, 0.75, &gl));
    if (loss && gl) {
        /* the loss of 16-bit logits comes in f32 (not rounded to bf16/f16) */
        CHECK(lpx_tensor_ndim(loss) == 0 && lpx_tensor_dtype(loss) == lpx_meta_cross_entropy_dtype(dt));
        CHECK(lpx_meta_cross_entropy_dtype(dt) == (dt == LPX_BF16 || dt == LPX_F16 ? LPX_F32 : dt));
        CHECK(shape_is(gl, 2, (int64_t[]){N, C}) && lpx_tensor_dtype(gl) == dt);
        double *lv = rd(logits), *lossv = rd(loss), *glv = rd(gl), glr[30];
        double ref = ce_ref(lv, tv, N, C, ignore, 0.75, glr);
        /* the mean of any logits' dtype is an f32 (or wider) number: f32's
         * rounding, not the logits' (regression: bf16 logits gave a bf16 loss) */
        CHECKF(isfinite(lossv[0]) && fabs(lossv[0] - ref) <= 1e-6 * fabs(ref) + 1e-6,
               "cross_entropy %s/%s strided %d scale %g: %.9g vs %.9g", lpx_dtype_name(dt), lpx_dtype_name(tdt),
               strided, scale, lossv[0], ref);
        CHECK(cmp_close("grad_logits", glv, glr, N * C, rel_of(dt), 1e-7) == 0);
        free(lv);
        free(lossv);
        free(glv);
    }
    lpx_tensor_release(s);
    lpx_tensor_release(ts);
    lpx_tensor_release(logits);
    lpx_tensor_release(target);
    lpx_tensor_release(loss);
    lpx_tensor_release(gl);
}

static void test_cross_entropy(void)
{
    static const int64_t tv[6] = {0, 4, -100, 2, 1, 4};
    static const int64_t all_ignored[6] = {-100, -100, -100, -100, -100, -100};
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16, LPX_F16};
    for (int d = 0; d < 3; d++)
        for (int st = 0; st < 2; st++) {
            ce_case(dts[d], LPX_I64, st, 2.0, tv);
            ce_case(dts[d], LPX_I32, st, 2.0, tv);
        }
    ce_case(LPX_F32, LPX_I64, false, 1e4, tv);  /* log-sum-exp keeps it finite */
    ce_case(LPX_F32, LPX_I64, true, 1e4, tv);
    ce_case(LPX_F32, LPX_I32, false, 1.0, all_ignored);  /* loss 0, zero gradient */
}

static double ce_loss(lpx_tensor *logits, lpx_tensor *target)
{
    lpx_tensor *l = NULL;
    if (lpx_cross_entropy(logits, target, 3, &l)) return NAN;
    double v = *(float *)lpx_tensor_data(l);
    lpx_tensor_release(l);
    return v;
}

static void test_cross_entropy_finite_difference(void)
{
    lpx_tensor *logits = mk_randn(LPX_F32, 2, (int64_t[]){4, 6}, 1.0);
    lpx_tensor *target = mk_idx(LPX_I64, 1, (int64_t[]){4}, (int64_t[]){5, 3, 0, 2}), *gl = NULL;
    CHECK_OK(lpx_cross_entropy_backward(logits, target, 3, 1.0, &gl));
    if (gl) {
        double *glv = rd(gl), h = 1e-2;
        for (int64_t i = 0; i < 24; i++) {
            double *lv = rd(logits), l0 = lv[i];
            wr(logits, i, l0 + h);
            double lp = ce_loss(logits, target);
            wr(logits, i, l0 - h);
            double lm = ce_loss(logits, target);
            wr(logits, i, l0);
            double fd = (lp - lm) / (2 * h);
            CHECKF(fabs(fd - glv[i]) <= 1e-2 * fabs(glv[i]) + 1e-3, "d/dlogits[%lld]: fd %.6g vs %.6g", (long long)i,
                   fd, glv[i]);
            free(lv);
        }
        for (int64_t i = 6; i < 12; i++) CHECK(glv[i] == 0.0);  /* row 1 is ignored (target 3) */
        free(glv);
    }
    lpx_tensor_release(logits);
    lpx_tensor_release(target);
    lpx_tensor_release(gl);
}

/* ---- MSE ------------------------------------------------------------------ */

static void test_mse(void)
{
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16};
    for (int d = 0; d < 2; d++) {
        lpx_dtype dt = dts[d];
        lpx_tensor *s = mk_randn(dt, 2, (int64_t[]){5, 4}, 1.0);
        lpx_tensor *a = view(s, 2, (int64_t[]){4, 5}, (int64_t[]){1, 4}, 0);
        lpx_tensor *b = mk_randn(dt, 2, (int64_t[]){4, 5}, 1.0), *loss = NULL, *ga = NULL;
        CHECK_OK(lpx_mse_loss(a, b, &loss));
        CHECK_OK(lpx_mse_loss_backward(a, b, 3.0, &ga));
        if (loss && ga) {
            double *av = rd(a), *bv = rd(b), *lv = rd(loss), *gv = rd(ga), ref = 0, gr[20];
            for (int i = 0; i < 20; i++) {
                ref += (av[i] - bv[i]) * (av[i] - bv[i]) / 20.0;
                gr[i] = 2.0 * 3.0 * (av[i] - bv[i]) / 20.0;
            }
            CHECK(lpx_tensor_ndim(loss) == 0 && lpx_tensor_dtype(loss) == dt);
            CHECK(fabs(lv[0] - ref) <= rel_of(dt) * ref);
            CHECK(shape_is(ga, 2, (int64_t[]){4, 5}) && lpx_tensor_dtype(ga) == dt);
            CHECK(cmp_close("mse grad", gv, gr, 20, rel_of(dt), 1e-7) == 0);
            free(av);
            free(bv);
            free(lv);
            free(gv);
        }
        /* finite difference on one element (f32 only) */
        if (dt == LPX_F32 && ga) {
            double *gv = rd(ga), *av = rd(a), h = 1e-2, a0 = av[7];
            lpx_tensor *lp = NULL, *lm = NULL;
            wr(a, 7, a0 + h);
            CHECK_OK(lpx_mse_loss(a, b, &lp));
            wr(a, 7, a0 - h);
            CHECK_OK(lpx_mse_loss(a, b, &lm));
            wr(a, 7, a0);
            if (lp && lm) {
                double fd = 3.0 * (*(float *)lpx_tensor_data(lp) - *(float *)lpx_tensor_data(lm)) / (2 * h);
                CHECK_NEAR(fd, gv[7], 1e-3);
            }
            lpx_tensor_release(lp);
            lpx_tensor_release(lm);
            free(gv);
            free(av);
        }
        lpx_tensor_release(s);
        lpx_tensor_release(a);
        lpx_tensor_release(b);
        lpx_tensor_release(loss);
        lpx_tensor_release(ga);
    }
}

/* ---- embedding ------------------------------------------------------------ */

static void embedding_case(lpx_dtype wdt, lpx_dtype idt, bool transposed_w)
{
    int64_t V = 7, D = 4;
    lpx_tensor *s = NULL, *w;
    if (transposed_w) {
        s = mk_randn(wdt, 2, (int64_t[]){D, V}, 1.0);
        w = view(s, 2, (int64_t[]){V, D}, (int64_t[]){1, V}, 0);
    } else {
        w = mk_randn(wdt, 2, (int64_t[]){V, D}, 1.0);
    }
    static const int64_t iv[6] = {3, 0, 6, 3, 3, 1};
    lpx_tensor *idx = mk_idx(idt, 2, (int64_t[]){2, 3}, iv), *y = NULL;
    CHECK_OK(lpx_embedding(w, idx, &y));
    if (y) {
        CHECK(shape_is(y, 3, (int64_t[]){2, 3, D}) && lpx_tensor_dtype(y) == wdt);
        double *wv = rd(w), *yv = rd(y);
        int bad = 0;
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < D; j++) bad += yv[i * D + j] != wv[iv[i] * D + j];  /* exact copies */
        CHECKF(bad == 0, "embedding %s/%s trans %d: %d bad", lpx_dtype_name(wdt), lpx_dtype_name(idt), transposed_w,
               bad);
        free(wv);
        free(yv);
    }
    /* backward: rows of grad scatter-added into [V, D] (index 3 thrice) */
    lpx_tensor *g = mk_randn(wdt, 3, (int64_t[]){2, 3, D}, 1.0), *gw = NULL;
    CHECK_OK(lpx_embedding_backward(g, idx, V, &gw));
    if (gw) {
        CHECK(shape_is(gw, 2, (int64_t[]){V, D}) && lpx_tensor_dtype(gw) == wdt);
        double *gv = rd(g), *gwv = rd(gw), ref[28] = {0};
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < D; j++) ref[iv[i] * D + j] += gv[i * D + j];
        CHECK(cmp_close("embedding_backward", gwv, ref, V * D, rel_of(wdt), 1e-6) == 0);
        for (int j = 0; j < D; j++) CHECK(gwv[2 * D + j] == 0.0);  /* row 2 never indexed */
        free(gv);
        free(gwv);
    }
    lpx_tensor_release(s);
    lpx_tensor_release(w);
    lpx_tensor_release(idx);
    lpx_tensor_release(y);
    lpx_tensor_release(g);
    lpx_tensor_release(gw);
}

static void test_embedding(void)
{
    static const lpx_dtype wd[] = {LPX_F32, LPX_BF16, LPX_F16};
    for (int d = 0; d < 3; d++)
        for (int t = 0; t < 2; t++) {
            embedding_case(wd[d], LPX_I64, t);
            embedding_case(wd[d], LPX_I32, t);
        }
    /* strided indices and empty ones */
    lpx_tensor *w = mk_randn(LPX_F32, 2, (int64_t[]){5, 3}, 1.0);
    lpx_tensor *is = mk_idx(LPX_I32, 1, (int64_t[]){6}, (int64_t[]){4, 9, 0, 9, 2, 9});
    lpx_tensor *iv = view(is, 1, (int64_t[]){3}, (int64_t[]){2}, 0), *y = NULL;
    CHECK_OK(lpx_embedding(w, iv, &y));
    if (y) {
        double *wv = rd(w), *yv = rd(y);
        CHECK(yv[0] == wv[12] && yv[3] == wv[0] && yv[8] == wv[8]);
        free(wv);
        free(yv);
    }
    lpx_tensor_release(y);
    y = NULL;
    lpx_tensor *ie = mk_idx(LPX_I64, 1, (int64_t[]){0}, NULL);
    CHECK_OK(lpx_embedding(w, ie, &y));
    CHECK(shape_is(y, 2, (int64_t[]){0, 3}));
    lpx_tensor_release(y);
    y = NULL;
    lpx_tensor *ge = mk_randn(LPX_BF16, 2, (int64_t[]){0, 3}, 1.0);
    CHECK_OK(lpx_embedding_backward(ge, ie, 4, &y));
    if (y) {
        double *yv = rd(y);
        CHECK(shape_is(y, 2, (int64_t[]){4, 3}));
        for (int i = 0; i < 12; i++) CHECK(yv[i] == 0.0);
        free(yv);
    }
    lpx_tensor_release(y);
    lpx_tensor_release(ge);
    lpx_tensor_release(ie);
    lpx_tensor_release(iv);
    lpx_tensor_release(is);
    lpx_tensor_release(w);
}

/* ---- errors ---------------------------------------------------------------- */

static lpx_status redispatch_fallback(lpx_call *c) { return lpx_redispatch(c); }

static void test_errors(void)
{
    lpx_tensor *x = mk_randn(LPX_F32, 2, (int64_t[]){2, 4}, 1.0), *y = NULL, *r = NULL;
    lpx_tensor *w3 = mk_randn(LPX_F32, 1, (int64_t[]){3}, 1.0), *s0 = mk(LPX_F32, 0, NULL, (double[]){1});
    lpx_tensor *xi = mk_idx(LPX_I32, 2, (int64_t[]){2, 4}, (int64_t[]){1, 2, 3, 4, 5, 6, 7, 8});

    /* rmsnorm */
    CHECK_ERR(lpx_rmsnorm(NULL, NULL, 1e-6, &y, &r), LPX_EINVAL);
    CHECK_ERR(lpx_rmsnorm(x, NULL, 1e-6, NULL, &r), LPX_EINVAL);
    CHECK_ERR(lpx_rmsnorm(x, w3, 1e-6, &y, &r), LPX_ESHAPE);
    CHECK_MSG("rmsnorm: weight [3] must be [4] for x [2, 4]");
    CHECK_ERR(lpx_rmsnorm(xi, NULL, 1e-6, &y, &r), LPX_EDTYPE);
    CHECK_MSG("i32");
    CHECK_ERR(lpx_rmsnorm(s0, NULL, 1e-6, &y, &r), LPX_ESHAPE);
    CHECK(y == NULL && r == NULL);
    lpx_tensor *rs = NULL, *gx = NULL, *gw = NULL;
    CHECK_OK(lpx_rmsnorm(x, NULL, 1e-6, &y, &rs));
    lpx_tensor_release(y);
    y = NULL;
    lpx_tensor *g3 = mk_randn(LPX_F32, 2, (int64_t[]){2, 3}, 1.0);
    CHECK_ERR(lpx_rmsnorm_backward(g3, x, NULL, rs, &gx, &gw), LPX_ESHAPE);
    CHECK_MSG("grad [2, 3] and x [2, 4]");
    CHECK_ERR(lpx_rmsnorm_backward(x, x, NULL, w3, &gx, &gw), LPX_ESHAPE);
    CHECK_MSG("rstd [3] has 3 elements");
    CHECK_ERR(lpx_rmsnorm_backward(x, x, NULL, rs, NULL, &gw), LPX_EINVAL);
    CHECK_ERR(lpx_rmsnorm_backward(x, x, NULL, NULL, &gx, &gw), LPX_EINVAL);
    CHECK(gx == NULL && gw == NULL);

    /* softmax */
    CHECK_ERR(lpx_softmax(x, 2, &y), LPX_ERANGE);
    CHECK_MSG("softmax: dim 2 out of range");
    CHECK_ERR(lpx_softmax(x, -3, &y), LPX_ERANGE);
    CHECK_ERR(lpx_softmax(xi, 0, &y), LPX_EDTYPE);
    CHECK_ERR(lpx_softmax(NULL, 0, &y), LPX_EINVAL);
    CHECK_ERR(lpx_softmax_backward(g3, x, 1, &y), LPX_ESHAPE);
    CHECK_ERR(lpx_softmax_backward(x, x, 5, &y), LPX_ERANGE);

    /* cross-entropy */
    lpx_tensor *logits = mk_randn(LPX_F32, 2, (int64_t[]){3, 5}, 1.0);
    lpx_tensor *tbad = mk_idx(LPX_I64, 1, (int64_t[]){3}, (int64_t[]){0, 1, 7});
    lpx_tensor *tneg = mk_idx(LPX_I32, 1, (int64_t[]){3}, (int64_t[]){-1, 1, 2});
    lpx_tensor *tf = mk(LPX_F32, 1, (int64_t[]){3}, (double[]){0, 1, 2});
    lpx_tensor *tshort = mk_idx(LPX_I64, 1, (int64_t[]){2}, (int64_t[]){0, 1});
    lpx_tensor *tok = mk_idx(LPX_I64, 1, (int64_t[]){3}, (int64_t[]){0, 1, 2});
    CHECK_ERR(lpx_cross_entropy(logits, tbad, -100, &y), LPX_ERANGE);
    CHECK_MSG("cross_entropy: target[2] = 7 is out of range [0, 5)");
    CHECK_ERR(lpx_cross_entropy_backward(logits, tbad, -100, 1.0, &y), LPX_ERANGE);
    CHECK_MSG("target[2] = 7");
    CHECK_ERR(lpx_cross_entropy(logits, tneg, -100, &y), LPX_ERANGE);
    CHECK_MSG("target[0] = -1");
    CHECK_ERR(lpx_cross_entropy(logits, tf, -100, &y), LPX_EDTYPE);
    CHECK_MSG("target has dtype f32");
    CHECK_ERR(lpx_cross_entropy(logits, tshort, -100, &y), LPX_ESHAPE);
    CHECK_MSG("target [2] must be [3]");
    CHECK_ERR(lpx_cross_entropy(w3, tok, -100, &y), LPX_ESHAPE);
    CHECK_MSG("logits [3] must be [N, C]");
    CHECK_ERR(lpx_cross_entropy(xi, tok, -100, &y), LPX_EDTYPE);
    CHECK_ERR(lpx_cross_entropy(logits, NULL, -100, &y), LPX_EINVAL);
    CHECK_ERR(lpx_cross_entropy(logits, tok, -100, NULL), LPX_EINVAL);

    /* mse */
    CHECK_ERR(lpx_mse_loss(x, g3, &y), LPX_ESHAPE);
    CHECK_MSG("mse_loss: a [2, 4] and b [2, 3]");
    CHECK_ERR(lpx_mse_loss_backward(x, g3, 1.0, &y), LPX_ESHAPE);
    CHECK_ERR(lpx_mse_loss(x, xi, &y), LPX_EDTYPE);

    /* embedding */
    lpx_tensor *emb = mk_randn(LPX_F32, 2, (int64_t[]){5, 2}, 1.0);
    lpx_tensor *ibad = mk_idx(LPX_I64, 2, (int64_t[]){2, 3}, (int64_t[]){0, 1, 2, 3, 4, 5});
    lpx_tensor *ineg = mk_idx(LPX_I32, 1, (int64_t[]){2}, (int64_t[]){1, -2});
    CHECK_ERR(lpx_embedding(emb, ibad, &y), LPX_ERANGE);
    CHECK_MSG("embedding: indices[1, 2] = 5 is out of range [0, 5)");
    CHECK_ERR(lpx_embedding(emb, ineg, &y), LPX_ERANGE);
    CHECK_MSG("indices[1] = -2");
    CHECK_ERR(lpx_embedding(emb, tf, &y), LPX_EDTYPE);
    CHECK_MSG("indices has dtype f32");
    CHECK_ERR(lpx_embedding(w3, tok, &y), LPX_ESHAPE);
    CHECK_MSG("weight [3] must be [V, D]");
    lpx_tensor *g23 = mk_randn(LPX_F32, 3, (int64_t[]){2, 3, 2}, 1.0);
    CHECK_ERR(lpx_embedding_backward(g23, ibad, 5, &y), LPX_ERANGE);
    CHECK_MSG("embedding_backward: indices[1, 2] = 5");
    CHECK_ERR(lpx_embedding_backward(g23, ibad, -1, &y), LPX_EINVAL);
    CHECK_MSG("num_weights -1");
    CHECK_ERR(lpx_embedding_backward(x, ibad, 9, &y), LPX_ESHAPE);
    CHECK_ERR(lpx_embedding_backward(g23, tf, 9, &y), LPX_EDTYPE);
    CHECK(y == NULL);

    /* kind tensors */
    static const lpx_kind_i kvt = {.struct_size = sizeof(lpx_kind_i), .abi_version = LPX_KIND_ABI_VERSION,
                                   .name = "test_nn_kind", .priority = LPX_PRIORITY_PAYLOAD};
    const lpx_kind *kind = NULL;
    CHECK_OK(lpx_kind_register(&kvt, &kind));
    lpx_tensor *kt = NULL;
    CHECK_OK(lpx_tensor_new_kind(kind, LPX_F32, 2, (int64_t[]){3, 5}, lpx_cpu(), &logits, 1, NULL, 0, &kt));
    CHECK_ERR(lpx_softmax(kt, 0, &y), LPX_ENOTIMPL);
    CHECK_OK(lpx_fallback_register(lpx_kind_key(kind), redispatch_fallback, NULL));
    CHECK_ERR(lpx_softmax(kt, 0, &y), LPX_EINVAL);
    CHECK_MSG("test_nn_kind");
    CHECK_ERR(lpx_cross_entropy(kt, tok, -100, &y), LPX_EINVAL);
    CHECK_ERR(lpx_rmsnorm(kt, NULL, 1e-6, &y, &r), LPX_EINVAL);
    CHECK_ERR(lpx_embedding(kt, tok, &y), LPX_EINVAL);
    CHECK_ERR(lpx_mse_loss(kt, logits, &y), LPX_EINVAL);
    CHECK(y == NULL);
    lpx_tensor_release(kt);
    CHECK_OK(lpx_kind_unregister(kind));

    lpx_tensor *objs[] = {x, w3, s0, xi, rs, g3, logits, tbad, tneg, tf, tshort, tok, emb, ibad, ineg, g23};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lpx_tensor_release(objs[i]);
}

static void test_oom(void)
{
    lpx_tensor *x = mk_randn(LPX_BF16, 2, (int64_t[]){3, 4}, 1.0), *w = mk_randn(LPX_BF16, 1, (int64_t[]){4}, 1.0);
    lpx_tensor *t = mk_idx(LPX_I64, 1, (int64_t[]){3}, (int64_t[]){0, 3, 1});
    lpx_tensor *e = mk_randn(LPX_BF16, 2, (int64_t[]){3, 4}, 1.0);
    for (long n = 0; n < 10; n++) {
        lpx_tensor *a = NULL, *b = NULL;
        lpx__fail_alloc_after(n);
        lpx_status st = lpx_rmsnorm(x, w, 1e-6, &a, &b);
        lpx__fail_alloc_after(-1);
        CHECK(st == LPX_OK || st == LPX_ENOMEM);
        if (!st) {
            lpx_tensor *gx = NULL, *gw = NULL;
            lpx__fail_alloc_after(n);
            st = lpx_rmsnorm_backward(x, x, w, b, &gx, &gw);
            lpx__fail_alloc_after(-1);
            CHECK(st == LPX_OK || st == LPX_ENOMEM);
            lpx_tensor_release(gx);
            lpx_tensor_release(gw);
        }
        lpx_tensor_release(a);
        lpx_tensor_release(b);
        a = NULL;
        lpx__fail_alloc_after(n);
        st = lpx_cross_entropy_backward(x, t, -1, 1.0, &a);
        lpx__fail_alloc_after(-1);
        CHECK(st == LPX_OK || st == LPX_ENOMEM);
        lpx_tensor_release(a);
        a = NULL;
        lpx__fail_alloc_after(n);
        st = lpx_embedding_backward(e, t, 4, &a);
        lpx__fail_alloc_after(-1);
        CHECK(st == LPX_OK || st == LPX_ENOMEM);
        lpx_tensor_release(a);
        a = NULL;
        lpx__fail_alloc_after(n);
        st = lpx_softmax(x, 0, &a);
        lpx__fail_alloc_after(-1);
        CHECK(st == LPX_OK || st == LPX_ENOMEM);
        lpx_tensor_release(a);
    }
    lpx_tensor_release(x);
    lpx_tensor_release(w);
    lpx_tensor_release(t);
    lpx_tensor_release(e);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_rmsnorm);
    RUN(test_rmsnorm_finite_difference);
    RUN(test_rmsnorm_backward_boxed);
    RUN(test_softmax);
    RUN(test_softmax_finite_difference);
    RUN(test_cross_entropy);
    RUN(test_cross_entropy_finite_difference);
    RUN(test_mse);
    RUN(test_embedding);
    RUN(test_errors);
    RUN(test_oom);
    return CHECK_DONE();
}
