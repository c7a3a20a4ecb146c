/* The cuDNN attention interface (cuda_sdpa.h) for a build without cudnn.h:
 * every call declines, so attention runs the reference kernels and
 * `lpx info` says why. */
#include <stdio.h>
#include "cuda_sdpa.h"

int cu_sdpa_fits(const cu_sdpa_shape *x, int sm_major, char *why, size_t wn)
{
    (void)x;
    (void)sm_major;
    if (why && wn) snprintf(why, wn, "lpx-cuda was built without cudnn.h");
    return 0;
}

int64_t cu_sdpa_workspace(const cu_sdpa_shape *x, int backward, char *why, size_t wn)
{
    (void)x;
    (void)backward;
    if (why && wn) snprintf(why, wn, "lpx-cuda was built without cudnn.h");
    return -1;
}

int cu_sdpa_forward(const cu_sdpa_shape *x, const void *q, const void *k, const void *v, void *o, float *lse, void *ws,
                    cudaStream_t stream, char *why, size_t wn)
{
    (void)x, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)ws, (void)stream;
    if (why && wn) snprintf(why, wn, "lpx-cuda was built without cudnn.h");
    return -1;
}

int cu_sdpa_backward(const cu_sdpa_shape *x, const void *grad, const void *q, const void *k, const void *v,
                     const void *o, const float *lse, void *dq, void *dk, void *dv, void *ws, cudaStream_t stream,
                     char *why, size_t wn)
{
    (void)x, (void)grad, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)dq, (void)dk, (void)dv, (void)ws;
    (void)stream;
    if (why && wn) snprintf(why, wn, "lpx-cuda was built without cudnn.h");
    return -1;
}

void cu_sdpa_init_env(void) {}

int cu_sdpa_describe(char *buf, size_t n)
{
    snprintf(buf, n, "reference kernel (warp per query row; lpx-cuda was built without cudnn.h, so no cuDNN SDPA)");
    return 0;
}
