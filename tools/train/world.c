/* `lpx train`'s world: the comm backend (--comm; its plugin loaded when
 * it is not built in), and the ranks: with --comm mpi one rank per MPI
 * process (the world probed before any work), with a launcher's NCCL
 * world one rank per process (LPX_RANK/LPX_WORLD_SIZE), else o->ranks
 * threads of this process. */
#include <stdio.h>
#include <string.h>
#include "rank.h"
#include "../lpx/commands.h"

/* --comm mpi: this process's rank and the world size, before any work */
static lpx_status probe_world(lpx_comm *comm, void *ctx)
{
    int *rw = ctx;
    rw[0] = lpx_comm_rank(comm);
    rw[1] = lpx_comm_size(comm);
    return LPX_OK;
}

int tr_world(tr_opts *o, bool *lead_out)
{
    const lpx_comm_backend_i *be = NULL;
    if (lpx_comm_backend_find(o->comm, &be) != LPX_OK) {
        char dir[64], file[64];
        snprintf(dir, sizeof dir, "backends/%s", o->comm);
        snprintf(file, sizeof file, "lpx-%s.so", o->comm);
        if (!lpx_tool_load_shipped(dir, file) || lpx_comm_backend_find(o->comm, &be) != LPX_OK) {
            fprintf(stderr, "lpx train: --comm %s is not available in this build (load its plugin, e.g. lpx-%s.so, "
                            "through LPX_PLUGIN_PATH)\n", o->comm, o->comm);
            return 2;
        }
    }
    /* lead: this process prints and writes the files (rank 0 of MPI, or of
     * a launcher's NCCL world) */
    bool lead = true;
    int env_rank = -1, env_world = -1;
    if (!strcmp(o->comm, "mpi")) {
        /* one rank per process: --ranks is the world size (checked if given) */
        int rw[2] = {0, 0};
        if (lpx_comm_run(o->comm, 0, 0, probe_world, rw, NULL) != LPX_OK) {
            fprintf(stderr, "lpx train: --comm mpi: %s\n", lpx_last_error());
            return 2;
        }
        lead = rw[0] == 0;
        if (o->ranks_given && o->ranks != rw[1]) {
            if (lead)
                fprintf(stderr, "lpx train: --ranks %d but the MPI world has %d processes (mpirun -np %d, or leave "
                                "--ranks out)\n", o->ranks, rw[1], o->ranks);
            return 2;
        }
        o->ranks = rw[1];
        if (o->micro % o->ranks) {
            if (lead) tr_check_ranks(o);
            return 2;
        }
        if (!lead) o->quiet = true;
    } else if (tr_per_process(o, &env_rank, &env_world)) {
        /* --comm nccl, one process per GPU: the launcher's world (no probe:
         * that would set NCCL up twice) */
        if (env_world < 1 || env_rank < 0 || env_rank >= env_world) {
            fprintf(stderr, "lpx train: --comm nccl under a launcher: LPX_RANK/LPX_WORLD_SIZE (or Open MPI's "
                            "OMPI_COMM_WORLD_RANK/_SIZE) must give a rank of 0..world-1\n");
            return 2;
        }
        lead = env_rank == 0;
        if (o->ranks_given && o->ranks != env_world) {
            if (lead)
                fprintf(stderr, "lpx train: --ranks %d but the launcher started %d processes (leave --ranks out)\n",
                        o->ranks, env_world);
            return 2;
        }
        o->ranks = env_world;
        if (o->micro % o->ranks) {
            if (lead) tr_check_ranks(o);
            return 2;
        }
        if (!lead) o->quiet = true;
    }
    *lead_out = lead;
    return 0;
}
