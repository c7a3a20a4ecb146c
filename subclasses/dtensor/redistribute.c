/* lpx_dtensor_redistribute: every placement transition, one mesh dim at a
 * time (two mesh dims never shard the same tensor dim, so the steps are
 * independent).
 *
 *   Shard(d) -> Replicate     all-gather (dim 0: any kind, through its
 *                             hooks; other dims: dense, moved to dim 0)
 *   Partial  -> Replicate     all-reduce (dense f32/bf16/f16)
 *   Partial  -> Shard(d)      reduce-scatter of shards padded to the chunk
 *   Replicate-> Shard(d)      local chunk, no collective
 *   Shard(i) -> Shard(j)      all-gather along i, local chunk along j
 *   Replicate-> Partial(op)   sum: rank 0 keeps the value, others zero;
 *                             avg/max/min: every rank keeps it
 *   Shard    -> Partial, Partial(a) -> Partial(b): through Replicate */
#include <string.h>
#include "dtensor_internal.h"

/* t with dim d moved to the front, contiguous (dense only). */
static lpx_status front(lpx_tensor *t, int d, lpx_tensor **out)
{
    if (d == 0) return lpx_contiguous(t, out);
    lpx_tensor *v = NULL;
    lpx_status st = lpx_transpose(t, 0, d, &v);
    if (!st) st = lpx_contiguous(v, out);
    lpx_tensor_release(v);
    return st;
}

static lpx_status back(lpx_tensor *t, int d, lpx_tensor **out) { return front(t, d, out); }

static lpx_status need_dense(const char *op, const lpx_tensor *t, const char *what)
{
    if (!lpx_tensor_kind(t)) return LPX_OK;
    return lpx_error(LPX_ENOTIMPL, "%s: %s needs a dense local tensor; the local is %s", op, what,
                     lpx_kind_name(lpx_tensor_kind(t)));
}

static lpx_status gather(const char *op, lpx_comm *c, lpx_tensor *loc, int d, lpx_tensor **out)
{
    if (d == 0) return dt_gather_dim0(op, c, loc, out);
    lpx_status st = need_dense(op, loc, "all-gather along a dim other than 0");
    if (st) return dt_abort(c, st);
    lpx_tensor *f = NULL, *g = NULL;
    if ((st = front(loc, d, &f))) return dt_abort(c, st);
    st = dt_gather_dim0(op, c, f, &g);
    if (!st) st = back(g, d, out);
    lpx_tensor_release(f);
    lpx_tensor_release(g);
    return st;
}

static lpx_status all_reduce(const char *op, lpx_comm *c, lpx_tensor *loc, lpx_reduce_op rop, lpx_tensor **out)
{
    lpx_status st = need_dense(op, loc, "reducing a Partial");
    if (st) return dt_abort(c, st);
    if ((st = lpx_clone(loc, out))) return dt_abort(c, st);
    if ((st = lpx_comm_all_reduce(c, *out, rop))) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

static lpx_status reduce_scatter(const char *op, lpx_comm *c, lpx_tensor *loc, lpx_reduce_op rop, int d,
                                 lpx_tensor **out)
{
    int world = lpx_comm_size(c), rank = lpx_comm_rank(c);
    lpx_status st = need_dense(op, loc, "reduce-scatter of a Partial");
    if (st) return dt_abort(c, st);
    lpx_tensor *f = NULL, *send = NULL, *recv = NULL, *mine = NULL;
    if ((st = front(loc, d, &f))) return dt_abort(c, st);
    int nd = lpx_tensor_ndim(f);
    int64_t rows = lpx_tensor_shape(f)[0], row = 1, chunk, s, l;
    for (int k = 1; k < nd; k++) row *= lpx_tensor_shape(f)[k];
    lpx_shard_range(rows, world, rank, 1, &chunk, &s, &l);
    int64_t sshape[LPX_MAX_DIMS];
    memcpy(sshape, lpx_tensor_shape(f), (size_t)nd * sizeof *sshape);
    sshape[0] = chunk * world;
    /* pad every rank's block to `chunk` rows with zeros */
    if ((st = lpx_zeros(nd, sshape, lpx_tensor_dtype(f), lpx_cpu(), &send))) goto fail;
    if (rows) {
        lpx_tensor *dst = NULL;
        if ((st = lpx_narrow(send, 0, 0, rows, &dst))) goto fail;
        st = lpx_copy_(dst, f);
        lpx_tensor_release(dst);
        if (st) goto fail;
    }
    sshape[0] = chunk;
    if ((st = lpx_tensor_new(lpx_tensor_dtype(f), nd, sshape, lpx_cpu(), &recv))) goto fail;
    if ((st = lpx_comm_reduce_scatter_buf(c, lpx_tensor_data(send), lpx_tensor_data(recv), (size_t)(chunk * row),
                                          lpx_tensor_dtype(f), rop)))
        goto done;
    lpx_tensor *n = NULL;
    if ((st = lpx_narrow(recv, 0, 0, l, &n))) goto done;
    st = back(n, d, &mine);
    lpx_tensor_release(n);
    if (!st) {
        *out = mine;
        mine = NULL;
    }
    goto done;
fail:
    st = dt_abort(c, st);
done:
    lpx_tensor_release(f);
    lpx_tensor_release(send);
    lpx_tensor_release(recv);
    lpx_tensor_release(mine);
    return st;
}

static lpx_status to_partial(lpx_tensor *loc, int rank, lpx_reduce_op rop, lpx_tensor **out)
{
    if (rop == LPX_REDUCE_SUM && rank != 0) {
        lpx_status st = need_dense("lpx_dtensor_redistribute", loc, "Replicate -> Partial(sum)");
        if (st) return st;
        return lpx_zeros(lpx_tensor_ndim(loc), lpx_tensor_shape(loc), lpx_tensor_dtype(loc), lpx_tensor_device(loc),
                         out);
    }
    lpx_tensor_retain(loc);
    *out = loc;
    return LPX_OK;
}

/* One mesh dim: from placement a to b. */
static lpx_status step(const char *op, lpx_comm *c, lpx_tensor *loc, lpx_placement a, lpx_placement b,
                       lpx_tensor **out)
{
    int world = lpx_comm_size(c), rank = lpx_comm_rank(c);
    lpx_tensor *mid = NULL;
    lpx_status st;
    if (a.type == b.type && (a.type == LPX_PLACEMENT_REPLICATE || (a.type == LPX_PLACEMENT_SHARD && a.dim == b.dim) ||
                             (a.type == LPX_PLACEMENT_PARTIAL && a.op == b.op))) {
        lpx_tensor_retain(loc);
        *out = loc;
        return LPX_OK;
    }
    switch (a.type) {
    case LPX_PLACEMENT_SHARD:
        if ((st = gather(op, c, loc, a.dim, &mid))) return st;
        break;
    case LPX_PLACEMENT_PARTIAL:
        if (b.type == LPX_PLACEMENT_SHARD) return reduce_scatter(op, c, loc, (lpx_reduce_op)a.op, b.dim, out);
        if ((st = all_reduce(op, c, loc, (lpx_reduce_op)a.op, &mid))) return st;
        break;
    default:
        mid = loc;
        lpx_tensor_retain(mid);
    }
    /* mid is replicated along this mesh dim */
    if (b.type == LPX_PLACEMENT_SHARD) st = dt_chunk(op, mid, b.dim, world, rank, out);
    else if (b.type == LPX_PLACEMENT_PARTIAL) st = to_partial(mid, rank, (lpx_reduce_op)b.op, out);
    else {
        *out = mid;
        return LPX_OK;
    }
    lpx_tensor_release(mid);
    return st;
}

lpx_status lpx_dtensor_redistribute(lpx_tensor *dt, const lpx_placement *placements, lpx_tensor **out)
{
    const char *op = "lpx_dtensor_redistribute";
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!lpx_dtensor_is(dt)) return lpx_error(LPX_EINVAL, "%s: dt is not a DTensor", op);
    const dt_meta *m = dt_meta_of(dt);
    int ndim = lpx_tensor_ndim(dt);
    /* argument errors are the same on every rank: no collective was
     * entered, so no abort is needed */
    lpx_status st = dt_check_placements(op, m->mesh, placements, ndim);
    if (st) return st;
    lpx_tensor *cur = lpx_dtensor_local(dt);
    lpx_tensor_retain(cur);
    lpx_placement now[LPX_MESH_MAX_DIMS];
    memcpy(now, m->pl, sizeof now);
    /* gathers first (innermost mesh dim first), so that a later chunk cuts
     * a tensor that is whole along its dim */
    for (int pass = 0; pass < 2 && !st; pass++) {
        for (int i = m->nmesh - 1; i >= 0 && !st; i--) {
            bool gathering = now[i].type != LPX_PLACEMENT_REPLICATE &&
                             !(now[i].type == placements[i].type && now[i].dim == placements[i].dim &&
                               now[i].op == placements[i].op);
            if (pass == 0 && !gathering) continue;
            /* in pass 0 a Shard target is reached through Replicate (its
             * chunk is cut in pass 1) when this mesh dim is sharded now,
             * or when another mesh dim still shards the same tensor dim:
             * Partial -> Shard(d) there would reduce-scatter a piece that
             * is itself a chunk of d, and that other dim's gather (later
             * in this pass) would then concatenate chunks of chunks */
            bool defer = false;
            if (pass == 0 && placements[i].type == LPX_PLACEMENT_SHARD) {
                defer = now[i].type == LPX_PLACEMENT_SHARD;
                for (int k = 0; k < m->nmesh; k++)
                    defer |= k != i && now[k].type == LPX_PLACEMENT_SHARD && now[k].dim == placements[i].dim;
            }
            lpx_placement to = defer ? lpx_replicate() : placements[i];
            lpx_tensor *next = NULL;
            st = step(op, lpx_mesh_comm(m->mesh, i), cur, now[i], to, &next);
            lpx_tensor_release(cur);
            cur = next;
            if (!st) now[i] = to;
        }
    }
    if (!st) st = dt_make(cur, m->mesh, placements, ndim, lpx_tensor_shape(dt), lpx_tensor_dtype(dt), out);
    lpx_tensor_release(cur);
    return st;
}
