/* Dispatch internals: parsed schemas, kernel entries, the op table. */
#ifndef LPX_DISPATCH_INTERNAL_H
#define LPX_DISPATCH_INTERNAL_H

#include <pthread.h>
#include "../core/lpx_internal.h"

#define LPX_MAX_NAME 48

typedef struct lpx_arg_spec {
    uint8_t tag;        /* lpx_tag expected */
    bool optional;      /* LPX_TAG_NONE accepted */
    bool host;          /* Tensor(host): may stay on the CPU beside device tensors */
    char name[LPX_MAX_NAME];
} lpx_arg_spec;

typedef struct lpx_schema {
    char name[LPX_MAX_NAME];
    int nargs;
    int nrets;
    lpx_arg_spec args[LPX_MAX_ARGS];
    uint8_t rets[LPX_MAX_RETS];   /* lpx_tag of each result (TENSOR) */
} lpx_schema;

/* Parses "name(Type a, ...) -> Ret"; `what` prefixes error messages.
 * With `with_name` false the text is a bare signature "Type, Type -> Ret". */
lpx_status lpx_schema_parse(const char *text, bool with_name, const char *what, lpx_schema *out);

typedef struct lpx_kernel_entry {
    lpx_kernel_fn fn;
    void *data;
    struct lpx_kernel_entry *retired_next;  /* kept alive after unregister */
} lpx_kernel_entry;

/* A spec family's meta function (dispatch/spec.c): checks the call's
 * arguments against the op's contract and fills the family's struct
 * (include/lpx/op_args.h). c->key names the backend in messages. */
typedef lpx_status (*lpx__spec_fn)(const lpx_call *c, void *args);

/* LPX_SPEC_FAMILIES: every family (include/lpx/op_args.h) */
#define LPX__SPEC_DECL(f) lpx_status lpx__spec_##f(const lpx_call *c, void *args);
LPX_SPEC_FAMILIES(LPX__SPEC_DECL)
#undef LPX__SPEC_DECL
#define lpx__spec_none NULL
#define lpx__spec_size_none 0
#define LPX__SPEC_SIZE(f) enum { lpx__spec_size_##f = sizeof(lpx_##f##_args) }; \
    _Static_assert(sizeof(lpx_op_args_any) >= sizeof(lpx_##f##_args), "lpx_op_args_any lacks family " #f);
LPX_SPEC_FAMILIES(LPX__SPEC_SIZE)
#undef LPX__SPEC_SIZE


/* lpx_binary_args.flat for filled args (shape, ndim, a, b, out). */
static inline bool lpx__binary_flat(const lpx_binary_args *a)
{
    const lpx_tensor *t[3] = {a->a, a->b, a->out ? a->out : a->a};
    for (int k = 0; k < 3; k++)
        if (t[k]->ndim != a->ndim) return false;
    int64_t s = 1;
    for (int i = a->ndim - 1; i >= 0; i--) {
        int64_t d = a->shape[i];
        for (int k = 0; k < 3; k++)
            if (t[k]->shape[i] != d || (d != 1 && t[k]->strides[i] != s)) return false;
        s *= d;
    }
    return true;
}

/* The binary family's shape pass, shared by lpx__spec_binary_fast and
 * dispatch.c's one-pass path: one pass over the dims, not unrolled (ranks
 * are small): a's shape copied into a; false when the shapes differ (a
 * broadcast: the general path); *flat when all three are contiguous (a
 * dim of size 1 has any stride). */
static inline __attribute__((always_inline)) bool lpx__binary_shapes(const lpx_tensor *x, const lpx_tensor *y,
                                                                     const lpx_tensor *r, int n, lpx_binary_args *a,
                                                                     bool *flat)
{
    uint64_t bad = 0, strided = 0;
    int64_t s = 1;
#pragma GCC unroll 1
    for (int i = n - 1; i >= 0; i--) {
        int64_t d = x->shape[i];
        a->shape[i] = d;
        bad |= (uint64_t)(d ^ y->shape[i]) | (uint64_t)(d ^ r->shape[i]);
        uint64_t st = (uint64_t)(x->strides[i] ^ s) | (uint64_t)(y->strides[i] ^ s) | (uint64_t)(r->strides[i] ^ s);
        strided |= d == 1 ? 0 : st;
        s *= d;
    }
    *flat = !strided;
    return !bad;
}

/* The rest of the binary family's arguments, one scalar store per field:
 * the kernel loads them back at once, and a load out of the middle of a
 * wider (vector) store is not forwarded on every core. */
static inline __attribute__((always_inline)) void lpx__binary_fill(lpx_binary_args *a, lpx_tensor *x, lpx_tensor *y,
                                                                   lpx_tensor *o, int n, lpx_dtype dt, bool flat)
{
    __asm__("" : "+r"(x), "+r"(y), "+r"(o), "+r"(n), "+r"(dt));
    a->a = x;
    a->b = y;
    a->out = o;
    a->dtype = dt;
    a->ndim = n;
    a->flat = flat;
}

/* The `binary` family's common case, inlined into the dispatcher: dense
 * operands of a built-in dtype and one shape, `out` (if any) dense,
 * writable, of that shape and a's dtype. Fills exactly what
 * lpx__spec_binary fills for the same arguments; anything else (and every
 * message) is lpx__spec_binary's. `c` supplies the arguments. */
static inline __attribute__((always_inline)) lpx_status lpx__spec_binary_fast(const lpx_call *c, void *p)
{
    lpx_binary_args *a = p;
    const lpx_value *v = c->args;
    lpx_tensor *x = v[0].u.t, *y = v[1].u.t;
    lpx_tensor *o = c->nargs > 2 && v[2].tag == LPX_TAG_TENSOR ? v[2].u.t : NULL;
    const lpx_tensor *r = o ? o : y;   /* out's checks, or y's again */
    int n = x->ndim;
    lpx_dtype dt = x->dtype;
    /* Branch-light: every mismatch ORed into one word, one test at the
     * end. Dense (no kind), built-in dtypes, one rank; out (when given) of
     * a's dtype and writable. */
    uint64_t bad = (uint64_t)(uintptr_t)x->kind | (uint64_t)(uintptr_t)y->kind | (uint64_t)(uintptr_t)r->kind |
                   (uint64_t)((unsigned)dt >= LPX_DTYPE_BUILTIN_COUNT) |
                   (uint64_t)((unsigned)y->dtype >= LPX_DTYPE_BUILTIN_COUNT) | (uint64_t)(uint32_t)(n ^ y->ndim) |
                   (uint64_t)(uint32_t)(n ^ r->ndim);
    if (o) bad |= (uint64_t)(uint32_t)(o->dtype ^ dt);
    /* (a kind tensor has no storage: read-only is asked of a dense out only) */
    if (LPX_UNLIKELY(bad) || (o && LPX_UNLIKELY(o->storage->readonly))) return lpx__spec_binary(c, p);
    bool flat;
    if (LPX_UNLIKELY(!lpx__binary_shapes(x, y, r, n, a, &flat))) return lpx__spec_binary(c, p);
    lpx__binary_fill(a, x, y, o, n, dt, flat);
    return LPX_OK;
}

typedef struct lpx_op_row {
    _Atomic(lpx_kernel_entry *) k[LPX_NUM_KEYS];
    lpx_schema schema;
    char *schema_text;
    atomic_bool dead;                 /* unregistered (rollback): a tombstone */
    bool cross_device;                /* its tensors may live on different devices
                                       * (copy_: moving bytes between them is its job) */
    uint32_t host_args;               /* bit i: argument i is Tensor(host) */
    lpx__spec_fn spec;                /* the spec family's meta function, or NULL */
    uint32_t spec_size;               /* its struct's size */
    bool binary_direct;               /* family `binary`, schema (Tensor, Tensor[, Tensor? out]),
                                       * no Tensor(host): dispatch.c's one-pass path applies */
    struct lpx_op_row *retired_next;  /* dead rows stay allocated */
} lpx_op_row;

/* id -> row. Atomic pointers: an id popped by a rollback is handed out
 * again with a NEW row, published with release order while a dispatcher
 * may still load the slot; rows are never freed, so either row it sees is
 * valid memory. lpx__op_row(op) is the acquire load every reader uses. */
extern _Atomic(lpx_op_row *) lpx__ops[LPX_MAX_OPS];
static inline lpx_op_row *lpx__op_row(int op) { return atomic_load_explicit(&lpx__ops[op], memory_order_acquire); }
extern atomic_int lpx__nops;
extern _Atomic(lpx_kernel_entry *) lpx__fallbacks[LPX_NUM_KEYS];

/* the registry's write lock (ops, kernels, kinds, backends, dtypes share it) */
void lpx_registry_lock(void);
void lpx_registry_unlock(void);

/* Builds a boxed entry that calls a typed C function through libffi. */
lpx_status lpx_ffi_entry_new(const lpx_schema *sig, void (*fn)(void), lpx_kernel_entry **out);

/* Tracing path of dispatch (trace.c): runs fn like dispatch would and
 * records it. */
lpx_status lpx__trace_invoke(lpx_call *c, lpx_kernel_fn fn, bool fallback);

/* kind name of a key, for messages ("cpu", "float8") */
const char *lpx_key_name(int key);

#endif
