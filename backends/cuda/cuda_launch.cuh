/* Grid sizing for grid-stride kernels, header-only so that lpx-cuda.so's
 * kernels and plugins compiled against its sources (lpx-mx-cuda.so, which
 * cannot call into lpx-cuda) size launches the same way. */
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

#endif
