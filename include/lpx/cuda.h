/* lpx — what the CUDA backend plugin (lpx-cuda.so) offers beyond the
 * registry.
 *
 * Loading lpx-cuda.so (lpx_plugin_load, or LPX_PLUGIN_PATH) registers the
 * "cuda" backend for LPX_DEVICE_CUDA and its kernels; tensors are then made
 * on lpx_cuda_device(i) and moved with lpx_tensor_to. The functions below
 * are exported by the plugin, not by liblpx: fetch them with
 * lpx_plugin_symbol(plugin, LPX_CUDA_SYM_MEM_STATS) and so on (the typedefs
 * give their types), so a host that never loads the plugin never links
 * CUDA. docs/GPU.md has the long form: streams, the allocator, errors. */
#ifndef LPX_CUDA_H
#define LPX_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "tensor.h"

LPX_BEGIN_DECLS

/** The CUDA device `index` as an lpx_device. */
static inline lpx_device lpx_cuda_device(int index)
{
    lpx_device d;
    d.type = LPX_DEVICE_CUDA;
    d.index = index;
    return d;
}

/** Statistics of the plugin's stream-ordered caching allocator on one
 *  device (a cudaMallocAsync memory pool that keeps freed blocks). */
typedef struct lpx_cuda_mem_stats {
    size_t struct_size;          /* set by the caller: sizeof(lpx_cuda_mem_stats) */
    uint64_t allocs;             /* successful allocations */
    uint64_t frees;
    uint64_t failed_allocs;      /* allocations refused (out of memory) */
    uint64_t bytes_in_use;       /* requested bytes of live allocations */
    uint64_t peak_bytes_in_use;  /* since load or the last reset */
    uint64_t bytes_reserved;     /* held by the pool from the driver (cached included) */
} lpx_cuda_mem_stats;

/** Fills *out (up to out->struct_size bytes) for device `device`.
 *  Errors: LPX_EINVAL (NULL, struct_size too small, bad device). */
typedef lpx_status (*lpx_cuda_mem_stats_fn)(int device, lpx_cuda_mem_stats *out);
/** Resets the peak to the current use. Errors: LPX_EINVAL (bad device). */
typedef lpx_status (*lpx_cuda_mem_reset_peak_fn)(int device);
/** Returns the pool's cached, unused blocks to the driver. Errors:
 *  LPX_EINVAL (bad device), LPX_EDEVICE (the CUDA call failed). */
typedef lpx_status (*lpx_cuda_mem_trim_fn)(int device);
/** The cudaStream_t (as void *) that orders all of the plugin's work on
 *  `device`; NULL for a bad device. A host that launches its own work on
 *  lpx tensors orders it after lpx's with an event on this stream. */
typedef void *(*lpx_cuda_stream_fn)(int device);
/** Waits until all work the plugin queued on `device` is done. Errors:
 *  LPX_EINVAL (bad device), LPX_EDEVICE (a kernel failed: the CUDA error
 *  is named). */
typedef lpx_status (*lpx_cuda_sync_fn)(int device);
/** Makes `stream` (a cudaStream_t as void *; NULL or 1: the legacy
 *  default stream, 2: the per-thread one, as DLPack numbers them) wait for
 *  all work the plugin has queued on `device` so far, through an event: no
 *  host wait. What a DLPack export to a consumer on another stream needs.
 *  Errors: LPX_EINVAL (bad device), LPX_EDEVICE (a CUDA error, named). */
typedef lpx_status (*lpx_cuda_stream_wait_fn)(int device, void *stream);
/** Number of CUDA devices the plugin serves. */
typedef int (*lpx_cuda_device_count_fn)(void);
/** Page-locked (pinned) host memory of nbytes (0 gives a 1-byte block),
 *  usable by copies to and from every device (cudaHostAlloc, portable):
 *  host<->device copies from it run at full DMA speed. Slow to allocate:
 *  keep and reuse it (the sharding engine's offload staging does). Errors:
 *  LPX_EINVAL (out NULL), LPX_ENOMEM (no pinned memory left), LPX_EDEVICE. */
typedef lpx_status (*lpx_cuda_host_alloc_fn)(size_t nbytes, void **out);
/** Frees memory from lpx_cuda_host_alloc (NULL is ignored); waits for
 *  nothing: the caller's copies from it have completed. */
typedef void (*lpx_cuda_host_free_fn)(void *ptr);
/** Test hook, not for production use: after n more successful device
 *  allocations of the plugin's allocator (tensor storage and the kernels'
 *  device scratch, on every device), every allocation fails as if the
 *  device were out of memory (failed_allocs counts it; the entry point
 *  returns LPX_ENOMEM) until the hook is called again; n < 0 turns it off.
 *  n = 0 fails the next allocation. Process-wide; the device OOM sweep of
 *  the GPU suite (tests/gpu/test_cuda_oom.c) drives it. Pinned host memory
 *  (lpx_cuda_host_alloc) and the plugin's init-time buffers are not
 *  affected. */
typedef void (*lpx_cuda_fail_alloc_after_fn)(int64_t n);
/** The path attention and attention_backward take in this process, in
 *  words, into buf (NUL-terminated, truncated to n): cuDNN's fused SDPA
 *  with its version and the file loaded, or the reference kernel and why
 *  (libcudnn.so.9 not found, with every place looked at;
 *  LPX_CUDA_ATTENTION=reference). 2048 bytes hold it. Returns how many calls ran on cuDNN so
 *  far (capped at 1000000; 0 when none did). Opens libcudnn if that was
 *  not tried yet. */
typedef int (*lpx_cuda_attention_path_fn)(char *buf, size_t n);
/** The path fp8_mm_block takes in this process, in words, into buf:
 *  cuBLASLt's block scaling (Hopper, cuBLASLt 12.9+; each kind of call
 *  checked once against exact arithmetic) or lpx's reference kernel, and
 *  why. Returns how many (device, block kinds, output dtype) combinations
 *  passed their check and run on cuBLASLt (0 before the first call). */
typedef int (*lpx_cuda_block_gemm_path_fn)(char *buf, size_t n);

#define LPX_CUDA_SYM_MEM_STATS "lpx_cuda_get_mem_stats"
#define LPX_CUDA_SYM_MEM_RESET_PEAK "lpx_cuda_mem_reset_peak"
#define LPX_CUDA_SYM_MEM_TRIM "lpx_cuda_mem_trim"
#define LPX_CUDA_SYM_STREAM "lpx_cuda_stream"
#define LPX_CUDA_SYM_SYNC "lpx_cuda_sync"
#define LPX_CUDA_SYM_STREAM_WAIT "lpx_cuda_stream_wait"
#define LPX_CUDA_SYM_DEVICE_COUNT "lpx_cuda_device_count"
#define LPX_CUDA_SYM_HOST_ALLOC "lpx_cuda_host_alloc"
#define LPX_CUDA_SYM_HOST_FREE "lpx_cuda_host_free"
#define LPX_CUDA_SYM_FAIL_ALLOC_AFTER "lpx_cuda_fail_alloc_after"
#define LPX_CUDA_SYM_ATTENTION_PATH "lpx_cuda_attention_path"
#define LPX_CUDA_SYM_BLOCK_GEMM_PATH "lpx_cuda_block_gemm_path"

LPX_END_DECLS

#endif
