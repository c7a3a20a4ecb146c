/* Creation ops: empty, zeros, full, arange, randn, rand (values against
 * references computed here in double), the Philox generator's published
 * known answers, reproducibility, and bad input. */
#include <stdint.h>
#include "check.h"
#include "lpx/lpx.h"

/* internal (backends/cpu/creation.c); the tests link the static library */
void cpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

static double item(const lpx_tensor *t, int64_t i)
{
    double v = NAN;
    CHECK_OK(lpx_item(t, i, &v));
    return v;
}

static bool same_shape(const lpx_tensor *t, int ndim, const int64_t *shape)
{
    if (lpx_tensor_ndim(t) != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (lpx_tensor_shape(t)[i] != shape[i]) return false;
    return true;
}

static void test_empty(void)
{
    const int64_t shape[] = {2, 3, 4};
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_empty(3, shape, LPX_BF16, lpx_cpu(), &t));
    CHECK(t && same_shape(t, 3, shape) && lpx_tensor_dtype(t) == LPX_BF16 && lpx_tensor_numel(t) == 24);
    CHECK(lpx_tensor_is_contiguous(t) && lpx_tensor_kind(t) == NULL);
    lpx_tensor_release(t);

    /* 0-d and zero-size */
    CHECK_OK(lpx_empty(0, NULL, LPX_F32, lpx_cpu(), &t));
    CHECK(t && lpx_tensor_ndim(t) == 0 && lpx_tensor_numel(t) == 1);
    lpx_tensor_release(t);
    const int64_t z[] = {3, 0};
    CHECK_OK(lpx_empty(2, z, LPX_I64, lpx_cpu(), &t));
    CHECK(t && lpx_tensor_numel(t) == 0);
    lpx_tensor_release(t);
}

static void test_zeros_full(void)
{
    const int64_t shape[] = {3, 5};
    for (lpx_dtype d = 0; d < LPX_DTYPE_BUILTIN_COUNT; d++) {
        lpx_tensor *t = NULL;
        CHECK_OK(lpx_zeros(2, shape, d, lpx_cpu(), &t));
        if (!t) continue;
        CHECK(lpx_tensor_dtype(t) == d && same_shape(t, 2, shape));
        for (int64_t i = 0; i < 15; i++) CHECKF(item(t, i) == 0.0, "zeros %s[%lld]", lpx_dtype_name(d), (long long)i);
        lpx_tensor_release(t);
    }
    struct { lpx_dtype d; double v, want; } cases[] = {
        {LPX_F32, 3.25, 3.25}, {LPX_F16, -0.1, -0.0999755859375}, {LPX_BF16, 3.3, 3.296875},
        {LPX_F8E4M3FN, 1.1, 1.125}, {LPX_F8E5M2, -3.0, -3.0}, {LPX_I32, -7.0, -7.0}, {LPX_I64, 1e6, 1e6},
        {LPX_U8, 300.0, 255.0}, {LPX_I8, -3.5, -4.0}, {LPX_BOOL, 0.5, 1.0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        lpx_tensor *t = NULL;
        CHECK_OK(lpx_full(2, shape, cases[k].v, cases[k].d, lpx_cpu(), &t));
        if (!t) continue;
        for (int64_t i = 0; i < 15; i++)
            CHECKF(item(t, i) == cases[k].want, "full %s: %g, want %g", lpx_dtype_name(cases[k].d), item(t, i),
                   cases[k].want);
        lpx_tensor_release(t);
    }
    /* non-saturating like torch: 1000 does not fit e4m3fn -> NaN */
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_full(2, shape, 1000.0, LPX_F8E4M3FN, lpx_cpu(), &t));
    CHECK(t && isnan(item(t, 7)));
    lpx_tensor_release(t);
    /* 0-d */
    CHECK_OK(lpx_full(0, NULL, 2.5, LPX_F32, lpx_cpu(), &t));
    CHECK(t && item(t, 0) == 2.5);
    lpx_tensor_release(t);
}

static void check_arange(double start, double end, double step, lpx_dtype d, int64_t want_n)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_arange(start, end, step, d, lpx_cpu(), &t));
    if (!t) return;
    CHECKF(lpx_tensor_ndim(t) == 1 && lpx_tensor_numel(t) == want_n, "arange(%g, %g, %g): %lld elements, want %lld",
           start, end, step, (long long)lpx_tensor_numel(t), (long long)want_n);
    for (int64_t i = 0; i < lpx_tensor_numel(t) && i < want_n; i++) {
        double ref = start + (double)i * step, got = item(t, i);
        double tol = d == LPX_F32 ? 1e-6 * fabs(ref) : d == LPX_BF16 ? fabs(ref) / 256 : 0.0;
        CHECKF(fabs(got - ref) <= tol, "arange(%g, %g, %g)[%lld] = %.17g, want %.17g", start, end, step, (long long)i,
               got, ref);
    }
    lpx_tensor_release(t);
}

static void test_arange(void)
{
    check_arange(0, 10, 1, LPX_F32, 10);
    check_arange(0, 1, 0.1, LPX_F32, 10);
    check_arange(1, -1, -0.5, LPX_F32, 4);
    check_arange(0, 5, 2, LPX_I64, 3);
    check_arange(-3, 3, 1, LPX_I32, 6);
    check_arange(2, 2, 1, LPX_F32, 0);
    check_arange(0, 100, 7, LPX_BF16, 15);
    /* i64 beyond f32's 24 bits stays exact */
    check_arange(9007199254740000.0, 9007199254740010.0, 3, LPX_I64, 4);
    lpx_tensor *t = (lpx_tensor *)1;
    CHECK_ERR(lpx_arange(0, 1, 0, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    CHECK(t == NULL);
    CHECK_ERR(lpx_arange(0, 10, -1, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    CHECK_ERR(lpx_arange(0, INFINITY, 1, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    CHECK_ERR(lpx_arange(NAN, 1, 1, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    CHECK_ERR(lpx_arange(0, 1e300, 1e-300, LPX_F32, lpx_cpu(), &t), LPX_ERANGE);
    CHECK_ERR(lpx_arange(0, 1, 1, 77, lpx_cpu(), &t), LPX_EDTYPE);
    CHECK_ERR(lpx_arange(0, 1, 1, LPX_F32, lpx_cpu(), NULL), LPX_EINVAL);
}

static void test_philox_kat(void)
{
    /* Random123 tests/kat_vectors */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        cpu_philox4x32_10(kat[k], kat[k] + 4, out);
        for (int w = 0; w < 4; w++) CHECKF(out[w] == kat[k][6 + w], "kat %d word %d: %08x", k, w, out[w]);
    }
}

/* randn element 0 from the documented recipe (seed 0x123456789): the
 * generator is specified, not just "some normal numbers" */
static void test_randn_recipe(void)
{
    const uint64_t seed = 0x123456789ull;
    const int64_t n = 4;
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_randn(1, &n, seed, LPX_F32, lpx_cpu(), &t));
    if (!t) return;
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (uint32_t k = 0; k < 2; k++) {
        uint32_t ctr[4] = {k, 0, 0, 0}, x[4];
        cpu_philox4x32_10(ctr, key, x);
        uint64_t a = ((uint64_t)x[0] << 32) | x[1], b = ((uint64_t)x[2] << 32) | x[3];
        double u1 = (double)((a >> 11) + 1) * 0x1p-53, u2 = (double)(b >> 11) * 0x1p-53;
        double r = sqrt(-2 * log(u1)), th = 6.283185307179586 * u2;
        CHECK(item(t, 2 * k) == (double)(float)(r * cos(th)));
        CHECK(item(t, 2 * k + 1) == (double)(float)(r * sin(th)));
    }
    lpx_tensor_release(t);
    /* rand element 5: counter (1, 0, 1, 0), word 1, 24 bits */
    CHECK_OK(lpx_rand(1, &n, seed, LPX_F32, lpx_cpu(), &t));
    lpx_tensor_release(t);
    const int64_t n8 = 8;
    CHECK_OK(lpx_rand(1, &n8, seed, LPX_F32, lpx_cpu(), &t));
    if (!t) return;
    uint32_t ctr[4] = {1, 0, 1, 0}, x[4];
    cpu_philox4x32_10(ctr, key, x);
    CHECK(item(t, 5) == (double)(x[1] >> 8) * 0x1p-24);
    lpx_tensor_release(t);
}

static void test_randn_stats(void)
{
    const int64_t n = 100000;
    lpx_tensor *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(lpx_randn(1, &n, 42, LPX_F32, lpx_cpu(), &a));
    CHECK_OK(lpx_randn(1, &n, 42, LPX_F32, lpx_cpu(), &b));
    CHECK_OK(lpx_randn(1, &n, 43, LPX_F32, lpx_cpu(), &c));
    if (!a || !b || !c) goto out;
    CHECK(memcmp(lpx_tensor_data(a), lpx_tensor_data(b), (size_t)n * 4) == 0);
    CHECK(memcmp(lpx_tensor_data(a), lpx_tensor_data(c), (size_t)n * 4) != 0);
    double s = 0, s2 = 0, s4 = 0;
    int64_t beyond3 = 0;
    const float *p = lpx_tensor_data(a);
    for (int64_t i = 0; i < n; i++) {
        s += p[i];
        s2 += (double)p[i] * p[i];
        s4 += (double)p[i] * p[i] * p[i] * p[i];
        beyond3 += fabsf(p[i]) > 3.0f;
        CHECK(isfinite(p[i]));
    }
    double mean = s / n, var = s2 / n - mean * mean;
    CHECKF(fabs(mean) < 0.015, "mean %g", mean);
    CHECKF(fabs(sqrt(var) - 1.0) < 0.015, "std %g", sqrt(var));
    CHECKF(fabs(s4 / n - 3.0) < 0.15, "4th moment %g", s4 / n); /* normal: 3 */
    CHECKF(beyond3 > 200 && beyond3 < 340, "%lld beyond 3 sigma (expect ~270)", (long long)beyond3);
    /* element i depends on (seed, i) only: any shape gives the same prefix */
    lpx_tensor *d = NULL;
    const int64_t shape2[] = {7, 3};
    CHECK_OK(lpx_randn(2, shape2, 42, LPX_F32, lpx_cpu(), &d));
    if (d) CHECK(memcmp(lpx_tensor_data(a), lpx_tensor_data(d), 21 * 4) == 0);
    lpx_tensor_release(d);
    /* low-precision results are the f32 values rounded once */
    lpx_tensor *h = NULL, *hc = NULL;
    CHECK_OK(lpx_randn(2, shape2, 42, LPX_BF16, lpx_cpu(), &h));
    lpx_tensor *a21 = NULL;
    CHECK_OK(lpx_narrow(a, 0, 0, 21, &a21));
    if (a21) CHECK_OK(lpx_cast(a21, LPX_BF16, false, &hc));
    if (h && hc) CHECK(memcmp(lpx_tensor_data(h), lpx_tensor_data(hc), 21 * 2) == 0);
    lpx_tensor_release(h);
    lpx_tensor_release(hc);
    lpx_tensor_release(a21);
out:
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
}

static void test_rand(void)
{
    const int64_t n = 100000;
    lpx_tensor *a = NULL, *b = NULL;
    CHECK_OK(lpx_rand(1, &n, 7, LPX_F32, lpx_cpu(), &a));
    CHECK_OK(lpx_rand(1, &n, 7, LPX_F32, lpx_cpu(), &b));
    if (a && b) {
        CHECK(memcmp(lpx_tensor_data(a), lpx_tensor_data(b), (size_t)n * 4) == 0);
        const float *p = lpx_tensor_data(a);
        double s = 0, s2 = 0, lo = 1, hi = 0;
        for (int64_t i = 0; i < n; i++) {
            s += p[i];
            s2 += (double)p[i] * p[i];
            if (p[i] < lo) lo = p[i];
            if (p[i] > hi) hi = p[i];
        }
        double mean = s / n, var = s2 / n - mean * mean;
        CHECKF(fabs(mean - 0.5) < 0.005, "mean %g", mean);
        CHECKF(fabs(var - 1.0 / 12) < 0.002, "var %g", var);
        CHECK(lo >= 0.0 && lo < 0.001 && hi < 1.0 && hi > 0.999);
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* low-precision uniforms stay below 1 (no rounding up to 1.0) */
    lpx_dtype lows[] = {LPX_F16, LPX_BF16, LPX_F8E4M3FN, LPX_F8E5M2};
    for (size_t k = 0; k < 4; k++) {
        const int64_t m = 20000;
        lpx_tensor *t = NULL;
        CHECK_OK(lpx_rand(1, &m, 11, lows[k], lpx_cpu(), &t));
        if (!t) continue;
        double s = 0, hi = 0;
        for (int64_t i = 0; i < m; i++) {
            double v = item(t, i);
            s += v;
            if (v > hi) hi = v;
            if (!(v >= 0 && v < 1)) {
                CHECKF(0, "rand %s[%lld] = %g", lpx_dtype_name(lows[k]), (long long)i, v);
                break;
            }
        }
        CHECKF(fabs(s / m - 0.5) < 0.1, "rand %s mean %g", lpx_dtype_name(lows[k]), s / m);
        lpx_tensor_release(t);
    }
}

static void test_errors(void)
{
    const int64_t shape[] = {2, 3};
    lpx_tensor *t = (lpx_tensor *)1;
    CHECK_ERR(lpx_zeros(2, shape, LPX_F32, lpx_cpu(), NULL), LPX_EINVAL);
    CHECK_ERR(lpx_zeros(-1, shape, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    CHECK(t == NULL);
    CHECK_ERR(lpx_empty(2, NULL, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    const int64_t neg[] = {2, -3};
    CHECK_ERR(lpx_zeros(2, neg, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    const int64_t huge[] = {1ll << 40, 1ll << 40};
    CHECK_ERR(lpx_empty(2, huge, LPX_F32, lpx_cpu(), &t), LPX_ERANGE);
    CHECK_ERR(lpx_randn(2, huge, 1, LPX_F32, lpx_cpu(), &t), LPX_ERANGE);
    const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_ERR(lpx_full(9, nine, 1.0, LPX_F32, lpx_cpu(), &t), LPX_EINVAL);
    CHECK_ERR(lpx_full(2, shape, 1.0, 99, lpx_cpu(), &t), LPX_EDTYPE);
    CHECK_ERR(lpx_zeros(2, shape, -3, lpx_cpu(), &t), LPX_EDTYPE);
    CHECK_ERR(lpx_randn(2, shape, 1, LPX_I32, lpx_cpu(), &t), LPX_EDTYPE);
    CHECK_ERR(lpx_rand(2, shape, 1, LPX_BOOL, lpx_cpu(), &t), LPX_EDTYPE);
    CHECK_ERR(lpx_rand(2, shape, 1, 99, lpx_cpu(), &t), LPX_EDTYPE);
    lpx_device nodev = {42, 0};
    CHECK_ERR(lpx_zeros(2, shape, LPX_F32, nodev, &t), LPX_EDEVICE);
    CHECK(t == NULL);
}

int main(void)
{
    RUN(test_empty);
    RUN(test_zeros_full);
    RUN(test_arange);
    RUN(test_philox_kat);
    RUN(test_randn_recipe);
    RUN(test_randn_stats);
    RUN(test_rand);
    RUN(test_errors);
    return CHECK_DONE();
}
