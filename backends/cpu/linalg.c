/* CPU kernels: linalg (being written). */
#include "cpu_internal.h"

lpx_status lpx_cpu_register_linalg(void) { return LPX_OK; }
