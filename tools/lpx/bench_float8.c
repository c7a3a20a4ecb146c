/* `lpx bench float8`: what fp8 costs on the CPU backend, side by side with
 * the plain f32 operation of the same size, in one run.
 *
 *   quantize      the fused quantize (amax + scale + cast + statistics) of
 *                 an f32 (or bf16) tensor vs memcpy of the same input
 *                 bytes, single thread. Goal: >= 0.5x memcpy throughput,
 *                 i.e. time <= 2x memcpy.
 *   scaled_mm     fp8 GEMM (tile decode + sgemm + scale epilogue) vs f32
 *                 sgemm (lpx_matmul) of the same shape. Goal: <= 1.3x.
 *   linear        Float8Linear forward + backward (tensorwise / rowwise
 *                 presets) vs f32 linear forward + backward (linear,
 *                 two matmuls, bias sum).
 *
 * Each pair is timed interleaved (A, B, A, B, ...), and the medians are
 * reported, so load on a shared machine hits both sides alike. GEMMs use
 * the BLAS library's own threading on both sides. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"
#include "bench_report.h"
#include "commands.h"

typedef int (*op_fn)(void *ctx);

typedef struct pair_result {
    double a_ns, b_ns;   /* median ns per call */
} pair_result;

/* Times a and b interleaved: each rep runs a batch of a then a batch of b
 * (batches sized to about target_ms), after a warm-up. */
static int time_pair(op_fn a, op_fn b, void *ctx, int reps, double target_ms, pair_result *out)
{
    op_fn fns[2] = {a, b};
    int64_t batch[2];
    for (int k = 0; k < 2; k++) {
        uint64_t t0 = lpx_now_ns();
        if (fns[k](ctx)) return 1;     /* warm-up and calibration */
        if (fns[k](ctx)) return 1;
        double per = (double)(lpx_now_ns() - t0) / 2.0;
        batch[k] = (int64_t)(target_ms * 1e6 / (per > 1 ? per : 1));
        if (batch[k] < 1) batch[k] = 1;
        if (batch[k] > 1000000) batch[k] = 1000000;
    }
    double *v = malloc(2 * (size_t)reps * sizeof *v);
    if (!v) return 1;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            uint64_t t0 = lpx_now_ns();
            for (int64_t i = 0; i < batch[k]; i++)
                if (fns[k](ctx)) {
                    free(v);
                    return 1;
                }
            v[k * reps + r] = (double)(lpx_now_ns() - t0) / (double)batch[k];
        }
    out->a_ns = lpx_bench_median(v, reps);
    out->b_ns = lpx_bench_median(v + reps, reps);
    free(v);
    return 0;
}

static void fail(const char *what)
{
    fprintf(stderr, "lpx bench float8: %s failed: %s\n", what, lpx_last_error());
}

/* ---- quantize vs memcpy ------------------------------------------- */

typedef struct qctx {
    lpx_tensor *x;
    lpx_float8_quant_opts o;
    void *dst;
    size_t bytes;
} qctx;

static int q_run(void *p)
{
    qctx *c = p;
    lpx_tensor *q = NULL;
    if (lpx_float8_quantize(c->x, &c->o, &q, NULL)) return 1;
    lpx_tensor_release(q);
    return 0;
}

static volatile unsigned char sink;

static int q_memcpy(void *p)
{
    qctx *c = p;
    memcpy(c->dst, lpx_tensor_data(c->x), c->bytes);
    sink = ((unsigned char *)c->dst)[c->bytes / 2];   /* keep the copy observable */
    return 0;
}

static int bench_quantize(lpx_bench_report *rep, const char *name, int64_t rows, int64_t cols, lpx_dtype dt,
                          int gran, bool static_scale, int reps)
{
    int64_t shape[2] = {rows, cols};
    qctx c;
    memset(&c, 0, sizeof c);
    lpx_tensor *x0 = NULL, *scale = NULL;
    if (lpx_randn(2, shape, 7, LPX_F32, lpx_cpu(), &x0) || lpx_cast(x0, dt, false, &c.x)) {
        fail("randn");
        lpx_tensor_release(x0);
        return 1;
    }
    lpx_tensor_release(x0);
    c.o.struct_size = sizeof c.o;
    c.o.granularity = gran;
    c.o.axis = -1;
    if (static_scale) {
        if (lpx_full(0, NULL, 64.0, LPX_F32, lpx_cpu(), &scale)) {
            lpx_tensor_release(c.x);
            return 1;
        }
        c.o.scale = scale;
    }
    c.bytes = (size_t)(rows * cols) * (dt == LPX_F32 ? 4u : 2u);
    c.dst = malloc(c.bytes);
    int rc = 1;
    pair_result r;
    if (c.dst) {
        memset(c.dst, 1, c.bytes);
        rc = time_pair(q_run, q_memcpy, &c, reps, 20.0, &r);
    }
    if (!rc) {
        char note[160];
        double gbq = (double)c.bytes / r.a_ns, gbm = (double)c.bytes / r.b_ns;
        snprintf(note, sizeof note, "%.2f GB/s vs memcpy %.2f GB/s: %.2fx memcpy throughput", gbq, gbm, gbq / gbm);
        lpx_bench_row row = {name, r.a_ns / 1e6, "ms", r.b_ns / 1e6, "memcpy", lpx_bench_na(), NULL,
                             2.0 * r.b_ns / 1e6, note};
        lpx_bench_report_add(rep, &row);
    } else {
        fail(name);
    }
    free(c.dst);
    lpx_tensor_release(scale);
    lpx_tensor_release(c.x);
    return rc;
}

/* ---- scaled_mm vs sgemm ---------------------------------------------- */

typedef struct mctx {
    lpx_tensor *a8, *b8, *a, *b;
    lpx_dtype out;
} mctx;

static int mm_fp8(void *p)
{
    mctx *c = p;
    lpx_tensor *r = NULL;
    if (lpx_float8_mm(c->a8, c->b8, NULL, c->out, &r)) return 1;
    lpx_tensor_release(r);
    return 0;
}

static int mm_f32(void *p)
{
    mctx *c = p;
    lpx_tensor *r = NULL;
    if (lpx_matmul(c->a, c->b, &r)) return 1;
    lpx_tensor_release(r);
    return 0;
}

static int bench_mm(lpx_bench_report *rep, const char *name, int64_t M, int64_t N, int64_t K, int gran, lpx_dtype out,
                    int reps)
{
    int64_t sa[2] = {M, K}, sbt[2] = {N, K};
    mctx c;
    memset(&c, 0, sizeof c);
    c.out = out;
    lpx_tensor *bt = NULL, *b8t = NULL;
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.granularity = gran;
    o.axis = -1;
    int rc = 1;
    /* b as the transpose of a row-major [N, K] weight: the layout of
     * x @ W^T, the common case */
    if (!lpx_randn(2, sa, 1, LPX_F32, lpx_cpu(), &c.a) && !lpx_randn(2, sbt, 2, LPX_F32, lpx_cpu(), &bt) &&
        !lpx_t(bt, &c.b) && !lpx_float8_quantize(c.a, &o, &c.a8, NULL) && !lpx_float8_quantize(bt, &o, &b8t, NULL) &&
        !lpx_t(b8t, &c.b8)) {
        pair_result r;
        rc = time_pair(mm_fp8, mm_f32, &c, reps, 50.0, &r);
        if (!rc) {
            char note[160];
            snprintf(note, sizeof note, "%.1f GFLOP/s vs %.1f GFLOP/s", 2.0 * M * N * K / r.a_ns,
                     2.0 * M * N * K / r.b_ns);
            lpx_bench_row row = {name, r.a_ns / 1e6, "ms", r.b_ns / 1e6, "f32 sgemm", lpx_bench_na(), NULL,
                                 1.3 * r.b_ns / 1e6, note};
            lpx_bench_report_add(rep, &row);
        }
    }
    if (rc) fail(name);
    lpx_tensor *rel[] = {c.a, c.b, c.a8, c.b8, bt, b8t};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    return rc;
}

/* ---- Float8Linear fwd+bwd vs f32 ----------------------------------- */

typedef struct lctx {
    lpx_tensor *x, *w, *b, *g;
    lpx_float8_linear_recipe r;
    lpx_float8_linear_state st;
} lctx;

static int lin_fp8(void *p)
{
    lctx *c = p;
    lpx_tensor *out = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    lpx_float8_linear_ctx *ctx = NULL;
    int rc = lpx_float8_linear_forward(&c->r, &c->st, c->x, c->w, c->b, &out, &ctx, NULL) ||
             lpx_float8_linear_backward(ctx, c->g, &gx, &gw, &gb, NULL);
    lpx_float8_linear_ctx_free(ctx);
    lpx_tensor *rel[] = {out, gx, gw, gb};
    for (size_t i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
    return rc;
}

static int lin_f32(void *p)
{
    lctx *c = p;
    lpx_tensor *out = NULL, *gx = NULL, *gt = NULL, *gw = NULL, *gb = NULL;
    int64_t d0 = 0;
    int rc = lpx_linear(c->x, c->w, c->b, &out) || lpx_matmul(c->g, c->w, &gx) || lpx_t(c->g, &gt) ||
             lpx_matmul(gt, c->x, &gw) || lpx_sum(c->g, 1, &d0, false, &gb);
    lpx_tensor *rel[] = {out, gx, gt, gw, gb};
    for (size_t i = 0; i < 5; i++) lpx_tensor_release(rel[i]);
    return rc;
}

static int bench_linear(lpx_bench_report *rep, const char *preset, int64_t M, int64_t K, int64_t N, int reps)
{
    int64_t sx[2] = {M, K}, sw[2] = {N, K}, sb[1] = {N}, sg[2] = {M, N};
    lctx c;
    memset(&c, 0, sizeof c);
    int rc = 1;
    char name[96];
    snprintf(name, sizeof name, "Float8Linear %s fwd+bwd %lldx%lldx%lld", preset, (long long)M, (long long)K,
             (long long)N);
    if (!lpx_randn(2, sx, 3, LPX_F32, lpx_cpu(), &c.x) && !lpx_randn(2, sw, 4, LPX_F32, lpx_cpu(), &c.w) &&
        !lpx_randn(1, sb, 5, LPX_F32, lpx_cpu(), &c.b) && !lpx_randn(2, sg, 6, LPX_F32, lpx_cpu(), &c.g) &&
        !lpx_float8_linear_recipe_preset(preset, &c.r) && !lpx_float8_linear_state_init(&c.st, &c.r)) {
        pair_result r;
        rc = time_pair(lin_fp8, lin_f32, &c, reps, 100.0, &r);
        if (!rc) {
            lpx_bench_row row = {name, r.a_ns / 1e6, "ms", r.b_ns / 1e6, "f32 linear fwd+bwd", lpx_bench_na(), NULL,
                                 lpx_bench_na(), "3 fp8 GEMMs + casts vs 3 sgemm"};
            lpx_bench_report_add(rep, &row);
        }
    }
    if (rc) fail(name);
    lpx_float8_linear_state_destroy(&c.st);
    lpx_tensor *rel[] = {c.x, c.w, c.b, c.g};
    for (size_t i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx bench float8 [--json] [--reps N] [--quick]\n"
               "  --json    one JSON object per result line\n"
               "  --reps N  timed repetitions per case (median; default 9)\n"
               "  --quick   small shapes (a smoke run, numbers not meaningful)\n");
}

int lpx_bench_float8(int argc, char **argv)
{
    bool json = false, quick = false;
    int reps = 9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 10000) {
                fprintf(stderr, "lpx bench float8: --reps needs a count 1..10000, got '%s'\n", argv[i]);
                return 2;
            }
            reps = (int)v;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lpx bench float8: unknown option '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (lpx_init()) {
        fprintf(stderr, "lpx bench float8: lpx_init failed: %s\n", lpx_last_error());
        return 1;
    }
    if (quick) reps = reps > 3 ? 3 : reps;
    int64_t qr = quick ? 256 : 4096, qc = quick ? 1024 : 4096;
    int64_t mm = quick ? 128 : 1024, lm = quick ? 128 : 1024;
    lpx_bench_report rep;
    lpx_bench_report_init(&rep, "float8", json);
    lpx_bench_report_note(&rep, "lpx bench float8: median of %d interleaved reps; quantize is single-threaded, GEMMs "
                                "use the BLAS threads on both sides", reps);
    int rc = 0;
    char name[96];
    snprintf(name, sizeof name, "quantize f32 [%lld, %lld] dynamic tensorwise e4m3", (long long)qr, (long long)qc);
    rc |= bench_quantize(&rep, name, qr, qc, LPX_F32, LPX_FLOAT8_TENSORWISE, false, reps);
    snprintf(name, sizeof name, "quantize f32 [%lld, %lld] static tensorwise e4m3", (long long)qr, (long long)qc);
    rc |= bench_quantize(&rep, name, qr, qc, LPX_F32, LPX_FLOAT8_TENSORWISE, true, reps);
    snprintf(name, sizeof name, "quantize f32 [%lld, %lld] dynamic rowwise e4m3", (long long)qr, (long long)qc);
    rc |= bench_quantize(&rep, name, qr, qc, LPX_F32, LPX_FLOAT8_AXISWISE, false, reps);
    snprintf(name, sizeof name, "quantize bf16 [%lld, %lld] dynamic tensorwise e4m3", (long long)qr, (long long)qc);
    rc |= bench_quantize(&rep, name, qr, qc, LPX_BF16, LPX_FLOAT8_TENSORWISE, false, reps);
    snprintf(name, sizeof name, "scaled_mm %lld^3 tensorwise -> f32", (long long)mm);
    rc |= bench_mm(&rep, name, mm, mm, mm, LPX_FLOAT8_TENSORWISE, LPX_F32, reps);
    snprintf(name, sizeof name, "scaled_mm %lld^3 rowwise -> bf16", (long long)mm);
    rc |= bench_mm(&rep, name, mm, mm, mm, LPX_FLOAT8_AXISWISE, LPX_BF16, reps);
    rc |= bench_linear(&rep, "tensorwise", lm, lm, lm, reps);
    rc |= bench_linear(&rep, "rowwise", lm, lm, lm, reps);
    lpx_bench_report_finish(&rep);
    return rc ? 1 : 0;
}
