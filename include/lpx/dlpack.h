/* lpx — DLPack import and export (the official dlpack.h, v1.1 or later,
 * vendored under third_party/dlpack; see docs/INTEROP.md).
 *
 * Dense tensors cross as DLManagedTensorVersioned (and, for older clients,
 * the legacy DLManagedTensor), zero-copy both ways:
 *  - export retains the lpx tensor; the consumer's call to the struct's
 *    deleter releases it (the storage lives until the last lpx view and the
 *    last exported struct are gone);
 *  - import wraps the producer's memory; the producer's deleter runs exactly
 *    once, when the last lpx view of it is released.
 * Kind tensors (float8, nf4, MX, plugin kinds) cross as their named inner
 * tensors plus metadata (lpx_dlpack_flatten / lpx_dlpack_unflatten). */
#ifndef LPX_DLPACK_H
#define LPX_DLPACK_H

#include <dlpack/dlpack.h>
#include "export.h"
#include "status.h"
#include "tensor.h"
#include "kind.h"

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1 || \
    (DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION < 1)
#error "lpx needs dlpack.h v1.1 or later (fp8/fp4 type codes); use third_party/dlpack/include"
#endif

LPX_BEGIN_DECLS

/** The DLPack data type of lpx dtype `d` (lanes 1). Built-ins map to
 *  kDLFloat/kDLBfloat/kDLFloat8_e4m3fn/kDLFloat8_e5m2/kDLUInt/kDLInt/kDLBool;
 *  plugin dtypes named e8m0 and f4e2m1 map to kDLFloat8_e8m0fnu and
 *  kDLFloat4_e2m1fn. Errors: LPX_EINVAL (NULL out), LPX_EDTYPE (no DLPack
 *  code for `d`). */
LPX_API lpx_status lpx_dlpack_dtype_to(lpx_dtype d, DLDataType *out);

/** The lpx dtype of DLPack type `t`. Errors: LPX_EINVAL (NULL out),
 *  LPX_EDTYPE (unknown code/bits, lanes != 1, or a plugin format whose
 *  plugin is not loaded), naming the code and bits. */
LPX_API lpx_status lpx_dlpack_dtype_from(DLDataType t, lpx_dtype *out);

/** Exports dense tensor `t` as a new DLManagedTensorVersioned without
 *  copying: `data` points at element [0,...] (byte_offset 0), shape and
 *  strides (in elements) are t's, flags has DLPACK_FLAG_BITMASK_READ_ONLY
 *  when t is read-only, version is this header's. `t` is retained until the
 *  consumer calls (*out)->deleter(*out) exactly once. CPU tensors map to
 *  kDLCPU, CUDA tensors to kDLCUDA. Errors: LPX_EINVAL (NULL, kind tensor:
 *  use lpx_dlpack_flatten), LPX_EDTYPE (no DLPack code), LPX_EDEVICE,
 *  LPX_ENOMEM; on error *out is NULL and t is untouched. */
LPX_API lpx_status lpx_to_dlpack(lpx_tensor *t, DLManagedTensorVersioned **out);

/** As lpx_to_dlpack, as the legacy unversioned DLManagedTensor (for
 *  clients that predate DLPack 1.0, e.g. PyTorch < 2.3 and NumPy < 2.1).
 *  A read-only tensor cannot say so in the legacy struct: it is refused
 *  with LPX_EINVAL unless `allow_readonly` is true. */
LPX_API lpx_status lpx_to_dlpack_legacy(lpx_tensor *t, bool allow_readonly, DLManagedTensor **out);

/** Imports a DLManagedTensorVersioned as a dense lpx tensor without
 *  copying. On success lpx owns `m`: m->deleter(m) runs exactly once, when
 *  the last lpx view of the memory is released (never before this call
 *  returns). On failure `m` stays the caller's and its deleter is not
 *  called. Honoured: byte_offset, strides (NULL = row-major), the
 *  READ_ONLY flag (the tensor refuses in-place writes). Errors: LPX_EINVAL
 *  (NULL m or data with elements, ndim outside 0..8, NULL shape, negative
 *  dim or stride, data + byte_offset not aligned to the element size,
 *  sub-byte dtype not contiguous, padded sub-byte flag),
 *  LPX_EABI (major version != 1), LPX_EDTYPE (unknown type code),
 *  LPX_EDEVICE (device type with no lpx backend, e.g. kDLCUDA without the
 *  CUDA plugin), LPX_ERANGE, LPX_ENOMEM. */
LPX_API lpx_status lpx_from_dlpack(DLManagedTensorVersioned *m, lpx_tensor **out);

/** As lpx_from_dlpack, for the legacy unversioned DLManagedTensor (never
 *  read-only: the legacy struct has no flags). Same ownership rules. */
LPX_API lpx_status lpx_from_dlpack_legacy(DLManagedTensor *m, lpx_tensor **out);

/** A PyCapsule destructor for bindings that wrap lpx_to_dlpack(_legacy)
 *  results in Python capsules named "dltensor_versioned" / "dltensor"
 *  (python/lpx does): for a capsule no consumer took (still named so), it
 *  calls the DLPack deleter, releasing lpx's reference; a consumed capsule
 *  ("used_dltensor...") is left alone. Written in C because a destructor
 *  written in Python cannot run while the refusing consumer's exception is
 *  pending (numpy refusing a bf16 capsule raises BufferError and then drops
 *  it). It never touches Python's error state. liblpx does not link
 *  Python: PyCapsule_IsValid/GetPointer are looked up in the process at
 *  the first call; without them it does nothing. */
LPX_API void lpx_dlpack_capsule_destructor(void *capsule);

/** A kind tensor flattened for DLPack: its inner tensors by name, exported
 *  (each a DLManagedTensorVersioned owned by this struct until consumed),
 *  plus what lpx_dlpack_unflatten needs to rebuild it. */
typedef struct lpx_dlpack_flat {
    char kind[64];                 /* kind name ("float8", "nf4", "mxfp4"...) */
    lpx_dtype logical_dtype;
    int ndim;
    int64_t shape[LPX_MAX_DIMS];
    int ninner;
    char names[LPX_MAX_INNER][32]; /* see lpx_kind_inner_name */
    DLManagedTensorVersioned *inner[LPX_MAX_INNER];
    size_t meta_size;
    unsigned char meta[LPX_MAX_META];
} lpx_dlpack_flat;

/** Name of inner tensor `i` of a tensor of kind `kind` (the naming scheme
 *  of DLPack flattening and safetensors files): float8 -> data, scale,
 *  scale_inv; nf4 -> codes, qscalers, factors, mean; MX kinds (name
 *  starting "mx") -> elements, scales; any other kind -> inner0, inner1...
 *  Writes a NUL-terminated name into buf and returns buf. */
LPX_API char *lpx_kind_inner_name(const lpx_kind *kind, int i, char *buf, size_t len);

/** Flattens kind tensor `t` into `out`: every inner tensor exported with
 *  lpx_to_dlpack (zero-copy), names, kind name, logical dtype and shape,
 *  metadata copied. Release with lpx_dlpack_flat_release. Errors:
 *  LPX_EINVAL (NULL, dense t, a nested kind tensor inside), and those of
 *  lpx_to_dlpack; on error nothing is left to release. */
LPX_API lpx_status lpx_dlpack_flatten(const lpx_tensor *t, lpx_dlpack_flat *out);

/** Rebuilds a kind tensor from `flat` through its kind's unflatten slot
 *  (which validates the payload). Each inner DLManagedTensorVersioned is
 *  imported with lpx_from_dlpack and its slot set to NULL as it is
 *  consumed; whatever is left non-NULL (after a failure) is still the
 *  caller's: call lpx_dlpack_flat_release either way. Errors: LPX_EINVAL
 *  (NULL, ninner out of range, NULL inner), LPX_ENOTFOUND (kind not
 *  registered, e.g. plugin not loaded), those of lpx_from_dlpack and of the
 *  kind's unflatten. */
LPX_API lpx_status lpx_dlpack_unflatten(lpx_dlpack_flat *flat, lpx_tensor **out);

/** Calls the deleter of every non-NULL inner tensor of `flat` and sets it
 *  to NULL. NULL is ignored. */
LPX_API void lpx_dlpack_flat_release(lpx_dlpack_flat *flat);

LPX_END_DECLS

#endif
