/* lpx — the spec families of linear algebra beyond matmul (linear, addmm), the neural-network ops (rmsnorm ... embedding_backward), the transformer ops (rope, attention) and swiglu_backward: the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_NN_H
#define LPX_OP_ARGS_NN_H

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_NN(X)

#endif
