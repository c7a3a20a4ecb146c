/* `lpx train`: the rank loop, evaluation, sampling (the end-of-run report is report.c).
 *
 * One step on each rank: for each of its micro-batches (global index
 * rank * (micro / ranks) + j), forward (the engine unshards each group as
 * it is reached and prefetches the next; the groups behind are
 * resharded), backward (groups unsharded again in reverse order; in the
 * last micro-batch each group's grads are reduce-scattered as soon as
 * they are complete); then the engine's AdamW on the local shards and,
 * for float8-tensorwise, lpx_fsdp_precompute_scales: the one amax
 * all-reduce that fixes next step's fp8 weight scales. The summary's
 * collective counts and bytes come from lpx_fsdp_stats.
 *
 * Ranks share nothing writable but rank 0's result slots: each rank's
 * micro-batch and validation losses reach the others through the comm
 * (an all-gather of the f64 values, outside the engine's calls, so
 * lpx_fsdp_stats does not count it), which is what lets one rank per MPI
 * process (`--comm mpi`) run the same code as the local threads. Rank 0
 * keeps the results, prints and writes the files.
 *
 * Guards: the all-gather of the losses also carries each rank's count of
 * NaN/inf in its gradient shards, so every rank stops (or, with
 * --skip-nonfinite, skips the optimizer step) together; the weights are
 * checked after the optimizer. An error inside a step is reported with
 * the step and the rank ("step 7, rank 0: all_gather #41 ...: rank 2
 * aborted: ..."). Checkpoints (--save, --resume): ckpt.c. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rank.h"
#include "metrics.h"
#include "outfile.h"
#include "mem.h"
#include "hf.h"
#include "../lpx/commands.h"
#include "lpx/cuda.h"
#include "lpx/plugin.h"

typedef struct tr_shared {
    const tr_opts *o;
    tr_recipe recipe;
    int steps;
    const tr_geom *g;
    const tr_corpus *c;
    float *const *init;
    /* Written by rank 0 only, or by each rank where every rank has its
     * own tr_shared (per_process: one rank per process, --comm mpi) */
    bool per_process;
    double *val_loss;        /* [eval_batches] */
    double *val_start;       /* [eval_batches] */
    tr_result *res;
    float **final;           /* the trained masters are gathered here (may be NULL) */
    bool print;
    const char *label;
    /* steps [start, end) run here, of a schedule of `steps`; `main`: the
     * run that --save, --resume and the fault injections apply to */
    int start, end;
    bool main;
    const tr_ckpt *ck;       /* --resume */
    const char *hf_import;   /* --init DIR (Hugging Face): every rank reads its rows after setup */
    double val_start_mean;   /* recorded in checkpoints (NaN: none) */
    char (*err)[1024];       /* [o->ranks]: each rank's error message, to report the first */
} tr_shared;

static double now_s(void) { return (double)lpx_now_ns() * 1e-9; }

/* this rank writes the tr_shared slots (see per_process) */
static bool writes_shared(const tr_rank *R, const tr_shared *sh) { return sh->per_process || R->rank == 0; }

static lpx_status evaluate(tr_rank *R, tr_shared *sh, double *out)
{
    lpx_status st = LPX_OK;
    const tr_opts *o = R->o;
    int b = o->batch / o->micro;
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(b * o->seq)), *tgt = malloc(sizeof(int32_t) * (size_t)(b * o->seq));
    /* this rank's losses (slots of the others stay 0), then everyone's */
    double *mine = calloc((size_t)o->eval_batches, sizeof(double));
    double *all = malloc(sizeof(double) * (size_t)o->eval_batches * (size_t)R->world);
    tr_fwd f = {0};
    if (!idx || !tgt || !mine || !all) FAIL(LPX_ENOMEM, "train: out of memory");
    TRY(tr_recipe_reset_eval(R));
    /* every rank runs the same number of forwards (the unshards are
     * collectives): round k evaluates micro-batch k * world + rank, and a
     * rank past the end repeats one and drops the result */
    int rounds = (o->eval_batches + R->world - 1) / R->world;
    for (int k = 0; k < rounds; k++) {
        int v = k * R->world + R->rank;
        tr_batch(sh->c, o->seed, 0, v < o->eval_batches ? v : 0, true, b, o->seq, idx, tgt);
        TRY(tr_forward(R, &f, idx, tgt, b, o->seq, o->micro, 0, 1.0));
        if (v < o->eval_batches) mine[v] = f.loss;
        tr_fwd_clear(&f, R->g->layers);
        tr_reshard_all(R);
    }
    /* loss v was computed by rank v % world */
    TRY(tr_all_gather_host(R, mine, all, sizeof(double) * (size_t)o->eval_batches));
    if (writes_shared(R, sh))
        for (int v = 0; v < o->eval_batches; v++) out[v] = all[(size_t)(v % R->world) * (size_t)o->eval_batches + (size_t)v];
out:
    tr_fwd_clear(&f, R->g->layers);
    free(idx);
    free(tgt);
    free(mine);
    free(all);
    return st;
}

/* Greedy-ish sampling (temperature 0.8, fixed seed), continuing a prompt
 * from the validation text. Every rank runs it (each forward unshards
 * groups: collectives) and gets the same text; rank 0 keeps it. */
static lpx_status sample(tr_rank *R, tr_shared *sh, char *out, size_t cap)
{
    lpx_status st = LPX_OK;
    const tr_opts *o = R->o;
    const tr_corpus *c = sh->c;
    int n = o->sample_len, plen = 16;
    if ((size_t)n + (size_t)plen + 1 > cap) n = (int)cap - plen - 1;
    int32_t *ctx = malloc(sizeof(int32_t) * (size_t)(n + plen));
    float *lg = malloc(sizeof(float) * (size_t)c->vocab);
    tr_fwd f = {0};
    if (!ctx || !lg) FAIL(LPX_ENOMEM, "train: out of memory");
    TRY(tr_recipe_reset_eval(R));
    /* the prompt: a line start in the validation text (token ids: its
     * first tokens) */
    size_t at = c->n_train;
    while (c->bytes && at + (size_t)plen + 1 < c->n && c->tok[at] != '\n') at++;
    if (c->bytes && at + (size_t)plen + 1 < c->n) at++;
    else at = c->n_train;
    for (int i = 0; i < plen; i++) ctx[i] = c->tok[at + (size_t)i];
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ o->seed;
    int len = plen;
    for (int i = 0; i < n; i++) {
        int t = len < o->seq ? len : o->seq;
        TRY(tr_forward(R, &f, ctx + len - t, NULL, 1, t, o->micro, 0, 1.0));
        TRY(tr_row_to_host(f.logits, t - 1, lg));   /* the last position's logits (from the GPU too) */
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < c->vocab; v++) mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < c->vocab; v++) sum += exp((lg[v] - mx) / 0.8);
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(rng >> 11) / 9007199254740992.0 * sum, acc = 0;
        int pick = c->vocab - 1;
        for (int v = 0; v < c->vocab; v++) {
            acc += exp((lg[v] - mx) / 0.8);
            if (acc >= u) {
                pick = v;
                break;
            }
        }
        ctx[len++] = pick;
        tr_fwd_clear(&f, R->g->layers);
        tr_reshard_all(R);
    }
    if (c->bytes) {
        for (int i = 0; i < len; i++) out[i] = ctx[i] ? (char)ctx[i] : ' ';
        out[len] = 0;
    } else {
        /* token ids: no tokenizer here to print them as text */
        size_t k = 0;
        for (int i = 0; i < len && k + 12 < cap; i++) k += (size_t)snprintf(out + k, cap - k, "%s%d", i ? " " : "", ctx[i]);
    }
out:
    tr_fwd_clear(&f, R->g->layers);
    free(ctx);
    free(lg);
    return st;
}

/* the name of trainable (p, which): which 1 / 2 are p's LoRA A / B */
static void tparam_name(const tr_geom *g, int p, int which, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s", g->p[p].name, which == 1 ? ".lora_a" : which == 2 ? ".lora_b" : "");
}

/* NaN and inf in t (dense; any float dtype, any device: on a GPU one
 * amax says whether to look closer, and only then are the values read back) */
static lpx_status count_nonfinite(lpx_tensor *t, int64_t *nan, int64_t *inf)
{
    lpx_tensor *c = NULL, *h = NULL;
    *nan = *inf = 0;
    if (!t || !lpx_tensor_numel(t)) return LPX_OK;
    if (lpx_tensor_device(t).type != LPX_DEVICE_CPU) {
        lpx_tensor *s = NULL;
        double v = 0;
        lpx_status st = lpx_amax(t, 0, NULL, false, &s);   /* NaN and inf propagate */
        if (st == LPX_OK) st = lpx_item(s, 0, &v);
        lpx_tensor_release(s);
        if (st != LPX_OK || isfinite(v)) return st;
        if ((st = lpx_tensor_to(t, lpx_cpu(), &h)) != LPX_OK) return st;
        st = count_nonfinite(h, nan, inf);
        lpx_tensor_release(h);
        return st;
    }
    if (lpx_tensor_dtype(t) != LPX_F32 || !lpx_tensor_is_contiguous(t)) {
        lpx_status st = lpx_cast(t, LPX_F32, false, &c);
        if (st != LPX_OK) return st;
        t = c;
    }
    const float *d = lpx_tensor_data(t);
    for (int64_t i = 0, n = lpx_tensor_numel(t); i < n; i++) {
        if (isnan(d[i])) ++*nan;
        else if (isinf(d[i])) ++*inf;
    }
    lpx_tensor_release(c);
    return LPX_OK;
}

/* The first trainable tensor of this rank with NaN/inf: q = {p, which,
 * nan, inf} (p -1: none). grads: the reduce-scattered grad shards, else
 * the weights (the f32 masters, nf4-qlora's adapters). */
static lpx_status scan_local(tr_rank *R, bool grads, int64_t q[4])
{
    const tr_geom *g = R->g;
    q[0] = q[1] = -1;
    q[2] = q[3] = 0;
    for (int p = 0; p < g->nparams; p++) {
        bool qlora = R->recipe == TR_NF4_QLORA;
        if (qlora && g->p[p].kind != TR_P_LIN) continue;
        lpx_fsdp_group *G = R->grp[g->p[p].group];
        for (int which = qlora ? 1 : 0; which <= (qlora ? 2 : 0); which++) {
            int i = which == 0 ? R->gi[p] : which == 1 ? R->ai[p] : R->bi[p];
            lpx_tensor *t = grads ? lpx_fsdp_param_grad(G, i) : which == 0 ? R->master[p] : lpx_fsdp_param_local(G, i);
            int64_t nan, inf;
            lpx_status st = count_nonfinite(t, &nan, &inf);
            if (st != LPX_OK) return st;
            if (nan + inf) {
                q[0] = p;
                q[1] = which;
                q[2] = nan;
                q[3] = inf;
                return LPX_OK;
            }
        }
    }
    return LPX_OK;
}

/* After the backward, before the optimizer: every rank's micro-batch
 * losses and the NaN/inf count of its gradient shards travel in ONE
 * all-gather (the losses land in chunk_loss), so every rank takes the same
 * decision: go on, skip the optimizer step (--skip-nonfinite) or stop with
 * the step, the parameter and the rank in the message. */
static lpx_status check_step(tr_rank *R, tr_shared *sh, double *chunk_loss, int nloc, bool *skip)
{
    lpx_status st = LPX_OK;
    const tr_opts *o = R->o;
    size_t block = sizeof(double) * (size_t)nloc + 4 * sizeof(int64_t);
    unsigned char *send = malloc(block), *all = malloc(block * (size_t)R->world);
    char msg[512] = "";
    int64_t q[4];
    *skip = false;
    if (!send || !all) FAIL(LPX_ENOMEM, "train: out of memory");
    TRY(scan_local(R, true, q));
    memcpy(send, chunk_loss + (size_t)R->rank * (size_t)nloc, sizeof(double) * (size_t)nloc);
    memcpy(send + sizeof(double) * (size_t)nloc, q, sizeof q);
    TRY(tr_all_gather_host(R, send, all, block));
    for (int r = 0; r < R->world; r++)
        memcpy(chunk_loss + (size_t)r * (size_t)nloc, all + (size_t)r * block, sizeof(double) * (size_t)nloc);
    for (int k = 0; k < o->micro && !msg[0]; k++)
        if (!isfinite(chunk_loss[k]))
            snprintf(msg, sizeof msg, "step %d: non-finite loss (%g) in micro-batch %d (rank %d)", R->step + 1,
                     chunk_loss[k], k, k / nloc);
    for (int r = 0; r < R->world && !msg[0]; r++) {
        memcpy(q, all + (size_t)r * block + sizeof(double) * (size_t)nloc, sizeof q);
        if (q[0] < 0) continue;
        char name[64];
        tparam_name(R->g, (int)q[0], (int)q[1], name, sizeof name);
        snprintf(msg, sizeof msg, "step %d: non-finite gradient in parameter %s (rank %d): %lld NaN, %lld inf",
                 R->step + 1, name, r, (long long)q[2], (long long)q[3]);
    }
    if (msg[0]) {
        if (!o->skip_nonfinite) FAIL(LPX_ENUMERIC, "%s; stopping (--skip-nonfinite skips such steps)", msg);
        *skip = true;
        if (writes_shared(R, sh)) sh->res->skipped++;
        if (R->rank == 0) {
            fflush(stdout);
            fprintf(stderr, "lpx train: %s; optimizer step skipped (--skip-nonfinite)\n", msg);
        }
    }
out:
    free(send);
    free(all);
    return st;
}

/* After the optimizer step: no NaN/inf in any weight (one all-gather of
 * each rank's count), else stop with the step, parameter and rank. */
static lpx_status check_weights(tr_rank *R)
{
    lpx_status st = LPX_OK;
    int64_t q[4], *all = malloc(sizeof q * (size_t)R->world);
    if (!all) FAIL(LPX_ENOMEM, "train: out of memory");
    TRY(scan_local(R, false, q));
    TRY(tr_all_gather_host(R, q, all, sizeof q));
    for (int r = 0; r < R->world; r++) {
        int64_t *x = all + 4 * r;
        if (x[0] < 0) continue;
        char name[64];
        tparam_name(R->g, (int)x[0], (int)x[1], name, sizeof name);
        FAIL(LPX_ENUMERIC, "step %d: non-finite weight in parameter %s (rank %d) after the optimizer step: %lld NaN, "
             "%lld inf", R->step + 1, name, r, (long long)x[2], (long long)x[3]);
    }
out:
    free(all);
    return st;
}

/* --save: every rank gathers, rank 0 writes (ckpt.c) */
static lpx_status save_now(tr_rank *R, tr_shared *sh, int done)
{
    tr_ckpt_info info = {.dir = R->o->save_dir, .step = done, .vocab = sh->c->vocab, .skipped = sh->res->skipped,
                         .val_start = sh->val_start_mean, .hist = sh->res->rec, .data_path = sh->c->path};
    lpx_status st = tr_ckpt_save(R, &info);
    if (st == LPX_OK && R->rank == 0 && sh->print) {
        printf("  checkpoint %s: step %d\n", R->o->save_dir, done);
        fflush(stdout);
    }
    return st;
}

/* Keeps this rank's error for run_recipe to report; an error inside a
 * step (a failed collective, most often) is prefixed with the step and
 * the rank that saw it. */
static void record_error(const tr_rank *R, tr_shared *sh, lpx_status st, int step)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lpx_last_error()[0] ? lpx_last_error() : lpx_status_string(st));
    if (step >= 0 && strncmp(msg, "step ", 5)) {
        lpx_error(st, "step %d, rank %d: %s", step + 1, R->rank, msg);
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
    }
    if (sh->err && R->rank >= 0 && R->rank < sh->o->ranks) snprintf(sh->err[R->rank], sizeof sh->err[0], "%s", msg);
}

static lpx_status rank_main(lpx_comm *comm, void *arg)
{
    tr_shared *sh = arg;
    const tr_opts *o = sh->o;
    lpx_status st = LPX_OK;
    tr_rank *R = calloc(1, sizeof *R);
    int32_t *idx = NULL, *tgt = NULL;
    double *chunk_loss = NULL;   /* this step's micro-batch losses, all ranks' after the gather */
    tr_fwd f = {0};
    int cur = -1;                /* the step being run, for error messages */
    if (!R) return lpx_error(LPX_ENOMEM, "train: out of memory");
    R->o = o;
    R->g = sh->g;
    R->recipe = sh->recipe;
    R->comm = comm;
    R->rank = lpx_comm_rank(comm);
    R->world = lpx_comm_size(comm);
    R->inject = sh->main;
    if ((st = tr_device_setup(R)) != LPX_OK || (st = tr_rank_alloc(R)) != LPX_OK) {
        /* nothing set up yet: no teardown to run */
        record_error(R, sh, st, -1);
        tr_rank_free(R);
        free(R);
        return st;
    }
    int nloc = o->micro / R->world, b = o->batch / o->micro;
    idx = malloc(sizeof(int32_t) * (size_t)(b * o->seq));
    tgt = malloc(sizeof(int32_t) * (size_t)(b * o->seq));
    chunk_loss = calloc((size_t)o->micro, sizeof(double));
    if (!idx || !tgt || !chunk_loss) FAIL(LPX_ENOMEM, "train: out of memory");

    TRY(tr_shard_setup(R, sh->init));
    TRY(tr_recipe_setup(R));
    TRY(tr_model_setup(R));
    TRY(tr_adamw_setup(R));
    /* --resume: the optimizer and recipe state (the weights came as init) */
    if (sh->ck) {
        TRY(tr_ckpt_load_rank(R, sh->ck));
        TRY(tr_ckpt_loaded(R, sh->ck));
    }
    if (sh->hf_import) TRY(tr_hf_import(R, sh->hf_import));
    if (R->recipe == TR_F8_TENSORWISE) TRY(tr_precompute_scales(R));
    if (sh->val_start) {
        TRY(evaluate(R, sh, sh->val_start));
        if (writes_shared(R, sh)) {
            double v0 = 0;
            for (int i = 0; i < o->eval_batches; i++) v0 += sh->val_start[i];
            sh->val_start_mean = v0 / o->eval_batches;
        }
    }

    (void)tr_device_peak(R, true);   /* the GPU's peak over the steps, setup excluded */
    double t_run = now_s();
    for (int step = sh->start; step < sh->end; step++) {
        cur = step;
        R->step = step;
        lpx_fsdp_stats_reset(R->fsdp);
        double t0 = now_s();
        if (sh->main && o->inject_comm_step == step + 1 && o->inject_comm_rank == R->rank) {
            /* a failing rank: every pending and later collective fails */
            char why[128];
            snprintf(why, sizeof why, "injected fault (--inject-comm-fault %d:%d)", step + 1, R->rank);
            lpx_comm_abort(comm, why);
        }
        R->training = true;
        for (int j = 0; j < nloc; j++) {
            int gi = R->rank * nloc + j;
            R->cur_chunk = gi;
            tr_batch(sh->c, o->seed, step, gi, false, b, o->seq, idx, tgt);
            /* the mean over this rank's micro-batches (1/nloc); the
             * reduce-scatter averages over ranks */
            TRY(tr_forward(R, &f, idx, tgt, b, o->seq, gi, TR_FWD_GRADS, 1.0 / nloc));
            chunk_loss[gi] = f.loss;
            if (sh->main && o->inject_nan_step == step + 1 && gi == 0 && !strcmp(o->inject_nan_param, "loss"))
                chunk_loss[gi] = NAN;
            tr_mem_add(&R->mem, TR_MEM_ACT, R->act_bytes);
            TRY(tr_backward(R, &f, j == nloc - 1));
            tr_mem_add(&R->mem, TR_MEM_ACT, -R->act_bytes);
            tr_fwd_clear(&f, R->g->layers);
        }
        R->training = false;
        /* every rank's losses and non-finite grad counts (one all-gather,
         * outside the engine's calls, so not in its stats) */
        bool skip = false;
        TRY(check_step(R, sh, chunk_loss, nloc, &skip));
        double t_opt = now_s();
        if (!skip) TRY(tr_adamw_step(R, tr_lr_at(o, step, sh->steps)));
        if (R->recipe == TR_F8_TENSORWISE) TRY(tr_precompute_scales(R));
        if (!skip) TRY(check_weights(R));
        TRY(tr_device_sync(R));   /* on a GPU: the step's queued work is done */
        double t1 = now_s();
        if (R->rank == 0) {
            lpx_fsdp_stats fs = {.struct_size = sizeof fs};
            TRY(lpx_fsdp_stats_get(R->fsdp, &fs));
            uint64_t comm_ns = 0;
            for (int k = 0; k < LPX_COLL_COUNT; k++) {
                comm_ns += fs.ns[k];
                sh->res->coll_calls[k] = fs.calls[k];
                sh->res->coll_bytes[k] = fs.bytes[k];
            }
            sh->res->amax_allreduces = fs.amax_allreduces;
            sh->res->unshards = fs.unshards;
            if ((int64_t)fs.peak_unsharded_bytes > sh->res->peak_unsharded)
                sh->res->peak_unsharded = (int64_t)fs.peak_unsharded_bytes;
            if (fs.peak_unsharded_groups > sh->res->peak_unsharded_groups)
                sh->res->peak_unsharded_groups = fs.peak_unsharded_groups;
            double loss = 0;
            for (int k = 0; k < o->micro; k++) loss += chunk_loss[k];
            loss /= o->micro;
            tr_step_rec *rec = &sh->res->rec[step];
            rec->loss = loss;
            rec->tok_s = (double)o->batch * o->seq / (t1 - t0);
            rec->comm_ms = (double)comm_ns * 1e-6;
            rec->optim_ms = (t1 - t_opt) * 1e3;
            rec->compute_ms = (t_opt - t0) * 1e3 - rec->comm_ms;
            if (sh->print && (step == sh->start || (step + 1) % o->log_every == 0 || step + 1 == sh->end)) {
                char exact[48] = "";
                if (o->log_exact) snprintf(exact, sizeof exact, " [%a]", loss);
                printf("  %-18s step %4d/%d  loss %.4f%s  %7.0f tok/s  compute %6.1f ms  collectives %5.1f ms  "
                       "optimizer %5.1f ms%s\n", sh->label, step + 1, sh->steps, loss, exact, rec->tok_s,
                       rec->compute_ms, rec->comm_ms, rec->optim_ms, skip ? "  (skipped)" : "");
                fflush(stdout);
            }
        }
        if (sh->main && o->save_dir && o->save_every && (step + 1) % o->save_every == 0 && step + 1 < sh->end)
            TRY(save_now(R, sh, step + 1));
    }
    cur = -1;
    if (R->rank == 0) {
        sh->res->seconds = now_s() - t_run;
        sh->res->gpu_peak = tr_device_peak(R, false);
    }
    if (sh->main && o->save_dir) TRY(save_now(R, sh, sh->end));

    TRY(evaluate(R, sh, sh->val_loss));
    if (o->sample_len > 0) {
        char *buf = R->rank == 0 ? sh->res->sample : malloc(sizeof sh->res->sample);
        if (!buf) FAIL(LPX_ENOMEM, "train: out of memory");
        st = sample(R, sh, buf, sizeof sh->res->sample);
        if (buf != sh->res->sample) free(buf);
        if (st != LPX_OK) goto out;
    }
    TRY(lpx_comm_barrier(comm));
    tr_reshard_all(R);
    if (sh->final) TRY(tr_gather_masters(R, writes_shared(R, sh) ? sh->final : NULL));
    if (sh->main && o->save_hf) TRY(tr_hf_export(R, o->save_hf));
    if (R->rank == 0) {
        memcpy(sh->res->mem_peak, R->mem.peak, sizeof sh->res->mem_peak);
        /* the engine's peak of unsharded bytes (wire form: fp8, bf16, nf4) */
        sh->res->mem_peak[TR_MEM_UNSHARDED] = sh->res->peak_unsharded;
        for (int p = 0; p < R->g->nparams; p++) {
            const tr_param *P = &R->g->p[p];
            if (R->recipe == TR_NF4_QLORA && P->kind == TR_P_LIN) {
                int64_t shape[2] = {P->rows, P->cols}, nb = 0;
                lpx_nf4_config nc = tr_nf4_config(P->rows * P->cols);
                if (lpx_nf4_bytes(2, shape, &nc, &nb) == LPX_OK) sh->res->nf4_bytes += nb;
                sh->res->nf4_numel += P->rows * P->cols;
                sh->res->trainable += (int64_t)o->lora_rank * (P->rows + P->cols);
            } else if (R->recipe != TR_NF4_QLORA) {
                sh->res->trainable += P->rows * P->cols;
            }
        }
    }
out:
    if (st != LPX_OK) record_error(R, sh, st, cur);
    tr_fwd_clear(&f, R->g ? R->g->layers : 0);
    tr_adamw_teardown(R);
    tr_model_teardown(R);
    tr_recipe_teardown(R);
    tr_shard_teardown(R);
    tr_rank_free(R);
    free(R);
    free(idx);
    free(tgt);
    free(chunk_loss);
    return st;
}

/* Which steps a run covers, and whether it is the main one. */
typedef struct tr_span {
    int start, end;          /* steps [start, end) of a schedule of `steps` */
    bool main;
    const tr_ckpt *ck;
    const char *hf_import;   /* Hugging Face weights each rank reads its rows of */
} tr_span;

/* Runs one recipe over steps [span->start, span->end) of a `steps`-step
 * schedule from `init` on o->ranks ranks. */
static lpx_status run_recipe(const tr_opts *o, tr_recipe recipe, const char *label, int steps, const tr_span *span,
                             const tr_geom *g, const tr_corpus *c, float *const *init, float **final, bool eval_start,
                             tr_result *res)
{
    lpx_status st = LPX_OK;
    /* the local backend runs every rank as a thread of this process, on
     * this one tr_shared; other backends host one rank per process */
    tr_shared sh = {.o = o, .recipe = recipe, .steps = steps, .g = g, .c = c, .init = init, .res = res,
                    .final = final, .print = !o->quiet, .label = label, .per_process = tr_per_process(o, NULL, NULL),
                    .start = span->start, .end = span->end, .main = span->main, .ck = span->ck,
                    .hf_import = span->hf_import,
                    .val_start_mean = NAN};
    memset(res, 0, sizeof *res);
    res->label = label;
    res->recipe = recipe;
    res->steps = span->end;
    res->start = span->start;
    res->rec = calloc((size_t)span->end, sizeof *res->rec);
    sh.val_loss = calloc((size_t)o->eval_batches, sizeof(double));
    sh.err = calloc((size_t)o->ranks, sizeof *sh.err);
    /* a resumed run takes the validation loss before training from the checkpoint */
    if (eval_start && !span->ck) sh.val_start = calloc((size_t)o->eval_batches, sizeof(double));
    if (!res->rec || !sh.val_loss || !sh.err || (eval_start && !span->ck && !sh.val_start))
        FAIL(LPX_ENOMEM, "train: out of memory");
    if (span->ck) {
        for (int s = 0; s < span->start && s < span->ck->nhist; s++) res->rec[s] = span->ck->hist[s];
        res->skipped = span->ck->skipped;
        sh.val_start_mean = span->ck->val_start;
    }
    if (!o->quiet) {
        if (span->start) printf("%s: steps %d..%d of %d on %d %s ranks\n", label, span->start + 1, span->end, steps,
                                o->ranks, o->comm);
        else printf("%s: %d steps on %d %s ranks\n", label, span->end, o->ranks, o->comm);
        fflush(stdout);
    }
    st = lpx_comm_run(o->comm, o->ranks, 0, rank_main, &sh, NULL);
    if (st != LPX_OK) {
        /* the first failing rank's message, without the runner's prefix;
         * a rank that only says another one failed ("rank N failed ...;
         * see its error") gives way to the one that did */
        int pick = -1;
        for (int r = 0; r < o->ranks; r++)
            if (sh.err[r][0] && (pick < 0 || (strstr(sh.err[pick], "see its error") && !strstr(sh.err[r], "see its error"))))
                pick = r;
        if (pick >= 0) st = lpx_error(st, "%s", sh.err[pick]);
        goto out;
    }
    double v = 0;
    for (int i = 0; i < o->eval_batches; i++) v += sh.val_loss[i];
    res->val_loss = v / o->eval_batches;
    res->val_loss_start = sh.val_start_mean;
    double tl = 0;
    int k = span->end < 10 ? span->end : 10;
    for (int i = span->end - k; i < span->end; i++) tl += res->rec[i].loss;
    res->train_loss = tl / k;
out:
    free(sh.val_loss);
    free(sh.val_start);
    free(sh.err);
    return st;
}

/* ---- initial weights, checkpoints ---- */

static lpx_status init_params(const tr_geom *g, uint64_t seed, float **w)
{
    lpx_status st = LPX_OK;
    lpx_tensor *t = NULL;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        int64_t n = P->rows * P->cols;
        if (P->kind == TR_P_NORM || P->kind == TR_P_NORMF) {
            for (int64_t i = 0; i < n; i++) w[p][i] = 1.0f;
            continue;
        }
        /* transformers' LlamaForCausalLM (_init_weights): normal(0,
         * initializer_range 0.02) for the embedding, every linear and an
         * untied head; ones for the norms. The logits then start near
         * uniform at any width (first loss ~ ln(vocab)) */
        const double std = 0.02;
        int64_t shape[1] = {n};
        TRY(lpx_randn(1, shape, seed * 1000003u + (uint64_t)p, LPX_F32, lpx_cpu(), &t));
        const float *r = lpx_tensor_data(t);
        for (int64_t i = 0; i < n; i++) w[p][i] = (float)(r[i] * std);
        REL(t);
    }
out:
    lpx_tensor_release(t);
    return st;
}

#define CKPT_MAGIC 0x32504B43u /* "CKP2": the Llama 3 model */

/* model.bin: magic, vocab, dim, layers, heads, seq, nparams, kv_heads,
 * ffn, tied (u32 each), then every parameter's f32 values in order.
 * Written atomically. */
static lpx_status save_ckpt(const char *dir, const tr_geom *g, float *const *w)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    tr_outfile o;
    lpx_status st = tr_outfile_open("--out", path, &o);
    if (st != LPX_OK) return st;
    FILE *f = o.f;
    uint32_t h[10] = {CKPT_MAGIC, (uint32_t)g->vocab, (uint32_t)g->dim, (uint32_t)g->layers, (uint32_t)g->heads,
                      (uint32_t)g->seq, (uint32_t)g->nparams, (uint32_t)g->kv_heads, (uint32_t)g->hidden, g->tied};
    bool ok = fwrite(h, sizeof h, 1, f) == 1;
    for (int p = 0; p < g->nparams && ok; p++)
        ok = fwrite(w[p], sizeof(float), (size_t)(g->p[p].rows * g->p[p].cols), f) ==
             (size_t)(g->p[p].rows * g->p[p].cols);
    if (!ok) {
        tr_outfile_abort(&o);   /* model.bin stays what it was */
        return lpx_error(LPX_EIO, "cannot write '%s': %s", path, strerror(errno));
    }
    return tr_outfile_commit(&o);
}

static lpx_status load_ckpt(const char *path, const tr_geom *g, float **w)
{
    FILE *f = fopen(path, "rb");
    if (!f) return lpx_error(LPX_EIO, "cannot open --init '%s'", path);
    uint32_t h[10];
    lpx_status st = LPX_OK;
    if (fread(h, sizeof h, 1, f) != 1 || h[0] != CKPT_MAGIC) {
        st = lpx_error(LPX_EINVAL, "--init '%s' is not an lpx train model.bin of this version (or give a Hugging Face "
                       "model directory)", path);
    } else if (h[1] != (uint32_t)g->vocab || h[2] != (uint32_t)g->dim || h[3] != (uint32_t)g->layers ||
               h[4] != (uint32_t)g->heads || h[5] != (uint32_t)g->seq || h[6] != (uint32_t)g->nparams ||
               h[7] != (uint32_t)g->kv_heads || h[8] != (uint32_t)g->hidden || h[9] != (uint32_t)g->tied) {
        st = lpx_error(LPX_EINVAL,
                       "--init '%s' has vocab %u dim %u layers %u heads %u kv heads %u ffn %u seq %u; this run has "
                       "%d %d %d %d %d %d %d", path, h[1], h[2], h[3], h[4], h[7], h[8], h[5], g->vocab, g->dim,
                       g->layers, g->heads, g->kv_heads, g->hidden, g->seq);
    } else {
        for (int p = 0; p < g->nparams && st == LPX_OK; p++)
            if (fread(w[p], sizeof(float), (size_t)(g->p[p].rows * g->p[p].cols), f) !=
                (size_t)(g->p[p].rows * g->p[p].cols))
                st = lpx_error(LPX_EIO, "--init '%s' is truncated", path);
    }
    fclose(f);
    return st;
}

static float **alloc_params(const tr_geom *g)
{
    float **w = calloc((size_t)g->nparams, sizeof *w);
    if (!w) return NULL;
    for (int p = 0; p < g->nparams; p++)
        if (!(w[p] = malloc(sizeof(float) * (size_t)(g->p[p].rows * g->p[p].cols)))) {
            for (int q = 0; q < p; q++) free(w[q]);
            free(w);
            return NULL;
        }
    return w;
}

static void free_params(const tr_geom *g, float **w)
{
    if (!w) return;
    for (int p = 0; p < g->nparams; p++) free(w[p]);
    free(w);
}

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

/* data/corpus.txt from the working directory, else from the source tree
 * next to the build directory of this executable */
static void default_corpus(char *out, size_t n)
{
    snprintf(out, n, "data/corpus.txt");
    if (file_exists(out)) return;
    char exe[1024];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return;
    exe[k] = 0;
    static const char *const rel[] = {"/../../../data/corpus.txt", "/../share/lpx/corpus.txt"};
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        snprintf(out, n, "%s%s", exe, rel[i]);
        if (file_exists(out)) return;
    }
    snprintf(out, n, "data/corpus.txt");
}

/* Ranks are threads: BLAS threads on top of them oversubscribe the cores
 * (5x slower on 2 cores). One BLAS thread per rank, unless the user chose
 * with OPENBLAS_NUM_THREADS. */
static void one_blas_thread(void)
{
    if (getenv("OPENBLAS_NUM_THREADS")) return;
    void (*set)(int) = (void (*)(int))(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
    if (set) set(1);
}

/* --comm mpi: this process's rank and the world size, before any work */
static lpx_status probe_world(lpx_comm *comm, void *ctx)
{
    int *rw = ctx;
    rw[0] = lpx_comm_rank(comm);
    rw[1] = lpx_comm_size(comm);
    return LPX_OK;
}

/* --inject-nan's PARAM: "loss", or a parameter with a gradient */
static bool inject_target_ok(const tr_opts *o, const tr_geom *g)
{
    const char *w = o->inject_nan_param;
    if (!w[0] || !strcmp(w, "loss")) return true;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        char a[64], b[64];
        snprintf(a, sizeof a, "%s.lora_a", P->name);
        snprintf(b, sizeof b, "%s.lora_b", P->name);
        if (o->recipe == TR_NF4_QLORA ? P->kind == TR_P_LIN && (!strcmp(w, P->name) || !strcmp(w, a) || !strcmp(w, b))
                                      : !strcmp(w, P->name))
            return true;
    }
    return false;
}

static int train_run(tr_opts *op, const tr_ckpt *ck);

/* A model too big for this machine is refused before anything is
 * allocated: every phase the run goes through (nf4-qlora's bf16
 * pre-training, the recipe, --compare's bf16 run), each the `lpx mem`
 * estimate of every rank (the local ranks share this process), the f32
 * model copies, the corpus and the modelled overhead (tr_mem_phases),
 * against the memory available now (MemAvailable, the cgroup's room). */
static bool fits_memory(const tr_opts *o, const tr_geom *g, bool lead, const tr_mem_run *mr)
{
    tr_mem_phase ph[3];
    int n = tr_mem_phases(o, g, mr, ph);
    tr_host_mem hm;
    tr_host_mem_read(&hm);
    for (int i = 0; i < n; i++) {
        if (ph[i].total <= hm.avail) continue;
        if (lead) {
            char have[320], need[32], rank[32], wc[32], ov[32];
            tr_host_mem_describe(&hm, have, sizeof have);
            tr_mem_human(need, sizeof need, ph[i].total);
            tr_mem_human(rank, sizeof rank, ph[i].per_rank);
            tr_mem_human(wc, sizeof wc, ph[i].weights + ph[i].corpus);
            tr_mem_human(ov, sizeof ov, ph[i].overhead);
            fprintf(stderr, "lpx train: the model (%lld params) needs about %s here in its %s phase (lpx mem: %s per "
                    "rank x %d ranks, plus %s of weights and corpus and %s of process overhead); this machine has %s\n",
                    (long long)tr_geom_numel(g), need, ph[i].label, rank, ph[i].ranks, wc, ov, have);
        }
        return false;
    }
    return true;
}

int lpx_cmd_train(int argc, char **argv)
{
    tr_opts o;
    bool help;
    int rc = tr_parse_train(argc, argv, &o, &help);
    if (help) {
        tr_train_usage(stdout);
        return 0;
    }
    if (rc) return rc;
    tr_ckpt ck;
    memset(&ck, 0, sizeof ck);
    if (o.resume_dir) {
        /* the manifest and every file's checksum first; then the options
         * not given on the command line come from it */
        if (tr_ckpt_open(o.resume_dir, &ck) != LPX_OK) {
            fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
        if ((rc = tr_ckpt_apply(&ck, &o))) {
            tr_ckpt_free(&ck);
            return rc;
        }
    }
    rc = train_run(&o, o.resume_dir ? &ck : NULL);
    tr_ckpt_free(&ck);
    return rc;
}

/* --device cuda: lpx-cuda.so with a GPU (loaded from LPX_PLUGIN_PATH or
 * next to this executable, then lpx-nccl.so needs it), and what the GPU
 * path does not do yet; 0, or 2 after one line */
static int check_cuda(const tr_opts *o)
{
    char why[600] = "";
    if (!lpx_backend_for(LPX_DEVICE_CUDA) && !lpx_tool_load_shipped("backends/cuda", "lpx-cuda.so"))
        snprintf(why, sizeof why, "%s", lpx_last_error());   /* e.g. the plugin declined: no driver or GPU */
    lpx_clear_error();
    lpx_cuda_device_count_fn count = NULL;
    void *sym = lpx_tool_plugin_fn("cuda", LPX_CUDA_SYM_DEVICE_COUNT);
    memcpy(&count, &sym, sizeof sym);
    int n = count ? count() : 0;
    if (!lpx_backend_for(LPX_DEVICE_CUDA) || n <= 0) {
        if (lpx_backend_for(LPX_DEVICE_CUDA)) fprintf(stderr, "lpx train: --device cuda: lpx-cuda.so sees no GPU\n");
        else if (why[0]) fprintf(stderr, "lpx train: --device cuda: no CUDA backend: %s\n", why);
        else fprintf(stderr, "lpx train: --device cuda: no CUDA backend is loaded (lpx-cuda.so: build with CUDA, or "
                             "set LPX_PLUGIN_PATH to its directory)\n");
        return 2;
    }
    if (!tr_per_process(o, NULL, NULL) && o->ranks > n) {
        fprintf(stderr, "lpx train: --device cuda --ranks %d: this machine has %d GPU%s (one rank per GPU)\n",
                o->ranks, n, n == 1 ? "" : "s");
        return 2;
    }
    if (o->save_dir || o->resume_dir || o->save_hf || o->init_path) {
        fprintf(stderr, "lpx train: --device cuda: %s is not available on the GPU yet (the checkpoint and import "
                        "code reads host shards and agrees over host buffers, which NCCL refuses)\n",
                o->save_dir ? "--save" : o->resume_dir ? "--resume" : o->save_hf ? "--save-hf" : "--init");
        return 2;
    }
    return 0;
}

/* --device sim: lpx-simdev.so (from LPX_PLUGIN_PATH or next to this
 * executable), a device per rank, and what the device path does not do
 * yet (as on a GPU); 0, or 2 after one line */
static int check_sim(const tr_opts *o)
{
    if (!lpx_backend_for(LPX_DEVICE_SIM) && !lpx_tool_load_shipped("backends/simdev", "lpx-simdev.so")) {
        fprintf(stderr, "lpx train: --device sim: lpx-simdev.so is not loaded (%s)\n", lpx_last_error());
        return 2;
    }
    if (o->ranks > 8) {
        fprintf(stderr, "lpx train: --device sim --ranks %d: there are 8 simulated devices (one rank per device)\n",
                o->ranks);
        return 2;
    }
    if (tr_recipe_is_mx(o->recipe)) {
        fprintf(stderr, "lpx train: --device sim --recipe %s: the MX formats run on the CPU and on CUDA "
                        "(lpx-mx-cuda.so), not on the simulated device\n", tr_recipe_name(o->recipe));
        return 2;
    }
    if (o->save_dir || o->resume_dir || o->save_hf || o->init_path) {
        fprintf(stderr, "lpx train: --device sim: %s is not available on a device yet (as on a GPU: the checkpoint and "
                        "import code reads host shards)\n",
                o->save_dir ? "--save" : o->resume_dir ? "--resume" : o->save_hf ? "--save-hf" : "--init");
        return 2;
    }
    return 0;
}

static int train_run(tr_opts *op, const tr_ckpt *ck)
{
    tr_opts o = *op;

    /* refuse what this build cannot do with one line and exit 2. A comm
     * backend's plugin (lpx-mpi.so) comes through LPX_PLUGIN_PATH or from
     * next to this executable, as lpx-mx.so does. */
    if (!strcmp(o.device, "cuda") || !strcmp(o.device, "sim")) {
        int rc = !strcmp(o.device, "cuda") ? check_cuda(&o) : check_sim(&o);
        if (rc) return rc;
    }
    const lpx_comm_backend_i *be = NULL;
    if (lpx_comm_backend_find(o.comm, &be) != LPX_OK) {
        char dir[64], file[64];
        snprintf(dir, sizeof dir, "backends/%s", o.comm);
        snprintf(file, sizeof file, "lpx-%s.so", o.comm);
        if (!lpx_tool_load_shipped(dir, file) || lpx_comm_backend_find(o.comm, &be) != LPX_OK) {
            fprintf(stderr, "lpx train: --comm %s is not available in this build (load its plugin, e.g. lpx-%s.so, "
                            "through LPX_PLUGIN_PATH)\n", o.comm, o.comm);
            return 2;
        }
    }
    /* lead: this process prints and writes the files (rank 0 of MPI, or of
     * a launcher's NCCL world) */
    bool lead = true;
    int env_rank = -1, env_world = -1;
    if (!strcmp(o.comm, "mpi")) {
        /* one rank per process: --ranks is the world size (checked if given) */
        int rw[2] = {0, 0};
        if (lpx_comm_run(o.comm, 0, 0, probe_world, rw, NULL) != LPX_OK) {
            fprintf(stderr, "lpx train: --comm mpi: %s\n", lpx_last_error());
            return 2;
        }
        lead = rw[0] == 0;
        if (o.ranks_given && o.ranks != rw[1]) {
            if (lead)
                fprintf(stderr, "lpx train: --ranks %d but the MPI world has %d processes (mpirun -np %d, or leave "
                                "--ranks out)\n", o.ranks, rw[1], o.ranks);
            return 2;
        }
        o.ranks = rw[1];
        if (o.micro % o.ranks) {
            if (lead) tr_check_ranks(&o);
            return 2;
        }
        if (!lead) o.quiet = true;
    } else if (tr_per_process(&o, &env_rank, &env_world)) {
        /* --comm nccl, one process per GPU: the launcher's world (no probe:
         * that would set NCCL up twice) */
        if (env_world < 1 || env_rank < 0 || env_rank >= env_world) {
            fprintf(stderr, "lpx train: --comm nccl under a launcher: LPX_RANK/LPX_WORLD_SIZE (or Open MPI's "
                            "OMPI_COMM_WORLD_RANK/_SIZE) must give a rank of 0..world-1\n");
            return 2;
        }
        lead = env_rank == 0;
        if (o.ranks_given && o.ranks != env_world) {
            if (lead)
                fprintf(stderr, "lpx train: --ranks %d but the launcher started %d processes (leave --ranks out)\n",
                        o.ranks, env_world);
            return 2;
        }
        o.ranks = env_world;
        if (o.micro % o.ranks) {
            if (lead) tr_check_ranks(&o);
            return 2;
        }
        if (!lead) o.quiet = true;
    }
    if (o.inject_comm_step && o.inject_comm_rank >= o.ranks) {
        if (lead) fprintf(stderr, "lpx train: --inject-comm-fault %d:%d: there are %d ranks\n", o.inject_comm_step,
                          o.inject_comm_rank, o.ranks);
        return 2;
    }
    if (tr_recipe_is_mx(o.recipe)) {
        const lpx_kind *k;
        if (tr_mx_kind(o.recipe, &k) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
    }

    /* every output path is checked before the first step, not after the run */
    if (o.save_dir && tr_ckpt_check_target(o.save_dir) != LPX_OK) {
        if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
        return 2;
    }
    /* --out and --save-hf: directories (or absent, with a writable parent)
     * whose files may be written: a FIFO or a device there is refused now */
    static const char *const out_files[] = {"metrics.csv", "loss.svg", "model.bin"};
    static const char *const hf_files[] = {"config.json", "model.safetensors"};
    if (tr_check_out_dir("--out", o.out_dir, out_files, 3) != LPX_OK ||
        (o.save_hf && tr_check_out_dir("--save-hf", o.save_hf, hf_files, 2) != LPX_OK) ||
        tr_check_output_clash(o.save_dir, o.out_dir, o.save_hf, o.init_path) != LPX_OK) {
        if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
        return 2;
    }
    /* --init DIR: a Hugging Face model directory sets the model */
    struct stat ist;
    bool hf_init = o.init_path && stat(o.init_path, &ist) == 0 && S_ISDIR(ist.st_mode);
    const char *hf_rows = NULL;   /* --init DIR imported by rows on the ranks */
    if (hf_init) {
        const unsigned arch_given = TR_GIVEN_MODEL | TR_GIVEN_DIM | TR_GIVEN_LAYERS | TR_GIVEN_HEADS |
                                    TR_GIVEN_KV_HEADS | TR_GIVEN_FFN | TR_GIVEN_VOCAB | TR_GIVEN_ROPE_THETA |
                                    TR_GIVEN_TIED;
        if (o.given & arch_given) {
            if (lead) fprintf(stderr, "lpx train: --init '%s' sets the model from its config.json; leave out --model, "
                              "--dim, --layers, --heads, --kv-heads, --ffn, --vocab, --rope-theta and --tied\n",
                              o.init_path);
            return 2;
        }
        if (tr_hf_config(o.init_path, &o.m) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
        if (tr_arch_check(&o.m, "lpx train")) return 2;
        /* the tokenizer and the other files --save-hf copies: a different
         * file of the user's there is refused now, not after the run */
        if (o.save_hf && tr_hf_check_copy(o.init_path, o.save_hf, lead ? stderr : NULL) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
    } else if (o.init_path && o.recipe != TR_NF4_QLORA) {
        if (lead) fprintf(stderr, "lpx train: --init '%s' is not a directory: a model.bin is a base for --recipe "
                          "nf4-qlora; other recipes start from a Hugging Face model directory\n", o.init_path);
        return 2;
    }

    one_blas_thread();
    char cpath[1200];
    if (o.data_path) snprintf(cpath, sizeof cpath, "%s", o.data_path);
    else default_corpus(cpath, sizeof cpath);
    tr_corpus corpus;
    if (tr_corpus_load(cpath, o.m.vocab, o.tokens_dtype, &corpus) != LPX_OK) {
        if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
        return 2;
    }
    o.m.vocab = corpus.vocab;
    if (corpus.n - corpus.n_train < (size_t)o.seq + 2) {
        if (lead) fprintf(stderr, "lpx train: corpus '%s' is too small for --seq %d\n", cpath, o.seq);
        tr_corpus_free(&corpus);
        return 2;
    }
    tr_geom *g = calloc(1, sizeof *g);
    tr_result res[3];
    int nres = 0, main_idx = 0, base_idx = -1, rc = 1;
    float **init = NULL, **base = NULL, **final = NULL;
    lpx_status st = LPX_OK;
    memset(res, 0, sizeof res);
    if (!g) FAIL(LPX_ENOMEM, "out of memory");
    TRY(tr_geom_init(g, &o.m, o.seq, o.wrap_linear));
    tr_mem_run mr = {.pretrain = o.recipe == TR_NF4_QLORA && !ck && !hf_init && !o.init_path,
                     .compare = o.compare, .weight_copies = o.recipe == TR_NF4_QLORA && !ck && !hf_init ? 2 : 1,
                     .corpus_bytes = (double)corpus.n * sizeof *corpus.tok};
    if (!fits_memory(&o, g, lead, &mr)) {
        rc = 2;
        goto out;
    }
    /* a byte corpus under a tokenizer's vocabulary (--model llama3.2-1b
     * without --data FILE.bin) trains 256 of its rows: said (once the run
     * is known to fit), not refused */
    if (corpus.bytes && o.m.vocab > 256 && lead)
        fprintf(stderr, "lpx train: warning: corpus '%s' is text read as bytes (token ids 0..255) but the model's "
                        "vocabulary is %d: %d embedding rows never see a token; give --data FILE.bin with the ids of "
                        "the model's tokenizer\n", cpath, o.m.vocab, o.m.vocab - 256);
    if (!inject_target_ok(&o, g)) {
        if (lead) fprintf(stderr, "lpx train: --inject-nan: no parameter '%s' with a gradient (e.g. b0.wq%s, or loss)\n",
                          o.inject_nan_param, o.recipe == TR_NF4_QLORA ? ".lora_a" : "");
        rc = 2;
        goto out;
    }
    if (ck && ck->data_bytes && lead) {
        uint64_t h = 0, n = 0;
        if (tr_file_fnv(cpath, &h, &n) != LPX_OK || h != ck->data_fnv || n != ck->data_bytes)
            fprintf(stderr, "lpx train: warning: --resume: corpus '%s' is not the checkpoint's ('%s'); its batches "
                            "continue at step %d of this one\n", cpath, ck->data_path, ck->step + 1);
    }
    init = alloc_params(g);
    if (!init) FAIL(LPX_ENOMEM, "out of memory");
    if (ck) {
        /* the checkpoint's weights, every name and shape checked: a
         * mismatch is refused like a bad option (exit 2) */
        if (tr_ckpt_check_model(ck, g, &o) != LPX_OK ||
            (ck->sharded ? init_params(g, o.seed, init) : tr_ckpt_v2_load_weights(ck, g, &o, init)) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            rc = 2;
            goto out;
        }
    } else if (hf_init) {
        /* every name and shape checked here; the weights themselves: each
         * rank imports its rows after setup (tr_hf_import), except
         * nf4-qlora, whose frozen base is quantized whole */
        bool whole = o.recipe == TR_NF4_QLORA;
        if (tr_hf_load(o.init_path, g, whole ? init : NULL) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            rc = 2;
            goto out;
        }
        if (!whole) {
            TRY(init_params(g, o.seed, init));   /* the shape of the model, overwritten by the import */
            hf_rows = o.init_path;
        }
    } else {
        TRY(init_params(g, o.seed, init));
    }
    /* the weights are in and checked: from here on the run writes */
    if (lead && mkdir(o.out_dir, 0777) != 0 && access(o.out_dir, W_OK) != 0)
        FAIL(LPX_EIO, "cannot create --out '%s'", o.out_dir);
    if (!o.quiet)
        printf("lpx train: %s on %d %s ranks, corpus %s (%zu %s, vocab %d), %lld params, wrap %s\n",
               tr_recipe_name(o.recipe), o.ranks, o.comm, cpath, corpus.n, corpus.bytes ? "bytes" : "tokens",
               corpus.vocab, (long long)tr_geom_numel(g), o.wrap_linear ? "linear" : "block");
    if (ck && !o.quiet) {
        printf("  resuming %s at step %d (checkpoint: %s on %d ranks; now %s on %d)\n", ck->dir, ck->step,
               tr_recipe_name(ck->cfg.recipe), ck->cfg.ranks, tr_recipe_name(o.recipe), o.ranks);
        if (o.recipe == TR_F8_DELAYED && !ck->has_recipe_state)
            printf("  the checkpoint holds no float8-delayed amax histories (recipe %s): they start empty\n",
                   tr_recipe_name(ck->cfg.recipe));
    }
    if (hf_init && !o.quiet) printf("  initial weights: %s (Hugging Face)\n", o.init_path);

    if (o.recipe == TR_NF4_QLORA && (ck || hf_init)) {
        /* the checkpoint's (or the Hugging Face model's) weights are the frozen base */
        base = init;
        init = NULL;
    } else if (o.recipe == TR_NF4_QLORA) {
        /* the base: --init, or a short bf16 pre-training run saved as DIR/model.bin */
        base = alloc_params(g);
        if (!base) FAIL(LPX_ENOMEM, "out of memory");
        if (o.init_path) {
            TRY(load_ckpt(o.init_path, g, base));
        } else {
            tr_span pre = {.start = 0, .end = o.pretrain_steps};
            TRY(run_recipe(&o, TR_BF16, "bf16-pretrain", o.pretrain_steps, &pre, g, &corpus, init, base, false,
                           &res[nres]));
            nres++;
            if (lead) TRY(save_ckpt(o.out_dir, g, base));
            if (!o.quiet) printf("  base checkpoint: %s/model.bin\n", o.out_dir);
        }
    }
    float *const *start = base ? base : init;
    tr_span span = {.start = ck ? ck->step : 0, .end = o.stop_after ? o.stop_after : o.steps, .main = true, .ck = ck,
                    .hf_import = hf_rows};
    TRY(lpx_trace_start(NULL));
    main_idx = nres;
    /* --save-hf: every rank writes its rows of the model at the end of
     * the run (tr_hf_export); config.json last */
    if (o.save_hf && lead) TRY(tr_hf_make_dir(o.save_hf));
    st = run_recipe(&o, o.recipe, tr_recipe_name(o.recipe), o.steps, &span, g, &corpus, start, final, true, &res[nres]);
    lpx_trace_stop();
    if (st != LPX_OK) goto out;
    nres++;
    if (o.save_hf && lead) {
        TRY(tr_hf_write_config(o.save_hf, g, hf_init ? o.init_path : NULL));
        if (!o.quiet) printf("  wrote %s (Hugging Face: config.json, model.safetensors)\n", o.save_hf);
    }
    if (o.compare && o.recipe != TR_BF16) {
        base_idx = nres;
        tr_span all = {.start = 0, .end = o.steps, .hf_import = hf_rows};
        TRY(run_recipe(&o, TR_BF16, "bf16", o.steps, &all, g, &corpus, start, NULL, true, &res[nres]));
        nres++;
    } else if (o.recipe == TR_BF16) {
        base_idx = main_idx;
    }
    if (!lead) goto out;    /* the other MPI ranks: rank 0 reports */
    tr_print_summary(&o, g, res, nres, main_idx, base_idx, &mr);
    tr_print_dispatch(&o);
    TRY(tr_write_metrics(o.out_dir, res, nres));
    printf("\nwrote %s/metrics.csv and %s/loss.svg\n", o.out_dir, o.out_dir);
    if (o.sample_len > 0) printf("\nsample (%s, temperature 0.8):\n%s\n", res[main_idx].label, res[main_idx].sample);
out:
    if (st != LPX_OK) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
    for (int r = 0; r < 3; r++) free(res[r].rec);
    if (g) {
        free_params(g, init);
        free_params(g, base);
        free_params(g, final);
        tr_geom_free(g);
    }
    free(g);
    tr_corpus_free(&corpus);
    return st != LPX_OK ? 1 : rc == 2 ? 2 : 0;
}
