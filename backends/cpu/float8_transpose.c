/* fp8_quantize_t, the reference: quantize x [R, C] and x^T [C, R] as the
 * composition of two fp8_quantize calls (ops_float8.def), dispatched on
 * x's device. Tensorwise, x^T is cast with q's own scale (a static
 * quantize, so its codes are q's codes transposed); axiswise, x^T is
 * quantized per row of x^T, i.e. per column of x.
 *
 * The kernel names no device: it checks the arguments and calls ops. The
 * CPU registers it, and the CUDA backend runs it for the inputs its fused
 * kernels do not serve (cuda_fp8_transpose.cu), so the argument checks and
 * their messages exist once. */
#include <string.h>
#include "../../dispatch/api_util.h"
#include "cpu_internal.h"

/* Fails unless t is a dense tensor on x's device. */
static lpx_status dense_on(const lpx_call *c, const char *arg, const lpx_tensor *t, const lpx_tensor *x)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is absent", cpu_op_name(c), arg);
    if (lpx_tensor_kind(t))
        return lpx_error(LPX_EINVAL, "%s: %s is of kind '%s'; the op takes dense tensors", cpu_op_name(c), arg,
                         lpx_kind_name(lpx_tensor_kind(t)));
    lpx_device a = lpx_tensor_device(x), b = lpx_tensor_device(t);
    if (a.type != b.type || a.index != b.index)
        return lpx_error(LPX_EDEVICE, "%s: %s is on another device than x", cpu_op_name(c), arg);
    return LPX_OK;
}

/* Fails unless t is a contiguous tensor of dtype dt and shape [d0, d1]. */
static lpx_status out_like(const lpx_call *c, const char *arg, const lpx_tensor *t, lpx_dtype dt, int64_t d0,
                           int64_t d1)
{
    const int64_t *sh = lpx_tensor_shape(t);
    bool shape_ok = lpx_tensor_ndim(t) == 2 && sh[0] == d0 && sh[1] == d1;
    if (lpx_tensor_dtype(t) != dt || !shape_ok || !lpx_tensor_is_contiguous(t)) {
        char s1[160];
        return lpx_error(LPX_ESHAPE, "%s: %s is %s %s%s; expected a contiguous %s [%lld, %lld]", cpu_op_name(c), arg,
                         lpx_dtype_name(lpx_tensor_dtype(t)), lpx_tensor_shape_str(t, s1, sizeof s1),
                         lpx_tensor_is_contiguous(t) ? "" : " (not contiguous)", lpx_dtype_name(dt), (long long)d0,
                         (long long)d1);
    }
    return LPX_OK;
}

/* One fp8_quantize through the dispatcher (x's device); outputs that are
 * NULL are dropped. */
static lpx_status quantize(lpx_tensor *x, lpx_tensor *scale, lpx_dtype fp8, bool axiswise, bool pow2,
                           double scale_max, bool sat, lpx_tensor **outs[4])
{
    lpx_value args[7] = {lpx_v_tensor(x), lpx_v_opt_tensor(scale), lpx_v_dtype(fp8),
                         axiswise ? lpx_v_i64(1) : lpx_v_none(), lpx_v_bool(pow2), lpx_v_f64(scale_max),
                         lpx_v_bool(sat)};
    return lpx__call_retn(LPX_OP_fp8_quantize, args, 7, 4, outs);
}

static lpx_status k_fp8_quantize_t(lpx_call *c)
{
    lpx_tensor *x = cpu_tensor_arg(c, 0), *sarg = cpu_tensor_arg(c, 1);
    lpx_dtype fp8 = c->args[2].u.d;
    bool axiswise = c->args[3].u.b, pow2 = c->args[4].u.b, sat = c->args[6].u.b;
    double scale_max = c->args[5].u.f;
    lpx_tensor *qt = cpu_tensor_arg(c, 7), *st_ = cpu_tensor_arg(c, 8), *sit = cpu_tensor_arg(c, 9);
    const char *op = cpu_op_name(c);
    lpx_status st;
    if (!x) return lpx_error(LPX_EINVAL, "%s: x is absent", op);
    if ((st = dense_on(c, "x", x, x))) return st;
    if (lpx_tensor_ndim(x) != 2) {
        char s1[160];
        return lpx_error(LPX_ESHAPE, "%s: x has shape %s; the transposed quantize takes a 2-D x [R, C]", op,
                         lpx_tensor_shape_str(x, s1, sizeof s1));
    }
    if (axiswise && sarg)
        return lpx_error(LPX_EINVAL, "%s: a static scale was given with axiswise scaling; static scales are "
                                     "tensorwise here (x and x^T would need different ones)", op);
    if (fp8 != LPX_F8E4M3FN && fp8 != LPX_F8E5M2)
        return lpx_error(LPX_EDTYPE, "%s: fp8 is %s; it must be f8e4m3fn or f8e5m2", op, lpx_dtype_name(fp8));
    int64_t R = lpx_tensor_shape(x)[0], C = lpx_tensor_shape(x)[1];
    if ((st = dense_on(c, "qt", qt, x)) || (st = dense_on(c, "scale_t", st_, x)) ||
        (st = dense_on(c, "scale_inv_t", sit, x)) || (st = out_like(c, "qt", qt, fp8, C, R)))
        return st;
    int64_t ns = axiswise ? C : 1;
    if (lpx_tensor_dtype(st_) != LPX_F32 || lpx_tensor_dtype(sit) != LPX_F32 || lpx_tensor_numel(st_) != ns ||
        lpx_tensor_numel(sit) != ns || (axiswise && ((st = out_like(c, "scale_t", st_, LPX_F32, C, 1)) ||
                                                     (st = out_like(c, "scale_inv_t", sit, LPX_F32, C, 1)))))
        return st ? st
                  : lpx_error(LPX_ESHAPE, "%s: scale_t and scale_inv_t must be f32 with %lld value%s (%s)", op,
                              (long long)ns, ns == 1 ? "" : "s", axiswise ? "[C, 1]" : "numel 1, tensorwise");
    lpx_tensor *q = NULL, *s = NULL, *si = NULL, *stats = NULL, *xt = NULL, *q2 = NULL, *s2 = NULL, *si2 = NULL;
    lpx_tensor **o1[4] = {&q, &s, &si, &stats}, **o2[4] = {&q2, &s2, &si2, NULL};
    if ((st = quantize(x, sarg, fp8, axiswise, pow2, scale_max, sat, o1))) goto done;
    if ((st = lpx_t(x, &xt))) goto done;
    /* tensorwise: x^T with q's scale, as a static scale (same codes) */
    st = quantize(xt, axiswise ? NULL : s, fp8, axiswise, pow2, scale_max, sat, o2);
    if (st || (st = lpx_copy_(qt, q2)) || (st = lpx_copy_(st_, axiswise ? s2 : s)) ||
        (st = lpx_copy_(sit, axiswise ? si2 : si)))
        goto done;
    cpu_ret(c, q);
    cpu_ret(c, s);
    cpu_ret(c, si);
    cpu_ret(c, stats);
    q = s = si = stats = NULL;
done:;
    lpx_tensor *tmp[8] = {q, s, si, stats, xt, q2, s2, si2};
    for (int i = 0; i < 8; i++) lpx_tensor_release(tmp[i]);
    return st;
}

lpx_status lpx_cpu_register_float8_transpose(void) { return cpu_reg(LPX_OP_fp8_quantize_t, k_fp8_quantize_t); }
