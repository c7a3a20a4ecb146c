/* CPU kernels: views and layout (view, reshape, transpose, t, permute,
 * slice, narrow, expand, contiguous, cat, clone, detach), and
 * cpu_view_copy, the strided copy with dtype conversion that they share
 * with copy_/cast/fill_.
 *
 * The arguments are checked, and the result's geometry computed, by the
 * dispatcher (spec families `view` and `cat`, dispatch/spec_views.c).
 * Views never copy: they build a new handle over the same storage with
 * lpx_tensor_view_of. The copying ops (reshape when a view is impossible,
 * contiguous, cat, clone) allocate a contiguous result and fill it with
 * cpu_view_copy (on another device: copy_). The CUDA and simdev backends
 * adopt these kernels for their keys. */
#include <stdio.h>
#include <string.h>
#include "cpu_internal.h"

/* ---- strided copy ---------------------------------------------------- */

/* Copies `len` elements of `esz` bytes between a strided run (stride in
 * elements) and a packed buffer. Typed loops for the common sizes so the
 * compiler emits plain loads/stores instead of memcpy calls. */
static void copy_run(unsigned char *run, int64_t stride, unsigned char *buf, int64_t len, size_t esz,
                     bool to_run)
{
    if (stride == 1) {
        if (to_run) memcpy(run, buf, (size_t)len * esz);
        else memcpy(buf, run, (size_t)len * esz);
        return;
    }
#define RUN_LOOP(T)                                                                      \
    do {                                                                                 \
        T *r_ = (T *)(void *)run, *b_ = (T *)(void *)buf;                                \
        if (to_run) for (int64_t j = 0; j < len; j++) r_[j * stride] = b_[j];            \
        else for (int64_t j = 0; j < len; j++) b_[j] = r_[j * stride];                   \
    } while (0)
    switch (esz) {
    case 1: RUN_LOOP(uint8_t); break;
    case 2: RUN_LOOP(uint16_t); break;
    case 4: RUN_LOOP(uint32_t); break;
    case 8: RUN_LOOP(uint64_t); break;
    default:
        for (int64_t j = 0; j < len; j++) {
            unsigned char *r = run + j * stride * (int64_t)esz, *b = buf + j * (int64_t)esz;
            if (to_run) memcpy(r, b, esz);
            else memcpy(b, r, esz);
        }
    }
#undef RUN_LOOP
}

/* Moves logical elements [start, start+n) of v to (to_view = false) or
 * from (to_view = true) the packed buffer buf, in runs along the last dim. */
static void walk(const cpu_view *v, int64_t start, int64_t n, unsigned char *buf, bool to_view)
{
    size_t esz = (size_t)v->elem_size;
    if (v->contiguous) {
        unsigned char *p = (unsigned char *)v->base + start * (int64_t)esz;
        if (to_view) memcpy(p, buf, (size_t)n * esz);
        else memcpy(buf, p, (size_t)n * esz);
        return;
    }
    /* not contiguous implies ndim >= 1 */
    int last = v->ndim - 1;
    int64_t idx[LPX_MAX_DIMS], rem = start;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % v->shape[d];
        rem /= v->shape[d];
    }
    for (int64_t k = 0; k < n;) {
        int64_t off = 0;
        for (int d = 0; d <= last; d++) off += idx[d] * v->strides[d];
        int64_t len = v->shape[last] - idx[last];
        if (len > n - k) len = n - k;
        copy_run((unsigned char *)v->base + off * (int64_t)esz, v->strides[last], buf + k * (int64_t)esz, len,
                 esz, to_view);
        k += len;
        idx[last] += len;
        for (int d = last; d > 0 && idx[d] >= v->shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

lpx_status cpu_view_copy(const cpu_view *dst, const cpu_view *src, unsigned flags)
{
    int64_t n = dst->numel;
    if (n == 0) return LPX_OK;
    bool same = dst->dtype == src->dtype;
    if (same && src->contiguous) {
        walk(dst, 0, n, (unsigned char *)src->base, true);
        return LPX_OK;
    }
    if (same && dst->contiguous) {
        walk(src, 0, n, (unsigned char *)dst->base, false);
        return LPX_OK;
    }
    if (dst->contiguous && src->contiguous)
        return lpx_convert(dst->base, dst->dtype, src->base, src->dtype, (size_t)n, flags);
    /* chunks through stack buffers: gather, convert, scatter */
    _Alignas(16) unsigned char ts[CPU_CHUNK * 8], td[CPU_CHUNK * 8];
    for (int64_t start = 0; start < n; start += CPU_CHUNK) {
        int64_t m = n - start < CPU_CHUNK ? n - start : CPU_CHUNK;
        unsigned char *s = ts;
        if (src->contiguous) s = (unsigned char *)src->base + start * src->elem_size;
        else walk(src, start, m, ts, false);
        if (same) {
            walk(dst, start, m, s, true);
            continue;
        }
        unsigned char *d = dst->contiguous ? (unsigned char *)dst->base + start * dst->elem_size : td;
        lpx_status st = lpx_convert(d, dst->dtype, s, src->dtype, (size_t)m, flags);
        if (st) return st;
        if (!dst->contiguous) walk(dst, start, m, td, true);
    }
    return LPX_OK;
}

/* ---- helpers --------------------------------------------------------- */

/* The error just set, prefixed with `op` (the message is copied first:
 * lpx_error writes into the buffer lpx_last_error returns). */
static lpx_status prefixed(lpx_status st, const char *op)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    return lpx_error(st, "%s: %s", op, msg);
}

/* Returns a view of x with the given geometry as the call's result. */
static lpx_status ret_view(lpx_call *c, const lpx_tensor *x, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset)
{
    lpx_tensor *v;
    lpx_status st = lpx_tensor_view_of(x, ndim, shape, strides, offset, &v);
    if (st) return prefixed(st, cpu_op_name(c));
    cpu_ret(c, v);
    return LPX_OK;
}

/* Copies src into the same-shaped dst: on the CPU directly, elsewhere
 * through the copy_ kernel of the tensors' device (these kernels serve
 * every backend that adopts them). */
static lpx_status copy_into(const lpx_tensor *dst, const lpx_tensor *src)
{
    if (dst->device.type != LPX_DEVICE_CPU) return lpx_copy_((lpx_tensor *)dst, (lpx_tensor *)src);
    cpu_view vd, vs;
    cpu_view_of(&vd, dst);
    cpu_view_of(&vs, src);
    return cpu_view_copy(&vd, &vs, 0);
}

/* New contiguous tensor of (ndim, shape) holding x's elements in row-major
 * order (x->numel must equal the shape's), on x's device. */
static lpx_status copy_as(lpx_call *c, const lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **out)
{
    *out = NULL;
    lpx_tensor *y, *v;
    lpx_status st = lpx_tensor_new(x->dtype, x->ndim, x->shape, x->device, &y);
    if (st) return prefixed(st, cpu_op_name(c));
    if ((st = copy_into(y, x))) {
        lpx_tensor_release(y);
        return st;
    }
    if (ndim == x->ndim && !memcmp(shape, x->shape, (size_t)ndim * sizeof *shape)) {
        *out = y;
        return LPX_OK;
    }
    int64_t strides[LPX_MAX_DIMS];
    lpx_contiguous_strides(ndim, shape, strides);
    st = lpx_tensor_view_of(y, ndim, shape, strides, 0, &v);
    lpx_tensor_release(y);
    if (st) return prefixed(st, cpu_op_name(c));
    *out = v;
    return LPX_OK;
}

/* ---- kernels --------------------------------------------------------- */

/* Every op of the `view` family (op_args_views.h): the dispatcher checked
 * the arguments and computed the result's geometry; this only builds it
 * (these kernels serve every backend that adopts them: a copy goes
 * through copy_ on the tensor's device). */
static lpx_status k_view(lpx_call *c)
{
    const lpx_view_args *a = lpx_op_args_of(c);
    lpx_tensor *y;
    lpx_status st;
    switch (a->result) {
    case LPX_VIEW_SAME:
        lpx_tensor_retain(a->x);
        cpu_ret(c, a->x);
        return LPX_OK;
    case LPX_VIEW_COPY:
        if ((st = copy_as(c, a->x, a->ndim, a->shape, &y))) return st;
        cpu_ret(c, y);
        return LPX_OK;
    default:
        return ret_view(c, a->x, a->ndim, a->shape, a->strides, a->offset);
    }
}

/* cat (family `cat`): the result's shape and dtype are the dispatcher's;
 * each tensor with elements fills its slab of the result along dim, in
 * list order (the 1-D empty ones cat skips have none). */
static lpx_status k_cat(lpx_call *c)
{
    const lpx_cat_args *a = lpx_op_args_of(c);
    int d = a->dim;
    lpx_tensor *out;
    lpx_status st = lpx_tensor_new(a->dtype, a->ndim, a->shape, a->ref->device, &out);
    if (st) return prefixed(st, "cat");
    int64_t at = 0;
    for (int i = 0; i < a->n; i++) {
        const lpx_tensor *x = a->xs[i];
        if (x->numel == 0) continue; /* adds nothing along d either: shape[d] or another dim is 0 */
        /* the slab of out that x fills: out narrowed to [at, at + len) */
        lpx_tensor *slab;
        int64_t sshape[LPX_MAX_DIMS];
        memcpy(sshape, out->shape, sizeof sshape);
        sshape[d] = x->shape[d];
        if (!(st = lpx_tensor_view_of(out, out->ndim, sshape, out->strides, at * out->strides[d], &slab))) {
            st = copy_into(slab, x);
            lpx_tensor_release(slab);
        }
        if (st) {
            lpx_tensor_release(out);
            return st;
        }
        at += x->shape[d];
    }
    cpu_ret(c, out);
    return LPX_OK;
}

lpx_status lpx_cpu_register_views(void)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
        {LPX_OP_view, k_view}, {LPX_OP_reshape, k_view}, {LPX_OP_transpose, k_view},
        {LPX_OP_t, k_view}, {LPX_OP_permute, k_view}, {LPX_OP_slice, k_view}, {LPX_OP_narrow, k_view},
        {LPX_OP_expand, k_view}, {LPX_OP_contiguous, k_view}, {LPX_OP_cat, k_cat},
        {LPX_OP_clone, k_view}, {LPX_OP_detach, k_view},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = cpu_reg(table[i].op, table[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
