/* Sharding contracts, with the all-gather simulated (the sharding engine
 * is not needed): for world sizes 1..4 the tensor is cut along dim 0 as
 * the engine cuts it (torch.chunk sizes rounded up to the shard unit,
 * trailing shards smaller or empty), pre_all_gather runs on every shard,
 * the bytes of each input are concatenated in rank order as an all-gather
 * delivers them, and post_all_gather (with each rank's metadata, then in
 * place) must rebuild exactly the unsharded tensor. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cf_util.h"

#define MAX_WORLD 8

typedef struct rank_io {
    lpx_tensor *in[LPX_MAX_AG_INPUTS];
    int n;
    unsigned char meta[LPX_MAX_META];
    size_t meta_size;
} rank_io;

/* Checks that rank r's inputs can go on the wire next to rank 0's. */
static cf_outcome check_inputs(const rank_io *io, int r, char *d, size_t len)
{
    const rank_io *z = &io[0], *me = &io[r];
    if (me->n < 1 || me->n > LPX_MAX_AG_INPUTS)
        return cf_say(CF_FAIL, d, len, "rank %d: pre_all_gather gave %d inputs (1..%d)", r, me->n, LPX_MAX_AG_INPUTS);
    if (me->meta_size > LPX_MAX_META)
        return cf_say(CF_FAIL, d, len, "rank %d: meta_size %zu > %d", r, me->meta_size, LPX_MAX_META);
    if (me->n != z->n)
        return cf_say(CF_FAIL, d, len, "rank %d has %d inputs, rank 0 has %d", r, me->n, z->n);
    for (int i = 0; i < me->n; i++) {
        const lpx_tensor *t = me->in[i], *t0 = z->in[i];
        if (!t || lpx_tensor_kind(t) || lpx_tensor_device(t).type != LPX_DEVICE_CPU || !lpx_tensor_is_contiguous(t))
            return cf_say(CF_FAIL, d, len, "rank %d input %d is not a dense contiguous CPU tensor", r, i);
        if (lpx_tensor_ndim(t) < 1 || lpx_tensor_dtype(t) != lpx_tensor_dtype(t0) || lpx_tensor_ndim(t) != lpx_tensor_ndim(t0))
            return cf_say(CF_FAIL, d, len, "rank %d input %d: %s with %d dims, rank 0 sends %s with %d dims", r, i,
                          lpx_dtype_name(lpx_tensor_dtype(t)), lpx_tensor_ndim(t), lpx_dtype_name(lpx_tensor_dtype(t0)),
                          lpx_tensor_ndim(t0));
        for (int k = 1; k < lpx_tensor_ndim(t); k++)
            if (lpx_tensor_shape(t)[k] != lpx_tensor_shape(t0)[k])
                return cf_say(CF_FAIL, d, len, "rank %d input %d: dim %d is %lld, rank 0 has %lld", r, i, k,
                              (long long)lpx_tensor_shape(t)[k], (long long)lpx_tensor_shape(t0)[k]);
        const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(t));
        if ((lpx_tensor_numel(t) * tr->bits) % 8)
            return cf_say(CF_FAIL, d, len, "rank %d input %d is not a whole number of bytes", r, i);
    }
    return CF_PASS;
}

/* outputs[i] = inputs[i] of every rank, bytes in rank order */
static lpx_status gather(const rank_io *io, int world, int i, lpx_tensor **out)
{
    const lpx_tensor *t0 = io[0].in[i];
    int64_t shape[LPX_MAX_DIMS];
    memcpy(shape, lpx_tensor_shape(t0), (size_t)lpx_tensor_ndim(t0) * sizeof *shape);
    shape[0] = 0;
    for (int r = 0; r < world; r++) shape[0] += lpx_tensor_shape(io[r].in[i])[0];
    lpx_status st = lpx_tensor_new(lpx_tensor_dtype(t0), lpx_tensor_ndim(t0), shape, lpx_cpu(), out);
    if (st) return st;
    size_t off = 0;
    for (int r = 0; r < world; r++) {
        const lpx_tensor *t = io[r].in[i];
        size_t nb = lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
        if (nb) memcpy((char *)lpx_tensor_data(*out) + off, lpx_tensor_data(t), nb);
        off += nb;
    }
    return LPX_OK;
}

/* Checks a post_all_gather result against the unsharded tensor: of kind
 * `rk`, q's shape and logical dtype, and dequantized equal to `full`
 * exactly (`ref_q`: within max_err * amax of it as well). */
static cf_outcome check_result(const lpx_kind *rk, lpx_tensor *res, lpx_tensor *q, lpx_tensor *full, lpx_tensor *ref_q,
                               double max_err, const char *what, char *d, size_t len)
{
    char sa[128], sb[128];
    if (!res) return cf_say(CF_FAIL, d, len, "%s returned no tensor", what);
    if (lpx_tensor_kind(res) != rk)
        return cf_say(CF_FAIL, d, len, "%s returned a '%s' tensor, expected '%s'", what,
                      lpx_kind_name(lpx_tensor_kind(res)), lpx_kind_name(rk));
    if (!cf_same_shape(res, q, sa, sb, sizeof sa))
        return cf_say(CF_FAIL, d, len, "%s returned shape %s, the unsharded tensor is %s", what, sa, sb);
    if (lpx_tensor_dtype(res) != lpx_tensor_dtype(q))
        return cf_say(CF_FAIL, d, len, "%s returned logical dtype %s, param_dtype was %s", what,
                      lpx_dtype_name(lpx_tensor_dtype(res)), lpx_dtype_name(lpx_tensor_dtype(q)));
    lpx_tensor *rd = NULL;
    lpx_status st = cf_dense(res, &rd);
    if (st) return cf_lpx_fail(d, len, "to_dense of the gathered tensor", st);
    double amax = 0, diff = cf_max_diff(rd, full, NULL), qerr = ref_q ? cf_max_diff(rd, ref_q, &amax) : 0;
    lpx_tensor_release(rd);
    if (diff != 0)
        return cf_say(CF_FAIL, d, len, "%s differs from %s by up to %g", what,
                      ref_q ? "gathering the unsharded tensor on one rank" : "the unsharded tensor", diff);
    if (ref_q && !(qerr <= max_err * amax))
        return cf_say(CF_FAIL, d, len, "%s is %g away from to_dense of the unsharded tensor (bound %g x amax %g)",
                      what, qerr, max_err, amax);
    return CF_PASS;
}

/* The reference of a kind whose gather gives another kind (a wrapper):
 * post_all_gather(pre_all_gather(q)) on one rank, the unsharded
 * gather-then-cast value, dequantized. */
static cf_outcome one_rank_reference(const lpx_kind *k, lpx_tensor *q, lpx_tensor **out, char *d, size_t len)
{
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    rank_io io;
    memset(&io, 0, sizeof io);
    lpx_tensor *res = NULL;
    lpx_status st = vt->pre_all_gather(q, NULL, io.in, &io.n, io.meta, &io.meta_size);
    if (st) return cf_lpx_fail(d, len, "pre_all_gather of the unsharded tensor", st);
    if (io.n < 1 || io.n > LPX_MAX_AG_INPUTS) {
        for (int i = 0; i < io.n && i < LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(io.in[i]);
        return cf_say(CF_FAIL, d, len, "pre_all_gather of the unsharded tensor gave %d inputs", io.n);
    }
    st = vt->post_all_gather(k, io.in, io.n, io.meta, io.meta_size, lpx_tensor_dtype(q), NULL, &res);
    if (!st) st = cf_dense(res, out);
    for (int i = 0; i < io.n; i++) lpx_tensor_release(io.in[i]);
    lpx_tensor_release(res);
    return st ? cf_lpx_fail(d, len, "post_all_gather of the unsharded tensor", st) : CF_PASS;
}

static cf_outcome c_all_gather(const lpx_kind *k, int world, char *d, size_t len)
{
    cf_params p;
    cf_params_of(k, &p);
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    rank_io io[MAX_WORLD];
    memset(io, 0, sizeof io);
    lpx_tensor *x = NULL, *q = NULL, *full = NULL, *outs[LPX_MAX_AG_INPUTS] = {0}, *res = NULL, *res2 = NULL;
    lpx_tensor *ref_q = NULL;   /* wrappers: to_dense(q); `full` is then the one-rank gather */
    const lpx_kind *rk = k;     /* the kind post_all_gather must return */
    cf_outcome o = CF_PASS;
    char what[96];
    lpx_status st = cf_data(&p, CF_DIST_NORMAL, 30, &x);
    if (!st) st = cf_from_dense(k, x, &q);
    if (!st) st = cf_dense(q, &full);
    if (st) { o = cf_lpx_fail(d, len, "setting up", st); goto done; }
    if (p.all_gather_kind) {
        if ((st = lpx_kind_find(p.all_gather_kind, &rk))) {
            o = cf_lpx_fail(d, len, "finding the declared all_gather_kind", st);
            goto done;
        }
        ref_q = full;
        full = NULL;
        if ((o = one_rank_reference(k, q, &full, d, len)) != CF_PASS) goto done;
    }
    int64_t rows = lpx_tensor_shape(q)[0], unit = cf_shard_unit(q);
    if (unit < 1 || rows % unit) {
        o = cf_say(CF_FAIL, d, len, "shard_unit %lld does not divide dim 0 (%lld)", (long long)unit, (long long)rows);
        goto done;
    }
    int64_t chunk = (rows + world - 1) / world;
    chunk = (chunk + unit - 1) / unit * unit;
    for (int r = 0; r < world; r++) {
        int64_t start = r * chunk < rows ? r * chunk : rows, n = rows - start < chunk ? rows - start : chunk;
        lpx_tensor *shard = NULL;
        if ((st = lpx_narrow(q, 0, start, n, &shard))) {
            snprintf(what, sizeof what, "narrow(dim 0, %lld, %lld) for rank %d", (long long)start, (long long)n, r);
            o = cf_lpx_fail(d, len, what, st);
            goto done;
        }
        if (lpx_tensor_kind(shard) != k) {
            o = cf_say(CF_FAIL, d, len, "narrow for rank %d returned a '%s' tensor; shards must keep the kind", r,
                       lpx_kind_name(lpx_tensor_kind(shard)));
            lpx_tensor_release(shard);
            goto done;
        }
        st = vt->pre_all_gather(shard, NULL, io[r].in, &io[r].n, io[r].meta, &io[r].meta_size);
        lpx_tensor_release(shard);
        if (st) {
            io[r].n = 0;
            snprintf(what, sizeof what, "pre_all_gather on rank %d (rows %lld..%lld)", r, (long long)start,
                     (long long)(start + n));
            o = cf_lpx_fail(d, len, what, st);
            goto done;
        }
        if ((o = check_inputs(io, r, d, len)) != CF_PASS) goto done;
    }
    for (int i = 0; i < io[0].n; i++)
        if ((st = gather(io, world, i, &outs[i]))) { o = cf_lpx_fail(d, len, "gathering", st); goto done; }
    for (int r = 0; r < world; r++) {
        lpx_tensor_release(res);
        res = NULL;
        st = vt->post_all_gather(k, outs, io[0].n, io[r].meta, io[r].meta_size, lpx_tensor_dtype(q), NULL, &res);
        snprintf(what, sizeof what, "post_all_gather with rank %d's metadata", r);
        if (st) { o = cf_lpx_fail(d, len, what, st); goto done; }
        if ((o = check_result(rk, res, q, full, ref_q, p.max_err, what, d, len)) != CF_PASS) goto done;
    }
    st = vt->post_all_gather(k, outs, io[0].n, io[0].meta, io[0].meta_size, lpx_tensor_dtype(q), res, &res2);
    if (st) { o = cf_lpx_fail(d, len, "post_all_gather in place (out given)", st); goto done; }
    if (res2 != res) {
        o = cf_say(CF_FAIL, d, len, "post_all_gather with out did not return out");
        goto done;
    }
    if ((o = check_result(rk, res2, q, full, ref_q, p.max_err, "post_all_gather in place", d, len)) != CF_PASS)
        goto done;
    o = cf_say(CF_PASS, d, len, "%d ranks, chunk %lld rows (unit %lld), %d inputs per rank%s%s%s", world,
               (long long)chunk, (long long)unit, io[0].n, rk != k ? "; gathers into " : "",
               rk != k ? lpx_kind_name(rk) : "", rk != k ? ", equal to the one-rank gather" : "");
done:
    for (int r = 0; r < MAX_WORLD; r++)
        for (int i = 0; i < io[r].n && i < LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(io[r].in[i]);
    for (int i = 0; i < LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(outs[i]);
    lpx_tensor_release(res2);
    lpx_tensor_release(res);
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    lpx_tensor_release(full);
    lpx_tensor_release(ref_q);
    return o;
}

/* Slices at multiples of the shard unit equal the slices of the dense
 * value; a slice starting inside a unit is refused with a message. */
static cf_outcome c_shard_unit(const lpx_kind *k, char *d, size_t len)
{
    cf_params p;
    cf_params_of(k, &p);
    lpx_tensor *x = NULL, *q = NULL, *full = NULL;
    cf_outcome o = CF_PASS;
    lpx_status st = cf_data(&p, CF_DIST_NORMAL, 40, &x);
    if (!st) st = cf_from_dense(k, x, &q);
    if (!st) st = cf_dense(q, &full);
    if (st) { o = cf_lpx_fail(d, len, "setting up", st); goto done; }
    int64_t rows = lpx_tensor_shape(q)[0], unit = cf_shard_unit(q);
    if (unit < 1 || rows % unit) {
        o = cf_say(CF_FAIL, d, len, "shard_unit %lld does not divide dim 0 (%lld)", (long long)unit, (long long)rows);
        goto done;
    }
    int64_t starts[3] = {0, rows > unit ? unit : 0, rows}, lens[3] = {unit <= rows ? unit : rows,
                         rows > unit ? rows - unit : 0, 0};
    for (int i = 0; i < 3; i++) {
        lpx_tensor *s = NULL, *sd = NULL, *ref = NULL, *refc = NULL;
        char what[96];
        snprintf(what, sizeof what, "narrow(dim 0, start %lld, length %lld)", (long long)starts[i], (long long)lens[i]);
        st = lpx_narrow(q, 0, starts[i], lens[i], &s);
        if (!st && lpx_tensor_kind(s) != k)
            st = lpx_error(LPX_EINVAL, "it returned a '%s' tensor", lpx_kind_name(lpx_tensor_kind(s)));
        if (!st) st = cf_dense(s, &sd);
        if (!st) st = lpx_narrow(full, 0, starts[i], lens[i], &ref);
        if (!st) st = lpx_contiguous(ref, &refc);
        if (st) o = cf_lpx_fail(d, len, what, st);
        else if (lpx_tensor_numel(sd) != lpx_tensor_numel(refc) || cf_max_diff(sd, refc, NULL) != 0)
            o = cf_say(CF_FAIL, d, len, "%s does not hold the same values as the dense slice", what);
        lpx_tensor_release(s);
        lpx_tensor_release(sd);
        lpx_tensor_release(ref);
        lpx_tensor_release(refc);
        if (o != CF_PASS) goto done;
    }
    if (unit > 1 && rows >= unit) {
        lpx_tensor *s = NULL;
        lpx_clear_error();
        st = lpx_narrow(q, 0, unit / 2, unit, &s);
        lpx_tensor_release(s);
        if (st == LPX_OK || !lpx_last_error()[0]) {
            o = cf_say(CF_FAIL, d, len, "a slice starting inside a shard unit (row %lld of %lld) was %s",
                       (long long)(unit / 2), (long long)unit, st == LPX_OK ? "accepted" : "refused without a message");
            goto done;
        }
    }
    o = cf_say(CF_PASS, d, len, "shard unit %lld rows%s", (long long)unit,
               unit > 1 ? "; a slice inside a unit is refused" : "");
done:
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    lpx_tensor_release(full);
    return o;
}

cf_outcome cf_run_shard(const cf_case *c, char *d, size_t len)
{
    if (c->contract == CF_ALL_GATHER) return c_all_gather(c->kind, c->arg, d, len);
    return c_shard_unit(c->kind, d, len);
}
