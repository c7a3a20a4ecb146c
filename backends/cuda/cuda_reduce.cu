/* Kernel group reduce: sum, mean, max, amax (max |x|) and the L2 norm over
 * all dims or any set of dims, with keepdim; the CPU backend's semantics
 * (backends/cpu/reduce.c): elements decoded to f32 and folded in double,
 * mean = acc / count and norm = sqrt(acc) in double, the result rounded to
 * f32 and stored in x's dtype. Reductions of zero elements: sum 0, mean
 * NaN, norm 0; max and amax refuse them. max lets NaN win.
 *
 * Scheme: x's dims split into kept dims (the output's, in order) and
 * reduced dims, each a cu_geom over x's strides (adjacent dims merged when
 * their strides allow, so a contiguous block of reduced dims is indexed
 * with one multiply). Output element o and the reduced range
 * [split * chunk, ...) are reduced by one block: a strided loop per
 * thread (16-byte loads when each output's reduced elements are one
 * aligned contiguous run of f32/f16/bf16), then a tree in shared memory.
 * With few outputs and many
 * elements each output gets several blocks (a y grid of splits) whose
 * partial results go to a scratch buffer and are combined, in split
 * order, by a second kernel. The order of additions differs from the
 * CPU's, so sum/mean/norm may differ in the last bits; max/amax are exact. */
#include <math.h>
#include <string.h>
#include "cuda_dtype.cuh"

#define CU_RED_THREADS 256
#define CU_RED_MAX_SPLITS 1024

#define RED_CODE(op, N) RED_##N,
enum { LPX_REDUCE_OPS(RED_CODE) };   /* op_args_elementwise.h */

/* ---- device folds ----------------------------------------------------- */

/* max that lets NaN win: once acc is NaN it stays NaN */
__device__ __forceinline__ double fold_max(double acc, double v) { return (v > acc || v != v) ? v : acc; }

template <int K> __device__ __forceinline__ double red_init() { return K == RED_MAX ? -INFINITY : 0.0; }

/* folds one element */
template <int K> __device__ __forceinline__ double red_fold(double acc, float v)
{
    switch (K) {
    case RED_MAX: return fold_max(acc, (double)v);
    case RED_AMAX: return fold_max(acc, fabs((double)v));
    case RED_NORM: return acc + (double)v * v;
    default: return acc + (double)v; /* sum, mean */
    }
}

/* combines two partial results */
template <int K> __device__ __forceinline__ double red_combine(double a, double b)
{
    return K == RED_MAX || K == RED_AMAX ? fold_max(a, b) : a + b;
}

template <int K> __device__ __forceinline__ void red_store(char *out, lpx_dtype dt, int64_t o, double r, int64_t count)
{
    if (K == RED_MEAN) r = r / (double)count; /* 0/0 = NaN for an empty mean */
    else if (K == RED_NORM) r = sqrt(r);
    cu_enc(dt, out + o * cu_esize(dt), (float)r, 0);
}

/* Element offset of index i over g: one multiply for a 1-d geometry. */
__device__ __forceinline__ int64_t red_offset(const cu_geom &g, int64_t i)
{
    return g.ndim == 1 ? i * g.strides[0] : cu_offset(g, i);
}

/* Block (o, split): reduces x over reduced indices [split * chunk, ...)
 * for outputs o = blockIdx.x, blockIdx.x + gridDim.x, ...; writes the
 * finished value to out (nsplit == 1) or the partial to
 * partial[o * nsplit + split]. */
template <int K>
__global__ void __launch_bounds__(CU_RED_THREADS) k_reduce(const char *x, lpx_dtype dt, cu_geom gk, cu_geom gr,
                                                           int64_t nout, int64_t count, int64_t chunk, int nsplit,
                                                           double *partial, char *out)
{
    __shared__ double sh[CU_RED_THREADS];
    const int es = cu_esize(dt);
    const int64_t r0 = (int64_t)blockIdx.y * chunk;
    const int64_t r1 = r0 + chunk < count ? r0 + chunk : count;
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        const int64_t base = red_offset(gk, o);
        double acc = red_init<K>();
        for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x)
            acc = red_fold<K>(acc, cu_dec(dt, x + (base + red_offset(gr, r)) * es));
        sh[threadIdx.x] = acc;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) sh[threadIdx.x] = red_combine<K>(sh[threadIdx.x], sh[threadIdx.x + s]);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            if (nsplit == 1) red_store<K>(out, dt, o, sh[0], count);
            else partial[o * nsplit + blockIdx.y] = sh[0];
        }
        __syncthreads(); /* sh is reused by the next output */
    }
}

template <int DT> struct cu_red_storage { typedef uint16_t T; };
template <> struct cu_red_storage<LPX_F32> { typedef float T; };

/* k_reduce when the reduced elements of each output are one contiguous
 * run (gr: 1-d, stride 1) of f32/f16/bf16 and every run starts 16-byte
 * aligned (chunk a multiple of the vector): 16-byte loads. */
template <int K, int DT>
__global__ void __launch_bounds__(CU_RED_THREADS) k_reduce_vec(const char *x, cu_geom gk, int64_t nout,
                                                               int64_t count, int64_t chunk, int nsplit,
                                                               double *partial, char *out)
{
    typedef typename cu_red_storage<DT>::T T;
    constexpr int VE = 16 / (int)sizeof(T);
    union U { uint4 v; T e[VE]; };
    __shared__ double sh[CU_RED_THREADS];
    const lpx_dtype dt = (lpx_dtype)DT;
    const int64_t r0 = (int64_t)blockIdx.y * chunk;
    const int64_t r1 = r0 + chunk < count ? r0 + chunk : count;
    const int64_t nv = r1 > r0 ? (r1 - r0) / VE : 0;
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        const T *row = (const T *)x + red_offset(gk, o);
        const uint4 *vp = (const uint4 *)(row + r0);
        double acc = red_init<K>();
        for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
            U u;
            u.v = vp[k];
#pragma unroll
            for (int j = 0; j < VE; j++) acc = red_fold<K>(acc, cu_dec(dt, &u.e[j]));
        }
        for (int64_t r = r0 + nv * VE + threadIdx.x; r < r1; r += blockDim.x) acc = red_fold<K>(acc, cu_dec(dt, &row[r]));
        sh[threadIdx.x] = acc;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) sh[threadIdx.x] = red_combine<K>(sh[threadIdx.x], sh[threadIdx.x + s]);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            if (nsplit == 1) red_store<K>(out, dt, o, sh[0], count);
            else partial[o * nsplit + blockIdx.y] = sh[0];
        }
        __syncthreads(); /* sh is reused by the next output */
    }
}

/* One thread per output: combines its nsplit partials in order. */
template <int K>
__global__ void k_reduce_final(const double *partial, int nsplit, int64_t nout, int64_t count, char *out,
                               lpx_dtype dt)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < nout; o += stride) {
        double acc = partial[o * nsplit];
        for (int s = 1; s < nsplit; s++) acc = red_combine<K>(acc, partial[o * nsplit + s]);
        red_store<K>(out, dt, o, acc, count);
    }
}

/* ---- plan ------------------------------------------------------------- */

/* The reduction's geometry (the dims folded, the output's shape, the
 * count): the dispatcher's, spec family `reduce` (op_args_elementwise.h),
 * the contract every backend shares. */
typedef lpx_reduce_geom red_plan;

/* Geometry of x's dims with reduced[d] == want, in order. */
static void sub_geom(cu_geom *g, const lpx_tensor *x, const red_plan *p, bool want)
{
    memset(g, 0, sizeof *g);
    g->numel = 1;
    for (int d = 0; d < lpx_tensor_ndim(x); d++) {
        if (p->reduced[d] != want) continue;
        g->shape[g->ndim] = lpx_tensor_shape(x)[d];
        g->strides[g->ndim] = lpx_tensor_strides(x)[d];
        g->numel *= g->shape[g->ndim];
        g->ndim++;
    }
}

/* Drops size-1 dims and merges dim d into d+1 where
 * strides[d] == strides[d+1] * shape[d+1]; the row-major order of the
 * indices, and so every offset, is unchanged. */
static void coalesce(cu_geom *g)
{
    if (g->numel == 0) return;
    int n = 0;
    for (int d = 0; d < g->ndim; d++) {
        if (g->shape[d] == 1) continue;
        if (n > 0 && g->strides[n - 1] == g->strides[d] * g->shape[d]) {
            g->shape[n - 1] *= g->shape[d];
            g->strides[n - 1] = g->strides[d];
            continue;
        }
        g->shape[n] = g->shape[d];
        g->strides[n] = g->strides[d];
        n++;
    }
    for (int d = n; d < g->ndim; d++) g->shape[d] = 0, g->strides[d] = 0;
    g->ndim = n;
}

/* ---- launch ----------------------------------------------------------- */

/* Elements per 16-byte vector when k_reduce_vec applies, else 0. */
static int vec_width(const char *xp, lpx_dtype dt, const cu_geom *gk, const cu_geom *gr)
{
    if (dt != LPX_F32 && dt != LPX_F16 && dt != LPX_BF16) return 0;
    if (gr->ndim != 1 || gr->strides[0] != 1 || ((uintptr_t)xp & 15u)) return 0;
    int es = dt == LPX_F32 ? 4 : 2;
    for (int d = 0; d < gk->ndim; d++) /* every run starts aligned */
        if ((gk->strides[d] * es) % 16) return 0;
    return 16 / es;
}

template <int K>
static lpx_status launch(const char *op, const lpx_tensor *x, const red_plan *p, lpx_tensor *out)
{
    int dev = lpx_tensor_device(x).index;
    cudaStream_t stream = cu_stream(dev);
    cu_geom gk, gr;
    sub_geom(&gk, x, p, false);
    sub_geom(&gr, x, p, true);
    coalesce(&gk);
    coalesce(&gr);
    const char *xp = (const char *)lpx_tensor_data(x);
    lpx_dtype dt = lpx_tensor_dtype(x);
    int64_t nout = p->out_numel, count = p->count;
    int ve = vec_width(xp, dt, &gk, &gr);
    /* splits: enough blocks to fill the device when outputs are few, each
     * block still folding at least 4 elements per thread */
    int64_t target = (int64_t)cu_sm_count(dev) * 8;
    int64_t per_block = (int64_t)CU_RED_THREADS * 4;
    int64_t nsplit = nout >= target ? 1 : (target + nout - 1) / nout;
    int64_t max_by_work = (count + per_block - 1) / per_block;
    if (nsplit > max_by_work) nsplit = max_by_work;
    if (nsplit > CU_RED_MAX_SPLITS) nsplit = CU_RED_MAX_SPLITS;
    if (nsplit < 1) nsplit = 1;
    int64_t chunk = count > 0 ? (count + nsplit - 1) / nsplit : 0;
    if (ve) chunk = (chunk + ve - 1) / ve * ve; /* splits start on a vector */
    if (chunk > 0) nsplit = (count + chunk - 1) / chunk; /* no empty splits */
    unsigned gx = (unsigned)(nout < 65535 * 32 ? nout : 65535 * 32);
    dim3 grid(gx, (unsigned)nsplit);
    char *outp = (char *)lpx_tensor_data(out);
    double *partial = NULL;
    size_t pbytes = nsplit > 1 ? (size_t)(nout * nsplit) * sizeof(double) : 0;
    if (nsplit > 1 && !(partial = (double *)cu_scratch_alloc(dev, pbytes)))
        return lpx_error(LPX_ENOMEM, "%s: cannot allocate %zu bytes of partial results on cuda:%d", op, pbytes, dev);
    int ns = (int)nsplit;
    switch (ve) {
    case 4: k_reduce_vec<K, LPX_F32><<<grid, CU_RED_THREADS, 0, stream>>>(xp, gk, nout, count, chunk, ns, partial, outp); break;
    case 8:
        if (dt == LPX_F16)
            k_reduce_vec<K, LPX_F16><<<grid, CU_RED_THREADS, 0, stream>>>(xp, gk, nout, count, chunk, ns, partial, outp);
        else
            k_reduce_vec<K, LPX_BF16><<<grid, CU_RED_THREADS, 0, stream>>>(xp, gk, nout, count, chunk, ns, partial, outp);
        break;
    default: k_reduce<K><<<grid, CU_RED_THREADS, 0, stream>>>(xp, dt, gk, gr, nout, count, chunk, ns, partial, outp); break;
    }
    lpx_status st = cu_launched(op, ve ? "k_reduce_vec" : "k_reduce");
    if (!st && nsplit > 1) {
        k_reduce_final<K><<<cu_blocks(dev, nout, CU_RED_THREADS), CU_RED_THREADS, 0, stream>>>(partial, ns, nout, count,
                                                                                           outp, dt);
        st = cu_launched(op, "k_reduce_final");
    }
    if (partial) cu_scratch_free(dev, partial, pbytes); /* stream-ordered: after the kernels */
    return st;
}

static lpx_status reduce_kernel(lpx_call *c, int k)
{
    const char *op = cu_op(c);
    const lpx_reduce_args *a = (const lpx_reduce_args *)lpx_op_args_of(c);
    lpx_tensor *x = a->x;
    const red_plan *p = &a->g;
    /* lpx-cuda's own limit: code for the built-in dtypes */
    lpx_status st = cu_builtin_dtype(c, "x", x);
    if (st) return st;
    lpx_tensor *out;
    if ((st = cu_new(c, lpx_tensor_dtype(x), p->out_ndim, p->out_shape, lpx_tensor_device(x), &out))) return st;
    if (p->out_numel > 0) {
        if (!(st = cu_use(op, lpx_tensor_device(x)))) {
            switch (k) {
            case RED_SUM: st = launch<RED_SUM>(op, x, p, out); break;
            case RED_MEAN: st = launch<RED_MEAN>(op, x, p, out); break;
            case RED_MAX: st = launch<RED_MAX>(op, x, p, out); break;
            case RED_AMAX: st = launch<RED_AMAX>(op, x, p, out); break;
            default: st = launch<RED_NORM>(op, x, p, out); break;
            }
        }
        if (st) {
            lpx_tensor_release(out);
            return st;
        }
    }
    cu_ret(c, out);
    return LPX_OK;
}

#define K_REDUCE(op, N) static lpx_status k_##op(lpx_call *c) { return reduce_kernel(c, RED_##N); }
LPX_REDUCE_OPS(K_REDUCE)

extern "C" lpx_status cu_register_reduce(const lpx_host *h)
{
    lpx_status st;
#define REG(op, N) if ((st = cu_reg(h, LPX_OP_##op, k_##op))) return st;
    LPX_REDUCE_OPS(REG)
#undef REG
    return LPX_OK;
}
