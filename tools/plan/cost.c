/* One training step of a Llama model under FSDP (plan.h: pl_step_predict).
 * Every formula is printed by `lpx plan --explain`; docs/PLAN.md derives
 * them. T = batch x seq tokens per GPU, D model dim, F ffn dim, KV the
 * k/v width (kv_heads x head_dim), W a block's linear weights (elements).
 *
 *   GEMMs        forward 2 T W FLOPs, backward 4 T W (+ the forward again
 *                under activation checkpointing), at the chip's bf16 or
 *                fp8 rate
 *   attention    causal, fused: forward 2 b s^2 D FLOPs (half of 4 b s^2 D),
 *                backward 2.5x the forward, at the attention rate
 *   elementwise  2 norms, rope, SwiGLU, 2 residual adds: 14 D + 4 KV + 3 F
 *                bf16 elements moved per token forward, twice that
 *                backward, at the copy rate
 *   casts        fp8 compute (dynamic tensorwise): each linear's input read
 *                for its amax, read and written as fp8 (5 bytes per
 *                element); backward the same for the output grad, plus the
 *                fp8 transposes of both (2 bytes each)
 *   collectives  per block: all-gather of its weights before the forward
 *                and again before the backward (bf16, or fp8 for the
 *                linears with the norms in bf16), reduce-scatter of its
 *                grads (f32 or bf16); fp8 all-gather scales agreed by one
 *                amax all-reduce per linear per all-gather, or by one
 *                combined all-reduce per step after the optimizer
 *   optimizer    AdamW on the local shard: read param, grad, m, v, write
 *                param, m, v (f32): 28 bytes per element, at the copy rate
 * The embedding and the LM head stay bf16 (what torchao and lpx leave in
 * high precision); the head's GEMM is 2 T D V forward, 4 T D V backward,
 * its loss 10 bytes per logit each way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"
#include "../train/train.h"

int pl_step_predict(const tr_geom *g, const pl_chip *c, const pl_net *net, const pl_step_opts *o, pl_step *out)
{
    memset(out, 0, sizeof *out);
    const double D = g->dim, F = g->hidden, KV = (double)g->kv_heads * g->head_dim, V = g->vocab, s = g->seq;
    const double T = (double)o->batch * s;
    const int L = g->layers, n = L + 2, N = o->gpus;
    pl_group *grp = calloc((size_t)n, sizeof *grp);
    if (!grp) return LPX_ENOMEM;
    double W = 2 * D * D + 2 * D * KV + 3 * D * F, P = W + 2 * D;   /* q, o; k, v; w1, w2, w3; two norms */
    double sum_in = 6 * D + F, sum_out = 3 * D + 2 * KV + 2 * F;
    double gemm_rate = o->fp8_compute ? c->fp8_flops : c->bf16_flops;
    double attn_rate = c->attn_flops > 0 ? c->attn_flops : c->bf16_flops;

    /* one block */
    double gf = 2 * T * W, gb = 4 * T * W + (o->ac ? gf : 0);
    out->blk_gemm_flops = gf + gb;
    out->blk_gemm = (gf + gb) / gemm_rate;
    double af = 2.0 * o->batch * s * s * D, ab = 2.5 * af + (o->ac ? af : 0);
    out->blk_attn_flops = af + ab;
    out->blk_attn = (af + ab) / attn_rate;
    double ef = 2 * T * (14 * D + 4 * KV + 3 * F), eb = 2 * ef + (o->ac ? ef : 0);
    out->blk_elem_bytes = ef + eb;
    out->blk_elem = (ef + eb) / c->hbm_bw;
    double cf = 0, cb = 0;
    if (o->fp8_compute) {
        cf = 5 * T * sum_in + (o->ac ? 5 * T * sum_in : 0);
        cb = 5 * T * sum_out + 2 * T * (sum_in + sum_out);
        /* the weights' casts, on the local shard before an fp8 all-gather, else on the gathered weight */
        double wcast = 5 * W / (o->fp8_all_gather ? N : 1);
        cf += wcast;
        cb += wcast;
    }
    out->blk_cast_bytes = cf + cb;
    out->blk_cast = (cf + cb) / c->hbm_bw;
    out->blk_ag_bytes = o->fp8_all_gather ? W + 2 * 2 * D : 2 * P;
    out->blk_ag = pl_coll_time(PL_ALL_GATHER, out->blk_ag_bytes, N, net);
    out->blk_amax = o->fp8_all_gather && o->amax == PL_AMAX_PER_PARAM
                        ? TR_LIN_PER_BLOCK * pl_coll_time(PL_ALL_REDUCE, 4, N, net) : 0;
    out->blk_rs_bytes = (o->reduce_f32 ? 4 : 2) * P;
    out->blk_rs = pl_coll_time(PL_REDUCE_SCATTER, out->blk_rs_bytes, N, net);
    double blk_fwd = gf / gemm_rate + af / attn_rate + ef / c->hbm_bw + cf / c->hbm_bw;
    double blk_bwd = out->blk_gemm + out->blk_attn + out->blk_elem + out->blk_cast - blk_fwd;
    for (int l = 0; l < L; l++)
        grp[l + 1] = (pl_group){blk_fwd, blk_bwd, out->blk_ag + out->blk_amax, out->blk_ag + out->blk_amax,
                                out->blk_rs};

    /* the embedding: a gather of rows, its grads scattered back */
    double emb = V * D;
    grp[0] = (pl_group){2 * T * D * 2 / c->hbm_bw, 3 * 2 * T * D * 2 / c->hbm_bw,
                        pl_coll_time(PL_ALL_GATHER, 2 * emb, N, net), pl_coll_time(PL_ALL_GATHER, 2 * emb, N, net),
                        pl_coll_time(PL_REDUCE_SCATTER, (o->reduce_f32 ? 4 : 2) * emb, N, net)};
    /* the root: final norm, LM head (bf16; tied: the embedding's weight, gathered again), the loss */
    double head = 2 * T * D * V;
    out->head_gemm = 3 * head / c->bf16_flops;
    double loss = 10 * T * V / c->hbm_bw, root_p = D + V * D;
    grp[n - 1] = (pl_group){head / c->bf16_flops + loss, 2 * head / c->bf16_flops + loss,
                            pl_coll_time(PL_ALL_GATHER, 2 * root_p, N, net),
                            pl_coll_time(PL_ALL_GATHER, 2 * root_p, N, net),
                            pl_coll_time(PL_REDUCE_SCATTER, (o->reduce_f32 ? 4 : 2) * root_p, N, net)};

    /* the optimizer on every local element; one combined amax all-reduce after it */
    double total = L * P + emb + (g->tied ? D : root_p);
    out->optimizer = (o->optim_bytes > 0 ? o->optim_bytes : 28) * total / N / c->hbm_bw;
    out->amax_tail = o->fp8_all_gather && o->amax == PL_AMAX_COMBINED
                         ? pl_coll_time(PL_ALL_REDUCE, 4.0 * TR_LIN_PER_BLOCK * L, N, net) : 0;
    pl_sched_opts so = {o->sm_share, out->optimizer, out->amax_tail};
    int rc = pl_schedule(grp, n, &so, &out->s);
    free(grp);
    if (rc != LPX_OK) return rc;

    /* the model's FLOPs (no recomputation): 6 T per weight, attention 3x
     * its forward. MFU: the time those FLOPs take at the chip's peaks (the
     * block GEMMs at the fp8 peak when they run in fp8, the rest at the
     * bf16 peak) over the step; at most 1 while no rate exceeds its peak
     * (chip.c refuses such a file): the step computes at least as long */
    out->model_flops = 6 * T * (L * W + V * D) + 3 * af * L;
    double gemm_peak = o->fp8_compute ? c->fp8_peak : c->bf16_peak;
    double at_peak = 6 * T * L * W / gemm_peak + (6 * T * V * D + 3 * af * L) / c->bf16_peak;
    out->tokens_per_gpu_s = T / out->s.step;
    out->mfu = at_peak / out->s.step;
    if (!isfinite(out->s.step) || !(out->s.step > 0) || !isfinite(out->mfu))
        return lpx_error(LPX_ERANGE, "plan: the step time is %g s: a rate or size out of range", out->s.step);
    if (out->mfu > 1 + 1e-9)
        return lpx_error(LPX_EINTERNAL, "plan: MFU %.4g%% is over 100%% (a rate above its peak in %s)",
                         100 * out->mfu, c->source);
    return LPX_OK;
}
