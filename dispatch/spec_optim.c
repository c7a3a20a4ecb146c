/* The spec families of include/lpx/op_args_optim.h: their meta functions
 * (the conventions are spec.c's). */
#include <stdio.h>
#include "spec_internal.h"

/* A tensor of list argument i (entry j) that reached a backend: dense, of a
 * byte-sized dtype; the message names the entry as "name[j]"
 * (lpx__spec_dense_slow's wording). */
static lpx_status list_dense(const lpx_call *c, int i, uint32_t j, const lpx_tensor *t)
{
    if (LPX_LIKELY(!t->kind && (unsigned)t->dtype < LPX_DTYPE_BUILTIN_COUNT)) return LPX_OK;
    char arg[64];
    snprintf(arg, sizeof arg, "%s[%u]", arg_name(c, i), j);
    return lpx__spec_dense_named(c, arg, t);
}

/* ---- adamw: adamw_ ------------------------------------------------------ */

lpx_status lpx__spec_adamw(const lpx_call *c, void *p)
{
    lpx_adamw_args *a = p;
    const lpx_value *v = c->args;
    /* the contract (lists, hyperparameters, dtypes, contiguity, numel),
     * then what every family checks: each tensor dense (the order the CPU
     * kernel checked them in before the spec) */
    lpx_status st = lpx_meta_adamw(op_name(c), v, &a->k);
    if (st) return st;
    uint32_t n = v[0].len;
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < 4; j++)
            if ((st = list_dense(c, j, i, v[j].u.ts[i]))) return st;
    a->params = v[0].u.ts;
    a->grads = v[1].u.ts;
    a->exp_avg = v[2].u.ts;
    a->exp_avg_sq = v[3].u.ts;
    a->n = n;
    return LPX_OK;
}

/* ---- adamw_state: adamw_state_ ------------------------------------------ */

enum { AS_PARAMS, AS_GRADS, AS_M, AS_MS, AS_V, AS_VS, AS_FORMAT, AS_BLOCK, AS_LR, AS_STEP = 13, AS_MASTER,
       AS_MASTER_SCALE };

static const char *const as_formats[3] = {"8-bit", "4-bit", "fp8"};

/* entry j of list argument i: dense, contiguous, of `dtype` (or, with
 * dtype -1, floating-point), `numel` elements, writable when written */
static lpx_status as_item(const lpx_call *c, int i, uint32_t j, const lpx_tensor *t, int dtype, int64_t numel,
                          bool written, const char *why)
{
    lpx_status st = list_dense(c, i, j, t);
    if (st) return st;
    const char *op = op_name(c), *arg = arg_name(c, i);
    if (dtype < 0 ? !lpx_dtype_get(t->dtype)->is_float : t->dtype != (lpx_dtype)dtype)
        return lpx_error(LPX_EDTYPE, "%s: %s[%u] has dtype %s; %s", op, arg, j, lpx_dtype_name(t->dtype), why);
    if (!lpx_tensor_is_contiguous(t))
        return lpx_error(LPX_EINVAL, "%s: %s[%u] is not contiguous (the step runs over flat storage)", op, arg, j);
    if (written && t->storage && t->storage->readonly)
        return lpx_error(LPX_EINVAL, "%s: %s[%u] is read-only (e.g. a read-only DLPack import)", op, arg, j);
    if (t->numel != numel)
        return lpx_error(LPX_ESHAPE, "%s: %s[%u] has %lld elements, the %s state of params[%u] (%lld elements, block "
                         "%lld) needs %lld", op, arg, j, (long long)t->numel, as_formats[c->args[AS_FORMAT].u.i], j,
                         (long long)c->args[AS_PARAMS].u.ts[j]->numel, (long long)c->args[AS_BLOCK].u.i,
                         (long long)numel);
    return LPX_OK;
}

lpx_status lpx__spec_adamw_state(const lpx_call *c, void *p)
{
    lpx_adamw_state_args *a = p;
    const lpx_value *v = c->args;
    const char *op = op_name(c);
    uint32_t n = v[AS_PARAMS].len;
    for (int j = AS_GRADS; j <= AS_VS; j++)
        if (v[j].len != n)
            return lpx_error(LPX_EINVAL, "%s: params has %u tensors but %s has %u", op, n, arg_name(c, j), v[j].len);
    int64_t format = v[AS_FORMAT].u.i, block = v[AS_BLOCK].u.i;
    if (format < 0 || format > 2)
        return lpx_error(LPX_EINVAL, "%s: format %lld is not a state format (0 8-bit, 1 4-bit, 2 fp8)", op,
                         (long long)format);
    if (block < 2 || block > 256 || (block & (block - 1)))
        return lpx_error(LPX_EINVAL, "%s: block %lld is not a power of two in 2..256 (the %s state)", op,
                         (long long)block, as_formats[format]);
    /* the hyperparameters and their f32 constants: adamw_'s contract over
     * empty lists */
    lpx_value h[10];
    for (int j = 0; j < 4; j++) h[j] = lpx_v_tensors(NULL, 0);
    for (int j = 0; j < 6; j++) h[4 + j] = v[AS_LR + j];
    lpx_status st = lpx_meta_adamw(op, h, &a->k);
    if (st) return st;
    const lpx_value *ms = &v[AS_MASTER];
    int64_t mode = ms->len ? ms->u.ints[0] : -1;
    if ((ms->len != 1 && ms->len != 4) || mode < 0 || mode > 3 || ((mode == 1 || mode == 3) && ms->len != 4))
        return lpx_error(LPX_EINVAL, "%s: master has %u entries (mode %lld); it takes [mode] with mode 0..3 or [mode, "
                         "seed, rank, index0] (modes 1 and 3, stochastic rounding, need all four)", op, ms->len,
                         (long long)mode);
    a->seed = ms->len == 4 ? (uint64_t)ms->u.ints[1] : 0;
    int64_t rank = ms->len == 4 ? ms->u.ints[2] : 0, index0 = ms->len == 4 ? ms->u.ints[3] : 0;
    if (rank < 0 || rank > (int64_t)UINT32_MAX || index0 < 0)
        return lpx_error(LPX_EINVAL, "%s: master rank %lld or index0 %lld out of range (rank 0..2^32-1, index0 >= 0)",
                         op, (long long)rank, (long long)index0);
    bool f16s = mode >= 2;
    if (v[AS_MASTER_SCALE].len != (f16s ? n : 0))
        return lpx_error(LPX_EINVAL, "%s: master_scale has %u tensors; master mode %lld needs %u", op,
                         v[AS_MASTER_SCALE].len, (long long)mode, f16s ? n : 0);
    static const char *const pwhy[4] = {"adamw_state_ takes floating-point tensors",
                                        "the bf16 stochastic-rounding master (mode 1) is bf16",
                                        "the scaled-f16 master (mode 2) is f16", "the scaled-f16 master (mode 3) is f16"};
    static const int pdt[4] = {-1, LPX_BF16, LPX_F16, LPX_F16};
    int vdt = format == 2 ? LPX_F16 : LPX_U8;
    const char *mwhy = "the state's codes are u8",
               *vwhy = format == 2 ? "the fp8 state's v is f16 (scaled)" : "the state's codes are u8",
               *swhy = "block scales are f32";
    int64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        const lpx_tensor *pt = v[AS_PARAMS].u.ts[i];
        int64_t N = pt->numel, B = N / block + (N % block != 0);
        int64_t codes = format == 1 ? N / block * (block / 2) + (N % block + 1) / 2 : N;
        if ((st = as_item(c, AS_PARAMS, i, pt, pdt[mode], N, true, pwhy[mode])) ||
            (st = as_item(c, AS_GRADS, i, v[AS_GRADS].u.ts[i], -1, N, false, "adamw_state_ takes floating-point tensors")) ||
            (st = as_item(c, AS_M, i, v[AS_M].u.ts[i], LPX_U8, codes, true, mwhy)) ||
            (st = as_item(c, AS_MS, i, v[AS_MS].u.ts[i], LPX_F32, B, true, swhy)) ||
            (st = as_item(c, AS_V, i, v[AS_V].u.ts[i], vdt, codes, true, vwhy)) ||
            (st = as_item(c, AS_VS, i, v[AS_VS].u.ts[i], LPX_F32, B, true, swhy)) ||
            (f16s && (st = as_item(c, AS_MASTER_SCALE, i, v[AS_MASTER_SCALE].u.ts[i], LPX_F32, B, true, swhy))))
            return st;
        int64_t end; /* index0 + the elements so far: the stochastic rounding's flat index */
        if (__builtin_add_overflow(total, N, &total) || __builtin_add_overflow(total, index0, &end))
            return lpx_error(LPX_ERANGE, "%s: the flat index of params[%u]'s last element overflows int64", op, i);
    }
    a->params = v[AS_PARAMS].u.ts;
    a->grads = v[AS_GRADS].u.ts;
    a->m = v[AS_M].u.ts;
    a->m_scale = v[AS_MS].u.ts;
    a->v = v[AS_V].u.ts;
    a->v_scale = v[AS_VS].u.ts;
    a->master_scale = f16s ? v[AS_MASTER_SCALE].u.ts : NULL;
    a->n = n;
    a->format = (int)format;
    a->master = (int)mode;
    a->block = block;
    a->step = v[AS_STEP].u.i;
    a->rank = (uint32_t)rank;
    a->index0 = index0;
    return LPX_OK;
}
