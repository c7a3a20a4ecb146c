/* Kernel group creation: empty, zeros, full, arange, randn, rand on a CUDA
 * device, with the CPU backend's values (backends/cpu/creation.c):
 *  - zeros/full: the value encoded once on the host with the dtype's
 *    from_f32 (lpx_convert) and replicated by cu_fill_bytes;
 *  - arange: start + i * step in double, then (float) and one encode, or
 *    rounded half to even and clamped for i32/i64;
 *  - rand/randn: the same Philox4x32-10 counters as cpu_philox4x32_10, so
 *    rand has the CPU's bits; randn's Box-Muller runs in double with CUDA's
 *    log/cos/sin (within an ulp or two of glibc's before the rounding to
 *    f32, so nearly always the same f32).
 * Results are new contiguous tensors on the `device` argument. The
 * arguments are the `create` family's, checked by the dispatcher
 * (dispatch/spec_views.c). Plugin dtypes are refused except by empty
 * (the kernels encode built-ins only). */
#include <math.h>
#include <string.h>
#include "cuda_dtype.cuh"

#define CU_THREADS 256

/* ---- Philox4x32-10 (device) ------------------------------------------- */

__device__ __forceinline__ void cu_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
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

/* ---- kernels ---------------------------------------------------------- */

/* rand: group k = element indices 4k..4k+3, counter (k, k >> 32, 1, 0),
 * element 4k + w = (x[w] >> (32 - bits)) * 2^-bits. */
__global__ void k_rand(char *p, lpx_dtype dt, int64_t n, uint32_t key0, uint32_t key1, int bits, float scale)
{
    const int es = cu_esize(dt);
    const int64_t groups = (n + 3) / 4;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < groups; k += stride) {
        uint32_t x[4];
        cu_philox4x32_10((uint32_t)k, (uint32_t)((uint64_t)k >> 32), 1u, 0u, key0, key1, x);
        for (int w = 0; w < 4; w++) {
            int64_t i = 4 * k + w;
            if (i < n) cu_enc(dt, p + i * es, (float)(x[w] >> (32 - bits)) * scale, 0);
        }
    }
}

/* randn: pair k = elements 2k, 2k+1, counter (k, k >> 32, 0, 0). */
__global__ void k_randn(char *p, lpx_dtype dt, int64_t n, uint32_t key0, uint32_t key1)
{
    const double two_pi = 6.283185307179586476925286766559;
    const int es = cu_esize(dt);
    const int64_t pairs = (n + 1) / 2;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < pairs; k += stride) {
        uint32_t x[4];
        cu_philox4x32_10((uint32_t)k, (uint32_t)((uint64_t)k >> 32), 0u, 0u, key0, key1, x);
        uint64_t a = ((uint64_t)x[0] << 32) | x[1], b = ((uint64_t)x[2] << 32) | x[3];
        double u1 = (double)((a >> 11) + 1) * 0x1p-53, u2 = (double)(b >> 11) * 0x1p-53;
        double rad = sqrt(-2.0 * log(u1)), th = two_pi * u2;
        int64_t i = 2 * k;
        cu_enc(dt, p + i * es, (float)(rad * cos(th)), 0);
        if (i + 1 < n) cu_enc(dt, p + (i + 1) * es, (float)(rad * sin(th)), 0);
    }
}

__global__ void k_arange(char *p, lpx_dtype dt, int64_t n, double start, double step)
{
    const int es = cu_esize(dt);
    const bool wide = dt == LPX_I64, integer = dt == LPX_I64 || dt == LPX_I32;
    const int64_t lo = wide ? INT64_MIN : INT32_MIN, hi = wide ? INT64_MAX : INT32_MAX;
    const double dlo = wide ? -0x1p63 : -0x1p31, dhi = wide ? 0x1p63 : 0x1p31; /* exact doubles */
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (integer) {
            double v = nearbyint(start + (double)i * step);
            int64_t q = v <= dlo ? lo : v >= dhi ? hi : (int64_t)v;
            if (wide) ((int64_t *)p)[i] = q;
            else ((int32_t *)p)[i] = (int32_t)q;
        } else {
            cu_enc(dt, p + i * es, (float)(start + (double)i * step), 0);
        }
    }
}

/* ---- helpers ---------------------------------------------------------- */

/* This backend has no code for plugin dtypes (the kernels encode the
 * built-ins only). Not an argument check: the `create` family accepted
 * the dtype (registered, and floating-point for randn/rand). */
static lpx_status builtin_dtype(const lpx_call *c, lpx_dtype dt)
{
    if (dt < LPX_DTYPE_BUILTIN_COUNT) return LPX_OK;
    return lpx_error(LPX_EDTYPE,
                     "%s: dtype %s is not supported by the cuda kernels (make the tensor on the CPU and move it "
                     "with lpx_tensor_to)",
                     cu_op(c), lpx_dtype_get(dt)->name);
}

/* ---- kernels (boxed) -------------------------------------------------- */

/* The arguments are the `create` family's (op_args_views.h): shape, dtype
 * and the element count checked by the dispatcher. cu_use makes the
 * device current (and refuses an index this plugin does not serve: the
 * dispatcher knows device types, not how many devices a backend has). */
static lpx_status k_empty(lpx_call *c)
{
    const lpx_create_args *a = (const lpx_create_args *)lpx_op_args_of(c);
    lpx_tensor *t;
    lpx_status st;
    if ((st = cu_use(cu_op(c), a->device)) || (st = cu_new(c, a->dtype, a->ndim, a->shape, a->device, &t))) return st;
    cu_ret(c, t);
    return LPX_OK;
}

/* zeros and full: `value` everywhere (zeros: 0). */
static lpx_status k_fill(lpx_call *c)
{
    const lpx_create_args *a = (const lpx_create_args *)lpx_op_args_of(c);
    lpx_dtype dt = a->dtype;
    lpx_device dev = a->device;
    lpx_tensor *t;
    lpx_status st;
    if ((st = builtin_dtype(c, dt)) || (st = cu_use(cu_op(c), dev)) || (st = cu_new(c, dt, a->ndim, a->shape, dev, &t)))
        return st;
    float v = (float)a->value;
    unsigned char pat[8] = {0};
    if ((st = lpx_convert(pat, dt, &v, LPX_F32, 1, 0)) || (st = cu_fill_bytes(c, t, pat, cu_esize(dt)))) {
        lpx_tensor_release(t);
        return st;
    }
    cu_ret(c, t);
    return LPX_OK;
}

static lpx_status k_arange(lpx_call *c)
{
    const lpx_create_args *a = (const lpx_create_args *)lpx_op_args_of(c);
    double start = a->start, step = a->step;
    lpx_dtype dtype = a->dtype;
    lpx_device dev = a->device;
    int64_t n = a->shape[0];
    lpx_tensor *t;
    lpx_status st;
    if ((st = builtin_dtype(c, dtype)) || (st = cu_use("arange", dev)) || (st = cu_new(c, dtype, 1, &n, dev, &t)))
        return st;
    if (n > 0) {
        k_arange<<<cu_blocks(dev.index, n, CU_THREADS), CU_THREADS, 0, cu_stream(dev.index)>>>(
            (char *)lpx_tensor_data(t), dtype, n, start, step);
        if ((st = cu_launched("arange", "k_arange"))) {
            lpx_tensor_release(t);
            return st;
        }
    }
    cu_ret(c, t);
    return LPX_OK;
}

static lpx_status rng_kernel(lpx_call *c, bool normal)
{
    const lpx_create_args *a = (const lpx_create_args *)lpx_op_args_of(c);
    const char *op = cu_op(c);
    uint64_t seed = a->seed;
    lpx_dtype dtype = a->dtype;
    lpx_device dev = a->device;
    int bits = a->bits;
    lpx_status st;
    if ((st = builtin_dtype(c, dtype))) return st;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    lpx_tensor *t;
    if ((st = cu_use(op, dev)) || (st = cu_new(c, dtype, a->ndim, a->shape, dev, &t))) return st;
    int64_t n = lpx_tensor_numel(t);
    if (n > 0) {
        char *p = (char *)lpx_tensor_data(t);
        cudaStream_t stream = cu_stream(dev.index);
        if (normal) {
            k_randn<<<cu_blocks(dev.index, (n + 1) / 2, CU_THREADS), CU_THREADS, 0, stream>>>(p, dtype, n, k0, k1);
            st = cu_launched(op, "k_randn");
        } else {
            k_rand<<<cu_blocks(dev.index, (n + 3) / 4, CU_THREADS), CU_THREADS, 0, stream>>>(p, dtype, n, k0, k1, bits,
                                                                                          ldexpf(1.0f, -bits));
            st = cu_launched(op, "k_rand");
        }
        if (st) {
            lpx_tensor_release(t);
            return st;
        }
    }
    cu_ret(c, t);
    return LPX_OK;
}

static lpx_status k_randn(lpx_call *c) { return rng_kernel(c, true); }
static lpx_status k_rand(lpx_call *c) { return rng_kernel(c, false); }

extern "C" lpx_status cu_register_creation(const lpx_host *h)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
        {LPX_OP_empty, k_empty}, {LPX_OP_zeros, k_fill}, {LPX_OP_full, k_fill},
        {LPX_OP_arange, k_arange}, {LPX_OP_randn, k_randn}, {LPX_OP_rand, k_rand},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = cu_reg(h, table[i].op, table[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
