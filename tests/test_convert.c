/* Conversions: the scalar numerics (core/numerics) and lpx_convert, checked
 * against references written here from the format definitions alone
 * (double arithmetic on the bit fields, brute-force nearest-code search),
 * never against the production code.
 *
 * NaN outputs: the tests accept any NaN code of the right sign in the
 * exhaustive comparisons, and check the documented canonical NaNs
 * (e4m3fn 0x7F, e5m2 0x7E, f16 0x7E00, bf16 0x7FC0, | sign) separately. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "fp8_ref.h"
#include "core/numerics/float8.h"
#include "core/numerics/half.h"
#include "core/numerics/integer.h"

/* ------------------------------------------------------------------ */
/* reference decoders: value of a code from its fields                 */

static double ref_f16(unsigned h)
{
    unsigned e = (h >> 10) & 31, m = h & 1023;
    if (e == 31)
        return ref_signed(h & 0x8000, m ? NAN : INFINITY);
    return ref_signed(h & 0x8000, e ? ldexp(1024 + m, (int)e - 15 - 10) : ldexp(m, -14 - 10));
}

static double ref_bf16(unsigned b)
{
    unsigned e = (b >> 7) & 255, m = b & 127;
    if (e == 255)
        return ref_signed(b & 0x8000, m ? NAN : INFINITY);
    return ref_signed(b & 0x8000, e ? ldexp(128 + m, (int)e - 127 - 7) : ldexp(m, -126 - 7));
}

/* same value, NaN-ness and sign (so +0 != -0) */
static int same_value(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b) && !signbit(a) == !signbit(b);
    return a == b && !signbit(a) == !signbit(b);
}

/* ------------------------------------------------------------------ */
/* fp8 decode: all 256 codes                                           */

static void check_fp8_decode(const char *nm, lpx_dtype dt, double (*ref)(unsigned),
                             float (*dec)(uint8_t))
{
    uint8_t codes[256];
    float out[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    CHECK_OK(lpx_convert(out, LPX_F32, codes, dt, 256, 0));
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        double want = ref((unsigned)c);
        if (!same_value(dec((uint8_t)c), want) || !same_value(out[c], want)) {
            if (bad++ < 5)
                CHECKF(0, "%s code 0x%02x: scalar %.9g convert %.9g want %.9g", nm, c,
                       (double)dec((uint8_t)c), (double)out[c], want);
        }
    }
    CHECK(bad == 0);
}

static void test_fp8_decode_all_codes(void)
{
    check_fp8_decode("e4m3fn", LPX_F8E4M3FN, ref_e4m3fn, lpx_f8e4m3fn_to_f32);
    check_fp8_decode("e5m2", LPX_F8E5M2, ref_e5m2, lpx_f8e5m2_to_f32);
    /* spot values straight from the spec */
    CHECK(lpx_f8e4m3fn_to_f32(0x7E) == 448.0f);
    CHECK(lpx_f8e4m3fn_to_f32(0x08) == 0x1p-6f);
    CHECK(lpx_f8e4m3fn_to_f32(0x01) == 0x1p-9f);
    CHECK(isnan(lpx_f8e4m3fn_to_f32(0x7F)) && isnan(lpx_f8e4m3fn_to_f32(0xFF)));
    CHECK(signbit(lpx_f8e4m3fn_to_f32(0x80)) && lpx_f8e4m3fn_to_f32(0x80) == 0.0f);
    CHECK(lpx_f8e5m2_to_f32(0x7B) == 57344.0f);
    CHECK(lpx_f8e5m2_to_f32(0x04) == 0x1p-14f);
    CHECK(lpx_f8e5m2_to_f32(0x01) == 0x1p-16f);
    CHECK(lpx_f8e5m2_to_f32(0x7C) == INFINITY && lpx_f8e5m2_to_f32(0xFC) == -INFINITY);
    CHECK(isnan(lpx_f8e5m2_to_f32(0x7D)) && isnan(lpx_f8e5m2_to_f32(0x7E)) &&
          isnan(lpx_f8e5m2_to_f32(0x7F)));
    CHECK(signbit(lpx_f8e5m2_to_f32(0xFE)));
}

/* ------------------------------------------------------------------ */
/* f16 / bf16 decode: all 65536 codes                                  */

static void check_half_decode(const char *nm, lpx_dtype dt, double (*ref)(unsigned),
                              float (*dec)(uint16_t))
{
    static uint16_t codes[65536];
    static float out[65536];
    for (unsigned h = 0; h < 65536; h++)
        codes[h] = (uint16_t)h;
    CHECK_OK(lpx_convert(out, LPX_F32, codes, dt, 65536, 0));
    int bad = 0;
    for (unsigned h = 0; h < 65536; h++) {
        double want = ref(h);
        if (!same_value(dec((uint16_t)h), want) || !same_value(out[h], want)) {
            if (bad++ < 5)
                CHECKF(0, "%s 0x%04x: scalar %.9g convert %.9g want %.9g", nm, h,
                       (double)dec((uint16_t)h), (double)out[h], want);
        }
    }
    CHECK(bad == 0);
}

static void test_half_decode_all_codes(void)
{
    check_half_decode("f16", LPX_F16, ref_f16, lpx_f16_to_f32);
    check_half_decode("bf16", LPX_BF16, ref_bf16, lpx_bf16_to_f32);
    CHECK(lpx_f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(lpx_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(lpx_bf16_to_f32(0x7F7F) == 0x1.fep127f);
}

/* ------------------------------------------------------------------ */
/* fp8 encode reference: brute-force nearest code                      */

typedef struct f8fmt {
    const char *name;
    lpx_dtype dtype;
    double (*dec)(unsigned);
    unsigned max_code;  /* largest finite magnitude code */
    double over;        /* value of the code after max_code on the unbounded grid */
    int has_inf;
    unsigned inf_code, canon_nan;
    uint8_t (*enc)(float, int);
} f8fmt;

static const f8fmt E4M3 = {"e4m3fn", LPX_F8E4M3FN, ref_e4m3fn, 0x7E, 480.0, 0, 0, 0x7F,
                           lpx_f32_to_f8e4m3fn};
static const f8fmt E5M2 = {"e5m2", LPX_F8E5M2, ref_e5m2, 0x7B, 65536.0, 1, 0x7C, 0x7E,
                           lpx_f32_to_f8e5m2};

/* the shared brute-force encoder (tests/fp8_ref.h) on f's grid */
static int ref_f8_encode(const f8fmt *f, double x, int sat)
{
    ref_f8_grid g = {f->dec, f->max_code, f->over, f->has_inf, f->inf_code, f->canon_nan};
    return ref_f8_encode_grid(&g, x, sat);
}

static int f8_matches(const f8fmt *f, int want, double x, uint8_t got)
{
    if (want < 0)
        return isnan(f->dec(got)) && ((got & 0x80) != 0) == (signbit(x) != 0);
    return got == (unsigned)want;
}

/* every code of a 16-bit format, as f32, to both fp8 formats in both modes,
 * through the scalar encoder and through lpx_convert */
static void check_f8_from_16bit(const f8fmt *f, lpx_dtype src_dt, double (*src_ref)(unsigned))
{
    static uint16_t codes[65536];
    static uint8_t conv[2][65536];
    for (unsigned h = 0; h < 65536; h++)
        codes[h] = (uint16_t)h;
    CHECK_OK(lpx_convert(conv[0], f->dtype, codes, src_dt, 65536, 0));
    CHECK_OK(lpx_convert(conv[1], f->dtype, codes, src_dt, 65536, LPX_CONVERT_SATURATE));
    int bad = 0;
    for (unsigned h = 0; h < 65536; h++) {
        double x = src_ref(h);
        float xf = (float)x; /* exact: f16 and bf16 values are f32 values */
        for (int sat = 0; sat < 2; sat++) {
            int want = ref_f8_encode(f, x, sat);
            uint8_t got = f->enc(xf, sat);
            if (!f8_matches(f, want, x, got) || !f8_matches(f, want, x, conv[sat][h])) {
                if (bad++ < 8)
                    CHECKF(0, "%s <- %s 0x%04x (%.9g) sat=%d: scalar 0x%02x convert 0x%02x want %d",
                           f->name, lpx_dtype_name(src_dt), h, x, sat, got, conv[sat][h], want);
            }
        }
    }
    CHECK(bad == 0);
}

static void test_fp8_encode_exhaustive_bf16(void)
{
    check_f8_from_16bit(&E4M3, LPX_BF16, ref_bf16);
    check_f8_from_16bit(&E5M2, LPX_BF16, ref_bf16);
}

static void test_fp8_encode_exhaustive_f16(void)
{
    check_f8_from_16bit(&E4M3, LPX_F16, ref_f16);
    check_f8_from_16bit(&E5M2, LPX_F16, ref_f16);
}

/* every fp8 value and the f32 points around each midpoint between
 * neighbours (including max and the overflow boundary) */
static void test_fp8_encode_midpoints(void)
{
    const f8fmt *fs[2] = {&E4M3, &E5M2};
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        const f8fmt *f = fs[k];
        for (unsigned c = 0; c <= f->max_code; c++) {
            double v = f->dec(c), next = c < f->max_code ? f->dec(c + 1) : f->over;
            float mid = (float)((v + next) / 2); /* exact: few significant bits */
            float pts[6] = {(float)v, nextafterf((float)v, INFINITY), mid,
                            nextafterf(mid, 0.0f), nextafterf(mid, INFINITY),
                            nextafterf((float)next, 0.0f)};
            for (int p = 0; p < 6; p++) {
                for (int s = 0; s < 2; s++) {
                    float x = s ? -pts[p] : pts[p];
                    for (int sat = 0; sat < 2; sat++) {
                        int want = ref_f8_encode(f, x, sat);
                        uint8_t got = f->enc(x, sat);
                        if (!f8_matches(f, want, x, got) && bad++ < 8)
                            CHECKF(0, "%s(%.9g) sat=%d: got 0x%02x want %d", f->name, (double)x,
                                   sat, got, want);
                    }
                }
            }
        }
    }
    CHECK(bad == 0);
}

/* the rules spelled out in the spec, as literal bits */
static void test_fp8_encode_rules(void)
{
    /* e4m3fn: 464 is the tie between 448 (mantissa 110) and 480 -> 448 */
    CHECK(lpx_f32_to_f8e4m3fn(464.0f, 0) == 0x7E);
    CHECK(lpx_f32_to_f8e4m3fn(nextafterf(464.0f, 0.0f), 0) == 0x7E);
    CHECK(lpx_f32_to_f8e4m3fn(465.0f, 0) == 0x7F);
    CHECK(lpx_f32_to_f8e4m3fn(465.0f, 1) == 0x7E);
    CHECK(lpx_f32_to_f8e4m3fn(-465.0f, 0) == 0xFF);
    CHECK(lpx_f32_to_f8e4m3fn(-465.0f, 1) == 0xFE);
    CHECK(lpx_f32_to_f8e4m3fn(INFINITY, 0) == 0x7F);
    CHECK(lpx_f32_to_f8e4m3fn(-INFINITY, 0) == 0xFF);
    CHECK(lpx_f32_to_f8e4m3fn(INFINITY, 1) == 0x7E);
    CHECK(lpx_f32_to_f8e4m3fn(-INFINITY, 1) == 0xFE);
    CHECK(lpx_f32_to_f8e4m3fn(NAN, 0) == 0x7F && lpx_f32_to_f8e4m3fn(NAN, 1) == 0x7F);
    CHECK(lpx_f32_to_f8e4m3fn(-NAN, 0) == 0xFF && lpx_f32_to_f8e4m3fn(-NAN, 1) == 0xFF);
    /* subnormals: 2^-9 is the smallest; half of it is a tie -> 0 (even) */
    CHECK(lpx_f32_to_f8e4m3fn(0x1p-9f, 0) == 0x01);
    CHECK(lpx_f32_to_f8e4m3fn(0x1p-10f, 0) == 0x00);
    CHECK(lpx_f32_to_f8e4m3fn(nextafterf(0x1p-10f, 1.0f), 0) == 0x01);
    CHECK(lpx_f32_to_f8e4m3fn(-0x1p-10f, 0) == 0x80);
    CHECK(lpx_f32_to_f8e4m3fn(0x1.8p-9f, 0) == 0x02);  /* 1.5 ulp: tie -> 2 */
    CHECK(lpx_f32_to_f8e4m3fn(0x1p-149f, 0) == 0x00);  /* smallest f32 subnormal */
    CHECK(lpx_f32_to_f8e4m3fn(-0x1p-149f, 0) == 0x80);
    CHECK(lpx_f32_to_f8e4m3fn(0x1.ep-7f, 0) == 0x08);  /* rounds up into min normal */
    CHECK(lpx_f32_to_f8e4m3fn(0.0f, 0) == 0x00 && lpx_f32_to_f8e4m3fn(-0.0f, 0) == 0x80);
    /* e5m2 */
    CHECK(lpx_f32_to_f8e5m2(57344.0f, 0) == 0x7B);
    CHECK(lpx_f32_to_f8e5m2(61439.0f, 0) == 0x7B);
    CHECK(lpx_f32_to_f8e5m2(61440.0f, 0) == 0x7C);  /* tie: 65536 has even mantissa */
    CHECK(lpx_f32_to_f8e5m2(61440.0f, 1) == 0x7B);
    CHECK(lpx_f32_to_f8e5m2(1e30f, 0) == 0x7C && lpx_f32_to_f8e5m2(-1e30f, 0) == 0xFC);
    CHECK(lpx_f32_to_f8e5m2(INFINITY, 0) == 0x7C && lpx_f32_to_f8e5m2(-INFINITY, 0) == 0xFC);
    CHECK(lpx_f32_to_f8e5m2(INFINITY, 1) == 0x7B && lpx_f32_to_f8e5m2(-INFINITY, 1) == 0xFB);
    CHECK(lpx_f32_to_f8e5m2(NAN, 0) == 0x7E && lpx_f32_to_f8e5m2(-NAN, 1) == 0xFE);
    CHECK(lpx_f32_to_f8e5m2(0x1p-16f, 0) == 0x01 && lpx_f32_to_f8e5m2(0x1p-17f, 0) == 0x00);
    CHECK(lpx_f32_to_f8e5m2(-0x1p-17f, 0) == 0x80);
    CHECK(lpx_f32_to_f8e5m2(0x1.8p-16f, 0) == 0x02);
}

/* ------------------------------------------------------------------ */
/* f32 -> f16 / bf16 against a double reference                       */

typedef struct hfmt {
    const char *name;
    lpx_dtype dtype;
    int mant, emin;      /* mantissa bits, exponent of the smallest normal */
    double max, over;    /* largest finite; next grid point past it */
    double (*dec)(unsigned);
    uint16_t (*enc)(float, int);
    unsigned canon_nan;
} hfmt;

static const hfmt F16 = {"f16", LPX_F16, 10, -14, 65504.0, 65536.0, ref_f16, lpx_f32_to_f16,
                         0x7E00};
static const hfmt BF16 = {"bf16", LPX_BF16, 7, -126, 0x1.fep127, 0x1p128, ref_bf16,
                          lpx_f32_to_bf16, 0x7FC0};

/* |x| rounded to nearest even on the format's grid, exponent unbounded
 * above; then the overflow rule. Returns the expected value (double). */
static double ref_half_encode(const hfmt *f, double x, int sat)
{
    if (isnan(x))
        return x;
    double a = fabs(x), r;
    if (isinf(a)) {
        r = INFINITY;
    } else if (a == 0) {
        r = 0;
    } else {
        int e;
        frexp(a, &e); /* a in [2^(e-1), 2^e) */
        int ex = e - 1 < f->emin ? f->emin : e - 1;
        double ulp = ldexp(1.0, ex - f->mant);
        double q = a / ulp, fl = floor(q), frac = q - fl;
        if (frac > 0.5 || (frac == 0.5 && fmod(fl, 2.0) != 0))
            fl += 1;
        r = fl * ulp;
    }
    if (r > f->max)
        r = sat ? f->max : INFINITY;
    return signbit(x) ? -r : r;
}

static int check_half_point(const hfmt *f, float x, int *bad)
{
    for (int sat = 0; sat < 2; sat++) {
        double want = ref_half_encode(f, x, sat);
        uint16_t got = f->enc(x, sat);
        if (!same_value(f->dec(got), want)) {
            if ((*bad)++ < 8)
                CHECKF(0, "%s(%a) sat=%d: got 0x%04x (%.9g) want %.9g", f->name, (double)x, sat,
                       got, f->dec(got), want);
            return 0;
        }
    }
    return 1;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng32(void)
{
    /* xorshift64*: deterministic, good enough for test inputs */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void check_half_encode_sweep(const hfmt *f)
{
    int bad = 0;
    /* every finite value, the midpoint to its upper neighbour, and the
     * f32 neighbours of both (the last step goes to the overflow point) */
    for (unsigned h = 0; h < 0x8000; h++) {
        double v = f->dec(h);
        if (!isfinite(v))
            continue;
        double next = v == f->max ? f->over : f->dec(h + 1);
        float vf = (float)v, mid = (float)((v + next) / 2);
        CHECK((double)mid == (v + next) / 2); /* the midpoint is an f32 */
        float pts[6] = {vf, nextafterf(vf, INFINITY), nextafterf(vf, 0.0f), mid,
                        nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int p = 0; p < 6; p++) {
            check_half_point(f, pts[p], &bad);
            check_half_point(f, -pts[p], &bad);
        }
    }
    /* random f32 bit patterns (every exponent, NaN and inf included) */
    for (int i = 0; i < 200000; i++)
        check_half_point(f, f32_of_bits(rng32()), &bad);
    /* random values in and around the format's exponent range */
    for (int i = 0; i < 200000; i++) {
        int e = f->emin - f->mant - 3 + (int)(rng32() % (unsigned)(-2 * f->emin + f->mant + 8));
        if (e > 127)
            e = 127;
        if (e < -149)
            e = -149;
        float x = ldexpf(1.0f + (float)(rng32() & 0x7FFFFF) * 0x1p-23f, e);
        check_half_point(f, (rng32() & 1) ? -x : x, &bad);
    }
    CHECK(bad == 0);
    /* canonical NaN with sign */
    CHECK(f->enc(NAN, 0) == f->canon_nan && f->enc(-NAN, 1) == (f->canon_nan | 0x8000));
    CHECK(f->enc(f32_of_bits(0x7F800001u), 0) == f->canon_nan); /* signalling NaN too */
}

static void test_f16_encode_sweep(void) { check_half_encode_sweep(&F16); }
static void test_bf16_encode_sweep(void) { check_half_encode_sweep(&BF16); }

static void test_half_encode_rules(void)
{
    CHECK(lpx_f32_to_f16(65504.0f, 0) == 0x7BFF);
    CHECK(lpx_f32_to_f16(65519.0f, 0) == 0x7BFF);
    CHECK(lpx_f32_to_f16(65520.0f, 0) == 0x7C00); /* tie -> even = inf */
    CHECK(lpx_f32_to_f16(65520.0f, 1) == 0x7BFF);
    CHECK(lpx_f32_to_f16(-1e9f, 0) == 0xFC00 && lpx_f32_to_f16(-1e9f, 1) == 0xFBFF);
    CHECK(lpx_f32_to_f16(INFINITY, 0) == 0x7C00 && lpx_f32_to_f16(INFINITY, 1) == 0x7BFF);
    CHECK(lpx_f32_to_f16(0x1p-24f, 0) == 0x0001 && lpx_f32_to_f16(0x1p-25f, 0) == 0x0000);
    CHECK(lpx_f32_to_f16(-0x1p-25f, 0) == 0x8000);
    CHECK(lpx_f32_to_f16(0x1.000002p-25f, 0) == 0x0001);
    CHECK(lpx_f32_to_f16(-0.0f, 0) == 0x8000);
    CHECK(lpx_f32_to_bf16(FLT_MAX, 0) == 0x7F80); /* rounds past max -> inf */
    CHECK(lpx_f32_to_bf16(FLT_MAX, 1) == 0x7F7F);
    CHECK(lpx_f32_to_bf16(-INFINITY, 0) == 0xFF80 && lpx_f32_to_bf16(-INFINITY, 1) == 0xFF7F);
    CHECK(lpx_f32_to_bf16(1.00390625f, 0) == 0x3F80); /* 1 + 2^-8: tie -> even */
    CHECK(lpx_f32_to_bf16(1.01171875f, 0) == 0x3F82); /* 1 + 3*2^-8: tie -> even (up) */
    CHECK(lpx_f32_to_bf16(0x1p-149f, 0) == 0x0000);
    CHECK(lpx_f32_to_bf16(0x1.8p-133f, 0) == 0x0002);
}

/* ------------------------------------------------------------------ */
/* round trips: encode(decode(c)) == c for every non-NaN code          */

static void test_round_trips(void)
{
    int bad = 0;
    for (unsigned c = 0; c < 256; c++) {
        for (int sat = 0; sat < 2; sat++) {
            unsigned mag = c & 0x7F, sign = c & 0x80;
            if (mag != 0x7F) {
                bad += lpx_f32_to_f8e4m3fn(lpx_f8e4m3fn_to_f32((uint8_t)c), sat) != c;
            }
            if (mag <= 0x7B || (mag == 0x7C && !sat))
                bad += lpx_f32_to_f8e5m2(lpx_f8e5m2_to_f32((uint8_t)c), sat) != c;
            if (mag == 0x7C && sat) /* inf saturates */
                bad += lpx_f32_to_f8e5m2(lpx_f8e5m2_to_f32((uint8_t)c), sat) != (0x7B | sign);
        }
    }
    for (unsigned h = 0; h < 65536; h++) {
        unsigned mag = h & 0x7FFF;
        for (int sat = 0; sat < 2; sat++) {
            if (mag < 0x7C00 || (mag == 0x7C00 && !sat))
                bad += lpx_f32_to_f16(lpx_f16_to_f32((uint16_t)h), sat) != h;
            if (mag < 0x7F80 || (mag == 0x7F80 && !sat))
                bad += lpx_f32_to_bf16(lpx_bf16_to_f32((uint16_t)h), sat) != h;
        }
    }
    CHECK(bad == 0);
    /* integers: every value of the small types survives f32 */
    for (int v = 0; v < 256; v++)
        CHECK(lpx_f32_to_u8((float)v) == v);
    for (int v = -128; v < 128; v++)
        CHECK(lpx_f32_to_i8((float)v) == v);
}

/* ------------------------------------------------------------------ */
/* integer encodes                                                     */

/* round half even in double, NaN -> 0, clamp to [lo, hi] */
static double ref_int(double x, double lo, double hi)
{
    if (isnan(x))
        return 0;
    if (x <= lo)
        return lo;
    if (x >= hi)
        return hi;
    double fl = floor(x), frac = x - fl;
    if (frac > 0.5 || (frac == 0.5 && fmod(fl, 2.0) != 0))
        fl += 1;
    return fl < lo ? lo : fl > hi ? hi : fl;
}

static void check_int_point(float x, int *bad)
{
    double xd = x;
    int ok = lpx_f32_to_u8(x) == ref_int(xd, 0, 255) && lpx_f32_to_i8(x) == ref_int(xd, -128, 127) &&
             lpx_f32_to_i32(x) == ref_int(xd, -2147483648.0, 2147483647.0) &&
             lpx_f32_to_bool(x) == (isnan(xd) || xd != 0);
    /* i64: the double bounds are +-2^63; ref_int gives 2^63 for the top,
     * which stands for INT64_MAX */
    double r64 = ref_int(xd, -0x1p63, 0x1p63);
    int64_t got64 = lpx_f32_to_i64(x);
    ok = ok && (r64 == 0x1p63 ? got64 == INT64_MAX : (double)got64 == r64);
    if (!ok && (*bad)++ < 8)
        CHECKF(0, "int encodes of %a: u8 %d i8 %d i32 %d i64 %lld bool %d", xd, lpx_f32_to_u8(x),
               lpx_f32_to_i8(x), lpx_f32_to_i32(x), (long long)got64, lpx_f32_to_bool(x));
}

static void test_int_encode(void)
{
    int bad = 0;
    for (unsigned h = 0; h < 65536; h++) {
        check_int_point((float)ref_bf16(h), &bad);
        check_int_point((float)ref_f16(h), &bad);
    }
    for (int k = -600; k <= 600; k++) { /* halves and their neighbours */
        float x = (float)k * 0.5f;
        check_int_point(x, &bad);
        check_int_point(nextafterf(x, INFINITY), &bad);
        check_int_point(nextafterf(x, -INFINITY), &bad);
    }
    for (int e = 20; e <= 66; e++) { /* around powers of two, incl. 2^31, 2^63 */
        float p = ldexpf(1.0f, e);
        float pts[6] = {p, nextafterf(p, 0.0f), nextafterf(p, INFINITY), -p,
                        nextafterf(-p, 0.0f), nextafterf(-p, -INFINITY)};
        for (int i = 0; i < 6; i++)
            check_int_point(pts[i], &bad);
    }
    for (int i = 0; i < 200000; i++)
        check_int_point(f32_of_bits(rng32()), &bad);
    CHECK(bad == 0);
    /* spelled out */
    CHECK(lpx_f32_to_i32(2.5f) == 2 && lpx_f32_to_i32(3.5f) == 4 && lpx_f32_to_i32(-2.5f) == -2);
    CHECK(lpx_f32_to_i32(-0.5f) == 0 && lpx_f32_to_i32(0.5000001f) == 1);
    CHECK(lpx_f32_to_u8(255.5f) == 255 && lpx_f32_to_u8(254.5f) == 254 && lpx_f32_to_u8(-3.0f) == 0);
    CHECK(lpx_f32_to_i8(-128.5f) == -128 && lpx_f32_to_i8(127.5f) == 127);
    CHECK(lpx_f32_to_i32(2147483520.0f) == 2147483520 && lpx_f32_to_i32(0x1p31f) == INT32_MAX);
    CHECK(lpx_f32_to_i32(-0x1p31f) == INT32_MIN && lpx_f32_to_i32(INFINITY) == INT32_MAX);
    CHECK(lpx_f32_to_i64(0x1p63f) == INT64_MAX && lpx_f32_to_i64(-0x1p63f) == INT64_MIN);
    CHECK(lpx_f32_to_i64(0x1.fffffep62f) == 0x7FFFFF8000000000ll);
    CHECK(lpx_f32_to_i64(-INFINITY) == INT64_MIN && lpx_f32_to_i64(NAN) == 0);
    CHECK(lpx_f32_to_u8(NAN) == 0 && lpx_f32_to_i8(NAN) == 0 && lpx_f32_to_i32(NAN) == 0);
    CHECK(lpx_f32_to_bool(NAN) == 1 && lpx_f32_to_bool(-0.0f) == 0 && lpx_f32_to_bool(0x1p-149f) == 1);
}

/* ------------------------------------------------------------------ */
/* lpx_convert: every pair vs the scalar path                          */

#define NDT LPX_DTYPE_BUILTIN_COUNT
static const size_t esize[NDT] = {4, 2, 2, 1, 1, 1, 1, 4, 8, 1};

/* scalar reference path: decode element i of dtype d to f32 */
static float sc_load(lpx_dtype d, const void *p, size_t i)
{
    switch (d) {
    case LPX_F32: return ((const float *)p)[i];
    case LPX_F16: return lpx_f16_to_f32(((const uint16_t *)p)[i]);
    case LPX_BF16: return lpx_bf16_to_f32(((const uint16_t *)p)[i]);
    case LPX_F8E4M3FN: return lpx_f8e4m3fn_to_f32(((const uint8_t *)p)[i]);
    case LPX_F8E5M2: return lpx_f8e5m2_to_f32(((const uint8_t *)p)[i]);
    case LPX_U8: return (float)((const uint8_t *)p)[i];
    case LPX_I8: return (float)((const int8_t *)p)[i];
    case LPX_I32: return (float)((const int32_t *)p)[i];
    case LPX_I64: return (float)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    }
}

static void sc_store(lpx_dtype d, void *p, size_t i, float v, int sat)
{
    switch (d) {
    case LPX_F32:
        ((float *)p)[i] = sat && isinf(v) ? copysignf(FLT_MAX, v) : v;
        break;
    case LPX_F16: ((uint16_t *)p)[i] = lpx_f32_to_f16(v, sat); break;
    case LPX_BF16: ((uint16_t *)p)[i] = lpx_f32_to_bf16(v, sat); break;
    case LPX_F8E4M3FN: ((uint8_t *)p)[i] = lpx_f32_to_f8e4m3fn(v, sat); break;
    case LPX_F8E5M2: ((uint8_t *)p)[i] = lpx_f32_to_f8e5m2(v, sat); break;
    case LPX_U8: ((uint8_t *)p)[i] = lpx_f32_to_u8(v); break;
    case LPX_I8: ((int8_t *)p)[i] = lpx_f32_to_i8(v); break;
    case LPX_I32: ((int32_t *)p)[i] = lpx_f32_to_i32(v); break;
    case LPX_I64: ((int64_t *)p)[i] = lpx_f32_to_i64(v); break;
    default: ((uint8_t *)p)[i] = lpx_f32_to_bool(v); break;
    }
}

static int is_int(lpx_dtype d)
{
    return d == LPX_U8 || d == LPX_I8 || d == LPX_I32 || d == LPX_I64 || d == LPX_BOOL;
}

/* integer -> integer is defined as exact, then clamped (bool: != 0) */
static void sc_int_convert(lpx_dtype d, void *p, lpx_dtype s, const void *q, size_t i)
{
    int64_t v = s == LPX_U8 ? ((const uint8_t *)q)[i]
              : s == LPX_I8 ? ((const int8_t *)q)[i]
              : s == LPX_I32 ? ((const int32_t *)q)[i]
              : s == LPX_I64 ? ((const int64_t *)q)[i]
                             : ((const uint8_t *)q)[i] != 0;
#define CLAMP_(lo, hi) (v < (lo) ? (lo) : v > (hi) ? (hi) : v)
    switch (d) {
    case LPX_U8: ((uint8_t *)p)[i] = (uint8_t)CLAMP_(0, 255); break;
    case LPX_I8: ((int8_t *)p)[i] = (int8_t)CLAMP_(-128, 127); break;
    case LPX_I32: ((int32_t *)p)[i] = (int32_t)CLAMP_(INT32_MIN, INT32_MAX); break;
    case LPX_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = v != 0; break;
    }
#undef CLAMP_
}

static void test_convert_all_pairs(void)
{
    /* values every path must agree on (integer sources beyond 2^24, like a
     * clamped INT32_MAX, round the same through RNE or round-to-odd here;
     * test_convert_wide_ints covers where they differ) */
    static const float vals[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 1.5f, 2.5f, -2.5f, 3.0f, 100.0f,
                                 127.5f, 128.0f, 255.0f, 255.5f, 256.0f, 300.0f, -129.0f, 448.0f,
                                 464.0f, 465.0f, 57344.0f, 61440.0f, 65504.0f, 65520.0f, 1e10f,
                                 -1e10f, 16777216.0f, 0x1p40f, INFINITY, -INFINITY, NAN, -NAN,
                                 1e-5f, 0x1p-9f, 0x1p-16f, 3e-3f, -0.3f, 1e-40f, FLT_MAX, 7.0f};
    enum { N = 3001, NV = sizeof vals / sizeof vals[0] };
    static float x[N];
    static unsigned char src[N * 8], want[N * 8], got[N * 8 + 16];
    for (size_t i = 0; i < N; i++) {
        if (i < NV)
            x[i] = vals[i];
        else if (i % 3 == 0)
            x[i] = vals[rng32() % NV];
        else /* moderate random values, both signs */
            x[i] = ldexpf((float)(rng32() & 0xFFFFFF) * 0x1p-24f, (int)(rng32() % 40) - 20) *
                   ((rng32() & 1) ? -1.0f : 1.0f);
    }
    int bad = 0;
    for (lpx_dtype s = 0; s < NDT; s++) {
        for (size_t i = 0; i < N; i++)
            sc_store(s, src, i, x[i], 0);
        for (lpx_dtype d = 0; d < NDT; d++) {
            for (int sat = 0; sat < 2; sat++) {
                memset(got, 0xA5, sizeof got);
                if (s == d)
                    memcpy(want, src, N * esize[s]);
                else if (is_int(s) && is_int(d))
                    for (size_t i = 0; i < N; i++)
                        sc_int_convert(d, want, s, src, i);
                else /* decode + encode; exact for these values (see above) */
                    for (size_t i = 0; i < N; i++)
                        sc_store(d, want, i, sc_load(s, src, i), sat);
                CHECK_OK(lpx_convert(got, d, src, s, N, sat ? LPX_CONVERT_SATURATE : 0));
                if (memcmp(got, want, N * esize[d]) != 0 && bad++ < 8)
                    CHECKF(0, "lpx_convert %s <- %s sat=%d differs from the scalar path",
                           lpx_dtype_name(d), lpx_dtype_name(s), sat);
                CHECK(got[N * esize[d]] == 0xA5); /* nothing written past the end */
            }
        }
    }
    CHECK(bad == 0);
}

/* ------------------------------------------------------------------ */
/* integers beyond 2^24: exact int paths and single rounding           */

/* x rounded to `bits` significant bits, half to even, by integer math */
static double ref_round_int(int64_t x, int bits)
{
    uint64_t m = x < 0 ? 0u - (uint64_t)x : (uint64_t)x;
    int top = 63;
    while (top > 0 && !(m >> top))
        top--;
    int sh = top + 1 - bits;
    if (sh > 0) {
        uint64_t q = m >> sh, rem = m & ((1ull << sh) - 1), half = 1ull << (sh - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        double r = ldexp((double)q, sh);
        return x < 0 ? -r : r;
    }
    return (double)x;
}

static void test_convert_wide_ints(void)
{
    /* values next to the midpoints of the bf16 and f32 grids, where a
     * double rounding through f32 would go wrong */
    enum { M = 4096 };
    static int64_t v64[M];
    static int32_t v32[M];
    static uint16_t b[M];
    static float f[M];
    int n = 0;
    for (int e = 24; e <= 62 && n + 12 <= M; e++) {
        for (int g = 0; g < 2; g++) {
            int ulp_bits = g ? e - 7 : e - 23; /* bf16, then f32 grid */
            if (ulp_bits < 1)
                continue;
            int64_t base = (int64_t)1 << e, half = (int64_t)1 << (ulp_bits - 1);
            int64_t mids[2] = {base + half, base + 3 * half};
            for (int k = 0; k < 2; k++)
                for (int d = -1; d <= 1; d++) {
                    v64[n++] = mids[k] + d;
                    v64[n++] = -(mids[k] + d);
                }
        }
    }
    int bad = 0;
    CHECK_OK(lpx_convert(b, LPX_BF16, v64, LPX_I64, (size_t)n, 0));
    CHECK_OK(lpx_convert(f, LPX_F32, v64, LPX_I64, (size_t)n, 0));
    for (int i = 0; i < n; i++) {
        if (ref_bf16(b[i]) != ref_round_int(v64[i], 8) && bad++ < 8)
            CHECKF(0, "bf16 <- i64 %lld: got %.17g want %.17g", (long long)v64[i], ref_bf16(b[i]),
                   ref_round_int(v64[i], 8));
        if ((double)f[i] != ref_round_int(v64[i], 24) && bad++ < 8)
            CHECKF(0, "f32 <- i64 %lld: got %.17g want %.17g", (long long)v64[i], (double)f[i],
                   ref_round_int(v64[i], 24));
    }
    /* the same through i32 */
    int n32 = 0;
    for (int i = 0; i < n; i++)
        if (v64[i] >= INT32_MIN && v64[i] <= INT32_MAX)
            v32[n32++] = (int32_t)v64[i];
    CHECK(n32 > 20);
    CHECK_OK(lpx_convert(b, LPX_BF16, v32, LPX_I32, (size_t)n32, 0));
    for (int i = 0; i < n32; i++)
        if (ref_bf16(b[i]) != ref_round_int(v32[i], 8) && bad++ < 8)
            CHECKF(0, "bf16 <- i32 %d: got %.17g", v32[i], ref_bf16(b[i]));
    CHECK(bad == 0);

    /* integer -> integer is exact, then clamped */
    int32_t a32[3] = {16777217, -16777217, INT32_MAX};
    int64_t a64[3];
    CHECK_OK(lpx_convert(a64, LPX_I64, a32, LPX_I32, 3, 0));
    CHECK(a64[0] == 16777217 && a64[1] == -16777217 && a64[2] == INT32_MAX);
    int64_t w[6] = {((int64_t)1 << 53) + 1, -((int64_t)1 << 40), 300, -5, 0, 2};
    int32_t o32[6];
    int8_t o8[6];
    uint8_t ou8[6], ob[6];
    CHECK_OK(lpx_convert(o32, LPX_I32, w, LPX_I64, 6, 0));
    CHECK(o32[0] == INT32_MAX && o32[1] == INT32_MIN && o32[2] == 300 && o32[3] == -5);
    CHECK_OK(lpx_convert(o8, LPX_I8, w, LPX_I64, 6, 0));
    CHECK(o8[0] == 127 && o8[1] == -128 && o8[2] == 127 && o8[3] == -5 && o8[4] == 0);
    CHECK_OK(lpx_convert(ou8, LPX_U8, w, LPX_I64, 6, 0));
    CHECK(ou8[0] == 255 && ou8[1] == 0 && ou8[2] == 255 && ou8[3] == 0 && ou8[5] == 2);
    CHECK_OK(lpx_convert(ob, LPX_BOOL, w, LPX_I64, 6, 0));
    CHECK(ob[0] == 1 && ob[1] == 1 && ob[4] == 0 && ob[5] == 1);
    uint8_t bytes[3] = {0, 1, 2}; /* a bool byte other than 0/1 still means true */
    int32_t bi[3];
    CHECK_OK(lpx_convert(bi, LPX_I32, bytes, LPX_BOOL, 3, 0));
    CHECK(bi[0] == 0 && bi[1] == 1 && bi[2] == 1);
    uint8_t u200 = 200;
    int8_t i8o;
    CHECK_OK(lpx_convert(&i8o, LPX_I8, &u200, LPX_U8, 1, 0));
    CHECK(i8o == 127);
}

/* ------------------------------------------------------------------ */
/* the saturate flag through lpx_convert                               */

static void test_convert_saturate(void)
{
    const float in[6] = {1e6f, -1e6f, INFINITY, -INFINITY, NAN, 500.0f};
    uint8_t q[6];
    CHECK_OK(lpx_convert(q, LPX_F8E4M3FN, in, LPX_F32, 6, LPX_CONVERT_SATURATE));
    CHECK(q[0] == 0x7E && q[1] == 0xFE && q[2] == 0x7E && q[3] == 0xFE && q[4] == 0x7F && q[5] == 0x7E);
    CHECK_OK(lpx_convert(q, LPX_F8E4M3FN, in, LPX_F32, 6, 0));
    CHECK(q[0] == 0x7F && q[1] == 0xFF && q[2] == 0x7F && q[3] == 0xFF && q[4] == 0x7F && q[5] == 0x7F);
    CHECK_OK(lpx_convert(q, LPX_F8E5M2, in, LPX_F32, 6, 0));
    CHECK(q[0] == 0x7C && q[1] == 0xFC && q[2] == 0x7C && q[3] == 0xFC && q[4] == 0x7E && q[5] == 0x60);
    CHECK_OK(lpx_convert(q, LPX_F8E5M2, in, LPX_F32, 6, LPX_CONVERT_SATURATE));
    CHECK(q[0] == 0x7B && q[1] == 0xFB && q[2] == 0x7B && q[3] == 0xFB && q[4] == 0x7E);
    uint16_t h[6];
    CHECK_OK(lpx_convert(h, LPX_F16, in, LPX_F32, 6, 0));
    CHECK(h[0] == 0x7C00 && h[1] == 0xFC00 && h[4] == 0x7E00);
    CHECK_OK(lpx_convert(h, LPX_F16, in, LPX_F32, 6, LPX_CONVERT_SATURATE));
    CHECK(h[0] == 0x7BFF && h[1] == 0xFBFF && h[2] == 0x7BFF && h[3] == 0xFBFF && h[4] == 0x7E00);
    CHECK_OK(lpx_convert(h, LPX_BF16, in, LPX_F32, 6, LPX_CONVERT_SATURATE));
    CHECK(h[2] == 0x7F7F && h[3] == 0xFF7F && h[4] == 0x7FC0);
    /* a narrow float into a narrower one: f16 65504 -> e4m3fn */
    uint16_t big = 0x7BFF, hinf = 0xFC00;
    CHECK_OK(lpx_convert(q, LPX_F8E4M3FN, &big, LPX_F16, 1, 0));
    CHECK(q[0] == 0x7F);
    CHECK_OK(lpx_convert(q, LPX_F8E4M3FN, &big, LPX_F16, 1, LPX_CONVERT_SATURATE));
    CHECK(q[0] == 0x7E);
    CHECK_OK(lpx_convert(q, LPX_F8E5M2, &hinf, LPX_F16, 1, LPX_CONVERT_SATURATE));
    CHECK(q[0] == 0xFB);
    /* into f32, saturating clamps infinities; same dtype is a bit copy */
    float f[2];
    CHECK_OK(lpx_convert(f, LPX_F32, &hinf, LPX_F16, 1, LPX_CONVERT_SATURATE));
    CHECK(f[0] == -FLT_MAX);
    CHECK_OK(lpx_convert(f, LPX_F32, &hinf, LPX_F16, 1, 0));
    CHECK(f[0] == -INFINITY);
    CHECK_OK(lpx_convert(f, LPX_F32, in + 2, LPX_F32, 2, LPX_CONVERT_SATURATE));
    CHECK(f[0] == INFINITY && f[1] == -INFINITY);
}

/* ------------------------------------------------------------------ */
/* argument errors                                                     */

static void test_convert_errors(void)
{
    float a[4] = {1, 2, 3, 4};
    uint16_t h[4];
    CHECK_ERR(lpx_convert(NULL, LPX_F16, a, LPX_F32, 4, 0), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "lpx_convert") && strstr(lpx_last_error(), "dst"));
    CHECK_ERR(lpx_convert(h, LPX_F16, NULL, LPX_F32, 4, 0), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "lpx_convert") && strstr(lpx_last_error(), "src"));
    CHECK_OK(lpx_convert(NULL, LPX_F16, NULL, LPX_F32, 0, 0)); /* n = 0: nothing to touch */
    CHECK_ERR(lpx_convert(h, 99, a, LPX_F32, 4, 0), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "lpx_convert") && strstr(lpx_last_error(), "dst_dtype"));
    CHECK_ERR(lpx_convert(h, LPX_F16, a, -1, 4, 0), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "src_dtype"));
    CHECK_ERR(lpx_convert(h, LPX_DTYPE_MAX, a, LPX_F32, 0, 0), LPX_EDTYPE);
    CHECK_ERR(lpx_convert(h, LPX_F16, a, LPX_F32, 4, 2u), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "lpx_convert") && strstr(lpx_last_error(), "flags"));
    CHECK_ERR(lpx_convert(h, LPX_F16, a, LPX_F32, 4, LPX_CONVERT_SATURATE | 0x80000000u), LPX_EINVAL);
    /* overlapping buffers are refused; dst == src with one dtype is a no-op */
    CHECK_ERR(lpx_convert(a, LPX_F16, a, LPX_F32, 4, 0), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "overlap"));
    CHECK_ERR(lpx_convert((char *)a + 2, LPX_F32, a, LPX_F32, 2, 0), LPX_EINVAL);
    CHECK_OK(lpx_convert(a, LPX_F32, a, LPX_F32, 4, 0));
    CHECK(a[0] == 1 && a[3] == 4);
    CHECK_ERR(lpx_convert(h, LPX_F16, a, LPX_F32, SIZE_MAX / 2, 0), LPX_EINVAL);
}

int main(void)
{
    RUN(test_fp8_decode_all_codes);
    RUN(test_half_decode_all_codes);
    RUN(test_fp8_encode_exhaustive_bf16);
    RUN(test_fp8_encode_exhaustive_f16);
    RUN(test_fp8_encode_midpoints);
    RUN(test_fp8_encode_rules);
    RUN(test_f16_encode_sweep);
    RUN(test_bf16_encode_sweep);
    RUN(test_half_encode_rules);
    RUN(test_round_trips);
    RUN(test_int_encode);
    RUN(test_convert_all_pairs);
    RUN(test_convert_wide_ints);
    RUN(test_convert_saturate);
    RUN(test_convert_errors);
    return CHECK_DONE();
}
