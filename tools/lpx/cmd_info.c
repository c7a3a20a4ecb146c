/* `lpx info`: what this build of lpx knows. */
#include <stdio.h>
#include <string.h>
#include "lpx/lpx.h"
#include "lpx/cuda.h"
#include "commands.h"

/* Loaded plugins with what they registered, then the ones skipped (by
 * lpx_plugin_load or the LPX_PLUGIN_PATH scan) with the reason. */
static void print_plugins(void)
{
    int n = lpx_plugin_count(), ns = lpx_plugin_skipped_count();
    if (n == 0 && ns == 0) {
        printf("plugins: none loaded (LPX_PLUGIN_PATH: colon-separated directories of lpx-*.so)\n");
        return;
    }
    printf("plugins (%d loaded, %d skipped):\n", n, ns);
    for (int i = 0; i < n; i++) {
        const lpx_plugin *p = lpx_plugin_at(i);
        int nd, nops, nk, nkern, nfb, nbe;
        lpx_plugin_registered(p, &nd, &nops, &nk, &nkern, &nfb, &nbe);
        printf("  %s %s (%s): %d dtypes, %d ops, %d kinds, %d kernels, %d fallbacks, %d backends%s%s\n",
               lpx_plugin_name(p), lpx_plugin_version(p), lpx_plugin_path(p), nd, nops, nk, nkern, nfb, nbe,
               lpx_plugin_description(p)[0] ? " - " : "", lpx_plugin_description(p));
    }
    for (int i = 0; i < ns; i++)
        printf("  skipped %s: %s\n", lpx_plugin_skipped_path(i), lpx_plugin_skipped_reason(i));
}

/* lpx-cuda's words on one of its paths (lpx_cuda_attention_path,
 * lpx_cuda_block_gemm_path: both fill buf) into buf; false without the
 * plugin or the export */
static bool cuda_path(const char *sym_name, char *buf, size_t n)
{
    lpx_cuda_attention_path_fn f = NULL;   /* the two exports share this type */
    void *sym = lpx_tool_plugin_fn("cuda", sym_name);
    memcpy(&f, &sym, sizeof sym);
    if (!f) return false;
    f(buf, n);
    return true;
}

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
    /* the block-scaled fp8 GEMM: which backends run it, and how */
    printf("blockwise fp8 GEMM (fp8_mm_block):");
    for (int i = 0; i < lpx_backend_count(); i++) {
        const lpx_backend_i *b = lpx_backend_at(i);
        if (!lpx_kernel_exists(LPX_OP_fp8_mm_block, lpx_device_key(b->device_type))) continue;
        char path[320] = "lpx reference kernel";
        if (b->device_type != LPX_DEVICE_CPU) (void)cuda_path(LPX_CUDA_SYM_BLOCK_GEMM_PATH, path, sizeof path);
        printf(" %s (%s)", b->name,
               b->device_type == LPX_DEVICE_CPU ? "reference: sgemm per 128-K block, f32 promotion" : path);
    }
    printf("\n");
    /* attention on the GPU: cuDNN's fused SDPA or the reference kernel */
    char buf[2048];   /* the cuDNN file, or every place looked at */
    if (cuda_path(LPX_CUDA_SYM_ATTENTION_PATH, buf, sizeof buf)) printf("attention (cuda): %s\n", buf);
    print_plugins();
    printf("tracing: %s (set LPX_TRACE=1 or LPX_TRACE=trace.json)\n", lpx_trace_enabled() ? "on" : "off");
    return 0;
}
