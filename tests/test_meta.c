/* The shape meta functions (include/lpx/meta.h, dispatch/meta_shape.c)
 * called directly: broadcasting, a caller's out, dims, reductions, and
 * swiglu_backward's (dispatch/meta_nn.c). Every backend calls them, so
 * these cases pin the contract once; the ops' tests (test_elementwise,
 * test_reduce, the GPU suite) check that the kernels really use them. */
#include "check.h"
#include "tensor_util.h"

static lpx_tensor *t_of(int nd, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, nd, shape, lpx_cpu(), &t));
    return t;
}

static void test_broadcast(void)
{
    const int64_t s1[3] = {4, 1, 3}, s2[2] = {5, 1}, s3[2] = {5, 2}, big[2] = {INT64_C(1) << 40, 1},
                  big2[2] = {1, INT64_C(1) << 40};
    lpx_tensor *a = t_of(3, s1), *b = t_of(2, s2), *c = t_of(2, s3);
    int nd = 0;
    int64_t shape[LPX_MAX_DIMS] = {0};
    CHECK_OK(lpx_meta_broadcast("add", a, b, &nd, shape));
    CHECK(nd == 3 && shape[0] == 4 && shape[1] == 5 && shape[2] == 3);
    /* dims that differ and are not 1: named with both shapes */
    CHECK_ERR(lpx_meta_broadcast("add", a, c, &nd, shape), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "add: shapes [4, 1, 3] and [5, 2] do not broadcast") != NULL);
    CHECK_ERR(lpx_meta_broadcast("add", NULL, c, &nd, shape), LPX_EINVAL);
    /* two shapes that fit whose broadcast overflows int64 elements: refused
     * (the CUDA copy of this rule once missed the check) */
    lpx_tensor *v1 = NULL, *v2 = NULL;
    CHECK_OK(lpx_tensor_view_of(a, 2, big, (const int64_t[]){0, 0}, 0, &v1));
    CHECK_OK(lpx_tensor_view_of(a, 2, big2, (const int64_t[]){0, 0}, 0, &v2));
    if (v1 && v2) CHECK_ERR(lpx_meta_broadcast("mul", v1, v2, &nd, shape), LPX_ERANGE);
    lpx_tensor *rel[] = {a, b, c, v1, v2};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_out(void)
{
    const int64_t s[2] = {2, 3}, wrong[2] = {3, 2};
    lpx_tensor *o = t_of(2, s);
    CHECK_OK(lpx_meta_out("add", o, LPX_F32, 2, s));
    CHECK_ERR(lpx_meta_out("add", o, LPX_F32, 2, wrong), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "add: out has shape [2, 3], the result needs [3, 2]") != NULL);
    CHECK_ERR(lpx_meta_out("add", o, LPX_BF16, 2, s), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "out has dtype f32, the result is bf16") != NULL);
    CHECK_ERR(lpx_meta_out("add", NULL, LPX_F32, 2, s), LPX_EINVAL);
    /* a kind tensor is no place for a result */
    lpx_tensor *q = NULL;
    const int64_t qs[2] = {4, 64};
    lpx_tensor *x = t_of(2, qs);
    if (x && !lpx_fill_(x, 0.5) && !lpx_nf4_quantize(x, NULL, &q)) {
        CHECK_ERR(lpx_meta_out("add", q, LPX_F32, 2, qs), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "out is of kind 'nf4'") != NULL);
    } else {
        CHECKF(0, "nf4 setup: %s", lpx_last_error());
    }
    lpx_tensor_release(q);
    lpx_tensor_release(x);
    lpx_tensor_release(o);
}

static void test_dim(void)
{
    int d = -7;
    CHECK_OK(lpx_meta_dim("sum", -1, 3, &d));
    CHECK(d == 2);
    CHECK_OK(lpx_meta_dim("sum", 0, 0, &d)); /* a scalar: dim 0 ... */
    CHECK(d == 0);
    CHECK_ERR(lpx_meta_dim("sum", -1, 0, &d), LPX_ERANGE);
    CHECK_OK(lpx_meta_dim("sum", -1, 1, &d)); /* ... and -1 where it counts as one dim */
    CHECK(d == 0);
    CHECK_ERR(lpx_meta_dim("sum", 3, 3, &d), LPX_ERANGE);
    CHECK(strstr(lpx_last_error(), "sum: dim 3 out of range for 3 dims") != NULL);
    CHECK_ERR(lpx_meta_dim("sum", -4, 3, &d), LPX_ERANGE);
}

static void test_reduce(void)
{
    const int64_t s[3] = {2, 3, 4}, e[2] = {0, 5};
    lpx_tensor *x = t_of(3, s), *z = t_of(2, e);
    lpx_reduce_geom g;
    const int64_t d1[1] = {-2}, dup[2] = {1, -2}, d0[1] = {0};
    CHECK_OK(lpx_meta_reduce("sum", x, d1, 1, false, true, &g));
    CHECK(g.out_ndim == 2 && g.out_shape[0] == 2 && g.out_shape[1] == 4 && g.out_numel == 8 && g.count == 3);
    CHECK(!g.reduced[0] && g.reduced[1] && !g.reduced[2]);
    CHECK_OK(lpx_meta_reduce("sum", x, d1, 1, true, true, &g));
    CHECK(g.out_ndim == 3 && g.out_shape[1] == 1 && g.out_numel == 8);
    CHECK_OK(lpx_meta_reduce("sum", x, NULL, 0, false, true, &g)); /* every dim */
    CHECK(g.out_ndim == 0 && g.out_numel == 1 && g.count == 24);
    CHECK_ERR(lpx_meta_reduce("sum", x, dup, 2, false, true, &g), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "dims lists dim 1 twice") != NULL);
    /* max over zero elements into a non-empty result has no identity */
    CHECK_OK(lpx_meta_reduce("sum", z, d0, 1, false, true, &g));
    CHECK(g.out_numel == 5 && g.count == 0);
    CHECK_ERR(lpx_meta_reduce("amax", z, d0, 1, false, false, &g), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "cannot reduce over zero elements") != NULL);
    lpx_tensor_release(x);
    lpx_tensor_release(z);
}

static lpx_tensor *vec_of(lpx_dtype dt, int64_t n)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_zeros(1, &n, dt, lpx_cpu(), &t));
    return t;
}

static void test_nf4_payload(void)
{
    /* 256 elements in blocks of 64 with scaler blocks of 2: 128 code bytes,
     * 4 qscalers, 2 factors, 1 mean */
    lpx_tensor *codes = vec_of(LPX_U8, 128), *qs = vec_of(LPX_I8, 4), *f = vec_of(LPX_F32, 2),
               *mean = vec_of(LPX_F32, 1), *qs5 = vec_of(LPX_I8, 5), *m2 = vec_of(LPX_F32, 2);
    int64_t padded = 0;
    CHECK_OK(lpx_meta_nf4_payload("nf4_dequantize", codes, qs, f, mean, 64, 2, &padded));
    CHECK(padded == 256);
    CHECK_ERR(lpx_meta_nf4_payload("nf4_dequantize", codes, qs, f, mean, 63, 2, &padded), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "block = 63 must be even") != NULL);
    CHECK_ERR(lpx_meta_nf4_payload("nf4_dequantize", codes, qs, f, mean, 64, 0, &padded), LPX_EINVAL);
    CHECK_ERR(lpx_meta_nf4_payload("nf4_dequantize", qs, qs, f, mean, 64, 2, &padded), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "codes has dtype i8, expected u8") != NULL);
    CHECK_ERR(lpx_meta_nf4_payload("nf4_dequantize", codes, qs5, f, mean, 64, 2, &padded), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "256 codes need 4 qscalers and 2 factors, got 5 and 2") != NULL);
    CHECK_ERR(lpx_meta_nf4_payload("nf4_dequantize", codes, qs, f, m2, 64, 2, &padded), LPX_ESHAPE);
    CHECK_ERR(lpx_meta_nf4_payload("nf4_dequantize", codes, qs, f, mean, 64, 3, &padded), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "not a whole number of scaler blocks") != NULL);
    CHECK_OK(lpx_meta_nf4_range("nf4_dequantize", 256, 10, 246, LPX_BF16, NULL));
    CHECK_ERR(lpx_meta_nf4_range("nf4_dequantize", 256, 10, 247, LPX_F32, NULL), LPX_ERANGE);
    CHECK_ERR(lpx_meta_nf4_range("nf4_dequantize", 256, -1, 1, LPX_F32, NULL), LPX_ERANGE);
    CHECK_ERR(lpx_meta_nf4_range("nf4_dequantize", 256, 0, 1, LPX_I32, NULL), LPX_EDTYPE);
    lpx_tensor *o2 = vec_of(LPX_F32, 2), *o3 = vec_of(LPX_F32, 3);
    CHECK_OK(lpx_meta_nf4_range("nf4_dequantize", 256, 0, 2, LPX_F32, o2));
    CHECK_ERR(lpx_meta_nf4_range("nf4_dequantize", 256, 0, 2, LPX_F32, o3), LPX_ESHAPE);
    CHECK_ERR(lpx_meta_nf4_range("nf4_dequantize", 256, 0, 2, LPX_BF16, o2), LPX_ESHAPE);
    lpx_tensor_release(o2);
    lpx_tensor_release(o3);
    lpx_nf4_sizes sz;
    const int64_t xs[2] = {3, 100};
    lpx_tensor *x = t_of(2, xs);
    CHECK_OK(lpx_meta_nf4_quantize("nf4_quantize", x, 64, 4, &sz)); /* 300 elements -> 512: 8 blocks, 2 factors */
    CHECK(sz.padded == 512 && sz.blocks == 8 && sz.scaler_blocks == 2);
    CHECK_ERR(lpx_meta_nf4_quantize("nf4_quantize", codes, 64, 4, &sz), LPX_EDTYPE);
    CHECK_ERR(lpx_meta_nf4_quantize("nf4_quantize", x, 30, 4, &sz), LPX_EINVAL);
    lpx_tensor_release(x);
    lpx_tensor *rel[] = {codes, qs, f, mean, qs5, m2};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_adamw(void)
{
    lpx_tensor *p = vec_of(LPX_BF16, 8), *g = vec_of(LPX_F32, 8), *m = vec_of(LPX_F32, 8), *v = vec_of(LPX_F32, 8),
               *v7 = vec_of(LPX_F32, 7), *mb = vec_of(LPX_BF16, 8);
    lpx_tensor *ps[1] = {p}, *gs[1] = {g}, *ms[1] = {m}, *vs[1] = {v}, *bad[1] = {v7}, *mbs[1] = {mb};
    lpx_value a[10] = {lpx_v_tensors(ps, 1), lpx_v_tensors(gs, 1), lpx_v_tensors(ms, 1), lpx_v_tensors(vs, 1),
                       lpx_v_f64(1e-3), lpx_v_f64(0.9), lpx_v_f64(0.95), lpx_v_f64(1e-8), lpx_v_f64(0.1),
                       lpx_v_i64(1)};
    lpx_adamw_consts k;
    CHECK_OK(lpx_meta_adamw("adamw_", a, &k));
    /* the constants every backend steps with */
    CHECK(k.b1 == 0.9f && k.omb1 == (float)(1.0 - 0.9) && k.decay == (float)(1.0 - 1e-3 * 0.1));
    CHECK(k.bc1 == (float)(1.0 - 0.9) && k.bc2 == (float)(1.0 - 0.95) && k.eps == 1e-8f);
    a[3] = lpx_v_tensors(bad, 1);
    CHECK_ERR(lpx_meta_adamw("adamw_", a, &k), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "exp_avg_sq[0] has 7 elements, params[0] has 8") != NULL);
    a[3] = lpx_v_tensors(vs, 1);
    a[2] = lpx_v_tensors(mbs, 1);
    CHECK_ERR(lpx_meta_adamw("adamw_", a, &k), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "exp_avg[0] has dtype bf16; the optimizer state is f32") != NULL);
    a[2] = lpx_v_tensors(ms, 1);
    a[5] = lpx_v_f64(1.0);
    CHECK_ERR(lpx_meta_adamw("adamw_", a, &k), LPX_EINVAL);
    a[5] = lpx_v_f64(0.9);
    a[1] = lpx_v_tensors(gs, 0);
    CHECK_ERR(lpx_meta_adamw("adamw_", a, &k), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "params has 1 tensors but grads has 0") != NULL);
    lpx_tensor *rel[] = {p, g, m, v, v7, mb};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_creation(void)
{
    int64_t n = -1;
    CHECK_OK(lpx_meta_arange("arange", 0, 10, 3, &n));
    CHECK(n == 4);
    CHECK_OK(lpx_meta_arange("arange", 5, 0, -2.5, &n));
    CHECK(n == 2);
    CHECK_ERR(lpx_meta_arange("arange", 0, 1, 0, &n), LPX_EINVAL);
    CHECK_ERR(lpx_meta_arange("arange", 0, 1, -1, &n), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "points away from end") != NULL);
    CHECK_ERR(lpx_meta_arange("arange", 0, INFINITY, 1, &n), LPX_EINVAL);
    CHECK_ERR(lpx_meta_arange("arange", 0, 1e300, 1e-300, &n), LPX_ERANGE);
    int nd = -1;
    int64_t dims[LPX_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_OK(lpx_meta_shape_arg("zeros", dims, LPX_MAX_DIMS, &nd));
    CHECK(nd == LPX_MAX_DIMS);
    CHECK_ERR(lpx_meta_shape_arg("zeros", dims, LPX_MAX_DIMS + 1, &nd), LPX_EINVAL);
    int bits = 0;
    CHECK_OK(lpx_meta_random("rand", LPX_F32, &bits));
    CHECK(bits == 24);
    CHECK_OK(lpx_meta_random("rand", LPX_BF16, &bits));
    CHECK(bits == 8);
    CHECK_OK(lpx_meta_random("rand", LPX_F8E4M3FN, &bits));
    CHECK(bits == 4);
    CHECK_ERR(lpx_meta_random("randn", LPX_I32, &bits), LPX_EDTYPE);
    CHECK_ERR(lpx_meta_random("randn", (lpx_dtype)250, &bits), LPX_EDTYPE);
}

static lpx_tensor *t_dt(lpx_dtype dt, int nd, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_zeros(nd, shape, dt, lpx_cpu(), &t));
    return t;
}

static void test_fp8(void)
{
    const int64_t sa[2] = {4, 8}, sb[2] = {8, 6}, sk[2] = {7, 6}, s11[2] = {1, 1}, s41[2] = {4, 1}, s16[2] = {1, 6},
                  s61[2] = {6, 1}, s6[1] = {6};
    lpx_tensor *a = t_dt(LPX_F8E4M3FN, 2, sa), *b = t_dt(LPX_F8E4M3FN, 2, sb), *b5 = t_dt(LPX_F8E5M2, 2, sb),
               *a5 = t_dt(LPX_F8E5M2, 2, sa), *bk = t_dt(LPX_F8E4M3FN, 2, sk), *one = t_dt(LPX_F32, 2, s11),
               *rows = t_dt(LPX_F32, 2, s41), *cols = t_dt(LPX_F32, 2, s16), *colsT = t_dt(LPX_F32, 2, s61),
               *bias = t_dt(LPX_BF16, 1, s6), *xf = t_dt(LPX_F32, 2, sa);
    lpx_fp8_mm_geom g;
    CHECK_OK(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", a, rows, b, cols, bias, LPX_BF16, &g));
    CHECK(g.M == 4 && g.N == 6 && g.K == 8 && g.a_rowwise && g.b_colwise);
    CHECK_OK(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", a, one, b5, one, NULL, LPX_F32, &g));
    CHECK(!g.a_rowwise && !g.b_colwise);
    CHECK_ERR(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", a5, one, b5, one, NULL, LPX_F32, &g), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "both f8e5m2") != NULL);
    CHECK_ERR(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", xf, one, b, one, NULL, LPX_F32, &g), LPX_EDTYPE);
    CHECK_ERR(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", a, one, bk, one, NULL, LPX_F32, &g), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "K mismatch (8 vs 7)") != NULL);
    CHECK_ERR(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", a, one, b, colsT, NULL, LPX_F32, &g), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "b_scale_inv has shape [6, 1]; expected numel 1 (tensorwise) or [1, 6]") != NULL);
    CHECK_ERR(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", a, one, b, one, NULL, LPX_I32, &g), LPX_EDTYPE);
    /* a transposed view is column-major: accepted; a strided one is not */
    lpx_tensor *bt = NULL, *bs = NULL;
    CHECK_OK(lpx_t(bk, &bt)); /* [6, 7] column-major */
    CHECK_OK(lpx_tensor_view_of(b, 2, (const int64_t[]){4, 6}, (const int64_t[]){12, 2}, 0, &bs));
    const int64_t s67[2] = {7, 6};
    lpx_tensor *a7 = t_dt(LPX_F8E4M3FN, 2, s67);
    if (bt && bs) {
        CHECK_OK(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", a7, one, bt, one, NULL, LPX_F32, &g));
        CHECK(g.M == 7 && g.K == 6 && g.N == 7);
        CHECK_ERR(lpx_meta_fp8_scaled_mm("fp8_scaled_mm", bs, one, b, one, NULL, LPX_F32, &g), LPX_ESHAPE);
    }

    lpx_fp8_quant_geom q;
    CHECK_OK(lpx_meta_fp8_quantize("fp8_quantize", xf, NULL, LPX_F8E4M3FN, true, -1, 0.0, &q));
    CHECK(q.outer == 4 && q.D == 8 && q.inner == 1 && q.groups == 4 && !q.tensorwise && q.scale_ndim == 2 &&
          q.scale_shape[0] == 4 && q.scale_shape[1] == 1);
    CHECK_OK(lpx_meta_fp8_quantize("fp8_quantize", xf, one, LPX_F8E4M3FN, false, 0, 0.0, &q));
    CHECK(q.tensorwise && q.groups == 1);
    CHECK_OK(lpx_meta_fp8_quantize("fp8_quantize", xf, rows, LPX_F8E5M2, true, 1, 0.0, &q));
    CHECK_ERR(lpx_meta_fp8_quantize("fp8_quantize", xf, cols, LPX_F8E5M2, true, 1, 0.0, &q), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "needs 4 scale values in the keepdim shape") != NULL);
    CHECK_ERR(lpx_meta_fp8_quantize("fp8_quantize", xf, NULL, LPX_BF16, false, 0, 0.0, &q), LPX_EDTYPE);
    CHECK_ERR(lpx_meta_fp8_quantize("fp8_quantize", xf, NULL, LPX_F8E4M3FN, false, 0, NAN, &q), LPX_EINVAL);
    CHECK_ERR(lpx_meta_fp8_quantize("fp8_quantize", xf, NULL, LPX_F8E4M3FN, true, 2, 0.0, &q), LPX_ERANGE);

    CHECK_OK(lpx_meta_fp8_dequantize("fp8_dequantize", a, rows, LPX_BF16));
    CHECK_OK(lpx_meta_fp8_dequantize("fp8_dequantize", a, one, LPX_F32));
    CHECK_ERR(lpx_meta_fp8_dequantize("fp8_dequantize", a, cols, LPX_F32), LPX_ESHAPE);
    CHECK_ERR(lpx_meta_fp8_dequantize("fp8_dequantize", a, one, LPX_I8), LPX_EDTYPE);
    CHECK_ERR(lpx_meta_fp8_dequantize("fp8_dequantize", xf, one, LPX_F32), LPX_EDTYPE);
    CHECK_OK(lpx_meta_fp8_scale_from_amax("fp8_scale_from_amax", rows, LPX_F8E4M3FN, 0.0));
    CHECK_ERR(lpx_meta_fp8_scale_from_amax("fp8_scale_from_amax", rows, LPX_F8E4M3FN, -1.0), LPX_EINVAL);
    lpx_tensor *ia = t_dt(LPX_I32, 2, s41);
    CHECK_ERR(lpx_meta_fp8_scale_from_amax("fp8_scale_from_amax", ia, LPX_F8E4M3FN, 0.0), LPX_EDTYPE);
    lpx_tensor_release(ia);
    lpx_tensor *rel[] = {a, b, b5, a5, bk, one, rows, cols, colsT, bias, xf, bt, bs, a7};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

/* swiglu_backward: three same-shaped floating-point tensors (each its own
 * dtype, any strides); a mismatch names both shapes */
static void test_swiglu_backward(void)
{
    const int64_t s[2] = {4, 6}, st[2] = {6, 4}, s1[2] = {1, 6};
    lpx_tensor *g = t_dt(LPX_F32, 2, s), *a = t_dt(LPX_BF16, 2, s), *b = t_dt(LPX_F16, 2, s), *w = t_dt(LPX_F32, 2, st),
               *r = t_dt(LPX_F32, 2, s1), *i = t_dt(LPX_I64, 2, s), *q = t_dt(LPX_F8E4M3FN, 2, s), *wt = NULL;
    CHECK_OK(lpx_meta_swiglu_backward("swiglu_backward", g, a, b));
    CHECK_OK(lpx_meta_swiglu_backward("swiglu_backward", q, q, g));
    if (w) CHECK_OK(lpx_t(w, &wt)); /* [4, 6], strides (1, 4) */
    if (wt) CHECK_OK(lpx_meta_swiglu_backward("swiglu_backward", wt, wt, a));
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", g, w, b), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "swiglu_backward: grad [4, 6] and gate [6, 4] must have the same shape") != NULL);
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", g, a, w), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "up [6, 4] and gate [4, 6]") != NULL);
    /* no broadcasting, even of a shape that would broadcast */
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", r, a, b), LPX_ESHAPE);
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", g, a, i), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "swiglu_backward: up has dtype i64") != NULL);
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", g, i, b), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "gate has dtype i64") != NULL);
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", NULL, a, b), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "swiglu_backward: grad is NULL") != NULL);
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", g, NULL, b), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "gate is NULL") != NULL);
    CHECK_ERR(lpx_meta_swiglu_backward("swiglu_backward", g, a, NULL), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "up is NULL") != NULL);
    lpx_tensor *rel[] = {g, a, b, w, r, i, q, wt};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_broadcast);
    RUN(test_out);
    RUN(test_dim);
    RUN(test_reduce);
    RUN(test_nf4_payload);
    RUN(test_adamw);
    RUN(test_creation);
    RUN(test_fp8);
    RUN(test_swiglu_backward);
    return CHECK_DONE();
}
