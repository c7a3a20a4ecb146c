/* Meta functions of the transformer ops (include/lpx/meta.h): the one
 * place their argument contracts are written. */
#include <math.h>
#include "../core/lpx_internal.h"
#include "lpx/meta.h"

static lpx_status need(const char *op, const char *arg, const lpx_tensor *t)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    return LPX_OK;
}

static lpx_status rank_is(const char *op, const char *arg, const lpx_tensor *t, int ndim, const char *layout)
{
    if (t->ndim == ndim) return LPX_OK;
    char s[128];
    return lpx_error(LPX_ESHAPE, "%s: %s %s must be %d-D %s", op, arg, lpx_tensor_shape_str(t, s, sizeof s), ndim,
                     layout);
}

lpx_status lpx_meta_rope(const char *op, const lpx_tensor *x, const lpx_tensor *inv_freq, int64_t offset,
                         int64_t *half)
{
    lpx_status st;
    if ((st = need(op, "x", x)) || (st = need(op, "inv_freq", inv_freq))) return st;
    if ((st = rank_is(op, "x", x, 4, "[batch, seq, heads, head_dim]"))) return st;
    char s[128], f[128];
    int64_t D = x->shape[3];
    if (D <= 0 || D % 2)
        return lpx_error(LPX_ESHAPE, "%s: x %s has head_dim %lld; rope needs an even head_dim > 0", op,
                         lpx_tensor_shape_str(x, s, sizeof s), (long long)D);
    if (inv_freq->ndim != 1 || inv_freq->shape[0] != D / 2)
        return lpx_error(LPX_ESHAPE, "%s: inv_freq %s must be [%lld] (head_dim / 2) for x %s", op,
                         lpx_tensor_shape_str(inv_freq, f, sizeof f), (long long)(D / 2),
                         lpx_tensor_shape_str(x, s, sizeof s));
    if (offset < 0 || offset > (INT64_C(1) << 24) - x->shape[1])
        return lpx_error(LPX_ERANGE, "%s: offset %lld: positions offset..offset+%lld must lie in [0, 2^24]", op,
                         (long long)offset, (long long)x->shape[1]);
    if (half) *half = D / 2;
    return LPX_OK;
}

lpx_status lpx_meta_attention(const char *op, const lpx_tensor *q, const lpx_tensor *k, const lpx_tensor *v,
                              bool causal, double scale, lpx_attention_geom *g)
{
    lpx_status st;
    if ((st = need(op, "q", q)) || (st = need(op, "k", k)) || (st = need(op, "v", v))) return st;
    static const char *layout = "[batch, seq, heads, head_dim]";
    if ((st = rank_is(op, "q", q, 4, layout)) || (st = rank_is(op, "k", k, 4, layout)) ||
        (st = rank_is(op, "v", v, 4, layout)))
        return st;
    char sq[128], sk[128], sv[128];
    lpx_tensor_shape_str(q, sq, sizeof sq);
    lpx_tensor_shape_str(k, sk, sizeof sk);
    lpx_tensor_shape_str(v, sv, sizeof sv);
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return lpx_error(LPX_EDTYPE, "%s: q, k and v must share a dtype (q %s, k %s, v %s)", op,
                         lpx_dtype_name(q->dtype), lpx_dtype_name(k->dtype), lpx_dtype_name(v->dtype));
    for (int d = 0; d < 4; d++)
        if (k->shape[d] != v->shape[d])
            return lpx_error(LPX_ESHAPE, "%s: k %s and v %s must have one shape", op, sk, sv);
    if (k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3])
        return lpx_error(LPX_ESHAPE, "%s: k %s must have q %s's batch and head_dim", op, sk, sq);
    if (q->shape[3] <= 0 || k->shape[2] <= 0 || q->shape[2] % k->shape[2])
        return lpx_error(LPX_ESHAPE, "%s: q %s has %lld heads, k %s has %lld: the query heads must be a positive "
                         "multiple of the key/value heads", op, sq, (long long)q->shape[2], sk,
                         (long long)k->shape[2]);
    if (causal && k->shape[1] < q->shape[1])
        return lpx_error(LPX_ESHAPE, "%s: causal with %lld keys for %lld queries: causal attention needs at least "
                         "as many keys (q %s, k %s)", op, (long long)k->shape[1], (long long)q->shape[1], sq, sk);
    if (!(scale > 0) || !isfinite(scale))
        return lpx_error(LPX_EINVAL, "%s: scale %g must be finite and > 0 (usually 1/sqrt(head_dim))", op, scale);
    if (g) {
        g->batch = q->shape[0];
        g->q_len = q->shape[1];
        g->kv_len = k->shape[1];
        g->heads = q->shape[2];
        g->kv_heads = k->shape[2];
        g->head_dim = q->shape[3];
    }
    return LPX_OK;
}

lpx_status lpx_meta_attention_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *q,
                                       const lpx_tensor *k, const lpx_tensor *v, const lpx_tensor *out,
                                       const lpx_tensor *lse, bool causal, double scale, lpx_attention_geom *g)
{
    lpx_status st;
    lpx_attention_geom G;
    if ((st = lpx_meta_attention(op, q, k, v, causal, scale, &G))) return st;
    if ((st = need(op, "grad", grad)) || (st = need(op, "out", out)) || (st = need(op, "lse", lse))) return st;
    char sq[128], s[128];
    lpx_tensor_shape_str(q, sq, sizeof sq);
    const lpx_tensor *same[2] = {grad, out};
    const char *names[2] = {"grad", "out"};
    for (int i = 0; i < 2; i++) {
        bool ok = same[i]->ndim == 4;
        for (int d = 0; ok && d < 4; d++) ok = same[i]->shape[d] == q->shape[d];
        if (!ok)
            return lpx_error(LPX_ESHAPE, "%s: %s %s must have q %s's shape", op, names[i],
                             lpx_tensor_shape_str(same[i], s, sizeof s), sq);
    }
    if (lse->dtype != LPX_F32)
        return lpx_error(LPX_EDTYPE, "%s: lse is %s; it must be the forward's f32 lse", op, lpx_dtype_name(lse->dtype));
    if (lse->ndim != 3 || lse->shape[0] != G.batch || lse->shape[1] != G.heads || lse->shape[2] != G.q_len)
        return lpx_error(LPX_ESHAPE, "%s: lse %s must be [%lld, %lld, %lld] ([batch, heads, seq] of q %s)", op,
                         lpx_tensor_shape_str(lse, s, sizeof s), (long long)G.batch, (long long)G.heads,
                         (long long)G.q_len, sq);
    if (g) *g = G;
    return LPX_OK;
}

/* ---- normalization and softmax ---------------------------------------- */

lpx_status lpx_meta_same_shape(const char *op, const char *an, const lpx_tensor *a, const char *bn,
                               const lpx_tensor *b)
{
    lpx_status st;
    if ((st = need(op, an, a)) || (st = need(op, bn, b))) return st;
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
    if (same) return LPX_OK;
    char sa[128], sb[128];
    return lpx_error(LPX_ESHAPE, "%s: %s %s and %s %s must have the same shape", op, an,
                     lpx_tensor_shape_str(a, sa, sizeof sa), bn, lpx_tensor_shape_str(b, sb, sizeof sb));
}

lpx_status lpx_meta_lines(const char *op, const lpx_tensor *t, int64_t dim_arg, int *dim, int64_t *len,
                          int64_t *count)
{
    lpx_status st = need(op, "x", t);
    if (st) return st;
    int nd = t->ndim ? t->ndim : 1;   /* a scalar accepts dim 0 and -1, as in PyTorch */
    int64_t d = dim_arg < 0 ? dim_arg + nd : dim_arg;
    if (d < 0 || d >= nd)
        return lpx_error(LPX_ERANGE, "%s: dim %lld out of range for %d dims", op, (long long)dim_arg, nd);
    *dim = (int)d;
    *len = t->ndim ? t->shape[d] : 1;
    *count = *len ? t->numel / *len : 0;
    return LPX_OK;
}

lpx_status lpx_meta_rmsnorm(const char *op, const lpx_tensor *x, const lpx_tensor *weight, int64_t *rows,
                            int64_t *dim)
{
    lpx_status st = need(op, "x", x);
    if (st) return st;
    if (x->ndim < 1) return lpx_error(LPX_ESHAPE, "%s: x is a scalar; it needs a last dim to normalize", op);
    int64_t D = x->shape[x->ndim - 1], R = 1;
    for (int d = 0; d < x->ndim - 1; d++) R *= x->shape[d];
    if (weight && (weight->ndim != 1 || weight->shape[0] != D)) {
        char sw[128], sx[128];
        return lpx_error(LPX_ESHAPE, "%s: weight %s must be [%lld] for x %s", op,
                         lpx_tensor_shape_str(weight, sw, sizeof sw), (long long)D,
                         lpx_tensor_shape_str(x, sx, sizeof sx));
    }
    if (rows) *rows = R;
    if (dim) *dim = D;
    return LPX_OK;
}

lpx_status lpx_meta_rmsnorm_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *x,
                                     const lpx_tensor *weight, const lpx_tensor *rstd, int64_t *rows, int64_t *dim)
{
    lpx_status st;
    int64_t R, D;
    if ((st = need(op, "grad", grad)) || (st = need(op, "rstd", rstd))) return st;
    if ((st = lpx_meta_same_shape(op, "grad", grad, "x", x))) return st;
    if ((st = lpx_meta_rmsnorm(op, x, weight, &R, &D))) return st;
    if (rstd->numel != R) {
        char sr[128], sx[128];
        return lpx_error(LPX_ESHAPE, "%s: rstd %s has %lld elements, x %s has %lld rows", op,
                         lpx_tensor_shape_str(rstd, sr, sizeof sr), (long long)rstd->numel,
                         lpx_tensor_shape_str(x, sx, sizeof sx), (long long)R);
    }
    if (rows) *rows = R;
    if (dim) *dim = D;
    return LPX_OK;
}

/* ---- swiglu ---------------------------------------------------------- */

static lpx_status float_dtype(const char *op, const char *arg, const lpx_tensor *t)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    if (tr && tr->is_float) return LPX_OK;
    return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; %s takes floating-point tensors", op, arg,
                     lpx_dtype_name(t->dtype), op);
}

lpx_status lpx_meta_swiglu_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *gate,
                                    const lpx_tensor *up)
{
    lpx_status st;
    if ((st = need(op, "grad", grad)) || (st = need(op, "gate", gate)) || (st = need(op, "up", up))) return st;
    if ((st = lpx_meta_same_shape(op, "grad", grad, "gate", gate)) ||
        (st = lpx_meta_same_shape(op, "up", up, "gate", gate)))
        return st;
    if ((st = float_dtype(op, "grad", grad)) || (st = float_dtype(op, "gate", gate)) ||
        (st = float_dtype(op, "up", up)))
        return st;
    return LPX_OK;
}

/* ---- ops that take integer indices ---------------------------------- */

lpx_status lpx_meta_indices(const char *op, const char *arg, const lpx_tensor *t)
{
    if (!t) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, arg);
    if (t->dtype != LPX_I32 && t->dtype != LPX_I64)
        return lpx_error(LPX_EDTYPE, "%s: %s has dtype %s; indices must be i32 or i64", op, arg,
                         lpx_dtype_name(t->dtype));
    return LPX_OK;
}

lpx_dtype lpx_meta_cross_entropy_dtype(lpx_dtype logits)
{
    const lpx_dtype_traits *di = lpx_dtype_get(logits);
    return di && di->bits < 32 ? LPX_F32 : logits;
}

lpx_status lpx_meta_cross_entropy(const char *op, const lpx_tensor *logits, const lpx_tensor *target, int64_t *n,
                                  int64_t *classes)
{
    lpx_status st;
    if ((st = need(op, "logits", logits)) || (st = lpx_meta_indices(op, "target", target))) return st;
    char sl[128], stg[128];
    lpx_tensor_shape_str(logits, sl, sizeof sl);
    if (logits->ndim != 2) return lpx_error(LPX_ESHAPE, "%s: logits %s must be [N, C]", op, sl);
    if (target->ndim != 1 || target->shape[0] != logits->shape[0])
        return lpx_error(LPX_ESHAPE, "%s: target %s must be [%lld] for logits %s", op,
                         lpx_tensor_shape_str(target, stg, sizeof stg), (long long)logits->shape[0], sl);
    if (n) *n = logits->shape[0];
    if (classes) *classes = logits->shape[1];
    return LPX_OK;
}

lpx_status lpx_meta_embedding(const char *op, const lpx_tensor *weight, const lpx_tensor *indices, int *out_ndim,
                              int64_t *out_shape)
{
    lpx_status st;
    if ((st = need(op, "weight", weight)) || (st = lpx_meta_indices(op, "indices", indices))) return st;
    char sw[128], si[128];
    if (weight->ndim != 2)
        return lpx_error(LPX_ESHAPE, "%s: weight %s must be [V, D]", op, lpx_tensor_shape_str(weight, sw, sizeof sw));
    if (indices->ndim + 1 > LPX_MAX_DIMS)
        return lpx_error(LPX_ESHAPE, "%s: indices %s leave no room for the embedding dim (max %d dims)", op,
                         lpx_tensor_shape_str(indices, si, sizeof si), LPX_MAX_DIMS);
    *out_ndim = indices->ndim + 1;
    for (int d = 0; d < indices->ndim; d++) out_shape[d] = indices->shape[d];
    out_shape[indices->ndim] = weight->shape[1];
    return LPX_OK;
}

lpx_status lpx_meta_embedding_backward(const char *op, const lpx_tensor *grad, const lpx_tensor *indices,
                                       int64_t num_weights, int64_t *dim)
{
    lpx_status st;
    if ((st = need(op, "grad", grad)) || (st = lpx_meta_indices(op, "indices", indices))) return st;
    if (num_weights < 0) return lpx_error(LPX_EINVAL, "%s: num_weights %lld is negative", op, (long long)num_weights);
    bool ok = grad->ndim == indices->ndim + 1;
    for (int d = 0; ok && d < indices->ndim; d++) ok = grad->shape[d] == indices->shape[d];
    if (!ok) {
        char sg[128], si[128];
        return lpx_error(LPX_ESHAPE, "%s: grad %s must be indices %s plus one embedding dim", op,
                         lpx_tensor_shape_str(grad, sg, sizeof sg), lpx_tensor_shape_str(indices, si, sizeof si));
    }
    if (dim) *dim = grad->shape[grad->ndim - 1];
    return LPX_OK;
}
