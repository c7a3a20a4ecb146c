/* Views on CUDA tensors are lpx's own view kernels: the dispatcher checks
 * their arguments and computes the result's geometry once, for every
 * backend (spec families `view` and `cat`, dispatch/spec_views.c); the
 * kernels only build it, and the copying ones (reshape of a non-viewable
 * layout, contiguous, clone, cat) allocate on the tensor's device and
 * dispatch copy_, which lands in cuda_copy.cu. So the plugin adopts the
 * kernels the CPU backend registered instead of carrying a second copy. */
#include "cuda_internal.h"

lpx_status cu_register_views(const lpx_host *h)
{
    static const lpx_op ops[] = {
        LPX_OP_view, LPX_OP_reshape, LPX_OP_transpose, LPX_OP_t, LPX_OP_permute, LPX_OP_slice,
        LPX_OP_narrow, LPX_OP_expand, LPX_OP_contiguous, LPX_OP_cat, LPX_OP_clone, LPX_OP_detach,
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        lpx_kernel_fn fn;
        void *data;
        lpx_status st = lpx_kernel_lookup(ops[i], LPX_KEY_CPU, &fn, &data);
        if (st || (st = h->kernel_register(h, ops[i], cu_key, fn, data))) return st;
    }
    return LPX_OK;
}
