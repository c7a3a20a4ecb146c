/* The collectives of lpx-mpi.so. Each goes through the workspace (see
 * mpi_internal.h) and one or two non-blocking MPI collectives on MPI_BYTE.
 *
 * Reductions do not use MPI's reduction operators: MPI has no bf16/f16,
 * picks its own combining order, and accumulates in the element type.
 * Instead reduce_scatter is an all-to-all of blocks followed by
 * lpx_comm_reduce_buffers over the received blocks in rank order, and
 * all_reduce is that over 1/N slices followed by an all-gather of the
 * slices. The bytes on the wire are those of a ring reduce-scatter (and
 * all-gather), and the results are bit-identical to the local backend's. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "mpi_internal.h"

static int m_rank(void *self) { return ((mpi_rank *)self)->rank; }
static int m_size(void *self) { return ((mpi_rank *)self)->size; }

/* Entry checks shared by every collective: failure, device, MPI's int counts. */
static lpx_status enter(mpi_rank *m, const lpx_comm_args *a, size_t block)
{
    lpx_status st = mpi_check(m, a->seq);
    if (st) return st;
    if (a->device.type != LPX_DEVICE_CPU) {
        mpi_fail(m, true, "rank %d passed buffers on device type %d to %s (lpx-mpi.so reaches CPU "
                 "memory only)", m->rank, (int)a->device.type, lpx_coll_name(a->kind));
        return lpx_error(LPX_EDEVICE, "buffers on device type %d; lpx-mpi.so reaches CPU memory only",
                         (int)a->device.type);
    }
    /* every rank sees the same sizes, so every rank refuses alike: no notice */
    if (block > INT_MAX)
        return lpx_error(LPX_ERANGE, "%zu bytes per rank block exceed MPI's int count (%d)", block, INT_MAX);
    return LPX_OK;
}

static lpx_status do_all_gather(void *self, const lpx_comm_args *a)
{
    mpi_rank *m = self;
    lpx_status st = enter(m, a, a->nbytes);
    unsigned char *ws;
    size_t total = a->nbytes * (size_t)m->size;
    if (st || (st = mpi_workspace(m, total, &ws))) return st;
    if (a->nbytes) memcpy(ws + (size_t)m->rank * a->nbytes, a->send, a->nbytes);
    MPI_Request req;
    int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ws, (int)a->nbytes, MPI_BYTE, m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(m, "MPI_Iallgather", rc);
    if ((st = mpi_wait(m, &req, a))) return st;
    if (total) memcpy(a->recv, ws, total);
    return LPX_OK;
}

/* All-to-all of `block`-byte blocks from ws[0, size*block) into
 * ws[size*block, 2*size*block): block q of the second half is rank q's
 * block for this rank. */
static lpx_status alltoall(mpi_rank *m, unsigned char *ws, size_t block, const lpx_comm_args *a)
{
    MPI_Request req;
    size_t total = block * (size_t)m->size;
    int rc = MPI_Ialltoall(ws, (int)block, MPI_BYTE, ws + total, (int)block, MPI_BYTE, m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(m, "MPI_Ialltoall", rc);
    return mpi_wait(m, &req, a);
}

static lpx_status do_reduce_scatter(void *self, const lpx_comm_args *a)
{
    mpi_rank *m = self;
    size_t block = a->nbytes, total = block * (size_t)m->size;
    lpx_status st = enter(m, a, block);
    unsigned char *ws;
    if (st || (st = mpi_workspace(m, 2 * total, &ws))) return st;
    if (total) memcpy(ws, a->send, total);
    if ((st = alltoall(m, ws, block, a))) return st;
    for (int q = 0; q < m->size; q++) m->srcs[q] = ws + total + (size_t)q * block;
    return lpx_comm_reduce_buffers(a->recv, m->srcs, m->size, a->count, a->dtype, a->op);
}

static lpx_status do_all_reduce(void *self, const lpx_comm_args *a)
{
    mpi_rank *m = self;
    size_t es = lpx_dtype_nbytes(a->dtype, 1), n = (size_t)m->size;
    size_t chunk = (a->count + n - 1) / n, cb = chunk * es, total = cb * n;
    lpx_status st = enter(m, a, cb);
    unsigned char *ws;
    if (st || (st = mpi_workspace(m, 2 * total, &ws))) return st;
    /* pad to N equal slices; the padding is reduced too and thrown away */
    if (a->nbytes) memcpy(ws, a->send, a->nbytes);
    memset(ws + a->nbytes, 0, total - a->nbytes);
    if ((st = alltoall(m, ws, cb, a))) return st;
    size_t lo = (size_t)m->rank * chunk;
    size_t mine = lo >= a->count ? 0 : (a->count - lo < chunk ? a->count - lo : chunk);
    for (int q = 0; q < m->size; q++) m->srcs[q] = ws + total + (size_t)q * cb;
    if (mine && (st = lpx_comm_reduce_buffers(ws + lo * es, m->srcs, m->size, mine, a->dtype, a->op)))
        return st;
    MPI_Request req;
    int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ws, (int)cb, MPI_BYTE, m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(m, "MPI_Iallgather", rc);
    if ((st = mpi_wait(m, &req, a))) return st;
    if (a->nbytes) memcpy(a->recv, ws, a->nbytes);
    return LPX_OK;
}

static lpx_status do_broadcast(void *self, const lpx_comm_args *a)
{
    mpi_rank *m = self;
    lpx_status st = enter(m, a, a->nbytes);
    unsigned char *ws;
    if (st || (st = mpi_workspace(m, a->nbytes, &ws))) return st;
    if (m->rank == a->root && a->nbytes) memcpy(ws, a->recv, a->nbytes);
    MPI_Request req;
    int rc = MPI_Ibcast(ws, (int)a->nbytes, MPI_BYTE, a->root, m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(m, "MPI_Ibcast", rc);
    if ((st = mpi_wait(m, &req, a))) return st;
    if (m->rank != a->root && a->nbytes) memcpy(a->recv, ws, a->nbytes);
    return LPX_OK;
}

static lpx_status do_barrier(void *self, const lpx_comm_args *a)
{
    mpi_rank *m = self;
    lpx_status st = enter(m, a, 0);
    if (st) return st;
    MPI_Request req;
    int rc = MPI_Ibarrier(m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(m, "MPI_Ibarrier", rc);
    return mpi_wait(m, &req, a);
}

/* The slots: a success moves done_seq, which failure notices carry. */
static lpx_status done(void *self, const lpx_comm_args *a, lpx_status st)
{
    if (st == LPX_OK) ((mpi_rank *)self)->done_seq = a->seq;
    return st;
}
static lpx_status m_all_gather(void *self, const lpx_comm_args *a) { return done(self, a, do_all_gather(self, a)); }
static lpx_status m_reduce_scatter(void *self, const lpx_comm_args *a) { return done(self, a, do_reduce_scatter(self, a)); }
static lpx_status m_all_reduce(void *self, const lpx_comm_args *a) { return done(self, a, do_all_reduce(self, a)); }
static lpx_status m_broadcast(void *self, const lpx_comm_args *a) { return done(self, a, do_broadcast(self, a)); }
static lpx_status m_barrier(void *self, const lpx_comm_args *a) { return done(self, a, do_barrier(self, a)); }

static void m_abort(void *self, const char *reason)
{
    mpi_rank *m = self;
    if (!m->failed) mpi_fail(m, true, "rank %d aborted: %s", m->rank, reason);
}

static void m_destroy(void *self)
{
    mpi_rank *m = self;
    int finalized = 0;
    MPI_Finalized(&finalized);
    bool sends_pending = false;
    if (!finalized) {
        if (m->notice_req != MPI_REQUEST_NULL) {
            /* a receive can be cancelled; the wait returns either way */
            MPI_Cancel(&m->notice_req);
            MPI_Wait(&m->notice_req, MPI_STATUS_IGNORE);
        }
        for (int q = 0; q < m->size; q++) {
            if (m->notice_sends[q] == MPI_REQUEST_NULL) continue;
            int done = 0;
            MPI_Test(&m->notice_sends[q], &done, MPI_STATUS_IGNORE);
            if (!done) {
                MPI_Request_free(&m->notice_sends[q]);  /* allowed for point-to-point */
                sends_pending = true;
            }
        }
        /* ctrl is kept, and data if stranded: see mpi_internal.h */
        if (!m->stranded) MPI_Comm_free(&m->data);
    } else {
        sends_pending = true;  /* nothing can be asked of MPI any more */
    }
    if (sends_pending) mpi_strand(m->notice_out);
    else free(m->notice_out);
    if (finalized) mpi_strand(m->notice_in);
    else free(m->notice_in);
    free(m->ws);
    free(m->notice_sends);
    free(m->srcs);
    free(m);
}

const lpx_comm_i lpx__mpi_comm_vt = {
    .struct_size = sizeof(lpx_comm_i),
    .abi_version = LPX_COMM_ABI_VERSION,
    .name = "mpi",
    .rank = m_rank,
    .size = m_size,
    .all_gather = m_all_gather,
    .reduce_scatter = m_reduce_scatter,
    .all_reduce = m_all_reduce,
    .broadcast = m_broadcast,
    .barrier = m_barrier,
    .abort = m_abort,
    .destroy = m_destroy,
};
