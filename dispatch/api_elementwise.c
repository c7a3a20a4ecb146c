/* Typed API: elementwise (being written). */
#include "../core/lpx_internal.h"
