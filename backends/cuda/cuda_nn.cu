/* CUDA neural-network ops: rmsnorm, softmax, cross-entropy, MSE loss and
 * embedding with their backward passes, with the semantics of the CPU
 * kernels (backends/cpu/nn.c): results in the main input's dtype (rstd
 * f32 [..., 1]), grad_w of rmsnorm always computed, cross-entropy averaged
 * over the targets that are not ignore_index (0 when all are), integer
 * indices i32 or i64 with an out-of-range value refused (LPX_ERANGE naming
 * its position).
 *
 * One block per row (line) with f32 accumulation and a block reduction;
 * elements are read through the tensor's geometry, so every layout and
 * float dtype works. Where the CPU kernel evaluates a per-element formula
 * in double (the backward passes, MSE), the same double expression is used
 * here; the row sums differ from the CPU's double sums only by rounding.
 * embedding_backward accumulates with f32 atomicAdd (order-dependent) and
 * encodes once. Index validation runs on the device; the ops that take
 * indices wait for it (one small device-to-host copy) so the error comes
 * back from the call, as on the CPU. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cuda_dtype.cuh"
#include <lpx/meta.h>

#define NN_THREADS 256
#define NN_NO_BAD 0xFFFFFFFFFFFFFFFFull

/* ---- device helpers ------------------------------------------------- */

/* A tensor operand as the kernels see it. */
struct nn_t {
    const void *p;
    int dt;
    bool contig;
    cu_geom g;
};

static nn_t nn_of(const lpx_tensor *t)
{
    nn_t o;
    memset(&o, 0, sizeof o);
    o.p = lpx_tensor_data(t);
    o.dt = (int)lpx_tensor_dtype(t);
    cu_geom_of(&o.g, t);
    o.contig = cu_geom_contiguous(&o.g);
    return o;
}

/* Logical element i of t, as f32. */
__device__ __forceinline__ float nn_ld(const nn_t &t, int64_t i)
{
    int64_t off = t.contig ? i : cu_offset(t.g, i);
    return cu_dec((lpx_dtype)t.dt, (const char *)t.p + off * cu_esize((lpx_dtype)t.dt));
}

/* Element at offset `off` (elements) of base, as f32. */
__device__ __forceinline__ float nn_ld_off(const void *base, int dt, int64_t off)
{
    return cu_dec((lpx_dtype)dt, (const char *)base + off * cu_esize((lpx_dtype)dt));
}

/* Stores v (one RNE encode) at element i of a contiguous buffer. */
__device__ __forceinline__ void nn_st(void *base, int dt, int64_t i, float v)
{
    cu_enc((lpx_dtype)dt, (char *)base + i * cu_esize((lpx_dtype)dt), v, 0);
}

/* Logical element i of an i32/i64 index tensor. */
__device__ __forceinline__ int64_t nn_idx(const nn_t &t, int64_t i)
{
    int64_t off = t.contig ? i : cu_offset(t.g, i);
    return t.dt == LPX_I64 ? ((const int64_t *)t.p)[off] : (int64_t)((const int32_t *)t.p)[off];
}

/* Block-wide sum / max; every thread gets the result. Blocks of up to 1024
 * threads, a multiple of 32. */
template <typename T> __device__ T nn_block_sum(T v)
{
    __shared__ T sh[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* a previous call's readers are done with sh */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : (T)0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* max ignoring NaN, like the CPU's `x > m ? x : m` from -inf */
__device__ __forceinline__ float nn_max2(float a, float b) { return b > a ? b : a; }

__device__ float nn_block_max(float v)
{
    __shared__ float sh[32];
    for (int o = 16; o > 0; o >>= 1) v = nn_max2(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) v = nn_max2(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* dst[i] = encode(src[i]) for a contiguous f32 source. */
__global__ void nn_encode(const float *src, void *dst, int dt, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        nn_st(dst, dt, i, src[i]);
}

/* Validates indices: every value not equal to `ignore` (when use_ignore)
 * must lie in [0, limit); the smallest bad position goes to *bad, the
 * number of values not ignored to *count (may be NULL). */
__global__ void nn_scan_indices(nn_t idx, int64_t limit, int64_t ignore, bool use_ignore, unsigned long long *bad,
                                unsigned long long *count)
{
    unsigned long long mine = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < idx.g.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = nn_idx(idx, i);
        if (use_ignore && t == ignore) continue;
        if (t < 0 || t >= limit) atomicMin(bad, (unsigned long long)i);
        else mine++;
    }
    if (count) {
        mine = nn_block_sum(mine);
        if (threadIdx.x == 0 && mine) atomicAdd(count, mine);
    }
}

/* ---- host helpers --------------------------------------------------- */

static unsigned nn_grid(int dev, int64_t n) { return cu_blocks(dev, n, NN_THREADS); }

/* Blocks for one-block-per-row kernels (grid-stride over rows). */
static unsigned nn_rows_grid(int dev, int64_t rows)
{
    int64_t cap = (int64_t)cu_sm_count(dev) * 32;
    int64_t g = rows < cap ? rows : cap;
    return (unsigned)(g < 1 ? 1 : g);
}

/* "[i, j, ...]": the multi-index of flat position p of t. */
static const char *nn_index_str(const lpx_tensor *t, int64_t p, char *buf, size_t len)
{
    int nd = lpx_tensor_ndim(t);
    const int64_t *shape = lpx_tensor_shape(t);
    int64_t idx[LPX_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = shape[d] ? p % shape[d] : 0;
        p = shape[d] ? p / shape[d] : 0;
    }
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < nd && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)idx[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

/* Small device scratch holding the accumulators of one call. */
struct nn_acc {
    double total;
    unsigned long long count;
    unsigned long long bad;
};

static lpx_status nn_acc_new(const lpx_call *c, int dev, nn_acc **out)
{
    *out = (nn_acc *)cu_scratch_alloc(dev, sizeof(nn_acc));
    if (!*out) return lpx_error(LPX_ENOMEM, "%s: cannot allocate %zu bytes of device scratch", cu_op(c), sizeof(nn_acc));
    cudaStream_t s = cu_stream(dev);
    cudaError_t e = cudaMemsetAsync(*out, 0, offsetof(nn_acc, bad), s);
    if (e == cudaSuccess) e = cudaMemsetAsync(&(*out)->bad, 0xFF, sizeof(unsigned long long), s);
    if (e != cudaSuccess) {
        cu_scratch_free(dev, *out, sizeof(nn_acc));
        *out = NULL;
        return cu_fail(e, cu_op(c), "cudaMemsetAsync(accumulators)");
    }
    return LPX_OK;
}

/* Waits for the kernels, reads the smallest bad index position (and the
 * value there) back and frees the scratch. `ce`: the cross-entropy message
 * (target[n] ... ignore_index), else the embedding one (indices[...]). */
static lpx_status nn_finish_indices(const lpx_call *c, int dev, nn_acc *acc, const lpx_tensor *idx, int64_t limit,
                                    bool ce, int64_t ignore)
{
    const char *op = cu_op(c);
    cudaStream_t s = cu_stream(dev);
    unsigned long long bad = NN_NO_BAD;
    cudaError_t e = cudaMemcpyAsync(&bad, &acc->bad, sizeof bad, cudaMemcpyDeviceToHost, s);
    cudaError_t e2 = cudaStreamSynchronize(s);
    cu_scratch_free(dev, acc, sizeof(nn_acc));
    if (e != cudaSuccess) return cu_fail(e, op, "cudaMemcpyAsync(index check)");
    if (e2 != cudaSuccess) return cu_fail(e2, op, "cudaStreamSynchronize");
    if (bad == NN_NO_BAD) return LPX_OK;
    /* the offending value, for the message */
    int64_t p = (int64_t)bad, off = 0, q = p;
    for (int d = lpx_tensor_ndim(idx) - 1; d >= 0; d--) {
        off += (q % lpx_tensor_shape(idx)[d]) * lpx_tensor_strides(idx)[d];
        q /= lpx_tensor_shape(idx)[d];
    }
    bool i64 = lpx_tensor_dtype(idx) == LPX_I64;
    int64_t v64 = 0;
    int32_t v32 = 0;
    const char *src = (const char *)lpx_tensor_data(idx) + off * (i64 ? 8 : 4);
    e = cudaMemcpyAsync(i64 ? (void *)&v64 : (void *)&v32, src, i64 ? 8 : 4, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return cu_fail(e, op, "cudaMemcpyAsync(bad index)");
    int64_t v = i64 ? v64 : (int64_t)v32;
    if (ce)
        return lpx_error(LPX_ERANGE, "%s: target[%lld] = %lld is out of range [0, %lld) (ignore_index %lld)", op,
                         (long long)p, (long long)v, (long long)limit, (long long)ignore);
    char pos[160];
    return lpx_error(LPX_ERANGE, "%s: indices%s = %lld is out of range [0, %lld)", op,
                     nn_index_str(idx, p, pos, sizeof pos), (long long)v, (long long)limit);
}

/* ---- rmsnorm -------------------------------------------------------- */

__global__ void __launch_bounds__(NN_THREADS)
rms_fwd(nn_t x, const void *w, int64_t ws, int wdt, void *y, float *rstd, int64_t R, int64_t D, double eps)
{
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float v = nn_ld(x, r * D + i);
            ss += v * v;
        }
        ss = nn_block_sum(ss);
        float rv = (float)(1.0 / sqrt((D ? (double)ss / (double)D : 0.0) + eps));
        if (threadIdx.x == 0) rstd[r] = rv;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float wv = w ? nn_ld_off(w, wdt, i * ws) : 1.0f;
            nn_st(y, x.dt, r * D + i, nn_ld(x, r * D + i) * rv * wv);
        }
    }
}

/* ---- rmsnorm, the vector path ----------------------------------------
 * x (and grad) contiguous rows of one dtype DT among f32/f16/bf16, D a
 * multiple of the 16-byte vector (VE elements) and at most 256 * VPT
 * vectors, 16-byte aligned: one block of NN_THREADS per row (grid-stride),
 * thread t owning the vectors t, t + 256, ... of every row, so a row is
 * read once into registers and the weight (and, backward, the thread's
 * grad_w partial sums) stays in registers across rows. The generic kernels
 * above took ~0.5 ms per [8192, 4096] bf16 backward on an H200 (17 per
 * Llama-3-8B-shaped 8-layer step: 17 ms); this path reads each operand once
 * at vector width. Same math as the generic kernels (f32 elements, the
 * row's scale in double), another summation order. */
#define RMS_VPT_MAX 4

template <int DT, int VPT> struct rms_row {
    typedef typename cu_half_storage<DT>::T T;
    static constexpr int VE = 16 / (int)sizeof(T);
    union U { uint4 v; T e[VE]; };
    float f[VPT][VE];

    __device__ __forceinline__ void load(const char *row, int64_t nv)
    {
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            int64_t v = threadIdx.x + (int64_t)k * NN_THREADS;
            U u;
            u.v = v < nv ? ((const uint4 *)row)[v] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < VE; j++) f[k][j] = v < nv ? cu_dec((lpx_dtype)DT, &u.e[j]) : 0.0f;
        }
    }
};

/* the weight's values at this thread's columns (1 without a weight) */
template <int VPT, int VE>
__device__ __forceinline__ void rms_load_weight(float (&wf)[VPT][VE], const void *w, int64_t ws, int wdt, int64_t nv)
{
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int64_t v = threadIdx.x + (int64_t)k * NN_THREADS;
#pragma unroll
        for (int j = 0; j < VE; j++) wf[k][j] = w && v < nv ? nn_ld_off(w, wdt, (v * VE + j) * ws) : 1.0f;
    }
}

template <int DT, int VPT>
__global__ void __launch_bounds__(NN_THREADS)
rms_fwd_vec(const char *x, const void *w, int64_t ws, int wdt, char *y, float *rstd, int64_t R, int64_t D, double eps)
{
    typedef rms_row<DT, VPT> row_t;
    constexpr int VE = row_t::VE;
    const int64_t nv = D / VE, rb = D * (int64_t)sizeof(typename row_t::T);
    float wf[VPT][VE];
    rms_load_weight<VPT, VE>(wf, w, ws, wdt, nv);
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        row_t xr;
        xr.load(x + r * rb, nv);
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < VPT; k++)
#pragma unroll
            for (int j = 0; j < VE; j++) ss += xr.f[k][j] * xr.f[k][j];
        ss = nn_block_sum(ss);
        float rv = (float)(1.0 / sqrt((double)ss / (double)D + eps));
        if (threadIdx.x == 0) rstd[r] = rv;
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            int64_t v = threadIdx.x + (int64_t)k * NN_THREADS;
            if (v >= nv) break;
            typename row_t::U u;
#pragma unroll
            for (int j = 0; j < VE; j++) cu_enc((lpx_dtype)DT, &u.e[j], xr.f[k][j] * rv * wf[k][j], 0);
            ((uint4 *)(y + r * rb))[v] = u.v;
        }
    }
}

/* grad_x as rms_bwd_x; grad_w partial sums of this block's rows into
 * part[blockIdx.x][D] (f32), summed by rms_gw_reduce in a fixed order (a
 * deterministic grad_w for a given grid) */
template <int DT, int VPT>
__global__ void __launch_bounds__(NN_THREADS)
rms_bwd_vec(const char *g, const char *x, const void *w, int64_t ws, int wdt, const float *rstd, char *gx,
            float *part, int64_t R, int64_t D)
{
    typedef rms_row<DT, VPT> row_t;
    constexpr int VE = row_t::VE;
    const int64_t nv = D / VE, rb = D * (int64_t)sizeof(typename row_t::T);
    float wf[VPT][VE], acc[VPT][VE];
    rms_load_weight<VPT, VE>(wf, w, ws, wdt, nv);
#pragma unroll
    for (int k = 0; k < VPT; k++)
#pragma unroll
        for (int j = 0; j < VE; j++) acc[k][j] = 0.0f;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        row_t gr, xr;
        gr.load(g + r * rb, nv);
        xr.load(x + r * rb, nv);
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < VPT; k++)
#pragma unroll
            for (int j = 0; j < VE; j++) dot += gr.f[k][j] * wf[k][j] * xr.f[k][j];
        dot = nn_block_sum(dot);
        double rr = (double)rstd[r];
        float kf = (float)(D ? rr * rr * rr * (double)dot / (double)D : 0.0), rf = (float)rr;
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            int64_t v = threadIdx.x + (int64_t)k * NN_THREADS;
            if (v >= nv) break;
            typename row_t::U u;
#pragma unroll
            for (int j = 0; j < VE; j++) {
                cu_enc((lpx_dtype)DT, &u.e[j], rf * gr.f[k][j] * wf[k][j] - xr.f[k][j] * kf, 0);
                acc[k][j] += gr.f[k][j] * xr.f[k][j] * rf;
            }
            ((uint4 *)(gx + r * rb))[v] = u.v;
        }
    }
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int64_t v = threadIdx.x + (int64_t)k * NN_THREADS;
        if (v < nv)
#pragma unroll
            for (int j = 0; j < VE; j++) part[(int64_t)blockIdx.x * D + v * VE + j] = acc[k][j];
    }
}

/* gw[c] = sum over the nb blocks' partial sums, in block order */
__global__ void rms_gw_reduce(const float *part, int nb, int64_t D, void *gw, int dt)
{
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < D; c += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < nb; b++) s += part[(int64_t)b * D + c];
        nn_st(gw, dt, c, s);
    }
}

/* The vector path's vectors per thread for x (0: the generic kernels).
 * g, when given, must match x's dtype and layout. */
static int rms_vec_vpt(const lpx_tensor *x, const lpx_tensor *g, int64_t D)
{
    lpx_dtype dt = lpx_tensor_dtype(x);
    if (dt != LPX_F32 && dt != LPX_F16 && dt != LPX_BF16) return 0;
    if (!lpx_tensor_is_contiguous(x) || ((uintptr_t)lpx_tensor_data(x) & 15u)) return 0;
    if (g && (lpx_tensor_dtype(g) != dt || !lpx_tensor_is_contiguous(g) || ((uintptr_t)lpx_tensor_data(g) & 15u)))
        return 0;
    int ve = 16 / (int)lpx_dtype_nbytes(dt, 1);
    if (D <= 0 || D % ve) return 0;
    int64_t nv = D / ve, vpt = (nv + NN_THREADS - 1) / NN_THREADS;
    if (vpt > RMS_VPT_MAX) return 0;
    return vpt <= 1 ? 1 : vpt <= 2 ? 2 : 4;
}

#define RMS_VEC_SWITCH(DTV, VPTV, LAUNCH)                                                     \
    switch ((DTV) * 8 + (VPTV)) {                                                             \
    case LPX_F32 * 8 + 1: LAUNCH(LPX_F32, 1); break;                                          \
    case LPX_F32 * 8 + 2: LAUNCH(LPX_F32, 2); break;                                          \
    case LPX_F32 * 8 + 4: LAUNCH(LPX_F32, 4); break;                                          \
    case LPX_F16 * 8 + 1: LAUNCH(LPX_F16, 1); break;                                          \
    case LPX_F16 * 8 + 2: LAUNCH(LPX_F16, 2); break;                                          \
    case LPX_F16 * 8 + 4: LAUNCH(LPX_F16, 4); break;                                          \
    case LPX_BF16 * 8 + 1: LAUNCH(LPX_BF16, 1); break;                                        \
    case LPX_BF16 * 8 + 2: LAUNCH(LPX_BF16, 2); break;                                        \
    default: LAUNCH(LPX_BF16, 4); break;                                                      \
    }

/* The contracts of rmsnorm and its backward (dtypes, shapes) are the
 * dispatcher's: spec families `rmsnorm`, `rmsnorm_backward`
 * (op_args_nn.h); the tensors are dense and on one device. */
static lpx_status k_rmsnorm(lpx_call *c)
{
    const lpx_rmsnorm_args *a = (const lpx_rmsnorm_args *)lpx_op_args_of(c);
    lpx_tensor *x = a->x, *w = a->weight;
    double eps = a->eps;
    lpx_status st;
    int64_t D = a->dim, R = a->rows;
    int nd = lpx_tensor_ndim(x);
    const int64_t *xs = lpx_tensor_shape(x);
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(cu_op(c), dev))) return st;
    int64_t rshape[LPX_MAX_DIMS];
    memcpy(rshape, xs, (size_t)nd * sizeof *rshape);
    rshape[nd - 1] = 1;
    lpx_tensor *y = NULL, *rstd = NULL;
    if ((st = cu_new(c, lpx_tensor_dtype(x), nd, xs, dev, &y)) || (st = cu_new(c, LPX_F32, nd, rshape, dev, &rstd))) {
        lpx_tensor_release(y);
        return st;
    }
    int vpt = rms_vec_vpt(x, NULL, D);
    if (R > 0 && vpt) {
        const void *wp = w ? lpx_tensor_data(w) : NULL;
        int64_t ws = w ? lpx_tensor_strides(w)[0] : 0;
        int wdt = w ? (int)lpx_tensor_dtype(w) : 0;
        unsigned grid = (unsigned)(R < 4 * (int64_t)cu_sm_count(dev.index) ? R : 4 * cu_sm_count(dev.index));
#define RMS_FWD(DT, VPT)                                                                                         \
    rms_fwd_vec<DT, VPT><<<grid, NN_THREADS, 0, cu_stream(dev.index)>>>(                                      \
        (const char *)lpx_tensor_data(x), wp, ws, wdt, (char *)lpx_tensor_data(y), (float *)lpx_tensor_data(rstd), R, \
        D, eps)
        RMS_VEC_SWITCH((int)lpx_tensor_dtype(x), vpt, RMS_FWD)
#undef RMS_FWD
        if ((st = cu_launched(cu_op(c), "rms_fwd_vec"))) {
            lpx_tensor_release(y);
            lpx_tensor_release(rstd);
            return st;
        }
    } else if (R > 0) {
        rms_fwd<<<nn_rows_grid(dev.index, R), NN_THREADS, 0, cu_stream(dev.index)>>>(
            nn_of(x), w ? lpx_tensor_data(w) : NULL, w ? lpx_tensor_strides(w)[0] : 0,
            w ? (int)lpx_tensor_dtype(w) : 0, lpx_tensor_data(y), (float *)lpx_tensor_data(rstd), R, D, eps);
        if ((st = cu_launched(cu_op(c), "rms_fwd"))) {
            lpx_tensor_release(y);
            lpx_tensor_release(rstd);
            return st;
        }
    }
    cu_ret(c, y);
    cu_ret(c, rstd);
    return LPX_OK;
}

/* grad_x of one row per block:
 *   dx_i = r * g_i * w_i - x_i * (r^3 / D * sum_j g_j w_j x_j) */
__global__ void __launch_bounds__(NN_THREADS)
rms_bwd_x(nn_t g, nn_t x, const void *w, int64_t ws, int wdt, nn_t rstd, void *gx, int64_t R, int64_t D)
{
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        float dot = 0.0f;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float wv = w ? nn_ld_off(w, wdt, i * ws) : 1.0f;
            dot += nn_ld(g, r * D + i) * wv * nn_ld(x, r * D + i);
        }
        dot = nn_block_sum(dot);
        double rr = (double)nn_ld(rstd, r);
        double k = D ? rr * rr * rr * (double)dot / (double)D : 0.0;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float wv = w ? nn_ld_off(w, wdt, i * ws) : 1.0f;
            float gi = nn_ld(g, r * D + i), xi = nn_ld(x, r * D + i);
            nn_st(gx, x.dt, r * D + i, (float)(rr * gi * wv - xi * k));
        }
    }
}

/* grad_w partial sums: block (32 columns) x (rows in steps of blockDim.y *
 * gridDim.y), reduced over threadIdx.y and added to acc[D] (f32). */
__global__ void rms_bwd_w(nn_t g, nn_t x, nn_t rstd, float *acc, int64_t R, int64_t D)
{
    __shared__ float part[8][33];
    int64_t col = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < D)
        for (int64_t r = blockIdx.y * (int64_t)blockDim.y + threadIdx.y; r < R; r += (int64_t)gridDim.y * blockDim.y)
            s += nn_ld(g, r * D + col) * nn_ld(x, r * D + col) * nn_ld(rstd, r);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < D) {
        float t = 0.0f;
        for (int k = 0; k < (int)blockDim.y; k++) t += part[k][threadIdx.x];
        atomicAdd(&acc[col], t);
    }
}

static lpx_status k_rmsnorm_backward(lpx_call *c)
{
    const lpx_rmsnorm_backward_args *a = (const lpx_rmsnorm_backward_args *)lpx_op_args_of(c);
    lpx_tensor *g = a->grad, *x = a->x, *w = a->weight, *rstd = a->rstd;
    const char *op = cu_op(c);
    lpx_status st;
    int64_t D = a->dim, R = a->rows;
    int nd = lpx_tensor_ndim(x);
    const int64_t *xs = lpx_tensor_shape(x);
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(op, dev))) return st;
    cudaStream_t s = cu_stream(dev.index);
    lpx_dtype gwdt = a->grad_w_dtype;
    lpx_tensor *gx = NULL, *gw = NULL;
    float *acc = NULL, *part = NULL;
    size_t part_bytes = 0;
    int vpt, nb;
    bool direct = gwdt == LPX_F32;
    if ((st = cu_new(c, lpx_tensor_dtype(x), nd, xs, dev, &gx)) || (st = cu_new(c, gwdt, 1, &D, dev, &gw))) goto fail;
    /* the vector path reads rstd as contiguous f32 (what rmsnorm returns) */
    vpt = lpx_tensor_is_contiguous(rstd) && lpx_tensor_dtype(rstd) == LPX_F32 ? rms_vec_vpt(x, g, D) : 0;
    if (R > 0 && vpt) {
        /* grad_w: each block's partial sums, then their sum in block order */
        nb = (int)(R < 2 * (int64_t)cu_sm_count(dev.index) ? R : 2 * cu_sm_count(dev.index));
        part_bytes = (size_t)nb * (size_t)D * sizeof(float);
        if (!(part = (float *)cu_scratch_alloc(dev.index, part_bytes))) {
            st = lpx_error(LPX_ENOMEM, "%s: cannot allocate %d x %lld grad_w partial sums", op, nb, (long long)D);
            goto fail;
        }
        const void *wp = w ? lpx_tensor_data(w) : NULL;
        int64_t ws = w ? lpx_tensor_strides(w)[0] : 0;
        int wdt = w ? (int)lpx_tensor_dtype(w) : 0;
#define RMS_BWD(DT, VPT)                                                                                         \
    rms_bwd_vec<DT, VPT><<<nb, NN_THREADS, 0, s>>>((const char *)lpx_tensor_data(g), (const char *)lpx_tensor_data(x), \
                                                    wp, ws, wdt, (const float *)lpx_tensor_data(rstd),                 \
                                                    (char *)lpx_tensor_data(gx), part, R, D)
        RMS_VEC_SWITCH((int)lpx_tensor_dtype(x), vpt, RMS_BWD)
#undef RMS_BWD
        if ((st = cu_launched(op, "rms_bwd_vec"))) goto fail;
        rms_gw_reduce<<<nn_grid(dev.index, D), NN_THREADS, 0, s>>>(part, nb, D, lpx_tensor_data(gw), (int)gwdt);
        if ((st = cu_launched(op, "rms_gw_reduce"))) goto fail;
        cu_scratch_free(dev.index, part, part_bytes);
        cu_ret(c, gx);
        cu_ret(c, gw);
        return LPX_OK;
    }
    acc = direct ? (float *)lpx_tensor_data(gw) : (float *)cu_scratch_alloc(dev.index, (size_t)(D ? D : 1) * 4);
    if (!acc) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate the %lld grad_w accumulators", op, (long long)D);
        goto fail;
    }
    if (D > 0) {
        cudaError_t e = cudaMemsetAsync(acc, 0, (size_t)D * sizeof(float), s);
        if (e != cudaSuccess) {
            st = cu_fail(e, op, "cudaMemsetAsync(grad_w)");
            goto fail;
        }
    }
    if (R > 0 && D > 0) {
        nn_t tg = nn_of(g), tx = nn_of(x), tr = nn_of(rstd);
        const void *wp = w ? lpx_tensor_data(w) : NULL;
        int64_t ws = w ? lpx_tensor_strides(w)[0] : 0;
        rms_bwd_x<<<nn_rows_grid(dev.index, R), NN_THREADS, 0, s>>>(tg, tx, wp, ws, w ? (int)lpx_tensor_dtype(w) : 0,
                                                                     tr, lpx_tensor_data(gx), R, D);
        if ((st = cu_launched(op, "rms_bwd_x"))) goto fail;
        int64_t gy = (R + 7) / 8, cap = 4 * (int64_t)cu_sm_count(dev.index);
        dim3 grid((unsigned)((D + 31) / 32), (unsigned)(gy < cap ? gy : cap)), block(32, 8);
        rms_bwd_w<<<grid, block, 0, s>>>(tg, tx, tr, acc, R, D);
        if ((st = cu_launched(op, "rms_bwd_w"))) goto fail;
    }
    if (!direct && D > 0) {
        nn_encode<<<nn_grid(dev.index, D), NN_THREADS, 0, s>>>(acc, lpx_tensor_data(gw), (int)gwdt, D);
        if ((st = cu_launched(op, "nn_encode"))) goto fail;
    }
    if (!direct) cu_scratch_free(dev.index, acc, (size_t)(D ? D : 1) * 4);
    cu_ret(c, gx);
    cu_ret(c, gw);
    return LPX_OK;
fail:
    if (acc && !direct) cu_scratch_free(dev.index, acc, (size_t)(D ? D : 1) * 4);
    if (part) cu_scratch_free(dev.index, part, part_bytes);
    lpx_tensor_release(gx);
    lpx_tensor_release(gw);
    return st;
}

/* ---- softmax -------------------------------------------------------- */

/* The lines of a tensor along `dim`: base offsets of line q are
 * cu_offset(lines, q) (the other dims), elements `step` apart. */
struct nn_lines {
    const void *p;
    int dt;
    int64_t step;
    cu_geom lines;
};

static nn_lines nn_lines_of(const lpx_tensor *t, int dim)
{
    nn_lines l;
    memset(&l, 0, sizeof l);
    l.p = lpx_tensor_data(t);
    l.dt = (int)lpx_tensor_dtype(t);
    int nd = lpx_tensor_ndim(t);
    const int64_t *sh = lpx_tensor_shape(t), *str = lpx_tensor_strides(t);
    l.step = nd ? str[dim] : 1;
    l.lines.numel = 1;
    for (int d = 0; d < nd; d++) {
        if (d == dim) continue;
        l.lines.shape[l.lines.ndim] = sh[d];
        l.lines.strides[l.lines.ndim] = str[d];
        l.lines.ndim++;
        l.lines.numel *= sh[d];
    }
    return l;
}

__device__ __forceinline__ float nn_line_ld(const nn_lines &l, int64_t base, int64_t i)
{
    return nn_ld_off(l.p, l.dt, base + i * l.step);
}

__device__ __forceinline__ void nn_line_st(const nn_lines &l, int64_t base, int64_t i, float v)
{
    cu_enc((lpx_dtype)l.dt, (char *)l.p + (base + i * l.step) * cu_esize((lpx_dtype)l.dt), v, 0);
}

__global__ void __launch_bounds__(NN_THREADS) softmax_fwd(nn_lines x, nn_lines y, int64_t count, int64_t L)
{
    for (int64_t q = blockIdx.x; q < count; q += gridDim.x) {
        int64_t xb = cu_offset(x.lines, q), yb = cu_offset(y.lines, q);
        float m = -INFINITY;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) m = nn_max2(m, nn_line_ld(x, xb, i));
        m = nn_block_max(m);
        float s = 0.0f;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) s += expf(nn_line_ld(x, xb, i) - m);
        s = nn_block_sum(s);
        float inv = (float)(1.0 / (double)s);
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) nn_line_st(y, yb, i, expf(nn_line_ld(x, xb, i) - m) * inv);
    }
}

/* dx_i = y_i * (g_i - sum_j g_j y_j) */
__global__ void __launch_bounds__(NN_THREADS)
softmax_bwd(nn_lines g, nn_lines y, nn_lines gx, int64_t count, int64_t L)
{
    for (int64_t q = blockIdx.x; q < count; q += gridDim.x) {
        int64_t gb = cu_offset(g.lines, q), yb = cu_offset(y.lines, q), ob = cu_offset(gx.lines, q);
        float dot = 0.0f;
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) dot += nn_line_ld(g, gb, i) * nn_line_ld(y, yb, i);
        double d = (double)nn_block_sum(dot);
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
            float yi = nn_line_ld(y, yb, i), gi = nn_line_ld(g, gb, i);
            nn_line_st(gx, ob, i, (float)(yi * (gi - d)));
        }
    }
}

/* The contract (floating-point tensors of one shape, the dim and its
 * lines) is the dispatcher's: spec families `softmax` and
 * `softmax_backward` (op_args.h). */
static lpx_status k_softmax(lpx_call *c)
{
    const lpx_softmax_args *a = (const lpx_softmax_args *)lpx_op_args_of(c);
    lpx_tensor *x = a->x;
    int dim = a->dim;
    int64_t L = a->len, count = a->count;
    lpx_status st;
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(cu_op(c), dev))) return st;
    lpx_tensor *y;
    if ((st = cu_new(c, lpx_tensor_dtype(x), lpx_tensor_ndim(x), lpx_tensor_shape(x), dev, &y))) return st;
    if (count > 0) {
        softmax_fwd<<<nn_rows_grid(dev.index, count), NN_THREADS, 0, cu_stream(dev.index)>>>(
            nn_lines_of(x, dim), nn_lines_of(y, dim), count, L);
        if ((st = cu_launched(cu_op(c), "softmax_fwd"))) {
            lpx_tensor_release(y);
            return st;
        }
    }
    cu_ret(c, y);
    return LPX_OK;
}

static lpx_status k_softmax_backward(lpx_call *c)
{
    const lpx_softmax_backward_args *a = (const lpx_softmax_backward_args *)lpx_op_args_of(c);
    lpx_tensor *g = a->grad, *y = a->y;
    int dim = a->dim;
    int64_t L = a->len, count = a->count;
    lpx_status st;
    lpx_device dev = lpx_tensor_device(g);
    if ((st = cu_use(cu_op(c), dev))) return st;
    lpx_tensor *gx;
    if ((st = cu_new(c, lpx_tensor_dtype(g), lpx_tensor_ndim(g), lpx_tensor_shape(g), dev, &gx))) return st;
    if (count > 0) {
        softmax_bwd<<<nn_rows_grid(dev.index, count), NN_THREADS, 0, cu_stream(dev.index)>>>(
            nn_lines_of(g, dim), nn_lines_of(y, dim), nn_lines_of(gx, dim), count, L);
        if ((st = cu_launched(cu_op(c), "softmax_bwd"))) {
            lpx_tensor_release(gx);
            return st;
        }
    }
    cu_ret(c, gx);
    return LPX_OK;
}

/* ---- cross-entropy -------------------------------------------------- */

/* logits [N, C] as a 2-D strided operand */
struct nn_mat {
    const void *p;
    int dt;
    int64_t s0, s1;
};

static nn_mat nn_mat_of(const lpx_tensor *t)
{
    nn_mat m;
    m.p = lpx_tensor_data(t);
    m.dt = (int)lpx_tensor_dtype(t);
    m.s0 = lpx_tensor_strides(t)[0];
    m.s1 = lpx_tensor_strides(t)[1];
    return m;
}

__device__ __forceinline__ float nn_mat_ld(const nn_mat &m, int64_t r, int64_t i)
{
    return nn_ld_off(m.p, m.dt, r * m.s0 + i * m.s1);
}

/* Row max and sum of exp(v - max) of row n, every thread gets both. */
__device__ __forceinline__ void ce_row(const nn_mat &lg, int64_t n, int64_t C, float *m_out, float *s_out)
{
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) m = nn_max2(m, nn_mat_ld(lg, n, i));
    m = nn_block_max(m);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += expf(nn_mat_ld(lg, n, i) - m);
    *s_out = nn_block_sum(s);
    *m_out = m;
}

/* total += log(sum exp(v - max)) - (v[target] - max) over the rows kept */
__global__ void __launch_bounds__(NN_THREADS)
ce_fwd(nn_mat lg, nn_t tgt, int64_t N, int64_t C, int64_t ignore, double *total)
{
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int64_t t = nn_idx(tgt, n);
        if (t == ignore || t < 0 || t >= C) continue; /* uniform per block */
        float m, s;
        ce_row(lg, n, C, &m, &s);
        if (threadIdx.x == 0) {
            double shifted = (double)nn_mat_ld(lg, n, t) - m;
            atomicAdd(total, log((double)s) - shifted);
        }
    }
}

__global__ void ce_loss_final(const nn_acc *acc, void *out, int dt)
{
    double v = acc->count ? acc->total / (double)acc->count : 0.0;
    nn_st(out, dt, 0, (float)v);
}

/* grad / count * (softmax(row) - onehot(target)); ignored rows are 0 */
__global__ void __launch_bounds__(NN_THREADS)
ce_bwd(nn_mat lg, nn_t tgt, int64_t N, int64_t C, int64_t ignore, double grad, const nn_acc *acc, void *out)
{
    unsigned long long count = acc->count;
    double scale = count ? grad / (double)count : 0.0;
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int64_t t = nn_idx(tgt, n);
        if (t == ignore || t < 0 || t >= C) {
            for (int64_t i = threadIdx.x; i < C; i += blockDim.x) nn_st(out, lg.dt, n * C + i, 0.0f);
            continue;
        }
        float m, s;
        ce_row(lg, n, C, &m, &s);
        float k = (float)(scale / (double)s);
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
            float v = expf(nn_mat_ld(lg, n, i) - m) * k;
            if (i == t) v -= (float)scale;
            nn_st(out, lg.dt, n * C + i, v);
        }
    }
}

/* The contract (dtypes, shapes) is the dispatcher's: spec family
 * `cross_entropy` (op_args_nn.h). Targets out of range are data: checked
 * here, on the device (nn_scan_indices, nn_finish_indices). */
static lpx_status k_cross_entropy_any(lpx_call *c, bool backward)
{
    const lpx_cross_entropy_args *a = (const lpx_cross_entropy_args *)lpx_op_args_of(c);
    lpx_tensor *logits = a->logits, *target = a->target;
    int64_t ignore = a->ignore_index;
    double grad = a->grad;
    const char *op = cu_op(c);
    lpx_status st;
    int64_t N = a->n, C = a->classes;
    lpx_device dev = lpx_tensor_device(logits);
    if ((st = cu_use(op, dev))) return st;
    cudaStream_t s = cu_stream(dev.index);
    lpx_tensor *out = NULL;
    if (backward) st = cu_new(c, a->dtype, 2, lpx_tensor_shape(logits), dev, &out);
    else st = cu_new(c, a->dtype, 0, NULL, dev, &out);
    if (st) return st;
    nn_acc *acc;
    if ((st = nn_acc_new(c, dev.index, &acc))) {
        lpx_tensor_release(out);
        return st;
    }
    nn_t tg = nn_of(target);
    nn_mat lg = nn_mat_of(logits);
    const char *kernel = "nn_scan_indices";
    if (N > 0) nn_scan_indices<<<nn_grid(dev.index, N), NN_THREADS, 0, s>>>(tg, C, ignore, true, &acc->bad, &acc->count);
    st = N > 0 ? cu_launched(op, kernel) : LPX_OK;
    if (!st && !backward) {
        if (N > 0 && C > 0) {
            ce_fwd<<<nn_rows_grid(dev.index, N), NN_THREADS, 0, s>>>(lg, tg, N, C, ignore, &acc->total);
            st = cu_launched(op, kernel = "ce_fwd");
        }
        if (!st) {
            ce_loss_final<<<1, 1, 0, s>>>(acc, lpx_tensor_data(out), (int)lpx_tensor_dtype(out));
            st = cu_launched(op, "ce_loss_final");
        }
    } else if (!st && N > 0 && C > 0) {
        ce_bwd<<<nn_rows_grid(dev.index, N), NN_THREADS, 0, s>>>(lg, tg, N, C, ignore, grad, acc, lpx_tensor_data(out));
        st = cu_launched(op, "ce_bwd");
    }
    lpx_status st2 = nn_finish_indices(c, dev.index, acc, target, C, true, ignore);
    if (!st) st = st2;
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    cu_ret(c, out);
    return LPX_OK;
}

static lpx_status k_cross_entropy(lpx_call *c) { return k_cross_entropy_any(c, false); }
static lpx_status k_cross_entropy_backward(lpx_call *c) { return k_cross_entropy_any(c, true); }

/* ---- MSE loss ------------------------------------------------------- */

__global__ void __launch_bounds__(NN_THREADS) mse_sum(nn_t a, nn_t b, double *total)
{
    float s = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.g.numel; i += (int64_t)gridDim.x * blockDim.x) {
        float d = nn_ld(a, i) - nn_ld(b, i);
        s += d * d;
    }
    s = nn_block_sum(s);
    if (threadIdx.x == 0) atomicAdd(total, (double)s);
}

__global__ void mse_final(const nn_acc *acc, int64_t n, void *out, int dt)
{
    nn_st(out, dt, 0, (float)(acc->total / (double)n)); /* 0 / 0 = NaN, as on the CPU */
}

/* d(grad * mean((a-b)^2))/da = 2 * grad * (a - b) / n, the CPU's double
 * expression */
__global__ void mse_bwd(nn_t a, nn_t b, double k, void *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.g.numel; i += (int64_t)gridDim.x * blockDim.x)
        nn_st(out, a.dt, i, (float)(k * ((double)nn_ld(a, i) - (double)nn_ld(b, i))));
}

/* The contract (float dtypes, one shape) is the dispatcher's: spec
 * family `mse_loss` (op_args_nn.h). */
static lpx_status k_mse_loss(lpx_call *c)
{
    const lpx_mse_loss_args *m = (const lpx_mse_loss_args *)lpx_op_args_of(c);
    lpx_tensor *a = m->a, *b = m->b;
    const char *op = cu_op(c);
    lpx_status st;
    lpx_device dev = lpx_tensor_device(a);
    if ((st = cu_use(op, dev))) return st;
    cudaStream_t s = cu_stream(dev.index);
    lpx_tensor *out;
    if ((st = cu_new(c, lpx_tensor_dtype(a), 0, NULL, dev, &out))) return st;
    nn_acc *acc;
    if ((st = nn_acc_new(c, dev.index, &acc))) {
        lpx_tensor_release(out);
        return st;
    }
    int64_t n = lpx_tensor_numel(a);
    if (n > 0) {
        mse_sum<<<nn_grid(dev.index, n), NN_THREADS, 0, s>>>(nn_of(a), nn_of(b), &acc->total);
        st = cu_launched(op, "mse_sum");
    }
    if (!st) {
        mse_final<<<1, 1, 0, s>>>(acc, n, lpx_tensor_data(out), (int)lpx_tensor_dtype(a));
        st = cu_launched(op, "mse_final");
    }
    cu_scratch_free(dev.index, acc, sizeof(nn_acc));
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    cu_ret(c, out);
    return LPX_OK;
}

static lpx_status k_mse_loss_backward(lpx_call *c)
{
    const lpx_mse_loss_args *m = (const lpx_mse_loss_args *)lpx_op_args_of(c);
    lpx_tensor *a = m->a, *b = m->b;
    double grad = m->grad;
    lpx_status st;
    lpx_device dev = lpx_tensor_device(a);
    if ((st = cu_use(cu_op(c), dev))) return st;
    lpx_tensor *ga;
    if ((st = cu_new(c, lpx_tensor_dtype(a), lpx_tensor_ndim(a), lpx_tensor_shape(a), dev, &ga))) return st;
    int64_t n = lpx_tensor_numel(a);
    if (n > 0) {
        double k = 2.0 * grad / (double)n;
        mse_bwd<<<nn_grid(dev.index, n), NN_THREADS, 0, cu_stream(dev.index)>>>(nn_of(a), nn_of(b), k,
                                                                                 lpx_tensor_data(ga));
        if ((st = cu_launched(cu_op(c), "mse_bwd"))) {
            lpx_tensor_release(ga);
            return st;
        }
    }
    cu_ret(c, ga);
    return LPX_OK;
}

/* ---- embedding ------------------------------------------------------ */

/* out[i, j] = weight[idx[i], j], byte for byte (es bytes per element);
 * rows with a bad index are left alone (the call fails). */
__global__ void emb_fwd(const char *w, int64_t ws0, int64_t ws1, int es, nn_t idx, int64_t V, int64_t D, char *out)
{
    int64_t total = idx.g.numel * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / D, j = e - i * D, t = nn_idx(idx, i);
        if (t < 0 || t >= V) continue;
        const char *src = w + (t * ws0 + j * ws1) * es;
        char *dst = out + e * es;
        switch (es) {
        case 8: *(uint64_t *)dst = *(const uint64_t *)src; break;
        case 4: *(uint32_t *)dst = *(const uint32_t *)src; break;
        case 2: *(uint16_t *)dst = *(const uint16_t *)src; break;
        default: *dst = *src; break;
        }
    }
}

/* The contracts of embedding and its backward (dtypes, shapes) are the
 * dispatcher's: spec families `embedding`, `embedding_backward`
 * (op_args_nn.h). Indices out of range are data: checked here, on the
 * device (nn_scan_indices, nn_finish_indices). */
static lpx_status k_embedding(lpx_call *c)
{
    const lpx_embedding_args *a = (const lpx_embedding_args *)lpx_op_args_of(c);
    lpx_tensor *w = a->weight, *idx = a->indices;
    const char *op = cu_op(c);
    lpx_status st;
    int64_t V = a->num, D = a->dim, ni = lpx_tensor_numel(idx);
    lpx_device dev = lpx_tensor_device(w);
    if ((st = cu_use(op, dev))) return st;
    cudaStream_t s = cu_stream(dev.index);
    lpx_tensor *out;
    if ((st = cu_new(c, lpx_tensor_dtype(w), a->out_ndim, a->out_shape, dev, &out))) return st;
    if (ni == 0) {
        cu_ret(c, out);
        return LPX_OK;
    }
    nn_acc *acc;
    if ((st = nn_acc_new(c, dev.index, &acc))) {
        lpx_tensor_release(out);
        return st;
    }
    nn_t ti = nn_of(idx);
    nn_scan_indices<<<nn_grid(dev.index, ni), NN_THREADS, 0, s>>>(ti, V, 0, false, &acc->bad, NULL);
    st = cu_launched(op, "nn_scan_indices");
    if (!st && D > 0) {
        emb_fwd<<<nn_grid(dev.index, ni * D), NN_THREADS, 0, s>>>(
            (const char *)lpx_tensor_data(w), lpx_tensor_strides(w)[0], lpx_tensor_strides(w)[1],
            cu_esize(lpx_tensor_dtype(w)), ti, V, D, (char *)lpx_tensor_data(out));
        st = cu_launched(op, "emb_fwd");
    }
    lpx_status st2 = nn_finish_indices(c, dev.index, acc, idx, V, false, 0);
    if (!st) st = st2;
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    cu_ret(c, out);
    return LPX_OK;
}

/* acc[idx[i], j] += grad[i, j] in f32 (atomics: the order of the adds is
 * not fixed) */
__global__ void emb_bwd(nn_t g, nn_t idx, int64_t V, int64_t D, float *acc)
{
    int64_t total = idx.g.numel * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / D, j = e - i * D, t = nn_idx(idx, i);
        if (t < 0 || t >= V) continue;
        atomicAdd(&acc[t * D + j], nn_ld(g, e));
    }
}

static lpx_status k_embedding_backward(lpx_call *c)
{
    const lpx_embedding_backward_args *a = (const lpx_embedding_backward_args *)lpx_op_args_of(c);
    lpx_tensor *g = a->grad, *idx = a->indices;
    int64_t V = a->num_weights, D = a->dim;
    const char *op = cu_op(c);
    lpx_status st;
    int64_t ni = lpx_tensor_numel(idx);
    lpx_device dev = lpx_tensor_device(g);
    if ((st = cu_use(op, dev))) return st;
    cudaStream_t s = cu_stream(dev.index);
    lpx_dtype dt = lpx_tensor_dtype(g);
    int64_t oshape[2] = {V, D};
    lpx_tensor *out;
    if ((st = cu_new(c, dt, 2, oshape, dev, &out))) return st;
    int64_t n = V * D;
    size_t accb = (size_t)(n ? n : 1) * sizeof(float);
    bool direct = dt == LPX_F32;
    float *acc = NULL;
    nn_acc *chk = NULL;
    cudaError_t e;
    /* the zero-filled result (0 bits are +0 in every float dtype) */
    if (n > 0 && (e = cudaMemsetAsync(lpx_tensor_data(out), 0, (size_t)n * cu_esize(dt), s)) != cudaSuccess) {
        st = cu_fail(e, op, "cudaMemsetAsync(result)");
        goto done;
    }
    if (ni == 0) goto done;
    if ((st = nn_acc_new(c, dev.index, &chk))) goto done;
    {
        nn_t ti = nn_of(idx);
        nn_scan_indices<<<nn_grid(dev.index, ni), NN_THREADS, 0, s>>>(ti, V, 0, false, &chk->bad, NULL);
        st = cu_launched(op, "nn_scan_indices");
        if (!st && n > 0) {
            acc = direct ? (float *)lpx_tensor_data(out) : (float *)cu_scratch_alloc(dev.index, accb);
            if (!acc) {
                st = lpx_error(LPX_ENOMEM, "embedding_backward: cannot allocate the [%lld, %lld] accumulator",
                               (long long)V, (long long)D);
            } else if (!direct && (e = cudaMemsetAsync(acc, 0, accb, s)) != cudaSuccess) {
                st = cu_fail(e, op, "cudaMemsetAsync(accumulator)");
            } else {
                emb_bwd<<<nn_grid(dev.index, ni * D), NN_THREADS, 0, s>>>(nn_of(g), ti, V, D, acc);
                st = cu_launched(op, "emb_bwd");
                if (!st && !direct) {
                    nn_encode<<<nn_grid(dev.index, n), NN_THREADS, 0, s>>>(acc, lpx_tensor_data(out), (int)dt, n);
                    st = cu_launched(op, "nn_encode");
                }
            }
        }
        lpx_status st2 = nn_finish_indices(c, dev.index, chk, idx, V, false, 0);
        if (!st) st = st2;
    }
done:
    if (acc && !direct) cu_scratch_free(dev.index, acc, accb);
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    cu_ret(c, out);
    return LPX_OK;
}

extern "C" lpx_status cu_register_nn(const lpx_host *h)
{
#define R(op) {LPX_OP_##op, k_##op}
    static const struct {
        lpx_op op;
        lpx_kernel_fn fn;
    } ks[] = {
        R(rmsnorm), R(rmsnorm_backward), R(softmax), R(softmax_backward), R(cross_entropy),
        R(cross_entropy_backward), R(mse_loss), R(mse_loss_backward), R(embedding), R(embedding_backward),
    };
#undef R
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        lpx_status st = cu_reg(h, ks[i].op, ks[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
