/* CPU reductions: sum, mean, max, amax (max |x|) and the L2 norm, over all
 * dims or any set of dims, with keepdim.
 *
 * One scheme serves every reduction: walk x in its logical row-major order
 * in chunks (cpu_load_f32, fast for contiguous inputs) and fold each element
 * into a double accumulator indexed by its output position. Rows along the
 * last dim are handled as runs: when the last dim is reduced a whole run
 * folds into one accumulator (a tight loop), otherwise the run maps onto
 * consecutive accumulators. So reducing over leading dims never gathers
 * with a large stride, and no transposed copy of x is made.
 *
 * Results are stored in x's dtype (integer results go through f32, so i32 /
 * i64 sums beyond 2^24 are rounded). Reductions of zero elements: sum 0,
 * mean NaN, norm 0; max and amax refuse them (LPX_ESHAPE), as there is no
 * identity to return. */
#include <math.h>
#include <string.h>
#include "cpu_internal.h"

#define RED_CODE(op, N) RED_##N,
typedef enum red_kind { LPX_REDUCE_OPS(RED_CODE) } red_kind;   /* op_args_elementwise.h */

/* The reduction's geometry comes checked from the dispatcher (spec family
 * `reduce`, op_args_elementwise.h): the dims folded, the output's shape,
 * and out_stride[d], where a step along x's dim d moves the accumulator
 * index (0 for a folded dim). */
typedef lpx_reduce_args red_plan;

/* Accumulator index of the first element of row `row` (rows = runs along
 * the last dim, counted in logical order). */
static int64_t row_acc_base(const lpx_tensor *x, const red_plan *p, int64_t row)
{
    int64_t off = 0;
    for (int d = x->ndim - 2; d >= 0 && row; d--) {
        off += (row % x->shape[d]) * p->out_stride[d];
        row /= x->shape[d];
    }
    return off;
}

/* max that lets NaN win: once acc is NaN it stays NaN */
static inline double fold_max(double acc, double v) { return (v > acc || v != v) ? v : acc; }

/* Folds a run of n values into one accumulator. */
static double fold_run(red_kind k, double acc, const float *v, int64_t n)
{
    switch (k) {
    case RED_SUM:
    case RED_MEAN: {
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += v[i];
        return acc + s;
    }
    case RED_NORM: {
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += (double)v[i] * v[i];
        return acc + s;
    }
    case RED_MAX:
        for (int64_t i = 0; i < n; i++) acc = fold_max(acc, v[i]);
        return acc;
    case RED_AMAX:
        for (int64_t i = 0; i < n; i++) acc = fold_max(acc, fabs((double)v[i]));
        return acc;
    }
    return acc;
}

/* Folds v[i] into acc[i] for i < n. */
static void fold_each(red_kind k, double *acc, const float *v, int64_t n)
{
    switch (k) {
    case RED_SUM:
    case RED_MEAN:
        for (int64_t i = 0; i < n; i++) acc[i] += v[i];
        break;
    case RED_NORM:
        for (int64_t i = 0; i < n; i++) acc[i] += (double)v[i] * v[i];
        break;
    case RED_MAX:
        for (int64_t i = 0; i < n; i++) acc[i] = fold_max(acc[i], v[i]);
        break;
    case RED_AMAX:
        for (int64_t i = 0; i < n; i++) acc[i] = fold_max(acc[i], fabs((double)v[i]));
        break;
    }
}

static void accumulate(red_kind k, const lpx_tensor *x, const red_plan *p, double *acc)
{
    cpu_view v;
    cpu_view_of(&v, x);
    int64_t len = x->ndim ? x->shape[x->ndim - 1] : 1;
    bool last_reduced = x->ndim ? p->g.reduced[x->ndim - 1] : true;
    float buf[CPU_CHUNK];
    for (int64_t pos = 0; pos < v.numel;) {
        int64_t n = v.numel - pos < CPU_CHUNK ? v.numel - pos : CPU_CHUNK;
        cpu_load_f32(&v, pos, n, buf);
        for (int64_t k0 = 0; k0 < n;) {
            int64_t g = pos + k0, row = g / len, col = g % len;
            int64_t seg = len - col < n - k0 ? len - col : n - k0;
            int64_t base = row_acc_base(x, p, row);
            if (last_reduced)
                acc[base] = fold_run(k, acc[base], buf + k0, seg);
            else
                fold_each(k, acc + base + col, buf + k0, seg);
            k0 += seg;
        }
        pos += n;
    }
}

static lpx_status reduce_kernel(lpx_call *c, red_kind k)
{
    const char *op = cpu_op_name(c);
    const red_plan *p = lpx_op_args_of(c);
    lpx_tensor *x = p->x;
    lpx_status st;
    lpx_tensor *out;
    if ((st = cpu_new(c, x->dtype, p->g.out_ndim, p->g.out_shape, &out))) return st;
    if (p->g.out_numel == 0) {
        cpu_ret(c, out);
        return LPX_OK;
    }
    double *acc = lpx_malloc((size_t)p->g.out_numel * sizeof *acc);
    float *res = lpx_malloc((size_t)p->g.out_numel * sizeof *res);
    if (!acc || !res) {
        lpx_free(acc);
        lpx_free(res);
        lpx_tensor_release(out);
        return lpx_error(LPX_ENOMEM, "%s: cannot allocate %lld accumulators", op, (long long)p->g.out_numel);
    }
    double init = k == RED_MAX ? -INFINITY : 0.0;
    for (int64_t i = 0; i < p->g.out_numel; i++) acc[i] = init;
    if (x->numel) accumulate(k, x, p, acc);
    for (int64_t i = 0; i < p->g.out_numel; i++) {
        double r = acc[i];
        if (k == RED_MEAN) r = r / (double)p->g.count;  /* 0/0 = NaN for an empty mean */
        else if (k == RED_NORM) r = sqrt(r);
        res[i] = (float)r;
    }
    cpu_view ov;
    cpu_view_of(&ov, out);
    cpu_store_f32(&ov, 0, p->g.out_numel, res, 0);
    lpx_free(acc);
    lpx_free(res);
    cpu_ret(c, out);
    return LPX_OK;
}

#define K_REDUCE(op, N) static lpx_status k_##op(lpx_call *c) { return reduce_kernel(c, RED_##N); }
LPX_REDUCE_OPS(K_REDUCE)

lpx_status lpx_cpu_register_reduce(void)
{
    lpx_status st;
#define REG(op, N) if ((st = cpu_reg(LPX_OP_##op, k_##op))) return st;
    LPX_REDUCE_OPS(REG)
#undef REG
    return LPX_OK;
}
