/* lpx — element types.
 *
 * An lpx_dtype is an index into a traits table. The built-in dtypes have
 * fixed indices (LPX_F32 ... LPX_BOOL); plugins register more at run time
 * and receive the next free index. Every dtype converts to and from f32
 * through its traits, which is how all float pairs convert (decode to f32
 * exactly, then encode once with round-to-nearest-even). */
#ifndef LPX_DTYPE_H
#define LPX_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "export.h"
#include "status.h"

LPX_BEGIN_DECLS

typedef int32_t lpx_dtype;

enum {
    LPX_F32 = 0,
    LPX_F16 = 1,
    LPX_BF16 = 2,
    LPX_F8E4M3FN = 3,
    LPX_F8E5M2 = 4,
    LPX_U8 = 5,
    LPX_I8 = 6,
    LPX_I32 = 7,
    LPX_I64 = 8,
    LPX_BOOL = 9,
    LPX_DTYPE_BUILTIN_COUNT = 10,
    LPX_DTYPE_MAX = 64 /* capacity of the traits table */
};

/** Conversion flag: clamp finite overflow and infinities to ±max of the
 *  destination format (NaN stays NaN). Without it, conversions follow the
 *  IEEE-like cast of ml_dtypes / PyTorch `.to()`: overflow becomes NaN for
 *  formats without infinities (e4m3fn) and inf for the others. */
#define LPX_CONVERT_SATURATE 1u

/** Decodes n elements of this dtype at src to f32 at dst. Exact for every
 *  dtype lpx ships whose values fit f32. */
typedef void (*lpx_to_f32_fn)(const void *src, float *dst, size_t n);
/** Encodes n f32 values to this dtype, round-to-nearest-even; `flags` is 0
 *  or LPX_CONVERT_SATURATE. */
typedef void (*lpx_from_f32_fn)(const float *src, void *dst, size_t n, unsigned flags);

/** Traits of one dtype. Registered tables are copied; strings must outlive
 *  the registration (use string literals). */
typedef struct lpx_dtype_traits {
    size_t struct_size;   /* sizeof(lpx_dtype_traits) of the caller */
    const char *name;     /* "f8e4m3fn"; unique */
    int bits;             /* bits per element: 32, 16, 8, 4, 1 (bool = 8) */
    int block;            /* elements that share a byte group; 1 unless packed */
    bool is_float;
    int exp_bits, mant_bits; /* 0 for integer dtypes */
    double max;           /* largest finite value */
    lpx_to_f32_fn to_f32;
    lpx_from_f32_fn from_f32;
} lpx_dtype_traits;

/** Traits of dtype `d`, or NULL if `d` is not registered. Borrowed, valid
 *  for the life of the process. */
LPX_API const lpx_dtype_traits *lpx_dtype_get(lpx_dtype d);

/** Name of `d` ("f32"), or "?" if unknown. */
LPX_API const char *lpx_dtype_name(lpx_dtype d);

/** The dtype called `name`, or a negative value (LPX_ENOTFOUND) if there is
 *  none. Accepts the canonical names (f32, f16, bf16, f8e4m3fn, f8e5m2, u8,
 *  i8, i32, i64, bool, and registered ones). */
LPX_API lpx_dtype lpx_dtype_from_name(const char *name);

/** Number of registered dtypes (built-in ones included). */
LPX_API int lpx_dtype_count(void);

/** Bytes needed for n elements of `d` (rounded up for packed dtypes);
 *  0 for an unknown dtype. */
LPX_API size_t lpx_dtype_nbytes(lpx_dtype d, int64_t n);

/** True if `d` is a registered dtype. */
LPX_API bool lpx_dtype_valid(lpx_dtype d);

/** Registers a new dtype from `traits` (copied) and stores its index in
 *  *out. Errors: LPX_EINVAL (NULL, missing name or functions, bad bits),
 *  LPX_EEXIST (name taken), LPX_EFULL (table full). Thread-safe. */
LPX_API lpx_status lpx_dtype_register(const lpx_dtype_traits *traits, lpx_dtype *out);

/** Converts n elements from src (src_dtype) to dst (dst_dtype), both plain
 *  contiguous buffers that must not overlap. Every pair of registered dtypes
 *  converts, through exact f32 decode and one rounding (RNE). `flags`: 0 or
 *  LPX_CONVERT_SATURATE. Errors: LPX_EINVAL (NULL with n > 0, unknown
 *  flags), LPX_EDTYPE (unknown dtype). */
LPX_API lpx_status lpx_convert(void *dst, lpx_dtype dst_dtype, const void *src,
                               lpx_dtype src_dtype, size_t n, unsigned flags);

LPX_END_DECLS

#endif
