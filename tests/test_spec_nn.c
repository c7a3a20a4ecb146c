/* The op spec of the nn group (include/lpx/op_args_nn.h, dispatch/spec_nn.c):
 * linear, addmm, rmsnorm, rmsnorm_backward, cross_entropy(_backward),
 * mse_loss(_backward), embedding, embedding_backward, rope(_backward),
 * attention, attention_backward and swiglu_backward have their contract
 * checked once, by the dispatcher, before any backend kernel runs.
 *
 * On the harness (tests/spec_harness.h): every bad argument set is refused
 * alike by the CPU and by a backend whose kernels check nothing, with the
 * message the CPU kernels wrote themselves before the spec (pinned here);
 * good ones reach the check-free kernel with the normalised arguments.
 * What stays a kernel's own is a check of data: a target or an index out
 * of range reaches the kernel (test_refused_by_kernel). */
#include <math.h>
#include "spec_harness.h"

#define F32 LPX_F32
#define I32 LPX_I32

static const bad_case bad[] = {
    /* linear(x, w, bias?) */
    {"linear", 3, {T(I32, 2, 2, 3), T(F32, 2, 4, 3), NONE}, LPX_EDTYPE,
     "linear: x has dtype i32; linear takes floating-point tensors"},
    {"linear", 3, {T(F32, 2, 2, 3), T(LPX_I64, 2, 4, 3), NONE}, LPX_EDTYPE,
     "linear: w has dtype i64; linear takes floating-point tensors"},
    {"linear", 3, {T(F32, 2, 2, 3), T(F32, 2, 4, 3), T(LPX_U8, 1, 4)}, LPX_EDTYPE,
     "linear: bias has dtype u8; linear takes floating-point tensors"},
    {"linear", 3, {T(F32, 0, 0), T(F32, 2, 4, 3), NONE}, LPX_ESHAPE,
     "linear: x [] and w [4, 3]: expected x [..., in] and w [out, in]"},
    {"linear", 3, {T(F32, 2, 2, 3), T(F32, 1, 3), NONE}, LPX_ESHAPE,
     "linear: x [2, 3] and w [3]: expected x [..., in] and w [out, in]"},
    {"linear", 3, {T(F32, 2, 2, 3), T(F32, 2, 4, 5), NONE}, LPX_ESHAPE,
     "linear: x [2, 3] and w [4, 5]: in_features mismatch (3 vs 5)"},
    {"linear", 3, {T(F32, 3, 2, 2, 3), T(F32, 2, 4, 3), T(F32, 1, 5)}, LPX_ESHAPE,
     "linear: bias [5] does not match out_features 4 of w [4, 3]"},
    {"linear", 3, {T(I32, 2, 2, 3), T(F32, 2, 4, 5), NONE}, LPX_EDTYPE,
     "linear: x has dtype i32; linear takes floating-point tensors"},
    /* addmm(c, a, b, beta, alpha) */
    {"addmm", 5, {T(I32, 2, 2, 4), T(F32, 2, 2, 3), T(F32, 2, 3, 4), F(1), F(1)}, LPX_EDTYPE,
     "addmm: c has dtype i32; addmm takes floating-point tensors"},
    {"addmm", 5, {T(F32, 2, 2, 4), T(LPX_BOOL, 2, 2, 3), T(F32, 2, 3, 4), F(1), F(1)}, LPX_EDTYPE,
     "addmm: a has dtype bool; addmm takes floating-point tensors"},
    {"addmm", 5, {T(F32, 2, 2, 4), T(F32, 2, 2, 3), T(I32, 2, 3, 4), F(1), F(1)}, LPX_EDTYPE,
     "addmm: b has dtype i32; addmm takes floating-point tensors"},
    {"addmm", 5, {T(F32, 2, 2, 4), T(F32, 1, 3), T(F32, 2, 3, 4), F(1), F(1)}, LPX_ESHAPE,
     "addmm: a [3] and b [3, 4]: expected 2-D matrices"},
    {"addmm", 5, {T(F32, 2, 2, 4), T(F32, 2, 2, 3), T(F32, 2, 5, 4), F(1), F(1)}, LPX_ESHAPE,
     "addmm: a [2, 3] and b [5, 4]: K mismatch (3 vs 5)"},
    {"addmm", 5, {T(F32, 2, 3, 4), T(F32, 2, 2, 3), T(F32, 2, 3, 4), F(1), F(1)}, LPX_ESHAPE,
     "addmm: c [3, 4] does not broadcast to the product's shape [2, 4]"},
    {"addmm", 5, {T(F32, 3, 1, 2, 4), T(F32, 2, 2, 3), T(F32, 2, 3, 4), F(0.5), F(2)}, LPX_ESHAPE,
     "addmm: c [1, 2, 4] does not broadcast to the product's shape [2, 4]"},
    /* rmsnorm(x, weight?, eps) */
    {"rmsnorm", 3, {T(I32, 2, 2, 4), NONE, F(1e-5)}, LPX_EDTYPE,
     "rmsnorm: x has dtype i32; rmsnorm takes floating-point tensors"},
    {"rmsnorm", 3, {T(F32, 0, 0), NONE, F(1e-5)}, LPX_ESHAPE,
     "rmsnorm: x is a scalar; it needs a last dim to normalize"},
    {"rmsnorm", 3, {T(F32, 2, 2, 4), T(F32, 1, 3), F(1e-5)}, LPX_ESHAPE,
     "rmsnorm: weight [3] must be [4] for x [2, 4]"},
    {"rmsnorm", 3, {T(F32, 2, 2, 4), T(I32, 1, 4), F(1e-5)}, LPX_EDTYPE,
     "rmsnorm: weight has dtype i32; rmsnorm takes floating-point tensors"},
    {"rmsnorm", 3, {T(F32, 2, 2, 4), T(I32, 1, 3), F(1e-5)}, LPX_ESHAPE,
     "rmsnorm: weight [3] must be [4] for x [2, 4]"},
    {"rmsnorm", 3, {T(F32, 2, 2, 4), T(F32, 2, 1, 4), F(1e-5)}, LPX_ESHAPE,
     "rmsnorm: weight [1, 4] must be [4] for x [2, 4]"},
    /* rmsnorm_backward(grad, x, weight?, rstd) */
    {"rmsnorm_backward", 4, {T(I32, 2, 2, 4), T(F32, 2, 2, 4), NONE, T(F32, 2, 2, 1)}, LPX_EDTYPE,
     "rmsnorm_backward: grad has dtype i32; rmsnorm_backward takes floating-point tensors"},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(I32, 2, 2, 4), NONE, T(F32, 2, 2, 1)}, LPX_EDTYPE,
     "rmsnorm_backward: x has dtype i32; rmsnorm_backward takes floating-point tensors"},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), T(I32, 1, 4), T(I32, 2, 2, 1)}, LPX_EDTYPE,
     "rmsnorm_backward: rstd has dtype i32; rmsnorm_backward takes floating-point tensors"},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 3), NONE, T(F32, 2, 2, 1)}, LPX_ESHAPE,
     "rmsnorm_backward: grad [2, 4] and x [2, 3] must have the same shape"},
    {"rmsnorm_backward", 4, {T(F32, 0, 0), T(F32, 0, 0), NONE, T(F32, 1, 1)}, LPX_ESHAPE,
     "rmsnorm_backward: x is a scalar; it needs a last dim to normalize"},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), T(F32, 1, 5), T(F32, 2, 2, 1)}, LPX_ESHAPE,
     "rmsnorm_backward: weight [5] must be [4] for x [2, 4]"},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), NONE, T(F32, 2, 3, 1)}, LPX_ESHAPE,
     "rmsnorm_backward: rstd [3, 1] has 3 elements, x [2, 4] has 2 rows"},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), T(I32, 1, 4), T(F32, 1, 2)}, LPX_EDTYPE,
     "rmsnorm_backward: weight has dtype i32; rmsnorm_backward takes floating-point tensors"},
    /* cross_entropy(logits, target, ignore_index), and its backward */
    {"cross_entropy", 3, {T(I32, 2, 2, 5), T(LPX_I64, 1, 2), I(-100)}, LPX_EDTYPE,
     "cross_entropy: logits has dtype i32; cross_entropy takes floating-point tensors"},
    {"cross_entropy", 3, {T(F32, 2, 2, 5), T(F32, 1, 2), I(-100)}, LPX_EDTYPE,
     "cross_entropy: target has dtype f32; indices must be i32 or i64"},
    {"cross_entropy", 3, {T(F32, 1, 4), T(LPX_I64, 1, 4), I(-100)}, LPX_ESHAPE,
     "cross_entropy: logits [4] must be [N, C]"},
    {"cross_entropy", 3, {T(F32, 2, 2, 5), T(I32, 1, 3), I(-100)}, LPX_ESHAPE,
     "cross_entropy: target [3] must be [2] for logits [2, 5]"},
    {"cross_entropy", 3, {T(F32, 2, 2, 5), T(I32, 2, 2, 1), I(-100)}, LPX_ESHAPE,
     "cross_entropy: target [2, 1] must be [2] for logits [2, 5]"},
    {"cross_entropy_backward", 4, {T(LPX_U8, 2, 2, 5), T(I32, 1, 2), I(-100), F(1)}, LPX_EDTYPE,
     "cross_entropy_backward: logits has dtype u8; cross_entropy_backward takes floating-point tensors"},
    {"cross_entropy_backward", 4, {T(F32, 2, 2, 5), T(LPX_BF16, 1, 2), I(-100), F(1)}, LPX_EDTYPE,
     "cross_entropy_backward: target has dtype bf16; indices must be i32 or i64"},
    {"cross_entropy_backward", 4, {T(F32, 2, 2, 5), T(I32, 1, 5), I(-100), F(1)}, LPX_ESHAPE,
     "cross_entropy_backward: target [5] must be [2] for logits [2, 5]"},
    /* mse_loss(a, b), and its backward */
    {"mse_loss", 2, {T(I32, 1, 3), T(F32, 1, 3)}, LPX_EDTYPE,
     "mse_loss: a has dtype i32; mse_loss takes floating-point tensors"},
    {"mse_loss", 2, {T(F32, 1, 3), T(I32, 1, 3)}, LPX_EDTYPE,
     "mse_loss: b has dtype i32; mse_loss takes floating-point tensors"},
    {"mse_loss", 2, {T(F32, 1, 3), T(F32, 2, 1, 3)}, LPX_ESHAPE,
     "mse_loss: a [3] and b [1, 3] must have the same shape"},
    {"mse_loss_backward", 3, {T(LPX_I64, 1, 3), T(F32, 1, 3), F(1)}, LPX_EDTYPE,
     "mse_loss_backward: a has dtype i64; mse_loss_backward takes floating-point tensors"},
    {"mse_loss_backward", 3, {T(F32, 2, 2, 3), T(F32, 2, 3, 2), F(1)}, LPX_ESHAPE,
     "mse_loss_backward: a [2, 3] and b [3, 2] must have the same shape"},
    /* embedding(weight, indices) */
    {"embedding", 2, {T(F32, 2, 5, 3), T(F32, 1, 4)}, LPX_EDTYPE,
     "embedding: indices has dtype f32; indices must be i32 or i64"},
    {"embedding", 2, {T(F32, 1, 5), T(LPX_I64, 1, 4)}, LPX_ESHAPE,
     "embedding: weight [5] must be [V, D]"},
    {"embedding", 2, {T(F32, 3, 1, 5, 3), T(I32, 1, 4)}, LPX_ESHAPE,
     "embedding: weight [1, 5, 3] must be [V, D]"},
    /* embedding_backward(grad, indices, num_weights) */
    {"embedding_backward", 3, {T(I32, 2, 4, 3), T(I32, 1, 4), I(5)}, LPX_EDTYPE,
     "embedding_backward: grad has dtype i32; embedding_backward takes floating-point tensors"},
    {"embedding_backward", 3, {T(F32, 2, 4, 3), T(LPX_BF16, 1, 4), I(5)}, LPX_EDTYPE,
     "embedding_backward: indices has dtype bf16; indices must be i32 or i64"},
    {"embedding_backward", 3, {T(F32, 2, 4, 3), T(I32, 1, 4), I(-1)}, LPX_EINVAL,
     "embedding_backward: num_weights -1 is negative"},
    {"embedding_backward", 3, {T(F32, 2, 3, 3), T(I32, 1, 4), I(5)}, LPX_ESHAPE,
     "embedding_backward: grad [3, 3] must be indices [4] plus one embedding dim"},
    {"embedding_backward", 3, {T(F32, 1, 4), T(I32, 1, 4), I(5)}, LPX_ESHAPE,
     "embedding_backward: grad [4] must be indices [4] plus one embedding dim"},
    /* rope(x, inv_freq, offset), and its backward */
    {"rope", 3, {T(F32, 3, 1, 2, 4), T(F32, 1, 2), I(0)}, LPX_ESHAPE,
     "rope: x [1, 2, 4] must be 4-D [batch, seq, heads, head_dim]"},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 3), T(F32, 1, 1), I(0)}, LPX_ESHAPE,
     "rope: x [1, 2, 2, 3] has head_dim 3; rope needs an even head_dim > 0"},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 0), T(F32, 1, 0), I(0)}, LPX_ESHAPE,
     "rope: x [1, 2, 2, 0] has head_dim 0; rope needs an even head_dim > 0"},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 3), I(0)}, LPX_ESHAPE,
     "rope: inv_freq [3] must be [2] (head_dim / 2) for x [1, 2, 2, 4]"},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 2, 1, 2), I(0)}, LPX_ESHAPE,
     "rope: inv_freq [1, 2] must be [2] (head_dim / 2) for x [1, 2, 2, 4]"},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(-1)}, LPX_ERANGE,
     "rope: offset -1: positions offset..offset+2 must lie in [0, 2^24]"},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 2), I((1 << 24) - 1)}, LPX_ERANGE,
     "rope: offset 16777215: positions offset..offset+2 must lie in [0, 2^24]"},
    {"rope", 3, {T(I32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(0)}, LPX_EDTYPE,
     "rope: x has dtype i32; rope takes floating-point tensors"},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(I32, 1, 2), I(0)}, LPX_EDTYPE,
     "rope: inv_freq has dtype i32; rope takes floating-point tensors"},
    {"rope", 3, {T(I32, 4, 1, 2, 2, 3), T(I32, 1, 2), I(0)}, LPX_ESHAPE,
     "rope: x [1, 2, 2, 3] has head_dim 3; rope needs an even head_dim > 0"},
    {"rope_backward", 3, {T(I32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(3)}, LPX_EDTYPE,
     "rope_backward: grad has dtype i32; rope_backward takes floating-point tensors"},
    {"rope_backward", 3, {T(F32, 3, 1, 2, 4), T(F32, 1, 2), I(0)}, LPX_ESHAPE,
     "rope_backward: x [1, 2, 4] must be 4-D [batch, seq, heads, head_dim]"},
    {"rope_backward", 3, {T(F32, 4, 1, 2, 2, 4), T(LPX_U8, 1, 2), I(0)}, LPX_EDTYPE,
     "rope_backward: inv_freq has dtype u8; rope_backward takes floating-point tensors"},
    /* attention(q, k, v, causal, scale) */
    {"attention", 5, {T(F32, 3, 1, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: q [1, 2, 4] must be 4-D [batch, seq, heads, head_dim]"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 4), T(F32, 4, 1, 2, 1, 4), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: k [1, 2, 4] must be 4-D [batch, seq, heads, head_dim]"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 2, 2, 4), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: v [2, 4] must be 4-D [batch, seq, heads, head_dim]"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(LPX_BF16, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4), B(0), F(0.5)}, LPX_EDTYPE,
     "attention: q, k and v must share a dtype (q f32, k bf16, v f32)"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 3, 1, 4), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: k [1, 2, 1, 4] and v [1, 3, 1, 4] must have one shape"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 2, 2, 1, 4), T(F32, 4, 2, 2, 1, 4), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: k [2, 2, 1, 4] must have q [1, 2, 2, 4]'s batch and head_dim"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 8), T(F32, 4, 1, 2, 1, 8), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: k [1, 2, 1, 8] must have q [1, 2, 2, 4]'s batch and head_dim"},
    {"attention", 5, {T(F32, 4, 1, 2, 3, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: q [1, 2, 3, 4] has 3 heads, k [1, 2, 2, 4] has 2: the query heads must be a positive multiple of the key/value heads"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 0), T(F32, 4, 1, 2, 1, 0), T(F32, 4, 1, 2, 1, 0), B(0), F(0.5)}, LPX_ESHAPE,
     "attention: q [1, 2, 2, 0] has 2 heads, k [1, 2, 1, 0] has 1: the query heads must be a positive multiple of the key/value heads"},
    {"attention", 5, {T(F32, 4, 1, 3, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4), B(1), F(0.5)}, LPX_ESHAPE,
     "attention: causal with 2 keys for 3 queries: causal attention needs at least as many keys (q [1, 3, 2, 4], k [1, 2, 1, 4])"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4), B(0), F(0)}, LPX_EINVAL,
     "attention: scale 0 must be finite and > 0 (usually 1/sqrt(head_dim))"},
    {"attention", 5, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4), B(1), F(INFINITY)}, LPX_EINVAL,
     "attention: scale inf must be finite and > 0 (usually 1/sqrt(head_dim))"},
    {"attention", 5, {T(I32, 4, 1, 2, 2, 4), T(I32, 4, 1, 2, 1, 4), T(I32, 4, 1, 2, 1, 4), B(0), F(0.5)}, LPX_EDTYPE,
     "attention: q has dtype i32; attention takes floating-point tensors"},
    /* attention_backward(grad, q, k, v, out, lse, causal, scale) */
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(0.5)}, LPX_ESHAPE,
     "attention_backward: k [1, 2, 4] must be 4-D [batch, seq, heads, head_dim]"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 3), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(0.5)}, LPX_ESHAPE,
     "attention_backward: grad [1, 2, 2, 3] must have q [1, 2, 2, 4]'s shape"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 3, 1, 2, 2), T(F32, 3, 1, 2, 2), B(0), F(0.5)}, LPX_ESHAPE,
     "attention_backward: out [1, 2, 2] must have q [1, 2, 2, 4]'s shape"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(LPX_BF16, 3, 1, 2, 2), B(0), F(0.5)}, LPX_EDTYPE,
     "attention_backward: lse is bf16; it must be the forward's f32 lse"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 3), B(0), F(0.5)}, LPX_ESHAPE,
     "attention_backward: lse [1, 2, 3] must be [1, 2, 2] ([batch, heads, seq] of q [1, 2, 2, 4])"},
    {"attention_backward", 8, {T(I32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(0.5)}, LPX_EDTYPE,
     "attention_backward: grad has dtype i32; attention_backward takes floating-point tensors"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(LPX_U8, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(0.5)}, LPX_EDTYPE,
     "attention_backward: out has dtype u8; attention_backward takes floating-point tensors"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(I32, 4, 1, 2, 2, 4), T(I32, 4, 1, 2, 1, 4), T(I32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(0.5)}, LPX_EDTYPE,
     "attention_backward: q has dtype i32; attention_backward takes floating-point tensors"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(I32, 3, 1, 2, 2), B(0), F(0.5)}, LPX_EDTYPE,
     "attention_backward: lse is i32; it must be the forward's f32 lse"},
    {"attention_backward", 8, {T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(-1)}, LPX_EINVAL,
     "attention_backward: scale -1 must be finite and > 0 (usually 1/sqrt(head_dim))"},
    /* swiglu_backward(grad, gate, up) */
    {"swiglu_backward", 3, {T(F32, 2, 2, 3), T(F32, 2, 3, 2), T(F32, 2, 3, 2)}, LPX_ESHAPE,
     "swiglu_backward: grad [2, 3] and gate [3, 2] must have the same shape"},
    {"swiglu_backward", 3, {T(F32, 2, 2, 3), T(F32, 2, 2, 3), T(F32, 1, 6)}, LPX_ESHAPE,
     "swiglu_backward: up [6] and gate [2, 3] must have the same shape"},
    {"swiglu_backward", 3, {T(I32, 2, 2, 3), T(F32, 2, 2, 3), T(F32, 2, 2, 3)}, LPX_EDTYPE,
     "swiglu_backward: grad has dtype i32; swiglu_backward takes floating-point tensors"},
    {"swiglu_backward", 3, {T(F32, 2, 2, 3), T(LPX_I64, 2, 2, 3), T(F32, 2, 2, 3)}, LPX_EDTYPE,
     "swiglu_backward: gate has dtype i64; swiglu_backward takes floating-point tensors"},
    {"swiglu_backward", 3, {T(F32, 2, 2, 3), T(F32, 2, 2, 3), T(LPX_BOOL, 2, 2, 3)}, LPX_EDTYPE,
     "swiglu_backward: up has dtype bool; swiglu_backward takes floating-point tensors"},
    {"swiglu_backward", 3, {T(I32, 2, 2, 3), T(F32, 2, 3, 2), T(F32, 2, 2, 3)}, LPX_ESHAPE,
     "swiglu_backward: grad [2, 3] and gate [3, 2] must have the same shape"},
};

static void test_refused_by_dispatcher(void) { spec_check_bad(bad, sizeof bad / sizeof *bad); }

/* indices with no room for the embedding dim: beyond the table's 4 dims */
static void test_embedding_rank(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_device devs[2] = {lpx_cpu(), nc};
    int64_t s8[LPX_MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 2};
    char msgs[2][512];
    int before = reached;
    for (int d = 0; d < 2; d++) {
        lpx_tensor *w, *idx, *r = NULL;
        CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){5, 3}, devs[d], &w));
        CHECK_OK(lpx_tensor_new(LPX_I64, LPX_MAX_DIMS, s8, devs[d], &idx));
        CHECK_ERR(lpx_embedding(w, idx, &r), LPX_ESHAPE);
        snprintf(msgs[d], sizeof msgs[d], "%s", lpx_last_error());
        lpx_tensor_release(w);
        lpx_tensor_release(idx);
    }
    CHECK(reached == before);
    CHECK(!strcmp(msgs[0], msgs[1]));
    CHECK(!strcmp(msgs[0], "embedding: indices [1, 1, 1, 1, 1, 1, 1, 2] leave no room for the embedding dim "
                           "(max 8 dims)"));
}

/* Good argument sets reach the check-free kernel. */
static const bad_case good[] = {
    {"linear", 3, {T(F32, 3, 2, 2, 3), T(LPX_BF16, 2, 4, 3), T(LPX_F16, 1, 4)}, 0, NULL},
    {"linear", 3, {T(F32, 1, 3), T(F32, 2, 4, 3), NONE}, 0, NULL},
    {"addmm", 5, {T(F32, 1, 4), T(F32, 2, 2, 3), T(F32, 2, 3, 4), F(0.5), F(2)}, 0, NULL},
    {"rmsnorm", 3, {T(LPX_BF16, 3, 2, 3, 4), T(F32, 1, 4), F(1e-6)}, 0, NULL},
    {"rmsnorm", 3, {T(F32, 1, 4), NONE, F(1e-6)}, 0, NULL},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), NONE, T(F32, 2, 2, 1)}, 0, NULL},
    {"cross_entropy", 3, {T(LPX_BF16, 2, 2, 5), T(I32, 1, 2), I(-100)}, 0, NULL},
    {"cross_entropy_backward", 4, {T(F32, 2, 2, 5), T(LPX_I64, 1, 2), I(0), F(0.5)}, 0, NULL},
    {"mse_loss", 2, {T(F32, 2, 2, 3), T(LPX_F16, 2, 2, 3)}, 0, NULL},
    {"mse_loss_backward", 3, {T(F32, 2, 2, 3), T(F32, 2, 2, 3), F(2)}, 0, NULL},
    {"embedding", 2, {T(I32, 2, 5, 3), T(LPX_I64, 2, 2, 4)}, 0, NULL},   /* weight of any dtype */
    {"embedding_backward", 3, {T(F32, 3, 2, 4, 3), T(I32, 2, 2, 4), I(0)}, 0, NULL},
    {"rope", 3, {T(LPX_BF16, 4, 1, 2, 2, 4), T(F32, 1, 2), I(7)}, 0, NULL},
    {"rope_backward", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(0)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 2, 4, 8), T(F32, 4, 1, 3, 2, 8), T(F32, 4, 1, 3, 2, 8), B(1), F(0.25)}, 0, NULL},
    {"attention_backward", 8, {T(LPX_BF16, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 1, 4), T(LPX_F16, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(0.5)},
     0, NULL},
    {"swiglu_backward", 3, {T(LPX_BF16, 2, 2, 3), T(F32, 2, 2, 3), T(LPX_F16, 2, 2, 3)}, 0, NULL},
};

static void test_good_args_reach_kernel(void) { spec_check_good(good, sizeof good / sizeof *good); }

/* Targets and indices out of range are data: the dispatcher lets them
 * through (the check-free kernel runs), the CPU kernel refuses them. */
static void test_refused_by_kernel(void)
{
    static const bad_case data[] = {
        {"cross_entropy", 3, {T(F32, 2, 2, 5), T(LPX_I64, 1, 2), I(-100)}, LPX_ERANGE,
         "cross_entropy: target[0] = 5 is out of range [0, 5) (ignore_index -100)"},
        {"cross_entropy_backward", 4, {T(F32, 2, 2, 5), T(LPX_I64, 1, 2), I(-100), F(1)}, LPX_ERANGE,
         "cross_entropy_backward: target[0] = 5 is out of range [0, 5) (ignore_index -100)"},
        {"embedding", 2, {T(F32, 2, 5, 3), T(I32, 2, 2, 2)}, LPX_ERANGE,
         "embedding: indices[0, 0] = 7 is out of range [0, 5)"},
        {"embedding_backward", 3, {T(F32, 3, 2, 2, 3), T(I32, 2, 2, 2), I(4)}, LPX_ERANGE,
         "embedding_backward: indices[0, 0] = 7 is out of range [0, 4)"},
    };
    lpx_device devs[2] = {lpx_cpu(), {NOCHK_DEVICE, 0}};
    for (size_t i = 0; i < sizeof data / sizeof *data; i++) {
        lpx_op op;
        CHECK_OK(lpx_op_find(data[i].op, &op));
        for (int d = 0; d < 2; d++) {
            built_args b;
            spec_build(&data[i], devs[d], &b);
            /* every target 5 (of 5 classes), every index 7 (of 5 or 4 rows) */
            lpx_tensor *t = b.ts[1];
            int64_t bad_value = !strncmp(data[i].op, "cross", 5) ? 5 : 7;
            for (int64_t k = 0; k < lpx_tensor_numel(t); k++) {
                if (lpx_tensor_dtype(t) == LPX_I64) ((int64_t *)lpx_tensor_data(t))[k] = bad_value;
                else ((int32_t *)lpx_tensor_data(t))[k] = (int32_t)bad_value;
            }
            lpx_call c;
            lpx_call_init(&c, op, b.v, data[i].nargs);
            int before = reached;
            lpx_status st = lpx_dispatch(&c);
            if (d == 0) {
                CHECKF(st == data[i].want, "data case %zu (%s): cpu status %d", i, data[i].op, st);
                if (st) CHECKF(!strcmp(lpx_last_error(), data[i].msg), "data case %zu: '%s'", i, lpx_last_error());
            } else {
                CHECKF(st == LPX_EINTERNAL && reached == before + 1, "data case %zu (%s): the check-free kernel %s",
                       i, data[i].op, reached == before + 1 ? "ran" : "did not run");
            }
            if (!st) lpx_call_release_rets(&c);
            spec_built_free(&b);
        }
    }
}

/* The normalised arguments each family hands its kernels. */
static lpx_op_frame *frame_of(lpx_op_frame *f, const char *name, const lpx_value *v, int n)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(name, &op));
    lpx_call_init(&f->call, op, v, n);
    f->call.key = nc_key;
    CHECK_OK(lpx_op_spec_run(f, sizeof *f));
    CHECK(lpx_op_args_of(&f->call) == (const void *)&f->args);
    return f;
}

static lpx_tensor *nt(lpx_dtype dt, int nd, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(dt, nd, shape, (lpx_device){NOCHK_DEVICE, 0}, &t));
    return t;
}

static void test_normalised_args(void)
{
    lpx_op_frame f;
    lpx_tensor *x = nt(LPX_BF16, 3, (const int64_t[]){2, 5, 3}), *w = nt(F32, 2, (const int64_t[]){4, 3}),
               *bias = nt(F32, 1, (const int64_t[]){4});
    /* linear */
    lpx_value lv[3] = {lpx_v_tensor(x), lpx_v_tensor(w), lpx_v_tensor(bias)};
    const lpx_linear_args *la = &frame_of(&f, "linear", lv, 3)->args.linear;
    CHECK(la->x == x && la->w == w && la->bias == bias);
    CHECK(la->g.M == 10 && la->g.K == 3 && la->g.N == 4 && la->g.batch == 1);
    CHECK(la->g.out_ndim == 3 && la->g.out_shape[0] == 2 && la->g.out_shape[1] == 5 && la->g.out_shape[2] == 4);
    lv[2] = lpx_v_none();
    CHECK(frame_of(&f, "linear", lv, 3)->args.linear.bias == NULL);

    /* addmm: beta c + alpha a @ b */
    lpx_tensor *a = nt(F32, 2, (const int64_t[]){6, 3}), *b = nt(F32, 2, (const int64_t[]){3, 4});
    lpx_value av[5] = {lpx_v_tensor(bias), lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_f64(0.5), lpx_v_f64(2)};
    const lpx_addmm_args *aa = &frame_of(&f, "addmm", av, 5)->args.addmm;
    CHECK(aa->c == bias && aa->a == a && aa->b == b && aa->beta == 0.5 && aa->alpha == 2);
    CHECK(aa->g.M == 6 && aa->g.K == 3 && aa->g.N == 4 && aa->g.out_ndim == 2 && aa->g.out_shape[1] == 4);

    /* rmsnorm, rmsnorm_backward */
    lpx_tensor *wn = nt(LPX_F16, 1, (const int64_t[]){3}), *rstd = nt(F32, 3, (const int64_t[]){2, 5, 1});
    lpx_value rv[3] = {lpx_v_tensor(x), lpx_v_tensor(wn), lpx_v_f64(1e-6)};
    const lpx_rmsnorm_args *ra = &frame_of(&f, "rmsnorm", rv, 3)->args.rmsnorm;
    CHECK(ra->x == x && ra->weight == wn && ra->eps == 1e-6 && ra->rows == 10 && ra->dim == 3);
    lpx_value rbv[4] = {lpx_v_tensor(x), lpx_v_tensor(x), lpx_v_tensor(wn), lpx_v_tensor(rstd)};
    const lpx_rmsnorm_backward_args *rb = &frame_of(&f, "rmsnorm_backward", rbv, 4)->args.rmsnorm_backward;
    CHECK(rb->grad == x && rb->x == x && rb->weight == wn && rb->rstd == rstd);
    CHECK(rb->rows == 10 && rb->dim == 3 && rb->grad_w_dtype == LPX_F16);
    rbv[2] = lpx_v_none();
    rb = &frame_of(&f, "rmsnorm_backward", rbv, 4)->args.rmsnorm_backward;
    CHECK(rb->weight == NULL && rb->grad_w_dtype == LPX_BF16);

    /* cross_entropy: the loss in f32 for bf16 logits; the backward's in
     * the logits' dtype */
    lpx_tensor *lg = nt(LPX_BF16, 2, (const int64_t[]){6, 7}), *tg = nt(I32, 1, (const int64_t[]){6});
    lpx_value cv[4] = {lpx_v_tensor(lg), lpx_v_tensor(tg), lpx_v_i64(-100), lpx_v_f64(0.25)};
    const lpx_cross_entropy_args *ca = &frame_of(&f, "cross_entropy", cv, 3)->args.cross_entropy;
    CHECK(ca->logits == lg && ca->target == tg && ca->ignore_index == -100 && ca->grad == 0);
    CHECK(ca->n == 6 && ca->classes == 7 && ca->dtype == LPX_F32);
    ca = &frame_of(&f, "cross_entropy_backward", cv, 4)->args.cross_entropy;
    CHECK(ca->grad == 0.25 && ca->dtype == LPX_BF16 && ca->classes == 7);

    /* mse_loss */
    lpx_value mv[3] = {lpx_v_tensor(a), lpx_v_tensor(a), lpx_v_f64(3)};
    const lpx_mse_loss_args *ma = &frame_of(&f, "mse_loss", mv, 2)->args.mse_loss;
    CHECK(ma->a == a && ma->b == a && ma->grad == 0);
    CHECK(frame_of(&f, "mse_loss_backward", mv, 3)->args.mse_loss.grad == 3);

    /* embedding, embedding_backward */
    lpx_tensor *ix = nt(LPX_I64, 2, (const int64_t[]){2, 5});
    lpx_value ev[2] = {lpx_v_tensor(w), lpx_v_tensor(ix)};
    const lpx_embedding_args *ea = &frame_of(&f, "embedding", ev, 2)->args.embedding;
    CHECK(ea->weight == w && ea->indices == ix && ea->num == 4 && ea->dim == 3);
    CHECK(ea->out_ndim == 3 && ea->out_shape[0] == 2 && ea->out_shape[1] == 5 && ea->out_shape[2] == 3);
    lpx_value gv[3] = {lpx_v_tensor(x), lpx_v_tensor(ix), lpx_v_i64(9)};
    /* grad bf16 [2, 5, 3] for indices [2, 5] */
    const lpx_embedding_backward_args *ga = &frame_of(&f, "embedding_backward", gv, 3)->args.embedding_backward;
    CHECK(ga->grad == x && ga->indices == ix && ga->num_weights == 9 && ga->dim == 3);

    /* rope */
    lpx_tensor *q = nt(F32, 4, (const int64_t[]){2, 5, 4, 6}), *fr = nt(F32, 1, (const int64_t[]){3});
    lpx_value pv[3] = {lpx_v_tensor(q), lpx_v_tensor(fr), lpx_v_i64(11)};
    const lpx_rope_args *pa = &frame_of(&f, "rope", pv, 3)->args.rope;
    CHECK(pa->x == q && pa->inv_freq == fr && pa->offset == 11 && pa->half == 3);
    CHECK(frame_of(&f, "rope_backward", pv, 3)->args.rope.half == 3);

    /* attention, attention_backward: grouped-query, causal */
    lpx_tensor *k = nt(F32, 4, (const int64_t[]){2, 7, 2, 6}), *lse = nt(F32, 3, (const int64_t[]){2, 4, 5});
    lpx_value qv[5] = {lpx_v_tensor(q), lpx_v_tensor(k), lpx_v_tensor(k), lpx_v_bool(true), lpx_v_f64(0.125)};
    const lpx_attention_args *qa = &frame_of(&f, "attention", qv, 5)->args.attention;
    CHECK(qa->q == q && qa->k == k && qa->v == k && qa->causal && qa->scale == 0.125);
    CHECK(qa->g.batch == 2 && qa->g.q_len == 5 && qa->g.kv_len == 7 && qa->g.heads == 4 && qa->g.kv_heads == 2 &&
          qa->g.head_dim == 6);
    lpx_value bv[8] = {lpx_v_tensor(q), lpx_v_tensor(q), lpx_v_tensor(k), lpx_v_tensor(k),
                       lpx_v_tensor(q), lpx_v_tensor(lse), lpx_v_bool(false), lpx_v_f64(0.5)};
    const lpx_attention_backward_args *qb = &frame_of(&f, "attention_backward", bv, 8)->args.attention_backward;
    CHECK(qb->grad == q && qb->q == q && qb->k == k && qb->v == k && qb->out == q && qb->lse == lse);
    CHECK(!qb->causal && qb->scale == 0.5 && qb->g.kv_len == 7 && qb->g.kv_heads == 2);

    /* swiglu_backward */
    lpx_value sv[3] = {lpx_v_tensor(x), lpx_v_tensor(x), lpx_v_tensor(x)};
    const lpx_swiglu_backward_args *sa = &frame_of(&f, "swiglu_backward", sv, 3)->args.swiglu_backward;
    CHECK(sa->grad == x && sa->gate == x && sa->up == x);

    lpx_tensor *all[] = {x, w, bias, a, b, wn, rstd, lg, tg, ix, q, fr, k, lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

int main(void)
{
    CHECK_OK(lpx_init());
    CHECK(spec_setup() >= 15 + 11);   /* this group's 15 ops, the core's 11 */
    RUN(test_refused_by_dispatcher);
    RUN(test_embedding_rank);
    RUN(test_good_args_reach_kernel);
    RUN(test_refused_by_kernel);
    RUN(test_normalised_args);
    return CHECK_DONE();
}
