/* The case list of a kind, and running one case. Enumeration reads the
 * vtable and the kernel table only, so the parent process never runs kind
 * code; every case runs in a child (tools/lpx/cmd_conformance.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cf_util.h"

/* contracts in the other files */
cf_outcome cf_run_quant(const cf_case *c, char *d, size_t len);
cf_outcome cf_run_op(const cf_case *c, char *d, size_t len);
cf_outcome cf_run_shard(const cf_case *c, char *d, size_t len);
int cf_recipe_for(lpx_op op);

static cf_case *add(cf_case **v, int *n, int *cap, const lpx_kind *k, const lpx_conformance_variant *var,
                    cf_contract ct, int arg, const char *suffix)
{
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        cf_case *nv = realloc(*v, (size_t)c * sizeof *nv);
        if (!nv) return NULL;
        *v = nv;
        *cap = c;
    }
    cf_case *cs = &(*v)[(*n)++];
    memset(cs, 0, sizeof *cs);
    if (var) snprintf(cs->name, sizeof cs->name, "%s[%s]/%s", lpx_kind_name(k), var->name, suffix);
    else snprintf(cs->name, sizeof cs->name, "%s/%s", lpx_kind_name(k), suffix);
    cs->kind = k;
    cs->variant = var;
    cs->contract = ct;
    cs->arg = arg;
    return cs;
}

/* Marks the cases the kind declares not applicable (its descriptor's
 * not_applicable list) as skipped with the kind's reason. Only data of
 * the descriptor is read: no kind code runs in the parent. */
static void waive(const lpx_kind *k, const lpx_conformance_variant *var, cf_case *cs, int n)
{
    cf_params p;
    cf_params_of(k, &p);
    const lpx_conformance_na *list = var ? var->not_applicable : p.not_applicable;
    /* "kind/" or "kind[variant]/" */
    size_t klen = strlen(lpx_kind_name(k)) + 1 + (var ? strlen(var->name) + 2 : 0);
    for (const lpx_conformance_na *na = list; na && na->contract; na++) {
        size_t cl = strlen(na->contract);
        for (int i = 0; i < n; i++) {
            const char *sfx = cs[i].name + klen;
            if (cs[i].skip[0] || strncmp(sfx, na->contract, cl) || (sfx[cl] && sfx[cl] != '/')) continue;
            snprintf(cs[i].skip, sizeof cs[i].skip, "not applicable to this kind: %s",
                     na->reason ? na->reason : "(no reason given)");
        }
    }
}

#define ADD(ct, arg, ...)                                                  \
    do {                                                                   \
        char sfx_[128];                                                    \
        snprintf(sfx_, sizeof sfx_, __VA_ARGS__);                          \
        if (!(last = add(v, n, cap, k, var, ct, arg, sfx_))) return -1;    \
    } while (0)

/* The cases of one form of kind k (var NULL: its own from_dense). */
static int cases_for(const lpx_kind *k, const lpx_conformance_variant *var, cf_case **v, int *n, int *cap)
{
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    cf_case *last;
    int first = *n;
    ADD(CF_DECLARES, 0, "declares");
    if (!vt->from_dense || !vt->to_dense) {
        /* nothing else can make or read an instance */
        snprintf(last->skip, sizeof last->skip,
                 "kind declares no %s (lpx_kind_i.from_dense/to_dense): no contract can build an instance",
                 !vt->from_dense && !vt->to_dense ? "from_dense and to_dense" : !vt->from_dense ? "from_dense" : "to_dense");
        return 0;
    }
    ADD(CF_FLATTEN, 0, "flatten_unflatten");
    if (!vt->unflatten) snprintf(last->skip, sizeof last->skip, "kind has no unflatten");
    ADD(CF_LOGICAL_DTYPE, 0, "logical_dtype");
    for (int d = 0; d < CF_DIST_COUNT; d++) ADD(CF_QUANTIZE, d, "quantize/%s", cf_dist_name(d));
    int key = lpx_kind_key(k);
    for (lpx_op op = 0; op < lpx_op_count(); op++) {
        if (!lpx_op_name(op) || !lpx_kernel_exists(op, key)) continue;
        int r = cf_recipe_for(op);
        ADD(CF_OP, r, "op/%s", lpx_op_name(op));
        if (r < 0) snprintf(last->skip, sizeof last->skip, "the kit has no recipe for op '%s'", lpx_op_name(op));
    }
    for (int w = 1; w <= 4; w++) {
        ADD(CF_ALL_GATHER, w, "all_gather/world%d", w);
        if (!vt->pre_all_gather || !vt->post_all_gather)
            snprintf(last->skip, sizeof last->skip, "kind has no all-gather hooks: it cannot be sharded");
    }
    ADD(CF_SHARD_UNIT, 0, "shard_unit");
    ADD(CF_REFUSAL, 0, "refusal");
    waive(k, var, *v + first, *n - first);
    return 0;
}

int cf_cases_for_kind(const lpx_kind *k, cf_case **v, int *n, int *cap)
{
    if (cases_for(k, NULL, v, n, cap)) return -1;
    cf_params p;
    cf_params_of(k, &p);
    for (const lpx_conformance_variant *var = p.variants; var && var->name && var->from_dense; var++)
        if (cases_for(k, var, v, n, cap)) return -1;
    return 0;
}

cf_outcome cf_run(const cf_case *c, char *detail, size_t len)
{
    detail[0] = 0;
    if (c->skip[0]) return cf_say(CF_SKIP, detail, len, "%s", c->skip);
    cf_variant = c->variant;
    switch (c->contract) {
    case CF_OP: return cf_run_op(c, detail, len);
    case CF_ALL_GATHER:
    case CF_SHARD_UNIT: return cf_run_shard(c, detail, len);
    default: return cf_run_quant(c, detail, len);
    }
}
