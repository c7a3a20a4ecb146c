/* The `lpx` command: exit codes and output of info, help, bench routing and
 * usage errors. Runs the built executable (path from LPX_TEST_LPX_EXE). */
#include <stdlib.h>
#include <sys/wait.h>
#include "check.h"
#include "run_util.h"


static void test_info(void)
{
    char out[8192];
    CHECK(run("info", out, sizeof out) == 0);
    CHECK(strstr(out, "lpx 0.1.0") != NULL);
    CHECK(strstr(out, "f8e4m3fn") && strstr(out, "bf16") && strstr(out, "bool"));
    CHECK(strstr(out, "backends (1): cpu") != NULL);
    CHECK(strstr(out, "ops: ") != NULL);
    CHECK(strstr(out, "blockwise fp8 GEMM (fp8_mm_block): cpu (reference") != NULL);
    CHECK(run("info --bogus", out, sizeof out) == 2);
    CHECK(strstr(out, "unknown option") != NULL);
}

static void test_usage_errors(void)
{
    char out[8192];
    CHECK(run("", out, sizeof out) == 2);
    CHECK(strstr(out, "usage:") != NULL);
    CHECK(run("frobnicate", out, sizeof out) == 2);
    CHECK(strstr(out, "unknown command 'frobnicate'") != NULL);
    CHECK(run("bench", out, sizeof out) == 2);
    CHECK(run("bench nosuch", out, sizeof out) == 2);
    CHECK(strstr(out, "unknown benchmark 'nosuch'") != NULL);
    CHECK(run("bench dispatch --nosuchflag", out, sizeof out) == 2);
    CHECK(run("bench ckpt --mb 3", out, sizeof out) == 2);
    /* the checkpoint bench end to end, small: three rows, its directory removed */
    CHECK(run("bench ckpt --mb 8 --ranks 2", out, sizeof out) == 0);
    CHECK(strstr(out, "save (write+fsync, index, commit)") && strstr(out, "load, resharded"));
    CHECK(strstr(out, "load, same world, from disk") && strstr(out, "disk read (cold)") && strstr(out, "MB/s per rank"));
    CHECK(run("help", out, sizeof out) == 0);
    CHECK(run("--version", out, sizeof out) == 0);
    CHECK(strstr(out, "0.1.0") != NULL);
}

int main(void)
{
    exe = getenv("LPX_TEST_LPX_EXE");
    if (!exe) {
        printf("LPX_TEST_LPX_EXE not set: skipping\n");
        return 77; /* meson's skip code */
    }
    RUN(test_info);
    RUN(test_usage_errors);
    return CHECK_DONE();
}
