/* The optimizer-state kinds os_8bit, os_4bit, os_fp8 (include/lpx/
 * optim_state.h, subclasses/optim_state/): zero states, quantize and
 * to_dense against the numerics header's block codecs, the payload checks
 * (a block that is not a power of two, a role or format of another kind,
 * a shape the inner tensors do not hold), refusals in one line naming the
 * call, the kind and the argument, and bytes per parameter measured on
 * the state tensors. */
#include <float.h>
#include <stdint.h>
#include "check.h"
#include "tensor_util.h"
#include "core/numerics/optim_state.h"

static uint64_t srng = 0x9E3779B97F4A7C15ull;
static uint32_t u32(void)
{
    srng ^= srng << 13;
    srng ^= srng >> 7;
    srng ^= srng << 17;
    return (uint32_t)(srng >> 16);
}
static double uni(void) { return (u32() + 0.5) / 4294967296.0; }
static double gauss(void) { return sqrt(-2.0 * log(uni())) * cos(6.283185307179586 * uni()); }

static const char *const kname[3] = {"os_8bit", "os_4bit", "os_fp8"};

static lpx_tensor *randn_cpu(int ndim, const int64_t *shape, double scale, bool positive)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, ndim, shape, lpx_cpu(), &t));
    float *x = lpx_tensor_data(t);
    for (int64_t i = 0; i < lpx_tensor_numel(t); i++) {
        double g = gauss() * scale * (i % 97 == 3 ? 30 : 1);
        x[i] = (float)(positive ? g * g : g);
    }
    return t;
}

/* New states are zero (codes 0 and scales 0, torchao's zeros), of the
 * format's kind, f32, with the logical shape. */
static void test_new_zero(void)
{
    const int64_t shape[2] = {3, 100};
    for (int f = 0; f < 3; f++)
        for (int role = 0; role < 2; role++) {
            lpx_tensor *s = NULL, *d = NULL;
            CHECK_OK(lpx_optim_state_new((lpx_optim_state_format)f, (lpx_optim_state_role)role, 2, shape, 0,
                                         lpx_cpu(), &s));
            CHECK(lpx_is_optim_state(s) && lpx_tensor_kind(s) == lpx_optim_state_kind((lpx_optim_state_format)f));
            CHECK(!strcmp(lpx_kind_name(lpx_tensor_kind(s)), kname[f]));
            CHECK(lpx_tensor_dtype(s) == LPX_F32 && lpx_tensor_ndim(s) == 2 && lpx_tensor_numel(s) == 300);
            lpx_optim_state_info info;
            CHECK_OK(lpx_optim_state_get_info(s, &info));
            CHECK(info.block == lpx_optim_state_default_block((lpx_optim_state_format)f));
            CHECK_OK(lpx_kind_to_dense(s, &d));
            const float *x = lpx_tensor_data(d);
            for (int i = 0; i < 300; i++) CHECKF(x[i] == 0.0f, "%s role %d [%d] = %g", kname[f], role, i, x[i]);
            lpx_tensor_release(d);
            lpx_tensor_release(s);
        }
}

/* quantize -> to_dense equals the header's codecs block by block, with a
 * short last block; every element within its map's round-trip bound. */
static void test_quantize_to_dense(void)
{
    const int64_t shape[1] = {1000};
    static const double bound[3][2] = {{0.00704, 0.00352}, {0.1126, 0.0626}, {0.0626, 0.00049}};
    for (int f = 0; f < 3; f++)
        for (int role = 0; role < 2; role++)
            for (int64_t block = 16; block <= 256; block *= 4) {
                lpx_tensor *x = randn_cpu(1, shape, 1e-3, role == 1), *s = NULL, *d = NULL;
                CHECK_OK(lpx_optim_state_quantize(x, (lpx_optim_state_format)f, (lpx_optim_state_role)role, block,
                                                  &s));
                CHECK_OK(lpx_kind_to_dense(s, &d));
                const float *xv = lpx_tensor_data(x), *dv = lpx_tensor_data(d);
                double worst = 0;
                for (int64_t at = 0; at < 1000; at += block) {
                    int n = (int)(1000 - at < block ? 1000 - at : block);
                    float a = lpx_os_absmax(xv + at, n);
                    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(dv[at + i] - xv[at + i]) / a);
                }
                CHECKF(worst <= bound[f][role], "%s role %d block %lld: error %.5g x absmax > %g", kname[f], role,
                       (long long)block, worst, bound[f][role]);
                /* bit-equal to the header's block codec */
                lpx_tensor *codes = lpx_tensor_inner(s, 0), *scales = lpx_tensor_inner(s, 1);
                const float *sc = lpx_tensor_data(scales);
                float q[256];
                if (f < 2) lpx_os_map_fill(f == 0 ? (role ? LPX_OS_MAP8_UNSIGNED : LPX_OS_MAP8_SIGNED)
                                                  : (role ? LPX_OS_MAP4_UNSIGNED : LPX_OS_MAP4_SIGNED), q);
                for (int64_t b = 0, at = 0; at < 1000; b++, at += block) {
                    int n = (int)(1000 - at < block ? 1000 - at : block);
                    uint8_t c8[256];
                    uint16_t c16[256];
                    float s1;
                    if (f == 0) s1 = lpx_os_quant8(q, xv + at, n, c8);
                    else if (f == 1) s1 = lpx_os_quant4(q, xv + at, n, c8);
                    else if (!role) s1 = lpx_os_quant_e4m3(xv + at, n, c8);
                    else s1 = lpx_os_quant_f16s(xv + at, n, c16);
                    CHECK(s1 == sc[b]);
                    const uint8_t *got = (const uint8_t *)lpx_tensor_data(codes) + (f == 1 ? at / 2 : at);
                    if (f == 2 && role) CHECK(!memcmp(c16, (const uint16_t *)lpx_tensor_data(codes) + at, 2 * (size_t)n));
                    else CHECK(!memcmp(c8, got, f == 1 ? (size_t)(n + 1) / 2 : (size_t)n));
                }
                lpx_tensor_release(x);
                lpx_tensor_release(s);
                lpx_tensor_release(d);
            }
}

/* Bad input refused in one line naming the call, the kind and the argument. */
static void test_refusals(void)
{
    const int64_t shape[1] = {512};
    lpx_tensor *s = NULL, *r = NULL;
    CHECK_ERR(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_M, 1, shape, 100, lpx_cpu(), &s),
              LPX_EINVAL);
    CHECK(!strcmp(lpx_last_error(), "lpx_optim_state_new: kind os_8bit: block 100 is not a power of two in 2..256"));
    CHECK_ERR(lpx_optim_state_new(LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_M, 1, shape, 512, lpx_cpu(), &s), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "os_4bit: block 512 is not a power of two in 2..256") != NULL);
    CHECK_ERR(lpx_optim_state_new((lpx_optim_state_format)7, LPX_OPTIM_STATE_M, 1, shape, 0, lpx_cpu(), &s),
              LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "format 7 is not a state format") != NULL);
    CHECK_ERR(lpx_optim_state_new(LPX_OPTIM_STATE_FP8, (lpx_optim_state_role)2, 1, shape, 0, lpx_cpu(), &s),
              LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "kind os_fp8: role 2 is neither m (0) nor v (1)") != NULL);

    /* unflatten: the payload of another kind, a bad block, a shape mismatch */
    CHECK_OK(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_V, 1, shape, 0, lpx_cpu(), &s));
    lpx_tensor *inner[2] = {lpx_tensor_inner(s, 0), lpx_tensor_inner(s, 1)};
    size_t ms = 0;
    lpx_optim_state_meta m;
    memcpy(&m, lpx_tensor_meta(s, &ms), sizeof m);
    CHECK(ms == sizeof m && m.format == 0 && m.role == 1 && m.block == 256);
    const lpx_kind *k4 = lpx_optim_state_kind(LPX_OPTIM_STATE_4BIT), *k8 = lpx_optim_state_kind(LPX_OPTIM_STATE_8BIT);
    CHECK_ERR(lpx_kind_unflatten(k4, LPX_F32, 1, shape, inner, 2, &m, sizeof m, &r), LPX_EINVAL);
    CHECK(!strcmp(lpx_last_error(), "os_4bit unflatten: kind os_4bit: metadata format 0 is not the kind's (1)"));
    lpx_optim_state_meta bad = m;
    bad.block = 96;
    CHECK_ERR(lpx_kind_unflatten(k8, LPX_F32, 1, shape, inner, 2, &bad, sizeof bad, &r), LPX_EINVAL);
    CHECK(!strcmp(lpx_last_error(), "os_8bit unflatten: kind os_8bit: block 96 is not a power of two in 2..256"));
    const int64_t wrong[1] = {600};
    CHECK_ERR(lpx_kind_unflatten(k8, LPX_F32, 1, wrong, inner, 2, &m, sizeof m, &r), LPX_ESHAPE);
    CHECK(!strcmp(lpx_last_error(),
                  "os_8bit unflatten: kind os_8bit: inner tensor 0 (codes) is [512], expected contiguous [600]"));
    CHECK_ERR(lpx_kind_unflatten(k8, LPX_F16, 1, shape, inner, 2, &m, sizeof m, &r), LPX_EDTYPE);
    CHECK_OK(lpx_kind_unflatten(k8, LPX_F32, 1, shape, inner, 2, &m, sizeof m, &r));
    lpx_tensor_release(r);
    /* an op the kind does not implement names the op and the kind */
    CHECK_ERR(lpx_neg(s, &r), LPX_ENOTIMPL);
    CHECK(strstr(lpx_last_error(), "os_8bit") != NULL);
    lpx_tensor_release(s);
}

/* Bytes per parameter of m + v + scales, measured on state tensors of a
 * 4096 x 4096 parameter (and 3 odd tails): the bounds. */
static void test_bytes_per_param(void)
{
    const int64_t shapes[2][2] = {{4096, 4096}, {1000, 1001}};
    struct { int f; int64_t block; double bound, want; } cases[] = {
        {LPX_OPTIM_STATE_8BIT, 256, 2.05, 2.03125},
        {LPX_OPTIM_STATE_4BIT, 128, 1.07, 1.0625},
        {LPX_OPTIM_STATE_4BIT, 256, 1.05, 1.03125},
        {LPX_OPTIM_STATE_FP8, 256, 3.05, 3.03125},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int sh = 0; sh < 2; sh++) {
            lpx_tensor *m = NULL, *v = NULL;
            CHECK_OK(lpx_optim_state_new((lpx_optim_state_format)cases[c].f, LPX_OPTIM_STATE_M, 2, shapes[sh],
                                         cases[c].block, lpx_cpu(), &m));
            CHECK_OK(lpx_optim_state_new((lpx_optim_state_format)cases[c].f, LPX_OPTIM_STATE_V, 2, shapes[sh],
                                         cases[c].block, lpx_cpu(), &v));
            int64_t held = 0;
            for (int i = 0; i < 2; i++) {
                lpx_tensor *cm = lpx_tensor_inner(m, i), *cv = lpx_tensor_inner(v, i);
                held += lpx_dtype_nbytes(lpx_tensor_dtype(cm), lpx_tensor_numel(cm)) +
                        lpx_dtype_nbytes(lpx_tensor_dtype(cv), lpx_tensor_numel(cv));
            }
            double bpp = (double)held / (double)lpx_tensor_numel(m);
            int64_t want = lpx_os_state_bytes(cases[c].f, lpx_tensor_numel(m), cases[c].block);
            if (sh == 0)
                printf("  %s block %lld: %.5f bytes/param (bound %.2f)\n", kname[cases[c].f],
                       (long long)cases[c].block, bpp, cases[c].bound);
            CHECKF(held == want, "%s: %lld bytes held, lpx_os_state_bytes %lld", kname[cases[c].f], (long long)held,
                   (long long)want);
            CHECKF(bpp <= cases[c].bound, "%s block %lld: %.5f bytes/param > %.2f", kname[cases[c].f],
                   (long long)cases[c].block, bpp, cases[c].bound);
            if (sh == 0) CHECK(bpp == cases[c].want);
            lpx_tensor_release(m);
            lpx_tensor_release(v);
        }
}

/* ---- the fused AdamW over state tensors ---------------------------------- */

typedef struct { double lr, b1, b2, eps, wd; int64_t step; } hyper;

static double ref_adamw(const hyper *h, double p, double g, double *m, double *v)
{
    *m = h->b1 * *m + (1 - h->b1) * g;
    *v = h->b2 * *v + (1 - h->b2) * g * g;
    double bc1 = 1 - pow(h->b1, (double)h->step), bc2 = 1 - pow(h->b2, (double)h->step);
    return p * (1 - h->lr * h->wd) - h->lr * (*m / bc1) / (sqrt(*v / bc2) + h->eps);
}

/* the code of a state tensor's element i, and the value of a code */
static unsigned code_at(int f, int role, const lpx_tensor *s, int64_t i)
{
    const lpx_tensor *c = lpx_tensor_inner((lpx_tensor *)s, 0);
    if (f == 2 && role) return ((const uint16_t *)lpx_tensor_data(c))[i];
    const uint8_t *b = lpx_tensor_data(c);
    if (f == 1) return i & 1 ? b[i / 2] & 15u : b[i / 2] >> 4;
    return b[i];
}

static double code_value(int f, int role, const float *q, unsigned c)
{
    if (f < 2) return q[c];
    return role ? (double)lpx_f16_to_f32((uint16_t)c) : (double)lpx_f8e4m3fn_to_f32((uint8_t)c);
}

/* nearest code of r (>= 0 for v) in double: ascending table q for the
 * maps (ties to the larger code, torchao's rule), RNE for e4m3 and f16 */
static unsigned ref_code(int f, int role, const float *q, double r)
{
    if (f < 2) {
        int nc = f == 0 ? 256 : 16;
        unsigned best = 0;
        double bd = INFINITY;
        for (int c = 0; c < nc; c++) {
            double d = fabs(r - q[c]);
            if (d <= bd) bd = d, best = (unsigned)c;
        }
        return best;
    }
    double a = fabs(r);
    unsigned lo = 0, hi = role ? 0x7BFFu : 0x7Eu; /* positive codes ascend */
    while (lo < hi) { /* the largest code with value <= a */
        unsigned mid = (lo + hi + 1) / 2;
        if (code_value(f, role, q, mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    unsigned best = lo;
    if (lo < (role ? 0x7BFFu : 0x7Eu)) {
        double dl = a - code_value(f, role, q, lo), dh = code_value(f, role, q, lo + 1) - a;
        if (dh < dl || (dh == dl && (lo & 1))) best = lo + 1;
    }
    return best | (r < 0 ? (role ? 0x8000u : 0x80u) : 0u);
}

/* One step of each state kind through adamw_ (the kinds' handler, the op
 * adamw_state_, the CPU kernel) against a float64 dequantize-update-
 * requantize from the same starting codes: the new scales within 1e-5,
 * every code equal but near-ties (the f64 value within 1e-5 of the
 * midpoint between the two codes; at most 0.1%), params within 4 ulp +
 * 1e-5 lr. */
static void test_step_vs_float64(void)
{
    struct { int f; int64_t block; } cases[] = {{0, 256}, {1, 256}, {1, 128}, {2, 256}};
    hyper h = {1e-3, 0.9, 0.999, 1e-8, 0.01, 5};
    for (size_t cs = 0; cs < sizeof cases / sizeof *cases; cs++) {
        const int f = cases[cs].f;
        const int64_t block = cases[cs].block, N = 64 * block - 3; /* a short last block */
        const int64_t shape[1] = {N};
        lpx_tensor *p = randn_cpu(1, shape, 0.05, false), *g = NULL, *m0 = NULL, *v0 = NULL, *m = NULL, *v = NULL;
        CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &g));
        CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &m0));
        CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &v0));
        float *gv = lpx_tensor_data(g), *mv = lpx_tensor_data(m0), *vv = lpx_tensor_data(v0);
        for (int64_t b = 0; b < N; b += block) { /* block-varying magnitudes, exact zeros, outliers */
            double mag = pow(10.0, -6 + 5 * uni());
            for (int64_t i = b; i < b + block && i < N; i++) {
                gv[i] = (float)(i % 37 == 5 ? 0.0 : mag * gauss() * (i % 29 == 3 ? 50 : 1));
                mv[i] = (float)(0.1 * mag * gauss());
                vv[i] = (float)(mag * mag * (0.05 + uni()));
            }
        }
        CHECK_OK(lpx_optim_state_quantize(m0, (lpx_optim_state_format)f, LPX_OPTIM_STATE_M, block, &m));
        CHECK_OK(lpx_optim_state_quantize(v0, (lpx_optim_state_format)f, LPX_OPTIM_STATE_V, block, &v));
        /* the reference, in double from the starting codes */
        lpx_tensor *dm = NULL, *dv = NULL;
        CHECK_OK(lpx_kind_to_dense(m, &dm));
        CHECK_OK(lpx_kind_to_dense(v, &dv));
        double *rm = malloc((size_t)N * sizeof *rm), *rv = malloc((size_t)N * sizeof *rv),
               *rp = malloc((size_t)N * sizeof *rp);
        const float *p0 = lpx_tensor_data(p), *dmv = lpx_tensor_data(dm), *dvv = lpx_tensor_data(dv);
        for (int64_t i = 0; i < N; i++) {
            rm[i] = dmv[i], rv[i] = dvv[i];
            rp[i] = ref_adamw(&h, p0[i], gv[i], &rm[i], &rv[i]);
        }
        CHECK_OK(lpx_adamw_(&p, &g, &m, &v, 1, h.lr, h.b1, h.b2, h.eps, h.wd, h.step));
        float qm[256] = {0}, qv[256] = {0};
        if (f < 2) {
            lpx_os_map_fill(f == 0 ? LPX_OS_MAP8_SIGNED : LPX_OS_MAP4_SIGNED, qm);
            lpx_os_map_fill(f == 0 ? LPX_OS_MAP8_UNSIGNED : LPX_OS_MAP4_UNSIGNED, qv);
        }
        const float *ms = lpx_tensor_data(lpx_tensor_inner(m, 1)), *vs = lpx_tensor_data(lpx_tensor_inner(v, 1));
        const float *p1 = lpx_tensor_data(p);
        long codes = 0, ties = 0;
        double worst_p = 0;
        for (int64_t b = 0, at = 0; at < N; b++, at += block) {
            int n = (int)(N - at < block ? N - at : block);
            double am = 0, av = 0;
            for (int i = 0; i < n; i++) am = fmax(am, fabs(rm[at + i])), av = fmax(av, fabs(rv[at + i]));
            double sm = f < 2 ? fmax(am, 1e-12) : fmax(am, 1e-12) / 448.0;
            double sv = f < 2 ? fmax(av, 1e-12) : fmax(av, 1e-30) / 32768.0;
            CHECKF(fabs(ms[b] - sm) <= 1e-5 * sm && fabs(vs[b] - sv) <= 1e-5 * sv,
                   "%s block %lld: scales %.9g %.9g vs %.9g %.9g", kname[f], (long long)b, ms[b], vs[b], sm, sv);
            for (int i = 0; i < n; i++) {
                for (int role = 0; role < 2; role++) {
                    double r = (role ? rv[at + i] : rm[at + i]) / (role ? sv : sm);
                    const float *q = role ? qv : qm;
                    unsigned got = code_at(f, role, role ? v : m, at + i), want = ref_code(f, role, q, r);
                    codes++;
                    if (got == want) continue;
                    ties++;
                    double mid = (code_value(f, role, q, got) + code_value(f, role, q, want)) / 2;
                    CHECKF(fabs(r - mid) <= 1e-5 * fmax(fabs(mid), 1e-30),
                           "%s %s[%lld]: code %u, float64 %u (value %.12g, midpoint %.12g)", kname[f],
                           role ? "v" : "m", (long long)(at + i), got, want, r, mid);
                }
                double dp = fabs(p1[at + i] - rp[at + i]);
                worst_p = fmax(worst_p, dp);
                CHECKF(dp <= 4 * FLT_EPSILON * fabs(rp[at + i]) + 1e-5 * h.lr, "%s p[%lld]: %.9g vs %.12g", kname[f],
                       (long long)(at + i), p1[at + i], rp[at + i]);
            }
        }
        printf("  %s block %lld: %ld codes of m and v equal to the float64 step but %ld near-ties; params max "
               "|diff| %.3g\n", kname[f], (long long)block, codes, ties, worst_p);
        CHECKF(ties * 1000 <= codes, "%ld near-ties of %ld", ties, codes);
        free(rm), free(rv), free(rp);
        lpx_tensor *all[8] = {p, g, m0, v0, m, v, dm, dv};
        for (int i = 0; i < 8; i++) lpx_tensor_release(all[i]);
    }
}

/* The masters: the bf16 master with stochastic rounding is the plain f32
 * step's result rounded by lpx_os_bf16_sr with lpx_os_rand32(seed, rank,
 * step, index0 + j) (j over the concatenated list), bit for bit, and a
 * second run from the same state replays it; another seed gives other
 * bits. The scaled-f16 master (RNE and stochastic) likewise equals
 * lpx_os_f16s_store of the f32 step's result per block. */
static void test_masters(void)
{
    const int64_t s0[1] = {1000}, s1[2] = {3, 77};
    const int64_t *shapes[2] = {s0, s1};
    const int nd[2] = {1, 2};
    for (int f = 0; f < 3; f++)
        for (int mode = 1; mode <= 3; mode++) {
            lpx_tensor *p[2], *p32[2], *g[2], *m[2][2], *v[2][2], *xs[2] = {NULL, NULL};
            lpx_optim_adamw_opts o = lpx_optim_adamw_opts_default();
            o.master = (lpx_optim_master)mode;
            o.seed = 0x1234567890ull + (uint64_t)f;
            o.rank = 3;
            o.index0 = 4096;
            int64_t block = 128;
            for (int i = 0; i < 2; i++) {
                lpx_tensor *x = randn_cpu(nd[i], shapes[i], 0.05, false);
                g[i] = randn_cpu(nd[i], shapes[i], 1e-3, false);
                int64_t N = lpx_tensor_numel(x);
                /* the master and its f32 twin holding the same values */
                CHECK_OK(lpx_tensor_new(mode == 1 ? LPX_BF16 : LPX_F16, nd[i], shapes[i], lpx_cpu(), &p[i]));
                CHECK_OK(lpx_tensor_new(LPX_F32, nd[i], shapes[i], lpx_cpu(), &p32[i]));
                float *xv = lpx_tensor_data(x), *tw = lpx_tensor_data(p32[i]);
                if (mode == 1) {
                    CHECK_OK(lpx_convert(lpx_tensor_data(p[i]), LPX_BF16, xv, LPX_F32, (size_t)N, 0));
                    CHECK_OK(lpx_convert(tw, LPX_F32, lpx_tensor_data(p[i]), LPX_BF16, (size_t)N, 0));
                } else {
                    int64_t nb = (N + block - 1) / block;
                    CHECK_OK(lpx_tensor_new(LPX_F32, 1, &nb, lpx_cpu(), &xs[i]));
                    float *sc = lpx_tensor_data(xs[i]);
                    uint16_t *pc = lpx_tensor_data(p[i]);
                    for (int64_t b = 0, at = 0; at < N; b++, at += block) {
                        int n = (int)(N - at < block ? N - at : block);
                        sc[b] = lpx_os_f16s_store(xv + at, n, pc + at, 0, 0, 0, 0, 0);
                        lpx_os_dequant_f16s(pc + at, sc[b], n, tw + at);
                    }
                }
                lpx_tensor_release(x);
                for (int r = 0; r < 2; r++) {
                    CHECK_OK(lpx_optim_state_new((lpx_optim_state_format)f, LPX_OPTIM_STATE_M, nd[i], shapes[i], block,
                                                 lpx_cpu(), &m[r][i]));
                    CHECK_OK(lpx_optim_state_new((lpx_optim_state_format)f, LPX_OPTIM_STATE_V, nd[i], shapes[i], block,
                                                 lpx_cpu(), &v[r][i]));
                }
            }
            /* save the starting master for the replay */
            lpx_tensor *pc[2] = {NULL, NULL}, *xc[2] = {NULL, NULL};
            for (int i = 0; i < 2; i++) {
                CHECK_OK(lpx_clone(p[i], &pc[i]));
                if (xs[i]) CHECK_OK(lpx_clone(xs[i], &xc[i]));
            }
            const int64_t step = 9;
            CHECK_OK(lpx_optim_adamw_(p, g, m[0], v[0], mode >= 2 ? xs : NULL, 2, &o, step));
            lpx_optim_adamw_opts plain = o;
            plain.master = LPX_OPTIM_MASTER_PLAIN;
            CHECK_OK(lpx_optim_adamw_(p32, g, m[1], v[1], NULL, 2, &plain, step));
            long diff = 0, total = 0;
            int64_t j = o.index0;
            for (int i = 0; i < 2; i++) {
                int64_t N = lpx_tensor_numel(p[i]);
                const float *x = lpx_tensor_data(p32[i]);
                const uint16_t *got = lpx_tensor_data(p[i]);
                if (mode == 1) {
                    for (int64_t e = 0; e < N; e++, j++) {
                        uint16_t want = lpx_os_bf16_sr(x[e], lpx_os_rand32(o.seed, o.rank, step, (uint64_t)j) >> 16);
                        diff += got[e] != want;
                    }
                } else {
                    const float *sc = lpx_tensor_data(xs[i]);
                    uint16_t want[256];
                    for (int64_t b = 0, at = 0; at < N; b++, at += block, j += block) {
                        int n = (int)(N - at < block ? N - at : block);
                        float s = lpx_os_f16s_store(x + at, n, want, mode == 3, o.seed, o.rank, step, (uint64_t)j);
                        diff += s != sc[b];
                        for (int e = 0; e < n; e++) diff += got[at + e] != want[e];
                    }
                    j += N - (N + block - 1) / block * block; /* back to the list's flat index */
                }
                total += N;
            }
            CHECKF(diff == 0, "%s master mode %d: %ld of %ld codes differ from the f32 step rounded", kname[f], mode,
                   diff, total);
            /* replay from the same state: bit for bit; another seed: other bits */
            lpx_tensor *m2[2], *v2[2];
            for (int i = 0; i < 2; i++) {
                CHECK_OK(lpx_optim_state_new((lpx_optim_state_format)f, LPX_OPTIM_STATE_M, nd[i], shapes[i], block,
                                             lpx_cpu(), &m2[i]));
                CHECK_OK(lpx_optim_state_new((lpx_optim_state_format)f, LPX_OPTIM_STATE_V, nd[i], shapes[i], block,
                                             lpx_cpu(), &v2[i]));
            }
            CHECK_OK(lpx_optim_adamw_(pc, g, m2, v2, mode >= 2 ? xc : NULL, 2, &o, step));
            for (int i = 0; i < 2; i++)
                CHECK(!memcmp(lpx_tensor_data(pc[i]), lpx_tensor_data(p[i]), 2 * (size_t)lpx_tensor_numel(p[i])));
            if (mode != 2) {
                lpx_tensor *pd[2] = {NULL, NULL}, *xd[2] = {NULL, NULL};
                for (int i = 0; i < 2; i++) {
                    CHECK_OK(lpx_clone(p[i], &pd[i]));
                    if (xs[i]) CHECK_OK(lpx_clone(xs[i], &xd[i]));
                }
                lpx_optim_adamw_opts o2 = o;
                o2.seed ^= 1;
                CHECK_OK(lpx_optim_adamw_(pd, g, m2, v2, mode >= 2 ? xd : NULL, 2, &o2, step + 1));
                CHECK_OK(lpx_optim_adamw_(pc, g, m[0], v[0], mode >= 2 ? xc : NULL, 2, &o, step + 1));
                long same = 0;
                for (int i = 0; i < 2; i++) {
                    const uint16_t *a = lpx_tensor_data(pd[i]), *b = lpx_tensor_data(pc[i]);
                    for (int64_t e = 0; e < lpx_tensor_numel(pc[i]); e++) same += a[e] == b[e];
                }
                CHECKF(same < total, "%s master mode %d: another seed gave the same %ld codes", kname[f], mode, same);
                for (int i = 0; i < 2; i++) lpx_tensor_release(pd[i]), lpx_tensor_release(xd[i]);
            }
            if (f == 0) printf("  master mode %d: %ld codes equal to the f32 step rounded; replayed bit for bit\n",
                               mode, total);
            for (int i = 0; i < 2; i++) {
                lpx_tensor *all[11] = {p[i], p32[i], g[i], m[0][i], v[0][i], m[1][i], v[1][i], xs[i], pc[i], xc[i],
                                       m2[i]};
                for (int k = 0; k < 11; k++) lpx_tensor_release(all[k]);
                lpx_tensor_release(v2[i]);
            }
        }
}

/* adamw_ and lpx_optim_adamw_ refuse bad states in one line naming the op,
 * the kind and the argument; nothing is written. */
static void test_adamw_refusals(void)
{
    const int64_t shape[1] = {512}, other[1] = {500};
    lpx_tensor *p = randn_cpu(1, shape, 1, false), *g = randn_cpu(1, shape, 1, false);
    lpx_tensor *m8 = NULL, *v8 = NULL, *v4 = NULL, *m8b = NULL, *v8s = NULL, *pf = NULL;
    CHECK_OK(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_M, 1, shape, 0, lpx_cpu(), &m8));
    CHECK_OK(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_V, 1, shape, 0, lpx_cpu(), &v8));
    CHECK_OK(lpx_optim_state_new(LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_V, 1, shape, 0, lpx_cpu(), &v4));
    CHECK_OK(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_M, 1, shape, 64, lpx_cpu(), &m8b));
    CHECK_OK(lpx_optim_state_new(LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_V, 1, other, 0, lpx_cpu(), &v8s));
    CHECK_OK(lpx_tensor_new(LPX_F32, 1, shape, lpx_cpu(), &pf));
    lpx_tensor *before = NULL;
    CHECK_OK(lpx_clone(p, &before));
    struct { lpx_tensor *m, *v; lpx_status st; const char *msg; } cases[] = {
        {m8, v4, LPX_EINVAL, "adamw_: exp_avg_sq[0] is of kind os_4bit, exp_avg[0] of kind os_8bit: one state kind "
                             "per call"},
        {v8, v8, LPX_EINVAL, "adamw_: exp_avg[0] (kind os_8bit) holds the v moment; exp_avg takes the m one"},
        {m8b, v8, LPX_EINVAL, "adamw_: exp_avg_sq[0] (kind os_8bit) has block 256, exp_avg[0] 64: one block per call"},
        {m8, v8s, LPX_ESHAPE, "adamw_: exp_avg_sq[0] (kind os_8bit) has 500 elements, params[0] has 512"},
        {m8, pf, LPX_EINVAL, "adamw_: exp_avg_sq[0] is a dense tensor, not an optimizer state (os_8bit, os_4bit, "
                             "os_fp8)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK_ERR(lpx_adamw_(&p, &g, &cases[i].m, &cases[i].v, 1, 1e-3, 0.9, 0.999, 1e-8, 0, 1), cases[i].st);
        CHECKF(!strcmp(lpx_last_error(), cases[i].msg), "case %zu: '%s'", i, lpx_last_error());
    }
    /* the hyperparameters: the dense op's contract, named by the op */
    CHECK_ERR(lpx_adamw_(&p, &g, &m8, &v8, 1, 1e-3, 1.5, 0.999, 1e-8, 0, 1), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "adamw_state_: lr 0.001, betas (1.5, 0.999)") == lpx_last_error());
    /* the bf16-SR master needs bf16 params */
    lpx_optim_adamw_opts o = lpx_optim_adamw_opts_default();
    o.master = LPX_OPTIM_MASTER_BF16_SR;
    CHECK_ERR(lpx_optim_adamw_(&p, &g, &m8, &v8, NULL, 1, &o, 1), LPX_EDTYPE);
    CHECK(!strcmp(lpx_last_error(), "adamw_state_: params[0] has dtype f32; the bf16 stochastic-rounding master "
                                    "(mode 1) is bf16"));
    o.master = LPX_OPTIM_MASTER_F16S;
    CHECK_ERR(lpx_optim_adamw_(&p, &g, &m8, &v8, NULL, 1, &o, 1), LPX_EINVAL);
    CHECK(!memcmp(lpx_tensor_data(p), lpx_tensor_data(before), 512 * sizeof(float)));
    lpx_tensor *all[9] = {p, g, m8, v8, v4, m8b, v8s, pf, before};
    for (int i = 0; i < 9; i++) lpx_tensor_release(all[i]);
}

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_new_zero);
    RUN(test_quantize_to_dense);
    RUN(test_refusals);
    RUN(test_bytes_per_param);
    RUN(test_step_vs_float64);
    RUN(test_masters);
    RUN(test_adamw_refusals);
    return CHECK_DONE();
}
