/* lpx-nccl.so: the lpx_comm_i interface over NCCL (docs/COMM.md, "NCCL").
 *
 * Loading the plugin (after lpx-cuda.so) registers the comm backend "nccl"
 * (lpx_comm_run("nccl", ...)). The functions below are extras, exported by
 * the plugin and fetched with lpx_plugin_symbol(plugin, LPX_NCCL_SYM_...)
 * (the typedefs give their types), so a host never links NCCL. Not
 * installed with liblpx's headers: NCCL is optional and the plugin may be
 * absent.
 *
 * Completion is device-ordered: a collective on an NCCL comm returns once
 * it is enqueued on the comm's stream and ordered after the work lpx-cuda
 * already queued on the buffers' device (and, by default, before any work
 * queued after the call); it has not necessarily run yet. lpx_comm_barrier
 * and lpx_nccl_sync wait on the host. */
#ifndef LPX_NCCL_H
#define LPX_NCCL_H

#include "lpx/lpx.h"

LPX_BEGIN_DECLS

/** Bytes of an NCCL unique id (ncclUniqueId); LPX_NCCL_ID holds twice as
 *  many hex digits. */
#define LPX_NCCL_ID_BYTES 128

/** Writes a new NCCL unique id (ncclGetUniqueId) into id[0..128). A
 *  launcher hands it to every rank (hex in LPX_NCCL_ID, or a file).
 *  Errors: LPX_EINVAL (NULL), LPX_ECOMM (NCCL failed; its text). */
typedef lpx_status (*lpx_nccl_get_unique_id_fn)(unsigned char *id);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_get_unique_id(unsigned char *id);

/** Creates rank `rank` of a world of `size` ranks that share `id` (128
 *  bytes from lpx_nccl_get_unique_id on one rank), on CUDA device
 *  `device` (one rank per GPU: NCCL refuses two ranks of one comm on one
 *  device). Waits until every rank joined, at most timeout_ms (0: the
 *  comm default, LPX_COMM_TIMEOUT_MS or 600 s), which also becomes the
 *  comm's timeout. Errors: LPX_EINVAL, LPX_EDEVICE (device not served by
 *  lpx-cuda), LPX_ETIMEOUT (not every rank joined), LPX_ECOMM (NCCL
 *  failed; the message names the call and NCCL's text), LPX_ENOMEM. */
typedef lpx_status (*lpx_nccl_comm_create_fn)(int rank, int size, const unsigned char *id, int device,
                                              int64_t timeout_ms, lpx_comm **out);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_comm_create(int rank, int size, const unsigned char *id, int device,
                                                  int64_t timeout_ms, lpx_comm **out);

/** Creates all n ranks of a world in this process, rank r on devices[r]
 *  (NULL: device r), with one grouped initialization (ncclCommInitAll
 *  style) from the calling thread; comms[r] gets rank r's comm. Each comm
 *  is then driven by its own thread, which destroys it. A rank that fails
 *  or aborts fails its in-process peers at once. Errors: those of
 *  lpx_nccl_comm_create; nothing is left allocated on failure. */
typedef lpx_status (*lpx_nccl_comm_create_local_fn)(int n, const int *devices, int64_t timeout_ms,
                                                    lpx_comm **comms);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_comm_create_local(int n, const int *devices, int64_t timeout_ms,
                                                        lpx_comm **comms);

/** Deferred mode (off by default): collectives still wait for the work
 *  queued before them, but work queued after them on lpx-cuda's stream no
 *  longer waits for them, so the all-gather of the next group overlaps the
 *  compute of this one. The caller must then call lpx_nccl_wait before it
 *  uses (reads, writes, frees) a buffer of those collectives. Errors:
 *  LPX_EINVAL (NULL or not an NCCL comm). */
typedef lpx_status (*lpx_nccl_set_deferred_fn)(lpx_comm *comm, int deferred);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_set_deferred(lpx_comm *comm, int deferred);

/** Makes the work queued on lpx-cuda's stream from now on wait for every
 *  collective enqueued on comm so far (device-side; returns at once).
 *  Errors: LPX_EINVAL, LPX_ECOMM/LPX_ETIMEOUT (the comm failed). */
typedef lpx_status (*lpx_nccl_wait_fn)(lpx_comm *comm);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_wait(lpx_comm *comm);

/** Waits on the host until every collective enqueued on comm completed,
 *  each within its deadline (enqueue time + timeout). Errors: LPX_EINVAL,
 *  LPX_ETIMEOUT (the comm is then failed), LPX_ECOMM. */
typedef lpx_status (*lpx_nccl_sync_fn)(lpx_comm *comm);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_sync(lpx_comm *comm);

/** The upload and all-gather of a host block, overlapped with compute
 *  (the sharding engine's offloaded prefetch, docs/SHARDING.md): copies
 *  nbytes from host memory `send` to recv + rank * nbytes, then
 *  all-gathers recv in place (recv: nbytes * size bytes of the comm's
 *  device), both on the comm stream after the work lpx-cuda queued so far
 *  on the device (recv may be a buffer it just allocated). The all-gather
 *  goes through lpx_comm_all_gather_buf (checks, sequence number,
 *  deadline, statistics: it counts as one all-gather). Whatever the comm's
 *  mode, the call is deferred: lpx-cuda's stream does NOT wait for it, so
 *  call lpx_nccl_wait_ticket (or lpx_nccl_wait) before lpx-cuda work uses
 *  recv (reads, writes or frees it). The copy reads `send` asynchronously:
 *  page-locked memory (lpx_cuda_host_alloc) makes it a DMA that overlaps;
 *  do not write or free `send` before lpx_nccl_sync_ticket(comm, *ticket)
 *  returned. *ticket (may be NULL) receives the number of the
 *  collective. Collective. Errors: LPX_EINVAL (NULL with nbytes > 0: the
 *  comm is aborted), LPX_EDEVICE (recv not memory of the comm's device:
 *  the comm is failed), those of lpx_comm_all_gather_buf. */
typedef lpx_status (*lpx_nccl_all_gather_host_fn)(lpx_comm *comm, const void *send, void *recv, size_t nbytes,
                                                  uint64_t *ticket);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_all_gather_host(lpx_comm *comm, const void *send, void *recv, size_t nbytes,
                                                      uint64_t *ticket);

/** Makes the work queued on lpx-cuda's stream from now on wait for
 *  collective number `ticket` of comm (and, the comm stream being in
 *  order, for every one before it); not for later ones. Device-side;
 *  returns at once. Ticket 0 or one completed already: nothing to wait
 *  for. Errors: LPX_EINVAL, LPX_ECOMM/LPX_ETIMEOUT (the comm failed). */
typedef lpx_status (*lpx_nccl_wait_ticket_fn)(lpx_comm *comm, uint64_t ticket);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_wait_ticket(lpx_comm *comm, uint64_t ticket);

/** Waits on the host until collective number `ticket` of comm (and every
 *  one before it) completed, each within its deadline; so a host block
 *  handed to lpx_nccl_all_gather_host may be rewritten. Ticket 0: returns
 *  at once. Errors: LPX_EINVAL, LPX_ETIMEOUT (the comm is then failed),
 *  LPX_ECOMM. */
typedef lpx_status (*lpx_nccl_sync_ticket_fn)(lpx_comm *comm, uint64_t ticket);
LPX_PLUGIN_EXPORT lpx_status lpx_nccl_sync_ticket(lpx_comm *comm, uint64_t ticket);

/** The CUDA device index of an NCCL comm (rank r of lpx_comm_run("nccl")
 *  in one process: device r; one rank per process: its local rank), or -1
 *  when comm is not a live NCCL comm. Rank functions allocate their
 *  tensors there. */
typedef int (*lpx_nccl_comm_device_fn)(const lpx_comm *comm);
LPX_PLUGIN_EXPORT int lpx_nccl_comm_device(const lpx_comm *comm);

#define LPX_NCCL_SYM_GET_UNIQUE_ID "lpx_nccl_get_unique_id"
#define LPX_NCCL_SYM_COMM_CREATE "lpx_nccl_comm_create"
#define LPX_NCCL_SYM_COMM_CREATE_LOCAL "lpx_nccl_comm_create_local"
#define LPX_NCCL_SYM_SET_DEFERRED "lpx_nccl_set_deferred"
#define LPX_NCCL_SYM_WAIT "lpx_nccl_wait"
#define LPX_NCCL_SYM_SYNC "lpx_nccl_sync"
#define LPX_NCCL_SYM_COMM_DEVICE "lpx_nccl_comm_device"
#define LPX_NCCL_SYM_ALL_GATHER_HOST "lpx_nccl_all_gather_host"
#define LPX_NCCL_SYM_WAIT_TICKET "lpx_nccl_wait_ticket"
#define LPX_NCCL_SYM_SYNC_TICKET "lpx_nccl_sync_ticket"

LPX_END_DECLS

#endif
