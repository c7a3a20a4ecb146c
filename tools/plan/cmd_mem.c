/* `lpx mem`: memory per rank of a model before running it (docs/MODEL.md,
 * "Memory"). The categories are tools/train/mem.c's model
 * (tr_mem_estimate_geom, the accounting lpx train measures); this command
 * adds the optimizer choices of lpx train (--optim, --master: issue 37),
 * whose master, grad-shard and optimizer-state bytes per rank come from
 * optim_mem.c, counted as the state kinds store them on the engine's
 * shards. With the defaults (adamw, f32) the numbers are mem.c's. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "optim_mem.h"
#include "../train/mem.h"
#include "../lpx/commands.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx mem [--model M] [--dim D --layers L --heads H --kv-heads K --ffn F --vocab V\n"
               "               --rope-theta X --tied] [--params N] [--recipe R] [--ranks N[,N...]]\n"
               "               [--batch B] [--seq T] [--ac none|full] [--act f32|bf16] [--offload]\n"
               "               [--lora-rank R] [--wrap block|linear]\n"
               "               [--optim adamw|adamw8bit|adamw4bit|adamw-fp8|all] [--master f32|bf16-sr|\n"
               "               f16-scaled|f16-scaled-sr]\n"
               "  memory per rank of the lpx train model (Llama 3): params, grads, optimizer,\n"
               "  unsharded, activations. --model: %s (default tiny);\n"
               "  the options after it override. --params N picks a Llama-like shape of about N\n"
               "  parameters instead. --batch: sequences per micro-batch on one rank (default 1);\n"
               "  --seq default 2048 (tiny: 64); --act: activation dtype (default bf16; lpx train on the\n"
               "  CPU keeps f32); --ac full: activation checkpointing per block; --ranks: one or\n"
               "  more world sizes (a column each); --offload: masters and optimizer state on the host.\n"
               "  CPU process: lpx train on the CPU, all ranks in one process (with --act f32, its\n"
               "  activations): ranks x the total + the f32 initial weights + a modelled overhead.\n"
               "  --optim, --master: lpx train's optimizer state and masters (default adamw, f32):\n"
               "  8-bit, 4-bit or fp8 block-quantized m and v (block 256, one f32 scale per block\n"
               "  per moment, blocks whole on each rank), bf16 masters, FP8-LM's scaled f16 masters\n"
               "  (2 bytes + an f32 scale per block of 256); rows give the bytes per\n"
               "  parameter of rank 0's shards. --optim all: one row per choice and world size.\n",
            tr_arch_preset_names());
}

static int bad(const char *msg, const char *v)
{
    fprintf(stderr, "lpx mem: %s '%s'\n", msg, v);
    return 2;
}

static void human(char *buf, size_t n, double bytes)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, n, "%.2f %s", bytes, u[i]);
}

#define MAX_WORLDS 16

/* one world's estimate under a choice; its device total and CPU process as the table's */
static int estimate(const tr_geom *g, int recipe, int world, int lora, int batch, bool wrap_linear, int act_bytes,
                    bool ac, pl_optim o, pl_master m, tr_mem_est *e, pl_optim_mem *om)
{
    tr_mem_estimate_geom(g, (tr_recipe)recipe, world, lora, batch, 1, wrap_linear, act_bytes, ac, e);
    return pl_mem_apply_optim(g, recipe, world, lora, o, m, e, om);
}

/* --optim all: a row per world size and choice */
static int mem_all(const tr_geom *g, int recipe, const int *worlds, int nworlds, int lora, int batch, bool wrap_linear,
                   int act_bytes, bool ac, bool offload, pl_master m)
{
    printf("per rank           ranks  state B/param  master B/param       params    optimizer  %s\n",
           offload ? "device total         host" : "device total");
    for (int w = 0; w < nworlds; w++)
        for (int o = 0; o < PL_OPTIMS; o++) {
            tr_mem_est e;
            pl_optim_mem om;
            if (estimate(g, recipe, worlds[w], lora, batch, wrap_linear, act_bytes, ac, (pl_optim)o, m, &e, &om)) {
                fprintf(stderr, "lpx mem: %s\n", lpx_last_error());
                return 2;
            }
            int64_t host = offload ? e.params + e.optimizer : 0;
            int64_t dev = e.grads + e.unsharded + e.activations + e.transient + e.params + e.optimizer - host;
            char pb[32], ob[32], db[32], hb[32];
            human(pb, sizeof pb, (double)e.params);
            human(ob, sizeof ob, (double)e.optimizer);
            human(db, sizeof db, (double)dev);
            human(hb, sizeof hb, (double)host);
            double n = om.elems ? (double)om.elems : 1.0;
            printf("  %-17s %6d  %13.5f  %14.5f  %11s  %11s  %12s", pl_optim_name((pl_optim)o), worlds[w],
                   (double)om.state / n, (double)om.master / n, pb, ob, db);
            if (offload) printf(" %12s", hb);
            printf("\n");
        }
    printf("(masters %s; state B/param: m + v + block scales over rank 0's trainable elements)\n",
           pl_master_name(m));
    return 0;
}

int lpx_cmd_mem_optim(int argc, char **argv)
{
    double params = 0;
    long batch = 1, seq = 0, lora = 8;
    int worlds[MAX_WORLDS] = {1}, nworlds = 1;
    int recipe = TR_BF16;
    bool offload = false, ac = false, wrap_linear = false;
    int act_bytes = 2;
    int optim = PL_OPTIM_ADAMW, master = PL_MASTER_F32;
    bool optim_all = false, optim_given = false;
    unsigned given = 0;
    tr_arch a;
    tr_arch_preset("tiny", &a);
    static const char *const valued[] = {"--model", "--dim", "--layers", "--heads", "--kv-heads", "--ffn",
                                         "--vocab", "--rope-theta", "--params", "--recipe", "--ranks", "--batch",
                                         "--seq", "--ac", "--act", "--lora-rank", "--wrap", "--optim",
                                         "--master"};
    for (int i = 1; i < argc; i++) {
        char buf[64];
        const char *iv = NULL, *o = tr_split_opt(argv[i], buf, sizeof buf, &iv);   /* --opt=value too */
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(o, "--offload") || !strcmp(o, "--tied")) {
            if (iv) return bad("option takes no value:", o);
            if (!strcmp(o, "--offload")) offload = true;
            else tr_arch_option("lpx mem", o, NULL, &a, &given);
            continue;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= !strcmp(o, valued[k]);
        if (!known) return bad("unknown option (lpx mem --help lists them)", o);
        if (!iv && i + 1 >= argc) return bad("option needs a value:", o);
        const char *v = iv ? iv : argv[++i];
        int rc = tr_arch_option("lpx mem", o, v, &a, &given);
        if (rc == 2) return 2;
        if (rc == 0) continue;
        char *end;
        if (!strcmp(o, "--optim")) {
            optim_all = !strcmp(v, "all");
            optim = optim_all ? PL_OPTIM_ADAMW : pl_optim_from_name(v);
            if (optim < 0) return bad("--optim expects " PL_OPTIM_CHOICES " (or all), got", v);
            optim_given = true;
        } else if (!strcmp(o, "--master")) {
            master = pl_master_from_name(v);
            if (master < 0) return bad("--master expects " PL_MASTER_CHOICES ", got", v);
            optim_given = true;
        } else if (!strcmp(o, "--recipe")) {
            recipe = tr_recipe_from_name(v);
            if (recipe < 0) return bad("unknown recipe", v);
        } else if (!strcmp(o, "--params")) {
            params = strtod(v, &end);
            if (*end || !(params >= 1e3 && params <= 1e13)) return bad("--params expects a count in 1e3..1e13, got", v);
        } else if (!strcmp(o, "--ac")) {
            if (strcmp(v, "none") && strcmp(v, "full")) return bad("--ac expects none or full, got", v);
            ac = !strcmp(v, "full");
        } else if (!strcmp(o, "--act")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) return bad("--act expects f32 or bf16, got", v);
            act_bytes = !strcmp(v, "f32") ? 4 : 2;
        } else if (!strcmp(o, "--wrap")) {
            if (strcmp(v, "block") && strcmp(v, "linear")) return bad("--wrap expects block or linear, got", v);
            wrap_linear = !strcmp(v, "linear");
        } else if (!strcmp(o, "--ranks")) {
            nworlds = 0;
            for (const char *p = v; *p;) {
                long x = strtol(p, &end, 10);
                if (end == p || x < 1 || x > 1000000 || (*end && *end != ',') || nworlds == MAX_WORLDS)
                    return bad("--ranks expects up to 16 world sizes N[,N...] (1..1000000), got", v);
                worlds[nworlds++] = (int)x;
                p = *end ? end + 1 : end;
            }
        } else {
            /* sane ranges: a LoRA rank below 2^16, 2^20 sequences of 2^24 tokens */
            long hi = !strcmp(o, "--lora-rank") ? 65536 : !strcmp(o, "--batch") ? 1048576 : 16777216;
            errno = 0;
            long x = strtol(v, &end, 10);
            if (errno || *end || end == v || x < 1 || x > hi) {
                fprintf(stderr, "lpx mem: %s '%s': expected an integer in 1..%ld\n", o, v, hi);
                return 2;
            }
            if (!strcmp(o, "--lora-rank")) lora = x;
            else if (!strcmp(o, "--batch")) batch = x;
            else if (!strcmp(o, "--seq")) seq = x;
            else return bad("unknown option", o);
        }
    }
    tr_arch_finish(&a, given);
    if (params > 0 && (given & (TR_GIVEN_MODEL | TR_GIVEN_DIM | TR_GIVEN_LAYERS)))
        return bad("give --params or --model/--dim/--layers, not both:", "--params");
    if (params > 0) {
        /* Llama-like: head dim 128, kv heads 8 (or fewer), ffn ~3.5 d, dim = 128 * layers,
         * vocab 128256 unless given */
        if (!(given & TR_GIVEN_VOCAB)) a.vocab = 128256;
        double best = INFINITY;
        tr_arch t = a;
        for (int l = 1; l <= 400; l++) {
            t.layers = l;
            t.dim = 128 * l;
            t.heads = l;
            t.kv_heads = l % 8 == 0 ? 8 : l % 4 == 0 ? 4 : l % 2 == 0 ? 2 : 1;
            t.ffn = (int)((7 * (int64_t)t.dim / 2 + 255) / 256 * 256);
            double n = (double)tr_arch_params(&t);
            if (fabs(n - params) < best) {
                best = fabs(n - params);
                a = t;
            }
        }
    }
    if (tr_arch_check(&a, "lpx mem")) return 2;
    bool tiny = a.vocab == 256 && a.dim == 128 && a.layers == 2 && params == 0;
    if (!seq) seq = tiny ? 64 : 2048;
    tr_geom g;
    if (tr_geom_init(&g, &a, (int)seq, wrap_linear) != LPX_OK) {
        fprintf(stderr, "lpx mem: %s\n", lpx_last_error());
        tr_geom_free(&g);
        return 1;
    }
    if (tr_mem_estimate_check(&g, 1, (int)lora, (int)batch, act_bytes, "lpx mem") != LPX_OK) {
        fprintf(stderr, "%s\n", lpx_last_error());
        tr_geom_free(&g);
        return 2;
    }
    printf("model: dim %d, layers %d, heads %d (kv %d), ffn %d, vocab %d%s, seq %ld: %lld params\n", a.dim, a.layers,
           a.heads, a.kv_heads, a.ffn, a.vocab, a.tied ? ", tied head" : "", seq, (long long)tr_geom_numel(&g));
    printf("recipe %s; %ld sequence%s of %ld per micro-batch; activations %s%s%s\n",
           tr_recipe_name((tr_recipe)recipe), batch, batch == 1 ? "" : "s", seq, act_bytes == 2 ? "bf16" : "f32",
           ac ? ", checkpointed per block (--ac full)" : "", offload ? "; --offload: masters and AdamW state on the host" : "");
    if (optim_given && !optim_all)
        printf("optimizer %s: %s; masters %s\n", pl_optim_name((pl_optim)optim),
               optim == PL_OPTIM_ADAMW ? "f32 m and v"
                                       : optim == PL_OPTIM_8BIT ? "8-bit m and v, an f32 scale per block of 256"
                                       : optim == PL_OPTIM_4BIT ? "4-bit m and v, an f32 scale per block of 256"
                                                                : "e4m3 m and scaled f16 v, an f32 scale per block of 256",
               pl_master_name((pl_master)master));
    if (optim_all) {
        int rc = mem_all(&g, recipe, worlds, nworlds, (int)lora, (int)batch, wrap_linear, act_bytes, ac, offload,
                         (pl_master)master);
        tr_geom_free(&g);
        return rc;
    }
    printf("per rank        ");
    for (int w = 0; w < nworlds; w++) printf(" %12d%s", worlds[w], w == 0 ? (nworlds == 1 ? " rank(s)" : " ranks") : "");
    printf("\n");
    tr_mem_est e[MAX_WORLDS];
    pl_optim_mem om[MAX_WORLDS];
    for (int w = 0; w < nworlds; w++) {
        tr_mem_estimate_geom(&g, (tr_recipe)recipe, worlds[w], (int)lora, (int)batch, 1, wrap_linear, act_bytes, ac, &e[w]);
        if (pl_mem_apply_optim(&g, recipe, worlds[w], (int)lora, (pl_optim)optim, (pl_master)master, &e[w], &om[w])) {
            fprintf(stderr, "lpx mem: %s\n", lpx_last_error());
            tr_geom_free(&g);
            return 2;
        }
    }
    const char *rows[] = {"params", "grads", "optimizer", "unsharded", "activations", "loss chunk", "device total",
                          "host", "CPU process"};
    for (int r = 0; r < 9; r++) {
        if (r == 7 && !offload) continue;
        printf("  %-14s", rows[r]);
        for (int w = 0; w < nworlds; w++) {
            const tr_mem_est *x = &e[w];
            /* --offload moves the parameter shards (f32 masters; nf4-qlora:
             * its NF4 base shards too, as FSDP's CPU offload does) and
             * AdamW's state to the host */
            int64_t host = offload ? x->params + x->optimizer : 0;
            int64_t dev = x->grads + x->unsharded + x->activations + x->transient + x->params + x->optimizer - host;
            /* lpx train on the CPU: every rank a thread of one process, the
             * f32 initial weights (nf4-qlora: and its base), the modelled
             * overhead (tr_mem_overhead); the corpus is not counted */
            int64_t all = x->grads + x->unsharded + x->activations + x->transient + x->params + x->optimizer;
            double proc = (double)all * worlds[w] + 4.0 * (double)tr_geom_numel(&g) * (recipe == TR_NF4_QLORA ? 2 : 1) +
                          tr_mem_overhead(x, worlds[w], false);
            int64_t v[9] = {x->params, x->grads, x->optimizer, x->unsharded, x->activations, x->transient, dev, host,
                            (int64_t)proc};
            char b[32];
            human(b, sizeof b, (double)v[r]);
            printf(" %12s", b);
        }
        printf("\n");
    }
    /* the choice's bytes per trainable parameter of rank 0's shards */
    for (int r = 0; optim_given && r < 2; r++) {
        printf("  %-14s", r == 0 ? "state B/param" : "master B/param");
        for (int w = 0; w < nworlds; w++)
            printf(" %12.5f", om[w].elems ? (double)(r == 0 ? om[w].state : om[w].master) / (double)om[w].elems : 0.0);
        printf("\n");
    }
    tr_geom_free(&g);
    return 0;
}
