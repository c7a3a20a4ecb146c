/* Contracts on a kind's representation: it declares what the kit needs,
 * flatten/unflatten round-trips, from_dense keeps the logical dtype, the
 * quantization error stays within the declared bound on every
 * distribution, and bad input is refused with a message. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cf_util.h"

/* from_dense through the vtable, checked to give a tensor of kind k with
 * x's shape; on failure writes the detail and returns CF_FAIL. */
static cf_outcome quantize(const lpx_kind *k, lpx_tensor *x, lpx_tensor **q, char *d, size_t len)
{
    lpx_status st = cf_from_dense(k, x, q);
    if (st) return cf_lpx_fail(d, len, "from_dense", st);
    char sa[128], sb[128];
    if (lpx_tensor_kind(*q) != k)
        return cf_say(CF_FAIL, d, len, "from_dense returned a '%s' tensor", lpx_kind_name(lpx_tensor_kind(*q)));
    if (!cf_same_shape(*q, x, sa, sb, sizeof sa))
        return cf_say(CF_FAIL, d, len, "from_dense returned shape %s for input %s", sa, sb);
    return CF_PASS;
}

/* to_dense checked to keep the shape */
static cf_outcome dequantize(lpx_tensor *q, lpx_tensor **dq, char *d, size_t len)
{
    lpx_status st = cf_dense(q, dq);
    if (st) return cf_lpx_fail(d, len, "to_dense", st);
    char sa[128], sb[128];
    if (!cf_same_shape(*dq, q, sa, sb, sizeof sa))
        return cf_say(CF_FAIL, d, len, "to_dense returned shape %s for a tensor of shape %s", sa, sb);
    return CF_PASS;
}

static cf_outcome c_declares(const lpx_kind *k, char *d, size_t len)
{
    cf_params p;
    cf_params_of(k, &p);
    lpx_tensor *x = NULL, *q = NULL, *dq = NULL;
    cf_outcome o = CF_PASS;
    lpx_status st = cf_data(&p, CF_DIST_NORMAL, 1, &x);
    if (st) return cf_lpx_fail(d, len, "making test data of the declared shape", st);
    if ((o = quantize(k, x, &q, d, len)) == CF_PASS) o = dequantize(q, &dq, d, len);
    if (o == CF_PASS) {
        int64_t unit = cf_shard_unit(q);
        const lpx_kind_i *vt = lpx_kind_vtable(k);
        char desc[256] = "", s[128];
        if (unit < 1 || p.shape[0] % unit)
            o = cf_say(CF_FAIL, d, len, "shard_unit is %lld; the declared dim 0 (%lld) must be a positive multiple",
                       (long long)unit, (long long)p.shape[0]);
        else if (vt->describe && vt->describe(q, desc, sizeof desc) <= 0)
            o = cf_say(CF_FAIL, d, len, "describe wrote nothing");
        else
            o = cf_say(CF_PASS, d, len, "shape %s, shard unit %lld, max_err %g, min SQNR %g dB%s%s",
                       lpx_tensor_shape_str(q, s, sizeof s), (long long)unit, p.max_err, p.min_sqnr_db,
                       desc[0] ? "; " : "", desc);
    }
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    lpx_tensor_release(dq);
    return o;
}

static cf_outcome c_flatten(const lpx_kind *k, char *d, size_t len)
{
    cf_params p;
    cf_params_of(k, &p);
    lpx_tensor *x = NULL, *q = NULL, *u = NULL, *a = NULL, *b = NULL;
    lpx_status st = cf_data(&p, CF_DIST_NORMAL, 2, &x);
    if (st) return cf_lpx_fail(d, len, "making test data", st);
    cf_outcome o = quantize(k, x, &q, d, len);
    if (o == CF_PASS) {
        lpx_tensor *inner[LPX_MAX_INNER];
        int n = lpx_tensor_inner_count(q);
        for (int i = 0; i < n; i++) inner[i] = lpx_tensor_inner(q, i);
        size_t ms = 0;
        const void *meta = lpx_tensor_meta(q, &ms);
        st = lpx_kind_vtable(k)->unflatten(k, lpx_tensor_dtype(q), lpx_tensor_ndim(q), lpx_tensor_shape(q), inner,
                                           n, meta, ms, &u);
        if (st) o = cf_lpx_fail(d, len, "unflatten of the flattened tensor", st);
        else if (lpx_tensor_kind(u) != k || lpx_tensor_dtype(u) != lpx_tensor_dtype(q))
            o = cf_say(CF_FAIL, d, len, "unflatten returned a '%s' %s tensor, expected '%s' %s",
                       lpx_kind_name(lpx_tensor_kind(u)), lpx_dtype_name(lpx_tensor_dtype(u)), lpx_kind_name(k),
                       lpx_dtype_name(lpx_tensor_dtype(q)));
        else if ((o = dequantize(q, &a, d, len)) == CF_PASS && (o = dequantize(u, &b, d, len)) == CF_PASS) {
            double diff = cf_max_diff(b, a, NULL);
            o = diff == 0 ? cf_say(CF_PASS, d, len, "%d inner tensors, %zu bytes of metadata", n, ms)
                          : cf_say(CF_FAIL, d, len, "unflatten(flatten(t)) differs from t by up to %g", diff);
        }
    }
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    lpx_tensor_release(u);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    return o;
}

static cf_outcome c_logical_dtype(const lpx_kind *k, char *d, size_t len)
{
    cf_params p;
    cf_params_of(k, &p);
    lpx_tensor *x = NULL, *xb = NULL, *q = NULL, *dq = NULL;
    lpx_status st = cf_data(&p, CF_DIST_NORMAL, 3, &x);
    if (!st) st = lpx_cast(x, LPX_BF16, false, &xb);
    if (st) { lpx_tensor_release(x); return cf_lpx_fail(d, len, "making bf16 test data", st); }
    cf_outcome o = quantize(k, xb, &q, d, len);
    if (o == CF_PASS && lpx_tensor_dtype(q) != LPX_BF16)
        o = cf_say(CF_FAIL, d, len, "from_dense of a bf16 tensor has logical dtype %s, expected bf16",
                   lpx_dtype_name(lpx_tensor_dtype(q)));
    else if (o == CF_PASS && (o = dequantize(q, &dq, d, len)) == CF_PASS)
        o = cf_say(CF_PASS, d, len, "bf16 in, logical dtype bf16, dense f32 out");
    lpx_tensor_release(x);
    lpx_tensor_release(xb);
    lpx_tensor_release(q);
    lpx_tensor_release(dq);
    return o;
}

static cf_outcome c_quantize(const lpx_kind *k, int dist, char *d, size_t len)
{
    cf_params p;
    cf_params_of(k, &p);
    lpx_tensor *x = NULL, *q = NULL, *dq = NULL;
    lpx_status st = cf_data(&p, dist, 10 + (uint64_t)dist, &x);
    if (st) return cf_lpx_fail(d, len, "making test data", st);
    cf_outcome o = quantize(k, x, &q, d, len);
    if (o == CF_PASS) o = dequantize(q, &dq, d, len);
    if (o == CF_PASS) {
        double amax = 0, err = cf_max_diff(dq, x, &amax);
        double rel = amax > 0 ? err / amax : err;
        if (!(err <= p.max_err * amax))
            o = cf_say(CF_FAIL, d, len, "max error %.4g x amax exceeds the declared bound %g (amax %g, error %g)",
                       rel, p.max_err, amax, err);
        else if (dist == CF_DIST_NORMAL && p.min_sqnr_db > 0) {
            double db = cf_sqnr_db(x, dq);
            o = db >= p.min_sqnr_db
                    ? cf_say(CF_PASS, d, len, "max error %.4f x amax (bound %g), SQNR %.2f dB (bound %g)", rel,
                             p.max_err, db, p.min_sqnr_db)
                    : cf_say(CF_FAIL, d, len, "SQNR %.2f dB is below the declared %g dB", db, p.min_sqnr_db);
        } else {
            o = cf_say(CF_PASS, d, len, "max error %.4f x amax (bound %g)", rel, p.max_err);
        }
    }
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    lpx_tensor_release(dq);
    return o;
}

/* One refusal check: `st` must be an error with a message; a tensor the
 * kind returned anyway is released. Appends the name to `accepted` if not. */
static void expect_refused(lpx_status st, lpx_tensor **out, const char *what, char *accepted, size_t len, int *bad)
{
    if (out && *out) { lpx_tensor_release(*out); *out = NULL; }
    if (st != LPX_OK && lpx_last_error()[0]) return;
    size_t n = strlen(accepted);
    snprintf(accepted + n, len - n, "%s%s%s", *bad ? "; " : "", what, st == LPX_OK ? " was accepted" : " gave no message");
    (*bad)++;
}

static cf_outcome c_refusal(const lpx_kind *k, char *d, size_t len)
{
    cf_params p;
    cf_params_of(k, &p);
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    lpx_tensor *x = NULL, *q = NULL, *r = NULL;
    lpx_status st = cf_data(&p, CF_DIST_NORMAL, 4, &x);
    if (st) return cf_lpx_fail(d, len, "making test data", st);
    cf_outcome o = quantize(k, x, &q, d, len);
    if (o != CF_PASS) { lpx_tensor_release(x); return o; }
    char accepted[512] = "";
    int bad = 0, checks = 0;
    lpx_clear_error();
    expect_refused(vt->from_dense(k, q, &r), &r, "from_dense of a non-dense tensor", accepted, sizeof accepted, &bad);
    checks++;
    if (vt->unflatten) {
        lpx_tensor *inner[LPX_MAX_INNER];
        int n = lpx_tensor_inner_count(q), nd = lpx_tensor_ndim(q);
        for (int i = 0; i < n; i++) inner[i] = lpx_tensor_inner(q, i);
        size_t ms = 0;
        const void *meta = lpx_tensor_meta(q, &ms);
        int64_t shape[LPX_MAX_DIMS + 1];
        memcpy(shape, lpx_tensor_shape(q), (size_t)nd * sizeof *shape);
        lpx_dtype dt = lpx_tensor_dtype(q);
        lpx_clear_error();
        expect_refused(vt->unflatten(k, dt, nd, shape, NULL, 0, meta, ms, &r), &r, "unflatten without inner tensors",
                       accepted, sizeof accepted, &bad);
        checks++;
        if (ms > 0) {   /* a kind without metadata may accept none */
            lpx_clear_error();
            expect_refused(vt->unflatten(k, dt, nd, shape, inner, n, NULL, 0, &r), &r, "unflatten without metadata",
                           accepted, sizeof accepted, &bad);
            lpx_clear_error();
            expect_refused(vt->unflatten(k, dt, nd, shape, inner, n, meta, ms - 1, &r), &r,
                           "unflatten of truncated metadata", accepted, sizeof accepted, &bad);
            checks += 2;
        }
        shape[0] = 2 * shape[0] + 1;
        lpx_clear_error();
        expect_refused(vt->unflatten(k, dt, nd, shape, inner, n, meta, ms, &r), &r,
                       "unflatten with a shape the inner tensors do not hold", accepted, sizeof accepted, &bad);
        checks++;
    }
    if (vt->pre_all_gather) {
        lpx_tensor *ins[LPX_MAX_AG_INPUTS] = {0};
        int nin = 0;
        unsigned char meta[LPX_MAX_META];
        size_t ms = 0;
        lpx_clear_error();
        st = vt->pre_all_gather(x, NULL, ins, &nin, meta, &ms);
        for (int i = 0; st == LPX_OK && i < nin && i < LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(ins[i]);
        expect_refused(st, NULL, "pre_all_gather of a dense tensor", accepted, sizeof accepted, &bad);
        checks++;
    }
    if (vt->post_all_gather) {
        unsigned char meta[16] = {0};
        lpx_clear_error();
        expect_refused(vt->post_all_gather(k, NULL, 0, meta, sizeof meta, LPX_F32, NULL, &r), &r,
                       "post_all_gather of no outputs", accepted, sizeof accepted, &bad);
        checks++;
    }
    o = bad ? cf_say(CF_FAIL, d, len, "%s", accepted)
            : cf_say(CF_PASS, d, len, "%d kinds of bad input refused with a message", checks);
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    return o;
}

cf_outcome cf_run_quant(const cf_case *c, char *d, size_t len)
{
    switch (c->contract) {
    case CF_DECLARES: return c_declares(c->kind, d, len);
    case CF_FLATTEN: return c_flatten(c->kind, d, len);
    case CF_LOGICAL_DTYPE: return c_logical_dtype(c->kind, d, len);
    case CF_QUANTIZE: return c_quantize(c->kind, c->arg, d, len);
    case CF_REFUSAL: return c_refusal(c->kind, d, len);
    default: return cf_say(CF_FAIL, d, len, "internal: contract %d is not a representation contract", c->contract);
    }
}
