/* Gradient codecs (include/lpx/fsdp.h, "gradient codecs"): the registry
 * and the two built-ins. The sharding engine (fsdp_grads.c) names no
 * dtype: what goes on the wire of a gradient reduce-scatter is the
 * codec's choice.
 *
 *   "plain"  pass-through: each grad dtype (f32, bf16, f16) is its own
 *            bucket, reduced as it is with avg; the engine copies bytes
 *            (also in device memory).
 *   "fp8lm"  FP8-LM / MS-AMP (docs/SHARDING.md): the local amax of every
 *            grad of the group, ONE all-reduce(MAX) for the global amax
 *            (and one over the replicate group of a 2-D mesh, so every
 *            rank shares one scale), s = fp8_max / (amax * N) so that a
 *            sum of N values cannot overflow; every grad is encoded to fp8
 *            with s (saturating) and reduced with SUM; the result is
 *            decoded to f32 and multiplied by 1 / (s * N) = amax /
 *            fp8_max: the 1/N of averaging lives in the scale, not in a
 *            pass over the data. The comm layer's fp8 reduction decodes
 *            every rank's codes exactly, sums them in f32 in rank order
 *            and encodes the sum once (RNE; with this scale it never
 *            saturates). All grads of a group share one bucket. */
#include <pthread.h>
#include <string.h>
#include "dtensor_internal.h"

/* ---- "plain" ---------------------------------------------------------- */

static lpx_status plain_wire(const lpx_grad_codec_i *self, void *state, lpx_dtype grad, lpx_grad_wire *out)
{
    (void)self;
    (void)state;
    static const lpx_dtype order[] = {LPX_F32, LPX_BF16, LPX_F16};
    for (int k = 0; k < 3; k++)
        if (grad == order[k]) {
            out->bucket = k;
            out->wire = out->out = grad;
            out->op = LPX_REDUCE_AVG;
            return LPX_OK;
        }
    return lpx_error(LPX_EDTYPE, "codec '%s' takes dense f32, bf16 or f16 grads", LPX_GRAD_CODEC_PLAIN);
}

static const lpx_grad_codec_i plain_codec = {
    .struct_size = sizeof(lpx_grad_codec_i),
    .name = LPX_GRAD_CODEC_PLAIN,
    .description = "the grads' own bytes, one bucket per dtype (f32, bf16, f16), reduced with avg",
    .flags = LPX_GRAD_CODEC_PASSTHROUGH,
    .wire = plain_wire,
};

/* ---- "fp8lm" ---------------------------------------------------------- */

typedef struct fp8lm_state {
    lpx_dtype fp8;
} fp8lm_state;

static lpx_status fp8lm_configure(const lpx_grad_codec_i *self, const lpx_fsdp_config *cfg, void **state)
{
    (void)self;
    lpx_dtype d = cfg->fp8_grad_dtype ? cfg->fp8_grad_dtype : LPX_F8E5M2;
    if (d != LPX_F8E5M2 && d != LPX_F8E4M3FN)
        return lpx_error(LPX_EDTYPE, "fp8_grad_dtype %s is not an fp8 dtype", lpx_dtype_name(d));
    fp8lm_state *s = lpx_calloc(1, sizeof *s);
    if (!s) return lpx_error(LPX_ENOMEM, "out of memory");
    s->fp8 = d;
    *state = s;
    return LPX_OK;
}

static void fp8lm_release(const lpx_grad_codec_i *self, void *state)
{
    (void)self;
    lpx_free(state);
}

static lpx_status fp8lm_wire(const lpx_grad_codec_i *self, void *state, lpx_dtype grad, lpx_grad_wire *out)
{
    (void)self;
    if (grad != LPX_F32 && grad != LPX_BF16 && grad != LPX_F16)
        return lpx_error(LPX_EDTYPE, "codec '%s' takes dense f32, bf16 or f16 grads", LPX_GRAD_CODEC_FP8LM);
    out->bucket = 0;
    out->wire = ((fp8lm_state *)state)->fp8;
    out->op = LPX_REDUCE_SUM;
    out->out = LPX_F32;
    return LPX_OK;
}

/* the shared scale from the global amax of the bucket's grads */
static lpx_status fp8lm_prepare(const lpx_grad_codec_i *self, void *state, lpx_grad_codec_ctx *ctx)
{
    (void)self;
    float amax = 0.0f;
    for (int i = 0; i < ctx->ngrads; i++) {
        lpx_tensor *t = ctx->grads[i];
        if (!lpx_tensor_numel(t)) continue;
        lpx_tensor *a = NULL;
        double v;
        lpx_status st = lpx_amax(t, 0, NULL, false, &a);
        if (!st) st = lpx_item(a, 0, &v);
        lpx_tensor_release(a);
        if (st) return st;
        if (!(v <= 3.4e38)) return lpx_error(LPX_ENUMERIC, "grad of '%s' holds NaN or inf", ctx->names[i]);
        if ((float)v > amax) amax = (float)v;
    }
    lpx_status st = lpx_comm_all_reduce_buf(ctx->comm, &amax, &amax, 1, LPX_F32, LPX_REDUCE_MAX);
    if (st) return st;
    ctx->amax_allreduces++;
    /* hybrid: the replicas average codes too, so they must share the scale */
    if (ctx->rep) {
        if ((st = lpx_comm_all_reduce_buf(ctx->rep, &amax, &amax, 1, LPX_F32, LPX_REDUCE_MAX))) return st;
        ctx->amax_allreduces++;
    }
    double fmax = lpx_dtype_get(((fp8lm_state *)state)->fp8)->max;
    double a = amax > 1e-30f ? amax : 1e-30;
    float scale = (float)(fmax / (a * ctx->world));
    ctx->scale = scale;
    ctx->unscale = (float)(1.0 / ((double)scale * ctx->world));
    return LPX_OK;
}

/* x * s -> fp8 (saturating), straight onto the wire */
static lpx_status fp8lm_encode(const lpx_grad_codec_i *self, void *state, const lpx_grad_codec_ctx *ctx,
                               const void *src, lpx_dtype grad, void *dst, size_t n)
{
    (void)self;
    float *tmp = lpx_malloc(n * sizeof *tmp), scale = (float)ctx->scale;
    if (!tmp) return lpx_error(LPX_ENOMEM, "out of memory");
    lpx_status st = lpx_convert(tmp, LPX_F32, src, grad, n, 0);
    for (size_t k = 0; k < n && !st; k++) tmp[k] *= scale;
    if (!st) st = lpx_convert(dst, ((fp8lm_state *)state)->fp8, tmp, LPX_F32, n, LPX_CONVERT_SATURATE);
    lpx_free(tmp);
    return st;
}

static lpx_status fp8lm_decode(const lpx_grad_codec_i *self, void *state, const lpx_grad_codec_ctx *ctx,
                               const void *src, void *dst, size_t n)
{
    (void)self;
    float *o = dst, unscale = (float)ctx->unscale;
    lpx_status st = lpx_convert(o, LPX_F32, src, ((fp8lm_state *)state)->fp8, n, 0);
    for (size_t k = 0; k < n && !st; k++) o[k] *= unscale;
    return st;
}

static const lpx_grad_codec_i fp8lm_codec = {
    .struct_size = sizeof(lpx_grad_codec_i),
    .name = LPX_GRAD_CODEC_FP8LM,
    .description = "FP8-LM: fp8 codes (fp8_grad_dtype) with one shared global scale, summed; f32 grad shards",
    .configure = fp8lm_configure,
    .release = fp8lm_release,
    .wire = fp8lm_wire,
    .prepare = fp8lm_prepare,
    .encode = fp8lm_encode,
    .decode = fp8lm_decode,
};

/* ---- the registry ----------------------------------------------------- */

#define CODEC_MAX 32
#define CODEC_NAME_MAX 31

typedef struct codec_slot {
    bool used;
    char name[CODEC_NAME_MAX + 1];
    lpx_grad_codec_i vt;      /* name points at the slot's name */
} codec_slot;

static pthread_mutex_t codec_mu = PTHREAD_MUTEX_INITIALIZER;
static codec_slot codecs[CODEC_MAX];
static const lpx_grad_codec_i *const builtins[] = {&plain_codec, &fp8lm_codec};
#define NBUILTIN ((int)(sizeof builtins / sizeof builtins[0]))

static const lpx_grad_codec_i *builtin(const char *name)
{
    for (int i = 0; i < NBUILTIN; i++)
        if (!strcmp(builtins[i]->name, name)) return builtins[i];
    return NULL;
}

lpx_status lpx_grad_codec_register(const lpx_grad_codec_i *c)
{
    const char *op = "lpx_grad_codec_register";
    if (!c || c->struct_size < offsetof(lpx_grad_codec_i, user) || !c->name || !*c->name || !c->wire)
        return lpx_error(LPX_EINVAL, "%s: %s", op, !c ? "codec is NULL"
                         : c->struct_size < offsetof(lpx_grad_codec_i, user) ? "struct_size too small"
                                                                              : "name and wire are required");
    if (strlen(c->name) > CODEC_NAME_MAX)
        return lpx_error(LPX_EINVAL, "%s: name '%s' is longer than %d chars", op, c->name, CODEC_NAME_MAX);
    if (!(c->flags & LPX_GRAD_CODEC_PASSTHROUGH) && (!c->encode || !c->decode))
        return lpx_error(LPX_EINVAL, "%s(%s): a codec that is not LPX_GRAD_CODEC_PASSTHROUGH needs encode and decode",
                         op, c->name);
    if (builtin(c->name)) return lpx_error(LPX_EEXIST, "%s(%s): a built-in codec has that name", op, c->name);
    lpx_status st = LPX_OK;
    pthread_mutex_lock(&codec_mu);
    int free_at = -1;
    for (int i = 0; i < CODEC_MAX && !st; i++) {
        if (codecs[i].used && !strcmp(codecs[i].name, c->name))
            st = lpx_error(LPX_EEXIST, "%s(%s): already registered", op, c->name);
        else if (!codecs[i].used && free_at < 0)
            free_at = i;
    }
    if (!st && free_at < 0) st = lpx_error(LPX_EFULL, "%s(%s): %d codecs are registered", op, c->name, CODEC_MAX);
    if (!st) {
        codec_slot *s = &codecs[free_at];
        memset(s, 0, sizeof *s);
        memcpy(&s->vt, c, c->struct_size < sizeof s->vt ? c->struct_size : sizeof s->vt);
        s->vt.struct_size = sizeof s->vt;
        snprintf(s->name, sizeof s->name, "%s", c->name);
        s->vt.name = s->name;
        s->used = true;
    }
    pthread_mutex_unlock(&codec_mu);
    return st;
}

lpx_status lpx_grad_codec_unregister(const char *name)
{
    const char *op = "lpx_grad_codec_unregister";
    if (!name) return lpx_error(LPX_EINVAL, "%s: name is NULL", op);
    if (builtin(name)) return lpx_error(LPX_EINVAL, "%s(%s): a built-in codec stays", op, name);
    bool found = false;
    pthread_mutex_lock(&codec_mu);
    for (int i = 0; i < CODEC_MAX && !found; i++)
        if (codecs[i].used && !strcmp(codecs[i].name, name)) {
            codecs[i].used = false;
            found = true;
        }
    pthread_mutex_unlock(&codec_mu);
    return found ? LPX_OK : lpx_error(LPX_ENOTFOUND, "%s(%s): no such codec", op, name);
}

lpx_status lpx_grad_codec_find(const char *name, const lpx_grad_codec_i **out)
{
    const char *op = "lpx_grad_codec_find";
    if (out) *out = NULL;
    if (!name || !out) return lpx_error(LPX_EINVAL, "%s: NULL argument", op);
    if ((*out = builtin(name))) return LPX_OK;
    char known[CODEC_MAX * (CODEC_NAME_MAX + 3) + 64];
    size_t at = (size_t)snprintf(known, sizeof known, "%s, %s", plain_codec.name, fp8lm_codec.name);
    pthread_mutex_lock(&codec_mu);
    for (int i = 0; i < CODEC_MAX; i++) {
        if (!codecs[i].used) continue;
        if (!strcmp(codecs[i].name, name)) {
            *out = &codecs[i].vt;
            break;
        }
        if (at < sizeof known) at += (size_t)snprintf(known + at, sizeof known - at, ", %s", codecs[i].name);
    }
    pthread_mutex_unlock(&codec_mu);
    if (*out) return LPX_OK;
    return lpx_error(LPX_ENOTFOUND, "%s: no gradient codec '%s' (registered: %s)", op, name, known);
}
