/* The local backend: N ranks as N threads of one process, meeting in a
 * shared group. Each collective is two rendezvous on the group's mutex and
 * condition variable:
 *
 *   arrive  every rank posts its lpx_comm_args and waits, until the
 *           deadline, for all others (this is where a failure, an exit or a
 *           timeout is noticed; the last to arrive checks that all ranks
 *           called the same collective);
 *   work    each rank moves data straight between the posted buffers (no
 *           staging);
 *   depart  each rank waits until all have finished touching the others'
 *           buffers, so none returns while a peer still reads its send or
 *           writes its recv. Once everyone has arrived the work is bounded
 *           local copying, so depart waits without a deadline: returning
 *           early would hand the caller a buffer a peer is still using.
 *
 * Failure is sticky: the first reason is kept and every later arrival
 * fails with it. */
#ifndef LPX_LOCAL_INTERNAL_H
#define LPX_LOCAL_INTERNAL_H

#include <pthread.h>
#include "../../core/lpx_internal.h"
#include "lpx/comm.h"

#define LOCAL_REASON 640

typedef struct local_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;              /* CLOCK_MONOTONIC, so deadlines ignore wall-clock jumps */
    int n;
    int live;                       /* handles not yet destroyed; the last frees the group */
    uint64_t gen;                   /* rendezvous completed */
    int count;                      /* arrivals in rendezvous number `gen` */
    uint64_t *entered;              /* [n] rendezvous each rank has entered */
    const char **gone;              /* [n] NULL, or why the rank left for good */
    const lpx_comm_args **posted;   /* [n] each rank's call, valid while it is inside */
    bool failed;
    char reason[LOCAL_REASON];      /* the first failure, names the rank */
} local_group;

typedef struct local_rank {
    local_group *g;
    int rank;
    const void **srcs;              /* [n] scratch for reductions: no allocation per call */
} local_rank;

/* local_group.c */
lpx_status local_arrive(local_rank *me, const lpx_comm_args *a);
void local_depart(local_rank *me);
void local_fail(local_group *g, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Marks rank `me` as gone for good (`why`: a static string). Peers waiting
 * for it fail now; later collectives fail when they start. Idempotent. */
void local_leave(local_rank *me, const char *why);
/* Drops one handle's reference; frees the group with the last one. */
void local_group_unref(local_group *g);
lpx_status local_group_new(int n, local_group **out);

/* local_comm.c */
extern const lpx_comm_i lpx__local_comm_vt;

/* The local_rank behind a comm of this backend, or NULL. */
local_rank *local_rank_of(lpx_comm *comm);

#endif
