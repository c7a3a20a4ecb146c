/* GPU suite: cuda_ops (being written). */
#include "gpu_util.h"

int main(void)
{
    gpu_setup();
    return CHECK_DONE();
}
