/* The MX plugin's internal interface. Everything here uses the public lpx
 * headers only: this plugin is built the way a third party builds one.
 *
 * Layout of an MX tensor of logical shape [d0, ..., dn-1] (n >= 1), with
 * K = dn-1 and Kp = K rounded up to a multiple of 32:
 *   inner[0]  elements, dense [d0, ..., dn-2, Kp]: f8e4m3fn (mxfp8) or
 *             f4e2m1 (mxfp4, two per byte, first element in the low nibble)
 *   inner[1]  scales, dense e8m0 [d0, ..., dn-2, Kp / 32]
 *   meta      mx_meta
 * Both inner tensors are on one device, the MX tensor's (the CPU kernels
 * here read CPU payloads; a device payload dequantizes through the
 * mx_dequantize op at its backend's key, see mx_to_dense).
 * Blocks of 32 run along the last dim (the reduction dim of x @ W^T), and
 * a row's padding elements are zero. Inner tensors are contiguous rows, so
 * a dim-0 slice of an n >= 2 tensor is a view of whole rows (shard unit
 * 1); a 1-D tensor slices in whole blocks (shard unit 32). */
#ifndef LPX_MX_H
#define LPX_MX_H

#include <stdbool.h>
#include <stdint.h>
#include "lpx/lpx.h"

#define MX_BLOCK 32
#define MX_MAGIC 0x4d58u   /* "MX" */

typedef enum mx_format { MX_FP8 = 8, MX_FP4 = 4 } mx_format;

typedef struct mx_meta {
    uint32_t magic;     /* MX_MAGIC */
    uint32_t format;    /* mx_format */
    uint32_t block;     /* MX_BLOCK */
    uint32_t reserved;
} mx_meta;

/* set by mx_plugin.c at init */
extern lpx_dtype mx_e8m0, mx_f4e2m1;
extern const lpx_kind *mx_kind_fp8, *mx_kind_fp4;

/* dtypes (mx_dtypes.c) */
lpx_status mx_register_dtypes(const lpx_host *host);

/* tensors (mx_tensor.c); mx_tensor_init fills decode tables (plugin init) */
void mx_tensor_init(void);
static inline int64_t mx_kp(int64_t k) { return (k + MX_BLOCK - 1) / MX_BLOCK * MX_BLOCK; }
/* format of an MX tensor, or 0 if t is not one */
mx_format mx_format_of(const lpx_tensor *t);
const char *mx_format_name(mx_format f);
/* emax of the element format: floor(log2(max normal)) (e4m3: 8, e2m1: 2) */
int mx_emax_elem(mx_format f);
/* Quantizes dense x (any float dtype, CPU) into a new MX tensor whose
 * logical dtype is x's. `op` names the caller in messages. */
lpx_status mx_quantize(const char *op, mx_format f, lpx_tensor *x, lpx_tensor **out);
/* Dequantizes rows [r0, r0 + nr) of MX tensor t (rows = numel / K) into
 * dst (nr * K floats, row-major). */
void mx_dequantize_rows(const lpx_tensor *t, int64_t r0, int64_t nr, float *dst);
/* New dense f32 [shape of t] with the dequantized values. */
lpx_status mx_to_dense(const lpx_tensor *t, lpx_tensor **out);
/* Wraps (elements, scales) as an MX tensor after validating everything
 * (the unflatten slot, also used by post_all_gather). */
lpx_status mx_wrap(const char *op, mx_format f, lpx_dtype logical, int ndim, const int64_t *shape,
                   lpx_tensor *elems, lpx_tensor *scales, lpx_tensor **out);
/* x[start:start+length] along dim 0, sharing storage (whole rows, or whole
 * blocks of a 1-D tensor). */
lpx_status mx_narrow0(const char *op, const lpx_tensor *t, int64_t start, int64_t length, lpx_tensor **out);

/* A contiguous copy of an inner tensor, bytes copied (the CPU backend's
 * clone does not handle 4-bit dtypes). */
lpx_status mx_copy_inner(const lpx_tensor *t, lpx_tensor **out);
/* Copies src's bytes into dst (same dtype and numel, both contiguous), on
 * the CPU or through the backend of a device side. */
lpx_status mx_copy_bytes(lpx_tensor *dst, const lpx_tensor *src);

/* the kinds (mx_kind.c) */
lpx_status mx_register_kinds(const lpx_host *host);

/* kernels and fallback (mx_ops.c) */
lpx_status mx_register_ops(const lpx_host *host);

#endif
