/* Meta functions of the dense GEMM ops (matmul, linear, addmm;
 * include/lpx/meta.h): the shapes each accepts and the result's geometry,
 * written once for the CPU (BLAS) and CUDA (cuBLASLt) kernels. */
#include "../core/lpx_internal.h"
#include "lpx/meta.h"

static lpx_status need(const char *op, const char *arg, const lpx_tensor *t)
{
    return t ? LPX_OK : lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
}

lpx_status lpx_meta_matmul(const char *op, const lpx_tensor *a, const lpx_tensor *b, const lpx_tensor *out,
                           lpx_gemm_geom *g)
{
    lpx_status st;
    if ((st = need(op, "a", a)) || (st = need(op, "b", b))) return st;
    char sa[128], sb[128];
    lpx_tensor_shape_str(a, sa, sizeof sa);
    lpx_tensor_shape_str(b, sb, sizeof sb);
    if (a->ndim < 2 || b->ndim < 2 || b->ndim > 3 || (b->ndim == 3 && a->ndim > 3))
        return lpx_error(LPX_ESHAPE,
                         "%s: a %s and b %s: expected a [..., M, K] with b [K, N], or a [B, M, K] / [M, K] "
                         "with b [B, K, N]", op, sa, sb);
    int64_t K = a->shape[a->ndim - 1], Kb = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
    if (K != Kb)
        return lpx_error(LPX_ESHAPE, "%s: a %s and b %s: K mismatch (%lld vs %lld)", op, sa, sb, (long long)K,
                         (long long)Kb);
    g->K = K;
    g->N = N;
    if (b->ndim == 2) {
        /* a's leading dims fold into M: one GEMM */
        g->batch = g->a_batch = g->b_batch = 1;
        g->M = 1;
        for (int d = 0; d < a->ndim - 1; d++) g->M *= a->shape[d];
        g->out_ndim = a->ndim;
        for (int d = 0; d < a->ndim - 1; d++) g->out_shape[d] = a->shape[d];
        g->out_shape[a->ndim - 1] = N;
    } else {
        int64_t Ba = a->ndim == 3 ? a->shape[0] : 1, Bb = b->shape[0];
        if (Ba != Bb && Ba != 1 && Bb != 1)
            return lpx_error(LPX_ESHAPE, "%s: a %s and b %s: batch mismatch (%lld vs %lld)", op, sa, sb,
                             (long long)Ba, (long long)Bb);
        g->a_batch = Ba;
        g->b_batch = Bb;
        g->batch = Ba == 1 ? Bb : Ba;
        g->M = a->shape[a->ndim - 2];
        g->out_ndim = 3;
        g->out_shape[0] = g->batch;
        g->out_shape[1] = g->M;
        g->out_shape[2] = N;
    }
    return out ? lpx_meta_out(op, out, a->dtype, g->out_ndim, g->out_shape) : LPX_OK;
}

lpx_status lpx_meta_linear(const char *op, const lpx_tensor *x, const lpx_tensor *w, const lpx_tensor *bias,
                           lpx_gemm_geom *g)
{
    lpx_status st;
    if ((st = need(op, "x", x)) || (st = need(op, "w", w))) return st;
    /* the shapes are formatted only for a message: linear is the
     * trainer's hot op, checked on every call */
    char sx[128], sw[128];
    if (x->ndim < 1 || w->ndim != 2)
        return lpx_error(LPX_ESHAPE, "%s: x %s and w %s: expected x [..., in] and w [out, in]", op,
                         lpx_tensor_shape_str(x, sx, sizeof sx), lpx_tensor_shape_str(w, sw, sizeof sw));
    int64_t in = x->shape[x->ndim - 1], nout = w->shape[0];
    if (w->shape[1] != in)
        return lpx_error(LPX_ESHAPE, "%s: x %s and w %s: in_features mismatch (%lld vs %lld)", op,
                         lpx_tensor_shape_str(x, sx, sizeof sx), lpx_tensor_shape_str(w, sw, sizeof sw),
                         (long long)in, (long long)w->shape[1]);
    if (bias && (bias->ndim != 1 || bias->shape[0] != nout)) {
        char sbias[128];
        return lpx_error(LPX_ESHAPE, "%s: bias %s does not match out_features %lld of w %s", op,
                         lpx_tensor_shape_str(bias, sbias, sizeof sbias), (long long)nout,
                         lpx_tensor_shape_str(w, sw, sizeof sw));
    }
    g->batch = g->a_batch = g->b_batch = 1;
    g->K = in;
    g->N = nout;
    g->M = 1;
    for (int d = 0; d < x->ndim - 1; d++) g->M *= x->shape[d];
    g->out_ndim = x->ndim;
    for (int d = 0; d < x->ndim - 1; d++) g->out_shape[d] = x->shape[d];
    g->out_shape[x->ndim - 1] = nout;
    return LPX_OK;
}

lpx_status lpx_meta_addmm(const char *op, const lpx_tensor *c, const lpx_tensor *a, const lpx_tensor *b,
                          lpx_gemm_geom *g)
{
    lpx_status st;
    if ((st = need(op, "c", c)) || (st = need(op, "a", a)) || (st = need(op, "b", b))) return st;
    /* the shapes are formatted only for a message */
    char sa[128], sb[128], sc[128];
    if (a->ndim != 2 || b->ndim != 2)
        return lpx_error(LPX_ESHAPE, "%s: a %s and b %s: expected 2-D matrices", op,
                         lpx_tensor_shape_str(a, sa, sizeof sa), lpx_tensor_shape_str(b, sb, sizeof sb));
    int64_t M = a->shape[0], K = a->shape[1], N = b->shape[1];
    if (b->shape[0] != K)
        return lpx_error(LPX_ESHAPE, "%s: a %s and b %s: K mismatch (%lld vs %lld)", op,
                         lpx_tensor_shape_str(a, sa, sizeof sa), lpx_tensor_shape_str(b, sb, sizeof sb),
                         (long long)K, (long long)b->shape[0]);
    bool bc = c->ndim <= 2;
    int64_t mn[2] = {M, N};
    for (int i = 0; bc && i < c->ndim; i++) {
        int64_t d = c->shape[i], want = mn[2 - c->ndim + i];
        bc = d == want || d == 1;
    }
    if (!bc)
        return lpx_error(LPX_ESHAPE, "%s: c %s does not broadcast to the product's shape [%lld, %lld]", op,
                         lpx_tensor_shape_str(c, sc, sizeof sc), (long long)M, (long long)N);
    g->batch = g->a_batch = g->b_batch = 1;
    g->M = M;
    g->N = N;
    g->K = K;
    g->out_ndim = 2;
    g->out_shape[0] = M;
    g->out_shape[1] = N;
    return LPX_OK;
}
