/* OOM sweep cases (tests/oom.h): every typed dense op of ops.h, on inputs
 * that take the allocating paths (strided operands that need contiguous
 * copies, broadcasting, mixed dtypes, batched GEMMs). The kind variants of
 * the same ops are in tests/oom_kinds.c. */
#include "oom.h"

/* fixtures, made once (hook disarmed) and only read by the cases */
static lpx_tensor *X, *XT, *Y16, *ROW, *W, *BIAS, *M2, *BA, *BB, *POS, *IDX, *WEMB, *GEMB, *TGT, *G, *RSTD, *SM,
    *NW, *X3, *SC, *AQ, *AK, *AG, *AO, *ALSE, *FREQ;

lpx_status oom_ops_init(void)
{
    lpx_status st = LPX_OK;
    lpx_tensor *xt0 = NULL;
    X = oom_randn2(17, 33, 1, LPX_F32);
    xt0 = oom_randn2(33, 17, 2, LPX_F32);
    if (!X || !xt0) return LPX_EINVAL;
    if ((st = lpx_t(xt0, &XT))) return st;   /* [17, 33], strides (1, 17) */
    lpx_tensor_release(xt0);
    Y16 = oom_randn2(17, 33, 3, LPX_F16);
    ROW = oom_randn2(1, 33, 4, LPX_F32);
    W = oom_randn2(9, 33, 5, LPX_BF16);
    BIAS = oom_randn1(9, 6, LPX_F32);
    M2 = oom_randn2(33, 9, 7, LPX_F32);
    G = oom_randn2(17, 33, 8, LPX_F32);
    NW = oom_randn1(33, 9, LPX_F32);
    SC = oom_randn2(17, 9, 10, LPX_F32);
    int64_t b3[3] = {2, 5, 7}, b3b[3] = {2, 7, 3}, x3[3] = {3, 4, 5};
    if ((st = lpx_randn(3, b3, 11, LPX_F32, lpx_cpu(), &BA)) || (st = lpx_randn(3, b3b, 12, LPX_BF16, lpx_cpu(), &BB)) ||
        (st = lpx_randn(3, x3, 13, LPX_F32, lpx_cpu(), &X3)))
        return st;
    if ((st = lpx_abs(X, &POS))) return st;
    int64_t ni = 6, nt = 17;
    if ((st = lpx_tensor_new(LPX_I64, 1, &ni, lpx_cpu(), &IDX)) || (st = lpx_tensor_new(LPX_I32, 1, &nt, lpx_cpu(), &TGT)))
        return st;
    for (int i = 0; i < 6; i++) ((int64_t *)lpx_tensor_data(IDX))[i] = (i * 5) % 9;
    for (int i = 0; i < 17; i++) ((int32_t *)lpx_tensor_data(TGT))[i] = i == 3 ? -100 : (i * 7) % 33;
    WEMB = oom_randn2(9, 8, 14, LPX_F32);
    GEMB = oom_randn2(6, 8, 15, LPX_F32);
    lpx_tensor *y = NULL;
    if ((st = lpx_rmsnorm(X, NW, 1e-6, &y, &RSTD))) return st;
    lpx_tensor_release(y);
    if ((st = lpx_softmax(X, -1, &SM))) return st;
    /* attention: bf16 q strided (a transposed view), GQA with 2 k/v heads */
    int64_t aq[4] = {2, 4, 3, 8}, ak[4] = {2, 5, 2, 8}, nf = 4;
    lpx_tensor *aq0 = NULL;
    if ((st = lpx_randn(4, aq, 16, LPX_BF16, lpx_cpu(), &aq0)) || (st = lpx_transpose(aq0, 1, 2, &AQ)) ||
        (st = lpx_randn(4, ak, 17, LPX_BF16, lpx_cpu(), &AK)) || (st = lpx_randn(1, &nf, 18, LPX_F32, lpx_cpu(), &FREQ)))
        return st;
    lpx_tensor_release(aq0);
    if ((st = lpx_attention(AQ, AK, AK, false, 0.35, &AO, &ALSE)) || (st = lpx_randn(4, lpx_tensor_shape(AO), 19, LPX_BF16, lpx_cpu(), &AG)))
        return st;
    return !Y16 || !ROW || !W || !BIAS || !M2 || !G || !NW || !SC || !WEMB || !GEMB ? LPX_EINVAL : LPX_OK;
}

void oom_ops_fini(void)
{
    lpx_tensor **all[] = {&X, &XT, &Y16, &ROW, &W, &BIAS, &M2, &BA, &BB, &POS, &IDX, &WEMB, &GEMB, &TGT, &G, &RSTD,
                          &SM, &NW, &X3, &SC, &AQ, &AK, &AG, &AO, &ALSE, &FREQ};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        lpx_tensor_release(*all[i]);
        *all[i] = NULL;
    }
}

/* a case calling `call`, which writes one new tensor into `o` */
#define OUT_CASE(cname, call)                       \
    static lpx_status cname(int attempt)            \
    {                                               \
        (void)attempt;                              \
        lpx_tensor *o = NULL;                       \
        lpx_status st = OOM(call);                  \
        OOM_OUT_NULL(st, o);                        \
        lpx_tensor_release(o);                      \
        return st;                                  \
    }

/* a case writing into a fresh destination `d` (dtype, like the shape of ref) */
#define INTO_CASE(cname, ref, dtype, call)                                                     \
    static lpx_status cname(int attempt)                                                       \
    {                                                                                          \
        (void)attempt;                                                                         \
        lpx_tensor *d = NULL;                                                                  \
        OOM_SETUP(lpx_zeros(lpx_tensor_ndim(ref), lpx_tensor_shape(ref), dtype, lpx_cpu(), &d)); \
        lpx_status st = OOM(call);                                                             \
        lpx_tensor_release(d);                                                                 \
        return st;                                                                             \
    }

static const int64_t SHAPE2[2] = {17, 33}, SHAPE_V[3] = {17, 3, 11}, SHAPE_E[3] = {2, 17, 33}, PERM[3] = {2, 0, 1},
                     DIMS1[1] = {1}, DIMS01[2] = {0, 1}, SHAPE_R[2] = {33, 17};

/* creation */
OUT_CASE(c_empty, lpx_empty(2, SHAPE2, LPX_BF16, lpx_cpu(), &o))
OUT_CASE(c_zeros, lpx_zeros(2, SHAPE2, LPX_F16, lpx_cpu(), &o))
OUT_CASE(c_full, lpx_full(2, SHAPE2, 1.5, LPX_F8E4M3FN, lpx_cpu(), &o))
OUT_CASE(c_arange, lpx_arange(-3, 40, 0.5, LPX_F32, lpx_cpu(), &o))
OUT_CASE(c_randn, lpx_randn(2, SHAPE2, 42, LPX_BF16, lpx_cpu(), &o))
OUT_CASE(c_rand, lpx_rand(2, SHAPE2, 42, LPX_F32, lpx_cpu(), &o))
/* views */
OUT_CASE(c_view, lpx_view(X, 3, SHAPE_V, &o))
OUT_CASE(c_reshape, lpx_reshape(XT, 2, SHAPE_R, &o))   /* strided: copies */
OUT_CASE(c_transpose, lpx_transpose(X3, 0, -1, &o))
OUT_CASE(c_t, lpx_t(X, &o))
OUT_CASE(c_permute, lpx_permute(X3, 3, PERM, &o))
OUT_CASE(c_slice, lpx_slice(XT, 1, 2, -3, 3, &o))
OUT_CASE(c_narrow, lpx_narrow(X, 0, 4, 9, &o))
OUT_CASE(c_expand, lpx_expand(ROW, 3, SHAPE_E, &o))
OUT_CASE(c_contiguous, lpx_contiguous(XT, &o))
OUT_CASE(c_clone, lpx_clone(XT, &o))
OUT_CASE(c_detach, lpx_detach(X, &o))

static lpx_status c_cat(int attempt)
{
    (void)attempt;
    lpx_tensor *xs[3] = {X, XT, ROW}, *o = NULL;
    lpx_status st = OOM(lpx_cat(xs, 3, 0, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    return st;
}

static lpx_status pieces(bool chunk)
{
    lpx_tensor *outs[8] = {0};
    int n = -1;
    lpx_status st = chunk ? OOM(lpx_chunk(XT, 4, 0, outs, 8, &n)) : OOM(lpx_split(X, 5, 1, outs, 8, &n));
    if (st)
        for (int i = 0; i < 8; i++) OOM_CHECKF(!outs[i], "a failed %s left piece %d", chunk ? "chunk" : "split", i);
    for (int i = 0; i < 8; i++) lpx_tensor_release(outs[i]);
    return st;
}
static lpx_status c_split(int a) { (void)a; return pieces(false); }
static lpx_status c_chunk(int a) { (void)a; return pieces(true); }

/* elementwise */
OUT_CASE(c_add, lpx_add(XT, Y16, &o))
OUT_CASE(c_sub, lpx_sub(X, ROW, &o))
OUT_CASE(c_mul, lpx_mul(Y16, XT, &o))
OUT_CASE(c_div, lpx_div(XT, ROW, &o))
INTO_CASE(c_add_out, X, LPX_F16, lpx_add_out(Y16, XT, d))
INTO_CASE(c_sub_out, X, LPX_F32, lpx_sub_out(XT, ROW, d))
INTO_CASE(c_mul_out, X, LPX_F32, lpx_mul_out(X, XT, d))
INTO_CASE(c_div_out, X, LPX_F32, lpx_div_out(ROW, XT, d))
OUT_CASE(c_add_scalar, lpx_add_scalar(XT, 2.5, &o))
OUT_CASE(c_mul_scalar, lpx_mul_scalar(Y16, -3.0, &o))
OUT_CASE(c_neg, lpx_neg(XT, &o))
OUT_CASE(c_abs, lpx_abs(XT, &o))
OUT_CASE(c_sqrt, lpx_sqrt(POS, &o))
OUT_CASE(c_exp, lpx_exp(XT, &o))
OUT_CASE(c_relu, lpx_relu(XT, &o))
OUT_CASE(c_silu, lpx_silu(Y16, &o))
OUT_CASE(c_gelu, lpx_gelu(XT, &o))
OUT_CASE(c_relu_backward, lpx_relu_backward(G, XT, &o))
OUT_CASE(c_silu_backward, lpx_silu_backward(G, XT, &o))
OUT_CASE(c_gelu_backward, lpx_gelu_backward(G, XT, &o))
OUT_CASE(c_swiglu, lpx_swiglu(Y16, XT, &o))
INTO_CASE(c_swiglu_out, X, LPX_F32, lpx_swiglu_out(XT, ROW, d))

/* two results: grad_gate (f32, strided gate) and grad_up (f16) */
static lpx_status c_swiglu_backward(int attempt)
{
    (void)attempt;
    lpx_tensor *dg = NULL, *du = NULL;
    lpx_status st = OOM(lpx_swiglu_backward(G, XT, Y16, &dg, &du));
    OOM_OUT_NULL(st, dg);
    OOM_OUT_NULL(st, du);
    lpx_tensor_release(dg);
    lpx_tensor_release(du);
    return st;
}
OUT_CASE(c_cast, lpx_cast(XT, LPX_F8E5M2, true, &o))
INTO_CASE(c_copy_, X, LPX_F16, lpx_copy_(d, XT))
INTO_CASE(c_fill_, X, LPX_BF16, lpx_fill_(d, 3.25))

/* reductions */
OUT_CASE(c_sum, lpx_sum(XT, 1, DIMS1, true, &o))
OUT_CASE(c_mean, lpx_mean(Y16, 0, NULL, false, &o))
OUT_CASE(c_max, lpx_max(XT, 2, DIMS01, false, &o))
OUT_CASE(c_amax, lpx_amax(XT, 1, DIMS1, false, &o))
OUT_CASE(c_norm, lpx_norm(X3, 1, DIMS1, true, &o))

/* linear algebra */
OUT_CASE(c_matmul, lpx_matmul(XT, M2, &o))
OUT_CASE(c_matmul_batched, lpx_matmul(BA, BB, &o))
INTO_CASE(c_matmul_out, SC, LPX_F32, lpx_matmul_out(XT, M2, d))
OUT_CASE(c_linear, lpx_linear(XT, W, BIAS, &o))
OUT_CASE(c_addmm, lpx_addmm(BIAS, XT, M2, 0.5, 2.0, &o))

/* nn */
static lpx_status c_rmsnorm(int attempt)
{
    (void)attempt;
    lpx_tensor *y = NULL, *r = NULL;
    lpx_status st = OOM(lpx_rmsnorm(XT, NW, 1e-5, &y, &r));
    OOM_OUT_NULL(st, y);
    OOM_OUT_NULL(st, r);
    lpx_tensor_release(y);
    lpx_tensor_release(r);
    return st;
}

static lpx_status c_rmsnorm_backward(int attempt)
{
    (void)attempt;
    lpx_tensor *gx = NULL, *gw = NULL;
    lpx_status st = OOM(lpx_rmsnorm_backward(G, X, NW, RSTD, &gx, &gw));
    OOM_OUT_NULL(st, gx);
    OOM_OUT_NULL(st, gw);
    lpx_tensor_release(gx);
    lpx_tensor_release(gw);
    return st;
}

OUT_CASE(c_softmax, lpx_softmax(XT, 0, &o))
OUT_CASE(c_softmax_backward, lpx_softmax_backward(G, SM, -1, &o))
OUT_CASE(c_cross_entropy, lpx_cross_entropy(XT, TGT, -100, &o))
OUT_CASE(c_cross_entropy_backward, lpx_cross_entropy_backward(XT, TGT, -100, 0.5, &o))
OUT_CASE(c_mse_loss, lpx_mse_loss(XT, G, &o))
OUT_CASE(c_mse_loss_backward, lpx_mse_loss_backward(XT, Y16, 2.0, &o))
OUT_CASE(c_embedding, lpx_embedding(WEMB, IDX, &o))
OUT_CASE(c_embedding_backward, lpx_embedding_backward(GEMB, IDX, 9, &o))
OUT_CASE(c_rope, lpx_rope(AQ, FREQ, 3, &o))
OUT_CASE(c_rope_backward, lpx_rope_backward(AQ, FREQ, 0, &o))

static lpx_status c_attention(int attempt)
{
    (void)attempt;
    lpx_tensor *y = NULL, *l = NULL;
    lpx_status st = OOM(lpx_attention(AQ, AK, AK, false, 0.35, &y, &l));
    OOM_OUT_NULL(st, y);
    OOM_OUT_NULL(st, l);
    lpx_tensor_release(y);
    lpx_tensor_release(l);
    return st;
}

static lpx_status c_attention_backward(int attempt)
{
    (void)attempt;
    lpx_tensor *a = NULL, *b = NULL, *c = NULL;
    lpx_status st = OOM(lpx_attention_backward(AG, AQ, AK, AK, AO, ALSE, false, 0.35, &a, &b, &c));
    OOM_OUT_NULL(st, a);
    OOM_OUT_NULL(st, b);
    OOM_OUT_NULL(st, c);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
    return st;
}

/* optimizers: one fused AdamW step over two parameters (in place) */
static lpx_status c_adamw_(int attempt)
{
    (void)attempt;
    lpx_tensor *p[2] = {oom_randn2(5, 7, 1, LPX_BF16), oom_randn1(9, 2, LPX_F32)};
    lpx_tensor *g[2] = {oom_randn2(5, 7, 3, LPX_F32), oom_randn1(9, 4, LPX_F16)};
    lpx_tensor *m[2] = {0}, *v[2] = {0};
    int64_t n0 = 35, n1 = 9;
    OOM_SETUP(lpx_zeros(1, &n0, LPX_F32, lpx_cpu(), &m[0]));
    OOM_SETUP(lpx_zeros(1, &n1, LPX_F32, lpx_cpu(), &m[1]));
    OOM_SETUP(lpx_zeros(1, &n0, LPX_F32, lpx_cpu(), &v[0]));
    OOM_SETUP(lpx_zeros(1, &n1, LPX_F32, lpx_cpu(), &v[1]));
    lpx_status st = OOM(lpx_adamw_(p, g, m, v, 2, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1));
    for (int i = 0; i < 2; i++) {
        lpx_tensor_release(p[i]);
        lpx_tensor_release(g[i]);
        lpx_tensor_release(m[i]);
        lpx_tensor_release(v[i]);
    }
    return st;
}

static lpx_status c_item(int attempt)
{
    (void)attempt;
    double v = 0;
    return OOM(lpx_item(XT, 40, &v));
}

const oom_case oom_cases_ops[] = {
    {"lpx_empty", NULL, c_empty, 0},
    {"lpx_zeros", NULL, c_zeros, 0},
    {"lpx_full", "f8e4m3fn", c_full, 0},
    {"lpx_arange", NULL, c_arange, 0},
    {"lpx_randn", NULL, c_randn, 0},
    {"lpx_rand", NULL, c_rand, 0},
    {"lpx_view", NULL, c_view, 0},
    {"lpx_reshape", "strided: copies", c_reshape, 0},
    {"lpx_transpose", NULL, c_transpose, 0},
    {"lpx_t", NULL, c_t, 0},
    {"lpx_permute", NULL, c_permute, 0},
    {"lpx_slice", "strided", c_slice, 0},
    {"lpx_narrow", NULL, c_narrow, 0},
    {"lpx_expand", NULL, c_expand, 0},
    {"lpx_contiguous", "strided", c_contiguous, 0},
    {"lpx_cat", "mixed layouts", c_cat, 0},
    {"lpx_clone", "strided", c_clone, 0},
    {"lpx_detach", NULL, c_detach, 0},
    {"lpx_split", NULL, c_split, 0},
    {"lpx_chunk", "strided", c_chunk, 0},
    {"lpx_add", "strided + f16", c_add, 0},
    {"lpx_sub", "broadcast", c_sub, 0},
    {"lpx_mul", "f16 * strided", c_mul, 0},
    {"lpx_div", "broadcast", c_div, 0},
    {"lpx_add_out", "f16 + strided f32", c_add_out, 0},
    {"lpx_sub_out", NULL, c_sub_out, 0},
    {"lpx_mul_out", "strided", c_mul_out, 0},
    {"lpx_div_out", "broadcast", c_div_out, 0},
    {"lpx_add_scalar", NULL, c_add_scalar, 0},
    {"lpx_mul_scalar", NULL, c_mul_scalar, 0},
    {"lpx_neg", NULL, c_neg, 0},
    {"lpx_abs", NULL, c_abs, 0},
    {"lpx_sqrt", NULL, c_sqrt, 0},
    {"lpx_exp", NULL, c_exp, 0},
    {"lpx_relu", NULL, c_relu, 0},
    {"lpx_silu", NULL, c_silu, 0},
    {"lpx_gelu", NULL, c_gelu, 0},
    {"lpx_relu_backward", NULL, c_relu_backward, 0},
    {"lpx_silu_backward", NULL, c_silu_backward, 0},
    {"lpx_gelu_backward", NULL, c_gelu_backward, 0},
    {"lpx_swiglu", "f16 gate, strided up", c_swiglu, 0},
    {"lpx_swiglu_out", "strided, broadcast", c_swiglu_out, 0},
    {"lpx_swiglu_backward", "strided gate, f16 up", c_swiglu_backward, 0},
    {"lpx_cast", "f8e5m2, saturating", c_cast, 0},
    {"lpx_copy_", "strided into f16", c_copy_, 0},
    {"lpx_fill_", NULL, c_fill_, 0},
    {"lpx_sum", NULL, c_sum, 0},
    {"lpx_mean", NULL, c_mean, 0},
    {"lpx_max", NULL, c_max, 0},
    {"lpx_amax", NULL, c_amax, 0},
    {"lpx_norm", NULL, c_norm, 0},
    {"lpx_matmul", "strided", c_matmul, 0},
    {"lpx_matmul", "batched, bf16", c_matmul_batched, 0},
    {"lpx_matmul_out", NULL, c_matmul_out, 0},
    {"lpx_linear", "bf16 weight, bias", c_linear, 0},
    {"lpx_addmm", NULL, c_addmm, 0},
    {"lpx_rmsnorm", NULL, c_rmsnorm, 0},
    {"lpx_rmsnorm_backward", NULL, c_rmsnorm_backward, 0},
    {"lpx_softmax", NULL, c_softmax, 0},
    {"lpx_softmax_backward", NULL, c_softmax_backward, 0},
    {"lpx_cross_entropy", NULL, c_cross_entropy, 0},
    {"lpx_cross_entropy_backward", NULL, c_cross_entropy_backward, 0},
    {"lpx_mse_loss", NULL, c_mse_loss, 0},
    {"lpx_mse_loss_backward", NULL, c_mse_loss_backward, 0},
    {"lpx_embedding", NULL, c_embedding, 0},
    {"lpx_embedding_backward", NULL, c_embedding_backward, 0},
    {"lpx_rope", "bf16, strided", c_rope, 0},
    {"lpx_rope_backward", NULL, c_rope_backward, 0},
    {"lpx_attention", "bf16, GQA, strided q", c_attention, 0},
    {"lpx_attention_backward", NULL, c_attention_backward, 0},
    {"lpx_adamw_", "two params, bf16 and f32", c_adamw_, 0},
    {"lpx_item", NULL, c_item, 0},
    {NULL, NULL, NULL, 0},
};
