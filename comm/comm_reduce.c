/* The reference reduction of every built-in backend: decode each source to
 * f32 (fp8 through the shared decode tables of core/dtype.c), combine in
 * source (= rank) order, encode once with round-to-nearest-even (fp8:
 * saturating, see encode_flags). Working in tiles on
 * the stack keeps it allocation-free and lets dst alias a source (a tile of
 * every source is read before the tile of dst is written). One fixed order
 * makes the result independent of thread timing and of the backend. */
#include <string.h>
#include "comm_internal.h"

#define TILE 512

bool lpx__comm_reduce_dtype_ok(lpx_dtype d)
{
    return d == LPX_F32 || d == LPX_BF16 || d == LPX_F16 || d == LPX_F8E4M3FN || d == LPX_F8E5M2;
}

/* fp8 results are encoded saturating: f8e4m3fn has no infinity, so an
 * overflowing sum would otherwise become NaN and poison every later step,
 * and a clamp to +-max is what every fp8 cast of lpx (and torch's
 * scaled casts) does. Callers that scale the operands (FP8-LM: s =
 * fp8_max / (amax * N)) never reach it. bf16/f16 keep IEEE overflow to
 * inf, as before. */
static unsigned encode_flags(lpx_dtype d)
{
    return d == LPX_F8E4M3FN || d == LPX_F8E5M2 ? LPX_CONVERT_SATURATE : 0u;
}

static void combine(float *acc, const float *x, size_t n, lpx_reduce_op op)
{
    switch (op) {
    case LPX_REDUCE_SUM:
    case LPX_REDUCE_AVG:
        for (size_t i = 0; i < n; i++) acc[i] += x[i];
        break;
    case LPX_REDUCE_MAX:  /* a NaN on either side wins: x != x is true only for NaN */
        for (size_t i = 0; i < n; i++) acc[i] = (x[i] > acc[i] || x[i] != x[i]) ? x[i] : acc[i];
        break;
    case LPX_REDUCE_MIN:
        for (size_t i = 0; i < n; i++) acc[i] = (x[i] < acc[i] || x[i] != x[i]) ? x[i] : acc[i];
        break;
    default:
        break;
    }
}

void lpx__comm_reduce(void *dst, const void *const *srcs, int nsrcs, size_t count, lpx_dtype dtype,
                      lpx_reduce_op op)
{
    float acc[TILE], tmp[TILE];
    const lpx_dtype_traits *tr = lpx_dtype_get(dtype);
    const size_t es = (size_t)tr->bits / 8;
    const unsigned flags = encode_flags(dtype);
    for (size_t off = 0; off < count; off += TILE) {
        size_t n = count - off < TILE ? count - off : TILE;
        for (int s = 0; s < nsrcs; s++) {
            const unsigned char *src = (const unsigned char *)srcs[s] + off * es;
            float *x = s == 0 ? acc : tmp;
            if (dtype == LPX_F32) memcpy(x, src, n * sizeof(float));
            else tr->to_f32(src, x, n);
            if (s) combine(acc, tmp, n, op);
        }
        if (op == LPX_REDUCE_AVG) {
            /* a division, not a multiply by 1/N: exact for the averages
             * that are representable, and what torch's avg does */
            float d = (float)nsrcs;
            for (size_t i = 0; i < n; i++) acc[i] /= d;
        }
        unsigned char *out = (unsigned char *)dst + off * es;
        if (dtype == LPX_F32) memcpy(out, acc, n * sizeof(float));
        else tr->from_f32(acc, out, n, flags);
    }
}

lpx_status lpx_comm_reduce_buffers(void *dst, const void *const *srcs, int nsrcs, size_t count,
                                   lpx_dtype dtype, lpx_reduce_op op)
{
    if (nsrcs < 1) return lpx_error(LPX_EINVAL, "lpx_comm_reduce_buffers: nsrcs %d < 1", nsrcs);
    if ((unsigned)op >= LPX_REDUCE_OP_COUNT)
        return lpx_error(LPX_EINVAL, "lpx_comm_reduce_buffers: reduce op %d is not sum, avg, max or min",
                         (int)op);
    if (!lpx__comm_reduce_dtype_ok(dtype))
        return lpx_error(LPX_EDTYPE, "lpx_comm_reduce_buffers: dtype %s cannot be reduced "
                         "(f32, bf16, f16, f8e4m3fn, f8e5m2 can)", lpx_dtype_name(dtype));
    if (count == 0) return LPX_OK;
    if (!dst || !srcs) return lpx_error(LPX_EINVAL, "lpx_comm_reduce_buffers: %s is NULL", dst ? "srcs" : "dst");
    for (int s = 0; s < nsrcs; s++)
        if (!srcs[s]) return lpx_error(LPX_EINVAL, "lpx_comm_reduce_buffers: srcs[%d] is NULL", s);
    lpx__comm_reduce(dst, srcs, nsrcs, count, dtype, op);
    return LPX_OK;
}
