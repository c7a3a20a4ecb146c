/* The plugin loader: dlopen, probe, init inside a registration journal,
 * validation of what the plugin declared, rollback on any failure, and the
 * lists of loaded and skipped plugins that `lpx info` shows.
 *
 * Policy on the shared object itself: it is dlclosed when init never ran
 * (cannot open, no entry point, another copy of liblpx, declined by its
 * probe, out of memory before init). Once init ran it stays mapped even
 * when the load fails: init may have handed out pointers into it
 * (deleters of tensors it created, threads, atexit handlers) that no
 * rollback can see. The record of a load whose probe or init ran is never
 * freed, since the plugin may have kept its host pointer. */
#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plugin_internal.h"

/* one load at a time: registration rollback assumes the journal's entries
 * are the newest plugin registrations */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
/* the lists below; held briefly, never while plugin code runs */
static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;

static lpx_plugin **loaded;
static int nloaded, caploaded;
static lpx_plugin *failed;   /* records of failed loads whose init ran (load_lock) */

/* One entry per path (a retried failure replaces its entry, which moves to
 * the end: the list stays bounded by the distinct paths tried). The
 * strings are valid for the process (plugin.h), so a reason that is
 * replaced is kept in `old`, once per distinct text: a path failing the
 * same way on every retry adds nothing. */
typedef struct skipped_entry {
    char *path;
    char *reason;   /* the newest */
    char **old;     /* earlier distinct reasons, still lent out */
    int nold;
} skipped_entry;
static skipped_entry *skipped;
static int nskipped, capskipped;

/* ---- lists ---------------------------------------------------------- */

/* Makes `reason` the newest reason of entry `e`; false when out of memory
 * (the entry unchanged). list_lock held. */
static bool set_reason(skipped_entry *e, const char *reason)
{
    if (!strcmp(e->reason, reason)) return true;
    for (int i = 0; i < e->nold; i++)
        if (!strcmp(e->old[i], reason)) {   /* an earlier text again: swap it back in */
            char *t = e->old[i];
            e->old[i] = e->reason;
            e->reason = t;
            return true;
        }
    char *r = lpx_strdup(reason);
    char **v = r ? lpx_realloc(e->old, (size_t)(e->nold + 1) * sizeof *v) : NULL;
    if (!v) { lpx_free(r); return false; }
    e->old = v;
    e->old[e->nold++] = e->reason;
    e->reason = r;
    return true;
}

void lpx_plugin_add_skipped(const char *path, const char *reason)
{
    pthread_mutex_lock(&list_lock);
    for (int i = 0; i < nskipped; i++) {
        if (strcmp(skipped[i].path, path)) continue;
        skipped_entry e = skipped[i];
        if (set_reason(&e, reason)) {   /* newest failure last, as a new entry would be */
            memmove(&skipped[i], &skipped[i + 1], (size_t)(nskipped - i - 1) * sizeof *skipped);
            skipped[nskipped - 1] = e;
        }
        pthread_mutex_unlock(&list_lock);
        return;
    }
    if (nskipped == capskipped) {
        int cap = capskipped ? 2 * capskipped : 8;
        skipped_entry *v = lpx_realloc(skipped, (size_t)cap * sizeof *v);
        if (!v) { pthread_mutex_unlock(&list_lock); return; } /* the error itself was reported */
        skipped = v;
        capskipped = cap;
    }
    char *p = lpx_strdup(path), *r = lpx_strdup(reason);
    if (p && r) {
        skipped[nskipped] = (skipped_entry){.path = p, .reason = r};
        nskipped++;
    } else {
        lpx_free(p);
        lpx_free(r);
    }
    pthread_mutex_unlock(&list_lock);
}

/* Makes room for one more loaded plugin before its init runs, so that a
 * successful init can always be recorded (never registered and lost). */
static lpx_status reserve_loaded(void)
{
    lpx_status st = LPX_OK;
    pthread_mutex_lock(&list_lock);
    if (nloaded == caploaded) {
        int cap = caploaded ? 2 * caploaded : 8;
        lpx_plugin **v = lpx_realloc(loaded, (size_t)cap * sizeof *v);
        if (!v) st = lpx_error(LPX_ENOMEM, "lpx_plugin_load: cannot grow the plugin list");
        else { loaded = v; caploaded = cap; }
    }
    pthread_mutex_unlock(&list_lock);
    return st;
}

static void add_loaded(lpx_plugin *p)
{
    pthread_mutex_lock(&list_lock);
    LPX_ASSERT(nloaded < caploaded);
    loaded[nloaded++] = p;
    pthread_mutex_unlock(&list_lock);
}

/* Loaded plugin named `name` or whose file is `real`, or NULL. */
static lpx_plugin *find_loaded(const char *name, const char *real)
{
    lpx_plugin *found = NULL;
    pthread_mutex_lock(&list_lock);
    for (int i = 0; i < nloaded && !found; i++)
        if ((name && !strcmp(loaded[i]->name, name)) || (real && !strcmp(loaded[i]->real, real)))
            found = loaded[i];
    pthread_mutex_unlock(&list_lock);
    return found;
}

int lpx_plugin_count(void)
{
    pthread_mutex_lock(&list_lock);
    int n = nloaded;
    pthread_mutex_unlock(&list_lock);
    return n;
}

const lpx_plugin *lpx_plugin_at(int i)
{
    pthread_mutex_lock(&list_lock);
    const lpx_plugin *p = i >= 0 && i < nloaded ? loaded[i] : NULL;
    pthread_mutex_unlock(&list_lock);
    return p;
}

lpx_status lpx_plugin_find(const char *name, const lpx_plugin **out)
{
    if (!name || !out) return lpx_error(LPX_EINVAL, "lpx_plugin_find: %s is NULL", name ? "out" : "name");
    *out = find_loaded(name, NULL);
    return *out ? LPX_OK : lpx_error(LPX_ENOTFOUND, "lpx_plugin_find: no plugin named '%s' is loaded", name);
}

const char *lpx_plugin_name(const lpx_plugin *p) { return p ? p->name : NULL; }
const char *lpx_plugin_version(const lpx_plugin *p) { return p ? p->version : NULL; }
const char *lpx_plugin_description(const lpx_plugin *p) { return p ? p->description : NULL; }
const char *lpx_plugin_path(const lpx_plugin *p) { return p ? p->path : NULL; }

void *lpx_plugin_symbol(const lpx_plugin *p, const char *name)
{
    if (!p || !name || !p->handle) return NULL;
    return dlsym(p->handle, name);
}

void lpx_plugin_abi(const lpx_plugin *p, uint32_t *major, uint32_t *minor)
{
    if (major) *major = p ? p->abi_major : 0;
    if (minor) *minor = p ? p->abi_minor : 0;
}

void lpx_plugin_registered(const lpx_plugin *p, int *dtypes, int *ops, int *kinds, int *kernels,
                           int *fallbacks, int *backends)
{
    if (dtypes) *dtypes = p ? p->counts[LPX_REG_DTYPE] : 0;
    if (ops) *ops = p ? p->counts[LPX_REG_OP] : 0;
    if (kinds) *kinds = p ? p->counts[LPX_REG_KIND] : 0;
    if (kernels) *kernels = p ? p->counts[LPX_REG_KERNEL] : 0;
    if (fallbacks) *fallbacks = p ? p->counts[LPX_REG_FALLBACK] : 0;
    if (backends) *backends = p ? p->counts[LPX_REG_BACKEND] : 0;
}

int lpx_plugin_skipped_count(void)
{
    pthread_mutex_lock(&list_lock);
    int n = nskipped;
    pthread_mutex_unlock(&list_lock);
    return n;
}

const char *lpx_plugin_skipped_path(int i)
{
    pthread_mutex_lock(&list_lock);
    const char *s = i >= 0 && i < nskipped ? skipped[i].path : NULL;
    pthread_mutex_unlock(&list_lock);
    return s;
}

const char *lpx_plugin_skipped_reason(int i)
{
    pthread_mutex_lock(&list_lock);
    const char *s = i >= 0 && i < nskipped ? skipped[i].reason : NULL;
    pthread_mutex_unlock(&list_lock);
    return s;
}

lpx_status lpx_plugin_unload(const lpx_plugin *p)
{
    return lpx_error(LPX_ENOTIMPL,
                     "lpx_plugin_unload(%s): plugins cannot be unloaded: dispatch tables, dtype traits "
                     "and live tensors may hold pointers into the plugin for the life of the process",
                     p ? p->name : "NULL");
}

/* ---- validation of what init declared ------------------------------ */

static bool name_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= LPX_PLUGIN_NAME_MAX - 1 || !(isalnum((unsigned char)s[n]) || strchr("_.-", s[n])))
            return false;
    return n > 0;
}

/* Bounded copy of a plugin string; false if it does not fit. */
static bool copy_str(char *dst, size_t cap, const char *src)
{
    if (!src) { dst[0] = 0; return true; }
    size_t n = strnlen(src, cap);
    if (n >= cap) return false;
    memcpy(dst, src, n + 1);
    return true;
}

/* Checks the info header; `reason` gets why it is unusable. Reads only
 * the fields struct_size covers. */
static lpx_status check_info(const lpx_plugin *p, char *reason, size_t len)
{
    const lpx_plugin_info *in = p->info;
    size_t sz = in->struct_size;
    if (sz == LPX_PLUGIN_INFO_CAPACITY) {
        snprintf(reason, len, "init did not fill info (struct_size still %zu)", sz);
        return LPX_EPLUGIN;
    }
    if (sz < offsetof(lpx_plugin_info, abi_minor) + sizeof in->abi_minor) {
        snprintf(reason, len, "info.struct_size %zu is smaller than the ABI 1.0 header (%zu bytes)", sz,
                 (size_t)LPX_PLUGIN_INFO_HEADER_SIZE);
        return LPX_EPLUGIN;
    }
    if (sz > LPX_PLUGIN_INFO_CAPACITY) {
        snprintf(reason, len, "info.struct_size %zu exceeds the %d bytes the loader provides", sz,
                 LPX_PLUGIN_INFO_CAPACITY);
        return LPX_EPLUGIN;
    }
    if (in->abi_major != LPX_PLUGIN_ABI_MAJOR) {
        snprintf(reason, len, "built for plugin ABI %u.%u, this lpx speaks %u.%u (majors differ)", in->abi_major,
                 in->abi_minor, LPX_PLUGIN_ABI_MAJOR, LPX_PLUGIN_ABI_MINOR);
        return LPX_EABI;
    }
    if (sz < LPX_PLUGIN_INFO_HEADER_SIZE) {
        snprintf(reason, len, "info.struct_size %zu is smaller than the ABI 1.0 header (%zu bytes)", sz,
                 (size_t)LPX_PLUGIN_INFO_HEADER_SIZE);
        return LPX_EPLUGIN;
    }
    if (!in->name || !name_ok(in->name)) {
        snprintf(reason, len, "info.name is %s (1..%d chars of [A-Za-z0-9_.-])",
                 in->name ? "invalid" : "NULL", LPX_PLUGIN_NAME_MAX - 1);
        return LPX_EPLUGIN;
    }
    const lpx_plugin *other = find_loaded(in->name, NULL);
    if (other) {
        snprintf(reason, len, "duplicate plugin name '%s' (already loaded from %.400s)", in->name, other->path);
        return LPX_EPLUGIN;
    }
    return LPX_OK;
}

lpx_status lpx_plugin_gate(void *ctx, const char *what)
{
    lpx_plugin *p = ctx;
    if (!p->info)  /* the probe runs with no info: it may not register */
        return lpx_error(LPX_EPLUGIN, "plugin at %s: %s called from lpx_plugin_probe, which must not register",
                         p->path, what);
    char reason[512];
    lpx_status st = check_info(p, reason, sizeof reason);
    if (st)
        return lpx_error(st, "plugin at %s: %s refused: %s (fill info before registering)", p->path, what, reason);
    return LPX_OK;
}

/* ---- loading -------------------------------------------------------- */

/* Records the failure and sets the message. `name` may be "". */
static lpx_status fail(lpx_status st, const char *path, const char *name, const char *reason)
{
    char msg[1200];
    if (name && name[0])
        snprintf(msg, sizeof msg, "plugin '%.63s' (%.400s): %.700s", name, path, reason);
    else
        snprintf(msg, sizeof msg, "plugin %.400s: %.700s", path, reason);
    lpx_plugin_add_skipped(path, reason);
    return lpx_error(st, "lpx_plugin_load: %s", msg);
}

/* The file that defines `addr`, for messages. */
static const char *object_of(const void *addr)
{
    Dl_info di;
    return dladdr(addr, &di) && di.dli_fname ? di.dli_fname : "?";
}

/* dlopen, entry point, copy-of-liblpx check. Closes on failure. */
static lpx_status open_plugin(lpx_plugin *p, lpx_plugin_init_fn *init, lpx_plugin_probe_fn *probe)
{
    char reason[1024];
    /* what can be checked before dlopen maps the file (plugins/elf_check.c):
     * a FIFO, a truncated or foreign ELF is skipped with a reason instead
     * of hanging or faulting the process */
    if (!lpx_plugin_file_ok(p->path, reason, sizeof reason)) return fail(LPX_EPLUGIN, p->path, "", reason);
    dlerror();
    p->handle = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
    if (!p->handle) {
        const char *e = dlerror();
        snprintf(reason, sizeof reason, "cannot open: %s", e ? e : "dlopen failed");
        return fail(LPX_EPLUGIN, p->path, "", reason);
    }
    /* POSIX lets dlsym return an object pointer; copy it into a function pointer */
    void *sym = dlsym(p->handle, "lpx_plugin_init");
    if (!sym) {
        dlclose(p->handle);
        return fail(LPX_EPLUGIN, p->path, "",
                    "no entry point: the library does not export lpx_plugin_init (declare it LPX_PLUGIN_EXPORT)");
    }
    memcpy(init, &sym, sizeof sym);
    sym = dlsym(p->handle, "lpx_plugin_probe");
    if (sym) memcpy(probe, &sym, sizeof sym);
    else *probe = NULL;
    /* A plugin that links liblpx must reach this very copy of it: a host
     * linked statically would hand the plugin a second, empty registry. */
    sym = dlsym(p->handle, "lpx_plugin_load");
    lpx_status (*self)(const char *, const lpx_plugin **) = lpx_plugin_load;
    void *mine;
    memcpy(&mine, &self, sizeof mine);
    if (sym && sym != mine) {
        snprintf(reason, sizeof reason,
                 "the plugin links another copy of liblpx (%s) than the host's (%s); link the host "
                 "against the shared liblpx", object_of(sym), object_of(mine));
        dlclose(p->handle);
        return fail(LPX_EPLUGIN, p->path, "", reason);
    }
    return LPX_OK;
}

static lpx_status run_probe(lpx_plugin *p, lpx_plugin_probe_fn probe)
{
    char why[256] = "";
    lpx_status st = lpx_journal_open(&p->journal, lpx_plugin_gate, p);
    if (st) return st;
    int r = probe(&p->host, why, sizeof why);
    lpx_journal_close(&p->journal);
    lpx_journal_free(&p->journal);
    if (r == 0) return LPX_OK;
    why[sizeof why - 1] = 0;
    char reason[512];
    snprintf(reason, sizeof reason, "declined: %s", why[0] ? why : "(no reason given)");
    dlclose(p->handle);
    return fail(LPX_EPLUGIN, p->path, "", reason);
}

/* Validates the info that init (which returned `ist`) left in p->info and,
 * when it is usable, copies name, version, description and ABI into p.
 * `reason` gets why not; `name` (LPX_PLUGIN_NAME_MAX bytes) the plugin's
 * name whenever it is valid, for the failure message. */
static lpx_status accept_info(lpx_plugin *p, lpx_status ist, char *reason, size_t len, char *name)
{
    lpx_status st = LPX_OK;
    lpx_status vst = check_info(p, reason, len);
    if (vst != LPX_EABI && p->info->struct_size >= LPX_PLUGIN_INFO_HEADER_SIZE &&
        p->info->struct_size <= LPX_PLUGIN_INFO_CAPACITY && p->info->name && name_ok(p->info->name))
        copy_str(name, LPX_PLUGIN_NAME_MAX, p->info->name);
    if (vst == LPX_EABI) {
        st = LPX_EABI;  /* the most specific reason, whatever init returned */
    } else if (ist != LPX_OK) {
        const char *msg = lpx_last_error();
        snprintf(reason, len, "init failed: %s%s%s", lpx_status_string(ist), msg[0] ? ": " : "", msg);
        st = LPX_EPLUGIN;
    } else if (vst) {
        st = vst;
    } else if (!copy_str(p->version, sizeof p->version, p->info->version ? p->info->version : "") ||
               (p->info->struct_size >= offsetof(lpx_plugin_info, description) + sizeof(const char *) &&
                !copy_str(p->description, sizeof p->description, p->info->description))) {
        snprintf(reason, len, "info.version or info.description is too long");
        st = LPX_EPLUGIN;
    }
    if (!st) {
        copy_str(p->name, sizeof p->name, p->info->name);
        p->abi_major = p->info->abi_major;
        p->abi_minor = p->info->abi_minor;
    }
    return st;
}

/* Test hook (tests/fuzz/fuzz_plugin_info.c; internal, not exported): the
 * validation lpx_plugin_load applies to what a successful init declared,
 * on `info` (LPX_PLUGIN_INFO_CAPACITY bytes), without dlopen. */
lpx_status lpx__plugin_accept_info(lpx_plugin_info *info, char *reason, size_t len)
{
    lpx_plugin *p = lpx_calloc(1, sizeof *p);
    if (!p) return LPX_ENOMEM;
    char name[LPX_PLUGIN_NAME_MAX] = "";
    p->path = p->real = "(fuzz)";
    p->info = info;
    lpx_status st = accept_info(p, LPX_OK, reason, len, name);
    lpx_free(p);
    return st;
}

/* Runs init in a journal; on any failure rolls back and reports. */
static lpx_status run_init(lpx_plugin *p, lpx_plugin_init_fn init)
{
    _Alignas(16) unsigned char info_buf[LPX_PLUGIN_INFO_CAPACITY];
    memset(info_buf, 0, sizeof info_buf);
    p->info = (lpx_plugin_info *)info_buf;
    p->info->struct_size = LPX_PLUGIN_INFO_CAPACITY;  /* on entry: room available */

    lpx_status st = lpx_journal_open(&p->journal, lpx_plugin_gate, p);
    if (st) { p->info = NULL; return st; }
    lpx_clear_error();
    lpx_status ist = init(&p->host, p->info);
    lpx_journal_close(&p->journal);

    char reason[1024], name[LPX_PLUGIN_NAME_MAX] = "";
    st = accept_info(p, ist, reason, sizeof reason, name);
    p->info = NULL;   /* the buffer dies with this frame */
    if (st) {
        lpx_journal_rollback(&p->journal);
        lpx_journal_free(&p->journal);
        atomic_store(&p->state, PLUGIN_FAILED);
        return fail(st, p->path, name, reason);
    }
    for (int w = 0; w <= LPX_REG_COMM_BACKEND; w++) p->counts[w] = lpx_journal_count(&p->journal, (lpx_reg_what)w);
    lpx_journal_free(&p->journal);
    return LPX_OK;
}

lpx_status lpx_plugin_load(const char *path, const lpx_plugin **out)
{
    if (out) *out = NULL;
    if (!path || !path[0]) return lpx_error(LPX_EINVAL, "lpx_plugin_load: path is %s", path ? "empty" : "NULL");
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (strlen(path) > LPX_PLUGIN_PATH_MAX)
        return lpx_error(LPX_EINVAL, "lpx_plugin_load: path is longer than %d bytes", LPX_PLUGIN_PATH_MAX);
    if (lpx_journal_active())
        return lpx_error(LPX_EPLUGIN, "lpx_plugin_load(%s): called from inside a plugin's init or probe", path);

    pthread_mutex_lock(&load_lock);
    char real[PATH_MAX];
    const char *key = realpath(path, real) ? real : path;
    lpx_plugin *same = find_loaded(NULL, key);
    if (same) {
        /* the same file again: loading is idempotent */
        pthread_mutex_unlock(&load_lock);
        if (out) *out = same;
        return LPX_OK;
    }
    size_t lp = strlen(path) + 1, lk = strlen(key) + 1;
    lpx_plugin *p = lpx_calloc(1, sizeof *p + lp + lk);
    if (!p) {
        pthread_mutex_unlock(&load_lock);
        return lpx_error(LPX_ENOMEM, "lpx_plugin_load(%s): cannot allocate the plugin record", path);
    }
    memcpy(p->strs, path, lp);
    memcpy(p->strs + lp, key, lk);
    p->path = p->strs;
    p->real = p->strs + lp;
    atomic_init(&p->state, PLUGIN_LOADING);
    lpx_host_init(p);

    lpx_plugin_init_fn init = NULL;
    lpx_plugin_probe_fn probe = NULL;
    st = open_plugin(p, &init, &probe);
    if (st) {
        lpx_free(p);   /* none of its code ran: record and library go */
        pthread_mutex_unlock(&load_lock);
        return st;
    }
    if (probe) st = run_probe(p, probe);   /* closes the library when it declines */
    if (!st && (st = reserve_loaded())) dlclose(p->handle);
    if (!st) st = run_init(p, init);
    if (!st) {
        add_loaded(p);
        atomic_store(&p->state, PLUGIN_LOADED);
    }
    if (st) {
        /* kept, never freed: the plugin's code ran and may hold &p->host */
        atomic_store(&p->state, PLUGIN_FAILED);
        p->failed_next = failed;
        failed = p;
    }
    pthread_mutex_unlock(&load_lock);
    if (!st && out) *out = p;
    return st;
}
