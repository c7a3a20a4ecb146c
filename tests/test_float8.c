/* The float8 kind: fused quantize (exact scales and codes, statistics,
 * saturation, NaN), the scaled GEMM against an f64 emulation, delayed
 * scaling on hand-made amax sequences, Float8Linear presets against an f64
 * reference (SQNR), per-GEMM overrides, views and scales, the fallback and
 * its trace count, unflatten validation, all-gather hooks, bad input.
 * Runs under ASan/LSan in the sanitizer build: every tensor is released. */
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
static double *values(lpx_tensor *t)
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

static double sqnr_db(const double *ref, const double *x, int64_t n)
{
    double s = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        s += ref[i] * ref[i];
        e += (ref[i] - x[i]) * (ref[i] - x[i]);
    }
    return e == 0 ? INFINITY : 10.0 * log10(s / e);
}

static double item(const lpx_tensor *t, int64_t i)
{
    double v = NAN;
    CHECK_OK(lpx_item(t, i, &v));
    return v;
}

/* C[M,N] = op(A) @ op(B) in f64 (row-major; ta/tb transpose A/B). */
static void dgemm(int M, int N, int K, const double *A, bool ta, const double *B, bool tb, double *C)
{
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0, A,
                ta ? M : K, B, tb ? K : N, 0.0, C, N);
}

static float f32(double d) { return (float)d; }

static int64_t kind_live(void) { return lpx_kind_live_tensors(lpx_float8_kind()); }

static lpx_tensor *quant(lpx_tensor *x, lpx_dtype fp8, int gran, int axis, bool pow2, lpx_float8_stats *st)
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

/* ---- quantize ------------------------------------------------------ */

static void test_kind(void)
{
    const lpx_kind *k = lpx_float8_kind();
    CHECK(k != NULL);
    CHECK(k && !strcmp(lpx_kind_name(k), "float8"));
    const lpx_kind *k2 = NULL;
    CHECK_OK(lpx_kind_find("float8", &k2));
    CHECK(k == k2);
}

static void test_quantize_sqnr(void)
{
    int64_t shape[2] = {256, 512};
    lpx_dtype dts[3] = {LPX_F32, LPX_BF16, LPX_F16};
    for (int d = 0; d < 3; d++) {
        lpx_tensor *x = rand_normal(2, shape, 11 + (uint64_t)d, 1.0, dts[d]);
        lpx_float8_stats st;
        lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, &st);
        CHECK(lpx_float8_is(q));
        CHECK(lpx_tensor_dtype(q) == dts[d]);
        CHECK(lpx_tensor_dtype(lpx_float8_data(q)) == LPX_F8E4M3FN);
        double *vx = values(x), *vq = values(q);
        double s = sqnr_db(vx, vq, 256 * 512);
        CHECKF(s >= 25.0, "e4m3 tensorwise SQNR %.2f dB (%s)", s, lpx_dtype_name(dts[d]));
        CHECK(st.numel == 256 * 512 && st.saturation == 0 && st.nan == 0);
        double amax = 0;
        for (int64_t i = 0; i < 256 * 512; i++) amax = fmax(amax, fabs(vx[i]));
        CHECK(st.amax == amax);
        free(vx);
        free(vq);
        /* e5m2: one mantissa bit less */
        lpx_tensor *q5 = quant(x, LPX_F8E5M2, LPX_FLOAT8_TENSORWISE, 0, false, NULL);
        vx = values(x), vq = values(q5);
        s = sqnr_db(vx, vq, 256 * 512);
        CHECKF(s >= 19.0, "e5m2 tensorwise SQNR %.2f dB", s);
        free(vx);
        free(vq);
        lpx_tensor_release(q5);
        lpx_tensor_release(q);
        lpx_tensor_release(x);
    }
}

/* Tensorwise: scale = (float)(448 / amax) and every code equals the codec
 * (the independent reference of tests/fp8_ref.h, saturating) applied to
 * x * scale in f32. */
static void test_quantize_exact_tensorwise(void)
{
    int64_t shape[2] = {33, 70};
    lpx_tensor *x = rand_normal(2, shape, 5, 3.0, LPX_F32);
    lpx_float8_stats st;
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, &st);
    const float *xv = lpx_tensor_data(x);
    double amax = 0;
    for (int i = 0; i < 33 * 70; i++) amax = fmax(amax, fabs(xv[i]));
    float scale = f32(448.0 / amax);
    CHECK(lpx_tensor_ndim(lpx_float8_scale(q)) == 0);
    CHECK(item(lpx_float8_scale(q), 0) == scale);
    CHECK(item(lpx_float8_scale_inv(q), 0) == f32(1.0 / scale));
    CHECK(st.scale == scale && st.scale_max == scale);
    float prod[33 * 70];
    uint8_t want[33 * 70];
    for (int i = 0; i < 33 * 70; i++) prod[i] = xv[i] * scale;
    ref_fp8_encode(LPX_F8E4M3FN, prod, want, 33 * 70, 1);
    CHECK(!memcmp(want, lpx_tensor_data(lpx_float8_data(q)), sizeof want));
    /* the largest element lands on +-448 exactly */
    lpx_tensor_release(q);
    lpx_tensor_release(x);
}

/* The fused kernel's fast path (codec on values known to be in the normal
 * range, full codec for the rest) must equal the codec on every element:
 * random f32 bit patterns (NaN, inf, subnormals, zeros included), both
 * formats, saturating or not, scalar and per-column static scales; the
 * statistics equal a brute-force count with the codec. */
static void test_quantize_matches_codec(void)
{
    enum { R = 64, C = 1000, N = R * C };
    static float xs[N], prod[N], sc[C];
    static uint8_t want[N], nonsat[N];
    uint64_t st = 0x9E3779B97F4A7C15u;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005u + 1442695040888963407u;
        uint32_t bits = (uint32_t)(st >> 32);
        float v;
        if (i % 3 == 0) {
            /* a quarter of them in fp8's interesting range, not uniform bits */
            int e = (int)((st >> 20) % 40) - 24;
            v = ldexpf(1.0f + (float)((st >> 8) & 0xFFF) / 4096.0f, e) * ((st >> 7) & 1 ? -1.0f : 1.0f);
        } else {
            memcpy(&v, &bits, 4);
        }
        if (i % 97 == 0) v = 0.0f;
        if (i % 101 == 0) v = -0.0f;
        xs[i] = v;
    }
    for (int k = 0; k < C; k++) sc[k] = ldexpf(1.0f + (float)k / C, (k % 7) - 3);
    int64_t shape[2] = {R, C}, sshape[2] = {1, C};
    lpx_tensor *x = NULL, *s1 = NULL, *sv = NULL;
    CHECK_OK(lpx_tensor_from_blob(xs, LPX_F32, 2, shape, NULL, lpx_cpu(), NULL, NULL, &x));
    CHECK_OK(lpx_full(0, NULL, 3.7, LPX_F32, lpx_cpu(), &s1));
    CHECK_OK(lpx_tensor_from_blob(sc, LPX_F32, 2, sshape, NULL, lpx_cpu(), NULL, NULL, &sv));
    lpx_dtype fmts[2] = {LPX_F8E4M3FN, LPX_F8E5M2};
    for (int f = 0; f < 2; f++)
        for (int sat = 0; sat < 2; sat++)
            for (int per_col = 0; per_col < 2; per_col++) {
                for (int i = 0; i < N; i++) prod[i] = xs[i] * (per_col ? sc[i % C] : f32(3.7));
                ref_fp8_encode(fmts[f], prod, want, N, sat);
                ref_fp8_encode(fmts[f], prod, nonsat, N, 0);
                int64_t dim = 0;
                lpx_tensor *q = NULL, *qs = NULL, *qsi = NULL, *stats = NULL;
                CHECK_OK(lpx_fp8_quantize(x, per_col ? sv : s1, fmts[f], per_col ? &dim : NULL, false, 0.0, sat != 0,
                                          &q, &qs, &qsi, &stats));
                if (!q) continue;
                const uint8_t *got = lpx_tensor_data(q);
                int bad = 0, first = -1;
                for (int i = 0; i < N; i++)
                    if (got[i] != want[i] && !(isnan(prod[i]) && (got[i] & 0x7F) >= (fmts[f] == LPX_F8E5M2 ? 0x7D : 0x7F))) {
                        if (first < 0) first = i;
                        bad++;
                    }
                CHECKF(bad == 0, "%s sat %d per_col %d: %d codes differ, first x = %a (code %02x, want %02x)",
                       lpx_dtype_name(fmts[f]), sat, per_col, bad, first >= 0 ? (double)xs[first] : 0.0,
                       first >= 0 ? got[first] : 0, first >= 0 ? want[first] : 0);
                /* brute-force statistics with the codec */
                int64_t nz = 0, un = 0, sa = 0, nan = 0;
                uint8_t inf_or_nan = fmts[f] == LPX_F8E5M2 ? 0x7C : 0x7F;
                for (int i = 0; i < N; i++) {
                    if (isnan(xs[i])) {
                        nan++;
                        continue;
                    }
                    if (xs[i] != 0) {
                        nz++;
                        un += (want[i] & 0x7F) == 0;
                    }
                    sa += (nonsat[i] & 0x7F) >= inf_or_nan;
                }
                CHECK(item(stats, 1) == f32((double)un / nz));
                CHECK(item(stats, 2) == f32((double)sa / N));
                CHECK(item(stats, 3) == f32((double)nan / N));
                CHECK(isnan(item(stats, 0)));
                lpx_tensor *rel[] = {q, qs, qsi, stats};
                for (size_t k = 0; k < 4; k++) lpx_tensor_release(rel[k]);
            }
    lpx_tensor_release(x);
    lpx_tensor_release(s1);
    lpx_tensor_release(sv);
}

/* fp8_quantize_t: x [R, C] and x^T from one call. Tensorwise, x^T's codes
 * are q's codes transposed (checked on the raw bytes) with q's scale;
 * axiswise, they are the codes and scales of the column quantize
 * (fp8_quantize along dim 0, another path of the CPU kernel), transposed.
 * Uneven and degenerate shapes, both formats, and the argument errors. */
static void test_quantize_t(void)
{
    static const int64_t shapes[][2] = {{64, 48}, {17, 33}, {1, 5}, {5, 1}, {0, 8}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int f = 0; f < 2; f++)
            for (int axw = 0; axw < 2; axw++) {
                int64_t R = shapes[si][0], C = shapes[si][1];
                lpx_dtype f8 = f ? LPX_F8E5M2 : LPX_F8E4M3FN;
                lpx_tensor *x = rand_normal(2, shapes[si], 90 + si, 3.0, LPX_BF16);
                lpx_tensor *o[7] = {0}, *r[4] = {0};
                CHECK_OK(lpx_fp8_quantize_t(x, NULL, f8, axw, axw, 0, true, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                                            &o[6]));
                int64_t d = axw ? 0 : 0;
                /* the reference: q as fp8_quantize gives it, x^T's from the column (or tensorwise) quantize */
                int64_t d1 = 1;
                lpx_tensor *q1 = NULL, *s1 = NULL;
                CHECK_OK(lpx_fp8_quantize(x, NULL, f8, axw ? &d1 : NULL, axw, 0, true, &q1, &s1, NULL, NULL));
                CHECK_OK(lpx_fp8_quantize(x, NULL, f8, axw ? &d : NULL, axw, 0, true, &r[0], &r[1], &r[2], &r[3]));
                if (!o[0] || !o[4] || !r[0] || !q1) {
                    CHECK(false);
                } else {
                    CHECK(lpx_tensor_ndim(o[4]) == 2 && lpx_tensor_shape(o[4])[0] == C &&
                          lpx_tensor_shape(o[4])[1] == R && lpx_tensor_is_contiguous(o[4]));
                    CHECK(!memcmp(lpx_tensor_data(o[0]), lpx_tensor_data(q1), (size_t)(R * C)));
                    const uint8_t *qt = lpx_tensor_data(o[4]), *ref = lpx_tensor_data(r[0]);
                    int bad = 0;
                    for (int64_t i = 0; i < R; i++)
                        for (int64_t j = 0; j < C; j++) bad += qt[j * R + i] != ref[i * C + j];
                    CHECKF(bad == 0, "[%lld, %lld] %s axiswise %d: %d x^T codes differ", (long long)R, (long long)C,
                           lpx_dtype_name(f8), axw, bad);
                    int64_t ns = axw ? C : 1;
                    CHECK(lpx_tensor_numel(o[5]) == ns && lpx_tensor_numel(o[6]) == ns);
                    for (int64_t j = 0; j < ns; j++) {
                        CHECK(f32(item(o[5], j)) == f32(item(r[1], j)));
                        CHECK(f32(item(o[6], j)) == f32(item(r[2], j)));
                    }
                    CHECK(lpx_tensor_numel(o[1]) == (axw ? R : 1));
                    for (int64_t i = 0; i < lpx_tensor_numel(o[1]); i++) CHECK(item(o[1], i) == item(s1, i));
                }
                for (int i = 0; i < 7; i++) lpx_tensor_release(o[i]);
                for (int i = 0; i < 4; i++) lpx_tensor_release(r[i]);
                lpx_tensor_release(q1);
                lpx_tensor_release(s1);
                lpx_tensor_release(x);
            }
    /* a static scale (tensorwise): both copies with it */
    int64_t sh[2] = {8, 16}, sh3[3] = {2, 4, 8};
    lpx_tensor *x = rand_normal(2, sh, 7, 1.0, LPX_F32), *sc = NULL, *o[7] = {0};
    CHECK_OK(lpx_full(0, NULL, 64.0, LPX_F32, lpx_cpu(), &sc));
    CHECK_OK(lpx_fp8_quantize_t(x, sc, LPX_F8E4M3FN, false, false, 0, true, &o[0], &o[1], NULL, NULL, &o[4], &o[5],
                                NULL));
    CHECK(o[1] && item(o[1], 0) == 64.0 && o[5] && item(o[5], 0) == 64.0);
    for (int i = 0; i < 7; i++) {
        lpx_tensor_release(o[i]);
        o[i] = NULL;
    }
    /* errors: nothing is returned */
    lpx_tensor *x3 = rand_normal(3, sh3, 8, 1.0, LPX_F32);
    CHECK_ERR(lpx_fp8_quantize_t(x3, NULL, LPX_F8E4M3FN, false, false, 0, true, &o[0], &o[1], &o[2], &o[3], &o[4],
                                 &o[5], &o[6]),
              LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "2-D"));
    CHECK_ERR(lpx_fp8_quantize_t(x, sc, LPX_F8E4M3FN, true, false, 0, true, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                                 &o[6]),
              LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "fp8_quantize_t") && strstr(lpx_last_error(), "axiswise"));
    CHECK_ERR(lpx_fp8_quantize_t(x, NULL, LPX_BF16, false, false, 0, true, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                                 &o[6]),
              LPX_EDTYPE);
    CHECK_ERR(lpx_fp8_quantize_t(x, NULL, LPX_F8E4M3FN, false, false, 0, true, &o[0], NULL, NULL, NULL, NULL, NULL,
                                 NULL),
              LPX_EINVAL);
    float *px = lpx_tensor_data(x);
    px[5] = NAN;
    CHECK_ERR(lpx_fp8_quantize_t(x, NULL, LPX_F8E4M3FN, false, false, 0, true, &o[0], &o[1], &o[2], &o[3], &o[4],
                                 &o[5], &o[6]),
              LPX_ENUMERIC);
    for (int i = 0; i < 7; i++) CHECK(o[i] == NULL);
    lpx_tensor_release(x);
    lpx_tensor_release(x3);
    lpx_tensor_release(sc);
}

static void test_rowwise_scales_exact(void)
{
    enum { M = 24, K = 50 };
    float buf[M * K];
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++) buf[r * K + k] = (float)(sin(r * 7.0 + k) * pow(2.0, r - 10) * (1 + r % 3));
    buf[3 * K + 4] = 0; /* a zero row element */
    for (int k = 0; k < K; k++) buf[5 * K + k] = 0; /* an all-zero row */
    int64_t shape[2] = {M, K};
    lpx_tensor *x = NULL;
    CHECK_OK(lpx_tensor_from_blob(buf, LPX_F32, 2, shape, NULL, lpx_cpu(), NULL, NULL, &x));
    lpx_float8_stats st;
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, &st);
    lpx_tensor *s = lpx_float8_scale(q);
    CHECK(lpx_tensor_ndim(s) == 2 && lpx_tensor_shape(s)[0] == M && lpx_tensor_shape(s)[1] == 1);
    lpx_float8_info info;
    CHECK_OK(lpx_float8_get_info(q, &info));
    CHECK(info.granularity == LPX_FLOAT8_AXISWISE && info.axis == 1 && info.fp8 == LPX_F8E4M3FN);
    double smin = INFINITY, smax = 0;
    for (int r = 0; r < M; r++) {
        double amax = 0;
        for (int k = 0; k < K; k++) amax = fmax(amax, fabs(buf[r * K + k]));
        float want = f32(448.0 / fmax(amax, 1e-12));
        CHECKF(item(s, r) == want, "row %d scale %.9g, want %.9g", r, item(s, r), (double)want);
        smin = fmin(smin, want);
        smax = fmax(smax, want);
        float prod[K];
        uint8_t codes[K];
        for (int k = 0; k < K; k++) prod[k] = buf[r * K + k] * want;
        ref_fp8_encode(LPX_F8E4M3FN, prod, codes, K, 1);
        CHECK(!memcmp(codes, (uint8_t *)lpx_tensor_data(lpx_float8_data(q)) + r * K, K));
    }
    CHECK(st.scale == smin && st.scale_max == smax);
    /* columnwise (amax over dim 0): scale [1, K] */
    lpx_tensor *qc = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, 0, false, NULL);
    lpx_tensor *sc = lpx_float8_scale(qc);
    CHECK(lpx_tensor_shape(sc)[0] == 1 && lpx_tensor_shape(sc)[1] == K);
    for (int k = 0; k < K; k++) {
        double amax = 0;
        for (int r = 0; r < M; r++) amax = fmax(amax, fabs(buf[r * K + k]));
        CHECK(item(sc, k) == f32(448.0 / fmax(amax, 1e-12)));
    }
    /* a bf16, non-contiguous (transposed) source gives the same codes as
     * its contiguous f32 copy */
    lpx_tensor *xt = NULL, *xtb = NULL, *xtc = NULL;
    CHECK_OK(lpx_t(x, &xt));
    CHECK_OK(lpx_cast(xt, LPX_BF16, false, &xtb));
    lpx_tensor *xtbt = NULL;
    CHECK_OK(lpx_t(xtb, &xtbt));  /* [M, K] view of a [K, M] bf16 tensor */
    CHECK_OK(lpx_cast(xtbt, LPX_F32, false, &xtc));
    lpx_tensor *q1 = quant(xtbt, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *q2 = quant(xtc, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    CHECK(!memcmp(lpx_tensor_data(lpx_float8_data(q1)), lpx_tensor_data(lpx_float8_data(q2)), M * K));
    lpx_tensor *rel[] = {q1, q2, xt, xtb, xtbt, xtc, qc, q, x};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_pow2_and_fp16_clamp(void)
{
    int64_t shape[2] = {16, 40};
    lpx_tensor *x = rand_normal(2, shape, 77, 0.37, LPX_F32);
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, true, NULL);
    const float *xv = lpx_tensor_data(x);
    for (int r = 0; r < 16; r++) {
        double s = item(lpx_float8_scale(q), r), amax = 0;
        for (int k = 0; k < 40; k++) amax = fmax(amax, fabs(xv[r * 40 + k]));
        int e;
        double m = frexp(s, &e);
        CHECKF(m == 0.5, "row %d scale %.9g is not a power of two", r, s);
        double exact = 448.0 / amax;
        CHECK(s <= exact && s > exact / 2);
        CHECK(item(lpx_float8_scale_inv(q), r) * s == 1.0);
    }
    lpx_tensor_release(q);
    /* f16 logical dtype: the scale of a tiny tensor is clamped to 65504
     * (then 32768 as a power of two) so scale and scale_inv fit f16 */
    lpx_tensor *tiny = rand_normal(2, shape, 78, 1e-5, LPX_F16);
    lpx_tensor *qt = quant(tiny, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL);
    CHECK(item(lpx_float8_scale(qt), 0) == 65504.0);
    lpx_tensor *qp = quant(tiny, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, true, NULL);
    CHECK(item(lpx_float8_scale(qp), 0) == 32768.0);
    /* an f32 tensor of zeros: scale = 448 / 1e-12, all codes zero */
    lpx_tensor *z = NULL;
    CHECK_OK(lpx_zeros(2, shape, LPX_F32, lpx_cpu(), &z));
    lpx_float8_stats st;
    lpx_tensor *qz = quant(z, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, &st);
    CHECK(item(lpx_float8_scale(qz), 0) == f32(448.0 / 1e-12));
    CHECK(st.amax == 0 && st.underflow == 0);
    const uint8_t *zc = lpx_tensor_data(lpx_float8_data(qz));
    int nz = 0;
    for (int i = 0; i < 16 * 40; i++) nz += zc[i] != 0;
    CHECK(nz == 0);
    lpx_tensor *rel[] = {qz, z, qp, qt, tiny, x};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

/* Static scales: overflow saturates to +-max, or becomes NaN (e4m3fn) /
 * inf (e5m2) without saturation; statistics count it exactly. */
static void test_saturation_and_stats(void)
{
    float xs[8] = {1.0f, -2.0f, 500.0f, -1000.0f, 1e-4f, 0.0f, 3.0f, INFINITY};
    int64_t shape[1] = {8};
    lpx_tensor *x = NULL, *scale = NULL;
    CHECK_OK(lpx_tensor_from_blob(xs, LPX_F32, 1, shape, NULL, lpx_cpu(), NULL, NULL, &x));
    CHECK_OK(lpx_full(0, NULL, 1.0, LPX_F32, lpx_cpu(), &scale));
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.scale = scale;
    lpx_float8_stats st;
    lpx_tensor *q = NULL;
    CHECK_OK(lpx_float8_quantize(x, &o, &q, &st));
    const uint8_t *c = lpx_tensor_data(lpx_float8_data(q));
    CHECK(c[2] == 0x7E && c[3] == 0xFE && c[7] == 0x7E); /* +-448 */
    CHECK(c[4] == 0x00);                                  /* 1e-4 < 2^-10: underflow */
    CHECK(st.saturation == f32(3.0 / 8) && st.underflow == f32(1.0 / 7) && st.nan == 0);
    CHECK(isinf(st.amax));
    lpx_tensor_release(q);
    o.nonsaturating = true;
    CHECK_OK(lpx_float8_quantize(x, &o, &q, &st));
    c = lpx_tensor_data(lpx_float8_data(q));
    CHECK(c[2] == 0x7F && c[3] == 0xFF && c[7] == 0x7F); /* NaN */
    CHECK(st.saturation == f32(3.0 / 8));
    lpx_tensor_release(q);
    o.fp8 = LPX_F8E5M2;
    xs[2] = 70000.0f;
    CHECK_OK(lpx_float8_quantize(x, &o, &q, &st));
    c = lpx_tensor_data(lpx_float8_data(q));
    CHECK(c[2] == 0x7C && c[7] == 0x7C); /* inf */
    CHECK(c[3] == 0xE4);                 /* -1000 fits e5m2: nearest is -1024 = 1.11001.00 */
    CHECK(st.saturation == f32(2.0 / 8));
    lpx_tensor_release(q);
    lpx_tensor_release(scale);
    lpx_tensor_release(x);
}

static void test_nan_inputs(void)
{
    float xs[6] = {1.0f, NAN, -3.0f, 0.5f, 2.0f, -1.0f};
    int64_t shape[2] = {2, 3};
    lpx_tensor *x = NULL, *q = NULL, *scale = NULL;
    CHECK_OK(lpx_tensor_from_blob(xs, LPX_F32, 2, shape, NULL, lpx_cpu(), NULL, NULL, &x));
    /* dynamic scaling refuses: no scale can be derived from a NaN amax */
    CHECK_ERR(lpx_float8_quantize(x, NULL, &q, NULL), LPX_ENUMERIC);
    CHECK(q == NULL && strstr(lpx_last_error(), "NaN"));
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.granularity = LPX_FLOAT8_AXISWISE;
    o.axis = -1;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_ENUMERIC);
    CHECK(strstr(lpx_last_error(), "group 0"));
    /* static scaling encodes NaN as NaN and reports it */
    memset(&o, 0, sizeof o);
    CHECK_OK(lpx_full(0, NULL, 2.0, LPX_F32, lpx_cpu(), &scale));
    o.scale = scale;
    lpx_float8_stats st;
    CHECK_OK(lpx_float8_quantize(x, &o, &q, &st));
    CHECK((((const uint8_t *)lpx_tensor_data(lpx_float8_data(q)))[1] & 0x7F) == 0x7F);
    CHECK(isnan(st.amax) && st.nan == f32(1.0 / 6));
    double *v = values(q);
    CHECK(isnan(v[1]) && v[0] == 1.0 && v[2] == -3.0);
    free(v);
    lpx_tensor_release(q);
    /* static scale must be positive and finite, of the right shape */
    lpx_tensor *bad = NULL;
    CHECK_OK(lpx_full(0, NULL, -1.0, LPX_F32, lpx_cpu(), &bad));
    o.scale = bad;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_EINVAL);
    lpx_tensor_release(bad);
    int64_t s3[2] = {3, 1};
    CHECK_OK(lpx_full(2, s3, 1.0, LPX_F32, lpx_cpu(), &bad));
    o.scale = bad;
    o.granularity = LPX_FLOAT8_AXISWISE;
    o.axis = 1;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_ESHAPE);
    lpx_tensor_release(bad);
    /* bad options */
    memset(&o, 0, sizeof o);
    o.fp8 = LPX_BF16;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_EDTYPE);
    o.fp8 = 0;
    o.granularity = LPX_FLOAT8_AXISWISE;
    o.axis = 5;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_ERANGE);
    lpx_tensor *xi = NULL;
    CHECK_OK(lpx_zeros(2, shape, LPX_I32, lpx_cpu(), &xi));
    CHECK_ERR(lpx_float8_quantize(xi, NULL, &q, NULL), LPX_EDTYPE);
    CHECK_ERR(lpx_float8_quantize(NULL, NULL, &q, NULL), LPX_EINVAL);
    lpx_tensor_release(xi);
    lpx_tensor_release(scale);
    lpx_tensor_release(x);
}

static void test_scale_from_amax(void)
{
    float a[3] = {2.0f, 0.0f, 1000.0f};
    int64_t shape[1] = {3};
    lpx_tensor *am = NULL, *s = NULL, *si = NULL;
    CHECK_OK(lpx_tensor_from_blob(a, LPX_F32, 1, shape, NULL, lpx_cpu(), NULL, NULL, &am));
    CHECK_OK(lpx_fp8_scale_from_amax(am, LPX_F8E5M2, false, 0.0, &s, &si));
    CHECK(item(s, 0) == 28672.0 && item(s, 1) == f32(57344.0 / 1e-12) && item(s, 2) == f32(57.344));
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    CHECK_OK(lpx_fp8_scale_from_amax(am, LPX_F8E4M3FN, true, 65504.0, &s, &si));
    CHECK(item(s, 0) == 128.0 && item(s, 1) == 32768.0 && item(s, 2) == 0.25);
    CHECK(item(si, 2) == 4.0);
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    a[1] = NAN;
    CHECK_ERR(lpx_fp8_scale_from_amax(am, LPX_F8E4M3FN, false, 0.0, &s, &si), LPX_ENUMERIC);
    lpx_tensor_release(am);
}

/* ---- scaled GEMM --------------------------------------------------- */

/* Compares out (dense) with an f64 emulation on the same fp8 inputs:
 * ref = sa[m] * sb[n] * sum_k decode(a) decode(b) (+ bias). */
static void check_mm(lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_tensor *out, double tol, const char *what)
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

static void test_scaled_mm_vs_f64(void)
{
    enum { M = 48, K = 200, N = 72 };
    int64_t sa[2] = {M, K}, sb[2] = {K, N}, sbt[2] = {N, K}, snb[1] = {N};
    lpx_tensor *xa = rand_normal(2, sa, 101, 2.0, LPX_F32), *xb = rand_normal(2, sb, 102, 0.05, LPX_F32);
    lpx_tensor *xbt = rand_normal(2, sbt, 103, 0.05, LPX_F32), *bias = rand_normal(1, snb, 104, 1.0, LPX_F32);
    struct { lpx_dtype fa, fb; int ga, gb; } cases[] = {
        {LPX_F8E4M3FN, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, LPX_FLOAT8_TENSORWISE},
        {LPX_F8E4M3FN, LPX_F8E5M2, LPX_FLOAT8_TENSORWISE, LPX_FLOAT8_TENSORWISE},
        {LPX_F8E5M2, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, LPX_FLOAT8_AXISWISE},
        {LPX_F8E4M3FN, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, LPX_FLOAT8_TENSORWISE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lpx_tensor *qa = quant(xa, cases[i].fa, cases[i].ga, -1, false, NULL);
        /* b row-major [K, N] (column scales: amax over dim 0) and b as the
         * transpose of a row-major [N, K] (column-major storage) */
        lpx_tensor *qb = quant(xb, cases[i].fb, cases[i].gb, 0, false, NULL);
        lpx_tensor *qbt0 = quant(xbt, cases[i].fb, cases[i].gb, -1, false, NULL), *qbt = NULL;
        CHECK_OK(lpx_t(qbt0, &qbt));
        lpx_dtype outs[2] = {LPX_F32, LPX_BF16};
        for (int o = 0; o < 2; o++) {
            double tol = outs[o] == LPX_F32 ? 3e-3 : 7e-2;
            lpx_tensor *r1 = NULL, *r2 = NULL, *r3 = NULL;
            CHECK_OK(lpx_float8_mm(qa, qb, NULL, outs[o], &r1));
            CHECK_OK(lpx_float8_mm(qa, qbt, bias, outs[o], &r2));
            if (r1) check_mm(qa, qb, NULL, r1, tol, "row-major b");
            if (r2) check_mm(qa, qbt, bias, r2, tol, "column-major b + bias");
            /* A column-major too: (b^T a^T)^T through the dense op */
            lpx_tensor *at = NULL, *att = NULL;
            CHECK_OK(lpx_contiguous(lpx_float8_data(qa), &at));
            CHECK(r1 && lpx_tensor_dtype(r1) == outs[o]);
            lpx_tensor *at2 = NULL;
            CHECK_OK(lpx_t(at, &at2));            /* [K, M] view */
            CHECK_OK(lpx_contiguous(at2, &att));  /* [K, M] storage */
            lpx_tensor *acm = NULL;
            CHECK_OK(lpx_t(att, &acm));           /* [M, K] column-major */
            CHECK_OK(lpx_fp8_scaled_mm(acm, lpx_float8_scale_inv(qa), lpx_float8_data(qb), lpx_float8_scale_inv(qb),
                                       NULL, outs[o], &r3));
            if (r3) check_mm(qa, qb, NULL, r3, tol, "column-major a");
            lpx_tensor *rel[] = {r1, r2, r3, at, at2, att, acm};
            for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
        }
        lpx_tensor *rel[] = {qa, qb, qbt0, qbt};
        for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    }
    lpx_tensor *rel[] = {xa, xb, xbt, bias};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

/* B larger than the scratch budget: decoded in K panels per tile. */
static void test_scaled_mm_panels(void)
{
    int64_t sa[2] = {9, 1100}, sb[2] = {1100, 4100};
    lpx_tensor *xa = rand_normal(2, sa, 201, 1.0, LPX_F32), *xb = rand_normal(2, sb, 202, 1.0, LPX_F32);
    lpx_tensor *qa = quant(xa, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *qb = quant(xb, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL), *r = NULL;
    CHECK_OK(lpx_float8_mm(qa, qb, NULL, LPX_F32, &r));
    if (r) check_mm(qa, qb, NULL, r, 3e-3, "K panels");
    lpx_tensor *rel[] = {xa, xb, qa, qb, r};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

static void test_scaled_mm_errors(void)
{
    int64_t sa[2] = {8, 16}, sb[2] = {16, 4}, sbad[2] = {12, 4};
    lpx_tensor *xa = rand_normal(2, sa, 1, 1, LPX_F32), *xb = rand_normal(2, sb, 2, 1, LPX_F32), *xk = rand_normal(2, sbad, 3, 1, LPX_F32);
    lpx_tensor *a4 = quant(xa, LPX_F8E4M3FN, 0, 0, false, NULL), *a5 = quant(xa, LPX_F8E5M2, 0, 0, false, NULL);
    lpx_tensor *b4 = quant(xb, LPX_F8E4M3FN, 0, 0, false, NULL), *b5 = quant(xb, LPX_F8E5M2, 0, 0, false, NULL);
    lpx_tensor *bk = quant(xk, LPX_F8E4M3FN, 0, 0, false, NULL), *r = NULL;
    CHECK_ERR(lpx_float8_mm(a4, bk, NULL, LPX_FLOAT8_LOGICAL, &r), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "K mismatch"));
    CHECK_ERR(lpx_float8_mm(a5, b5, NULL, LPX_FLOAT8_LOGICAL, &r), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "e5m2"));
    CHECK_ERR(lpx_float8_mm(a4, b4, NULL, LPX_I32, &r), LPX_EDTYPE);
    CHECK_ERR(lpx_float8_mm(a4, xb, NULL, LPX_FLOAT8_LOGICAL, &r), LPX_EINVAL);
    CHECK_ERR(lpx_matmul(a4, xb, &r), LPX_ENOTIMPL);  /* dense b, no fallback */
    CHECK(strstr(lpx_last_error(), "matmul") && strstr(lpx_last_error(), "float8"));
    /* scales along K are refused */
    lpx_tensor *acol = quant(xa, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, 0, false, NULL);
    CHECK_ERR(lpx_float8_mm(acol, b4, NULL, LPX_FLOAT8_LOGICAL, &r), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "along K"));
    /* a layout the GEMM cannot take: every other column */
    lpx_tensor *da = lpx_float8_data(a4), *strided = NULL;
    int64_t sw[2] = {8, 8};
    (void)sw;
    CHECK_OK(lpx_slice(da, 1, 0, 16, 2, &strided));
    lpx_tensor *db = NULL;
    CHECK_OK(lpx_narrow(lpx_float8_data(b4), 0, 0, 8, &db));
    CHECK_ERR(lpx_fp8_scaled_mm(strided, lpx_float8_scale_inv(a4), db, lpx_float8_scale_inv(b4), NULL, LPX_F32, &r),
              LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "row-major"));
    /* dense-op argument checks */
    CHECK_ERR(lpx_fp8_scaled_mm(xa, lpx_float8_scale_inv(a4), lpx_float8_data(b4), lpx_float8_scale_inv(b4), NULL,
                                LPX_F32, &r), LPX_EDTYPE);
    int64_t s5[2] = {5, 1};
    lpx_tensor *s5t = NULL;
    CHECK_OK(lpx_full(2, s5, 1.0, LPX_F32, lpx_cpu(), &s5t));
    CHECK_ERR(lpx_fp8_scaled_mm(da, s5t, lpx_float8_data(b4), lpx_float8_scale_inv(b4), NULL, LPX_F32, &r),
              LPX_ESHAPE);
    CHECK(r == NULL);
    lpx_tensor *rel[] = {xa, xb, xk, a4, a5, b4, b5, bk, acol, strided, db, s5t};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

/* ---- delayed scaling ------------------------------------------------ */

static lpx_float8_delayed *delayed(int len, int algo, int margin, int interval)
{
    lpx_float8_delayed_config c = {len, algo, margin, interval, LPX_F8E4M3FN};
    lpx_float8_delayed *d = NULL;
    CHECK_OK(lpx_float8_delayed_new(&c, &d));
    return d;
}

static void test_delayed_history(void)
{
    /* max over a window of 4 */
    lpx_float8_delayed *d = delayed(4, LPX_FLOAT8_AMAX_MAX, 0, 1);
    CHECK(lpx_float8_delayed_scale(d) == 1.0f);
    double seq[] = {2, 4, 1, 1, 1, 1};
    float want[] = {224, 112, 112, 112, 112, 448};
    for (int i = 0; i < 6; i++) {
        CHECK_OK(lpx_float8_delayed_update(d, seq[i]));
        CHECKF(lpx_float8_delayed_scale(d) == want[i], "max step %d: scale %g want %g", i,
               (double)lpx_float8_delayed_scale(d), (double)want[i]);
    }
    float h[4];
    CHECK(lpx_float8_delayed_history(d, h, 4) == 4);
    CHECK(h[0] == 1 && h[1] == 1 && h[2] == 1 && h[3] == 1);
    CHECK(lpx_float8_delayed_steps(d) == 6);
    lpx_float8_delayed_free(d);
    /* most_recent */
    d = delayed(8, LPX_FLOAT8_AMAX_MOST_RECENT, 0, 1);
    double s2[] = {2, 8, 1};
    float w2[] = {224, 56, 448};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(lpx_float8_delayed_update(d, s2[i]));
        CHECK(lpx_float8_delayed_scale(d) == w2[i]);
    }
    CHECK(lpx_float8_delayed_history(d, h, 3) == 3 && h[0] == 1 && h[1] == 8 && h[2] == 2);
    lpx_float8_delayed_free(d);
    /* margin: scale = 448 / amax / 2^margin */
    d = delayed(4, LPX_FLOAT8_AMAX_MAX, 1, 1);
    CHECK_OK(lpx_float8_delayed_update(d, 2));
    CHECK(lpx_float8_delayed_scale(d) == 112.0f);
    lpx_float8_delayed_free(d);
    /* interval 3: the scale moves on the 3rd, 6th, ... update only */
    d = delayed(16, LPX_FLOAT8_AMAX_MAX, 0, 3);
    CHECK_OK(lpx_float8_delayed_update(d, 2));
    CHECK_OK(lpx_float8_delayed_update(d, 4));
    CHECK(lpx_float8_delayed_scale(d) == 1.0f);
    CHECK_OK(lpx_float8_delayed_update(d, 1));
    CHECK(lpx_float8_delayed_scale(d) == 112.0f);
    lpx_float8_delayed_free(d);
    /* zero, inf and NaN amaxes keep the previous scale; NaN/inf stay in
     * the window (max propagates them) until they roll out */
    d = delayed(2, LPX_FLOAT8_AMAX_MAX, 0, 1);
    CHECK_OK(lpx_float8_delayed_update(d, 0));
    CHECK(lpx_float8_delayed_scale(d) == 1.0f);
    CHECK_OK(lpx_float8_delayed_update(d, 7));
    CHECK(lpx_float8_delayed_scale(d) == 64.0f);
    CHECK_OK(lpx_float8_delayed_update(d, INFINITY));
    CHECK(lpx_float8_delayed_scale(d) == 64.0f);
    CHECK_OK(lpx_float8_delayed_update(d, 2));      /* window {inf, 2} */
    CHECK(lpx_float8_delayed_scale(d) == 64.0f);
    CHECK_OK(lpx_float8_delayed_update(d, 2));      /* window {2, 2} */
    CHECK(lpx_float8_delayed_scale(d) == 224.0f);
    CHECK_OK(lpx_float8_delayed_update(d, NAN));
    CHECK(lpx_float8_delayed_scale(d) == 224.0f);
    CHECK_OK(lpx_float8_delayed_update(d, 4));
    CHECK(lpx_float8_delayed_scale(d) == 224.0f);
    CHECK_OK(lpx_float8_delayed_update(d, 4));
    CHECK(lpx_float8_delayed_scale(d) == 112.0f);
    CHECK_ERR(lpx_float8_delayed_update(d, -1), LPX_EINVAL);
    CHECK_ERR(lpx_float8_delayed_update(NULL, 1), LPX_EINVAL);
    lpx_float8_delayed_free(d);
    /* bad configs */
    lpx_float8_delayed_config bad = {-1, 0, 0, 0, 0};
    CHECK_ERR(lpx_float8_delayed_new(&bad, &d), LPX_EINVAL);
    bad.history_len = 4;
    bad.algo = 7;
    CHECK_ERR(lpx_float8_delayed_new(&bad, &d), LPX_EINVAL);
    bad.algo = 0;
    bad.fp8 = LPX_F32 + 100;
    CHECK_ERR(lpx_float8_delayed_new(&bad, &d), LPX_EDTYPE);
    CHECK(d == NULL);
    /* defaults: history 1024, interval 1, e4m3fn */
    CHECK_OK(lpx_float8_delayed_new(NULL, &d));
    lpx_float8_delayed_config got;
    CHECK_OK(lpx_float8_delayed_get_config(d, &got));
    CHECK(got.history_len == 1024 && got.interval == 1 && got.fp8 == LPX_F8E4M3FN && got.algo == 0);
    lpx_float8_delayed_free(d);
}

static void test_delayed_save_load(void)
{
    lpx_float8_delayed *d = delayed(5, LPX_FLOAT8_AMAX_MAX, 2, 2);
    double seq[] = {3, 9, 0.5, 100, 7};
    for (int i = 0; i < 5; i++) CHECK_OK(lpx_float8_delayed_update(d, seq[i]));
    size_t need = 0;
    CHECK_OK(lpx_float8_delayed_save(d, NULL, 0, &need));
    unsigned char *blob = malloc(need), small[8];
    CHECK_ERR(lpx_float8_delayed_save(d, small, sizeof small, &need), LPX_ERANGE);
    CHECK_OK(lpx_float8_delayed_save(d, blob, need, &need));
    lpx_float8_delayed *e = delayed(1, LPX_FLOAT8_AMAX_MOST_RECENT, 0, 1);
    CHECK_OK(lpx_float8_delayed_load(e, blob, need));
    CHECK(lpx_float8_delayed_scale(e) == lpx_float8_delayed_scale(d));
    CHECK(lpx_float8_delayed_steps(e) == 5);
    /* both continue identically */
    double more[] = {1, 2, 300, 4};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(lpx_float8_delayed_update(d, more[i]));
        CHECK_OK(lpx_float8_delayed_update(e, more[i]));
        CHECK(lpx_float8_delayed_scale(e) == lpx_float8_delayed_scale(d));
    }
    float hd[5], he[5];
    CHECK(lpx_float8_delayed_history(d, hd, 5) == 5 && lpx_float8_delayed_history(e, he, 5) == 5);
    CHECK(!memcmp(hd, he, sizeof hd));
    /* corrupted blobs are refused and leave the state as it was */
    float before = lpx_float8_delayed_scale(e);
    unsigned char *bad = malloc(need);
    memcpy(bad, blob, need);
    bad[0] ^= 1;
    CHECK_ERR(lpx_float8_delayed_load(e, bad, need), LPX_EINVAL);
    CHECK_ERR(lpx_float8_delayed_load(e, blob, need - 1), LPX_EINVAL);
    CHECK_ERR(lpx_float8_delayed_load(e, blob, 10), LPX_EINVAL);
    memcpy(bad, blob, need);
    bad[16] = 9; /* algo */
    CHECK_ERR(lpx_float8_delayed_load(e, bad, need), LPX_EINVAL);
    memcpy(bad, blob, need);
    bad[12] = 0xFF, bad[13] = 0xFF, bad[14] = 0xFF, bad[15] = 0x7F; /* history_len */
    CHECK_ERR(lpx_float8_delayed_load(e, bad, need), LPX_EINVAL);
    memcpy(bad, blob, need);
    bad[need - 1] = 0xBF; /* a negative amax */
    CHECK_ERR(lpx_float8_delayed_load(e, bad, need), LPX_EINVAL);
    memcpy(bad, blob, need);
    memset(bad + 40, 0, 4); /* scale 0 */
    CHECK_ERR(lpx_float8_delayed_load(e, bad, need), LPX_EINVAL);
    CHECK(lpx_float8_delayed_scale(e) == before && lpx_float8_delayed_steps(e) == 9);
    free(bad);
    free(blob);
    lpx_float8_delayed_free(d);
    lpx_float8_delayed_free(e);
}

/* lpx_float8_quantize with a delayed state: casts with the current scale,
 * then records the amax. */
static void test_delayed_quantize(void)
{
    lpx_float8_delayed *d = delayed(4, LPX_FLOAT8_AMAX_MAX, 0, 1);
    int64_t shape[2] = {8, 8};
    lpx_tensor *x = rand_normal(2, shape, 9, 100.0, LPX_F32);  /* amax ~ 250: fits 448 at scale 1 */
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.delayed = d;
    lpx_float8_stats st;
    lpx_tensor *q = NULL;
    CHECK_OK(lpx_float8_quantize(x, &o, &q, &st));
    CHECK(item(lpx_float8_scale(q), 0) == 1.0);
    CHECK(lpx_float8_delayed_scale(d) == f32(448.0 / st.amax));
    lpx_tensor_release(q);
    CHECK_OK(lpx_float8_quantize(x, &o, &q, &st));
    CHECK(item(lpx_float8_scale(q), 0) == f32(448.0 / st.amax));
    lpx_tensor_release(q);
    o.granularity = LPX_FLOAT8_AXISWISE;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_EINVAL);
    o.granularity = 0;
    o.fp8 = LPX_F8E5M2;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_EDTYPE);
    lpx_tensor *s = NULL;
    CHECK_OK(lpx_full(0, NULL, 1.0, LPX_F32, lpx_cpu(), &s));
    o.fp8 = 0;
    o.scale = s;
    CHECK_ERR(lpx_float8_quantize(x, &o, &q, NULL), LPX_EINVAL);
    lpx_tensor_release(s);
    lpx_tensor_release(x);
    lpx_float8_delayed_free(d);
}

/* ---- Float8Linear ---------------------------------------------------- */

typedef struct lin_ref {
    int64_t M, K, N;
    lpx_tensor *x, *w, *b, *g;
    double *out, *gx, *gw;   /* f64 references */
} lin_ref;

static void lin_ref_init(lin_ref *r, int64_t M, int64_t K, int64_t N, lpx_dtype dt, uint64_t seed)
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

static void lin_ref_free(lin_ref *r)
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
static lin_sqnr run_linear(const lin_ref *ref, const lpx_float8_linear_recipe *r, lpx_float8_linear_report *rep,
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

/* Every preset on the full 256 x 512 x 1024 shape against f64. */
static void test_linear_presets(void)
{
    lin_ref ref;
    lin_ref_init(&ref, 256, 512, 1024, LPX_F32, 1000);
    const char *presets[] = {"tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed"};
    /* SQNR floors set from measurement (dB: out, grad_x, grad_W measured
     * 28.5/24.6/24.6, 28.6/28.5/28.5, 28.6/28.5/130.9, 28.5/24.5/24.6 on
     * these seeded inputs) minus a 1 dB margin (26% more noise power): the
     * arithmetic is exact-order, so the numbers move only when the numerics
     * do. A 1.5x scale error leaves 6 dB (error = half the signal); a
     * broken codec or scale costs more than the margin (scripts/mutate.py
     * lists the mutations this catches). grad_W in high precision:
     * floor 100 dB (f32 GEMM against f64). */
    static const double floors[4][3] = {
        {27.5, 23.6, 23.6}, {27.6, 27.5, 27.5}, {27.6, 27.5, 100.0}, {27.5, 23.5, 23.6}};
    for (int p = 0; p < 4; p++) {
        lpx_float8_linear_recipe r;
        CHECK_OK(lpx_float8_linear_recipe_preset(presets[p], &r));
        lpx_float8_linear_report rep;
        lin_sqnr s = run_linear(&ref, &r, &rep, NULL);
        printf("  %-20s out %.1f dB  grad_x %.1f dB  grad_W %.1f dB\n", presets[p], s.out, s.gx, s.gw);
        CHECKF(s.out >= floors[p][0] && s.gx >= floors[p][1] && s.gw >= floors[p][2],
               "%s: SQNR out %.2f gx %.2f gw %.2f below the floors %.1f/%.1f/%.1f", presets[p], s.out, s.gx, s.gw,
               floors[p][0], floors[p][1], floors[p][2]);
        CHECK(rep.fprop.mode == LPX_FLOAT8_GEMM_FP8 && rep.dgrad.mode == LPX_FLOAT8_GEMM_FP8);
        CHECK(rep.wgrad.mode == (p == 2 ? LPX_FLOAT8_GEMM_HIGH_PRECISION : LPX_FLOAT8_GEMM_FP8));
        CHECK(rep.fprop.a.quantized && rep.fprop.a.stats.numel == 256 * 512);
        if (p == 0 || p == 3) {
            /* tensorwise: W and x are cast once, g once; dgrad/wgrad reuse
             * (on the CPU in row-major form: its GEMM reads either layout) */
            CHECK(rep.dgrad.b.reused && rep.wgrad.b.reused && rep.wgrad.a.reused);
            CHECK(rep.dgrad.a.dtype == LPX_F8E5M2 && rep.fprop.a.dtype == LPX_F8E4M3FN);
        } else {
            /* rowwise on the CPU: W along the other dim for dgrad (the GPU
             * casts both from one read: test_cuda_gemm_nn.c), power-of-2
             * scales */
            CHECK(rep.dgrad.b.quantized && !rep.dgrad.b.reused);
            int e;
            CHECK(frexp(rep.fprop.a.stats.scale, &e) == 0.5);
        }
    }
    lin_ref_free(&ref);
}

/* fast_accum: the presets set FPROP; the CPU sums exactly either way (same
 * bits); a recipe of the 1.0 layout (struct_size ending before
 * fast_accum) is read with fast_accum 0; unknown bits are refused. */
static void test_linear_fast_accum(void)
{
    lin_ref ref;
    lin_ref_init(&ref, 32, 64, 48, LPX_F32, 4100);
    lpx_float8_linear_recipe r;
    CHECK_OK(lpx_float8_linear_recipe_preset("rowwise", &r));
    CHECK(r.fast_accum == LPX_FLOAT8_FAST_ACCUM_FPROP);
    lpx_tensor *o1 = NULL, *o2 = NULL, *o3 = NULL;
    CHECK_OK(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &o1, NULL, NULL));
    lpx_float8_linear_recipe old = r;
    old.struct_size = offsetof(lpx_float8_linear_recipe, fast_accum);
    old.fast_accum = 0x1234; /* beyond the 1.0 struct: never read */
    CHECK_OK(lpx_float8_linear_forward(&old, NULL, ref.x, ref.w, NULL, &o2, NULL, NULL));
    r.fast_accum = 7;
    CHECK_OK(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &o3, NULL, NULL));
    if (o1 && o2 && o3) {
        double *a = values(o1), *b = values(o2), *c = values(o3);
        CHECK(!memcmp(a, b, (size_t)(32 * 48) * sizeof *a) && !memcmp(a, c, (size_t)(32 * 48) * sizeof *a));
        free(a);
        free(b);
        free(c);
    }
    lpx_tensor *bad = NULL;
    r.fast_accum = 8;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &bad, NULL, NULL), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "fast_accum"));
    r.fast_accum = 1;
    r.struct_size = 12;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &bad, NULL, NULL), LPX_EINVAL);
    /* the dense op: unknown flags refused, FAST_ACCUM the same bits on the CPU */
    lpx_tensor *qa = quant(ref.x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL);
    lpx_tensor *qw = quant(ref.w, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL), *bt = NULL, *m1 = NULL, *m2 = NULL;
    CHECK_OK(lpx_t(lpx_float8_data(qw), &bt));
    CHECK_OK(lpx_fp8_scaled_mm(lpx_float8_data(qa), lpx_float8_scale_inv(qa), bt, lpx_float8_scale_inv(qw), NULL,
                               LPX_F32, &m1));
    CHECK_OK(lpx_fp8_scaled_mm_ex(lpx_float8_data(qa), lpx_float8_scale_inv(qa), bt, lpx_float8_scale_inv(qw), NULL,
                                  LPX_F32, LPX_FP8_MM_FAST_ACCUM, &m2));
    CHECK(m1 && m2 && !memcmp(lpx_tensor_data(m1), lpx_tensor_data(m2), (size_t)(32 * 48) * sizeof(float)));
    CHECK_ERR(lpx_fp8_scaled_mm_ex(lpx_float8_data(qa), lpx_float8_scale_inv(qa), bt, lpx_float8_scale_inv(qw), NULL,
                                   LPX_F32, 2, &bad),
              LPX_EINVAL);
    CHECK(bad == NULL);
    lpx_tensor *rel[] = {o1, o2, o3, qa, qw, bt, m1, m2};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    lin_ref_free(&ref);
}

/* Per-GEMM overrides: high precision everywhere matches f64 to f32
 * accuracy; fake-quant gives the fp8 numerics without the fp8 GEMM. */
static void test_linear_overrides(void)
{
    lin_ref ref;
    lin_ref_init(&ref, 64, 96, 80, LPX_F32, 2000);
    lpx_float8_linear_recipe r;
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    double *fp8_out = NULL, *fake_out = NULL;
    lin_sqnr s8 = run_linear(&ref, &r, NULL, &fp8_out);
    r.fprop.mode = r.dgrad.mode = r.wgrad.mode = LPX_FLOAT8_GEMM_FAKE_QUANT;
    lpx_float8_linear_report rep;
    lin_sqnr sf = run_linear(&ref, &r, &rep, &fake_out);
    CHECK(rep.fprop.mode == LPX_FLOAT8_GEMM_FAKE_QUANT && rep.wgrad.a.dtype == LPX_F8E5M2);
    /* same quantized values: fake-quant and fp8 agree far beyond fp8 noise */
    if (fp8_out && fake_out) {
        double sq = sqnr_db(fake_out, fp8_out, 64 * 80);
        CHECKF(sq > 80.0, "fake-quant vs fp8 GEMM: %.1f dB", sq);
    }
    CHECK(fabs(sf.out - s8.out) < 0.1 && fabs(sf.gx - s8.gx) < 0.1 && fabs(sf.gw - s8.gw) < 0.1);
    r.fprop.mode = r.dgrad.mode = r.wgrad.mode = LPX_FLOAT8_GEMM_HIGH_PRECISION;
    lin_sqnr sh = run_linear(&ref, &r, &rep, NULL);
    CHECKF(sh.out > 100 && sh.gx > 100 && sh.gw > 100, "high precision: %.1f %.1f %.1f", sh.out, sh.gx, sh.gw);
    CHECK(rep.fprop.mode == LPX_FLOAT8_GEMM_HIGH_PRECISION && !rep.fprop.a.quantized);
    /* one GEMM in high precision lifts only that gradient */
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    r.dgrad.mode = LPX_FLOAT8_GEMM_HIGH_PRECISION;
    lin_sqnr s1 = run_linear(&ref, &r, NULL, NULL);
    CHECK(s1.gx > 100 && s1.gw < 40 && s1.out < 40);
    /* bf16 layer */
    lin_ref rb;
    lin_ref_init(&rb, 64, 96, 80, LPX_BF16, 3000);
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    lin_sqnr sb = run_linear(&rb, &r, NULL, NULL);
    CHECKF(sb.out >= 18 && sb.gx >= 17 && sb.gw >= 17, "bf16: %.1f %.1f %.1f", sb.out, sb.gx, sb.gw);
    lin_ref_free(&rb);
    free(fp8_out);
    free(fake_out);
    lin_ref_free(&ref);
}

/* Operands already in fp8 are used as they are: same result, no cast. */
static void test_linear_already_fp8(void)
{
    lin_ref ref;
    lin_ref_init(&ref, 32, 64, 48, LPX_F32, 4000);
    lpx_float8_linear_recipe r;
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    lpx_tensor *out1 = NULL, *out2 = NULL;
    CHECK_OK(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, ref.b, &out1, NULL, NULL));
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.role = LPX_FLOAT8_ROLE_INPUT;
    lpx_tensor *xq = NULL, *wq = NULL;
    CHECK_OK(lpx_float8_quantize(ref.x, &o, &xq, NULL));
    o.role = LPX_FLOAT8_ROLE_WEIGHT;
    CHECK_OK(lpx_float8_quantize(ref.w, &o, &wq, NULL));
    lpx_float8_linear_report rep;
    lpx_float8_linear_ctx *ctx = NULL;
    CHECK_OK(lpx_float8_linear_forward(&r, NULL, xq, wq, ref.b, &out2, &ctx, &rep));
    CHECK(rep.fprop.a.given_fp8 && rep.fprop.b.given_fp8 && !rep.fprop.a.quantized);
    if (out1 && out2) {
        double *a = values(out1), *b = values(out2);
        CHECK(!memcmp(a, b, (size_t)(32 * 48) * sizeof *a));
        free(a);
        free(b);
    }
    /* the backward uses them too (tensorwise fits every GEMM) */
    lpx_tensor *gx = NULL, *gw = NULL;
    CHECK_OK(lpx_float8_linear_backward(ctx, ref.g, &gx, &gw, NULL, &rep));
    CHECK(rep.dgrad.b.given_fp8 && rep.wgrad.b.given_fp8 && rep.dgrad.a.quantized);
    lpx_float8_linear_ctx_free(ctx);
    /* a 3-D float8 input [2, 16, 64] goes through the reshape handler */
    lpx_tensor *x3 = NULL, *o3 = NULL;
    int64_t s3[3] = {2, 16, 64};
    CHECK_OK(lpx_view(xq, 3, s3, &x3));
    CHECK(lpx_float8_is(x3));
    CHECK_OK(lpx_float8_linear_forward(&r, NULL, x3, wq, ref.b, &o3, NULL, NULL));
    CHECK(o3 && lpx_tensor_ndim(o3) == 3 && lpx_tensor_shape(o3)[2] == 48);
    if (o3 && out2) {
        double *a = values(o3), *b = values(out2);
        CHECK(!memcmp(a, b, (size_t)(32 * 48) * sizeof *a));
        free(a);
        free(b);
    }
    /* a float8 operand with the wrong role is refused */
    lpx_tensor *bad = NULL;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, wq, wq, NULL, &bad, NULL, NULL), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "role"));
    lpx_tensor *rel[] = {out1, out2, xq, wq, gx, gw, x3, o3};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    lin_ref_free(&ref);
}

static void test_linear_errors(void)
{
    lin_ref ref;
    lin_ref_init(&ref, 8, 16, 12, LPX_F32, 5000);
    lpx_float8_linear_recipe r;
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    lpx_tensor *out = NULL, *gx = NULL;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.g, NULL, &out, NULL, NULL), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "K mismatch"));
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, ref.x, &out, NULL, NULL), LPX_ESHAPE);
    CHECK_ERR(lpx_float8_linear_recipe_preset("fp4", &r), LPX_ENOTFOUND);
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    r.fprop.a.dtype = LPX_F8E5M2;
    r.fprop.b.dtype = LPX_F8E5M2;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &out, NULL, NULL), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "e5m2"));
    CHECK_OK(lpx_float8_linear_recipe_preset("delayed", &r));
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &out, NULL, NULL), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "state"));
    r.struct_size = 0;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &out, NULL, NULL), LPX_EINVAL);
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    r.wgrad.mode = 9;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &out, NULL, NULL), LPX_EINVAL);
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    r.dgrad.a.scaling = LPX_FLOAT8_DELAYED;
    r.dgrad.a.granularity = LPX_FLOAT8_AXISWISE;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &out, NULL, NULL), LPX_EINVAL);
    /* NaN in the input under dynamic scaling: a clear numeric error */
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    lpx_tensor *xn = NULL;
    CHECK_OK(lpx_clone(ref.x, &xn));
    ((float *)lpx_tensor_data(xn))[5] = NAN;
    CHECK_ERR(lpx_float8_linear_forward(&r, NULL, xn, ref.w, NULL, &out, NULL, NULL), LPX_ENUMERIC);
    /* ... while high precision propagates it */
    r.fprop.mode = LPX_FLOAT8_GEMM_HIGH_PRECISION;
    CHECK_OK(lpx_float8_linear_forward(&r, NULL, xn, ref.w, NULL, &out, NULL, NULL));
    lpx_tensor_release(out);
    /* backward: grad_out of the wrong shape */
    lpx_float8_linear_ctx *ctx = NULL;
    CHECK_OK(lpx_float8_linear_recipe_preset("tensorwise", &r));
    CHECK_OK(lpx_float8_linear_forward(&r, NULL, ref.x, ref.w, NULL, &out, &ctx, NULL));
    CHECK_ERR(lpx_float8_linear_backward(ctx, ref.x, &gx, NULL, NULL, NULL), LPX_ESHAPE);
    CHECK_ERR(lpx_float8_linear_backward(NULL, ref.g, &gx, NULL, NULL, NULL), LPX_EINVAL);
    /* only grad_x requested */
    CHECK_OK(lpx_float8_linear_backward(ctx, ref.g, &gx, NULL, NULL, NULL));
    CHECK(gx && lpx_tensor_shape(gx)[1] == 16);
    lpx_float8_linear_ctx_free(ctx);
    lpx_tensor *rel[] = {out, gx, xn};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    lin_ref_free(&ref);
}

/* A few delayed-recipe steps: the states record one amax per tensor per
 * step (x and W in the forward, g in the backward). */
static void test_linear_delayed_steps(void)
{
    lin_ref ref;
    lin_ref_init(&ref, 16, 32, 24, LPX_F32, 6000);
    lpx_float8_linear_recipe r;
    CHECK_OK(lpx_float8_linear_recipe_preset("delayed", &r));
    lpx_float8_linear_state st;
    CHECK_OK(lpx_float8_linear_state_init(&st, &r));
    CHECK(st.input && st.weight && st.grad_output);
    for (int step = 0; step < 3; step++) {
        lpx_tensor *out = NULL, *gx = NULL, *gw = NULL;
        lpx_float8_linear_ctx *ctx = NULL;
        CHECK_OK(lpx_float8_linear_forward(&r, &st, ref.x, ref.w, NULL, &out, &ctx, NULL));
        CHECK_OK(lpx_float8_linear_backward(ctx, ref.g, &gx, &gw, NULL, NULL));
        lpx_float8_linear_ctx_free(ctx);
        lpx_tensor_release(out);
        lpx_tensor_release(gx);
        lpx_tensor_release(gw);
    }
    CHECK(lpx_float8_delayed_steps(st.input) == 3 && lpx_float8_delayed_steps(st.weight) == 3 &&
          lpx_float8_delayed_steps(st.grad_output) == 3);
    double *G = values(ref.g), gmax = 0;
    for (int i = 0; i < 16 * 24; i++) gmax = fmax(gmax, fabs(G[i]));
    free(G);
    CHECK(lpx_float8_delayed_scale(st.grad_output) == f32(57344.0 / gmax));
    lpx_float8_linear_state_destroy(&st);
    CHECK(st.input == NULL);
    /* the tensorwise preset needs no state */
    CHECK_OK(lpx_float8_linear_recipe_preset(NULL, &r));
    CHECK_OK(lpx_float8_linear_state_init(&st, &r));
    CHECK(!st.input && !st.weight && !st.grad_output);
    lin_ref_free(&ref);
}

/* ---- views, handlers -------------------------------------------------- */

static bool same_values(lpx_tensor *a, lpx_tensor *b)
{
    if (lpx_tensor_numel(a) != lpx_tensor_numel(b)) return false;
    double *x = values(a), *y = values(b);
    bool same = !memcmp(x, y, (size_t)lpx_tensor_numel(a) * sizeof *x);
    free(x);
    free(y);
    return same;
}

static void test_views(void)
{
    int64_t shape[2] = {12, 20};
    lpx_tensor *x = rand_normal(2, shape, 31, 1.0, LPX_F32);
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *dq = NULL;
    CHECK_OK(lpx_float8_dequantize(q, LPX_FLOAT8_LOGICAL, &dq));
    /* transpose: scales follow their axis */
    lpx_tensor *qt = NULL, *dqt = NULL;
    CHECK_OK(lpx_t(q, &qt));
    CHECK(lpx_float8_is(qt) && lpx_tensor_shape(qt)[0] == 20);
    lpx_float8_info info;
    CHECK_OK(lpx_float8_get_info(qt, &info));
    CHECK(info.axis == 0);
    CHECK(lpx_tensor_shape(lpx_float8_scale(qt))[0] == 1 && lpx_tensor_shape(lpx_float8_scale(qt))[1] == 12);
    CHECK(lpx_tensor_shares_storage(lpx_float8_data(qt), lpx_float8_data(q)));
    CHECK_OK(lpx_t(dq, &dqt));
    CHECK(same_values(qt, dqt));
    lpx_tensor *qtt = NULL;
    CHECK_OK(lpx_transpose(qt, -1, 0, &qtt));
    CHECK(same_values(qtt, dq));
    /* slice / narrow / chunk along dim 0: row scales are cut with rows */
    lpx_tensor *qs = NULL, *ds = NULL;
    CHECK_OK(lpx_slice(q, 0, 2, 11, 3, &qs));
    CHECK_OK(lpx_slice(dq, 0, 2, 11, 3, &ds));
    CHECK(lpx_float8_is(qs) && lpx_tensor_shape(lpx_float8_scale(qs))[0] == 3 && same_values(qs, ds));
    lpx_tensor *chunks[4] = {0}, *dchunks[4] = {0};
    int n = 0, dn = 0;
    CHECK_OK(lpx_chunk(q, 3, 0, chunks, 4, &n));
    CHECK_OK(lpx_chunk(dq, 3, 0, dchunks, 4, &dn));
    CHECK(n == 3 && dn == 3);
    for (int i = 0; i < n && i < dn; i++) CHECK(lpx_float8_is(chunks[i]) && same_values(chunks[i], dchunks[i]));
    /* narrow along the scaled axis keeps the [M, 1] scales */
    lpx_tensor *qn = NULL, *dn2 = NULL;
    CHECK_OK(lpx_narrow(q, 1, 5, 7, &qn));
    CHECK_OK(lpx_narrow(dq, 1, 5, 7, &dn2));
    CHECK(lpx_tensor_shape(lpx_float8_scale(qn))[1] == 1 && same_values(qn, dn2));
    /* view / reshape: rows regroup with their scales */
    int64_t s3[3] = {3, 4, 20}, bad[2] = {20, 12};
    lpx_tensor *qv = NULL, *dv = NULL, *qbad = NULL;
    CHECK_OK(lpx_view(q, 3, s3, &qv));
    CHECK_OK(lpx_view(dq, 3, s3, &dv));
    CHECK(lpx_tensor_ndim(lpx_float8_scale(qv)) == 3 && same_values(qv, dv));
    CHECK_ERR(lpx_reshape(q, 2, bad, &qbad), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "float8"));
    /* tensorwise: any reshape */
    lpx_tensor *qw = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL), *qwr = NULL, *dwr = NULL,
               *dw = NULL;
    int64_t flat[1] = {-1};
    CHECK_OK(lpx_reshape(qw, 1, flat, &qwr));
    CHECK_OK(lpx_float8_dequantize(qw, LPX_FLOAT8_LOGICAL, &dw));
    CHECK_OK(lpx_reshape(dw, 1, flat, &dwr));
    CHECK(lpx_tensor_ndim(qwr) == 1 && same_values(qwr, dwr));
    /* contiguous of a transposed float8 copies the fp8 bytes only */
    lpx_tensor *qc = NULL;
    CHECK_OK(lpx_contiguous(qt, &qc));
    CHECK(lpx_tensor_is_contiguous(lpx_float8_data(qc)) && same_values(qc, dqt));
    /* clone owns its storage; detach shares it */
    lpx_tensor *qcl = NULL, *qd = NULL;
    CHECK_OK(lpx_clone(q, &qcl));
    CHECK_OK(lpx_detach(q, &qd));
    CHECK(!lpx_tensor_shares_storage(lpx_float8_data(qcl), lpx_float8_data(q)));
    CHECK(lpx_float8_data(qd) == lpx_float8_data(q) && same_values(qcl, dq));
    /* cast = dequantize, to any float dtype */
    lpx_tensor *cb = NULL, *cf = NULL, *c8 = NULL;
    CHECK_OK(lpx_cast(q, LPX_BF16, false, &cb));
    CHECK_OK(lpx_cast(q, LPX_F32, false, &cf));
    CHECK_OK(lpx_cast(q, LPX_F8E5M2, true, &c8));
    CHECK(!lpx_float8_is(cf) && lpx_tensor_dtype(cb) == LPX_BF16 && same_values(cf, dq));
    CHECK(lpx_tensor_dtype(c8) == LPX_F8E5M2);
    /* copy_ into float8 re-quantizes with its own scales; copy_ out
     * dequantizes */
    lpx_tensor *dst = NULL, *back = NULL;
    CHECK_OK(lpx_clone(q, &dst));
    CHECK_OK(lpx_copy_(dst, dq));
    CHECK(!memcmp(lpx_tensor_data(lpx_float8_data(dst)), lpx_tensor_data(lpx_float8_data(q)), 12 * 20));
    CHECK_OK(lpx_zeros(2, shape, LPX_F32, lpx_cpu(), &back));
    CHECK_OK(lpx_copy_(back, q));
    CHECK(same_values(back, dq));
    /* copy_ into a row slice of a float8 tensor writes through to it */
    lpx_tensor *row = NULL, *zr = NULL;
    int64_t rs[1] = {20};
    CHECK_OK(lpx_narrow(dst, 0, 4, 1, &row));
    CHECK_OK(lpx_zeros(1, rs, LPX_F32, lpx_cpu(), &zr));
    CHECK_OK(lpx_copy_(row, zr));
    const uint8_t *dc = lpx_tensor_data(lpx_float8_data(dst));
    int nz = 0;
    for (int k = 0; k < 20; k++) nz += dc[4 * 20 + k] != 0;
    CHECK(nz == 0 && dc[3 * 20] == ((const uint8_t *)lpx_tensor_data(lpx_float8_data(q)))[3 * 20]);
    lpx_tensor *rel[] = {x, q, dq, qt, dqt, qtt, qs, ds, qn, dn2, qv, dv, qw, qwr, dwr, dw, qc, qcl, qd,
                         cb, cf, c8, dst, back, row, zr};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    for (int i = 0; i < 4; i++) {
        lpx_tensor_release(chunks[i]);
        lpx_tensor_release(dchunks[i]);
    }
}

static void test_gemm_handlers(void)
{
    int64_t sx[3] = {2, 8, 32}, sw[2] = {24, 32}, sb[1] = {24}, sc[2] = {16, 24};
    lpx_tensor *x = rand_normal(3, sx, 41, 1.0, LPX_F32), *w = rand_normal(2, sw, 42, 0.2, LPX_F32);
    lpx_tensor *b = rand_normal(1, sb, 43, 1.0, LPX_F32), *cc = rand_normal(2, sc, 44, 1.0, LPX_F32);
    lpx_tensor *qx = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *qw = quant(w, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *dx = NULL, *dw = NULL, *y = NULL, *yref = NULL;
    CHECK_OK(lpx_float8_dequantize(qx, LPX_FLOAT8_LOGICAL, &dx));
    CHECK_OK(lpx_float8_dequantize(qw, LPX_FLOAT8_LOGICAL, &dw));
    /* linear(float8 x [2, 8, 32], float8 w) = linear on the dequantized values */
    CHECK_OK(lpx_linear(qx, qw, b, &y));
    CHECK_OK(lpx_linear(dx, dw, b, &yref));
    CHECK(y && lpx_tensor_ndim(y) == 3 && !lpx_float8_is(y));
    if (y && yref) {
        double *a = values(y), *r = values(yref), err = 0, mx = 0;
        for (int i = 0; i < 2 * 8 * 24; i++) {
            err = fmax(err, fabs(a[i] - r[i]));
            mx = fmax(mx, fabs(r[i]));
        }
        CHECKF(err <= 1e-5 * mx, "linear: %.3g", err / mx);
        free(a);
        free(r);
    }
    /* matmul with W^T and addmm */
    lpx_tensor *qwt = NULL, *m = NULL, *mref = NULL, *dwt = NULL, *x2 = NULL, *dx2 = NULL, *am = NULL, *amref = NULL;
    int64_t s2[2] = {16, 32};
    CHECK_OK(lpx_t(qw, &qwt));
    CHECK_OK(lpx_t(dw, &dwt));
    CHECK_OK(lpx_reshape(qx, 2, s2, &x2));
    CHECK_OK(lpx_reshape(dx, 2, s2, &dx2));
    CHECK_OK(lpx_matmul(x2, qwt, &m));
    CHECK_OK(lpx_matmul(dx2, dwt, &mref));
    CHECK_OK(lpx_addmm(cc, x2, qwt, 0.5, 2.0, &am));
    CHECK_OK(lpx_addmm(cc, dx2, dwt, 0.5, 2.0, &amref));
    if (m && mref && am && amref) {
        double *a = values(m), *r = values(mref), *p = values(am), *pr = values(amref), e1 = 0, e2 = 0, mx = 0;
        for (int i = 0; i < 16 * 24; i++) {
            e1 = fmax(e1, fabs(a[i] - r[i]));
            e2 = fmax(e2, fabs(p[i] - pr[i]));
            mx = fmax(mx, fabs(pr[i]));
        }
        CHECK(e1 <= 1e-5 * mx && e2 <= 1e-5 * mx);
        free(a);
        free(r);
        free(p);
        free(pr);
    }
    /* matmul into a caller out */
    lpx_tensor *o = NULL;
    CHECK_OK(lpx_zeros(2, sc, LPX_F32, lpx_cpu(), &o));
    CHECK_OK(lpx_matmul_out(x2, qwt, o));
    CHECK(same_values(o, m));
    lpx_tensor *rel[] = {x, w, b, cc, qx, qw, dx, dw, y, yref, qwt, m, mref, dwt, x2, dx2, am, amref, o};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

/* The opt-in fallback: off, an op without a handler fails naming op and
 * kind; on, it runs dequantized and the trace counts it. */
static void test_fallback_and_trace(void)
{
    int64_t shape[2] = {4, 6};
    lpx_tensor *x = rand_normal(2, shape, 51, 1.0, LPX_F32);
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL), *r = NULL, *dq = NULL, *ref = NULL;
    CHECK(!lpx_float8_fallback_enabled());
    CHECK_ERR(lpx_add(q, q, &r), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "add") && strstr(lpx_last_error(), "float8"));
    CHECK_OK(lpx_float8_set_fallback(true));
    CHECK_OK(lpx_float8_set_fallback(true)); /* idempotent */
    CHECK(lpx_float8_fallback_enabled());
    int key = lpx_kind_key(lpx_float8_kind());
    CHECK_OK(lpx_trace_start(NULL));
    CHECK_OK(lpx_add(q, x, &r));
    CHECK_OK(lpx_float8_dequantize(q, LPX_FLOAT8_LOGICAL, &dq));
    CHECK_OK(lpx_add(dq, x, &ref));
    CHECK(r && !lpx_float8_is(r) && same_values(r, ref));
    lpx_tensor *s = NULL;
    CHECK_OK(lpx_sum(q, 0, NULL, false, &s));
    /* in place on a float8 tensor: written back with its own scale */
    lpx_tensor *qc = NULL;
    CHECK_OK(lpx_clone(q, &qc));
    CHECK_OK(lpx_fill_(qc, 0.5));
    double *v = values(qc);
    /* 0.5 * scale rounded to e4m3 (3 mantissa bits) and back */
    CHECK(fabs(v[0] - 0.5) <= 0.5 / 16 && v[23] == v[0]);
    free(v);
    /* a mixed GEMM goes to the fallback too */
    lpx_tensor *xt = NULL, *mm = NULL;
    CHECK_OK(lpx_t(x, &xt));
    CHECK_OK(lpx_matmul(q, xt, &mm));
    CHECK_OK(lpx_trace_stop());
    CHECK(lpx_trace_fallback_count(LPX_OP_add, key) == 1);
    CHECK(lpx_trace_fallback_count(LPX_OP_sum, key) == 1);
    CHECK(lpx_trace_fallback_count(LPX_OP_fill_, key) == 1);
    CHECK(lpx_trace_count(LPX_OP_add, key) == 1);         /* the fallback's own call */
    CHECK(lpx_trace_count(LPX_OP_add, LPX_KEY_CPU) == 2); /* its dense add + the reference */
    CHECK(lpx_trace_count(LPX_OP_fp8_dequantize, LPX_KEY_CPU) >= 3);
    CHECK_OK(lpx_float8_set_fallback(false));
    CHECK(!lpx_float8_fallback_enabled());
    lpx_tensor *r2 = NULL;
    CHECK_ERR(lpx_add(q, q, &r2), LPX_ENOTIMPL);
    lpx_tensor *rel[] = {x, q, r, dq, ref, s, qc, xt, mm};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

/* ---- flatten / unflatten, describe, hooks ------------------------------ */

static void test_unflatten(void)
{
    int64_t shape[2] = {6, 10};
    lpx_tensor *x = rand_normal(2, shape, 61, 1.0, LPX_F32);
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    const lpx_kind *k = lpx_float8_kind();
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    lpx_tensor *inner[3] = {lpx_tensor_inner(q, 0), lpx_tensor_inner(q, 1), lpx_tensor_inner(q, 2)};
    size_t msz = 0;
    const void *meta = lpx_tensor_meta(q, &msz);
    unsigned char m[64];
    memcpy(m, meta, msz);
    lpx_tensor *r = NULL;
    CHECK_OK(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, m, msz, &r));
    CHECK(r && same_values(r, q));
    lpx_tensor_release(r);
    char desc[256];
    CHECK(vt->describe(q, desc, sizeof desc) > 0 && strstr(desc, "float8") && strstr(desc, "axiswise"));
    /* bad inputs, each refused with a message */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 2, m, msz, &r), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, m, msz - 1, &r), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(k, LPX_F8E4M3FN, 2, shape, inner, 3, m, msz, &r), LPX_EDTYPE);
    int64_t wrong[2] = {6, 11};
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, wrong, inner, 3, m, msz, &r), LPX_ESHAPE);
    unsigned char mb[64];
    memcpy(mb, m, msz);
    mb[0] ^= 0xFF;
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, mb, msz, &r), LPX_EINVAL);
    memcpy(mb, m, msz);
    mb[8] = 7; /* axis out of range */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, mb, msz, &r), LPX_EINVAL);
    memcpy(mb, m, msz);
    mb[6] = 9; /* role */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, mb, msz, &r), LPX_EINVAL);
    lpx_tensor *swapped[3] = {inner[0], inner[2], inner[2]}; /* scale_inv is not 1/scale */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, swapped, 3, m, msz, &r), LPX_EINVAL);
    lpx_tensor *dense_as_data[3] = {x, inner[1], inner[2]};
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, dense_as_data, 3, m, msz, &r), LPX_EDTYPE);
    lpx_tensor *neg = NULL, *negs[3];
    CHECK_OK(lpx_mul_scalar(inner[1], -1.0, &neg));
    negs[0] = inner[0], negs[1] = neg, negs[2] = inner[2];
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, negs, 3, m, msz, &r), LPX_EINVAL);
    lpx_tensor *ts[3] = {inner[0], x, inner[2]}; /* scale of the data's shape */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, ts, 3, m, msz, &r), LPX_ESHAPE);
    CHECK(r == NULL);
    /* lpx_float8_from_data wraps existing bytes */
    lpx_tensor *sc = NULL, *w = NULL;
    CHECK_OK(lpx_full(1, (int64_t[]){1}, 4.0, LPX_F32, lpx_cpu(), &sc));
    CHECK_OK(lpx_float8_from_data(inner[0], sc, LPX_BF16, LPX_FLOAT8_ROLE_WEIGHT, LPX_FLOAT8_TENSORWISE, 0, &w));
    CHECK(w && lpx_tensor_dtype(w) == LPX_BF16 && item(lpx_float8_scale_inv(w), 0) == 0.25);
    CHECK_ERR(lpx_float8_from_data(x, sc, LPX_F32, 0, 0, 0, &r), LPX_EDTYPE);
    CHECK_ERR(lpx_float8_from_data(inner[0], sc, LPX_F32, 0, LPX_FLOAT8_AXISWISE, 0, &r), LPX_ESHAPE);
    CHECK_ERR(lpx_float8_from_data(inner[0], sc, LPX_F32, 7, 0, 0, &r), LPX_EINVAL);
    lpx_tensor *rel[] = {x, q, neg, sc, w};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

/* Two dim-0 shards through pre_all_gather, a simulated gather (cat along
 * dim 0), post_all_gather: the result equals the unsharded tensor. */
static void gather_roundtrip(lpx_tensor *full, bool expect_ok)
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

static void test_all_gather_hooks(void)
{
    int64_t shape[2] = {10, 16};
    lpx_tensor *x = rand_normal(2, shape, 71, 1.0, LPX_F32);
    lpx_tensor *qt = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL);
    lpx_tensor *qr = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *qc = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, 0, false, NULL);
    gather_roundtrip(qt, true);
    gather_roundtrip(qr, true);
    gather_roundtrip(qc, false);
    lpx_tensor *rel[] = {x, qt, qr, qc};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

/* ---- out of memory ----------------------------------------------------- */

LPX_API void lpx__fail_alloc_after(long n);

typedef lpx_status (*oom_fn)(void);
static lpx_tensor *oom_x, *oom_w, *oom_g;

static lpx_status oom_quantize(void)
{
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.granularity = LPX_FLOAT8_AXISWISE;
    o.axis = -1;
    lpx_tensor *q = NULL, *t = NULL, *d = NULL;
    lpx_status st = lpx_float8_quantize(oom_x, &o, &q, NULL);
    if (!st) st = lpx_t(q, &t);
    if (!st) st = lpx_float8_dequantize(t, LPX_BF16, &d);
    lpx_tensor_release(q);
    lpx_tensor_release(t);
    lpx_tensor_release(d);
    return st;
}

static lpx_status oom_linear(const char *preset)
{
    lpx_float8_linear_recipe r;
    lpx_float8_linear_state s;
    lpx_status st = lpx_float8_linear_recipe_preset(preset, &r);
    if (st || (st = lpx_float8_linear_state_init(&s, &r))) return st;
    lpx_tensor *out = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    lpx_float8_linear_ctx *ctx = NULL;
    st = lpx_float8_linear_forward(&r, &s, oom_x, oom_w, NULL, &out, &ctx, NULL);
    if (!st) st = lpx_float8_linear_backward(ctx, oom_g, &gx, &gw, &gb, NULL);
    lpx_float8_linear_ctx_free(ctx);
    lpx_tensor *rel[] = {out, gx, gw, gb};
    for (size_t i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
    lpx_float8_linear_state_destroy(&s);
    return st;
}
static lpx_status oom_linear_tw(void) { return oom_linear("tensorwise"); }
static lpx_status oom_linear_rw(void) { return oom_linear("rowwise"); }
static lpx_status oom_linear_delayed(void) { return oom_linear("delayed"); }

static lpx_status oom_fallback(void)
{
    lpx_tensor *q = NULL, *r = NULL;
    lpx_status st = lpx_float8_quantize(oom_x, NULL, &q, NULL);
    if (!st) st = lpx_float8_set_fallback(true);
    if (!st) st = lpx_add(q, q, &r);
    if (!st) st = lpx_fill_(q, 1.0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    lpx__fail_alloc_after(-1);
    lpx_float8_set_fallback(false);  /* clears the message: restore it */
    lpx_tensor_release(q);
    lpx_tensor_release(r);
    return st ? lpx_error(st, "%s", msg) : st;
}

static lpx_status oom_delayed(void)
{
    lpx_float8_delayed *d = NULL, *e = NULL;
    unsigned char blob[BUFSIZ];
    size_t n = 0;
    lpx_float8_delayed_config c = {16, 0, 0, 1, 0};
    lpx_status st = lpx_float8_delayed_new(&c, &d);
    if (!st) st = lpx_float8_delayed_update(d, 3.0);
    if (!st) st = lpx_float8_delayed_save(d, blob, sizeof blob, &n);
    if (!st) st = lpx_float8_delayed_new(NULL, &e);
    if (!st) st = lpx_float8_delayed_load(e, blob, n);
    lpx_float8_delayed_free(d);
    lpx_float8_delayed_free(e);
    return st;
}

/* Each entry point with its 1st, 2nd, ... allocation failing: LPX_OK or
 * LPX_ENOMEM with a message, nothing leaked (LSan checks the run). */
static void test_out_of_memory(void)
{
    int64_t sx[2] = {8, 32}, sw[2] = {16, 32}, sg[2] = {8, 16};
    oom_x = rand_normal(2, sx, 81, 1.0, LPX_F32);
    oom_w = rand_normal(2, sw, 82, 0.2, LPX_F32);
    oom_g = rand_normal(2, sg, 83, 1.0, LPX_F32);
    struct { const char *name; oom_fn fn; } sc[] = {
        {"quantize", oom_quantize}, {"linear tensorwise", oom_linear_tw}, {"linear rowwise", oom_linear_rw},
        {"linear delayed", oom_linear_delayed}, {"fallback", oom_fallback}, {"delayed", oom_delayed},
    };
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) {
        int n;
        for (n = 0; n < 2000; n++) {
            lpx__fail_alloc_after(n);
            lpx_clear_error();
            lpx_status st = sc[i].fn();
            lpx__fail_alloc_after(-1);
            if (st == LPX_OK) break;
            CHECKF(st == LPX_ENOMEM && lpx_last_error()[0], "%s, allocation %d failing: %s (%s)", sc[i].name, n,
                   lpx_status_string(st), lpx_last_error());
            if (st != LPX_ENOMEM) break;
        }
        CHECKF(n < 2000, "%s never succeeded", sc[i].name);
    }
    CHECK(!lpx_float8_fallback_enabled());
    lpx_tensor_release(oom_x);
    lpx_tensor_release(oom_w);
    lpx_tensor_release(oom_g);
}

/* Every float8 tensor of the suite is gone: no leaked payloads. */
static void test_no_live_tensors(void) { CHECK(kind_live() == 0); }

int main(void)
{
    RUN(test_kind);
    RUN(test_quantize_sqnr);
    RUN(test_quantize_exact_tensorwise);
    RUN(test_quantize_matches_codec);
    RUN(test_quantize_t);
    RUN(test_rowwise_scales_exact);
    RUN(test_pow2_and_fp16_clamp);
    RUN(test_saturation_and_stats);
    RUN(test_nan_inputs);
    RUN(test_scale_from_amax);
    RUN(test_scaled_mm_vs_f64);
    RUN(test_scaled_mm_panels);
    RUN(test_scaled_mm_errors);
    RUN(test_delayed_history);
    RUN(test_delayed_save_load);
    RUN(test_delayed_quantize);
    RUN(test_linear_presets);
    RUN(test_linear_overrides);
    RUN(test_linear_fast_accum);
    RUN(test_linear_already_fp8);
    RUN(test_linear_errors);
    RUN(test_linear_delayed_steps);
    RUN(test_views);
    RUN(test_gemm_handlers);
    RUN(test_fallback_and_trace);
    RUN(test_unflatten);
    RUN(test_all_gather_hooks);
    RUN(test_out_of_memory);
    RUN(test_no_live_tensors);
    return CHECK_DONE();
}
