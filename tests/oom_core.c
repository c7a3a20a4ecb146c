/* OOM sweep cases (tests/oom.h): tensors, dtypes, the registries,
 * dispatch and tracing. */
#include <stdlib.h>
#include "oom.h"

/* ---- tensors ------------------------------------------------------------- */

static lpx_status c_tensor_new(int attempt)
{
    (void)attempt;
    int64_t shape[2] = {3, 5};
    lpx_tensor *t = NULL;
    lpx_status st = OOM(lpx_tensor_new(LPX_BF16, 2, shape, lpx_cpu(), &t));
    OOM_OUT_NULL(st, t);
    lpx_tensor_release(t);
    return st;
}

static lpx_status c_view_of(int attempt)
{
    (void)attempt;
    lpx_tensor *t = oom_randn2(4, 6, 1, LPX_F32), *v = NULL;
    if (!t) return LPX_EINVAL;
    int64_t vs[2] = {3, 2}, strides[2] = {1, 6};
    lpx_status st = OOM(lpx_tensor_view_of(t, 2, vs, strides, 2, &v));
    OOM_OUT_NULL(st, v);
    if (!st) OOM_CHECK(lpx_tensor_shares_storage(t, v));
    lpx_tensor_release(v);
    lpx_tensor_release(t);
    return st;
}

static int deleted;
static void on_delete(void *d, void *c)
{
    (void)d;
    (void)c;
    deleted++;
}

static lpx_status c_from_blob(int attempt)
{
    (void)attempt;
    static float buf[12];
    int64_t shape[2] = {3, 2}, strides[2] = {4, 2};
    lpx_tensor *t = NULL;
    deleted = 0;
    lpx_status st = OOM(lpx_tensor_from_blob(buf, LPX_F32, 2, shape, strides, lpx_cpu(), on_delete, NULL, &t));
    OOM_OUT_NULL(st, t);
    if (st) {
        OOM_CHECKF(deleted == 0, "the deleter ran on a failed lpx_tensor_from_blob");
        return st;
    }
    lpx_tensor_release(t);
    OOM_CHECK(deleted == 1);
    return st;
}

/* a kind with no hooks, for new_kind, redispatch and the fallback slot,
 * and an op for the kernel registrations (oom_core_init) */
static const lpx_kind *test_kind;
static lpx_op test_op = -1;

static lpx_status c_new_kind(int attempt)
{
    (void)attempt;
    int64_t shape[1] = {8}, n2 = 2;
    lpx_tensor *inner[2] = {oom_randn1(8, 1, LPX_F32), NULL}, *t = NULL;
    OOM_SETUP(lpx_zeros(1, &n2, LPX_U8, lpx_cpu(), &inner[1]));
    lpx_status st = OOM(lpx_tensor_new_kind(test_kind, LPX_F32, 1, shape, lpx_cpu(), inner, 2, "meta", 4, &t));
    OOM_OUT_NULL(st, t);
    OOM_CHECK(lpx_tensor_refcount(inner[0]) == (st ? 1 : 2) && lpx_tensor_refcount(inner[1]) == (st ? 1 : 2));
    lpx_tensor_release(t);
    lpx_tensor_release(inner[0]);
    lpx_tensor_release(inner[1]);
    return st;
}

/* ---- dtypes ---------------------------------------------------------------- */

static void u8_to_f32(const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ((const unsigned char *)src)[i];
}

static void u8_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    (void)flags;
    for (size_t i = 0; i < n; i++) ((unsigned char *)dst)[i] = (unsigned char)(src[i] < 0 ? 0 : src[i] > 255 ? 255 : src[i]);
}

static lpx_status c_dtype_register(int attempt)
{
    (void)attempt;
    static const lpx_dtype_traits tr = {.struct_size = sizeof tr, .name = "oom_u8", .bits = 8, .block = 1,
                                        .is_float = false, .max = 255, .to_f32 = u8_to_f32, .from_f32 = u8_from_f32};
    lpx_dtype d = -1;
    lpx_status st = OOM(lpx_dtype_register(&tr, &d));
    if (st) OOM_CHECK(lpx_dtype_from_name("oom_u8") < 0);
    else OOM_CHECK(lpx_dtype_from_name("oom_u8") == d);
    return st;
}

static lpx_status c_convert(int attempt)
{
    (void)attempt;
    float src[37];
    unsigned char dst[37];
    for (int i = 0; i < 37; i++) src[i] = (float)i * 17.5f - 300.0f;
    return OOM(lpx_convert(dst, LPX_F8E4M3FN, src, LPX_F32, 37, LPX_CONVERT_SATURATE));
}

/* ---- ops, kernels, fallbacks, backends --------------------------------------- */

static lpx_status c_op_register(int attempt)
{
    char schema[96], name[32];
    snprintf(name, sizeof name, "oom_op_%d", attempt);
    snprintf(schema, sizeof schema, "%s(Tensor x, float s, int[]? dims) -> (Tensor, Tensor)", name);
    lpx_op op;
    lpx_status st = OOM(lpx_op_register(schema, &op));
    if (st) OOM_CHECKF(lpx_op_find(name, &op) == LPX_ENOTFOUND, "a failed registration left %s behind", name);
    return st;
}

static lpx_status c_op_find(int attempt)
{
    (void)attempt;
    lpx_op op = -1;
    lpx_status st = OOM(lpx_op_find("linear", &op));
    OOM_CHECK(st || op == LPX_OP_linear);
    return st;
}


static lpx_status boxed_identity(lpx_call *c)
{
    lpx_tensor_retain(c->args[0].u.t);
    c->rets[0] = lpx_v_tensor(c->args[0].u.t);
    c->nrets = 1;
    return LPX_OK;
}

static lpx_status typed_identity(lpx_tensor *x, double s, lpx_tensor **out)
{
    (void)s;
    lpx_tensor_retain(x);
    *out = x;
    return LPX_OK;
}

static lpx_status c_kernel_register(int attempt)
{
    (void)attempt;
    lpx_status st = OOM(lpx_kernel_register(test_op, LPX_KEY_CPU, boxed_identity, NULL));
    OOM_CHECK(lpx_kernel_exists(test_op, LPX_KEY_CPU) == !st);
    if (!st) OOM_SETUP(lpx_kernel_unregister(test_op, LPX_KEY_CPU));
    return st;
}

static lpx_status c_kernel_register_typed(int attempt)
{
    (void)attempt;
    lpx_status st = OOM(lpx_kernel_register_typed(test_op, LPX_KEY_CPU, "Tensor, float -> Tensor",
                                                  (void (*)(void))typed_identity));
    OOM_CHECK(lpx_kernel_exists(test_op, LPX_KEY_CPU) == !st);
    if (!st) {
        /* the libffi call path works */
        lpx_tensor *x = oom_randn1(3, 1, LPX_F32);
        lpx_value args[2] = {lpx_v_tensor(x), lpx_v_f64(1.0)};
        lpx_call c;
        lpx_call_init(&c, test_op, args, 2);
        OOM_CHECK(lpx_dispatch(&c) == LPX_OK && c.rets[0].u.t == x);
        lpx_call_release_rets(&c);
        lpx_tensor_release(x);
        OOM_SETUP(lpx_kernel_unregister(test_op, LPX_KEY_CPU));
    }
    return st;
}

static lpx_status c_kernel_unregister(int attempt)
{
    (void)attempt;
    OOM_SETUP(lpx_kernel_register(test_op, LPX_KEY_CPU, boxed_identity, NULL));
    lpx_status st = OOM(lpx_kernel_unregister(test_op, LPX_KEY_CPU));
    OOM_CHECK(lpx_kernel_exists(test_op, LPX_KEY_CPU) == (st != LPX_OK));
    if (st) lpx_kernel_unregister(test_op, LPX_KEY_CPU);
    return st;
}

static lpx_status c_kernel_lookup(int attempt)
{
    (void)attempt;
    lpx_kernel_fn fn = NULL;
    void *data = NULL;
    lpx_status st = OOM(lpx_kernel_lookup(LPX_OP_view, LPX_KEY_CPU, &fn, &data));
    OOM_CHECK(st || fn);
    return st;
}

static lpx_status c_fallback_register(int attempt)
{
    (void)attempt;
    int key = lpx_kind_key(test_kind);
    lpx_status st = OOM(lpx_fallback_register(key, boxed_identity, NULL));
    if (!st) OOM_SETUP(lpx_fallback_unregister(key));
    else OOM_CHECKF(lpx_fallback_unregister(key) != LPX_OK, "a failed fallback registration left it behind");
    return st;
}

static lpx_status c_fallback_unregister(int attempt)
{
    (void)attempt;
    int key = lpx_kind_key(test_kind);
    OOM_SETUP(lpx_fallback_register(key, boxed_identity, NULL));
    lpx_status st = OOM(lpx_fallback_unregister(key));
    if (st) lpx_fallback_unregister(key);
    return st;
}

/* A fake device (type 13) whose memory is host memory, for lpx_tensor_to. */
#define OOM_DEVICE 13
static void *fake_alloc(void *self, lpx_device dev, size_t n)
{
    (void)self, (void)dev;
    return malloc(n ? n : 1);
}
static void fake_free(void *self, lpx_device dev, void *p, size_t n)
{
    (void)self, (void)dev, (void)n;
    free(p);
}
static lpx_status fake_copy(void *self, void *dst, lpx_device dd, const void *src, lpx_device sd, size_t n)
{
    (void)self, (void)dd, (void)sd;
    memcpy(dst, src, n);
    return LPX_OK;
}
static lpx_status fake_sync(void *self, lpx_device dev)
{
    (void)self, (void)dev;
    return LPX_OK;
}

static lpx_status c_backend_register(int attempt)
{
    (void)attempt;
    static const lpx_backend_i be = {.struct_size = sizeof be, .name = "oomdev", .device_type = OOM_DEVICE,
                                     .alloc = fake_alloc, .free = fake_free, .copy = fake_copy, .sync = fake_sync};
    int key = 0;
    lpx_status st = OOM(lpx_backend_register(&be, &key));
    OOM_CHECK((lpx_backend_for(OOM_DEVICE) != NULL) == (st == LPX_OK));
    return st;
}

static lpx_status c_tensor_to(int attempt)
{
    (void)attempt;
    lpx_device dev = {OOM_DEVICE, 0};
    lpx_tensor *x = oom_randn2(5, 7, 3, LPX_BF16), *xt = NULL, *d = NULL, *back = NULL;
    OOM_SETUP(lpx_t(x, &xt));   /* strided: lpx_tensor_to copies it contiguous first */
    lpx_status st = OOM(lpx_tensor_to(xt, dev, &d));
    OOM_OUT_NULL(st, d);
    if (!st) {
        st = OOM(lpx_tensor_to(d, lpx_cpu(), &back));
        OOM_OUT_NULL(st, back);
        if (!st) {
            double a, b;
            OOM_CHECK(lpx_item(back, 8, &a) == LPX_OK && lpx_item(xt, 8, &b) == LPX_OK && a == b);
        }
    }
    lpx_tensor_release(back);
    lpx_tensor_release(d);
    lpx_tensor_release(xt);
    lpx_tensor_release(x);
    return st;
}

/* ---- kinds ---------------------------------------------------------------------- */

static lpx_status c_kind_register(int attempt)
{
    (void)attempt;
    static const lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION,
                                  .name = "oom_kind_reg", .priority = LPX_PRIORITY_WRAPPER};
    const lpx_kind *k = NULL;
    lpx_status st = OOM(lpx_kind_register(&vt, &k));
    OOM_OUT_NULL(st, k);
    const lpx_kind *f = NULL;
    OOM_CHECK((lpx_kind_find("oom_kind_reg", &f) == LPX_OK) == (st == LPX_OK));
    if (!st) OOM_SETUP(lpx_kind_unregister(k));
    return st;
}

static lpx_status c_kind_unregister(int attempt)
{
    (void)attempt;
    static const lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION,
                                  .name = "oom_kind_unreg", .priority = LPX_PRIORITY_WRAPPER};
    const lpx_kind *k = NULL, *f = NULL;
    OOM_SETUP(lpx_kind_register(&vt, &k));
    lpx_status st = OOM(lpx_kind_unregister(k));
    OOM_CHECK((lpx_kind_find("oom_kind_unreg", &f) == LPX_OK) == (st != LPX_OK));
    if (st) lpx_kind_unregister(k);
    return st;
}

static lpx_status c_kind_find(int attempt)
{
    (void)attempt;
    const lpx_kind *k = NULL;
    lpx_status st = OOM(lpx_kind_find("float8", &k));
    OOM_CHECK(st || k == lpx_float8_kind());
    return st;
}

static lpx_status kind_from_dense(const lpx_kind *k, lpx_dtype dt)
{
    lpx_tensor *x = oom_randn2(64, 96, 5, dt), *q = NULL;
    lpx_status st = OOM(lpx_kind_from_dense(k, x, &q));
    OOM_OUT_NULL(st, q);
    OOM_CHECK(lpx_tensor_refcount(x) == 1 || !st);
    if (!st) OOM_CHECK(lpx_tensor_kind(q) == k);
    lpx_tensor_release(q);
    lpx_tensor_release(x);
    return st;
}

static lpx_status c_kind_from_dense_nf4(int a) { (void)a; return kind_from_dense(lpx_nf4_kind(), LPX_BF16); }
static lpx_status c_kind_from_dense_float8(int a) { (void)a; return kind_from_dense(lpx_float8_kind(), LPX_F32); }

static lpx_status c_kind_to_dense(int attempt)
{
    (void)attempt;
    lpx_tensor *x = oom_randn2(64, 32, 6, LPX_BF16), *q = NULL, *d = NULL;
    OOM_SETUP(lpx_nf4_quantize(x, NULL, &q));
    lpx_status st = OOM(lpx_kind_to_dense(q, &d));
    OOM_OUT_NULL(st, d);
    lpx_tensor_release(d);
    lpx_tensor_release(q);
    lpx_tensor_release(x);
    return st;
}

static lpx_status c_kind_unflatten(int attempt)
{
    (void)attempt;
    lpx_tensor *x = oom_randn2(64, 32, 7, LPX_F32), *q = NULL, *u = NULL;
    OOM_SETUP(lpx_nf4_quantize(x, NULL, &q));
    lpx_tensor *inner[4];
    for (int i = 0; i < 4; i++) inner[i] = lpx_tensor_inner(q, i);
    size_t ms = 0;
    const void *meta = lpx_tensor_meta(q, &ms);
    lpx_status st = OOM(lpx_kind_unflatten(lpx_nf4_kind(), LPX_F32, 2, lpx_tensor_shape(q), inner, 4, meta, ms, &u));
    OOM_OUT_NULL(st, u);
    for (int i = 0; i < 4; i++) OOM_CHECK(lpx_tensor_refcount(inner[i]) == 1 || !st);
    lpx_tensor_release(u);
    lpx_tensor_release(q);
    lpx_tensor_release(x);
    return st;
}

/* ---- dispatch ----------------------------------------------------------------------- */

static lpx_status c_dispatch(int attempt)
{
    (void)attempt;
    lpx_tensor *a = oom_randn2(4, 5, 1, LPX_F32), *b = oom_randn2(1, 5, 2, LPX_F16);
    lpx_value args[3] = {lpx_v_tensor(a), lpx_v_tensor(b), lpx_v_none()};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_add, args, 3);
    lpx_status st = OOM(lpx_dispatch(&c));
    OOM_CHECK(!st || c.nrets == 0);
    if (!st) lpx_call_release_rets(&c);
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    return st;
}

/* The test kind's handler for mul: unwraps inner 0 of each kind argument
 * and redispatches below the kind (lands on the CPU kernel). */
static lpx_status unwrap_redispatch(lpx_call *c)
{
    lpx_value args[LPX_MAX_ARGS];
    for (int i = 0; i < c->nargs; i++) {
        args[i] = c->args[i];
        if (args[i].tag == LPX_TAG_TENSOR && args[i].u.t && lpx_tensor_kind(args[i].u.t))
            args[i].u.t = lpx_tensor_inner(args[i].u.t, 0);
    }
    const lpx_value *saved = c->args;
    c->args = args;
    lpx_status st = OOM(lpx_redispatch(c));
    c->args = saved;
    return st;
}

static lpx_status c_redispatch(int attempt)
{
    (void)attempt;
    int64_t shape[2] = {4, 6};
    lpx_tensor *inner = oom_randn2(4, 6, 7, LPX_F32), *k = NULL, *y = NULL;
    OOM_SETUP(lpx_tensor_new_kind(test_kind, LPX_F32, 2, shape, lpx_cpu(), &inner, 1, NULL, 0, &k));
    /* the handler arms the hook around lpx_redispatch only */
    lpx_status st = lpx_mul(k, inner, &y);
    OOM_OUT_NULL(st, y);
    lpx_tensor_release(y);
    lpx_tensor_release(k);
    lpx_tensor_release(inner);
    return st;
}

/* ---- tracing ---------------------------------------------------------------------- */

static void some_ops(void)
{
    lpx_tensor *a = oom_randn1(16, 1, LPX_F32), *b = NULL;
    if (!lpx_exp(a, &b)) lpx_tensor_release(b);
    lpx_tensor_release(a);
}

static lpx_status trace_start(const char *json)
{
    lpx_status st = OOM(lpx_trace_start(json));
    OOM_CHECK(lpx_trace_enabled() == (st == LPX_OK));
    if (!st) {
        some_ops();
        OOM_CHECK(lpx_trace_count(LPX_OP_exp, LPX_KEY_CPU) == 1);
        OOM_SETUP(lpx_trace_stop());
    }
    return st;
}

static lpx_status c_trace_start(int a) { (void)a; return trace_start(NULL); }

static lpx_status c_trace_start_json(int a)
{
    (void)a;
    char path[512];
    snprintf(path, sizeof path, "%s/trace-start.json", oom_tmpdir());
    return trace_start(path);
}

static lpx_status c_trace_stop(int attempt)
{
    (void)attempt;
    char path[512];
    snprintf(path, sizeof path, "%s/trace-stop.json", oom_tmpdir());
    remove(path);
    OOM_SETUP(lpx_trace_start(path));
    some_ops();
    lpx_trace_span("oom_stop_span", "oom", lpx_now_ns(), lpx_now_ns() + 1000);
    lpx_status st = OOM(lpx_trace_stop());
    OOM_CHECK(!lpx_trace_enabled());
    FILE *f = fopen(path, "rb");
    if (!st) OOM_CHECKF(f != NULL, "lpx_trace_stop succeeded without writing %s", path);
    if (f) fclose(f);
    return st;
}

/* Output of lpx_trace_print as a string (caller frees). */
static char *print_trace(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    lpx_trace_print(f);
    fclose(f);
    return buf;
}

static unsigned long long dropped_spans(void)
{
    char *s = print_trace();
    unsigned long long n = 0;
    const char *p = s ? strstr(s, "through fallbacks, ") : NULL;
    if (p) n = strtoull(p + strlen("through fallbacks, "), NULL, 10);
    free(s);
    return n;
}

/* void: a span that cannot be recorded is dropped and counted (what the
 * table prints as "span events dropped"); that is this case's ENOMEM */
static lpx_status c_trace_span(int attempt)
{
    char path[512], name[48];
    snprintf(path, sizeof path, "%s/trace-span.json", oom_tmpdir());
    snprintf(name, sizeof name, "oom_span_%d", attempt);   /* a new name: interning allocates */
    OOM_SETUP(lpx_trace_start(path));
    unsigned long long d0 = dropped_spans();
    uint64_t t0 = lpx_now_ns();
    (void)OOM((lpx_trace_span(name, attempt < 0 ? "oom_warm" : "oom_cat", t0, t0 + 500), LPX_OK));
    unsigned long long d1 = dropped_spans();
    OOM_SETUP(lpx_trace_stop());
    if (d1 != d0) return lpx_error(LPX_ENOMEM, "lpx_trace_span: the span was dropped (out of memory)");
    return LPX_OK;
}

/* void: out of memory prints the totals and "(out of memory: table omitted)" */
static lpx_status c_trace_print(int attempt)
{
    (void)attempt;
    OOM_SETUP(lpx_trace_start(NULL));
    some_ops();
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return LPX_EIO;
    (void)OOM((lpx_trace_print(f), LPX_OK));
    fclose(f);
    OOM_SETUP(lpx_trace_stop());
    bool omitted = buf && strstr(buf, "out of memory: table omitted");
    OOM_CHECK(buf && strstr(buf, "dispatched calls"));
    if (!omitted) OOM_CHECKF(buf && strstr(buf, "exp"), "the table lacks the traced op: %s", buf ? buf : "");
    free(buf);
    return omitted ? lpx_error(LPX_ENOMEM, "lpx_trace_print: table omitted (out of memory)") : LPX_OK;
}

lpx_status oom_core_init(void)
{
    static const lpx_kind_i vt = {.struct_size = sizeof vt, .abi_version = LPX_KIND_ABI_VERSION,
                                  .name = "oom_test_kind", .priority = LPX_PRIORITY_PAYLOAD};
    lpx_status st = lpx_kind_register(&vt, &test_kind);
    if (!st) st = lpx_op_register("oom_kernel_op(Tensor x, float s) -> Tensor", &test_op);
    if (!st) st = lpx_kernel_register(LPX_OP_mul, lpx_kind_key(test_kind), unwrap_redispatch, NULL);
    return st;
}

const oom_case oom_cases_core[] = {
    {"lpx_tensor_new", NULL, c_tensor_new, 0},
    {"lpx_tensor_view_of", NULL, c_view_of, 0},
    {"lpx_tensor_from_blob", "strided, deleter", c_from_blob, 0},
    {"lpx_tensor_new_kind", NULL, c_new_kind, 0},
    {"lpx_dtype_register", NULL, c_dtype_register, OOM_PERSISTENT},
    {"lpx_convert", NULL, c_convert, 0},
    {"lpx_op_register", NULL, c_op_register, OOM_PERSISTENT},
    {"lpx_op_find", NULL, c_op_find, 0},
    {"lpx_kernel_register", NULL, c_kernel_register, OOM_PERSISTENT},
    {"lpx_kernel_register_typed", NULL, c_kernel_register_typed, OOM_PERSISTENT},
    {"lpx_kernel_unregister", NULL, c_kernel_unregister, OOM_PERSISTENT},
    {"lpx_kernel_lookup", NULL, c_kernel_lookup, 0},
    {"lpx_fallback_register", NULL, c_fallback_register, OOM_PERSISTENT},
    {"lpx_fallback_unregister", NULL, c_fallback_unregister, OOM_PERSISTENT},
    {"lpx_backend_register", "a host-memory test device", c_backend_register, OOM_PERSISTENT},
    {"lpx_tensor_to", "cpu (strided) -> test device -> cpu", c_tensor_to, 0},
    {"lpx_kind_register", NULL, c_kind_register, OOM_PERSISTENT},
    {"lpx_kind_unregister", NULL, c_kind_unregister, OOM_PERSISTENT},
    {"lpx_kind_find", NULL, c_kind_find, 0},
    {"lpx_kind_from_dense", "nf4", c_kind_from_dense_nf4, 0},
    {"lpx_kind_from_dense", "float8", c_kind_from_dense_float8, 0},
    {"lpx_kind_to_dense", "nf4", c_kind_to_dense, 0},
    {"lpx_kind_unflatten", "nf4", c_kind_unflatten, 0},
    {"lpx_dispatch", "add, broadcast f16", c_dispatch, 0},
    {"lpx_redispatch", "a kind handler unwrapping to cpu", c_redispatch, OOM_PERSISTENT},
    {"lpx_trace_start", NULL, c_trace_start, 0},
    {"lpx_trace_start", "json", c_trace_start_json, 0},
    {"lpx_trace_stop", "writes json", c_trace_stop, 0},
    {"lpx_trace_span", NULL, c_trace_span, OOM_PERSISTENT | OOM_OBSERVED},
    {"lpx_trace_print", NULL, c_trace_print, OOM_OBSERVED},
    {NULL, NULL, NULL, 0},
};
