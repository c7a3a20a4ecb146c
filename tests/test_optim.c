/* The fused AdamW op (adamw_): bit-exact against a replay of its f32
 * formula written out here, for f32 and bf16 parameters and grads over
 * several steps and odd sizes; the closed form of the first step; the
 * argument checks, which refuse before writing anything. */
#include <stdint.h>
#include "check.h"
#include "tensor_util.h"

#define NT 3

/* The documented arithmetic (ops.h, lpx_adamw_), one element at a time. */
static void replay(float *p, lpx_dtype pd, float g, float *m, float *v, double lr, double beta1, double beta2,
                   double eps, double wd, int64_t step)
{
    const float b1 = (float)beta1, b2 = (float)beta2, omb1 = (float)(1.0 - beta1), omb2 = (float)(1.0 - beta2),
                flr = (float)lr, feps = (float)eps, decay = (float)(1.0 - lr * wd),
                bc1 = (float)(1.0 - pow(beta1, (double)step)), bc2 = (float)(1.0 - pow(beta2, (double)step));
    *m = b1 * *m + omb1 * g;
    *v = b2 * *v + omb2 * g * g;
    float mh = *m / bc1, vh = *v / bc2;
    float x = *p * decay - flr * mh / (sqrtf(vh) + feps);
    /* one RNE encode to the parameter dtype, read back as f32 */
    uint16_t h;
    if (pd == LPX_F32) {
        *p = x;
    } else {
        lpx_convert(&h, pd, &x, LPX_F32, 1, 0);
        lpx_convert(p, LPX_F32, &h, pd, 1, 0);
    }
}

static bool same_f32(const float *a, const float *b, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            fprintf(stderr, "    %s[%lld]: op %.9g, replay %.9g\n", what, (long long)i, a[i], b[i]);
            return false;
        }
    return true;
}

static float *as_f32(lpx_tensor *t)
{
    double *d = rd(t);
    int64_t n = lpx_tensor_numel(t);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)d[i];
    free(d);
    return f;
}

static void run_steps(lpx_dtype pd, lpx_dtype gd)
{
    static const int64_t sizes[NT] = {1, 37, 1029};
    lpx_tensor *p[NT], *g[NT], *m[NT], *v[NT];
    float *rp[NT], *rm[NT], *rv[NT];
    for (int i = 0; i < NT; i++) {
        int64_t n = sizes[i];
        double *vals = malloc((size_t)n * sizeof *vals), *zero = calloc((size_t)n, sizeof *zero);
        for (int64_t j = 0; j < n; j++) vals[j] = nrand();
        p[i] = mk(pd, 1, &n, vals);
        m[i] = mk(LPX_F32, 1, &n, zero);
        v[i] = mk(LPX_F32, 1, &n, zero);
        g[i] = NULL;
        rp[i] = as_f32(p[i]);
        rm[i] = calloc((size_t)n, sizeof(float));
        rv[i] = calloc((size_t)n, sizeof(float));
        free(vals);
        free(zero);
    }
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int64_t step = 1; step <= 4; step++) {
        for (int i = 0; i < NT; i++) {
            int64_t n = sizes[i];
            double *gv = malloc((size_t)n * sizeof *gv);
            /* some exact zeros and large values among the grads */
            for (int64_t j = 0; j < n; j++) gv[j] = j % 11 == 3 ? 0.0 : (j % 17 == 5 ? 300.0 : 1.0) * nrand();
            lpx_tensor_release(g[i]);
            g[i] = mk(gd, 1, &n, gv);
            float *gf = as_f32(g[i]);
            for (int64_t j = 0; j < n; j++) replay(&rp[i][j], pd, gf[j], &rm[i][j], &rv[i][j], lr, b1, b2, eps, wd, step);
            free(gf);
            free(gv);
        }
        CHECK_OK(lpx_adamw_(p, g, m, v, NT, lr, b1, b2, eps, wd, step));
    }
    for (int i = 0; i < NT; i++) {
        float *op = as_f32(p[i]);
        CHECK(same_f32(op, rp[i], sizes[i], "param"));
        CHECK(same_f32(lpx_tensor_data(m[i]), rm[i], sizes[i], "exp_avg"));
        CHECK(same_f32(lpx_tensor_data(v[i]), rv[i], sizes[i], "exp_avg_sq"));
        free(op);
        free(rp[i]);
        free(rm[i]);
        free(rv[i]);
        lpx_tensor_release(p[i]);
        lpx_tensor_release(g[i]);
        lpx_tensor_release(m[i]);
        lpx_tensor_release(v[i]);
    }
}

static void test_adamw_f32(void) { run_steps(LPX_F32, LPX_F32); }
static void test_adamw_bf16(void) { run_steps(LPX_BF16, LPX_BF16); }
static void test_adamw_bf16_param_f32_grad(void) { run_steps(LPX_BF16, LPX_F32); }

/* First step from zero state without decay: m/bc1 = g, v/bc2 = g^2, so
 * p moves by lr * g / (|g| + eps), about lr * sign(g). */
static void test_adamw_first_step(void)
{
    int64_t n = 4;
    double pv[4] = {1.0, -2.0, 0.5, 3.0}, gv[4] = {0.25, -4.0, 1e-3, 0.0}, z[4] = {0};
    lpx_tensor *p = mk(LPX_F32, 1, &n, pv), *g = mk(LPX_F32, 1, &n, gv), *m = mk(LPX_F32, 1, &n, z),
               *v = mk(LPX_F32, 1, &n, z);
    CHECK_OK(lpx_adamw_(&p, &g, &m, &v, 1, 0.01, 0.9, 0.999, 1e-8, 0.0, 1));
    double *r = rd(p), *rm = rd(m), *rv = rd(v);
    for (int i = 0; i < 4; i++) {
        double expect = pv[i] - 0.01 * gv[i] / (fabs(gv[i]) + 1e-8);
        CHECK_NEAR(r[i], expect, 1e-6);
        CHECK_NEAR(rm[i], 0.1 * gv[i], 1e-6 * fabs(gv[i]) + 1e-12);
        CHECK_NEAR(rv[i], 0.001 * gv[i] * gv[i], 1e-6 * gv[i] * gv[i] + 1e-15);
    }
    free(r);
    free(rm);
    free(rv);
    lpx_tensor_release(p);
    lpx_tensor_release(g);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
}

static void test_adamw_errors(void)
{
    int64_t n = 5, n2 = 6, sh2[2] = {2, 3}, st2[2] = {1, 2};
    double z[6] = {0}, one[6] = {1, 1, 1, 1, 1, 1};
    lpx_tensor *p0 = mk(LPX_F32, 1, &n, one), *p1 = mk(LPX_F32, 1, &n, one), *g = mk(LPX_F32, 1, &n, one),
               *m = mk(LPX_F32, 1, &n, z), *v = mk(LPX_F32, 1, &n, z), *m2 = mk(LPX_F32, 1, &n, z),
               *v2 = mk(LPX_F32, 1, &n, z), *g6 = mk(LPX_F32, 1, &n2, one), *mb = mk(LPX_BF16, 1, &n, z),
               *gi = mk(LPX_I32, 1, &n, one), *base = mk(LPX_F32, 1, &n2, one);
    lpx_tensor *tv = view(base, 2, sh2, st2, 0); /* a transposed, non-contiguous view */
    lpx_tensor *ps[2] = {p0, p1}, *gs[2] = {g, g}, *ms[2] = {m, m2}, *vs[2] = {v, v2};
    CHECK_OK(lpx_adamw_(NULL, NULL, NULL, NULL, 0, 1e-3, 0.9, 0.999, 1e-8, 0, 1));
    CHECK_ERR(lpx_adamw_(ps, NULL, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, 0, 1), LPX_EINVAL);
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, -1, 1e-3, 0.9, 0.999, 1e-8, 0, 1), LPX_EINVAL);
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, -1.0, 0.9, 0.999, 1e-8, 0, 1), LPX_EINVAL);
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 1.0, 0.999, 1e-8, 0, 1), LPX_EINVAL);
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 0.0, 0, 1), LPX_EINVAL);
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, -0.1, 1), LPX_EINVAL);
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, 0, 0), LPX_EINVAL);
    /* the second entry is bad: the first must stay untouched */
    gs[1] = g6;
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, 0, 1), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "grads[1]") != NULL);
    gs[1] = gi;
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, 0, 1), LPX_EDTYPE);
    gs[1] = g;
    ms[1] = mb;
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, 0, 1), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "exp_avg[1]") != NULL);
    ms[1] = m2;
    ps[1] = tv;
    CHECK_ERR(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, 0, 1), LPX_EINVAL);
    ps[1] = p1;
    double *r = rd(p0), *rm = rd(m);
    for (int i = 0; i < 5; i++) {
        CHECK(r[i] == 1.0);
        CHECK(rm[i] == 0.0);
    }
    free(r);
    free(rm);
    /* list lengths must agree (the op called directly) */
    lpx_value args[10] = {lpx_v_tensors(ps, 2), lpx_v_tensors(gs, 1), lpx_v_tensors(ms, 2), lpx_v_tensors(vs, 2),
                          lpx_v_f64(1e-3), lpx_v_f64(0.9), lpx_v_f64(0.999), lpx_v_f64(1e-8), lpx_v_f64(0),
                          lpx_v_i64(1)};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_adamw_, args, 10);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
    CHECK_OK(lpx_adamw_(ps, gs, ms, vs, 2, 1e-3, 0.9, 0.999, 1e-8, 0, 1));
    CHECK(lpx_op_nrets(LPX_OP_adamw_) == 0);
    lpx_tensor *all[] = {p0, p1, g, m, v, m2, v2, g6, mb, gi, base, tv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

int main(void)
{
    if (lpx_init()) {
        printf("lpx_init failed: %s\n", lpx_last_error());
        return 1;
    }
    RUN(test_adamw_f32);
    RUN(test_adamw_bf16);
    RUN(test_adamw_bf16_param_f32_grad);
    RUN(test_adamw_first_step);
    RUN(test_adamw_errors);
    return CHECK_DONE();
}
