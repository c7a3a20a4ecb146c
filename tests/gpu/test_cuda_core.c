/* GPU suite: cuda_core. The plugin loads; lpx_tensor_to round-trips the
 * bits of every built-in dtype (non-contiguous and empty tensors too);
 * views of CUDA tensors (and the copying ones: reshape of a transpose,
 * contiguous, clone, cat) give the CPU's bits; the caching allocator's
 * statistics add up; mixing a CPU and a CUDA tensor in one op fails with
 * LPX_EDEVICE naming the op. */
#include "gpu_util.h"

static const lpx_dtype all_dtypes[] = {LPX_F32, LPX_F16, LPX_BF16, LPX_F8E4M3FN, LPX_F8E5M2,
                                       LPX_U8,  LPX_I8,  LPX_I32,  LPX_I64,      LPX_BOOL};
#define NDT ((int)(sizeof all_dtypes / sizeof *all_dtypes))

/* CPU tensor of `shape` filled with pseudo-random bytes (any bit pattern:
 * NaNs, odd bool bytes), so round trips are checked on raw bits. */
static lpx_tensor *random_bytes(lpx_dtype dt, int nd, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    if (lpx_tensor_new(dt, nd, shape, lpx_cpu(), &t)) return NULL;
    unsigned char *p = lpx_tensor_data(t);
    size_t n = lpx_dtype_nbytes(dt, lpx_tensor_numel(t));
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(urand() * 256.0);
    return t;
}

static void test_plugin_loaded(void)
{
    const lpx_plugin *p = NULL;
    CHECK_OK(lpx_plugin_find("cuda", &p));
    CHECK(p == gpu_plugin);
    lpx_cuda_device_count_fn count = (lpx_cuda_device_count_fn)lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_DEVICE_COUNT);
    CHECK(count && count() >= 1);
    CHECK(lpx_backend_for(LPX_DEVICE_CUDA) != NULL);
}

static void test_round_trip_all_dtypes(void)
{
    const int64_t shape[] = {37, 5};
    for (int i = 0; i < NDT; i++) {
        lpx_tensor *x = random_bytes(all_dtypes[i], 2, shape);
        lpx_tensor *g = gpu_up(x);
        CHECK(g && lpx_tensor_device(g).type == LPX_DEVICE_CUDA);
        CHECKF(g && gpu_same_bits(lpx_dtype_name(all_dtypes[i]), x, g), "dtype %s", lpx_dtype_name(all_dtypes[i]));
        lpx_tensor_release(g);
        lpx_tensor_release(x);
    }
}

static void test_round_trip_noncontiguous(void)
{
    const int64_t shape[] = {6, 9};
    lpx_tensor *x = random_bytes(LPX_BF16, 2, shape), *xt = NULL, *xs = NULL;
    CHECK_OK(lpx_transpose(x, 0, 1, &xt));
    CHECK_OK(lpx_slice(x, 1, 1, 8, 3, &xs));
    /* CPU view -> GPU (lpx_tensor_to makes it contiguous on the way) */
    lpx_tensor *g = gpu_up(xt);
    CHECK(g && lpx_tensor_is_contiguous(g) && gpu_same_bits("transposed up", xt, g));
    lpx_tensor_release(g);
    g = gpu_up(xs);
    CHECK(g && gpu_same_bits("sliced up", xs, g));
    lpx_tensor_release(g);
    /* GPU view -> CPU (the CUDA copy_ makes it contiguous first) */
    lpx_tensor *gx = gpu_up(x), *gt = NULL;
    CHECK_OK(lpx_transpose(gx, 0, 1, &gt));
    CHECK(gt && !lpx_tensor_is_contiguous(gt) && gpu_same_bits("transposed down", xt, gt));
    lpx_tensor_release(gt);
    lpx_tensor_release(gx);
    lpx_tensor_release(xs);
    lpx_tensor_release(xt);
    lpx_tensor_release(x);
}

static void test_round_trip_empty(void)
{
    const int64_t shape[] = {0, 3};
    lpx_tensor *x = random_bytes(LPX_F32, 2, shape);
    lpx_tensor *g = gpu_up(x), *back = g ? gpu_down(g) : NULL;
    CHECK(g && lpx_tensor_numel(g) == 0 && lpx_tensor_device(g).type == LPX_DEVICE_CUDA);
    CHECK(back && shape_is(back, 2, shape));
    lpx_tensor_release(back);
    lpx_tensor_release(g);
    lpx_tensor_release(x);
    /* a scalar */
    lpx_tensor *s = random_bytes(LPX_I64, 0, NULL);
    g = gpu_up(s);
    CHECK(g && lpx_tensor_ndim(g) == 0 && gpu_same_bits("scalar", s, g));
    lpx_tensor_release(g);
    lpx_tensor_release(s);
}

static void test_views(void)
{
    const int64_t shape[] = {4, 6, 5};
    lpx_tensor *x = rand_normal(3, shape, 11, 1.0, LPX_F32), *g = gpu_up(x);
    lpx_tensor *a = NULL, *b = NULL;
    /* transpose: a view */
    CHECK_OK(lpx_transpose(x, 0, 2, &a));
    CHECK_OK(lpx_transpose(g, 0, 2, &b));
    CHECK(b && lpx_tensor_shares_storage(b, g) && gpu_same_bits("transpose", a, b));
    /* reshape of a transpose: a copy (through the CUDA copy_) */
    lpx_tensor *ra = NULL, *rb = NULL;
    const int64_t flat[] = {5, 24};
    CHECK_OK(lpx_reshape(a, 2, flat, &ra));
    CHECK_OK(lpx_reshape(b, 2, flat, &rb));
    CHECK(rb && lpx_tensor_device(rb).type == LPX_DEVICE_CUDA && gpu_same_bits("reshape copy", ra, rb));
    lpx_tensor_release(ra);
    lpx_tensor_release(rb);
    /* contiguous and clone of the transpose */
    CHECK_OK(lpx_contiguous(a, &ra));
    CHECK_OK(lpx_contiguous(b, &rb));
    CHECK(rb && lpx_tensor_is_contiguous(rb) && gpu_same_bits("contiguous", ra, rb));
    lpx_tensor_release(ra);
    lpx_tensor_release(rb);
    CHECK_OK(lpx_clone(a, &ra));
    CHECK_OK(lpx_clone(b, &rb));
    CHECK(rb && !lpx_tensor_shares_storage(rb, g) && gpu_same_bits("clone", ra, rb));
    lpx_tensor_release(ra);
    lpx_tensor_release(rb);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* slice with a step */
    CHECK_OK(lpx_slice(x, 1, 1, 6, 2, &a));
    CHECK_OK(lpx_slice(g, 1, 1, 6, 2, &b));
    CHECK(b && gpu_same_bits("slice", a, b));
    /* cat of the (strided) slice and x along dim 1 */
    lpx_tensor *xs[2] = {a, x}, *gs[2] = {b, g};
    CHECK_OK(lpx_cat(xs, 2, 1, &ra));
    CHECK_OK(lpx_cat(gs, 2, 1, &rb));
    CHECK(rb && gpu_same_bits("cat", ra, rb));
    lpx_tensor_release(ra);
    lpx_tensor_release(rb);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* permute (a view), then materialized by contiguous on the GPU */
    const int64_t perm[] = {1, 2, 0};
    CHECK_OK(lpx_permute(x, 3, perm, &a));
    CHECK_OK(lpx_permute(g, 3, perm, &b));
    CHECK(b && lpx_tensor_shares_storage(b, g) && gpu_same_bits("permute", a, b));
    CHECK_OK(lpx_contiguous(a, &ra));
    CHECK_OK(lpx_contiguous(b, &rb));
    CHECK(rb && gpu_same_bits("contiguous of permute", ra, rb));
    lpx_tensor_release(ra);
    lpx_tensor_release(rb);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* expand of a [4, 1, 5] slice to [4, 6, 5] (stride 0), materialized */
    lpx_tensor *xa = NULL, *ga = NULL;
    CHECK_OK(lpx_slice(x, 1, 2, 3, 1, &xa));
    CHECK_OK(lpx_slice(g, 1, 2, 3, 1, &ga));
    CHECK_OK(lpx_expand(xa, 3, shape, &a));
    CHECK_OK(lpx_expand(ga, 3, shape, &b));
    CHECK(b && lpx_tensor_shares_storage(b, g) && lpx_tensor_strides(b)[1] == 0 && gpu_same_bits("expand", a, b));
    CHECK_OK(lpx_clone(a, &ra));
    CHECK_OK(lpx_clone(b, &rb));
    CHECK(rb && lpx_tensor_is_contiguous(rb) && gpu_same_bits("clone of expand", ra, rb));
    lpx_tensor_release(ra);
    lpx_tensor_release(rb);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(xa);
    lpx_tensor_release(ga);
    /* detach: same storage, same device */
    CHECK_OK(lpx_detach(g, &b));
    CHECK(b && lpx_tensor_shares_storage(b, g) && lpx_tensor_device(b).type == LPX_DEVICE_CUDA &&
          gpu_same_bits("detach", x, b));
    lpx_tensor_release(b);
    lpx_tensor_release(g);
    lpx_tensor_release(x);
}

static void test_mem_stats(void)
{
    lpx_cuda_mem_stats_fn stats = (lpx_cuda_mem_stats_fn)lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_MEM_STATS);
    lpx_cuda_sync_fn sync = (lpx_cuda_sync_fn)lpx_plugin_symbol(gpu_plugin, LPX_CUDA_SYM_SYNC);
    CHECK(stats && sync);
    if (!stats || !sync) return;
    CHECK_OK(sync(0));
    lpx_cuda_mem_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1},
                       s2 = {.struct_size = sizeof s2};
    CHECK_OK(stats(0, &s0));
    const int64_t shape[] = {1000, 1000};
    lpx_tensor *t[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) CHECK_OK(lpx_zeros(2, shape, LPX_F32, gpu_dev(), &t[i]));
    CHECK_OK(stats(0, &s1));
    CHECK(s1.allocs >= s0.allocs + 3);
    CHECK(s1.bytes_in_use >= s0.bytes_in_use + 3 * 4000000u);
    CHECK(s1.peak_bytes_in_use >= s1.bytes_in_use);
    for (int i = 0; i < 3; i++) lpx_tensor_release(t[i]);
    CHECK_OK(sync(0));
    CHECK_OK(stats(0, &s2));
    CHECKF(s2.bytes_in_use == s0.bytes_in_use, "in use %llu, baseline %llu", (unsigned long long)s2.bytes_in_use,
           (unsigned long long)s0.bytes_in_use);
    CHECK(s2.frees >= s0.frees + 3);
    CHECK_ERR(stats(-1, &s2), LPX_EINVAL);
}

/* lpx_item on a GPU tensor: the element of a strided view, read through
 * one copy, equals the CPU's for f32, bf16 and i32; an index past the end
 * is refused */
static void test_item_on_device(void)
{
    const int64_t s[2] = {6, 5};
    const lpx_dtype dts[2] = {LPX_F32, LPX_BF16};
    for (int d = 0; d < 2; d++) {
        lpx_tensor *h = rand_normal(2, s, 7 + (uint64_t)d, 1.0, dts[d]), *g = h ? gpu_up(h) : NULL, *ht = NULL,
                   *gt = NULL;
        if (h && g) {
            CHECK_OK(lpx_t(h, &ht));
            CHECK_OK(lpx_t(g, &gt));
        }
        for (int64_t i = 0; ht && gt && i < 30; i += 7) {
            double a = 0, b = -1;
            CHECK_OK(lpx_item(ht, i, &a));
            CHECK_OK(lpx_item(gt, i, &b));
            CHECKF(a == b, "%s element %lld: CPU %.9g, GPU %.9g", lpx_dtype_name(dts[d]), (long long)i, a, b);
        }
        lpx_tensor *rel[] = {h, g, ht, gt};
        for (int k = 0; k < 4; k++) lpx_tensor_release(rel[k]);
    }
    int64_t n = 3;
    lpx_tensor *hi = NULL, *gi = NULL;
    CHECK_OK(lpx_arange(0, 3, 1, LPX_I32, lpx_cpu(), &hi));
    gi = hi ? gpu_up(hi) : NULL;
    double v = 0;
    if (gi) CHECK_OK(lpx_item(gi, 2, &v));
    CHECK(v == 2.0);
    double w = 0;
    if (gi) CHECK_ERR(lpx_item(gi, n, &w), LPX_ERANGE);
    lpx_tensor_release(hi);
    lpx_tensor_release(gi);
}

static void test_mixed_devices_fail(void)
{
    const int64_t shape[] = {3, 4};
    lpx_tensor *x = rand_normal(2, shape, 5, 1.0, LPX_F32), *g = gpu_up(x), *y = NULL;
    CHECK_ERR(lpx_add(x, g, &y), LPX_EDEVICE);
    CHECK(y == NULL && strstr(lpx_last_error(), "add") != NULL);
    CHECK_ERR(lpx_mul(g, x, &y), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "mul") != NULL);
    CHECK_ERR(lpx_add_out(g, g, x), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "add") != NULL && strstr(lpx_last_error(), "out") != NULL);
    lpx_tensor_release(g);
    lpx_tensor_release(x);
}

int main(void)
{
    gpu_setup();
    RUN(test_plugin_loaded);
    RUN(test_round_trip_all_dtypes);
    RUN(test_round_trip_noncontiguous);
    RUN(test_round_trip_empty);
    RUN(test_views);
    RUN(test_mem_stats);
    RUN(test_item_on_device);
    RUN(test_mixed_devices_fail);
    return CHECK_DONE();
}
