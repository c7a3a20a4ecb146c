/* Views and layout ops: geometry, values against references computed here,
 * storage sharing (writes through a view are seen by the base), copies
 * when a view is impossible, split/chunk (also on a kind that implements
 * only narrow), lpx_item, and bad input. */
#include <stdint.h>
#include "check.h"
#include "lpx/lpx.h"

static double item(const lpx_tensor *t, int64_t i)
{
    double v = NAN;
    CHECK_OK(lpx_item(t, i, &v));
    return v;
}

/* New tensor whose element i (row-major) holds i, in dtype d. */
static lpx_tensor *iota(lpx_dtype d, int ndim, const int64_t *shape)
{
    lpx_tensor *t = NULL, *r = NULL;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    CHECK_OK(lpx_arange(0, (double)n, 1, d, lpx_cpu(), &r));
    if (r) CHECK_OK(lpx_reshape(r, ndim, shape, &t));
    lpx_tensor_release(r);
    return t;
}

static bool has_shape(const lpx_tensor *t, int ndim, const int64_t *shape)
{
    if (!t || lpx_tensor_ndim(t) != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (lpx_tensor_shape(t)[i] != shape[i]) return false;
    return true;
}

static bool has_strides(const lpx_tensor *t, const int64_t *strides)
{
    for (int i = 0; t && i < lpx_tensor_ndim(t); i++)
        if (lpx_tensor_shape(t)[i] > 1 && lpx_tensor_strides(t)[i] != strides[i]) return false;
    return t != NULL;
}

/* Element at multi-index idx of t, through lpx_item's flat index. */
static double at(const lpx_tensor *t, const int64_t *idx)
{
    int64_t flat = 0;
    for (int i = 0; i < lpx_tensor_ndim(t); i++) flat = flat * lpx_tensor_shape(t)[i] + idx[i];
    return item(t, flat);
}

/* Advances a multi-index in row-major order. */
static void next_index(int ndim, const int64_t *shape, int64_t *idx)
{
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return;
        idx[d] = 0;
    }
}

static void test_view(void)
{
    const int64_t s[] = {2, 3, 4};
    lpx_tensor *x = iota(LPX_F32, 3, s), *v = NULL;
    if (!x) return;
    const int64_t s1[] = {6, 4}, s2[] = {-1}, s3[] = {4, -1, 2}, s4[] = {2, 1, 12, 1};
    const int64_t *shapes[] = {s1, s2, s3, s4};
    const int nds[] = {2, 1, 3, 4};
    for (int k = 0; k < 4; k++) {
        CHECK_OK(lpx_view(x, nds[k], shapes[k], &v));
        if (!v) continue;
        CHECK(lpx_tensor_numel(v) == 24 && lpx_tensor_shares_storage(v, x) && lpx_tensor_is_contiguous(v));
        for (int64_t i = 0; i < 24; i++) CHECK(item(v, i) == (double)i);
        lpx_tensor_release(v);
    }
    CHECK_OK(lpx_view(x, 3, s3, &v));
    const int64_t want3[] = {4, 3, 2};
    CHECK(has_shape(v, 3, want3));
    /* a write through the view is seen through the base */
    if (v) ((float *)lpx_tensor_data(v))[5] = -1.5f;
    CHECK(item(x, 5) == -1.5);
    lpx_tensor_release(v);

    /* non-contiguous but chunk-compatible: narrow dim 1 of [4, 6] */
    const int64_t s46[] = {4, 6};
    lpx_tensor *y = iota(LPX_F32, 2, s46), *n = NULL;
    CHECK_OK(lpx_narrow(y, 1, 1, 3, &n));
    const int64_t a[] = {2, 2, 3}, b[] = {4, 3, 1}, bad[] = {12};
    CHECK_OK(lpx_view(n, 3, a, &v));
    const int64_t sa[] = {12, 6, 1};
    CHECK(has_shape(v, 3, a) && has_strides(v, sa));
    if (v) CHECK(item(v, 4) == 8.0); /* n[1][1] = y[1][2] */
    lpx_tensor_release(v);
    CHECK_OK(lpx_view(n, 3, b, &v));
    CHECK(has_shape(v, 3, b));
    lpx_tensor_release(v);
    CHECK_ERR(lpx_view(n, 1, bad, &v), LPX_ESHAPE);
    CHECK(v == NULL);
    /* a transposed tensor cannot be flattened without a copy */
    lpx_tensor *tt = NULL;
    CHECK_OK(lpx_t(y, &tt));
    CHECK_ERR(lpx_view(tt, 1, s2, &v), LPX_ESHAPE);
    lpx_tensor_release(tt);
    lpx_tensor_release(n);
    lpx_tensor_release(y);

    /* bad shapes */
    const int64_t two_inf[] = {-1, -1}, wrong[] = {5, 5}, negd[] = {-2, 12}, ovf[] = {1ll << 40, 1ll << 40, 0};
    const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 2, 12};
    CHECK_ERR(lpx_view(x, 2, two_inf, &v), LPX_EINVAL);
    CHECK_ERR(lpx_view(x, 2, wrong, &v), LPX_ESHAPE);
    CHECK_ERR(lpx_view(x, 2, negd, &v), LPX_EINVAL);
    CHECK_ERR(lpx_view(x, 2, ovf, &v), LPX_ERANGE);
    CHECK_ERR(lpx_view(x, 9, nine, &v), LPX_EINVAL);
    CHECK_ERR(lpx_view(x, -1, s1, &v), LPX_EINVAL);
    CHECK_ERR(lpx_view(x, 2, NULL, &v), LPX_EINVAL);
    CHECK_ERR(lpx_view(NULL, 2, s1, &v), LPX_EINVAL);
    CHECK_ERR(lpx_view(x, 2, s1, NULL), LPX_EINVAL);
    const int64_t s5[] = {5, -1};
    CHECK_ERR(lpx_view(x, 2, s5, &v), LPX_ESHAPE);
    lpx_tensor_release(x);

    /* -1 cannot be inferred for 0 elements */
    const int64_t z[] = {0, 4}, zi[] = {-1, 0};
    lpx_tensor *e = NULL;
    CHECK_OK(lpx_zeros(2, z, LPX_F32, lpx_cpu(), &e));
    CHECK_ERR(lpx_view(e, 2, zi, &v), LPX_ESHAPE);
    const int64_t z2[] = {2, 0, 3};
    CHECK_OK(lpx_view(e, 3, z2, &v));
    CHECK(has_shape(v, 3, z2));
    lpx_tensor_release(v);
    lpx_tensor_release(e);
}

static void test_reshape(void)
{
    const int64_t s[] = {3, 4};
    lpx_tensor *x = iota(LPX_BF16, 2, s), *t = NULL, *r = NULL;
    const int64_t flat[] = {-1}, s26[] = {2, 6};
    CHECK_OK(lpx_reshape(x, 2, s26, &r));
    CHECK(r && lpx_tensor_shares_storage(r, x));
    lpx_tensor_release(r);
    CHECK_OK(lpx_t(x, &t));
    CHECK_OK(lpx_reshape(t, 1, flat, &r));
    if (r) {
        CHECK(!lpx_tensor_shares_storage(r, x) && lpx_tensor_numel(r) == 12 && lpx_tensor_dtype(r) == LPX_BF16);
        /* row-major order of the transpose: r[i*3 + j] = x[j][i] */
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 3; j++) CHECK(item(r, i * 3 + j) == (double)(j * 4 + i));
    }
    lpx_tensor_release(r);
    const int64_t bad[] = {5};
    CHECK_ERR(lpx_reshape(t, 1, bad, &r), LPX_ESHAPE);
    lpx_tensor_release(t);
    lpx_tensor_release(x);
}

static void test_transpose_t_permute(void)
{
    const int64_t s[] = {2, 3, 4};
    lpx_tensor *x = iota(LPX_F32, 3, s), *y = NULL;
    if (!x) return;
    CHECK_OK(lpx_transpose(x, 0, -1, &y));
    const int64_t ws[] = {4, 3, 2}, wst[] = {1, 4, 12};
    CHECK(has_shape(y, 3, ws) && has_strides(y, wst) && lpx_tensor_shares_storage(x, y));
    if (y) {
        int64_t idx[3] = {0, 0, 0};
        for (int64_t k = 0; k < 24; k++, next_index(3, ws, idx))
            CHECK(at(y, idx) == (double)(idx[2] * 12 + idx[1] * 4 + idx[0]));
    }
    lpx_tensor_release(y);
    CHECK_ERR(lpx_transpose(x, 0, 3, &y), LPX_ERANGE);
    CHECK_ERR(lpx_transpose(x, -4, 0, &y), LPX_ERANGE);

    const int64_t p[] = {2, 0, 1};
    CHECK_OK(lpx_permute(x, 3, p, &y));
    const int64_t ps[] = {4, 2, 3};
    CHECK(has_shape(y, 3, ps));
    if (y) {
        int64_t idx[3] = {0, 0, 0};
        for (int64_t k = 0; k < 24; k++, next_index(3, ps, idx))
            CHECK(at(y, idx) == (double)(idx[1] * 12 + idx[2] * 4 + idx[0]));
    }
    lpx_tensor_release(y);
    const int64_t rep[] = {0, 0, 1}, oor[] = {0, 1, 3}, neg[] = {-1, -2, -3};
    CHECK_ERR(lpx_permute(x, 3, rep, &y), LPX_EINVAL);
    CHECK_ERR(lpx_permute(x, 3, oor, &y), LPX_ERANGE);
    CHECK_ERR(lpx_permute(x, 2, p, &y), LPX_ESHAPE);
    CHECK_OK(lpx_permute(x, 3, neg, &y));
    CHECK(has_shape(y, 3, ws));
    lpx_tensor_release(y);

    CHECK_ERR(lpx_t(x, &y), LPX_ESHAPE);
    lpx_tensor *m = NULL, *v = NULL;
    const int64_t s2[] = {3, 5};
    m = iota(LPX_F16, 2, s2);
    CHECK_OK(lpx_t(m, &y));
    const int64_t s2t[] = {5, 3};
    CHECK(has_shape(y, 2, s2t));
    if (y) CHECK(item(y, 1) == 5.0);
    lpx_tensor_release(y);
    const int64_t n1 = 5;
    CHECK_OK(lpx_arange(0, 5, 1, LPX_F32, lpx_cpu(), &v));
    CHECK_OK(lpx_t(v, &y));
    CHECK(has_shape(y, 1, &n1) && y != v && lpx_tensor_shares_storage(y, v));
    lpx_tensor_release(y);
    lpx_tensor_release(v);
    lpx_tensor_release(m);
    lpx_tensor_release(x);
}

/* python's slice.indices() length, for the reference */
static int64_t py_slice(int64_t size, int64_t start, int64_t end, int64_t step, int64_t *first)
{
    if (start < 0) start += size;
    if (start < 0) start = 0;
    if (start > size) start = size;
    if (end < 0) end += size;
    if (end < 0) end = 0;
    if (end > size) end = size;
    *first = start;
    return end > start ? (end - start + step - 1) / step : 0;
}

static void test_slice(void)
{
    const int64_t s[] = {3, 10};
    lpx_tensor *x = iota(LPX_F32, 2, s);
    if (!x) return;
    const int64_t cases[][3] = {
        {0, 10, 1}, {2, 8, 3}, {-3, 10, 1}, {-100, 100, 4}, {7, 2, 1}, {5, -1, 2}, {0, 0, 1},
        {9, 10, 5}, {-1, -100, 1}, {1, INT64_MAX, 3}, {INT64_MIN, 3, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        lpx_tensor *y = NULL;
        CHECK_OK(lpx_slice(x, -1, cases[k][0], cases[k][1], cases[k][2], &y));
        if (!y) continue;
        int64_t first, len = py_slice(10, cases[k][0], cases[k][1], cases[k][2], &first);
        const int64_t ws[] = {3, len};
        CHECKF(has_shape(y, 2, ws), "slice %zu: len %lld, want %lld", k, (long long)lpx_tensor_shape(y)[1],
               (long long)len);
        for (int64_t r = 0; r < 3; r++)
            for (int64_t j = 0; j < len && has_shape(y, 2, ws); j++)
                CHECK(item(y, r * len + j) == (double)(r * 10 + first + j * cases[k][2]));
        CHECK(lpx_tensor_shares_storage(x, y));
        lpx_tensor_release(y);
    }
    /* slice of a slice, dim 0 */
    lpx_tensor *a = NULL, *b = NULL;
    CHECK_OK(lpx_slice(x, 1, 1, 10, 2, &a)); /* cols 1,3,5,7,9 */
    CHECK_OK(lpx_slice(a, 1, 1, 5, 2, &b));  /* cols 3,7 */
    if (b) CHECK(item(b, 3) == 17.0 && lpx_tensor_numel(b) == 6);
    lpx_tensor_release(b);
    CHECK_OK(lpx_slice(x, 0, 2, 3, 1, &b));
    if (b) CHECK(item(b, 0) == 20.0 && lpx_tensor_numel(b) == 10);
    lpx_tensor_release(b);
    lpx_tensor_release(a);
    lpx_tensor *y = NULL;
    CHECK_ERR(lpx_slice(x, 0, 0, 3, 0, &y), LPX_EINVAL);
    CHECK_ERR(lpx_slice(x, 0, 0, 3, -1, &y), LPX_EINVAL);
    CHECK_ERR(lpx_slice(x, 2, 0, 3, 1, &y), LPX_ERANGE);
    CHECK_ERR(lpx_slice(x, -3, 0, 3, 1, &y), LPX_ERANGE);
    lpx_tensor *sc = NULL;
    CHECK_OK(lpx_full(0, NULL, 1, LPX_F32, lpx_cpu(), &sc));
    CHECK_ERR(lpx_slice(sc, 0, 0, 1, 1, &y), LPX_ERANGE);
    CHECK_ERR(lpx_narrow(sc, 0, 0, 1, &y), LPX_ERANGE);
    lpx_tensor_release(sc);
    lpx_tensor_release(x);
}

static void test_narrow(void)
{
    const int64_t s[] = {4, 5};
    lpx_tensor *x = iota(LPX_I32, 2, s), *y = NULL;
    if (!x) return;
    CHECK_OK(lpx_narrow(x, 0, 1, 2, &y));
    const int64_t w[] = {2, 5};
    CHECK(has_shape(y, 2, w) && lpx_tensor_shares_storage(x, y));
    if (y) CHECK(item(y, 0) == 5.0 && item(y, 9) == 14.0);
    lpx_tensor_release(y);
    CHECK_OK(lpx_narrow(x, -1, -2, 2, &y)); /* last two columns */
    if (y) CHECK(item(y, 0) == 3.0 && item(y, 7) == 19.0);
    lpx_tensor_release(y);
    CHECK_OK(lpx_narrow(x, 1, 5, 0, &y));
    if (y) CHECK(lpx_tensor_numel(y) == 0);
    lpx_tensor_release(y);
    CHECK_ERR(lpx_narrow(x, 0, 3, 2, &y), LPX_ERANGE);
    CHECK_ERR(lpx_narrow(x, 0, 5, 0, &y), LPX_ERANGE);
    CHECK_ERR(lpx_narrow(x, 0, -5, 1, &y), LPX_ERANGE);
    CHECK_ERR(lpx_narrow(x, 0, 0, -1, &y), LPX_ERANGE);
    CHECK_ERR(lpx_narrow(x, 2, 0, 1, &y), LPX_ERANGE);
    CHECK_ERR(lpx_narrow(x, 0, INT64_MAX, INT64_MAX, &y), LPX_ERANGE);
    CHECK(y == NULL);
    lpx_tensor_release(x);
}

static void test_expand(void)
{
    const int64_t s[] = {3, 1};
    lpx_tensor *x = iota(LPX_F32, 2, s), *y = NULL;
    if (!x) return;
    const int64_t to[] = {2, -1, 4}, want[] = {2, 3, 4};
    CHECK_OK(lpx_expand(x, 3, to, &y));
    CHECK(has_shape(y, 3, want) && lpx_tensor_shares_storage(x, y));
    if (y) {
        CHECK(lpx_tensor_strides(y)[0] == 0 && lpx_tensor_strides(y)[2] == 0);
        int64_t idx[3] = {0, 0, 0};
        for (int k = 0; k < 24; k++, next_index(3, want, idx)) CHECK(at(y, idx) == (double)idx[1]);
    }
    lpx_tensor_release(y);
    const int64_t bad[] = {4, 4}, lead[] = {-1, 3, 1}, few[] = {3}, ovf[] = {1ll << 40, 1ll << 40, 3, 1};
    CHECK_ERR(lpx_expand(x, 2, bad, &y), LPX_ESHAPE);
    CHECK_ERR(lpx_expand(x, 3, lead, &y), LPX_EINVAL);
    CHECK_ERR(lpx_expand(x, 1, few, &y), LPX_ESHAPE);
    CHECK_ERR(lpx_expand(x, 4, ovf, &y), LPX_ERANGE);
    lpx_tensor_release(x);
}

static void test_contiguous_clone_detach(void)
{
    const int64_t s[] = {3, 4};
    lpx_tensor *x = iota(LPX_F16, 2, s), *y = NULL, *t = NULL;
    if (!x) return;
    CHECK_OK(lpx_contiguous(x, &y));
    CHECK(y == x && lpx_tensor_refcount(x) == 2);
    lpx_tensor_release(y);
    CHECK_OK(lpx_t(x, &t));
    CHECK_OK(lpx_contiguous(t, &y));
    CHECK(y && y != t && lpx_tensor_is_contiguous(y) && !lpx_tensor_shares_storage(y, x));
    for (int64_t i = 0; y && i < 12; i++) CHECK(item(y, i) == item(t, i));
    lpx_tensor_release(y);
    CHECK_OK(lpx_clone(t, &y));
    CHECK(y && lpx_tensor_is_contiguous(y) && !lpx_tensor_shares_storage(y, x) && lpx_tensor_dtype(y) == LPX_F16);
    for (int64_t i = 0; y && i < 12; i++) CHECK(item(y, i) == item(t, i));
    lpx_tensor_release(y);
    CHECK_OK(lpx_clone(x, &y)); /* clone of a contiguous tensor still copies */
    CHECK(y && !lpx_tensor_shares_storage(y, x));
    lpx_tensor_release(y);
    CHECK_OK(lpx_detach(t, &y));
    CHECK(y && y != t && lpx_tensor_shares_storage(y, x) && lpx_tensor_strides(y)[0] == 1);
    lpx_tensor_release(y);
    lpx_tensor_release(t);
    lpx_tensor_release(x);
}

static void test_cat(void)
{
    const int64_t sa[] = {2, 3}, sb[] = {4, 3};
    lpx_tensor *a = iota(LPX_F32, 2, sa), *b = iota(LPX_F32, 2, sb), *bt = NULL, *y = NULL;
    if (!a || !b) goto out;
    lpx_tensor *xs[3] = {a, b, a};
    CHECK_OK(lpx_cat(xs, 3, 0, &y));
    const int64_t w0[] = {8, 3};
    CHECK(has_shape(y, 2, w0));
    for (int64_t i = 0; y && i < 24; i++) {
        double want = i < 6 ? (double)i : i < 18 ? (double)(i - 6) : (double)(i - 18);
        CHECK(item(y, i) == want);
    }
    lpx_tensor_release(y);
    /* along dim 1 with a transposed (non-contiguous) input */
    const int64_t s32[] = {3, 2};
    lpx_tensor *c = iota(LPX_F32, 2, s32);
    CHECK_OK(lpx_t(c, &bt)); /* [2, 3] */
    lpx_tensor *ys[2] = {a, bt};
    CHECK_OK(lpx_cat(ys, 2, -1, &y));
    const int64_t w1[] = {2, 6};
    CHECK(has_shape(y, 2, w1));
    for (int64_t r = 0; y && r < 2; r++)
        for (int64_t j = 0; j < 6; j++)
            CHECK(item(y, r * 6 + j) == (j < 3 ? (double)(r * 3 + j) : (double)((j - 3) * 2 + r)));
    lpx_tensor_release(y);
    lpx_tensor_release(c);
    /* legacy: 1-D empty tensors are skipped */
    lpx_tensor *e = NULL;
    const int64_t z = 0;
    CHECK_OK(lpx_empty(1, &z, LPX_F32, lpx_cpu(), &e));
    lpx_tensor *zs[3] = {e, a, e};
    CHECK_OK(lpx_cat(zs, 3, 1, &y));
    CHECK(has_shape(y, 2, sa));
    lpx_tensor_release(y);
    /* errors */
    lpx_tensor *h = NULL, *sc = NULL;
    CHECK_OK(lpx_zeros(2, sa, LPX_BF16, lpx_cpu(), &h));
    lpx_tensor *mixed[2] = {a, h};
    CHECK_ERR(lpx_cat(mixed, 2, 0, &y), LPX_EDTYPE);
    lpx_tensor *shp[2] = {a, b};
    CHECK_ERR(lpx_cat(shp, 2, 1, &y), LPX_ESHAPE);
    CHECK_ERR(lpx_cat(shp, 2, 2, &y), LPX_ERANGE);
    CHECK_ERR(lpx_cat(shp, 0, 0, &y), LPX_EINVAL);
    CHECK_ERR(lpx_cat(shp, -1, 0, &y), LPX_EINVAL);
    CHECK_ERR(lpx_cat(NULL, 2, 0, &y), LPX_EINVAL);
    lpx_tensor *withnull[2] = {a, NULL};
    CHECK_ERR(lpx_cat(withnull, 2, 0, &y), LPX_EINVAL);
    CHECK_OK(lpx_full(0, NULL, 1, LPX_F32, lpx_cpu(), &sc));
    lpx_tensor *scs[2] = {sc, sc};
    CHECK_ERR(lpx_cat(scs, 2, 0, &y), LPX_ESHAPE);
    const int64_t s1x3[] = {1, 2, 3};
    lpx_tensor *d3 = NULL;
    CHECK_OK(lpx_zeros(3, s1x3, LPX_F32, lpx_cpu(), &d3));
    lpx_tensor *nd[2] = {a, d3};
    CHECK_ERR(lpx_cat(nd, 2, 0, &y), LPX_ESHAPE);
    CHECK(y == NULL);
    lpx_tensor_release(d3);
    lpx_tensor_release(sc);
    lpx_tensor_release(h);
    lpx_tensor_release(e);
out:
    lpx_tensor_release(bt);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
}

static void test_split_chunk(void)
{
    const int64_t s[] = {7, 2};
    lpx_tensor *x = iota(LPX_F32, 2, s), *p[8] = {NULL};
    int n = -1;
    if (!x) return;
    CHECK_OK(lpx_split(x, 3, 0, p, 8, &n));
    CHECK(n == 3);
    const int64_t lens[] = {3, 3, 1};
    for (int i = 0; i < n && i < 3; i++) {
        CHECK(lpx_tensor_shape(p[i])[0] == lens[i] && lpx_tensor_shares_storage(p[i], x));
        CHECK(item(p[i], 0) == (double)(i * 6));
        lpx_tensor_release(p[i]);
    }
    CHECK_OK(lpx_chunk(x, 3, 0, p, 8, &n)); /* ceil(7/3) = 3: 3, 3, 1 */
    CHECK(n == 3);
    for (int i = 0; i < n; i++) lpx_tensor_release(p[i]);
    CHECK_OK(lpx_chunk(x, 6, 0, p, 8, &n)); /* size 2: 2, 2, 2, 1 (fewer than 6) */
    CHECK(n == 4 && lpx_tensor_shape(p[3])[0] == 1);
    for (int i = 0; i < n; i++) lpx_tensor_release(p[i]);
    CHECK_OK(lpx_chunk(x, 2, -1, p, 8, &n));
    CHECK(n == 2 && lpx_tensor_shape(p[1])[1] == 1);
    if (n == 2) CHECK(item(p[1], 1) == 3.0);
    for (int i = 0; i < n; i++) lpx_tensor_release(p[i]);
    CHECK_ERR(lpx_split(x, 1, 0, p, 6, &n), LPX_ERANGE);
    CHECK(n == 0);
    CHECK_ERR(lpx_split(x, 0, 0, p, 8, &n), LPX_EINVAL);
    CHECK_ERR(lpx_split(x, 2, 2, p, 8, &n), LPX_ERANGE);
    CHECK_ERR(lpx_split(NULL, 2, 0, p, 8, &n), LPX_EINVAL);
    CHECK_ERR(lpx_split(x, 2, 0, NULL, 8, &n), LPX_EINVAL);
    CHECK_ERR(lpx_split(x, 2, 0, p, 8, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_chunk(x, 0, 0, p, 8, &n), LPX_EINVAL);
    CHECK_ERR(lpx_chunk(x, 3, 0, p, 2, &n), LPX_ERANGE);
    lpx_tensor_release(x);
    /* empty dim: split gives one empty piece, chunk keeps the count */
    const int64_t z[] = {0, 3};
    lpx_tensor *e = NULL;
    CHECK_OK(lpx_zeros(2, z, LPX_F32, lpx_cpu(), &e));
    CHECK_OK(lpx_split(e, 2, 0, p, 8, &n));
    CHECK(n == 1);
    for (int i = 0; i < n; i++) lpx_tensor_release(p[i]);
    CHECK_OK(lpx_chunk(e, 3, 0, p, 8, &n));
    CHECK(n == 3);
    for (int i = 0; i < n; i++) CHECK(lpx_tensor_numel(p[i]) == 0);
    for (int i = 0; i < n; i++) lpx_tensor_release(p[i]);
    lpx_tensor_release(e);
}

/* ---- a kind that implements only narrow (and fails on request) ---------- */

static const lpx_kind *box_kind;
static int narrow_calls, narrow_fail_at = -1;

static lpx_status box_narrow(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t, *inner = NULL, *out = NULL;
    if (narrow_calls++ == narrow_fail_at) return lpx_error(LPX_ENOMEM, "narrow(box): injected failure");
    lpx_status st = lpx_narrow(lpx_tensor_inner(x, 0), c->args[1].u.i, c->args[2].u.i, c->args[3].u.i, &inner);
    if (st) return st;
    st = lpx_tensor_new_kind(box_kind, lpx_tensor_dtype(x), lpx_tensor_ndim(inner), lpx_tensor_shape(inner),
                             lpx_cpu(), &inner, 1, NULL, 0, &out);
    lpx_tensor_release(inner);
    if (st) return st;
    c->rets[c->nrets++] = lpx_v_tensor(out);
    return LPX_OK;
}

static lpx_status box_fallback(lpx_call *c) { return lpx_redispatch(c); }

static lpx_tensor *make_box(int ndim, const int64_t *shape)
{
    lpx_tensor *inner = iota(LPX_F32, ndim, shape), *b = NULL;
    if (inner) CHECK_OK(lpx_tensor_new_kind(box_kind, LPX_F32, ndim, shape, lpx_cpu(), &inner, 1, NULL, 0, &b));
    lpx_tensor_release(inner);
    return b;
}

static void test_kind(void)
{
    lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = "test_views_box",
                     .priority = LPX_PRIORITY_PAYLOAD};
    CHECK_OK(lpx_kind_register(&vt, &box_kind));
    if (!box_kind) return;
    CHECK_OK(lpx_kernel_register(LPX_OP_narrow, lpx_kind_key(box_kind), box_narrow, NULL));
    const int64_t s[] = {5, 4};
    lpx_tensor *b = make_box(2, s), *p[4] = {NULL}, *y = NULL;
    int n = -1;
    if (!b) return;
    /* split and chunk come for free from narrow */
    CHECK_OK(lpx_split(b, 2, 0, p, 4, &n));
    CHECK(n == 3);
    for (int i = 0; i < n; i++) {
        CHECK(lpx_tensor_kind(p[i]) == box_kind && lpx_tensor_shape(p[i])[0] == (i < 2 ? 2 : 1));
        CHECK(item(lpx_tensor_inner(p[i], 0), 0) == (double)(i * 8));
        lpx_tensor_release(p[i]);
    }
    /* a failure in the middle releases the pieces already made */
    narrow_calls = 0;
    narrow_fail_at = 1;
    CHECK_ERR(lpx_chunk(b, 3, 0, p, 4, &n), LPX_ENOMEM);
    CHECK(n == 0 && p[0] == NULL);
    narrow_fail_at = -1;
    CHECK(lpx_kind_live_tensors(box_kind) == 1);

    /* dense-only ops: no kernel and no fallback -> ENOTIMPL; with a
     * fallback that redispatches, the cpu kernel refuses the kind tensor */
    CHECK_ERR(lpx_t(b, &y), LPX_ENOTIMPL);
    CHECK_OK(lpx_fallback_register(lpx_kind_key(box_kind), box_fallback, NULL));
    CHECK_ERR(lpx_t(b, &y), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "test_views_box") != NULL);
    const int64_t flat = -1;
    CHECK_ERR(lpx_view(b, 1, &flat, &y), LPX_EINVAL);
    CHECK_ERR(lpx_contiguous(b, &y), LPX_EINVAL);
    lpx_tensor *xs[2] = {b, b};
    CHECK_ERR(lpx_cat(xs, 2, 0, &y), LPX_EINVAL);
    CHECK(y == NULL);
    double v;
    CHECK_ERR(lpx_item(b, 0, &v), LPX_EINVAL);
    lpx_tensor_release(b);
    CHECK(lpx_kind_live_tensors(box_kind) == 0);
    CHECK_OK(lpx_kind_unregister(box_kind));
}

static void test_item(void)
{
    const int64_t s[] = {2, 3};
    lpx_tensor *x = iota(LPX_I64, 2, s), *t = NULL, *big = NULL;
    double v = 0;
    if (!x) return;
    CHECK_OK(lpx_t(x, &t));
    CHECK(item(t, 1) == 3.0 && item(t, 5) == 5.0);
    CHECK_ERR(lpx_item(t, 6, &v), LPX_ERANGE);
    CHECK_ERR(lpx_item(t, -1, &v), LPX_ERANGE);
    CHECK_ERR(lpx_item(NULL, 0, &v), LPX_EINVAL);
    CHECK_ERR(lpx_item(t, 0, NULL), LPX_EINVAL);
    /* i64 values beyond 2^24 come back exactly */
    CHECK_OK(lpx_full(0, NULL, 0, LPX_I64, lpx_cpu(), &big));
    if (big) {
        *(int64_t *)lpx_tensor_data(big) = (1ll << 40) + 1;
        CHECK(item(big, 0) == (double)((1ll << 40) + 1));
    }
    lpx_tensor_release(big);
    lpx_tensor_release(t);
    lpx_tensor_release(x);
}

int main(void)
{
    RUN(test_view);
    RUN(test_reshape);
    RUN(test_transpose_t_permute);
    RUN(test_slice);
    RUN(test_narrow);
    RUN(test_expand);
    RUN(test_contiguous_clone_detach);
    RUN(test_cat);
    RUN(test_split_chunk);
    RUN(test_kind);
    RUN(test_item);
    return CHECK_DONE();
}
