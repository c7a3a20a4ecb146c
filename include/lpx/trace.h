/* lpx — dispatch tracing.
 *
 * LPX_TRACE=1 in the environment (read at lpx_init) counts calls and time
 * per (op, key) and prints a table to stderr at exit; LPX_TRACE=FILE.json
 * also writes Chrome trace events (one span per dispatched op, one track per
 * thread) that open in Perfetto / chrome://tracing. The table makes silent
 * double dispatch and silent fallbacks visible. */
#ifndef LPX_TRACE_H
#define LPX_TRACE_H

#include <stdio.h>
#include <stdint.h>
#include <stdbool.h>
#include "export.h"
#include "status.h"
#include "dispatch.h"

LPX_BEGIN_DECLS

/** Starts counting (and, if json_path is non-NULL, recording span events
 *  for that file). Resets previous counts. Errors: LPX_ENOMEM. */
LPX_API lpx_status lpx_trace_start(const char *json_path);
/** Stops counting; the counts stay readable. Writes the JSON file if one
 *  was requested (LPX_EIO if it cannot be written). */
LPX_API lpx_status lpx_trace_stop(void);
LPX_API bool lpx_trace_enabled(void);
/** Calls of (op, key) since lpx_trace_start. `fallback` counts those that
 *  ran the key's fallback instead of a kernel. */
LPX_API uint64_t lpx_trace_count(lpx_op op, int key);
LPX_API uint64_t lpx_trace_fallback_count(lpx_op op, int key);
/** Total nanoseconds spent in (op, key), inner calls included. */
LPX_API uint64_t lpx_trace_ns(lpx_op op, int key);
/** Prints the table (op, key, calls, fallbacks, total/avg time) to f. */
LPX_API void lpx_trace_print(FILE *f);
/** Records a span that did not come through dispatch (collectives, steps)
 *  on the calling thread's track, when tracing with a JSON file. */
LPX_API void lpx_trace_span(const char *name, const char *category, uint64_t start_ns, uint64_t end_ns);
/** Monotonic clock in nanoseconds (the clock spans use). */
LPX_API uint64_t lpx_now_ns(void);

LPX_END_DECLS

#endif
