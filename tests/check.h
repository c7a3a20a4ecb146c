/* A minimal test harness: CHECK macros that record failures and keep going,
 * and RUN() that prints one line per case. Each test program is one meson
 * test; it exits non-zero if any case failed or any CHECK failed outside
 * a case (tests/test_check_harness.c shows both). */
#ifndef LPX_TESTS_CHECK_H
#define LPX_TESTS_CHECK_H

#include <math.h>
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

static inline void check_run(const char *name, void (*fn)(void))
{
    check_flush_outside(check_cases_run ? "between cases" : "before the first case");
    fn();
    check_cases_run++;
    printf("%s %s\n", check_case_failures ? "FAIL" : "ok  ", name);
    if (check_case_failures) check_total_failures++;
    check_case_failures = 0; /* counted: what comes next is outside a case */
    fflush(stdout);
}
#define RUN(fn) check_run(#fn, fn)
#define CHECK_DONE() (check_flush_outside(check_cases_run ? "after the last case" : "outside any case"), \
                      printf("%d cases, %d failed%s\n", check_cases_run, check_total_failures, \
                             check_outside_failures ? ", and checks failed outside the cases" : ""), \
                      check_total_failures || check_outside_failures ? 1 : 0)

#endif
