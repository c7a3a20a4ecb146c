/* The optimizer-state formats the sharding engine keeps (issue 37), named
 * here as precision.c names the param formats, so that the engine's files
 * (fsdp*.c) name no kind and no dtype (scripts/check-layers.py):
 *   - which registered kind holds the moments of each lpx_fsdp_state (the
 *     kinds live in subclasses/optim_state, the same layer: the engine
 *     reaches them by name and through their vtable and the public layout
 *     of include/lpx/optim_state.h, never by symbol);
 *   - the layout of a zero state (codes and block scales), made through
 *     the kind's unflatten, which validates it;
 *   - the step: the dense op adamw_state_ on the state's inner tensors;
 *   - the bf16 master and its stochastic rounding (core/numerics). */
#include <string.h>
#include "fsdp_internal.h"
#include "lpx/optim_state.h"
#include "../../core/numerics/optim_state.h"

static const char *const state_names[] = {"f32", "8bit", "4bit", "fp8"};
static const char *const state_kinds[] = {NULL, "os_8bit", "os_4bit", "os_fp8"};
static const int state_format[] = {-1, LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_FP8};
/* the formats' default blocks: lpx_optim_state_default_block's */
#define DEFAULT_BLOCK 256

const char *fsdp_state_name(int state) { return state >= 0 && state <= 3 ? state_names[state] : "?"; }

lpx_status fsdp_optim_check(const char *op, lpx_fsdp_optim *o)
{
    if ((int)o->state < LPX_FSDP_STATE_F32 || (int)o->state > LPX_FSDP_STATE_FP8)
        return lpx_error(LPX_EINVAL, "%s: optim.state %d is not f32 (0), 8bit (1), 4bit (2) or fp8 (3)", op,
                         (int)o->state);
    if ((int)o->master != LPX_FSDP_MASTER_F32 && (int)o->master != LPX_FSDP_MASTER_BF16_SR)
        return lpx_error(LPX_EINVAL, "%s: optim.master %d is not f32 (0) or bf16-sr (1)", op, (int)o->master);
    if (o->state == LPX_FSDP_STATE_F32) {
        o->block = 0;
        return LPX_OK;
    }
    if (o->block && (o->block < 2 || o->block > LPX_OPTIM_STATE_BLOCK_MAX || (o->block & (o->block - 1))))
        return lpx_error(LPX_EINVAL, "%s: optim.block %lld is not a power of two in 2..%d", op, (long long)o->block,
                         LPX_OPTIM_STATE_BLOCK_MAX);
    if (!o->block) o->block = DEFAULT_BLOCK;
    const lpx_kind *k = NULL;
    if (lpx_kind_find(state_kinds[o->state], &k))
        return lpx_error(LPX_ENOTFOUND, "%s: optim.state %s: kind %s is not registered", op, state_names[o->state],
                         state_kinds[o->state]);
    return LPX_OK;
}

lpx_status fsdp_state_new(const lpx_fsdp_optim *o, int role, int ndim, const int64_t *shape, lpx_device dev,
                          lpx_tensor **out)
{
    const char *op = "lpx_fsdp optimizer state";
    const lpx_kind *k = NULL;
    *out = NULL;
    lpx_status st = lpx_kind_find(state_kinds[o->state], &k);
    if (st) return st;
    int64_t numel = 0;
    if ((st = lpx_shape_numel(op, ndim, shape, &numel))) return st;
    int format = state_format[o->state];
    int64_t b = o->block, nb = numel / b + (numel % b != 0);
    int64_t cl = format == LPX_OPTIM_STATE_4BIT ? numel / b * (b / 2) + (numel % b + 1) / 2 : numel;
    lpx_dtype cd = format == LPX_OPTIM_STATE_FP8 && role == LPX_OPTIM_STATE_V ? LPX_F16 : LPX_U8;
    lpx_tensor *in[2] = {NULL, NULL};
    lpx_optim_state_meta m = {LPX_OPTIM_STATE_META_MAGIC, LPX_OPTIM_STATE_META_VERSION, format, role, b};
    if (!(st = lpx_zeros(1, &cl, cd, dev, &in[0])) && !(st = lpx_zeros(1, &nb, LPX_F32, dev, &in[1])))
        st = lpx_kind_unflatten(k, LPX_F32, ndim, shape, in, 2, &m, sizeof m, out);
    lpx_tensor_release(in[0]);
    lpx_tensor_release(in[1]);
    return st;
}

lpx_status fsdp_state_unit(const lpx_fsdp_optim *o, int ndim, const int64_t *shape, int64_t *unit)
{
    /* the kind's shard unit of one row of the param: rows whose elements
     * fill whole blocks */
    int64_t one[LPX_MAX_DIMS];
    memcpy(one, shape, (size_t)ndim * sizeof *one);
    one[0] = 1;
    lpx_tensor *t = NULL;
    lpx_status st = fsdp_state_new(o, LPX_OPTIM_STATE_M, ndim, one, lpx_cpu(), &t);
    if (st) return st;
    const lpx_kind_i *vt = lpx_kind_vtable(lpx_tensor_kind(t));
    *unit = vt->shard_unit ? vt->shard_unit(t) : 1;
    lpx_tensor_release(t);
    return LPX_OK;
}

lpx_status fsdp_state_check(const lpx_fsdp_optim *o, const lpx_tensor *t, int role, int64_t numel, const char **why)
{
    const lpx_kind *k = NULL;
    size_t ms = 0;
    *why = NULL;
    if (lpx_kind_find(state_kinds[o->state], &k) || lpx_tensor_kind(t) != k) *why = "a tensor of the group's state kind";
    else {
        const lpx_optim_state_meta *m = lpx_tensor_meta(t, &ms);
        if (!m || ms != sizeof *m || m->role != role || m->block != o->block) *why = "the role and block of the group";
        else if (lpx_tensor_numel(t) != numel) *why = "the local shard's element count";
    }
    return *why ? LPX_EINVAL : LPX_OK;
}

lpx_dtype fsdp_master_dtype(const lpx_fsdp_optim *o) { return o->master == LPX_FSDP_MASTER_BF16_SR ? LPX_BF16 : 0; }

bool fsdp_master_is_sr(const lpx_fsdp_optim *o, lpx_dtype w)
{
    return o->master == LPX_FSDP_MASTER_BF16_SR && w == LPX_BF16;
}

void fsdp_store_sr(const float *x, void *dst, size_t n, uint64_t seed, uint32_t pid, int64_t step, int64_t index0)
{
    lpx_os_bf16_sr_store(x, (int)n, dst, seed, pid, (uint64_t)step, (uint64_t)index0);
}

lpx_status fsdp_state_step(const lpx_fsdp_optim *o, lpx_tensor *w, lpx_tensor *g, lpx_tensor *m, lpx_tensor *v,
                           const lpx_adamw_opts *h, int64_t step, uint32_t pid, int64_t index0)
{
    lpx_tensor *mc = lpx_tensor_inner(m, 0), *msc = lpx_tensor_inner(m, 1), *vc = lpx_tensor_inner(v, 0),
               *vsc = lpx_tensor_inner(v, 1);
    lpx_optim_master mode = fsdp_master_is_sr(o, lpx_tensor_dtype(w)) ? LPX_OPTIM_MASTER_BF16_SR : LPX_OPTIM_MASTER_PLAIN;
    return lpx_adamw_state_(&w, &g, &mc, &msc, &vc, &vsc, 1, (lpx_optim_state_format)state_format[o->state], o->block,
                            h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, step, mode, o->seed, pid, index0, NULL);
}

lpx_status fsdp_state_quantize(const lpx_fsdp_optim *o, int role, const lpx_tensor *x, int ndim, const int64_t *shape,
                               lpx_tensor **out)
{
    /* a zero state, its codes and scales filled on the CPU as the step
     * requantizes (lpx_optim_state_quantize's arithmetic) */
    lpx_status st = fsdp_state_new(o, role, ndim, shape, lpx_cpu(), out);
    if (st) return st;
    int format = state_format[o->state];
    int64_t numel = lpx_tensor_numel(*out), b = o->block;
    const float *xv = lpx_tensor_data((lpx_tensor *)x);
    unsigned char *codes = lpx_tensor_data(lpx_tensor_inner(*out, 0));
    float *scales = lpx_tensor_data(lpx_tensor_inner(*out, 1)), q[256];
    if (format != LPX_OPTIM_STATE_FP8) {
        int map = format == LPX_OPTIM_STATE_8BIT ? (role == LPX_OPTIM_STATE_M ? LPX_OS_MAP8_SIGNED : LPX_OS_MAP8_UNSIGNED)
                                                 : (role == LPX_OPTIM_STATE_M ? LPX_OS_MAP4_SIGNED : LPX_OS_MAP4_UNSIGNED);
        lpx_os_map_fill(map, q);
    }
    for (int64_t bi = 0, at = 0; at < numel; bi++, at += b) {
        int n = (int)(numel - at < b ? numel - at : b);
        if (format == LPX_OPTIM_STATE_8BIT) scales[bi] = lpx_os_quant8(q, xv + at, n, codes + at);
        else if (format == LPX_OPTIM_STATE_4BIT) scales[bi] = lpx_os_quant4(q, xv + at, n, codes + at / 2);
        else if (role == LPX_OPTIM_STATE_M) scales[bi] = lpx_os_quant_e4m3(xv + at, n, codes + at);
        else scales[bi] = lpx_os_quant_f16s(xv + at, n, (uint16_t *)(void *)codes + at);
    }
    return LPX_OK;
}
