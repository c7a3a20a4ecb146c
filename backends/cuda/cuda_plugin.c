/* lpx-cuda.so: the CUDA backend plugin. The probe declines when no CUDA
 * device (or driver) is there, so CI machines skip it cleanly; init
 * registers the "cuda" backend (memory, streams) and every kernel group. */
#include <stdio.h>
#include "cuda_internal.h"
#include "cuda_sdpa.h"

LPX_PLUGIN_EXPORT int lpx_plugin_probe(const lpx_host *host, char *reason, size_t len)
{
    (void)host;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(reason, len, "no usable CUDA driver or device (cudaGetDeviceCount: %s)", cudaGetErrorName(e));
        (void)cudaGetLastError();
        return 1;
    }
    if (n == 0) {
        snprintf(reason, len, "no CUDA device");
        return 1;
    }
    return 0;
}

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    /* the only environment write of lpx-cuda, here while no lpx op runs
     * (the cuDNN frontend reads it later, on any thread) */
    cu_sdpa_init_env();
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "cuda";
    info->version = "0.1.0";
    info->description = "CUDA backend: caching allocator, casts, fp8/NF4 kernels, cuBLASLt GEMMs";
    lpx_status (*const groups[])(const lpx_host *) = {
        cu_register_backend, cu_register_views, cu_register_creation, cu_register_copy,
        cu_register_elementwise, cu_register_reduce, cu_register_nn, cu_register_gemm,
        cu_register_float8, cu_register_nf4, cu_register_adamw, cu_register_attention,
    };
    for (size_t i = 0; i < sizeof groups / sizeof *groups; i++) {
        lpx_status st = groups[i](host);
        if (st) return st;
    }
    return LPX_OK;
}
