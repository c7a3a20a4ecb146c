/* Broken plugin: exports no lpx_plugin_init (a misspelled entry point). */
#include "lpx/lpx.h"

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_initialise(const lpx_host *host, lpx_plugin_info *info);
LPX_PLUGIN_EXPORT lpx_status lpx_plugin_initialise(const lpx_host *host, lpx_plugin_info *info)
{
    (void)host;
    (void)info;
    return LPX_OK;
}
