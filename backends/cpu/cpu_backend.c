/* The CPU backend: host memory services and registration of every CPU
 * kernel group. */
#include <stdlib.h>
#include <string.h>
#include "cpu_internal.h"

static void *cpu_alloc(void *self, lpx_device dev, size_t nbytes)
{
    (void)self; (void)dev;
    return lpx_malloc(nbytes);
}

static void cpu_free(void *self, lpx_device dev, void *ptr, size_t nbytes)
{
    (void)self; (void)dev; (void)nbytes;
    lpx_free(ptr);
}

static lpx_status cpu_copy(void *self, void *dst, lpx_device dst_dev, const void *src,
                           lpx_device src_dev, size_t nbytes)
{
    (void)self;
    if (dst_dev.type != LPX_DEVICE_CPU || src_dev.type != LPX_DEVICE_CPU)
        return lpx_error(LPX_EDEVICE, "cpu copy: both sides must be CPU memory (got %d -> %d)",
                         (int)src_dev.type, (int)dst_dev.type);
    if (nbytes) memmove(dst, src, nbytes);
    return LPX_OK;
}

static lpx_status cpu_sync(void *self, lpx_device dev) { (void)self; (void)dev; return LPX_OK; }

lpx_status lpx_cpu_backend_init(void)
{
    static const lpx_backend_i cpu = {
        .struct_size = sizeof(lpx_backend_i), .name = "cpu", .device_type = LPX_DEVICE_CPU,
        .alloc = cpu_alloc, .free = cpu_free, .copy = cpu_copy, .sync = cpu_sync, .self = NULL,
    };
    int key;
    lpx_status st = lpx_backend_register(&cpu, &key);
    if (st) return st;
    LPX_ASSERT(key == LPX_KEY_CPU);
    if ((st = lpx_cpu_register_creation())) return st;
    if ((st = lpx_cpu_register_views())) return st;
    if ((st = lpx_cpu_register_elementwise())) return st;
    if ((st = lpx_cpu_register_reduce())) return st;
    if ((st = lpx_cpu_register_linalg())) return st;
    if ((st = lpx_cpu_register_nn())) return st;
    if ((st = lpx_cpu_register_float8()) || (st = lpx_cpu_register_float8_transpose())) return st;
    if ((st = lpx_cpu_register_nf4())) return st;
    if ((st = lpx_cpu_register_optim())) return st;
    if ((st = lpx_cpu_register_rope())) return st;
    if ((st = lpx_cpu_register_attention())) return st;
    return LPX_OK;
}
