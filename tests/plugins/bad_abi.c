/* Broken plugin: built for plugin ABI major 2. Its registration attempt
 * must be refused and the load rejected with the ABI reason. */
#include "lpx/lpx.h"

static void dec(const void *src, float *dst, size_t n) { (void)src; for (size_t i = 0; i < n; i++) dst[i] = 0; }
static void enc(const float *src, void *dst, size_t n, unsigned f) { (void)src; (void)dst; (void)n; (void)f; }

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR + 1;
    info->abi_minor = 0;
    info->name = "test-badabi";
    info->version = "2.0.0";
    lpx_dtype_traits t = {.struct_size = sizeof t, .name = "badabi_dt", .bits = 8, .block = 1,
                          .to_f32 = dec, .from_f32 = enc};
    lpx_dtype d;
    /* refused by the host: the info header names another ABI major */
    (void)host->dtype_register(host, &t, &d);
    return LPX_OK;
}
