/* The float8 kind (being written). */
#include "../../core/lpx_internal.h"

lpx_status lpx_float8_register_kind(void) { return LPX_OK; }
