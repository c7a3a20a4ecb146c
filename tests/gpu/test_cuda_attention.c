/* rope and grouped-query attention on the GPU against the CPU backend on
 * the same inputs (forward and backward; f32 and bf16; GQA and MHA; causal
 * with S = T and S > T; T past one 64-row CPU block; a strided q):
 * relative error bounds f32 1e-5 forward, 1e-4 backward (the GPU sums keys
 * in another order and dk/dv with atomics), bf16 1e-2 / 2e-2 (one rounding
 * of each result; the backward reads the rounded forward output); rope to
 * the bit (the same f32 formula, correctly rounded cos/sin). These bounds
 * are set from the arithmetic, not yet measured on a GPU. */
#include "gpu_util.h"
#include "../llama_ref.h"

static double tol_of(lpx_dtype dt) { return dt == LPX_BF16 ? 1e-2 : dt == LPX_F16 ? 2e-3 : 1e-5; }

static void close_to(const char *what, lpx_tensor *cpu, lpx_tensor *gpu, double tol)
{
    CHECKF(cpu && gpu, "%s: missing result (%s)", what, lpx_last_error());
    if (!cpu || !gpu) return;
    double e = gpu_rel_err(cpu, gpu);
    CHECKF(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
    CHECKF(lpx_tensor_dtype(cpu) == lpx_tensor_dtype(gpu), "%s: dtype %s vs %s", what,
           lpx_dtype_name(lpx_tensor_dtype(cpu)), lpx_dtype_name(lpx_tensor_dtype(gpu)));
}

static void check_attention(const char *what, lpx_dtype dt, int64_t B, int64_t T, int64_t S, int64_t H, int64_t KH,
                            int64_t D, bool causal, bool strided_q)
{
    int64_t qs[4] = {B, T, H, D}, ks[4] = {B, S, KH, D}, bs[4] = {B, H, T, D};
    lpx_tensor *q0 = strided_q ? rand_normal(4, bs, 1, 1.0, dt) : rand_normal(4, qs, 1, 1.0, dt);
    lpx_tensor *q = NULL, *k = rand_normal(4, ks, 2, 1.0, dt), *v = rand_normal(4, ks, 3, 1.0, dt),
               *g = rand_normal(4, qs, 4, 1.0, dt);
    if (strided_q) CHECK_OK(lpx_transpose(q0, 1, 2, &q));
    else {
        q = q0;
        lpx_tensor_retain(q);
    }
    lpx_tensor *gq = gpu_up(q0), *gqv = NULL, *gk = gpu_up(k), *gv = gpu_up(v), *gg = gpu_up(g);
    if (strided_q) CHECK_OK(lpx_transpose(gq, 1, 2, &gqv));
    else {
        gqv = gq;
        lpx_tensor_retain(gqv);
    }
    double scale = 1.0 / sqrt((double)D);
    lpx_tensor *o = NULL, *l = NULL, *go = NULL, *gl = NULL, *d[3] = {NULL, NULL, NULL}, *gd[3] = {NULL, NULL, NULL};
    CHECK_OK(lpx_attention(q, k, v, causal, scale, &o, &l));
    CHECK_OK(lpx_attention(gqv, gk, gv, causal, scale, &go, &gl));
    char b[160];
    snprintf(b, sizeof b, "%s out", what);
    close_to(b, o, go, tol_of(dt));
    snprintf(b, sizeof b, "%s lse", what);
    close_to(b, l, gl, 1e-5);
    /* the backward of each from its own forward */
    CHECK_OK(lpx_attention_backward(g, q, k, v, o, l, causal, scale, &d[0], &d[1], &d[2]));
    CHECK_OK(lpx_attention_backward(gg, gqv, gk, gv, go, gl, causal, scale, &gd[0], &gd[1], &gd[2]));
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        snprintf(b, sizeof b, "%s %s", what, names[i]);
        close_to(b, d[i], gd[i], dt == LPX_F32 ? 1e-4 : dt == LPX_F16 ? 5e-3 : 2e-2);
    }
    lpx_tensor *rel[] = {q0, q, k, v, g, gq, gqv, gk, gv, gg, o, l, go, gl, d[0], d[1], d[2], gd[0], gd[1], gd[2]};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_attention(void)
{
    check_attention("f32 gqa causal", LPX_F32, 2, 9, 9, 4, 2, 16, true, false);
    check_attention("f32 mha S>T causal", LPX_F32, 1, 5, 12, 3, 3, 8, true, false);
    check_attention("f32 non-causal", LPX_F32, 1, 7, 11, 4, 1, 32, false, false);
    check_attention("f32 T=130 hd 128", LPX_F32, 1, 130, 130, 4, 2, 128, true, false);
    check_attention("f32 strided q", LPX_F32, 2, 17, 17, 4, 2, 64, true, true);
    check_attention("bf16 gqa", LPX_BF16, 2, 33, 33, 8, 2, 128, true, false);
}

/* cuDNN's fused SDPA (backends/cuda/cuda_sdpa.cu) takes the bf16/f16
 * calls it fits; on the GPU machine (LPX_TEST_REQUIRE_GPU=1, cuDNN 9 in
 * its library path) it must be the path taken, not a silent fallback.
 * Llama-3-8B's head layout (32 query heads, 8 kv heads, head dim 128),
 * f16, non-causal with S != T, head dim 64, against the CPU on the same
 * inputs with the bf16 bounds above. */
static void test_cudnn_attention(void)
{
    lpx_cuda_attention_path_fn path = NULL;
    void *sym = lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_ATTENTION_PATH);
    memcpy(&path, &sym, sizeof sym);
    CHECKF(path != NULL, "lpx-cuda.so does not export %s", LPX_CUDA_SYM_ATTENTION_PATH);
    if (!path) return;
    char buf[2048];
    int before = path(buf, sizeof buf);
    check_attention("bf16 llama heads", LPX_BF16, 1, 300, 300, 32, 8, 128, true, false);
    check_attention("f16 gqa", LPX_F16, 2, 64, 64, 8, 4, 64, true, false);
    check_attention("bf16 non-causal S>T", LPX_BF16, 2, 40, 72, 4, 2, 64, false, false);
    int after = path(buf, sizeof buf);
    printf("  attention path: %s\n", buf);
    /* each case is a forward and a backward: 6 calls that cuDNN takes */
    const char *req = getenv("LPX_TEST_REQUIRE_GPU"), *force = getenv("LPX_CUDA_ATTENTION");
    if (req && !strcmp(req, "1") && !(force && !strcmp(force, "reference"))) {
        CHECKF(after - before >= 6, "the GPU machine ran %d of these attention calls on cuDNN: %s", after - before,
               buf);
        /* lpx info names the cuDNN file loaded (issue 34 item 6) */
        CHECKF(strstr(buf, "fused SDPA (/") != NULL, "the attention path does not name the cuDNN file: %s", buf);
    }
}

static void test_rope(void)
{
    int64_t xs[4] = {2, 19, 3, 64}, fs[1] = {32};
    lpx_tensor *fr = NULL;
    CHECK_OK(lpx_empty(1, fs, LPX_F32, lpx_cpu(), &fr));
    if (!fr) return;
    for (int i = 0; i < 32; i++) ((float *)lpx_tensor_data(fr))[i] = powf(500000.0f, -(float)(2 * i) / 64.0f);
    lpx_tensor *gfr = gpu_up(fr);
    const lpx_dtype dts[2] = {LPX_F32, LPX_BF16};
    for (int t = 0; t < 2; t++) {
        lpx_tensor *x = rand_normal(4, xs, 9, 1.0, dts[t]), *gx = gpu_up(x), *y = NULL, *gy = NULL, *b = NULL,
                   *gb = NULL;
        CHECK_OK(lpx_rope(x, fr, 5, &y));
        CHECK_OK(lpx_rope(gx, gfr, 5, &gy));
        CHECK_OK(lpx_rope_backward(x, fr, 1000, &b));
        CHECK_OK(lpx_rope_backward(gx, gfr, 1000, &gb));
        /* the same f32 formula and correctly rounded cos/sin: the bits */
        CHECKF(gpu_same_bits("rope", y, gy), "rope %s differs", lpx_dtype_name(dts[t]));
        close_to("rope_backward", b, gb, dts[t] == LPX_F32 ? 1e-6 : 1e-2);
        lpx_tensor *rel[] = {x, gx, y, gy, b, gb};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    }
    lpx_tensor_release(fr);
    lpx_tensor_release(gfr);
}

/* The Llama fixture's forward composed from the ops on the GPU, in f32 and
 * bf16, against transformers' logits, with the bounds test_llama holds the
 * CPU to (one helper, tests/llama_ref.h) */
static void test_llama_fixture(void)
{
    lref_check_compose(getenv("LPX_TEST_LLAMA_FIXTURE"), gpu_dev(), "on the GPU");
}

int main(void)
{
    gpu_setup();
    RUN(test_llama_fixture);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_cudnn_attention);
    return CHECK_DONE();
}
