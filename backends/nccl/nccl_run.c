/* Running the rank functions of lpx-nccl's comm backend: one rank of this
 * process (nc_run_rank), or ranks 0..n-1 on GPUs 0..n-1 as threads of this
 * process (nc_run_local), with the failure model of the local backend: a
 * rank whose function fails aborts its comm (its peers' watchdogs abort
 * theirs), and a rank that never returns cannot hold the process. Once a
 * rank has failed, the others get NC_ABANDON_MS to return; the ones still
 * running are then abandoned (detached, reported LPX_ETIMEOUT) and the run
 * returns, so the process can exit within its comm timeout and a few
 * seconds. An abandoned thread keeps its comm and the run's records; the
 * last abandoned thread to end frees them. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "nccl_internal.h"

#define NC_ABANDON_MS 2000

lpx_status nc_run_rank(lpx_comm *c, lpx_comm_rank_fn fn, void *ctx, char *msg, size_t len)
{
    lpx_clear_error();
    lpx_status st = fn(c, ctx);
    msg[0] = 0;
    if (st) {
        snprintf(msg, len, "%s", lpx_last_error()[0] ? lpx_last_error() : lpx_status_string(st));
        char reason[NC_MSG + 64];
        snprintf(reason, sizeof reason, "its function returned %s: %s", lpx_status_string(st), msg);
        lpx_comm_abort(c, reason);
    }
    lpx_comm_destroy(c);
    return st;
}

typedef struct run_shared run_shared;

typedef struct rank_thread {
    pthread_t tid;
    bool started;
    bool finished;             /* under sh->mu: st and msg are final */
    bool abandoned;            /* under sh->mu: the run returned without it */
    lpx_comm *comm;
    lpx_comm_rank_fn fn;
    void *ctx;
    lpx_status st;
    char msg[NC_MSG];
    run_shared *sh;
} rank_thread;

struct run_shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* on CLOCK_MONOTONIC; broadcast when a rank finishes */
    int done, refs;            /* refs: abandoned ranks still running */
    rank_thread *ts;
};

static void run_free(run_shared *sh)
{
    pthread_cond_destroy(&sh->cv);
    pthread_mutex_destroy(&sh->mu);
    free(sh->ts);
    free(sh);
}

static void *rank_main(void *arg)
{
    rank_thread *t = arg;
    run_shared *sh = t->sh;
    lpx_status st = nc_run_rank(t->comm, t->fn, t->ctx, t->msg, sizeof t->msg);
    pthread_mutex_lock(&sh->mu);
    t->st = st;
    t->finished = true;
    sh->done++;
    bool last = t->abandoned && --sh->refs == 0;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    if (last) run_free(sh);
    return NULL;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* With sh->mu held: until every started rank finished or, once one of
 * them failed, NC_ABANDON_MS more. */
static void wait_ranks(run_shared *sh, int n, int started)
{
    uint64_t abandon_at = 0;
    while (sh->done < started) {
        for (int r = 0; r < n && !abandon_at; r++)
            if (sh->ts[r].finished && sh->ts[r].st) abandon_at = mono_ns() + (uint64_t)NC_ABANDON_MS * 1000000u;
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
    run_shared *sh = calloc(1, sizeof *sh);
    if (!sh) return NULL;
    sh->ts = calloc((size_t)n, sizeof *sh->ts);
    pthread_condattr_t ca;
    bool cv_ok = false;
    if (sh->ts && !pthread_condattr_init(&ca)) {
        cv_ok = !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&sh->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (cv_ok && !pthread_mutex_init(&sh->mu, NULL)) return sh;
    if (cv_ok) pthread_cond_destroy(&sh->cv);
    free(sh->ts);
    free(sh);
    return NULL;
}

lpx_status nc_run_local(int n, int64_t timeout_ms, lpx_comm_rank_fn fn, void *ctx, lpx_status *statuses)
{
    lpx_comm **comms = calloc((size_t)n, sizeof *comms);
    run_shared *sh = run_alloc(n);
    if (!comms || !sh) {
        free(comms);
        if (sh) run_free(sh);
        return lpx_error(LPX_ENOMEM, "nccl backend: out of memory");
    }
    lpx_status st = lpx_nccl_comm_create_local(n, NULL, timeout_ms, comms);
    if (st) {
        free(comms);
        run_free(sh);
        return nc_wrap(st, "nccl backend");
    }
    rank_thread *ts = sh->ts;
    int started = 0;
    if (n == 1) {
        /* no thread: nothing can be abandoned */
        ts[0].st = nc_run_rank(comms[0], fn, ctx, ts[0].msg, sizeof ts[0].msg);
        ts[0].finished = true;
    } else {
        for (int r = 0; r < n; r++) {
            ts[r] = (rank_thread){.comm = comms[r], .fn = fn, .ctx = ctx, .sh = sh};
            if (pthread_create(&ts[r].tid, NULL, rank_main, &ts[r]) == 0) {
                ts[r].started = true;
                started++;
                continue;
            }
            /* this rank and the later ones never run: fail the group */
            for (int q = r; q < n; q++) {
                ts[q].st = LPX_ECOMM;
                ts[q].finished = true;
                snprintf(ts[q].msg, sizeof ts[q].msg, "could not start the thread of rank %d", q);
                lpx_comm_abort(comms[q], ts[q].msg);
                lpx_comm_destroy(comms[q]);
            }
            break;
        }
    }
    free(comms);
    /* under the lock: an abandoned thread that ends meanwhile waits until
     * the run has decided who frees what */
    pthread_mutex_lock(&sh->mu);
    wait_ranks(sh, n, started);
    int first_error = -1, first_stuck = -1;
    for (int r = 0; r < n; r++) {
        lpx_status s_r;
        if (ts[r].finished) {
            if (ts[r].started) pthread_join(ts[r].tid, NULL);
            s_r = ts[r].st;
            if (s_r && first_error < 0) first_error = r;
        } else {
            pthread_detach(ts[r].tid);
            ts[r].abandoned = true;
            sh->refs++;
            s_r = LPX_ETIMEOUT;
            if (first_stuck < 0) first_stuck = r;
        }
        if (statuses) statuses[r] = s_r;
    }
    if (first_error >= 0)
        st = lpx_error(ts[first_error].st, "rank %d: %s%s", first_error, ts[first_error].msg,
                       first_stuck >= 0 ? " (and a rank still running was abandoned)" : "");
    else
        st = first_stuck < 0 ? LPX_OK
                             : lpx_error(LPX_ETIMEOUT, "rank %d still running %d ms after the group failed: "
                                         "abandoned (its thread is detached; end the process)",
                                         first_stuck, NC_ABANDON_MS);
    bool free_now = sh->refs == 0;
    pthread_mutex_unlock(&sh->mu);
    if (free_now) run_free(sh);
    return st;
}
