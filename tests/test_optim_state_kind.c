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

int main(void)
{
    CHECK_OK(lpx_init());
    RUN(test_new_zero);
    RUN(test_quantize_to_dense);
    RUN(test_refusals);
    RUN(test_bytes_per_param);
    return CHECK_DONE();
}
