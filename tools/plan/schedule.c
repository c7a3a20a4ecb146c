/* FSDP2's overlap of compute and collectives (plan.h: pl_schedule).
 *
 * Two streams. Compute tasks run in program order, each when its inputs
 * are there; collectives run one at a time in the order they are issued.
 * Time advances from event to event; while a collective runs, compute
 * proceeds at (1 - sm_share) of its speed (NCCL's kernels hold that share
 * of the SMs), which is how an uncapped NCCL slows fp8 GEMMs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"
#include "../train/train.h"

enum { T_FWD, T_BWD };
typedef struct task {
    int kind, g;          /* compute: T_FWD/T_BWD of group g */
} task;

typedef struct coll {
    double len;           /* seconds */
    int kind;             /* 0: ag_fwd, 1: ag_bwd, 2: rs */
    int g;
} coll;

static bool time_ok(double x) { return isfinite(x) && x >= 0; }

int pl_schedule(const pl_group *g, int n, const pl_sched_opts *o, pl_sched *out)
{
    memset(out, 0, sizeof *out);
    if (n <= 0) return LPX_OK;
    /* a NaN or infinite time never completes: the loop below would not end */
    if (!time_ok(o->tail) || !time_ok(o->tail_comm) || !isfinite(o->sm_share))
        return lpx_error(LPX_ERANGE, "plan: schedule: optimizer %g s, its all-reduce %g s, SM share %g: not finite "
                         "and >= 0", o->tail, o->tail_comm, o->sm_share);
    for (int i = 0; i < n; i++)
        if (!time_ok(g[i].fwd) || !time_ok(g[i].bwd) || !time_ok(g[i].ag_fwd) || !time_ok(g[i].ag_bwd) ||
            !time_ok(g[i].rs))
            return lpx_error(LPX_ERANGE, "plan: schedule: group %d: forward %g s, backward %g s, all-gathers %g, %g s, "
                             "reduce-scatter %g s: not finite and >= 0", i, g[i].fwd, g[i].bwd, g[i].ag_fwd,
                             g[i].ag_bwd, g[i].rs);
    int rc = LPX_OK;
    double share = o->sm_share < 0 ? 0 : o->sm_share > 0.9 ? 0.9 : o->sm_share;
    /* done times of every collective (-1: not done), issue queue */
    double *ag_f = calloc((size_t)n, sizeof *ag_f), *ag_b = calloc((size_t)n, sizeof *ag_b),
           *rs = calloc((size_t)n, sizeof *rs);
    coll *q = calloc((size_t)(3 * n + 1), sizeof *q);
    if (!ag_f || !ag_b || !rs || !q) {
        rc = lpx_error(LPX_ENOMEM, "plan: schedule: out of memory for %d groups", n);
        goto out;
    }
    for (int i = 0; i < n; i++) ag_f[i] = ag_b[i] = rs[i] = -1;
    int qn = 0, qh = 0;   /* queue length, head */
    double t = 0, comm_left = 0, comp_left = 0;
    bool comm_busy = false, comp_busy = false;
    int cur = 0;          /* compute program counter: 0..n-1 forward, n..2n-1 backward */
    coll running = {0, 0, 0};
    /* issue: the first all-gather */
    q[qn++] = (coll){g[0].ag_fwd, 0, 0};
    for (;;) {
        /* start what can start */
        if (!comm_busy && qh < qn) {
            running = q[qh++];
            comm_left = running.len;
            comm_busy = true;
        }
        if (!comp_busy && cur < 2 * n) {
            bool fwd = cur < n;
            int gi = fwd ? cur : 2 * n - 1 - cur;
            double need = fwd ? ag_f[gi] : ag_b[gi];
            if (need >= 0) {
                comp_busy = true;
                comp_left = fwd ? g[gi].fwd : g[gi].bwd;
                /* prefetch: the next group's all-gather, issued as this one starts */
                if (fwd && gi + 1 < n) q[qn++] = (coll){g[gi + 1].ag_fwd, 0, gi + 1};
                if (!fwd && gi - 1 >= 0) q[qn++] = (coll){g[gi - 1].ag_bwd, 1, gi - 1};
                if (fwd && gi == n - 1) q[qn++] = (coll){g[n - 1].ag_bwd, 1, n - 1};
                if (!comm_busy && qh < qn) continue;   /* start the collective just issued */
            }
        }
        if (!comm_busy && !comp_busy) break;
        /* advance to the next completion; compute runs slower beside a collective */
        double rate = comm_busy ? 1.0 - share : 1.0;
        double dt_comp = comp_busy ? comp_left / rate : 1e300, dt_comm = comm_busy ? comm_left : 1e300;
        double dt = dt_comp < dt_comm ? dt_comp : dt_comm;
        if (comp_busy && comm_busy) out->contention += dt * share;
        if (!comp_busy && comm_busy) out->exposed_comm += dt;   /* compute (or the optimizer) waits on it */
        t += dt;
        if (comm_busy) {
            comm_left -= dt;
            if (comm_left <= 1e-15 || dt == dt_comm) {
                comm_busy = false;
                double *done = running.kind == 0 ? ag_f : running.kind == 1 ? ag_b : rs;
                done[running.g] = t;
            }
        }
        if (comp_busy) {
            comp_left -= dt * rate;
            if (comp_left <= 1e-15 || dt == dt_comp) {
                comp_busy = false;
                bool fwd = cur < n;
                int gi = fwd ? cur : 2 * n - 1 - cur;
                if (fwd && gi == n - 1) out->fwd_end = t;
                if (!fwd) q[qn++] = (coll){g[gi].rs, 2, gi};
                cur++;
            }
        }
    }
    /* the optimizer after the last reduce-scatter, then its collective */
    out->step = t + o->tail + o->tail_comm;
    out->exposed_comm += o->tail_comm;
    for (int i = 0; i < n; i++) {
        out->compute += g[i].fwd + g[i].bwd;
        out->comm += g[i].ag_fwd + g[i].ag_bwd + g[i].rs;
    }
    out->compute += o->tail;
    out->comm += o->tail_comm;
out:
    free(ag_f);
    free(ag_b);
    free(rs);
    free(q);
    return rc;
}
