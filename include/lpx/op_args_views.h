/* lpx — the spec families of creation, views and layout (empty ... detach): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_VIEWS_H
#define LPX_OP_ARGS_VIEWS_H

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_VIEWS(X)

#endif
