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
#include "../../core/numerics/integer.h"

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
    if ((int)o->master < LPX_FSDP_MASTER_F32 || (int)o->master > LPX_FSDP_MASTER_F16S_SR)
        return lpx_error(LPX_EINVAL, "%s: optim.master %d is not f32 (0), bf16-sr (1), f16-scaled (2) or "
                         "f16-scaled-sr (3)", op, (int)o->master);
    if (o->state == LPX_FSDP_STATE_F32 && !fsdp_master_scaled(o)) {
        o->block = 0;
        return LPX_OK;
    }
    if (o->block && (o->block < 2 || o->block > LPX_OPTIM_STATE_BLOCK_MAX || (o->block & (o->block - 1))))
        return lpx_error(LPX_EINVAL, "%s: optim.block %lld is not a power of two in 2..%d", op, (long long)o->block,
                         LPX_OPTIM_STATE_BLOCK_MAX);
    if (!o->block) o->block = DEFAULT_BLOCK;
    if (o->state == LPX_FSDP_STATE_F32) return LPX_OK;
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

/* ---- FP8-LM's scaled f16 master (lpx_os_f16s_*): f16 codes of p / s, one
 * f32 scale s per block of the param's global flat index ------------------ */

bool fsdp_master_scaled(const lpx_fsdp_optim *o)
{
    return o->master == LPX_FSDP_MASTER_F16S || o->master == LPX_FSDP_MASTER_F16S_SR;
}

bool fsdp_master_scaled_applies(const lpx_fsdp_optim *o, lpx_dtype d) { return fsdp_master_scaled(o) && d == LPX_F32; }

bool fsdp_master_scaled_codes(const lpx_fsdp_optim *o, const lpx_tensor *local, const lpx_tensor *scale)
{
    return fsdp_master_scaled(o) && scale && lpx_tensor_dtype(local) == LPX_F16;
}

int64_t fsdp_master_unit(const lpx_fsdp_optim *o, int64_t row_elems)
{
    return fsdp_master_scaled(o) && row_elems > 0 ? lpx_rows_for_whole_blocks(row_elems, o->block) : 1;
}

lpx_status fsdp_master_quantize(const lpx_fsdp_optim *o, lpx_tensor *x, lpx_tensor **codes, lpx_tensor **scale)
{
    /* x: a dense CPU shard (any float dtype); its first element starts a
     * block of the global index (the shard unit) */
    *codes = *scale = NULL;
    lpx_tensor *f = NULL;
    lpx_status st = lpx_cast(x, LPX_F32, false, &f);
    if (!st && !lpx_tensor_is_contiguous(f)) {
        lpx_tensor *c = NULL;
        st = lpx_contiguous(f, &c);
        lpx_tensor_release(f);
        f = c;
    }
    int64_t n = lpx_tensor_numel(x), b = o->block, nb = n / b + (n % b != 0);
    if (!st) st = lpx_empty(lpx_tensor_ndim(x), lpx_tensor_shape(x), LPX_F16, lpx_cpu(), codes);
    if (!st) st = lpx_empty(1, &nb, LPX_F32, lpx_cpu(), scale);
    if (!st) {
        const float *xv = lpx_tensor_data(f);
        uint16_t *c = lpx_tensor_data(*codes);
        float *s = lpx_tensor_data(*scale);
        for (int64_t bi = 0, at = 0; at < n; bi++, at += b)
            s[bi] = lpx_os_quant_f16s(xv + at, (int)(n - at < b ? n - at : b), c + at);
    }
    lpx_tensor_release(f);
    if (st) {
        lpx_tensor_release(*codes);
        lpx_tensor_release(*scale);
        *codes = *scale = NULL;
    }
    return st;
}

lpx_status fsdp_master_dequant(int64_t block, lpx_tensor *codes, lpx_tensor *scale, lpx_tensor **out)
{
    *out = NULL;
    if (lpx_tensor_device(codes).type != LPX_DEVICE_CPU)
        return lpx_error(LPX_ENOTIMPL, "lpx_fsdp: a scaled-f16 master on a device (host engines only)");
    lpx_status st = lpx_empty(lpx_tensor_ndim(codes), lpx_tensor_shape(codes), LPX_F32, lpx_cpu(), out);
    if (st) return st;
    int64_t n = lpx_tensor_numel(codes), b = block;
    const uint16_t *c = lpx_tensor_data(codes);
    const float *s = lpx_tensor_data(scale);
    float *x = lpx_tensor_data(*out);
    for (int64_t bi = 0, at = 0; at < n; bi++, at += b) lpx_os_dequant_f16s(c + at, s[bi], (int)(n - at < b ? n - at : b), x + at);
    return LPX_OK;
}

void fsdp_master_decode(const lpx_fsdp_optim *o, const void *codes, const float *scale, float *x, size_t n)
{
    /* n elements from a block start (codes and scale already offset) */
    int64_t b = o->block;
    for (size_t at = 0, bi = 0; at < n; bi++, at += (size_t)b)
        lpx_os_dequant_f16s((const uint16_t *)codes + at, scale[bi], (int)(n - at < (size_t)b ? n - at : (size_t)b), x + at);
}

void fsdp_master_encode(const lpx_fsdp_optim *o, const float *x, void *codes, float *scale, size_t n, uint32_t pid,
                        int64_t step, int64_t index0)
{
    int64_t b = o->block;
    int sr = o->master == LPX_FSDP_MASTER_F16S_SR;
    for (size_t at = 0, bi = 0; at < n; bi++, at += (size_t)b)
        scale[bi] = lpx_os_f16s_store(x + at, (int)(n - at < (size_t)b ? n - at : (size_t)b), (uint16_t *)codes + at,
                                      sr, o->seed, pid, (uint64_t)step, (uint64_t)(index0 + (int64_t)at));
}

bool fsdp_master_is_sr(const lpx_fsdp_optim *o, lpx_dtype w)
{
    return o->master == LPX_FSDP_MASTER_BF16_SR && w == LPX_BF16;
}

void fsdp_store_sr(const float *x, void *dst, size_t n, uint64_t seed, uint32_t pid, int64_t step, int64_t index0)
{
    lpx_os_bf16_sr_store(x, (int)n, dst, seed, pid, (uint64_t)step, (uint64_t)index0);
}

lpx_status fsdp_state_step(const lpx_fsdp_optim *o, lpx_tensor *w, lpx_tensor *wscale, lpx_tensor *g, lpx_tensor *m,
                           lpx_tensor *v, const lpx_adamw_opts *h, int64_t step, uint32_t pid, int64_t index0)
{
    lpx_tensor *mc = lpx_tensor_inner(m, 0), *msc = lpx_tensor_inner(m, 1), *vc = lpx_tensor_inner(v, 0),
               *vsc = lpx_tensor_inner(v, 1);
    lpx_optim_master mode = fsdp_master_is_sr(o, lpx_tensor_dtype(w)) ? LPX_OPTIM_MASTER_BF16_SR : LPX_OPTIM_MASTER_PLAIN;
    if (fsdp_master_scaled_codes(o, w, wscale))
        mode = o->master == LPX_FSDP_MASTER_F16S_SR ? LPX_OPTIM_MASTER_F16S_SR : LPX_OPTIM_MASTER_F16S;
    else
        wscale = NULL;
    return lpx_adamw_state_(&w, &g, &mc, &msc, &vc, &vsc, 1, (lpx_optim_state_format)state_format[o->state], o->block,
                            h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, step, mode, o->seed, pid, index0,
                            wscale ? &wscale : NULL);
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
