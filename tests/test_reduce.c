/* sum, mean, max, amax, norm against float64 references computed here:
 * global and over every subset of dims (negative dims too), keepdim,
 * non-contiguous inputs, bf16/f16 inputs, NaN propagation, empty
 * reductions, and the error paths. Tensors are built with lpx_tensor_new /
 * lpx_tensor_view_of only. */
#include <stdint.h>
#include "check.h"
#include "tensor_util.h"

LPX_API void lpx__fail_alloc_after(long n);

/* ---- helpers ------------------------------------------------------------ */

static lpx_tensor *mk_rand(lpx_dtype dt, int nd, const int64_t *shape)
{
    int64_t n = numel_of(nd, shape);
    double *v = calloc((size_t)(n ? n : 1), sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = nrand();
    lpx_tensor *t = mk(dt, nd, shape, v);
    free(v);
    return t;
}

#define CHECK_MSG(s) CHECKF(strstr(lpx_last_error(), (s)) != NULL, "message '%s' lacks '%s'", lpx_last_error(), (s))

/* ---- reference ----------------------------------------------------------- */

enum { OP_SUM, OP_MEAN, OP_MAX, OP_AMAX, OP_NORM, NOPS };
static const char *op_names[] = {"sum", "mean", "max", "amax", "norm"};

static lpx_status call_op(int op, lpx_tensor *x, int nd, const int64_t *dims, bool keep, lpx_tensor **out)
{
    switch (op) {
    case OP_SUM: return lpx_sum(x, nd, dims, keep, out);
    case OP_MEAN: return lpx_mean(x, nd, dims, keep, out);
    case OP_MAX: return lpx_max(x, nd, dims, keep, out);
    case OP_AMAX: return lpx_amax(x, nd, dims, keep, out);
    default: return lpx_norm(x, nd, dims, keep, out);
    }
}

/* Reference reduction of xv (logical values of shape) over the dims in
 * mask; fills ref (kept dims in row-major order) and returns its size. */
static int64_t ref_reduce(int op, const double *xv, int nd, const int64_t *shape, unsigned mask, double *ref)
{
    int64_t ostride[8], s = 1, n = numel_of(nd, shape), count = 1;
    for (int d = nd - 1; d >= 0; d--) {
        ostride[d] = (mask >> d) & 1 ? 0 : s;
        if (!((mask >> d) & 1)) s *= shape[d];
        else count *= shape[d];
    }
    for (int64_t o = 0; o < s; o++) ref[o] = op == OP_MAX ? -INFINITY : 0.0;
    for (int64_t i = 0; i < n; i++) {
        int64_t p = i, o = 0;
        for (int d = nd - 1; d >= 0; d--) {
            o += (p % shape[d]) * ostride[d];
            p /= shape[d];
        }
        double v = xv[i];
        switch (op) {
        case OP_SUM:
        case OP_MEAN: ref[o] += v; break;
        case OP_NORM: ref[o] += v * v; break;
        case OP_MAX: ref[o] = (isnan(v) || v > ref[o]) ? v : ref[o]; break;
        case OP_AMAX: ref[o] = (isnan(v) || fabs(v) > ref[o]) ? fabs(v) : ref[o]; break;
        }
    }
    for (int64_t o = 0; o < s; o++) {
        if (op == OP_MEAN) ref[o] /= (double)count;
        if (op == OP_NORM) ref[o] = sqrt(ref[o]);
    }
    return s;
}

/* Tolerance of one result: output rounding (f32: 2^-24 rel, plus double
 * accumulation noise; bf16/f16: half an ulp) with margin, relative to the
 * magnitude of the terms. */
static double tol_of(lpx_dtype dt, double ref, double mag)
{
    double e = dt == LPX_BF16 ? 0x1p-8 : dt == LPX_F16 ? 0x1p-10 : 0x1p-22;
    return e * fabs(ref) + 1e-12 * mag + 1e-30;
}

/* Runs op over dims (bitmask), with keepdim, on x and compares. dims are
 * passed as negative numbers when `neg`. */
static int run_case(int op, lpx_tensor *x, unsigned mask, bool keep, bool neg, bool all_as_null)
{
    int nd = lpx_tensor_ndim(x);
    const int64_t *shape = lpx_tensor_shape(x);
    int64_t dims[8];
    int ndims = 0;
    for (int d = nd - 1; d >= 0; d--)   /* listed in descending order: order must not matter */
        if ((mask >> d) & 1) dims[ndims++] = neg ? d - nd : d;
    if (all_as_null) ndims = 0;
    lpx_tensor *y = NULL;
    lpx_status st = call_op(op, x, ndims, all_as_null ? NULL : dims, keep, &y);
    if (st) {
        fprintf(stderr, "    %s mask %x: %s\n", op_names[op], mask, lpx_last_error());
        return 1;
    }
    int bad = 0;
    /* expected shape */
    int64_t es[8];
    int end = 0;
    for (int d = 0; d < nd; d++)
        if ((mask >> d) & 1) {
            if (keep) es[end++] = 1;
        } else {
            es[end++] = shape[d];
        }
    if (lpx_tensor_ndim(y) != end) bad++;
    for (int d = 0; d < end && !bad; d++)
        if (lpx_tensor_shape(y)[d] != es[d]) bad++;
    if (lpx_tensor_dtype(y) != lpx_tensor_dtype(x)) bad++;
    if (bad) fprintf(stderr, "    %s mask %x keep %d: wrong shape or dtype\n", op_names[op], mask, keep);
    double *xv = rd(x), *yv = rd(y);
    double *ref = calloc((size_t)lpx_tensor_numel(x) + 1, sizeof *ref);
    double *mag = calloc((size_t)lpx_tensor_numel(x) + 1, sizeof *mag);
    int64_t n = ref_reduce(op, xv, nd, shape, mask, ref);
    /* magnitude: the same reduction of |x| (sum-like ops) */
    double *ax = calloc((size_t)lpx_tensor_numel(x) + 1, sizeof *ax);
    for (int64_t i = 0; i < lpx_tensor_numel(x); i++) ax[i] = fabs(xv[i]);
    ref_reduce(op == OP_NORM ? OP_NORM : OP_SUM, ax, nd, shape, mask, mag);
    for (int64_t i = 0; !bad && i < n && i < lpx_tensor_numel(y); i++) {
        bool ok = isnan(ref[i]) ? isnan(yv[i]) : fabs(yv[i] - ref[i]) <= tol_of(lpx_tensor_dtype(x), ref[i], mag[i]);
        if (!ok) {
            if (bad < 3)
                fprintf(stderr, "    %s %s mask %x keep %d: y[%lld] = %.9g, ref %.9g\n", op_names[op],
                        lpx_dtype_name(lpx_tensor_dtype(x)), mask, keep, (long long)i, yv[i], ref[i]);
            bad++;
        }
    }
    free(xv);
    free(yv);
    free(ref);
    free(mag);
    free(ax);
    lpx_tensor_release(y);
    return bad;
}

/* Every op over every subset of dims of x, keepdim both ways, positive and
 * negative dims, plus the global forms (dims NULL). */
static void all_subsets(lpx_tensor *x)
{
    int nd = lpx_tensor_ndim(x);
    for (int op = 0; op < NOPS; op++) {
        int bad = 0;
        for (unsigned mask = 1; mask < (1u << nd); mask++)
            for (int keep = 0; keep < 2; keep++) bad += run_case(op, x, mask, keep, mask & 1, false);
        for (int keep = 0; keep < 2; keep++) bad += run_case(op, x, (1u << nd) - 1, keep, false, true);
        CHECKF(bad == 0, "%s on %s: %d mismatches", op_names[op], lpx_dtype_name(lpx_tensor_dtype(x)), bad);
    }
}

static void test_f32_contiguous(void)
{
    lpx_tensor *x = mk_rand(LPX_F32, 4, (int64_t[]){2, 3, 4, 5});
    all_subsets(x);
    lpx_tensor_release(x);
    lpx_tensor *v = mk_rand(LPX_F32, 1, (int64_t[]){1000});
    all_subsets(v);
    lpx_tensor_release(v);
}

/* transposed, sliced (with step) and broadcast (stride 0) views */
static void test_f32_views(void)
{
    lpx_tensor *s = mk_rand(LPX_F32, 3, (int64_t[]){4, 6, 5});
    lpx_tensor *tr = view(s, 3, (int64_t[]){5, 6, 4}, (int64_t[]){1, 5, 30}, 0);
    all_subsets(tr);
    lpx_tensor *sl = view(s, 3, (int64_t[]){2, 3, 4}, (int64_t[]){60, 10, 1}, 7);
    all_subsets(sl);
    lpx_tensor *ex = view(s, 3, (int64_t[]){3, 4, 5}, (int64_t[]){0, 5, 1}, 5);
    all_subsets(ex);
    lpx_tensor_release(tr);
    lpx_tensor_release(sl);
    lpx_tensor_release(ex);
    lpx_tensor_release(s);
}

static void test_low_precision(void)
{
    static const lpx_dtype dts[] = {LPX_BF16, LPX_F16};
    for (int i = 0; i < 2; i++) {
        lpx_tensor *x = mk_rand(dts[i], 3, (int64_t[]){3, 4, 7});
        all_subsets(x);
        lpx_tensor *tr = view(x, 3, (int64_t[]){7, 4, 3}, (int64_t[]){1, 7, 28}, 0);
        all_subsets(tr);
        lpx_tensor_release(tr);
        lpx_tensor_release(x);
    }
}

/* Double accumulation: 2^20 copies of 0.1f sum to 2^20 * 0.1f within f32
 * output rounding; an f32 running sum would be off by about 1e-3. */
static void test_double_accumulation(void)
{
    int64_t n = 1 << 20;
    lpx_tensor *x = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, &n, lpx_cpu(), &x));
    float *p = lpx_tensor_data(x);
    for (int64_t i = 0; i < n; i++) p[i] = 0.1f;
    lpx_tensor *y = NULL;
    CHECK_OK(lpx_sum(x, 0, NULL, false, &y));
    if (y) {
        double want = (double)n * (double)0.1f;
        CHECK_NEAR(*(float *)lpx_tensor_data(y), want, want * 0x1p-23);
        CHECK(lpx_tensor_ndim(y) == 0);
    }
    lpx_tensor_release(y);
    y = NULL;
    CHECK_OK(lpx_mean(x, 1, (int64_t[]){0}, true, &y));
    if (y) {
        CHECK(lpx_tensor_ndim(y) == 1 && lpx_tensor_shape(y)[0] == 1);
        CHECK_NEAR(*(float *)lpx_tensor_data(y), (double)0.1f, 1e-8);
    }
    lpx_tensor_release(y);
    lpx_tensor_release(x);
}

static void test_nan_and_signs(void)
{
    double v[6] = {-7, 2, 3, 1, NAN, -0.5};
    lpx_tensor *x = mk(LPX_F32, 2, (int64_t[]){2, 3}, v), *y = NULL;
    CHECK_OK(lpx_amax(x, 0, NULL, false, &y));
    if (y) CHECK(isnan(*(float *)lpx_tensor_data(y)));
    lpx_tensor_release(y);
    CHECK_OK(lpx_amax(x, 1, (int64_t[]){1}, false, &y));
    if (y) {
        float *r = lpx_tensor_data(y);
        CHECK(r[0] == 7.0f);  /* |x| of a negative value */
        CHECK(isnan(r[1]));
    }
    lpx_tensor_release(y);
    CHECK_OK(lpx_max(x, 1, (int64_t[]){-1}, false, &y));
    if (y) {
        float *r = lpx_tensor_data(y);
        CHECK(r[0] == 3.0f);
        CHECK(isnan(r[1]));
    }
    lpx_tensor_release(y);
    /* NaN first in the run: still NaN */
    double w[3] = {NAN, 5, 6};
    lpx_tensor *x2 = mk(LPX_BF16, 1, (int64_t[]){3}, w);
    CHECK_OK(lpx_max(x2, 0, NULL, false, &y));
    if (y) {
        double *r = rd(y);
        CHECK(isnan(r[0]));
        free(r);
    }
    lpx_tensor_release(y);
    /* all negative: max is the largest negative, not 0 */
    double z[3] = {-3, -1, -2};
    lpx_tensor *x3 = mk(LPX_F32, 1, (int64_t[]){3}, z);
    CHECK_OK(lpx_max(x3, 0, NULL, false, &y));
    if (y) CHECK(*(float *)lpx_tensor_data(y) == -1.0f);
    lpx_tensor_release(y);
    lpx_tensor_release(x);
    lpx_tensor_release(x2);
    lpx_tensor_release(x3);
}

static void test_empty_and_scalar(void)
{
    lpx_tensor *e = mk_rand(LPX_F32, 2, (int64_t[]){0, 3}), *y = NULL;
    CHECK_OK(lpx_sum(e, 1, (int64_t[]){0}, false, &y));
    if (y) {
        CHECK(lpx_tensor_ndim(y) == 1 && lpx_tensor_shape(y)[0] == 3);
        for (int i = 0; i < 3; i++) CHECK(((float *)lpx_tensor_data(y))[i] == 0.0f);
    }
    lpx_tensor_release(y);
    CHECK_OK(lpx_mean(e, 0, NULL, false, &y));
    if (y) CHECK(isnan(*(float *)lpx_tensor_data(y)));
    lpx_tensor_release(y);
    CHECK_OK(lpx_norm(e, 0, NULL, false, &y));
    if (y) CHECK(*(float *)lpx_tensor_data(y) == 0.0f);
    lpx_tensor_release(y);
    CHECK_ERR(lpx_max(e, 0, NULL, false, &y), LPX_ESHAPE);
    CHECK_MSG("max: x [0, 3]: cannot reduce over zero elements");
    CHECK_ERR(lpx_amax(e, 1, (int64_t[]){0}, false, &y), LPX_ESHAPE);
    /* reducing dim 1 of [0, 3] leaves an empty result: no error */
    CHECK_OK(lpx_max(e, 1, (int64_t[]){1}, true, &y));
    if (y) CHECK(lpx_tensor_ndim(y) == 2 && lpx_tensor_shape(y)[0] == 0 && lpx_tensor_shape(y)[1] == 1);
    lpx_tensor_release(y);
    lpx_tensor_release(e);

    lpx_tensor *s = mk(LPX_F32, 0, NULL, (double[]){-2.5});
    CHECK_OK(lpx_amax(s, 0, NULL, true, &y));
    if (y) CHECK(lpx_tensor_ndim(y) == 0 && *(float *)lpx_tensor_data(y) == 2.5f);
    lpx_tensor_release(y);
    CHECK_OK(lpx_sum(s, 1, (int64_t[]){-1}, false, &y));
    if (y) CHECK(*(float *)lpx_tensor_data(y) == -2.5f);
    lpx_tensor_release(y);
    lpx_tensor_release(s);
}

static void test_integer(void)
{
    int64_t shape[2] = {2, 3};
    lpx_tensor *x = NULL, *y = NULL;
    CHECK_OK(lpx_tensor_new(LPX_I32, 2, shape, lpx_cpu(), &x));
    int32_t *p = lpx_tensor_data(x);
    for (int i = 0; i < 6; i++) p[i] = (i - 2) * 100;
    CHECK_OK(lpx_sum(x, 1, (int64_t[]){1}, false, &y));
    if (y) {
        CHECK(lpx_tensor_dtype(y) == LPX_I32);
        int32_t *r = lpx_tensor_data(y);
        CHECK(r[0] == -300 && r[1] == 600);
    }
    lpx_tensor_release(y);
    CHECK_OK(lpx_amax(x, 0, NULL, false, &y));
    if (y) CHECK(*(int32_t *)lpx_tensor_data(y) == 300);
    lpx_tensor_release(y);
    lpx_tensor_release(x);
}

static lpx_status redispatch_fallback(lpx_call *c) { return lpx_redispatch(c); }

static void test_errors(void)
{
    lpx_tensor *x = mk_rand(LPX_F32, 3, (int64_t[]){2, 3, 4}), *y = NULL;
    CHECK_ERR(lpx_sum(NULL, 0, NULL, false, &y), LPX_EINVAL);
    CHECK_MSG("sum");
    CHECK_ERR(lpx_sum(x, 0, NULL, false, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_mean(x, 1, (int64_t[]){3}, false, &y), LPX_ERANGE);
    CHECK_MSG("mean: dim 3 out of range for 3 dims");
    CHECK_ERR(lpx_max(x, 1, (int64_t[]){-4}, false, &y), LPX_ERANGE);
    CHECK_MSG("dim -4");
    CHECK_ERR(lpx_amax(x, 2, (int64_t[]){2, -1}, false, &y), LPX_EINVAL);
    CHECK_MSG("amax: dims lists dim 2 twice");
    CHECK_ERR(lpx_norm(x, 3, (int64_t[]){0, 1, 0}, true, &y), LPX_EINVAL);
    CHECK_MSG("twice");
    CHECK_ERR(lpx_sum(x, -1, (int64_t[]){0}, false, &y), LPX_EINVAL);
    CHECK_MSG("ndims -1");
    CHECK_ERR(lpx_sum(x, 2, NULL, false, &y), LPX_EINVAL);
    CHECK(y == NULL);

    static const lpx_kind_i kvt = {.struct_size = sizeof(lpx_kind_i), .abi_version = LPX_KIND_ABI_VERSION,
                                   .name = "test_reduce_kind", .priority = LPX_PRIORITY_PAYLOAD};
    const lpx_kind *kind = NULL;
    CHECK_OK(lpx_kind_register(&kvt, &kind));
    lpx_tensor *kt = NULL;
    CHECK_OK(lpx_tensor_new_kind(kind, LPX_F32, 3, (int64_t[]){2, 3, 4}, lpx_cpu(), &x, 1, NULL, 0, &kt));
    CHECK_ERR(lpx_sum(kt, 0, NULL, false, &y), LPX_ENOTIMPL);
    CHECK_OK(lpx_fallback_register(lpx_kind_key(kind), redispatch_fallback, NULL));
    CHECK_ERR(lpx_amax(kt, 0, NULL, false, &y), LPX_EINVAL);
    CHECK_MSG("test_reduce_kind");
    CHECK(y == NULL);
    lpx_tensor_release(kt);
    CHECK_OK(lpx_kind_unregister(kind));
    lpx_tensor_release(x);
}

static void test_oom(void)
{
    lpx_tensor *x = mk_rand(LPX_BF16, 2, (int64_t[]){5, 6});
    for (long n = 0; n < 6; n++)
        for (int op = 0; op < NOPS; op++) {
            lpx_tensor *y = NULL;
            lpx__fail_alloc_after(n);
            lpx_status st = call_op(op, x, 1, (int64_t[]){0}, false, &y);
            lpx__fail_alloc_after(-1);
            CHECK(st == LPX_OK || st == LPX_ENOMEM);
            CHECK((st == LPX_OK) == (y != NULL));
            lpx_tensor_release(y);
        }
    lpx_tensor_release(x);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_f32_contiguous);
    RUN(test_f32_views);
    RUN(test_low_precision);
    RUN(test_double_accumulation);
    RUN(test_nan_and_signs);
    RUN(test_empty_and_scalar);
    RUN(test_integer);
    RUN(test_errors);
    RUN(test_oom);
    return CHECK_DONE();
}
