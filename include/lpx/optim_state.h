/* lpx — low-precision optimizer states (issue 37): AdamW's moments as
 * block-quantized kind tensors, and the fused AdamW step over them.
 *
 * A state tensor holds ONE moment (m = exp_avg or v = exp_avg_sq) of one
 * parameter. Its logical dtype is f32 and its logical shape the
 * parameter's; lpx_kind_to_dense dequantizes it. Three kinds, one per
 * format (docs/NUMERICS.md "Optimizer states" has the maps and the
 * arithmetic, core/numerics/optim_state.h the code):
 *
 *   kind          format                    m                      v                      block   bytes/param (m + v)
 *   os_8bit       LPX_OPTIM_STATE_8BIT      u8, signed dyn. map    u8, unsigned dyn. map  256     2.03125
 *   os_4bit       LPX_OPTIM_STATE_4BIT      4-bit, signed dyn.     4-bit, (c + 1) / 16    256     1.03125
 *   os_fp8        LPX_OPTIM_STATE_FP8       e4m3fn                 f16 (scaled)           256     3.03125
 *
 * Each block of `block` consecutive elements of the flattened tensor (the
 * last may be shorter) has one f32 scale per moment. The block is a power
 * of two in 2..256 (LPX_OPTIM_STATE_BLOCK_MAX); the defaults are
 * torchao's (AdamW8bit 256, AdamWFp8 256) except 4-bit: 256, not
 * AdamW4bit's default 128, which costs 1.0625 bytes per parameter, over
 * the 1.05 target (torchao's AdamW4bit(block_size=256) is the same
 * layout; block 128 stays available).
 *
 * Inner tensors (lpx_tensor_inner), dense and 1-D:
 *   0 codes: u8 [numel] (8-bit, fp8 m), u8 [packed] (4-bit: two codes per
 *     byte, the first element of a pair in the high nibble, (n + 1) / 2
 *     bytes per block of n), or f16 [numel] (fp8 v: f16 of x / scale);
 *   1 scales: f32 [ceil(numel / block)].
 * Metadata (lpx_tensor_meta): lpx_optim_state_meta below.
 *
 * A new state is zero: codes 0 and scales 0 (torchao's zeros). The
 * `adamw_` op (lpx_adamw_) takes state tensors for exp_avg and exp_avg_sq
 * (all of one kind, m of role m and v of role v, of the parameter's numel,
 * one block): its handler runs the fused op adamw_state_
 * (lpx_adamw_state_) on their inner tensors. lpx_optim_adamw_ does the
 * same with a choice of master (bf16 with stochastic rounding, FP8-LM's
 * scaled f16). Other ops on a state tensor fail with LPX_ENOTIMPL. */
#ifndef LPX_OPTIM_STATE_H
#define LPX_OPTIM_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "dtype.h"
#include "tensor.h"
#include "kind.h"

LPX_BEGIN_DECLS

/** The state formats (the op adamw_state_'s `format`; equal to
 *  core/numerics/optim_state.h's LPX_OS_STATE_*). */
typedef enum lpx_optim_state_format {
    LPX_OPTIM_STATE_8BIT = 0, /* kind os_8bit: torchao's AdamW8bit */
    LPX_OPTIM_STATE_4BIT = 1, /* kind os_4bit: torchao's AdamW4bit */
    LPX_OPTIM_STATE_FP8 = 2,  /* kind os_fp8: e4m3 m, scaled-f16 v (FP8-LM) */
    LPX_OPTIM_STATE_FORMATS = 3
} lpx_optim_state_format;

/** Which moment a state tensor holds: its code map. */
typedef enum lpx_optim_state_role {
    LPX_OPTIM_STATE_M = 0, /* exp_avg: a signed map (e4m3 for fp8) */
    LPX_OPTIM_STATE_V = 1  /* exp_avg_sq: an unsigned map (scaled f16 for fp8) */
} lpx_optim_state_role;

/** The masters of adamw_state_ (its `master[0]`): how the f32 parameter
 *  after the update is written back. */
typedef enum lpx_optim_master {
    LPX_OPTIM_MASTER_PLAIN = 0,   /* params of any float dtype, one RNE rounding (as adamw_) */
    LPX_OPTIM_MASTER_BF16_SR = 1, /* params bf16, stochastic rounding (Philox, replayable) */
    LPX_OPTIM_MASTER_F16S = 2,    /* params f16 codes of p / s, s per block in master_scale (FP8-LM), RNE */
    LPX_OPTIM_MASTER_F16S_SR = 3  /* the same with stochastic rounding */
} lpx_optim_master;

#define LPX_OPTIM_STATE_BLOCK_MAX 256
#define LPX_OPTIM_STATE_META_MAGIC 0x4F505453u /* "STPO" */
#define LPX_OPTIM_STATE_META_VERSION 1u

/** The metadata blob of a state tensor. */
typedef struct lpx_optim_state_meta {
    uint32_t magic;   /* LPX_OPTIM_STATE_META_MAGIC */
    uint32_t version; /* LPX_OPTIM_STATE_META_VERSION */
    int32_t format;   /* lpx_optim_state_format: must be the tensor's kind's */
    int32_t role;     /* lpx_optim_state_role */
    int64_t block;    /* a power of two in 2..LPX_OPTIM_STATE_BLOCK_MAX */
} lpx_optim_state_meta;

/** The default block of a format: 256 (8-bit, torchao's), 256 (4-bit;
 *  torchao's default is 128), 256 (fp8, torchao's); 0 for an unknown
 *  format. */
LPX_API int64_t lpx_optim_state_default_block(lpx_optim_state_format format);

/** The kind of a format (os_8bit, os_4bit, os_fp8), or NULL before
 *  lpx_init or for an unknown format. Borrowed. */
LPX_API const lpx_kind *lpx_optim_state_kind(lpx_optim_state_format format);

/** New zero state (codes 0, scales 0) of one moment of a parameter of
 *  shape [ndim] on device dev, in blocks of `block` (0: the format's
 *  default). *out is a new reference (release it). Errors: LPX_EINVAL
 *  (NULL out, unknown format or role, block not a power of two in
 *  2..256), LPX_ESHAPE (bad shape), LPX_ENOMEM. Messages name the call,
 *  the kind and the argument. */
LPX_API lpx_status lpx_optim_state_new(lpx_optim_state_format format, lpx_optim_state_role role, int ndim,
                                       const int64_t *shape, int64_t block, lpx_device dev, lpx_tensor **out);

/** Quantizes dense CPU x (any float dtype, read as f32) into a new state
 *  tensor of x's shape (the format's codes with fresh block scales, as the
 *  step requantizes). *out is a new reference. Errors: as
 *  lpx_optim_state_new, and LPX_EINVAL / LPX_EDEVICE when x is not a dense
 *  CPU tensor. */
LPX_API lpx_status lpx_optim_state_quantize(lpx_tensor *x, lpx_optim_state_format format, lpx_optim_state_role role,
                                            int64_t block, lpx_tensor **out);

/** What a state tensor is. Errors: LPX_EINVAL (NULL, not a state tensor). */
typedef struct lpx_optim_state_info {
    lpx_optim_state_format format;
    lpx_optim_state_role role;
    int64_t block;
    int64_t numel;
    int64_t bytes; /* codes + scales, bytes held */
} lpx_optim_state_info;
LPX_API lpx_status lpx_optim_state_get_info(const lpx_tensor *t, lpx_optim_state_info *info);

/** Whether t is a tensor of one of the state kinds. */
LPX_API bool lpx_is_optim_state(const lpx_tensor *t);

/** Options of lpx_optim_adamw_ (start from lpx_optim_adamw_opts_default). */
typedef struct lpx_optim_adamw_opts {
    double lr, beta1, beta2, eps, weight_decay; /* torch.optim.AdamW's; default 1e-3, 0.9, 0.999, 1e-8, 1e-2 */
    lpx_optim_master master;                    /* default LPX_OPTIM_MASTER_PLAIN */
    uint64_t seed;                              /* stochastic rounding: the run's seed */
    uint32_t rank;                              /* ... this rank */
    int64_t index0;                             /* ... the flat index of params[0]'s first element */
} lpx_optim_adamw_opts;

/** The defaults above. */
LPX_API lpx_optim_adamw_opts lpx_optim_adamw_opts_default(void);

/** One fused AdamW step, in place, over n parameters whose moments
 *  exp_avg[i] / exp_avg_sq[i] are state tensors (one kind for all, roles m
 *  and v, params[i]'s numel, one block) at step `step` (>= 1): per block,
 *  dequantize m and v, update in f32 exactly as adamw_ (lpx_adamw_),
 *  write the parameter, requantize m and v with fresh scales. The master
 *  is opts->master: PLAIN (params any float dtype), BF16_SR (params bf16;
 *  element j of the concatenated list draws lpx_os_rand32(seed, rank,
 *  step, index0 + j)), F16S / F16S_SR (params f16 codes with
 *  master_scale[i] f32 [ceil(numel / block)] per parameter; master_scale
 *  may be NULL otherwise). Runs the op adamw_state_ on the CPU or CUDA.
 *  Errors: LPX_EINVAL / LPX_EDTYPE / LPX_ESHAPE naming op, kind and
 *  argument (a state of another kind or role, a block mismatch, the
 *  hyperparameters), those of adamw_state_. */
LPX_API lpx_status lpx_optim_adamw_(lpx_tensor *const *params, lpx_tensor *const *grads,
                                    lpx_tensor *const *exp_avg, lpx_tensor *const *exp_avg_sq,
                                    lpx_tensor *const *master_scale, int n, const lpx_optim_adamw_opts *opts,
                                    int64_t step);

/** The dense op adamw_state_ (ops.def), typed: lists of n tensors each;
 *  m / v are the state codes (u8, or f16 for the fp8 v), m_scale / v_scale
 *  f32 block scales, master_scale (NULL unless master is F16S or F16S_SR)
 *  f32 block scales of the f16 params. master: LPX_OPTIM_MASTER_*; seed,
 *  rank, index0: the stochastic rounding's key (lpx_optim_adamw_). The
 *  checks (lengths, dtypes, numel, block a power of two in 2..256, the
 *  hyperparameters) are the op's spec family `adamw_state`
 *  (include/lpx/op_args_optim.h). n = 0 does nothing. */
LPX_API lpx_status lpx_adamw_state_(lpx_tensor *const *params, lpx_tensor *const *grads, lpx_tensor *const *m,
                                    lpx_tensor *const *m_scale, lpx_tensor *const *v, lpx_tensor *const *v_scale,
                                    int n, lpx_optim_state_format format, int64_t block, double lr, double beta1,
                                    double beta2, double eps, double weight_decay, int64_t step,
                                    lpx_optim_master master, uint64_t seed, uint32_t rank, int64_t index0,
                                    lpx_tensor *const *master_scale);

LPX_END_DECLS

#endif
