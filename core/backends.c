/* The backend table: the memory services of each device type and the
 * dispatch key bit it is served by (cpu 1, then 2..15 in registration
 * order). Core owns it because tensors allocate, free and copy through it
 * (core/tensor.c) below dispatch; dispatch reads the key bits. Writers take
 * a mutex; readers load atomics published with release semantics. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "journal.h"

static pthread_mutex_t backends_mutex = PTHREAD_MUTEX_INITIALIZER;
static lpx_backend_i backends[LPX_KEY_BACKEND_LAST];
static atomic_int nbackends;
static _Atomic int device_keys[64];     /* device type -> key bit */

lpx_status lpx_backend_register(const lpx_backend_i *b, int *key)
{
    if (!b || !b->name || !b->alloc || !b->free || !b->copy)
        return lpx_error(LPX_EINVAL, "lpx_backend_register: %s", !b ? "vtable is NULL" : "name, alloc, free and copy are required");
    if (b->device_type <= 0 || b->device_type >= 64)
        return lpx_error(LPX_EINVAL, "lpx_backend_register(%s): device type %d out of range 1..63", b->name, (int)b->device_type);
    if (b->struct_size >= offsetof(lpx_backend_i, host_free) + sizeof b->host_free && !b->host_alloc != !b->host_free)
        return lpx_error(LPX_EINVAL, "lpx_backend_register(%s): host_alloc and host_free come together", b->name);
    lpx_status st = lpx__journal_reserve("lpx_backend_register");
    if (st) return st;
    int k = 0;
    pthread_mutex_lock(&backends_mutex);
    int n = atomic_load(&nbackends);
    for (int i = 0; i < n && !st; i++)
        if (!strcmp(backends[i].name, b->name) || backends[i].device_type == b->device_type)
            st = lpx_error(LPX_EEXIST, "lpx_backend_register(%s): name or device type %d already served by '%s'",
                           b->name, (int)b->device_type, backends[i].name);
    if (!st && n >= LPX_KEY_BACKEND_LAST)
        st = lpx_error(LPX_EFULL, "lpx_backend_register(%s): no free backend key", b->name);
    if (!st) {
        k = LPX_KEY_CPU + n;   /* the CPU backend registers first: key 1 */
        memset(&backends[n], 0, sizeof backends[n]);
        memcpy(&backends[n], b, b->struct_size < sizeof *b ? b->struct_size : sizeof *b);
        atomic_store_explicit(&device_keys[b->device_type], k, memory_order_release);
        atomic_store_explicit(&nbackends, n + 1, memory_order_release);
        if (key) *key = k;
    }
    pthread_mutex_unlock(&backends_mutex);
    if (!st) lpx__journal_note(LPX_REG_BACKEND, k, 0, NULL);
    return st;
}

/* Rollback only, and only of the most recent backend (keys are handed out
 * in order); the rollback retired its kernels first (lpx__key_retire).
 * The table entry's memory is static, so a reader holding it still reads
 * valid fields. */
lpx_status lpx__backend_unregister(int key)
{
    pthread_mutex_lock(&backends_mutex);
    int n = atomic_load(&nbackends);
    if (n <= 1 || key != LPX_KEY_CPU + n - 1) {
        pthread_mutex_unlock(&backends_mutex);
        return lpx_error(LPX_EINVAL, "lpx__backend_unregister: key %d is not the last registered backend", key);
    }
    atomic_store_explicit(&device_keys[backends[n - 1].device_type], 0, memory_order_release);
    atomic_store_explicit(&nbackends, n - 1, memory_order_release);
    pthread_mutex_unlock(&backends_mutex);
    return LPX_OK;
}

const lpx_backend_i *lpx_backend_for(int32_t device_type)
{
    int k = lpx_device_key(device_type);
    return k > 0 ? &backends[k - LPX_KEY_CPU] : NULL;
}

int lpx_device_key(int32_t device_type)
{
    if (device_type <= 0 || device_type >= 64) return 0;
    return atomic_load_explicit(&device_keys[device_type], memory_order_acquire);
}

int lpx_backend_count(void) { lpx_ensure_init(); return atomic_load(&nbackends); }

const lpx_backend_i *lpx_backend_at(int i)
{
    return i >= 0 && i < atomic_load(&nbackends) ? &backends[i] : NULL;
}

