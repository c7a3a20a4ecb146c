/* Shared by the nf4 test programs (tests/test_nf4_*.c): the
 * helpers and fixtures their cases use. Static inline: each program
 * compiles only what it calls. */
#ifndef LPX_TESTS_NF4_UTIL_H
#define LPX_TESTS_NF4_UTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include "check.h"
#include "tensor_util.h"
#include "core/numerics/nf4.h"

/* backends/cpu/nf4.c test hook: 0 forces the portable scalar decode */
extern int lpx__nf4_simd;

/* ---- the reference (independent of the production code path) ----------- */

__attribute__((unused)) static const float REF_CB[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
    0.7229568362236023f, 1.0f};

/* argmin over |v - code| in f32, first minimum (= lower index) wins */
static inline int ref_nearest(float v)
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
static inline ref_q ref_quantize(const float *x, int64_t n, int64_t B, int64_t S)
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

static inline float ref_value(const ref_q *r, int64_t B, int64_t S, int64_t i)
{
    int64_t b = i / B;
    int code = i % 2 ? r->codes[i / 2] & 15 : r->codes[i / 2] >> 4;
    float scale = (float)r->qs[b] / r->f[b / S] + r->mean;
    return REF_CB[code] * scale;
}

static inline void ref_free(ref_q *r)
{
    free(r->codes);
    free(r->qs);
    free(r->f);
}

/* ---- helpers --------------------------------------------------------------- */

static inline lpx_tensor *from_floats(const float *v, int ndim, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, ndim, shape, lpx_cpu(), &t));
    if (t) memcpy(lpx_tensor_data(t), v, (size_t)lpx_tensor_numel(t) * sizeof(float));
    return t;
}

/* Contiguous f32 copy of a dense tensor's values (caller frees). */
static inline float *values_f32(lpx_tensor *t)
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

static inline lpx_nf4_config cfg(int64_t block, int64_t sblock)
{
    lpx_nf4_config c = lpx_nf4_config_default();
    c.block = block;
    c.scaler_block = sblock;
    return c;
}

/* Payload of w equals the reference, bit for bit. Returns mismatches. */
static inline int64_t compare_payload(lpx_tensor *w, const ref_q *r)
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
static inline void check_exact(lpx_tensor *x, int64_t B, int64_t S)
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

static inline double rel_err(const float *a, const double *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline void roundtrip_error(void)
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

/* ---- linear ------------------------------------------------------------------ */

/* y[m, n] = sum_k x[m, k] * w[n, k] + b[n], doubles */
static inline double *ref_linear(const float *x, const float *w, const float *b, int64_t M, int64_t N, int64_t K)
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

static inline void check_linear_case(int64_t M, int64_t N, int64_t K, lpx_dtype xdt, bool with_bias)
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

/* ---- handlers ---------------------------------------------------------------- */

static inline bool same_values(lpx_tensor *a, lpx_tensor *b)
{
    if (lpx_tensor_numel(a) != lpx_tensor_numel(b)) return false;
    float *av = values_f32(a), *bv = values_f32(b);
    bool same = memcmp(av, bv, (size_t)lpx_tensor_numel(a) * sizeof(float)) == 0;
    free(av);
    free(bv);
    return same;
}

/* dequantized nf4 (f32) */
static inline lpx_tensor *deq(lpx_tensor *w)
{
    lpx_tensor *d = NULL;
    CHECK_OK(lpx_cast(w, LPX_F32, false, &d));
    return d;
}

/* ---- hooks --------------------------------------------------------------------- */

/* Concatenates 1-D dense tensors (any byte dtype) in order. */
static inline lpx_tensor *concat(lpx_tensor *const *ts, int n)
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

static inline bool same_payload(lpx_tensor *a, lpx_tensor *b)
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


/* Every nf4 tensor of the program is gone (the last case of each nf4 test
 * program). */
static inline void test_no_leaks(void)
{
    CHECKF(lpx_kind_live_tensors(lpx_nf4_kind()) == 0, "%lld nf4 tensors still alive",
           (long long)lpx_kind_live_tensors(lpx_nf4_kind()));
}

#endif
