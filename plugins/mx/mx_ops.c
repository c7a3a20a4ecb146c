/* Kernels of the MX kinds and the plugin's own ops.
 *
 *   linear        typed C kernel (libffi path): dequantizes W in tiles of
 *                 rows into a scratch f32 buffer and runs the dense linear
 *                 (sgemm) on each tile
 *   narrow        typed; dim 0 only: a view of whole rows (1-D: whole blocks)
 *   detach, clone, contiguous, cast   typed
 *   mx_quantize(Tensor x, str format) -> Tensor   new op, typed, cpu key
 *   mx_dequantize(Tensor x) -> Tensor             new op, MX keys; an MX tensor
 *                 on a device redispatches to that device's backend key
 *                 (lpx-mx-cuda.so brings the cuda kernels)
 *   fallback      every other op: dequantize the MX arguments and dispatch
 *                 the op again on dense tensors (visible in LPX_TRACE) */
#include <stdlib.h>
#include <string.h>
#include "mx.h"

static lpx_op op_mx_quantize, op_mx_dequantize;

/* rows of W dequantized per tile: 256 rows x K floats of scratch */
#define TILE_ROWS 256

static const char *fmt_of(const lpx_tensor *t) { return mx_format_name(mx_format_of(t)); }

/* Dense f32 contiguous version of any tensor (MX or other kinds through
 * their to_dense, dense through a cast). */
static lpx_status dense_f32(lpx_tensor *t, lpx_tensor **out)
{
    lpx_tensor *d = NULL;
    lpx_status st = lpx_kind_to_dense(t, &d);
    if (st) return st;
    st = lpx_contiguous(d, out);
    lpx_tensor_release(d);
    return st;
}

/* y[M, N] = x2[M, K] @ dq(W)^T, one tile of W rows at a time */
static lpx_status linear_tiles(lpx_tensor *x2, const lpx_tensor *w, lpx_tensor *y2)
{
    int64_t n = lpx_tensor_shape(w)[0], k = lpx_tensor_shape(w)[1];
    int64_t tile = n < TILE_ROWS ? n : TILE_ROWS, ts[2] = {tile, k};
    lpx_tensor *scratch = NULL;
    lpx_status st = lpx_tensor_new(LPX_F32, 2, ts, lpx_cpu(), &scratch);
    for (int64_t n0 = 0; !st && n0 < n; n0 += tile) {
        int64_t rows = n - n0 < tile ? n - n0 : tile;
        lpx_tensor *wt = NULL, *part = NULL, *dst = NULL;
        mx_dequantize_rows(w, n0, rows, lpx_tensor_data(scratch));
        st = lpx_narrow(scratch, 0, 0, rows, &wt);
        if (!st) st = lpx_linear(x2, wt, NULL, &part);
        if (!st) st = lpx_narrow(y2, 1, n0, rows, &dst);
        if (!st) st = lpx_copy_(dst, part);
        lpx_tensor_release(wt);
        lpx_tensor_release(part);
        lpx_tensor_release(dst);
    }
    lpx_tensor_release(scratch);
    return st;
}

/* linear(Tensor x, Tensor w, Tensor? bias) -> Tensor, for any mix of MX
 * and dense arguments; the result is dense f32. */
static lpx_status mx_linear(lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor **out)
{
    *out = NULL;
    lpx_tensor *xd = NULL, *x2 = NULL, *y = NULL, *y2 = NULL, *wd = NULL, *bd = NULL;
    lpx_status st = dense_f32(x, &xd);
    if (st) return st;
    int xn = lpx_tensor_ndim(xd);
    if (mx_format_of(w) && lpx_tensor_device(w).type == LPX_DEVICE_CPU) {
        const int64_t *ws = lpx_tensor_shape(w);
        if (lpx_tensor_ndim(w) != 2) {
            st = lpx_error(LPX_ESHAPE, "linear(%s): w must be 2-D [out, in], got %d dims", fmt_of(w),
                           lpx_tensor_ndim(w));
        } else if (xn < 1 || lpx_tensor_shape(xd)[xn - 1] != ws[1]) {
            char sb[128];
            st = lpx_error(LPX_ESHAPE, "linear(%s): x has shape %s, its last dim must be in = %lld", fmt_of(w),
                           lpx_tensor_shape_str(xd, sb, sizeof sb), (long long)ws[1]);
        } else {
            int64_t ys[LPX_MAX_DIMS], k = ws[1], m = 1;
            for (int i = 0; i + 1 < xn; i++) m *= (ys[i] = lpx_tensor_shape(xd)[i]);
            ys[xn - 1] = ws[0];
            int64_t s2[2] = {m, k}, o2[2] = {m, ws[0]};
            st = lpx_empty(xn, ys, LPX_F32, lpx_cpu(), &y);
            if (!st) st = lpx_reshape(xd, 2, s2, &x2);
            if (!st) st = lpx_view(y, 2, o2, &y2);
            if (!st) st = linear_tiles(x2, w, y2);
        }
    } else {
        st = dense_f32(w, &wd);
        if (!st) st = lpx_linear(xd, wd, NULL, &y);
    }
    if (!st && bias) {
        lpx_tensor *yb = NULL;
        st = dense_f32(bias, &bd);
        if (!st) st = lpx_add(y, bd, &yb);
        if (!st) { lpx_tensor_release(y); y = yb; }
    }
    lpx_tensor_release(xd);
    lpx_tensor_release(x2);
    lpx_tensor_release(y2);
    lpx_tensor_release(wd);
    lpx_tensor_release(bd);
    if (st) { lpx_tensor_release(y); return st; }
    *out = y;
    return LPX_OK;
}

/* mx_quantize(Tensor x, str format) -> Tensor (typed, at the cpu key) */
static lpx_status mx_quantize_op(lpx_tensor *x, const char *format, lpx_tensor **out)
{
    mx_format f = !format ? 0 : !strcmp(format, "mxfp8") ? MX_FP8 : !strcmp(format, "mxfp4") ? MX_FP4 : 0;
    if (!f) {
        *out = NULL;
        return lpx_error(LPX_EINVAL, "mx_quantize: format '%s' is not 'mxfp8' or 'mxfp4'", format ? format : "(null)");
    }
    return mx_quantize("mx_quantize", f, x, out);
}

/* Appends result t when st is OK. Callers compute st in a statement of
 * its own: argument evaluation order would not fill t first. */
static lpx_status ret(lpx_call *c, lpx_status st, lpx_tensor *t)
{
    if (st) return st;
    c->rets[c->nrets++] = lpx_v_tensor(t);
    return LPX_OK;
}

/* Argument i, if it is an MX tensor (the kind key can come from any). */
static lpx_tensor *mx_arg(const lpx_call *c, int i)
{
    return c->args[i].tag == LPX_TAG_TENSOR && mx_format_of(c->args[i].u.t) ? c->args[i].u.t : NULL;
}

/* mx_dequantize(Tensor x) -> Tensor. Boxed, not typed: an MX tensor on a
 * device goes on to that device's kernel with lpx_redispatch, which takes
 * the call itself. */
static lpx_status k_dequantize(lpx_call *c)
{
    lpx_tensor *out = NULL;
    /* inner tensors on a device: that backend's kernel (lpx-mx-cuda.so) */
    if (lpx_tensor_device(c->args[0].u.t).type != LPX_DEVICE_CPU) return lpx_redispatch(c);
    lpx_status st = mx_to_dense(c->args[0].u.t, &out);
    return ret(c, st, out);
}

/* The view and copy ops of an MX tensor: typed kernels (the arguments by
 * name, as the schema gives them). */

/* narrow(Tensor x, int dim, int start, int length) -> Tensor */
static lpx_status mx_narrow_op(lpx_tensor *x, int64_t dim_arg, int64_t start_arg, int64_t length, lpx_tensor **out)
{
    int ndim = lpx_tensor_ndim(x);
    int64_t dim = dim_arg < 0 ? dim_arg + ndim : dim_arg;
    if (dim < 0 || dim >= ndim)
        return lpx_error(LPX_ERANGE, "narrow(%s): dim %lld out of range for %d dims", fmt_of(x), (long long)dim_arg,
                         ndim);
    if (dim != 0)
        return lpx_error(LPX_ENOTIMPL, "narrow(%s): only dim 0 slices without dequantizing (dim %lld given); "
                         "dequantize first (lpx_kind_to_dense)", fmt_of(x), (long long)dim);
    int64_t start = start_arg < 0 ? start_arg + lpx_tensor_shape(x)[0] : start_arg;
    return mx_narrow0("narrow", x, start, length, out);
}

/* detach(Tensor x) -> Tensor */
static lpx_status mx_detach_op(lpx_tensor *x, lpx_tensor **out)
{
    lpx_tensor *inner[2] = {lpx_tensor_inner(x, 0), lpx_tensor_inner(x, 1)};
    size_t ms;
    const void *meta = lpx_tensor_meta(x, &ms);
    return lpx_tensor_new_kind(lpx_tensor_kind(x), lpx_tensor_dtype(x), lpx_tensor_ndim(x), lpx_tensor_shape(x),
                               lpx_tensor_device(x), inner, 2, meta, ms, out);
}

/* clone(Tensor x) -> Tensor */
static lpx_status mx_clone_op(lpx_tensor *x, lpx_tensor **out)
{
    lpx_tensor *el = NULL, *sc = NULL;
    lpx_status st = mx_copy_inner(lpx_tensor_inner(x, 0), &el);
    if (!st) st = mx_copy_inner(lpx_tensor_inner(x, 1), &sc);
    if (!st) st = mx_wrap("clone", mx_format_of(x), lpx_tensor_dtype(x), lpx_tensor_ndim(x), lpx_tensor_shape(x),
                          el, sc, out);
    lpx_tensor_release(el);
    lpx_tensor_release(sc);
    return st;
}

/* contiguous(Tensor x) -> Tensor: MX tensors are always row-contiguous */
static lpx_status mx_contiguous_op(lpx_tensor *x, lpx_tensor **out)
{
    lpx_tensor_retain(x);
    *out = x;
    return LPX_OK;
}

/* cast(Tensor x, dtype dtype, bool saturate) -> Tensor */
static lpx_status mx_cast_op(lpx_tensor *x, int32_t dtype, bool saturate, lpx_tensor **out)
{
    lpx_tensor *d = NULL;
    lpx_status st = mx_to_dense(x, &d);
    if (st) return st;
    if ((lpx_dtype)dtype == LPX_F32) {
        *out = d;
        return LPX_OK;
    }
    st = lpx_cast(d, (lpx_dtype)dtype, saturate, out);
    lpx_tensor_release(d);
    return st;
}

/* ---- the fallback --------------------------------------------------- */

/* Name of argument i in the op's schema text ("add(Tensor a, ...)"). */
static void arg_name(lpx_op op, int i, char *buf, size_t len)
{
    const char *s = lpx_op_schema(op), *p = s ? strchr(s, '(') : NULL;
    buf[0] = 0;
    for (int k = 0; p && k < i; k++) p = strchr(p + 1, ',');
    if (!p) return;
    const char *end = p + 1 + strcspn(p + 1, ",)");
    const char *sp = end;
    while (sp > p && sp[-1] == ' ') sp--;
    const char *st = sp;
    while (st > p + 1 && st[-1] != ' ') st--;
    size_t n = (size_t)(sp - st) < len - 1 ? (size_t)(sp - st) : len - 1;
    memcpy(buf, st, n);
    buf[n] = 0;
}

/* Dequantizes every MX argument and runs the op again on the dense
 * values. Refused when an MX tensor would be written to (an `out`
 * argument or the target of an in-place op): the values would go into a
 * temporary. Boxed, and it walks c->args by index: it serves every op
 * (whatever its schema), reads no argument's meaning, and hands the
 * whole argument list on to lpx_dispatch. */
static lpx_status mx_fallback(lpx_call *c)
{
    const char *op = lpx_op_name(c->op);
    size_t oplen = strlen(op);
    lpx_value args[LPX_MAX_ARGS];
    lpx_tensor *owned[LPX_MAX_ARGS * 8];
    lpx_tensor **lists[LPX_MAX_ARGS] = {0};
    int nowned = 0;
    lpx_status st = LPX_OK;
    for (int i = 0; i < c->nargs && !st; i++) {
        args[i] = c->args[i];
        lpx_tensor *m = mx_arg(c, i);
        if (m) {
            char name[64];
            arg_name(c->op, i, name, sizeof name);
            if (!strcmp(name, "out") || (i == 0 && oplen && op[oplen - 1] == '_'))
                st = lpx_error(LPX_ENOTIMPL, "%s(%s): writing into an MX tensor (argument '%s') is not supported; "
                               "quantize the dense result instead", op, fmt_of(m), name);
            else if (nowned >= (int)(sizeof owned / sizeof *owned))
                st = lpx_error(LPX_ENOTIMPL, "%s(%s): too many MX arguments for the fallback", op, fmt_of(m));
            else if (!(st = mx_to_dense(m, &owned[nowned])))
                args[i].u.t = owned[nowned++];
        } else if (c->args[i].tag == LPX_TAG_TENSORS && c->args[i].len) {
            uint32_t n = c->args[i].len;
            lists[i] = malloc(n * sizeof *lists[i]);
            if (!lists[i]) { st = lpx_error(LPX_ENOMEM, "%s(mx fallback): cannot allocate", op); break; }
            for (uint32_t j = 0; j < n && !st; j++) {
                lpx_tensor *t = c->args[i].u.ts[j];
                lists[i][j] = t;
                if (!mx_format_of(t)) continue;
                if (nowned >= (int)(sizeof owned / sizeof *owned))
                    st = lpx_error(LPX_ENOTIMPL, "%s(%s): too many MX arguments for the fallback", op, fmt_of(t));
                else if (!(st = mx_to_dense(t, &owned[nowned])))
                    lists[i][j] = owned[nowned++];
            }
            args[i].u.ts = lists[i];
        }
    }
    if (!st) {
        lpx_call inner;
        lpx_call_init(&inner, c->op, args, c->nargs);
        st = lpx_dispatch(&inner);
        if (!st) {
            for (int r = 0; r < inner.nrets; r++) c->rets[r] = inner.rets[r];
            c->nrets = inner.nrets;
        }
    }
    for (int i = 0; i < nowned; i++) lpx_tensor_release(owned[i]);
    for (int i = 0; i < LPX_MAX_ARGS; i++) free(lists[i]);
    return st;
}

/* ---- registration --------------------------------------------------- */

lpx_status mx_register_ops(const lpx_host *host)
{
    lpx_status st = host->op_register(host, "mx_quantize(Tensor x, str format) -> Tensor", &op_mx_quantize);
    if (!st) st = host->op_register(host, "mx_dequantize(Tensor x) -> Tensor", &op_mx_dequantize);
    if (!st) st = host->kernel_register_typed(host, op_mx_quantize, LPX_KEY_CPU, "Tensor, str -> Tensor",
                                              (void (*)(void))mx_quantize_op);
    const lpx_kind *kinds[2] = {mx_kind_fp8, mx_kind_fp4};
    static const struct { lpx_op op; const char *sig; void (*fn)(void); } typed[] = {
        {LPX_OP_narrow, "Tensor, int, int, int -> Tensor", (void (*)(void))mx_narrow_op},
        {LPX_OP_detach, "Tensor -> Tensor", (void (*)(void))mx_detach_op},
        {LPX_OP_clone, "Tensor -> Tensor", (void (*)(void))mx_clone_op},
        {LPX_OP_contiguous, "Tensor -> Tensor", (void (*)(void))mx_contiguous_op},
        {LPX_OP_cast, "Tensor, dtype, bool -> Tensor", (void (*)(void))mx_cast_op},
    };
    for (int i = 0; i < 2 && !st; i++) {
        int key = lpx_kind_key(kinds[i]);
        st = host->kernel_register_typed(host, LPX_OP_linear, key, "Tensor, Tensor, Tensor? -> Tensor",
                                         (void (*)(void))mx_linear);
        if (!st) st = host->kernel_register(host, op_mx_dequantize, key, k_dequantize, NULL);
        for (size_t j = 0; j < sizeof typed / sizeof *typed && !st; j++)
            st = host->kernel_register_typed(host, typed[j].op, key, typed[j].sig, typed[j].fn);
        if (!st) st = host->fallback_register(host, key, mx_fallback, NULL);
    }
    return st;
}
