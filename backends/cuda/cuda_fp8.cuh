/* Shared pieces of the float8 kernels of lpx-cuda.so (cuda_fp8_quantize.cu,
 * cuda_fp8_rowwise.cu, cuda_fp8_dequantize.cu): the format constants, the
 * dynamic scale formula (host and device, same bits), the fp8 encoder with
 * its statistics, the block reduction and last-block finish of a quantize,
 * the argument blocks of the axiswise quantize kernels and the launch
 * helpers those files call across. One header so that every file encodes,
 * scales and sizes its grids with the same code. CUDA C++ only.
 *
 * Everything here lives in namespace cu_f8 (types and inline or template
 * device code, compiled into each file that uses it); the kernels stay in
 * each file's anonymous namespace. The functions at the end (cu_f8_*) are
 * defined once, in the file named beside each.
 *
 * Encoding. A vector whose 8 scaled values cannot overflow (all <= the
 * format's max, hence none NaN) takes the fast path: on sm_89+ the
 * hardware conversion (cvt.rn.satfinite.e4m3x2/e5m2x2.f32, two values per
 * instruction: round to nearest even on the format's grid, subnormals and
 * signed zeros included, which is what the codec computes there; its
 * satfinite and NaN cases cannot arise), with the nonzero/underflow counts
 * taken per element only when some value is below the normal range; before
 * sm_89 the codec of core/numerics/float8.h with the normal range assumed
 * (vectors with smaller values take the slow path there). Every other
 * vector goes element by element through the full codec and the exact
 * statistics of the CPU kernel, whose overflow and underflow thresholds
 * are found at registration by the same bisection.
 *
 * Scales. The kernels compute dynamic scales in f32 arithmetic that gives
 * the bits of the CPU's double formula (f8_group_scale: proof sketch
 * there, checked exhaustively over all f32 amaxes for the formats, pow2 and
 * several clamps, and by the GPU suite); fp8_scale_from_amax runs the
 * double formula itself.
 *
 * NaN signs: the GPU's multiply returns the canonical +NaN when an operand
 * is NaN, x86 and Arm propagate the operand. The kernels keep the CPU's
 * bits by propagating a NaN operand themselves (f8_mul). */
#ifndef LPX_CUDA_FP8_CUH
#define LPX_CUDA_FP8_CUH

#include <atomic>
#include <math.h>
#include <string.h>
#include "cuda_dtype.cuh"
#include "lpx/cuda_launch.cuh"

/* 1: fast path through the sm_89+ fp8 conversion instructions; 0: the
 * codec everywhere (for bisecting a mismatch). */
#ifndef CU_F8_HW_CVT
#define CU_F8_HW_CVT 1
#endif

namespace cu_f8 {

/* ---- format constants ------------------------------------------------ */

/* f32 bits of each format's smallest normal and largest finite value */
constexpr uint32_t E4_LO = 0x3C800000u; /* 2^-6 */
constexpr uint32_t E4_HI = 0x43E00000u; /* 448 */
constexpr uint32_t E5_LO = 0x38800000u; /* 2^-14 */
constexpr uint32_t E5_HI = 0x47600000u; /* 57344 */
constexpr uint32_t F32_INF = 0x7F800000u;

inline bool is_fp8(lpx_dtype d) { return d == LPX_F8E4M3FN || d == LPX_F8E5M2; }

/* ---- the dynamic scale formula (host and device, same bits) ----------- */

/* fp8_max / max(amax, 1e-12) in double, clamped to scale_max (> 0),
 * rounded down to a power of two (backends/cpu/float8.c dynamic_scale). */
__host__ __device__ inline void f8_dynamic_scale(double amax, double fp8_max, bool pow2, double scale_max, float *scale,
                                                 float *scale_inv)
{
    double s = fp8_max / (amax > 1e-12 ? amax : 1e-12);
    if (scale_max > 0 && s > scale_max) s = scale_max;
    if (pow2) {
        int e;
        (void)frexp(s, &e);
        s = ldexp(1.0, e - 1);
    }
    *scale = (float)s;
    *scale_inv = (float)(1.0 / (double)*scale);
}

/* The same formula in f32 arithmetic, for the kernels (no double
 * division holding registers in the hot kernels). Bit-identical to
 * f8_dynamic_scale on every amax, because
 *  - amax <= 1e-12 (amax bits <= `tiny`) uses the host's result for 1e-12;
 *  - else q = fp8_max / amax has f32 operands, and rounding a quotient of
 *    f32 operands to double and then to f32 gives the f32 quotient
 *    (53 >= 2 * 24 + 2: double rounding is innocuous), rounding commutes
 *    with the clamp (a min), and 1 / scale likewise;
 *  - with pow2, the double quotient of two f32 values never rounds up to a
 *    power of two it is below (it is at least 2^-24 away, relatively), so
 *    floor(log2) of it is floor(log2(q)) = the exponent difference, less
 *    one when amax's significand exceeds fp8_max's; the clamp is a min of
 *    exponents, its power of two precomputed on the host.
 * tests/gpu/test_cuda_lowp.c checks it against the double formula. */
struct F8ScaleP {
    float fp8_max;            /* exactly representable */
    uint32_t tiny;            /* bits of the largest f32 <= 1e-12 */
    float s_tiny, si_tiny;    /* f8_dynamic_scale(0) */
    int pow2, clamp;          /* clamp: scale_max > 0 */
    float smax;               /* (float)scale_max */
    int ks;                   /* floor(log2(scale_max)) */
    float s_clamp, si_clamp;  /* pow2 and clamped: 2^ks and its inverse */
};

inline F8ScaleP f8_scale_params(double fp8_max, bool pow2, double scale_max)
{
    F8ScaleP p;
    memset(&p, 0, sizeof p);
    p.fp8_max = (float)fp8_max;
    float t = (float)1e-12;
    if ((double)t > 1e-12) t = nextafterf(t, 0.0f);
    p.tiny = lpx_f32_bits(t);
    f8_dynamic_scale(0.0, fp8_max, pow2, scale_max, &p.s_tiny, &p.si_tiny);
    p.pow2 = pow2;
    p.clamp = scale_max > 0;
    p.smax = (float)scale_max;
    if (p.clamp) {
        int e;
        (void)frexp(scale_max, &e);
        p.ks = e - 1;
        p.s_clamp = (float)ldexp(1.0, e - 1);
        p.si_clamp = (float)(1.0 / (double)p.s_clamp);
    }
    return p;
}

/* The scale of a group from its amax bits; a NaN or inf amax poisons. */
__host__ __device__ inline void f8_group_scale(uint32_t ab, const F8ScaleP &p, float *s, float *si)
{
    if (ab >= F32_INF) {
        *s = *si = lpx_f32_from_bits(0x7FC00000u);
        return;
    }
    if (ab <= p.tiny) {
        *s = p.s_tiny, *si = p.si_tiny;
        return;
    }
    if (!p.pow2) {
        float q = p.fp8_max / lpx_f32_from_bits(ab);
        float r = p.clamp && p.smax < q ? p.smax : q;
        *s = r;
        *si = 1.0f / r;
        return;
    }
    uint32_t A = lpx_f32_bits(p.fp8_max);
    int kq = (int)(A >> 23) - (int)(ab >> 23) - ((A & 0x7FFFFFu) < (ab & 0x7FFFFFu) ? 1 : 0);
    if (p.clamp && p.ks < kq) {
        *s = p.s_clamp, *si = p.si_clamp;
        return;
    }
    /* kq is within [-120, 56]: 2^kq and 2^-kq are normal f32 */
    *s = lpx_f32_from_bits((uint32_t)(kq + 127) << 23);
    *si = lpx_f32_from_bits((uint32_t)(127 - kq) << 23);
}

/* A static scale as the kernels use it: finite and > 0, else NaN. */
__device__ __forceinline__ float f8_checked_scale(float s)
{
    return (s > 0.0f && s <= 3.40282346638528859812e+38f) ? s : __int_as_float(0x7FC00000);
}

__device__ __forceinline__ float f8_inv(float s) { return (float)(1.0 / (double)s); }

/* x * s with the NaN propagation of the CPU (a NaN operand comes back
 * quieted with its sign; the first one when both are NaN). */
__device__ __forceinline__ float f8_mul(float x, float s)
{
    uint32_t ux = __float_as_uint(x), us = __float_as_uint(s);
    if ((ux & 0x7FFFFFFFu) > F32_INF) return __uint_as_float(ux | 0x00400000u);
    if ((us & 0x7FFFFFFFu) > F32_INF) return __uint_as_float(us | 0x00400000u);
    return x * s;
}

/* A dequantized value: f8_mul(x, s), a finite code's clamped to +-omax
 * (the output dtype's largest finite value, at most FLT_MAX), as the CPU
 * does (lpx_f8_dequant_sat, core/numerics/float8.h). */
__device__ __forceinline__ float f8_deq(float x, float s, float omax)
{
    return lpx_f8_dequant_sat(x, s, f8_mul(x, s), omax);
}

/* omax of f8_deq for output dtype dt (host) */
inline float f8_out_max(lpx_dtype dt)
{
    const lpx_dtype_traits *t = lpx_dtype_get(dt);
    return t && t->max < 3.40282346638528859812e+38 ? (float)t->max : 3.40282346638528859812e+38f;
}

/* ---- per-device workspace ------------------------------------------ */

/* Counters of one quantize call; zero between calls (the last block of
 * each call resets them). Calls on one device are serialized by its mutex
 * from the first to the last kernel they queue, so two host threads never
 * interleave their kernels on the shared counters. */
struct F8Work {
    unsigned int amax;        /* max |x| bits */
    unsigned int done;        /* blocks of the cast kernel that finished */
    unsigned int amax_done;   /* blocks of the amax kernel that finished */
    unsigned int pad;
    unsigned long long cnt[4];/* nonzero, underflow, saturated, nan */
};

/* ---- element access -------------------------------------------------- */

/* How a kernel reads x: contiguous f32, bf16 or f16 (16-byte vectors
 * where aligned, typed scalar loads elsewhere), or any dtype and layout
 * (IN_ANY: cu_dec at cu_offset, kept out of the hot kernels because the
 * 64-bit index arithmetic costs registers). */
enum { IN_F32 = 0, IN_BF16 = 1, IN_F16 = 2, IN_ANY = 3 };

/* x seen as logical elements: contiguous (index = offset) or strided. */
struct Src {
    const char *base;
    lpx_dtype dt;
    int esz;
    int contig;
    cu_geom g;
};

__device__ __forceinline__ float src_ld(const Src &s, int64_t i)
{
    int64_t off = s.contig ? i : cu_offset(s.g, i);
    return cu_dec(s.dt, s.base + off * s.esz);
}

/* Logical element i of x. */
template <int IN> __device__ __forceinline__ float ld1(const Src &s, int64_t i)
{
    if (IN == IN_F32) return reinterpret_cast<const float *>(s.base)[i];
    if (IN == IN_BF16) return lpx_bf16_to_f32(reinterpret_cast<const uint16_t *>(s.base)[i]);
    if (IN == IN_F16) return lpx_f16_to_f32(reinterpret_cast<const uint16_t *>(s.base)[i]);
    return src_ld(s, i);
}

/* Element k of contiguous typed data at p. */
template <int IN> __device__ __forceinline__ float ldt(const char *p, int k)
{
    if (IN == IN_F32) return reinterpret_cast<const float *>(p)[k];
    if (IN == IN_BF16) return lpx_bf16_to_f32(reinterpret_cast<const uint16_t *>(p)[k]);
    return lpx_f16_to_f32(reinterpret_cast<const uint16_t *>(p)[k]);
}

/* Raw words of 8 consecutive elements (one 16-byte vector, two for f32). */
template <int IN> struct V8 {
    static constexpr int W = IN == IN_F32 ? 2 : 1;
    uint4 r[W];
};

template <int IN> __device__ __forceinline__ void v8_load(V8<IN> &v, const char *base, int64_t unit)
{
    const uint4 *p = reinterpret_cast<const uint4 *>(base) + unit * V8<IN>::W;
#pragma unroll
    for (int k = 0; k < V8<IN>::W; k++) v.r[k] = p[k];
}

template <int IN> __device__ __forceinline__ void v8_decode(const V8<IN> &v, float (&x)[8])
{
    if (IN == IN_F32) {
        x[0] = __uint_as_float(v.r[0].x); x[1] = __uint_as_float(v.r[0].y);
        x[2] = __uint_as_float(v.r[0].z); x[3] = __uint_as_float(v.r[0].w);
        x[4] = __uint_as_float(v.r[V8<IN>::W - 1].x); x[5] = __uint_as_float(v.r[V8<IN>::W - 1].y);
        x[6] = __uint_as_float(v.r[V8<IN>::W - 1].z); x[7] = __uint_as_float(v.r[V8<IN>::W - 1].w);
    } else {
        const uint32_t w[4] = {v.r[0].x, v.r[0].y, v.r[0].z, v.r[0].w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (IN == IN_BF16) {
                x[2 * k] = __uint_as_float(w[k] << 16);
                x[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
            } else {
                x[2 * k] = lpx_f16_to_f32((uint16_t)(w[k] & 0xFFFFu));
                x[2 * k + 1] = lpx_f16_to_f32((uint16_t)(w[k] >> 16));
            }
        }
    }
}

/* ---- encoding -------------------------------------------------------- */

/* Statistics of one thread. */
struct F8Cnt {
    uint32_t amax, nz, un, sa, nan;
};

struct F8Fmt {
    int sat;
    uint32_t over, zero;
};

template <bool E5> __device__ __forceinline__ uint32_t f8_codec(float y, int sat)
{
    return E5 ? lpx_f32_to_f8e5m2(y, sat) : lpx_f32_to_f8e4m3fn(y, sat);
}

/* One element, the CPU kernel's full path: code and every statistic. */
template <bool E5> __device__ __forceinline__ uint32_t f8_enc_full(float x, float s, const F8Fmt &f, F8Cnt &c)
{
    uint32_t ab = __float_as_uint(x) & 0x7FFFFFFFu;
    float y = f8_mul(x, s);
    uint32_t a = __float_as_uint(y) & 0x7FFFFFFFu;
    bool xnan = ab > F32_INF, fin_nz = ab != 0 && !xnan;
    c.amax = ab > c.amax ? ab : c.amax;
    c.nz += fin_nz;
    c.nan += xnan;
    c.un += fin_nz && a <= f.zero;
    c.sa += ab != 0 && a >= f.over && a <= F32_INF;
    return f8_codec<E5>(y, f.sat);
}

/* Codes of two values that cannot overflow (sm_89+: the hardware
 * conversion; its satfinite clamp and NaN cases never arise) or, before
 * sm_89, that are normal and in range (the codec with that range
 * assumed); y0 in the low byte of the result. */
template <bool E5> __device__ __forceinline__ uint32_t f8_fast2(float y0, float y1)
{
#if CU_F8_HW_CVT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short r;
    if (E5) asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(r) : "f"(y0), "f"(y1));
    else asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(y0), "f"(y1));
    return r;
#else
    constexpr uint32_t lo = E5 ? E5_LO : E4_LO, hi = E5 ? E5_HI : E4_HI;
    uint32_t a0 = __float_as_uint(y0) & 0x7FFFFFFFu, a1 = __float_as_uint(y1) & 0x7FFFFFFFu;
    __builtin_assume(a0 >= lo && a0 <= hi);
    __builtin_assume(a1 >= lo && a1 <= hi);
    return f8_codec<E5>(y0, 1) | f8_codec<E5>(y1, 1) << 8;
#endif
}

/* Whether values that are all <= the format's max (ok_hi: none
 * overflows, none is NaN) and all >= its smallest normal (ok_lo) may go
 * through f8_fast2: sm_89+ converts subnormals and zeros exactly as well,
 * the codec fallback before it assumes the normal range. */
__device__ __forceinline__ bool f8_fast_ok(bool ok_hi, bool ok_lo)
{
#if CU_F8_HW_CVT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    (void)ok_lo;
    return ok_hi;
#else
    return ok_hi && ok_lo;
#endif
}

/* 8 contiguous elements of x (v, read from xv) -> their 8 codes, element
 * k in byte k of the result; statistics in c; scale s, or sv[k] for
 * element k when PER. track: fold |x| into c.amax (the dynamic cast has
 * it already). sm_89+: every vector whose scaled values are all <= max (so
 * none overflows, none is NaN) is converted by the hardware, which rounds
 * normal, subnormal and zero results exactly as the codec does; nonzero
 * and underflow counts are kept per element only when some value is below
 * the normal range. Elsewhere the fast path is the normal range only.
 * Other vectors go element by element through the full codec, x read
 * again (from L1) so that the rare path keeps no registers live. */
template <int IN, bool E5, bool PER = false>
__device__ __forceinline__ uint2 f8_codes8(const V8<IN> &v, const char *xv, float s, const F8Fmt &f, F8Cnt &c,
                                           bool track, const float *sv = nullptr)
{
    constexpr uint32_t lo = E5 ? E5_LO : E4_LO, hi = E5 ? E5_HI : E4_HI;
    float x[8];
    v8_decode<IN>(v, x);
    float y[8];
    bool ok_hi = true, ok_lo = true;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        uint32_t ab = __float_as_uint(x[k]) & 0x7FFFFFFFu;
        if (track) c.amax = ab > c.amax ? ab : c.amax;
        y[k] = x[k] * (PER ? sv[k] : s);
        uint32_t a = __float_as_uint(y[k]) & 0x7FFFFFFFu;
        ok_hi &= a <= hi;
        ok_lo &= a >= lo;
    }
    uint2 out;
    if (f8_fast_ok(ok_hi, ok_lo)) {
        if (ok_lo) {
            c.nz += 8;
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                uint32_t ab = __float_as_uint(x[k]) & 0x7FFFFFFFu, a = __float_as_uint(y[k]) & 0x7FFFFFFFu;
                c.nz += ab != 0;
                c.un += ab != 0 && a <= f.zero;
            }
        }
        out.x = f8_fast2<E5>(y[0], y[1]) | f8_fast2<E5>(y[2], y[3]) << 16;
        out.y = f8_fast2<E5>(y[4], y[5]) | f8_fast2<E5>(y[6], y[7]) << 16;
        return out;
    }
    uint32_t am = c.amax;
    out.x = out.y = 0;
    if constexpr (PER) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t q = f8_enc_full<E5>(ldt<IN>(xv, k), sv[k], f, c);
            if (k < 4) out.x |= q << (8 * k);
            else out.y |= q << (8 * (k - 4));
        }
    } else {
#pragma unroll 1
        for (int k = 0; k < 8; k++) {
            uint32_t q = f8_enc_full<E5>(ldt<IN>(xv, k), s, f, c);
            if (k < 4) out.x |= q << (8 * k);
            else out.y |= q << (8 * (k - 4));
        }
    }
    if (!track) c.amax = am;
    return out;
}

/* f8_codes8, the 8 codes stored at qv (one 8-byte store). */
template <int IN, bool E5, bool PER = false>
__device__ __forceinline__ void f8_vec8(const V8<IN> &v, const char *xv, uint8_t *qv, float s, const F8Fmt &f,
                                        F8Cnt &c, bool track, const float *sv = nullptr)
{
    *reinterpret_cast<uint2 *>(qv) = f8_codes8<IN, E5, PER>(v, xv, s, f, c, track, sv);
}

/* ---- block reduction and the last block's finish --------------------- */

/* Reduces the threads' statistics (all threads of the block call it),
 * adds them to the workspace, and lets the last block of the grid write
 * stats[4] and zero the workspace. (A dynamic cast has c.amax = 0: its
 * amax kernel put the amax into the workspace already.) */
__device__ inline void f8_finish(F8Cnt c, F8Work *ws, float *stats, int64_t n)
{
    __shared__ unsigned long long sh[32][4];
    __shared__ unsigned int shm[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    unsigned int m = __reduce_max_sync(0xFFFFFFFFu, c.amax);
    unsigned int v0 = __reduce_add_sync(0xFFFFFFFFu, c.nz), v1 = __reduce_add_sync(0xFFFFFFFFu, c.un);
    unsigned int v2 = __reduce_add_sync(0xFFFFFFFFu, c.sa), v3 = __reduce_add_sync(0xFFFFFFFFu, c.nan);
    if (lane == 0) {
        shm[warp] = m;
        sh[warp][0] = v0, sh[warp][1] = v1, sh[warp][2] = v2, sh[warp][3] = v3;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    unsigned long long t[4] = {0, 0, 0, 0};
    for (int w = 0; w < nw; w++) {
        m = shm[w] > m ? shm[w] : m;
        for (int k = 0; k < 4; k++) t[k] += sh[w][k];
    }
    if (m) atomicMax(&ws->amax, m);
    for (int k = 0; k < 4; k++)
        if (t[k]) atomicAdd(&ws->cnt[k], t[k]);
    __threadfence();
    unsigned int ticket = atomicAdd(&ws->done, 1u);
    if (ticket != gridDim.x - 1) return;
    /* the last block: every other block's atomics are visible */
    __threadfence();
    volatile F8Work *v = ws;
    uint32_t amax = v->amax;
    unsigned long long nz = v->cnt[0], un = v->cnt[1], sa = v->cnt[2], nan = v->cnt[3];
    stats[0] = __uint_as_float(amax > F32_INF ? 0x7FC00000u : amax);
    stats[1] = nz ? (float)((double)un / (double)nz) : 0.0f;
    stats[2] = n ? (float)((double)sa / (double)n) : 0.0f;
    stats[3] = n ? (float)((double)nan / (double)n) : 0.0f;
    v->amax = 0;
    v->done = 0;
    v->amax_done = 0;
    for (int k = 0; k < 4; k++) v->cnt[k] = 0;
}

/* ---- argument blocks of the axiswise quantize kernels ----------------- */

/* Tensorwise quantize (k_tw_amax, k_tw_cast in cuda_fp8_quantize.cu; the
 * amax pass is shared with fp8_quantize_t, cuda_fp8_transpose.cu). */
struct TwArgs {
    Src x;
    int64_t n, nvec;          /* elements; 8-element vectors read vectorized */
    uint8_t *q;
    int smode;                /* 0: sval; 1: device scale at sp (sdt); 2: scale_out[0] (dynamic) */
    float sval;
    const void *sp;
    lpx_dtype sdt;
    float *scale_out, *scale_inv_out, *stats;
    F8Work *ws;
    F8Fmt fmt;
    F8ScaleP sp8;             /* dynamic scale formula */
};

/* Filled by fp8_quantize (cuda_fp8_quantize.cu), launched by
 * cuda_fp8_rowwise.cu: rows (k_rows_staged, k_rows), one thread per group
 * (k_groups), columns of contiguous x (k_cols_*). */

struct RowArgs {
    Src x;
    int64_t G, D;             /* rows, elements per row */
    int vec;                  /* x contiguous, 16-byte aligned, IN its dtype */
    int team;                 /* threads per row: 8 .. 256, a power of two */
    int nv;                   /* k_rows_staged: vectors per lane (<= 4, f32 <= 2) */
    uint8_t *q;
    int dynamic;
    /* static scales: group g's scale is element g of (sp, sdt, sg) */
    const void *sp;
    lpx_dtype sdt;
    int sesz, scontig, write_scale;
    cu_geom sg;
    float *scale_out, *scale_inv_out, *stats;
    F8Work *ws;
    F8Fmt fmt;
    F8ScaleP sp8;             /* dynamic scale formula */
};

struct GroupArgs {
    Src x;
    int64_t outer, D, inner;  /* x as [outer, D, inner]; group g = o * inner + i */
    uint8_t *q;
    int dynamic;
    const void *sp;
    lpx_dtype sdt;
    int sesz, scontig, write_scale;
    cu_geom sg;
    float *scale_out, *scale_inv_out, *stats;
    F8Work *ws;
    F8Fmt fmt;
    F8ScaleP sp8;             /* dynamic scale formula */
};

/* Rows per column tile of the k_cols_* kernels (see cuda_fp8_rowwise.cu). */
constexpr int COL_RPB = 256;

struct ColArgs {
    const char *x;
    int64_t outer, D, inner;
    int64_t cvec, ctiles, chunks, ntiles; /* vectors per row, tiles per row, row chunks, tiles */
    uint8_t *q;
    int dynamic;
    const void *sp;
    lpx_dtype sdt;
    int sesz, scontig, write_scale;
    cu_geom sg;
    float *scale_out, *scale_inv_out, *stats;
    F8Work *ws;
    F8Fmt fmt;
    F8ScaleP sp8;
};

/* ---- launch helpers ---------------------------------------------------- */

/* One wave of kernel K on device dev (cuda_launch.cuh). */
template <auto K> unsigned grid_for(int dev, int64_t want) { return cu_grid_wave<K>(cu_sm_count(dev), want); }

} // namespace cu_f8

/* The axiswise quantize launches (cuda_fp8_rowwise.cu), for x of input
 * kind ik (IN_*): rows (k_rows_staged with nv > 0, else k_rows), columns
 * (k_cols_amax when dynamic, k_cols_scale, k_cols_cast) and one thread per
 * group (k_groups). Each queues on the stream of device `dev` and names
 * `op` if a launch fails. */
lpx_status cu_f8_launch_rows(const char *op, int dev, cu_f8::RowArgs &a, int ik, bool e5, int nv);
lpx_status cu_f8_launch_cols(const char *op, int dev, cu_f8::ColArgs &a, int ik, bool e5);
lpx_status cu_f8_launch_groups(const char *op, int dev, cu_f8::GroupArgs &a, bool e5);

/* Shared with fp8_quantize_t (cuda_fp8_transpose.cu), defined in
 * cuda_fp8_quantize.cu: the tensorwise amax pass (k_tw_amax: the amax into
 * the workspace, scale and scale_inv into a.scale_out / a.scale_inv_out by
 * its last block) for x of input kind ik; the encoder thresholds of a
 * format; the workspace of device dev, locked for the caller from the
 * first to the last kernel it queues (cu_f8_work_unlock releases it). */
lpx_status cu_f8_launch_tw_amax(const char *op, int dev, cu_f8::TwArgs &a, int ik);
cu_f8::F8Fmt cu_f8_fmt(bool e5, bool saturate);
cu_f8::F8Work *cu_f8_work_lock(int dev);
void cu_f8_work_unlock(int dev);
/* Registers fp8_quantize_t (cuda_fp8_transpose.cu). */
lpx_status cu_f8_register_transpose(const lpx_host *h);

/* Registers fp8_dequantize and fp8_scale_from_amax (cuda_fp8_dequantize.cu;
 * cu_register_float8 calls it after fp8_quantize). */
lpx_status cu_f8_register_dequantize(const lpx_host *h);
/* Registers the blockwise ops (cuda_fp8_block.cu). */
lpx_status cu_f8_register_block(const lpx_host *h);

#endif
