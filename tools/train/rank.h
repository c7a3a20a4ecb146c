/* `lpx train`: what one rank holds, and the functions that work on it.
 * A rank is one thread of the local comm backend (or one process over
 * MPI); everything here is per rank, nothing is shared but read-only
 * inputs and the result slots of tr_shared (written by rank 0, or by each
 * rank where ranks are processes). */
#ifndef LPX_TRAIN_RANK_H
#define LPX_TRAIN_RANK_H

#include "train.h"

#define REL(t) do { lpx_tensor_release(t); (t) = NULL; } while (0)

/* Memory categories measured per rank (bytes of live tensors we own). */
enum { TR_MEM_PARAMS = 0, TR_MEM_GRADS, TR_MEM_OPT, TR_MEM_UNSHARDED, TR_MEM_ACT, TR_MEM_COUNT };
typedef struct tr_memtrack {
    int64_t cur[TR_MEM_COUNT], peak[TR_MEM_COUNT];
} tr_memtrack;
void tr_mem_add(tr_memtrack *m, int cat, int64_t bytes);
int64_t tr_tensor_bytes(const lpx_tensor *t);

/* Saved state of one linear layer between forward and backward. */
typedef struct tr_lin_saved {
    lpx_float8_linear_ctx *ctx;   /* float8 recipes */
    lpx_tensor *x;                /* the input (other recipes) */
    lpx_tensor *xa;               /* nf4-qlora: drop(x) @ A^T */
} tr_lin_saved;

typedef struct tr_block_saved {
    lpx_tensor *h_in, *n1, *rstd1, *q3, *k3, *v3, *P, *o, *h1, *n2, *rstd2, *u1, *u3, *s, *pp;
    tr_lin_saved lin[TR_LIN_PER_BLOCK];
} tr_block_saved;

/* One micro-batch's forward, kept for its backward. */
typedef struct tr_fwd {
    int b, t;
    lpx_tensor *idx, *tgt;
    tr_block_saved *blk;          /* [layers] */
    lpx_tensor *h_last, *nf, *rstdf, *logits;
    double loss;
} tr_fwd;

typedef struct tr_rank {
    const tr_opts *o;
    const tr_geom *g;
    tr_recipe recipe;
    lpx_comm *comm;
    int rank, world;
    bool sharded;                 /* false: nf4-qlora keeps a frozen replica */

    /* the sharding engine (shard.c) */
    lpx_mesh *mesh;
    lpx_fsdp *fsdp;
    lpx_fsdp_group *grp[TR_MAX_GROUPS];
    int gi[TR_MAX_PARAMS];               /* index of p in its group */
    int ai[TR_MAX_PARAMS], bi[TR_MAX_PARAMS]; /* nf4-qlora: indices of p's adapters A, B */
    bool bwd;                            /* walking the groups backward (prefetch g-1) */

    /* per parameter */
    int64_t chunk[TR_MAX_PARAMS], start[TR_MAX_PARAMS], len[TR_MAX_PARAMS];
    lpx_tensor *master[TR_MAX_PARAMS];   /* f32 master shard (the engine's local, borrowed + retained) */
    lpx_tensor *full[TR_MAX_PARAMS];     /* unsharded weight in compute form */
    lpx_tensor *full_dense[TR_MAX_PARAMS]; /* mx recipes: the dense weight behind the MX one */
    lpx_tensor *gacc[TR_MAX_PARAMS];     /* full-size grad being accumulated */
    int64_t nf4_local_bytes, nf4_local_numel;

    /* nf4-qlora */
    lpx_tensor *nf4[TR_MAX_PARAMS];      /* unsharded NF4 base (while its group is unsharded) */
    lpx_tensor *la[TR_MAX_PARAMS], *lb[TR_MAX_PARAMS];       /* unsharded adapters A [r, in], B [out, r] */
    lpx_tensor *ga[TR_MAX_PARAMS], *gb[TR_MAX_PARAMS];       /* full-size adapter grads of the step */
    lpx_qlora_opts qopts;

    /* float8 */
    lpx_float8_linear_recipe f8r;
    lpx_float8_linear_state *f8state;    /* [nparams * slots] (delayed recipe) */
    int f8slots;

    const lpx_kind *mx_kind;
    lpx_tensor *mask;                    /* [seq, seq] causal additive mask */
    tr_memtrack mem;
    int64_t act_bytes;                   /* saved activations of the last forward */
    int remaining[TR_MAX_GROUPS];        /* params of a group still to get their grad this backward */
    bool last_micro;
} tr_rank;

/* ---- recipes.c ---- */
lpx_status tr_recipe_setup(tr_rank *R);
void tr_recipe_teardown(tr_rank *R);
lpx_status tr_linear_forward(tr_rank *R, int p, int slot, lpx_tensor *x, lpx_tensor **y, tr_lin_saved *s);
/* grad_x into *gx; the weight grad (full shape) into *gw, or NULL where the
 * weight is frozen (nf4-qlora accumulates its adapter grads into R) */
lpx_status tr_linear_backward(tr_rank *R, int p, tr_lin_saved *s, lpx_tensor *g, lpx_tensor **gx,
                              lpx_tensor **gw);
void tr_lin_saved_clear(tr_lin_saved *s);
/* loads plugin `file` from the build tree (<build>/<tree_dir>/) or the
 * install prefix (lib{,64,/<triplet>}/lpx/) of this executable; true once one loaded */
bool tr_plugin_near_exe(const char *tree_dir, const char *file);
/* finds (loading lpx-mx.so if needed) the MX kind of an mx recipe */
lpx_status tr_mx_kind(tr_recipe r, const lpx_kind **out);
/* adds grad `g` (full shape) of parameter p into R->gacc[p] */
lpx_status tr_grad_accum(tr_rank *R, lpx_tensor **acc, lpx_tensor *g);

/* ---- shard.c ---- */
/* init: full f32 values of every parameter (row-major, read-only) */
lpx_status tr_shard_setup(tr_rank *R, float *const *init);
void tr_shard_teardown(tr_rank *R);
/* unshards p's group (resharding the groups behind it, prefetching the
 * next one in the direction of R->bwd) */
lpx_status tr_need(tr_rank *R, int p);
lpx_status tr_unshard(tr_rank *R, int group);
void tr_reshard(tr_rank *R, int group);
void tr_reshard_all(tr_rank *R);
lpx_status tr_reduce_grads(tr_rank *R, int group);  /* set_grad + one reduce-scatter (avg) */
lpx_status tr_precompute_scales(tr_rank *R);        /* float8: one amax all-reduce(MAX) */
/* every rank: all-gather the f32 masters; a rank that passes out fills
 * out[p] (NULL: gather only; ranks that share out pass it on rank 0 only) */
lpx_status tr_gather_masters(tr_rank *R, float **out);

/* ---- model.c ---- */
lpx_status tr_model_setup(tr_rank *R);
void tr_model_teardown(tr_rank *R);
/* idx/tgt: i32 [b * t]; tgt may be NULL (no loss: sampling). slot picks
 * delayed-scaling states. With grads false nothing is saved. */
lpx_status tr_forward(tr_rank *R, tr_fwd *f, const int32_t *idx, const int32_t *tgt, int b, int t, int slot,
                      bool grads);
/* grad_scale multiplies d loss; last: the micro-batch after which each
 * group's grads are complete (reduce-scatter and reshard as we go) */
lpx_status tr_backward(tr_rank *R, tr_fwd *f, double grad_scale, bool last);
void tr_fwd_clear(tr_fwd *f, int layers);

/* ---- optim.c ---- */
lpx_status tr_adamw_setup(tr_rank *R);
lpx_status tr_adamw_step(tr_rank *R, double lr);
void tr_adamw_teardown(tr_rank *R);
double tr_lr_at(const tr_opts *o, int step, int steps);

#endif
