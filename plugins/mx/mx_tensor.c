/* MX tensors: quantize (OCP MX 1.0 section 6.3), dequantize, validated
 * wrapping of (elements, scales), and dim-0 slicing. Layout: see mx.h.
 *
 * Quantization of one block of 32 values V_i (the spec's algorithm):
 *   shared_exp = floor(log2(max_i |V_i|)) - emax_elem     (e4m3: 8, e2m1: 2)
 *   clamped to the E8M0 range [-127, 127]; X = 2^shared_exp
 *   P_i = V_i / X converted to the element format, round to nearest even,
 *         saturating to the element's max normal (448, 6)
 * so the largest |V_i| / X lies in [2^emax, 2^(emax+1)): values above the
 * element max (e4m3: (448, 512), e2m1: (6, 8)) clamp. Worst-case error
 * relative to the block amax: mxfp8 < 1/8 (clamp), mxfp4 <= 1/4.
 * Special blocks: amax = 0 gives shared_exp = -127 (the clamp of
 * log2(0) = -inf) and zero elements; a NaN or an infinity in the block
 * gives the NaN scale 0xFF and zero elements, so the block dequantizes to
 * NaN (MX has no per-element inf/NaN in e2m1, and 0xFF marks the block). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "mx.h"
#include "mx_codec.h"

mx_format mx_format_of(const lpx_tensor *t)
{
    const lpx_kind *k = t ? lpx_tensor_kind(t) : NULL;
    return !k ? 0 : k == mx_kind_fp8 ? MX_FP8 : k == mx_kind_fp4 ? MX_FP4 : 0;
}

const char *mx_format_name(mx_format f) { return f == MX_FP8 ? "mxfp8" : "mxfp4"; }
int mx_emax_elem(mx_format f) { return f == MX_FP8 ? 8 : 2; }

static lpx_dtype elem_dtype(mx_format f) { return f == MX_FP8 ? LPX_F8E4M3FN : mx_f4e2m1; }
static const lpx_kind *kind_of(mx_format f) { return f == MX_FP8 ? mx_kind_fp8 : mx_kind_fp4; }

/* e4m3 decode table, filled once through lpx_convert (the core's codec) */
static float e4m3_table[256];
static int e4m3_ready;

static void e4m3_init(void)
{
    if (e4m3_ready) return;
    uint8_t codes[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    lpx_convert(e4m3_table, LPX_F32, codes, LPX_F8E4M3FN, 256, 0);
    e4m3_ready = 1;
}

/* rows of a tensor whose last dim is K: the product of the leading dims */
static int64_t rows_of(int ndim, const int64_t *shape)
{
    int64_t r = 1;
    for (int i = 0; i + 1 < ndim; i++) r *= shape[i];
    return r;
}

/* ---- blocks ---------------------------------------------------------- */

/* v: n <= 32 values (the rest of the block is padding, quantized as 0).
 * Writes the scale code and 32 fp8 codes or 16 fp4 bytes. */
static void quantize_block(mx_format f, const float *v, int n, uint8_t *scale, uint8_t *elems)
{
    float buf[MX_BLOCK] = {0};
    float amax = 0.0f;
    int special = 0;
    for (int i = 0; i < n; i++) {
        buf[i] = v[i];
        float a = fabsf(v[i]);
        if (isnan(a) || isinf(a)) special = 1;
        else if (a > amax) amax = a;
    }
    if (special) {
        *scale = MX_E8M0_NAN;
        memset(elems, 0, f == MX_FP8 ? MX_BLOCK : MX_BLOCK / 2);
        return;
    }
    int shared = -MX_E8M0_BIAS;
    if (amax > 0.0f) {
        int e;
        frexpf(amax, &e);               /* amax = m * 2^e, m in [0.5, 1): floor(log2) = e - 1 */
        shared = e - 1 - mx_emax_elem(f);
        if (shared < -MX_E8M0_BIAS) shared = -MX_E8M0_BIAS;
        if (shared > MX_E8M0_BIAS) shared = MX_E8M0_BIAS;
    }
    *scale = (uint8_t)(shared + MX_E8M0_BIAS);
    for (int i = 0; i < MX_BLOCK; i++) buf[i] = ldexpf(buf[i], -shared);   /* exact: a power of two */
    if (f == MX_FP8) {
        lpx_convert(elems, LPX_F8E4M3FN, buf, LPX_F32, MX_BLOCK, LPX_CONVERT_SATURATE);
    } else {
        for (int i = 0; i < MX_BLOCK; i += 2)
            elems[i / 2] = (uint8_t)(mx_f32_to_e2m1(buf[i]) | mx_f32_to_e2m1(buf[i + 1]) << 4);
    }
}

/* Decodes the first n values of one block. */
static void dequantize_block(mx_format f, uint8_t scale, const uint8_t *elems, int n, float *dst)
{
    if (scale == MX_E8M0_NAN) {
        for (int i = 0; i < n; i++) dst[i] = NAN;
        return;
    }
    int e = (int)scale - MX_E8M0_BIAS;
    if (f == MX_FP8)
        for (int i = 0; i < n; i++) dst[i] = ldexpf(e4m3_table[elems[i]], e);
    else
        for (int i = 0; i < n; i++) dst[i] = ldexpf(mx_e2m1_to_f32((uint8_t)(elems[i / 2] >> (4 * (i & 1)) & 0xFu)), e);
}

/* bytes of one row of elements / scales */
static size_t row_elem_bytes(mx_format f, int64_t kp) { return (size_t)(f == MX_FP8 ? kp : kp / 2); }

/* ---- whole tensors -------------------------------------------------- */

lpx_status mx_quantize(const char *op, mx_format f, lpx_tensor *x, lpx_tensor **out)
{
    *out = NULL;
    if (!x) return lpx_error(LPX_EINVAL, "%s(%s): x is NULL", op, mx_format_name(f));
    if (lpx_tensor_kind(x))
        return lpx_error(LPX_EINVAL, "%s(%s): x is a '%s' tensor; quantize a dense tensor", op, mx_format_name(f),
                         lpx_kind_name(lpx_tensor_kind(x)));
    if (lpx_tensor_device(x).type != LPX_DEVICE_CPU)
        return lpx_error(LPX_EDEVICE, "%s(%s): x is on device type %d; the MX plugin runs on the CPU", op,
                         mx_format_name(f), (int)lpx_tensor_device(x).type);
    int ndim = lpx_tensor_ndim(x);
    if (ndim < 1)
        return lpx_error(LPX_ESHAPE, "%s(%s): x is 0-d; MX blocks run along the last dim, so x needs >= 1 dim", op,
                         mx_format_name(f));
    const int64_t *shape = lpx_tensor_shape(x);
    int64_t k = shape[ndim - 1], kp = mx_kp(k), rows = rows_of(ndim, shape), nb = kp / MX_BLOCK;
    int64_t es[LPX_MAX_DIMS], ss[LPX_MAX_DIMS];
    memcpy(es, shape, (size_t)ndim * sizeof *es);
    memcpy(ss, shape, (size_t)ndim * sizeof *ss);
    es[ndim - 1] = kp;
    ss[ndim - 1] = nb;

    lpx_tensor *xf = NULL, *xc = NULL, *el = NULL, *sc = NULL;
    lpx_status st = lpx_kind_to_dense(x, &xf);          /* f32 (x itself if already f32) */
    if (!st) st = lpx_contiguous(xf, &xc);
    if (!st) st = lpx_tensor_new(elem_dtype(f), ndim, es, lpx_cpu(), &el);
    if (!st) st = lpx_tensor_new(mx_e8m0, ndim, ss, lpx_cpu(), &sc);
    if (!st) {
        const float *src = lpx_tensor_data(xc);
        uint8_t *ed = lpx_tensor_data(el), *sd = lpx_tensor_data(sc);
        size_t rb = row_elem_bytes(f, kp), bb = f == MX_FP8 ? MX_BLOCK : MX_BLOCK / 2;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < nb; b++) {
                int64_t c0 = b * MX_BLOCK;
                int n = (int)(k - c0 < MX_BLOCK ? k - c0 : MX_BLOCK);
                quantize_block(f, src + r * k + c0, n, sd + r * nb + b, ed + (size_t)r * rb + (size_t)b * bb);
            }
        mx_meta m = {.magic = MX_MAGIC, .format = (uint32_t)f, .block = MX_BLOCK};
        lpx_tensor *inner[2] = {el, sc};
        st = lpx_tensor_new_kind(kind_of(f), lpx_tensor_dtype(x), ndim, shape, lpx_cpu(), inner, 2, &m, sizeof m,
                                 out);
    }
    lpx_tensor_release(xf);
    lpx_tensor_release(xc);
    lpx_tensor_release(el);
    lpx_tensor_release(sc);
    return st;
}

void mx_dequantize_rows(const lpx_tensor *t, int64_t r0, int64_t nr, float *dst)
{
    mx_format f = mx_format_of(t);
    int ndim = lpx_tensor_ndim(t);
    int64_t k = lpx_tensor_shape(t)[ndim - 1], kp = mx_kp(k), nb = kp / MX_BLOCK;
    const uint8_t *ed = lpx_tensor_data(lpx_tensor_inner(t, 0));
    const uint8_t *sd = lpx_tensor_data(lpx_tensor_inner(t, 1));
    size_t rb = row_elem_bytes(f, kp), bb = f == MX_FP8 ? MX_BLOCK : MX_BLOCK / 2;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t b = 0; b < nb; b++) {
            int64_t c0 = b * MX_BLOCK;
            int n = (int)(k - c0 < MX_BLOCK ? k - c0 : MX_BLOCK);
            dequantize_block(f, sd[(r0 + r) * nb + b], ed + (size_t)(r0 + r) * rb + (size_t)b * bb, n,
                             dst + r * k + c0);
        }
}

lpx_status mx_to_dense(const lpx_tensor *t, lpx_tensor **out)
{
    *out = NULL;
    if (!mx_format_of(t)) return lpx_error(LPX_EINVAL, "mx to_dense: t is not an MX tensor");
    if (lpx_tensor_device(t).type != LPX_DEVICE_CPU) {
        /* inner tensors on a device: the op's kernel for that device's
         * backend (the kind kernel redispatches; lpx-mx-cuda.so for CUDA) */
        lpx_op op;
        lpx_status st = lpx_op_find("mx_dequantize", &op);
        if (st) return st;
        lpx_value a = lpx_v_tensor((lpx_tensor *)t);
        lpx_call c;
        lpx_call_init(&c, op, &a, 1);
        if ((st = lpx_dispatch(&c))) return st;
        *out = c.rets[0].u.t;
        return LPX_OK;
    }
    lpx_status st = lpx_tensor_new(LPX_F32, lpx_tensor_ndim(t), lpx_tensor_shape(t), lpx_cpu(), out);
    if (st) return st;
    mx_dequantize_rows(t, 0, rows_of(lpx_tensor_ndim(t), lpx_tensor_shape(t)), lpx_tensor_data(*out));
    return LPX_OK;
}

/* Checks one inner tensor against the shape the layout requires. */
static lpx_status check_inner(const char *op, const char *fmt, const char *what, const lpx_tensor *t,
                              lpx_dtype dtype, int ndim, const int64_t *shape, int64_t last)
{
    char sb[128];
    if (!t) return lpx_error(LPX_EINVAL, "%s(%s): %s is NULL", op, fmt, what);
    if (lpx_tensor_kind(t))
        return lpx_error(LPX_EINVAL, "%s(%s): %s is a '%s' tensor, expected dense", op, fmt, what,
                         lpx_kind_name(lpx_tensor_kind(t)));
    if (lpx_tensor_dtype(t) != dtype)
        return lpx_error(LPX_EDTYPE, "%s(%s): %s has dtype %s, expected %s", op, fmt, what,
                         lpx_dtype_name(lpx_tensor_dtype(t)), lpx_dtype_name(dtype));
    bool ok = lpx_tensor_ndim(t) == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = lpx_tensor_shape(t)[i] == (i == ndim - 1 ? last : shape[i]);
    if (!ok)
        return lpx_error(LPX_ESHAPE, "%s(%s): %s has shape %s; the logical shape needs its leading dims and a "
                         "last dim of %lld", op, fmt, what, lpx_tensor_shape_str(t, sb, sizeof sb), (long long)last);
    if (!lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_EINVAL, "%s(%s): %s is not contiguous", op, fmt, what);
    return LPX_OK;
}

lpx_status mx_wrap(const char *op, mx_format f, lpx_dtype logical, int ndim, const int64_t *shape,
                   lpx_tensor *elems, lpx_tensor *scales, lpx_tensor **out)
{
    *out = NULL;
    const char *fmt = mx_format_name(f);
    if (ndim < 1 || ndim > LPX_MAX_DIMS || !shape)
        return lpx_error(LPX_ESHAPE, "%s(%s): ndim %d out of range 1..%d", op, fmt, ndim, LPX_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return lpx_error(LPX_ESHAPE, "%s(%s): shape[%d] = %lld is negative", op, fmt, i,
                                           (long long)shape[i]);
    if (!lpx_dtype_valid(logical))
        return lpx_error(LPX_EDTYPE, "%s(%s): logical dtype %d is not registered", op, fmt, (int)logical);
    int64_t kp = mx_kp(shape[ndim - 1]);
    lpx_status st = check_inner(op, fmt, "elements (inner[0])", elems, elem_dtype(f), ndim, shape, kp);
    if (!st) st = check_inner(op, fmt, "scales (inner[1])", scales, mx_e8m0, ndim, shape, kp / MX_BLOCK);
    if (st) return st;
    lpx_device dev = lpx_tensor_device(elems), sdev = lpx_tensor_device(scales);
    if (dev.type != sdev.type || dev.index != sdev.index)
        return lpx_error(LPX_EDEVICE, "%s(%s): elements are on device %d:%d, scales on %d:%d", op, fmt, (int)dev.type,
                         (int)dev.index, (int)sdev.type, (int)sdev.index);
    mx_meta m = {.magic = MX_MAGIC, .format = (uint32_t)f, .block = MX_BLOCK};
    lpx_tensor *inner[2] = {elems, scales};
    return lpx_tensor_new_kind(kind_of(f), logical, ndim, shape, dev, inner, 2, &m, sizeof m, out);
}

/* A view of rows [start, start + len) of a contiguous inner tensor (whose
 * last dim holds `last` elements per row for 1-D, or rows of `row` elems). */
static lpx_status inner_rows(const lpx_tensor *t, int64_t start_elem, int ndim, const int64_t *shape,
                             lpx_tensor **out)
{
    return lpx_tensor_view_of(t, ndim, shape, NULL, lpx_tensor_offset(t) + start_elem, out);
}

lpx_status mx_narrow0(const char *op, const lpx_tensor *t, int64_t start, int64_t length, lpx_tensor **out)
{
    *out = NULL;
    mx_format f = mx_format_of(t);
    const char *fmt = mx_format_name(f);
    int ndim = lpx_tensor_ndim(t);
    const int64_t *shape = lpx_tensor_shape(t);
    if (start < 0 || length < 0 || start > shape[0] || length > shape[0] - start)
        return lpx_error(LPX_ERANGE, "%s(%s): start %lld, length %lld is out of range for dim 0 of size %lld", op,
                         fmt, (long long)start, (long long)length, (long long)shape[0]);
    lpx_tensor *el = lpx_tensor_inner(t, 0), *sc = lpx_tensor_inner(t, 1), *ev = NULL, *sv = NULL;
    int64_t ns[LPX_MAX_DIMS], es[LPX_MAX_DIMS], ss[LPX_MAX_DIMS];
    memcpy(ns, shape, (size_t)ndim * sizeof *ns);
    ns[0] = length;
    lpx_status st;
    if (ndim == 1) {
        /* dim 0 is the block dim: whole blocks only (the last may be partial
         * when the slice ends at the end of the tensor) */
        if (start % MX_BLOCK || (length % MX_BLOCK && start + length != shape[0]))
            return lpx_error(LPX_EINVAL, "%s(%s): a 1-D MX tensor slices in whole blocks of %d elements "
                             "(start %lld, length %lld of %lld)", op, fmt, MX_BLOCK, (long long)start,
                             (long long)length, (long long)shape[0]);
        es[0] = mx_kp(length);
        ss[0] = es[0] / MX_BLOCK;
        st = inner_rows(el, start, 1, es, &ev);
        if (!st) st = inner_rows(sc, start / MX_BLOCK, 1, ss, &sv);
    } else {
        int64_t kp = mx_kp(shape[ndim - 1]), row = 1;
        for (int i = 1; i < ndim - 1; i++) row *= shape[i];
        memcpy(es, ns, (size_t)ndim * sizeof *es);
        memcpy(ss, ns, (size_t)ndim * sizeof *ss);
        es[ndim - 1] = kp;
        ss[ndim - 1] = kp / MX_BLOCK;
        st = inner_rows(el, start * row * kp, ndim, es, &ev);
        if (!st) st = inner_rows(sc, start * row * (kp / MX_BLOCK), ndim, ss, &sv);
    }
    if (!st) {
        mx_meta m = {.magic = MX_MAGIC, .format = (uint32_t)f, .block = MX_BLOCK};
        lpx_tensor *inner[2] = {ev, sv};
        st = lpx_tensor_new_kind(lpx_tensor_kind(t), lpx_tensor_dtype(t), ndim, ns, lpx_tensor_device(t), inner, 2, &m,
                                 sizeof m, out);
    }
    lpx_tensor_release(ev);
    lpx_tensor_release(sv);
    return st;
}

lpx_status mx_copy_bytes(lpx_tensor *dst, const lpx_tensor *src)
{
    size_t n = lpx_dtype_nbytes(lpx_tensor_dtype(src), lpx_tensor_numel(src));
    lpx_device dd = lpx_tensor_device(dst), sd = lpx_tensor_device(src);
    if (!n) return LPX_OK;
    if (dd.type == LPX_DEVICE_CPU && sd.type == LPX_DEVICE_CPU) {
        memcpy(lpx_tensor_data(dst), lpx_tensor_data(src), n);
        return LPX_OK;
    }
    const lpx_backend_i *be = lpx_backend_for(dd.type != LPX_DEVICE_CPU ? dd.type : sd.type);
    if (!be || !be->copy || (dd.type != LPX_DEVICE_CPU && sd.type != LPX_DEVICE_CPU && dd.type != sd.type))
        return lpx_error(LPX_EDEVICE, "mx: no backend copies inner tensors from device type %d to %d", (int)sd.type,
                         (int)dd.type);
    return be->copy(be->self, lpx_tensor_data(dst), dd, lpx_tensor_data(src), sd, n);
}

lpx_status mx_copy_inner(const lpx_tensor *t, lpx_tensor **out)
{
    *out = NULL;
    if (!t || lpx_tensor_kind(t) || !lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_EINVAL, "mx: inner tensor to copy is not dense and contiguous");
    lpx_status st = lpx_tensor_new(lpx_tensor_dtype(t), lpx_tensor_ndim(t), lpx_tensor_shape(t),
                                   lpx_tensor_device(t), out);
    if (!st && (st = mx_copy_bytes(*out, t))) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

void mx_tensor_init(void) { e4m3_init(); }
