/* lpx-mpi.so: the lpx_comm_i interface over MPI (docs/COMM.md).
 *
 * Exported by the plugin, found with dlsym (the test does) or linked by a
 * host that builds against it. Not installed with liblpx's headers: MPI is
 * optional and the plugin may be absent. */
#ifndef LPX_MPI_H
#define LPX_MPI_H

#include "lpx/lpx.h"

LPX_BEGIN_DECLS

/** Creates this process's comm over `mpi_comm` (a `const MPI_Comm *`, or
 *  NULL for MPI_COMM_WORLD), initializing MPI (MPI_THREAD_SERIALIZED) if
 *  nobody did; lpx then finalizes it in lpx_mpi_finalize or at exit. The
 *  comm works on duplicates of `mpi_comm`, so lpx traffic never matches the
 *  caller's. Collective and blocking over `mpi_comm` (MPI_Comm_dup has no
 *  timeout). Errors: LPX_EINVAL (NULL out), LPX_ECOMM (MPI finalized or an
 *  MPI error, with its text), LPX_ENOMEM. */
typedef lpx_status (*lpx_mpi_comm_create_fn)(const void *mpi_comm, lpx_comm **out);
LPX_PLUGIN_EXPORT lpx_status lpx_mpi_comm_create(const void *mpi_comm, lpx_comm **out);

/** Registers the "mpi" comm backend (lpx_comm_run("mpi", ...): one rank
 *  per process, nranks 0 or the world size). Errors: those of
 *  lpx_comm_backend_register (LPX_EEXIST when already registered). */
typedef lpx_status (*lpx_mpi_register_fn)(void);
LPX_PLUGIN_EXPORT lpx_status lpx_mpi_register(void);

/** Finalizes MPI if lpx initialized it and it is not finalized yet; later
 *  lpx_mpi_comm_create calls fail. Call after destroying every comm. A
 *  process that exits without calling it after a comm of it failed ends
 *  the job with MPI_Abort(1) from lpx's exit handler (MPI_Finalize would
 *  wait forever for a stalled peer). */
typedef void (*lpx_mpi_finalize_fn)(void);
LPX_PLUGIN_EXPORT void lpx_mpi_finalize(void);

LPX_END_DECLS

#endif
