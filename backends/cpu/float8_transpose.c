/* fp8_quantize_t, the reference: quantize x [R, C] and x^T [C, R] as the
 * composition of two fp8_quantize calls (ops_float8.def), dispatched on
 * x's device. Tensorwise, x^T is cast with q's own scale (a static
 * quantize, so its codes are q's codes transposed); axiswise, x^T is
 * quantized per row of x^T, i.e. per column of x.
 *
 * The kernel names no device: it calls ops. The CPU registers it, and the
 * CUDA backend runs it for the inputs its fused kernels do not serve
 * (cuda_fp8_transpose.cu). Its arguments are checked by the dispatcher
 * (spec family `fp8_quantize`, op_args_lowp.h), before either kernel. */
#include <stdio.h>
#include <string.h>
#include "../../dispatch/api_util.h"
#include "cpu_internal.h"

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
    const lpx_fp8_quantize_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x, *sarg = a->scale;
    lpx_dtype fp8 = a->fp8;
    bool axiswise = a->axiswise, pow2 = a->pow2, sat = a->saturate;
    double scale_max = a->scale_max;
    lpx_tensor *qt = a->qt, *st_ = a->scale_t, *sit = a->scale_inv_t;
    lpx_status st;
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
done:
    if (st) {
        /* the inner fp8_quantize's data checks (a static scale that is not
         * finite and > 0, a non-finite x) name that op: name this one */
        const char *m = lpx_last_error();
        static const char inner[] = "fp8_quantize: ";
        if (!strncmp(m, inner, sizeof inner - 1)) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", m + sizeof inner - 1);
            lpx_error(st, "fp8_quantize_t: %s", buf);
        }
    }
    lpx_tensor *tmp[8] = {q, s, si, stats, xt, q2, s2, si2};
    for (int i = 0; i < 8; i++) lpx_tensor_release(tmp[i]);
    return st;
}

lpx_status lpx_cpu_register_float8_transpose(void) { return cpu_reg(LPX_OP_fp8_quantize_t, k_fp8_quantize_t); }
