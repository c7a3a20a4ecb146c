/* DLPack import/export (include/lpx/dlpack.h). Zero-copy both ways:
 * export retains the lpx tensor inside the managed struct; import wraps the
 * producer's memory with lpx_tensor_from_blob and a deleter that calls the
 * producer's deleter once, when the last view dies. */
#include <stdint.h>
#include <stdio.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include "lpx/lpx.h"
#include "lpx/dlpack.h"
#include "core/lpx_internal.h"

/* Prefixes the current error message with "op ctx: " (copies it first:
 * lpx_error writes the same thread-local buffer). */
static lpx_status rewrap(lpx_status st, const char *op, const char *ctx)
{
    char msg[900];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    return lpx_error(st, "%s%s: %s", op, ctx, msg);
}

/* ---- dtypes */

static lpx_dtype named(const char *name)
{
    lpx_dtype d = lpx_dtype_from_name(name);
    return d >= 0 ? d : -1;
}

lpx_status lpx_dlpack_dtype_to(lpx_dtype d, DLDataType *out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_dlpack_dtype_to: out is NULL");
    const lpx_dtype_traits *tr = lpx_dtype_get(d);
    if (!tr) return lpx_error(LPX_EDTYPE, "lpx_dlpack_dtype_to: unknown dtype %d", (int)d);
    DLDataType t = {0, (uint8_t)tr->bits, 1};
    switch (d) {
    case LPX_F32: case LPX_F16: t.code = kDLFloat; break;
    case LPX_BF16: t.code = kDLBfloat; break;
    case LPX_F8E4M3FN: t.code = kDLFloat8_e4m3fn; break;
    case LPX_F8E5M2: t.code = kDLFloat8_e5m2; break;
    case LPX_U8: t.code = kDLUInt; break;
    case LPX_I8: case LPX_I32: case LPX_I64: t.code = kDLInt; break;
    case LPX_BOOL: t.code = kDLBool; t.bits = 8; break;
    default:
        if (!strcmp(tr->name, "e8m0")) t.code = kDLFloat8_e8m0fnu;
        else if (!strcmp(tr->name, "f4e2m1")) t.code = kDLFloat4_e2m1fn;
        else return lpx_error(LPX_EDTYPE, "lpx_dlpack_dtype_to: dtype %s has no DLPack type code", tr->name);
    }
    *out = t;
    return LPX_OK;
}

lpx_status lpx_dlpack_dtype_from(DLDataType t, lpx_dtype *out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_dlpack_dtype_from: out is NULL");
    if (t.lanes != 1)
        return lpx_error(LPX_EDTYPE, "lpx_dlpack_dtype_from: %u lanes (vector types are not supported)", (unsigned)t.lanes);
    lpx_dtype d = -1;
    const char *plugin = NULL;
    switch (t.code) {
    case kDLFloat: d = t.bits == 32 ? LPX_F32 : t.bits == 16 ? LPX_F16 : -1; break;
    case kDLBfloat: d = t.bits == 16 ? LPX_BF16 : -1; break;
    case kDLFloat8_e4m3fn: d = t.bits == 8 ? LPX_F8E4M3FN : -1; break;
    case kDLFloat8_e5m2: d = t.bits == 8 ? LPX_F8E5M2 : -1; break;
    case kDLUInt: d = t.bits == 8 ? LPX_U8 : -1; break;
    case kDLInt: d = t.bits == 8 ? LPX_I8 : t.bits == 32 ? LPX_I32 : t.bits == 64 ? LPX_I64 : -1; break;
    case kDLBool: d = t.bits == 8 ? LPX_BOOL : -1; break;
    case kDLFloat8_e8m0fnu: plugin = "e8m0"; if (t.bits == 8) d = named(plugin); break;
    case kDLFloat4_e2m1fn: plugin = "f4e2m1"; if (t.bits == 4) d = named(plugin); break;
    default:
        return lpx_error(LPX_EDTYPE, "lpx_dlpack_dtype_from: type code %u (bits %u) has no lpx dtype",
                         (unsigned)t.code, (unsigned)t.bits);
    }
    if (d < 0) {
        if (plugin && (t.bits == 8 || t.bits == 4))
            return lpx_error(LPX_EDTYPE, "lpx_dlpack_dtype_from: type code %u needs dtype %s, which is not "
                             "registered (load the MX plugin)", (unsigned)t.code, plugin);
        return lpx_error(LPX_EDTYPE, "lpx_dlpack_dtype_from: type code %u with %u bits has no lpx dtype",
                         (unsigned)t.code, (unsigned)t.bits);
    }
    *out = d;
    return LPX_OK;
}

/* ---- export */

typedef struct export_ctx {
    lpx_tensor *t;
    int64_t shape[LPX_MAX_DIMS];
    int64_t strides[LPX_MAX_DIMS];
} export_ctx;

typedef struct export_v {
    DLManagedTensorVersioned m;
    export_ctx c;
} export_v;

typedef struct export_l {
    DLManagedTensor m;
    export_ctx c;
} export_l;

static void export_v_deleter(DLManagedTensorVersioned *m)
{
    if (!m) return;
    export_v *e = (export_v *)m;
    lpx_tensor_release(e->c.t);
    lpx_free(e);
}

static void export_l_deleter(DLManagedTensor *m)
{
    if (!m) return;
    export_l *e = (export_l *)m;
    lpx_tensor_release(e->c.t);
    lpx_free(e);
}

static lpx_status fill_dltensor(const char *op, lpx_tensor *t, DLTensor *dl, export_ctx *c)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: tensor is NULL", op);
    if (lpx_tensor_kind(t))
        return lpx_error(LPX_EINVAL, "%s: tensor is of kind '%s'; export its inner tensors with lpx_dlpack_flatten",
                         op, lpx_kind_name(lpx_tensor_kind(t)));
    lpx_status st = lpx_dlpack_dtype_to(lpx_tensor_dtype(t), &dl->dtype);
    if (st) return lpx_error(st, "%s: dtype %s has no DLPack type code", op, lpx_dtype_name(lpx_tensor_dtype(t)));
    lpx_device dev = lpx_tensor_device(t);
    if (dev.type == LPX_DEVICE_CPU) dl->device.device_type = kDLCPU;
    else if (dev.type == LPX_DEVICE_CUDA) dl->device.device_type = kDLCUDA;
    else if (dev.type == LPX_DEVICE_SIM) dl->device.device_type = kDLExtDev;   /* DLPack's test extension device */
    else return lpx_error(LPX_EDEVICE, "%s: device type %d has no DLPack device", op, (int)dev.type);
    dl->device.device_id = dev.index;
    const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(t));
    if (tr->bits < 8 && (!lpx_tensor_is_contiguous(t) || (lpx_tensor_offset(t) * tr->bits) % 8))
        return lpx_error(LPX_EINVAL, "%s: a %s tensor (sub-byte) must be contiguous and byte-aligned to export",
                         op, tr->name);
    int nd = lpx_tensor_ndim(t);
    memcpy(c->shape, lpx_tensor_shape(t), (size_t)nd * sizeof(int64_t));
    memcpy(c->strides, lpx_tensor_strides(t), (size_t)nd * sizeof(int64_t));
    dl->data = lpx_tensor_data(t);
    dl->ndim = nd;
    dl->shape = c->shape;
    dl->strides = c->strides;
    dl->byte_offset = 0;
    c->t = t;
    return LPX_OK;
}

lpx_status lpx_to_dlpack(lpx_tensor *t, DLManagedTensorVersioned **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_to_dlpack: out is NULL");
    *out = NULL;
    export_v *e = lpx_calloc(1, sizeof *e);
    if (!e) return lpx_error(LPX_ENOMEM, "lpx_to_dlpack: cannot allocate the managed tensor");
    if ((st = fill_dltensor("lpx_to_dlpack", t, &e->m.dl_tensor, &e->c))) {
        lpx_free(e);
        return st;
    }
    e->m.version.major = DLPACK_MAJOR_VERSION;
    e->m.version.minor = DLPACK_MINOR_VERSION;
    e->m.manager_ctx = e;
    e->m.deleter = export_v_deleter;
    e->m.flags = lpx_tensor_is_readonly(t) ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    lpx_tensor_retain(t);
    *out = &e->m;
    return LPX_OK;
}

lpx_status lpx_to_dlpack_legacy(lpx_tensor *t, bool allow_readonly, DLManagedTensor **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_to_dlpack_legacy: out is NULL");
    *out = NULL;
    if (t && lpx_tensor_is_readonly(t) && !allow_readonly)
        return lpx_error(LPX_EINVAL, "lpx_to_dlpack_legacy: the tensor is read-only and the legacy "
                         "DLManagedTensor cannot say so (use lpx_to_dlpack)");
    export_l *e = lpx_calloc(1, sizeof *e);
    if (!e) return lpx_error(LPX_ENOMEM, "lpx_to_dlpack_legacy: cannot allocate the managed tensor");
    if ((st = fill_dltensor("lpx_to_dlpack_legacy", t, &e->m.dl_tensor, &e->c))) {
        lpx_free(e);
        return st;
    }
    e->m.manager_ctx = e;
    e->m.deleter = export_l_deleter;
    lpx_tensor_retain(t);
    *out = &e->m;
    return LPX_OK;
}

/* ---- import */

static void import_v_deleter(void *data, void *ctx)
{
    (void)data;
    DLManagedTensorVersioned *m = ctx;
    if (m->deleter) m->deleter(m);
}

static void import_l_deleter(void *data, void *ctx)
{
    (void)data;
    DLManagedTensor *m = ctx;
    if (m->deleter) m->deleter(m);
}

static lpx_status import_dl(const char *op, const DLTensor *dl, lpx_deleter del, void *ctx, uint64_t flags,
                            lpx_tensor **out)
{
    if (dl->ndim < 0 || dl->ndim > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "%s: ndim %d out of range 0..%d", op, (int)dl->ndim, LPX_MAX_DIMS);
    if (dl->ndim > 0 && !dl->shape) return lpx_error(LPX_EINVAL, "%s: shape is NULL with ndim %d", op, (int)dl->ndim);
    for (int i = 0; i < dl->ndim; i++) {
        if (dl->shape[i] < 0)
            return lpx_error(LPX_EINVAL, "%s: shape[%d] = %lld is negative", op, i, (long long)dl->shape[i]);
        if (dl->strides && dl->strides[i] < 0)
            return lpx_error(LPX_EINVAL, "%s: strides[%d] = %lld is negative (lpx views have non-negative strides)",
                             op, i, (long long)dl->strides[i]);
    }
    /* every later walk over the dims (strides, extents) relies on this */
    int64_t numel;
    lpx_status st = lpx_shape_numel(op, dl->ndim, dl->shape, &numel);
    if (st) return st;
    lpx_dtype d;
    st = lpx_dlpack_dtype_from(dl->dtype, &d);
    if (st) return lpx_error(st, "%s: type code %u, %u bits, %u lanes has no lpx dtype", op,
                             (unsigned)dl->dtype.code, (unsigned)dl->dtype.bits, (unsigned)dl->dtype.lanes);
    const lpx_dtype_traits *tr = lpx_dtype_get(d);
    if (tr->bits < 8) {
        if (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)
            return lpx_error(LPX_EINVAL, "%s: padded sub-byte %s tensors are not supported (lpx packs them)", op, tr->name);
        if (dl->strides) {
            int64_t s = 1;
            for (int i = dl->ndim - 1; i >= 0; i--) {
                if (dl->shape[i] != 1 && dl->strides[i] != s)
                    return lpx_error(LPX_EINVAL, "%s: sub-byte %s tensors must be contiguous", op, tr->name);
                s *= dl->shape[i];
            }
        }
    }
    lpx_device dev = {0, dl->device.device_id};
    switch (dl->device.device_type) {
    case kDLCPU: case kDLCUDAHost: dev.type = LPX_DEVICE_CPU; dev.index = 0; break;
    case kDLCUDA: case kDLCUDAManaged: dev.type = LPX_DEVICE_CUDA; break;
    case kDLExtDev: dev.type = LPX_DEVICE_SIM; break;   /* lpx-simdev.so's simulated device */
    default:
        return lpx_error(LPX_EDEVICE, "%s: DLPack device type %d has no lpx device", op, (int)dl->device.device_type);
    }
    if (!lpx_backend_for(dev.type))
        return lpx_error(LPX_EDEVICE, "%s: DLPack device %s:%d has no lpx backend in this process (load the "
                         "CUDA backend plugin, or lpx-simdev.so for kDLExtDev)", op, dev.type == LPX_DEVICE_CUDA ? "kDLCUDA" : "kDLExtDev",
                         (int)dl->device.device_id);
    bool empty = false;
    for (int i = 0; i < dl->ndim; i++) empty |= dl->shape[i] == 0;
    if (!dl->data && !empty) return lpx_error(LPX_EINVAL, "%s: data is NULL", op);
    /* no pointer arithmetic on NULL or past the address space (UB) */
    if (dl->data && dl->byte_offset > UINTPTR_MAX - (uintptr_t)dl->data)
        return lpx_error(LPX_ERANGE, "%s: byte_offset %llu runs past the end of the address space", op,
                         (unsigned long long)dl->byte_offset);
    char *base = dl->data ? (char *)dl->data + dl->byte_offset : NULL;
    /* the kernels load whole elements: a misaligned one is UB on their side */
    if (base && tr->bits >= 16 && (uintptr_t)base % (uintptr_t)(tr->bits / 8))
        return lpx_error(LPX_EINVAL, "%s: data + byte_offset (%p) is not aligned to the %d-byte %s element", op,
                         (void *)base, tr->bits / 8, tr->name);
    if ((st = lpx_tensor_from_blob(base, d, dl->ndim, dl->shape, dl->strides, dev, del, ctx, out)))
        return rewrap(st, op, "");
    if (flags & DLPACK_FLAG_BITMASK_READ_ONLY) lpx_tensor_mark_readonly(*out);
    return LPX_OK;
}

lpx_status lpx_from_dlpack(DLManagedTensorVersioned *m, lpx_tensor **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_from_dlpack: out is NULL");
    *out = NULL;
    if (!m) return lpx_error(LPX_EINVAL, "lpx_from_dlpack: managed tensor is NULL");
    if (m->version.major != DLPACK_MAJOR_VERSION)
        return lpx_error(LPX_EABI, "lpx_from_dlpack: DLPack version %u.%u, lpx reads major version %d",
                         (unsigned)m->version.major, (unsigned)m->version.minor, DLPACK_MAJOR_VERSION);
    return import_dl("lpx_from_dlpack", &m->dl_tensor, import_v_deleter, m, m->flags, out);
}

lpx_status lpx_from_dlpack_legacy(DLManagedTensor *m, lpx_tensor **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_from_dlpack_legacy: out is NULL");
    *out = NULL;
    if (!m) return lpx_error(LPX_EINVAL, "lpx_from_dlpack_legacy: managed tensor is NULL");
    return import_dl("lpx_from_dlpack_legacy", &m->dl_tensor, import_l_deleter, m, 0, out);
}

/* ---- kinds */

char *lpx_kind_inner_name(const lpx_kind *kind, int i, char *buf, size_t len)
{
    static const char *const f8[] = {"data", "scale", "scale_inv"};
    static const char *const nf4[] = {"codes", "qscalers", "factors", "mean"};
    static const char *const mx[] = {"elements", "scales"};
    if (!buf || !len) return buf;
    const char *kn = kind ? lpx_kind_name(kind) : "";
    const char *n = NULL;
    if (!strcmp(kn, "float8") && i >= 0 && i < 3) n = f8[i];
    else if (!strcmp(kn, "nf4") && i >= 0 && i < 4) n = nf4[i];
    else if (!strncmp(kn, "mx", 2) && i >= 0 && i < 2) n = mx[i];
    if (n) snprintf(buf, len, "%s", n);
    else snprintf(buf, len, "inner%d", i);
    return buf;
}

void lpx_dlpack_flat_release(lpx_dlpack_flat *flat)
{
    if (!flat) return;
    for (int i = 0; i < LPX_MAX_INNER; i++) {
        DLManagedTensorVersioned *m = flat->inner[i];
        flat->inner[i] = NULL;
        if (m && m->deleter) m->deleter(m);
    }
}

lpx_status lpx_dlpack_flatten(const lpx_tensor *t, lpx_dlpack_flat *out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_dlpack_flatten: out is NULL");
    memset(out, 0, sizeof *out);
    if (!t) return lpx_error(LPX_EINVAL, "lpx_dlpack_flatten: tensor is NULL");
    const lpx_kind *k = lpx_tensor_kind(t);
    if (!k) return lpx_error(LPX_EINVAL, "lpx_dlpack_flatten: tensor is dense; export it with lpx_to_dlpack");
    snprintf(out->kind, sizeof out->kind, "%s", lpx_kind_name(k));
    out->logical_dtype = lpx_tensor_dtype(t);
    out->ndim = lpx_tensor_ndim(t);
    memcpy(out->shape, lpx_tensor_shape(t), (size_t)out->ndim * sizeof(int64_t));
    const void *meta = lpx_tensor_meta(t, &out->meta_size);
    if (out->meta_size) memcpy(out->meta, meta, out->meta_size);
    int n = lpx_tensor_inner_count(t);
    for (int i = 0; i < n; i++) {
        lpx_tensor *in = lpx_tensor_inner(t, i);
        lpx_kind_inner_name(k, i, out->names[i], sizeof out->names[i]);
        if (lpx_tensor_kind(in)) {
            st = lpx_error(LPX_EINVAL, "lpx_dlpack_flatten(%s): inner tensor '%s' is itself of kind '%s' "
                           "(nested kinds are not flattened)", out->kind, out->names[i], lpx_kind_name(lpx_tensor_kind(in)));
        } else if ((st = lpx_to_dlpack(in, &out->inner[i]))) {
            char ctx[128];
            snprintf(ctx, sizeof ctx, "(%s): inner tensor '%s'", out->kind, out->names[i]);
            st = rewrap(st, "lpx_dlpack_flatten", ctx);
        }
        if (st) {
            lpx_dlpack_flat_release(out);
            return st;
        }
    }
    out->ninner = n;
    return LPX_OK;
}

lpx_status lpx_dlpack_unflatten(lpx_dlpack_flat *flat, lpx_tensor **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_dlpack_unflatten: out is NULL");
    *out = NULL;
    if (!flat) return lpx_error(LPX_EINVAL, "lpx_dlpack_unflatten: flat is NULL");
    char kn[sizeof flat->kind];
    memcpy(kn, flat->kind, sizeof kn);
    kn[sizeof kn - 1] = 0;
    if (flat->ninner < 0 || flat->ninner > LPX_MAX_INNER)
        return lpx_error(LPX_EINVAL, "lpx_dlpack_unflatten(%s): ninner %d out of range 0..%d", kn, flat->ninner, LPX_MAX_INNER);
    if (flat->ndim < 0 || flat->ndim > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "lpx_dlpack_unflatten(%s): ndim %d out of range 0..%d", kn, flat->ndim, LPX_MAX_DIMS);
    if (flat->meta_size > LPX_MAX_META)
        return lpx_error(LPX_EINVAL, "lpx_dlpack_unflatten(%s): meta_size %zu exceeds %d", kn, flat->meta_size, LPX_MAX_META);
    const lpx_kind *k;
    if ((st = lpx_kind_find(kn, &k)))
        return lpx_error(LPX_ENOTFOUND, "lpx_dlpack_unflatten: kind '%s' is not registered (plugin not loaded?)", kn);
    for (int i = 0; i < flat->ninner; i++)
        if (!flat->inner[i]) return lpx_error(LPX_EINVAL, "lpx_dlpack_unflatten(%s): inner[%d] is NULL", kn, i);
    lpx_tensor *inner[LPX_MAX_INNER] = {0};
    int got = 0;
    for (; got < flat->ninner; got++) {
        if ((st = lpx_from_dlpack(flat->inner[got], &inner[got]))) {
            char ctx[128];
            snprintf(ctx, sizeof ctx, "(%s): inner tensor %d", kn, got);
            st = rewrap(st, "lpx_dlpack_unflatten", ctx);
            break;
        }
        flat->inner[got] = NULL; /* consumed */
    }
    if (!st)
        st = lpx_kind_unflatten(k, flat->logical_dtype, flat->ndim, flat->shape, inner, flat->ninner, flat->meta,
                                flat->meta_size, out);
    for (int i = 0; i < got; i++) lpx_tensor_release(inner[i]);
    return st;
}

/* ---- the PyCapsule destructor of Python bindings --------------------------- */

typedef int (*py_capsule_is_valid_fn)(void *capsule, const char *name);
typedef void *(*py_capsule_get_pointer_fn)(void *capsule, const char *name);

void lpx_dlpack_capsule_destructor(void *capsule)
{
    /* called with the GIL held (Python destroys the capsule); resolved once,
     * racing threads store the same values */
    static _Atomic(py_capsule_is_valid_fn) is_valid;
    static _Atomic(py_capsule_get_pointer_fn) get_pointer;
    py_capsule_is_valid_fn iv = atomic_load(&is_valid);
    py_capsule_get_pointer_fn gp = atomic_load(&get_pointer);
    if (!iv || !gp) {
        void *a = dlsym(RTLD_DEFAULT, "PyCapsule_IsValid"), *b = dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer");
        memcpy(&iv, &a, sizeof iv);
        memcpy(&gp, &b, sizeof gp);
        if (!iv || !gp) return;
        atomic_store(&is_valid, iv);
        atomic_store(&get_pointer, gp);
    }
    if (!capsule) return;
    /* IsValid sets no error; GetPointer of a valid capsule of that name
     * neither: the pending exception, if any, stays as it was */
    if (iv(capsule, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = gp(capsule, "dltensor_versioned");
        if (m && m->deleter) m->deleter(m);
    } else if (iv(capsule, "dltensor")) {
        DLManagedTensor *m = gp(capsule, "dltensor");
        if (m && m->deleter) m->deleter(m);
    }
}
