/* The local backend's collectives: after everyone arrived, each rank moves
 * data straight between the posted buffers, then departs.
 *
 *   all_gather      rank r pulls every rank's contribution into its own
 *                   recv: each contribution is copied once into each
 *                   destination, nothing else.
 *   reduce_scatter  rank r reduces block r of every rank's send, in rank
 *                   order, into its recv.
 *   all_reduce      rank r reduces slice r (1/N of the elements) of every
 *                   send and writes the result into every rank's recv, so
 *                   the reduction work is split N ways, not repeated.
 *   broadcast       non-roots copy from the root's buffer.
 *
 * Aliasing: only rank r reads and writes block/slice r of any buffer in
 * reduce_scatter and all_reduce, which is what makes the in-place forms
 * safe without staging. */
#include <string.h>
#include "local_internal.h"

static int l_rank(void *self) { return ((local_rank *)self)->rank; }
static int l_size(void *self) { return ((local_rank *)self)->g->n; }

static lpx_status l_all_gather(void *self, const lpx_comm_args *a)
{
    local_rank *me = self;
    lpx_status st = local_arrive(me, a);
    if (st) return st;
    local_group *g = me->g;
    for (int q = 0; q < g->n && a->nbytes; q++) {
        const void *src = g->posted[q]->send;
        unsigned char *dst = (unsigned char *)a->recv + (size_t)q * a->nbytes;
        if (src != dst) memcpy(dst, src, a->nbytes);
    }
    local_depart(me);
    return LPX_OK;
}

static lpx_status l_reduce_scatter(void *self, const lpx_comm_args *a)
{
    local_rank *me = self;
    lpx_status st = local_arrive(me, a);
    if (st) return st;
    local_group *g = me->g;
    if (a->count) {
        size_t off = (size_t)me->rank * a->nbytes;
        for (int q = 0; q < g->n; q++) me->srcs[q] = (const unsigned char *)g->posted[q]->send + off;
        (void)lpx_comm_reduce_buffers(a->recv, me->srcs, g->n, a->count, a->dtype, a->op);
    }
    local_depart(me);
    return LPX_OK;
}

static lpx_status l_all_reduce(void *self, const lpx_comm_args *a)
{
    local_rank *me = self;
    lpx_status st = local_arrive(me, a);
    if (st) return st;
    local_group *g = me->g;
    size_t chunk = (a->count + (size_t)g->n - 1) / (size_t)g->n;
    size_t lo = (size_t)me->rank * chunk, hi = lo + chunk;
    if (lo > a->count) lo = a->count;
    if (hi > a->count) hi = a->count;
    if (hi > lo) {
        size_t es = lpx_dtype_nbytes(a->dtype, 1), off = lo * es, len = (hi - lo) * es;
        for (int q = 0; q < g->n; q++) me->srcs[q] = (const unsigned char *)g->posted[q]->send + off;
        unsigned char *mine = (unsigned char *)a->recv + off;
        (void)lpx_comm_reduce_buffers(mine, me->srcs, g->n, hi - lo, a->dtype, a->op);
        for (int q = 0; q < g->n; q++)
            if (q != me->rank) memcpy((unsigned char *)g->posted[q]->recv + off, mine, len);
    }
    local_depart(me);
    return LPX_OK;
}

static lpx_status l_broadcast(void *self, const lpx_comm_args *a)
{
    local_rank *me = self;
    lpx_status st = local_arrive(me, a);
    if (st) return st;
    const void *src = me->g->posted[a->root]->recv;
    if (me->rank != a->root && a->nbytes && src != a->recv) memcpy(a->recv, src, a->nbytes);
    local_depart(me);
    return LPX_OK;
}

/* No buffers, so no depart: posting is all a barrier needs. */
static lpx_status l_barrier(void *self, const lpx_comm_args *a)
{
    return local_arrive(self, a);
}

static void l_abort(void *self, const char *reason)
{
    local_rank *me = self;
    local_fail(me->g, "rank %d aborted: %s", me->rank, reason);
}

static void l_destroy(void *self)
{
    local_rank *me = self;
    local_leave(me, "destroyed its comm");
    local_group *g = me->g;
    lpx_free(me->srcs);
    lpx_free(me);
    local_group_unref(g);
}

const lpx_comm_i lpx__local_comm_vt = {
    .struct_size = sizeof(lpx_comm_i),
    .abi_version = LPX_COMM_ABI_VERSION,
    .name = "local",
    .rank = l_rank,
    .size = l_size,
    .all_gather = l_all_gather,
    .reduce_scatter = l_reduce_scatter,
    .all_reduce = l_all_reduce,
    .broadcast = l_broadcast,
    .barrier = l_barrier,
    .abort = l_abort,
    .destroy = l_destroy,
};

local_rank *local_rank_of(lpx_comm *comm) { return lpx_comm_backend_state(comm, &lpx__local_comm_vt); }

lpx_status lpx_local_comm_group_create(int n, lpx_comm **comms)
{
    if (!comms) return lpx_error(LPX_EINVAL, "lpx_local_comm_group_create: comms is NULL");
    if (n < 1 || n > LPX_LOCAL_MAX_RANKS)
        return lpx_error(LPX_EINVAL, "lpx_local_comm_group_create: %d ranks is not in 1..%d", n,
                         LPX_LOCAL_MAX_RANKS);
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    for (int r = 0; r < n; r++) comms[r] = NULL;
    local_group *g;
    if ((st = local_group_new(n, &g))) return st;
    int made = 0;
    for (; made < n; made++) {
        local_rank *me = lpx_calloc(1, sizeof *me);
        const void **srcs = lpx_calloc((size_t)n, sizeof *srcs);
        if (me) {
            me->g = g;
            me->rank = made;
            me->srcs = srcs;
        }
        if (!me || !srcs || (st = lpx_comm_new(&lpx__local_comm_vt, me, &comms[made]))) {
            lpx_free(srcs);
            lpx_free(me);
            if (!st) st = lpx_error(LPX_ENOMEM, "lpx_local_comm_group_create: out of memory at rank %d",
                                    made);
            break;
        }
    }
    if (made == n) return LPX_OK;
    /* undo: the group's references of the ranks never made, then the made ones */
    pthread_mutex_lock(&g->mu);
    g->live = made + 1;
    pthread_mutex_unlock(&g->mu);
    for (int r = 0; r < made; r++) {
        lpx_comm_destroy(comms[r]);
        comms[r] = NULL;
    }
    local_group_unref(g);
    return st;
}
