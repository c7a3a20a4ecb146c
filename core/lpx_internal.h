/* Internal definitions shared by core/, dispatch/ and backends/. Not
 * installed. Kinds and plugins use only the public headers. */
#ifndef LPX_INTERNAL_H
#define LPX_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "lpx/lpx.h"

#define LPX_LIKELY(x) __builtin_expect(!!(x), 1)
#define LPX_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* For broken invariants only: never for user error. */
#define LPX_ASSERT(c) do { if (LPX_UNLIKELY(!(c))) lpx__assert_fail(#c, __FILE__, __LINE__); } while (0)
void lpx__assert_fail(const char *cond, const char *file, int line) __attribute__((noreturn));

/* ---- allocation: every lpx allocation goes through here so tests can
 * fail the Nth allocation (core/alloc.c). */
void *lpx_malloc(size_t n);
void *lpx_calloc(size_t count, size_t size);
void *lpx_realloc(void *p, size_t n);
void lpx_free(void *p);
char *lpx_strdup(const char *s);

/* ---- init */
extern atomic_bool lpx__inited;
static inline lpx_status lpx_ensure_init(void)
{
    if (LPX_LIKELY(atomic_load_explicit(&lpx__inited, memory_order_acquire)))
        return LPX_OK;
    return lpx_init();
}

/* ---- tensors */
typedef struct lpx_storage {
    atomic_int refcount;
    void *data;
    size_t nbytes;
    lpx_device device;
    lpx_deleter deleter;     /* NULL with owned = false: caller keeps it */
    void *deleter_ctx;
    bool owned;              /* allocated by the backend: free through it */
} lpx_storage;

struct lpx_tensor {
    atomic_int refcount;
    int32_t ndim;
    lpx_dtype dtype;
    uint64_t keys;                 /* kind key | backend key, cached */
    const lpx_kind *kind;          /* NULL: dense */
    lpx_device device;
    int64_t numel;
    int64_t offset;                /* elements from storage start (dense) */
    int64_t shape[LPX_MAX_DIMS];
    int64_t strides[LPX_MAX_DIMS];
    lpx_storage *storage;          /* dense only */
    /* kind payload */
    int32_t ninner;
    uint32_t meta_size;
    lpx_tensor *inner[LPX_MAX_INNER];
    _Alignas(16) unsigned char meta[LPX_MAX_META];
};

struct lpx_kind {
    lpx_kind_i vt;             /* copy, zero-extended */
    int key;
    int index;
    atomic_llong live;         /* live tensors of this kind */
    bool registered;
    struct lpx_kind *retired_next; /* unregistered handles stay reachable */
};

/* numel of a shape with overflow check; LPX_ERANGE with message naming op */
lpx_status lpx_shape_numel(const char *op, int ndim, const int64_t *shape, int64_t *numel);
void lpx_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* registry internals */
lpx_status lpx_dtype_init_builtins(void);
lpx_status lpx_ops_init_builtins(void);
lpx_status lpx_cpu_backend_init(void);
lpx_status lpx_builtin_kinds_init(void);
void lpx_trace_init_from_env(void);
extern atomic_bool lpx__trace_on;

#endif
