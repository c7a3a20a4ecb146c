/* lpx — built-in op ids and the typed convenience API.
 *
 * Each typed function builds a small argument array on the stack and calls
 * lpx_dispatch, so kinds see every call. Functions returning a tensor give
 * the caller one new reference through `out` (*out is set to NULL on
 * failure). `_out` variants write into a caller tensor instead (dense or
 * kind, must have the result's shape; may alias an input of the same
 * layout) and return no new reference. Errors are those of the kernel:
 * LPX_EINVAL (NULL), LPX_ESHAPE, LPX_EDTYPE, LPX_EDEVICE, LPX_ENOTIMPL,
 * LPX_ENOMEM, each with a message in lpx_last_error().
 *
 * Each op's function here has the signature its schema in ops.def gives
 * (Tensor -> lpx_tensor *, int -> int64_t, int[] -> int n, const int64_t *,
 * results -> lpx_tensor ** after the arguments, ...): the build checks every
 * prototype against its row and generates the wrappers (scripts/gen-ops.py;
 * the exceptions are listed in docs/ARCHITECTURE.md, "The op spec"). */
#ifndef LPX_OPS_H
#define LPX_OPS_H

#include <stdint.h>
#include <stdbool.h>
#include "export.h"
#include "status.h"
#include "tensor.h"
#include "dispatch.h"
#include "op_args.h"

LPX_BEGIN_DECLS

/* Built-in op ids: LPX_OP_add, LPX_OP_matmul, ... (see ops.def). */
enum {
#define LPX_OP(name, spec, schema) LPX_OP_##name,
#include "ops.def"
#undef LPX_OP
    LPX_OP_BUILTIN_COUNT
};

/* creation (device: lpx_cpu() or another registered device) */
LPX_API lpx_status lpx_empty(int ndim, const int64_t *shape, lpx_dtype dtype, lpx_device dev, lpx_tensor **out);
LPX_API lpx_status lpx_zeros(int ndim, const int64_t *shape, lpx_dtype dtype, lpx_device dev, lpx_tensor **out);
LPX_API lpx_status lpx_full(int ndim, const int64_t *shape, double value, lpx_dtype dtype, lpx_device dev, lpx_tensor **out);
/** [start, end) by step (step != 0), like torch.arange. */
LPX_API lpx_status lpx_arange(double start, double end, double step, lpx_dtype dtype, lpx_device dev, lpx_tensor **out);
/** Standard normal values; element i depends only on (seed, i), so the
 *  result is the same for any thread count and across runs. */
LPX_API lpx_status lpx_randn(int ndim, const int64_t *shape, uint64_t seed, lpx_dtype dtype, lpx_device dev, lpx_tensor **out);
/** Uniform [0, 1) values; same reproducibility as lpx_randn. */
LPX_API lpx_status lpx_rand(int ndim, const int64_t *shape, uint64_t seed, lpx_dtype dtype, lpx_device dev, lpx_tensor **out);

/* views: share storage with x (dense); kinds decide for their tensors */
/** New shape with the same numel; one dim may be -1. LPX_ESHAPE if the
 *  strides cannot express it without a copy (use lpx_reshape). */
LPX_API lpx_status lpx_view(lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out);
/** Like lpx_view, copying only when a view is impossible. */
LPX_API lpx_status lpx_reshape(lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out);
/** Swaps two dims (negative dims count from the end). */
LPX_API lpx_status lpx_transpose(lpx_tensor *x, int64_t dim0, int64_t dim1, lpx_tensor **out);
/** Transpose of a 2-D tensor (0-D/1-D returned as is). */
LPX_API lpx_status lpx_t(lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_permute(lpx_tensor *x, int ndim, const int64_t *dims, lpx_tensor **out);
/** x[start:end:step] along dim (python semantics for negative and clamped
 *  bounds; step >= 1). */
LPX_API lpx_status lpx_slice(lpx_tensor *x, int64_t dim, int64_t start, int64_t end, int64_t step, lpx_tensor **out);
/** x[start:start+length] along dim; LPX_ERANGE if out of bounds. */
LPX_API lpx_status lpx_narrow(lpx_tensor *x, int64_t dim, int64_t start, int64_t length, lpx_tensor **out);
/** Broadcast view (size-1 dims to n, new leading dims); -1 keeps a dim. */
LPX_API lpx_status lpx_expand(lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out);
/** x itself (retained) if contiguous, else a contiguous copy. */
LPX_API lpx_status lpx_contiguous(lpx_tensor *x, lpx_tensor **out);
/** Concatenation along dim; all inputs share dtype and the other dims. */
LPX_API lpx_status lpx_cat(lpx_tensor *const *xs, int n, int64_t dim, lpx_tensor **out);
/** Contiguous copy with its own storage. */
LPX_API lpx_status lpx_clone(lpx_tensor *x, lpx_tensor **out);
/** Same data, a new handle (kinds: the no-op that drops autograd-style
 *  wrappers in frameworks). */
LPX_API lpx_status lpx_detach(lpx_tensor *x, lpx_tensor **out);
/** Splits along dim into pieces of `size` (last may be smaller) using
 *  lpx_narrow. Fills outs[0..*n) (new references); LPX_ERANGE if more than
 *  `cap` pieces would be needed. */
LPX_API lpx_status lpx_split(lpx_tensor *x, int64_t size, int64_t dim, lpx_tensor **outs, int cap, int *n);
/** torch.chunk: `chunks` pieces of ceil(len/chunks) (fewer if the length
 *  runs out), via lpx_narrow. */
LPX_API lpx_status lpx_chunk(lpx_tensor *x, int chunks, int64_t dim, lpx_tensor **outs, int cap, int *n);

/* elementwise (binary: numpy broadcasting; result dtype = a's dtype) */
LPX_API lpx_status lpx_add(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out);
LPX_API lpx_status lpx_sub(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out);
LPX_API lpx_status lpx_mul(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out);
LPX_API lpx_status lpx_div(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out);
LPX_API lpx_status lpx_add_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out);
LPX_API lpx_status lpx_sub_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out);
LPX_API lpx_status lpx_mul_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out);
LPX_API lpx_status lpx_div_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out);
LPX_API lpx_status lpx_add_scalar(lpx_tensor *a, double s, lpx_tensor **out);
LPX_API lpx_status lpx_mul_scalar(lpx_tensor *a, double s, lpx_tensor **out);
LPX_API lpx_status lpx_neg(lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_abs(lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_sqrt(lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_exp(lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_relu(lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_silu(lpx_tensor *x, lpx_tensor **out);
/** GELU, exact erf form. */
LPX_API lpx_status lpx_gelu(lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_relu_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_silu_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor **out);
LPX_API lpx_status lpx_gelu_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor **out);
/** SwiGLU, the Llama MLP's activation, in one kernel: out = silu(gate) * up
 *  (silu(x) = x / (1 + exp(-x))), computed in f32 from the storage dtypes
 *  and rounded once (RNE) to gate's dtype; in f32 the bits of lpx_silu
 *  then lpx_mul. Otherwise lpx_mul's contract: numpy broadcasting of gate
 *  and up, any strides, a new tensor in *out (the caller's reference).
 *  Errors: LPX_EINVAL (NULL), LPX_ESHAPE (shapes that do not broadcast),
 *  LPX_EDTYPE, LPX_EDEVICE. */
LPX_API lpx_status lpx_swiglu(lpx_tensor *gate, lpx_tensor *up, lpx_tensor **out);
/** lpx_swiglu into the caller's `out` (the broadcast shape, gate's dtype;
 *  may be gate or up itself); no new reference. Errors: as lpx_swiglu,
 *  and those of a bad `out` (LPX_ESHAPE, LPX_EDTYPE, LPX_EINVAL). */
LPX_API lpx_status lpx_swiglu_out(lpx_tensor *gate, lpx_tensor *up, lpx_tensor *out);
/** The backward of lpx_swiglu in one kernel: from grad (d out), gate and
 *  up, all three of one shape (no broadcasting, any strides),
 *  *grad_gate = grad * up * silu'(gate) in gate's dtype and
 *  *grad_up = grad * silu(gate) in up's dtype, each computed in f32 and
 *  rounded once; new contiguous tensors (the caller's references). Either
 *  result pointer may be NULL to drop it, not both. Errors: LPX_EINVAL
 *  (NULL), LPX_ESHAPE (shapes differ: both named), LPX_EDTYPE (a
 *  non-floating dtype), LPX_EDEVICE. */
LPX_API lpx_status lpx_swiglu_backward(lpx_tensor *grad, lpx_tensor *gate, lpx_tensor *up, lpx_tensor **grad_gate,
                                       lpx_tensor **grad_up);
/** Converts to dtype (RNE; saturate: see LPX_CONVERT_SATURATE). */
LPX_API lpx_status lpx_cast(lpx_tensor *x, lpx_dtype dtype, bool saturate, lpx_tensor **out);
/** dst[...] = src (broadcast, converted to dst's dtype), in place. */
LPX_API lpx_status lpx_copy_(lpx_tensor *dst, lpx_tensor *src);
/** dst[...] = value, in place. */
LPX_API lpx_status lpx_fill_(lpx_tensor *dst, double value);

/* reductions: dims NULL/ndims 0 = all dims; results in x's dtype,
 * accumulated in double */
LPX_API lpx_status lpx_sum(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out);
LPX_API lpx_status lpx_mean(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out);
LPX_API lpx_status lpx_max(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out);
/** max(|x|); NaN propagates. */
LPX_API lpx_status lpx_amax(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out);
/** L2 norm. */
LPX_API lpx_status lpx_norm(lpx_tensor *x, int ndims, const int64_t *dims, bool keepdim, lpx_tensor **out);

/* linear algebra (f32 accumulation through cblas_sgemm) */
/** a [M,K] @ b [K,N], or batched [B,M,K] @ [B,K,N] / [B,M,K] @ [K,N]. */
LPX_API lpx_status lpx_matmul(lpx_tensor *a, lpx_tensor *b, lpx_tensor **out);
LPX_API lpx_status lpx_matmul_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out);
/** x [..., in] @ w[out, in]^T (+ bias[out]). bias may be NULL. */
LPX_API lpx_status lpx_linear(lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor **out);
/** beta * c + alpha * (a @ b); c broadcasts to [M,N]. */
LPX_API lpx_status lpx_addmm(lpx_tensor *c, lpx_tensor *a, lpx_tensor *b, double beta, double alpha, lpx_tensor **out);

/* neural-network ops */
/** y = x * rstd * weight over the last dim; rstd [..., 1] is kept for the
 *  backward. weight may be NULL. */
LPX_API lpx_status lpx_rmsnorm(lpx_tensor *x, lpx_tensor *weight, double eps, lpx_tensor **y, lpx_tensor **rstd);
/** grad_w is NULL-able (set only when weight is given). */
LPX_API lpx_status lpx_rmsnorm_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor *weight, lpx_tensor *rstd,
                                        lpx_tensor **grad_x, lpx_tensor **grad_w);
LPX_API lpx_status lpx_softmax(lpx_tensor *x, int64_t dim, lpx_tensor **out);
LPX_API lpx_status lpx_softmax_backward(lpx_tensor *grad, lpx_tensor *y, int64_t dim, lpx_tensor **out);
/** Mean softmax cross-entropy of logits [N, C] against integer targets [N]
 *  (i32/i64); targets equal to ignore_index are skipped. Scalar result,
 *  f32 for logits narrower than 32 bits (lpx_meta_cross_entropy_dtype),
 *  else in the logits' dtype. */
LPX_API lpx_status lpx_cross_entropy(lpx_tensor *logits, lpx_tensor *target, int64_t ignore_index, lpx_tensor **loss);
/** d(grad * loss)/d logits. */
LPX_API lpx_status lpx_cross_entropy_backward(lpx_tensor *logits, lpx_tensor *target, int64_t ignore_index,
                                              double grad, lpx_tensor **grad_logits);
/** mean((a - b)^2), scalar. */
LPX_API lpx_status lpx_mse_loss(lpx_tensor *a, lpx_tensor *b, lpx_tensor **loss);
LPX_API lpx_status lpx_mse_loss_backward(lpx_tensor *a, lpx_tensor *b, double grad, lpx_tensor **grad_a);
/** weight [V, D] rows gathered by integer indices [...] -> [..., D];
 *  LPX_ERANGE for an index outside [0, V). */
LPX_API lpx_status lpx_embedding(lpx_tensor *weight, lpx_tensor *indices, lpx_tensor **out);
/** Scatter-add of grad [..., D] rows into [num_weights, D]. */
LPX_API lpx_status lpx_embedding_backward(lpx_tensor *grad, lpx_tensor *indices, int64_t num_weights, lpx_tensor **out);

/* transformer ops: tensors laid out [B, T, H, D] (batch, positions, heads,
 * head dim), the view of a linear's [B*T, H*D] output, so no transpose is
 * needed around them. Checks are shared by every backend (lpx/meta.h). */
/** Rotary position embedding, Hugging Face's convention (rotate_half):
 *  with x = [x1 | x2] split in halves of D/2 along the last dim and
 *  angle_i = (offset + t) * inv_freq[i] for the row at position t,
 *  out = [x1 cos - x2 sin | x2 cos + x1 sin]. x [B, T, H, D] (D even, any
 *  float dtype, any strides), inv_freq [D/2] (any float dtype, read as f32:
 *  the caller's frequencies, so Llama 3.1's or any other scaling is the
 *  caller's choice). Computes in f32; out is new, contiguous, x's dtype.
 *  Errors: LPX_ESHAPE (rank, odd D, inv_freq's length), LPX_EDTYPE,
 *  LPX_ERANGE (offset < 0). */
LPX_API lpx_status lpx_rope(lpx_tensor *x, lpx_tensor *inv_freq, int64_t offset, lpx_tensor **out);
/** The backward of lpx_rope: the rotation by -angle (its transpose).
 *  Same arguments and errors, grad in place of x. */
LPX_API lpx_status lpx_rope_backward(lpx_tensor *grad, lpx_tensor *inv_freq, int64_t offset, lpx_tensor **grad_x);
/** Scaled dot-product attention with grouped-query heads:
 *  q [B, T, Hq, D], k and v [B, S, Hkv, D] with Hq a multiple of Hkv
 *  (query head h reads k/v head h / (Hq / Hkv); k and v are never
 *  repeated in memory). out[b,t,h] = softmax_j(scale * q.k_j) v_j over the
 *  keys j, with causal: j <= t + S - T (aligned bottom-right; S >= T).
 *  The T x S score matrix is never stored: *out (q's dtype, contiguous
 *  [B, T, Hq, D]) and *lse (f32 [B, Hq, T], the log-sum-exp of each
 *  row's scaled scores, which the backward needs) are the only results.
 *  q, k, v: one float dtype, any strides. scale > 0 and finite (usually
 *  1/sqrt(D)). Errors: LPX_ESHAPE, LPX_EDTYPE, LPX_EINVAL (scale). */
LPX_API lpx_status lpx_attention(lpx_tensor *q, lpx_tensor *k, lpx_tensor *v, bool causal, double scale,
                                 lpx_tensor **out, lpx_tensor **lse);
/** The backward of lpx_attention: from grad (d out), the forward's inputs,
 *  out and lse, the gradients of q, k and v (each in its input's dtype,
 *  contiguous; dk and dv sum over the query heads sharing a k/v head).
 *  Any of dq/dk/dv may be NULL to drop it. Errors: those of lpx_attention,
 *  and LPX_ESHAPE when grad, out or lse do not match q. */
LPX_API lpx_status lpx_attention_backward(lpx_tensor *grad, lpx_tensor *q, lpx_tensor *k, lpx_tensor *v,
                                          lpx_tensor *out, lpx_tensor *lse, bool causal, double scale,
                                          lpx_tensor **dq, lpx_tensor **dk, lpx_tensor **dv);

/* optimizers */
/** One fused AdamW step, in place, over n parameters: for each i, params[i]
 *  (any float dtype), grads[i] (any float dtype), exp_avg[i] and
 *  exp_avg_sq[i] (f32) are dense, contiguous, on one device and of equal
 *  numel. Per element, in f32 and in this order (the arithmetic of
 *  lpx_fsdp_adamw_step):
 *    m = b1 * m + (1 - b1) * g
 *    v = b2 * v + (1 - b2) * g * g
 *    p = p * (1 - lr * wd) - lr * (m / bc1) / (sqrt(v / bc2) + eps)
 *  with bc1 = 1 - b1^step, bc2 = 1 - b2^step and 1 - b1, 1 - b2,
 *  1 - lr * wd computed in double and rounded to f32; p is decoded to f32
 *  and encoded back with one round-to-nearest-even. step >= 1 is the step
 *  being taken (1 for the first). The CUDA kernel is bit-identical and
 *  updates the whole list in one launch. n = 0 does nothing. Errors:
 *  LPX_EINVAL (NULL arrays, lr < 0, betas outside [0, 1), eps <= 0,
 *  weight_decay < 0, step < 1, a read-only or non-contiguous tensor),
 *  LPX_ESHAPE (numel mismatch), LPX_EDTYPE, LPX_EDEVICE. */
LPX_API lpx_status lpx_adamw_(lpx_tensor *const *params, lpx_tensor *const *grads, lpx_tensor *const *exp_avg,
                              lpx_tensor *const *exp_avg_sq, int n, double lr, double beta1, double beta2,
                              double eps, double weight_decay, int64_t step);

/** Reads element `index` (flat, logical row-major order) of a dense tensor
 *  as double. A tensor on a device is read with one copy of that element,
 *  which waits for the work queued on it (as torch's .item()). Errors:
 *  LPX_EINVAL (kind tensor), LPX_ERANGE, LPX_EDTYPE (a packed sub-byte
 *  dtype on a device), LPX_EDEVICE (the copy failed). */
LPX_API lpx_status lpx_item(const lpx_tensor *x, int64_t index, double *value);

LPX_END_DECLS

#endif
