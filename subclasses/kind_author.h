/* The kind-author header: the one non-public header the built-in kinds
 * (subclasses/float8, nf4, dtensor and the sharding engine beside it)
 * include. It gives them what a kind needs beyond the public headers and
 * nothing else:
 *   - core's internals (core/lpx_internal.h): lpx_ensure_init, the
 *     allocator, the tensor struct a kind reads its inner tensors and
 *     metadata from, the error helpers;
 *   - the typed-call helpers of the dispatcher (dispatch/api_util.h:
 *     lpx__call_ret1 and friends) for the kind's own ops;
 *   - the header-only numerics (core/numerics/) the kinds' scalar code
 *     shares with the backends.
 * A kind that includes anything else of the library's private headers
 * breaks the layering (scripts/check-layers.py fails on it). */
#ifndef LPX_KIND_AUTHOR_H
#define LPX_KIND_AUTHOR_H

#include "../core/lpx_internal.h"
#include "../dispatch/api_util.h"
#include "../core/numerics/bits.h"

#endif
