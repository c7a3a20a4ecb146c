/* lpx-mx-cuda.so: the MX ops of lpx-mx.so on CUDA devices. It needs
 * lpx-cuda.so (the "cuda" backend: memory, and the stream every kernel of
 * a device is ordered on) and lpx-mx.so (the kinds mxfp8/mxfp4, the dtypes
 * e8m0/f4e2m1, the ops mx_dequantize and mx_quantize); the probe declines
 * with the reason when either is missing (LPX_PLUGIN_PATH loads plugins in
 * name order: lpx-cuda < lpx-mx < lpx-mx-cuda). Like a third-party plugin
 * it sees the public headers, the shared liblpx, plugins/mx/mx.h (the
 * layout) and the header-only numerics of core/numerics.
 *
 * An MX tensor lives on the device of its inner tensors (mx_wrap). The MX
 * kind kernel of mx_dequantize redispatches a non-CPU tensor below the
 * kind key, which lands here at the cuda key; lpx_kind_to_dense and the MX
 * fallback of lpx-mx.so go through that op too, so every MX tensor whose
 * payload is on a GPU dequantizes there.
 *
 *   mx_dequantize(Tensor x) -> Tensor   dense f32 [shape of x] on x's device
 *   mx_quantize(Tensor x, str format)   x dense on a CUDA device -> an MX
 *                                       tensor whose payload is on x's device
 *
 * Same argument checks, messages, shapes, dtypes and bits as the CPU
 * kernels of mx_tensor.c; the scalar formulas are mx_codec_hd.h (checked
 * against mx_codec.h by tests/test_mx_codec_hd.c).
 *
 * Dequantize: when K % 4 == 0 (then four consecutive outputs share a row
 * and a block) a thread takes units of four outputs, one scale load, one
 * 32-bit (mxfp8) or 16-bit (mxfp4) load of codes and one 16-byte store;
 * other sizes (and misaligned views) take a per-element kernel. Both are
 * grid-stride loops sized to one wave (occupancy x SMs).
 * Quantize (one-off, correctness first): a thread per block of 32. */
#include <atomic>
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <lpx/lpx.h>
#include <lpx/plugin.h>
#include <lpx/cuda.h>
#include "mx.h"
#include "mx_codec_hd.h"
#include "lpx/cuda_launch.cuh"

namespace {

lpx_cuda_stream_fn g_stream;
int g_key;                         /* the cuda backend's dispatch key */
const lpx_kind *g_fp8, *g_fp4;
lpx_dtype g_e8m0 = -1, g_f4e2m1 = -1;
lpx_op g_dequantize = -1, g_quantize = -1;

const char *fmt_name(mx_format f) { return f == MX_FP8 ? "mxfp8" : "mxfp4"; }

mx_format format_of(const lpx_tensor *t)
{
    const lpx_kind *k = lpx_tensor_kind(t);
    return !k ? (mx_format)0 : k == g_fp8 ? MX_FP8 : k == g_fp4 ? MX_FP4 : (mx_format)0;
}

lpx_status cu_fail(cudaError_t e, const char *op, const char *call)
{
    (void)cudaGetLastError();
    return lpx_error(e == cudaErrorMemoryAllocation ? LPX_ENOMEM : LPX_EDEVICE, "%s: %s failed: %s (%s)", op, call,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

#define MXC_CHECK(op, call)                                         \
    do {                                                            \
        cudaError_t e_ = (call);                                    \
        if (e_ != cudaSuccess) return cu_fail(e_, (op), #call);     \
    } while (0)

/* One wave of kernel K on device dev (cuda_launch.cuh); the SM count is
 * asked of the runtime: this plugin cannot call into lpx-cuda. */
template <auto K> unsigned grid_for(int dev, int64_t want)
{
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) (void)cudaGetLastError();
    return cu_grid_wave<K>(sms, want);
}

/* ---- dequantize ------------------------------------------------------ */

struct DqArgs {
    const uint8_t *el;   /* elements: rows x kp codes (mxfp4: kp / 2 bytes a row) */
    const uint8_t *sc;   /* scales: rows x nb */
    float *out;          /* rows x k */
    int64_t rows, k, kp, nb;
};

template <int FP4> __device__ __forceinline__ float dq_one(const DqArgs &a, int64_t r, int64_t col)
{
    uint8_t s = a.sc[r * a.nb + col / MXD_BLOCK];
    if (FP4) return mxd_dec_fp4(s, (uint8_t)(a.el[r * (a.kp / 2) + col / 2] >> (4 * (col & 1)) & 0xFu));
    return mxd_dec_fp8(s, a.el[r * a.kp + col]);
}

template <int FP4> __global__ void __launch_bounds__(256) k_mx_deq1(DqArgs a)
{
    int64_t n = a.rows * a.k, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t r = i / a.k;
        a.out[i] = dq_one<FP4>(a, r, i - r * a.k);
    }
}

/* K % 4 == 0: units of four outputs in one row and one block. */
template <int FP4> __global__ void __launch_bounds__(256) k_mx_deq4(DqArgs a)
{
    int64_t units = a.rows * a.k / 4, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += stride) {
        int64_t i = u * 4, r = i / a.k, col = i - r * a.k;
        uint8_t s = a.sc[r * a.nb + col / MXD_BLOCK];
        uint32_t codes;
        float4 v;
        if (FP4) {
            codes = *(const uint16_t *)(a.el + r * (a.kp / 2) + col / 2);
            v.x = mxd_dec_fp4(s, (uint8_t)(codes & 0xFu));
            v.y = mxd_dec_fp4(s, (uint8_t)(codes >> 4 & 0xFu));
            v.z = mxd_dec_fp4(s, (uint8_t)(codes >> 8 & 0xFu));
            v.w = mxd_dec_fp4(s, (uint8_t)(codes >> 12 & 0xFu));
        } else {
            codes = *(const uint32_t *)(a.el + r * a.kp + col);
            v.x = mxd_dec_fp8(s, (uint8_t)codes);
            v.y = mxd_dec_fp8(s, (uint8_t)(codes >> 8));
            v.z = mxd_dec_fp8(s, (uint8_t)(codes >> 16));
            v.w = mxd_dec_fp8(s, (uint8_t)(codes >> 24));
        }
        *(float4 *)(a.out + i) = v;
    }
}

template <int FP4> lpx_status launch_deq(const char *op, int dev, cudaStream_t st, const DqArgs &a)
{
    /* four outputs a unit: codes 4-byte (fp8) / 2-byte (fp4) aligned, out 16 */
    bool vec = a.k % 4 == 0 && ((uintptr_t)a.el % (FP4 ? 2 : 4)) == 0 && ((uintptr_t)a.out % 16) == 0;
    if (vec) {
        int64_t want = (a.rows * a.k / 4 + 255) / 256;
        k_mx_deq4<FP4><<<grid_for<k_mx_deq4<FP4>>(dev, want), 256, 0, st>>>(a);
    } else {
        int64_t want = (a.rows * a.k + 255) / 256;
        k_mx_deq1<FP4><<<grid_for<k_mx_deq1<FP4>>(dev, want), 256, 0, st>>>(a);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cu_fail(e, op, vec ? "launch of k_mx_deq4" : "launch of k_mx_deq1");
    return LPX_OK;
}

/* Fails unless inner tensor t of an MX tensor is what mx_wrap accepts and
 * lives on dev (the MX tensor's device). */
lpx_status check_inner(const char *op, const char *fmt, const char *what, const lpx_tensor *t, lpx_device dev,
                       lpx_dtype dtype, int ndim, const int64_t *shape, int64_t last)
{
    char sb[128];
    if (!t) return lpx_error(LPX_EINVAL, "%s(%s): %s is NULL", op, fmt, what);
    if (lpx_tensor_kind(t))
        return lpx_error(LPX_EINVAL, "%s(%s): %s is a '%s' tensor, expected dense", op, fmt, what,
                         lpx_kind_name(lpx_tensor_kind(t)));
    lpx_device d = lpx_tensor_device(t);
    if (d.type != dev.type || d.index != dev.index)
        return lpx_error(LPX_EDEVICE, "%s(%s): %s is on device %d:%d, x on %d:%d", op, fmt, what, (int)d.type,
                         (int)d.index, (int)dev.type, (int)dev.index);
    if (lpx_tensor_dtype(t) != dtype)
        return lpx_error(LPX_EDTYPE, "%s(%s): %s has dtype %s, expected %s", op, fmt, what,
                         lpx_dtype_name(lpx_tensor_dtype(t)), lpx_dtype_name(dtype));
    bool ok = lpx_tensor_ndim(t) == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = lpx_tensor_shape(t)[i] == (i == ndim - 1 ? last : shape[i]);
    if (!ok)
        return lpx_error(LPX_ESHAPE, "%s(%s): %s has shape %s; the logical shape needs its leading dims and a "
                         "last dim of %lld", op, fmt, what, lpx_tensor_shape_str(t, sb, sizeof sb), (long long)last);
    if (!lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_EINVAL, "%s(%s): %s is not contiguous", op, fmt, what);
    return LPX_OK;
}

/* mx_dequantize(Tensor x) -> Tensor on the cuda key, a typed kernel
 * (its arguments by name, through the host's libffi path). */
lpx_status k_dequantize(lpx_tensor *x, lpx_tensor **res)
{
    const char *op = "mx_dequantize";
    mx_format f = format_of(x);
    if (!f) {
        const lpx_kind *k = lpx_tensor_kind(x);
        return lpx_error(LPX_EINVAL, "%s: x is %s%s%s, not an MX tensor (mxfp8, mxfp4)", op, k ? "a '" : "dense",
                         k ? lpx_kind_name(k) : "", k ? "' tensor" : "");
    }
    const char *fmt = fmt_name(f);
    lpx_device dev = lpx_tensor_device(x);
    if (dev.type != LPX_DEVICE_CUDA || !g_stream(dev.index))
        return lpx_error(LPX_EDEVICE, "%s(%s): x is on device %d:%d, not a CUDA device lpx-cuda serves", op, fmt,
                         (int)dev.type, (int)dev.index);
    size_t ms = 0;
    const void *meta = lpx_tensor_meta(x, &ms);
    mx_meta m;
    if (!meta || ms != sizeof m || lpx_tensor_inner_count(x) != 2)
        return lpx_error(LPX_EINVAL, "%s(%s): x has %d inner tensors and %zu bytes of metadata, expected 2 and %zu",
                         op, fmt, lpx_tensor_inner_count(x), ms, sizeof m);
    memcpy(&m, meta, sizeof m);
    if (m.magic != MX_MAGIC || m.format != (uint32_t)f || m.block != MX_BLOCK)
        return lpx_error(LPX_EINVAL, "%s(%s): metadata is not %s with blocks of %d (magic 0x%x, format %u, block %u)",
                         op, fmt, fmt, MX_BLOCK, m.magic, m.format, m.block);
    int ndim = lpx_tensor_ndim(x);
    const int64_t *shape = lpx_tensor_shape(x);
    if (ndim < 1) return lpx_error(LPX_ESHAPE, "%s(%s): x is 0-d", op, fmt);
    int64_t k = shape[ndim - 1], kp = mx_kp(k), rows = 1;
    for (int i = 0; i + 1 < ndim; i++) rows *= shape[i];
    const lpx_tensor *el = lpx_tensor_inner(x, 0), *sc = lpx_tensor_inner(x, 1);
    lpx_status st = check_inner(op, fmt, "elements (inner[0])", el, dev, f == MX_FP8 ? LPX_F8E4M3FN : g_f4e2m1,
                                ndim, shape, kp);
    if (!st) st = check_inner(op, fmt, "scales (inner[1])", sc, dev, g_e8m0, ndim, shape, kp / MX_BLOCK);
    if (st) return st;
    lpx_tensor *out = NULL;
    if ((st = lpx_tensor_new(LPX_F32, ndim, shape, dev, &out))) return st;
    if (rows * k > 0) {
        cudaError_t e = cudaSetDevice(dev.index);
        if (e != cudaSuccess) st = cu_fail(e, op, "cudaSetDevice");
        DqArgs a = {(const uint8_t *)lpx_tensor_data(el), (const uint8_t *)lpx_tensor_data(sc),
                    (float *)lpx_tensor_data(out), rows, k, kp, kp / MX_BLOCK};
        cudaStream_t s = (cudaStream_t)g_stream(dev.index);
        if (!st) st = f == MX_FP4 ? launch_deq<1>(op, dev.index, s, a) : launch_deq<0>(op, dev.index, s, a);
    }
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    *res = out;
    return LPX_OK;
}

/* ---- quantize -------------------------------------------------------- */

struct QArgs {
    const float *x;      /* rows x k, contiguous f32 */
    uint8_t *el, *sc;
    int64_t rows, k, kp, nb;
    int emax;
};

/* quantize_block of mx_tensor.c, a thread per block of 32 */
template <int FP4> __global__ void __launch_bounds__(256) k_mx_quant(QArgs a)
{
    int64_t nblocks = a.rows * a.nb, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nblocks; q += stride) {
        int64_t r = q / a.nb, c0 = (q - r * a.nb) * MXD_BLOCK;
        int n = (int)(a.k - c0 < MXD_BLOCK ? a.k - c0 : MXD_BLOCK);
        const float *v = a.x + r * a.k + c0;
        uint8_t *e = a.el + (FP4 ? r * (a.kp / 2) + c0 / 2 : r * a.kp + c0);
        float amax = 0.0f;
        bool special = false;
        for (int i = 0; i < n; i++) {
            uint32_t b = lpx_f32_bits(v[i]) & 0x7FFFFFFFu;
            if (b >= 0x7F800000u) special = true;
            else if (lpx_f32_from_bits(b) > amax) amax = lpx_f32_from_bits(b);
        }
        if (special) {
            a.sc[q] = MXD_E8M0_NAN;
            for (int i = 0; i < (FP4 ? MXD_BLOCK / 2 : MXD_BLOCK); i++) e[i] = 0;
            continue;
        }
        uint8_t s = mxd_block_scale(amax, a.emax);
        int sh = MXD_E8M0_BIAS - (int)s;   /* -shared */
        a.sc[q] = s;
        if (FP4) {
            for (int i = 0; i < MXD_BLOCK; i += 2) {
                float x0 = i < n ? mxd_scale(v[i], sh) : 0.0f, x1 = i + 1 < n ? mxd_scale(v[i + 1], sh) : 0.0f;
                e[i / 2] = (uint8_t)(mxd_f32_to_e2m1(x0) | mxd_f32_to_e2m1(x1) << 4);
            }
        } else {
            for (int i = 0; i < MXD_BLOCK; i++) e[i] = lpx_f32_to_f8e4m3fn(i < n ? mxd_scale(v[i], sh) : 0.0f, 1);
        }
    }
}

/* mx_quantize(Tensor x, str format) -> Tensor on the cuda key, typed */
lpx_status k_quantize(lpx_tensor *x, const char *format, lpx_tensor **res)
{
    mx_format f = !format ? (mx_format)0 : !strcmp(format, "mxfp8") ? MX_FP8 : !strcmp(format, "mxfp4") ? MX_FP4
                                                                                                        : (mx_format)0;
    if (!f)
        return lpx_error(LPX_EINVAL, "mx_quantize: format '%s' is not 'mxfp8' or 'mxfp4'", format ? format : "(null)");
    const char *op = "mx_quantize", *fmt = fmt_name(f);
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s(%s): x is a '%s' tensor; quantize a dense tensor", op, fmt,
                         lpx_kind_name(lpx_tensor_kind(x)));
    lpx_device dev = lpx_tensor_device(x);
    if (dev.type != LPX_DEVICE_CUDA || !g_stream(dev.index))
        return lpx_error(LPX_EDEVICE, "%s(%s): x is on device %d:%d, not a CUDA device lpx-cuda serves", op, fmt,
                         (int)dev.type, (int)dev.index);
    int ndim = lpx_tensor_ndim(x);
    if (ndim < 1)
        return lpx_error(LPX_ESHAPE, "%s(%s): x is 0-d; MX blocks run along the last dim, so x needs >= 1 dim", op,
                         fmt);
    const int64_t *shape = lpx_tensor_shape(x);
    int64_t k = shape[ndim - 1], kp = mx_kp(k), rows = 1, nb = kp / MX_BLOCK;
    for (int i = 0; i + 1 < ndim; i++) rows *= shape[i];
    int64_t es[LPX_MAX_DIMS], ss[LPX_MAX_DIMS];
    memcpy(es, shape, (size_t)ndim * sizeof *es);
    memcpy(ss, shape, (size_t)ndim * sizeof *ss);
    es[ndim - 1] = kp;
    ss[ndim - 1] = nb;

    lpx_tensor *xf = NULL, *xc = NULL, *el = NULL, *sc = NULL;
    lpx_status st = lpx_kind_to_dense(x, &xf);          /* f32 (x itself if already f32) */
    if (!st) st = lpx_contiguous(xf, &xc);
    if (!st) st = lpx_tensor_new(f == MX_FP8 ? LPX_F8E4M3FN : g_f4e2m1, ndim, es, dev, &el);
    if (!st) st = lpx_tensor_new(g_e8m0, ndim, ss, dev, &sc);
    if (!st && rows * nb > 0) {
        cudaError_t e = cudaSetDevice(dev.index);
        if (e != cudaSuccess) st = cu_fail(e, op, "cudaSetDevice");
        QArgs a = {(const float *)lpx_tensor_data(xc), (uint8_t *)lpx_tensor_data(el), (uint8_t *)lpx_tensor_data(sc),
                   rows, k, kp, nb, f == MX_FP8 ? 8 : 2};
        cudaStream_t s = (cudaStream_t)g_stream(dev.index);
        int64_t want = (rows * nb + 255) / 256;
        if (!st && f == MX_FP4) k_mx_quant<1><<<grid_for<k_mx_quant<1>>(dev.index, want), 256, 0, s>>>(a);
        else if (!st) k_mx_quant<0><<<grid_for<k_mx_quant<0>>(dev.index, want), 256, 0, s>>>(a);
        if (!st && (e = cudaGetLastError()) != cudaSuccess) st = cu_fail(e, op, "launch of k_mx_quant");
    }
    if (!st) {
        mx_meta m = {MX_MAGIC, (uint32_t)f, MX_BLOCK, 0};
        lpx_tensor *inner[2] = {el, sc};
        lpx_tensor *out = NULL;
        st = lpx_tensor_new_kind(f == MX_FP8 ? g_fp8 : g_fp4, lpx_tensor_dtype(x), ndim, shape, dev, inner, 2, &m,
                                 sizeof m, &out);
        if (!st) *res = out;
    }
    lpx_tensor_release(xf);
    lpx_tensor_release(xc);
    lpx_tensor_release(el);
    lpx_tensor_release(sc);
    return st;
}

/* What the plugin needs from lpx-cuda.so and lpx-mx.so; on a miss writes
 * the reason and returns non-zero. Fills the globals. */
int find_deps(char *reason, size_t len)
{
    const lpx_plugin *cu = NULL;
    void *sym = NULL;
    int key = lpx_device_key(LPX_DEVICE_CUDA);
    if (!lpx_backend_for(LPX_DEVICE_CUDA) || !key || lpx_plugin_find("cuda", &cu) ||
        !(sym = lpx_plugin_symbol(cu, LPX_CUDA_SYM_STREAM))) {
        lpx_clear_error();
        snprintf(reason, len, "the cuda backend is not loaded (load lpx-cuda.so before lpx-mx-cuda.so)");
        return 1;
    }
    lpx_op dq = -1, q = -1;
    if (lpx_op_find("mx_dequantize", &dq) || lpx_op_find("mx_quantize", &q) || lpx_kind_find("mxfp8", &g_fp8) ||
        lpx_kind_find("mxfp4", &g_fp4) || !lpx_dtype_valid(lpx_dtype_from_name("e8m0")) ||
        !lpx_dtype_valid(lpx_dtype_from_name("f4e2m1"))) {
        lpx_clear_error();
        snprintf(reason, len, "the MX ops are not registered (load lpx-mx.so before lpx-mx-cuda.so: it brings "
                 "mx_dequantize, mx_quantize, the kinds mxfp8/mxfp4 and the dtypes e8m0/f4e2m1)");
        return 1;
    }
    memcpy(&g_stream, &sym, sizeof sym);
    g_key = key;
    g_dequantize = dq;
    g_quantize = q;
    g_e8m0 = lpx_dtype_from_name("e8m0");
    g_f4e2m1 = lpx_dtype_from_name("f4e2m1");
    return 0;
}

} // namespace

extern "C" {

LPX_PLUGIN_EXPORT int lpx_plugin_probe(const lpx_host *host, char *reason, size_t len)
{
    (void)host;
    return find_deps(reason, len);
}

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "mx-cuda";
    info->version = "0.1.0";
    info->description = "MX on CUDA: mx_dequantize and mx_quantize kernels for lpx-mx.so's mxfp8/mxfp4";
    if (host->abi_major != LPX_PLUGIN_ABI_MAJOR)
        return lpx_error(LPX_EABI, "mx-cuda: host speaks plugin ABI %u, built for %u", host->abi_major,
                         LPX_PLUGIN_ABI_MAJOR);
    char why[256];
    if (find_deps(why, sizeof why)) return lpx_error(LPX_EPLUGIN, "mx-cuda: %s", why);
    lpx_status st = host->kernel_register_typed(host, g_dequantize, g_key, "Tensor -> Tensor",
                                                (void (*)(void))k_dequantize);
    if (!st) st = host->kernel_register_typed(host, g_quantize, g_key, "Tensor, str -> Tensor",
                                              (void (*)(void))k_quantize);
    return st;
}

} // extern "C"
