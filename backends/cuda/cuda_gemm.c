/* (kernel group gemm: being written) */
#include "cuda_internal.h"

lpx_status cu_register_gemm(const lpx_host *h)
{
    (void)h;
    return LPX_OK;
}

void cu_gemm_shutdown(void) {}
