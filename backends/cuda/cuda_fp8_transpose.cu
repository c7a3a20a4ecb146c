/* fp8_quantize_t on the GPU (ops_float8.def): x [R, C] and x^T [C, R]
 * quantized from one read of x, the cast + transpose that lets every GEMM
 * of a Float8Linear step read its fp8 operands in place (cuBLASLt's fp8
 * kernels take K-major operands only).
 *
 * Served here: x contiguous bf16/f16/f32 on a 16-byte boundary, C % 8 == 0
 * and R % 16 == 0 (x^T's rows are written as 16-byte vectors), R, C > 0;
 * everything else goes to the device-generic composition the CPU backend
 * registered (backends/cpu/float8_transpose.c: two fp8_quantize calls,
 * same bits). The arguments are checked before either, by the dispatcher
 * (spec family `fp8_quantize`, op_args_lowp.h).
 *
 * Kernels, per 128 x 64 tile of x (256 threads; thread (rb, cv) holds rows
 * 4rb..4rb+3 and columns 8cv..8cv+7 of the tile: four 16-byte loads):
 *  - k_t_cast<IN, E5, PER>: encodes its 4 x 8 values for q (written as
 *    four 8-byte row stores) and for qt: tensorwise the same codes,
 *    axiswise the codes with the column scales; transposes its 4 x 8 code
 *    block in registers (byte permutes) into 8 words of 4 rows each,
 *    stores them in a 64 x 32-word shared tile whose word index is XOR-
 *    swizzled by the column's group of 8 (no bank conflicts on the store,
 *    16-byte rows on the load), and writes qt's 64 rows of 128 bytes as
 *    16-byte vectors. Statistics of q as fp8_quantize's (f8_finish).
 *  - tensorwise dynamic: fp8_quantize's amax pass first (k_tw_amax, whose
 *    last block writes the scale), then k_t_cast reading it: x is read
 *    twice, q and qt written once (3 passes of bytes in all).
 *  - axiswise: k_t_amax takes the row and the column amaxes of a tile in
 *    one pass (a row's max over 8 lanes by shuffles, a column's over the
 *    block through shared memory; one atomicMax per row and column per
 *    tile, into the scale outputs used as u32 scratch), k_t_scales turns
 *    them into scales in place, k_t_cast<PER> encodes.
 * The amaxes are unsigned maxima over the f32 bits with the sign cleared,
 * as in every quantize here (NaN above inf); a NaN or infinite amax
 * poisons its group's scale (the CPU fails with LPX_ENUMERIC instead). */
#include <math.h>
#include <string.h>
#include "cuda_fp8.cuh"

using namespace cu_f8;

namespace {

constexpr int TR = 128, TC = 64;  /* tile of x: rows, columns */

struct TArgs {
    const char *x;
    int64_t R, C, tiles_c;
    uint8_t *q, *qt;
    int smode;                    /* tensorwise: 0 sval, 1 device scale at sp, 2 scale_out[0] (dynamic) */
    float sval;
    const void *sp;
    lpx_dtype sdt;
    float *scale_out, *scale_inv_out;      /* q: [1] or [R] */
    float *scale_t_out, *scale_inv_t_out;  /* qt: [1] or [C] */
    float *stats;
    F8Work *ws;
    F8Fmt fmt;
    F8ScaleP sp8;
};

/* 4 rows x 8 codes (row i: lo[i] = columns 0-3, hi[i] = columns 4-7) ->
 * 8 words, word k = column k's codes of rows 0..3 (row 0 in byte 0). */
__device__ __forceinline__ void transpose4x8(const uint32_t (&lo)[4], const uint32_t (&hi)[4], uint32_t (&w)[8])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t *v = h ? hi : lo;
        uint32_t a01 = __byte_perm(v[0], v[1], 0x5140), b01 = __byte_perm(v[0], v[1], 0x7362);
        uint32_t a23 = __byte_perm(v[2], v[3], 0x5140), b23 = __byte_perm(v[2], v[3], 0x7362);
        w[4 * h + 0] = __byte_perm(a01, a23, 0x5410);
        w[4 * h + 1] = __byte_perm(a01, a23, 0x7632);
        w[4 * h + 2] = __byte_perm(b01, b23, 0x5410);
        w[4 * h + 3] = __byte_perm(b01, b23, 0x7632);
    }
}

/* Word of the shared tile holding rows 4rb..4rb+3 of tile column col. */
__device__ __forceinline__ int tile_word(int col, int rb) { return col * 32 + (rb ^ (((col >> 3) & 7) << 2)); }

/* This block's tile and this thread's place in it: rows rbase..rbase+3,
 * columns c..c+7 (cv, rb: the thread's column group and row block). */
struct TilePos {
    int64_t r0, c0, c, rbase;
    int cv, rb;
};

/* The thread's four rows of 8 elements, all loads issued before any use
 * (q may alias x as far as the compiler knows, so loads would not move
 * above the stores that follow). */
template <int IN> __device__ __forceinline__ TilePos tile_load(const TArgs &a, V8<IN> (&v)[4])
{
    constexpr int ES = IN == IN_F32 ? 4 : 2;
    TilePos p;
    int64_t tr = blockIdx.x / a.tiles_c, tc = blockIdx.x - tr * a.tiles_c;
    p.r0 = tr * TR, p.c0 = tc * TC;
    p.cv = threadIdx.x & 7, p.rb = threadIdx.x >> 3;
    p.c = p.c0 + p.cv * 8, p.rbase = p.r0 + p.rb * 4;
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (p.rbase + i < a.R && p.c < a.C) v8_load<IN>(v[i], a.x + ((p.rbase + i) * a.C + p.c) * ES, 0);
    return p;
}

template <int IN, bool E5, bool PER> __global__ void __launch_bounds__(256) k_t_cast(TArgs a)
{
    constexpr int ES = IN == IN_F32 ? 4 : 2;
    __shared__ uint32_t tile[TC * 32];
    cu_pdl_wait();
    cu_pdl_trigger();
    V8<IN> v[4];
    const TilePos p = tile_load<IN>(a, v);
    const int64_t r0 = p.r0, c0 = p.c0, c = p.c, rbase = p.rbase;
    const int cv = p.cv, rb = p.rb;
    float s = 0.0f;
    bool track = false;
    if (!PER) {
        if (a.smode == 0) s = a.sval;
        else if (a.smode == 1) s = f8_checked_scale(cu_dec(a.sdt, a.sp));
        else s = a.scale_out[0];
        track = a.smode != 2;
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            float si = a.smode == 2 ? a.scale_inv_out[0] : f8_inv(s);
            if (track) a.scale_out[0] = s, a.scale_inv_out[0] = si;
            a.scale_t_out[0] = s;
            a.scale_inv_t_out[0] = si;
        }
    }
    float cs[8];
    if (PER && c < a.C) {
#pragma unroll
        for (int k = 0; k < 8; k++) cs[k] = a.scale_t_out[c + k];
    }
    F8Cnt cnt = {0, 0, 0, 0, 0}, dummy = {0, 0, 0, 0, 0};
    uint32_t lo[4], hi[4], tlo[4], thi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo[i] = hi[i] = tlo[i] = thi[i] = 0;
        int64_t r = rbase + i;
        if (r < a.R && c < a.C) {
            const char *xv = a.x + (r * a.C + c) * ES;
            float rs = PER ? a.scale_out[r] : s;
            uint2 qc = f8_codes8<IN, E5>(v[i], xv, rs, a.fmt, cnt, track);
            *reinterpret_cast<uint2 *>(a.q + r * a.C + c) = qc;
            lo[i] = qc.x, hi[i] = qc.y;
            if (PER) {
                uint2 tc2 = f8_codes8<IN, E5, true>(v[i], xv, 0.0f, a.fmt, dummy, false, cs);
                tlo[i] = tc2.x, thi[i] = tc2.y;
            }
        }
    }
    uint32_t w[8];
    if (PER) transpose4x8(tlo, thi, w);
    else transpose4x8(lo, hi, w);
#pragma unroll
    for (int k = 0; k < 8; k++) tile[tile_word(cv * 8 + k, rb)] = w[k];
    __syncthreads();
    /* qt rows c0 + col, bytes r0 + 16 j .. + 15 (R % 16 == 0: a chunk is
     * wholly inside or outside) */
    int j = threadIdx.x & 7;
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        int col = pass * 32 + (threadIdx.x >> 3);
        int64_t r = r0 + 16 * j;
        if (c0 + col < a.C && r < a.R) {
            const uint4 *src = reinterpret_cast<const uint4 *>(&tile[tile_word(col, 4 * j)]);
            *reinterpret_cast<uint4 *>(a.qt + (c0 + col) * a.R + r) = *src;
        }
    }
    f8_finish(cnt, a.ws, a.stats, a.R * a.C);
}

/* Row and column amaxes of x (bits of |x|) into row_amax [R] and col_amax
 * [C] (zeroed before), and the tensor's amax into the workspace. */
template <int IN> __global__ void __launch_bounds__(256) k_t_amax(TArgs a)
{
    __shared__ uint32_t colm[8][TC];
    cu_pdl_wait();
    cu_pdl_trigger();
    uint32_t *row_amax = reinterpret_cast<uint32_t *>(a.scale_out);
    uint32_t *col_amax = reinterpret_cast<uint32_t *>(a.scale_t_out);
    V8<IN> v[4];
    const TilePos p = tile_load<IN>(a, v);
    const int64_t c0 = p.c0, c = p.c, rbase = p.rbase;
    const int cv = p.cv, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t cm[8] = {0, 0, 0, 0, 0, 0, 0, 0}, all = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int64_t r = rbase + i;
        uint32_t rm = 0;
        if (r < a.R && c < a.C) {
            float x[8];
            v8_decode<IN>(v[i], x);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                uint32_t ab = __float_as_uint(x[k]) & 0x7FFFFFFFu;
                rm = ab > rm ? ab : rm;
                cm[k] = ab > cm[k] ? ab : cm[k];
            }
        }
        /* the row's 8 lanes (same rb) */
        rm = max(rm, __shfl_xor_sync(0xFFFFFFFFu, rm, 1));
        rm = max(rm, __shfl_xor_sync(0xFFFFFFFFu, rm, 2));
        rm = max(rm, __shfl_xor_sync(0xFFFFFFFFu, rm, 4));
        if (cv == 0 && r < a.R && rm) atomicMax(&row_amax[r], rm);
        all = rm > all ? rm : all;
    }
    /* columns: the 4 rbs of a warp by shuffles, then the 8 warps */
#pragma unroll
    for (int k = 0; k < 8; k++) {
        cm[k] = max(cm[k], __shfl_xor_sync(0xFFFFFFFFu, cm[k], 8));
        cm[k] = max(cm[k], __shfl_xor_sync(0xFFFFFFFFu, cm[k], 16));
    }
    if (lane < 8) {
#pragma unroll
        for (int k = 0; k < 8; k++) colm[warp][cv * 8 + k] = cm[k];
    }
    __shared__ uint32_t allm[8];
    all = __reduce_max_sync(0xFFFFFFFFu, all);
    if (lane == 0) allm[warp] = all;
    __syncthreads();
    if (threadIdx.x < TC) {
        uint32_t m = 0;
#pragma unroll
        for (int w = 0; w < 8; w++) m = colm[w][threadIdx.x] > m ? colm[w][threadIdx.x] : m;
        if (c0 + threadIdx.x < a.C && m) atomicMax(&col_amax[c0 + threadIdx.x], m);
    }
    if (threadIdx.x == 0) {
        uint32_t m = 0;
        for (int w = 0; w < 8; w++) m = allm[w] > m ? allm[w] : m;
        if (m) atomicMax(&a.ws->amax, m);
    }
}

/* Amax bits -> scales, in place: rows [R] then columns [C]. */
__global__ void __launch_bounds__(256) k_t_scales(TArgs a)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    int64_t n = a.R + a.C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        bool row = i < a.R;
        float *s = row ? a.scale_out + i : a.scale_t_out + (i - a.R);
        float *si = row ? a.scale_inv_out + i : a.scale_inv_t_out + (i - a.R);
        f8_group_scale(__float_as_uint(*s), a.sp8, s, si);
    }
}

template <int IN, bool E5> lpx_status launch(const char *op, int dev, TArgs &a, bool axiswise, bool dynamic)
{
    cudaStream_t st = cu_stream(dev);
    bool pdl = cu_pdl(dev);
    unsigned tiles = (unsigned)(((a.R + TR - 1) / TR) * a.tiles_c);
    lpx_status s;
    if (axiswise) {
        (void)cu_launch(k_t_amax<IN>, tiles, 256, st, pdl, a);
        if ((s = cu_launched(op, "k_t_amax"))) return s;
        (void)cu_launch(k_t_scales, cu_blocks(dev, a.R + a.C, 256), 256, st, pdl, a);
        if ((s = cu_launched(op, "k_t_scales"))) return s;
        (void)cu_launch(k_t_cast<IN, E5, true>, tiles, 256, st, pdl, a);
        return cu_launched(op, "k_t_cast");
    }
    if (dynamic) {
        TwArgs t;
        memset(&t, 0, sizeof t);
        t.x.base = a.x;
        t.x.dt = IN == IN_F32 ? LPX_F32 : IN == IN_BF16 ? LPX_BF16 : LPX_F16;
        t.x.esz = IN == IN_F32 ? 4 : 2;
        t.x.contig = 1;
        t.n = a.R * a.C;
        t.nvec = t.n / 8;
        t.scale_out = a.scale_out, t.scale_inv_out = a.scale_inv_out;
        t.ws = a.ws;
        t.sp8 = a.sp8;
        if ((s = cu_f8_launch_tw_amax(op, dev, t, IN))) return s;
    }
    (void)cu_launch(k_t_cast<IN, E5, false>, tiles, 256, st, pdl, a);
    return cu_launched(op, "k_t_cast");
}

template <int IN> lpx_status launch_in(const char *op, int dev, TArgs &a, bool e5, bool axiswise, bool dynamic)
{
    return e5 ? launch<IN, true>(op, dev, a, axiswise, dynamic) : launch<IN, false>(op, dev, a, axiswise, dynamic);
}

bool dense_contig_on(const lpx_tensor *t, lpx_device dev, lpx_dtype dt, int64_t numel)
{
    lpx_device d = lpx_tensor_device(t);
    return t && !lpx_tensor_kind(t) && d.type == dev.type && d.index == dev.index && lpx_tensor_dtype(t) == dt &&
           lpx_tensor_numel(t) == numel && lpx_tensor_is_contiguous(t);
}

/* The composition registered by the CPU backend (device-generic). */
lpx_kernel_fn g_composite;

lpx_status k_fp8_quantize_t(lpx_call *c)
{
    /* checked by the dispatcher: x a dense 2-D tensor, fp8 a format,
     * scale_max >= 0, no static scale when axiswise, qt, scale_t and
     * scale_inv_t of the right dtype and shape on x's device */
    const lpx_fp8_quantize_args *args = (const lpx_fp8_quantize_args *)lpx_op_args_of(c);
    lpx_tensor *x = args->x, *sarg = args->scale;
    lpx_dtype fp8 = args->fp8;
    bool axiswise = args->axiswise, pow2 = args->pow2, sat = args->saturate;
    double scale_max = args->scale_max;
    lpx_tensor *qt = args->qt, *st_ = args->scale_t, *sit = args->scale_inv_t;
    /* the fused kernels' domain; anything else is the composition's */
    lpx_device dev = lpx_tensor_device(x);
    int64_t R = lpx_tensor_shape(x)[0], C = lpx_tensor_shape(x)[1];
    lpx_dtype xd = lpx_tensor_dtype(x);
    int ik = xd == LPX_F32 ? IN_F32 : xd == LPX_BF16 ? IN_BF16 : xd == LPX_F16 ? IN_F16 : IN_ANY;
    int64_t ns = axiswise ? C : 1;
    bool fused = ik != IN_ANY && dev.type != LPX_DEVICE_CPU && lpx_tensor_is_contiguous(x) &&
                 ((uintptr_t)lpx_tensor_data(x) & 15) == 0 && R > 0 && C > 0 && C % 8 == 0 && R % 16 == 0 &&
                 dense_contig_on(qt, dev, fp8, R * C) && lpx_tensor_shape(qt)[0] == C &&
                 ((uintptr_t)lpx_tensor_data(qt) & 15) == 0 && dense_contig_on(st_, dev, LPX_F32, ns) &&
                 dense_contig_on(sit, dev, LPX_F32, ns) && (!axiswise || lpx_tensor_ndim(st_) == 2) &&
                 (!axiswise || lpx_tensor_ndim(sit) == 2);
    /* a static scale: numel 1, on x's device (float) or on the CPU
     * (checked and read on the host, as fp8_quantize does) */
    float host_scale = 0.0f;
    bool scale_on_host = false;
    if (fused && sarg) {
        lpx_device sd = lpx_tensor_device(sarg);
        const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(sarg));
        fused = !lpx_tensor_kind(sarg) && lpx_tensor_numel(sarg) == 1 && tr && tr->is_float &&
                (sd.type == LPX_DEVICE_CPU || (sd.type == dev.type && sd.index == dev.index));
        if (fused && sd.type == LPX_DEVICE_CPU) {
            double v = 0;
            fused = lpx_item(sarg, 0, &v) == LPX_OK && (float)v > 0.0f && isfinite((float)v);
            host_scale = (float)v;
            scale_on_host = true;
        }
    }
    if (!fused) {
        if (!g_composite)
            return lpx_error(LPX_ENOTIMPL, "%s: the composition kernel of the CPU backend is not registered",
                             cu_op(c));
        return g_composite(c);
    }
    const char *op = cu_op(c);
    lpx_status st;
    lpx_tensor *q = NULL, *ts = NULL, *tsi = NULL, *tstats = NULL;
    int sndim = axiswise ? 2 : 0;
    int64_t sshape[2] = {R, 1}, four = 4;
    if ((st = cu_new(c, fp8, 2, lpx_tensor_shape(x), dev, &q)) || (st = cu_new(c, LPX_F32, sndim, sshape, dev, &ts)) ||
        (st = cu_new(c, LPX_F32, sndim, sshape, dev, &tsi)) || (st = cu_new(c, LPX_F32, 1, &four, dev, &tstats)) ||
        (st = cu_use(op, dev)))
        goto fail;
    {
        int di = dev.index;
        bool e5 = fp8 == LPX_F8E5M2, dynamic = sarg == NULL;
        TArgs a;
        memset(&a, 0, sizeof a);
        a.x = (const char *)lpx_tensor_data(x);
        a.R = R, a.C = C, a.tiles_c = (C + TC - 1) / TC;
        a.q = (uint8_t *)lpx_tensor_data(q);
        a.qt = (uint8_t *)lpx_tensor_data(qt);
        a.smode = dynamic ? 2 : scale_on_host ? 0 : 1;
        a.sval = host_scale;
        a.sp = sarg && !scale_on_host ? lpx_tensor_data(sarg) : NULL;
        a.sdt = sarg ? lpx_tensor_dtype(sarg) : LPX_F32;
        a.scale_out = (float *)lpx_tensor_data(ts), a.scale_inv_out = (float *)lpx_tensor_data(tsi);
        a.scale_t_out = (float *)lpx_tensor_data(st_), a.scale_inv_t_out = (float *)lpx_tensor_data(sit);
        a.stats = (float *)lpx_tensor_data(tstats);
        a.fmt = cu_f8_fmt(e5, sat);
        a.sp8 = f8_scale_params(lpx_dtype_get(fp8)->max, pow2, scale_max);
        cudaStream_t stream = cu_stream(di);
        if (axiswise) {
            cudaError_t e = cudaMemsetAsync(a.scale_out, 0, (size_t)R * sizeof(float), stream);
            if (e == cudaSuccess) e = cudaMemsetAsync(a.scale_t_out, 0, (size_t)C * sizeof(float), stream);
            if (e != cudaSuccess) {
                st = cu_fail(e, op, "cudaMemsetAsync(amax scratch)");
                goto fail;
            }
        }
        a.ws = cu_f8_work_lock(di);
        st = ik == IN_BF16 ? launch_in<IN_BF16>(op, di, a, e5, axiswise, dynamic)
           : ik == IN_F16  ? launch_in<IN_F16>(op, di, a, e5, axiswise, dynamic)
                           : launch_in<IN_F32>(op, di, a, e5, axiswise, dynamic);
        /* a failed launch may leave counters behind: zero them */
        if (st) (void)cudaMemsetAsync(a.ws, 0, sizeof *a.ws, stream);
        cu_f8_work_unlock(di);
    }
    if (st) goto fail;
    cu_ret(c, q);
    cu_ret(c, ts);
    cu_ret(c, tsi);
    cu_ret(c, tstats);
    return LPX_OK;
fail:
    lpx_tensor_release(q);
    lpx_tensor_release(ts);
    lpx_tensor_release(tsi);
    lpx_tensor_release(tstats);
    return st;
}

} // namespace

lpx_status cu_f8_register_transpose(const lpx_host *h)
{
    void *data = NULL;
    lpx_status st = lpx_kernel_lookup(LPX_OP_fp8_quantize_t, LPX_KEY_CPU, &g_composite, &data);
    if (st) return st;
    return cu_reg(h, LPX_OP_fp8_quantize_t, k_fp8_quantize_t);
}
