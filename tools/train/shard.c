/* Parameter sharding through lpx's engine (include/lpx/fsdp.h,
 * docs/SHARDING.md): this file is the reference for how a framework hands
 * its parameters to lpx_fsdp_* and drives one step.
 *
 *   setup     one lpx_fsdp over a 1-D mesh of the rank's comm; groups:
 *             "emb" (the token embedding), one per block (--wrap block) or
 *             one per parameter (--wrap linear), "root" (norm_f + head;
 *             a tied head reads "emb" again: tr_need_alone).
 *             Block linears enter as float8_weight (float8 recipes: fp8 on
 *             the wire, tensorwise or rowwise), NF4 (nf4-qlora: frozen,
 *             with its LoRA adapters A and B in the same group) or dense
 *             f32 with param_dtype bf16 (bf16 on the wire, f32 masters:
 *             mixed precision). lpx_fsdp_shard cuts them all (Shard(0)).
 *   need      lpx_fsdp_unshard of the group being computed + lpx_fsdp_prefetch
 *             of the next one (forward: g+1, backward: g-1); groups behind
 *             are resharded first, so at most two are unsharded
 *             (max_unsharded 2). The unsharded tensors are turned into the
 *             compute form the model uses (f32 for embeddings/norms/head,
 *             the float8 tensor as is, MX from the plugin).
 *   reduce    lpx_fsdp_set_grad of each trainable param's full f32 grad,
 *             lpx_fsdp_reduce_scatter_grads (ONE reduce-scatter, avg)
 *   optimizer lpx_fsdp_adamw_step per group (optim.c)
 *   scales    lpx_fsdp_precompute_scales: ONE amax all-reduce per step
 *             for every float8_weight of the model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "rank.h"

void tr_mem_add(tr_memtrack *m, int cat, int64_t bytes)
{
    m->cur[cat] += bytes;
    if (m->cur[cat] > m->peak[cat]) m->peak[cat] = m->cur[cat];
}

int64_t tr_tensor_bytes(const lpx_tensor *t)
{
    if (!t) return 0;
    if (!lpx_tensor_kind(t)) return (int64_t)lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
    int64_t n = 0;
    for (int i = 0; i < lpx_tensor_inner_count(t); i++) n += tr_tensor_bytes(lpx_tensor_inner(t, i));
    return n;
}

static bool is_1d(const tr_param *p) { return p->kind == TR_P_NORM || p->kind == TR_P_NORMF; }

/* Where the engine's params (and so its shards and AdamW state) live: the
 * rank's device, except under --offload (the host). */
static lpx_device shard_device(const tr_rank *R) { return R->o->offload ? lpx_cpu() : R->dev; }

/* the full f32 values v of P as a tensor where the shards will live */
static lpx_status full_tensor(const tr_rank *R, const tr_param *P, const float *v, lpx_tensor **out)
{
    int64_t shape[2] = {P->rows, P->cols};
    lpx_tensor *h = NULL;
    lpx_status st = lpx_empty(is_1d(P) ? 1 : 2, shape, LPX_F32, lpx_cpu(), &h);
    if (st == LPX_OK) {
        memcpy(lpx_tensor_data(h), v, sizeof(float) * (size_t)(P->rows * P->cols));
        st = lpx_tensor_to(h, shard_device(R), out);
    }
    lpx_tensor_release(h);
    return st;
}

lpx_status tr_shard_setup(tr_rank *R, float *const *init)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    lpx_tensor *full = NULL, *w = NULL, *a = NULL;
    bool qlora = R->recipe == TR_NF4_QLORA;
    R->sharded = true;
    /* bf16 on the wire for dense f32 params (mixed precision); nf4-qlora
     * keeps its frozen f32 embeddings/norms/head and f32 adapters as is;
     * the f32 recipe (the reference) gathers f32 */
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .max_unsharded = 2,
                           .param_dtype = qlora || R->recipe == TR_F32 ? 0 : LPX_BF16};
    /* --device cuda: the engine computes on the rank's GPU; the params are
     * handed in there (shards, grads and AdamW state stay on the GPU) or,
     * with --offload, on the host (they stay there) */
    if (tr_on_gpu(R)) cfg.compute_device = R->dev;
    TRY(lpx_mesh_new(R->comm, &R->mesh));
    TRY(lpx_fsdp_new(R->mesh, &cfg, &R->fsdp));
    for (int grp = 0; grp < g->ngroups; grp++) {
        char name[48];
        if (grp == 0) snprintf(name, sizeof name, "emb");
        else if (grp == g->ngroups - 1) snprintf(name, sizeof name, "root");
        else snprintf(name, sizeof name, "group%d", grp);
        TRY(lpx_fsdp_group_add(R->fsdp, name, &R->grp[grp]));
        if (R->o->optim || R->o->master) {
            /* --optim / --master: low-precision AdamW state and masters in the shards */
            lpx_fsdp_optim oo = {sizeof oo, (lpx_fsdp_state)R->o->optim, R->o->optim_block, (lpx_fsdp_master)R->o->master,
                                 R->o->seed};
            TRY(lpx_fsdp_group_set_optim(R->grp[grp], &oo));
        }
    }
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        lpx_fsdp_group *G = R->grp[P->group];
        TRY(full_tensor(R, P, init[p], &full));
        unsigned flags = P->decay ? 0u : LPX_FSDP_NO_DECAY;
        if (P->kind == TR_P_LIN &&
            (R->recipe == TR_F8_TENSORWISE || R->recipe == TR_F8_ROWWISE || R->recipe == TR_F8_BLOCKWISE)) {
            /* fp8 on the wire: the float8_weight wrapper casts the f32
             * master shard at each unshard (tensorwise: with the scale
             * lpx_fsdp_precompute_scales agreed on; rowwise: its own rows;
             * blockwise: its own 128 x 128 blocks, cut at whole row blocks) */
            lpx_float8_weight_opts wo = {.struct_size = sizeof wo, .fp8 = LPX_F8E4M3FN,
                                         .rowwise = R->recipe == TR_F8_ROWWISE,
                                         .blockwise = R->recipe == TR_F8_BLOCKWISE};
            TRY(lpx_float8_weight_new(full, &wo, &w));
            TRY(lpx_fsdp_param_add(G, P->name, w, flags, &R->gi[p]));
            REL(w);
        } else if (P->kind == TR_P_LIN && qlora) {
            /* the frozen NF4 base (codes, scalers, factors go on the wire)
             * and its trainable LoRA adapters, in the same group */
            lpx_nf4_config nc = tr_nf4_config(P->rows * P->cols);
            TRY(lpx_nf4_quantize(full, &nc, &w));
            TRY(lpx_fsdp_param_add(G, P->name, w, LPX_FSDP_FROZEN, &R->gi[p]));
            REL(w);
            int64_t r = R->o->lora_rank, sa[2] = {r, P->cols}, sb[2] = {P->rows, r};
            char an[48];
            /* LoRA init: A small random, B zero, so training starts at the base */
            TRY(lpx_randn(2, sa, R->o->seed * 7919u + (uint64_t)p, LPX_F32, lpx_cpu(), &a));
            TRY(lpx_mul_scalar(a, 1.0 / sqrt((double)P->cols), &w));
            REL(a);
            TRY(lpx_tensor_to(w, shard_device(R), &a));   /* the CPU's random stream on any device */
            REL(w);
            w = a;
            a = NULL;
            snprintf(an, sizeof an, "%s.lora_a", P->name);
            TRY(lpx_fsdp_param_add(G, an, w, LPX_FSDP_NO_DECAY, &R->ai[p]));
            REL(w);
            TRY(lpx_zeros(2, sb, LPX_F32, shard_device(R), &w));
            snprintf(an, sizeof an, "%s.lora_b", P->name);
            TRY(lpx_fsdp_param_add(G, an, w, LPX_FSDP_NO_DECAY, &R->bi[p]));
            REL(w);
            /* the adapters' full-size grads accumulate where the backward runs */
            TRY(lpx_zeros(2, sa, LPX_F32, R->dev, &R->ga[p]));
            TRY(lpx_zeros(2, sb, LPX_F32, R->dev, &R->gb[p]));
            tr_mem_add(&R->mem, TR_MEM_GRADS, tr_tensor_bytes(R->ga[p]) + tr_tensor_bytes(R->gb[p]));
        } else {
            TRY(lpx_fsdp_param_add(G, P->name, full, flags | (qlora ? LPX_FSDP_FROZEN : 0u), &R->gi[p]));
        }
        REL(full);
    }
    /* fully_shard: every param becomes a Shard(0) DTensor */
    TRY(lpx_fsdp_shard(R->fsdp));

    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        lpx_fsdp_group *G = R->grp[P->group];
        lpx_tensor *loc = lpx_fsdp_param_local(G, R->gi[p]);
        if (qlora) {
            int64_t nb = tr_tensor_bytes(loc);
            tr_mem_add(&R->mem, TR_MEM_PARAMS, nb);
            if (P->kind == TR_P_LIN) {
                R->nf4_local_bytes += nb;
                R->nf4_local_numel += lpx_tensor_numel(loc);
                int idx[2] = {R->ai[p], R->bi[p]};
                for (int k = 0; k < 2; k++) {
                    int64_t ab = tr_tensor_bytes(lpx_fsdp_param_local(G, idx[k]));
                    tr_mem_add(&R->mem, TR_MEM_PARAMS, ab);
                    tr_mem_add(&R->mem, TR_MEM_GRADS, ab);  /* the engine's grad shard */
                    tr_mem_add(&R->mem, TR_MEM_OPT, 2 * ab); /* AdamW m, v */
                }
            }
            continue;
        }
        /* the f32 master the optimizer updates (a float8_weight's master) */
        lpx_tensor *m = lpx_float8_weight_is(loc) ? lpx_float8_weight_master(loc) : loc;
        lpx_tensor_retain(m);
        R->master[p] = m;
        int64_t b = tr_tensor_bytes(m);
        tr_mem_add(&R->mem, TR_MEM_PARAMS, b);
        tr_mem_add(&R->mem, TR_MEM_GRADS, b);
        tr_mem_add(&R->mem, TR_MEM_OPT, 2 * b);
        TRY(lpx_shard_range(P->rows, R->world, R->rank, 1, &R->chunk[p], &R->start[p], &R->len[p]));
    }
out:
    lpx_tensor_release(full);
    lpx_tensor_release(w);
    lpx_tensor_release(a);
    return st;
}

static void drop_forms(tr_rank *R, int grp)
{
    for (int p = 0; p < R->g->nparams; p++) {
        if (R->g->p[p].group != grp) continue;
        REL(R->full[p]);
        REL(R->full_dense[p]);
        REL(R->nf4[p]);
        REL(R->la[p]);
        REL(R->lb[p]);
    }
}

void tr_shard_teardown(tr_rank *R)
{
    for (int p = 0; p < R->g->nparams; p++) {
        REL(R->master[p]);
        REL(R->gacc[p]);
        REL(R->full[p]);
        REL(R->full_dense[p]);
        REL(R->nf4[p]);
        REL(R->la[p]);
        REL(R->lb[p]);
    }
    lpx_fsdp_free(R->fsdp);
    R->fsdp = NULL;
    lpx_mesh_release(R->mesh);
    R->mesh = NULL;
}

/* The compute forms of group grp's unsharded params. */
static lpx_status make_forms(tr_rank *R, int grp)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    lpx_fsdp_group *G = R->grp[grp];
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (P->group != grp || R->full[p] || R->nf4[p]) continue;
        lpx_tensor *u = lpx_fsdp_param_full(G, R->gi[p]);
        if (!u) FAIL(LPX_EINTERNAL, "train: %s is not unsharded", P->name);
        if (P->kind == TR_P_LIN && R->recipe == TR_NF4_QLORA) {
            lpx_tensor_retain(u);
            R->nf4[p] = u;
            R->la[p] = lpx_fsdp_param_full(G, R->ai[p]);
            R->lb[p] = lpx_fsdp_param_full(G, R->bi[p]);
            lpx_tensor_retain(R->la[p]);
            lpx_tensor_retain(R->lb[p]);
        } else if (P->kind == TR_P_LIN && tr_recipe_is_mx(R->recipe)) {
            TRY(lpx_cast(u, tr_act_dtype(R->o, R->recipe), false, &R->full_dense[p]));
            TRY(lpx_kind_from_dense(R->mx_kind, R->full_dense[p], &R->full[p]));
        } else {
            /* a float8 tensor or bf16 weight goes to the GEMMs as it is;
             * the embedding and the head compute in the activation dtype
             * (bf16 GEMMs for the head on a GPU, as a bf16 transformers
             * model does), the norms' weights in f32 */
            lpx_dtype want = P->kind == TR_P_LIN ? lpx_tensor_dtype(u)
                             : P->kind == TR_P_TOK || P->kind == TR_P_HEAD ? tr_act_dtype(R->o, R->recipe)
                                                                            : LPX_F32;
            if (P->kind == TR_P_LIN || lpx_tensor_dtype(u) == want) {
                lpx_tensor_retain(u);
                R->full[p] = u;
            } else {
                TRY(lpx_cast(u, want, false, &R->full[p]));
            }
        }
    }
out:
    return st;
}

lpx_status tr_unshard(tr_rank *R, int grp)
{
    lpx_status st = lpx_fsdp_unshard(R->grp[grp]);
    return st == LPX_OK ? make_forms(R, grp) : st;
}

void tr_reshard(tr_rank *R, int grp)
{
    drop_forms(R, grp);
    lpx_fsdp_reshard(R->grp[grp]);
}

void tr_reshard_all(tr_rank *R)
{
    for (int grp = 0; grp < R->g->ngroups; grp++) tr_reshard(R, grp);
}

lpx_status tr_need(tr_rank *R, int p)
{
    lpx_status st = LPX_OK;
    int grp = R->g->p[p].group, G = R->g->ngroups;
    /* the groups behind us are done: reshard them, then unshard this one
     * and prefetch the next in the direction of travel (at most two) */
    for (int j = 0; j < G; j++)
        if (lpx_fsdp_is_unsharded(R->grp[j]) && (R->bwd ? j > grp : j < grp)) tr_reshard(R, j);
    TRY(tr_unshard(R, grp));
    /* the backward needs no embedding weights (group 0): no prefetch of it */
    int next = R->bwd ? grp - 1 : grp + 1;
    if (next >= (R->bwd ? 1 : 0) && next < G) {
        TRY(lpx_fsdp_prefetch(R->grp[next]));
        if (lpx_fsdp_is_unsharded(R->grp[next])) TRY(make_forms(R, next));
    }
out:
    return st;
}

/* --inject-nan STEP[:PARAM] (tests of the numerics guards): rank 0 puts a
 * NaN and an inf into the first elements of PARAM's full gradient (default
 * the first block's wq; under nf4-qlora its LoRA A) before the
 * reduce-scatter, so they land in rank 0's shard */
static lpx_status inject_nan(tr_rank *R, int p, int which, lpx_tensor *grad)
{
    const tr_opts *o = R->o;
    const tr_param *P = &R->g->p[p];
    if (!R->inject || o->inject_nan_step != R->step + 1 || R->rank != 0 || !grad) return LPX_OK;
    const char *want = o->inject_nan_param;
    char name[64];
    snprintf(name, sizeof name, "%s%s", P->name, which == 1 ? ".lora_a" : which == 2 ? ".lora_b" : "");
    bool hit = want[0] ? !strcmp(want, name) || (which == 1 && !strcmp(want, P->name))
                       : P->kind == TR_P_LIN && P->layer == 0 && P->lin == TR_L_Q && which <= 1;
    if (!hit || lpx_tensor_numel(grad) < 2) return LPX_OK;
    return tr_poison2(grad);
}

lpx_status tr_reduce_grads(tr_rank *R, int grp)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    lpx_fsdp_group *G = R->grp[grp];
    bool any = false;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (P->group != grp) continue;
        if (R->recipe == TR_NF4_QLORA) {
            if (P->kind != TR_P_LIN) continue;
            TRY(inject_nan(R, p, 1, R->ga[p]));
            TRY(inject_nan(R, p, 2, R->gb[p]));
            TRY(lpx_fsdp_set_grad(G, R->ai[p], R->ga[p]));
            TRY(lpx_fsdp_set_grad(G, R->bi[p], R->gb[p]));
        } else {
            if (!R->gacc[p]) FAIL(LPX_EINTERNAL, "train: no gradient for %s", P->name);
            TRY(inject_nan(R, p, 0, R->gacc[p]));
            TRY(lpx_fsdp_set_grad(G, R->gi[p], R->gacc[p]));
        }
        any = true;
    }
    if (!any) return LPX_OK; /* nothing trainable here (nf4-qlora's emb/root) */
    /* ONE reduce-scatter (avg) of the group's grads */
    TRY(lpx_fsdp_reduce_scatter_grads(G));
    for (int p = 0; p < g->nparams; p++) {
        if (g->p[p].group != grp) continue;
        if (R->gacc[p]) {
            tr_mem_add(&R->mem, TR_MEM_GRADS, -tr_tensor_bytes(R->gacc[p]));
            REL(R->gacc[p]);
        }
        /* nf4-qlora: the next step accumulates adapter grads from zero */
        if (R->ga[p]) TRY(lpx_fill_(R->ga[p], 0.0));
        if (R->gb[p]) TRY(lpx_fill_(R->gb[p], 0.0));
    }
out:
    return st;
}

lpx_status tr_precompute_scales(tr_rank *R)
{
    /* every tensorwise float8_weight of the model, ONE all-reduce(MAX) */
    return lpx_fsdp_precompute_scales(R->fsdp);
}

void tr_shard_rows(const tr_rank *R, int64_t rows, int64_t *start, int64_t *len)
{
    int64_t chunk;
    if (lpx_shard_range(rows, R->world, R->rank, 1, &chunk, start, len) != LPX_OK) *start = *len = 0;
}

lpx_status tr_gather_rows(tr_rank *R, const float *local, int64_t local_rows, int64_t rows, int64_t cols, float *out)
{
    lpx_status st = LPX_OK;
    int64_t chunk, start, len;
    TRY(lpx_shard_range(rows, R->world, R->rank, 1, &chunk, &start, &len));
    if (len != local_rows)
        FAIL(LPX_EINTERNAL, "train: a local shard of %lld rows where Shard(0) of %lld rows over %d ranks gives %lld",
             (long long)local_rows, (long long)rows, R->world, (long long)len);
    /* every rank sends a padded chunk (the comm wants equal sizes) */
    size_t cnt = (size_t)(chunk * cols);
    float *send = calloc(cnt + 1, sizeof(float)), *recv = malloc(sizeof(float) * (cnt * (size_t)R->world + 1));
    if (!send || !recv) {
        free(send);
        free(recv);
        FAIL(LPX_ENOMEM, "train: out of memory");
    }
    if (len) memcpy(send, local, sizeof(float) * (size_t)(len * cols));
    st = tr_all_gather_host(R, send, recv, cnt * sizeof(float));
    if (st == LPX_OK && out)
        for (int r = 0; r < R->world; r++) {
            int64_t s0 = chunk * r, n = s0 >= rows ? 0 : (rows - s0 < chunk ? rows - s0 : chunk);
            if (n) memcpy(out + s0 * cols, recv + (size_t)r * cnt, sizeof(float) * (size_t)(n * cols));
        }
    free(send);
    free(recv);
out:
    return st;
}

lpx_status tr_gather_masters(tr_rank *R, float **out)
{
    lpx_status st = LPX_OK;
    if (R->recipe == TR_NF4_QLORA) return LPX_OK; /* the adapters are not a checkpoint */
    lpx_tensor *h = NULL;
    for (int p = 0; p < R->g->nparams; p++) {
        const tr_param *P = &R->g->p[p];
        /* the master on the host as f32 (a scaled-f16 master dequantized) */
        TRY(lpx_fsdp_param_master_dense(R->grp[P->group], R->gi[p], &h));
        TRY(tr_gather_rows(R, lpx_tensor_data(h), R->len[p], P->rows, P->cols, out ? out[p] : NULL));
        REL(h);
    }
out:
    lpx_tensor_release(h);
    return st;
}

lpx_status tr_need_alone(tr_rank *R, int p)
{
    int grp = R->g->p[p].group, G = R->g->ngroups;
    for (int j = 0; j < G; j++)
        if (j != grp && j != G - 1 && lpx_fsdp_is_unsharded(R->grp[j])) tr_reshard(R, j);
    return tr_unshard(R, grp);
}

lpx_status tr_rank_alloc(tr_rank *R)
{
    size_t P = (size_t)R->g->nparams, G = (size_t)R->g->ngroups;
    R->grp = calloc(G, sizeof *R->grp);
    R->remaining = calloc(G, sizeof *R->remaining);
    R->gi = calloc(P, sizeof *R->gi);
    R->ai = calloc(P, sizeof *R->ai);
    R->bi = calloc(P, sizeof *R->bi);
    R->chunk = calloc(P, sizeof *R->chunk);
    R->start = calloc(P, sizeof *R->start);
    R->len = calloc(P, sizeof *R->len);
    lpx_tensor ***ts[] = {&R->master, &R->full, &R->full_dense, &R->gacc, &R->nf4, &R->la, &R->lb, &R->ga, &R->gb};
    bool ok = R->grp && R->remaining && R->gi && R->ai && R->bi && R->chunk && R->start && R->len;
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) ok = (*ts[i] = calloc(P, sizeof(lpx_tensor *))) && ok;
    return ok ? LPX_OK : lpx_error(LPX_ENOMEM, "train: out of memory for %zu parameters' state", P);
}

void tr_rank_free(tr_rank *R)
{
    void *ps[] = {R->grp, R->remaining, R->gi, R->ai, R->bi, R->chunk, R->start, R->len, R->master, R->full,
                  R->full_dense, R->gacc, R->nf4, R->la, R->lb, R->ga, R->gb};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) free(ps[i]);
}
