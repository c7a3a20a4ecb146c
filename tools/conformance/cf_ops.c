/* The op contract: each op a kind declares (has a kernel for at its key)
 * and the kit has a recipe for runs on a tensor of the kind and, as the
 * reference, on its dequantized dense value; results (dequantized when
 * they are kind tensors) must agree within the kind's declared tolerance.
 * A kernel answering LPX_ENOTIMPL declines the recipe's argument mix; GEMM
 * recipes then retry with the other operand quantized into the kind too
 * (a scaled GEMM wants both), and only then is the case skipped. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cf_util.h"

/* Runs the op with `q` (the kind tensor) or `dq` (its dense value) in
 * q's place; `aux` are dense helpers made by the recipe's setup. */
typedef lpx_status (*cf_op_fn)(lpx_tensor *t, lpx_tensor *const *aux, lpx_tensor **out);

typedef struct cf_recipe {
    lpx_op op;
    int need_ndim;            /* 0: any, else exact */
    int naux;                 /* dense helpers: 0..2 */
    cf_op_fn fn;
} cf_recipe;

/* aux kinds, built from the declared shape [R, C, ...] */
enum { AUX_LHS_IN, AUX_LHS_ROWS, AUX_BIAS_ROWS, AUX_OUT_COLS, AUX_SAME, AUX_SAME_POS, AUX_IDX };

static lpx_status r_linear(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_linear(a[0], t, a[1], o); }
static lpx_status r_matmul(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_matmul(a[0], t, o); }
/* the kind tensor's shard unit, also used for its dense reference */
static int64_t recipe_unit = 1;

static lpx_status r_narrow(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o)
{
    (void)a;
    int64_t u = recipe_unit, rows = lpx_tensor_shape(t)[0];
    return rows >= 2 * u ? lpx_narrow(t, 0, u, u, o) : lpx_narrow(t, 0, 0, rows, o);
}
static lpx_status r_detach(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_detach(t, o); }
static lpx_status r_clone(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_clone(t, o); }
static lpx_status r_contig(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_contiguous(t, o); }
static lpx_status r_t(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_t(t, o); }
static lpx_status r_cast(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_cast(t, LPX_F32, false, o); }
static lpx_status r_neg(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_neg(t, o); }
static lpx_status r_abs(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_abs(t, o); }
static lpx_status r_relu(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_relu(t, o); }
static lpx_status r_exp(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_exp(t, o); }
static lpx_status r_silu(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_silu(t, o); }
static lpx_status r_gelu(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_gelu(t, o); }
/* sqrt of |t|: normal test data is half negative, and NaN == NaN would
 * check nothing */
static lpx_status r_sqrt(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o)
{
    (void)a;
    lpx_tensor *m = NULL;
    lpx_status st = lpx_abs(t, &m);
    if (!st) st = lpx_sqrt(m, o);
    lpx_tensor_release(m);
    return st;
}
static lpx_status r_add(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_add(t, a[0], o); }
static lpx_status r_sub(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_sub(t, a[0], o); }
static lpx_status r_mul(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_mul(t, a[0], o); }
static lpx_status r_div(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_div(t, a[0], o); }
static lpx_status r_adds(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_add_scalar(t, 1.5, o); }
static lpx_status r_muls(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_mul_scalar(t, -0.75, o); }
static lpx_status r_sum(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_sum(t, 0, NULL, false, o); }
static lpx_status r_mean(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_mean(t, 0, NULL, false, o); }
static lpx_status r_amax(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_amax(t, 0, NULL, false, o); }
static lpx_status r_max(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_max(t, 0, NULL, false, o); }
static lpx_status r_norm(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_norm(t, 0, NULL, false, o); }
static lpx_status r_reshape(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o)
{
    (void)a;
    int64_t n = -1;
    return lpx_reshape(t, 1, &n, o);
}
static lpx_status r_view(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o)
{
    (void)a;
    int64_t n = -1;
    return lpx_view(t, 1, &n, o);
}
static lpx_status r_transpose(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { (void)a; return lpx_transpose(t, 0, 1, o); }
static lpx_status r_slice(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o)
{
    (void)a;
    return lpx_slice(t, 0, recipe_unit, lpx_tensor_shape(t)[0], 1, o);
}
static lpx_status r_addmm(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_addmm(a[0], a[1], t, 0.5, 2.0, o); }
static lpx_status r_embedding(lpx_tensor *t, lpx_tensor *const *a, lpx_tensor **o) { return lpx_embedding(t, a[0], o); }

/* aux specs per recipe: which helpers to build (AUX_*), -1 = none */
typedef struct cf_recipe_def {
    cf_recipe r;
    int aux[2];
    int kind_aux;   /* helper to quantize into the kind when the kernel declines a dense one; -1: none */
} cf_recipe_def;

static const cf_recipe_def recipes[] = {
    {{LPX_OP_linear, 2, 2, r_linear}, {AUX_LHS_IN, AUX_BIAS_ROWS}, 0},
    {{LPX_OP_matmul, 2, 1, r_matmul}, {AUX_LHS_ROWS, -1}, 0},
    {{LPX_OP_addmm, 2, 2, r_addmm}, {AUX_OUT_COLS, AUX_LHS_ROWS}, 1},
    {{LPX_OP_narrow, 0, 0, r_narrow}, {-1, -1}, -1},
    {{LPX_OP_slice, 0, 0, r_slice}, {-1, -1}, -1},
    {{LPX_OP_detach, 0, 0, r_detach}, {-1, -1}, -1},
    {{LPX_OP_clone, 0, 0, r_clone}, {-1, -1}, -1},
    {{LPX_OP_contiguous, 0, 0, r_contig}, {-1, -1}, -1},
    {{LPX_OP_t, 2, 0, r_t}, {-1, -1}, -1},
    {{LPX_OP_transpose, 2, 0, r_transpose}, {-1, -1}, -1},
    {{LPX_OP_view, 0, 0, r_view}, {-1, -1}, -1},
    {{LPX_OP_reshape, 0, 0, r_reshape}, {-1, -1}, -1},
    {{LPX_OP_cast, 0, 0, r_cast}, {-1, -1}, -1},
    {{LPX_OP_neg, 0, 0, r_neg}, {-1, -1}, -1},
    {{LPX_OP_abs, 0, 0, r_abs}, {-1, -1}, -1},
    {{LPX_OP_relu, 0, 0, r_relu}, {-1, -1}, -1},
    {{LPX_OP_exp, 0, 0, r_exp}, {-1, -1}, -1},
    {{LPX_OP_silu, 0, 0, r_silu}, {-1, -1}, -1},
    {{LPX_OP_gelu, 0, 0, r_gelu}, {-1, -1}, -1},
    {{LPX_OP_sqrt, 0, 0, r_sqrt}, {-1, -1}, -1},
    {{LPX_OP_add, 0, 1, r_add}, {AUX_SAME, -1}, -1},
    {{LPX_OP_sub, 0, 1, r_sub}, {AUX_SAME, -1}, -1},
    {{LPX_OP_mul, 0, 1, r_mul}, {AUX_SAME, -1}, -1},
    {{LPX_OP_div, 0, 1, r_div}, {AUX_SAME_POS, -1}, -1},
    {{LPX_OP_add_scalar, 0, 0, r_adds}, {-1, -1}, -1},
    {{LPX_OP_mul_scalar, 0, 0, r_muls}, {-1, -1}, -1},
    {{LPX_OP_sum, 0, 0, r_sum}, {-1, -1}, -1},
    {{LPX_OP_mean, 0, 0, r_mean}, {-1, -1}, -1},
    {{LPX_OP_amax, 0, 0, r_amax}, {-1, -1}, -1},
    {{LPX_OP_max, 0, 0, r_max}, {-1, -1}, -1},
    {{LPX_OP_norm, 0, 0, r_norm}, {-1, -1}, -1},
    {{LPX_OP_embedding, 2, 1, r_embedding}, {AUX_IDX, -1}, -1},
};

int cf_recipe_count(void) { return (int)(sizeof recipes / sizeof *recipes); }
lpx_op cf_recipe_op(int i) { return recipes[i].r.op; }
int cf_recipe_for(lpx_op op)
{
    for (int i = 0; i < cf_recipe_count(); i++)
        if (recipes[i].r.op == op) return i;
    return -1;
}

static lpx_status make_aux(int kind, const cf_params *p, lpx_tensor **out)
{
    int64_t r = p->shape[0], c = p->ndim > 1 ? p->shape[p->ndim - 1] : 1;
    int64_t s2[2] = {5, c}, s3[2] = {5, r}, s1[1] = {r}, s4[2] = {5, c};
    lpx_tensor *t = NULL;
    lpx_status st;
    switch (kind) {
    case AUX_LHS_IN: return lpx_randn(2, s2, 91, LPX_F32, lpx_cpu(), out);
    case AUX_LHS_ROWS: return lpx_randn(2, s3, 92, LPX_F32, lpx_cpu(), out);
    case AUX_BIAS_ROWS: return lpx_randn(1, s1, 93, LPX_F32, lpx_cpu(), out);
    case AUX_OUT_COLS: return lpx_randn(2, s4, 96, LPX_F32, lpx_cpu(), out);
    case AUX_SAME: return lpx_randn(p->ndim, p->shape, 94, LPX_F32, lpx_cpu(), out);
    case AUX_SAME_POS:
        st = lpx_rand(p->ndim, p->shape, 95, LPX_F32, lpx_cpu(), &t);
        if (!st) st = lpx_add_scalar(t, 0.5, out);
        lpx_tensor_release(t);
        return st;
    case AUX_IDX: {
        int64_t n[1] = {4};
        st = lpx_tensor_new(LPX_I64, 1, n, lpx_cpu(), out);
        if (!st) {
            int64_t *v = lpx_tensor_data(*out);
            v[0] = 0; v[1] = r - 1; v[2] = r / 2; v[3] = 0;
        }
        return st;
    }
    default: return lpx_error(LPX_EINVAL, "conformance: unknown helper %d", kind);
    }
}

cf_outcome cf_run_op(const cf_case *c, char *d, size_t len)
{
    const cf_recipe_def *rd = &recipes[c->arg];
    cf_params p;
    cf_params_of(c->kind, &p);
    if (rd->r.need_ndim && p.ndim != rd->r.need_ndim)
        return cf_say(CF_SKIP, d, len, "the recipe needs a %d-D tensor; the kind declares %d-D", rd->r.need_ndim, p.ndim);
    lpx_tensor *x = NULL, *q = NULL, *dq = NULL, *got = NULL, *ref = NULL, *gd = NULL, *rdn = NULL;
    lpx_tensor *aux[2] = {NULL, NULL}, *ref_aux[2] = {NULL, NULL}, *dense_aux = NULL;
    char declined[512] = "";
    cf_outcome o = CF_PASS;
    lpx_status st = cf_data(&p, CF_DIST_NORMAL, 20, &x);
    if (!st) st = cf_from_dense(c->kind, x, &q);
    if (!st) st = cf_dense(q, &dq);
    for (int i = 0; !st && i < rd->r.naux; i++) st = make_aux(rd->aux[i], &p, &aux[i]);
    if (st) { o = cf_lpx_fail(d, len, "setting up the recipe", st); goto done; }
    recipe_unit = cf_shard_unit(q);
    st = rd->r.fn(q, aux, &got);
    ref_aux[0] = aux[0];
    ref_aux[1] = aux[1];
    if (st == LPX_ENOTIMPL && rd->kind_aux >= 0) {
        /* the kernel wants the other operand in the kind too: quantize it,
         * and give the reference its dequantized value */
        snprintf(declined, sizeof declined, "%s", lpx_last_error());
        lpx_tensor *qa = NULL;
        lpx_status qs = cf_from_dense(c->kind, aux[rd->kind_aux], &qa);
        if (!qs) qs = cf_dense(qa, &dense_aux);
        if (qs) {
            lpx_tensor_release(qa);
            o = cf_say(CF_SKIP, d, len, "the kernel declines a dense operand (%s) and the operand cannot be "
                       "quantized: %s", declined, lpx_last_error());
            goto done;
        }
        lpx_tensor_release(aux[rd->kind_aux]);
        aux[rd->kind_aux] = qa;
        ref_aux[rd->kind_aux] = dense_aux;
        st = rd->r.fn(q, aux, &got);
    }
    if (st == LPX_ENOTIMPL) {
        o = cf_say(CF_SKIP, d, len, "the kernel declines this argument mix: %s", lpx_last_error());
        goto done;
    }
    if (st) { o = cf_lpx_fail(d, len, lpx_op_name(rd->r.op), st); goto done; }
    st = rd->r.fn(dq, ref_aux, &ref);
    if (st) { o = cf_lpx_fail(d, len, "the dense reference", st); goto done; }
    if ((st = cf_dense(got, &gd)) || (st = cf_dense(ref, &rdn))) { o = cf_lpx_fail(d, len, "dequantizing results", st); goto done; }
    char sa[128], sb[128];
    if (!cf_same_shape(gd, rdn, sa, sb, sizeof sa)) {
        o = cf_say(CF_FAIL, d, len, "result shape %s, the dense op gives %s", sa, sb);
        goto done;
    }
    double rmax = 0, err = cf_max_diff(gd, rdn, &rmax), tol = p.op_atol + p.op_rtol * rmax;
    o = err <= tol ? cf_say(CF_PASS, d, len, "max |diff| %.3g <= %.3g (result %s%s%s)", err, tol,
                            lpx_tensor_kind(got) ? lpx_kind_name(lpx_tensor_kind(got)) : "dense",
                            lpx_tensor_kind(got) ? " tensor" : "", declined[0] ? "; both operands of the kind" : "")
                   : cf_say(CF_FAIL, d, len, "max |diff| %.4g vs the dense op exceeds %.4g (atol %g + rtol %g x %g)",
                            err, tol, p.op_atol, p.op_rtol, rmax);
done:
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    lpx_tensor_release(dq);
    lpx_tensor_release(got);
    lpx_tensor_release(ref);
    lpx_tensor_release(gd);
    lpx_tensor_release(rdn);
    lpx_tensor_release(aux[0]);
    lpx_tensor_release(aux[1]);
    lpx_tensor_release(dense_aux);
    return o;
}
