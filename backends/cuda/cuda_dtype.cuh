/* Device-side element access for the kernels (.cu files only): decode any
 * built-in dtype to f32 and encode f32 back with the same scalar functions
 * the CPU backend's dtype traits use (core/numerics, LPX_HD), so a value
 * round-trips through the GPU with the CPU's bits; strided addressing over
 * a cu_geom; grid sizing. Plugin dtypes (MX ...) are not handled here:
 * cu_builtin_dtype refuses them. */
#ifndef LPX_CUDA_DTYPE_CUH
#define LPX_CUDA_DTYPE_CUH

#include <float.h>
#include <stdint.h>
#include "bits.h"
#include "float8.h"
#include "half.h"
#include "integer.h"
#include "cuda_internal.h"

/* Bytes per element of a built-in dtype (all whole bytes). */
__host__ __device__ __forceinline__ int cu_esize(lpx_dtype dt)
{
    switch (dt) {
    case LPX_F32: case LPX_I32: return 4;
    case LPX_F16: case LPX_BF16: return 2;
    case LPX_I64: return 8;
    default: return 1;
    }
}

/* The dtype's to_f32 trait on the element at p. */
__device__ __forceinline__ float cu_dec(lpx_dtype dt, const void *p)
{
    switch (dt) {
    case LPX_F32: return *(const float *)p;
    case LPX_F16: return lpx_f16_to_f32(*(const uint16_t *)p);
    case LPX_BF16: return lpx_bf16_to_f32(*(const uint16_t *)p);
    case LPX_F8E4M3FN: return lpx_f8e4m3fn_to_f32(*(const uint8_t *)p);
    case LPX_F8E5M2: return lpx_f8e5m2_to_f32(*(const uint8_t *)p);
    case LPX_U8: return (float)*(const uint8_t *)p;
    case LPX_I8: return (float)*(const int8_t *)p;
    case LPX_I32: return (float)*(const int32_t *)p;
    case LPX_I64: return (float)*(const int64_t *)p;
    case LPX_BOOL: return *(const uint8_t *)p ? 1.0f : 0.0f;
    default: return 0.0f;
    }
}

/* The dtype's from_f32 trait: one round-to-nearest-even encode; `sat`
 * clamps to +-max (floats), integers always clamp. */
__device__ __forceinline__ void cu_enc(lpx_dtype dt, void *p, float v, int sat)
{
    switch (dt) {
    case LPX_F32: {
        /* saturate: only +-inf exceed FLT_MAX; a bit test, because nvcc
         * turns the clamp written as compares into min/max instructions
         * that replace a NaN's bits with the canonical NaN */
        uint32_t u = lpx_f32_bits(v);
        if (sat && (u & 0x7FFFFFFFu) == 0x7F800000u) v = (u >> 31) ? -FLT_MAX : FLT_MAX;
        *(float *)p = v;
        break;
    }
    case LPX_F16: *(uint16_t *)p = lpx_f32_to_f16(v, sat); break;
    case LPX_BF16: *(uint16_t *)p = lpx_f32_to_bf16(v, sat); break;
    case LPX_F8E4M3FN: *(uint8_t *)p = lpx_f32_to_f8e4m3fn(v, sat); break;
    case LPX_F8E5M2: *(uint8_t *)p = lpx_f32_to_f8e5m2(v, sat); break;
    case LPX_U8: *(uint8_t *)p = lpx_f32_to_u8(v); break;
    case LPX_I8: *(int8_t *)p = lpx_f32_to_i8(v); break;
    case LPX_I32: *(int32_t *)p = lpx_f32_to_i32(v); break;
    case LPX_I64: *(int64_t *)p = lpx_f32_to_i64(v); break;
    case LPX_BOOL: *(uint8_t *)p = lpx_f32_to_bool(v); break;
    default: break;
    }
}

/* Element offset (in elements) of logical row-major index i. */
__device__ __forceinline__ int64_t cu_offset(const cu_geom &g, int64_t i)
{
    int64_t off = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
        int64_t s = g.shape[d];
        off += (i % s) * g.strides[d];
        i /= s;
    }
    return off;
}

/* Blocks for a grid-stride loop over n items with `threads` per block:
 * enough to fill the device several times over, never more than needed. */
static inline unsigned cu_blocks(int device, int64_t n, int threads)
{
    int64_t want = (n + threads - 1) / threads;
    int64_t cap = (int64_t)cu_sm_count(device) * 16;
    if (want > cap) want = cap;
    return (unsigned)(want < 1 ? 1 : want);
}

/* The storage type of a contiguous f32, f16 or bf16 element (the 16-byte
 * vector paths decode it with cu_dec(DT, ...)). */
template <int DT> struct cu_half_storage { typedef uint16_t T; };
template <> struct cu_half_storage<LPX_F32> { typedef float T; };

#endif
