/* For authors of CUDA kernel plugins (CUDA C++ only; not part of the C
 * API, so lpx/lpx.h does not include it): grid sizing for grid-stride
 * kernels and programmatic dependent launch, header-only so that
 * lpx-cuda.so's kernels and a plugin's own (lpx-mx-cuda.so, which cannot
 * call into lpx-cuda) size and launch the same way. */
#ifndef LPX_CUDA_LAUNCH_CUH
#define LPX_CUDA_LAUNCH_CUH

#include <atomic>
#include <stdint.h>
#include <cuda_runtime_api.h>

/* One wave of kernel K: the blocks of 256 threads it keeps resident on
 * `sms` multiprocessors (occupancy queried once per kernel), at most
 * `want`, at least 1. Grid-stride kernels sized to one wave never leave a
 * partial second wave idle. */
template <auto K> unsigned cu_grid_wave(int sms, int64_t want)
{
    static std::atomic<int> per_sm{0};
    int p = per_sm.load(std::memory_order_relaxed);
    if (p == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p, K, 256, 0) != cudaSuccess || p < 1) {
            (void)cudaGetLastError();
            p = 1;
        }
        per_sm.store(p, std::memory_order_relaxed);
    }
    int64_t cap = (int64_t)(sms < 1 ? 1 : sms) * p;
    if (want > cap) want = cap;
    return (unsigned)(want < 1 ? 1 : want);
}

/* ---- programmatic dependent launch (sm_90+) --------------------------
 * Back-to-back memory-bound kernels lose a few microseconds each to launch
 * latency plus the ramp and drain of the grid: a 64 us NF4 dequantize
 * spends ~8% of its time there. A kernel launched by cu_launch with pdl set
 * may be scheduled while the kernel before it on the stream still runs; it
 * must then call cu_pdl_wait() before its first access to global memory
 * (griddepcontrol.wait returns once every prerequisite grid has completed
 * and its writes are visible, so stream order holds for data). Kernels that
 * support it call cu_pdl_trigger() early, letting the next such kernel's
 * blocks be scheduled as SMs free up. Both are no-ops before sm_90 and for
 * kernels launched without the attribute. */
__device__ __forceinline__ void cu_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void cu_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launches k<<<grid, block, 0, st>>>(args...), with programmatic stream
 * serialization when pdl is set (the kernel must call cu_pdl_wait first).
 * Returns the launch's error. */
template <typename... P, typename... A>
cudaError_t cu_launch(void (*k)(P...), unsigned grid, unsigned block, cudaStream_t st, bool pdl, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = st;
    if (pdl) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, k, args...);
}

#endif
