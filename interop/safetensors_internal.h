/* What the safetensors reader (safetensors_read.c) and writer
 * (safetensors_write.c) share: the name separator of quantized tensors'
 * inner parts, the dtype names, and the JSON integer limit. Not installed. */
#ifndef LPX_SAFETENSORS_INTERNAL_H
#define LPX_SAFETENSORS_INTERNAL_H

#include <stdbool.h>
#include "lpx/lpx.h"
#include "lpx/safetensors.h"

/* "name::kind::inner": how a kind tensor's inner tensors are stored */
#define SEP "::"
/* 2^53: the integers a JSON double holds exactly */
#define MAX_EXACT_INT 9007199254740992.0

/* The lpx dtype of a safetensors dtype name ("BF16"), or -1. */
lpx_dtype lpx__st_dtype_from_name(const char *st);

/* lpx_safetensors_save that also returns the file's size and its FNV-1a
 * 64 over 8-byte little-endian words then the tail bytes (the sharded
 * checkpoint's checksum), computed from the bytes as they are written:
 * no read-back. bytes, fnv may be NULL. in_place: written at `path`
 * directly and fsync'ed, with no temporary file, rename or directory
 * fsync: for a file inside a directory the caller commits as a whole
 * (the sharded checkpoint's <dir>.tmp); a failure removes the file. */
lpx_status lpx__st_save_hashed(const char *path, int n, const char *const *names, lpx_tensor *const *tensors,
                               int nmeta, const lpx_safetensors_kv *meta, bool in_place, uint64_t *bytes,
                               uint64_t *fnv);

#endif
