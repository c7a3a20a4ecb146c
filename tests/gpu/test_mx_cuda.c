/* lpx-mx-cuda.so: the MX ops of lpx-mx.so on the GPU, bit-exact against
 * the CPU kernels. Loads lpx-cuda.so (gpu_setup), lpx-mx.so
 * ($LPX_TEST_MX) and lpx-mx-cuda.so ($LPX_TEST_MX_CUDA); exits 77 when any
 * of them declines (no GPU) or is not built.
 *
 *   dequantize   random data (odd sizes, 1-3 dims, special blocks: NaN,
 *                inf, zeros, huge and subnormal values) quantized on the
 *                CPU to mxfp8 and mxfp4, inner tensors moved to the GPU and
 *                rewrapped there (the kind's unflatten); mx_dequantize and
 *                lpx_kind_to_dense on the GPU give the CPU's bits, f32, on
 *                the GPU; also dim-0 slices (views at an offset)
 *   all codes    every (scale code, element code) pair of both formats
 *   quantize     mx_quantize of a GPU tensor (f32 and bf16) gives the
 *                CPU's element and scale bytes, on the GPU
 *   through ops  linear with an MX weight on the GPU, and the MX fallback
 *                (add), against the CPU
 *   errors       payload split across devices (unflatten, and a tensor
 *                built around the check), dense input, bad format */
#include "gpu_util.h"

static const lpx_kind *kfp8, *kfp4;
static lpx_dtype e8m0, f4e2m1;
static lpx_op op_dq, op_q;

static void load_or_skip(const char *var)
{
    const char *path = getenv(var);
    if (!path || !*path) {
        printf("SKIP: %s is not set (not built)\n", var);
        exit(GPU_SKIP);
    }
    if (lpx_plugin_load(path, NULL)) {
        /* called after gpu_setup found a GPU: a decline here is a failure */
        printf("FAIL: loading %s failed: %s\n", path, lpx_last_error());
        exit(1);
    }
}

/* mx_dequantize(x) or mx_quantize(x, format) through the dispatcher */
static lpx_status call_dq(lpx_tensor *x, lpx_tensor **out)
{
    *out = NULL;
    lpx_value a = lpx_v_tensor(x);
    lpx_call c;
    lpx_call_init(&c, op_dq, &a, 1);
    lpx_status st = lpx_dispatch(&c);
    if (!st) *out = c.rets[0].u.t;
    return st;
}

static lpx_status call_q(lpx_tensor *x, const char *format, lpx_tensor **out)
{
    *out = NULL;
    lpx_value a[2] = {lpx_v_tensor(x), lpx_v_str(format)};
    lpx_call c;
    lpx_call_init(&c, op_q, a, 2);
    lpx_status st = lpx_dispatch(&c);
    if (!st) *out = c.rets[0].u.t;
    return st;
}

static bool on_gpu(const lpx_tensor *t) { return t && lpx_tensor_device(t).type == LPX_DEVICE_CUDA; }

/* The MX tensor q (CPU) with its inner tensors moved to the GPU, rebuilt
 * through the kind's unflatten. */
static lpx_tensor *mx_up(lpx_tensor *q)
{
    lpx_tensor *inner[2] = {gpu_up(lpx_tensor_inner(q, 0)), gpu_up(lpx_tensor_inner(q, 1))}, *g = NULL;
    size_t ms = 0;
    const void *meta = lpx_tensor_meta(q, &ms);
    const lpx_kind *k = lpx_tensor_kind(q);
    if (inner[0] && inner[1])
        CHECK_OK(lpx_kind_vtable(k)->unflatten(k, lpx_tensor_dtype(q), lpx_tensor_ndim(q), lpx_tensor_shape(q), inner,
                                               2, meta, ms, &g));
    lpx_tensor_release(inner[0]);
    lpx_tensor_release(inner[1]);
    CHECK(on_gpu(g));
    return g;
}

/* same bytes in a (CPU) and b (GPU), any dtype (4-bit ones included) */
static bool same_bytes(const char *what, lpx_tensor *a, lpx_tensor *b)
{
    lpx_tensor *bc = gpu_down(b);
    bool ok = bc && lpx_tensor_dtype(a) == lpx_tensor_dtype(bc) && lpx_tensor_numel(a) == lpx_tensor_numel(bc) &&
              lpx_tensor_is_contiguous(a);
    if (ok) {
        size_t n = lpx_dtype_nbytes(lpx_tensor_dtype(a), lpx_tensor_numel(a));
        const unsigned char *p = lpx_tensor_data(a), *q = lpx_tensor_data(bc);
        for (size_t i = 0; i < n && ok; i++)
            if (p[i] != q[i]) {
                printf("  %s: byte %zu differs: cpu 0x%02x, cuda 0x%02x\n", what, i, p[i], q[i]);
                ok = false;
            }
    } else {
        printf("  %s: dtype, size or layout differs\n", what);
    }
    lpx_tensor_release(bc);
    return ok;
}

/* A random CPU f32 tensor with special blocks: NaN, inf, an all-zero
 * block, huge and subnormal values. */
static lpx_tensor *test_data(int nd, const int64_t *shape, uint64_t seed)
{
    lpx_tensor *x = rand_normal(nd, shape, seed, 3.0, LPX_F32);
    if (!x) return NULL;
    float *v = lpx_tensor_data(x);
    int64_t n = lpx_tensor_numel(x);
    static const float sp[] = {NAN, INFINITY, -INFINITY, 3e38f, -1e-40f, 1e-45f, 448.0f * 512.0f, 0.0f};
    for (int i = 0; i < 8; i++) {
        int64_t at = (int64_t)((seed * 2654435761u + (uint64_t)i * 40503u) % 100000u) * 37;
        if (n > 100 && at % n != 0) v[at % n] = sp[i];
    }
    if (n >= 200)   /* one block of zeros and one of tiny values */
        for (int i = 0; i < 64; i++) v[100 + i] = i < 32 ? 0.0f : (float)(i - 40) * 1e-39f;
    return x;
}

static const int64_t shapes[][3] = {
    {1}, {5}, {31}, {32}, {33}, {97}, {3, 7}, {4, 64}, {17, 96}, {2, 3, 100}, {5, 33}, {64, 1000}, {0, 40},
    {3, 0}, {9, 260},
};
static const int shape_nd[] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 2, 2, 2, 2, 2};

static void check_dequantize(const char *what, lpx_tensor *qc, lpx_tensor *qg)
{
    lpx_tensor *ref = NULL, *d1 = NULL, *d2 = NULL;
    CHECK_OK(lpx_kind_to_dense(qc, &ref));
    CHECK_OK(call_dq(qg, &d1));
    CHECK_OK(lpx_kind_to_dense(qg, &d2));
    if (ref && d1 && d2) {
        CHECKF(on_gpu(d1) && on_gpu(d2), "%s: the result is not on the GPU", what);
        CHECK(lpx_tensor_dtype(d1) == LPX_F32 && lpx_tensor_ndim(d1) == lpx_tensor_ndim(ref));
        for (int i = 0; i < lpx_tensor_ndim(ref) && i < lpx_tensor_ndim(d1); i++)
            CHECK(lpx_tensor_shape(d1)[i] == lpx_tensor_shape(ref)[i]);
        CHECKF(gpu_same_bits(what, ref, d1), "%s: mx_dequantize", what);
        CHECKF(gpu_same_bits(what, ref, d2), "%s: lpx_kind_to_dense", what);
    }
    lpx_tensor_release(ref);
    lpx_tensor_release(d1);
    lpx_tensor_release(d2);
}

static void test_dequantize(void)
{
    const lpx_kind *kinds[2] = {kfp8, kfp4};
    for (int f = 0; f < 2; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int nd = shape_nd[s];
            char what[96];
            snprintf(what, sizeof what, "%s shape #%zu", lpx_kind_name(kinds[f]), s);
            lpx_tensor *x = test_data(nd, shapes[s], 100 + s), *qc = NULL, *qg = NULL;
            CHECK_OK(lpx_kind_from_dense(kinds[f], x, &qc));
            if (qc) qg = mx_up(qc);
            if (qc && qg) {
                check_dequantize(what, qc, qg);
                /* dim-0 slices: views at an offset into the payload */
                int64_t d0 = shapes[s][0];
                int64_t start = nd == 1 ? (d0 > 32 ? 32 : 0) : (d0 > 1 ? 1 : 0), len = d0 - start;
                lpx_tensor *sc = NULL, *sg = NULL;
                CHECK_OK(lpx_narrow(qc, 0, start, len, &sc));
                CHECK_OK(lpx_narrow(qg, 0, start, len, &sg));
                CHECK(on_gpu(sg));
                if (sc && sg) check_dequantize(what, sc, sg);
                lpx_tensor_release(sc);
                lpx_tensor_release(sg);
            }
            lpx_tensor_release(x);
            lpx_tensor_release(qc);
            lpx_tensor_release(qg);
        }
}

/* Every (scale, element) pair: row r has scale code r in every block and
 * the element codes 0..255 (mxfp8) or 0..15 twice (mxfp4) along it. */
static void test_all_codes(void)
{
    for (int f = 0; f < 2; f++) {
        int fp4 = f == 1;
        int64_t k = fp4 ? 32 : 256, shape[2] = {256, k}, es[2] = {256, k}, ss[2] = {256, k / 32};
        lpx_tensor *el = NULL, *sc = NULL, *qc = NULL, *qg = NULL;
        CHECK_OK(lpx_tensor_new(fp4 ? f4e2m1 : LPX_F8E4M3FN, 2, es, lpx_cpu(), &el));
        CHECK_OK(lpx_tensor_new(e8m0, 2, ss, lpx_cpu(), &sc));
        if (!el || !sc) return;
        uint8_t *e = lpx_tensor_data(el), *s = lpx_tensor_data(sc);
        for (int r = 0; r < 256; r++) {
            for (int64_t b = 0; b < k / 32; b++) s[r * (k / 32) + b] = (uint8_t)r;
            if (fp4)
                for (int i = 0; i < 16; i++) e[r * 16 + i] = (uint8_t)((2 * i) % 16 | ((2 * i + 1) % 16) << 4);
            else
                for (int i = 0; i < 256; i++) e[r * 256 + i] = (uint8_t)i;
        }
        struct { uint32_t magic, format, block, reserved; } m = {0x4d58u, fp4 ? 4u : 8u, 32u, 0u};
        const lpx_kind *kd = fp4 ? kfp4 : kfp8;
        lpx_tensor *inner[2] = {el, sc};
        CHECK_OK(lpx_kind_vtable(kd)->unflatten(kd, LPX_F32, 2, shape, inner, 2, &m, sizeof m, &qc));
        if (qc && (qg = mx_up(qc))) check_dequantize(fp4 ? "mxfp4 all codes" : "mxfp8 all codes", qc, qg);
        lpx_tensor_release(el);
        lpx_tensor_release(sc);
        lpx_tensor_release(qc);
        lpx_tensor_release(qg);
    }
}

static void test_quantize(void)
{
    const char *fmts[2] = {"mxfp8", "mxfp4"};
    for (int f = 0; f < 2; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int bf = 0; bf < 2; bf++) {
                lpx_tensor *x = test_data(shape_nd[s], shapes[s], 300 + s), *xc = NULL, *xg = NULL;
                lpx_tensor *qc = NULL, *qg = NULL;
                if (bf) CHECK_OK(lpx_cast(x, LPX_BF16, false, &xc));
                else { xc = x; lpx_tensor_retain(x); }
                if (xc) xg = gpu_up(xc);
                CHECK_OK(call_q(xc, fmts[f], &qc));
                CHECK_OK(call_q(xg, fmts[f], &qg));
                if (qc && qg) {
                    char what[96];
                    snprintf(what, sizeof what, "%s%s shape #%zu", fmts[f], bf ? " (bf16)" : "", s);
                    CHECK(on_gpu(qg) && lpx_tensor_kind(qg) == lpx_tensor_kind(qc));
                    CHECK(lpx_tensor_dtype(qg) == lpx_tensor_dtype(qc) && lpx_tensor_ndim(qg) == lpx_tensor_ndim(qc));
                    CHECK(on_gpu(lpx_tensor_inner(qg, 0)) && on_gpu(lpx_tensor_inner(qg, 1)));
                    CHECKF(same_bytes(what, lpx_tensor_inner(qc, 0), lpx_tensor_inner(qg, 0)), "%s: elements", what);
                    CHECKF(same_bytes(what, lpx_tensor_inner(qc, 1), lpx_tensor_inner(qg, 1)), "%s: scales", what);
                    size_t m1 = 0, m2 = 0;
                    const void *a = lpx_tensor_meta(qc, &m1), *b = lpx_tensor_meta(qg, &m2);
                    CHECK(m1 == m2 && a && b && !memcmp(a, b, m1));
                    check_dequantize(what, qc, qg);
                }
                lpx_tensor_release(x);
                lpx_tensor_release(xc);
                lpx_tensor_release(xg);
                lpx_tensor_release(qc);
                lpx_tensor_release(qg);
            }
}

/* linear with an MX weight whose payload is on the GPU (the dense path
 * after a GPU dequantize), and an op through the MX fallback */
static void test_through_ops(void)
{
    const lpx_kind *kinds[2] = {kfp8, kfp4};
    for (int f = 0; f < 2; f++) {
        int64_t ws[2] = {48, 200}, xs[2] = {7, 200};
        lpx_tensor *w = rand_normal(2, ws, 7 + f, 1.0, LPX_F32), *x = rand_normal(2, xs, 9 + f, 1.0, LPX_F32);
        lpx_tensor *qc = NULL, *qg = NULL, *xg = NULL, *yc = NULL, *yg = NULL, *ac = NULL, *ag = NULL;
        CHECK_OK(lpx_kind_from_dense(kinds[f], w, &qc));
        if (qc) qg = mx_up(qc);
        xg = gpu_up(x);
        CHECK_OK(lpx_linear(x, qc, NULL, &yc));
        CHECK_OK(lpx_linear(xg, qg, NULL, &yg));
        if (yc && yg) {
            CHECK(on_gpu(yg));
            double e = gpu_rel_err(yc, yg);
            CHECKF(e < 1e-5, "%s linear: relative error %g", lpx_kind_name(kinds[f]), e);
        }
        lpx_tensor *wg = gpu_up(w);
        CHECK_OK(lpx_add(qc, w, &ac));
        CHECK_OK(lpx_add(qg, wg, &ag));
        if (ac && ag) CHECKF(gpu_same_bits("add", ac, ag), "%s add (fallback)", lpx_kind_name(kinds[f]));
        lpx_tensor *all[] = {w, x, qc, qg, xg, yc, yg, ac, ag, wg};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
    }
}

static void test_errors(void)
{
    int64_t shape[2] = {4, 40};
    lpx_tensor *x = rand_normal(2, shape, 1, 1.0, LPX_F32), *qc = NULL, *xg = NULL, *out = NULL;
    CHECK_OK(lpx_kind_from_dense(kfp8, x, &qc));
    if (!qc) { lpx_tensor_release(x); return; }
    /* elements on the GPU, scales on the CPU */
    lpx_tensor *eg = gpu_up(lpx_tensor_inner(qc, 0)), *inner[2] = {eg, lpx_tensor_inner(qc, 1)};
    size_t ms = 0;
    const void *meta = lpx_tensor_meta(qc, &ms);
    CHECK_ERR(lpx_kind_vtable(kfp8)->unflatten(kfp8, LPX_F32, 2, shape, inner, 2, meta, ms, &out), LPX_EDEVICE);
    CHECK(!out && strstr(lpx_last_error(), "scales"));
    /* built around the check: the kernel refuses it, naming op and argument */
    CHECK_OK(lpx_tensor_new_kind(kfp8, LPX_F32, 2, shape, gpu_dev(), inner, 2, meta, ms, &out));
    lpx_tensor *d = NULL;
    CHECK_ERR(call_dq(out, &d), LPX_EDEVICE);
    CHECKF(strstr(lpx_last_error(), "mx_dequantize") && strstr(lpx_last_error(), "scales (inner[1])"), "got: %s",
           lpx_last_error());
    lpx_tensor_release(out);
    out = NULL;
    /* dense input, bad format, an MX tensor given to quantize */
    xg = gpu_up(x);
    CHECK_ERR(call_dq(xg, &d), LPX_EINVAL);
    CHECKF(strstr(lpx_last_error(), "mx_dequantize") && strstr(lpx_last_error(), "not an MX tensor"), "got: %s",
           lpx_last_error());
    CHECK_ERR(call_q(xg, "mxfp5", &d), LPX_EINVAL);
    CHECKF(strstr(lpx_last_error(), "mx_quantize") && strstr(lpx_last_error(), "mxfp5"), "got: %s", lpx_last_error());
    CHECK(!d);
    lpx_tensor_release(eg);
    lpx_tensor_release(xg);
    lpx_tensor_release(qc);
    lpx_tensor_release(x);
}

int main(void)
{
    unsetenv("LPX_PLUGIN_PATH");   /* the plugins are loaded by path, in order */
    if (gpu_setup()) { /* without a GPU every case reports skipped */
        load_or_skip("LPX_TEST_MX");
        load_or_skip("LPX_TEST_MX_CUDA");
        e8m0 = lpx_dtype_from_name("e8m0");
        f4e2m1 = lpx_dtype_from_name("f4e2m1");
        if (lpx_kind_find("mxfp8", &kfp8) || lpx_kind_find("mxfp4", &kfp4) || lpx_op_find("mx_dequantize", &op_dq) ||
            lpx_op_find("mx_quantize", &op_q)) {
            printf("lpx-mx.so registered no MX kinds or ops: %s\n", lpx_last_error());
            return 1;
        }
    }
    RUN(test_dequantize);
    RUN(test_all_codes);
    RUN(test_quantize);
    RUN(test_through_ops);
    RUN(test_errors);
    return CHECK_DONE();
}
