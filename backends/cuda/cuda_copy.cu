/* (kernel group copy: being written) */
#include "cuda_dtype.cuh"

extern "C" lpx_status cu_register_copy(const lpx_host *h)
{
    (void)h;
    return LPX_OK;
}
