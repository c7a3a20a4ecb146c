/* GPU suite, run last: every op that has a kernel at the cuda key (those
 * of lpx-cuda.so, and of lpx-mx-cuda.so when it is given) was dispatched
 * there by at least one program of the suite. The other programs write
 * what they dispatched to $LPX_TEST_GPU_COVERAGE/<program>.ops at exit
 * (gpu_util.h); this one reads those files and names each op with a CUDA
 * kernel that no program reached, so a kernel added without a GPU test
 * fails the suite. The directory is cleared before each whole-suite run
 * (`make test-gpu`, gpu-stage's run-gpu.sh); run alone, this test checks
 * whatever the last run left there. Skips (77) without a GPU. */
#include <dirent.h>
#include "gpu_util.h"

#define MAX_OPS 1024

static int covered[MAX_OPS];

/* Marks the ops named in file path (one per line); returns the number of
 * names it did not know (an op renamed since the file was written). */
static int read_ops(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("  cannot read %s\n", path);
        return 1;
    }
    char line[256];
    int unknown = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) continue;
        lpx_op op;
        if (lpx_op_find(line, &op) || op < 0 || op >= MAX_OPS) {
            unknown++;
            continue;
        }
        covered[op] = 1;
    }
    fclose(f);
    return unknown;
}

/* The MX plugin and its CUDA kernels, when the build has them, so their
 * ops at the cuda key are required too. */
static void load_optional(const char *var)
{
    const char *path = getenv(var);
    if (path && *path && lpx_plugin_load(path, NULL))
        printf("  %s=%s: %s (its ops are not checked)\n", var, path, lpx_last_error());
}

static void test_every_cuda_kernel_is_exercised(void)
{
    const char *dir = getenv("LPX_TEST_GPU_COVERAGE");
    CHECKF(dir && *dir, "LPX_TEST_GPU_COVERAGE is not set");
    if (!dir || !*dir) return;
    load_optional("LPX_TEST_MX");
    load_optional("LPX_TEST_MX_CUDA");
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot open %s: run the whole GPU suite first", dir);
    if (!d) return;
    int files = 0, unknown = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".ops")) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unknown += read_ops(path);
        files++;
    }
    closedir(d);
    CHECKF(files > 0, "no coverage files in %s: run the whole GPU suite first", dir);
    int key = lpx_device_key(LPX_DEVICE_CUDA), with_kernel = 0, missed = 0;
    CHECK(key >= 0);
    for (int op = 0; op < lpx_op_count() && op < MAX_OPS; op++) {
        if (!lpx_kernel_exists((lpx_op)op, key)) continue;
        with_kernel++;
        if (!covered[op]) {
            printf("  op '%s' has a CUDA kernel that no GPU test dispatches\n", lpx_op_name((lpx_op)op));
            missed++;
        }
    }
    printf("  cuda coverage: %d ops with a CUDA kernel, %d dispatched by the suite (%d programs)%s\n", with_kernel,
           with_kernel - missed, files, unknown ? ", some names in the files are not ops any more" : "");
    CHECK(lpx_op_count() <= MAX_OPS);
    CHECK(with_kernel > 0);
    CHECKF(missed == 0, "%d ops with CUDA kernels are not exercised by the GPU suite", missed);
}

int main(void)
{
    gpu_setup();
    RUN(test_every_cuda_kernel_is_exercised);
    return CHECK_DONE();
}
