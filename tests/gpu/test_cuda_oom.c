/* GPU suite: cuda_oom, the device-memory OOM sweep (docs/RELIABILITY.md).
 *
 * The host sweep (tests/test_oom.c) fails lpx's own allocations; this one
 * fails the device allocations of lpx-cuda.so through its test hook
 * lpx_cuda_fail_alloc_after. Each case sweeps one GPU entry point: attempt
 * n runs the call with its (n+1)-th device allocation failing (and every
 * later one), n = 0, 1, 2, ... until the call succeeds. Every failing
 * attempt must
 *   - return LPX_ENOMEM (every allocation site of the plugin maps a refused
 *     allocation to it: lpx_tensor_new's "cuda cannot allocate", the
 *     scratch sites' "cannot allocate ...", cu_fail for a real
 *     cudaErrorMemoryAllocation) with a message naming the op,
 *   - have been caused by the injection (failed_allocs went up),
 *   - leave its outputs NULL (and an in-place op's tensors untouched),
 *   - leak nothing: after releasing everything and lpx_cuda_sync the
 *     allocator's bytes_in_use is back at the case's baseline.
 * The attempt that succeeds must give the same bits as a run without
 * injection. Inputs are set up before the baseline, with the hook off;
 * device caches that outlive a call (the cuBLASLt workspace) are filled by
 * the first successful GEMM only, so they never show up as a leak of a
 * failing attempt. Prints one line per case and a total. Host allocations
 * inside these calls are the host sweep's business. Skips (77) without a
 * GPU. */
#include <stdint.h>
#include "gpu_util.h"

#define MAXR 8           /* results compared per case */
#define MAX_ATTEMPTS 64  /* a call that still fails after this many is a bug */
#define MAXIN 4096       /* inputs of one case */

static lpx_cuda_fail_alloc_after_fn fail_after;
static lpx_cuda_mem_stats_fn mem_stats;
static lpx_cuda_sync_fn cuda_sync;

/* ---- per-case inputs ----------------------------------------------------- */

static lpx_tensor *in[MAXIN];
static int nin;

/* Keeps t as an input of the current case (released after the case). */
static lpx_tensor *keep(lpx_tensor *t)
{
    if (!t) printf("  setup failed: %s\n", lpx_last_error());
    if (nin < MAXIN) in[nin++] = t;
    return t;
}

static void release_inputs(void)
{
    for (int i = 0; i < nin; i++) lpx_tensor_release(in[i]);
    nin = 0;
}

/* Random tensor of dtype dt made on the CPU and moved to the GPU. */
static lpx_tensor *up_randn(lpx_dtype dt, int nd, const int64_t *shape, uint64_t seed, double scale)
{
    lpx_tensor *c = rand_normal(nd, shape, seed, scale, dt), *g = c ? gpu_up(c) : NULL;
    lpx_tensor_release(c);
    return keep(g);
}

/* ---- the cases ------------------------------------------------------------- */

/* A case: setup() makes the inputs (kept with keep()); call() runs the
 * entry point once and stores its results (new references, NULL where
 * there are none) in r. prepare()/unprepare(), when set, run around each
 * call with the hook off (in-place ops get fresh copies of their tensors
 * there); unchanged() checks, after a failing attempt, that an in-place op
 * left its tensors as they were. */
typedef struct ocase {
    const char *label;
    const char *needle; /* the failing call's message must contain it */
    void (*setup)(void);
    lpx_status (*call)(lpx_tensor *r[MAXR]);
    void (*prepare)(void);
    void (*unprepare)(void);
    bool (*unchanged)(void);
} ocase;

/* lpx_tensor_to: CPU -> GPU */
static lpx_tensor *to_src;
static void s_to(void)
{
    const int64_t sh[2] = {33, 65};
    to_src = keep(rand_normal(2, sh, 1, 1.0, LPX_BF16));
}
static lpx_status c_to(lpx_tensor *r[MAXR]) { return lpx_tensor_to(to_src, gpu_dev(), &r[0]); }

/* lpx_contiguous of a transposed CUDA tensor */
static lpx_tensor *ct_x;
static void s_contiguous(void)
{
    const int64_t sh[3] = {4, 6, 5};
    lpx_tensor *x = up_randn(LPX_F32, 3, sh, 2, 1.0), *t = NULL;
    if (x && lpx_transpose(x, 0, 2, &t)) t = NULL;
    ct_x = keep(t);
}
static lpx_status c_contiguous(lpx_tensor *r[MAXR]) { return lpx_contiguous(ct_x, &r[0]); }

/* lpx_cast bf16 -> f8e4m3fn */
static lpx_tensor *cast_x;
static void s_cast(void)
{
    const int64_t sh[2] = {64, 33};
    cast_x = up_randn(LPX_BF16, 2, sh, 3, 4.0);
}
static lpx_status c_cast(lpx_tensor *r[MAXR]) { return lpx_cast(cast_x, LPX_F8E4M3FN, true, &r[0]); }

/* lpx_add with broadcasting: [7, 1, 5] + [4, 1] */
static lpx_tensor *add_a, *add_b;
static void s_add(void)
{
    const int64_t sa[3] = {7, 1, 5}, sb[2] = {4, 1};
    add_a = up_randn(LPX_F32, 3, sa, 4, 1.0);
    add_b = up_randn(LPX_F32, 2, sb, 5, 1.0);
}
static lpx_status c_add(lpx_tensor *r[MAXR]) { return lpx_add(add_a, add_b, &r[0]); }

/* lpx_sum over a dim: few outputs, long rows (split reduction: device
 * scratch for the partial sums) */
static lpx_tensor *sum_x;
static void s_sum(void)
{
    const int64_t sh[2] = {8, 65536};
    sum_x = up_randn(LPX_F32, 2, sh, 6, 1.0);
}
static lpx_status c_sum(lpx_tensor *r[MAXR])
{
    const int64_t dim = 1;
    return lpx_sum(sum_x, 1, &dim, false, &r[0]);
}

/* fp8_quantize, dynamic: tensorwise and rowwise */
static lpx_tensor *q_x;
static void s_quant(void)
{
    const int64_t sh[2] = {48, 200};
    q_x = up_randn(LPX_BF16, 2, sh, 7, 2.0);
}
static lpx_status c_quant_tw(lpx_tensor *r[MAXR])
{
    return lpx_fp8_quantize(q_x, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]);
}
static lpx_status c_quant_rw(lpx_tensor *r[MAXR])
{
    const int64_t dim = 1;
    return lpx_fp8_quantize(q_x, NULL, LPX_F8E4M3FN, &dim, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]);
}

/* fp8_scaled_mm, rowwise, odd shapes (K and N padded: packing scratch),
 * b the transposed view of a quantized [N, K] weight */
static lpx_tensor *mm_qa, *mm_sa, *mm_qb, *mm_sb;
static void s_scaled_mm(void)
{
    const int64_t xs[2] = {17, 33}, ws[2] = {65, 33}, d1 = 1;
    lpx_tensor *x = up_randn(LPX_BF16, 2, xs, 8, 1.0), *w = up_randn(LPX_BF16, 2, ws, 9, 0.5);
    lpx_tensor *qw = NULL, *sw = NULL;
    mm_qa = mm_sa = mm_qb = mm_sb = NULL;
    if (!x || !w || lpx_fp8_quantize(x, NULL, LPX_F8E4M3FN, &d1, false, 0, true, &mm_qa, NULL, &mm_sa, NULL) ||
        lpx_fp8_quantize(w, NULL, LPX_F8E4M3FN, &d1, false, 0, true, &qw, NULL, &sw, NULL) || lpx_t(qw, &mm_qb) ||
        lpx_t(sw, &mm_sb))
        printf("  setup failed: %s\n", lpx_last_error());
    keep(mm_qa);
    keep(mm_sa);
    keep(qw);
    keep(sw);
    keep(mm_qb);
    keep(mm_sb);
}
static lpx_status c_scaled_mm(lpx_tensor *r[MAXR])
{
    return lpx_fp8_scaled_mm(mm_qa, mm_sa, mm_qb, mm_sb, NULL, LPX_BF16, &r[0]);
}

/* nf4_quantize and nf4_dequantize (the nf4 kind over CUDA inner tensors) */
static lpx_tensor *nf4_x, *nf4_w;
static void s_nf4(void)
{
    const int64_t sh[2] = {96, 200}; /* 19200: a padded tail */
    nf4_x = up_randn(LPX_BF16, 2, sh, 10, 1.0);
    nf4_w = NULL;
    if (!nf4_x || lpx_nf4_quantize(nf4_x, NULL, &nf4_w)) printf("  setup failed: %s\n", lpx_last_error());
    keep(nf4_w);
}
static lpx_status c_nf4_quantize(lpx_tensor *r[MAXR])
{
    lpx_tensor *w = NULL;
    lpx_status st = lpx_nf4_quantize(nf4_x, NULL, &w);
    if (st) {
        r[0] = w; /* must be NULL: checked by the sweep */
        return st;
    }
    /* the results compared: the inner tensors (codes, scalers, ...) */
    int n = lpx_tensor_inner_count(w);
    for (int i = 0; i < n && i < MAXR; i++) {
        r[i] = lpx_tensor_inner(w, i);
        lpx_tensor_retain(r[i]);
    }
    lpx_tensor_release(w);
    return LPX_OK;
}
static lpx_status c_nf4_dequantize(lpx_tensor *r[MAXR]) { return lpx_nf4_dequantize(nf4_w, LPX_BF16, &r[0]); }

/* lpx_matmul bf16: the result, then the cuBLASLt workspace (allocated by
 * the first GEMM of the process) */
static lpx_tensor *mat_a, *mat_b;
static void s_matmul(void)
{
    const int64_t sa[2] = {64, 96}, sb[2] = {96, 80};
    mat_a = up_randn(LPX_BF16, 2, sa, 11, 1.0);
    mat_b = up_randn(LPX_BF16, 2, sb, 12, 1.0);
}
static lpx_status c_matmul(lpx_tensor *r[MAXR]) { return lpx_matmul(mat_a, mat_b, &r[0]); }

/* lpx_rmsnorm: y and rstd */
static lpx_tensor *rms_x, *rms_w;
static void s_rmsnorm(void)
{
    const int64_t sx[2] = {16, 256}, sw = 256;
    rms_x = up_randn(LPX_BF16, 2, sx, 13, 1.0);
    rms_w = up_randn(LPX_BF16, 1, &sw, 14, 1.0);
}
static lpx_status c_rmsnorm(lpx_tensor *r[MAXR]) { return lpx_rmsnorm(rms_x, rms_w, 1e-6, &r[0], &r[1]); }

/* lpx_cross_entropy: the loss, then the device accumulators. bf16 logits:
 * the double sum is order-dependent (atomics) in its last bits, the bf16
 * loss is not. */
static lpx_tensor *ce_logits, *ce_target;
static void s_cross_entropy(void)
{
    const int64_t sl[2] = {8, 50}, n = 8;
    ce_logits = up_randn(LPX_BF16, 2, sl, 15, 1.0);
    lpx_tensor *t = NULL, *g = NULL;
    if (lpx_tensor_new(LPX_I64, 1, &n, lpx_cpu(), &t) == LPX_OK) {
        int64_t *p = lpx_tensor_data(t);
        for (int i = 0; i < 8; i++) p[i] = (i * 7) % 50;
        p[3] = -100; /* ignored */
        g = gpu_up(t);
    }
    lpx_tensor_release(t);
    ce_target = keep(g);
}
static lpx_status c_cross_entropy(lpx_tensor *r[MAXR]) { return lpx_cross_entropy(ce_logits, ce_target, -100, &r[0]); }

/* lpx_adamw_ (in place): the pristine state is kept; each attempt steps
 * fresh copies. 3 tensors: the table travels as a kernel parameter (no
 * device allocation); 601 tensors: the table goes to device scratch. */
#define AW_MAXN 601
static int aw_n;
static lpx_tensor *aw_p0[AW_MAXN], *aw_g[AW_MAXN], *aw_m0[AW_MAXN], *aw_v0[AW_MAXN];
static lpx_tensor *aw_p[AW_MAXN], *aw_m[AW_MAXN], *aw_v[AW_MAXN];
static void s_adamw_n(int n)
{
    aw_n = n;
    for (int i = 0; i < n; i++) {
        int64_t len = 3 + i % 5 + (i < 3 ? 1000 * (i + 1) : 0);
        aw_p0[i] = up_randn(LPX_BF16, 1, &len, 100 + (uint64_t)i, 1.0);
        aw_g[i] = up_randn(LPX_BF16, 1, &len, 5000 + (uint64_t)i, 0.1);
        aw_m0[i] = up_randn(LPX_F32, 1, &len, 9000 + (uint64_t)i, 0.01);
        lpx_tensor *v = rand_normal(1, &len, 13000 + (uint64_t)i, 0.01, LPX_F32), *v2 = NULL, *g = NULL;
        if (v && !lpx_mul(v, v, &v2)) g = gpu_up(v2); /* non-negative */
        lpx_tensor_release(v);
        lpx_tensor_release(v2);
        aw_v0[i] = keep(g);
    }
}
static void s_adamw3(void) { s_adamw_n(3); }
static void s_adamw601(void) { s_adamw_n(AW_MAXN); }
static void p_adamw(void)
{
    for (int i = 0; i < aw_n; i++)
        if (lpx_clone(aw_p0[i], &aw_p[i]) || lpx_clone(aw_m0[i], &aw_m[i]) || lpx_clone(aw_v0[i], &aw_v[i]))
            printf("  clone failed: %s\n", lpx_last_error());
}
static void u_adamw(void)
{
    for (int i = 0; i < aw_n; i++) {
        lpx_tensor_release(aw_p[i]);
        lpx_tensor_release(aw_m[i]);
        lpx_tensor_release(aw_v[i]);
        aw_p[i] = aw_m[i] = aw_v[i] = NULL;
    }
}
/* Device tensors a and b hold the same bits. */
static bool same_dev_bits(const char *what, lpx_tensor *a, lpx_tensor *b)
{
    lpx_tensor *ac = gpu_down(a);
    bool ok = ac && gpu_same_bits(what, ac, b);
    lpx_tensor_release(ac);
    return ok;
}
static bool n_adamw(void)
{
    bool ok = true;
    for (int i = 0; i < aw_n && ok; i++)
        ok = same_dev_bits("param", aw_p0[i], aw_p[i]) && same_dev_bits("exp_avg", aw_m0[i], aw_m[i]) &&
             same_dev_bits("exp_avg_sq", aw_v0[i], aw_v[i]);
    return ok;
}
static lpx_status c_adamw(lpx_tensor *r[MAXR])
{
    lpx_status st = lpx_adamw_(aw_p, aw_g, aw_m, aw_v, aw_n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3);
    if (st) return st;
    /* compared: the first tensors' new state */
    for (int i = 0; i < 2; i++) {
        r[3 * i] = aw_p[i];
        r[3 * i + 1] = aw_m[i];
        r[3 * i + 2] = aw_v[i];
        lpx_tensor_retain(aw_p[i]);
        lpx_tensor_retain(aw_m[i]);
        lpx_tensor_retain(aw_v[i]);
    }
    return LPX_OK;
}

/* lpx_cat of CUDA tensors (one of them a strided slice) */
static lpx_tensor *cat_xs[3];
static void s_cat(void)
{
    const int64_t s0[2] = {5, 7}, s1[2] = {5, 3}, s2[2] = {5, 12};
    cat_xs[0] = up_randn(LPX_F16, 2, s0, 16, 1.0);
    cat_xs[1] = up_randn(LPX_F16, 2, s1, 17, 1.0);
    lpx_tensor *b = up_randn(LPX_F16, 2, s2, 18, 1.0), *sl = NULL;
    if (b && lpx_slice(b, 1, 1, 12, 2, &sl)) sl = NULL;
    cat_xs[2] = keep(sl);
}
static lpx_status c_cat(lpx_tensor *r[MAXR]) { return lpx_cat(cat_xs, 3, 1, &r[0]); }

static const ocase cases[] = {
    {"lpx_tensor_to cpu -> cuda", "lpx_tensor_to", s_to, c_to, NULL, NULL, NULL},
    {"lpx_contiguous (transposed)", "contiguous", s_contiguous, c_contiguous, NULL, NULL, NULL},
    {"lpx_cast bf16 -> f8e4m3fn", "cast", s_cast, c_cast, NULL, NULL, NULL},
    {"lpx_add (broadcast)", "add", s_add, c_add, NULL, NULL, NULL},
    {"lpx_sum (dim 1, split)", "sum", s_sum, c_sum, NULL, NULL, NULL},
    {"lpx_fp8_quantize (dynamic, tensorwise)", "fp8_quantize", s_quant, c_quant_tw, NULL, NULL, NULL},
    {"lpx_fp8_quantize (dynamic, rowwise)", "fp8_quantize", s_quant, c_quant_rw, NULL, NULL, NULL},
    /* the first GEMM of the process: also the cuBLASLt workspace */
    {"lpx_matmul bf16", "matmul", s_matmul, c_matmul, NULL, NULL, NULL},
    {"lpx_fp8_scaled_mm (rowwise, padded)", "fp8_scaled_mm", s_scaled_mm, c_scaled_mm, NULL, NULL, NULL},
    {"lpx_nf4_quantize", "nf4_quantize", s_nf4, c_nf4_quantize, NULL, NULL, NULL},
    {"lpx_nf4_dequantize", "nf4_dequantize", s_nf4, c_nf4_dequantize, NULL, NULL, NULL},
    {"lpx_rmsnorm", "rmsnorm", s_rmsnorm, c_rmsnorm, NULL, NULL, NULL},
    {"lpx_cross_entropy", "cross_entropy", s_cross_entropy, c_cross_entropy, NULL, NULL, NULL},
    {"lpx_adamw_ (3 tensors)", "adamw_", s_adamw3, c_adamw, p_adamw, u_adamw, n_adamw},
    {"lpx_adamw_ (601 tensors: device table)", "adamw_", s_adamw601, c_adamw, p_adamw, u_adamw, n_adamw},
    {"lpx_cat", "cat", s_cat, c_cat, NULL, NULL, NULL},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

/* ---- the sweep ------------------------------------------------------------- */

static long total_injected;
static int64_t total_leaked;

static bool stats_now(lpx_cuda_mem_stats *s)
{
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    lpx_status st = cuda_sync(0);
    if (!st) st = mem_stats(0, s);
    if (st) printf("  sync / stats failed: %s\n", lpx_last_error());
    return st == LPX_OK;
}

static void release_r(lpx_tensor *r[MAXR])
{
    for (int i = 0; i < MAXR; i++) {
        lpx_tensor_release(r[i]);
        r[i] = NULL;
    }
}

static void sweep(const ocase *k)
{
    check_flush_outside(check_cases_run ? "between cases" : "before the first case");
    if (check_rest_skip) { /* no GPU: the case is counted as skipped */
        check_cases_run++;
        check_count_skip(k->label, check_rest_skip, check_rest_skip_why);
        return;
    }
    k->setup();
    bool setup_ok = true;
    for (int i = 0; i < nin; i++) setup_ok = setup_ok && in[i];
    CHECKF(setup_ok, "%s: setup failed", k->label);
    lpx_cuda_mem_stats base, now;
    long injected = 0;
    if (setup_ok && stats_now(&base)) {
        lpx_tensor *r[MAXR] = {NULL};
        uint64_t failed_before = base.failed_allocs;
        bool done = false;
        for (int64_t n = 0; n < MAX_ATTEMPTS && !done; n++) {
            if (k->prepare) k->prepare();
            fail_after(n);
            lpx_status st = k->call(r);
            fail_after(-1);
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", lpx_last_error());
            if (st == LPX_OK) {
                done = true;
                break;
            }
            injected++;
            CHECKF(st == LPX_ENOMEM, "%s, attempt %lld: %s (%s), expected LPX_ENOMEM", k->label, (long long)n,
                   lpx_status_string(st), msg);
            CHECKF(strstr(msg, k->needle) != NULL, "%s, attempt %lld: the message does not name '%s': %s", k->label,
                   (long long)n, k->needle, msg);
            bool nulls = true;
            for (int i = 0; i < MAXR; i++) nulls = nulls && !r[i];
            CHECKF(nulls, "%s, attempt %lld: a failing call left an output set", k->label, (long long)n);
            release_r(r);
            if (k->unchanged) CHECKF(k->unchanged(), "%s, attempt %lld: a failing in-place call changed its tensors",
                                     k->label, (long long)n);
            if (k->unprepare) k->unprepare();
            if (!stats_now(&now)) break;
            CHECKF(now.failed_allocs > failed_before, "%s, attempt %lld: failed without a refused device allocation "
                   "(%s)", k->label, (long long)n, msg);
            failed_before = now.failed_allocs;
            if (now.bytes_in_use != base.bytes_in_use) {
                int64_t d = (int64_t)(now.bytes_in_use - base.bytes_in_use);
                total_leaked += d;
                CHECKF(false, "%s, attempt %lld: %lld device bytes leaked (in use %llu, baseline %llu)", k->label,
                       (long long)n, (long long)d, (unsigned long long)now.bytes_in_use,
                       (unsigned long long)base.bytes_in_use);
            }
        }
        CHECKF(done, "%s: still failing after %d attempts with injection", k->label, MAX_ATTEMPTS);
        if (done) {
            /* the same call without injection: the same bits */
            lpx_tensor *got[MAXR];
            memcpy(got, r, sizeof got);
            memset(r, 0, sizeof *r * MAXR);
            if (k->unprepare) k->unprepare();
            if (k->prepare) k->prepare();
            lpx_status st = k->call(r);
            CHECKF(st == LPX_OK, "%s: the run without injection failed: %s", k->label, lpx_last_error());
            for (int i = 0; st == LPX_OK && i < MAXR; i++) {
                CHECKF((got[i] == NULL) == (r[i] == NULL), "%s: result %d present in one run only", k->label, i);
                if (got[i] && r[i]) {
                    lpx_tensor *gc = gpu_down(got[i]);
                    char what[160];
                    snprintf(what, sizeof what, "%s result %d", k->label, i);
                    CHECKF(gc && gpu_same_bits(what, gc, r[i]), "%s: result %d differs from the run without "
                           "injection", k->label, i);
                    lpx_tensor_release(gc);
                }
            }
            release_r(got);
            release_r(r);
            if (k->unprepare) k->unprepare();
        }
    }
    release_inputs();
    total_injected += injected;
    check_cases_run++;
    printf("%s %-44s %3ld injected failure%s\n", check_case_failures ? "FAIL" : "ok  ", k->label, injected,
           injected == 1 ? "" : "s");
    if (check_case_failures) check_total_failures++;
    check_case_failures = 0;
    fflush(stdout);
}

int main(void)
{
    if (!gpu_setup()) {
        for (int i = 0; i < NCASES; i++) sweep(&cases[i]);
        return CHECK_DONE();
    }
    fail_after = (lpx_cuda_fail_alloc_after_fn)lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_FAIL_ALLOC_AFTER);
    mem_stats = (lpx_cuda_mem_stats_fn)lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_MEM_STATS);
    cuda_sync = (lpx_cuda_sync_fn)lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_SYNC);
    if (!fail_after || !mem_stats || !cuda_sync) {
        printf("lpx-cuda.so lacks %s, %s or %s\n", LPX_CUDA_SYM_FAIL_ALLOC_AFTER, LPX_CUDA_SYM_MEM_STATS,
               LPX_CUDA_SYM_SYNC);
        return 1;
    }
    for (int i = 0; i < NCASES; i++) sweep(&cases[i]);
    printf("cuda oom: %d entry points, %ld injected failures, %lld leaked device bytes\n", NCASES, total_injected,
           (long long)total_leaked);
    return CHECK_DONE();
}
