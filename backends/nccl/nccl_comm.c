/* The comms of lpx-nccl.so: creation (grouped, non-blocking NCCL init with
 * a deadline), the collectives (enqueued on the comm stream and ordered
 * against lpx-cuda's stream with events, see nccl_internal.h), the
 * watchdog, and the extras of lpx_nccl.h that act on a comm. */
#include <errno.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include "nccl_internal.h"

/* ---- small helpers -------------------------------------------------- */

void nc_describe(char *buf, size_t len, const char *call, ncclResult_t rc, ncclComm_t nc)
{
    const char *last = ncclGetLastError(nc);
    if (last && *last)
        snprintf(buf, len, "%s failed: %s (%s)", call, ncclGetErrorString(rc), last);
    else
        snprintf(buf, len, "%s failed: %s", call, ncclGetErrorString(rc));
}

lpx_status nc_wrap(lpx_status st, const char *prefix)
{
    char msg[NC_MSG * 2];
    snprintf(msg, sizeof msg, "%s", lpx_last_error()[0] ? lpx_last_error() : lpx_status_string(st));
    return lpx_error(st, "%s: %s", prefix, msg);
}

int64_t nc_default_timeout_ms(void)
{
    const char *s = getenv("LPX_COMM_TIMEOUT_MS");
    if (s && *s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (*end == 0 && v > 0) return (int64_t)v;
    }
    return LPX_COMM_DEFAULT_TIMEOUT_MS;
}

/* Sleeps a growing step (2 us doubling up to 200 us) after a few polls. */
static void nap(unsigned polls, long *ns)
{
    if (polls < 64) return;
    *ns = *ns ? (*ns < 200000 ? *ns * 2 : 200000) : 2000;
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
}

static const char *dev_str(lpx_device d, char *buf, size_t len)
{
    if (d.type == LPX_DEVICE_CPU) snprintf(buf, len, "cpu");
    else if (d.type == LPX_DEVICE_CUDA) snprintf(buf, len, "cuda:%d", (int)d.index);
    else snprintf(buf, len, "device type %d:%d", (int)d.type, (int)d.index);
    return buf;
}

/* ---- in-process groups ---------------------------------------------- */

static void group_fail(nc_group *g, const char *reason)
{
    pthread_mutex_lock(&g->mu);
    if (!atomic_load(&g->failed)) {
        snprintf(g->reason, sizeof g->reason, "%s", reason);
        atomic_store(&g->failed, 1);
    }
    pthread_mutex_unlock(&g->mu);
}

static void group_unref(nc_group *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) {
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
}

/* ---- failure -------------------------------------------------------- */

/* Records the first failure (mu held), aborts the NCCL communicator (which
 * ends its kernels) and, if `tell`, fails the in-process peers too. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 4, 5)))
#endif
static void fail_locked(nccl_rank *r, lpx_status code, bool tell, const char *fmt, ...)
{
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->reason, sizeof r->reason, fmt, ap);
        va_end(ap);
        r->failed = true;
        r->fail_code = code;
        r->reported = false;
    }
    if (r->nc) {
        ncclCommAbort(r->nc);
        r->nc = NULL;
    }
    if (tell && r->group) group_fail(r->group, r->reason);
}

/* The error a call on a failed comm returns: the failure's own code the
 * first time it is reported, LPX_ECOMM after. */
static lpx_status report(nccl_rank *r)
{
    if (!r->reported) {
        r->reported = true;
        return lpx_error(r->fail_code, "%s; the NCCL communicator was aborted", r->reason);
    }
    return lpx_error(LPX_ECOMM, "the comm failed earlier: %s", r->reason);
}

/* Retires the collectives that completed; fails the comm when one is still
 * running past its deadline or CUDA reports an error (mu held). */
static void retire_locked(nccl_rank *r)
{
    while (r->nfl && !r->failed) {
        nc_flight *f = &r->fl[r->head];
        cudaError_t e = cudaEventQuery(f->ev);
        if (e == cudaSuccess) {
            r->head = (r->head + 1) % NC_FLIGHT;
            r->nfl--;
            continue;
        }
        if (e != cudaErrorNotReady) {
            (void)cudaGetLastError();
            fail_locked(r, LPX_ECOMM, true, "rank %d: %s #%" PRIu64 " failed on the device (cudaEventQuery: %s: %s)",
                        r->rank, lpx_coll_name(f->kind), f->seq, cudaGetErrorName(e), cudaGetErrorString(e));
            return;
        }
        /* the oldest is still running, so are the later ones: any of them late? */
        uint64_t now = lpx_now_ns();
        for (unsigned i = 0; i < r->nfl; i++) {
            nc_flight *g = &r->fl[(r->head + i) % NC_FLIGHT];
            if (now >= g->deadline_ns) {
                fail_locked(r, LPX_ETIMEOUT, true, "rank %d: %s #%" PRIu64 " did not complete within %" PRId64
                            " ms of being enqueued (a peer never joined it, or the device is stuck)",
                            r->rank, lpx_coll_name(g->kind), g->seq, g->timeout_ms);
                return;
            }
        }
        return;
    }
}

/* Everything the watchdog and every call check (mu held). */
static void poll_locked(nccl_rank *r)
{
    if (r->failed) return;
    if (r->group && atomic_load(&r->group->failed)) {
        char why[NC_MSG];
        pthread_mutex_lock(&r->group->mu);
        snprintf(why, sizeof why, "%s", r->group->reason);
        pthread_mutex_unlock(&r->group->mu);
        fail_locked(r, LPX_ECOMM, false, "%s", why);
        return;
    }
    if (r->nc) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t rc = ncclCommGetAsyncError(r->nc, &async);
        if (rc != ncclSuccess) async = rc;
        if (async != ncclSuccess && async != ncclInProgress) {
            char d[NC_MSG - 32];
            nc_describe(d, sizeof d, "NCCL (ncclCommGetAsyncError)", async, r->nc);
            fail_locked(r, LPX_ECOMM, true, "rank %d: %s", r->rank, d);
            return;
        }
    }
    retire_locked(r);
}

/* Waits on the host (mu held, released while napping) until at most
 * `keep` collectives are in flight or the oldest in flight comes after
 * collective number `ticket`; each has its own deadline. */
static lpx_status wait_upto_locked(nccl_rank *r, unsigned keep, uint64_t ticket)
{
    long ns = 0;
    for (unsigned polls = 0;; polls++) {
        poll_locked(r);
        if (r->failed) return report(r);
        if (r->nfl <= keep || r->fl[r->head].no > ticket) return LPX_OK;
        pthread_mutex_unlock(&r->mu);
        nap(polls, &ns);
        if (polls < 64) sched_yield();
        pthread_mutex_lock(&r->mu);
    }
}

static lpx_status wait_locked(nccl_rank *r, unsigned keep) { return wait_upto_locked(r, keep, UINT64_MAX); }

/* ---- the watchdog ---------------------------------------------------- */

static long watchdog_ms(void)
{
    const char *s = getenv("LPX_NCCL_WATCHDOG_MS");
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end == 0 && v >= 0) return v;
    }
    return 20;
}

static void *watchdog(void *arg)
{
    nccl_rank *r = arg;
    long ms = watchdog_ms();
    (void)cudaSetDevice(r->dev);
    pthread_mutex_lock(&r->mu);
    while (!r->wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&r->wd_cv, &r->mu, &ts);
        if (!r->wd_stop) poll_locked(r);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- the comms' registry (for the extras) ---------------------------- */

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static nccl_rank **reg;
static int nreg, capreg;

static lpx_status reg_add(nccl_rank *r)
{
    lpx_status st = LPX_OK;
    pthread_mutex_lock(&reg_mu);
    if (nreg == capreg) {
        int cap = capreg ? 2 * capreg : 16;
        nccl_rank **v = realloc(reg, (size_t)cap * sizeof *v);
        if (!v) st = lpx_error(LPX_ENOMEM, "lpx-nccl: out of memory");
        else reg = v, capreg = cap;
    }
    if (!st) reg[nreg++] = r;
    pthread_mutex_unlock(&reg_mu);
    return st;
}

static void reg_remove(nccl_rank *r)
{
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nreg; i++)
        if (reg[i] == r) {
            reg[i] = reg[--nreg];
            break;
        }
    pthread_mutex_unlock(&reg_mu);
}

static nccl_rank *reg_find(const lpx_comm *c)
{
    nccl_rank *r = NULL;
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nreg && c; i++)
        if (reg[i]->comm == c) {
            r = reg[i];
            break;
        }
    pthread_mutex_unlock(&reg_mu);
    return r;
}

/* ---- the collectives ------------------------------------------------- */

static int n_rank(void *self) { return ((nccl_rank *)self)->rank; }
static int n_size(void *self) { return ((nccl_rank *)self)->size; }

/* Buffers must be CUDA memory of the comm's device. The _buf forms say
 * "cpu" whatever the memory is, so then CUDA is asked about the pointers. */
static lpx_status check_device(nccl_rank *r, const lpx_comm_args *a)
{
    lpx_device d = a->device;
    char where[48];
    if (d.type == LPX_DEVICE_CUDA && d.index == r->dev) return LPX_OK;
    if (d.type == LPX_DEVICE_CPU) {
        const void *ptrs[2] = {a->send, a->recv};
        bool ok = true;
        for (int i = 0; i < 2 && ok; i++) {
            if (!ptrs[i]) continue;
            struct cudaPointerAttributes at;
            if (cudaPointerGetAttributes(&at, ptrs[i]) != cudaSuccess) {
                (void)cudaGetLastError();
                ok = false;
            } else if (at.type != cudaMemoryTypeDevice) {
                ok = false;
            } else if (at.device != r->dev) {
                ok = false;
                d = lpx_cuda_device(at.device);
            }
        }
        if (ok) return LPX_OK;
    }
    dev_str(d, where, sizeof where);
    fail_locked(r, LPX_EDEVICE, true, "rank %d passed %s memory to %s (its NCCL comm moves cuda:%d memory only)",
                r->rank, where, lpx_coll_name(a->kind), r->dev);
    r->reported = true;
    return lpx_error(LPX_EDEVICE, "buffers in %s memory; lpx-nccl.so moves memory of the comm's device "
                     "(cuda:%d) only; the comm is now failed", where, r->dev);
}

/* NCCL type and op of a reduction; fp8 and others are refused alike on
 * every rank, so the comm is not failed. */
static lpx_status map_reduce(const lpx_comm_args *a, ncclDataType_t *dt, ncclRedOp_t *op)
{
    switch (a->dtype) {
    case LPX_F32: *dt = ncclFloat32; break;
    case LPX_F16: *dt = ncclFloat16; break;
    case LPX_BF16: *dt = ncclBfloat16; break;
    default:
        return lpx_error(LPX_EDTYPE, "lpx-nccl.so reduces f32, bf16 and f16, not %s (fp8 gradients: "
                         "reduce in bf16/f32, or all-gather the fp8 bytes)", lpx_dtype_name(a->dtype));
    }
    switch (a->op) {
    case LPX_REDUCE_SUM: *op = ncclSum; break;
    case LPX_REDUCE_AVG: *op = ncclAvg; break;
    case LPX_REDUCE_MAX: *op = ncclMax; break;
    case LPX_REDUCE_MIN: *op = ncclMin; break;
    default: return lpx_error(LPX_EINVAL, "reduce op %d", (int)a->op);
    }
    return LPX_OK;
}

/* Fails the comm for a CUDA error of `call` (mu held). */
static lpx_status cuda_failed(nccl_rank *r, const char *call, cudaError_t e)
{
    (void)cudaGetLastError();
    fail_locked(r, LPX_EDEVICE, true, "rank %d: %s failed: %s (%s)", r->rank, call, cudaGetErrorName(e),
                cudaGetErrorString(e));
    return report(r);
}

/* After ncclGroupEnd of a non-blocking comm: waits until NCCL finished
 * enqueueing (ncclInProgress turns into a result) or the deadline. */
static lpx_status settle_locked(nccl_rank *r, const lpx_comm_args *a, const char *call, ncclResult_t rc)
{
    long ns = 0;
    for (unsigned polls = 0; rc == ncclInProgress; polls++) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(r->nc, &async);
        rc = q != ncclSuccess ? q : async;
        if (rc != ncclInProgress) break;
        if (lpx_now_ns() >= a->deadline_ns) {
            fail_locked(r, LPX_ETIMEOUT, true, "rank %d: %s for %s #%" PRIu64 " was still in progress after %"
                        PRId64 " ms (ncclGroupEnd did not finish enqueueing)", r->rank, call,
                        lpx_coll_name(a->kind), a->seq, a->timeout_ms);
            return report(r);
        }
        nap(polls, &ns);
    }
    if (rc != ncclSuccess) {
        char d[NC_MSG - 32];
        nc_describe(d, sizeof d, call, rc, r->nc);
        fail_locked(r, LPX_ECOMM, true, "rank %d: %s", r->rank, d);
        return report(r);
    }
    return LPX_OK;
}

static lpx_status coll_locked(nccl_rank *r, const lpx_comm_args *a)
{
    lpx_status st;
    cudaError_t e;
    /* deferred: lpx-cuda's stream does not wait for this one (step 3) */
    const bool defer = r->deferred || r->defer_once;
    r->defer_once = false;
    r->timeout_ms = a->timeout_ms;
    poll_locked(r);
    if (r->failed) return report(r);
    const bool barrier = a->kind == LPX_COLL_BARRIER;
    if (!barrier && (st = check_device(r, a))) return st;
    ncclDataType_t dt = ncclUint8;
    ncclRedOp_t op = ncclSum;
    size_t n = 0;
    switch (a->kind) {
    case LPX_COLL_ALL_GATHER: case LPX_COLL_BROADCAST: n = a->nbytes; break;
    case LPX_COLL_REDUCE_SCATTER: case LPX_COLL_ALL_REDUCE:
        if ((st = map_reduce(a, &dt, &op))) return st;
        n = a->count;
        break;
    case LPX_COLL_BARRIER: n = 1; break;
    default: return lpx_error(LPX_EINVAL, "unknown collective %d", (int)a->kind);
    }
    if (n == 0) return LPX_OK;  /* every rank skips it alike */
    if ((e = cudaSetDevice(r->dev)) != cudaSuccess) return cuda_failed(r, "cudaSetDevice", e);
    if (r->nfl == NC_FLIGHT && (st = wait_locked(r, NC_FLIGHT - 1))) return st;
    if (!barrier) {
        /* the inputs are what lpx-cuda queued before this call */
        if ((e = cudaEventRecord(r->ready, r->compute)) != cudaSuccess) return cuda_failed(r, "cudaEventRecord", e);
        if ((e = cudaStreamWaitEvent(r->stream, r->ready, 0)) != cudaSuccess)
            return cuda_failed(r, "cudaStreamWaitEvent", e);
    }
    const char *call = "ncclAllReduce";
    ncclResult_t rc = ncclGroupStart();
    if (rc == ncclSuccess) {
        switch (a->kind) {
        case LPX_COLL_ALL_GATHER:
            call = "ncclAllGather";
            rc = ncclAllGather(a->send, a->recv, n, ncclUint8, r->nc, r->stream);
            break;
        case LPX_COLL_REDUCE_SCATTER:
            call = "ncclReduceScatter";
            rc = ncclReduceScatter(a->send, a->recv, n, dt, op, r->nc, r->stream);
            break;
        case LPX_COLL_ALL_REDUCE:
            rc = ncclAllReduce(a->send, a->recv, n, dt, op, r->nc, r->stream);
            break;
        case LPX_COLL_BROADCAST:
            call = "ncclBroadcast";
            rc = ncclBroadcast(a->recv, a->recv, n, ncclUint8, a->root, r->nc, r->stream);
            break;
        default: /* barrier: an all-reduce of one value */
            rc = ncclAllReduce(r->scratch, r->scratch, 1, ncclFloat32, ncclSum, r->nc, r->stream);
            break;
        }
        ncclResult_t end = ncclGroupEnd();
        if (rc == ncclSuccess || rc == ncclInProgress) rc = end;
        else call = "ncclGroupEnd";
    } else {
        call = "ncclGroupStart";
    }
    if ((st = settle_locked(r, a, call, rc))) return st;
    nc_flight *f = &r->fl[(r->head + r->nfl) % NC_FLIGHT];
    if ((e = cudaEventRecord(f->ev, r->stream)) != cudaSuccess) return cuda_failed(r, "cudaEventRecord", e);
    f->seq = a->seq;
    f->no = ++r->enq;
    f->kind = a->kind;
    f->deadline_ns = a->deadline_ns;
    f->timeout_ms = a->timeout_ms;
    r->nfl++;
    /* results and buffers are the caller's again for what it queues next */
    if (!barrier && !defer && (e = cudaStreamWaitEvent(r->compute, f->ev, 0)) != cudaSuccess)
        return cuda_failed(r, "cudaStreamWaitEvent", e);
    /* a barrier returns when every rank reached it: wait on the host */
    return barrier ? wait_locked(r, 0) : LPX_OK;
}

static lpx_status n_coll(void *self, const lpx_comm_args *a)
{
    nccl_rank *r = self;
    pthread_mutex_lock(&r->mu);
    lpx_status st = coll_locked(r, a);
    pthread_mutex_unlock(&r->mu);
    return st;
}

static void n_abort(void *self, const char *reason)
{
    nccl_rank *r = self;
    pthread_mutex_lock(&r->mu);
    if (!r->failed) {
        fail_locked(r, LPX_ECOMM, true, "rank %d aborted: %s", r->rank, reason ? reason : "(no reason given)");
        r->reported = true;
    }
    pthread_mutex_unlock(&r->mu);
}

/* Frees what nc_rank_new made (the NCCL communicator is gone by then). */
static void rank_free(nccl_rank *r)
{
    if (!r) return;
    if (r->dev >= 0) (void)cudaSetDevice(r->dev);
    for (int i = 0; i < NC_FLIGHT; i++)
        if (r->fl[i].ev) cudaEventDestroy(r->fl[i].ev);
    if (r->ready) cudaEventDestroy(r->ready);
    /* stream-ordered: released once the stream's work is done */
    if (r->scratch) cudaFreeAsync(r->scratch, r->stream);
    if (r->stream) cudaStreamDestroy(r->stream);
    (void)cudaGetLastError();
    pthread_cond_destroy(&r->wd_cv);
    pthread_mutex_destroy(&r->mu);
    group_unref(r->group);
    free(r);
}

/* Ends the NCCL communicator: the enqueued collectives finish (each within
 * its deadline), then ncclCommFinalize + ncclCommDestroy, bounded by the
 * comm's timeout; ncclCommAbort when anything fails (mu held). */
static void close_locked(nccl_rank *r)
{
    if (!r->nc) return;
    (void)cudaSetDevice(r->dev);
    if (wait_locked(r, 0) || !r->nc) return;  /* failed: aborted already */
    ncclResult_t rc = ncclCommFinalize(r->nc);
    uint64_t deadline = lpx_now_ns() + (uint64_t)r->timeout_ms * UINT64_C(1000000);
    long ns = 0;
    for (unsigned polls = 0; rc == ncclInProgress; polls++) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(r->nc, &async);
        rc = q != ncclSuccess ? q : async;
        if (rc == ncclInProgress && lpx_now_ns() >= deadline) break;
        nap(polls, &ns);
    }
    if (rc == ncclSuccess) ncclCommDestroy(r->nc);
    else ncclCommAbort(r->nc);
    r->nc = NULL;
}

static void n_destroy(void *self)
{
    nccl_rank *r = self;
    pthread_mutex_lock(&r->mu);
    r->wd_stop = true;
    pthread_cond_signal(&r->wd_cv);
    pthread_mutex_unlock(&r->mu);
    if (r->wd_running) pthread_join(r->wd, NULL);
    reg_remove(r);
    pthread_mutex_lock(&r->mu);
    close_locked(r);
    pthread_mutex_unlock(&r->mu);
    rank_free(r);
}

/* the optional capability slots of lpx_comm_i: the comm moves its GPU's
 * memory, and has the overlapped host all-gather (the exports below) */
static lpx_status n_caps(void *self, lpx_comm_caps *out)
{
    out->device = lpx_cuda_device(((nccl_rank *)self)->dev);
    out->host_all_gather = true;
    return LPX_OK;
}

static lpx_status n_ag_host(void *self, lpx_comm *comm, const void *send, void *recv, size_t nbytes,
                            uint64_t *ticket)
{
    (void)self;
    return lpx_nccl_all_gather_host(comm, send, recv, nbytes, ticket);
}

static lpx_status n_wait_ticket(void *self, lpx_comm *comm, uint64_t ticket)
{
    (void)self;
    return lpx_nccl_wait_ticket(comm, ticket);
}

static lpx_status n_sync_ticket(void *self, lpx_comm *comm, uint64_t ticket)
{
    (void)self;
    return lpx_nccl_sync_ticket(comm, ticket);
}

static const lpx_comm_i nccl_vt = {
    .struct_size = sizeof(lpx_comm_i),
    .abi_version = LPX_COMM_ABI_VERSION,
    .name = "nccl",
    .rank = n_rank,
    .size = n_size,
    .all_gather = n_coll,
    .reduce_scatter = n_coll,
    .all_reduce = n_coll,
    .broadcast = n_coll,
    .barrier = n_coll,
    .abort = n_abort,
    .destroy = n_destroy,
    .caps = n_caps,
    .all_gather_host = n_ag_host,
    .wait_ticket = n_wait_ticket,
    .sync_ticket = n_sync_ticket,
};

/* ---- creation -------------------------------------------------------- */

/* A positive integer from the environment into *out (unchanged if unset). */
static lpx_status env_int(const char *name, int *out)
{
    const char *s = getenv(name);
    if (!s || !*s) return LPX_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v <= 0 || v > 1024)
        return lpx_error(LPX_EINVAL, "lpx-nccl: %s=%s is not an integer in 1..1024", name, s);
    *out = (int)v;
    return LPX_OK;
}

static lpx_status rank_new(int rank, int size, int dev, nc_group *g, nccl_rank **out)
{
    const char *op = "lpx-nccl: creating a comm";
    nccl_rank *r = calloc(1, sizeof *r);
    if (!r) return lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    r->rank = rank, r->size = size, r->dev = dev;
    r->timeout_ms = nc_default_timeout_ms();
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->wd_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (g) {
        atomic_fetch_add(&g->refs, 1);
        r->group = g;
    }
    r->compute = (cudaStream_t)nc_cuda_stream(dev);
    cudaError_t e = cudaSetDevice(dev);
    const char *call = "cudaSetDevice";
    int lo = 0, hi = 0;
    if (e == cudaSuccess) e = cudaDeviceGetStreamPriorityRange(&lo, &hi), call = "cudaDeviceGetStreamPriorityRange";
    /* the comm stream gets the highest priority: collectives are on the
     * critical path, compute fills the gaps */
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&r->stream, cudaStreamNonBlocking, hi), call = "cudaStreamCreateWithPriority";
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->ready, cudaEventDisableTiming), call = "cudaEventCreateWithFlags";
    for (int i = 0; i < NC_FLIGHT && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&r->fl[i].ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMallocAsync((void **)&r->scratch, sizeof(float), r->stream), call = "cudaMallocAsync";
    if (e == cudaSuccess) e = cudaMemsetAsync(r->scratch, 0, sizeof(float), r->stream), call = "cudaMemsetAsync";
    if (e == cudaSuccess) e = cudaStreamSynchronize(r->stream), call = "cudaStreamSynchronize";
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        rank_free(r);
        return lpx_error(e == cudaErrorMemoryAllocation ? LPX_ENOMEM : LPX_EDEVICE, "%s on cuda:%d: %s failed: %s (%s)",
                         op, dev, call, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    *out = r;
    return LPX_OK;
}

lpx_status nc_create(int n, const int *ranks, const int *devs, int size, const ncclUniqueId *id,
                     int64_t timeout_ms, lpx_comm **comms)
{
    const char *op = "lpx-nccl: creating a comm";
    if (n < 1 || size < 1 || n > size || !ranks || !devs || !id || !comms)
        return lpx_error(LPX_EINVAL, "%s: bad arguments (n %d, size %d)", op, n, size);
    if (timeout_ms <= 0) timeout_ms = nc_default_timeout_ms();
    int ndev = nc_cuda_device_count();
    for (int i = 0; i < n; i++) {
        comms[i] = NULL;
        if (ranks[i] < 0 || ranks[i] >= size)
            return lpx_error(LPX_EINVAL, "%s: rank %d is not in 0..%d", op, ranks[i], size - 1);
        if (devs[i] < 0 || devs[i] >= ndev)
            return lpx_error(LPX_EDEVICE, "%s: cuda:%d is not one of the %d CUDA devices lpx-cuda serves",
                             op, devs[i], ndev);
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i])
                return lpx_error(LPX_EINVAL, "%s: ranks %d and %d both on cuda:%d (NCCL runs one rank per GPU)",
                                 op, ranks[j], ranks[i], devs[i]);
    }
    int min_ctas = 0, max_ctas = 0;
    lpx_status st = env_int("LPX_NCCL_MIN_CTAS", &min_ctas);
    if (!st) st = env_int("LPX_NCCL_MAX_CTAS", &max_ctas);
    if (st) return st;
    if (min_ctas && max_ctas && min_ctas > max_ctas)
        return lpx_error(LPX_EINVAL, "%s: LPX_NCCL_MIN_CTAS=%d exceeds LPX_NCCL_MAX_CTAS=%d", op, min_ctas, max_ctas);

    nccl_rank **rs = calloc((size_t)n, sizeof *rs);
    nc_group *g = NULL;
    if (!rs) return lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    if (n > 1) {
        if (!(g = calloc(1, sizeof *g))) {
            free(rs);
            return lpx_error(LPX_ENOMEM, "%s: out of memory", op);
        }
        atomic_init(&g->refs, 1);
        atomic_init(&g->failed, 0);
        pthread_mutex_init(&g->mu, NULL);
    }
    for (int i = 0; i < n && !st; i++) st = rank_new(ranks[i], size, devs[i], g, &rs[i]);

    /* one group: NCCL sets all of this process's ranks up together */
    char why[NC_MSG] = "";
    ncclResult_t rc = ncclSuccess;
    if (!st) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        if (min_ctas) cfg.minCTAs = min_ctas;
        if (max_ctas) cfg.maxCTAs = max_ctas;
        cfg.commName = "lpx";
        rc = ncclGroupStart();
        for (int i = 0; i < n && (rc == ncclSuccess || rc == ncclInProgress); i++) {
            (void)cudaSetDevice(devs[i]);
            rc = ncclCommInitRankConfig(&rs[i]->nc, size, *id, ranks[i], &cfg);
            if (rc != ncclSuccess && rc != ncclInProgress) nc_describe(why, sizeof why, "ncclCommInitRankConfig", rc, NULL);
        }
        ncclResult_t end = ncclGroupEnd();
        if ((rc == ncclSuccess || rc == ncclInProgress) && end != ncclSuccess && end != ncclInProgress) {
            rc = end;
            nc_describe(why, sizeof why, "ncclGroupEnd (ncclCommInitRankConfig)", rc, NULL);
        }
        if (rc != ncclSuccess && rc != ncclInProgress) {
            st = lpx_error(LPX_ECOMM, "%s: %s", op, why);
        } else {
            /* poll every rank until it is ready, failed, or the deadline passed */
            uint64_t deadline = lpx_now_ns() + (uint64_t)timeout_ms * UINT64_C(1000000);
            long ns = 0;
            for (unsigned polls = 0; !st; polls++) {
                bool pending = false;
                for (int i = 0; i < n && !st; i++) {
                    ncclResult_t async = ncclSuccess;
                    if (!rs[i]->nc) {
                        st = lpx_error(LPX_ECOMM, "%s: ncclCommInitRankConfig gave no communicator for rank %d",
                                       op, ranks[i]);
                        break;
                    }
                    ncclResult_t q = ncclCommGetAsyncError(rs[i]->nc, &async);
                    if (q != ncclSuccess) async = q;
                    if (async == ncclInProgress) pending = true;
                    else if (async != ncclSuccess) {
                        nc_describe(why, sizeof why, "ncclCommInitRankConfig", async, rs[i]->nc);
                        st = lpx_error(LPX_ECOMM, "%s: rank %d of %d on cuda:%d: %s", op, ranks[i], size, devs[i], why);
                    }
                }
                if (st || !pending) break;
                if (lpx_now_ns() >= deadline) {
                    char list[160] = "";
                    size_t at = 0;
                    for (int i = 0; i < n && at + 12 < sizeof list; i++)
                        at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", i ? ", " : "", ranks[i]);
                    st = lpx_error(LPX_ETIMEOUT, "%s: ncclCommInitRankConfig of rank%s %s of %d did not finish within "
                                   "%" PRId64 " ms (did all %d ranks start, with the same NCCL id?)", op,
                                   n > 1 ? "s" : "", list, size, timeout_ms, size);
                    break;
                }
                nap(polls, &ns);
            }
        }
    }
    if (st) {
        char msg[NC_MSG + 64];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        for (int i = 0; i < n; i++) {
            if (!rs[i]) continue;
            if (rs[i]->nc) ncclCommAbort(rs[i]->nc);
            rs[i]->nc = NULL;
            rank_free(rs[i]);
        }
        free(rs);
        group_unref(g);
        return lpx_error(st, "%s", msg);
    }

    /* wrap each rank; on failure undo everything (comms made so far too) */
    for (int i = 0; i < n && !st; i++) {
        rs[i]->timeout_ms = timeout_ms;
        if ((st = lpx_comm_new(&nccl_vt, rs[i], &comms[i]))) break;
        rs[i]->comm = comms[i];
        if ((st = lpx_comm_set_timeout(comms[i], timeout_ms)) || (st = reg_add(rs[i]))) break;
        if (watchdog_ms() > 0) {
            if (pthread_create(&rs[i]->wd, NULL, watchdog, rs[i])) {
                st = lpx_error(LPX_ENOMEM, "%s: cannot start the watchdog thread", op);
                break;
            }
            rs[i]->wd_running = true;
        }
    }
    if (st) {
        char msg[NC_MSG + 64];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        /* abort every communicator first (no finalize waiting for peers) */
        for (int i = 0; i < n; i++) {
            pthread_mutex_lock(&rs[i]->mu);
            if (rs[i]->nc) ncclCommAbort(rs[i]->nc);
            rs[i]->nc = NULL;
            pthread_mutex_unlock(&rs[i]->mu);
        }
        for (int i = 0; i < n; i++) {
            if (comms[i]) lpx_comm_destroy(comms[i]);  /* frees rs[i] */
            else rank_free(rs[i]);
            comms[i] = NULL;
        }
        free(rs);
        group_unref(g);
        return lpx_error(st, "%s", msg);
    }
    free(rs);
    group_unref(g);  /* the ranks hold their own references */
    return LPX_OK;
}

/* ---- extras acting on a comm (lpx_nccl.h) ----------------------------- */

static nccl_rank *find_or_fail(const lpx_comm *comm, const char *fn)
{
    nccl_rank *r = reg_find(comm);
    if (!r) lpx_error(LPX_EINVAL, "%s: %s", fn, comm ? "not a live lpx-nccl.so comm" : "comm is NULL");
    return r;
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_set_deferred(lpx_comm *comm, int deferred)
{
    nccl_rank *r = find_or_fail(comm, "lpx_nccl_set_deferred");
    if (!r) return LPX_EINVAL;
    pthread_mutex_lock(&r->mu);
    r->deferred = deferred != 0;
    pthread_mutex_unlock(&r->mu);
    return LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_wait(lpx_comm *comm)
{
    nccl_rank *r = find_or_fail(comm, "lpx_nccl_wait");
    if (!r) return LPX_EINVAL;
    lpx_status st = LPX_OK;
    pthread_mutex_lock(&r->mu);
    poll_locked(r);
    if (r->failed) {
        st = report(r);
    } else if (r->nfl) {
        cudaError_t e = cudaSetDevice(r->dev);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(r->compute, r->fl[(r->head + r->nfl - 1) % NC_FLIGHT].ev, 0);
        if (e != cudaSuccess) st = cuda_failed(r, "cudaStreamWaitEvent", e);
    }
    pthread_mutex_unlock(&r->mu);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "lpx_nccl_wait (rank %d of %d)", r->rank, r->size);
    return st ? nc_wrap(st, prefix) : LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_sync(lpx_comm *comm)
{
    nccl_rank *r = find_or_fail(comm, "lpx_nccl_sync");
    if (!r) return LPX_EINVAL;
    pthread_mutex_lock(&r->mu);
    lpx_status st = wait_locked(r, 0);
    pthread_mutex_unlock(&r->mu);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "lpx_nccl_sync (rank %d of %d)", r->rank, r->size);
    return st ? nc_wrap(st, prefix) : LPX_OK;
}

LPX_PLUGIN_EXPORT int lpx_nccl_comm_device(const lpx_comm *comm)
{
    nccl_rank *r = reg_find(comm);
    return r ? r->dev : -1;
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_all_gather_host(lpx_comm *comm, const void *send, void *recv, size_t nbytes,
                                                      uint64_t *ticket)
{
    const char *fn = "lpx_nccl_all_gather_host";
    if (ticket) *ticket = 0;
    nccl_rank *r = find_or_fail(comm, fn);
    if (!r) return LPX_EINVAL;
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s (rank %d of %d)", fn, r->rank, r->size);
    if (nbytes && (!send || !recv || nbytes > SIZE_MAX / (size_t)r->size)) {
        /* the peers are (or will be) in the all-gather: tell them */
        lpx_comm_abort(comm, "lpx_nccl_all_gather_host: bad arguments");
        return lpx_error(LPX_EINVAL, "%s: %s", prefix, !send ? "send is NULL" : !recv ? "recv is NULL"
                         : "nbytes x ranks overflows size_t");
    }
    unsigned char *mine = recv ? (unsigned char *)recv + (size_t)r->rank * nbytes : NULL;
    lpx_status st = LPX_OK;
    pthread_mutex_lock(&r->mu);
    poll_locked(r);
    if (r->failed) {
        st = report(r);
    } else if (nbytes) {
        /* recv must be the comm device's memory before anything is copied into it */
        lpx_comm_args a = {.kind = LPX_COLL_ALL_GATHER, .recv = recv, .nbytes = nbytes, .device = lpx_cpu()};
        st = check_device(r, &a);
        cudaError_t e = cudaSuccess;
        const char *call = "cudaSetDevice";
        if (!st) e = cudaSetDevice(r->dev);
        /* the copy lands in a buffer lpx-cuda may just have allocated (or
         * still be reading): order it after the work queued there so far */
        if (!st && e == cudaSuccess) e = cudaEventRecord(r->ready, r->compute), call = "cudaEventRecord";
        if (!st && e == cudaSuccess) e = cudaStreamWaitEvent(r->stream, r->ready, 0), call = "cudaStreamWaitEvent";
        if (!st && e == cudaSuccess)
            e = cudaMemcpyAsync(mine, send, nbytes, cudaMemcpyHostToDevice, r->stream), call = "cudaMemcpyAsync";
        if (!st && e != cudaSuccess) st = cuda_failed(r, call, e);
    }
    if (!st) r->defer_once = true;
    pthread_mutex_unlock(&r->mu);
    /* through lpx's comm layer (checks, sequence number, deadline,
     * statistics): the comm stream runs it after the copy */
    if (!st) st = lpx_comm_all_gather_buf(comm, mine, recv, nbytes);
    pthread_mutex_lock(&r->mu);
    r->defer_once = false;
    if (!st && ticket) *ticket = r->enq;
    pthread_mutex_unlock(&r->mu);
    return st ? nc_wrap(st, prefix) : LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_wait_ticket(lpx_comm *comm, uint64_t ticket)
{
    nccl_rank *r = find_or_fail(comm, "lpx_nccl_wait_ticket");
    if (!r) return LPX_EINVAL;
    lpx_status st = LPX_OK;
    pthread_mutex_lock(&r->mu);
    poll_locked(r);
    if (r->failed) {
        st = report(r);
    } else if (ticket && r->nfl && ticket >= r->fl[r->head].no && ticket <= r->enq) {
        /* still in flight: the ring holds consecutive numbers from head on */
        unsigned at = (unsigned)((r->head + (ticket - r->fl[r->head].no)) % NC_FLIGHT);
        cudaError_t e = cudaSetDevice(r->dev);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(r->compute, r->fl[at].ev, 0);
        if (e != cudaSuccess) st = cuda_failed(r, "cudaStreamWaitEvent", e);
    }
    pthread_mutex_unlock(&r->mu);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "lpx_nccl_wait_ticket (rank %d of %d)", r->rank, r->size);
    return st ? nc_wrap(st, prefix) : LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_sync_ticket(lpx_comm *comm, uint64_t ticket)
{
    nccl_rank *r = find_or_fail(comm, "lpx_nccl_sync_ticket");
    if (!r) return LPX_EINVAL;
    pthread_mutex_lock(&r->mu);
    lpx_status st = ticket ? wait_upto_locked(r, 0, ticket) : LPX_OK;
    pthread_mutex_unlock(&r->mu);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "lpx_nccl_sync_ticket (rank %d of %d)", r->rank, r->size);
    return st ? nc_wrap(st, prefix) : LPX_OK;
}
