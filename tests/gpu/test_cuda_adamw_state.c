/* GPU suite: adamw_state_ (AdamW over block-quantized optimizer states,
 * backends/cuda/cuda_adamw.cu, a group of clamp(block / 4, 1, 32) threads
 * per quantization block) against the CPU kernel (backends/cpu/optim.c) on the
 * same inputs, bit for bit: parameters, m and v codes, their block scales
 * and the scaled-f16 master's scales, after each of several steps, for
 * every state format (8-bit, 4-bit, fp8), every master mode (plain f32 and
 * bf16 params, bf16 stochastic rounding, scaled f16 RNE and stochastic),
 * blocks 2, 4, 8 (a group of 1 or 2 threads), 32, 64 (sub-warp groups), 128
 * and 256 (a warp), and lists of tensors
 * whose numels are not multiples of the block (odd: the 4-bit last byte
 * holds one code), one of them spanning many CUDA blocks. Skips (77)
 * without a GPU. */
#include "gpu_util.h"

/* A CPU tensor of n raw random bytes viewed as dtype dt (codes); e4m3:
 * no NaN code (0x7F, 0xFF): a NaN's sign and payload after f32 arithmetic
 * differ between the host and the device (the GPU makes its canonical
 * NaN), and that difference is not the kernel's. */
static lpx_tensor *rand_bytes(lpx_dtype dt, int64_t n, uint64_t seed, bool e4m3)
{
    lpx_tensor *t = NULL;
    if (lpx_tensor_new(dt, 1, &n, lpx_cpu(), &t)) return NULL;
    rng = seed * 0x9E3779B97F4A7C15ull + 17;
    unsigned char *p = (unsigned char *)lpx_tensor_data(t);
    size_t nb = lpx_dtype_nbytes(dt, n);
    for (size_t i = 0; i < nb; i++) {
        p[i] = (unsigned char)(urand() * 256.0);
        if (e4m3 && (p[i] & 0x7F) == 0x7F) p[i] ^= 1;
    }
    return t;
}

/* A CPU tensor of n values drawn by kind: 0 normal * mag, 1 uniform in
 * [lo, lo + mag) */
static lpx_tensor *rand_vals(lpx_dtype dt, int64_t n, uint64_t seed, int kind, double lo, double mag)
{
    rng = seed * 0x2545F4914F6CDD1Dull + 5;
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = kind ? lo + mag * urand() : nrand() * mag;
    lpx_tensor *t = mk(dt, 1, &n, v);
    free(v);
    return t;
}

enum { NT = 3 }; /* tensors in the list */

/* One case: format f, master mode (0 plain, 1 bf16 SR, 2 f16s, 3 f16s SR),
 * parameter dtype pd (mode 0), block B, `steps` steps. */
static void state_case(int f, int master, lpx_dtype pd, int64_t B, int steps)
{
    const int64_t N[NT] = {3 * B + 5, 1001, 70001}; /* none a multiple of B; 70001: many CUDA blocks */
    lpx_tensor *c[7][NT] = {{NULL}}, *g_[7][NT] = {{NULL}}; /* p, m, ms, v, vs, xs, grad; CPU and GPU */
    const char *what[6] = {"params", "m codes", "m scales", "v codes", "v scales", "master scales"};
    const lpx_dtype mdt = master == 1 ? LPX_BF16 : master >= 2 ? LPX_F16 : pd;
    uint64_t seed = (uint64_t)(f * 1000 + master * 100 + B);
    for (int i = 0; i < NT; i++) {
        int64_t n = N[i], nb = (n + B - 1) / B;
        int64_t cb = f == LPX_OPTIM_STATE_4BIT ? n / B * (B / 2) + (n % B + 1) / 2 : n;
        c[0][i] = master >= 2 ? rand_vals(LPX_F16, n, seed + 1, 0, 0, 8000.0) : rand_vals(mdt, n, seed + 1, 0, 0, 1.0);
        c[1][i] = rand_bytes(LPX_U8, cb, seed + 2, f == LPX_OPTIM_STATE_FP8);
        c[2][i] = rand_vals(LPX_F32, nb, seed + 3, 1, 1e-3, 1e-2);
        c[3][i] = f == LPX_OPTIM_STATE_FP8 ? rand_vals(LPX_F16, n, seed + 4, 1, 0.0, 30000.0)
                                           : rand_bytes(LPX_U8, cb, seed + 4, false);
        c[4][i] = rand_vals(LPX_F32, nb, seed + 5, 1, 1e-6, 1e-5);
        c[5][i] = master >= 2 ? rand_vals(LPX_F32, nb, seed + 6, 1, 1e-5, 1e-4) : NULL;
        for (int k = 0; k < 6; k++) g_[k][i] = c[k][i] ? gpu_up(c[k][i]) : NULL;
    }
    bool ok = true;
    for (int t = 1; t <= steps && ok; t++) {
        for (int i = 0; i < NT; i++) {
            lpx_tensor_release(c[6][i]);
            lpx_tensor_release(g_[6][i]);
            /* grads f32, bf16 for the last tensor */
            c[6][i] = rand_vals(i == NT - 1 ? LPX_BF16 : LPX_F32, N[i], seed * 31 + (uint64_t)t * 7 + (uint64_t)i, 0,
                                0, t == 2 ? 1e-3 : 0.5);
            g_[6][i] = gpu_up(c[6][i]);
        }
        for (int k = 0; k < 7; k++)
            for (int i = 0; i < NT; i++)
                if ((k != 5 || master >= 2) && (!c[k][i] || !g_[k][i])) ok = false;
        if (!ok) {
            CHECKF(false, "set-up failed: %s", lpx_last_error());
            break;
        }
        for (int side = 0; side < 2; side++) {
            lpx_tensor *(*x)[NT] = side ? g_ : c;
            CHECK_OK(lpx_adamw_state_(x[0], x[6], x[1], x[2], x[3], x[4], NT, (lpx_optim_state_format)f, B, 1e-3,
                                      0.9, 0.999, 1e-8, 0.01, t, (lpx_optim_master)master, 0x1234567890abcdefull,
                                      3, 1000 + 17 * (int64_t)f, master >= 2 ? x[5] : NULL));
        }
        for (int k = 0; k < 6 && ok; k++)
            for (int i = 0; i < NT && ok; i++)
                if (c[k][i]) {
                    ok = gpu_same_bits(what[k], c[k][i], g_[k][i]);
                    CHECKF(ok, "format %d master %d %s block %lld step %d tensor %d (numel %lld): %s differ", f,
                           master, lpx_dtype_name(mdt), (long long)B, t, i, (long long)N[i], what[k]);
                }
    }
    for (int k = 0; k < 7; k++)
        for (int i = 0; i < NT; i++) {
            lpx_tensor_release(c[k][i]);
            lpx_tensor_release(g_[k][i]);
        }
}

static void test_formats_masters_blocks(void)
{
    static const int64_t blocks[] = {2, 4, 8, 32, 64, 128, 256};
    for (int f = 0; f < LPX_OPTIM_STATE_FORMATS; f++)
        for (int master = 0; master < 4; master++)
            for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
                state_case(f, master, LPX_F32, blocks[b], 3);
                if (master == 0) state_case(f, master, LPX_BF16, blocks[b], 2);
            }
}

/* A Llama-sized matrix (4096 x 14336) at the default blocks, one step:
 * the grid of the bench (bench/gpu/bench_gpu.c, adamw_state_*) checked. */
static void test_llama_sized(void)
{
    const int64_t n = 4096LL * 14336LL;
    for (int f = 0; f < LPX_OPTIM_STATE_FORMATS; f++) {
        int64_t B = f == LPX_OPTIM_STATE_4BIT ? 128 : 256, nb = n / B, cb = f == LPX_OPTIM_STATE_4BIT ? n / 2 : n;
        lpx_tensor *c[6], *g[6];
        c[0] = rand_vals(LPX_BF16, n, 91 + (uint64_t)f, 0, 0, 1.0);
        c[1] = rand_bytes(LPX_U8, cb, 92, f == LPX_OPTIM_STATE_FP8);
        c[2] = rand_vals(LPX_F32, nb, 93, 1, 1e-3, 1e-2);
        c[3] = f == LPX_OPTIM_STATE_FP8 ? rand_vals(LPX_F16, n, 94, 1, 0.0, 30000.0) : rand_bytes(LPX_U8, cb, 94, false);
        c[4] = rand_vals(LPX_F32, nb, 95, 1, 1e-6, 1e-5);
        c[5] = rand_vals(LPX_BF16, n, 96, 0, 0, 0.5);
        for (int k = 0; k < 6; k++) g[k] = c[k] ? gpu_up(c[k]) : NULL;
        bool ok = true;
        for (int k = 0; k < 6; k++) ok = ok && c[k] && g[k];
        CHECKF(ok, "set-up failed: %s", lpx_last_error());
        if (ok) {
            CHECK_OK(lpx_adamw_state_(&c[0], &c[5], &c[1], &c[2], &c[3], &c[4], 1, (lpx_optim_state_format)f, B,
                                      1e-3, 0.9, 0.999, 1e-8, 0.01, 5, LPX_OPTIM_MASTER_BF16_SR, 7, 0, 0, NULL));
            CHECK_OK(lpx_adamw_state_(&g[0], &g[5], &g[1], &g[2], &g[3], &g[4], 1, (lpx_optim_state_format)f, B,
                                      1e-3, 0.9, 0.999, 1e-8, 0.01, 5, LPX_OPTIM_MASTER_BF16_SR, 7, 0, 0, NULL));
            CHECKF(gpu_same_bits("params", c[0], g[0]), "format %d", f);
            CHECKF(gpu_same_bits("m codes", c[1], g[1]), "format %d", f);
            CHECKF(gpu_same_bits("m scales", c[2], g[2]), "format %d", f);
            CHECKF(gpu_same_bits("v codes", c[3], g[3]), "format %d", f);
            CHECKF(gpu_same_bits("v scales", c[4], g[4]), "format %d", f);
        }
        for (int k = 0; k < 6; k++) {
            lpx_tensor_release(c[k]);
            lpx_tensor_release(g[k]);
        }
    }
}

int main(void)
{
    gpu_setup();
    RUN(test_formats_masters_blocks);
    RUN(test_llama_sized);
    return CHECK_DONE();
}
