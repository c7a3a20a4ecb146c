/* lpx_fsdp_precompute_scales: after the optimizer step, the statistics
 * every parameter's kind needs agreed before its next all-gather (a
 * float8_weight's amax for its replicated scale, a plugin wrapper's own)
 * go into one f32 buffer per reduction, ONE all-reduce each (in practice
 * one MAX), and each tensor gets its values back through its kind's
 * sync_apply. The engine knows no kind: it asks the lpx_kind_i slots
 * sync_count / sync_local / sync_apply, so a plugin's wrapper kind is
 * agreed in the same all-reduce as the built-in ones. */
#include "fsdp_internal.h"

/* the reductions the engine packs, in a fixed order (every rank runs the
 * same all-reduces in the same order) */
static const lpx_reduce_op sync_ops[] = {LPX_REDUCE_MAX, LPX_REDUCE_SUM, LPX_REDUCE_MIN};
#define NSYNC_OPS ((int)(sizeof sync_ops / sizeof *sync_ops))

/* how many values p's local tensor asks to agree, and with which op */
static lpx_status sync_need(const char *op, const fsdp_param *p, int *count, int *red)
{
    const lpx_tensor *l = fsdp_local(p);
    const lpx_kind *k = lpx_tensor_kind(l);
    const lpx_kind_i *vt = k ? lpx_kind_vtable(k) : NULL;
    *count = 0;
    *red = LPX_REDUCE_MAX;
    if (!vt || !vt->sync_count) return LPX_OK;
    int n = vt->sync_count(l, red);
    if (n < 0 || n > LPX_MAX_SYNC_VALUES)
        return lpx_error(LPX_EINVAL, "%s: param '%s' (kind %s) asks to agree %d values (0..%d)", op, p->name,
                         lpx_kind_name(k), n, LPX_MAX_SYNC_VALUES);
    bool known = false;
    for (int i = 0; i < NSYNC_OPS; i++) known |= *red == (int)sync_ops[i];
    if (n && !known)
        return lpx_error(LPX_EINVAL, "%s: param '%s' (kind %s) asks for reduction %d (max, sum or min)", op, p->name,
                         lpx_kind_name(k), *red);
    *count = n;
    return LPX_OK;
}

/* The values of every parameter of groups gs[0..ng) that agree with
 * reduction `red`: the parameters that ask are listed once, their local
 * values packed, ONE all-reduce, the results handed back in the same
 * order. */
static lpx_status sync_one_op(lpx_fsdp *f, lpx_fsdp_group *const *gs, int ng, lpx_reduce_op red, const char *op)
{
    lpx_status st = LPX_OK;
    int np = 0, n, r;
    for (int j = 0; j < ng; j++) np += gs[j]->n;
    lpx_tensor **who = lpx_calloc((size_t)np + 1, sizeof *who);
    int *cnt = lpx_calloc((size_t)np + 1, sizeof *cnt);
    float *vals = NULL;
    size_t total = 0;
    int k = 0;
    if (!who || !cnt) st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    for (int j = 0; j < ng && !st; j++)
        for (int i = 0; i < gs[j]->n && !st; i++)
            if (!(st = sync_need(op, &gs[j]->p[i], &n, &r)) && n && r == (int)red) {
                who[k] = fsdp_local(&gs[j]->p[i]);
                cnt[k++] = n;
                total += (size_t)n;
            }
    /* every rank has the same params: all or none enter the collective */
    if (st || !total) goto out;
    if (!(vals = lpx_calloc(total, sizeof *vals))) {
        st = lpx_error(LPX_ENOMEM, "%s: out of memory for %zu values", op, total);
        goto out;
    }
    size_t at = 0;
    for (int q = 0; q < k && !st; at += (size_t)cnt[q++])
        st = lpx_kind_vtable(lpx_tensor_kind(who[q]))->sync_local(who[q], vals + at);
    /* a local failure must not leave the other ranks in the collective */
    if (st) st = dt_abort(f->comm, st);
    if (!st) st = fsdp_all_reduce_host(f, f->comm, vals, total, fsdp_math_dtype, red);
    if (!st) f->st.amax_allreduces++;
    at = 0;
    for (int q = 0; q < k && !st; at += (size_t)cnt[q++])
        st = lpx_kind_vtable(lpx_tensor_kind(who[q]))->sync_apply(who[q], vals + at);
out:
    lpx_free(vals);
    lpx_free(who);
    lpx_free(cnt);
    return st;
}

static lpx_status precompute(lpx_fsdp *f, lpx_fsdp_group *const *gs, int ng, const char *op)
{
    fsdp_snap snap;
    fsdp_snap_begin(f, &snap);
    lpx_status st = LPX_OK;
    for (int k = 0; k < NSYNC_OPS && !st; k++) st = sync_one_op(f, gs, ng, sync_ops[k], op);
    fsdp_snap_end(f, &snap);
    return st;
}

lpx_status lpx_fsdp_group_precompute_scales(lpx_fsdp_group *g)
{
    const char *op = "lpx_fsdp_group_precompute_scales";
    if (!g) return lpx_error(LPX_EINVAL, "%s: g is NULL", op);
    if (!g->f->sharded) return lpx_error(LPX_EINVAL, "%s(%s): call lpx_fsdp_shard first", op, g->name);
    return precompute(g->f, &g, 1, op);
}

lpx_status lpx_fsdp_precompute_scales(lpx_fsdp *f)
{
    const char *op = "lpx_fsdp_precompute_scales";
    if (!f) return lpx_error(LPX_EINVAL, "%s: f is NULL", op);
    if (!f->sharded) return lpx_error(LPX_EINVAL, "%s: call lpx_fsdp_shard first", op);
    return precompute(f, f->g, f->ng, op);
}
