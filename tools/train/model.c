/* The model: a small Llama-style character LM, forward and manual backward.
 *
 *   x = tok_emb[idx] + pos_emb[0:t]
 *   per block:  h1 = x + Wo . attn(causal, RMSNorm(x) . Wq/Wk/Wv)
 *               x  = h1 + W2 . (silu(W1 . RMSNorm(h1)) * W3 . RMSNorm(h1))
 *   logits = head . RMSNorm(x)                    next-character loss
 *
 * Every linear goes through tr_linear_forward/backward (recipes.c), so the
 * recipe decides how the GEMMs run; everything else is dense f32 lpx ops.
 * The backward is written out by hand in reverse order, one op per line,
 * using the *_backward ops lpx provides. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "rank.h"

/* ---- geometry ---- */

static int add_param(tr_geom *g, const char *name, tr_pkind kind, int layer, int lin, int64_t rows, int64_t cols,
                     int group, bool decay)
{
    tr_param *p = &g->p[g->nparams];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->lin = lin;
    p->rows = rows;
    p->cols = cols;
    p->group = group;
    p->decay = decay;
    return g->nparams++;
}

void tr_geom_init(tr_geom *g, int vocab, int dim, int layers, int heads, int seq, bool wrap_linear)
{
    static const char *lin_names[TR_LIN_PER_BLOCK] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
    memset(g, 0, sizeof *g);
    g->vocab = vocab;
    g->dim = dim;
    /* SwiGLU hidden size: 8/3 dim (the Llama ratio) rounded to 32 */
    g->hidden = (8 * dim / 3 + 31) / 32 * 32;
    g->layers = layers;
    g->heads = heads;
    g->seq = seq;
    int grp = 0;
    add_param(g, "tok_emb", TR_P_TOK, -1, -1, vocab, dim, grp, false);
    add_param(g, "pos_emb", TR_P_POS, -1, -1, seq, dim, grp, false);
    grp++;
    char name[32];
    for (int l = 0; l < layers; l++) {
        /* --wrap linear: every parameter is its own group (norms included),
         * so the working set is one linear; --wrap block: one group per block */
        snprintf(name, sizeof name, "b%d.norm1", l);
        add_param(g, name, TR_P_NORM, l, 0, dim, 1, grp, false);
        if (wrap_linear) grp++;
        /* in the order the forward uses them (w1, w3, then w2), so that
         * with --wrap linear the groups are reached in order and the
         * prefetch of group g+1 is always the next one needed */
        static const int order[TR_LIN_PER_BLOCK] = {TR_L_Q, TR_L_K, TR_L_V, TR_L_O, TR_L_W1, TR_L_W3, TR_L_W2};
        for (int jj = 0; jj < TR_LIN_PER_BLOCK; jj++) {
            int j = order[jj];
            if (j == TR_L_W1) {
                snprintf(name, sizeof name, "b%d.norm2", l);
                add_param(g, name, TR_P_NORM, l, 1, dim, 1, grp, false);
                if (wrap_linear) grp++;
            }
            int64_t rows = (j == TR_L_W1 || j == TR_L_W3) ? g->hidden : dim;
            int64_t cols = (j == TR_L_W2) ? g->hidden : dim;
            snprintf(name, sizeof name, "b%d.%s", l, lin_names[j]);
            add_param(g, name, TR_P_LIN, l, j, rows, cols, grp, true);
            if (wrap_linear) grp++;
        }
        if (!wrap_linear) grp++;
    }
    add_param(g, "norm_f", TR_P_NORMF, -1, -1, dim, 1, grp, false);
    add_param(g, "head", TR_P_HEAD, -1, -1, vocab, dim, grp, true);
    g->ngroups = grp + 1;
}

int64_t tr_geom_numel(const tr_geom *g)
{
    int64_t n = 0;
    for (int i = 0; i < g->nparams; i++) n += g->p[i].rows * g->p[i].cols;
    return n;
}

int tr_param_index(const tr_geom *g, tr_pkind kind, int layer, int lin)
{
    for (int i = 0; i < g->nparams; i++) {
        const tr_param *p = &g->p[i];
        if (p->kind == kind && p->layer == layer && (lin < 0 || p->lin == lin)) return i;
    }
    return -1;
}

/* ---- setup ---- */

lpx_status tr_model_setup(tr_rank *R)
{
    lpx_status st = LPX_OK;
    int64_t shape[2] = {R->g->seq, R->g->seq};
    TRY(lpx_empty(2, shape, LPX_F32, lpx_cpu(), &R->mask));
    float *m = lpx_tensor_data(R->mask);
    /* additive causal mask: a large finite negative (not -inf) keeps the
     * softmax and its backward free of inf - inf */
    for (int i = 0; i < R->g->seq; i++)
        for (int j = 0; j < R->g->seq; j++) m[i * R->g->seq + j] = j > i ? -1e9f : 0.0f;
out:
    return st;
}

void tr_model_teardown(tr_rank *R)
{
    REL(R->mask);
}

void tr_fwd_clear(tr_fwd *f, int layers)
{
    if (f->blk) {
        for (int l = 0; l < layers; l++) {
            tr_block_saved *b = &f->blk[l];
            lpx_tensor **ts[] = {&b->h_in, &b->n1, &b->rstd1, &b->q3, &b->k3, &b->v3, &b->P, &b->o,
                                 &b->h1, &b->n2, &b->rstd2, &b->u1, &b->u3, &b->s, &b->pp};
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) REL(*ts[i]);
            for (int j = 0; j < TR_LIN_PER_BLOCK; j++) tr_lin_saved_clear(&b->lin[j]);
        }
        free(f->blk);
    }
    REL(f->idx);
    REL(f->tgt);
    REL(f->h_last);
    REL(f->nf);
    REL(f->rstdf);
    REL(f->logits);
    memset(f, 0, sizeof *f);
}

/* [b*t, D] -> [b*heads, t, hd] (contiguous) */
static lpx_status to_heads(tr_rank *R, lpx_tensor *x, int b, int t, lpx_tensor **out)
{
    lpx_status st = LPX_OK;
    lpx_tensor *v = NULL, *p = NULL, *c = NULL;
    int h = R->g->heads, hd = R->g->dim / h;
    int64_t s4[4] = {b, t, h, hd}, perm[4] = {0, 2, 1, 3}, s3[3] = {(int64_t)b * h, t, hd};
    TRY(lpx_view(x, 4, s4, &v));
    TRY(lpx_permute(v, 4, perm, &p));
    TRY(lpx_contiguous(p, &c));
    TRY(lpx_view(c, 3, s3, out));
out:
    lpx_tensor_release(v);
    lpx_tensor_release(p);
    lpx_tensor_release(c);
    return st;
}

/* [b*heads, t, hd] -> [b*t, D] (contiguous) */
static lpx_status from_heads(tr_rank *R, lpx_tensor *x, int b, int t, lpx_tensor **out)
{
    lpx_status st = LPX_OK;
    lpx_tensor *v = NULL, *p = NULL, *c = NULL;
    int h = R->g->heads, hd = R->g->dim / h;
    int64_t s4[4] = {b, h, t, hd}, perm[4] = {0, 2, 1, 3}, s2[2] = {(int64_t)b * t, R->g->dim};
    TRY(lpx_view(x, 4, s4, &v));
    TRY(lpx_permute(v, 4, perm, &p));
    TRY(lpx_contiguous(p, &c));
    TRY(lpx_view(c, 2, s2, out));
out:
    lpx_tensor_release(v);
    lpx_tensor_release(p);
    lpx_tensor_release(c);
    return st;
}

static int64_t blk_bytes(const tr_block_saved *b)
{
    const lpx_tensor *ts[] = {b->h_in, b->n1, b->rstd1, b->q3, b->k3, b->v3, b->P, b->o,
                              b->h1, b->n2, b->rstd2, b->u1, b->u3, b->s, b->pp};
    int64_t n = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) n += tr_tensor_bytes(ts[i]);
    return n;
}

/* ---- forward ---- */

lpx_status tr_forward(tr_rank *R, tr_fwd *f, const int32_t *idx, const int32_t *tgt, int b, int t, int slot,
                      bool grads)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    lpx_tensor *emb = NULL, *pos = NULL, *x = NULL, *x2 = NULL, *q = NULL, *k = NULL, *v = NULL, *kt = NULL,
               *sc = NULL, *sc2 = NULL, *mask = NULL, *o3 = NULL, *a = NULL, *f2 = NULL, *loss = NULL,
               *mrow = NULL, *mcol = NULL, *tmp = NULL;
    int64_t bt = (int64_t)b * t;
    memset(f, 0, sizeof *f);
    f->b = b;
    f->t = t;
    f->blk = calloc((size_t)g->layers, sizeof *f->blk);
    if (!f->blk) FAIL(LPX_ENOMEM, "train: out of memory");

    int64_t is[2] = {b, t}, flat[1] = {bt};
    TRY(lpx_empty(2, is, LPX_I32, lpx_cpu(), &f->idx));
    memcpy(lpx_tensor_data(f->idx), idx, sizeof(int32_t) * (size_t)bt);
    if (tgt) {
        TRY(lpx_empty(1, flat, LPX_I32, lpx_cpu(), &f->tgt));
        memcpy(lpx_tensor_data(f->tgt), tgt, sizeof(int32_t) * (size_t)bt);
    }

    int ptok = tr_param_index(g, TR_P_TOK, -1, -1), ppos = tr_param_index(g, TR_P_POS, -1, -1);
    TRY(tr_need(R, ptok));
    TRY(tr_need(R, ppos));
    TRY(lpx_embedding(R->full[ptok], f->idx, &emb));            /* [b, t, D] */
    TRY(lpx_narrow(R->full[ppos], 0, 0, t, &pos));              /* [t, D] broadcasts over b */
    TRY(lpx_add(emb, pos, &tmp));
    int64_t s2[2] = {bt, g->dim};
    TRY(lpx_view(tmp, 2, s2, &x));
    REL(tmp);

    /* the causal mask for this length: rows and columns [0, t) */
    TRY(lpx_narrow(R->mask, 0, 0, t, &mrow));
    TRY(lpx_narrow(mrow, 1, 0, t, &mask));
    double att_scale = 1.0 / sqrt((double)(g->dim / g->heads));

    for (int l = 0; l < g->layers; l++) {
        tr_block_saved *S = &f->blk[l];
        int pn1 = tr_param_index(g, TR_P_NORM, l, 0), pn2 = tr_param_index(g, TR_P_NORM, l, 1);
        int pl[TR_LIN_PER_BLOCK];
        for (int j = 0; j < TR_LIN_PER_BLOCK; j++) pl[j] = tr_param_index(g, TR_P_LIN, l, j);
        TRY(tr_need(R, pn1));
        S->h_in = x;
        x = NULL;
        TRY(lpx_rmsnorm(S->h_in, R->full[pn1], 1e-5, &S->n1, &S->rstd1));
        TRY(tr_linear_forward(R, pl[TR_L_Q], slot, S->n1, &q, &S->lin[TR_L_Q]));
        TRY(tr_linear_forward(R, pl[TR_L_K], slot, S->n1, &k, &S->lin[TR_L_K]));
        TRY(tr_linear_forward(R, pl[TR_L_V], slot, S->n1, &v, &S->lin[TR_L_V]));
        TRY(to_heads(R, q, b, t, &S->q3));
        TRY(to_heads(R, k, b, t, &S->k3));
        TRY(to_heads(R, v, b, t, &S->v3));
        REL(q);
        REL(k);
        REL(v);
        TRY(lpx_transpose(S->k3, 1, 2, &kt));
        TRY(lpx_matmul(S->q3, kt, &sc));                         /* [bh, t, t] */
        TRY(lpx_mul_scalar(sc, att_scale, &sc2));
        TRY(lpx_add_out(sc2, mask, sc2));
        TRY(lpx_softmax(sc2, -1, &S->P));
        REL(kt);
        REL(sc);
        REL(sc2);
        TRY(lpx_matmul(S->P, S->v3, &o3));                       /* [bh, t, hd] */
        TRY(from_heads(R, o3, b, t, &S->o));
        REL(o3);
        TRY(tr_linear_forward(R, pl[TR_L_O], slot, S->o, &a, &S->lin[TR_L_O]));
        TRY(lpx_add(S->h_in, a, &S->h1));
        REL(a);
        TRY(tr_need(R, pn2));
        TRY(lpx_rmsnorm(S->h1, R->full[pn2], 1e-5, &S->n2, &S->rstd2));
        TRY(tr_linear_forward(R, pl[TR_L_W1], slot, S->n2, &S->u1, &S->lin[TR_L_W1]));
        TRY(tr_linear_forward(R, pl[TR_L_W3], slot, S->n2, &S->u3, &S->lin[TR_L_W3]));
        TRY(lpx_silu(S->u1, &S->s));
        TRY(lpx_mul(S->s, S->u3, &S->pp));
        TRY(tr_linear_forward(R, pl[TR_L_W2], slot, S->pp, &f2, &S->lin[TR_L_W2]));
        TRY(lpx_add(S->h1, f2, &x));
        REL(f2);
        if (!grads) {
            /* inference keeps only the running activation x */
            lpx_tensor **ts[] = {&S->h_in, &S->n1, &S->rstd1, &S->q3, &S->k3, &S->v3, &S->P, &S->o,
                                 &S->h1, &S->n2, &S->rstd2, &S->u1, &S->u3, &S->s, &S->pp};
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) REL(*ts[i]);
            for (int j = 0; j < TR_LIN_PER_BLOCK; j++) tr_lin_saved_clear(&S->lin[j]);
        }
    }

    int pnf = tr_param_index(g, TR_P_NORMF, -1, -1), phead = tr_param_index(g, TR_P_HEAD, -1, -1);
    TRY(tr_need(R, pnf));
    TRY(tr_need(R, phead));
    f->h_last = x;
    x = NULL;
    TRY(lpx_rmsnorm(f->h_last, R->full[pnf], 1e-5, &f->nf, &f->rstdf));
    /* the output projection stays in high precision in every recipe (as
     * torchao and TransformerEngine leave the LM head out of fp8) */
    TRY(lpx_linear(f->nf, R->full[phead], NULL, &f->logits));
    if (f->tgt) {
        TRY(lpx_cross_entropy(f->logits, f->tgt, -100, &loss));
        TRY(lpx_item(loss, 0, &f->loss));
    }
    if (grads) {
        int64_t n = tr_tensor_bytes(f->h_last) + tr_tensor_bytes(f->nf) + tr_tensor_bytes(f->rstdf) +
                    tr_tensor_bytes(f->logits);
        for (int l = 0; l < g->layers; l++) n += blk_bytes(&f->blk[l]);
        R->act_bytes = n;
    }
out:;
    lpx_tensor *rel[] = {emb, pos, x, x2, q, k, v, kt, sc, sc2, mask, o3, a, f2, loss, mrow, mcol, tmp};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
    return st;
}

/* ---- backward ---- */

/* Hands in a parameter's gradient of this micro-batch (gw NULL: frozen,
 * or nf4-qlora's adapters, which recipes.c accumulates). When the last
 * parameter of a group is done, the group is resharded (nothing later in
 * the backward reads it: every caller has used the weight before) and, in
 * the step's last micro-batch, its grads are reduce-scattered. */
static lpx_status acc_param(tr_rank *R, int p, lpx_tensor *gw)
{
    lpx_status st = gw ? tr_grad_accum(R, &R->gacc[p], gw) : LPX_OK;
    int grp = R->g->p[p].group;
    if (st == LPX_OK && --R->remaining[grp] == 0) {
        if (R->last_micro) st = tr_reduce_grads(R, grp);
        tr_reshard(R, grp);
    }
    return st;
}

/* a linear's backward: grad_x out, the weight grad into the accumulators */
static lpx_status lin_bwd(tr_rank *R, int p, tr_lin_saved *s, lpx_tensor *g, lpx_tensor **gx)
{
    lpx_tensor *gw = NULL;
    lpx_status st = tr_need(R, p);
    if (st == LPX_OK) st = tr_linear_backward(R, p, s, g, gx, &gw);
    if (st == LPX_OK) st = acc_param(R, p, gw);
    lpx_tensor_release(gw);
    return st;
}

lpx_status tr_backward(tr_rank *R, tr_fwd *f, double grad_scale, bool last)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    int b = f->b, t = f->t;
    lpx_tensor *dl = NULL, *dnf = NULL, *gt = NULL, *dhead = NULL, *dh = NULL, *dnorm = NULL, *dx = NULL,
               *dp = NULL, *ds = NULL, *du3 = NULL, *du1 = NULL, *dn2 = NULL, *tmp = NULL, *dh1 = NULL,
               *do_ = NULL, *do3 = NULL, *vt = NULL, *Pt = NULL, *dP = NULL, *dS = NULL, *dS2 = NULL,
               *dSt = NULL, *dq3 = NULL, *dk3 = NULL, *dv3 = NULL, *dq = NULL, *dk = NULL, *dv = NULL,
               *dn1 = NULL, *d3 = NULL, *dpos = NULL, *dtok = NULL, *dpos_full = NULL;
    double att_scale = 1.0 / sqrt((double)(g->dim / g->heads));
    bool train_all = R->recipe != TR_NF4_QLORA;
    R->last_micro = last;
    R->bwd = true;
    for (int i = 0; i < g->ngroups; i++) R->remaining[i] = 0;
    for (int i = 0; i < g->nparams; i++) R->remaining[g->p[i].group]++;

    /* loss = mean over the micro-batch's tokens; grad_scale = 1/micro so
     * that summing micro-batch grads (in a fixed order) gives the mean */
    TRY(lpx_cross_entropy_backward(f->logits, f->tgt, -100, grad_scale, &dl));
    int pnf = tr_param_index(g, TR_P_NORMF, -1, -1), phead = tr_param_index(g, TR_P_HEAD, -1, -1);
    TRY(tr_need(R, phead));
    TRY(lpx_matmul(dl, R->full[phead], &dnf));                  /* [bt, D] */
    if (train_all) {
        TRY(lpx_t(dl, &gt));
        TRY(lpx_matmul(gt, f->nf, &dhead));                     /* [V, D] */
        REL(gt);
    }
    TRY(lpx_rmsnorm_backward(dnf, f->h_last, R->full[pnf], f->rstdf, &dh, train_all ? &dnorm : NULL));
    TRY(acc_param(R, phead, dhead));
    TRY(acc_param(R, pnf, dnorm));
    REL(dhead);
    REL(dnorm);
    REL(dnf);
    REL(dl);

    for (int l = g->layers - 1; l >= 0; l--) {
        tr_block_saved *S = &f->blk[l];
        int pn1 = tr_param_index(g, TR_P_NORM, l, 0), pn2 = tr_param_index(g, TR_P_NORM, l, 1);
        int pl[TR_LIN_PER_BLOCK];
        for (int j = 0; j < TR_LIN_PER_BLOCK; j++) pl[j] = tr_param_index(g, TR_P_LIN, l, j);

        /* feed-forward: x = h1 + W2 (silu(u1) * u3) */
        TRY(lin_bwd(R, pl[TR_L_W2], &S->lin[TR_L_W2], dh, &dp));
        TRY(lpx_mul(dp, S->u3, &ds));
        TRY(lpx_mul(dp, S->s, &du3));
        TRY(lpx_silu_backward(ds, S->u1, &du1));
        TRY(lin_bwd(R, pl[TR_L_W3], &S->lin[TR_L_W3], du3, &dn2));
        TRY(lin_bwd(R, pl[TR_L_W1], &S->lin[TR_L_W1], du1, &tmp));
        TRY(lpx_add_out(dn2, tmp, dn2));
        REL(tmp);
        TRY(tr_need(R, pn2));
        TRY(lpx_rmsnorm_backward(dn2, S->h1, R->full[pn2], S->rstd2, &dx, train_all ? &dnorm : NULL));
        TRY(acc_param(R, pn2, dnorm));
        REL(dnorm);
        TRY(lpx_add(dh, dx, &dh1));
        REL(dx);
        REL(dh);
        REL(dp);
        REL(ds);
        REL(du3);
        REL(du1);
        REL(dn2);

        /* attention: h1 = h_in + Wo o,  o = softmax(q k^T * c + mask) v */
        TRY(lin_bwd(R, pl[TR_L_O], &S->lin[TR_L_O], dh1, &do_));
        TRY(to_heads(R, do_, b, t, &do3));
        TRY(lpx_transpose(S->v3, 1, 2, &vt));
        TRY(lpx_matmul(do3, vt, &dP));                           /* [bh, t, t] */
        TRY(lpx_transpose(S->P, 1, 2, &Pt));
        TRY(lpx_matmul(Pt, do3, &dv3));                          /* [bh, t, hd] */
        TRY(lpx_softmax_backward(dP, S->P, -1, &dS));
        TRY(lpx_mul_scalar(dS, att_scale, &dS2));
        TRY(lpx_matmul(dS2, S->k3, &dq3));
        TRY(lpx_transpose(dS2, 1, 2, &dSt));
        TRY(lpx_matmul(dSt, S->q3, &dk3));
        TRY(from_heads(R, dq3, b, t, &dq));
        TRY(from_heads(R, dk3, b, t, &dk));
        TRY(from_heads(R, dv3, b, t, &dv));
        TRY(lin_bwd(R, pl[TR_L_V], &S->lin[TR_L_V], dv, &dn1));
        TRY(lin_bwd(R, pl[TR_L_K], &S->lin[TR_L_K], dk, &tmp));
        TRY(lpx_add_out(dn1, tmp, dn1));
        REL(tmp);
        TRY(lin_bwd(R, pl[TR_L_Q], &S->lin[TR_L_Q], dq, &tmp));
        TRY(lpx_add_out(dn1, tmp, dn1));
        REL(tmp);
        TRY(tr_need(R, pn1));
        TRY(lpx_rmsnorm_backward(dn1, S->h_in, R->full[pn1], S->rstd1, &dx, train_all ? &dnorm : NULL));
        TRY(acc_param(R, pn1, dnorm));
        REL(dnorm);
        TRY(lpx_add(dh1, dx, &dh));
        lpx_tensor *rel[] = {dx, dh1, do_, do3, vt, Pt, dP, dS, dS2, dSt, dq3, dk3, dv3, dq, dk, dv, dn1};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
        dx = dh1 = do_ = do3 = vt = Pt = dP = dS = dS2 = dSt = dq3 = dk3 = dv3 = dq = dk = dv = dn1 = NULL;
        /* this block's activations are no longer needed */
        tr_block_saved *B = S;
        lpx_tensor **ts[] = {&B->h_in, &B->n1, &B->rstd1, &B->q3, &B->k3, &B->v3, &B->P, &B->o,
                             &B->h1, &B->n2, &B->rstd2, &B->u1, &B->u3, &B->s, &B->pp};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) REL(*ts[i]);
        for (int j = 0; j < TR_LIN_PER_BLOCK; j++) tr_lin_saved_clear(&B->lin[j]);
    }

    /* embeddings: x = tok_emb[idx] + pos_emb[0:t] */
    int ptok = tr_param_index(g, TR_P_TOK, -1, -1), ppos = tr_param_index(g, TR_P_POS, -1, -1);
    if (train_all) {
        int64_t s3[3] = {b, t, g->dim}, dim0 = 0;
        TRY(lpx_view(dh, 3, s3, &d3));
        TRY(lpx_embedding_backward(d3, f->idx, g->vocab, &dtok));
        TRY(acc_param(R, ptok, dtok));
        TRY(lpx_sum(d3, 1, &dim0, false, &dpos));                /* [t, D] */
        if (t == g->seq) {
            TRY(acc_param(R, ppos, dpos));
        } else {
            int64_t ps[2] = {g->seq, g->dim};
            TRY(lpx_zeros(2, ps, LPX_F32, lpx_cpu(), &dpos_full));
            TRY(lpx_narrow(dpos_full, 0, 0, t, &tmp));
            TRY(lpx_copy_(tmp, dpos));
            REL(tmp);
            TRY(acc_param(R, ppos, dpos_full));
        }
    } else {
        /* the embeddings are frozen: the group is done */
        TRY(acc_param(R, ptok, NULL));
        TRY(acc_param(R, ppos, NULL));
    }
    tr_reshard_all(R);
    R->bwd = false;
out:;
    lpx_tensor *rel[] = {dl, dnf, gt, dhead, dh, dnorm, dx, dp, ds, du3, du1, dn2, tmp, dh1, do_, do3, vt, Pt,
                         dP, dS, dS2, dSt, dq3, dk3, dv3, dq, dk, dv, dn1, d3, dpos, dtok, dpos_full};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
    return st;
}
