/* lpx-simdev.so: a simulated device for tests (docs/ARCHITECTURE.md, "A
 * backend plugin, worked through"). Device type LPX_DEVICE_SIM, index
 * 0..LPX_SIMDEV_MAX-1; memory is the host's, mapped with no access between
 * the backend's own calls, so host code that dereferences a device pointer
 * faults instead of working by accident. Every op runs the CPU backend's
 * arithmetic on copies (results equal the CPU's bit for bit). Comm backend
 * "sim": the local backend's collectives under NCCL's rules (buffers on
 * the comm's own sim device only, one rank per device).
 *
 * The plugin exports, for tests and tools (lpx_plugin_symbol):
 *   LPX_SIMDEV_SYM_STATS  void lpx_simdev_get_stats(lpx_simdev_stats *out)
 *   LPX_SIMDEV_SYM_OWNS   int lpx_simdev_owns(const void *p)  device index, or -1
 *   LPX_SIMDEV_SYM_PENDING size_t lpx_simdev_pending(int dev)  writes queued on its stream
 * Each device has a stream: what an op writes into device memory is queued
 * and lands at the next use of the device (an op, a copy, a collective, a
 * free) or a sync, so a read behind the backend's back sees stale bytes.
 * Environment: LPX_SIMDEV_CHECK=0 leaves device memory readable (for a
 * debugger); LPX_SIMDEV_DEFER=0 writes at once; LPX_SIMDEV_DEVICES=N
 * (default 8) devices. */
#ifndef LPX_SIMDEV_H
#define LPX_SIMDEV_H

#include <stddef.h>
#include <stdint.h>
#include "lpx/lpx.h"

#define LPX_SIMDEV_MAX 8
#define LPX_SIMDEV_SYM_STATS "lpx_simdev_get_stats"
#define LPX_SIMDEV_SYM_OWNS "lpx_simdev_owns"
#define LPX_SIMDEV_SYM_PENDING "lpx_simdev_pending"

/* counts since load: what crossed between host and device, and how */
typedef struct lpx_simdev_stats {
    uint64_t allocs, frees, live_bytes;
    uint64_t h2d, d2h, d2d;           /* copies through the backend's copy slot */
    uint64_t h2d_bytes, d2h_bytes, d2d_bytes;
    uint64_t kernels;                 /* ops run on the device (the fallback) */
    uint64_t collectives;             /* through comm backend "sim" */
} lpx_simdev_stats;

typedef void (*lpx_simdev_stats_fn)(lpx_simdev_stats *out);
typedef int (*lpx_simdev_owns_fn)(const void *p);
typedef size_t (*lpx_simdev_pending_fn)(int dev);

static inline lpx_device lpx_sim_device(int index)
{
    lpx_device d;
    d.type = LPX_DEVICE_SIM;
    d.index = index;
    return d;
}

#endif
