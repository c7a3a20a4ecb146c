/* The nf4 tests, the kind's handlers, the fallback switch, the all-gather
 * hooks, untrusted unflatten, bad configurations, out of memory and leaks. */
#include "nf4_util.h"

/* ---- handlers ---------------------------------------------------------------- */

static bool same_values(lpx_tensor *a, lpx_tensor *b)
{
    if (lpx_tensor_numel(a) != lpx_tensor_numel(b)) return false;
    float *av = values_f32(a), *bv = values_f32(b);
    bool same = memcmp(av, bv, (size_t)lpx_tensor_numel(a) * sizeof(float)) == 0;
    free(av);
    free(bv);
    return same;
}

/* dequantized nf4 (f32) */
static lpx_tensor *deq(lpx_tensor *w)
{
    lpx_tensor *d = NULL;
    CHECK_OK(lpx_cast(w, LPX_F32, false, &d));
    return d;
}

/* ---- hooks --------------------------------------------------------------------- */

/* Concatenates 1-D dense tensors (any byte dtype) in order. */
static lpx_tensor *concat(lpx_tensor *const *ts, int n)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += lpx_tensor_numel(ts[i]);
    lpx_tensor *out = NULL;
    CHECK_OK(lpx_tensor_new(lpx_tensor_dtype(ts[0]), 1, &total, lpx_cpu(), &out));
    size_t esz = lpx_dtype_nbytes(lpx_tensor_dtype(ts[0]), 1), off = 0;
    for (int i = 0; i < n && out; i++) {
        size_t nb = (size_t)lpx_tensor_numel(ts[i]) * esz;
        if (nb) memcpy((char *)lpx_tensor_data(out) + off, lpx_tensor_data(ts[i]), nb);
        off += nb;
    }
    return out;
}

static bool same_payload(lpx_tensor *a, lpx_tensor *b)
{
    for (int i = 0; i < LPX_NF4_NINNER; i++) {
        lpx_tensor *x = lpx_tensor_inner(a, i), *y = lpx_tensor_inner(b, i);
        size_t n = lpx_dtype_nbytes(lpx_tensor_dtype(x), lpx_tensor_numel(x));
        if (lpx_tensor_numel(x) != lpx_tensor_numel(y) || (n && memcmp(lpx_tensor_data(x), lpx_tensor_data(y), n)))
            return false;
    }
    size_t ma, mb;
    const lpx_nf4_meta *pa = lpx_tensor_meta(a, &ma), *pb = lpx_tensor_meta(b, &mb);
    return ma == mb && pa->padded == pb->padded && pa->block == pb->block && pa->scaler_block == pb->scaler_block &&
           lpx_tensor_ndim(a) == lpx_tensor_ndim(b) && lpx_tensor_shape(a)[0] == lpx_tensor_shape(b)[0];
}

/* ---- out of memory -------------------------------------------------------------- */

LPX_API void lpx__fail_alloc_after(long n);

static lpx_tensor *oom_x, *oom_w, *oom_a, *oom_b, *oom_g, *oom_dense;

static lpx_status oom_quantize(void)
{
    lpx_tensor *w = NULL;
    lpx_status st = lpx_nf4_quantize(oom_x, NULL, &w);
    lpx_tensor_release(w);
    return st;
}

static lpx_status oom_views(void)
{
    lpx_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    lpx_status st = lpx_narrow(oom_w, 0, 0, 128, &a);
    if (!st) st = lpx_t(oom_w, &b);
    if (!st) st = lpx_clone(a, &c);
    if (!st) st = lpx_cast(b, LPX_BF16, false, &d);
    lpx_tensor *t[] = {a, b, c, d};
    for (int i = 0; i < 4; i++) lpx_tensor_release(t[i]);
    return st;
}

static lpx_status oom_copy(void)
{
    lpx_tensor *w = NULL;
    lpx_status st = lpx_clone(oom_w, &w);
    if (!st) st = lpx_copy_(w, oom_dense);
    if (!st) st = lpx_copy_(oom_dense, w);
    lpx_tensor_release(w);
    return st;
}

static lpx_status oom_qlora(void)
{
    lpx_qlora_opts o = lpx_qlora_opts_default();
    o.dropout = 0.1;
    lpx_tensor *y = NULL, *xa = NULL, *gx = NULL, *ga = NULL, *gb = NULL;
    lpx_status st = lpx_qlora_linear(oom_x, oom_w, NULL, oom_a, oom_b, &o, &y, &xa);
    if (!st) st = lpx_qlora_linear_backward(oom_g, oom_x, oom_w, oom_a, oom_b, NULL, &o, &gx, &ga, &gb);
    lpx_tensor *t[] = {y, xa, gx, ga, gb};
    for (int i = 0; i < 5; i++) lpx_tensor_release(t[i]);
    return st;
}

static lpx_status oom_hooks(void)
{
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    lpx_tensor *in[8] = {NULL}, *res = NULL;
    int n = 0;
    unsigned char meta[LPX_MAX_META];
    size_t ms = 0;
    lpx_status st = vt->pre_all_gather(oom_w, NULL, in, &n, meta, &ms);
    if (!st) st = vt->post_all_gather(lpx_nf4_kind(), in, n, meta, ms, -1, NULL, &res);
    for (int i = 0; i < n; i++) lpx_tensor_release(in[i]);
    lpx_tensor_release(res);
    return st;
}

static lpx_status oom_fallback(void)
{
    lpx_tensor *r = NULL;
    lpx_nf4_set_fallback(true);
    lpx_status st = lpx_relu(oom_w, &r);
    lpx_nf4_set_fallback(false);
    lpx_tensor_release(r);
    return st;
}

static void test_handlers_views(void)
{
    /* block 64, scaler block 4: 256 elements per scaler block; rows of 1000
     * -> one unit = 256 / gcd(1000, 256) = 32 rows */
    int64_t s[2] = {40, 1000};
    lpx_tensor *x = rand_normal(2, s, 80, 1.0, LPX_BF16), *w = NULL;
    lpx_nf4_config c = cfg(64, 4);
    CHECK_OK(lpx_nf4_quantize(x, &c, &w));
    if (!w) { lpx_tensor_release(x); return; }
    lpx_tensor *full = deq(w);
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    CHECK(vt->shard_unit(w) == 32);

    /* slices in whole scaler blocks; the tail keeps the padding */
    lpx_tensor *s0 = NULL, *s1 = NULL, *bad = NULL, *d0 = NULL, *d1 = NULL, *r0 = NULL, *r1 = NULL;
    CHECK_OK(lpx_narrow(w, 0, 0, 32, &s0));
    CHECK_OK(lpx_slice(w, 0, 32, 40, 1, &s1));
    CHECK_OK(lpx_nf4_dequantize_rows(w, 0, 32, LPX_F32, NULL, &r0));
    CHECK_OK(lpx_nf4_dequantize_rows(w, 32, 8, LPX_F32, NULL, &r1));
    if (s0 && s1 && r0 && r1) {
        d0 = deq(s0);
        d1 = deq(s1);
        CHECK(same_values(d0, r0) && same_values(d1, r1));
        CHECK(lpx_tensor_shape(s1)[0] == 8 && lpx_tensor_shape(s1)[1] == 1000);
        lpx_nf4_info i0, i1;
        CHECK_OK(lpx_nf4_get_info(s0, &i0));
        CHECK_OK(lpx_nf4_get_info(s1, &i1));
        CHECK(!i0.whole && i0.padded == 32000 && i1.padded == 8192 && i1.numel == 8000);
    }
    CHECK_ERR(lpx_narrow(w, 0, 8, 16, &bad), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "scaler block") && strstr(lpx_last_error(), "32 rows"));
    CHECK_ERR(lpx_slice(w, 1, 0, 64, 1, &bad), LPX_ESHAPE);
    CHECK_ERR(lpx_slice(w, 0, 0, 32, 2, &bad), LPX_ESHAPE);
    CHECK_ERR(lpx_narrow(w, 0, 32, 9, &bad), LPX_ERANGE);
    /* split in units; chunk(2) would cut at row 20 */
    lpx_tensor *parts[4] = {NULL};
    int np = 0;
    CHECK_OK(lpx_split(w, 32, 0, parts, 4, &np));
    CHECK(np == 2);
    for (int i = 0; i < np; i++) lpx_tensor_release(parts[i]);
    CHECK_ERR(lpx_chunk(w, 2, 0, parts, 4, &np), LPX_ESHAPE);
    /* empty slice at the end */
    lpx_tensor *e = NULL;
    CHECK_OK(lpx_slice(w, 0, 40, 40, 1, &e));
    CHECK(e && lpx_tensor_numel(e) == 0);
    lpx_tensor_release(e);

    /* t and transpose */
    lpx_tensor *wt = NULL, *wtt = NULL, *dt = NULL, *ref = NULL, *tr = NULL;
    CHECK_OK(lpx_t(w, &wt));
    CHECK_OK(lpx_transpose(wt, 0, 1, &wtt));
    if (wt && wtt) {
        CHECK(lpx_tensor_shape(wt)[0] == 1000 && lpx_tensor_shape(wt)[1] == 40);
        dt = deq(wt);
        CHECK_OK(lpx_t(full, &tr));
        CHECK_OK(lpx_contiguous(tr, &ref));
        CHECK(same_values(dt, ref));
        lpx_tensor *dtt = deq(wtt);
        CHECK(same_values(dtt, full));
        lpx_tensor_release(dtt);
        CHECK_ERR(lpx_narrow(wt, 0, 0, 32, &bad), LPX_ESHAPE);   /* dim 0 is stored as columns */
        int64_t flat[1] = {40000};
        CHECK_ERR(lpx_view(wt, 1, flat, &bad), LPX_ESHAPE);
        CHECK(strstr(lpx_last_error(), "transposed") != NULL);
    }
    /* view / reshape */
    int64_t v1[1] = {-1}, v2[2] = {-1, 500};
    lpx_tensor *f1 = NULL, *f2 = NULL;
    CHECK_OK(lpx_view(w, 1, v1, &f1));
    CHECK_OK(lpx_reshape(f1, 2, v2, &f2));
    if (f1 && f2) {
        CHECK(lpx_tensor_numel(f1) == 40000 && lpx_tensor_shape(f2)[0] == 80);
        lpx_tensor *df = deq(f2);
        CHECK(same_values(df, full));
        lpx_tensor_release(df);
    }
    int64_t wrong[1] = {39999};
    CHECK_ERR(lpx_view(w, 1, wrong, &bad), LPX_ESHAPE);
    /* detach shares, clone copies */
    lpx_tensor *det = NULL, *cl = NULL;
    CHECK_OK(lpx_detach(w, &det));
    CHECK_OK(lpx_clone(s1, &cl));
    if (det && cl) {
        CHECK(lpx_tensor_inner(det, 0) == lpx_tensor_inner(w, 0));
        CHECK(!lpx_tensor_shares_storage(lpx_tensor_inner(cl, 0), lpx_tensor_inner(w, 0)));
        lpx_tensor *dc = deq(cl);
        CHECK(same_values(dc, r1));
        lpx_nf4_info ic;
        CHECK_OK(lpx_nf4_get_info(cl, &ic));
        CHECK(ic.whole);
        lpx_tensor_release(dc);
    }
    /* cast to other dtypes */
    lpx_tensor *cb = NULL, *c8 = NULL;
    CHECK_OK(lpx_cast(w, LPX_BF16, false, &cb));
    CHECK_OK(lpx_cast(w, LPX_F8E4M3FN, true, &c8));
    CHECK(cb && lpx_tensor_dtype(cb) == LPX_BF16 && c8 && lpx_tensor_dtype(c8) == LPX_F8E4M3FN);
    lpx_tensor *tmp[] = {x, w, full, s0, s1, d0, d1, r0, r1, wt, wtt, dt, ref, tr, f1, f2, det, cl, cb, c8};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_handlers_copy(void)
{
    int64_t s[2] = {16, 512};
    lpx_tensor *x = rand_normal(2, s, 90, 1.0, LPX_F32), *y = rand_normal(2, s, 91, 1.0, LPX_F32), *w = NULL, *w2 = NULL, *wy = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w2));
    CHECK_OK(lpx_nf4_quantize(y, NULL, &wy));
    if (!w || !w2 || !wy) return;
    /* dense -> nf4 quantizes into the existing payload */
    CHECK_OK(lpx_copy_(w2, y));
    lpx_tensor *a = deq(w2), *b = deq(wy);
    CHECK(same_values(a, b));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* nf4 -> nf4 same layout: bit copy */
    CHECK_OK(lpx_copy_(w2, w));
    a = deq(w2);
    b = deq(w);
    CHECK(same_values(a, b));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* nf4 -> dense */
    lpx_tensor *dense = NULL;
    CHECK_OK(lpx_zeros(2, s, LPX_BF16, lpx_cpu(), &dense));
    CHECK_OK(lpx_copy_(dense, wy));
    lpx_tensor *ref = NULL;
    CHECK_OK(lpx_nf4_dequantize(wy, LPX_BF16, &ref));
    CHECK(same_values(dense, ref));
    /* into a transposed nf4 */
    lpx_tensor *wt = NULL, *yt = NULL;
    CHECK_OK(lpx_t(w2, &wt));
    CHECK_OK(lpx_t(y, &yt));
    CHECK_OK(lpx_copy_(wt, yt));     /* w2 = quantize(y) again, through the transposed handle */
    a = deq(w2);
    b = deq(wy);
    CHECK(same_values(a, b));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    /* a slice shares its parent's mean: quantizing into it is refused */
    int64_t big[2] = {64, 512};
    lpx_tensor *xb = rand_normal(2, big, 92, 1.0, LPX_F32), *wb = NULL, *sl = NULL;
    CHECK_OK(lpx_nf4_quantize(xb, NULL, &wb));
    CHECK_OK(lpx_narrow(wb, 0, 0, 32, &sl));
    lpx_tensor *src = NULL;
    int64_t ss[2] = {32, 512};
    CHECK_OK(lpx_zeros(2, ss, LPX_F32, lpx_cpu(), &src));
    CHECK_ERR(lpx_copy_(sl, src), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "slice") && strstr(lpx_last_error(), "copy_"));
    CHECK_ERR(lpx_copy_(w, src), LPX_ESHAPE);
    lpx_tensor *tmp[] = {x, y, w, w2, wy, dense, ref, wt, yt, xb, wb, sl, src};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_fallback(void)
{
    int64_t s[2] = {8, 256};
    lpx_tensor *x = rand_normal(2, s, 100, 1.0, LPX_F32), *w = NULL, *d = NULL, *r = NULL, *ref = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    CHECK_OK(lpx_nf4_dequantize(w, LPX_F32, &d));
    CHECK(!lpx_nf4_fallback_enabled());
    CHECK_ERR(lpx_sum(w, 0, NULL, false, &r), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "sum") && strstr(lpx_last_error(), "nf4") &&
          strstr(lpx_last_error(), "lpx_nf4_set_fallback"));
    CHECK(r == NULL);
    int key = lpx_kind_key(lpx_nf4_kind());
    lpx_nf4_set_fallback(true);
    CHECK_OK(lpx_trace_start(NULL));
    CHECK_OK(lpx_sum(w, 0, NULL, false, &r));
    CHECK_OK(lpx_sum(d, 0, NULL, false, &ref));
    double a = 0, b = 1;
    if (r && ref) {
        CHECK_OK(lpx_item(r, 0, &a));
        CHECK_OK(lpx_item(ref, 0, &b));
        CHECK(a == b);
    }
    CHECK(lpx_trace_fallback_count(LPX_OP_sum, key) == 1);
    CHECK(lpx_trace_count(LPX_OP_nf4_dequantize, LPX_KEY_CPU) >= 1);
    /* Tensor[] arguments too */
    lpx_tensor *list[2] = {w, d}, *cat = NULL;
    CHECK_OK(lpx_cat(list, 2, 0, &cat));
    CHECK(cat && lpx_tensor_shape(cat)[0] == 16);
    CHECK(lpx_trace_fallback_count(LPX_OP_cat, key) == 1);
    /* never writes into an nf4 argument */
    CHECK_ERR(lpx_add_out(d, d, w), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "out") != NULL);
    CHECK_ERR(lpx_fill_(w, 1.0), LPX_ENOTIMPL);
    CHECK_OK(lpx_trace_stop());
    lpx_nf4_set_fallback(false);
    lpx_tensor *again = NULL;
    CHECK_ERR(lpx_mean(w, 0, NULL, false, &again), LPX_ENOTIMPL);
    lpx_tensor *tmp[] = {x, w, d, r, ref, cat};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_hooks(void)
{
    /* 37 rows of 96, block 32, scaler block 2: unit = 64 / gcd(96, 64) = 2 rows */
    int64_t s[2] = {37, 96};
    lpx_tensor *x = rand_normal(2, s, 110, 1.0, LPX_BF16), *w = NULL;
    lpx_nf4_config c = cfg(32, 2);
    CHECK_OK(lpx_nf4_quantize(x, &c, &w));
    if (!w) { lpx_tensor_release(x); return; }
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    int64_t unit = vt->shard_unit(w);
    CHECK(unit == 2);
    lpx_tensor *prev = NULL;
    for (int world = 1; world <= 7; world++) {
        /* the engine's cut: torch.chunk rounded up to the shard unit */
        int64_t chunk = (37 + world - 1) / world;
        chunk = (chunk + unit - 1) / unit * unit;
        lpx_tensor *in[8][LPX_MAX_AG_INPUTS];
        int nin[8];
        unsigned char meta[LPX_MAX_META];
        size_t msize = 0;
        for (int r = 0; r < world; r++) {
            int64_t r0 = r * chunk < 37 ? r * chunk : 37, r1 = (r + 1) * chunk < 37 ? (r + 1) * chunk : 37;
            lpx_tensor *shard = NULL;
            CHECK_OK(lpx_narrow(w, 0, r0, r1 - r0, &shard));
            nin[r] = 0;
            if (shard) CHECK_OK(vt->pre_all_gather(shard, NULL, in[r], &nin[r], meta, &msize));
            CHECK(nin[r] == 5);
            lpx_tensor_release(shard);
        }
        lpx_tensor *gathered[5] = {NULL};
        for (int i = 0; i < 5; i++) {
            lpx_tensor *col[8];
            for (int r = 0; r < world; r++) col[r] = in[r][i];
            gathered[i] = concat(col, world);
        }
        lpx_tensor *full = NULL;
        CHECK_OK(vt->post_all_gather(lpx_nf4_kind(), gathered, 5, meta, msize, LPX_BF16, NULL, &full));
        CHECKF(full && same_payload(full, w), "world %d: gathered tensor differs from the quantized one", world);
        if (full) CHECK(lpx_tensor_dtype(full) == LPX_BF16 && lpx_tensor_shape(full)[1] == 96);
        /* in place into the previous result */
        if (prev) {
            lpx_tensor *again = NULL;
            CHECK_OK(vt->post_all_gather(lpx_nf4_kind(), gathered, 5, meta, msize, LPX_BF16, prev, &again));
            CHECK(again == prev && same_payload(prev, w));
            lpx_tensor_release(again);
        }
        lpx_tensor_release(prev);
        prev = full;
        for (int i = 0; i < 5; i++) lpx_tensor_release(gathered[i]);
        for (int r = 0; r < world; r++)
            for (int i = 0; i < nin[r]; i++) lpx_tensor_release(in[r][i]);
    }
    /* shards of two separately quantized tensors do not form one */
    lpx_tensor *x2 = rand_normal(2, s, 111, 1.0, LPX_BF16), *w2 = NULL, *sa = NULL, *sb = NULL;
    CHECK_OK(lpx_nf4_quantize(x2, &c, &w2));
    CHECK_OK(lpx_narrow(w, 0, 0, 20, &sa));
    CHECK_OK(lpx_narrow(w2, 0, 20, 17, &sb));
    if (sa && sb) {
        lpx_tensor *ia[8], *ib[8], *g[5], *res = NULL;
        int na = 0, nb = 0;
        unsigned char meta[LPX_MAX_META];
        size_t ms = 0;
        CHECK_OK(vt->pre_all_gather(sa, NULL, ia, &na, meta, &ms));
        CHECK_OK(vt->pre_all_gather(sb, NULL, ib, &nb, meta, &ms));
        for (int i = 0; i < 5; i++) {
            lpx_tensor *col[2] = {ia[i], ib[i]};
            g[i] = concat(col, 2);
        }
        CHECK_ERR(vt->post_all_gather(lpx_nf4_kind(), g, 5, meta, ms, -1, NULL, &res), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "separately") != NULL);
        CHECK_ERR(vt->post_all_gather(lpx_nf4_kind(), g, 4, meta, ms, -1, NULL, &res), LPX_EINVAL);
        CHECK_ERR(vt->post_all_gather(lpx_nf4_kind(), g, 5, meta, ms - 1, -1, NULL, &res), LPX_EINVAL);
        for (int i = 0; i < 5; i++) {
            lpx_tensor_release(g[i]);
            lpx_tensor_release(ia[i]);
            lpx_tensor_release(ib[i]);
        }
    }
    lpx_tensor *wt = NULL;
    lpx_tensor *dummy[8];
    int nd = 0;
    unsigned char meta[LPX_MAX_META];
    size_t ms = 0;
    CHECK_OK(lpx_t(w, &wt));
    CHECK_ERR(vt->pre_all_gather(wt, NULL, dummy, &nd, meta, &ms), LPX_EINVAL);
    lpx_tensor *tmp[] = {x, w, prev, x2, w2, sa, sb, wt};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

/* ---- untrusted unflatten and bad arguments ----------------------------------- */

static void test_unflatten(void)
{
    int64_t s[2] = {10, 100};
    lpx_tensor *x = rand_normal(2, s, 120, 1.0, LPX_F32), *w = NULL, *u = NULL;
    CHECK_OK(lpx_nf4_quantize(x, NULL, &w));
    if (!w) { lpx_tensor_release(x); return; }
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_nf4_kind());
    lpx_tensor *inner[4];
    for (int i = 0; i < 4; i++) inner[i] = lpx_tensor_inner(w, i);
    size_t ms = 0;
    const lpx_nf4_meta *m0 = lpx_tensor_meta(w, &ms);
    CHECK(ms == sizeof(lpx_nf4_meta));
    CHECK_OK(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, m0, ms, &u));
    if (u) {
        lpx_tensor *a = deq(u), *b = deq(w);
        CHECK(same_values(a, b));
        lpx_tensor_release(a);
        lpx_tensor_release(b);
        lpx_tensor_release(u);
        u = NULL;
    }
    lpx_nf4_meta m;
    /* every corruption is refused with an error, never a crash */
    m = *m0; m.magic = 0;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.block = 33;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.scaler_block = 0;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.padded += 16384;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.padded = -2;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.reserved[2] = 1;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.transposed = 2;
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);
    m = *m0; m.block = 128;   /* then the qscaler count is wrong */
    CHECK(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, &m, ms, &u) != LPX_OK);
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 4, m0, ms - 1, &u), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_I32, 2, s, inner, 4, m0, ms, &u), LPX_EDTYPE);
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, inner, 3, m0, ms, &u), LPX_EINVAL);
    int64_t s2[2] = {10, 10000};
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s2, inner, 4, m0, ms, &u), LPX_EINVAL);
    lpx_tensor *swapped[4] = {inner[1], inner[0], inner[2], inner[3]};
    CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, swapped, 4, m0, ms, &u), LPX_EDTYPE);
    /* bad factor / mean values */
    lpx_tensor *f = NULL, *mean = NULL;
    CHECK_OK(lpx_clone(inner[2], &f));
    CHECK_OK(lpx_clone(inner[3], &mean));
    if (f && mean) {
        ((float *)lpx_tensor_data(f))[0] = 0.0f;
        lpx_tensor *badf[4] = {inner[0], inner[1], f, inner[3]};
        CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, badf, 4, m0, ms, &u), LPX_EINVAL);
        ((float *)lpx_tensor_data(mean))[0] = NAN;
        lpx_tensor *badm[4] = {inner[0], inner[1], inner[2], mean};
        CHECK_ERR(vt->unflatten(lpx_nf4_kind(), LPX_F32, 2, s, badm, 4, m0, ms, &u), LPX_EINVAL);
    }
    CHECK(u == NULL);
    /* the public entry (lpx_kind_unflatten): same result, its own
     * argument checks before the kind sees anything */
    const lpx_kind *nk = lpx_nf4_kind();
    CHECK_OK(lpx_kind_unflatten(nk, LPX_F32, 2, s, inner, 4, m0, ms, &u));
    if (u) {
        lpx_tensor *a = deq(u), *b = deq(w);
        CHECK(same_values(a, b));
        CHECK(lpx_tensor_inner(u, 0) == inner[0]);   /* borrowed, shared: zero copy */
        lpx_tensor_release(a);
        lpx_tensor_release(b);
        lpx_tensor_release(u);
        u = NULL;
    }
    CHECK_ERR(lpx_kind_unflatten(NULL, LPX_F32, 2, s, inner, 4, m0, ms, &u), LPX_EINVAL);
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, -1, s, inner, 4, m0, ms, &u), LPX_EINVAL);
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, LPX_MAX_DIMS + 1, s, inner, 4, m0, ms, &u), LPX_EINVAL);
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, NULL, inner, 4, m0, ms, &u), LPX_EINVAL);
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, s, inner, LPX_MAX_INNER + 1, m0, ms, &u), LPX_EINVAL);
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, s, NULL, 4, m0, ms, &u), LPX_EINVAL);
    lpx_tensor *holed[4] = {inner[0], NULL, inner[2], inner[3]};
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, s, holed, 4, m0, ms, &u), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "lpx_kind_unflatten(nf4): inner[1] is NULL") != NULL);
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, s, inner, 4, NULL, ms, &u), LPX_EINVAL);
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, s, inner, 4, m0, (size_t)LPX_MAX_META + 1, &u), LPX_EINVAL);
    m = *m0; m.magic = 0;
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, s, inner, 4, &m, ms, &u), LPX_EINVAL);  /* the kind's check */
    CHECK_ERR(lpx_kind_unflatten(nk, LPX_F32, 2, s, inner, 4, m0, ms, NULL), LPX_EINVAL);
    CHECK(u == NULL);
    lpx_tensor *tmp[] = {x, w, f, mean};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_bad_configs(void)
{
    int64_t s[1] = {1000}, bytes = 0;
    lpx_tensor *x = rand_normal(1, s, 130, 1.0, LPX_F32), *w = NULL;
    int64_t blocks[] = {0, 31, 33, 4098, -64};
    for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++) {
        lpx_nf4_config c = cfg(blocks[i], 256);
        CHECK_ERR(lpx_nf4_quantize(x, &c, &w), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "block") != NULL);
        CHECK_ERR(lpx_nf4_bytes(1, s, &c, &bytes), LPX_EINVAL);
        CHECK_ERR(lpx_nf4_config_check(&c, -1), LPX_EINVAL);
    }
    int64_t sblocks[] = {-1, 65537};   /* 0 is LPX_NF4_SCALER_BLOCK_AUTO */
    for (size_t i = 0; i < sizeof sblocks / sizeof *sblocks; i++) {
        lpx_nf4_config c = cfg(64, sblocks[i]);
        CHECK_ERR(lpx_nf4_quantize(x, &c, &w), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "scaler_block") != NULL);
    }
    lpx_nf4_config ok = cfg(4096, 65536);
    CHECK_OK(lpx_nf4_config_check(&ok, -1));
    CHECK_OK(lpx_nf4_config_check(NULL, 12345));
    ok.pad = false;
    CHECK_ERR(lpx_nf4_config_check(&ok, 4096), LPX_EINVAL);
    CHECK_ERR(lpx_nf4_bytes(1, s, NULL, NULL), LPX_EINVAL);
    int64_t neg[1] = {-5};
    CHECK_ERR(lpx_nf4_bytes(1, neg, NULL, &bytes), LPX_EINVAL);
    CHECK(w == NULL);
    /* wrong inputs */
    lpx_tensor *i32 = NULL, *d = NULL, *q = NULL;
    CHECK_OK(lpx_zeros(1, s, LPX_I32, lpx_cpu(), &i32));
    CHECK_ERR(lpx_nf4_quantize(i32, NULL, &q), LPX_EDTYPE);
    CHECK_ERR(lpx_nf4_quantize(NULL, NULL, &q), LPX_EINVAL);
    CHECK_ERR(lpx_nf4_dequantize(x, LPX_F32, &d), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "not an nf4") != NULL);
    lpx_nf4_config c256 = cfg(64, 256);   /* the payload below is cut for 64 x 256 */
    CHECK_OK(lpx_nf4_quantize(x, &c256, &q));
    lpx_tensor *q2 = NULL;
    CHECK_ERR(lpx_nf4_quantize(q, NULL, &q2), LPX_EINVAL);
    CHECK_ERR(lpx_nf4_dequantize(q, LPX_I8, &d), LPX_EDTYPE);
    CHECK_ERR(lpx_nf4_dequantize_rows(q, 900, 200, LPX_F32, NULL, &d), LPX_ERANGE);
    lpx_tensor *scratch = NULL;
    int64_t ss[1] = {99};
    CHECK_OK(lpx_empty(1, ss, LPX_F32, lpx_cpu(), &scratch));
    CHECK_ERR(lpx_nf4_dequantize_rows(q, 0, 100, LPX_F32, scratch, &d), LPX_ESHAPE);
    lpx_tensor *r = NULL;
    CHECK_OK(lpx_nf4_dequantize_rows(q, 1, 99, LPX_F32, scratch, &r));
    CHECK(r == scratch);
    lpx_tensor_release(r);
    /* the dense op refuses inconsistent payloads */
    lpx_value args[10] = {lpx_v_tensor(lpx_tensor_inner(q, 0)), lpx_v_tensor(lpx_tensor_inner(q, 1)),
                          lpx_v_tensor(lpx_tensor_inner(q, 2)), lpx_v_tensor(lpx_tensor_inner(q, 3)),
                          lpx_v_i64(128), lpx_v_i64(256), lpx_v_i64(0), lpx_v_i64(10), lpx_v_dtype(LPX_F32),
                          lpx_v_none()};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_nf4_dequantize, args, 10);
    CHECK_ERR(lpx_dispatch(&c), LPX_ESHAPE);
    args[4] = lpx_v_i64(64);
    args[7] = lpx_v_i64(20000);
    lpx_call_init(&c, LPX_OP_nf4_dequantize, args, 10);
    CHECK_ERR(lpx_dispatch(&c), LPX_ERANGE);
    lpx_tensor *tmp[] = {x, i32, q, scratch};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) lpx_tensor_release(tmp[i]);
}

static void test_out_of_memory(void)
{
    int64_t xs[2] = {256, 128}, as[2] = {4, 128}, bs[2] = {256, 4}, gs[2] = {256, 256};
    oom_x = rand_normal(2, xs, 140, 1.0, LPX_BF16);
    oom_dense = rand_normal(2, xs, 141, 1.0, LPX_F32);
    oom_a = rand_normal(2, as, 142, 1.0, LPX_F32);
    oom_b = rand_normal(2, bs, 143, 1.0, LPX_F32);
    oom_g = rand_normal(2, gs, 144, 1.0, LPX_F32);
    CHECK_OK(lpx_nf4_quantize(oom_x, NULL, &oom_w));
    struct { const char *name; lpx_status (*fn)(void); } sc[] = {
        {"quantize", oom_quantize}, {"views", oom_views}, {"copy_", oom_copy},
        {"qlora", oom_qlora},       {"hooks", oom_hooks}, {"fallback", oom_fallback},
    };
    for (size_t k = 0; k < sizeof sc / sizeof *sc && oom_w; k++) {
        int n = 0;
        for (; n < 2000; n++) {
            lpx__fail_alloc_after(n);
            lpx_clear_error();
            lpx_status st = sc[k].fn();
            lpx__fail_alloc_after(-1);
            if (st == LPX_OK) break;
            CHECKF(st == LPX_ENOMEM && lpx_last_error()[0], "%s, allocation %d failing: %s (%s)", sc[k].name, n,
                   lpx_status_string(st), lpx_last_error());
            if (st != LPX_ENOMEM) break;
        }
        CHECKF(n > 0 && n < 2000, "%s: %d failing attempts", sc[k].name, n);
    }
    CHECK(!lpx_nf4_fallback_enabled());
    lpx_tensor *t[] = {oom_x, oom_w, oom_a, oom_b, oom_g, oom_dense};
    for (int i = 0; i < 6; i++) lpx_tensor_release(t[i]);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_handlers_views);
    RUN(test_handlers_copy);
    RUN(test_fallback);
    RUN(test_hooks);
    RUN(test_unflatten);
    RUN(test_bad_configs);
    RUN(test_out_of_memory);
    RUN(test_no_leaks);
    return CHECK_DONE();
}
