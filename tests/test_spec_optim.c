/* The op spec of the optimizer group (include/lpx/op_args_optim.h,
 * dispatch/spec_optim.c): adamw_ (family `adamw`) and the fused step over
 * low-precision optimizer states adamw_state_ (family `adamw_state`).
 * Every bad argument is refused by the dispatcher with the CPU's status and
 * message (pinned: for adamw_ the message its CPU kernel wrote before the
 * spec), the check-free kernel of tests/spec_harness.h never running; good
 * arguments reach it with the checked, normalised struct. */
#include "spec_harness.h"

#define HP F(1e-3), F(0.9), F(0.999), F(1e-8), F(0.0)

/* adamw_state_ over one parameter of 300 elements: the lists of a state of
 * format FMT in blocks of 128 (3 blocks; 4-bit: 150 code bytes) */
#define P300 S(1, TA(LPX_F32, 2, 3, 100))
#define G300 S(1, TA(LPX_BF16, 1, 300))
#define C300 S(1, TA(LPX_U8, 1, 300))
#define C150 S(1, TA(LPX_U8, 1, 150))
#define H300 S(1, TA(LPX_F16, 1, 300))
#define SC3 S(1, TA(LPX_F32, 1, 3))
#define AS8(...) {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), __VA_ARGS__}

static const bad_case bad[] = {
    /* adamw_ */
    {"adamw_", 10, {S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 4)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 4)), HP, I(1)},
     LPX_EINVAL, "adamw_: params has 2 tensors but grads has 1"},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(0, ), HP, I(1)},
     LPX_EINVAL, "adamw_: params has 1 tensors but exp_avg_sq has 0"},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    F(-1.0), F(0.9), F(0.999), F(1e-8), F(0.0), I(1)},
     LPX_EINVAL, "adamw_: lr -1, betas (0.9, 0.999), eps 1e-08, weight_decay 0 or step 1 out of range (lr >= 0, "
                 "betas in [0, 1), eps > 0, weight_decay >= 0, step >= 1)"},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    F(1e-3), F(1.0), F(0.999), F(1e-8), F(0.0), I(1)},
     LPX_EINVAL, NULL},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    HP, I(0)},
     LPX_EINVAL, NULL},
    {"adamw_", 10, {S(1, TA(LPX_I32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    HP, I(1)},
     LPX_EDTYPE, "adamw_: params[0] has dtype i32; adamw_ takes floating-point tensors"},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_U8, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    HP, I(1)},
     LPX_EDTYPE, "adamw_: grads[0] has dtype u8; adamw_ takes floating-point tensors"},
    {"adamw_", 10, {S(2, TA(LPX_F32, 1, 4), TA(LPX_BF16, 2, 2, 3)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)),
                    S(2, TA(LPX_F32, 1, 4), TA(LPX_BF16, 1, 6)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)), HP, I(1)},
     LPX_EDTYPE, "adamw_: exp_avg[1] has dtype bf16; the optimizer state is f32"},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 5)),
                    HP, I(1)},
     LPX_ESHAPE, "adamw_: exp_avg_sq[0] has 5 elements, params[0] has 4"},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 2, 2, 3)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    HP, I(1)},
     LPX_ESHAPE, "adamw_: grads[0] has 6 elements, params[0] has 4"},
    /* adamw_state_ */
    {"adamw_state_", 16, {P300, S(0, ), C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(1, 0), S(0, )}, LPX_EINVAL,
     "adamw_state_: params has 1 tensors but grads has 0"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, S(0, ), I(0), I(128), HP, I(1), L(1, 0), S(0, )}, LPX_EINVAL,
     "adamw_state_: params has 1 tensors but v_scale has 0"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(3), I(128), HP, I(1), L(1, 0), S(0, )}, LPX_EINVAL,
     "adamw_state_: format 3 is not a state format (0 8-bit, 1 4-bit, 2 fp8)"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(100), HP, I(1), L(1, 0), S(0, )}, LPX_EINVAL,
     "adamw_state_: block 100 is not a power of two in 2..256 (the 8-bit state)"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(1), I(512), HP, I(1), L(1, 0), S(0, )}, LPX_EINVAL,
     "adamw_state_: block 512 is not a power of two in 2..256 (the 4-bit state)"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(1), HP, I(1), L(1, 0), S(0, )}, LPX_EINVAL,
     "adamw_state_: block 1 is not a power of two in 2..256 (the 8-bit state)"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(128), F(1e-3), F(0.9), F(0.999), F(0.0), F(0.0),
                          I(1), L(1, 0), S(0, )}, LPX_EINVAL,
     "adamw_state_: lr 0.001, betas (0.9, 0.999), eps 0, weight_decay 0 or step 1 out of range (lr >= 0, betas in "
     "[0, 1), eps > 0, weight_decay >= 0, step >= 1)"},
    {"adamw_state_", 16, AS8(L(0), S(0, )), LPX_EINVAL,
     "adamw_state_: master has 0 entries (mode -1); it takes [mode] with mode 0..3 or [mode, seed, rank, index0] "
     "(modes 1 and 3, stochastic rounding, need all four)"},
    {"adamw_state_", 16, AS8(L(1, 1), S(0, )), LPX_EINVAL, NULL},
    {"adamw_state_", 16, AS8(L(1, 4), S(0, )), LPX_EINVAL, NULL},
    {"adamw_state_", 16, AS8(L(4, 1, 7, -1, 0), S(0, )), LPX_EINVAL,
     "adamw_state_: master rank -1 or index0 0 out of range (rank 0..2^32-1, index0 >= 0)"},
    {"adamw_state_", 16, AS8(L(4, 1, 7, 0, -5), S(0, )), LPX_EINVAL, NULL},
    {"adamw_state_", 16, AS8(L(1, 2), S(0, )), LPX_EINVAL,
     "adamw_state_: master_scale has 0 tensors; master mode 2 needs 1"},
    {"adamw_state_", 16, AS8(L(1, 0), SC3), LPX_EINVAL,
     "adamw_state_: master_scale has 1 tensors; master mode 0 needs 0"},
    {"adamw_state_", 16, {S(1, TA(LPX_I32, 1, 300)), G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(1, 0),
                          S(0, )}, LPX_EDTYPE,
     "adamw_state_: params[0] has dtype i32; adamw_state_ takes floating-point tensors"},
    {"adamw_state_", 16, AS8(L(4, 1, 7, 0, 0), S(0, )), LPX_EDTYPE,
     "adamw_state_: params[0] has dtype f32; the bf16 stochastic-rounding master (mode 1) is bf16"},
    {"adamw_state_", 16, AS8(L(1, 2), SC3), LPX_EDTYPE,
     "adamw_state_: params[0] has dtype f32; the scaled-f16 master (mode 2) is f16"},
    {"adamw_state_", 16, {P300, S(1, TA(LPX_BF16, 1, 299)), C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(1, 0),
                          S(0, )}, LPX_ESHAPE,
     "adamw_state_: grads[0] has 299 elements, the 8-bit state of params[0] (300 elements, block 128) needs 300"},
    {"adamw_state_", 16, {P300, G300, S(1, TA(LPX_I8, 1, 300)), SC3, C300, SC3, I(0), I(128), HP, I(1), L(1, 0),
                          S(0, )}, LPX_EDTYPE,
     "adamw_state_: m[0] has dtype i8; the state's codes are u8"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(1), I(128), HP, I(1), L(1, 0), S(0, )}, LPX_ESHAPE,
     "adamw_state_: m[0] has 300 elements, the 4-bit state of params[0] (300 elements, block 128) needs 150"},
    {"adamw_state_", 16, {P300, G300, C300, S(1, TA(LPX_F32, 1, 2)), C300, SC3, I(0), I(128), HP, I(1), L(1, 0),
                          S(0, )}, LPX_ESHAPE,
     "adamw_state_: m_scale[0] has 2 elements, the 8-bit state of params[0] (300 elements, block 128) needs 3"},
    {"adamw_state_", 16, {P300, G300, C300, S(1, TA(LPX_F16, 1, 3)), C300, SC3, I(0), I(128), HP, I(1), L(1, 0),
                          S(0, )}, LPX_EDTYPE,
     "adamw_state_: m_scale[0] has dtype f16; block scales are f32"},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(2), I(128), HP, I(1), L(1, 0), S(0, )}, LPX_EDTYPE,
     "adamw_state_: v[0] has dtype u8; the fp8 state's v is f16 (scaled)"},
    {"adamw_state_", 16, {P300, G300, C150, SC3, C150, S(1, TA(LPX_F32, 1, 4)), I(1), I(128), HP, I(1), L(1, 0),
                          S(0, )}, LPX_ESHAPE,
     "adamw_state_: v_scale[0] has 4 elements, the 4-bit state of params[0] (300 elements, block 128) needs 3"},
    {"adamw_state_", 16, {S(1, TA(LPX_F16, 1, 300)), G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(1, 2),
                          S(1, TA(LPX_F32, 1, 300))}, LPX_ESHAPE,
     "adamw_state_: master_scale[0] has 300 elements, the 8-bit state of params[0] (300 elements, block 128) needs 3"},
};

static void test_refused_by_dispatcher(void) { spec_check_bad(bad, sizeof bad / sizeof *bad); }

static const bad_case good[] = {
    {"adamw_", 10, {S(2, TA(LPX_F32, 1, 4), TA(LPX_BF16, 2, 2, 3)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F16, 1, 6)),
                    S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)), HP, I(3)},
     0, NULL},
    {"adamw_state_", 16, AS8(L(1, 0), S(0, )), 0, NULL},
    {"adamw_state_", 16, {P300, G300, C150, SC3, C150, SC3, I(1), I(128), HP, I(7), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, H300, SC3, I(2), I(128), HP, I(2), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {S(1, TA(LPX_BF16, 1, 300)), G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1),
                          L(4, 1, 42, 3, 1000), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {S(1, TA(LPX_F16, 1, 300)), G300, C300, SC3, H300, SC3, I(2), I(128), HP, I(1),
                          L(4, 3, 42, 3, 1000), SC3}, 0, NULL},
};

static void test_good_reach_kernel(void) { spec_check_good(good, sizeof good / sizeof *good); }

/* The normalised struct of adamw_: the lists by name and the f32
 * constants lpx_meta_adamw computes. */
static void test_adamw_args(void)
{
    lpx_tensor *p = NULL, *g = NULL, *m = NULL, *v = NULL;
    const int64_t sh[1] = {5};
    CHECK_OK(lpx_tensor_new(LPX_BF16, 1, sh, lpx_cpu(), &p));
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, sh, lpx_cpu(), &g));
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, sh, lpx_cpu(), &m));
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, sh, lpx_cpu(), &v));
    lpx_value a[10] = {lpx_v_tensors(&p, 1), lpx_v_tensors(&g, 1), lpx_v_tensors(&m, 1), lpx_v_tensors(&v, 1),
                       lpx_v_f64(1e-3), lpx_v_f64(0.9), lpx_v_f64(0.999), lpx_v_f64(1e-8), lpx_v_f64(0.1),
                       lpx_v_i64(2)};
    lpx_op_frame f;
    lpx_call_init(&f.call, LPX_OP_adamw_, a, 10);
    f.call.key = LPX_KEY_CPU;
    CHECK(lpx_op_spec_size(LPX_OP_adamw_) == sizeof(lpx_adamw_args));
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    const lpx_adamw_args *aa = &f.args.adamw;
    lpx_adamw_consts k;
    CHECK_OK(lpx_meta_adamw("adamw_", a, &k));
    CHECK(aa->n == 1 && aa->params[0] == p && aa->grads[0] == g && aa->exp_avg[0] == m && aa->exp_avg_sq[0] == v);
    CHECK(!memcmp(&aa->k, &k, sizeof k) && aa->k.bc1 == (float)(1.0 - 0.9 * 0.9) && aa->k.decay == (float)(1.0 - 1e-4));
    lpx_tensor_release(p);
    lpx_tensor_release(g);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
}

/* The normalised struct of adamw_state_. */
static void test_adamw_state_args(void)
{
    bad_case k = {"adamw_state_", 16, {S(2, TA(LPX_F16, 1, 300), TA(LPX_F16, 2, 2, 2)),
                                       S(2, TA(LPX_F32, 1, 300), TA(LPX_F32, 1, 4)),
                                       S(2, TA(LPX_U8, 1, 150), TA(LPX_U8, 1, 2)), S(2, TA(LPX_F32, 1, 3), TA(LPX_F32, 1, 1)),
                                       S(2, TA(LPX_U8, 1, 150), TA(LPX_U8, 1, 2)), S(2, TA(LPX_F32, 1, 3), TA(LPX_F32, 1, 1)),
                                       I(1), I(128), F(3e-4), F(0.9), F(0.95), F(1e-8), F(0.1), I(12),
                                       L(4, 3, -2, 5, 77), S(2, TA(LPX_F32, 1, 3), TA(LPX_F32, 1, 1))}, 0, NULL};
    built_args b;
    spec_build(&k, lpx_cpu(), &b);
    lpx_op_frame f;
    lpx_call_init(&f.call, LPX_OP_adamw_state_, b.v, 16);
    f.call.key = LPX_KEY_CPU;
    CHECK(lpx_op_spec_size(LPX_OP_adamw_state_) == sizeof(lpx_adamw_state_args));
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    const lpx_adamw_state_args *a = &f.args.adamw_state;
    CHECK(a->n == 2 && a->params == b.lists[0] && a->grads == b.lists[1] && a->m == b.lists[2]);
    CHECK(a->m_scale == b.lists[3] && a->v == b.lists[4] && a->v_scale == b.lists[5] && a->master_scale == b.lists[15]);
    CHECK(a->format == 1 && a->block == 128 && a->step == 12 && a->master == 3);
    CHECK(a->seed == (uint64_t)-2 && a->rank == 5 && a->index0 == 77);
    CHECK(a->k.lr == 3e-4f && a->k.b2 == 0.95f && a->k.bc1 == (float)(1.0 - pow(0.9, 12.0)));
    spec_built_free(&b);
}

int main(void)
{
    CHECK_OK(lpx_init());
    spec_setup();
    RUN(test_refused_by_dispatcher);
    RUN(test_good_reach_kernel);
    RUN(test_adamw_args);
    RUN(test_adamw_state_args);
    return CHECK_DONE();
}
