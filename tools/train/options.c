/* Command line of `lpx train`. Every bad option ends in exactly one line on
 * stderr ("lpx train: ...") and exit code 2. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "train.h"

void tr_train_usage(FILE *f)
{
    fprintf(f,
            "usage: lpx train [options]\n"
            "  --recipe R      bf16 | float8-tensorwise (default) | float8-rowwise | float8-delayed |\n"
            "                  nf4-qlora | mxfp8 | mxfp4 (MX recipes need the lpx-mx.so plugin)\n"
            "  --compare       also train the bf16 baseline and report the gap\n"
            "  --ranks N       ranks (local comm: threads), default 4; with --comm mpi the MPI\n"
            "                  world size (given: must equal it)\n"
            "  --comm C        local (default) | mpi (one rank per process: mpirun -np N lpx train\n"
            "                  --comm mpi ...; needs lpx-mpi.so) | nccl\n"
            "  --device D      cpu (default) | cuda\n"
            "  --steps N       optimizer steps (default 300)\n"
            "  --batch N       sequences per step, all ranks together (default 16)\n"
            "  --micro N       micro-batches per step (default 4; ranks must divide it)\n"
            "  --seq N         context length (default 64)\n"
            "  --dim N         model width, a multiple of 32 (default 128)\n"
            "  --layers N      blocks (default 2)\n"
            "  --heads N       attention heads (default 4)\n"
            "  --lr X          peak learning rate (default 3e-3)\n"
            "  --seed N        seed of init and data (default 1)\n"
            "  --wrap W        block (default) | linear: one shard group per block or per linear\n"
            "  --lora-rank N   nf4-qlora adapter rank (default 8)\n"
            "  --pretrain N    nf4-qlora without --init: bf16 steps that make the base (default 150)\n"
            "  --init FILE     nf4-qlora base weights (a checkpoint written by a bf16 run: DIR/model.bin)\n"
            "  --data FILE     training text (default data/corpus.txt)\n"
            "  --out DIR       metrics.csv, loss.svg, model.bin (default train-out)\n"
            "  --log-every N   progress line every N steps (default 25)\n"
            "  --eval N        validation micro-batches (default 8)\n"
            "  --sample N      characters of generated text (default 240; 0: none)\n"
            "  --quiet         no progress lines\n");
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "lpx train: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 2;
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
    o->dim = 128;
    o->layers = 2;
    o->heads = 4;
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
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = true;
            return 1;
        }
        if (!strcmp(a, "--compare")) { o->compare = true; continue; }
        if (!strcmp(a, "--quiet")) { o->quiet = true; continue; }
        if (strncmp(a, "--", 2) != 0) return bad("unexpected argument '%s'%s", a, "");
        if (i + 1 >= argc) return bad("option %s needs a value%s", a, "");
        const char *v = argv[++i];
        if (!strcmp(a, "--recipe")) {
            int r = tr_recipe_from_name(v);
            if (r < 0)
                return bad("unknown recipe '%s' (%s)", v,
                           "bf16, float8-tensorwise, float8-rowwise, float8-delayed, nf4-qlora, mxfp8, mxfp4");
            o->recipe = (tr_recipe)r;
        } else if (!strcmp(a, "--ranks")) {
            rc = parse_int(a, v, 1, 64, &o->ranks);
            o->ranks_given = true;
        }
        else if (!strcmp(a, "--comm")) {
            if (strcmp(v, "local") && strcmp(v, "mpi") && strcmp(v, "nccl"))
                return bad("unknown comm backend '%s' (%s)", v, "local, mpi, nccl");
            snprintf(o->comm, sizeof o->comm, "%s", v);
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) return bad("unknown device '%s' (%s)", v, "cpu, cuda");
            snprintf(o->device, sizeof o->device, "%s", v);
        } else if (!strcmp(a, "--steps")) rc = parse_int(a, v, 1, 1000000, &o->steps);
        else if (!strcmp(a, "--batch")) rc = parse_int(a, v, 1, 65536, &o->batch);
        else if (!strcmp(a, "--micro")) rc = parse_int(a, v, 1, 4096, &o->micro);
        else if (!strcmp(a, "--seq")) rc = parse_int(a, v, 2, 4096, &o->seq);
        else if (!strcmp(a, "--dim")) rc = parse_int(a, v, 32, 8192, &o->dim);
        else if (!strcmp(a, "--layers")) rc = parse_int(a, v, 1, 32, &o->layers);
        else if (!strcmp(a, "--heads")) rc = parse_int(a, v, 1, 256, &o->heads);
        else if (!strcmp(a, "--lora-rank")) rc = parse_int(a, v, 1, 1024, &o->lora_rank);
        else if (!strcmp(a, "--pretrain")) rc = parse_int(a, v, 1, 1000000, &o->pretrain_steps);
        else if (!strcmp(a, "--log-every")) rc = parse_int(a, v, 1, 1000000, &o->log_every);
        else if (!strcmp(a, "--eval")) rc = parse_int(a, v, 1, 100000, &o->eval_batches);
        else if (!strcmp(a, "--sample")) rc = parse_int(a, v, 0, 100000, &o->sample_len);
        else if (!strcmp(a, "--seed")) { rc = parse_int(a, v, 0, 2147483647, &seed); o->seed = (uint64_t)seed; }
        else if (!strcmp(a, "--lr")) {
            char *end;
            o->lr = strtod(v, &end);
            if (*end || end == v || !(o->lr > 0 && o->lr < 10)) return bad("--lr '%s': expected a number in (0, 10)%s", v, "");
        } else if (!strcmp(a, "--wrap")) {
            if (strcmp(v, "block") && strcmp(v, "linear")) return bad("unknown --wrap '%s' (%s)", v, "block, linear");
            o->wrap_linear = !strcmp(v, "linear");
        } else if (!strcmp(a, "--init")) o->init_path = v;
        else if (!strcmp(a, "--data")) o->data_path = v;
        else if (!strcmp(a, "--out")) o->out_dir = v;
        else return bad("unknown option '%s'%s (lpx train --help lists them)", a, "");
    }
    if (rc) return rc;
    char buf[160];
    if (o->dim % 32) {
        snprintf(buf, sizeof buf, "--dim %d is not a multiple of 32", o->dim);
        return bad("%s%s", buf, "");
    }
    if (o->dim % o->heads) {
        snprintf(buf, sizeof buf, "--dim %d is not divisible by --heads %d", o->dim, o->heads);
        return bad("%s%s", buf, "");
    }
    /* --comm mpi without --ranks: the world size is known once MPI runs
     * (train.c checks it then) */
    if ((o->ranks_given || strcmp(o->comm, "mpi")) && (rc = tr_check_ranks(o))) return rc;
    if (o->batch % o->micro) {
        snprintf(buf, sizeof buf, "--batch %d is not divisible by --micro %d", o->batch, o->micro);
        return bad("%s%s", buf, "");
    }
    if (o->init_path && o->recipe != TR_NF4_QLORA) return bad("--init is for --recipe nf4-qlora%s%s", "", "");
    return 0;
}
