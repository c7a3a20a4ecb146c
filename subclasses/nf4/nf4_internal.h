/* Shared definitions of the nf4 kind (subclasses/nf4/). Not installed.
 *
 * The kind holds the logic (layout, views, slicing in scaler-block units,
 * hooks, QLoRA composition); the number crunching is the dense ops of
 * ops_nf4.def, dispatched on the inner tensors' device, so a CUDA backend
 * plugs in by implementing those four ops. */
#ifndef LPX_NF4_INTERNAL_H
#define LPX_NF4_INTERNAL_H

#include "../kind_author.h"

/* The registered kind (set once by lpx_nf4_register_kind). */
extern const lpx_kind *lpx__nf4_kind;

/* A checked look at an nf4 tensor: its metadata and inner tensors
 * (borrowed), and the stored layout (the logical shape with the two dims
 * swapped when transposed). */
typedef struct nf4_parts {
    lpx_nf4_meta m;
    lpx_tensor *in[LPX_NF4_NINNER];
    int ndim;
    int64_t sshape[LPX_MAX_DIMS];  /* stored shape */
    int64_t numel;
    int64_t srows;                 /* stored dim 0 (1 for 0-D) */
    int64_t row_elems;             /* elements per stored row */
} nf4_parts;

/* Fills p from t; LPX_EINVAL naming `op` and `arg` if t is not nf4. */
lpx_status nf4_parts_of(const char *op, const char *arg, const lpx_tensor *t, nf4_parts *p);

/* Rows a dim-0 slice boundary must be a multiple of so that it falls on a
 * scaler-block boundary: lcm(row_elems, block*scaler_block) / row_elems. */
int64_t nf4_unit_rows(int64_t row_elems, int64_t block, int64_t sblock);

/* Validates a metadata blob + inner tensors + logical dtype/shape (the
 * checks of unflatten, for untrusted input). */
lpx_status nf4_validate(const char *op, lpx_dtype dtype, int ndim, const int64_t *shape,
                        lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size);

/* New nf4 tensor over `inner` (retained), no validation. */
lpx_status nf4_make(lpx_dtype dtype, int ndim, const int64_t *shape, lpx_tensor *const *inner,
                    const lpx_nf4_meta *m, lpx_tensor **out);

/* A fresh metadata blob. */
lpx_nf4_meta nf4_meta_init(int64_t block, int64_t sblock, int64_t padded, bool transposed, bool whole);

/* Runs op over args through dispatch and returns up to `nrets` results
 * (new references; the rest are released). */
lpx_status nf4_call(lpx_op op, const lpx_value *args, int nargs, lpx_tensor **rets, int nrets);

/* Dense op wrappers. */
lpx_status nf4_quantize_payload(lpx_tensor *x, int64_t block, int64_t sblock, lpx_tensor **res4);
lpx_status nf4_dequantize_range(const nf4_parts *p, int64_t start, int64_t count, lpx_dtype dtype,
                                lpx_tensor *out, lpx_tensor **res);

/* Dense contiguous tensor of t's logical shape in dtype (f32/f16/bf16, or
 * any dtype through an extra cast). */
lpx_status nf4_to_dense(const char *op, lpx_tensor *t, lpx_dtype dtype, bool saturate, lpx_tensor **out);

/* y = x @ (transpose ? W^T : W) (+ bias), W the 2-D logical nf4 tensor. */
lpx_status nf4_apply(const char *op, lpx_tensor *x, const lpx_tensor *w, bool transpose, lpx_tensor *bias,
                     lpx_tensor **out);

/* Rows [r0, r1) of dim 0 (untransposed), r0 and r1 on scaler-block
 * boundaries (r1 may be the last row): a new nf4 tensor whose inner tensors
 * are views of t's. */
lpx_status nf4_slice_rows(const char *op, lpx_tensor *t, int64_t r0, int64_t r1, lpx_tensor **out);

/* Kind vtable slots (nf4_hooks.c). */
lpx_status nf4_pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs, void *meta,
                              size_t *meta_size);
lpx_status nf4_post_all_gather(const lpx_kind *kind, lpx_tensor *const *outputs, int noutputs, const void *meta,
                               size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result);

/* Registration of the op handlers and of the fallback (nf4_handlers.c,
 * nf4_fallback.c). */
lpx_status nf4_register_handlers(int key);
lpx_status nf4_register_fallback(int key);

/* The fallback rule for a call an nf4 handler cannot serve (`why` says
 * which argument combination, may be NULL): LPX_ENOTIMPL naming the op and
 * the kind while the switch is off, else dequantize and redispatch. */
lpx_status nf4_fallback_run(lpx_call *c, const char *why);

static inline bool nf4_logical_dtype_ok(lpx_dtype d) { return d == LPX_F32 || d == LPX_F16 || d == LPX_BF16; }

#endif
