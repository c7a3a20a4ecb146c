/* `lpx bench dispatch`: what one op costs at each layer of the stack.
 *
 * ns per call of a 16-element f32 add written into a preallocated output
 * (the add_out form, apples to apples with ATen's at::add_out):
 *   direct kernel call   the registered boxed CPU kernel, called by hand
 *   dispatched           lpx_add_out (key set, table lookup, kernel)
 *   1 kind layer         a wrapper kind whose add handler unwraps a/b/out
 *                        and calls lpx_add_out on the inner tensors
 *   2 kind layers        a second wrapper kind around the first
 * The tensors are tiny on purpose: the kernel does almost nothing, so the
 * numbers are the per-op overhead a framework pays for every small op.
 *
 * Beside them, PyTorch, measured by helper programs when they are there:
 * bench/torch_add_out (C++, ATen's at::add_out; built with
 * -Dtorch_bench=enabled) and bench/torch_dispatch.py (torch.add(out=) and
 * a __torch_dispatch__ wrapper subclass 1 and 2 layers deep). Missing
 * helpers give "PyTorch: not available" rows, not an error. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "lpx/lpx.h"
#include "bench_report.h"
#include "commands.h"

/* Bench hook exported by liblpx (dispatch/trace.c): the boxed kernel of
 * (op, key). Not stable API. */
LPX_API lpx_kernel_fn lpx__kernel_peek(lpx_op op, int key, void **data);

#define N_ELEMS 16

/* Goals (ns per call) from the design: dispatch must stay cheap enough
 * that kinds can be stacked on every op of a training step. */
#define GOAL_DISPATCHED 40.0
#define GOAL_ONE_LAYER 80.0
#define GOAL_TWO_LAYERS 120.0

/* ---- the wrapper kinds --------------------------------------------- */

/* kernel_data = the kind this handler serves */
static lpx_tensor *unwrap(const lpx_kind *k, lpx_tensor *t)
{
    return lpx_tensor_kind(t) == k ? lpx_tensor_inner(t, 0) : t;
}

/* add for a wrapper kind: unwrap a, b and out, run the dense (or next
 * kind's) add on them, return out. The same work a minimal
 * __torch_dispatch__ subclass does. */
static lpx_status wrap_add(lpx_call *c)
{
    const lpx_kind *k = c->kernel_data;
    lpx_tensor *out = c->args[2].tag == LPX_TAG_TENSOR ? c->args[2].u.t : NULL;
    if (!out) return lpx_error(LPX_ENOTIMPL, "add: bench wrapper kind '%s' only supports add with out", lpx_kind_name(k));
    lpx_status st = lpx_add_out(unwrap(k, c->args[0].u.t), unwrap(k, c->args[1].u.t), unwrap(k, out));
    if (st) return st;
    lpx_tensor_retain(out);
    c->rets[0] = lpx_v_tensor(out);
    c->nrets = 1;
    return LPX_OK;
}

static lpx_status register_wrapper(const char *name, const lpx_kind **out)
{
    lpx_kind_i vt;
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.abi_version = LPX_KIND_ABI_VERSION;
    vt.name = name;
    vt.priority = LPX_PRIORITY_WRAPPER;
    lpx_status st = lpx_kind_register(&vt, out);
    if (st == LPX_EEXIST) return lpx_kind_find(name, out);   /* run twice in one process */
    if (st) return st;
    st = lpx_kernel_register(LPX_OP_add, lpx_kind_key(*out), wrap_add, (void *)*out);
    return st == LPX_EEXIST ? LPX_OK : st;
}

static lpx_status wrap_tensor(const lpx_kind *k, lpx_tensor *inner, lpx_tensor **out)
{
    int64_t shape[1] = {N_ELEMS};
    return lpx_tensor_new_kind(k, LPX_F32, 1, shape, lpx_cpu(), &inner, 1, NULL, 0, out);
}

/* ---- timed batches ------------------------------------------------- */

typedef struct bench_ctx {
    lpx_tensor *a, *b, *out;      /* dense, or kind tensors for the layer cases */
    lpx_kernel_fn fn;             /* direct case */
    void *data;
    lpx_value args[3];
    lpx_status err;
    lpx_op_frame *frame;          /* direct case: add's checked arguments behind the call (op_args.h) */
} bench_ctx;

static int batch_direct(void *p, int64_t n)
{
    bench_ctx *x = p;
    for (int64_t i = 0; i < n; i++) {
        /* what run() in dispatch.c sets up, minus the lookup and add's
         * meta function (its result, computed once, is the same every
         * call): the kernel's arithmetic alone */
        lpx_call *c = &x->frame->call;
        lpx_call_init(c, LPX_OP_add, x->args, 3);
        c->key = LPX_KEY_CPU;
        c->keys = UINT64_C(1) << LPX_KEY_CPU;
        c->kernel_data = x->data;
        lpx_status st = x->fn(c);
        if (st) return x->err = st, 1;
        lpx_call_release_rets(c);
    }
    return 0;
}

static int batch_add_out(void *p, int64_t n)
{
    bench_ctx *x = p;
    for (int64_t i = 0; i < n; i++) {
        lpx_status st = lpx_add_out(x->a, x->b, x->out);
        if (st) return x->err = st, 1;
    }
    return 0;
}

/* ---- PyTorch helpers ----------------------------------------------- */

typedef struct torch_results {
    double aten_add_out, aten_inference, aten_cpu;       /* C++ */
    double py_add_out, py_dispatch1, py_dispatch2;       /* Python */
    char aten_why[160], py_why[160];                     /* why absent */
} torch_results;

static bool exe_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0) return false;
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash) return false;
    *slash = 0;
    return true;
}

/* Truncating copy (messages only). */
static void copy_str(char *dst, size_t len, const char *src)
{
    size_t n = strlen(src);
    if (n >= len) n = len - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static bool is_file(const char *p, bool exec)
{
    return access(p, exec ? X_OK : R_OK) == 0;
}

/* First existing candidate among $env, $LPX_BENCH_DIR/name, next to the
 * lpx executable, and the build tree (lpx in build/tools/lpx, helpers in
 * build/bench). */
static bool find_helper(const char *env, const char *name, bool exec, char *out, size_t len)
{
    const char *e = getenv(env);
    if (e && e[0]) {
        snprintf(out, len, "%s", e);
        return is_file(out, exec);
    }
    const char *bd = getenv("LPX_BENCH_DIR");
    if (bd && bd[0]) {
        int n = snprintf(out, len, "%s/%s", bd, name);
        if (n > 0 && (size_t)n < len && is_file(out, exec)) return true;
    }
    char dir[PATH_MAX];
    if (!exe_dir(dir, sizeof dir)) return false;
    const char *rel[] = {"", "/../../bench", "/../share/lpx/bench"};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
        int n = snprintf(out, len, "%s%s/%s", dir, rel[i], name);
        if (n > 0 && (size_t)n < len && is_file(out, exec)) return true;
    }
    return false;
}

/* Runs cmd, parses "<case> <median> <min>" lines into the matching fields.
 * Returns the exit status (-1 if it could not start); the last other line
 * goes to why. */
static int run_helper(const char *cmd, const char *const *names, double *const *vals, int n, char *why, size_t wlen)
{
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(why, wlen, "cannot run: %s", strerror(errno));
        return -1;
    }
    char line[512];
    while (fgets(line, sizeof line, p)) {
        char name[64];
        double med, lo;
        bool used = false;
        if (sscanf(line, "%63s %lf %lf", name, &med, &lo) == 3)
            for (int i = 0; i < n; i++)
                if (!strcmp(name, names[i])) {
                    *vals[i] = med;
                    used = true;
                }
        if (!used) {
            line[strcspn(line, "\n")] = 0;
            if (line[0]) copy_str(why, wlen, line);
        }
    }
    int st = pclose(p);
    return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void measure_torch(int reps, double batch_ms, torch_results *t)
{
    char path[PATH_MAX], cmd[2 * PATH_MAX + 128];
    t->aten_add_out = t->aten_inference = t->aten_cpu = NAN;
    t->py_add_out = t->py_dispatch1 = t->py_dispatch2 = NAN;
    snprintf(t->aten_why, sizeof t->aten_why, "bench/torch_add_out not built (meson -Dtorch_bench=enabled)");
    snprintf(t->py_why, sizeof t->py_why, "bench/torch_dispatch.py not found");

    if (find_helper("LPX_TORCH_ADD_OUT", "torch_add_out", true, path, sizeof path)) {
        snprintf(cmd, sizeof cmd, "'%s' --reps %d --batch-ms %g 2>&1", path, reps, batch_ms);
        const char *names[] = {"aten_add_out", "aten_add_out_inference", "aten_cpu_add_out"};
        double *vals[] = {&t->aten_add_out, &t->aten_inference, &t->aten_cpu};
        t->aten_why[0] = 0;
        int rc = run_helper(cmd, names, vals, 3, t->aten_why, sizeof t->aten_why);
        if (rc != 0 && !t->aten_why[0]) {
            int n = snprintf(t->aten_why, sizeof t->aten_why, "torch_add_out exited with %d", rc);
            (void)n;
        }
    }

    if (find_helper("LPX_TORCH_DISPATCH_PY", "torch_dispatch.py", false, path, sizeof path)) {
        /* Debian's python3-torch lives under /usr/bin/python3; a pyenv
         * python3 earlier on PATH usually has no torch */
        const char *env_py = getenv("LPX_PYTHON");
        const char *pys[] = {env_py && env_py[0] ? env_py : NULL, "/usr/bin/python3", "python3"};
        snprintf(t->py_why, sizeof t->py_why, "no python3 with torch (set LPX_PYTHON)");
        for (size_t i = 0; i < sizeof pys / sizeof *pys; i++) {
            if (!pys[i]) continue;
            if (pys[i][0] == '/' && !is_file(pys[i], true)) continue;
            snprintf(cmd, sizeof cmd, "'%s' '%s' --reps %d --batch-ms %g 2>&1", pys[i], path, reps, batch_ms);
            const char *names[] = {"torch_add_out", "torch_dispatch_1", "torch_dispatch_2"};
            double *vals[] = {&t->py_add_out, &t->py_dispatch1, &t->py_dispatch2};
            char why[160] = "";
            int rc = run_helper(cmd, names, vals, 3, why, sizeof why);
            if (rc == 0) {
                t->py_why[0] = 0;
                break;
            }
            /* 3: no torch in this interpreter, try the next one */
            if (rc != 3 && why[0]) {
                int n = snprintf(t->py_why, sizeof t->py_why, "%s: %s", pys[i], why);
                (void)n;   /* a truncated reason is fine */
            }
        }
    }
}

/* ---- the command --------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lpx bench dispatch [--json] [--reps N] [--batch-ms MS] [--no-torch]\n"
            "\n"
            "ns per call of a 16-element f32 add into a preallocated out tensor:\n"
            "direct kernel call, lpx_add_out, 1 and 2 wrapper-kind layers, and\n"
            "PyTorch's at::add_out / torch.add(out=) / __torch_dispatch__ when available.\n"
            "\n"
            "  --json         one JSON object per result line\n"
            "  --reps N       timed batches per case, median reported (default 101)\n"
            "  --batch-ms MS  target duration of one batch (default 2)\n"
            "  --no-torch     skip the PyTorch helpers\n"
            "\n"
            "Helpers are found via LPX_TORCH_ADD_OUT, LPX_TORCH_DISPATCH_PY, LPX_BENCH_DIR,\n"
            "next to the lpx executable, or in the build tree; LPX_PYTHON picks the interpreter.\n");
}

static bool check_sum(lpx_tensor *out, const float *a, const float *b)
{
    const float *o = lpx_tensor_data(out);
    for (int i = 0; i < N_ELEMS; i++)
        if (o[i] != a[i] + b[i]) return false;
    return true;
}

/* One lpx case: check the result, then time it. */
static void lpx_case(lpx_bench_report *rep, const lpx_bench_opts *o, const char *name, lpx_bench_batch_fn fn,
                     bench_ctx *ctx, lpx_tensor *dense_out, const float *a, const float *b, double baseline,
                     double compare, const char *compare_case, double goal, double *result, int *failures)
{
    lpx_bench_row row = {name, NAN, "ns", baseline, "direct", compare, compare_case, goal, NULL};
    char note[256];
    memset(lpx_tensor_data(dense_out), 0, N_ELEMS * sizeof(float));
    lpx_bench_stats s;
    ctx->err = LPX_OK;
    if (fn(ctx, 1)) {
        snprintf(note, sizeof note, "failed: %s", lpx_last_error());
        (*failures)++;
    } else if (!check_sum(dense_out, a, b)) {
        snprintf(note, sizeof note, "failed: wrong sum");
        (*failures)++;
    } else if (lpx_bench_measure(fn, ctx, o, &s)) {
        snprintf(note, sizeof note, "failed: %s", ctx->err ? lpx_last_error() : "out of memory");
        (*failures)++;
    } else {
        row.value = s.median_ns;
        snprintf(note, sizeof note, "min %.1f", s.min_ns);
    }
    row.note = note;
    if (result) *result = row.value;
    lpx_bench_report_add(rep, &row);
}

int lpx_bench_dispatch(int argc, char **argv)
{
    bool json = false, torch = true;
    lpx_bench_opts o = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if ((!strcmp(argv[i], "--reps") || !strcmp(argv[i], "--iters")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 100000) {
                fprintf(stderr, "lpx bench dispatch: --reps needs a count 1..100000, got '%s'\n", argv[i]);
                return 2;
            }
            o.reps = (int)v;
        } else if (!strcmp(argv[i], "--batch-ms") && i + 1 < argc) {
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end || !(v > 0) || v > 10000) {
                fprintf(stderr, "lpx bench dispatch: --batch-ms needs a positive number, got '%s'\n", argv[i]);
                return 2;
            }
            o.batch_ms = v;
        } else if (!strcmp(argv[i], "--no-torch")) {
            torch = false;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lpx bench dispatch: unknown option '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    lpx_bench_opts_default(&o);

    /* PyTorch first: its numbers are the comparison column of lpx rows */
    torch_results tr;
    if (torch) {
        measure_torch(o.reps, o.batch_ms, &tr);
    } else {
        tr.aten_add_out = tr.aten_inference = tr.aten_cpu = NAN;
        tr.py_add_out = tr.py_dispatch1 = tr.py_dispatch2 = NAN;
        snprintf(tr.aten_why, sizeof tr.aten_why, "skipped with --no-torch");
        snprintf(tr.py_why, sizeof tr.py_why, "skipped with --no-torch");
    }

    int failures = 0;
    lpx_status st;
    const lpx_kind *k1 = NULL, *k2 = NULL;
    lpx_tensor *a = NULL, *b = NULL, *out = NULL, *a1 = NULL, *b1 = NULL, *o1 = NULL, *a2 = NULL, *b2 = NULL, *o2 = NULL;
    int64_t shape[1] = {N_ELEMS};
    if ((st = lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &a)) || (st = lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &b)) ||
        (st = lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &out)) || (st = register_wrapper("bench_wrap1", &k1)) ||
        (st = register_wrapper("bench_wrap2", &k2)) || (st = wrap_tensor(k1, a, &a1)) || (st = wrap_tensor(k1, b, &b1)) ||
        (st = wrap_tensor(k1, out, &o1)) || (st = wrap_tensor(k2, a1, &a2)) || (st = wrap_tensor(k2, b1, &b2)) ||
        (st = wrap_tensor(k2, o1, &o2))) {
        fprintf(stderr, "lpx bench dispatch: setup failed: %s\n", lpx_last_error());
        failures++;
        goto done;
    }
    float *pa = lpx_tensor_data(a), *pb = lpx_tensor_data(b);
    for (int i = 0; i < N_ELEMS; i++) {
        pa[i] = (float)i * 0.5f;
        pb[i] = 1.0f - (float)i * 0.25f;
    }

    lpx_bench_report rep;
    lpx_bench_report_init(&rep, "dispatch", json);
    lpx_bench_report_note(&rep, "lpx bench dispatch: ns per call, %d-element f32 add into a preallocated out; "
                                "median of %d batches of ~%g ms", N_ELEMS, o.reps, o.batch_ms);
    /* numbers from a busy machine are not comparable: say how busy */
    double load[1];
    if (getloadavg(load, 1) == 1)
        lpx_bench_report_note(&rep, "load average %.2f on %ld CPUs at start", load[0], sysconf(_SC_NPROCESSORS_ONLN));
    if (lpx_trace_enabled())
        lpx_bench_report_note(&rep, "warning: LPX_TRACE is on, every dispatched call is being timed");

    bench_ctx ctx = {a, b, out, NULL, NULL, {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_tensor(out)}, LPX_OK, NULL};
    double direct = NAN;
    ctx.fn = lpx__kernel_peek(LPX_OP_add, LPX_KEY_CPU, &ctx.data);
    lpx_op_frame add_frame;
    if (ctx.fn) {
        lpx_call_init(&add_frame.call, LPX_OP_add, ctx.args, 3);
        add_frame.call.key = LPX_KEY_CPU;
        if (lpx_op_spec_run(&add_frame, sizeof add_frame)) ctx.fn = NULL;
        ctx.frame = &add_frame;
    }
    if (!ctx.fn) {
        lpx_bench_row row = {"lpx direct kernel call", NAN, "ns", NAN, NULL, tr.aten_cpu, "ATen at::cpu::add_out",
                             NAN, "failed: no cpu kernel registered for add"};
        lpx_bench_report_add(&rep, &row);
        failures++;
    } else {
        lpx_case(&rep, &o, "lpx direct kernel call", batch_direct, &ctx, out, pa, pb, NAN, tr.aten_cpu,
                 "ATen at::cpu::add_out", NAN, &direct, &failures);
    }
    lpx_case(&rep, &o, "lpx dispatched (lpx_add_out)", batch_add_out, &ctx, out, pa, pb, direct, tr.aten_add_out,
             "ATen at::add_out", GOAL_DISPATCHED, NULL, &failures);
    bench_ctx c1 = {a1, b1, o1, NULL, NULL, {lpx_v_none(), lpx_v_none(), lpx_v_none()}, LPX_OK, NULL};
    lpx_case(&rep, &o, "lpx 1 kind layer", batch_add_out, &c1, out, pa, pb, direct, tr.py_dispatch1,
             "torch_dispatch 1 layer", GOAL_ONE_LAYER, NULL, &failures);
    bench_ctx c2 = {a2, b2, o2, NULL, NULL, {lpx_v_none(), lpx_v_none(), lpx_v_none()}, LPX_OK, NULL};
    lpx_case(&rep, &o, "lpx 2 kind layers", batch_add_out, &c2, out, pa, pb, direct, tr.py_dispatch2,
             "torch_dispatch 2 layers", GOAL_TWO_LAYERS, NULL, &failures);

    struct { const char *name; double v; const char *why; } trows[] = {
        {"PyTorch ATen at::cpu::add_out (C++, no dispatcher)", tr.aten_cpu, tr.aten_why},
        {"PyTorch ATen at::add_out (C++)", tr.aten_add_out, tr.aten_why},
        {"PyTorch ATen at::add_out (C++, InferenceMode)", tr.aten_inference, tr.aten_why},
        {"PyTorch torch.add(out=) (Python)", tr.py_add_out, tr.py_why},
        {"PyTorch __torch_dispatch__ 1 layer (Python)", tr.py_dispatch1, tr.py_why},
        {"PyTorch __torch_dispatch__ 2 layers (Python)", tr.py_dispatch2, tr.py_why},
    };
    for (size_t i = 0; i < sizeof trows / sizeof *trows; i++) {
        char note[224];
        if (lpx_bench_has(trows[i].v)) note[0] = 0;
        else snprintf(note, sizeof note, "PyTorch: not available (%s)", trows[i].why[0] ? trows[i].why : "no result");
        lpx_bench_row row = {trows[i].name, trows[i].v, "ns", direct, "direct", NAN, NULL, NAN, note[0] ? note : NULL};
        lpx_bench_report_add(&rep, &row);
    }
    lpx_bench_report_finish(&rep);
    if (!json)
        printf("\nratios: 'vs direct' = row / lpx direct kernel call; the PyTorch column = lpx row / the PyTorch\n"
               "row doing the same job (Python rows include the interpreter, which lpx rows do not).\n");

done:
    lpx_tensor_release(o2);
    lpx_tensor_release(b2);
    lpx_tensor_release(a2);
    lpx_tensor_release(o1);
    lpx_tensor_release(b1);
    lpx_tensor_release(a1);
    lpx_tensor_release(out);
    lpx_tensor_release(b);
    lpx_tensor_release(a);
    return failures ? 1 : 0;
}
