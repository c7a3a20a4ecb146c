/* (kernel group float8: being written) */
#include "cuda_internal.h"

extern "C" lpx_status cu_register_float8(const lpx_host *h)
{
    (void)h;
    return LPX_OK;
}
