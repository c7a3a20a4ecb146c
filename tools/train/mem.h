/* The per-rank memory model of `lpx mem`, the same accounting `lpx train`
 * measures (train prints both side by side). */
#ifndef LPX_TRAIN_MEM_H
#define LPX_TRAIN_MEM_H

#include "train.h"

typedef struct tr_mem_est {
    int64_t params, grads, optimizer, unsharded, activations;
    int64_t transient;   /* the loss's chunk while it is computed (logits, their grad, the head's grad) */
} tr_mem_est;

/* g: the model; world ranks; b sequences per micro-batch (g->seq long);
 * nloc micro-batches per rank per step; act_bytes: bytes per activation
 * element (4: f32, as lpx train on the CPU; 2: bf16); ac: activation
 * checkpointing per block (each block keeps only its input). */
void tr_mem_estimate_geom(const tr_geom *g, tr_recipe recipe, int world, int lora_rank, int b, int nloc,
                          bool wrap_linear, int act_bytes, bool ac, tr_mem_est *out);

/* LPX_ERANGE (message in lpx_last_error(), naming `who`) when the estimate
 * of tr_mem_estimate_geom with these arguments would not fit its int64
 * byte counts (over 2^62 bytes: a huge --seq x --batch, say); else
 * LPX_OK. Callers that take sizes from the command line check this first. */
lpx_status tr_mem_estimate_check(const tr_geom *g, int world, int lora_rank, int b, int act_bytes, const char *who);

/* ---- the whole process (lpx train's memory guard and its summary) ---- */

/* What a run goes through, in order: the bf16 pre-training of nf4-qlora's
 * base, the main recipe, --compare's bf16 run. */
typedef struct tr_mem_run {
    bool pretrain, compare;
    int weight_copies;      /* f32 copies of the whole model the process holds (initial weights; nf4-qlora's base) */
    double corpus_bytes;    /* the corpus's token ids in memory */
} tr_mem_run;

/* One phase's estimate of the process's peak on the host. */
typedef struct tr_mem_phase {
    const char *label;      /* "bf16-pretrain", the recipe's name, "bf16" (--compare) */
    tr_recipe recipe;
    double per_rank;        /* lpx mem's total for one rank (host side: all of it on the CPU) */
    int ranks;              /* ranks in this process (local threads share its memory) */
    double weights, corpus; /* the f32 model copies and the corpus */
    double overhead;        /* what the categories do not count (TR_MEM_OVERHEAD_*, measured) */
    double total;
} tr_mem_phase;

/* The phases of run r with options o on model g (at most 3); n returned. */
int tr_mem_phases(const tr_opts *o, const tr_geom *g, const tr_mem_run *r, tr_mem_phase *out);

/* The process overhead the categories do not count, modelled from
 * measurements on the CPU (docs/TRAIN.md, "Memory"): OpenBLAS's per-thread
 * buffers, the allocator's arenas and slack, the executable and its
 * libraries, the f32<->bf16 conversions of the GEMM operands and the
 * dispatch's temporaries. A base per process plus a share of every rank's
 * working set. */
double tr_mem_overhead(const tr_mem_est *e, int ranks, bool gpu);

/* The host memory this process may still take: MemAvailable from
 * /proc/meminfo and the room under the cgroup's limit (v2: memory.max
 * minus memory.current of this process's cgroup and its ancestors; v1:
 * memory.limit_in_bytes minus memory.usage_in_bytes), the smaller one.
 * Test-only overrides (docs/TESTING.md): LPX_TEST_MEM_AVAILABLE=BYTES sets
 * the answer, LPX_TEST_MEMINFO=FILE replaces /proc/meminfo,
 * LPX_TEST_CGROUP=DIR is the cgroup directory read (its memory.max and
 * memory.current, or the v1 files). */
typedef struct tr_host_mem {
    double avail;           /* the smaller of the two; INFINITY when neither is known */
    double meminfo;         /* MemAvailable, bytes; NAN when unknown */
    double cg_limit, cg_usage; /* the tightest cgroup's; NAN when no limit is set */
    bool cg_v1, overridden;
} tr_host_mem;
void tr_host_mem_read(tr_host_mem *m);
/* one phrase: "12.30 GiB available (MemAvailable 20.10 GiB; cgroup
 * memory.max 16.00 GiB minus memory.current 3.70 GiB)" */
void tr_host_mem_describe(const tr_host_mem *m, char *buf, size_t n);
/* "12.34 GiB" from 1 GiB up, else "56.7 MiB" */
void tr_mem_human(char *buf, size_t n, double bytes);

/* The process's peak resident set so far (VmHWM, else ru_maxrss), bytes; 0 if unknown. */
double tr_mem_peak_rss(void);

#endif
