/* The lpx_comm handle: a copied backend vtable, the backend's per-rank
 * state, the timeout and the statistics. Shared by comm/ only; backends
 * (the built-in local one included) see the public lpx_comm_i. */
#ifndef LPX_COMM_INTERNAL_H
#define LPX_COMM_INTERNAL_H

#include <stdatomic.h>
#include "../core/lpx_internal.h"
#include "lpx/comm.h"

struct lpx_comm {
    lpx_comm_i vt;                 /* copy, zero-extended */
    void *self;                    /* backend state, owned */
    int rank, size;                /* cached: the backend's answers never change */
    uint64_t seq;                  /* collectives started (one thread at a time) */
    atomic_llong timeout_ms;
    /* counters may be read (and reset) from other threads */
    atomic_ullong calls[LPX_COLL_MAX];
    atomic_ullong bytes[LPX_COLL_MAX];
    atomic_ullong ns[LPX_COLL_MAX];
    atomic_ullong failures[LPX_COLL_MAX];
};

/* The reduction behind lpx_comm_reduce_buffers, without argument checks
 * (callers checked them). comm/comm_reduce.c */
void lpx__comm_reduce(void *dst, const void *const *srcs, int nsrcs, size_t count,
                      lpx_dtype dtype, lpx_reduce_op op);
/* True for the dtypes reductions accept (f32, bf16, f16, f8e4m3fn, f8e5m2). */
bool lpx__comm_reduce_dtype_ok(lpx_dtype dtype);

#endif
