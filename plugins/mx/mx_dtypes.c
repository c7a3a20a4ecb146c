/* The dtypes e8m0 and f4e2m1 (OCP MX 1.0), registered into lpx's dtype
 * table so that tensors, lpx_convert and DLPack-style interop know them. */
#include <float.h>
#include "mx.h"
#include "mx_codec.h"

lpx_dtype mx_e8m0 = -1, mx_f4e2m1 = -1;

static void e8m0_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = mx_e8m0_to_f32(s[i]);
}

static void e8m0_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    uint8_t *d = dst;
    int sat = (flags & LPX_CONVERT_SATURATE) != 0;
    for (size_t i = 0; i < n; i++) d[i] = mx_f32_to_e8m0(src[i], sat);
}

/* element 2i in the low nibble of byte i, 2i + 1 in the high nibble */
static void e2m1_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = mx_e2m1_to_f32((uint8_t)(s[i / 2] >> (4 * (i & 1)) & 0xFu));
}

/* whole bytes are written; an odd n leaves the last high nibble zero */
static void e2m1_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    uint8_t *d = dst;
    (void)flags;   /* e2m1 always saturates: it has no inf or NaN */
    for (size_t i = 0; i + 1 < n; i += 2)
        d[i / 2] = (uint8_t)(mx_f32_to_e2m1(src[i]) | mx_f32_to_e2m1(src[i + 1]) << 4);
    if (n & 1) d[n / 2] = mx_f32_to_e2m1(src[n - 1]);
}

lpx_status mx_register_dtypes(const lpx_host *host)
{
    static const lpx_dtype_traits e8m0 = {
        .struct_size = sizeof(lpx_dtype_traits), .name = "e8m0", .bits = 8, .block = 1, .is_float = true,
        .exp_bits = 8, .mant_bits = 0, .max = 0x1p127, .to_f32 = e8m0_to_f32, .from_f32 = e8m0_from_f32,
    };
    static const lpx_dtype_traits f4e2m1 = {
        .struct_size = sizeof(lpx_dtype_traits), .name = "f4e2m1", .bits = 4, .block = 2, .is_float = true,
        .exp_bits = 2, .mant_bits = 1, .max = 6.0, .to_f32 = e2m1_to_f32, .from_f32 = e2m1_from_f32,
    };
    lpx_status st = host->dtype_register(host, &e8m0, &mx_e8m0);
    if (!st) st = host->dtype_register(host, &f4e2m1, &mx_f4e2m1);
    return st;
}
