/* lpx — the meta functions of ops: argument and shape checks written once
 * per op and shared by every backend (PyTorch's structured kernels keep
 * one meta function per op for the same reason: a contract changed in one
 * place cannot drift between the CPU and a GPU backend).
 *
 * A backend kernel calls the op's meta function first, then checks only
 * what is its own (its device, the dtypes it has code for). Each returns
 * LPX_OK and fills the op's geometry, or an error whose message names the
 * op (the `op` argument, so a kind or plugin wrapping the op can pass its
 * own name) and the bad argument. They read metadata only (never data) and
 * allocate nothing. */
#ifndef LPX_META_H
#define LPX_META_H

#include <stdbool.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "tensor.h"
#include "dispatch.h"

LPX_BEGIN_DECLS

/** rope / rope_backward: x (or grad) [B, T, H, D] with D even and > 0,
 *  inv_freq 1-D [D/2], offset >= 0, and offset + T small enough that
 *  every position is exact in f32 (<= 2^24). Fills *half = D/2. Errors:
 *  LPX_EINVAL (NULL), LPX_ESHAPE, LPX_ERANGE (offset). */
LPX_API lpx_status lpx_meta_rope(const char *op, const lpx_tensor *x, const lpx_tensor *inv_freq, int64_t offset,
                                 int64_t *half);

/** The geometry of an attention call. */
typedef struct lpx_attention_geom {
    int64_t batch;      /* B */
    int64_t q_len;      /* T: query positions */
    int64_t kv_len;     /* S: key/value positions */
    int64_t heads;      /* Hq */
    int64_t kv_heads;   /* Hkv (divides Hq) */
    int64_t head_dim;   /* D */
} lpx_attention_geom;

/** attention: q [B, T, Hq, D], k and v [B, S, Hkv, D], one dtype, Hq a
 *  multiple of Hkv, causal only with S >= T, scale finite and > 0. Errors:
 *  LPX_EINVAL (NULL, scale), LPX_ESHAPE, LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_attention(const char *op, const lpx_tensor *q, const lpx_tensor *k, const lpx_tensor *v,
                                      bool causal, double scale, lpx_attention_geom *g);

/** attention_backward: lpx_meta_attention's checks, and grad and out
 *  [B, T, Hq, D], lse f32 [B, Hq, T]. */
LPX_API lpx_status lpx_meta_attention_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *q,
                                               const lpx_tensor *k, const lpx_tensor *v, const lpx_tensor *out,
                                               const lpx_tensor *lse, bool causal, double scale,
                                               lpx_attention_geom *g);

/* ---- the normalization and softmax family (rmsnorm, softmax, their
 * backward passes, and every op taking two same-shaped tensors) ---- */

/** a and b (named an, bn in the message) have one shape. Errors:
 *  LPX_EINVAL (NULL), LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_same_shape(const char *op, const char *an, const lpx_tensor *a, const char *bn,
                                       const lpx_tensor *b);

/** The lines of t along dim_arg (negative counts from the end; a scalar
 *  accepts 0 and -1, as PyTorch): the normalized dim, the line length L
 *  and the number of lines. Errors: LPX_EINVAL (NULL), LPX_ERANGE. */
LPX_API lpx_status lpx_meta_lines(const char *op, const lpx_tensor *t, int64_t dim_arg, int *dim, int64_t *len,
                                  int64_t *count);

/** rmsnorm: x has a last dim D (>= 1-D), weight (may be NULL) is [D];
 *  fills the row count and D. Errors: LPX_EINVAL (NULL x), LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_rmsnorm(const char *op, const lpx_tensor *x, const lpx_tensor *weight, int64_t *rows,
                                    int64_t *dim);

/** rmsnorm_backward: lpx_meta_rmsnorm's checks, grad shaped like x, and
 *  rstd holding one value per row. */
LPX_API lpx_status lpx_meta_rmsnorm_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *x,
                                             const lpx_tensor *weight, const lpx_tensor *rstd, int64_t *rows,
                                             int64_t *dim);

/** swiglu_backward: grad, gate and up non-NULL, of one shape (no
 *  broadcasting; any strides), each of a floating-point dtype (each may
 *  differ). Errors: LPX_EINVAL (NULL), LPX_ESHAPE (naming both shapes),
 *  LPX_EDTYPE. (swiglu itself is a binary elementwise op:
 *  lpx_meta_broadcast and lpx_meta_out.) */
LPX_API lpx_status lpx_meta_swiglu_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *gate,
                                            const lpx_tensor *up);

/* ---- creation (empty, zeros, full, arange, randn, rand) ---- */

/** A shape argument of ndims dims (the int[] value): at most
 *  LPX_MAX_DIMS; fills *ndim. Sizes are the tensor constructor's to check.
 *  Errors: LPX_EINVAL. */
LPX_API lpx_status lpx_meta_shape_arg(const char *op, const int64_t *dims, uint32_t ndims, int *ndim);

/** arange: finite start, end and step, step nonzero and pointing at end;
 *  *n = ceil((end - start) / step) elements (< 2^62). Errors: LPX_EINVAL,
 *  LPX_ERANGE. */
LPX_API lpx_status lpx_meta_arange(const char *op, double start, double end, double step, int64_t *n);

/** randn and rand: a registered floating-point dtype; *bits (may be
 *  NULL) = the uniform's bits for rand (mant_bits + 1, in 1..24). Errors:
 *  LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_random(const char *op, lpx_dtype dtype, int *bits);

/* ---- copies (cast, copy_, fill_) ---- */

/** cast: a registered target dtype. Errors: LPX_EDTYPE, LPX_EINVAL. */
LPX_API lpx_status lpx_meta_cast(const char *op, const lpx_tensor *x, lpx_dtype dtype);

/** copy_: dense dst and src, dst writable, src broadcasting to dst's
 *  shape (devices may differ: moving bytes between them is copy_'s job).
 *  Errors: LPX_EINVAL, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_copy(const char *op, const lpx_tensor *dst, const lpx_tensor *src);

/** fill_: a dense, writable dst whose dtype encodes single elements (not
 *  groups). Errors: LPX_EINVAL, LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_fill(const char *op, const lpx_tensor *dst);

/* ---- ops taking integer indices (cross_entropy, embedding) ---- */

/** An index tensor: i32 or i64. Errors: LPX_EINVAL (NULL), LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_indices(const char *op, const char *arg, const lpx_tensor *t);

/** cross_entropy and its backward: logits [N, C], target [N] of indices;
 *  fills N and C (either may be NULL). Whether each target lies in
 *  [0, C) (or is ignore_index) depends on the data: the kernel checks it.
 *  Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_cross_entropy(const char *op, const lpx_tensor *logits, const lpx_tensor *target,
                                          int64_t *n, int64_t *classes);

/** The dtype of cross_entropy's scalar loss for logits of dtype d: f32
 *  for floating-point dtypes narrower than 32 bits (a mean accumulated in
 *  double is not rounded to bf16's 8 bits: a 0.4% step that would swamp
 *  loss comparisons), d itself otherwise. */
LPX_API lpx_dtype lpx_meta_cross_entropy_dtype(lpx_dtype logits);

/** embedding: weight [V, D], indices of any shape with room for one more
 *  dim; the result is indices' shape + [D]. Errors: as above. */
LPX_API lpx_status lpx_meta_embedding(const char *op, const lpx_tensor *weight, const lpx_tensor *indices,
                                      int *out_ndim, int64_t *out_shape);

/** embedding_backward: grad = indices' shape + [D], num_weights >= 0;
 *  fills D (may be NULL). Errors: as above. */
LPX_API lpx_status lpx_meta_embedding_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *indices,
                                               int64_t num_weights, int64_t *dim);

/* ---- shapes shared by the elementwise and reducing ops ---- */

/** numpy broadcasting of a and b: the result's rank in *ndim and its shape
 *  in shape[LPX_MAX_DIMS] (dims of 1 stretch; missing leading dims count
 *  as 1). Errors: LPX_EINVAL (NULL), LPX_ESHAPE (dims that differ and are
 *  not 1), LPX_ERANGE (a result whose element count overflows int64). */
LPX_API lpx_status lpx_meta_broadcast(const char *op, const lpx_tensor *a, const lpx_tensor *b, int *ndim,
                                      int64_t *shape);

/** A caller's `out` for a result of `dtype` and shape[ndim]: a dense,
 *  writable tensor of exactly that shape and dtype (the backend checks its
 *  device and layout). Errors: LPX_EINVAL (NULL, a kind tensor, read-only),
 *  LPX_ESHAPE, LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_out(const char *op, const lpx_tensor *out, lpx_dtype dtype, int ndim,
                                const int64_t *shape);

/** A dim argument normalized against ndim (negative counts from the end).
 *  ndim 0 accepts dim 0 only; a reduction treats a scalar as one dim
 *  (passes 1), so that it accepts 0 and -1, as PyTorch. Errors:
 *  LPX_ERANGE. */
LPX_API lpx_status lpx_meta_dim(const char *op, int64_t dim, int ndim, int *out);

/** The geometry of a reduction (sum, mean, max, amax). */
typedef struct lpx_reduce_geom {
    bool reduced[LPX_MAX_DIMS];          /* dims folded */
    int out_ndim;                        /* kept dims (reduced ones as 1 with keepdim) */
    int64_t out_shape[LPX_MAX_DIMS];
    int64_t out_numel;
    int64_t count;                       /* elements folded into each output */
} lpx_reduce_geom;

/** A reduction of x over dims[0..ndims) (ndims 0: every dim), keepdim as
 *  PyTorch. `has_identity` false (max, amax): refuses to fold zero
 *  elements into a non-empty result. Errors: LPX_EINVAL (NULL, a dim
 *  listed twice), LPX_ERANGE (a dim out of range), LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_reduce(const char *op, const lpx_tensor *x, const int64_t *dims, int ndims, bool keepdim,
                                   bool has_identity, lpx_reduce_geom *g);

/* ---- the NF4 payload ops (ops_nf4.def) ---- */

/** block even in LPX_NF4_BLOCK_MIN..LPX_NF4_BLOCK_MAX, scaler_block in
 *  1..LPX_NF4_SCALER_BLOCK_MAX. Errors: LPX_EINVAL. */
LPX_API lpx_status lpx_meta_nf4_blocks(const char *op, int64_t block, int64_t scaler_block);

/** An NF4 payload: the block sizes, codes u8, qscalers i8, factors f32 and
 *  mean f32 [1], each a contiguous 1-D tensor, sized for one another
 *  (codes cover a whole number of scaler blocks); *padded gets the element
 *  count the codes cover (may be NULL). The backend checks the devices.
 *  Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_nf4_payload(const char *op, const lpx_tensor *codes, const lpx_tensor *qscalers,
                                        const lpx_tensor *factors, const lpx_tensor *mean, int64_t block,
                                        int64_t scaler_block, int64_t *padded);

/** A dequantized range [start, start + count) of a payload covering
 *  `padded` elements, into dtype f32, f16 or bf16; `out` (may be NULL) a
 *  dense contiguous tensor of that dtype and count elements. Errors:
 *  LPX_EDTYPE, LPX_ERANGE, LPX_ESHAPE (out). */
LPX_API lpx_status lpx_meta_nf4_range(const char *op, int64_t padded, int64_t start, int64_t count, lpx_dtype dtype,
                                      const lpx_tensor *out);

/** The sizes of an NF4 payload of x: elements padded to whole scaler
 *  blocks, blocks (one i8 scaler each), scaler blocks (one f32 factor each). */
typedef struct lpx_nf4_sizes {
    int64_t padded, blocks, scaler_blocks;
} lpx_nf4_sizes;

/** nf4_quantize: the block sizes, x floating-point; fills the payload's
 *  sizes. Whether x holds only finite values is data: the kernel checks
 *  it. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ERANGE. */
LPX_API lpx_status lpx_meta_nf4_quantize(const char *op, const lpx_tensor *x, int64_t block, int64_t scaler_block,
                                         lpx_nf4_sizes *sz);

/* ---- the dense GEMMs (matmul, linear, addmm) ---- */

/** The geometry of a GEMM op: batch GEMMs of [M, K] @ [K, N]; a_batch and
 *  b_batch are each operand's batch count (1: shared by every batch); the
 *  result's shape. */
typedef struct lpx_gemm_geom {
    int64_t batch, M, N, K;
    int64_t a_batch, b_batch;
    int out_ndim;
    int64_t out_shape[LPX_MAX_DIMS];
} lpx_gemm_geom;

/** matmul: a [..., M, K] @ b [K, N] (a's leading dims fold into M), or
 *  a [B, M, K] / [M, K] @ b [B, K, N] with batch broadcasting; `out` (may
 *  be NULL) as lpx_meta_out for a result of a's dtype. Errors:
 *  LPX_EINVAL, LPX_ESHAPE, LPX_EDTYPE (out). */
LPX_API lpx_status lpx_meta_matmul(const char *op, const lpx_tensor *a, const lpx_tensor *b, const lpx_tensor *out,
                                   lpx_gemm_geom *g);

/** linear: x [..., in] @ w [out, in]^T + bias [out] (bias may be NULL).
 *  Errors: LPX_EINVAL, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_linear(const char *op, const lpx_tensor *x, const lpx_tensor *w, const lpx_tensor *bias,
                                   lpx_gemm_geom *g);

/** addmm: beta c + alpha a [M, K] @ b [K, N], c broadcasting to [M, N].
 *  Errors: LPX_EINVAL, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_addmm(const char *op, const lpx_tensor *c, const lpx_tensor *a, const lpx_tensor *b,
                                  lpx_gemm_geom *g);

/* ---- the dense fp8 ops (ops_float8.def) ---- */

/** d is f8e4m3fn or f8e5m2 (argument `arg`). Errors: LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_fp8_dtype(const char *op, const char *arg, lpx_dtype d);

/** The geometry of fp8_scaled_mm: [M, K] @ [K, N]; which scales are
 *  per-row of a / per-column of b (else tensorwise, numel 1). */
typedef struct lpx_fp8_mm_geom {
    int64_t M, N, K;
    bool a_rowwise, b_colwise;
} lpx_fp8_mm_geom;

/** fp8_scaled_mm: a [M, K] and b [K, N] fp8 (not both e5m2), each
 *  row-major or column-major; a_scale_inv numel 1 or [M, 1], b_scale_inv
 *  numel 1 or [1, N] (floating-point); bias (may be NULL) [N]; out_dtype
 *  f32, bf16 or f16. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_fp8_scaled_mm(const char *op, const lpx_tensor *a, const lpx_tensor *a_scale_inv,
                                          const lpx_tensor *b, const lpx_tensor *b_scale_inv, const lpx_tensor *bias,
                                          lpx_dtype out_dtype, lpx_fp8_mm_geom *g);

/** fp8_scale_from_amax: amax floating-point, fp8 a format, scale_max >=
 *  0 (0: no clamp). Whether each amax is finite is data: the kernel checks
 *  it. Errors: LPX_EINVAL, LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_fp8_scale_from_amax(const char *op, const lpx_tensor *amax, lpx_dtype fp8,
                                                double scale_max);

/** The geometry of fp8_quantize: x viewed as [outer, D, inner] around the
 *  reduced dim (tensorwise: [1, numel, 1]); one scale per (outer, inner)
 *  group, in scale_shape (0-D tensorwise, else x's keepdim shape). */
typedef struct lpx_fp8_quant_geom {
    int64_t outer, D, inner, groups;
    bool tensorwise;
    int scale_ndim;
    int64_t scale_shape[LPX_MAX_DIMS];
} lpx_fp8_quant_geom;

/** fp8_quantize (and fp8_quantize_t's reference): x floating-point, fp8 a
 *  format, scale_max >= 0, the dim (when has_dim) valid for an x of >= 1
 *  dim; a static scale (may be NULL: dynamic) floating-point, numel 1 for
 *  a tensorwise quantization, else the keepdim shape. Its values (finite,
 *  > 0) are data: the kernel checks them. Errors: LPX_EINVAL, LPX_EDTYPE,
 *  LPX_ERANGE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_fp8_quantize(const char *op, const lpx_tensor *x, const lpx_tensor *scale, lpx_dtype fp8,
                                         bool has_dim, int64_t dim, double scale_max, lpx_fp8_quant_geom *g);

/** fp8_dequantize: q fp8, scale_inv floating-point of numel 1 or q's ndim
 *  with each dim 1 or q's size, dtype a byte-sized floating-point one.
 *  Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_fp8_dequantize(const char *op, const lpx_tensor *q, const lpx_tensor *scale_inv,
                                           lpx_dtype dtype);

/* ---- blockwise fp8 (fp8_quantize_block, fp8_dequantize_block, fp8_mm_block) ---- */

/** A 2-D tensor [rows, cols] cut into blocks of block_rows x block_cols:
 *  grid_rows = ceil(rows / block_rows), grid_cols likewise (the scale
 *  shape; the last blocks of a row or column are ragged). */
typedef struct lpx_fp8_block_geom {
    int64_t rows, cols, block_rows, block_cols, grid_rows, grid_cols;
} lpx_fp8_block_geom;

/** The grid of [rows, cols] (>= 0) in blocks whose sides are in
 *  1..65536. Errors: LPX_EINVAL (a side), LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_fp8_block_grid(const char *op, int64_t rows, int64_t cols, int64_t block_rows,
                                           int64_t block_cols, lpx_fp8_block_geom *g);

/** fp8_quantize_block: x 2-D floating-point, fp8 a format, block sides
 *  in range. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_fp8_quantize_block(const char *op, const lpx_tensor *x, lpx_dtype fp8, int64_t block_rows,
                                               int64_t block_cols, lpx_fp8_block_geom *g);

/** fp8_dequantize_block: q 2-D fp8 (any strides), scale_inv
 *  floating-point of exactly the grid's shape, dtype byte-sized
 *  floating-point. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_fp8_dequantize_block(const char *op, const lpx_tensor *q, const lpx_tensor *scale_inv,
                                                 int64_t block_rows, int64_t block_cols, lpx_dtype dtype,
                                                 lpx_fp8_block_geom *g);

/** The geometry of fp8_mm_block: a [M, K] @ b [K, N] and each operand's
 *  block grid (a.block_cols == b.block_rows: the K block). */
typedef struct lpx_fp8_block_mm_geom {
    int64_t M, N, K;
    lpx_fp8_block_geom a, b;
} lpx_fp8_block_mm_geom;

/** fp8_mm_block: a [M, K] and b [K, N] fp8 (not both e5m2, any strides),
 *  a's block columns equal to b's block rows, each scale_inv the shape of
 *  its operand's grid, bias (may be NULL) [N], out_dtype f32, bf16 or
 *  f16. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_fp8_mm_block(const char *op, const lpx_tensor *a, const lpx_tensor *a_scale_inv,
                                         int64_t a_block_rows, int64_t a_block_cols, const lpx_tensor *b,
                                         const lpx_tensor *b_scale_inv, int64_t b_block_rows, int64_t b_block_cols,
                                         const lpx_tensor *bias, lpx_dtype out_dtype, lpx_fp8_block_mm_geom *g);

/** nf4_mm: x [..., K] @ W, W [rows, cols] the first rows * cols elements
 *  of a payload covering `padded`, used as [K, N] = [rows, cols] or, when
 *  `transposed`, as its transpose; x floating-point; bias (may be NULL)
 *  [N]. Fills the GEMM geometry (M folds x's leading dims). Errors:
 *  LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_nf4_mm(const char *op, const lpx_tensor *x, int64_t padded, int64_t rows, int64_t cols,
                                   bool transposed, const lpx_tensor *bias, lpx_gemm_geom *g);

/** qlora_dropout: p in [0, 1), a floating-point result dtype of at least
 *  8 bits. Errors: LPX_EINVAL, LPX_EDTYPE. */
LPX_API lpx_status lpx_meta_qlora_dropout(const char *op, const lpx_tensor *x, double p, lpx_dtype dtype);

/* ---- the optimizer (adamw_) ---- */

/** The f32 constants of one AdamW step, as every backend applies them:
 *  m = b1 m + omb1 g; v = b2 v + omb2 g^2;
 *  p = p * decay - lr * (m / bc1) / (sqrt(v / bc2) + eps). */
typedef struct lpx_adamw_consts {
    float b1, omb1, b2, omb2, lr, eps, decay, bc1, bc2;
} lpx_adamw_consts;

/** adamw_ over its 10 arguments (the op's schema order): four lists of
 *  one length; params and grads floating-point, exp_avg and exp_avg_sq
 *  f32; every tensor contiguous with params[i]'s element count, the
 *  written ones (params, state) writable; lr >= 0, betas in [0, 1), eps >
 *  0, weight_decay >= 0, step >= 1. Fills *k (may be NULL). The backend
 *  checks each tensor's device and kind first. Errors: LPX_EINVAL,
 *  LPX_EDTYPE, LPX_ESHAPE. */
LPX_API lpx_status lpx_meta_adamw(const char *op, const lpx_value *args, lpx_adamw_consts *k);

LPX_END_DECLS

#endif
