/* lpx — the spec families of creation, views and layout (empty ... detach): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own). */
#ifndef LPX_OP_ARGS_VIEWS_H
#define LPX_OP_ARGS_VIEWS_H

/** family `create`: empty, zeros, full, arange, randn, rand. No tensor
 *  argument: the result is described by the arguments. The shape list
 *  (at most LPX_MAX_DIMS entries; arange: the element count of
 *  [start, end) by step, lpx_meta_arange) and the dtype must make a
 *  tensor: no negative size, the element count and the byte count fit
 *  int64, a registered dtype (any registered dtype, packed plugin formats
 *  included: a backend without code for one refuses it itself); randn and
 *  rand take floating-point dtypes only (lpx_meta_random). The result is
 *  a new contiguous tensor of (ndim, shape) and dtype on `device`. */
typedef struct lpx_create_args {
    lpx_dtype dtype;                 /* the result's dtype */
    lpx_device device;               /* the `device` argument, as given */
    int ndim;                        /* the result's shape */
    int64_t numel;                   /* its element count */
    int64_t shape[LPX_MAX_DIMS];
    double value;                    /* full: the value; zeros: 0 */
    double start, step;              /* arange: element i is start + i * step */
    uint64_t seed;                   /* randn, rand: the Philox key */
    int bits;                        /* rand: mantissa bits of the uniform (lpx_meta_random) */
} lpx_create_args;

/** How a `view` family result is made from x. */
typedef enum lpx_view_result {
    LPX_VIEW_SHARE = 0,              /* a new handle over x's storage: (ndim, shape, strides, offset) */
    LPX_VIEW_COPY = 1,               /* a new contiguous tensor of (ndim, shape) on x's device,
                                      * holding x's elements in row-major order */
    LPX_VIEW_SAME = 2,               /* x itself (one more reference) */
} lpx_view_result;

/** family `view`: view, reshape, transpose, t, permute, slice, narrow,
 *  expand, contiguous, clone, detach. x dense (any device: the geometry
 *  is device-free, a copy goes through copy_); the op's own rules on its
 *  int arguments (dims normalised, -1 inferred, python slice clamping,
 *  broadcasting of expand); the result's geometry computed here, once,
 *  for every backend: a kernel only builds it (`result`). view and
 *  detach, transpose, t, permute, slice, narrow, expand always share x's
 *  storage; reshape shares it when the strides allow (PyTorch's
 *  computeStride), else copies; contiguous is x itself when x is
 *  contiguous, else a copy; clone always copies. The result has x's
 *  dtype. */
typedef struct lpx_view_args {
    lpx_tensor *x;
    lpx_view_result result;
    int ndim;                        /* the result's shape */
    int64_t shape[LPX_MAX_DIMS];
    int64_t strides[LPX_MAX_DIMS];   /* LPX_VIEW_SHARE: in elements */
    int64_t offset;                  /* LPX_VIEW_SHARE: in elements of x's storage */
} lpx_view_args;

/** family `cat`: cat. xs non-empty, each dense, all of xs[0]'s dtype;
 *  1-D empty tensors are skipped whatever their shape (PyTorch's legacy
 *  rule); the others (`ref` the first of them, else xs[0]) have ref's
 *  rank (not 0-d) and ref's shape outside dim; the result is a new
 *  contiguous tensor of (ndim, shape) and dtype on ref's device, filled
 *  in list order (a tensor with no element, skipped ones included, adds
 *  nothing). */
typedef struct lpx_cat_args {
    lpx_tensor *const *xs;           /* the list, as given */
    int n;                           /* its length */
    const lpx_tensor *ref;           /* the tensor the shape rule is read from */
    int dim;                         /* normalised against ref */
    lpx_dtype dtype;                 /* the result's dtype: xs[0]'s */
    int ndim;                        /* the result's shape */
    int64_t shape[LPX_MAX_DIMS];
} lpx_cat_args;

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_VIEWS(X) X(create) X(view) X(cat)

#endif
