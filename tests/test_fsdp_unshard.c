/* The fsdp tests, unshard over world sizes 1..8 for mixed kinds and dtypes
 * in one group (cast-then-gather == gather-then-cast bit for bit), counting
 * (all-gathers, amax all-reduces with and without precompute, fp8/bf16
 * bytes, peak unsharded groups), the model-wide scale precompute and rowwise
 * fp8 all-gather. */
#include "fsdp_util.h"

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
