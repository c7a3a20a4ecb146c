/* Typed API: linalg (being written). */
#include "../core/lpx_internal.h"
