/* Out-of-memory behaviour: every entry point exercised here is run with
 * its 1st, 2nd, ... Nth allocation failing until it succeeds. Each attempt
 * must return LPX_OK or LPX_ENOMEM (with a message), leak nothing (ASan/LSan
 * checks the whole run) and leave the registry usable. */
#include <stdint.h>
#include "check.h"

LPX_API void lpx__fail_alloc_after(long n);

typedef lpx_status (*scenario_fn)(int attempt);

/* Runs fn with allocation n failing, for n = 0, 1, ... until it succeeds.
 * Returns the number of failing attempts. */
static int exhaust(const char *name, scenario_fn fn)
{
    for (int n = 0; n < 500; n++) {
        lpx__fail_alloc_after(n);
        lpx_clear_error();
        lpx_status st = fn(n);
        lpx__fail_alloc_after(-1);
        if (st == LPX_OK) return n;
        CHECKF(st == LPX_ENOMEM, "%s, allocation %d failing: %s (%s)", name, n, lpx_status_string(st), lpx_last_error());
        CHECKF(lpx_last_error()[0] != 0, "%s: ENOMEM without a message", name);
        if (st != LPX_ENOMEM) return -1;
    }
    CHECKF(0, "%s never succeeded", name);
    return -1;
}

static lpx_status sc_tensor_new(int attempt)
{
    (void)attempt;
    int64_t shape[2] = {3, 5};
    lpx_tensor *t = NULL;
    lpx_status st = lpx_tensor_new(LPX_BF16, 2, shape, lpx_cpu(), &t);
    if (!st) {
        lpx_tensor *v = NULL;
        int64_t vs[1] = {5};
        st = lpx_tensor_view_of(t, 1, vs, NULL, 5, &v);
        lpx_tensor_release(v);
    }
    lpx_tensor_release(t);
    return st;
}

static int deleted;
static void on_delete(void *d, void *c) { (void)d; (void)c; deleted++; }

static lpx_status sc_from_blob(int attempt)
{
    (void)attempt;
    static float buf[4];
    int64_t shape[1] = {4};
    lpx_tensor *t = NULL;
    deleted = 0;
    lpx_status st = lpx_tensor_from_blob(buf, LPX_F32, 1, shape, NULL, lpx_cpu(), on_delete, NULL, &t);
    if (st) { CHECK(deleted == 0); return st; }  /* failure leaves the buffer to the caller */
    lpx_tensor_release(t);
    CHECK(deleted == 1);
    return st;
}

static lpx_status sc_op_register(int attempt)
{
    char schema[96];
    snprintf(schema, sizeof schema, "oom_op_%d(Tensor x, float s) -> Tensor", attempt);
    lpx_op op;
    lpx_status st = lpx_op_register(schema, &op);
    if (st) {
        /* nothing half-registered: the name is still free */
        char name[32];
        snprintf(name, sizeof name, "oom_op_%d", attempt);
        CHECK(lpx_op_find(name, &op) == LPX_ENOTFOUND);
    }
    return st;
}

static lpx_status dummy(lpx_call *c) { (void)c; return LPX_OK; }
static lpx_status typed_dummy(lpx_tensor *x, double s, lpx_tensor **out) { (void)s; lpx_tensor_retain(x); *out = x; return LPX_OK; }

static lpx_status sc_kernel_register(int attempt)
{
    (void)attempt;
    lpx_op op;
    char schema[64];
    static int round;
    snprintf(schema, sizeof schema, "oom_k_%d(Tensor x, float s) -> Tensor", round++);
    lpx__fail_alloc_after(-1);
    CHECK_OK(lpx_op_register(schema, &op));
    lpx__fail_alloc_after(attempt);
    lpx_status st = lpx_kernel_register(op, LPX_KEY_CPU, dummy, NULL);
    if (st) { CHECK(!lpx_kernel_exists(op, LPX_KEY_CPU)); return st; }
    st = lpx_kernel_register_typed(op, 5, "Tensor, float -> Tensor", (void (*)(void))typed_dummy);
    if (st) CHECK(!lpx_kernel_exists(op, 5));
    return st;
}

static lpx_status sc_kind(int attempt)
{
    (void)attempt;
    lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = "oom_kind", .priority = LPX_PRIORITY_PAYLOAD};
    const lpx_kind *k = NULL;
    lpx_status st = lpx_kind_register(&vt, &k);
    if (st) {
        const lpx_kind *f;
        CHECK(lpx_kind_find("oom_kind", &f) == LPX_ENOTFOUND);
        return st;
    }
    int64_t shape[1] = {8};
    lpx_tensor *inner = NULL, *t = NULL;
    st = lpx_tensor_new(LPX_U8, 1, shape, lpx_cpu(), &inner);
    if (!st) st = lpx_tensor_new_kind(k, LPX_F32, 1, shape, lpx_cpu(), &inner, 1, "m", 1, &t);
    if (st) CHECK(!inner || lpx_tensor_refcount(inner) == 1);
    lpx_tensor_release(t);
    lpx_tensor_release(inner);
    CHECK_OK(lpx_kind_unregister(k));
    return st;
}

/* the dense ops exercised by the suite: results compared with a fresh run */
static lpx_status sc_ops(int attempt)
{
    (void)attempt;
    int64_t shape[2] = {17, 33}, wshape[2] = {9, 33};
    lpx_tensor *x = NULL, *w = NULL, *y = NULL, *s = NULL, *r = NULL, *yt = NULL;
    lpx_status st = lpx_randn(2, shape, 1, LPX_F32, lpx_cpu(), &x);
    if (!st) st = lpx_randn(2, wshape, 2, LPX_BF16, lpx_cpu(), &w);
    if (!st) st = lpx_linear(x, w, NULL, &y);
    if (!st) st = lpx_t(y, &yt);
    if (!st) st = lpx_silu(yt, &s);
    if (!st) st = lpx_sum(s, 0, NULL, false, &r);
    lpx_tensor_release(x);
    lpx_tensor_release(w);
    lpx_tensor_release(y);
    lpx_tensor_release(yt);
    lpx_tensor_release(s);
    lpx_tensor_release(r);
    return st;
}

static void test_tensor_oom(void) { CHECK(exhaust("tensor_new+view", sc_tensor_new) >= 2); }
static void test_from_blob_oom(void) { CHECK(exhaust("from_blob", sc_from_blob) >= 1); }
static void test_registry_oom(void)
{
    CHECK(exhaust("op_register", sc_op_register) >= 2);
    CHECK(exhaust("kernel_register", sc_kernel_register) >= 1);
    CHECK(exhaust("kind_register", sc_kind) >= 1);
}
static void test_ops_oom(void) { CHECK(exhaust("ops", sc_ops) >= 6); }

static void test_still_usable(void)
{
    /* after all the failures the registry and ops still work */
    int64_t shape[1] = {4};
    lpx_tensor *a = NULL, *b = NULL;
    CHECK_OK(lpx_full(1, shape, 2.0, LPX_F32, lpx_cpu(), &a));
    CHECK_OK(lpx_add(a, a, &b));
    double v = 0;
    CHECK_OK(lpx_item(b, 3, &v));
    CHECK(v == 4.0);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_op op;
    CHECK_OK(lpx_op_register("after_oom(Tensor x) -> Tensor", &op));
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_tensor_oom);
    RUN(test_from_blob_oom);
    RUN(test_registry_oom);
    RUN(test_ops_oom);
    RUN(test_still_usable);
    return CHECK_DONE();
}
