/* A small, correct "identity" kind (the payload is an f32 copy), built
 * three times with one deliberate defect each (IDENT_MODE):
 *   1  lpx-test-badgather: post_all_gather drops the last row
 *   2  lpx-test-segv:      to_dense dereferences NULL
 *   3  lpx-test-hang:      pre_all_gather never returns
 * The conformance kit must report each as failing cases (wrong shape,
 * crashed, timed out) and keep going. */
#include <string.h>
#include <unistd.h>
#include "lpx/lpx.h"

#if IDENT_MODE == 1
#  define NAME "test-badgather"
#elif IDENT_MODE == 2
#  define NAME "test-segv"
#elif IDENT_MODE == 3
#  define NAME "test-hang"
#else
#  error "IDENT_MODE must be 1, 2 or 3"
#endif

#define MAGIC 0x1de7u

static const lpx_kind *the_kind;

static lpx_status wrap(lpx_tensor *payload, lpx_dtype logical, lpx_tensor **out)
{
    uint32_t magic = MAGIC;
    return lpx_tensor_new_kind(the_kind, logical, lpx_tensor_ndim(payload), lpx_tensor_shape(payload),
                               lpx_cpu(), &payload, 1, &magic, sizeof magic, out);
}

static lpx_status from_dense(const lpx_kind *k, lpx_tensor *x, lpx_tensor **out)
{
    (void)k;
    lpx_tensor *p = NULL;
    lpx_status st = lpx_cast(x, LPX_F32, false, &p);   /* a fresh copy, also for f32 */
    if (!st && lpx_tensor_dtype(x) == LPX_F32) {
        lpx_tensor *q = NULL;
        st = lpx_clone(p, &q);
        lpx_tensor_release(p);
        p = q;
    }
    if (st) return st;
    st = wrap(p, lpx_tensor_dtype(x), out);
    lpx_tensor_release(p);
    return st;
}

static lpx_status to_dense(const lpx_tensor *t, lpx_tensor **out)
{
#if IDENT_MODE == 2
    volatile int *null = NULL;
    *null = 1;
#endif
    return lpx_clone(lpx_tensor_inner(t, 0), out);
}

static lpx_status unflatten(const lpx_kind *k, lpx_dtype dt, int ndim, const int64_t *shape,
                            lpx_tensor *const *inner, int ninner, const void *meta, size_t meta_size,
                            lpx_tensor **out)
{
    (void)k;
    if (ninner != 1 || !inner || !inner[0])
        return lpx_error(LPX_EINVAL, "%s unflatten: expected 1 inner tensor, got %d", NAME, ninner);
    uint32_t magic = 0;
    if (meta_size != sizeof magic || !meta)
        return lpx_error(LPX_EINVAL, "%s unflatten: meta_size %zu, expected %zu", NAME, meta_size, sizeof magic);
    memcpy(&magic, meta, sizeof magic);
    if (magic != MAGIC) return lpx_error(LPX_EINVAL, "%s unflatten: bad magic 0x%x", NAME, magic);
    const lpx_tensor *p = inner[0];
    if (lpx_tensor_kind(p) || lpx_tensor_dtype(p) != LPX_F32 || lpx_tensor_ndim(p) != ndim)
        return lpx_error(LPX_EINVAL, "%s unflatten: inner[0] must be a dense f32 tensor of %d dims", NAME, ndim);
    for (int i = 0; i < ndim; i++)
        if (lpx_tensor_shape(p)[i] != shape[i])
            return lpx_error(LPX_EINVAL, "%s unflatten: inner[0] dim %d is %lld, shape says %lld", NAME, i,
                             (long long)lpx_tensor_shape(p)[i], (long long)shape[i]);
    return wrap(inner[0], dt, out);
}

static lpx_status pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs,
                                 void *meta, size_t *meta_size)
{
    (void)ctx;
#if IDENT_MODE == 3
    for (;;) sleep(1);
#endif
    if (lpx_tensor_kind(shard) != the_kind)
        return lpx_error(LPX_EINVAL, "%s pre_all_gather: shard is not a %s tensor", NAME, NAME);
    inputs[0] = lpx_tensor_inner(shard, 0);
    lpx_tensor_retain(inputs[0]);
    *ninputs = 1;
    lpx_dtype dt = lpx_tensor_dtype(shard);
    memcpy(meta, &dt, sizeof dt);
    *meta_size = sizeof dt;
    return LPX_OK;
}

static lpx_status post_all_gather(const lpx_kind *k, lpx_tensor *const *outputs, int noutputs, const void *meta,
                                  size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result)
{
    (void)k;
    (void)param_dtype;
    if (noutputs != 1 || !outputs || meta_size != sizeof(lpx_dtype))
        return lpx_error(LPX_EINVAL, "%s post_all_gather: expected 1 output and %zu meta bytes", NAME,
                         sizeof(lpx_dtype));
    lpx_dtype dt;
    memcpy(&dt, meta, sizeof dt);
    lpx_tensor *g = outputs[0];
#if IDENT_MODE == 1
    lpx_tensor *cut = NULL;   /* the defect: one row short */
    lpx_status st = lpx_narrow(g, 0, 0, lpx_tensor_shape(g)[0] > 0 ? lpx_tensor_shape(g)[0] - 1 : 0, &cut);
    if (st) return st;
    g = cut;
#else
    lpx_tensor_retain(g);
#endif
    lpx_tensor *c = NULL;
    lpx_status rs = lpx_clone(g, &c);
    lpx_tensor_release(g);
    if (rs) return rs;
    if (out) {   /* in place: copy into out's payload */
        rs = lpx_copy_(lpx_tensor_inner(out, 0), c);
        lpx_tensor_release(c);
        if (rs) return rs;
        lpx_tensor_retain(out);
        *result = out;
        return LPX_OK;
    }
    rs = wrap(c, dt, result);
    lpx_tensor_release(c);
    return rs;
}

static lpx_status k_narrow(lpx_call *c)
{
    lpx_tensor *t = c->args[0].u.t, *p = NULL, *r = NULL;
    lpx_status st = lpx_narrow(lpx_tensor_inner(t, 0), c->args[1].u.i, c->args[2].u.i, c->args[3].u.i, &p);
    if (st) return st;
    lpx_tensor *q = NULL;
    st = lpx_contiguous(p, &q);
    lpx_tensor_release(p);
    if (!st) st = wrap(q, lpx_tensor_dtype(t), &r);
    lpx_tensor_release(q);
    if (st) return st;
    c->rets[c->nrets++] = lpx_v_tensor(r);
    return LPX_OK;
}

static const lpx_kind_conformance conf = {
    .struct_size = sizeof conf, .ndim = 2, .shape = {12, 8}, .max_err = 1e-9,
};

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = NAME;
    info->version = "1.0";
    info->description = "a deliberately broken identity kind";
    lpx_kind_i vt = {
        .struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = NAME,
        .priority = LPX_PRIORITY_PAYLOAD, .unflatten = unflatten, .pre_all_gather = pre_all_gather,
        .post_all_gather = post_all_gather, .from_dense = from_dense, .to_dense = to_dense,
        .conformance = &conf,
    };
    lpx_status st = host->kind_register(host, &vt, &the_kind);
    if (!st) st = host->kernel_register(host, LPX_OP_narrow, lpx_kind_key(the_kind), k_narrow, NULL);
    return st;
}
