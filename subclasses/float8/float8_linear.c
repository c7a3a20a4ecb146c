/* Float8Linear: out = x @ W^T (+ b), grad_x = g @ W, grad_W = g^T @ x,
 * each of the three GEMMs in fp8, high precision or fake-quant as the
 * recipe says, plus the presets and the delayed-scaling states.
 *
 * Operand scaling per GEMM (axiswise = along the dim that is not
 * contracted, the only scaling a GEMM epilogue can apply):
 *   fprop  a = x [M, K]   amax over K (dim 1 of x)    b = W^T: amax over K (dim 1 of W)
 *   dgrad  a = g [M, N]   amax over N (dim 1 of g)    b = W:   amax over N (dim 0 of W)
 *   wgrad  a = g^T        amax over M (dim 0 of g)    b = x:   amax over M (dim 0 of x)
 * Casts are cached per call chain: a cast of x, W (forward, kept in the
 * ctx) or g (one backward) is reused by a later GEMM that wants the same
 * format and scaling (tensorwise recipes quantize each tensor once, as
 * torchao and TE do; rowwise ones need W and x along another dim in the
 * backward). A float8 operand from the caller is used as it is when its
 * scaling fits the GEMM, else dequantized and quantized again.
 *
 * Layouts. The fp8 GEMM reads operands in place only K-major (cuBLASLt's
 * fp8 "TN" rule; the CPU takes either): A row-major, B column-major. With
 * out = x W^T, grad_x = g W, grad_W = g^T x, an operand reduced along its
 * dim 1 (x and W in fprop, g in dgrad) is wanted row-major and one reduced
 * along dim 0 (W in dgrad, g and x in wgrad) column-major, i.e. as the
 * transposed tensor's contiguous bytes. When a tensor is needed both ways
 * with one cast configuration (x: fprop and wgrad; W: fprop and dgrad; g:
 * dgrad and wgrad), both copies come from one read (fp8_quantize_t, the
 * cast + transpose); a tensor needed along dim 0 alone is cast the same
 * way. A float8 weight from the caller (the fp8 all-gather's
 * float8_weight) is transposed once per forward context on the device
 * (contiguous of its transposed bytes, no cast) for dgrad. On the CPU,
 * whose GEMM reads either layout at the same cost, none of this happens:
 * each cast is made once in row-major form and shared as before. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "float8_internal.h"

enum { SRC_X = 0, SRC_W = 1, SRC_G = 2 };
#define CACHE_MAX 8

typedef struct f8_cast {
    int src;
    lpx_dtype dtype;
    int granularity, axis;     /* axis: reduced dim of the source (axiswise) */
    int scaling;
    bool pow2;
    bool colmajor;             /* data stored column-major (the transpose's bytes contiguous) */
    lpx_tensor *t;             /* float8, source orientation */
    lpx_float8_stats stats;
} f8_cast;

typedef struct f8_cache {
    int n;
    f8_cast e[CACHE_MAX];
} f8_cache;

struct lpx_float8_linear_ctx {
    lpx_float8_linear_recipe r;
    lpx_float8_linear_state st;
    lpx_tensor *x2, *w;        /* x as [M, K], W [N, K]: dense or float8 */
    int x_ndim;
    int64_t x_shape[LPX_MAX_DIMS];
    lpx_dtype x_dtype, w_dtype;
    f8_cache cache;            /* casts of x and W */
};

static void cache_clear(f8_cache *c)
{
    for (int i = 0; i < c->n; i++) lpx_tensor_release(c->e[i].t);
    c->n = 0;
}

static const char *gemm_name(int g) { return g == 0 ? "fprop" : g == 1 ? "dgrad" : "wgrad"; }
static const char *role_word(int r)
{
    return r == LPX_FLOAT8_ROLE_INPUT ? "input" : r == LPX_FLOAT8_ROLE_WEIGHT ? "weight" : "grad_output";
}

/* ---- recipes ------------------------------------------------------- */

static lpx_float8_operand_config opc(lpx_dtype d, int gran, int scaling, bool pow2)
{
    lpx_float8_operand_config o;
    memset(&o, 0, sizeof o);
    o.dtype = d;
    o.granularity = gran;
    o.scaling = scaling;
    o.pow2_scale = pow2;
    return o;
}

static lpx_float8_gemm_config gemmc(int mode, lpx_float8_operand_config a, lpx_float8_operand_config b)
{
    lpx_float8_gemm_config g;
    g.mode = mode;
    g.a = a;
    g.b = b;
    return g;
}

lpx_status lpx_float8_linear_recipe_preset(const char *name, lpx_float8_linear_recipe *r)
{
    if (!r) return lpx_error(LPX_EINVAL, "lpx_float8_linear_recipe_preset: r is NULL");
    if (!name || !*name) name = "tensorwise";
    lpx_float8_linear_recipe x;
    memset(&x, 0, sizeof x);
    x.struct_size = sizeof x;
    const int FP8 = LPX_FLOAT8_GEMM_FP8, TW = LPX_FLOAT8_TENSORWISE, AX = LPX_FLOAT8_AXISWISE;
    const int DYN = LPX_FLOAT8_DYNAMIC, DEL = LPX_FLOAT8_DELAYED;
    if (!strcmp(name, "tensorwise") || !strcmp(name, "delayed")) {
        int sc = name[0] == 'd' ? DEL : DYN;
        lpx_float8_operand_config e4 = opc(LPX_F8E4M3FN, TW, sc, false), e5 = opc(LPX_F8E5M2, TW, sc, false);
        x.fprop = gemmc(FP8, e4, e4);
        x.dgrad = gemmc(FP8, e5, e4);
        x.wgrad = gemmc(FP8, e5, e4);
        x.delayed.history_len = 1024;
        x.delayed.algo = LPX_FLOAT8_AMAX_MAX;
        x.delayed.margin = 0;
        x.delayed.interval = 1;
    } else if (!strcmp(name, "rowwise") || !strcmp(name, "rowwise_with_gw_hp")) {
        lpx_float8_operand_config e4 = opc(LPX_F8E4M3FN, AX, DYN, true);
        x.fprop = gemmc(FP8, e4, e4);
        x.dgrad = gemmc(FP8, e4, e4);
        x.wgrad = gemmc(name[7] ? LPX_FLOAT8_GEMM_HIGH_PRECISION : FP8, e4, e4);
    } else if (!strcmp(name, "blockwise")) {
        /* DeepSeek-V3 / TransformerEngine Float8BlockScaling: e4m3
         * everywhere, 1 x 128 blocks along K for activations and
         * gradients, 128 x 128 for the weight, power-of-two scales */
        lpx_float8_operand_config e4 = opc(LPX_F8E4M3FN, LPX_FLOAT8_BLOCK, DYN, true);
        x.fprop = gemmc(FP8, e4, e4);
        x.dgrad = gemmc(FP8, e4, e4);
        x.wgrad = gemmc(FP8, e4, e4);
    } else {
        return lpx_error(LPX_ENOTFOUND,
                         "lpx_float8_linear_recipe_preset: unknown preset '%s' (tensorwise, rowwise, "
                         "rowwise_with_gw_hp, delayed, blockwise)", name);
    }
    /* the forward GEMM accumulates fast, the gradients with promotion
     * (torchao's Float8LinearConfig, TransformerEngine's split
     * accumulator for dgrad and wgrad only) */
    x.fast_accum = LPX_FLOAT8_FAST_ACCUM_FPROP;
    *r = x;
    return LPX_OK;
}

static lpx_status check_operand_cfg(const char *what, int g, const char *which, const lpx_float8_operand_config *o)
{
    if (!f8_is_fp8(o->dtype))
        return lpx_error(LPX_EDTYPE, "%s: recipe %s.%s.dtype is %s; f8e4m3fn or f8e5m2", what, gemm_name(g), which,
                         lpx_dtype_name(o->dtype));
    if (o->granularity != LPX_FLOAT8_TENSORWISE && o->granularity != LPX_FLOAT8_AXISWISE &&
        o->granularity != LPX_FLOAT8_BLOCK)
        return lpx_error(LPX_EINVAL, "%s: recipe %s.%s.granularity %d", what, gemm_name(g), which, o->granularity);
    if (o->scaling != LPX_FLOAT8_DYNAMIC && o->scaling != LPX_FLOAT8_DELAYED)
        return lpx_error(LPX_EINVAL, "%s: recipe %s.%s.scaling %d is not dynamic (0) or delayed (1)", what,
                         gemm_name(g), which, o->scaling);
    if (o->scaling == LPX_FLOAT8_DELAYED && o->granularity != LPX_FLOAT8_TENSORWISE)
        return lpx_error(LPX_EINVAL, "%s: recipe %s.%s: delayed scaling is tensorwise only", what, gemm_name(g), which);
    return LPX_OK;
}

/* A block-scaled GEMM takes two blockwise operands: a recipe mixing them
 * with other scalings in one fp8 GEMM is refused up front. */
static lpx_status check_block_pair(const char *what, int g, const lpx_float8_gemm_config *c)
{
    if (c->mode == LPX_FLOAT8_GEMM_FP8 &&
        (c->a.granularity == LPX_FLOAT8_BLOCK) != (c->b.granularity == LPX_FLOAT8_BLOCK))
        return lpx_error(LPX_EINVAL, "%s: recipe %s casts %s blockwise and %s not; a block-scaled fp8 GEMM takes two "
                         "blockwise operands (or use fake_quant)", what, gemm_name(g),
                         c->a.granularity == LPX_FLOAT8_BLOCK ? "a" : "b", c->a.granularity == LPX_FLOAT8_BLOCK ? "b" : "a");
    return LPX_OK;
}

/* The delayed format of a role: 0 if the recipe does not delay it. */
static lpx_status delayed_format(const char *what, const lpx_float8_linear_recipe *r, int role, lpx_dtype *fmt)
{
    const lpx_float8_gemm_config *gs[3] = {&r->fprop, &r->dgrad, &r->wgrad};
    /* (gemm, operand) pairs that read each role */
    static const int uses[3][2][2] = {{{0, 0}, {2, 1}}, {{0, 1}, {1, 1}}, {{1, 0}, {2, 0}}};
    int ri = role == LPX_FLOAT8_ROLE_INPUT ? 0 : role == LPX_FLOAT8_ROLE_WEIGHT ? 1 : 2;
    *fmt = 0;
    for (int u = 0; u < 2; u++) {
        int g = uses[ri][u][0], which = uses[ri][u][1];
        if (gs[g]->mode == LPX_FLOAT8_GEMM_HIGH_PRECISION) continue;
        const lpx_float8_operand_config *o = which ? &gs[g]->b : &gs[g]->a;
        if (o->scaling != LPX_FLOAT8_DELAYED) continue;
        if (*fmt && *fmt != o->dtype)
            return lpx_error(LPX_EINVAL, "%s: recipe delays %s scaling in two formats (%s, %s); one state holds one "
                                         "format's scale", what, role_word(role), lpx_dtype_name(*fmt),
                             lpx_dtype_name(o->dtype));
        *fmt = o->dtype;
    }
    return LPX_OK;
}

static lpx_status check_recipe(const char *what, const lpx_float8_linear_recipe *r);

/* The caller's recipe in this version's layout (*out), checked. The
 * struct grows at its end only: a struct_size of an earlier layout (ABI
 * 1.0 ends before fast_accum) reads the fields it covers, the rest 0. */
static lpx_status load_recipe(const char *what, const lpx_float8_linear_recipe *in, lpx_float8_linear_recipe *out)
{
    if (!in) return lpx_error(LPX_EINVAL, "%s: recipe is NULL", what);
    size_t v10 = offsetof(lpx_float8_linear_recipe, fast_accum);
    if (in->struct_size != sizeof *in && in->struct_size != v10)
        return lpx_error(LPX_EINVAL, "%s: recipe struct_size %zu, expected %zu (fill it with "
                                     "lpx_float8_linear_recipe_preset)", what, in->struct_size, sizeof *in);
    memset(out, 0, sizeof *out);
    memcpy(out, in, in->struct_size);
    out->struct_size = sizeof *out;
    return check_recipe(what, out);
}

/* lpx_fp8_scaled_mm_ex flags of GEMM g (0 fprop, 1 dgrad, 2 wgrad). */
static unsigned mm_flags(const lpx_float8_linear_recipe *r, int g)
{
    return (r->fast_accum >> g) & 1u ? LPX_FP8_MM_FAST_ACCUM : 0u;
}

static lpx_status check_recipe(const char *what, const lpx_float8_linear_recipe *r)
{
    if (r->fast_accum & ~7u)
        return lpx_error(LPX_EINVAL, "%s: recipe fast_accum 0x%x has bits beyond FPROP | DGRAD | WGRAD (7)", what,
                         r->fast_accum);
    const lpx_float8_gemm_config *gs[3] = {&r->fprop, &r->dgrad, &r->wgrad};
    lpx_status st;
    for (int g = 0; g < 3; g++) {
        int mode = gs[g]->mode;
        if (mode < LPX_FLOAT8_GEMM_FP8 || mode > LPX_FLOAT8_GEMM_FAKE_QUANT)
            return lpx_error(LPX_EINVAL, "%s: recipe %s.mode %d is not fp8 (0), high precision (1) or fake quant (2)",
                             what, gemm_name(g), mode);
        if (mode == LPX_FLOAT8_GEMM_HIGH_PRECISION) continue;
        if ((st = check_operand_cfg(what, g, "a", &gs[g]->a)) || (st = check_operand_cfg(what, g, "b", &gs[g]->b)) ||
            (st = check_block_pair(what, g, gs[g])))
            return st;
        if (mode == LPX_FLOAT8_GEMM_FP8 && gs[g]->a.dtype == LPX_F8E5M2 && gs[g]->b.dtype == LPX_F8E5M2)
            return lpx_error(LPX_EDTYPE, "%s: recipe %s casts both operands to f8e5m2; e5m2 x e5m2 GEMMs are refused "
                                         "(as cuBLASLt does)", what, gemm_name(g));
    }
    lpx_dtype f;
    for (int role = 1; role <= 3; role++)
        if ((st = delayed_format(what, r, role, &f))) return st;
    return LPX_OK;
}

lpx_status lpx_float8_linear_state_init(lpx_float8_linear_state *s, const lpx_float8_linear_recipe *r)
{
    const char *what = "lpx_float8_linear_state_init";
    if (!s) return lpx_error(LPX_EINVAL, "%s: state is NULL", what);
    memset(s, 0, sizeof *s);
    lpx_float8_linear_recipe rr;
    lpx_status st = lpx_ensure_init();
    if (st || (st = load_recipe(what, r, &rr))) return st;
    r = &rr;
    lpx_float8_delayed **slots[3] = {&s->input, &s->weight, &s->grad_output};
    for (int role = 1; role <= 3 && !st; role++) {
        lpx_dtype f;
        if ((st = delayed_format(what, r, role, &f)) || !f) continue;
        lpx_float8_delayed_config c = r->delayed;
        c.fp8 = f;
        st = lpx_float8_delayed_new(&c, slots[role - 1]);
    }
    if (st) lpx_float8_linear_state_destroy(s);
    return st;
}

void lpx_float8_linear_state_destroy(lpx_float8_linear_state *s)
{
    if (!s) return;
    lpx_float8_delayed_free(s->input);
    lpx_float8_delayed_free(s->weight);
    lpx_float8_delayed_free(s->grad_output);
    s->input = s->weight = s->grad_output = NULL;
}

/* ---- operands ------------------------------------------------------- */

typedef struct run {
    const char *what;
    const lpx_float8_linear_recipe *r;
    const lpx_float8_linear_state *st;
} run;

static lpx_float8_delayed *state_for(const run *u, int role)
{
    if (!u->st) return NULL;
    return role == LPX_FLOAT8_ROLE_INPUT ? u->st->input : role == LPX_FLOAT8_ROLE_WEIGHT ? u->st->weight
                                                                                        : u->st->grad_output;
}

static lpx_dtype logical_of(const lpx_tensor *t) { return lpx_tensor_dtype(t); }

enum { OP_BOTH = 1, OP_ANY_LAYOUT = 2 };

/* Whether two operand configs cast a tensor the same way (then one
 * fp8_quantize_t serves both GEMMs). */
static bool same_cast(const lpx_float8_operand_config *a, const lpx_float8_operand_config *b)
{
    return a->dtype == b->dtype && a->granularity == b->granularity && a->scaling == b->scaling &&
           a->pow2_scale == b->pow2_scale;
}

static bool colmajor_of(const lpx_tensor *t)
{
    const lpx_tensor *d = f8_data(t);
    return lpx_tensor_ndim(d) == 2 && lpx_tensor_shape(d)[0] > 1 && lpx_tensor_strides(d)[0] == 1;
}

static void cache_add(f8_cache *cache, int src, const lpx_float8_operand_config *oc, int axis, bool colmajor,
                      const lpx_float8_stats *stats, lpx_tensor *t)
{
    if (cache->n >= CACHE_MAX) return;
    f8_cast *e = &cache->e[cache->n++];
    e->src = src;
    e->dtype = oc->dtype;
    e->granularity = oc->granularity;
    e->axis = axis;
    e->scaling = oc->scaling;
    e->pow2 = oc->pow2_scale;
    e->colmajor = colmajor;
    e->stats = *stats;
    e->t = t;
    lpx_tensor_retain(t);
}

/* A cached cast of src with config oc and scale axis `axis`, in the wanted
 * layout if there is one, else in the other. */
static f8_cast *cache_find(f8_cache *cache, int src, const lpx_float8_operand_config *oc, int axis, bool colmajor)
{
    f8_cast *other = NULL;
    for (int i = 0; i < cache->n; i++) {
        f8_cast *e = &cache->e[i];
        if (e->src == src && e->dtype == oc->dtype && e->granularity == oc->granularity && e->axis == axis &&
            e->scaling == oc->scaling && e->pow2 == oc->pow2_scale) {
            if (e->colmajor == colmajor) return e;
            other = other ? other : e;
        }
    }
    return other;
}

/* Float8 t [R, C] (row-major data) with its data stored column-major: the
 * transposed bytes made contiguous on t's device, scales unchanged. */
static lpx_status f8_colmajor_copy(lpx_tensor *t, lpx_tensor **out)
{
    lpx_tensor *dt = NULL, *dc = NULL, *f = NULL;
    const f8_meta *m = f8_meta_of(t);
    lpx_tensor *s = NULL, *si = NULL;
    lpx_status st = lpx_t(f8_data(t), &dt);
    if (!st) st = lpx_contiguous(dt, &dc);
    if (!st) st = lpx_t(f8_scale(t), &s);
    if (!st) st = lpx_t(f8_scale_inv(t), &si);
    if (!st) {
        f8_meta mt = f8_meta_make(m->role, m->granularity, m->axis == 0 ? 1 : m->axis == 1 ? 0 : m->axis);
        st = f8_make(dc, s, si, lpx_tensor_dtype(t), &mt, &f);
    }
    if (!st) st = lpx_t(f, out);
    lpx_tensor *tmp[5] = {dt, dc, s, si, f};
    f8_release_all(tmp, 5);
    return st;
}

/* The float8 form of source tensor t (orientation of the source) for a
 * GEMM operand reduced along reduce_dim: t itself if it is float8 with
 * fitting scaling (transposed once into a cached column-major copy when
 * reduce_dim is 0), a cached cast, or a new cast (added to the cache).
 * flags: OP_BOTH, the other orientation of the same cast will be wanted
 * too (so one fp8_quantize_t makes both); OP_ANY_LAYOUT, the layout does
 * not matter (fake quant: the operand is dequantized). */
static lpx_status operand(const run *u, f8_cache *cache, int src, lpx_tensor *t, const lpx_float8_operand_config *oc,
                          int reduce_dim, int role, int flags, lpx_tensor **out, lpx_float8_operand_report *rep)
{
    *out = NULL;
    lpx_status st;
    lpx_tensor *hp = NULL;
    /* layouts matter where the GEMM reads only K-major operands in place
     * (cuBLASLt); the CPU GEMM decodes tiles of either layout alike, so
     * there one row-major cast serves every GEMM that can share it, and a
     * transposed copy would be work for nothing */
    bool layouts = !(flags & OP_ANY_LAYOUT) && lpx_tensor_device(t).type != LPX_DEVICE_CPU;
    bool both = layouts && (flags & OP_BOTH);
    bool want_col = layouts && reduce_dim == 0;
    /* blockwise: the weight's 128 x 128 cast serves both orientations;
     * activations and gradients get 1 x kb blocks along the contracted
     * dim (kb x 1 when that is dim 0: a fresh cast, not a re-layout) */
    bool block = oc->granularity == LPX_FLOAT8_BLOCK;
    int64_t br = LPX_FLOAT8_BLOCK_SIZE, bc = LPX_FLOAT8_BLOCK_SIZE;
    if (block && role != LPX_FLOAT8_ROLE_WEIGHT) {
        br = reduce_dim == 0 ? LPX_FLOAT8_BLOCK_SIZE : 1;
        bc = reduce_dim == 0 ? 1 : LPX_FLOAT8_BLOCK_SIZE;
    }
    if (block) both = want_col = false;
    if (f8_is(t)) {
        const f8_meta *m = f8_meta_of(t);
        if (m->role != LPX_FLOAT8_ROLE_NONE && m->role != role)
            return lpx_error(LPX_EINVAL, "%s: a float8 tensor with role %s was passed as the %s", u->what,
                             role_word(m->role), role_word(role));
        bool fits = block ? m->granularity == LPX_FLOAT8_BLOCK && f8_block_rows(m) == br && f8_block_cols(m) == bc
                          : m->granularity == LPX_FLOAT8_TENSORWISE ||
                                (m->granularity == LPX_FLOAT8_AXISWISE && m->axis == reduce_dim);
        if (fits) {
            if (rep) {
                rep->given_fp8 = true;
                rep->dtype = lpx_tensor_dtype(f8_data(t));
            }
            /* used as it is unless a column-major copy is wanted and its
             * data is a contiguous row-major matrix */
            if (!want_col || colmajor_of(t) || lpx_tensor_ndim(t) != 2 || !lpx_tensor_is_contiguous(f8_data(t))) {
                lpx_tensor_retain(t);
                *out = t;
                return LPX_OK;
            }
            /* the given tensor, transposed once per context (src -1 - src
             * marks "given"; its config is the tensor's own) */
            lpx_float8_operand_config gc = *oc;
            gc.dtype = lpx_tensor_dtype(f8_data(t));
            gc.granularity = m->granularity;
            f8_cast *e = cache_find(cache, -1 - src, &gc, m->axis, true);
            if (e) {
                lpx_tensor_retain(e->t);
                *out = e->t;
                return LPX_OK;
            }
            if ((st = f8_colmajor_copy(t, out))) return st;
            lpx_float8_stats none;
            memset(&none, 0, sizeof none);
            cache_add(cache, -1 - src, &gc, m->axis, true, &none, *out);
            return LPX_OK;
        }
        /* scaled along the wrong dim for this GEMM: quantize again */
        if ((st = f8_dequantize(t, LPX_FLOAT8_LOGICAL, &hp))) return st;
        t = hp;
    }
    /* the cache key's axis: the reduced dim for axiswise and for blocks
     * that depend on it, -2 for the weight's square blocks */
    int axis = oc->granularity == LPX_FLOAT8_AXISWISE || (block && role != LPX_FLOAT8_ROLE_WEIGHT) ? reduce_dim
               : block                                                                          ? -2
                                                                                                : -1;
    f8_cast *hit = cache_find(cache, src, oc, axis, want_col);
    if (hit) {
        if (rep) {
            rep->reused = true;
            rep->dtype = hit->dtype;
            rep->stats = hit->stats;
        }
        lpx_tensor_release(hp);
        lpx_tensor_retain(hit->t);
        *out = hit->t;
        return LPX_OK;
    }
    lpx_float8_quant_opts o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.fp8 = oc->dtype;
    o.granularity = oc->granularity;
    o.role = role;
    o.pow2_scale = oc->pow2_scale;
    o.nonsaturating = u->r->nonsaturating;
    if (block) {
        o.block_rows = (int)br;
        o.block_cols = (int)bc;
    }
    if (oc->scaling == LPX_FLOAT8_DELAYED) {
        o.delayed = state_for(u, role);
        if (!o.delayed) {
            lpx_tensor_release(hp);
            return lpx_error(LPX_EINVAL, "%s: the recipe uses delayed scaling for the %s but state->%s is NULL "
                                         "(lpx_float8_linear_state_init makes the states)", u->what, role_word(role),
                             role_word(role));
        }
    }
    lpx_float8_stats stats;
    /* both orientations from one read: q scaled along dim 1 (row-major),
     * qt along dim 0 (column-major) */
    bool dual = !block && (both || want_col) && lpx_tensor_ndim(t) == 2;
    lpx_tensor *row = NULL, *col = NULL;
    o.axis = dual ? 1 : reduce_dim;
    st = dual ? f8_quantize2(u->what, t, &o, &row, &col, &stats) : f8_quantize(u->what, t, &o, &row, &stats);
    lpx_tensor_release(hp);
    if (st) return st;
    if (rep) {
        rep->quantized = true;
        rep->dtype = oc->dtype;
        rep->stats = stats;
    }
    bool axw = oc->granularity == LPX_FLOAT8_AXISWISE;
    if (dual) {
        cache_add(cache, src, oc, axw ? 1 : -1, false, &stats, row);
        cache_add(cache, src, oc, axw ? 0 : -1, true, &stats, col);
        *out = want_col ? col : row;
        lpx_tensor_release(want_col ? row : col);
    } else {
        cache_add(cache, src, oc, axis, false, &stats, row);
        *out = row;
    }
    return LPX_OK;
}

/* operand(), then dequantized to the source's logical dtype (fake quant). */
static lpx_status fake_operand(const run *u, f8_cache *cache, int src, lpx_tensor *t,
                               const lpx_float8_operand_config *oc, int reduce_dim, int role, lpx_tensor **out,
                               lpx_float8_operand_report *rep)
{
    lpx_tensor *q = NULL;
    lpx_status st = operand(u, cache, src, t, oc, reduce_dim, role, OP_ANY_LAYOUT, &q, rep);
    if (!st) st = f8_dequantize(q, LPX_FLOAT8_LOGICAL, out);
    lpx_tensor_release(q);
    return st;
}

static lpx_status to_dtype(lpx_tensor *t, lpx_dtype d, lpx_tensor **out)
{
    if (lpx_tensor_dtype(t) == d) {
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    return lpx_cast(t, d, false, out);
}

static lpx_status flatten_rows(lpx_tensor *x, lpx_tensor **out)
{
    int nd = lpx_tensor_ndim(x);
    if (nd == 2) {
        lpx_tensor_retain(x);
        *out = x;
        return LPX_OK;
    }
    int64_t rows = 1;
    for (int i = 0; i < nd - 1; i++) rows *= lpx_tensor_shape(x)[i];
    int64_t shape[2] = {rows, lpx_tensor_shape(x)[nd - 1]};
    return lpx_reshape(x, 2, shape, out);
}

static void report_init(lpx_float8_gemm_report *g, int mode)
{
    memset(g, 0, sizeof *g);
    g->mode = mode;
}

/* ---- forward --------------------------------------------------------- */

lpx_status lpx_float8_linear_forward(const lpx_float8_linear_recipe *r, const lpx_float8_linear_state *state,
                                     lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor **out,
                                     lpx_float8_linear_ctx **ctxp, lpx_float8_linear_report *report)
{
    const char *what = "Float8Linear forward";
    if (ctxp) *ctxp = NULL;
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", what);
    *out = NULL;
    if (report) {
        report_init(&report->fprop, -1);
        report_init(&report->dgrad, -1);
        report_init(&report->wgrad, -1);
    }
    lpx_float8_linear_recipe rr;
    lpx_status st = lpx_ensure_init();
    if (st || (st = load_recipe(what, r, &rr))) return st;
    r = &rr;
    if (!x || !w) return lpx_error(LPX_EINVAL, "%s: %s is NULL", what, x ? "w" : "x");
    char sx[160], sw[160];
    lpx_tensor_shape_str(x, sx, sizeof sx);
    lpx_tensor_shape_str(w, sw, sizeof sw);
    int xnd = lpx_tensor_ndim(x);
    if (xnd < 1 || lpx_tensor_ndim(w) != 2 || lpx_tensor_shape(w)[1] != lpx_tensor_shape(x)[xnd - 1])
        return lpx_error(LPX_ESHAPE, "%s: x %s and w %s: expected x [..., K] and w [N, K] (K mismatch or bad rank)",
                         what, sx, sw);
    if (!f8_logical_ok(logical_of(x)) || !f8_logical_ok(logical_of(w)))
        return lpx_error(LPX_EDTYPE, "%s: x is %s and w is %s; Float8Linear runs f32, bf16 or f16 layers", what,
                         lpx_dtype_name(logical_of(x)), lpx_dtype_name(logical_of(w)));
    if (bias && (lpx_tensor_ndim(bias) != 1 || lpx_tensor_shape(bias)[0] != lpx_tensor_shape(w)[0])) {
        char sb[160];
        return lpx_error(LPX_ESHAPE, "%s: bias %s must be [N] for w %s", what, lpx_tensor_shape_str(bias, sb, sizeof sb),
                         sw);
    }
    run u = {what, r, state};
    lpx_float8_linear_ctx *ctx = lpx_calloc(1, sizeof *ctx);
    if (!ctx) return lpx_error(LPX_ENOMEM, "%s: cannot allocate the context", what);
    ctx->r = *r;
    if (state) ctx->st = *state;
    ctx->x_ndim = xnd;
    memcpy(ctx->x_shape, lpx_tensor_shape(x), (size_t)xnd * sizeof(int64_t));
    ctx->x_dtype = logical_of(x);
    ctx->w_dtype = logical_of(w);
    ctx->w = w;
    lpx_tensor_retain(w);
    lpx_tensor *xa = NULL, *wb = NULL, *wt = NULL, *hb = NULL, *y2 = NULL;
    lpx_float8_operand_report ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    int mode = r->fprop.mode;
    st = flatten_rows(x, &ctx->x2);
    if (!st && mode == LPX_FLOAT8_GEMM_HIGH_PRECISION) {
        if (!(st = f8_hp(ctx->x2, &xa)) && !(st = f8_hp(w, &wb)) && !(st = (bias ? f8_hp(bias, &hb) : LPX_OK)))
            st = lpx_linear(xa, wb, hb, &y2);
    } else if (!st && mode == LPX_FLOAT8_GEMM_FAKE_QUANT) {
        if (!(st = fake_operand(&u, &ctx->cache, SRC_X, ctx->x2, &r->fprop.a, 1, LPX_FLOAT8_ROLE_INPUT, &xa, &ra)) &&
            !(st = fake_operand(&u, &ctx->cache, SRC_W, w, &r->fprop.b, 1, LPX_FLOAT8_ROLE_WEIGHT, &wb, &rb)) &&
            !(st = (bias ? f8_hp(bias, &hb) : LPX_OK)))
            st = lpx_linear(xa, wb, hb, &y2);
    } else if (!st) {
        /* with a backward ahead, x and W are cast in both orientations */
        int fx = ctxp && r->wgrad.mode == LPX_FLOAT8_GEMM_FP8 && same_cast(&r->fprop.a, &r->wgrad.b) ? OP_BOTH : 0;
        int fw = ctxp && r->dgrad.mode == LPX_FLOAT8_GEMM_FP8 && same_cast(&r->fprop.b, &r->dgrad.b) ? OP_BOTH : 0;
        if (!(st = operand(&u, &ctx->cache, SRC_X, ctx->x2, &r->fprop.a, 1, LPX_FLOAT8_ROLE_INPUT, fx, &xa, &ra)) &&
            !(st = operand(&u, &ctx->cache, SRC_W, w, &r->fprop.b, 1, LPX_FLOAT8_ROLE_WEIGHT, fw, &wb, &rb)) &&
            !(st = lpx_t(wb, &wt)))
            st = f8_gemm("Float8Linear fprop", xa, wt, bias, ctx->x_dtype, mm_flags(&ctx->r, 0), &y2);
    }
    if (!st) {
        if (xnd == 2) {
            lpx_tensor_retain(y2);
            *out = y2;
        } else {
            int64_t shape[LPX_MAX_DIMS];
            memcpy(shape, ctx->x_shape, (size_t)xnd * sizeof *shape);
            shape[xnd - 1] = lpx_tensor_shape(w)[0];
            st = lpx_reshape(y2, xnd, shape, out);
        }
    }
    if (!st && report) {
        report->fprop.mode = mode;
        report->fprop.a = ra;
        report->fprop.b = rb;
    }
    lpx_tensor *tmp[5] = {xa, wb, wt, hb, y2};
    f8_release_all(tmp, 5);
    if (st || !ctxp) lpx_float8_linear_ctx_free(ctx);
    else *ctxp = ctx;
    return st;
}

void lpx_float8_linear_ctx_free(lpx_float8_linear_ctx *ctx)
{
    if (!ctx) return;
    cache_clear(&ctx->cache);
    lpx_tensor_release(ctx->x2);
    lpx_tensor_release(ctx->w);
    lpx_free(ctx);
}

/* ---- backward -------------------------------------------------------- */

static lpx_status dgrad(const run *u, lpx_float8_linear_ctx *ctx, f8_cache *gc, lpx_tensor *g2, bool wgrad_next,
                        lpx_tensor **gx2, lpx_float8_gemm_report *rep)
{
    const lpx_float8_gemm_config *gcfg = &ctx->r.dgrad;
    lpx_tensor *ga = NULL, *wb = NULL, *r = NULL;
    lpx_status st;
    report_init(rep, gcfg->mode);
    if (gcfg->mode == LPX_FLOAT8_GEMM_HIGH_PRECISION) {
        if (!(st = f8_hp(g2, &ga)) && !(st = f8_hp(ctx->w, &wb))) st = lpx_matmul(ga, wb, &r);
    } else if (gcfg->mode == LPX_FLOAT8_GEMM_FAKE_QUANT) {
        if (!(st = fake_operand(u, gc, SRC_G, g2, &gcfg->a, 1, LPX_FLOAT8_ROLE_GRAD_OUTPUT, &ga, &rep->a)) &&
            !(st = fake_operand(u, &ctx->cache, SRC_W, ctx->w, &gcfg->b, 0, LPX_FLOAT8_ROLE_WEIGHT, &wb, &rep->b)))
            st = lpx_matmul(ga, wb, &r);
    } else {
        /* g once for both GEMMs when wgrad follows in fp8 with the same cast */
        int fg = wgrad_next && ctx->r.wgrad.mode == LPX_FLOAT8_GEMM_FP8 && same_cast(&gcfg->a, &ctx->r.wgrad.a)
                     ? OP_BOTH
                     : 0;
        if (!(st = operand(u, gc, SRC_G, g2, &gcfg->a, 1, LPX_FLOAT8_ROLE_GRAD_OUTPUT, fg, &ga, &rep->a)) &&
            !(st = operand(u, &ctx->cache, SRC_W, ctx->w, &gcfg->b, 0, LPX_FLOAT8_ROLE_WEIGHT, 0, &wb, &rep->b)))
            st = f8_gemm("Float8Linear dgrad", ga, wb, NULL, ctx->x_dtype, mm_flags(&ctx->r, 1), &r);
    }
    if (!st) st = to_dtype(r, ctx->x_dtype, gx2);
    lpx_tensor *tmp[3] = {ga, wb, r};
    f8_release_all(tmp, 3);
    return st;
}

static lpx_status wgrad(const run *u, lpx_float8_linear_ctx *ctx, f8_cache *gc, lpx_tensor *g2, lpx_tensor **gw,
                        lpx_float8_gemm_report *rep)
{
    const lpx_float8_gemm_config *gcfg = &ctx->r.wgrad;
    lpx_tensor *ga = NULL, *gat = NULL, *xb = NULL, *r = NULL;
    lpx_status st;
    report_init(rep, gcfg->mode);
    if (gcfg->mode == LPX_FLOAT8_GEMM_HIGH_PRECISION) {
        if (!(st = f8_hp(g2, &ga)) && !(st = lpx_t(ga, &gat)) && !(st = f8_hp(ctx->x2, &xb)))
            st = lpx_matmul(gat, xb, &r);
    } else if (gcfg->mode == LPX_FLOAT8_GEMM_FAKE_QUANT) {
        if (!(st = fake_operand(u, gc, SRC_G, g2, &gcfg->a, 0, LPX_FLOAT8_ROLE_GRAD_OUTPUT, &ga, &rep->a)) &&
            !(st = lpx_t(ga, &gat)) &&
            !(st = fake_operand(u, &ctx->cache, SRC_X, ctx->x2, &gcfg->b, 0, LPX_FLOAT8_ROLE_INPUT, &xb, &rep->b)))
            st = lpx_matmul(gat, xb, &r);
    } else {
        if (!(st = operand(u, gc, SRC_G, g2, &gcfg->a, 0, LPX_FLOAT8_ROLE_GRAD_OUTPUT, 0, &ga, &rep->a)) &&
            !(st = lpx_t(ga, &gat)) &&
            !(st = operand(u, &ctx->cache, SRC_X, ctx->x2, &gcfg->b, 0, LPX_FLOAT8_ROLE_INPUT, 0, &xb, &rep->b)))
            st = f8_gemm("Float8Linear wgrad", gat, xb, NULL, ctx->w_dtype, mm_flags(&ctx->r, 2), &r);
    }
    if (!st) st = to_dtype(r, ctx->w_dtype, gw);
    lpx_tensor *tmp[4] = {ga, gat, xb, r};
    f8_release_all(tmp, 4);
    return st;
}

lpx_status lpx_float8_linear_backward(lpx_float8_linear_ctx *ctx, lpx_tensor *grad_out, lpx_tensor **grad_x,
                                      lpx_tensor **grad_w, lpx_tensor **grad_b, lpx_float8_linear_report *report)
{
    const char *what = "Float8Linear backward";
    lpx_tensor **outs[3] = {grad_x, grad_w, grad_b};
    for (int i = 0; i < 3; i++)
        if (outs[i]) *outs[i] = NULL;
    if (report) {
        report_init(&report->dgrad, -1);
        report_init(&report->wgrad, -1);
    }
    if (!ctx || !grad_out) return lpx_error(LPX_EINVAL, "%s: %s is NULL", what, ctx ? "grad_out" : "ctx");
    int nd = lpx_tensor_ndim(grad_out);
    const int64_t *gs = lpx_tensor_shape(grad_out);
    int64_t N = lpx_tensor_shape(ctx->w)[0];
    bool ok = nd == ctx->x_ndim && gs[nd - 1] == N;
    for (int i = 0; ok && i < nd - 1; i++) ok = gs[i] == ctx->x_shape[i];
    if (!ok) {
        char s1[160];
        return lpx_error(LPX_ESHAPE, "%s: grad_out %s must be x's shape with the last dim N = %lld", what,
                         lpx_tensor_shape_str(grad_out, s1, sizeof s1), (long long)N);
    }
    if (!f8_logical_ok(logical_of(grad_out)))
        return lpx_error(LPX_EDTYPE, "%s: grad_out is %s; f32, bf16 or f16 expected", what,
                         lpx_dtype_name(logical_of(grad_out)));
    run u = {what, &ctx->r, &ctx->st};
    f8_cache gc = {0};
    lpx_tensor *g2 = NULL, *gx2 = NULL, *gw = NULL, *gb = NULL, *gh = NULL, *gx = NULL;
    lpx_float8_gemm_report rd, rw;
    report_init(&rd, -1);
    report_init(&rw, -1);
    lpx_status st = flatten_rows(grad_out, &g2);
    if (!st && grad_x) st = dgrad(&u, ctx, &gc, g2, grad_w != NULL, &gx2, &rd);
    if (!st && grad_w) st = wgrad(&u, ctx, &gc, g2, &gw, &rw);
    if (!st && grad_b) {
        int64_t d0 = 0;
        if (!(st = f8_hp(g2, &gh))) st = lpx_sum(gh, 1, &d0, false, &gb);
    }
    if (!st && grad_x) st = ctx->x_ndim == 2 ? (lpx_tensor_retain(gx2), gx = gx2, LPX_OK)
                                             : lpx_reshape(gx2, ctx->x_ndim, ctx->x_shape, &gx);
    cache_clear(&gc);
    lpx_tensor_release(g2);
    lpx_tensor_release(gx2);
    lpx_tensor_release(gh);
    if (st) {
        lpx_tensor *tmp[3] = {gx, gw, gb};
        f8_release_all(tmp, 3);
        return st;
    }
    if (grad_x) *grad_x = gx;
    if (grad_w) *grad_w = gw;
    if (grad_b) *grad_b = gb;
    if (report) {
        report->dgrad = rd;
        report->wgrad = rw;
    }
    return LPX_OK;
}
