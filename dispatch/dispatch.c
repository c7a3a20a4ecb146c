/* The hot path: key set -> highest key -> table[op][key] -> kernel.
 * No hashing, no locks, no allocation. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "dispatch_internal.h"
#include "api_util.h"

static const char *const tag_names[] = {
    "none", "Tensor", "Tensor[]", "int", "float", "bool", "dtype", "str", "ptr", "int[]", "device",
};

static const char *tag_name(unsigned tag) { return tag < sizeof tag_names / sizeof *tag_names ? tag_names[tag] : "?"; }

/* Slow path for a failed argument check: builds the message. */
static lpx_status bad_args(const lpx_call *c, const lpx_op_row *row)
{
    const lpx_schema *s = &row->schema;
    if (c->nargs != s->nargs)
        return lpx_error(LPX_EINVAL, "%s: expected %d arguments (%s), got %d", s->name, s->nargs,
                         row->schema_text, c->nargs);
    if (!c->args && c->nargs) return lpx_error(LPX_EINVAL, "%s: args is NULL", s->name);
    for (int i = 0; i < s->nargs; i++) {
        const lpx_value *v = &c->args[i];
        const lpx_arg_spec *a = &s->args[i];
        if (v->tag == LPX_TAG_NONE && !a->optional)
            return lpx_error(LPX_EINVAL, "%s: argument '%s' is required", s->name, a->name);
        if (v->tag != LPX_TAG_NONE && v->tag != a->tag)
            return lpx_error(LPX_EINVAL, "%s: argument '%s' must be %s, got %s", s->name, a->name,
                             tag_name(a->tag), tag_name(v->tag));
        if (v->tag == LPX_TAG_TENSOR && !v->u.t)
            return lpx_error(LPX_EINVAL, "%s: argument '%s' is a NULL tensor", s->name, a->name);
        if ((v->tag == LPX_TAG_TENSORS || v->tag == LPX_TAG_INTS) && v->len && !v->u.p)
            return lpx_error(LPX_EINVAL, "%s: argument '%s' has %u entries but a NULL pointer", s->name, a->name, v->len);
        if (v->tag == LPX_TAG_TENSORS)
            for (uint32_t j = 0; j < v->len; j++)
                if (!v->u.ts[j]) return lpx_error(LPX_EINVAL, "%s: argument '%s'[%u] is a NULL tensor", s->name, a->name, j);
        if (v->tag == LPX_TAG_DEVICE && !lpx_device_key(v->u.dev.type))
            return lpx_error(LPX_EDEVICE, "%s: argument '%s': no backend for device type %d", s->name, a->name, (int)v->u.dev.type);
    }
    return lpx_error(LPX_EINVAL, "%s: no tensor or device argument to dispatch on", s->name);
}

static void device_str(lpx_device d, char *buf, size_t len)
{
    const lpx_backend_i *b = lpx_backend_for(d.type);
    if (b) snprintf(buf, len, "%s:%d", b->name, (int)d.index);
    else snprintf(buf, len, "device type %d:%d", (int)d.type, (int)d.index);
}

/* Slow path for tensors on different devices: names the op, the first
 * tensor argument and the first one on another device. */
static lpx_status mixed_devices(const lpx_call *c, const lpx_op_row *row)
{
    const lpx_schema *s = &row->schema;
    const lpx_tensor *first = NULL;
    char fname[96] = "", a[64], b[64];
    for (int i = 0; i < s->nargs; i++) {
        const lpx_value *v = &c->args[i];
        uint32_t n = v->tag == LPX_TAG_TENSOR ? 1 : v->tag == LPX_TAG_TENSORS ? v->len : 0;
        for (uint32_t j = 0; j < n; j++) {
            const lpx_tensor *t = v->tag == LPX_TAG_TENSOR ? v->u.t : v->u.ts[j];
            if (((row->host_args >> i) & 1u) && t->device.type == LPX_DEVICE_CPU) continue;
            char name[96];
            if (v->tag == LPX_TAG_TENSOR) snprintf(name, sizeof name, "'%s'", s->args[i].name);
            else snprintf(name, sizeof name, "'%s'[%u]", s->args[i].name, j);
            if (!first) {
                first = t;
                snprintf(fname, sizeof fname, "%s", name);
            } else if (t->device.type != first->device.type || t->device.index != first->device.index) {
                device_str(first->device, a, sizeof a);
                device_str(t->device, b, sizeof b);
                return lpx_error(LPX_EDEVICE, "%s: tensors on different devices: %s is on %s, %s on %s (move them "
                                 "with lpx_tensor_to first)", s->name, fname, a, name, b);
            }
        }
    }
    return lpx_error(LPX_EDEVICE, "%s: tensors on different devices", s->name);
}

static lpx_status not_implemented(const lpx_call *c, const lpx_op_row *row, int key)
{
    return lpx_error(LPX_ENOTIMPL, "%s: no kernel for key '%s'%s and no fallback", row->schema.name,
                     lpx_key_name(key), key >= LPX_KEY_PAYLOAD_FIRST ? " (a kind)" : " (a backend)");
    (void)c;
}

/* Dense dispatch of an op with a spec family: its contract, checked once
 * here for every backend. The kernel gets a copy of the call in an
 * lpx_op_frame, the checked arguments right after it (lpx_op_args_of: a
 * fixed offset from c, no pointer to follow); the caller's lpx_call keeps
 * its 1.x size, and gets the kernel's rets back. */
static inline lpx_status run_spec(lpx_call *c, const lpx_op_row *row, lpx_kernel_fn fn, bool fallback)
{
    lpx_op_frame f;
    lpx_op op = c->op;
    int key = c->key;
    __asm__("" : "+r"(op), "+r"(key));   /* two scalar stores, as the kernel reads them */
    f.call.op = op;
    f.call.key = key;
    f.call.keys = c->keys;
    f.call.nargs = c->nargs;
    f.call.nrets = 0;
    f.call.args = c->args;
    f.call.kernel_data = c->kernel_data;
    /* the hot family's common case inline (no call); the rest by pointer */
    lpx_status st = row->spec == lpx__spec_binary ? lpx__spec_binary_fast(c, &f.args)
                                                  : row->spec(&f.call, &f.args);
    if (LPX_UNLIKELY(st)) return st;
    if (LPX_UNLIKELY(atomic_load_explicit(&lpx__trace_on, memory_order_relaxed)))
        st = lpx__trace_invoke(&f.call, fn, fallback);
    else
        st = fn(&f.call);
    /* the rets back. Word by word, as kernels write them (lpx_v_tensor:
     * the tag word, then the pointer): one 16-byte load over two 8-byte
     * stores just made cannot be store-forwarded and stalls the call. */
    int n = f.call.nrets;
    c->nrets = n;
    for (int i = 0; i < n && i < LPX_MAX_RETS; i++) {
        uint64_t w0, w1;
        memcpy(&w0, (const char *)&f.call.rets[i], 8);
        memcpy(&w1, (const char *)&f.call.rets[i] + 8, 8);
        __asm__("" : "+r"(w0), "+r"(w1));   /* two general-register loads, not one vector */
        memcpy((char *)&c->rets[i], &w0, 8);
        memcpy((char *)&c->rets[i] + 8, &w1, 8);
    }
    return st;
}

/* The same for a call that is already the head of an lpx_op_frame (the
 * library's own typed API, dispatch/api_util.h): the arguments go
 * straight behind it and the kernel runs on c itself. */
static inline lpx_status run_spec_in_frame(lpx_op_frame *f, const lpx_op_row *row, lpx_kernel_fn fn, bool fallback)
{
    lpx_call *c = &f->call;
    lpx_status st = row->spec == lpx__spec_binary ? lpx__spec_binary_fast(c, &f->args) : row->spec(c, &f->args);
    if (LPX_UNLIKELY(st)) return st;
    if (LPX_UNLIKELY(atomic_load_explicit(&lpx__trace_on, memory_order_relaxed)))
        return lpx__trace_invoke(c, fn, fallback);
    return fn(c);
}

/* Runs the kernel for the highest key of c->keys. f: c's frame, when the
 * caller knows c heads one (else NULL: a call of any origin). */
static inline lpx_status run(lpx_call *c, const lpx_op_row *row, lpx_op_frame *f)
{
    int key = 63 - __builtin_clzll(c->keys);
    lpx_kernel_entry *e = atomic_load_explicit(&row->k[key], memory_order_acquire);
    bool fallback = false;
    if (LPX_UNLIKELY(!e)) {
        e = atomic_load_explicit(&lpx__fallbacks[key], memory_order_acquire);
        if (!e) return not_implemented(c, row, key);
        fallback = true;
    }
    c->key = key;
    c->kernel_data = e->data;
    c->nrets = 0;
    if (row->spec && key <= LPX_KEY_BACKEND_LAST)
        return f ? run_spec_in_frame(f, row, e->fn, fallback) : run_spec(c, row, e->fn, fallback);
    if (LPX_UNLIKELY(atomic_load_explicit(&lpx__trace_on, memory_order_relaxed)))
        return lpx__trace_invoke(c, e->fn, fallback);
    return e->fn(c);
}

/* The `binary` family's common case from the library's typed API, in one
 * pass (rows with binary_direct): the schema's tags, the key set, the
 * one-device rule and the family's contract (lpx__spec_binary_fast's
 * checks) over the same loads, then the backend kernel on f's call.
 * Returns false, having changed nothing the general path reads, for
 * anything else (a kind, a fallback key, another device per tensor, a
 * broadcast, a bad argument: every message is the general path's); true
 * with the kernel's status in *out when it ran the kernel. */
static inline __attribute__((always_inline)) bool binary_direct(lpx_op_frame *f, const lpx_op_row *row, lpx_status *out)
{
    lpx_call *c = &f->call;
    const lpx_value *v = c->args;
    lpx_tensor *x = v[0].u.t, *y = v[1].u.t, *o = NULL;
    if (LPX_UNLIKELY((v[0].tag != LPX_TAG_TENSOR) | (v[1].tag != LPX_TAG_TENSOR) | !x | !y)) return false;
    if (c->nargs > 2) {
        if (v[2].tag == LPX_TAG_TENSOR) {
            o = v[2].u.t;
            if (LPX_UNLIKELY(!o)) return false;
        } else if (LPX_UNLIKELY(v[2].tag != LPX_TAG_NONE)) {
            return false;
        }
    }
    const lpx_tensor *r = o ? o : y;   /* out's checks, or y's again */
    /* a kind's call (the kind key is the highest) leaves at once */
    uint64_t keys = x->keys | y->keys | r->keys;
    if (LPX_UNLIKELY(keys >> (LPX_KEY_BACKEND_LAST + 1) | !keys)) return false;
    int n = x->ndim;
    lpx_dtype dt = x->dtype;
    uint64_t dx, dy, dr;
    _Static_assert(sizeof(lpx_device) == 8, "a device compares as one word");
    memcpy(&dx, &x->device, 8);
    memcpy(&dy, &y->device, 8);
    memcpy(&dr, &r->device, 8);
    /* every mismatch ORed into one word: one device; dense (no kind, so
     * the key set is backend keys only), built-in dtypes, one rank; out
     * (when given) of a's dtype and writable */
    uint64_t bad = (dx ^ dy) | (dx ^ dr) | (uint64_t)(uintptr_t)x->kind | (uint64_t)(uintptr_t)y->kind |
                   (uint64_t)(uintptr_t)r->kind | (uint64_t)((unsigned)dt >= LPX_DTYPE_BUILTIN_COUNT) |
                   (uint64_t)((unsigned)y->dtype >= LPX_DTYPE_BUILTIN_COUNT) | (uint64_t)(uint32_t)(n ^ y->ndim) |
                   (uint64_t)(uint32_t)(n ^ r->ndim);
    if (o) bad |= (uint64_t)(uint32_t)(o->dtype ^ dt);
    if (LPX_UNLIKELY(bad)) return false;
    if (o && LPX_UNLIKELY(o->storage->readonly)) return false;   /* dense: it has a storage */
    int key = 63 - __builtin_clzll(keys);
    lpx_kernel_entry *e = atomic_load_explicit(&row->k[key], memory_order_acquire);
    if (LPX_UNLIKELY(!e)) return false;   /* the key's fallback: the general path */
    lpx_binary_args *a = &f->args.binary;
    bool flat;
    if (LPX_UNLIKELY(!lpx__binary_shapes(x, y, r, n, a, &flat))) return false;   /* a broadcast: the general path */
    c->keys = keys;
    c->key = key;
    c->kernel_data = e->data;
    lpx__binary_fill(a, x, y, o, n, dt, flat);
    if (LPX_UNLIKELY(atomic_load_explicit(&lpx__trace_on, memory_order_relaxed)))
        *out = lpx__trace_invoke(c, e->fn, false);
    else
        *out = e->fn(c);
    return true;
}

static inline __attribute__((always_inline)) lpx_status dispatch(lpx_call *c, lpx_op_frame *f)
{
    if (LPX_UNLIKELY(!c)) return lpx_error(LPX_EINVAL, "lpx_dispatch: call is NULL");
    lpx_status st = lpx_ensure_init();
    if (LPX_UNLIKELY(st)) return st;
    c->nrets = 0;
    lpx_op op = c->op;
    if (LPX_UNLIKELY(op < 0 || op >= atomic_load_explicit(&lpx__nops, memory_order_acquire)))
        return lpx_error(LPX_EINVAL, "lpx_dispatch: unknown op id %d", (int)op);
    const lpx_op_row *row = lpx__op_row(op);
    const lpx_schema *s = &row->schema;
    if (LPX_UNLIKELY(c->nargs != s->nargs || (!c->args && c->nargs))) return bad_args(c, row);
    if (f && row->binary_direct && LPX_LIKELY(binary_direct(f, row, &st))) {
        if (LPX_UNLIKELY(st)) lpx_call_release_rets(c);
        return st;
    }

    /* one pass: check tags, collect the key set, and note whether every
     * tensor lives on the first one's device */
    uint64_t keys = 0;
    bool ok = true, mixed = false;
    const lpx_tensor *first = NULL;
    for (int i = 0; i < s->nargs; i++) {
        const lpx_value *v = &c->args[i];
        const lpx_arg_spec *a = &s->args[i];
        if (v->tag == a->tag) {
            if (v->tag == LPX_TAG_TENSOR) {
                const lpx_tensor *t = v->u.t;
                if (LPX_UNLIKELY(!t)) { ok = false; break; }
                keys |= t->keys;
                /* a Tensor(host) argument on the CPU sits beside any device */
                if (LPX_UNLIKELY((row->host_args >> i) & 1u) && t->device.type == LPX_DEVICE_CPU) continue;
                if (!first) first = t;
                mixed |= t->device.type != first->device.type || t->device.index != first->device.index;
            } else if (v->tag == LPX_TAG_TENSORS) {
                if (LPX_UNLIKELY(v->len && !v->u.ts)) { ok = false; break; }
                /* every element: a later one may carry the highest key */
                for (uint32_t j = 0; j < v->len; j++) {
                    const lpx_tensor *t = v->u.ts[j];
                    if (LPX_UNLIKELY(!t)) { ok = false; break; }
                    keys |= t->keys;
                    if (!first) first = t;
                    mixed |= t->device.type != first->device.type || t->device.index != first->device.index;
                }
            } else if (v->tag == LPX_TAG_DEVICE) {
                int k = lpx_device_key(v->u.dev.type);
                if (LPX_UNLIKELY(!k)) { ok = false; break; }
                keys |= UINT64_C(1) << k;
            } else if (LPX_UNLIKELY(v->tag == LPX_TAG_INTS && v->len && !v->u.ints)) {
                ok = false; break;
            }
        } else if (!(v->tag == LPX_TAG_NONE && a->optional)) {
            ok = false; break;
        }
    }
    if (LPX_UNLIKELY(!ok || !keys)) return bad_args(c, row);
    if (LPX_UNLIKELY(mixed) && !row->cross_device) return mixed_devices(c, row);
    c->keys = keys;
    st = run(c, row, f);
    if (LPX_UNLIKELY(st)) lpx_call_release_rets(c);
    return st;
}

lpx_status lpx_dispatch(lpx_call *c) { return dispatch(c, NULL); }

lpx_status lpx__dispatch_frame(lpx_op_frame *f) { return dispatch(&f->call, f); }

lpx_status lpx_redispatch(lpx_call *c)
{
    if (!c) return lpx_error(LPX_EINVAL, "lpx_redispatch: call is NULL");
    const lpx_op_row *row = lpx__op_row(c->op);
    int key = c->key;
    void *data = c->kernel_data;
    uint64_t keys = c->keys;
    c->keys &= (UINT64_C(1) << key) - 1;
    if (!c->keys) {
        c->keys = keys;
        return lpx_error(LPX_ENOTIMPL, "%s: redispatch below key '%s' finds no key left", row->schema.name,
                         lpx_key_name(key));
    }
    lpx_status st = run(c, row, NULL);   /* c: any origin */
    if (st) lpx_call_release_rets(c);
    c->key = key;
    c->kernel_data = data;
    c->keys = keys;
    return st;
}

void lpx_call_release_rets(lpx_call *c)
{
    if (!c) return;
    for (int i = 0; i < c->nrets && i < LPX_MAX_RETS; i++) {
        if (c->rets[i].tag == LPX_TAG_TENSOR) lpx_tensor_release(c->rets[i].u.t);
        c->rets[i].tag = LPX_TAG_NONE;
    }
    c->nrets = 0;
}

size_t lpx_op_spec_size(lpx_op op)
{
    if (lpx_ensure_init() || op < 0 || op >= atomic_load_explicit(&lpx__nops, memory_order_acquire)) return 0;
    const lpx_op_row *row = lpx__op_row(op);
    return row->spec ? row->spec_size : 0;
}

lpx_status lpx_op_spec_run(lpx_op_frame *f, size_t size)
{
    if (!f) return lpx_error(LPX_EINVAL, "lpx_op_spec_run: frame is NULL");
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    lpx_call *c = &f->call;
    if (c->op < 0 || c->op >= atomic_load_explicit(&lpx__nops, memory_order_acquire))
        return lpx_error(LPX_EINVAL, "lpx_op_spec_run: unknown op id %d", (int)c->op);
    const lpx_op_row *row = lpx__op_row(c->op);
    if (!row->spec) return lpx_error(LPX_EINVAL, "lpx_op_spec_run: op '%s' has no spec family", row->schema.name);
    size_t need = offsetof(lpx_op_frame, args) + row->spec_size;
    if (size < need)
        return lpx_error(LPX_EINVAL, "lpx_op_spec_run: %s's frame needs %zu bytes, got %zu", row->schema.name, need,
                         size);
    if (c->nargs != row->schema.nargs || !c->args) return bad_args(c, row);
    return row->spec(c, &f->args);
}
