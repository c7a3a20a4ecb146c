/* Runs a function in a child process with a timeout, so that a crash or a
 * hang in it (a broken kind or plugin) is a result, not the end of the
 * caller. Used by `lpx conformance`. */
#ifndef LPX_TOOLS_CF_RUNNER_H
#define LPX_TOOLS_CF_RUNNER_H

#include <stddef.h>

typedef enum cf_run_outcome { CFR_PASS = 0, CFR_FAIL = 1, CFR_SKIP = 2 } cf_run_outcome;

/* Runs in the child; returns an outcome and writes a one-line detail. */
typedef int (*cf_child_fn)(const void *ctx, char *detail, size_t len);

/* Forks, runs fn(ctx) in the child, and waits at most timeout_s seconds.
 * A child killed by a signal, exiting abnormally or running past the
 * timeout (then killed) is CFR_FAIL with the reason in `detail`.
 * *seconds gets the wall time. */
cf_run_outcome cf_run_isolated(cf_child_fn fn, const void *ctx, double timeout_s, char *detail, size_t len,
                               double *seconds);

#endif
