/* `lpx train`: what one rank holds, and the functions that work on it.
 * A rank is one thread of the local comm backend (or one process over
 * MPI); everything here is per rank, nothing is shared but read-only
 * inputs and the result slots of tr_shared (written by rank 0, or by each
 * rank where ranks are processes). */
#ifndef LPX_TRAIN_RANK_H
#define LPX_TRAIN_RANK_H

#include "train.h"
#include "metrics.h"

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
    lpx_qlora_opts q;             /* nf4-qlora: the forward's dropout and seed, for the backward */
} tr_lin_saved;

typedef struct tr_block_saved {
    lpx_tensor *h_in, *n1, *rstd1;
    lpx_tensor *q, *k, *v;        /* after rope (q, k): [b, t, heads or kv_heads, hd] */
    lpx_tensor *att, *lse;        /* attention's output [b*t, D] and its row log-sum-exp */
    lpx_tensor *h1, *n2, *rstd2, *u1, *u3, *pp; /* pp = silu(u1) * u3 */
    tr_lin_saved lin[TR_LIN_PER_BLOCK];
} tr_block_saved;

/* One micro-batch's forward, kept for its backward. */
typedef struct tr_fwd {
    int b, t;
    int slot;                     /* the forward's delayed-scaling slot (recomputation reuses it) */
    lpx_tensor *idx, *tgt;
    tr_block_saved *blk;          /* [layers] */
    lpx_tensor *h_last, *nf, *rstdf;
    lpx_tensor *logits;           /* [b*t, V]: only with TR_FWD_LOGITS or without targets */
    lpx_tensor *dnf, *dhead;      /* TR_FWD_GRADS: d loss / d nf [b*t, D] and / d W_head [V, D] (NULL: frozen) */
    double loss;
} tr_fwd;

typedef struct tr_rank {
    const tr_opts *o;
    const tr_geom *g;
    tr_recipe recipe;
    lpx_comm *comm;
    int rank, world;
    lpx_device dev;               /* where this rank computes (device.c): the CPU or its GPU */
    bool sharded;                 /* false: nf4-qlora keeps a frozen replica */

    /* the sharding engine (shard.c) */
    lpx_mesh *mesh;
    lpx_fsdp *fsdp;
    /* per group and per parameter: arrays of ngroups / nparams entries
     * (tr_rank_alloc), so no model size is capped by a fixed table */
    lpx_fsdp_group **grp;
    int *gi;                             /* index of p in its group */
    int *ai, *bi;                        /* nf4-qlora: indices of p's adapters A, B */
    bool bwd;                            /* walking the groups backward (prefetch g-1) */

    /* per parameter */
    int64_t *chunk, *start, *len;
    lpx_tensor **master;                 /* f32 master shard (the engine's local, borrowed + retained) */
    lpx_tensor **full;                   /* unsharded weight in compute form */
    lpx_tensor **full_dense;             /* mx recipes: the dense weight behind the MX one */
    lpx_tensor **gacc;                   /* full-size grad being accumulated */
    int64_t nf4_local_bytes, nf4_local_numel;

    /* nf4-qlora */
    lpx_tensor **nf4;                    /* unsharded NF4 base (while its group is unsharded) */
    lpx_tensor **la, **lb;               /* unsharded adapters A [r, in], B [out, r] */
    lpx_tensor **ga, **gb;               /* full-size adapter grads of the step */
    lpx_qlora_opts qopts;

    /* float8 */
    lpx_float8_linear_recipe f8r;
    lpx_float8_linear_state *f8state;    /* [nparams * slots] (delayed recipe) */
    int f8slots;

    const lpx_kind *mx_kind;
    lpx_tensor *inv_freq;                /* rope frequencies [head_dim / 2] f32 */
    tr_memtrack mem;
    int64_t act_bytes;                   /* saved activations of the last forward */
    int *remaining;                      /* per group: params still to get their grad this backward */
    bool last_micro;

    /* where the run is: random streams and fault injection key on these */
    int step;                            /* optimizer step being computed (0-based) */
    int cur_chunk;                       /* global micro-batch index being computed */
    bool training;                       /* a training forward/backward (dropout on) */
    bool inject;                         /* the main run: --inject-nan applies */
} tr_rank;

/* The per-parameter and per-group arrays of R (sized by R->g), zeroed;
 * tr_rank_free releases them (not what they point to). */
lpx_status tr_rank_alloc(tr_rank *R);
void tr_rank_free(tr_rank *R);

/* ---- device.c ---- */
/* R->dev from --device: the CPU, or the GPU of R's NCCL comm (LPX_EDEVICE
 * when the comm has none) */
lpx_status tr_device_setup(tr_rank *R);
bool tr_on_gpu(const tr_rank *R);
/* a new tensor on R->dev holding the host values v (dense, of dtype) */
lpx_status tr_host_tensor(tr_rank *R, lpx_dtype dtype, int ndim, const int64_t *shape, const void *v, lpx_tensor **out);
/* row `row` of the 2-D tensor x (any float dtype, any device) as f32 on the host */
lpx_status tr_row_to_host(lpx_tensor *x, int64_t row, float *out);
/* NaN into element 0 and inf into element 1 of x, where x lives */
lpx_status tr_poison2(lpx_tensor *x);
/* lpx_comm_all_gather_buf of host buffers; on a GPU staged through device
 * memory (an NCCL comm takes device buffers only) */
lpx_status tr_all_gather_host(tr_rank *R, const void *send, void *recv, size_t nbytes);
/* waits for the work queued on R's GPU (step timings); nothing on the CPU */
lpx_status tr_device_sync(tr_rank *R);
/* peak bytes of lpx-cuda's allocator on R's GPU since the last reset
 * (then reset when asked); -1 on the CPU or without the export */
int64_t tr_device_peak(tr_rank *R, bool reset);

/* ---- recipes.c ---- */
lpx_status tr_recipe_setup(tr_rank *R);
void tr_recipe_teardown(tr_rank *R);
lpx_status tr_linear_forward(tr_rank *R, int p, int slot, lpx_tensor *x, lpx_tensor **y, tr_lin_saved *s);
/* grad_x into *gx; the weight grad (full shape) into *gw, or NULL where the
 * weight is frozen (nf4-qlora accumulates its adapter grads into R) */
lpx_status tr_linear_backward(tr_rank *R, int p, tr_lin_saved *s, lpx_tensor *g, lpx_tensor **gx,
                              lpx_tensor **gw);
void tr_lin_saved_clear(tr_lin_saved *s);
/* float8-delayed: fresh delayed-scaling states for the evaluation slot, so
 * that evaluation and sampling are functions of the weights alone (they
 * neither read nor change the training state a checkpoint holds) */
lpx_status tr_recipe_reset_eval(tr_rank *R);
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
/* unshards p's group beside the last group only (every other group is
 * resharded first) and prefetches nothing: the tied LM head, whose weight
 * is the embedding's, at the root */
lpx_status tr_need_alone(tr_rank *R, int p);
void tr_reshard(tr_rank *R, int group);
void tr_reshard_all(tr_rank *R);
lpx_status tr_reduce_grads(tr_rank *R, int group);  /* set_grad + one reduce-scatter (avg) */
lpx_status tr_precompute_scales(tr_rank *R);        /* float8: one amax all-reduce(MAX) */
/* every rank: all-gather the f32 masters; a rank that passes out fills
 * out[p] (NULL: gather only; ranks that share out pass it on rank 0 only) */
lpx_status tr_gather_masters(tr_rank *R, float **out);
/* every rank: all-gathers the Shard(0) pieces (`local_rows` rows of `cols`
 * f32 at `local`) of a [rows, cols] tensor; a rank that passes out gets
 * the full tensor there */
lpx_status tr_gather_rows(tr_rank *R, const float *local, int64_t local_rows, int64_t rows, int64_t cols,
                          float *out);
/* this rank's Shard(0) rows of a [rows, x] tensor: [*start, *start + *len) */
void tr_shard_rows(const tr_rank *R, int64_t rows, int64_t *start, int64_t *len);

/* ---- ckpt.c ---- */
/* A checkpoint opened for --resume: the manifest, checked against the
 * files' sizes and checksums. */
typedef struct tr_ckpt {
    char dir[1024];
    int step;                 /* optimizer steps done */
    tr_opts cfg;              /* the run configuration it records */
    int vocab;
    int skipped;              /* steps skipped for non-finite grads so far */
    double val_start;         /* validation loss before the first step (NaN: none) */
    int nhist;
    tr_step_rec *hist;        /* [nhist]: each step's loss, tok/s, compute and comm ms */
    bool has_recipe_state;    /* float8-delayed histories saved */
    bool sharded;             /* the library's sharded checkpoint (else the gathered version 2) */
    int saved_world;          /* sharded: the ranks that saved it */
    char data_path[1024];
    uint64_t data_fnv, data_bytes;
    /* sharded: the checkpoint kept open from tr_ckpt_open until every
     * rank has loaded it (tr_ckpt_loaded): its shared lock makes a save
     * into the same directory wait, so the record read here and the
     * weights the ranks load are one checkpoint */
    struct lpx_fsdp_ckpt *hold;
} tr_ckpt;

/* Opens checkpoint DIR: a sharded one (index.json: the library checks
 * the index's checksum; the trainer's record is its user object) or one of
 * the gathered format (manifest.json, every file's size and checksum
 * checked). Errors name DIR and the file: LPX_ENOTFOUND (no index: not a
 * complete checkpoint), LPX_EINVAL (malformed, edited or damaged), LPX_EIO. */
lpx_status tr_ckpt_open(const char *dir, tr_ckpt *ck);
void tr_ckpt_free(tr_ckpt *ck);
/* Options not given on the command line take the checkpoint's values;
 * 0, or 2 after printing one line (a recipe change it cannot follow) */
int tr_ckpt_apply(const tr_ckpt *ck, tr_opts *o);
/* What a checkpoint's shapes do not say about its model (heads, rope,
 * tied head) against this run's: one line naming both, or LPX_OK. */
lpx_status tr_ckpt_check_arch(const tr_ckpt *ck, const tr_geom *g);
/* Sharded checkpoints: every parameter of g (and nf4-qlora's adapters at
 * o->lora_rank) against what the checkpoint records, before anything is
 * built; errors name the parameter and both shapes. */
lpx_status tr_ckpt_check_model(const tr_ckpt *ck, const tr_geom *g, const tr_opts *o);
/* Per rank, after setup: the engine's state (sharded: lpx_fsdp_load; the
 * gathered format: adapters and AdamW state) and the float8-delayed
 * histories. */
lpx_status tr_ckpt_load_rank(tr_rank *R, const tr_ckpt *ck);
/* Every rank, after tr_ckpt_load_rank: a barrier, then rank 0 lets the
 * checkpoint go (ck->hold closed), so a later --save may replace it. */
lpx_status tr_ckpt_loaded(tr_rank *R, const tr_ckpt *ck);

/* ---- ckpt_v2.c: the gathered format (read only) ---- */
/* DIR/manifest.json checked (its checksum, format, version, files); its
 * parsed root into *root (the caller's to cJSON_Delete) */
struct cJSON;
lpx_status tr_ckpt_v2_open(const char *dir, tr_ckpt *ck, struct cJSON **root);
/* The model's full f32 weights (init / nf4-qlora's frozen base) after
 * checking every parameter's name and shape against g (and nf4-qlora's
 * adapters against o->lora_rank). */
lpx_status tr_ckpt_v2_load_weights(const tr_ckpt *ck, const tr_geom *g, const tr_opts *o, float **w);
lpx_status tr_ckpt_v2_load_rank(tr_rank *R, const tr_ckpt *ck);
/* "[a, b]" of a shape into buf */
char *tr_shape_str(const int64_t *s, int nd, char *buf, size_t n);

/* What a save writes besides the rank's state. */
typedef struct tr_ckpt_info {
    const char *dir;
    int step;                 /* optimizer steps done */
    int vocab;
    int skipped;
    double val_start;
    const tr_step_rec *hist;  /* [step] (rank 0) */
    const char *data_path;
} tr_ckpt_info;
/* Before the run: DIR is absent, or a checkpoint a save may replace.
 * Errors: LPX_EINVAL naming DIR. */
lpx_status tr_ckpt_check_target(const char *dir);
/* Every rank (collective): writes its shards and rank 0 the run's
 * record through lpx_fsdp_save_ex (DIR replaced atomically). Every rank
 * returns the same result. */
lpx_status tr_ckpt_save(tr_rank *R, const tr_ckpt_info *info);

/* ---- model.c ---- */
lpx_status tr_model_setup(tr_rank *R);
void tr_model_teardown(tr_rank *R);
/* tr_forward flags */
enum {
    TR_FWD_GRADS = 1u,   /* keep what the backward needs; the loss's gradients (d nf, d W_head) are taken
                            in the forward, chunk by chunk with the LM head (needs tgt) */
    TR_FWD_LOGITS = 2u   /* keep the full logits [b*t, V] in f->logits (always without tgt) */
};
/* idx/tgt: i32 [b * t]; tgt may be NULL (no loss: sampling). slot picks
 * delayed-scaling states. grad_scale multiplies d loss (TR_FWD_GRADS):
 * 1/micro-batches, so that summing their grads in a fixed order gives the
 * mean. Without TR_FWD_GRADS nothing is saved. */
lpx_status tr_forward(tr_rank *R, tr_fwd *f, const int32_t *idx, const int32_t *tgt, int b, int t, int slot,
                      unsigned flags, double grad_scale);
/* last: the micro-batch after which each group's grads are complete
 * (reduce-scatter and reshard as we go) */
lpx_status tr_backward(tr_rank *R, tr_fwd *f, bool last);
void tr_fwd_clear(tr_fwd *f, int layers);

/* ---- optim.c ---- */
lpx_status tr_adamw_setup(tr_rank *R);
lpx_status tr_adamw_step(tr_rank *R, double lr);
void tr_adamw_teardown(tr_rank *R);
double tr_lr_at(const tr_opts *o, int step, int steps);

/* ---- `lpx train`: launch.c, world.c, run.c, rank_loop.c ---- */
/* world.c: the --comm backend (its plugin loaded if need be) and the world:
 * o->ranks set from MPI's or a launcher's world, o->quiet on the ranks that
 * do not lead; *lead: this process prints and writes the files. 0, or 2
 * after one line (from the lead only, where the world is known) */
int tr_world(tr_opts *o, bool *lead);
struct tr_mem_run;
/* launch.c: the memory guard: false (after one line from the lead) when a
 * phase of the run does not fit in the memory available now */
bool tr_fits_memory(const tr_opts *o, const tr_geom *g, bool lead, const struct tr_mem_run *mr);
/* run.c: the run once launch.c has checked it (hf_init: --init is a
 * Hugging Face folder whose config.json set o->m); 0, 1 or 2 */
int tr_train_run(tr_opts *o, const tr_ckpt *ck, bool lead, bool hf_init);
/* Which steps a run covers, and whether it is the main one. */
typedef struct tr_span {
    int start, end;          /* steps [start, end) of a schedule of `steps` */
    bool main;
    const tr_ckpt *ck;
    const char *hf_import;   /* Hugging Face weights each rank reads its rows of */
} tr_span;
struct tr_result;
/* rank_loop.c: runs one recipe over steps [span->start, span->end) of a
 * `steps`-step schedule from `init` on o->ranks ranks (final: the trained
 * masters gathered there, may be NULL) */
lpx_status tr_run_recipe(const tr_opts *o, tr_recipe recipe, const char *label, int steps, const tr_span *span,
                         const tr_geom *g, const tr_corpus *c, float *const *init, float **final, bool eval_start,
                         struct tr_result *res);

#endif
