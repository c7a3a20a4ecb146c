/* The out-of-memory sweep (tests/test_oom.c and its case files
 * tests/oom_*.c): the framework the cases share.
 *
 * A case sweeps one public entry point. Its function runs once per
 * attempt: it builds what the call needs with every allocation working,
 * makes the call inside OOM(...) (which arms the allocation-failure hook
 * for that call only), checks what the API promises on failure, releases
 * everything and returns the call's status. The driver runs attempt n with
 * the (n+1)th allocation of the armed region failing (and every later
 * one), for n = 0, 1, ... until the call succeeds; every attempt must
 * return LPX_OK or LPX_ENOMEM with a message and leave the registries as
 * they were. Rank cases (oom_ranks) run the call on the ranks of a local
 * comm group, each rank in its own thread, with one shared countdown.
 *
 * Cases report broken promises with OOM_CHECK (thread-safe), not CHECK. */
#ifndef LPX_TESTS_OOM_H
#define LPX_TESTS_OOM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "lpx/lpx.h"

LPX_API void lpx__fail_alloc_after(long n);   /* test hook of liblpx (core/alloc.c) */

/* Case flags. */
enum {
    /* the successful call registers something for good (an op, a dtype, a
     * backend): registry counts may grow on the last attempt, and the
     * allocator balance is not checked */
    OOM_PERSISTENT = 1u,
    /* no status to return (a void or counting entry point): the case
     * returns LPX_ENOMEM when it observed the documented degradation
     * (a dropped trace span, an omitted table, a plugin not loaded) */
    OOM_OBSERVED = 2u,
};

typedef struct oom_case {
    const char *fn;        /* the public entry point it sweeps */
    const char *variant;   /* what this case feeds it ("float8", "strided"...), or NULL */
    lpx_status (*run)(int attempt);
    unsigned flags;
} oom_case;

/* The case tables of the oom_*.c files, each ended by {NULL}. */
extern const oom_case oom_cases_core[], oom_cases_ops[], oom_cases_kinds[], oom_cases_dist[], oom_cases_io[];
extern const oom_case oom_cases_optim[]; /* oom_optim.c */

/* Fixture setup/teardown of the case files that share tensors between
 * cases (called by the driver, allocation hook disarmed). */
lpx_status oom_core_init(void);
lpx_status oom_ops_init(void);
void oom_ops_fini(void);
lpx_status oom_kinds_init(void);
void oom_kinds_fini(void);

/* ---- arming ---------------------------------------------------------- */

extern lpx_status oom_last;   /* status of the last OOM() call */

/* Arms the hook with the current attempt's countdown / disarms it. */
void oom_arm(void);
void oom_disarm(void);

/* Runs `call` with the allocation hook armed; its value is the call's
 * status (also in oom_last). Not for rank threads: use oom_ranks. */
#define OOM(call) (oom_arm(), oom_last = (call), oom_disarm(), oom_last)

/* Records a broken promise (thread-safe); the case and the test fail. */
void oom_failf(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
#define OOM_CHECK(cond) do { if (!(cond)) oom_failf(__FILE__, __LINE__, "%s", #cond); } while (0)
#define OOM_CHECKF(cond, ...) do { if (!(cond)) oom_failf(__FILE__, __LINE__, __VA_ARGS__); } while (0)
/* setup (hook disarmed) must succeed: returns its status from the case */
#define OOM_SETUP(expr) do { lpx_status s_ = (expr); if (s_) { \
    oom_failf(__FILE__, __LINE__, "setup %s -> %s (%s)", #expr, lpx_status_string(s_), lpx_last_error()); \
    return s_; } } while (0)

/* An output of a failed call must be NULL. */
#define OOM_OUT_NULL(st, out) OOM_CHECKF(!(st) || !(out), "a failed call left an output: %s", #out)

/* A private scratch directory for files (safetensors, trace JSON). */
const char *oom_tmpdir(void);

/* ---- rank cases ------------------------------------------------------ */

/* A call run on every rank of a local group of `nranks` (each rank a
 * thread): setup and check run disarmed on every rank; the hook is armed
 * around `call` for all ranks at once. A rank whose call fails aborts the
 * comm, so its peers fail with LPX_ECOMM instead of waiting. The case's
 * status is LPX_OK when every rank succeeded, else LPX_ENOMEM when some
 * rank ran out of memory and every other one succeeded, ran out too or
 * failed with LPX_ECOMM because of it; anything else is a failure. */
typedef struct oom_ranks {
    int nranks;
    size_t state_size;   /* zeroed per-rank state handed to the callbacks */
    lpx_status (*setup)(lpx_comm *comm, int rank, void *state);
    lpx_status (*call)(lpx_comm *comm, int rank, void *state);
    /* after the call (its status `st`), disarmed: verify, then release */
    void (*cleanup)(lpx_comm *comm, int rank, void *state, lpx_status st);
} oom_ranks;

lpx_status oom_run_ranks(const oom_ranks *r);

/* Small helpers for building inputs (disarmed). */
lpx_tensor *oom_randn2(int64_t rows, int64_t cols, uint64_t seed, lpx_dtype dtype);
lpx_tensor *oom_randn1(int64_t n, uint64_t seed, lpx_dtype dtype);

#endif
