/* The op spec of the elementwise group (include/lpx/op_args_elementwise.h,
 * dispatch/spec_elementwise.c): the unary and scalar ops (family `unary`),
 * cast, copy_, fill_ (families `cast`, `copy`, `fill`) and the reductions
 * (family `reduce`). Every check of their contract is made by the
 * dispatcher: a backend whose kernels check nothing (tests/spec_harness.h)
 * refuses each bad argument set below exactly as the CPU does, with the
 * message the CPU kernels wrote before the spec (pinned here); good
 * argument sets reach its kernel, with the normalised arguments. */
#include <math.h>
#include "spec_harness.h"

/* ---- plugin dtypes: a packed one and a byte-sized one in groups ---- */

static void u4_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)((s[i / 2] >> (i % 2 ? 0 : 4)) & 15);
}

static void u4_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    (void)flags;
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        unsigned q = src[i] > 0 && src[i] <= 15 ? (unsigned)src[i] : 0;
        if (i % 2 == 0) d[i / 2] = (uint8_t)(q << 4);
        else d[i / 2] |= (uint8_t)q;
    }
}

static void g8_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
}

static void g8_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    (void)flags;
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(src[i] > 0 && src[i] < 256 ? src[i] : 0);
}

static lpx_dtype du4 = -1, dg8 = -1;   /* 4 bits, block 2; 8 bits, block 4 */

static void setup(void)
{
    CHECK(spec_setup() >= 28);   /* the core families' 11 and this group's 17 */
    static const lpx_dtype_traits u4 = {.struct_size = sizeof u4, .name = "spec_ew_u4", .bits = 4, .block = 2,
                                        .max = 15, .to_f32 = u4_to_f32, .from_f32 = u4_from_f32};
    static const lpx_dtype_traits g8 = {.struct_size = sizeof g8, .name = "spec_ew_g8", .bits = 8, .block = 4,
                                        .max = 255, .to_f32 = g8_to_f32, .from_f32 = g8_from_f32};
    CHECK_OK(lpx_dtype_register(&u4, &du4));
    CHECK_OK(lpx_dtype_register(&g8, &dg8));
}

/* ---- bad arguments, built alike on the CPU and the check-free device - */

static const bad_case bad[] = {
    /* unary: out's shape and dtype (the binary family's out rule) */
    {"neg", 2, {T(LPX_F32, 1, 4), T(LPX_F32, 0)}, LPX_ESHAPE, "neg: out has shape [], the result needs [4]"},
    {"abs", 2, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 3, 2)}, LPX_ESHAPE, "abs: out has shape [3, 2], the result needs [2, 3]"},
    {"sqrt", 2, {T(LPX_F32, 2, 2, 3), T(LPX_F16, 2, 2, 3)}, LPX_EDTYPE, "sqrt: out has dtype f16, the result is f32"},
    {"exp", 2, {T(LPX_BF16, 1, 5), T(LPX_F32, 1, 5)}, LPX_EDTYPE, "exp: out has dtype f32, the result is bf16"},
    {"relu", 2, {T(LPX_F32, 1, 5), T(LPX_F32, 1, 6)}, LPX_ESHAPE, "relu: out has shape [6], the result needs [5]"},
    {"silu", 2, {T(LPX_F16, 2, 1, 5), T(LPX_F16, 1, 5)}, LPX_ESHAPE, "silu: out has shape [5], the result needs [1, 5]"},
    {"gelu", 2, {T(LPX_F32, 1, 5), T(LPX_I32, 1, 5)}, LPX_EDTYPE, "gelu: out has dtype i32, the result is f32"},
    {"add_scalar", 3, {T(LPX_I64, 1, 3), F(1.5), T(LPX_F32, 1, 3)}, LPX_EDTYPE,
     "add_scalar: out has dtype f32, the result is i64"},
    {"mul_scalar", 3, {T(LPX_F32, 2, 2, 2), F(2.0), T(LPX_F32, 1, 4)}, LPX_ESHAPE,
     "mul_scalar: out has shape [4], the result needs [2, 2]"},
    /* reduce: dims out of range, listed twice; no identity over nothing */
    {"sum", 3, {T(LPX_F32, 2, 2, 3), L(1, 2), B(0)}, LPX_ERANGE, "sum: dim 2 out of range for 2 dims"},
    {"mean", 3, {T(LPX_F32, 2, 2, 3), L(2, 0, -3), B(1)}, LPX_ERANGE, "mean: dim -3 out of range for 2 dims"},
    {"norm", 3, {T(LPX_F32, 0), L(1, 1), B(0)}, LPX_ERANGE, "norm: dim 1 out of range for 1 dims"},
    {"max", 3, {T(LPX_F32, 2, 2, 3), L(2, 1, -1), B(0)}, LPX_EINVAL, "max: dims lists dim 1 twice (dims[1] = -1)"},
    {"amax", 3, {T(LPX_F32, 2, 0, 3), L(1, 0), B(0)}, LPX_ESHAPE,
     "amax: x [0, 3]: cannot reduce over zero elements (no identity)"},
    {"max", 3, {T(LPX_BF16, 1, 0), NONE, B(1)}, LPX_ESHAPE, "max: x [0]: cannot reduce over zero elements (no identity)"},
    /* cast: the target dtype */
    {"cast", 3, {T(LPX_F32, 1, 4), D(97), B(0)}, LPX_EDTYPE, "cast: target dtype 97 is not registered"},
    {"cast", 3, {T(LPX_F32, 1, 4), D(-1), B(1)}, LPX_EDTYPE, "cast: target dtype -1 is not registered"},
    /* copy_: src broadcasts to dst */
    {"copy_", 2, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 1, 2)}, LPX_ESHAPE,
     "copy_: src of shape [2] does not broadcast to dst of shape [2, 3]"},
    {"copy_", 2, {T(LPX_F16, 1, 3), T(LPX_F32, 2, 2, 3)}, LPX_ESHAPE,
     "copy_: src of shape [2, 3] does not broadcast to dst of shape [3]"},
};

static void test_refused_by_dispatcher(void) { spec_check_bad(bad, sizeof bad / sizeof *bad); }

/* spec_check_bad for refusals whose message names the backend ("which
 * the cpu kernels do not support"): the check-free backend's message is
 * the CPU's with its own name. */
static void check_bad_keyed(const bad_case *bad, size_t n)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    for (size_t i = 0; i < n; i++) {
        const bad_case *k = &bad[i];
        char cpu_msg[1024], nc_msg[1024], want[1024];
        lpx_status cpu_st = spec_run_case(k, lpx_cpu(), cpu_msg, sizeof cpu_msg);
        int before = reached;
        lpx_status nc_st = spec_run_case(k, nc, nc_msg, sizeof nc_msg);
        CHECKF(cpu_st == k->want && nc_st == cpu_st && reached == before, "case %zu (%s): cpu %d, nochk %d, want %d (%s)",
               i, k->op, cpu_st, nc_st, k->want, nc_msg);
        CHECKF(!strcmp(cpu_msg, k->msg), "case %zu (%s): message '%s', want '%s'", i, k->op, cpu_msg, k->msg);
        const char *at = strstr(k->msg, "the cpu kernels");
        CHECK(at != NULL);
        if (!at) continue;
        snprintf(want, sizeof want, "%.*sthe nochk kernels%s", (int)(at - k->msg), k->msg, at + strlen("the cpu kernels"));
        CHECKF(!strcmp(nc_msg, want), "case %zu (%s): check-free backend '%s', want '%s'", i, k->op, nc_msg, want);
    }
}

/* The plugin dtypes: a packed one is refused as an operand of every
 * family but cast's x; fill_ refuses a dtype encoded in groups. */
static void test_plugin_dtypes(void)
{
    const bad_case k[] = {
        {"neg", 2, {T(du4, 1, 4), NONE}, LPX_EDTYPE, "neg: tensor 'x' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"add_scalar", 3, {T(du4, 1, 4), F(1), NONE}, LPX_EDTYPE,
         "add_scalar: tensor 'a' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"gelu", 2, {T(LPX_F32, 1, 4), T(du4, 1, 4)}, LPX_EDTYPE,
         "gelu: tensor 'out' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"mul_scalar", 3, {T(du4, 1, 4), F(1), T(du4, 1, 4)}, LPX_EDTYPE,
         "mul_scalar: tensor 'a' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"sum", 3, {T(du4, 1, 4), NONE, B(0)}, LPX_EDTYPE,
         "sum: tensor 'x' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"amax", 3, {T(du4, 1, 4), L(1, 5), B(0)}, LPX_EDTYPE,
         "amax: tensor 'x' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"copy_", 2, {T(du4, 1, 4), T(LPX_F32, 1, 4)}, LPX_EDTYPE,
         "copy_: tensor 'dst' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"copy_", 2, {T(LPX_F32, 1, 4), T(du4, 1, 4)}, LPX_EDTYPE,
         "copy_: tensor 'src' has dtype spec_ew_u4, which the cpu kernels do not support"},
        {"fill_", 2, {T(du4, 1, 4), F(1)}, LPX_EDTYPE,
         "fill_: tensor 'dst' has dtype spec_ew_u4, which the cpu kernels do not support"},
    };
    check_bad_keyed(k, sizeof k / sizeof *k);
    const bad_case g[] = {
        {"fill_", 2, {T(dg8, 1, 8), F(1)}, LPX_EDTYPE,
         "fill_: dst has dtype spec_ew_g8, encoded in groups of 4; fill_ writes single elements"},
    };
    spec_check_bad(g, 1);
    /* cast takes a packed x (and target) */
    const bad_case good[] = {
        {"cast", 3, {T(du4, 1, 4), D(LPX_F32), B(0)}, LPX_OK, NULL},
        {"cast", 3, {T(LPX_F32, 1, 4), D(du4), B(1)}, LPX_OK, NULL},
        {"fill_", 2, {T(LPX_U8, 1, 4), F(3)}, LPX_OK, NULL},
    };
    spec_check_good(good, sizeof good / sizeof *good);
}

/* A read-only out / dst (marked after building): refused alike. */
static lpx_status run_ro(const char *opn, int nargs, int ro, lpx_device dev, char *msg, size_t len)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(opn, &op));
    int64_t sh[1] = {4};
    lpx_tensor *a = NULL, *b = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, sh, dev, &a));
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, sh, dev, &b));
    lpx_tensor_mark_readonly(ro == 0 ? a : b);
    lpx_value v[3];
    if (nargs == 3) { /* (a, float s, out) */
        v[0] = lpx_v_tensor(a), v[1] = lpx_v_f64(2), v[2] = lpx_v_tensor(b);
    } else if (!strcmp(opn, "fill_")) {
        v[0] = lpx_v_tensor(a), v[1] = lpx_v_f64(2);
    } else {
        v[0] = lpx_v_tensor(a), v[1] = lpx_v_tensor(b);
    }
    lpx_call c;
    lpx_call_init(&c, op, v, nargs);
    lpx_status st = lpx_dispatch(&c);
    snprintf(msg, len, "%s", st ? lpx_last_error() : "");
    if (!st) lpx_call_release_rets(&c);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    return st;
}

static void test_read_only(void)
{
    static const struct { const char *op; int nargs, ro; const char *msg; } k[] = {
        {"relu", 2, 1, "relu: out is read-only (e.g. a read-only DLPack import)"},
        {"add_scalar", 3, 1, "add_scalar: out is read-only (e.g. a read-only DLPack import)"},
        {"copy_", 2, 0, "copy_: dst is read-only (e.g. a read-only DLPack import)"},
        {"fill_", 2, 0, "fill_: dst is read-only (e.g. a read-only DLPack import)"},
    };
    lpx_device nc = {NOCHK_DEVICE, 0};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char m1[512], m2[512];
        lpx_status s1 = run_ro(k[i].op, k[i].nargs, k[i].ro, lpx_cpu(), m1, sizeof m1);
        int before = reached;
        lpx_status s2 = run_ro(k[i].op, k[i].nargs, k[i].ro, nc, m2, sizeof m2);
        CHECKF(s1 == LPX_EINVAL && s2 == s1 && reached == before, "%s: cpu %d, nochk %d (%s)", k[i].op, s1, s2, m2);
        CHECKF(!strcmp(m1, k[i].msg) && !strcmp(m2, k[i].msg), "%s: '%s' / '%s', want '%s'", k[i].op, m1, m2, k[i].msg);
    }
    /* a read-only x of a unary op is fine: it is only read */
    char m[512];
    int before = reached;
    CHECK(run_ro("neg", 2, 0, nc, m, sizeof m) == LPX_EINTERNAL && reached == before + 1);
}

/* ---- good arguments: the normalised struct ------------------------- */

static const bad_case good[] = {
    {"neg", 2, {T(LPX_F32, 2, 2, 3), NONE}, LPX_OK, NULL},
    {"relu", 2, {T(LPX_BF16, 1, 3), T(LPX_BF16, 1, 3)}, LPX_OK, NULL},
    {"add_scalar", 3, {T(LPX_I32, 0), F(2), NONE}, LPX_OK, NULL},
    {"sum", 3, {T(LPX_F32, 2, 2, 3), NONE, B(0)}, LPX_OK, NULL},
    {"norm", 3, {T(LPX_F32, 0), L(1, -1), B(0)}, LPX_OK, NULL},
    {"mean", 3, {T(LPX_F32, 2, 0, 3), L(1, 0), B(0)}, LPX_OK, NULL},
    {"amax", 3, {T(LPX_F32, 2, 0, 3), L(1, 1), B(0)}, LPX_OK, NULL},   /* zero outputs: nothing to refuse */
    {"cast", 3, {T(LPX_F32, 1, 4), D(LPX_F8E4M3FN), B(1)}, LPX_OK, NULL},
    {"copy_", 2, {T(LPX_F32, 2, 2, 3), T(LPX_I8, 1, 3)}, LPX_OK, NULL},
    {"fill_", 2, {T(LPX_BF16, 2, 2, 3), F(0.5)}, LPX_OK, NULL},
};

static void frame_run(lpx_op_frame *f, const char *opn, const lpx_value *v, int n)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(opn, &op));
    lpx_call_init(&f->call, op, v, n);
    f->call.key = nc_key;
    CHECK(lpx_op_spec_size(op) > 0);
    CHECK_OK(lpx_op_spec_run(f, sizeof *f));
}

static void test_good_args(void)
{
    spec_check_good(good, sizeof good / sizeof *good);
    /* on the CPU (for the view): lpx_op_spec_run runs the family only */
    lpx_tensor *x = NULL, *o = NULL, *t = NULL, *xt = NULL;
    CHECK_OK(lpx_zeros(3, (const int64_t[]){2, 3, 4}, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_zeros(3, (const int64_t[]){2, 3, 4}, LPX_F32, lpx_cpu(), &o));
    CHECK_OK(lpx_zeros(3, (const int64_t[]){4, 3, 2}, LPX_F32, lpx_cpu(), &t));
    CHECK_OK(lpx_permute(t, 3, (const int64_t[]){2, 1, 0}, &xt));   /* [2, 3, 4], not contiguous */
    lpx_op_frame f;

    /* unary */
    const lpx_unary_args *u = &f.args.unary;
    frame_run(&f, "neg", (lpx_value[]){lpx_v_tensor(x), lpx_v_none()}, 2);
    CHECK(u->x == x && !u->out && u->flat && u->s == 0.0f);
    frame_run(&f, "relu", (lpx_value[]){lpx_v_tensor(x), lpx_v_tensor(o)}, 2);
    CHECK(u->x == x && u->out == o && u->flat);
    frame_run(&f, "exp", (lpx_value[]){lpx_v_tensor(xt), lpx_v_tensor(o)}, 2);
    CHECK(u->x == xt && u->out == o && !u->flat);
    frame_run(&f, "mul_scalar", (lpx_value[]){lpx_v_tensor(x), lpx_v_f64(0.1), lpx_v_tensor(xt)}, 3);
    CHECK(u->x == x && u->out == xt && !u->flat && u->s == (float)0.1);
    frame_run(&f, "add_scalar", (lpx_value[]){lpx_v_tensor(xt), lpx_v_f64(-3), lpx_v_none()}, 3);
    CHECK(u->x == xt && !u->out && !u->flat && u->s == -3.0f);

    /* reduce */
    const lpx_reduce_args *r = &f.args.reduce;
    int64_t d1[2] = {-1, 0};
    frame_run(&f, "sum", (lpx_value[]){lpx_v_tensor(x), lpx_v_ints(d1, 2), lpx_v_bool(true)}, 3);
    CHECK(r->x == x && r->keepdim && r->g.reduced[0] && !r->g.reduced[1] && r->g.reduced[2]);
    CHECK(r->g.out_ndim == 3 && r->g.out_shape[0] == 1 && r->g.out_shape[1] == 3 && r->g.out_shape[2] == 1);
    CHECK(r->g.out_numel == 3 && r->g.count == 8);
    CHECK(r->out_stride[0] == 0 && r->out_stride[1] == 1 && r->out_stride[2] == 0);
    frame_run(&f, "mean", (lpx_value[]){lpx_v_tensor(x), lpx_v_ints(d1 + 1, 1), lpx_v_bool(false)}, 3);
    CHECK(!r->keepdim && r->g.out_ndim == 2 && r->g.out_shape[0] == 3 && r->g.out_shape[1] == 4);
    CHECK(r->g.count == 2 && r->out_stride[0] == 0 && r->out_stride[1] == 4 && r->out_stride[2] == 1);
    frame_run(&f, "norm", (lpx_value[]){lpx_v_tensor(x), lpx_v_none(), lpx_v_bool(false)}, 3);
    CHECK(r->g.out_ndim == 0 && r->g.out_numel == 1 && r->g.count == 24);
    frame_run(&f, "amax", (lpx_value[]){lpx_v_tensor(x), lpx_v_ints(d1, 0), lpx_v_bool(true)}, 3);
    CHECK(r->g.out_ndim == 3 && r->g.out_numel == 1 && r->g.count == 24);   /* an empty list: every dim */

    /* cast, copy_, fill_ */
    frame_run(&f, "cast", (lpx_value[]){lpx_v_tensor(xt), lpx_v_dtype(LPX_BF16), lpx_v_bool(true)}, 3);
    CHECK(f.args.cast.x == xt && f.args.cast.dtype == LPX_BF16 && f.args.cast.saturate);
    frame_run(&f, "copy_", (lpx_value[]){lpx_v_tensor(o), lpx_v_tensor(xt)}, 2);
    CHECK(f.args.copy.dst == o && f.args.copy.src == xt);
    frame_run(&f, "fill_", (lpx_value[]){lpx_v_tensor(xt), lpx_v_f64(0.1)}, 2);
    CHECK(f.args.fill.dst == xt && f.args.fill.value == (float)0.1);

    lpx_tensor_release(x);
    lpx_tensor_release(o);
    lpx_tensor_release(t);
    lpx_tensor_release(xt);
}

/* copy_ may take tensors on two devices (moving bytes is its job): the
 * dispatcher's one-device rule does not apply, the family's does. */
static void test_copy_across_devices(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_tensor *d = NULL, *s = NULL, *bad = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){2, 3}, lpx_cpu(), &d));
    CHECK_OK(lpx_tensor_new(LPX_F16, 1, (const int64_t[]){3}, nc, &s));
    CHECK_OK(lpx_tensor_new(LPX_F16, 1, (const int64_t[]){2}, nc, &bad));
    int before = reached;
    CHECK_ERR(lpx_copy_(d, s), LPX_EINTERNAL);   /* the highest key's kernel: the check-free one */
    CHECK(reached == before + 1);
    CHECK_ERR(lpx_copy_(d, bad), LPX_ESHAPE);
    CHECK(reached == before + 1);
    CHECK(!strcmp(lpx_last_error(), "copy_: src of shape [2] does not broadcast to dst of shape [2, 3]"));
    CHECK_ERR(lpx_copy_(s, d), LPX_ESHAPE);
    CHECK(reached == before + 1);
    lpx_tensor_release(d);
    lpx_tensor_release(s);
    lpx_tensor_release(bad);
}

int main(void)
{
    CHECK_OK(lpx_init());
    setup();
    RUN(test_refused_by_dispatcher);
    RUN(test_plugin_dtypes);
    RUN(test_read_only);
    RUN(test_good_args);
    RUN(test_copy_across_devices);
    return CHECK_DONE();
}
