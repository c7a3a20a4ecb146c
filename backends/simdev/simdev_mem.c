/* Device memory of the simulated device: one mapping per allocation, with
 * no access (PROT_NONE) except while the backend itself copies in or out
 * of it. Host code that reads a device pointer, the bug a first GPU run
 * finds as garbage or a crash, faults here in CI.
 *
 * The registry is an array sorted by address under one mutex: lookups by
 * any interior pointer (the comm is handed raw buffers) bisect it. Opens
 * are counted per allocation, so nested and concurrent opens (two ranks'
 * threads gathering into one receive buffer) keep it readable until the
 * last one closes. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "simdev_internal.h"

typedef struct sim_block {
    uintptr_t base;
    size_t len;      /* bytes asked for */
    size_t maplen;   /* bytes mapped (whole pages, at least one) */
    int dev;
    int opens;
} sim_block;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static sim_block *blocks;
static size_t nblocks, capblocks;

/* index of the last block with base <= p, or -1 */
static long find_le(uintptr_t p)
{
    long lo = 0, hi = (long)nblocks - 1, at = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (blocks[mid].base <= p) {
            at = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return at;
}

/* the block holding [p, p + n) (n 0: p itself), or NULL; under mu */
static sim_block *holding(const void *p, size_t n)
{
    long i = find_le((uintptr_t)p);
    if (i < 0) return NULL;
    sim_block *b = &blocks[i];
    uintptr_t a = (uintptr_t)p;
    if (a >= b->base + b->maplen || (n && a + n > b->base + b->maplen)) return NULL;
    return b;
}

void *sim_alloc(void *self, lpx_device dev, size_t nbytes)
{
    (void)self;
    if (dev.type != LPX_DEVICE_SIM || dev.index < 0 || dev.index >= sim_ndevices) return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t maplen = nbytes ? (nbytes + page - 1) / page * page : page;
    if (maplen < nbytes) return NULL;   /* overflow */
    void *a = mmap(NULL, maplen, sim_check ? PROT_NONE : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return NULL;
    pthread_mutex_lock(&mu);
    if (nblocks == capblocks) {
        size_t c = capblocks ? 2 * capblocks : 256;
        sim_block *nb = realloc(blocks, c * sizeof *nb);
        if (!nb) {
            pthread_mutex_unlock(&mu);
            munmap(a, maplen);
            return NULL;
        }
        blocks = nb;
        capblocks = c;
    }
    long i = find_le((uintptr_t)a) + 1;
    memmove(&blocks[i + 1], &blocks[i], (nblocks - (size_t)i) * sizeof *blocks);
    blocks[i] = (sim_block){(uintptr_t)a, nbytes, maplen, dev.index, 0};
    nblocks++;
    pthread_mutex_unlock(&mu);
    atomic_fetch_add_explicit(&sim_count.allocs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&sim_count.live_bytes, nbytes, memory_order_relaxed);
    return a;
}

void sim_free(void *self, lpx_device dev, void *ptr, size_t nbytes)
{
    (void)self;
    (void)dev;
    (void)nbytes;
    if (!ptr) return;
    pthread_mutex_lock(&mu);
    long i = find_le((uintptr_t)ptr);
    if (i < 0 || blocks[i].base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&mu);
        return;   /* not ours: never unmap what we did not map */
    }
    sim_block b = blocks[i];
    memmove(&blocks[i], &blocks[i + 1], (nblocks - (size_t)i - 1) * sizeof *blocks);
    nblocks--;
    pthread_mutex_unlock(&mu);
    sim_drop_block(b.dev, (void *)b.base, b.maplen);   /* no queued write may land in a freed block */
    munmap((void *)b.base, b.maplen);
    atomic_fetch_add_explicit(&sim_count.frees, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&sim_count.live_bytes, b.len, memory_order_relaxed);
}

int sim_owner(const void *p, size_t n)
{
    if (!p) return -1;
    pthread_mutex_lock(&mu);
    sim_block *b = holding(p, n);
    int dev = b ? b->dev : -1;
    pthread_mutex_unlock(&mu);
    return dev;
}

void sim_open(const void *p, size_t n)
{
    if (!sim_check || !p) return;
    pthread_mutex_lock(&mu);
    sim_block *b = holding(p, n);
    if (b && b->opens++ == 0) (void)mprotect((void *)b->base, b->maplen, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&mu);
}

void sim_close(const void *p, size_t n)
{
    if (!sim_check || !p) return;
    pthread_mutex_lock(&mu);
    sim_block *b = holding(p, n);
    if (b && b->opens > 0 && --b->opens == 0) (void)mprotect((void *)b->base, b->maplen, PROT_NONE);
    pthread_mutex_unlock(&mu);
}

lpx_status sim_copy(void *self, void *dst, lpx_device dst_dev, const void *src, lpx_device src_dev, size_t nbytes)
{
    (void)self;
    bool from_dev = src_dev.type == LPX_DEVICE_SIM, to_dev = dst_dev.type == LPX_DEVICE_SIM;
    if (!nbytes) return LPX_OK;
    /* a pointer said to be on a device must be that device's memory */
    if ((from_dev && sim_owner(src, nbytes) != src_dev.index) || (to_dev && sim_owner(dst, nbytes) != dst_dev.index))
        return lpx_error(LPX_EDEVICE, "sim copy: a %s pointer is not memory of sim:%d", from_dev &&
                         sim_owner(src, nbytes) != src_dev.index ? "source" : "destination",
                         from_dev && sim_owner(src, nbytes) != src_dev.index ? src_dev.index : dst_dev.index);
    if (!from_dev && sim_owner(src, nbytes) >= 0)
        return lpx_error(LPX_EDEVICE, "sim copy: the source is said to be host memory but is memory of sim:%d",
                         sim_owner(src, nbytes));
    if (!to_dev && sim_owner(dst, nbytes) >= 0)
        return lpx_error(LPX_EDEVICE, "sim copy: the destination is said to be host memory but is memory of sim:%d",
                         sim_owner(dst, nbytes));
    /* stream order: the devices' queued writes land before the copy */
    if (from_dev) sim_flush(src_dev.index);
    if (to_dev) sim_flush(dst_dev.index);
    if (from_dev) sim_open(src, nbytes);
    if (to_dev) sim_open(dst, nbytes);
    memmove(dst, src, nbytes);
    if (to_dev) sim_close(dst, nbytes);
    if (from_dev) sim_close(src, nbytes);
    if (from_dev && to_dev) {
        atomic_fetch_add_explicit(&sim_count.d2d, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&sim_count.d2d_bytes, nbytes, memory_order_relaxed);
    } else if (to_dev) {
        atomic_fetch_add_explicit(&sim_count.h2d, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&sim_count.h2d_bytes, nbytes, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&sim_count.d2h, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&sim_count.d2h_bytes, nbytes, memory_order_relaxed);
    }
    return LPX_OK;
}

lpx_status sim_sync(void *self, lpx_device dev)
{
    (void)self;
    if (dev.type != LPX_DEVICE_SIM || dev.index < 0 || dev.index >= sim_ndevices)
        return lpx_error(LPX_EDEVICE, "sim sync: no device sim:%d", (int)dev.index);
    sim_flush(dev.index);
    return LPX_OK;
}
