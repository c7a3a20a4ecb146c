/* `lpx train --device cuda` (device-resident: shards, grads and AdamW on
 * the GPU) and `--device cuda --offload` (those on the host) against `lpx
 * train` on the CPU: a small model trained for the same steps from the
 * same init and data, one rank each, per recipe; every step's loss on the
 * GPU must stay within the recipe's tolerance of the CPU's (relative):
 *   f32                      1e-3  (f32 everywhere; the GPU sums in
 *                                   other orders, attention and the
 *                                   embedding grad among them)
 *   bf16, nf4-qlora          1e-2  (bf16 GEMM inputs: a rounding flip
 *                                   moves a weight by one bf16 ulp)
 *   float8-*, mxfp8          3e-2  (cuBLASLt's fast fp8 accumulation,
 *                                   which the CPU does not mimic)
 * and the GPU run's summary must report its step split, peak GPU memory
 * and MFU. The GPU run is one process with lpx-cuda.so and lpx-nccl.so on
 * LPX_PLUGIN_PATH (the directories of LPX_TEST_CUDA_PLUGIN and
 * LPX_TEST_NCCL_PLUGIN, and of LPX_TEST_MX for mxfp8). Skipped (77)
 * without a GPU, like the rest of the suite. */
#include <libgen.h>
#include <math.h>
#include <unistd.h>
#include "gpu_util.h"
#include "../run_util.h"

static char corpus[1024], plugin_path[4096];

#define MODEL "--dim 64 --layers 2 --heads 4 --kv-heads 2 --seq 32 --batch 4 --micro 2 --steps 12 --eval 2 " \
              "--sample 0 --log-every 1 --lr 3e-3 --seed 3 --pretrain 10"


static void dir_of(const char *path, char *out, size_t n)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    snprintf(out, n, "%s", dirname(tmp));
}

/* `exe args` with LPX_PLUGIN_PATH set (the CPU run too: mxfp8 needs
 * lpx-mx.so, which the staged executable cannot find next to itself);
 * stdout + stderr into buf; the exit code (-1: no normal exit) */
static int run_with_plugins(const char *args, char *buf, size_t len)
{
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "env LPX_PLUGIN_PATH='%s' '%s' %s 2>&1", plugin_path, exe, args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(buf, 1, len - 1, p) : 0;
    buf[n] = 0;
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void one_recipe(const char *recipe, double tol, const char *mode)
{
    static char cpu[65536], gpu[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe %s " MODEL " --ranks 1 --data '%s' --out /tmp/lpx-train-gpu-%d-cpu",
             recipe, corpus, (int)getpid());
    int rc = run_with_plugins(args, cpu, sizeof cpu);
    CHECKF(rc == 0, "%s on the CPU exited %d: %s", recipe, rc, cpu);
    snprintf(args, sizeof args,
             "train --recipe %s " MODEL " --ranks 1 --device cuda %s --data '%s' --out /tmp/lpx-train-gpu-%d-cuda",
             recipe, mode, corpus, (int)getpid());
    int rg = run_with_plugins(args, gpu, sizeof gpu);
    CHECKF(rg == 0, "%s on the GPU exited %d: %s", recipe, rg, gpu);
    if (rc != 0 || rg != 0) return;

    double a[64], b[64];
    int na = train_losses(cpu, recipe, a, 64), nb = train_losses(gpu, recipe, b, 64);
    /* the 12 progress lines come first; the summary's rows of the recipe
     * (more of them on the GPU: peak memory, MFU) follow and are not compared */
    CHECKF(na >= 12 && nb >= 12, "%s: %d CPU and %d GPU progress lines (want 12)", recipe, na, nb);
    if (na > 12) na = 12;
    if (nb > 12) nb = 12;
    double worst = 0;
    int at = 0;
    for (int i = 0; i < na && i < nb; i++) {
        double d = fabs(a[i] - b[i]) / fabs(a[i]);
        if (d > worst) {
            worst = d;
            at = i + 1;
        }
    }
    printf("  %-18s %-9s CPU %.4f -> %.4f, GPU %.4f -> %.4f, worst step %d off by %.2e (tolerance %.0e)\n", recipe,
           mode[0] ? mode : "resident", a[0], a[na - 1], b[0], b[nb - 1], at, worst, tol);
    CHECKF(worst <= tol, "%s: GPU loss at step %d is %.3e off the CPU's (tolerance %.0e)", recipe, at, worst, tol);
    CHECKF(a[na - 1] < a[0] && b[nb - 1] < b[0], "%s: the loss did not go down (CPU %.4f -> %.4f, GPU %.4f -> %.4f)",
           recipe, a[0], a[na - 1], b[0], b[nb - 1]);
    CHECKF(strstr(gpu, "MFU ") && strstr(gpu, "peak GPU memory") && strstr(gpu, "optimizer"),
           "%s: the GPU summary lacks the step split, MFU or peak memory: %s", recipe, gpu);
}

static void test_recipes_match_cpu(void)
{
    static const struct { const char *recipe; double tol; } cases[] = {
        {"f32", 1e-3},           {"bf16", 1e-2},           {"float8-tensorwise", 3e-2}, {"float8-rowwise", 3e-2},
        {"float8-delayed", 3e-2}, {"float8-blockwise", 3e-2}, {"nf4-qlora", 1e-2},         {"mxfp8", 3e-2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) one_recipe(cases[i].recipe, cases[i].tol, "");
    /* the engine's offload path: the same losses within the same bounds */
    one_recipe("bf16", 1e-2, "--offload");
    one_recipe("float8-tensorwise", 3e-2, "--offload");
    one_recipe("nf4-qlora", 1e-2, "--offload");
}

static void test_refusals(void)
{
    char out[4096], args[2048];
    /* what the GPU path does not do yet: one line naming it */
    snprintf(args, sizeof args, "train --device cuda --steps 1 --save /tmp/lpx-train-gpu-%d-ckpt --data '%s'",
             (int)getpid(), corpus);
    int rc = run_with_plugins(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "--save is not available on the GPU") && count_lines(out) == 1,
           "--device cuda --save: %d %s", rc, out);
}

int main(void)
{
    gpu_setup();
    exe = getenv("LPX_TEST_LPX_EXE");
    const char *c = getenv("LPX_TEST_CORPUS"), *cu = getenv("LPX_TEST_CUDA_PLUGIN"),
               *nc = getenv("LPX_TEST_NCCL_PLUGIN"), *mx = getenv("LPX_TEST_MX"), *mxc = getenv("LPX_TEST_MX_CUDA");
    if (!exe || !c || !nc || !*nc) {
        printf("SKIP: LPX_TEST_LPX_EXE, LPX_TEST_CORPUS or LPX_TEST_NCCL_PLUGIN is not set (lpx-nccl.so not built)\n");
        return GPU_SKIP;
    }
    snprintf(corpus, sizeof corpus, "%s", c);
    const char *plugins[] = {cu, nc, mx, mxc};
    size_t k = 0;
    for (size_t i = 0; i < sizeof plugins / sizeof *plugins; i++) {
        if (!plugins[i] || !*plugins[i]) continue;
        char d[1024], pat[1100];
        dir_of(plugins[i], d, sizeof d);
        snprintf(pat, sizeof pat, ":%s:", d);
        char have[4200];
        snprintf(have, sizeof have, ":%s:", plugin_path);
        if (strstr(have, pat)) continue;   /* a directory once (staged: all in one) */
        k += (size_t)snprintf(plugin_path + k, sizeof plugin_path - k, "%s%s", k ? ":" : "", d);
    }
    RUN(test_refusals);
    RUN(test_recipes_match_cpu);
    return CHECK_DONE();
}
