/* Broken plugin: init registers a dtype, an op, a kind, kernels (boxed and
 * typed), a fallback and a comm backend, one dtype and the comm backend
 * directly through the public functions rather than the host table, then
 * fails. The loader must undo all of it. */
#include "lpx/lpx.h"

static void dec(const void *src, float *dst, size_t n)
{
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = s[i];
}
static void enc(const float *src, void *dst, size_t n, unsigned f)
{
    unsigned char *d = dst;
    (void)f;
    for (size_t i = 0; i < n; i++) d[i] = (unsigned char)src[i];
}
static lpx_status boxed(lpx_call *c) { (void)c; return LPX_OK; }

/* A plugin that keeps the host pointer and registers after its init: the
 * test calls this (found with dlsym) and expects LPX_EPLUGIN. */
static const lpx_host *stashed;
LPX_PLUGIN_EXPORT lpx_status test_half_late_register(void);
lpx_status test_half_late_register(void)
{
    lpx_dtype_traits t = {.struct_size = sizeof t, .name = "half_late", .bits = 8, .block = 1,
                          .to_f32 = dec, .from_f32 = enc};
    lpx_dtype d;
    return stashed->dtype_register(stashed, &t, &d);
}
static lpx_status typed(lpx_tensor *x, lpx_tensor **out) { (void)x; *out = NULL; return LPX_OK; }
static lpx_status comm_run(const lpx_comm_backend_i *b, int n, int64_t t, lpx_comm_rank_fn fn, void *ctx,
                           lpx_status *sts)
{
    (void)b, (void)n, (void)t, (void)fn, (void)ctx, (void)sts;
    return LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "test-half";
    info->version = "0.0.1";
    stashed = host;
    lpx_dtype_traits t = {.struct_size = sizeof t, .name = "half_dt", .bits = 8, .block = 1,
                          .to_f32 = dec, .from_f32 = enc};
    lpx_dtype_traits t2 = t;
    t2.name = "half_dt_direct";
    lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = "half_kind",
                     .priority = LPX_PRIORITY_PAYLOAD};
    lpx_dtype d, d2;
    lpx_op op;
    const lpx_kind *k;
    lpx_status st;
    if ((st = host->dtype_register(host, &t, &d))) return st;
    if ((st = lpx_dtype_register(&t2, &d2))) return st;   /* bypasses the host: still journaled */
    if ((st = host->op_register(host, "half_op(Tensor x) -> Tensor", &op))) return st;
    if ((st = host->kind_register(host, &vt, &k))) return st;
    if ((st = host->kernel_register(host, op, lpx_kind_key(k), boxed, NULL))) return st;
    if ((st = host->kernel_register(host, LPX_OP_neg, lpx_kind_key(k), boxed, NULL))) return st;
    if ((st = host->kernel_register_typed(host, op, LPX_KEY_CPU, "Tensor -> Tensor", (void (*)(void))typed))) return st;
    if ((st = host->fallback_register(host, lpx_kind_key(k), boxed, NULL))) return st;
    lpx_comm_backend_i cb = {.struct_size = sizeof cb, .name = "half_comm", .description = "rolled back",
                             .run = comm_run};
    if ((st = lpx_comm_backend_register(&cb))) return st;   /* public function: journaled too */
    return lpx_error(LPX_EINTERNAL, "test-half: simulated failure after registering dtypes, an op, a kind, "
                                    "kernels, a fallback and a comm backend");
}
