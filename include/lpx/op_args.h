/* lpx — the checked arguments of an op, as its backend kernels read them.
 *
 * Every row of ops.def names an op's spec family, LPX_OP(name, spec,
 * schema): `none` (the kernel still reads c->args itself) or a family
 * below. For an op with a family, the dispatcher runs the family's meta
 * function once, when the call reaches a backend key (dense dispatch:
 * kinds run first and see the raw arguments; a kind that redispatches
 * lands here too), and hands the kernel the result through
 * lpx_op_args_of(c): the arguments by name, checked against the op's
 * contract, and normalised (the output's shape and dtype, a resolved dim,
 * line geometry, the GEMM's geometry). A kernel of such an op holds
 * arithmetic only: every refusal of bad arguments, with its message, is
 * the dispatcher's, the same for every backend (built-in or plugin).
 *
 * What every family checks first, for each tensor argument in schema
 * order: a dense tensor (a kind tensor that reaches a backend is refused,
 * naming the backend's key) of a byte-sized dtype; and where the family
 * says "floating-point", a floating-point dtype. The one-device rule is
 * the dispatcher's already (dispatch.h). What stays a backend's own: the
 * dtypes it has code for beyond that, and checks that read data (an index
 * out of range, a scale that is not finite).
 *
 * Output rules (the `dtype` / shape fields): as each family says. */
#ifndef LPX_OP_ARGS_H
#define LPX_OP_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "tensor.h"
#include "dispatch.h"
#include "meta.h"

LPX_BEGIN_DECLS

/** family `binary`: add, sub, mul, div, swiglu (a, b, out?) and
 *  relu_backward, silu_backward, gelu_backward (grad, x). a and b dense;
 *  numpy broadcasting (lpx_meta_broadcast); the result has a's dtype and
 *  the broadcast shape; `out`, when given, dense and as lpx_meta_out
 *  says. */
typedef struct lpx_binary_args {
    lpx_tensor *a, *b;               /* the first and second operands (schema names in messages) */
    lpx_tensor *out;                 /* the caller's out, or NULL (absent, or an op without one) */
    lpx_dtype dtype;                 /* the result's dtype: a's */
    int ndim;                        /* the broadcast shape */
    bool flat;                       /* a, b and out (when given) all have that shape
                                      * and are contiguous (a size-1 dim's stride is
                                      * free): one flat loop over a's numel elements */
    int64_t shape[LPX_MAX_DIMS];
} lpx_binary_args;

/** The ops of family `binary`, X(op, NAME) each, in one order: a backend
 *  derives its per-op kernels, its op codes and its registration from this
 *  one list (tests/test_spec.c checks it against ops.def's spec column). */
#define LPX_BINARY_OPS(X)                                                                            \
    X(add, ADD) X(sub, SUB) X(mul, MUL) X(div, DIV) X(relu_backward, RELU_BW) X(silu_backward, SILU_BW) \
    X(gelu_backward, GELU_BW) X(swiglu, SWIGLU)

/** family `softmax`: x floating-point; dim normalised against x (a
 *  scalar takes 0 and -1); the result has x's shape and dtype. */
typedef struct lpx_softmax_args {
    lpx_tensor *x;
    int dim;                         /* normalised */
    int64_t len, count;              /* line length along dim, number of lines */
} lpx_softmax_args;

/** family `softmax_backward`: grad and y floating-point, one shape; dim
 *  normalised against y; the result has grad's shape and dtype. */
typedef struct lpx_softmax_backward_args {
    lpx_tensor *grad, *y;
    int dim;
    int64_t len, count;
} lpx_softmax_backward_args;

/** family `matmul`: a and b floating-point, out (may be NULL) dense; the
 *  shapes lpx_meta_matmul takes; the result has a's dtype and g's
 *  out_shape. */
typedef struct lpx_matmul_args {
    lpx_tensor *a, *b, *out;
    lpx_gemm_geom g;
} lpx_matmul_args;

/* The other groups' families: one header each, each defining its structs
 * and LPX_SPEC_FAMILIES_<GROUP>(X), the list of its family names (one
 * list drives the union below, the dispatcher's table and the size
 * checks). */
#include "op_args_views.h"
#include "op_args_elementwise.h"
#include "op_args_nn.h"
#include "op_args_lowp.h"
#include "op_args_optim.h"

/** The families above, by name: X(family) each. */
#define LPX_SPEC_FAMILIES_CORE(X) X(binary) X(softmax) X(softmax_backward) X(matmul)

/** Every family: the core ones and each group's. */
#define LPX_SPEC_FAMILIES(X)                                                                            \
    LPX_SPEC_FAMILIES_CORE(X)                                                                           \
    LPX_SPEC_FAMILIES_VIEWS(X)                                                                          \
    LPX_SPEC_FAMILIES_ELEMENTWISE(X)                                                                    \
    LPX_SPEC_FAMILIES_NN(X)                                                                             \
    LPX_SPEC_FAMILIES_LOWP(X)                                                                           \
    LPX_SPEC_FAMILIES_OPTIM(X)

/** Room for any family's struct. Grows (plugin ABI minor) when a family
 *  is added; nothing outside an lpx_op_frame is laid out around it. */
typedef union lpx_op_args_any {
#define LPX__OP_ARGS_MEMBER(f) lpx_##f##_args f;
    LPX_SPEC_FAMILIES(LPX__OP_ARGS_MEMBER)
#undef LPX__OP_ARGS_MEMBER
} lpx_op_args_any;

/** What a backend kernel of an op with a spec family is handed: the
 *  dispatcher copies the call (its `c`) into a frame of its own, runs the
 *  family's meta function into `args` right behind it, and copies the
 *  kernel's rets back to the caller's lpx_call afterwards. lpx_call itself
 *  keeps its plugin-ABI-1 size (104 bytes on LP64): a plugin built against an older
 *  header that puts one on its stack is never written past. */
typedef struct lpx_op_frame {
    lpx_call call;                   /* first: the kernel's c is &frame.call */
    lpx_op_args_any args;
} lpx_op_frame;

/** The checked arguments of the running call: a kernel of an op with a
 *  spec family casts them to its family's struct. Valid only for such a
 *  kernel's own `c`, as dispatch (or a by-hand caller through
 *  lpx_op_spec_run) hands it: `c` is then the start of an lpx_op_frame and
 *  the arguments sit at a fixed offset behind it. Not for an op without a
 *  family, nor for a kind's kernel (those read c->args). */
static inline const void *lpx_op_args_of(const lpx_call *c)
{
    return (const char *)c + offsetof(lpx_op_frame, args);
}

/** For callers that invoke a kernel of an op with a family by hand (the
 *  dispatch benchmark, a backend adopting another's kernel outside
 *  dispatch): with f->call filled (lpx_call_init, then key = the backend
 *  key that names it in messages), runs the op's meta function into
 *  f->args; then call the kernel with &f->call. `size`: sizeof *f.
 *  Errors: those of the op's contract; LPX_EINVAL (an op without a family,
 *  NULL, a frame too small for the family). */
LPX_API lpx_status lpx_op_spec_run(lpx_op_frame *f, size_t size);

/** The size of the argument struct of op's spec family (0: none). */
LPX_API size_t lpx_op_spec_size(lpx_op op);

LPX_END_DECLS

#endif
