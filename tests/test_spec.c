/* The op spec (include/lpx/op_args.h, dispatch/spec.c): an op whose
 * ops.def row names a spec family has its contract checked once, by the
 * dispatcher, before any backend kernel runs.
 *
 * A backend registered through the public API (lpx_backend_register,
 * lpx_kernel_register: what a plugin calls) with kernels that check
 * nothing, one for every op with a spec family, is fed bad arguments:
 * each call is refused by the dispatcher, with exactly the status and
 * message the CPU gives for the same arguments (and that message is the
 * one the CPU kernels wrote themselves before the spec; pinned here), and
 * the kernel never runs. Good arguments reach the kernel with the
 * checked, normalised arguments. */
#include "spec_harness.h"

/* An op without a family: registered here (every built-in op gets one in
 * the end), with a CPU kernel that reads c->args itself and returns x. */
static lpx_op nofam = -1;

static lpx_status k_nofam(lpx_call *c)
{
    lpx_tensor *x = c->args[0].u.t;
    lpx_tensor_retain(x);
    c->rets[c->nrets++] = lpx_v_tensor(x);
    return LPX_OK;
}

static void setup(void)
{
    int with_spec = spec_setup();
    CHECK(with_spec >= 11);   /* binary (8), softmax, softmax_backward, matmul */
    CHECK_OK(lpx_op_register("spec_test_nofamily(Tensor x, Tensor? out) -> Tensor", &nofam));
    CHECK_OK(lpx_kernel_register(nofam, LPX_KEY_CPU, k_nofam, NULL));
}

static const bad_case bad[] = {
    /* binary */
    {"add", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 1, 4), NONE}, LPX_ESHAPE,
     "add: shapes [2, 3] and [4] do not broadcast (dim 1: 3 vs 4)"},
    {"mul", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 1, 3), T(LPX_F32, 2, 3, 2)}, LPX_ESHAPE,
     "mul: out has shape [3, 2], the result needs [2, 3]"},
    {"sub", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 2, 3), T(LPX_F16, 2, 2, 3)}, LPX_EDTYPE,
     "sub: out has dtype f16, the result is f32"},
    {"div", 3, {T(LPX_BF16, 1, 3), T(LPX_F32, 2, 5, 2), NONE}, LPX_ESHAPE,
     "div: shapes [3] and [5, 2] do not broadcast (dim 1: 3 vs 2)"},
    {"relu_backward", 2, {T(LPX_F32, 1, 3), T(LPX_F32, 1, 2)}, LPX_ESHAPE,
     "relu_backward: shapes [3] and [2] do not broadcast (dim 0: 3 vs 2)"},
    {"silu_backward", 2, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 1, 4)}, LPX_ESHAPE,
     "silu_backward: shapes [2, 3] and [4] do not broadcast (dim 1: 3 vs 4)"},
    {"gelu_backward", 2, {T(LPX_BF16, 1, 5), T(LPX_F32, 2, 5, 2)}, LPX_ESHAPE,
     "gelu_backward: shapes [5] and [5, 2] do not broadcast (dim 1: 5 vs 2)"},
    {"swiglu", 3, {T(LPX_F32, 1, 4), T(LPX_F32, 1, 4), T(LPX_F32, 1, 3)}, LPX_ESHAPE,
     "swiglu: out has shape [3], the result needs [4]"},
    /* softmax */
    {"softmax", 2, {T(LPX_I32, 2, 2, 3), I(0)}, LPX_EDTYPE,
     "softmax: x has dtype i32; softmax takes floating-point tensors"},
    {"softmax", 2, {T(LPX_F32, 2, 2, 3), I(2)}, LPX_ERANGE, "softmax: dim 2 out of range for 2 dims"},
    {"softmax", 2, {T(LPX_F32, 2, 2, 3), I(-3)}, LPX_ERANGE, "softmax: dim -3 out of range for 2 dims"},
    /* softmax_backward */
    {"softmax_backward", 3, {T(LPX_F32, 2, 2, 3), T(LPX_I64, 2, 2, 3), I(1)}, LPX_EDTYPE,
     "softmax_backward: y has dtype i64; softmax_backward takes floating-point tensors"},
    {"softmax_backward", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 3, 2), I(1)}, LPX_ESHAPE,
     "softmax_backward: grad [2, 3] and y [3, 2] must have the same shape"},
    {"softmax_backward", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 2, 3), I(5)}, LPX_ERANGE,
     "softmax_backward: dim 5 out of range for 2 dims"},
    /* matmul */
    {"matmul", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 2, 3), NONE}, LPX_ESHAPE, NULL},
    {"matmul", 3, {T(LPX_I32, 2, 2, 3), T(LPX_F32, 2, 3, 2), NONE}, LPX_EDTYPE,
     "matmul: a has dtype i32; matmul takes floating-point tensors"},
    {"matmul", 3, {T(LPX_F32, 2, 2, 3), T(LPX_U8, 2, 3, 2), NONE}, LPX_EDTYPE,
     "matmul: b has dtype u8; matmul takes floating-point tensors"},
    {"matmul", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 3, 2), T(LPX_F32, 2, 2, 3)}, LPX_ESHAPE, NULL},
};

static void test_refused_by_dispatcher(void) { spec_check_bad(bad, sizeof bad / sizeof *bad); }

/* Good arguments reach the kernel with the normalised ones. */
/* The families' op lists (LPX_BINARY_OPS, LPX_UNARY_OPS, LPX_REDUCE_OPS),
 * from which the backends derive their kernels and registrations, name
 * exactly the ops.def rows of that family. */
static const struct { const char *name, *spec; } rows[] = {
#define LPX_OP(name, spec, schema) {#name, #spec},
#include "lpx/ops.def"
#undef LPX_OP
};

#define NAME_OF(op, N) #op,
static void check_list(const char *family, const char *const *list, size_t n)
{
    size_t in_def = 0;
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        if (strcmp(rows[r].spec, family)) continue;
        in_def++;
        bool listed = false;
        for (size_t i = 0; i < n; i++) listed |= !strcmp(list[i], rows[r].name);
        CHECKF(listed, "ops.def row %s has family %s but is missing from its op list", rows[r].name, family);
    }
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
            found |= !strcmp(rows[r].name, list[i]) && !strcmp(rows[r].spec, family);
        CHECKF(found, "op list of family %s names %s, whose ops.def row has another family", family, list[i]);
    }
    CHECKF(in_def == n, "family %s: %zu rows in ops.def, %zu in its op list", family, in_def, n);
}

static void test_family_op_lists_match_ops_def(void)
{
    static const char *const binary[] = {LPX_BINARY_OPS(NAME_OF)}, *const unary[] = {LPX_UNARY_OPS(NAME_OF)},
                             *const reduce[] = {LPX_REDUCE_OPS(NAME_OF)};
    check_list("binary", binary, sizeof binary / sizeof *binary);
    check_list("unary", unary, sizeof unary / sizeof *unary);
    check_list("reduce", reduce, sizeof reduce / sizeof *reduce);
}

static void test_good_args_reach_kernel(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_tensor *x = NULL, *y = NULL, *o = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 3, (const int64_t[]){4, 1, 3}, nc, &x));
    CHECK_OK(lpx_tensor_new(LPX_BF16, 2, (const int64_t[]){5, 1}, nc, &y));
    CHECK_OK(lpx_tensor_new(LPX_F32, 3, (const int64_t[]){4, 5, 3}, nc, &o));
    int before = reached;
    lpx_tensor *r = NULL;
    CHECK_ERR(lpx_add(x, y, &r), LPX_EINTERNAL);
    CHECK(reached == before + 1 && seen_args);
    CHECK(strstr(lpx_last_error(), "add: the check-free kernel ran") != NULL);
    /* the dispatcher's frame is gone: only what was copied out is checked */
    lpx_op add;
    CHECK_OK(lpx_op_find("add", &add));
    lpx_value v[3] = {lpx_v_tensor(x), lpx_v_tensor(y), lpx_v_tensor(o)};
    lpx_op_frame f;
    lpx_call_init(&f.call, add, v, 3);
    f.call.key = nc_key;
    const lpx_binary_args *ba = &f.args.binary;
    CHECK(lpx_op_spec_size(add) == sizeof *ba);
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    CHECK(lpx_op_args_of(&f.call) == (const void *)ba);
    CHECK(ba->a == x && ba->b == y && ba->out == o && ba->dtype == LPX_F32);
    CHECK(ba->ndim == 3 && ba->shape[0] == 4 && ba->shape[1] == 5 && ba->shape[2] == 3);
    CHECK(!ba->flat);   /* broadcast: no single flat loop */
    CHECK_ERR(lpx_op_spec_run(&f, sizeof f.call + 8), LPX_EINVAL);

    lpx_op sm;
    CHECK_OK(lpx_op_find("softmax", &sm));
    lpx_value sv[2] = {lpx_v_tensor(o), lpx_v_i64(-2)};
    lpx_call_init(&f.call, sm, sv, 2);
    f.call.key = nc_key;
    const lpx_softmax_args *sa = &f.args.softmax;
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    CHECK(sa->x == o && sa->dim == 1 && sa->len == 5 && sa->count == 12);

    /* an op without a family: no spec, the kernel reads c->args */
    CHECK(lpx_op_spec_size(nofam) == 0);
    lpx_tensor_release(x);
    lpx_tensor_release(y);
    lpx_tensor_release(o);
}

/* ---- plugin ABI: lpx_call keeps its 1.x layout ----------------------
 * A plugin built against the 1.x header (before the op spec) puts this
 * struct, copied from that header, on its stack and hands it to
 * lpx_dispatch. The checked arguments of an op with a spec family live in
 * the dispatcher's own frame: nothing is written past the struct's end
 * (guard bytes right behind it), and the call still works: rets come back
 * into the plugin's struct. */
typedef struct old_lpx_call {   /* include/lpx/dispatch.h at plugin ABI 1.0 */
    lpx_op op;
    int key;
    uint64_t keys;
    int nargs;
    int nrets;
    const lpx_value *args;
    lpx_value rets[4];
    void *kernel_data;
} old_lpx_call;
_Static_assert(sizeof(old_lpx_call) == sizeof(lpx_call), "lpx_call changed size: plugin ABI 1 broken");

#define GUARD_BYTES 64
typedef struct guarded_call {
    old_lpx_call c;
    unsigned char guard[GUARD_BYTES];
} guarded_call;

static bool guard_intact(const guarded_call *g)
{
    for (int i = 0; i < GUARD_BYTES; i++)
        if (g->guard[i] != 0xA5) return false;
    return true;
}

static lpx_status old_dispatch(guarded_call *g, lpx_op op, const lpx_value *args, int nargs)
{
    memset(g, 0xA5, sizeof *g);
    g->c.op = op; g->c.key = 0; g->c.keys = 0; g->c.nargs = nargs; g->c.nrets = 0;
    g->c.args = args; g->c.kernel_data = NULL;
    return lpx_dispatch((lpx_call *)&g->c);
}

static void test_old_call_layout_not_overrun(void)
{
    CHECK(offsetof(lpx_call, kernel_data) == offsetof(old_lpx_call, kernel_data));
    CHECK(offsetof(lpx_call, rets) == offsetof(old_lpx_call, rets));
    lpx_device cpu = {LPX_DEVICE_CPU, 0};
    lpx_tensor *x, *y, *o;
    CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){3, 4}, cpu, &x));
    CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){3, 4}, cpu, &y));
    CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){3, 4}, cpu, &o));
    float *px = lpx_tensor_data(x), *py = lpx_tensor_data(y), *po = lpx_tensor_data(o);
    for (int i = 0; i < 12; i++) px[i] = (float)i, py[i] = 10.0f * (float)i;
    lpx_op add, sm;
    CHECK_OK(lpx_op_find("add", &add));
    CHECK_OK(lpx_op_find("softmax", &sm));
    CHECK(lpx_op_spec_size(add) && lpx_op_spec_size(sm) && !lpx_op_spec_size(nofam));
    guarded_call g;

    /* add with out: a spec family, the CPU kernel's fast path */
    lpx_value av[3] = {lpx_v_tensor(x), lpx_v_tensor(y), lpx_v_tensor(o)};
    CHECK_OK(old_dispatch(&g, add, av, 3));
    CHECK(guard_intact(&g));
    CHECK(g.c.nrets == 1 && g.c.rets[0].tag == LPX_TAG_TENSOR && g.c.rets[0].u.t == o);
    CHECK(g.c.key == LPX_KEY_CPU);
    CHECK(po[5] == 55.0f);
    /* the family's struct as the inline common case fills it, and as the
     * out-of-line meta function does (same arguments, same result) */
    lpx_op_frame ff;
    lpx_call_init(&ff.call, add, av, 3);
    ff.call.key = LPX_KEY_CPU;
    CHECK_OK(lpx_op_spec_run(&ff, sizeof ff));
    CHECK(ff.args.binary.flat && ff.args.binary.ndim == 2 && ff.args.binary.shape[1] == 4);
    lpx_call_release_rets((lpx_call *)&g.c);

    /* add without out: a new result */
    lpx_value nv[3] = {lpx_v_tensor(x), lpx_v_tensor(y), lpx_v_none()};
    CHECK_OK(old_dispatch(&g, add, nv, 3));
    CHECK(guard_intact(&g));
    CHECK(g.c.nrets == 1 && g.c.rets[0].u.t && g.c.rets[0].u.t != o);
    if (g.c.nrets == 1) CHECK(((const float *)lpx_tensor_data(g.c.rets[0].u.t))[11] == 121.0f);
    lpx_call_release_rets((lpx_call *)&g.c);

    /* softmax (another family), and a refusal by the family's meta */
    lpx_value sv[2] = {lpx_v_tensor(x), lpx_v_i64(-1)};
    CHECK_OK(old_dispatch(&g, sm, sv, 2));
    CHECK(guard_intact(&g) && g.c.nrets == 1);
    lpx_call_release_rets((lpx_call *)&g.c);
    lpx_value bv[2] = {lpx_v_tensor(x), lpx_v_i64(7)};
    CHECK(old_dispatch(&g, sm, bv, 2) != LPX_OK);
    CHECK(guard_intact(&g) && g.c.nrets == 0);

    /* an op without a family: the call goes to the kernel as it is */
    lpx_value gv[2] = {lpx_v_tensor(x), lpx_v_none()};
    CHECK_OK(old_dispatch(&g, nofam, gv, lpx_op_nargs(nofam)));
    CHECK(guard_intact(&g) && g.c.nrets == 1);
    lpx_call_release_rets((lpx_call *)&g.c);

    lpx_tensor_release(x);
    lpx_tensor_release(y);
    lpx_tensor_release(o);
}

/* The library's typed API (lpx_add_out: its call heads a frame) takes the
 * dispatcher's one-pass path for the binary family's common case
 * (dispatch.c binary_direct); everything else falls to the general path.
 * Either way: the same status, message and result as lpx_dispatch of the
 * same arguments (which never takes the one-pass path). */
static lpx_status dispatch_add(lpx_tensor *a, lpx_tensor *b, lpx_tensor *o)
{
    lpx_op add;
    lpx_status st = lpx_op_find("add", &add);
    if (st) return st;
    lpx_value v[3] = {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_tensor(o)};
    lpx_call c;
    lpx_call_init(&c, add, v, 3);
    st = lpx_dispatch(&c);
    if (!st) lpx_call_release_rets(&c);
    return st;
}

static void test_typed_api_same_as_dispatch(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_tensor *x = NULL, *y = NULL, *row = NULL, *o = NULL, *ro = NULL, *bad = NULL, *bf = NULL, *t = NULL,
               *tt = NULL, *onc = NULL;
    CHECK_OK(lpx_full(2, (const int64_t[]){3, 4}, 1.5, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_full(2, (const int64_t[]){3, 4}, 2.0, LPX_F32, lpx_cpu(), &y));
    CHECK_OK(lpx_full(2, (const int64_t[]){1, 4}, 4.0, LPX_F32, lpx_cpu(), &row));
    CHECK_OK(lpx_zeros(2, (const int64_t[]){3, 4}, LPX_F32, lpx_cpu(), &o));
    CHECK_OK(lpx_zeros(2, (const int64_t[]){3, 4}, LPX_F32, lpx_cpu(), &ro));
    lpx_tensor_mark_readonly(ro);
    CHECK_OK(lpx_zeros(2, (const int64_t[]){4, 3}, LPX_F32, lpx_cpu(), &bad));
    CHECK_OK(lpx_zeros(2, (const int64_t[]){3, 4}, LPX_BF16, lpx_cpu(), &bf));
    CHECK_OK(lpx_zeros(2, (const int64_t[]){4, 3}, LPX_F32, lpx_cpu(), &t));
    CHECK_OK(lpx_transpose(t, 0, 1, &tt));   /* 3x4, not contiguous */
    CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){3, 4}, nc, &onc));
    struct { lpx_tensor *a, *b, *o; float want; } cases[] = {
        {x, y, o, 3.5f},      /* the one-pass path */
        {x, row, o, 5.5f},    /* a broadcast: the general path */
        {x, y, tt, 3.5f},     /* a strided out: not flat */
        {x, y, ro, 0},        /* read-only out */
        {x, y, bad, 0},       /* out of another shape */
        {x, y, bf, 0},       /* out of another dtype */
        {x, y, onc, 0},       /* tensors on two devices */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lpx_status st1 = lpx_add_out(cases[i].a, cases[i].b, cases[i].o);
        char m1[1024];
        snprintf(m1, sizeof m1, "%s", st1 ? lpx_last_error() : "");
        float got1 = st1 ? 0 : ((const float *)lpx_tensor_data(cases[i].o))[0];
        lpx_status st2 = dispatch_add(cases[i].a, cases[i].b, cases[i].o);
        const char *m2 = st2 ? lpx_last_error() : "";
        CHECKF(st1 == st2 && !strcmp(m1, m2), "case %zu: typed API %d '%s', lpx_dispatch %d '%s'", i, st1, m1, st2, m2);
        CHECKF(st1 || got1 == cases[i].want, "case %zu: %g, want %g", i, got1, cases[i].want);
        CHECKF(!cases[i].want == !!st1, "case %zu: status %d (%s)", i, st1, m1);
    }
    lpx_tensor *all[] = {x, y, row, o, ro, bad, bf, t, tt, onc};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

int main(void)
{
    CHECK_OK(lpx_init());
    setup();
    RUN(test_refused_by_dispatcher);
    RUN(test_good_args_reach_kernel);
    RUN(test_family_op_lists_match_ops_def);
    RUN(test_old_call_layout_not_overrun);
    RUN(test_typed_api_same_as_dispatch);
    return CHECK_DONE();
}
