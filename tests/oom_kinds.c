/* OOM sweep cases (tests/oom.h): the float8 and nf4 kinds, their APIs
 * (float8.h, nf4.h) and the typed ops of ops.h dispatched to their
 * handlers and fallbacks. */
#include "oom.h"

/* fixtures (hook disarmed, read only) */
static lpx_tensor *XF, *WF, *GF, *Q8X, *Q8W, *Q8WR, *Q8XR, *WN, *Q4, *Q4S, *XN, *AN, *BN, *GN, *D8, *S8, *H16;

lpx_status oom_kinds_init(void)
{
    lpx_status st;
    XF = oom_randn2(64, 96, 21, LPX_F32);
    WF = oom_randn2(48, 96, 22, LPX_BF16);
    GF = oom_randn2(64, 48, 23, LPX_F32);
    H16 = oom_randn2(32, 96, 24, LPX_F16);
    lpx_float8_quant_opts in = {.struct_size = sizeof in, .role = LPX_FLOAT8_ROLE_INPUT};
    lpx_float8_quant_opts w = {.struct_size = sizeof w, .role = LPX_FLOAT8_ROLE_WEIGHT};
    lpx_float8_quant_opts rw = {.struct_size = sizeof rw, .role = LPX_FLOAT8_ROLE_WEIGHT,
                                .granularity = LPX_FLOAT8_AXISWISE, .axis = -1, .pow2_scale = true};
    lpx_float8_quant_opts rx = rw;
    rx.role = LPX_FLOAT8_ROLE_INPUT;
    if ((st = lpx_float8_quantize(XF, &in, &Q8X, NULL)) || (st = lpx_float8_quantize(WF, &w, &Q8W, NULL)) ||
        (st = lpx_float8_quantize(WF, &rw, &Q8WR, NULL)) || (st = lpx_float8_quantize(XF, &rx, &Q8XR, NULL)))
        return st;
    /* raw fp8 data and its scale, for lpx_float8_from_data and the dense fp8 ops */
    if ((st = lpx_fp8_quantize(XF, NULL, LPX_F8E4M3FN, NULL, false, 0, true, &D8, &S8, NULL, NULL))) return st;
    WN = oom_randn2(128, 96, 25, LPX_BF16);
    if ((st = lpx_nf4_quantize(WN, NULL, &Q4))) return st;
    /* small blocks: every row is a scaler-block boundary, so dim-0 slices cut anywhere */
    lpx_nf4_config small = lpx_nf4_config_default();
    small.block = 32;
    small.scaler_block = 1;
    if ((st = lpx_nf4_quantize(WN, &small, &Q4S))) return st;
    XN = oom_randn2(5, 96, 26, LPX_F32);
    AN = oom_randn2(8, 96, 27, LPX_F32);
    BN = oom_randn2(128, 8, 28, LPX_F32);
    GN = oom_randn2(5, 128, 29, LPX_F32);
    return XF && WF && GF && H16 && XN && AN && BN && GN ? LPX_OK : LPX_EINVAL;
}

void oom_kinds_fini(void)
{
    if (lpx_float8_fallback_enabled()) lpx_float8_set_fallback(false);
    lpx_tensor **all[] = {&XF, &WF, &GF, &Q8X, &Q8W, &Q8WR, &Q8XR, &WN, &Q4, &Q4S, &XN, &AN, &BN, &GN, &D8, &S8, &H16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        lpx_tensor_release(*all[i]);
        *all[i] = NULL;
    }
}

#define OUT_CASE(cname, call)            \
    static lpx_status cname(int attempt) \
    {                                    \
        (void)attempt;                   \
        lpx_tensor *o = NULL;            \
        lpx_status st = OOM(call);       \
        OOM_OUT_NULL(st, o);             \
        lpx_tensor_release(o);           \
        return st;                       \
    }

/* ---- delayed scaling --------------------------------------------------- */

static const lpx_float8_delayed_config DCFG = {.history_len = 16, .algo = LPX_FLOAT8_AMAX_MAX, .margin = 1};

static lpx_status c_delayed_new(int attempt)
{
    (void)attempt;
    lpx_float8_delayed *d = NULL;
    lpx_status st = OOM(lpx_float8_delayed_new(&DCFG, &d));
    OOM_OUT_NULL(st, d);
    lpx_float8_delayed_free(d);
    return st;
}

/* one of the state functions on a fresh state */
static lpx_status delayed_op(int which)
{
    lpx_float8_delayed *d = NULL, *e = NULL;
    OOM_SETUP(lpx_float8_delayed_new(&DCFG, &d));
    OOM_SETUP(lpx_float8_delayed_update(d, 3.5));
    unsigned char blob[4096];
    size_t size = 0;
    lpx_float8_delayed_config cfg;
    lpx_status st;
    switch (which) {
    case 0: st = OOM(lpx_float8_delayed_update(d, 7.0)); break;
    case 1: st = OOM(lpx_float8_delayed_get_config(d, &cfg)); break;
    case 2: st = OOM(lpx_float8_delayed_save(d, blob, sizeof blob, &size)); break;
    default:
        OOM_SETUP(lpx_float8_delayed_save(d, blob, sizeof blob, &size));
        OOM_SETUP(lpx_float8_delayed_new(NULL, &e));   /* another config: load replaces it */
        st = OOM(lpx_float8_delayed_load(e, blob, size));
        if (st) OOM_CHECKF(lpx_float8_delayed_steps(e) == 0, "a failed load changed the state");
        else OOM_CHECK(lpx_float8_delayed_steps(e) == 1 && lpx_float8_delayed_scale(e) == lpx_float8_delayed_scale(d));
    }
    lpx_float8_delayed_free(d);
    lpx_float8_delayed_free(e);
    return st;
}
static lpx_status c_delayed_update(int a) { (void)a; return delayed_op(0); }
static lpx_status c_delayed_get_config(int a) { (void)a; return delayed_op(1); }
static lpx_status c_delayed_save(int a) { (void)a; return delayed_op(2); }
static lpx_status c_delayed_load(int a) { (void)a; return delayed_op(3); }

/* ---- quantize, wrap, inspect -------------------------------------------- */

static lpx_status quantize(lpx_tensor *x, const lpx_float8_quant_opts *o)
{
    lpx_tensor *q = NULL;
    lpx_float8_stats stats;
    lpx_status st = OOM(lpx_float8_quantize(x, o, &q, &stats));
    OOM_OUT_NULL(st, q);
    lpx_tensor_release(q);
    return st;
}

static lpx_status c_f8_quantize(int a) { (void)a; return quantize(XF, NULL); }

static lpx_status c_f8_quantize_rowwise(int a)
{
    (void)a;
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .granularity = LPX_FLOAT8_AXISWISE, .axis = -1,
                               .pow2_scale = true, .fp8 = LPX_F8E5M2};
    return quantize(WF, &o);
}

static lpx_status c_f8_quantize_static(int a)
{
    (void)a;
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .scale = S8, .nonsaturating = true};
    return quantize(H16, &o);
}

static lpx_status c_f8_quantize_delayed(int a)
{
    (void)a;
    lpx_float8_delayed *d = NULL;
    OOM_SETUP(lpx_float8_delayed_new(&DCFG, &d));
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .delayed = d};
    lpx_status st = quantize(XF, &o);
    OOM_CHECKF(lpx_float8_delayed_steps(d) == (st ? 0 : 1), "a failed quantize recorded its amax");
    lpx_float8_delayed_free(d);
    return st;
}

OUT_CASE(c_f8_from_data, lpx_float8_from_data(D8, S8, LPX_BF16, LPX_FLOAT8_ROLE_INPUT, LPX_FLOAT8_TENSORWISE, -1, &o))

static lpx_status c_f8_get_info(int a)
{
    (void)a;
    lpx_float8_info info;
    return OOM(lpx_float8_get_info(Q8WR, &info));
}

OUT_CASE(c_f8_dequantize, lpx_float8_dequantize(Q8X, LPX_FLOAT8_LOGICAL, &o))
OUT_CASE(c_f8_dequantize_rowwise, lpx_float8_dequantize(Q8WR, LPX_F16, &o))

static lpx_status c_f8_mm(int attempt)
{
    (void)attempt;
    lpx_tensor *bt = NULL, *o = NULL;
    OOM_SETUP(lpx_t(Q8WR, &bt));   /* [96, 48], one scale per column */
    lpx_status st = OOM(lpx_float8_mm(Q8XR, bt, NULL, LPX_BF16, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(bt);
    return st;
}

/* switching the fallback off retires its registry entry (kept for
 * lock-free readers, never freed): OOM_PERSISTENT, no heap balance */
static lpx_status c_f8_set_fallback(int attempt)
{
    (void)attempt;
    lpx_status st = OOM(lpx_float8_set_fallback(true));
    OOM_CHECK(lpx_float8_fallback_enabled() == (st == LPX_OK));
    if (!st) OOM_SETUP(lpx_float8_set_fallback(false));
    return st;
}

/* the dense fp8 ops (ops_float8.def) */
static lpx_status c_fp8_quantize(int attempt)
{
    (void)attempt;
    lpx_tensor *q = NULL, *s = NULL, *si = NULL, *stt = NULL;
    int64_t dim = 1;
    lpx_status st = OOM(lpx_fp8_quantize(XF, NULL, LPX_F8E5M2, &dim, true, 65504, false, &q, &s, &si, &stt));
    OOM_CHECK(!st || (!q && !s && !si && !stt));
    lpx_tensor_release(q);
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    lpx_tensor_release(stt);
    return st;
}

static lpx_status c_fp8_quantize_t(int attempt)
{
    lpx_tensor *o[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    lpx_status st = OOM(lpx_fp8_quantize_t(XF, NULL, LPX_F8E4M3FN, attempt % 2 == 0, attempt % 3 == 0, 0, true, &o[0],
                                           &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]));
    bool none = true;
    for (int i = 0; i < 7; i++) none = none && !o[i];
    OOM_CHECK(!st || none);
    for (int i = 0; i < 7; i++) lpx_tensor_release(o[i]);
    return st;
}

static lpx_status c_fp8_scale_from_amax(int attempt)
{
    (void)attempt;
    lpx_tensor *amax = NULL, *s = NULL, *si = NULL;
    OOM_SETUP(lpx_amax(XF, 0, NULL, false, &amax));
    lpx_status st = OOM(lpx_fp8_scale_from_amax(amax, LPX_F8E4M3FN, true, 0, &s, &si));
    OOM_CHECK(!st || (!s && !si));
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    lpx_tensor_release(amax);
    return st;
}

OUT_CASE(c_fp8_dequantize, lpx_fp8_dequantize(D8, lpx_float8_scale_inv(Q8X), LPX_BF16, &o))

/* blockwise: the dense ops, and the float8 kind's block path */
static lpx_status c_fp8_quantize_block(int attempt)
{
    (void)attempt;
    lpx_tensor *q = NULL, *s = NULL, *si = NULL, *stt = NULL;
    lpx_status st = OOM(lpx_fp8_quantize_block(WF, LPX_F8E4M3FN, 128, 128, true, true, &q, &s, &si, &stt));
    OOM_CHECK(!st || (!q && !s && !si && !stt));
    lpx_tensor *tmp[4] = {q, s, si, stt};
    for (int i = 0; i < 4; i++) lpx_tensor_release(tmp[i]);
    return st;
}

static lpx_status c_f8_quantize_block(int attempt)
{
    (void)attempt;
    lpx_float8_quant_opts o = {.struct_size = sizeof o, .granularity = LPX_FLOAT8_BLOCK, .role = LPX_FLOAT8_ROLE_INPUT,
                               .pow2_scale = true};
    lpx_tensor *q = NULL;
    lpx_status st = OOM(lpx_float8_quantize(XF, &o, &q, NULL));
    OOM_OUT_NULL(st, q);
    lpx_tensor_release(q);
    return st;
}

static lpx_status c_fp8_block_dequantize_mm(int attempt)
{
    (void)attempt;
    lpx_tensor *qa = NULL, *qw = NULL, *sa = NULL, *sw = NULL, *wt = NULL, *swt = NULL, *d = NULL, *o = NULL;
    OOM_SETUP(lpx_fp8_quantize_block(XF, LPX_F8E4M3FN, 1, 128, true, true, &qa, NULL, &sa, NULL));
    OOM_SETUP(lpx_fp8_quantize_block(WF, LPX_F8E4M3FN, 128, 128, true, true, &qw, NULL, &sw, NULL));
    OOM_SETUP(lpx_t(qw, &wt));
    OOM_SETUP(lpx_t(sw, &swt));
    lpx_status st = OOM(lpx_fp8_dequantize_block(qa, sa, 1, 128, LPX_BF16, &d));
    OOM_OUT_NULL(st, d);
    if (!st) {
        st = OOM(lpx_fp8_mm_block(qa, sa, 1, 128, wt, swt, 128, 128, NULL, LPX_F32, &o));
        OOM_OUT_NULL(st, o);
    }
    lpx_tensor *tmp[8] = {qa, qw, sa, sw, wt, swt, d, o};
    for (int i = 0; i < 8; i++) lpx_tensor_release(tmp[i]);
    return st;
}

static lpx_status c_fp8_mm_block(int attempt)
{
    return c_fp8_block_dequantize_mm(attempt);
}

static lpx_status c_fp8_scaled_mm(int attempt)
{
    (void)attempt;
    lpx_tensor *bt = NULL, *o = NULL;
    OOM_SETUP(lpx_t(lpx_float8_data(Q8W), &bt));   /* [96, 48] column-major */
    lpx_status st = OOM(lpx_fp8_scaled_mm(lpx_float8_data(Q8X), lpx_float8_scale_inv(Q8X), bt,
                                          lpx_float8_scale_inv(Q8W), NULL, LPX_F32, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(bt);
    return st;
}

static lpx_status c_fp8_scaled_mm_ex(int attempt)
{
    (void)attempt;
    lpx_tensor *bt = NULL, *o = NULL;
    OOM_SETUP(lpx_t(lpx_float8_data(Q8W), &bt));   /* [96, 48] column-major */
    lpx_status st = OOM(lpx_fp8_scaled_mm_ex(lpx_float8_data(Q8X), lpx_float8_scale_inv(Q8X), bt,
                                             lpx_float8_scale_inv(Q8W), NULL, LPX_BF16, LPX_FP8_MM_FAST_ACCUM, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(bt);
    return st;
}

/* ---- Float8Linear -------------------------------------------------------- */

static lpx_status c_recipe_preset(int attempt)
{
    (void)attempt;
    lpx_float8_linear_recipe r;
    return OOM(lpx_float8_linear_recipe_preset("rowwise_with_gw_hp", &r));
}

static lpx_status c_state_init(int attempt)
{
    (void)attempt;
    lpx_float8_linear_recipe r;
    OOM_SETUP(lpx_float8_linear_recipe_preset("delayed", &r));
    r.delayed.history_len = 32;
    lpx_float8_linear_state s;
    memset(&s, 0xab, sizeof s);
    lpx_status st = OOM(lpx_float8_linear_state_init(&s, &r));
    if (st) OOM_CHECKF(!s.input && !s.weight && !s.grad_output, "a failed state_init left states behind");
    lpx_float8_linear_state_destroy(&s);
    return st;
}

/* forward (and with `backward`, the backward of an unarmed forward) */
static lpx_status f8_linear(const char *preset, bool backward, bool fp8_inputs)
{
    lpx_float8_linear_recipe r;
    OOM_SETUP(lpx_float8_linear_recipe_preset(preset, &r));
    lpx_float8_linear_state s = {0};
    OOM_SETUP(lpx_float8_linear_state_init(&s, &r));
    lpx_tensor *x = fp8_inputs ? Q8X : XF, *w = fp8_inputs ? Q8W : WF;
    lpx_tensor *out = NULL, *gx = NULL, *gw = NULL, *gb = NULL, *bias = oom_randn1(48, 3, LPX_BF16);
    lpx_float8_linear_ctx *ctx = NULL;
    lpx_float8_linear_report rep;
    lpx_status st;
    if (!backward) {
        st = OOM(lpx_float8_linear_forward(&r, &s, x, w, bias, &out, &ctx, &rep));
        OOM_OUT_NULL(st, out);
        OOM_OUT_NULL(st, ctx);
    } else {
        OOM_SETUP(lpx_float8_linear_forward(&r, &s, x, w, bias, &out, &ctx, NULL));
        st = OOM(lpx_float8_linear_backward(ctx, GF, &gx, &gw, &gb, &rep));
        OOM_CHECK(!st || (!gx && !gw && !gb));
    }
    lpx_float8_linear_ctx_free(ctx);
    lpx_tensor *all[] = {out, gx, gw, gb, bias};
    for (size_t i = 0; i < 5; i++) lpx_tensor_release(all[i]);
    lpx_float8_linear_state_destroy(&s);
    return st;
}

static lpx_status c_lin_fwd_tw(int a) { (void)a; return f8_linear("tensorwise", false, false); }
static lpx_status c_lin_fwd_rw(int a) { (void)a; return f8_linear("rowwise", false, false); }
static lpx_status c_lin_fwd_delayed(int a) { (void)a; return f8_linear("delayed", false, false); }
static lpx_status c_lin_fwd_fp8in(int a) { (void)a; return f8_linear("tensorwise", false, true); }
static lpx_status c_lin_bwd_tw(int a) { (void)a; return f8_linear("tensorwise", true, false); }
static lpx_status c_lin_bwd_rwhp(int a) { (void)a; return f8_linear("rowwise_with_gw_hp", true, false); }
static lpx_status c_lin_bwd_delayed(int a) { (void)a; return f8_linear("delayed", true, false); }

static lpx_status c_lin_fwd_fakequant(int attempt)
{
    (void)attempt;
    lpx_float8_linear_recipe r;
    OOM_SETUP(lpx_float8_linear_recipe_preset("tensorwise", &r));
    r.fprop.mode = LPX_FLOAT8_GEMM_FAKE_QUANT;
    lpx_tensor *out = NULL;
    lpx_status st = OOM(lpx_float8_linear_forward(&r, NULL, XF, WF, NULL, &out, NULL, NULL));
    OOM_OUT_NULL(st, out);
    lpx_tensor_release(out);
    return st;
}

/* ---- typed ops on float8 tensors (the kind's handlers) ---------------------- */

static const int64_t V8[3] = {8, 8, 96}, R8[2] = {96, 64};

OUT_CASE(c_f8_linear, lpx_linear(Q8X, Q8W, NULL, &o))
OUT_CASE(c_f8_t, lpx_t(Q8X, &o))
OUT_CASE(c_f8_transpose, lpx_transpose(Q8WR, 0, 1, &o))
OUT_CASE(c_f8_view, lpx_view(Q8X, 3, V8, &o))
OUT_CASE(c_f8_reshape, lpx_reshape(Q8X, 2, R8, &o))
OUT_CASE(c_f8_slice, lpx_slice(Q8WR, 0, 4, 40, 2, &o))
OUT_CASE(c_f8_narrow, lpx_narrow(Q8X, 1, 8, 32, &o))
OUT_CASE(c_f8_cast, lpx_cast(Q8WR, LPX_F32, false, &o))
OUT_CASE(c_f8_contiguous, lpx_contiguous(Q8X, &o))
OUT_CASE(c_f8_clone, lpx_clone(Q8WR, &o))
OUT_CASE(c_f8_detach, lpx_detach(Q8X, &o))

static lpx_status c_f8_matmul_t(int attempt)
{
    (void)attempt;
    lpx_tensor *bt = NULL, *o = NULL;
    OOM_SETUP(lpx_t(Q8W, &bt));
    lpx_status st = OOM(lpx_matmul(Q8X, bt, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(bt);
    return st;
}

static lpx_status c_f8_matmul_rw(int attempt)
{
    (void)attempt;
    lpx_tensor *bt = NULL, *o = NULL;
    OOM_SETUP(lpx_t(Q8WR, &bt));   /* one scale per column */
    lpx_status st = OOM(lpx_matmul(Q8XR, bt, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(bt);
    return st;
}

static lpx_status c_f8_addmm(int attempt)
{
    (void)attempt;
    lpx_tensor *bt = NULL, *o = NULL, *c = oom_randn1(48, 4, LPX_F32);
    OOM_SETUP(lpx_t(Q8W, &bt));
    lpx_status st = OOM(lpx_addmm(c, Q8X, bt, 1.0, 0.5, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(bt);
    lpx_tensor_release(c);
    return st;
}

static lpx_status split_kind(lpx_tensor *t, bool chunk)
{
    lpx_tensor *outs[8] = {0};
    int n = 0;
    lpx_status st = chunk ? OOM(lpx_chunk(t, 2, 0, outs, 8, &n)) : OOM(lpx_split(t, 16, 0, outs, 8, &n));
    if (st)
        for (int i = 0; i < 8; i++) OOM_CHECKF(!outs[i], "a failed split/chunk left piece %d", i);
    for (int i = 0; i < 8; i++) lpx_tensor_release(outs[i]);
    return st;
}
static lpx_status c_f8_split(int a) { (void)a; return split_kind(Q8X, false); }
static lpx_status c_f8_chunk(int a) { (void)a; return split_kind(Q8WR, true); }

static lpx_status c_f8_copy_(int attempt)
{
    (void)attempt;
    lpx_tensor *dst = NULL;
    OOM_SETUP(lpx_float8_quantize(XF, NULL, &dst, NULL));
    lpx_tensor *src = oom_randn2(64, 96, 99, LPX_BF16);
    lpx_status st = OOM(lpx_copy_(dst, src));
    lpx_tensor_release(src);
    lpx_tensor_release(dst);
    return st;
}

/* an op with no float8 handler, through the dequantizing fallback (on
 * from here to oom_kinds_fini: toggling retires an entry each time) */
static lpx_status c_f8_fallback_add(int attempt)
{
    (void)attempt;
    if (!lpx_float8_fallback_enabled()) OOM_SETUP(lpx_float8_set_fallback(true));
    lpx_tensor *o = NULL;
    lpx_status st = OOM(lpx_add(Q8X, XF, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    return st;
}

/* ---- nf4 ------------------------------------------------------------------------ */

static lpx_status c_nf4_config_check(int a)
{
    (void)a;
    lpx_nf4_config c = lpx_nf4_config_default();
    c.pad = false;
    return OOM(lpx_nf4_config_check(&c, 64 * 256 * 3));
}

static lpx_status c_nf4_bytes(int a)
{
    (void)a;
    int64_t shape[2] = {4096, 4096}, bytes = 0;
    lpx_status st = OOM(lpx_nf4_bytes(2, shape, NULL, &bytes));
    OOM_CHECK(st || bytes == 8654852);
    return st;
}

static lpx_status c_nf4_quantize(int attempt)
{
    (void)attempt;
    lpx_tensor *x = oom_randn2(37, 29, 31, LPX_BF16), *xt = NULL, *q = NULL;   /* padded tail, strided */
    OOM_SETUP(lpx_t(x, &xt));
    lpx_nf4_config c = lpx_nf4_config_default();
    c.block = 32;
    c.scaler_block = 4;
    lpx_status st = OOM(lpx_nf4_quantize(xt, &c, &q));
    OOM_OUT_NULL(st, q);
    lpx_tensor_release(q);
    lpx_tensor_release(xt);
    lpx_tensor_release(x);
    return st;
}

OUT_CASE(c_nf4_dequantize, lpx_nf4_dequantize(Q4, -1, &o))

static lpx_status c_nf4_dequantize_rows(int attempt)
{
    (void)attempt;
    lpx_tensor *r = NULL;
    lpx_status st = OOM(lpx_nf4_dequantize_rows(Q4, 3, 70, LPX_F32, NULL, &r));
    OOM_OUT_NULL(st, r);
    lpx_tensor_release(r);
    return st;
}

static lpx_status c_nf4_dequantize_rows_out(int attempt)
{
    (void)attempt;
    int64_t n = 10 * 96;
    lpx_tensor *scratch = NULL, *r = NULL;
    OOM_SETUP(lpx_empty(1, &n, LPX_BF16, lpx_cpu(), &scratch));
    lpx_status st = OOM(lpx_nf4_dequantize_rows(Q4, 100, 10, LPX_BF16, scratch, &r));
    OOM_OUT_NULL(st, r);
    OOM_CHECK(st || r == scratch);
    lpx_tensor_release(r);
    lpx_tensor_release(scratch);
    return st;
}

static lpx_status c_nf4_get_info(int a)
{
    (void)a;
    lpx_nf4_info info;
    return OOM(lpx_nf4_get_info(Q4, &info));
}

OUT_CASE(c_nf4_linear, lpx_nf4_linear(XN, Q4, NULL, &o))
OUT_CASE(c_nf4_linear_backward, lpx_nf4_linear_backward(GN, Q4, &o))

static lpx_status c_qlora(int attempt)
{
    (void)attempt;
    lpx_qlora_opts opts = lpx_qlora_opts_default();
    opts.dropout = 0.25;
    opts.seed = 7;
    lpx_tensor *out = NULL, *xa = NULL, *bias = oom_randn1(128, 5, LPX_F32);
    lpx_status st = OOM(lpx_qlora_linear(XN, Q4, bias, AN, BN, &opts, &out, &xa));
    OOM_OUT_NULL(st, out);
    OOM_OUT_NULL(st, xa);
    lpx_tensor_release(out);
    lpx_tensor_release(xa);
    lpx_tensor_release(bias);
    return st;
}

static lpx_status c_qlora_backward(int attempt)
{
    (void)attempt;
    lpx_qlora_opts opts = lpx_qlora_opts_default();
    opts.dropout = 0.25;
    opts.seed = 7;
    lpx_tensor *gx = NULL, *ga = NULL, *gb = NULL;
    lpx_status st = OOM(lpx_qlora_linear_backward(GN, XN, Q4, AN, BN, NULL, &opts, &gx, &ga, &gb));
    OOM_CHECK(!st || (!gx && !ga && !gb));
    lpx_tensor_release(gx);
    lpx_tensor_release(ga);
    lpx_tensor_release(gb);
    return st;
}

/* typed ops on nf4 tensors */
static const int64_t V4[3] = {2, 64, 96}, R4[2] = {96, 128};
OUT_CASE(c_nf4_op_linear, lpx_linear(XN, Q4, NULL, &o))
OUT_CASE(c_nf4_op_t, lpx_t(Q4, &o))
OUT_CASE(c_nf4_op_view, lpx_view(Q4, 3, V4, &o))
OUT_CASE(c_nf4_op_reshape, lpx_reshape(Q4, 2, R4, &o))
OUT_CASE(c_nf4_op_cast, lpx_cast(Q4, LPX_F16, false, &o))
OUT_CASE(c_nf4_op_clone, lpx_clone(Q4, &o))
OUT_CASE(c_nf4_op_detach, lpx_detach(Q4, &o))
OUT_CASE(c_nf4_op_narrow, lpx_narrow(Q4S, 0, 5, 50, &o))
OUT_CASE(c_nf4_op_slice, lpx_slice(Q4S, 0, 3, 100, 1, &o))

static lpx_status c_nf4_op_matmul(int attempt)
{
    (void)attempt;
    lpx_tensor *wt = NULL, *o = NULL;
    OOM_SETUP(lpx_t(Q4, &wt));   /* [96, 128] */
    lpx_status st = OOM(lpx_matmul(XN, wt, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(wt);
    return st;
}

static lpx_status c_nf4_op_split(int a) { (void)a; return split_kind(Q4S, false); }

static lpx_status c_nf4_op_copy_(int attempt)
{
    (void)attempt;
    lpx_tensor *dst = NULL;
    OOM_SETUP(lpx_nf4_quantize(WN, NULL, &dst));
    lpx_tensor *src = oom_randn2(128, 96, 98, LPX_F32);
    lpx_status st = OOM(lpx_copy_(dst, src));
    lpx_tensor_release(src);
    lpx_tensor_release(dst);
    return st;
}

static lpx_status c_nf4_fallback_mul(int attempt)
{
    (void)attempt;
    lpx_nf4_set_fallback(true);
    lpx_tensor *o = NULL, *d = oom_randn2(128, 96, 97, LPX_BF16);
    lpx_status st = OOM(lpx_mul(Q4, d, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(d);
    lpx_nf4_set_fallback(false);
    return st;
}

const oom_case oom_cases_kinds[] = {
    {"lpx_float8_delayed_new", NULL, c_delayed_new, 0},
    {"lpx_float8_delayed_update", NULL, c_delayed_update, 0},
    {"lpx_float8_delayed_get_config", NULL, c_delayed_get_config, 0},
    {"lpx_float8_delayed_save", NULL, c_delayed_save, 0},
    {"lpx_float8_delayed_load", NULL, c_delayed_load, 0},
    {"lpx_float8_quantize", "dynamic tensorwise", c_f8_quantize, 0},
    {"lpx_float8_quantize", "rowwise e5m2 pow2", c_f8_quantize_rowwise, 0},
    {"lpx_float8_quantize", "static, f16", c_f8_quantize_static, 0},
    {"lpx_float8_quantize", "delayed", c_f8_quantize_delayed, 0},
    {"lpx_float8_from_data", NULL, c_f8_from_data, 0},
    {"lpx_float8_get_info", NULL, c_f8_get_info, 0},
    {"lpx_float8_dequantize", NULL, c_f8_dequantize, 0},
    {"lpx_float8_dequantize", "rowwise to f16", c_f8_dequantize_rowwise, 0},
    {"lpx_float8_mm", "rowwise x columnwise", c_f8_mm, 0},
    {"lpx_float8_set_fallback", NULL, c_f8_set_fallback, OOM_PERSISTENT},
    {"lpx_fp8_quantize", "axiswise e5m2", c_fp8_quantize, 0},
    {"lpx_fp8_quantize_t", "tensorwise and axiswise", c_fp8_quantize_t, 0},
    {"lpx_fp8_dequantize", NULL, c_fp8_dequantize, 0},
    {"lpx_fp8_quantize_block", NULL, c_fp8_quantize_block, 0},
    {"lpx_float8_quantize", "blockwise", c_f8_quantize_block, 0},
    {"lpx_fp8_dequantize_block", NULL, c_fp8_block_dequantize_mm, 0},
    {"lpx_fp8_mm_block", NULL, c_fp8_mm_block, 0},
    {"lpx_fp8_scaled_mm", NULL, c_fp8_scaled_mm, 0},
    {"lpx_fp8_scaled_mm_ex", "fast_accum", c_fp8_scaled_mm_ex, 0},
    {"lpx_fp8_scale_from_amax", NULL, c_fp8_scale_from_amax, 0},
    {"lpx_float8_linear_recipe_preset", NULL, c_recipe_preset, 0},
    {"lpx_float8_linear_state_init", "delayed", c_state_init, 0},
    {"lpx_float8_linear_forward", "tensorwise", c_lin_fwd_tw, 0},
    {"lpx_float8_linear_forward", "rowwise", c_lin_fwd_rw, 0},
    {"lpx_float8_linear_forward", "delayed", c_lin_fwd_delayed, 0},
    {"lpx_float8_linear_forward", "float8 operands", c_lin_fwd_fp8in, 0},
    {"lpx_float8_linear_forward", "fake quant", c_lin_fwd_fakequant, 0},
    {"lpx_float8_linear_backward", "tensorwise", c_lin_bwd_tw, 0},
    {"lpx_float8_linear_backward", "rowwise_with_gw_hp", c_lin_bwd_rwhp, 0},
    {"lpx_float8_linear_backward", "delayed", c_lin_bwd_delayed, 0},
    {"lpx_linear", "float8 x float8", c_f8_linear, 0},
    {"lpx_matmul", "float8 x float8", c_f8_matmul_t, 0},
    {"lpx_matmul", "float8 rowwise x columnwise", c_f8_matmul_rw, 0},
    {"lpx_addmm", "float8", c_f8_addmm, 0},
    {"lpx_t", "float8", c_f8_t, 0},
    {"lpx_transpose", "float8 rowwise", c_f8_transpose, 0},
    {"lpx_view", "float8", c_f8_view, 0},
    {"lpx_reshape", "float8", c_f8_reshape, 0},
    {"lpx_slice", "float8 rowwise", c_f8_slice, 0},
    {"lpx_narrow", "float8", c_f8_narrow, 0},
    {"lpx_split", "float8", c_f8_split, 0},
    {"lpx_chunk", "float8 rowwise", c_f8_chunk, 0},
    {"lpx_cast", "float8 (dequantize)", c_f8_cast, 0},
    {"lpx_contiguous", "float8", c_f8_contiguous, 0},
    {"lpx_clone", "float8 rowwise", c_f8_clone, 0},
    {"lpx_detach", "float8", c_f8_detach, 0},
    {"lpx_copy_", "bf16 into float8 (requantize)", c_f8_copy_, 0},
    {"lpx_add", "float8 through the fallback", c_f8_fallback_add, 0},
    {"lpx_nf4_config_check", NULL, c_nf4_config_check, 0},
    {"lpx_nf4_bytes", NULL, c_nf4_bytes, 0},
    {"lpx_nf4_quantize", "strided, padded", c_nf4_quantize, 0},
    {"lpx_nf4_dequantize", NULL, c_nf4_dequantize, 0},
    {"lpx_nf4_dequantize_rows", NULL, c_nf4_dequantize_rows, 0},
    {"lpx_nf4_dequantize_rows", "into scratch", c_nf4_dequantize_rows_out, 0},
    {"lpx_nf4_get_info", NULL, c_nf4_get_info, 0},
    {"lpx_nf4_linear", NULL, c_nf4_linear, 0},
    {"lpx_nf4_linear_backward", NULL, c_nf4_linear_backward, 0},
    {"lpx_qlora_linear", "dropout, bias, saved xa", c_qlora, 0},
    {"lpx_qlora_linear_backward", "dropout", c_qlora_backward, 0},
    {"lpx_linear", "nf4 weight", c_nf4_op_linear, 0},
    {"lpx_matmul", "nf4 transposed", c_nf4_op_matmul, 0},
    {"lpx_t", "nf4", c_nf4_op_t, 0},
    {"lpx_view", "nf4", c_nf4_op_view, 0},
    {"lpx_reshape", "nf4", c_nf4_op_reshape, 0},
    {"lpx_narrow", "nf4", c_nf4_op_narrow, 0},
    {"lpx_slice", "nf4", c_nf4_op_slice, 0},
    {"lpx_split", "nf4", c_nf4_op_split, 0},
    {"lpx_cast", "nf4 (dequantize)", c_nf4_op_cast, 0},
    {"lpx_clone", "nf4", c_nf4_op_clone, 0},
    {"lpx_detach", "nf4", c_nf4_op_detach, 0},
    {"lpx_copy_", "f32 into nf4 (quantize)", c_nf4_op_copy_, 0},
    {"lpx_mul", "nf4 through the fallback", c_nf4_fallback_mul, 0},
    {NULL, NULL, NULL, 0},
};
