/* The axiswise fp8_quantize kernels (one scale per row, column or other
 * group of x) and their launches: rows of contiguous x (k_rows_staged,
 * staged in shared memory by cp.async; k_rows_regs, a block per row held
 * in registers, up to 16384 elements; k_rows for longer rows and any
 * layout), columns of contiguous x (k_cols_amax, k_cols_scale,
 * k_cols_cast) and one thread per group for the rest (k_groups).
 * fp8_quantize (cuda_fp8_quantize.cu) checks the arguments, fills the
 * argument blocks (cuda_fp8.cuh) and calls cu_f8_launch_rows/_cols/_groups.
 * Split from the former cuda_float8.cu: these kernels are most of the
 * quantize's code and have no part in the tensorwise path. */
#include <stdlib.h>
#include <string.h>
#include "cuda_fp8.cuh"

using namespace cu_f8;

namespace {

/* ---- rowwise: a team of threads per contiguous row -------------------- */

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

/* First element of the row's scalar tail (after its aligned vectors). */
__device__ __forceinline__ int64_t row_tail(const RowSpan &r) { return r.e0 + r.nh + 8 * (int64_t)r.nu; }

/* The row's scalar head and tail elements through the full codec, by the
 * team's lanes (T of them), after the aligned vectors; c.amax is left as
 * it was unless track. Shared by the three row kernels. */
template <int IN, bool E5>
__device__ __forceinline__ void row_edges(const RowArgs &a, const RowSpan &r, float s, int lane, int T, bool track,
                                          F8Cnt &c)
{
    int64_t t0 = row_tail(r);
    uint32_t am = c.amax;
    for (int j = lane; j < r.nh; j += T)
        a.q[r.e0 + j] = (uint8_t)f8_enc_full<E5>(ld1<IN>(a.x, r.e0 + j), s, a.fmt, c);
    for (int j = lane; j < r.nt; j += T)
        a.q[t0 + j] = (uint8_t)f8_enc_full<E5>(ld1<IN>(a.x, t0 + j), s, a.fmt, c);
    if (!track) c.amax = am;
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

/* The scale of row g, once the team's lanes hold in `m` the amax bits of
 * the row's aligned vectors (dynamic scaling; 0 otherwise): the unaligned
 * head and tail elements are folded in, the amax is reduced over the team
 * and turned into the scale; static scaling reads the given scale. Lane 0
 * of an active team writes scale and scale_inv. Shared by both row
 * kernels, which differ only in how they read the vectors. */
template <int IN>
__device__ __forceinline__ float row_scale(const RowArgs &a, const RowSpan &r, int64_t g, bool active, int lane,
                                           int T, unsigned int *red, uint32_t m, F8Cnt &c)
{
    float s;
    if (a.dynamic) {
        int64_t t0 = row_tail(r);
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
    return s;
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
        uint32_t m = 0; /* amax bits of the row's aligned vectors (dynamic) */
        if (a.dynamic) {
            for (int k = 0; k < nv; k++)
                if (lane + k * T < r.nu) {
                    V8<IN> v;
                    stage_read<IN>(v, st, k);
                    m = v8_amax<IN>(v, m);
                }
        }
        float s = row_scale<IN>(a, r, g, active, lane, T, red, m, c);
        bool track = !a.dynamic;
        for (int k = 0; k < nv; k++) {
            int j = lane + k * T;
            if (j < r.nu) {
                V8<IN> v;
                stage_read<IN>(v, st, k);
                f8_vec8<IN, E5>(v, r.xv + (int64_t)j * VB, qv + 8 * j, s, a.fmt, c, track);
            }
        }
        row_edges<IN, E5>(a, r, s, lane, T, track, c);
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
        uint32_t m = 0; /* amax bits of the row's aligned vectors (dynamic) */
        if (a.dynamic) {
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
        }
        float s = row_scale<IN>(a, r, g, active, lane, T, red, m, c);
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
        row_edges<IN, E5>(a, r, s, lane, T, track, c);
    }
    f8_finish(c, a.ws, a.stats, a.G * a.D);
}

/* Rows too long for the stage but at most 256 x ROW_REGS vectors (16384
 * elements): a block per row, each lane loading its ROW_REGS vectors into
 * registers at once (32 KiB of the row in flight per block), then the
 * amax, the block reduction and the cast from those registers: the row
 * is read once. The next row's loads come from the other block on the
 * SM (the launch keeps two per SM), and with PF (bf16/f16 rows: a second
 * set of 32 registers) from this block too: the next row's vectors are
 * loaded before the current row's reduction and cast, so the SM's memory
 * pipe is not idle while a block reduces (the H100 kept up without it,
 * the H200's 1.4x bandwidth did not: 69% of copy). */
constexpr int ROW_REGS = 8;

template <int IN, bool E5, bool PF> __global__ void __launch_bounds__(256) k_rows_regs(RowArgs a)
{
    constexpr int VB = 8 * (IN == IN_F32 ? 4 : 2); /* bytes of x per vector */
    __shared__ unsigned int red[8];
    const int lane = (int)threadIdx.x;
    F8Cnt c = {0, 0, 0, 0, 0};
    V8<IN> v[ROW_REGS], nx[PF ? ROW_REGS : 1];
    RowSpan rn;
    if (PF && blockIdx.x < a.G) {
        rn = row_span<IN>(a, blockIdx.x);
#pragma unroll
        for (int k = 0; k < ROW_REGS; k++)
            if (lane + k * 256 < rn.nu) v8_load<IN>(nx[PF ? k : 0], rn.xv, lane + k * 256);
    }
    for (int64_t g = blockIdx.x; g < a.G; g += gridDim.x) {
        RowSpan r;
        if (PF) {
            r = rn;
#pragma unroll
            for (int k = 0; k < ROW_REGS; k++) v[k] = nx[PF ? k : 0];
            int64_t gn = g + gridDim.x;
            if (gn < a.G) {
                rn = row_span<IN>(a, gn);
#pragma unroll
                for (int k = 0; k < ROW_REGS; k++)
                    if (lane + k * 256 < rn.nu) v8_load<IN>(nx[PF ? k : 0], rn.xv, lane + k * 256);
            }
        } else {
            r = row_span<IN>(a, g);
#pragma unroll
            for (int k = 0; k < ROW_REGS; k++)
                if (lane + k * 256 < r.nu) v8_load<IN>(v[k], r.xv, lane + k * 256);
        }
        uint8_t *qv = a.q + r.e0 + r.nh;
        uint32_t m = 0; /* amax bits of the row's aligned vectors (dynamic) */
        if (a.dynamic) {
#pragma unroll
            for (int k = 0; k < ROW_REGS; k++)
                if (lane + k * 256 < r.nu) m = v8_amax<IN>(v[k], m);
        }
        float s = row_scale<IN>(a, r, g, true, lane, 256, red, m, c);
        bool track = !a.dynamic;
#pragma unroll
        for (int k = 0; k < ROW_REGS; k++) {
            int j = lane + k * 256;
            if (j < r.nu) f8_vec8<IN, E5>(v[k], r.xv + (int64_t)j * VB, qv + 8 * j, s, a.fmt, c, track);
        }
        row_edges<IN, E5>(a, r, s, lane, 256, track, c);
    }
    f8_finish(c, a.ws, a.stats, a.G * a.D);
}

/* ---- columns and other layouts: one thread per scale group ------------- */

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
        /* a row's aligned vectors: at most D / 8 */
        if (a.vec && a.D / 8 <= 256 * ROW_REGS) {
            a.team = 256;
            /* two rows in flight per SM: on the H100 89.2% of copy at
             * [16384, 16384] bf16 against 87.5% with as many blocks as fit
             * (three at 78 registers) and 88.9% with two by accident of
             * the register count (docs/PERFORMANCE.md) */
            int64_t cap = 2 * (int64_t)cu_sm_count(dev);
            /* bf16/f16 rows prefetch the next row (LPX_CUDA_ROWS_PREFETCH=0:
             * off, for A/B runs) */
            static const bool pf_env = !(getenv("LPX_CUDA_ROWS_PREFETCH") && !strcmp(getenv("LPX_CUDA_ROWS_PREFETCH"), "0"));
            if (IN != IN_F32 && pf_env)
                k_rows_regs<IN, E5, true><<<grid_for<k_rows_regs<IN, E5, true>>(dev, a.G < cap ? a.G : cap), 256, 0,
                                            st>>>(a);
            else
                k_rows_regs<IN, E5, false><<<grid_for<k_rows_regs<IN, E5, false>>(dev, a.G < cap ? a.G : cap), 256,
                                             0, st>>>(a);
            return cu_launched(op, "k_rows_regs");
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

} // namespace

lpx_status cu_f8_launch_rows(const char *op, int dev, RowArgs &a, int ik, bool e5, int nv)
{
    return ik == IN_BF16 ? launch_rows<IN_BF16>(op, dev, a, e5, nv)
         : ik == IN_F16  ? launch_rows<IN_F16>(op, dev, a, e5, nv)
         : ik == IN_F32  ? launch_rows<IN_F32>(op, dev, a, e5, nv)
                         : launch_rows<IN_ANY>(op, dev, a, e5, nv);
}

lpx_status cu_f8_launch_cols(const char *op, int dev, ColArgs &a, int ik, bool e5)
{
    return ik == IN_BF16 ? launch_cols_in<IN_BF16>(op, dev, a, e5)
         : ik == IN_F16  ? launch_cols_in<IN_F16>(op, dev, a, e5)
                         : launch_cols_in<IN_F32>(op, dev, a, e5);
}

lpx_status cu_f8_launch_groups(const char *op, int di, GroupArgs &a, bool e5)
{
    cudaStream_t stream = cu_stream(di);
    int64_t G = a.outer * a.inner;
    int64_t want = (G + 255) / 256;
    if (e5) k_groups<true><<<grid_for<k_groups<true>>(di, want), 256, 0, stream>>>(a);
    else k_groups<false><<<grid_for<k_groups<false>>(di, want), 256, 0, stream>>>(a);
    return cu_launched(op, "k_groups");
}
