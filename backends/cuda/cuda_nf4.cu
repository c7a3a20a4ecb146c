/* (kernel group nf4: being written) */
#include "cuda_internal.h"

extern "C" lpx_status cu_register_nf4(const lpx_host *h)
{
    (void)h;
    return LPX_OK;
}
