/* The local group: rendezvous with deadlines, the sticky failure record
 * and ranks that leave. See local_internal.h for the protocol. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "local_internal.h"

lpx_status local_group_new(int n, local_group **out)
{
    local_group *g = lpx_calloc(1, sizeof *g);
    if (!g) return lpx_error(LPX_ENOMEM, "local comm: out of memory for a group of %d", n);
    g->n = n;
    g->live = n;
    g->entered = lpx_calloc((size_t)n, sizeof *g->entered);
    g->gone = lpx_calloc((size_t)n, sizeof *g->gone);
    g->posted = lpx_calloc((size_t)n, sizeof *g->posted);
    pthread_condattr_t ca;
    bool cond_ok = false, mu_ok = false;
    if (g->entered && g->gone && g->posted && !pthread_condattr_init(&ca)) {
        cond_ok = !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&g->cv, &ca);
        pthread_condattr_destroy(&ca);
        mu_ok = cond_ok && !pthread_mutex_init(&g->mu, NULL);
    }
    if (!mu_ok) {
        if (cond_ok) pthread_cond_destroy(&g->cv);
        lpx_free(g->entered);
        lpx_free(g->gone);
        lpx_free(g->posted);
        lpx_free(g);
        return lpx_error(LPX_ENOMEM, "local comm: out of memory for a group of %d", n);
    }
    *out = g;
    return LPX_OK;
}

void local_group_unref(local_group *g)
{
    pthread_mutex_lock(&g->mu);
    bool last = --g->live == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    lpx_free(g->entered);
    lpx_free(g->gone);
    lpx_free(g->posted);
    lpx_free(g);
}

/* Records the first failure and wakes every waiter. Caller holds g->mu. */
static void fail_locked_v(local_group *g, const char *fmt, va_list ap)
{
    if (!g->failed) {
        vsnprintf(g->reason, sizeof g->reason, fmt, ap);
        g->failed = true;
    }
    pthread_cond_broadcast(&g->cv);
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
static void fail_locked(local_group *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_locked_v(g, fmt, ap);
    va_end(ap);
}

void local_fail(local_group *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g->mu);
    fail_locked_v(g, fmt, ap);
    pthread_mutex_unlock(&g->mu);
    va_end(ap);
}

/* "all_gather #3 (96 bytes)": what a rank called, for mismatch messages. */
static void describe(const lpx_comm_args *a, char *buf, size_t len)
{
    switch (a->kind) {
    case LPX_COLL_REDUCE_SCATTER:
    case LPX_COLL_ALL_REDUCE:
        snprintf(buf, len, "%s #%" PRIu64 " (%zu x %s, %s)", lpx_coll_name(a->kind), a->seq, a->count,
                 lpx_dtype_name(a->dtype), lpx_reduce_op_name(a->op));
        break;
    case LPX_COLL_BROADCAST:
        snprintf(buf, len, "%s #%" PRIu64 " (%zu bytes from root %d)", lpx_coll_name(a->kind), a->seq,
                 a->nbytes, a->root);
        break;
    case LPX_COLL_BARRIER:
        snprintf(buf, len, "%s #%" PRIu64, lpx_coll_name(a->kind), a->seq);
        break;
    default:
        snprintf(buf, len, "%s #%" PRIu64 " (%zu bytes per rank)", lpx_coll_name(a->kind), a->seq,
                 a->nbytes);
        break;
    }
}

/* Do two ranks' calls fit together? all_gather moves bytes, so only the
 * byte count must agree; reductions need the same elements, dtype and op. */
static bool compatible(const lpx_comm_args *x, const lpx_comm_args *y)
{
    if (x->kind != y->kind || x->nbytes != y->nbytes) return false;
    switch (x->kind) {
    case LPX_COLL_REDUCE_SCATTER:
    case LPX_COLL_ALL_REDUCE:
        return x->count == y->count && x->dtype == y->dtype && x->op == y->op;
    case LPX_COLL_BROADCAST:
        return x->root == y->root;
    default:
        return true;
    }
}

/* The last arrival checks every rank's call against rank 0's, under the
 * lock, so every rank gets the same verdict before any data moves. */
static bool mismatch_locked(local_group *g)
{
    for (int q = 1; q < g->n; q++)
        if (!compatible(g->posted[0], g->posted[q])) {
            char d0[160], dq[160];
            describe(g->posted[0], d0, sizeof d0);
            describe(g->posted[q], dq, sizeof dq);
            fail_locked(g, "mismatched collectives: rank %d called %s while rank 0 called %s", q, dq, d0);
            return true;
        }
    return false;
}

/* A rank that left without entering rendezvous `target` will never come. */
static bool check_gone_locked(local_group *g, uint64_t target, const lpx_comm_args *a)
{
    for (int q = 0; q < g->n; q++)
        if (g->gone[q] && g->entered[q] <= target) {
            fail_locked(g, "rank %d left (%s) without joining %s #%" PRIu64, q, g->gone[q],
                        lpx_coll_name(a->kind), a->seq);
            return true;
        }
    return false;
}

static struct timespec to_timespec(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    return ts;
}

/* "rank 3" or "ranks 1, 3" (up to 8 named): who has not arrived. */
static void missing_ranks(local_group *g, uint64_t target, char *buf, size_t len)
{
    int nmiss = 0;
    size_t used = 0;
    for (int q = 0; q < g->n; q++)
        if (g->entered[q] <= target) nmiss++;
    used += (size_t)snprintf(buf, len, "%s", nmiss == 1 ? "rank" : "ranks");
    int shown = 0;
    for (int q = 0; q < g->n && used < len; q++) {
        if (g->entered[q] > target) continue;
        if (shown == 8) {
            snprintf(buf + used, len - used, " and %d more", nmiss - shown);
            break;
        }
        used += (size_t)snprintf(buf + used, len - used, "%s %d", shown ? "," : "", q);
        shown++;
    }
}

lpx_status local_arrive(local_rank *me, const lpx_comm_args *a)
{
    local_group *g = me->g;
    if (a->device.type != LPX_DEVICE_CPU) {
        local_fail(g, "rank %d passed buffers on device type %d to %s #%" PRIu64
                   " (the local backend reaches CPU memory only)", me->rank, (int)a->device.type,
                   lpx_coll_name(a->kind), a->seq);
        return lpx_error(LPX_EDEVICE, "buffers on device type %d; the local backend reaches CPU "
                         "memory only", (int)a->device.type);
    }
    pthread_mutex_lock(&g->mu);
    if (g->failed) {
        lpx_status st = lpx_error(LPX_ECOMM, "the comm failed earlier: %s", g->reason);
        pthread_mutex_unlock(&g->mu);
        return st;
    }
    uint64_t target = g->gen;
    g->posted[me->rank] = a;
    g->entered[me->rank] = target + 1;
    if (++g->count == g->n) {
        if (mismatch_locked(g)) {
            g->posted[me->rank] = NULL;
            lpx_status st = lpx_error(LPX_ECOMM, "%s", g->reason);
            pthread_mutex_unlock(&g->mu);
            return st;
        }
        g->count = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return LPX_OK;
    }
    check_gone_locked(g, target, a);
    struct timespec deadline = to_timespec(a->deadline_ns);
    lpx_status st = LPX_OK;
    while (g->gen == target) {  /* completion wins over a failure recorded after it */
        if (g->failed) {
            st = lpx_error(LPX_ECOMM, "%s", g->reason);
            break;
        }
        int rc = pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
        if (rc == ETIMEDOUT && g->gen == target && !g->failed) {
            char who[128];
            missing_ranks(g, target, who, sizeof who);
            fail_locked(g, "rank %d timed out after %" PRId64 " ms in %s #%" PRIu64 " waiting for %s",
                        me->rank, a->timeout_ms, lpx_coll_name(a->kind), a->seq, who);
            st = lpx_error(LPX_ETIMEOUT, "timed out after %" PRId64 " ms waiting for %s; the comm "
                           "is now failed", a->timeout_ms, who);
            break;
        }
    }
    if (st) g->posted[me->rank] = NULL;  /* `a` dies with this call; nobody may read it */
    pthread_mutex_unlock(&g->mu);
    return st;
}

void local_depart(local_rank *me)
{
    local_group *g = me->g;
    pthread_mutex_lock(&g->mu);
    uint64_t target = g->gen;
    g->entered[me->rank] = target + 1;
    if (++g->count == g->n) {
        g->count = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->gen == target) pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

void local_leave(local_rank *me, const char *why)
{
    local_group *g = me->g;
    pthread_mutex_lock(&g->mu);
    if (!g->gone[me->rank]) {
        g->gone[me->rank] = why;
        /* peers waiting in a rendezvous this rank never entered (after a
         * failure, the count of an unfinished rendezvous is meaningless) */
        if (!g->failed && g->count > 0 && g->entered[me->rank] <= g->gen) {
            for (int q = 0; q < g->n; q++)
                if (g->entered[q] > g->gen && g->posted[q]) {
                    check_gone_locked(g, g->gen, g->posted[q]);
                    break;
                }
        }
    }
    pthread_mutex_unlock(&g->mu);
}
