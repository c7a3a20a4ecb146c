/* CUDA rope and grouped-query attention, forward and backward, with the
 * semantics of the CPU kernels (backends/cpu/rope.c, attention.c); the
 * argument contracts are the dispatcher's (spec families `rope`,
 * `attention`, `attention_backward`, op_args_nn.h), so only this backend's
 * limits are checked here.
 *
 * rope: one thread per rotated pair, read through the tensor's geometry,
 * cos/sin of the f32 angle evaluated in double and rounded once (the CPU's
 * values).
 *
 * attention: the reference kernel of the backend, not the fast one: one
 * warp per query row, keys visited in order with an online softmax
 * (running max and sum, FlashAttention's recurrence), so no score matrix
 * is stored; q, k, v are read as contiguous f32 copies (one conversion
 * each) and k/v heads are shared by index (h / group), never repeated. The
 * backward recomputes each row's probabilities from lse, keeps dq in
 * registers and adds dk, dv with f32 atomics into zeroed f32 buffers
 * (order-dependent last bits), then converts to the inputs' dtypes.
 * Head dim up to 256. Its cost is O(T S D) per head with no tiling.
 *
 * The fast path: bf16/f16 calls that cuDNN's fused SDPA takes go there
 * (cuda_sdpa.cu: flash attention, cuDNN loaded at run time); the
 * reference kernels run the rest, and everything when cuDNN is absent or
 * refuses a shape. */
#include <math.h>
#include <string.h>
#include <lpx/meta.h>
#include "cuda_dtype.cuh"
#include "cuda_sdpa.h"

#define AT_MAX_DIM 256
#define AT_PER_LANE (AT_MAX_DIM / 32)

/* ---- rope ------------------------------------------------------------- */

__global__ void rope_k(const void *x, int xdt, cu_geom xg, bool xcontig, const float *freq, void *y, int64_t rows,
                       int64_t T, int64_t H, int64_t half, int64_t offset, float sgn)
{
    int64_t n = rows * half;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = k / half, i = k % half, t = (r / H) % T, D = 2 * half;
        int64_t e1 = r * D + i, e2 = e1 + half;
        int64_t o1 = xcontig ? e1 : cu_offset(xg, e1), o2 = xcontig ? e2 : cu_offset(xg, e2);
        int es = cu_esize((lpx_dtype)xdt);
        float a = cu_dec((lpx_dtype)xdt, (const char *)x + o1 * es), b = cu_dec((lpx_dtype)xdt, (const char *)x + o2 * es);
        float ang = (float)(offset + t) * freq[i];
        float c = (float)cos((double)ang), s = sgn * (float)sin((double)ang);
        cu_enc((lpx_dtype)xdt, (char *)y + e1 * es, a * c - b * s, 0);
        cu_enc((lpx_dtype)xdt, (char *)y + e2 * es, b * c + a * s, 0);
    }
}

/* a new contiguous f32 copy of t on its device (t itself, retained, when
 * it already is one) */
static lpx_status at_f32(lpx_call *c, lpx_tensor *t, lpx_tensor **out)
{
    if (lpx_tensor_dtype(t) == LPX_F32 && lpx_tensor_is_contiguous(t)) {
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    lpx_status st = cu_new(c, LPX_F32, lpx_tensor_ndim(t), lpx_tensor_shape(t), lpx_tensor_device(t), out);
    if (st == LPX_OK && (st = cu_copy_convert(c, *out, t, false))) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

static int at_grid(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (int)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

/* The contract (shapes, the offset's range, float dtypes) is the
 * dispatcher's: spec family `rope` (op_args_nn.h). */
static lpx_status rope_common(lpx_call *c, bool backward)
{
    const lpx_rope_args *a = (const lpx_rope_args *)lpx_op_args_of(c);
    lpx_tensor *x = a->x, *fr = a->inv_freq, *f32 = NULL, *y = NULL;
    int64_t offset = a->offset, half = a->half;
    lpx_status st;
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(cu_op(c), dev))) return st;
    if ((st = at_f32(c, fr, &f32)) || (st = cu_new(c, lpx_tensor_dtype(x), 4, lpx_tensor_shape(x), dev, &y))) goto out;
    {
        const int64_t *s = lpx_tensor_shape(x);
        int64_t rows = s[0] * s[1] * s[2];
        cu_geom g;
        cu_geom_of(&g, x);
        if (rows * half > 0) {
            rope_k<<<at_grid(rows * half), 256, 0, cu_stream(dev.index)>>>(
                lpx_tensor_data(x), (int)lpx_tensor_dtype(x), g, cu_geom_contiguous(&g),
                (const float *)lpx_tensor_data(f32), lpx_tensor_data(y), rows, s[1], s[2], half, offset,
                backward ? -1.0f : 1.0f);
            if ((st = cu_launched(cu_op(c), "rope_k"))) goto out;
        }
    }
    cu_ret(c, y);
    y = NULL;
out:
    lpx_tensor_release(f32);
    lpx_tensor_release(y);
    return st;
}

static lpx_status k_rope(lpx_call *c) { return rope_common(c, false); }
static lpx_status k_rope_backward(lpx_call *c) { return rope_common(c, true); }

/* ---- attention ---------------------------------------------------------- */

struct at_geom {
    int64_t B, T, S, H, KH, D;
    bool causal;
    float scale;
};

__device__ __forceinline__ float at_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* keys query row t may see */
__device__ __forceinline__ int64_t at_keys(const at_geom &g, int64_t t)
{
    return g.causal ? t + g.S - g.T + 1 : g.S;
}

/* one warp per (b, h, t): grid (T, H, B) */
__global__ void __launch_bounds__(32) at_fwd(const float *Q, const float *K, const float *V, float *O, float *L, at_geom g)
{
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x;
    int64_t kv = h / (g.H / g.KH);
    const float *q = Q + ((b * g.T + t) * g.H + h) * g.D;
    float qr[AT_PER_LANE], acc[AT_PER_LANE];
    for (int k = 0; k < AT_PER_LANE; k++) {
        int64_t d = lane + 32 * k;
        qr[k] = d < g.D ? q[d] : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int64_t n = at_keys(g, t);
    for (int64_t j = 0; j < n; j++) {
        const float *kj = K + ((b * g.S + j) * g.KH + kv) * g.D, *vj = V + ((b * g.S + j) * g.KH + kv) * g.D;
        float part = 0.0f;
        for (int k = 0; k < AT_PER_LANE; k++) {
            int64_t d = lane + 32 * k;
            if (d < g.D) part += qr[k] * kj[d];
        }
        float s = at_warp_sum(part) * g.scale;
        float mn = s > m ? s : m, corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        for (int k = 0; k < AT_PER_LANE; k++) {
            int64_t d = lane + 32 * k;
            if (d < g.D) acc[k] = acc[k] * corr + p * vj[d];
        }
        m = mn;
    }
    float *o = O + ((b * g.T + t) * g.H + h) * g.D;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int k = 0; k < AT_PER_LANE; k++) {
        int64_t d = lane + 32 * k;
        if (d < g.D) o[d] = acc[k] * inv;
    }
    if (lane == 0) L[(b * g.H + h) * g.T + t] = n > 0 ? m + logf(l) : -INFINITY;
}

__global__ void __launch_bounds__(32) at_bwd(const float *G, const float *Q, const float *K, const float *V,
                                             const float *O, const float *L, float *dQ, float *dK, float *dV, at_geom g)
{
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int lane = threadIdx.x;
    int64_t kv = h / (g.H / g.KH), row = ((b * g.T + t) * g.H + h) * g.D;
    float qr[AT_PER_LANE], gr[AT_PER_LANE], dq[AT_PER_LANE], dot = 0.0f;
    for (int k = 0; k < AT_PER_LANE; k++) {
        int64_t d = lane + 32 * k;
        qr[k] = d < g.D ? Q[row + d] : 0.0f;
        gr[k] = d < g.D ? G[row + d] : 0.0f;
        dot += d < g.D ? gr[k] * O[row + d] : 0.0f;
        dq[k] = 0.0f;
    }
    float delta = at_warp_sum(dot), li = L[(b * g.H + h) * g.T + t];
    int64_t n = at_keys(g, t);
    for (int64_t j = 0; j < n; j++) {
        int64_t kvrow = ((b * g.S + j) * g.KH + kv) * g.D;
        float ps = 0.0f, pd = 0.0f;
        for (int k = 0; k < AT_PER_LANE; k++) {
            int64_t d = lane + 32 * k;
            if (d < g.D) {
                ps += qr[k] * K[kvrow + d];
                pd += gr[k] * V[kvrow + d];
            }
        }
        float p = expf(at_warp_sum(ps) * g.scale - li), ds = p * (at_warp_sum(pd) - delta) * g.scale;
        for (int k = 0; k < AT_PER_LANE; k++) {
            int64_t d = lane + 32 * k;
            if (d < g.D) {
                dq[k] += ds * K[kvrow + d];
                atomicAdd(&dK[kvrow + d], ds * qr[k]);
                atomicAdd(&dV[kvrow + d], p * gr[k]);
            }
        }
    }
    for (int k = 0; k < AT_PER_LANE; k++) {
        int64_t d = lane + 32 * k;
        if (d < g.D) dQ[row + d] = dq[k];
    }
}

/* The contracts (shapes, dtypes, scale) are the dispatcher's: spec
 * families `attention`, `attention_backward` (op_args_nn.h). What is
 * checked here are this backend's limits: the reference kernel's head_dim
 * and CUDA's grid (LPX_ENOTIMPL: no code for such a call). */
static lpx_status at_limits(lpx_call *c, const lpx_tensor *q, const lpx_attention_geom *G)
{
    if (G->head_dim > AT_MAX_DIM)
        return lpx_error(LPX_ENOTIMPL, "%s: head_dim %lld on CUDA: the kernel takes up to %d", cu_op(c),
                         (long long)G->head_dim, AT_MAX_DIM);
    if (G->q_len > 2147483647 || G->heads > 65535 || G->batch > 65535)
        return lpx_error(LPX_ENOTIMPL, "%s: grid of %lld x %lld x %lld rows exceeds CUDA's", cu_op(c),
                         (long long)G->q_len, (long long)G->heads, (long long)G->batch);
    return cu_use(cu_op(c), lpx_tensor_device(q));
}

static at_geom at_of(const lpx_attention_geom &G, bool causal, double scale)
{
    at_geom g = {G.batch, G.q_len, G.kv_len, G.heads, G.kv_heads, G.head_dim, causal, (float)scale};
    return g;
}

/* converts f32 src into a new tensor of dtype, shaped like `like` */
static lpx_status at_out(lpx_call *c, lpx_tensor *src, const lpx_tensor *like, lpx_tensor **out)
{
    if (lpx_tensor_dtype(like) == LPX_F32) {
        lpx_tensor_retain(src);
        *out = src;
        return LPX_OK;
    }
    lpx_status st = cu_new(c, lpx_tensor_dtype(like), lpx_tensor_ndim(like), lpx_tensor_shape(like),
                           lpx_tensor_device(like), out);
    if (st == LPX_OK && (st = cu_copy_convert(c, *out, src, false))) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* ---- the cuDNN path (cuda_sdpa.cu) ------------------------------------- */

/* The cuDNN shape of a call when it may take it: every tensor bf16 (or
 * every one f16) and contiguous, and cuDNN's own conditions. */
static bool sdpa_shape(lpx_tensor *const *ts, int n, const lpx_attention_geom &G, bool causal, double scale,
                       cu_sdpa_shape *x)
{
    lpx_dtype dt = lpx_tensor_dtype(ts[0]);
    if (dt != LPX_BF16 && dt != LPX_F16) return false;
    for (int i = 0; i < n; i++)
        if (lpx_tensor_dtype(ts[i]) != dt || !lpx_tensor_is_contiguous(ts[i])) return false;
    int dev = lpx_tensor_device(ts[0]).index, major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    *x = cu_sdpa_shape{dev, dt == LPX_BF16, G.batch, G.q_len, G.kv_len, G.heads, G.kv_heads, G.head_dim, causal,
                       (float)scale};
    return cu_sdpa_fits(x, major, NULL, 0) == 1;
}

/* cuDNN's workspace for x as a device tensor (NULL when none is needed);
 * false when cuDNN refuses the shape (the caller runs the reference) */
static bool sdpa_workspace(lpx_call *c, const cu_sdpa_shape &x, bool bwd, lpx_tensor **ws, lpx_status *st)
{
    *ws = NULL;
    int64_t n = cu_sdpa_workspace(&x, bwd, NULL, 0);
    if (n < 0) return false;
    if (n > 0) *st = cu_new(c, LPX_U8, 1, &n, lpx_cuda_device(x.device), ws);
    return true;
}

/* forward through cuDNN: LPX_OK with *out, *lse set; *ran false when
 * cuDNN did not take the call (nothing set, the reference runs) */
static lpx_status sdpa_forward(lpx_call *c, lpx_tensor *q, lpx_tensor *k, lpx_tensor *v, const lpx_attention_geom &G,
                               bool causal, double scale, lpx_tensor **out, lpx_tensor **lse, bool *ran)
{
    *ran = false;
    lpx_tensor *ts[3] = {q, k, v}, *ws = NULL;
    cu_sdpa_shape x;
    lpx_status st = LPX_OK;
    if (!sdpa_shape(ts, 3, G, causal, scale, &x) || !sdpa_workspace(c, x, false, &ws, &st)) return LPX_OK;
    int64_t ls[3] = {G.batch, G.heads, G.q_len};
    lpx_device dev = lpx_tensor_device(q);
    if (st || (st = cu_new(c, lpx_tensor_dtype(q), 4, lpx_tensor_shape(q), dev, out)) ||
        (st = cu_new(c, LPX_F32, 3, ls, dev, lse))) {
        lpx_tensor_release(ws);
        lpx_tensor_release(*out);
        *out = NULL;
        return st;
    }
    if (cu_sdpa_forward(&x, lpx_tensor_data(q), lpx_tensor_data(k), lpx_tensor_data(v), lpx_tensor_data(*out),
                        (float *)lpx_tensor_data(*lse), ws ? lpx_tensor_data(ws) : NULL, cu_stream(dev.index), NULL,
                        0) == 0) {
        *ran = true;
    } else {
        lpx_tensor_release(*out);
        lpx_tensor_release(*lse);
        *out = *lse = NULL;
    }
    lpx_tensor_release(ws);
    return LPX_OK;
}

static lpx_status sdpa_backward(lpx_call *c, lpx_tensor *const *ts, const lpx_attention_geom &G, bool causal,
                                double scale, lpx_tensor **r, bool *ran)
{
    /* ts: q, k, v, grad, out (all of one dtype), lse */
    *ran = false;
    lpx_tensor *ws = NULL;
    cu_sdpa_shape x;
    lpx_status st = LPX_OK;
    if (lpx_tensor_dtype(ts[5]) != LPX_F32 || !lpx_tensor_is_contiguous(ts[5])) return LPX_OK;
    if (!sdpa_shape(ts, 5, G, causal, scale, &x) || !sdpa_workspace(c, x, true, &ws, &st)) return LPX_OK;
    lpx_device dev = lpx_tensor_device(ts[0]);
    for (int i = 0; i < 3 && !st; i++) st = cu_new(c, lpx_tensor_dtype(ts[i]), 4, lpx_tensor_shape(ts[i]), dev, &r[i]);
    if (!st && cu_sdpa_backward(&x, lpx_tensor_data(ts[3]), lpx_tensor_data(ts[0]), lpx_tensor_data(ts[1]),
                                lpx_tensor_data(ts[2]), lpx_tensor_data(ts[4]), (const float *)lpx_tensor_data(ts[5]),
                                lpx_tensor_data(r[0]), lpx_tensor_data(r[1]), lpx_tensor_data(r[2]),
                                ws ? lpx_tensor_data(ws) : NULL, cu_stream(dev.index), NULL, 0) == 0)
        *ran = true;
    if (!*ran)
        for (int i = 0; i < 3; i++) {
            lpx_tensor_release(r[i]);
            r[i] = NULL;
        }
    lpx_tensor_release(ws);
    return st;
}

static lpx_status k_attention(lpx_call *c)
{
    const lpx_attention_args *a = (const lpx_attention_args *)lpx_op_args_of(c);
    lpx_tensor *q = a->q, *k = a->k, *v = a->v;
    bool causal = a->causal;
    double scale = a->scale;
    const lpx_attention_geom &G = a->g;
    lpx_status st;
    if ((st = at_limits(c, q, &G))) return st;
    lpx_device dev = lpx_tensor_device(q);
    lpx_tensor *qf = NULL, *kf = NULL, *vf = NULL, *of = NULL, *lse = NULL, *out = NULL;
    bool ran = false;
    if ((st = sdpa_forward(c, q, k, v, G, causal, scale, &out, &lse, &ran))) return st;
    if (ran) {
        cu_ret(c, out);
        cu_ret(c, lse);
        return LPX_OK;
    }
    int64_t ls[3] = {G.batch, G.heads, G.q_len};
    if ((st = at_f32(c, q, &qf)) || (st = at_f32(c, k, &kf)) || (st = at_f32(c, v, &vf)) ||
        (st = cu_new(c, LPX_F32, 4, lpx_tensor_shape(q), dev, &of)) || (st = cu_new(c, LPX_F32, 3, ls, dev, &lse)))
        goto out;
    if (G.batch * G.heads * G.q_len > 0) {
        dim3 grid((unsigned)G.q_len, (unsigned)G.heads, (unsigned)G.batch);
        at_fwd<<<grid, 32, 0, cu_stream(dev.index)>>>((const float *)lpx_tensor_data(qf), (const float *)lpx_tensor_data(kf),
                                                     (const float *)lpx_tensor_data(vf), (float *)lpx_tensor_data(of),
                                                     (float *)lpx_tensor_data(lse), at_of(G, causal, scale));
        if ((st = cu_launched(cu_op(c), "at_fwd"))) goto out;
    }
    if ((st = at_out(c, of, q, &out))) goto out;
    cu_ret(c, out);
    cu_ret(c, lse);
    lse = NULL;
out:
    lpx_tensor *rel[] = {qf, kf, vf, of, lse};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    return st;
}

static lpx_status k_attention_backward(lpx_call *c)
{
    const lpx_attention_backward_args *a = (const lpx_attention_backward_args *)lpx_op_args_of(c);
    lpx_tensor *gr = a->grad, *q = a->q, *k = a->k, *v = a->v, *o = a->out, *lse = a->lse;
    bool causal = a->causal;
    double scale = a->scale;
    const lpx_attention_geom &G = a->g;
    lpx_tensor *ts[6] = {q, k, v, gr, o, lse};
    lpx_status st;
    if ((st = at_limits(c, q, &G))) return st;
    lpx_device dev = lpx_tensor_device(q);
    cudaStream_t s = cu_stream(dev.index);
    lpx_tensor *f[6] = {NULL, NULL, NULL, NULL, NULL, NULL}, *dq = NULL, *dk = NULL, *dv = NULL, *r[3] = {NULL, NULL, NULL};
    bool ran = false;
    if ((st = sdpa_backward(c, ts, G, causal, scale, r, &ran))) return st;
    if (ran) {
        for (int i = 0; i < 3; i++) cu_ret(c, r[i]);
        return LPX_OK;
    }
    for (int i = 0; i < 6 && !st; i++) st = at_f32(c, ts[i], &f[i]);
    if (st || (st = cu_new(c, LPX_F32, 4, lpx_tensor_shape(q), dev, &dq)) ||
        (st = cu_new(c, LPX_F32, 4, lpx_tensor_shape(k), dev, &dk)) ||
        (st = cu_new(c, LPX_F32, 4, lpx_tensor_shape(v), dev, &dv)))
        goto out;
    {
        size_t kb = (size_t)lpx_tensor_numel(k) * sizeof(float);
        cudaError_t e = cudaMemsetAsync(lpx_tensor_data(dk), 0, kb, s);
        if (e == cudaSuccess) e = cudaMemsetAsync(lpx_tensor_data(dv), 0, kb, s);
        if (e == cudaSuccess && lpx_tensor_numel(q))
            e = cudaMemsetAsync(lpx_tensor_data(dq), 0, (size_t)lpx_tensor_numel(q) * sizeof(float), s);
        if (e != cudaSuccess) {
            st = cu_fail(e, cu_op(c), "cudaMemsetAsync(gradients)");
            goto out;
        }
    }
    if (G.batch * G.heads * G.q_len > 0) {
        dim3 grid((unsigned)G.q_len, (unsigned)G.heads, (unsigned)G.batch);
        at_bwd<<<grid, 32, 0, s>>>((const float *)lpx_tensor_data(f[3]), (const float *)lpx_tensor_data(f[0]),
                                   (const float *)lpx_tensor_data(f[1]), (const float *)lpx_tensor_data(f[2]),
                                   (const float *)lpx_tensor_data(f[4]), (const float *)lpx_tensor_data(f[5]),
                                   (float *)lpx_tensor_data(dq), (float *)lpx_tensor_data(dk),
                                   (float *)lpx_tensor_data(dv), at_of(G, causal, scale));
        if ((st = cu_launched(cu_op(c), "at_bwd"))) goto out;
    }
    if ((st = at_out(c, dq, q, &r[0])) || (st = at_out(c, dk, k, &r[1])) || (st = at_out(c, dv, v, &r[2]))) goto out;
    for (int i = 0; i < 3; i++) {
        cu_ret(c, r[i]);
        r[i] = NULL;
    }
out:
    for (int i = 0; i < 6; i++) lpx_tensor_release(f[i]);
    lpx_tensor *rel[] = {dq, dk, dv, r[0], r[1], r[2]};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    return st;
}

extern "C" LPX_PLUGIN_EXPORT int lpx_cuda_attention_path(char *buf, size_t n) { return cu_sdpa_describe(buf, n); }

extern "C" lpx_status cu_register_attention(const lpx_host *h)
{
    static const struct {
        lpx_op op;
        lpx_kernel_fn fn;
    } ks[] = {
        {LPX_OP_rope, k_rope},
        {LPX_OP_rope_backward, k_rope_backward},
        {LPX_OP_attention, k_attention},
        {LPX_OP_attention_backward, k_attention_backward},
    };
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        lpx_status st = cu_reg(h, ks[i].op, ks[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
