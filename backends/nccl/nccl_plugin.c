/* lpx-nccl.so (being written). */
#include <lpx/lpx.h>
#include <lpx/plugin.h>

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    (void)host;
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "nccl";
    info->version = "0.1.0";
    return LPX_OK;
}
