/* The nf4 kind: quantization bit-exact against an independent scalar
 * reference written here from the formulas of docs/NF4.md ("The
 * format"), round-trip error, special blocks, padding, sizes, the NF4
 * linear and the QLoRA linear against f64 references, handlers, the
 * fallback switch, the all-gather hooks and untrusted unflatten. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include "check.h"
#include "tensor_util.h"
#include "core/numerics/nf4.h"

/* backends/cpu/nf4.c test hook: 0 forces the portable scalar decode */
extern int lpx__nf4_simd;

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

typedef struct ref_q {
    int64_t padded, nb, nsb;
    uint8_t *codes;
    int8_t *qs;
    float *f;
    float mean;
} ref_q;

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

/* Contiguous f32 copy of a dense tensor's values (caller frees). */
static float *values_f32(lpx_tensor *t)
{
    lpx_tensor *c = NULL;
    CHECK_OK(lpx_cast(t, LPX_F32, false, &c));
    if (!c) return NULL;
    lpx_tensor *cc = NULL;
    CHECK_OK(lpx_contiguous(c, &cc));
    int64_t n = lpx_tensor_numel(cc);
    float *v = malloc((size_t)(n + 1) * sizeof(float));
    memcpy(v, lpx_tensor_data(cc), (size_t)n * sizeof(float));
    lpx_tensor_release(c);
    lpx_tensor_release(cc);
    return v;
}

static lpx_nf4_config cfg(int64_t block, int64_t sblock)
{
    lpx_nf4_config c = lpx_nf4_config_default();
    c.block = block;
    c.scaler_block = sblock;
    return c;
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

static double rel_err(const float *a, const double *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
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
        CHECK(info.numel == n && info.padded % 16384 == 0 && info.padded >= n && info.padded - n < 16384);
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
    /* pad = false: the strict layout, checked */
    int64_t s[2] = {4, 8192};
    lpx_tensor *x = rand_normal(2, s, 30, 1.0, LPX_F32), *w = NULL;
    lpx_nf4_config c = lpx_nf4_config_default();
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

/* ---- handlers ---------------------------------------------------------------- */

static bool same_values(lpx_tensor *a, lpx_tensor *b)
{
    if (lpx_tensor_numel(a) != lpx_tensor_numel(b)) return false;
    float *av = values_f32(a), *bv = values_f32(b);
    bool same = memcmp(av, bv, (size_t)lpx_tensor_numel(a) * sizeof(float)) == 0;
    free(av);
    free(bv);
    return same;
}

/* dequantized nf4 (f32) */
static lpx_tensor *deq(lpx_tensor *w)
{
    lpx_tensor *d = NULL;
    CHECK_OK(lpx_cast(w, LPX_F32, false, &d));
    return d;
}

static void test_handlers_views(void)
{
    /* block 64, scaler block 4: 256 elements per scaler block; rows of 1000
     * -> one unit = 256 / gcd(1000, 256) = 32 rows */
    int64_t s[2] = {40, 1000};
    lpx_tensor *x = rand_normal(2, s, 80, 1.0, LPX_BF16), *w = NULL;
    lpx_nf4_config c = cfg(64, 4);
    CHECK_OK(lpx_nf4_quantize(x, &c, &w));
    if (!w) { lpx_tensor_release(x); return; }
    lpx_tensor *full = deq(w);
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    CHECK(vt->shard_unit(w) == 32);

    /* slices in whole scaler blocks; the tail keeps the padding */
    lpx_tensor *s0 = NULL, *s1 = NULL, *bad = NULL, *d0 = NULL, *d1 = NULL, *r0 = NULL, *r1 = NULL;
    CHECK_OK(lpx_narrow(w, 0, 0, 32, &s0));
    CHECK_OK(lpx_slice(w, 0, 32, 40, 1, &s1));
    CHECK_OK(lpx_nf4_dequantize_rows(w, 0, 32, LPX_F32, NULL, &r0));
    CHECK_OK(lpx_nf4_dequantize_rows(w, 32, 8, LPX_F32, NULL, &r1));
    if (s0 && s1 && r0 && r1) {
        d0 = deq(s0);
        d1 = deq(s1);
        CHECK(same_values(d0, r0) && same_values(d1, r1));
        CHECK(lpx_tensor_shape(s1)[0] == 8 && lpx_tensor_shape(s1)[1] == 1000);
        lpx_nf4_info i0, i1;
        CHECK_OK(lpx_nf4_get_info(s0, &i0));
        CHECK_OK(lpx_nf4_get_info(s1, &i1));
        CHECK(!i0.whole && i0.padded == 32000 && i1.padded == 8192 && i1.numel == 8000);
    }
    CHECK_ERR(lpx_narrow(w, 0, 8, 16, &bad), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "scaler block") && strstr(lpx_last_error(), "32 rows"));
    CHECK_ERR(lpx_slice(w, 1, 0, 64, 1, &bad), LPX_ESHAPE);
    CHECK_ERR(lpx_slice(w, 0, 0, 32, 2, &bad), LPX_ESHAPE);
    CHECK_ERR(lpx_narrow(w, 0, 32, 9, &bad), LPX_ERANGE);
    /* split in units; chunk(2) would cut at row 20 */
    lpx_tensor *parts[4] = {NULL};
    int np = 0;
    CHECK_OK(lpx_split(w, 32, 0, parts, 4, &np));
    CHECK(np == 2);
    for (int i = 0; i < np; i++) lpx_tensor_release(parts[i]);
    CHECK_ERR(lpx_chunk(w, 2, 0, parts, 4, &np), LPX_ESHAPE);
    /* empty slice at the end */
    lpx_tensor *e = NULL;
    CHECK_OK(lpx_slice(w, 0, 40, 40, 1, &e));
    CHECK(e && lpx_tensor_numel(e) == 0);
    lpx_tensor_release(e);

    /* t and transpose */
    lpx_tensor *wt = NULL, *wtt = NULL, *dt = NULL, *ref = NULL, *tr = NULL;
    CHECK_OK(lpx_t(w, &wt));
    CHECK_OK(lpx_transpose(wt, 0, 1, &wtt));
    if (wt && wtt) {
        CHECK(lpx_tensor_shape(wt)[0] == 1000 && lpx_tensor_shape(wt)[1] == 40);
        dt = deq(wt);
        CHECK_OK(lpx_t(full, &tr));
        CHECK_OK(lpx_contiguous(tr, &ref));
        CHECK(same_values(dt, ref));
        lpx_tensor *dtt = deq(wtt);
        CHECK(same_values(dtt, full));
        lpx_tensor_release(dtt);
        CHECK_ERR(lpx_narrow(wt, 0, 0, 32, &bad), LPX_ESHAPE);   /* dim 0 is stored as columns */
        int64_t flat[1] = {40000};
        CHECK_ERR(lpx_view(wt, 1, flat, &bad), LPX_ESHAPE);
        CHECK(strstr(lpx_last_error(), "transposed") != NULL);
    }
    /* view / reshape */
    int64_t v1[1] = {-1}, v2[2] = {-1, 500};
    lpx_tensor *f1 = NULL, *f2 = NULL;
    CHECK_OK(lpx_view(w, 1, v1, &f1));
    CHECK_OK(lpx_reshape(f1, 2, v2, &f2));
    if (f1 && f2) {
        CHECK(lpx_tensor_numel(f1) == 40000 && lpx_tensor_shape(f2)[0] == 80);
        lpx_tensor *df = deq(f2);
        CHECK(same_values(df, full));
        lpx_tensor_release(df);
    }
    int64_t wrong[1] = {39999};
    CHECK_ERR(lpx_view(w, 1, wrong, &bad), LPX_ESHAPE);
    /* detach shares, clone copies */
    lpx_tensor *det = NULL, *cl = NULL;
    CHECK_OK(lpx_detach(w, &det));
    CHECK_OK(lpx_clone(s1, &cl));
    if (det && cl) {
        CHECK(lpx_tensor_inner(det, 0) == lpx_tensor_inner(w, 0));
        CHECK(!lpx_tensor_shares_storage(lpx_tensor_inner(cl, 0), lpx_tensor_inner(w, 0)));
        lpx_tensor *dc = deq(cl);
        CHECK(same_values(dc, r1));
        lpx_nf4_info ic;
        CHECK_OK(lpx_nf4_get_info(cl, &ic));
        CHECK(ic.whole);
        lpx_tensor_release(dc);
    }
    /* cast to other dtypes */
    lpx_tensor *cb = NULL, *c8 = NULL;
    CHECK_OK(lpx_cast(w, LPX_BF16, false, &cb));
    CHECK_OK(lpx_cast(w, LPX_F8E4M3FN, true, &c8));
    CHECK(cb && lpx_tensor_dtype(cb) == LPX_BF16 && c8 && lpx_tensor_dtype(c8) == LPX_F8E4M3FN);
    lpx_tensor *tmp[] = {x, w, full, s0, s1, d0, d1, r0, r1, wt, wtt, dt, ref, tr, f1, f2, det, cl, cb, c8};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_handlers_copy(void)
{
    int64_t s[2] = {16, 512};
    lpx_tensor *x = rand_normal(2, s, 90, 1.0, LPX_F32), *y = rand_normal(2, s, 91, 1.0, LPX_F32), *w = NULL, *w2 = NULL, *wy = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w2));
    CHECK_OK(lpx_nf4_quantize(y, NULL, &wy));
    if (!w || !w2 || !wy) return;
    /* dense -> nf4 quantizes into the existing payload */
    CHECK_OK(lpx_copy_(w2, y));
    lpx_tensor *a = deq(w2), *b = deq(wy);
    CHECK(same_values(a, b));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* nf4 -> nf4 same layout: bit copy */
    CHECK_OK(lpx_copy_(w2, w));
    a = deq(w2);
    b = deq(w);
    CHECK(same_values(a, b));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* nf4 -> dense */
    lpx_tensor *dense = NULL;
    CHECK_OK(lpx_zeros(2, s, LPX_BF16, lpx_cpu(), &dense));
    CHECK_OK(lpx_copy_(dense, wy));
    lpx_tensor *ref = NULL;
    CHECK_OK(lpx_nf4_dequantize(wy, LPX_BF16, &ref));
    CHECK(same_values(dense, ref));
    /* into a transposed nf4 */
    lpx_tensor *wt = NULL, *yt = NULL;
    CHECK_OK(lpx_t(w2, &wt));
    CHECK_OK(lpx_t(y, &yt));
    CHECK_OK(lpx_copy_(wt, yt));     /* w2 = quantize(y) again, through the transposed handle */
    a = deq(w2);
    b = deq(wy);
    CHECK(same_values(a, b));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* a slice shares its parent's mean: quantizing into it is refused */
    int64_t big[2] = {64, 512};
    lpx_tensor *xb = rand_normal(2, big, 92, 1.0, LPX_F32), *wb = NULL, *sl = NULL;
    CHECK_OK(lpx_nf4_quantize(xb, NULL, &wb));
    CHECK_OK(lpx_narrow(wb, 0, 0, 32, &sl));
    lpx_tensor *src = NULL;
    int64_t ss[2] = {32, 512};
    CHECK_OK(lpx_zeros(2, ss, LPX_F32, lpx_cpu(), &src));
    CHECK_ERR(lpx_copy_(sl, src), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "slice") && strstr(lpx_last_error(), "copy_"));
    CHECK_ERR(lpx_copy_(w, src), LPX_ESHAPE);
    lpx_tensor *tmp[] = {x, y, w, w2, wy, dense, ref, wt, yt, xb, wb, sl, src};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_fallback(void)
{
    int64_t s[2] = {8, 256};
    lpx_tensor *x = rand_normal(2, s, 100, 1.0, LPX_F32), *w = NULL, *d = NULL, *r = NULL, *ref = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &d));
    CHECK(!lpx_nf4_fallback_enabled());
    CHECK_ERR(lpx_sum(w, 0, NULL, false, &r), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "sum") && strstr(lpx_last_error(), "nf4") &&
          strstr(lpx_last_error(), "lpx_nf4_set_fallback"));
    CHECK(r == NULL);
    int key = lpx_kind_key(lpx_nf4_kind());
    lpx_nf4_set_fallback(true);
    CHECK_OK(lpx_trace_start(NULL));
    CHECK_OK(lpx_sum(w, 0, NULL, false, &r));
    CHECK_OK(lpx_sum(d, 0, NULL, false, &ref));
    double a = 0, b = 1;
    if (r && ref) {
        CHECK_OK(lpx_item(r, 0, &a));
        CHECK_OK(lpx_item(ref, 0, &b));
        CHECK(a == b);
    }
    CHECK(lpx_trace_fallback_count(LPX_OP_sum, key) == 1);
    CHECK(lpx_trace_count(LPX_OP_nf4_dequantize, LPX_KEY_CPU) >= 1);
    /* Tensor[] arguments too */
    lpx_tensor *list[2] = {w, d}, *cat = NULL;
    CHECK_OK(lpx_cat(list, 2, 0, &cat));
    CHECK(cat && lpx_tensor_shape(cat)[0] == 16);
    CHECK(lpx_trace_fallback_count(LPX_OP_cat, key) == 1);
    /* never writes into an nf4 argument */
    CHECK_ERR(lpx_add_out(d, d, w), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "out") != NULL);
    CHECK_ERR(lpx_fill_(w, 1.0), LPX_ENOTIMPL);
    CHECK_OK(lpx_trace_stop());
    lpx_nf4_set_fallback(false);
    lpx_tensor *again = NULL;
    CHECK_ERR(lpx_mean(w, 0, NULL, false, &again), LPX_ENOTIMPL);
    lpx_tensor *tmp[] = {x, w, d, r, ref, cat};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

/* ---- hooks --------------------------------------------------------------------- */

/* Concatenates 1-D dense tensors (any byte dtype) in order. */
static lpx_tensor *concat(lpx_tensor *const *ts, int n)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += lpx_tensor_numel(ts[i]);
    lpx_tensor *out = NULL;
    CHECK_OK(lpx_tensor_new(lpx_tensor_dtype(ts[0]), 1, &total, lpx_cpu(), &out));
    size_t esz = lpx_dtype_nbytes(lpx_tensor_dtype(ts[0]), 1), off = 0;
    for (int i = 0; i < n && out; i++) {
        size_t nb = (size_t)lpx_tensor_numel(ts[i]) * esz;
        if (nb) memcpy((char *)lpx_tensor_data(out) + off, lpx_tensor_data(ts[i]), nb);
        off += nb;
    }
    return out;
}

static bool same_payload(lpx_tensor *a, lpx_tensor *b)
{
    for (int i = 0; i < LPX_NF4_NINNER; i++) {
        lpx_tensor *x = lpx_tensor_inner(a, i), *y = lpx_tensor_inner(b, i);
        size_t n = lpx_dtype_nbytes(lpx_tensor_dtype(x), lpx_tensor_numel(x));
        if (lpx_tensor_numel(x) != lpx_tensor_numel(y) || (n && memcmp(lpx_tensor_data(x), lpx_tensor_data(y), n)))
            return false;
    }
    size_t ma, mb;
    const lpx_nf4_meta *pa = lpx_tensor_meta(a, &ma), *pb = lpx_tensor_meta(b, &mb);
    return ma == mb && pa->padded == pb->padded && pa->block == pb->block && pa->scaler_block == pb->scaler_block &&
           lpx_tensor_ndim(a) == lpx_tensor_ndim(b) && lpx_tensor_shape(a)[0] == lpx_tensor_shape(b)[0];
}

static void test_hooks(void)
{
    /* 37 rows of 96, block 32, scaler block 2: unit = 64 / gcd(96, 64) = 2 rows */
    int64_t s[2] = {37, 96};
    lpx_tensor *x = rand_normal(2, s, 110, 1.0, LPX_BF16), *w = NULL;
    lpx_nf4_config c = cfg(32, 2);
    CHECK_OK(lpx_nf4_quantize(x, &c, &w));
    if (!w) { lpx_tensor_release(x); return; }
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    int64_t unit = vt->shard_unit(w);
    CHECK(unit == 2);
    lpx_tensor *prev = NULL;
    for (int world = 1; world <= 7; world++) {
        /* the engine's cut: torch.chunk rounded up to the shard unit */
        int64_t chunk = (37 + world - 1) / world;
        chunk = (chunk + unit - 1) / unit * unit;
        lpx_tensor *in[8][LPX_MAX_AG_INPUTS];
        int nin[8];
        unsigned char meta[LPX_MAX_META];
        size_t msize = 0;
        for (int r = 0; r < world; r++) {
            int64_t r0 = r * chunk < 37 ? r * chunk : 37, r1 = (r + 1) * chunk < 37 ? (r + 1) * chunk : 37;
            lpx_tensor *shard = NULL;
            CHECK_OK(lpx_narrow(w, 0, r0, r1 - r0, &shard));
            nin[r] = 0;
            if (shard) CHECK_OK(vt->pre_all_gather(shard, NULL, in[r], &nin[r], meta, &msize));
            CHECK(nin[r] == 5);
            lpx_tensor_release(shard);
        }
        lpx_tensor *gathered[5] = {NULL};
        for (int i = 0; i < 5; i++) {
            lpx_tensor *col[8];
            for (int r = 0; r < world; r++) col[r] = in[r][i];
            gathered[i] = concat(col, world);
        }
        lpx_tensor *full = NULL;
        CHECK_OK(vt->post_all_gather(lpx_nf4_kind(), gathered, 5, meta, msize, LPX_BF16, NULL, &full));
        CHECKF(full && same_payload(full, w), "world %d: gathered tensor differs from the quantized one", world);
        if (full) CHECK(lpx_tensor_dtype(full) == LPX_BF16 && lpx_tensor_shape(full)[1] == 96);
        /* in place into the previous result */
        if (prev) {
            lpx_tensor *again = NULL;
            CHECK_OK(vt->post_all_gather(lpx_nf4_kind(), gathered, 5, meta, msize, LPX_BF16, prev, &again));
            CHECK(again == prev && same_payload(prev, w));
            lpx_tensor_release(again);
        }
        lpx_tensor_release(prev);
        prev = full;
        for (int i = 0; i < 5; i++) lpx_tensor_release(gathered[i]);
        for (int r = 0; r < world; r++)
            for (int i = 0; i < nin[r]; i++) lpx_tensor_release(in[r][i]);
    }
    /* shards of two separately quantized tensors do not form one */
    lpx_tensor *x2 = rand_normal(2, s, 111, 1.0, LPX_BF16), *w2 = NULL, *sa = NULL, *sb = NULL;
    CHECK_OK(lpx_nf4_quantize(x2, &c, &w2));
    CHECK_OK(lpx_narrow(w, 0, 0, 20, &sa));
    CHECK_OK(lpx_narrow(w2, 0, 20, 17, &sb));
    if (sa && sb) {
        lpx_tensor *ia[8], *ib[8], *g[5], *res = NULL;
        int na = 0, nb = 0;
        unsigned char meta[LPX_MAX_META];
        size_t ms = 0;
        CHECK_OK(vt->pre_all_gather(sa, NULL, ia, &na, meta, &ms));
        CHECK_OK(vt->pre_all_gather(sb, NULL, ib, &nb, meta, &ms));
        for (int i = 0; i < 5; i++) {
            lpx_tensor *col[2] = {ia[i], ib[i]};
            g[i] = concat(col, 2);
        }
        CHECK_ERR(vt->post_all_gather(lpx_nf4_kind(), g, 5, meta, ms, -1, NULL, &res), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "separately") != NULL);
        CHECK_ERR(vt->post_all_gather(lpx_nf4_kind(), g, 4, meta, ms, -1, NULL, &res), LPX_EINVAL);
        CHECK_ERR(vt->post_all_gather(lpx_nf4_kind(), g, 5, meta, ms - 1, -1, NULL, &res), LPX_EINVAL);
        for (int i = 0; i < 5; i++) {
            lpx_tensor_release(g[i]);
            lpx_tensor_release(ia[i]);
            lpx_tensor_release(ib[i]);
        }
    }
    lpx_tensor *wt = NULL;
    lpx_tensor *dummy[8];
    int nd = 0;
    unsigned char meta[LPX_MAX_META];
    size_t ms = 0;
    CHECK_OK(lpx_t(w, &wt));
    CHECK_ERR(vt->pre_all_gather(wt, NULL, dummy, &nd, meta, &ms), LPX_EINVAL);
    lpx_tensor *tmp[] = {x, w, prev, x2, w2, sa, sb, wt};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

/* ---- untrusted unflatten and bad arguments ----------------------------------- */

static void test_unflatten(void)
{
    int64_t s[2] = {10, 100};
    lpx_tensor *x = rand_normal(2, s, 120, 1.0, LPX_F32), *w = NULL, *u = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    if (!w) { lpx_tensor_release(x); return; }
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    lpx_tensor *inner[4];
    for (int i = 0; i < 4; i++) inner[i] = lpx_tensor_inner(w, i);
    size_t ms = 0;
    const lpx_nf4_meta *m0 = lpx_tensor_meta(w, &ms);
    CHECK(ms == sizeof(lpx_nf4_meta));
    CHECK_OK(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, m0, ms, &u));
    if (u) {
        lpx_tensor *a = deq(u), *b = deq(w);
        CHECK(same_values(a, b));
        lpx_tensor_release(a);
        lpx_tensor_release(b);
        lpx_tensor_release(u);
        u = NULL;
    }
    lpx_nf4_meta m;
    /* every corruption is refused with an error, never a crash */
    m = *m0; m.magic = 0;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.block = 33;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.scaler_block = 0;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.padded += 16384;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.padded = -2;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.reserved[2] = 1;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.transposed = 2;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.block = 128;   /* then the qscaler count is wrong */
    CHECK(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u) != LPX_OK);
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, m0, ms - 1, &u), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_I32, 2, s, inner, 4, m0, ms, &u), LPX_EDTYPE);
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 3, m0, ms, &u), LPX_EINVAL);
    int64_t s2[2] = {10, 10000};
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s2, inner, 4, m0, ms, &u), LPX_EINVAL);
    lpx_tensor *swapped[4] = {inner[1], inner[0], inner[2], inner[3]};
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, swapped, 4, m0, ms, &u), LPX_EDTYPE);
    /* bad factor / mean values */
    lpx_tensor *f = NULL, *mean = NULL;
    CHECK_OK(lpx_clone(inner[2], &f));
    CHECK_OK(lpx_clone(inner[3], &mean));
    if (f && mean) {
        ((float *)lpx_tensor_data(f))[0] = 0.0f;
        lpx_tensor *badf[4] = {inner[0], inner[1], f, inner[3]};
        CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, badf, 4, m0, ms, &u), LPX_EINVAL);
        ((float *)lpx_tensor_data(mean))[0] = NAN;
        lpx_tensor *badm[4] = {inner[0], inner[1], inner[2], mean};
        CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, badm, 4, m0, ms, &u), LPX_EINVAL);
    }
    CHECK(u == NULL);
    lpx_tensor *tmp[] = {x, w, f, mean};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_bad_configs(void)
{
    int64_t s[1] = {1000}, bytes = 0;
    lpx_tensor *x = rand_normal(1, s, 130, 1.0, LPX_F32), *w = NULL;
    int64_t blocks[] = {0, 31, 33, 4098, -64};
    for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++) {
        lpx_nf4_config c = cfg(blocks[i], 256);
        CHECK_ERR(lpx_nf4_quantize(x, &c, &w), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "block") != NULL);
        CHECK_ERR(lpx_nf4_bytes(1, s, &c, &bytes), LPX_EINVAL);
        CHECK_ERR(lpx_nf4_config_check(&c, -1), LPX_EINVAL);
    }
    int64_t sblocks[] = {0, -1, 65537};
    for (size_t i = 0; i < sizeof sblocks / sizeof *sblocks; i++) {
        lpx_nf4_config c = cfg(64, sblocks[i]);
        CHECK_ERR(lpx_nf4_quantize(x, &c, &w), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "scaler_block") != NULL);
    }
    lpx_nf4_config ok = cfg(4096, 65536);
    CHECK_OK(lpx_nf4_config_check(&ok, -1));
    CHECK_OK(lpx_nf4_config_check(NULL, 12345));
    ok.pad = false;
    CHECK_ERR(lpx_nf4_config_check(&ok, 4096), LPX_EINVAL);
    CHECK_ERR(lpx_nf4_bytes(1, s, NULL, NULL), LPX_EINVAL);
    int64_t neg[1] = {-5};
    CHECK_ERR(lpx_nf4_bytes(1, neg, NULL, &bytes), LPX_EINVAL);
    CHECK(w == NULL);
    /* wrong inputs */
    lpx_tensor *i32 = NULL, *d = NULL, *q = NULL;
    CHECK_OK(lpx_zeros(1, s, LPX_I32, lpx_cpu(), &i32));
    CHECK_ERR(lpx_nf4_quantize(i32, NULL, &q), LPX_EDTYPE);
    CHECK_ERR(lpx_nf4_quantize(NULL, NULL, &q), LPX_EINVAL);
    CHECK_ERR(lpx_nf4_dequantize(x, LPX_F32, &d), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "not an nf4") != NULL);
    CHECK_OK(lpx_nf4_quantize(x, NULL, &q));
    lpx_tensor *q2 = NULL;
    CHECK_ERR(lpx_nf4_quantize(q, NULL, &q2), LPX_EINVAL);
    CHECK_ERR(lpx_nf4_dequantize(q, LPX_I8, &d), LPX_EDTYPE);
    CHECK_ERR(lpx_nf4_dequantize_rows(q, 900, 200, LPX_F32, NULL, &d), LPX_ERANGE);
    lpx_tensor *scratch = NULL;
    int64_t ss[1] = {99};
    CHECK_OK(lpx_empty(1, ss, LPX_F32, lpx_cpu(), &scratch));
    CHECK_ERR(lpx_nf4_dequantize_rows(q, 0, 100, LPX_F32, scratch, &d), LPX_ESHAPE);
    lpx_tensor *r = NULL;
    CHECK_OK(lpx_nf4_dequantize_rows(q, 1, 99, LPX_F32, scratch, &r));
    CHECK(r == scratch);
    lpx_tensor_release(r);
    /* the dense op refuses inconsistent payloads */
    lpx_value args[10] = {lpx_v_tensor(lpx_tensor_inner(q, 0)), lpx_v_tensor(lpx_tensor_inner(q, 1)),
                          lpx_v_tensor(lpx_tensor_inner(q, 2)), lpx_v_tensor(lpx_tensor_inner(q, 3)),
                          lpx_v_i64(128), lpx_v_i64(256), lpx_v_i64(0), lpx_v_i64(10), lpx_v_dtype(LPX_F32),
                          lpx_v_none()};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_nf4_dequantize, args, 10);
    CHECK_ERR(lpx_dispatch(&c), LPX_ESHAPE);
    args[4] = lpx_v_i64(64);
    args[7] = lpx_v_i64(20000);
    lpx_call_init(&c, LPX_OP_nf4_dequantize, args, 10);
    CHECK_ERR(lpx_dispatch(&c), LPX_ERANGE);
    lpx_tensor *tmp[] = {x, i32, q, scratch};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

/* ---- out of memory -------------------------------------------------------------- */

LPX_API void lpx__fail_alloc_after(long n);

static lpx_tensor *oom_x, *oom_w, *oom_a, *oom_b, *oom_g, *oom_dense;

static lpx_status oom_quantize(void)
{
    lpx_tensor *w = NULL;
    lpx_status st = lpx_nf4_quantize(oom_x, NULL, &w);
    lpx_tensor_release(w);
    return st;
}

static lpx_status oom_views(void)
{
    lpx_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    lpx_status st = lpx_narrow(oom_w, 0, 0, 128, &a);
    if (!st) st = lpx_t(oom_w, &b);
    if (!st) st = lpx_clone(a, &c);
    if (!st) st = lpx_cast(b, LPX_BF16, false, &d);
    lpx_tensor *t[] = {a, b, c, d};
    for (int i = 0; i < 4; i++) lpx_tensor_release(t[i]);
    return st;
}

static lpx_status oom_copy(void)
{
    lpx_tensor *w = NULL;
    lpx_status st = lpx_clone(oom_w, &w);
    if (!st) st = lpx_copy_(w, oom_dense);
    if (!st) st = lpx_copy_(oom_dense, w);
    lpx_tensor_release(w);
    return st;
}

static lpx_status oom_qlora(void)
{
    lpx_qlora_opts o = lpx_qlora_opts_default();
    o.dropout = 0.1;
    lpx_tensor *y = NULL, *xa = NULL, *gx = NULL, *ga = NULL, *gb = NULL;
    lpx_status st = lpx_qlora_linear(oom_x, oom_w, NULL, oom_a, oom_b, &o, &y, &xa);
    if (!st) st = lpx_qlora_linear_backward(oom_g, oom_x, oom_w, oom_a, oom_b, NULL, &o, &gx, &ga, &gb);
    lpx_tensor *t[] = {y, xa, gx, ga, gb};
    for (int i = 0; i < 5; i++) lpx_tensor_release(t[i]);
    return st;
}

static lpx_status oom_hooks(void)
{
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    lpx_tensor *in[8] = {NULL}, *res = NULL;
    int n = 0;
    unsigned char meta[LPX_MAX_META];
    size_t ms = 0;
    lpx_status st = vt->pre_all_gather(oom_w, NULL, in, &n, meta, &ms);
    if (!st) st = vt->post_all_gather(lpx_nf4_kind(), in, n, meta, ms, -1, NULL, &res);
    for (int i = 0; i < n; i++) lpx_tensor_release(in[i]);
    lpx_tensor_release(res);
    return st;
}

static lpx_status oom_fallback(void)
{
    lpx_tensor *r = NULL;
    lpx_nf4_set_fallback(true);
    lpx_status st = lpx_relu(oom_w, &r);
    lpx_nf4_set_fallback(false);
    lpx_tensor_release(r);
    return st;
}

static void test_out_of_memory(void)
{
    int64_t xs[2] = {256, 128}, as[2] = {4, 128}, bs[2] = {256, 4}, gs[2] = {256, 256};
    oom_x = rand_normal(2, xs, 140, 1.0, LPX_BF16);
    oom_dense = rand_normal(2, xs, 141, 1.0, LPX_F32);
    oom_a = rand_normal(2, as, 142, 1.0, LPX_F32);
    oom_b = rand_normal(2, bs, 143, 1.0, LPX_F32);
    oom_g = rand_normal(2, gs, 144, 1.0, LPX_F32);
    CHECK_OK(lpx_nf4_quantize(oom_x, NULL, &oom_w));
    struct { const char *name; lpx_status (*fn)(void); } sc[] = {
        {"quantize", oom_quantize}, {"views", oom_views}, {"copy_", oom_copy},
        {"qlora", oom_qlora},       {"hooks", oom_hooks}, {"fallback", oom_fallback},
    };
    for (size_t k = 0; k < sizeof sc / sizeof *sc && oom_w; k++) {
        int n = 0;
        for (; n < 2000; n++) {
            lpx__fail_alloc_after(n);
            lpx_clear_error();
            lpx_status st = sc[k].fn();
            lpx__fail_alloc_after(-1);
            if (st == LPX_OK) break;
            CHECKF(st == LPX_ENOMEM && lpx_last_error()[0], "%s, allocation %d failing: %s (%s)", sc[k].name, n,
                   lpx_status_string(st), lpx_last_error());
            if (st != LPX_ENOMEM) break;
        }
        CHECKF(n > 0 && n < 2000, "%s: %d failing attempts", sc[k].name, n);
    }
    CHECK(!lpx_nf4_fallback_enabled());
    lpx_tensor *t[] = {oom_x, oom_w, oom_a, oom_b, oom_g, oom_dense};
    for (int i = 0; i < 6; i++) lpx_tensor_release(t[i]);
}

static void test_no_leaks(void)
{
    CHECKF(lpx_kind_live_tensors(lpx_nf4_kind()) == 0, "%lld nf4 tensors still alive",
           (long long)lpx_kind_live_tensors(lpx_nf4_kind()));
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
    RUN(test_linear);
    RUN(test_qlora);
    RUN(test_dropout_op);
    RUN(test_handlers_views);
    RUN(test_handlers_copy);
    RUN(test_fallback);
    RUN(test_hooks);
    RUN(test_unflatten);
    RUN(test_bad_configs);
    RUN(test_out_of_memory);
    RUN(test_no_leaks);
    return CHECK_DONE();
}
