/* lpx — the nf4 kind: double-quantized 4-bit NormalFloat weights (QLoRA)
 * and the QLoRA linear.
 *
 * An nf4 tensor is a frozen weight stored in about 4.127 bits per
 * parameter: elements in blocks of `block` (default 64) share an absmax
 * scale; each element is the nearest of 16 NormalFloat values (two 4-bit
 * codes per byte, first element in the high nibble); the block scales are
 * themselves quantized to i8 after subtracting their mean, in scaler blocks
 * of `scaler_block` blocks sharing one f32 factor (by default the largest
 * count up to 256 that divides the tensor's blocks). The format and the
 * arithmetic are in docs/NF4.md.
 *
 * An nf4 tensor keeps its logical dtype (bf16, f16 or f32: what it
 * dequantizes to) and logical shape; any element count works (the tail is
 * zero-padded to a whole block, and to whole scaler blocks when an explicit
 * scaler_block does not divide the block count). It is an lpx kind tensor:
 * lpx_linear / lpx_matmul with an nf4 weight, lpx_t, lpx_view / lpx_reshape,
 * lpx_slice / lpx_narrow / lpx_split / lpx_chunk along dim 0 in whole
 * scaler blocks, lpx_cast (= dequantize), lpx_clone, lpx_copy_ and
 * lpx_detach all work on it through dispatch. Other ops fail with
 * LPX_ENOTIMPL naming the op and the kind, unless the dequantize-and-
 * redispatch fallback is switched on (lpx_nf4_set_fallback).
 *
 * Inner tensors (lpx_tensor_inner), all 1-D and dense:
 *   0 codes u8 [P/2], 1 qscalers i8 [P/block], 2 factors f32
 *   [P/(block*scaler_block)], 3 mean f32 [1];  P = padded element count.
 * The metadata blob (lpx_tensor_meta) is lpx_nf4_meta below. */
#ifndef LPX_NF4_H
#define LPX_NF4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "dtype.h"
#include "tensor.h"

LPX_BEGIN_DECLS

#define LPX_NF4_BLOCK_MIN 32
#define LPX_NF4_BLOCK_MAX 4096
#define LPX_NF4_SCALER_BLOCK_MAX 65536

/* Inner tensor indices of an nf4 tensor. */
enum { LPX_NF4_CODES = 0, LPX_NF4_QSCALERS = 1, LPX_NF4_FACTORS = 2, LPX_NF4_MEAN = 3, LPX_NF4_NINNER = 4 };

/** Quantization settings. Start from lpx_nf4_config_default(). */
typedef struct lpx_nf4_config {
    int64_t block;         /* elements per absmax block: even, 32..4096 (default 64) */
    int64_t scaler_block;  /* blocks per f32 factor: 1..65536, or
                              LPX_NF4_SCALER_BLOCK_AUTO (the default): the
                              largest one up to 256 that divides the tensor's
                              block count, so nothing is padded beyond the
                              last block */
    bool pad;              /* true (default): zero-pad the tail to whole scaler
                              blocks. false: the strict torchao layout, where
                              numel must be a multiple of block and scaler_block
                              must divide the number of blocks (else LPX_EINVAL) */
} lpx_nf4_config;

/** The metadata blob of an nf4 tensor (lpx_tensor_meta). Fixed-size
 *  little-endian fields; lpx_kind_vtable(lpx_nf4_kind())->unflatten
 *  validates every field of an untrusted blob. */
typedef struct lpx_nf4_meta {
    uint32_t magic;        /* LPX_NF4_META_MAGIC */
    uint32_t version;      /* LPX_NF4_META_VERSION */
    int64_t block;
    int64_t scaler_block;
    int64_t padded;        /* P: elements the codes cover, a multiple of
                              block * scaler_block, numel <= P < numel + block * scaler_block */
    uint8_t transposed;    /* 1: 2-D, logical = stored^T (what lpx_t returns) */
    uint8_t whole;         /* 1: the payload is a whole quantized tensor (not a
                              dim-0 slice sharing its parent's mean) */
    uint8_t reserved[6];   /* zero */
} lpx_nf4_meta;

#define LPX_NF4_META_MAGIC 0x3446464Eu  /* "NFF4" */
#define LPX_NF4_META_VERSION 1u

/** Facts about one nf4 tensor (lpx_nf4_get_info). */
typedef struct lpx_nf4_info {
    int64_t block, scaler_block;
    int64_t numel;             /* logical elements */
    int64_t padded;            /* elements the codes cover */
    int64_t bytes;             /* bytes of the four inner tensors */
    double bits_per_param;     /* 8 * bytes / numel (0 for an empty tensor) */
    int64_t shard_unit_rows;   /* rows a dim-0 slice boundary must be a multiple of */
    bool transposed;
    bool whole;
} lpx_nf4_info;

/** scaler_block chosen per tensor (see lpx_nf4_config), and its cap. */
#define LPX_NF4_SCALER_BLOCK_AUTO 0
#define LPX_NF4_SCALER_BLOCK_AUTO_MAX 256

/** The defaults: block 64, scaler_block LPX_NF4_SCALER_BLOCK_AUTO, pad
 *  true. */
LPX_API lpx_nf4_config lpx_nf4_config_default(void);

/** The config a tensor of numel elements is quantized with: `config` (NULL:
 *  the defaults) with an automatic scaler_block replaced by the one chosen
 *  (numel < 0: LPX_NF4_SCALER_BLOCK_AUTO_MAX). Use it to size shards or
 *  buffers before quantizing. Errors: LPX_EINVAL (NULL out). */
LPX_API lpx_status lpx_nf4_config_resolve(const lpx_nf4_config *config, int64_t numel, lpx_nf4_config *out);

/** Checks a config, and with numel >= 0 also its fit to a tensor of numel
 *  elements (only matters for pad = false). NULL means the defaults.
 *  Errors: LPX_EINVAL naming the bad field and its range. */
LPX_API lpx_status lpx_nf4_config_check(const lpx_nf4_config *config, int64_t numel);

/** Bytes an nf4 tensor of this shape takes with this config (NULL: the
 *  defaults): codes + qscalers + factors + mean, padding included. It is
 *  exactly the sum of the inner tensors' bytes of lpx_nf4_quantize's result.
 *  4096 x 4096 with the defaults: 8654852 bytes = 4.127 bits/param.
 *  Errors: LPX_EINVAL (bad config, ndim, negative dim, NULL bytes),
 *  LPX_ERANGE (overflow). */
LPX_API lpx_status lpx_nf4_bytes(int ndim, const int64_t *shape, const lpx_nf4_config *config, int64_t *bytes);

/** Quantizes a dense tensor x (dtype f32, f16 or bf16: the logical dtype of
 *  the result; any shape and layout) to a new nf4 tensor of x's shape, with
 *  `config` (NULL: the defaults). The result owns its storage; *out gets
 *  one reference. Errors: LPX_EINVAL (NULL, nf4 or other kind input, bad
 *  config), LPX_EDTYPE, LPX_ENUMERIC (x holds NaN or inf: the message
 *  names the element), LPX_ENOMEM. */
LPX_API lpx_status lpx_nf4_quantize(lpx_tensor *x, const lpx_nf4_config *config, lpx_tensor **out);

/** Dequantizes a whole nf4 tensor to a new dense contiguous tensor of its
 *  logical shape in `dtype` (LPX_F32, LPX_F16, LPX_BF16, or -1 for its
 *  logical dtype). Same as lpx_cast. Errors: LPX_EINVAL (NULL, not nf4),
 *  LPX_EDTYPE, LPX_ENOMEM. */
LPX_API lpx_status lpx_nf4_dequantize(lpx_tensor *w, lpx_dtype dtype, lpx_tensor **out);

/** Dequantizes rows [row_start, row_start + row_count) of dim 0 of an
 *  untransposed nf4 tensor (any row range, not only scaler blocks): the
 *  building block of tiled GEMMs. With `out` NULL the result is a new
 *  tensor [row_count, shape[1:]...] in *result; otherwise `out` (a dense
 *  contiguous CPU tensor of row_count * row-size elements of `dtype`, any
 *  shape) is filled and returned retained in *result, so a loop can reuse
 *  one scratch buffer. Errors: LPX_EINVAL (NULL, not nf4, transposed,
 *  0-D), LPX_ERANGE (rows out of range), LPX_EDTYPE, LPX_ESHAPE (out). */
LPX_API lpx_status lpx_nf4_dequantize_rows(lpx_tensor *w, int64_t row_start, int64_t row_count, lpx_dtype dtype,
                                           lpx_tensor *out, lpx_tensor **result);

/** The nf4 kind handle (registered at lpx_init). NULL only if lpx_init
 *  failed. */
LPX_API const lpx_kind *lpx_nf4_kind(void);

/** True if t is an nf4 tensor. */
LPX_API bool lpx_nf4_is(const lpx_tensor *t);

/** Fills *info for an nf4 tensor. Errors: LPX_EINVAL (NULL, not nf4). */
LPX_API lpx_status lpx_nf4_get_info(const lpx_tensor *t, lpx_nf4_info *info);

/** out = x @ W^T (+ bias) with W an nf4 [out_features, in_features] weight,
 *  x dense [..., in_features]; result in x's dtype. W is dequantized in
 *  tiles of rows (never whole) and multiplied with sgemm. The same as
 *  lpx_linear with an nf4 weight. bias may be NULL. Errors: LPX_EINVAL
 *  (NULL, W not nf4), LPX_ESHAPE, LPX_EDTYPE, LPX_ENOMEM. */
LPX_API lpx_status lpx_nf4_linear(lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor **out);

/** Backward of lpx_nf4_linear for the input: grad_x = grad @ W (same tiled
 *  path; W is frozen, so there is no grad_W). grad [..., out_features] ->
 *  [..., in_features] in grad's dtype. Errors as lpx_nf4_linear. */
LPX_API lpx_status lpx_nf4_linear_backward(lpx_tensor *grad, lpx_tensor *w, lpx_tensor **grad_x);

/** QLoRA settings: out = x @ W^T + bias + (alpha / r) * (drop(x) @ A^T) @ B^T. */
typedef struct lpx_qlora_opts {
    double alpha;      /* scale numerator; scale = alpha / r, r = A's rows (default 16) */
    double dropout;    /* probability p of dropping an input of the adapter path, 0 <= p < 1 (default 0) */
    uint64_t seed;     /* dropout mask: element i of x kept iff u(seed, i) >= p,
                          u from Philox4x32-10 (the qlora_dropout op); reuse the
                          step's seed in the backward */
} lpx_qlora_opts;

/** Defaults: alpha 16, dropout 0, seed 0. */
LPX_API lpx_qlora_opts lpx_qlora_opts_default(void);

/** QLoRA linear forward. x dense [..., in] (f32/f16/bf16), W nf4 [out, in]
 *  (frozen), bias [out] or NULL (frozen), A [r, in] and B [out, r] the
 *  trainable adapters (f32, bf16 or f16, same dtype: the adapter path
 *  computes in it). opts NULL: the defaults. *out gets the result
 *  [..., out] in x's dtype. If saved_xa is non-NULL it receives
 *  drop(x) @ A^T ([M, r], M = rows of x, adapter dtype) to hand to the
 *  backward (saves one GEMM there). Errors: LPX_EINVAL (NULL, W not nf4,
 *  bad opts), LPX_ESHAPE, LPX_EDTYPE, LPX_ENOMEM. */
LPX_API lpx_status lpx_qlora_linear(lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor *a, lpx_tensor *b,
                                    const lpx_qlora_opts *opts, lpx_tensor **out, lpx_tensor **saved_xa);

/** QLoRA linear backward for grad = dL/d out ([..., out], any float dtype).
 *  Computes, with s = alpha / r and the forward's dropout mask (same opts):
 *    grad_b = s * grad^T @ xa           [out, r], B's dtype
 *    grad_a = (s * grad @ B)^T @ drop(x) [r, in], A's dtype
 *    grad_x = grad @ W + drop'((s * grad @ B) @ A)   [..., in], x's dtype
 *  xa: the forward's saved_xa, or NULL to recompute it. Any of grad_x,
 *  grad_a, grad_b may be NULL to skip that gradient. W and bias are frozen
 *  (no gradient). Errors as lpx_qlora_linear. */
LPX_API lpx_status lpx_qlora_linear_backward(lpx_tensor *grad, lpx_tensor *x, lpx_tensor *w, lpx_tensor *a,
                                             lpx_tensor *b, lpx_tensor *xa, const lpx_qlora_opts *opts,
                                             lpx_tensor **grad_x, lpx_tensor **grad_a, lpx_tensor **grad_b);

/** Switches the nf4 "dequantize and redispatch" fallback (process-wide,
 *  off by default). Off: an op without an nf4 handler fails with
 *  LPX_ENOTIMPL naming the op and the kind. On: its nf4 arguments are
 *  dequantized to their logical dtype and the op runs on the dense
 *  tensors; LPX_TRACE counts each such call in the "fallbacks" column of
 *  (op, nf4). Ops that would write into an nf4 argument (out, dst) are
 *  still refused. Thread-safe. */
LPX_API void lpx_nf4_set_fallback(bool enabled);

/** Current state of the fallback switch. */
LPX_API bool lpx_nf4_fallback_enabled(void);

LPX_END_DECLS

#endif
