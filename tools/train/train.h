/* `lpx train`: shared types of the reference training job.
 *
 * The job is written only against the public lpx API, so it doubles as the
 * embedding example for framework authors: tools/train/ shows how a model,
 * its manual backward, the low-precision recipes (Float8Linear, NF4/QLoRA,
 * MX weights from a plugin) and sharded data parallelism over lpx_comm fit
 * together. One file per job:
 *   options.c  command line of `lpx train` / `lpx mem`
 *   launch.c   lpx_cmd_train: parse, open --resume, the checks and refusals
 *              (--device, outputs, --init), the memory guard
 *   world.c    the comm backend and the world (threads, MPI, a launcher's)
 *   run.c      the run: corpus, geometry, initial weights, the recipe runs
 *   rank_loop.c  the per-rank step loop, evaluation, sampling
 *   report.c   the end-of-run summary
 *   data.c     the corpus (bytes, or token ids) and deterministic batches
 *   arch.c     the model description: presets, overrides, rope frequencies
 *   model.c    Llama 3: parameters, forward and manual backward
 *   hf_read.c  Hugging Face checkpoints in (--init DIR, lpx eval)
 *   hf_write.c Hugging Face checkpoints out (--save-hf DIR)
 *   recipes.c  one linear layer per recipe (bf16, float8, nf4, mx)
 *   shard.c    parameter sharding: unshard / reshard / reduce-scatter / scales
 *   optim.c    AdamW on local shards
 *   metrics.c  metrics.csv and loss.svg, written atomically
 *   ckpt.c     checkpoints read: --resume (the library's sharded checkpoint
 *              with the run's record); ckpt_save.c writes them (--save,
 *              --save-every); ckpt_v2.c reads the old gathered format only
 *   mem.c      the per-rank memory model behind `lpx mem` */
#ifndef LPX_TRAIN_H
#define LPX_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "lpx/lpx.h"

/* Checks an lpx_status: on failure records it in `st` and jumps to `out`,
 * the function's cleanup label (every caller declares both). */
#define TRY(expr) do { st = (expr); if (st != LPX_OK) goto out; } while (0)
/* Fails with a message of our own (not from an lpx call). */
#define FAIL(code, ...) do { st = lpx_error((code), __VA_ARGS__); goto out; } while (0)

typedef enum tr_recipe {
    TR_BF16 = 0,
    TR_F8_TENSORWISE,
    TR_F8_ROWWISE,
    TR_F8_DELAYED,
    TR_NF4_QLORA,
    TR_MXFP8,
    TR_MXFP4,
    TR_F32,                 /* everything in f32 (f32 on the wire): the reference */
    TR_F8_BLOCKWISE,        /* Float8Linear blockwise (DeepSeek-V3 blocks), W gathered in fp8 blocks */
    TR_RECIPE_COUNT
} tr_recipe;

const char *tr_recipe_name(tr_recipe r);
/* -1 for an unknown name */
int tr_recipe_from_name(const char *name);
bool tr_recipe_is_float8(tr_recipe r);
bool tr_recipe_is_mx(tr_recipe r);
/* NF4 settings for a weight of numel elements: blocks of 64, and the
 * largest scaler block <= 256 that divides the block count, so small
 * weights are not padded to 16384 elements (~4.13 bits/param at any size) */
lpx_nf4_config tr_nf4_config(int64_t numel);

/* Options a checkpoint's manifest restores on --resume unless they were
 * given on the command line (tr_opts.given). */
enum {
    TR_GIVEN_RECIPE = 1u << 0, TR_GIVEN_RANKS = 1u << 1, TR_GIVEN_MICRO = 1u << 2, TR_GIVEN_BATCH = 1u << 3,
    TR_GIVEN_SEQ = 1u << 4, TR_GIVEN_DIM = 1u << 5, TR_GIVEN_LAYERS = 1u << 6, TR_GIVEN_HEADS = 1u << 7,
    TR_GIVEN_LR = 1u << 8, TR_GIVEN_SEED = 1u << 9, TR_GIVEN_STEPS = 1u << 10, TR_GIVEN_WRAP = 1u << 11,
    TR_GIVEN_LORA_RANK = 1u << 12, TR_GIVEN_LORA_DROPOUT = 1u << 13, TR_GIVEN_DATA = 1u << 14,
    TR_GIVEN_EVAL = 1u << 15, TR_GIVEN_KV_HEADS = 1u << 16, TR_GIVEN_FFN = 1u << 17, TR_GIVEN_VOCAB = 1u << 18,
    TR_GIVEN_ROPE_THETA = 1u << 19, TR_GIVEN_TIED = 1u << 20, TR_GIVEN_MODEL = 1u << 21
};

/* The model: Llama 3 as transformers' LlamaForCausalLM computes it. */
typedef struct tr_arch {
    int vocab;              /* 0: from the data (256 for a text corpus) */
    int dim, layers, heads, kv_heads, ffn;
    bool tied;              /* the LM head is the token embedding */
    double rope_theta, norm_eps;
    /* rope_scaling "llama3" (Llama 3.1): factor 0 = none */
    double rope_factor, rope_low, rope_high;
    int rope_orig;          /* original_max_position_embeddings */
    int max_pos;            /* max_position_embeddings --save-hf writes from scratch (0: derived) */
} tr_arch;

/* ---- arch.c ---- */
/* The preset `name` (llama3-8b, ..., tiny) into *a; false if unknown. */
bool tr_arch_preset(const char *name, tr_arch *a);
/* the preset names, comma-separated, for messages */
const char *tr_arch_preset_names(void);
/* The checks a model description must pass (from the command line, a
 * checkpoint's manifest or a Hugging Face config alike): 0, or 2 after
 * printing one line prefixed with `who` ("lpx train", "lpx mem"). */
int tr_arch_check(const tr_arch *a, const char *who);
/* Parses one architecture option (--dim --layers --heads --kv-heads --ffn
 * --vocab --rope-theta --tied --model): 1 if `opt` is not one, 0 when
 * parsed (*given |= its TR_GIVEN bit), 2 after printing the line. `tied`
 * takes no value (v unused). */
int tr_arch_option(const char *who, const char *opt, const char *v, tr_arch *a, unsigned *given);
/* After the options: --dim without --ffn takes SwiGLU's 8/3 dim rounded up
 * to a multiple of 32 (Llama's ratio) instead of the preset's ffn. */
void tr_arch_finish(tr_arch *a, unsigned given);
/* Hugging Face's inv_freq (f32, [head_dim / 2]) with the llama3 scaling */
void tr_arch_inv_freq(const tr_arch *a, float *out);
/* parameters of the model (embedding, blocks, norm, head) */
int64_t tr_arch_params(const tr_arch *a);

typedef struct tr_opts {
    tr_recipe recipe;
    int ranks;
    bool ranks_given;       /* --ranks on the command line (--comm mpi: must equal the world size) */
    char comm[32];
    bool comm_given;        /* --comm on the command line (--device cuda defaults it to nccl) */
    char device[16];
    bool offload;           /* --offload: shards, grads and AdamW state in host memory (--device cuda) */
    lpx_dtype act;          /* --act: activation dtype, LPX_F32 or LPX_BF16 (when act_given) */
    bool act_given;         /* --act on the command line (LPX_F32 is 0: no sentinel value) */
    int loss_chunk;         /* --loss-chunk: rows of the LM head + loss computed at once (0: automatic) */
    int steps, batch, seq, micro;
    tr_arch m;              /* the model */
    const char *save_hf;    /* --save-hf DIR */
    const char *tokens_dtype; /* --data FILE.bin: "u16" | "u32" (NULL: by vocab) */
    int pretrain_steps;     /* nf4-qlora without --init: bf16 steps that make the base */
    int lora_rank;
    int log_every;
    int eval_batches;       /* validation micro-batches (each `batch / micro` sequences) */
    int sample_len;
    double lr;
    uint64_t seed;
    int optim;              /* --optim: an lpx_fsdp_state (adamw: f32 moments) */
    int master;             /* --master: an lpx_fsdp_master (tr_master_names) */
    int optim_block;        /* --optim-block: the states' (and a scaled f16 master's) block, 0: 256 */
    bool optim_given, master_given, optim_block_given; /* on the command line (--resume: else the checkpoint's) */
    bool wrap_linear;       /* shard groups per linear instead of per block */
    bool ac;                /* --ac full: activation checkpointing per block */
    bool compare;
    bool quiet;
    const char *out_dir;
    const char *init_path;
    const char *data_path;
    double lora_dropout;    /* nf4-qlora: dropout on the adapter path (counter-based masks) */
    unsigned given;         /* TR_GIVEN_*: options given on the command line */

    /* checkpoints (ckpt.c) */
    const char *save_dir;   /* --save DIR: at the end (and every --save-every steps) */
    int save_every;
    const char *resume_dir; /* --resume DIR */
    int stop_after;         /* --stop-after N: stop after step N (the schedule still spans --steps); 0: none */

    /* numerics guards and fault injection (tests) */
    bool skip_nonfinite;    /* skip the optimizer step on non-finite grads instead of stopping */
    bool log_exact;         /* progress lines also print the loss in hex (%a) */
    int inject_nan_step;    /* --inject-nan STEP[:PARAM]: NaN and inf into a grad at STEP (1-based; 0: none) */
    char inject_nan_param[48];
    int inject_comm_step;   /* --inject-comm-fault STEP:RANK: RANK aborts the comm at STEP */
    int inject_comm_rank;
} tr_opts;

/* the activation dtype of recipe r's run: --act, else bf16 on a GPU and
 * f32 on the CPU (whose kernels compute in f32 anyway); the f32 recipe
 * (the reference) always f32 */
lpx_dtype tr_act_dtype(const tr_opts *o, tr_recipe r);

/* One rank per process: --comm mpi, or --comm nccl started by a launcher
 * (mpirun, or LPX_RANK / LPX_WORLD_SIZE set: lpx-nccl then runs this
 * process's rank alone, on its local GPU). For nccl, *rank and *world
 * (may be NULL) come from the launcher's environment (-1 when unset or
 * not a number). */
bool tr_per_process(const tr_opts *o, int *rank, int *world);

/* ---- options.c ---- */
/* "--opt=value": the option into buf (returned) and *inline_v = "value";
 * any other argument is returned as it is with *inline_v NULL */
const char *tr_split_opt(const char *arg, char *buf, size_t n, const char **inline_v);
/* true for an option of `lpx train` that takes a value / that takes none */
bool tr_train_option(const char *opt);
bool tr_train_flag(const char *opt);
/* Parses `lpx train` options (argv[0] is "train"). Returns 0, or 2 after
 * printing one clear line to stderr; 1 with *help set for --help. */
int tr_parse_train(int argc, char **argv, tr_opts *o, bool *help);
void tr_train_usage(FILE *f);
/* --micro divisible by --ranks: 0, or 2 after printing the line */
int tr_check_ranks(const tr_opts *o);
/* the checks between options (dims, divisibility): 0, or 2 after printing
 * the line; again after --resume filled options in from a manifest */
int tr_check_opts(const tr_opts *o);

/* ---- data.c ---- */
typedef struct tr_corpus {
    uint32_t *tok;           /* token ids */
    size_t n, n_train;       /* tokens; [0, n_train) trains, the rest validates */
    int vocab;               /* the model's vocabulary (every id is below it) */
    bool bytes;              /* a text file: token = byte (vocab 256) */
    char path[512];
} tr_corpus;

/* A text file (every byte a token), or pre-tokenized ids (FILE.bin,
 * little-endian u16 or u32: `dtype`, NULL = u16 when vocab <= 65536).
 * Every id is checked against vocab: LPX_ERANGE names the first one past
 * it and its position. Errors: LPX_EIO, LPX_EINVAL (too small, a size
 * that is not a whole number of ids), LPX_ENOMEM. */
lpx_status tr_corpus_load(const char *path, int vocab, const char *dtype, tr_corpus *c);
/* The whole file at `path` (at most max bytes) into a new NUL-terminated
 * buffer (free()), its size in *len. Errors: LPX_ENOTFOUND (no such file),
 * LPX_EINVAL (a directory, or larger than max), LPX_EIO, LPX_ENOMEM; the
 * message names the path. */
lpx_status tr_read_file(const char *path, size_t max, char **out, size_t *len);
/* tr_read_file for a file that must be a regular one (config.json, an
 * index, a manifest): a FIFO, socket or device is refused (LPX_EINVAL,
 * "'PATH' is not a regular file") without blocking on it. */
lpx_status tr_read_regular(const char *path, size_t max, char **out, size_t *len);
/* n little-endian token ids of `width` bytes (1, 2, 4) at b into out, each
 * below vocab; else LPX_ERANGE "WHAT: token id ID at position P is past the
 * vocabulary (V)". */
lpx_status tr_token_ids(const unsigned char *b, size_t n, int width, int vocab, const char *what, uint32_t *out);
void tr_corpus_free(tr_corpus *c);
/* Fills idx/tgt (i32, [b * seq]) with micro-batch `chunk` of step `step`
 * (val: validation micro-batch `chunk`). Depends only on (seed, step,
 * chunk), never on the rank count. */
void tr_batch(const tr_corpus *c, uint64_t seed, int step, int chunk, bool val, int b, int seq, int32_t *idx,
              int32_t *tgt);
/* The seed of a counter-based random stream (nf4-qlora's dropout masks):
 * a hash of (seed, step, micro-batch, parameter), so the run's random
 * state is (seed, step) and a resumed run draws the same numbers. */
uint64_t tr_rng_seed(uint64_t seed, int step, int chunk, int param);
/* FNV-1a 64 of a file's bytes (checkpoint manifests, corpus identity);
 * *bytes receives its size. Errors: LPX_EIO. */
lpx_status tr_file_fnv(const char *path, uint64_t *hash, uint64_t *bytes);

/* ---- json.c: fields of checked JSON ---- */
struct cJSON;
/* an integer-valued number in [lo, hi] under key; false if absent, not
 * a number, fractional or out of range */
bool tr_json_int(const struct cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out);
/* the string under key, or NULL */
const char *tr_json_str(const struct cJSON *o, const char *key);
/* The JSON object in the regular file PATH (at most 64 MiB), as Python's
 * json.load would read it or refused: a byte-order mark, a NUL byte, data
 * after the value, a non-object, a key repeated in one object (Python
 * keeps the last, cJSON the first) are LPX_EINVAL naming PATH. The caller
 * frees *out (cJSON_Delete). */
lpx_status tr_json_read(const char *path, struct cJSON **out);
/* v as 16 lowercase hex digits into buf (17 bytes); returns buf */
char *tr_hex64(uint64_t v, char *buf);

/* ---- model geometry (model.c) ---- */
enum { TR_L_Q = 0, TR_L_K, TR_L_V, TR_L_O, TR_L_W1, TR_L_W2, TR_L_W3, TR_LIN_PER_BLOCK };
typedef enum tr_pkind { TR_P_TOK, TR_P_NORM, TR_P_LIN, TR_P_NORMF, TR_P_HEAD } tr_pkind;

typedef struct tr_param {
    char name[32];          /* lpx's name (tok_emb, b0.wq, ...); hf_read.c maps Hugging Face's */
    tr_pkind kind;
    int layer;               /* -1 outside the blocks */
    int lin;                 /* TR_L_* for linears */
    int64_t rows, cols;      /* 1-D params: cols 1 */
    int group;               /* shard group (unshard / reduce-scatter unit) */
    bool decay;              /* AdamW weight decay */
} tr_param;

typedef struct tr_geom {
    tr_arch a;
    int vocab, dim, hidden, layers, heads, kv_heads, head_dim, seq;
    bool tied;
    int nparams, ngroups;
    tr_param *p;             /* [nparams] */
} tr_geom;

/* The parameters of model a (vocab set) for sequences of seq; groups per
 * block or per linear. Errors: LPX_ENOMEM. tr_geom_free releases. */
lpx_status tr_geom_init(tr_geom *g, const tr_arch *a, int seq, bool wrap_linear);
void tr_geom_free(tr_geom *g);
int64_t tr_geom_numel(const tr_geom *g);
/* weights that enter a GEMM per token (block linears, the LM head): the N
 * of the 6N model FLOPs per token */
int64_t tr_geom_matmul_params(const tr_geom *g);
/* the dense bf16 peak the summary's MFU divides by: an H100 SXM's and an
 * H200's (989.4 TFLOP/s, NVIDIA's data sheets; data/chips/) */
#define TR_PEAK_BF16_TFLOPS 989.4
/* index of parameter (kind, layer, lin) */
int tr_param_index(const tr_geom *g, tr_pkind kind, int layer, int lin);

/* --master's names by lpx_fsdp_master: "f32", "bf16-sr", "f16-scaled",
 * "f16-scaled-sr" (TR_MASTERS of them); the index of a name, or -1 */
#define TR_MASTERS 4
extern const char *const tr_master_names[TR_MASTERS];
int tr_master_from_name(const char *name);

#endif
