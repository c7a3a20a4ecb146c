/* lpx-nccl.so internals. One nccl_rank per comm: a non-blocking NCCL
 * communicator (ncclConfig_t.blocking = 0), the comm's own stream on its
 * device, the ring of collectives in flight, a watchdog thread and the
 * sticky failure record.
 *
 * Ordering against lpx-cuda: every collective records `ready` on
 * lpx-cuda's stream of the device and makes the comm stream wait for it
 * (the inputs are written), runs on the comm stream, records its own event
 * there, and (unless the comm is deferred) makes lpx-cuda's stream wait for
 * that (nothing queued later reads a result early or reuses a buffer, even
 * one freed right after the call: lpx-cuda frees on its own stream).
 *
 * Why a watchdog: the call returns before the collective runs, so a peer
 * that never arrives is seen on the device, not in the call. The watchdog
 * polls the events in flight and ncclCommGetAsyncError; when a collective
 * is still running past its deadline, NCCL reports an error, or an
 * in-process peer failed, it aborts the NCCL communicator (which ends the
 * kernels stuck waiting, so lpx-cuda's stream moves again) and records the
 * failure; the next call on the comm reports it.
 *
 * Locking: `mu` serializes every NCCL call on the communicator and every
 * field below it between the thread that drives the comm and the watchdog. */
#ifndef LPX_NCCL_INTERNAL_H
#define LPX_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include "lpx_nccl.h"
#include <lpx/plugin.h>
#include <lpx/cuda.h>

#define NC_MSG 512        /* bytes of a failure reason */
#define NC_FLIGHT 64      /* collectives in flight per comm before a call waits */

/* Ranks created together in this process (lpx_nccl_comm_create_local):
 * the first failure of one fails the others at once. */
typedef struct nc_group {
    _Atomic int refs;
    _Atomic int failed;
    pthread_mutex_t mu;
    char reason[NC_MSG];
} nc_group;

typedef struct nc_flight {
    cudaEvent_t ev;           /* recorded on the comm stream after the collective */
    uint64_t seq;
    uint64_t no;              /* this rank's count of enqueued collectives: the ticket */
    lpx_coll kind;
    uint64_t deadline_ns;
    int64_t timeout_ms;
} nc_flight;

typedef struct nccl_rank {
    int rank, size, dev;
    lpx_comm *comm;           /* the handle wrapping this rank (for the extras) */
    nc_group *group;          /* NULL for a rank alone in its process */
    cudaStream_t stream;      /* the comm stream */
    cudaStream_t compute;     /* lpx-cuda's stream of dev */
    cudaEvent_t ready;        /* recorded on compute before each collective */
    float *scratch;           /* the barrier's one value (device) */

    pthread_mutex_t mu;
    ncclComm_t nc;            /* NULL once aborted or destroyed */
    nc_flight fl[NC_FLIGHT];  /* ring: fl[head .. head+nfl) are in flight */
    unsigned head, nfl;
    uint64_t enq;             /* collectives enqueued so far (fl[].no of the latest) */
    bool deferred;
    bool defer_once;          /* lpx_nccl_all_gather_host: the next collective is deferred */
    int64_t timeout_ms;       /* last known timeout (destroy bounds its waits by it) */
    bool failed, reported;
    lpx_status fail_code;
    char reason[NC_MSG];

    pthread_t wd;             /* the watchdog */
    bool wd_running, wd_stop;
    pthread_cond_t wd_cv;
} nccl_rank;

/* nccl_plugin.c: lpx-cuda's extras, found at init */
extern lpx_cuda_stream_fn nc_cuda_stream;
extern lpx_cuda_device_count_fn nc_cuda_device_count;

/* nccl_comm.c */
/* Creates n ranks of a world of `size` in this process: rank ranks[i] on
 * devs[i], all from `id`, in one NCCL group; comms[i] gets each. n > 1
 * puts them in one nc_group. timeout_ms 0: the comm default. */
lpx_status nc_create(int n, const int *ranks, const int *devs, int size, const ncclUniqueId *id,
                     int64_t timeout_ms, lpx_comm **comms);
/* Default timeout of a new comm (LPX_COMM_TIMEOUT_MS, else the default). */
int64_t nc_default_timeout_ms(void);
/* Returns st with "<prefix>: <the current error message>" (the message
 * is copied first: lpx_error formats into the buffer it would read). */
lpx_status nc_wrap(lpx_status st, const char *prefix);
/* "ncclX failed: <ncclGetErrorString> (<ncclGetLastError>)" into buf. */
void nc_describe(char *buf, size_t len, const char *call, ncclResult_t rc, ncclComm_t nc);

/* nccl_run.c */
/* Runs fn for one rank, aborts its comm when fn fails (so its peers
 * fail), destroys the comm; msg gets the failure's message. */
lpx_status nc_run_rank(lpx_comm *c, lpx_comm_rank_fn fn, void *ctx, char *msg, size_t len);
/* Ranks 0..n-1 of one world on GPUs 0..n-1, one thread each; a rank still
 * running 2 s after another failed is abandoned (LPX_ETIMEOUT). */
lpx_status nc_run_local(int n, int64_t timeout_ms, lpx_comm_rank_fn fn, void *ctx, lpx_status *statuses);

#endif
