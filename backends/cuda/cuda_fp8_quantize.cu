/* fp8_quantize on the GPU: output shapes, the
 * per-device statistics workspace, the tensorwise kernels (k_tw_amax,
 * k_tw_cast) and the choice of path for the other layouts, whose kernels
 * live in cuda_fp8_rowwise.cu. Also the registration of the float8 group
 * (cu_register_float8): the encoder thresholds and the workspaces it sets
 * up belong to the quantize. Split from the former cuda_float8.cu so that
 * each file has one job; what the float8 files share is in cuda_fp8.cuh,
 * fp8_dequantize and fp8_scale_from_amax are in cuda_fp8_dequantize.cu.
 *
 * The float8 kernels (this file, cuda_fp8_rowwise.cu,
 * cuda_fp8_dequantize.cu) implement the dense float8 ops (ops_float8.def):
 * fused quantize, dequantize and the scale formula; fp8_scaled_mm lives
 * with the GEMMs (cuda_gemm_fp8.c). Same output shapes and bits as the
 * CPU kernels of backends/cpu/float8.c (the argument checks are the
 * dispatcher's, spec families of op_args_lowp.h), which are the
 * reference (tests/gpu/test_cuda_lowp.c compares every result bit for bit).
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
 *    f32); rows up to 16384 elements: k_rows_regs, a block per row, the
 *    row held in registers between the amax and the cast (read once);
 *    longer rows: k_rows, which reads them again (from L2);
 *  - columns (inner dims after the reduced one), x contiguous, inner a
 *    multiple of 8: k_cols_amax (tiles of 32 vectors x 256 rows, a block
 *    reduction, one atomicMax per column), k_cols_scale, k_cols_cast;
 *  - anything else (strided x, other dtypes, odd widths): k_rows with any
 *    layout, or k_groups, one thread per scale group.
 * The amax is an unsigned max over the f32 bits with the sign cleared:
 * for non-negative floats the integer order is the float order and NaN
 * sorts above inf, exactly as on the CPU.
 *
 * Errors that depend on the data cannot be returned without waiting for
 * the device, so the CUDA kernels poison instead of failing: a dynamic
 * scale group whose amax is NaN or inf (the CPU fails with LPX_ENUMERIC),
 * and an invalid static scale that lives on the device (<= 0, inf, NaN:
 * the CPU fails with LPX_EINVAL), give scale = scale_inv = NaN and NaN
 * codes for the group. A static scale on the CPU is checked on the host
 * exactly as the CPU kernel does. fp8_scale_from_amax poisons a non-finite
 * amax likewise. */
#include <math.h>
#include <mutex>
#include <stdlib.h>
#include <string.h>
#include "cuda_fp8.cuh"

using namespace cu_f8;

namespace {

/* ---- encoder thresholds ----------------------------------------------- */

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

/* ---- per-device workspace ------------------------------------------ */

/* The F8Work counters of each device (cuda_fp8.cuh) and the mutex that
 * serializes the quantize calls on it. */
F8Work *g_work[CU_MAX_DEVICES];
std::mutex g_work_mutex[CU_MAX_DEVICES];

/* ---- tensorwise: amax pass ------------------------------------------- */


template <int IN> __global__ void __launch_bounds__(256) k_tw_amax(TwArgs a)
{
    cu_pdl_wait();
    cu_pdl_trigger();
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
    cu_pdl_wait();
    cu_pdl_trigger();
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

/* ---- launch helpers ---------------------------------------------------- */

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
    bool pdl = cu_pdl(dev);
    int64_t want = ((a.nvec + 1) / 2 + (a.n - a.nvec * 8) + 255) / 256;
    if (dynamic) {
        (void)cu_launch(k_tw_amax<IN>, grid_for<k_tw_amax<IN>>(dev, want), 256, st, pdl, a);
        lpx_status s = cu_launched(op, "k_tw_amax");
        if (s) return s;
    }
    if (e5) (void)cu_launch(k_tw_cast<IN, true>, grid_for<k_tw_cast<IN, true>>(dev, want), 256, st, pdl, a);
    else (void)cu_launch(k_tw_cast<IN, false>, grid_for<k_tw_cast<IN, false>>(dev, want), 256, st, pdl, a);
    return cu_launched(op, "k_tw_cast");
}

/* ---- fp8_quantize ---------------------------------------------------- */

/* A static scale on the CPU is read here, checked value by value (finite
 * and > 0, as the CPU kernel's read_static_scale: a check that reads data,
 * so the kernel's) and returned in host_vals (malloc, ns floats); a scale
 * on x's device is left to the kernels. Its dtype and shape are the
 * spec's (family `fp8_quantize`). */
lpx_status static_scale_arg(const lpx_call *c, const lpx_tensor *st, int64_t ns, float **host_vals)
{
    const char *op = cu_op(c);
    *host_vals = NULL;
    if (lpx_tensor_device(st).type != LPX_DEVICE_CPU) return LPX_OK;
    lpx_status e;
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
    const lpx_fp8_quantize_args *args = (const lpx_fp8_quantize_args *)lpx_op_args_of(c);
    lpx_tensor *x = args->x, *sarg = args->scale;
    lpx_dtype fp8 = args->fp8;
    bool pow2 = args->pow2, sat = args->saturate;
    double scale_max = args->scale_max;
    const char *op = cu_op(c);
    lpx_status st;
    const lpx_fp8_quant_geom g = args->g;
    /* the contract is the dispatcher's (spec family `fp8_quantize`); a
     * scale on the host is read there, one on the device decoded here */
    bool scale_on_device = sarg && lpx_tensor_device(sarg).type != LPX_DEVICE_CPU;
    if ((st = cu_builtin_dtype(c, "x", x)) || (scale_on_device && (st = cu_builtin_dtype(c, "scale", sarg)))) return st;
    int ndim = lpx_tensor_ndim(x);
    const int64_t *shape = lpx_tensor_shape(x);
    int sndim = g.scale_ndim;
    const int64_t *sshape = g.scale_shape;
    int64_t numel = lpx_tensor_numel(x), outer = g.outer, D = g.D, inner = g.inner;
    int64_t G = g.groups;
    bool one_group = g.tensorwise;
    lpx_device dev = lpx_tensor_device(x);
    float *host_scale = NULL;
    if (sarg && (st = static_scale_arg(c, sarg, G, &host_scale))) return st;
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
                st = cu_f8_launch_rows(op, di, a, ik, e5, nv);
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
                st = cu_f8_launch_cols(op, di, a, ik, e5);
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
                st = cu_f8_launch_groups(op, di, a, e5);
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

} // namespace

lpx_status cu_f8_launch_tw_amax(const char *op, int dev, TwArgs &a, int ik)
{
    int64_t want = ((a.nvec + 1) / 2 + (a.n - a.nvec * 8) + 255) / 256;
    cudaStream_t st = cu_stream(dev);
    bool pdl = cu_pdl(dev);
    if (ik == IN_BF16) (void)cu_launch(k_tw_amax<IN_BF16>, grid_for<k_tw_amax<IN_BF16>>(dev, want), 256, st, pdl, a);
    else if (ik == IN_F16) (void)cu_launch(k_tw_amax<IN_F16>, grid_for<k_tw_amax<IN_F16>>(dev, want), 256, st, pdl, a);
    else if (ik == IN_F32) (void)cu_launch(k_tw_amax<IN_F32>, grid_for<k_tw_amax<IN_F32>>(dev, want), 256, st, pdl, a);
    else (void)cu_launch(k_tw_amax<IN_ANY>, grid_for<k_tw_amax<IN_ANY>>(dev, want), 256, st, pdl, a);
    return cu_launched(op, "k_tw_amax");
}

F8Fmt cu_f8_fmt(bool e5, bool saturate)
{
    F8Fmt f = {saturate ? 1 : 0, g_over[e5], g_zero[e5]};
    return f;
}

F8Work *cu_f8_work_lock(int dev)
{
    g_work_mutex[dev].lock();
    return g_work[dev];
}

void cu_f8_work_unlock(int dev) { g_work_mutex[dev].unlock(); }

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
    if ((st = cu_reg(h, LPX_OP_fp8_quantize, k_fp8_quantize)) || (st = cu_f8_register_transpose(h))) return st;
    if ((st = cu_f8_register_dequantize(h))) return st;
    return cu_f8_register_block(h);
}
