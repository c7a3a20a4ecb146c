/* LPX_PLUGIN_PATH: every lpx-*.so of a list of directories, loaded in name
 * order per directory. A directory that cannot be read and a plugin that
 * fails are both recorded in the skipped list (`lpx info`), never fatal. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plugin_internal.h"

static bool is_plugin_file(const char *n)
{
    size_t len = strlen(n);
    return len > 7 && !strncmp(n, "lpx-", 4) && !strcmp(n + len - 3, ".so");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads the lpx-*.so files of one directory, in name order. */
static int scan_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        char reason[512];
        snprintf(reason, sizeof reason, "cannot read plugin directory: %s", strerror(errno));
        lpx_plugin_add_skipped(dir, reason);
        return 0;
    }
    char **names = NULL;
    int n = 0, cap = 0, nloaded_here = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_plugin_file(e->d_name)) continue;
        if (n == cap) {
            int c = cap ? 2 * cap : 16;
            char **v = lpx_realloc(names, (size_t)c * sizeof *v);
            if (!v) break;
            names = v;
            cap = c;
        }
        if (!(names[n] = lpx_strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        char path[4096 + 256 + 2];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (lpx_plugin_load(path, NULL) == LPX_OK) nloaded_here++;
        lpx_free(names[i]);
    }
    lpx_free(names);
    return nloaded_here;
}

int lpx_plugin_scan(const char *dirs)
{
    if (!dirs) return 0;
    int total = 0;
    const char *s = dirs;
    while (*s) {
        const char *end = strchr(s, ':');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (len > 0 && len < 4096) {
            char dir[4096];
            memcpy(dir, s, len);
            dir[len] = 0;
            total += scan_dir(dir);
        }
        if (!end) break;
        s = end + 1;
    }
    return total;
}

void lpx_plugins_init_from_env(void)
{
    /* secure_getenv: a setuid program does not load code named by its caller */
    const char *dirs = secure_getenv("LPX_PLUGIN_PATH");
    if (dirs && dirs[0]) lpx_plugin_scan(dirs);
}
