/* The dispatch core: op and kernel registration, argument checking, key
 * priority, redispatch, fallbacks, typed (libffi) kernels, and
 * registration racing with dispatch. Uses its own test ops so it does not
 * depend on the CPU kernels. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include "check.h"

static lpx_op op_probe;       /* probe(Tensor x, Tensor? y, float s) -> Tensor */
/* atomics: the concurrency test runs probe_cpu on several threads */
static atomic_int last_key;   /* key of the kernel that ran last */
static atomic_int cpu_runs, kind_runs, wrapper_runs, fallback_runs;

/* cpu kernel of probe: returns x retained, records the key. */
static lpx_status probe_cpu(lpx_call *c)
{
    cpu_runs++;
    last_key = c->key;
    lpx_tensor_retain(c->args[0].u.t);
    c->rets[c->nrets++] = lpx_v_tensor(c->args[0].u.t);
    return LPX_OK;
}

static lpx_status probe_kind_redispatch(lpx_call *c)
{
    kind_runs++;
    return lpx_redispatch(c);
}

static lpx_status probe_wrapper(lpx_call *c)
{
    wrapper_runs++;
    last_key = c->key;
    return lpx_redispatch(c);
}

static lpx_status generic_fallback(lpx_call *c)
{
    fallback_runs++;
    last_key = c->key;
    return lpx_redispatch(c);
}

static const lpx_kind *register_kind(const char *name, int priority)
{
    lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = name, .priority = priority};
    const lpx_kind *k = NULL;
    CHECK_OK(lpx_kind_register(&vt, &k));
    return k;
}

static lpx_tensor *dense(void)
{
    int64_t shape[1] = {4};
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &t));
    return t;
}

static lpx_tensor *wrap(const lpx_kind *k, lpx_tensor *inner)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new_kind(k, LPX_F32, 1, lpx_tensor_shape(inner), lpx_cpu(), &inner, 1, NULL, 0, &t));
    return t;
}

static lpx_status call_probe(lpx_tensor *x, lpx_tensor *y, lpx_tensor **out)
{
    lpx_value args[3] = {lpx_v_tensor(x), lpx_v_opt_tensor(y), lpx_v_f64(1.5)};
    lpx_call c;
    lpx_call_init(&c, op_probe, args, 3);
    lpx_status st = lpx_dispatch(&c);
    *out = st ? NULL : c.rets[0].u.t;
    return st;
}

static void test_op_registry(void)
{
    CHECK_OK(lpx_op_register("probe(Tensor x, Tensor? y, float s) -> Tensor", &op_probe));
    CHECK(op_probe >= LPX_OP_BUILTIN_COUNT);
    lpx_op found = -1;
    CHECK_OK(lpx_op_find("probe", &found));
    CHECK(found == op_probe);
    CHECK(strcmp(lpx_op_name(op_probe), "probe") == 0);
    CHECK(lpx_op_nargs(op_probe) == 3 && lpx_op_nrets(op_probe) == 1);
    CHECK_ERR(lpx_op_register("probe(Tensor x) -> Tensor", NULL), LPX_EEXIST);
    CHECK_ERR(lpx_op_find("no_such_op", &found), LPX_ENOTFOUND);
    CHECK_ERR(lpx_op_find(NULL, &found), LPX_EINVAL);
    CHECK(lpx_op_name(-1) == NULL && lpx_op_name(100000) == NULL);
    CHECK_OK(lpx_op_find("add", &found));
    CHECK(found == LPX_OP_add);
    CHECK(lpx_op_count() >= LPX_OP_BUILTIN_COUNT + 1);

    CHECK_OK(lpx_kernel_register(op_probe, LPX_KEY_CPU, probe_cpu, NULL));
    CHECK_ERR(lpx_kernel_register(op_probe, LPX_KEY_CPU, probe_cpu, NULL), LPX_EEXIST);
    CHECK_ERR(lpx_kernel_register(op_probe, 0, probe_cpu, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_kernel_register(op_probe, 64, probe_cpu, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_kernel_register(-5, LPX_KEY_CPU, probe_cpu, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_kernel_register(op_probe, 3, NULL, NULL), LPX_EINVAL);
    CHECK(lpx_kernel_exists(op_probe, LPX_KEY_CPU));
}

static void test_argument_checks(void)
{
    lpx_tensor *x = dense(), *out = NULL;
    CHECK_OK(call_probe(x, NULL, &out));
    CHECK(out == x && last_key == LPX_KEY_CPU);
    lpx_tensor_release(out);

    lpx_call c;
    lpx_value two[2] = {lpx_v_tensor(x), lpx_v_none()};
    lpx_call_init(&c, op_probe, two, 2);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL); /* wrong count */
    CHECK(strstr(lpx_last_error(), "probe") != NULL);
    lpx_value wrong[3] = {lpx_v_tensor(x), lpx_v_none(), lpx_v_i64(1)};
    lpx_call_init(&c, op_probe, wrong, 3);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL); /* int for float */
    CHECK(strstr(lpx_last_error(), "'s'") != NULL);
    lpx_value missing[3] = {lpx_v_none(), lpx_v_none(), lpx_v_f64(1)};
    lpx_call_init(&c, op_probe, missing, 3);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL); /* required tensor absent */
    lpx_value nul[3] = {lpx_v_tensor(NULL), lpx_v_none(), lpx_v_f64(1)};
    lpx_call_init(&c, op_probe, nul, 3);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
    lpx_call_init(&c, 99999, nul, 3);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
    CHECK_ERR(lpx_dispatch(NULL), LPX_EINVAL);
    lpx_call_init(&c, op_probe, NULL, 3);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
    lpx_tensor_release(x);
}

static void test_kinds_priority_redispatch(void)
{
    const lpx_kind *payload = register_kind("test_payload", LPX_PRIORITY_PAYLOAD);
    const lpx_kind *wrapper = register_kind("test_wrapper", LPX_PRIORITY_WRAPPER);
    const lpx_kind *dist = register_kind("test_dist", LPX_PRIORITY_DISTRIBUTED);
    CHECK(lpx_kind_key(payload) < lpx_kind_key(wrapper) && lpx_kind_key(wrapper) < lpx_kind_key(dist));
    lpx_tensor *x = dense(), *px = wrap(payload, x), *wx = wrap(wrapper, x), *dx = wrap(dist, x), *out = NULL;

    /* no handler, no fallback: a clear ENOTIMPL naming op and kind */
    CHECK_ERR(call_probe(px, NULL, &out), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "probe") && strstr(lpx_last_error(), "test_payload"));

    CHECK_OK(lpx_kernel_register(op_probe, lpx_kind_key(payload), probe_kind_redispatch, NULL));
    CHECK_OK(lpx_kernel_register(op_probe, lpx_kind_key(wrapper), probe_wrapper, NULL));
    kind_runs = cpu_runs = wrapper_runs = 0;
    CHECK_OK(call_probe(px, NULL, &out)); /* payload handler then cpu */
    CHECK(kind_runs == 1 && cpu_runs == 1 && last_key == LPX_KEY_CPU);
    lpx_tensor_release(out);

    /* mixed call: the wrapper band wins, its redispatch lands on payload */
    kind_runs = cpu_runs = wrapper_runs = 0;
    CHECK_OK(call_probe(px, wx, &out));
    CHECK(wrapper_runs == 1 && kind_runs == 1 && cpu_runs == 1);
    lpx_tensor_release(out);

    /* distributed kind without handler: fallback runs, then wrapper */
    CHECK_ERR(call_probe(dx, wx, &out), LPX_ENOTIMPL);
    CHECK_OK(lpx_fallback_register(lpx_kind_key(dist), generic_fallback, NULL));
    CHECK_ERR(lpx_fallback_register(lpx_kind_key(dist), generic_fallback, NULL), LPX_EEXIST);
    fallback_runs = wrapper_runs = 0;
    CHECK_OK(call_probe(dx, wx, &out));
    CHECK(fallback_runs == 1 && wrapper_runs == 1);
    lpx_tensor_release(out);
    CHECK_OK(lpx_fallback_unregister(lpx_kind_key(dist)));
    CHECK_ERR(lpx_fallback_unregister(lpx_kind_key(dist)), LPX_ENOTFOUND);

    /* redispatch with no key left below */
    lpx_call c;
    lpx_value a[3] = {lpx_v_tensor(x), lpx_v_none(), lpx_v_f64(0)};
    lpx_call_init(&c, op_probe, a, 3);
    c.key = LPX_KEY_CPU;
    c.keys = UINT64_C(1) << LPX_KEY_CPU;
    CHECK_ERR(lpx_redispatch(&c), LPX_ENOTIMPL);

    CHECK_OK(lpx_kernel_unregister(op_probe, lpx_kind_key(wrapper)));
    CHECK_ERR(lpx_kernel_unregister(op_probe, lpx_kind_key(wrapper)), LPX_ENOTFOUND);
    CHECK(!lpx_kernel_exists(op_probe, lpx_kind_key(wrapper)));
    lpx_tensor_release(px);
    lpx_tensor_release(wx);
    lpx_tensor_release(dx);
    lpx_tensor_release(x);
    CHECK_OK(lpx_kind_unregister(payload));
    CHECK_OK(lpx_kind_unregister(wrapper));
    CHECK_OK(lpx_kind_unregister(dist));
    CHECK(!lpx_kernel_exists(op_probe, lpx_kind_key(payload)));
    CHECK(lpx_kernel_exists(op_probe, LPX_KEY_CPU)); /* others untouched */
}

static void test_kind_registration_errors(void)
{
    lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = "k", .priority = LPX_PRIORITY_PAYLOAD};
    const lpx_kind *k = NULL;
    vt.abi_version = 99;
    CHECK_ERR(lpx_kind_register(&vt, &k), LPX_EABI);
    vt.abi_version = LPX_KIND_ABI_VERSION;
    vt.priority = 7;
    CHECK_ERR(lpx_kind_register(&vt, &k), LPX_EINVAL);
    vt.priority = LPX_PRIORITY_PAYLOAD;
    vt.name = "";
    CHECK_ERR(lpx_kind_register(&vt, &k), LPX_EINVAL);
    vt.name = NULL;
    CHECK_ERR(lpx_kind_register(&vt, &k), LPX_EINVAL);
    CHECK_ERR(lpx_kind_register(NULL, &k), LPX_EINVAL);
    vt.struct_size = 4;
    vt.name = "k";
    CHECK_ERR(lpx_kind_register(&vt, &k), LPX_EINVAL);
    vt.struct_size = sizeof vt;
    CHECK_OK(lpx_kind_register(&vt, &k));
    const lpx_kind *k2 = NULL;
    CHECK_ERR(lpx_kind_register(&vt, &k2), LPX_EEXIST);
    CHECK_OK(lpx_kind_unregister(k));
    CHECK_ERR(lpx_kind_unregister(k), LPX_EINVAL);

    /* fill the distributed band (8 keys, minus those of built-in kinds
     * such as dtensor): the next one is refused, state intact */
    int nfree = 8;
    for (int i = 0; i < lpx_kind_count(); i++)
        if (lpx_kind_vtable(lpx_kind_at(i))->priority == LPX_PRIORITY_DISTRIBUTED) nfree--;
    const lpx_kind *many[8];
    char names[9][16];
    int n = 0;
    for (; n <= nfree; n++) {
        snprintf(names[n], sizeof names[n], "dist%d", n);
        lpx_kind_i d = {.struct_size = sizeof d, .abi_version = LPX_KIND_ABI_VERSION, .name = names[n], .priority = LPX_PRIORITY_DISTRIBUTED};
        const lpx_kind *kk = NULL;
        lpx_status st = lpx_kind_register(&d, &kk);
        if (n < nfree) { CHECK_OK(st); many[n] = kk; }
        else CHECK(st == LPX_EFULL);
    }
    const lpx_kind *f = NULL;
    CHECK_ERR(lpx_kind_find(names[nfree], &f), LPX_ENOTFOUND);
    for (int i = 0; i < nfree; i++) CHECK_OK(lpx_kind_unregister(many[i]));
}

/* typed kernel: every argument type arrives where the C signature says */
static int typed_seen;
static lpx_status typed_all(lpx_tensor *x, lpx_tensor *opt, lpx_tensor *const *ts, int64_t nts, int64_t i,
                            const int64_t *ints, int64_t nints, double f, bool b, int32_t d, const char *s,
                            void *p, lpx_device dev, lpx_tensor **out)
{
    typed_seen = opt == NULL && nts == 2 && ts[1] == x && i == -7 && nints == 3 && ints[2] == 30 && f == 2.5 &&
                 b && d == LPX_BF16 && strcmp(s, "hello") == 0 && p == (void *)&typed_seen &&
                 dev.type == LPX_DEVICE_CPU && dev.index == 0;
    if (i == 0) return lpx_error(LPX_ERANGE, "typed_all: refusing i = 0");
    lpx_tensor_retain(x);
    *out = x;
    return LPX_OK;
}

static void test_typed_kernel(void)
{
    lpx_op op;
    CHECK_OK(lpx_op_register("typed_all(Tensor x, Tensor? opt, Tensor[] ts, int i, int[] ints, float f, bool b, "
                             "dtype d, str s, ptr p, device dev) -> Tensor", &op));
    CHECK_ERR(lpx_kernel_register_typed(op, LPX_KEY_CPU, "Tensor, Tensor, Tensor[], int, int[], float, bool, dtype, str, ptr, device -> Tensor",
                                        (void (*)(void))typed_all), LPX_EINVAL); /* Tensor vs Tensor? */
    CHECK_ERR(lpx_kernel_register_typed(op, LPX_KEY_CPU, "Tensor -> Tensor", (void (*)(void))typed_all), LPX_EINVAL);
    CHECK_ERR(lpx_kernel_register_typed(op, LPX_KEY_CPU, "Tensor, banana -> Tensor", (void (*)(void))typed_all), LPX_EINVAL);
    CHECK_OK(lpx_kernel_register_typed(op, LPX_KEY_CPU,
                                       "Tensor, Tensor?, Tensor[], int, int[], float, bool, dtype, str, ptr, device -> Tensor",
                                       (void (*)(void))typed_all));
    lpx_tensor *x = dense();
    lpx_tensor *ts[2] = {x, x};
    int64_t ints[3] = {10, 20, 30};
    lpx_value args[11] = {lpx_v_tensor(x), lpx_v_none(), lpx_v_tensors(ts, 2), lpx_v_i64(-7), lpx_v_ints(ints, 3),
                          lpx_v_f64(2.5), lpx_v_bool(true), lpx_v_dtype(LPX_BF16), lpx_v_str("hello"),
                          lpx_v_ptr(&typed_seen), lpx_v_device(lpx_cpu())};
    lpx_call c;
    lpx_call_init(&c, op, args, 11);
    typed_seen = 0;
    CHECK_OK(lpx_dispatch(&c));
    CHECK(typed_seen == 1);
    CHECK(c.nrets == 1 && c.rets[0].u.t == x);
    lpx_call_release_rets(&c);
    args[3] = lpx_v_i64(0); /* error path through libffi */
    lpx_call_init(&c, op, args, 11);
    CHECK_ERR(lpx_dispatch(&c), LPX_ERANGE);
    CHECK(c.nrets == 0);
    CHECK(lpx_tensor_refcount(x) == 1);
    lpx_tensor_release(x);
}

static void test_device_dispatch(void)
{
    /* an op with no tensors dispatches on its device argument */
    lpx_op op;
    CHECK_OK(lpx_op_register("make_probe(int n, device dev) -> Tensor", &op));
    lpx_value args[2] = {lpx_v_i64(3), lpx_v_device(lpx_cpu())};
    lpx_call c;
    lpx_call_init(&c, op, args, 2);
    CHECK_ERR(lpx_dispatch(&c), LPX_ENOTIMPL);
    lpx_device bogus = {42, 0};
    args[1] = lpx_v_device(bogus);
    CHECK_ERR(lpx_dispatch(&c), LPX_EDEVICE);
    lpx_op op2;
    CHECK_OK(lpx_op_register("no_tensor(int n) -> Tensor", &op2));
    lpx_value a2[1] = {lpx_v_i64(1)};
    lpx_call_init(&c, op2, a2, 1);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
}

/* registration racing with dispatch: readers never see a torn entry */
static atomic_int stop_flag, dispatched;
static void *dispatch_loop(void *arg)
{
    lpx_tensor *x = arg;
    long ok = 0;
    while (!atomic_load(&stop_flag)) {
        lpx_tensor *out = NULL;
        if (call_probe(x, NULL, &out) == LPX_OK) { ok++; atomic_fetch_add(&dispatched, 1); lpx_tensor_release(out); }
    }
    return (void *)ok;
}

static lpx_status noop_kernel(lpx_call *c) { (void)c; return LPX_OK; }

static void test_concurrent_registration(void)
{
    lpx_tensor *x = dense();
    pthread_t th[3];
    atomic_store(&stop_flag, 0);
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, dispatch_loop, x);
    int registered = 0;
    for (int i = 0; i < 200; i++) {
        char schema[64];
        snprintf(schema, sizeof schema, "race_op_%d(Tensor x) -> Tensor", i);
        lpx_op op;
        if (lpx_op_register(schema, &op) == LPX_OK && lpx_kernel_register(op, LPX_KEY_CPU, noop_kernel, NULL) == LPX_OK)
            registered++;
        char kname[32];
        snprintf(kname, sizeof kname, "race_kind_%d", i);
        lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION, .name = kname, .priority = LPX_PRIORITY_PAYLOAD};
        const lpx_kind *k = NULL;
        if (lpx_kind_register(&vt, &k) == LPX_OK) lpx_kind_unregister(k);
    }
    /* on a loaded machine the readers may not have run yet: give them time */
    for (int i = 0; i < 10000 && atomic_load(&dispatched) < 100; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&stop_flag, 1);
    long total = 0;
    for (int i = 0; i < 3; i++) {
        void *r;
        pthread_join(th[i], &r);
        total += (long)r;
    }
    CHECK(registered == 200);
    CHECK(total > 0);
    CHECK(lpx_tensor_refcount(x) == 1);
    lpx_tensor_release(x);
}

static void test_key_names(void)
{
    CHECK(strcmp(lpx_key_name(LPX_KEY_CPU), "cpu") == 0);
    CHECK(strcmp(lpx_key_name(50), "key50") == 0);
    CHECK(lpx_device_key(LPX_DEVICE_CPU) == LPX_KEY_CPU);
    CHECK(lpx_device_key(LPX_DEVICE_CUDA) == 0);
    CHECK(lpx_backend_for(LPX_DEVICE_CPU) != NULL);
    lpx_backend_i dup = *lpx_backend_for(LPX_DEVICE_CPU);
    int key;
    CHECK_ERR(lpx_backend_register(&dup, &key), LPX_EEXIST);
    dup.alloc = NULL;
    CHECK_ERR(lpx_backend_register(&dup, &key), LPX_EINVAL);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_op_registry);
    RUN(test_argument_checks);
    RUN(test_kinds_priority_redispatch);
    RUN(test_kind_registration_errors);
    RUN(test_typed_kernel);
    RUN(test_device_dispatch);
    RUN(test_concurrent_registration);
    RUN(test_key_names);
    return CHECK_DONE();
}
