/* The plugins shipped with the lpx command, found the same way by every
 * command (docs/PLUGINS.md, "Where plugins are found"): next to this
 * executable, in the build tree (build/tools/lpx/lpx -> build/<tree_dir>/)
 * or an install prefix (<prefix>/bin/lpx -> <prefix>/lib{,64,/<triplet>}/lpx/). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "lpx/lpx.h"
#include "lpx/plugin.h"
#include "commands.h"

bool lpx_tool_load_shipped(const char *tree_dir, const char *file)
{
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    static const char *const rel[] = {NULL, "/../lib/lpx", "/../lib/x86_64-linux-gnu/lpx", "/../lib64/lpx"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char path[1200];
        if (rel[i]) snprintf(path, sizeof path, "%s%s/%s", exe, rel[i], file);
        else snprintf(path, sizeof path, "%s/../../%s/%s", exe, tree_dir, file);
        if (access(path, R_OK) == 0 && lpx_plugin_load(path, NULL) == LPX_OK) return true;
    }
    return false;
}


void *lpx_tool_plugin_fn(const char *plugin, const char *name)
{
    const lpx_plugin *p = NULL;
    void *sym = lpx_plugin_find(plugin, &p) == LPX_OK ? lpx_plugin_symbol(p, name) : NULL;
    lpx_clear_error();   /* an absent plugin or export is an answer here, not an error */
    return sym;
}

void lpx_tool_load_shipped_plugins(void)
{
    /* a caller who set LPX_PLUGIN_PATH (even to nothing) chose the plugins:
     * lpx_init loaded them, and nothing else is added */
    if (getenv("LPX_PLUGIN_PATH")) return;
    const lpx_plugin *p = NULL;
    if (lpx_plugin_find("mx", &p) != LPX_OK) {
        lpx_clear_error();
        (void)lpx_tool_load_shipped("plugins/mx", "lpx-mx.so");
        lpx_clear_error();
    }
}
