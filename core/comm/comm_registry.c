/* Comm backends by name, so a command line's `--comm NAME` can pick one.
 * "local" is in the table from the start (no init step to forget); plugins
 * such as lpx-mpi.so register theirs. Entries are never removed, like
 * plugins are never unloaded, so a returned pointer stays valid. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "comm_internal.h"

#define MAX_BACKENDS 16
#define NAME_MAX_LEN 31

typedef struct entry {
    lpx_comm_backend_i b;     /* name/description point at the arrays below */
    char name[NAME_MAX_LEN + 1];
    char description[128];
} entry;

static entry table[MAX_BACKENDS] = {
    [0] = {.b = {.struct_size = sizeof(lpx_comm_backend_i), .name = table[0].name,
                 .description = table[0].description, .run = lpx__local_backend_run},
           .name = "local",
           .description = "N ranks as N threads of this process (bit-reproducible reductions)"},
};
static atomic_int count = 1;   /* published with release after an entry is filled */
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
    pthread_mutex_lock(&mu);
    int n = atomic_load_explicit(&count, memory_order_relaxed);
    for (int i = 0; i < n; i++)
        if (!strcmp(table[i].name, b->name)) {
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
    atomic_store_explicit(&count, n + 1, memory_order_release);
    pthread_mutex_unlock(&mu);
    return LPX_OK;
}

int lpx_comm_backend_count(void) { return atomic_load_explicit(&count, memory_order_acquire); }

const lpx_comm_backend_i *lpx_comm_backend_at(int i)
{
    return i >= 0 && i < lpx_comm_backend_count() ? &table[i].b : NULL;
}

lpx_status lpx_comm_backend_find(const char *name, const lpx_comm_backend_i **out)
{
    if (!name || !out) return lpx_error(LPX_EINVAL, "lpx_comm_backend_find: %s is NULL", name ? "out" : "name");
    *out = NULL;
    int n = lpx_comm_backend_count();
    for (int i = 0; i < n; i++)
        if (!strcmp(table[i].name, name)) {
            *out = &table[i].b;
            return LPX_OK;
        }
    char known[256] = "";
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof known; i++)
        len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", table[i].name);
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
