/* The spec families of include/lpx/op_args_optim.h: their meta functions
 * (the conventions are spec.c's). */
#include "spec_internal.h"
