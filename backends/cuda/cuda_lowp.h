/* What the low-precision kernels of lpx-cuda.so (the fp8, blockwise fp8,
 * NF4 and qlora_dropout ops) have no code for, beyond their ops' contract
 * (checked by the dispatcher: spec families of include/lpx/op_args_lowp.h).
 * The spec takes any byte-sized dtype where the op takes a floating-point
 * (or any) tensor; these kernels decode the built-in dtypes only, so a
 * plugin's dtype is refused here, with the message cu_check_dense gave
 * before the spec. C and CUDA C++. */
#ifndef LPX_CUDA_LOWP_H
#define LPX_CUDA_LOWP_H

#include "cuda_internal.h"

/* LPX_EDTYPE unless t (NULL: absent, fine) has a built-in dtype. */
static inline lpx_status cu_lowp_builtin(const lpx_call *c, const char *arg, const lpx_tensor *t)
{
    if (!t || lpx_tensor_dtype(t) < LPX_DTYPE_BUILTIN_COUNT) return LPX_OK;
    return lpx_error(LPX_EDTYPE, "%s: tensor '%s' has dtype %s, which the cuda kernels do not support", cu_op(c), arg,
                     lpx_dtype_name(lpx_tensor_dtype(t)));
}

#endif
