/* lpx — the spec families of elementwise ops beyond the binary family (add_scalar ... fill_) and the reductions (sum ... norm): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_ELEMENTWISE_H
#define LPX_OP_ARGS_ELEMENTWISE_H

/** family `unary`: neg, abs, sqrt, exp, relu, silu, gelu (x, out?) and
 *  add_scalar, mul_scalar (a, float s, out?). x dense; the result has x's
 *  shape and dtype; `out`, when given, dense and as lpx_meta_out says
 *  (the binary family's out rule). */
typedef struct lpx_unary_args {
    lpx_tensor *x;                   /* the operand (the schema's a for the scalar ops, x otherwise) */
    lpx_tensor *out;                 /* the caller's out, or NULL */
    float s;                         /* the scalar rounded to f32 (add_scalar, mul_scalar); 0 otherwise */
    bool flat;                       /* x and out (when given) contiguous (a size-1 dim's stride is
                                      * free): one flat loop over x's numel elements */
} lpx_unary_args;

/** The ops of family `unary`, X(op, NAME) each (as LPX_BINARY_OPS). */
#define LPX_UNARY_OPS(X)                                                                             \
    X(neg, NEG) X(abs, ABS) X(sqrt, SQRT) X(exp, EXP) X(relu, RELU) X(silu, SILU) X(gelu, GELU)       \
    X(add_scalar, ADDS) X(mul_scalar, MULS)

/** family `cast`: x not of a kind, of any registered dtype (packed ones
 *  included: a backend says which it has code for); dtype registered; the
 *  result has x's shape and `dtype`. */
typedef struct lpx_cast_args {
    lpx_tensor *x;
    lpx_dtype dtype;                 /* the result's */
    bool saturate;                   /* out-of-range values clamp (LPX_CONVERT_SATURATE) */
} lpx_cast_args;

/** family `copy`: copy_ (dst, src). Both dense (lpx_meta_copy: dst
 *  writable, src broadcasting to dst's shape); they may live on different
 *  devices (moving bytes between them is copy_'s job: the one-device rule
 *  does not apply). The result is dst. */
typedef struct lpx_copy_args {
    lpx_tensor *dst, *src;
} lpx_copy_args;

/** family `fill`: fill_ (dst, value). dst dense and as lpx_meta_fill says
 *  (writable, a dtype that encodes single elements). The result is dst. */
typedef struct lpx_fill_args {
    lpx_tensor *dst;
    float value;                     /* rounded to f32 (then encoded in dst's dtype) */
} lpx_fill_args;

/** family `reduce`: sum, mean, max, amax, norm (x, int[]? dims, bool
 *  keepdim). x dense; dims (absent or empty: every dim) as lpx_meta_reduce
 *  says, max and amax refusing to fold zero elements into a non-empty
 *  result; the result has x's dtype and g's out_shape. */
typedef struct lpx_reduce_args {
    lpx_tensor *x;
    bool keepdim;
    lpx_reduce_geom g;               /* the dims folded, the output's shape and numel, elements per output */
    int64_t out_stride[LPX_MAX_DIMS];/* per dim of x: how far one step along it moves in the
                                      * output's row-major order (0 for a folded dim) */
} lpx_reduce_args;

/** The ops of family `reduce`, X(op, NAME) each (as LPX_BINARY_OPS). */
#define LPX_REDUCE_OPS(X) X(sum, SUM) X(mean, MEAN) X(max, MAX) X(amax, AMAX) X(norm, NORM)

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_ELEMENTWISE(X) X(unary) X(cast) X(copy) X(fill) X(reduce)

#endif
