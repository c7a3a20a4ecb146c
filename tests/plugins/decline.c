/* A plugin whose probe declines (as a GPU plugin does without a GPU). */
#include <stdio.h>
#include "lpx/lpx.h"

LPX_PLUGIN_EXPORT int lpx_plugin_probe(const lpx_host *host, char *reason, size_t len)
{
    (void)host;
    snprintf(reason, len, "no frobnicator device found");
    return 1;
}

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    (void)host;
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "test-decline";
    info->version = "1";
    return lpx_error(LPX_EINTERNAL, "decline: init must not run after the probe declined");
}
