/* Internal dtype helpers for kernels (CPU backend, dispatch, kinds built
 * into liblpx). Not installed.
 *
 * lpx_load_f32 / lpx_store_f32 read and write one element of any
 * registered dtype as f32, inline for the built-ins (a switch the compiler
 * hoists out of loops over one dtype) and through the traits otherwise.
 * The decode tables and scalar codecs are the same ones lpx_convert uses,
 * so element-wise kernels and bulk conversions agree bit for bit. */
#ifndef LPX_DTYPE_INTERNAL_H
#define LPX_DTYPE_INTERNAL_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include "lpx/dtype.h"
#include "numerics/float8.h"
#include "numerics/half.h"
#include "numerics/integer.h"

/* Longest registered dtype name, terminator excluded. */
#define LPX_DTYPE_NAME_MAX 47
/* Largest `block` a registered dtype may have (a power of two). */
#define LPX_DTYPE_BLOCK_MAX 256

/* 256-entry fp8 decode tables, built at compile time in core/dtype.c:
 * .f[code] is the exact f32 value (.u its bits). */
typedef union lpx_f8_table {
    uint32_t u[256];
    float f[256];
} lpx_f8_table;
extern const lpx_f8_table lpx__f8e4m3fn_table;
extern const lpx_f8_table lpx__f8e5m2_table;

/* Slow paths of lpx_load_f32 / lpx_store_f32 for registered (plugin)
 * dtypes: decode the element's byte group through the traits (and
 * re-encode it for a store). `d` must be valid. A store to a packed dtype
 * rewrites its whole group: not safe against concurrent stores to other
 * elements of the same group. */
float lpx_dtype__load_slow(lpx_dtype d, const void *base, int64_t i);
void lpx_dtype__store_slow(lpx_dtype d, void *base, int64_t i, float v, unsigned flags);

/* Byte offset of element i of dtype traits t, i a multiple of t->block
 * (every i for byte-sized dtypes). */
static inline size_t lpx_dtype__offset(const lpx_dtype_traits *t, size_t i)
{
    return (i / (size_t)t->block) * ((size_t)t->bits * (size_t)t->block / 8u);
}

/** Element i of `base` (dtype d, valid) as f32; exact for the built-in
 *  float and small integer dtypes, RNE for i32/i64. */
static inline float lpx_load_f32(lpx_dtype d, const void *base, int64_t i)
{
    switch (d) {
    case LPX_F32: return ((const float *)base)[i];
    case LPX_F16: return lpx_f16_to_f32(((const uint16_t *)base)[i]);
    case LPX_BF16: return lpx_bf16_to_f32(((const uint16_t *)base)[i]);
    case LPX_F8E4M3FN: return lpx__f8e4m3fn_table.f[((const uint8_t *)base)[i]];
    case LPX_F8E5M2: return lpx__f8e5m2_table.f[((const uint8_t *)base)[i]];
    case LPX_U8: return (float)((const uint8_t *)base)[i];
    case LPX_I8: return (float)((const int8_t *)base)[i];
    case LPX_I32: return (float)((const int32_t *)base)[i];
    case LPX_I64: return (float)((const int64_t *)base)[i];
    case LPX_BOOL: return ((const uint8_t *)base)[i] ? 1.0f : 0.0f;
    default: return lpx_dtype__load_slow(d, base, i);
    }
}

/** Stores f32 `v` as element i of `base` (dtype d, valid), RNE; `flags` is
 *  0 or LPX_CONVERT_SATURATE, as in lpx_convert. */
static inline void lpx_store_f32(lpx_dtype d, void *base, int64_t i, float v, unsigned flags)
{
    int sat = (flags & LPX_CONVERT_SATURATE) != 0;
    switch (d) {
    case LPX_F32:
        if (sat)
            v = v > FLT_MAX ? FLT_MAX : v < -FLT_MAX ? -FLT_MAX : v;
        ((float *)base)[i] = v;
        return;
    case LPX_F16: ((uint16_t *)base)[i] = lpx_f32_to_f16(v, sat); return;
    case LPX_BF16: ((uint16_t *)base)[i] = lpx_f32_to_bf16(v, sat); return;
    case LPX_F8E4M3FN: ((uint8_t *)base)[i] = lpx_f32_to_f8e4m3fn(v, sat); return;
    case LPX_F8E5M2: ((uint8_t *)base)[i] = lpx_f32_to_f8e5m2(v, sat); return;
    case LPX_U8: ((uint8_t *)base)[i] = lpx_f32_to_u8(v); return;
    case LPX_I8: ((int8_t *)base)[i] = lpx_f32_to_i8(v); return;
    case LPX_I32: ((int32_t *)base)[i] = lpx_f32_to_i32(v); return;
    case LPX_I64: ((int64_t *)base)[i] = lpx_f32_to_i64(v); return;
    case LPX_BOOL: ((uint8_t *)base)[i] = lpx_f32_to_bool(v); return;
    default: lpx_dtype__store_slow(d, base, i, v, flags); return;
    }
}

#endif
