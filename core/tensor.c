/* Tensor handles: creation, views, refcounting, accessors. */
#include <stdio.h>
#include <string.h>
#include "lpx_internal.h"

#define STORAGE_ALIGN 64

lpx_device lpx_cpu(void) { lpx_device d = {LPX_DEVICE_CPU, 0}; return d; }

lpx_status lpx_shape_numel(const char *op, int ndim, const int64_t *shape, int64_t *numel)
{
    if (ndim < 0 || ndim > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "%s: ndim %d out of range 0..%d", op, ndim, LPX_MAX_DIMS);
    if (ndim > 0 && !shape)
        return lpx_error(LPX_EINVAL, "%s: shape is NULL with ndim %d", op, ndim);
    /* the product of the dims other than 0 must fit too: an empty tensor
     * with huge dims would overflow every later computation that walks its
     * dims (strides, broadcast shapes, iterators) before meeting the 0 */
    int64_t n = 1;
    bool empty = false;
    for (int i = 0; i < ndim; i++) empty |= shape[i] == 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return lpx_error(LPX_EINVAL, "%s: shape[%d] = %lld is negative", op, i, (long long)shape[i]);
        if (shape[i] == 0) continue;
        if (n > INT64_MAX / shape[i])
            return lpx_error(LPX_ERANGE, "%s: element count of the shape overflows int64 at dim %d%s", op, i,
                             empty ? " (counting the dims other than 0)" : "");
        n *= shape[i];
    }
    *numel = empty ? 0 : n;
    return LPX_OK;
}

void lpx_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        int64_t d = shape[i] > 1 ? shape[i] : 1;
        /* past int64 only for an empty shape (a 0 dim keeps numel in range),
         * whose strides address nothing: saturate instead of overflowing */
        s = s > INT64_MAX / d ? INT64_MAX : s * d;
    }
}

static uint64_t keys_for(const lpx_kind *kind, lpx_device dev)
{
    uint64_t k = 0;
    int dk = lpx_device_key(dev.type);
    if (dk > 0) k |= UINT64_C(1) << dk;
    if (kind) k |= UINT64_C(1) << kind->key;
    return k;
}

static lpx_tensor *tensor_alloc(void)
{
    lpx_tensor *t = lpx_malloc(sizeof *t);
    if (!t) return NULL;
    /* only the header is cleared: meta/inner are written when used */
    memset(t, 0, offsetof(lpx_tensor, meta));
    atomic_init(&t->refcount, 1);
    return t;
}

static void storage_release(lpx_storage *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1) return;
    if (s->owned) {
        if (s->device.type != LPX_DEVICE_CPU) {
            const lpx_backend_i *b = lpx_backend_for(s->device.type);
            if (b && b->free) b->free(b->self, s->device, s->data, s->nbytes);
        }
        /* CPU storage lives in the same block as its header */
    } else if (s->deleter) {
        s->deleter(s->data, s->deleter_ctx);
    }
    lpx_free(s);
}

/* Storage capacity in elements of dtype d. */
static int64_t storage_elems(const lpx_storage *s, lpx_dtype d)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(d);
    return (int64_t)((s->nbytes * 8) / (size_t)tr->bits);
}

lpx_status lpx_tensor_new(lpx_dtype dtype, int ndim, const int64_t *shape, lpx_device device,
                          lpx_tensor **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_tensor_new: out is NULL");
    *out = NULL;
    int64_t numel;
    if ((st = lpx_shape_numel("lpx_tensor_new", ndim, shape, &numel))) return st;
    if (!lpx_dtype_valid(dtype))
        return lpx_error(LPX_EDTYPE, "lpx_tensor_new: unknown dtype %d", (int)dtype);
    const lpx_dtype_traits *tr = lpx_dtype_get(dtype);
    if (numel > (INT64_MAX - 64) / tr->bits)
        return lpx_error(LPX_ERANGE, "lpx_tensor_new: %lld elements of %s overflow the byte count",
                         (long long)numel, tr->name);
    size_t nbytes = lpx_dtype_nbytes(dtype, numel);
    const lpx_backend_i *be = lpx_backend_for(device.type);
    if (!be)
        return lpx_error(LPX_EDEVICE, "lpx_tensor_new: no backend for device type %d", (int)device.type);

    lpx_storage *s;
    if (device.type == LPX_DEVICE_CPU) {
        /* header and data in one block: one allocation per new tensor */
        size_t hdr = (sizeof(lpx_storage) + STORAGE_ALIGN - 1) & ~(size_t)(STORAGE_ALIGN - 1);
        if (nbytes > SIZE_MAX - hdr - STORAGE_ALIGN)
            return lpx_error(LPX_ERANGE, "lpx_tensor_new: %zu bytes is too large", nbytes);
        unsigned char *blk = lpx_malloc(hdr + nbytes + STORAGE_ALIGN);
        if (!blk) return lpx_error(LPX_ENOMEM, "lpx_tensor_new: cannot allocate %zu bytes", nbytes);
        s = (lpx_storage *)blk;
        uintptr_t p = (uintptr_t)(blk + sizeof(lpx_storage));
        p = (p + STORAGE_ALIGN - 1) & ~(uintptr_t)(STORAGE_ALIGN - 1);
        s->data = (void *)p;
    } else {
        s = lpx_malloc(sizeof *s);
        if (!s) return lpx_error(LPX_ENOMEM, "lpx_tensor_new: cannot allocate storage header");
        s->data = be->alloc(be->self, device, nbytes);
        if (!s->data && nbytes) {
            lpx_free(s);
            return lpx_error(LPX_ENOMEM, "lpx_tensor_new: %s cannot allocate %zu bytes", be->name, nbytes);
        }
    }
    atomic_init(&s->refcount, 1);
    s->nbytes = nbytes;
    s->device = device;
    s->deleter = NULL;
    s->deleter_ctx = NULL;
    s->owned = true;
    s->readonly = false;

    lpx_tensor *t = tensor_alloc();
    if (!t) {
        storage_release(s);
        return lpx_error(LPX_ENOMEM, "lpx_tensor_new: cannot allocate tensor");
    }
    t->ndim = ndim;
    t->dtype = dtype;
    if (dtype >= LPX_DTYPE_BUILTIN_COUNT) lpx__dtype_mark_used(dtype);
    t->device = device;
    t->numel = numel;
    t->keys = keys_for(NULL, device);
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    lpx_contiguous_strides(ndim, t->shape, t->strides);
    t->storage = s;
    *out = t;
    return LPX_OK;
}

/* Largest element offset reached by a view (strides >= 0), or -1 if empty. */
static lpx_status view_extent(const char *op, int ndim, const int64_t *shape, const int64_t *strides,
                              int64_t offset, int64_t *last)
{
    if (offset < 0) return lpx_error(LPX_ERANGE, "%s: negative offset %lld", op, (long long)offset);
    int64_t hi = offset;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) { *last = -1; return LPX_OK; }
        if (strides[i] < 0)
            return lpx_error(LPX_EINVAL, "%s: stride[%d] = %lld is negative", op, i, (long long)strides[i]);
        if (strides[i] && (shape[i] - 1) > (INT64_MAX - hi) / strides[i])
            return lpx_error(LPX_ERANGE, "%s: view extent overflows int64 at dim %d", op, i);
        hi += (shape[i] - 1) * strides[i];
    }
    *last = hi;
    return LPX_OK;
}

lpx_status lpx_tensor_from_blob(void *data, lpx_dtype dtype, int ndim, const int64_t *shape,
                                const int64_t *strides, lpx_device device, lpx_deleter deleter,
                                void *ctx, lpx_tensor **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_tensor_from_blob: out is NULL");
    *out = NULL;
    int64_t numel, last;
    if ((st = lpx_shape_numel("lpx_tensor_from_blob", ndim, shape, &numel))) return st;
    if (!lpx_dtype_valid(dtype))
        return lpx_error(LPX_EDTYPE, "lpx_tensor_from_blob: unknown dtype %d", (int)dtype);
    if (!data && numel > 0) return lpx_error(LPX_EINVAL, "lpx_tensor_from_blob: data is NULL");
    if (!lpx_backend_for(device.type))
        return lpx_error(LPX_EDEVICE, "lpx_tensor_from_blob: no backend for device type %d", (int)device.type);
    int64_t cstr[LPX_MAX_DIMS];
    if (!strides) { lpx_contiguous_strides(ndim, shape, cstr); strides = cstr; }
    if ((st = view_extent("lpx_tensor_from_blob", ndim, shape, strides, 0, &last))) return st;
    if (last >= (INT64_MAX - 8) / 64)   /* before the + 1: last may be INT64_MAX */
        return lpx_error(LPX_ERANGE, "lpx_tensor_from_blob: extent of %lld elements is too large", (long long)last);
    int64_t elems = last + 1;

    lpx_storage *s = lpx_malloc(sizeof *s);
    lpx_tensor *t = tensor_alloc();
    if (!s || !t) {
        lpx_free(s);
        lpx_free(t);
        return lpx_error(LPX_ENOMEM, "lpx_tensor_from_blob: cannot allocate tensor");
    }
    atomic_init(&s->refcount, 1);
    s->data = data;
    s->nbytes = lpx_dtype_nbytes(dtype, elems);
    s->device = device;
    s->deleter = deleter;
    s->deleter_ctx = ctx;
    s->owned = false;
    s->readonly = false;
    t->ndim = ndim;
    t->dtype = dtype;
    if (dtype >= LPX_DTYPE_BUILTIN_COUNT) lpx__dtype_mark_used(dtype);
    t->device = device;
    t->numel = numel;
    t->keys = keys_for(NULL, device);
    if (ndim) {
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
    }
    t->storage = s;
    *out = t;
    return LPX_OK;
}

lpx_status lpx_tensor_view_of(const lpx_tensor *base, int ndim, const int64_t *shape,
                              const int64_t *strides, int64_t offset, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_tensor_view_of: out is NULL");
    *out = NULL;
    if (!base) return lpx_error(LPX_EINVAL, "lpx_tensor_view_of: base is NULL");
    if (base->kind)
        return lpx_error(LPX_EINVAL, "lpx_tensor_view_of: base is a %s tensor, views need dense storage",
                         base->kind->vt.name);
    int64_t numel, last;
    lpx_status st;
    if ((st = lpx_shape_numel("lpx_tensor_view_of", ndim, shape, &numel))) return st;
    int64_t cstr[LPX_MAX_DIMS];
    if (!strides) { lpx_contiguous_strides(ndim, shape, cstr); strides = cstr; }
    if ((st = view_extent("lpx_tensor_view_of", ndim, shape, strides, offset, &last))) return st;
    int64_t cap = storage_elems(base->storage, base->dtype);
    /* an empty view touches no element: any offset >= 0 is fine (a
     * trailing torch.chunk piece may start past the end) */
    if (last >= cap)
        return lpx_error(LPX_ERANGE, "lpx_tensor_view_of: view reaches element %lld of a storage of %lld",
                         (long long)(last >= 0 ? last : offset), (long long)cap);
    lpx_tensor *t = tensor_alloc();
    if (!t) return lpx_error(LPX_ENOMEM, "lpx_tensor_view_of: cannot allocate tensor");
    t->ndim = ndim;
    t->dtype = base->dtype;
    t->device = base->device;
    t->numel = numel;
    t->keys = base->keys;
    t->offset = offset;
    if (ndim) {
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
    }
    t->storage = base->storage;
    atomic_fetch_add_explicit(&t->storage->refcount, 1, memory_order_relaxed);
    *out = t;
    return LPX_OK;
}

lpx_status lpx_tensor_new_kind(const lpx_kind *kind, lpx_dtype logical_dtype, int ndim,
                               const int64_t *shape, lpx_device device, lpx_tensor *const *inner,
                               int ninner, const void *meta, size_t meta_size, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_tensor_new_kind: out is NULL");
    *out = NULL;
    if (!kind || !kind->registered) return lpx_error(LPX_EINVAL, "lpx_tensor_new_kind: kind is NULL or unregistered");
    const char *kn = kind->vt.name;
    if (ninner < 0 || ninner > LPX_MAX_INNER)
        return lpx_error(LPX_EINVAL, "lpx_tensor_new_kind(%s): ninner %d out of range 0..%d", kn, ninner, LPX_MAX_INNER);
    if (ninner > 0 && !inner) return lpx_error(LPX_EINVAL, "lpx_tensor_new_kind(%s): inner is NULL", kn);
    for (int i = 0; i < ninner; i++)
        if (!inner[i]) return lpx_error(LPX_EINVAL, "lpx_tensor_new_kind(%s): inner[%d] is NULL", kn, i);
    if (meta_size > LPX_MAX_META)
        return lpx_error(LPX_EINVAL, "lpx_tensor_new_kind(%s): meta_size %zu exceeds %d", kn, meta_size, LPX_MAX_META);
    if (meta_size && !meta) return lpx_error(LPX_EINVAL, "lpx_tensor_new_kind(%s): meta is NULL", kn);
    if (!lpx_dtype_valid(logical_dtype))
        return lpx_error(LPX_EDTYPE, "lpx_tensor_new_kind(%s): unknown dtype %d", kn, (int)logical_dtype);
    int64_t numel;
    lpx_status st = lpx_shape_numel("lpx_tensor_new_kind", ndim, shape, &numel);
    if (st) return st;
    lpx_tensor *t = tensor_alloc();
    if (!t) return lpx_error(LPX_ENOMEM, "lpx_tensor_new_kind(%s): cannot allocate tensor", kn);
    t->ndim = ndim;
    t->dtype = logical_dtype;
    if (logical_dtype >= LPX_DTYPE_BUILTIN_COUNT) lpx__dtype_mark_used(logical_dtype);
    t->device = device;
    t->numel = numel;
    t->kind = kind;
    t->keys = keys_for(kind, device);
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    lpx_contiguous_strides(ndim, t->shape, t->strides);
    t->ninner = ninner;
    for (int i = 0; i < ninner; i++) {
        t->inner[i] = inner[i];
        lpx_tensor_retain(inner[i]);
    }
    t->meta_size = (uint32_t)meta_size;
    if (meta_size) memcpy(t->meta, meta, meta_size);
    atomic_fetch_add_explicit(&((lpx_kind *)kind)->live, 1, memory_order_relaxed);
    *out = t;
    return LPX_OK;
}

void lpx_tensor_retain(lpx_tensor *t)
{
    if (t) atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
}

void lpx_tensor_release(lpx_tensor *t)
{
    if (!t || atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel) != 1) return;
    if (t->kind) {
        lpx_kind *k = (lpx_kind *)t->kind;
        if (k->vt.meta_release) k->vt.meta_release(t->meta, t->meta_size);
        for (int i = 0; i < t->ninner; i++) lpx_tensor_release(t->inner[i]);
        atomic_fetch_sub_explicit(&k->live, 1, memory_order_relaxed);
    } else {
        storage_release(t->storage);
    }
    lpx_free(t);
}

int lpx_tensor_ndim(const lpx_tensor *t) { return t ? t->ndim : 0; }
const int64_t *lpx_tensor_shape(const lpx_tensor *t) { return t ? t->shape : NULL; }
const int64_t *lpx_tensor_strides(const lpx_tensor *t) { return t ? t->strides : NULL; }
int64_t lpx_tensor_offset(const lpx_tensor *t) { return t ? t->offset : 0; }
int64_t lpx_tensor_numel(const lpx_tensor *t) { return t ? t->numel : 0; }
lpx_dtype lpx_tensor_dtype(const lpx_tensor *t) { return t ? t->dtype : -1; }
const lpx_kind *lpx_tensor_kind(const lpx_tensor *t) { return t ? t->kind : NULL; }
uint64_t lpx_tensor_keys(const lpx_tensor *t) { return t ? t->keys : 0; }
int lpx_tensor_refcount(const lpx_tensor *t) { return t ? atomic_load(&((lpx_tensor *)t)->refcount) : 0; }

lpx_device lpx_tensor_device(const lpx_tensor *t)
{
    lpx_device none = {0, 0};
    return t ? t->device : none;
}

void *lpx_tensor_data(const lpx_tensor *t)
{
    if (!t || t->kind) return NULL;
    if (!t->storage->data) return NULL;   /* an empty tensor that wraps no memory */
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    return (char *)t->storage->data + (size_t)((t->offset * tr->bits) / 8);
}

bool lpx_tensor_is_contiguous(const lpx_tensor *t)
{
    if (!t || t->kind) return false;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (t->strides[i] != s) return t->numel == 0;
        s *= t->shape[i];
    }
    return true;
}

bool lpx_tensor_shares_storage(const lpx_tensor *a, const lpx_tensor *b)
{
    return a && b && !a->kind && !b->kind && a->storage == b->storage;
}

bool lpx_tensor_is_readonly(const lpx_tensor *t)
{
    if (!t) return false;
    if (!t->kind) return t->storage->readonly;
    for (int i = 0; i < t->ninner; i++)
        if (lpx_tensor_is_readonly(t->inner[i])) return true;
    return false;
}

void lpx_tensor_mark_readonly(lpx_tensor *t)
{
    if (!t) return;
    if (!t->kind) { t->storage->readonly = true; return; }
    for (int i = 0; i < t->ninner; i++) lpx_tensor_mark_readonly(t->inner[i]);
}

int lpx_tensor_inner_count(const lpx_tensor *t) { return t && t->kind ? t->ninner : 0; }

lpx_tensor *lpx_tensor_inner(const lpx_tensor *t, int i)
{
    return t && t->kind && i >= 0 && i < t->ninner ? t->inner[i] : NULL;
}

const void *lpx_tensor_meta(const lpx_tensor *t, size_t *size)
{
    if (!t || !t->kind) { if (size) *size = 0; return NULL; }
    if (size) *size = t->meta_size;
    return t->meta;
}

char *lpx_tensor_shape_str(const lpx_tensor *t, char *buf, size_t len)
{
    if (!buf || !len) return buf;
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; t && i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}
