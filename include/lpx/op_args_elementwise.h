/* lpx — the spec families of elementwise ops beyond the binary family (add_scalar ... fill_) and the reductions (sum ... norm): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_ELEMENTWISE_H
#define LPX_OP_ARGS_ELEMENTWISE_H

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_ELEMENTWISE(X)

#endif
