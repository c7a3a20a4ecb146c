/* CPU kernels: reduce (being written). */
#include "cpu_internal.h"

lpx_status lpx_cpu_register_reduce(void) { return LPX_OK; }
