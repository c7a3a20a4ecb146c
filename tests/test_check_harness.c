/* The harness itself (tests/check.h). Built four ways (tests/meson.build):
 *  - "before" / "after": a CHECK failing outside any case (before the first
 *    RUN, after the last) must fail the program; meson runs them as
 *    should_fail tests, so a harness that drops such failures (the old
 *    check_run reset the count per case) turns them red;
 *  - "skip_after_fail": a case that fails a CHECK and then skips is a
 *    failure, not a skip (should_fail);
 *  - "filter": TEST_FILTER selects cases; one that selects none fails;
 *  - "counts": a passing, a dependency-skipped and a GPU-skipped case, then
 *    every later case skipped by check_skip_rest: the program checks the
 *    harness's counts itself and exits 0 only when they are right. */
#include "check.h"

static void test_passes(void) { CHECK(1 + 1 == 2); }
static void test_skips_dependency(void) { SKIP_CASE("a package %s is missing", "p"); }
static void test_skips_gpu(void) { SKIP_CASE_GPU("no GPU"); }
static void test_fails_then_skips(void)
{
    CHECK(0 && "a failure before the skip");
    SKIP_CASE("the skip must not hide the failure");
}
static int never_called;
static void test_not_called(void) { never_called = 1; }

int main(void)
{
    /* each mode uses some of the cases */
    (void)test_passes, (void)test_skips_dependency, (void)test_skips_gpu, (void)test_fails_then_skips,
        (void)test_not_called;
#if defined(CHECK_HARNESS_BEFORE)
    CHECK(0 && "a failure before the first case");
    RUN(test_passes);
#elif defined(CHECK_HARNESS_AFTER)
    RUN(test_passes);
    CHECK(0 && "a failure after the last case");
#elif defined(CHECK_HARNESS_SKIP_AFTER_FAIL)
    RUN(test_passes);
    RUN(test_fails_then_skips);
#elif defined(CHECK_HARNESS_FILTER)
    /* run with TEST_FILTER=passes: one case runs, the other is not counted;
     * with a filter matching nothing the program must fail */
    RUN(test_passes);
    RUN(test_not_called);
    int rc = CHECK_DONE();
    const char *f = getenv("TEST_FILTER");
    bool right = f && !strcmp(f, "passes") ? rc == 0 && check_cases_run == 1 && !never_called : rc != 0;
    printf("filter %s\n", right ? "right" : "WRONG");
    return right ? 0 : 1;
#else
    RUN(test_passes);
    RUN(test_skips_dependency);
    RUN(test_skips_gpu);
    check_skip_rest(CHECK_SKIP_GPU, "set-up found no GPU");
    RUN(test_not_called);
    RUN(test_not_called);
    int rc = CHECK_DONE();
    bool right = rc == 0 && check_cases_run == 5 && check_total_failures == 0 && check_cases_skipped == 4 &&
                 check_cases_skipped_gpu == 3 && !never_called;
    printf("harness counts %s\n", right ? "right" : "WRONG");
    return right ? 0 : 1;
#endif
    return CHECK_DONE();
}
