/* A minimal test harness: CHECK macros that record failures and keep going,
 * RUN() that prints one line per case (ok, FAIL, or skip with its reason),
 * and CHECK_DONE() that prints the program's case counts for the suite's
 * summary. Each test program is one meson test; it exits non-zero if any
 * case failed or any CHECK failed outside a case (tests/test_check_harness.c
 * shows both, and the skip rules). docs/TESTING.md: the outcome model. */
#ifndef LPX_TESTS_CHECK_H
#define LPX_TESTS_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"

static int check_case_failures;
static int check_total_failures;
static int check_cases_run;

#define CHECK(cond) do { if (!(cond)) { check_case_failures++; \
    fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECKF(cond, ...) do { if (!(cond)) { check_case_failures++; \
    fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_OK(expr) do { lpx_status s_ = (expr); if (s_ != LPX_OK) { check_case_failures++; \
    fprintf(stderr, "  %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #expr, \
            lpx_status_string(s_), lpx_last_error()); } } while (0)
/* expects a specific error code and a non-empty message */
#define CHECK_ERR(expr, code) do { lpx_status s_ = (expr); if (s_ != (code)) { check_case_failures++; \
    fprintf(stderr, "  %s:%d: %s -> %s, expected %s (%s)\n", __FILE__, __LINE__, #expr, \
            lpx_status_string(s_), lpx_status_string(code), lpx_last_error()); } \
    else if (lpx_last_error()[0] == 0) { check_case_failures++; \
    fprintf(stderr, "  %s:%d: %s failed without a message\n", __FILE__, __LINE__, #expr); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); \
    if (!(fabs(a_ - b_) <= (tol))) { check_case_failures++; \
    fprintf(stderr, "  %s:%d: |%s - %s| = |%.9g - %.9g| > %g\n", __FILE__, __LINE__, #a, #b, a_, b_, (double)(tol)); } } while (0)

static int check_outside_failures;

/* ---- outcomes: a case passes, fails or is skipped with its reason ----
 * A case that cannot run here says why and returns: SKIP_CASE for a
 * missing dependency (a Python package, mpirun: CI installs these, so a
 * dependency skip fails CI, see scripts/test-summary.py), SKIP_CASE_GPU
 * for hardware the machine lacks (no GPU, fewer GPUs than ranks). A CHECK
 * that failed before the skip still fails the case. When the program's
 * set-up finds it cannot run anything (no GPU), check_skip_rest makes every
 * later RUN report its case as skipped without calling it, so the totals
 * count the cases that did not run instead of one program. */
enum { CHECK_SKIP_DEP = 1, CHECK_SKIP_GPU = 2 };
static int check_case_skip, check_rest_skip;
static char check_case_skip_why[512], check_rest_skip_why[512];
static int check_cases_skipped, check_cases_skipped_gpu;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline void check_skip_set(int cls, int rest, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rest ? check_rest_skip_why : check_case_skip_why, sizeof check_case_skip_why, fmt, ap);
    va_end(ap);
    if (rest) check_rest_skip = cls;
    else check_case_skip = cls;
}
#define SKIP_CASE(...) do { check_skip_set(CHECK_SKIP_DEP, 0, __VA_ARGS__); return; } while (0)
#define SKIP_CASE_GPU(...) do { check_skip_set(CHECK_SKIP_GPU, 0, __VA_ARGS__); return; } while (0)
#define check_skip_rest(cls, ...) check_skip_set((cls), 1, __VA_ARGS__)

/* CHECKs that failed outside any case (in main() before the first RUN,
 * between two, or after the last) fail the program too: they are counted
 * here and printed, never dropped. */
static inline void check_flush_outside(const char *where)
{
    if (!check_case_failures) return;
    check_outside_failures += check_case_failures;
    printf("FAIL %d check(s) %s\n", check_case_failures, where);
    fflush(stdout);
    check_case_failures = 0;
}

static inline void check_count_skip(const char *name, int cls, const char *why)
{
    check_cases_skipped++;
    if (cls == CHECK_SKIP_GPU) check_cases_skipped_gpu++;
    printf("skip %s (%s): %s\n", name, cls == CHECK_SKIP_GPU ? "gpu" : "dependency", why);
}

/* TEST_FILTER=text runs only the cases whose name contains `text` (the
 * others are neither run nor counted): `TEST_FILTER=hybrid
 * build/tests/test_fsdp_step`, or through meson, `TEST_FILTER=hybrid meson test
 * -C build fsdp`. A filter that selects no case fails the program, so a
 * typo does not pass as a green run. */
static int check_filtered_out;
static inline bool check_selected(const char *name)
{
    const char *f = getenv("TEST_FILTER");
    if (!f || !*f || strstr(name, f)) return true;
    check_filtered_out++;
    return false;
}

static inline void check_run(const char *name, void (*fn)(void))
{
    if (!check_selected(name)) return;
    check_flush_outside(check_cases_run ? "between cases" : "before the first case");
    check_cases_run++;
    if (check_rest_skip) {
        check_count_skip(name, check_rest_skip, check_rest_skip_why);
        fflush(stdout);
        return;
    }
    check_case_skip = 0;
    fn();
    if (check_case_failures) {
        printf("FAIL %s\n", name);
        check_total_failures++;
    } else if (check_case_skip) {
        check_count_skip(name, check_case_skip, check_case_skip_why);
    } else {
        printf("ok   %s\n", name);
    }
    check_case_failures = 0; /* counted: what comes next is outside a case */
    check_case_skip = 0;
    fflush(stdout);
}
#define RUN(fn) check_run(#fn, fn)

/* The program's result. Prints the totals and the line the suite's summary
 * (scripts/test-summary.py) reads: "lpx-cases: passed=P failed=F
 * skipped=S gpu=G" (G of the S skips are for missing hardware; failures
 * outside a case count as one more failed case). Exit code: 1 if anything
 * failed, 77 (meson's "skipped") if no case ran, else 0. */
static inline int check_done(void)
{
    check_flush_outside(check_cases_run ? "after the last case" : "outside any case");
    int failed = check_total_failures + (check_outside_failures ? 1 : 0);
    int passed = check_cases_run - check_total_failures - check_cases_skipped;
    printf("%d cases: %d passed, %d failed, %d skipped%s\n", check_cases_run, passed, check_total_failures,
           check_cases_skipped, check_outside_failures ? ", and checks failed outside the cases" : "");
    printf("lpx-cases: passed=%d failed=%d skipped=%d gpu=%d\n", passed, failed, check_cases_skipped,
           check_cases_skipped_gpu);
    fflush(stdout);
    if (failed) return 1;
    if (check_filtered_out && !check_cases_run) {
        printf("TEST_FILTER=%s selects none of the %d cases\n", getenv("TEST_FILTER"), check_filtered_out);
        return 1;
    }
    return passed == 0 && check_cases_skipped > 0 ? 77 : 0;
}
#define CHECK_DONE() check_done()

#endif
