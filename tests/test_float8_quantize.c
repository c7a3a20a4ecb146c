#include <float.h>
/* The float8 tests, fused quantize (exact scales and codes, statistics,
 * saturation, NaN), the scale formula and delayed scaling. */
#include "float8_util.h"

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

/* A finite fp8 code dequantizes to a finite value (issue 33): with a
 * power-of-two scale, amax 3.4e38 gets scale 2^-120 (448 / 3.4e38 floored),
 * 3.4e38 * 2^-120 = 255.8 rounds to the code 256, and 256 * 2^120 = 2^128
 * overflowed f32 to inf. Dequantization now clamps a finite code's value
 * to the output dtype's largest finite value: FLT_MAX in f32, 0x7F7F
 * (3.3895e38) in bf16; tensorwise, rowwise, blockwise, a given (delayed)
 * scale, both fp8 formats. */
static void test_pow2_dequant_finite(void)
{
    float xs[4] = {3.4e38f, 1.0f, -3.4e38f, 2.0f};
    int64_t shape[2] = {2, 2}, dim = 1;
    lpx_tensor *x = NULL;
    CHECK_OK(lpx_tensor_from_blob(xs, LPX_F32, 2, shape, NULL, lpx_cpu(), NULL, NULL, &x));
    const lpx_dtype fmts[2] = {LPX_F8E4M3FN, LPX_F8E5M2};
    for (int f = 0; f < 2; f++)
        for (int mode = 0; mode < 3; mode++) {   /* tensorwise, rowwise, blockwise [1, 2] */
            lpx_tensor *q = NULL, *sc = NULL, *si = NULL, *y = NULL, *yb = NULL;
            if (mode < 2) {
                CHECK_OK(lpx_fp8_quantize(x, NULL, fmts[f], mode == 1 ? &dim : NULL, true, 0.0, true, &q, &sc, &si, NULL));
            } else {
                CHECK_OK(lpx_fp8_quantize_block(x, fmts[f], 1, 2, true, true, &q, &sc, &si, NULL));
            }
            if (!q) continue;
            /* the scale of 3.4e38's group: 2^-120 (e4m3fn), 2^-113 (e5m2) */
            CHECKF(item(si, 0) == ldexp(1.0, f == 0 ? 120 : 113), "fmt %d mode %d: scale_inv %g", f, mode, item(si, 0));
            if (mode < 2) {
                CHECK_OK(lpx_fp8_dequantize(q, si, LPX_F32, &y));
                CHECK_OK(lpx_fp8_dequantize(q, si, LPX_BF16, &yb));
            } else {
                CHECK_OK(lpx_fp8_dequantize_block(q, si, 1, 2, LPX_F32, &y));
                CHECK_OK(lpx_fp8_dequantize_block(q, si, 1, 2, LPX_BF16, &yb));
            }
            if (!y || !yb) continue;
            const float *yv = lpx_tensor_data(y);
            const uint16_t *bv = lpx_tensor_data(yb);
            CHECKF(yv[0] == FLT_MAX && yv[2] == -FLT_MAX, "fmt %d mode %d: %g, %g", f, mode, yv[0], yv[2]);
            CHECKF(bv[0] == 0x7F7F && bv[2] == 0xFF7F, "fmt %d mode %d bf16: %04x %04x", f, mode, bv[0], bv[2]);
            lpx_tensor *rel[] = {q, sc, si, y, yb};
            for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
        }
    /* a given scale (the delayed recipe's, from its amax history): the same */
    lpx_tensor *am = NULL, *s = NULL, *si = NULL, *q = NULL, *y = NULL;
    float a1 = 3.4e38f;
    int64_t one = 1;
    CHECK_OK(lpx_tensor_from_blob(&a1, LPX_F32, 1, &one, NULL, lpx_cpu(), NULL, NULL, &am));
    CHECK_OK(lpx_fp8_scale_from_amax(am, LPX_F8E4M3FN, true, 0.0, &s, &si));
    CHECK_OK(lpx_fp8_quantize(x, s, LPX_F8E4M3FN, NULL, true, 0.0, true, &q, NULL, NULL, NULL));
    if (q) CHECK_OK(lpx_fp8_dequantize(q, si, LPX_F32, &y));
    if (y) CHECKF(((const float *)lpx_tensor_data(y))[0] == FLT_MAX, "delayed: %g", ((const float *)lpx_tensor_data(y))[0]);
    lpx_tensor *rel[] = {am, s, si, q, y, x};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

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
    RUN(test_delayed_history);
    RUN(test_delayed_save_load);
    RUN(test_delayed_quantize);
    RUN(test_pow2_dequant_finite);
    RUN(test_no_live_tensors);
    return CHECK_DONE();
}
