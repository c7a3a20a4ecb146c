/* The simulated device's stream: one per device, in order. An op's
 * arithmetic runs at once on host copies, but what it writes into device
 * memory (the arguments it changed) is queued on the device's stream and
 * lands at the next point that orders the stream: any later use of that
 * device (an op, a copy, a collective, a free) or a sync. Code that reads
 * device memory behind the backend's back between an op and a sync sees
 * the old bytes (with LPX_SIMDEV_CHECK=0; with checking on it faults), as
 * it would see them on a GPU whose kernel has not run yet.
 * LPX_SIMDEV_DEFER=0 writes at once. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "simdev_internal.h"

bool sim_defer = true;

typedef struct pending {
    void *dst;
    void *bytes;   /* owned */
    size_t n;
} pending;

typedef struct stream {
    pending *q;
    size_t n, cap;
} stream;

/* one lock for the queues (a flush is a few memcpys; devices are few) */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static stream streams[LPX_SIMDEV_MAX];

static void write_now(void *dst, const void *src, size_t n)
{
    sim_open(dst, n);
    memcpy(dst, src, n);
    sim_close(dst, n);
}

lpx_status sim_enqueue_write(int dev, void *dst, const void *src, size_t n)
{
    if (!n) return LPX_OK;
    if (!sim_defer || dev < 0 || dev >= LPX_SIMDEV_MAX) {
        write_now(dst, src, n);
        return LPX_OK;
    }
    void *copy = malloc(n);
    if (!copy) return lpx_error(LPX_ENOMEM, "sim:%d: out of host memory for a %zu-byte queued write", dev, n);
    memcpy(copy, src, n);
    stream *s = &streams[dev];
    pthread_mutex_lock(&mu);
    if (s->n == s->cap) {
        size_t c = s->cap ? 2 * s->cap : 64;
        pending *nq = realloc(s->q, c * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&mu);
            free(copy);
            return lpx_error(LPX_ENOMEM, "sim:%d: out of host memory for the stream", dev);
        }
        s->q = nq;
        s->cap = c;
    }
    s->q[s->n++] = (pending){dst, copy, n};
    pthread_mutex_unlock(&mu);
    return LPX_OK;
}

void sim_flush(int dev)
{
    if (dev < 0 || dev >= LPX_SIMDEV_MAX) return;
    stream *s = &streams[dev];
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < s->n; i++) {
        write_now(s->q[i].dst, s->q[i].bytes, s->q[i].n);
        free(s->q[i].bytes);
    }
    s->n = 0;
    pthread_mutex_unlock(&mu);
}

size_t sim_pending(int dev)
{
    if (dev < 0 || dev >= LPX_SIMDEV_MAX) return 0;
    stream *s = &streams[dev];
    pthread_mutex_lock(&mu);
    size_t n = s->n;
    pthread_mutex_unlock(&mu);
    return n;
}

void sim_drop_block(int dev, const void *base, size_t len)
{
    if (dev < 0 || dev >= LPX_SIMDEV_MAX) return;
    stream *s = &streams[dev];
    uintptr_t lo = (uintptr_t)base, hi = lo + len;
    pthread_mutex_lock(&mu);
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        uintptr_t d = (uintptr_t)s->q[i].dst;
        if (d >= lo && d < hi) free(s->q[i].bytes);   /* into memory being freed: nobody can read it */
        else s->q[k++] = s->q[i];
    }
    s->n = k;
    pthread_mutex_unlock(&mu);
}
