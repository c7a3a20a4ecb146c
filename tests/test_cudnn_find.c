/* Where lpx-cuda looks for cuDNN (backends/cuda/cuda_cudnn_find.c), on
 * the CPU: the search order as a pure function over paths, the opener
 * stopping at the first library that loads and saying where it looked when
 * none does; and, when lpx-cuda.so is built, that asking it for its
 * attention path (which opens cuDNN) writes no environment variable: the
 * cuDNN frontend's setting is made once in lpx_plugin_init, never on the
 * first attention call, where rank threads may be reading the environment
 * (issue 34, item 7). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../backends/cuda/cuda_cudnn_find.h"
#include "check.h"

static char cands[CU_CUDNN_MAX_CANDIDATES][CU_CUDNN_PATH_MAX];

static void expect_list(const char *what, size_t n, const char *const *want, size_t nwant)
{
    CHECKF(n == nwant, "%s: %zu candidates, expected %zu", what, n, nwant);
    for (size_t i = 0; i < n && i < nwant; i++)
        CHECKF(!strcmp(cands[i], want[i]), "%s: candidate %zu is '%s', expected '%s'", what, i, cands[i], want[i]);
}

static void test_order_without_env(void)
{
    const char *loaded[] = {
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so",
        "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so",   /* the same folder: once */
        "/usr/lib/python3/dist-packages/lpx/_lib/lpx-cuda.so",            /* Debian's python */
        "/venv/lib/python3.12/site-packages/",                            /* cu_loaded_objects' form */
    };
    size_t n = cu_cudnn_candidates(NULL, loaded, 5, cands, CU_CUDNN_MAX_CANDIDATES);
    const char *want[] = {"libcudnn.so.9", "/venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
                          "/usr/lib/python3/dist-packages/nvidia/cudnn/lib/libcudnn.so.9"};
    expect_list("no LPX_CUDNN_PATH", n, want, 3);
    /* nothing loaded from site-packages: the loader's search alone */
    n = cu_cudnn_candidates("", loaded, 1, cands, CU_CUDNN_MAX_CANDIDATES);
    expect_list("nothing under site-packages", n, want, 1);
}

static void test_order_with_env(void)
{
    const char *loaded[] = {"/a/site-packages/b/site-packages/torch/lib/libtorch.so"};   /* the innermost */
    size_t n = cu_cudnn_candidates("/opt/cudnn/lib::/x/libcudnn.so.9.1.0:/y//:/opt/cudnn/lib/", loaded, 1, cands,
                                   CU_CUDNN_MAX_CANDIDATES);
    const char *want[] = {"libcudnn.so.9", "/opt/cudnn/lib/libcudnn.so.9", "/x/libcudnn.so.9.1.0",
                          "/y/libcudnn.so.9", "/a/site-packages/b/site-packages/nvidia/cudnn/lib/libcudnn.so.9"};
    expect_list("LPX_CUDNN_PATH", n, want, 5);
    /* the list is bounded, and an over-long entry is left out, not cut */
    char big[CU_CUDNN_PATH_MAX + 16];
    memset(big, 'd', sizeof big - 1);
    big[0] = '/';
    big[sizeof big - 1] = '\0';
    n = cu_cudnn_candidates(big, NULL, 0, cands, CU_CUDNN_MAX_CANDIDATES);
    expect_list("over-long entry", n, want, 1);
    n = cu_cudnn_candidates("/opt/cudnn/lib", NULL, 0, cands, 1);
    expect_list("max_out 1", n, want, 1);
}

/* a fake loader: records each path, loads only `ok` */
static char opened[8][CU_CUDNN_PATH_MAX];
static int n_opened;
static const char *ok_path;
static char last_err[CU_CUDNN_PATH_MAX + 64];

static void *fake_open(const char *file, int flags)
{
    (void)flags;
    if (n_opened < 8) snprintf(opened[n_opened++], CU_CUDNN_PATH_MAX, "%s", file);
    if (ok_path && !strcmp(file, ok_path)) return (void *)&n_opened;
    snprintf(last_err, sizeof last_err, "%s: cannot open shared object file: No such file or directory", file);
    return NULL;
}

static char *fake_error(void)
{
    static char copy[sizeof last_err];
    if (!last_err[0]) return NULL;
    memcpy(copy, last_err, sizeof copy);
    last_err[0] = '\0';
    return copy;
}

static char tmp[256];

static void touch(const char *path)
{
    FILE *f = fopen(path, "w");
    CHECKF(f != NULL, "cannot create %s", path);
    if (f) fclose(f);
}

static void test_open_first_that_loads(void)
{
    /* tmp/site-packages/nvidia/cudnn/lib/libcudnn.so.9 exists, the
     * LPX_CUDNN_PATH folder has none, the loader's search fails */
    char sp[320], lib[400], loaded[400], envdir[320], d[400];
    snprintf(sp, sizeof sp, "%s/site-packages", tmp);
    const char *parts[] = {"", "/nvidia", "/nvidia/cudnn", "/nvidia/cudnn/lib"};
    for (int i = 0; i < 4; i++) {
        snprintf(d, sizeof d, "%s%s", sp, parts[i]);
        mkdir(d, 0700);
    }
    snprintf(lib, sizeof lib, "%s/nvidia/cudnn/lib/libcudnn.so.9", sp);
    touch(lib);
    snprintf(loaded, sizeof loaded, "%s/torch/lib/libtorch_cuda.so", sp);
    snprintf(envdir, sizeof envdir, "%s/empty", tmp);
    mkdir(envdir, 0700);
    const char *lp[] = {loaded};
    char chosen[CU_CUDNN_PATH_MAX], looked[2048];
    n_opened = 0;
    ok_path = lib;
    void *h = cu_cudnn_open(fake_open, fake_error, 0, envdir, lp, 1, chosen, sizeof chosen, looked, sizeof looked);
    CHECK(h == (void *)&n_opened);
    CHECKF(!strcmp(chosen, lib), "chose '%s', expected '%s'", chosen, lib);
    /* the name first, the absent file in LPX_CUDNN_PATH never opened, then site-packages */
    CHECKF(n_opened == 2, "opened %d candidates", n_opened);
    if (n_opened == 2) {
        CHECKF(!strcmp(opened[0], "libcudnn.so.9"), "first opened '%s'", opened[0]);
        CHECKF(!strcmp(opened[1], lib), "second opened '%s'", opened[1]);
    }
    CHECKF(strstr(looked, "libcudnn.so.9: cannot open") && strstr(looked, "/empty/libcudnn.so.9: absent"),
           "looked: %s", looked);
    /* the loader's own search wins when it works: nothing else is tried */
    n_opened = 0;
    ok_path = "libcudnn.so.9";
    h = cu_cudnn_open(fake_open, fake_error, 0, envdir, lp, 1, chosen, sizeof chosen, looked, sizeof looked);
    CHECK(h != NULL && n_opened == 1 && !strcmp(chosen, "libcudnn.so.9") && looked[0] == '\0');
}

static void test_open_none_says_where(void)
{
    char loaded[400], chosen[CU_CUDNN_PATH_MAX], looked[2048];
    snprintf(loaded, sizeof loaded, "%s/nowhere/site-packages/torch/lib/libtorch.so", tmp);
    const char *lp[] = {loaded};
    n_opened = 0;
    ok_path = NULL;
    void *h = cu_cudnn_open(fake_open, fake_error, 0, NULL, lp, 1, chosen, sizeof chosen, looked, sizeof looked);
    CHECK(h == NULL && chosen[0] == '\0');
    CHECKF(strstr(looked, "libcudnn.so.9: cannot open") && strstr(looked, "LPX_CUDNN_PATH not set") &&
               strstr(looked, "/nowhere/site-packages/nvidia/cudnn/lib/libcudnn.so.9: absent"),
           "looked: %s", looked);
    /* no site-packages among the loaded libraries: said too */
    h = cu_cudnn_open(fake_open, fake_error, 0, NULL, NULL, 0, chosen, sizeof chosen, looked, sizeof looked);
    CHECKF(h == NULL && strstr(looked, "no loaded library lives under a Python site-packages folder"), "looked: %s",
           looked);
    /* a short buffer is cut, never overrun */
    char small[24];
    memset(small, 'x', sizeof small);
    h = cu_cudnn_open(fake_open, fake_error, 0, NULL, lp, 1, chosen, sizeof chosen, small, 16);
    CHECK(h == NULL && strlen(small) < 16 && small[17] == 'x');
}

static void test_loaded_objects(void)
{
    static char objs[16][CU_CUDNN_PATH_MAX];
    size_t n = cu_loaded_objects(objs, 16);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(objs[i]);
        CHECKF(len > 15 && (strstr(objs[i], "/site-packages/") || strstr(objs[i], "/dist-packages/")) &&
                   objs[i][len - 1] == '/',
               "loaded entry '%s' is not a site-packages folder", objs[i]);
    }
}

#ifdef LPX_TEST_HAVE_CUDA_PLUGIN
/* every write of the environment in this process, counted (the
 * executable's definitions come first in the global scope: -rdynamic) */
static int env_writes;
static char env_last[128];

#define FORWARD(name, ret, params, args)                                      \
    ret name params                                                           \
    {                                                                         \
        env_writes++;                                                         \
        snprintf(env_last, sizeof env_last, "%s", #name);                     \
        ret(*real) params = NULL;                                             \
        void *sym = dlsym(RTLD_NEXT, #name);                                  \
        memcpy(&real, &sym, sizeof sym);                                      \
        return real ? real args : -1;                                         \
    }
FORWARD(setenv, int, (const char *n, const char *v, int o), (n, v, o))
FORWARD(unsetenv, int, (const char *n), (n))
FORWARD(putenv, int, (char *s), (s))

static void test_no_setenv_on_first_attention(void)
{
    const char *path = getenv("LPX_TEST_CUDA_PLUGIN");
    if (!path || !path[0]) SKIP_CASE("LPX_TEST_CUDA_PLUGIN not set (meson sets it)");
    /* loaded directly, without lpx_plugin_load: the probe would decline
     * on a machine without a GPU, and init is where the write belongs */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECKF(h != NULL, "dlopen %s: %s", path, dlerror());
    if (!h) return;
    int (*attention_path)(char *, size_t) = NULL;
    void *sym = dlsym(h, "lpx_cuda_attention_path");
    memcpy(&attention_path, &sym, sizeof sym);
    CHECK(attention_path != NULL);
    if (attention_path) {
        char buf[4096];
        env_writes = 0;
        attention_path(buf, sizeof buf);   /* opens cuDNN, as the first attention call does */
        attention_path(buf, sizeof buf);
        printf("  attention path here: %s\n", buf);
        CHECKF(env_writes == 0, "opening cuDNN wrote the environment (%d calls, last %s)", env_writes, env_last);
        /* the library loaded is named by its file, or the places looked at are */
        CHECKF(strstr(buf, "fused SDPA (/") || strstr(buf, "(looked: libcudnn.so.9") ||
                   strstr(buf, "LPX_CUDA_ATTENTION=reference"),
               "attention path names neither the cuDNN file nor where it looked: %s", buf);
    }
    /* lpx-cuda.so stays loaded: the frontend's statics outlive this test */
}
#endif

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/lpx_cudnn_find_XXXXXX");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_order_without_env);
    RUN(test_order_with_env);
    RUN(test_open_first_that_loads);
    RUN(test_open_none_says_where);
    RUN(test_loaded_objects);
#ifdef LPX_TEST_HAVE_CUDA_PLUGIN
    RUN(test_no_setenv_on_first_attention);
#endif
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return CHECK_DONE();
}
