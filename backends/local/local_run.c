/* lpx_local_run: one thread per rank, each running the caller's function
 * with its comm. What happens when a rank's function does not finish the
 * way its peers expect is decided here: an error return aborts the group
 * with the error's message, and returning (or pthread_exit) marks the rank
 * as gone, so peers waiting for it fail at once instead of at their
 * deadline. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "local_internal.h"

typedef struct run_rank {
    pthread_t thread;
    bool started;
    bool returned;            /* fn returned (false: pthread_exit) */
    lpx_comm *comm;
    lpx_comm_rank_fn fn;
    void *ctx;
    lpx_status status;
    char msg[LOCAL_REASON];
} run_rank;

/* Runs however the thread ends (pthread_cleanup_push): a thread that
 * pthread_exits inside fn still leaves the group properly. */
static void rank_done(void *arg)
{
    run_rank *rr = arg;
    if (!rr->returned) {
        rr->status = LPX_ECOMM;
        snprintf(rr->msg, sizeof rr->msg, "its thread exited (pthread_exit) inside the rank function");
    }
    local_leave(local_rank_of(rr->comm), rr->returned ? "its function returned" : "its thread exited");
}

static void *rank_main(void *arg)
{
    run_rank *rr = arg;
    pthread_cleanup_push(rank_done, rr);
    lpx_clear_error();
    lpx_status st = rr->fn(rr->comm, rr->ctx);
    rr->status = st;
    rr->returned = true;
    if (st) {
        snprintf(rr->msg, sizeof rr->msg, "%s", lpx_last_error()[0] ? lpx_last_error() : lpx_status_string(st));
        char reason[LOCAL_REASON + 64];
        snprintf(reason, sizeof reason, "its function returned %s: %s", lpx_status_string(st), rr->msg);
        lpx_comm_abort(rr->comm, reason);
    }
    pthread_cleanup_pop(1);
    return NULL;
}

lpx_status lpx_local_run(int n, lpx_comm_rank_fn fn, void *ctx, int64_t timeout_ms, lpx_status *statuses)
{
    if (n < 1 || n > LPX_LOCAL_MAX_RANKS)
        return lpx_error(LPX_EINVAL, "lpx_local_run: %d ranks is not in 1..%d", n, LPX_LOCAL_MAX_RANKS);
    if (!fn) return lpx_error(LPX_EINVAL, "lpx_local_run: fn is NULL");
    if (timeout_ms < 0)
        return lpx_error(LPX_EINVAL, "lpx_local_run: timeout %" PRId64 " ms is negative", timeout_ms);
    run_rank *rr = lpx_calloc((size_t)n, sizeof *rr);
    lpx_comm **comms = lpx_calloc((size_t)n, sizeof *comms);
    if (!rr || !comms) {
        lpx_free(rr);
        lpx_free(comms);
        return lpx_error(LPX_ENOMEM, "lpx_local_run: out of memory for %d ranks", n);
    }
    lpx_status st = lpx_local_comm_group_create(n, comms);
    for (int r = 0; !st && r < n; r++) {
        rr[r].comm = comms[r];
        rr[r].fn = fn;
        rr[r].ctx = ctx;
        if (timeout_ms) st = lpx_comm_set_timeout(comms[r], timeout_ms);
    }
    if (st) {
        for (int r = 0; r < n; r++) lpx_comm_destroy(comms[r]);
        lpx_free(rr);
        lpx_free(comms);
        return st;
    }
    for (int r = 0; r < n; r++) {
        int rc = pthread_create(&rr[r].thread, NULL, rank_main, &rr[r]);
        rr[r].started = rc == 0;
        if (!rr[r].started) {
            /* the ranks already running must not wait for this one */
            rr[r].status = LPX_ECOMM;
            snprintf(rr[r].msg, sizeof rr[r].msg, "its thread could not be started (%s)", strerror(rc));
            lpx_comm_abort(comms[r], rr[r].msg);
        }
    }
    for (int r = 0; r < n; r++)
        if (rr[r].started) pthread_join(rr[r].thread, NULL);
    int first = -1;
    for (int r = 0; r < n; r++) {
        if (statuses) statuses[r] = rr[r].status;
        if (rr[r].status && first < 0) first = r;
        lpx_comm_destroy(comms[r]);
    }
    st = first < 0 ? LPX_OK
                   : lpx_error(rr[first].status, "lpx_local_run: rank %d: %s", first, rr[first].msg);
    lpx_free(rr);
    lpx_free(comms);
    return st;
}

static lpx_status local_backend_run(const lpx_comm_backend_i *self, int nranks, int64_t timeout_ms,
                                   lpx_comm_rank_fn fn, void *ctx, lpx_status *statuses)
{
    (void)self;
    return lpx_local_run(nranks, fn, ctx, timeout_ms, statuses);
}

lpx_status lpx_local_backend_init(void)
{
    static const lpx_comm_backend_i local = {
        .struct_size = sizeof local, .name = "local",
        .description = "N ranks as N threads of this process (bit-reproducible reductions)",
        .run = local_backend_run};
    return lpx_comm_backend_register(&local);
}
