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

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_OPTIM(X) X(adamw)

#endif
