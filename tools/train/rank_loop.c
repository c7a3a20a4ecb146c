/* `lpx train`: the per-rank step loop, evaluation, sampling, and
 * tr_run_recipe, which runs one recipe on every rank (the launcher is
 * launch.c, the world world.c, the run's orchestration run.c, the
 * end-of-run report report.c).
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
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "rank.h"
#include "metrics.h"
#include "hf.h"

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
        /* the optimizer's bytes as held by rank 0's shards (measured) */
        TRY(lpx_fsdp_optim_bytes(R->fsdp, &sh->res->optim_state_bytes, &sh->res->optim_master_bytes,
                                 &sh->res->optim_params));
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


/* Runs one recipe over steps [span->start, span->end) of a `steps`-step
 * schedule from `init` on o->ranks ranks. */
lpx_status tr_run_recipe(const tr_opts *o, tr_recipe recipe, const char *label, int steps, const tr_span *span,
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
