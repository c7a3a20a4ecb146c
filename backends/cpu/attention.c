/* CPU scaled dot-product attention with grouped-query heads, forward and
 * backward (lpx_attention in ops.h), through cblas_sgemm.
 *
 * The inputs are read once into contiguous f32 [B, T, H, D]; a head's rows
 * are then a matrix with leading dimension H * D, so BLAS reads q, k and v
 * in place and k/v heads are shared by their query heads without copies.
 * Queries go in blocks of ATT_ROWS rows: one block's scores (ATT_ROWS x S
 * f32) are the only score storage, never the T x S matrix of a head.
 * Softmax in f32 with the row max subtracted; the log-sum-exp of each row
 * is the forward's second result, from which the backward recomputes the
 * probabilities (FlashAttention's recipe, Dao et al. 2022):
 *   P = exp(scale q k^T - lse),  Dlt_i = sum_d dO_id O_id,
 *   dV += P^T dO,  dS = P * (dO V^T - Dlt),  dQ = scale dS K,
 *   dK += scale dS^T Q   (dK, dV summed over the heads of a group). */
#include <math.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "cpu_internal.h"

#define ATT_ROWS 64

/* keys a query row may see: all S, or j <= t + S - T when causal */
static int64_t keys_for(const lpx_attention_geom *g, bool causal, int64_t t)
{
    return causal ? t + g->kv_len - g->q_len + 1 : g->kv_len;
}


/* Stores contiguous f32 src as a new tensor of dtype and shape like. */
static lpx_status store_as(lpx_call *c, lpx_dtype dtype, const lpx_tensor *like, const float *src)
{
    lpx_tensor *t;
    lpx_status st = cpu_new(c, dtype, like->ndim, like->shape, &t);
    if (st) return st;
    cpu_view v;
    cpu_view_of(&v, t);
    cpu_store_f32(&v, 0, t->numel, src, 0);
    cpu_ret(c, t);
    return LPX_OK;
}

/* The contracts (shapes, dtypes, scale) are the dispatcher's: spec
 * families `attention` and `attention_backward` (op_args_nn.h). */
static lpx_status k_attention(lpx_call *c)
{
    const lpx_attention_args *a = lpx_op_args_of(c);
    lpx_tensor *q = a->q, *k = a->k, *v = a->v;
    bool causal = a->causal;
    double scale = a->scale;
    const char *op = cpu_op_name(c);
    const lpx_attention_geom g = a->g;
    lpx_status st;
    lpx_tensor *qf = NULL, *kf = NULL, *vf = NULL, *of = NULL, *lse = NULL;
    float *sc = NULL;
    if ((st = cpu_contiguous_f32(q, &qf)) || (st = cpu_contiguous_f32(k, &kf)) || (st = cpu_contiguous_f32(v, &vf)))
        goto out;
    int64_t lse_shape[3] = {g.batch, g.heads, g.q_len};
    if ((st = lpx_tensor_new(LPX_F32, 4, q->shape, lpx_cpu(), &of)) ||
        (st = cpu_new(c, LPX_F32, 3, lse_shape, &lse)))
        goto out;
    sc = lpx_malloc((size_t)(ATT_ROWS * (g.kv_len ? g.kv_len : 1)) * sizeof *sc);
    if (!sc) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate %d x %lld scores", op, ATT_ROWS, (long long)g.kv_len);
        goto out;
    }
    const float *Q = lpx_tensor_data(qf), *K = lpx_tensor_data(kf), *V = lpx_tensor_data(vf);
    float *O = lpx_tensor_data(of), *L = lpx_tensor_data(lse);
    int64_t T = g.q_len, S = g.kv_len, D = g.head_dim, ldq = g.heads * D, ldk = g.kv_heads * D;
    int64_t group = g.heads / g.kv_heads;
    for (int64_t b = 0; b < g.batch; b++)
        for (int64_t h = 0; h < g.heads; h++) {
            const float *Qh = Q + b * T * ldq + h * D, *Kh = K + b * S * ldk + (h / group) * D,
                        *Vh = V + b * S * ldk + (h / group) * D;
            float *Oh = O + b * T * ldq + h * D, *Lh = L + (b * g.heads + h) * T;
            for (int64_t t0 = 0; t0 < T; t0 += ATT_ROWS) {
                int64_t rows = T - t0 < ATT_ROWS ? T - t0 : ATT_ROWS;
                int64_t n = keys_for(&g, causal, t0 + rows - 1); /* keys of the block's last row */
                if (n > 0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)D, (float)scale,
                                Qh + t0 * ldq, (int)ldq, Kh, (int)ldk, 0.0f, sc, (int)n);
                for (int64_t r = 0; r < rows; r++) {
                    float *s = sc + r * n;
                    int64_t m = keys_for(&g, causal, t0 + r);
                    float mx = -INFINITY;
                    for (int64_t j = 0; j < m; j++) mx = s[j] > mx ? s[j] : mx;
                    double sum = 0;
                    for (int64_t j = 0; j < m; j++) {
                        s[j] = expf(s[j] - mx);
                        sum += s[j];
                    }
                    float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
                    for (int64_t j = 0; j < m; j++) s[j] *= inv;
                    for (int64_t j = m; j < n; j++) s[j] = 0.0f;
                    Lh[t0 + r] = m > 0 ? mx + (float)log(sum) : -INFINITY;
                }
                if (n > 0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)D, (int)n, 1.0f, sc,
                                (int)n, Vh, (int)ldk, 0.0f, Oh + t0 * ldq, (int)ldq);
                else
                    for (int64_t r = 0; r < rows; r++) memset(Oh + (t0 + r) * ldq, 0, (size_t)D * sizeof *Oh);
            }
        }
    if ((st = store_as(c, q->dtype, q, O))) goto out;
    cpu_ret(c, lse);
    lse = NULL;
out:
    lpx_free(sc);
    lpx_tensor *rel[] = {qf, kf, vf, of, lse};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    return st;
}

static lpx_status k_attention_backward(lpx_call *c)
{
    const lpx_attention_backward_args *a = lpx_op_args_of(c);
    lpx_tensor *gr = a->grad, *q = a->q, *k = a->k, *v = a->v, *o = a->out, *lse = a->lse;
    bool causal = a->causal;
    double scale = a->scale;
    const char *op = cpu_op_name(c);
    const lpx_attention_geom g = a->g;
    lpx_status st;
    lpx_tensor *gf = NULL, *qf = NULL, *kf = NULL, *vf = NULL, *of = NULL, *lf = NULL;
    float *buf = NULL;
    if ((st = cpu_contiguous_f32(gr, &gf)) || (st = cpu_contiguous_f32(q, &qf)) || (st = cpu_contiguous_f32(k, &kf)) ||
        (st = cpu_contiguous_f32(v, &vf)) || (st = cpu_contiguous_f32(o, &of)) || (st = cpu_contiguous_f32(lse, &lf)))
        goto out;
    int64_t T = g.q_len, S = g.kv_len, D = g.head_dim, ldq = g.heads * D, ldk = g.kv_heads * D;
    int64_t group = g.heads / g.kv_heads, nq = q->numel, nk = k->numel, Sn = S ? S : 1;
    /* dq, dk, dv accumulators, then the block's P, dP and the row deltas */
    size_t need = (size_t)(nq + 2 * nk + 2 * ATT_ROWS * Sn + ATT_ROWS);
    buf = lpx_calloc(need, sizeof *buf);
    if (!buf) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate %zu floats of gradients and scratch", op, need);
        goto out;
    }
    float *dQ = buf, *dK = dQ + nq, *dV = dK + nk, *P = dV + nk, *dP = P + ATT_ROWS * Sn, *dl = dP + ATT_ROWS * Sn;
    const float *G = lpx_tensor_data(gf), *Q = lpx_tensor_data(qf), *K = lpx_tensor_data(kf),
                *V = lpx_tensor_data(vf), *O = lpx_tensor_data(of), *L = lpx_tensor_data(lf);
    for (int64_t b = 0; b < g.batch; b++)
        for (int64_t h = 0; h < g.heads; h++) {
            int64_t kv = (h / group) * D;
            const float *Qh = Q + b * T * ldq + h * D, *Gh = G + b * T * ldq + h * D, *Oh = O + b * T * ldq + h * D,
                        *Kh = K + b * S * ldk + kv, *Vh = V + b * S * ldk + kv, *Lh = L + (b * g.heads + h) * T;
            float *dQh = dQ + b * T * ldq + h * D, *dKh = dK + b * S * ldk + kv, *dVh = dV + b * S * ldk + kv;
            for (int64_t t0 = 0; t0 < T; t0 += ATT_ROWS) {
                int64_t rows = T - t0 < ATT_ROWS ? T - t0 : ATT_ROWS;
                int64_t n = keys_for(&g, causal, t0 + rows - 1);
                if (n <= 0) continue;
                const float *Qb = Qh + t0 * ldq, *Gb = Gh + t0 * ldq;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)D, (float)scale, Qb,
                            (int)ldq, Kh, (int)ldk, 0.0f, P, (int)n);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)D, 1.0f, Gb, (int)ldq,
                            Vh, (int)ldk, 0.0f, dP, (int)n);
                for (int64_t r = 0; r < rows; r++) {
                    const float *gi = Gb + r * ldq, *oi = Oh + (t0 + r) * ldq;
                    double d = 0;
                    for (int64_t e = 0; e < D; e++) d += (double)gi[e] * oi[e];
                    dl[r] = (float)d;
                    int64_t m = keys_for(&g, causal, t0 + r);
                    float li = Lh[t0 + r], *p = P + r * n, *dp = dP + r * n;
                    for (int64_t j = 0; j < n; j++) {
                        float pj = j < m ? expf(p[j] - li) : 0.0f;
                        p[j] = pj;
                        dp[j] = pj * (dp[j] - dl[r]);   /* dS */
                    }
                }
                /* dV += P^T dO;  dQ = scale dS K;  dK += scale dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)D, (int)rows, 1.0f, P, (int)n, Gb,
                            (int)ldq, 1.0f, dVh, (int)ldk);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)D, (int)n, (float)scale, dP,
                            (int)n, Kh, (int)ldk, 0.0f, dQh + t0 * ldq, (int)ldq);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)D, (int)rows, (float)scale, dP,
                            (int)n, Qb, (int)ldq, 1.0f, dKh, (int)ldk);
            }
        }
    int before = c->nrets;
    if ((st = store_as(c, q->dtype, q, dQ)) || (st = store_as(c, k->dtype, k, dK)) ||
        (st = store_as(c, v->dtype, v, dV))) {
        while (c->nrets > before) lpx_tensor_release(c->rets[--c->nrets].u.t);
        goto out;
    }
out:
    lpx_free(buf);
    lpx_tensor *rel[] = {gf, qf, kf, vf, of, lf};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    return st;
}

lpx_status lpx_cpu_register_attention(void)
{
    lpx_status st = cpu_reg(LPX_OP_attention, k_attention);
    return st ? st : cpu_reg(LPX_OP_attention_backward, k_attention_backward);
}
