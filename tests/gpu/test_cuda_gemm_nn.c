/* GPU suite: cuda_gemm_nn (being written). */
#include "gpu_util.h"

int main(void)
{
    gpu_setup();
    return CHECK_DONE();
}
