/* `lpx train`: what a run measures, and the files it writes. */
#ifndef LPX_TRAIN_METRICS_H
#define LPX_TRAIN_METRICS_H

#include "train.h"

typedef struct tr_step_rec {
    double loss, tok_s, compute_ms, comm_ms;
    double optim_ms;                /* the AdamW step (not in checkpoints: 0 for resumed steps) */
} tr_step_rec;

/* Results of one recipe's run (filled by rank_loop.c). */
typedef struct tr_result {
    const char *label;              /* "float8-tensorwise", "bf16", "bf16-pretrain" */
    tr_recipe recipe;
    int steps;
    tr_step_rec *rec;               /* [steps] */
    double val_loss, val_loss_start, train_loss;
    double seconds;
    /* per step (rank 0's comm statistics, last step) */
    uint64_t coll_calls[LPX_COLL_MAX], coll_bytes[LPX_COLL_MAX];
    /* from lpx_fsdp_stats (rank 0): per step (last step), and the peak of
     * unsharded bytes over the run */
    uint64_t amax_allreduces, unshards;
    int64_t peak_unsharded;
    int peak_unsharded_groups;
    /* per rank peaks (rank 0), bytes */
    int64_t mem_peak[5];
    int64_t act_bytes;
    int64_t gpu_peak;               /* --device cuda: lpx-cuda's peak bytes on rank 0's GPU over the steps (-1: none) */
    int64_t nf4_bytes, nf4_numel;   /* frozen NF4 base weights (rank 0) */
    int64_t trainable;              /* parameters that get grads */
    int64_t optim_state_bytes, optim_master_bytes, optim_params; /* lpx_fsdp_optim_bytes on rank 0's shards */
    int start;                      /* first step this process ran (a resumed run: the checkpoint's) */
    int skipped;                    /* optimizer steps skipped for non-finite grads (--skip-nonfinite) */
    char sample[1024];
} tr_result;

/* Writes DIR/metrics.csv and DIR/loss.svg through a temp file + rename, so
 * an interrupted run leaves either the old file or none, never a partial
 * one. Errors: LPX_EIO with the path. */
lpx_status tr_write_metrics(const char *dir, const tr_result *res, int nres);

/* The end-of-run report on stdout (report.c): the summary of every recipe
 * run (res[main_idx] the main one, res[base_idx] the bf16 baseline or -1),
 * and the main recipe's dispatch counts from the trace. */
struct tr_mem_run;
/* mr: what the run went through (the process estimate beside the measured peak) */
void tr_print_summary(const tr_opts *o, const tr_geom *g, const tr_result *res, int nres, int main_idx, int base_idx,
                      const struct tr_mem_run *mr);
void tr_print_dispatch(const tr_opts *o);

#endif
