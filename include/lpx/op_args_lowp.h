/* lpx — the spec families of the dense low-precision ops (fp8_*, nf4_*, qlora_dropout; ops_float8.def, ops_nf4.def, the blockwise group): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_LOWP_H
#define LPX_OP_ARGS_LOWP_H

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_LOWP(X)

#endif
