/* Typed API: views (being written). */
#include "../core/lpx_internal.h"
