/* Typed API: creation (being written). */
#include "../core/lpx_internal.h"
