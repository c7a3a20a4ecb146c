/* lpx — the dispatch core.
 *
 * Ops have dense small integer ids. Kernels are registered per (op, key);
 * a key is one bit of a 64-bit key set. Backends own the low bits, kinds the
 * high bits, so "highest set bit of the call's key set" is the priority
 * order: distributed kinds > wrapper kinds > payload kinds > backends.
 * Lookup is table[op][key]: no hashing, no locks, no allocation.
 *
 * Kernels are boxed: lpx_status fn(lpx_call *c). A call carries 16-byte
 * tagged values. Results are written to c->rets[] as new references. */
#ifndef LPX_DISPATCH_H
#define LPX_DISPATCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "export.h"
#include "status.h"
#include "dtype.h"
#include "tensor.h"

LPX_BEGIN_DECLS

typedef int32_t lpx_op;

#define LPX_MAX_ARGS 16
#define LPX_MAX_RETS 4
#define LPX_MAX_OPS 1024
#define LPX_NUM_KEYS 64

/* Key bands (bit indices). */
enum {
    LPX_KEY_NONE = 0,       /* bit 0 is never used */
    LPX_KEY_CPU = 1,
    LPX_KEY_BACKEND_LAST = 15,
    LPX_KEY_PAYLOAD_FIRST = 16, LPX_KEY_PAYLOAD_LAST = 39,
    LPX_KEY_WRAPPER_FIRST = 40, LPX_KEY_WRAPPER_LAST = 55,
    LPX_KEY_DIST_FIRST = 56, LPX_KEY_DIST_LAST = 63
};

typedef enum lpx_tag {
    LPX_TAG_NONE = 0,    /* absent optional argument */
    LPX_TAG_TENSOR,      /* u.t (may be NULL only for "Tensor?") */
    LPX_TAG_TENSORS,     /* u.ts, len entries */
    LPX_TAG_I64,         /* u.i */
    LPX_TAG_F64,         /* u.f */
    LPX_TAG_BOOL,        /* u.b */
    LPX_TAG_DTYPE,       /* u.d */
    LPX_TAG_STR,         /* u.s */
    LPX_TAG_PTR,         /* u.p */
    LPX_TAG_INTS,        /* u.ints, len entries */
    LPX_TAG_DEVICE       /* u.dev */
} lpx_tag;

/** A 16-byte tagged argument or result value. */
typedef struct lpx_value {
    uint16_t tag;   /* lpx_tag */
    uint16_t reserved;
    uint32_t len;   /* element count for TENSORS and INTS */
    union {
        lpx_tensor *t;
        lpx_tensor *const *ts;
        int64_t i;
        double f;
        bool b;
        lpx_dtype d;
        const char *s;
        void *p;
        const int64_t *ints;
        lpx_device dev;
    } u;
} lpx_value;

#if !defined(__cplusplus)
_Static_assert(sizeof(lpx_value) == 16, "lpx_value must be 16 bytes");
#endif

/* Value constructors (header-only, for building argument arrays). */
static inline lpx_value lpx_v_tensor(lpx_tensor *t) { lpx_value v; v.tag = LPX_TAG_TENSOR; v.reserved = 0; v.len = 0; v.u.t = t; return v; }
static inline lpx_value lpx_v_opt_tensor(lpx_tensor *t) { lpx_value v = lpx_v_tensor(t); if (!t) v.tag = LPX_TAG_NONE; return v; }
static inline lpx_value lpx_v_tensors(lpx_tensor *const *ts, uint32_t n) { lpx_value v; v.tag = LPX_TAG_TENSORS; v.reserved = 0; v.len = n; v.u.ts = ts; return v; }
static inline lpx_value lpx_v_i64(int64_t i) { lpx_value v; v.tag = LPX_TAG_I64; v.reserved = 0; v.len = 0; v.u.i = i; return v; }
static inline lpx_value lpx_v_f64(double f) { lpx_value v; v.tag = LPX_TAG_F64; v.reserved = 0; v.len = 0; v.u.f = f; return v; }
static inline lpx_value lpx_v_bool(bool b) { lpx_value v; v.tag = LPX_TAG_BOOL; v.reserved = 0; v.len = 0; v.u.i = 0; v.u.b = b; return v; }
static inline lpx_value lpx_v_dtype(lpx_dtype d) { lpx_value v; v.tag = LPX_TAG_DTYPE; v.reserved = 0; v.len = 0; v.u.i = 0; v.u.d = d; return v; }
static inline lpx_value lpx_v_str(const char *s) { lpx_value v; v.tag = LPX_TAG_STR; v.reserved = 0; v.len = 0; v.u.s = s; return v; }
static inline lpx_value lpx_v_ptr(void *p) { lpx_value v; v.tag = LPX_TAG_PTR; v.reserved = 0; v.len = 0; v.u.p = p; return v; }
static inline lpx_value lpx_v_ints(const int64_t *p, uint32_t n) { lpx_value v; v.tag = LPX_TAG_INTS; v.reserved = 0; v.len = n; v.u.ints = p; return v; }
static inline lpx_value lpx_v_device(lpx_device d) { lpx_value v; v.tag = LPX_TAG_DEVICE; v.reserved = 0; v.len = 0; v.u.dev = d; return v; }
static inline lpx_value lpx_v_none(void) { lpx_value v; v.tag = LPX_TAG_NONE; v.reserved = 0; v.len = 0; v.u.i = 0; return v; }

/** One op invocation. Build it on the stack with lpx_call_init, then
 *  lpx_dispatch. Kernels read args and write rets (new references). */
typedef struct lpx_call {
    lpx_op op;
    int key;                 /* key of the running kernel (set by dispatch) */
    uint64_t keys;           /* keys still eligible (current one included) */
    int nargs;
    int nrets;               /* set by the kernel: number of rets filled */
    const lpx_value *args;
    lpx_value rets[LPX_MAX_RETS];
    void *kernel_data;       /* the `data` given at kernel registration */
} lpx_call;

/* Plugins compiled against any 1.x header build this struct on their
 * stack and hand it to lpx_dispatch: its size and layout are the ABI.
 * An op's checked arguments (op_args.h) travel beside it, in the
 * dispatcher's lpx_op_frame, never in it. */
#if !defined(__cplusplus)
_Static_assert(sizeof(void *) != 8 || sizeof(lpx_call) == 104, "lpx_call is plugin ABI 1: 104 bytes on LP64");
#endif

typedef lpx_status (*lpx_kernel_fn)(lpx_call *c);

/** Prepares a call of `op` over `nargs` arguments (borrowed). */
static inline void lpx_call_init(lpx_call *c, lpx_op op, const lpx_value *args, int nargs)
{
    c->op = op; c->key = 0; c->keys = 0; c->nargs = nargs; c->nrets = 0;
    c->args = args; c->kernel_data = 0;
}

/** Runs a call: key set = OR of the tensor arguments' keys (and of a device
 *  argument's backend key), kernel = table[op][highest key], else that
 *  key's fallback, else LPX_ENOTIMPL naming op and kind. Arguments are
 *  checked against the op's schema (count and tags: LPX_EINVAL). When the
 *  call reaches a backend key and the op has a spec family (ops.def,
 *  op_args.h), the family's meta function runs first: the op's contract,
 *  checked once for every backend. On failure no rets are held. */
LPX_API lpx_status lpx_dispatch(lpx_call *c);

/** From inside a kernel: runs the same call again with the current key and
 *  every key above it removed (a wrapper kind lands on the next kind or the
 *  backend). The rets of the inner kernel replace c->rets. */
LPX_API lpx_status lpx_redispatch(lpx_call *c);

/** Releases the tensor rets of a finished call (helper for callers that
 *  discard results). */
LPX_API void lpx_call_release_rets(lpx_call *c);

/* ---- ops ---------------------------------------------------------- */

/** Registers an op from a schema such as
 *  "add(Tensor a, Tensor b, Tensor? out) -> Tensor". Argument types: Tensor,
 *  Tensor?, Tensor[], int, int?, int[], int[]?, float, float?, bool, dtype,
 *  dtype?, str, str?, ptr, device; returns: Tensor, (Tensor, Tensor), or ().
 *  The tensors of a call must live on one device (LPX_EDEVICE otherwise),
 *  except an argument typed Tensor(host) or Tensor(host)?, which may stay
 *  on the CPU beside device tensors (a scale the kernel reads on the host),
 *  and copy_'s. 
 *  Errors: LPX_EINVAL (bad schema, with the position), LPX_EEXIST (name
 *  taken), LPX_EFULL. Thread-safe. Built-in ops are already registered. */
LPX_API lpx_status lpx_op_register(const char *schema, lpx_op *out);
/** Finds an op by name. Errors: LPX_ENOTFOUND, LPX_EINVAL (NULL). */
LPX_API lpx_status lpx_op_find(const char *name, lpx_op *out);
/** Name / schema of op, or NULL if op is not registered. */
LPX_API const char *lpx_op_name(lpx_op op);
LPX_API const char *lpx_op_schema(lpx_op op);
LPX_API int lpx_op_count(void);
/** Number of declared arguments / results of op (-1 if unknown op). */
LPX_API int lpx_op_nargs(lpx_op op);
LPX_API int lpx_op_nrets(lpx_op op);

/* ---- kernels ------------------------------------------------------ */

/** Registers a boxed kernel for (op, key). Replaces nothing: a second
 *  registration of the same slot is LPX_EEXIST. Thread-safe; published with
 *  release semantics so concurrent dispatchers see it whole. */
LPX_API lpx_status lpx_kernel_register(lpx_op op, int key, lpx_kernel_fn fn, void *data);

/** Registers a typed C kernel for (op, key). `signature` restates the op's
 *  argument and result types ("Tensor, float -> Tensor"); it must match the
 *  op's schema. The C function receives the arguments in order (Tensor:
 *  lpx_tensor*, Tensor[]: lpx_tensor *const*, int64_t count; int: int64_t,
 *  int[]: const int64_t*, int64_t count; float: double; bool: bool; dtype:
 *  int32_t; str: const char*; ptr: void*; device: lpx_device) followed by
 *  one lpx_tensor** per result, and returns lpx_status. Absent optionals
 *  arrive as NULL/0. It is called through a libffi cif prepared here once.
 *  Errors: LPX_EINVAL (signature mismatch), LPX_EEXIST, LPX_ENOMEM. */
LPX_API lpx_status lpx_kernel_register_typed(lpx_op op, int key, const char *signature,
                                             void (*fn)(void));

/** Removes the kernel of (op, key) (plugin unload). The entry is retired,
 *  not freed, so a concurrent dispatcher never sees freed memory. */
LPX_API lpx_status lpx_kernel_unregister(lpx_op op, int key);

/** True if (op, key) has a kernel. */
LPX_API bool lpx_kernel_exists(lpx_op op, int key);
/** The boxed kernel registered for (op, key) and its data, so a backend
 *  can adopt device-independent kernels of another (the CUDA plugin
 *  registers the CPU backend's view kernels for its own key: views only
 *  touch metadata, and their copies dispatch copy_ on the tensor's device).
 *  The kernel stays valid for the process. Errors: LPX_EINVAL (NULL fn,
 *  unknown op, key out of range), LPX_ENOTFOUND (no boxed kernel there;
 *  typed kernels are not returned). */
LPX_API lpx_status lpx_kernel_lookup(lpx_op op, int key, lpx_kernel_fn *fn, void **data);

/** Registers the fallback of `key`: it runs for every op that has no kernel
 *  at that key. At most one per key (LPX_EEXIST). */
LPX_API lpx_status lpx_fallback_register(int key, lpx_kernel_fn fn, void *data);
LPX_API lpx_status lpx_fallback_unregister(int key);

/** Human name of a key ("cpu", "float8"), or "key<N>" if unused. */
LPX_API const char *lpx_key_name(int key);

/** Key bit of the backend serving a device type, or 0 if none. */
LPX_API int lpx_device_key(int32_t device_type);

/* ---- backends ----------------------------------------------------- */

/** Memory services of a device type. */
typedef struct lpx_backend_i {
    size_t struct_size;
    const char *name;            /* "cpu", "cuda" */
    int32_t device_type;         /* LPX_DEVICE_* */
    void *(*alloc)(void *self, lpx_device dev, size_t nbytes);
    void (*free)(void *self, lpx_device dev, void *ptr, size_t nbytes);
    lpx_status (*copy)(void *self, void *dst, lpx_device dst_dev, const void *src,
                       lpx_device src_dev, size_t nbytes);
    lpx_status (*sync)(void *self, lpx_device dev);
    void *self;
    /* ---- optional slots, appended: a backend whose struct_size ends
     * before them (built before they existed) or leaves them NULL has
     * none; lpx_backend_register zero-fills what struct_size does not
     * cover. ---- */
    /** Page-locked host memory of at least nbytes (at least 1) into *out,
     *  which this device's copies read and write at DMA speed (the CUDA
     *  plugin: cudaHostAlloc). The caller owns it and frees it with
     *  host_free. Errors: LPX_EINVAL (NULL out), LPX_ENOMEM or the
     *  backend's (no pinned memory left: pageable memory works too). */
    lpx_status (*host_alloc)(void *self, size_t nbytes, void **out);
    /** Frees memory from host_alloc (NULL is ignored), after the copies
     *  that read it completed. Required when host_alloc is set. */
    void (*host_free)(void *self, void *ptr);
} lpx_backend_i;

/** Registers a backend (vtable copied) and returns its key bit in *key.
 *  Errors: LPX_EINVAL, LPX_EEXIST (name or device type taken), LPX_EFULL. */
LPX_API lpx_status lpx_backend_register(const lpx_backend_i *b, int *key);
/** Backend serving a device type, or NULL. */
LPX_API const lpx_backend_i *lpx_backend_for(int32_t device_type);
LPX_API int lpx_backend_count(void);
/** Backend i (0-based, registration order), or NULL. */
LPX_API const lpx_backend_i *lpx_backend_at(int i);

LPX_END_DECLS

#endif
