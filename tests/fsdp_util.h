/* Shared by the fsdp test programs (tests/test_fsdp_*.c): the
 * helpers and fixtures their cases use. Static inline: each program
 * compiles only what it calls. */
#ifndef LPX_TESTS_FSDP_UTIL_H
#define LPX_TESTS_FSDP_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "tensor_util.h"
#include "dt_util.h"
#include "fp8_ref.h"

/* ---- mixed group: every kind in one all-gather --------------------- */

typedef struct mixed_ctx {
    lpx_tensor *full[6];      /* as given to the engine */
    lpx_tensor *expect[6];    /* what unshard must rebuild */
    bool keep;
} mixed_ctx;

/* ---- float8 counting ---------------------------------------------- */

typedef struct f8_ctx {
    lpx_tensor *masters[3];
    uint64_t with_pre, without_pre, ar_with, ar_without;
} f8_ctx;

/* ---- fp8 vs bf16 all-gather bytes for a 4096 x 4096 weight --------- */

typedef struct bytes_ctx {
    lpx_tensor *master;
    uint64_t bytes[2];
} bytes_ctx;

/* ---- a 2-layer model: engine == unsharded, bit for bit ------------- */

#define IN 8
#define HID 11
#define OUT 4
#define BATCH 5

typedef struct model_ctx {
    lpx_tensor *params[4];         /* w1, b1, w2, b2 (full, step 0) */
    lpx_tensor *ref_grad[4];       /* averaged over ranks, f32 rank order */
    lpx_tensor *ref_param[4];      /* after one AdamW step */
    float ref_loss[MAXR][2];       /* per rank: before and after the step */
} model_ctx;

/* ---- fp8 gradient reduce-scatter ------------------------------------ */

typedef struct fp8g_ctx {
    lpx_tensor *grads[MAXR];
    lpx_tensor *avg;
    lpx_tensor *got[MAXR];   /* each rank's reduced grad shard */
    double err[MAXR], amax;
    uint64_t amax_ar[MAXR], rs_bytes[MAXR];
} fp8g_ctx;

/* ---- hybrid sharding (2-D mesh): grads averaged over both mesh dims ---- */

typedef struct hyb_ctx {
    lpx_comm *outer[MAXR], *inner[MAXR];
    lpx_tensor *grads[MAXR], *avg;
    lpx_tensor *got[MAXR];
    bool fp8;
    uint64_t amax_ar[MAXR];
} hyb_ctx;

/* ---- mixed precision: param_dtype = bf16 ---------------------------- */

#define MP_N 4

typedef struct mp_ctx {
    lpx_tensor *full[MP_N];     /* f32 (0..2) and bf16 (3) params */
    lpx_tensor *expect[MP_N];   /* full cast to bf16 (3: itself) */
    bool keep;
} mp_ctx;

/* ---- LPX_FSDP_NO_DECAY ---------------------------------------------- */

typedef struct nd_ctx {
    lpx_tensor *p;              /* initial value of every param */
} nd_ctx;

/* ---- AdamW state out and in (checkpoints) ---------------------------- */

typedef struct as_ctx {
    lpx_tensor *p;
} as_ctx;

/* ---- lpx_fsdp_precompute_scales: one all-reduce for the model ------- */

#define PS_G 4
#define PS_P 3

typedef struct ps_ctx {
    lpx_tensor *masters[PS_G][PS_P];  /* NULL: no param */
    lpx_float8_weight_opts opts[PS_G][PS_P];
    bool dense[PS_G][PS_P];           /* a plain dense param */
    lpx_tensor *expect[PS_G][PS_P];   /* gather-then-cast where checked */
} ps_ctx;

/* ---- rowwise float8 all-gather (issue 5) ---------------------------- */

/* Rowwise float8_weight params (uneven rows; rows that leave trailing
 * ranks empty at world 8; an all-zero row; f32/bf16/f16 masters; e4m3
 * and e5m2) in one group: unshard == rowwise quantize of the full master
 * (codes and per-row scales), no amax all-reduce anywhere, 1 wire byte
 * per element plus the row scales, and a rowwise Float8Linear step on the
 * gathered weight == the unsharded one. */
#define RW_N 5

typedef struct rw_ctx {
    lpx_tensor *masters[RW_N];
    lpx_float8_weight_opts opts[RW_N];
    lpx_tensor *expect[RW_N];   /* lpx_float8_quantize(full master, rowwise) */
    bool keep;
    /* Float8Linear with param 0 as W */
    lpx_tensor *x, *gout;
    lpx_tensor *ref[4];         /* out, grad_x, grad_W, grad_b with W = expect[0] (unsharded) */
    lpx_tensor *hp[3];          /* out, grad_x, grad_W in high precision with the master */
} rw_ctx;

static inline size_t rw_round16(size_t n) { return (n + 15) / 16 * 16; }

/* SQNR (dB) of x against ref, both dense */
static inline double rw_sqnr(lpx_tensor *ref, lpx_tensor *x)
{
    size_t n = (size_t)lpx_tensor_numel(ref);
    if (!x || (size_t)lpx_tensor_numel(x) != n) return -1e30;
    float *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
    lpx_tensor *ca = NULL, *cb = NULL;
    double s = 0, e = 0;
    if (a && b && !lpx_contiguous(ref, &ca) && !lpx_contiguous(x, &cb) &&
        !lpx_convert(a, LPX_F32, lpx_tensor_data(ca), lpx_tensor_dtype(ca), n, 0) &&
        !lpx_convert(b, LPX_F32, lpx_tensor_data(cb), lpx_tensor_dtype(cb), n, 0)) {
        for (size_t i = 0; i < n; i++) {
            s += (double)a[i] * a[i];
            e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        }
    } else {
        e = s = -1;
    }
    lpx_tensor_release(ca);
    lpx_tensor_release(cb);
    free(a);
    free(b);
    if (s < 0) return -1e30;
    return e == 0 ? 1e30 : 10.0 * log10(s / e);
}

/* the float8 metadata and the three inner tensors, bit for bit */
static inline bool rw_same_f8(lpx_tensor *a, lpx_tensor *b)
{
    lpx_float8_info ia, ib;
    if (lpx_float8_get_info(a, &ia) || lpx_float8_get_info(b, &ib)) return false;
    return ia.fp8 == ib.fp8 && ia.logical == ib.logical && ia.role == ib.role && ia.granularity == ib.granularity &&
           ia.axis == ib.axis && same_bits(a, b) && same_bits(lpx_float8_data(a), lpx_float8_data(b)) &&
           same_bits(lpx_float8_scale(a), lpx_float8_scale(b)) &&
           same_bits(lpx_float8_scale_inv(a), lpx_float8_scale_inv(b));
}

static inline lpx_status rw_rank(lpx_comm *comm, void *vctx)
{
    rw_ctx *c = vctx;
    int r = lpx_comm_rank(comm), world = lpx_comm_size(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .keep_storage = c->keep};
    lpx_comm_stats c0 = {.struct_size = sizeof c0}, c1 = {.struct_size = sizeof c1};
    lpx_comm_stats_get(comm, &c0);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "rowwise", &g));
    for (int i = 0; i < RW_N; i++) {
        lpx_tensor *w = NULL;
        RCHECK_OK(r, lpx_float8_weight_new(c->masters[i], &c->opts[i], &w));
        RCHECK(r, lpx_float8_weight_rowwise(w));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "w", w, 0, NULL));
        lpx_tensor_release(w);
    }
    RCHECK_OK(r, lpx_fsdp_shard(f));
    /* (b) the precompute finds nothing to agree on */
    RCHECK_OK(r, lpx_fsdp_group_precompute_scales(g));
    RCHECK_OK(r, lpx_fsdp_precompute_scales(f));
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    if (s.amax_allreduces || s.calls[LPX_COLL_ALL_REDUCE])
        rfail(r, "shard + precompute: %llu amax all-reduces, %llu all-reduces", (unsigned long long)s.amax_allreduces,
              (unsigned long long)s.calls[LPX_COLL_ALL_REDUCE]);
    for (int i = 0; i < RW_N; i++)
        if (lpx_float8_weight_scale(lpx_fsdp_param_local(g, i)) != 0.0f) rfail(r, "param %d got a replicated scale", i);
    /* (c) the wire: per rank, each param's block is its largest shard's
     * fp8 codes (1 byte per element) plus its f32 scale and scale_inv per
     * row, each piece 16-byte aligned */
    uint64_t wire = 0, codes = 0;
    for (int i = 0; i < RW_N; i++) {
        int64_t rows = lpx_tensor_shape(c->masters[i])[0], chunk = 0, start = 0, len = 0;
        int64_t cols = lpx_tensor_numel(c->masters[i]) / (rows ? rows : 1);
        RCHECK_OK(r, lpx_shard_range(rows, world, r, 1, &chunk, &start, &len));
        wire += rw_round16((size_t)(chunk * cols)) + 2 * rw_round16((size_t)chunk * 4);
        codes += (uint64_t)(chunk * cols);
    }
    lpx_fsdp_stats_reset(f);
    for (int step = 0; step < 2; step++) {
        lpx_comm_stats a0 = {.struct_size = sizeof a0}, a1 = {.struct_size = sizeof a1};
        lpx_comm_stats_get(comm, &a0);
        RCHECK_OK(r, lpx_fsdp_unshard(g));
        lpx_comm_stats_get(comm, &a1);
        uint64_t total = 0;
        for (int k = 0; k < LPX_COLL_MAX; k++) total += a1.calls[k] - a0.calls[k];
        if (total != 1 || a1.calls[LPX_COLL_ALL_GATHER] - a0.calls[LPX_COLL_ALL_GATHER] != 1)
            rfail(r, "step %d: the unshard ran %llu collectives, want one all-gather", step, (unsigned long long)total);
        if (a1.bytes[LPX_COLL_ALL_GATHER] - a0.bytes[LPX_COLL_ALL_GATHER] != wire)
            rfail(r, "step %d: %llu all-gather bytes, want %llu (%llu fp8 codes + row scales)", step,
                  (unsigned long long)(a1.bytes[LPX_COLL_ALL_GATHER] - a0.bytes[LPX_COLL_ALL_GATHER]),
                  (unsigned long long)wire, (unsigned long long)codes);
        /* (a) gather-then-nothing == rowwise quantize of the full master */
        for (int i = 0; i < RW_N; i++) {
            lpx_tensor *full = lpx_fsdp_param_full(g, i);
            if (!full || !lpx_float8_is(full)) {
                rfail(r, "step %d: param %d is not a float8 tensor after unshard", step, i);
                continue;
            }
            if (!rw_same_f8(full, c->expect[i]))
                rfail(r, "step %d: param %d differs from the rowwise quantized full master", step, i);
        }
        /* (d) Float8Linear, rowwise preset, on the gathered weight */
        lpx_float8_linear_recipe rc;
        RCHECK_OK(r, lpx_float8_linear_recipe_preset("rowwise", &rc));
        lpx_tensor *out = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
        lpx_float8_linear_ctx *lc = NULL;
        lpx_float8_linear_report rep;
        memset(&rep, 0, sizeof rep);
        RCHECK_OK(r, lpx_float8_linear_forward(&rc, NULL, c->x, lpx_fsdp_param_full(g, 0), NULL, &out, &lc, &rep));
        if (lc) RCHECK_OK(r, lpx_float8_linear_backward(lc, c->gout, &gx, &gw, &gb, &rep));
        lpx_float8_linear_ctx_free(lc);
        /* fprop uses the gathered rows as they are (per-row scales are
         * per-column scales of W^T); dgrad wants W scaled per column,
         * which the recipe makes from it (e4m3, power-of-2 scales) */
        RCHECK(r, rep.fprop.b.given_fp8 && !rep.fprop.b.quantized);
        RCHECK(r, rep.dgrad.b.quantized && !rep.dgrad.b.given_fp8 && rep.dgrad.b.dtype == rc.dgrad.b.dtype);
        if (rep.dgrad.b.quantized) {
            int e;
            RCHECK(r, frexp(rep.dgrad.b.stats.scale, &e) == 0.5);
        }
        lpx_tensor *got[4] = {out, gx, gw, gb};
        static const char *what[4] = {"out", "grad_x", "grad_W", "grad_b"};
        for (int k = 0; k < 4; k++)
            if (!same_bits(got[k], c->ref[k])) rfail(r, "step %d: Float8Linear %s != unsharded", step, what[k]);
        for (int k = 0; k < 3; k++) {
            double db = rw_sqnr(c->hp[k], got[k]);
            if (db < (k ? 17.0 : 18.0)) rfail(r, "step %d: Float8Linear %s SQNR %.2f dB", step, what[k], db);
        }
        for (int k = 0; k < 4; k++) lpx_tensor_release(got[k]);
        RCHECK_OK(r, lpx_fsdp_reshard(g));
    }
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    if (s.amax_allreduces || s.calls[LPX_COLL_ALL_REDUCE] || s.calls[LPX_COLL_ALL_GATHER] != 2 ||
        s.bytes[LPX_COLL_ALL_GATHER] != 2 * wire)
        rfail(r, "two unshards: %llu amax all-reduces, %llu all-reduces, %llu all-gathers of %llu bytes (want 0, 0, 2, "
                 "%llu)", (unsigned long long)s.amax_allreduces, (unsigned long long)s.calls[LPX_COLL_ALL_REDUCE],
              (unsigned long long)s.calls[LPX_COLL_ALL_GATHER], (unsigned long long)s.bytes[LPX_COLL_ALL_GATHER],
              (unsigned long long)(2 * wire));
    lpx_fsdp_free(f);
    /* the whole life of the engine, as the comm saw it: no all-reduce */
    lpx_comm_stats_get(comm, &c1);
    if (c1.calls[LPX_COLL_ALL_REDUCE] != c0.calls[LPX_COLL_ALL_REDUCE])
        rfail(r, "the comm ran %llu all-reduces",
              (unsigned long long)(c1.calls[LPX_COLL_ALL_REDUCE] - c0.calls[LPX_COLL_ALL_REDUCE]));
    return LPX_OK;
}

/* ---- faults -------------------------------------------------------- */

typedef struct fault_ctx {
    int mode;
    lpx_tensor *full;
    lpx_status st[MAXR];
    double secs[MAXR];
} fault_ctx;
#endif
