/* lpx — tensors.
 *
 * An lpx_tensor is an opaque, refcounted handle: kind (NULL for dense),
 * dtype (for kind tensors the logical dtype, e.g. a Float8 weight of a bf16
 * model says bf16), shape (at most LPX_MAX_DIMS dims), strides and offset in
 * elements, device, and either dense storage or a kind payload (inner
 * tensors + a metadata blob). Views share storage. All functions that
 * return a tensor through `out` hand the caller one reference. */
#ifndef LPX_TENSOR_H
#define LPX_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "export.h"
#include "status.h"
#include "dtype.h"

LPX_BEGIN_DECLS

#define LPX_MAX_DIMS 8
#define LPX_MAX_INNER 8      /* inner tensors of one kind payload */
#define LPX_MAX_META 256     /* bytes of kind metadata */

/* Device types; values match DLPack's DLDeviceType. */
/* LPX_DEVICE_SIM: the simulated device of lpx-simdev.so (host memory that
 * only its backend may touch; docs/ARCHITECTURE.md, "A backend plugin,
 * worked through"): device paths run in CI without a GPU. */
enum { LPX_DEVICE_CPU = 1, LPX_DEVICE_CUDA = 2, LPX_DEVICE_SIM = 3 };

typedef struct lpx_device {
    int32_t type;   /* LPX_DEVICE_* */
    int32_t index;  /* 0 for CPU */
} lpx_device;

typedef struct lpx_tensor lpx_tensor;
typedef struct lpx_kind lpx_kind;

/** The CPU device {LPX_DEVICE_CPU, 0}. */
LPX_API lpx_device lpx_cpu(void);

/** Called once when the last reference to a wrapped buffer goes away. */
typedef void (*lpx_deleter)(void *data, void *ctx);

/** New dense, contiguous, uninitialized tensor. `shape` may be NULL when
 *  ndim == 0 (a scalar). Errors: LPX_EINVAL (ndim out of 0..8, negative
 *  dim), LPX_EDTYPE, LPX_ERANGE (element count or bytes overflow),
 *  LPX_EDEVICE (no backend for the device), LPX_ENOMEM. */
LPX_API lpx_status lpx_tensor_new(lpx_dtype dtype, int ndim, const int64_t *shape,
                                  lpx_device device, lpx_tensor **out);

/** Wraps caller memory without copying. `strides` (in elements) may be NULL
 *  for contiguous. `deleter(data, ctx)` runs when the last view is released
 *  (may be NULL: caller keeps ownership and must outlive the tensor). On
 *  failure the deleter is NOT called: the buffer stays the caller's. */
LPX_API lpx_status lpx_tensor_from_blob(void *data, lpx_dtype dtype, int ndim,
                                        const int64_t *shape, const int64_t *strides,
                                        lpx_device device, lpx_deleter deleter,
                                        void *ctx, lpx_tensor **out);

/** Copy of dense tensor `x` on `device` (contiguous; the same dtype and
 *  shape), made by the device backend's copy slot; x itself (retained)
 *  when it already lives there. Returns after the data is in place (a copy
 *  to host memory is complete; one to a device is ordered before later work
 *  on that device). Errors: LPX_EINVAL (NULL, kind tensor: move its inner
 *  tensors), LPX_EDEVICE (no backend for `device`, or none copies between
 *  the two devices), LPX_ENOMEM, and the backend's copy errors. */
LPX_API lpx_status lpx_tensor_to(lpx_tensor *x, lpx_device device, lpx_tensor **out);

/** New view of `base`'s storage with the given geometry (elements). Checked
 *  against the storage bounds: LPX_ERANGE if any element falls outside.
 *  Dense tensors only (LPX_EINVAL for kind tensors). */
LPX_API lpx_status lpx_tensor_view_of(const lpx_tensor *base, int ndim,
                                      const int64_t *shape, const int64_t *strides,
                                      int64_t offset, lpx_tensor **out);

/** New kind tensor: retains each of the `ninner` inner tensors and copies
 *  `meta_size` bytes of metadata. The kind's vtable owns the meaning.
 *  Errors: LPX_EINVAL (NULL kind, ninner > LPX_MAX_INNER, meta too big,
 *  NULL inner), LPX_EDTYPE, LPX_ERANGE, LPX_ENOMEM. */
LPX_API lpx_status lpx_tensor_new_kind(const lpx_kind *kind, lpx_dtype logical_dtype,
                                       int ndim, const int64_t *shape, lpx_device device,
                                       lpx_tensor *const *inner, int ninner,
                                       const void *meta, size_t meta_size,
                                       lpx_tensor **out);

/** Adds one reference. NULL is ignored. Thread-safe. */
LPX_API void lpx_tensor_retain(lpx_tensor *t);
/** Drops one reference; the last one frees the tensor (and its storage or
 *  payload when no other view holds them). NULL is ignored. Thread-safe. */
LPX_API void lpx_tensor_release(lpx_tensor *t);

LPX_API int lpx_tensor_ndim(const lpx_tensor *t);
/** Shape array of ndim entries; borrowed, valid while t lives. */
LPX_API const int64_t *lpx_tensor_shape(const lpx_tensor *t);
/** Strides in elements (dense tensors; a kind tensor reports contiguous). */
LPX_API const int64_t *lpx_tensor_strides(const lpx_tensor *t);
LPX_API int64_t lpx_tensor_offset(const lpx_tensor *t);
LPX_API int64_t lpx_tensor_numel(const lpx_tensor *t);
LPX_API lpx_dtype lpx_tensor_dtype(const lpx_tensor *t);
LPX_API lpx_device lpx_tensor_device(const lpx_tensor *t);
/** Kind of t, or NULL for a dense tensor. */
LPX_API const lpx_kind *lpx_tensor_kind(const lpx_tensor *t);
/** Address of element [0,...,0] of a dense tensor; NULL for kind tensors. */
LPX_API void *lpx_tensor_data(const lpx_tensor *t);
/** True if dense and laid out row-major without gaps. */
LPX_API bool lpx_tensor_is_contiguous(const lpx_tensor *t);
/** Dispatch key set of t (its kind's key | its device backend's key). */
LPX_API uint64_t lpx_tensor_keys(const lpx_tensor *t);
/** Current reference count (for tests and leak hunting). */
LPX_API int lpx_tensor_refcount(const lpx_tensor *t);
/** True if a and b are views of the same storage. */
LPX_API bool lpx_tensor_shares_storage(const lpx_tensor *a, const lpx_tensor *b);

/** True if t's storage (or, for a kind tensor, any inner tensor's) is
 *  read-only: in-place ops (copy_, fill_, the `out` of any op) refuse it
 *  with LPX_EINVAL. A read-only DLPack import is; NULL is not. */
LPX_API bool lpx_tensor_is_readonly(const lpx_tensor *t);
/** Marks t's storage read-only, for every view of it (irreversible; for a
 *  kind tensor, each inner tensor). Not thread-safe against concurrent
 *  writers of the same storage. NULL is ignored. */
LPX_API void lpx_tensor_mark_readonly(lpx_tensor *t);

/** Number of inner tensors of a kind tensor (0 for dense). */
LPX_API int lpx_tensor_inner_count(const lpx_tensor *t);
/** Inner tensor i (borrowed), or NULL if out of range. */
LPX_API lpx_tensor *lpx_tensor_inner(const lpx_tensor *t, int i);
/** Kind metadata blob (borrowed) and its size; NULL/0 for dense. */
LPX_API const void *lpx_tensor_meta(const lpx_tensor *t, size_t *size);

/** Copies the shape of t into a printable "[2, 3]" string. Returns buf. */
LPX_API char *lpx_tensor_shape_str(const lpx_tensor *t, char *buf, size_t len);

LPX_END_DECLS

#endif
