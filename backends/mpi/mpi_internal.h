/* lpx-mpi.so internals. One mpi_rank per comm: two duplicates of the
 * user's communicator (data for the collectives, ctrl for failure
 * notices), a grow-only workspace every collective goes through, and the
 * sticky failure record.
 *
 * Why a workspace: a non-blocking MPI collective cannot be cancelled or
 * freed (MPI-3.1 5.12), so when a call gives up at its deadline MPI may
 * still read or write its buffers later. They must therefore be lpx's, not
 * the caller's: the workspace of a failed call is stranded (kept reachable
 * for the life of the process), never freed nor reused.
 *
 * Communicators that may still receive messages are never freed either.
 * Open MPI queues a message that arrives for a freed communicator and
 * replays it into the next communicator given the same context id, where
 * it takes the place of a real message (seen with Open MPI 4.1: a barrier
 * on a fresh comm that completes on some ranks and hangs on others). A
 * failure notice can arrive at any time after a peer fails, and a stranded
 * collective's fragments too, so the ctrl communicator is kept until
 * MPI_Finalize, and the data communicator when a request on it was
 * stranded: one leaked communicator per comm, in exchange for comms that
 * can be created again after a failure. */
#ifndef LPX_MPI_INTERNAL_H
#define LPX_MPI_INTERNAL_H

#include <mpi.h>
#include <stdatomic.h>
#include <stdbool.h>
#include "lpx_mpi.h"

#define MPI_NOTICE 512     /* bytes of a failure notice */
#define TAG_NOTICE 0x4c50  /* "LP" */

typedef struct mpi_rank {
    MPI_Comm data, ctrl;
    int rank, size;
    unsigned char *ws;     /* workspace, 64-byte aligned */
    size_t ws_cap;
    char *notice_in;       /* pre-posted receive for a peer's notice */
    MPI_Request notice_req;
    char *notice_out;      /* what this rank tells its peers when it fails */
    MPI_Request *notice_sends;  /* [size] */
    const void **srcs;     /* [size] reduction sources: no allocation per call */
    bool notified;         /* notices sent */
    bool stranded;         /* a request on `data` will never complete */
    uint64_t done_seq;     /* last collective this rank completed */
    /* A peer's notice carries the last collective that peer completed:
     * it dooms collectives after that one, not the one it finished (a
     * broadcast root can finish, then abort, while others still receive). */
    bool have_notice;
    uint64_t notice_seq;
    char notice_reason[MPI_NOTICE];
    bool failed;
    char reason[MPI_NOTICE];
} mpi_rank;

/* mpi_wait.c */
/* Set once any comm of this process failed (timeout, abort, a peer's
 * notice, an MPI error): the exit handler then ends the whole job with
 * MPI_Abort instead of MPI_Finalize, which waits for every process and
 * never returns when a peer is stalled. */
extern atomic_bool mpi_any_failed;
/* Marks the comm failed with `reason` (first wins) and, if `tell`, sends
 * the notice to every peer. */
void mpi_fail(mpi_rank *m, bool tell, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* LPX_ECOMM with the reason if the comm failed or a peer's notice dooms
 * collective `seq`. */
lpx_status mpi_check(mpi_rank *m, uint64_t seq);
/* Polls `req` until it completes (LPX_OK), a peer's notice arrives
 * (LPX_ECOMM) or the deadline passes (LPX_ETIMEOUT, peers told). On
 * failure the workspace is stranded with the request. */
lpx_status mpi_wait(mpi_rank *m, MPI_Request *req, const lpx_comm_args *a);
/* LPX_ECOMM naming the MPI call and its error text; fails the comm. */
lpx_status mpi_error(mpi_rank *m, const char *call, int rc);
/* Keeps `p` reachable for the life of the process (MPI may still use it). */
void mpi_strand(void *p);
/* Workspace of at least n bytes (LPX_ENOMEM fails the comm, peers told). */
lpx_status mpi_workspace(mpi_rank *m, size_t n, unsigned char **out);

/* mpi_comm.c */
extern const lpx_comm_i lpx__mpi_comm_vt;

#endif
