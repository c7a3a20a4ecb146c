/* Op handlers at the dtensor key. Each handler unwraps the local tensors,
 * runs the same op on them (which dispatches on the locals' kinds: a
 * float8 or nf4 local runs its own kernels) and wraps the result with the
 * placements the op's sharding rule gives. No handler runs a collective:
 * a combination without a local rule fails with LPX_ENOTIMPL naming the
 * op and the placements, and the caller redistributes first.
 *
 * Rules (per mesh dim for elementwise ops; 1-D meshes for the GEMMs):
 *   unary (neg, abs, sqrt, exp, relu, silu, gelu, add_scalar, mul_scalar,
 *     cast, clone, detach, contiguous): placements kept; on a Partial only
 *     the linear ones (neg, mul_scalar, clone, detach, contiguous).
 *   binary (add, sub, mul, div; a dense operand counts as Replicate):
 *     equal placements -> same (Partial: add/sub of two Partial(sum|avg));
 *     Shard(d) with Replicate -> Shard(d) (the replicated operand is cut
 *     along d unless it broadcasts there); Partial(sum|avg) * or / a
 *     Replicate -> Partial.
 *   linear(x, w, bias), w [out, in]:
 *     x R,         w S(0), bias S(0)/none -> S(-1)   column parallel
 *     x S(k<last), w R,    bias R/none    -> S(k)    data parallel
 *     x S(-1),     w S(1), bias none      -> P(sum)  row parallel
 *     x R,         w R,    bias R/none    -> R
 *   matmul(a, b): a S(k<last) x b R -> S(k); a R x b S(-1) -> S(-1);
 *     a S(-1) x b S(0) (2-D b) -> P(sum); R x R -> R. */
#include <string.h>
#include "dtensor_internal.h"

typedef struct operand {
    lpx_tensor *dt;       /* the DTensor, or NULL for a dense operand */
    lpx_tensor *loc;      /* local tensor (dense operand: itself) */
    lpx_placement pl[LPX_MESH_MAX_DIMS];
} operand;

static const char *pl_name(lpx_placement p, char *b, size_t n)
{
    if (p.type == LPX_PLACEMENT_SHARD) snprintf(b, n, "Shard(%d)", (int)p.dim);
    else if (p.type == LPX_PLACEMENT_PARTIAL) snprintf(b, n, "Partial(%s)", lpx_reduce_op_name((lpx_reduce_op)p.op));
    else snprintf(b, n, "Replicate");
    return b;
}

static void unwrap(lpx_tensor *t, int nmesh, operand *o)
{
    memset(o, 0, sizeof *o);
    if (lpx_dtensor_is(t)) {
        o->dt = t;
        o->loc = lpx_dtensor_local(t);
        memcpy(o->pl, dt_meta_of(t)->pl, sizeof o->pl);
    } else {
        o->loc = t;
        for (int i = 0; i < nmesh; i++) o->pl[i] = lpx_replicate();
    }
}

/* Wraps a local result: global shape = local shape, with sharded dims
 * taken from `gshape_src` (the global shape the sharded dim came from). */
static lpx_status wrap(lpx_call *c, lpx_mesh *mesh, lpx_tensor *res, const lpx_placement *pl, const int64_t *gdims)
{
    int nd = lpx_tensor_ndim(res);
    int64_t g[LPX_MAX_DIMS];
    memcpy(g, lpx_tensor_shape(res), (size_t)nd * sizeof *g);
    for (int i = 0; i < lpx_mesh_ndim(mesh); i++)
        if (pl[i].type == LPX_PLACEMENT_SHARD) g[pl[i].dim] = gdims[i];
    lpx_tensor *out = NULL;
    lpx_status st = dt_make(res, mesh, pl, nd, g, lpx_tensor_dtype(res), &out);
    lpx_tensor_release(res);
    if (st) return st;
    c->rets[0] = lpx_v_tensor(out);
    c->nrets = 1;
    return LPX_OK;
}

static lpx_status no_rule(lpx_call *c, const operand *a, const operand *b, int mdim)
{
    char x[48], y[48];
    return lpx_error(LPX_ENOTIMPL, "%s (dtensor): no local rule for %s with %s on mesh dim %d; redistribute first",
                     lpx_op_name(c->op), pl_name(a->pl[mdim], x, sizeof x),
                     b ? pl_name(b->pl[mdim], y, sizeof y) : "nothing", mdim);
}

/* Runs c's op on the locals (args copied, DTensors replaced). */
static lpx_status run_local(lpx_call *c, lpx_tensor *const *locals, lpx_tensor **res)
{
    lpx_value args[LPX_MAX_ARGS];
    int k = 0;
    for (int i = 0; i < c->nargs; i++) {
        args[i] = c->args[i];
        if (args[i].tag == LPX_TAG_TENSOR && args[i].u.t) args[i].u.t = locals[k++];
    }
    lpx_call inner;
    lpx_call_init(&inner, c->op, args, c->nargs);
    lpx_status st = lpx_dispatch(&inner);
    if (st) return st;
    *res = inner.rets[0].u.t;
    for (int i = 1; i < inner.nrets; i++) lpx_tensor_release(inner.rets[i].u.t);
    return LPX_OK;
}

static bool linear_op(lpx_op op)
{
    return op == LPX_OP_neg || op == LPX_OP_mul_scalar || op == LPX_OP_clone || op == LPX_OP_detach ||
           op == LPX_OP_contiguous;
}

static lpx_status h_unary(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    if (c->nargs == 3 && c->args[2].tag == LPX_TAG_TENSOR)
        return lpx_error(LPX_ENOTIMPL, "%s (dtensor): an `out` argument is not supported", lpx_op_name(c->op));
    operand a;
    const dt_meta *m = dt_meta_of(x);
    unwrap(x, m->nmesh, &a);
    for (int i = 0; i < m->nmesh; i++)
        if (a.pl[i].type == LPX_PLACEMENT_PARTIAL && !linear_op(c->op)) return no_rule(c, &a, NULL, i);
    lpx_tensor *res = NULL;
    lpx_status st = run_local(c, &a.loc, &res);
    if (st) return st;
    int64_t g[LPX_MESH_MAX_DIMS] = {0, 0};
    for (int i = 0; i < m->nmesh; i++)
        if (a.pl[i].type == LPX_PLACEMENT_SHARD) g[i] = lpx_tensor_shape(x)[a.pl[i].dim];
    return wrap(c, m->mesh, res, a.pl, g);
}

static lpx_mesh *mesh_of(lpx_tensor *a, lpx_tensor *b)
{
    return lpx_dtensor_is(a) ? dt_meta_of(a)->mesh : dt_meta_of(b)->mesh;
}

static lpx_status h_binary(lpx_call *c)
{
    lpx_tensor *ta = c->args[0].u.t, *tb = c->args[1].u.t;
    if (c->nargs > 2 && c->args[2].tag == LPX_TAG_TENSOR)
        return lpx_error(LPX_ENOTIMPL, "%s (dtensor): an `out` argument is not supported", lpx_op_name(c->op));
    lpx_mesh *mesh = mesh_of(ta, tb);
    int nm = lpx_mesh_ndim(mesh);
    if ((lpx_dtensor_is(ta) && dt_meta_of(ta)->mesh != mesh) || (lpx_dtensor_is(tb) && dt_meta_of(tb)->mesh != mesh))
        return lpx_error(LPX_EINVAL, "%s (dtensor): operands live on different meshes", lpx_op_name(c->op));
    operand a, b;
    unwrap(ta, nm, &a);
    unwrap(tb, nm, &b);
    lpx_tensor *la = a.loc, *lb = b.loc;
    lpx_tensor_retain(la);
    lpx_tensor_retain(lb);
    lpx_placement out_pl[LPX_MESH_MAX_DIMS];
    int64_t g[LPX_MESH_MAX_DIMS] = {0, 0};
    lpx_status st = LPX_OK;
    bool addsub = c->op == LPX_OP_add || c->op == LPX_OP_sub;
    for (int i = 0; i < nm && !st; i++) {
        lpx_placement pa = a.pl[i], pb = b.pl[i];
        out_pl[i] = pa;
        if (pa.type == pb.type && pa.type != LPX_PLACEMENT_PARTIAL && (pa.type != LPX_PLACEMENT_SHARD || pa.dim == pb.dim)) {
            if (pa.type == LPX_PLACEMENT_SHARD) g[i] = lpx_tensor_shape(ta)[pa.dim];
            continue;
        }
        if (pa.type == LPX_PLACEMENT_PARTIAL && pb.type == LPX_PLACEMENT_PARTIAL && pa.op == pb.op && addsub &&
            (pa.op == LPX_REDUCE_SUM || pa.op == LPX_REDUCE_AVG))
            continue;
        if (pa.type == LPX_PLACEMENT_PARTIAL && pb.type == LPX_PLACEMENT_REPLICATE && !addsub &&
            (pa.op == LPX_REDUCE_SUM || pa.op == LPX_REDUCE_AVG))
            continue;
        if (pa.type == LPX_PLACEMENT_REPLICATE && pb.type == LPX_PLACEMENT_PARTIAL && c->op == LPX_OP_mul &&
            (pb.op == LPX_REDUCE_SUM || pb.op == LPX_REDUCE_AVG)) {
            out_pl[i] = pb;
            continue;
        }
        /* Shard with Replicate: cut the replicated one where it does not broadcast */
        bool a_sh = pa.type == LPX_PLACEMENT_SHARD && pb.type == LPX_PLACEMENT_REPLICATE;
        bool b_sh = pb.type == LPX_PLACEMENT_SHARD && pa.type == LPX_PLACEMENT_REPLICATE;
        if (!a_sh && !b_sh) {
            st = no_rule(c, &a, &b, i);
            break;
        }
        lpx_tensor *sh_t = a_sh ? ta : tb, **rep = a_sh ? &lb : &la;
        int d = a_sh ? pa.dim : pb.dim;
        out_pl[i] = lpx_shard(d + (lpx_tensor_ndim(a_sh ? tb : ta) > lpx_tensor_ndim(sh_t)
                                       ? lpx_tensor_ndim(a_sh ? tb : ta) - lpx_tensor_ndim(sh_t) : 0));
        int od = d - (lpx_tensor_ndim(sh_t) - lpx_tensor_ndim(*rep));
        g[i] = lpx_tensor_shape(sh_t)[d];
        if (od >= 0 && lpx_tensor_shape(*rep)[od] != 1) {
            if (lpx_tensor_shape(*rep)[od] != g[i]) {
                st = lpx_error(LPX_ESHAPE, "%s (dtensor): dim %d of the replicated operand is %lld, the sharded one "
                               "is %lld", lpx_op_name(c->op), od, (long long)lpx_tensor_shape(*rep)[od], (long long)g[i]);
                break;
            }
            lpx_tensor *cut = NULL;
            if ((st = dt_chunk(lpx_op_name(c->op), *rep, od, lpx_mesh_size(mesh, i), lpx_mesh_rank(mesh, i), &cut)))
                break;
            lpx_tensor_release(*rep);
            *rep = cut;
        }
    }
    lpx_tensor *res = NULL;
    if (!st) {
        lpx_tensor *locs[2] = {la, lb};
        st = run_local(c, locs, &res);
    }
    lpx_tensor_release(la);
    lpx_tensor_release(lb);
    if (st) return st;
    return wrap(c, mesh, res, out_pl, g);
}

static bool is_rep(const operand *o) { return o->pl[0].type == LPX_PLACEMENT_REPLICATE; }
static bool is_shard(const operand *o, int d) { return o->pl[0].type == LPX_PLACEMENT_SHARD && o->pl[0].dim == d; }

/* linear and matmul on 1-D meshes. */
static lpx_status h_gemm(lpx_call *c)
{
    bool lin = c->op == LPX_OP_linear;
    lpx_tensor *ta = c->args[0].u.t, *tb = c->args[1].u.t;
    lpx_tensor *tbias = lin && c->args[2].tag == LPX_TAG_TENSOR ? c->args[2].u.t : NULL;
    if (!lin && c->args[2].tag == LPX_TAG_TENSOR)
        return lpx_error(LPX_ENOTIMPL, "matmul (dtensor): an `out` argument is not supported");
    lpx_mesh *mesh = mesh_of(ta, tb);
    if (tbias && lpx_dtensor_is(tbias)) mesh = dt_meta_of(tbias)->mesh;
    if (lpx_mesh_ndim(mesh) != 1)
        return lpx_error(LPX_ENOTIMPL, "%s (dtensor): GEMM rules exist for 1-D meshes only", lpx_op_name(c->op));
    operand a, b, bias;
    unwrap(ta, 1, &a);
    unwrap(tb, 1, &b);
    if (tbias) unwrap(tbias, 1, &bias);
    int na = lpx_tensor_ndim(ta), nb = lpx_tensor_ndim(tb);
    lpx_placement out_pl;
    int64_t g = 0;
    int out_nd = lin ? na : (nb == 1 ? na - 1 : na);
    bool bias_rep = !tbias || is_rep(&bias);
    if (is_rep(&a) && is_rep(&b) && bias_rep) {
        out_pl = lpx_replicate();
    } else if (lin && is_rep(&a) && is_shard(&b, 0) && (!tbias || is_shard(&bias, 0))) {
        out_pl = lpx_shard(out_nd - 1);
        g = lpx_tensor_shape(tb)[0];
    } else if (a.pl[0].type == LPX_PLACEMENT_SHARD && a.pl[0].dim < na - 1 && is_rep(&b) && bias_rep) {
        out_pl = lpx_shard(a.pl[0].dim);
        g = lpx_tensor_shape(ta)[a.pl[0].dim];
    } else if (!lin && is_rep(&a) && nb == 2 && is_shard(&b, 1)) {
        out_pl = lpx_shard(out_nd - 1);
        g = lpx_tensor_shape(tb)[1];
    } else if (is_shard(&a, na - 1) && !tbias && nb == 2 && is_shard(&b, lin ? 1 : 0)) {
        out_pl = lpx_partial(LPX_REDUCE_SUM);
    } else {
        char x[48], y[48];
        return lpx_error(LPX_ENOTIMPL, "%s (dtensor): no rule for %s x %s%s; see subclasses/dtensor/dtensor_ops.c",
                         lpx_op_name(c->op), pl_name(a.pl[0], x, sizeof x), pl_name(b.pl[0], y, sizeof y),
                         tbias ? " with a bias" : "");
    }
    lpx_tensor *locs[3] = {a.loc, b.loc, tbias ? bias.loc : NULL};
    lpx_tensor *res = NULL;
    lpx_status st = run_local(c, locs, &res);
    if (st) return st;
    return wrap(c, mesh, res, &out_pl, &g);
}

lpx_status dt_register_handlers(int key)
{
    static const lpx_op unary[] = {LPX_OP_neg, LPX_OP_abs, LPX_OP_sqrt, LPX_OP_exp, LPX_OP_relu, LPX_OP_silu,
                                   LPX_OP_gelu, LPX_OP_add_scalar, LPX_OP_mul_scalar, LPX_OP_cast, LPX_OP_clone,
                                   LPX_OP_detach, LPX_OP_contiguous};
    static const lpx_op binary[] = {LPX_OP_add, LPX_OP_sub, LPX_OP_mul, LPX_OP_div};
    lpx_status st = LPX_OK;
    for (size_t i = 0; i < sizeof unary / sizeof *unary && !st; i++) st = lpx_kernel_register(unary[i], key, h_unary, NULL);
    for (size_t i = 0; i < sizeof binary / sizeof *binary && !st; i++)
        st = lpx_kernel_register(binary[i], key, h_binary, NULL);
    if (!st) st = lpx_kernel_register(LPX_OP_linear, key, h_gemm, NULL);
    if (!st) st = lpx_kernel_register(LPX_OP_matmul, key, h_gemm, NULL);
    return st;
}
