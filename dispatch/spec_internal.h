/* What every spec family's meta function (dispatch/spec*.c) starts with:
 * the op's and an argument's names for messages, and the checks every
 * family makes of a tensor argument (include/lpx/op_args.h: dense, of a
 * byte-sized dtype; floating-point where the family says so). */
#ifndef LPX_SPEC_INTERNAL_H
#define LPX_SPEC_INTERNAL_H

#include "dispatch_internal.h"

static inline const char *op_name(const lpx_call *c) { return lpx__op_row(c->op)->schema.name; }
static inline const char *arg_name(const lpx_call *c, int i) { return lpx__op_row(c->op)->schema.args[i].name; }

/* ---- the checks every family starts with ----------------------------- */

/* A tensor that reached a backend: dense, of a byte-sized dtype (spec.c;
 * the message names the op, the argument and the backend). */
lpx_status lpx__spec_dense_slow(const lpx_call *c, int i, const lpx_tensor *t);
/* ... the same check, the tensor named `arg` in the message (a list entry) */
lpx_status lpx__spec_dense_named(const lpx_call *c, const char *arg, const lpx_tensor *t);
/* ... and floating-point */
lpx_status lpx__spec_floating_slow(const lpx_call *c, int i, const lpx_tensor *t);

/* the built-in dtypes are all byte-sized (bool takes a byte) */
static inline lpx_status dense(const lpx_call *c, int i, const lpx_tensor *t)
{
    if (LPX_LIKELY(!t->kind && (unsigned)t->dtype < LPX_DTYPE_BUILTIN_COUNT)) return LPX_OK;
    return lpx__spec_dense_slow(c, i, t);
}

_Static_assert(LPX_F32 == 0 && LPX_F16 == 1 && LPX_BF16 == 2 && LPX_F8E4M3FN == 3 && LPX_F8E5M2 == 4,
               "the built-in floating-point dtypes are ids 0..4");
static inline lpx_status floating(const lpx_call *c, int i, const lpx_tensor *t)
{
    if (LPX_LIKELY(!t->kind && (unsigned)t->dtype <= LPX_F8E5M2)) return LPX_OK;
    return lpx__spec_floating_slow(c, i, t);
}

static inline lpx_tensor *opt_tensor(const lpx_call *c, int i)
{
    return i < c->nargs && c->args[i].tag == LPX_TAG_TENSOR ? c->args[i].u.t : NULL;
}

#endif
