/* Typed C kernels: lpx_status f(lpx_tensor*, double, lpx_tensor**) and
 * friends, called from the boxed world through a libffi cif prepared once
 * at registration. */
#include <ffi.h>
#include <string.h>
#include "dispatch_internal.h"

#define MAX_SLOTS (2 * LPX_MAX_ARGS + LPX_MAX_RETS)

typedef struct typed_kernel {
    ffi_cif cif;
    ffi_type *types[MAX_SLOTS];
    ffi_type device_type;          /* struct {int32, int32} */
    ffi_type *device_elems[3];
    int nslots;
    lpx_schema sig;
    void (*fn)(void);
} typed_kernel;

typedef union slot {
    void *p;
    int64_t i;
    double f;
    uint8_t b;
    int32_t d;
    lpx_device dev;
} slot;

static lpx_status typed_trampoline(lpx_call *c)
{
    const typed_kernel *tk = c->kernel_data;
    slot vals[MAX_SLOTS];
    void *ptrs[MAX_SLOTS];
    lpx_tensor *rets[LPX_MAX_RETS] = {0};
    int n = 0;
    for (int i = 0; i < tk->sig.nargs; i++) {
        const lpx_value *v = &c->args[i];
        bool none = v->tag == LPX_TAG_NONE;
        switch (tk->sig.args[i].tag) {
        case LPX_TAG_TENSOR: vals[n++].p = none ? NULL : v->u.t; break;
        case LPX_TAG_TENSORS:
            vals[n++].p = none ? NULL : (void *)v->u.ts;
            vals[n++].i = none ? 0 : v->len;
            break;
        case LPX_TAG_INTS:
            vals[n++].p = none ? NULL : (void *)v->u.ints;
            vals[n++].i = none ? 0 : v->len;
            break;
        case LPX_TAG_I64: vals[n++].i = none ? 0 : v->u.i; break;
        case LPX_TAG_F64: vals[n++].f = none ? 0.0 : v->u.f; break;
        case LPX_TAG_BOOL: vals[n++].b = none ? 0 : v->u.b; break;
        case LPX_TAG_DTYPE: vals[n++].d = none ? -1 : v->u.d; break;
        case LPX_TAG_STR: vals[n++].p = none ? NULL : (void *)v->u.s; break;
        case LPX_TAG_PTR: vals[n++].p = none ? NULL : v->u.p; break;
        case LPX_TAG_DEVICE: vals[n++].dev = v->u.dev; break;
        default: return lpx_error(LPX_EINTERNAL, "typed kernel: bad tag");
        }
    }
    for (int r = 0; r < tk->sig.nrets; r++) vals[n++].p = &rets[r];
    for (int i = 0; i < n; i++) ptrs[i] = &vals[i];
    ffi_sarg result = 0;
    ffi_call((ffi_cif *)&tk->cif, tk->fn, &result, ptrs);
    lpx_status st = (lpx_status)(int)result;
    if (st) {
        for (int r = 0; r < tk->sig.nrets; r++) lpx_tensor_release(rets[r]);
        return st;
    }
    for (int r = 0; r < tk->sig.nrets; r++) c->rets[r] = lpx_v_tensor(rets[r]);
    c->nrets = tk->sig.nrets;
    return LPX_OK;
}

lpx_status lpx_ffi_entry_new(const lpx_schema *sig, void (*fn)(void), lpx_kernel_entry **out)
{
    typed_kernel *tk = lpx_calloc(1, sizeof *tk);
    lpx_kernel_entry *e = lpx_calloc(1, sizeof *e);
    if (!tk || !e) {
        lpx_free(tk);
        lpx_free(e);
        return lpx_error(LPX_ENOMEM, "lpx_kernel_register_typed(%s): cannot allocate", sig->name);
    }
    tk->sig = *sig;
    tk->fn = fn;
    tk->device_elems[0] = &ffi_type_sint32;
    tk->device_elems[1] = &ffi_type_sint32;
    tk->device_elems[2] = NULL;
    tk->device_type.size = 0;
    tk->device_type.alignment = 0;
    tk->device_type.type = FFI_TYPE_STRUCT;
    tk->device_type.elements = tk->device_elems;
    int n = 0;
    for (int i = 0; i < sig->nargs; i++) {
        switch (sig->args[i].tag) {
        case LPX_TAG_TENSORS:
        case LPX_TAG_INTS:
            tk->types[n++] = &ffi_type_pointer;
            tk->types[n++] = &ffi_type_sint64;
            break;
        case LPX_TAG_I64: tk->types[n++] = &ffi_type_sint64; break;
        case LPX_TAG_F64: tk->types[n++] = &ffi_type_double; break;
        case LPX_TAG_BOOL: tk->types[n++] = &ffi_type_uint8; break;
        case LPX_TAG_DTYPE: tk->types[n++] = &ffi_type_sint32; break;
        case LPX_TAG_DEVICE: tk->types[n++] = &tk->device_type; break;
        default: tk->types[n++] = &ffi_type_pointer; break;
        }
    }
    for (int r = 0; r < sig->nrets; r++) tk->types[n++] = &ffi_type_pointer;
    tk->nslots = n;
    if (ffi_prep_cif(&tk->cif, FFI_DEFAULT_ABI, (unsigned)n, &ffi_type_sint, tk->types) != FFI_OK) {
        lpx_free(tk);
        lpx_free(e);
        return lpx_error(LPX_EINVAL, "lpx_kernel_register_typed(%s): libffi cannot prepare the call", sig->name);
    }
    e->fn = typed_trampoline;
    e->data = tk;
    *out = e;
    return LPX_OK;
}
