/* Collective times (plan.h): NCCL's ring and tree, from bytes, bus
 * bandwidth and latency. The bus bandwidth is what nccl-tests report as
 * busbw: for a ring all-gather of S bytes over n ranks each link carries
 * (n-1)/n S, so t = (n-1)/n S / busbw. */
#include <math.h>
#include "plan.h"

double pl_ring_bw(int n, const pl_net *net)
{
    /* a ring that spans nodes crosses a NIC at every node boundary: the
     * slowest link sets its pace */
    return n > net->gpus_per_node ? net->inter_bw : net->intra_bw;
}

double pl_coll_time(pl_coll k, double bytes, int n, const pl_net *net)
{
    if (n <= 1 || bytes <= 0) return 0;
    double bw = pl_ring_bw(n, net), frac = (double)(n - 1) / n;
    if (k == PL_ALL_REDUCE && bytes <= 65536)
        return 2.0 * ceil(log2((double)n)) * net->latency + 2.0 * bytes / bw;   /* tree: up and down */
    if (k == PL_ALL_REDUCE) return 2.0 * frac * bytes / bw + 2.0 * (n - 1) * net->latency;
    return frac * bytes / bw + (n - 1) * net->latency;
}
