/* Shared inside lpx-simdev.so: the memory registry (simdev_mem.c), the
 * kernels (simdev_kernels.c), the comm (simdev_comm.c). */
#ifndef LPX_SIMDEV_INTERNAL_H
#define LPX_SIMDEV_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include "lpx_simdev.h"

extern int sim_ndevices;     /* LPX_SIMDEV_DEVICES */
extern bool sim_check;       /* device memory mapped with no access between calls */

/* the counters of lpx_simdev_stats, bumped with relaxed atomics */
typedef struct sim_counters {
    _Atomic uint64_t allocs, frees, live_bytes, h2d, d2h, d2d, h2d_bytes, d2h_bytes, d2d_bytes, kernels, collectives;
} sim_counters;
extern sim_counters sim_count;

/* memory: page-aligned mappings, one per allocation */
void *sim_alloc(void *self, lpx_device dev, size_t nbytes);
void sim_free(void *self, lpx_device dev, void *ptr, size_t nbytes);
/* The allocation holding [p, p + n): its device index, or -1 if p is not
 * device memory (n may be 0). */
int sim_owner(const void *p, size_t n);
/* Opens [p, p + n) of device memory for the backend's own access (nested
 * and concurrent opens counted per allocation); sim_close ends it. No-op
 * for host memory and with checking off. */
void sim_open(const void *p, size_t n);
void sim_close(const void *p, size_t n);

/* the backend's copy and sync slots */
lpx_status sim_copy(void *self, void *dst, lpx_device dst_dev, const void *src, lpx_device src_dev, size_t nbytes);
lpx_status sim_sync(void *self, lpx_device dev);

/* the device's stream (simdev_stream.c): writes of ops queued in order,
 * landing at the next use of the device or a sync */
extern bool sim_defer;    /* LPX_SIMDEV_DEFER (default on) */
lpx_status sim_enqueue_write(int dev, void *dst, const void *src, size_t n);
void sim_flush(int dev);
size_t sim_pending(int dev);
/* drops the queued writes into [base, base + len) (a block being freed) */
void sim_drop_block(int dev, const void *base, size_t len);

/* every op at the device's key: the CPU's arithmetic on host copies */
lpx_status sim_fallback(lpx_call *c);

/* comm backend "sim" */
extern const lpx_comm_backend_i sim_comm_backend;

#endif
