/* GPU suite: cuda_gemm_nn. The cuBLASLt GEMMs (matmul, linear, addmm in
 * f32/f16/bf16 with transposed, batched, broadcast and odd-shaped operands;
 * fp8_scaled_mm tensorwise and rowwise, with bias, bf16 and f32 out, odd
 * shapes that need padding; Float8Linear forward + backward of every
 * recipe, with the weight dense or already fp8; nf4_mm), the nn ops (rmsnorm, softmax,
 * cross-entropy, MSE, embedding and their backward passes) and the fused
 * AdamW step, each against the CPU backend on the same inputs: relative
 * error for the GEMMs and reductions (bf16 < 1e-2, f32 < 1e-5), the
 * bits where the arithmetic is fixed (adamw_, embedding, mse backward). */
#include "gpu_util.h"

/* ---- helpers ------------------------------------------------------------ */

static double tol_of(lpx_dtype dt) { return dt == LPX_BF16 ? 1e-2 : dt == LPX_F16 ? 5e-3 : 1e-5; }

/* f32-output fp8 GEMMs vs the CPU's exact f32 sums: Hopper's fp8 tensor
 * cores add partial products with fewer than f32's 24 significant bits
 * before cuBLASLt promotes them (measured on an H100, 2026-11-22: relative
 * error 1.2e-4 to 1.3e-4 at k = 128, against ~1e-7 for the f32 path). */
#define FP8_MMA_TOL 5e-4
/* The same with fast accumulation (no promotion of partial sums to f32;
 * about 14 significant bits kept, DeepSeek-V3 report): a looser bound. */
#define FP8_FAST_TOL 5e-3

/* Checks rel_err(cpu, gpu) <= tol, printing what and the error. */
static void close_to(const char *what, lpx_tensor *cpu, lpx_tensor *gpu, double tol)
{
    CHECKF(cpu && gpu, "%s: missing result (%s)", what, lpx_last_error());
    if (!cpu || !gpu) return;
    CHECKF(lpx_tensor_ndim(cpu) == lpx_tensor_ndim(gpu) && lpx_tensor_dtype(cpu) == lpx_tensor_dtype(gpu),
           "%s: shape rank or dtype differs", what);
    for (int i = 0; i < lpx_tensor_ndim(cpu) && i < lpx_tensor_ndim(gpu); i++)
        CHECKF(lpx_tensor_shape(cpu)[i] == lpx_tensor_shape(gpu)[i], "%s: dim %d differs", what, i);
    CHECKF(lpx_tensor_device(gpu).type == LPX_DEVICE_CUDA, "%s: result not on the GPU", what);
    double e = gpu_rel_err(cpu, gpu);
    CHECKF(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

/* CPU tensor stored as `shape` with its last two dims swapped, returned as
 * the transposed view of logical `shape` (base in *base). */
static lpx_tensor *rand_t(lpx_dtype dt, int nd, const int64_t *shape, uint64_t seed, lpx_tensor **base)
{
    int64_t st[LPX_MAX_DIMS];
    memcpy(st, shape, (size_t)nd * sizeof *st);
    st[nd - 1] = shape[nd - 2];
    st[nd - 2] = shape[nd - 1];
    *base = rand_normal(nd, st, seed, 1.0, dt);
    lpx_tensor *v = NULL;
    if (lpx_transpose(*base, nd - 2, nd - 1, &v)) return NULL;
    return v;
}

/* The same logical tensor on the GPU: a transposed view of the uploaded
 * base when the CPU one is (so the GPU kernel sees the transpose too). */
static lpx_tensor *up_like(lpx_tensor *cpu_view, lpx_tensor *cpu_base)
{
    if (!cpu_base) return gpu_up(cpu_view);
    lpx_tensor *g = gpu_up(cpu_base), *v = NULL;
    int nd = lpx_tensor_ndim(cpu_base);
    if (g && lpx_transpose(g, nd - 2, nd - 1, &v)) v = NULL;
    lpx_tensor_release(g);
    return v;
}

static lpx_tensor *mk_idx(lpx_dtype dt, int nd, const int64_t *shape, const int64_t *vals)
{
    lpx_tensor *t = NULL;
    if (lpx_tensor_new(dt, nd, shape, lpx_cpu(), &t)) return NULL;
    for (int64_t i = 0; i < lpx_tensor_numel(t); i++) {
        if (dt == LPX_I32) ((int32_t *)lpx_tensor_data(t))[i] = (int32_t)vals[i];
        else ((int64_t *)lpx_tensor_data(t))[i] = vals[i];
    }
    return t;
}

/* ---- matmul / linear / addmm -------------------------------------------- */

/* a [..., M, K] @ b [K, N] (or batched), ta/tb: the operand is a transposed
 * view of its storage. */
static void mm_case(const char *what, lpx_dtype adt, lpx_dtype bdt, int and_, const int64_t *ash, bool ta, int bnd,
                    const int64_t *bsh, bool tb, double tol)
{
    lpx_tensor *abase = NULL, *bbase = NULL;
    lpx_tensor *a = ta ? rand_t(adt, and_, ash, 101, &abase) : rand_normal(and_, ash, 101, 1.0, adt);
    lpx_tensor *b = tb ? rand_t(bdt, bnd, bsh, 202, &bbase) : rand_normal(bnd, bsh, 202, 1.0, bdt);
    lpx_tensor *ga = up_like(a, abase), *gb = up_like(b, bbase), *ref = NULL, *got = NULL;
    CHECK_OK(lpx_matmul(a, b, &ref));
    CHECK_OK(lpx_matmul(ga, gb, &got));
    close_to(what, ref, got, tol);
    lpx_tensor *all[] = {a, b, abase, bbase, ga, gb, ref, got};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void test_matmul(void)
{
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16, LPX_F16};
    const int64_t a2[] = {64, 96}, b2[] = {96, 80}, ao[] = {17, 33}, bo[] = {33, 65};
    const int64_t a3[] = {3, 17, 33}, b3[] = {3, 33, 65}, a4[] = {2, 3, 5, 33};
    for (int i = 0; i < 3; i++) {
        lpx_dtype d = dts[i];
        double t = tol_of(d);
        char w[96];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                snprintf(w, sizeof w, "%s 64x96x80 ta=%d tb=%d", lpx_dtype_name(d), ta, tb);
                mm_case(w, d, d, 2, a2, ta, 2, b2, tb, t);
                snprintf(w, sizeof w, "%s 17x33x65 ta=%d tb=%d", lpx_dtype_name(d), ta, tb);
                mm_case(w, d, d, 2, ao, ta, 2, bo, tb, t);
            }
        snprintf(w, sizeof w, "%s batched", lpx_dtype_name(d));
        mm_case(w, d, d, 3, a3, false, 3, b3, false, t);
        snprintf(w, sizeof w, "%s batched, transposed b", lpx_dtype_name(d));
        mm_case(w, d, d, 3, a3, true, 3, b3, true, t);
        snprintf(w, sizeof w, "%s shared a", lpx_dtype_name(d));
        mm_case(w, d, d, 2, ao, false, 3, b3, false, t);
        snprintf(w, sizeof w, "%s shared b (rows collapse)", lpx_dtype_name(d));
        mm_case(w, d, d, 3, a3, false, 2, bo, true, t);
        snprintf(w, sizeof w, "%s 4-D a", lpx_dtype_name(d));
        mm_case(w, d, d, 4, a4, false, 2, bo, false, t);
    }
    /* mixed dtypes compute in f32 and round once to a's dtype */
    mm_case("bf16 @ f32", LPX_BF16, LPX_F32, 2, ao, false, 2, bo, true, 1e-2);
    mm_case("f32 @ bf16", LPX_F32, LPX_BF16, 2, ao, true, 2, bo, false, 1e-5);
    /* K = 0: zeros */
    const int64_t ak0[] = {5, 0}, bk0[] = {0, 7};
    mm_case("K = 0", LPX_F32, LPX_F32, 2, ak0, false, 2, bk0, false, 0.0);
}

static void test_matmul_out(void)
{
    const int64_t as[] = {17, 33}, bs[] = {33, 65}, os[] = {65, 17};
    lpx_tensor *a = rand_normal(2, as, 7, 1.0, LPX_BF16), *b = rand_normal(2, bs, 8, 1.0, LPX_BF16);
    lpx_tensor *ga = gpu_up(a), *gb = gpu_up(b), *ref = NULL, *obase = NULL, *out = NULL;
    CHECK_OK(lpx_matmul(a, b, &ref));
    /* a transposed (non-contiguous) out view */
    CHECK_OK(lpx_empty(2, os, LPX_BF16, gpu_dev(), &obase));
    CHECK_OK(lpx_transpose(obase, 0, 1, &out));
    CHECK_OK(lpx_matmul_out(ga, gb, out));
    close_to("matmul_out into a transposed view", ref, out, 1e-2);
    /* a contiguous out, written directly */
    lpx_tensor *o2 = NULL;
    const int64_t s2[] = {17, 65};
    CHECK_OK(lpx_empty(2, s2, LPX_BF16, gpu_dev(), &o2));
    CHECK_OK(lpx_matmul_out(ga, gb, o2));
    close_to("matmul_out contiguous", ref, o2, 1e-2);
    /* dtype mismatch refused */
    lpx_tensor *o3 = NULL;
    CHECK_OK(lpx_empty(2, s2, LPX_F32, gpu_dev(), &o3));
    CHECK_ERR(lpx_matmul_out(ga, gb, o3), LPX_EDTYPE);
    lpx_tensor *all[] = {a, b, ga, gb, ref, obase, out, o2, o3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void linear_case(const char *what, lpx_dtype dt, int xnd, const int64_t *xs, int64_t nout, bool with_bias)
{
    int64_t in = xs[xnd - 1], ws[2] = {nout, in};
    lpx_tensor *x = rand_normal(xnd, xs, 31, 1.0, dt), *w = rand_normal(2, ws, 32, 0.2, dt);
    lpx_tensor *bias = with_bias ? rand_normal(1, &nout, 33, 1.0, dt) : NULL;
    lpx_tensor *gx = gpu_up(x), *gw = gpu_up(w), *gbias = bias ? gpu_up(bias) : NULL, *ref = NULL, *got = NULL;
    CHECK_OK(lpx_linear(x, w, bias, &ref));
    CHECK_OK(lpx_linear(gx, gw, gbias, &got));
    close_to(what, ref, got, tol_of(dt));
    lpx_tensor *all[] = {x, w, bias, gx, gw, gbias, ref, got};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void test_linear(void)
{
    const int64_t x3[] = {3, 7, 96}, xo[] = {17, 33}, x0[] = {4, 0};
    linear_case("bf16 linear + bias", LPX_BF16, 3, x3, 80, true);
    linear_case("bf16 linear", LPX_BF16, 3, x3, 80, false);
    linear_case("f32 linear + bias", LPX_F32, 3, x3, 80, true);
    linear_case("f16 linear odd + bias", LPX_F16, 2, xo, 65, true);
    linear_case("f32 linear odd", LPX_F32, 2, xo, 65, false);
    linear_case("f32 linear K = 0 + bias", LPX_F32, 2, x0, 9, true);
    linear_case("bf16 linear K = 0", LPX_BF16, 2, x0, 9, false);
}

static void addmm_case(const char *what, lpx_dtype dt, int cnd, const int64_t *cs, int64_t M, int64_t K, int64_t N,
                       double beta, double alpha)
{
    int64_t as[2] = {M, K}, bs[2] = {K, N};
    lpx_tensor *ct = rand_normal(cnd, cs, 41, 1.0, dt), *a = rand_normal(2, as, 42, 1.0, dt),
               *b = rand_normal(2, bs, 43, 1.0, dt);
    lpx_tensor *gc = gpu_up(ct), *ga = gpu_up(a), *gb = gpu_up(b), *ref = NULL, *got = NULL;
    CHECK_OK(lpx_addmm(ct, a, b, beta, alpha, &ref));
    CHECK_OK(lpx_addmm(gc, ga, gb, beta, alpha, &got));
    close_to(what, ref, got, tol_of(dt));
    lpx_tensor *all[] = {ct, a, b, gc, ga, gb, ref, got};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void test_addmm(void)
{
    const int64_t full[] = {17, 65}, row[] = {65}, row2[] = {1, 65}, col[] = {17, 1}, one[] = {1};
    addmm_case("addmm full c", LPX_F32, 2, full, 17, 33, 65, 0.5, 2.0);
    addmm_case("addmm full c bf16", LPX_BF16, 2, full, 17, 33, 65, 1.0, 1.0);
    addmm_case("addmm row c, beta 1 (bias path)", LPX_F32, 1, row, 17, 33, 65, 1.0, 0.5);
    addmm_case("addmm [1, N] c, beta 1", LPX_BF16, 2, row2, 17, 33, 65, 1.0, 1.0);
    addmm_case("addmm row c, beta 0.25", LPX_F32, 1, row, 17, 33, 65, 0.25, 1.0);
    addmm_case("addmm column c", LPX_F32, 2, col, 17, 33, 65, 1.5, -1.0);
    addmm_case("addmm scalar c", LPX_F32, 0, NULL, 17, 33, 65, 2.0, 1.0);
    addmm_case("addmm [1] c", LPX_F16, 1, one, 17, 33, 65, 1.0, 1.0);
    addmm_case("addmm beta 0", LPX_F32, 2, full, 17, 33, 65, 0.0, 3.0);
    addmm_case("addmm K = 0", LPX_F32, 2, full, 17, 0, 65, 0.5, 1.0);
}

/* ---- fp8_scaled_mm ------------------------------------------------------- */

/* a [M, K] e4m3 (or afp8), b [K, N] of bfp8: the transposed view of a
 * quantized [N, K] weight (btv) or a row-major [K, N]; scales rowwise
 * ([M, 1] and [1, N]) or tensorwise; optional bias of bias_dt. */
static void fp8_case_flags(const char *what, int64_t M, int64_t K, int64_t N, lpx_dtype afp8, lpx_dtype bfp8,
                           bool rowwise, bool btv, lpx_dtype odt, int bias_dt, double tol, unsigned flags)
{
    int64_t xs[2] = {M, K}, ws[2] = {N, K}, bs[2] = {K, N}, d1 = 1, d0 = 0;
    lpx_tensor *x = rand_normal(2, xs, 51, 1.0, LPX_F32), *w = rand_normal(2, btv ? ws : bs, 52, 0.5, LPX_F32);
    lpx_tensor *qa = NULL, *sa = NULL, *qw = NULL, *sw = NULL, *qb = NULL, *sb = NULL, *bias = NULL;
    CHECK_OK(lpx_fp8_quantize(x, NULL, afp8, rowwise ? &d1 : NULL, false, 0, true, &qa, NULL, &sa, NULL));
    CHECK_OK(lpx_fp8_quantize(w, NULL, bfp8, rowwise ? (btv ? &d1 : &d0) : NULL, false, 0, true, &qw, NULL, &sw,
                              NULL));
    if (btv) {
        CHECK_OK(lpx_t(qw, &qb));
        if (rowwise) CHECK_OK(lpx_t(sw, &sb));
        else {
            sb = sw;
            lpx_tensor_retain(sb);
        }
    } else {
        qb = qw;
        sb = sw;
        lpx_tensor_retain(qb);
        lpx_tensor_retain(sb);
    }
    if (bias_dt >= 0) bias = rand_normal(1, &N, 53, 1.0, (lpx_dtype)bias_dt);
    lpx_tensor *ref = NULL, *got = NULL;
    CHECK_OK(lpx_fp8_scaled_mm(qa, sa, qb, sb, bias, odt, &ref));
    /* the same tensors on the GPU, views made there */
    lpx_tensor *gqa = gpu_up(qa), *gsa = gpu_up(sa), *gqw = gpu_up(qw), *gsw = gpu_up(sw), *gbias = bias ? gpu_up(bias) : NULL;
    lpx_tensor *gqb = NULL, *gsb = NULL;
    if (btv) {
        CHECK_OK(lpx_t(gqw, &gqb));
        if (rowwise) CHECK_OK(lpx_t(gsw, &gsb));
        else {
            gsb = gsw;
            lpx_tensor_retain(gsb);
        }
    } else {
        gqb = gqw;
        gsb = gsw;
        lpx_tensor_retain(gqb);
        lpx_tensor_retain(gsb);
    }
    CHECK_OK(lpx_fp8_scaled_mm_ex(gqa, gsa, gqb, gsb, gbias, odt, flags, &got));
    close_to(what, ref, got, tol);
    lpx_tensor *all[] = {x, w, qa, sa, qw, sw, qb, sb, bias, ref, got, gqa, gsa, gqw, gsw, gbias, gqb, gsb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void fp8_case(const char *what, int64_t M, int64_t K, int64_t N, lpx_dtype afp8, lpx_dtype bfp8, bool rowwise,
                     bool btv, lpx_dtype odt, int bias_dt, double tol)
{
    fp8_case_flags(what, M, K, N, afp8, bfp8, rowwise, btv, odt, bias_dt, tol, 0);
}

static void test_fp8_scaled_mm(void)
{
    const lpx_dtype E4 = LPX_F8E4M3FN, E5 = LPX_F8E5M2;
    /* aligned, TN as is (no packing) */
    fp8_case("tensorwise bf16", 64, 128, 96, E4, E4, false, true, LPX_BF16, -1, 1e-2);
    fp8_case("tensorwise f32", 64, 128, 96, E4, E4, false, true, LPX_F32, -1, FP8_MMA_TOL);
    fp8_case("tensorwise bf16 + bf16 bias", 64, 128, 96, E4, E4, false, true, LPX_BF16, LPX_BF16, 1e-2);
    fp8_case("tensorwise f32 + f32 bias", 64, 128, 96, E4, E4, false, true, LPX_F32, LPX_F32, FP8_MMA_TOL);
    fp8_case("tensorwise bf16 + f32 bias", 64, 128, 96, E4, E4, false, true, LPX_BF16, LPX_F32, 1e-2);
    fp8_case("rowwise bf16", 64, 128, 96, E4, E4, true, true, LPX_BF16, -1, 1e-2);
    fp8_case("rowwise f32", 64, 128, 96, E4, E4, true, true, LPX_F32, -1, FP8_MMA_TOL);
    fp8_case("rowwise bf16 + bias", 64, 128, 96, E4, E4, true, true, LPX_BF16, LPX_BF16, 1e-2);
    fp8_case("rowwise f32 + bias", 64, 128, 96, E4, E4, true, true, LPX_F32, LPX_F32, FP8_MMA_TOL);
    fp8_case("e4m3 x e5m2", 64, 128, 96, E4, E5, false, true, LPX_BF16, -1, 1e-2);
    fp8_case("e5m2 x e4m3", 64, 128, 96, E5, E4, false, true, LPX_BF16, -1, 1e-2);
    fp8_case("e4m3 x e5m2 rowwise", 64, 128, 96, E4, E5, true, true, LPX_BF16, LPX_BF16, 1e-2);
    fp8_case("f16 out", 64, 128, 96, E4, E4, false, true, LPX_F16, LPX_F16, 5e-3);
    /* b row-major: packed to K-major */
    fp8_case("row-major b", 64, 128, 96, E4, E4, false, false, LPX_BF16, -1, 1e-2);
    fp8_case("row-major b rowwise", 64, 128, 96, E4, E4, true, false, LPX_F32, LPX_F32, FP8_MMA_TOL);
    /* odd shapes: K and N padded to 16 */
    fp8_case("17x33x65 tensorwise", 17, 33, 65, E4, E4, false, true, LPX_BF16, LPX_BF16, 1e-2);
    fp8_case("17x33x65 rowwise f32", 17, 33, 65, E4, E4, true, true, LPX_F32, LPX_F32, FP8_MMA_TOL);
    fp8_case("17x33x65 rowwise bf16", 17, 33, 65, E4, E5, true, false, LPX_BF16, LPX_BF16, 1e-2);
    fp8_case("1x16x1", 1, 16, 1, E4, E4, false, true, LPX_F32, -1, FP8_MMA_TOL);
    fp8_case("5x7x3", 5, 7, 3, E4, E4, true, true, LPX_BF16, LPX_F32, 1e-2);
    /* fast accumulation (the CPU reference sums exactly) */
    fp8_case_flags("fast accum tensorwise f32", 256, 512, 192, E4, E4, false, true, LPX_F32, -1, FP8_FAST_TOL,
                   LPX_FP8_MM_FAST_ACCUM);
    fp8_case_flags("fast accum rowwise bf16 + bias", 64, 128, 96, E4, E5, true, true, LPX_BF16, LPX_BF16, 1e-2,
                   LPX_FP8_MM_FAST_ACCUM);
    /* e5m2 x e5m2 is refused like on the CPU */
    const int64_t s[2] = {16, 16};
    lpx_tensor *q = NULL, *one = NULL, *out = NULL;
    CHECK_OK(lpx_zeros(2, s, E5, gpu_dev(), &q));
    CHECK_OK(lpx_full(0, NULL, 1.0, LPX_F32, gpu_dev(), &one));
    CHECK_ERR(lpx_fp8_scaled_mm(q, one, q, one, NULL, LPX_BF16, &out), LPX_EDTYPE);
    lpx_tensor_release(q);
    lpx_tensor_release(one);
}

/* ---- Float8Linear ---------------------------------------------------------- */

/* Float8Linear forward + backward of one recipe on the CPU and on the GPU
 * from the same inputs: the GPU casts each operand once into both
 * orientations (fp8_quantize_t) and feeds the GEMMs in place, the CPU
 * runs the composition; the codes are the same bits, so out, grad_x and
 * grad_W differ only by the GEMMs' accumulation. w_fp8: W given as a
 * tensorwise float8 weight (as the fp8 all-gather delivers it). */
static void f8lin_case(const char *preset, int64_t M, int64_t K, int64_t N, lpx_dtype dt, bool w_fp8, bool fast,
                       double tol)
{
    int64_t xs[2] = {M, K}, ws[2] = {N, K}, gs[2] = {M, N};
    lpx_tensor *x = rand_normal(2, xs, 71, 1.0, dt), *w = rand_normal(2, ws, 72, 0.05, dt);
    lpx_tensor *g = rand_normal(2, gs, 73, 1e-3, dt);
    lpx_tensor *in[2][3] = {{x, w, g}, {gpu_up(x), gpu_up(w), gpu_up(g)}};
    lpx_tensor *res[2][3] = {{NULL, NULL, NULL}, {NULL, NULL, NULL}}, *wq[2] = {NULL, NULL};
    lpx_float8_linear_recipe r;
    CHECK_OK(lpx_float8_linear_recipe_preset(preset, &r));
    if (!fast) r.fast_accum = 0;
    for (int d = 0; d < 2; d++) {
        lpx_float8_linear_state st;
        CHECK_OK(lpx_float8_linear_state_init(&st, &r));
        lpx_tensor *wuse = in[d][1];
        if (w_fp8) {
            lpx_float8_quant_opts o;
            memset(&o, 0, sizeof o);
            o.struct_size = sizeof o;
            o.fp8 = LPX_F8E4M3FN;
            o.role = LPX_FLOAT8_ROLE_WEIGHT;
            CHECK_OK(lpx_float8_quantize(in[d][1], &o, &wq[d], NULL));
            wuse = wq[d];
        }
        lpx_float8_linear_ctx *ctx = NULL;
        lpx_float8_linear_report rep;
        lpx_status s = lpx_float8_linear_forward(&r, &st, in[d][0], wuse, NULL, &res[d][0], &ctx, &rep);
        if (s) printf("  %s %s forward: %s\n", preset, d ? "cuda" : "cpu", lpx_last_error());
        CHECK(s == LPX_OK);
        lpx_float8_gemm_report fprop = rep.fprop;
        if (!s) {
            s = lpx_float8_linear_backward(ctx, in[d][2], &res[d][1], &res[d][2], NULL, &rep);
            if (s) printf("  %s %s backward: %s\n", preset, d ? "cuda" : "cpu", lpx_last_error());
            CHECK(s == LPX_OK);
        }
        /* on the GPU every recipe casts W once into both orientations
         * (rowwise: per row and per column from one read), and x and g
         * likewise where wgrad is fp8 */
        if (!s && d == 1 && !w_fp8) {
            CHECKF(fprop.b.quantized && rep.dgrad.b.reused && !rep.dgrad.b.quantized, "%s: W cast twice", preset);
            if (r.wgrad.mode == LPX_FLOAT8_GEMM_FP8)
                CHECKF(rep.wgrad.a.reused && rep.wgrad.b.reused, "%s: x or g cast twice", preset);
        }
        lpx_float8_linear_ctx_free(ctx);
        lpx_float8_linear_state_destroy(&st);
    }
    static const char *names[3] = {"out", "grad_x", "grad_W"};
    for (int i = 0; i < 3; i++) {
        char what[160];
        snprintf(what, sizeof what, "Float8Linear %s %lldx%lldx%lld %s%s%s %s", preset, (long long)M, (long long)K,
                 (long long)N, lpx_dtype_name(dt), w_fp8 ? " fp8 W" : "", fast ? " fast fprop" : "", names[i]);
        if (res[0][i] && res[1][i] && lpx_tensor_kind(res[1][i]) == NULL) close_to(what, res[0][i], res[1][i], tol);
        else CHECKF(false, "%s: missing or not dense", what);
    }
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < 3; i++) lpx_tensor_release(res[d][i]);
        lpx_tensor_release(wq[d]);
    }
    for (int i = 0; i < 3; i++) {
        lpx_tensor_release(in[0][i]);
        lpx_tensor_release(in[1][i]);
    }
}

static void test_float8_linear(void)
{
    static const char *presets[] = {"tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed"};
    for (int p = 0; p < 4; p++) {
        /* fused casts (rows % 16, cols % 8) with partial tiles; f32 sums
         * with promotion (the CPU's up to FP8_MMA_TOL) */
        f8lin_case(presets[p], 144, 200, 96, LPX_F32, false, false, FP8_MMA_TOL);
        /* the presets as they are: the forward GEMM accumulates fast */
        f8lin_case(presets[p], 256, 128, 320, LPX_BF16, false, true, 1e-2);
        f8lin_case(presets[p], 144, 200, 96, LPX_F32, false, true, FP8_FAST_TOL);
        /* the composition (odd shapes) */
        f8lin_case(presets[p], 24, 40, 56, LPX_F32, false, false, FP8_MMA_TOL);
    }
    /* the weight already fp8: transposed once on the device for dgrad */
    f8lin_case("tensorwise", 144, 200, 96, LPX_F32, true, false, FP8_MMA_TOL);
    f8lin_case("tensorwise", 256, 128, 320, LPX_BF16, true, true, 1e-2);
}

/* ---- nf4_mm --------------------------------------------------------------- */

static void nf4_case(const char *what, int64_t rows, int64_t cols, bool tw, lpx_dtype xdt, bool with_bias)
{
    int64_t wsh[2] = {rows, cols}, K = tw ? cols : rows, N = tw ? rows : cols, xs[3] = {3, 5, K};
    lpx_tensor *w = rand_normal(2, wsh, 61, 1.0, LPX_F32), *x = rand_normal(3, xs, 62, 1.0, xdt);
    lpx_tensor *bias = with_bias ? rand_normal(1, &N, 63, 1.0, xdt) : NULL;
    lpx_value qa[3] = {lpx_v_tensor(w), lpx_v_i64(64), lpx_v_i64(256)};
    lpx_call q;
    lpx_call_init(&q, LPX_OP_nf4_quantize, qa, 3);
    CHECK_OK(lpx_dispatch(&q));
    if (q.nrets != 4) {
        lpx_tensor_release(w);
        lpx_tensor_release(x);
        lpx_tensor_release(bias);
        return;
    }
    lpx_tensor *p[4], *gp[4];
    for (int i = 0; i < 4; i++) {
        p[i] = q.rets[i].u.t;
        gp[i] = gpu_up(p[i]);
    }
    lpx_tensor *gx = gpu_up(x), *gbias = bias ? gpu_up(bias) : NULL, *ref = NULL, *got = NULL;
    for (int dev = 0; dev < 2; dev++) {
        lpx_tensor **pp = dev ? gp : p;
        lpx_value a[11] = {lpx_v_tensor(dev ? gx : x), lpx_v_tensor(pp[0]), lpx_v_tensor(pp[1]),
                           lpx_v_tensor(pp[2]), lpx_v_tensor(pp[3]), lpx_v_i64(64), lpx_v_i64(256),
                           lpx_v_i64(rows), lpx_v_i64(cols), lpx_v_bool(tw),
                           lpx_v_opt_tensor(dev ? gbias : bias)};
        lpx_call mm;
        lpx_call_init(&mm, LPX_OP_nf4_mm, a, 11);
        CHECK_OK(lpx_dispatch(&mm));
        if (mm.nrets == 1) *(dev ? &got : &ref) = mm.rets[0].u.t;
    }
    close_to(what, ref, got, xdt == LPX_F32 ? 1e-5 : 1e-2);
    for (int i = 0; i < 4; i++) {
        lpx_tensor_release(p[i]);
        lpx_tensor_release(gp[i]);
    }
    lpx_tensor *all[] = {w, x, bias, gx, gbias, ref, got};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void test_nf4_mm(void)
{
    nf4_case("nf4 x @ W^T bf16 + bias", 96, 160, true, LPX_BF16, true);
    nf4_case("nf4 x @ W bf16", 96, 160, false, LPX_BF16, false);
    nf4_case("nf4 x @ W^T f32", 96, 160, true, LPX_F32, false);
    nf4_case("nf4 x @ W f32 + bias", 96, 160, false, LPX_F32, true);
    nf4_case("nf4 odd x @ W^T", 33, 65, true, LPX_BF16, true);
}

/* ---- nn ops ---------------------------------------------------------------- */

/* rmsnorm on x [R, D] ([R / 7, 7, D] when 7 divides R; strided: the
 * transpose of a [D, R] tensor) with an optional weight of dtype wdt.
 * Contiguous f32/f16/bf16 rows whose D is a multiple of the 16-byte vector
 * take lpx-cuda's vector path (up to 4 vectors per thread: D <= 4096 f32,
 * 8192 half), the rest the generic kernels; R past the vector path's grid
 * (2 or 4 blocks per SM) makes blocks loop over rows. */
static void rms_case(const char *what, lpx_dtype dt, lpx_dtype wdt, bool with_w, bool strided, int64_t R, int64_t D)
{
    const int64_t s3[] = {R / 7, 7, D}, s2[] = {R, D}, t2[] = {D, R};
    bool three = !strided && R % 7 == 0;
    lpx_tensor *xbase = NULL, *x;
    if (strided) {
        xbase = rand_normal(2, t2, 71, 2.0, dt);
        x = NULL;
        CHECK_OK(lpx_t(xbase, &x));
    } else {
        x = rand_normal(three ? 3 : 2, three ? s3 : s2, 71, 2.0, dt);
    }
    lpx_tensor *w = with_w ? rand_normal(1, &D, 72, 1.0, wdt) : NULL;
    lpx_tensor *gx = strided ? up_like(x, xbase) : gpu_up(x), *gw = w ? gpu_up(w) : NULL;
    lpx_tensor *y = NULL, *rs = NULL, *gy = NULL, *grs = NULL;
    CHECK_OK(lpx_rmsnorm(x, w, 1e-5, &y, &rs));
    CHECK_OK(lpx_rmsnorm(gx, gw, 1e-5, &gy, &grs));
    char b[160];
    snprintf(b, sizeof b, "%s y", what);
    close_to(b, y, gy, tol_of(dt));
    snprintf(b, sizeof b, "%s rstd", what);
    close_to(b, rs, grs, 1e-5);
    /* backward on the forward's rstd */
    lpx_tensor *g = rand_normal(lpx_tensor_ndim(x), lpx_tensor_shape(x), 73, 1.0, dt), *gg = gpu_up(g);
    lpx_tensor *dx = NULL, *dw = NULL, *gdx = NULL, *gdw = NULL;
    lpx_value a[4] = {lpx_v_tensor(g), lpx_v_tensor(x), lpx_v_opt_tensor(w), lpx_v_tensor(rs)};
    lpx_value ga[4] = {lpx_v_tensor(gg), lpx_v_tensor(gx), lpx_v_opt_tensor(gw), lpx_v_tensor(grs)};
    lpx_call c1, c2;
    lpx_call_init(&c1, LPX_OP_rmsnorm_backward, a, 4);
    lpx_call_init(&c2, LPX_OP_rmsnorm_backward, ga, 4);
    CHECK_OK(lpx_dispatch(&c1));
    CHECK_OK(lpx_dispatch(&c2));
    if (c1.nrets == 2 && c2.nrets == 2) {
        dx = c1.rets[0].u.t;
        dw = c1.rets[1].u.t;
        gdx = c2.rets[0].u.t;
        gdw = c2.rets[1].u.t;
        snprintf(b, sizeof b, "%s grad_x", what);
        close_to(b, dx, gdx, dt == LPX_F32 ? 1e-5 : 1e-2);
        snprintf(b, sizeof b, "%s grad_w", what);
        close_to(b, dw, gdw, lpx_tensor_dtype(dw) == LPX_F32 ? 1e-5 : 1e-2);
    }
    lpx_tensor *all[] = {xbase, x, w, gx, gw, y, rs, gy, grs, g, gg, dx, dw, gdx, gdw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void test_rmsnorm(void)
{
    rms_case("rmsnorm f32", LPX_F32, LPX_F32, true, false, 28, 300);       /* vector path, 1 per thread */
    rms_case("rmsnorm bf16", LPX_BF16, LPX_BF16, true, false, 28, 300);    /* 300 % 8: generic */
    rms_case("rmsnorm f32 no weight", LPX_F32, LPX_F32, false, false, 28, 300);
    rms_case("rmsnorm bf16 strided x", LPX_BF16, LPX_BF16, true, true, 28, 300);
    /* the vector path at Llama widths: 2 and 4 vectors per thread, rows
     * past the grid, a weight of another dtype, f16 */
    rms_case("rmsnorm bf16 [600, 4096]", LPX_BF16, LPX_BF16, true, false, 600, 4096);
    rms_case("rmsnorm bf16 [601, 8192] f32 weight", LPX_BF16, LPX_F32, true, false, 601, 8192);
    rms_case("rmsnorm f32 [70, 4096] no weight", LPX_F32, LPX_F32, false, false, 70, 4096);
    rms_case("rmsnorm f16 [35, 2056]", LPX_F16, LPX_F16, true, false, 35, 2056);
    rms_case("rmsnorm bf16 [9, 16384]: past the vector path", LPX_BF16, LPX_BF16, true, false, 9, 16384);
}

static void softmax_case(const char *what, lpx_dtype dt, int nd, const int64_t *shape, int64_t dim, bool strided)
{
    lpx_tensor *base = NULL, *x = strided ? rand_t(dt, nd, shape, 81, &base) : rand_normal(nd, shape, 81, 3.0, dt);
    lpx_tensor *gx = up_like(x, base), *y = NULL, *gy = NULL;
    CHECK_OK(lpx_softmax(x, dim, &y));
    CHECK_OK(lpx_softmax(gx, dim, &gy));
    char b[128];
    snprintf(b, sizeof b, "%s forward", what);
    close_to(b, y, gy, tol_of(dt));
    lpx_tensor *g = rand_normal(nd, shape, 82, 1.0, dt), *gg = gpu_up(g), *dx = NULL, *gdx = NULL;
    CHECK_OK(lpx_softmax_backward(g, y, dim, &dx));
    CHECK_OK(lpx_softmax_backward(gg, gy, dim, &gdx));
    snprintf(b, sizeof b, "%s backward", what);
    close_to(b, dx, gdx, dt == LPX_F32 ? 1e-5 : 2e-2);
    lpx_tensor *all[] = {base, x, gx, y, gy, g, gg, dx, gdx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void test_softmax(void)
{
    const int64_t s2[] = {6, 1000}, s3[] = {5, 7, 9};
    softmax_case("softmax f32 last dim", LPX_F32, 2, s2, -1, false);
    softmax_case("softmax bf16 last dim", LPX_BF16, 2, s2, 1, false);
    softmax_case("softmax f32 dim 0 (strided lines)", LPX_F32, 2, s2, 0, false);
    softmax_case("softmax f32 middle dim of a transposed view", LPX_F32, 3, s3, 1, true);
}

static void test_cross_entropy(void)
{
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16};
    const int64_t ls[] = {64, 1000}, ts[] = {64};
    int64_t tv[64];
    for (int i = 0; i < 64; i++) tv[i] = i % 9 == 4 ? -100 : (i * 37) % 1000;
    for (int k = 0; k < 2; k++) {
        lpx_dtype dt = dts[k];
        lpx_tensor *lg = rand_normal(2, ls, 91, 3.0, dt), *t = mk_idx(k ? LPX_I32 : LPX_I64, 1, ts, tv);
        lpx_tensor *glg = gpu_up(lg), *gt = gpu_up(t), *loss = NULL, *gloss = NULL, *dl = NULL, *gdl = NULL;
        CHECK_OK(lpx_cross_entropy(lg, t, -100, &loss));
        CHECK_OK(lpx_cross_entropy(glg, gt, -100, &gloss));
        close_to(k ? "cross_entropy bf16" : "cross_entropy f32", loss, gloss, tol_of(dt));
        CHECK_OK(lpx_cross_entropy_backward(lg, t, -100, 0.5, &dl));
        CHECK_OK(lpx_cross_entropy_backward(glg, gt, -100, 0.5, &gdl));
        close_to(k ? "cross_entropy_backward bf16" : "cross_entropy_backward f32", dl, gdl, tol_of(dt));
        lpx_tensor *all[] = {lg, t, glg, gt, loss, gloss, dl, gdl};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
    }
    /* all ignored: 0; an out-of-range target: LPX_ERANGE naming it */
    int64_t ig[3] = {-1, -1, -1}, bad[3] = {0, 1000, 2};
    const int64_t s3[] = {3}, l3[] = {3, 1000};
    lpx_tensor *lg = rand_normal(2, l3, 92, 1.0, LPX_F32), *glg = gpu_up(lg);
    lpx_tensor *ti = mk_idx(LPX_I64, 1, s3, ig), *tb = mk_idx(LPX_I64, 1, s3, bad);
    lpx_tensor *gti = gpu_up(ti), *gtb = gpu_up(tb), *loss = NULL;
    CHECK_OK(lpx_cross_entropy(glg, gti, -1, &loss));
    double v = -1;
    lpx_tensor *lc = loss ? gpu_down(loss) : NULL;
    if (lc) CHECK_OK(lpx_item(lc, 0, &v));
    CHECK(v == 0.0);
    lpx_tensor_release(lc);
    lpx_tensor_release(loss);
    loss = NULL;
    CHECK_ERR(lpx_cross_entropy(glg, gtb, -1, &loss), LPX_ERANGE);
    CHECK(strstr(lpx_last_error(), "target[1] = 1000") != NULL);
    CHECK_ERR(lpx_cross_entropy_backward(glg, gtb, -1, 1.0, &loss), LPX_ERANGE);
    lpx_tensor *all[] = {lg, glg, ti, tb, gti, gtb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

static void test_mse(void)
{
    const int64_t s[] = {33, 65};
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16};
    for (int k = 0; k < 2; k++) {
        lpx_dtype dt = dts[k];
        lpx_tensor *a = rand_normal(2, s, 101, 1.0, dt), *bbase = NULL, *b = rand_t(dt, 2, s, 102, &bbase);
        lpx_tensor *ga = gpu_up(a), *gb = up_like(b, bbase), *l = NULL, *gl = NULL, *d = NULL, *gd = NULL;
        CHECK_OK(lpx_mse_loss(a, b, &l));
        CHECK_OK(lpx_mse_loss(ga, gb, &gl));
        close_to(k ? "mse bf16" : "mse f32", l, gl, tol_of(dt));
        CHECK_OK(lpx_mse_loss_backward(a, b, 0.75, &d));
        CHECK_OK(lpx_mse_loss_backward(ga, gb, 0.75, &gd));
        /* the per-element formula is the CPU's double expression: same bits */
        CHECK(d && gd && gpu_same_bits("mse_loss_backward", d, gd));
        lpx_tensor *all[] = {a, bbase, b, ga, gb, l, gl, d, gd};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
    }
}

static void test_embedding(void)
{
    const int64_t ws[] = {50, 33}, is[] = {4, 9};
    int64_t iv[36];
    for (int i = 0; i < 36; i++) iv[i] = (i * 7) % 50 % (i % 5 == 0 ? 3 : 50); /* repeats */
    for (int k = 0; k < 2; k++) {
        lpx_dtype it = k ? LPX_I64 : LPX_I32, dt = k ? LPX_BF16 : LPX_F32;
        lpx_tensor *w = rand_normal(2, ws, 111, 1.0, dt), *idx = mk_idx(it, 2, is, iv);
        lpx_tensor *gw = gpu_up(w), *gi = gpu_up(idx), *o = NULL, *go = NULL;
        CHECK_OK(lpx_embedding(w, idx, &o));
        CHECK_OK(lpx_embedding(gw, gi, &go));
        CHECK(o && go && gpu_same_bits("embedding", o, go));
        const int64_t gs[] = {4, 9, 33};
        lpx_tensor *g = rand_normal(3, gs, 112, 1.0, dt), *gg = gpu_up(g), *d = NULL, *gd = NULL;
        CHECK_OK(lpx_embedding_backward(g, idx, 50, &d));
        CHECK_OK(lpx_embedding_backward(gg, gi, 50, &gd));
        close_to(k ? "embedding_backward bf16" : "embedding_backward f32", d, gd, k ? 1e-2 : 1e-6);
        lpx_tensor *all[] = {w, idx, gw, gi, o, go, g, gg, d, gd};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
    }
    /* an out-of-range index */
    int64_t bad[4] = {0, 3, 50, 1};
    const int64_t bs[] = {2, 2};
    lpx_tensor *w = rand_normal(2, ws, 113, 1.0, LPX_F32), *idx = mk_idx(LPX_I64, 2, bs, bad);
    lpx_tensor *gw = gpu_up(w), *gi = gpu_up(idx), *o = NULL;
    CHECK_ERR(lpx_embedding(gw, gi, &o), LPX_ERANGE);
    CHECK(strstr(lpx_last_error(), "indices[1, 0] = 50") != NULL);
    const int64_t gs[] = {2, 2, 33};
    lpx_tensor *g = NULL;
    CHECK_OK(lpx_zeros(3, gs, LPX_F32, gpu_dev(), &g));
    CHECK_ERR(lpx_embedding_backward(g, gi, 50, &o), LPX_ERANGE);
    lpx_tensor *all[] = {w, idx, gw, gi, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

/* ---- adamw_ ---------------------------------------------------------------- */

/* n tensors: params (pdt[i % npdt]), grads, m, v on the CPU and the same on
 * the GPU; `steps` steps with fresh grads; every byte must agree. */
static void adamw_case(const char *what, int n, const int64_t *sizes, const lpx_dtype *pdt, const lpx_dtype *gdt,
                       int steps)
{
    lpx_tensor **t = calloc((size_t)n * 8, sizeof *t);
    lpx_tensor **P = t, **G = t + n, **Mo = t + 2 * n, **V = t + 3 * n;
    lpx_tensor **gP = t + 4 * n, **gG = t + 5 * n, **gM = t + 6 * n, **gV = t + 7 * n;
    for (int i = 0; i < n; i++) {
        int64_t s = sizes[i];
        P[i] = rand_normal(1, &s, 1000 + (uint64_t)i, 1.0, pdt[i]);
        Mo[i] = rand_normal(1, &s, 2000 + (uint64_t)i, 0.01, LPX_F32);
        lpx_tensor *r = rand_normal(1, &s, 3000 + (uint64_t)i, 0.01, LPX_F32);
        V[i] = NULL;
        CHECK_OK(lpx_mul(r, r, &V[i])); /* v >= 0 */
        lpx_tensor_release(r);
        gP[i] = gpu_up(P[i]);
        gM[i] = gpu_up(Mo[i]);
        gV[i] = gpu_up(V[i]);
    }
    for (int step = 1; step <= steps; step++) {
        for (int i = 0; i < n; i++) {
            int64_t s = sizes[i];
            lpx_tensor_release(G[i]);
            lpx_tensor_release(gG[i]);
            G[i] = rand_normal(1, &s, 4000 + (uint64_t)(i * 16 + step), step == 2 ? 100.0 : 1.0, gdt[i]);
            gG[i] = gpu_up(G[i]);
        }
        CHECK_OK(lpx_adamw_(P, G, Mo, V, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, step));
        CHECK_OK(lpx_adamw_(gP, gG, gM, gV, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, step));
    }
    int bad = 0;
    for (int i = 0; i < n && bad < 3; i++) {
        char b[96];
        snprintf(b, sizeof b, "%s param %d", what, i);
        bad += !gpu_same_bits(b, P[i], gP[i]);
        snprintf(b, sizeof b, "%s exp_avg %d", what, i);
        bad += !gpu_same_bits(b, Mo[i], gM[i]);
        snprintf(b, sizeof b, "%s exp_avg_sq %d", what, i);
        bad += !gpu_same_bits(b, V[i], gV[i]);
    }
    CHECKF(bad == 0, "%s: %d tensors differ from the CPU", what, bad);
    for (int i = 0; i < n * 8; i++) lpx_tensor_release(t[i]);
    free(t);
}

static void test_adamw(void)
{
    const int64_t sizes[5] = {1, 3, 1029, 16391, 70001};
    const lpx_dtype pdt[5] = {LPX_F32, LPX_BF16, LPX_F32, LPX_BF16, LPX_F32};
    const lpx_dtype gdt[5] = {LPX_F32, LPX_BF16, LPX_BF16, LPX_F32, LPX_F32};
    adamw_case("5 tensors", 5, sizes, pdt, gdt, 3);
    /* more tensors than the kernel-parameter table holds: the device table */
    enum { NBIG = 700 };
    int64_t bs[NBIG];
    lpx_dtype bp[NBIG], bg[NBIG];
    for (int i = 0; i < NBIG; i++) {
        bs[i] = 1 + (i * 37) % 61;
        bp[i] = i % 3 ? LPX_F32 : LPX_BF16;
        bg[i] = i % 2 ? LPX_F32 : LPX_BF16;
    }
    adamw_case("700 tensors", NBIG, bs, bp, bg, 2);
    /* a CPU tensor in the list is refused */
    int64_t s = 4;
    lpx_tensor *cp = rand_normal(1, &s, 5, 1.0, LPX_F32), *gpv = gpu_up(cp);
    lpx_tensor *ps[2] = {gpv, cp};
    CHECK_ERR(lpx_adamw_(ps, ps, ps, ps, 2, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1), LPX_EDEVICE);
    lpx_tensor_release(cp);
    lpx_tensor_release(gpv);
}

int main(void)
{
    gpu_setup();
    RUN(test_matmul);
    RUN(test_matmul_out);
    RUN(test_linear);
    RUN(test_addmm);
    RUN(test_fp8_scaled_mm);
    RUN(test_float8_linear);
    RUN(test_nf4_mm);
    RUN(test_rmsnorm);
    RUN(test_softmax);
    RUN(test_cross_entropy);
    RUN(test_mse);
    RUN(test_embedding);
    RUN(test_adamw);
    return CHECK_DONE();
}
