/* `lpx plan`: one training step predicted (docs/PLAN.md, plan.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"
#include "../train/train.h"
#include "../train/mem.h"
#include "optim_mem.h"
#include "../lpx/commands.h"

#ifndef LPX_PLAN_DATA
#define LPX_PLAN_DATA "data/chips"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lpx plan [--model NAME | --dim D --layers L --heads H --kv-heads K --ffn F --vocab V]\n"
            "                [--recipe bf16|float8-tensorwise|float8-rowwise] [--gpus N] [--gpus-per-node G]\n"
            "                [--chip h100|h200|FILE] [--net intra=GB/s,inter=GB/s,latency=us] [--batch B]\n"
            "                [--seq S] [--ac none|full] [--max-ctas K] [--reduce f32|bf16] [--explain] [--json]\n"
            "                [--optim adamw|adamw8bit|adamw4bit|adamw-fp8] [--master f32|bf16-sr|\n"
            "                f16-scaled|f16-scaled-sr]\n"
            "  predicts one FSDP training step (one group per block) from the chip's rates and the\n"
            "  network's: per block its GEMMs, attention, elementwise ops, casts and collectives,\n"
            "  what prefetching hides, the optimizer; step time, tokens/s per GPU, MFU, memory per\n"
            "  GPU; bf16 beside the recipe, the float8 speedup decomposed. Defaults: --model llama3-8b,\n"
            "  --gpus 8, --gpus-per-node 8, --chip h100 (published peaks), --net intra=450,inter=50,\n"
            "  latency=5 (NVLink 4 and 400 Gb/s per GPU, published; the latency assumed), --batch 1,\n"
            "  --seq 8192, --ac full, --max-ctas 32 (NCCL's default channel count), --reduce f32,\n"
            "  --optim adamw --master f32 (lpx train's optimizer state and masters: lpx mem counts\n"
            "  them; the optimizer step moves their bytes).\n");
}

static int bad(const char *what, const char *v)
{
    fprintf(stderr, "lpx plan: %s %s\n", what, v ? v : "");
    return 2;
}

/* --net intra=GB/s,inter=GB/s,latency=us: each finite and in a sane range
 * (1 MB/s..100 TB/s, 1 ns..1 s), so that no time of the step is inf or
 * NaN (a denormal passes "> 0" and made the schedule loop on NaN) */
static int parse_net(const char *v, pl_net *net)
{
    char buf[256];
    if (strlen(v) >= sizeof buf) return bad("--net: too long:", v);
    snprintf(buf, sizeof buf, "%s", v);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) return bad("--net expects intra=GB/s,inter=GB/s,latency=us, got", v);
        *eq = 0;
        bool lat = !strcmp(tok, "latency");
        if (!lat && strcmp(tok, "intra") && strcmp(tok, "inter"))
            return bad("--net: unknown key (intra, inter, latency):", tok);
        double lo = 1e-3, hi = lat ? 1e6 : 1e5;
        char *end;
        double x = strtod(eq + 1, &end);
        if (*end || end == eq + 1 || !isfinite(x) || x < lo || x > hi) {
            fprintf(stderr, "lpx plan: --net %s=%s: expected %s in %g..%g\n", tok, eq + 1, lat ? "us" : "GB/s", lo, hi);
            return 2;
        }
        if (!strcmp(tok, "intra")) net->intra_bw = x * 1e9;
        else if (!strcmp(tok, "inter")) net->inter_bw = x * 1e9;
        else net->latency = x * 1e-6;
    }
    return 0;
}

static void print_step(const char *label, const pl_step *p, const pl_step *base)
{
    printf("  %-40s %9.1f ms %9.0f tok/s/GPU  MFU %5.1f%%  exposed comm %7.1f ms  %5.2fx\n", label,
           p->s.step * 1e3, p->tokens_per_gpu_s, 100 * p->mfu, p->s.exposed_comm * 1e3, base->s.step / p->s.step);
}

static void json_step(const char *label, const pl_step *p, const pl_step *base, bool last)
{
    printf("    {\"case\": \"%s\", \"step_s\": %.6g, \"tokens_per_gpu_s\": %.6g, \"mfu\": %.4f, \"compute_s\": %.6g, "
           "\"comm_s\": %.6g, \"exposed_comm_s\": %.6g, \"contention_s\": %.6g, \"speedup\": %.4f}%s\n",
           label, p->s.step, p->tokens_per_gpu_s, p->mfu, p->s.compute, p->s.comm, p->s.exposed_comm, p->s.contention,
           base->s.step / p->s.step, last ? "" : ",");
}

int lpx_cmd_plan(int argc, char **argv)
{
    tr_arch a;
    tr_arch_preset("llama3-8b", &a);
    unsigned given = 0;
    long batch = 1, seq = 8192, gpus = 8, gpn = 8, ctas = 32;
    const char *chip_name = "h100";
    int recipe = TR_F8_TENSORWISE;
    bool ac = true, explain = false, json = false, reduce_f32 = true, optim_given = false;
    int optim = PL_OPTIM_ADAMW, master = PL_MASTER_F32;
    pl_net net = {.intra_bw = 450e9, .inter_bw = 50e9, .latency = 5e-6, .gpus_per_node = 8};
    static const char *const valued[] = {"--model", "--dim", "--layers", "--heads", "--kv-heads", "--ffn", "--vocab",
                                         "--rope-theta", "--recipe", "--gpus", "--gpus-per-node", "--chip", "--net",
                                         "--batch", "--seq", "--ac", "--max-ctas", "--reduce", "--optim", "--master"};
    for (int i = 1; i < argc; i++) {
        char buf[64];
        const char *iv = NULL, *o = tr_split_opt(argv[i], buf, sizeof buf, &iv);
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(o, "--explain") || !strcmp(o, "--json") || !strcmp(o, "--tied")) {
            if (iv) return bad("option takes no value:", o);
            if (!strcmp(o, "--explain")) explain = true;
            else if (!strcmp(o, "--json")) json = true;
            else tr_arch_option("lpx plan", o, NULL, &a, &given);
            continue;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= !strcmp(o, valued[k]);
        if (!known) return bad("unknown option (lpx plan --help lists them):", o);
        if (!iv && i + 1 >= argc) return bad("option needs a value:", o);
        const char *v = iv ? iv : argv[++i];
        int rc = tr_arch_option("lpx plan", o, v, &a, &given);
        if (rc == 2) return 2;
        if (rc == 0) continue;
        char *end;
        if (!strcmp(o, "--optim")) {
            optim = pl_optim_from_name(v);
            if (optim < 0) return bad("--optim expects " PL_OPTIM_CHOICES ", got", v);
            optim_given = true;
        } else if (!strcmp(o, "--master")) {
            master = pl_master_from_name(v);
            if (master < 0) return bad("--master expects " PL_MASTER_CHOICES ", got", v);
            optim_given = true;
        } else if (!strcmp(o, "--recipe")) {
            recipe = tr_recipe_from_name(v);
            if (recipe != TR_BF16 && recipe != TR_F8_TENSORWISE && recipe != TR_F8_ROWWISE)
                return bad("--recipe: bf16, float8-tensorwise or float8-rowwise, got", v);
        } else if (!strcmp(o, "--chip")) {
            chip_name = v;
        } else if (!strcmp(o, "--net")) {
            if (parse_net(v, &net)) return 2;
        } else if (!strcmp(o, "--ac")) {
            if (strcmp(v, "none") && strcmp(v, "full")) return bad("--ac expects none or full, got", v);
            ac = !strcmp(v, "full");
        } else if (!strcmp(o, "--reduce")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) return bad("--reduce expects f32 or bf16, got", v);
            reduce_f32 = !strcmp(v, "f32");
        } else {
            /* sane ranges: 2^20 GPUs, 1024 per node, 2^20 sequences of 2^24
             * tokens, NCCL's CTAs at most 1024 (and the chip's SMs, below) */
            long hi = !strcmp(o, "--gpus") || !strcmp(o, "--batch") ? 1048576 : !strcmp(o, "--seq") ? 16777216 : 1024;
            errno = 0;
            long x = strtol(v, &end, 10);
            if (errno || *end || end == v || x < 1 || x > hi) {
                fprintf(stderr, "lpx plan: %s '%s': expected an integer in 1..%ld\n", o, v, hi);
                return 2;
            }
            if (!strcmp(o, "--batch")) batch = x;
            else if (!strcmp(o, "--seq")) seq = x;
            else if (!strcmp(o, "--gpus")) gpus = x;
            else if (!strcmp(o, "--gpus-per-node")) gpn = x;
            else ctas = x;
        }
    }
    tr_arch_finish(&a, given);
    if (a.vocab <= 0) a.vocab = 128256;
    if (tr_arch_check(&a, "lpx plan")) return 2;
    net.gpus_per_node = (int)gpn;
    const char *data = getenv("LPX_PLAN_DATA") ? getenv("LPX_PLAN_DATA") : LPX_PLAN_DATA;
    pl_chip chip;
    if (pl_chip_load(chip_name, data, &chip)) return 2;
    if (ctas > chip.sms) {
        fprintf(stderr, "lpx plan: --max-ctas %ld: more than the chip's %d SMs (%s)\n", ctas, chip.sms, chip.source);
        return 2;
    }
    tr_geom g;
    if (tr_geom_init(&g, &a, (int)seq, false) != LPX_OK) {
        fprintf(stderr, "lpx plan: %s\n", lpx_last_error());
        tr_geom_free(&g);
        return 1;
    }
    if (tr_mem_estimate_check(&g, (int)gpus, 8, (int)batch, 2, "lpx plan") != LPX_OK) {
        fprintf(stderr, "%s\n", lpx_last_error());
        tr_geom_free(&g);
        return 2;
    }
    double share = (double)ctas / chip.sms;
    /* lpx mem's estimate, with the optimizer choice's masters and state */
    tr_mem_est me;
    pl_optim_mem om;
    tr_mem_estimate_geom(&g, (tr_recipe)recipe, (int)gpus, 8, (int)batch, 1, false, 2, ac, &me);
    if (pl_mem_apply_optim(&g, recipe, (int)gpus, 8, (pl_optim)optim, (pl_master)master, &me, &om)) {
        fprintf(stderr, "lpx plan: %s\n", lpx_last_error());
        tr_geom_free(&g);
        return 2;
    }
    /* the optimizer step's bytes per local element (f32 AdamW: 28, cost.c's default) */
    double step_bytes = optim == PL_OPTIM_ADAMW && master == PL_MASTER_F32 ? 0.0 : pl_optim_step_bytes(&om);
    pl_step_opts base = {.gpus = (int)gpus, .batch = (int)batch, .ac = ac, .reduce_f32 = reduce_f32, .sm_share = share,
                         .optim_bytes = step_bytes};
    /* bf16; float8 compute with bf16 all-gather; fp8 all-gather with one
     * amax all-reduce per linear; with one combined per step (the table of
     * PyTorch's float8 all-gather account); then the recipe as lpx runs it */
    pl_step_opts v[4] = {base, base, base, base};
    v[1].fp8_compute = v[2].fp8_compute = v[3].fp8_compute = true;
    v[2].fp8_all_gather = v[3].fp8_all_gather = true;
    v[2].amax = PL_AMAX_PER_PARAM;
    v[3].amax = PL_AMAX_COMBINED;
    pl_step st[5];
    pl_step_opts mine = base;
    if (recipe != TR_BF16) {
        mine.fp8_compute = mine.fp8_all_gather = true;
        mine.amax = recipe == TR_F8_TENSORWISE ? PL_AMAX_COMBINED : PL_AMAX_NONE;   /* rowwise: its own rows' scales */
    }
    for (int k = 0; k < 5; k++)
        if (pl_step_predict(&g, &chip, &net, k < 4 ? &v[k] : &mine, &st[k]) != LPX_OK) {
            fprintf(stderr, "lpx plan: %s\n", lpx_last_error());
            tr_geom_free(&g);
            return 2;
        }
    /* lpx mem's device total: the loss's chunk (logits, their grad, the head's grad) included */
    double mem = (double)(me.params + me.grads + me.optimizer + me.unsharded + me.activations + me.transient);
    static const char *const names[5] = {"bf16", "float8 compute, bf16 all-gather", "+ float8 all-gather, amax per param",
                                         "+ one combined amax all-reduce", NULL};
    char mine_label[64];
    snprintf(mine_label, sizeof mine_label, "%s as lpx runs it", tr_recipe_name((tr_recipe)recipe));
    /* a plan that does not fit the chip's memory has no speed: the text
     * says so first and prints none (a step time of a run that cannot
     * start is not a number to trust); --json marks it ("fits": false) */
    bool fits = mem <= chip.memory;
    if (json) {
        printf("{\n  \"model\": {\"dim\": %d, \"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"ffn\": %d, \"vocab\": %d, "
               "\"params\": %lld},\n  \"gpus\": %ld, \"gpus_per_node\": %ld, \"batch\": %ld, \"seq\": %ld, \"chip\": \"%s\", "
               "\"memory_per_gpu_bytes\": %.0f, \"chip_memory_bytes\": %.0f, \"fits\": %s,\n",
               g.dim, g.layers, g.heads, g.kv_heads, g.hidden, g.vocab, (long long)tr_geom_numel(&g), gpus, gpn, batch,
               seq, chip.name, mem, chip.memory, fits ? "true" : "false");
        if (optim_given)
            printf("  \"optim\": \"%s\", \"master\": \"%s\", \"optim_state_bytes_per_param\": %.6f, "
                   "\"master_bytes_per_param\": %.6f, \"optim_step_bytes_per_element\": %.4f,\n",
                   pl_optim_name((pl_optim)optim), pl_master_name((pl_master)master),
                   om.elems ? (double)om.state / (double)om.elems : 0.0,
                   om.elems ? (double)om.master / (double)om.elems : 0.0, pl_optim_step_bytes(&om));
        printf("  \"steps\": [\n");
        /* (JSON keeps the steps, marked by "fits": a reader decides) */
        for (int k = 0; k < 5; k++) json_step(k < 4 ? names[k] : mine_label, &st[k], &st[0], k == 4);
        printf("  ]\n}\n");
        tr_geom_free(&g);
        return 0;
    }
    printf("lpx plan: %d-layer model, dim %d, %lld params; %ld GPUs (%ld per node), batch %ld x seq %ld per GPU, "
           "ac %s\n  chip: %s (%s)\n  net: intra %.0f GB/s, inter %.0f GB/s, latency %.1f us; NCCL %ld CTAs = %.0f%% "
           "of the SMs\n", g.layers, g.dim, (long long)tr_geom_numel(&g), gpus, gpn, batch, seq, ac ? "full" : "none",
           chip.name, chip.source, net.intra_bw / 1e9, net.inter_bw / 1e9, net.latency * 1e6, ctas, 100 * share);
    if (optim_given)
        printf("  optimizer: %s, masters %s: %.5f + %.5f bytes per parameter (state + master, rank 0's shards); "
               "its step moves %.2f bytes per local element\n", pl_optim_name((pl_optim)optim),
               pl_master_name((pl_master)master), om.elems ? (double)om.state / (double)om.elems : 0.0,
               om.elems ? (double)om.master / (double)om.elems : 0.0, pl_optim_step_bytes(&om));
    if (!fits) {
        printf("\nDOES NOT FIT: %.1f GiB per GPU (lpx mem's model) of the chip's %.0f GiB; no speed is given for a run "
               "that cannot start (more GPUs, a smaller --batch, or --ac full lower it: lpx mem shows the parts)\n",
               mem / 1073741824.0, chip.memory / 1073741824.0);
        tr_geom_free(&g);
        return 0;
    }
    const pl_step *p = &st[4];
    printf("\none block (%s):\n", tr_recipe_name((tr_recipe)recipe));
    printf("  GEMMs         %8.2f ms  (%.3g TFLOP)\n", p->blk_gemm * 1e3, p->blk_gemm_flops / 1e12);
    printf("  attention     %8.2f ms  (%.3g TFLOP)\n", p->blk_attn * 1e3, p->blk_attn_flops / 1e12);
    printf("  elementwise   %8.2f ms  (%.3g GB)\n", p->blk_elem * 1e3, p->blk_elem_bytes / 1e9);
    printf("  casts         %8.2f ms  (%.3g GB)\n", p->blk_cast * 1e3, p->blk_cast_bytes / 1e9);
    printf("  all-gather    %8.2f ms  x2 (%.3g GB each)%s\n", p->blk_ag * 1e3, p->blk_ag_bytes / 1e9,
           p->blk_amax > 0 ? "" : "");
    if (p->blk_amax > 0) printf("  amax per param %7.2f ms  per all-gather\n", p->blk_amax * 1e3);
    printf("  reduce-scatter %7.2f ms  (%.3g GB)\n", p->blk_rs * 1e3, p->blk_rs_bytes / 1e9);
    printf("\nstep: compute %.1f ms (head GEMMs %.1f, optimizer %.1f), collectives %.1f ms of which %.1f exposed, "
           "NCCL contention %.1f ms\n", p->s.compute * 1e3, p->head_gemm * 1e3, p->optimizer * 1e3, p->s.comm * 1e3,
           p->s.exposed_comm * 1e3, p->s.contention * 1e3);
    printf("memory per GPU (lpx mem's model): %.1f GiB of %.0f\n\n", mem / 1073741824.0, chip.memory / 1073741824.0);
    for (int k = 0; k < 4; k++) print_step(names[k], &st[k], &st[0]);
    print_step(mine_label, &st[4], &st[0]);
    if (explain) {
        char step_label[96];
        /* read and write the master and m + v, read the f32 grad */
        snprintf(step_label, sizeof step_label, "%.2f (2 x master + 2 x state + 4)", step_bytes);
        printf("\nformulas (T = batch x seq tokens per GPU, W a block's linear weights, P its parameters, N GPUs):\n"
               "  GEMMs       (2 T W forward + 4 T W backward [+ 2 T W recompute with --ac full]) / GEMM rate (bf16 or fp8)\n"
               "  attention   forward 2 b s^2 D, backward 2.5x [+ forward with --ac full], / attention rate\n"
               "  elementwise 2 T (14 D + 4 KV + 3 F) bytes forward, 2x backward, / copy rate\n"
               "  casts       5 T sum(in) forward; 5 T sum(out) + 2 T (sum(in) + sum(out)) backward, / copy rate\n"
               "  all-gather  ring: (N-1)/N bytes / busbw + (N-1) latency; busbw the inter-node rate once N > G\n"
               "              bytes: 2 P (bf16) or W + 4 D (fp8 linears, bf16 norms); before forward and backward\n"
               "  amax        per param: 7 tree all-reduces of 4 bytes, 2 log2(N) latencies each, per all-gather;\n"
               "              combined: one all-reduce of 28 L bytes after the optimizer\n"
               "  reduce-scatter  ring, 4 P bytes (f32) or 2 P (bf16)\n"
               "  optimizer   %s bytes per local element (P / N) / copy rate\n"
               "  overlap     the all-gather of block i+1 runs beside block i's forward, of i-1 beside i's\n"
               "              backward, i's reduce-scatter after it; compute at (1 - CTAs/SMs) speed meanwhile\n"
               "  MFU         the time the model's FLOPs (6 T (L W + V D) + 3 L attention forward) take at the peak\n"
               "              of the precision each runs in (fp8 GEMMs at the fp8 peak, the rest at bf16's) / step\n",
               step_bytes > 0 ? step_label : "28");
    }
    tr_geom_free(&g);
    return 0;
}
