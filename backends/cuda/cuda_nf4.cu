/* CUDA kernels of the dense NF4 ops (ops_nf4.def): quantize with double
 * quantization of the block scales, dequantize of any element window, and
 * the seeded dropout of the QLoRA adapter path; nf4_mm lives with the
 * GEMMs (cuda_gemm_nf4.c), which dequantize through cu_nf4_dequantize_into
 * (cuda_nf4.h). Same shapes and bits as the CPU kernels of
 * backends/cpu/nf4.c; the scalar numerics are core/numerics/nf4.h. The
 * arguments are checked by the dispatcher (spec families of
 * op_args_lowp.h).
 *
 * Dequantize (the hot one): a thread takes units of the codes of one
 * 16-byte output vector (8 codes, one 32-bit word, for bf16/f16; 4 codes
 * for f32), grid-stride at full occupancy, so a warp reads contiguous
 * codes and writes whole lines; launched with programmatic dependent
 * launch on sm_90 (cuda_launch.cuh). Per unit
 * one dequantized block scale (qs / f + mean, block and scaler-block
 * indices by shifts when the sizes are powers of two), then per code a
 * lookup in the 16-entry codebook in shared memory and one multiply.
 * f16/bf16 results are rounded two at a time by the hardware conversion
 * (cvt.rn.{bf16,f16}x2.f32) when the block scale is finite and not tiny
 * (then every value is finite and normal or zero, where the conversion is
 * the IEEE rounding the codec computes); other units use the codec.
 * Windows that start off a unit, block sizes that are not a multiple of
 * the unit, and misaligned codes take a per-element kernel.
 *
 * Quantize (one-off, correctness first): a warp per NF4 block (absmax of
 * the bit patterns, codes by lpx_nf4_encode_scaled), the mean of the block
 * scales summed in double in block order by one thread (the CPU's order,
 * so the same bits; staged through shared memory), then a thread per
 * scaler block for the i8 scalers and the factor. A NaN or inf in x
 * cannot be reported without waiting for the device: its block scale,
 * hence the mean, becomes non-finite, and every element of the payload
 * dequantizes to NaN (the CPU fails with LPX_ENUMERIC). NaN values of a
 * corrupt payload (NaN mean or factors) dequantize to NaN, whose sign and
 * payload bits may differ from the CPU's.
 *
 * Dropout: Philox4x32-10 keyed by the seed at counter (i / 4, 0, 2, 0),
 * the CPU's stream, one counter per thread; keep_i = (r >> 8) * 2^-24 >= p
 * evaluated exactly as (r >> 8) >= ceil(p * 2^24). */
#include <atomic>
#include <math.h>
#include <string.h>
#include "cuda_dtype.cuh"
#include "lpx/cuda_launch.cuh"
#include "cuda_nf4.h"
#include "nf4.h"

namespace {

constexpr uint32_t F32_INF = 0x7F800000u;

/* ---- the payload ------------------------------------------------------ */

struct Payload {
    const uint8_t *codes;
    const int8_t *qs;
    const float *f;
    const float *mean;
    int64_t block, sblock, padded;
};

/* The payload as the dispatcher checked it (lpx_nf4_payload_args: the
 * contract is lpx_meta_nf4_payload's). */
void payload_of(const lpx_nf4_payload_args *a, Payload *p)
{
    p->codes = (const uint8_t *)lpx_tensor_data(a->codes);
    p->qs = (const int8_t *)lpx_tensor_data(a->qscalers);
    p->f = (const float *)lpx_tensor_data(a->factors);
    p->mean = (const float *)lpx_tensor_data(a->mean);
    p->block = a->block;
    p->sblock = a->scaler_block;
    p->padded = a->padded;
}

bool nf4_out_dtype(lpx_dtype d) { return d == LPX_F32 || d == LPX_F16 || d == LPX_BF16; }

/* ---- dequantize ------------------------------------------------------ */

enum { OUT_F32 = 0, OUT_BF16 = 1, OUT_F16 = 2 };

struct DqArgs {
    const uint8_t *codes;
    const int8_t *qs;
    const float *f;
    const float *mean;
    int64_t block, sblock;
    int bshift, sshift;       /* log2(block / EPU), log2(scaler_block); -1: not a power of two */
    int64_t start, end;       /* element window */
    int64_t u0, u1;           /* units of EPU codes touching the window */
    int vec_out;              /* full units store 16-byte vectors */
    void *out;
};

/* The codebook in shared memory (constant indices: no local-memory copy
 * of lpx_nf4_value's table). */
__device__ __forceinline__ void cb_table(float *cb)
{
    if (threadIdx.x == 0) {
#pragma unroll
        for (unsigned k = 0; k < 16; k++) cb[k] = lpx_nf4_value(k);
    }
    __syncthreads();
}

/* Codes per unit: the elements of one 16-byte output vector (4 f32 or 8
 * bf16/f16), so that a warp stores whole lines. */
template <int OUT> struct Epu {
    static constexpr int n = OUT == OUT_F32 ? 4 : 8;
};

/* Block scale of unit u (elements [EPU u, EPU (u + 1)), one block). */
template <int OUT> __device__ __forceinline__ float unit_scale(const DqArgs &a, int64_t u, float mean)
{
    constexpr int EPU = Epu<OUT>::n;
    int64_t b = a.bshift >= 0 ? u >> a.bshift : u / (a.block / EPU);
    int64_t g = a.sshift >= 0 ? b >> a.sshift : b / a.sblock;
    return lpx_nf4_scale(a.qs[b], a.f[g], mean);
}

/* Two values rounded to bf16/f16 (v0 in the low half). hw: both finite
 * and normal or zero, where the conversion instruction rounds like the
 * codec. */
template <int OUT> __device__ __forceinline__ uint32_t pack2(float v0, float v1, bool hw)
{
    if (hw) {
        uint32_t r;
        if (OUT == OUT_BF16) asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(v0), "f"(v1));
        else asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(v0), "f"(v1));
        return r;
    }
    if (OUT == OUT_BF16) return (uint32_t)lpx_f32_to_bf16(v0, 0) | (uint32_t)lpx_f32_to_bf16(v1, 0) << 16;
    return (uint32_t)lpx_f32_to_f16(v0, 0) | (uint32_t)lpx_f32_to_f16(v1, 0) << 16;
}

template <int OUT> __device__ __forceinline__ void store1(void *out, int64_t i, float v)
{
    if (OUT == OUT_F32) ((float *)out)[i] = v;
    else if (OUT == OUT_BF16) ((uint16_t *)out)[i] = lpx_f32_to_bf16(v, 0);
    else ((uint16_t *)out)[i] = lpx_f32_to_f16(v, 0);
}

/* One unit: code bytes in w (byte k holds elements 2k (high nibble) and
 * 2k + 1), scale s. */
template <int OUT, bool CS = false>
__device__ __forceinline__ void deq_unit(const DqArgs &a, const float *cb, int64_t u, uint32_t w, float s)
{
    constexpr int EPU = Epu<OUT>::n;
    float v[EPU];
#pragma unroll
    for (int k = 0; k < EPU / 2; k++) {
        uint32_t byte = (w >> (8 * k)) & 0xFFu;
        v[2 * k] = cb[byte >> 4] * s;
        v[2 * k + 1] = cb[byte & 15u] * s;
    }
    int64_t e0 = u * EPU;
    if (a.vec_out && e0 >= a.start && e0 + EPU <= a.end) {
        int64_t o = e0 - a.start;
        if (OUT == OUT_F32) {
            float4 r = make_float4(v[0], v[1], v[2], v[3]);
            if (CS) __stcs(reinterpret_cast<float4 *>((float *)a.out + o), r);
            else *reinterpret_cast<float4 *>((float *)a.out + o) = r;
        } else {
            uint32_t as = __float_as_uint(s) & 0x7FFFFFFFu;
            /* |s| in [2^-100, FLT_MAX] or 0: every value finite, normal or zero */
            bool hw = as == 0 || (as >= 0x0D800000u && as < F32_INF);
            uint4 r = make_uint4(pack2<OUT>(v[0], v[1], hw), pack2<OUT>(v[2], v[3], hw),
                                 pack2<OUT>(v[4 % EPU], v[5 % EPU], hw), pack2<OUT>(v[6 % EPU], v[7 % EPU], hw));
            if (CS) __stcs(reinterpret_cast<uint4 *>((uint16_t *)a.out + o), r);
            else *reinterpret_cast<uint4 *>((uint16_t *)a.out + o) = r;
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < EPU; k++) {
        int64_t e = e0 + k;
        if (e >= a.start && e < a.end) store1<OUT>(a.out, e - a.start, v[k]);
    }
}

/* block % EPU == 0 and codes aligned to EPU / 2 bytes: a unit of EPU
 * codes per thread per grid-stride step. Eight blocks of 256 threads per
 * SM (full occupancy, at most 32 registers): on the H100 that beat four
 * units in flight per thread at six blocks per SM by 5-6% of copy
 * bandwidth (docs/PERFORMANCE.md), the warps, not the per-thread loads,
 * hiding the latency. CS: evict-first (streaming) stores, for results not
 * read again soon. */
template <int OUT, bool CS> __global__ void __launch_bounds__(256, 8) k_nf4_deq_units(DqArgs a)
{
    __shared__ float cb[16];
    cb_table(cb);
    cu_pdl_wait();
    cu_pdl_trigger();
    const float mean = *a.mean;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t u = a.u0 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < a.u1; u += stride) {
        uint32_t w = Epu<OUT>::n == 8 ? reinterpret_cast<const uint32_t *>(a.codes)[u]
                                      : reinterpret_cast<const uint16_t *>(a.codes)[u];
        deq_unit<OUT, CS>(a, cb, u, w, unit_scale<OUT>(a, u, mean));
    }
}

/* Any block size and alignment: one element per step. */
template <int OUT> __global__ void __launch_bounds__(256) k_nf4_deq1(DqArgs a)
{
    __shared__ float cb[16];
    cb_table(cb);
    cu_pdl_wait();
    cu_pdl_trigger();
    const float mean = *a.mean;
    for (int64_t e = a.start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < a.end;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / a.block;
        float s = lpx_nf4_scale(a.qs[b], a.f[b / a.sblock], mean);
        uint8_t byte = a.codes[e >> 1];
        unsigned code = (e & 1) ? lpx_nf4_lo(byte) : lpx_nf4_hi(byte);
        store1<OUT>(a.out, e - a.start, cb[code] * s);
    }
}

int log2_exact(int64_t v)
{
    if (v <= 0 || (v & (v - 1))) return -1;
    int k = 0;
    while ((int64_t)1 << k < v) k++;
    return k;
}

/* One wave of kernel K on device dev (cuda_launch.cuh). */
template <auto K> unsigned grid_for(int dev, int64_t want) { return cu_grid_wave<K>(cu_sm_count(dev), want); }

template <int OUT> lpx_status launch_deq(const char *op, int dev, const DqArgs &a, bool units, bool stream_out)
{
    cudaStream_t st = cu_stream(dev);
    bool pdl = cu_pdl(dev);
    if (units) {
        int64_t want = (a.u1 - a.u0 + 255) / 256;
        if (stream_out)
            (void)cu_launch(k_nf4_deq_units<OUT, true>, grid_for<k_nf4_deq_units<OUT, true>>(dev, want), 256, st,
                            pdl, a);
        else
            (void)cu_launch(k_nf4_deq_units<OUT, false>, grid_for<k_nf4_deq_units<OUT, false>>(dev, want), 256, st,
                            pdl, a);
        return cu_launched(op, "k_nf4_deq_units");
    }
    int64_t want = (a.end - a.start + 255) / 256;
    (void)cu_launch(k_nf4_deq1<OUT>, grid_for<k_nf4_deq1<OUT>>(dev, want), 256, st, pdl, a);
    return cu_launched(op, "k_nf4_deq1");
}

/* ---- quantize -------------------------------------------------------- */

struct QArgs {
    const char *x;
    lpx_dtype dt;
    int esz, contig;
    cu_geom g;
    int64_t n, B, nb, S;
    float *scales;            /* nb block absmaxes (scratch) */
    uint8_t *codes;
    int8_t *qs;
    float *f, *mean;
};

__device__ __forceinline__ float q_ld(const QArgs &a, int64_t i)
{
    if (i >= a.n) return 0.0f; /* zero padding */
    return cu_dec(a.dt, a.x + (a.contig ? i : cu_offset(a.g, i)) * a.esz);
}

/* A warp per block: absmax over the bit patterns, then the codes. */
__global__ void __launch_bounds__(256) k_nf4_blocks(QArgs a)
{
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t b = warp; b < a.nb; b += nwarps) {
        int64_t e0 = b * a.B;
        uint32_t mb = 0;
        for (int64_t j = lane; j < a.B; j += 32) {
            uint32_t u = __float_as_uint(q_ld(a, e0 + j)) & 0x7FFFFFFFu;
            mb = u > mb ? u : mb;
        }
        mb = __reduce_max_sync(0xFFFFFFFFu, mb);
        float s = __uint_as_float(mb);   /* inf or NaN when x is not finite: poisons the mean */
        if (lane == 0) a.scales[b] = s;
        for (int64_t j = lane; j < a.B / 2; j += 32) {
            unsigned c0 = lpx_nf4_encode_scaled(q_ld(a, e0 + 2 * j), s);
            unsigned c1 = lpx_nf4_encode_scaled(q_ld(a, e0 + 2 * j + 1), s);
            a.codes[e0 / 2 + j] = lpx_nf4_pack(c0, c1);
        }
    }
}

/* The mean of the block scales, summed in double in block order (the
 * CPU's order, so the same bits): the block stages MEAN_CHUNK scales at a
 * time in shared memory (coalesced loads, the next chunk loading while
 * thread 0 adds the current one), thread 0 adds them one by one. */
constexpr int MEAN_CHUNK = 2048;

__global__ void __launch_bounds__(256) k_nf4_mean(QArgs a)
{
    __shared__ float buf[2][MEAN_CHUNK];
    double sum = 0.0;
    int cur = 0;
    for (int64_t i = threadIdx.x; i < MEAN_CHUNK && i < a.nb; i += blockDim.x) buf[0][i] = a.scales[i];
    __syncthreads();
    for (int64_t c0 = 0; c0 < a.nb; c0 += MEAN_CHUNK) {
        int64_t c1 = c0 + MEAN_CHUNK;
        for (int64_t i = c1 + threadIdx.x; i < c1 + MEAN_CHUNK && i < a.nb; i += blockDim.x)
            buf[cur ^ 1][i - c1] = a.scales[i];
        if (threadIdx.x == 0) {
            int n = (int)(a.nb - c0 < MEAN_CHUNK ? a.nb - c0 : MEAN_CHUNK);
            const float *b = buf[cur];
            for (int k = 0; k < n; k++) sum += b[k];
        }
        __syncthreads();
        cur ^= 1;
    }
    if (threadIdx.x == 0) a.mean[0] = a.nb ? (float)(sum / (double)a.nb) : 0.0f;
}

/* A thread per scaler block: factor and i8 scalers. */
__global__ void __launch_bounds__(256) k_nf4_scalers(QArgs a)
{
    const float m = a.mean[0];
    int64_t ng = a.nb / a.S;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < ng; g += (int64_t)gridDim.x * blockDim.x) {
        const float *sg = a.scales + g * a.S;
        float amax = 0.0f;
        for (int64_t k = 0; k < a.S; k++) {
            float v = fabsf(sg[k] - m);
            amax = v > amax ? v : amax;
        }
        float fac = lpx_nf4_factor(amax);
        a.f[g] = fac;
        for (int64_t k = 0; k < a.S; k++) a.qs[g * a.S + k] = lpx_nf4_quantize_scaler(sg[k] - m, fac);
    }
}

lpx_status k_nf4_quantize(lpx_call *c)
{
    const lpx_nf4_quantize_args *args = (const lpx_nf4_quantize_args *)lpx_op_args_of(c);
    lpx_tensor *x = args->x;
    int64_t B = args->block, S = args->scaler_block;
    const char *op = cu_op(c);
    lpx_status st;
    const lpx_nf4_sizes sz = args->sz;
    if ((st = cu_builtin_dtype(c, "x", x))) return st;
    int64_t n = lpx_tensor_numel(x), padded = sz.padded, nb = sz.blocks;
    int64_t shapes[4] = {padded / 2, nb, sz.scaler_blocks, 1};
    lpx_dtype dts[4] = {LPX_U8, LPX_I8, LPX_F32, LPX_F32};
    lpx_tensor *r[4] = {NULL, NULL, NULL, NULL};
    lpx_device dev = lpx_tensor_device(x);
    int di = dev.index;
    float *scales = NULL;
    size_t sbytes = (size_t)(nb ? nb : 1) * sizeof(float);
    for (int i = 0; i < 4; i++)
        if ((st = cu_new(c, dts[i], 1, &shapes[i], dev, &r[i]))) goto fail;
    if ((st = cu_use(op, dev))) goto fail;
    scales = (float *)cu_scratch_alloc(di, sbytes);
    if (!scales) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate %lld block scales on cuda:%d", op, (long long)nb, di);
        goto fail;
    }
    {
        QArgs a;
        memset(&a, 0, sizeof a);
        a.x = (const char *)lpx_tensor_data(x);
        a.dt = lpx_tensor_dtype(x);
        a.esz = cu_esize(a.dt);
        cu_geom_of(&a.g, x);
        a.contig = cu_geom_contiguous(&a.g);
        a.n = n, a.B = B, a.nb = nb, a.S = S;
        a.scales = scales;
        a.codes = (uint8_t *)lpx_tensor_data(r[0]);
        a.qs = (int8_t *)lpx_tensor_data(r[1]);
        a.f = (float *)lpx_tensor_data(r[2]);
        a.mean = (float *)lpx_tensor_data(r[3]);
        cudaStream_t stream = cu_stream(di);
        if (nb > 0) {
            k_nf4_blocks<<<grid_for<k_nf4_blocks>(di, (nb + 7) / 8), 256, 0, stream>>>(a);
            if ((st = cu_launched(op, "k_nf4_blocks"))) goto done;
        }
        k_nf4_mean<<<1, 256, 0, stream>>>(a);
        if ((st = cu_launched(op, "k_nf4_mean"))) goto done;
        if (nb > 0) {
            k_nf4_scalers<<<grid_for<k_nf4_scalers>(di, (nb / S + 255) / 256), 256, 0, stream>>>(a);
            st = cu_launched(op, "k_nf4_scalers");
        }
    }
done:
    cu_scratch_free(di, scales, sbytes);
    if (st) goto fail;
    for (int i = 0; i < 4; i++) cu_ret(c, r[i]);
    return LPX_OK;
fail:
    for (int i = 0; i < 4; i++) lpx_tensor_release(r[i]);
    return st;
}

lpx_status k_nf4_dequantize(lpx_call *c)
{
    const lpx_nf4_dequantize_args *args = (const lpx_nf4_dequantize_args *)lpx_op_args_of(c);
    Payload p;
    payload_of(&args->p, &p);
    int64_t start = args->start, count = args->count;
    lpx_dtype dtype = args->dtype;
    lpx_tensor *out = args->out;
    const char *op = cu_op(c);
    lpx_status st;
    lpx_device dev = lpx_tensor_device(args->p.codes);
    if (out) {
        lpx_tensor_retain(out);
    } else if ((st = cu_new(c, dtype, 1, &count, dev, &out))) {
        return st;
    }
    if ((st = cu_use(op, dev)) ||
        (st = cu_nf4_dequantize_into(op, dev.index, p.codes, p.qs, p.f, p.mean, p.block, p.sblock, start, count,
                                     dtype, lpx_tensor_data(out), true))) {
        lpx_tensor_release(out);
        return st;
    }
    cu_ret(c, out);
    return LPX_OK;
}

/* ---- dropout of the adapter path -------------------------------------- */

__device__ __forceinline__ void philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                              uint32_t k1, uint32_t out[4])
{
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

struct DropArgs {
    const char *x;
    lpx_dtype xdt, ydt;
    int xesz, yesz, contig;
    cu_geom g;
    int64_t n;
    uint32_t k0, k1;
    uint32_t thresh;          /* keep iff (r >> 8) >= thresh */
    float inv;
    char *y;
};

__global__ void __launch_bounds__(256) k_qlora_dropout(DropArgs a)
{
    int64_t nk = (a.n + 3) >> 2;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < nk; k += (int64_t)gridDim.x * blockDim.x) {
        uint32_t r[4];
        /* counter word 2 = 2: a stream apart from rand (1) and randn (0) */
        philox4x32_10((uint32_t)k, (uint32_t)((uint64_t)k >> 32), 2u, 0u, a.k0, a.k1, r);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            int64_t i = k * 4 + w;
            if (i >= a.n) break;
            float v = cu_dec(a.xdt, a.x + (a.contig ? i : cu_offset(a.g, i)) * a.xesz);
            float y = 0.0f;
            if ((r[w] >> 8) >= a.thresh) {
                uint32_t u = __float_as_uint(v);
                /* a NaN comes through quieted with its sign, as on the CPU */
                y = (u & 0x7FFFFFFFu) > F32_INF ? __uint_as_float(u | 0x00400000u) : v * a.inv;
            }
            cu_enc(a.ydt, a.y + i * a.yesz, y, 0);
        }
    }
}

lpx_status k_qlora_dropout_op(lpx_call *c)
{
    const lpx_qlora_dropout_args *args = (const lpx_qlora_dropout_args *)lpx_op_args_of(c);
    lpx_tensor *x = args->x;
    double p = args->p;
    uint64_t seed = args->seed;
    lpx_dtype dtype = args->dtype;
    lpx_status st;
    const char *op = cu_op(c);
    if ((st = cu_builtin_dtype(c, "x", x))) return st;
    if (dtype >= LPX_DTYPE_BUILTIN_COUNT)   /* the dtypes this backend writes */
        return lpx_error(LPX_EDTYPE, "%s: dtype %s: the cuda kernels write built-in dtypes only", op,
                         lpx_dtype_name(dtype));
    lpx_device dev = lpx_tensor_device(x);
    lpx_tensor *y;
    if ((st = cu_new(c, dtype, lpx_tensor_ndim(x), lpx_tensor_shape(x), dev, &y))) return st;
    if ((st = cu_use(op, dev))) {
        lpx_tensor_release(y);
        return st;
    }
    DropArgs a;
    memset(&a, 0, sizeof a);
    a.x = (const char *)lpx_tensor_data(x);
    a.xdt = lpx_tensor_dtype(x);
    a.ydt = dtype;
    a.xesz = cu_esize(a.xdt);
    a.yesz = cu_esize(dtype);
    cu_geom_of(&a.g, x);
    a.contig = cu_geom_contiguous(&a.g);
    a.n = lpx_tensor_numel(x);
    a.k0 = (uint32_t)seed;
    a.k1 = (uint32_t)(seed >> 32);
    /* (r >> 8) * 2^-24 >= p  <=>  (r >> 8) >= ceil(p * 2^24), exactly */
    a.thresh = (uint32_t)ceil(p * 16777216.0);
    a.inv = (float)(1.0 / (1.0 - p));
    a.y = (char *)lpx_tensor_data(y);
    if (a.n > 0) {
        int64_t nk = (a.n + 3) / 4;
        k_qlora_dropout<<<grid_for<k_qlora_dropout>(dev.index, (nk + 255) / 256), 256, 0, cu_stream(dev.index)>>>(a);
        if ((st = cu_launched(op, "k_qlora_dropout"))) {
            lpx_tensor_release(y);
            return st;
        }
    }
    cu_ret(c, y);
    return LPX_OK;
}

} // namespace

extern "C" lpx_status cu_nf4_dequantize_into(const char *op, int device, const uint8_t *codes, const int8_t *qscalers,
                                             const float *factors, const float *mean, int64_t block,
                                             int64_t scaler_block, int64_t start, int64_t count, lpx_dtype dtype,
                                             void *out, bool stream_out)
{
    if (!nf4_out_dtype(dtype))
        return lpx_error(LPX_EINVAL, "%s: NF4 dequantizes to f32, f16 or bf16, not %s", op, lpx_dtype_name(dtype));
    if (count <= 0) return LPX_OK;
    DqArgs a;
    memset(&a, 0, sizeof a);
    a.codes = codes, a.qs = qscalers, a.f = factors, a.mean = mean;
    a.block = block, a.sblock = scaler_block;
    int epu = dtype == LPX_F32 ? 4 : 8; /* codes per unit: 16 bytes of output */
    a.bshift = block % epu == 0 ? log2_exact(block / epu) : -1;
    a.sshift = log2_exact(scaler_block);
    a.start = start, a.end = start + count;
    a.u0 = start / epu, a.u1 = (a.end + epu - 1) / epu;
    a.vec_out = start % epu == 0 && (uintptr_t)out % 16 == 0;
    a.out = out;
    /* units: one block per unit and whole aligned words of codes (the unit
     * past the end of an odd window stays inside the payload: the padded
     * size is a multiple of block, hence of the unit) */
    bool units = block % epu == 0 && (uintptr_t)codes % (epu / 2) == 0;
    switch (dtype) {
    case LPX_F32: return launch_deq<OUT_F32>(op, device, a, units, stream_out);
    case LPX_BF16: return launch_deq<OUT_BF16>(op, device, a, units, stream_out);
    default: return launch_deq<OUT_F16>(op, device, a, units, stream_out);
    }
}

extern "C" lpx_status cu_register_nf4(const lpx_host *h)
{
    lpx_status st;
    if ((st = cu_reg(h, LPX_OP_nf4_quantize, k_nf4_quantize))) return st;
    if ((st = cu_reg(h, LPX_OP_nf4_dequantize, k_nf4_dequantize))) return st;
    return cu_reg(h, LPX_OP_qlora_dropout, k_qlora_dropout_op);
}
