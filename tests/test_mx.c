/* The MX plugin (lpx-mx.so), loaded by path: e8m0 and f4e2m1 exact
 * against the OCP MX 1.0 definitions for every code (with an independent
 * reference written here), MX block quantization bit-exact against a
 * reference of the spec's algorithm, quantization error, linear through
 * the typed kernel, slicing, all-gather hooks, refusals, the fallback. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include "check.h"
#include "tensor_util.h"

static lpx_dtype e8m0, f4e2m1;
static const lpx_kind *kfp8, *kfp4;

/* ---- independent references ------------------------------------------ */

static float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* E8M0 code c (not 0xFF) is 2^(c-127): as f32 bits, exponent field c for
 * c >= 1, and the subnormal 2^-127 = 0x00400000 for c = 0. */
static float ref_e8m0(unsigned c) { return c ? f32_from_bits((uint32_t)c << 23) : f32_from_bits(0x00400000u); }

/* E2M1: s eem; exponent bias 1; e = 0 is subnormal (m * 0.5). */
static double ref_e2m1(unsigned c)
{
    unsigned s = c >> 3 & 1, e = c >> 1 & 3, m = c & 1;
    double v = e ? (1.0 + m / 2.0) * ldexp(1.0, (int)e - 1) : m * 0.5;
    return s ? -v : v;
}

/* nearest e2m1 code to x by exhaustive search over the 8 magnitudes, ties
 * to the even code (mantissa bit 0), saturating */
static unsigned ref_e2m1_encode(double x)
{
    unsigned s = signbit(x) ? 8 : 0, best = 0;
    double a = fabs(x), bd = INFINITY;
    if (a > 6.0) a = 6.0;
    for (unsigned c = 0; c < 8; c++) {
        double d = fabs(ref_e2m1(c) - a);
        if (d < bd || (d == bd && !(c & 1))) { bd = d; best = c; }
    }
    return s | best;
}

/* OCP MX 1.0 6.3 in double: the shared exponent of a block */
static int ref_shared_exp(const float *v, int n, int emax, int *special)
{
    double amax = 0;
    *special = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i])) *special = 1;
        else if (fabs(v[i]) > amax) amax = fabs(v[i]);
    }
    if (amax == 0) return -127;
    int e = (int)floor(log2(amax)) - emax;
    return e < -127 ? -127 : e > 127 ? 127 : e;
}

/* ---- helpers ----------------------------------------------------------- */

static lpx_tensor *from_floats(const float *v, int ndim, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, ndim, shape, lpx_cpu(), &t));
    if (t) memcpy(lpx_tensor_data(t), v, (size_t)lpx_tensor_numel(t) * sizeof(float));
    return t;
}

static lpx_tensor *dq(lpx_tensor *t)
{
    lpx_tensor *d = NULL;
    CHECK_OK(lpx_kind_to_dense(t, &d));
    return d;
}

static double max_abs_diff(lpx_tensor *a, lpx_tensor *b)
{
    if (!a || !b || lpx_tensor_numel(a) != lpx_tensor_numel(b)) return INFINITY;
    const float *x = lpx_tensor_data(a), *y = lpx_tensor_data(b);
    double m = 0;
    for (int64_t i = 0; i < lpx_tensor_numel(a); i++) {
        double d = fabs((double)x[i] - y[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* ---- cases ------------------------------------------------------------- */

static void test_load_by_path(void)
{
    const char *path = getenv("LPX_TEST_MX");
    const lpx_plugin *p = NULL;
    CHECK_OK(lpx_plugin_load(path, &p));
    CHECK(p && !strcmp(lpx_plugin_name(p), "mx"));
    e8m0 = lpx_dtype_from_name("e8m0");
    f4e2m1 = lpx_dtype_from_name("f4e2m1");
    CHECK(e8m0 >= LPX_DTYPE_BUILTIN_COUNT && f4e2m1 >= LPX_DTYPE_BUILTIN_COUNT);
    CHECK_OK(lpx_kind_find("mxfp8", &kfp8));
    CHECK_OK(lpx_kind_find("mxfp4", &kfp4));
    const lpx_dtype_traits *t = lpx_dtype_get(f4e2m1);
    CHECK(t && t->bits == 4 && t->block == 2 && t->max == 6.0);
    CHECK(lpx_dtype_nbytes(f4e2m1, 5) == 3);
}

static void test_e8m0_all_codes(void)
{
    for (unsigned c = 0; c < 256; c++) {
        uint8_t code = (uint8_t)c, back = 0;
        float f = 0;
        CHECK_OK(lpx_convert(&f, LPX_F32, &code, e8m0, 1, 0));
        if (c == 0xFF) {
            CHECKF(isnan(f), "e8m0 0xFF decodes to %g, not NaN", f);
            continue;
        }
        CHECKF(f == ref_e8m0(c) && (double)f == ldexp(1.0, (int)c - 127), "e8m0 0x%02x -> %a", c, f);
        CHECK_OK(lpx_convert(&back, e8m0, &f, LPX_F32, 1, 0));
        CHECKF(back == code, "e8m0 encode(decode(0x%02x)) = 0x%02x", c, back);
    }
    /* rounding between powers: ties (1.5 * 2^e) go to the even code */
    struct { float x; unsigned sat, want; } cases[] = {
        {1.0f, 0, 127}, {1.49f, 0, 127}, {1.51f, 0, 128}, {1.5f, 0, 127 + 1}, /* 127 odd: tie -> 128 */
        {3.0f, 0, 128}, /* 1.5 * 2^1, code 128 even: stays */
        {0.0f, 0, 0}, {1e-45f, 0, 0}, {0x1p-127f, 0, 0}, {0x1.8p-127f, 0, 0}, {0x1.9p-127f, 0, 1},
        {0x1p127f, 0, 0xFE}, {0x1.7p127f, 0, 0xFE}, {FLT_MAX, 0, 0xFF}, {FLT_MAX, 1, 0xFE},
        {INFINITY, 0, 0xFF}, {INFINITY, 1, 0xFE}, {-1.0f, 0, 0xFF}, {NAN, 1, 0xFF},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t got = 0;
        CHECK_OK(lpx_convert(&got, e8m0, &cases[i].x, LPX_F32, 1, cases[i].sat ? LPX_CONVERT_SATURATE : 0));
        CHECKF(got == cases[i].want, "e8m0 encode(%a, sat %u) = 0x%02x, want 0x%02x", cases[i].x, cases[i].sat,
               got, cases[i].want);
    }
}

static void test_e2m1_all_codes(void)
{
    for (unsigned c = 0; c < 16; c++) {
        uint8_t byte = (uint8_t)c, back[1] = {0};
        float f = 99;
        CHECK_OK(lpx_convert(&f, LPX_F32, &byte, f4e2m1, 1, 0));
        CHECKF((double)f == ref_e2m1(c) && !!signbit(f) == (c >= 8), "e2m1 0x%x -> %g, want %g", c, f, ref_e2m1(c));
        CHECK_OK(lpx_convert(back, f4e2m1, &f, LPX_F32, 1, 0));
        CHECKF((back[0] & 0xF) == c, "e2m1 encode(%g) = 0x%x, want 0x%x", f, back[0] & 0xF, c);
    }
    /* two per byte, first element in the low nibble */
    float pair[2] = {1.0f, -6.0f}, un[2];
    uint8_t packed = 0;
    CHECK_OK(lpx_convert(&packed, f4e2m1, pair, LPX_F32, 2, 0));
    CHECK(packed == (0x2 | 0xF << 4));
    CHECK_OK(lpx_convert(un, LPX_F32, &packed, f4e2m1, 2, 0));
    CHECK(un[0] == 1.0f && un[1] == -6.0f);
    /* every quarter step in [-8, 8], midpoints included: nearest-even */
    for (int q = -32; q <= 32; q++) {
        float x = q * 0.25f;
        uint8_t got = 0;
        CHECK_OK(lpx_convert(&got, f4e2m1, &x, LPX_F32, 1, 0));
        CHECKF((got & 0xF) == ref_e2m1_encode(x), "e2m1 encode(%g) = 0x%x, want 0x%x", x, got & 0xF,
               ref_e2m1_encode(x));
    }
    float sp[3] = {INFINITY, -INFINITY, NAN};
    uint8_t b[2] = {0};
    CHECK_OK(lpx_convert(b, f4e2m1, sp, LPX_F32, 3, 0));
    CHECK(b[0] == (0x7 | 0xF << 4) && b[1] == 0x0);   /* ±inf saturate to ±6, NaN -> +0 */
}

/* quantize against the spec reference, bit for bit, for both formats */
static void check_exact(const lpx_kind *k, int emax, lpx_tensor *x)
{
    lpx_tensor *q = NULL;
    CHECK_OK(lpx_kind_from_dense(k, x, &q));
    if (!q) return;
    bool fp8 = k == kfp8;
    int ndim = lpx_tensor_ndim(x);
    int64_t kdim = lpx_tensor_shape(x)[ndim - 1], kp = (kdim + 31) / 32 * 32, rows = lpx_tensor_numel(x) / kdim;
    const float *v = lpx_tensor_data(x);
    const uint8_t *el = lpx_tensor_data(lpx_tensor_inner(q, 0)), *sc = lpx_tensor_data(lpx_tensor_inner(q, 1));
    CHECK(lpx_tensor_dtype(lpx_tensor_inner(q, 0)) == (fp8 ? LPX_F8E4M3FN : f4e2m1));
    CHECK(lpx_tensor_dtype(lpx_tensor_inner(q, 1)) == e8m0);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < kp / 32; b++) {
            float blk[32] = {0};
            int n = (int)(kdim - b * 32 < 32 ? kdim - b * 32 : 32), special;
            memcpy(blk, v + r * kdim + b * 32, (size_t)n * sizeof(float));
            int e = ref_shared_exp(blk, n, emax, &special);
            unsigned want_scale = special ? 0xFF : (unsigned)(e + 127);
            if (sc[r * (kp / 32) + b] != want_scale) bad++;
            for (int i = 0; i < 32; i++) {
                double s = special ? 0.0 : ldexp((double)blk[i], -e);
                unsigned want, got;
                if (fp8) {
                    float sf = (float)s;
                    uint8_t w;
                    lpx_convert(&w, LPX_F8E4M3FN, &sf, LPX_F32, 1, LPX_CONVERT_SATURATE);
                    want = w;
                    got = el[r * kp + b * 32 + i];
                } else {
                    want = ref_e2m1_encode(s);
                    got = el[(r * kp + b * 32 + i) / 2] >> (4 * (i & 1)) & 0xF;
                }
                if (got != want && bad++ < 5)
                    fprintf(stderr, "  row %lld block %lld elem %d: got 0x%x want 0x%x (x = %g)\n", (long long)r,
                            (long long)b, i, got, want, blk[i]);
            }
        }
    CHECKF(bad == 0, "%d mismatches", bad);
    lpx_tensor_release(q);
}

static void test_quantize_matches_spec(void)
{
    int64_t shapes[3][2] = {{16, 96}, {7, 100}, {3, 5}};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 4; d++) {
            double scale = d == 0 ? 1.0 : d == 1 ? 1e-3 : d == 2 ? 3e4 : 1e-38;
            lpx_tensor *x = rand_normal(2, shapes[s], 100 + (uint64_t)(s * 4 + d), scale, LPX_F32);
            if (!x) continue;
            float *v = lpx_tensor_data(x);
            if (d == 3) v[3] = 0x1.8p-140f;   /* f32 subnormals: the -127 clamp */
            check_exact(kfp8, 8, x);
            check_exact(kfp4, 2, x);
            lpx_tensor_release(x);
        }
}

static void test_special_blocks(void)
{
    float v[4 * 32];
    for (int i = 0; i < 4 * 32; i++) v[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 32; i++) v[i] = 0.0f;    /* block 0: zeros */
    v[32 + 5] = NAN;                              /* block 1: a NaN */
    v[64 + 9] = -INFINITY;                        /* block 2: an infinity */
    v[96 + 1] = 3e38f;                            /* block 3: near FLT_MAX */
    int64_t shape[2] = {1, 128};
    lpx_tensor *x = from_floats(v, 2, shape);
    for (int f = 0; f < 2; f++) {
        lpx_tensor *q = NULL;
        CHECK_OK(lpx_kind_from_dense(f ? kfp4 : kfp8, x, &q));
        if (!q) continue;
        const uint8_t *sc = lpx_tensor_data(lpx_tensor_inner(q, 1));
        CHECK(sc[0] == 0 && sc[1] == 0xFF && sc[2] == 0xFF && sc[3] == 127 + 127 - (f ? 2 : 8));
        lpx_tensor *d = dq(q);
        const float *o = d ? lpx_tensor_data(d) : NULL;
        for (int i = 0; o && i < 128; i++) {
            if (i < 32) CHECK(o[i] == 0.0f);
            else if (i < 96) CHECK(isnan(o[i]));
            else CHECK(isfinite(o[i]));
        }
        if (o) CHECKF(fabs(o[97] - 3e38) <= 0.25 * 3e38, "%g", o[97]);
        lpx_tensor_release(d);
        lpx_tensor_release(q);
    }
    lpx_tensor_release(x);
}

static double sqnr_db(lpx_tensor *x, lpx_tensor *y)
{
    const float *a = lpx_tensor_data(x), *b = lpx_tensor_data(y);
    double s = 0, n = 0;
    for (int64_t i = 0; i < lpx_tensor_numel(x); i++) {
        s += (double)a[i] * a[i];
        n += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    }
    return 10 * log10(s / n);
}

static void test_quantization_error(void)
{
    int64_t shape[2] = {256, 512};
    lpx_tensor *x = rand_normal(2, shape, 7, 1.0, LPX_F32);
    for (int f = 0; f < 2; f++) {
        lpx_tensor *q = NULL;
        CHECK_OK(lpx_kind_from_dense(f ? kfp4 : kfp8, x, &q));
        lpx_tensor *d = q ? dq(q) : NULL;
        if (!d) continue;
        double db = sqnr_db(x, d), amax = 0, err = max_abs_diff(x, d);
        const float *v = lpx_tensor_data(x);
        for (int64_t i = 0; i < lpx_tensor_numel(x); i++) amax = fmax(amax, fabs(v[i]));
        printf("  %s: SQNR %.2f dB, max error %.4f of amax\n", f ? "mxfp4" : "mxfp8", db, err / amax);
        CHECK(db >= (f ? 14.0 : 28.0));
        CHECK(err <= (f ? 0.25 : 0.125) * amax);
        lpx_tensor_release(d);
        lpx_tensor_release(q);
    }
    lpx_tensor_release(x);
}

static void test_linear_typed_kernel(void)
{
    int64_t xs[2] = {5, 100}, ws[2] = {300, 100}, bs[1] = {300};   /* K padded, two tiles of W rows */
    lpx_tensor *x = rand_normal(2, xs, 1, 1.0, LPX_F32), *w = rand_normal(2, ws, 2, 0.1, LPX_F32), *b = rand_normal(1, bs, 3, 1.0, LPX_F32);
    for (int f = 0; f < 2; f++) {
        lpx_tensor *wq = NULL, *y = NULL, *ref = NULL, *wd = NULL;
        CHECK_OK(lpx_kind_from_dense(f ? kfp4 : kfp8, w, &wq));
        if (!wq) continue;
        wd = dq(wq);
        CHECK_OK(lpx_trace_start(NULL));
        CHECK_OK(lpx_linear(x, wq, b, &y));
        CHECK(lpx_trace_count(LPX_OP_linear, lpx_kind_key(f ? kfp4 : kfp8)) == 1);
        CHECK(lpx_trace_fallback_count(LPX_OP_linear, lpx_kind_key(f ? kfp4 : kfp8)) == 0);
        CHECK_OK(lpx_trace_stop());
        CHECK_OK(lpx_linear(x, wd, b, &ref));
        CHECK(y && lpx_tensor_ndim(y) == 2 && lpx_tensor_shape(y)[1] == 300 && !lpx_tensor_kind(y));
        CHECKF(max_abs_diff(y, ref) <= 1e-4, "%g", max_abs_diff(y, ref));
        lpx_tensor *bad = NULL, *xt = NULL;
        CHECK_OK(lpx_t(x, &xt));                                /* [100, 5]: last dim is not in = 100 */
        CHECK_ERR(lpx_linear(xt, wq, NULL, &bad), LPX_ESHAPE);
        CHECK(strstr(lpx_last_error(), f ? "linear(mxfp4)" : "linear(mxfp8)") != NULL);
        lpx_tensor_release(xt);
        lpx_tensor_release(y);
        lpx_tensor_release(ref);
        lpx_tensor_release(wd);
        lpx_tensor_release(wq);
    }
    lpx_tensor_release(x);
    lpx_tensor_release(w);
    lpx_tensor_release(b);
}

static void test_narrow_and_refusals(void)
{
    int64_t s2[2] = {10, 40}, s1[1] = {100};
    lpx_tensor *x = rand_normal(2, s2, 4, 1.0, LPX_F32), *v = rand_normal(1, s1, 5, 1.0, LPX_F32);
    lpx_tensor *q = NULL, *q1 = NULL, *part = NULL, *ref = NULL, *dpart = NULL, *full = NULL;
    CHECK_OK(lpx_kind_from_dense(kfp4, x, &q));
    CHECK_OK(lpx_kind_from_dense(kfp8, v, &q1));
    if (!q || !q1) return;
    full = dq(q);
    CHECK_OK(lpx_narrow(q, 0, 3, 4, &part));
    CHECK(part && lpx_tensor_kind(part) == kfp4 && lpx_tensor_shape(part)[0] == 4);
    CHECK_OK(lpx_narrow(full, 0, 3, 4, &ref));
    lpx_tensor *refc = NULL;
    CHECK_OK(lpx_contiguous(ref, &refc));
    dpart = part ? dq(part) : NULL;
    CHECK(max_abs_diff(dpart, refc) == 0);
    lpx_tensor *bad = NULL;
    CHECK_ERR(lpx_narrow(q, 1, 0, 8, &bad), LPX_ENOTIMPL);      /* the block dim */
    CHECK(strstr(lpx_last_error(), "mxfp4") != NULL);
    CHECK_ERR(lpx_narrow(q, 0, 8, 5, &bad), LPX_ERANGE);
    CHECK_ERR(lpx_narrow(q, -3, 0, 1, &bad), LPX_ERANGE);           /* the typed kernel's message */
    CHECKF(!strcmp(lpx_last_error(), "narrow(mxfp4): dim -3 out of range for 2 dims"), "%s", lpx_last_error());
    lpx_tensor *neg = NULL;
    CHECK_OK(lpx_narrow(q, -2, -4, 2, &neg));                       /* dim and start from the end */
    CHECK(neg && lpx_tensor_kind(neg) == kfp4 && lpx_tensor_shape(neg)[0] == 2);
    lpx_tensor_release(neg);
    /* 1-D: whole blocks only */
    lpx_tensor *p1 = NULL;
    CHECK_OK(lpx_narrow(q1, 0, 32, 68, &p1));                     /* to the end: last block partial */
    CHECK_ERR(lpx_narrow(q1, 0, 16, 32, &bad), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "whole blocks") != NULL);
    CHECK(lpx_kind_vtable(kfp8)->shard_unit(q1) == 32 && lpx_kind_vtable(kfp4)->shard_unit(q) == 1);
    /* unflatten refuses bad input */
    const lpx_kind_i *vt = lpx_kind_vtable(kfp4);
    lpx_tensor *inner[2] = {lpx_tensor_inner(q, 0), lpx_tensor_inner(q, 1)}, *u = NULL;
    size_t ms;
    const void *meta = lpx_tensor_meta(q, &ms);
    CHECK_OK(vt->unflatten(kfp4, LPX_BF16, 2, s2, inner, 2, meta, ms, &u));
    lpx_tensor_release(u);
    int64_t wrong[2] = {10, 70};
    CHECK_ERR(vt->unflatten(kfp4, LPX_F32, 2, wrong, inner, 2, meta, ms, &u), LPX_ESHAPE);
    CHECK_ERR(vt->unflatten(kfp4, LPX_F32, 2, s2, inner, 1, meta, ms, &u), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(kfp4, LPX_F32, 2, s2, inner, 2, meta, ms - 1, &u), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(kfp8, LPX_F32, 2, s2, inner, 2, meta, ms, &u), LPX_EINVAL);   /* fp4 meta */
    lpx_tensor *swapped[2] = {inner[1], inner[0]};
    CHECK_ERR(vt->unflatten(kfp4, LPX_F32, 2, s2, swapped, 2, meta, ms, &u), LPX_EDTYPE);
    CHECK_ERR(lpx_kind_from_dense(kfp4, q, &u), LPX_EINVAL);           /* not dense */
    lpx_tensor *scalar = NULL;
    CHECK_OK(lpx_full(0, NULL, 1.0, LPX_F32, lpx_cpu(), &scalar));
    CHECK_ERR(lpx_kind_from_dense(kfp4, scalar, &u), LPX_ESHAPE);      /* 0-d */
    lpx_tensor_release(scalar);
    lpx_tensor_release(p1);
    lpx_tensor_release(dpart);
    lpx_tensor_release(refc);
    lpx_tensor_release(ref);
    lpx_tensor_release(part);
    lpx_tensor_release(full);
    lpx_tensor_release(q1);
    lpx_tensor_release(q);
    lpx_tensor_release(v);
    lpx_tensor_release(x);
}

/* pre_all_gather on 3 shards, bytes concatenated as an all-gather would,
 * post_all_gather: equals the unsharded tensor; again in place */
static void test_all_gather_hooks(void)
{
    int64_t s[2] = {10, 70};
    lpx_tensor *x = rand_normal(2, s, 9, 2.0, LPX_F32), *q = NULL;
    CHECK_OK(lpx_kind_from_dense(kfp4, x, &q));
    if (!q) return;
    const lpx_kind_i *vt = lpx_kind_vtable(kfp4);
    lpx_tensor *ins[3][LPX_MAX_AG_INPUTS] = {{0}};
    int nin[3] = {0};
    unsigned char meta[3][LPX_MAX_META];
    size_t msz[3];
    int64_t rows[3] = {4, 4, 2};
    for (int r = 0, at = 0; r < 3; at += (int)rows[r], r++) {
        lpx_tensor *sh = NULL;
        CHECK_OK(lpx_narrow(q, 0, at, rows[r], &sh));
        CHECK_OK(vt->pre_all_gather(sh, NULL, ins[r], &nin[r], meta[r], &msz[r]));
        CHECK(nin[r] == 2);
        lpx_tensor_release(sh);
    }
    lpx_tensor *outs[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        lpx_tensor *parts[3] = {ins[0][i], ins[1][i], ins[2][i]};
        /* the CPU cat refuses 4-bit dtypes: concatenate bytes, as the wire does */
        int64_t shape[2] = {10, lpx_tensor_shape(parts[0])[1]};
        CHECK_OK(lpx_tensor_new(lpx_tensor_dtype(parts[0]), 2, shape, lpx_cpu(), &outs[i]));
        size_t off = 0;
        for (int r = 0; r < 3 && outs[i]; r++) {
            size_t nb = lpx_dtype_nbytes(lpx_tensor_dtype(parts[r]), lpx_tensor_numel(parts[r]));
            memcpy((char *)lpx_tensor_data(outs[i]) + off, lpx_tensor_data(parts[r]), nb);
            off += nb;
        }
    }
    lpx_tensor *g = NULL, *g2 = NULL;
    CHECK_OK(vt->post_all_gather(kfp4, outs, 2, meta[0], msz[0], LPX_BF16, NULL, &g));
    lpx_tensor *a = dq(q), *b = g ? dq(g) : NULL;
    CHECK(g && lpx_tensor_dtype(g) == LPX_BF16 && max_abs_diff(a, b) == 0);
    CHECK_OK(vt->post_all_gather(kfp4, outs, 2, meta[0], msz[0], LPX_BF16, g, &g2));
    CHECK(g2 == g);
    lpx_tensor_release(g2);
    g2 = NULL;
    CHECK_ERR(vt->post_all_gather(kfp4, outs, 1, meta[0], msz[0], LPX_BF16, NULL, &g2), LPX_EINVAL);
    lpx_tensor_release(g2);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(g);
    for (int i = 0; i < 2; i++) lpx_tensor_release(outs[i]);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < nin[r]; i++) lpx_tensor_release(ins[r][i]);
    lpx_tensor_release(q);
    lpx_tensor_release(x);
}

static void test_ops_and_fallback(void)
{
    int64_t s[2] = {4, 64};
    lpx_tensor *x = rand_normal(2, s, 11, 1.0, LPX_F32), *y = rand_normal(2, s, 12, 1.0, LPX_F32), *q = NULL, *sum = NULL, *ref = NULL;
    lpx_op quant;
    CHECK_OK(lpx_op_find("mx_quantize", &quant));
    lpx_value args[2] = {lpx_v_tensor(x), lpx_v_str("mxfp8")};
    lpx_call c;
    lpx_call_init(&c, quant, args, 2);
    CHECK_OK(lpx_dispatch(&c));
    q = c.nrets ? c.rets[0].u.t : NULL;
    CHECK(q && lpx_tensor_kind(q) == kfp8);
    args[1] = lpx_v_str("mxfp6");
    lpx_call_init(&c, quant, args, 2);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "mxfp6") != NULL);
    if (!q) return;
    /* add has no MX kernel: the fallback dequantizes and redispatches */
    CHECK_OK(lpx_trace_start(NULL));
    CHECK_OK(lpx_add(q, y, &sum));
    CHECK(lpx_trace_fallback_count(LPX_OP_add, lpx_kind_key(kfp8)) == 1);
    CHECK_OK(lpx_trace_stop());
    lpx_tensor *d = dq(q);
    CHECK_OK(lpx_add(d, y, &ref));
    CHECK(max_abs_diff(sum, ref) == 0);
    CHECK_ERR(lpx_copy_(q, y), LPX_ENOTIMPL);   /* writing into an MX tensor */
    lpx_tensor *out = NULL;
    CHECK_OK(lpx_zeros(2, s, LPX_F32, lpx_cpu(), &out));
    CHECK_ERR(lpx_add_out(y, y, q), LPX_ENOTIMPL);
    lpx_tensor *cl = NULL, *ca = NULL;
    CHECK_OK(lpx_clone(q, &cl));
    CHECK_OK(lpx_cast(q, LPX_BF16, false, &ca));
    CHECK(ca && lpx_tensor_dtype(ca) == LPX_BF16 && !lpx_tensor_kind(ca));
    /* the typed view/copy kernels: contiguous is q itself, detach shares
     * its inner tensors, cast to f32 is the dequantized tensor */
    lpx_tensor *co = NULL, *de = NULL, *c32 = NULL;
    CHECK_OK(lpx_contiguous(q, &co));
    CHECK(co == q);
    CHECK_OK(lpx_detach(q, &de));
    CHECK(de && de != q && lpx_tensor_kind(de) == lpx_tensor_kind(q) && lpx_tensor_inner(de, 0) == lpx_tensor_inner(q, 0));
    CHECK_OK(lpx_cast(q, LPX_F32, false, &c32));
    CHECK(c32 && lpx_tensor_dtype(c32) == LPX_F32 && !lpx_tensor_kind(c32));
    if (c32 && d) CHECK(max_abs_diff(c32, d) == 0);
    lpx_tensor_release(co);
    lpx_tensor_release(de);
    lpx_tensor_release(c32);
    char desc[256];
    CHECK(lpx_kind_vtable(kfp8)->describe(q, desc, sizeof desc) > 0);
    CHECKF(strstr(desc, "mxfp8 [4, 64]") && strstr(desc, "8.25 bits"), "%s", desc);
    lpx_tensor_release(cl);
    lpx_tensor_release(ca);
    lpx_tensor_release(out);
    lpx_tensor_release(d);
    lpx_tensor_release(ref);
    lpx_tensor_release(sum);
    lpx_tensor_release(q);
    lpx_tensor_release(x);
    lpx_tensor_release(y);
}

int main(void)
{
    if (!getenv("LPX_TEST_MX")) {
        printf("LPX_TEST_MX not set: skipping\n");
        return 77;
    }
    unsetenv("LPX_PLUGIN_PATH");
    RUN(test_load_by_path);
    if (!kfp8 || !kfp4) return CHECK_DONE();
    RUN(test_e8m0_all_codes);
    RUN(test_e2m1_all_codes);
    RUN(test_quantize_matches_spec);
    RUN(test_special_blocks);
    RUN(test_quantization_error);
    RUN(test_linear_typed_kernel);
    RUN(test_narrow_and_refusals);
    RUN(test_all_gather_hooks);
    RUN(test_ops_and_fallback);
    return CHECK_DONE();
}
