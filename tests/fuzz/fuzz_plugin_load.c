/* Fuzz target: lpx_plugin_load on a real shared object. The plugin,
 * lpx-fuzz-plugin.so (fuzz_plugin_so.c), reads the fuzz input through
 * `lpx_fuzz_plugin_script` (fuzz_plugin_script.h, exported from this
 * executable) and does what it says: decline in its probe, declare any
 * lpx_plugin_info (sizes, ABI, names), register dtypes, ops, kinds,
 * kernels, typed kernels, fallbacks and backends in any order (before or
 * after filling info, with valid or hostile names), load a plugin from
 * inside init, keep a tensor of its kind alive, rewrite info afterwards,
 * and fail at any step with any status. So every input is one real
 * dlopen + probe + init through the journal, and the loader's
 * validation and rollback run on it.
 *
 * Checks, besides no crash/leak/UB:
 *  - a failed load returns LPX_EPLUGIN or LPX_EABI with a message naming
 *    the path, records it in the skipped list, and leaves the registry as
 *    it was: counts of dtypes, ops, kinds, backends and plugins, and no
 *    kernel or fallback the plugin registered;
 *  - a successful load adds one plugin, findable by its name, whose
 *    lpx_plugin_registered counts equal the registrations init made, and
 *    those kernels and fallbacks exist;
 *  - a tensor of the plugin's kind kept past a failed load stays valid
 *    (its kind was retired, not freed) until released;
 *  - registrations from the probe, and loads from inside init, fail.
 *
 * A successful load is permanent (plugins cannot be unloaded, and loading
 * a loaded path again is a no-op), so each success uses a fresh hard link
 * (or copy) of the .so; after FZP_PATHS successes every init is told to
 * fail in the end (force_fail), which keeps the rollback paths fuzzed.
 * A failed load's record stays allocated by design (the plugin may keep
 * its host pointer): about 2.5 KB of RSS per input under ASan (the record
 * holds its paths sized to fit), so after FZP_MAX_LOADS inputs the target
 * stops loading rather than grow without bound; a 1M-input run needs
 * -rss_limit_mb=4096 (docs/RELIABILITY.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "fuzz_util.h"
#include "fuzz_plugin_script.h"

LPX_PLUGIN_EXPORT fzp_script lpx_fuzz_plugin_script;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZP_PATHS 64
#define FZP_MAX_LOADS 1100000

static char dir[256];
static char paths[FZP_PATHS + 1][512];   /* [FZP_PATHS]: the one that never succeeds */
static int successes;
static long loads;

static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    char buf[65536];
    ssize_t n;
    int rc = in < 0 || out < 0 ? -1 : 0;
    while (!rc && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) rc = -1;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    return rc;
}

static void cleanup(void)
{
    for (int i = 0; i <= FZP_PATHS; i++) unlink(paths[i]);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_init();
    const char *so = getenv("LPX_FUZZ_PLUGIN_SO");
#ifdef LPX_FUZZ_PLUGIN_SO
    if (!so) so = LPX_FUZZ_PLUGIN_SO;
#endif
    if (!so) {
        fprintf(stderr, "fuzz: LPX_FUZZ_PLUGIN_SO (path of lpx-fuzz-plugin.so) is not set\n");
        abort();
    }
    snprintf(dir, sizeof dir, "/tmp/lpx-fuzz-plugin-XXXXXX");
    if (!mkdtemp(dir)) abort();
    for (int i = 0; i <= FZP_PATHS; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/lpx-fz%02d.so", dir, i);
        if (link(so, paths[i]) && copy_file(so, paths[i])) {
            fprintf(stderr, "fuzz: cannot link or copy %s to %s: %s\n", so, paths[i], strerror(errno));
            abort();
        }
    }
    atexit(cleanup);
    return 0;
}

typedef struct snap {
    int dtypes, ops, kinds, backends, plugins, skipped;
} snap;

static void take(snap *s)
{
    s->dtypes = lpx_dtype_count();
    s->ops = lpx_op_count();
    s->kinds = lpx_kind_count();
    s->backends = lpx_backend_count();
    s->plugins = lpx_plugin_count();
    s->skipped = lpx_plugin_skipped_count();
}

static lpx_status probe_fb(lpx_call *c)
{
    (void)c;
    return LPX_OK;
}

/* Whether `key` has a fallback: registering another one is LPX_EEXIST
 * then (when it is free, the probe's registration is undone at once). */
static bool has_fallback(int key)
{
    lpx_status st = lpx_fallback_register(key, probe_fb, NULL);
    if (st == LPX_OK) lpx_fallback_unregister(key);
    return st == LPX_EEXIST;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (++loads > FZP_MAX_LOADS) {
        if (loads == FZP_MAX_LOADS + 1)
            fprintf(stderr, "fuzz: %d loads done; each failed load keeps its record (~9 KB) by design, so no "
                            "more loads in this process: restart the fuzzer to go on\n", FZP_MAX_LOADS);
        return 0;
    }
    fzp_script *s = &lpx_fuzz_plugin_script;
    memset(s, 0, sizeof *s);
    s->data = data;
    s->size = size;
    s->plugin_load = lpx_plugin_load;
    s->kind_register = lpx_kind_register;
    s->op_register = lpx_op_register;
    s->tensor_new = lpx_tensor_new;
    s->tensor_new_kind = lpx_tensor_new_kind;
    s->tensor_release = lpx_tensor_release;
    s->kind_key = lpx_kind_key;
    s->error = lpx_error;
    const char *path = paths[successes < FZP_PATHS ? successes : FZP_PATHS];
    s->force_fail = successes >= FZP_PATHS;

    snap before, after;
    take(&before);
    /* a path that failed before keeps one entry, moved to the end with the
     * newest reason (the list does not grow on retries) */
    bool listed = false;
    for (int i = 0; i < before.skipped && !listed; i++) listed = !strcmp(lpx_plugin_skipped_path(i), path);
    const lpx_plugin *p = NULL;
    lpx_clear_error();
    lpx_status st = lpx_plugin_load(path, &p);
    take(&after);
    const char *msg = lpx_last_error();

    FZ_ASSERT(s->registered[0] < 1000);   /* no nested load went through */
    if (st == LPX_OK) {
        FZ_ASSERT(p != NULL);
        FZ_ASSERT(s->init_ran);
        FZ_ASSERT(!s->force_fail);
        successes++;
        FZ_ASSERT(after.plugins == before.plugins + 1 && after.skipped == before.skipped);
        const lpx_plugin *q = NULL;
        FZ_ASSERT(lpx_plugin_find(lpx_plugin_name(p), &q) == LPX_OK && q == p);
        int c[6];
        lpx_plugin_registered(p, &c[0], &c[1], &c[2], &c[3], &c[4], &c[5]);
        for (int i = 0; i < 6; i++) FZ_ASSERT(c[i] == s->registered[i]);
        FZ_ASSERT(after.dtypes == before.dtypes + c[0] && after.ops == before.ops + c[1] &&
                  after.kinds == before.kinds + c[2] && after.backends == before.backends + c[5]);
        for (int i = 0; i < s->nkernels; i++) FZ_ASSERT(lpx_kernel_exists(s->kernels[i].op, s->kernels[i].key));
        for (int i = 0; i < s->nfallbacks; i++) FZ_ASSERT(has_fallback(s->fallback_keys[i]));
    } else {
        FZ_ASSERT(p == NULL);
        FZ_ASSERT(st == LPX_EPLUGIN || st == LPX_EABI);
        FZ_ASSERT(msg[0] && strstr(msg, path));
        FZ_ASSERT(after.skipped == before.skipped + (listed ? 0 : 1));
        FZ_ASSERT(!strcmp(lpx_plugin_skipped_path(after.skipped - 1), path));
        /* rolled back: the registry is as before */
        FZ_ASSERT(after.dtypes == before.dtypes && after.ops == before.ops && after.kinds == before.kinds &&
                  after.backends == before.backends && after.plugins == before.plugins);
        /* kernels on ops that existed before are gone (the plugin's own ops
         * are gone with theirs); a kernel or fallback registered only if
         * its slot was free, so the slot is free again */
        for (int i = 0; i < s->nkernels; i++)
            if (s->kernels[i].op < before.ops) FZ_ASSERT(!lpx_kernel_exists(s->kernels[i].op, s->kernels[i].key));
        for (int i = 0; i < s->nfallbacks; i++) FZ_ASSERT(!has_fallback(s->fallback_keys[i]));
        for (int i = 0; i < s->nkinds; i++) {
            const lpx_kind *k = NULL;
            const char *n = lpx_kind_name(s->kinds[i]);
            FZ_ASSERT(n && lpx_kind_find(n, &k) != LPX_OK);   /* unregistered */
        }
    }
    if (s->kept) {
        /* the tensor outlives its kind's rollback: the handle was retired, not freed */
        FZ_ASSERT(lpx_tensor_kind(s->kept) != NULL && lpx_tensor_numel(s->kept) == 4);
        FZ_ASSERT(lpx_kind_name(lpx_tensor_kind(s->kept)) != NULL);
        lpx_tensor_release(s->kept);
        s->kept = NULL;
    }
    return 0;
}
