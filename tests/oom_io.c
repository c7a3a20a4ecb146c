/* OOM sweep cases (tests/oom.h): DLPack import/export, safetensors files
 * (written to a private temporary directory), the plugin loader with
 * lpx-mx.so ($LPX_TEST_MX) and the MX kinds it brings. */
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "oom.h"

/* ---- DLPack -------------------------------------------------------------- */

static lpx_status c_dtype_to(int a)
{
    (void)a;
    DLDataType t;
    return OOM(lpx_dlpack_dtype_to(LPX_F8E5M2, &t));
}

static lpx_status c_dtype_from(int a)
{
    (void)a;
    DLDataType t = {kDLBfloat, 16, 1};
    lpx_dtype d = -1;
    lpx_status st = OOM(lpx_dlpack_dtype_from(t, &d));
    OOM_CHECK(st || d == LPX_BF16);
    return st;
}

static lpx_status export(bool legacy)
{
    lpx_tensor *x = oom_randn2(6, 5, 1, LPX_BF16), *xt = NULL;
    OOM_SETUP(lpx_t(x, &xt));
    lpx_status st;
    if (legacy) {
        DLManagedTensor *m = NULL;
        st = OOM(lpx_to_dlpack_legacy(xt, false, &m));
        OOM_OUT_NULL(st, m);
        if (m) m->deleter(m);
    } else {
        DLManagedTensorVersioned *m = NULL;
        st = OOM(lpx_to_dlpack(xt, &m));
        OOM_OUT_NULL(st, m);
        if (m) m->deleter(m);
    }
    OOM_CHECKF(lpx_tensor_refcount(xt) == 1, "the exported tensor's reference was not given back");
    lpx_tensor_release(xt);
    lpx_tensor_release(x);
    return st;
}
static lpx_status c_to_dlpack(int a) { (void)a; return export(false); }
static lpx_status c_to_dlpack_legacy(int a) { (void)a; return export(true); }

static int dl_deleted;
static void del_v(DLManagedTensorVersioned *m) { (void)m; dl_deleted++; }
static void del_l(DLManagedTensor *m) { (void)m; dl_deleted++; }

static lpx_status import(bool legacy)
{
    static float data[4 * 8];
    static int64_t shape[2] = {4, 3}, strides[2] = {8, 2};
    DLTensor t = {.data = data, .device = {kDLCPU, 0}, .ndim = 2, .dtype = {kDLFloat, 32, 1},
                  .shape = shape, .strides = strides, .byte_offset = 4};
    DLManagedTensorVersioned mv = {.version = {1, 1}, .deleter = del_v, .dl_tensor = t};
    DLManagedTensor ml = {.dl_tensor = t, .deleter = del_l};
    lpx_tensor *out = NULL;
    dl_deleted = 0;
    lpx_status st = legacy ? OOM(lpx_from_dlpack_legacy(&ml, &out)) : OOM(lpx_from_dlpack(&mv, &out));
    OOM_OUT_NULL(st, out);
    OOM_CHECKF(dl_deleted == 0, "the producer's deleter ran %s", st ? "on a failed import" : "too early");
    lpx_tensor_release(out);
    OOM_CHECKF(dl_deleted == (st ? 0 : 1), "deleter ran %d times", dl_deleted);
    return st;
}
static lpx_status c_from_dlpack(int a) { (void)a; return import(false); }
static lpx_status c_from_dlpack_legacy(int a) { (void)a; return import(true); }

static lpx_tensor *make_kind(bool nf4)
{
    lpx_tensor *x = oom_randn2(64, 32, 3, LPX_BF16), *q = NULL;
    lpx_status st = nf4 ? lpx_nf4_quantize(x, NULL, &q) : lpx_float8_quantize(x, NULL, &q, NULL);
    if (st) oom_failf(__FILE__, __LINE__, "setup quantize: %s", lpx_last_error());
    lpx_tensor_release(x);
    return q;
}

static lpx_status flatten(bool nf4)
{
    lpx_tensor *q = make_kind(nf4);
    if (!q) return LPX_EINVAL;
    lpx_dlpack_flat f;
    memset(&f, 0, sizeof f);
    lpx_status st = OOM(lpx_dlpack_flatten(q, &f));
    if (st)
        for (int i = 0; i < LPX_MAX_INNER; i++) OOM_CHECKF(!f.inner[i], "a failed flatten left inner %d", i);
    lpx_dlpack_flat_release(&f);
    OOM_CHECK(lpx_tensor_refcount(q) == 1);
    lpx_tensor_release(q);
    return st;
}
static lpx_status c_flatten_nf4(int a) { (void)a; return flatten(true); }
static lpx_status c_flatten_float8(int a) { (void)a; return flatten(false); }

static lpx_status unflatten(bool nf4)
{
    lpx_tensor *q = make_kind(nf4), *r = NULL;
    if (!q) return LPX_EINVAL;
    lpx_dlpack_flat f;
    OOM_SETUP(lpx_dlpack_flatten(q, &f));
    lpx_status st = OOM(lpx_dlpack_unflatten(&f, &r));
    OOM_OUT_NULL(st, r);
    if (!st) OOM_CHECK(lpx_tensor_kind(r) == lpx_tensor_kind(q));
    lpx_dlpack_flat_release(&f);
    lpx_tensor_release(r);
    OOM_CHECK(lpx_tensor_refcount(q) == 1);
    lpx_tensor_release(q);
    return st;
}
static lpx_status c_unflatten_nf4(int a) { (void)a; return unflatten(true); }
static lpx_status c_unflatten_float8(int a) { (void)a; return unflatten(false); }

/* ---- safetensors ------------------------------------------------------------ */

static int files_in(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* a model: dense f32, a strided bf16, nf4, float8, an i64; two metadata pairs */
static lpx_status save_model(const char *path, bool armed)
{
    lpx_tensor *ts[5] = {oom_randn2(8, 16, 1, LPX_F32), oom_randn2(16, 12, 2, LPX_BF16), make_kind(true),
                         make_kind(false), NULL}, *bt = NULL;
    int64_t n = 5;
    OOM_SETUP(lpx_arange(0, 5, 1, LPX_I64, lpx_cpu(), &ts[4]));
    (void)n;
    OOM_SETUP(lpx_t(ts[1], &bt));
    lpx_tensor_release(ts[1]);
    ts[1] = bt;
    const char *names[5] = {"dense.w", "strided", "q4", "q8", "ids"};
    lpx_safetensors_kv meta[2] = {{"format", "pt"}, {"note", "oom"}};
    lpx_status st = armed ? OOM(lpx_safetensors_save(path, 5, names, ts, 2, meta))
                          : lpx_safetensors_save(path, 5, names, ts, 2, meta);
    for (int i = 0; i < 5; i++) lpx_tensor_release(ts[i]);
    return st;
}

static lpx_status c_st_save(int attempt)
{
    (void)attempt;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/save", oom_tmpdir());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    lpx_status st = save_model(path, true);
    int n = files_in(dir);
    /* atomic: the file or nothing, and no temporary file left behind */
    OOM_CHECKF(n == (st ? 0 : 1), "%d files in %s after a %s save", n, dir, st ? "failed" : "successful");
    return st;
}

static char model_path[600];

static lpx_status ensure_model(void)
{
    if (model_path[0]) return LPX_OK;
    snprintf(model_path, sizeof model_path, "%s/model.safetensors", oom_tmpdir());
    lpx_status st = save_model(model_path, false);
    if (st) model_path[0] = 0;
    return st;
}

static lpx_status c_st_open(int attempt)
{
    (void)attempt;
    OOM_SETUP(ensure_model());
    lpx_safetensors *f = NULL;
    lpx_status st = OOM(lpx_safetensors_open(model_path, &f));
    OOM_OUT_NULL(st, f);
    if (!st) OOM_CHECK(lpx_safetensors_count(f) == 5 && !strcmp(lpx_safetensors_metadata(f, "note"), "oom"));
    lpx_safetensors_close(f);
    return st;
}

static lpx_status st_get(const char *name, const lpx_kind *quantize_to)
{
    OOM_SETUP(ensure_model());
    lpx_safetensors *f = NULL;
    OOM_SETUP(lpx_safetensors_open(model_path, &f));
    lpx_tensor *t = NULL;
    lpx_status st = quantize_to ? OOM(lpx_safetensors_get_quantized(f, name, quantize_to, &t))
                                : OOM(lpx_safetensors_get(f, name, &t));
    OOM_OUT_NULL(st, t);
    lpx_safetensors_close(f);   /* tensors outlive the handle */
    if (!st) {
        lpx_tensor *d = NULL;
        OOM_CHECK(lpx_kind_to_dense(t, &d) == LPX_OK);
        lpx_tensor_release(d);
    }
    lpx_tensor_release(t);
    return st;
}
static lpx_status c_st_get_dense(int a) { (void)a; return st_get("dense.w", NULL); }
static lpx_status c_st_get_nf4(int a) { (void)a; return st_get("q4", NULL); }
static lpx_status c_st_get_float8(int a) { (void)a; return st_get("q8", NULL); }
static lpx_status c_st_get_quantized(int a) { (void)a; return st_get("strided", lpx_nf4_kind()); }
static lpx_status c_st_get_quantized_f8(int a) { (void)a; return st_get("dense.w", lpx_float8_kind()); }

/* ---- plugins -------------------------------------------------------------------- */

static const char *mx_path(void)
{
    const char *p = getenv("LPX_TEST_MX");
    if (!p || !p[0]) oom_failf(__FILE__, __LINE__, "LPX_TEST_MX (path of lpx-mx.so) is not set: run through meson test");
    return p && p[0] ? p : NULL;
}

static lpx_status c_plugin_load(int attempt)
{
    (void)attempt;
    const char *p = mx_path();
    if (!p) return LPX_EINVAL;
    const lpx_plugin *pl = NULL;
    lpx_status st = OOM(lpx_plugin_load(p, &pl));
    OOM_OUT_NULL(st, pl);
    /* the loader reports any failed init as LPX_EPLUGIN, naming init's own
     * status: an init that ran out of memory counts as LPX_ENOMEM here */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lpx_last_error());
    if (st == LPX_EPLUGIN && strstr(msg, "init failed: LPX_ENOMEM")) st = lpx_error(LPX_ENOMEM, "%s", msg);
    const lpx_kind *k;
    if (st) {
        OOM_CHECKF(lpx_kind_find("mxfp4", &k) == LPX_ENOTFOUND, "a failed load left kind mxfp4 behind");
        OOM_CHECKF(lpx_dtype_from_name("e8m0") < 0, "a failed load left dtype e8m0 behind");
    } else {
        OOM_CHECK(lpx_kind_find("mxfp4", &k) == LPX_OK);
    }
    return st;
}

static lpx_status c_plugin_find(int a)
{
    (void)a;
    const lpx_plugin *p = NULL;
    lpx_status st = OOM(lpx_plugin_find("mx", &p));
    OOM_CHECK(st || (p && !strcmp(lpx_plugin_name(p), "mx")));
    return st;
}

/* int: a scan that runs out of memory loads fewer plugins and records fewer
 * failures (each one's reason is dropped); that is this case's ENOMEM */
static lpx_status c_plugin_scan(int attempt)
{
    (void)attempt;
    const char *mx = mx_path();
    if (!mx) return LPX_EINVAL;
    char dir[512], link[600], broken[600];
    snprintf(dir, sizeof dir, "%s/plugins", oom_tmpdir());
    snprintf(link, sizeof link, "%s/lpx-mx.so", dir);
    snprintf(broken, sizeof broken, "%s/lpx-zz-broken.so", dir);
    if (files_in(dir) < 0) {
        mkdir(dir, 0700);
        OOM_CHECK(symlink(mx, link) == 0);
        FILE *f = fopen(broken, "wb");   /* not an ELF file: fails to load */
        if (f) fclose(f);
    }
    int skipped0 = lpx_plugin_skipped_count();
    int loaded = 0;
    (void)OOM((loaded = lpx_plugin_scan(dir), LPX_OK));
    int skipped = lpx_plugin_skipped_count() - skipped0;
    OOM_CHECKF(loaded <= 1 && skipped <= 1, "scan loaded %d, skipped %d", loaded, skipped);
    if (loaded < 1 || skipped < 1)
        return lpx_error(LPX_ENOMEM, "lpx_plugin_scan: loaded %d of 1, recorded %d of 1 failures (out of memory)",
                         loaded, skipped);
    return LPX_OK;
}

/* the plugin's kinds through the core entry points */
static lpx_status mx_from_dense(const char *kind)
{
    const lpx_kind *k = NULL;
    OOM_SETUP(lpx_kind_find(kind, &k));
    lpx_tensor *x = oom_randn2(64, 96, 11, LPX_BF16), *q = NULL, *d = NULL;
    lpx_status st = OOM(lpx_kind_from_dense(k, x, &q));
    OOM_OUT_NULL(st, q);
    if (!st) {
        st = OOM(lpx_kind_to_dense(q, &d));
        OOM_OUT_NULL(st, d);
    }
    lpx_tensor_release(d);
    lpx_tensor_release(q);
    lpx_tensor_release(x);
    return st;
}
static lpx_status c_mx_from_dense4(int a) { (void)a; return mx_from_dense("mxfp4"); }
static lpx_status c_mx_from_dense8(int a) { (void)a; return mx_from_dense("mxfp8"); }

static lpx_status c_mx_linear(int attempt)
{
    (void)attempt;
    const lpx_kind *k = NULL;
    OOM_SETUP(lpx_kind_find("mxfp4", &k));
    lpx_tensor *w = oom_randn2(32, 64, 12, LPX_F32), *x = oom_randn2(3, 64, 13, LPX_F32), *q = NULL, *o = NULL;
    OOM_SETUP(lpx_kind_from_dense(k, w, &q));
    lpx_status st = OOM(lpx_linear(x, q, NULL, &o));
    OOM_OUT_NULL(st, o);
    lpx_tensor_release(o);
    lpx_tensor_release(q);
    lpx_tensor_release(x);
    lpx_tensor_release(w);
    return st;
}

const oom_case oom_cases_io[] = {
    {"lpx_dlpack_dtype_to", NULL, c_dtype_to, 0},
    {"lpx_dlpack_dtype_from", NULL, c_dtype_from, 0},
    {"lpx_to_dlpack", "strided bf16", c_to_dlpack, 0},
    {"lpx_to_dlpack_legacy", "strided bf16", c_to_dlpack_legacy, 0},
    {"lpx_from_dlpack", "strided, offset", c_from_dlpack, 0},
    {"lpx_from_dlpack_legacy", "strided, offset", c_from_dlpack_legacy, 0},
    {"lpx_dlpack_flatten", "nf4", c_flatten_nf4, 0},
    {"lpx_dlpack_flatten", "float8", c_flatten_float8, 0},
    {"lpx_dlpack_unflatten", "nf4", c_unflatten_nf4, 0},
    {"lpx_dlpack_unflatten", "float8", c_unflatten_float8, 0},
    {"lpx_safetensors_save", "dense, strided, nf4, float8, metadata", c_st_save, 0},
    {"lpx_safetensors_open", NULL, c_st_open, 0},
    {"lpx_safetensors_get", "dense", c_st_get_dense, 0},
    {"lpx_safetensors_get", "nf4", c_st_get_nf4, 0},
    {"lpx_safetensors_get", "float8", c_st_get_float8, 0},
    {"lpx_safetensors_get_quantized", "bf16 -> nf4", c_st_get_quantized, 0},
    {"lpx_safetensors_get_quantized", "f32 -> float8", c_st_get_quantized_f8, 0},
    {"lpx_plugin_load", "lpx-mx.so", c_plugin_load, OOM_PERSISTENT},
    {"lpx_plugin_find", NULL, c_plugin_find, 0},
    {"lpx_plugin_scan", "lpx-mx.so (loaded) and a broken one", c_plugin_scan, OOM_PERSISTENT | OOM_OBSERVED},
    {"lpx_kind_from_dense", "mxfp4 (plugin kind), and back", c_mx_from_dense4, 0},
    {"lpx_kind_from_dense", "mxfp8 (plugin kind), and back", c_mx_from_dense8, 0},
    {"lpx_linear", "mxfp4 weight (plugin kernels)", c_mx_linear, 0},
    {NULL, NULL, NULL, 0},
};
