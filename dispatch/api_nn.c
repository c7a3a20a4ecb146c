/* Typed API: nn (being written). */
#include "../core/lpx_internal.h"
