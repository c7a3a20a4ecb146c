/* lpx_local_run: one thread per rank, each running the caller's function
 * with its comm. What happens when a rank's function does not finish the
 * way its peers expect is decided here: an error return aborts the group
 * with the error's message, and returning (or pthread_exit) marks the rank
 * as gone, so peers waiting for it fail at once instead of at their
 * deadline.
 *
 * A rank that never returns (stuck in its own code, not in a collective)
 * cannot hold the job forever: once any rank has failed, the others get
 * ABANDON_MS to return; the ones still running are then abandoned
 * (detached, reported LPX_ETIMEOUT) and the call returns, so a process can
 * exit within its comm timeout and a few seconds, as an MPI job does
 * through MPI_Abort. An abandoned thread still owns its comm and the run's
 * records; the last abandoned thread to end frees them. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "local_internal.h"

/* how long the ranks of a failed group have to return before the ones
 * still running are abandoned */
#define ABANDON_MS 2000

typedef struct run_rank run_rank;

/* What the run's threads share; mu guards done, refs and every rank's
 * finished/abandoned flags. */
typedef struct run_shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* on CLOCK_MONOTONIC; broadcast when a rank finishes */
    int done;                 /* ranks finished */
    int refs;                 /* abandoned ranks not yet finished; the last frees the run */
    run_rank *rr;
    lpx_comm **comms;
} run_shared;

struct run_rank {
    pthread_t thread;
    bool started;
    bool returned;            /* fn returned (false: pthread_exit) */
    bool finished;            /* status and msg are final */
    bool abandoned;           /* lpx_local_run returned without it */
    lpx_comm *comm;
    lpx_comm_rank_fn fn;
    void *ctx;
    lpx_status status;
    char msg[LOCAL_REASON];
    run_shared *sh;
};

static void run_free(run_shared *sh)
{
    pthread_cond_destroy(&sh->cv);
    pthread_mutex_destroy(&sh->mu);
    lpx_free(sh->rr);
    lpx_free(sh->comms);
    lpx_free(sh);
}

/* Runs however the thread ends (pthread_cleanup_push): a thread that
 * pthread_exits inside fn still leaves the group properly. */
static void rank_done(void *arg)
{
    run_rank *rr = arg;
    run_shared *sh = rr->sh;
    if (!rr->returned) {
        rr->status = LPX_ECOMM;
        snprintf(rr->msg, sizeof rr->msg, "its thread exited (pthread_exit) inside the rank function");
    }
    local_leave(local_rank_of(rr->comm), rr->returned ? "its function returned" : "its thread exited");
    pthread_mutex_lock(&sh->mu);
    rr->finished = true;
    sh->done++;
    bool abandoned = rr->abandoned, last = abandoned && --sh->refs == 0;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    if (abandoned) {
        /* nobody joins or cleans up after this thread any more */
        lpx_comm_destroy(rr->comm);
        if (last) run_free(sh);
    }
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

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool some_rank_failed(const run_shared *sh, int n)
{
    for (int r = 0; r < n; r++)
        if (sh->rr[r].finished && sh->rr[r].status) return true;
    return false;
}

/* With sh->mu held: waits until every started rank finished or, once one
 * of them failed, ABANDON_MS more. */
static void wait_ranks(run_shared *sh, int n, int started)
{
    uint64_t abandon_at = 0;
    while (sh->done < started) {
        if (!abandon_at && some_rank_failed(sh, n))
            abandon_at = mono_ns() + (uint64_t)ABANDON_MS * 1000000u;
        if (!abandon_at) {
            pthread_cond_wait(&sh->cv, &sh->mu);
            continue;
        }
        if (mono_ns() >= abandon_at) return;
        struct timespec ts = {(time_t)(abandon_at / 1000000000u), (long)(abandon_at % 1000000000u)};
        int rc = pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
        if (rc && rc != ETIMEDOUT) return;
    }
}

static run_shared *run_alloc(int n)
{
    run_shared *sh = lpx_calloc(1, sizeof *sh);
    if (!sh) return NULL;
    sh->rr = lpx_calloc((size_t)n, sizeof *sh->rr);
    sh->comms = lpx_calloc((size_t)n, sizeof *sh->comms);
    pthread_condattr_t ca;
    bool cv_ok = false;
    if (sh->rr && sh->comms && !pthread_condattr_init(&ca)) {
        cv_ok = !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&sh->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (cv_ok && !pthread_mutex_init(&sh->mu, NULL)) return sh;
    if (cv_ok) pthread_cond_destroy(&sh->cv);
    lpx_free(sh->rr);
    lpx_free(sh->comms);
    lpx_free(sh);
    return NULL;
}

lpx_status lpx_local_run(int n, lpx_comm_rank_fn fn, void *ctx, int64_t timeout_ms, lpx_status *statuses)
{
    if (n < 1 || n > LPX_LOCAL_MAX_RANKS)
        return lpx_error(LPX_EINVAL, "lpx_local_run: %d ranks is not in 1..%d", n, LPX_LOCAL_MAX_RANKS);
    if (!fn) return lpx_error(LPX_EINVAL, "lpx_local_run: fn is NULL");
    if (timeout_ms < 0)
        return lpx_error(LPX_EINVAL, "lpx_local_run: timeout %" PRId64 " ms is negative", timeout_ms);
    run_shared *sh = run_alloc(n);
    if (!sh) return lpx_error(LPX_ENOMEM, "lpx_local_run: out of memory for %d ranks", n);
    run_rank *rr = sh->rr;
    lpx_status st = lpx_local_comm_group_create(n, sh->comms);
    for (int r = 0; r < n && !st; r++) {
        rr[r].comm = sh->comms[r];
        rr[r].fn = fn;
        rr[r].ctx = ctx;
        rr[r].sh = sh;
        if (timeout_ms) st = lpx_comm_set_timeout(sh->comms[r], timeout_ms);
    }
    if (st) {
        for (int r = 0; r < n; r++) lpx_comm_destroy(sh->comms[r]);
        run_free(sh);
        return st;
    }
    int started = 0;
    for (int r = 0; r < n; r++) {
        int rc = pthread_create(&rr[r].thread, NULL, rank_main, &rr[r]);
        rr[r].started = rc == 0;
        started += rr[r].started;
        if (!rr[r].started) {
            /* the ranks already running must not wait for this one */
            rr[r].status = LPX_ECOMM;
            snprintf(rr[r].msg, sizeof rr[r].msg, "thread could not be started (%s)", strerror(rc));
            rr[r].finished = true;
            lpx_comm_abort(sh->comms[r], rr[r].msg);
        }
    }

    /* Everything below runs under the lock, so an abandoned thread that
     * ends meanwhile waits until the run has decided who owns what. */
    pthread_mutex_lock(&sh->mu);
    wait_ranks(sh, n, started);
    int first_error = -1, first_stuck = -1;
    for (int r = 0; r < n; r++) {
        lpx_status s_r;
        if (rr[r].finished) {
            if (rr[r].started) pthread_join(rr[r].thread, NULL);
            lpx_comm_destroy(sh->comms[r]);
            s_r = rr[r].status;
            if (s_r && first_error < 0) first_error = r;
        } else {
            pthread_detach(rr[r].thread);
            rr[r].abandoned = true;
            sh->refs++;
            s_r = LPX_ETIMEOUT;
            if (first_stuck < 0) first_stuck = r;
        }
        if (statuses) statuses[r] = s_r;
    }
    /* the root cause is the rank that failed, not the ones it left stuck */
    if (first_error >= 0)
        st = lpx_error(rr[first_error].status, "lpx_local_run: rank %d: %s%s", first_error, rr[first_error].msg,
                       first_stuck >= 0 ? " (and a rank still running was abandoned)" : "");
    else
        st = first_stuck < 0 ? LPX_OK
                             : lpx_error(LPX_ETIMEOUT, "lpx_local_run: rank %d still running %d ms after the group "
                                         "failed: abandoned (its thread is detached; end the process)",
                                         first_stuck, ABANDON_MS);
    bool free_now = sh->refs == 0;
    pthread_mutex_unlock(&sh->mu);
    if (free_now) run_free(sh);
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
