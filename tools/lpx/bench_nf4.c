/* `lpx bench nf4`: what NF4 weights cost next to plain f32, in one run.
 *
 *   dequantize   a [4096, 4096] nf4 weight decoded into a preallocated
 *                f32 (and bf16) buffer, vs memcpy of the same output bytes
 *                (the floor for any decode that writes them);
 *   linear       x [M, 4096] @ W^T with W nf4 [4096, 4096] (tiled
 *                dequantize + sgemm) vs the same linear with an f32 W
 *                (one sgemm), for a training-size and a decode-size M;
 *   grad_x       grad @ W, the backward of the frozen base layer, same
 *                comparison;
 *   QLoRA        lpx_qlora_linear forward + backward (x, A, B grads,
 *                r = 16) vs the f32 base layer's forward + grad_x.
 * Medians of timed batches (lpx_bench_measure); every case is checked
 * against its baseline once before it is timed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"
#include "bench_report.h"
#include "commands.h"

#define GOAL_LINEAR 1.3   /* NF4 linear / f32 sgemm, from the issue */

typedef struct nf4_bench {
    lpx_tensor *w;        /* nf4 [N, K] */
    lpx_tensor *wf;       /* its dequantized f32 values, [N, K] */
    lpx_tensor *x, *g;    /* [M, K], [M, N] */
    lpx_tensor *a, *b;    /* adapters [r, K], [N, r] */
    lpx_tensor *scratch;  /* dequantize target */
    void *dst, *src;      /* memcpy buffers */
    size_t bytes;
    lpx_dtype dtype;
    lpx_qlora_opts opts;
    lpx_status err;
} nf4_bench;

static int b_memcpy(void *p, int64_t n)
{
    nf4_bench *c = p;
    for (int64_t i = 0; i < n; i++) memcpy(c->dst, c->src, c->bytes);
    return 0;
}

static int b_dequant(void *p, int64_t n)
{
    nf4_bench *c = p;
    int64_t rows = lpx_tensor_shape(c->w)[0];
    for (int64_t i = 0; i < n; i++) {
        lpx_tensor *r = NULL;
        if ((c->err = lpx_nf4_dequantize_rows(c->w, 0, rows, c->dtype, c->scratch, &r))) return 1;
        lpx_tensor_release(r);
    }
    return 0;
}

static int run_linear(nf4_bench *c, lpx_tensor *w, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        lpx_tensor *y = NULL;
        if ((c->err = lpx_linear(c->x, w, NULL, &y))) return 1;
        lpx_tensor_release(y);
    }
    return 0;
}
static int b_linear_nf4(void *p, int64_t n) { return run_linear(p, ((nf4_bench *)p)->w, n); }
static int b_linear_f32(void *p, int64_t n) { return run_linear(p, ((nf4_bench *)p)->wf, n); }

static int run_gradx(nf4_bench *c, lpx_tensor *w, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        lpx_tensor *y = NULL;
        if ((c->err = lpx_matmul(c->g, w, &y))) return 1;
        lpx_tensor_release(y);
    }
    return 0;
}
static int b_gradx_nf4(void *p, int64_t n) { return run_gradx(p, ((nf4_bench *)p)->w, n); }
static int b_gradx_f32(void *p, int64_t n) { return run_gradx(p, ((nf4_bench *)p)->wf, n); }

static int b_qlora(void *p, int64_t n)
{
    nf4_bench *c = p;
    for (int64_t i = 0; i < n; i++) {
        lpx_tensor *y = NULL, *xa = NULL, *gx = NULL, *ga = NULL, *gb = NULL;
        c->err = lpx_qlora_linear(c->x, c->w, NULL, c->a, c->b, &c->opts, &y, &xa);
        if (!c->err) c->err = lpx_qlora_linear_backward(c->g, c->x, c->w, c->a, c->b, xa, &c->opts, &gx, &ga, &gb);
        lpx_tensor *t[] = {y, xa, gx, ga, gb};
        for (int k = 0; k < 5; k++) lpx_tensor_release(t[k]);
        if (c->err) return 1;
    }
    return 0;
}

static int b_base_f32(void *p, int64_t n)
{
    nf4_bench *c = p;
    return run_linear(c, c->wf, n) || run_gradx(c, c->wf, n);
}

/* Max relative difference (norm-wise) between two dense tensors. */
static double rel_diff(lpx_tensor *a, lpx_tensor *b)
{
    lpx_tensor *af = NULL, *bf = NULL;
    double num = 0, den = 0;
    if (lpx_cast(a, LPX_F32, false, &af) || lpx_cast(b, LPX_F32, false, &bf)) {
        lpx_tensor_release(af);
        return INFINITY;
    }
    const float *x = lpx_tensor_data(af), *y = lpx_tensor_data(bf);
    for (int64_t i = 0; i < lpx_tensor_numel(af); i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)y[i] * y[i];
    }
    lpx_tensor_release(af);
    lpx_tensor_release(bf);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Times a case against its baseline, interleaved: each rep runs both
 * once (alternating which goes first), so load from other processes hits
 * both alike. Medians in *base_ms / *val_ms, the best pair in *min_ratio;
 * NAN and a failure note when either fails. These ops take milliseconds,
 * so one call per sample is enough resolution. */
static void time_pair(lpx_bench_batch_fn base, lpx_bench_batch_fn val, nf4_bench *c, int reps, double *base_ms,
                      double *val_ms, double *min_ratio, char *note, size_t nlen, int *failures)
{
    double *tb = malloc((size_t)reps * sizeof *tb), *tv = malloc((size_t)reps * sizeof *tv);
    *base_ms = *val_ms = *min_ratio = NAN;   /* min_ratio: fastest case run / fastest baseline run */
    c->err = LPX_OK;
    int bad = !tb || !tv || base(c, 1) || val(c, 1);   /* warm-up: page faults, BLAS buffers */
    double bmin = INFINITY, vmin = INFINITY;
    for (int r = 0; r < reps && !bad; r++) {
        for (int k = 0; k < 2 && !bad; k++) {
            bool first_base = (r & 1) == 0;
            lpx_bench_batch_fn fn = (k == 0) == first_base ? base : val;
            uint64_t t0 = lpx_now_ns();
            bad = fn(c, 1);
            double ms = (double)(lpx_now_ns() - t0) / 1e6;
            if (fn == base) tb[r] = ms, bmin = ms < bmin ? ms : bmin;
            else tv[r] = ms, vmin = ms < vmin ? ms : vmin;
        }
    }
    if (bad) {
        snprintf(note, nlen, "failed: %s", c->err ? lpx_last_error() : "out of memory");
        (*failures)++;
    } else {
        *base_ms = lpx_bench_median(tb, reps);
        *val_ms = lpx_bench_median(tv, reps);
        *min_ratio = vmin / bmin;
    }
    free(tb);
    free(tv);
}

static void add_row(lpx_bench_report *rep, const char *name, double value, const char *unit, double base,
                    const char *base_name, double goal, const char *note)
{
    lpx_bench_row row = {name, value, unit, base, base_name, NAN, NULL, goal, note};
    lpx_bench_report_add(rep, &row);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx bench nf4 [--json] [--reps N] [--size N] [--rows M]\n"
               "\n"
               "NF4 vs f32 side by side: dequantize vs memcpy of the output bytes, NF4 linear and\n"
               "grad_x vs f32 sgemm of the same shape, QLoRA linear forward+backward.\n"
               "\n"
               "  --json      one JSON object per result line\n"
               "  --reps N    timed batches per case, median reported (default 9)\n"
               "  --size N    the weight is [N, N] (default 4096)\n"
               "  --rows M    rows of x for the training-size cases (default 512)\n");
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int lpx_bench_nf4(int argc, char **argv)
{
    bool json = false;
    long size = 4096, rows = 512, reps = 9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (!parse_int(argv[++i], 1, 10000, &reps)) {
                fprintf(stderr, "lpx bench nf4: --reps needs 1..10000, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            if (!parse_int(argv[++i], 64, 32768, &size) || size % 64) {
                fprintf(stderr, "lpx bench nf4: --size needs a multiple of 64 in 64..32768, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            if (!parse_int(argv[++i], 1, 65536, &rows)) {
                fprintf(stderr, "lpx bench nf4: --rows needs 1..65536, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lpx bench nf4: unknown option '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    const int64_t N = size, K = size, R = 16, Ms[2] = {rows, 16};
    int failures = 0;
    nf4_bench c;
    memset(&c, 0, sizeof c);
    c.opts = lpx_qlora_opts_default();
    c.opts.dropout = 0.05;
    c.opts.seed = 7;
    int64_t ws[2] = {N, K}, as[2] = {R, K}, bs[2] = {N, R};
    lpx_tensor *wsrc = NULL;
    lpx_status st;
    if ((st = lpx_randn(2, ws, 1, LPX_BF16, lpx_cpu(), &wsrc)) || (st = lpx_nf4_quantize(wsrc, NULL, &c.w)) ||
        (st = lpx_nf4_dequantize(c.w, LPX_F32, &c.wf)) || (st = lpx_randn(2, as, 3, LPX_F32, lpx_cpu(), &c.a)) ||
        (st = lpx_randn(2, bs, 4, LPX_F32, lpx_cpu(), &c.b)) ||
        (st = lpx_empty(2, ws, LPX_F32, lpx_cpu(), &c.scratch))) {
        fprintf(stderr, "lpx bench nf4: setup failed: %s\n", lpx_last_error());
        lpx_tensor *t[] = {wsrc, c.w, c.wf, c.a, c.b, c.scratch};
        for (int k = 0; k < 6; k++) lpx_tensor_release(t[k]);
        return 1;
    }
    lpx_tensor_release(wsrc);

    lpx_bench_report rep;
    lpx_bench_report_init(&rep, "nf4", json);
    lpx_nf4_info info;
    lpx_nf4_get_info(c.w, &info);
    lpx_bench_report_note(&rep, "lpx bench nf4: W [%lld, %lld] nf4 (block 64, scaler block 256, %.3f bits/param), "
                                "median of %d interleaved runs; ratio = value / baseline (lower is better)",
                          (long long)N, (long long)K, info.bits_per_param, (int)reps);
    if (lpx_trace_enabled()) lpx_bench_report_note(&rep, "warning: LPX_TRACE is on, every dispatched call is timed");
    char note[256];

    /* ---- dequantize vs memcpy of the output bytes ---- */
    lpx_dtype dts[2] = {LPX_F32, LPX_BF16};
    for (int k = 0; k < 2; k++) {
        c.dtype = dts[k];
        c.bytes = (size_t)(N * K) * (dts[k] == LPX_F32 ? 4 : 2);
        c.src = malloc(c.bytes);
        c.dst = malloc(c.bytes);
        lpx_tensor *scr = NULL;
        if (dts[k] != LPX_F32) lpx_empty(2, ws, dts[k], lpx_cpu(), &scr);
        lpx_tensor *keep = c.scratch;
        if (scr) c.scratch = scr;
        char name[64], bname[64];
        snprintf(name, sizeof name, "dequantize -> %s", lpx_dtype_name(dts[k]));
        snprintf(bname, sizeof bname, "memcpy %zu MB", c.bytes >> 20);
        if (!c.src || !c.dst) {
            add_row(&rep, name, NAN, "ms", NAN, bname, NAN, "failed: out of memory");
            failures++;
        } else {
            memset(c.src, 1, c.bytes);
            double mc, dq, mr;
            note[0] = 0;
            time_pair(b_memcpy, b_dequant, &c, reps, &mc, &dq, &mr, note, sizeof note, &failures);
            if (!note[0])
                snprintf(note, sizeof note, "%.1f GB/s written, memcpy %.1f GB/s; min/min %.2fx",
                         (double)c.bytes / dq / 1e6, (double)c.bytes / mc / 1e6, mr);
            add_row(&rep, name, dq, "ms", mc, bname, NAN, note);
        }
        free(c.src);
        free(c.dst);
        c.scratch = keep;
        lpx_tensor_release(scr);
    }

    /* ---- linear and grad_x vs f32 sgemm ---- */
    for (int k = 0; k < 2; k++) {
        int64_t M = Ms[k], xs[2] = {M, K}, gs[2] = {M, N};
        lpx_tensor_release(c.x);
        lpx_tensor_release(c.g);
        c.x = c.g = NULL;
        if (lpx_randn(2, xs, 5, LPX_F32, lpx_cpu(), &c.x) || lpx_randn(2, gs, 6, LPX_F32, lpx_cpu(), &c.g)) {
            fprintf(stderr, "lpx bench nf4: setup failed: %s\n", lpx_last_error());
            failures++;
            break;
        }
        /* same numbers first: the tiled NF4 GEMM equals sgemm on the dequantized W */
        lpx_tensor *y1 = NULL, *y2 = NULL;
        double d = INFINITY;
        if (!lpx_linear(c.x, c.w, NULL, &y1) && !lpx_linear(c.x, c.wf, NULL, &y2)) d = rel_diff(y1, y2);
        lpx_tensor_release(y1);
        lpx_tensor_release(y2);
        char name[64], bname[64];
        snprintf(name, sizeof name, "nf4 linear M=%lld", (long long)M);
        snprintf(bname, sizeof bname, "f32 sgemm [%lld,%lld]x[%lld,%lld]^T", (long long)M, (long long)K,
                 (long long)N, (long long)K);
        if (!(d < 1e-5)) {
            snprintf(note, sizeof note, "failed: differs from sgemm (rel %g): %s", d, lpx_last_error());
            add_row(&rep, name, NAN, "ms", NAN, bname, NAN, note);
            failures++;
            continue;
        }
        double base, v, mr;
        note[0] = 0;
        time_pair(b_linear_f32, b_linear_nf4, &c, reps, &base, &v, &mr, note, sizeof note, &failures);
        if (!note[0])
            snprintf(note, sizeof note, "%.1f GFLOP/s; min/min %.2fx", 2.0 * (double)(M * N * K) / v / 1e6, mr);
        add_row(&rep, name, v, "ms", base, bname, k == 0 ? GOAL_LINEAR * base : NAN, note);

        snprintf(name, sizeof name, "nf4 grad_x M=%lld", (long long)M);
        snprintf(bname, sizeof bname, "f32 sgemm [%lld,%lld]x[%lld,%lld]", (long long)M, (long long)N, (long long)N,
                 (long long)K);
        note[0] = 0;
        time_pair(b_gradx_f32, b_gradx_nf4, &c, reps, &base, &v, &mr, note, sizeof note, &failures);
        if (!note[0])
            snprintf(note, sizeof note, "%.1f GFLOP/s; min/min %.2fx", 2.0 * (double)(M * N * K) / v / 1e6, mr);
        add_row(&rep, name, v, "ms", base, bname, k == 0 ? GOAL_LINEAR * base : NAN, note);
    }

    /* ---- QLoRA forward + backward ---- */
    if (c.x && c.g) {
        int64_t xs[2] = {Ms[0], K}, gs[2] = {Ms[0], N};
        lpx_tensor_release(c.x);
        lpx_tensor_release(c.g);
        c.x = c.g = NULL;
        if (!lpx_randn(2, xs, 5, LPX_F32, lpx_cpu(), &c.x) && !lpx_randn(2, gs, 6, LPX_F32, lpx_cpu(), &c.g)) {
            char name[96];
            snprintf(name, sizeof name, "qlora fwd+bwd M=%lld r=%lld", (long long)Ms[0], (long long)R);
            double base, v, mr;
            note[0] = 0;
            time_pair(b_base_f32, b_qlora, &c, reps, &base, &v, &mr, note, sizeof note, &failures);
            if (!note[0])
                snprintf(note, sizeof note, "dropout %.2f; grads of x, A, B; min/min %.2fx", c.opts.dropout, mr);
            add_row(&rep, name, v, "ms", base, "f32 base layer fwd+grad_x", NAN, note);
        } else {
            failures++;
        }
    }
    lpx_bench_report_finish(&rep);
    lpx_tensor *t[] = {c.w, c.wf, c.x, c.g, c.a, c.b, c.scratch};
    for (int k = 0; k < 7; k++) lpx_tensor_release(t[k]);
    return failures ? 1 : 0;
}
