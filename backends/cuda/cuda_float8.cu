/* CUDA kernels of the dense float8 ops (ops_float8.def): fused quantize,
 * dequantize and the scale formula; fp8_scaled_mm lives with the GEMMs
 * (cuda_gemm.c). Same argument checks, output shapes and bits as the CPU
 * kernels of backends/cpu/float8.c, which are the reference
 * (tests/gpu/test_cuda_lowp.c compares every result bit for bit).
 *
 * Quantize. Every path reads x in 16-byte vectors where it can (8 elements
 * of bf16/f16, or two vectors of f32), scales, encodes and writes 8 fp8
 * codes as one 8-byte store, and keeps the statistics (amax, nonzero,
 * underflow, saturation and NaN counts) in registers; a block reduces them
 * and its thread 0 adds them to a per-device workspace with one atomic per
 * counter. The last block to finish (ticket counter, __threadfence) turns
 * the counters into the stats output and zeroes the workspace for the next
 * call. Nothing is copied back to the host: a quantize is a few kernels
 * queued on the device's stream, and allocates its four outputs only.
 *  - tensorwise, static scale: one pass (k_tw_cast), 2 vectors per thread
 *    per step, grid = one wave of resident blocks;
 *  - tensorwise, dynamic: k_tw_amax (vector reads, block max, one atomicMax
 *    per block; its last block computes scale and scale_inv on the device),
 *    then k_tw_cast, which reads the scale from the scale output;
 *  - rowwise (x contiguous, the reduced dim the last non-trivial one):
 *    k_rows_staged, a team of 8..256 threads per row (several rows per
 *    block for short rows; up to a warp needs no block barrier): the row
 *    goes once from memory into shared memory by cp.async, double buffered
 *    (the next row is in flight while the team takes the amax, the scale
 *    and the cast of the current one), for rows up to 8192 elements (4096
 *    f32); longer rows: k_rows, which reads them again (from L2);
 *  - columns (inner dims after the reduced one), x contiguous, inner a
 *    multiple of 8: k_cols_amax (tiles of 32 vectors x 256 rows, a block
 *    reduction, one atomicMax per column), k_cols_scale, k_cols_cast;
 *  - anything else (strided x, other dtypes, odd widths): k_rows with any
 *    layout, or k_groups, one thread per scale group.
 * The amax is an unsigned max over the f32 bits with the sign cleared:
 * for non-negative floats the integer order is the float order and NaN
 * sorts above inf, exactly as on the CPU.
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
 * Errors that depend on the data cannot be returned without waiting for
 * the device, so the CUDA kernels poison instead of failing: a dynamic
 * scale group whose amax is NaN or inf (the CPU fails with LPX_ENUMERIC),
 * and an invalid static scale that lives on the device (<= 0, inf, NaN:
 * the CPU fails with LPX_EINVAL), give scale = scale_inv = NaN and NaN
 * codes for the group. A static scale on the CPU is checked on the host
 * exactly as the CPU kernel does. fp8_scale_from_amax poisons a non-finite
 * amax likewise.
 *
 * NaN signs: the GPU's multiply returns the canonical +NaN when an operand
 * is NaN, x86 and Arm propagate the operand. The kernels keep the CPU's
 * bits by propagating a NaN operand themselves (f8_mul). */
#include <atomic>
#include <math.h>
#include <mutex>
#include <stdlib.h>
#include <string.h>
#include "cuda_dtype.cuh"

/* 1: fast path through the sm_89+ fp8 conversion instructions; 0: the
 * codec everywhere (for bisecting a mismatch). */
#ifndef CU_F8_HW_CVT
#define CU_F8_HW_CVT 1
#endif

namespace {

/* ---- format constants ------------------------------------------------ */

/* f32 bits of each format's smallest normal and largest finite value */
constexpr uint32_t E4_LO = 0x3C800000u; /* 2^-6 */
constexpr uint32_t E4_HI = 0x43E00000u; /* 448 */
constexpr uint32_t E5_LO = 0x38800000u; /* 2^-14 */
constexpr uint32_t E5_HI = 0x47600000u; /* 57344 */
constexpr uint32_t F32_INF = 0x7F800000u;

/* Statistic thresholds on |x * scale| bits (see backends/cpu/float8.c):
 * bits >= over overflow, nonzero bits <= zero encode to +-0. [e5m2]. */
uint32_t g_over[2], g_zero[2];

uint8_t encode_nonsat(bool e5, uint32_t bits)
{
    float y = lpx_f32_from_bits(bits);
    return (e5 ? lpx_f32_to_f8e5m2(y, 0) : lpx_f32_to_f8e4m3fn(y, 0)) & 0x7Fu;
}

void format_init(bool e5)
{
    uint32_t max_code = e5 ? LPX_F8E5M2_MAX_CODE : LPX_F8E4M3FN_MAX_CODE;
    uint32_t lo = 0, hi = F32_INF;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (encode_nonsat(e5, mid) > max_code) hi = mid; else lo = mid;
    }
    g_over[e5] = hi;
    lo = 0, hi = F32_INF;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (encode_nonsat(e5, mid) == 0) lo = mid; else hi = mid;
    }
    g_zero[e5] = lo;
}

bool is_fp8(lpx_dtype d) { return d == LPX_F8E4M3FN || d == LPX_F8E5M2; }

lpx_status check_fp8_dtype(const lpx_call *c, const char *arg, lpx_dtype d)
{
    if (!is_fp8(d))
        return lpx_error(LPX_EDTYPE, "%s: %s is %s; it must be f8e4m3fn or f8e5m2", cu_op(c), arg, lpx_dtype_name(d));
    return LPX_OK;
}

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

F8ScaleP f8_scale_params(double fp8_max, bool pow2, double scale_max)
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

F8Work *g_work[CU_MAX_DEVICES];
std::mutex g_work_mutex[CU_MAX_DEVICES];

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

/* 8 contiguous elements of x (v, read from xv) -> 8 codes at qv (one
 * 8-byte store), statistics in c; scale s, or sv[k] for element k when
 * PER. track: fold |x| into c.amax (the dynamic cast has it already).
 * sm_89+: every vector whose scaled values are all <= max (so none
 * overflows, none is NaN) is converted by the hardware, which rounds
 * normal, subnormal and zero results exactly as the codec does; nonzero
 * and underflow counts are kept per element only when some value is below
 * the normal range. Elsewhere the fast path is the normal range only.
 * Other vectors go element by element through the full codec, x read
 * again (from L1) so that the rare path keeps no registers live. */
template <int IN, bool E5, bool PER = false>
__device__ __forceinline__ void f8_vec8(const V8<IN> &v, const char *xv, uint8_t *qv, float s, const F8Fmt &f,
                                        F8Cnt &c, bool track, const float *sv = nullptr)
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
#if CU_F8_HW_CVT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const bool fast = ok_hi;
#else
    const bool fast = ok_hi && ok_lo;
#endif
    if (fast) {
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
        uint2 out;
        out.x = f8_fast2<E5>(y[0], y[1]) | f8_fast2<E5>(y[2], y[3]) << 16;
        out.y = f8_fast2<E5>(y[4], y[5]) | f8_fast2<E5>(y[6], y[7]) << 16;
        *reinterpret_cast<uint2 *>(qv) = out;
        return;
    }
    uint32_t am = c.amax;
    if constexpr (PER) {
#pragma unroll
        for (int k = 0; k < 8; k++) qv[k] = (uint8_t)f8_enc_full<E5>(ldt<IN>(xv, k), sv[k], f, c);
    } else {
#pragma unroll 1
        for (int k = 0; k < 8; k++) qv[k] = (uint8_t)f8_enc_full<E5>(ldt<IN>(xv, k), s, f, c);
    }
    if (!track) c.amax = am;
}

/* ---- block reduction and the last block's finish --------------------- */

/* Reduces the threads' statistics (all threads of the block call it),
 * adds them to the workspace, and lets the last block of the grid write
 * stats[4] and zero the workspace. (A dynamic cast has c.amax = 0: its
 * amax kernel put the amax into the workspace already.) */
__device__ void f8_finish(F8Cnt c, F8Work *ws, float *stats, int64_t n)
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

/* ---- tensorwise: amax pass ------------------------------------------- */

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

template <int IN> __global__ void __launch_bounds__(256) k_tw_amax(TwArgs a)
{
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    uint32_t m = 0;
    if constexpr (IN != IN_ANY)
    for (int64_t v = tid; v < a.nvec; v += 2 * stride) {
        V8<IN> r0, r1;
        bool two = v + stride < a.nvec;
        v8_load<IN>(r0, a.x.base, v);
        if (two) v8_load<IN>(r1, a.x.base, v + stride);
        float x[8];
        v8_decode<IN>(r0, x);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t ab = __float_as_uint(x[k]) & 0x7FFFFFFFu;
            m = ab > m ? ab : m;
        }
        if (two) {
            v8_decode<IN>(r1, x);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                uint32_t ab = __float_as_uint(x[k]) & 0x7FFFFFFFu;
                m = ab > m ? ab : m;
            }
        }
    }
    for (int64_t i = a.nvec * 8 + tid; i < a.n; i += stride) {
        uint32_t ab = __float_as_uint(ld1<IN>(a.x, i)) & 0x7FFFFFFFu;
        m = ab > m ? ab : m;
    }
    __shared__ unsigned int shm[32];
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if ((threadIdx.x & 31) == 0) shm[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = shm[w] > m ? shm[w] : m;
    if (m) atomicMax(&a.ws->amax, m);
    __threadfence();
    if (atomicAdd(&a.ws->amax_done, 1u) != gridDim.x - 1) return;
    __threadfence();
    /* the last block: the global amax is final; the scale for the cast */
    volatile F8Work *w = a.ws;
    float s, si;
    f8_group_scale(w->amax, a.sp8, &s, &si);
    a.scale_out[0] = s;
    a.scale_inv_out[0] = si;
    w->amax_done = 0;
}

/* ---- tensorwise: the cast ------------------------------------------- */

template <int IN, bool E5> __global__ void __launch_bounds__(256) k_tw_cast(TwArgs a)
{
    float s;
    if (a.smode == 0) s = a.sval;
    else if (a.smode == 1) s = f8_checked_scale(cu_dec(a.sdt, a.sp));
    else s = a.scale_out[0];
    bool track = a.smode != 2;
    if (track && blockIdx.x == 0 && threadIdx.x == 0) {
        a.scale_out[0] = s;
        a.scale_inv_out[0] = f8_inv(s);
    }
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    F8Cnt c = {0, 0, 0, 0, 0};
    if constexpr (IN != IN_ANY)
    for (int64_t v = tid; v < a.nvec; v += 2 * stride) {
        V8<IN> r0, r1;
        bool two = v + stride < a.nvec;
        v8_load<IN>(r0, a.x.base, v);
        if (two) v8_load<IN>(r1, a.x.base, v + stride);
        constexpr int VB = 8 * (IN == IN_F32 ? 4 : 2); /* bytes of x per vector */
        f8_vec8<IN, E5>(r0, a.x.base + v * VB, a.q + v * 8, s, a.fmt, c, track);
        if (two) f8_vec8<IN, E5>(r1, a.x.base + (v + stride) * VB, a.q + (v + stride) * 8, s, a.fmt, c, track);
    }
    for (int64_t i = a.nvec * 8 + tid; i < a.n; i += stride) {
        uint32_t am = c.amax;
        a.q[i] = (uint8_t)f8_enc_full<E5>(ld1<IN>(a.x, i), s, a.fmt, c);
        if (!track) c.amax = am;
    }
    f8_finish(c, a.ws, a.stats, a.n);
}

/* ---- rowwise: a team of threads per contiguous row -------------------- */

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

__device__ __forceinline__ float static_scale(const RowArgs &a, int64_t g)
{
    int64_t off = a.scontig ? g : cu_offset(a.sg, g);
    return f8_checked_scale(cu_dec(a.sdt, (const char *)a.sp + off * a.sesz));
}

/* Max over the team (threads [team_id * T, +T) of the block; T = 8 ..
 * 256); every thread of the block calls it. */
__device__ __forceinline__ uint32_t team_max(uint32_t m, int T, unsigned int *red)
{
    if (T < 32) {
        for (int o = T >> 1; o > 0; o >>= 1) {
            uint32_t v = __shfl_xor_sync(0xFFFFFFFFu, m, o);
            m = v > m ? v : m;
        }
        return m;
    }
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if (T == 32) return m;
    int warp = threadIdx.x >> 5, w0 = (int)(threadIdx.x / T) * (T >> 5);
    if ((threadIdx.x & 31) == 0) red[warp] = m;
    __syncthreads();
    for (int w = w0; w < w0 + (T >> 5); w++) m = red[w] > m ? red[w] : m;
    __syncthreads();
    return m;
}

/* Max |x| bits over 8 decoded elements. */
template <int IN> __device__ __forceinline__ uint32_t v8_amax(const V8<IN> &v, uint32_t m)
{
    float x[8];
    v8_decode<IN>(v, x);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t ab = __float_as_uint(x[j]) & 0x7FFFFFFFu;
        m = ab > m ? ab : m;
    }
    return m;
}

/* Rows streamed (NV == 0) go 4 vectors per lane per step, loads first. */
constexpr int ROW_STREAM = 4;

/* Row g as the kernels walk it (D < 2^31): nu vectors at xv / qv (x
 * 16-byte aligned there), nh scalar elements before them and nt after
 * (from e0 and from e0 + nh + 8 nu); everything is scalar (nh = D) when x
 * is not vectorized, and empty past the last row. */
struct RowSpan {
    const char *xv;
    int64_t e0;
    int nu, nh, nt;
};

template <int IN> __device__ __forceinline__ RowSpan row_span(const RowArgs &a, int64_t g)
{
    RowSpan r;
    r.e0 = g * a.D;
    r.xv = NULL;
    r.nu = r.nh = r.nt = 0;
    if (g >= a.G) return r;
    if (IN != IN_ANY && a.vec) {
        int64_t ub = (r.e0 + 7) / 8, ue = (r.e0 + a.D) / 8;
        if (ue < ub) ue = ub;
        int64_t he = ub * 8 < r.e0 + a.D ? ub * 8 : r.e0 + a.D;
        r.nu = (int)(ue - ub);
        r.nh = (int)(he - r.e0);
        r.nt = (int)(a.D - r.nh - 8 * (int64_t)r.nu);
        r.xv = a.x.base + ub * 8 * (IN == IN_F32 ? 4 : 2);
    } else {
        r.nh = (int)a.D;
    }
    return r;
}

/* cp.async (sm_80+): 16-byte global -> shared copies that hold no
 * registers while in flight. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Stage slots per thread and buffer, in 16-byte words: 4 vectors of
 * bf16/f16 or 2 of f32. Slot (k, w) of thread t is word (k W + w) 256 + t,
 * so a warp reads consecutive words (no bank conflicts). */
constexpr int STAGE_WORDS = 4;

template <int IN> __device__ __forceinline__ void stage_issue(uint4 *st, const RowSpan &r, int lane, int T, int nv)
{
    constexpr int W = V8<IN>::W;
    for (int k = 0; k < nv; k++) {
        int j = lane + k * T;
        if (j < r.nu) {
            const uint4 *src = reinterpret_cast<const uint4 *>(r.xv) + (int64_t)j * W;
#pragma unroll
            for (int w = 0; w < W; w++) cp_async16(&st[(k * W + w) * 256 + threadIdx.x], src + w);
        }
    }
    cp_async_commit();
}

template <int IN> __device__ __forceinline__ void stage_read(V8<IN> &v, const uint4 *st, int k)
{
    constexpr int W = V8<IN>::W;
#pragma unroll
    for (int w = 0; w < W; w++) v.r[w] = st[(k * W + w) * 256 + threadIdx.x];
}

/* Rows that fit the stage: a team of T = 8 .. 256 threads per row (up to a
 * warp: no block barrier), R = 256 / T rows per block at a time, each
 * lane nv <= 4 (f32: 2) vectors of the row. The row is read once, by
 * cp.async into shared memory (each thread reads back only its own
 * slots, so cp.async.wait_group is the only synchronization), double
 * buffered: the next row's copies are issued before the current row's
 * amax and cast, so loads stay in flight while the team computes and no
 * registers hold them. */
template <int IN, bool E5> __global__ void __launch_bounds__(256) k_rows_staged(RowArgs a)
{
    constexpr int VB = 8 * (IN == IN_F32 ? 4 : 2); /* bytes of x per vector */
    __shared__ uint4 stage[2][STAGE_WORDS * 256];
    __shared__ unsigned int red[8];
    const int T = a.team, R = blockDim.x / T, nv = a.nv;
    const int lane = (int)(threadIdx.x % T), team_id = (int)(threadIdx.x / T);
    const int64_t step = (int64_t)gridDim.x * R;
    F8Cnt c = {0, 0, 0, 0, 0};
    int64_t g0 = (int64_t)blockIdx.x * R;
    RowSpan r = row_span<IN>(a, g0 + team_id);
    stage_issue<IN>(stage[0], r, lane, T, nv);
    int buf = 0;
    for (; g0 < a.G; g0 += step) {
        int64_t g = g0 + team_id;
        bool active = g < a.G;
        RowSpan rn = row_span<IN>(a, g + step);
        stage_issue<IN>(stage[buf ^ 1], rn, lane, T, nv);
        cp_async_wait<1>(); /* this row's copies (all but the newest group) */
        const uint4 *st = stage[buf];
        uint8_t *qv = a.q + r.e0 + r.nh;
        int64_t t0 = r.e0 + r.nh + 8 * (int64_t)r.nu;
        float s;
        if (a.dynamic) {
            uint32_t m = 0;
            for (int k = 0; k < nv; k++)
                if (lane + k * T < r.nu) {
                    V8<IN> v;
                    stage_read<IN>(v, st, k);
                    m = v8_amax<IN>(v, m);
                }
            for (int j = lane; j < r.nh; j += T) {
                uint32_t ab = __float_as_uint(ld1<IN>(a.x, r.e0 + j)) & 0x7FFFFFFFu;
                m = ab > m ? ab : m;
            }
            for (int j = lane; j < r.nt; j += T) {
                uint32_t ab = __float_as_uint(ld1<IN>(a.x, t0 + j)) & 0x7FFFFFFFu;
                m = ab > m ? ab : m;
            }
            m = team_max(m, T, red);
            c.amax = m > c.amax ? m : c.amax;
            float si;
            f8_group_scale(m, a.sp8, &s, &si);
            if (active && lane == 0) {
                a.scale_out[g] = s;
                a.scale_inv_out[g] = si;
            }
        } else {
            s = active ? static_scale(a, g) : 1.0f;
            if (active && lane == 0) {
                if (a.write_scale) a.scale_out[g] = s;
                a.scale_inv_out[g] = f8_inv(s);
            }
        }
        bool track = !a.dynamic;
        for (int k = 0; k < nv; k++) {
            int j = lane + k * T;
            if (j < r.nu) {
                V8<IN> v;
                stage_read<IN>(v, st, k);
                f8_vec8<IN, E5>(v, r.xv + (int64_t)j * VB, qv + 8 * j, s, a.fmt, c, track);
            }
        }
        uint32_t am = c.amax;
        for (int j = lane; j < r.nh; j += T)
            a.q[r.e0 + j] = (uint8_t)f8_enc_full<E5>(ld1<IN>(a.x, r.e0 + j), s, a.fmt, c);
        for (int j = lane; j < r.nt; j += T)
            a.q[t0 + j] = (uint8_t)f8_enc_full<E5>(ld1<IN>(a.x, t0 + j), s, a.fmt, c);
        if (!track) c.amax = am;
        r = rn;
        buf ^= 1;
    }
    cp_async_wait<0>();
    f8_finish(c, a.ws, a.stats, a.G * a.D);
}

/* Longer rows (and IN_ANY: any dtype or layout): a team of T threads per
 * row reads it twice, the second time from L2, ROW_STREAM vectors per
 * lane per step. */
template <int IN, bool E5> __global__ void __launch_bounds__(256) k_rows(RowArgs a)
{
    constexpr int VB = 8 * (IN == IN_F32 ? 4 : 2); /* bytes of x per vector */
    __shared__ unsigned int red[8];
    const int T = a.team, R = blockDim.x / T;
    const int lane = (int)(threadIdx.x % T), team_id = (int)(threadIdx.x / T);
    F8Cnt c = {0, 0, 0, 0, 0};
    for (int64_t g0 = (int64_t)blockIdx.x * R; g0 < a.G; g0 += (int64_t)gridDim.x * R) {
        int64_t g = g0 + team_id;
        bool active = g < a.G;
        RowSpan r = row_span<IN>(a, g);
        uint8_t *qv = a.q + r.e0 + r.nh;
        int64_t t0 = r.e0 + r.nh + 8 * (int64_t)r.nu;
        float s;
        if (a.dynamic) {
            uint32_t m = 0;
            if constexpr (IN != IN_ANY) {
                for (int j = lane; j < r.nu; j += ROW_STREAM * T) {
                    V8<IN> t[ROW_STREAM];
#pragma unroll
                    for (int i = 0; i < ROW_STREAM; i++)
                        if (j + i * T < r.nu) v8_load<IN>(t[i], r.xv, j + i * T);
#pragma unroll
                    for (int i = 0; i < ROW_STREAM; i++)
                        if (j + i * T < r.nu) m = v8_amax<IN>(t[i], m);
                }
            }
            for (int j = lane; j < r.nh; j += T) {
                uint32_t ab = __float_as_uint(ld1<IN>(a.x, r.e0 + j)) & 0x7FFFFFFFu;
                m = ab > m ? ab : m;
            }
            for (int j = lane; j < r.nt; j += T) {
                uint32_t ab = __float_as_uint(ld1<IN>(a.x, t0 + j)) & 0x7FFFFFFFu;
                m = ab > m ? ab : m;
            }
            m = team_max(m, T, red);
            c.amax = m > c.amax ? m : c.amax;
            float si;
            f8_group_scale(m, a.sp8, &s, &si);
            if (active && lane == 0) {
                a.scale_out[g] = s;
                a.scale_inv_out[g] = si;
            }
        } else {
            s = active ? static_scale(a, g) : 1.0f;
            if (active && lane == 0) {
                if (a.write_scale) a.scale_out[g] = s;
                a.scale_inv_out[g] = f8_inv(s);
            }
        }
        bool track = !a.dynamic;
        if constexpr (IN != IN_ANY) {
            for (int j = lane; j < r.nu; j += ROW_STREAM * T) {
                V8<IN> t[ROW_STREAM];
#pragma unroll
                for (int i = 0; i < ROW_STREAM; i++)
                    if (j + i * T < r.nu) v8_load<IN>(t[i], r.xv, j + i * T);
#pragma unroll
                for (int i = 0; i < ROW_STREAM; i++) {
                    int jj = j + i * T;
                    if (jj < r.nu) f8_vec8<IN, E5>(t[i], r.xv + (int64_t)jj * VB, qv + 8 * jj, s, a.fmt, c, track);
                }
            }
        }
        uint32_t am = c.amax;
        for (int j = lane; j < r.nh; j += T)
            a.q[r.e0 + j] = (uint8_t)f8_enc_full<E5>(ld1<IN>(a.x, r.e0 + j), s, a.fmt, c);
        for (int j = lane; j < r.nt; j += T)
            a.q[t0 + j] = (uint8_t)f8_enc_full<E5>(ld1<IN>(a.x, t0 + j), s, a.fmt, c);
        if (!track) c.amax = am;
    }
    f8_finish(c, a.ws, a.stats, a.G * a.D);
}

/* ---- columns and other layouts: one thread per scale group ------------- */

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

template <bool E5> __global__ void __launch_bounds__(256) k_groups(GroupArgs a)
{
    F8Cnt c = {0, 0, 0, 0, 0};
    int64_t G = a.outer * a.inner;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < G; g += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = g / a.inner, i = g % a.inner;
        int64_t base = o * a.D * a.inner + i;
        float s;
        if (a.dynamic) {
            uint32_t m = 0;
            for (int64_t r = 0; r < a.D; r++) {
                uint32_t ab = __float_as_uint(src_ld(a.x, base + r * a.inner)) & 0x7FFFFFFFu;
                m = ab > m ? ab : m;
            }
            float si;
            f8_group_scale(m, a.sp8, &s, &si);
            a.scale_out[g] = s;
            a.scale_inv_out[g] = si;
        } else {
            int64_t off = a.scontig ? g : cu_offset(a.sg, g);
            s = f8_checked_scale(cu_dec(a.sdt, (const char *)a.sp + off * a.sesz));
            if (a.write_scale) a.scale_out[g] = s;
            a.scale_inv_out[g] = f8_inv(s);
        }
        for (int64_t r = 0; r < a.D; r++) {
            int64_t e = base + r * a.inner;
            a.q[e] = (uint8_t)f8_enc_full<E5>(src_ld(a.x, e), s, a.fmt, c);
        }
    }
    f8_finish(c, a.ws, a.stats, G * a.D);
}

/* ---- columns of contiguous x: tiles of 8 warps x 32 vectors ------------ */

/* x contiguous, 16-byte aligned, seen as [outer, D, inner] with inner % 8
 * == 0; groups are columns (o, i). A tile is 32 vectors of 8 columns (a
 * warp reads 512 contiguous bytes of bf16 per row) by COL_RPB rows, its 8
 * warps taking every 8th row. Dynamic scaling: k_cols_amax (column
 * maxima: per tile a block reduction, then one atomicMax per column into
 * the scale output, zeroed first, as bits), k_cols_scale (bits -> scale,
 * scale_inv in place), k_cols_cast; static: k_cols_scale from the given
 * scales, then k_cols_cast. x is read twice when dynamic (the column
 * amax needs every row first), once when static. */
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

struct ColTile {
    int64_t o, cv, r0, r1;
    bool valid;
};

__device__ __forceinline__ ColTile col_tile(const ColArgs &a, int64_t t)
{
    ColTile ct;
    int64_t chunk = t % a.chunks, rest = t / a.chunks;
    ct.o = rest / a.ctiles;
    ct.cv = (rest % a.ctiles) * 32 + (threadIdx.x & 31);
    ct.valid = ct.cv < a.cvec;
    ct.r0 = chunk * COL_RPB;
    ct.r1 = ct.r0 + COL_RPB < a.D ? ct.r0 + COL_RPB : a.D;
    return ct;
}

template <int IN> __global__ void __launch_bounds__(256) k_cols_amax(ColArgs a)
{
    constexpr int ES = IN == IN_F32 ? 4 : 2;
    __shared__ unsigned int red[8][8][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned int *bits = reinterpret_cast<unsigned int *>(a.scale_out);
    uint32_t bmax = 0;
    for (int64_t t = blockIdx.x; t < a.ntiles; t += gridDim.x) {
        ColTile ct = col_tile(a, t);
        uint32_t m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (ct.valid) {
#pragma unroll 4
            for (int64_t r = ct.r0 + warp; r < ct.r1; r += 8) {
                V8<IN> v;
                v8_load<IN>(v, a.x + ((ct.o * a.D + r) * a.inner) * ES, ct.cv);
                float x[8];
                v8_decode<IN>(v, x);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    uint32_t ab = __float_as_uint(x[k]) & 0x7FFFFFFFu;
                    m[k] = ab > m[k] ? ab : m[k];
                }
            }
        }
#pragma unroll
        for (int k = 0; k < 8; k++) red[warp][k][lane] = m[k];
        __syncthreads();
        if (warp == 0 && ct.valid) {
            for (int w = 1; w < 8; w++)
#pragma unroll
                for (int k = 0; k < 8; k++) m[k] = red[w][k][lane] > m[k] ? red[w][k][lane] : m[k];
            int64_t col = ct.o * a.inner + ct.cv * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (m[k]) atomicMax(&bits[col + k], m[k]);
                bmax = m[k] > bmax ? m[k] : bmax;
            }
        }
        __syncthreads();
    }
    bmax = __reduce_max_sync(0xFFFFFFFFu, bmax);
    if (threadIdx.x == 0 && bmax) atomicMax(&a.ws->amax, bmax);
}

/* One thread per column: the scale and its inverse, from the amax bits in
 * the scale output (dynamic) or from the given scales (static). */
__global__ void __launch_bounds__(256) k_cols_scale(ColArgs a)
{
    int64_t G = a.outer * a.inner;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < G; g += (int64_t)gridDim.x * blockDim.x) {
        if (a.dynamic) {
            float s, si;
            f8_group_scale(reinterpret_cast<const unsigned int *>(a.scale_out)[g], a.sp8, &s, &si);
            a.scale_out[g] = s;
            a.scale_inv_out[g] = si;
        } else {
            int64_t off = a.scontig ? g : cu_offset(a.sg, g);
            float s = f8_checked_scale(cu_dec(a.sdt, (const char *)a.sp + off * a.sesz));
            if (a.write_scale) a.scale_out[g] = s;
            a.scale_inv_out[g] = f8_inv(s);
        }
    }
}

template <int IN, bool E5> __global__ void __launch_bounds__(256) k_cols_cast(ColArgs a)
{
    constexpr int ES = IN == IN_F32 ? 4 : 2;
    const int warp = threadIdx.x >> 5;
    const bool track = !a.dynamic;
    F8Cnt c = {0, 0, 0, 0, 0};
    for (int64_t t = blockIdx.x; t < a.ntiles; t += gridDim.x) {
        ColTile ct = col_tile(a, t);
        if (!ct.valid) continue;
        int64_t col = ct.o * a.inner + ct.cv * 8;
        const float4 *sp4 = reinterpret_cast<const float4 *>(a.scale_out + col);
        float4 s0 = sp4[0], s1 = sp4[1];
        const float sv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll 4
        for (int64_t r = ct.r0 + warp; r < ct.r1; r += 8) {
            int64_t e = (ct.o * a.D + r) * a.inner + ct.cv * 8;
            V8<IN> v;
            v8_load<IN>(v, a.x + e * ES, 0);
            f8_vec8<IN, E5, true>(v, a.x + e * ES, a.q + e, 0.0f, a.fmt, c, track, sv);
        }
    }
    f8_finish(c, a.ws, a.stats, a.outer * a.D * a.inner);
}

/* ---- launch helpers ---------------------------------------------------- */

/* Blocks of 256 threads that fit on the device at once for kernel K
 * (grid-stride kernels sized to one wave), at most `want`. */
template <auto K> unsigned grid_for(int dev, int64_t want)
{
    static std::atomic<int> per_sm{0};
    int p = per_sm.load(std::memory_order_relaxed);
    if (p == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p, K, 256, 0) != cudaSuccess || p < 1) {
            (void)cudaGetLastError();
            p = 1;
        }
        per_sm.store(p, std::memory_order_relaxed);
    }
    int64_t cap = (int64_t)cu_sm_count(dev) * p;
    if (want > cap) want = cap;
    return (unsigned)(want < 1 ? 1 : want);
}

int in_kind(const Src &s)
{
    if (!s.contig) return IN_ANY;
    return s.dt == LPX_F32 ? IN_F32 : s.dt == LPX_BF16 ? IN_BF16 : s.dt == LPX_F16 ? IN_F16 : IN_ANY;
}

void src_of(Src *s, const lpx_tensor *t)
{
    memset(s, 0, sizeof *s);
    s->base = (const char *)lpx_tensor_data(t);
    s->dt = lpx_tensor_dtype(t);
    s->esz = cu_esize(s->dt);
    cu_geom_of(&s->g, t);
    s->contig = cu_geom_contiguous(&s->g);
}

template <int IN> lpx_status launch_tw(const char *op, int dev, TwArgs &a, bool e5, bool dynamic)
{
    cudaStream_t st = cu_stream(dev);
    int64_t want = ((a.nvec + 1) / 2 + (a.n - a.nvec * 8) + 255) / 256;
    if (dynamic) {
        k_tw_amax<IN><<<grid_for<k_tw_amax<IN>>(dev, want), 256, 0, st>>>(a);
        lpx_status s = cu_launched(op, "k_tw_amax");
        if (s) return s;
    }
    if (e5) k_tw_cast<IN, true><<<grid_for<k_tw_cast<IN, true>>(dev, want), 256, 0, st>>>(a);
    else k_tw_cast<IN, false><<<grid_for<k_tw_cast<IN, false>>(dev, want), 256, 0, st>>>(a);
    return cu_launched(op, "k_tw_cast");
}

template <int IN, bool E5> lpx_status launch_rows_nv(const char *op, int dev, RowArgs &a, int nv)
{
    cudaStream_t st = cu_stream(dev);
    int64_t want = (a.G + 256 / a.team - 1) / (256 / a.team);
    if constexpr (IN != IN_ANY) {
        if (nv > 0) {
            a.nv = nv;
            k_rows_staged<IN, E5><<<grid_for<k_rows_staged<IN, E5>>(dev, want), 256, 0, st>>>(a);
            return cu_launched(op, "k_rows_staged");
        }
    }
    k_rows<IN, E5><<<grid_for<k_rows<IN, E5>>(dev, want), 256, 0, st>>>(a);
    return cu_launched(op, "k_rows");
}

template <int IN> lpx_status launch_rows(const char *op, int dev, RowArgs &a, bool e5, int nv)
{
    return e5 ? launch_rows_nv<IN, true>(op, dev, a, nv) : launch_rows_nv<IN, false>(op, dev, a, nv);
}

template <int IN> lpx_status launch_cols_in(const char *op, int dev, ColArgs &a, bool e5)
{
    cudaStream_t st = cu_stream(dev);
    int64_t G = a.outer * a.inner;
    lpx_status s;
    if (a.dynamic) {
        CU_CHECK(op, cudaMemsetAsync(a.scale_out, 0, (size_t)G * sizeof(float), st));
        k_cols_amax<IN><<<grid_for<k_cols_amax<IN>>(dev, a.ntiles), 256, 0, st>>>(a);
        if ((s = cu_launched(op, "k_cols_amax"))) return s;
    }
    if (G > 0) {
        k_cols_scale<<<grid_for<k_cols_scale>(dev, (G + 255) / 256), 256, 0, st>>>(a);
        if ((s = cu_launched(op, "k_cols_scale"))) return s;
    }
    if (e5) k_cols_cast<IN, true><<<grid_for<k_cols_cast<IN, true>>(dev, a.ntiles), 256, 0, st>>>(a);
    else k_cols_cast<IN, false><<<grid_for<k_cols_cast<IN, false>>(dev, a.ntiles), 256, 0, st>>>(a);
    return cu_launched(op, "k_cols_cast");
}

lpx_status launch_cols(const char *op, int dev, ColArgs &a, int ik, bool e5)
{
    return ik == IN_BF16 ? launch_cols_in<IN_BF16>(op, dev, a, e5)
         : ik == IN_F16  ? launch_cols_in<IN_F16>(op, dev, a, e5)
                         : launch_cols_in<IN_F32>(op, dev, a, e5);
}

/* ---- fp8_quantize ---------------------------------------------------- */

lpx_status norm_dim(const char *op, int64_t dim, int ndim, int *out)
{
    int64_t d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= (ndim ? ndim : 1))
        return lpx_error(LPX_ERANGE, "%s: dim %lld out of range for %d dims", op, (long long)dim, ndim);
    *out = (int)d;
    return LPX_OK;
}

/* Static scale checks of the CPU kernel (read_static_scale): a float
 * tensor of numel 1 (tensorwise) or the keepdim shape. A scale on the CPU
 * is read here, checked value by value and returned in host_vals (malloc,
 * ns floats); a scale on x's device is left to the kernels. */
lpx_status static_scale_arg(const lpx_call *c, const lpx_tensor *x, const lpx_tensor *st, bool tensorwise_shape,
                            int64_t ns, int sndim, const int64_t *sshape, float **host_vals)
{
    const char *op = cu_op(c);
    *host_vals = NULL;
    bool on_cpu = st && !lpx_tensor_kind(st) && lpx_tensor_device(st).type == LPX_DEVICE_CPU;
    lpx_status e;
    if (on_cpu) {
        const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(st));
        if (!tr || tr->bits < 8 || tr->bits % 8)
            return lpx_error(LPX_EDTYPE, "%s: tensor 'scale' has dtype %s, which the cpu kernels do not support", op,
                             lpx_dtype_name(lpx_tensor_dtype(st)));
        if (!tr->is_float)
            return lpx_error(LPX_EDTYPE, "%s: scale has dtype %s; %s takes floating-point tensors", op,
                             lpx_dtype_name(lpx_tensor_dtype(st)), op);
    } else {
        if ((e = cu_check_float(c, "scale", st)) || (e = cu_check_same_device(c, "x", x, "scale", st))) return e;
    }
    bool ok;
    if (tensorwise_shape) {
        ok = lpx_tensor_numel(st) == 1;
    } else {
        ok = lpx_tensor_ndim(st) == sndim;
        for (int i = 0; ok && i < sndim; i++) ok = lpx_tensor_shape(st)[i] == sshape[i];
    }
    if (!ok) {
        char s1[160];
        return lpx_error(LPX_ESHAPE, "%s: static scale has shape %s; this quantization needs %lld scale value%s%s", op,
                         lpx_tensor_shape_str(st, s1, sizeof s1), (long long)ns, ns == 1 ? "" : "s",
                         ns == 1 ? "" : " in the keepdim shape (x's shape with the reduced dim = 1)");
    }
    if (!on_cpu) return LPX_OK;
    float *v = (float *)malloc((size_t)(ns ? ns : 1) * sizeof(float));
    if (!v) return lpx_error(LPX_ENOMEM, "%s: cannot allocate %lld scale values", op, (long long)ns);
    for (int64_t i = 0; i < ns; i++) {
        double d = 0;
        if ((e = lpx_item(st, i, &d))) {
            free(v);
            return e;
        }
        float s = (float)d;
        if (!(s > 0.0f) || !isfinite(s)) {
            free(v);
            return lpx_error(LPX_EINVAL, "%s: static scale[%lld] = %g; a scale must be finite and > 0", op,
                             (long long)i, (double)s);
        }
        v[i] = s;
    }
    *host_vals = v;
    return LPX_OK;
}

lpx_status k_fp8_quantize(lpx_call *c)
{
    lpx_tensor *x = cu_arg_tensor(c, 0), *sarg = cu_arg_tensor(c, 1);
    lpx_dtype fp8 = c->args[2].u.d;
    bool has_dim = c->args[3].tag == LPX_TAG_I64;
    bool pow2 = c->args[4].u.b, sat = c->args[6].u.b;
    double scale_max = c->args[5].u.f;
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_check_float(c, "x", x)) || (st = check_fp8_dtype(c, "fp8", fp8))) return st;
    if (isnan(scale_max) || scale_max < 0)
        return lpx_error(LPX_EINVAL, "%s: scale_max = %g; it must be >= 0 (0: no clamp)", op, scale_max);
    int ndim = lpx_tensor_ndim(x);
    const int64_t *shape = lpx_tensor_shape(x);
    int64_t numel = lpx_tensor_numel(x);
    int sndim = 0;
    int64_t sshape[LPX_MAX_DIMS];
    int64_t outer = 1, D = numel, inner = 1;
    if (has_dim) {
        int d;
        if ((st = norm_dim(op, c->args[3].u.i, ndim, &d))) return st;
        if (ndim == 0)
            return lpx_error(LPX_ESHAPE, "%s: dim %lld given for a 0-d x; axiswise scaling needs at least 1 dim", op,
                             (long long)c->args[3].u.i);
        sndim = ndim;
        memcpy(sshape, shape, (size_t)ndim * sizeof *sshape);
        sshape[d] = 1;
        for (int i = 0; i < d; i++) outer *= shape[i];
        for (int i = d + 1; i < ndim; i++) inner *= shape[i];
        D = shape[d];
    }
    int64_t G = outer * inner;
    bool one_group = G == 1 && D == numel;
    lpx_device dev = lpx_tensor_device(x);
    float *host_scale = NULL;
    if (sarg && (st = static_scale_arg(c, x, sarg, one_group, G, sndim, sshape, &host_scale))) return st;
    lpx_tensor *q = NULL, *ts = NULL, *tsi = NULL, *tstats = NULL;
    int64_t four = 4;
    if ((st = cu_new(c, fp8, ndim, shape, dev, &q)) || (st = cu_new(c, LPX_F32, sndim, sshape, dev, &ts)) ||
        (st = cu_new(c, LPX_F32, sndim, sshape, dev, &tsi)) || (st = cu_new(c, LPX_F32, 1, &four, dev, &tstats)) ||
        (st = cu_use(op, dev)))
        goto fail;
    {
        int di = dev.index;
        bool e5 = fp8 == LPX_F8E5M2, dynamic = sarg == NULL;
        F8Fmt fmt = {sat ? 1 : 0, g_over[e5], g_zero[e5]};
        F8ScaleP sp8 = f8_scale_params(lpx_dtype_get(fp8)->max, pow2, scale_max);
        Src src;
        src_of(&src, x);
        int ik = in_kind(src);
        bool vec = ik != IN_ANY && ((uintptr_t)src.base % 16) == 0;
        float *ps = (float *)lpx_tensor_data(ts), *psi = (float *)lpx_tensor_data(tsi);
        float *pstats = (float *)lpx_tensor_data(tstats);
        cudaStream_t stream = cu_stream(di);
        std::lock_guard<std::mutex> lock(g_work_mutex[di]);
        F8Work *ws = g_work[di];
        if (one_group) {
            TwArgs a;
            memset(&a, 0, sizeof a);
            a.x = src;
            a.n = numel;
            a.nvec = vec ? numel / 8 : 0;
            a.q = (uint8_t *)lpx_tensor_data(q);
            a.smode = dynamic ? 2 : host_scale ? 0 : 1;
            a.sval = host_scale ? host_scale[0] : 0.0f;
            a.sp = sarg && !host_scale ? lpx_tensor_data(sarg) : NULL;
            a.sdt = sarg ? lpx_tensor_dtype(sarg) : LPX_F32;
            a.scale_out = ps, a.scale_inv_out = psi, a.stats = pstats;
            a.ws = ws;
            a.fmt = fmt;
            a.sp8 = sp8;
            st = ik == IN_BF16 ? launch_tw<IN_BF16>(op, di, a, e5, dynamic)
               : ik == IN_F16  ? launch_tw<IN_F16>(op, di, a, e5, dynamic)
               : ik == IN_F32  ? launch_tw<IN_F32>(op, di, a, e5, dynamic)
                               : launch_tw<IN_ANY>(op, di, a, e5, dynamic);
        } else {
            /* static scales from the CPU go to the scale output first and
             * are read back from there (pageable copy: staged, no wait) */
            if (host_scale) {
                cudaError_t ce = cudaMemcpyAsync(ps, host_scale, (size_t)G * sizeof(float), cudaMemcpyHostToDevice,
                                                 stream);
                if (ce != cudaSuccess) {
                    st = cu_fail(ce, op, "cudaMemcpyAsync(scale)");
                    goto unlock_fail;
                }
            }
            const void *sp = host_scale ? (const void *)ps : sarg ? lpx_tensor_data(sarg) : NULL;
            lpx_dtype sdt = host_scale || !sarg ? LPX_F32 : lpx_tensor_dtype(sarg);
            cu_geom sg;
            memset(&sg, 0, sizeof sg);
            int scontig = 1;
            if (sarg && !host_scale) {
                cu_geom_of(&sg, sarg);
                scontig = cu_geom_contiguous(&sg);
            }
            if (inner == 1 && D < ((int64_t)1 << 31)) {
                RowArgs a;
                memset(&a, 0, sizeof a);
                a.x = src;
                a.G = G, a.D = D;
                a.vec = vec;
                /* at most D / 8 vectors per row: the smallest team of 8 ..
                 * 256 threads whose lanes hold the row in the shared-memory
                 * stage (4 vectors each, 2 for f32); longer rows (and
                 * unvectorized x) are streamed twice */
                int64_t units = D / 8;
                int nv_max = ik == IN_F32 ? 2 : 4;
                int nv = 0, team = 32;
                if (vec && units <= 256 * nv_max) {
                    team = 8;
                    while (team < 256 && units > (int64_t)team * nv_max) team *= 2;
                    nv = 1;
                    while ((int64_t)team * nv < units) nv++;
                } else {
                    while (team < 256 && team < (vec ? units : D)) team *= 2;
                }
                a.team = team;
                a.q = (uint8_t *)lpx_tensor_data(q);
                a.dynamic = dynamic;
                a.sp = sp, a.sdt = sdt, a.sesz = cu_esize(sdt), a.scontig = scontig, a.sg = sg;
                a.write_scale = !host_scale;
                a.scale_out = ps, a.scale_inv_out = psi, a.stats = pstats;
                a.ws = ws;
                a.fmt = fmt;
                a.sp8 = sp8;
                st = ik == IN_BF16 ? launch_rows<IN_BF16>(op, di, a, e5, nv)
                   : ik == IN_F16  ? launch_rows<IN_F16>(op, di, a, e5, nv)
                   : ik == IN_F32  ? launch_rows<IN_F32>(op, di, a, e5, nv)
                                   : launch_rows<IN_ANY>(op, di, a, e5, nv);
            } else if (vec && inner % 8 == 0 && ik != IN_ANY) {
                ColArgs a;
                memset(&a, 0, sizeof a);
                a.x = src.base;
                a.outer = outer, a.D = D, a.inner = inner;
                a.cvec = inner / 8;
                a.ctiles = (a.cvec + 31) / 32;
                a.chunks = (D + COL_RPB - 1) / COL_RPB;
                if (a.chunks < 1) a.chunks = 1;
                a.ntiles = outer * a.ctiles * a.chunks;
                a.q = (uint8_t *)lpx_tensor_data(q);
                a.dynamic = dynamic;
                a.sp = sp, a.sdt = sdt, a.sesz = cu_esize(sdt), a.scontig = scontig, a.sg = sg;
                a.write_scale = !host_scale;
                a.scale_out = ps, a.scale_inv_out = psi, a.stats = pstats;
                a.ws = ws;
                a.fmt = fmt;
                a.sp8 = sp8;
                st = launch_cols(op, di, a, ik, e5);
            } else {
                GroupArgs a;
                memset(&a, 0, sizeof a);
                a.x = src;
                a.outer = outer, a.D = D, a.inner = inner;
                a.q = (uint8_t *)lpx_tensor_data(q);
                a.dynamic = dynamic;
                a.sp = sp, a.sdt = sdt, a.sesz = cu_esize(sdt), a.scontig = scontig, a.sg = sg;
                a.write_scale = !host_scale;
                a.scale_out = ps, a.scale_inv_out = psi, a.stats = pstats;
                a.ws = ws;
                a.fmt = fmt;
                a.sp8 = sp8;
                int64_t want = (G + 255) / 256;
                if (e5) k_groups<true><<<grid_for<k_groups<true>>(di, want), 256, 0, stream>>>(a);
                else k_groups<false><<<grid_for<k_groups<false>>(di, want), 256, 0, stream>>>(a);
                st = cu_launched(op, "k_groups");
            }
        }
    unlock_fail:
        /* a failed launch may leave counters behind: zero them */
        if (st) (void)cudaMemsetAsync(ws, 0, sizeof *ws, stream);
    }
    if (st) goto fail;
    free(host_scale);
    cu_ret(c, q);
    cu_ret(c, ts);
    cu_ret(c, tsi);
    cu_ret(c, tstats);
    return LPX_OK;
fail:
    free(host_scale);
    lpx_tensor_release(q);
    lpx_tensor_release(ts);
    lpx_tensor_release(tsi);
    lpx_tensor_release(tstats);
    return st;
}

/* ---- fp8_dequantize ---------------------------------------------------- */

/* decode(q) * s, encoded to dtype `dt` non-saturating, as the CPU does. */
struct DeqArgs {
    const uint8_t *q;
    cu_geom qg;
    int qcontig;
    int64_t n, nvec;          /* elements; 16-byte output vectors written vectorized */
    lpx_dtype qdt, dt;
    /* scale_inv: by value (smode 0), numel-1 device tensor (1), or
     * broadcast to q's shape (2) */
    int smode;
    float sval;
    const void *sp;
    lpx_dtype sdt;
    int sesz;
    cu_geom sg;
    void *y;
};

__device__ __forceinline__ float deq_scale(const DeqArgs &a, int64_t i)
{
    if (a.smode == 0) return a.sval;
    if (a.smode == 1) return cu_dec(a.sdt, a.sp);
    return cu_dec(a.sdt, (const char *)a.sp + cu_offset(a.sg, i) * a.sesz);
}

/* Table of the 256 decoded codes, built by the block from the codec. */
__device__ __forceinline__ void deq_table(float *tab, lpx_dtype qdt)
{
    for (int k = threadIdx.x; k < 256; k += blockDim.x)
        tab[k] = qdt == LPX_F8E4M3FN ? lpx_f8e4m3fn_to_f32((uint8_t)k) : lpx_f8e5m2_to_f32((uint8_t)k);
    __syncthreads();
}

/* OUT: 0 f32, 1 bf16, 2 f16 (vector stores), 3 any dtype (cu_enc). */
template <int OUT> __device__ __forceinline__ void deq_store1(const DeqArgs &a, int64_t i, float v)
{
    if (OUT == 0) ((float *)a.y)[i] = v;
    else if (OUT == 1) ((uint16_t *)a.y)[i] = lpx_f32_to_bf16(v, 0);
    else if (OUT == 2) ((uint16_t *)a.y)[i] = lpx_f32_to_f16(v, 0);
    else cu_enc(a.dt, (char *)a.y + i * cu_esize(a.dt), v, 0);
}

template <int OUT> __global__ void __launch_bounds__(256) k_deq(DeqArgs a)
{
    __shared__ float tab[256];
    deq_table(tab, a.qdt);
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    if constexpr (OUT < 3) {
        /* contiguous q, one scale: a thread writes 16 contiguous bytes per
         * vector (4 codes to f32, 8 to bf16/f16), so a warp's stores are
         * whole lines; U vectors per step, loads first */
        constexpr int CPV = OUT == 0 ? 4 : 8, U = 4;
        float s = a.smode == 0 ? a.sval : deq_scale(a, 0);
        for (int64_t v0 = tid; v0 < a.nvec; v0 += U * stride) {
            uint32_t w[U][CPV / 4];
#pragma unroll
            for (int j = 0; j < U; j++) {
                int64_t v = v0 + j * stride;
                if (v >= a.nvec) break;
                if (CPV == 4) {
                    w[j][0] = reinterpret_cast<const uint32_t *>(a.q)[v];
                } else {
                    uint2 r = reinterpret_cast<const uint2 *>(a.q)[v];
                    w[j][0] = r.x;
                    w[j][CPV / 4 - 1] = r.y;
                }
            }
#pragma unroll
            for (int j = 0; j < U; j++) {
                int64_t v = v0 + j * stride;
                if (v >= a.nvec) break;
                float o[CPV];
#pragma unroll
                for (int k = 0; k < CPV; k++) o[k] = f8_mul(tab[(w[j][k >> 2] >> (8 * (k & 3))) & 0xFFu], s);
                if (OUT == 0) {
                    reinterpret_cast<float4 *>(a.y)[v] = make_float4(o[0], o[1], o[2], o[3 % CPV]);
                } else {
                    uint32_t h[4];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        uint32_t lo = OUT == 1 ? lpx_f32_to_bf16(o[(2 * k) % CPV], 0) : lpx_f32_to_f16(o[(2 * k) % CPV], 0);
                        uint32_t hi = OUT == 1 ? lpx_f32_to_bf16(o[(2 * k + 1) % CPV], 0)
                                               : lpx_f32_to_f16(o[(2 * k + 1) % CPV], 0);
                        h[k] = lo | hi << 16;
                    }
                    reinterpret_cast<uint4 *>(a.y)[v] = make_uint4(h[0], h[1], h[2], h[3]);
                }
            }
        }
        for (int64_t i = a.nvec * CPV + tid; i < a.n; i += stride) deq_store1<OUT>(a, i, f8_mul(tab[a.q[i]], s));
    } else {
        for (int64_t i = tid; i < a.n; i += stride) {
            uint8_t code = a.q[a.qcontig ? i : cu_offset(a.qg, i)];
            deq_store1<3>(a, i, f8_mul(tab[code], deq_scale(a, i)));
        }
    }
}

/* True if scale (numel 1, or same ndim with each dim 1 or equal) applies
 * to a tensor of shape (ndim, shape). */
bool scale_fits(const lpx_tensor *s, int ndim, const int64_t *shape)
{
    if (lpx_tensor_numel(s) == 1) return true;
    if (lpx_tensor_ndim(s) != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (lpx_tensor_shape(s)[i] != 1 && lpx_tensor_shape(s)[i] != shape[i]) return false;
    return true;
}

lpx_status k_fp8_dequantize(lpx_call *c)
{
    lpx_tensor *q = cu_arg_tensor(c, 0), *si = cu_arg_tensor(c, 1);
    lpx_dtype dt = c->args[2].u.d;
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_check_dense(c, "q", q)) || (st = check_fp8_dtype(c, "q", lpx_tensor_dtype(q)))) return st;
    bool si_host = si && !lpx_tensor_kind(si) && lpx_tensor_device(si).type == LPX_DEVICE_CPU &&
                   lpx_tensor_numel(si) == 1;
    if (si_host) {
        const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(si));
        if (!tr || !tr->is_float || tr->bits < 8 || tr->bits % 8)
            return lpx_error(LPX_EDTYPE, "%s: scale_inv has dtype %s; %s takes floating-point tensors", op,
                             lpx_dtype_name(lpx_tensor_dtype(si)), op);
    } else if ((st = cu_check_float(c, "scale_inv", si)) || (st = cu_check_same_device(c, "q", q, "scale_inv", si))) {
        return st;
    }
    const lpx_dtype_traits *td = lpx_dtype_get(dt);
    if (!td || !td->is_float || td->bits < 8 || td->block > 1)
        return lpx_error(LPX_EDTYPE, "%s: dtype %s is not a byte-sized floating-point dtype", op, lpx_dtype_name(dt));
    if (dt >= LPX_DTYPE_BUILTIN_COUNT)
        return lpx_error(LPX_EDTYPE, "%s: dtype %s: the cuda kernels write built-in dtypes only (dequantize to f32 "
                                     "and cast on the CPU)", op, lpx_dtype_name(dt));
    int ndim = lpx_tensor_ndim(q);
    const int64_t *shape = lpx_tensor_shape(q);
    if (!scale_fits(si, ndim, shape)) {
        char s1[160], s2[160];
        return lpx_error(LPX_ESHAPE, "%s: scale_inv of shape %s does not fit q of shape %s (numel 1, or q's ndim with "
                                     "dims of 1 or q's size)", op, lpx_tensor_shape_str(si, s1, sizeof s1),
                         lpx_tensor_shape_str(q, s2, sizeof s2));
    }
    lpx_device dev = lpx_tensor_device(q);
    lpx_tensor *y;
    if ((st = cu_new(c, dt, ndim, shape, dev, &y))) return st;
    if ((st = cu_use(op, dev))) {
        lpx_tensor_release(y);
        return st;
    }
    DeqArgs a;
    memset(&a, 0, sizeof a);
    a.q = (const uint8_t *)lpx_tensor_data(q);
    cu_geom_of(&a.qg, q);
    a.qcontig = cu_geom_contiguous(&a.qg);
    a.n = lpx_tensor_numel(q);
    a.qdt = lpx_tensor_dtype(q);
    a.dt = dt;
    a.y = lpx_tensor_data(y);
    if (si_host) {
        double v = 0;
        if ((st = lpx_item(si, 0, &v))) {
            lpx_tensor_release(y);
            return st;
        }
        a.smode = 0;
        a.sval = (float)v;
    } else {
        a.sp = lpx_tensor_data(si);
        a.sdt = lpx_tensor_dtype(si);
        a.sesz = cu_esize(a.sdt);
        if (lpx_tensor_numel(si) == 1) a.smode = 1;
        else {
            a.smode = 2;
            cu_geom_broadcast(&a.sg, si, ndim, shape);
        }
    }
    int out = dt == LPX_F32 ? 0 : dt == LPX_BF16 ? 1 : dt == LPX_F16 ? 2 : 3;
    if (!a.qcontig || a.smode == 2) out = 3;
    int cpv = out == 0 ? 4 : 8; /* codes per 16-byte output vector */
    a.nvec = out < 3 && ((uintptr_t)a.q % cpv) == 0 ? a.n / cpv : 0;
    int di = dev.index;
    cudaStream_t stream = cu_stream(di);
    int64_t want = ((out < 3 ? (a.nvec + 3) / 4 + a.n % cpv : a.n) + 255) / 256;
    switch (out) {
    case 0: k_deq<0><<<grid_for<k_deq<0>>(di, want), 256, 0, stream>>>(a); break;
    case 1: k_deq<1><<<grid_for<k_deq<1>>(di, want), 256, 0, stream>>>(a); break;
    case 2: k_deq<2><<<grid_for<k_deq<2>>(di, want), 256, 0, stream>>>(a); break;
    default: k_deq<3><<<grid_for<k_deq<3>>(di, want), 256, 0, stream>>>(a); break;
    }
    if ((st = cu_launched(op, "k_deq"))) {
        lpx_tensor_release(y);
        return st;
    }
    cu_ret(c, y);
    return LPX_OK;
}

/* ---- fp8_scale_from_amax --------------------------------------------- */

struct SfaArgs {
    const char *amax;
    lpx_dtype adt;
    int aesz, contig;
    cu_geom g;
    int64_t n;
    float *s, *si;
    double fp8_max, scale_max;
    bool pow2;
};

__global__ void __launch_bounds__(256) k_scale_from_amax(SfaArgs a)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = cu_dec(a.adt, a.amax + (a.contig ? i : cu_offset(a.g, i)) * a.aesz);
        uint32_t ab = __float_as_uint(v) & 0x7FFFFFFFu;
        if (ab >= F32_INF) {
            a.s[i] = a.si[i] = __int_as_float(0x7FC00000);
            continue;
        }
        f8_dynamic_scale(fabs((double)v), a.fp8_max, a.pow2, a.scale_max, &a.s[i], &a.si[i]);
    }
}

lpx_status k_fp8_scale_from_amax(lpx_call *c)
{
    lpx_tensor *am = cu_arg_tensor(c, 0);
    lpx_dtype fp8 = c->args[1].u.d;
    bool pow2 = c->args[2].u.b;
    double smax = c->args[3].u.f;
    const char *op = cu_op(c);
    lpx_status st;
    if ((st = cu_check_float(c, "amax", am)) || (st = check_fp8_dtype(c, "fp8", fp8))) return st;
    if (isnan(smax) || smax < 0)
        return lpx_error(LPX_EINVAL, "%s: scale_max = %g; it must be >= 0 (0: no clamp)", op, smax);
    lpx_device dev = lpx_tensor_device(am);
    lpx_tensor *s = NULL, *si = NULL;
    int nd = lpx_tensor_ndim(am);
    const int64_t *shape = lpx_tensor_shape(am);
    if ((st = cu_new(c, LPX_F32, nd, shape, dev, &s)) || (st = cu_new(c, LPX_F32, nd, shape, dev, &si)) ||
        (st = cu_use(op, dev)))
        goto fail;
    {
        SfaArgs a;
        memset(&a, 0, sizeof a);
        a.amax = (const char *)lpx_tensor_data(am);
        a.adt = lpx_tensor_dtype(am);
        a.aesz = cu_esize(a.adt);
        cu_geom_of(&a.g, am);
        a.contig = cu_geom_contiguous(&a.g);
        a.n = lpx_tensor_numel(am);
        a.s = (float *)lpx_tensor_data(s);
        a.si = (float *)lpx_tensor_data(si);
        a.fp8_max = lpx_dtype_get(fp8)->max;
        a.scale_max = smax;
        a.pow2 = pow2;
        if (a.n > 0) {
            k_scale_from_amax<<<cu_blocks(dev.index, a.n, 256), 256, 0, cu_stream(dev.index)>>>(a);
            if ((st = cu_launched(op, "k_scale_from_amax"))) goto fail;
        }
    }
    cu_ret(c, s);
    cu_ret(c, si);
    return LPX_OK;
fail:
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    return st;
}

} // namespace

extern "C" lpx_status cu_register_float8(const lpx_host *h)
{
    format_init(false);
    format_init(true);
    /* the per-device workspaces, zeroed once (the kernels keep them zero
     * between calls) */
    for (int d = 0; d < cu_device_count(); d++) {
        if (g_work[d]) continue;
        CU_CHECK("lpx-cuda init (float8)", cudaSetDevice(d));
        CU_CHECK("lpx-cuda init (float8)", cudaMalloc((void **)&g_work[d], sizeof(F8Work)));
        CU_CHECK("lpx-cuda init (float8)", cudaMemset(g_work[d], 0, sizeof(F8Work)));
    }
    lpx_status st;
    if ((st = cu_reg(h, LPX_OP_fp8_quantize, k_fp8_quantize))) return st;
    if ((st = cu_reg(h, LPX_OP_fp8_dequantize, k_fp8_dequantize))) return st;
    return cu_reg(h, LPX_OP_fp8_scale_from_amax, k_fp8_scale_from_amax);
}
