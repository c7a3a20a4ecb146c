/* Typed API: reduce (being written). */
#include "../core/lpx_internal.h"
