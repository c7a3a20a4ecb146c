/* The op spec of the optimizer group (include/lpx/op_args_optim.h,
 * dispatch/spec_optim.c): adamw_ (family `adamw`) and the fused step over
 * low-precision optimizer states adamw_state_ (family `adamw_state`).
 * Every bad argument is refused by the dispatcher with the CPU's status and
 * message (pinned: for adamw_ the message its CPU kernel wrote before the
 * spec), the check-free kernel of tests/spec_harness.h never running; good
 * arguments reach it with the checked, normalised struct. */
#include "spec_harness.h"

#define HP F(1e-3), F(0.9), F(0.999), F(1e-8), F(0.0)

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
};

static void test_refused_by_dispatcher(void) { spec_check_bad(bad, sizeof bad / sizeof *bad); }

static const bad_case good[] = {
    {"adamw_", 10, {S(2, TA(LPX_F32, 1, 4), TA(LPX_BF16, 2, 2, 3)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F16, 1, 6)),
                    S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)), HP, I(3)},
     0, NULL},
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

int main(void)
{
    CHECK_OK(lpx_init());
    spec_setup();
    RUN(test_refused_by_dispatcher);
    RUN(test_good_reach_kernel);
    RUN(test_adamw_args);
    return CHECK_DONE();
}
