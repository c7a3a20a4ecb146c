/* The registry: ops by name, kernels per (op, key), fallbacks, kinds and
 * backends. Writers take one mutex; readers on the hot path only load
 * atomics published with release semantics. uthash maps names to ids and
 * is touched only under the lock. The backend table (device type -> key)
 * is core's (core/backends.c): tensors need it below dispatch. */
#include <stdio.h>
#include <string.h>
#include "dispatch_internal.h"

/* uthash allocates through lpx so OOM tests reach it, and reports OOM
 * instead of exiting. */
static int uthash_oom;
#define uthash_malloc(sz) lpx_malloc(sz)
#define uthash_free(p, sz) lpx_free(p)
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (uthash_oom = 1)
#include <uthash.h>

typedef struct name_entry {
    char name[LPX_MAX_NAME];
    int id;
    void *ptr;
    UT_hash_handle hh;
} name_entry;

static pthread_mutex_t registry_mutex = PTHREAD_MUTEX_INITIALIZER;
void lpx_registry_lock(void) { pthread_mutex_lock(&registry_mutex); }
void lpx_registry_unlock(void) { pthread_mutex_unlock(&registry_mutex); }

_Atomic(lpx_op_row *) lpx__ops[LPX_MAX_OPS];
atomic_int lpx__nops;
_Atomic(lpx_kernel_entry *) lpx__fallbacks[LPX_NUM_KEYS];

static name_entry *op_names;
static name_entry *kind_names;
static lpx_kernel_entry *retired;       /* unregistered entries, never freed */
static lpx_kind *retired_kinds;         /* handles outlive unregistration */
static lpx_op_row *retired_rows;        /* rows of unregistered ops, never freed */
static char key_names[LPX_NUM_KEYS][LPX_MAX_NAME];

static lpx_kind *kinds[LPX_NUM_KEYS];   /* registration order */
/* Keys of kinds rolled back while tensors of theirs lived: never handed
 * out again, so those tensors (whose key sets carry the bit) cannot be
 * routed to another kind's handlers; dispatch refuses them instead. */
static bool key_poisoned[LPX_NUM_KEYS];
static atomic_int nkinds;
static lpx_kind *kind_by_key[LPX_NUM_KEYS];


/* Adds name -> id; caller holds the lock. */
static lpx_status name_add(name_entry **map, const char *name, int id, void *ptr, const char *what)
{
    name_entry *e = lpx_calloc(1, sizeof *e);
    if (!e) return lpx_error(LPX_ENOMEM, "%s: cannot allocate name entry", what);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->id = id;
    e->ptr = ptr;
    uthash_oom = 0;
    HASH_ADD_STR(*map, name, e);
    if (uthash_oom) {
        lpx_free(e);
        return lpx_error(LPX_ENOMEM, "%s: cannot grow the name table", what);
    }
    return LPX_OK;
}

static name_entry *name_find(name_entry *map, const char *name)
{
    name_entry *e = NULL;
    HASH_FIND_STR(map, name, e);
    return e;
}

static void name_remove(name_entry **map, const char *name)
{
    name_entry *e = name_find(*map, name);
    if (e) { HASH_DEL(*map, e); lpx_free(e); }
}

/* ---- ops ----------------------------------------------------------- */

lpx_status lpx_op_register(const char *schema, lpx_op *out)
{
    if (!schema) return lpx_error(LPX_EINVAL, "lpx_op_register: schema is NULL");
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if ((st = lpx__journal_reserve("lpx_op_register"))) return st;
    lpx_op_row *row = lpx_calloc(1, sizeof *row);
    if (!row) return lpx_error(LPX_ENOMEM, "lpx_op_register: cannot allocate op row");
    if ((st = lpx_schema_parse(schema, true, "lpx_op_register", &row->schema))) { lpx_free(row); return st; }
    if (!(row->schema_text = lpx_strdup(schema))) {
        lpx_free(row);
        return lpx_error(LPX_ENOMEM, "lpx_op_register: cannot copy schema");
    }
    /* Every other op refuses tensors on different devices before any kernel
     * runs (lpx_dispatch): one check for every backend and kind. */
    row->cross_device = !strcmp(row->schema.name, "copy_");
    for (int i = 0; i < row->schema.nargs; i++)
        if (row->schema.args[i].host) row->host_args |= UINT32_C(1) << i;
    lpx_registry_lock();
    int n = atomic_load_explicit(&lpx__nops, memory_order_relaxed);
    if (name_find(op_names, row->schema.name)) {
        st = lpx_error(LPX_EEXIST, "lpx_op_register: op '%s' is already registered", row->schema.name);
    } else if (n >= LPX_MAX_OPS) {
        st = lpx_error(LPX_EFULL, "lpx_op_register: op table full (%d ops)", LPX_MAX_OPS);
    } else if (!(st = name_add(&op_names, row->schema.name, n, row, "lpx_op_register"))) {
        atomic_store_explicit(&lpx__ops[n], row, memory_order_release);
        atomic_store_explicit(&lpx__nops, n + 1, memory_order_release);
        if (out) *out = n;
    }
    lpx_registry_unlock();
    if (st) { lpx_free(row->schema_text); lpx_free(row); }
    else lpx__journal_note(LPX_REG_OP, n, 0, row);
    return st;
}

static void retire(_Atomic(lpx_kernel_entry *) *slot);

/* Rollback only. The row becomes a tombstone: its name is free again, its
 * kernels are retired, and lookups by id fail; the memory stays, because a
 * dispatcher may be inside it. Tombstones at the top of the table are
 * popped so the op count and the next id return to what they were (a
 * dispatcher still holding the old row keeps a valid, kernel-less row). */
lpx_status lpx__op_unregister(lpx_op op)
{
    lpx_registry_lock();
    int n = atomic_load_explicit(&lpx__nops, memory_order_relaxed);
    lpx_op_row *row = op >= LPX_OP_BUILTIN_COUNT && op < n ? lpx__op_row(op) : NULL;
    if (!row || atomic_load(&row->dead)) {
        lpx_registry_unlock();
        return lpx_error(LPX_ENOTFOUND, "lpx__op_unregister: op id %d is not a registered plugin op", (int)op);
    }
    for (int k = 0; k < LPX_NUM_KEYS; k++) retire(&row->k[k]);
    name_remove(&op_names, row->schema.name);
    atomic_store_explicit(&row->dead, true, memory_order_release);
    while (n > LPX_OP_BUILTIN_COUNT && atomic_load(&lpx__op_row(n - 1)->dead)) {
        lpx__op_row(n - 1)->retired_next = retired_rows;
        retired_rows = lpx__op_row(n - 1);
        n--;
    }
    atomic_store_explicit(&lpx__nops, n, memory_order_release);
    lpx_registry_unlock();
    return LPX_OK;
}

lpx_status lpx_ops_init_builtins(void)
{
    /* each row: its schema, and its spec family's meta function and
     * struct size (NULL, 0 for `none`) */
    static const struct { const char *schema; lpx__spec_fn spec; uint32_t size; } rows[] = {
#define LPX_OP(name, spec, schema) {schema, lpx__spec_##spec, lpx__spec_size_##spec},
#include "lpx/ops.def"
#undef LPX_OP
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        lpx_op id;
        lpx_status st = lpx_op_register(rows[i].schema, &id);
        if (st) return st;
        LPX_ASSERT(id == (lpx_op)i);
        lpx_op_row *row = lpx__op_row(id);
        row->spec = rows[i].spec;
        row->spec_size = rows[i].size;
        const lpx_schema *sc = &row->schema;
        row->binary_direct = row->spec == lpx__spec_binary && !row->host_args && !row->cross_device &&
                             (sc->nargs == 2 || sc->nargs == 3) && sc->args[0].tag == LPX_TAG_TENSOR &&
                             sc->args[1].tag == LPX_TAG_TENSOR &&
                             (sc->nargs == 2 || (sc->args[2].tag == LPX_TAG_TENSOR && sc->args[2].optional));
    }
    return LPX_OK;
}

static lpx_op_row *row_of(lpx_op op)
{
    if (op < 0 || op >= atomic_load_explicit(&lpx__nops, memory_order_acquire)) return NULL;
    lpx_op_row *r = lpx__op_row(op);
    return atomic_load_explicit(&r->dead, memory_order_acquire) ? NULL : r;
}

lpx_status lpx_op_find(const char *name, lpx_op *out)
{
    if (!name || !out) return lpx_error(LPX_EINVAL, "lpx_op_find: %s is NULL", name ? "out" : "name");
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    lpx_registry_lock();
    name_entry *e = name_find(op_names, name);
    if (e) *out = e->id;
    lpx_registry_unlock();
    return e ? LPX_OK : lpx_error(LPX_ENOTFOUND, "lpx_op_find: no op named '%s'", name);
}

const char *lpx_op_name(lpx_op op) { lpx_op_row *r = row_of(op); return r ? r->schema.name : NULL; }
const char *lpx_op_schema(lpx_op op) { lpx_op_row *r = row_of(op); return r ? r->schema_text : NULL; }
int lpx_op_count(void) { lpx_ensure_init(); return atomic_load(&lpx__nops); }
int lpx_op_nargs(lpx_op op) { lpx_op_row *r = row_of(op); return r ? r->schema.nargs : -1; }
int lpx_op_nrets(lpx_op op) { lpx_op_row *r = row_of(op); return r ? r->schema.nrets : -1; }

/* ---- kernels ------------------------------------------------------- */

static lpx_status check_slot(const char *what, lpx_op op, int key, lpx_op_row **row)
{
    if (!(*row = row_of(op))) return lpx_error(LPX_EINVAL, "%s: unknown op id %d", what, (int)op);
    if (key <= 0 || key >= LPX_NUM_KEYS)
        return lpx_error(LPX_EINVAL, "%s(%s): key %d out of range 1..63", what, (*row)->schema.name, key);
    return LPX_OK;
}

static lpx_status install(const char *what, lpx_op op, int key, lpx_kernel_entry *e)
{
    lpx_op_row *row;
    lpx_status st = check_slot(what, op, key, &row);
    if (st) return st;
    lpx_registry_lock();
    if (atomic_load_explicit(&row->k[key], memory_order_relaxed))
        st = lpx_error(LPX_EEXIST, "%s: op '%s' already has a kernel for key '%s'", what,
                       row->schema.name, lpx_key_name(key));
    else
        atomic_store_explicit(&row->k[key], e, memory_order_release);
    lpx_registry_unlock();
    if (!st) lpx__journal_note(LPX_REG_KERNEL, op, key, e);
    return st;
}

lpx_status lpx_kernel_register(lpx_op op, int key, lpx_kernel_fn fn, void *data)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!fn) return lpx_error(LPX_EINVAL, "lpx_kernel_register: fn is NULL (op %d, key %d)", (int)op, key);
    if ((st = lpx__journal_reserve("lpx_kernel_register"))) return st;
    lpx_kernel_entry *e = lpx_calloc(1, sizeof *e);
    if (!e) return lpx_error(LPX_ENOMEM, "lpx_kernel_register: cannot allocate entry");
    e->fn = fn;
    e->data = data;
    if ((st = install("lpx_kernel_register", op, key, e))) lpx_free(e);
    return st;
}

lpx_status lpx_kernel_register_typed(lpx_op op, int key, const char *signature, void (*fn)(void))
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    lpx_op_row *row;
    if ((st = check_slot("lpx_kernel_register_typed", op, key, &row))) return st;
    if (!fn) return lpx_error(LPX_EINVAL, "lpx_kernel_register_typed(%s): fn is NULL", row->schema.name);
    lpx_schema sig;
    if ((st = lpx_schema_parse(signature, false, "lpx_kernel_register_typed", &sig))) return st;
    if (sig.nargs != row->schema.nargs || sig.nrets != row->schema.nrets)
        return lpx_error(LPX_EINVAL, "lpx_kernel_register_typed(%s): signature \"%s\" has %d args/%d results, op has %d/%d",
                         row->schema.name, signature, sig.nargs, sig.nrets, row->schema.nargs, row->schema.nrets);
    for (int i = 0; i < sig.nargs; i++)
        if (sig.args[i].tag != row->schema.args[i].tag || sig.args[i].optional != row->schema.args[i].optional)
            return lpx_error(LPX_EINVAL, "lpx_kernel_register_typed(%s): argument %d ('%s') of \"%s\" does not match the schema \"%s\"",
                             row->schema.name, i, row->schema.args[i].name, signature, row->schema_text);
    lpx_kernel_entry *e;
    if ((st = lpx__journal_reserve("lpx_kernel_register_typed"))) return st;
    if ((st = lpx_ffi_entry_new(&row->schema, fn, &e))) return st;
    if ((st = install("lpx_kernel_register_typed", op, key, e))) { lpx_free(e->data); lpx_free(e); }
    return st;
}

static void retire(_Atomic(lpx_kernel_entry *) *slot)
{
    lpx_kernel_entry *e = atomic_exchange_explicit(slot, NULL, memory_order_acq_rel);
    if (e) { e->retired_next = retired; retired = e; }
}

lpx_status lpx_kernel_unregister(lpx_op op, int key)
{
    lpx_op_row *row;
    lpx_status st = check_slot("lpx_kernel_unregister", op, key, &row);
    if (st) return st;
    lpx_registry_lock();
    if (!atomic_load(&row->k[key]))
        st = lpx_error(LPX_ENOTFOUND, "lpx_kernel_unregister: op '%s' has no kernel for key '%s'",
                       row->schema.name, lpx_key_name(key));
    else
        retire(&row->k[key]);
    lpx_registry_unlock();
    return st;
}

lpx_status lpx_kernel_lookup(lpx_op op, int key, lpx_kernel_fn *fn, void **data)
{
    if (!fn) return lpx_error(LPX_EINVAL, "lpx_kernel_lookup: fn is NULL");
    *fn = NULL;
    if (data) *data = NULL;
    lpx_op_row *row = row_of(op);
    if (!row) return lpx_error(LPX_EINVAL, "lpx_kernel_lookup: op %d is not registered", (int)op);
    if (key <= 0 || key >= LPX_NUM_KEYS) return lpx_error(LPX_EINVAL, "lpx_kernel_lookup: key %d out of range 1..63", key);
    lpx_kernel_entry *e = atomic_load_explicit(&row->k[key], memory_order_acquire);
    if (!e || !e->fn)
        return lpx_error(LPX_ENOTFOUND, "lpx_kernel_lookup: op '%s' has no boxed kernel for key '%s'", row->schema.name,
                         lpx_key_name(key));
    *fn = e->fn;
    if (data) *data = e->data;
    return LPX_OK;
}

bool lpx_kernel_exists(lpx_op op, int key)
{
    lpx_op_row *row = row_of(op);
    return row && key > 0 && key < LPX_NUM_KEYS && atomic_load_explicit(&row->k[key], memory_order_acquire);
}

lpx_status lpx_fallback_register(int key, lpx_kernel_fn fn, void *data)
{
    if (key <= 0 || key >= LPX_NUM_KEYS || !fn)
        return lpx_error(LPX_EINVAL, "lpx_fallback_register: %s", fn ? "key out of range 1..63" : "fn is NULL");
    lpx_status rs = lpx__journal_reserve("lpx_fallback_register");
    if (rs) return rs;
    lpx_kernel_entry *e = lpx_calloc(1, sizeof *e);
    if (!e) return lpx_error(LPX_ENOMEM, "lpx_fallback_register: cannot allocate entry");
    e->fn = fn;
    e->data = data;
    lpx_status st = LPX_OK;
    lpx_registry_lock();
    if (atomic_load(&lpx__fallbacks[key]))
        st = lpx_error(LPX_EEXIST, "lpx_fallback_register: key '%s' already has a fallback", lpx_key_name(key));
    else
        atomic_store_explicit(&lpx__fallbacks[key], e, memory_order_release);
    lpx_registry_unlock();
    if (st) lpx_free(e);
    else lpx__journal_note(LPX_REG_FALLBACK, key, 0, e);
    return st;
}

lpx_status lpx_fallback_unregister(int key)
{
    if (key <= 0 || key >= LPX_NUM_KEYS) return lpx_error(LPX_EINVAL, "lpx_fallback_unregister: key %d out of range", key);
    lpx_registry_lock();
    lpx_status st = atomic_load(&lpx__fallbacks[key]) ? LPX_OK
        : lpx_error(LPX_ENOTFOUND, "lpx_fallback_unregister: key '%s' has no fallback", lpx_key_name(key));
    if (!st) retire(&lpx__fallbacks[key]);
    lpx_registry_unlock();
    return st;
}

const char *lpx_key_name(int key)
{
    static _Thread_local char buf[16];
    if (key >= LPX_KEY_CPU && key <= LPX_KEY_BACKEND_LAST) {
        const lpx_backend_i *b = lpx_backend_at(key - LPX_KEY_CPU);
        if (b) return b->name;
    }
    if (key > 0 && key < LPX_NUM_KEYS && key_names[key][0]) return key_names[key];
    snprintf(buf, sizeof buf, "key%d", key);
    return buf;
}

/* ---- keys of a backend that goes away --------------------------------
 * The backend table is core's (core/backends.c); what dispatch holds for a
 * backend key is its kernels and fallback. */

void lpx__key_retire(int key)
{
    if (key <= 0 || key >= LPX_NUM_KEYS) return;
    lpx_registry_lock();
    int nops = atomic_load(&lpx__nops);
    for (int i = 0; i < nops; i++) retire(&lpx__op_row(i)->k[key]);
    retire(&lpx__fallbacks[key]);
    lpx_registry_unlock();
}

/* ---- kinds --------------------------------------------------------- */

lpx_status lpx_kind_register(const lpx_kind_i *vt, const lpx_kind **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!vt || !out) return lpx_error(LPX_EINVAL, "lpx_kind_register: %s is NULL", vt ? "out" : "vtable");
    *out = NULL;
    if (vt->struct_size < offsetof(lpx_kind_i, priority) + sizeof vt->priority)
        return lpx_error(LPX_EINVAL, "lpx_kind_register: struct_size %zu is too small", vt->struct_size);
    if (!vt->name || !vt->name[0] || strlen(vt->name) >= LPX_MAX_NAME)
        return lpx_error(LPX_EINVAL, "lpx_kind_register: name is missing or longer than %d", LPX_MAX_NAME - 1);
    if (vt->abi_version != LPX_KIND_ABI_VERSION)
        return lpx_error(LPX_EABI, "lpx_kind_register(%s): abi_version %u, this lpx speaks %u",
                         vt->name, vt->abi_version, LPX_KIND_ABI_VERSION);
    /* the agreement slots come together (read only where struct_size covers them) */
    if (vt->struct_size >= offsetof(lpx_kind_i, sync_apply) + sizeof vt->sync_apply) {
        int set = !!vt->sync_count + !!vt->sync_local + !!vt->sync_apply;
        if (set != 0 && set != 3)
            return lpx_error(LPX_EINVAL, "lpx_kind_register(%s): sync_count, sync_local and sync_apply come together "
                             "(%d of 3 given)", vt->name, set);
    }
    int lo, hi;
    switch (vt->priority) {
    case LPX_PRIORITY_PAYLOAD: lo = LPX_KEY_PAYLOAD_FIRST; hi = LPX_KEY_PAYLOAD_LAST; break;
    case LPX_PRIORITY_WRAPPER: lo = LPX_KEY_WRAPPER_FIRST; hi = LPX_KEY_WRAPPER_LAST; break;
    case LPX_PRIORITY_DISTRIBUTED: lo = LPX_KEY_DIST_FIRST; hi = LPX_KEY_DIST_LAST; break;
    default: return lpx_error(LPX_EINVAL, "lpx_kind_register(%s): priority %d is not an lpx_kind_priority", vt->name, vt->priority);
    }
    if ((st = lpx__journal_reserve("lpx_kind_register"))) return st;
    lpx_kind *k = lpx_calloc(1, sizeof *k);
    if (!k) return lpx_error(LPX_ENOMEM, "lpx_kind_register(%s): cannot allocate kind", vt->name);
    memcpy(&k->vt, vt, vt->struct_size < sizeof *vt ? vt->struct_size : sizeof *vt);
    k->vt.struct_size = sizeof k->vt;
    lpx_registry_lock();
    int key = 0;
    for (int b = lo; b <= hi && !key; b++)
        if (!kind_by_key[b] && !key_poisoned[b]) key = b;
    int n = atomic_load(&nkinds);
    if (name_find(kind_names, vt->name))
        st = lpx_error(LPX_EEXIST, "lpx_kind_register: kind '%s' is already registered", vt->name);
    else if (!key || n >= LPX_NUM_KEYS)
        st = lpx_error(LPX_EFULL, "lpx_kind_register(%s): no free key in priority band %d", vt->name, vt->priority);
    else if (!(st = name_add(&kind_names, vt->name, n, k, "lpx_kind_register"))) {
        k->key = key;
        k->index = n;
        k->registered = true;
        kind_by_key[key] = k;
        kinds[n] = k;
        snprintf(key_names[key], LPX_MAX_NAME, "%s", vt->name);
        atomic_store_explicit(&nkinds, n + 1, memory_order_release);
        *out = k;
    }
    lpx_registry_unlock();
    if (st) lpx_free(k);
    else lpx__journal_note(LPX_REG_KIND, key, 0, k);
    return st;
}

/* `force` (rollback of a failed plugin load) unregisters even while
 * tensors of the kind live: they keep a valid, retired handle. */
static lpx_status kind_unregister(const lpx_kind *ck, bool force)
{
    lpx_kind *k = (lpx_kind *)ck;
    if (!k || !k->registered) return lpx_error(LPX_EINVAL, "lpx_kind_unregister: kind is NULL or not registered");
    lpx_registry_lock();
    lpx_status st = LPX_OK;
    long long live = atomic_load(&k->live);
    if (!k->registered) {
        st = lpx_error(LPX_EINVAL, "lpx_kind_unregister(%s): not registered", k->vt.name);
    } else if (live > 0 && !force) {
        st = lpx_error(LPX_EINVAL, "lpx_kind_unregister(%s): %lld tensors of this kind are alive", k->vt.name, live);
    } else {
        int n = atomic_load(&lpx__nops);
        for (int i = 0; i < n; i++) retire(&lpx__op_row(i)->k[k->key]);
        retire(&lpx__fallbacks[k->key]);
        name_remove(&kind_names, k->vt.name);
        kind_by_key[k->key] = NULL;
        if (live > 0) {
            key_poisoned[k->key] = true;
            snprintf(key_names[k->key], LPX_MAX_NAME, "%.*s (rolled back)", LPX_MAX_NAME - 16, k->vt.name);
        } else {
            key_names[k->key][0] = 0;
        }
        int nk = atomic_load(&nkinds);
        for (int i = k->index; i + 1 < nk; i++) { kinds[i] = kinds[i + 1]; kinds[i]->index = i; }
        kinds[nk - 1] = NULL;
        atomic_store(&nkinds, nk - 1);
        k->registered = false;  /* the handle stays allocated: callers may still hold it */
        k->retired_next = retired_kinds;
        retired_kinds = k;
    }
    lpx_registry_unlock();
    return st;
}

lpx_status lpx_kind_unregister(const lpx_kind *k) { return kind_unregister(k, false); }
lpx_status lpx__kind_unregister_force(const lpx_kind *k) { return kind_unregister(k, true); }

lpx_status lpx_kind_from_dense(const lpx_kind *k, lpx_tensor *x, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_kind_from_dense: out is NULL");
    *out = NULL;
    if (!k || !x) return lpx_error(LPX_EINVAL, "lpx_kind_from_dense: %s is NULL", k ? "x" : "kind");
    if (x->kind)
        return lpx_error(LPX_EINVAL, "lpx_kind_from_dense(%s): x is a '%s' tensor, not dense", k->vt.name,
                         x->kind->vt.name);
    if (!k->vt.from_dense)
        return lpx_error(LPX_ENOTIMPL, "lpx_kind_from_dense: kind '%s' has no from_dense", k->vt.name);
    lpx_status st = k->vt.from_dense(k, x, out);
    if (st && *out) { lpx_tensor_release(*out); *out = NULL; }
    return st;
}

lpx_status lpx_kind_unflatten(const lpx_kind *k, lpx_dtype logical_dtype, int ndim, const int64_t *shape,
                              lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                              lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_kind_unflatten: out is NULL");
    *out = NULL;
    if (!k) return lpx_error(LPX_EINVAL, "lpx_kind_unflatten: kind is NULL");
    const char *kn = k->vt.name;
    if (ndim < 0 || ndim > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "lpx_kind_unflatten(%s): ndim %d out of range 0..%d", kn, ndim, LPX_MAX_DIMS);
    if (ndim && !shape) return lpx_error(LPX_EINVAL, "lpx_kind_unflatten(%s): shape is NULL", kn);
    if (ninner < 0 || ninner > LPX_MAX_INNER)
        return lpx_error(LPX_EINVAL, "lpx_kind_unflatten(%s): ninner %d out of range 0..%d", kn, ninner, LPX_MAX_INNER);
    if (ninner && !inner) return lpx_error(LPX_EINVAL, "lpx_kind_unflatten(%s): inner is NULL", kn);
    for (int i = 0; i < ninner; i++)
        if (!inner[i]) return lpx_error(LPX_EINVAL, "lpx_kind_unflatten(%s): inner[%d] is NULL", kn, i);
    if (meta_size > LPX_MAX_META)
        return lpx_error(LPX_EINVAL, "lpx_kind_unflatten(%s): meta_size %zu exceeds %d", kn, meta_size, LPX_MAX_META);
    if (meta_size && !meta) return lpx_error(LPX_EINVAL, "lpx_kind_unflatten(%s): meta is NULL", kn);
    lpx_status st = k->vt.unflatten
        ? k->vt.unflatten(k, logical_dtype, ndim, shape, inner, ninner, meta, meta_size, out)
        : lpx_tensor_new_kind(k, logical_dtype, ndim, shape, ninner ? lpx_tensor_device(inner[0]) : lpx_cpu(), inner,
                              ninner, meta, meta_size, out);
    if (st && *out) { lpx_tensor_release(*out); *out = NULL; }
    return st;
}

lpx_status lpx_kind_to_dense(lpx_tensor *t, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_kind_to_dense: out is NULL");
    *out = NULL;
    if (!t) return lpx_error(LPX_EINVAL, "lpx_kind_to_dense: t is NULL");
    if (!t->kind) {
        if (t->dtype != LPX_F32) return lpx_cast(t, LPX_F32, false, out);
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    if (!t->kind->vt.to_dense)
        return lpx_error(LPX_ENOTIMPL, "lpx_kind_to_dense: kind '%s' has no to_dense", t->kind->vt.name);
    lpx_status st = t->kind->vt.to_dense(t, out);
    if (st && *out) { lpx_tensor_release(*out); *out = NULL; }
    return st;
}

lpx_status lpx_kind_find(const char *name, const lpx_kind **out)
{
    if (!name || !out) return lpx_error(LPX_EINVAL, "lpx_kind_find: %s is NULL", name ? "out" : "name");
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    lpx_registry_lock();
    name_entry *e = name_find(kind_names, name);
    *out = e ? (const lpx_kind *)e->ptr : NULL;
    lpx_registry_unlock();
    return e ? LPX_OK : lpx_error(LPX_ENOTFOUND, "lpx_kind_find: no kind named '%s'", name);
}

const char *lpx_kind_name(const lpx_kind *k) { return k ? k->vt.name : "dense"; }
int lpx_kind_key(const lpx_kind *k) { return k ? k->key : 0; }
const lpx_kind_i *lpx_kind_vtable(const lpx_kind *k) { return k ? &k->vt : NULL; }
void *lpx_kind_user(const lpx_kind *k) { return k ? k->vt.user : NULL; }
int64_t lpx_kind_live_tensors(const lpx_kind *k) { return k ? atomic_load(&((lpx_kind *)k)->live) : 0; }
int lpx_kind_count(void) { lpx_ensure_init(); return atomic_load(&nkinds); }

const lpx_kind *lpx_kind_at(int i)
{
    lpx_registry_lock();
    const lpx_kind *k = i >= 0 && i < atomic_load(&nkinds) ? kinds[i] : NULL;
    lpx_registry_unlock();
    return k;
}
