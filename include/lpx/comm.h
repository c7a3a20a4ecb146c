/* lpx — collectives.
 *
 * An lpx_comm is one rank's handle on a group of ranks that run
 * collectives together: all_gather, reduce_scatter, all_reduce, broadcast,
 * barrier. Backends implement the lpx_comm_i vtable ("local": N ranks as N
 * threads of this process, built in; "mpi": the plugin lpx-mpi.so; "nccl":
 * lpx-nccl.so, on GPUs, see docs/COMM.md); everything above them (the DTensor kind, the sharding engine)
 * calls the validated lpx_comm_* functions, which count statistics, record
 * one trace span per collective and call the vtable.
 *
 * Semantics shared by every backend (docs/COMM.md has the long form):
 *  - Every rank calls the same collectives in the same order with the same
 *    byte counts, dtype, op and root. Each rank contributes the same number
 *    of bytes: uneven shards (torch.chunk semantics) are the caller's job,
 *    who pads the last shards on the wire and unpads after.
 *  - All buffers are plain, contiguous memory of the comm's device. Tensors
 *    must be dense and contiguous (a kind tensor goes through its
 *    pre_all_gather hook first).
 *  - Reductions (sum, avg, max, min) run over f32, bf16 and f16, decode to
 *    f32, combine in rank order 0, 1, ..., N-1 and encode once (round to
 *    nearest even), so results are bit-identical across runs, thread
 *    timings and the built-in backends. avg divides the f32 sum by N;
 *    max/min propagate NaN.
 *  - Every call has a deadline (the comm's timeout). A rank that aborts,
 *    exits, stalls past the deadline or passes bad arguments makes every
 *    pending and later call of every rank fail with LPX_ECOMM or
 *    LPX_ETIMEOUT, with a message naming the collective, its sequence number,
 *    the failing rank and the reason. A failed comm stays failed: create a
 *    new one (the local backend) or restart the job (MPI).
 *  - A comm handle is used by one thread at a time. lpx_comm_abort, the
 *    timeout setter and the statistics readers may be called from any
 *    thread (but see the MPI notes in docs/COMM.md). */
#ifndef LPX_COMM_H
#define LPX_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "export.h"
#include "status.h"
#include "dtype.h"
#include "tensor.h"

LPX_BEGIN_DECLS

#define LPX_COMM_ABI_VERSION 1u

/** Default timeout of a new comm when LPX_COMM_TIMEOUT_MS is not set. */
#define LPX_COMM_DEFAULT_TIMEOUT_MS 600000

typedef struct lpx_comm lpx_comm;

/* Collective kinds: index of the statistics arrays. */
typedef enum lpx_coll {
    LPX_COLL_ALL_GATHER = 0,
    LPX_COLL_REDUCE_SCATTER = 1,
    LPX_COLL_ALL_REDUCE = 2,
    LPX_COLL_BROADCAST = 3,
    LPX_COLL_BARRIER = 4,
    LPX_COLL_COUNT = 5,
    LPX_COLL_MAX = 8 /* capacity of the statistics arrays (room to grow) */
} lpx_coll;

typedef enum lpx_reduce_op {
    LPX_REDUCE_SUM = 0,
    LPX_REDUCE_AVG = 1,   /* sum / N, computed in f32 */
    LPX_REDUCE_MAX = 2,   /* NaN-propagating */
    LPX_REDUCE_MIN = 3,   /* NaN-propagating */
    LPX_REDUCE_OP_COUNT = 4
} lpx_reduce_op;

/** "all_gather", "reduce_scatter", ...; "?" for an unknown kind. */
LPX_API const char *lpx_coll_name(lpx_coll kind);
/** "sum", "avg", "max", "min"; "?" for an unknown op. */
LPX_API const char *lpx_reduce_op_name(lpx_reduce_op op);

/* ---- calling collectives -------------------------------------------
 *
 * Common to every function below. Errors: LPX_EINVAL (NULL comm or
 * buffer, bad root/op, overlapping buffers other than the in-place forms,
 * non-contiguous or kind tensor), LPX_EDTYPE (dtype mismatch or a dtype
 * the reduction does not support), LPX_ESHAPE (element counts that do not
 * match the world size), LPX_EDEVICE (a device the backend cannot reach),
 * LPX_ECOMM (a peer failed, or the comm failed earlier), LPX_ETIMEOUT (this
 * rank's deadline passed), LPX_ENOMEM. An argument error on one rank
 * aborts the comm for all ranks (the peers would otherwise wait for a call
 * that never comes). The message always starts with
 * "<collective> #<seq> (rank R of N, <backend>):". Buffers stay owned by
 * the caller and are not retained after the call returns. */

/** All-gather of raw bytes: rank r's `nbytes` at `send` land at
 *  recv + r * nbytes on every rank (recv holds size * nbytes). Any dtype
 *  travels this way (pack mixed dtypes into one u8 buffer). In place:
 *  send == recv + rank * nbytes. nbytes may be 0 (still a sync point). */
LPX_API lpx_status lpx_comm_all_gather_buf(lpx_comm *comm, const void *send, void *recv,
                                           size_t nbytes);

/** All-gather of tensors of any dtype (u8, fp8, packed included): `out`
 *  must have the same dtype and size * numel(in) elements (its shape is
 *  free: [N*rows, cols] and flat both work); rank r's elements land at
 *  out's elements [r * numel(in), (r+1) * numel(in)). Both dense and
 *  contiguous; a packed dtype needs whole bytes per rank. */
LPX_API lpx_status lpx_comm_all_gather(lpx_comm *comm, const lpx_tensor *in, lpx_tensor *out);

/** Reduce-scatter: `send` holds size * count elements (block q = this
 *  rank's contribution to rank q); `recv` gets count elements, the
 *  reduction over ranks of block `rank`. dtype f32, bf16, f16, f8e4m3fn
 *  or f8e5m2 (fp8: 1 byte per element on the wire; the result is encoded
 *  saturating, see lpx_comm_reduce_buffers); f32 accumulation in rank
 *  order. In place: recv == send + rank * block. */
LPX_API lpx_status lpx_comm_reduce_scatter_buf(lpx_comm *comm, const void *send, void *recv,
                                               size_t count, lpx_dtype dtype, lpx_reduce_op op);

/** Reduce-scatter of tensors: numel(in) == size * numel(out), same dtype
 *  (f32/bf16/f16/f8e4m3fn/f8e5m2), both dense and contiguous. */
LPX_API lpx_status lpx_comm_reduce_scatter(lpx_comm *comm, const lpx_tensor *in, lpx_tensor *out,
                                           lpx_reduce_op op);

/** All-reduce of `count` elements (f32/bf16/f16/f8e4m3fn/f8e5m2); send == recv is the
 *  in-place form. One call reduces any number of values (all float8
 *  amaxes of a model in one buffer). */
LPX_API lpx_status lpx_comm_all_reduce_buf(lpx_comm *comm, const void *send, void *recv,
                                           size_t count, lpx_dtype dtype, lpx_reduce_op op);

/** All-reduce of tensor `t` in place. */
LPX_API lpx_status lpx_comm_all_reduce(lpx_comm *comm, lpx_tensor *t, lpx_reduce_op op);

/** Broadcast: root's `nbytes` at `buf` are copied into `buf` on every
 *  other rank. */
LPX_API lpx_status lpx_comm_broadcast_buf(lpx_comm *comm, void *buf, size_t nbytes, int root);

/** Broadcast of tensor `t` (any dtype, dense, contiguous) in place. */
LPX_API lpx_status lpx_comm_broadcast(lpx_comm *comm, lpx_tensor *t, int root);

/** Returns when every rank has called it (or fails like any collective). */
LPX_API lpx_status lpx_comm_barrier(lpx_comm *comm);

/** Declares this rank failed: every pending and later collective of every
 *  rank returns LPX_ECOMM naming this rank and `reason` (may be NULL). The
 *  first failure of a comm is the one reported; later aborts are no-ops.
 *  Safe from any thread for the local backend. NULL comm is ignored. */
LPX_API void lpx_comm_abort(lpx_comm *comm, const char *reason);

/* ---- the handle ---------------------------------------------------- */

LPX_API int lpx_comm_rank(const lpx_comm *comm);
LPX_API int lpx_comm_size(const lpx_comm *comm);
/** Backend name ("local", "mpi"); borrowed, valid while comm lives. */
LPX_API const char *lpx_comm_backend_name(const lpx_comm *comm);

/** Sets the timeout of each later call (milliseconds, > 0). A new comm
 *  starts with LPX_COMM_TIMEOUT_MS from the environment, else
 *  LPX_COMM_DEFAULT_TIMEOUT_MS. Errors: LPX_EINVAL. Thread-safe. */
LPX_API lpx_status lpx_comm_set_timeout(lpx_comm *comm, int64_t timeout_ms);
LPX_API int64_t lpx_comm_timeout(const lpx_comm *comm);

/** Destroys this rank's handle (the backend's destroy). For the local
 *  backend, peers still waiting for this rank then fail with LPX_ECOMM
 *  instead of timing out. NULL is ignored. */
LPX_API void lpx_comm_destroy(lpx_comm *comm);

/* ---- statistics ---------------------------------------------------- */

/** Per-comm counters, indexed by lpx_coll. `bytes` is the payload of this
 *  rank's successful calls: all_gather its contribution (nbytes),
 *  reduce_scatter its whole input (size * count elements), all_reduce and
 *  broadcast the buffer, barrier 0. (A ring algorithm sends (N-1)/N of the
 *  all_gather output, of the reduce_scatter input, and twice that of the
 *  all_reduce buffer from each rank.) `ns` is the wall time spent inside
 *  calls, failed ones included. */
typedef struct lpx_comm_stats {
    size_t struct_size;               /* set by the caller: sizeof(lpx_comm_stats) */
    uint64_t calls[LPX_COLL_MAX];     /* successful collectives */
    uint64_t bytes[LPX_COLL_MAX];
    uint64_t ns[LPX_COLL_MAX];
    uint64_t failures[LPX_COLL_MAX];  /* calls that returned an error */
} lpx_comm_stats;

/** Copies the counters into *out (up to out->struct_size bytes; set it
 *  first). Errors: LPX_EINVAL (NULL, struct_size too small). Thread-safe. */
LPX_API lpx_status lpx_comm_stats_get(const lpx_comm *comm, lpx_comm_stats *out);
/** Zeroes the counters (e.g. at the start of a step). NULL is ignored. */
LPX_API void lpx_comm_stats_reset(lpx_comm *comm);
/** Prints one line per collective kind (calls, bytes, time) to f. */
LPX_API void lpx_comm_stats_print(const lpx_comm *comm, FILE *f);

/* ---- writing a backend ---------------------------------------------
 *
 * A backend fills an lpx_comm_i and wraps its per-rank state with
 * lpx_comm_new. The lpx_comm_* functions validate arguments, so a slot
 * receives a consistent lpx_comm_args. A slot reports failure with
 * lpx_error(code, reason) and a reason only ("rank 2 aborted: ..."): the
 * caller prefixes the collective, sequence number and rank. A slot must not
 * return before the backend is done with the caller's buffers, even on
 * failure (copy through internal buffers where the transport cannot
 * guarantee that, as lpx-mpi.so does). */

/** One collective call as the backend sees it. Which fields mean what:
 *  all_gather: send (nbytes) -> recv (size * nbytes);
 *  reduce_scatter: send (size * count elements) -> recv (count elements);
 *  all_reduce: send (count) -> recv (count), possibly equal;
 *  broadcast: recv is the buffer (nbytes), send == recv;
 *  barrier: no buffers. */
typedef struct lpx_comm_args {
    size_t struct_size;       /* sizeof(lpx_comm_args) of the caller */
    lpx_coll kind;
    uint64_t seq;             /* 1-based number of this call on this comm */
    const void *send;
    void *recv;
    size_t count;             /* elements per rank block */
    size_t nbytes;            /* bytes per rank block (the broadcast buffer) */
    lpx_dtype dtype;          /* u8 for the _buf forms of all_gather/broadcast */
    lpx_reduce_op op;
    int root;
    lpx_device device;        /* where the buffers live */
    uint64_t deadline_ns;     /* on the lpx_now_ns() clock */
    int64_t timeout_ms;       /* the timeout the deadline came from */
} lpx_comm_args;

/** What a comm's collectives can do, for callers that place buffers
 *  (the sharding engine): which device's memory they move and whether
 *  the overlapped host-block all-gather is available. */
typedef struct lpx_comm_caps {
    size_t struct_size;       /* set by the caller: sizeof(lpx_comm_caps) */
    lpx_device device;        /* whose memory the collectives move: lpx_cpu() for host comms
                                 ("local", "mpi"); a device comm's own device (lpx-nccl.so: the
                                 rank's GPU; lpx-simdev.so's "sim": sim:rank), whose memory is the
                                 only memory it accepts */
    bool host_all_gather;     /* lpx_comm_all_gather_host, lpx_comm_wait_ticket and
                                 lpx_comm_sync_ticket work on this comm */
} lpx_comm_caps;

typedef struct lpx_comm_i {
    size_t struct_size;       /* sizeof(lpx_comm_i) as the backend saw it */
    uint32_t abi_version;     /* LPX_COMM_ABI_VERSION */
    const char *name;         /* "local"; must outlive the comm */
    int (*rank)(void *self);
    int (*size)(void *self);
    lpx_status (*all_gather)(void *self, const lpx_comm_args *a);
    lpx_status (*reduce_scatter)(void *self, const lpx_comm_args *a);
    lpx_status (*all_reduce)(void *self, const lpx_comm_args *a);
    lpx_status (*broadcast)(void *self, const lpx_comm_args *a);
    lpx_status (*barrier)(void *self, const lpx_comm_args *a);
    /** Marks the group failed (first reason wins) and wakes peers. */
    void (*abort)(void *self, const char *reason);
    /** Frees `self`; called once by lpx_comm_destroy. */
    void (*destroy)(void *self);
    /* ---- optional slots, appended: read only when struct_size covers
     * them; NULL (or a backend built before them) means "absent". ---- */
    /** What the comm's collectives move (lpx_comm_caps_get fills the
     *  defaults first, then calls this to override them). Absent: host
     *  memory, no host all-gather. */
    lpx_status (*caps)(void *self, lpx_comm_caps *out);
    /** lpx_comm_all_gather_host, lpx_comm_wait_ticket and
     *  lpx_comm_sync_ticket (all three or none; `comm` is the handle that
     *  wraps `self`: the all-gather itself goes through
     *  lpx_comm_all_gather_buf(comm, ...) so it is checked, numbered and
     *  counted). */
    lpx_status (*all_gather_host)(void *self, lpx_comm *comm, const void *send, void *recv, size_t nbytes,
                                  uint64_t *ticket);
    lpx_status (*wait_ticket)(void *self, lpx_comm *comm, uint64_t ticket);
    lpx_status (*sync_ticket)(void *self, lpx_comm *comm, uint64_t ticket);
} lpx_comm_i;

/** Wraps a backend's per-rank state into a comm (the vtable is copied up
 *  to min(struct_size, ours); every slot is required). On success the
 *  comm owns `self` and frees it through vt->destroy; on failure `self`
 *  stays the caller's. Errors: LPX_EINVAL (NULL, missing slot, rank not in
 *  0..size-1), LPX_EABI, LPX_ENOMEM. */
LPX_API lpx_status lpx_comm_new(const lpx_comm_i *vt, void *self, lpx_comm **out);

/** The per-rank state a backend passed to lpx_comm_new, when `comm` is
 *  that backend's: its collective slots (all_gather, reduce_scatter,
 *  all_reduce) are vt's. NULL for a NULL comm or vt, or another backend's
 *  comm. Lets a backend reach its own state from a handle it is given
 *  (the local backend marks a rank gone when its thread returns). The
 *  state stays owned by the comm. */
LPX_API void *lpx_comm_backend_state(const lpx_comm *comm, const lpx_comm_i *vt);

/* ---- capabilities (optional backend slots) ------------------------- */

/** Fills *out (up to out->struct_size bytes; set it first) with what
 *  comm's collectives move: the defaults (host memory, no host
 *  all-gather), overridden by the backend's `caps` slot when it has one.
 *  Errors: LPX_EINVAL (NULL, struct_size too small), the slot's error. */
LPX_API lpx_status lpx_comm_caps_get(const lpx_comm *comm, lpx_comm_caps *out);
/** The upload and all-gather of a host block, overlapped with compute
 *  (for device comms with caps.host_all_gather): copies nbytes of host
 *  memory `send` to recv + rank * nbytes and all-gathers recv (nbytes *
 *  size bytes of the comm's device) in place, without the device's
 *  compute queue waiting for it. *ticket (may be NULL) receives the
 *  all-gather's number. `send` must not be written or freed before
 *  lpx_comm_sync_ticket(comm, *ticket) returned; recv not used by device
 *  work before lpx_comm_wait_ticket(comm, *ticket). Collective. Errors:
 *  LPX_EINVAL (NULL comm), LPX_ENOTIMPL (the backend has no such slot;
 *  nothing ran), those of the backend (lpx-nccl.so:
 *  lpx_nccl_all_gather_host). */
LPX_API lpx_status lpx_comm_all_gather_host(lpx_comm *comm, const void *send, void *recv, size_t nbytes,
                                            uint64_t *ticket);
/** Device-side wait: the device's compute queued from now on waits for
 *  collective number `ticket` (0: nothing to wait for). Errors:
 *  LPX_EINVAL, LPX_ENOTIMPL, the backend's (LPX_ECOMM, LPX_ETIMEOUT). */
LPX_API lpx_status lpx_comm_wait_ticket(lpx_comm *comm, uint64_t ticket);
/** Host wait until collective number `ticket` completed, so the host
 *  block it uploaded may be rewritten. Errors: as lpx_comm_wait_ticket. */
LPX_API lpx_status lpx_comm_sync_ticket(lpx_comm *comm, uint64_t ticket);

/** The reference reduction every built-in backend uses, exported so
 *  plugin backends give the same bits: dst[i] = op(srcs[0][i], ...,
 *  srcs[nsrcs-1][i]) combined in that order in f32, encoded once to
 *  `dtype` with round-to-nearest-even (f32, bf16, f16: IEEE, overflow
 *  gives inf; f8e4m3fn, f8e5m2: decoded exactly, saturating at +-max since
 *  e4m3fn has no inf; NaN stays NaN); avg divides by nsrcs. dst may equal a source;
 *  other overlaps are undefined. Never allocates. Errors: LPX_EINVAL (NULL
 *  with count > 0, nsrcs < 1, bad op), LPX_EDTYPE. */
LPX_API lpx_status lpx_comm_reduce_buffers(void *dst, const void *const *srcs, int nsrcs,
                                           size_t count, lpx_dtype dtype, lpx_reduce_op op);

/* ---- backends by name ---------------------------------------------- */

/** The body of one rank: runs with that rank's comm (borrowed; do not
 *  destroy it). Return LPX_OK or an error; a rank that returns an error
 *  aborts the comm so its peers fail too. */
typedef lpx_status (*lpx_comm_rank_fn)(lpx_comm *comm, void *ctx);

/** A comm backend as `--comm NAME` sees it: `run` executes fn once for
 *  each rank this process hosts (local: nranks threads; mpi: this
 *  process's rank, nranks 0 or the world size), each with its comm, whose
 *  timeout is `timeout_ms` (0: the default). It stores each hosted rank's
 *  status in statuses[rank] (statuses holds nranks entries, may be NULL)
 *  and returns LPX_OK if every hosted rank returned LPX_OK, else the status
 *  of the lowest failing rank with its message. */
typedef struct lpx_comm_backend_i {
    size_t struct_size;       /* sizeof(lpx_comm_backend_i) of the caller */
    const char *name;         /* "local", "mpi"; copied at registration */
    const char *description;  /* one line, may be NULL; copied */
    lpx_status (*run)(const struct lpx_comm_backend_i *self, int nranks, int64_t timeout_ms,
                      lpx_comm_rank_fn fn, void *ctx, lpx_status *statuses);
    void *user;
} lpx_comm_backend_i;

/** Registers a backend under its name (copied; `run` must stay valid for
 *  the process). "local" is always registered. Called from a plugin's init
 *  it is journaled like every registration: a failed load retires it (no
 *  lookup finds it, its name is free again). Errors: LPX_EINVAL (NULL,
 *  missing name or run, name longer than 31 chars), LPX_EEXIST, LPX_EFULL.
 *  Thread-safe. */
LPX_API lpx_status lpx_comm_backend_register(const lpx_comm_backend_i *backend);
/** The backend called `name` (copy owned by the registry, valid for the
 *  process) in *out. Errors: LPX_EINVAL, LPX_ENOTFOUND (the message lists
 *  the registered names). */
LPX_API lpx_status lpx_comm_backend_find(const char *name, const lpx_comm_backend_i **out);
LPX_API int lpx_comm_backend_count(void);
/** Backend i in registration order ("local" first), or NULL. */
LPX_API const lpx_comm_backend_i *lpx_comm_backend_at(int i);
/** Finds `backend` and calls its run (see lpx_comm_backend_i). Errors:
 *  those of lpx_comm_backend_find and run. */
LPX_API lpx_status lpx_comm_run(const char *backend, int nranks, int64_t timeout_ms,
                                lpx_comm_rank_fn fn, void *ctx, lpx_status *statuses);

/* ---- the local backend (built into liblpx) ------------------------- */

/** Creates a group of n ranks (1..LPX_LOCAL_MAX_RANKS) in this process and
 *  stores rank r's comm in comms[r]. Each comm is then driven by its own
 *  thread and destroyed by it (lpx_comm_destroy); the group is freed with
 *  the last one. A comm destroyed before its peers counts as a rank that
 *  exited: peers waiting for it fail with LPX_ECOMM. Errors: LPX_EINVAL,
 *  LPX_ENOMEM (nothing is left allocated). */
LPX_API lpx_status lpx_local_comm_group_create(int n, lpx_comm **comms);

#define LPX_LOCAL_MAX_RANKS 1024

/** Runs fn(comm_r, ctx) on n new threads, one per rank, each with its
 *  rank's comm (timeout_ms per call; 0: the default), joins them and
 *  destroys the group. A rank whose fn returns an error aborts the group
 *  with that error's message; a rank whose fn returns (or pthread_exits)
 *  while peers still expect it in a collective makes those peers fail with
 *  LPX_ECOMM. A rank whose fn is still running 2 s after another rank
 *  failed is abandoned: its thread is detached, its status is
 *  LPX_ETIMEOUT, and the call returns without it (the thread frees what
 *  it holds if it ever ends; end the process). statuses (n entries, may
 *  be NULL) gets each rank's status. Returns LPX_OK when all ranks
 *  succeeded, else the lowest failing rank's status, with "rank R: <its
 *  message>" as this thread's error message (an abandoned rank is named
 *  only when no rank returned an error).
 *  Errors also: LPX_EINVAL (n out of range, NULL fn), LPX_ENOMEM, LPX_ECOMM
 *  (a thread could not be started). */
LPX_API lpx_status lpx_local_run(int n, lpx_comm_rank_fn fn, void *ctx, int64_t timeout_ms,
                                 lpx_status *statuses);

LPX_END_DECLS

#endif
