/* `lpx mem`: memory per rank of a model before running it.
 *
 * The model is the one lpx train runs (tools/train/model.c), sized by
 * --dim/--layers/--vocab or by --params (which picks a Llama-like shape).
 * Accounting, per rank (what lpx train measures, see shard.c):
 *   params      f32 master shard (rows ceil(rows/N) of every tensor);
 *               nf4-qlora: shards of the frozen NF4 base, of the f32
 *               embeddings/norms/head and of the f32 adapters
 *   grads       f32 grad shards (the engine's), plus the full f32 grads
 *               being accumulated (all groups' when a rank runs several
 *               micro-batches, else one group's); the engine's packing
 *               buffers are not counted
 *   optimizer   AdamW m and v: 2 x f32 per trainable local element
 *   unsharded   the engine's peak: two adjacent groups in wire form (fp8,
 *               bf16, nf4 + f32 adapters), max_unsharded = 2
 *   activations the tensors one micro-batch's forward keeps for backward
 * --offload moves master params and optimizer state to host memory: they
 * are then listed apart from the device total. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "mem.h"
#include "../lpx/commands.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t nf4_bytes(const tr_param *P)
{
    int64_t shape[2] = {P->rows, P->cols}, nb = 0;
    lpx_nf4_config cfg = tr_nf4_config(P->rows * P->cols);
    if (lpx_nf4_bytes(2, shape, &cfg, &nb) != LPX_OK) nb = P->rows * P->cols / 2;
    return nb;
}

/* bytes of group grp's params after the engine's all-gather (what
 * lpx_fsdp_stats counts as unsharded: the wire form) */
static int64_t gwire(const tr_geom *g, tr_recipe recipe, int lora_rank, int grp)
{
    int64_t b = 0;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (P->group != grp) continue;
        int64_t n = P->rows * P->cols;
        if (recipe == TR_NF4_QLORA)
            b += P->kind == TR_P_LIN ? nf4_bytes(P) + 4 * (int64_t)lora_rank * (P->rows + P->cols) : 4 * n;
        else if (P->kind == TR_P_LIN && recipe == TR_F8_TENSORWISE) b += n;               /* fp8 */
        else if (P->kind == TR_P_LIN && recipe == TR_F8_ROWWISE) b += n + 8 * P->rows;    /* fp8 + row scales */
        else b += 2 * n;                                                                  /* bf16 */
    }
    return b;
}

void tr_mem_estimate_geom(const tr_geom *g, tr_recipe recipe, int world, int lora_rank, int b, int nloc,
                          bool wrap_linear, tr_mem_est *e)
{
    (void)wrap_linear; /* the groups are in g already */
    memset(e, 0, sizeof *e);
    int64_t bt = (int64_t)b * g->seq, D = g->dim, H = g->hidden;
    /* activations (model.c: blk_bytes + the head) */
    int64_t per_block = 4 * (bt * D * 2 + bt + 3 * bt * D + (int64_t)b * g->heads * g->seq * g->seq + bt * D +
                             2 * bt * D + bt + 4 * bt * H);
    e->activations = per_block * g->layers + 4 * (2 * bt * D + bt + bt * g->vocab);
    /* unsharded: the engine holds at most two adjacent groups (the one
     * computed and the prefetched next one) */
    for (int grp = 0; grp + 1 < g->ngroups || grp == 0; grp++) {
        int64_t u = gwire(g, recipe, lora_rank, grp) + (grp + 1 < g->ngroups ? gwire(g, recipe, lora_rank, grp + 1) : 0);
        e->unsharded = u > e->unsharded ? u : e->unsharded;
        if (grp + 1 >= g->ngroups) break;
    }
    if (recipe == TR_NF4_QLORA) {
        for (int p = 0; p < g->nparams; p++) {
            const tr_param *P = &g->p[p];
            int64_t chunk = ceil_div(P->rows, world);
            if (P->kind == TR_P_LIN) {
                int64_t r = lora_rank;
                int64_t ad = 4 * (ceil_div(r, world) * P->cols + chunk * r); /* local A and B shards */
                /* nf4 shards are cut at whole scaler blocks of rows */
                lpx_nf4_config cfg = tr_nf4_config(P->rows * P->cols);
                int64_t unit = cfg.scaler_block * cfg.block / P->cols;
                unit = unit < 1 ? 1 : unit;
                int64_t r0 = ceil_div(chunk, unit) * unit;
                r0 = r0 < P->rows ? r0 : P->rows;
                e->params += nf4_bytes(P) * r0 / P->rows + ad;
                e->grads += 4 * r * (P->rows + P->cols) + ad; /* full adapter grads + grad shards */
                e->optimizer += 2 * ad;
            } else {
                e->params += 4 * chunk * P->cols;
            }
        }
        return;
    }
    int64_t full_all = 0, max_full = 0;
    for (int grp = 0; grp < g->ngroups; grp++) {
        int64_t full = 0;
        for (int p = 0; p < g->nparams; p++) {
            const tr_param *P = &g->p[p];
            if (P->group != grp) continue;
            int64_t chunk = ceil_div(P->rows, world);
            e->params += 4 * chunk * P->cols;
            e->optimizer += 8 * chunk * P->cols;
            full += 4 * P->rows * P->cols;
        }
        full_all += full;
        max_full = full > max_full ? full : max_full;
    }
    /* grad shards + the full f32 grads being accumulated: every group's
     * while a rank runs several micro-batches, else one group's at a time */
    e->grads = e->params + (nloc > 1 ? full_all : max_full);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx mem [--params N | --dim D --layers L --vocab V] [--recipe R] [--ranks N]\n"
               "               [--lora-rank R] [--batch B] [--seq T] [--heads H] [--offload]\n"
               "  memory per rank of the lpx train model: params, grads, optimizer, unsharded, activations\n"
               "  --batch is sequences per micro-batch on one rank (default 4); --params 7e9 picks a\n"
               "  Llama-like shape (vocab 32000)\n");
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

int lpx_cmd_mem(int argc, char **argv)
{
    double params = 0;
    long dim = 0, layers = 0, vocab = 0, ranks = 1, lora = 8, batch = 4, seq = 0, heads = 0;
    int recipe = TR_BF16;
    bool offload = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--offload")) {
            offload = true;
            continue;
        }
        if (i + 1 >= argc) return bad("option needs a value:", a);
        const char *v = argv[++i];
        char *end;
        if (!strcmp(a, "--recipe")) {
            recipe = tr_recipe_from_name(v);
            if (recipe < 0) return bad("unknown recipe", v);
            continue;
        }
        if (!strcmp(a, "--params")) {
            params = strtod(v, &end);
            if (*end || !(params >= 1e3 && params <= 1e13)) return bad("--params expects a count in 1e3..1e13, got", v);
            continue;
        }
        long x = strtol(v, &end, 10);
        if (*end || end == v || x < 1 || x > 100000000) return bad("expected a positive integer for", a);
        if (!strcmp(a, "--dim")) dim = x;
        else if (!strcmp(a, "--layers")) layers = x;
        else if (!strcmp(a, "--vocab")) vocab = x;
        else if (!strcmp(a, "--ranks")) ranks = x;
        else if (!strcmp(a, "--lora-rank")) lora = x;
        else if (!strcmp(a, "--batch")) batch = x;
        else if (!strcmp(a, "--seq")) seq = x;
        else if (!strcmp(a, "--heads")) heads = x;
        else return bad("unknown option", a);
    }
    if (params > 0 && (dim || layers)) return bad("give --params or --dim/--layers, not both:", "--params");
    if (params > 0) {
        /* Llama-like: 12 d^2 per layer, 2 V d for embeddings and head, d = 128 * layers */
        if (!vocab) vocab = 32000;
        long best_l = 1;
        double best = INFINITY;
        for (long l = 1; l <= 200; l++) {
            double d = 128.0 * l, n = 12 * d * d * l + 2 * (double)vocab * d;
            if (fabs(n - params) < best) {
                best = fabs(n - params);
                best_l = l;
            }
        }
        layers = best_l;
        dim = 128 * best_l;
    }
    if (!dim || !layers) {
        fprintf(stderr, "lpx mem: give --params N or --dim D and --layers L\n");
        return 2;
    }
    if (!vocab) vocab = 96;
    if (!seq) seq = params > 0 ? 2048 : 64;
    if (!heads) heads = dim % 128 == 0 ? dim / 128 : 1;
    if (dim % heads) return bad("--dim is not divisible by --heads", "--heads");
    tr_geom *g = malloc(sizeof *g);
    if (!g) return 1;
    if ((long)(2 + 9 * layers + 2) > TR_MAX_PARAMS) {
        /* a big model: the per-block structure repeats, so estimate one
         * block's worth with few layers and scale */
        free(g);
        fprintf(stderr, "lpx mem: at most %d layers\n", (TR_MAX_PARAMS - 4) / 9);
        return 2;
    }
    tr_geom_init(g, (int)vocab, (int)dim, (int)layers, (int)heads, (int)seq, false);
    tr_mem_est e;
    tr_mem_estimate_geom(g, (tr_recipe)recipe, (int)ranks, (int)lora, (int)batch, 1, false, &e);
    char b[5][32];
    human(b[0], 32, (double)e.params);
    human(b[1], 32, (double)e.grads);
    human(b[2], 32, (double)e.optimizer);
    human(b[3], 32, (double)e.unsharded);
    human(b[4], 32, (double)e.activations);
    printf("model: dim %ld, layers %ld, heads %ld, vocab %ld, seq %ld: %lld params; recipe %s, %ld ranks\n", dim,
           layers, heads, vocab, seq, (long long)tr_geom_numel(g), tr_recipe_name((tr_recipe)recipe), ranks);
    printf("per rank:\n  params       %12s%s\n  grads        %12s\n  optimizer    %12s%s\n  unsharded    %12s\n"
           "  activations  %12s  (%ld sequences of %ld)\n",
           b[0], offload ? "  (f32 master on the host with --offload)" : "", b[1], b[2],
           offload ? "  (on the host with --offload)" : "", b[3], b[4], batch, seq);
    int64_t dev = e.grads + e.unsharded + e.activations + (offload ? 0 : e.params + e.optimizer);
    if (offload && recipe == TR_NF4_QLORA) dev += e.params; /* the frozen base stays on the device */
    human(b[0], 32, (double)dev);
    printf("  total        %12s%s\n", b[0], offload ? " on the device" : "");
    free(g);
    return 0;
}
