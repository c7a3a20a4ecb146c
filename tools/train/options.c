/* Command line of `lpx train`. Every bad option ends in exactly one line on
 * stderr ("lpx train: ...") and exit code 2. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "train.h"

void tr_train_usage(FILE *f)
{
    fprintf(f,
            "usage: lpx train [options]\n"
            "  --recipe R      bf16 | float8-tensorwise (default) | float8-rowwise | float8-delayed |\n"
            "                  float8-blockwise | nf4-qlora | mxfp8 | mxfp4 (MX recipes need the lpx-mx.so\n"
            "                  plugin) | f32\n"
            "  --compare       also train the bf16 baseline and report the gap (with --optim or\n"
            "                  --master: bf16-adamw-f32, f32 AdamW state and f32 masters)\n"
            "  --ranks N       ranks (local comm: threads), default 4; with --comm mpi the MPI\n"
            "                  world size (given: must equal it)\n"
            "  --comm C        local (default) | mpi (one rank per process: mpirun -np N lpx train\n"
            "                  --comm mpi ...; needs lpx-mpi.so) | nccl\n"
            "  --device D      cpu (default) | cuda: rank r on GPU r, collectives over NCCL\n"
            "  --offload       cuda: shards, grads, AdamW state in host memory (larger models)\n"
            "  --act T         activations f32 | bf16 (default: bf16 on cuda, f32 on cpu)\n"
            "  --loss-chunk N  rows of LM head + loss at once (default: logits <= 1 GiB)\n"
            "  --steps N       optimizer steps (default 300)\n"
            "  --batch N       sequences per step, all ranks together (default 16)\n"
            "  --micro N       micro-batches per step (default 4; ranks must divide it)\n"
            "  --seq N         context length (default 64)\n"
            "model (Llama 3; docs/MODEL.md):\n"
            "  --model M       tiny (default: dim 128, 2 layers, 4 heads, 2 kv heads, ffn 352,\n"
            "                  vocab 256) | llama3-8b | llama3-70b | llama3-405b | llama3.2-1b |\n"
            "                  llama3.2-3b (the published shapes); the options below override\n"
            "  --dim N --layers N --heads N --kv-heads N --ffn N --vocab N --rope-theta X --tied\n"
            "                  width (multiple of 32), blocks, query heads, key/value heads (divide\n"
            "                  the query heads), SwiGLU width (with --dim alone: 8/3 of it, rounded\n"
            "                  to 32), vocabulary (default: the data's:\n"
            "                  256 for text), rope base, LM head tied to the embedding\n"
            "  --lr X          peak learning rate (default 3e-3)\n"
            "  --optim O       adamw (default: f32 moments, 8 bytes/param) | adamw8bit (block-wise\n"
            "                  8-bit moments, 2.03) | adamw4bit (4-bit, 1.03) | adamw-fp8 (e4m3 m,\n"
            "                  scaled-f16 v, 3.03): AdamW's state in the shards, blocks of 256\n"
            "  --optim-block N the block of --optim's states and of a scaled f16 master: a power\n"
            "                  of two in 2..256 (default 256; torchao's AdamW4bit uses 128)\n"
            "  --master M      f32 (default) | bf16-sr: dense params kept as bf16 shards (2\n"
            "                  bytes/param), updated with stochastic rounding seeded by --seed |\n"
            "                  f16-scaled: FP8-LM's f16 codes with an f32 scale per block of\n"
            "                  256 (2.0156 bytes/param), RNE | f16-scaled-sr: the same, rounded\n"
            "                  stochastically\n"
            "  --seed N        seed of init and data (default 1)\n"
            "  --wrap W        block (default) | linear: one shard group per block or per linear\n"
            "  --ac A          none (default) | full: activation checkpointing, each block keeps\n"
            "                  its input and is recomputed in the backward\n"
            "  --lora-rank N   nf4-qlora adapter rank (default 8)\n"
            "  --pretrain N    nf4-qlora without --init: bf16 steps that make the base (default 150)\n"
            "  --init DIR      start from a Hugging Face Llama checkpoint (config.json and\n"
            "                  model*.safetensors): its config sets the model; every recipe\n"
            "                  (nf4-qlora quantizes it), e.g. the base an earlier nf4-qlora\n"
            "                  run pre-trained (OUT/base)\n"
            "  --save-hf DIR   write the trained model as a Hugging Face checkpoint\n"
            "                  (LlamaForCausalLM.from_pretrained reads it)\n"
            "  --data FILE     training text, every byte a token (default data/corpus.txt), or\n"
            "                  FILE.bin: token ids (u16, or u32 when the vocabulary exceeds 65536)\n"
            "  --data-dtype T  u16 | u32: the ids of a .bin file\n"
            "  --out DIR       metrics.csv, loss.svg; nf4-qlora's base/ (default train-out)\n"
            "  --log-every N   progress line every N steps (default 25)\n"
            "  --eval N        validation micro-batches (default 8)\n"
            "  --sample N      characters of generated text (default 240; 0: none)\n"
            "  --quiet         no progress lines\n"
            "  --lora-dropout P  nf4-qlora: dropout on the adapter path, 0 <= P < 1 (default 0)\n"
            "checkpoints (docs/TRAIN.md):\n"
            "  --save DIR      write a checkpoint to DIR at the end (atomically: DIR is replaced\n"
            "                  only by a complete one)\n"
            "  --save-every N  also every N steps\n"
            "  --resume DIR    continue from checkpoint DIR (options not given come from it;\n"
            "                  a float8/bf16/mx checkpoint resumes under another of those recipes)\n"
            "  --stop-after N  stop after step N (the schedule still spans --steps), e.g. to resume\n"
            "numerics:\n"
            "  --skip-nonfinite  skip the optimizer step on NaN/inf gradients (default: stop, exit 1)\n"
            "  --log-exact     progress lines also print the loss in hex (%%a), exactly\n"
            "testing:\n"
            "  --inject-nan STEP[:PARAM]     NaN and inf into PARAM's gradient (default the first\n"
            "                                linear; 'loss': the loss) at STEP\n"
            "  --inject-comm-fault STEP:RANK RANK aborts the comm at STEP\n");
}

/* The integer options and their ranges: the parser reads them through
 * this table, and tr_check_opts checks the values again through it, so a
 * value a checkpoint's manifest supplies passes exactly the command line's
 * validation (one validator for both). */
typedef struct int_limit {
    const char *opt;
    size_t off;
    long lo, hi;
} int_limit;

#define LIM(opt, field, lo, hi) {opt, offsetof(tr_opts, field), lo, hi}
static const int_limit limits[] = {
    LIM("--ranks", ranks, 1, 64),           LIM("--steps", steps, 1, 1000000),
    LIM("--batch", batch, 1, 65536),        LIM("--micro", micro, 1, 4096),
    LIM("--seq", seq, 2, 1 << 20),          LIM("--lora-rank", lora_rank, 1, 1024),
    LIM("--pretrain", pretrain_steps, 1, 1000000), LIM("--log-every", log_every, 1, 1000000),
    LIM("--eval", eval_batches, 1, 100000), LIM("--sample", sample_len, 0, 100000),
};

static const int_limit *limit_of(const char *opt)
{
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++)
        if (!strcmp(limits[i].opt, opt)) return &limits[i];
    return NULL;
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "lpx train: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 2;
}

static int parse_int(const char *opt, const char *v, long lo, long hi, int *out);

/* an option of the limits table */
static int parse_lim(const char *opt, const char *v, int *out)
{
    const int_limit *l = limit_of(opt);
    return parse_int(opt, v, l ? l->lo : INT_MIN, l ? l->hi : INT_MAX, out);
}

static int parse_int(const char *opt, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof range, "an integer in %ld..%ld", lo, hi);
        fprintf(stderr, "lpx train: %s '%s': expected %s\n", opt, v, range);
        return 2;
    }
    *out = (int)x;
    return 0;
}

int tr_check_ranks(const tr_opts *o)
{
    if (o->micro % o->ranks) {
        char buf[160];
        snprintf(buf, sizeof buf, "--micro %d is not divisible by --ranks %d (each rank takes whole micro-batches)",
                 o->micro, o->ranks);
        return bad("%s%s", buf, "");
    }
    return 0;
}

int tr_check_opts(const tr_opts *o)
{
    char buf[160];
    int rc;
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        int v = *(const int *)((const char *)o + limits[i].off);
        if (v < limits[i].lo || v > limits[i].hi) {
            snprintf(buf, sizeof buf, "%s %d: expected an integer in %ld..%ld", limits[i].opt, v, limits[i].lo,
                     limits[i].hi);
            return bad("%s%s", buf, "");
        }
    }
    if (!(o->lr > 0 && o->lr < 10)) {
        snprintf(buf, sizeof buf, "--lr %g: expected a number in (0, 10)", o->lr);
        return bad("%s%s", buf, "");
    }
    if (!(o->lora_dropout >= 0 && o->lora_dropout < 1)) {
        snprintf(buf, sizeof buf, "--lora-dropout %g: expected a number in [0, 1)", o->lora_dropout);
        return bad("%s%s", buf, "");
    }
    if ((rc = tr_arch_check(&o->m, "lpx train"))) return rc;
    /* --comm mpi without --ranks: the world size is known once MPI runs
     * (world.c checks it then) */
    if ((o->ranks_given || !tr_per_process(o, NULL, NULL)) && (rc = tr_check_ranks(o))) return rc;
    if (o->batch % o->micro) {
        snprintf(buf, sizeof buf, "--batch %d is not divisible by --micro %d", o->batch, o->micro);
        return bad("%s%s", buf, "");
    }
    if (o->stop_after > o->steps) {
        snprintf(buf, sizeof buf, "--stop-after %d is beyond --steps %d", o->stop_after, o->steps);
        return bad("%s%s", buf, "");
    }
    return 0;
}

/* STEP or STEP:REST: the step (>= 1) and REST (NULL when absent) */
static int parse_step_arg(const char *opt, const char *v, int *step, const char **rest)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || x < 1 || x > 1000000 || (*end && *end != ':')) {
        fprintf(stderr, "lpx train: %s '%s': expected STEP%s (STEP >= 1)\n", opt, v,
                !strcmp(opt, "--inject-nan") ? "[:PARAM]" : ":RANK");
        return 2;
    }
    *step = (int)x;
    *rest = *end == ':' ? end + 1 : NULL;
    return 0;
}

/* a non-negative integer from the first of two environment variables set, else -1 */
static int env_int(const char *a, const char *b)
{
    const char *names[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        return *end || errno || x < 0 || x > INT_MAX ? -1 : (int)x;
    }
    return -1;
}

bool tr_per_process(const tr_opts *o, int *rank, int *world)
{
    int r = -1, w = -1;
    bool per = !strcmp(o->comm, "mpi");
    if (!strcmp(o->comm, "nccl")) {
        /* the variables lpx-nccl's launch reads (backends/nccl, nccl_run) */
        w = env_int("LPX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE");
        r = env_int("LPX_RANK", "OMPI_COMM_WORLD_RANK");
        per = getenv("LPX_WORLD_SIZE") || getenv("OMPI_COMM_WORLD_SIZE") || getenv("LPX_RANK") ||
              getenv("OMPI_COMM_WORLD_RANK");
    }
    if (rank) *rank = r;
    if (world) *world = w;
    return per;
}

lpx_dtype tr_act_dtype(const tr_opts *o, tr_recipe r)
{
    if (r == TR_F32) return LPX_F32;
    if (o->act_given) return o->act;
    /* a device (a GPU, or the simulated one that stands for it in CI)
     * keeps activations in bf16 */
    return strcmp(o->device, "cpu") ? LPX_BF16 : LPX_F32;
}

const char *tr_split_opt(const char *arg, char *buf, size_t n, const char **inline_v)
{
    *inline_v = NULL;
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    if (!eq) return arg;
    if ((size_t)(eq - arg) >= n) return arg;   /* too long to be an option: left whole, refused as unknown */
    memcpy(buf, arg, (size_t)(eq - arg));
    buf[eq - arg] = 0;
    *inline_v = eq + 1;
    return buf;
}

/* the options of `lpx train` that take a value, and those that do not */
static const char *const valued[] = {
    "--recipe", "--ranks", "--comm", "--device", "--steps", "--batch", "--micro", "--seq", "--model", "--dim",
    "--layers", "--heads", "--kv-heads", "--ffn", "--vocab", "--rope-theta", "--lr", "--seed", "--wrap", "--ac", "--optim", "--optim-block", "--master",
    "--lora-rank", "--pretrain", "--init", "--save-hf", "--data", "--data-dtype", "--out", "--log-every", "--eval",
    "--sample", "--lora-dropout", "--save", "--save-every", "--resume", "--stop-after", "--inject-nan",
    "--inject-comm-fault", "--act", "--loss-chunk",
};
static const char *const flags[] = {"--compare", "--quiet", "--skip-nonfinite", "--log-exact", "--tied", "--offload"};

bool tr_train_option(const char *a)
{
    for (size_t i = 0; i < sizeof valued / sizeof *valued; i++)
        if (!strcmp(a, valued[i])) return true;
    return false;
}

bool tr_train_flag(const char *a)
{
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (!strcmp(a, flags[i])) return true;
    return false;
}

int tr_parse_train(int argc, char **argv, tr_opts *o, bool *help)
{
    memset(o, 0, sizeof *o);
    o->recipe = TR_F8_TENSORWISE;
    o->ranks = 4;
    snprintf(o->comm, sizeof o->comm, "local");
    snprintf(o->device, sizeof o->device, "cpu");
    o->steps = 300;
    o->batch = 16;
    o->micro = 4;
    o->seq = 64;
    tr_arch_preset("tiny", &o->m);
    o->m.vocab = 0;   /* the data's */
    o->lr = 3e-3;
    o->seed = 1;
    o->lora_rank = 8;
    o->pretrain_steps = 150;
    o->log_every = 25;
    o->eval_batches = 8;
    o->sample_len = 240;
    o->out_dir = "train-out";
    o->data_path = NULL;
    *help = false;
    int rc = 0, seed = 1;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *inline_v = NULL;
        char opt[64];
        const char *a = tr_split_opt(argv[i], opt, sizeof opt, &inline_v);   /* --opt=value too */
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = true;
            return 1;
        }
        if (inline_v && tr_train_flag(a)) return bad("option %s takes no value%s", a, "");
        if (!strcmp(a, "--compare")) { o->compare = true; continue; }
        if (!strcmp(a, "--quiet")) { o->quiet = true; continue; }
        if (!strcmp(a, "--skip-nonfinite")) { o->skip_nonfinite = true; continue; }
        if (!strcmp(a, "--log-exact")) { o->log_exact = true; continue; }
        if (!strcmp(a, "--offload")) { o->offload = true; continue; }
        if (!strcmp(a, "--tied")) { tr_arch_option("lpx train", a, NULL, &o->m, &o->given); continue; }
        if (strncmp(a, "--", 2) != 0) return bad("unexpected argument '%s'%s", a, "");
        if (!tr_train_option(a)) return bad("unknown option '%s'%s (lpx train --help lists them)", a, "");
        if (!inline_v && i + 1 >= argc) return bad("option %s needs a value%s", a, "");
        const char *v = inline_v ? inline_v : argv[++i];
        int arch = tr_arch_option("lpx train", a, v, &o->m, &o->given);
        if (arch == 2) return 2;
        if (arch == 0) continue;
        if (!strcmp(a, "--recipe")) {
            int r = tr_recipe_from_name(v);
            if (r < 0)
                return bad("unknown recipe '%s' (%s)", v,
                           "bf16, float8-tensorwise, float8-rowwise, float8-delayed, float8-blockwise, nf4-qlora, mxfp8, "
                           "mxfp4, f32");
            o->recipe = (tr_recipe)r;
            o->given |= TR_GIVEN_RECIPE;
        } else if (!strcmp(a, "--ranks")) {
            rc = parse_lim(a, v, &o->ranks);
            o->ranks_given = true;
            o->given |= TR_GIVEN_RANKS;
        }
        else if (!strcmp(a, "--comm")) {
            if (strcmp(v, "local") && strcmp(v, "mpi") && strcmp(v, "nccl") && strcmp(v, "sim"))
                return bad("unknown comm backend '%s' (%s)", v, "local, mpi, nccl, sim");
            snprintf(o->comm, sizeof o->comm, "%s", v);
            o->comm_given = true;
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "sim"))
                return bad("unknown device '%s' (%s)", v, "cpu, cuda, sim");
            snprintf(o->device, sizeof o->device, "%s", v);
        } else if (!strcmp(a, "--loss-chunk")) {
            rc = parse_int(a, v, 1, 1 << 30, &o->loss_chunk);
        } else if (!strcmp(a, "--act")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) return bad("unknown --act '%s' (%s)", v, "f32, bf16");
            o->act = !strcmp(v, "f32") ? LPX_F32 : LPX_BF16;
            o->act_given = true;
        } else if (!strcmp(a, "--steps")) { rc = parse_lim(a, v, &o->steps); o->given |= TR_GIVEN_STEPS; }
        else if (!strcmp(a, "--batch")) { rc = parse_lim(a, v, &o->batch); o->given |= TR_GIVEN_BATCH; }
        else if (!strcmp(a, "--micro")) { rc = parse_lim(a, v, &o->micro); o->given |= TR_GIVEN_MICRO; }
        else if (!strcmp(a, "--seq")) { rc = parse_lim(a, v, &o->seq); o->given |= TR_GIVEN_SEQ; }
        else if (!strcmp(a, "--lora-rank")) { rc = parse_lim(a, v, &o->lora_rank); o->given |= TR_GIVEN_LORA_RANK; }
        else if (!strcmp(a, "--pretrain")) rc = parse_lim(a, v, &o->pretrain_steps);
        else if (!strcmp(a, "--log-every")) rc = parse_lim(a, v, &o->log_every);
        else if (!strcmp(a, "--eval")) { rc = parse_lim(a, v, &o->eval_batches); o->given |= TR_GIVEN_EVAL; }
        else if (!strcmp(a, "--sample")) rc = parse_lim(a, v, &o->sample_len);
        else if (!strcmp(a, "--seed")) {
            rc = parse_int(a, v, 0, 2147483647, &seed);
            o->seed = (uint64_t)seed;
            o->given |= TR_GIVEN_SEED;
        } else if (!strcmp(a, "--save-every")) rc = parse_int(a, v, 1, 1000000, &o->save_every);
        else if (!strcmp(a, "--stop-after")) rc = parse_int(a, v, 1, 1000000, &o->stop_after);
        else if (!strcmp(a, "--save")) o->save_dir = v;
        else if (!strcmp(a, "--resume")) o->resume_dir = v;
        else if (!strcmp(a, "--lora-dropout")) {
            char *end;
            o->lora_dropout = strtod(v, &end);
            if (*end || end == v || !(o->lora_dropout >= 0 && o->lora_dropout < 1))
                return bad("--lora-dropout '%s': expected a number in [0, 1)%s", v, "");
            o->given |= TR_GIVEN_LORA_DROPOUT;
        } else if (!strcmp(a, "--inject-nan")) {
            const char *rest;
            if ((rc = parse_step_arg(a, v, &o->inject_nan_step, &rest))) return rc;
            if (rest && (!*rest || strlen(rest) >= sizeof o->inject_nan_param))
                return bad("--inject-nan '%s': PARAM must be 1..%s characters", v, "47");
            snprintf(o->inject_nan_param, sizeof o->inject_nan_param, "%s", rest ? rest : "");
        } else if (!strcmp(a, "--inject-comm-fault")) {
            const char *rest;
            if ((rc = parse_step_arg(a, v, &o->inject_comm_step, &rest))) return rc;
            if (!rest || parse_int(a, rest, 0, 63, &o->inject_comm_rank)) return bad("--inject-comm-fault '%s': expected STEP:RANK%s", v, "");
        }
        else if (!strcmp(a, "--optim")) {
            static const char *const names[] = {"adamw", "adamw8bit", "adamw4bit", "adamw-fp8"};
            o->optim = -1;
            for (int k = 0; k < 4; k++)
                if (!strcmp(v, names[k])) o->optim = k;
            if (o->optim < 0) return bad("unknown --optim '%s' (%s)", v, "adamw, adamw8bit, adamw4bit, adamw-fp8");
            o->optim_given = true;
        } else if (!strcmp(a, "--optim-block")) {
            int b = 0;
            if (parse_int(a, v, 2, 256, &b) || (b & (b - 1))) return bad("--optim-block '%s': expected a power of two in 2..256%s", v, "");
            o->optim_block = b;
            o->optim_block_given = true;
        } else if (!strcmp(a, "--master")) {
            if (tr_master_from_name(v) < 0)
                return bad("unknown --master '%s' (%s)", v, "f32, bf16-sr, f16-scaled, f16-scaled-sr");
            o->master = tr_master_from_name(v);
            o->master_given = true;
        }
        else if (!strcmp(a, "--lr")) {
            char *end;
            o->lr = strtod(v, &end);
            if (*end || end == v || !(o->lr > 0 && o->lr < 10)) return bad("--lr '%s': expected a number in (0, 10)%s", v, "");
            o->given |= TR_GIVEN_LR;
        } else if (!strcmp(a, "--wrap")) {
            if (strcmp(v, "block") && strcmp(v, "linear")) return bad("unknown --wrap '%s' (%s)", v, "block, linear");
            o->wrap_linear = !strcmp(v, "linear");
            o->given |= TR_GIVEN_WRAP;
        } else if (!strcmp(a, "--ac")) {
            if (strcmp(v, "none") && strcmp(v, "full")) return bad("unknown --ac '%s' (%s)", v, "none, full");
            o->ac = !strcmp(v, "full");
        } else if (!strcmp(a, "--init")) o->init_path = v;
        else if (!strcmp(a, "--save-hf")) o->save_hf = v;
        else if (!strcmp(a, "--data-dtype")) {
            if (strcmp(v, "u16") && strcmp(v, "u32")) return bad("unknown --data-dtype '%s' (%s)", v, "u16, u32");
            o->tokens_dtype = v;
        }
        else if (!strcmp(a, "--data")) {
            o->data_path = v;
            o->given |= TR_GIVEN_DATA;
        }
        else if (!strcmp(a, "--out")) o->out_dir = v;
        else return bad("unknown option '%s'%s (lpx train --help lists them)", a, "");
    }
    if (rc) return rc;
    tr_arch_finish(&o->m, o->given);
    bool cuda = !strcmp(o->device, "cuda"), sim = !strcmp(o->device, "sim");
    if (cuda && !o->comm_given) snprintf(o->comm, sizeof o->comm, "nccl");
    if (sim && !o->comm_given) snprintf(o->comm, sizeof o->comm, "sim");
    if (o->offload && !cuda && !sim)
        return bad("--offload keeps the shards in host memory while a GPU computes: it needs --device cuda (or "
                   "sim)%s%s", "", "");
    if (cuda && strcmp(o->comm, "nccl"))
        return bad("--device cuda runs its collectives over NCCL: --comm nccl (the default with --device cuda; "
                   "under mpirun too), not --comm %s%s", o->comm, "");
    if (sim && strcmp(o->comm, "sim"))
        return bad("--device sim runs its collectives on the simulated devices: --comm sim (the default with "
                   "--device sim), not --comm %s%s", o->comm, "");
    if (!sim && !strcmp(o->comm, "sim"))
        return bad("--comm sim gathers simulated device memory: it needs --device sim%s%s", "", "");
    if (o->recipe == TR_F32 && o->act_given && o->act == LPX_BF16)
        return bad("--recipe f32 is the all-f32 reference: leave out --act bf16%s%s", "", "");
    if (!cuda && !strcmp(o->comm, "nccl"))
        return bad("--comm nccl gathers GPU memory: it needs --device cuda%s%s", "", "");
    /* "ck/" names the directory "ck": without the slash, its siblings
     * ("ck.tmp") are not made inside it */
    static char dirs[4][4096];
    const char **paths[4] = {&o->save_dir, &o->resume_dir, &o->save_hf, &o->out_dir};
    for (int k = 0; k < 4; k++) {
        const char *d = *paths[k];
        size_t n = d ? strlen(d) : 0;
        if (!n || d[n - 1] != '/') continue;
        while (n > 1 && d[n - 1] == '/') n--;
        if (n >= sizeof dirs[k]) return bad("path '%s' is too long%s", d, "");
        memcpy(dirs[k], d, n);
        dirs[k][n] = 0;
        *paths[k] = dirs[k];
    }
    /* --resume: checked once the manifest filled in the options not given */
    if (!o->resume_dir && (rc = tr_check_opts(o))) return rc;
    if (o->save_hf && o->recipe == TR_NF4_QLORA)
        return bad("--save-hf writes a dense model; nf4-qlora trains adapters on a quantized base (save them with --save)%s%s", "", "");
    if (o->save_every && !o->save_dir) return bad("--save-every needs --save DIR%s%s", "", "");
    if (o->resume_dir && o->init_path) return bad("--resume and --init exclude each other (the checkpoint holds the base)%s%s", "", "");
    if (o->compare && (o->resume_dir || o->save_dir))
        return bad("--compare runs two recipes; --save and --resume checkpoint one (leave --compare out)%s%s", "", "");
    return 0;
}

const char *const tr_master_names[TR_MASTERS] = {"f32", "bf16-sr", "f16-scaled", "f16-scaled-sr"};

int tr_master_from_name(const char *name)
{
    for (int k = 0; name && k < TR_MASTERS; k++)
        if (!strcmp(name, tr_master_names[k])) return k;
    return -1;
}
