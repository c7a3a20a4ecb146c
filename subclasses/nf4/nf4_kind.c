/* The nf4 kind (being written). */
#include "../../core/lpx_internal.h"

lpx_status lpx_nf4_register_kind(void) { return LPX_OK; }
