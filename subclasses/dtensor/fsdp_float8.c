/* lpx_float8_precompute_scales: after the optimizer step, the local amax
 * of every tensorwise float8_weight of a group goes into one f32 buffer
 * and ONE all-reduce(MAX) makes them global; each weight then keeps
 * scale = fp8_max / max(amax, 1e-12) (the dynamic formula, through the
 * float8 kind's fp8_scale_from_amax), so the next unshard casts with it and
 * runs no collective besides the all-gather. Rowwise weights need no
 * scale agreement and are skipped. lpx_fsdp_precompute_scales does the
 * same for every group of the engine with one all-reduce in all. */
#include "fsdp_internal.h"

static bool tensorwise_f8w(const fsdp_param *p)
{
    lpx_tensor *l = fsdp_local(p);
    return lpx_float8_weight_is(l) && !lpx_float8_weight_rowwise(l);
}

/* The amaxes of every tensorwise float8_weight of groups gs[0..ng) in one
 * buffer, ONE all-reduce(MAX), then each weight's scale. */
static lpx_status precompute(lpx_fsdp *f, lpx_fsdp_group *const *gs, int ng)
{
    const char *op = "lpx_float8_precompute_scales";
    int n = 0;
    for (int j = 0; j < ng; j++)
        for (int i = 0; i < gs[j]->n; i++) n += tensorwise_f8w(&gs[j]->p[i]);
    if (!n) return LPX_OK; /* every rank has the same params: no rank enters a collective */
    float *amax = lpx_calloc((size_t)n, sizeof *amax);
    if (!amax) return dt_abort(f->comm, lpx_error(LPX_ENOMEM, "%s: out of memory", op));
    fsdp_snap snap;
    fsdp_snap_begin(f, &snap);
    lpx_status st = LPX_OK;
    int k = 0;
    for (int j = 0; j < ng; j++)
        for (int i = 0; i < gs[j]->n && !st; i++) {
            if (!tensorwise_f8w(&gs[j]->p[i])) continue;
            lpx_tensor *master = lpx_float8_weight_master(fsdp_local(&gs[j]->p[i])), *a = NULL;
            double v = 0;
            if (lpx_tensor_numel(master)) {
                st = lpx_amax(master, 0, NULL, false, &a);
                if (!st) st = lpx_item(a, 0, &v);
                lpx_tensor_release(a);
            }
            amax[k++] = (float)v;
            if (st) st = dt_abort(f->comm, st);
        }
    if (!st) st = fsdp_all_reduce_host(f, f->comm, amax, (size_t)n, LPX_F32, LPX_REDUCE_MAX);
    if (!st) f->st.amax_allreduces++;
    k = 0;
    for (int j = 0; j < ng; j++)
        for (int i = 0; i < gs[j]->n && !st; i++) {
            if (!tensorwise_f8w(&gs[j]->p[i])) continue;
            lpx_tensor *w = fsdp_local(&gs[j]->p[i]), *at = NULL, *s = NULL;
            double sv = 0;
            double smax = lpx_tensor_dtype(w) == LPX_F16 ? 65504.0 : 0.0;
            if (!(st = lpx_full(0, NULL, amax[k++], LPX_F32, lpx_cpu(), &at)))
                st = lpx_fp8_scale_from_amax(at, lpx_float8_weight_fp8(w), false, smax, &s, NULL);
            if (!st) st = lpx_item(s, 0, &sv);
            if (!st) st = lpx_float8_weight_set_scale(w, (float)sv);
            lpx_tensor_release(at);
            lpx_tensor_release(s);
        }
    fsdp_snap_end(f, &snap);
    lpx_free(amax);
    return st;
}

lpx_status lpx_float8_precompute_scales(lpx_fsdp_group *g)
{
    if (!g) return lpx_error(LPX_EINVAL, "lpx_float8_precompute_scales: g is NULL");
    if (!g->f->sharded)
        return lpx_error(LPX_EINVAL, "lpx_float8_precompute_scales(%s): call lpx_fsdp_shard first", g->name);
    return precompute(g->f, &g, 1);
}

lpx_status lpx_fsdp_precompute_scales(lpx_fsdp *f)
{
    if (!f) return lpx_error(LPX_EINVAL, "lpx_fsdp_precompute_scales: f is NULL");
    if (!f->sharded) return lpx_error(LPX_EINVAL, "lpx_fsdp_precompute_scales: call lpx_fsdp_shard first");
    return precompute(f, f->g, f->ng);
}
