/* The cuda backend's memory services: one stream per device, a stream-
 * ordered caching allocator (cudaMallocAsync on a memory pool whose release
 * threshold is "never", so freed blocks are reused without a driver call),
 * its statistics, and host<->device copies. Devices are set up once, at
 * init, so the hot path takes no lock. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_internal.h"

typedef struct cu_dev {
    cudaStream_t stream;
    cudaMemPool_t pool;
    int sm_count;
    int pdl;            /* programmatic dependent launch: compute capability >= 9 and not LPX_CUDA_PDL=0 */
    _Atomic uint64_t allocs, frees, failed, in_use, peak;
} cu_dev;

static cu_dev devs[CU_MAX_DEVICES];
static int ndevs;
int cu_key;

int cu_device_count(void) { return ndevs; }
cudaStream_t cu_stream(int index) { return index >= 0 && index < ndevs ? devs[index].stream : NULL; }
int cu_sm_count(int index) { return index >= 0 && index < ndevs ? devs[index].sm_count : 1; }
int cu_pdl(int index) { return index >= 0 && index < ndevs ? devs[index].pdl : 0; }

lpx_status cu_use(const char *op, lpx_device dev)
{
    if (dev.type != LPX_DEVICE_CUDA || dev.index < 0 || dev.index >= ndevs)
        return lpx_error(LPX_EDEVICE, "%s: device %d:%d is not one of the %d CUDA devices lpx-cuda serves", op,
                         (int)dev.type, (int)dev.index, ndevs);
    CU_CHECK(op, cudaSetDevice(dev.index));
    return LPX_OK;
}

/* Allocation sizes travel with the pointer only through the tensor
 * storage (free gets nbytes back), so the counters need no table. */
static void count_alloc(cu_dev *d, size_t n)
{
    atomic_fetch_add(&d->allocs, 1);
    uint64_t now = atomic_fetch_add(&d->in_use, n) + n;
    uint64_t pk = atomic_load(&d->peak);
    while (now > pk && !atomic_compare_exchange_weak(&d->peak, &pk, now)) {}
}

/* Test hook (lpx_cuda_fail_alloc_after): < 0, never fail; otherwise the
 * number of device allocations that still succeed before every one fails.
 * Off, it costs dev_alloc one relaxed load. */
static _Atomic int64_t fail_countdown = -1;

static bool inject_oom(void)
{
    int64_t c = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (__builtin_expect(c < 0, 1)) return false;
    if (atomic_fetch_sub(&fail_countdown, 1) > 0) return false;
    atomic_store(&fail_countdown, 0); /* stay failing, without wrapping */
    return true;
}

static void *dev_alloc(int index, size_t nbytes)
{
    if (index < 0 || index >= ndevs || cudaSetDevice(index) != cudaSuccess) return NULL;
    cu_dev *d = &devs[index];
    void *p = NULL;
    /* cudaMallocAsync refuses 0 bytes; tensors of 0 elements still want a
     * distinct non-NULL address. An injected failure takes the path of a
     * real cudaErrorMemoryAllocation. */
    bool injected = inject_oom();
    if (injected || cudaMallocFromPoolAsync(&p, nbytes ? nbytes : 1, d->pool, d->stream) != cudaSuccess) {
        if (!injected) (void)cudaGetLastError(); /* clear the sticky-free error state */
        atomic_fetch_add(&d->failed, 1);
        return NULL;
    }
    count_alloc(d, nbytes);
    return p;
}

static void dev_free(int index, void *p, size_t nbytes)
{
    if (!p || index < 0 || index >= ndevs) return;
    cu_dev *d = &devs[index];
    if (cudaSetDevice(index) == cudaSuccess && cudaFreeAsync(p, d->stream) == cudaSuccess) {
        atomic_fetch_add(&d->frees, 1);
        atomic_fetch_sub(&d->in_use, nbytes);
    }
}

void *cu_scratch_alloc(int device, size_t nbytes) { return dev_alloc(device, nbytes); }
void cu_scratch_free(int device, void *p, size_t nbytes) { dev_free(device, p, nbytes); }

static void *be_alloc(void *self, lpx_device dev, size_t nbytes)
{
    (void)self;
    return dev_alloc(dev.index, nbytes);
}

static void be_free(void *self, lpx_device dev, void *ptr, size_t nbytes)
{
    (void)self;
    dev_free(dev.index, ptr, nbytes);
}

static lpx_status be_copy(void *self, void *dst, lpx_device dst_dev, const void *src, lpx_device src_dev,
                          size_t nbytes)
{
    (void)self;
    const char *op = "cuda copy";
    bool to_host = dst_dev.type == LPX_DEVICE_CPU, from_host = src_dev.type == LPX_DEVICE_CPU;
    if (to_host && from_host) {
        memmove(dst, src, nbytes);
        return LPX_OK;
    }
    lpx_device dev = from_host ? dst_dev : src_dev;
    lpx_status st = cu_use(op, dev);
    if (st) return st;
    if (!to_host && !from_host && dst_dev.index != src_dev.index) {
        if ((st = cu_use(op, dst_dev))) return st;
        CU_CHECK(op, cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, cu_stream(dev.index)));
        return LPX_OK;
    }
    enum cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost
                             : from_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
    CU_CHECK(op, cudaMemcpyAsync(dst, src, nbytes, kind, cu_stream(dev.index)));
    /* the host side must hold the bytes when we return (and a host source
     * may be freed right after), so copies touching host memory complete */
    if (to_host || from_host) CU_CHECK(op, cudaStreamSynchronize(cu_stream(dev.index)));
    return LPX_OK;
}

static lpx_status be_sync(void *self, lpx_device dev)
{
    (void)self;
    lpx_status st = cu_use("cuda sync", dev);
    if (st) return st;
    CU_CHECK("cuda sync", cudaStreamSynchronize(cu_stream(dev.index)));
    return LPX_OK;
}

/* Creates the stream and pool of every visible device. */
static lpx_status setup_devices(void)
{
    const char *op = "lpx-cuda init";
    int n = 0;
    CU_CHECK(op, cudaGetDeviceCount(&n));
    if (n > CU_MAX_DEVICES) n = CU_MAX_DEVICES;
    for (int i = 0; i < n; i++) {
        cu_dev *d = &devs[i];
        CU_CHECK(op, cudaSetDevice(i));
        CU_CHECK(op, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
        CU_CHECK(op, cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, i));
        int major = 0;
        CU_CHECK(op, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i));
        const char *pdl = getenv("LPX_CUDA_PDL");
        d->pdl = major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
        CU_CHECK(op, cudaDeviceGetDefaultMemPool(&d->pool, i));
        uint64_t keep = UINT64_MAX; /* cache freed blocks: never release at sync points */
        CU_CHECK(op, cudaMemPoolSetAttribute(d->pool, cudaMemPoolAttrReleaseThreshold, &keep));
        ndevs = i + 1;
    }
    return LPX_OK;
}

/* the backend's pinned host memory slots (lpx_backend_i.host_alloc):
 * lpx_cuda_host_alloc / lpx_cuda_host_free below */
LPX_PLUGIN_EXPORT lpx_status lpx_cuda_host_alloc(size_t nbytes, void **out);
LPX_PLUGIN_EXPORT void lpx_cuda_host_free(void *ptr);
static lpx_status be_host_alloc(void *self, size_t nbytes, void **out)
{
    (void)self;
    return lpx_cuda_host_alloc(nbytes, out);
}

static void be_host_free(void *self, void *ptr)
{
    (void)self;
    lpx_cuda_host_free(ptr);
}

lpx_status cu_register_backend(const lpx_host *h)
{
    lpx_status st = setup_devices();
    if (st) return st;
    static const lpx_backend_i be = {
        .struct_size = sizeof(lpx_backend_i), .name = "cuda", .device_type = LPX_DEVICE_CUDA,
        .alloc = be_alloc, .free = be_free, .copy = be_copy, .sync = be_sync, .self = NULL,
        .host_alloc = be_host_alloc, .host_free = be_host_free,
    };
    return h->backend_register(h, &be, &cu_key);
}

/* ---- exported extras (include/lpx/cuda.h) --------------------------- */

LPX_PLUGIN_EXPORT int lpx_cuda_device_count(void) { return ndevs; }

LPX_PLUGIN_EXPORT void *lpx_cuda_stream(int device) { return (void *)cu_stream(device); }

LPX_PLUGIN_EXPORT lpx_status lpx_cuda_sync(int device)
{
    if (device < 0 || device >= ndevs)
        return lpx_error(LPX_EINVAL, "lpx_cuda_sync: device %d out of range 0..%d", device, ndevs - 1);
    return be_sync(NULL, lpx_cuda_device(device));
}

LPX_PLUGIN_EXPORT lpx_status lpx_cuda_stream_wait(int device, void *stream)
{
    if (device < 0 || device >= ndevs)
        return lpx_error(LPX_EINVAL, "lpx_cuda_stream_wait: device %d out of range 0..%d", device, ndevs - 1);
    cudaStream_t lpx_s = cu_stream(device);
    /* DLPack's stream numbers: 1 the legacy default stream, 2 the
     * per-thread one; 0 (ambiguous there) is taken as the legacy one */
    cudaStream_t other = stream == NULL ? cudaStreamLegacy : (cudaStream_t)stream;
    if (other == lpx_s) return LPX_OK;
    const char *op = "lpx_cuda_stream_wait";
    int prev = 0;
    CU_CHECK(op, cudaGetDevice(&prev));
    CU_CHECK(op, cudaSetDevice(device));
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, lpx_s);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(other, ev, 0);
    if (ev) (void)cudaEventDestroy(ev);  /* released once the wait is done */
    (void)cudaSetDevice(prev);
    if (e != cudaSuccess)
        return lpx_error(LPX_EDEVICE, "lpx_cuda_stream_wait: device %d, stream %p: %s", device, stream,
                         cudaGetErrorString(e));
    return LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_cuda_get_mem_stats(int device, lpx_cuda_mem_stats *out)
{
    if (!out || out->struct_size < offsetof(lpx_cuda_mem_stats, bytes_reserved))
        return lpx_error(LPX_EINVAL, "lpx_cuda_get_mem_stats: %s", out ? "struct_size too small" : "out is NULL");
    if (device < 0 || device >= ndevs)
        return lpx_error(LPX_EINVAL, "lpx_cuda_get_mem_stats: device %d out of range 0..%d", device, ndevs - 1);
    cu_dev *d = &devs[device];
    lpx_cuda_mem_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = out->struct_size < sizeof s ? out->struct_size : sizeof s;
    s.allocs = atomic_load(&d->allocs);
    s.frees = atomic_load(&d->frees);
    s.failed_allocs = atomic_load(&d->failed);
    s.bytes_in_use = atomic_load(&d->in_use);
    s.peak_bytes_in_use = atomic_load(&d->peak);
    uint64_t reserved = 0;
    if (cudaMemPoolGetAttribute(d->pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess)
        s.bytes_reserved = reserved;
    memcpy(out, &s, s.struct_size);
    return LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_cuda_mem_reset_peak(int device)
{
    if (device < 0 || device >= ndevs)
        return lpx_error(LPX_EINVAL, "lpx_cuda_mem_reset_peak: device %d out of range 0..%d", device, ndevs - 1);
    atomic_store(&devs[device].peak, atomic_load(&devs[device].in_use));
    return LPX_OK;
}

LPX_PLUGIN_EXPORT void lpx_cuda_fail_alloc_after(int64_t n) { atomic_store(&fail_countdown, n < 0 ? -1 : n); }

LPX_PLUGIN_EXPORT lpx_status lpx_cuda_host_alloc(size_t nbytes, void **out)
{
    const char *op = "lpx_cuda_host_alloc";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cu_fail(e, op, "cudaHostAlloc");
    }
    *out = p;
    return LPX_OK;
}

LPX_PLUGIN_EXPORT void lpx_cuda_host_free(void *ptr)
{
    if (ptr) (void)cudaFreeHost(ptr);
}

LPX_PLUGIN_EXPORT lpx_status lpx_cuda_mem_trim(int device)
{
    const char *op = "lpx_cuda_mem_trim";
    if (device < 0 || device >= ndevs)
        return lpx_error(LPX_EINVAL, "%s: device %d out of range 0..%d", op, device, ndevs - 1);
    CU_CHECK(op, cudaSetDevice(device));
    CU_CHECK(op, cudaStreamSynchronize(devs[device].stream));
    CU_CHECK(op, cudaMemPoolTrimTo(devs[device].pool, 0));
    return LPX_OK;
}
