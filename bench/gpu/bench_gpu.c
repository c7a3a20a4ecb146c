/* bench_gpu: what the CUDA backend (lpx-cuda.so) achieves on one GPU,
 * measured against the device's own copy bandwidth (docs/GPU.md,
 * bench/gpu/run.sh puts it beside PyTorch).
 *
 *   bench_gpu [PLUGIN] [--plugin PATH] [--json FILE] [--reps N] [--warmup N]
 *             [--batch K] [--only CASE[,CASE...]] [--list] [--quick]
 *             [--copy-gbps X]
 *
 * PLUGIN defaults to $LPX_CUDA_PLUGIN. --copy-gbps gives the reference of
 * the "% copy" column when the copy case does not run in this process. Cases (--list prints the names):
 *   copy               cudaMemcpyAsync device to device, 1 GiB: the
 *                      bandwidth reference (bytes read + written)
 *   copy_op            lpx_copy_ of 1 GiB of f32 (the plugin's copy_)
 *   cast_fp8           lpx_cast bf16 -> e4m3 (no scale, no amax)
 *   fp8_quant_static   fp8_quantize bf16 [16384, 16384] -> e4m3 with a
 *                      given scale (delayed scaling: cast + amax, one pass)
 *   fp8_quant_dynamic  the same without a scale (amax, then the cast)
 *   fp8_quant_rowwise  dynamic, one scale per row ([M, 1])
 *   nf4_dequant        nf4_dequantize of an 8192 x 8192 NF4 weight to bf16
 *   nf4_dequant_16k    the same, 16384 x 16384 (512 MiB written)
 *   gemm_bf16          lpx_matmul bf16 8192^3
 *   gemm_fp8_tensorwise  fp8_scaled_mm e4m3 x e4m3 8192^3, tensorwise
 *                      scales, bf16 out (b column-major, as cuBLASLt wants)
 *   gemm_fp8_rowwise   the same with [M, 1] x [1, N] scales
 *   gemm_fp8_blockwise fp8_mm_block: a in 1 x 128 blocks, b = w^T of a
 *                      128 x 128-block weight (DeepSeek-V3), bf16 out
 *   attention_llama3   lpx_attention + lpx_attention_backward, bf16, causal,
 *                      Llama-3-8B heads (32 q / 8 kv, head dim 128), batch 2
 *                      x T 4096 (cuDNN's fused SDPA when lpx-cuda found
 *                      it: the JSON's "path" says); CASE_fwd: the forward
 *                      alone
 *   adamw              adamw_ over 64 f32 params of 16 MiB (1 GiB):
 *                      params r+w, grads r, exp_avg r+w, exp_avg_sq r+w
 *   adamw_state_FMT    adamw_state_ (quantized optimizer states, issue 37)
 *                      on one bf16 [4096, 14336] parameter with the
 *                      bf16-SR master and a bf16 grad; FMT 8bit, 4bit,
 *                      fp8 at their default blocks (256, 128, 256):
 *                      p r+w, g r, m and v codes r+w, block scales r+w
 *   float8_linear_RECIPE_KxN   the layer a user trains with, through the
 *                      public API: lpx_float8_linear_forward (with a
 *                      context, as in training) + _backward (grad_x and
 *                      grad_W), bf16 x [8192, K], W [N, K], grad_out
 *                      [8192, N], (K, N) = (4096, 4096), (4096, 14336),
 *                      (14336, 4096); RECIPE: bf16 (the same calls with
 *                      the three GEMMs in high precision), tensorwise,
 *                      tensorwise_fp8w (W already a tensorwise float8, as
 *                      the fp8 all-gather delivers it), rowwise,
 *                      rowwise_with_gw_hp, delayed, blockwise. Each case also prints
 *                      the forward alone as CASE_fwd.
 *
 * Timing: cudaEvents recorded on the plugin's stream (the one every lpx
 * kernel of device 0 runs on) around each sample of --batch K (default 1)
 * back-to-back repetitions, after a warm-up; the median (and minimum) over
 * --reps (default 30, at least 20) samples of the time per repetition.
 * With K > 1 no event separates the repetitions inside a sample, as in a
 * training step, where one kernel's launch overlaps the previous one's
 * drain (programmatic dependent launch on sm_90).
 * Memory-bound cases rotate over several input (and output) buffers so
 * that no repetition finds its operands in the 50 MB L2. Data is made on
 * the host (uniform in [-2, 2)) and uploaded, so a case depends only on
 * the kernels it times.
 *
 * Each case that fails prints its error on its own row and the others go
 * on; exit status 0 when every case ran, 1 when one failed, 77 when the
 * plugin declined (no CUDA device), 2 on bad usage or a failed load. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include <lpx/lpx.h>
#include <lpx/cuda.h>
#include <lpx/plugin.h>

#define MIB (1024.0 * 1024.0)
#define MAX_KEEP 1024

/* ---- options and global state --------------------------------------- */

static int g_reps = 30;
static int g_warmup = 3;
static int g_batch = 1;
static bool g_quick;
static FILE *g_json;
static cudaStream_t g_stream;
static lpx_cuda_sync_fn g_sync;
static double g_copy_gbps;  /* the copy row of this run, 0 until measured */
static int g_failed;
static const lpx_plugin *g_plugin;
/* the path a case's kernels took (cuDNN or the reference attention,
 * cuBLASLt block scaling or the reference GEMM), set by the case, written
 * as "path" into its JSON rows, cleared after each case */
static char g_path[512];

/* ---- per-case tensor arena: everything a case makes is released at its
 * end, whatever path it leaves by ---------------------------------------- */

static lpx_tensor *g_keep[MAX_KEEP];
static int g_nkeep;

static lpx_tensor *keep(lpx_tensor *t)
{
    if (t && g_nkeep < MAX_KEEP) g_keep[g_nkeep++] = t;
    return t;
}

static void release_all(void)
{
    while (g_nkeep > 0) lpx_tensor_release(g_keep[--g_nkeep]);
}

/* ---- error reporting ------------------------------------------------ */

static char g_err[1024];

static int fail_lpx(lpx_status st, const char *what)
{
    snprintf(g_err, sizeof g_err, "%s: %s (%s)", what, lpx_status_string(st), lpx_last_error());
    return 1;
}

static int fail_cuda(cudaError_t e, const char *what)
{
    snprintf(g_err, sizeof g_err, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
}

#define TRY_LPX(what, expr) do { lpx_status st_ = (expr); if (st_) return fail_lpx(st_, (what)); } while (0)
#define TRY_CUDA(what, expr) do { cudaError_t e_ = (expr); if (e_ != cudaSuccess) return fail_cuda(e_, (what)); } while (0)

/* ---- host data ------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;  /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* uniform in [-2, 2): 24 random mantissa bits */
static float rng_unif(uint64_t *s) { return (float)(rng_next(s) >> 40) * (4.0f / 16777216.0f) - 2.0f; }

static void fill_f32(float *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) p[i] = rng_unif(&s);
}

/* bf16 by truncation (the values only need to be spread) */
static void fill_bf16(uint16_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        float f = rng_unif(&s);
        uint32_t b;
        memcpy(&b, &f, sizeof b);
        p[i] = (uint16_t)(b >> 16);
    }
}

static lpx_device dev0(void) { return lpx_cuda_device(0); }

/* Uploads a host buffer as a new GPU tensor (kept in the arena). */
static int upload(const void *host, lpx_dtype dt, int nd, const int64_t *shape, lpx_tensor **out)
{
    lpx_tensor *h = NULL, *d = NULL;
    TRY_LPX("wrap host buffer", lpx_tensor_from_blob((void *)host, dt, nd, shape, NULL, lpx_cpu(), NULL, NULL, &h));
    lpx_status st = lpx_tensor_to(h, dev0(), &d);
    lpx_tensor_release(h);
    if (st) return fail_lpx(st, "lpx_tensor_to(cuda)");
    *out = keep(d);
    return 0;
}

/* A GPU tensor of `dt` filled with the constant v (made on the host). */
static int upload_const(double v, lpx_dtype dt, int nd, const int64_t *shape, lpx_tensor **out)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    void *buf = malloc(lpx_dtype_nbytes(dt, n ? n : 1));
    int r = 1;
    if (!f || !buf) {
        snprintf(g_err, sizeof g_err, "out of host memory");
    } else {
        for (int64_t i = 0; i < n; i++) f[i] = (float)v;
        lpx_status st = lpx_convert(buf, dt, f, LPX_F32, (size_t)n, 0);
        r = st ? fail_lpx(st, "lpx_convert") : upload(buf, dt, nd, shape, out);
    }
    free(f);
    free(buf);
    return r;
}

/* ---- timing --------------------------------------------------------- */

typedef int (*rep_fn)(void *ctx, int i);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs fn warm-up times, then g_reps samples of g_batch back-to-back
 * calls, cudaEvents recorded on the plugin's stream between samples;
 * *med / *mn get the median / minimum ms per call. The rep index keeps
 * counting across warm-up and timed reps (rotation). */
static int time_reps(rep_fn fn, void *ctx, double *med, double *mn)
{
    int reps = g_reps, r = 1;
    cudaEvent_t *ev = calloc((size_t)reps + 1, sizeof *ev);
    double *ms = calloc((size_t)reps, sizeof *ms);
    int made = 0, i = 0;
    if (!ev || !ms) {
        snprintf(g_err, sizeof g_err, "out of host memory");
        goto out;
    }
    for (; made <= reps; made++) {
        cudaError_t e = cudaEventCreate(&ev[made]);
        if (e != cudaSuccess) {
            fail_cuda(e, "cudaEventCreate");
            goto out;
        }
    }
    for (; i < g_warmup; i++)
        if (fn(ctx, i)) goto out;
    lpx_status st = g_sync(0);
    if (st) {
        fail_lpx(st, "warm-up (lpx_cuda_sync)");
        goto out;
    }
    cudaError_t e = cudaEventRecord(ev[0], g_stream);
    if (e != cudaSuccess) {
        fail_cuda(e, "cudaEventRecord");
        goto out;
    }
    struct timespec h0, h1;
    clock_gettime(CLOCK_MONOTONIC, &h0);
    for (int k = 0; k < reps; k++) {
        for (int j = 0; j < g_batch; j++, i++)
            if (fn(ctx, i)) goto out;
        if ((e = cudaEventRecord(ev[k + 1], g_stream)) != cudaSuccess) {
            fail_cuda(e, "cudaEventRecord");
            goto out;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &h1);
    /* LPX_BENCH_HOST_TIMING=1: the host's time to enqueue one rep; when it
     * is close to the GPU time per rep, the GPU waits for the host and the
     * event times measure the host, not the kernel */
    if (getenv("LPX_BENCH_HOST_TIMING"))
        fprintf(stderr, "# host enqueue: %.1f us/rep\n",
                ((double)(h1.tv_sec - h0.tv_sec) * 1e9 + (double)(h1.tv_nsec - h0.tv_nsec)) / 1e3 / reps / g_batch);
    if ((e = cudaEventSynchronize(ev[reps])) != cudaSuccess) {
        fail_cuda(e, "cudaEventSynchronize (a kernel failed?)");
        goto out;
    }
    if ((st = g_sync(0))) {
        fail_lpx(st, "lpx_cuda_sync");
        goto out;
    }
    for (int k = 0; k < reps; k++) {
        float t = 0;
        if ((e = cudaEventElapsedTime(&t, ev[k], ev[k + 1])) != cudaSuccess) {
            fail_cuda(e, "cudaEventElapsedTime");
            goto out;
        }
        ms[k] = t / g_batch;
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
    *med = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
    *mn = ms[0];
    r = 0;
out:
    for (int k = 0; k < made; k++) cudaEventDestroy(ev[k]);
    free(ev);
    free(ms);
    return r;
}

/* ---- reporting ------------------------------------------------------ */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* One row: bytes > 0 gives GB/s (and % of copy), flops > 0 TFLOP/s. */
static void report(const char *name, const char *desc, double med, double mn, double bytes, double flops)
{
    double gbps = bytes > 0 ? bytes / (med * 1e-3) / 1e9 : 0;
    double tflops = flops > 0 ? flops / (med * 1e-3) / 1e12 : 0;
    printf("%-22s %9.3f ms", name, med);
    if (bytes > 0) {
        printf("  %8.1f GB/s", gbps);
        if (g_copy_gbps > 0) printf("  %6.1f%% copy", 100.0 * gbps / g_copy_gbps);
    } else if (flops > 0) {
        printf("  %8.1f TFLOP/s", tflops);
    }
    printf("   (min %.3f ms; %s)\n", mn, desc);
    fflush(stdout);
    if (g_json) {
        fprintf(g_json, "{\"impl\": \"lpx\", \"case\": ");
        json_str(g_json, name);
        fprintf(g_json, ", \"desc\": ");
        json_str(g_json, desc);
        fprintf(g_json, ", \"ms\": %.6f, \"min_ms\": %.6f, \"reps\": %d, \"batch\": %d, \"bytes\": %.0f, \"flops\": %.0f",
                med, mn, g_reps, g_batch, bytes, flops);
        if (bytes > 0) fprintf(g_json, ", \"gbps\": %.3f", gbps);
        if (flops > 0) fprintf(g_json, ", \"tflops\": %.3f", tflops);
        if (g_path[0]) {
            fprintf(g_json, ", \"path\": ");
            json_str(g_json, g_path);
        }
        fprintf(g_json, ", \"error\": null}\n");
        fflush(g_json);
    }
}

static void report_error(const char *name, const char *msg)
{
    printf("%-22s ERROR: %s\n", name, msg);
    fflush(stdout);
    if (g_json) {
        fprintf(g_json, "{\"impl\": \"lpx\", \"case\": ");
        json_str(g_json, name);
        fprintf(g_json, ", \"error\": ");
        json_str(g_json, msg);
        fprintf(g_json, "}\n");
        fflush(g_json);
    }
}

/* ---- the paths the plugin's kernels took ------------------------------ */

/* g_path = "attention: N calls on cuDNN; <the plugin's words>" or the
 * block GEMM's "cuBLASLt checks passed: N; <words>" (lpx_cuda_*_path,
 * include/lpx/cuda.h); a plugin without the symbol says so */
static void note_path(const char *sym_name, const char *what)
{
    void *sym = g_plugin ? lpx_plugin_symbol(g_plugin, sym_name) : NULL;
    if (!sym) {
        snprintf(g_path, sizeof g_path, "%s: the plugin does not export %s", what, sym_name);
        return;
    }
    int (*fn)(char *, size_t);
    memcpy(&fn, &sym, sizeof sym);
    char buf[2048];
    int n = fn(buf, sizeof buf);
    int k = snprintf(g_path, sizeof g_path, "%s: %d; ", what, n);
    if (k > 0 && (size_t)k < sizeof g_path) {
        size_t room = sizeof g_path - (size_t)k - 1, len = strlen(buf);
        memcpy(g_path + k, buf, len < room ? len : room);
        g_path[(size_t)k + (len < room ? len : room)] = 0;
    }
    for (char *c = g_path; *c; c++)
        if (*c == '\n') *c = ' ';
}

/* ---- cases ---------------------------------------------------------- */

/* (a) the bandwidth reference: cudaMemcpyAsync D2D over rotating pairs */
typedef struct copy_ctx {
    void *src[2], *dst[2];
    size_t n;
    lpx_tensor *tsrc[2], *tdst[2];
} copy_ctx;

static int rep_memcpy(void *p, int i)
{
    copy_ctx *c = p;
    TRY_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(c->dst[i % 2], c->src[i % 2], c->n, cudaMemcpyDeviceToDevice, g_stream));
    return 0;
}

static int rep_copy_op(void *p, int i)
{
    copy_ctx *c = p;
    TRY_LPX("lpx_copy_", lpx_copy_(c->tdst[i % 2], c->tsrc[i % 2]));
    return 0;
}

static int make_copy_bufs(copy_ctx *c, bool f32)
{
    c->n = g_quick ? (size_t)16 << 20 : (size_t)1 << 30;
    int64_t shape[1] = {f32 ? (int64_t)(c->n / 4) : (int64_t)c->n};
    for (int k = 0; k < 2; k++) {
        lpx_tensor *s = NULL, *d = NULL;
        TRY_LPX("lpx_tensor_new(cuda)", lpx_tensor_new(f32 ? LPX_F32 : LPX_U8, 1, shape, dev0(), &s));
        keep(s);
        TRY_LPX("lpx_tensor_new(cuda)", lpx_tensor_new(f32 ? LPX_F32 : LPX_U8, 1, shape, dev0(), &d));
        keep(d);
        c->tsrc[k] = s;
        c->tdst[k] = d;
        c->src[k] = lpx_tensor_data(s);
        c->dst[k] = lpx_tensor_data(d);
        TRY_CUDA("cudaMemsetAsync", cudaMemsetAsync(c->src[k], 0x3c, c->n, g_stream));
        TRY_CUDA("cudaMemsetAsync", cudaMemsetAsync(c->dst[k], 0, c->n, g_stream));
    }
    return 0;
}

static int case_copy(const char *name)
{
    copy_ctx c;
    memset(&c, 0, sizeof c);
    double med, mn;
    if (make_copy_bufs(&c, false) || time_reps(rep_memcpy, &c, &med, &mn)) return 1;
    g_copy_gbps = 2.0 * (double)c.n / (med * 1e-3) / 1e9;
    char desc[128];
    snprintf(desc, sizeof desc, "cudaMemcpyAsync D2D %.0f MiB, read + write", (double)c.n / MIB);
    report(name, desc, med, mn, 2.0 * (double)c.n, 0);
    return 0;
}

static int case_copy_op(const char *name)
{
    copy_ctx c;
    memset(&c, 0, sizeof c);
    double med, mn;
    if (make_copy_bufs(&c, true) || time_reps(rep_copy_op, &c, &med, &mn)) return 1;
    char desc[128];
    snprintf(desc, sizeof desc, "lpx_copy_ f32 %.0f MiB, read + write", (double)c.n / MIB);
    report(name, desc, med, mn, 2.0 * (double)c.n, 0);
    return 0;
}

/* (b) bf16 -> fp8 e4m3: plain cast and the fused quantize */
enum { Q_CAST, Q_STATIC, Q_DYNAMIC, Q_ROWWISE };

typedef struct quant_ctx {
    int mode;
    lpx_tensor *x[2];
    lpx_tensor *scale;   /* Q_STATIC */
} quant_ctx;

static int rep_quant(void *p, int i)
{
    quant_ctx *c = p;
    lpx_tensor *x = c->x[i % 2], *q = NULL, *stats = NULL;
    int64_t dim = 1;
    lpx_status st;
    if (c->mode == Q_CAST)
        st = lpx_cast(x, LPX_F8E4M3FN, false, &q);
    else
        st = lpx_fp8_quantize(x, c->mode == Q_STATIC ? c->scale : NULL, LPX_F8E4M3FN,
                              c->mode == Q_ROWWISE ? &dim : NULL, false, 0.0, true, &q, NULL, NULL, &stats);
    lpx_tensor_release(q);
    lpx_tensor_release(stats);
    if (st) return fail_lpx(st, c->mode == Q_CAST ? "lpx_cast" : "lpx_fp8_quantize");
    return 0;
}

/* One more quantize, read back: the amax must be that of the data
 * (uniform in [-2, 2)), so a kernel that skips work cannot look fast. */
static int check_quant(quant_ctx *c)
{
    if (c->mode == Q_CAST) return 0;
    lpx_tensor *q = NULL, *stats = NULL, *hs = NULL;
    int64_t dim = 1;
    lpx_status st = lpx_fp8_quantize(c->x[0], c->mode == Q_STATIC ? c->scale : NULL, LPX_F8E4M3FN,
                                     c->mode == Q_ROWWISE ? &dim : NULL, false, 0.0, true, &q, NULL, NULL, &stats);
    if (!st) st = lpx_tensor_to(stats, lpx_cpu(), &hs);
    double amax = 0;
    if (!st) st = lpx_item(hs, 0, &amax);
    lpx_tensor_release(q);
    lpx_tensor_release(stats);
    lpx_tensor_release(hs);
    if (st) return fail_lpx(st, "check: lpx_fp8_quantize stats");
    if (!(amax > 1.9 && amax <= 2.0)) {
        snprintf(g_err, sizeof g_err, "check: stats[0] (amax) = %g, expected about 2 (wrong result)", amax);
        return 1;
    }
    return 0;
}

static int case_quant(const char *name, int mode)
{
    int64_t n = g_quick ? 2048 : 16384;
    int64_t shape[2] = {n, n};
    size_t numel = (size_t)(n * n);
    uint16_t *h = malloc(numel * sizeof *h);
    if (!h) {
        snprintf(g_err, sizeof g_err, "out of host memory");
        return 1;
    }
    fill_bf16(h, numel, 11);
    quant_ctx c = {.mode = mode};
    int r = upload(h, LPX_BF16, 2, shape, &c.x[0]) || upload(h, LPX_BF16, 2, shape, &c.x[1]);
    free(h);
    if (r) return 1;
    if (mode == Q_STATIC && upload_const(448.0 / 2.0, LPX_F32, 0, NULL, &c.scale)) return 1;
    double med, mn;
    if (time_reps(rep_quant, &c, &med, &mn) || check_quant(&c)) return 1;
    double bytes = (double)numel * 2 + (double)numel;  /* bf16 read + fp8 written */
    if (mode == Q_ROWWISE) bytes += (double)n * 4 * 2;  /* scale, scale_inv */
    else if (mode != Q_CAST) bytes += 4 * 2;
    if (mode != Q_CAST) bytes += 16;                     /* stats */
    static const char *what[] = {"lpx_cast, no scale, no amax", "fp8_quantize, given scale (cast + amax)",
                                 "fp8_quantize, dynamic tensorwise", "fp8_quantize, dynamic rowwise [M,1]"};
    char desc[160];
    snprintf(desc, sizeof desc, "bf16 [%lld,%lld] -> e4m3, %s", (long long)n, (long long)n, what[mode]);
    report(name, desc, med, mn, bytes, 0);
    return 0;
}

/* (c) NF4 dequantize to bf16 */
#define NF4_COPIES 3

typedef struct nf4_ctx {
    lpx_op op;
    lpx_tensor *parts[NF4_COPIES][4];  /* codes, qscalers, factors, mean */
    lpx_tensor *out[2];
    int64_t count;
} nf4_ctx;

static int rep_nf4(void *p, int i)
{
    nf4_ctx *c = p;
    lpx_tensor **w = c->parts[i % NF4_COPIES];
    lpx_value a[10] = {lpx_v_tensor(w[0]), lpx_v_tensor(w[1]), lpx_v_tensor(w[2]), lpx_v_tensor(w[3]),
                       lpx_v_i64(64), lpx_v_i64(256), lpx_v_i64(0), lpx_v_i64(c->count),
                       lpx_v_dtype(LPX_BF16), lpx_v_tensor(c->out[i % 2])};
    lpx_call call;
    lpx_call_init(&call, c->op, a, 10);
    lpx_status st = lpx_dispatch(&call);
    if (st) return fail_lpx(st, "nf4_dequantize");
    lpx_call_release_rets(&call);
    return 0;
}

static int case_nf4(const char *name, int64_t n)
{
    if (g_quick) n /= 8;
    nf4_ctx c;
    memset(&c, 0, sizeof c);
    c.count = n * n;
    lpx_op qop;
    TRY_LPX("lpx_op_find(nf4_quantize)", lpx_op_find("nf4_quantize", &qop));
    TRY_LPX("lpx_op_find(nf4_dequantize)", lpx_op_find("nf4_dequantize", &c.op));
    /* quantize on the CPU (the reference kernels), then upload the payload */
    float *h = malloc((size_t)c.count * sizeof *h);
    if (!h) {
        snprintf(g_err, sizeof g_err, "out of host memory");
        return 1;
    }
    fill_f32(h, (size_t)c.count, 21);
    int64_t shape[2] = {n, n};
    lpx_tensor *x = NULL;
    lpx_status st = lpx_tensor_from_blob(h, LPX_F32, 2, shape, NULL, lpx_cpu(), NULL, NULL, &x);
    if (st) {
        free(h);
        return fail_lpx(st, "wrap host buffer");
    }
    lpx_value qa[3] = {lpx_v_tensor(x), lpx_v_i64(64), lpx_v_i64(256)};
    lpx_call qc;
    lpx_call_init(&qc, qop, qa, 3);
    st = lpx_dispatch(&qc);
    lpx_tensor_release(x);
    free(h);
    if (st) return fail_lpx(st, "nf4_quantize (cpu)");
    for (int k = 0; k < 4; k++) keep(qc.rets[k].u.t);
    double in_bytes = 0;
    for (int k = 0; k < 4; k++) {
        lpx_tensor *t = qc.rets[k].u.t;
        in_bytes += (double)lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
        for (int j = 0; j < NF4_COPIES; j++) {
            lpx_tensor *d = NULL;
            TRY_LPX("lpx_tensor_to(cuda)", lpx_tensor_to(t, dev0(), &d));
            c.parts[j][k] = keep(d);
        }
    }
    int64_t oshape[1] = {c.count};
    for (int k = 0; k < 2; k++) {
        TRY_LPX("lpx_tensor_new(cuda)", lpx_tensor_new(LPX_BF16, 1, oshape, dev0(), &c.out[k]));
        keep(c.out[k]);
    }
    double med, mn;
    if (time_reps(rep_nf4, &c, &med, &mn)) return 1;
    char desc[160];
    snprintf(desc, sizeof desc, "nf4_dequantize [%lld,%lld] -> bf16 (block 64, scaler block 256), codes+scalers read, bf16 written",
             (long long)n, (long long)n);
    report(name, desc, med, mn, in_bytes + (double)c.count * 2, 0);
    return 0;
}

/* (d) GEMMs 8192^3 */
enum { G_BF16, G_FP8_TENSOR, G_FP8_ROW, G_FP8_BLOCK };

typedef struct gemm_ctx {
    int mode;
    lpx_tensor *a, *b, *sa, *sb;
} gemm_ctx;

static int rep_gemm(void *p, int i)
{
    (void)i;
    gemm_ctx *c = p;
    lpx_tensor *out = NULL;
    lpx_status st = c->mode == G_BF16        ? lpx_matmul(c->a, c->b, &out)
                    : c->mode == G_FP8_BLOCK ? lpx_fp8_mm_block(c->a, c->sa, 1, 128, c->b, c->sb, 128, 128, NULL,
                                                                LPX_BF16, &out)
                                             : lpx_fp8_scaled_mm(c->a, c->sa, c->b, c->sb, NULL, LPX_BF16, &out);
    lpx_tensor_release(out);
    if (st) return fail_lpx(st, c->mode == G_BF16 ? "lpx_matmul" : c->mode == G_FP8_BLOCK ? "lpx_fp8_mm_block"
                                                                                          : "lpx_fp8_scaled_mm");
    return 0;
}

static int case_gemm(const char *name, int mode)
{
    int64_t n = g_quick ? 1024 : 8192;
    size_t numel = (size_t)(n * n);
    int64_t shape[2] = {n, n};
    gemm_ctx c = {.mode = mode};
    if (mode == G_BF16) {
        uint16_t *h = malloc(numel * sizeof *h);
        if (!h) {
            snprintf(g_err, sizeof g_err, "out of host memory");
            return 1;
        }
        fill_bf16(h, numel, 31);
        int r = upload(h, LPX_BF16, 2, shape, &c.a);
        if (!r) fill_bf16(h, numel, 32);
        if (!r) r = upload(h, LPX_BF16, 2, shape, &c.b);
        free(h);
        if (r) return 1;
    } else {
        float *f = malloc(numel * sizeof *f);
        uint8_t *q = malloc(numel);
        int r = 1;
        lpx_tensor *w = NULL;
        if (!f || !q) {
            snprintf(g_err, sizeof g_err, "out of host memory");
        } else {
            lpx_status st;
            fill_f32(f, numel, 41);
            if ((st = lpx_convert(q, LPX_F8E4M3FN, f, LPX_F32, numel, LPX_CONVERT_SATURATE))) r = fail_lpx(st, "lpx_convert");
            else r = upload(q, LPX_F8E4M3FN, 2, shape, &c.a);
            if (!r) {
                fill_f32(f, numel, 42);
                if ((st = lpx_convert(q, LPX_F8E4M3FN, f, LPX_F32, numel, LPX_CONVERT_SATURATE))) r = fail_lpx(st, "lpx_convert");
                else r = upload(q, LPX_F8E4M3FN, 2, shape, &w);  /* w [N, K] row-major */
            }
        }
        free(f);
        free(q);
        if (r) return 1;
        TRY_LPX("lpx_t (b = w^T, column-major)", lpx_t(w, &c.b));
        keep(c.b);
        int64_t sa_shape[2] = {n, 1}, sb_shape[2] = {1, n};
        if (mode == G_FP8_BLOCK) {
            /* DeepSeek-V3's blocks: a 1 x 128 ([M, K/128] scales), w 128 x 128
             * ([N/128, K/128], used transposed as b's [K/128, N/128]) */
            int64_t sa_b[2] = {n, n / 128}, sw_b[2] = {n / 128, n / 128};
            lpx_tensor *sw = NULL;
            if (upload_const(1.0 / 224, LPX_F32, 2, sa_b, &c.sa) || upload_const(1.0 / 224, LPX_F32, 2, sw_b, &sw))
                return 1;
            TRY_LPX("lpx_t (w's block scales)", lpx_t(sw, &c.sb));
            keep(c.sb);
        } else if (mode == G_FP8_TENSOR) {
            if (upload_const(1.0 / 224, LPX_F32, 0, NULL, &c.sa) || upload_const(1.0 / 224, LPX_F32, 0, NULL, &c.sb))
                return 1;
        } else if (upload_const(1.0 / 224, LPX_F32, 2, sa_shape, &c.sa) ||
                   upload_const(1.0 / 224, LPX_F32, 2, sb_shape, &c.sb)) {
            return 1;
        }
    }
    double med, mn;
    if (time_reps(rep_gemm, &c, &med, &mn)) return 1;
    char desc[160];
    static const char *what[] = {"lpx_matmul bf16 x bf16 -> bf16",
                                 "fp8_scaled_mm e4m3 x e4m3^T, tensorwise scales -> bf16",
                                 "fp8_scaled_mm e4m3 x e4m3^T, rowwise [M,1] x [1,N] scales -> bf16",
                                 "fp8_mm_block e4m3 1x128 x (128x128)^T, f32 block scales -> bf16"};
    snprintf(desc, sizeof desc, "%lld^3, %s", (long long)n, what[mode]);
    if (mode == G_FP8_BLOCK) note_path(LPX_CUDA_SYM_BLOCK_GEMM_PATH, "block GEMM kinds on cuBLASLt");
    report(name, desc, med, mn, 0, 2.0 * (double)n * (double)n * (double)n);
    return 0;
}

/* (e) fused AdamW over a list of f32 params */
#define ADAMW_TENSORS 64

typedef struct adamw_ctx {
    lpx_op op;
    lpx_tensor *lists[4][ADAMW_TENSORS];  /* params, grads, exp_avg, exp_avg_sq */
} adamw_ctx;

static int rep_adamw(void *p, int i)
{
    adamw_ctx *c = p;
    lpx_value a[10] = {lpx_v_tensors(c->lists[0], ADAMW_TENSORS), lpx_v_tensors(c->lists[1], ADAMW_TENSORS),
                       lpx_v_tensors(c->lists[2], ADAMW_TENSORS), lpx_v_tensors(c->lists[3], ADAMW_TENSORS),
                       lpx_v_f64(1e-3), lpx_v_f64(0.9), lpx_v_f64(0.999), lpx_v_f64(1e-8), lpx_v_f64(0.01),
                       lpx_v_i64(i + 1)};
    lpx_call call;
    lpx_call_init(&call, c->op, a, 10);
    lpx_status st = lpx_dispatch(&call);
    if (st) return fail_lpx(st, "adamw_");
    lpx_call_release_rets(&call);
    return 0;
}

static int case_adamw(const char *name)
{
    adamw_ctx c;
    memset(&c, 0, sizeof c);
    TRY_LPX("lpx_op_find(adamw_)", lpx_op_find("adamw_", &c.op));
    int64_t per = g_quick ? (int64_t)1 << 16 : (int64_t)1 << 22;  /* 16 MiB of f32 each */
    int64_t shape[1] = {per};
    float *h = malloc((size_t)per * sizeof *h);
    if (!h) {
        snprintf(g_err, sizeof g_err, "out of host memory");
        return 1;
    }
    int r = 0;
    for (int l = 0; l < 4 && !r; l++) {
        if (l == 0 || l == 1) fill_f32(h, (size_t)per, 51 + (uint64_t)l);
        else if (l == 2) memset(h, 0, (size_t)per * sizeof *h);
        if (l == 3)  /* exp_avg_sq >= 0 */
            for (int64_t k = 0; k < per; k++) h[k] = 1e-4f;
        for (int t = 0; t < ADAMW_TENSORS && !r; t++) r = upload(h, LPX_F32, 1, shape, &c.lists[l][t]);
    }
    free(h);
    if (r) return 1;
    double med, mn;
    if (time_reps(rep_adamw, &c, &med, &mn)) return 1;
    double pbytes = (double)per * 4 * ADAMW_TENSORS;
    char desc[160];
    snprintf(desc, sizeof desc, "adamw_ %d f32 params x %.3g MiB (%.4g MiB), p r+w, g r, m r+w, v r+w", ADAMW_TENSORS,
             (double)per * 4 / MIB, pbytes / MIB);
    report(name, desc, med, mn, 7.0 * pbytes, 0);
    return 0;
}

/* (e2) adamw_state_: AdamW over block-quantized states (issue 37) on one
 * Llama-sized parameter, bf16 with stochastic rounding (the master of a
 * bf16 run), bf16 grads, the format's default block; two sets of tensors
 * rotated (each over the 50 MB L2). Bytes per element: p r+w 4, g r 2,
 * then m and v read and written: 8-bit 1 + 1 each, 4-bit 0.5 + 0.5 each,
 * fp8 m 1 + 1 and v (f16) 2 + 2; plus each block's two f32 scales read
 * and written. */
#define AS_SETS 2

typedef struct astate_ctx {
    int format;
    int64_t block;
    lpx_tensor *t[AS_SETS][6]; /* params, grads, m, m_scale, v, v_scale */
} astate_ctx;

static int rep_astate(void *p, int i)
{
    astate_ctx *c = p;
    lpx_tensor **t = c->t[i % AS_SETS];
    lpx_status st = lpx_adamw_state_(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], 1, (lpx_optim_state_format)c->format,
                                     c->block, 1e-3, 0.9, 0.999, 1e-8, 0.01, i + 1, LPX_OPTIM_MASTER_BF16_SR, 1234, 0,
                                     0, NULL);
    return st ? fail_lpx(st, "adamw_state_") : 0;
}

static int case_adamw_state(const char *name, int format)
{
    static const char *fname[3] = {"8-bit", "4-bit", "fp8 (e4m3 m, f16 v)"};
    astate_ctx c;
    memset(&c, 0, sizeof c);
    c.format = format;
    c.block = format == LPX_OPTIM_STATE_4BIT ? 128 : 256;
    const int64_t rows = g_quick ? 256 : 4096, cols = 14336, n = rows * cols, nb = n / c.block;
    const int64_t cb = format == LPX_OPTIM_STATE_4BIT ? n / 2 : n; /* code bytes per moment */
    int64_t s_p[1] = {n}, s_c[1] = {cb}, s_s[1] = {nb};
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!h) {
        snprintf(g_err, sizeof g_err, "out of host memory");
        return 1;
    }
    int r = 0;
    for (int k = 0; k < AS_SETS && !r; k++) {
        fill_bf16(h, (size_t)n, 61 + (uint64_t)k);
        r = upload(h, LPX_BF16, 1, s_p, &c.t[k][0]);
        if (!r) {
            fill_bf16(h, (size_t)n, 71 + (uint64_t)k);
            r = upload(h, LPX_BF16, 1, s_p, &c.t[k][1]);
        }
        /* codes: a mid-range byte pattern (the work per element does not
         * depend on the values); scales 1e-3 (m) and 1e-6 (v) */
        if (!r) r = upload_const(100, LPX_U8, 1, s_c, &c.t[k][2]);
        if (!r) r = upload_const(1e-3, LPX_F32, 1, s_s, &c.t[k][3]);
        if (!r) r = format == LPX_OPTIM_STATE_FP8 ? upload_const(1000, LPX_F16, 1, s_p, &c.t[k][4])
                                                  : upload_const(100, LPX_U8, 1, s_c, &c.t[k][4]);
        if (!r) r = upload_const(1e-6, LPX_F32, 1, s_s, &c.t[k][5]);
    }
    free(h);
    if (r) return 1;
    double med, mn;
    if (time_reps(rep_astate, &c, &med, &mn)) return 1;
    double state = format == LPX_OPTIM_STATE_8BIT ? 4.0 : format == LPX_OPTIM_STATE_4BIT ? 2.0 : 6.0;
    double bytes = (double)n * (4.0 + 2.0 + state) + (double)nb * 16.0;
    char desc[200];
    snprintf(desc, sizeof desc,
             "adamw_state_ %s, block %lld, bf16 [%lld, %lld] (bf16-SR master) + bf16 grad, %.4g MiB moved", fname[format],
             (long long)c.block, (long long)rows, (long long)cols, bytes / MIB);
    report(name, desc, med, mn, bytes, 0);
    return 0;
}

/* (f) Float8Linear forward + backward */
typedef struct lin_ctx {
    lpx_float8_linear_recipe r;
    lpx_float8_linear_state st;
    lpx_tensor *x, *w, *g;
    bool bwd;
} lin_ctx;

static int rep_linear(void *p, int i)
{
    (void)i;
    lin_ctx *c = p;
    lpx_tensor *out = NULL, *gx = NULL, *gw = NULL;
    lpx_float8_linear_ctx *ctx = NULL;
    lpx_status st = lpx_float8_linear_forward(&c->r, &c->st, c->x, c->w, NULL, &out, &ctx, NULL);
    if (!st && c->bwd) st = lpx_float8_linear_backward(ctx, c->g, &gx, &gw, NULL, NULL);
    lpx_float8_linear_ctx_free(ctx);
    lpx_tensor_release(out);
    lpx_tensor_release(gx);
    lpx_tensor_release(gw);
    return st ? fail_lpx(st, c->bwd ? "Float8Linear forward + backward" : "Float8Linear forward") : 0;
}

/* name = float8_linear_RECIPE_KxN */
static int case_linear(const char *name)
{
    char recipe[64];
    long long K = 0, N = 0;
    const char *rs = name + strlen("float8_linear_"), *us = strrchr(name, '_');
    if (!us || us <= rs || (size_t)(us - rs) >= sizeof recipe || sscanf(us + 1, "%lldx%lld", &K, &N) != 2) {
        snprintf(g_err, sizeof g_err, "bad case name %s", name);
        return 1;
    }
    memcpy(recipe, rs, (size_t)(us - rs));
    recipe[us - rs] = 0;
    bool bf16 = !strcmp(recipe, "bf16"), fp8w = !strcmp(recipe, "tensorwise_fp8w");
    int64_t M = g_quick ? 512 : 8192;
    if (g_quick) K /= 8, N /= 8;
    lin_ctx c;
    memset(&c, 0, sizeof c);
    TRY_LPX("lpx_float8_linear_recipe_preset",
            lpx_float8_linear_recipe_preset(bf16 || fp8w ? "tensorwise" : recipe, &c.r));
    if (bf16) c.r.fprop.mode = c.r.dgrad.mode = c.r.wgrad.mode = LPX_FLOAT8_GEMM_HIGH_PRECISION;
    int64_t xs[2] = {M, K}, ws[2] = {N, K}, gs[2] = {M, N};
    size_t most = (size_t)(M * (K > N ? K : N)) > (size_t)(N * K) ? (size_t)(M * (K > N ? K : N)) : (size_t)(N * K);
    uint16_t *h = malloc(most * sizeof *h);
    if (!h) {
        snprintf(g_err, sizeof g_err, "out of host memory");
        return 1;
    }
    fill_bf16(h, (size_t)(M * K), 61);
    int r = upload(h, LPX_BF16, 2, xs, &c.x);
    if (!r) fill_bf16(h, (size_t)(N * K), 62);
    if (!r) r = upload(h, LPX_BF16, 2, ws, &c.w);
    if (!r) fill_bf16(h, (size_t)(M * N), 63);
    if (!r) r = upload(h, LPX_BF16, 2, gs, &c.g);
    free(h);
    if (r) return 1;
    if (fp8w) {
        lpx_float8_quant_opts o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.fp8 = LPX_F8E4M3FN;
        o.role = LPX_FLOAT8_ROLE_WEIGHT;
        lpx_tensor *wq = NULL;
        TRY_LPX("lpx_float8_quantize(W)", lpx_float8_quantize(c.w, &o, &wq, NULL));
        c.w = keep(wq);
    }
    TRY_LPX("lpx_float8_linear_state_init", lpx_float8_linear_state_init(&c.st, &c.r));
    double fl = 2.0 * (double)M * (double)K * (double)N;
    bool blockwise = !strcmp(recipe, "blockwise");
    char desc[200], fwd_name[128];
    snprintf(desc, sizeof desc, "Float8Linear %s, x [%lld, %lld] bf16, W [%lld, %lld]%s", recipe, (long long)M,
             (long long)K, (long long)N, (long long)K, fp8w ? " float8 e4m3" : " bf16");
    double med, mn;
    int rr = 0;
    c.bwd = false;
    if (!(rr = time_reps(rep_linear, &c, &med, &mn))) {
        snprintf(fwd_name, sizeof fwd_name, "%s_fwd", name);
        char d2[240];
        snprintf(d2, sizeof d2, "%s: forward (with a context)", desc);
        if (blockwise) note_path(LPX_CUDA_SYM_BLOCK_GEMM_PATH, "block GEMM kinds on cuBLASLt");
        report(fwd_name, d2, med, mn, 0, fl);
        c.bwd = true;
        if (!(rr = time_reps(rep_linear, &c, &med, &mn))) {
            char d3[240];
            snprintf(d3, sizeof d3, "%s: forward + backward (grad_x, grad_W)", desc);
            if (blockwise) note_path(LPX_CUDA_SYM_BLOCK_GEMM_PATH, "block GEMM kinds on cuBLASLt");
            report(name, d3, med, mn, 0, 3.0 * fl);
        }
    }
    lpx_float8_linear_state_destroy(&c.st);
    return rr;
}

/* (g) attention forward + backward at Llama-3-8B's head layout: q [B, T,
 * 32, 128], k and v [B, T, 8, 128] bf16, causal, scale 1/sqrt(128); each
 * rep is lpx_attention (out and lse) and lpx_attention_backward from its
 * own results (dq, dk, dv). FLOPs as FlashAttention counts them: causal
 * forward 2 B H T^2 D (half of 4 B H T^2 D), backward 2.5x that. Also
 * prints the forward alone as CASE_fwd. The JSON rows carry the path
 * (cuDNN's fused SDPA, or the reference kernel and why). */
typedef struct att_ctx {
    lpx_tensor *q, *k, *v, *g;
    double scale;
    bool bwd;
} att_ctx;

static int rep_attention(void *p, int i)
{
    (void)i;
    att_ctx *c = p;
    lpx_tensor *o = NULL, *l = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    lpx_status st = lpx_attention(c->q, c->k, c->v, true, c->scale, &o, &l);
    if (!st && c->bwd) st = lpx_attention_backward(c->g, c->q, c->k, c->v, o, l, true, c->scale, &dq, &dk, &dv);
    lpx_tensor *rel[] = {o, l, dq, dk, dv};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    return st ? fail_lpx(st, c->bwd ? "lpx_attention + backward" : "lpx_attention") : 0;
}

static int case_attention(const char *name)
{
    int64_t B = g_quick ? 1 : 2, T = g_quick ? 256 : 4096, H = 32, KH = 8, D = 128;
    int64_t qs[4] = {B, T, H, D}, ks[4] = {B, T, KH, D};
    att_ctx c = {.scale = 1.0 / sqrt((double)D)};
    size_t nq = (size_t)(B * T * H * D), nk = (size_t)(B * T * KH * D);
    uint16_t *h = malloc(nq * sizeof *h);
    if (!h) {
        snprintf(g_err, sizeof g_err, "out of host memory");
        return 1;
    }
    fill_bf16(h, nq, 71);
    int r = upload(h, LPX_BF16, 4, qs, &c.q);
    if (!r) fill_bf16(h, nk, 72);
    if (!r) r = upload(h, LPX_BF16, 4, ks, &c.k);
    if (!r) fill_bf16(h, nk, 73);
    if (!r) r = upload(h, LPX_BF16, 4, ks, &c.v);
    if (!r) fill_bf16(h, nq, 74);
    if (!r) r = upload(h, LPX_BF16, 4, qs, &c.g);
    free(h);
    if (r) return 1;
    double fwd = 2.0 * (double)B * (double)H * (double)T * (double)T * (double)D;
    char desc[200], fwd_name[128], d2[240];
    snprintf(desc, sizeof desc, "attention bf16 causal, q [%lld, %lld, %lld, %lld], k/v %lld heads", (long long)B,
             (long long)T, (long long)H, (long long)D, (long long)KH);
    double med, mn;
    c.bwd = false;
    if (time_reps(rep_attention, &c, &med, &mn)) return 1;
    note_path(LPX_CUDA_SYM_ATTENTION_PATH, "attention calls on cuDNN");
    snprintf(fwd_name, sizeof fwd_name, "%s_fwd", name);
    snprintf(d2, sizeof d2, "%s: forward (out, lse)", desc);
    report(fwd_name, d2, med, mn, 0, fwd);
    c.bwd = true;
    if (time_reps(rep_attention, &c, &med, &mn)) return 1;
    note_path(LPX_CUDA_SYM_ATTENTION_PATH, "attention calls on cuDNN");
    snprintf(d2, sizeof d2, "%s: forward + backward (dq, dk, dv)", desc);
    report(name, d2, med, mn, 0, 3.5 * fwd);
    return 0;
}

/* ---- the case table ------------------------------------------------- */

static int c_copy(const char *n) { return case_copy(n); }
static int c_copy_op(const char *n) { return case_copy_op(n); }
static int c_cast(const char *n) { return case_quant(n, Q_CAST); }
static int c_qstatic(const char *n) { return case_quant(n, Q_STATIC); }
static int c_qdynamic(const char *n) { return case_quant(n, Q_DYNAMIC); }
static int c_qrowwise(const char *n) { return case_quant(n, Q_ROWWISE); }
static int c_nf4(const char *n) { return case_nf4(n, 8192); }
static int c_nf4_16k(const char *n) { return case_nf4(n, 16384); }
static int c_gemm_bf16(const char *n) { return case_gemm(n, G_BF16); }
static int c_gemm_fp8t(const char *n) { return case_gemm(n, G_FP8_TENSOR); }
static int c_gemm_fp8r(const char *n) { return case_gemm(n, G_FP8_ROW); }
static int c_gemm_fp8b(const char *n) { return case_gemm(n, G_FP8_BLOCK); }
static int c_adamw(const char *n) { return case_adamw(n); }
static int c_attention(const char *n) { return case_attention(n); }
static int c_astate8(const char *n) { return case_adamw_state(n, LPX_OPTIM_STATE_8BIT); }
static int c_astate4(const char *n) { return case_adamw_state(n, LPX_OPTIM_STATE_4BIT); }
static int c_astatefp8(const char *n) { return case_adamw_state(n, LPX_OPTIM_STATE_FP8); }

static const struct {
    const char *name;
    int (*fn)(const char *);
} cases[] = {
    /* the reference and the cases with targets first, so a run cut short
     * still has them */
    {"copy", c_copy},
    {"fp8_quant_static", c_qstatic},
    {"nf4_dequant", c_nf4},
    {"gemm_bf16", c_gemm_bf16},
    {"gemm_fp8_tensorwise", c_gemm_fp8t},
    {"adamw", c_adamw},
    {"adamw_state_8bit", c_astate8},
    {"adamw_state_4bit", c_astate4},
    {"adamw_state_fp8", c_astatefp8},
    {"copy_op", c_copy_op},
    {"cast_fp8", c_cast},
    {"fp8_quant_dynamic", c_qdynamic},
    {"fp8_quant_rowwise", c_qrowwise},
    {"nf4_dequant_16k", c_nf4_16k},
    {"gemm_fp8_rowwise", c_gemm_fp8r},
    {"gemm_fp8_blockwise", c_gemm_fp8b},
    {"attention_llama3", c_attention},
#define LIN_CASES(shape)                                                                              \
    {"float8_linear_bf16_" shape, case_linear}, {"float8_linear_tensorwise_" shape, case_linear},       \
        {"float8_linear_tensorwise_fp8w_" shape, case_linear}, {"float8_linear_rowwise_" shape, case_linear}, \
        {"float8_linear_rowwise_with_gw_hp_" shape, case_linear}, {"float8_linear_delayed_" shape, case_linear}, \
        {"float8_linear_blockwise_" shape, case_linear}
    LIN_CASES("4096x14336"),
    LIN_CASES("14336x4096"),
    LIN_CASES("4096x4096"),
#undef LIN_CASES
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

static bool selected(const char *only, const char *name)
{
    if (!only) return true;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_gpu [PLUGIN] [--plugin PATH] [--json FILE] [--reps N] [--warmup N]\n"
               "                 [--batch K] [--only CASE[,CASE...]] [--list] [--quick] [--copy-gbps X]\n"
               "PLUGIN: lpx-cuda.so (default $LPX_CUDA_PLUGIN). --json appends one JSON object per case.\n");
}

static int parse_int(const char *s, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > 100000) return 1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *plugin = getenv("LPX_CUDA_PLUGIN"), *json = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--list")) {
            for (int k = 0; k < NCASES; k++) printf("%s\n", cases[k].name);
            return 0;
        } else if (!strcmp(a, "--quick")) {
            g_quick = true;
        } else if (!strcmp(a, "--plugin") && has) {
            plugin = argv[++i];
        } else if (!strcmp(a, "--json") && has) {
            json = argv[++i];
        } else if (!strcmp(a, "--only") && has) {
            only = argv[++i];
        } else if (!strcmp(a, "--reps") && has) {
            if (parse_int(argv[++i], 20, &g_reps)) {
                fprintf(stderr, "bench_gpu: --reps wants an integer >= 20\n");
                return 2;
            }
        } else if (!strcmp(a, "--copy-gbps") && has) {
            char *end;
            g_copy_gbps = strtod(argv[++i], &end);
            if (*end || !(g_copy_gbps > 0)) {
                fprintf(stderr, "bench_gpu: --copy-gbps wants a positive number\n");
                return 2;
            }
        } else if (!strcmp(a, "--batch") && has) {
            if (parse_int(argv[++i], 1, &g_batch)) {
                fprintf(stderr, "bench_gpu: --batch wants an integer >= 1\n");
                return 2;
            }
        } else if (!strcmp(a, "--warmup") && has) {
            if (parse_int(argv[++i], 1, &g_warmup)) {
                fprintf(stderr, "bench_gpu: --warmup wants an integer >= 1\n");
                return 2;
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] != '-') {
            plugin = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (only) {
        for (const char *p = only; *p;) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            bool known = false;
            for (int k = 0; k < NCASES; k++)
                if (strlen(cases[k].name) == len && !strncmp(cases[k].name, p, len)) known = true;
            if (!known) {
                fprintf(stderr, "bench_gpu: unknown case '%.*s' (--list shows them)\n", (int)len, p);
                return 2;
            }
            if (!e) break;
            p = e + 1;
        }
    }
    if (!plugin || !*plugin) {
        fprintf(stderr, "bench_gpu: no plugin: pass the path of lpx-cuda.so or set LPX_CUDA_PLUGIN\n");
        return 2;
    }
    if (lpx_init()) {
        fprintf(stderr, "bench_gpu: lpx_init failed: %s\n", lpx_last_error());
        return 2;
    }
    const lpx_plugin *p = NULL;
    if (lpx_plugin_load(plugin, &p)) {
        const char *why = lpx_last_error();
        fprintf(stderr, "bench_gpu: %s\n", why);
        return strstr(why, "declined") ? 77 : 2;
    }
    g_plugin = p;
    lpx_cuda_stream_fn stream_fn = (lpx_cuda_stream_fn)lpx_plugin_symbol(p, LPX_CUDA_SYM_STREAM);
    g_sync = (lpx_cuda_sync_fn)lpx_plugin_symbol(p, LPX_CUDA_SYM_SYNC);
    if (!stream_fn || !g_sync) {
        fprintf(stderr, "bench_gpu: %s does not export %s / %s\n", plugin, LPX_CUDA_SYM_STREAM, LPX_CUDA_SYM_SYNC);
        return 2;
    }
    g_stream = (cudaStream_t)stream_fn(0);
    cudaError_t e = cudaSetDevice(0);
    if (!g_stream || e != cudaSuccess) {
        fprintf(stderr, "bench_gpu: no stream for device 0 (%s)\n", cudaGetErrorName(e));
        return 2;
    }
    if (json && !(g_json = fopen(json, "a"))) {
        fprintf(stderr, "bench_gpu: cannot open %s: %s\n", json, strerror(errno));
        return 2;
    }
    struct cudaDeviceProp prop;
    /* the header once per run.sh sweep: later processes get --copy-gbps */
    if (g_copy_gbps == 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("# bench_gpu: %s, %d SMs, %.1f GiB, %d samples of %d reps (median), %d warm-up%s\n", prop.name,
               prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * MIB), g_reps, g_batch, g_warmup,
               g_quick ? ", --quick sizes" : "");
    for (int k = 0; k < NCASES; k++) {
        if (!selected(only, cases[k].name)) continue;
        g_err[0] = 0;
        g_path[0] = 0;
        int r = cases[k].fn(cases[k].name);
        release_all();
        if (r) {
            report_error(cases[k].name, g_err[0] ? g_err : "failed");
            g_failed++;
            (void)cudaGetLastError();  /* a non-sticky error must not fail the next case */
        }
        /* free the cached blocks of this case before the next one */
        lpx_cuda_mem_trim_fn trim = (lpx_cuda_mem_trim_fn)lpx_plugin_symbol(p, LPX_CUDA_SYM_MEM_TRIM);
        if (trim) (void)trim(0);
    }
    if (g_json) fclose(g_json);
    return g_failed ? 1 : 0;
}
