/* Kernel group copy: cast, copy_, fill_, and the device copy/convert and
 * fill that other groups reuse (cu_copy_convert, cu_fill_bytes).
 *
 * Conversions follow lpx_convert (core/dtype.c) element by element: equal
 * dtypes are a bit copy, integer <-> integer is exact through int64 and
 * clamped, i32/i64 -> a non-f32 dtype goes through a round-to-odd f32 (so
 * the final encode rounds once), everything else is decode to f32 + one
 * RNE encode (cu_dec/cu_enc: the CPU's scalar functions), so a cast on the
 * GPU has the CPU's bits.
 *
 * Paths (dst and src after broadcasting src to dst's shape):
 *  - both contiguous, one dtype: cudaMemcpyAsync;
 *  - both contiguous, both floating-point built-ins (the fp8 casts):
 *    k_cast_vec, a grid-stride loop moving 16 elements per step with
 *    16-byte loads and stores (bf16 -> f8: two 16 B loads, one 16 B store),
 *    when both pointers are 16-byte aligned; a scalar tail; to fp8, a
 *    vector with no value beyond the format's max is converted by the
 *    hardware (cast_to_f8_fast), the others by the codec;
 *  - both contiguous otherwise: k_convert_contig, one element per step;
 *  - anything else: k_convert_strided over two cu_geoms.
 *
 * copy_ across devices (one side on the CPU, or two CUDA devices) moves
 * the bytes with the backend's copy (lpx_tensor_to: a contiguous staging
 * tensor) and converts on the destination's side. */
#include <stdio.h>
#include <string.h>
#include "cuda_dtype.cuh"
#include "cuda_fp8.cuh"

#define CU_THREADS 256
#define CU_VEC 16 /* elements per step of k_cast_vec */

/* ---- one element, lpx_convert's rules -------------------------------- */

__device__ __forceinline__ bool cu_is_int(lpx_dtype d)
{
    return d == LPX_U8 || d == LPX_I8 || d == LPX_I32 || d == LPX_I64 || d == LPX_BOOL;
}

__device__ __forceinline__ int64_t cu_load_i64(lpx_dtype d, const void *p)
{
    switch (d) {
    case LPX_U8: return *(const uint8_t *)p;
    case LPX_I8: return *(const int8_t *)p;
    case LPX_I32: return *(const int32_t *)p;
    case LPX_I64: return *(const int64_t *)p;
    default: return *(const uint8_t *)p != 0; /* bool */
    }
}

__device__ __forceinline__ void cu_store_i64(lpx_dtype d, void *p, int64_t v)
{
    switch (d) {
    case LPX_U8: *(uint8_t *)p = (uint8_t)(v < 0 ? 0 : v > UINT8_MAX ? UINT8_MAX : v); break;
    case LPX_I8: *(int8_t *)p = (int8_t)(v < INT8_MIN ? INT8_MIN : v > INT8_MAX ? INT8_MAX : v); break;
    case LPX_I32: *(int32_t *)p = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v); break;
    case LPX_I64: *(int64_t *)p = v; break;
    default: *(uint8_t *)p = v != 0; break; /* bool */
    }
}

/* Bit copy of one element of es bytes (1, 2, 4 or 8). */
__device__ __forceinline__ void cu_copy_elem(void *d, const void *s, int es)
{
    switch (es) {
    case 1: *(uint8_t *)d = *(const uint8_t *)s; break;
    case 2: *(uint16_t *)d = *(const uint16_t *)s; break;
    case 4: *(uint32_t *)d = *(const uint32_t *)s; break;
    default: *(uint64_t *)d = *(const uint64_t *)s; break;
    }
}

__device__ __forceinline__ void cu_convert1(lpx_dtype ddt, void *d, lpx_dtype sdt, const void *s, int sat)
{
    if (ddt == sdt) {
        cu_copy_elem(d, s, cu_esize(sdt));
        return;
    }
    if (cu_is_int(sdt) && cu_is_int(ddt)) {
        cu_store_i64(ddt, d, cu_load_i64(sdt, s));
        return;
    }
    float v = (sdt == LPX_I32 || sdt == LPX_I64) && ddt != LPX_F32 ? lpx_i64_to_f32_odd(cu_load_i64(sdt, s))
                                                                    : cu_dec(sdt, s);
    /* for an f32 dst, cu_enc's saturation is lpx_convert's clamp_inf */
    cu_enc(ddt, d, v, sat);
}

/* ---- kernels ---------------------------------------------------------- */

__global__ void k_convert_strided(char *dst, cu_geom gd, lpx_dtype ddt, const char *src, cu_geom gs, lpx_dtype sdt,
                                  int sat)
{
    const int des = cu_esize(ddt), ses = cu_esize(sdt);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < gd.numel; i += stride)
        cu_convert1(ddt, dst + cu_offset(gd, i) * des, sdt, src + cu_offset(gs, i) * ses, sat);
}

__global__ void k_convert_contig(char *dst, lpx_dtype ddt, const char *src, lpx_dtype sdt, int64_t n, int sat)
{
    const int des = cu_esize(ddt), ses = cu_esize(sdt);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        cu_convert1(ddt, dst + i * des, sdt, src + i * ses, sat);
}

/* Storage type of the floating-point built-ins (dtypes 0..4). */
template <int DT> struct cu_float_storage { typedef uint8_t T; };
template <> struct cu_float_storage<LPX_F32> { typedef float T; };
template <> struct cu_float_storage<LPX_F16> { typedef uint16_t T; };
template <> struct cu_float_storage<LPX_BF16> { typedef uint16_t T; };

/* f32/f16/bf16 -> fp8 of CU_VEC values by the hardware conversion
 * (cu_f8::f8_fast2, cuda_fp8.cuh) when none can overflow or is NaN (all
 * |x| <= the format's max: then round-to-nearest-even on the format's
 * grid is what the codec computes, saturating or not; cu_f8::f8_fast_ok
 * says which vectors qualify before sm_89). Returns false, writing
 * nothing, when the vector needs the codec, or for other dtype pairs. */
template <int SDT, int DDT, typename ST> __device__ __forceinline__ bool cast_to_f8_fast(const ST *e, uint8_t *q)
{
    if constexpr ((DDT == LPX_F8E4M3FN || DDT == LPX_F8E5M2) && SDT != LPX_F8E4M3FN && SDT != LPX_F8E5M2) {
        constexpr bool E5 = DDT == LPX_F8E5M2;
        constexpr uint32_t lo = E5 ? cu_f8::E5_LO : cu_f8::E4_LO, hi = E5 ? cu_f8::E5_HI : cu_f8::E4_HI;
        float x[CU_VEC];
        bool ok_hi = true, ok_lo = true;
#pragma unroll
        for (int j = 0; j < CU_VEC; j++) {
            x[j] = cu_dec((lpx_dtype)SDT, &e[j]);
            uint32_t a = __float_as_uint(x[j]) & 0x7FFFFFFFu;
            ok_hi &= a <= hi;
            ok_lo &= a >= lo;
        }
        if (!cu_f8::f8_fast_ok(ok_hi, ok_lo)) return false;
#pragma unroll
        for (int j = 0; j < CU_VEC; j += 2) {
            uint32_t r = cu_f8::f8_fast2<E5>(x[j], x[j + 1]);
            q[j] = (uint8_t)r;
            q[j + 1] = (uint8_t)(r >> 8);
        }
        return true;
    } else {
        (void)e;
        (void)q;
        return false;
    }
}

/* Contiguous float -> float cast (SDT != DDT, both < 5): nvec steps of
 * CU_VEC elements through 16-byte vectors (src and dst 16-byte aligned),
 * then elements [nvec * CU_VEC, n) one by one. */
template <int SDT, int DDT>
__global__ void __launch_bounds__(CU_THREADS) k_cast_vec(const char *src, char *dst, int64_t n, int64_t nvec, int sat)
{
    typedef typename cu_float_storage<SDT>::T ST;
    typedef typename cu_float_storage<DDT>::T DT;
    constexpr int NS = CU_VEC * (int)sizeof(ST) / 16, ND = CU_VEC * (int)sizeof(DT) / 16;
    union SU { uint4 v[NS]; ST e[CU_VEC]; };
    union DU { uint4 v[ND]; DT e[CU_VEC]; };
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint4 *vs = (const uint4 *)src;
    uint4 *vd = (uint4 *)dst;
    for (int64_t k = tid; k < nvec; k += stride) {
        SU s;
        DU d;
#pragma unroll
        for (int j = 0; j < NS; j++) s.v[j] = vs[k * NS + j];
        if (!cast_to_f8_fast<SDT, DDT>(s.e, (uint8_t *)d.e)) {
#pragma unroll
            for (int j = 0; j < CU_VEC; j++) cu_enc((lpx_dtype)DDT, &d.e[j], cu_dec((lpx_dtype)SDT, &s.e[j]), sat);
        }
#pragma unroll
        for (int j = 0; j < ND; j++) vd[k * ND + j] = d.v[j];
    }
    const ST *es = (const ST *)src;
    DT *ed = (DT *)dst;
    for (int64_t i = nvec * CU_VEC + tid; i < n; i += stride)
        cu_enc((lpx_dtype)DDT, &ed[i], cu_dec((lpx_dtype)SDT, &es[i]), sat);
}

typedef void (*cast_vec_fn)(const char *, char *, int64_t, int64_t, int);

#define CV_ROW(s) {k_cast_vec<s, 0>, k_cast_vec<s, 1>, k_cast_vec<s, 2>, k_cast_vec<s, 3>, k_cast_vec<s, 4>}
/* [src][dst] over f32, f16, bf16, f8e4m3fn, f8e5m2 (the diagonal is a
 * memcpy and never launched) */
static const cast_vec_fn cast_vec_table[5][5] = {CV_ROW(0), CV_ROW(1), CV_ROW(2), CV_ROW(3), CV_ROW(4)};
#undef CV_ROW
static_assert(LPX_F32 == 0 && LPX_F16 == 1 && LPX_BF16 == 2 && LPX_F8E4M3FN == 3 && LPX_F8E5M2 == 4,
               "cast_vec_table indexes the float dtypes 0..4");

/* Stores the element pattern (es bytes, es | 16) as 16-byte vectors over
 * the first nvec * 16 bytes of p, and element by element after that. */
__global__ void k_fill_contig(char *p, int64_t n, int es, uint4 pat16, uint64_t pat, int64_t nvec)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t k = tid; k < nvec; k += stride) ((uint4 *)p)[k] = pat16;
    for (int64_t i = nvec * (16 / es) + tid; i < n; i += stride) cu_copy_elem(p + i * es, &pat, es);
}

__global__ void k_fill_strided(char *p, cu_geom g, int es, uint64_t pat)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < g.numel; i += stride)
        cu_copy_elem(p + cu_offset(g, i) * es, &pat, es);
}

/* ---- host helpers ----------------------------------------------------- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* st with "<op>: <the current message>" (lpx_error formats into the buffer
 * that lpx_last_error returns, so the message is copied first). */
static lpx_status prefixed(lpx_status st, const char *op)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    return lpx_error(st, "%s: %s", op, msg);
}

/* Byte range [lo, hi) a dense tensor's elements can touch. */
static void byte_range(const lpx_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    int64_t span = 1;
    for (int i = 0; i < lpx_tensor_ndim(t); i++) {
        if (lpx_tensor_shape(t)[i] == 0) { span = 0; break; }
        span += (lpx_tensor_shape(t)[i] - 1) * lpx_tensor_strides(t)[i];
    }
    *lo = (uintptr_t)lpx_tensor_data(t);
    *hi = *lo + (uintptr_t)span * (uintptr_t)cu_esize(lpx_tensor_dtype(t));
}

extern "C" bool cu_may_overlap(const lpx_tensor *a, const lpx_tensor *b)
{
    uintptr_t alo, ahi, blo, bhi;
    byte_range(a, &alo, &ahi);
    byte_range(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

extern "C" bool cu_same_layout(const lpx_tensor *a, const lpx_tensor *b)
{
    int nd = lpx_tensor_ndim(a);
    if (lpx_tensor_dtype(a) != lpx_tensor_dtype(b) || nd != lpx_tensor_ndim(b) ||
        lpx_tensor_data(a) != lpx_tensor_data(b))
        return false;
    for (int i = 0; i < nd; i++) {
        int64_t n = lpx_tensor_shape(a)[i];
        if (n != lpx_tensor_shape(b)[i]) return false;
        if (n > 1 && lpx_tensor_strides(a)[i] != lpx_tensor_strides(b)[i]) return false;
    }
    return true;
}

/* dst <- src (broadcast), no overlap between them; the device is current. */
/* dst [A, B] contiguous <- its transpose stored contiguously at src
 * (element (a, b) at src[b * A + a]): 64 x 64 tiles through shared memory
 * (one padding element per row), so both sides are read and written along
 * rows. The transposed copies of fp8 operands (a Float8Linear's weight
 * after the fp8 all-gather, for the backward's GEMM) come through here. */
template <typename T> __global__ void __launch_bounds__(256) k_transpose2d(T *dst, const T *src, int64_t A, int64_t B)
{
    __shared__ T tile[64][65];
    int64_t tiles_a = (A + 63) / 64;
    int64_t ta = blockIdx.x % tiles_a, tb = blockIdx.x / tiles_a;
    int64_t a0 = ta * 64, b0 = tb * 64;
    int x = threadIdx.x & 63, y = threadIdx.x >> 6;
    for (int k = y; k < 64; k += 4) {
        int64_t a = a0 + x, b = b0 + k;
        if (a < A && b < B) tile[k][x] = src[b * A + a];
    }
    __syncthreads();
    for (int k = y; k < 64; k += 4) {
        int64_t a = a0 + k, b = b0 + x;
        if (a < A && b < B) dst[a * B + b] = tile[x][k];
    }
}

template <typename T> static lpx_status transpose_launch(const char *op, int dev, void *dst, const void *src, int64_t A,
                                                         int64_t B)
{
    int64_t tiles = ((A + 63) / 64) * ((B + 63) / 64);
    if (tiles > INT32_MAX) return lpx_error(LPX_ERANGE, "%s: %lld x %lld transpose is too large", op, (long long)A,
                                            (long long)B);
    k_transpose2d<T><<<(unsigned)tiles, 256, 0, cu_stream(dev)>>>((T *)dst, (const T *)src, A, B);
    return cu_launched(op, "k_transpose2d");
}

static lpx_status convert_launch(const char *op, lpx_tensor *dst, const lpx_tensor *src, bool sat)
{
    cu_geom gd, gs;
    cu_geom_of(&gd, dst);
    cu_geom_broadcast(&gs, src, gd.ndim, gd.shape);
    int64_t n = gd.numel;
    if (n == 0) return LPX_OK;
    int dev = lpx_tensor_device(dst).index;
    cudaStream_t stream = cu_stream(dev);
    lpx_dtype ddt = lpx_tensor_dtype(dst), sdt = lpx_tensor_dtype(src);
    char *dp = (char *)lpx_tensor_data(dst);
    const char *sp = (const char *)lpx_tensor_data(src);
    bool contig = cu_geom_contiguous(&gd) && cu_geom_contiguous(&gs);
    if (contig && ddt == sdt) {
        CU_CHECK(op, cudaMemcpyAsync(dp, sp, (size_t)n * (size_t)cu_esize(ddt), cudaMemcpyDeviceToDevice, stream));
        return LPX_OK;
    }
    if (contig && ddt < 5 && sdt < 5) {
        int64_t nvec = aligned16(dp) && aligned16(sp) ? n / CU_VEC : 0;
        cast_vec_fn fn = cast_vec_table[sdt][ddt];
        int64_t work = nvec ? nvec : n;
        fn<<<cu_blocks(dev, work, CU_THREADS), CU_THREADS, 0, stream>>>(sp, dp, n, nvec, sat ? 1 : 0);
        return cu_launched(op, "k_cast_vec");
    }
    /* a bit copy of a transposed contiguous matrix */
    int es = cu_esize(ddt);
    if (ddt == sdt && (es == 1 || es == 2 || es == 4) && cu_geom_contiguous(&gd) && gd.ndim == 2 && gs.ndim == 2 &&
        gd.shape[0] > 1 && gd.shape[1] > 1 && gs.strides[0] == 1 && gs.strides[1] == gd.shape[0]) {
        int64_t A = gd.shape[0], B = gd.shape[1];
        return es == 1 ? transpose_launch<uint8_t>(op, dev, dp, sp, A, B)
             : es == 2 ? transpose_launch<uint16_t>(op, dev, dp, sp, A, B)
                       : transpose_launch<uint32_t>(op, dev, dp, sp, A, B);
    }
    if (contig) {
        k_convert_contig<<<cu_blocks(dev, n, CU_THREADS), CU_THREADS, 0, stream>>>(dp, ddt, sp, sdt, n, sat ? 1 : 0);
        return cu_launched(op, "k_convert_contig");
    }
    k_convert_strided<<<cu_blocks(dev, n, CU_THREADS), CU_THREADS, 0, stream>>>(dp, gd, ddt, sp, gs, sdt, sat ? 1 : 0);
    return cu_launched(op, "k_convert_strided");
}

extern "C" lpx_status cu_copy_convert(const lpx_call *c, lpx_tensor *dst, const lpx_tensor *src, bool sat)
{
    const char *op = cu_op(c);
    if (lpx_tensor_numel(dst) == 0) return LPX_OK;
    lpx_status st = cu_use(op, lpx_tensor_device(dst));
    if (st) return st;
    lpx_tensor *tmp = NULL;
    if (cu_may_overlap(dst, src)) {
        /* copying onto itself: equal dtypes are a bit copy, nothing to do */
        if (cu_same_layout(dst, src)) return LPX_OK;
        /* read src from a private copy in its own dtype (exact) */
        if ((st = cu_new(c, lpx_tensor_dtype(src), lpx_tensor_ndim(src), lpx_tensor_shape(src),
                         lpx_tensor_device(dst), &tmp)))
            return st;
        if ((st = convert_launch(op, tmp, src, false))) {
            lpx_tensor_release(tmp);
            return st;
        }
        src = tmp;
    }
    st = convert_launch(op, dst, src, sat);
    lpx_tensor_release(tmp); /* freed in stream order: after the kernel read it */
    return st;
}

extern "C" lpx_status cu_fill_bytes(const lpx_call *c, lpx_tensor *t, const void *pat, int esize)
{
    const char *op = cu_op(c);
    int64_t n = lpx_tensor_numel(t);
    if (n == 0) return LPX_OK;
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
        return lpx_error(LPX_EINVAL, "%s: cannot fill elements of %d bytes", op, esize);
    lpx_device d = lpx_tensor_device(t);
    lpx_status st = cu_use(op, d);
    if (st) return st;
    cudaStream_t stream = cu_stream(d.index);
    char *p = (char *)lpx_tensor_data(t);
    const unsigned char *b = (const unsigned char *)pat;
    uint64_t p8 = 0;
    memcpy(&p8, pat, (size_t)esize);
    cu_geom g;
    cu_geom_of(&g, t);
    if (!cu_geom_contiguous(&g)) {
        k_fill_strided<<<cu_blocks(d.index, n, CU_THREADS), CU_THREADS, 0, stream>>>(p, g, esize, p8);
        return cu_launched(op, "k_fill_strided");
    }
    bool one_byte = true;
    for (int i = 1; i < esize; i++) one_byte = one_byte && b[i] == b[0];
    if (one_byte) {
        CU_CHECK(op, cudaMemsetAsync(p, b[0], (size_t)n * (size_t)esize, stream));
        return LPX_OK;
    }
    unsigned char rep[16];
    for (int i = 0; i < 16; i++) rep[i] = b[i % esize];
    uint4 p16;
    memcpy(&p16, rep, sizeof p16);
    int64_t nvec = aligned16(p) ? n * esize / 16 : 0;
    k_fill_contig<<<cu_blocks(d.index, nvec ? nvec : n, CU_THREADS), CU_THREADS, 0, stream>>>(p, n, esize, p16, p8,
                                                                                            nvec);
    return cu_launched(op, "k_fill_contig");
}

/* ---- cast ------------------------------------------------------------- */

/* The contract (dtype registered, x not of a kind) is the dispatcher's:
 * spec family `cast` (op_args_elementwise.h). lpx-cuda's own limit: code
 * for the built-in dtypes, on either side. */
static lpx_status k_cast(lpx_call *c)
{
    const lpx_cast_args *a = (const lpx_cast_args *)lpx_op_args_of(c);
    lpx_tensor *x = a->x;
    lpx_dtype dt = a->dtype;
    bool sat = a->saturate;
    lpx_status st = cu_builtin_dtype(c, "x", x);
    if (st) return st;
    const lpx_dtype_traits *td = lpx_dtype_get(dt);
    if (dt >= LPX_DTYPE_BUILTIN_COUNT)
        return lpx_error(LPX_EDTYPE,
                         "cast: target dtype %s is not supported by the cuda kernels (cast on the CPU and move "
                         "the result with lpx_tensor_to)",
                         td->name);
    lpx_tensor *y;
    if ((st = cu_new(c, dt, lpx_tensor_ndim(x), lpx_tensor_shape(x), lpx_tensor_device(x), &y))) return st;
    if ((st = cu_copy_convert(c, y, x, sat))) {
        lpx_tensor_release(y);
        return st;
    }
    cu_ret(c, y);
    return LPX_OK;
}

/* ---- copy_ ------------------------------------------------------------ */

static bool same_shape(const lpx_tensor *a, const lpx_tensor *b)
{
    int nd = lpx_tensor_ndim(a);
    if (nd != lpx_tensor_ndim(b)) return false;
    for (int i = 0; i < nd; i++)
        if (lpx_tensor_shape(a)[i] != lpx_tensor_shape(b)[i]) return false;
    return true;
}

static bool same_device(lpx_device a, lpx_device b) { return a.type == b.type && a.index == b.index; }

/* copy_ with one side off dst's CUDA device: dst is on a CUDA device, src
 * on the CPU or another CUDA device. */
static lpx_status copy_to_cuda(lpx_call *c, lpx_tensor *dst, lpx_tensor *src)
{
    const char *op = cu_op(c);
    lpx_device dd = lpx_tensor_device(dst), sd = lpx_tensor_device(src);
    lpx_status st = cu_use(op, dd);
    if (st) return st;
    bool peer = sd.type == LPX_DEVICE_CUDA;
    if (lpx_tensor_dtype(src) < 0 || lpx_tensor_dtype(src) >= LPX_DTYPE_BUILTIN_COUNT)
        return lpx_error(LPX_EDTYPE,
                         "copy_: src has dtype %s, which the cuda kernels do not support (convert it on the CPU "
                         "first)", lpx_dtype_name(lpx_tensor_dtype(src)));
    if (peer) {
        /* the staging buffer is allocated in dst's stream order but written
         * on src's stream: let dst's queue drain first */
        CU_CHECK(op, cudaStreamSynchronize(cu_stream(dd.index)));
    }
    size_t nbytes = (size_t)lpx_tensor_numel(dst) * (size_t)cu_esize(lpx_tensor_dtype(dst));
    if (!peer && lpx_tensor_dtype(dst) == lpx_tensor_dtype(src) && same_shape(dst, src) &&
        lpx_tensor_is_contiguous(dst) && lpx_tensor_is_contiguous(src)) {
        /* upload straight into dst (the backend copy completes before it
         * returns, so the host buffer may go away right after) */
        const lpx_backend_i *be = lpx_backend_for(LPX_DEVICE_CUDA);
        if (!nbytes) return LPX_OK;
        return be->copy(be->self, lpx_tensor_data(dst), dd, lpx_tensor_data(src), sd, nbytes);
    }
    lpx_tensor *stage = NULL;
    if ((st = lpx_tensor_to(src, dd, &stage))) return prefixed(st, op);
    if (peer) {
        /* the peer copy ran on src's stream; the convert runs on dst's */
        lpx_status e = cu_use(op, sd);
        if (!e) {
            cudaError_t ce = cudaStreamSynchronize(cu_stream(sd.index));
            if (ce != cudaSuccess) e = cu_fail(ce, op, "cudaStreamSynchronize(src stream)");
        }
        if (!e) e = cu_use(op, dd);
        if (e) {
            lpx_tensor_release(stage);
            return e;
        }
    }
    st = cu_copy_convert(c, dst, stage, false);
    lpx_tensor_release(stage);
    return st;
}

/* copy_ from a CUDA src into a CPU dst: download, then the CPU's copy_
 * converts and lays out (or one straight download when nothing changes). */
static lpx_status copy_to_host(lpx_call *c, lpx_tensor *dst, lpx_tensor *src)
{
    const char *op = cu_op(c);
    lpx_status st = cu_builtin_dtype(c, "src", src);
    if (st) return st;
    if (lpx_tensor_dtype(dst) == lpx_tensor_dtype(src) && same_shape(dst, src) && lpx_tensor_is_contiguous(dst) &&
        lpx_tensor_is_contiguous(src)) {
        size_t nbytes = (size_t)lpx_tensor_numel(dst) * (size_t)cu_esize(lpx_tensor_dtype(dst));
        const lpx_backend_i *be = lpx_backend_for(LPX_DEVICE_CUDA);
        if (!nbytes) return LPX_OK;
        return be->copy(be->self, lpx_tensor_data(dst), lpx_tensor_device(dst), lpx_tensor_data(src),
                        lpx_tensor_device(src), nbytes);
    }
    lpx_tensor *stage = NULL;
    if ((st = lpx_tensor_to(src, lpx_cpu(), &stage))) return prefixed(st, op);
    st = lpx_copy_(dst, stage);
    lpx_tensor_release(stage);
    return st;
}

/* The contract (dst and src dense, dst writable, src broadcasting to dst;
 * devices may differ) is the dispatcher's: spec family `copy`
 * (op_args_elementwise.h). lpx-cuda's own limit: code for the built-in
 * dtypes on its side. */
static lpx_status k_copy_(lpx_call *c)
{
    const lpx_copy_args *a = (const lpx_copy_args *)lpx_op_args_of(c);
    lpx_tensor *dst = a->dst, *src = a->src;
    lpx_status st;
    lpx_device dd = lpx_tensor_device(dst), sd = lpx_tensor_device(src);
    if (dd.type == LPX_DEVICE_CUDA && same_device(dd, sd)) {
        if ((st = cu_builtin_dtype(c, "dst", dst)) || (st = cu_builtin_dtype(c, "src", src))) return st;
        st = cu_copy_convert(c, dst, src, false);
    } else if (dd.type == LPX_DEVICE_CUDA) {
        if ((st = cu_builtin_dtype(c, "dst", dst))) return st;
        st = copy_to_cuda(c, dst, src);
    } else if (dd.type == LPX_DEVICE_CPU && sd.type == LPX_DEVICE_CUDA) {
        st = copy_to_host(c, dst, src);
    } else {
        st = lpx_error(LPX_EDEVICE, "copy_: no cuda path copies from device type %d to device type %d",
                       (int)sd.type, (int)dd.type);
    }
    if (st) return st;
    lpx_tensor_retain(dst);
    cu_ret(c, dst);
    return LPX_OK;
}

/* ---- fill_ ------------------------------------------------------------ */

/* The contract (dst dense, writable, of a dtype of single elements) is the
 * dispatcher's: spec family `fill` (op_args_elementwise.h). */
static lpx_status k_fill_(lpx_call *c)
{
    const lpx_fill_args *a = (const lpx_fill_args *)lpx_op_args_of(c);
    lpx_tensor *dst = a->dst;
    /* lpx-cuda's own limit: code for the built-in dtypes */
    lpx_status st = cu_builtin_dtype(c, "dst", dst);
    if (st) return st;
    lpx_dtype dt = lpx_tensor_dtype(dst);
    float v = a->value;
    /* encoded on the host with the dtype's from_f32, as the CPU kernel does */
    unsigned char pat[8] = {0};
    if ((st = lpx_convert(pat, dt, &v, LPX_F32, 1, 0))) return st;
    if ((st = cu_fill_bytes(c, dst, pat, cu_esize(dt)))) return st;
    lpx_tensor_retain(dst);
    cu_ret(c, dst);
    return LPX_OK;
}

extern "C" lpx_status cu_register_copy(const lpx_host *h)
{
    lpx_status st;
    if ((st = cu_reg(h, LPX_OP_cast, k_cast))) return st;
    if ((st = cu_reg(h, LPX_OP_copy_, k_copy_))) return st;
    return cu_reg(h, LPX_OP_fill_, k_fill_);
}
