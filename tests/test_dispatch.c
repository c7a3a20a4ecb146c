/* The dispatch core: op and kernel registration, argument checking, key
 * priority, redispatch, fallbacks, typed (libffi) kernels, and
 * registration racing with dispatch. Uses its own test ops so it does not
 * depend on the CPU kernels. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include "check.h"
#include "plugins/plugin_internal.h"   /* the registration journal: a plugin load, rolled back */

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

/* ---- every argument shape carries its keys ----------------------------
 * The highest key may sit in any argument: a later element of a Tensor[]
 * list, an optional tensor. A dispatcher that read only the first element
 * of a list (or skipped optionals) would hand a kind tensor to a backend
 * kernel; these cases fail on it. */
static lpx_op op_list;        /* probe_list(Tensor[] xs) -> Tensor */
static int list_cpu_runs, list_kind_runs;
static lpx_status list_cpu(lpx_call *c)
{
    list_cpu_runs++;
    last_key = c->key;
    lpx_tensor_retain(c->args[0].u.ts[0]);
    c->rets[c->nrets++] = lpx_v_tensor(c->args[0].u.ts[0]);
    return LPX_OK;
}
static lpx_status list_kind(lpx_call *c)
{
    list_kind_runs++;
    last_key = c->key;
    return lpx_redispatch(c);
}

static lpx_status call_list(lpx_tensor **xs, uint32_t n, lpx_tensor **out)
{
    lpx_value a[1] = {lpx_v_tensors(xs, n)};
    lpx_call c;
    lpx_call_init(&c, op_list, a, 1);
    lpx_status st = lpx_dispatch(&c);
    *out = st ? NULL : c.rets[0].u.t;
    return st;
}

static void test_keys_of_every_argument(void)
{
    const lpx_kind *k = register_kind("test_list_kind", LPX_PRIORITY_PAYLOAD);
    CHECK_OK(lpx_op_register("probe_list(Tensor[] xs) -> Tensor", &op_list));
    CHECK_OK(lpx_kernel_register(op_list, LPX_KEY_CPU, list_cpu, NULL));
    CHECK_OK(lpx_kernel_register(op_list, lpx_kind_key(k), list_kind, NULL));
    lpx_tensor *x = dense(), *y = dense(), *kx = wrap(k, x), *out = NULL;

    /* the kind is the LAST of three elements: its handler runs first */
    lpx_tensor *l3[3] = {x, y, kx};
    list_cpu_runs = list_kind_runs = 0;
    CHECK_OK(call_list(l3, 3, &out));
    CHECK(list_kind_runs == 1 && list_cpu_runs == 1);
    lpx_tensor_release(out);
    /* dense only: the CPU kernel alone */
    list_cpu_runs = list_kind_runs = 0;
    CHECK_OK(call_list(l3, 2, &out));
    CHECK(list_kind_runs == 0 && list_cpu_runs == 1 && last_key == LPX_KEY_CPU);
    lpx_tensor_release(out);

    /* a built-in op over a list whose second element is a kind without a
     * cat handler: refused naming the kind, never given to the CPU kernel */
    lpx_tensor *pair[2] = {x, kx};
    CHECK_ERR(lpx_cat(pair, 2, 0, &out), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "test_list_kind") != NULL);
    CHECK(out == NULL);

    /* the optional argument alone carries the kind's key */
    CHECK_OK(lpx_kernel_register(op_probe, lpx_kind_key(k), probe_kind_redispatch, NULL));
    kind_runs = cpu_runs = 0;
    CHECK_OK(call_probe(x, kx, &out));
    CHECK(kind_runs == 1 && cpu_runs == 1);
    lpx_tensor_release(out);
    /* absent, it adds nothing */
    kind_runs = cpu_runs = 0;
    CHECK_OK(call_probe(x, NULL, &out));
    CHECK(kind_runs == 0 && cpu_runs == 1);
    lpx_tensor_release(out);

    lpx_tensor_release(kx);
    lpx_tensor_release(x);
    lpx_tensor_release(y);
    CHECK_OK(lpx_kind_unregister(k));
}

/* ---- tensors on different devices -------------------------------------
 * A second backend ("testdev", host memory under another device type)
 * stands in for a GPU. Every op but copy_ refuses tensors on different
 * devices (types, or indices of one type) with LPX_EDEVICE naming the op,
 * both arguments and both devices, before any kernel runs. */
#define TESTDEV_TYPE 41
static void *testdev_alloc(void *self, lpx_device dev, size_t n) { (void)self, (void)dev; return malloc(n ? n : 1); }
static void testdev_free(void *self, lpx_device dev, void *p, size_t n) { (void)self, (void)dev, (void)n; free(p); }
static lpx_status testdev_copy(void *self, void *dst, lpx_device dd, const void *src, lpx_device sd, size_t n)
{
    (void)self, (void)dd, (void)sd;
    memcpy(dst, src, n);
    return LPX_OK;
}
static lpx_status testdev_sync(void *self, lpx_device dev) { (void)self, (void)dev; return LPX_OK; }
static int testdev_runs;
static lpx_status testdev_probe(lpx_call *c)
{
    testdev_runs++;
    lpx_tensor_retain(c->args[0].u.t);
    c->rets[c->nrets++] = lpx_v_tensor(c->args[0].u.t);
    return LPX_OK;
}

static void test_mixed_devices_refused(void)
{
    lpx_backend_i be = {.struct_size = sizeof be, .name = "testdev", .device_type = TESTDEV_TYPE,
                        .alloc = testdev_alloc, .free = testdev_free, .copy = testdev_copy, .sync = testdev_sync};
    int key = 0;
    CHECK_OK(lpx_backend_register(&be, &key));
    CHECK(key > LPX_KEY_CPU && key <= LPX_KEY_BACKEND_LAST);
    CHECK_OK(lpx_kernel_register(op_probe, key, testdev_probe, NULL));
    int64_t shape[1] = {4};
    lpx_tensor *c0 = dense(), *d0 = NULL, *d1 = NULL, *out = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, (lpx_device){TESTDEV_TYPE, 0}, &d0));
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, (lpx_device){TESTDEV_TYPE, 1}, &d1));
    if (!c0 || !d0 || !d1) goto done;

    /* one device: the device's kernel */
    testdev_runs = 0;
    cpu_runs = 0;
    CHECK_OK(call_probe(d0, d0, &out));
    CHECK(testdev_runs == 1 && cpu_runs == 0);
    lpx_tensor_release(out);

    /* cpu + testdev (either order, the optional one too): refused */
    testdev_runs = 0;
    cpu_runs = 0;
    CHECK_ERR(call_probe(c0, d0, &out), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "probe") && strstr(lpx_last_error(), "'x' is on cpu:0") &&
          strstr(lpx_last_error(), "'y' on testdev:0"));
    CHECK_ERR(call_probe(d0, c0, &out), LPX_EDEVICE);
    /* two indices of one device type */
    CHECK_ERR(call_probe(d0, d1, &out), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "testdev:1") != NULL);
    CHECK(testdev_runs == 0 && cpu_runs == 0 && out == NULL);

    /* a later list element on another device; and a built-in op */
    lpx_tensor *l[3] = {c0, c0, d0};
    CHECK_ERR(call_list(l, 3, &out), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "'xs'[2] on testdev:0") != NULL);
    CHECK_ERR(lpx_add(c0, d0, &out), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "add") != NULL);
    lpx_tensor *pair[2] = {c0, d0};
    CHECK_ERR(lpx_cat(pair, 2, 0, &out), LPX_EDEVICE);

    /* copy_ moves bytes between devices by contract: not refused by the
     * device rule (testdev has no copy_ kernel, so it ends ENOTIMPL) */
    CHECK_ERR(lpx_copy_(c0, d0), LPX_ENOTIMPL);

    /* a Tensor(host) argument (a static fp8 scale) may stay on the CPU
     * beside device tensors, in either order; on another device it may not,
     * and the device tensors still must agree */
    lpx_op op_host;
    CHECK_OK(lpx_op_register("probe_host(Tensor x, Tensor(host)? s) -> Tensor", &op_host));
    CHECK(strstr(lpx_op_schema(op_host), "Tensor(host)? s") != NULL);
    CHECK_OK(lpx_kernel_register(op_host, key, testdev_probe, NULL));
    lpx_value ha[2] = {lpx_v_tensor(d0), lpx_v_opt_tensor(c0)};
    lpx_call hc;
    lpx_call_init(&hc, op_host, ha, 2);
    testdev_runs = 0;
    CHECK_OK(lpx_dispatch(&hc));
    CHECK(testdev_runs == 1 && hc.nrets == 1);
    lpx_call_release_rets(&hc);
    ha[1] = lpx_v_opt_tensor(d1);  /* on another device: refused */
    lpx_call_init(&hc, op_host, ha, 2);
    CHECK_ERR(lpx_dispatch(&hc), LPX_EDEVICE);
    ha[0] = lpx_v_tensor(c0);      /* x on the CPU, s on testdev: refused */
    ha[1] = lpx_v_opt_tensor(d0);
    lpx_call_init(&hc, op_host, ha, 2);
    CHECK_ERR(lpx_dispatch(&hc), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "'x' is on cpu:0, 's' on testdev:0") != NULL);
    CHECK_OK(lpx_kernel_unregister(op_host, key));
done:
    lpx_tensor_release(c0);
    lpx_tensor_release(d0);
    lpx_tensor_release(d1);
    CHECK_OK(lpx_kernel_unregister(op_probe, key));
}

/* Ops registered by a failing plugin load and rolled back, in a loop,
 * while this thread dispatches a built-in op and walks every op's name:
 * a reused op id gets a new row, published atomically (clean under TSan;
 * the old code re-filled the slot with a plain store a reader could see
 * half-written). */
static atomic_int op_churn_stop;
static void *op_churn(void *arg)
{
    (void)arg;
    for (int k = 0; k < 300 && !atomic_load(&op_churn_stop); k++) {
        lpx_journal j;
        if (lpx_journal_open(&j, NULL, NULL)) break;
        char schema[96];
        snprintf(schema, sizeof schema, "churn_op_%d(Tensor x) -> Tensor", k % 7);
        lpx_op op;
        (void)lpx_op_register(schema, &op);
        lpx_journal_close(&j);
        lpx_journal_rollback(&j);
        lpx_journal_free(&j);
    }
    return NULL;
}

static void test_op_rollback_concurrent_readers(void)
{
    pthread_t w;
    atomic_store(&op_churn_stop, 0);
    CHECK(pthread_create(&w, NULL, op_churn, NULL) == 0);
    lpx_tensor *x = dense(), *y = NULL;
    long bad = 0;
    for (int round = 0; round < 300; round++) {
        int n = lpx_op_count();
        for (int i = 0; i < n; i++) {
            const char *nm = lpx_op_name(i);
            if (nm && !nm[0]) bad++;
        }
        if (lpx_add(x, x, &y)) bad++;
        lpx_tensor_release(y);
        y = NULL;
    }
    atomic_store(&op_churn_stop, 1);
    pthread_join(w, NULL);
    CHECK(bad == 0);
    lpx_op op;
    CHECK_ERR(lpx_op_find("churn_op_0", &op), LPX_ENOTFOUND);  /* every churned op rolled back */
    lpx_tensor_release(x);
}

/* A kind rolled back while a tensor of it lives: its key is never handed
 * out again, so the tensor cannot reach the next kind's handlers; ops on
 * it are refused naming the rolled-back kind. */
static void test_kind_rollback_poisons_live_key(void)
{
    lpx_journal j;
    CHECK_OK(lpx_journal_open(&j, NULL, NULL));
    const lpx_kind *k = register_kind("ghost_kind", LPX_PRIORITY_PAYLOAD);
    lpx_tensor *x = dense(), *gx = k ? wrap(k, x) : NULL, *out = NULL;
    lpx_journal_close(&j);
    lpx_journal_rollback(&j);
    lpx_journal_free(&j);
    int ghost_key = k ? lpx_kind_key(k) : -1;
    const lpx_kind *next = register_kind("after_ghost", LPX_PRIORITY_PAYLOAD);
    CHECKF(next && lpx_kind_key(next) != ghost_key, "the live ghost's key %d was handed out again", ghost_key);
    CHECK_OK(lpx_kernel_register(op_probe, lpx_kind_key(next), probe_kind_redispatch, NULL));
    kind_runs = 0;
    if (gx) {
        CHECK_ERR(call_probe(gx, NULL, &out), LPX_ENOTIMPL);
        CHECK(strstr(lpx_last_error(), "ghost_kind (rolled back)") != NULL);
    }
    CHECK(kind_runs == 0 && out == NULL);
    lpx_tensor_release(gx);
    lpx_tensor_release(x);
    CHECK_OK(lpx_kernel_unregister(op_probe, lpx_kind_key(next)));
    CHECK_OK(lpx_kind_unregister(next));
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
    RUN(test_keys_of_every_argument);
    RUN(test_mixed_devices_refused);
    RUN(test_op_rollback_concurrent_readers);
    RUN(test_kind_rollback_poisons_live_key);
    return CHECK_DONE();
}
