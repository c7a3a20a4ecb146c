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

#endif
