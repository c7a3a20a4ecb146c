/* The device codec of lpx-mx-cuda.so (plugins/mx/cuda/mx_codec_hd.h,
 * compiled here as plain C: LPX_HD is empty off nvcc) against the host
 * codec of lpx-mx.so (plugins/mx/mx_codec.h) and the formulas of its
 * mx_tensor.c, bit for bit: every e8m0 scale code, every e2m1 and e4m3
 * element code under every scale, e2m1 encoding and the block scale over a
 * sweep of f32 bit patterns, the power-of-two scaling against ldexpf. So
 * the GPU kernels, which run these functions, decode and encode like the
 * CPU kernels. Needs no plugin: lpx_convert is the core's e4m3 codec. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "check.h"
#include "plugins/mx/mx_codec.h"
#include "plugins/mx/cuda/mx_codec_hd.h"

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* the CPU's e4m3 decode table (mx_tensor.c fills it through lpx_convert) */
static float e4m3[256];

static void test_e4m3_table(void)
{
    uint8_t codes[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    CHECK_OK(lpx_convert(e4m3, LPX_F32, codes, LPX_F8E4M3FN, 256, 0));
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += bits_of(lpx_f8e4m3fn_to_f32((uint8_t)i)) != bits_of(e4m3[i]);
    CHECKF(!bad, "%d e4m3 codes decode differently", bad);
}

static void test_e8m0_all_codes(void)
{
    int bad = 0;
    for (int c = 0; c < 256; c++)
        if (bits_of(mxd_e8m0_to_f32((uint8_t)c)) != bits_of(mx_e8m0_to_f32((uint8_t)c))) {
            if (!bad++) printf("  e8m0 code %d: hd 0x%08x, host 0x%08x\n", c, bits_of(mxd_e8m0_to_f32((uint8_t)c)),
                               bits_of(mx_e8m0_to_f32((uint8_t)c)));
        }
    CHECKF(!bad, "%d e8m0 codes differ", bad);
}

static void test_e2m1_all_codes(void)
{
    int bad = 0;
    for (int c = 0; c < 16; c++) bad += bits_of(mxd_e2m1_to_f32((uint8_t)c)) != bits_of(mx_e2m1_to_f32((uint8_t)c));
    CHECKF(!bad, "%d e2m1 codes differ", bad);
}

/* dequantize_block of mx_tensor.c for one element */
static float cpu_dec(int fp4, uint8_t s, uint8_t code)
{
    if (s == MX_E8M0_NAN) return NAN;
    int e = (int)s - MX_E8M0_BIAS;
    return ldexpf(fp4 ? mx_e2m1_to_f32(code) : e4m3[code], e);
}

static void test_dequantize_all_pairs(void)
{
    int bad = 0;
    for (int s = 0; s < 256; s++) {
        for (int c = 0; c < 256; c++) {
            uint32_t h = bits_of(mxd_dec_fp8((uint8_t)s, (uint8_t)c)), r = bits_of(cpu_dec(0, (uint8_t)s, (uint8_t)c));
            if (h != r && !bad++) printf("  mxfp8 scale %d code %d: hd 0x%08x, cpu 0x%08x\n", s, c, h, r);
        }
        for (int c = 0; c < 16; c++) {
            uint32_t h = bits_of(mxd_dec_fp4((uint8_t)s, (uint8_t)c)), r = bits_of(cpu_dec(1, (uint8_t)s, (uint8_t)c));
            if (h != r && !bad++) printf("  mxfp4 scale %d code %d: hd 0x%08x, cpu 0x%08x\n", s, c, h, r);
        }
    }
    CHECKF(!bad, "%d (scale, code) pairs decode differently", bad);
}

/* A sweep of f32 bit patterns: a stride through all 2^32, plus the
 * neighbourhoods (+-64 ulps) of the given values and their negatives. */
typedef void (*sweep_fn)(float x, int *bad);

static void sweep(sweep_fn fn, const float *near, int nnear, int *bad)
{
    for (uint64_t u = 0; u < (UINT64_C(1) << 32); u += 4093) fn(from_bits((uint32_t)u), bad);
    for (int i = 0; i < nnear; i++)
        for (int sgn = 0; sgn < 2; sgn++)
            for (int d = -64; d <= 64; d++) {
                uint32_t b = bits_of(near[i]) + (uint32_t)d;
                fn(from_bits(b ^ (sgn ? 0x80000000u : 0u)), bad);
            }
}

static const float specials[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f,
                                 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 448.0f, 480.0f, 512.0f, 0x1p-126f, 0x1p-127f,
                                 0x1p-149f, 0x1p127f, FLT_MAX, INFINITY};

static void e2m1_one(float x, int *bad)
{
    if (mxd_f32_to_e2m1(x) != mx_f32_to_e2m1(x) && !(*bad)++)
        printf("  e2m1 encode of 0x%08x: hd %u, host %u\n", bits_of(x), mxd_f32_to_e2m1(x), mx_f32_to_e2m1(x));
}

static void test_e2m1_encode(void)
{
    int bad = 0;
    sweep(e2m1_one, specials, (int)(sizeof specials / sizeof *specials), &bad);
    e2m1_one(NAN, &bad);
    e2m1_one(-NAN, &bad);
    CHECKF(!bad, "%d e2m1 encodings differ", bad);
}

/* quantize_block's shared exponent (frexpf), as the e8m0 code */
static uint8_t cpu_block_scale(float amax, int emax)
{
    int shared = -MX_E8M0_BIAS;
    if (amax > 0.0f) {
        int e;
        frexpf(amax, &e);
        shared = e - 1 - emax;
        if (shared < -MX_E8M0_BIAS) shared = -MX_E8M0_BIAS;
        if (shared > MX_E8M0_BIAS) shared = MX_E8M0_BIAS;
    }
    return (uint8_t)(shared + MX_E8M0_BIAS);
}

static void scale_one(float x, int *bad)
{
    float a = fabsf(x);
    if (!isfinite(a)) return;   /* a NaN or inf makes the block special before the scale */
    for (int emax = 2; emax <= 8; emax += 6)
        if (mxd_block_scale(a, emax) != cpu_block_scale(a, emax) && !(*bad)++)
            printf("  block scale of 0x%08x (emax %d): hd %u, cpu %u\n", bits_of(a), emax,
                   mxd_block_scale(a, emax), cpu_block_scale(a, emax));
}

static void test_block_scale(void)
{
    int bad = 0;
    sweep(scale_one, specials, (int)(sizeof specials / sizeof *specials), &bad);
    CHECKF(!bad, "%d block scales differ", bad);
}

/* x * 2^n against ldexpf for every n the kernels use (-127..127), on a
 * sweep that reaches the subnormals and overflow on both sides */
static void test_scale_vs_ldexpf(void)
{
    int bad = 0;
    for (uint64_t u = 0; u < (UINT64_C(1) << 32); u += 1000003) {
        float x = from_bits((uint32_t)u);
        for (int n = -127; n <= 127; n++) {
            uint32_t h = bits_of(mxd_scale(x, n)), r = bits_of(ldexpf(x, n));
            if (h != r && !bad++) printf("  0x%08x * 2^%d: hd 0x%08x, ldexpf 0x%08x\n", (uint32_t)u, n, h, r);
        }
    }
    CHECKF(!bad, "%d scalings differ from ldexpf", bad);
}

/* the element encoder of the mxfp8 quantize: lpx_f32_to_f8e4m3fn(x, 1)
 * on the GPU, lpx_convert(..., LPX_CONVERT_SATURATE) on the CPU */
static void test_e4m3_encode(void)
{
    enum { N = 1 << 16 };
    static float xs[N];
    static uint8_t cpu[N];
    int bad = 0;
    for (uint64_t base = 0; base < (UINT64_C(1) << 32); base += (uint64_t)N * 61) {
        for (int i = 0; i < N; i++) xs[i] = from_bits((uint32_t)(base + (uint64_t)i * 61));
        CHECK_OK(lpx_convert(cpu, LPX_F8E4M3FN, xs, LPX_F32, N, LPX_CONVERT_SATURATE));
        for (int i = 0; i < N; i++)
            if (lpx_f32_to_f8e4m3fn(xs[i], 1) != cpu[i] && !bad++)
                printf("  e4m3 encode of 0x%08x: hd %u, lpx_convert %u\n", bits_of(xs[i]),
                       lpx_f32_to_f8e4m3fn(xs[i], 1), cpu[i]);
    }
    CHECKF(!bad, "%d e4m3 encodings differ", bad);
}

int main(void)
{
    RUN(test_e4m3_table);
    RUN(test_e8m0_all_codes);
    RUN(test_e2m1_all_codes);
    RUN(test_dequantize_all_pairs);
    RUN(test_e2m1_encode);
    RUN(test_block_scale);
    RUN(test_scale_vs_ldexpf);
    RUN(test_e4m3_encode);
    return CHECK_DONE();
}
