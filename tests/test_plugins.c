/* The plugin loader: each deliberately broken plugin of tests/plugins/ is
 * rejected with its specific reason and leaves the registry exactly as it
 * was (counts, kernel slots, names free again); good plugins load, once;
 * the LPX_PLUGIN_PATH scan and `lpx info` report loaded and skipped
 * plugins. Links the shared liblpx, as plugins do. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static const char *plugin_dir;   /* build dir of tests/plugins */
static const char *lpx_exe;

static const char *plugin(const char *name)
{
    static char buf[4][4096];
    static int i;
    char *b = buf[i++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s.so", plugin_dir, name);
    return b;
}

/* ---- registry snapshots --------------------------------------------- */

typedef struct snapshot {
    int dtypes, kinds, ops, backends, plugins;
    uint64_t *kernels;   /* bit key of op row: kernel present */
} snapshot;

static void take(snapshot *s)
{
    s->dtypes = lpx_dtype_count();
    s->kinds = lpx_kind_count();
    s->ops = lpx_op_count();
    s->backends = lpx_backend_count();
    s->plugins = lpx_plugin_count();
    s->kernels = calloc((size_t)s->ops, sizeof *s->kernels);
    for (int op = 0; op < s->ops; op++)
        for (int k = 1; k < LPX_NUM_KEYS; k++)
            if (lpx_kernel_exists(op, k)) s->kernels[op] |= UINT64_C(1) << k;
}

/* Checks that the registry matches `before`; frees both. */
static void check_unchanged(snapshot *before)
{
    snapshot now;
    take(&now);
    CHECKF(now.dtypes == before->dtypes, "dtypes %d -> %d", before->dtypes, now.dtypes);
    CHECKF(now.kinds == before->kinds, "kinds %d -> %d", before->kinds, now.kinds);
    CHECKF(now.ops == before->ops, "ops %d -> %d", before->ops, now.ops);
    CHECKF(now.backends == before->backends, "backends %d -> %d", before->backends, now.backends);
    CHECKF(now.plugins == before->plugins, "plugins %d -> %d", before->plugins, now.plugins);
    int n = now.ops < before->ops ? now.ops : before->ops;
    for (int op = 0; op < n; op++)
        CHECKF(now.kernels[op] == before->kernels[op], "kernel slots of op %s changed", lpx_op_name(op));
    free(now.kernels);
    free(before->kernels);
}

static const char *last_skip_reason(void)
{
    int n = lpx_plugin_skipped_count();
    return n ? lpx_plugin_skipped_reason(n - 1) : "";
}

/* A kind registered now gets the lowest free payload key: the one a
 * rolled-back kind had. Nothing may be left at it. */
static void check_payload_keys_clean(void)
{
    lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = "probe_kind",
                     .priority = LPX_PRIORITY_PAYLOAD};
    const lpx_kind *k = NULL;
    CHECK_OK(lpx_kind_register(&vt, &k));
    if (!k) return;
    int key = lpx_kind_key(k);
    for (int op = 0; op < lpx_op_count(); op++)
        CHECKF(!lpx_kernel_exists(op, key), "op %s still has a kernel at key %d", lpx_op_name(op), key);
    CHECK_ERR(lpx_fallback_unregister(key), LPX_ENOTFOUND);   /* no fallback left behind */
    CHECK_OK(lpx_kind_unregister(k));
}

/* ---- broken plugins -------------------------------------------------- */

static void test_wrong_abi_major(void)
{
    snapshot s;
    take(&s);
    int skipped = lpx_plugin_skipped_count();
    const lpx_plugin *p = (const lpx_plugin *)1;
    CHECK_ERR(lpx_plugin_load(plugin("lpx-test-badabi"), &p), LPX_EABI);
    CHECK(p == NULL);
    CHECKF(strstr(lpx_last_error(), "ABI 2.0") && strstr(lpx_last_error(), "speaks 1.0") &&
           strstr(lpx_last_error(), "lpx-test-badabi"), "%s", lpx_last_error());
    CHECK(lpx_plugin_skipped_count() == skipped + 1);
    CHECK(strstr(lpx_plugin_skipped_path(skipped), "lpx-test-badabi.so") != NULL);
    CHECK(strstr(last_skip_reason(), "majors differ") != NULL);
    CHECK(lpx_dtype_from_name("badabi_dt") < 0);
    check_unchanged(&s);
}

static void test_missing_entry_point(void)
{
    snapshot s;
    take(&s);
    CHECK_ERR(lpx_plugin_load(plugin("lpx-test-noentry"), NULL), LPX_EPLUGIN);
    CHECKF(strstr(lpx_last_error(), "no entry point") && strstr(lpx_last_error(), "lpx_plugin_init") &&
           strstr(lpx_last_error(), "lpx-test-noentry"), "%s", lpx_last_error());
    check_unchanged(&s);
}

static void test_init_fails_half_way(void)
{
    for (int round = 0; round < 2; round++) {   /* the second time proves the names are free */
        snapshot s;
        take(&s);
        CHECK_ERR(lpx_plugin_load(plugin("lpx-test-half"), NULL), LPX_EPLUGIN);
        CHECKF(strstr(lpx_last_error(), "'test-half'") && strstr(lpx_last_error(), "init failed") &&
               strstr(lpx_last_error(), "simulated failure"), "%s", lpx_last_error());
        CHECK(strstr(last_skip_reason(), "simulated failure") != NULL);
        CHECK(lpx_dtype_from_name("half_dt") < 0);
        CHECK(lpx_dtype_from_name("half_dt_direct") < 0);   /* registered without the host */
        lpx_op op;
        CHECK_ERR(lpx_op_find("half_op", &op), LPX_ENOTFOUND);
        const lpx_kind *k;
        CHECK_ERR(lpx_kind_find("half_kind", &k), LPX_ENOTFOUND);
        /* the comm backend too (it once stayed registered) */
        const lpx_comm_backend_i *cb = NULL;
        CHECK_ERR(lpx_comm_backend_find("half_comm", &cb), LPX_ENOTFOUND);
        for (int i = 0; i < lpx_comm_backend_count(); i++)
            CHECK(lpx_comm_backend_at(i) && strcmp(lpx_comm_backend_at(i)->name, "half_comm"));
        CHECK_ERR(lpx_plugin_find("test-half", &(const lpx_plugin *){0}), LPX_ENOTFOUND);
        check_unchanged(&s);
    }
    check_payload_keys_clean();
    /* the failed plugin stays mapped and kept its host pointer: using it
     * now is refused, not a use after free */
    void *h = dlopen(plugin("lpx-test-half"), RTLD_NOW | RTLD_NOLOAD);
    CHECK(h != NULL);
    lpx_status (*late)(void) = NULL;
    void *sym = h ? dlsym(h, "test_half_late_register") : NULL;
    if (sym) memcpy(&late, &sym, sizeof sym);
    CHECK(late != NULL);
    if (late) {
        CHECK_ERR(late(), LPX_EPLUGIN);
        CHECKF(strstr(lpx_last_error(), "outside lpx_plugin_init"), "%s", lpx_last_error());
        CHECK(lpx_dtype_from_name("half_late") < 0);
    }
    if (h) dlclose(h);
    /* the dtype slots were given back: the next dtype gets the old count */
    int before = lpx_dtype_count();
    lpx_dtype_traits t = *lpx_dtype_get(LPX_U8);
    t.name = "after_half";
    lpx_dtype d = -1;
    CHECK_OK(lpx_dtype_register(&t, &d));
    CHECK(d == before);
}

static void test_probe_declines(void)
{
    snapshot s;
    take(&s);
    CHECK_ERR(lpx_plugin_load(plugin("lpx-test-decline"), NULL), LPX_EPLUGIN);
    CHECKF(strstr(lpx_last_error(), "declined: no frobnicator device found"), "%s", lpx_last_error());
    CHECK(strstr(last_skip_reason(), "declined") != NULL);
    check_unchanged(&s);
}

static void test_bad_paths(void)
{
    snapshot s;
    take(&s);
    CHECK_ERR(lpx_plugin_load(NULL, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_plugin_load("", NULL), LPX_EINVAL);
    CHECK_ERR(lpx_plugin_load("/nonexistent/lpx-nothing.so", NULL), LPX_EPLUGIN);
    CHECKF(strstr(lpx_last_error(), "cannot open") && strstr(lpx_last_error(), "/nonexistent/lpx-nothing.so"),
           "%s", lpx_last_error());
    /* a file that is not a shared object */
    char tmp[] = "/tmp/lpx-test-notso-XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(write(fd, "not an ELF file\n", 16) == 16);
        close(fd);
        CHECK_ERR(lpx_plugin_load(tmp, NULL), LPX_EPLUGIN);
        CHECKF(strstr(lpx_last_error(), "not an ELF shared object (16 bytes)") != NULL, "%s", lpx_last_error());
        unlink(tmp);
    }
    check_unchanged(&s);
}

/* Retrying a failed load keeps one skipped entry per path, with the
 * newest reason, last (issue 33: every retry used to add an entry). */
static void test_retry_keeps_one_skip_entry(void)
{
    const char *bad = "/nonexistent/lpx-retry.so";
    CHECK_ERR(lpx_plugin_load(bad, NULL), LPX_EPLUGIN);
    int n = lpx_plugin_skipped_count();
    const char *first = lpx_plugin_skipped_reason(n - 1);
    for (int i = 0; i < 100; i++) CHECK_ERR(lpx_plugin_load(bad, NULL), LPX_EPLUGIN);
    CHECKF(lpx_plugin_skipped_count() == n, "100 retries of one bad path: %d skipped entries, not %d",
           lpx_plugin_skipped_count(), n);
    int mine = 0;
    for (int i = 0; i < lpx_plugin_skipped_count(); i++) mine += !strcmp(lpx_plugin_skipped_path(i), bad);
    CHECKF(mine == 1, "%d entries for %s", mine, bad);
    CHECK(!strcmp(lpx_plugin_skipped_path(n - 1), bad));
    CHECK(lpx_plugin_skipped_reason(n - 1) == first);   /* the same reason: the same string */
    /* another path fails in between: the retried one moves back to the end,
     * and a new reason for it replaces the old (which stays valid) */
    CHECK_ERR(lpx_plugin_load("/nonexistent/lpx-other.so", NULL), LPX_EPLUGIN);
    char tmp[] = "/tmp/lpx-test-retry-XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, "junk", 4) == 4);
    close(fd);
    CHECK_ERR(lpx_plugin_load(tmp, NULL), LPX_EPLUGIN);
    int m = lpx_plugin_skipped_count();
    for (int i = 0; i < 10; i++) CHECK_ERR(lpx_plugin_load(tmp, NULL), LPX_EPLUGIN);
    CHECK(lpx_plugin_skipped_count() == m);
    const char *junk = lpx_plugin_skipped_reason(m - 1);
    unlink(tmp);
    CHECK_ERR(lpx_plugin_load(tmp, NULL), LPX_EPLUGIN);   /* now gone: "cannot open" */
    CHECK(lpx_plugin_skipped_count() == m);
    CHECK(!strcmp(lpx_plugin_skipped_path(m - 1), tmp));
    CHECKF(strstr(lpx_plugin_skipped_reason(m - 1), "cannot open") != NULL, "%s", lpx_plugin_skipped_reason(m - 1));
    CHECKF(strstr(junk, "not an ELF") != NULL, "the replaced reason is no longer valid: %s", junk);
}

/* ---- plugins that load ---------------------------------------------- */

static void test_good_plugin_loads_once(void)
{
    int kinds = lpx_kind_count(), nplug = lpx_plugin_count();
    const lpx_plugin *p = NULL, *again = NULL, *found = NULL;
    CHECK_OK(lpx_plugin_load(plugin("lpx-test-badgather"), &p));
    CHECK(p != NULL);
    if (!p) return;
    CHECK(!strcmp(lpx_plugin_name(p), "test-badgather"));
    CHECK(!strcmp(lpx_plugin_version(p), "1.0"));
    CHECK(!strcmp(lpx_plugin_description(p), "a deliberately broken identity kind"));
    CHECK(strstr(lpx_plugin_path(p), "lpx-test-badgather.so") != NULL);
    uint32_t maj = 0, min = 9;
    lpx_plugin_abi(p, &maj, &min);
    CHECK(maj == LPX_PLUGIN_ABI_MAJOR && min == LPX_PLUGIN_ABI_MINOR);
    int nd, nops, nk, nkern, nfb, nbe;
    lpx_plugin_registered(p, &nd, &nops, &nk, &nkern, &nfb, &nbe);
    CHECK(nd == 0 && nops == 0 && nk == 1 && nkern == 1 && nfb == 0 && nbe == 0);
    CHECK(lpx_kind_count() == kinds + 1 && lpx_plugin_count() == nplug + 1);
    CHECK_OK(lpx_plugin_find("test-badgather", &found));
    CHECK(found == p);
    /* the same file again is the same plugin */
    CHECK_OK(lpx_plugin_load(plugin("lpx-test-badgather"), &again));
    CHECK(again == p && lpx_plugin_count() == nplug + 1);
    /* unloading is refused, cleanly */
    CHECK_ERR(lpx_plugin_unload(p), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "test-badgather") != NULL);
    const lpx_kind *k = NULL;
    CHECK_OK(lpx_kind_find("test-badgather", &k));
}

/* A second file holding an already loaded plugin: refused by name, and
 * its registration attempts are refused before they happen. */
static void test_duplicate_name(void)
{
    CHECK_OK(lpx_plugin_load(plugin("lpx-test-badgather"), NULL));
    char copy[] = "/tmp/lpx-test-dup-XXXXXX";
    int fd = mkstemp(copy);
    CHECK(fd >= 0);
    if (fd < 0) return;
    FILE *src = fopen(plugin("lpx-test-badgather"), "rb");
    CHECK(src != NULL);
    char buf[65536];
    size_t n;
    while (src && (n = fread(buf, 1, sizeof buf, src)) > 0) CHECK(write(fd, buf, n) == (ssize_t)n);
    if (src) fclose(src);
    close(fd);
    snapshot s;
    take(&s);
    CHECK_ERR(lpx_plugin_load(copy, NULL), LPX_EPLUGIN);
    CHECKF(strstr(lpx_last_error(), "duplicate plugin name 'test-badgather'"), "%s", lpx_last_error());
    check_unchanged(&s);
    unlink(copy);
}

/* Rollbacks while another thread dispatches and looks the plugin's names
 * up: retired entries and rows stay valid, so the reader never crashes
 * (ASan checks), and built-in ops keep working throughout. */
static atomic_int stop_worker, worker_errors, worker_iters;

static void *dispatch_worker(void *arg)
{
    (void)arg;
    int64_t shape[1] = {16};
    lpx_tensor *x = NULL;
    if (lpx_zeros(1, shape, LPX_F32, lpx_cpu(), &x)) { atomic_fetch_add(&worker_errors, 1); return NULL; }
    while (!atomic_load(&stop_worker)) {
        lpx_tensor *y = NULL;
        if (lpx_add(x, x, &y) != LPX_OK) atomic_fetch_add(&worker_errors, 1);
        lpx_tensor_release(y);
        lpx_op op;
        if (lpx_op_find("half_op", &op) == LPX_OK) {   /* may be rolled back under us */
            lpx_value v[1] = {lpx_v_tensor(x)};
            lpx_call c;
            lpx_call_init(&c, op, v, 1);
            if (lpx_dispatch(&c) == LPX_OK) lpx_call_release_rets(&c);
        }
        const lpx_kind *k;
        (void)lpx_kind_find("half_kind", &k);
        (void)lpx_dtype_from_name("half_dt");
        atomic_fetch_add(&worker_iters, 1);
    }
    lpx_tensor_release(x);
    return NULL;
}

static void test_rollback_under_concurrent_dispatch(void)
{
    snapshot s;
    take(&s);
    pthread_t th;
    atomic_store(&stop_worker, 0);
    CHECK(pthread_create(&th, NULL, dispatch_worker, NULL) == 0);
    int refused = 0, loads = 0;
    /* at least 200 rollbacks, and on a loaded machine keep going until the
     * worker has really dispatched alongside them (bounded) */
    while (loads < 200 || (atomic_load(&worker_iters) < 10 && loads < 20000)) {
        refused += lpx_plugin_load(plugin("lpx-test-half"), NULL) == LPX_EPLUGIN;
        loads++;
    }
    atomic_store(&stop_worker, 1);
    pthread_join(th, NULL);
    CHECK(refused == loads);
    CHECK(atomic_load(&worker_errors) == 0);
    CHECK(atomic_load(&worker_iters) > 0);
    check_unchanged(&s);
}

/* Every allocation of a whole load of lpx-mx.so failing in turn: each
 * failure is reported and rolled back, until the load goes through. */
LPX_API void lpx__fail_alloc_after(long n);   /* test hook of liblpx */

static void test_out_of_memory_rolls_back(void)
{
    const char *mx = getenv("LPX_TEST_MX");
    if (!mx) SKIP_CASE("LPX_TEST_MX is not set (meson sets it)");
    int ok = 0, fails = 0;
    for (long n = 0; n < 2000 && !ok; n++) {
        snapshot s;
        take(&s);
        lpx__fail_alloc_after(n);
        lpx_status st = lpx_plugin_load(mx, NULL);
        lpx__fail_alloc_after(-1);
        if (st == LPX_OK) {
            ok = 1;
            free(s.kernels);
            break;
        }
        fails++;
        CHECKF(lpx_last_error()[0] != 0, "allocation %ld: failed without a message", n);
        CHECK(lpx_dtype_from_name("e8m0") < 0 && lpx_dtype_from_name("f4e2m1") < 0);
        const lpx_kind *k;
        if (lpx_kind_find("mxfp4", &k) == LPX_OK) CHECKF(0, "allocation %ld: kind mxfp4 left behind", n);
        check_unchanged(&s);
    }
    CHECK(ok);
    CHECKF(fails > 10, "only %d allocation points", fails);
    const lpx_plugin *p;
    CHECK_OK(lpx_plugin_find("mx", &p));
}

/* ---- the LPX_PLUGIN_PATH scan, through `lpx info` --------------------- */

static int run_with_path(const char *dirs, const char *args, char *out, size_t len)
{
    char cmd[16384];
    /* bounded: a loader that blocks (a FIFO in the path did) fails the test
     * instead of hanging it */
    snprintf(cmd, sizeof cmd, "LPX_PLUGIN_PATH='%.8000s' timeout 60 '%.4000s' %.200s 2>&1", dirs, lpx_exe, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_scan_and_info(void)
{
    if (!lpx_exe) SKIP_CASE("LPX_TEST_LPX_EXE is not set (meson sets it)");
    static char out[65536];
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s::/nonexistent/plugin/dir", plugin_dir);
    CHECK(run_with_path(dirs, "info", out, sizeof out) == 0);
    CHECKF(strstr(out, "plugins (3 loaded"), "%s", out);
    CHECK(strstr(out, "test-badgather 1.0") && strstr(out, "test-hang 1.0") && strstr(out, "test-segv 1.0"));
    CHECK(strstr(out, "lpx-test-badabi.so: built for plugin ABI 2.0") != NULL);
    CHECK(strstr(out, "lpx-test-noentry.so: no entry point") != NULL);
    CHECK(strstr(out, "lpx-test-half.so: init failed") != NULL);
    CHECK(strstr(out, "lpx-test-decline.so: declined: no frobnicator device found") != NULL);
    CHECK(strstr(out, "/nonexistent/plugin/dir: cannot read plugin directory") != NULL);
    /* the kinds the scan loaded are in the registry */
    CHECK(strstr(out, "test-badgather(key") != NULL);
    CHECK(run_with_path("", "info", out, sizeof out) == 0);
    CHECKF(strstr(out, "plugins: none loaded"), "%s", out);
    /* LPX_PLUGIN_PATH unset: every command finds the shipped lpx-mx.so the
     * same way (lpx info and lpx conformance did not, lpx train did) */
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "env -u LPX_PLUGIN_PATH timeout 60 '%.4000s' info 2>&1", lpx_exe);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    if (p) CHECK(pclose(p) == 0);
    CHECKF(strstr(out, "mx 0.1.0") && strstr(out, "mxfp4(key"), "%s", out);
    snprintf(cmd, sizeof cmd, "env -u LPX_PLUGIN_PATH timeout 120 '%.4000s' conformance --kind mxfp8 2>&1", lpx_exe);
    p = popen(cmd, "r");
    n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    if (p) CHECKF(pclose(p) == 0, "lpx conformance --kind mxfp8 without LPX_PLUGIN_PATH: %s", out);
    CHECKF(strstr(out, " 0 failed"), "%s", out);
}

/* copies the first `keep` bytes of src to dst (all when keep < 0), then
 * writes `patch` bytes at `at` (when patch) */
static bool copy_file(const char *src, const char *dst, long keep, long at, const void *patch, size_t np)
{
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    bool ok = in && out;
    char buf[65536];
    long done = 0;
    size_t k;
    while (ok && (keep < 0 || done < keep) && (k = fread(buf, 1, sizeof buf, in)) > 0) {
        if (keep >= 0 && done + (long)k > keep) k = (size_t)(keep - done);
        ok = fwrite(buf, 1, k, out) == k;
        done += (long)k;
    }
    if (ok && patch) ok = fseek(out, at, SEEK_SET) == 0 && fwrite(patch, 1, np, out) == np;
    if (in) fclose(in);
    if (out) fclose(out);
    return ok;
}

/* Junk in LPX_PLUGIN_PATH: each file is skipped with its reason, and the
 * process neither hangs (a FIFO blocked dlopen forever) nor dies (a
 * truncated ELF raised SIGBUS in the loader): every lpx process scans it
 * at init. Loaded by path too, with the same reasons. */
static void test_junk_in_plugin_path(void)
{
    char dir[] = "/tmp/lpx-test-junk-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    char p[5][600];
    const char *names[5] = {"lpx-fifo.so", "lpx-trunc.so", "lpx-dir.so", "lpx-foreign.so", "lpx-empty.so"};
    for (int i = 0; i < 5; i++) snprintf(p[i], sizeof p[i], "%s/%s", dir, names[i]);
    CHECK(mkfifo(p[0], 0600) == 0);
    CHECK(copy_file(plugin("lpx-test-badgather"), p[1], 6000, 0, NULL, 0));
    CHECK(mkdir(p[2], 0700) == 0);
    const unsigned char machine[2] = {0x02, 0x00};   /* e_machine 2: SPARC */
    CHECK(copy_file(plugin("lpx-test-badgather"), p[3], -1, 18, machine, 2));
    CHECK(copy_file(plugin("lpx-test-badgather"), p[4], 0, 0, NULL, 0));
    const char *why[5] = {"not a regular file (a FIFO)", "truncated or damaged ELF", "not a regular file (a directory)",
                          "an ELF file for another machine", "not an ELF shared object (0 bytes)"};
    snapshot s;
    take(&s);
    for (int i = 0; i < 5; i++) {
        CHECK_ERR(lpx_plugin_load(p[i], NULL), LPX_EPLUGIN);
        CHECKF(strstr(lpx_last_error(), why[i]) != NULL, "%s: %s", names[i], lpx_last_error());
    }
    check_unchanged(&s);
    if (lpx_exe) {
        static char out[65536];
        int rc = run_with_path(dir, "info", out, sizeof out);
        CHECKF(rc == 0, "lpx info with junk in LPX_PLUGIN_PATH exited %d: %s", rc, out);
        for (int i = 0; i < 5; i++)
            if (i != 2) CHECKF(strstr(out, why[i]) != NULL, "lpx info does not name %s: %s", names[i], out);
    }
    for (int i = 0; i < 5; i++) (i == 2 ? rmdir : unlink)(p[i]);
    rmdir(dir);
}

int main(void)
{
    plugin_dir = getenv("LPX_TEST_PLUGIN_DIR");
    lpx_exe = getenv("LPX_TEST_LPX_EXE");
    if (!plugin_dir) {
        printf("LPX_TEST_PLUGIN_DIR not set: skipping\n");
        return 77;
    }
    unsetenv("LPX_PLUGIN_PATH");   /* this process loads plugins by path only */
    CHECK_OK(lpx_init());
    RUN(test_wrong_abi_major);
    RUN(test_missing_entry_point);
    RUN(test_init_fails_half_way);
    RUN(test_probe_declines);
    RUN(test_bad_paths);
    RUN(test_retry_keeps_one_skip_entry);
    RUN(test_junk_in_plugin_path);
    RUN(test_good_plugin_loads_once);
    RUN(test_duplicate_name);
    RUN(test_scan_and_info);
    RUN(test_rollback_under_concurrent_dispatch);
    RUN(test_out_of_memory_rolls_back);
    return CHECK_DONE();
}
