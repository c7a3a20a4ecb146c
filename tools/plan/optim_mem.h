/* The bytes per rank of AdamW's state and of the master weights for each
 * optimizer choice of `lpx train --optim / --master` (issue 37), counted
 * as the state kinds store them (include/lpx/optim_state.h) on the
 * engine's shards. Used by `lpx mem` (cmd_mem.c) and `lpx plan`.
 *
 * The layout counted: the engine cuts a parameter [rows, cols] on dim 0
 * (lpx_shard_range: ceil(rows / world) rows, rounded up to whole units);
 * a quantized state's blocks are laid on the parameter's global flat
 * index and never straddle two ranks, so the unit is also a multiple of
 * block / gcd(cols, block) rows (1 whenever cols is a multiple of the
 * block, as in every Llama preset). A rank's state of one moment is then
 * one state tensor of its shard's elements: codes (8-bit and fp8 m: one
 * byte each; 4-bit: two per byte, (n + 1) / 2 bytes for a block of n;
 * fp8 v: f16) plus one f32 scale per block, ceil(elements / block)
 * blocks per parameter per rank. Masters: f32 4 bytes, bf16-sr 2 bytes
 * per local element; f16-scaled / f16-scaled-sr (FP8-LM's scaled f16) 2
 * bytes per local element plus one f32 scale per block of the state's
 * block (256; also with f32 moments), its blocks whole on each rank too.
 * Grads stay f32 (4 bytes per local element). */
#ifndef LPX_PLAN_OPTIM_MEM_H
#define LPX_PLAN_OPTIM_MEM_H

#include <stdbool.h>
#include <stdint.h>

typedef enum pl_optim { PL_OPTIM_ADAMW, PL_OPTIM_8BIT, PL_OPTIM_4BIT, PL_OPTIM_FP8, PL_OPTIMS } pl_optim;
typedef enum pl_master { PL_MASTER_F32, PL_MASTER_BF16_SR, PL_MASTER_F16S, PL_MASTER_F16S_SR, PL_MASTERS } pl_master;

/* "adamw", "adamw8bit", "adamw4bit", "adamw-fp8" / "f32", "bf16-sr",
 * "f16-scaled", "f16-scaled-sr"; the
 * from_name functions return -1 for another name */
const char *pl_optim_name(pl_optim o);
int pl_optim_from_name(const char *s);
const char *pl_master_name(pl_master m);
int pl_master_from_name(const char *s);
/* "adamw|adamw8bit|adamw4bit|adamw-fp8", "f32|bf16-sr" for messages */
#define PL_OPTIM_CHOICES "adamw, adamw8bit, adamw4bit or adamw-fp8"
#define PL_MASTER_CHOICES "f32, bf16-sr, f16-scaled or f16-scaled-sr"

/* The block of o's state (lpx_optim_state_default_block of its format);
 * 0 for adamw (f32 per element, no blocks). */
int64_t pl_optim_block(pl_optim o);
/* Bytes per element of a master (a scaled f16 master's codes: 2). */
int pl_master_bytes(pl_master m);
/* The block of a scaled f16 master's scales under state o (the state's
 * block; 256 with f32 moments); 0 for the other masters. */
int64_t pl_master_block(pl_optim o, pl_master m);
/* Bytes of a master of numel elements (codes and block scales). */
int64_t pl_master_total_bytes(pl_optim o, pl_master m, int64_t numel);
/* Bytes of m + v (codes and block scales) of one state of numel elements
 * (what lpx_optim_state_get_info's bytes sum to over the two moments);
 * -1 when numel is negative or the count overflows int64. */
int64_t pl_optim_state_bytes(pl_optim o, int64_t numel);
/* The shard unit in rows of a parameter of cols columns whose shards are
 * otherwise cut in units of base_unit rows: a multiple of base_unit and of
 * block / gcd(cols, block); -1 when cols or base_unit < 1. */
int64_t pl_optim_row_unit(pl_optim o, int64_t cols, int64_t base_unit);

/* One rank's trainable shards under a choice. */
typedef struct pl_optim_mem {
    int64_t elems;   /* local trainable elements */
    int64_t master;  /* bytes of their masters */
    int64_t state;   /* bytes of AdamW's m + v (and block scales) */
    int64_t grads;   /* bytes of their f32 grad shards */
} pl_optim_mem;

struct tr_geom;
/* Sums rank `rank`'s shards over g's trainable parameters (nf4-qlora: the
 * LoRA adapters A [lora_rank, cols] and B [rows, lora_rank] of every
 * linear; else every parameter, blockwise float8 linears in units of 128
 * rows) at world size `world`. -1 (message in lpx_last_error()) for an
 * argument out of range or a count over int64; else 0. Rank 0 holds the
 * most: lpx mem's column is rank 0's. */
int pl_optim_mem_geom(const struct tr_geom *g, int recipe, int world, int rank, int lora_rank, pl_optim o,
                      pl_master m, pl_optim_mem *out);

/* e, tr_mem_estimate_geom's estimate of rank 0 (AdamW's f32 m and v, f32
 * masters), with the masters, f32 grad shards and state of choice (o, m)
 * instead; *cur (may be NULL) is rank 0's shards under the choice. The
 * defaults (adamw, f32) leave e as it is. -1 as pl_optim_mem_geom. */
struct tr_mem_est;
int pl_mem_apply_optim(const struct tr_geom *g, int recipe, int world, int lora_rank, pl_optim o, pl_master m,
                       struct tr_mem_est *e, pl_optim_mem *cur);

/* Bytes per local element the optimizer step moves: reads and writes the
 * master and m + v, reads the f32 grad (f32 AdamW: 28). */
double pl_optim_step_bytes(const pl_optim_mem *x);

#endif
