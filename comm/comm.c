/* The lpx_comm handle: creation around a backend vtable, rank/size,
 * timeout, abort, destroy and the statistics counters. The validated
 * collective calls are in comm_api.c. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "comm_internal.h"

const char *lpx_coll_name(lpx_coll kind)
{
    switch (kind) {
    case LPX_COLL_ALL_GATHER: return "all_gather";
    case LPX_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case LPX_COLL_ALL_REDUCE: return "all_reduce";
    case LPX_COLL_BROADCAST: return "broadcast";
    case LPX_COLL_BARRIER: return "barrier";
    default: return "?";
    }
}

const char *lpx_reduce_op_name(lpx_reduce_op op)
{
    switch (op) {
    case LPX_REDUCE_SUM: return "sum";
    case LPX_REDUCE_AVG: return "avg";
    case LPX_REDUCE_MAX: return "max";
    case LPX_REDUCE_MIN: return "min";
    default: return "?";
    }
}

/* LPX_COMM_TIMEOUT_MS if it holds a positive integer, else the default. */
static int64_t default_timeout_ms(void)
{
    const char *s = getenv("LPX_COMM_TIMEOUT_MS");
    if (s && *s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (*end == 0 && v > 0) return (int64_t)v;
    }
    return LPX_COMM_DEFAULT_TIMEOUT_MS;
}

void *lpx_comm_backend_state(const lpx_comm *comm, const lpx_comm_i *vt)
{
    if (!comm || !vt) return NULL;
    bool same = comm->vt.all_gather == vt->all_gather && comm->vt.reduce_scatter == vt->reduce_scatter &&
                comm->vt.all_reduce == vt->all_reduce;
    return same ? comm->self : NULL;
}

lpx_status lpx_comm_new(const lpx_comm_i *vt, void *self, lpx_comm **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_comm_new: out is NULL");
    *out = NULL;
    if (!vt) return lpx_error(LPX_EINVAL, "lpx_comm_new: vtable is NULL");
    if (vt->struct_size < offsetof(lpx_comm_i, destroy) + sizeof vt->destroy)
        return lpx_error(LPX_EINVAL, "lpx_comm_new: vtable struct_size %zu is smaller than the "
                         "ABI 1 vtable (%zu)", vt->struct_size,
                         offsetof(lpx_comm_i, destroy) + sizeof vt->destroy);
    if (vt->abi_version != LPX_COMM_ABI_VERSION)
        return lpx_error(LPX_EABI, "lpx_comm_new: backend '%s' speaks comm ABI %u, lpx speaks %u",
                         vt->name ? vt->name : "?", vt->abi_version, LPX_COMM_ABI_VERSION);
    const char *missing = !vt->name ? "name" : !vt->rank ? "rank" : !vt->size ? "size"
        : !vt->all_gather ? "all_gather" : !vt->reduce_scatter ? "reduce_scatter"
        : !vt->all_reduce ? "all_reduce" : !vt->broadcast ? "broadcast"
        : !vt->barrier ? "barrier" : !vt->abort ? "abort" : !vt->destroy ? "destroy" : NULL;
    if (missing)
        return lpx_error(LPX_EINVAL, "lpx_comm_new: backend '%s' has no '%s' slot",
                         vt->name ? vt->name : "?", missing);
    int rank = vt->rank(self), size = vt->size(self);
    if (size < 1 || rank < 0 || rank >= size)
        return lpx_error(LPX_EINVAL, "lpx_comm_new: backend '%s' reports rank %d of size %d",
                         vt->name, rank, size);
    lpx_comm *c = lpx_calloc(1, sizeof *c);
    if (!c) return lpx_error(LPX_ENOMEM, "lpx_comm_new: out of memory");
    memcpy(&c->vt, vt, vt->struct_size < sizeof c->vt ? vt->struct_size : sizeof c->vt);
    c->vt.struct_size = sizeof c->vt;
    c->self = self;
    c->rank = rank;
    c->size = size;
    atomic_init(&c->timeout_ms, default_timeout_ms());
    *out = c;
    return LPX_OK;
}

void lpx_comm_destroy(lpx_comm *comm)
{
    if (!comm) return;
    comm->vt.destroy(comm->self);
    lpx_free(comm);
}

int lpx_comm_rank(const lpx_comm *comm) { return comm ? comm->rank : -1; }
int lpx_comm_size(const lpx_comm *comm) { return comm ? comm->size : 0; }
const char *lpx_comm_backend_name(const lpx_comm *comm) { return comm ? comm->vt.name : "?"; }

lpx_status lpx_comm_caps_get(const lpx_comm *comm, lpx_comm_caps *out)
{
    const size_t v1 = offsetof(lpx_comm_caps, host_all_gather) + sizeof(bool);
    if (!comm || !out || out->struct_size < v1)
        return lpx_error(LPX_EINVAL, "lpx_comm_caps_get: %s", !comm || !out ? "NULL argument" : "struct_size too small");
    lpx_comm_caps c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.device = lpx_cpu();
    if (comm->vt.caps) {
        lpx_status st = comm->vt.caps(comm->self, &c);
        if (st) return st;
        c.struct_size = sizeof c;
    }
    /* the host all-gather needs all three slots */
    if (!comm->vt.all_gather_host || !comm->vt.wait_ticket || !comm->vt.sync_ticket) c.host_all_gather = false;
    size_t n = out->struct_size < sizeof c ? out->struct_size : sizeof c;
    c.struct_size = n;
    memcpy(out, &c, n);
    return LPX_OK;
}

static lpx_status no_slot(const lpx_comm *comm, const char *fn)
{
    if (!comm) return lpx_error(LPX_EINVAL, "%s: comm is NULL", fn);
    return lpx_error(LPX_ENOTIMPL, "%s: comm backend '%s' has no host all-gather (lpx_comm_caps.host_all_gather)",
                     fn, comm->vt.name);
}

lpx_status lpx_comm_all_gather_host(lpx_comm *comm, const void *send, void *recv, size_t nbytes, uint64_t *ticket)
{
    if (ticket) *ticket = 0;
    if (!comm || !comm->vt.all_gather_host) return no_slot(comm, "lpx_comm_all_gather_host");
    return comm->vt.all_gather_host(comm->self, comm, send, recv, nbytes, ticket);
}

lpx_status lpx_comm_wait_ticket(lpx_comm *comm, uint64_t ticket)
{
    if (!comm || !comm->vt.wait_ticket) return no_slot(comm, "lpx_comm_wait_ticket");
    return comm->vt.wait_ticket(comm->self, comm, ticket);
}

lpx_status lpx_comm_sync_ticket(lpx_comm *comm, uint64_t ticket)
{
    if (!comm || !comm->vt.sync_ticket) return no_slot(comm, "lpx_comm_sync_ticket");
    return comm->vt.sync_ticket(comm->self, comm, ticket);
}

lpx_status lpx_comm_set_timeout(lpx_comm *comm, int64_t timeout_ms)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_set_timeout: comm is NULL");
    /* the upper bound keeps deadline arithmetic (ns, u64) from overflowing */
    if (timeout_ms <= 0 || timeout_ms > INT64_C(1) << 40)
        return lpx_error(LPX_EINVAL, "lpx_comm_set_timeout (rank %d): timeout %" PRId64
                         " ms is not in 1..2^40", comm->rank, timeout_ms);
    atomic_store(&comm->timeout_ms, timeout_ms);
    return LPX_OK;
}

int64_t lpx_comm_timeout(const lpx_comm *comm)
{
    return comm ? (int64_t)atomic_load(&((lpx_comm *)comm)->timeout_ms) : 0;
}

void lpx_comm_abort(lpx_comm *comm, const char *reason)
{
    if (!comm) return;
    comm->vt.abort(comm->self, reason && *reason ? reason : "no reason given");
}

/* ---- statistics ---------------------------------------------------- */

lpx_status lpx_comm_stats_get(const lpx_comm *comm, lpx_comm_stats *out)
{
    if (!comm || !out) return lpx_error(LPX_EINVAL, "lpx_comm_stats_get: %s is NULL", comm ? "out" : "comm");
    size_t want = out->struct_size;
    if (want < offsetof(lpx_comm_stats, calls) + sizeof out->calls)
        return lpx_error(LPX_EINVAL, "lpx_comm_stats_get: out->struct_size %zu is too small "
                         "(set it to sizeof(lpx_comm_stats))", want);
    lpx_comm *c = (lpx_comm *)comm;  /* atomics are read, never written */
    lpx_comm_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = want < sizeof s ? want : sizeof s;
    for (int k = 0; k < LPX_COLL_MAX; k++) {
        s.calls[k] = atomic_load_explicit(&c->calls[k], memory_order_relaxed);
        s.bytes[k] = atomic_load_explicit(&c->bytes[k], memory_order_relaxed);
        s.ns[k] = atomic_load_explicit(&c->ns[k], memory_order_relaxed);
        s.failures[k] = atomic_load_explicit(&c->failures[k], memory_order_relaxed);
    }
    memcpy(out, &s, s.struct_size);
    return LPX_OK;
}

void lpx_comm_stats_reset(lpx_comm *comm)
{
    if (!comm) return;
    for (int k = 0; k < LPX_COLL_MAX; k++) {
        atomic_store_explicit(&comm->calls[k], 0, memory_order_relaxed);
        atomic_store_explicit(&comm->bytes[k], 0, memory_order_relaxed);
        atomic_store_explicit(&comm->ns[k], 0, memory_order_relaxed);
        atomic_store_explicit(&comm->failures[k], 0, memory_order_relaxed);
    }
}

void lpx_comm_stats_print(const lpx_comm *comm, FILE *f)
{
    if (!comm || !f) return;
    lpx_comm_stats s = {.struct_size = sizeof s};
    if (lpx_comm_stats_get(comm, &s)) return;
    fprintf(f, "comm %s rank %d of %d\n", comm->vt.name, comm->rank, comm->size);
    fprintf(f, "  %-15s %10s %16s %12s %8s\n", "collective", "calls", "bytes", "ms", "failed");
    for (int k = 0; k < LPX_COLL_COUNT; k++)
        fprintf(f, "  %-15s %10" PRIu64 " %16" PRIu64 " %12.3f %8" PRIu64 "\n",
                lpx_coll_name((lpx_coll)k), s.calls[k], s.bytes[k], (double)s.ns[k] / 1e6, s.failures[k]);
}
