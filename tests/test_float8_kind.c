/* The float8 tests, the kind's handlers: views and scales, GEMM handlers,
 * the fallback and its trace count, unflatten validation, all-gather hooks,
 * out of memory and leaks. */
#include "float8_util.h"

/* ---- views, handlers -------------------------------------------------- */

static bool same_values(lpx_tensor *a, lpx_tensor *b)
{
    if (lpx_tensor_numel(a) != lpx_tensor_numel(b)) return false;
    double *x = values(a), *y = values(b);
    bool same = !memcmp(x, y, (size_t)lpx_tensor_numel(a) * sizeof *x);
    free(x);
    free(y);
    return same;
}

/* Two dim-0 shards through pre_all_gather, a simulated gather (cat along
 * dim 0), post_all_gather: the result equals the unsharded tensor. */
static void gather_roundtrip(lpx_tensor *full, bool expect_ok)
{
    const lpx_kind *k = lpx_float8_kind();
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    CHECK(vt->shard_unit(full) == 1);
    lpx_tensor *sh[2] = {0};
    int n = 0;
    CHECK_OK(lpx_chunk(full, 2, 0, sh, 2, &n));
    lpx_tensor *in[2][LPX_MAX_AG_INPUTS] = {{0}};
    int nin[2] = {0, 0};
    unsigned char meta[2][LPX_MAX_META];
    size_t msz[2] = {0, 0};
    lpx_status st = vt->pre_all_gather(sh[0], NULL, in[0], &nin[0], meta[0], &msz[0]);
    if (!expect_ok) {
        CHECK_ERR(st, LPX_ENOTIMPL);
        lpx_tensor_release(sh[0]);
        lpx_tensor_release(sh[1]);
        return;
    }
    CHECK_OK(st);
    CHECK_OK(vt->pre_all_gather(sh[1], NULL, in[1], &nin[1], meta[1], &msz[1]));
    CHECK(nin[0] == nin[1] && nin[0] >= 1);
    lpx_tensor *gathered[LPX_MAX_AG_INPUTS] = {0};
    for (int i = 0; i < nin[0]; i++) {
        lpx_tensor *pair[2] = {in[0][i], in[1][i]};
        CHECK_OK(lpx_cat(pair, 2, 0, &gathered[i]));
    }
    lpx_tensor *r = NULL, *r2 = NULL;
    CHECK_OK(vt->post_all_gather(k, gathered, nin[0], meta[0], msz[0], LPX_BF16, NULL, &r));
    CHECK(r && lpx_tensor_dtype(r) == LPX_BF16);
    lpx_tensor *df = NULL, *dr = NULL;
    CHECK_OK(lpx_float8_dequantize(full, LPX_F32, &df));
    if (r) {
        CHECK_OK(lpx_float8_dequantize(r, LPX_F32, &dr));
        CHECK(same_values(df, dr));
        /* second step: refill r in place */
        CHECK_OK(vt->post_all_gather(k, gathered, nin[0], meta[0], msz[0], LPX_BF16, r, &r2));
        CHECK(r2 == r);
    }
    /* gathered bytes arriving as u8 are reinterpreted */
    lpx_tensor *u8 = NULL, *r3 = NULL;
    CHECK_OK(lpx_zeros(lpx_tensor_ndim(gathered[0]), lpx_tensor_shape(gathered[0]), LPX_U8, lpx_cpu(), &u8));
    memcpy(lpx_tensor_data(u8), lpx_tensor_data(gathered[0]), (size_t)lpx_tensor_numel(u8));
    lpx_tensor *g2[LPX_MAX_AG_INPUTS];
    memcpy(g2, gathered, sizeof g2);
    g2[0] = u8;
    CHECK_OK(vt->post_all_gather(k, g2, nin[0], meta[0], msz[0], 0, NULL, &r3));
    if (r3) {
        lpx_tensor *d3 = NULL;
        CHECK_OK(lpx_float8_dequantize(r3, LPX_F32, &d3));
        CHECK(same_values(df, d3));
        lpx_tensor_release(d3);
    }
    lpx_tensor_release(r3);
    CHECK_ERR(vt->post_all_gather(k, gathered, nin[0] + 1, meta[0], msz[0], 0, NULL, &r3), LPX_EINVAL);
    CHECK(r3 == NULL);
    lpx_tensor_release(u8);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < nin[s]; i++) lpx_tensor_release(in[s][i]);
    for (int i = 0; i < nin[0]; i++) lpx_tensor_release(gathered[i]);
    lpx_tensor *rel[] = {sh[0], sh[1], r, r2, df, dr};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static lpx_tensor *oom_x, *oom_w, *oom_g; /* test_out_of_memory's inputs */

/* ---- out of memory ----------------------------------------------------- */

LPX_API void lpx__fail_alloc_after(long n);

typedef lpx_status (*oom_fn)(void);

static lpx_status oom_quantize(void)
{
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.granularity = LPX_FLOAT8_AXISWISE;
    o.axis = -1;
    lpx_tensor *q = NULL, *t = NULL, *d = NULL;
    lpx_status st = lpx_float8_quantize(oom_x, &o, &q, NULL);
    if (!st) st = lpx_t(q, &t);
    if (!st) st = lpx_float8_dequantize(t, LPX_BF16, &d);
    lpx_tensor_release(q);
    lpx_tensor_release(t);
    lpx_tensor_release(d);
    return st;
}

static lpx_status oom_linear(const char *preset)
{
    lpx_float8_linear_recipe r;
    lpx_float8_linear_state s;
    lpx_status st = lpx_float8_linear_recipe_preset(preset, &r);
    if (st || (st = lpx_float8_linear_state_init(&s, &r))) return st;
    lpx_tensor *out = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    lpx_float8_linear_ctx *ctx = NULL;
    st = lpx_float8_linear_forward(&r, &s, oom_x, oom_w, NULL, &out, &ctx, NULL);
    if (!st) st = lpx_float8_linear_backward(ctx, oom_g, &gx, &gw, &gb, NULL);
    lpx_float8_linear_ctx_free(ctx);
    lpx_tensor *rel[] = {out, gx, gw, gb};
    for (size_t i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
    lpx_float8_linear_state_destroy(&s);
    return st;
}
static lpx_status oom_linear_tw(void) { return oom_linear("tensorwise"); }
static lpx_status oom_linear_rw(void) { return oom_linear("rowwise"); }
static lpx_status oom_linear_delayed(void) { return oom_linear("delayed"); }

static lpx_status oom_fallback(void)
{
    lpx_tensor *q = NULL, *r = NULL;
    lpx_status st = lpx_float8_quantize(oom_x, NULL, &q, NULL);
    if (!st) st = lpx_float8_set_fallback(true);
    if (!st) st = lpx_add(q, q, &r);
    if (!st) st = lpx_fill_(q, 1.0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    lpx__fail_alloc_after(-1);
    lpx_float8_set_fallback(false);  /* clears the message: restore it */
    lpx_tensor_release(q);
    lpx_tensor_release(r);
    return st ? lpx_error(st, "%s", msg) : st;
}

static lpx_status oom_delayed(void)
{
    lpx_float8_delayed *d = NULL, *e = NULL;
    unsigned char blob[BUFSIZ];
    size_t n = 0;
    lpx_float8_delayed_config c = {16, 0, 0, 1, 0};
    lpx_status st = lpx_float8_delayed_new(&c, &d);
    if (!st) st = lpx_float8_delayed_update(d, 3.0);
    if (!st) st = lpx_float8_delayed_save(d, blob, sizeof blob, &n);
    if (!st) st = lpx_float8_delayed_new(NULL, &e);
    if (!st) st = lpx_float8_delayed_load(e, blob, n);
    lpx_float8_delayed_free(d);
    lpx_float8_delayed_free(e);
    return st;
}

static void test_views(void)
{
    int64_t shape[2] = {12, 20};
    lpx_tensor *x = rand_normal(2, shape, 31, 1.0, LPX_F32);
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *dq = NULL;
    CHECK_OK(lpx_float8_dequantize(q, LPX_FLOAT8_LOGICAL, &dq));
    /* transpose: scales follow their axis */
    lpx_tensor *qt = NULL, *dqt = NULL;
    CHECK_OK(lpx_t(q, &qt));
    CHECK(lpx_float8_is(qt) && lpx_tensor_shape(qt)[0] == 20);
    lpx_float8_info info;
    CHECK_OK(lpx_float8_get_info(qt, &info));
    CHECK(info.axis == 0);
    CHECK(lpx_tensor_shape(lpx_float8_scale(qt))[0] == 1 && lpx_tensor_shape(lpx_float8_scale(qt))[1] == 12);
    CHECK(lpx_tensor_shares_storage(lpx_float8_data(qt), lpx_float8_data(q)));
    CHECK_OK(lpx_t(dq, &dqt));
    CHECK(same_values(qt, dqt));
    lpx_tensor *qtt = NULL;
    CHECK_OK(lpx_transpose(qt, -1, 0, &qtt));
    CHECK(same_values(qtt, dq));
    /* slice / narrow / chunk along dim 0: row scales are cut with rows */
    lpx_tensor *qs = NULL, *ds = NULL;
    CHECK_OK(lpx_slice(q, 0, 2, 11, 3, &qs));
    CHECK_OK(lpx_slice(dq, 0, 2, 11, 3, &ds));
    CHECK(lpx_float8_is(qs) && lpx_tensor_shape(lpx_float8_scale(qs))[0] == 3 && same_values(qs, ds));
    lpx_tensor *chunks[4] = {0}, *dchunks[4] = {0};
    int n = 0, dn = 0;
    CHECK_OK(lpx_chunk(q, 3, 0, chunks, 4, &n));
    CHECK_OK(lpx_chunk(dq, 3, 0, dchunks, 4, &dn));
    CHECK(n == 3 && dn == 3);
    for (int i = 0; i < n && i < dn; i++) CHECK(lpx_float8_is(chunks[i]) && same_values(chunks[i], dchunks[i]));
    /* narrow along the scaled axis keeps the [M, 1] scales */
    lpx_tensor *qn = NULL, *dn2 = NULL;
    CHECK_OK(lpx_narrow(q, 1, 5, 7, &qn));
    CHECK_OK(lpx_narrow(dq, 1, 5, 7, &dn2));
    CHECK(lpx_tensor_shape(lpx_float8_scale(qn))[1] == 1 && same_values(qn, dn2));
    /* view / reshape: rows regroup with their scales */
    int64_t s3[3] = {3, 4, 20}, bad[2] = {20, 12};
    lpx_tensor *qv = NULL, *dv = NULL, *qbad = NULL;
    CHECK_OK(lpx_view(q, 3, s3, &qv));
    CHECK_OK(lpx_view(dq, 3, s3, &dv));
    CHECK(lpx_tensor_ndim(lpx_float8_scale(qv)) == 3 && same_values(qv, dv));
    CHECK_ERR(lpx_reshape(q, 2, bad, &qbad), LPX_ESHAPE);
    CHECK(strstr(lpx_last_error(), "float8"));
    /* tensorwise: any reshape */
    lpx_tensor *qw = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL), *qwr = NULL, *dwr = NULL,
               *dw = NULL;
    int64_t flat[1] = {-1};
    CHECK_OK(lpx_reshape(qw, 1, flat, &qwr));
    CHECK_OK(lpx_float8_dequantize(qw, LPX_FLOAT8_LOGICAL, &dw));
    CHECK_OK(lpx_reshape(dw, 1, flat, &dwr));
    CHECK(lpx_tensor_ndim(qwr) == 1 && same_values(qwr, dwr));
    /* contiguous of a transposed float8 copies the fp8 bytes only */
    lpx_tensor *qc = NULL;
    CHECK_OK(lpx_contiguous(qt, &qc));
    CHECK(lpx_tensor_is_contiguous(lpx_float8_data(qc)) && same_values(qc, dqt));
    /* clone owns its storage; detach shares it */
    lpx_tensor *qcl = NULL, *qd = NULL;
    CHECK_OK(lpx_clone(q, &qcl));
    CHECK_OK(lpx_detach(q, &qd));
    CHECK(!lpx_tensor_shares_storage(lpx_float8_data(qcl), lpx_float8_data(q)));
    CHECK(lpx_float8_data(qd) == lpx_float8_data(q) && same_values(qcl, dq));
    /* cast = dequantize, to any float dtype */
    lpx_tensor *cb = NULL, *cf = NULL, *c8 = NULL;
    CHECK_OK(lpx_cast(q, LPX_BF16, false, &cb));
    CHECK_OK(lpx_cast(q, LPX_F32, false, &cf));
    CHECK_OK(lpx_cast(q, LPX_F8E5M2, true, &c8));
    CHECK(!lpx_float8_is(cf) && lpx_tensor_dtype(cb) == LPX_BF16 && same_values(cf, dq));
    CHECK(lpx_tensor_dtype(c8) == LPX_F8E5M2);
    /* copy_ into float8 re-quantizes with its own scales; copy_ out
     * dequantizes */
    lpx_tensor *dst = NULL, *back = NULL;
    CHECK_OK(lpx_clone(q, &dst));
    CHECK_OK(lpx_copy_(dst, dq));
    CHECK(!memcmp(lpx_tensor_data(lpx_float8_data(dst)), lpx_tensor_data(lpx_float8_data(q)), 12 * 20));
    CHECK_OK(lpx_zeros(2, shape, LPX_F32, lpx_cpu(), &back));
    CHECK_OK(lpx_copy_(back, q));
    CHECK(same_values(back, dq));
    /* copy_ into a row slice of a float8 tensor writes through to it */
    lpx_tensor *row = NULL, *zr = NULL;
    int64_t rs[1] = {20};
    CHECK_OK(lpx_narrow(dst, 0, 4, 1, &row));
    CHECK_OK(lpx_zeros(1, rs, LPX_F32, lpx_cpu(), &zr));
    CHECK_OK(lpx_copy_(row, zr));
    const uint8_t *dc = lpx_tensor_data(lpx_float8_data(dst));
    int nz = 0;
    for (int k = 0; k < 20; k++) nz += dc[4 * 20 + k] != 0;
    CHECK(nz == 0 && dc[3 * 20] == ((const uint8_t *)lpx_tensor_data(lpx_float8_data(q)))[3 * 20]);
    lpx_tensor *rel[] = {x, q, dq, qt, dqt, qtt, qs, ds, qn, dn2, qv, dv, qw, qwr, dwr, dw, qc, qcl, qd,
                         cb, cf, c8, dst, back, row, zr};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
    for (int i = 0; i < 4; i++) {
        lpx_tensor_release(chunks[i]);
        lpx_tensor_release(dchunks[i]);
    }
}

static void test_gemm_handlers(void)
{
    int64_t sx[3] = {2, 8, 32}, sw[2] = {24, 32}, sb[1] = {24}, sc[2] = {16, 24};
    lpx_tensor *x = rand_normal(3, sx, 41, 1.0, LPX_F32), *w = rand_normal(2, sw, 42, 0.2, LPX_F32);
    lpx_tensor *b = rand_normal(1, sb, 43, 1.0, LPX_F32), *cc = rand_normal(2, sc, 44, 1.0, LPX_F32);
    lpx_tensor *qx = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *qw = quant(w, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *dx = NULL, *dw = NULL, *y = NULL, *yref = NULL;
    CHECK_OK(lpx_float8_dequantize(qx, LPX_FLOAT8_LOGICAL, &dx));
    CHECK_OK(lpx_float8_dequantize(qw, LPX_FLOAT8_LOGICAL, &dw));
    /* linear(float8 x [2, 8, 32], float8 w) = linear on the dequantized values */
    CHECK_OK(lpx_linear(qx, qw, b, &y));
    CHECK_OK(lpx_linear(dx, dw, b, &yref));
    CHECK(y && lpx_tensor_ndim(y) == 3 && !lpx_float8_is(y));
    if (y && yref) {
        double *a = values(y), *r = values(yref), err = 0, mx = 0;
        for (int i = 0; i < 2 * 8 * 24; i++) {
            err = fmax(err, fabs(a[i] - r[i]));
            mx = fmax(mx, fabs(r[i]));
        }
        CHECKF(err <= 1e-5 * mx, "linear: %.3g", err / mx);
        free(a);
        free(r);
    }
    /* matmul with W^T and addmm */
    lpx_tensor *qwt = NULL, *m = NULL, *mref = NULL, *dwt = NULL, *x2 = NULL, *dx2 = NULL, *am = NULL, *amref = NULL;
    int64_t s2[2] = {16, 32};
    CHECK_OK(lpx_t(qw, &qwt));
    CHECK_OK(lpx_t(dw, &dwt));
    CHECK_OK(lpx_reshape(qx, 2, s2, &x2));
    CHECK_OK(lpx_reshape(dx, 2, s2, &dx2));
    CHECK_OK(lpx_matmul(x2, qwt, &m));
    CHECK_OK(lpx_matmul(dx2, dwt, &mref));
    CHECK_OK(lpx_addmm(cc, x2, qwt, 0.5, 2.0, &am));
    CHECK_OK(lpx_addmm(cc, dx2, dwt, 0.5, 2.0, &amref));
    if (m && mref && am && amref) {
        double *a = values(m), *r = values(mref), *p = values(am), *pr = values(amref), e1 = 0, e2 = 0, mx = 0;
        for (int i = 0; i < 16 * 24; i++) {
            e1 = fmax(e1, fabs(a[i] - r[i]));
            e2 = fmax(e2, fabs(p[i] - pr[i]));
            mx = fmax(mx, fabs(pr[i]));
        }
        CHECK(e1 <= 1e-5 * mx && e2 <= 1e-5 * mx);
        free(a);
        free(r);
        free(p);
        free(pr);
    }
    /* matmul into a caller out */
    lpx_tensor *o = NULL;
    CHECK_OK(lpx_zeros(2, sc, LPX_F32, lpx_cpu(), &o));
    CHECK_OK(lpx_matmul_out(x2, qwt, o));
    CHECK(same_values(o, m));
    lpx_tensor *rel[] = {x, w, b, cc, qx, qw, dx, dw, y, yref, qwt, m, mref, dwt, x2, dx2, am, amref, o};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

/* The opt-in fallback: off, an op without a handler fails naming op and
 * kind; on, it runs dequantized and the trace counts it. */
static void test_fallback_and_trace(void)
{
    int64_t shape[2] = {4, 6};
    lpx_tensor *x = rand_normal(2, shape, 51, 1.0, LPX_F32);
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL), *r = NULL, *dq = NULL, *ref = NULL;
    CHECK(!lpx_float8_fallback_enabled());
    CHECK_ERR(lpx_add(q, q, &r), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "add") && strstr(lpx_last_error(), "float8"));
    CHECK_OK(lpx_float8_set_fallback(true));
    CHECK_OK(lpx_float8_set_fallback(true)); /* idempotent */
    CHECK(lpx_float8_fallback_enabled());
    int key = lpx_kind_key(lpx_float8_kind());
    CHECK_OK(lpx_trace_start(NULL));
    CHECK_OK(lpx_add(q, x, &r));
    CHECK_OK(lpx_float8_dequantize(q, LPX_FLOAT8_LOGICAL, &dq));
    CHECK_OK(lpx_add(dq, x, &ref));
    CHECK(r && !lpx_float8_is(r) && same_values(r, ref));
    lpx_tensor *s = NULL;
    CHECK_OK(lpx_sum(q, 0, NULL, false, &s));
    /* in place on a float8 tensor: written back with its own scale */
    lpx_tensor *qc = NULL;
    CHECK_OK(lpx_clone(q, &qc));
    CHECK_OK(lpx_fill_(qc, 0.5));
    double *v = values(qc);
    /* 0.5 * scale rounded to e4m3 (3 mantissa bits) and back */
    CHECK(fabs(v[0] - 0.5) <= 0.5 / 16 && v[23] == v[0]);
    free(v);
    /* a mixed GEMM goes to the fallback too */
    lpx_tensor *xt = NULL, *mm = NULL;
    CHECK_OK(lpx_t(x, &xt));
    CHECK_OK(lpx_matmul(q, xt, &mm));
    CHECK_OK(lpx_trace_stop());
    CHECK(lpx_trace_fallback_count(LPX_OP_add, key) == 1);
    CHECK(lpx_trace_fallback_count(LPX_OP_sum, key) == 1);
    CHECK(lpx_trace_fallback_count(LPX_OP_fill_, key) == 1);
    CHECK(lpx_trace_count(LPX_OP_add, key) == 1);         /* the fallback's own call */
    CHECK(lpx_trace_count(LPX_OP_add, LPX_KEY_CPU) == 2); /* its dense add + the reference */
    CHECK(lpx_trace_count(LPX_OP_fp8_dequantize, LPX_KEY_CPU) >= 3);
    CHECK_OK(lpx_float8_set_fallback(false));
    CHECK(!lpx_float8_fallback_enabled());
    lpx_tensor *r2 = NULL;
    CHECK_ERR(lpx_add(q, q, &r2), LPX_ENOTIMPL);
    lpx_tensor *rel[] = {x, q, r, dq, ref, s, qc, xt, mm};
    for (size_t k = 0; k < sizeof rel / sizeof *rel; k++) lpx_tensor_release(rel[k]);
}

/* ---- flatten / unflatten, describe, hooks ------------------------------ */

static void test_unflatten(void)
{
    int64_t shape[2] = {6, 10};
    lpx_tensor *x = rand_normal(2, shape, 61, 1.0, LPX_F32);
    lpx_tensor *q = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    const lpx_kind *k = lpx_float8_kind();
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    lpx_tensor *inner[3] = {lpx_tensor_inner(q, 0), lpx_tensor_inner(q, 1), lpx_tensor_inner(q, 2)};
    size_t msz = 0;
    const void *meta = lpx_tensor_meta(q, &msz);
    unsigned char m[64];
    memcpy(m, meta, msz);
    lpx_tensor *r = NULL;
    CHECK_OK(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, m, msz, &r));
    CHECK(r && same_values(r, q));
    lpx_tensor_release(r);
    char desc[256];
    CHECK(vt->describe(q, desc, sizeof desc) > 0 && strstr(desc, "float8") && strstr(desc, "axiswise"));
    /* bad inputs, each refused with a message */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 2, m, msz, &r), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, m, msz - 1, &r), LPX_EINVAL);
    CHECK_ERR(vt->unflatten(k, LPX_F8E4M3FN, 2, shape, inner, 3, m, msz, &r), LPX_EDTYPE);
    int64_t wrong[2] = {6, 11};
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, wrong, inner, 3, m, msz, &r), LPX_ESHAPE);
    unsigned char mb[64];
    memcpy(mb, m, msz);
    mb[0] ^= 0xFF;
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, mb, msz, &r), LPX_EINVAL);
    memcpy(mb, m, msz);
    mb[8] = 7; /* axis out of range */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, mb, msz, &r), LPX_EINVAL);
    memcpy(mb, m, msz);
    mb[6] = 9; /* role */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, inner, 3, mb, msz, &r), LPX_EINVAL);
    lpx_tensor *swapped[3] = {inner[0], inner[2], inner[2]}; /* scale_inv is not 1/scale */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, swapped, 3, m, msz, &r), LPX_EINVAL);
    lpx_tensor *dense_as_data[3] = {x, inner[1], inner[2]};
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, dense_as_data, 3, m, msz, &r), LPX_EDTYPE);
    lpx_tensor *neg = NULL, *negs[3];
    CHECK_OK(lpx_mul_scalar(inner[1], -1.0, &neg));
    negs[0] = inner[0], negs[1] = neg, negs[2] = inner[2];
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, negs, 3, m, msz, &r), LPX_EINVAL);
    lpx_tensor *ts[3] = {inner[0], x, inner[2]}; /* scale of the data's shape */
    CHECK_ERR(vt->unflatten(k, LPX_F32, 2, shape, ts, 3, m, msz, &r), LPX_ESHAPE);
    CHECK(r == NULL);
    /* lpx_float8_from_data wraps existing bytes */
    lpx_tensor *sc = NULL, *w = NULL;
    CHECK_OK(lpx_full(1, (int64_t[]){1}, 4.0, LPX_F32, lpx_cpu(), &sc));
    CHECK_OK(lpx_float8_from_data(inner[0], sc, LPX_BF16, LPX_FLOAT8_ROLE_WEIGHT, LPX_FLOAT8_TENSORWISE, 0, &w));
    CHECK(w && lpx_tensor_dtype(w) == LPX_BF16 && item(lpx_float8_scale_inv(w), 0) == 0.25);
    CHECK_ERR(lpx_float8_from_data(x, sc, LPX_F32, 0, 0, 0, &r), LPX_EDTYPE);
    CHECK_ERR(lpx_float8_from_data(inner[0], sc, LPX_F32, 0, LPX_FLOAT8_AXISWISE, 0, &r), LPX_ESHAPE);
    CHECK_ERR(lpx_float8_from_data(inner[0], sc, LPX_F32, 7, 0, 0, &r), LPX_EINVAL);
    lpx_tensor *rel[] = {x, q, neg, sc, w};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

static void test_all_gather_hooks(void)
{
    int64_t shape[2] = {10, 16};
    lpx_tensor *x = rand_normal(2, shape, 71, 1.0, LPX_F32);
    lpx_tensor *qt = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_TENSORWISE, 0, false, NULL);
    lpx_tensor *qr = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, -1, false, NULL);
    lpx_tensor *qc = quant(x, LPX_F8E4M3FN, LPX_FLOAT8_AXISWISE, 0, false, NULL);
    gather_roundtrip(qt, true);
    gather_roundtrip(qr, true);
    gather_roundtrip(qc, false);
    lpx_tensor *rel[] = {x, qt, qr, qc};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

/* Each entry point with its 1st, 2nd, ... allocation failing: LPX_OK or
 * LPX_ENOMEM with a message, nothing leaked (LSan checks the run). */
static void test_out_of_memory(void)
{
    int64_t sx[2] = {8, 32}, sw[2] = {16, 32}, sg[2] = {8, 16};
    oom_x = rand_normal(2, sx, 81, 1.0, LPX_F32);
    oom_w = rand_normal(2, sw, 82, 0.2, LPX_F32);
    oom_g = rand_normal(2, sg, 83, 1.0, LPX_F32);
    struct { const char *name; oom_fn fn; } sc[] = {
        {"quantize", oom_quantize}, {"linear tensorwise", oom_linear_tw}, {"linear rowwise", oom_linear_rw},
        {"linear delayed", oom_linear_delayed}, {"fallback", oom_fallback}, {"delayed", oom_delayed},
    };
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) {
        int n;
        for (n = 0; n < 2000; n++) {
            lpx__fail_alloc_after(n);
            lpx_clear_error();
            lpx_status st = sc[i].fn();
            lpx__fail_alloc_after(-1);
            if (st == LPX_OK) break;
            CHECKF(st == LPX_ENOMEM && lpx_last_error()[0], "%s, allocation %d failing: %s (%s)", sc[i].name, n,
                   lpx_status_string(st), lpx_last_error());
            if (st != LPX_ENOMEM) break;
        }
        CHECKF(n < 2000, "%s never succeeded", sc[i].name);
    }
    CHECK(!lpx_float8_fallback_enabled());
    lpx_tensor_release(oom_x);
    lpx_tensor_release(oom_w);
    lpx_tensor_release(oom_g);
}

int main(void)
{
    RUN(test_views);
    RUN(test_gemm_handlers);
    RUN(test_fallback_and_trace);
    RUN(test_unflatten);
    RUN(test_all_gather_hooks);
    RUN(test_out_of_memory);
    RUN(test_no_live_tensors);
    return CHECK_DONE();
}
