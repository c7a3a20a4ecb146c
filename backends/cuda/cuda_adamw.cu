/* Fused multi-tensor AdamW (adamw_) on the GPU: ONE kernel launch per call
 * updates every (param, grad, exp_avg, exp_avg_sq) of the list.
 *
 * The host builds a table of the tensors ({param, grad, m, v, numel,
 * dtypes}) and the prefix sums of their chunk counts (AW_CHUNK elements
 * per block); block b finds its tensor by a binary search of the prefix
 * sums. Up to AW_MAX_PARAM tensors the table travels as a __grid_constant__
 * kernel parameter (CUDA 12.1+ allows 32 KB of parameters on Volta and
 * newer), so nothing outlives the launch call; longer lists copy it to a
 * device scratch buffer from a heap buffer that a host callback frees once
 * the stream has passed the copy.
 *
 * Arithmetic: exactly that of the CPU kernel (backends/cpu/optim.c) and of
 * lpx_fsdp_adamw_step, in f32 and in the same order, with the constants
 * computed on the host in double and rounded to f32 the same way. The
 * plugin is compiled with --fmad=false (no contraction into FMA), and
 * without fast math f32 division and sqrtf are correctly rounded, so the
 * results equal the CPU's bit for bit. f32 param/grad pairs whose four
 * pointers are 16-byte aligned are processed as float4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_dtype.cuh"
#include "optim_state.h"

#define AW_THREADS 256
#define AW_CHUNK 16384      /* elements per block; a multiple of 4 */
#define AW_MAX_PARAM 600    /* tensors whose table fits the kernel parameter space */

struct aw_entry {
    void *p;
    const void *g;
    float *m;
    float *v;
    int64_t n;
    int32_t pdt, gdt;
};

/* the update's f32 constants, computed once by lpx_meta_adamw (the
 * dispatcher's, lpx_adamw_args.k) */
typedef lpx_adamw_consts aw_consts;

struct aw_small {
    aw_consts k;
    int32_t nt;
    int32_t start[AW_MAX_PARAM + 1]; /* block prefix sums; start[nt] = grid size */
    aw_entry t[AW_MAX_PARAM];
};

static_assert(sizeof(aw_small) <= 32000, "the AdamW table must fit the 32 KB kernel parameter limit");
static_assert(AW_CHUNK % 4 == 0, "chunks must keep float4 alignment");

/* The documented update of one element (ops.h, lpx_adamw_). */
__device__ __forceinline__ void aw_update(float &p, float g, float &m, float &v, const aw_consts &k)
{
    m = k.b1 * m + k.omb1 * g;
    v = k.b2 * v + k.omb2 * g * g;
    float mh = m / k.bc1, vh = v / k.bc2;
    p = p * k.decay - k.lr * mh / (sqrtf(vh) + k.eps);
}

__device__ __forceinline__ bool aw_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Elements [c0, min(c0 + AW_CHUNK, n)) of one tensor, by one block. */
__device__ void aw_chunk(const aw_entry &e, int64_t c0, const aw_consts &k)
{
    int64_t c1 = e.n - c0 < AW_CHUNK ? e.n : c0 + AW_CHUNK;
    int64_t i0 = c0;
    if (e.pdt == LPX_F32 && e.gdt == LPX_F32 && aw_aligned16(e.p) && aw_aligned16(e.g) && aw_aligned16(e.m) &&
        aw_aligned16(e.v)) {
        float4 *P = (float4 *)e.p, *M = (float4 *)e.m, *V = (float4 *)e.v;
        const float4 *G = (const float4 *)e.g;
        int64_t q0 = c0 / 4, nq = (c1 - c0) / 4;
        for (int64_t i = threadIdx.x; i < nq; i += blockDim.x) {
            int64_t j = q0 + i;
            float4 p = P[j], g = G[j], m = M[j], v = V[j];
            aw_update(p.x, g.x, m.x, v.x, k);
            aw_update(p.y, g.y, m.y, v.y, k);
            aw_update(p.z, g.z, m.z, v.z, k);
            aw_update(p.w, g.w, m.w, v.w, k);
            P[j] = p;
            M[j] = m;
            V[j] = v;
        }
        i0 = c0 + nq * 4; /* the last few elements of the tensor */
    }
    int pes = cu_esize((lpx_dtype)e.pdt), ges = cu_esize((lpx_dtype)e.gdt);
    for (int64_t i = i0 + threadIdx.x; i < c1; i += blockDim.x) {
        char *pp = (char *)e.p + i * pes;
        float p = cu_dec((lpx_dtype)e.pdt, pp), g = cu_dec((lpx_dtype)e.gdt, (const char *)e.g + i * ges);
        float m = e.m[i], v = e.v[i];
        aw_update(p, g, m, v, k);
        e.m[i] = m;
        e.v[i] = v;
        cu_enc((lpx_dtype)e.pdt, pp, p, 0);
    }
}

/* Index of the tensor holding block b: the largest t with start[t] <= b
 * (tensors without elements have start[t] == start[t + 1] and are
 * skipped). */
__device__ __forceinline__ int aw_find(const int32_t *start, int nt, int b)
{
    int lo = 0, hi = nt - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

__global__ void __launch_bounds__(AW_THREADS) aw_kernel_param(const __grid_constant__ aw_small tab)
{
    int b = (int)blockIdx.x;
    int t = aw_find(tab.start, tab.nt, b);
    aw_chunk(tab.t[t], (int64_t)(b - tab.start[t]) * AW_CHUNK, tab.k);
}

__global__ void __launch_bounds__(AW_THREADS) aw_kernel_table(const aw_entry *ents, const int32_t *start, int nt,
                                                               aw_consts k)
{
    int b = (int)blockIdx.x;
    int t = aw_find(start, nt, b);
    aw_chunk(ents[t], (int64_t)(b - start[t]) * AW_CHUNK, k);
}

/* ---- host side ------------------------------------------------------ */

static void CUDART_CB aw_free_host(void *p) { free(p); }

/* Copies the host table (malloc'd, table_bytes) of n tensors to a
 * stream-ordered device scratch block *dtab; the host copy is freed once
 * the stream has passed the copy. On failure both are freed. */
static lpx_status aw_upload_table(const char *op, int dev, cudaStream_t s, char *host, size_t table_bytes, uint32_t n,
                                  void **dtab)
{
    void *d = cu_scratch_alloc(dev, table_bytes);
    if (!d) {
        free(host);
        return lpx_error(LPX_ENOMEM, "%s: cannot allocate the %zu-byte device table of %u tensors", op, table_bytes, n);
    }
    cudaError_t e = cudaMemcpyAsync(d, host, table_bytes, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        free(host);
        cu_scratch_free(dev, d, table_bytes);
        return cu_fail(e, op, "cudaMemcpyAsync(table)");
    }
    e = cudaLaunchHostFunc(s, aw_free_host, host);
    if (e != cudaSuccess) {
        cudaError_t e2 = cudaStreamSynchronize(s);
        free(host);
        cu_scratch_free(dev, d, table_bytes);
        return cu_fail(e2 != cudaSuccess ? e2 : e, op, "cudaLaunchHostFunc(free table)");
    }
    *dtab = d;
    return LPX_OK;
}

/* adamw_: the arguments are checked by the dispatcher (family `adamw`,
 * include/lpx/op_args_optim.h); every tensor is a dense CUDA tensor, all
 * on one device. */
static lpx_status k_adamw(lpx_call *c)
{
    const char *op = cu_op(c);
    const lpx_adamw_args *a = (const lpx_adamw_args *)lpx_op_args_of(c);
    uint32_t n = a->n;
    if (n == 0) return LPX_OK;
    lpx_status st;
    const lpx_tensor *first = a->params[0];
    int64_t blocks = 0;
    for (uint32_t i = 0; i < n; i++) blocks += (lpx_tensor_numel(a->params[i]) + AW_CHUNK - 1) / AW_CHUNK;
    if (blocks > INT32_MAX)
        return lpx_error(LPX_ERANGE, "%s: %lld chunks of %d elements exceed one launch", op, (long long)blocks,
                         AW_CHUNK);
    if (blocks == 0) return LPX_OK;
    lpx_device dev = lpx_tensor_device(first);
    if ((st = cu_use(op, dev))) return st;
    cudaStream_t s = cu_stream(dev.index);

    const aw_consts k = a->k;

    /* the table: entries and block prefix sums */
    bool small = n <= AW_MAX_PARAM;
    size_t start_bytes = ((size_t)(n + 1) * sizeof(int32_t) + 15) & ~(size_t)15;
    size_t table_bytes = small ? sizeof(aw_small) : start_bytes + (size_t)n * sizeof(aw_entry);
    char *host = (char *)malloc(table_bytes);
    if (!host) return lpx_error(LPX_ENOMEM, "%s: cannot allocate the table of %u tensors", op, n);
    memset(host, 0, table_bytes);
    aw_small *tab = small ? (aw_small *)host : NULL;
    int32_t *start = small ? tab->start : (int32_t *)host;
    aw_entry *ents = small ? tab->t : (aw_entry *)(host + start_bytes);
    int64_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        lpx_tensor *p = a->params[i];
        aw_entry *e = &ents[i];
        e->p = lpx_tensor_data(p);
        e->g = lpx_tensor_data(a->grads[i]);
        e->m = (float *)lpx_tensor_data(a->exp_avg[i]);
        e->v = (float *)lpx_tensor_data(a->exp_avg_sq[i]);
        e->n = lpx_tensor_numel(p);
        e->pdt = (int32_t)lpx_tensor_dtype(p);
        e->gdt = (int32_t)lpx_tensor_dtype(a->grads[i]);
        start[i] = (int32_t)at;
        at += (e->n + AW_CHUNK - 1) / AW_CHUNK;
    }
    start[n] = (int32_t)at;

    if (small) {
        tab->k = k;
        tab->nt = (int32_t)n;
        aw_kernel_param<<<(unsigned)blocks, AW_THREADS, 0, s>>>(*tab);
        free(host); /* kernel parameters are copied at launch */
        return cu_launched(op, "aw_kernel_param");
    }

    void *dtab = NULL;
    if ((st = aw_upload_table(op, dev.index, s, host, table_bytes, n, &dtab))) return st;
    aw_kernel_table<<<(unsigned)blocks, AW_THREADS, 0, s>>>(
        (const aw_entry *)((char *)dtab + start_bytes), (const int32_t *)dtab, (int)n, k);
    st = cu_launched(op, "aw_kernel_table");
    cu_scratch_free(dev.index, dtab, table_bytes); /* stream-ordered: after the kernel */
    return st;
}

/* ---- adamw_state_: AdamW over block-quantized moments ---------------------
 * G = clamp(block / 4, 1, 32) threads per quantization block (a warp for
 * blocks of 128 and 256, a power-of-two slice of one for smaller blocks;
 * block is a power of two in 2..256): thread l of the group owns the runs
 * of 4 consecutive elements 4q .. 4q + 3, q = l + G r, r < ceil(block /
 * (4 G)) <= 2, so a warp's accesses to each array are contiguous (4-bit
 * codes: two packed bytes per run) and one Philox draw (lpx_os_rand128)
 * serves the run's 4 stochastic roundings when its flat index is a
 * multiple of 4 (else the draw of each new group of 4 is made; the bits
 * are lpx_os_rand32's either way). Each element: decoded (parameter,
 * grad, m, v with the old scales), lpx's f32 AdamW (lpx_os_adamw_elem),
 * kept in registers; the block absmaxes of the new m and v are
 * max-reductions over the group (lpx_os_absmax_acc / _merge with xor
 * shuffles: a maximum is exact, so the result equals the serial one
 * whatever the order); then each element encoded with the fresh scales and
 * the parameter written as the CPU kernel does (backends/cpu/optim.c): RNE
 * (cu_enc), bf16 stochastic rounding, or scaled f16 (another absmax
 * reduction, over the new parameters). Every per-element function is
 * core/numerics/optim_state.h's (LPX_HD), the same the CPU block steps
 * loop over, so the results equal the CPU's bit for bit (f32, one
 * rounding per operation, --fmad=false). Lane 0 of the group writes the
 * block's scales after the reductions (every lane's read of the old
 * scales feeds the reduction first). */

#define AS_THREADS 256
#define AS_V 4                                /* consecutive elements per run */
#define AS_RUNS (LPX_OS_BLOCK_MAX / (AS_V * 32)) /* runs per thread, at most */
#define AS_E (AS_V * AS_RUNS)                 /* elements per thread, at most */

struct as_entry {
    void *p;
    const void *g;
    uint8_t *m;
    float *ms;
    void *v;
    float *vs;
    float *xs;     /* the scaled-f16 master's block scales, or NULL */
    int64_t n;     /* elements */
    int64_t idx;   /* flat index of the first element (stochastic rounding) */
    int32_t pdt, gdt;
};

struct as_head {
    lpx_os_adamw k;
    int64_t block, step, total;
    uint64_t seed;
    uint32_t rank;
    int32_t format, master, nt;
};

/* threads per quantization block of `block` elements */
static __host__ __device__ __forceinline__ int as_group(int64_t block)
{
    return block / AS_V < 1 ? 1 : block / AS_V > 32 ? 32 : (int)(block / AS_V);
}

__device__ __forceinline__ int as_find(const int64_t *start, int nt, int64_t b)
{
    int lo = 0, hi = nt - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The group's absmax (NaN if any): partial (a, nan) of each lane merged
 * over the G lanes of its aligned group (every lane of the warp calls
 * this; off < G keeps each xor partner inside the group). */
__device__ __forceinline__ float as_group_absmax(float a, int nan, int G)
{
    for (int off = G / 2; off > 0; off >>= 1) {
        float a2 = __shfl_xor_sync(0xffffffffu, a, off);
        int n2 = __shfl_xor_sync(0xffffffffu, nan, off);
        lpx_os_absmax_merge(&a, &nan, a2, n2);
    }
    return lpx_os_absmax_fin(a, nan);
}

__global__ void __launch_bounds__(AS_THREADS) as_kernel(const as_entry *ents, const int64_t *start, as_head h)
{
    __shared__ float qm[256], qv[256];
    const int fmt = h.format;
    if (fmt != LPX_OS_STATE_FP8) {
        int mm = fmt == LPX_OS_STATE_8BIT ? LPX_OS_MAP8_SIGNED : LPX_OS_MAP4_SIGNED;
        int mv = fmt == LPX_OS_STATE_8BIT ? LPX_OS_MAP8_UNSIGNED : LPX_OS_MAP4_UNSIGNED;
        unsigned nc = 1u << lpx_os_map_bits(mm);
        for (unsigned c = threadIdx.x; c < nc; c += blockDim.x) {
            qm[c] = lpx_os_map_value(mm, c);
            qv[c] = lpx_os_map_value(mv, c);
        }
    }
    __syncthreads();
    const int B = (int)h.block, G = as_group(h.block), R = (B + AS_V * G - 1) / (AS_V * G);
    const int gl = (int)threadIdx.x & (G - 1);
    const int64_t qb = (int64_t)blockIdx.x * (AS_THREADS / G) + threadIdx.x / G;
    /* a group past the end takes part in the shuffles with n = 0 */
    const as_entry *e = NULL;
    int64_t b = 0, at = 0;
    int n = 0;
    if (qb < h.total) {
        int t = as_find(start, h.nt, qb);
        e = &ents[t];
        b = qb - start[t];
        at = b * B;
        n = (int)(e->n - at < B ? e->n - at : B);
    }
    const lpx_dtype pd = e ? (lpx_dtype)e->pdt : LPX_F32, gd = e ? (lpx_dtype)e->gdt : LPX_F32;
    const int pes = cu_esize(pd), ges = cu_esize(gd);
    const int master = h.master;

    /* element AS_V (gl + G r) + k lives at [AS_V r + k] */
    float pw[AS_E], mw[AS_E], vw[AS_E];
    float am = 0.0f, av = 0.0f, ap = 0.0f;
    int nm = 0, nv = 0, np = 0;
    if (n > 0) {
        const float oms = e->ms[b], ovs = e->vs[b], oxs = master >= 2 ? e->xs[b] : 0.0f;
#pragma unroll
        for (int r = 0; r < AS_RUNS; r++) {
            if (r >= R) break;
            const int i0 = AS_V * (gl + G * r);
            unsigned m4[2] = {0, 0}, v4[2] = {0, 0}; /* 4-bit: the run's two packed bytes */
            if (fmt == LPX_OS_STATE_4BIT)
#pragma unroll
                for (int y = 0; y < 2; y++)
                    if (i0 + 2 * y < n) {
                        m4[y] = e->m[(at + i0) / 2 + y];
                        v4[y] = ((const uint8_t *)e->v)[(at + i0) / 2 + y];
                    }
#pragma unroll
            for (int k = 0; k < AS_V; k++) {
                const int i = i0 + k, x = AS_V * r + k;
                pw[x] = mw[x] = vw[x] = 0.0f;
                if (i >= n) continue;
                const int64_t ei = at + i;
                float p = master >= 2 ? lpx_os_dec_f16s(((const uint16_t *)e->p)[ei], oxs)
                                      : cu_dec(pd, (const char *)e->p + ei * pes);
                float g = cu_dec(gd, (const char *)e->g + ei * ges), m, v;
                switch (fmt) {
                case LPX_OS_STATE_8BIT:
                    m = lpx_os_dec_map(qm, e->m[ei], oms);
                    v = lpx_os_dec_map(qv, ((const uint8_t *)e->v)[ei], ovs);
                    break;
                case LPX_OS_STATE_4BIT: {
                    unsigned cm = k & 1 ? m4[k / 2] & 15u : m4[k / 2] >> 4, cv = k & 1 ? v4[k / 2] & 15u : v4[k / 2] >> 4;
                    m = lpx_os_dec_map(qm, cm, oms);
                    v = lpx_os_dec_map(qv, cv, ovs);
                    break;
                }
                default:
                    m = lpx_os_dec_e4m3(e->m[ei], oms);
                    v = lpx_os_dec_f16s(((const uint16_t *)e->v)[ei], ovs);
                    break;
                }
                pw[x] = lpx_os_adamw_elem(&h.k, p, g, &m, &v);
                mw[x] = m;
                vw[x] = v;
                lpx_os_absmax_acc(&am, &nm, m);
                lpx_os_absmax_acc(&av, &nv, v);
                if (master >= 2) lpx_os_absmax_acc(&ap, &np, pw[x]);
            }
        }
    }
    const float amax_m = as_group_absmax(am, nm, G), amax_v = as_group_absmax(av, nv, G);
    float ms, vs;
    if (fmt == LPX_OS_STATE_FP8) {
        ms = lpx_os_e4m3_scale(amax_m);
        vs = lpx_os_f16s_scale(amax_v);
    } else {
        ms = lpx_os_map_scale(amax_m);
        vs = lpx_os_map_scale(amax_v);
    }
    /* the scaled-f16 master's scale: absmax of the new parameters (master
     * is the same for the whole grid, so every lane shuffles or none) */
    const float xs = master >= 2 ? lpx_os_f16s_scale(as_group_absmax(ap, np, G)) : 0.0f;
    if (n <= 0) return; /* after the last shuffle */
    const uint64_t j0 = (uint64_t)(e->idx + at);
    const int sr = master == 1 || master == 3;
#pragma unroll
    for (int r = 0; r < AS_RUNS; r++) {
        if (r >= R) break;
        const int i0 = AS_V * (gl + G * r);
        if (i0 >= n) break;
        if (fmt == LPX_OS_STATE_4BIT)
#pragma unroll
            for (int y = 0; y < 2; y++) {
                const int i = i0 + 2 * y, x = AS_V * r + 2 * y;
                if (i >= n) break;
                unsigned mh = lpx_os_enc_map(qm, 4, mw[x], ms), vh = lpx_os_enc_map(qv, 4, vw[x], vs);
                unsigned ml = i + 1 < n ? lpx_os_enc_map(qm, 4, mw[x + 1], ms) : 0u;
                unsigned vl = i + 1 < n ? lpx_os_enc_map(qv, 4, vw[x + 1], vs) : 0u;
                e->m[(at + i) / 2] = (uint8_t)((mh << 4) | ml);
                ((uint8_t *)e->v)[(at + i) / 2] = (uint8_t)((vh << 4) | vl);
            }
        /* the stochastic bits: one Philox draw per group of 4 flat indices */
        uint32_t rnd[4] = {0, 0, 0, 0};
        uint64_t drawn = ~(uint64_t)0;
#pragma unroll
        for (int k = 0; k < AS_V; k++) {
            const int i = i0 + k, x = AS_V * r + k;
            if (i >= n) break;
            const int64_t ei = at + i;
            if (fmt == LPX_OS_STATE_8BIT) {
                e->m[ei] = (uint8_t)lpx_os_enc_map(qm, 8, mw[x], ms);
                ((uint8_t *)e->v)[ei] = (uint8_t)lpx_os_enc_map(qv, 8, vw[x], vs);
            } else if (fmt == LPX_OS_STATE_FP8) {
                e->m[ei] = lpx_os_enc_e4m3(mw[x], ms);
                ((uint16_t *)e->v)[ei] = lpx_os_enc_f16s(vw[x], vs);
            }
            uint32_t bits = 0;
            if (sr) {
                const uint64_t j = j0 + (uint64_t)i;
                if (j >> 2 != drawn) {
                    drawn = j >> 2;
                    lpx_os_rand128(h.seed, h.rank, (uint64_t)h.step, drawn, rnd);
                }
                const unsigned w = (unsigned)(j & 3u); /* a select keeps rnd in registers */
                bits = w == 0 ? rnd[0] : w == 1 ? rnd[1] : w == 2 ? rnd[2] : rnd[3];
            }
            if (master == 0) cu_enc(pd, (char *)e->p + ei * pes, pw[x], 0);
            else if (master == 1) ((uint16_t *)e->p)[ei] = lpx_os_bf16_sr_elem(pw[x], bits);
            else ((uint16_t *)e->p)[ei] = lpx_os_f16s_elem(pw[x], xs, master == 3, bits);
        }
    }
    if (gl == 0) {
        e->ms[b] = ms;
        e->vs[b] = vs;
        if (master >= 2) e->xs[b] = xs;
    }
}

/* adamw_state_: the arguments are checked by the dispatcher (family
 * `adamw_state`, include/lpx/op_args_optim.h); every tensor is a dense
 * CUDA tensor, all on one device. */
static lpx_status k_adamw_state(lpx_call *c)
{
    const char *op = cu_op(c);
    const lpx_adamw_state_args *a = (const lpx_adamw_state_args *)lpx_op_args_of(c);
    uint32_t n = a->n;
    if (n == 0) return LPX_OK;
    as_head h;
    memset(&h, 0, sizeof h);
    const lpx_adamw_consts &mk = a->k;
    h.k = lpx_os_adamw{mk.b1, mk.omb1, mk.b2, mk.omb2, mk.lr, mk.eps, mk.decay, mk.bc1, mk.bc2};
    h.block = a->block;
    h.step = a->step;
    h.seed = a->seed;
    h.rank = a->rank;
    h.format = a->format;
    h.master = a->master;
    h.nt = (int32_t)n;
    size_t start_bytes = ((size_t)(n + 1) * sizeof(int64_t) + 15) & ~(size_t)15;
    size_t table_bytes = start_bytes + (size_t)n * sizeof(as_entry);
    char *host = (char *)malloc(table_bytes);
    if (!host) return lpx_error(LPX_ENOMEM, "%s: cannot allocate the table of %u tensors", op, n);
    memset(host, 0, table_bytes);
    int64_t *start = (int64_t *)host;
    as_entry *ents = (as_entry *)(host + start_bytes);
    int64_t at = 0, idx = a->index0;
    for (uint32_t i = 0; i < n; i++) {
        as_entry *e = &ents[i];
        lpx_tensor *p = a->params[i];
        e->p = lpx_tensor_data(p);
        e->g = lpx_tensor_data(a->grads[i]);
        e->m = (uint8_t *)lpx_tensor_data(a->m[i]);
        e->ms = (float *)lpx_tensor_data(a->m_scale[i]);
        e->v = lpx_tensor_data(a->v[i]);
        e->vs = (float *)lpx_tensor_data(a->v_scale[i]);
        e->xs = a->master_scale ? (float *)lpx_tensor_data(a->master_scale[i]) : NULL;
        e->n = lpx_tensor_numel(p);
        e->idx = idx;
        e->pdt = (int32_t)lpx_tensor_dtype(p);
        e->gdt = (int32_t)lpx_tensor_dtype(a->grads[i]);
        start[i] = at;
        at += (e->n + a->block - 1) / a->block;
        idx += e->n;
    }
    start[n] = at;
    h.total = at;
    const int64_t per = AS_THREADS / as_group(a->block); /* quantization blocks per CUDA block */
    int64_t grid = (at + per - 1) / per;
    if (grid == 0) {
        free(host);
        return LPX_OK;
    }
    if (grid > INT32_MAX) {
        free(host);
        return lpx_error(LPX_ERANGE, "%s: %lld blocks of %lld elements exceed one launch", op, (long long)at,
                         (long long)a->block);
    }
    lpx_device dev = lpx_tensor_device(a->params[0]);
    lpx_status st;
    if ((st = cu_use(op, dev))) {
        free(host);
        return st;
    }
    cudaStream_t s = cu_stream(dev.index);
    void *dtab = NULL;
    if ((st = aw_upload_table(op, dev.index, s, host, table_bytes, n, &dtab))) return st;
    as_kernel<<<(unsigned)grid, AS_THREADS, 0, s>>>((const as_entry *)((char *)dtab + start_bytes),
                                                    (const int64_t *)dtab, h);
    st = cu_launched(op, "as_kernel");
    cu_scratch_free(dev.index, dtab, table_bytes); /* stream-ordered: after the kernel */
    return st;
}

extern "C" lpx_status cu_register_adamw(const lpx_host *h)
{
    lpx_status st = cu_reg(h, LPX_OP_adamw_, k_adamw);
    return st ? st : cu_reg(h, LPX_OP_adamw_state_, k_adamw_state);
}
