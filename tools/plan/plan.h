/* `lpx plan`: a training step predicted from rates (docs/PLAN.md).
 *
 *   net.c       collective times from bytes, bus bandwidth and latency
 *               (ring for large messages, tree latency for small ones;
 *               intra- vs inter-node)
 *   schedule.c  FSDP's overlap: a compute stream and a comm stream, the
 *               prefetch order of FSDP2, NCCL's SM share slowing compute
 *   cost.c      one step of a Llama model: per block its GEMMs, attention,
 *               elementwise and casts (FLOPs and bytes over the chip's
 *               rates), its all-gathers, reduce-scatter and amax
 *               all-reduces, the optimizer
 *   chip.c      chip and network files (JSON, every number with its source)
 *   cmd_plan.c  the command line, the table, --explain, --json
 * Times are seconds, sizes bytes, rates bytes/s or FLOP/s. */
#ifndef LPX_PLAN_H
#define LPX_PLAN_H

#include <stdbool.h>
#include <stdint.h>

/* ---- net.c ---- */
typedef struct pl_net {
    double intra_bw;     /* bytes/s per GPU inside a node (bus bandwidth, NCCL's busbw) */
    double inter_bw;     /* bytes/s per GPU across nodes */
    double latency;      /* seconds per ring step (one hop) */
    int gpus_per_node;
} pl_net;

typedef enum pl_coll { PL_ALL_GATHER, PL_REDUCE_SCATTER, PL_ALL_REDUCE } pl_coll;

/* Time of collective k over n ranks whose full buffer is `bytes` (the
 * all-gather's output, the reduce-scatter's input, the all-reduce's
 * buffer), as NCCL's ring: (n-1)/n of the bytes cross each rank's link
 * (twice for an all-reduce) at the bus bandwidth of the slowest link the
 * ring uses (inter-node once it spans nodes), plus n-1 latencies (2(n-1)
 * for an all-reduce). An all-reduce of at most 64 KiB takes NCCL's tree
 * instead: 2 log2(n) latencies. 0 for n <= 1. */
double pl_coll_time(pl_coll k, double bytes, int n, const pl_net *net);
/* The bus bandwidth a ring over n ranks runs at. */
double pl_ring_bw(int n, const pl_net *net);

/* ---- schedule.c ---- */
/* One shard group (an FSDP unit): its compute and its collectives. */
typedef struct pl_group {
    double fwd, bwd;          /* compute, seconds at the full chip */
    double ag_fwd, ag_bwd;    /* all-gather before its forward / backward (0: none) */
    double rs;                /* reduce-scatter of its grads after its backward */
} pl_group;

typedef struct pl_sched_opts {
    double sm_share;          /* fraction of the SMs NCCL's kernels take while they run (0..0.9) */
    double tail;              /* compute after the last reduce-scatter (optimizer), seconds */
    double tail_comm;         /* exposed comm after it (one combined amax all-reduce), seconds */
} pl_sched_opts;

typedef struct pl_sched {
    double step;              /* wall time of the step */
    double compute;           /* compute at the full chip (sum of fwd + bwd + tail) */
    double comm;              /* sum of the collectives */
    double exposed_comm;      /* time the compute stream waited on the comm stream */
    double contention;        /* compute time added by NCCL's SM share */
    double fwd_end;           /* end of the forward */
} pl_sched;

/* Simulates one step of FSDP2 over groups g[0..n) in forward order: the
 * forward computes g[0..n), each after its all-gather; the all-gather of
 * group i+1 is issued when group i's forward starts (prefetch, at most two
 * groups unsharded); the backward computes g[n-1..0], the all-gather of
 * group i-1 issued when group i's backward starts, group i's
 * reduce-scatter when it ends; collectives run one at a time in issue
 * order on the comm stream. While a collective runs, compute proceeds at
 * (1 - sm_share) of its speed. The optimizer (tail) starts when every
 * backward and reduce-scatter is done; tail_comm follows it. */
int pl_schedule(const pl_group *g, int n, const pl_sched_opts *o, pl_sched *out);
/* Errors (message in lpx_last_error()): LPX_ERANGE when a time is negative
 * or not finite (nothing simulated), LPX_ENOMEM. */

/* ---- chip.c ---- */
/* The rates of one chip: achieved rates where a benchmark measured them,
 * else the published peaks (source says which). */
typedef struct pl_chip {
    char name[96], source[1200];
    double bf16_flops, fp8_flops;  /* dense GEMM FLOP/s */
    double attn_flops;             /* fused attention, bf16 (0: the bf16 GEMM rate) */
    double hbm_bw;                 /* bytes/s of a copy (elementwise ops, casts, the optimizer) */
    double bf16_peak;              /* FLOP/s the MFU is over (every FLOP but the fp8 GEMMs') */
    double fp8_peak;               /* FLOP/s the MFU of fp8 GEMMs is over (default 2x bf16_peak) */
    int sms;
    double memory;                 /* bytes */
} pl_chip;
/* Reads a chip file (JSON: {"name", "sms", "memory_gib", "bf16_tflops",
 * "fp8_tflops", "attention_tflops", "copy_gbs", "bf16_peak_tflops",
 * "fp8_peak_tflops", each number {"value": x, "source": "..."}});
 * `h100`/`h200` name the committed published-figures files (data/chips/).
 * Every number finite and in its range (sms a whole number), the achieved
 * rates at most their peaks (bf16 and attention <= bf16_peak, fp8 <=
 * fp8_peak, which defaults to twice bf16_peak). 0, or 2 after one line on
 * stderr naming the file and the field. */
int pl_chip_load(const char *name_or_path, const char *data_dir, pl_chip *out);

/* ---- cost.c ---- */
struct tr_geom;
typedef enum pl_amax { PL_AMAX_NONE, PL_AMAX_PER_PARAM, PL_AMAX_COMBINED } pl_amax;
typedef struct pl_step_opts {
    int gpus;
    int batch;                 /* sequences per GPU per step */
    bool fp8_compute;          /* the block linears' GEMMs in fp8 (tensorwise: casts counted) */
    bool fp8_all_gather;       /* the block linears' weights gathered in fp8 */
    pl_amax amax;              /* how the fp8 all-gather's scales are agreed */
    bool ac;                   /* activation checkpointing per block (the forward again in the backward) */
    bool reduce_f32;           /* grads reduce-scattered in f32 (else bf16) */
    double sm_share;           /* NCCL's share of the SMs while it runs */
    double optim_bytes;        /* bytes the optimizer step moves per local element (0: 28, f32 AdamW and masters) */
} pl_step_opts;

typedef struct pl_step {
    pl_sched s;
    double tokens_per_gpu_s, mfu, model_flops;
    /* one block, for the table and --explain */
    double blk_gemm_flops, blk_gemm, blk_attn_flops, blk_attn, blk_elem_bytes, blk_elem, blk_cast_bytes, blk_cast;
    double blk_ag_bytes, blk_ag, blk_rs_bytes, blk_rs, blk_amax;
    double head_gemm, optimizer, amax_tail;
} pl_step;

/* One training step of model g (FSDP over o->gpus, one group per block,
 * "emb" and "root" as lpx train wraps them) on chip c over network net.
 * Errors: LPX_ENOMEM; LPX_ERANGE for a step time that is not finite;
 * LPX_EINTERNAL for an MFU over 100% (a bug: chip.c keeps rates <= peaks). */
int pl_step_predict(const struct tr_geom *g, const pl_chip *c, const pl_net *net, const pl_step_opts *o,
                    pl_step *out);

#endif
