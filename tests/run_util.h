/* Running the built `lpx` executable from a test program: the programs that
 * test the command line (test_cli, test_train, test_llama) set `exe` from
 * LPX_TEST_LPX_EXE and call run(). */
#ifndef LPX_TESTS_RUN_UTIL_H
#define LPX_TESTS_RUN_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const char *exe;   /* the lpx executable under test (main sets it) */

/* Runs `exe args` through the shell, captures stdout+stderr into buf
 * (NUL-terminated, truncated to len - 1), returns the exit code (-1 when it
 * did not exit normally). */
static inline int run(const char *args, char *buf, size_t len)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(buf, 1, len - 1, p);
    buf[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* the losses of lpx train's progress lines "  LABEL ... loss X" in order
 * (at most cap) */
static inline int train_losses(const char *out, const char *label, double *v, int cap)
{
    int n = 0;
    const char *s = out;
    char pat[64];
    snprintf(pat, sizeof pat, "  %s ", label);
    while ((s = strstr(s, pat)) && n < cap) {
        const char *l = strstr(s, "loss ");
        if (!l) break;
        v[n++] = atof(l + 5);
        s = l;
    }
    return n;
}

/* newlines in s: one-line messages are checked with it */
static inline int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

#endif
