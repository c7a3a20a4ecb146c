/* Waiting on MPI with a deadline, and failure notices between ranks.
 *
 * Every collective is non-blocking and polled with MPI_Test (which is also
 * what drives Open MPI's progress for it). Between polls the pre-posted
 * receive on the ctrl communicator is tested: a peer that aborts or times
 * out sends every rank a one-line notice there, so they fail at once with
 * its reason instead of waiting for their own deadline. MPI_Abort is not
 * called here: the caller decides what a failure means, but a process that
 * exits after one without finalizing explicitly ends the job (the exit
 * handler in mpi_backend.c). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "mpi_internal.h"

/* Stranded buffers: reachable from here until exit, so leak checkers stay
 * quiet about memory MPI may still write into. */
typedef struct stranded {
    struct stranded *next;
    void *p;
} stranded;
static stranded *strand_list;
static pthread_mutex_t strand_mu = PTHREAD_MUTEX_INITIALIZER;

void mpi_strand(void *p)
{
    if (!p) return;
    stranded *s = malloc(sizeof *s);
    if (!s) return;  /* then the buffer simply leaks, which is also safe */
    pthread_mutex_lock(&strand_mu);
    s->p = p;
    s->next = strand_list;
    strand_list = s;
    pthread_mutex_unlock(&strand_mu);
}

/* Sends the notice ("<done_seq> <reason>") to every peer and gives the
 * sends up to 20 ms to leave (they are small, so MPI sends them eagerly
 * and this rarely waits at all); sends still pending are freed at destroy,
 * where MPI completes them on its own, their buffer stranded. */
static void tell_peers(mpi_rank *m)
{
    if (m->notified) return;
    m->notified = true;
    snprintf(m->notice_out, MPI_NOTICE, "%" PRIu64 " %.480s", m->done_seq, m->reason);
    int len = (int)strlen(m->notice_out) + 1;
    for (int q = 0; q < m->size; q++) {
        m->notice_sends[q] = MPI_REQUEST_NULL;
        if (q != m->rank)
            MPI_Isend(m->notice_out, len, MPI_CHAR, q, TAG_NOTICE, m->ctrl, &m->notice_sends[q]);
    }
    uint64_t until = lpx_now_ns() + UINT64_C(20000000);
    int done = 0;
    while (!done && lpx_now_ns() < until) {
        MPI_Testall(m->size, m->notice_sends, &done, MPI_STATUSES_IGNORE);
        if (!done) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

atomic_bool mpi_any_failed;

void mpi_fail(mpi_rank *m, bool tell, const char *fmt, ...)
{
    atomic_store(&mpi_any_failed, true);
    if (!m->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->reason, sizeof m->reason, fmt, ap);
        va_end(ap);
        m->failed = true;
    }
    if (tell) tell_peers(m);
}

/* Takes in every notice that arrived, keeping the earliest one (the
 * smallest completed seq), and re-posts the receive for the next. */
static void poll_notices(mpi_rank *m)
{
    while (m->notice_req != MPI_REQUEST_NULL) {
        int got = 0;
        if (MPI_Test(&m->notice_req, &got, MPI_STATUS_IGNORE) != MPI_SUCCESS || !got) return;
        m->notice_in[MPI_NOTICE - 1] = 0;
        char *text;
        uint64_t seq = strtoull(m->notice_in, &text, 10);
        if (*text == ' ') text++;
        if (!m->have_notice || seq < m->notice_seq) {
            m->notice_seq = seq;
            snprintf(m->notice_reason, sizeof m->notice_reason, "%s", text);  /* names its rank */
        }
        m->have_notice = true;
        if (MPI_Irecv(m->notice_in, MPI_NOTICE, MPI_CHAR, MPI_ANY_SOURCE, TAG_NOTICE, m->ctrl,
                      &m->notice_req) != MPI_SUCCESS)
            m->notice_req = MPI_REQUEST_NULL;
    }
}

/* Does a peer's notice mean collective `seq` cannot complete? */
static bool doomed(mpi_rank *m, uint64_t seq)
{
    poll_notices(m);
    if (!m->have_notice || m->notice_seq >= seq) return false;
    mpi_fail(m, false, "%s", m->notice_reason);
    return true;
}

lpx_status mpi_check(mpi_rank *m, uint64_t seq)
{
    if (m->failed) return lpx_error(LPX_ECOMM, "the comm failed earlier: %s", m->reason);
    if (doomed(m, seq)) return lpx_error(LPX_ECOMM, "%s", m->reason);
    return LPX_OK;
}

lpx_status mpi_error(mpi_rank *m, const char *call, int rc)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", rc);
    mpi_fail(m, true, "rank %d: %s failed: %s", m->rank, call, text);
    return lpx_error(LPX_ECOMM, "%s failed: %s", call, text);
}

lpx_status mpi_wait(mpi_rank *m, MPI_Request *req, const lpx_comm_args *a)
{
    /* spin briefly for fast completions, then sleep in growing steps so
     * oversubscribed ranks leave the cores to the ones doing work */
    long nap_ns = 0;
    for (unsigned polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            mpi_strand(m->ws);
            m->ws = NULL, m->ws_cap = 0;
            m->stranded = true;
            return mpi_error(m, "MPI_Test", rc);
        }
        if (done) return LPX_OK;
        lpx_status st = LPX_OK;
        if (doomed(m, a->seq)) {
            st = lpx_error(LPX_ECOMM, "%s", m->reason);
        } else if (lpx_now_ns() >= a->deadline_ns) {
            mpi_fail(m, true, "rank %d timed out after %" PRId64 " ms in %s #%" PRIu64
                     " (MPI does not say which peer is missing)", m->rank, a->timeout_ms,
                     lpx_coll_name(a->kind), a->seq);
            st = lpx_error(LPX_ETIMEOUT, "timed out after %" PRId64 " ms waiting for the other "
                           "ranks; the comm is now failed", a->timeout_ms);
        }
        if (st) {
            /* the request can be neither cancelled nor freed: it keeps the
             * workspace, which this comm never touches again */
            mpi_strand(m->ws);
            m->ws = NULL, m->ws_cap = 0;
            m->stranded = true;
            return st;
        }
        if (polls >= 64) {
            nap_ns = nap_ns ? (nap_ns < 200000 ? nap_ns * 2 : 200000) : 2000;
            struct timespec ts = {0, nap_ns};
            nanosleep(&ts, NULL);
        }
    }
}

lpx_status mpi_workspace(mpi_rank *m, size_t n, unsigned char **out)
{
    if (n <= m->ws_cap && m->ws) {
        *out = m->ws;
        return LPX_OK;
    }
    size_t cap = m->ws_cap * 2 > n ? m->ws_cap * 2 : n;
    cap = (cap + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, cap ? cap : 64)) {
        mpi_fail(m, true, "rank %d ran out of memory for a %zu-byte workspace", m->rank, cap);
        return lpx_error(LPX_ENOMEM, "out of memory for a %zu-byte workspace", cap);
    }
    free(m->ws);
    m->ws = p;
    m->ws_cap = cap;
    *out = m->ws;
    return LPX_OK;
}
