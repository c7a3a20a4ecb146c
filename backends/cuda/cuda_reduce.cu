/* (kernel group reduce: being written) */
#include "cuda_internal.h"

extern "C" lpx_status cu_register_reduce(const lpx_host *h)
{
    (void)h;
    return LPX_OK;
}
