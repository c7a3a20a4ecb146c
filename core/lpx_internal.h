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
    bool readonly;           /* in-place writes refused (e.g. a read-only DLPack import) */
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
lpx_status lpx_local_backend_init(void);    /* the "local" comm backend (backends/local) */
lpx_status lpx_builtin_kinds_init(void);
void lpx_trace_init_from_env(void);
extern atomic_bool lpx__trace_on;

/* ---- registration journal (core/journal.c, rolled back by plugins/rollback.c). While a plugin's init runs,
 * its thread has an open journal; every registration function calls
 * lpx__journal_reserve before it changes anything (so the note after it
 * cannot fail) and lpx__journal_note once it succeeded. Both are no-ops on
 * threads without a journal. A failed load replays the journal backwards
 * through the unregister functions below. */
typedef enum lpx_reg_what {
    LPX_REG_DTYPE, LPX_REG_OP, LPX_REG_KIND, LPX_REG_KERNEL, LPX_REG_FALLBACK, LPX_REG_BACKEND,
    LPX_REG_COMM_BACKEND          /* a comm backend (comm/comm_registry.c) */
} lpx_reg_what;
lpx_status lpx__journal_reserve(const char *what);
void lpx__journal_note(lpx_reg_what what, int a, int b, const void *p);

/* Undo one registration (rollback of a failed plugin load; not public:
 * see include/lpx/plugin.h for why plugins are never unloaded). */
lpx_status lpx__dtype_unregister(lpx_dtype d);          /* core/dtype.c */
/* A tensor is being made of dtype d: a rollback will not hand d out again
 * (core/dtype.c; the tensor constructors call it for plugin dtypes). */
void lpx__dtype_mark_used(lpx_dtype d);
lpx_status lpx__op_unregister(lpx_op op);               /* dispatch/registry.c */
/* comm backend at table index `index`: retired (its entry stays valid for
 * pointers handed out, and its name is free again) */
void lpx__comm_backend_unregister(int index);
lpx_status lpx__backend_unregister(int key);            /* core/backends.c: the last one only */
void lpx__key_retire(int key);  /* dispatch/registry.c: every kernel and the fallback at key */
lpx_status lpx__kind_unregister_force(const lpx_kind *k); /* even with live tensors */

/* LPX_PLUGIN_PATH scan, run once by lpx_init (plugins/loader.c) */
void lpx_plugins_init_from_env(void);

#endif
