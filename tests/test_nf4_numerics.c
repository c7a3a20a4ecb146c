/* The nf4 tests, quantization bit-exact against an independent scalar
 * reference written from the formulas of docs/NF4.md, round-trip error,
 * special blocks, padding and sizes. */
#include "nf4_util.h"

/* ---- the reference (independent of the production code path) ----------- */

static const float REF_CB[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
    0.7229568362236023f, 1.0f};

/* argmin over |v - code| in f32, first minimum (= lower index) wins */
static int ref_nearest(float v)
{
    int best = 0;
    float bd = fabsf(v - REF_CB[0]);
    for (int i = 1; i < 16; i++) {
        float d = fabsf(v - REF_CB[i]);
        if (d < bd) {
            bd = d;
            best = i;
        }
    }
    return best;
}

/* The recipe on x zero-padded to whole scaler blocks. */
static ref_q ref_quantize(const float *x, int64_t n, int64_t B, int64_t S)
{
    ref_q r;
    int64_t unit = B * S;
    r.padded = (n + unit - 1) / unit * unit;
    r.nb = r.padded / B;
    r.nsb = r.padded / unit;
    r.codes = calloc((size_t)(r.padded / 2 + 1), 1);
    r.qs = calloc((size_t)(r.nb + 1), 1);
    r.f = calloc((size_t)(r.nsb + 1), sizeof(float));
    float *s = calloc((size_t)(r.nb + 1), sizeof(float));
    for (int64_t b = 0; b < r.nb; b++) {
        float amax = 0.0f;
        for (int64_t j = 0; j < B; j++) {
            int64_t i = b * B + j;
            float v = i < n ? fabsf(x[i]) : 0.0f;
            if (v > amax) amax = v;
        }
        s[b] = amax;
        for (int64_t j = 0; j < B; j++) {
            int64_t i = b * B + j;
            float xv = i < n ? x[i] : 0.0f;
            int code = amax == 0.0f ? 7 : ref_nearest(xv / amax);
            if (i % 2 == 0) r.codes[i / 2] |= (uint8_t)(code << 4);
            else r.codes[i / 2] |= (uint8_t)code;
        }
    }
    double sum = 0.0;
    for (int64_t b = 0; b < r.nb; b++) sum += s[b];
    r.mean = r.nb ? (float)(sum / (double)r.nb) : 0.0f;
    for (int64_t g = 0; g < r.nsb; g++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < S; k++) {
            float d = fabsf(s[g * S + k] - r.mean);
            if (d > amax) amax = d;
        }
        float f = amax > 0.0f ? 256.0f / (2.0f * amax) : 1.0f;
        r.f[g] = f;
        for (int64_t k = 0; k < S; k++) {
            float q = rintf((s[g * S + k] - r.mean) * f);
            q = q < -128.0f ? -128.0f : q > 127.0f ? 127.0f : q;
            r.qs[g * S + k] = (int8_t)q;
        }
    }
    free(s);
    return r;
}

static float ref_value(const ref_q *r, int64_t B, int64_t S, int64_t i)
{
    int64_t b = i / B;
    int code = i % 2 ? r->codes[i / 2] & 15 : r->codes[i / 2] >> 4;
    float scale = (float)r->qs[b] / r->f[b / S] + r->mean;
    return REF_CB[code] * scale;
}

static void ref_free(ref_q *r)
{
    free(r->codes);
    free(r->qs);
    free(r->f);
}

/* ---- helpers --------------------------------------------------------------- */

static lpx_tensor *from_floats(const float *v, int ndim, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, ndim, shape, lpx_cpu(), &t));
    if (t) memcpy(lpx_tensor_data(t), v, (size_t)lpx_tensor_numel(t) * sizeof(float));
    return t;
}

/* Payload of w equals the reference, bit for bit. Returns mismatches. */
static int64_t compare_payload(lpx_tensor *w, const ref_q *r)
{
    int64_t bad = 0;
    lpx_tensor *codes = lpx_tensor_inner(w, LPX_NF4_CODES), *qs = lpx_tensor_inner(w, LPX_NF4_QSCALERS),
               *f = lpx_tensor_inner(w, LPX_NF4_FACTORS), *mean = lpx_tensor_inner(w, LPX_NF4_MEAN);
    CHECK(lpx_tensor_numel(codes) * 2 == r->padded);
    CHECK(lpx_tensor_numel(qs) == r->nb && lpx_tensor_numel(f) == r->nsb && lpx_tensor_numel(mean) == 1);
    if (lpx_tensor_numel(codes) * 2 != r->padded || lpx_tensor_numel(qs) != r->nb || lpx_tensor_numel(f) != r->nsb)
        return -1;
    const uint8_t *c = lpx_tensor_data(codes);
    const int8_t *q = lpx_tensor_data(qs);
    const float *fv = lpx_tensor_data(f), *m = lpx_tensor_data(mean);
    for (int64_t i = 0; i < r->padded / 2; i++) bad += c[i] != r->codes[i];
    for (int64_t i = 0; i < r->nb; i++) bad += q[i] != r->qs[i];
    for (int64_t i = 0; i < r->nsb; i++) bad += memcmp(&fv[i], &r->f[i], 4) != 0;
    bad += memcmp(m, &r->mean, 4) != 0;
    return bad;
}

/* Quantizes x (any float dtype) and checks payload and dequantized values
 * against the reference. */
static void check_exact(lpx_tensor *x, int64_t B, int64_t S)
{
    lpx_nf4_config c = cfg(B, S);
    lpx_tensor *w = NULL, *d = NULL;
    CHECK_OK(lpx_nf4_quantize(x, &c, &w));
    if (!w) return;
    float *xv = values_f32(x);
    int64_t n = lpx_tensor_numel(x);
    ref_q r = ref_quantize(xv, n, B, S);
    int64_t bad = compare_payload(w, &r);
    CHECKF(bad == 0, "%lld payload mismatches (block %lld, scaler_block %lld, numel %lld)", (long long)bad,
           (long long)B, (long long)S, (long long)n);
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &d));
    if (d) {
        const float *dv = lpx_tensor_data(d);
        int64_t vbad = 0;
        for (int64_t i = 0; i < n; i++) {
            float want = ref_value(&r, B, S, i);
            vbad += memcmp(&dv[i], &want, 4) != 0;
        }
        CHECKF(vbad == 0, "%lld dequantized values differ from the reference", (long long)vbad);
    }
    ref_free(&r);
    free(xv);
    lpx_tensor_release(d);
    lpx_tensor_release(w);
}

static void roundtrip_error(void)
{
    int64_t shape[2] = {1024, 1024};
    lpx_tensor *x = rand_normal(2, shape, 11, 1.0, LPX_F32), *w = NULL, *d = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &d));
    if (d) {
        const float *xv = lpx_tensor_data(x), *dv = lpx_tensor_data(d);
        double num = 0, den = 0;
        for (int64_t i = 0; i < 1024 * 1024; i++) {
            num += ((double)dv[i] - xv[i]) * ((double)dv[i] - xv[i]);
            den += (double)xv[i] * xv[i];
        }
        double e = sqrt(num / den);
        if (lpx__nf4_simd)
            printf("     N(0,1) 1024x1024, defaults: dequant(quant(W)) relative error %.4f (SQNR %.2f dB)\n", e,
                   -20.0 * log10(e));
        CHECKF(e > 0.07 && e < 0.12, "relative error %.4f outside what the 16-value codebook implies", e);
    }
    /* bf16 and f16 outputs are the f32 values rounded once */
    lpx_tensor *db = NULL, *dh = NULL;
    CHECK_OK(lpx_nf4_dequantize(w, LPX_BF16, &db));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F16, &dh));
    if (d && db && dh) {
        const float *dv = lpx_tensor_data(d);
        float *bv = values_f32(db), *hv = values_f32(dh);
        int64_t bad = 0;
        for (int64_t i = 0; i < 1024 * 1024; i++) {
            float rb, rh;
            uint16_t b16, h16;
            lpx_convert(&b16, LPX_BF16, &dv[i], LPX_F32, 1, 0);
            lpx_convert(&h16, LPX_F16, &dv[i], LPX_F32, 1, 0);
            lpx_convert(&rb, LPX_F32, &b16, LPX_BF16, 1, 0);
            lpx_convert(&rh, LPX_F32, &h16, LPX_F16, 1, 0);
            bad += bv[i] != rb || hv[i] != rh;
        }
        CHECK(bad == 0);
        free(bv);
        free(hv);
    }
    lpx_tensor_release(db);
    lpx_tensor_release(dh);
    lpx_tensor_release(d);
    lpx_tensor_release(w);
    lpx_tensor_release(x);
}

/* ---- numerics ----------------------------------------------------------------- */

static void test_codebook_encode(void)
{
    for (int c = 0; c < 16; c++) {
        CHECK(lpx_nf4_value((unsigned)c) == REF_CB[c]);
        CHECK((int)lpx_nf4_encode(REF_CB[c]) == c);
    }
    CHECK(lpx_nf4_encode(-0.0f) == LPX_NF4_ZERO_CODE && lpx_nf4_encode(0.0f) == LPX_NF4_ZERO_CODE);
    /* a window of ulps around every decision threshold, where the
     * threshold compare and the argmin could disagree */
    const float thr[15] = {LPX_NF4_THRESHOLD_VALUES};
    int64_t bad = 0, n = 0;
    for (int i = 0; i < 15; i++) {
        float v = thr[i];
        for (int k = 0; k < 3000; k++) v = nextafterf(v, -2.0f);
        for (int k = 0; k < 6000; k++, n++) {
            bad += (int)lpx_nf4_encode(v) != ref_nearest(v);
            v = nextafterf(v, 2.0f);
        }
        CHECK(ref_nearest(thr[i]) == i + 1 && ref_nearest(nextafterf(thr[i], -2.0f)) == i);
    }
    /* and uniformly over [-1, 1] */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 1000000; k++, n++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((double)(s >> 11) * 0x1p-53 * 2.0 - 1.0);
        bad += (int)lpx_nf4_encode(v) != ref_nearest(v);
    }
    CHECKF(bad == 0, "%lld of %lld encodes differ from the argmin", (long long)bad, (long long)n);
    CHECK(lpx_nf4_pack(0xA, 0x3) == 0xA3 && lpx_nf4_hi(0xA3) == 0xA && lpx_nf4_lo(0xA3) == 0x3);
}

static void test_quantize_exact_fixed(void)
{
    /* two blocks of 32 per scaler block, hand-made values: ramps, exact
     * codebook multiples, ties of |x/s| between codes, negatives */
    float v[256];
    for (int i = 0; i < 256; i++) {
        int b = i / 32, j = i % 32;
        switch (b % 4) {
        case 0: v[i] = (float)(j - 16) / 16.0f; break;                 /* ramp, absmax 1 */
        case 1: v[i] = REF_CB[j % 16] * 3.0f; break;                   /* exact codes times 3 */
        case 2: v[i] = j == 0 ? 2.0f : (REF_CB[j % 15] + REF_CB[j % 15 + 1]); break; /* midpoints (x2) */
        default: v[i] = (float)(b + 1) * 0.001f * (float)((j * 7) % 11 - 5); break;
        }
    }
    int64_t shape[2] = {8, 32};
    lpx_tensor *x = from_floats(v, 2, shape);
    check_exact(x, 32, 2);
    check_exact(x, 32, 1);
    check_exact(x, 64, 4);   /* padded */
    lpx_tensor_release(x);
}

static void test_quantize_exact_random(void)
{
    int64_t s1[2] = {64, 1000}, s2[1] = {12345}, s3[3] = {3, 5, 129};
    lpx_tensor *x = rand_normal(2, s1, 7, 1.0, LPX_F32);
    check_exact(x, 64, 256);   /* defaults, padded tail */
    check_exact(x, 64, 10);    /* 64000 / 64 = 1000 blocks = 100 scaler blocks, no padding */
    check_exact(x, 128, 3);
    check_exact(x, 4096, 2);
    check_exact(x, 32, 1);
    lpx_tensor_release(x);
    x = rand_normal(1, s2, 8, 1.0, LPX_BF16);
    check_exact(x, 64, 256);
    lpx_tensor_release(x);
    x = rand_normal(3, s3, 9, 1.0, LPX_F16);
    check_exact(x, 34, 5);
    lpx_tensor_release(x);
    /* a strided (transposed) input is read in logical order */
    int64_t s4[2] = {40, 96};
    lpx_tensor *y = rand_normal(2, s4, 10, 1.0, LPX_F32), *yt = NULL;
    CHECK_OK(lpx_t(y, &yt));
    check_exact(yt, 64, 4);
    lpx_tensor_release(yt);
    lpx_tensor_release(y);
}

static void test_roundtrip_error(void)
{
    roundtrip_error();
    /* the same numbers from the portable decode (the SIMD one is chosen
     * at run time when the CPU has it) */
    lpx__nf4_simd = 0;
    roundtrip_error();
    int64_t s[1] = {12345};
    lpx_tensor *x = rand_normal(1, s, 12, 1.0, LPX_F32);
    check_exact(x, 64, 256);
    check_exact(x, 34, 3);
    lpx_tensor_release(x);
    lpx__nf4_simd = 1;
}

static void test_special_blocks(void)
{
    /* block 32, scaler_block 4: block 0 all zero, block 1 constant 0.5,
     * block 2 constant -3, block 3 one huge outlier among small values */
    float v[128];
    for (int i = 0; i < 32; i++) v[i] = 0.0f;
    for (int i = 32; i < 64; i++) v[i] = 0.5f;
    for (int i = 64; i < 96; i++) v[i] = -3.0f;
    for (int i = 96; i < 128; i++) v[i] = i == 100 ? 1.0e6f : 0.01f * (float)(i % 5);
    int64_t shape[1] = {128};
    lpx_tensor *x = from_floats(v, 1, shape), *w = NULL, *d = NULL;
    check_exact(x, 32, 4);
    lpx_nf4_config c = cfg(32, 4);
    CHECK_OK(lpx_nf4_quantize(x, &c, &w));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &d));
    if (d) {
        const float *dv = lpx_tensor_data(d);
        for (int i = 0; i < 32; i++) CHECK(dv[i] == 0.0f);           /* zero block stays exactly zero */
        for (int i = 32; i < 96; i++) CHECK(isfinite(dv[i]));
        /* constant blocks: every code is the codebook end (+-1) */
        const uint8_t *codes = lpx_tensor_data(lpx_tensor_inner(w, LPX_NF4_CODES));
        CHECK(codes[16] == 0xFF && codes[31] == 0xFF);   /* block 1: +1, +1 */
        CHECK(codes[32] == 0x00 && codes[47] == 0x00);   /* block 2: -1, -1 */
        CHECKF(fabsf(dv[100] - 1.0e6f) / 1.0e6f < 0.01f, "outlier dequantized to %g", (double)dv[100]);
        /* the scale error of the constant blocks comes from the i8 scaler
         * grid, which the outlier stretches: bounded by range/256 */
        CHECKF(fabsf(dv[40] - 0.5f) <= 1.0e6f / 128.0f, "constant block dequantized to %g", (double)dv[40]);
    }
    lpx_tensor_release(d);
    lpx_tensor_release(w);
    lpx_tensor_release(x);

    /* constant tensor: every scale equals the mean, scalers 0, factor 1 */
    int64_t s2[1] = {1000};
    lpx_tensor *k = NULL, *kw = NULL, *kd = NULL;
    CHECK_OK(lpx_full(1, s2, -0.75, LPX_F32, lpx_cpu(), &k));
    check_exact(k, 64, 256);
    CHECK_OK(lpx_nf4_quantize(k, NULL, &kw));
    CHECK_OK(lpx_nf4_dequantize(kw, LPX_F32, &kd));
    if (kd) {
        const float *dv = lpx_tensor_data(kd);
        /* 1000 values in 16 blocks, then zero-padded blocks: the mean is
         * pulled down, the scaler grid still lands the constant closely */
        CHECKF(fabsf(dv[0] + 0.75f) < 0.01f && fabsf(dv[999] + 0.75f) < 0.01f, "constant -0.75 -> %g, %g",
               (double)dv[0], (double)dv[999]);
    }
    lpx_tensor_release(kd);
    lpx_tensor_release(kw);
    lpx_tensor_release(k);

    /* all-zero tensor */
    lpx_tensor *z = NULL, *zw = NULL, *zd = NULL;
    CHECK_OK(lpx_zeros(1, s2, LPX_BF16, lpx_cpu(), &z));
    check_exact(z, 64, 256);
    CHECK_OK(lpx_nf4_quantize(z, NULL, &zw));
    CHECK_OK(lpx_nf4_dequantize(zw, -1, &zd));
    if (zd) {
        float *zv = values_f32(zd);
        int nz = 0;
        for (int i = 0; i < 1000; i++) nz += zv[i] != 0.0f;
        CHECK(nz == 0 && lpx_tensor_dtype(zd) == LPX_BF16);
        free(zv);
    }
    lpx_tensor_release(zd);
    lpx_tensor_release(zw);
    lpx_tensor_release(z);

    /* huge magnitudes near FLT_MAX stay finite */
    float big[64];
    for (int i = 0; i < 64; i++) big[i] = (i % 2 ? -1.0f : 1.0f) * (3.0e38f / 64.0f) * (float)(i + 1);
    int64_t s3[1] = {64};
    lpx_tensor *bx = from_floats(big, 1, s3), *bw = NULL, *bd = NULL;
    lpx_nf4_config c2 = cfg(32, 1);
    CHECK_OK(lpx_nf4_quantize(bx, &c2, &bw));
    CHECK_OK(lpx_nf4_dequantize(bw, LPX_F32, &bd));
    if (bd) {
        const float *dv = lpx_tensor_data(bd);
        CHECKF(isfinite(dv[63]) && fabsf(dv[63] + 3.0e38f) / 3.0e38f < 0.02f, "x[63] = -3e38 -> %g", (double)dv[63]);
    }
    lpx_tensor_release(bd);
    lpx_tensor_release(bw);
    lpx_tensor_release(bx);

    /* the factor formula's edges: 2 * absmax(s') overflowing (f would be
     * 0 and every scale NaN) and a denormal absmax(s') (f would be inf) */
    float edge[128];
    for (int i = 0; i < 128; i++) edge[i] = i == 127 ? -3.4e38f : 0.0f;
    int64_t s5[1] = {128};
    lpx_nf4_config c4 = cfg(32, 4);
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            for (int i = 0; i < 128; i++) edge[i] = (i % 32 == 0 ? 2.0e-45f : 1.0e-45f) * (float)(1 + i / 32 % 2);
        lpx_tensor *ex = from_floats(edge, 1, s5), *ew = NULL, *ed = NULL;
        CHECK_OK(lpx_nf4_quantize(ex, &c4, &ew));
        CHECK_OK(lpx_nf4_dequantize(ew, LPX_F32, &ed));
        if (ed) {
            const float *dv = lpx_tensor_data(ed);
            int finite = 0;
            for (int i = 0; i < 128; i++) finite += isfinite(dv[i]) != 0;
            CHECKF(finite == 128, "pass %d: %d of 128 dequantized values finite", pass, finite);
            if (!pass) CHECKF(fabsf(dv[127] + 3.4e38f) / 3.4e38f < 0.02f, "-3.4e38 -> %g", (double)dv[127]);
            const float *f = lpx_tensor_data(lpx_tensor_inner(ew, LPX_NF4_FACTORS));
            CHECK(f[0] > 0.0f && isfinite(f[0]));
        }
        lpx_tensor_release(ed);
        lpx_tensor_release(ew);
        lpx_tensor_release(ex);
    }

    /* NaN and inf are refused with a message naming the element */
    float bad[100];
    for (int i = 0; i < 100; i++) bad[i] = 0.1f * (float)i;
    int64_t s4[2] = {10, 10};
    bad[57] = NAN;
    lpx_tensor *nx = from_floats(bad, 2, s4), *nw = NULL;
    CHECK_ERR(lpx_nf4_quantize(nx, NULL, &nw), LPX_ENUMERIC);
    CHECK(nw == NULL && strstr(lpx_last_error(), "NaN") && strstr(lpx_last_error(), "57"));
    lpx_tensor_release(nx);
    bad[57] = 1.0f;
    bad[3] = -INFINITY;
    nx = from_floats(bad, 2, s4);
    CHECK_ERR(lpx_nf4_quantize(nx, NULL, &nw), LPX_ENUMERIC);
    CHECK(strstr(lpx_last_error(), "inf") && strstr(lpx_last_error(), "nf4_quantize"));
    lpx_tensor_release(nx);
}

static void test_padding_odd_numel(void)
{
    int64_t shapes[][3] = {{7, 0, 0}, {3, 5, 0}, {1, 16385, 0}, {2, 3, 11}, {0, 0, 0}, {0, 4, 0}};
    int nds[] = {1, 2, 2, 3, 1, 2};
    for (int k = 0; k < 6; k++) {
        lpx_tensor *x = rand_normal(nds[k], shapes[k], 20 + (uint64_t)k, 1.0, LPX_F32), *w = NULL, *d = NULL;
        check_exact(x, 64, 256);
        CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
        if (!w) {
            lpx_tensor_release(x);
            continue;
        }
        lpx_nf4_info info;
        CHECK_OK(lpx_nf4_get_info(w, &info));
        int64_t n = lpx_tensor_numel(x);
        /* the default scaler_block divides the block count: padded to a
         * whole block of 64, never to 256 blocks */
        CHECK(info.numel == n && info.padded % 64 == 0 && info.padded >= n && info.padded - n < 64);
        CHECK(n > 0 || info.padded == 0);
        CHECK(lpx_tensor_ndim(w) == nds[k] && lpx_tensor_dtype(w) == LPX_F32);
        CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &d));
        if (d) {
            CHECK(lpx_tensor_ndim(d) == nds[k]);
            for (int i = 0; i < nds[k]; i++) CHECK(lpx_tensor_shape(d)[i] == shapes[k][i]);
            CHECK(lpx_tensor_numel(d) == n);
        }
        int64_t bytes = 0;
        CHECK_OK(lpx_nf4_bytes(nds[k], shapes[k], NULL, &bytes));
        CHECK(bytes == info.bytes);
        lpx_tensor_release(d);
        lpx_tensor_release(w);
        lpx_tensor_release(x);
    }
    /* the cost of a small weight under the default: [32, 64] = 32 blocks in
     * one scaler block of 32 (codes 1024 B, 32 scalers, 1 factor, mean):
     * 4.16 bits per parameter. The default of old (scaler_block 256) padded
     * it to 16384 elements: 33 bits per parameter. */
    {
        int64_t sw[2] = {32, 64};
        lpx_tensor *xw = rand_normal(2, sw, 29, 1.0, LPX_F32), *ww = NULL;
        CHECK_OK(lpx_nf4_quantize(xw, NULL, &ww));
        lpx_nf4_info wi;
        if (ww && !lpx_nf4_get_info(ww, &wi)) {
            printf("     [32, 64] default: scaler_block %lld, %lld bytes = %.3f bits/param\n", (long long)wi.scaler_block,
                   (long long)wi.bytes, wi.bits_per_param);
            CHECK(wi.scaler_block == 32 && wi.padded == 2048 && wi.bytes == 1024 + 32 + 4 + 4 && wi.bits_per_param < 4.2);
        }
        lpx_tensor_release(ww);
        lpx_tensor_release(xw);
    }
    /* pad = false: the strict layout, checked (with an explicit scaler_block:
     * the automatic one always divides) */
    int64_t s[2] = {4, 8192};
    lpx_tensor *x = rand_normal(2, s, 30, 1.0, LPX_F32), *w = NULL;
    lpx_nf4_config c = lpx_nf4_config_default();
    c.scaler_block = 256;
    c.pad = false;
    CHECK_OK(lpx_nf4_quantize(x, &c, &w));   /* 32768 = 2 scaler blocks */
    lpx_tensor_release(w);
    lpx_tensor_release(x);
    int64_t s2[1] = {16384 + 64};
    x = rand_normal(1, s2, 31, 1.0, LPX_F32);
    CHECK_ERR(lpx_nf4_quantize(x, &c, &w), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "scaler_block") && strstr(lpx_last_error(), "pad"));
    lpx_tensor_release(x);
}

static void test_bits_per_param(void)
{
    int64_t shape[2] = {4096, 4096};
    int64_t bytes = 0;
    CHECK_OK(lpx_nf4_bytes(2, shape, NULL, &bytes));
    double bpp = 8.0 * (double)bytes / (4096.0 * 4096.0);
    printf("     4096x4096, defaults: %lld bytes = %.4f bits/param\n", (long long)bytes, bpp);
    CHECK_NEAR(bpp, 4.127, 0.001);
    lpx_tensor *x = rand_normal(2, shape, 40, 1.0, LPX_BF16), *w = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    if (w) {
        int64_t sum = 0;
        for (int i = 0; i < lpx_tensor_inner_count(w); i++) {
            lpx_tensor *t = lpx_tensor_inner(w, i);
            sum += (int64_t)lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
        }
        CHECKF(sum == bytes, "inner tensors hold %lld bytes, lpx_nf4_bytes says %lld", (long long)sum, (long long)bytes);
        lpx_nf4_info info;
        CHECK_OK(lpx_nf4_get_info(w, &info));
        CHECK_NEAR(info.bits_per_param, 4.127, 0.001);
        CHECK(info.shard_unit_rows == 4);
        char desc[256];
        const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
        CHECK(vt->describe(w, desc, sizeof desc) > 0);
        CHECK(strstr(desc, "nf4") && strstr(desc, "4.127") && strstr(desc, "bf16"));
    }
    lpx_tensor_release(w);
    lpx_tensor_release(x);
    /* the classic formula, other configs */
    lpx_nf4_config c = cfg(128, 64);
    CHECK_OK(lpx_nf4_bytes(2, shape, &c, &bytes));
    CHECK(bytes == 4096LL * 4096 / 2 + 4096LL * 4096 / 128 + 4 * (4096LL * 4096 / 8192) + 4);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_codebook_encode);
    RUN(test_quantize_exact_fixed);
    RUN(test_quantize_exact_random);
    RUN(test_roundtrip_error);
    RUN(test_special_blocks);
    RUN(test_padding_odd_numel);
    RUN(test_bits_per_param);
    RUN(test_no_leaks);
    return CHECK_DONE();
}
