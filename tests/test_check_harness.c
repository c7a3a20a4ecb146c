/* The harness itself (tests/check.h): a CHECK that fails outside any case
 * must fail the program. Built twice: with CHECK_OUTSIDE_AFTER a failure
 * after the last case, without it one before the first; meson runs both
 * as should_fail tests, so a harness that drops such failures (the old
 * check_run reset the count per case) turns them red. */
#include "check.h"

static void test_passes(void) { CHECK(1 + 1 == 2); }

int main(void)
{
#ifndef CHECK_OUTSIDE_AFTER
    CHECK(0 && "a failure before the first case");
#endif
    RUN(test_passes);
#ifdef CHECK_OUTSIDE_AFTER
    CHECK(0 && "a failure after the last case");
#endif
    return CHECK_DONE();
}
