/* GPU suite: the blockwise fp8 ops on lpx-cuda against the CPU reference
 * (backends/cpu/float8_block.c) on the same inputs: the cast bit for bit
 * (codes, scales, scale_inv; ragged blocks, both formats, pow2, bf16 and
 * strided input), dequantize bit for bit, the block-scaled GEMM to 1e-6
 * (the CPU sums each K block with sgemm, the GPU in order), a block
 * holding NaN refused naming it, and Float8Linear "blockwise" end to end.
 * Skips (77) without a GPU. */
#include "gpu_util.h"

static void cast_case(int64_t R, int64_t C, int64_t br, int64_t bc, lpx_dtype fp8, bool pow2, lpx_dtype dt,
                      bool strided)
{
    int64_t s[2] = {strided ? C : R, strided ? R : C};
    lpx_tensor *base = rand_normal(2, s, (uint64_t)(R * 131 + C * 7 + br + bc), 3.0, dt), *x = NULL;
    if (strided) CHECK_OK(lpx_t(base, &x));
    else {
        x = base;
        lpx_tensor_retain(x);
    }
    lpx_tensor *xg = gpu_up(x);
    lpx_tensor *o[4] = {NULL}, *og[4] = {NULL};
    CHECK_OK(lpx_fp8_quantize_block(x, fp8, br, bc, pow2, true, &o[0], &o[1], &o[2], &o[3]));
    if (xg) CHECK_OK(lpx_fp8_quantize_block(xg, fp8, br, bc, pow2, true, &og[0], &og[1], &og[2], &og[3]));
    static const char *what[3] = {"codes", "scale", "scale_inv"};
    for (int i = 0; i < 3 && o[i] && og[i]; i++)
        CHECKF(gpu_same_bits(what[i], o[i], og[i]), "[%lld, %lld] %lldx%lld %s pow2=%d %s%s: %s", (long long)R,
               (long long)C, (long long)br, (long long)bc, lpx_dtype_name(fp8), pow2, lpx_dtype_name(dt),
               strided ? " strided" : "", what[i]);
    if (o[3] && og[3]) CHECK(gpu_rel_err(o[3], og[3]) < 1e-6);   /* amax, underflow, saturation */
    /* dequantize */
    lpx_tensor *d = NULL, *dg = NULL;
    if (o[0] && og[0]) {
        CHECK_OK(lpx_fp8_dequantize_block(o[0], o[2], br, bc, LPX_BF16, &d));
        CHECK_OK(lpx_fp8_dequantize_block(og[0], og[2], br, bc, LPX_BF16, &dg));
        if (d && dg) CHECK(gpu_same_bits("dequantize", d, dg));
    }
    lpx_tensor *tmp[] = {base, x, xg, o[0], o[1], o[2], o[3], og[0], og[1], og[2], og[3], d, dg};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_cast_and_dequantize(void)
{
    cast_case(130, 200, 1, 128, LPX_F8E4M3FN, true, LPX_F32, false);
    cast_case(130, 200, 128, 128, LPX_F8E4M3FN, false, LPX_BF16, false);
    cast_case(257, 300, 128, 1, LPX_F8E5M2, true, LPX_F16, false);
    cast_case(300, 129, 1, 128, LPX_F8E4M3FN, true, LPX_BF16, true);
    cast_case(5, 7, 2, 3, LPX_F8E4M3FN, false, LPX_F32, false);
}

static void test_nonfinite_block_refused(void)
{
    int64_t s[2] = {4, 256};
    lpx_tensor *x = rand_normal(2, s, 3, 1.0, LPX_F32);
    wr(x, 2 * 256 + 200, NAN);
    lpx_tensor *xg = gpu_up(x), *q = NULL;
    if (xg) {
        CHECK_ERR(lpx_fp8_quantize_block(xg, LPX_F8E4M3FN, 1, 128, true, true, &q, NULL, NULL, NULL), LPX_ENUMERIC);
        CHECK(strstr(lpx_last_error(), "block (2, 1)") != NULL);
    }
    lpx_tensor_release(x);
    lpx_tensor_release(xg);
}

static void test_mm_block(void)
{
    int64_t sa[2] = {70, 300}, sw[2] = {50, 300}, sb[1] = {50};
    lpx_tensor *x = rand_normal(2, sa, 11, 1.0, LPX_F32), *w = rand_normal(2, sw, 12, 0.1, LPX_F32);
    lpx_tensor *bias = rand_normal(1, sb, 13, 1.0, LPX_F32);
    lpx_tensor *qa = NULL, *sia = NULL, *qw = NULL, *siw = NULL, *qwt = NULL, *siwt = NULL, *ref = NULL;
    CHECK_OK(lpx_fp8_quantize_block(x, LPX_F8E4M3FN, 1, 128, true, true, &qa, NULL, &sia, NULL));
    CHECK_OK(lpx_fp8_quantize_block(w, LPX_F8E4M3FN, 128, 128, true, true, &qw, NULL, &siw, NULL));
    CHECK_OK(lpx_t(qw, &qwt));
    CHECK_OK(lpx_t(siw, &siwt));
    CHECK_OK(lpx_fp8_mm_block(qa, sia, 1, 128, qwt, siwt, 128, 128, bias, LPX_F32, &ref));
    lpx_tensor *g[5] = {gpu_up(qa), gpu_up(sia), gpu_up(qwt), gpu_up(siwt), gpu_up(bias)}, *out = NULL;
    if (g[0] && g[1] && g[2] && g[3] && g[4]) {
        CHECK_OK(lpx_fp8_mm_block(g[0], g[1], 1, 128, g[2], g[3], 128, 128, g[4], LPX_F32, &out));
        if (out && ref) CHECKF(gpu_rel_err(ref, out) < 1e-6, "rel err %.3g", gpu_rel_err(ref, out));
    }
    lpx_tensor *tmp[] = {x, w, bias, qa, sia, qw, siw, qwt, siwt, ref, out, g[0], g[1], g[2], g[3], g[4]};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

/* The Float8Linear GEMMs as cuBLASLt's block scaling takes them (no bias;
 * rows multiples of 4): fprop a 1x128 @ W^T 128x128, dgrad a 1x128 @ W
 * 128x128 (b not K-major: packed), wgrad a 1x128 @ b 128x1; against the
 * CPU (bf16: 1e-2, f32: 1e-5 relative). On the GPU machine
 * (LPX_TEST_REQUIRE_GPU=1) cuBLASLt must have taken them: lpx-cuda's
 * self-check of its scale layouts passed. */
static void mm_case(const char *what, lpx_tensor *qa, lpx_tensor *sia, int64_t abr, lpx_tensor *qb, lpx_tensor *sib,
                    int64_t bbc, lpx_dtype odt)
{
    lpx_tensor *ref = NULL, *out = NULL, *g[4] = {gpu_up(qa), gpu_up(sia), gpu_up(qb), gpu_up(sib)};
    CHECK_OK(lpx_fp8_mm_block(qa, sia, abr, 128, qb, sib, 128, bbc, NULL, odt, &ref));
    if (g[0] && g[1] && g[2] && g[3]) CHECK_OK(lpx_fp8_mm_block(g[0], g[1], abr, 128, g[2], g[3], 128, bbc, NULL, odt, &out));
    double tol = odt == LPX_F32 ? 1e-5 : 1e-2;
    if (ref && out) CHECKF(gpu_rel_err(ref, out) < tol, "%s %s: rel err %.3g", what, lpx_dtype_name(odt),
                           gpu_rel_err(ref, out));
    lpx_tensor *rel[] = {ref, out, g[0], g[1], g[2], g[3]};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_mm_block_cublas(void)
{
    int64_t sx[2] = {256, 512}, sw[2] = {384, 512}, sg[2] = {256, 384};
    lpx_tensor *x = rand_normal(2, sx, 31, 1.0, LPX_F32), *w = rand_normal(2, sw, 32, 0.1, LPX_F32),
               *gy = rand_normal(2, sg, 33, 1.0, LPX_F32);
    lpx_tensor *qx = NULL, *sx_ = NULL, *qw = NULL, *sw_ = NULL, *qwt = NULL, *swt = NULL, *qg = NULL, *sg_ = NULL,
               *gt = NULL, *qgt = NULL, *sgt = NULL, *xt = NULL, *qxc = NULL, *sxc = NULL, *qxct = NULL, *sxct = NULL;
    CHECK_OK(lpx_fp8_quantize_block(x, LPX_F8E4M3FN, 1, 128, true, true, &qx, NULL, &sx_, NULL));
    CHECK_OK(lpx_fp8_quantize_block(w, LPX_F8E4M3FN, 128, 128, true, true, &qw, NULL, &sw_, NULL));
    CHECK_OK(lpx_fp8_quantize_block(gy, LPX_F8E4M3FN, 1, 128, true, true, &qg, NULL, &sg_, NULL));
    CHECK_OK(lpx_t(qw, &qwt));
    CHECK_OK(lpx_t(sw_, &swt));
    /* wgrad: dy^T [384, 256] in 1x128 blocks along the tokens, x [256, 512] in 128x1 blocks */
    CHECK_OK(lpx_t(gy, &gt));
    CHECK_OK(lpx_fp8_quantize_block(gt, LPX_F8E4M3FN, 1, 128, true, true, &qgt, NULL, &sgt, NULL));
    CHECK_OK(lpx_t(x, &xt));
    CHECK_OK(lpx_fp8_quantize_block(xt, LPX_F8E4M3FN, 1, 128, true, true, &qxc, NULL, &sxc, NULL));
    CHECK_OK(lpx_t(qxc, &qxct));
    CHECK_OK(lpx_t(sxc, &sxct));
    const lpx_dtype outs[2] = {LPX_BF16, LPX_F32};
    for (int o = 0; o < 2; o++) {
        mm_case("fprop", qx, sx_, 1, qwt, swt, 128, outs[o]);
        mm_case("dgrad", qg, sg_, 1, qw, sw_, 128, outs[o]);
        mm_case("wgrad", qgt, sgt, 1, qxct, sxct, 1, outs[o]);
    }
    lpx_cuda_block_gemm_path_fn path = NULL;
    void *sym = lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_BLOCK_GEMM_PATH);
    memcpy(&path, &sym, sizeof sym);
    CHECKF(path != NULL, "lpx-cuda.so does not export %s", LPX_CUDA_SYM_BLOCK_GEMM_PATH);
    if (path) {
        char buf[320];
        int used = path(buf, sizeof buf);
        printf("  blockwise GEMM path: %s (%d combinations on cuBLASLt)\n", buf, used);
        const char *req = getenv("LPX_TEST_REQUIRE_GPU"), *force = getenv("LPX_CUDA_BLOCK_GEMM");
        if (req && !strcmp(req, "1") && !(force && !strcmp(force, "reference")))
            CHECKF(used > 0, "the GPU machine runs the blockwise GEMM on the reference kernel: %s", buf);
    }
    lpx_tensor *rel[] = {x, w, gy, qx, sx_, qw, sw_, qwt, swt, qg, sg_, gt, qgt, sgt, xt, qxc, sxc, qxct, sxct};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_linear_blockwise(void)
{
    int64_t sx[2] = {64, 256}, sw[2] = {192, 256}, sg[2] = {64, 192};
    lpx_tensor *x = rand_normal(2, sx, 21, 1.0, LPX_BF16), *w = rand_normal(2, sw, 22, 0.05, LPX_BF16);
    lpx_tensor *g = rand_normal(2, sg, 23, 1.0, LPX_BF16);
    lpx_float8_linear_recipe r;
    CHECK_OK(lpx_float8_linear_recipe_preset("blockwise", &r));
    lpx_tensor *res[2][3] = {{NULL}};
    lpx_tensor *in[2][3] = {{x, w, g}, {gpu_up(x), gpu_up(w), gpu_up(g)}};
    for (int d = 0; d < 2; d++) {
        if (!in[d][0] || !in[d][1] || !in[d][2]) continue;
        lpx_float8_linear_ctx *ctx = NULL;
        CHECK_OK(lpx_float8_linear_forward(&r, NULL, in[d][0], in[d][1], NULL, &res[d][0], &ctx, NULL));
        if (ctx) CHECK_OK(lpx_float8_linear_backward(ctx, in[d][2], &res[d][1], &res[d][2], NULL, NULL));
        lpx_float8_linear_ctx_free(ctx);
    }
    for (int k = 0; k < 3; k++)
        if (res[0][k] && res[1][k]) CHECKF(gpu_rel_err(res[0][k], res[1][k]) < 1e-2, "output %d: %.3g", k,
                                            gpu_rel_err(res[0][k], res[1][k]));
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            lpx_tensor_release(res[d][k]);
            if (d) lpx_tensor_release(in[d][k]);
        }
    lpx_tensor_release(x);
    lpx_tensor_release(w);
    lpx_tensor_release(g);
}

int main(void)
{
    gpu_setup();
    RUN(test_cast_and_dequantize);
    RUN(test_nonfinite_block_refused);
    RUN(test_mm_block);
    RUN(test_mm_block_cublas);
    RUN(test_linear_blockwise);
    return CHECK_DONE();
}
