/* `lpx info`: what this build of lpx knows. */
#include <stdio.h>
#include <string.h>
#include "lpx/lpx.h"
#include "commands.h"

int lpx_cmd_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: lpx info\n\nPrints the version, dtypes, kinds, backends, op count and plugins.\n");
            return 0;
        }
        fprintf(stderr, "lpx info: unknown option '%s'\nusage: lpx info\n", argv[i]);
        return 2;
    }
    printf("lpx %s\n", lpx_version());
    printf("dtypes (%d):", lpx_dtype_count());
    for (int d = 0; d < lpx_dtype_count(); d++) printf(" %s", lpx_dtype_name(d));
    printf("\nkinds (%d):", lpx_kind_count());
    for (int i = 0; i < lpx_kind_count(); i++) {
        const lpx_kind *k = lpx_kind_at(i);
        if (k) printf(" %s(key %d)", lpx_kind_name(k), lpx_kind_key(k));
    }
    if (lpx_kind_count() == 0) printf(" none");
    printf("\nbackends (%d):", lpx_backend_count());
    for (int i = 0; i < lpx_backend_count(); i++) {
        const lpx_backend_i *b = lpx_backend_at(i);
        printf(" %s(key %d)", b->name, lpx_device_key(b->device_type));
    }
    int nops = lpx_op_count(), with_cpu = 0;
    for (int op = 0; op < nops; op++) with_cpu += lpx_kernel_exists(op, LPX_KEY_CPU);
    printf("\nops: %d registered, %d with a cpu kernel\n", nops, with_cpu);
    printf("plugins: none loaded\n");
    printf("tracing: %s (set LPX_TRACE=1 or LPX_TRACE=trace.json)\n", lpx_trace_enabled() ? "on" : "off");
    return 0;
}
