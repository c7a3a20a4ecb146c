/* CPU neural-network ops: rmsnorm, softmax, cross-entropy, MSE loss and
 * embedding, with their backward passes.
 *
 * Rows are read and written as f32 through cpu_load_f32/cpu_store_f32, so
 * every float dtype and every strided layout works; sums run in double.
 * Softmax and cross-entropy subtract the row max before exponentiating
 * (log-sum-exp), so large logits do not overflow.
 *
 * Conventions:
 * - results take the dtype of the main input (x, logits, grad, weight);
 *   rmsnorm's rstd is always f32, shaped [..., 1];
 * - rmsnorm_backward always returns grad_w = sum over rows of
 *   grad * x * rstd (the gradient of the weight, or of an implicit all-ones
 *   weight when none was given), in the weight's dtype (x's without one);
 * - cross_entropy averages over the targets that are not ignore_index; when
 *   all are ignored the loss (and its gradient) is 0;
 * - integer indices (targets, embedding indices) are i32 or i64; a value
 *   out of range is LPX_ERANGE naming its position. */
#include <math.h>
#include <string.h>
#include "cpu_internal.h"

/* ---- helpers ------------------------------------------------------------
 * The contract of every op here (dtypes, shapes, dims) is the
 * dispatcher's (spec families `rmsnorm`, `rmsnorm_backward`, `softmax`,
 * `softmax_backward`, `cross_entropy`, `mse_loss`, `embedding`,
 * `embedding_backward`; op_args.h, op_args_nn.h): the kernels read their
 * checked arguments from lpx_op_args_of(c). What they still check is data:
 * a target or an index out of range. */

/* Writes the multi-index of flat logical position p of shape into buf. */
static const char *index_str(int ndim, const int64_t *shape, int64_t p, char *buf, size_t len)
{
    int64_t idx[LPX_MAX_DIMS];
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? p % shape[d] : 0;
        p = shape[d] ? p / shape[d] : 0;
    }
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)idx[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

/* Element offset (from the data pointer) of flat logical position p. */
static int64_t elem_offset(const lpx_tensor *t, int64_t p)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0 && p; d--) {
        off += (p % t->shape[d]) * t->strides[d];
        p /= t->shape[d];
    }
    return off;
}

/* Copies the integer tensor t (i32 or i64, any layout) into a new int64
 * array in logical order (lpx_free it). */
static lpx_status load_indices(const lpx_call *c, const lpx_tensor *t, int64_t **out)
{
    *out = NULL;
    int64_t n = t->numel;
    int64_t *v = lpx_malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) return lpx_error(LPX_ENOMEM, "%s: cannot copy %lld indices", cpu_op_name(c), (long long)n);
    const char *base = lpx_tensor_data(t);
    bool contig = lpx_tensor_is_contiguous(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t off = contig ? i : elem_offset(t, i);
        v[i] = t->dtype == LPX_I32 ? (int64_t)((const int32_t *)base)[off] : ((const int64_t *)base)[off];
    }
    *out = v;
    return LPX_OK;
}

/* 1-D view of `len` elements of t, `stride` apart, starting `off`
 * elements after t's first element. */
static void line_view(cpu_view *v, const lpx_tensor *t, int64_t off, int64_t len, int64_t stride)
{
    v->ndim = 1;
    v->dtype = t->dtype;
    v->elem_size = lpx_dtype_get(t->dtype)->bits / 8;
    v->base = (char *)lpx_tensor_data(t) + off * v->elem_size;
    v->shape[0] = len;
    v->strides[0] = stride;
    v->numel = len;
    v->contiguous = stride == 1 || len <= 1;
}

/* Offset of line q of t along `dim`: lines enumerate every index of the
 * other dims in row-major order. */
static int64_t line_offset(const lpx_tensor *t, int dim, int64_t q)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0 && q; d--) {
        if (d == dim) continue;
        off += (q % t->shape[d]) * t->strides[d];
        q /= t->shape[d];
    }
    return off;
}

static float *alloc_f32(const lpx_call *c, int64_t n)
{
    float *p = lpx_malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) lpx_error(LPX_ENOMEM, "%s: cannot allocate %lld floats", cpu_op_name(c), (long long)n);
    return p;
}

/* Stores one f32 value into a fresh scalar tensor of dtype. */
static lpx_status new_scalar(lpx_call *c, lpx_dtype dtype, double value)
{
    lpx_tensor *t;
    lpx_status st = cpu_new(c, dtype, 0, NULL, &t);
    if (st) return st;
    cpu_view v;
    cpu_view_of(&v, t);
    float f = (float)value;
    cpu_store_f32(&v, 0, 1, &f, 0);
    cpu_ret(c, t);
    return LPX_OK;
}

/* ---- rmsnorm ------------------------------------------------------------ */

/* Loads weight [D] (optional) as f32 (all ones if absent). */
static lpx_status load_weight(const lpx_call *c, const lpx_tensor *w, int64_t D, float **out)
{
    *out = NULL;
    float *wb = alloc_f32(c, D);
    if (!wb) return LPX_ENOMEM;
    if (w) {
        cpu_view v;
        cpu_view_of(&v, w);
        cpu_load_f32(&v, 0, D, wb);
    } else {
        for (int64_t i = 0; i < D; i++) wb[i] = 1.0f;
    }
    *out = wb;
    return LPX_OK;
}

static lpx_status k_rmsnorm(lpx_call *c)
{
    const lpx_rmsnorm_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x, *w = a->weight;
    double eps = a->eps;
    int64_t D = a->dim, R = a->rows;
    lpx_status st;
    float *wb, *row = NULL;
    if ((st = load_weight(c, w, D, &wb))) return st;
    lpx_tensor *y = NULL, *rstd = NULL;
    int64_t rshape[LPX_MAX_DIMS];
    memcpy(rshape, x->shape, (size_t)x->ndim * sizeof *rshape);
    rshape[x->ndim - 1] = 1;
    if ((st = cpu_new(c, x->dtype, x->ndim, x->shape, &y)) || (st = cpu_new(c, LPX_F32, x->ndim, rshape, &rstd)) ||
        !(row = alloc_f32(c, D))) {
        if (!st) st = LPX_ENOMEM;
        goto fail;
    }
    cpu_view xv, yv;
    cpu_view_of(&xv, x);
    cpu_view_of(&yv, y);
    float *rs = lpx_tensor_data(rstd);
    for (int64_t r = 0; r < R; r++) {
        cpu_load_f32(&xv, r * D, D, row);
        double ss = 0;
        for (int64_t i = 0; i < D; i++) ss += (double)row[i] * row[i];
        float rv = (float)(1.0 / sqrt((D ? ss / (double)D : 0.0) + eps));
        rs[r] = rv;
        for (int64_t i = 0; i < D; i++) row[i] = row[i] * rv * wb[i];
        cpu_store_f32(&yv, r * D, D, row, 0);
    }
    lpx_free(wb);
    lpx_free(row);
    cpu_ret(c, y);
    cpu_ret(c, rstd);
    return LPX_OK;
fail:
    lpx_free(wb);
    lpx_free(row);
    lpx_tensor_release(y);
    lpx_tensor_release(rstd);
    return st;
}

/* y = x * r * w with r = (mean(x^2) + eps)^-1/2 per row:
 *   dx_i = r * g_i w_i - x_i * r^3 / D * sum_j g_j w_j x_j
 *   dw_i = sum over rows of g_i * x_i * r */
static lpx_status k_rmsnorm_backward(lpx_call *c)
{
    const lpx_rmsnorm_backward_args *a = lpx_op_args_of(c);
    lpx_tensor *g = a->grad, *x = a->x, *w = a->weight, *rstd = a->rstd;
    int64_t D = a->dim, R = a->rows;
    lpx_status st;
    float *wb, *xr = NULL, *gr = NULL, *rv = NULL;
    double *dw = NULL;
    lpx_tensor *gx = NULL, *gw = NULL;
    if ((st = load_weight(c, w, D, &wb))) return st;
    int64_t dshape[1] = {D};
    if ((st = cpu_new(c, x->dtype, x->ndim, x->shape, &gx)) || (st = cpu_new(c, a->grad_w_dtype, 1, dshape, &gw)))
        goto done;
    xr = alloc_f32(c, D);
    gr = alloc_f32(c, D);
    rv = alloc_f32(c, R);
    dw = lpx_calloc((size_t)(D ? D : 1), sizeof *dw);
    if (!xr || !gr || !rv || !dw) {
        st = dw ? LPX_ENOMEM : lpx_error(LPX_ENOMEM, "rmsnorm_backward: cannot allocate %lld accumulators", (long long)D);
        goto done;
    }
    cpu_view xv, gv, rsv, gxv;
    cpu_view_of(&xv, x);
    cpu_view_of(&gv, g);
    cpu_view_of(&rsv, rstd);
    cpu_view_of(&gxv, gx);
    cpu_load_f32(&rsv, 0, R, rv);
    for (int64_t r = 0; r < R; r++) {
        cpu_load_f32(&xv, r * D, D, xr);
        cpu_load_f32(&gv, r * D, D, gr);
        double rr = rv[r], dot = 0;
        for (int64_t i = 0; i < D; i++) {
            dot += (double)gr[i] * wb[i] * xr[i];
            dw[i] += (double)gr[i] * xr[i] * rr;
        }
        double k = D ? rr * rr * rr * dot / (double)D : 0.0;
        for (int64_t i = 0; i < D; i++) gr[i] = (float)(rr * gr[i] * wb[i] - xr[i] * k);
        cpu_store_f32(&gxv, r * D, D, gr, 0);
    }
    for (int64_t i = 0; i < D; i++) xr[i] = (float)dw[i];
    cpu_view gwv;
    cpu_view_of(&gwv, gw);
    cpu_store_f32(&gwv, 0, D, xr, 0);
    cpu_ret(c, gx);
    cpu_ret(c, gw);
    gx = gw = NULL;
done:
    lpx_free(wb);
    lpx_free(xr);
    lpx_free(gr);
    lpx_free(rv);
    lpx_free(dw);
    lpx_tensor_release(gx);
    lpx_tensor_release(gw);
    return st;
}

/* ---- softmax ------------------------------------------------------------ */

static int64_t stride_along(const lpx_tensor *t, int dim) { return t->ndim ? t->strides[dim] : 1; }

/* The contract (x floating-point, the dim and its lines) is the
 * dispatcher's (spec family `softmax`, op_args.h). */
static lpx_status k_softmax(lpx_call *c)
{
    const lpx_softmax_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x;
    int dim = a->dim;
    int64_t L = a->len, count = a->count;
    lpx_status st;
    lpx_tensor *y;
    if ((st = cpu_new(c, x->dtype, x->ndim, x->shape, &y))) return st;
    float *buf = alloc_f32(c, L);
    if (!buf) {
        lpx_tensor_release(y);
        return LPX_ENOMEM;
    }
    for (int64_t q = 0; q < count; q++) {
        cpu_view xv, yv;
        line_view(&xv, x, line_offset(x, dim, q), L, stride_along(x, dim));
        line_view(&yv, y, line_offset(y, dim, q), L, stride_along(y, dim));
        cpu_load_f32(&xv, 0, L, buf);
        float m = -INFINITY;
        for (int64_t i = 0; i < L; i++) m = buf[i] > m ? buf[i] : m;
        double s = 0;
        for (int64_t i = 0; i < L; i++) {
            buf[i] = expf(buf[i] - m);
            s += buf[i];
        }
        float inv = (float)(1.0 / s);
        for (int64_t i = 0; i < L; i++) buf[i] *= inv;
        cpu_store_f32(&yv, 0, L, buf, 0);
    }
    lpx_free(buf);
    cpu_ret(c, y);
    return LPX_OK;
}

/* dx_i = y_i * (g_i - sum_j g_j y_j) along dim (contract: spec family
 * `softmax_backward`) */
static lpx_status k_softmax_backward(lpx_call *c)
{
    const lpx_softmax_backward_args *a = lpx_op_args_of(c);
    lpx_tensor *g = a->grad, *y = a->y;
    int dim = a->dim;
    int64_t L = a->len, count = a->count;
    lpx_status st;
    lpx_tensor *gx;
    if ((st = cpu_new(c, g->dtype, g->ndim, g->shape, &gx))) return st;
    float *gb = alloc_f32(c, L), *yb = alloc_f32(c, L);
    if (!gb || !yb) {
        lpx_free(gb);
        lpx_free(yb);
        lpx_tensor_release(gx);
        return LPX_ENOMEM;
    }
    for (int64_t q = 0; q < count; q++) {
        cpu_view gv, yv, ov;
        line_view(&gv, g, line_offset(g, dim, q), L, stride_along(g, dim));
        line_view(&yv, y, line_offset(y, dim, q), L, stride_along(y, dim));
        line_view(&ov, gx, line_offset(gx, dim, q), L, stride_along(gx, dim));
        cpu_load_f32(&gv, 0, L, gb);
        cpu_load_f32(&yv, 0, L, yb);
        double dot = 0;
        for (int64_t i = 0; i < L; i++) dot += (double)gb[i] * yb[i];
        for (int64_t i = 0; i < L; i++) gb[i] = (float)(yb[i] * (gb[i] - dot));
        cpu_store_f32(&ov, 0, L, gb, 0);
    }
    lpx_free(gb);
    lpx_free(yb);
    cpu_ret(c, gx);
    return LPX_OK;
}

/* ---- cross-entropy ------------------------------------------------------ */

/* Loads the targets of logits [N, C] and counts the ones not ignored.
 * Every other target must lie in [0, C): a check of data, so the
 * kernel's (the shapes and dtypes are the dispatcher's). */
static lpx_status ce_prepare(const lpx_call *c, const lpx_cross_entropy_args *a, int64_t **tv, int64_t *count)
{
    const char *op = cpu_op_name(c);
    const lpx_tensor *target = a->target;
    int64_t ignore = a->ignore_index;
    lpx_status st;
    if ((st = load_indices(c, target, tv))) return st;
    int64_t C = a->classes, n = 0;
    for (int64_t i = 0; i < target->numel; i++) {
        int64_t t = (*tv)[i];
        if (t == ignore) continue;
        if (t < 0 || t >= C) {
            lpx_free(*tv);
            *tv = NULL;
            return lpx_error(LPX_ERANGE, "%s: target[%lld] = %lld is out of range [0, %lld) (ignore_index %lld)", op,
                             (long long)i, (long long)t, (long long)C, (long long)ignore);
        }
        n++;
    }
    *count = n;
    return LPX_OK;
}

/* Softmax pieces of one row: replaces row[i] by e_i = exp(row[i] - max)
 * (f32; the max subtraction keeps every e_i in (0, 1]) and returns
 * sum(e_i) in double; *shifted gets row[target] - max first, when asked. */
static double row_exp(float *row, int64_t C, int64_t target, double *shifted)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < C; i++) m = row[i] > m ? row[i] : m;
    if (shifted) *shifted = (double)row[target] - m;
    double s = 0;
    for (int64_t i = 0; i < C; i++) {
        row[i] = expf(row[i] - m);
        s += row[i];
    }
    return s;
}

static lpx_status k_cross_entropy(lpx_call *c)
{
    const lpx_cross_entropy_args *a = lpx_op_args_of(c);
    lpx_tensor *logits = a->logits;
    int64_t ignore = a->ignore_index, count;
    int64_t *tv;
    lpx_status st = ce_prepare(c, a, &tv, &count);
    if (st) return st;
    int64_t N = a->n, C = a->classes;
    float *row = alloc_f32(c, C);
    if (!row) {
        lpx_free(tv);
        return LPX_ENOMEM;
    }
    cpu_view lv;
    cpu_view_of(&lv, logits);
    double total = 0;
    for (int64_t n = 0; n < N; n++) {
        if (tv[n] == ignore) continue;
        cpu_load_f32(&lv, n * C, C, row);
        double shifted, s = row_exp(row, C, tv[n], &shifted);
        total += log(s) - shifted;   /* -log softmax[target], log-sum-exp form */
    }
    lpx_free(row);
    lpx_free(tv);
    return new_scalar(c, a->dtype, count ? total / (double)count : 0.0);
}

/* d(grad * loss)/d logits = grad / count * (softmax(row) - onehot(target)) */
static lpx_status k_cross_entropy_backward(lpx_call *c)
{
    const lpx_cross_entropy_args *a = lpx_op_args_of(c);
    lpx_tensor *logits = a->logits;
    int64_t ignore = a->ignore_index, count;
    double grad = a->grad;
    int64_t *tv;
    lpx_status st = ce_prepare(c, a, &tv, &count);
    if (st) return st;
    int64_t N = a->n, C = a->classes;
    lpx_tensor *gl;
    float *row = NULL;
    if ((st = cpu_new(c, a->dtype, 2, logits->shape, &gl))) {
        lpx_free(tv);
        return st;
    }
    if (!(row = alloc_f32(c, C))) {
        lpx_free(tv);
        lpx_tensor_release(gl);
        return LPX_ENOMEM;
    }
    cpu_view lv, gv;
    cpu_view_of(&lv, logits);
    cpu_view_of(&gv, gl);
    double scale = count ? grad / (double)count : 0.0;
    for (int64_t n = 0; n < N; n++) {
        if (tv[n] == ignore) {
            memset(row, 0, (size_t)C * sizeof *row);
        } else {
            cpu_load_f32(&lv, n * C, C, row);
            float k = (float)(scale / row_exp(row, C, tv[n], NULL));
            for (int64_t i = 0; i < C; i++) row[i] *= k;   /* scale * softmax */
            row[tv[n]] -= (float)scale;
        }
        cpu_store_f32(&gv, n * C, C, row, 0);
    }
    lpx_free(row);
    lpx_free(tv);
    cpu_ret(c, gl);
    return LPX_OK;
}

/* ---- MSE loss ----------------------------------------------------------- */

static lpx_status k_mse_loss(lpx_call *c)
{
    const lpx_mse_loss_args *m = lpx_op_args_of(c);
    lpx_tensor *a = m->a, *b = m->b;
    cpu_view av, bv;
    cpu_view_of(&av, a);
    cpu_view_of(&bv, b);
    float ab[CPU_CHUNK], bb[CPU_CHUNK];
    double s = 0;
    for (int64_t p = 0; p < av.numel; p += CPU_CHUNK) {
        int64_t n = av.numel - p < CPU_CHUNK ? av.numel - p : CPU_CHUNK;
        cpu_load_f32(&av, p, n, ab);
        cpu_load_f32(&bv, p, n, bb);
        for (int64_t i = 0; i < n; i++) {
            double d = (double)ab[i] - bb[i];
            s += d * d;
        }
    }
    /* the mean of no elements is NaN, as in PyTorch */
    return new_scalar(c, a->dtype, s / (double)av.numel);
}

/* d(grad * mean((a-b)^2))/da = 2 * grad * (a - b) / n */
static lpx_status k_mse_loss_backward(lpx_call *c)
{
    const lpx_mse_loss_args *m = lpx_op_args_of(c);
    lpx_tensor *a = m->a, *b = m->b;
    double grad = m->grad;
    lpx_status st;
    lpx_tensor *ga;
    if ((st = cpu_new(c, a->dtype, a->ndim, a->shape, &ga))) return st;
    cpu_view av, bv, gv;
    cpu_view_of(&av, a);
    cpu_view_of(&bv, b);
    cpu_view_of(&gv, ga);
    double k = av.numel ? 2.0 * grad / (double)av.numel : 0.0;
    float ab[CPU_CHUNK], bb[CPU_CHUNK];
    for (int64_t p = 0; p < av.numel; p += CPU_CHUNK) {
        int64_t n = av.numel - p < CPU_CHUNK ? av.numel - p : CPU_CHUNK;
        cpu_load_f32(&av, p, n, ab);
        cpu_load_f32(&bv, p, n, bb);
        for (int64_t i = 0; i < n; i++) ab[i] = (float)(k * ((double)ab[i] - bb[i]));
        cpu_store_f32(&gv, p, n, ab, 0);
    }
    cpu_ret(c, ga);
    return LPX_OK;
}

/* ---- embedding ---------------------------------------------------------- */

/* Fails with LPX_ERANGE naming the first index outside [0, limit): a
 * check of data, so the kernel's. */
static lpx_status check_index_range(const lpx_call *c, const lpx_tensor *idx, const int64_t *iv, int64_t limit)
{
    for (int64_t i = 0; i < idx->numel; i++) {
        if (iv[i] >= 0 && iv[i] < limit) continue;
        char pos[160];
        return lpx_error(LPX_ERANGE, "%s: indices%s = %lld is out of range [0, %lld)", cpu_op_name(c),
                         index_str(idx->ndim, idx->shape, i, pos, sizeof pos), (long long)iv[i], (long long)limit);
    }
    return LPX_OK;
}

/* Output rows are copied byte for byte in the weight's dtype: no rounding
 * and any dense dtype works. */
static lpx_status k_embedding(lpx_call *c)
{
    const lpx_embedding_args *a = lpx_op_args_of(c);
    lpx_tensor *w = a->weight, *idx = a->indices;
    lpx_status st;
    int64_t *iv;
    if ((st = load_indices(c, idx, &iv))) return st;
    int64_t V = a->num, D = a->dim;
    if ((st = check_index_range(c, idx, iv, V))) {
        lpx_free(iv);
        return st;
    }
    lpx_tensor *out;
    if ((st = cpu_new(c, w->dtype, a->out_ndim, a->out_shape, &out))) {
        lpx_free(iv);
        return st;
    }
    size_t es = (size_t)(lpx_dtype_get(w->dtype)->bits / 8);
    const char *wd = lpx_tensor_data(w);
    char *od = lpx_tensor_data(out);
    for (int64_t i = 0; D > 0 && i < idx->numel; i++) {
        const char *src = wd + (size_t)(iv[i] * w->strides[0]) * es;
        char *dst = od + (size_t)(i * D) * es;
        if (w->strides[1] == 1 || D <= 1)
            memcpy(dst, src, (size_t)D * es);
        else
            for (int64_t j = 0; j < D; j++) memcpy(dst + (size_t)j * es, src + (size_t)(j * w->strides[1]) * es, es);
    }
    lpx_free(iv);
    cpu_ret(c, out);
    return LPX_OK;
}

/* Scatter-add of grad rows into [num_weights, D], accumulated in f32. */
static lpx_status k_embedding_backward(lpx_call *c)
{
    const lpx_embedding_backward_args *a = lpx_op_args_of(c);
    lpx_tensor *g = a->grad, *idx = a->indices;
    int64_t V = a->num_weights, D = a->dim;
    lpx_status st;
    int64_t *iv;
    if ((st = load_indices(c, idx, &iv))) return st;
    if ((st = check_index_range(c, idx, iv, V))) {
        lpx_free(iv);
        return st;
    }
    int64_t oshape[2] = {V, D};
    lpx_tensor *out;
    if ((st = cpu_new(c, g->dtype, 2, oshape, &out))) {
        lpx_free(iv);
        return st;
    }
    if (V * D == 0 || idx->numel == 0) {
        /* nothing to scatter: the zero-filled (or empty) result */
        cpu_view ov;
        cpu_view_of(&ov, out);
        float z[CPU_CHUNK] = {0};
        for (int64_t p = 0; p < V * D; p += CPU_CHUNK)
            cpu_store_f32(&ov, p, V * D - p < CPU_CHUNK ? V * D - p : CPU_CHUNK, z, 0);
        lpx_free(iv);
        cpu_ret(c, out);
        return LPX_OK;
    }
    /* an f32 result is its own accumulator */
    bool direct = g->dtype == LPX_F32;
    float *acc = direct ? lpx_tensor_data(out) : lpx_calloc((size_t)(V * D), sizeof(float));
    float *row = alloc_f32(c, D);
    if (!acc || !row) {
        if (!direct) lpx_free(acc);
        lpx_free(row);
        lpx_free(iv);
        lpx_tensor_release(out);
        return lpx_error(LPX_ENOMEM, "embedding_backward: cannot allocate the [%lld, %lld] accumulator",
                         (long long)V, (long long)D);
    }
    if (direct) memset(acc, 0, (size_t)(V * D) * sizeof *acc);
    cpu_view gv;
    cpu_view_of(&gv, g);
    for (int64_t i = 0; i < idx->numel; i++) {
        cpu_load_f32(&gv, i * D, D, row);
        float *dst = acc + iv[i] * D;
        for (int64_t j = 0; j < D; j++) dst[j] += row[j];
    }
    if (!direct) {
        cpu_view ov;
        cpu_view_of(&ov, out);
        cpu_store_f32(&ov, 0, V * D, acc, 0);
        lpx_free(acc);
    }
    lpx_free(row);
    lpx_free(iv);
    cpu_ret(c, out);
    return LPX_OK;
}

lpx_status lpx_cpu_register_nn(void)
{
#define R(op) {LPX_OP_##op, k_##op}
    static const struct { lpx_op op; lpx_kernel_fn fn; } ks[] = {
        R(rmsnorm), R(rmsnorm_backward), R(softmax), R(softmax_backward), R(cross_entropy),
        R(cross_entropy_backward), R(mse_loss), R(mse_loss_backward), R(embedding), R(embedding_backward),
    };
#undef R
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        lpx_status st = cpu_reg(ks[i].op, ks[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
