/* CPU kernels: creation (empty, zeros, full, arange, randn, rand).
 *
 * Results are new contiguous tensors, so these kernels work for every
 * registered dtype, packed plugin formats included: values are produced in
 * f32 in chunks of CPU_CHUNK elements (a multiple of every dtype's block)
 * and encoded with the dtype's from_f32.
 *
 * Random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel
 * random numbers: as easy as 1, 2, 3", SC'11; the generator of cuRAND and
 * of PyTorch's CUDA backend), keyed by the 64-bit seed (low word first).
 * It is a bijection of a 128-bit counter, so element i is a pure function
 * of (seed, i): identical results for any thread count, chunking or device
 * that implements the same mapping:
 *   rand:  k = i / 4, counter (k, k >> 32, 1, 0), x = output word i % 4;
 *          value = (x >> (32 - m)) * 2^-m with m = min(24, mantissa bits
 *          + 1) of the dtype, so every value is exact in the built-in
 *          float dtypes and lies in [0, 1).
 *   randn: k = i / 2, counter (k, k >> 32, 0, 0) gives x0..x3;
 *          u1 = ((x0:x1 >> 11) + 1) * 2^-53 in (0, 1],
 *          u2 = (x2:x3 >> 11) * 2^-53 in [0, 1),
 *          r = sqrt(-2 ln u1); element 2k = r cos(2 pi u2),
 *          element 2k+1 = r sin(2 pi u2) (Box-Muller in double). */
#include <math.h>
#include <string.h>
#include "cpu_internal.h"
#include "../../core/dtype_internal.h"

/* ---- Philox4x32-10 ---------------------------------------------------- */

static inline uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void cpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo32(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = mulhilo32(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* ---- helpers --------------------------------------------------------- */

/* Fills a new contiguous tensor with the f32 value v encoded once per byte
 * group, then replicated (memset when the group is one repeated byte). */
static void fill_value(lpx_tensor *t, float v)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    size_t total = lpx_dtype_nbytes(t->dtype, t->numel);
    if (!total) return;
    float vals[LPX_DTYPE_BLOCK_MAX];
    unsigned char group[LPX_DTYPE_BLOCK_MAX * 8];
    size_t blk = (size_t)tr->block, gbytes = lpx_dtype__offset(tr, blk);
    for (size_t i = 0; i < blk; i++) vals[i] = v;
    tr->from_f32(vals, group, blk, 0);
    unsigned char *p = lpx_tensor_data(t);
    bool one_byte = true;
    for (size_t i = 1; i < gbytes; i++) one_byte = one_byte && group[i] == group[0];
    if (one_byte) {
        memset(p, group[0], total);
        return;
    }
    size_t done = gbytes < total ? gbytes : total;
    memcpy(p, group, done);
    while (done < total) { /* doubling copies of whole groups */
        size_t k = done < total - done ? done : total - done;
        memcpy(p + done, p, k);
        done += k;
    }
}

/* Produces values [start, start + n) of a generator into dst (f32). */
typedef void (*gen_fn)(const void *ctx, int64_t start, int64_t n, float *dst);

/* Runs gen over a new tensor in chunks and encodes each chunk. */
static void fill_gen(lpx_tensor *t, gen_fn gen, const void *ctx)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    unsigned char *p = lpx_tensor_data(t);
    float buf[CPU_CHUNK];
    for (int64_t start = 0; start < t->numel; start += CPU_CHUNK) {
        int64_t m = t->numel - start < CPU_CHUNK ? t->numel - start : CPU_CHUNK;
        gen(ctx, start, m, buf);
        /* start is a multiple of CPU_CHUNK, hence of the block */
        tr->from_f32(buf, p + lpx_dtype__offset(tr, (size_t)start), (size_t)m, 0);
    }
}

/* ---- kernels --------------------------------------------------------- */

/* The arguments are the `create` family's (op_args_views.h): shape, dtype
 * and the element count checked by the dispatcher. The result is on the
 * CPU (the device's index is not looked at). */
static lpx_status k_empty(lpx_call *c)
{
    const lpx_create_args *a = lpx_op_args_of(c);
    lpx_tensor *t;
    lpx_status st = cpu_new(c, a->dtype, a->ndim, a->shape, &t);
    if (st) return st;
    cpu_ret(c, t);
    return LPX_OK;
}

/* zeros and full: `value` everywhere (zeros: 0) */
static lpx_status k_fill(lpx_call *c)
{
    const lpx_create_args *a = lpx_op_args_of(c);
    lpx_tensor *t;
    lpx_status st = cpu_new(c, a->dtype, a->ndim, a->shape, &t);
    if (st) return st;
    fill_value(t, (float)a->value);
    cpu_ret(c, t);
    return LPX_OK;
}

typedef struct arange_ctx { double start, step; } arange_ctx;

static void gen_arange(const void *ctx, int64_t start, int64_t n, float *dst)
{
    const arange_ctx *a = ctx;
    for (int64_t j = 0; j < n; j++) dst[j] = (float)(a->start + (double)(start + j) * a->step);
}

/* Integer targets get start + i*step rounded (half to even) from double,
 * so i64 ranges beyond 2^24 stay exact. */
static void arange_int(lpx_tensor *t, const arange_ctx *a)
{
    bool wide = t->dtype == LPX_I64;
    int64_t lo = wide ? INT64_MIN : INT32_MIN, hi = wide ? INT64_MAX : INT32_MAX;
    double dlo = wide ? -0x1p63 : -0x1p31, dhi = wide ? 0x1p63 : 0x1p31; /* exact doubles */
    void *p = lpx_tensor_data(t);
    for (int64_t i = 0; i < t->numel; i++) {
        double v = nearbyint(a->start + (double)i * a->step);
        int64_t q = v <= dlo ? lo : v >= dhi ? hi : (int64_t)v;
        if (wide) ((int64_t *)p)[i] = q;
        else ((int32_t *)p)[i] = (int32_t)q;
    }
}

static lpx_status k_arange(lpx_call *c)
{
    const lpx_create_args *a = lpx_op_args_of(c);
    lpx_tensor *t;
    lpx_status st = cpu_new(c, a->dtype, 1, a->shape, &t);
    if (st) return st;
    arange_ctx g = {a->start, a->step};
    if (a->dtype == LPX_I64 || a->dtype == LPX_I32) arange_int(t, &g);
    else fill_gen(t, gen_arange, &g);
    cpu_ret(c, t);
    return LPX_OK;
}

typedef struct rng_ctx {
    uint32_t key[2];
    int bits; /* rand: mantissa bits of the uniform */
} rng_ctx;

static void gen_rand(const void *ctx, int64_t start, int64_t n, float *dst)
{
    const rng_ctx *r = ctx;
    const float scale = ldexpf(1.0f, -r->bits);
    uint32_t x[4];
    int64_t i = start, end = start + n;
    while (i < end) {
        uint64_t k = (uint64_t)i >> 2;
        uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), 1u, 0u};
        cpu_philox4x32_10(ctr, r->key, x);
        for (int w = (int)(i & 3); w < 4 && i < end; w++, i++)
            dst[i - start] = (float)(x[w] >> (32 - r->bits)) * scale;
    }
}

static void gen_randn(const void *ctx, int64_t start, int64_t n, float *dst)
{
    const rng_ctx *r = ctx;
    const double two_pi = 6.283185307179586476925286766559;
    uint32_t x[4];
    int64_t i = start, end = start + n;
    while (i < end) {
        uint64_t k = (uint64_t)i >> 1;
        uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), 0u, 0u};
        cpu_philox4x32_10(ctr, r->key, x);
        uint64_t a = ((uint64_t)x[0] << 32) | x[1], b = ((uint64_t)x[2] << 32) | x[3];
        double u1 = (double)((a >> 11) + 1) * 0x1p-53, u2 = (double)(b >> 11) * 0x1p-53;
        double rad = sqrt(-2.0 * log(u1)), th = two_pi * u2;
        if (!(i & 1)) dst[i++ - start] = (float)(rad * cos(th));
        if (i < end) dst[i++ - start] = (float)(rad * sin(th));
    }
}

static lpx_status rng_kernel(lpx_call *c, gen_fn gen)
{
    const lpx_create_args *a = lpx_op_args_of(c);
    rng_ctx r = {{(uint32_t)a->seed, (uint32_t)(a->seed >> 32)}, a->bits};
    lpx_tensor *t;
    lpx_status st = cpu_new(c, a->dtype, a->ndim, a->shape, &t);
    if (st) return st;
    fill_gen(t, gen, &r);
    cpu_ret(c, t);
    return LPX_OK;
}

static lpx_status k_randn(lpx_call *c) { return rng_kernel(c, gen_randn); }
static lpx_status k_rand(lpx_call *c) { return rng_kernel(c, gen_rand); }

lpx_status lpx_cpu_register_creation(void)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
        {LPX_OP_empty, k_empty}, {LPX_OP_zeros, k_fill}, {LPX_OP_full, k_fill},
        {LPX_OP_arange, k_arange}, {LPX_OP_randn, k_randn}, {LPX_OP_rand, k_rand},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = cpu_reg(table[i].op, table[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
