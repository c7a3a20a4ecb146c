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

LPX_END_DECLS

#endif
