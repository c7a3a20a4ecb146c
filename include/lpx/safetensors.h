/* lpx — safetensors files (https://github.com/huggingface/safetensors):
 * read (memory-mapped, zero-copy where aligned) and write (atomic).
 *
 * Dense tensors are stored as themselves (F32, F16, BF16, F8_E4M3 = lpx
 * f8e4m3fn, F8_E5M2, U8, I8, I32, I64, BOOL). A kind tensor (float8, nf4,
 * MX...) named N is stored as its inner tensors, "N::<kind>::<inner name>"
 * (inner names: lpx_kind_inner_name), and one __metadata__ entry
 * "N::<kind>" whose value is a JSON string
 *   {"kind":"nf4","dtype":"bf16","shape":[64,32],"inner":["codes",...],
 *    "meta":"<hex of the kind's metadata blob>"}
 * from which reading rebuilds it through the kind's unflatten (which
 * validates the payload). Other __metadata__ entries are the caller's
 * (string -> string). See docs/INTEROP.md. */
#ifndef LPX_SAFETENSORS_H
#define LPX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "tensor.h"
#include "kind.h"

LPX_BEGIN_DECLS

/** Header lengths above this are refused (as the reference reader does). */
#define LPX_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u)

/** An open safetensors file (opaque): the mapping and the parsed header. */
typedef struct lpx_safetensors lpx_safetensors;

/** One user metadata pair, for lpx_safetensors_save. */
typedef struct lpx_safetensors_kv {
    const char *key;
    const char *value;
} lpx_safetensors_kv;

/** Where lpx writes a whole file the caller names (lpx_safetensors_save,
 *  lpx_fsdp_export and the lpx command's outputs use it), decided before
 *  anything is written: `path` absent (its folder must exist and be
 *  writable), a regular file (replaced atomically), or a symbolic link,
 *  followed to its end (the target is replaced atomically in the target's
 *  own folder, and the link stays a link; a dangling link creates its
 *  target). Refused, touching nothing: a directory, a FIFO, a device, a
 *  socket, a missing or unwritable folder (a probe file of its own is made
 *  and removed there, as access() says yes to root on a read-only file
 *  system), a loop of links. The canonical path to write (the folder's
 *  real path and the file's name) goes to `out` (`len` bytes). `op` names the caller in messages
 *  (e.g. "lpx eval --logits"). Errors: LPX_EINVAL (not a file, a loop of
 *  links) and LPX_EIO (the folder missing or unwritable), naming op, path
 *  and why; LPX_ERANGE (a path longer than len). */
LPX_API lpx_status lpx_output_path(const char *op, const char *path, char *out, size_t len);

/** Writes `n` tensors under `names` to `path` atomically: a temporary file
 *  in the same directory, written in full, fsync'ed, renamed over `path`
 *  (a path lpx_output_path accepts: a link's target is replaced, a FIFO,
 *  device or directory refused before anything is written),
 *  then the directory fsync'ed; a crash or error at any point leaves either
 *  the previous file or none, never a partial one (the temporary file is
 *  removed on error). Dense tensors must be on the CPU (non-contiguous ones
 *  are written contiguous); kind tensors are stored as their inner tensors
 *  (see the header comment). `meta` (may be NULL with nmeta 0) becomes
 *  __metadata__; keys containing "::" are reserved for kinds. Nothing is
 *  retained. Errors: LPX_EINVAL (NULL, empty or duplicate name, a name
 *  containing "::", reserved or duplicate metadata key, nested kind),
 *  LPX_EDTYPE (dtype with no safetensors name), LPX_EDEVICE (not CPU),
 *  LPX_EIO (naming the system call and errno), LPX_ENOMEM. */
LPX_API lpx_status lpx_safetensors_save(const char *path, int n, const char *const *names,
                                        lpx_tensor *const *tensors, int nmeta,
                                        const lpx_safetensors_kv *meta);

/** Opens and memory-maps `path` (private, copy-on-write mapping: tensors
 *  read from it are writable and never change the file) and validates the
 *  whole header: length bounds, JSON, every entry's dtype, shape (<= 8 dims,
 *  no overflow), data_offsets (in range, begin <= end, no overlap between
 *  tensors), byte count = numel * element size, duplicate names, kind
 *  groups (complete, known inner names). Errors: LPX_EIO (cannot open/map,
 *  truncated file), LPX_EINVAL (malformed or hostile header: the message
 *  names the tensor and the field), LPX_EDTYPE (unknown dtype name),
 *  LPX_ENOMEM. Close with lpx_safetensors_close. */
LPX_API lpx_status lpx_safetensors_open(const char *path, lpx_safetensors **out);

/** Closes the file handle. Tensors obtained from it stay valid: the mapping
 *  is unmapped after the last of them is released. NULL is ignored. */
LPX_API void lpx_safetensors_close(lpx_safetensors *f);

/** Number of logical entries: dense tensors plus kind tensors (a kind
 *  tensor's inner entries count once, under its name). */
LPX_API int lpx_safetensors_count(const lpx_safetensors *f);

/** Name of logical entry i (file order, borrowed, valid until close), or
 *  NULL when out of range. */
LPX_API const char *lpx_safetensors_name(const lpx_safetensors *f, int i);

/** Kind name of entry `name` ("" for dense), or NULL if there is no such
 *  entry. Borrowed, valid until close. */
LPX_API const char *lpx_safetensors_kind_of(const lpx_safetensors *f, const char *name);

/** Reads entry `name` as a new tensor (one reference to the caller):
 *  dense entries whose data is aligned to their element size are zero-copy
 *  views of the mapping (copied otherwise); kind entries are rebuilt from
 *  their inner tensors through the kind's unflatten. Errors: LPX_ENOTFOUND
 *  (no such entry, or a kind that is not registered, e.g. plugin not
 *  loaded), LPX_EINVAL (the kind refused the payload), LPX_ENOMEM. */
LPX_API lpx_status lpx_safetensors_get(lpx_safetensors *f, const char *name, lpx_tensor **out);

/** Reads dense entry `name` (bf16, f16 or f32: a downloaded model) and
 *  quantizes it on load into `kind` (e.g. lpx_nf4_kind(), lpx_float8_kind()
 *  or a plugin kind) with the kind's default recipe (lpx_kind_from_dense);
 *  the dense data is not kept. A kind entry of the same kind is returned as
 *  stored. Errors: those of lpx_safetensors_get, LPX_EINVAL (NULL kind,
 *  entry of another kind), LPX_EDTYPE (not a float dtype), and the kind's. */
LPX_API lpx_status lpx_safetensors_get_quantized(lpx_safetensors *f, const char *name, const lpx_kind *kind,
                                                 lpx_tensor **out);

/** Value of user __metadata__ entry `key` (borrowed, valid until close), or
 *  NULL when absent. */
LPX_API const char *lpx_safetensors_metadata(const lpx_safetensors *f, const char *key);

/** Number of user __metadata__ entries (kind entries excluded), and entry
 *  i's key and value (borrowed; NULL/-1 when out of range). */
LPX_API int lpx_safetensors_metadata_count(const lpx_safetensors *f);
LPX_API const char *lpx_safetensors_metadata_at(const lpx_safetensors *f, int i, const char **value);

/** The safetensors dtype name of `d` ("F8_E4M3"), or NULL if it has none. */
LPX_API const char *lpx_safetensors_dtype_name(lpx_dtype d);

LPX_END_DECLS

#endif
