/* The model: Llama 3 exactly as transformers' LlamaForCausalLM computes it,
 * forward and manual backward.
 *
 *   x = tok_emb[idx]
 *   per block:  n1 = RMSNorm(x);  q, k, v = n1 Wq, n1 Wk, n1 Wv
 *               q, k = rope(q), rope(k)           [b, t, heads, hd] views
 *               h1 = x + Wo . attention(q, k, v)  (causal, kv_heads <= heads)
 *               n2 = RMSNorm(h1)
 *               x  = h1 + W2 . swiglu(W1 n2, W3 n2)    (silu(gate) * up; gate, up, down)
 *   logits = head . RMSNorm(x)       (head = tok_emb when tied)
 *
 * Every block linear goes through tr_linear_forward/backward (recipes.c),
 * so the recipe decides how the GEMMs run; everything else is dense f32
 * lpx ops. The backward is written out by hand in reverse order, one op
 * per line, using the *_backward ops lpx provides. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "rank.h"

/* ---- geometry ---- */

static void add_param(tr_geom *g, const char *name, tr_pkind kind, int layer, int lin, int64_t rows, int64_t cols,
                      int group, bool decay)
{
    tr_param *p = &g->p[g->nparams++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->lin = lin;
    p->rows = rows;
    p->cols = cols;
    p->group = group;
    p->decay = decay;
}

lpx_status tr_geom_init(tr_geom *g, const tr_arch *a, int seq, bool wrap_linear)
{
    static const char *lin_names[TR_LIN_PER_BLOCK] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
    memset(g, 0, sizeof *g);
    g->a = *a;
    g->vocab = a->vocab;
    g->dim = a->dim;
    g->hidden = a->ffn;
    g->layers = a->layers;
    g->heads = a->heads;
    g->kv_heads = a->kv_heads;
    g->head_dim = a->dim / a->heads;
    g->tied = a->tied;
    g->seq = seq;
    /* every size lpx derives from the model (elements, bytes, the memory
     * estimate) is an int64: refuse a model whose parameter count is past
     * 2^50 (a config.json's vocab_size of 2^31-1 with a hidden_size of 2^30)
     * before anything is allocated */
    double hd = a->heads > 0 ? (double)(a->dim / a->heads) : 0, kvd = (double)a->kv_heads * hd;
    double numel = (double)a->vocab * a->dim * (a->tied ? 1 : 2) + a->dim +
                   (double)a->layers * (2.0 * a->dim + 2.0 * a->dim * a->dim + 2.0 * a->dim * kvd + 3.0 * a->dim * a->ffn);
    if (!(numel <= 1125899906842624.0))
        return lpx_error(LPX_ERANGE, "model: %.3g parameters (vocab %d, dim %d, ffn %d, %d layers): more than the 2^50 "
                         "lpx sizes in int64 bytes", numel, a->vocab, a->dim, a->ffn, a->layers);
    g->p = calloc((size_t)a->layers * 9 + 3, sizeof *g->p);
    if (!g->p) return lpx_error(LPX_ENOMEM, "model: out of memory for %d layers' parameters", a->layers);
    int64_t D = a->dim, KV = (int64_t)a->kv_heads * g->head_dim;
    int grp = 0;
    add_param(g, "tok_emb", TR_P_TOK, -1, -1, a->vocab, D, grp, false);
    grp++;
    char name[32];
    for (int l = 0; l < a->layers; l++) {
        /* --wrap linear: every parameter is its own group (norms included),
         * so the working set is one linear; --wrap block: one group per block */
        snprintf(name, sizeof name, "b%d.norm1", l);
        add_param(g, name, TR_P_NORM, l, 0, D, 1, grp, false);
        if (wrap_linear) grp++;
        /* in the order the forward uses them (w1, w3, then w2), so that
         * with --wrap linear the groups are reached in order and the
         * prefetch of group g+1 is always the next one needed */
        static const int order[TR_LIN_PER_BLOCK] = {TR_L_Q, TR_L_K, TR_L_V, TR_L_O, TR_L_W1, TR_L_W3, TR_L_W2};
        for (int jj = 0; jj < TR_LIN_PER_BLOCK; jj++) {
            int j = order[jj];
            if (j == TR_L_W1) {
                snprintf(name, sizeof name, "b%d.norm2", l);
                add_param(g, name, TR_P_NORM, l, 1, D, 1, grp, false);
                if (wrap_linear) grp++;
            }
            int64_t rows = j == TR_L_W1 || j == TR_L_W3 ? a->ffn : j == TR_L_K || j == TR_L_V ? KV : D;
            int64_t cols = j == TR_L_W2 ? a->ffn : D;
            snprintf(name, sizeof name, "b%d.%s", l, lin_names[j]);
            add_param(g, name, TR_P_LIN, l, j, rows, cols, grp, true);
            if (wrap_linear) grp++;
        }
        if (!wrap_linear) grp++;
    }
    add_param(g, "norm_f", TR_P_NORMF, -1, -1, D, 1, grp, false);
    if (!a->tied) add_param(g, "head", TR_P_HEAD, -1, -1, a->vocab, D, grp, true);
    g->ngroups = grp + 1;
    return LPX_OK;
}

void tr_geom_free(tr_geom *g)
{
    free(g->p);
    g->p = NULL;
    g->nparams = 0;
}

int64_t tr_geom_numel(const tr_geom *g)
{
    int64_t n = 0;
    for (int i = 0; i < g->nparams; i++) n += g->p[i].rows * g->p[i].cols;
    return n;
}

int64_t tr_geom_matmul_params(const tr_geom *g)
{
    /* the block linears and the LM head (the embedding's table when tied) */
    int64_t n = g->tied ? (int64_t)g->vocab * g->dim : 0;
    for (int i = 0; i < g->nparams; i++)
        if (g->p[i].kind == TR_P_LIN || g->p[i].kind == TR_P_HEAD) n += g->p[i].rows * g->p[i].cols;
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

/* the LM head's weight: its own, or the token embedding when tied */
static int head_index(const tr_geom *g)
{
    return g->tied ? tr_param_index(g, TR_P_TOK, -1, -1) : tr_param_index(g, TR_P_HEAD, -1, -1);
}

/* ---- setup ---- */

lpx_status tr_model_setup(tr_rank *R)
{
    int64_t half = R->g->head_dim / 2;
    float *f = malloc(sizeof(float) * (size_t)half);
    if (!f) return lpx_error(LPX_ENOMEM, "train: out of memory");
    tr_arch_inv_freq(&R->g->a, f);
    lpx_status st = tr_host_tensor(R, LPX_F32, 1, &half, f, &R->inv_freq);   /* where the rank computes */
    free(f);
    return st;
}

void tr_model_teardown(tr_rank *R)
{
    REL(R->inv_freq);
}

#define BLOCK_SAVED(B) {&(B)->h_in, &(B)->n1, &(B)->rstd1, &(B)->q, &(B)->k, &(B)->v, &(B)->att, &(B)->lse, \
                        &(B)->h1, &(B)->n2, &(B)->rstd2, &(B)->u1, &(B)->u3, &(B)->pp}

static void block_clear(tr_block_saved *b)
{
    lpx_tensor **ts[] = BLOCK_SAVED(b);
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) REL(*ts[i]);
    for (int j = 0; j < TR_LIN_PER_BLOCK; j++) tr_lin_saved_clear(&b->lin[j]);
}

void tr_fwd_clear(tr_fwd *f, int layers)
{
    if (f->blk) {
        for (int l = 0; l < layers; l++) block_clear(&f->blk[l]);
        free(f->blk);
    }
    REL(f->idx);
    REL(f->tgt);
    REL(f->h_last);
    REL(f->nf);
    REL(f->rstdf);
    REL(f->logits);
    REL(f->dnf);
    REL(f->dhead);
    memset(f, 0, sizeof *f);
}

/* [b*t, heads*hd] as [b, t, heads, hd] (a view: no copy) */
static lpx_status as_heads(lpx_tensor *x, int b, int t, int heads, int hd, lpx_tensor **out)
{
    int64_t s4[4] = {b, t, heads, hd};
    return lpx_view(x, 4, s4, out);
}

/* [b, t, heads, hd] (contiguous) as [b*t, heads*hd] */
static lpx_status as_rows(lpx_tensor *x, int64_t bt, int64_t width, lpx_tensor **out)
{
    int64_t s2[2] = {bt, width};
    return lpx_view(x, 2, s2, out);
}

static int64_t blk_bytes(tr_block_saved *b)
{
    lpx_tensor **ts[] = BLOCK_SAVED(b);
    int64_t n = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) n += tr_tensor_bytes(*ts[i]);
    return n;
}

/* ---- forward ---- */

/* One block: *x (taken over, kept as S->h_in) -> *x, the block's output;
 * S keeps what the backward needs. */
static lpx_status block_forward(tr_rank *R, int l, int slot, int b, int t, tr_block_saved *S, lpx_tensor **x)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    lpx_tensor *q = NULL, *k = NULL, *v = NULL, *q4 = NULL, *k4 = NULL, *o4 = NULL, *a = NULL, *f2 = NULL;
    int hd = g->head_dim;
    int64_t bt = (int64_t)b * t;
    double att_scale = 1.0 / sqrt((double)hd), eps = g->a.norm_eps;
    int pn1 = tr_param_index(g, TR_P_NORM, l, 0), pn2 = tr_param_index(g, TR_P_NORM, l, 1);
    int pl[TR_LIN_PER_BLOCK];
    for (int j = 0; j < TR_LIN_PER_BLOCK; j++) pl[j] = tr_param_index(g, TR_P_LIN, l, j);
    S->h_in = *x;
    *x = NULL;
    TRY(tr_need(R, pn1));
    TRY(lpx_rmsnorm(S->h_in, R->full[pn1], eps, &S->n1, &S->rstd1));
    TRY(tr_linear_forward(R, pl[TR_L_Q], slot, S->n1, &q, &S->lin[TR_L_Q]));
    TRY(tr_linear_forward(R, pl[TR_L_K], slot, S->n1, &k, &S->lin[TR_L_K]));
    TRY(tr_linear_forward(R, pl[TR_L_V], slot, S->n1, &v, &S->lin[TR_L_V]));
    TRY(as_heads(q, b, t, g->heads, hd, &q4));
    TRY(as_heads(k, b, t, g->kv_heads, hd, &k4));
    TRY(as_heads(v, b, t, g->kv_heads, hd, &S->v));
    TRY(lpx_rope(q4, R->inv_freq, 0, &S->q));                 /* [b, t, H, hd] */
    TRY(lpx_rope(k4, R->inv_freq, 0, &S->k));                 /* [b, t, KV, hd] */
    TRY(lpx_attention(S->q, S->k, S->v, true, att_scale, &o4, &S->lse));
    TRY(as_rows(o4, bt, g->dim, &S->att));
    TRY(tr_linear_forward(R, pl[TR_L_O], slot, S->att, &a, &S->lin[TR_L_O]));
    TRY(lpx_add(S->h_in, a, &S->h1));
    TRY(tr_need(R, pn2));
    TRY(lpx_rmsnorm(S->h1, R->full[pn2], eps, &S->n2, &S->rstd2));
    TRY(tr_linear_forward(R, pl[TR_L_W1], slot, S->n2, &S->u1, &S->lin[TR_L_W1]));
    TRY(tr_linear_forward(R, pl[TR_L_W3], slot, S->n2, &S->u3, &S->lin[TR_L_W3]));
    TRY(lpx_swiglu(S->u1, S->u3, &S->pp)); /* silu(u1) * u3, one pass; silu(u1) is not kept */
    TRY(tr_linear_forward(R, pl[TR_L_W2], slot, S->pp, &f2, &S->lin[TR_L_W2]));
    TRY(lpx_add(S->h1, f2, x));
out:;
    lpx_tensor *rel[] = {q, k, v, q4, k4, o4, a, f2};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
    return st;
}

/* --ac full, in the backward: block l's forward again from its saved input
 * (its output is dropped); returns the bytes it added to the activations */
static lpx_status block_recompute(tr_rank *R, tr_fwd *f, int l, int64_t *added)
{
    tr_block_saved *S = &f->blk[l];
    int64_t before = blk_bytes(S);
    lpx_tensor *x = S->h_in;
    S->h_in = NULL;
    lpx_status st = block_forward(R, l, f->slot, f->b, f->t, S, &x);
    lpx_tensor_release(x);
    *added = blk_bytes(S) - before;
    return st;
}

/* Rows of the LM head computed at once (--loss-chunk, else automatic): a
 * chunk's logits at most 1 GiB in the activation dtype, in whole 64-row
 * tiles, so the [bt, V] logits never exist at once (128256 x 8192 in f32
 * would be 3.9 GiB) while each chunk's GEMMs stay large (2 chunks at
 * Llama-3-8B's vocabulary and 8192 tokens in bf16) and the f32 sum of the
 * head's grad runs once per chunk. */
static int64_t head_chunk_rows(const tr_rank *R, int64_t bt)
{
    int64_t c = R->o->loss_chunk;
    if (c <= 0) {
        int64_t row = (int64_t)R->g->vocab * (int64_t)lpx_dtype_nbytes(tr_act_dtype(R->o, R->recipe), 1);
        c = ((int64_t)1 << 30) / row / 64 * 64;
        if (c < 64) c = 64;
    }
    return c < bt ? c : bt;
}

/* *acc += g in f32 (the first g, cast when needed, becomes *acc) */
static lpx_status sum_f32(lpx_tensor **acc, lpx_tensor *g)
{
    lpx_tensor *c = NULL;
    if (lpx_tensor_dtype(g) != LPX_F32) {
        lpx_status st = lpx_cast(g, LPX_F32, false, &c);
        if (st != LPX_OK) return st;
        g = c;
    }
    lpx_status st = LPX_OK;
    if (*acc) st = lpx_add_out(*acc, g, *acc);
    else {
        lpx_tensor_retain(g);
        *acc = g;
    }
    lpx_tensor_release(c);
    return st;
}

/* The LM head and the loss, chunk by chunk of rows: each chunk's logits
 * (a slice of f->logits when the caller keeps them, else computed here
 * and dropped), its share of the mean loss (the chunk's mean weighted by
 * its share of the targets) and, with grads, right away the loss's
 * gradients: d nf into f->dnf and d W_head into f->dhead (NULL when the
 * head is frozen). The backward then starts from f->dnf. */
static lpx_status head_loss(tr_rank *R, tr_fwd *f, lpx_tensor *W, const int32_t *tgt, bool grads, bool train_head,
                            double grad_scale)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    int64_t bt = (int64_t)f->b * f->t, C = head_chunk_rows(R, bt), valid = 0;
    lpx_tensor *nf_c = NULL, *tgt_c = NULL, *lg = NULL, *loss_c = NULL, *part = NULL, *sum = NULL, *dl = NULL,
               *dlt = NULL, *dw = NULL, *dnf_c = NULL;
    for (int64_t i = 0; i < bt; i++) valid += tgt[i] != -100;
    if (grads) {
        int64_t s2[2] = {bt, g->dim};
        TRY(lpx_empty(2, s2, lpx_tensor_dtype(f->nf), R->dev, &f->dnf));
    }
    for (int64_t r0 = 0; r0 < bt; r0 += C) {
        int64_t n = bt - r0 < C ? bt - r0 : C, vc = 0;
        for (int64_t i = r0; i < r0 + n; i++) vc += tgt[i] != -100;
        TRY(lpx_narrow(f->nf, 0, r0, n, &nf_c));
        TRY(lpx_narrow(f->tgt, 0, r0, n, &tgt_c));
        if (f->logits) TRY(lpx_narrow(f->logits, 0, r0, n, &lg));
        else TRY(lpx_linear(nf_c, W, NULL, &lg));                  /* [n, V] */
        if (vc) {
            /* the mean over all targets = sum over chunks of (chunk mean x vc / valid) */
            TRY(lpx_cross_entropy(lg, tgt_c, -100, &loss_c));   /* f32 for bf16 logits */
            TRY(lpx_mul_scalar(loss_c, (double)vc / (double)valid, &part));
            if (sum) TRY(lpx_add_out(sum, part, sum));
            else {
                sum = part;
                part = NULL;
            }
        }
        if (grads) {
            TRY(lpx_narrow(f->dnf, 0, r0, n, &dnf_c));
            if (vc) {
                TRY(lpx_cross_entropy_backward(lg, tgt_c, -100, grad_scale * (double)vc / (double)valid, &dl));
                TRY(lpx_matmul_out(dl, W, dnf_c));                     /* d nf rows [n, D] */
                if (train_head) {
                    TRY(lpx_t(dl, &dlt));
                    TRY(lpx_matmul(dlt, nf_c, &dw));                   /* [V, D], the activation dtype */
                    TRY(sum_f32(&f->dhead, dw));   /* over the chunks, in f32 (the grads' dtype) */
                }
            } else {
                TRY(lpx_fill_(dnf_c, 0.0));                            /* no target here: no gradient */
            }
        }
        lpx_tensor *rel[] = {nf_c, tgt_c, lg, loss_c, part, dl, dlt, dw, dnf_c};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
        nf_c = tgt_c = lg = loss_c = part = dl = dlt = dw = dnf_c = NULL;
    }
    if (grads && train_head && !f->dhead) {
        /* not one target in the micro-batch: a zero gradient */
        int64_t s2[2] = {g->vocab, g->dim};
        TRY(lpx_zeros(2, s2, LPX_F32, R->dev, &f->dhead));
    }
    /* torch's mean over no targets is NaN */
    if (sum) TRY(lpx_item(sum, 0, &f->loss));
    else f->loss = NAN;
out:;
    lpx_tensor *rel[] = {nf_c, tgt_c, lg, loss_c, part, sum, dl, dlt, dw, dnf_c};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
    return st;
}

lpx_status tr_forward(tr_rank *R, tr_fwd *f, const int32_t *idx, const int32_t *tgt, int b, int t, int slot,
                      unsigned flags, double grad_scale)
{
    bool grads = flags & TR_FWD_GRADS;
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    lpx_tensor *emb = NULL, *x = NULL;
    int64_t bt = (int64_t)b * t;
    memset(f, 0, sizeof *f);
    f->b = b;
    f->t = t;
    f->slot = slot;
    f->blk = calloc((size_t)g->layers, sizeof *f->blk);
    if (!f->blk) FAIL(LPX_ENOMEM, "train: out of memory");

    int64_t is[2] = {b, t}, flat[1] = {bt};
    TRY(tr_host_tensor(R, LPX_I32, 2, is, idx, &f->idx));      /* on the rank's device */
    if (tgt) TRY(tr_host_tensor(R, LPX_I32, 1, flat, tgt, &f->tgt));

    int ptok = tr_param_index(g, TR_P_TOK, -1, -1);
    TRY(tr_need(R, ptok));
    TRY(lpx_embedding(R->full[ptok], f->idx, &emb));            /* [b, t, D] in the activation dtype */
    int64_t s2[2] = {bt, g->dim};
    TRY(lpx_view(emb, 2, s2, &x));
    REL(emb);
    if (lpx_tensor_dtype(x) != tr_act_dtype(R->o, R->recipe)) {
        TRY(lpx_cast(x, tr_act_dtype(R->o, R->recipe), false, &emb));
        REL(x);
        x = emb;
        emb = NULL;
    }
    double eps = g->a.norm_eps;

    for (int l = 0; l < g->layers; l++) {
        tr_block_saved *S = &f->blk[l];
        TRY(block_forward(R, l, slot, b, t, S, &x));
        if (!grads) {
            block_clear(S);   /* inference keeps only the running activation x */
        } else if (R->o->ac) {
            /* activation checkpointing: the block keeps its input; the
             * backward recomputes the rest (block_recompute) */
            lpx_tensor *in = S->h_in;
            S->h_in = NULL;
            block_clear(S);
            S->h_in = in;
        }
    }

    int pnf = tr_param_index(g, TR_P_NORMF, -1, -1), phead = head_index(g);
    TRY(tr_need(R, pnf));
    f->h_last = x;
    x = NULL;
    TRY(lpx_rmsnorm(f->h_last, R->full[pnf], eps, &f->nf, &f->rstdf));
    /* tied: the embedding's group again, alone beside the root (no
     * prefetch: nothing after it) */
    if (g->tied) TRY(tr_need_alone(R, phead));
    /* the output projection stays in high precision in every recipe (as
     * torchao and TransformerEngine leave the LM head out of fp8); the
     * full logits only where the caller reads them (sampling, lpx eval
     * --logits), else chunk by chunk inside the loss */
    if ((flags & TR_FWD_LOGITS) || !f->tgt) TRY(lpx_linear(f->nf, R->full[phead], NULL, &f->logits));
    if (f->tgt) TRY(head_loss(R, f, R->full[phead], tgt, grads, R->recipe != TR_NF4_QLORA, grad_scale));
    if (grads) {
        int64_t n = tr_tensor_bytes(f->h_last) + tr_tensor_bytes(f->nf) + tr_tensor_bytes(f->rstdf) +
                    tr_tensor_bytes(f->logits) + tr_tensor_bytes(f->dnf);
        for (int l = 0; l < g->layers; l++) n += blk_bytes(&f->blk[l]);
        R->act_bytes = n;
    }
out:;
    lpx_tensor *rel[] = {emb, x};
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

lpx_status tr_backward(tr_rank *R, tr_fwd *f, bool last)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    int b = f->b, t = f->t, hd = g->head_dim;
    int64_t bt = (int64_t)b * t, kvw = (int64_t)g->kv_heads * hd;
    lpx_tensor *dnf = NULL, *dhead = NULL, *dh = NULL, *dnorm = NULL, *dx = NULL,
               *dp = NULL, *du3 = NULL, *du1 = NULL, *dn2 = NULL, *tmp = NULL, *dh1 = NULL,
               *da = NULL, *da4 = NULL, *dq4 = NULL, *dk4 = NULL, *dv4 = NULL, *dqr = NULL, *dkr = NULL,
               *dq = NULL, *dk = NULL, *dv = NULL, *dn1 = NULL, *d3 = NULL, *dtok = NULL, *o4 = NULL;
    double att_scale = 1.0 / sqrt((double)hd);
    bool train_all = R->recipe != TR_NF4_QLORA;
    R->last_micro = last;
    R->bwd = true;
    for (int i = 0; i < g->ngroups; i++) R->remaining[i] = 0;
    for (int i = 0; i < g->nparams; i++) R->remaining[g->p[i].group]++;

    /* the head and the loss were differentiated in the forward
     * (head_loss: d nf and d W_head, scaled by the forward's grad_scale) */
    if (!f->dnf) FAIL(LPX_EINTERNAL, "train: backward of a forward without TR_FWD_GRADS and targets");
    dnf = f->dnf;
    dhead = f->dhead;
    f->dnf = f->dhead = NULL;
    int pnf = tr_param_index(g, TR_P_NORMF, -1, -1), phead = head_index(g);
    /* untied: the root group (head and final norm; the norm's backward
     * needs it) with the last block prefetched; tied: the head's weight is
     * not read again, only its grad is handed in */
    if (!g->tied) TRY(tr_need(R, phead));
    if (g->tied) {
        /* the head's part of the shared weight's grad; the embedding's
         * part completes it at the end (acc_param there) */
        if (dhead) TRY(tr_grad_accum(R, &R->gacc[phead], dhead));
        tr_reshard(R, g->p[phead].group);
    }
    TRY(tr_need(R, pnf));
    TRY(lpx_rmsnorm_backward(dnf, f->h_last, R->full[pnf], f->rstdf, &dh, train_all ? &dnorm : NULL));
    if (!g->tied) TRY(acc_param(R, phead, dhead));
    TRY(acc_param(R, pnf, dnorm));
    REL(dhead);
    REL(dnorm);
    REL(dnf);

    for (int l = g->layers - 1; l >= 0; l--) {
        tr_block_saved *S = &f->blk[l];
        int pn1 = tr_param_index(g, TR_P_NORM, l, 0), pn2 = tr_param_index(g, TR_P_NORM, l, 1);
        int pl[TR_LIN_PER_BLOCK];
        for (int j = 0; j < TR_LIN_PER_BLOCK; j++) pl[j] = tr_param_index(g, TR_P_LIN, l, j);
        int64_t recomputed = 0;
        if (R->o->ac) {
            TRY(block_recompute(R, f, l, &recomputed));
            tr_mem_add(&R->mem, TR_MEM_ACT, recomputed);
        }

        /* feed-forward: x = h1 + W2 (silu(u1) * u3) */
        TRY(lin_bwd(R, pl[TR_L_W2], &S->lin[TR_L_W2], dh, &dp));
        TRY(lpx_swiglu_backward(dp, S->u1, S->u3, &du1, &du3)); /* the bits of mul, mul, silu_backward */
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
        REL(du3);
        REL(du1);
        REL(dn2);

        /* attention: h1 = h_in + Wo att,  att = attention(rope(q), rope(k), v) */
        TRY(lin_bwd(R, pl[TR_L_O], &S->lin[TR_L_O], dh1, &da));
        TRY(as_heads(da, b, t, g->heads, hd, &da4));
        TRY(as_heads(S->att, b, t, g->heads, hd, &o4));
        TRY(lpx_attention_backward(da4, S->q, S->k, S->v, o4, S->lse, true, att_scale, &dq4, &dk4, &dv4));
        TRY(lpx_rope_backward(dq4, R->inv_freq, 0, &dqr));
        TRY(lpx_rope_backward(dk4, R->inv_freq, 0, &dkr));
        TRY(as_rows(dqr, bt, g->dim, &dq));
        TRY(as_rows(dkr, bt, kvw, &dk));
        TRY(as_rows(dv4, bt, kvw, &dv));
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
        lpx_tensor *rel[] = {dx, dh1, da, da4, o4, dq4, dk4, dv4, dqr, dkr, dq, dk, dv, dn1};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
        dx = dh1 = da = da4 = o4 = dq4 = dk4 = dv4 = dqr = dkr = dq = dk = dv = dn1 = NULL;
        block_clear(S);   /* this block's activations are no longer needed */
        tr_mem_add(&R->mem, TR_MEM_ACT, -recomputed);
    }

    /* the embedding: x = tok_emb[idx] */
    int ptok = tr_param_index(g, TR_P_TOK, -1, -1);
    if (train_all) {
        /* the table's grad is a scatter-add of many rows: in f32 */
        int64_t s3[3] = {b, t, g->dim};
        if (lpx_tensor_dtype(dh) != LPX_F32) {
            TRY(lpx_cast(dh, LPX_F32, false, &tmp));
            REL(dh);
            dh = tmp;
            tmp = NULL;
        }
        TRY(lpx_view(dh, 3, s3, &d3));
        TRY(lpx_embedding_backward(d3, f->idx, g->vocab, &dtok));
        TRY(acc_param(R, ptok, dtok));
    } else {
        TRY(acc_param(R, ptok, NULL));   /* frozen: the group is done */
    }
    tr_reshard_all(R);
    R->bwd = false;
out:;
    lpx_tensor *rel[] = {dnf, dhead, dh, dnorm, dx, dp, du3, du1, dn2, tmp, dh1, da, da4, dq4, dk4, dv4,
                         dqr, dkr, dq, dk, dv, dn1, d3, dtok, o4};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) lpx_tensor_release(rel[i]);
    return st;
}
