/* lpx-mx.so: the OCP Microscaling formats as a plugin. Built against the
 * public headers and the shared liblpx only (no core/ includes), the way a
 * third-party dtype author builds one; see docs/PLUGINS.md. */
#include "mx.h"

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "mx";
    info->version = "0.1.0";
    info->description = "OCP MX 1.0: dtypes e8m0, f4e2m1; kinds mxfp8, mxfp4 (blocks of 32)";
    if (host->abi_major != LPX_PLUGIN_ABI_MAJOR)
        return lpx_error(LPX_EABI, "mx: host speaks plugin ABI %u, built for %u", host->abi_major,
                         LPX_PLUGIN_ABI_MAJOR);
    mx_tensor_init();
    lpx_status st = mx_register_dtypes(host);
    if (!st) st = mx_register_kinds(host);
    if (!st) st = mx_register_ops(host);
    return st;
}
