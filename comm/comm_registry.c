/* Comm backends by name, so a command line's `--comm NAME` can pick one.
 * "local" is registered first, by lpx_init (backends/local/local_run.c,
 * called from the composition root: comm does not name its backends);
 * plugins such as lpx-mpi.so register theirs, through the plugin load journal: a
 * plugin whose init fails after registering one leaves none behind. A
 * retired entry stays in the table (a returned pointer stays valid) but is
 * found by no lookup, and its name can be registered again. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "comm_internal.h"
#include "../core/lpx_internal.h"

#define MAX_BACKENDS 16
#define NAME_MAX_LEN 31

typedef struct entry {
    lpx_comm_backend_i b;     /* name/description point at the arrays below */
    atomic_bool retired;      /* rolled back with a failed plugin load */
    char name[NAME_MAX_LEN + 1];
    char description[128];
} entry;

static entry table[MAX_BACKENDS];
static atomic_int count;       /* published with release after an entry is filled */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

lpx_status lpx_comm_backend_register(const lpx_comm_backend_i *b)
{
    if (!b) return lpx_error(LPX_EINVAL, "lpx_comm_backend_register: backend is NULL");
    if (b->struct_size < offsetof(lpx_comm_backend_i, run) + sizeof b->run)
        return lpx_error(LPX_EINVAL, "lpx_comm_backend_register: struct_size %zu is too small",
                         b->struct_size);
    if (!b->name || !*b->name || strlen(b->name) > NAME_MAX_LEN)
        return lpx_error(LPX_EINVAL, "lpx_comm_backend_register: name must have 1..%d chars",
                         NAME_MAX_LEN);
    if (!b->run)
        return lpx_error(LPX_EINVAL, "lpx_comm_backend_register: backend '%s' has no run", b->name);
    lpx_status st = lpx__journal_reserve("lpx_comm_backend_register");
    if (st) return st;
    pthread_mutex_lock(&mu);
    int n = atomic_load_explicit(&count, memory_order_relaxed);
    for (int i = 0; i < n; i++)
        if (!atomic_load(&table[i].retired) && !strcmp(table[i].name, b->name)) {
            pthread_mutex_unlock(&mu);
            return lpx_error(LPX_EEXIST, "lpx_comm_backend_register: comm backend '%s' already exists",
                             b->name);
        }
    if (n == MAX_BACKENDS) {
        pthread_mutex_unlock(&mu);
        return lpx_error(LPX_EFULL, "lpx_comm_backend_register: %d comm backends already registered",
                         MAX_BACKENDS);
    }
    entry *e = &table[n];
    memset(e, 0, sizeof *e);
    size_t sz = b->struct_size < sizeof e->b ? b->struct_size : sizeof e->b;
    memcpy(&e->b, b, sz);
    e->b.struct_size = sizeof e->b;
    snprintf(e->name, sizeof e->name, "%s", b->name);
    snprintf(e->description, sizeof e->description, "%s", b->description ? b->description : "");
    e->b.name = e->name;
    e->b.description = e->description;
    atomic_store(&e->retired, false);
    atomic_store_explicit(&count, n + 1, memory_order_release);
    pthread_mutex_unlock(&mu);
    lpx__journal_note(LPX_REG_COMM_BACKEND, n, 0, NULL);
    return LPX_OK;
}

void lpx__comm_backend_unregister(int index)
{
    pthread_mutex_lock(&mu);
    if (index > 0 && index < atomic_load_explicit(&count, memory_order_relaxed)) atomic_store(&table[index].retired, true);
    pthread_mutex_unlock(&mu);
}

/* the table index of live backend i, or -1 */
static int live_at(int i)
{
    int n = atomic_load_explicit(&count, memory_order_acquire);
    for (int k = 0; k < n; k++)
        if (!atomic_load(&table[k].retired) && i-- == 0) return k;
    return -1;
}

int lpx_comm_backend_count(void)
{
    int n = atomic_load_explicit(&count, memory_order_acquire), live = 0;
    for (int k = 0; k < n; k++) live += !atomic_load(&table[k].retired);
    return live;
}

const lpx_comm_backend_i *lpx_comm_backend_at(int i)
{
    int k = i >= 0 ? live_at(i) : -1;
    return k >= 0 ? &table[k].b : NULL;
}

lpx_status lpx_comm_backend_find(const char *name, const lpx_comm_backend_i **out)
{
    if (!name || !out) return lpx_error(LPX_EINVAL, "lpx_comm_backend_find: %s is NULL", name ? "out" : "name");
    *out = NULL;
    int n = atomic_load_explicit(&count, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (!atomic_load(&table[i].retired) && !strcmp(table[i].name, name)) {
            *out = &table[i].b;
            return LPX_OK;
        }
    char known[256] = "";
    size_t len = 0;
    for (int i = 0, shown = 0; i < n && len < sizeof known; i++)
        if (!atomic_load(&table[i].retired))
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", shown++ ? ", " : "", table[i].name);
    return lpx_error(LPX_ENOTFOUND, "no comm backend '%s' (registered: %s; load lpx-%s.so first?)",
                     name, known, name);
}

lpx_status lpx_comm_run(const char *backend, int nranks, int64_t timeout_ms, lpx_comm_rank_fn fn,
                        void *ctx, lpx_status *statuses)
{
    const lpx_comm_backend_i *b;
    lpx_status st = lpx_comm_backend_find(backend, &b);
    if (st) return st;
    return b->run(b, nranks, timeout_ms, fn, ctx, statuses);
}
