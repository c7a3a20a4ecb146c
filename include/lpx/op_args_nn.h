/* lpx — the spec families of linear algebra beyond matmul (linear, addmm), the neural-network ops (rmsnorm ... embedding_backward), the transformer ops (rope, attention) and swiglu_backward: the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own).
 *
 * "floating-point" below: dense, of a built-in floating-point dtype (the
 * first checks of op_args.h). The shapes each family accepts are its meta
 * function's (lpx/meta.h), named at each struct. What stays a kernel's
 * own: checks that read data (a target of cross_entropy or an index of
 * embedding out of range: LPX_ERANGE naming its position) and the limits
 * of a backend's code (BLAS's int range, a CUDA grid, a head_dim). */
#ifndef LPX_OP_ARGS_NN_H
#define LPX_OP_ARGS_NN_H

/** family `linear`: linear(x, w, bias?). x, w and bias (when given)
 *  floating-point, in that order; then lpx_meta_linear's shapes. The
 *  result has x's dtype and g.out_shape (x's leading dims, out_features);
 *  g: M = x's rows, K = in_features, N = out_features, batch 1. */
typedef struct lpx_linear_args {
    lpx_tensor *x, *w;
    lpx_tensor *bias;                /* NULL when absent */
    lpx_gemm_geom g;
} lpx_linear_args;

/** family `addmm`: addmm(c, a, b, beta, alpha) = beta c + alpha a @ b.
 *  c, a and b floating-point, in that order; then lpx_meta_addmm's shapes
 *  (c broadcasts to [M, N]). The result has a's dtype and shape [M, N]. */
typedef struct lpx_addmm_args {
    lpx_tensor *c, *a, *b;
    double beta, alpha;
    lpx_gemm_geom g;
} lpx_addmm_args;

/** family `rmsnorm`: rmsnorm(x, weight?, eps). x floating-point,
 *  lpx_meta_rmsnorm's shapes, then weight (when given) floating-point.
 *  Results: y (x's shape and dtype) and rstd (f32, x's shape with the last
 *  dim 1). */
typedef struct lpx_rmsnorm_args {
    lpx_tensor *x;
    lpx_tensor *weight;              /* NULL: all ones */
    double eps;
    int64_t rows, dim;               /* x as rows x dim (dim: its last) */
} lpx_rmsnorm_args;

/** family `rmsnorm_backward`: rmsnorm_backward(grad, x, weight?, rstd).
 *  grad, x and rstd floating-point, lpx_meta_rmsnorm_backward's shapes,
 *  then weight (when given) floating-point. Results: grad_x (x's shape
 *  and dtype) and grad_w ([dim] in grad_w_dtype). */
typedef struct lpx_rmsnorm_backward_args {
    lpx_tensor *grad, *x;
    lpx_tensor *weight;              /* NULL: all ones */
    lpx_tensor *rstd;
    int64_t rows, dim;
    lpx_dtype grad_w_dtype;          /* weight's dtype, x's without one */
} lpx_rmsnorm_backward_args;

/** family `cross_entropy`: cross_entropy(logits, target, ignore_index)
 *  and cross_entropy_backward(..., grad). logits floating-point, target
 *  dense, then lpx_meta_cross_entropy's dtypes and shapes (target i32 or
 *  i64). The result: the scalar loss in lpx_meta_cross_entropy_dtype of
 *  logits' dtype, or grad_logits (logits' shape and dtype): `dtype`.
 *  Whether each target lies in [0, classes) (or is ignore_index) is data:
 *  the kernel's to check. */
typedef struct lpx_cross_entropy_args {
    lpx_tensor *logits, *target;
    int64_t ignore_index;
    double grad;                     /* the backward's upstream gradient; 0 for cross_entropy */
    int64_t n, classes;              /* logits [n, classes] */
    lpx_dtype dtype;                 /* the result's */
} lpx_cross_entropy_args;

/** family `mse_loss`: mse_loss(a, b) and mse_loss_backward(a, b, grad).
 *  a and b floating-point, of one shape. The result: the scalar loss or
 *  grad_a, in a's dtype (grad_a in a's shape). */
typedef struct lpx_mse_loss_args {
    lpx_tensor *a, *b;
    double grad;                     /* the backward's upstream gradient; 0 for mse_loss */
} lpx_mse_loss_args;

/** family `embedding`: embedding(weight, indices). weight and indices
 *  dense (weight of any dtype: rows are copied byte for byte), then
 *  lpx_meta_embedding's dtypes and shapes (indices i32 or i64). The
 *  result has weight's dtype and out_shape (indices' shape + [dim]).
 *  Whether each index lies in [0, num) is data: the kernel's to check. */
typedef struct lpx_embedding_args {
    lpx_tensor *weight, *indices;
    int64_t num, dim;                /* weight [num, dim] */
    int out_ndim;
    int64_t out_shape[LPX_MAX_DIMS];
} lpx_embedding_args;

/** family `embedding_backward`: embedding_backward(grad, indices,
 *  num_weights). grad floating-point, indices dense, then
 *  lpx_meta_embedding_backward's dtypes and shapes. The result has grad's
 *  dtype and shape [num_weights, dim]. Indices out of [0, num_weights):
 *  data, the kernel's. */
typedef struct lpx_embedding_backward_args {
    lpx_tensor *grad, *indices;
    int64_t num_weights, dim;
} lpx_embedding_backward_args;

/** family `rope`: rope(x, inv_freq, offset) and rope_backward(grad,
 *  inv_freq, offset). lpx_meta_rope's shapes and range first, then x (or
 *  grad) and inv_freq floating-point. The result has x's shape and dtype. */
typedef struct lpx_rope_args {
    lpx_tensor *x;                   /* x, or rope_backward's grad */
    lpx_tensor *inv_freq;
    int64_t offset;
    int64_t half;                    /* head_dim / 2 */
} lpx_rope_args;

/** family `attention`: attention(q, k, v, causal, scale).
 *  lpx_meta_attention's dtypes, shapes and scale first, then q, k and v
 *  floating-point. Results: out (q's shape and dtype) and lse (f32
 *  [batch, heads, q_len]). */
typedef struct lpx_attention_args {
    lpx_tensor *q, *k, *v;
    bool causal;
    double scale;
    lpx_attention_geom g;
} lpx_attention_args;

/** family `attention_backward`: attention_backward(grad, q, k, v, out,
 *  lse, causal, scale). lpx_meta_attention_backward's checks first, then
 *  grad, q, k, v, out and lse floating-point. Results: grad_q, grad_k,
 *  grad_v in the shape and dtype of q, k, v. */
typedef struct lpx_attention_backward_args {
    lpx_tensor *grad, *q, *k, *v, *out, *lse;
    bool causal;
    double scale;
    lpx_attention_geom g;
} lpx_attention_backward_args;

/** family `swiglu_backward`: swiglu_backward(grad, gate, up).
 *  lpx_meta_swiglu_backward's shapes and dtypes first (one shape, each
 *  floating-point), then all three dense. Results: grad_gate (gate's
 *  shape and dtype) and grad_up (up's dtype). */
typedef struct lpx_swiglu_backward_args {
    lpx_tensor *grad, *gate, *up;
} lpx_swiglu_backward_args;

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_NN(X)                                                                         \
    X(linear) X(addmm) X(rmsnorm) X(rmsnorm_backward) X(cross_entropy) X(mse_loss) X(embedding)          \
    X(embedding_backward) X(rope) X(attention) X(attention_backward) X(swiglu_backward)

#endif
