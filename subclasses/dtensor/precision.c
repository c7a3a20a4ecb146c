/* The numeric formats the sharding engine works in, named here so that
 * the engine's files (fsdp*.c) name no dtype (scripts/check-layers.py):
 *   - mixed precision (lpx_fsdp_config.param_dtype, FSDP2's
 *     MixedPrecisionPolicy): which dtypes a dense param may be cast to
 *     before the all-gather, and from which;
 *   - the optimizer's arithmetic and state (AdamW moments) and the kinds'
 *     agreed statistics (lpx_kind_i.sync_count values): f32;
 *   - the wire buffers: bytes (u8). */
#include "fsdp_internal.h"

const lpx_dtype fsdp_math_dtype = LPX_F32;
const lpx_dtype fsdp_byte_dtype = LPX_U8;

lpx_status dt_param_dtype_check(lpx_dtype d)
{
    if (d != LPX_BF16 && d != LPX_F16 && d != LPX_F32)
        return lpx_error(LPX_EDTYPE, "param_dtype %s is not bf16, f16 or f32", lpx_dtype_name(d));
    return LPX_OK;
}

bool dt_param_dtype_casts(lpx_dtype from, lpx_dtype to) { return from == LPX_F32 && to != LPX_F32; }

lpx_status fsdp_to_f32(lpx_dtype d, const void *src, float *dst, size_t n)
{
    return lpx_convert(dst, LPX_F32, src, d, n, 0);
}

lpx_status fsdp_from_f32(lpx_dtype d, const float *src, void *dst, size_t n)
{
    return lpx_convert(dst, d, src, LPX_F32, n, 0);
}
