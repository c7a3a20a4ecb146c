/* The typed API (lpx_add, lpx_softmax, ...): what its wrappers decide
 * themselves before dispatching, pinned to the text the hand-written
 * wrappers wrote (scripts/gen-ops.py generates them from ops.def now; the
 * ones it does not are dispatch/api_hand.c). Each wrapper's own messages,
 * results reset on failure, absent arguments, NULL-able results, and the
 * rule's data exceptions (randn's unsigned seed, the _out variants). That
 * every ops.def row has its prototype and wrapper is the build's check
 * (and the meson test ops_api, with its planted faults: ops_api_self_test). */
#include <stdint.h>
#include "check.h"

static lpx_tensor *SENTINEL = (lpx_tensor *)(uintptr_t)0x10;

/* st is code and lpx_last_error() is exactly msg */
#define CHECK_FAILS(expr, code, msg) do { lpx_status st_ = (expr); \
    CHECKF(st_ == (code) && !strcmp(lpx_last_error(), (msg)), "%s -> %s '%s', want %s '%s'", #expr, \
           lpx_status_string(st_), lpx_last_error(), lpx_status_string(code), (msg)); } while (0)

static lpx_tensor *full(int nd, const int64_t *shape, double v)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_full(nd, shape, v, LPX_F32, lpx_cpu(), &t));
    return t;
}

/* A negative list count is refused before dispatch, naming the op and the
 * count, with the result reset. */
static void test_negative_counts(void)
{
    const int64_t s[1] = {2};
    lpx_tensor *x = full(1, s, 1.0), *o;
    lpx_device cpu = lpx_cpu();
#define NEG(call, msg) do { o = SENTINEL; CHECK_FAILS(call, LPX_EINVAL, msg); CHECK(o == NULL); } while (0)
    NEG(lpx_empty(-1, s, LPX_F32, cpu, &o), "empty: ndim -1 is negative");
    NEG(lpx_zeros(-1, s, LPX_F32, cpu, &o), "zeros: ndim -1 is negative");
    NEG(lpx_full(-2, s, 1.0, LPX_F32, cpu, &o), "full: ndim -2 is negative");
    NEG(lpx_randn(-1, s, 7, LPX_F32, cpu, &o), "randn: ndim -1 is negative");
    NEG(lpx_rand(-1, s, 7, LPX_F32, cpu, &o), "rand: ndim -1 is negative");
    NEG(lpx_view(x, -1, s, &o), "view: ndim -1 is negative");
    NEG(lpx_reshape(x, -1, s, &o), "reshape: ndim -1 is negative");
    NEG(lpx_expand(x, -1, s, &o), "expand: ndim -1 is negative");
    NEG(lpx_permute(x, -1, s, &o), "permute: ndim -1 is negative");
    NEG(lpx_cat(&x, -1, 0, &o), "cat: n -1 is negative");
    NEG(lpx_sum(x, -1, s, false, &o), "sum: ndims -1 is negative");
    NEG(lpx_mean(x, -1, s, false, &o), "mean: ndims -1 is negative");
    NEG(lpx_max(x, -1, s, false, &o), "max: ndims -1 is negative");
    NEG(lpx_amax(x, -1, s, false, &o), "amax: ndims -1 is negative");
    NEG(lpx_norm(x, -3, s, false, &o), "norm: ndims -3 is negative");
#undef NEG
    lpx_tensor *const xs[1] = {x};
    CHECK_FAILS(lpx_adamw_(xs, xs, xs, xs, -1, 0.1, 0.9, 0.99, 1e-8, 0, 1), LPX_EINVAL, "adamw_: n = -1 is negative");
    CHECK_OK(lpx_adamw_(NULL, NULL, NULL, NULL, 0, 0.1, 0.9, 0.99, 1e-8, 0, 1)); /* nothing to do */
    CHECK_FAILS(lpx_adamw_(xs, NULL, xs, xs, 1, 0.1, 0.9, 0.99, 1e-8, 0, 1), LPX_EINVAL,
                "adamw_: grads is NULL with n = 1");
    lpx_tensor_release(x);
}

/* Result pointers: a single result is required ("<op>: out is NULL"
 * whatever the parameter's name); of several, the ones the contract says. */
static void test_result_pointers(void)
{
    const int64_t s2[2] = {2, 4}, s4[4] = {1, 2, 1, 4};
    lpx_tensor *a = full(2, s2, 1.0), *b = full(2, s2, 2.0), *o = NULL, *o2 = NULL, *o3 = NULL;
    CHECK_FAILS(lpx_add(a, b, NULL), LPX_EINVAL, "add: out is NULL");
    CHECK_FAILS(lpx_mse_loss(a, b, NULL), LPX_EINVAL, "mse_loss: out is NULL");
    CHECK_FAILS(lpx_matmul_out(a, b, NULL), LPX_EINVAL, "matmul_out: out is NULL");
    /* the binary _out variants leave a NULL out to the dispatcher */
    lpx_status st = lpx_add_out(a, b, NULL);
    CHECKF(st == LPX_EINVAL && strstr(lpx_last_error(), "'out' is a NULL tensor"), "add_out: %d '%s'", st,
           lpx_last_error());

    o2 = SENTINEL;
    CHECK_FAILS(lpx_rmsnorm(a, NULL, 1e-6, NULL, &o2), LPX_EINVAL, "rmsnorm: y is NULL");
    CHECK(o2 == NULL);
    CHECK_OK(lpx_rmsnorm(a, NULL, 1e-6, &o, NULL)); /* rstd dropped */
    CHECK(o && lpx_tensor_ndim(o) == 2);
    lpx_tensor *rstd = NULL, *y = NULL;
    CHECK_OK(lpx_rmsnorm(a, NULL, 1e-6, &y, &rstd));
    o2 = SENTINEL;
    CHECK_FAILS(lpx_rmsnorm_backward(a, a, NULL, rstd, NULL, &o2), LPX_EINVAL, "rmsnorm_backward: grad_x is NULL");
    CHECK(o2 == NULL);
    lpx_tensor *gx = NULL;
    o2 = SENTINEL;
    CHECK_OK(lpx_rmsnorm_backward(a, a, NULL, rstd, &gx, &o2)); /* no weight: no grad_w */
    CHECK(gx && o2 == NULL);

    o2 = SENTINEL;
    CHECK_FAILS(lpx_swiglu_backward(a, a, b, NULL, NULL), LPX_EINVAL,
                "swiglu_backward: grad_gate and grad_up are both NULL");
    CHECK_OK(lpx_swiglu_backward(a, a, b, NULL, &o2)); /* grad_up only */
    CHECK(o2 && o2 != SENTINEL);

    lpx_tensor *q = full(4, s4, 0.5), *lse = NULL;
    lse = SENTINEL;
    CHECK_FAILS(lpx_attention(q, q, q, true, 0.5, NULL, &lse), LPX_EINVAL, "attention: out is NULL");
    CHECK(lse == NULL);
    CHECK_OK(lpx_attention(q, q, q, true, 0.5, &o3, &lse));
    CHECK_OK(lpx_attention_backward(q, q, q, q, o3, lse, true, 0.5, NULL, NULL, NULL)); /* all dropped */
    lpx_tensor *dk = SENTINEL;
    CHECK_OK(lpx_attention_backward(q, q, q, q, o3, lse, true, 0.5, NULL, &dk, NULL));
    CHECK(dk && dk != SENTINEL && lpx_tensor_ndim(dk) == 4);

    lpx_tensor *all[] = {a, b, o, o2, o3, rstd, y, gx, q, lse, dk};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

/* Absent arguments: int[]? with count 0, Tensor? NULL, the plain binary
 * functions' `out`; and the in-place ops return no result. */
static void test_absent_arguments(void)
{
    const int64_t s2[2] = {2, 3}, d1[1] = {1};
    lpx_tensor *a = full(2, s2, 2.0), *w = full(2, (const int64_t[]){4, 3}, 1.0), *o = NULL, *o2 = NULL;
    CHECK_OK(lpx_sum(a, 0, NULL, false, &o)); /* all dims */
    CHECK(o && lpx_tensor_ndim(o) == 0);
    double v = 0;
    CHECK_OK(lpx_item(o, 0, &v));
    CHECK(v == 12.0);
    lpx_tensor_release(o);
    CHECK_OK(lpx_sum(a, 1, d1, true, &o));
    CHECK(o && lpx_tensor_ndim(o) == 2 && lpx_tensor_shape(o)[1] == 1);
    CHECK_OK(lpx_linear(a, w, NULL, &o2)); /* no bias */
    CHECK(o2 && lpx_tensor_shape(o2)[1] == 4);
    CHECK_OK(lpx_fill_(a, 3.0));
    CHECK_OK(lpx_item(a, 5, &v));
    CHECK(v == 3.0);
    lpx_tensor_release(a);
    lpx_tensor_release(w);
    lpx_tensor_release(o);
    lpx_tensor_release(o2);
}

/* randn/rand take an unsigned seed (the rule's int would be int64_t): its
 * bits travel as the op's int, so lpx_dispatch with the same bits agrees. */
static void test_unsigned_seed(void)
{
    const int64_t s[1] = {8};
    lpx_tensor *t1 = NULL, *t2 = NULL;
    CHECK_OK(lpx_randn(1, s, UINT64_MAX - 4, LPX_F32, lpx_cpu(), &t1));
    lpx_value args[4] = {lpx_v_ints(s, 1), lpx_v_i64(-5), lpx_v_dtype(LPX_F32), lpx_v_device(lpx_cpu())};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_randn, args, 4);
    CHECK_OK(lpx_dispatch(&c));
    t2 = c.nrets == 1 ? c.rets[0].u.t : NULL;
    CHECK(t1 && t2 && !memcmp(lpx_tensor_data(t1), lpx_tensor_data(t2), 8 * sizeof(float)));
    lpx_tensor_release(t1);
    lpx_tensor_release(t2);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_negative_counts);
    RUN(test_result_pointers);
    RUN(test_absent_arguments);
    RUN(test_unsigned_seed);
    return CHECK_DONE();
}
