/* lpx — the spec families of the optimizers (adamw_ and the optimizer-state ops): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_OPTIM_H
#define LPX_OP_ARGS_OPTIM_H

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_OPTIM(X)

#endif
