/* Shared set-up of the GPU suite (tests/gpu): loads lpx-cuda.so from
 * $LPX_TEST_CUDA_PLUGIN, reports every case skipped when the plugin
 * declines because the machine has no GPU (a failure when it has one),
 * and moves tensors between
 * the CPU and the GPU so every CUDA kernel is checked against the CPU
 * backend on the same inputs. Everything is static inline. */
#ifndef LPX_TESTS_GPU_UTIL_H
#define LPX_TESTS_GPU_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <lpx/lpx.h>
#include <lpx/plugin.h>
#include <lpx/cuda.h>
#include <lpx/trace.h>
#include "../check.h"
#include "../tensor_util.h"

#define GPU_SKIP 77

static const lpx_plugin *gpu_plugin;

/* Coverage of the suite (test_cuda_coverage.c checks it): at exit, every
 * program writes the names of the ops it dispatched at the cuda key
 * (lpx_trace_count, tracing started by gpu_setup) to
 * $LPX_TEST_GPU_COVERAGE/<program>.ops, one per line. */
static inline void gpu_coverage_write(void)
{
    const char *dir = getenv("LPX_TEST_GPU_COVERAGE");
    int key = lpx_device_key(LPX_DEVICE_CUDA);
    if (!dir || !*dir || key < 0) return;
    char name[64] = "unknown", path[1024];
    FILE *comm = fopen("/proc/self/comm", "r");
    if (comm) {
        if (fgets(name, sizeof name, comm)) name[strcspn(name, "\n")] = 0;
        fclose(comm);
    }
    (void)mkdir(dir, 0777); /* may exist */
    snprintf(path, sizeof path, "%s/%s.ops", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        printf("  coverage: cannot write %s\n", path);
        return;
    }
    for (int op = 0; op < lpx_op_count(); op++)
        if (lpx_trace_count((lpx_op)op, key) > 0) fprintf(f, "%s\n", lpx_op_name((lpx_op)op));
    fclose(f);
}

/* True when this machine shows an NVIDIA GPU to its processes (a device
 * node or the driver's GPU list): then a plugin that declines is broken,
 * not absent, and the GPU suite must fail rather than skip. */
static inline bool gpu_present(const char **where)
{
    static const char *nodes[] = {"/dev/nvidia0", "/proc/driver/nvidia/gpus"};
    for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++) {
        struct stat st;
        if (stat(nodes[i], &st) == 0) {
            *where = nodes[i];
            return true;
        }
    }
    return false;
}

/* Loads the plugin. When it declines because the machine has no GPU, every
 * later case is reported skipped with the reason (check_skip_rest) and this
 * returns false; a GPU that is present but unusable (driver or plugin
 * broken), or LPX_TEST_REQUIRE_GPU=1 (make test-gpu), makes a decline a
 * failure: exit 1. Any other load failure exits 1. Starts dispatch tracing
 * for the coverage file. */
static inline bool gpu_setup(void)
{
    const char *path = getenv("LPX_TEST_CUDA_PLUGIN");
    if (!path || !*path) {
        printf("SKIP: LPX_TEST_CUDA_PLUGIN is not set (lpx-cuda.so was not built)\n");
        exit(GPU_SKIP);
    }
    if (lpx_init()) {
        printf("lpx_init failed: %s\n", lpx_last_error());
        exit(1);
    }
    if (lpx_plugin_load(path, &gpu_plugin)) {
        const char *why = lpx_last_error(), *where = NULL;
        const char *req = getenv("LPX_TEST_REQUIRE_GPU");
        if (strstr(why, "declined") && !gpu_present(&where) && !(req && !strcmp(req, "1"))) {
            check_skip_rest(CHECK_SKIP_GPU, "%s", why);
            return false;
        }
        if (where) printf("FAIL: this machine has a GPU (%s) but %s\n", where, why);
        else printf("FAIL: loading %s failed: %s\n", path, why);
        exit(1);
    }
    if (getenv("LPX_TEST_GPU_COVERAGE")) {
        if (lpx_trace_start(NULL)) {
            printf("lpx_trace_start failed: %s\n", lpx_last_error());
            exit(1);
        }
        atexit(gpu_coverage_write);
    }
    return true;
}

static inline lpx_device gpu_dev(void) { return lpx_cuda_device(0); }

/* x moved to the GPU (new reference; x keeps its own). */
static inline lpx_tensor *gpu_up(lpx_tensor *x)
{
    lpx_tensor *y = NULL;
    if (lpx_tensor_to(x, gpu_dev(), &y)) printf("  lpx_tensor_to(cuda) failed: %s\n", lpx_last_error());
    return y;
}

/* x moved to the CPU (new reference). */
static inline lpx_tensor *gpu_down(lpx_tensor *x)
{
    lpx_tensor *y = NULL;
    if (lpx_tensor_to(x, lpx_cpu(), &y)) printf("  lpx_tensor_to(cpu) failed: %s\n", lpx_last_error());
    return y;
}

/* True when a (CPU) and b (any device) hold the same bytes in the same
 * shape; prints the first differing element. */
static inline bool gpu_same_bits(const char *what, lpx_tensor *a, lpx_tensor *b)
{
    lpx_tensor *bc = gpu_down(b), *ac = NULL;
    if (!bc || lpx_contiguous(a, &ac)) { lpx_tensor_release(bc); return false; }
    lpx_tensor *bcc = NULL;
    bool ok = !lpx_contiguous(bc, &bcc) && lpx_tensor_dtype(ac) == lpx_tensor_dtype(bcc) &&
              lpx_tensor_numel(ac) == lpx_tensor_numel(bcc);
    if (ok) {
        size_t es = lpx_dtype_nbytes(lpx_tensor_dtype(ac), 1);
        const unsigned char *p = (const unsigned char *)lpx_tensor_data(ac), *q = (const unsigned char *)lpx_tensor_data(bcc);
        for (int64_t i = 0; i < lpx_tensor_numel(ac); i++)
            if (memcmp(p + i * es, q + i * es, es)) {
                double va = 0, vb = 0;
                lpx_item(ac, i, &va);
                lpx_item(bcc, i, &vb);
                printf("  %s: element %lld differs: cpu %.9g, cuda %.9g\n", what, (long long)i, va, vb);
                ok = false;
                break;
            }
    } else {
        printf("  %s: dtype or size differs\n", what);
    }
    lpx_tensor_release(ac);
    lpx_tensor_release(bc);
    lpx_tensor_release(bcc);
    return ok;
}

/* ||a - b|| / ||a|| over all elements (a on the CPU, the reference; b on
 * any device); NaN when either holds a NaN or the shapes differ. */
static inline double gpu_rel_err(lpx_tensor *a, lpx_tensor *b)
{
    lpx_tensor *bc = gpu_down(b);
    if (!bc || lpx_tensor_numel(a) != lpx_tensor_numel(bc)) { lpx_tensor_release(bc); return NAN; }
    double *x = rd(a), *y = rd(bc);
    double num = 0, den = 0;
    for (int64_t i = 0; i < lpx_tensor_numel(a); i++) {
        num += (x[i] - y[i]) * (x[i] - y[i]);
        den += x[i] * x[i];
    }
    free(x);
    free(y);
    lpx_tensor_release(bc);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
