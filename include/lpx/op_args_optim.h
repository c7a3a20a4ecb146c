/* lpx — the spec families of the optimizers (adamw_ and the optimizer-state ops): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_OPTIM_H
#define LPX_OP_ARGS_OPTIM_H

/** family `adamw`: adamw_ (params, grads, exp_avg, exp_avg_sq, lr,
 *  beta1, beta2, eps, weight_decay, step). Four lists of n tensors each;
 *  for each i, params[i] and grads[i] of a floating-point dtype,
 *  exp_avg[i] and exp_avg_sq[i] f32, every one dense, contiguous and of
 *  params[i]'s numel, the written ones (params, exp_avg, exp_avg_sq) not
 *  read-only; lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0,
 *  step >= 1 (lpx_meta_adamw). No result: the step is in place. */
typedef struct lpx_adamw_args {
    lpx_tensor *const *params, *const *grads, *const *exp_avg, *const *exp_avg_sq; /* n each */
    uint32_t n;
    lpx_adamw_consts k;              /* the update's f32 constants (lpx_meta_adamw) */
} lpx_adamw_args;

/** family `adamw_state`: adamw_state_ (params, grads, m, m_scale, v,
 *  v_scale, format, block, lr, beta1, beta2, eps, weight_decay, step,
 *  master, master_scale). Lists of n tensors (master_scale: n for the
 *  scaled-f16 masters, else 0), every tensor dense and contiguous, the
 *  written ones not read-only; format 0..2 (include/lpx/optim_state.h);
 *  block a power of two in 2..256; the hyperparameters as adamw_'s;
 *  master [mode] or [mode, seed, rank, index0] (mode 0..3; the stochastic
 *  modes 1 and 3 need all four; rank in 0..2^32-1, index0 >= 0). For each
 *  i, with N = numel(params[i]) and B = ceil(N / block): params[i]
 *  floating-point (bf16 for mode 1, f16 for modes 2 and 3), grads[i]
 *  floating-point of N elements, m[i] u8 and v[i] u8 (f16 for format 2)
 *  of N codes (4-bit: N / block * block / 2 + (N % block + 1) / 2 bytes),
 *  m_scale[i], v_scale[i] (and master_scale[i]) f32 of B elements. */
typedef struct lpx_adamw_state_args {
    lpx_tensor *const *params, *const *grads, *const *m, *const *m_scale, *const *v, *const *v_scale;
    lpx_tensor *const *master_scale; /* n entries for modes 2 and 3, else NULL */
    uint32_t n;
    int format;                      /* 0 8-bit, 1 4-bit, 2 fp8 */
    int master;                      /* 0 plain, 1 bf16 SR, 2 scaled f16, 3 scaled f16 SR */
    int64_t block;
    int64_t step;                    /* the step taken (>= 1): the stochastic rounding's counter */
    uint64_t seed;                   /* stochastic rounding's key (0 when not given) */
    uint32_t rank;
    int64_t index0;                  /* flat index of params[0]'s first element */
    lpx_adamw_consts k;              /* the update's f32 constants (lpx_meta_adamw's) */
} lpx_adamw_state_args;

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_OPTIM(X) X(adamw) X(adamw_state)

#endif
