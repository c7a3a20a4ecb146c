/* The sharding engine names no kind: a wrapper kind written here against
 * the public headers only (as a plugin would be) is sharded, gathered,
 * averaged, updated and has its scale agreed like the built-in
 * float8_weight, with no change to the engine.
 *
 * "int8_weight": an f32 master whose all-gather travels as int8 codes
 * round(master * 127 / amax) with amax the GLOBAL max |master|, agreed
 * through lpx_kind_i.sync_* in the same single all-reduce as the
 * float8_weight beside it; the optimizer updates its master through
 * lpx_kind_i.master. Over world sizes 1..8 with uneven rows:
 *   - lpx_fsdp_precompute_scales runs ONE all-reduce for both kinds, and
 *     the agreed amax is the full master's amax, bit for bit;
 *   - the unshard rebuilds codes * amax / 127 exactly as quantizing the
 *     unsharded master does (cast-then-gather == gather-then-cast);
 *   - one AdamW step on the wrapper's master equals the same step on an
 *     identical dense parameter, bit for bit, after the reduce-scatter. */
#include <math.h>
#include <stdlib.h>
#include "check.h"
#include "dt_util.h"

#define I8W_MAGIC 0x57384949u

typedef struct i8w_state {
    float amax;      /* agreed global amax; 0: none yet */
} i8w_state;

typedef struct i8w_meta {
    uint32_t magic;
    uint32_t reserved;
    i8w_state *state;
} i8w_meta;

typedef struct i8w_wire_meta {
    uint32_t magic;
    float amax;
} i8w_wire_meta;

static const lpx_kind *i8w_kind;

static i8w_state *state_of(const lpx_tensor *t) { return ((const i8w_meta *)lpx_tensor_meta(t, NULL))->state; }

static lpx_status i8w_make(lpx_tensor *master, float amax, lpx_tensor **out)
{
    i8w_meta m = {I8W_MAGIC, 0, malloc(sizeof(i8w_state))};
    if (!m.state) return lpx_error(LPX_ENOMEM, "int8_weight: out of memory");
    m.state->amax = amax;
    lpx_status st = lpx_tensor_new_kind(i8w_kind, lpx_tensor_dtype(master), lpx_tensor_ndim(master),
                                        lpx_tensor_shape(master), lpx_tensor_device(master), &master, 1, &m,
                                        sizeof m, out);
    if (st) free(m.state);
    return st;
}

static void i8w_meta_release(void *meta, size_t size)
{
    if (size == sizeof(i8w_meta)) free(((i8w_meta *)meta)->state);
}

static float local_amax(const lpx_tensor *master)
{
    const float *p = lpx_tensor_data(master);
    float a = 0;
    for (int64_t i = 0; i < lpx_tensor_numel(master); i++) a = fabsf(p[i]) > a ? fabsf(p[i]) : a;
    return a;
}

/* the wire: int8 codes with the agreed scale; without one (at shard, or
 * when nobody called lpx_fsdp_precompute_scales) the hook agrees its own
 * amax over the engine's comm, as float8_weight does */
static lpx_status i8w_pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *n, void *meta,
                                     size_t *meta_size)
{
    lpx_tensor *master = lpx_tensor_inner(shard, 0);
    float amax = state_of(shard)->amax;
    lpx_fsdp_hook_ctx *h = ctx;
    lpx_status st;
    if (!(amax > 0)) {
        if (!h || !h->comm) return lpx_error(LPX_EINVAL, "int8_weight: no agreed amax and no comm to agree one");
        amax = local_amax(master);
        if ((st = lpx_comm_all_reduce_buf(h->comm, &amax, &amax, 1, LPX_F32, LPX_REDUCE_MAX))) return st;
        h->amax_allreduces++;
        if (!(amax > 0)) amax = 1.0f;
    }
    st = lpx_empty(lpx_tensor_ndim(master), lpx_tensor_shape(master), LPX_I8, lpx_cpu(), &inputs[0]);
    if (st) return st;
    const float *p = lpx_tensor_data(master);
    int8_t *q = lpx_tensor_data(inputs[0]);
    for (int64_t i = 0; i < lpx_tensor_numel(master); i++) q[i] = (int8_t)lrintf(p[i] * (127.0f / amax));
    *n = 1;
    i8w_wire_meta wm = {I8W_MAGIC, amax};
    memcpy(meta, &wm, sizeof wm);
    *meta_size = sizeof wm;
    return LPX_OK;
}

static lpx_status dequant(const lpx_tensor *codes, float amax, lpx_tensor *out)
{
    const int8_t *q = lpx_tensor_data(codes);
    float *d = lpx_tensor_data(out);
    for (int64_t i = 0; i < lpx_tensor_numel(codes); i++) d[i] = (float)q[i] * (amax / 127.0f);
    return LPX_OK;
}

static lpx_status i8w_post_all_gather(const lpx_kind *kind, lpx_tensor *const *outputs, int n, const void *meta,
                                      size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result)
{
    (void)kind;
    (void)param_dtype;
    i8w_wire_meta wm;
    if (n != 1 || meta_size != sizeof wm) return lpx_error(LPX_EINVAL, "int8_weight: bad wire");
    memcpy(&wm, meta, sizeof wm);
    lpx_status st = LPX_OK;
    if (out) {
        lpx_tensor_retain(out);
        *result = out;
    } else if ((st = lpx_empty(lpx_tensor_ndim(outputs[0]), lpx_tensor_shape(outputs[0]), LPX_F32, lpx_cpu(), result))) {
        return st;
    }
    return dequant(outputs[0], wm.amax, *result);
}

static lpx_tensor *i8w_master(const lpx_tensor *t) { return lpx_tensor_inner(t, 0); }

static int i8w_sync_count(const lpx_tensor *t, int *op)
{
    (void)t;
    *op = LPX_REDUCE_MAX;
    return 1;
}

static lpx_status i8w_sync_local(const lpx_tensor *t, float *v)
{
    v[0] = local_amax(lpx_tensor_inner(t, 0));
    return LPX_OK;
}

static lpx_status i8w_sync_apply(lpx_tensor *t, const float *v)
{
    state_of(t)->amax = v[0];
    return LPX_OK;
}

/* narrow / clone: the master's result, wrapped again */
static lpx_status i8w_rewrap(lpx_call *c)
{
    lpx_value args[LPX_MAX_ARGS];
    for (int i = 0; i < c->nargs; i++) args[i] = c->args[i];
    lpx_tensor *w = args[0].u.t;
    args[0].u.t = lpx_tensor_inner(w, 0);
    lpx_call inner;
    lpx_call_init(&inner, c->op, args, c->nargs);
    lpx_status st = lpx_dispatch(&inner);
    if (st) return st;
    lpx_tensor *r = NULL;
    st = i8w_make(inner.rets[0].u.t, state_of(w)->amax, &r);
    lpx_call_release_rets(&inner);
    if (st) return st;
    c->rets[0] = lpx_v_tensor(r);
    c->nrets = 1;
    return LPX_OK;
}

static void register_kind(void)
{
    lpx_kind_i vt;
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.abi_version = LPX_KIND_ABI_VERSION;
    vt.name = "int8_weight_test";
    vt.priority = LPX_PRIORITY_WRAPPER;
    vt.pre_all_gather = i8w_pre_all_gather;
    vt.post_all_gather = i8w_post_all_gather;
    vt.meta_release = i8w_meta_release;
    vt.master = i8w_master;
    vt.sync_count = i8w_sync_count;
    vt.sync_local = i8w_sync_local;
    vt.sync_apply = i8w_sync_apply;
    CHECK_OK(lpx_kind_register(&vt, &i8w_kind));
    if (!i8w_kind) return;
    CHECK_OK(lpx_kernel_register(LPX_OP_narrow, lpx_kind_key(i8w_kind), i8w_rewrap, NULL));
    CHECK_OK(lpx_kernel_register(LPX_OP_clone, lpx_kind_key(i8w_kind), i8w_rewrap, NULL));
}

/* ---- the engine over world sizes ---------------------------------------- */

typedef struct ctx {
    lpx_tensor *m_i8, *m_f8, *m_dense;   /* full masters (f32) */
    lpx_tensor *grad;                     /* the same full grad for the i8 and dense params */
    lpx_tensor *expect_i8;                /* dequant(quant(full master, global amax)) */
    float amax;                           /* global amax of m_i8 */
} ctx;

static lpx_status rank_fn(lpx_comm *comm, void *vc)
{
    ctx *c = vc;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_tensor *mi = NULL, *mf = NULL, *md = NULL, *wi = NULL, *wf = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    /* private copies of the masters: the optimizer updates them in place */
    RCHECK_OK(r, lpx_clone(c->m_i8, &mi));
    RCHECK_OK(r, lpx_clone(c->m_f8, &mf));
    RCHECK_OK(r, lpx_clone(c->m_i8, &md));
    RCHECK_OK(r, i8w_make(mi, 0.0f, &wi));
    lpx_float8_weight_opts fo = {.struct_size = sizeof fo};
    RCHECK_OK(r, lpx_float8_weight_new(mf, &fo, &wf));
    RCHECK_OK(r, lpx_fsdp_group_add(f, "layer", &g));
    RCHECK_OK(r, lpx_fsdp_param_add(g, "i8", wi, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(g, "f8", wf, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(g, "dense", md, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    lpx_comm_stats c0 = {.struct_size = sizeof c0}, c1 = {.struct_size = sizeof c1};
    lpx_comm_stats_get(comm, &c0);
    RCHECK_OK(r, lpx_fsdp_precompute_scales(f));
    lpx_comm_stats_get(comm, &c1);
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    uint64_t ar = c1.calls[LPX_COLL_ALL_REDUCE] - c0.calls[LPX_COLL_ALL_REDUCE];
    if (ar != 1 || s.amax_allreduces != 1)
        rfail(r, "precompute: %llu all-reduces on the comm, %llu counted (want one for both kinds)",
              (unsigned long long)ar, (unsigned long long)s.amax_allreduces);
    lpx_tensor *li = lpx_fsdp_param_local(g, 0), *lf = lpx_fsdp_param_local(g, 1);
    float agreed = li ? state_of(li)->amax : -1;
    if (memcmp(&agreed, &c->amax, sizeof agreed)) rfail(r, "agreed amax %a, global %a", (double)agreed, (double)c->amax);
    if (!(lpx_float8_weight_scale(lf) > 0)) rfail(r, "the float8_weight got no scale in the same call");
    /* gather: the wrapper's wire rebuilt exactly as from the full master */
    RCHECK_OK(r, lpx_fsdp_unshard(g));
    if (!same_bits(lpx_fsdp_param_full(g, 0), c->expect_i8)) rfail(r, "unsharded int8_weight != gather-then-cast");
    RCHECK_OK(r, lpx_fsdp_reshard(g));
    /* one step: the same grad for the wrapper and the dense twin (and some
     * grad for the float8_weight) */
    RCHECK_OK(r, lpx_fsdp_set_grad(g, 0, c->grad));
    RCHECK_OK(r, lpx_fsdp_set_grad(g, 1, c->grad));
    RCHECK_OK(r, lpx_fsdp_set_grad(g, 2, c->grad));
    RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g));
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 0.05;
    RCHECK_OK(r, lpx_fsdp_adamw_step(g, &o));
    lpx_tensor *wi_master = lpx_kind_vtable(i8w_kind)->master(lpx_fsdp_param_local(g, 0));
    if (!same_bits(wi_master, lpx_fsdp_param_local(g, 2)))
        rfail(r, "the wrapper's master after AdamW differs from the dense twin's");
    if (same_bits(wi_master, c->m_i8) && lpx_tensor_numel(wi_master))
        rfail(r, "the wrapper's master was not updated");
    /* the amax the next precompute agrees follows the updated masters */
    RCHECK_OK(r, lpx_fsdp_precompute_scales(f));
    lpx_fsdp_free(f);
    lpx_tensor *rel[] = {mi, mf, md, wi, wf};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    return LPX_OK;
}

static void test_plugin_wrapper_kind(void)
{
    register_kind();
    if (!i8w_kind) return;
    ctx c;
    memset(&c, 0, sizeof c);
    int64_t s[2] = {13, 8};   /* uneven: ranks of world 8 hold 2, 2, ... 1, 0 rows */
    CHECK_OK(lpx_randn(2, s, 7, LPX_F32, lpx_cpu(), &c.m_i8));
    CHECK_OK(lpx_randn(2, s, 8, LPX_F32, lpx_cpu(), &c.m_f8));
    CHECK_OK(lpx_randn(2, s, 9, LPX_F32, lpx_cpu(), &c.grad));
    if (!c.m_i8 || !c.m_f8 || !c.grad) return;
    c.amax = local_amax(c.m_i8);
    /* the reference: quantize and dequantize the unsharded master */
    lpx_tensor *codes = NULL;
    CHECK_OK(lpx_empty(2, s, LPX_I8, lpx_cpu(), &codes));
    CHECK_OK(lpx_empty(2, s, LPX_F32, lpx_cpu(), &c.expect_i8));
    const float *p = lpx_tensor_data(c.m_i8);
    for (int64_t i = 0; i < 13 * 8; i++) ((int8_t *)lpx_tensor_data(codes))[i] = (int8_t)lrintf(p[i] * (127.0f / c.amax));
    dequant(codes, c.amax, c.expect_i8);
    for (int i = 0; i < NWORLDS; i++) run_ranks(worlds[i], rank_fn, &c);
    lpx_tensor *rel[] = {c.m_i8, c.m_f8, c.grad, c.expect_i8, codes};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
}

/* the agreement slots come together */
static void test_sync_slots_validated(void)
{
    lpx_kind_i vt;
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.abi_version = LPX_KIND_ABI_VERSION;
    vt.name = "half_sync_test";
    vt.priority = LPX_PRIORITY_WRAPPER;
    vt.sync_count = i8w_sync_count;
    const lpx_kind *k = NULL;
    CHECK_ERR(lpx_kind_register(&vt, &k), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "sync_count, sync_local and sync_apply come together (1 of 3 given)") != NULL);
    CHECK(k == NULL);
}

int main(void)
{
    RUN(test_plugin_wrapper_kind);
    RUN(test_sync_slots_validated);
    return CHECK_DONE();
}
