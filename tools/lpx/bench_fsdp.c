/* `lpx bench fsdp [--json] [--size N] [--iters K]`: unshard + reshard of
 * one group of four N x N weights over 4 local ranks (threads), one row
 * per recipe of `lpx train`, each with the weights as that recipe shards
 * its block linears (tools/train/shard.c): dense bf16 (bf16, and
 * float8-delayed, mxfp8 and mxfp4, which cast after the gather), dense
 * f32 (f32), float8_weight tensorwise / rowwise / blockwise (fp8 and its
 * scales on the wire) and nf4 (nf4-qlora's frozen base), and the bytes
 * each rank puts on the all-gather. The local backend copies through
 * shared memory, so the times show the engine's own cost (pre_all_gather
 * casts, packing, splitting, post_all_gather) more than a network's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"
#include "bench_report.h"
#include "commands.h"

#define RANKS 4
#define NW 4

enum { K_BF16, K_F32, K_FP8, K_FP8_ROW, K_FP8_BLOCK, K_NF4, K_DELAYED, K_MXFP8, K_MXFP4, K_COUNT };
/* the recipe each row stands for, and what its block linears are */
static const char *kind_names[K_COUNT] = {"bf16", "f32", "float8-tensorwise", "float8-rowwise", "float8-blockwise",
                                          "nf4-qlora", "float8-delayed", "mxfp8", "mxfp4"};
static const char *kind_notes[K_COUNT] = {
    NULL, "f32 on the wire (the reference recipe)", "fp8 + one scale per tensor on the wire",
    "fp8 + a scale per row on the wire", "fp8 + a scale per 128 x 128 block on the wire",
    "NF4 codes + double-quantized scales on the wire (frozen)", "bf16 on the wire: the fp8 cast happens after the gather",
    "bf16 on the wire: the MX cast happens after the gather", "bf16 on the wire: the MX cast happens after the gather"};

typedef struct fsdp_bench {
    lpx_tensor *w[NW];       /* full bf16 weights, shared read-only by the ranks */
    int kind;
    long iters;
    double ms;               /* rank 0: median unshard+reshard time */
    uint64_t bytes;          /* rank 0: all-gather bytes per unshard */
    uint64_t peak;           /* rank 0: peak unsharded bytes */
    double pack_ms, unpack_ms, coll_ms;
} fsdp_bench;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static lpx_status bench_rank(lpx_comm *comm, void *vctx)
{
    fsdp_bench *c = vctx;
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (!st) st = lpx_fsdp_new(mesh, NULL, &f);
    lpx_mesh_release(mesh);
    if (!st) st = lpx_fsdp_group_add(f, "layer", &g);
    for (int i = 0; i < NW && !st; i++) {
        lpx_tensor *p = NULL;
        if (c->kind == K_FP8 || c->kind == K_FP8_ROW || c->kind == K_FP8_BLOCK) {
            lpx_float8_weight_opts wo = {.struct_size = sizeof wo, .fp8 = LPX_F8E4M3FN,
                                         .rowwise = c->kind == K_FP8_ROW, .blockwise = c->kind == K_FP8_BLOCK};
            st = lpx_float8_weight_new(c->w[i], &wo, &p);
        } else if (c->kind == K_NF4) {
            st = lpx_nf4_quantize(c->w[i], NULL, &p);
        } else if (c->kind == K_F32) {
            st = lpx_cast(c->w[i], LPX_F32, false, &p);
        } else {
            p = c->w[i];
            lpx_tensor_retain(p);
        }
        if (!st) st = lpx_fsdp_param_add(g, "w", p, c->kind == K_NF4 ? LPX_FSDP_FROZEN : 0, NULL);
        lpx_tensor_release(p);
    }
    if (!st) st = lpx_fsdp_shard(f);
    if (!st) st = lpx_fsdp_group_precompute_scales(g);
    double *t = calloc((size_t)c->iters, sizeof *t);
    if (!t && !st) st = lpx_error(LPX_ENOMEM, "bench fsdp: out of memory");
    for (long k = -1; k < c->iters && !st; k++) { /* k = -1: warm-up */
        if (k == 0) lpx_fsdp_stats_reset(f);
        uint64_t t0 = lpx_now_ns();
        st = lpx_fsdp_unshard(g);
        if (!st) st = lpx_fsdp_reshard(g);
        if (k >= 0) t[k] = (double)(lpx_now_ns() - t0) / 1e6;
    }
    if (!st && lpx_comm_rank(comm) == 0) {
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        lpx_fsdp_stats_get(f, &s);
        qsort(t, (size_t)c->iters, sizeof *t, cmp_d);
        c->ms = t[c->iters / 2];
        c->bytes = s.bytes[LPX_COLL_ALL_GATHER] / (uint64_t)c->iters;
        c->peak = s.peak_unsharded_bytes;
        c->pack_ms = (double)s.pack_ns / 1e6 / (double)c->iters;
        c->unpack_ms = (double)s.unpack_ns / 1e6 / (double)c->iters;
        c->coll_ms = (double)s.ns[LPX_COLL_ALL_GATHER] / 1e6 / (double)c->iters;
    }
    free(t);
    lpx_fsdp_free(f);
    return st;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx bench fsdp [--json] [--size N] [--iters K]\n"
               "  unshard+reshard of a group of %d N x N weights (default 2048) over %d local ranks,\n"
               "  one row per recipe of lpx train (its weights as it shards them); K timed iterations\n"
               "  (default 9, median reported)\n",
            NW, RANKS);
}

int lpx_bench_fsdp(int argc, char **argv)
{
    bool json = false;
    long size = 2048, iters = 9;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            size = strtol(argv[++i], &end, 10);
            if (*end || size < 64 || size > 16384 || size % 64) {
                fprintf(stderr, "lpx bench fsdp: --size needs a multiple of 64 in 64..16384\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = strtol(argv[++i], &end, 10);
            if (*end || iters < 1 || iters > 10000) {
                fprintf(stderr, "lpx bench fsdp: --iters needs 1..10000\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lpx bench fsdp: unknown option '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    fsdp_bench c;
    memset(&c, 0, sizeof c);
    c.iters = iters;
    int64_t shape[2] = {size, size};
    for (int i = 0; i < NW; i++)
        if (lpx_randn(2, shape, 1 + (uint64_t)i, LPX_BF16, lpx_cpu(), &c.w[i])) {
            fprintf(stderr, "lpx bench fsdp: %s\n", lpx_last_error());
            return 1;
        }
    lpx_bench_report rep;
    lpx_bench_report_init(&rep, "fsdp", json);
    lpx_bench_report_note(&rep, "group of %d x [%ld, %ld] weights, %d local ranks, median of %ld unshard+reshard",
                          NW, size, size, RANKS, iters);
    double ms[K_COUNT] = {0}, bytes[K_COUNT] = {0};
    int rc = 0;
    for (int k = 0; k < K_COUNT; k++) {
        c.kind = k;
        lpx_status st = lpx_local_run(RANKS, bench_rank, &c, 0, NULL);
        if (st) {
            fprintf(stderr, "lpx bench fsdp (%s): %s\n", kind_names[k], lpx_last_error());
            rc = 1;
            continue;
        }
        ms[k] = c.ms;
        bytes[k] = (double)c.bytes;
        char name[64], note[160];
        snprintf(name, sizeof name, "%s unshard+reshard", kind_names[k]);
        snprintf(note, sizeof note, "all-gather %.2f ms, pack %.2f ms, split+post %.2f ms, peak unsharded %.1f MiB",
                 c.coll_ms, c.pack_ms, c.unpack_ms, (double)c.peak / 1048576.0);
        lpx_bench_row r1 = {.case_name = name, .value = ms[k], .unit = "ms", .baseline = k ? ms[K_BF16] : lpx_bench_na(),
                            .baseline_case = "bf16", .compare = lpx_bench_na(), .goal = lpx_bench_na(), .note = note};
        lpx_bench_report_add(&rep, &r1);
        snprintf(name, sizeof name, "%s all-gather bytes/rank", kind_names[k]);
        lpx_bench_row r2 = {.case_name = name, .value = bytes[k] / 1048576.0, .unit = "MiB",
                            .baseline = k ? bytes[K_BF16] / 1048576.0 : lpx_bench_na(), .baseline_case = "bf16",
                            .compare = lpx_bench_na(), .goal = lpx_bench_na(),
                            /* not a goal: it follows from the wire format,
                             * so no machine can miss it; test_fsdp_unshard
                             * checks it */
                            .note = kind_notes[k]};
        lpx_bench_report_add(&rep, &r2);
    }
    lpx_bench_report_finish(&rep);
    for (int i = 0; i < NW; i++) lpx_tensor_release(c.w[i]);
    return rc;
}
