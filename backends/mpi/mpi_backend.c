/* lpx-mpi.so entry points: creating a comm over an MPI communicator, MPI
 * initialization and finalization, the "mpi" entry of the comm backend
 * registry, and the plugin entry point. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mpi_internal.h"

static bool lpx_owns_mpi;   /* lpx called MPI_Init_thread, so lpx finalizes */

void lpx_mpi_finalize(void)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (lpx_owns_mpi && inited && !finalized) MPI_Finalize();
}

/* At exit: MPI_Finalize is collective and never returns while a peer is
 * stalled (SIGSTOP, a hung GPU), so after a failed comm the process ends
 * the whole job with MPI_Abort (exit code 1 for every rank, mpirun
 * included) instead: a failed comm must not leave a job hung. */
static void finalize_at_exit(void)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized && atomic_load(&mpi_any_failed)) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    lpx_mpi_finalize();
}

static lpx_status ensure_mpi(void)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return lpx_error(LPX_ECOMM, "lpx_mpi_comm_create: MPI is already finalized");
    if (inited) return LPX_OK;
    /* SERIALIZED: a comm is driven by one thread at a time, but that
     * thread need not be the one that initialized MPI */
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return lpx_error(LPX_ECOMM, "lpx_mpi_comm_create: MPI_Init_thread failed (%d)", rc);
    lpx_owns_mpi = true;
    atexit(finalize_at_exit);
    return LPX_OK;
}

/* Frees what create made so far (MPI objects included). */
static void undo(mpi_rank *m)
{
    if (m->notice_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&m->notice_req);
        MPI_Wait(&m->notice_req, MPI_STATUS_IGNORE);
    }
    /* ctrl is kept even here: peers that got further may already send
     * notices to it (see mpi_internal.h) */
    if (m->data != MPI_COMM_NULL) MPI_Comm_free(&m->data);
    free(m->notice_in);
    free(m->notice_out);
    free(m->notice_sends);
    free(m->srcs);
    free(m);
}

lpx_status lpx_mpi_comm_create(const void *mpi_comm, lpx_comm **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_mpi_comm_create: out is NULL");
    *out = NULL;
    lpx_status st = ensure_mpi();
    if (st) return st;
    MPI_Comm base = mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD;
    mpi_rank *m = calloc(1, sizeof *m);
    if (!m) return lpx_error(LPX_ENOMEM, "lpx_mpi_comm_create: out of memory");
    m->data = m->ctrl = MPI_COMM_NULL;
    m->notice_req = MPI_REQUEST_NULL;
    int rc = MPI_Comm_dup(base, &m->data);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(base, &m->ctrl);
    if (rc != MPI_SUCCESS) {
        undo(m);
        return lpx_error(LPX_ECOMM, "lpx_mpi_comm_create: MPI_Comm_dup failed (%d)", rc);
    }
    /* errors come back as codes, never as MPI's default job abort */
    MPI_Comm_set_errhandler(m->data, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(m->ctrl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->data, &m->rank);
    MPI_Comm_size(m->data, &m->size);
    m->notice_in = calloc(1, MPI_NOTICE);
    m->notice_out = calloc(1, MPI_NOTICE);
    m->notice_sends = calloc((size_t)m->size, sizeof *m->notice_sends);
    m->srcs = calloc((size_t)m->size, sizeof *m->srcs);
    if (!m->notice_in || !m->notice_out || !m->notice_sends || !m->srcs) {
        undo(m);
        return lpx_error(LPX_ENOMEM, "lpx_mpi_comm_create: out of memory");
    }
    for (int q = 0; q < m->size; q++) m->notice_sends[q] = MPI_REQUEST_NULL;
    rc = MPI_Irecv(m->notice_in, MPI_NOTICE, MPI_CHAR, MPI_ANY_SOURCE, TAG_NOTICE, m->ctrl, &m->notice_req);
    if (rc != MPI_SUCCESS) {
        undo(m);
        return lpx_error(LPX_ECOMM, "lpx_mpi_comm_create: MPI_Irecv failed (%d)", rc);
    }
    if ((st = lpx_comm_new(&lpx__mpi_comm_vt, m, out))) undo(m);
    return st;
}

/* ---- the "mpi" backend of lpx_comm_run ----------------------------- */

static lpx_status mpi_run(const lpx_comm_backend_i *self, int nranks, int64_t timeout_ms,
                          lpx_comm_rank_fn fn, void *ctx, lpx_status *statuses)
{
    (void)self;
    if (!fn) return lpx_error(LPX_EINVAL, "mpi backend: fn is NULL");
    lpx_comm *c;
    lpx_status st = lpx_mpi_comm_create(NULL, &c);
    if (st) return st;
    int rank = lpx_comm_rank(c), size = lpx_comm_size(c);
    if (nranks != 0 && nranks != size) {
        lpx_comm_destroy(c);
        return lpx_error(LPX_EINVAL, "mpi backend: %d ranks requested but the MPI world has %d "
                         "(launch with mpirun -np %d, or ask for 0)", nranks, size, nranks);
    }
    if (timeout_ms && (st = lpx_comm_set_timeout(c, timeout_ms))) {
        lpx_comm_destroy(c);
        return st;
    }
    lpx_clear_error();
    st = fn(c, ctx);
    char msg[MPI_NOTICE];
    snprintf(msg, sizeof msg, "%s", st ? (lpx_last_error()[0] ? lpx_last_error() : lpx_status_string(st)) : "");
    if (st) {
        char reason[MPI_NOTICE + 64];
        snprintf(reason, sizeof reason, "its function returned %s: %s", lpx_status_string(st), msg);
        lpx_comm_abort(c, reason);
    }
    if (statuses) statuses[rank] = st;
    lpx_comm_destroy(c);
    return st ? lpx_error(st, "mpi backend: rank %d: %s", rank, msg) : LPX_OK;
}

lpx_status lpx_mpi_register(void)
{
    static const lpx_comm_backend_i backend = {
        .struct_size = sizeof(lpx_comm_backend_i),
        .name = "mpi",
        .description = "one rank per MPI process (launch with mpirun); lpx-mpi.so",
        .run = mpi_run,
    };
    return lpx_comm_backend_register(&backend);
}

/* Plugin entry point (ABI 1.0). The host table of 1.0 has no comm slot
 * yet, so the backend is registered through the public registry, as the
 * last step: nothing is left to roll back if it fails. */
LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "mpi";
    info->version = "0.1.0";
    info->description = "collectives over MPI: comm backend 'mpi'";
    if (host->abi_major != LPX_PLUGIN_ABI_MAJOR)
        return lpx_error(LPX_EABI, "mpi: host speaks plugin ABI %u, built for %u", host->abi_major,
                         LPX_PLUGIN_ABI_MAJOR);
    return lpx_mpi_register();
}
