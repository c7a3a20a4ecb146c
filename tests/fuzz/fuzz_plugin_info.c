/* Fuzz target: plugin info validation. What a plugin's init declares in
 * lpx_plugin_info (struct_size, ABI, name, version, description) is checked
 * by the loader before the plugin is accepted; lpx__plugin_accept_info
 * (plugins/loader.c, a test hook) runs exactly those checks without
 * dlopen. Input: struct_size (u64: a small selector or a raw value),
 * abi_major, abi_minor (u32), then name, version and description strings
 * (length byte + bytes; 0xff = NULL). Strings are real C strings, as the
 * ABI requires; what the loader must survive is any value in them.
 * lpx_plugin_load itself is exercised on real and broken plugins by
 * tests/test_plugins.c. */
#include "fuzz_util.h"
#include "plugins/plugin_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    _Alignas(16) unsigned char buf[LPX_PLUGIN_INFO_CAPACITY];
    memset(buf, 0, sizeof buf);
    lpx_plugin_info *info = (lpx_plugin_info *)buf;

    static const size_t sizes[] = {sizeof(lpx_plugin_info), LPX_PLUGIN_INFO_HEADER_SIZE,
                                   LPX_PLUGIN_INFO_HEADER_SIZE - 1, offsetof(lpx_plugin_info, abi_minor) + 4,
                                   LPX_PLUGIN_INFO_CAPACITY, LPX_PLUGIN_INFO_CAPACITY + 1, 0};
    uint8_t sel = fz_u8(&f);
    uint64_t raw = fz_u64(&f);
    info->struct_size = sel < sizeof sizes / sizeof *sizes ? sizes[sel] : (size_t)raw;
    info->abi_major = fz_u32(&f);
    info->abi_minor = fz_u32(&f);
    char *name = fz_str(&f, 200, NULL);
    char *version = fz_str(&f, 200, NULL);
    char *desc = fz_str(&f, 400, NULL);
    info->name = name;
    info->version = version;
    info->description = desc;

    char reason[1024] = "";
    lpx_status st = lpx__plugin_accept_info(info, reason, sizeof reason);
    if (st == LPX_OK) {
        /* accepted: a valid name and the ABI major this lpx speaks */
        FZ_ASSERT(info->abi_major == LPX_PLUGIN_ABI_MAJOR && name && name[0] && strlen(name) < 64);
        FZ_ASSERT(info->struct_size >= LPX_PLUGIN_INFO_HEADER_SIZE && info->struct_size < LPX_PLUGIN_INFO_CAPACITY);
    } else {
        FZ_ASSERT(st == LPX_EPLUGIN || st == LPX_EABI || st == LPX_ENOMEM);
        FZ_ASSERT(st == LPX_ENOMEM || (reason[0] && memchr(reason, 0, sizeof reason)));
    }
    free(name);
    free(version);
    free(desc);
    return 0;
}
