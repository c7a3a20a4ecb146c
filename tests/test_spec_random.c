/* A deterministic pseudo-random property test of the op spec (include/
 * lpx/op_args.h): every built-in op is called through lpx_dispatch with
 * many argument sets built from its schema (right and wrong tags, absent
 * optionals, NULL tensors, every built-in dtype, 0-d / empty / size-1 /
 * broadcastable / mismatched / huge shapes and dims, strided, transposed,
 * offset and stride-0 views, read-only tensors, lists of length 0, 1 and
 * mismatched, INT64_MIN/MAX, NaN/inf). Each call must either succeed (its
 * results released, nothing huge allocated) or fail with a non-zero status
 * and a message that starts with the op's name; a refusal writes no input
 * (checksums) and keeps no reference (refcounts); nothing crashes, hangs,
 * leaks or trips ASan/UBSan. The seed and the failing case are printed.
 * LPX_RAND_SEED / LPX_RAND_ITERS override the defaults; LPX_RAND_VERBOSE=1
 * prints every case before it runs. */
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/resource.h>
#include "spec_harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define RAND_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RAND_ASAN 1
#endif
#endif
#ifndef RAND_ASAN
#define RAND_ASAN 0
#endif

#define SEED_DEFAULT 0x5eed1234abcdull
#define MAX_TENSORS 256
#define RESULT_CAP_BYTES ((size_t)64 << 20)   /* no successful call returns more new memory */

/* ---- the case being run, for every failure report -------------------- */
static char cur_case[4096];
static size_t cur_len;
static uint64_t cur_seed;
static long cur_iter;

static void desc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void desc(const char *fmt, ...)
{
    if (cur_len >= sizeof cur_case - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cur_case + cur_len, sizeof cur_case - cur_len, fmt, ap);
    va_end(ap);
    if (n > 0) cur_len += (size_t)n;
    if (cur_len > sizeof cur_case - 1) cur_len = sizeof cur_case - 1;
}

static void print_case(void)
{
    char buf[4400];
    int n = snprintf(buf, sizeof buf, "\n  spec_random: seed 0x%llx iteration %ld: %s\n", (unsigned long long)cur_seed,
                     cur_iter, cur_case);
    if (n > 0) (void)!write(2, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
}

/* both sanitizers call this when they report; so does a crash or a hang */
void __sanitizer_report_error_summary(const char *summary);
void __sanitizer_report_error_summary(const char *summary)
{
    (void)!write(2, summary, strlen(summary));
    print_case();
}
void __ubsan_on_report(void);
void __ubsan_on_report(void) { print_case(); }
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1:max_allocation_size_mb=1024"; }
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "halt_on_error=1:print_stacktrace=1"; }

static void on_signal(int sig)
{
    const char *m = sig == SIGALRM ? "\n  spec_random: a call hung" : "\n  spec_random: crashed";
    (void)!write(2, m, strlen(m));
    print_case();
    signal(sig, SIG_DFL);
    raise(sig == SIGALRM ? SIGABRT : sig);
}

/* ---- pseudo-random numbers ------------------------------------------ */
static uint64_t rng;
static uint64_t rnext(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rint_(int n) { return (int)(rnext() % (uint64_t)n); }
static bool chance(int pct) { return rint_(100) < pct; }

/* ---- schemas ---------------------------------------------------------- */
enum { K_T, K_TOPT, K_TS, K_I, K_IOPT, K_IS, K_ISOPT, K_F, K_B, K_D, K_DEV };
typedef struct opinfo {
    lpx_op op;
    const char *name;
    int nargs;
    int kind[LPX_MAX_ARGS];
    char argname[LPX_MAX_ARGS][32];
} opinfo;

static int parse_kind(const char *ty)
{
    if (!strcmp(ty, "Tensor") || !strcmp(ty, "Tensor(host)")) return K_T;
    if (!strcmp(ty, "Tensor?") || !strcmp(ty, "Tensor(host)?")) return K_TOPT;
    if (!strcmp(ty, "Tensor[]")) return K_TS;
    if (!strcmp(ty, "int")) return K_I;
    if (!strcmp(ty, "int?")) return K_IOPT;
    if (!strcmp(ty, "int[]")) return K_IS;
    if (!strcmp(ty, "int[]?")) return K_ISOPT;
    if (!strcmp(ty, "float")) return K_F;
    if (!strcmp(ty, "bool")) return K_B;
    if (!strcmp(ty, "dtype")) return K_D;
    if (!strcmp(ty, "device")) return K_DEV;
    return -1;
}

static bool parse_schema(lpx_op op, opinfo *o)
{
    memset(o, 0, sizeof *o);
    o->op = op;
    o->name = lpx_op_name(op);
    const char *s = lpx_op_schema(op);
    const char *p = strchr(s, '(');
    const char *end = strstr(s, ") ->");
    if (!p || !end) return false;
    p++;
    while (p < end) {
        while (*p == ' ' || *p == ',') p++;
        if (p >= end) break;
        char ty[32] = {0}, nm[32] = {0};
        int i = 0;
        while (*p != ' ' && i < 31) ty[i++] = *p++;
        while (*p == ' ') p++;
        i = 0;
        while (p < end && *p != ',' && i < 31) nm[i++] = *p++;
        int k = parse_kind(ty);
        if (k < 0 || o->nargs >= LPX_MAX_ARGS) return false;
        o->kind[o->nargs] = k;
        snprintf(o->argname[o->nargs], sizeof o->argname[0], "%s", nm);
        o->nargs++;
    }
    return true;
}

/* ---- the tensors of one case ----------------------------------------- */
typedef struct tracked {
    lpx_tensor *base;   /* what was allocated: checksummed whole */
    uint64_t sum;
} tracked;

static lpx_tensor *args_t[MAX_TENSORS]; /* every tensor handed to the op */
static int args_ref[MAX_TENSORS];
static int nargs_t;
static tracked bases[MAX_TENSORS];
static int nbases;
static bool has_kind;   /* the call has a kind tensor argument */
static int rand_failures; /* the failed checks of the calls run so far (each reported with its case) */

static size_t esize(lpx_dtype d) { return (size_t)lpx_dtype_get(d)->bits / 8; }
static size_t nbytes_of(const lpx_tensor *t) { return lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t)); }

static uint64_t checksum(const lpx_tensor *t)
{
    const unsigned char *p = lpx_tensor_data(t);
    size_t n = nbytes_of(t);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static lpx_dtype all_dtypes[] = {LPX_F32, LPX_F16, LPX_BF16, LPX_F8E4M3FN, LPX_F8E5M2,
                                 LPX_U8,  LPX_I8,  LPX_I32,  LPX_I64,      LPX_BOOL, LPX_F32, LPX_F32};

/* Two plugin dtypes join the pool (slots 10, 11): an 8-bit float with
 * conversions, and a packed 4-bit one; a backend that has no code for
 * them must refuse them, never read them as a built-in. */
static void q8_to_f32(const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = (float)((const int8_t *)src)[i] / 16.0f;
}
static void q8_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    (void)flags;
    for (size_t i = 0; i < n; i++) {
        float v = src[i] * 16.0f;
        ((int8_t *)dst)[i] = (int8_t)(v != v ? 0 : v > 127 ? 127 : v < -128 ? -128 : v);
    }
}
static void u4_to_f32(const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = (float)((((const uint8_t *)src)[i / 2] >> (i % 2 * 4)) & 15);
}
static void u4_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    (void)flags;
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        float v = src[i];
        unsigned c = v != v || v < 0 ? 0 : v > 15 ? 15 : (unsigned)v;
        d[i / 2] = (uint8_t)((d[i / 2] & ~(15u << (i % 2 * 4))) | (c << (i % 2 * 4)));
    }
}
static void register_plugin_dtypes(void)
{
    static const lpx_dtype_traits q8 = {.struct_size = sizeof q8, .name = "rand_q8", .bits = 8, .block = 1,
                                        .is_float = true, .exp_bits = 0, .mant_bits = 4, .max = 127.0 / 16,
                                        .to_f32 = q8_to_f32, .from_f32 = q8_from_f32};
    static const lpx_dtype_traits u4 = {.struct_size = sizeof u4, .name = "rand_u4", .bits = 4, .block = 2,
                                        .max = 15, .to_f32 = u4_to_f32, .from_f32 = u4_from_f32};
    CHECK_OK(lpx_dtype_register(&q8, &all_dtypes[10]));
    CHECK_OK(lpx_dtype_register(&u4, &all_dtypes[11]));
}
#define NDTYPES ((int)(sizeof all_dtypes / sizeof *all_dtypes))

static void fill(lpx_tensor *t, bool index_like)
{
    lpx_dtype d = lpx_tensor_dtype(t);
    int64_t n = lpx_tensor_numel(t);
    unsigned char *p = lpx_tensor_data(t);
    if (chance(15) || d >= LPX_DTYPE_BUILTIN_COUNT) {   /* raw bytes: NaN, inf, huge indices */
        for (size_t i = 0; i < nbytes_of(t); i++) p[i] = (unsigned char)rnext();
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = index_like ? (float)(rint_(10) - 1) : (float)((int)(rnext() % 2001) - 1000) / 500.0f;
        if (!lpx_dtype_get(d)->is_float) v = d == LPX_BOOL ? (float)(rint_(2)) : (float)rint_(4);
        lpx_convert(p + (size_t)i * esize(d), d, &v, LPX_F32, 1, LPX_CONVERT_SATURATE);
    }
}

typedef struct shape_ctx {
    int ndim;
    int64_t shape[8];
    lpx_dtype dtype;
    bool huge_ok;   /* the op only views or allocates first: huge stride-0 views are refused fast */
} shape_ctx;

static const char *layout_names[] = {"contig", "transposed", "strided", "offset", "stride0", "huge0"};

static lpx_tensor *make_exact(const shape_ctx *sc, bool index_like, lpx_dtype d, int nd, const int64_t *shape_in);

/* A tensor for argument `name`, or NULL when the allocation failed. */
static lpx_tensor *make_tensor(const shape_ctx *sc, const char *name)
{
    if (nargs_t && nargs_t < MAX_TENSORS && chance(6)) {   /* aliasing: a tensor already given */
        lpx_tensor *t = args_t[rint_(nargs_t)];
        if (t && lpx_tensor_numel(t) <= 4096) {   /* a huge stride-0 one as an out: legitimately slow */
            lpx_tensor_retain(t);
            args_t[nargs_t++] = t;
            desc("(alias)");
            return t;
        }
    }
    bool index_like = !strcmp(name, "indices") || !strcmp(name, "target");
    int nd = sc->ndim;
    int64_t sh[8];
    memcpy(sh, sc->shape, sizeof sh);
    int r = rint_(100);
    if (r < 55) {
    } else if (r < 68) {   /* broadcastable: dims to 1, or fewer leading dims */
        for (int i = 0; i < nd; i++)
            if (chance(40)) sh[i] = 1;
        if (nd && chance(40)) {
            int drop = 1 + rint_(nd);
            memmove(sh, sh + drop, sizeof(int64_t) * (size_t)(nd - drop));
            nd -= drop;
        }
    } else if (r < 75) {   /* reversed */
        for (int i = 0; i < nd / 2; i++) {
            int64_t tmp = sh[i];
            sh[i] = sh[nd - 1 - i];
            sh[nd - 1 - i] = tmp;
        }
    } else if (r < 90) {   /* random */
        nd = rint_(5);
        for (int i = 0; i < nd; i++) sh[i] = (int64_t[]){0, 1, 2, 3, 4, 5, 8, 16}[rint_(8)];
        if (chance(25)) {   /* up to LPX_MAX_DIMS dims */
            nd = 5 + rint_(4);
            for (int i = 0; i < nd; i++) sh[i] = 1 + rint_(2);
        }
    } else if (r < 95) {   /* one more dim */
        if (nd < 8) {
            memmove(sh + 1, sh, sizeof(int64_t) * (size_t)nd);
            sh[0] = 1 + rint_(3);
            nd++;
        }
    } else {   /* empty */
        if (nd) sh[rint_(nd)] = 0;
    }
    lpx_dtype d = sc->dtype;
    if (index_like) d = chance(70) ? LPX_I64 : chance(50) ? LPX_I32 : all_dtypes[rint_(NDTYPES)];
    else if (chance(15)) d = all_dtypes[rint_(NDTYPES)];

    /* a huge stride-0 out is written element by element: legitimately slow */
    shape_ctx sc2 = *sc;
    if (!strcmp(name, "out") || !strcmp(name, "dst")) sc2.huge_ok = false;
    if (chance(8) && (d == LPX_F32 || d == LPX_BF16 || d == LPX_F16) && nargs_t < MAX_TENSORS - 1) {
        /* a kind tensor (float8, tensorwise) of that shape: its kind's
         * kernels, fallback or refusal take the call */
        int64_t n = 1;
        for (int i = 0; i < nd; i++) n *= sh[i];
        lpx_tensor *x = NULL, *k = NULL;
        if (n <= 4096 && !lpx_tensor_new(d, nd, sh, lpx_cpu(), &x)) {
            unsigned char *p = lpx_tensor_data(x);
            for (int64_t i = 0; i < n; i++) {
                float v = (float)rint_(9) - 4;
                lpx_convert(p + (size_t)i * esize(d), d, &v, LPX_F32, 1, 0);
            }
            /* float8 tensorwise, axiswise or block (1 x 2, 2 x 2), or nf4 */
            int kind = rint_(5);
            lpx_float8_quant_opts qo;
            memset(&qo, 0, sizeof qo);
            qo.struct_size = sizeof qo;
            qo.granularity = kind == 1 ? LPX_FLOAT8_AXISWISE : kind >= 2 ? LPX_FLOAT8_BLOCK : LPX_FLOAT8_TENSORWISE;
            qo.axis = -1;
            qo.block_rows = kind == 3 ? 2 : 1;
            qo.block_cols = 2;
            if (kind == 2) qo.block_rows = 1;
            lpx_status st = kind == 4 ? lpx_nf4_quantize(x, NULL, &k) : lpx_float8_quantize(x, &qo, &k, NULL);
            lpx_tensor_release(x);
            if (!st) {
                has_kind = true;
                args_t[nargs_t++] = k;
                desc("%s<%s>[", kind == 4 ? "nf4" : (const char *[]){"f8", "f8axis", "f8blk1x2", "f8blk2x2"}[kind],
                     lpx_dtype_name(d));
                for (int i = 0; i < nd; i++) desc(i ? ",%lld" : "%lld", (long long)sh[i]);
                desc("]");
                return k;
            }
        }
    }
    return make_exact(&sc2, index_like, d, nd, sh);
}

/* A tensor of exactly this dtype and shape, in a random layout, with
 * random data; NULL when the allocation failed. */
static lpx_tensor *make_exact(const shape_ctx *sc, bool index_like, lpx_dtype d, int nd, const int64_t *shape_in)
{
    if (nargs_t >= MAX_TENSORS || nbases >= MAX_TENSORS) return NULL;
    int64_t sh[8] = {0};
    memcpy(sh, shape_in, sizeof(int64_t) * (size_t)nd);
    int layout = rint_(100);
    layout = layout < 70 ? 0 : layout < 80 ? 1 : layout < 88 ? 2 : layout < 93 ? 3 : layout < 98 ? 4 : 5;
    if (layout == 1 && nd < 2) layout = 0;
    if ((layout == 2 || layout == 3) && nd < 1) layout = 0;
    if (layout == 5 && (!sc->huge_ok || nd < 1)) layout = 4;

    int64_t bsh[8];
    memcpy(bsh, sh, sizeof bsh);
    int64_t st[8];
    int64_t off = 0;
    int bnd = nd;
    if (layout == 1) {
        bsh[nd - 2] = sh[nd - 1];
        bsh[nd - 1] = sh[nd - 2];
    } else if (layout == 2) {
        bsh[nd - 1] = 2 * sh[nd - 1] + 1;
    } else if (layout == 3) {
        bsh[0] = sh[0] + 1;
    } else if (layout >= 4) {
        bnd = 1;
        bsh[0] = 1;
    }
    lpx_tensor *base = NULL, *t = NULL;
    if (nbases && chance(8)) {   /* overlapping aliasing: a view into an earlier tensor's storage */
        lpx_tensor *prev = bases[rint_(nbases)].base;
        int64_t cst[8], acc = 1;
        for (int i = nd - 1; i >= 0; i--) {
            cst[i] = acc;
            acc *= sh[i] ? sh[i] : 1;
        }
        if (lpx_tensor_dtype(prev) == d &&
            !lpx_tensor_view_of(prev, nd, sh, cst, rint_(3), &t)) {
            lpx_tensor_retain(prev);
            bases[nbases].base = prev;
            bases[nbases].sum = checksum(prev);
            nbases++;
            args_t[nargs_t++] = t;
            desc("%s[", lpx_dtype_name(d));
            for (int i = 0; i < nd; i++) desc(i ? ",%lld" : "%lld", (long long)sh[i]);
            desc("]overlap");
            return t;
        }
        t = NULL;
    }
    if (lpx_tensor_new(d, bnd, bsh, lpx_cpu(), &base)) return NULL;
    fill(base, index_like);
    if (layout == 0) {
        t = base;
        lpx_tensor_retain(t);
    } else {
        int64_t acc = 1;
        for (int i = bnd - 1; i >= 0; i--) {
            st[i] = acc;
            acc *= bsh[i] ? bsh[i] : 1;
        }
        int64_t vst[8];
        memcpy(vst, st, sizeof vst);
        if (layout == 1) {
            vst[nd - 2] = st[nd - 1];
            vst[nd - 1] = st[nd - 2];
        } else if (layout == 2) {
            vst[nd - 1] = 2;
            off = 1;
        } else if (layout == 3) {
            off = st[0];
        } else {
            for (int i = 0; i < nd; i++) vst[i] = 0;
            if (layout == 5) {   /* numel > 2^40: anything that allocates it is refused */
                sh[0] = (int64_t)1 << (41 + rint_(20));
                if (chance(30)) sh[0] = INT64_MAX / 2;
            }
        }
        if (lpx_tensor_view_of(base, nd, sh, vst, off, &t)) {
            lpx_tensor_release(base);
            return NULL;
        }
    }
    if (chance(5)) lpx_tensor_mark_readonly(base);
    bases[nbases].base = base;
    bases[nbases].sum = checksum(base);
    nbases++;
    desc("%s[", lpx_dtype_name(d));
    for (int i = 0; i < nd; i++) desc(i ? ",%lld" : "%lld", (long long)sh[i]);
    desc("]%s%s", layout ? layout_names[layout] : "", lpx_tensor_is_readonly(base) ? ",ro" : "");
    args_t[nargs_t] = t;
    nargs_t++;
    return t;
}

static int64_t rand_int(const shape_ctx *sc)
{
    int r = rint_(100);
    if (r < 45) return rint_(9) - 3;
    if (r < 60) return (int64_t[]){0, 1, 2, 4, 8, 16, 32, 64, 128, 256}[rint_(10)];
    if (r < 70 && sc->ndim) return sc->shape[rint_(sc->ndim)];
    if (r < 85)
        return (int64_t[]){INT64_MIN,       INT64_MAX,  INT32_MAX, INT32_MIN,           (int64_t)INT32_MAX + 1,
                           (int64_t)1 << 62, -((int64_t)1 << 62), -1, INT64_MIN + 1, INT64_MAX - 1, (int64_t)1 << 33,
                           (int64_t)1 << 40}[rint_(12)];
    return (int64_t)(rnext() % 41) - 20;
}

static double rand_float(const char *name)
{
    int r = rint_(100);
    /* arange's step: a tiny one is a legitimately huge result, not a test of the spec */
    if (!strcmp(name, "step") && r < 80) return (rint_(2) ? 1 : -1) * (0.25 + (double)rint_(8) / 4);
    if (r < 70) return (double)((int)(rnext() % 2001) - 1000) / 500.0;
    if (r < 80) return (double[]){0.0, 1.0, 0.5, 1e-5, 0.9, 0.999, 1e-8, 448.0}[rint_(8)];
    return (double[]){NAN, INFINITY, -INFINITY, -0.0, 1e308, -1e308, 1e-310, DBL_MAX, -DBL_MAX, 1e19, -1e19,
                      9.3e18}[rint_(12)];
}


typedef struct call_store {
    lpx_value v[LPX_MAX_ARGS + 1];
    int64_t ints[LPX_MAX_ARGS][128];
    lpx_tensor *lists[LPX_MAX_ARGS][24];
} call_store;

/* ---- good argument sets (the spec tests' tables), mutated ----------- */
#define E4 LPX_F8E4M3FN
#define E5 LPX_F8E5M2
#define F32 LPX_F32
#define I32 LPX_I32
#define PAYLOAD T(LPX_U8, 1, 64), T(LPX_I8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1)
#define HP F(1e-3), F(0.9), F(0.999), F(1e-8), F(0.0)
#define P300 S(1, TA(LPX_F32, 2, 3, 100))
#define G300 S(1, TA(LPX_BF16, 1, 300))
#define C300 S(1, TA(LPX_U8, 1, 300))
#define C150 S(1, TA(LPX_U8, 1, 150))
#define H300 S(1, TA(LPX_F16, 1, 300))
#define SC3 S(1, TA(LPX_F32, 1, 3))
#define AS8(...) {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), __VA_ARGS__}
static const bad_case templates[] = {
    {"fp8_quantize", 7, {T(LPX_BF16, 2, 2, 3), NONE, D(E4), NONE, B(1), F(448), B(1)}, LPX_OK, NULL},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 2, 1), D(E5), I(-1), B(0), F(0), B(0)}, LPX_OK, NULL},
    {"fp8_quantize", 7, {T(LPX_F16, 0, 0), T(LPX_F32, 1, 1), D(E4), NONE, B(0), F(0), B(1)}, LPX_OK, NULL},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(1), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 2, 3, 1), T(LPX_F32, 2, 3, 1)}, LPX_OK, NULL},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 0, 0), D(E5), B(0), B(0), F(0), B(1), T(E5, 2, 3, 2),
                            T(LPX_F32, 1, 1), T(LPX_F32, 0, 0)}, LPX_OK, NULL},
    {"fp8_dequantize", 3, {T(E4, 2, 2, 3), T(LPX_F32, 2, 2, 1), D(LPX_BF16)}, LPX_OK, NULL},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 2, 2, 1), T(E5, 2, 3, 4), T(LPX_F32, 2, 1, 4),
                          T(LPX_F32, 1, 4), D(LPX_BF16), B(1)}, LPX_OK, NULL},
    {"fp8_scale_from_amax", 4, {T(LPX_F32, 1, 3), D(E4), B(1), F(0)}, LPX_OK, NULL},
    {"fp8_quantize_block", 6, {T(LPX_F32, 2, 5, 8), D(E4), I(4), I(4), B(0), B(1)}, LPX_OK, NULL},
    {"fp8_dequantize_block", 5, {T(E4, 2, 5, 8), T(LPX_F32, 2, 2, 2), I(4), I(4), D(LPX_F16)}, LPX_OK, NULL},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E5, 2, 8, 3), T(LPX_F32, 2, 2, 1),
                          I(4), I(128), T(LPX_F32, 1, 3), D(LPX_F32)}, LPX_OK, NULL},
    {"nf4_quantize", 3, {T(LPX_F32, 1, 100), I(64), I(2)}, LPX_OK, NULL},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(10), I(100), D(LPX_F16), T(LPX_F16, 2, 10, 10)}, LPX_OK, NULL},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(0), I(128), D(LPX_F32), NONE}, LPX_OK, NULL},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), PAYLOAD, I(64), I(2), I(8), I(16), B(1), T(LPX_F32, 1, 8)}, LPX_OK, NULL},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 8), PAYLOAD, I(64), I(2), I(8), I(16), B(0), NONE}, LPX_OK, NULL},
    {"qlora_dropout", 4, {T(LPX_BF16, 2, 2, 3), F(0.1), I(7), D(LPX_F32)}, LPX_OK, NULL},
    {"matmul", 3, {T(F32, 2, 2, 3), T(F32, 2, 3, 4), NONE}, 0, NULL},
    {"matmul", 3, {T(F32, 3, 2, 2, 3), T(F32, 2, 3, 4), T(F32, 3, 2, 2, 4)}, 0, NULL},
    {"matmul", 3, {T(LPX_BF16, 1, 3), T(LPX_BF16, 2, 3, 4), NONE}, 0, NULL},
    {"linear", 3, {T(F32, 3, 2, 2, 3), T(LPX_BF16, 2, 4, 3), T(LPX_F16, 1, 4)}, 0, NULL},
    {"linear", 3, {T(F32, 1, 3), T(F32, 2, 4, 3), NONE}, 0, NULL},
    {"addmm", 5, {T(F32, 1, 4), T(F32, 2, 2, 3), T(F32, 2, 3, 4), F(0.5), F(2)}, 0, NULL},
    {"addmm", 5, {T(F32, 2, 2, 4), T(F32, 2, 2, 3), T(F32, 2, 3, 4), F(0), F(1)}, 0, NULL},
    {"rmsnorm", 3, {T(LPX_BF16, 3, 2, 3, 4), T(F32, 1, 4), F(1e-6)}, 0, NULL},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), NONE, T(F32, 2, 2, 1)}, 0, NULL},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), T(F32, 1, 4), T(F32, 2, 2, 1)}, 0, NULL},
    {"softmax_backward", 3, {T(F32, 2, 2, 4), T(F32, 2, 2, 4), I(-1)}, 0, NULL},
    {"cross_entropy", 3, {T(LPX_BF16, 2, 2, 5), T(I32, 1, 2), I(-100)}, 0, NULL},
    {"cross_entropy_backward", 4, {T(F32, 2, 2, 5), T(LPX_I64, 1, 2), I(0), F(0.5)}, 0, NULL},
    {"embedding", 2, {T(I32, 2, 5, 3), T(LPX_I64, 2, 2, 4)}, 0, NULL},
    {"embedding_backward", 3, {T(F32, 3, 2, 4, 3), T(I32, 2, 2, 4), I(8)}, 0, NULL},
    {"rope", 3, {T(LPX_BF16, 4, 1, 2, 2, 4), T(F32, 1, 2), I(7)}, 0, NULL},
    {"rope_backward", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(0)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 2, 4, 8), T(F32, 4, 1, 3, 2, 8), T(F32, 4, 1, 3, 2, 8), B(1), F(0.25)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 2, 3, 4), T(F32, 4, 1, 2, 3, 4), T(F32, 4, 1, 2, 3, 4), B(0), F(0.5)}, 0, NULL},
    {"attention_backward", 8, {T(LPX_BF16, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 2, 4), T(F32, 4, 1, 2, 1, 4),
                               T(F32, 4, 1, 2, 1, 4), T(LPX_F16, 4, 1, 2, 2, 4), T(F32, 3, 1, 2, 2), B(0), F(0.5)},
     0, NULL},
    {"swiglu_backward", 3, {T(LPX_BF16, 2, 2, 3), T(F32, 2, 2, 3), T(LPX_F16, 2, 2, 3)}, 0, NULL},
    {"adamw_", 10, {S(2, TA(LPX_F32, 1, 4), TA(LPX_BF16, 2, 2, 3)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F16, 1, 6)),
                    S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)), S(2, TA(LPX_F32, 1, 4), TA(LPX_F32, 1, 6)), HP, I(3)},
     0, NULL},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    S(1, TA(LPX_F32, 1, 4)), HP, I(1)}, 0, NULL},
    {"adamw_state_", 16, AS8(L(1, 0), S(0, )), 0, NULL},
    {"adamw_state_", 16, {P300, G300, C150, SC3, C150, SC3, I(1), I(128), HP, I(7), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, H300, SC3, I(2), I(128), HP, I(2), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {S(1, TA(LPX_BF16, 1, 300)), G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1),
                          L(4, 1, 42, 3, 1000), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {S(1, TA(LPX_F16, 1, 300)), G300, C300, SC3, H300, SC3, I(2), I(128), HP, I(1),
                          L(4, 3, 42, 3, 1000), SC3}, 0, NULL},
    {"cat", 2, {S(3, TA(LPX_F32, 1, 0), TA(LPX_F32, 2, 2, 3), TA(LPX_F32, 2, 1, 3)), I(0)}, LPX_OK, NULL},
    {"cat", 2, {S(2, TA(LPX_F32, 2, 2, 3), TA(LPX_F32, 2, 2, 1)), I(-1)}, LPX_OK, NULL},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(0), I(-2), I(2)}, LPX_OK, NULL},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(1), I(-100), I(100), I(3)}, LPX_OK, NULL},
    {"transpose", 3, {T(LPX_F32, 3, 2, 3, 4), I(-1), I(0)}, LPX_OK, NULL},
    {"permute", 2, {T(LPX_F32, 3, 2, 3, 4), L(3, 2, 0, 1)}, LPX_OK, NULL},
};

/* An int like a template's: nudged, or anything. */
static int64_t nudge(int64_t v, const shape_ctx *sc)
{
    int r = rint_(100);
    if (r < 50) return v + (rint_(2) ? 1 : -1);
    if (r < 65) return -v;
    if (r < 75) return 0;
    return rand_int(sc);
}

/* Template argument `a` for schema argument i; `mut` (1) nudges a
 * tensor's shape or dtype, an int, a list. */
static void from_template(const opinfo *o, int i, const arg *a, bool mut, const shape_ctx *sc, call_store *cs,
                          bool *alloc_failed)
{
    lpx_value *v = &cs->v[i];
    bool index_like = !strcmp(o->argname[i], "indices") || !strcmp(o->argname[i], "target");
    switch (a->kind) {
    case 'T':
    case 'S': {
        int n = a->kind == 'T' ? 1 : (int)a->i;
        if (a->kind == 'S') desc("[");
        int which = mut && n ? rint_(n) : -1;
        if (mut && a->kind == 'S' && chance(40)) {   /* a list one longer or shorter */
            n = chance(50) && n < 4 ? n + 1 : n > 0 ? n - 1 : 0;
            which = -1;
        }
        for (int j = 0; j < n; j++) {
            targ t = a->kind == 'T' ? a->t : a->ts[j < (int)a->i ? j : 0];
            if (j == which) {
                int r = rint_(100);
                if (r < 40 && t.ndim) t.shape[rint_(t.ndim)] = (int64_t[]){0, 1, 2, 3, 5, 7, 16, 128}[rint_(8)];
                else if (r < 55 && t.ndim) t.shape[rint_(t.ndim)] += 1;
                else if (r < 65 && t.ndim) t.ndim--;
                else if (r < 75 && t.ndim < 4) t.shape[t.ndim++] = 1 + rint_(3);
                else t.dtype = all_dtypes[rint_(NDTYPES)];
            }
            if (j) desc(" ");
            lpx_tensor *x = make_exact(sc, index_like, t.dtype, t.ndim, t.shape);
            if (!x) *alloc_failed = true;
            if (a->kind == 'T') *v = lpx_v_tensor(x);
            else cs->lists[i][j] = x;
        }
        if (a->kind == 'S') {
            desc("]");
            *v = lpx_v_tensors(cs->lists[i], (uint32_t)n);
        }
        break;
    }
    case 'N': *v = lpx_v_none(); desc("none"); break;
    case 'I': *v = lpx_v_i64(mut ? nudge(a->i, sc) : a->i); desc("%lld", (long long)v->u.i); break;
    case 'F': *v = lpx_v_f64(mut ? rand_float(o->argname[i]) : a->f); desc("%g", v->u.f); break;
    case 'B': *v = lpx_v_bool(mut ? !a->i : a->i != 0); desc("%s", v->u.b ? "true" : "false"); break;
    case 'D': {
        lpx_dtype d = mut ? all_dtypes[rint_(NDTYPES)] : (lpx_dtype)a->i;
        *v = lpx_v_dtype(d);
        desc("%s", lpx_dtype_name(d));
        break;
    }
    case 'V': *v = lpx_v_device(lpx_cpu()); desc("cpu"); break;
    case 'L': {
        int n = (int)a->i;
        memcpy(cs->ints[i], a->list, sizeof a->list);
        if (mut && n && chance(70)) {
            int j = rint_(n);
            cs->ints[i][j] = nudge(cs->ints[i][j], sc);
        } else if (mut) {
            n = chance(50) && n < 4 ? n + 1 : n > 0 ? n - 1 : 0;
            if (n) cs->ints[i][n - 1] = rint_(4) - 1;
        }
        *v = lpx_v_ints(cs->ints[i], (uint32_t)n);
        desc("{");
        for (int j = 0; j < n; j++) desc(j ? ",%lld" : "%lld", (long long)cs->ints[i][j]);
        desc("}");
        break;
    }
    }
}

/* ---- one call --------------------------------------------------------- */

static const char *views_ops[] = {"view",  "reshape",  "transpose", "t",     "permute", "slice", "narrow",
                                  "expand", "contiguous", "clone",     "detach", "neg",     "abs",   "cast",
                                  "add",   "mul",      "mul_scalar", NULL};

static bool in_list(const char *name, const char *const *l)
{
    for (; *l; l++)
        if (!strcmp(*l, name)) return true;
    return false;
}

static long n_ok, n_refused, n_nomem, n_skipped, n_kind_msg;
static const bad_case *force_tp;   /* a probe: these arguments, unmutated */
static long op_ok[LPX_MAX_OPS], op_refused[LPX_MAX_OPS];

static void run_one(const opinfo *o)
{
    call_store cs;
    memset(&cs, 0, sizeof cs);
    cur_len = 0;
    cur_case[0] = 0;
    nargs_t = 0;
    nbases = 0;
    has_kind = false;
    desc("%s(", o->name);

    shape_ctx sc;
    sc.ndim = rint_(100) < 10 ? 0 : 1 + rint_(rint_(100) < 70 ? 3 : 4);
    for (int i = 0; i < sc.ndim; i++) sc.shape[i] = (int64_t[]){1, 2, 2, 3, 3, 4, 4, 5, 8, 16, 0}[rint_(11)];
    if (sc.ndim == 4 && chance(50)) sc.shape[3] = 128 + 32 * rint_(3);
    sc.dtype = chance(60) ? LPX_F32 : all_dtypes[rint_(NDTYPES)];
    sc.huge_ok = in_list(o->name, views_ops);
    int list_len = chance(10) ? 0 : chance(60) ? 1 : 1 + rint_(3);
    bool alloc_failed = false;

    const bad_case *tp = force_tp;
    bool mut[LPX_MAX_ARGS] = {0};
    if (tp) desc("<probe> ");
    else if (chance(60)) {
        int cnt = 0;
        for (size_t j = 0; j < sizeof templates / sizeof *templates; j++)
            if (!strcmp(templates[j].op, o->name) && !rint_(++cnt)) tp = &templates[j];
        if (tp) {
            desc("<template %d> ", (int)(tp - templates));
            int nm = chance(25) ? 0 : 1 + rint_(2);
            for (int j = 0; j < nm; j++) mut[rint_(o->nargs)] = true;
        }
    }
    int nargs = o->nargs;
    for (int i = 0; i < nargs; i++) {
        desc("%s%s=", i ? ", " : "", o->argname[i]);
        int k = o->kind[i];
        if (tp && (!mut[i] || chance(50))) {
            from_template(o, i, &tp->args[i], mut[i], &sc, &cs, &alloc_failed);
            continue;
        }
        lpx_value *v = &cs.v[i];
        if (chance(2)) {   /* a wrong tag */
            int w = rint_(8);
            switch (w) {
            case 0: *v = lpx_v_none(); desc("NONE"); break;
            case 1: *v = lpx_v_i64(1); desc("I64(1)"); break;
            case 2: *v = lpx_v_f64(1.0); desc("F64(1)"); break;
            case 3: *v = lpx_v_str("x"); desc("STR"); break;
            case 4: *v = lpx_v_ptr(NULL); desc("PTR(NULL)"); break;
            case 5: *v = lpx_v_ints(NULL, 3); desc("INTS(NULL,3)"); break;
            case 6: *v = lpx_v_tensors(NULL, 2); desc("TENSORS(NULL,2)"); break;
            default:
                *v = lpx_v_none();
                v->tag = (uint16_t)(77 + rint_(1000));
                desc("tag %u", v->tag);
                break;
            }
            continue;
        }
        switch (k) {
        case K_T:
        case K_TOPT: {
            if (k == K_TOPT && chance(40)) {
                *v = lpx_v_none();
                desc("none");
                break;
            }
            if (chance(2)) {
                *v = lpx_v_tensor(NULL);
                desc("NULL");
                break;
            }
            lpx_tensor *t = make_tensor(&sc, o->argname[i]);
            if (!t) alloc_failed = true;
            *v = lpx_v_tensor(t);
            break;
        }
        case K_TS: {
            int n = chance(85) ? list_len : chance(80) ? rint_(4) : 5 + rint_(19);   /* long lists too */
            desc("[");
            for (int j = 0; j < n; j++) {
                if (j) desc(" ");
                cs.lists[i][j] = make_tensor(&sc, o->argname[i]);
                if (!cs.lists[i][j]) alloc_failed = true;
            }
            desc("]");
            if (n && chance(2)) {
                int j = rint_(n);
                desc("(entry %d NULL)", j);
                cs.lists[i][j] = NULL;   /* make_tensor tracked it for release */
            }
            *v = lpx_v_tensors(cs.lists[i], (uint32_t)n);
            break;
        }
        case K_I:
        case K_IOPT:
            if (k == K_IOPT && chance(30)) {
                *v = lpx_v_none();
                desc("none");
                break;
            }
            *v = lpx_v_i64(rand_int(&sc));
            desc("%lld", (long long)v->u.i);
            break;
        case K_IS:
        case K_ISOPT: {
            if (k == K_ISOPT && chance(30)) {
                *v = lpx_v_none();
                desc("none");
                break;
            }
            int n;
            int r = rint_(100);
            if (r < 40 && sc.ndim) {   /* a shape or dims like x's */
                n = sc.ndim;
                for (int j = 0; j < n; j++) cs.ints[i][j] = chance(50) ? sc.shape[j] : j;
                if (chance(30)) cs.ints[i][rint_(n)] = chance(50) ? -1 : rand_int(&sc);
                if (chance(30)) {   /* reversed */
                    for (int j = 0; j < n / 2; j++) {
                        int64_t tmp = cs.ints[i][j];
                        cs.ints[i][j] = cs.ints[i][n - 1 - j];
                        cs.ints[i][n - 1 - j] = tmp;
                    }
                }
            } else {
                n = chance(15) ? 0 : chance(4) ? 9 + rint_(119) : 1 + rint_(chance(5) ? 8 : 4);   /* > LPX_MAX_DIMS too */
                for (int j = 0; j < n; j++) cs.ints[i][j] = chance(60) ? rint_(6) - 1 : rand_int(&sc);
            }
            *v = lpx_v_ints(cs.ints[i], (uint32_t)n);
            desc("{");
            for (int j = 0; j < n; j++) desc(j ? ",%lld" : "%lld", (long long)cs.ints[i][j]);
            desc("}");
            break;
        }
        case K_F:
            *v = lpx_v_f64(rand_float(o->argname[i]));
            desc("%g", v->u.f);
            break;
        case K_B:
            *v = lpx_v_bool(chance(50));
            desc("%s", v->u.b ? "true" : "false");
            break;
        case K_D: {
            int r = rint_(100);
            lpx_dtype d = r < 90 ? all_dtypes[rint_(NDTYPES)] : (lpx_dtype)(int[]){-1, 40, 63, 64, 1000, INT32_MIN}[rint_(6)];
            *v = lpx_v_dtype(d);
            if (lpx_dtype_valid(d)) desc("%s", lpx_dtype_name(d));
            else desc("dtype %d", (int)d);
            break;
        }
        case K_DEV: {
            lpx_device dev = lpx_cpu();
            if (chance(5)) dev.type = 99;
            if (chance(5)) dev.index = 7;
            *v = lpx_v_device(dev);
            desc("dev(%d,%d)", (int)dev.type, (int)dev.index);
            break;
        }
        }
    }
    if (chance(1)) {
        nargs += chance(50) ? 1 : -1;
        if (nargs > o->nargs) cs.v[o->nargs] = lpx_v_i64(0);
        desc(" | nargs %d", nargs);
    }
    desc(")");
    for (int j = 0; j < nargs_t; j++) args_ref[j] = args_t[j] ? lpx_tensor_refcount(args_t[j]) : 0;

    if (getenv("LPX_RAND_VERBOSE")) fprintf(stderr, "%ld %s\n", cur_iter, cur_case);
    if (alloc_failed) {
        n_skipped++;
    } else {
        lpx_clear_error();
        lpx_call c;
        lpx_call_init(&c, o->op, cs.v, nargs < 0 ? 0 : nargs);
        alarm(RAND_ASAN ? 30 : 10);
        lpx_status st = lpx_dispatch(&c);
        alarm(0);
        if (st == LPX_OK) {
            n_ok++;
            op_ok[o->op]++;
            for (int r = 0; r < c.nrets; r++) {
                if (c.rets[r].tag != LPX_TAG_TENSOR) continue;
                lpx_tensor *t = c.rets[r].u.t;
                CHECKF(t != NULL, "%s: ret %d is a NULL tensor", o->name, r);
                if (!t || lpx_tensor_kind(t)) continue;
                bool shares = false;
                for (int j = 0; j < nargs_t; j++)
                    if (args_t[j] && lpx_tensor_shares_storage(t, args_t[j])) shares = true;
                size_t nb = lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
                CHECKF(shares || nb <= RESULT_CAP_BYTES, "%s: ret %d allocated %zu bytes", o->name, r, nb);
            }
            lpx_call_release_rets(&c);
        } else {
            n_refused++;
            op_refused[o->op]++;
            if (st == LPX_ENOMEM) n_nomem++;
            if (getenv("LPX_RAND_MSGS")) fprintf(stderr, "  refused: %s\n", lpx_last_error());
            const char *m = lpx_last_error();
            size_t ln = strlen(o->name);
            CHECKF(m && m[0], "%s refused (%s) without a message", o->name, lpx_status_string(st));
            bool named = m && !strncmp(m, o->name, ln) && (m[ln] == ':' || m[ln] == ' ' || m[ln] == '(');
            /* the kinds' kernels (subclasses/) compose other ops and pass
             * their messages on: counted and reported, not failed here */
            if (!named && has_kind) {
                if (getenv("LPX_RAND_KIND_MSGS")) fprintf(stderr, "  kind call %s: '%s'\n", cur_case, m);
                n_kind_msg++;
            } else {
                CHECKF(named, "%s refused (%s): the message does not start with the op's name: '%s'", o->name,
                       lpx_status_string(st), m ? m : "(null)");
            }
            for (int j = 0; j < nbases; j++)
                CHECKF(checksum(bases[j].base) == bases[j].sum, "%s refused (%s: %s) but wrote input tensor %d",
                       o->name, lpx_status_string(st), m, j);
        }
        for (int j = 0; j < nargs_t; j++)
            if (args_t[j])
                CHECKF(lpx_tensor_refcount(args_t[j]) == args_ref[j], "%s (%s): tensor %d's refcount %d -> %d",
                       o->name, st ? "refused" : "ok", j, args_ref[j], lpx_tensor_refcount(args_t[j]));
    }
    if (check_case_failures) {
        print_case();
        rand_failures += check_case_failures;
        check_case_failures = 0;
        /* keep going: every failure is reported with its case */
    }
    for (int j = 0; j < nargs_t; j++) lpx_tensor_release(args_t[j]);
    for (int j = 0; j < nbases; j++) lpx_tensor_release(bases[j].base);
}


/* ---- the bugs the random calls found, pinned -------------------------- */

/* Runs op on args: refused with `want`, the message starting "<op>:", and
 * every tensor in ts (n) unchanged. */
static void refused_clean(const char *opn, lpx_value *args, int nargs, lpx_status want, lpx_tensor **ts, int n)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(opn, &op));
    uint64_t sums[8];
    for (int i = 0; i < n; i++) sums[i] = checksum(ts[i]);
    lpx_call c;
    lpx_call_init(&c, op, args, nargs);
    lpx_status st = lpx_dispatch(&c);
    if (!st) lpx_call_release_rets(&c);
    const char *m = lpx_last_error();
    size_t ln = strlen(opn);
    CHECKF(st == want, "%s: status %d, want %d (%s)", opn, st, want, m);
    CHECKF(!strncmp(m, opn, ln) && m[ln] == ':', "%s: message '%s'", opn, m);
    for (int i = 0; i < n; i++) CHECKF(checksum(ts[i]) == sums[i], "%s: tensor %d was written", opn, i);
}

/* fp8_quantize_t with a read-only qt / scale_t / scale_inv_t: the kernel
 * wrote qt (and scale_t) before copy_ refused the read-only one, with a
 * copy_ message; its contract and data checks were named fp8_quantize. */
static void test_fp8_quantize_t_refusals(void)
{
    lpx_tensor *x = NULL, *qt = NULL, *s = NULL, *si = NULL, *bad = NULL;
    CHECK_OK(lpx_full(2, (const int64_t[]){2, 3}, 1.5, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_zeros(2, (const int64_t[]){3, 2}, LPX_F8E4M3FN, lpx_cpu(), &qt));
    CHECK_OK(lpx_zeros(0, NULL, LPX_F32, lpx_cpu(), &s));
    CHECK_OK(lpx_zeros(0, NULL, LPX_F32, lpx_cpu(), &si));
    CHECK_OK(lpx_full(0, NULL, -1.0, LPX_F32, lpx_cpu(), &bad));
    lpx_tensor *outs[3] = {qt, s, si};
    for (int ro = 0; ro < 3; ro++) {
        lpx_tensor *o[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) {
            lpx_tensor *base = outs[i];
            CHECK_OK(lpx_tensor_view_of(base, lpx_tensor_ndim(base), lpx_tensor_shape(base),
                                        lpx_tensor_strides(base), 0, &o[i]));
        }
        lpx_tensor *copy = NULL;   /* a read-only tensor of its own: marking is for good */
        CHECK_OK(lpx_clone(o[ro], &copy));
        lpx_tensor_release(o[ro]);
        o[ro] = copy;
        lpx_tensor_mark_readonly(copy);
        lpx_value a[10] = {lpx_v_tensor(x), lpx_v_none(), lpx_v_dtype(LPX_F8E4M3FN), lpx_v_bool(false),
                           lpx_v_bool(false), lpx_v_f64(0), lpx_v_bool(true), lpx_v_tensor(o[0]),
                           lpx_v_tensor(o[1]), lpx_v_tensor(o[2])};
        refused_clean("fp8_quantize_t", a, 10, LPX_EINVAL, o, 3);
        for (int i = 0; i < 3; i++) lpx_tensor_release(o[i]);
    }
    /* the delegated contract (scale_max) and the kernel's data check (a
     * static scale of -1) name fp8_quantize_t */
    lpx_value a[10] = {lpx_v_tensor(x), lpx_v_none(), lpx_v_dtype(LPX_F8E4M3FN), lpx_v_bool(false),
                       lpx_v_bool(false), lpx_v_f64(-2), lpx_v_bool(true), lpx_v_tensor(qt),
                       lpx_v_tensor(s), lpx_v_tensor(si)};
    refused_clean("fp8_quantize_t", a, 10, LPX_EINVAL, outs, 3);
    a[5] = lpx_v_f64(0);
    a[1] = lpx_v_tensor(bad);
    refused_clean("fp8_quantize_t", a, 10, LPX_EINVAL, outs, 3);
    lpx_tensor_release(x);
    lpx_tensor_release(qt);
    lpx_tensor_release(s);
    lpx_tensor_release(si);
    lpx_tensor_release(bad);
}


/* slice with step 0 on a float8 tensor: the kind's slice kernel took
 * step 0 for "narrow" (start, length), so slice(x, 0, 0, 2, 0) returned
 * rows 0..1 where a dense x is refused, and a bad one was refused in
 * narrow's name. */
static void test_float8_slice_step0(void)
{
    lpx_tensor *x = NULL, *k = NULL;
    CHECK_OK(lpx_full(2, (const int64_t[]){4, 2}, 1.0, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_float8_quantize(x, NULL, &k, NULL));
    lpx_tensor *ts[2] = {x, k};
    for (int i = 0; i < 2; i++)
        for (int64_t end = 2; end <= 8; end += 6) {   /* a narrow that fits, one that does not */
            lpx_value a[5] = {lpx_v_tensor(ts[i]), lpx_v_i64(0), lpx_v_i64(0), lpx_v_i64(end), lpx_v_i64(0)};
            refused_clean("slice", a, 5, LPX_EINVAL, &x, 1);
        }
    lpx_tensor_release(k);
    lpx_tensor_release(x);
}

/* view / reshape of a float8 tensor: the kind's shape resolution
 * multiplied the sizes unchecked (UBSan: signed overflow), so for an
 * empty x the shape [2^62, 4] wrapped to 0 elements and was accepted. */
static void test_float8_view_overflow(void)
{
    lpx_tensor *x = NULL, *k = NULL;
    CHECK_OK(lpx_zeros(2, (const int64_t[]){0, 4}, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_float8_quantize(x, NULL, &k, NULL));
    const int64_t shapes[3][2] = {{INT64_C(1) << 62, 4}, {2, INT64_MAX}, {INT64_C(1) << 62, 8}};
    const char *ops2[2] = {"view", "reshape"};
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < 3; i++) {
            lpx_value a[2] = {lpx_v_tensor(k), lpx_v_ints(shapes[i], 2)};
            lpx_op op;
            CHECK_OK(lpx_op_find(ops2[o], &op));
            lpx_call c;
            lpx_call_init(&c, op, a, 2);
            lpx_status st = lpx_dispatch(&c);
            if (!st) lpx_call_release_rets(&c);
            CHECKF(st != LPX_OK, "%s(float8 [0, 4], {%lld, %lld}) accepted", ops2[o], (long long)shapes[i][0],
                   (long long)shapes[i][1]);
        }
    lpx_tensor_release(k);
    lpx_tensor_release(x);
}

/* Hand-picked attacks (sizes at the edges the random values rarely hit
 * together), each run a few times in random layouts: success or a clean
 * refusal, as for the random calls. */
#define BIGI (INT64_C(1) << 62)
static const bad_case probes[] = {
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 0), PAYLOAD, I(64), I(2), I(0), I(BIGI), B(0), NONE}, 0, NULL},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 0), PAYLOAD, I(64), I(2), I(BIGI), I(0), B(1), NONE}, 0, NULL},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 0), PAYLOAD, I(64), I(2), I(0), I(INT64_MAX), B(0), NONE}, 0, NULL},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 0), PAYLOAD, I(64), I(2), I(0), I(INT64_MIN), B(0), NONE}, 0, NULL},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(INT64_MAX), I(INT64_MAX), D(LPX_F32), NONE}, 0, NULL},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(1), I(INT64_MAX), D(LPX_F32), NONE}, 0, NULL},
    {"nf4_quantize", 3, {T(LPX_F32, 1, 100), I(INT64_MAX), I(INT64_MAX)}, 0, NULL},
    {"nf4_quantize", 3, {T(LPX_F32, 1, 100), I(64), I(INT64_MIN)}, 0, NULL},
    {"embedding_backward", 3, {T(F32, 2, 2, 3), T(I32, 1, 2), I(BIGI)}, 0, NULL},
    {"embedding_backward", 3, {T(F32, 2, 2, 3), T(I32, 1, 2), I(INT64_MAX)}, 0, NULL},
    {"embedding_backward", 3, {T(F32, 2, 2, 0), T(I32, 1, 2), I(BIGI)}, 0, NULL},
    {"embedding_backward", 3, {T(F32, 2, 0, 3), T(I32, 1, 0), I(INT64_MAX)}, 0, NULL},
    {"fp8_quantize_block", 6, {T(LPX_F32, 2, 5, 8), D(E4), I(BIGI), I(BIGI), B(0), B(1)}, 0, NULL},
    {"fp8_quantize_block", 6, {T(LPX_F32, 2, 5, 8), D(E4), I(INT64_MAX), I(1), B(0), B(1)}, 0, NULL},
    {"fp8_quantize_block", 6, {T(LPX_F32, 2, 0, 8), D(E4), I(1), I(1), B(0), B(1)}, 0, NULL},
    {"fp8_dequantize_block", 5, {T(E4, 2, 5, 8), T(LPX_F32, 2, 2, 2), I(INT64_MAX), I(INT64_MAX), D(LPX_F16)}, 0, NULL},
    {"fp8_dequantize_block", 5, {T(E4, 2, 5, 8), T(LPX_F32, 2, 1, 1), I(INT64_MAX), I(INT64_MAX), D(LPX_F16)}, 0, NULL},
    {"fp8_dequantize_block", 5, {T(E4, 2, 0, 0), T(LPX_F32, 2, 0, 0), I(0), I(0), D(LPX_F16)}, 0, NULL},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 1, 1), I(INT64_MAX), I(INT64_MAX), T(E5, 2, 8, 3),
                          T(LPX_F32, 2, 1, 1), I(INT64_MAX), I(INT64_MAX), NONE, D(LPX_F32)}, 0, NULL},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 0), T(LPX_F32, 2, 2, 0), I(1), I(128), T(E5, 2, 0, 3),
                          T(LPX_F32, 2, 0, 1), I(128), I(128), NONE, D(LPX_F32)}, 0, NULL},
    {"adamw_state_", 16, AS8(L(1, 0), S(0, )), 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(INT64_MAX), HP, I(1), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(BIGI), HP, I(1), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(0), HP, I(1), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(-128), HP, I(1), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(INT64_MIN), I(128), HP, I(1), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(INT64_MAX), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(INT64_MIN), L(1, 0), S(0, )}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(4, 1, INT64_MAX, 3, 1000), SC3}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(4, 1, 42, INT64_MAX, INT64_MIN), SC3}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(4, 7, 42, 3, 1000), SC3}, 0, NULL},
    {"adamw_state_", 16, {P300, G300, C300, SC3, C300, SC3, I(0), I(128), HP, I(1), L(3, 1, 42, 3), SC3}, 0, NULL},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    S(1, TA(LPX_F32, 1, 4)), HP, I(INT64_MAX)}, 0, NULL},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    S(1, TA(LPX_F32, 1, 4)), HP, I(INT64_MIN)}, 0, NULL},
    {"adamw_", 10, {S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)), S(1, TA(LPX_F32, 1, 4)),
                    S(1, TA(LPX_F32, 1, 4)), HP, I(0)}, 0, NULL},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(INT64_MAX)}, 0, NULL},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(INT64_MIN)}, 0, NULL},
    {"rope", 3, {T(F32, 4, 1, 2, 2, 4), T(F32, 1, 2), I(-5)}, 0, NULL},
    {"cross_entropy", 3, {T(F32, 2, 2, 5), T(I32, 1, 2), I(INT64_MIN)}, 0, NULL},
    {"cross_entropy_backward", 4, {T(F32, 2, 2, 5), T(LPX_I64, 1, 2), I(INT64_MAX), F(NAN)}, 0, NULL},
    {"cross_entropy", 3, {T(F32, 2, 0, 5), T(I32, 1, 0), I(-100)}, 0, NULL},
    {"cross_entropy", 3, {T(F32, 2, 2, 0), T(I32, 1, 2), I(-100)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 2, 0, 8), T(F32, 4, 1, 2, 0, 8), T(F32, 4, 1, 2, 0, 8), B(1), F(NAN)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 2, 3, 0), T(F32, 4, 1, 2, 3, 0), T(F32, 4, 1, 2, 3, 0), B(1), F(0)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 2, 3, 4), T(F32, 4, 1, 2, 0, 4), T(F32, 4, 1, 2, 0, 4), B(1), F(1)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 4, 3, 4), T(F32, 4, 1, 3, 3, 4), T(F32, 4, 1, 3, 3, 4), B(0), F(1)}, 0, NULL},
    {"attention", 5, {T(F32, 4, 1, 2, 3, 4), T(F32, 4, 1, 0, 3, 4), T(F32, 4, 1, 0, 3, 4), B(0), F(1)}, 0, NULL},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(1), I(INT64_MIN), I(INT64_MAX), I(INT64_MAX)}, 0, NULL},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(1), I(INT64_MAX), I(INT64_MIN), I(1)}, 0, NULL},
    {"slice", 5, {T(LPX_F32, 2, 4, 5), I(INT64_MIN), I(0), I(1), I(1)}, 0, NULL},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(0), I(INT64_MIN), I(INT64_MAX)}, 0, NULL},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(0), I(INT64_MAX), I(INT64_MIN)}, 0, NULL},
    {"narrow", 4, {T(LPX_F32, 2, 4, 5), I(0), I(-4), I(INT64_MAX)}, 0, NULL},
    {"view", 2, {T(LPX_F32, 2, 0, 3), L(3, BIGI, BIGI, -1)}, 0, NULL},
    {"view", 2, {T(LPX_F32, 2, 0, 3), L(2, -1, 0)}, 0, NULL},
    {"reshape", 2, {T(LPX_F32, 2, 0, 3), L(2, 0, -1)}, 0, NULL},
    {"reshape", 2, {T(LPX_F32, 2, 0, 3), L(3, INT64_MAX, INT64_MAX, 0)}, 0, NULL},
    {"expand", 2, {T(LPX_F32, 2, 3, 1), L(3, BIGI, 3, BIGI)}, 0, NULL},
    {"permute", 2, {T(LPX_F32, 3, 2, 3, 4), L(3, INT64_MIN, 0, 1)}, 0, NULL},
    {"transpose", 3, {T(LPX_F32, 3, 2, 3, 4), I(INT64_MIN), I(INT64_MAX)}, 0, NULL},
    {"softmax", 2, {T(LPX_F32, 2, 3, 4), I(INT64_MIN)}, 0, NULL},
    {"sum", 3, {T(LPX_F32, 2, 3, 4), L(2, INT64_MIN, INT64_MAX), B(1)}, 0, NULL},
    {"sum", 3, {T(LPX_F32, 2, 3, 4), L(3, 0, 1, 0), B(1)}, 0, NULL},
    {"cat", 2, {S(2, TA(LPX_F32, 2, 2, 3), TA(LPX_F32, 2, 2, 1)), I(INT64_MIN)}, 0, NULL},
    {"full", 4, {L(2, BIGI, 0), F(2.5), D(LPX_I64), V}, 0, NULL},
    {"full", 4, {L(3, BIGI, BIGI, 0), F(2.5), D(LPX_I64), V}, 0, NULL},
    {"zeros", 3, {L(2, INT64_MAX, 2), D(LPX_F32), V}, 0, NULL},
    {"arange", 5, {F(0), F(1e300), F(1e-300), D(LPX_I32), V}, 0, NULL},
    {"arange", 5, {F(-9.3e18), F(9.3e18), F(1), D(LPX_I64), V}, 0, NULL},
    {"arange", 5, {F(0), F(INFINITY), F(1), D(LPX_F32), V}, 0, NULL},
    {"arange", 5, {F(0), F(10), F(NAN), D(LPX_F32), V}, 0, NULL},
    {"arange", 5, {F(0), F(4), F(1e-310), D(LPX_F32), V}, 0, NULL},
    {"randn", 4, {L(2, INT64_MAX, 0), I(INT64_MIN), D(LPX_F16), V}, 0, NULL},
    {"matmul", 3, {T(F32, 2, 0, 3), T(F32, 2, 3, 0), NONE}, 0, NULL},
    {"matmul", 3, {T(F32, 2, 2, 0), T(F32, 2, 0, 4), NONE}, 0, NULL},
    {"matmul", 3, {T(F32, 4, 2, 1, 2, 3), T(F32, 3, 3, 3, 4), NONE}, 0, NULL},
    {"fp8_scaled_mm", 7, {T(E4, 2, 0, 3), T(LPX_F32, 2, 0, 1), T(E5, 2, 3, 0), T(LPX_F32, 2, 1, 0),
                          NONE, D(LPX_BF16), B(1)}, 0, NULL},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 0), T(LPX_F32, 2, 2, 1), T(E5, 2, 0, 4), T(LPX_F32, 2, 1, 4),
                          NONE, D(LPX_F32), B(0)}, 0, NULL},
    {"qlora_dropout", 4, {T(LPX_BF16, 2, 2, 3), F(0.999999999), I(INT64_MIN), D(LPX_F32)}, 0, NULL},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), NONE, D(E4), I(INT64_MIN), B(1), F(INFINITY), B(1)}, 0, NULL},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 0, 3), NONE, D(E4), I(0), B(1), F(0), B(1)}, 0, NULL},
    {"fp8_scale_from_amax", 4, {T(LPX_F32, 1, 0), D(E4), B(1), F(1e308)}, 0, NULL},
    {"rmsnorm", 3, {T(F32, 2, 3, 0), NONE, F(0)}, 0, NULL},
    {"rmsnorm_backward", 4, {T(F32, 2, 2, 0), T(F32, 2, 2, 0), NONE, T(F32, 2, 2, 1)}, 0, NULL},
    {"softmax_backward", 3, {T(F32, 2, 0, 4), T(F32, 2, 0, 4), I(-1)}, 0, NULL},
};

static void test_probes(void)
{
    cur_seed = SEED_DEFAULT;
    opinfo o;
    for (size_t k = 0; k < sizeof probes / sizeof *probes; k++) {
        lpx_op op;
        CHECK_OK(lpx_op_find(probes[k].op, &op));
        CHECKF(parse_schema(op, &o), "probe %zu: schema", k);
        CHECKF(o.nargs == probes[k].nargs, "probe %zu (%s): %d args, schema has %d", k, o.name, probes[k].nargs,
               o.nargs);
        if (o.nargs != probes[k].nargs) continue;
        force_tp = &probes[k];
        rng = cur_seed ^ k;
        for (int it = 0; it < 12; it++) {
            cur_iter = (long)k;
            run_one(&o);
        }
        force_tp = NULL;
    }
    check_case_failures += rand_failures;
    rand_failures = 0;
}

static opinfo ops[LPX_MAX_OPS];
static int nops;

static void test_random_calls(void)
{
    const char *e = getenv("LPX_RAND_SEED");
    cur_seed = e ? strtoull(e, NULL, 0) : SEED_DEFAULT;
    e = getenv("LPX_RAND_ITERS");
    long iters = e ? strtol(e, NULL, 0) : (RAND_ASAN ? 2500 : 4000);
    const char *only = getenv("LPX_RAND_OP");
    printf("  seed 0x%llx, %ld calls per op\n", (unsigned long long)cur_seed, iters);
    nops = 0;
    for (lpx_op op = 0; op < lpx_op_count() && op < LPX_MAX_OPS; op++) {
        if (!lpx_op_spec_size(op)) continue;
        if (only && strcmp(only, lpx_op_name(op))) continue;
        if (!parse_schema(op, &ops[nops])) {
            fprintf(stderr, "  cannot parse the schema of %s: %s\n", lpx_op_name(op), lpx_op_schema(op));
            check_case_failures++;
            continue;
        }
        nops++;
    }
    CHECKF(only || nops >= 75, "%d ops with a spec family, want the 75 built-ins", nops);
    for (int k = 0; k < nops; k++) {
        rng = cur_seed ^ ((uint64_t)ops[k].op * 0x9e3779b97f4a7c15ull);
        for (long it = 0; it < iters; it++) {
            cur_iter = it;
            run_one(&ops[k]);
        }
    }
    check_case_failures += rand_failures;
    rand_failures = 0;
    if (getenv("LPX_RAND_STATS"))
        for (int k = 0; k < nops; k++)
            printf("  %-24s %6ld ok %6ld refused\n", ops[k].name, op_ok[ops[k].op], op_refused[ops[k].op]);
    printf("  %ld ok, %ld refused (%ld ENOMEM), %ld not run (an input could not be built)\n", n_ok, n_refused,
           n_nomem, n_skipped);
    printf("  %ld refusals of calls with kind tensors named another op (LPX_RAND_KIND_MSGS=1 lists them)\n",
           n_kind_msg);
}

int main(void)
{
    signal(SIGALRM, on_signal);
#if !RAND_ASAN   /* ASan reports these itself (then calls the summary hook above) */
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    /* a call that tries to allocate gigabytes gets ENOMEM, not the machine */
    struct rlimit rl = {(rlim_t)1 << 30, (rlim_t)1 << 30};
    setrlimit(RLIMIT_AS, &rl);
#endif
    CHECK_OK(lpx_init());
    register_plugin_dtypes();
    spec_setup();   /* the harness's check-free backend: a second backend registered */
    RUN(test_fp8_quantize_t_refusals);
    RUN(test_float8_slice_step0);
    RUN(test_float8_view_overflow);
    RUN(test_probes);
    RUN(test_random_calls);
    return CHECK_DONE();
}
