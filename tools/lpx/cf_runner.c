/* fork + pipe + poll: one case per child process. The child writes its
 * outcome letter (P, F, S) and detail line into a pipe (one write under
 * PIPE_BUF, so it arrives whole or not at all) and _exits 0; atexit
 * handlers (the trace table of LPX_TRACE) do not run in it. A child that
 * dies before writing crashed, whether by a signal or by exiting (a
 * sanitizer reports a SEGV and exits 1). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "cf_runner.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

cf_run_outcome cf_run_isolated(cf_child_fn fn, const void *ctx, double timeout_s, char *detail, size_t len,
                               double *seconds)
{
    double t0 = now();
    int fds[2];
    detail[0] = 0;
    *seconds = 0;
    if (pipe(fds) != 0) {
        snprintf(detail, len, "cannot create a pipe: %s", strerror(errno));
        return CFR_FAIL;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(detail, len, "cannot fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return CFR_FAIL;
    }
    if (pid == 0) {
        close(fds[0]);
        char buf[1024];
        buf[0] = 0;
        int o = fn(ctx, buf + 1, sizeof buf - 1);
        buf[0] = o == CFR_PASS ? 'P' : o == CFR_SKIP ? 'S' : 'F';
        buf[sizeof buf - 1] = 0;
        ssize_t w = write(fds[1], buf, strlen(buf));
        _exit(w > 0 ? 0 : 3);
    }
    close(fds[1]);
    size_t got = 0;
    int timed_out = 0;
    for (;;) {
        double left = timeout_s - (now() - t0);
        if (left <= 0) { timed_out = 1; break; }
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) continue;   /* loop re-checks the deadline */
        char sink[256];   /* a detail longer than `len` is cut, the pipe still drained */
        char *dst = got + 1 < len ? detail + got : sink;
        size_t cap = got + 1 < len ? len - 1 - got : sizeof sink;
        ssize_t n = read(fds[0], dst, cap);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;   /* EOF: the child exited or closed the pipe */
        if (dst != sink) got += (size_t)n;
    }
    detail[got] = 0;
    close(fds[0]);
    int status = 0;
    if (timed_out) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        *seconds = now() - t0;
        snprintf(detail, len, "timed out after %.0f s (killed)", timeout_s);
        return CFR_FAIL;
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    *seconds = now() - t0;
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(detail, len, "crashed: killed by signal %d (%s)", sig, strsignal(sig));
        return CFR_FAIL;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got == 0 || !strchr("PFS", detail[0])) {
        snprintf(detail, len, "crashed: %s with status %d before reporting a result",
                 WIFEXITED(status) ? "exited" : "ended", WIFEXITED(status) ? WEXITSTATUS(status) : status);
        return CFR_FAIL;
    }
    char letter = detail[0];
    memmove(detail, detail + 1, got);   /* drop the letter, keep the terminator */
    return letter == 'P' ? CFR_PASS : letter == 'S' ? CFR_SKIP : CFR_FAIL;
}
