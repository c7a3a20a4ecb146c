/* lpx-simdev.so's entry point: the backend (memory services for
 * LPX_DEVICE_SIM), a fallback that runs every op there, the CPU backend's
 * view kernels adopted for its key, and comm backend "sim". Everything
 * goes through the host table or the public registries, like any
 * third-party backend plugin (docs/ARCHITECTURE.md walks through it). */
#include <stdlib.h>
#include <string.h>
#include "simdev_internal.h"

int sim_ndevices = LPX_SIMDEV_MAX;
bool sim_check = true;
sim_counters sim_count;

LPX_PLUGIN_EXPORT void lpx_simdev_get_stats(lpx_simdev_stats *out)
{
    if (!out) return;
    out->allocs = atomic_load(&sim_count.allocs);
    out->frees = atomic_load(&sim_count.frees);
    out->live_bytes = atomic_load(&sim_count.live_bytes);
    out->h2d = atomic_load(&sim_count.h2d);
    out->d2h = atomic_load(&sim_count.d2h);
    out->d2d = atomic_load(&sim_count.d2d);
    out->h2d_bytes = atomic_load(&sim_count.h2d_bytes);
    out->d2h_bytes = atomic_load(&sim_count.d2h_bytes);
    out->d2d_bytes = atomic_load(&sim_count.d2d_bytes);
    out->kernels = atomic_load(&sim_count.kernels);
    out->collectives = atomic_load(&sim_count.collectives);
}

LPX_PLUGIN_EXPORT int lpx_simdev_owns(const void *p) { return sim_owner(p, 0); }

LPX_PLUGIN_EXPORT size_t lpx_simdev_pending(int dev) { return sim_pending(dev); }

/* views only build the geometry the dispatcher computed (spec families
 * `view`, `cat`); their copies dispatch copy_ on the device */
static lpx_status adopt_views(const lpx_host *h, int key)
{
    static const lpx_op ops[] = {
        LPX_OP_view, LPX_OP_reshape, LPX_OP_transpose, LPX_OP_t, LPX_OP_permute, LPX_OP_slice,
        LPX_OP_narrow, LPX_OP_expand, LPX_OP_contiguous, LPX_OP_cat, LPX_OP_clone, LPX_OP_detach,
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        lpx_kernel_fn fn;
        void *data;
        lpx_status st = lpx_kernel_lookup(ops[i], LPX_KEY_CPU, &fn, &data);
        if (st || (st = h->kernel_register(h, ops[i], key, fn, data))) return st;
    }
    return LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "simdev";
    info->version = "0.1.0";
    info->description = "a simulated device (sim:0..N-1, host memory only its backend touches) and comm 'sim' "
                        "under NCCL's rules: device paths tested without a GPU";
    if (host->abi_major != LPX_PLUGIN_ABI_MAJOR)
        return lpx_error(LPX_EABI, "simdev: host speaks plugin ABI %u, built for %u", host->abi_major,
                         LPX_PLUGIN_ABI_MAJOR);
    const char *n = getenv("LPX_SIMDEV_DEVICES"), *chk = getenv("LPX_SIMDEV_CHECK"), *dfr = getenv("LPX_SIMDEV_DEFER");
    if (n && *n) {
        char *end = NULL;
        long v = strtol(n, &end, 10);
        if (*end || v < 1 || v > LPX_SIMDEV_MAX)
            return lpx_error(LPX_EINVAL, "simdev: LPX_SIMDEV_DEVICES='%s' (1..%d)", n, LPX_SIMDEV_MAX);
        sim_ndevices = (int)v;
    }
    sim_check = !(chk && !strcmp(chk, "0"));
    sim_defer = !(dfr && !strcmp(dfr, "0"));
    static const lpx_backend_i be = {
        .struct_size = sizeof(lpx_backend_i),
        .name = "sim",
        .device_type = LPX_DEVICE_SIM,
        .alloc = sim_alloc,
        .free = sim_free,
        .copy = sim_copy,
        .sync = sim_sync,
    };
    int key = 0;
    lpx_status st = host->backend_register(host, &be, &key);
    if (!st) st = host->fallback_register(host, key, sim_fallback, NULL);
    if (!st) st = adopt_views(host, key);
    /* ABI 1.0's host table has no comm slot: the public registry, last
     * (nothing to roll back after it) */
    if (!st) st = lpx_comm_backend_register(&sim_comm_backend);
    return st;
}
