/* (kernel group elementwise: being written) */
#include "cuda_internal.h"

extern "C" lpx_status cu_register_elementwise(const lpx_host *h)
{
    (void)h;
    return LPX_OK;
}
