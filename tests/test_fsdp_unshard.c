/* The fsdp tests, unshard over world sizes 1..8 for mixed kinds and dtypes
 * in one group (cast-then-gather == gather-then-cast bit for bit), counting
 * (all-gathers, amax all-reduces with and without precompute, fp8/bf16
 * bytes, peak unsharded groups), the model-wide scale precompute and rowwise
 * fp8 all-gather. */
#include "fsdp_util.h"

static uint64_t ag_calls(lpx_fsdp *f)
{
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    lpx_fsdp_stats_get(f, &s);
    return s.calls[LPX_COLL_ALL_GATHER];
}

static lpx_status mixed_rank(lpx_comm *comm, void *vctx)
{
    mixed_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .keep_storage = c->keep};
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "layer0", &g));
    static const char *names[6] = {"dense_f32", "bias_bf16", "tiny", "nf4_base", "lora_a", "f8w"};
    for (int i = 0; i < 6; i++)
        RCHECK_OK(r, lpx_fsdp_param_add(g, names[i], c->full[i], i == 3 ? LPX_FSDP_FROZEN : 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    lpx_tensor *first[6] = {0};
    for (int step = 0; step < 2; step++) {
        RCHECK_OK(r, lpx_fsdp_unshard(g));
        RCHECK(r, ag_calls(f) == (uint64_t)step + 1); /* ONE all-gather per unshard */
        for (int i = 0; i < 6; i++) {
            lpx_tensor *full = lpx_fsdp_param_full(g, i);
            RCHECK(r, full != NULL);
            if (!full) continue;
            if (!same_bits(full, c->expect[i])) rfail(r, "step %d: param %s differs from the full tensor", step, names[i]);
            if (step == 0) first[i] = full, lpx_tensor_retain(full);
            else if (c->keep && first[i] != full) rfail(r, "keep_storage: param %s was reallocated", names[i]);
        }
        RCHECK_OK(r, lpx_fsdp_reshard(g));
    }
    for (int i = 0; i < 6; i++) lpx_tensor_release(first[i]);
    lpx_fsdp_free(f);
    return LPX_OK;
}

static lpx_status f8_count_rank(lpx_comm *comm, void *vctx)
{
    f8_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    for (int pre = 0; pre < 2; pre++) {
        lpx_fsdp *f = NULL;
        lpx_status st = new_engine(comm, NULL, &f);
        if (st) return st;
        lpx_fsdp_group *g = NULL;
        RCHECK_OK(r, lpx_fsdp_group_add(f, "layer", &g));
        for (int i = 0; i < 3; i++) {
            lpx_tensor *w = NULL;
            RCHECK_OK(r, lpx_float8_weight_new(c->masters[i], NULL, &w));
            RCHECK_OK(r, lpx_fsdp_param_add(g, "w", w, 0, NULL));
            lpx_tensor_release(w);
        }
        RCHECK_OK(r, lpx_fsdp_shard(f));
        lpx_fsdp_stats_reset(f);
        /* one step: (precompute), unshard forward, reshard, unshard backward */
        if (pre) RCHECK_OK(r, lpx_fsdp_group_precompute_scales(g));
        for (int k = 0; k < 2; k++) {
            RCHECK_OK(r, lpx_fsdp_unshard(g));
            RCHECK_OK(r, lpx_fsdp_reshard(g));
        }
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
        if (r == 0) {
            if (pre) c->with_pre = s.amax_allreduces, c->ar_with = s.calls[LPX_COLL_ALL_REDUCE];
            else c->without_pre = s.amax_allreduces, c->ar_without = s.calls[LPX_COLL_ALL_REDUCE];
        }
        lpx_fsdp_free(f);
    }
    return LPX_OK;
}

static lpx_status bytes_rank(lpx_comm *comm, void *vctx)
{
    bytes_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    for (int fp8 = 0; fp8 < 2; fp8++) {
        lpx_fsdp *f = NULL;
        lpx_status st = new_engine(comm, NULL, &f);
        if (st) return st;
        lpx_fsdp_group *g = NULL;
        lpx_tensor *p = c->master;
        lpx_tensor_retain(p);
        if (fp8) {
            lpx_tensor_release(p);
            RCHECK_OK(r, lpx_float8_weight_new(c->master, NULL, &p));
        }
        RCHECK_OK(r, lpx_fsdp_group_add(f, "w", &g));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "w", p, 0, NULL));
        lpx_tensor_release(p);
        RCHECK_OK(r, lpx_fsdp_shard(f));
        RCHECK_OK(r, lpx_fsdp_group_precompute_scales(g));
        lpx_fsdp_stats_reset(f);
        RCHECK_OK(r, lpx_fsdp_unshard(g));
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
        if (r == 0) c->bytes[fp8] = s.bytes[LPX_COLL_ALL_GATHER];
        lpx_fsdp_free(f);
    }
    return LPX_OK;
}

/* ---- at most two groups unsharded ---------------------------------- */

static lpx_status peak_rank(lpx_comm *comm, void *vctx)
{
    (void)vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g[4];
    uint64_t gb[4];
    for (int i = 0; i < 4; i++) {
        RCHECK_OK(r, lpx_fsdp_group_add(f, "layer", &g[i]));
        const int64_t s[2] = {9 + i, 4 + i};
        lpx_tensor *p = rand_normal(2, s, (uint64_t)i, 1.0, LPX_F32);
        RCHECK_OK(r, lpx_fsdp_param_add(g[i], "w", p, 0, NULL));
        gb[i] = (uint64_t)(9 + i) * (uint64_t)(4 + i) * 4;
        lpx_tensor_release(p);
    }
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    /* forward with prefetch, then backward in reverse */
    for (int i = 0; i < 4; i++) {
        RCHECK_OK(r, lpx_fsdp_unshard(g[i]));
        if (i + 1 < 4) RCHECK_OK(r, lpx_fsdp_prefetch(g[i + 1]));
        RCHECK(r, lpx_fsdp_param_full(g[i], 0) != NULL);
        if (i + 2 < 4) RCHECK(r, lpx_fsdp_unshard(g[i + 2]) == LPX_EFULL); /* a third is refused */
        RCHECK_OK(r, lpx_fsdp_reshard(g[i]));
    }
    for (int i = 3; i >= 0; i--) {
        RCHECK_OK(r, lpx_fsdp_unshard(g[i]));
        if (i > 0) RCHECK_OK(r, lpx_fsdp_prefetch(g[i - 1]));
        RCHECK_OK(r, lpx_fsdp_reshard(g[i]));
    }
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    RCHECK(r, s.peak_unsharded_groups == 2 || (s.peak_unsharded_groups == 2));
    RCHECK(r, s.peak_unsharded_bytes <= gb[3] + gb[2] && s.peak_unsharded_bytes > 0);
    RCHECK(r, s.unsharded_bytes == 0);
    RCHECK(r, s.calls[LPX_COLL_ALL_GATHER] == 8 && s.unshards == 8);
    lpx_fsdp_free(f);
    return LPX_OK;
}

static lpx_status ps_build(ps_ctx *c, lpx_comm *comm, int r, lpx_fsdp **f, lpx_fsdp_group **g)
{
    lpx_status st = new_engine(comm, NULL, f);
    if (st) return st;
    for (int j = 0; j < PS_G; j++) {
        RCHECK_OK(r, lpx_fsdp_group_add(*f, "layer", &g[j]));
        for (int i = 0; i < PS_P; i++) {
            if (!c->masters[j][i]) continue;
            lpx_tensor *p = c->masters[j][i];
            lpx_tensor_retain(p);
            if (!c->dense[j][i]) {
                lpx_tensor_release(p);
                p = NULL;
                RCHECK_OK(r, lpx_float8_weight_new(c->masters[j][i], &c->opts[j][i], &p));
            }
            RCHECK_OK(r, lpx_fsdp_param_add(g[j], "w", p, 0, NULL));
            lpx_tensor_release(p);
        }
    }
    RCHECK_OK(r, lpx_fsdp_shard(*f));
    lpx_fsdp_stats_reset(*f);
    return LPX_OK;
}

static lpx_status ps_rank(lpx_comm *comm, void *vctx)
{
    ps_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *fa = NULL, *fb = NULL;
    lpx_fsdp_group *ga[PS_G] = {0}, *gb[PS_G] = {0};
    lpx_status st = ps_build(c, comm, r, &fa, ga);
    if (!st) st = ps_build(c, comm, r, &fb, gb);
    if (st) {
        lpx_fsdp_free(fa);
        return st;
    }
    lpx_comm_stats c0 = {.struct_size = sizeof c0}, c1 = {.struct_size = sizeof c1};
    /* A: model-wide, twice (one all-reduce per call) */
    for (int call = 1; call <= 2; call++) {
        lpx_comm_stats_get(comm, &c0);
        RCHECK_OK(r, lpx_fsdp_precompute_scales(fa));
        lpx_comm_stats_get(comm, &c1);
        lpx_fsdp_stats s = {.struct_size = sizeof s};
        RCHECK_OK(r, lpx_fsdp_stats_get(fa, &s));
        if (s.amax_allreduces != (uint64_t)call || s.calls[LPX_COLL_ALL_REDUCE] != (uint64_t)call)
            rfail(r, "call %d: %llu amax all-reduces, %llu all-reduces (want %d)", call,
                  (unsigned long long)s.amax_allreduces, (unsigned long long)s.calls[LPX_COLL_ALL_REDUCE], call);
        uint64_t total = 0;
        for (int k = 0; k < LPX_COLL_MAX; k++) total += c1.calls[k] - c0.calls[k];
        if (c1.calls[LPX_COLL_ALL_REDUCE] - c0.calls[LPX_COLL_ALL_REDUCE] != 1 || total != 1)
            rfail(r, "call %d: the comm ran %llu collectives", call, (unsigned long long)total);
    }
    /* B: the per-group path */
    int groups_f8 = 0;
    for (int j = 0; j < PS_G; j++) {
        bool any = false;
        for (int i = 0; i < PS_P; i++) any |= c->masters[j][i] && !c->dense[j][i] && !c->opts[j][i].rowwise;
        groups_f8 += any;
        RCHECK_OK(r, lpx_fsdp_group_precompute_scales(gb[j]));
    }
    lpx_fsdp_stats sb = {.struct_size = sizeof sb};
    RCHECK_OK(r, lpx_fsdp_stats_get(fb, &sb));
    if (sb.amax_allreduces != (uint64_t)groups_f8)
        rfail(r, "per-group path: %llu amax all-reduces, want %d", (unsigned long long)sb.amax_allreduces, groups_f8);
    /* same scales bit for bit; tensorwise ones set, rowwise ones not */
    for (int j = 0; j < PS_G; j++)
        for (int i = 0; i < PS_P; i++) {
            if (!c->masters[j][i] || c->dense[j][i]) continue;
            float sa = lpx_float8_weight_scale(lpx_fsdp_param_local(ga[j], i)),
                  sbv = lpx_float8_weight_scale(lpx_fsdp_param_local(gb[j], i));
            if (memcmp(&sa, &sbv, sizeof sa)) rfail(r, "group %d param %d: scale %a, per-group %a", j, i, (double)sa, (double)sbv);
            if (c->opts[j][i].rowwise ? sa != 0 : !(sa > 0))
                rfail(r, "group %d param %d: scale %g", j, i, (double)sa);
        }
    /* unsharding every group after the precompute runs no all-reduce, and
     * gathers the same bits as the per-group path (and as gather-then-cast) */
    lpx_fsdp_stats_reset(fa);
    for (int j = 0; j < PS_G; j++) {
        RCHECK_OK(r, lpx_fsdp_unshard(ga[j]));
        RCHECK_OK(r, lpx_fsdp_unshard(gb[j]));
        for (int i = 0; i < PS_P; i++) {
            if (!c->masters[j][i]) continue;
            lpx_tensor *a = lpx_fsdp_param_full(ga[j], i), *b = lpx_fsdp_param_full(gb[j], i);
            if (!same_bits(a, b)) rfail(r, "group %d param %d: unsharded tensors differ", j, i);
            if (c->expect[j][i] && !same_bits(a, c->expect[j][i]))
                rfail(r, "group %d param %d: != gather-then-cast", j, i);
        }
        RCHECK_OK(r, lpx_fsdp_reshard(ga[j]));
        RCHECK_OK(r, lpx_fsdp_reshard(gb[j]));
    }
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(fa, &s));
    RCHECK(r, s.amax_allreduces == 0 && s.calls[LPX_COLL_ALL_REDUCE] == 0 && s.calls[LPX_COLL_ALL_GATHER] == PS_G);
    lpx_fsdp_free(fa);
    lpx_fsdp_free(fb);
    /* a model without tensorwise float8 weights: no collective at all */
    lpx_fsdp *fc = NULL;
    lpx_fsdp_group *gc = NULL;
    if ((st = new_engine(comm, NULL, &fc))) return st;
    RCHECK_OK(r, lpx_fsdp_group_add(fc, "dense", &gc));
    RCHECK_OK(r, lpx_fsdp_param_add(gc, "w", c->masters[0][0], 0, NULL));
    lpx_tensor *rw = NULL;
    RCHECK_OK(r, lpx_float8_weight_new(c->masters[1][0], &c->opts[1][0], &rw)); /* rowwise */
    RCHECK_OK(r, lpx_fsdp_param_add(gc, "rw", rw, 0, NULL));
    lpx_tensor_release(rw);
    RCHECK_OK(r, lpx_fsdp_shard(fc));
    lpx_fsdp_stats_reset(fc);
    RCHECK_OK(r, lpx_fsdp_precompute_scales(fc));
    RCHECK_OK(r, lpx_fsdp_stats_get(fc, &s));
    RCHECK(r, s.amax_allreduces == 0 && s.calls[LPX_COLL_ALL_REDUCE] == 0);
    lpx_fsdp_free(fc);
    return LPX_OK;
}

static void test_mixed_group(void)
{
    mixed_ctx c;
    memset(&c, 0, sizeof c);
    const int64_t s0[2] = {13, 5}, s1[1] = {7}, s2[2] = {2, 3}, s3[2] = {256 * 3 + 40, 64}, s4[2] = {4, 64},
                  s5[2] = {19, 16};
    c.full[0] = rand_normal(2, s0, 1, 1.0, LPX_F32);
    c.full[1] = rand_normal(1, s1, 2, 1.0, LPX_BF16);
    c.full[2] = rand_normal(2, s2, 3, 1.0, LPX_F32);
    lpx_tensor *w = rand_normal(2, s3, 4, 1.0, LPX_BF16), *m = rand_normal(2, s5, 6, 1.0, LPX_F32);
    CHECK_OK(lpx_nf4_quantize(w, NULL, &c.full[3]));
    c.full[4] = rand_normal(2, s4, 5, 1.0, LPX_BF16);
    CHECK_OK(lpx_float8_weight_new(m, NULL, &c.full[5]));
    for (int i = 0; i < 5; i++) {
        c.expect[i] = c.full[i];
        lpx_tensor_retain(c.expect[i]);
    }
    /* gather-then-cast: the full master quantized with dynamic tensorwise */
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .role = LPX_FLOAT8_ROLE_WEIGHT};
    CHECK_OK(lpx_float8_quantize(m, &o, &c.expect[5], NULL));
    for (int keep = 0; keep < 2; keep++) {
        c.keep = keep;
        for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], mixed_rank, &c);
        for (int wsz = 5; wsz <= 7; wsz++) run_ranks(wsz, mixed_rank, &c);
    }
    for (int i = 0; i < 6; i++) {
        lpx_tensor_release(c.full[i]);
        lpx_tensor_release(c.expect[i]);
    }
    lpx_tensor_release(w);
    lpx_tensor_release(m);
}

static void test_precompute_counting(void)
{
    f8_ctx c;
    memset(&c, 0, sizeof c);
    const int64_t s[2] = {10, 8};
    for (int i = 0; i < 3; i++) c.masters[i] = rand_normal(2, s, 20 + (uint64_t)i, 1.0, LPX_F32);
    for (int i = 1; i < NWORLDS; i++) {
        run_ranks(worlds[i], f8_count_rank, &c);
        CHECKF(c.with_pre == 1 && c.ar_with == 1, "with precompute: %llu amax all-reduces, %llu all-reduces",
               (unsigned long long)c.with_pre, (unsigned long long)c.ar_with);
        /* without: each weight all-reduces its amax at each unshard */
        CHECKF(c.without_pre == 6 && c.ar_without == 6, "without: %llu amax all-reduces, %llu all-reduces",
               (unsigned long long)c.without_pre, (unsigned long long)c.ar_without);
    }
    for (int i = 0; i < 3; i++) lpx_tensor_release(c.masters[i]);
}

static void test_fp8_bytes(void)
{
    bytes_ctx c;
    memset(&c, 0, sizeof c);
    const int64_t s[2] = {4096, 4096};
    CHECK_OK(lpx_rand(2, s, 9, LPX_BF16, lpx_cpu(), &c.master));
    run_ranks(2, bytes_rank, &c);
    double ratio = (double)c.bytes[1] / (double)c.bytes[0];
    printf("     fp8 all-gather %llu bytes, bf16 %llu bytes: ratio %.4f\n", (unsigned long long)c.bytes[1],
           (unsigned long long)c.bytes[0], ratio);
    CHECK(c.bytes[0] >= 4096ull * 4096 * 2 / 2 && ratio <= 0.51);
    lpx_tensor_release(c.master);
}

static void test_peak_two_groups(void)
{
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], peak_rank, NULL);
}

static void test_model_precompute(void)
{
    ps_ctx c;
    memset(&c, 0, sizeof c);
    /* group 0: two tensorwise e4m3 (f32) + a dense param; group 1: rowwise
     * + tensorwise e5m2 (bf16 master); group 2: dense only; group 3: a
     * tensorwise weight with an f16 master. Uneven rows throughout. */
    const int64_t s13[2] = {13, 16}, s7[2] = {7, 8}, s21[2] = {21, 16}, s5[2] = {5, 8}, s9[2] = {9, 4};
    const int64_t *shp[PS_G][PS_P] = {{s13, s7, s9}, {s21, s5, NULL}, {s9, NULL, NULL}, {s5, NULL, NULL}};
    const lpx_dtype dt[PS_G][PS_P] = {{LPX_F32, LPX_F32, LPX_F32}, {LPX_F32, LPX_BF16, 0}, {LPX_F32, 0, 0},
                                      {LPX_F16, 0, 0}};
    for (int j = 0; j < PS_G; j++)
        for (int i = 0; i < PS_P; i++) {
            if (!shp[j][i]) continue;
            c.masters[j][i] = rand_normal(2, shp[j][i], 90 + (uint64_t)(j * PS_P + i), 1.0, dt[j][i]);
            /* different magnitudes: each weight gets its own scale */
            float k = (float)(1 << (j + 2 * i));
            lpx_tensor *m = c.masters[j][i], *sc = NULL;
            CHECK_OK(lpx_mul_scalar(m, k, &sc));
            lpx_tensor_release(m);
            c.masters[j][i] = sc;
            c.opts[j][i].struct_size = sizeof c.opts[j][i];
        }
    c.dense[0][2] = c.dense[2][0] = true;
    c.opts[1][0].rowwise = true;
    c.opts[1][1].fp8 = LPX_F8E5M2;
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .role = LPX_FLOAT8_ROLE_WEIGHT};
    for (int i = 0; i < 2; i++) CHECK_OK(lpx_float8_quantize(c.masters[0][i], &o, &c.expect[0][i], NULL));
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], ps_rank, &c);
    for (int j = 0; j < PS_G; j++)
        for (int i = 0; i < PS_P; i++) {
            lpx_tensor_release(c.masters[j][i]);
            lpx_tensor_release(c.expect[j][i]);
        }
}

static void test_rowwise_all_gather(void)
{
    rw_ctx c;
    memset(&c, 0, sizeof c);
    /* rows: 21 (uneven everywhere), 13 (rank 7 of 8 empty), 5 (ranks 5..7
     * of 8 empty), 37 bf16 e5m2, 11 f16 */
    const int64_t shp[RW_N][2] = {{21, 32}, {13, 16}, {5, 8}, {37, 24}, {11, 40}};
    const lpx_dtype dt[RW_N] = {LPX_F32, LPX_F32, LPX_F32, LPX_BF16, LPX_F16};
    for (int i = 0; i < RW_N; i++) {
        lpx_tensor *m = rand_normal(2, shp[i], 300 + (uint64_t)i, 1.0, dt[i]), *sc = NULL;
        CHECK_OK(lpx_mul_scalar(m, (double)(1 << (2 * i)), &sc)); /* a range of magnitudes */
        lpx_tensor_release(m);
        c.masters[i] = sc;
        c.opts[i].struct_size = sizeof c.opts[i];
        c.opts[i].rowwise = true;
    }
    c.opts[3].fp8 = LPX_F8E5M2;
    /* row 2 of param 1 all zeros: its scale comes from the 1e-12 floor */
    {
        lpx_tensor *row = NULL;
        CHECK_OK(lpx_narrow(c.masters[1], 0, 2, 1, &row));
        CHECK_OK(lpx_fill_(row, 0.0));
        lpx_tensor_release(row);
    }
    for (int i = 0; i < RW_N; i++) {
        lpx_float8_quant_opts o = {.struct_size = sizeof o, .fp8 = c.opts[i].fp8, .granularity = LPX_FLOAT8_AXISWISE,
                                   .axis = -1, .role = LPX_FLOAT8_ROLE_WEIGHT};
        CHECK_OK(lpx_float8_quantize(c.masters[i], &o, &c.expect[i], NULL));
    }
    /* Float8Linear references: x [9, 32] @ W^T, W = param 0 [21, 32] */
    const int64_t sx[2] = {9, 32}, sg[2] = {9, 21};
    c.x = rand_normal(2, sx, 400, 1.0, LPX_F32);
    lpx_tensor *g0 = rand_normal(2, sg, 401, 1.0, LPX_F32);
    CHECK_OK(lpx_mul_scalar(g0, 1e-3, &c.gout));
    lpx_tensor_release(g0);
    lpx_float8_linear_recipe rc;
    CHECK_OK(lpx_float8_linear_recipe_preset("rowwise", &rc));
    lpx_float8_linear_ctx *lc = NULL;
    CHECK_OK(lpx_float8_linear_forward(&rc, NULL, c.x, c.expect[0], NULL, &c.ref[0], &lc, NULL));
    CHECK_OK(lpx_float8_linear_backward(lc, c.gout, &c.ref[1], &c.ref[2], &c.ref[3], NULL));
    lpx_float8_linear_ctx_free(lc);
    lc = NULL;
    rc.fprop.mode = rc.dgrad.mode = rc.wgrad.mode = LPX_FLOAT8_GEMM_HIGH_PRECISION;
    CHECK_OK(lpx_float8_linear_forward(&rc, NULL, c.x, c.masters[0], NULL, &c.hp[0], &lc, NULL));
    CHECK_OK(lpx_float8_linear_backward(lc, c.gout, &c.hp[1], &c.hp[2], NULL, NULL));
    lpx_float8_linear_ctx_free(lc);
    for (int keep = 0; keep < 2; keep++) {
        c.keep = keep;
        for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], rw_rank, &c);
    }
    for (int i = 0; i < RW_N; i++) {
        lpx_tensor_release(c.masters[i]);
        lpx_tensor_release(c.expect[i]);
    }
    for (int k = 0; k < 4; k++) lpx_tensor_release(c.ref[k]);
    for (int k = 0; k < 3; k++) lpx_tensor_release(c.hp[k]);
    lpx_tensor_release(c.x);
    lpx_tensor_release(c.gout);
}

int main(void)
{
    RUN(test_mixed_group);
    RUN(test_precompute_counting);
    RUN(test_fp8_bytes);
    RUN(test_peak_two_groups);
    RUN(test_model_precompute);
    RUN(test_rowwise_all_gather);
    return CHECK_DONE();
}
