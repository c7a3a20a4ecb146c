/* Tensor handles: creation, from_blob ownership, views, refcounts, kind
 * payloads, and the errors of each. */
#include <stdint.h>
#include "check.h"

static int deleter_calls;
static void count_deleter(void *data, void *ctx) { (void)data; deleter_calls += ctx == (void *)0x1234; }

static void test_new_and_accessors(void)
{
    int64_t shape[3] = {2, 3, 4};
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 3, shape, lpx_cpu(), &t));
    CHECK(lpx_tensor_ndim(t) == 3);
    CHECK(lpx_tensor_numel(t) == 24);
    CHECK(lpx_tensor_strides(t)[0] == 12 && lpx_tensor_strides(t)[1] == 4 && lpx_tensor_strides(t)[2] == 1);
    CHECK(lpx_tensor_dtype(t) == LPX_F32);
    CHECK(lpx_tensor_kind(t) == NULL);
    CHECK(lpx_tensor_is_contiguous(t));
    CHECK(((uintptr_t)lpx_tensor_data(t) % 64) == 0);
    CHECK(lpx_tensor_keys(t) == (UINT64_C(1) << LPX_KEY_CPU));
    CHECK(lpx_tensor_refcount(t) == 1);
    lpx_tensor_retain(t);
    CHECK(lpx_tensor_refcount(t) == 2);
    lpx_tensor_release(t);
    char buf[64];
    CHECK(strcmp(lpx_tensor_shape_str(t, buf, sizeof buf), "[2, 3, 4]") == 0);
    lpx_tensor_release(t);

    lpx_tensor *s = NULL; /* scalar */
    CHECK_OK(lpx_tensor_new(LPX_BF16, 0, NULL, lpx_cpu(), &s));
    CHECK(lpx_tensor_numel(s) == 1 && lpx_tensor_ndim(s) == 0);
    lpx_tensor_release(s);
    lpx_tensor *z = NULL; /* zero elements */
    int64_t zs[2] = {0, 5};
    CHECK_OK(lpx_tensor_new(LPX_F8E4M3FN, 2, zs, lpx_cpu(), &z));
    CHECK(lpx_tensor_numel(z) == 0);
    lpx_tensor_release(z);
    lpx_tensor_release(NULL); /* ignored */
}

static void test_new_errors(void)
{
    lpx_tensor *t = (lpx_tensor *)0x1;
    int64_t bad[2] = {2, -1};
    CHECK_ERR(lpx_tensor_new(LPX_F32, 2, bad, lpx_cpu(), &t), LPX_EINVAL);
    CHECK(t == NULL);
    int64_t ok[1] = {4};
    CHECK_ERR(lpx_tensor_new(LPX_F32, 9, ok, lpx_cpu(), &t), LPX_EINVAL);
    CHECK_ERR(lpx_tensor_new(LPX_F32, 1, NULL, lpx_cpu(), &t), LPX_EINVAL);
    CHECK_ERR(lpx_tensor_new(99, 1, ok, lpx_cpu(), &t), LPX_EDTYPE);
    CHECK_ERR(lpx_tensor_new(LPX_F32, 1, ok, lpx_cpu(), NULL), LPX_EINVAL);
    lpx_device gpu = {LPX_DEVICE_CUDA, 0};
    CHECK_ERR(lpx_tensor_new(LPX_F32, 1, ok, gpu, &t), LPX_EDEVICE);
    int64_t huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 4};
    CHECK_ERR(lpx_tensor_new(LPX_F32, 3, huge, lpx_cpu(), &t), LPX_ERANGE);
    int64_t big[2] = {INT64_C(1) << 31, INT64_C(1) << 31}; /* numel fits, bytes do not */
    CHECK_ERR(lpx_tensor_new(LPX_F32, 2, big, lpx_cpu(), &t), LPX_ERANGE);
}

static void test_from_blob(void)
{
    float buf[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3};
    lpx_tensor *t = NULL;
    deleter_calls = 0;
    CHECK_OK(lpx_tensor_from_blob(buf, LPX_F32, 2, shape, NULL, lpx_cpu(), count_deleter, (void *)0x1234, &t));
    CHECK(lpx_tensor_data(t) == buf);
    /* a transposed view shares the storage and keeps the blob alive */
    int64_t tshape[2] = {3, 2}, tstr[2] = {1, 3};
    lpx_tensor *v = NULL;
    CHECK_OK(lpx_tensor_view_of(t, 2, tshape, tstr, 0, &v));
    CHECK(lpx_tensor_shares_storage(t, v));
    CHECK(!lpx_tensor_is_contiguous(v));
    lpx_tensor_release(t);
    CHECK(deleter_calls == 0);
    CHECK(((float *)lpx_tensor_data(v))[lpx_tensor_strides(v)[0] * 2 + lpx_tensor_strides(v)[1] * 1] == 6.0f);
    lpx_tensor_release(v);
    CHECK(deleter_calls == 1);

    /* caller strides: every other element */
    float wide[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int64_t s4[1] = {4}, st2[1] = {2};
    CHECK_OK(lpx_tensor_from_blob(wide, LPX_F32, 1, s4, st2, lpx_cpu(), NULL, NULL, &t));
    CHECK(!lpx_tensor_is_contiguous(t));
    double x;
    lpx_tensor_release(t);
    (void)x;

    /* failure does not call the deleter: the buffer stays the caller's */
    deleter_calls = 0;
    int64_t neg[1] = {-3};
    CHECK_ERR(lpx_tensor_from_blob(buf, LPX_F32, 1, neg, NULL, lpx_cpu(), count_deleter, (void *)0x1234, &t), LPX_EINVAL);
    CHECK(deleter_calls == 0);
    CHECK_ERR(lpx_tensor_from_blob(NULL, LPX_F32, 2, shape, NULL, lpx_cpu(), NULL, NULL, &t), LPX_EINVAL);
    int64_t negstr[2] = {3, -1};
    CHECK_ERR(lpx_tensor_from_blob(buf, LPX_F32, 2, shape, negstr, lpx_cpu(), NULL, NULL, &t), LPX_EINVAL);
}

static void test_view_bounds(void)
{
    int64_t shape[1] = {10};
    lpx_tensor *t = NULL, *v = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &t));
    int64_t vs[2] = {3, 3}, vst[2] = {3, 1};
    CHECK_OK(lpx_tensor_view_of(t, 2, vs, vst, 1, &v)); /* reaches element 9 */
    CHECK(lpx_tensor_offset(v) == 1);
    lpx_tensor_release(v);
    CHECK_ERR(lpx_tensor_view_of(t, 2, vs, vst, 2, &v), LPX_ERANGE); /* element 10 */
    CHECK(v == NULL);
    CHECK_ERR(lpx_tensor_view_of(t, 2, vs, vst, -1, &v), LPX_ERANGE);
    int64_t hs[1] = {INT64_MAX / 2}, hst[1] = {4};
    CHECK_ERR(lpx_tensor_view_of(t, 1, hs, hst, 0, &v), LPX_ERANGE);
    CHECK_ERR(lpx_tensor_view_of(NULL, 2, vs, vst, 0, &v), LPX_EINVAL);
    /* an empty view touches nothing: an offset past the end is fine */
    int64_t es[2] = {0, 3};
    CHECK_OK(lpx_tensor_view_of(t, 2, es, vst, 12, &v));
    CHECK(lpx_tensor_numel(v) == 0);
    lpx_tensor_release(v);
    lpx_tensor_release(t);
}

static lpx_status box_describe_unflatten(const lpx_kind *k, lpx_dtype d, int ndim, const int64_t *shape,
                                         lpx_tensor *const *inner, int n, const void *meta, size_t ms,
                                         lpx_tensor **out)
{
    if (n != 1) return lpx_error(LPX_EINVAL, "box: expects 1 inner tensor, got %d", n);
    return lpx_tensor_new_kind(k, d, ndim, shape, lpx_cpu(), inner, n, meta, ms, out);
}

static int meta_releases;
static void box_meta_release(void *meta, size_t size) { (void)meta; meta_releases += size == 4; }

static void test_kind_payload(void)
{
    lpx_kind_i vt = {
        .struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = "test_box",
        .priority = LPX_PRIORITY_PAYLOAD, .unflatten = box_describe_unflatten, .meta_release = box_meta_release,
    };
    const lpx_kind *k = NULL;
    CHECK_OK(lpx_kind_register(&vt, &k));
    CHECK(lpx_kind_key(k) >= LPX_KEY_PAYLOAD_FIRST && lpx_kind_key(k) <= LPX_KEY_PAYLOAD_LAST);
    int64_t shape[2] = {4, 4};
    lpx_tensor *inner = NULL, *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_U8, 2, shape, lpx_cpu(), &inner));
    uint32_t meta = 0xabcd;
    meta_releases = 0;
    CHECK_OK(lpx_tensor_new_kind(k, LPX_BF16, 2, shape, lpx_cpu(), &inner, 1, &meta, sizeof meta, &t));
    CHECK(lpx_tensor_refcount(inner) == 2);
    CHECK(lpx_tensor_kind(t) == k);
    CHECK(lpx_tensor_dtype(t) == LPX_BF16);
    CHECK(lpx_tensor_data(t) == NULL);
    CHECK(lpx_tensor_inner_count(t) == 1 && lpx_tensor_inner(t, 0) == inner && lpx_tensor_inner(t, 1) == NULL);
    size_t ms = 0;
    const uint32_t *m = lpx_tensor_meta(t, &ms);
    CHECK(ms == 4 && *m == 0xabcd);
    CHECK(lpx_tensor_keys(t) == ((UINT64_C(1) << LPX_KEY_CPU) | (UINT64_C(1) << lpx_kind_key(k))));
    CHECK(lpx_kind_live_tensors(k) == 1);
    /* cannot unregister while tensors live */
    CHECK_ERR(lpx_kind_unregister(k), LPX_EINVAL);
    lpx_tensor *v = NULL;
    CHECK_ERR(lpx_tensor_view_of(t, 2, shape, NULL, 0, &v), LPX_EINVAL);
    lpx_tensor_release(t);
    CHECK(meta_releases == 1);
    CHECK(lpx_tensor_refcount(inner) == 1);
    CHECK(lpx_kind_live_tensors(k) == 0);

    /* bad payloads */
    lpx_tensor *inners[LPX_MAX_INNER + 1];
    for (int i = 0; i <= LPX_MAX_INNER; i++) inners[i] = inner;
    CHECK_ERR(lpx_tensor_new_kind(k, LPX_BF16, 2, shape, lpx_cpu(), inners, LPX_MAX_INNER + 1, NULL, 0, &t), LPX_EINVAL);
    char big[LPX_MAX_META + 1] = {0};
    CHECK_ERR(lpx_tensor_new_kind(k, LPX_BF16, 2, shape, lpx_cpu(), &inner, 1, big, sizeof big, &t), LPX_EINVAL);
    lpx_tensor *nul = NULL;
    CHECK_ERR(lpx_tensor_new_kind(k, LPX_BF16, 2, shape, lpx_cpu(), &nul, 1, NULL, 0, &t), LPX_EINVAL);
    CHECK_ERR(lpx_tensor_new_kind(NULL, LPX_BF16, 2, shape, lpx_cpu(), &inner, 1, NULL, 0, &t), LPX_EINVAL);
    CHECK(lpx_tensor_refcount(inner) == 1);
    lpx_tensor_release(inner);
    CHECK_OK(lpx_kind_unregister(k));
    const lpx_kind *again = NULL;
    CHECK_ERR(lpx_kind_find("test_box", &again), LPX_ENOTFOUND);
}

/* Extreme shapes, every size computation checked (UBSan in CI): an empty
 * tensor whose other dims multiply past int64 is refused at creation (it
 * was accepted, then clone/cast/add overflowed walking its dims); one
 * that fits works through those ops; two shapes that each fit but whose
 * broadcast does not are refused by the op; a DLPack-sized shape past
 * int64 is refused by from_blob. */
static void test_extreme_shapes(void)
{
    int64_t huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 0}, fits[3] = {INT64_C(1) << 40, 3, 0};
    lpx_tensor *t = NULL, *c = NULL, *k = NULL, *a = NULL, *s = NULL;
    CHECK_ERR(lpx_empty(3, huge, LPX_F32, lpx_cpu(), &t), LPX_ERANGE);
    CHECKF(strstr(lpx_last_error(), "counting the dims other than 0") != NULL, "%s", lpx_last_error());
    CHECK(t == NULL);
    CHECK_OK(lpx_empty(3, fits, LPX_F32, lpx_cpu(), &t));
    if (t) {
        CHECK(lpx_tensor_numel(t) == 0);
        CHECK_OK(lpx_clone(t, &c));
        CHECK_OK(lpx_cast(t, LPX_BF16, false, &k));
        CHECK_OK(lpx_add(t, t, &a));
        CHECK_OK(lpx_sum(t, 0, NULL, false, &s));
        CHECK(c && k && a && lpx_tensor_numel(a) == 0);
    }
    /* [2^31, 1, 0] + [1, 2^33, 0]: each fits, the broadcast does not */
    int64_t sa[3] = {INT64_C(1) << 31, 1, 0}, sb[3] = {1, INT64_C(1) << 33, 0};
    lpx_tensor *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(lpx_empty(3, sa, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_empty(3, sb, LPX_F32, lpx_cpu(), &y));
    CHECK_ERR(lpx_add(x, y, &z), LPX_ERANGE);
    CHECK(z == NULL);
    /* a borrowed buffer described with a shape past int64 */
    float one = 1;
    int64_t wide[2] = {INT64_C(1) << 62, 4};
    lpx_tensor *b = NULL;
    CHECK_ERR(lpx_tensor_from_blob(&one, LPX_F32, 2, wide, NULL, lpx_cpu(), NULL, NULL, &b), LPX_ERANGE);
    lpx_tensor *rel[] = {t, c, k, a, s, x, y, z, b};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_status_strings(void)
{
    for (int s = 0; s >= LPX_EINTERNAL; s--) {
        const char *m = lpx_status_string((lpx_status)s);
        CHECK(m && strncmp(m, "LPX_", 4) == 0);
    }
    CHECK(strcmp(lpx_status_string((lpx_status)-999), "unknown status") == 0);
    lpx_clear_error();
    CHECK(lpx_last_error()[0] == 0);
    CHECK(lpx_error(LPX_EINVAL, "x=%d", 3) == LPX_EINVAL);
    CHECK(strcmp(lpx_last_error(), "x=3") == 0);
    CHECK(strcmp(lpx_version(), "0.1.0") == 0);
}

int main(void)
{
    RUN(test_new_and_accessors);
    RUN(test_new_errors);
    RUN(test_from_blob);
    RUN(test_view_bounds);
    RUN(test_kind_payload);
    RUN(test_extreme_shapes);
    RUN(test_status_strings);
    return CHECK_DONE();
}
