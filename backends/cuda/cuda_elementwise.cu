/* Kernel group elementwise: add, sub, mul, div, swiglu (numpy
 * broadcasting, optional out), add_scalar, mul_scalar, neg, abs, sqrt, exp,
 * relu, silu, gelu and the backward ops (swiglu_backward: two results in
 * one pass), with the CPU backend's semantics
 * (backends/cpu/elementwise.c): arithmetic in f32 whatever the storage
 * dtype, result in the first input's dtype, one RNE encode. The plugin is
 * built with --fmad=false and IEEE division and square root, so + - * /
 * and sqrt round like the C reference (bit-exact); expf/erff are CUDA's,
 * within 2 ulp of glibc's.
 *
 * Two paths per op:
 *  - contiguous: every operand contiguous with the result's shape (no
 *    broadcast) and one dtype among f32, f16, bf16: a grid-stride loop over
 *    16-byte vectors (4 f32 or 8 half values per load) when every pointer
 *    is 16-byte aligned, then a scalar tail;
 *  - generic: any layouts, broadcasting and dtypes, indexed through
 *    cu_geom.
 * An `out` that overlaps an input without having exactly its layout gets a
 * private copy of that input first (each thread reads its elements before
 * writing them, so out == input exactly is safe). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cuda_dtype.cuh"
#include "activations.h"

#define CU_THREADS 256

/* the op codes, from the families' op lists (op_args*.h) */
#define B_CODE(op, N) B_##N,
#define U_CODE(op, N) U_##N,
enum { LPX_BINARY_OPS(B_CODE) };
enum { LPX_UNARY_OPS(U_CODE) };

/* ---- scalar math (f32): core/numerics/activations.h, shared with the CPU */

template <int OP> __device__ __forceinline__ float bin_f(float a, float b)
{
    switch (OP) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_RELU_BW: return b > 0.0f ? a : 0.0f;
    case B_SILU_BW: return a * lpx_silu_grad(b);
    case B_SWIGLU: return lpx_swiglu_f(a, b);
    default: return a * lpx_gelu_grad(b); /* B_GELU_BW */
    }
}

template <int OP> __device__ __forceinline__ float un_f(float x, float s)
{
    switch (OP) {
    case U_NEG: return -x;
    case U_ABS: return fabsf(x);
    case U_SQRT: return sqrtf(x);
    case U_EXP: return expf(x);
    case U_RELU: return x < 0.0f ? 0.0f : x; /* keeps NaN, as torch */
    case U_SILU: return lpx_silu_f(x);
    case U_GELU: return lpx_gelu_f(x);
    case U_ADDS: return x + s;
    default: return x * s; /* U_MULS */
    }
}

/* ---- kernels ---------------------------------------------------------- */

/* o = a OP b over n contiguous elements of dtype DT (f32, f16 or bf16):
 * nvec 16-byte vectors, then the rest one by one. o may be a or b. */
template <int OP, int DT>
__global__ void __launch_bounds__(CU_THREADS) k_bin_contig(const char *a, const char *b, char *o, int64_t n,
                                                           int64_t nvec)
{
    typedef typename cu_half_storage<DT>::T T;
    constexpr int VE = 16 / (int)sizeof(T);
    union U { uint4 v; T e[VE]; };
    const lpx_dtype dt = (lpx_dtype)DT;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t k = tid; k < nvec; k += stride) {
        U ua, ub, uo;
        ua.v = ((const uint4 *)a)[k];
        ub.v = ((const uint4 *)b)[k];
#pragma unroll
        for (int j = 0; j < VE; j++) cu_enc(dt, &uo.e[j], bin_f<OP>(cu_dec(dt, &ua.e[j]), cu_dec(dt, &ub.e[j])), 0);
        ((uint4 *)o)[k] = uo.v;
    }
    const T *ea = (const T *)a, *eb = (const T *)b;
    T *eo = (T *)o;
    for (int64_t i = nvec * VE + tid; i < n; i += stride)
        cu_enc(dt, &eo[i], bin_f<OP>(cu_dec(dt, &ea[i]), cu_dec(dt, &eb[i])), 0);
}

/* o = a OP b, any layouts/dtypes; ga and gb are broadcast to go's shape. */
template <int OP>
__global__ void k_bin_strided(const char *a, cu_geom ga, lpx_dtype da, const char *b, cu_geom gb, lpx_dtype db,
                              char *o, cu_geom go, lpx_dtype dO)
{
    const int ea = cu_esize(da), eb = cu_esize(db), eo = cu_esize(dO);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < go.numel; i += stride) {
        float x = cu_dec(da, a + cu_offset(ga, i) * ea), y = cu_dec(db, b + cu_offset(gb, i) * eb);
        cu_enc(dO, o + cu_offset(go, i) * eo, bin_f<OP>(x, y), 0);
    }
}

/* swiglu_backward over n contiguous elements of dtype DT (f32, f16 or
 * bf16) in all five tensors: dg = g * b * silu'(a), du = g * silu(a);
 * nvec 16-byte vectors, then the rest one by one. */
template <int DT>
__global__ void __launch_bounds__(CU_THREADS) k_swiglu_bw_contig(const char *g, const char *a, const char *b, char *dg,
                                                                 char *du, int64_t n, int64_t nvec)
{
    typedef typename cu_half_storage<DT>::T T;
    constexpr int VE = 16 / (int)sizeof(T);
    union U { uint4 v; T e[VE]; };
    const lpx_dtype dt = (lpx_dtype)DT;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t k = tid; k < nvec; k += stride) {
        U ug, ua, ub, udg, udu;
        ug.v = ((const uint4 *)g)[k];
        ua.v = ((const uint4 *)a)[k];
        ub.v = ((const uint4 *)b)[k];
#pragma unroll
        for (int j = 0; j < VE; j++) {
            float x, y;
            lpx_swiglu_grad(cu_dec(dt, &ug.e[j]), cu_dec(dt, &ua.e[j]), cu_dec(dt, &ub.e[j]), &x, &y);
            cu_enc(dt, &udg.e[j], x, 0);
            cu_enc(dt, &udu.e[j], y, 0);
        }
        ((uint4 *)dg)[k] = udg.v;
        ((uint4 *)du)[k] = udu.v;
    }
    const T *eg = (const T *)g, *ea = (const T *)a, *eb = (const T *)b;
    T *edg = (T *)dg, *edu = (T *)du;
    for (int64_t i = nvec * VE + tid; i < n; i += stride) {
        float x, y;
        lpx_swiglu_grad(cu_dec(dt, &eg[i]), cu_dec(dt, &ea[i]), cu_dec(dt, &eb[i]), &x, &y);
        cu_enc(dt, &edg[i], x, 0);
        cu_enc(dt, &edu[i], y, 0);
    }
}

/* swiglu_backward, any layouts and float dtypes: g, a, b, dg and du of
 * one shape (dg and du the new contiguous results). */
__global__ void k_swiglu_bw_strided(const char *g, cu_geom gg, lpx_dtype tg, const char *a, cu_geom ga, lpx_dtype ta,
                                    const char *b, cu_geom gb, lpx_dtype tb, char *dg, cu_geom gdg, lpx_dtype tdg,
                                    char *du, cu_geom gdu, lpx_dtype tdu)
{
    const int eg = cu_esize(tg), ea = cu_esize(ta), eb = cu_esize(tb), edg = cu_esize(tdg), edu = cu_esize(tdu);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < gdg.numel; i += stride) {
        float x, y;
        lpx_swiglu_grad(cu_dec(tg, g + cu_offset(gg, i) * eg), cu_dec(ta, a + cu_offset(ga, i) * ea),
                        cu_dec(tb, b + cu_offset(gb, i) * eb), &x, &y);
        cu_enc(tdg, dg + cu_offset(gdg, i) * edg, x, 0);
        cu_enc(tdu, du + cu_offset(gdu, i) * edu, y, 0);
    }
}

template <int OP, int DT>
__global__ void __launch_bounds__(CU_THREADS) k_un_contig(const char *x, char *o, float s, int64_t n, int64_t nvec)
{
    typedef typename cu_half_storage<DT>::T T;
    constexpr int VE = 16 / (int)sizeof(T);
    union U { uint4 v; T e[VE]; };
    const lpx_dtype dt = (lpx_dtype)DT;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t k = tid; k < nvec; k += stride) {
        U ux, uo;
        ux.v = ((const uint4 *)x)[k];
#pragma unroll
        for (int j = 0; j < VE; j++) cu_enc(dt, &uo.e[j], un_f<OP>(cu_dec(dt, &ux.e[j]), s), 0);
        ((uint4 *)o)[k] = uo.v;
    }
    const T *ex = (const T *)x;
    T *eo = (T *)o;
    for (int64_t i = nvec * VE + tid; i < n; i += stride) cu_enc(dt, &eo[i], un_f<OP>(cu_dec(dt, &ex[i]), s), 0);
}

template <int OP>
__global__ void k_un_strided(const char *x, cu_geom gx, lpx_dtype dx, char *o, cu_geom go, lpx_dtype dO, float s)
{
    const int ex = cu_esize(dx), eo = cu_esize(dO);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < go.numel; i += stride)
        cu_enc(dO, o + cu_offset(go, i) * eo, un_f<OP>(cu_dec(dx, x + cu_offset(gx, i) * ex), s), 0);
}

/* ---- launchers -------------------------------------------------------- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Everything one launch needs: operand pointers, geometries broadcast to
 * the result's shape, dtypes. */
typedef struct ew_args {
    const char *op;
    int dev;
    const char *a, *b;
    char *o;
    cu_geom ga, gb, go;
    lpx_dtype da, db, dO;
    float s;
} ew_args;

/* The contiguous path applies: one dtype among f32/f16/bf16, every
 * operand contiguous over the result's shape. Sets *nvec (0 when some
 * pointer is not 16-byte aligned). */
static bool contig_path(const ew_args *w, bool binary, int64_t *nvec)
{
    if (w->dO != LPX_F32 && w->dO != LPX_F16 && w->dO != LPX_BF16) return false;
    if (w->da != w->dO || (binary && w->db != w->dO)) return false;
    if (!cu_geom_contiguous(&w->ga) || !cu_geom_contiguous(&w->go) || (binary && !cu_geom_contiguous(&w->gb)))
        return false;
    bool al = aligned16(w->a) && aligned16(w->o) && (!binary || aligned16(w->b));
    *nvec = al ? w->go.numel / (16 / cu_esize(w->dO)) : 0;
    return true;
}

template <int OP> static lpx_status bin_launch(const ew_args *w)
{
    cudaStream_t stream = cu_stream(w->dev);
    int64_t n = w->go.numel, nvec = 0;
    if (contig_path(w, true, &nvec)) {
        unsigned blocks = cu_blocks(w->dev, nvec ? nvec : n, CU_THREADS);
        switch (w->dO) {
        case LPX_F32: k_bin_contig<OP, LPX_F32><<<blocks, CU_THREADS, 0, stream>>>(w->a, w->b, w->o, n, nvec); break;
        case LPX_F16: k_bin_contig<OP, LPX_F16><<<blocks, CU_THREADS, 0, stream>>>(w->a, w->b, w->o, n, nvec); break;
        default: k_bin_contig<OP, LPX_BF16><<<blocks, CU_THREADS, 0, stream>>>(w->a, w->b, w->o, n, nvec); break;
        }
        return cu_launched(w->op, "k_bin_contig");
    }
    k_bin_strided<OP><<<cu_blocks(w->dev, n, CU_THREADS), CU_THREADS, 0, stream>>>(w->a, w->ga, w->da, w->b, w->gb,
                                                                                 w->db, w->o, w->go, w->dO);
    return cu_launched(w->op, "k_bin_strided");
}

template <int OP> static lpx_status un_launch(const ew_args *w)
{
    cudaStream_t stream = cu_stream(w->dev);
    int64_t n = w->go.numel, nvec = 0;
    if (contig_path(w, false, &nvec)) {
        unsigned blocks = cu_blocks(w->dev, nvec ? nvec : n, CU_THREADS);
        switch (w->dO) {
        case LPX_F32: k_un_contig<OP, LPX_F32><<<blocks, CU_THREADS, 0, stream>>>(w->a, w->o, w->s, n, nvec); break;
        case LPX_F16: k_un_contig<OP, LPX_F16><<<blocks, CU_THREADS, 0, stream>>>(w->a, w->o, w->s, n, nvec); break;
        default: k_un_contig<OP, LPX_BF16><<<blocks, CU_THREADS, 0, stream>>>(w->a, w->o, w->s, n, nvec); break;
        }
        return cu_launched(w->op, "k_un_contig");
    }
    k_un_strided<OP><<<cu_blocks(w->dev, n, CU_THREADS), CU_THREADS, 0, stream>>>(w->a, w->ga, w->da, w->o, w->go,
                                                                                w->dO, w->s);
    return cu_launched(w->op, "k_un_strided");
}

static lpx_status bin_dispatch(int op, const ew_args *w)
{
    switch (op) {
    case B_ADD: return bin_launch<B_ADD>(w);
    case B_SUB: return bin_launch<B_SUB>(w);
    case B_MUL: return bin_launch<B_MUL>(w);
    case B_DIV: return bin_launch<B_DIV>(w);
    case B_RELU_BW: return bin_launch<B_RELU_BW>(w);
    case B_SILU_BW: return bin_launch<B_SILU_BW>(w);
    case B_SWIGLU: return bin_launch<B_SWIGLU>(w);
    default: return bin_launch<B_GELU_BW>(w);
    }
}

static lpx_status un_dispatch(int op, const ew_args *w)
{
    switch (op) {
    case U_NEG: return un_launch<U_NEG>(w);
    case U_ABS: return un_launch<U_ABS>(w);
    case U_SQRT: return un_launch<U_SQRT>(w);
    case U_EXP: return un_launch<U_EXP>(w);
    case U_RELU: return un_launch<U_RELU>(w);
    case U_SILU: return un_launch<U_SILU>(w);
    case U_GELU: return un_launch<U_GELU>(w);
    case U_ADDS: return un_launch<U_ADDS>(w);
    default: return un_launch<U_MULS>(w);
    }
}

/* ---- argument handling ------------------------------------------------ */

/* A private contiguous copy of x when `out` overlaps it in a way an
 * in-place kernel cannot handle; *copy stays NULL otherwise. */
static lpx_status unalias(const lpx_call *c, const lpx_tensor *out, const lpx_tensor *x, lpx_tensor **copy)
{
    *copy = NULL;
    if (!out || !cu_may_overlap(out, x) || cu_same_layout(out, x)) return LPX_OK;
    lpx_status st = cu_new(c, lpx_tensor_dtype(x), lpx_tensor_ndim(x), lpx_tensor_shape(x), lpx_tensor_device(x), copy);
    if (st) return st;
    if ((st = cu_copy_convert(c, *copy, x, false))) {
        lpx_tensor_release(*copy);
        *copy = NULL;
    }
    return st;
}

/* ---- kernels (boxed) -------------------------------------------------- */

/* The contract (dense operands on one device, broadcasting, the result's
 * shape and dtype, a valid `out`) is the dispatcher's: spec family
 * `binary` (op_args.h). */
static lpx_status binary(lpx_call *c, int op)
{
    const lpx_binary_args *g = (const lpx_binary_args *)lpx_op_args_of(c);
    const char *opn = cu_op(c);
    lpx_tensor *a = g->a, *b = g->b, *o = g->out;
    lpx_status st;
    int nd = g->ndim;
    const int64_t *shape = g->shape;
    lpx_tensor *res, *ca = NULL, *cb = NULL;
    if (o) {
        lpx_tensor_retain(o);
        res = o;
    } else if ((st = cu_new(c, g->dtype, nd, shape, lpx_tensor_device(a), &res))) {
        return st;
    }
    if ((st = cu_use(opn, lpx_tensor_device(a))) || (st = unalias(c, o, a, &ca)) || (st = unalias(c, o, b, &cb))) {
        lpx_tensor_release(ca);
        lpx_tensor_release(res);
        return st;
    }
    const lpx_tensor *ua = ca ? ca : a, *ub = cb ? cb : b;
    ew_args w;
    memset(&w, 0, sizeof w);
    w.op = opn;
    w.dev = lpx_tensor_device(a).index;
    w.a = (const char *)lpx_tensor_data(ua);
    w.b = (const char *)lpx_tensor_data(ub);
    w.o = (char *)lpx_tensor_data(res);
    cu_geom_broadcast(&w.ga, ua, nd, shape);
    cu_geom_broadcast(&w.gb, ub, nd, shape);
    cu_geom_of(&w.go, res);
    w.da = lpx_tensor_dtype(ua);
    w.db = lpx_tensor_dtype(ub);
    w.dO = lpx_tensor_dtype(res);
    if (w.go.numel) st = bin_dispatch(op, &w);
    lpx_tensor_release(ca); /* stream-ordered frees: after the kernel */
    lpx_tensor_release(cb);
    if (st) {
        lpx_tensor_release(res);
        return st;
    }
    cu_ret(c, res);
    return LPX_OK;
}

#define K_BINARY(op, N) static lpx_status k_##op(lpx_call *c) { return binary(c, B_##N); }
LPX_BINARY_OPS(K_BINARY)

/* swiglu_backward: the contract is the dispatcher's (spec family
 * `swiglu_backward`, op_args_nn.h): dense tensors of one shape on one
 * device. Results are new and contiguous: grad_gate in
 * gate's dtype, grad_up in up's. The contiguous path needs grad, gate and
 * up contiguous and one dtype among f32/f16/bf16 for all five (16-byte
 * vectors when every pointer is aligned); anything else is indexed
 * through cu_geom. */
static lpx_status k_swiglu_backward(lpx_call *c)
{
    const char *opn = cu_op(c);
    const lpx_swiglu_backward_args *sa = (const lpx_swiglu_backward_args *)lpx_op_args_of(c);
    lpx_tensor *g = sa->grad, *a = sa->gate, *b = sa->up;
    lpx_status st;
    lpx_device dev = lpx_tensor_device(a);
    int nd = lpx_tensor_ndim(a);
    const int64_t *shape = lpx_tensor_shape(a);
    lpx_dtype dtg = lpx_tensor_dtype(g), dta = lpx_tensor_dtype(a), dtb = lpx_tensor_dtype(b);
    lpx_tensor *dg = NULL, *du = NULL;
    if ((st = cu_new(c, dta, nd, shape, dev, &dg)) || (st = cu_new(c, dtb, nd, shape, dev, &du))) goto fail;
    if (lpx_tensor_numel(a) > 0) {
        if ((st = cu_use(opn, dev))) goto fail;
        cudaStream_t stream = cu_stream(dev.index);
        const char *pg = (const char *)lpx_tensor_data(g), *pa = (const char *)lpx_tensor_data(a),
                   *pb = (const char *)lpx_tensor_data(b);
        char *pdg = (char *)lpx_tensor_data(dg), *pdu = (char *)lpx_tensor_data(du);
        int64_t n = lpx_tensor_numel(a);
        bool contig = (dta == LPX_F32 || dta == LPX_F16 || dta == LPX_BF16) && dtg == dta && dtb == dta &&
                      lpx_tensor_is_contiguous(g) && lpx_tensor_is_contiguous(a) && lpx_tensor_is_contiguous(b);
        if (contig) {
            bool al = aligned16(pg) && aligned16(pa) && aligned16(pb) && aligned16(pdg) && aligned16(pdu);
            int64_t nvec = al ? n / (16 / cu_esize(dta)) : 0;
            unsigned blocks = cu_blocks(dev.index, nvec ? nvec : n, CU_THREADS);
            switch (dta) {
            case LPX_F32:
                k_swiglu_bw_contig<LPX_F32><<<blocks, CU_THREADS, 0, stream>>>(pg, pa, pb, pdg, pdu, n, nvec);
                break;
            case LPX_F16:
                k_swiglu_bw_contig<LPX_F16><<<blocks, CU_THREADS, 0, stream>>>(pg, pa, pb, pdg, pdu, n, nvec);
                break;
            default:
                k_swiglu_bw_contig<LPX_BF16><<<blocks, CU_THREADS, 0, stream>>>(pg, pa, pb, pdg, pdu, n, nvec);
                break;
            }
            st = cu_launched(opn, "k_swiglu_bw_contig");
        } else {
            cu_geom gg, ga, gb, gdg, gdu;
            cu_geom_of(&gg, g);
            cu_geom_of(&ga, a);
            cu_geom_of(&gb, b);
            cu_geom_of(&gdg, dg);
            cu_geom_of(&gdu, du);
            k_swiglu_bw_strided<<<cu_blocks(dev.index, n, CU_THREADS), CU_THREADS, 0, stream>>>(
                pg, gg, dtg, pa, ga, dta, pb, gb, dtb, pdg, gdg, dta, pdu, gdu, dtb);
            st = cu_launched(opn, "k_swiglu_bw_strided");
        }
        if (st) goto fail;
    }
    cu_ret(c, dg);
    cu_ret(c, du);
    return LPX_OK;
fail:
    lpx_tensor_release(dg);
    lpx_tensor_release(du);
    return st;
}

/* The contract (x dense, the result's shape and dtype, a valid `out` on
 * x's device) is the dispatcher's: spec family `unary`
 * (op_args_elementwise.h). */
static lpx_status unary(lpx_call *c, int op)
{
    const lpx_unary_args *u = (const lpx_unary_args *)lpx_op_args_of(c);
    const char *opn = cu_op(c);
    lpx_tensor *x = u->x, *o = u->out;
    /* lpx-cuda's own limit: code for the built-in dtypes (out has x's) */
    lpx_status st = cu_builtin_dtype(c, c->nargs == 3 ? "a" : "x", x);
    lpx_tensor *res, *cx = NULL;
    if (st) return st;
    if (o) {
        lpx_tensor_retain(o);
        res = o;
    } else if ((st = cu_new(c, lpx_tensor_dtype(x), lpx_tensor_ndim(x), lpx_tensor_shape(x), lpx_tensor_device(x),
                            &res))) {
        return st;
    }
    if ((st = cu_use(opn, lpx_tensor_device(x))) || (st = unalias(c, o, x, &cx))) {
        lpx_tensor_release(res);
        return st;
    }
    const lpx_tensor *ux = cx ? cx : x;
    ew_args w;
    memset(&w, 0, sizeof w);
    w.op = opn;
    w.dev = lpx_tensor_device(x).index;
    w.a = (const char *)lpx_tensor_data(ux);
    w.o = (char *)lpx_tensor_data(res);
    cu_geom_of(&w.ga, ux);
    cu_geom_of(&w.go, res);
    w.da = lpx_tensor_dtype(ux);
    w.dO = lpx_tensor_dtype(res);
    w.s = u->s;
    if (w.go.numel) st = un_dispatch(op, &w);
    lpx_tensor_release(cx);
    if (st) {
        lpx_tensor_release(res);
        return st;
    }
    cu_ret(c, res);
    return LPX_OK;
}

#define K_UNARY(op, N) static lpx_status k_##op(lpx_call *c) { return unary(c, U_##N); }
LPX_UNARY_OPS(K_UNARY)

extern "C" lpx_status cu_register_elementwise(const lpx_host *h)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
#define ROW(op, N) {LPX_OP_##op, k_##op},
        LPX_BINARY_OPS(ROW) LPX_UNARY_OPS(ROW)
#undef ROW
        {LPX_OP_swiglu_backward, k_swiglu_backward},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = cu_reg(h, table[i].op, table[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
