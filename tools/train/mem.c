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
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
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

/* bytes of parameter P after the engine's all-gather (what
 * lpx_fsdp_stats counts as unsharded: the wire form) */
static int64_t pwire(const tr_param *P, tr_recipe recipe, int lora_rank)
{
    int64_t n = P->rows * P->cols;
    if (recipe == TR_NF4_QLORA)
        return P->kind == TR_P_LIN ? nf4_bytes(P) + 4 * (int64_t)lora_rank * (P->rows + P->cols) : 4 * n;
    if (P->kind == TR_P_LIN && recipe == TR_F8_TENSORWISE) return n;                  /* fp8 */
    if (P->kind == TR_P_LIN && recipe == TR_F8_ROWWISE) return n + 8 * P->rows;       /* fp8 + row scales */
    if (P->kind == TR_P_LIN && recipe == TR_F8_BLOCKWISE)                             /* fp8 + block scales */
        return n + 8 * ceil_div(P->rows, LPX_FLOAT8_BLOCK_SIZE) * ceil_div(P->cols, LPX_FLOAT8_BLOCK_SIZE);
    if (recipe == TR_F32) return 4 * n;                                               /* f32 */
    return 2 * n;                                                                     /* bf16 */
}

/* bytes of group grp's params after the all-gather: from the table wire
 * (every group's, summed in one pass), or summed here when it is NULL */
static int64_t gwire(const tr_geom *g, const int64_t *wire, tr_recipe recipe, int lora_rank, int grp)
{
    if (wire) return wire[grp];
    int64_t b = 0;
    for (int p = 0; p < g->nparams; p++)
        if (g->p[p].group == grp) b += pwire(&g->p[p], recipe, lora_rank);
    return b;
}

void tr_mem_estimate_geom(const tr_geom *g, tr_recipe recipe, int world, int lora_rank, int b, int nloc,
                          bool wrap_linear, int act_bytes, bool ac, tr_mem_est *e)
{
    (void)wrap_linear; /* the groups are in g already */
    memset(e, 0, sizeof *e);
    int64_t bt = (int64_t)b * g->seq, D = g->dim, F = g->hidden, KV = (int64_t)g->kv_heads * g->head_dim;
    int64_t A = act_bytes;
    /* activations (model.c: blk_bytes + the head): per block h_in, n1, q,
     * attention out, h1, n2 [bt, D]; k, v [bt, KV]; u1, u3 and
     * swiglu's product [bt, F] in the activation dtype; rstd1, rstd2 [bt]
     * and the attention lse [b, heads, seq] in f32 */
    int64_t per_block = A * (bt * (6 * D + 2 * KV + 3 * F)) + 4 * (2 * bt + (int64_t)b * g->heads * g->seq);
    /* h_last, nf and the loss's d nf (the head and loss run chunk by chunk
     * in the forward: no [bt, V] logits are kept), rstd */
    int64_t head = A * (3 * bt * D) + 4 * bt;
    /* --ac full: each block keeps its input; one block's tensors (its
     * input among them) live again while it is recomputed in the backward */
    e->activations = (ac ? A * bt * D * (g->layers - 1) + per_block : per_block * g->layers) + head;
    /* the loss's chunk (model.c, head_loss: rows of 1 GiB of logits at
     * most): its logits and their gradient in the activation dtype, and
     * for a trained head the chunk's grad of W_head with, below f32, its
     * f32 copy summed into the accumulator */
    int64_t V = g->vocab, C = ((int64_t)1 << 30) / (V * A) / 64 * 64;
    if (C < 64) C = 64;
    if (C > bt) C = bt;
    e->transient = 2 * C * V * A + (recipe != TR_NF4_QLORA ? V * D * (A == 4 ? 4 : A + 4) : 0);
    /* unsharded: the engine holds at most two groups (the one computed and
     * the prefetched next one; a tied head: the embedding beside the root).
     * Every group's wire bytes in one pass over the parameters (linear in
     * the layers); without memory for that table, group by group */
    int64_t *wire = calloc((size_t)g->ngroups, sizeof *wire);
    if (wire)
        for (int p = 0; p < g->nparams; p++) wire[g->p[p].group] += pwire(&g->p[p], recipe, lora_rank);
    for (int grp = 0; grp < g->ngroups; grp++) {
        int64_t u = gwire(g, wire, recipe, lora_rank, grp) +
                    (grp + 1 < g->ngroups ? gwire(g, wire, recipe, lora_rank, grp + 1) : 0);
        e->unsharded = u > e->unsharded ? u : e->unsharded;
    }
    if (g->tied && g->ngroups > 1) {
        int64_t u = gwire(g, wire, recipe, lora_rank, 0) + gwire(g, wire, recipe, lora_rank, g->ngroups - 1);
        e->unsharded = u > e->unsharded ? u : e->unsharded;
    }
    free(wire);
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
    int64_t *full = calloc((size_t)g->ngroups, sizeof *full);
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        /* torch.chunk of the shard unit: whole 128-row blocks for a
         * blockwise float8_weight, so rank 0 may hold more than rows/world */
        int64_t unit = recipe == TR_F8_BLOCKWISE && P->kind == TR_P_LIN ? 128 : 1;
        int64_t chunk = ceil_div(ceil_div(P->rows, unit), world) * unit;
        chunk = chunk < P->rows ? chunk : P->rows;
        e->params += 4 * chunk * P->cols;
        e->optimizer += 8 * chunk * P->cols;
        if (full) full[P->group] += 4 * P->rows * P->cols;
        full_all += 4 * P->rows * P->cols;
    }
    /* a tied head's grad (the embedding's) is accumulated from the start
     * of the backward to its end, beside each other group's in turn */
    for (int grp = g->tied ? 1 : 0; full && grp < g->ngroups; grp++) max_full = full[grp] > max_full ? full[grp] : max_full;
    if (full && g->tied) max_full += full[0];
    if (!full) max_full = full_all;
    free(full);
    /* grad shards + the full f32 grads being accumulated: every group's
     * while a rank runs several micro-batches, else one group's at a time */
    e->grads = e->params + (nloc > 1 ? full_all : max_full);
}

lpx_status tr_mem_estimate_check(const tr_geom *g, int world, int lora_rank, int b, int act_bytes, const char *who)
{
    /* every term of the estimate, in doubles, bounded from above: the
     * activations without checkpointing, the loss chunk at its largest,
     * params, grads (shards and full), optimizer state and two groups'
     * wire bytes at most 24 bytes per element plus the adapters */
    double bt = (double)b * g->seq, D = g->dim, F = g->hidden, KV = (double)g->kv_heads * g->head_dim;
    double A = act_bytes, V = g->vocab, n = (double)tr_geom_numel(g);
    double act = (A * bt * (6 * D + 2 * KV + 3 * F) + 4 * (2 * bt + (double)b * g->heads * g->seq)) * g->layers +
                 A * 3 * bt * D + 4 * bt;
    double chunk = 2 * fmax(64.0, fmin(bt, 1073741824.0 / (V * A))) * V * A + 8 * V * D;
    double rest = 24 * n + 8 * (double)lora_rank * (double)g->nparams * (2 * D + F) * 2;
    double total = act + chunk + rest;
    (void)world;
    if (!(total <= 4611686018427387904.0))   /* 2^62 */
        return lpx_error(LPX_ERANGE, "%s: the memory estimate overflows (about %.3g bytes per rank: seq %d x batch %d "
                         "over %d layers of dim %d)", who, total, g->seq, b, g->layers, g->dim);
    return LPX_OK;
}

/* ---- the whole process ---------------------------------------------- */

/* Calibrated on the CPU (docs/TRAIN.md, "Memory: the estimate against the
 * process"): lpx train --recipe bf16 --ranks 2 at four sizes from 3M to
 * 196M parameters left a gap between the real peak (VmHWM) and the
 * categories of 22, 71, 212 and 452 MiB; it fits
 *   8 MiB (the executable, its libraries, OpenBLAS's buffers)
 *   + 0.85 x each rank's activations (the backward's activation-sized
 *     temporaries: the grads of activations, f32 copies of bf16 GEMM
 *     operands, the dispatcher's intermediates)
 *   + 0.19 x each rank's master shard (the engine's packing and
 *     reduce-scatter buffers, the allocator's slack around the grads)
 * to within 2% at every size. */
#define TR_MEM_OVERHEAD_BASE  (8.0 * 1048576.0)
#define TR_MEM_OVERHEAD_ACT   0.85
#define TR_MEM_OVERHEAD_PARAM 0.19

double tr_mem_overhead(const tr_mem_est *e, int ranks, bool gpu)
{
    if (gpu) return TR_MEM_OVERHEAD_BASE;
    return TR_MEM_OVERHEAD_BASE +
           ranks * (TR_MEM_OVERHEAD_ACT * (double)e->activations + TR_MEM_OVERHEAD_PARAM * (double)e->params);
}

static void phase(const tr_opts *o, const tr_geom *g, const tr_mem_run *r, tr_recipe recipe, const char *label,
                  tr_mem_phase *p)
{
    tr_mem_est e;
    tr_mem_estimate_geom(g, recipe, o->ranks, o->lora_rank, o->batch / o->micro, o->micro / o->ranks, o->wrap_linear,
                         tr_act_dtype(o, recipe) == LPX_F32 ? 4 : 2, o->ac, &e);
    bool gpu = !strcmp(o->device, "cuda");
    memset(p, 0, sizeof *p);
    p->label = label;
    p->recipe = recipe;
    /* host memory: on the CPU everything; on a GPU the shards, grad shards
     * and AdamW state under --offload, nothing per rank otherwise (the
     * GPU's own memory is lpx-cuda's to refuse) */
    p->per_rank = !gpu ? (double)e.params + (double)e.grads + (double)e.optimizer + (double)e.unsharded +
                         (double)e.activations + (double)e.transient
                  : o->offload ? (double)e.params + (double)e.grads + (double)e.optimizer
                               : 0.0;
    p->ranks = tr_per_process(o, NULL, NULL) ? 1 : o->ranks;
    p->weights = 4.0 * (double)tr_geom_numel(g) * r->weight_copies;
    p->corpus = r->corpus_bytes;
    p->overhead = tr_mem_overhead(&e, p->ranks, gpu);
    p->total = p->per_rank * p->ranks + p->weights + p->corpus + p->overhead;
}

int tr_mem_phases(const tr_opts *o, const tr_geom *g, const tr_mem_run *r, tr_mem_phase *out)
{
    int n = 0;
    if (r->pretrain) phase(o, g, r, TR_BF16, "bf16-pretrain", &out[n++]);
    phase(o, g, r, o->recipe, tr_recipe_name(o->recipe), &out[n++]);
    if (r->compare && o->recipe != TR_BF16) phase(o, g, r, TR_BF16, "bf16", &out[n++]);
    return n;
}

/* the number after `key` in file `path` (kB when followed by "kB"); NAN if absent */
static double read_key(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    char line[512];
    double v = NAN;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl)) continue;
        char *end;
        double x = strtod(line + kl, &end);
        if (end == line + kl || !(x >= 0)) break;
        v = strstr(end, "kB") ? x * 1024.0 : x;
        break;
    }
    fclose(f);
    return v;
}

/* a cgroup file holding one number, or "max"; NAN for "max", absent or unreadable */
static double read_num(const char *dir, const char *name)
{
    char path[1300], buf[64];
    if ((size_t)snprintf(path, sizeof path, "%.1200s/%.60s", dir, name) >= sizeof path) return NAN;
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    double v = NAN;
    if (fgets(buf, sizeof buf, f)) {
        char *end;
        double x = strtod(buf, &end);
        if (end != buf && x >= 0 && x < 1.0e18) v = x;   /* v1's "no limit" is 2^63 rounded to pages */
    }
    fclose(f);
    return v;
}

/* the limit and usage of cgroup directory dir (v2 or v1 names); true when a limit is set */
static bool cg_dir(const char *dir, double *limit, double *usage, bool *v1)
{
    double l = read_num(dir, "memory.max"), u = read_num(dir, "memory.current");
    *v1 = false;
    if (isnan(l)) {
        l = read_num(dir, "memory.limit_in_bytes");
        u = read_num(dir, "memory.usage_in_bytes");
        *v1 = true;
    }
    if (isnan(l)) return false;
    *limit = l;
    *usage = isnan(u) ? 0.0 : u;
    return true;
}

/* the tightest room under a limit among dir and its ancestors down to root */
static void cg_walk(tr_host_mem *m, const char *root, const char *rel)
{
    char path[1200];
    snprintf(path, sizeof path, "%s%s", root, rel);
    size_t rootlen = strlen(root);
    for (;;) {
        double l, u;
        bool v1;
        if (cg_dir(path, &l, &u, &v1) && (isnan(m->cg_limit) || l - u < m->cg_limit - m->cg_usage)) {
            m->cg_limit = l;
            m->cg_usage = u;
            m->cg_v1 = v1;
        }
        char *slash = strrchr(path, '/');
        if (!slash || (size_t)(slash - path) < rootlen) break;
        *slash = 0;
    }
}

void tr_host_mem_read(tr_host_mem *m)
{
    memset(m, 0, sizeof *m);
    m->meminfo = m->cg_limit = m->cg_usage = NAN;
    m->avail = INFINITY;
    const char *ov = getenv("LPX_TEST_MEM_AVAILABLE");
    if (ov && *ov) {
        m->overridden = true;
        m->avail = strtod(ov, NULL);
        return;
    }
    const char *mi = getenv("LPX_TEST_MEMINFO");
    m->meminfo = read_key(mi && *mi ? mi : "/proc/meminfo", "MemAvailable:");
    const char *cg = getenv("LPX_TEST_CGROUP");
    if (cg && *cg) {
        bool v1;
        double l, u;
        if (cg_dir(cg, &l, &u, &v1)) m->cg_limit = l, m->cg_usage = u, m->cg_v1 = v1;
    } else {
        /* /proc/self/cgroup: "0::/path" (v2) or "N:...memory...:/path" (v1) */
        FILE *f = fopen("/proc/self/cgroup", "r");
        char line[1024];
        while (f && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2) continue;
            *c2 = 0;
            const char *ctl = c1 + 1, *rel = c2 + 1;
            if (!strcmp(line, "0") && !*ctl) cg_walk(m, "/sys/fs/cgroup", strcmp(rel, "/") ? rel : "");
            else if (strstr(ctl, "memory")) cg_walk(m, "/sys/fs/cgroup/memory", strcmp(rel, "/") ? rel : "");
        }
        if (f) fclose(f);
    }
    if (!isnan(m->meminfo)) m->avail = m->meminfo;
    if (!isnan(m->cg_limit)) {
        double room = m->cg_limit > m->cg_usage ? m->cg_limit - m->cg_usage : 0.0;
        if (room < m->avail) m->avail = room;
    }
    if (isnan(m->meminfo) && isnan(m->cg_limit)) {
        /* neither is readable: the machine's total, as before */
        long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
        if (pages > 0 && psize > 0) m->avail = (double)pages * (double)psize;
    }
}

void tr_mem_human(char *buf, size_t n, double bytes)
{
    if (bytes >= 1073741824.0) snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    else snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
}

void tr_host_mem_describe(const tr_host_mem *m, char *buf, size_t n)
{
    char a[32], b[32], c[32];
    tr_mem_human(a, sizeof a, m->avail);
    if (m->overridden) {
        snprintf(buf, n, "%s available (LPX_TEST_MEM_AVAILABLE, a test's setting)", a);
        return;
    }
    char mi[64] = "MemAvailable unknown", cg[200] = "no cgroup limit";
    if (!isnan(m->meminfo)) {
        tr_mem_human(b, sizeof b, m->meminfo);
        snprintf(mi, sizeof mi, "MemAvailable %s", b);
    }
    if (!isnan(m->cg_limit)) {
        tr_mem_human(b, sizeof b, m->cg_limit);
        tr_mem_human(c, sizeof c, m->cg_usage);
        snprintf(cg, sizeof cg, "cgroup %s %s minus %s %s", m->cg_v1 ? "memory.limit_in_bytes" : "memory.max", b,
                 m->cg_v1 ? "memory.usage_in_bytes" : "memory.current", c);
    }
    if (isnan(m->meminfo) && isnan(m->cg_limit))
        snprintf(buf, n, "%s in all (neither /proc/meminfo nor a cgroup limit could be read)", a);
    else snprintf(buf, n, "%s available (%s; %s)", a, mi, cg);
}

double tr_mem_peak_rss(void)
{
    double v = read_key("/proc/self/status", "VmHWM:");
    if (!isnan(v) && v > 0) return v;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) return (double)ru.ru_maxrss * 1024.0;   /* KiB on Linux */
    return 0.0;
}
