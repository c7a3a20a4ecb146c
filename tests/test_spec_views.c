/* The op spec of the creation, view and layout ops (include/lpx/op_args_views.h,
 * dispatch/spec_views.c): families `create` (empty, zeros, full, arange,
 * randn, rand), `view` (view, reshape, transpose, t, permute, slice,
 * narrow, expand, contiguous, clone, detach) and `cat`.
 *
 * Every check of these ops, fed to the CPU and to a backend whose kernels
 * check nothing (tests/spec_harness.h): both refuse alike, by the
 * dispatcher, with the message the CPU kernels wrote before the spec
 * (pinned below); good arguments reach the check-free kernel; the
 * normalised struct holds the result's geometry. */
#include "spec_harness.h"

#define BIG (INT64_C(1) << 40)
#define HUGE61 (INT64_C(1) << 61)
#define HALF62 (INT64_C(1) << 62)

static const bad_case bad[] = {
    /* ---- create ---- */
    {"empty", 3, {L(2, 2, -1), D(LPX_F32), V}, LPX_EINVAL, "empty: lpx_tensor_new: shape[1] = -1 is negative"},
    {"empty", 3, {L(2, BIG, BIG), D(LPX_F32), V}, LPX_ERANGE,
     "empty: lpx_tensor_new: element count of the shape overflows int64 at dim 1"},
    {"empty", 3, {L(3, BIG, 0, BIG), D(LPX_F32), V}, LPX_ERANGE,
     "empty: lpx_tensor_new: element count of the shape overflows int64 at dim 2 (counting the dims other than 0)"},
    {"empty", 3, {L(1, 3), D(99), V}, LPX_EDTYPE, "empty: lpx_tensor_new: unknown dtype 99"},
    {"empty", 3, {L(1, HUGE61), D(LPX_F32), V}, LPX_ERANGE,
     "empty: lpx_tensor_new: 2305843009213693952 elements of f32 overflow the byte count"},
    {"empty", 3, {L(1, -1), D(99), V}, LPX_EINVAL, "empty: lpx_tensor_new: shape[0] = -1 is negative"},
    {"zeros", 3, {L(1, -5), D(LPX_BF16), V}, LPX_EINVAL, "zeros: lpx_tensor_new: shape[0] = -5 is negative"},
    {"zeros", 3, {L(2, 2, 2), D(77), V}, LPX_EDTYPE, "zeros: lpx_tensor_new: unknown dtype 77"},
    {"zeros", 3, {L(2, HUGE61, 2), D(LPX_I64), V}, LPX_ERANGE,
     "zeros: lpx_tensor_new: 4611686018427387904 elements of i64 overflow the byte count"},
    {"full", 4, {L(1, -2), F(1.5), D(LPX_F32), V}, LPX_EINVAL, "full: lpx_tensor_new: shape[0] = -2 is negative"},
    {"full", 4, {L(1, 2), F(1.5), D(99), V}, LPX_EDTYPE, "full: lpx_tensor_new: unknown dtype 99"},
    {"full", 4, {L(2, BIG, BIG), F(1.5), D(LPX_F32), V}, LPX_ERANGE,
     "full: lpx_tensor_new: element count of the shape overflows int64 at dim 1"},
    {"arange", 5, {F(0), F(INFINITY), F(1), D(LPX_F32), V}, LPX_EINVAL,
     "arange: start 0, end inf and step 1 must be finite"},
    {"arange", 5, {F(NAN), F(1), F(1), D(LPX_F32), V}, LPX_EINVAL,
     "arange: start nan, end 1 and step 1 must be finite"},
    {"arange", 5, {F(0), F(1), F(0), D(LPX_F32), V}, LPX_EINVAL, "arange: step must be nonzero"},
    {"arange", 5, {F(0), F(1), F(-1), D(LPX_F32), V}, LPX_EINVAL,
     "arange: step -1 points away from end (start 0, end 1)"},
    {"arange", 5, {F(0), F(1e300), F(1e-300), D(LPX_F32), V}, LPX_ERANGE,
     "arange: [0, 1e+300) by 1e-300 has inf elements, too many"},
    {"arange", 5, {F(0), F(10), F(1), D(99), V}, LPX_EDTYPE, "arange: lpx_tensor_new: unknown dtype 99"},
    {"arange", 5, {F(0), F(0x1p61), F(1), D(LPX_F32), V}, LPX_ERANGE,
     "arange: lpx_tensor_new: 2305843009213693952 elements of f32 overflow the byte count"},
    {"arange", 5, {F(0), F(0), F(0), D(99), V}, LPX_EINVAL, "arange: step must be nonzero"},
    {"randn", 4, {L(1, 3), I(1), D(LPX_I32), V}, LPX_EDTYPE, "randn: dtype i32 is not a floating-point dtype"},
    {"randn", 4, {L(1, 3), I(1), D(99), V}, LPX_EDTYPE, "randn: dtype 99 is not registered"},
    {"randn", 4, {L(1, -3), I(1), D(LPX_I32), V}, LPX_EDTYPE, "randn: dtype i32 is not a floating-point dtype"},
    {"randn", 4, {L(1, -3), I(1), D(LPX_F32), V}, LPX_EINVAL, "randn: lpx_tensor_new: shape[0] = -3 is negative"},
    {"rand", 4, {L(1, 3), I(1), D(LPX_U8), V}, LPX_EDTYPE, "rand: dtype u8 is not a floating-point dtype"},
    {"rand", 4, {L(2, BIG, BIG), I(1), D(LPX_BF16), V}, LPX_ERANGE,
     "rand: lpx_tensor_new: element count of the shape overflows int64 at dim 1"},
    {"rand", 4, {L(1, HUGE61), I(1), D(LPX_F32), V}, LPX_ERANGE,
     "rand: lpx_tensor_new: 2305843009213693952 elements of f32 overflow the byte count"},

    /* ---- view, reshape ---- */
    {"view", 2, {T(LPX_F32, 2, 2, 3), L(2, -1, -1)}, LPX_EINVAL,
     "view: shape [-1, -1] has more than one -1 (dims 0 and 1)"},
    {"view", 2, {T(LPX_F32, 2, 2, 3), L(3, 2, -2, -1)}, LPX_EINVAL,
     "view: shape [2, -2, -1] has a negative size -2 at dim 1"},
    {"view", 2, {T(LPX_F32, 2, 2, 3), L(3, BIG, BIG, -1)}, LPX_ERANGE,
     "view: the element count of shape [1099511627776, 1099511627776, -1] overflows int64"},
    {"view", 2, {T(LPX_F32, 2, 2, 3), L(2, -1, 4)}, LPX_ESHAPE,
     "view: cannot infer the -1 of shape [-1, 4] for a tensor of shape [2, 3] (6 elements)"},
    {"view", 2, {T(LPX_F32, 2, 2, 3), L(2, 0, -1)}, LPX_ESHAPE,
     "view: cannot infer the -1 of shape [0, -1] for a tensor of shape [2, 3] (6 elements)"},
    {"view", 2, {T(LPX_F32, 2, 2, 3), L(1, 7)}, LPX_ESHAPE,
     "view: shape [7] (7 elements) is invalid for a tensor of shape [2, 3] (6 elements)"},
    {"view", 2, {T(LPX_F32, 1, 0), L(3, 0, BIG, BIG)}, LPX_ERANGE,
     "view: lpx_tensor_view_of: element count of the shape overflows int64 at dim 2 (counting the dims other than 0)"},
    {"reshape", 2, {T(LPX_I32, 2, 2, 3), L(2, -1, -1)}, LPX_EINVAL,
     "reshape: shape [-1, -1] has more than one -1 (dims 0 and 1)"},
    {"reshape", 2, {T(LPX_I32, 2, 2, 3), L(1, -4)}, LPX_EINVAL, "reshape: shape [-4] has a negative size -4 at dim 0"},
    {"reshape", 2, {T(LPX_I32, 2, 2, 3), L(2, BIG, BIG)}, LPX_ERANGE,
     "reshape: the element count of shape [1099511627776, 1099511627776] overflows int64"},
    {"reshape", 2, {T(LPX_I32, 0), L(2, 2, -1)}, LPX_ESHAPE,
     "reshape: cannot infer the -1 of shape [2, -1] for a tensor of shape [] (1 elements)"},
    {"reshape", 2, {T(LPX_I32, 2, 2, 3), L(0)}, LPX_ESHAPE,
     "reshape: shape [] (1 elements) is invalid for a tensor of shape [2, 3] (6 elements)"},
    {"reshape", 2, {T(LPX_I32, 2, 0, 3), L(4, 2, 0, BIG, BIG)}, LPX_ERANGE,
     "reshape: lpx_tensor_view_of: element count of the shape overflows int64 at dim 3 (counting the dims other than 0)"},

    /* ---- transpose, t, permute ---- */
    {"transpose", 3, {T(LPX_F32, 2, 2, 3), I(2), I(0)}, LPX_ERANGE, "transpose: dim 2 out of range for 2 dims"},
    {"transpose", 3, {T(LPX_F32, 2, 2, 3), I(0), I(-3)}, LPX_ERANGE, "transpose: dim -3 out of range for 2 dims"},
    {"transpose", 3, {T(LPX_F32, 0), I(1), I(0)}, LPX_ERANGE, "transpose: dim 1 out of range for 0 dims"},
    {"t", 1, {T(LPX_F16, 3, 2, 3, 4)}, LPX_ESHAPE,
     "t: x has shape [2, 3, 4]; t takes tensors of at most 2 dims (use transpose)"},
    {"permute", 2, {T(LPX_F32, 3, 2, 3, 4), L(2, 0, 1)}, LPX_ESHAPE,
     "permute: got 2 dims for x of shape [2, 3, 4] (3 dims)"},
    {"permute", 2, {T(LPX_F32, 3, 2, 3, 4), L(3, 0, 3, 1)}, LPX_ERANGE, "permute: dim 3 out of range for 3 dims"},
    {"permute", 2, {T(LPX_F32, 3, 2, 3, 4), L(3, 0, -4, 1)}, LPX_ERANGE, "permute: dim -4 out of range for 3 dims"},
    {"permute", 2, {T(LPX_F32, 3, 2, 3, 4), L(3, 2, 0, -1)}, LPX_EINVAL,
     "permute: dim -1 appears more than once (dims[2])"},

    /* ---- slice, narrow ---- */
    {"slice", 5, {T(LPX_F32, 0), I(0), I(0), I(1), I(1)}, LPX_ERANGE, "slice: x is 0-d, there is no dim 0"},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(2), I(0), I(1), I(1)}, LPX_ERANGE, "slice: dim 2 out of range for 2 dims"},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(-3), I(0), I(1), I(1)}, LPX_ERANGE, "slice: dim -3 out of range for 2 dims"},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(1), I(0), I(1), I(0)}, LPX_EINVAL, "slice: step 0 must be >= 1"},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(1), I(0), I(1), I(-2)}, LPX_EINVAL, "slice: step -2 must be >= 1"},
    {"narrow", 4, {T(LPX_F32, 0), I(-1), I(0), I(1)}, LPX_ERANGE, "narrow: x is 0-d, there is no dim -1"},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(5), I(0), I(1)}, LPX_ERANGE, "narrow: dim 5 out of range for 2 dims"},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(1), I(3), I(3)}, LPX_ERANGE,
     "narrow: start 3, length 3 is out of range for dim 1 of size 5"},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(0), I(-5), I(1)}, LPX_ERANGE,
     "narrow: start -5, length 1 is out of range for dim 0 of size 4"},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(0), I(5), I(0)}, LPX_ERANGE,
     "narrow: start 5, length 0 is out of range for dim 0 of size 4"},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(-1), I(1), I(-1)}, LPX_ERANGE,
     "narrow: start 1, length -1 is out of range for dim 1 of size 5"},

    /* ---- expand ---- */
    {"expand", 2, {T(LPX_F32, 2, 3, 1), L(1, 3)}, LPX_ESHAPE, "expand: shape [3] has fewer dims than x of shape [3, 1]"},
    {"expand", 2, {T(LPX_F32, 2, 3, 1), L(3, -1, 3, 4)}, LPX_EINVAL,
     "expand: shape [-1, 3, 4] has size -1 at new leading dim 0 (-1 only keeps an existing dim)"},
    {"expand", 2, {T(LPX_F32, 2, 3, 1), L(2, 3, -2)}, LPX_EINVAL,
     "expand: shape [3, -2] has a negative size -2 at dim 1"},
    {"expand", 2, {T(LPX_F32, 2, 3, 1), L(2, 4, 5)}, LPX_ESHAPE,
     "expand: x of shape [3, 1] cannot expand to [4, 5] (dim 0: 3 vs 4)"},
    {"expand", 2, {T(LPX_F32, 1, 1), L(3, BIG, BIG, 1)}, LPX_ERANGE,
     "expand: the element count of shape [1099511627776, 1099511627776, 1] overflows int64"},
    {"expand", 2, {T(LPX_F32, 1, 1), L(3, 0, BIG, BIG)}, LPX_ERANGE,
     "expand: lpx_tensor_view_of: element count of the shape overflows int64 at dim 2 (counting the dims other than 0)"},

    /* ---- cat ---- */
    /* an empty list: the dispatcher's refusal (nothing to dispatch on);
     * the family refuses it too ("cat: xs is empty", by hand below) */
    {"cat", 2, {S(0), I(0)}, LPX_EINVAL, "cat: no tensor or device argument to dispatch on"},
    {"cat", 2, {S(2, TA(LPX_F32, 1, 2), TA(LPX_F16, 1, 2)), I(0)}, LPX_EDTYPE, "cat: xs[1] has dtype f16, xs[0] has f32"},
    {"cat", 2, {S(3, TA(LPX_F32, 1, 0), TA(LPX_F32, 1, 2), TA(LPX_I8, 1, 0)), I(0)}, LPX_EDTYPE,
     "cat: xs[2] has dtype i8, xs[0] has f32"},
    {"cat", 2, {S(2, TA(LPX_F32, 0), TA(LPX_F32, 0)), I(0)}, LPX_ESHAPE,
     "cat: xs holds a 0-d tensor; 0-d tensors cannot be concatenated"},
    {"cat", 2, {S(2, TA(LPX_F32, 1, 0), TA(LPX_F32, 0)), I(0)}, LPX_ESHAPE,
     "cat: xs holds a 0-d tensor; 0-d tensors cannot be concatenated"},
    {"cat", 2, {S(2, TA(LPX_F32, 2, 2, 3), TA(LPX_F32, 2, 2, 3)), I(2)}, LPX_ERANGE, "cat: dim 2 out of range for 2 dims"},
    {"cat", 2, {S(2, TA(LPX_F32, 1, 2), TA(LPX_F32, 2, 2, 3)), I(0)}, LPX_ESHAPE,
     "cat: xs[1] has shape [2, 3], which does not match [2] outside dim 0 (the dim counts differ)"},
    {"cat", 2, {S(3, TA(LPX_F32, 2, 2, 3), TA(LPX_F32, 2, 4, 3), TA(LPX_F32, 2, 2, 4)), I(0)}, LPX_ESHAPE,
     "cat: xs[2] has shape [2, 4], which does not match [2, 3] outside dim 0 (dim 1: 4 vs 3)"},
    {"cat", 2, {S(2, TA(LPX_F32, 2, 0, HALF62), TA(LPX_F32, 2, 0, HALF62)), I(1)}, LPX_ERANGE,
     "cat: the concatenated size of dim 1 overflows int64"},
    {"cat", 2, {S(2, TA(LPX_F32, 3, 0, BIG, 1 << 22), TA(LPX_F32, 3, 0, BIG, 1 << 22)), I(1)}, LPX_ERANGE,
     "cat: lpx_tensor_new: element count of the shape overflows int64 at dim 2 (counting the dims other than 0)"},
};

static void test_refused_by_dispatcher(void) { spec_check_bad(bad, sizeof bad / sizeof *bad); }

/* ---- cases the table cannot build: a shape list longer than
 * SPEC_MAX_LIST, a strided x ---------------------------------------- */

static const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, six[1] = {6};

typedef struct raw_case {
    const char *op;
    int what;          /* how the arguments are built (raw_build) */
    lpx_status want;
    const char *msg;   /* the CPU kernels' message before the spec */
} raw_case;

/* Builds case k's arguments on dev into v (tensors to release into ts). */
static int raw_build(const raw_case *k, lpx_device dev, lpx_value *v, lpx_tensor **ts)
{
    switch (k->what) {
    case 0: /* creation: nine dims */
        v[0] = lpx_v_ints(nine, 9);
        if (!strcmp(k->op, "full")) {
            v[1] = lpx_v_f64(1), v[2] = lpx_v_dtype(LPX_F32), v[3] = lpx_v_device(dev);
            return 4;
        }
        if (!strcmp(k->op, "randn") || !strcmp(k->op, "rand")) {
            v[1] = lpx_v_i64(1), v[2] = lpx_v_dtype(LPX_I32), v[3] = lpx_v_device(dev);   /* the dims first */
            return 4;
        }
        v[1] = lpx_v_dtype(99), v[2] = lpx_v_device(dev);   /* the dims first */
        return 3;
    case 1: /* view, reshape, expand: nine dims */
        CHECK_OK(lpx_tensor_new(LPX_F32, 1, (const int64_t[]){1}, dev, &ts[0]));
        v[0] = lpx_v_tensor(ts[0]), v[1] = lpx_v_ints(nine, 9);
        return 2;
    case 2: /* view of a transposed [2, 3] as [6] */
        CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){2, 3}, dev, &ts[1]));
        CHECK_OK(lpx_tensor_view_of(ts[1], 2, (const int64_t[]){3, 2}, (const int64_t[]){1, 3}, 0, &ts[0]));
        v[0] = lpx_v_tensor(ts[0]), v[1] = lpx_v_ints(six, 1);
        return 2;
    }
    return 0;
}

static const raw_case raw[] = {
    {"empty", 0, LPX_EINVAL, "empty: shape has 9 dims, at most 8 are supported"},
    {"zeros", 0, LPX_EINVAL, "zeros: shape has 9 dims, at most 8 are supported"},
    {"full", 0, LPX_EINVAL, "full: shape has 9 dims, at most 8 are supported"},
    {"randn", 0, LPX_EINVAL, "randn: shape has 9 dims, at most 8 are supported"},
    {"rand", 0, LPX_EINVAL, "rand: shape has 9 dims, at most 8 are supported"},
    {"view", 1, LPX_EINVAL, "view: shape has 9 dims, at most 8 are supported"},
    {"reshape", 1, LPX_EINVAL, "reshape: shape has 9 dims, at most 8 are supported"},
    {"expand", 1, LPX_EINVAL, "expand: shape has 9 dims, at most 8 are supported"},
    {"view", 2, LPX_ESHAPE,
     "view: a tensor of shape [3, 2] and strides [1, 3] cannot be viewed as [6] without a copy (use reshape)"},
};

static lpx_status raw_run(const raw_case *k, lpx_device dev, char *msg, size_t len)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(k->op, &op));
    lpx_value v[SPEC_MAX_ARGS];
    lpx_tensor *ts[2] = {NULL, NULL};
    int n = raw_build(k, dev, v, ts);
    lpx_call c;
    lpx_call_init(&c, op, v, n);
    lpx_status st = lpx_dispatch(&c);
    snprintf(msg, len, "%s", st ? lpx_last_error() : "");
    if (!st) lpx_call_release_rets(&c);
    lpx_tensor_release(ts[0]);
    lpx_tensor_release(ts[1]);
    return st;
}

static void test_refused_raw(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    for (size_t i = 0; i < sizeof raw / sizeof *raw; i++) {
        const raw_case *k = &raw[i];
        char cpu_msg[1024], nc_msg[1024];
        lpx_status cpu_st = raw_run(k, lpx_cpu(), cpu_msg, sizeof cpu_msg);
        int before = reached;
        lpx_status nc_st = raw_run(k, nc, nc_msg, sizeof nc_msg);
        CHECKF(cpu_st == k->want, "raw %zu (%s): cpu status %d, want %d (%s)", i, k->op, cpu_st, k->want, cpu_msg);
        CHECKF(nc_st == cpu_st, "raw %zu (%s): check-free status %d, cpu %d (%s)", i, k->op, nc_st, cpu_st, nc_msg);
        CHECKF(reached == before, "raw %zu (%s): the check-free kernel ran on bad arguments", i, k->op);
        CHECKF(!strcmp(cpu_msg, nc_msg), "raw %zu (%s): messages differ:\n  cpu:    %s\n  nochk:  %s", i, k->op,
               cpu_msg, nc_msg);
        CHECKF(!strcmp(cpu_msg, k->msg), "raw %zu (%s): message '%s', want '%s'", i, k->op, cpu_msg, k->msg);
    }
}


/* ---- good arguments ------------------------------------------------ */

static const bad_case good[] = {
    {"empty", 3, {L(2, 2, 3), D(LPX_F32), V}, LPX_OK, NULL},
    {"empty", 3, {L(0), D(LPX_I8), V}, LPX_OK, NULL},
    {"zeros", 3, {L(3, 2, 0, 3), D(LPX_BF16), V}, LPX_OK, NULL},
    {"full", 4, {L(1, 4), F(2.5), D(LPX_I64), V}, LPX_OK, NULL},
    {"arange", 5, {F(0), F(10), F(3), D(LPX_I32), V}, LPX_OK, NULL},
    {"randn", 4, {L(1, 5), I(-1), D(LPX_F16), V}, LPX_OK, NULL},
    {"rand", 4, {L(2, 2, 2), I(7), D(LPX_F8E4M3FN), V}, LPX_OK, NULL},
    {"view", 2, {T(LPX_F32, 2, 2, 3), L(2, -1, 2)}, LPX_OK, NULL},
    {"reshape", 2, {T(LPX_I64, 0), L(3, 1, -1, 1)}, LPX_OK, NULL},
    {"transpose", 3, {T(LPX_F32, 3, 2, 3, 4), I(-1), I(0)}, LPX_OK, NULL},
    {"transpose", 3, {T(LPX_F32, 0), I(0), I(0)}, LPX_OK, NULL},
    {"t", 1, {T(LPX_U8, 2, 2, 3)}, LPX_OK, NULL},
    {"permute", 2, {T(LPX_F32, 3, 2, 3, 4), L(3, 2, 0, 1)}, LPX_OK, NULL},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(1), I(-100), I(100), I(3)}, LPX_OK, NULL},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(0), I(-2), I(2)}, LPX_OK, NULL},
    {"expand", 2, {T(LPX_F32, 2, 3, 1), L(3, 2, -1, 4)}, LPX_OK, NULL},
    {"contiguous", 1, {T(LPX_F16, 1, 3)}, LPX_OK, NULL},
    {"clone", 1, {T(LPX_BOOL, 2, 2, 2)}, LPX_OK, NULL},
    {"detach", 1, {T(LPX_F32, 0)}, LPX_OK, NULL},
    {"cat", 2, {S(3, TA(LPX_F32, 1, 0), TA(LPX_F32, 2, 2, 3), TA(LPX_F32, 2, 1, 3)), I(0)}, LPX_OK, NULL},
};

static void test_good_args_reach_kernel(void) { spec_check_good(good, sizeof good / sizeof *good); }

/* ---- the normalised arguments --------------------------------------- */

static lpx_op op_of(const char *name)
{
    lpx_op op = 0;
    CHECK_OK(lpx_op_find(name, &op));
    return op;
}

/* Runs the op's meta function on (v, n) in f (key: the check-free one). */
static lpx_status spec_of(lpx_op_frame *f, const char *op, const lpx_value *v, int n)
{
    lpx_call_init(&f->call, op_of(op), v, n);
    f->call.key = nc_key;
    return lpx_op_spec_run(f, sizeof *f);
}

static void test_create_args(void)
{
    lpx_device nc = {NOCHK_DEVICE, 3};
    lpx_op_frame f;
    const lpx_create_args *a = &f.args.create;
    CHECK(lpx_op_spec_size(op_of("rand")) == sizeof *a && lpx_op_spec_size(op_of("empty")) == sizeof *a);
    static const int64_t shape[3] = {2, 3, 4};
    lpx_value rv[4] = {lpx_v_ints(shape, 3), lpx_v_i64(-2), lpx_v_dtype(LPX_BF16), lpx_v_device(nc)};
    CHECK_OK(spec_of(&f, "rand", rv, 4));
    CHECK(a->dtype == LPX_BF16 && a->device.type == NOCHK_DEVICE && a->device.index == 3);
    CHECK(a->ndim == 3 && a->shape[0] == 2 && a->shape[2] == 4 && a->numel == 24);
    CHECK(a->seed == UINT64_MAX - 1 && a->bits == 8);   /* bf16: 7 mantissa bits + 1 */
    lpx_value fv[4] = {lpx_v_ints(shape, 2), lpx_v_f64(-1.25), lpx_v_dtype(LPX_F16), lpx_v_device(nc)};
    CHECK_OK(spec_of(&f, "full", fv, 4));
    CHECK(a->value == -1.25 && a->ndim == 2 && a->numel == 6 && a->dtype == LPX_F16);
    lpx_value zv[3] = {lpx_v_ints(shape, 0), lpx_v_dtype(LPX_I32), lpx_v_device(nc)};
    CHECK_OK(spec_of(&f, "zeros", zv, 3));
    CHECK(a->value == 0 && a->ndim == 0 && a->numel == 1);
    lpx_value av[5] = {lpx_v_f64(5), lpx_v_f64(0), lpx_v_f64(-2.5), lpx_v_dtype(LPX_F32), lpx_v_device(nc)};
    CHECK_OK(spec_of(&f, "arange", av, 5));
    CHECK(a->ndim == 1 && a->shape[0] == 2 && a->numel == 2 && a->start == 5 && a->step == -2.5);
}

static void test_view_args(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_tensor *x = NULL, *xt = NULL, *c3 = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 3, (const int64_t[]){2, 3, 4}, nc, &x));
    CHECK_OK(lpx_tensor_new(LPX_F32, 2, (const int64_t[]){3, 1}, nc, &c3));
    /* x^T over dims 0, 2: [4, 3, 2], strides [1, 4, 12], at offset 0 */
    CHECK_OK(lpx_tensor_view_of(x, 3, (const int64_t[]){4, 3, 2}, (const int64_t[]){1, 4, 12}, 0, &xt));
    lpx_op_frame f;
    const lpx_view_args *a = &f.args.view;
    CHECK(lpx_op_spec_size(op_of("view")) == sizeof *a && lpx_op_spec_size(op_of("detach")) == sizeof *a);

    lpx_value tv[3] = {lpx_v_tensor(x), lpx_v_i64(0), lpx_v_i64(-1)};
    CHECK_OK(spec_of(&f, "transpose", tv, 3));
    CHECK(a->x == x && a->result == LPX_VIEW_SHARE && a->ndim == 3 && a->offset == 0);
    CHECK(a->shape[0] == 4 && a->shape[1] == 3 && a->shape[2] == 2);
    CHECK(a->strides[0] == 1 && a->strides[1] == 4 && a->strides[2] == 12);

    static const int64_t flat[2] = {-1, 4}, six[2] = {6, 4};
    lpx_value vv[2] = {lpx_v_tensor(x), lpx_v_ints(flat, 2)};
    CHECK_OK(spec_of(&f, "view", vv, 2));
    CHECK(a->result == LPX_VIEW_SHARE && a->ndim == 2 && a->shape[0] == 6 && a->shape[1] == 4);
    CHECK(a->strides[0] == 4 && a->strides[1] == 1);
    /* reshape of the transpose: no strides express it, a copy */
    lpx_value rv[2] = {lpx_v_tensor(xt), lpx_v_ints(six, 2)};
    CHECK_OK(spec_of(&f, "reshape", rv, 2));
    CHECK(a->x == xt && a->result == LPX_VIEW_COPY && a->ndim == 2 && a->shape[0] == 6 && a->shape[1] == 4);
    CHECK(spec_of(&f, "view", rv, 2) == LPX_ESHAPE);

    lpx_value sv[5] = {lpx_v_tensor(x), lpx_v_i64(-1), lpx_v_i64(-3), lpx_v_i64(100), lpx_v_i64(2)};
    CHECK_OK(spec_of(&f, "slice", sv, 5));   /* dim 2, [1, 4) by 2: elements 1, 3 */
    CHECK(a->result == LPX_VIEW_SHARE && a->shape[2] == 2 && a->strides[2] == 2 && a->offset == 1);
    lpx_value nv[4] = {lpx_v_tensor(x), lpx_v_i64(1), lpx_v_i64(-2), lpx_v_i64(2)};
    CHECK_OK(spec_of(&f, "narrow", nv, 4));
    CHECK(a->shape[1] == 2 && a->strides[1] == 4 && a->offset == 4);

    static const int64_t ex[3] = {2, -1, 5};
    lpx_value ev[2] = {lpx_v_tensor(c3), lpx_v_ints(ex, 3)};
    CHECK_OK(spec_of(&f, "expand", ev, 2));
    CHECK(a->ndim == 3 && a->shape[0] == 2 && a->shape[1] == 3 && a->shape[2] == 5);
    CHECK(a->strides[0] == 0 && a->strides[1] == 1 && a->strides[2] == 0);

    static const int64_t perm[3] = {2, 0, 1};
    lpx_value pv[2] = {lpx_v_tensor(x), lpx_v_ints(perm, 3)};
    CHECK_OK(spec_of(&f, "permute", pv, 2));
    CHECK(a->shape[0] == 4 && a->shape[1] == 2 && a->strides[0] == 1 && a->strides[1] == 12);

    lpx_value xv[1] = {lpx_v_tensor(x)}, xtv[1] = {lpx_v_tensor(xt)};
    CHECK_OK(spec_of(&f, "contiguous", xv, 1));
    CHECK(a->result == LPX_VIEW_SAME);
    CHECK_OK(spec_of(&f, "contiguous", xtv, 1));
    CHECK(a->result == LPX_VIEW_COPY && a->ndim == 3 && a->shape[0] == 4);
    CHECK_OK(spec_of(&f, "clone", xv, 1));
    CHECK(a->result == LPX_VIEW_COPY && a->shape[1] == 3);
    CHECK_OK(spec_of(&f, "detach", xtv, 1));
    CHECK(a->result == LPX_VIEW_SHARE && a->strides[2] == 12 && a->shape[0] == 4);
    lpx_tensor_release(xt);
    lpx_tensor_release(x);
    lpx_tensor_release(c3);
}

static void test_cat_args(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_tensor *e = NULL, *a0 = NULL, *a1 = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F16, 1, (const int64_t[]){0}, nc, &e));
    CHECK_OK(lpx_tensor_new(LPX_F16, 2, (const int64_t[]){2, 3}, nc, &a0));
    CHECK_OK(lpx_tensor_new(LPX_F16, 2, (const int64_t[]){2, 5}, nc, &a1));
    lpx_tensor *xs[3] = {e, a0, a1};
    lpx_value v[2] = {lpx_v_tensors(xs, 3), lpx_v_i64(-1)};
    lpx_op_frame f;
    const lpx_cat_args *a = &f.args.cat;
    CHECK(lpx_op_spec_size(op_of("cat")) == sizeof *a);
    CHECK_OK(spec_of(&f, "cat", v, 2));
    CHECK(a->xs == xs && a->n == 3 && a->ref == a0 && a->dim == 1 && a->dtype == LPX_F16);
    CHECK(a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 8);
    /* an empty list: the dispatcher has nothing to dispatch on; the
     * family refuses it too */
    lpx_value ev[2] = {lpx_v_tensors(xs, 0), lpx_v_i64(0)};
    CHECK_ERR(spec_of(&f, "cat", ev, 2), LPX_EINVAL);
    CHECK(!strcmp(lpx_last_error(), "cat: xs is empty"));
    lpx_tensor_release(e);
    lpx_tensor_release(a0);
    lpx_tensor_release(a1);
}

int main(void)
{
    CHECK_OK(lpx_init());
    spec_setup();
    RUN(test_refused_by_dispatcher);
    RUN(test_refused_raw);
    RUN(test_good_args_reach_kernel);
    RUN(test_create_args);
    RUN(test_view_args);
    RUN(test_cat_args);
    return CHECK_DONE();
}
