/* GPU suite: cuda_ops. Every creation, copy, elementwise and reduction op
 * of lpx-cuda.so against the CPU backend on the same inputs:
 *  - bit-exact: cast (every dtype pair, saturating or not, values beyond
 *    the fp8 ranges, NaN, inf), copy_ (strided, broadcast, overlapping,
 *    across devices), fill_, zeros/full/arange, rand, add/sub/mul/div (the
 *    plugin is built with --fmad=false), add_scalar, mul_scalar, neg, abs,
 *    sqrt, relu, relu_backward, max, amax;
 *  - relative L2 error: exp, silu, gelu and their backwards, swiglu and
 *    swiglu_backward (CUDA's expf / erff are within 2 ulp of glibc's),
 *    sum, mean, norm (another summation order), randn (CUDA's double
 *    log/cos/sin).
 * Shapes: 1, 7 and 1000003 elements (vector tails), transposed and
 * unaligned (offset 1) inputs, broadcasting; dtypes f32, f16, bf16. */
#include <float.h>
#include "gpu_util.h"

static const lpx_dtype float_dtypes[] = {LPX_F32, LPX_F16, LPX_BF16, LPX_F8E4M3FN, LPX_F8E5M2};
static const lpx_dtype all_dtypes[] = {LPX_F32, LPX_F16, LPX_BF16, LPX_F8E4M3FN, LPX_F8E5M2,
                                       LPX_U8,  LPX_I8,  LPX_I32,  LPX_I64,      LPX_BOOL};
static const lpx_dtype ew_dtypes[] = {LPX_F32, LPX_F16, LPX_BF16};
static const int64_t sizes[] = {1, 7, 1000003};
#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

typedef lpx_status (*un_fn)(lpx_tensor *, lpx_tensor **);
typedef lpx_status (*bin_fn)(lpx_tensor *, lpx_tensor *, lpx_tensor **);

/* ---- helpers ------------------------------------------------------------ */

static void rel(lpx_tensor *t) { lpx_tensor_release(t); }

/* Transposed view (dims 0 and 1). */
static lpx_tensor *tr(lpx_tensor *x)
{
    lpx_tensor *y = NULL;
    if (lpx_transpose(x, 0, 1, &y)) printf("  transpose: %s\n", lpx_last_error());
    return y;
}

/* View of a 1-d x without its first element: contiguous, but 16-byte
 * unaligned on the GPU (the vector paths step aside). */
static lpx_tensor *from1(lpx_tensor *x)
{
    lpx_tensor *y = NULL;
    if (lpx_slice(x, 0, 1, lpx_tensor_shape(x)[0], 1, &y)) printf("  slice: %s\n", lpx_last_error());
    return y;
}

/* Compares a CPU result with a GPU result: bits when tol == 0, else the
 * relative L2 error. */
static void compare(const char *what, lpx_tensor *rc, lpx_tensor *rg, double tol)
{
    CHECKF(rc && rg, "%s: missing result", what);
    if (!rc || !rg) return;
    CHECKF(lpx_tensor_device(rg).type == LPX_DEVICE_CUDA, "%s: result not on the GPU", what);
    if (tol == 0) {
        CHECKF(gpu_same_bits(what, rc, rg), "%s", what);
    } else {
        double e = gpu_rel_err(rc, rg);
        CHECKF(e < tol, "%s: relative error %g >= %g", what, e, tol);
    }
}

/* f on x (CPU) and on x's GPU copy; `layout` 0 as is, 1 transposed (2-d
 * x), 2 without the first element (1-d x). */
static void cmp_unary(const char *name, un_fn f, lpx_tensor *x, int layout, double tol)
{
    lpx_tensor *g = gpu_up(x), *cx = x, *gx = g, *rc = NULL, *rg = NULL;
    if (layout == 1) cx = tr(x), gx = tr(g);
    if (layout == 2) cx = from1(x), gx = from1(g);
    char what[160];
    snprintf(what, sizeof what, "%s %s n=%lld layout %d", name, lpx_dtype_name(lpx_tensor_dtype(x)),
             (long long)lpx_tensor_numel(x), layout);
    CHECK_OK(f(cx, &rc));
    CHECK_OK(f(gx, &rg));
    compare(what, rc, rg, tol);
    rel(rc), rel(rg);
    if (cx != x) rel(cx), rel(gx);
    rel(g);
}

static void cmp_binary(const char *name, bin_fn f, lpx_tensor *a, lpx_tensor *b, double tol)
{
    lpx_tensor *ga = gpu_up(a), *gb = gpu_up(b), *rc = NULL, *rg = NULL;
    char what[160], sa[64], sb[64];
    snprintf(what, sizeof what, "%s %s%s %s%s", name, lpx_dtype_name(lpx_tensor_dtype(a)),
             lpx_tensor_shape_str(a, sa, sizeof sa), lpx_dtype_name(lpx_tensor_dtype(b)),
             lpx_tensor_shape_str(b, sb, sizeof sb));
    CHECK_OK(f(a, b, &rc));
    CHECK_OK(f(ga, gb, &rg));
    compare(what, rc, rg, tol);
    rel(rc), rel(rg), rel(ga), rel(gb);
}

static lpx_tensor *rnd(lpx_dtype dt, int nd, const int64_t *shape, uint64_t seed)
{
    return rand_normal(nd, shape, seed, 1.0, dt);
}

/* |x| (for sqrt) */
static lpx_tensor *rnd_abs(lpx_dtype dt, int nd, const int64_t *shape, uint64_t seed)
{
    lpx_tensor *x = rnd(dt, nd, shape, seed), *y = NULL;
    if (x) lpx_abs(x, &y);
    rel(x);
    return y;
}

static lpx_status add_s(lpx_tensor *x, lpx_tensor **o) { return lpx_add_scalar(x, 0.3, o); }
static lpx_status mul_s(lpx_tensor *x, lpx_tensor **o) { return lpx_mul_scalar(x, -1.7, o); }

/* ---- cast --------------------------------------------------------------- */

/* f32 values: specials (NaN, inf, zeros, the fp8/f16 range edges, values
 * beyond them, subnormals, ties) then normal values at several scales. */
static lpx_tensor *cast_source_f32(int64_t rows, int64_t cols)
{
    static const double special[] = {
        NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 448, -448, 449, 464, 480, 500, 57344, -57344, 61440, 65504,
        65520, 1e6, -1e30, 3.4e38, 1e-9, -1e-7, 2.0e-3, 1.5e-5, 1e-40, 0.5, 2.5, -3.5, 255.5, 300, -129, 1e10,
    };
    static const double scales[] = {1e-3, 1.0, 300.0, 1e5};
    int64_t shape[2] = {rows, cols}, n = rows * cols;
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = i < COUNT(special) ? special[i] : nrand() * scales[i % COUNT(scales)];
    lpx_tensor *t = mk(LPX_F32, 2, shape, v);
    free(v);
    return t;
}

static void check_cast(lpx_tensor *x, lpx_dtype to, bool sat, int layout)
{
    lpx_tensor *g = gpu_up(x), *cx = x, *gx = g, *rc = NULL, *rg = NULL;
    if (layout == 1) cx = tr(x), gx = tr(g);
    char what[128];
    snprintf(what, sizeof what, "cast %s -> %s sat=%d layout %d n=%lld", lpx_dtype_name(lpx_tensor_dtype(x)),
             lpx_dtype_name(to), (int)sat, layout, (long long)lpx_tensor_numel(x));
    CHECK_OK(lpx_cast(cx, to, sat, &rc));
    CHECK_OK(lpx_cast(gx, to, sat, &rg));
    compare(what, rc, rg, 0);
    rel(rc), rel(rg);
    if (cx != x) rel(cx), rel(gx);
    rel(g);
}

/* every float pair, both modes, contiguous (vector path) and transposed */
static void test_cast_float_pairs(void)
{
    lpx_tensor *f = cast_source_f32(67, 64);
    for (int i = 0; i < COUNT(float_dtypes); i++) {
        lpx_tensor *x = NULL;
        CHECK_OK(lpx_cast(f, float_dtypes[i], false, &x));
        for (int j = 0; j < COUNT(float_dtypes); j++)
            for (int sat = 0; sat < 2; sat++)
                for (int layout = 0; layout < 2; layout++) check_cast(x, float_dtypes[j], sat, layout);
        rel(x);
    }
    rel(f);
}

/* odd sizes and an unaligned start: the vector loop's tails */
static void test_cast_sizes(void)
{
    static const lpx_dtype pairs[][2] = {{LPX_BF16, LPX_F8E4M3FN}, {LPX_F32, LPX_F8E5M2}, {LPX_F8E4M3FN, LPX_BF16},
                                         {LPX_F16, LPX_F32}};
    for (int s = 0; s < COUNT(sizes); s++) {
        lpx_tensor *f = NULL;
        CHECK_OK(lpx_randn(1, &sizes[s], 77 + (uint64_t)s, LPX_F32, lpx_cpu(), &f));
        lpx_tensor *f600 = NULL;
        CHECK_OK(lpx_mul_scalar(f, 600.0, &f600)); /* beyond e4m3's 448 */
        for (int p = 0; p < COUNT(pairs); p++) {
            lpx_tensor *x = NULL, *g = NULL;
            CHECK_OK(lpx_cast(f600, pairs[p][0], false, &x));
            g = gpu_up(x);
            for (int sat = 0; sat < 2; sat++) {
                lpx_tensor *rc = NULL, *rg = NULL;
                CHECK_OK(lpx_cast(x, pairs[p][1], sat, &rc));
                CHECK_OK(lpx_cast(g, pairs[p][1], sat, &rg));
                compare("cast odd size", rc, rg, 0);
                rel(rc), rel(rg);
                if (sizes[s] > 1) {
                    lpx_tensor *cx = from1(x), *gx = from1(g);
                    CHECK_OK(lpx_cast(cx, pairs[p][1], sat, &rc));
                    CHECK_OK(lpx_cast(gx, pairs[p][1], sat, &rg));
                    compare("cast unaligned", rc, rg, 0);
                    rel(rc), rel(rg), rel(cx), rel(gx);
                }
            }
            rel(x), rel(g);
        }
        rel(f), rel(f600);
    }
}

/* Casts to fp8 whose 16-element vectors all stay within the format's max
 * take the hardware conversion (cuda_copy.cu, cast_to_f8_fast), the
 * others the codec: runs of 16 values share a scale, so most vectors are
 * wholly in range, in the subnormal range, mixed with zeros or at exact
 * ties between two fp8 values (where round-to-nearest-even decides), and
 * some have one value past the max. Every pair float -> fp8, both modes,
 * bit for bit against the CPU. */
static void test_cast_fp8_hw_path(void)
{
    const int64_t n = 16 * 4099 + 7;
    static const double run_scale[] = {1.0, 1e-3, 0.02, 100.0, 3e-5, 40000.0, 0.0, 1e-6};
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) {
        int64_t run = i / 16;
        double sc = run_scale[run % COUNT(run_scale)];
        v[i] = nrand() * sc;
        if (run % 5 == 3 && i % 3 == 0) v[i] = 0.0;
        if (run % 7 == 2) v[i] = (i % 2 ? -1.0 : 1.0) * (1.0 + (2 * (i % 8) + 1) / 16.0); /* e4m3 ties */
        if (run % 7 == 4) v[i] = (i % 2 ? -1.0 : 1.0) * (1.0 + (2 * (i % 4) + 1) / 8.0);  /* e5m2 ties */
        if (run % 11 == 6 && i % 16 == 9) v[i] = 450.0 + (double)(run % 40);              /* past e4m3's max */
    }
    int64_t shape[1] = {n};
    lpx_tensor *f = mk(LPX_F32, 1, shape, v);
    free(v);
    static const lpx_dtype to[2] = {LPX_F8E4M3FN, LPX_F8E5M2};
    static const lpx_dtype from[3] = {LPX_F32, LPX_BF16, LPX_F16};
    for (int i = 0; i < 3; i++) {
        lpx_tensor *x = NULL;
        CHECK_OK(lpx_cast(f, from[i], false, &x));
        for (int j = 0; j < 2; j++)
            for (int sat = 0; sat < 2; sat++) check_cast(x, to[j], sat, 0);
        rel(x);
    }
    rel(f);
}

/* CPU tensor of wide integers, written directly: values where the
 * round-to-odd intermediate matters (2^24 + 2^16 + 1 must round up to
 * bf16), clamping to the small integer types, and zero. */
static lpx_tensor *int_source(lpx_dtype dt)
{
    static const int64_t vals[] = {0, 1, -1, 127, 128, -129, 255, 256, 16777217, 16842753, -16842753, 2147483647,
                                   -2147483647 - 1, 65519, 65521, 448, 449, 1000000007};
    static const int64_t wide[] = {(INT64_C(1) << 40) + 1, -(INT64_C(1) << 53) - 3, INT64_MAX, INT64_MIN};
    int64_t n = COUNT(vals) + (dt == LPX_I64 ? COUNT(wide) : 0);
    lpx_tensor *t = NULL;
    if (lpx_tensor_new(dt, 1, &n, lpx_cpu(), &t)) return NULL;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = i < COUNT(vals) ? vals[i] : wide[i - COUNT(vals)];
        if (dt == LPX_I64) ((int64_t *)lpx_tensor_data(t))[i] = v;
        else ((int32_t *)lpx_tensor_data(t))[i] = (int32_t)v;
    }
    return t;
}

/* every dtype to every dtype, both modes (integer paths, NaN -> int) */
static void test_cast_all_pairs(void)
{
    lpx_tensor *f = cast_source_f32(8, 16);
    lpx_tensor *srcs[COUNT(all_dtypes) + 2];
    int ns = 0;
    for (int i = 0; i < COUNT(all_dtypes); i++) {
        srcs[ns] = NULL;
        CHECK_OK(lpx_cast(f, all_dtypes[i], false, &srcs[ns]));
        ns++;
    }
    srcs[ns++] = int_source(LPX_I32);
    srcs[ns++] = int_source(LPX_I64);
    for (int s = 0; s < ns; s++)
        for (int j = 0; j < COUNT(all_dtypes); j++)
            for (int sat = 0; sat < 2; sat++)
                if (srcs[s]) check_cast(srcs[s], all_dtypes[j], sat, 0);
    for (int s = 0; s < ns; s++) rel(srcs[s]);
    rel(f);
}

/* ---- copy_, fill_ --------------------------------------------------------- */

/* copy_ of src (CPU values, dtype of src) into the transpose of a zeroed
 * [cols, rows] buffer of dtype `to`, on the CPU and on the GPU. */
static void check_copy_strided(lpx_dtype from, lpx_dtype to)
{
    const int64_t ss[] = {5, 9}, ds[] = {9, 5};
    lpx_tensor *src = rnd(from, 2, ss, 21), *gsrc = gpu_up(src);
    lpx_tensor *dc = NULL, *dg = NULL;
    CHECK_OK(lpx_zeros(2, ds, to, lpx_cpu(), &dc));
    CHECK_OK(lpx_zeros(2, ds, to, gpu_dev(), &dg));
    lpx_tensor *vc = tr(dc), *vg = tr(dg);
    CHECK_OK(lpx_copy_(vc, src));
    CHECK_OK(lpx_copy_(vg, gsrc));
    char what[96];
    snprintf(what, sizeof what, "copy_ %s -> transposed %s", lpx_dtype_name(from), lpx_dtype_name(to));
    compare(what, dc, dg, 0);
    rel(vc), rel(vg), rel(dc), rel(dg), rel(src), rel(gsrc);
}

static void test_copy_same_device(void)
{
    for (int i = 0; i < COUNT(all_dtypes); i++) {
        check_copy_strided(LPX_BF16, all_dtypes[i]);
        check_copy_strided(all_dtypes[i], LPX_F32);
    }
    /* broadcast: [1, 5] into [4, 5] */
    const int64_t s1[] = {1, 5}, s4[] = {4, 5};
    lpx_tensor *src = rnd(LPX_F32, 2, s1, 3), *gsrc = gpu_up(src), *dc = NULL, *dg = NULL;
    CHECK_OK(lpx_zeros(2, s4, LPX_BF16, lpx_cpu(), &dc));
    CHECK_OK(lpx_zeros(2, s4, LPX_BF16, gpu_dev(), &dg));
    CHECK_OK(lpx_copy_(dc, src));
    CHECK_OK(lpx_copy_(dg, gsrc));
    compare("copy_ broadcast", dc, dg, 0);
    rel(src), rel(gsrc), rel(dc), rel(dg);
    /* overlap: x[1:] <- x[:-1] within one buffer (read through a copy) */
    int64_t n = 1001;
    lpx_tensor *x = rnd(LPX_F16, 1, &n, 4), *g = gpu_up(x), *xa = NULL, *xb = NULL, *ga = NULL, *gb = NULL;
    CHECK_OK(lpx_slice(x, 0, 1, n, 1, &xa));
    CHECK_OK(lpx_slice(x, 0, 0, n - 1, 1, &xb));
    CHECK_OK(lpx_slice(g, 0, 1, n, 1, &ga));
    CHECK_OK(lpx_slice(g, 0, 0, n - 1, 1, &gb));
    CHECK_OK(lpx_copy_(xa, xb));
    CHECK_OK(lpx_copy_(ga, gb));
    compare("copy_ overlapping", x, g, 0);
    rel(xa), rel(xb), rel(ga), rel(gb), rel(x), rel(g);
}

static void test_copy_cross_device(void)
{
    const int64_t s[] = {6, 7}, st[] = {7, 6};
    lpx_tensor *src = rnd(LPX_F32, 2, s, 8);
    /* CPU -> GPU: same dtype and layout (one upload), then converting into
     * a transposed bf16 view */
    lpx_tensor *g = NULL, *gb = NULL;
    CHECK_OK(lpx_zeros(2, s, LPX_F32, gpu_dev(), &g));
    CHECK_OK(lpx_copy_(g, src));
    compare("copy_ cpu -> cuda", src, g, 0);
    CHECK_OK(lpx_zeros(2, st, LPX_BF16, gpu_dev(), &gb));
    lpx_tensor *gbt = tr(gb), *cb = NULL, *cbt = NULL;
    CHECK_OK(lpx_zeros(2, st, LPX_BF16, lpx_cpu(), &cb));
    cbt = tr(cb);
    CHECK_OK(lpx_copy_(gbt, src));
    CHECK_OK(lpx_copy_(cbt, src));
    compare("copy_ cpu -> transposed cuda bf16", cb, gb, 0);
    /* GPU -> CPU: straight, and converting into a transposed f8 view */
    lpx_tensor *back = NULL, *c8 = NULL, *c8t = NULL, *r8 = NULL, *r8t = NULL;
    CHECK_OK(lpx_zeros(2, s, LPX_F32, lpx_cpu(), &back));
    CHECK_OK(lpx_copy_(back, g));
    CHECKF(gpu_same_bits("copy_ cuda -> cpu", src, back), "copy_ cuda -> cpu");
    CHECK_OK(lpx_zeros(2, st, LPX_F8E4M3FN, lpx_cpu(), &c8));
    CHECK_OK(lpx_zeros(2, st, LPX_F8E4M3FN, lpx_cpu(), &r8));
    c8t = tr(c8), r8t = tr(r8);
    CHECK_OK(lpx_copy_(c8t, g));
    CHECK_OK(lpx_copy_(r8t, src));
    CHECKF(gpu_same_bits("copy_ cuda -> transposed cpu f8", r8, c8), "copy_ cuda -> cpu f8");
    rel(c8t), rel(r8t), rel(c8), rel(r8), rel(back), rel(gbt), rel(cbt), rel(cb), rel(gb), rel(g), rel(src);
}

static void test_fill(void)
{
    static const double values[] = {3.7, -1e9, 0.0};
    const int64_t s[] = {13, 11};
    for (int i = 0; i < COUNT(all_dtypes); i++)
        for (int v = 0; v < COUNT(values); v++)
            for (int layout = 0; layout < 2; layout++) {
                lpx_tensor *c = NULL, *g = NULL;
                CHECK_OK(lpx_zeros(2, s, all_dtypes[i], lpx_cpu(), &c));
                CHECK_OK(lpx_zeros(2, s, all_dtypes[i], gpu_dev(), &g));
                lpx_tensor *vc = c, *vg = g;
                if (layout) { /* every other column: strided */
                    CHECK_OK(lpx_slice(c, 1, 1, 11, 2, &vc));
                    CHECK_OK(lpx_slice(g, 1, 1, 11, 2, &vg));
                }
                CHECK_OK(lpx_fill_(vc, values[v]));
                CHECK_OK(lpx_fill_(vg, values[v]));
                compare("fill_", c, g, 0);
                if (layout) rel(vc), rel(vg);
                rel(c), rel(g);
            }
    /* long, unaligned: the vector stores and the tails */
    int64_t n = 1000003;
    lpx_tensor *c = NULL, *g = NULL;
    CHECK_OK(lpx_zeros(1, &n, LPX_BF16, lpx_cpu(), &c));
    CHECK_OK(lpx_zeros(1, &n, LPX_BF16, gpu_dev(), &g));
    lpx_tensor *vc = from1(c), *vg = from1(g);
    CHECK_OK(lpx_fill_(vc, -2.75));
    CHECK_OK(lpx_fill_(vg, -2.75));
    compare("fill_ unaligned", c, g, 0);
    rel(vc), rel(vg), rel(c), rel(g);
}

/* ---- creation ------------------------------------------------------------ */

static void test_creation(void)
{
    const int64_t s[] = {3, 1000};
    for (int i = 0; i < COUNT(all_dtypes); i++) {
        lpx_tensor *c = NULL, *g = NULL;
        CHECK_OK(lpx_zeros(2, s, all_dtypes[i], lpx_cpu(), &c));
        CHECK_OK(lpx_zeros(2, s, all_dtypes[i], gpu_dev(), &g));
        compare("zeros", c, g, 0);
        rel(c), rel(g);
        CHECK_OK(lpx_full(2, s, 1000.5, all_dtypes[i], lpx_cpu(), &c));
        CHECK_OK(lpx_full(2, s, 1000.5, all_dtypes[i], gpu_dev(), &g));
        compare("full", c, g, 0);
        rel(c), rel(g);
        CHECK_OK(lpx_arange(-7.5, 1000.0, 0.75, all_dtypes[i], lpx_cpu(), &c));
        CHECK_OK(lpx_arange(-7.5, 1000.0, 0.75, all_dtypes[i], gpu_dev(), &g));
        compare("arange", c, g, 0);
        rel(c), rel(g);
    }
    lpx_tensor *c = NULL, *g = NULL;
    CHECK_OK(lpx_arange(0x1p40, 0x1p40 + 1000, 1, LPX_I64, lpx_cpu(), &c));
    CHECK_OK(lpx_arange(0x1p40, 0x1p40 + 1000, 1, LPX_I64, gpu_dev(), &g));
    compare("arange i64 beyond 2^24", c, g, 0);
    rel(c), rel(g);
    CHECK_OK(lpx_empty(2, s, LPX_BF16, gpu_dev(), &g));
    CHECK(g && shape_is(g, 2, s) && lpx_tensor_device(g).type == LPX_DEVICE_CUDA);
    rel(g);
    CHECK_ERR(lpx_arange(0, 1, 0, LPX_F32, gpu_dev(), &g), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "arange") != NULL);
    CHECK_ERR(lpx_rand(2, s, 1, LPX_I32, gpu_dev(), &g), LPX_EDTYPE);
}

static void test_rand(void)
{
    for (int i = 0; i < COUNT(float_dtypes); i++)
        for (int k = 0; k < COUNT(sizes); k++) {
            lpx_tensor *c = NULL, *g = NULL;
            CHECK_OK(lpx_rand(1, &sizes[k], 0x123456789ull, float_dtypes[i], lpx_cpu(), &c));
            CHECK_OK(lpx_rand(1, &sizes[k], 0x123456789ull, float_dtypes[i], gpu_dev(), &g));
            compare("rand", c, g, 0);
            rel(c), rel(g);
        }
}

/* randn f32: every element within 4 ulp of the CPU's */
static void test_randn(void)
{
    for (int k = 0; k < COUNT(sizes); k++) {
        lpx_tensor *c = NULL, *g = NULL, *gc = NULL;
        CHECK_OK(lpx_randn(1, &sizes[k], 42, LPX_F32, lpx_cpu(), &c));
        CHECK_OK(lpx_randn(1, &sizes[k], 42, LPX_F32, gpu_dev(), &g));
        gc = g ? gpu_down(g) : NULL;
        CHECK(c && gc);
        if (c && gc) {
            const int32_t *p = lpx_tensor_data(c), *q = lpx_tensor_data(gc);
            int64_t worst = 0;
            for (int64_t i = 0; i < sizes[k]; i++) {
                int64_t d = (int64_t)p[i] - (int64_t)q[i];
                if (d < 0) d = -d;
                if (d > worst) worst = d;
            }
            CHECKF(worst <= 4, "randn n=%lld: %lld ulp apart", (long long)sizes[k], (long long)worst);
        }
        rel(c), rel(g), rel(gc);
        CHECK_OK(lpx_randn(1, &sizes[k], 42, LPX_BF16, lpx_cpu(), &c));
        CHECK_OK(lpx_randn(1, &sizes[k], 42, LPX_BF16, gpu_dev(), &g));
        compare("randn bf16", c, g, 1e-3);
        rel(c), rel(g);
    }
}

/* ---- elementwise ----------------------------------------------------------- */

static void test_binary_exact(void)
{
    static const bin_fn fns[] = {lpx_add, lpx_sub, lpx_mul, lpx_div, lpx_relu_backward};
    static const char *names[] = {"add", "sub", "mul", "div", "relu_backward"};
    for (int d = 0; d < COUNT(ew_dtypes); d++)
        for (int f = 0; f < COUNT(fns); f++) {
            for (int k = 0; k < COUNT(sizes); k++) {
                lpx_tensor *a = rnd(ew_dtypes[d], 1, &sizes[k], 1), *b = rnd(ew_dtypes[d], 1, &sizes[k], 2);
                cmp_binary(names[f], fns[f], a, b, 0);
                rel(a), rel(b);
            }
            /* broadcasting [5, 1, 7] with [3, 1], and with a scalar */
            const int64_t sa[] = {5, 1, 7}, sb[] = {3, 1};
            lpx_tensor *a = rnd(ew_dtypes[d], 3, sa, 3), *b = rnd(ew_dtypes[d], 2, sb, 4), *s0 = rnd(LPX_F32, 0, NULL, 5);
            cmp_binary(names[f], fns[f], a, b, 0);
            cmp_binary(names[f], fns[f], b, a, 0);
            cmp_binary(names[f], fns[f], a, s0, 0); /* mixed dtypes */
            rel(a), rel(b), rel(s0);
        }
}

/* non-contiguous operands and `out` (fresh, aliasing a, and strided) */
static void test_binary_layouts_and_out(void)
{
    const int64_t s[] = {37, 29}, st[] = {29, 37};
    lpx_tensor *a = rnd(LPX_BF16, 2, s, 6), *b = rnd(LPX_BF16, 2, st, 7);
    lpx_tensor *ga = gpu_up(a), *gb = gpu_up(b), *at = tr(a), *gat = tr(ga);
    lpx_tensor *rc = NULL, *rg = NULL;
    /* transposed a + contiguous b */
    CHECK_OK(lpx_mul(at, b, &rc));
    CHECK_OK(lpx_mul(gat, gb, &rg));
    compare("mul transposed", rc, rg, 0);
    rel(rc), rel(rg);
    /* into a fresh out */
    CHECK_OK(lpx_empty(2, st, LPX_BF16, lpx_cpu(), &rc));
    CHECK_OK(lpx_empty(2, st, LPX_BF16, gpu_dev(), &rg));
    CHECK_OK(lpx_sub_out(at, b, rc));
    CHECK_OK(lpx_sub_out(gat, gb, rg));
    compare("sub_out", rc, rg, 0);
    rel(rc), rel(rg);
    /* out aliasing an input exactly (in place) */
    CHECK_OK(lpx_add_out(at, b, b));
    CHECK_OK(lpx_add_out(gat, gb, gb));
    compare("add_out into b", b, gb, 0);
    lpx_tensor *bt = tr(b), *gbt = tr(gb);
    CHECK_OK(lpx_div_out(a, bt, a));
    CHECK_OK(lpx_div_out(ga, gbt, ga));
    compare("div_out into a", a, ga, 0);
    /* out = a's transpose, one input = a seen as [29, 37] row-major: the
     * same memory in another layout, read through a private copy */
    lpx_tensor *av = NULL, *gav = NULL;
    CHECK_OK(lpx_view(a, 2, st, &av));
    CHECK_OK(lpx_view(ga, 2, st, &gav));
    CHECK_OK(lpx_add_out(av, b, at));
    CHECK_OK(lpx_add_out(gav, gb, gat));
    compare("add_out overlapping layouts", a, ga, 0);
    rel(av), rel(gav), rel(bt), rel(gbt), rel(at), rel(gat), rel(a), rel(b), rel(ga), rel(gb);
}

static void test_unary_exact(void)
{
    static const un_fn fns[] = {lpx_neg, lpx_abs, lpx_relu, add_s, mul_s, lpx_sqrt};
    static const char *names[] = {"neg", "abs", "relu", "add_scalar", "mul_scalar", "sqrt"};
    for (int d = 0; d < COUNT(ew_dtypes); d++)
        for (int f = 0; f < COUNT(fns); f++) {
            bool nonneg = fns[f] == lpx_sqrt; /* sqrt(-x): NaN bits differ between x86 and CUDA */
            for (int k = 0; k < COUNT(sizes); k++) {
                lpx_tensor *x = nonneg ? rnd_abs(ew_dtypes[d], 1, &sizes[k], 9) : rnd(ew_dtypes[d], 1, &sizes[k], 9);
                cmp_unary(names[f], fns[f], x, 0, 0);
                if (sizes[k] > 1) cmp_unary(names[f], fns[f], x, 2, 0);
                rel(x);
            }
            const int64_t s[] = {37, 29};
            lpx_tensor *x = nonneg ? rnd_abs(ew_dtypes[d], 2, s, 10) : rnd(ew_dtypes[d], 2, s, 10);
            cmp_unary(names[f], fns[f], x, 1, 0);
            rel(x);
        }
}

/* relu(x, out) through the dispatcher (no typed _out for unary ops) */
static lpx_status relu_out(lpx_tensor *x, lpx_tensor *out)
{
    lpx_value v[] = {lpx_v_tensor(x), lpx_v_tensor(out)};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_relu, v, 2);
    lpx_status st = lpx_dispatch(&c);
    lpx_call_release_rets(&c);
    return st;
}

static void test_unary_out(void)
{
    int64_t n = 1000;
    lpx_tensor *x = rnd(LPX_F32, 1, &n, 12), *g = gpu_up(x);
    CHECK_OK(relu_out(x, x));
    CHECK_OK(relu_out(g, g));
    compare("relu in place", x, g, 0);
    rel(x), rel(g);
}

/* transcendental ops: f32 within 1e-6, bf16 within about a bf16 ulp */
static void test_transcendental(void)
{
    static const un_fn un[] = {lpx_exp, lpx_silu, lpx_gelu};
    static const char *un_names[] = {"exp", "silu", "gelu"};
    static const bin_fn bin[] = {lpx_silu_backward, lpx_gelu_backward};
    static const char *bin_names[] = {"silu_backward", "gelu_backward"};
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16};
    /* relative L2 error over many elements: a single element of gelu at
     * x << 0 (1 + erff cancels) can differ relatively by more */
    static const int64_t tsizes[] = {1003, 1000003};
    static const double tol[] = {1e-6, 1e-2};
    for (int d = 0; d < COUNT(dts); d++)
        for (int k = 0; k < COUNT(tsizes); k++) {
            lpx_tensor *x = rnd(dts[d], 1, &tsizes[k], 13), *gr = rnd(dts[d], 1, &tsizes[k], 14);
            for (int f = 0; f < COUNT(un); f++) cmp_unary(un_names[f], un[f], x, 0, tol[d]);
            for (int f = 0; f < COUNT(bin); f++) cmp_binary(bin_names[f], bin[f], gr, x, tol[d]);
            rel(x), rel(gr);
        }
    const int64_t s[] = {37, 29};
    lpx_tensor *x = rnd(LPX_F32, 2, s, 15);
    for (int f = 0; f < COUNT(un); f++) cmp_unary(un_names[f], un[f], x, 1, 1e-6);
    rel(x);
}

/* ---- swiglu ----------------------------------------------------------------- */

/* 8192*3+5 elements: whole 16-byte vectors (4 f32 or 8 bf16 values) and a
 * ragged tail; 1 and 7: the tail alone */
static const int64_t sw_sizes[] = {1, 7, 8192 * 3 + 5};
static const lpx_dtype sw_dts[] = {LPX_F32, LPX_BF16};
static const double sw_tol[] = {1e-6, 1e-2};

static lpx_status swiglu_fn(lpx_tensor *gate, lpx_tensor *up, lpx_tensor **o) { return lpx_swiglu(gate, up, o); }

/* swiglu_backward on (g, a, b) on the CPU and on their GPU copies, seen
 * through `layout` (0 as is, 1 transposed (2-d), 2 without the first
 * element (1-d: contiguous, 16-byte unaligned)); both results compared. */
static void cmp_swiglu_bw(lpx_tensor *g, lpx_tensor *a, lpx_tensor *b, int layout, double tol)
{
    lpx_tensor *in[3] = {g, a, b}, *cin[3], *gin[3], *up[3];
    for (int i = 0; i < 3; i++) {
        up[i] = gpu_up(in[i]);
        cin[i] = in[i], gin[i] = up[i];
        if (layout == 1) cin[i] = tr(in[i]), gin[i] = tr(up[i]);
        if (layout == 2) cin[i] = from1(in[i]), gin[i] = from1(up[i]);
    }
    lpx_tensor *cdg = NULL, *cdu = NULL, *gdg = NULL, *gdu = NULL;
    CHECK_OK(lpx_swiglu_backward(cin[0], cin[1], cin[2], &cdg, &cdu));
    CHECK_OK(lpx_swiglu_backward(gin[0], gin[1], gin[2], &gdg, &gdu));
    char base[160], what[192], sa[64];
    snprintf(base, sizeof base, "swiglu_backward %s/%s/%s%s layout %d", lpx_dtype_name(lpx_tensor_dtype(g)),
             lpx_dtype_name(lpx_tensor_dtype(a)), lpx_dtype_name(lpx_tensor_dtype(b)),
             lpx_tensor_shape_str(a, sa, sizeof sa), layout);
    CHECKF(gdg && gdu && lpx_tensor_dtype(gdg) == lpx_tensor_dtype(a) && lpx_tensor_dtype(gdu) == lpx_tensor_dtype(b),
           "%s: result dtypes", base);
    snprintf(what, sizeof what, "%s grad_gate", base);
    compare(what, cdg, gdg, tol);
    snprintf(what, sizeof what, "%s grad_up", base);
    compare(what, cdu, gdu, tol);
    rel(cdg), rel(cdu), rel(gdg), rel(gdu);
    for (int i = 0; i < 3; i++) {
        if (cin[i] != in[i]) rel(cin[i]), rel(gin[i]);
        rel(up[i]);
    }
}

/* swiglu (forward): contiguous sizes through the vector path and its tail,
 * unaligned, transposed, broadcasting, mixed dtypes and out */
static void test_swiglu(void)
{
    for (int d = 0; d < COUNT(sw_dts); d++) {
        for (int k = 0; k < COUNT(sw_sizes); k++) {
            lpx_tensor *a = rand_normal(1, &sw_sizes[k], 21, 3.0, sw_dts[d]), *b = rnd(sw_dts[d], 1, &sw_sizes[k], 22);
            cmp_binary("swiglu", swiglu_fn, a, b, sw_tol[d]);
            if (sw_sizes[k] > 1) { /* unaligned: the contiguous kernel without vectors */
                lpx_tensor *ga = gpu_up(a), *gb = gpu_up(b), *ca = from1(a), *cb = from1(b), *ua = from1(ga),
                           *ub = from1(gb), *rc = NULL, *rg = NULL;
                CHECK_OK(lpx_swiglu(ca, cb, &rc));
                CHECK_OK(lpx_swiglu(ua, ub, &rg));
                compare("swiglu unaligned", rc, rg, sw_tol[d]);
                rel(rc), rel(rg), rel(ga), rel(gb), rel(ca), rel(cb), rel(ua), rel(ub);
            }
            rel(a), rel(b);
        }
        /* transposed gate (the strided kernel) */
        const int64_t s[] = {37, 29}, st[] = {29, 37};
        lpx_tensor *a = rand_normal(2, s, 23, 3.0, sw_dts[d]), *b = rnd(sw_dts[d], 2, st, 24);
        lpx_tensor *ga = gpu_up(a), *gb = gpu_up(b), *at = tr(a), *gat = tr(ga), *rc = NULL, *rg = NULL;
        CHECK_OK(lpx_swiglu(at, b, &rc));
        CHECK_OK(lpx_swiglu(gat, gb, &rg));
        compare("swiglu transposed gate", rc, rg, sw_tol[d]);
        rel(rc), rel(rg);
        rc = rg = NULL;
        /* out: a fresh tensor, and in place into b */
        CHECK_OK(lpx_empty(2, st, sw_dts[d], lpx_cpu(), &rc));
        CHECK_OK(lpx_empty(2, st, sw_dts[d], gpu_dev(), &rg));
        CHECK_OK(lpx_swiglu_out(at, b, rc));
        CHECK_OK(lpx_swiglu_out(gat, gb, rg));
        compare("swiglu_out", rc, rg, sw_tol[d]);
        CHECK_OK(lpx_swiglu_out(at, b, b));
        CHECK_OK(lpx_swiglu_out(gat, gb, gb));
        compare("swiglu_out in place", b, gb, sw_tol[d]);
        rel(rc), rel(rg), rel(a), rel(b), rel(ga), rel(gb), rel(at), rel(gat);
        /* broadcasting [5, 1, 7] with [3, 1], both ways, and mixed dtypes */
        const int64_t sa[] = {5, 1, 7}, sb[] = {3, 1};
        lpx_tensor *x = rand_normal(3, sa, 25, 3.0, sw_dts[d]), *y = rnd(sw_dts[d], 2, sb, 26),
                   *z = rnd(LPX_F16, 2, sb, 27);
        cmp_binary("swiglu", swiglu_fn, x, y, sw_tol[d]);
        cmp_binary("swiglu", swiglu_fn, y, x, sw_tol[d]);
        cmp_binary("swiglu", swiglu_fn, x, z, sw_tol[d]);
        rel(x), rel(y), rel(z);
    }
    /* the shape error is the CPU's (one meta function), on the GPU too */
    const int64_t s1[] = {4, 6}, s2[] = {6, 4};
    lpx_tensor *a = rnd(LPX_F32, 2, s1, 28), *b = rnd(LPX_F32, 2, s2, 29), *ga = gpu_up(a), *gb = gpu_up(b), *o = NULL;
    char cpu_msg[512];
    CHECK_ERR(lpx_swiglu(a, b, &o), LPX_ESHAPE);
    snprintf(cpu_msg, sizeof cpu_msg, "%s", lpx_last_error());
    CHECK_ERR(lpx_swiglu(ga, gb, &o), LPX_ESHAPE);
    CHECKF(strcmp(cpu_msg, lpx_last_error()) == 0, "cpu '%s' vs cuda '%s'", cpu_msg, lpx_last_error());
    CHECK(o == NULL);
    rel(a), rel(b), rel(ga), rel(gb);
}

/* swiglu_backward: the contiguous kernel (vectors and tail, unaligned),
 * the strided one (transposed views, mixed dtypes), empty tensors, and
 * the shared meta function's errors */
static void test_swiglu_backward(void)
{
    for (int d = 0; d < COUNT(sw_dts); d++) {
        for (int k = 0; k < COUNT(sw_sizes); k++) {
            lpx_tensor *g = rnd(sw_dts[d], 1, &sw_sizes[k], 31), *a = rand_normal(1, &sw_sizes[k], 32, 3.0, sw_dts[d]),
                       *b = rnd(sw_dts[d], 1, &sw_sizes[k], 33);
            cmp_swiglu_bw(g, a, b, 0, sw_tol[d]);
            if (sw_sizes[k] > 1) cmp_swiglu_bw(g, a, b, 2, sw_tol[d]);
            rel(g), rel(a), rel(b);
        }
        const int64_t s[] = {37, 29};
        lpx_tensor *g = rnd(sw_dts[d], 2, s, 34), *a = rand_normal(2, s, 35, 3.0, sw_dts[d]),
                   *b = rnd(sw_dts[d], 2, s, 36);
        cmp_swiglu_bw(g, a, b, 1, sw_tol[d]);
        rel(g), rel(a), rel(b);
    }
    /* mixed dtypes: bf16 gate, f32 grad and up (the strided kernel, each
     * result in its input's dtype) */
    int64_t n = 8192 * 3 + 5;
    lpx_tensor *g = rnd(LPX_F32, 1, &n, 37), *a = rand_normal(1, &n, 38, 3.0, LPX_BF16), *b = rnd(LPX_F32, 1, &n, 39);
    cmp_swiglu_bw(g, a, b, 0, 1e-2);
    rel(g), rel(a), rel(b);
    /* empty */
    const int64_t s0[] = {0, 5};
    lpx_tensor *e = NULL, *dg = NULL, *du = NULL;
    CHECK_OK(lpx_empty(2, s0, LPX_BF16, gpu_dev(), &e));
    CHECK_OK(lpx_swiglu_backward(e, e, e, &dg, &du));
    CHECK(dg && du && lpx_tensor_numel(dg) == 0 && lpx_tensor_shape(du)[1] == 5 &&
          lpx_tensor_device(dg).type == LPX_DEVICE_CUDA);
    rel(e), rel(dg), rel(du);
    dg = du = NULL;
    /* errors: the CPU's messages (lpx_meta_swiglu_backward) */
    const int64_t s1[] = {4, 6}, s2[] = {6, 4};
    lpx_tensor *x = rnd(LPX_F32, 2, s1, 40), *y = rnd(LPX_F32, 2, s2, 41), *xi = NULL;
    CHECK_OK(lpx_zeros(2, s1, LPX_I32, lpx_cpu(), &xi));
    lpx_tensor *gx = gpu_up(x), *gy = gpu_up(y), *gxi = gpu_up(xi);
    char cpu_msg[512];
    CHECK_ERR(lpx_swiglu_backward(x, x, y, &dg, &du), LPX_ESHAPE);
    snprintf(cpu_msg, sizeof cpu_msg, "%s", lpx_last_error());
    CHECK_ERR(lpx_swiglu_backward(gx, gx, gy, &dg, &du), LPX_ESHAPE);
    CHECKF(strcmp(cpu_msg, lpx_last_error()) == 0, "cpu '%s' vs cuda '%s'", cpu_msg, lpx_last_error());
    CHECK_ERR(lpx_swiglu_backward(x, xi, x, &dg, &du), LPX_EDTYPE);
    snprintf(cpu_msg, sizeof cpu_msg, "%s", lpx_last_error());
    CHECK_ERR(lpx_swiglu_backward(gx, gxi, gx, &dg, &du), LPX_EDTYPE);
    CHECKF(strcmp(cpu_msg, lpx_last_error()) == 0, "cpu '%s' vs cuda '%s'", cpu_msg, lpx_last_error());
    CHECK(dg == NULL && du == NULL);
    rel(x), rel(y), rel(xi), rel(gx), rel(gy), rel(gxi);
}

/* ---- reductions ------------------------------------------------------------- */

typedef lpx_status (*red_fn)(lpx_tensor *, int, const int64_t *, bool, lpx_tensor **);
static const red_fn red_fns[] = {lpx_sum, lpx_mean, lpx_norm, lpx_max, lpx_amax};
static const char *red_names[] = {"sum", "mean", "norm", "max", "amax"};
#define RED_EXACT_FROM 3 /* max and amax compare bits */

static void cmp_reduce(int f, lpx_tensor *x, lpx_tensor *g, int nd, const int64_t *dims, bool keep)
{
    lpx_tensor *rc = NULL, *rg = NULL;
    char what[96];
    snprintf(what, sizeof what, "%s %s n=%lld ndims=%d keep=%d", red_names[f], lpx_dtype_name(lpx_tensor_dtype(x)),
             (long long)lpx_tensor_numel(x), nd, (int)keep);
    CHECK_OK(red_fns[f](x, nd, dims, keep, &rc));
    CHECK_OK(red_fns[f](g, nd, dims, keep, &rg));
    CHECKF(rc && rg && lpx_tensor_ndim(rc) == lpx_tensor_ndim(rg), "%s: shapes", what);
    compare(what, rc, rg, f >= RED_EXACT_FROM ? 0 : 1e-6);
    rel(rc), rel(rg);
}

static void test_reduce(void)
{
    static const int64_t d0[] = {0}, d1[] = {1}, dm1[] = {-1}, d02[] = {0, 2}, d12[] = {2, 1};
    static const struct { int nd; const int64_t *dims; bool keep; } cases[] = {
        {0, NULL, false}, {1, d0, false}, {1, d1, true}, {1, dm1, false}, {2, d02, true}, {2, d12, false},
    };
    const int64_t s[] = {37, 29, 11};
    for (int dt = 0; dt < 2; dt++) {
        lpx_tensor *x = rnd(dt ? LPX_BF16 : LPX_F32, 3, s, 16), *g = gpu_up(x);
        lpx_tensor *xt = tr(x), *gt = tr(g); /* [29, 37, 11], strided */
        for (int f = 0; f < COUNT(red_fns); f++)
            for (int c = 0; c < COUNT(cases); c++) {
                cmp_reduce(f, x, g, cases[c].nd, cases[c].dims, cases[c].keep);
                cmp_reduce(f, xt, gt, cases[c].nd, cases[c].dims, cases[c].keep);
            }
        rel(xt), rel(gt), rel(x), rel(g);
    }
    /* long 1-d reductions: several blocks per output, then the combine */
    for (int k = 0; k < COUNT(sizes); k++) {
        lpx_tensor *x = rnd(LPX_F32, 1, &sizes[k], 17), *g = gpu_up(x);
        for (int f = 0; f < COUNT(red_fns); f++) cmp_reduce(f, x, g, 0, NULL, false);
        rel(x), rel(g);
    }
    /* rows reduced over the last dim, 16-byte aligned rows (the vector
     * path): many short rows, and few long ones split over blocks */
    static const int64_t rows[][2] = {{33, 1000}, {3, 100000}};
    for (int r = 0; r < 2; r++)
        for (int dt = 0; dt < 2; dt++) {
            lpx_tensor *x = rnd(dt ? LPX_BF16 : LPX_F32, 2, rows[r], 20), *g = gpu_up(x);
            for (int f = 0; f < COUNT(red_fns); f++) cmp_reduce(f, x, g, 1, dm1, r == 1);
            rel(x), rel(g);
        }
    /* reduce over the leading dim of a tall matrix (few outputs) */
    const int64_t tall[] = {100003, 3};
    lpx_tensor *x = rnd(LPX_F32, 2, tall, 18), *g = gpu_up(x);
    for (int f = 0; f < COUNT(red_fns); f++) cmp_reduce(f, x, g, 1, d0, false);
    rel(x), rel(g);
}

static void test_reduce_edges(void)
{
    /* NaN wins in max and amax */
    int64_t n = 5000;
    lpx_tensor *x = rnd(LPX_F32, 1, &n, 19);
    ((float *)lpx_tensor_data(x))[3171] = NAN;
    lpx_tensor *g = gpu_up(x), *r = NULL;
    for (int f = RED_EXACT_FROM; f < COUNT(red_fns); f++) {
        CHECK_OK(red_fns[f](g, 0, NULL, false, &r));
        lpx_tensor *rc = r ? gpu_down(r) : NULL;
        double v = 0;
        CHECK(rc && !lpx_item(rc, 0, &v) && isnan(v));
        rel(rc), rel(r);
    }
    rel(x), rel(g);
    /* zero elements: sum 0, mean NaN, max refused */
    const int64_t s0[] = {3, 0}, d1[] = {1}, d5[] = {5}, d00[] = {0, 0};
    lpx_tensor *e = NULL;
    CHECK_OK(lpx_zeros(2, s0, LPX_F32, gpu_dev(), &e));
    CHECK_OK(lpx_sum(e, 1, d1, false, &r));
    lpx_tensor *rc = r ? gpu_down(r) : NULL;
    double v = 1;
    CHECK(rc && lpx_tensor_numel(rc) == 3 && !lpx_item(rc, 2, &v) && v == 0.0);
    rel(rc), rel(r);
    CHECK_OK(lpx_mean(e, 1, d1, false, &r));
    rc = r ? gpu_down(r) : NULL;
    CHECK(rc && !lpx_item(rc, 0, &v) && isnan(v));
    rel(rc), rel(r);
    CHECK_ERR(lpx_max(e, 1, d1, false, &r), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "max") != NULL);
    CHECK_ERR(lpx_sum(e, 1, d5, false, &r), LPX_ERANGE);
    CHECK(strstr(lpx_last_error(), "sum") != NULL);
    CHECK_ERR(lpx_norm(e, 2, d00, false, &r), LPX_EINVAL);
    rel(e);
}

int main(void)
{
    gpu_setup();
    RUN(test_cast_float_pairs);
    RUN(test_cast_sizes);
    RUN(test_cast_fp8_hw_path);
    RUN(test_cast_all_pairs);
    RUN(test_copy_same_device);
    RUN(test_copy_cross_device);
    RUN(test_fill);
    RUN(test_creation);
    RUN(test_rand);
    RUN(test_randn);
    RUN(test_binary_exact);
    RUN(test_binary_layouts_and_out);
    RUN(test_unary_exact);
    RUN(test_unary_out);
    RUN(test_transcendental);
    RUN(test_swiglu);
    RUN(test_swiglu_backward);
    RUN(test_reduce);
    RUN(test_reduce_edges);
    return CHECK_DONE();
}
